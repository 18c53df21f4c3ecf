//! `forgelog run` against the fake upstream (a two-step agent) and the
//! shared broker: the fixture of the sandboxed end-to-end tests. The run's
//! proxy renders the prompts with the fake model's tokenizer and template
//! (token in), as it does for the embedded engine.

use forgelog_producers::fake_upstream::{self, FakeOptions};
use forgelog_schemas::{Event, Topic};
use forgelog_stream::testing::shared_broker;
use forgelog_stream::{ReplayReader, StartAt, StreamConfig};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

/// Serves the fake upstream while it lives; runs `forgelog run` against it.
pub struct Fixture {
    /// Serves the fake upstream while the fixture lives.
    _rt: tokio::runtime::Runtime,
    pub stream: StreamConfig,
    pub upstream: String,
    pub fake: std::sync::Arc<fake_upstream::FakeUpstream>,
    /// The fake model's folder (`--tokenizer`).
    pub model: tempfile::TempDir,
    /// The runs started through it, whose directories go with it.
    pub runs: super::RunDirs,
}

pub fn fixture() -> Fixture {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let stream = rt.block_on(shared_broker());
    let (addr, fake) = rt
        .block_on(fake_upstream::spawn(
            "127.0.0.1:0".parse().unwrap(),
            FakeOptions {
                agent_steps: Some(2),
                keep_answers: true,
                ..Default::default()
            },
        ))
        .unwrap();
    let model = tempfile::tempdir().unwrap();
    fake_upstream::write_model_dir(model.path()).unwrap();
    Fixture {
        _rt: rt,
        stream,
        upstream: format!("http://{addr}"),
        fake,
        model,
        runs: Default::default(),
    }
}

impl Fixture {
    pub fn command(&self, tasks: &Path, run: &str, harnesses: &str, group: usize) -> Command {
        let mut cmd = self.command_without_engine(tasks, run, harnesses, group);
        cmd.args(["--upstream", &self.upstream])
            .arg("--tokenizer")
            .arg(self.model.path());
        cmd
    }

    /// [`Fixture::command`] but for where its calls go: the caller adds
    /// `--upstream` or `--proxy`.
    pub fn command_without_engine(
        &self,
        tasks: &Path,
        run: &str,
        harnesses: &str,
        group: usize,
    ) -> Command {
        self.runs.add(run);
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_forgelog"));
        cmd.arg("run")
            .arg(tasks)
            .args(["--harness", harnesses, "--run", run])
            .args(["--group-size", &group.to_string(), "--concurrency", "4"])
            .args(["--brokers", &self.stream.brokers])
            .args(["--max-model-calls", "8"]);
        cmd
    }

    pub fn run(&self, tasks: &Path, run: &str, harnesses: &str, group: usize) -> Output {
        let mut cmd = self.command(tasks, run, harnesses, group);
        output_timed(&mut cmd, &format!("forgelog run {run}"))
    }

    /// The run's events: calls (made whole), rollouts, rewards.
    pub fn events(&self, run: &str) -> Vec<Event> {
        let reader = ReplayReader::new(&self.stream).unwrap();
        let mut out = Vec::new();
        for topic in [Topic::Calls, Topic::Rollouts, Topic::Rewards] {
            for r in reader
                .read(topic.name(), StartAt::Beginning, Some(run))
                .unwrap()
            {
                out.push(r.event.expect("decodable"));
            }
        }
        // Calls whole again, as every reader of the log sees them (schema v5).
        let errors = forgelog_schemas::compact::expand_events(&mut out);
        assert!(errors.is_empty(), "{errors:?}");
        out
    }
}

/// The `CallFinished` events among `events`.
pub fn finished_calls(events: &[Event]) -> Vec<forgelog_schemas::CallFinished> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::CallFinished(c) => Some(c.clone()),
            _ => None,
        })
        .collect()
}

/// Every tool result a harness sent back holds what the fake agent's step
/// printed (`echo forgelog step N`) or, from a sub-agent it delegated to, that
/// agent's answer (`Done after N steps.`): none came back empty, as Qwen
/// Code's did when its one-shot shell settled before reading the command's
/// output.
pub fn assert_tool_results_hold_their_output(events: &[Event]) {
    let mut results = 0;
    for c in finished_calls(events) {
        let request: serde_json::Value = serde_json::from_str(&c.chat_request).unwrap_or_default();
        let Some(messages) = request["messages"].as_array() else {
            continue;
        };
        for m in messages.iter().filter(|m| m["role"] == "tool") {
            results += 1;
            let content = m["content"].to_string();
            assert!(
                content.contains("forgelog step") || content.contains("Done after"),
                "{} call {}: a tool result without its output: {m}",
                c.rollout_id,
                c.call_index
            );
        }
    }
    assert!(results > 0, "no tool result recorded");
}

/// A run's side calls (aux: OpenCode's and gptme's title calls), by rollout
/// and call index, told apart as `clean_rates` does, from the calls made whole.
pub fn side_calls(events: &[Event]) -> std::collections::BTreeSet<(String, i64)> {
    let mut sessions = std::collections::BTreeMap::<String, Vec<_>>::new();
    for c in finished_calls(events) {
        sessions.entry(c.session_id.clone()).or_default().push(c);
    }
    sessions
        .into_values()
        .flat_map(|mut calls| {
            forgelog_schemas::compact::expand_finished(&mut calls);
            let rollout = calls[0].rollout_id.clone();
            forgelog_consumers::core::clean::aux_calls(&calls)
                .into_iter()
                .map(move |i| (rollout.clone(), i))
        })
        .collect()
}

/// `cmd`'s output, once it ended, printed (`what`, its status, how long it
/// took, its stdout and its stderr's end).
pub fn output_timed(cmd: &mut Command, what: &str) -> Output {
    let started = Instant::now();
    let out = cmd.output().unwrap();
    eprintln!(
        "{what}: {} in {:.1} s\n{}\n{}",
        out.status,
        started.elapsed().as_secs_f64(),
        String::from_utf8_lossy(&out.stdout),
        stderr_of(&out)
    );
    out
}

/// The cells of `harness`'s row in the outcome table `forgelog run` prints
/// (harness, rollouts, scored, ...).
pub fn outcome_row<'a>(table: &'a str, harness: &str) -> Vec<&'a str> {
    table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(harness))
        .unwrap_or_else(|| panic!("no row of {harness}: {table}"))
        .split_whitespace()
        .collect()
}

pub fn stderr_of(out: &Output) -> String {
    let s = String::from_utf8_lossy(&out.stderr);
    s[s.len().saturating_sub(4000)..].to_string()
}

pub fn run_dir(run: &str) -> PathBuf {
    forgelog_stream::forgelog_home().join("runs").join(run)
}

/// Network slots the run still holds.
pub fn slots_of(run: &str) -> usize {
    std::fs::read_dir(run_dir(run).join("slots"))
        .map(|d| d.count())
        .unwrap_or(0)
}
