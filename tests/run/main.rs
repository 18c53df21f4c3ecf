//! `forgelog run` end to end: real podman sandboxes (runc, one network
//! namespace each whose only route is the proxy), the real harnesses from
//! their read-only bundles, the in-process capture proxy in front of the fake
//! upstream (playing a two-step agent), the real broker, the shipped tasks'
//! verifiers. Then the log is read back: every rollout's start, end and
//! verdict, every call with its tokens, trees built and groups joined.

mod readback;
#[path = "../support/mod.rs"]
mod support;
mod training;

use forgelog_producers::fake_upstream;
use forgelog_schemas::Event;
use forgelog_stream::testing::unique_run_id;
use readback::{assert_one_clean_path_per_rollout, derive, started, status_of, verdicts};
use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::time::{Duration, Instant};
use support::kit::{ProxyProcess, ADMIN};
use support::sandboxes::{
    finished_calls, fixture, outcome_row, output_timed, run_dir, slots_of, stderr_of, Fixture,
};
use support::{containers_of, faulty_variants, shipped, variant};

const HARNESSES: &str = "claude-code,codex,opencode,mini-swe-agent";

/// The shipped tasks the harnesses run on here: two say what twelve would
/// (every shipped solution scores 1 in its sandbox: tests/tasks.rs).
const TASKS: [&str; 2] = ["hello-file", "count-lines"];

/// `forgelog run` of `harnesses` on [`TASKS`], a rollout each.
fn on_two_tasks(f: &Fixture, run: &str, harnesses: &str) -> std::process::Output {
    let mut cmd = f.command(&shipped(), run, harnesses, 1);
    cmd.args(TASKS.iter().flat_map(|t| ["--task", t]));
    output_timed(&mut cmd, &format!("forgelog run {run}"))
}

/// A harness of our own (a launch script): from inside the sandbox it
/// writes the routing table to its stdout, then tries to finish its own
/// session through the proxy with reward 1 (a reward hack): it exits 0 only
/// when the session API refuses it.
const INTRUDER: &str = r#"cat /proc/net/route
python3 - <<'PY'
import os, sys, urllib.request, urllib.error
base, key = os.environ["FORGELOG_BASE_URL"], os.environ["FORGELOG_API_KEY"]
def status(path, body=None):
    req = urllib.request.Request(base + path, data=body, headers={
        "Content-Type": "application/json", "Authorization": "Bearer " + key})
    try:
        return urllib.request.urlopen(req, timeout=10).status
    except urllib.error.HTTPError as e:
        return e.code
print("session api:", status("/sessions/anything/finish", b'{"verifier": {"ok": true, "reward": 1.0}}'))
# Another server's API, twice, as a harness probing for Ollama would.
print("probe:", status("/api/tags"), status("/api/tags"))
PY
getent hosts telemetry.example.com || echo "lookup failed"
"#;

