use super::*;
use crate::hermes;
use proptest::prelude::*;
use serde_json::json;

const START: &str = "<|im_start|>";
const END: &str = "<|im_end|>";

/// ChatML, tool calls as Hermes text, over a tokenizer of one id a character
/// (the two markers one id each): its tokenization is stable, so a splice must
/// give exactly a fresh render's ids. `strip_thinking` drops `<think>…</think>`
/// from earlier assistant turns, as Qwen3's template does.
struct ChatMl {
    strip_thinking: bool,
    stops: Vec<(u32, String)>,
}

impl ChatMl {
    fn new(strip_thinking: bool) -> ChatMl {
        ChatMl {
            strip_thinking,
            stops: vec![(1, END.to_string())],
        }
    }

    /// What the model would sample to say `message` as the template shows it.
    fn turn(&self, message: &Value) -> String {
        let mut text = message["content"].as_str().unwrap_or_default().to_string();
        for c in message["tool_calls"].as_array().into_iter().flatten() {
            let f = &c["function"];
            let arguments: Value = serde_json::from_str(f["arguments"].as_str().unwrap()).unwrap();
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(&hermes::render(f["name"].as_str().unwrap(), &arguments));
        }
        text
    }
}

impl ChatRenderer for ChatMl {
    fn render(&self, messages: &[Value], _: Option<&Value>, gen: bool) -> Result<String, String> {
        let last_user = messages.iter().rposition(|m| m["role"] == "user");
        let mut out = String::new();
        for (i, m) in messages.iter().enumerate() {
            let mut turn = self.turn(m);
            if self.strip_thinking && m["role"] == "assistant" && last_user.is_some_and(|u| i < u) {
                if let Some(end) = turn.find("</think>") {
                    turn = turn[end + "</think>".len()..].trim_start().to_string();
                }
            }
            out.push_str(&format!(
                "{START}{}\n{turn}{END}\n",
                m["role"].as_str().unwrap()
            ));
        }
        if gen {
            out.push_str(&format!("{START}assistant\n"));
        }
        Ok(out)
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        let mut ids = Vec::new();
        let mut rest = text;
        while let Some(c) = rest.chars().next() {
            if let Some(r) = rest.strip_prefix(START) {
                ids.push(0);
                rest = r;
            } else if let Some(r) = rest.strip_prefix(END) {
                ids.push(1);
                rest = r;
            } else {
                ids.push(c as u32 + 2);
                rest = &rest[c.len_utf8()..];
            }
        }
        Ok(ids)
    }

    fn stop_tokens(&self) -> &[(u32, String)] {
        &self.stops
    }
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

fn tool_call(id: &str, name: &str, arguments: &Value) -> Value {
    json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": id, "type": "function", "function": {"name": name, "arguments": arguments.to_string()}}]})
}

/// A session driven call by call: the harness's next messages, the model's
/// sampled ids for each answer (`sample`), the history the proxy keeps.
struct Session<'r> {
    renderer: &'r ChatMl,
    messages: Vec<Value>,
    history: Vec<AnsweredCall>,
    /// The same calls as a restarted proxy restores them from the log: the
    /// messages as the harness sent them, no rendering kept.
    restored: Vec<AnsweredCall>,
}

