//! `forgelog replay rebuild`, `replay show` and `replay serve` over recorded runs.

use forgelog_api::SessionClient;
use forgelog_consumers::{rebuild::rebuild, RewardConfig};
use forgelog_schemas::{testing::recorded_run, Event, Topic};
use forgelog_stream::testing::{self, PrivateBroker};
use forgelog_stream::StreamConfig;
use std::collections::BTreeMap;
use std::process::{Command, Output};

const RUN: &str = "replay-run";

fn forgelog(args: &[&str], config: &StreamConfig) -> Output {
    Command::new(env!("CARGO_BIN_EXE_forgelog"))
        .args(args)
        .args(["--brokers", &config.brokers])
        .output()
        .unwrap()
}

fn produce(config: &StreamConfig, events: &[Event]) {
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(testing::produce(config, events));
}

/// `forgelog replay serve ARGS --listen ADDR [--admin-token TOKEN]` (without
/// one it makes one), started; the lines it says on stderr, as they come.
fn replay_serve(
    args: &[&str],
    addr: std::net::SocketAddr,
    token: Option<&str>,
) -> (std::process::Child, impl Iterator<Item = String>) {
    let mut serve = Command::new(env!("CARGO_BIN_EXE_forgelog"));
    serve
        .args(["replay", "serve"])
        .args(args)
        .args(["--listen", &addr.to_string()]);
    if let Some(token) = token {
        serve.args(["--admin-token", token]);
    }
    let mut serve = serve.stderr(std::process::Stdio::piped()).spawn().unwrap();
    let stderr = std::io::BufReader::new(serve.stderr.take().unwrap());
    let lines = std::io::BufRead::lines(stderr).map_while(Result::ok);
    (serve, lines)
}

/// A private broker holding run RUN (12 rollouts in 3 groups, one rollout
/// retrying a turn) consumed: its trees and groups are in the log.
fn consumed_run() -> (PrivateBroker, StreamConfig) {
    let broker = PrivateBroker::start().unwrap();
    let config = broker.config();
    produce(&config, &recorded_run(RUN, 3, 4, 3, 16));
    let state = tempfile::tempdir().unwrap();
    let consumed = Command::new(env!("CARGO_BIN_EXE_forgelog"))
        .args(["consume", "all", "--exit-when-idle"])
        .args(["--brokers", &config.brokers, "--state"])
        .arg(state.path())
        .status()
        .unwrap();
    assert!(consumed.success());
    (broker, config)
}

/// `replay rebuild` of the consumed run said it rebuilds identically.
fn says_identical(out: Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim(),
        format!("identical: 12 trajectories, 3 batches of run {RUN}")
    );
}

#[test]
fn rebuild_of_a_consumed_run_is_identical_and_show_draws_its_trees() {
    let (_broker, config) = consumed_run();

    let out = forgelog(&["replay", "rebuild", "--run", RUN], &config);
    says_identical(out);

    let out = forgelog(
        &[
            "replay",
            "show",
            "--run",
            RUN,
            "--rollout",
            &format!("{RUN}-g0-r0"),
        ],
        &config,
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Rollout 0 retried its second turn: one discarded path, one live one.
    assert!(text.contains("(discarded retry)"), "{text}");
    assert!(text.contains("reward"), "{text}");
    assert_eq!(text.matches("rollout ").count(), 1, "{text}");
}

#[test]
fn rebuild_names_the_field_of_an_edited_trajectory() {
    let broker = PrivateBroker::start().unwrap();
    let config = broker.config();
    let inputs = recorded_run(RUN, 2, 2, 2, 12);
    let mut by_topic: BTreeMap<Topic, Vec<Event>> = BTreeMap::new();
    for e in &inputs {
        by_topic.entry(e.topic()).or_default().push(e.clone());
    }
    let rebuilt = rebuild(&by_topic, RewardConfig::default());
    let mut trajectories = rebuilt.trajectories.clone();
    let Event::TrajectoryBuilt(t) = &mut trajectories[1] else {
        panic!()
    };
    t.sequences[0].token_ids[3] ^= 1; // one byte of one recorded trajectory
    let edited_id = t.event_id.clone();
    let outputs: Vec<Event> = trajectories.into_iter().chain(rebuilt.batches).collect();
    produce(&config, &[inputs, outputs].concat());

    let out = forgelog(&["replay", "rebuild", "--run", RUN], &config);
    let err = String::from_utf8_lossy(&out.stderr);
    // A difference exits 1, like diff (trouble exits 2).
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("differs: TrajectoryBuilt") && err.contains(&edited_id),
        "{err}"
    );
    assert!(
        err.contains("field sequences[0].token_ids[3]") && err.contains("offset"),
        "{err}"
    );
}

