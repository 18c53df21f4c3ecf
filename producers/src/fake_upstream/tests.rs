use super::*;

fn tool(name: &str, parameters: Value) -> Value {
    json!({"type": "function", "function": {"name": name, "parameters": parameters}})
}

#[test]
fn the_agent_runs_shell_steps_from_the_schema_then_stops() {
    let schema = |required: Value, command_type: &str| {
        json!({"type": "object", "required": required, "properties": {
            "command": {"type": command_type}, "cmd": {"type": "string"},
            "description": {"type": "string"}, "run_in_background": {"type": "boolean"}}})
    };
    let req = json!({"tools": [tool("Read", json!({})), tool("Bash", schema(json!(["command", "description"]), "string"))]});
    let mut messages = vec![json!({"role": "user", "content": "Do it. [agent:2]"})];
    assert_eq!(agent_steps(&messages), Some(2));
    let (text, calls) = agent_turn(&req, &messages, 2);
    assert_eq!(text, "Running step 1.");
    assert_eq!(calls[0]["function"]["name"], "Bash");
    let args: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(
        args,
        json!({"command": "echo forgelog step 1", "description": "description for echo forgelog step 1",
               "run_in_background": false})
    );
    messages.push(json!({"role": "tool", "content": "ok"}));
    messages.push(json!({"role": "tool", "content": "ok"}));
    assert_eq!(
        agent_turn(&req, &messages, 2),
        ("Done after 2 steps.".to_string(), Value::Null)
    );
    // An argv array and Codex's `cmd` are filled the same way.
    let argv = arguments_for(&schema(json!(["command"]), "array"), "ls");
    assert_eq!(argv["command"], json!(["bash", "-lc", "ls"]));
    assert_eq!(
        arguments_for(&schema(json!(["cmd"]), "string"), "ls")["cmd"],
        "ls"
    );
}

#[test]
fn with_delegate_the_first_step_goes_to_a_sub_agent() {
    let req = json!({"tools": [
        tool("bash", json!({"required": ["command"], "properties": {"command": {"type": "string"}}})),
        tool("task", json!({"required": ["prompt", "subagent_type"], "properties": {
            "prompt": {"type": "string"}, "subagent_type": {"type": "string"}}}))]});
    let messages = vec![json!({"role": "user", "content": "Go. [agent:3] [delegate]"})];
    let (text, calls) = agent_turn(&req, &messages, 3);
    assert_eq!(text, "Delegating step 1.");
    assert_eq!(calls[0]["function"]["name"], "task");
    let args: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(
        args,
        json!({"prompt": "Run one step. [agent:1]", "subagent_type": "general"})
    );
    // The sub-agent's own conversation runs its one step.
    let sub = vec![json!({"role": "user", "content": args["prompt"]})];
    assert_eq!(agent_steps(&sub), Some(1));
    assert_eq!(agent_turn(&req, &sub, 1).1[0]["function"]["name"], "bash");
}
