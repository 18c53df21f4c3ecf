//! Hermes-style tool calls (`<tool_call>{"name": …, "arguments": {…}}</tool_call>`)
//! parsed out of completion text into OpenAI's `message.tool_calls` (pure).

use serde_json::{json, Value};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// The text outside the tool-call blocks (trimmed, `None` if empty) and the
/// calls in OpenAI shape. A block whose JSON does not parse stays in the text.
pub fn parse_tool_calls(text: &str, id_prefix: &str) -> (Option<String>, Vec<Value>) {
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        let body_start = start + OPEN.len();
        let (body, block_end) = match rest[body_start..].find(CLOSE) {
            Some(end) => (
                &rest[body_start..body_start + end],
                body_start + end + CLOSE.len(),
            ),
            // An unterminated last block (the model hit a stop token first).
            None => (&rest[body_start..], rest.len()),
        };
        match serde_json::from_str::<Value>(body.trim()) {
            Ok(call) if call.get("name").and_then(Value::as_str).is_some() => {
                content.push_str(&rest[..start]);
                let arguments = match call.get("arguments") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v) => v.to_string(),
                    None => "{}".to_string(),
                };
                calls.push(json!({
                    "id": format!("{id_prefix}-{}", calls.len()),
                    "type": "function",
                    "function": {"name": call["name"], "arguments": arguments},
                }));
            }
            _ => content.push_str(&rest[..block_end]),
        }
        rest = &rest[block_end..];
    }
    content.push_str(rest);
    let content = content.trim();
    ((!content.is_empty()).then(|| content.to_string()), calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_calls_and_keeps_surrounding_text() {
        let text = "Let me add.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call><tool_call>{\"name\": \"now\"}</tool_call>";
        let (content, calls) = parse_tool_calls(text, "call");
        assert_eq!(content.as_deref(), Some("Let me add."));
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0]["function"]["name"], "add");
        let args: Value =
            serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args, json!({"a": 1, "b": 2}));
        assert_eq!(calls[1]["function"]["arguments"], "{}");
        assert_eq!(calls[1]["id"], "call-1");
    }

    #[test]
    fn malformed_blocks_stay_text() {
        let (content, calls) = parse_tool_calls("<tool_call>{not json}</tool_call> ok", "c");
        assert!(calls.is_empty());
        assert_eq!(
            content.as_deref(),
            Some("<tool_call>{not json}</tool_call> ok")
        );
        let (content, calls) = parse_tool_calls("plain", "c");
        assert_eq!((content.as_deref(), calls.len()), (Some("plain"), 0));
    }
}