/// `replay serve` from the command line, over the SmolLM2 fixture: each
/// recorded request, sent again byte for byte, gets the recorded response
/// body byte for byte (streamed calls: a stream).
#[test]
fn serve_answers_recorded_requests_with_the_recorded_bodies() {
    use forgelog_replay_tests::{decode, fixture_dir, RUN as FIXTURE_RUN};
    let broker = PrivateBroker::start().unwrap();
    let config = broker.config();
    let events = decode(&std::fs::read(fixture_dir().join("events.bin")).unwrap()).unwrap();
    produce(&config, &events);
    let addr = testing::free_local_addr();
    let (mut serve, mut said) = replay_serve(
        &["--run", FIXTURE_RUN, "--brokers", &config.brokers],
        addr,
        None,
    );
    // No --admin-token: it made one and printed it once listening (the
    // session API used to be open to anyone who reached the port).
    let token = said
        .by_ref()
        .find_map(|l| l.trim().strip_prefix("fl-").map(|t| format!("fl-{t}")))
        .expect("replay serve printed its admin token");
    std::thread::spawn(move || said.for_each(drop));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let http = reqwest::Client::new();
    let url = format!("http://{addr}");
    let refused = rt
        .block_on(SessionClient::new(&url, None).replay_of("any"))
        .unwrap_err();
    assert_eq!(refused.status(), Some(401), "{refused}");
    let sessions = SessionClient::new(&url, Some(token));
    let mut answered = 0;
    for e in &events {
        let Event::RolloutStarted(r) = e else {
            continue;
        };
        let session = rt.block_on(sessions.replay_of(&r.rollout_id)).unwrap();
        assert_eq!(session.session_id, r.session_id);
        let key = session.api_key.as_str();
        for e in &events {
            let Event::CallStarted(c) = e else { continue };
            if c.session_id != r.session_id {
                continue;
            }
            let recorded = events
                .iter()
                .find_map(|e| match e {
                    Event::CallFinished(f)
                        if f.session_id == c.session_id && f.call_index == c.call_index =>
                    {
                        Some(f)
                    }
                    _ => None,
                })
                .unwrap();
            let (content_type, body) = rt.block_on(async {
                let resp = http
                    .post(format!("{url}{}", c.path))
                    .bearer_auth(key)
                    .header("x-api-key", key)
                    .body(c.raw_request.clone())
                    .send()
                    .await
                    .unwrap();
                assert_eq!(resp.status(), 200, "call {}", c.call_index);
                let ct = resp.headers()["content-type"].to_str().unwrap().to_string();
                (ct, resp.bytes().await.unwrap())
            });
            if content_type == "application/json" {
                assert!(
                    body == recorded.response_body,
                    "call {} of {}: {}",
                    c.call_index,
                    r.rollout_id,
                    String::from_utf8_lossy(&body)
                );
            } else {
                assert_eq!(content_type, "text/event-stream");
                assert!(!body.is_empty());
            }
            answered += 1;
        }
    }
    assert_eq!(answered, 12, "every recorded call answered");
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(serve.id() as i32, libc::SIGTERM) };
    assert!(serve.wait().unwrap().success());
}

