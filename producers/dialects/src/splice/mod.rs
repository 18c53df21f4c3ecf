//! Token in, token out: the prompt ids of a session's next call.
//!
//! A harness sends its whole history back on every call, the model's own turns
//! as structured messages. Rendered again through the chat template they are
//! not the tokens the model sampled (whitespace, key order, the end-of-turn
//! token), so the history a learner trains on would be text the model never
//! wrote, and each call a fragment of its own. So the proxy owns the rendering:
//! a call whose messages extend an earlier call's messages and the answer the
//! proxy returned to it is asked with that call's prompt ids, its sampled ids
//! and the template's tokens for the new messages only. Anything else (the
//! first call, an edited or compacted history, a sub-agent, a template that
//! re-renders earlier turns) is rendered afresh, and the reason is said.
//!
//! Pure: the template and tokenizer come in through [`ChatRenderer`].

use crate::hf;
use serde_json::Value;
use std::borrow::Cow;

/// The model's chat template and tokenizer, as the engine applies them.
pub trait ChatRenderer {
    /// The template applied to OpenAI Chat `messages` and `tools`.
    fn render(
        &self,
        messages: &[Value],
        tools: Option<&Value>,
        add_generation_prompt: bool,
    ) -> Result<String, String>;
    /// The ids of `text`, no special tokens added (the template writes them).
    fn encode(&self, text: &str) -> Result<Vec<u32>, String>;
    /// The texts of the tokens that end a turn (`<|im_end|>`, …), by id.
    fn stop_tokens(&self) -> &[(u32, String)];
}

/// A call the proxy answered: what it was asked and exactly what it sent and got.
#[derive(Debug, Clone, PartialEq)]
pub struct AnsweredCall {
    pub call: i64,
    /// The request's messages and tools, OpenAI Chat form.
    pub messages: Vec<Value>,
    pub tools: Option<Value>,
    /// The assistant message the harness got back, OpenAI Chat form.
    pub answer: Value,
    pub prompt_ids: Vec<u32>,
    pub sampled_ids: Vec<u32>,
    /// The template's rendering of `messages` (with the generation prompt),
    /// kept from when the prompt was made so that the next splice need not
    /// render it again; `None` for a call restored from the log.
    pub prompt_text: Option<String>,
}

impl AnsweredCall {
    /// `prompt`, made for call `call` with `tools`, answered with `answer`
    /// (what the harness got) sampled as `sampled_ids`.
    pub fn new(
        call: i64,
        prompt: Prompt,
        tools: Option<Value>,
        answer: Value,
        sampled_ids: Vec<u32>,
    ) -> AnsweredCall {
        AnsweredCall {
            call,
            messages: prompt.messages,
            tools,
            answer,
            prompt_ids: prompt.ids,
            sampled_ids,
            prompt_text: Some(prompt.text),
        }
    }
}

/// How a prompt's ids were made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Made {
    /// Call `base_call`'s prompt and sampled ids, then the new messages.
    Spliced { base_call: i64 },
    /// The template over the whole request; `why` it was not spliced.
    Rendered { why: String },
}

/// A call's prompt, as the engine is asked with it.
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    pub ids: Vec<u32>,
    pub made: Made,
    /// The conversation the ids stand for: a spliced call's earlier turns as
    /// they were sent and answered (not as the harness re-sent them), then
    /// the new messages; a rendered call's messages.
    pub messages: Vec<Value>,
    /// The template's rendering of `messages`, with the generation prompt.
    pub text: String,
}

/// The prompt for `messages` and `tools`, spliced onto the call of `history`
/// (oldest first) that it extends most, else rendered afresh.
pub fn prompt(
    history: &[AnsweredCall],
    messages: &[Value],
    tools: Option<&Value>,
    renderer: &dyn ChatRenderer,
) -> Result<Prompt, String> {
    let fresh = |why: String| -> Result<Prompt, String> {
        let text = renderer.render(messages, tools, true)?;
        Ok(Prompt {
            ids: renderer.encode(&text)?,
            made: Made::Rendered { why },
            messages: messages.to_vec(),
            text,
        })
    };
    // The longest first (the oldest of equals): the first that it extends is
    // the base, and usually the first tried (a conversation's latest call).
    let mut longest_first: Vec<&AnsweredCall> = history.iter().collect();
    longest_first.sort_by_key(|b| std::cmp::Reverse(b.messages.len()));
    let base = longest_first
        .into_iter()
        .find(|b| extends(messages, tools, b));
    let Some(base) = base else {
        // Said of the conversation's latest call: of the latest with these
        // tools, not a side call (a title request) that came in between.
        let nearest = history
            .iter()
            .rev()
            .find(|b| same_tools(tools, b.tools.as_ref()))
            .or(history.last());
        return fresh(match nearest {
            None => "no earlier call to splice onto (the session's first, or its first since the proxy started)".to_string(),
            Some(nearest) => why_not_extending(messages, tools, nearest),
        });
    };
    let n = base.messages.len();
    // The earlier turns as they were sent, the new messages as they come.
    let mut joined = Vec::with_capacity(messages.len());
    joined.extend_from_slice(&base.messages);
    joined.push(base.answer.clone());
    joined.extend_from_slice(&messages[n + 1..]);
    let asked = match &base.prompt_text {
        Some(text) => Cow::Borrowed(text.as_str()),
        None => Cow::Owned(renderer.render(&joined[..n], tools, true)?),
    };
    let with_answer = renderer.render(&joined[..=n], tools, false)?;
    let whole = renderer.render(&joined, tools, true)?;
    let call = base.call;
    let Some(turn) = with_answer.strip_prefix(asked.as_ref()) else {
        return fresh(format!(
            "the chat template does not render call {call}'s answer after its prompt"
        ));
    };
    let Some(new) = whole.strip_prefix(with_answer.as_str()) else {
        return fresh(format!(
            "the chat template re-renders earlier turns: call {call}'s conversation is not a prefix of this one's"
        ));
    };
    let closing = closing(turn, base.sampled_ids.last().copied(), renderer);
    let suffix = renderer.encode(&format!("{closing}{new}"))?;
    let mut ids = Vec::with_capacity(base.prompt_ids.len() + base.sampled_ids.len() + suffix.len());
    ids.extend_from_slice(&base.prompt_ids);
    ids.extend_from_slice(&base.sampled_ids);
    ids.extend_from_slice(&suffix);
    Ok(Prompt {
        ids,
        made: Made::Spliced { base_call: call },
        messages: joined,
        text: whole,
    })
}

