//! `kill -9` at any point: the process draining a spool, again and again
//! (every event still reaches the log exactly once and in order); and every
//! process of the closed loop (broker, engine, proxy, consumers, trainer)
//! while rollouts run through it.

use forgelog_schemas::{testing::call_finished, Codec, Event, Topic};
use forgelog_stream::spool::Checkpoint;
use forgelog_stream::testing::{shared_broker, unique_run_id};
use forgelog_stream::{ReplayReader, Spool, SpoolOptions, StartAt, StreamConfig};
use std::collections::{BTreeMap, HashSet};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const N: usize = 10_000;
const SESSIONS: usize = 20;

fn drain(config: &StreamConfig, dir: &std::path::Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_forgelog"))
        .args(["spool", "drain", "--dir"])
        .arg(dir)
        .args(["--brokers", &config.brokers])
        .spawn()
        .unwrap()
}

#[test]
fn killing_the_drainer_mid_drain_loses_and_duplicates_nothing() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = rt.block_on(shared_broker());
    let run = unique_run_id("drain-kill");
    let dir = tempfile::tempdir().unwrap();
    {
        // What a proxy leaves behind when the broker was away: a full spool.
        let spool = Spool::open(dir.path(), SpoolOptions::default()).unwrap();
        for i in 0..N {
            let e: Event = call_finished(
                &run,
                &format!("s{}", i % SESSIONS),
                (i / SESSIONS) as i64,
                2_000,
                64,
            )
            .into();
            spool
                .append(
                    e.topic().name(),
                    e.key().as_bytes(),
                    &Codec::global().encode(&e).unwrap(),
                )
                .unwrap();
        }
    }
    // Each drainer is killed as soon as its checkpoint passes the next fifth:
    // a local signal, so a fast drain cannot finish between two polls of the
    // broker. Up to a window of records is then in flight or delivered but not
    // checkpointed, which is what the next drainer's recovery scan must sort out.
    let mut kills_mid_drain = 0;
    for k in 1..=4 {
        let mut child = drain(&config, dir.path());
        let target = (k * N / 5) as u64;
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            assert!(Instant::now() < deadline, "drain made no progress");
            if child.try_wait().unwrap().is_some() {
                break;
            }
            let acked = Checkpoint::load(dir.path()).map_or(0, |c| c.acked_through);
            if acked >= target {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                if acked < N as u64 {
                    kills_mid_drain += 1;
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    assert!(
        kills_mid_drain >= 2,
        "only {kills_mid_drain} kills landed mid-drain"
    );
    let status = drain(&config, dir.path()).wait().unwrap();
    assert!(status.success(), "final drain failed: {status}");

    let got = ReplayReader::new(&config)
        .unwrap()
        .read(Topic::Calls.name(), StartAt::Beginning, Some(&run))
        .unwrap();
    let mut seen = HashSet::new();
    let mut last: BTreeMap<Vec<u8>, i64> = BTreeMap::new();
    for r in &got {
        let Ok(Event::CallFinished(c)) = &r.event else {
            panic!("{:?}", r.event)
        };
        assert!(
            seen.insert(c.event_id.clone()),
            "duplicate: session {} call {}",
            c.session_id,
            c.call_index
        );
        let prev = last.insert(r.key.clone(), c.call_index);
        assert!(
            prev.is_none_or(|p| p < c.call_index),
            "out of order in session {}",
            c.session_id
        );
    }
    assert_eq!(seen.len(), N, "events lost");
    println!("{kills_mid_drain} kills mid-drain; {N} events arrived exactly once, in order");
}

/// The newest version `run` published (0 before any, or with the broker away).
fn newest_version(config: &StreamConfig, run: &str) -> i64 {
    ReplayReader::new(config)
        .ok()
        .and_then(|reader| forgelog_stream::newest_policy(&reader, Some(run)).ok())
        .flatten()
        .map_or(0, |p| p.version)
}

/// What a failed chaos run leaves to read: what the log holds for `run` and
/// the end of each process's log.
fn what_happened(config: &StreamConfig, run: &str, logs: &std::path::Path) -> String {
    let mut out = String::new();
    if let Ok(reader) = ReplayReader::new(config) {
        for topic in [Topic::Rollouts, Topic::Batches, Topic::Policy] {
            let events = reader.read(topic.name(), StartAt::Beginning, Some(run));
            let summary: Vec<String> = events
                .iter()
                .flatten()
                .filter_map(|r| r.event.as_ref().ok())
                .map(|e| match e {
                    Event::PolicyPublished(p) => format!("v{} {:?}", p.version, p.metrics),
                    e => format!("{:?} {}", e.kind(), e.key()),
                })
                .collect();
            out += &format!("\n{}: {summary:?}", topic.name());
        }
    }
    let mut files: Vec<_> = std::fs::read_dir(logs)
        .into_iter()
        .flatten()
        .flatten()
        .collect();
    files.sort_by_key(|f| f.file_name());
    for file in files {
        let text = std::fs::read_to_string(file.path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(25)..].join("\n");
        out += &format!(
            "\n--- {:?} ({} lines):\n{tail}",
            file.file_name(),
            lines.len()
        );
    }
    out
}

/// A process of the chaos test, killed with SIGKILL when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const ADMIN: &str = "chaos-admin";

/// Chaos: the closed loop as `forgelog up --train` runs it, each part its own
/// process — `forgelog engine` (a tiny llama, following the run's policies),
/// `forgelog proxy`, `forgelog consume all`, `forgelog train` — with rollouts
/// driven through the proxy (the driver acting as harness and orchestrator
/// both, retrying what a crash interrupted) while each of those and the
/// broker is killed with SIGKILL at random points and started again.
/// Afterwards every call started has exactly one end, no event is in the log
/// twice, every finished rollout's call count matches its calls, `replay
/// rebuild` says the consumers' outputs are what the log implies, and the
/// trainer's versions are contiguous, each published once, every group
/// trained once (or counted as dropped for staleness), and served.
#[test]
fn the_loop_survives_kill_9_of_each_of_its_processes_at_random_points() {
    use forgelog_api::{Finish, NewSession, SessionClient, Verdict};
    use forgelog_stream::testing::{free_local_addr, PrivateBroker};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _in_runtime = rt.enter();
    let mut broker = PrivateBroker::start().unwrap();
    let config = broker.config();
    rt.block_on(forgelog_stream::admin::create_topics(
        &config,
        &Default::default(),
    ))
    .unwrap();
    let run = unique_run_id("chaos");
    let dirs = tempfile::tempdir().unwrap();
    let dir = |name: &str| dirs.path().join(name);
    let model = dir("model");
    forgelog_model::testing::write_tiny_llama(&model, 11).unwrap();
    let (listen, engine_listen) = (free_local_addr(), free_local_addr());
    let bin = env!("CARGO_BIN_EXE_forgelog");
    // Each process's log, kept across its restarts, for a failure to show.
    let logs = dir("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let spawn = |args: &[&str], wait_for: Option<std::net::SocketAddr>| {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(logs.join(format!("{}.log", args[0])))
            .unwrap();
        let child = Command::new(bin)
            .args(args)
            .args(["--brokers", &config.brokers])
            .env("RUST_LOG", "info")
            .stderr(log)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while wait_for.is_some_and(|a| std::net::TcpStream::connect(a).is_err()) {
            assert!(Instant::now() < deadline, "{args:?} did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Proc(child)
    };
    let path = |p: std::path::PathBuf| p.display().to_string();
    let start_engine = || {
        let listen = engine_listen.to_string();
        spawn(
            &[
                "engine",
                "--model",
                &path(model.clone()),
                "--listen",
                &listen,
                "--run",
                &run,
            ],
            Some(engine_listen),
        )
    };
    let start_proxy = || {
        let (upstream, listen_at) = (format!("http://{engine_listen}"), listen.to_string());
        let spool = path(dir("proxy-spool"));
        spawn(
            &[
                "proxy",
                "--upstream",
                &upstream,
                "--listen",
                &listen_at,
                "--run-id",
                &run,
                "--admin-token",
                ADMIN,
                "--upstream-timeout-secs",
                "5",
                "--spool",
                &spool,
            ],
            Some(listen),
        )
    };
    let start_consumers = || {
        let state = path(dir("consumers"));
        spawn(
            &[
                "consume",
                "all",
                "--checkpoint-every",
                "10",
                "--state",
                &state,
            ],
            None,
        )
    };
    const GROUPS_PER_STEP: usize = 2;
    let start_trainer = || {
        let (checkpoints, spool) = (
            format!("file://{}", path(dir("checkpoints"))),
            path(dir("trainer-spool")),
        );
        spawn(
            &[
                "train",
                "--model",
                &path(model.clone()),
                "--run",
                &run,
                "--checkpoints",
                &checkpoints,
                "--spool",
                &spool,
                "--groups-per-step",
                &GROUPS_PER_STEP.to_string(),
                "--tokens-per-step",
                "1000000",
                "--idle-flush",
                "600",
                "--learning-rate",
                "1e-3",
            ],
            None,
        )
    };
    // Started in the order `up` starts them; restarted by name after a kill.
    let starts: [(&str, &dyn Fn() -> Proc); 4] = [
        ("engine", &start_engine),
        ("proxy", &start_proxy),
        ("consumers", &start_consumers),
        ("trainer", &start_trainer),
    ];
    let mut procs: Vec<Proc> = starts.iter().map(|(_, start)| start()).collect();
    let url = format!("http://{listen}");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let sessions = SessionClient::with_http(&url, Some(ADMIN.into()), http.clone());
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let mut kills = BTreeMap::<&str, usize>::new();
    let mut finished_rollouts = Vec::new();
    // Groups of two: a step every `GROUPS_PER_STEP` groups.
    let rollouts_to_run = 16 * forgelog_stream::testing::soak_scale();
    const CALLS: usize = 4;
    for r in 0..rollouts_to_run {
        let mut attempt = 0;
        // Chaos before (and during the calls) each step of the driver: one
        // chance in three of a kill, the broker's or one of the processes'.
        let mut chaos = |procs: &mut Vec<Proc>, broker: &mut PrivateBroker| {
            let which = next(15) as usize;
            if which < starts.len() {
                // Mid-request, as often as not: a call in flight dies with it.
                std::thread::sleep(Duration::from_millis(next(60)));
                let (name, start) = starts[which];
                let _ = procs[which].0.kill();
                let _ = procs[which].0.wait();
                *kills.entry(name).or_default() += 1;
                procs[which] = start();
            } else if which == starts.len() {
                broker.kill();
                std::thread::sleep(Duration::from_millis(500 + next(1000)));
                broker.restart().unwrap();
                *kills.entry("broker").or_default() += 1;
            }
        };
        let (session, key, rollout) = loop {
            chaos(&mut procs, &mut broker);
            let rollout = format!("{run}-r{r}~{attempt}");
            let new =
                NewSession::new(&rollout, "t", "chaos", format!("{run}-g{}", r / 2)).group_size(2);
            match rt.block_on(sessions.create(&new)) {
                Ok(s) => break (s.session_id, s.api_key, rollout),
                // Created before a crash, its answer lost: its key is gone
                // with it, so it is given up and tried again (as `forgelog run` does).
                Err(e) if e.status() == Some(409) => {
                    let gone = forgelog_api::AbandonAttempt {
                        run_id: None,
                        rollout_id: rollout.clone(),
                        why: "its answer was lost in a crash".into(),
                    };
                    while rt.block_on(sessions.abandon(&gone)).is_err() {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    attempt += 1;
                }
                Err(e) => {
                    assert!(e.status().is_none() || e.status() >= Some(500), "{e}");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        };
        for c in 0..CALLS {
            loop {
                let call = http
                    .post(format!("{url}/v1/chat/completions"))
                    .bearer_auth(&key)
                    .json(&serde_json::json!({"model": "m", "messages": [{"role": "user", "content": format!("r{r} c{c}")}]}))
                    .send();
                let call = rt.spawn(call);
                chaos(&mut procs, &mut broker);
                match rt.block_on(call).unwrap() {
                    Ok(resp) if resp.status().is_success() => break,
                    Ok(resp) => {
                        let status = resp.status().as_u16();
                        assert_ne!(status, 401, "the session's key stopped working");
                        assert!(status >= 500, "{status}");
                    }
                    Err(_) => {}
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let finish = Finish {
            exit_status: Some(0),
            verifier: Some(Verdict::scored((r % 2) as f64, "")),
            ..Default::default()
        };
        loop {
            chaos(&mut procs, &mut broker);
            match rt.block_on(sessions.finish(&session, &finish)) {
                Ok(_) => break,
                // Finished before a crash took the answer.
                Err(e) if e.status() == Some(404) => break,
                Err(e) => {
                    assert!(e.status().is_none() || e.status() >= Some(500), "{e}");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        finished_rollouts.push(rollout);
        // The loop closes: the next round waits for the version trained on
        // this one's groups (as `up --demo --train` does), kills and all.
        if (r + 1) % (2 * GROUPS_PER_STEP) == 0 {
            let version = ((r + 1) / (2 * GROUPS_PER_STEP)) as i64;
            let deadline = Instant::now() + Duration::from_secs(120);
            for waited in 0.. {
                if newest_version(&config, &run) >= version {
                    break;
                }
                if Instant::now() >= deadline {
                    let exited: Vec<_> = starts
                        .iter()
                        .zip(procs.iter_mut())
                        .filter_map(|((name, _), p)| Some((name, p.0.try_wait().ok()??)))
                        .collect();
                    panic!(
                        "version {version} was never published; exited on their own: {exited:?}; {}",
                        what_happened(&config, &run, &logs)
                    );
                }
                // A chance of a kill every few seconds of waiting, not more:
                // a process killed faster than it starts makes no progress.
                if waited % 15 == 14 {
                    chaos(&mut procs, &mut broker);
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
    // A clean stop: the proxy flushes its spool, then the consumers catch up.
    let proxy = &mut procs[1].0;
    unsafe { libc::kill(proxy.id() as i32, libc::SIGTERM) };
    assert!(proxy.wait().unwrap().success());
    let rebuild = || {
        Command::new(bin)
            .args([
                "replay",
                "rebuild",
                "--run",
                &run,
                "--brokers",
                &config.brokers,
            ])
            .output()
            .unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    let verdict = loop {
        let out = rebuild();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if text.starts_with("identical") {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "consumers never caught up: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_secs(1));
    };
    let reader = ReplayReader::new(&config).unwrap();
    let read = |t: Topic| -> Vec<Event> {
        reader
            .read(t.name(), StartAt::Beginning, Some(&run))
            .unwrap()
            .into_iter()
            .map(|r| r.event.unwrap())
            .collect()
    };
    let calls = read(Topic::Calls);
    let rollouts = read(Topic::Rollouts);
    let mut ids = HashSet::new();
    for e in calls.iter().chain(&rollouts) {
        assert!(
            ids.insert(e.event_id().to_string()),
            "{} twice in the log",
            e.event_id()
        );
    }
    let mut ends = BTreeMap::<(String, i64), (usize, usize)>::new();
    for e in &calls {
        match e {
            Event::CallStarted(c) => {
                ends.entry((c.session_id.clone(), c.call_index))
                    .or_default()
                    .0 += 1
            }
            Event::CallFinished(c) => {
                ends.entry((c.session_id.clone(), c.call_index))
                    .or_default()
                    .1 += 1
            }
            _ => {}
        }
    }
    assert!(
        ends.values().all(|n| *n == (1, 1)),
        "a call without exactly one start and end: {:?}",
        ends.iter()
            .filter(|(_, n)| **n != (1, 1))
            .collect::<Vec<_>>()
    );
    let mut finished = 0;
    for e in &rollouts {
        if let Event::RolloutFinished(f) = e {
            let recorded = ends.keys().filter(|(s, _)| *s == f.session_id).count() as i64;
            assert_eq!(f.model_calls, recorded, "{}", f.rollout_id);
            assert!(
                finished_rollouts.contains(&f.rollout_id),
                "{}",
                f.rollout_id
            );
            finished += 1;
        }
    }
    assert_eq!(finished, rollouts_to_run, "every rollout finished once");

    // The trainer: every group trained once, in contiguous versions, each
    // published once; a moment more, and nothing is published twice.
    let groups = read(Topic::Batches).len();
    assert_eq!(groups, rollouts_to_run / 2);
    let published = || -> Vec<forgelog_schemas::PolicyPublished> {
        read(Topic::Policy)
            .into_iter()
            .filter_map(|e| match e {
                Event::PolicyPublished(p) => Some(p),
                _ => None,
            })
            .collect()
    };
    let accounted = |p: &[forgelog_schemas::PolicyPublished]| -> usize {
        let trained: f64 = p.iter().map(|p| p.metrics["groups"]).sum();
        let dropped = p.last().map_or(0.0, |p| p.metrics["dropped_stale"]);
        (trained + dropped) as usize
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while accounted(&published()) < groups / GROUPS_PER_STEP * GROUPS_PER_STEP {
        assert!(
            Instant::now() < deadline,
            "the trainer accounted for {} of {groups} groups",
            accounted(&published())
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    std::thread::sleep(Duration::from_secs(2));
    drop(procs);
    let published = published();
    let versions: Vec<i64> = published.iter().map(|p| p.version).collect();
    assert_eq!(
        versions,
        (1..=published.len() as i64).collect::<Vec<_>>(),
        "versions contiguous, each published once"
    );
    assert_eq!(accounted(&published), groups, "every group trained once");
    let served: std::collections::BTreeSet<i64> = calls
        .iter()
        .filter_map(|e| match e {
            Event::CallFinished(c) => c.policy_version,
            _ => None,
        })
        .filter(|&v| v != forgelog_schemas::UNKNOWN_POLICY_VERSION as i64)
        .collect();
    assert!(
        served.iter().all(|v| versions.contains(v) || *v == 0),
        "served versions {served:?}, published {versions:?}"
    );
    assert!(
        served.iter().any(|&v| v >= 1),
        "no call was served by a trained version: {served:?} (published {versions:?})"
    );
    println!(
        "chaos: {kills:?}; {} calls recorded once each, {finished} rollouts; rebuild: {}; \
         versions 1..={} published once each, {groups} groups trained once; served versions {served:?}",
        ends.len(),
        verdict.trim(),
        versions.len()
    );
    for name in ["broker", "engine", "proxy", "consumers", "trainer"] {
        assert!(
            kills.contains_key(name),
            "{name} was never killed: {kills:?}"
        );
    }
}