impl<'r> Session<'r> {
    fn new(renderer: &'r ChatMl, first: Vec<Value>) -> Session<'r> {
        Session {
            renderer,
            messages: first,
            history: Vec::new(),
            restored: Vec::new(),
        }
    }

    /// One call: its prompt, then `answer` sampled as `sampled`.
    fn call(&mut self, answer: Value, sampled: Vec<u32>) -> Prompt {
        let p = prompt(&self.history, &self.messages, None, self.renderer).unwrap();
        // The rendering kept from the last call changes nothing.
        let restored = prompt(&self.restored, &self.messages, None, self.renderer).unwrap();
        assert_eq!((&p.ids, &p.made), (&restored.ids, &restored.made));
        let call = self.history.len() as i64;
        let answered = AnsweredCall::new(call, p.clone(), None, answer.clone(), sampled);
        self.restored.push(AnsweredCall {
            messages: self.messages.clone(),
            prompt_text: None,
            ..answered.clone()
        });
        self.history.push(answered);
        self.messages.push(answer);
        p
    }

    /// The model sampled exactly what the template renders, then `<|im_end|>`.
    fn faithful(&self, answer: &Value) -> Vec<u32> {
        let mut ids = self.renderer.encode(&self.renderer.turn(answer)).unwrap();
        ids.push(1);
        ids
    }

    fn fresh(&self) -> Vec<u32> {
        let r = self.renderer;
        r.encode(&r.render(&self.messages, None, true).unwrap())
            .unwrap()
    }
}

/// An answer: plain text, or a call of `name` with `{"n": k}`.
fn answer_strategy() -> impl Strategy<Value = Value> {
    prop_oneof![
        "[a-z ]{1,20}"
            .prop_map(|t| json!({"role": "assistant", "content": t.trim().to_string() + "."})),
        ("[a-z]{1,8}", 0i64..1000).prop_map(|(name, n)| tool_call("x", &name, &json!({"n": n}))),
    ]
}

proptest! {
    /// Where the model's tokens are the template's, every follow-up is a
    /// splice and its ids are exactly those of a fresh render.
    #[test]
    fn a_stable_tokenization_splices_to_the_fresh_render(
        system in "[a-z ]{0,30}",
        first in "[a-z ?]{1,30}",
        turns in prop::collection::vec((answer_strategy(), "[a-z0-9 ]{0,20}", any::<bool>()), 1..8),
    ) {
        let renderer = ChatMl::new(false);
        let mut s = Session::new(&renderer, vec![json!({"role": "system", "content": system}), user(&first)]);
        for (i, (answer, reply, as_tool)) in turns.into_iter().enumerate() {
            let fresh = s.fresh();
            let sampled = s.faithful(&answer);
            let p = s.call(answer, sampled);
            prop_assert_eq!(&p.ids, &fresh);
            if i == 0 {
                let rendered = matches!(p.made, Made::Rendered { .. });
                prop_assert!(rendered);
            } else {
                prop_assert_eq!(p.made, Made::Spliced { base_call: i as i64 - 1 });
            }
            s.messages.push(if as_tool {
                json!({"role": "tool", "tool_call_id": "x", "content": reply})
            } else {
                user(&reply)
            });
        }
    }

    /// Where the model wrote its call otherwise than the template would
    /// (key order, spacing), the next prompt holds the sampled ids
    /// themselves, not the re-rendered ones, whatever the harness sends back.
    #[test]
    fn the_sampled_ids_stay_where_a_re_render_differs(
        n in 0i64..100_000,
        name in "[a-z]{1,8}",
        spaced in any::<bool>(),
    ) {
        let renderer = ChatMl::new(false);
        let mut s = Session::new(&renderer, vec![user("go")]);
        let arguments = json!({"n": n, "why": "because"});
        let answer = tool_call("call_0", &name, &arguments);
        let sampled_text = format!(
            "<tool_call>\n{{\"arguments\": {{\"why\":\"because\",\"n\":{n}}}, \"name\": \"{name}\"}}\n</tool_call>"
        );
        let mut sampled = renderer.encode(&sampled_text).unwrap();
        sampled.push(1);
        let first = s.call(answer, sampled.clone());
        // The harness sends the call back with its own id and spacing.
        let sep = if spaced { ", " } else { "," };
        let back = format!("{{\"why\":\"because\"{sep}\"n\": {n}}}");
        *s.messages.last_mut().unwrap() = json!({"role": "assistant", "content": "", "tool_calls": [
            {"id": "toolu_99", "type": "function", "function": {"name": name, "arguments": back}}]});
        s.messages.push(json!({"role": "tool", "tool_call_id": "toolu_99", "content": "ok"}));
        let fresh = s.fresh();
        let next = s.call(json!({"role": "assistant", "content": "done"}), vec![]);
        prop_assert_eq!(next.made, Made::Spliced { base_call: 0 });
        let base = [first.ids.as_slice(), sampled.as_slice()].concat();
        prop_assert_eq!(&next.ids[..base.len()], &base[..]);
        prop_assert_ne!(&next.ids, &fresh);
        // After the sampled ids: the template's `\n`, then the new turns as it renders them.
        let tail = renderer.encode(&format!("\n{START}tool\nok{END}\n{START}assistant\n")).unwrap();
        prop_assert_eq!(&next.ids[base.len()..], &tail[..]);
    }
}

#[test]
fn an_edited_history_is_rendered_afresh_and_says_where() {
    let renderer = ChatMl::new(false);
    let mut s = Session::new(&renderer, vec![user("one")]);
    let a = json!({"role": "assistant", "content": "two"});
    let sampled = s.faithful(&a);
    s.call(a, sampled);
    s.messages.push(user("three"));
    s.messages[0] = user("ONE");
    let p = prompt(&s.history, &s.messages, None, &renderer).unwrap();
    assert_eq!(p.ids, s.fresh());
    assert_eq!(
        p.made,
        Made::Rendered {
            why: "message 0 differs from call 0's (history edited, compacted, or another conversation)".into()
        }
    );
    // A different answer sent back than the one returned.
    s.messages[0] = user("one");
    s.messages[1] = json!({"role": "assistant", "content": "TWO"});
    let p = prompt(&s.history, &s.messages, None, &renderer).unwrap();
    assert_eq!(
        p.made,
        Made::Rendered {
            why: "message 1 is not the answer call 0 returned".into()
        }
    );
}

#[test]
fn a_template_that_rewrites_earlier_turns_forks_with_the_reason() {
    let renderer = ChatMl::new(true);
    let mut s = Session::new(&renderer, vec![user("q")]);
    let a = json!({"role": "assistant", "content": "<think>hmm</think>yes"});
    let sampled = s.faithful(&a);
    s.call(a, sampled);
    s.messages.push(user("and?"));
    let p = prompt(&s.history, &s.messages, None, &renderer).unwrap();
    assert_eq!(p.ids, s.fresh());
    match p.made {
        Made::Rendered { why } => assert!(why.contains("re-renders earlier turns"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_length_cut_answer_is_closed_by_the_template() {
    let renderer = ChatMl::new(false);
    let mut s = Session::new(&renderer, vec![user("q")]);
    let a = json!({"role": "assistant", "content": "abc"});
    let sampled = renderer.encode("abc").unwrap(); // no <|im_end|>: cut at max_tokens
    let first = s.call(a, sampled.clone());
    s.messages.push(user("r"));
    let p = prompt(&s.history, &s.messages, None, &renderer).unwrap();
    assert_eq!(p.ids, s.fresh());
    assert_eq!(p.made, Made::Spliced { base_call: 0 });
    assert_eq!(
        &p.ids[..first.ids.len() + 3],
        &[&first.ids[..], &sampled[..]].concat()[..]
    );
}

#[test]
fn the_longest_extended_call_is_the_base_and_tools_must_agree() {
    let renderer = ChatMl::new(false);
    let mut s = Session::new(&renderer, vec![user("q")]);
    let a = json!({"role": "assistant", "content": "a"});
    let sampled = s.faithful(&a);
    s.call(a, sampled);
    s.messages.push(user("r"));
    let b = json!({"role": "assistant", "content": "b"});
    let sampled = s.faithful(&b);
    s.call(b, sampled);
    s.messages.push(user("s"));
    // An unrelated call (a title request) in between does not hide the base.
    let aside = vec![user("title?")];
    let p = prompt(&s.history, &aside, None, &renderer).unwrap();
    assert!(matches!(p.made, Made::Rendered { .. }));
    let p = prompt(&s.history, &s.messages, None, &renderer).unwrap();
    assert_eq!(p.made, Made::Spliced { base_call: 1 });
    let tools = json!([{"type": "function", "function": {"name": "ls"}}]);
    let p = prompt(&s.history, &s.messages, Some(&tools), &renderer).unwrap();
    assert_eq!(
        p.made,
        Made::Rendered {
            why: "the tools differ from call 1's".into()
        }
    );
}

/// A harness that rewrites the answer it got (OpenCode recasing a tool's
/// name) is rendered afresh, and the reason names the conversation's call,
/// not a title call that came after it (it once said "the tools differ from
/// call 1's", the title call's).
#[test]
fn why_a_call_is_rendered_afresh_is_said_of_the_conversations_latest_call() {
    let renderer = ChatMl::new(false);
    let tools = json!([{"type": "function", "function": {"name": "bash"}}]);
    let mut s = Session::new(&renderer, vec![user("q")]);
    let answer = tool_call("c0", "Bash", &json!({"command": "ls"}));
    let sampled = s.faithful(&answer);
    s.call(answer, sampled);
    s.history[0].tools = Some(tools.clone());
    // The title call, no tools, answered after the conversation's call 0.
    let mut title = Session::new(&renderer, vec![user("title?")]);
    let answer = json!({"role": "assistant", "content": "A title"});
    let sampled = title.faithful(&answer);
    title.call(answer, sampled);
    let mut history = s.history.clone();
    history.extend(title.history.iter().map(|c| AnsweredCall {
        call: 1,
        ..c.clone()
    }));
    // The harness sends its history back with the tool's name as it knows it.
    let mut messages = s.messages.clone();
    messages.truncate(1);
    messages.push(tool_call("c0", "bash", &json!({"command": "ls"})));
    messages.push(json!({"role": "tool", "tool_call_id": "c0", "content": "app"}));
    let p = prompt(&history, &messages, Some(&tools), &renderer).unwrap();
    assert_eq!(
        p.made,
        Made::Rendered {
            why: "message 1 is not the answer call 0 returned".into()
        }
    );
}

#[test]
fn messages_compare_as_they_read() {
    assert!(same_message(
        &json!({"role": "assistant", "content": null, "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{\"a\":1,\"b\":2}"}}]}),
        &json!({"role": "assistant", "content": "", "tool_calls": [{"id": "z", "type": "function", "function": {"name": "f", "arguments": "{\"b\": 2, \"a\": 1}"}}]}),
    ));
    assert!(same_message(
        &json!({"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]}),
        &json!({"role": "user", "content": "hi there\n"}),
    ));
    assert!(!same_message(
        &user("a"),
        &json!({"role": "system", "content": "a"})
    ));
    assert!(!same_message(
        &tool_call("a", "f", &json!({"n": 1})),
        &tool_call("a", "f", &json!({"n": 2}))
    ));
}
