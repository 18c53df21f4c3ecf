//! Finding one field of a JSON object by its structure alone: where its value
//! starts and ends, without parsing anything else. A real parser checks the
//! rest afterwards; this only has to follow strings and nesting.

use std::ops::Range;

/// The value of `key` in the JSON object `text`, as `read` reads it, and where
/// it is: if the object has the key exactly once at its top level and `read`
/// takes its value. `read` gets the text from the value's first byte on and
/// returns what it read and how many bytes that was. `None` when the key is
/// absent or twice, a key is written with an escape (it might be `key` too),
/// `read` refuses, or `text` is not an object as far as its structure goes:
/// the caller's parser then has the last word.
pub fn top_level_field<T>(
    text: &[u8],
    key: &str,
    read: impl Fn(&[u8]) -> Option<(T, usize)>,
) -> Option<(T, Range<usize>)> {
    let mut scan = Scan { text, at: 0 };
    scan.space();
    scan.byte(b'{')?;
    scan.space();
    if scan.peek()? == b'}' {
        return None;
    }
    let mut found = None;
    loop {
        scan.space();
        let name = scan.string()?;
        if name.contains(&b'\\') {
            return None;
        }
        scan.space();
        scan.byte(b':')?;
        scan.space();
        let start = scan.at;
        if name == key.as_bytes() {
            if found.is_some() {
                return None;
            }
            let (value, len) = read(&text[start..])?;
            scan.at += len;
            found = Some((value, start..scan.at));
        } else {
            scan.value()?;
        }
        scan.space();
        match scan.next()? {
            b',' => continue,
            b'}' => return found,
            _ => return None,
        }
    }
}

/// JSON's whitespace: not all of ASCII's (a form feed is not).
pub(super) fn is_json_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

struct Scan<'a> {
    text: &'a [u8],
    at: usize,
}

impl<'a> Scan<'a> {
    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.at += 1;
        Some(b)
    }

    fn byte(&mut self, want: u8) -> Option<()> {
        (self.next()? == want).then_some(())
    }

    fn space(&mut self) {
        while self.peek().is_some_and(is_json_space) {
            self.at += 1;
        }
    }

    /// A string's raw content, between its quotes (at the opening one).
    fn string(&mut self) -> Option<&'a [u8]> {
        self.byte(b'"')?;
        let start = self.at;
        loop {
            self.at += self.text[self.at..]
                .iter()
                .position(|b| matches!(b, b'"' | b'\\'))?;
            match self.next()? {
                b'"' => return Some(&self.text[start..self.at - 1]),
                _ => {
                    self.next()?;
                }
            }
        }
    }

    /// Past one value: a string, an array or object (to its matching close),
    /// or a scalar (to the next delimiter).
    fn value(&mut self) -> Option<()> {
        match self.peek()? {
            b'"' => self.string().map(drop),
            b'[' | b'{' => {
                let mut depth = 0usize;
                loop {
                    let skip = self.text[self.at..]
                        .iter()
                        .position(|b| matches!(b, b'"' | b'[' | b'{' | b']' | b'}'))?;
                    self.at += skip;
                    match self.text[self.at] {
                        b'"' => {
                            self.string()?;
                            continue;
                        }
                        b'[' | b'{' => depth += 1,
                        _ => {
                            depth -= 1;
                            if depth == 0 {
                                self.at += 1;
                                return Some(());
                            }
                        }
                    }
                    self.at += 1;
                }
            }
            _ => {
                let start = self.at;
                while self
                    .peek()
                    .is_some_and(|b| !matches!(b, b',' | b'}' | b']') && !is_json_space(b))
                {
                    self.at += 1;
                }
                (self.at > start).then_some(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::arbitrary::json_value;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    /// Reads a value by skipping it as the scan skips any other.
    fn skipped(text: &[u8]) -> Option<((), usize)> {
        let mut scan = Scan { text, at: 0 };
        scan.value()?;
        Some(((), scan.at))
    }

    fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
        top_level_field(text.as_bytes(), key, skipped).map(|((), r)| &text[r])
    }

    #[test]
    fn finds_a_top_level_field_and_only_that() {
        let text = r#" { "a" : [1, {"ids": [9]}, "]}\"" ] , "ids":[1, 2,3] ,"b":{"ids":0}} "#;
        assert_eq!(field(text, "ids"), Some("[1, 2,3]"));
        assert_eq!(field(text, "a"), Some(r#"[1, {"ids": [9]}, "]}\"" ]"#));
        assert_eq!(field(text, "b"), Some(r#"{"ids":0}"#));
        assert_eq!(field(text, "c"), None);
        assert_eq!(field(r#"{"ids": null}"#, "ids"), Some("null"));
        let refused = top_level_field(br#"{"ids": 1}"#, "ids", |_| None::<((), usize)>);
        assert_eq!(refused, None);
        assert_eq!(
            field(r#"{"x":"ids", "ids": -1.5e3}"#, "ids"),
            Some("-1.5e3")
        );
        assert_eq!(field(r#"{"ids":"a\"b"}"#, "ids"), Some(r#""a\"b""#));
        // Twice, escaped, not an object, cut short, not closed: not found.
        for text in [
            r#"{"ids": 1, "ids": 2}"#,
            r#"{"id\u0073": 1}"#,
            r#"[{"ids": 1}]"#,
            r#"{"ids": [1, 2"#,
            r#"{"ids": 1"#,
            r#"{"ids" 1}"#,
            r#"{"ids": }"#,
            // A form feed is ASCII whitespace, not JSON's.
            "{\x0c\"ids\": 1}",
            "{}",
            "",
        ] {
            assert_eq!(field(text, "ids"), None, "{text}");
        }
    }

    proptest! {
        /// In any object, written compactly or spaced out, the range found is
        /// exactly the field's value as the object writes it.
        #[test]
        fn the_range_found_holds_the_fields_value(
            fields in prop::collection::btree_map("[a-z ]{0,4}", json_value(), 0..6),
            wanted in json_value(),
            pretty in any::<bool>(),
        ) {
            let mut object: serde_json::Map<String, Value> = fields.into_iter().collect();
            object.insert("wanted".into(), wanted.clone());
            let object = Value::Object(object);
            let text = if pretty { serde_json::to_string_pretty(&object) } else { serde_json::to_string(&object) }.unwrap();
            let found = field(&text, "wanted").expect("found");
            prop_assert_eq!(serde_json::from_str::<Value>(found).unwrap(), wanted);
            prop_assert_eq!(field(&text, "absent"), None);
        }
    }

    #[test]
    fn a_json_object_as_serde_writes_it() {
        let text = json!({"a": {"b": [1, "x"]}, "k": [3, 4]}).to_string();
        assert_eq!(field(&text, "k"), Some("[3,4]"));
    }
}
