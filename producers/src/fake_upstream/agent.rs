//! The `[agent:N]` agent: shell steps through the harness's own tools, with
//! arguments built from their JSON schemas, then a plain answer.

use super::text_of;
use serde_json::{json, Value};

/// N of `[agent:N]` in any user message.
pub(super) fn agent_steps(messages: &[Value]) -> Option<usize> {
    messages
        .iter()
        .filter(|m| m["role"] == "user")
        .find_map(|m| {
            let text = text_of(&m["content"]);
            let rest = &text[text.find("[agent:")? + "[agent:".len()..];
            rest[..rest.find(']')?].trim().parse().ok()
        })
}

/// The agent's answer at this point: text, and the tool call (or null).
pub(super) fn agent_turn(req: &Value, messages: &[Value], steps: usize) -> (String, Value) {
    let done = messages.iter().filter(|m| m["role"] == "tool").count();
    let tools = req["tools"].as_array().cloned().unwrap_or_default();
    let named = |pick: &dyn Fn(&str) -> bool| {
        tools
            .iter()
            .find(|t| pick(&t["function"]["name"].as_str().unwrap_or("").to_lowercase()))
    };
    // A shell by its name; else a tool that runs commands (Cline's `run_commands`).
    let shell = named(&|n| ["bash", "shell", "exec"].iter().any(|k| n.contains(k)))
        .or_else(|| named(&|n| n.starts_with("run_command")));
    let delegate = messages
        .iter()
        .any(|m| m["role"] == "user" && text_of(&m["content"]).contains("[delegate]"));
    let sub_agent = named(&|n| n == "agent" || n == "task").filter(|_| delegate && done == 0);
    let (tool, command, text) = match (sub_agent, shell) {
        (Some(tool), _) if steps > 0 => (
            tool,
            "Run one step. [agent:1]".to_string(),
            "Delegating step 1.".to_string(),
        ),
        (_, Some(tool)) if done < steps => (
            tool,
            format!("echo forgelog step {}", done + 1),
            format!("Running step {}.", done + 1),
        ),
        _ => return (format!("Done after {done} steps."), Value::Null),
    };
    let arguments = arguments_for(&tool["function"]["parameters"], &command);
    let call = json!([{"id": format!("call_step_{}", done + 1), "type": "function",
        "function": {"name": tool["function"]["name"], "arguments": arguments.to_string()}}]);
    (text, call)
}

/// Arguments that satisfy a tool's JSON schema: every required property, the
/// command where a string (a command, or a sub-agent's prompt) or an argv array
/// is asked for; optional booleans false (run in the foreground, no extras).
pub(super) fn arguments_for(schema: &Value, command: &str) -> Value {
    let mut args = serde_json::Map::new();
    if let Some(props) = schema["properties"].as_object() {
        for (name, prop) in props {
            if prop["type"] == "boolean" {
                args.insert(name.clone(), json!(false));
            }
        }
    }
    let required = schema["required"].as_array().cloned().unwrap_or_default();
    for name in required.iter().filter_map(Value::as_str) {
        let prop = &schema["properties"][name];
        let value = match prop["type"].as_str() {
            // A list of commands (Cline's), or one command's argv.
            Some("array") if name == "commands" => json!([command]),
            Some("array") => json!(["bash", "-lc", command]),
            Some("integer" | "number") => json!(10000),
            Some("boolean") => json!(false),
            Some("object") => json!({}),
            _ if name.contains("command") || name == "cmd" || name == "prompt" => json!(command),
            // A kind to pick (a sub-agent's type): the general one.
            _ if name.ends_with("type") => json!("general"),
            _ => json!(format!("{name} for {command}")),
        };
        args.insert(name.to_string(), value);
    }
    Value::Object(args)
}
