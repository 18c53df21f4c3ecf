//! The built-in demo behind `forgelog up --demo`: GRPO groups of small agent
//! rollouts, each a multi-turn conversation with a real calculator tool and a
//! real verifier, driven through the capture proxy's HTTP surface exactly as an
//! external orchestrator would (`POST /sessions`, the dialect's endpoint,
//! `POST /sessions/{id}/finish`).

pub mod calculator;
pub mod conversation;
pub mod summary;
pub mod tasks;

pub use conversation::AgentDialect;
pub use tasks::{Task, TASKS};

use forgelog_api::{Finish, NewSession, SessionClient};
use forgelog_dialects::canonical::{ChatRequest, Message, Part, Role, ToolCall};
use forgelog_dialects::dialect::DialectError;
use forgelog_schemas::SamplingParams;
use serde_json::{json, Value};

/// What the demo runs.
#[derive(Debug, Clone)]
pub struct DemoPlan {
    pub run_id: String,
    /// One GRPO group per (dialect, task).
    pub groups: Vec<(AgentDialect, Task)>,
    pub group_size: usize,
    /// Model calls one rollout may make.
    pub max_calls: usize,
    pub sampling: SamplingParams,
    /// Which pass over the groups this is (`up --demo --train` runs many):
    /// part of every id after the first.
    pub round: usize,
}

impl DemoPlan {
    /// Two tasks per dialect, four rollouts a group.
    pub fn new(run_id: impl Into<String>) -> DemoPlan {
        let groups = TASKS
            .iter()
            .enumerate()
            .map(|(i, t)| (AgentDialect::ALL[i % 2], t.clone()))
            .collect();
        DemoPlan {
            run_id: run_id.into(),
            groups,
            group_size: 4,
            max_calls: 4,
            sampling: SamplingParams {
                max_tokens: Some(64),
                temperature: Some(0.7),
                ..Default::default()
            },
            round: 0,
        }
    }

    pub fn rollouts(&self) -> usize {
        self.groups.len() * self.group_size
    }
}

pub const SYSTEM_PROMPT: &str = "You answer arithmetic questions. For every computation, call the \
calculator tool: write <tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"...\"}}</tool_call> \
and wait for its result. Then reply with the final answer as a number.";

/// The system prompt, then a worked example ahead of the task, as small
/// models need: the call, the tool's result, the answer.
fn opening() -> Vec<Message> {
    let call = ToolCall {
        id: "example-call".into(),
        name: calculator::NAME.into(),
        arguments: json!({"expression": "12 * 4"}).to_string(),
    };
    vec![
        Message::text(Role::System, SYSTEM_PROMPT),
        Message::text(Role::User, "What is 12 times 4?"),
        Message {
            role: Role::Assistant,
            parts: vec![Part::ToolCall(call.clone())],
        },
        Message {
            role: Role::Tool,
            parts: vec![tool_result(&call, "48".into())],
        },
        Message::text(Role::Assistant, "48"),
    ]
}

const NUDGE: &str = "Please reply with the final answer as a number.";

