//! OpenAI Chat messages in the shape Hugging Face chat templates expect:
//! `content` always a string (text parts joined, `null` as empty) and a tool
//! call's `arguments` a mapping, not OpenAI's JSON string. The engine renders
//! prompts from this shape and the SFT export writes it.

use serde_json::{json, Value};
use std::borrow::Cow;

/// `message` (OpenAI Chat) as Hugging Face templates read it. Arguments that
/// are not a JSON object stay as they were (a template shows them as text).
/// Borrowed when it reads so already: the proxy renders a session's whole
/// history twice a call, and its first task alone may be 100 KB.
pub fn hf_message(message: &Value) -> Cow<'_, Value> {
    let Some(fields) = message.as_object() else {
        return Cow::Borrowed(message);
    };
    let string_arguments = fields
        .get("tool_calls")
        .and_then(Value::as_array)
        .is_some_and(|calls| {
            calls.iter().any(|c| {
                c.pointer("/function/arguments")
                    .is_some_and(Value::is_string)
            })
        });
    let content = match fields.get("content") {
        Some(Value::String(_)) if !string_arguments => return Cow::Borrowed(message),
        Some(Value::String(_)) => None,
        Some(Value::Array(parts)) => Some(
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join(""),
        ),
        _ => Some(String::new()),
    };
    let mut fields = fields.clone();
    if let Some(content) = content {
        fields.insert("content".into(), json!(content));
    }
    if let Some(Value::Array(calls)) = fields.get_mut("tool_calls") {
        for call in calls.iter_mut() {
            if let Some(arguments) = call.pointer_mut("/function/arguments") {
                if let Some(parsed) = arguments
                    .as_str()
                    .and_then(|s| serde_json::from_str::<Value>(s).ok())
                    .filter(Value::is_object)
                {
                    *arguments = parsed;
                }
            }
        }
    }
    Cow::Owned(Value::Object(fields))
}

/// `message` as Hugging Face templates read it, its tool calls (if any)
/// written into the content as Hermes text, joined to the text by a newline:
/// what a template that shows no tool calls is given, as the model writes them.
pub fn hf_message_with_hermes_calls(message: &Value) -> Cow<'_, Value> {
    let message = hf_message(message);
    // Only an object has `tool_calls`.
    let Some(Value::Array(calls)) = message.get("tool_calls") else {
        return message;
    };
    let hermes = calls.iter().map(|c| {
        let f = &c["function"];
        crate::hermes::render(f["name"].as_str().unwrap_or_default(), &f["arguments"])
    });
    let content = message["content"].as_str().unwrap_or_default().to_string();
    let joined = std::iter::once(content)
        .chain(hermes)
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    let mut message = message.into_owned();
    message["content"] = json!(joined);
    Cow::Owned(message)
}

/// `value` as Hugging Face's `tojson` filter writes it: Python's
/// `json.dumps(value, ensure_ascii=False, indent=indent)`, so `", "` and
/// `": "` between items (`","` at line ends when indented) and nothing
/// escaped for HTML. Object keys come in the map's order (serde_json's:
/// sorted).
pub fn tojson(value: &Value, indent: Option<usize>) -> String {
    let mut out = String::new();
    write_json(value, indent, 0, &mut out);
    out
}

/// `value` as Python's `json.dumps` writes it (`ensure_ascii=False`).
fn write_json(value: &Value, indent: Option<usize>, depth: usize, out: &mut String) {
    let items: Vec<(Option<&String>, &Value)> = match value {
        Value::Array(a) if !a.is_empty() => a.iter().map(|v| (None, v)).collect(),
        Value::Object(o) if !o.is_empty() => o.iter().map(|(k, v)| (Some(k), v)).collect(),
        // Scalars and empty containers: serde_json escapes strings as
        // Python does without ensure_ascii.
        other => return out.push_str(&other.to_string()),
    };
    let (open, close) = if value.is_array() {
        ('[', ']')
    } else {
        ('{', '}')
    };
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    out.push(open);
    for (i, (key, item)) in items.into_iter().enumerate() {
        if i > 0 {
            out.push_str(if indent.is_some() { "," } else { ", " });
        }
        newline(out, depth + 1);
        if let Some(key) = key {
            out.push_str(&Value::from(key.as_str()).to_string());
            out.push_str(": ");
        }
        write_json(item, indent, depth + 1, out);
    }
    newline(out, depth);
    out.push(close);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_is_a_string_and_arguments_a_mapping() {
        let openai = json!({
            "role": "assistant",
            "content": null,
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "ls", "arguments": "{\"path\": \".\"}"}},
                {"id": "b", "type": "function", "function": {"name": "echo", "arguments": "not json"}},
            ]
        });
        let m = hf_message(&openai);
        assert_eq!(m["content"], "");
        assert_eq!(
            m["tool_calls"][0]["function"]["arguments"],
            json!({"path": "."})
        );
        assert_eq!(m["tool_calls"][1]["function"]["arguments"], "not json");
        let parts = json!({"role": "system", "content": [
            {"type": "text", "text": "You are "}, {"type": "text", "text": "Claude."}]});
        assert_eq!(hf_message(&parts)["content"], "You are Claude.");
        // Read so already: the message itself, not a copy.
        let plain = json!({"role": "user", "content": "hi"});
        assert!(matches!(hf_message(&plain), Cow::Borrowed(m) if std::ptr::eq(m, &plain)));
        let hf = json!({"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "ls", "arguments": {"path": "."}}}]});
        assert!(matches!(hf_message(&hf), Cow::Borrowed(_)));
    }
}