/// `replay serve --lenient`: a re-run whose requests differ is answered from
/// the recording call by call, and the report says how each call differed:
/// only in what the user marked volatile, or for real.
#[test]
fn a_lenient_replay_answers_changed_calls_and_reports_them() {
    use forgelog_replay_tests::{decode, fixture_dir, RUN as FIXTURE_RUN};
    let broker = PrivateBroker::start().unwrap();
    let config = broker.config();
    let events = decode(&std::fs::read(fixture_dir().join("events.bin")).unwrap()).unwrap();
    produce(&config, &events);
    let addr = testing::free_local_addr();
    let report = tempfile::NamedTempFile::new().unwrap();
    let mut serve = Command::new(env!("CARGO_BIN_EXE_forgelog"))
        .args([
            "replay",
            "serve",
            "--run",
            FIXTURE_RUN,
            "--brokers",
            &config.brokers,
        ])
        .args(["--lenient", "--volatile", "weather|climate", "--report"])
        .arg(report.path())
        .args(["--listen", &addr.to_string(), "--admin-token", "fl-test"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("http://{addr}");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sessions = SessionClient::new(&url, Some("fl-test".into()));
    // The OpenAI Chat rollout's first two calls, each changed.
    let openai = events
        .iter()
        .find_map(|e| match e {
            Event::CallStarted(c) if c.path == "/v1/chat/completions" => Some(c.session_id.clone()),
            _ => None,
        })
        .unwrap();
    let rollout = events
        .iter()
        .find_map(|e| match e {
            Event::RolloutStarted(r) if r.session_id == openai => Some(r.rollout_id.clone()),
            _ => None,
        })
        .unwrap();
    let session = rt.block_on(async {
        for _ in 0..100 {
            if let Ok(s) = sessions.replay_of(&rollout).await {
                return s;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!("replay serve never answered");
    });
    let calls: Vec<&forgelog_schemas::CallStarted> = events
        .iter()
        .filter_map(|e| match e {
            Event::CallStarted(c) if c.session_id == openai => Some(c),
            _ => None,
        })
        .collect();
    let http = reqwest::Client::new();
    for (i, change) in [("weather", "climate"), ("Rome", "Oslo")]
        .iter()
        .enumerate()
    {
        let c = calls.iter().find(|c| c.call_index == i as i64).unwrap();
        let sent = String::from_utf8(c.raw_request.clone())
            .unwrap()
            .replace(change.0, change.1);
        assert_ne!(sent.as_bytes(), &c.raw_request[..], "call {i} changed");
        let status = rt.block_on(async {
            http.post(format!("{url}{}", c.path))
                .bearer_auth(&session.api_key)
                .header("content-type", "application/json")
                .body(sent)
                .send()
                .await
                .unwrap()
                .status()
        });
        assert_eq!(status, 200, "call {i} answered from the recording");
    }
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(serve.id() as i32, libc::SIGTERM) };
    assert!(serve.wait().unwrap().success());
    let entries: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(report.path()).unwrap()).unwrap();
    assert_eq!(entries.len(), 2, "{entries:?}");
    assert_eq!(
        (&entries[0]["call_index"], &entries[0]["explained"]),
        (&0.into(), &true.into())
    );
    assert_eq!(
        (&entries[1]["call_index"], &entries[1]["explained"]),
        (&1.into(), &false.into())
    );
    assert!(
        entries[1]["detail"].as_str().unwrap().contains("Oslo"),
        "{entries:?}"
    );
}

/// Every file under `dir`, by path under it, with its bytes.
/// The whole answer (head and body) to a GET of `path` at `addr`.
fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

fn files_of(dir: &std::path::Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                todo.push(path);
            } else {
                let name = path.strip_prefix(dir).unwrap().display().to_string();
                out.insert(name, std::fs::read(&path).unwrap());
            }
        }
    }
    out
}