#[test]
fn shipped_tasks_run_in_sandboxes_with_four_harnesses_and_their_solutions() {
    let f = fixture();
    let run = unique_run_id("run-e2e");
    let scripts = tempfile::tempdir().unwrap();
    let intruder = scripts.path().join("intruder.sh");
    std::fs::write(&intruder, INTRUDER).unwrap();
    let harnesses = format!("{HARNESSES},solve,{}", intruder.display());
    let out = on_two_tasks(&f, &run, &harnesses);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let table = String::from_utf8_lossy(&out.stdout);
    for h in HARNESSES.split(',').chain(["solve", "intruder"]) {
        assert!(table.lines().any(|l| l.starts_with(h)), "{h}: {table}");
    }
    // The one harness that never asked the model (the intruder: `solve`
    // never does, by design) is named, with where its output is.
    let hints: Vec<&str> = table.lines().filter(|l| l.starts_with("hint: ")).collect();
    assert_eq!(hints.len(), 1, "{table}");
    // Its record names how it ended, what it looked up and what it asked
    // the proxy for in vain.
    for said in [
        "hint: no attempt of intruder reached the model: its record",
        "/attempts/",
        "it exited 0",
        "it looked up telemetry.example.com (refused: no network)",
        "the proxy has no route for GET /api/tags (2×)",
    ] {
        assert!(hints[0].contains(said), "{said}: {table}");
    }

    let events = f.events(&run);
    let verdicts = verdicts(&events);
    assert_eq!(verdicts.len(), TASKS.len() * 6, "one verdict per rollout");
    let finished: BTreeMap<String, (Option<i64>, i64)> = events
        .iter()
        .filter_map(|e| match e {
            Event::RolloutFinished(r) => {
                Some((r.rollout_id.clone(), (r.exit_status, r.model_calls)))
            }
            _ => None,
        })
        .collect();
    for (id, v) in &verdicts {
        assert!(!v.abandoned, "{id}: nothing was retried");
        let (exit, calls) = finished[id];
        let harness = HARNESSES
            .split(',')
            .chain(["solve", "intruder"])
            .find(|h| id.ends_with(&format!("-{h}-0")))
            .unwrap();
        match harness {
            // The reference solutions score 1, every one.
            "solve" => assert_eq!((v.ok, v.reward, calls), (true, Some(1.0), 0), "{id}"),
            // Refused by the session API; it did not solve the task either.
            "intruder" => assert_eq!(
                (status_of(v).as_str(), v.reward),
                ("scored", Some(0.0)),
                "{id}: {v:?}"
            ),
            // The fake agent runs two shell steps and answers: the harness
            // exits 0, the verifier scores what is in /app (not solved: 0).
            _ => {
                assert_eq!(status_of(v), "scored", "{id}: {v:?}");
                assert_eq!((exit, v.reward), (Some(0), Some(0.0)), "{id}");
                assert!(calls >= 3, "{id}: {calls} calls");
            }
        }
    }
    // Every call reached the fake upstream and is recorded with exactly the
    // token ids and logprobs it answered.
    let calls = finished_calls(&events);
    assert_eq!(
        calls.len() as i64,
        finished.values().map(|(_, n)| n).sum::<i64>()
    );
    let answers = f.fake.answers.lock().unwrap().clone();
    fake_upstream::assert_calls_match(&calls, &answers, fake_upstream::POLICY_VERSION);

    // Trees for every rollout, with every call on them; a group per rollout.
    let (trees, batches) = derive(&events);
    assert_eq!(trees.len(), verdicts.len());
    for t in &trees {
        let Event::TrajectoryBuilt(t) = t else {
            panic!()
        };
        assert_eq!(t.calls, finished[&t.rollout_id].1, "{}", t.rollout_id);
    }
    assert_eq!(batches.len(), verdicts.len());
    assert_one_clean_path_per_rollout(&events, &trees);

    // From inside: the only route is the veth's /30, no default route.
    let routes = std::fs::read_to_string(
        run_dir(&run)
            .join("attempts")
            .join(format!("{run}-hello-file-intruder-0"))
            .join("stdout"),
    )
    .unwrap();
    let table: Vec<Vec<&str>> = routes
        .lines()
        .skip(1)
        .take_while(|l| !l.starts_with("session api"))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(table.len(), 1, "{routes}");
    assert!(table[0][0].starts_with("flr"), "{routes}");
    assert!(routes.contains("probe: 404 404"), "{routes}");
    assert!(routes.contains("lookup failed"), "{routes}");
    assert_ne!(table[0][1], "00000000", "no default route: {routes}");
    assert!(routes.contains("session api: 401"), "{routes}");

    assert_eq!(containers_of(&run), 0, "sandboxes left behind");
    assert_eq!(slots_of(&run), 0, "network namespaces left behind");
}