/// How one rollout went, as the agent saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct RolloutOutcome {
    pub rollout_id: String,
    pub dialect: AgentDialect,
    pub task_id: &'static str,
    pub model_calls: usize,
    pub tool_calls: usize,
    /// None when the rollout failed before its verifier ran.
    pub reward: Option<f64>,
    pub error: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("{what}: {source}")]
    Http {
        what: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{what}: HTTP {status}: {body}")]
    Status {
        what: String,
        status: u16,
        body: String,
    },
    #[error("unexpected response: {0}")]
    Response(#[from] DialectError),
    #[error(transparent)]
    Session(#[from] forgelog_api::ClientError),
}

/// Talks to one capture proxy: sessions through its session API, model calls
/// in the rollout's dialect with the session's key.
#[derive(Debug, Clone)]
pub struct ProxyClient {
    sessions: SessionClient,
    http: reqwest::Client,
}

impl ProxyClient {
    pub fn new(base: impl Into<String>, admin_token: Option<String>) -> ProxyClient {
        let http = reqwest::Client::new();
        ProxyClient {
            sessions: SessionClient::with_http(base, admin_token, http.clone()),
            http,
        }
    }

    /// One model call: `body` to the dialect's `path`, as the session `key`.
    async fn call(
        &self,
        what: &str,
        path: &str,
        key: &str,
        body: &Value,
    ) -> Result<Value, DemoError> {
        let req = self
            .http
            .post(format!("{}{path}", self.sessions.base_url()))
            .json(body)
            .bearer_auth(key);
        let http = |source| DemoError::Http {
            what: what.to_string(),
            source,
        };
        let resp = req.send().await.map_err(http)?;
        let status = resp.status();
        let text = resp.text().await.map_err(http)?;
        if !status.is_success() {
            return Err(DemoError::Status {
                what: what.to_string(),
                status: status.as_u16(),
                body: text,
            });
        }
        serde_json::from_str(&text).map_err(|e| DemoError::Status {
            what: what.to_string(),
            status: status.as_u16(),
            body: format!("not JSON ({e}): {text}"),
        })
    }
}

/// Runs every rollout of the plan at once (the engine batches them); calls
/// `done` as each one finishes. Outcomes come back in plan order.
pub async fn run(
    proxy: &ProxyClient,
    plan: &DemoPlan,
    done: impl Fn(&RolloutOutcome),
) -> Vec<RolloutOutcome> {
    let rollouts = plan.groups.iter().flat_map(|(dialect, task)| {
        (0..plan.group_size).map(move |member| (*dialect, task, member))
    });
    let done = &done;
    futures::future::join_all(rollouts.map(|(dialect, task, member)| async move {
        let outcome = rollout(proxy, plan, dialect, task, member).await;
        done(&outcome);
        outcome
    }))
    .await
}

async fn rollout(
    proxy: &ProxyClient,
    plan: &DemoPlan,
    dialect: AgentDialect,
    task: &Task,
    member: usize,
) -> RolloutOutcome {
    let group_id = match plan.round {
        0 => format!("{}-{}-{}", plan.run_id, dialect.harness(), task.id),
        r => format!("{}-{}-{}-round{r}", plan.run_id, dialect.harness(), task.id),
    };
    let mut outcome = RolloutOutcome {
        rollout_id: format!("{group_id}-{member}"),
        dialect,
        task_id: task.id,
        model_calls: 0,
        tool_calls: 0,
        reward: None,
        error: None,
    };
    let new = NewSession::new(&outcome.rollout_id, task.id, dialect.harness(), &group_id)
        .in_run(&plan.run_id)
        .group_size(plan.group_size as i64);
    let session = match proxy.sessions.create(&new).await {
        Ok(s) => s,
        Err(e) => {
            outcome.error = Some(e.to_string());
            return outcome;
        }
    };
    let finish = match converse(proxy, plan, dialect, task, &session.api_key, &mut outcome).await {
        Ok(answer) => {
            let verdict = tasks::verify(task, &answer);
            outcome.reward = verdict.reward;
            Finish {
                exit_status: Some(0),
                verifier: Some(verdict),
                ..Default::default()
            }
        }
        Err(e) => {
            outcome.error = Some(e.to_string());
            Finish {
                exit_status: Some(1),
                verifier: None,
                ..Default::default()
            }
        }
    };
    if let Err(e) = proxy.sessions.finish(&session.session_id, &finish).await {
        outcome.reward = None;
        outcome.error.get_or_insert(e.to_string());
    }
    outcome
}

/// The agent loop: ask, run the tools the model calls, nudge once for a
/// number; returns the final answer's text.
async fn converse(
    proxy: &ProxyClient,
    plan: &DemoPlan,
    dialect: AgentDialect,
    task: &Task,
    key: &str,
    outcome: &mut RolloutOutcome,
) -> Result<String, DemoError> {
    let mut req = ChatRequest {
        model: "forgelog-demo".into(),
        messages: opening(),
        tools: vec![calculator::spec()],
        sampling: plan.sampling.clone(),
        ..Default::default()
    };
    req.messages
        .push(Message::text(Role::User, task.question.to_string()));
    let mut nudged = false;
    let mut answer = String::new();
    while outcome.model_calls < plan.max_calls {
        let what = format!(
            "model call {} of {}",
            outcome.model_calls, outcome.rollout_id
        );
        let body = proxy
            .call(&what, dialect.path(), key, &dialect.encode(&req))
            .await?;
        outcome.model_calls += 1;
        let response = dialect.decode(&body)?;
        answer = response.text();
        let results: Vec<Part> = response.tool_calls().map(run_tool).collect();
        outcome.tool_calls += results.len();
        let number_given = answer.chars().any(|c| c.is_ascii_digit());
        req.messages.push(Message {
            role: Role::Assistant,
            parts: response.parts,
        });
        if !results.is_empty() {
            req.messages.push(Message {
                role: Role::Tool,
                parts: results,
            });
        } else if !number_given && !nudged {
            nudged = true;
            req.messages.push(Message::text(Role::User, NUDGE));
        } else {
            break;
        }
    }
    Ok(answer)
}

fn run_tool(call: &ToolCall) -> Part {
    let result = if call.name == calculator::NAME {
        calculator::call(&call.arguments)
    } else {
        format!(
            "error: no tool named {:?}; the only tool is {}",
            call.name,
            calculator::NAME
        )
    };
    tool_result(call, result)
}

fn tool_result(call: &ToolCall, content: String) -> Part {
    Part::ToolResult {
        call_id: call.id.clone(),
        name: Some(call.name.clone()),
        content,
        is_error: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> ChatRequest {
        ChatRequest {
            messages: opening(),
            tools: vec![calculator::spec()],
            sampling: DemoPlan::new("r").sampling,
            ..Default::default()
        }
    }

    #[test]
    fn the_opening_is_written_in_both_dialects_with_its_tool_call_and_result() {
        let chat = AgentDialect::OpenAiChat.encode(&request());
        let m = &chat["messages"];
        assert_eq!(m[0]["role"], "system");
        assert_eq!(m[2]["tool_calls"][0]["function"]["name"], "calculator");
        assert_eq!(m[3]["tool_call_id"], "example-call");
        assert_eq!(
            (m[4]["role"].as_str(), chat["max_tokens"].as_i64()),
            (Some("assistant"), Some(64))
        );
        let ant = AgentDialect::Anthropic.encode(&request());
        let m = &ant["messages"];
        assert_eq!(ant["system"], SYSTEM_PROMPT);
        assert_eq!(m[1]["content"][0]["input"]["expression"], "12 * 4");
        assert_eq!(m[2]["content"][0]["tool_use_id"], "example-call");
        assert_eq!(ant["tools"][0]["input_schema"]["required"][0], "expression");
        assert_eq!(ant["max_tokens"], 64);
    }

    #[test]
    fn replies_are_read_and_their_tool_calls_run() {
        let openai = json!({"id": "c", "created": 1, "model": "m", "choices": [{"index": 0, "finish_reason": "tool_calls",
            "message": {"role": "assistant", "content": null, "tool_calls": [{"id": "c9", "type": "function",
            "function": {"name": "calculator", "arguments": "{\"expression\": \"6*7\"}"}}]}}]});
        let anthropic = json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "stop_reason": "tool_use",
            "content": [{"type": "text", "text": "Let me compute."},
            {"type": "tool_use", "id": "c9", "name": "calculator", "input": {"expression": "6*7"}}],
            "usage": {"input_tokens": 1, "output_tokens": 1}});
        for (dialect, body) in [
            (AgentDialect::OpenAiChat, openai),
            (AgentDialect::Anthropic, anthropic),
        ] {
            let reply = dialect.decode(&body).unwrap();
            let results: Vec<Part> = reply.tool_calls().map(run_tool).collect();
            assert_eq!(results.len(), 1, "{dialect:?}");
            assert!(
                matches!(&results[0], Part::ToolResult { call_id, content, .. } if call_id == "c9" && content == "42")
            );
        }
    }
}
