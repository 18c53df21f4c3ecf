//! Hermes tool-call text: `<tool_call>{"name": …, "arguments": {…}}</tool_call>`,
//! the form Qwen- and Hermes-trained models (and the forgelog engine's chat
//! template) write tool calls in. One parser and one renderer, so the proxy,
//! the engine and the template agree on ids, arguments and what does not parse.

use crate::canonical::{Part, ToolCall};
use serde_json::Value;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// A piece of completion text.
#[derive(Debug, Clone, PartialEq)]
pub enum Segment<'a> {
    /// Text outside any block (untrimmed).
    Text(&'a str),
    /// A block that parsed: its name and its arguments as JSON text (`{}` when
    /// absent or null; a string is taken as already JSON text).
    Call { name: String, arguments: String },
    /// A whole block, markers included, whose body is not a named call.
    Unparsed(&'a str),
}

/// Splits `text` into text and tool-call blocks, in order. An unterminated last
/// block (the model hit `max_tokens` or a stop string) still counts as a block.
pub fn split(text: &str) -> Vec<Segment<'_>> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        if start > 0 {
            out.push(Segment::Text(&rest[..start]));
        }
        let after = &rest[start + OPEN.len()..];
        let (body, block_len) = match after.find(CLOSE) {
            Some(end) => (&after[..end], OPEN.len() + end + CLOSE.len()),
            None => (after, rest.len() - start),
        };
        let block = &rest[start..start + block_len];
        out.push(match parse_call(body) {
            Some((name, arguments)) => Segment::Call { name, arguments },
            None => Segment::Unparsed(block),
        });
        rest = &rest[start + block_len..];
    }
    if !rest.is_empty() {
        out.push(Segment::Text(rest));
    }
    out
}

fn parse_call(body: &str) -> Option<(String, String)> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let arguments = match v.get("arguments") {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(a) => a.to_string(),
    };
    Some((name, arguments))
}

/// The id of the `n`th call parsed out of one completion.
pub fn call_id(prefix: &str, n: usize) -> String {
    format!("{prefix}{n}")
}

/// The tool calls of one completion.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Parsed {
    /// The text outside the parsed blocks, unparsed blocks included, trimmed.
    pub text: Option<String>,
    pub calls: Vec<ToolCall>,
    /// Blocks that did not parse (left in `text`).
    pub unparsed: usize,
}

/// Parses the tool calls out of `text`, with ids `call_id(id_prefix, n)`.
pub fn parse(text: &str, id_prefix: &str) -> Parsed {
    let mut parsed = Parsed::default();
    let mut rest = String::new();
    for segment in split(text) {
        match segment {
            Segment::Text(t) => rest.push_str(t),
            Segment::Unparsed(block) => {
                parsed.unparsed += 1;
                rest.push_str(block);
            }
            Segment::Call { name, arguments } => parsed.calls.push(ToolCall {
                id: call_id(id_prefix, parsed.calls.len()),
                name,
                arguments,
            }),
        }
    }
    let rest = rest.trim();
    parsed.text = (!rest.is_empty()).then(|| rest.to_string());
    parsed
}

/// Splits the tool calls out of a response's text parts, in place and in
/// order (text before a call, the call, text after it; each text trimmed,
/// adjacent texts joined by a newline), unless the response already has tool
/// calls (the upstream parsed them). Returns how many blocks did not parse.
pub fn parse_parts(parts: &mut Vec<Part>, id_prefix: &str) -> usize {
    if parts.iter().any(|p| matches!(p, Part::ToolCall(_)))
        || !parts
            .iter()
            .any(|p| matches!(p, Part::Text(t) if t.contains(OPEN)))
    {
        return 0;
    }
    let mut out: Vec<Part> = Vec::with_capacity(parts.len() + 1);
    let push_text = |out: &mut Vec<Part>, t: &str| {
        let t = t.trim();
        if t.is_empty() {
            return;
        }
        match out.last_mut() {
            Some(Part::Text(a)) => {
                a.push('\n');
                a.push_str(t);
            }
            _ => out.push(Part::Text(t.to_string())),
        }
    };
    let (mut calls, mut unparsed) = (0, 0);
    for part in parts.drain(..) {
        let Part::Text(text) = part else {
            out.push(part);
            continue;
        };
        for segment in split(&text) {
            match segment {
                Segment::Text(t) => push_text(&mut out, t),
                Segment::Unparsed(block) => {
                    unparsed += 1;
                    push_text(&mut out, block);
                }
                Segment::Call { name, arguments } => {
                    out.push(Part::ToolCall(ToolCall {
                        id: call_id(id_prefix, calls),
                        name,
                        arguments,
                    }));
                    calls += 1;
                }
            }
        }
    }
    *parts = out;
    unparsed
}