/// The kit's other harnesses (all but the first four: Gemini CLI, Qwen
/// Code, pi, aider, the SDK agents...) from their bundles, each in its
/// sandbox, on two shipped tasks: every rollout exits 0 and is scored, every
/// call recorded with the ids the upstream gave, each rollout one clean path.
#[test]
fn the_newer_kit_harnesses_run_in_sandboxes() {
    let f = fixture();
    let run = unique_run_id("run-kit8");
    let newer: Vec<&str> = forgelog_deploy::harness::pinned()
        .map(|h| h.name)
        .filter(|h| !HARNESSES.split(',').any(|first| first == *h))
        .collect();
    assert!(newer.len() >= 12, "{newer:?}");
    let out = on_two_tasks(&f, &run, &newer.join(","));
    assert!(out.status.success(), "{}", stderr_of(&out));
    let events = f.events(&run);
    let verdicts = verdicts(&events);
    assert_eq!(verdicts.len(), 2 * newer.len(), "one verdict per rollout");
    for e in &events {
        if let Event::RolloutFinished(r) = e {
            // aider answers in one exchange (no tools); the others run the
            // fake agent's two shell steps and answer.
            let least = if r.rollout_id.ends_with("-aider-0") {
                1
            } else {
                3
            };
            assert_eq!(r.exit_status, Some(0), "{}", r.rollout_id);
            assert!(
                r.model_calls >= least,
                "{}: {} calls",
                r.rollout_id,
                r.model_calls
            );
            assert_eq!(
                status_of(&verdicts[&r.rollout_id]),
                "scored",
                "{}",
                r.rollout_id
            );
        }
    }
    let calls = finished_calls(&events);
    let answers = f.fake.answers.lock().unwrap().clone();
    fake_upstream::assert_calls_match(&calls, &answers, fake_upstream::POLICY_VERSION);
    let (trees, _) = derive(&events);
    assert_one_clean_path_per_rollout(&events, &trees);
    assert_eq!(containers_of(&run), 0, "sandboxes left behind");
}

/// Every way a rollout can fail comes out as its typed status with a null
/// reward; an attempt that never reached the model (the `solve` harness
/// never does) is abandoned and tried again twice, each try recorded, and
/// the group's members are the final attempts only.
#[test]
fn failures_are_typed_and_tried_again_twice_before_the_first_model_call() {
    let f = fixture();
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    variant(r, "good", "instruction.md", "Write hello.txt.\n");
    faulty_variants(r);
    let run = unique_run_id("run-faults");
    let out = f.run(r, &run, "solve", 2);
    assert!(
        out.status.success(),
        "rollouts failed, the orchestrator did not: {}",
        stderr_of(&out)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("infra:image 2"), "{table}");

    let events = f.events(&run);
    let verdicts = verdicts(&events);
    let mut attempts = started(&events);
    attempts.sort();
    let expected = [
        ("agent-hangs", "agent_timeout"),
        ("image-missing", "infra:image"),
        ("reward-missing", "reward_missing"),
        ("reward-nan", "reward_invalid"),
        ("verifier-crashes", "verifier_error"),
    ];
    for member in 0..2 {
        for (task, status) in expected {
            let id = format!("{run}-{task}-solve-{member}");
            let tries = [id.clone(), format!("{id}~1"), format!("{id}~2")];
            for (n, t) in tries.iter().enumerate() {
                let v = &verdicts[t];
                assert_eq!(status_of(v), status, "{t}");
                assert_eq!((v.ok, v.reward), (false, None), "{t}: never a 0");
                assert_eq!(
                    v.abandoned,
                    n < 2,
                    "{t}: tries 1 and 2 are given up, 3 stands"
                );
                assert!(attempts.contains(t), "{t} started");
            }
        }
        for (task, reward) in [("good", 1.0), ("wrong-answer", 0.0)] {
            let id = format!("{run}-{task}-solve-{member}");
            assert_eq!(verdicts[&id].reward, Some(reward), "{id}");
            assert!(
                !verdicts.contains_key(&format!("{id}~1")),
                "{id}: scored, not retried"
            );
        }
    }
    assert_eq!(attempts.len(), 2 * (2 + 3 * expected.len()));
    let (_, batches) = derive(&events);
    assert_eq!(batches.len(), 2 + expected.len(), "one group per task");
    for b in &batches {
        let members: Vec<&str> = b.members.iter().map(|m| m.rollout_id.as_str()).collect();
        assert_eq!(members.len(), 2, "{members:?}");
        let failed = expected.iter().any(|(t, _)| b.task_id == *t);
        for m in &b.members {
            assert_eq!(m.rollout_id.ends_with("~2"), failed, "{members:?}");
        }
    }
    assert_eq!(containers_of(&run), 0);
    assert_eq!(slots_of(&run), 0);
}

