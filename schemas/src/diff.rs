//! The first difference between two JSON values, as a field path and a
//! description: how `replay rebuild` names an edited event and how
//! `replay serve` names the message a re-running harness changed.

use serde_json::Value;

/// The path (`sequences[0].token_ids[17]`, `content`, `tool_calls[0].function.name`)
/// and a description of the first place `a` and `b` differ, or `None` when they
/// are equal. `names` are what the two sides are called in the description,
/// e.g. `("stored", "rebuilt")`. Object keys are visited in `a`'s order.
pub fn first_difference(a: &Value, b: &Value, names: (&str, &str)) -> Option<(String, String)> {
    walk(a, b, String::new(), names)
}

fn walk(a: &Value, b: &Value, path: String, names: (&str, &str)) -> Option<(String, String)> {
    let (na, nb) = names;
    let join = |k: &str| {
        if path.is_empty() {
            k.to_string()
        } else {
            format!("{path}.{k}")
        }
    };
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, va) in x {
                match y.get(k) {
                    Some(vb) => {
                        if let Some(d) = walk(va, vb, join(k), names) {
                            return Some(d);
                        }
                    }
                    None => return Some((join(k), format!("only in the {na} one"))),
                }
            }
            y.keys()
                .find(|k| !x.contains_key(*k))
                .map(|k| (join(k), format!("only in the {nb} one")))
        }
        (Value::Array(x), Value::Array(y)) => {
            for (i, (va, vb)) in x.iter().zip(y).enumerate() {
                if let Some(d) = walk(va, vb, format!("{path}[{i}]"), names) {
                    return Some(d);
                }
            }
            (x.len() != y.len()).then(|| {
                (
                    path,
                    format!("{na} has {} elements, {nb} {}", x.len(), y.len()),
                )
            })
        }
        (Value::String(x), Value::String(y)) if x != y && x.len().max(y.len()) > CLIP => {
            // A long text (a system prompt) differs somewhere inside: show
            // both around the first differing character, not their starts.
            let at = x.chars().zip(y.chars()).take_while(|(p, q)| p == q).count();
            let around = |t: &str| {
                let from = at.saturating_sub(CONTEXT);
                let excerpt: String = t.chars().skip(from).take(CLIP).collect();
                let total = t.chars().count();
                let more = if from + CLIP < total {
                    format!("… ({total} chars)")
                } else {
                    String::new()
                };
                let before = if from > 0 { "…" } else { "" };
                format!("{before}{}{more}", Value::String(excerpt))
            };
            Some((
                path,
                format!("at character {at}: {na} {}, {nb} {}", around(x), around(y)),
            ))
        }
        _ => (a != b).then(|| (path, format!("{na} {}, {nb} {}", clip(a), clip(b)))),
    }
}

/// Characters of a value an error shows.
const CLIP: usize = 200;
/// Characters shown before the first difference in a long text.
const CONTEXT: usize = 60;

/// A value as JSON text, cut to 200 characters (a whole prompt is no help in an error).
pub fn clip(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(CLIP) {
        Some((i, _)) => format!("{}… ({} chars)", &s[..i], s.chars().count()),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_long_text_is_shown_where_it_differs() {
        let a = format!(
            "{}the date is 2026-11-30{}",
            "x".repeat(500),
            "y".repeat(500)
        );
        let b = format!(
            "{}the date is 2026-12-01{}",
            "x".repeat(500),
            "y".repeat(500)
        );
        let (path, detail) =
            first_difference(&json!({"c": a}), &json!({"c": b}), ("recording", "request")).unwrap();
        assert_eq!(path, "c");
        assert!(
            detail.starts_with("at character 518: recording …\""),
            "{detail}"
        );
        assert!(detail.contains("the date is 2026-11-30yyy"), "{detail}");
        assert!(detail.contains("request …\"xxx"), "{detail}");
        assert!(detail.contains("the date is 2026-12-01"), "{detail}");
        assert!(detail.len() < 600, "{detail}");
    }

    #[test]
    fn names_the_first_differing_path() {
        let n = ("stored", "rebuilt");
        let a = json!({"x": 1, "s": [{"t": [1, 2, 3]}]});
        assert_eq!(first_difference(&a, &a, n), None);
        let b = json!({"x": 1, "s": [{"t": [1, 5, 3]}]});
        assert_eq!(
            first_difference(&a, &b, n),
            Some(("s[0].t[1]".into(), "stored 2, rebuilt 5".into()))
        );
        let c = json!({"x": 1, "s": [{"t": [1, 2]}]});
        assert_eq!(
            first_difference(&a, &c, n).unwrap(),
            ("s[0].t".into(), "stored has 3 elements, rebuilt 2".into())
        );
        let d = json!({"x": 1, "s": [{"t": [1, 2, 3]}], "y": null});
        assert_eq!(
            first_difference(&a, &d, n).unwrap(),
            ("y".into(), "only in the rebuilt one".into())
        );
        let long = json!("a".repeat(500));
        let (_, detail) = first_difference(&long, &json!("b"), n).unwrap();
        assert!(
            detail.len() < 300
                && detail.starts_with("at character 0: stored \"aaa")
                && detail.contains("\"… (500 chars), rebuilt \"b\""),
            "{detail}"
        );
    }
}