/// One call as Hermes text, name first as Hermes-trained models write it.
pub fn render(name: &str, arguments: &Value) -> String {
    format!(
        "{OPEN}\n{{\"name\": {}, \"arguments\": {arguments}}}\n{CLOSE}",
        Value::String(name.to_string())
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn calls_are_parsed_and_the_surrounding_text_kept() {
        let text = "Let me add.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call><tool_call>{\"name\": \"now\"}</tool_call>";
        let p = parse(text, "call-");
        assert_eq!(p.text.as_deref(), Some("Let me add."));
        assert_eq!(p.unparsed, 0);
        assert_eq!(p.calls.len(), 2);
        assert_eq!(
            (p.calls[0].id.as_str(), p.calls[0].name.as_str()),
            ("call-0", "add")
        );
        let args: Value = serde_json::from_str(&p.calls[0].arguments).unwrap();
        assert_eq!(args, serde_json::json!({"a": 1, "b": 2}));
        assert_eq!(
            (p.calls[1].id.as_str(), p.calls[1].arguments.as_str()),
            ("call-1", "{}")
        );
    }

    #[test]
    fn null_absent_and_string_arguments_agree() {
        for body in [r#"{"name": "f"}"#, r#"{"name": "f", "arguments": null}"#] {
            let p = parse(&format!("<tool_call>{body}</tool_call>"), "c");
            assert_eq!(p.calls[0].arguments, "{}", "{body}");
        }
        let p = parse(
            r#"<tool_call>{"name": "f", "arguments": "{\"x\": 1}"}</tool_call>"#,
            "c",
        );
        assert_eq!(p.calls[0].arguments, r#"{"x": 1}"#);
    }

    #[test]
    fn malformed_and_unterminated_blocks() {
        let p = parse("<tool_call>{not json}</tool_call> ok", "c");
        assert!(p.calls.is_empty());
        assert_eq!(p.unparsed, 1);
        assert_eq!(
            p.text.as_deref(),
            Some("<tool_call>{not json}</tool_call> ok")
        );
        let p = parse("plain", "c");
        assert_eq!(
            (p.text.as_deref(), p.calls.len(), p.unparsed),
            (Some("plain"), 0, 0)
        );
        // Cut off by max_tokens after a whole body: still a call.
        let p = parse("go <tool_call>{\"name\": \"ls\", \"arguments\": {}}", "c");
        assert_eq!((p.text.as_deref(), p.calls.len()), (Some("go"), 1));
        // Cut off inside the body: stays text, counted.
        let p = parse("go <tool_call>{\"name\": \"l", "c");
        assert_eq!((p.calls.len(), p.unparsed), (0, 1));
        assert_eq!(p.text.as_deref(), Some("go <tool_call>{\"name\": \"l"));
    }

    #[test]
    fn text_parts_become_text_and_calls_in_order() {
        let mut parts = vec![Part::Text(
            "a\n<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\nb <tool_call>{oops}</tool_call> c".into(),
        )];
        assert_eq!(parse_parts(&mut parts, "x"), 1);
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[0], Part::Text("a".into()));
        assert!(matches!(&parts[1], Part::ToolCall(c) if c.id == "x0" && c.name == "f"));
        assert_eq!(
            parts[2],
            Part::Text("b\n<tool_call>{oops}</tool_call>\nc".into())
        );
        // Already parsed upstream: left alone.
        let before = parts.clone();
        assert_eq!(parse_parts(&mut parts, "y"), 0);
        assert_eq!(parts, before);
    }

    proptest! {
        /// What the renderer writes, the parser reads back: name and arguments.
        #[test]
        fn render_then_parse_round_trips(
            name in "[a-zA-Z_][a-zA-Z0-9_.-]{0,20}",
            keys in proptest::collection::vec("[a-z\"\\\\<>/ ]{1,8}", 0..4),
            text in "[a-zA-Z0-9 .,!?]{0,40}",
        ) {
            let arguments = serde_json::Value::Object(
                keys.iter().enumerate().map(|(i, k)| (k.clone(), serde_json::json!(i))).collect(),
            );
            let p = parse(&format!("{text}{}", render(&name, &arguments)), "c");
            prop_assert_eq!(p.unparsed, 0);
            prop_assert_eq!(p.calls.len(), 1);
            prop_assert_eq!(&p.calls[0].name, &name);
            let back: Value = serde_json::from_str(&p.calls[0].arguments).unwrap();
            prop_assert_eq!(back, arguments);
            prop_assert_eq!(p.text.unwrap_or_default(), text.trim().to_string());
        }
    }
}