/// `kill -9` of the orchestrator mid-run, then the same `forgelog run --run R`
/// again: it reaps what the dead one left, gives up the attempts it left
/// open, and runs what is not finished: no rollout is lost, none that
/// finished runs twice, and every group is complete.
#[test]
fn a_killed_run_resumes_without_losing_or_repeating_a_rollout() {
    let f = fixture();
    let root = tempfile::tempdir().unwrap();
    for t in ["slow-a", "slow-b", "slow-c"] {
        variant(
            root.path(),
            t,
            "solution/solve.sh",
            "sleep 2; printf 'Hello, forgelog!\\n' > /app/hello.txt\n",
        );
    }
    let run = unique_run_id("run-resume");
    let mut child = f
        .command(root.path(), &run, "solve", 2)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Killed once two agents are done, with others in flight.
    let attempts = run_dir(&run).join("attempts");
    let deadline = Instant::now() + Duration::from_secs(120);
    while std::fs::read_dir(&attempts).map_or(0, |d| d.count()) < 2 {
        assert!(Instant::now() < deadline, "no rollout finished");
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before it was killed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let before = f.events(&run);

    let out = f.run(root.path(), &run, "solve", 2);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let events = f.events(&run);
    let verdicts = verdicts(&events);
    let starts = started(&events);
    let finished_before: BTreeSet<String> = before
        .iter()
        .filter_map(|e| match e {
            Event::RolloutFinished(r) => Some(r.rollout_id.clone()),
            _ => None,
        })
        .collect();
    for t in ["slow-a", "slow-b", "slow-c"] {
        for m in 0..2 {
            let id = format!("{run}-{t}-solve-{m}");
            let tries: Vec<&String> = starts
                .iter()
                .filter(|s| **s == id || s.starts_with(&format!("{id}~")))
                .collect();
            let standing: Vec<&&String> = tries
                .iter()
                .filter(|s| verdicts.get(**s).is_some_and(|v| !v.abandoned))
                .collect();
            assert_eq!(standing.len(), 1, "{id}: one finished attempt, {tries:?}");
            assert_eq!(verdicts[*standing[0]].reward, Some(1.0));
            if finished_before.contains(&id) {
                assert_eq!(
                    tries.len(),
                    1,
                    "{id} finished before the kill: not run again"
                );
            }
            // Every other try was given up, with a reason, never scored.
            for t in tries.iter().filter(|t| !standing.contains(t)) {
                let v = &verdicts[*t];
                assert!(v.abandoned && v.reward.is_none(), "{t}: {v:?}");
            }
        }
    }
    assert!(
        starts.len() > finished_before.len(),
        "something was in flight at the kill"
    );
    let table = String::from_utf8_lossy(&out.stdout);
    let solve = outcome_row(&table, "solve");
    assert_eq!(
        solve[2],
        finished_before.len().to_string(),
        "skipped as done: {table}"
    );
    let (_, batches) = derive(&events);
    assert_eq!(batches.len(), 3);
    assert!(batches.iter().all(|b| b.members.len() == 2));
    assert_eq!(
        containers_of(&run),
        0,
        "the dead run's sandboxes were reaped"
    );
    assert_eq!(slots_of(&run), 0);
}

/// SIGTERM (or Ctrl-C) stops a run as every stop does: the run says how to
/// resume it and removes what was in flight, its sandboxes and their
/// network slots, before it exits (SIGKILL, above, leaves them to the next
/// run's reaping).
#[test]
fn a_run_stopped_by_a_signal_says_how_to_resume_and_leaves_no_sandbox() {
    let f = fixture();
    let root = tempfile::tempdir().unwrap();
    variant(
        root.path(),
        "slow-a",
        "solution/solve.sh",
        "sleep 60; printf 'Hello, forgelog!\\n' > /app/hello.txt\n",
    );
    let run = unique_run_id("run-signal");
    let child = f
        .command(root.path(), &run, "solve", 1)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while containers_of(&run) == 0 {
        assert!(Instant::now() < deadline, "no sandbox started");
        std::thread::sleep(Duration::from_millis(100));
    }
    // SAFETY: kill(2) on the child's pid, which it still holds (not waited for).
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let stopped = Instant::now();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "forgelog run stopped by SIGTERM: {} in {:.1} s\n{stderr}",
        out.status,
        stopped.elapsed().as_secs_f64()
    );
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("interrupted: resume with --run {run}")),
        "{stderr}"
    );
    assert_eq!(containers_of(&run), 0, "the sandbox in flight is removed");
    assert_eq!(slots_of(&run), 0, "and its network slot");
}