/// A run bundled from one broker is the run without it: with the broker
/// gone, `replay rebuild --bundle` says identical, `export sft --bundle`
/// writes what the export from the broker wrote, byte for byte, `report
/// --bundle` reads it, `view --bundle` serves it, and fastavro reads the file as any Avro file (each
/// record's SHA-256 recomputed there). A bundle cut short or with one byte
/// changed is refused, naming the byte and why.
#[test]
fn a_bundled_run_replays_and_exports_without_the_broker() {
    let (mut broker, config) = consumed_run();
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("run.bundle.avro");
    let bundle_arg = bundle.display().to_string();
    let from_log = dir.path().join("sft-from-log");
    let out = forgelog(
        &["export", "bundle", "--run", RUN, "--to", &bundle_arg],
        &config,
    );
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{said}");
    assert!(said.contains("bundled run replay-run: "), "{said}");
    let out = forgelog(
        &[
            "export",
            "sft",
            "--run",
            RUN,
            "--to",
            &from_log.display().to_string(),
        ],
        &config,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    broker.kill();

    // No broker from here on: a command that needed one would fail.
    let offline = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_forgelog"))
            .args(args)
            .args(["--bundle", &bundle_arg, "--brokers", &config.brokers])
            .output()
            .unwrap()
    };
    let out = offline(&["replay", "rebuild", "--run", RUN]);
    says_identical(out);
    let from_bundle = dir.path().join("sft-from-bundle");
    let out = offline(&[
        "export",
        "sft",
        "--run",
        RUN,
        "--to",
        &from_bundle.display().to_string(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (ours, theirs) = (files_of(&from_bundle), files_of(&from_log));
    assert!(ours.len() >= 3, "{:?}", ours.keys());
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        theirs.keys().collect::<Vec<_>>()
    );
    for (name, bytes) in &ours {
        assert!(
            bytes == &theirs[name],
            "{name} differs from the broker's export"
        );
    }
    let out = offline(&["report", "--run", RUN]);
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && report.contains(&format!("run {RUN}")),
        "{report}"
    );
    // The viewer serves the bundle's run (the one it holds, unnamed).
    let listen = testing::free_local_addr().to_string();
    let mut view = Command::new(env!("CARGO_BIN_EXE_forgelog"))
        .args([
            "view",
            "--bundle",
            &bundle_arg,
            "--brokers",
            &config.brokers,
        ])
        .args(["--listen", &listen, "--tokenizer", "none"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = std::io::BufReader::new(view.stderr.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut said, &mut line).unwrap();
    let page = http_get(&listen, &format!("/runs/{RUN}"));
    view.kill().unwrap();
    let _ = view.wait();
    assert!(
        line.contains("of 1 runs read; serving") && line.contains(&format!("/runs/{RUN}")),
        "{line}"
    );
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    for r in 0..4 {
        let rollout = format!("{RUN}-g2-r{r}");
        assert!(page.contains(&rollout), "{rollout} missing: {page}");
    }

    // Another run's name is not this bundle's.
    let out = offline(&["report", "--run", "another-run"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("holds run replay-run, not another-run"),
        "{err}"
    );

    // replay serve answers from it: each recorded session opens for replay.
    let addr = testing::free_local_addr();
    let (mut serve, mut said) = replay_serve(
        &[
            "--run",
            RUN,
            "--bundle",
            &bundle_arg,
            "--brokers",
            &config.brokers,
        ],
        addr,
        Some("fl-bundle"),
    );
    let serving = said
        .find(|l| l.starts_with("forgelog replay serve on"))
        .expect("replay serve --bundle started");
    assert!(serving.contains("run replay-run (12 sessions"), "{serving}");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sessions = SessionClient::new(format!("http://{addr}"), Some("fl-bundle".into()));
    let session = rt
        .block_on(sessions.replay_of(&format!("{RUN}-g0-r0")))
        .unwrap();
    assert!(!session.session_id.is_empty());
    serve.kill().unwrap();
    let _ = serve.wait();

    // fastavro reads it: the records, their topics, and each digest.
    let script = r#"
import fastavro, hashlib, json, struct, sys
with open(sys.argv[1], "rb") as f:
    reader = fastavro.reader(f)
    manifest = json.loads(reader.metadata["forgelog.manifest"])
    records = list(reader)
ok = all(
    hashlib.sha256(r["topic"].encode() + b"\0" + struct.pack(">iqQ", r["partition"], r["offset"], len(r["key"]))
                   + r["key"] + r["value"]).digest() == r["sha256"]
    for r in records)
topics = {}
for r in records:
    topics[r["topic"]] = topics.get(r["topic"], 0) + 1
print(json.dumps({"run": manifest["run"], "records": len(records), "manifest_records": manifest["records"],
                  "topics": topics, "digests_match": ok}))
"#;
    let py = Command::new(testing::venv_python())
        .args(["-c", script, &bundle_arg])
        .output()
        .unwrap();
    assert!(
        py.status.success(),
        "{}",
        String::from_utf8_lossy(&py.stderr)
    );
    let seen: serde_json::Value = serde_json::from_slice(&py.stdout).unwrap();
    assert_eq!(seen["run"], RUN);
    assert_eq!(seen["digests_match"], true, "{seen}");
    assert_eq!(seen["records"], seen["manifest_records"]);
    assert_eq!(seen["topics"]["forgelog.trajectories"], 12, "{seen}");
    assert_eq!(seen["topics"]["forgelog.batches"], 3, "{seen}");

    // Cut short, or one byte of a record changed: refused, with where and why.
    let bytes = std::fs::read(&bundle).unwrap();
    let cut = dir.path().join("cut.avro");
    std::fs::write(&cut, &bytes[..bytes.len() * 2 / 3]).unwrap();
    let altered = dir.path().join("altered.avro");
    let mut changed = bytes.clone();
    let at = bytes.len() / 2;
    changed[at] ^= 0x20;
    std::fs::write(&altered, &changed).unwrap();
    for (file, why) in [(&cut, "cut short"), (&altered, "altered")] {
        let out = Command::new(env!("CARGO_BIN_EXE_forgelog"))
            .args(["replay", "rebuild", "--run", RUN, "--bundle"])
            .arg(file)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("refused at byte "), "{err}");
        assert!(err.contains(why) || err.contains("record "), "{why}: {err}");
    }
}
