use super::agent::{agent_steps, agent_turn, arguments_for};
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
    // Cline's `run_commands`: a list of commands, the tool found by its name.
    let list = json!({"required": ["commands"], "properties": {"commands": {"type": "array"}}});
    let commands = arguments_for(&list, "ls");
    assert_eq!(commands["commands"], json!(["ls"]));
    let cline = json!({"tools": [
        tool("read_files", json!({"required": ["paths"], "properties": {"paths": {"type": "array"}}})),
        tool("run_commands", json!({"required": ["commands"], "properties": {"commands": {"type": "array"}}}))]});
    let go = vec![json!({"role": "user", "content": "Go. [agent:1]"})];
    assert_eq!(
        agent_turn(&cline, &go, 1).1[0]["function"]["name"],
        "run_commands"
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

#[test]
fn the_model_folder_renders_and_tokenizes_as_the_fake_does() {
    let dir = tempfile::tempdir().unwrap();
    write_model_dir(dir.path()).unwrap();
    let codec = forgelog_model::load_chat_codec(dir.path().to_str().unwrap(), dir.path())
        .expect("the folder loads as a model's tokenizer and template");
    use forgelog_dialects::splice::ChatRenderer;
    assert_eq!(codec.stop_tokens(), &[(END_ID, END.to_string())]);
    let tools = json!([tool(
        "bash",
        json!({"type": "object", "required": ["command"]})
    )]);
    let messages = vec![
        json!({"role": "system", "content": "Be brief. ünïcode ✓"}),
        json!({"role": "user", "content": [{"type": "text", "text": "Run it.\n[agent:1]"}]}),
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "bash", "arguments": "{\"command\": \"ls\"}"}}]}),
        json!({"role": "tool", "tool_call_id": "c1", "content": "a\nb"}),
    ];
    let text = codec.render(&messages, Some(&tools), true).unwrap();
    assert_eq!(text, render_prompt(&messages, Some(&tools)));
    let ids = codec.encode(&text).unwrap();
    assert_eq!(ids, encode(&text));
    assert_eq!(ids.iter().filter(|&&id| id == END_ID).count(), 5);
    assert_eq!(decode(&ids), text);
    // The conversation reads back from the ids: roles, text, the tools.
    let (read, read_tools) = parse_prompt(&decode(&ids));
    assert_eq!(read_tools, Some(tools));
    let roles: Vec<&str> = read.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool"]);
    assert_eq!(read[3]["content"], "a\nb");
}

#[test]
fn a_token_id_prompt_is_answered_as_the_chat_route_would_in_hermes_text() {
    let up = FakeUpstream::default();
    let tools = json!([tool(
        "bash",
        json!({"type": "object", "required": ["command"],
        "properties": {"command": {"type": "string"}}})
    )]);
    let mut messages = vec![json!({"role": "user", "content": "Go. [agent:1]"})];
    let prompt = encode(&render_prompt(&messages, Some(&tools)));
    let (wire, kept) = up
        .complete(&json!({"prompt": prompt, "max_tokens": 500, "return_token_ids": true}))
        .unwrap();
    let choice = &wire["choices"][0];
    assert_eq!(
        choice["text"],
        "Running step 1.\n<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\":\"echo forgelog step 1\"}}\n</tool_call>"
    );
    let ids: Vec<u32> = serde_json::from_value(choice["token_ids"].clone()).unwrap();
    assert_eq!(
        ids.last(),
        Some(&END_ID),
        "the turn ends with its end token"
    );
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(choice["prompt_token_ids"], json!(prompt));
    assert_eq!(kept["choices"][0]["token_ids"], choice["token_ids"]);
    assert_eq!(
        choice["logprobs"]["token_logprobs"]
            .as_array()
            .unwrap()
            .len(),
        ids.len()
    );
    // After the step's result: plain text, and a cut by max_tokens has no end token.
    messages.push(json!({"role": "assistant", "content": "x"}));
    messages.push(json!({"role": "tool", "content": "forgelog step 1"}));
    let prompt = encode(&render_prompt(&messages, Some(&tools)));
    let (wire, _) = up
        .complete(&json!({"prompt": prompt, "max_tokens": 4}))
        .unwrap();
    assert_eq!(wire["choices"][0]["text"], "Done");
    assert_eq!(wire["choices"][0]["finish_reason"], "length");
    // Without `return_token_ids` nothing is echoed; the tokens are named by
    // their text, or by their ids as asked.
    assert!(wire["choices"][0].get("prompt_token_ids").is_none());
    assert_eq!(
        wire["choices"][0]["logprobs"]["tokens"],
        json!(["D", "o", "n", "e"])
    );
    let (wire, _) = up
        .complete(&json!({"prompt": prompt, "max_tokens": 2, "return_tokens_as_token_ids": true}))
        .unwrap();
    let named = format!("token_id:{}", u32::from(b'D'));
    assert_eq!(wire["choices"][0]["logprobs"]["tokens"][0], named.as_str());
    let bad = up.complete(&json!({"prompt": "text"})).unwrap_err();
    assert_eq!(bad.0, StatusCode::BAD_REQUEST);
}