/// `run --proxy`: the sessions go to a proxy that runs on its own (one a
/// platform keeps up for many runs, token in with the model's template),
/// the sandboxes reach it, and every call is recorded with the ids the
/// upstream gave. The wrong admin token ends the run at its first session,
/// saying the proxy refused it, with nothing recorded.
#[test]
fn a_run_through_a_proxy_of_its_own_records_there_and_a_wrong_token_is_refused() {
    let f = fixture();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let run = unique_run_id("run-ext");
    let tokenizer = [
        std::ffi::OsStr::new("--tokenizer"),
        f.model.path().as_os_str(),
    ];
    let proxy = ProxyProcess::start(&rt, &f.upstream, &f.stream, &run, &tokenizer);
    let through = |token: &str| {
        let mut cmd = f.command_without_engine(&shipped(), &run, "mini-swe-agent,solve", 1);
        cmd.args(["--task", "hello-file"])
            .args(["--proxy", &proxy.url, "--admin-token", token]);
        output_timed(&mut cmd, &format!("forgelog run {run} --proxy"))
    };

    let refused = through("not-the-admin-token");
    let said = stderr_of(&refused);
    assert_eq!(refused.status.code(), Some(2), "{said}");
    assert!(
        said.contains("creating a session: the proxy answered 401: admin token required"),
        "{said}"
    );
    assert!(f.events(&run).is_empty(), "nothing is recorded");
    assert_eq!(containers_of(&run), 0, "sandboxes left behind");

    let out = through(ADMIN);
    let said = stderr_of(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains(&format!("proxy {}", proxy.url)), "{said}");
    proxy.stop();
    let events = f.events(&run);
    let verdicts = verdicts(&events);
    assert_eq!(verdicts.len(), 2, "one verdict per rollout: {verdicts:?}");
    for (id, v) in &verdicts {
        if id.ends_with("-solve-0") {
            assert_eq!((v.ok, v.reward), (true, Some(1.0)), "{id}");
        } else {
            assert_eq!(status_of(v), "scored", "{id}: {v:?}");
        }
    }
    let calls = finished_calls(&events);
    assert!(calls.len() >= 3, "mini-swe-agent's calls: {}", calls.len());
    let answers = f.fake.answers.lock().unwrap().clone();
    fake_upstream::assert_calls_match(&calls, &answers, fake_upstream::POLICY_VERSION);
    // Token in, by that proxy: one clean path per rollout.
    let (trees, _) = derive(&events);
    assert_one_clean_path_per_rollout(&events, &trees);
    assert_eq!(containers_of(&run), 0, "sandboxes left behind");
    assert_eq!(slots_of(&run), 0, "network namespaces left behind");
}