/// What the template writes after the assistant's words that the model did
/// not sample: after the stop token it sampled (`\n` after `<|im_end|>`), or
/// from the template's own end of turn when it stopped without one (a length
/// cut). `turn` is the template's rendering of the answer.
fn closing<'a>(turn: &'a str, last_sampled: Option<u32>, renderer: &dyn ChatRenderer) -> &'a str {
    let stops = renderer.stop_tokens();
    if let Some((_, text)) = stops.iter().find(|(id, _)| Some(*id) == last_sampled) {
        if let Some(at) = turn.rfind(text.as_str()) {
            return &turn[at + text.len()..];
        }
        return "";
    }
    let end = stops
        .iter()
        .filter_map(|(_, text)| turn.rfind(text.as_str()))
        .max();
    end.map_or("", |at| &turn[at..])
}

/// Whether `messages` are `base`'s messages, then its answer, then more.
fn extends(messages: &[Value], tools: Option<&Value>, base: &AnsweredCall) -> bool {
    let n = base.messages.len();
    messages.len() > n + 1
        && same_tools(tools, base.tools.as_ref())
        && messages[..n]
            .iter()
            .zip(&base.messages)
            .all(|(a, b)| same_message(a, b))
        && same_message(&messages[n], &base.answer)
}

/// Why `messages` do not extend `latest` (the conversation's latest call).
fn why_not_extending(messages: &[Value], tools: Option<&Value>, latest: &AnsweredCall) -> String {
    let call = latest.call;
    let n = latest.messages.len();
    if !same_tools(tools, latest.tools.as_ref()) {
        return format!("the tools differ from call {call}'s");
    }
    if let Some(i) =
        (0..n.min(messages.len())).find(|&i| !same_message(&messages[i], &latest.messages[i]))
    {
        return format!("message {i} differs from call {call}'s (history edited, compacted, or another conversation)");
    }
    if messages.len() <= n {
        return format!("no new turn after call {call}'s messages");
    }
    if !same_message(&messages[n], &latest.answer) {
        return format!("message {n} is not the answer call {call} returned");
    }
    format!("nothing after call {call}'s answer")
}

fn same_tools(a: Option<&Value>, b: Option<&Value>) -> bool {
    let none = |t: Option<&Value>| {
        t.is_none_or(|t| t.is_null() || t.as_array().is_some_and(Vec::is_empty))
    };
    (none(a) && none(b)) || a == b
}

/// Two OpenAI Chat messages say the same, whatever a harness re-serialized:
/// content as text (parts joined, `null` as empty, outer whitespace aside),
/// tool calls by name and parsed arguments (ids and key order aside).
pub fn same_message(a: &Value, b: &Value) -> bool {
    a["role"] == b["role"] && text_of(a).trim() == text_of(b).trim() && calls_of(a) == calls_of(b)
}

fn text_of(m: &Value) -> Cow<'_, str> {
    match &m["content"] {
        Value::String(s) => Cow::Borrowed(s),
        Value::Array(_) => Cow::Owned(
            hf::hf_message(m)["content"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        ),
        _ => Cow::Borrowed(""),
    }
}

fn calls_of(m: &Value) -> Vec<(&Value, Value)> {
    m["tool_calls"]
        .as_array()
        .map(|calls| {
            calls
                .iter()
                .map(|c| {
                    let f = &c["function"];
                    let arguments = match &f["arguments"] {
                        Value::String(s) => {
                            serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone()))
                        }
                        other => other.clone(),
                    };
                    (&f["name"], arguments)
                })
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;
