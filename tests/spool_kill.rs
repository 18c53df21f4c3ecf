//! `kill -9` at any point: the process draining a spool, again and again
//! (every event still reaches the log exactly once and in order); and the
//! proxy, the consumers and the broker while rollouts run through them.

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

/// A process of the chaos test, killed with SIGKILL when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const ADMIN: &str = "chaos-admin";

/// Chaos: rollouts driven through `forgelog proxy` (the driver acting as
/// harness and orchestrator both, retrying what a crash interrupted) while the
/// proxy, the consumers and the broker are killed with SIGKILL at random
/// points and started again. Afterwards every call started has exactly one
/// end, no event is in the log twice, every finished rollout's call count
/// matches its calls, and `replay rebuild` says the consumers' outputs are
/// what the log implies.
#[test]
fn rollouts_survive_kill_9_of_proxy_consumers_and_broker_at_random_points() {
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
    let (upstream, _) = rt
        .block_on(forgelog_producers::fake_upstream::spawn(
            "127.0.0.1:0".parse().unwrap(),
            // Slow enough that a kill lands mid-call now and then.
            forgelog_producers::fake_upstream::FakeOptions {
                delay: Duration::from_millis(40),
                ..Default::default()
            },
        ))
        .unwrap();
    let run = unique_run_id("chaos");
    let listen = free_local_addr();
    let (spool, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let bin = env!("CARGO_BIN_EXE_forgelog");
    let start_proxy = || {
        let child = Command::new(bin)
            .args(["proxy", "--upstream", &format!("http://{upstream}")])
            .args([
                "--listen",
                &listen.to_string(),
                "--brokers",
                &config.brokers,
            ])
            .args([
                "--run-id",
                &run,
                "--admin-token",
                ADMIN,
                "--upstream-timeout-secs",
                "5",
            ])
            .arg("--spool")
            .arg(spool.path())
            .env("RUST_LOG", "error")
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(listen).is_err() {
            assert!(Instant::now() < deadline, "the proxy did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Proc(child)
    };
    let start_consumers = || {
        Proc(
            Command::new(bin)
                .args(["consume", "all", "--checkpoint-every", "10"])
                .args(["--brokers", &config.brokers, "--state"])
                .arg(state.path())
                .env("RUST_LOG", "error")
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let mut proxy = start_proxy();
    let mut consumers = start_consumers();
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
    let rollouts_to_run = 12 * forgelog_stream::testing::soak_scale();
    const CALLS: usize = 4;
    for r in 0..rollouts_to_run {
        let mut attempt = 0;
        // Chaos before (and, for the proxy, during) each step of the driver.
        let mut chaos = |proxy: &mut Proc, consumers: &mut Proc, broker: &mut PrivateBroker| {
            match next(9) {
                0 => {
                    // Mid-request, as often as not: a call in flight dies with it.
                    std::thread::sleep(Duration::from_millis(next(60)));
                    let _ = proxy.0.kill();
                    let _ = proxy.0.wait();
                    *kills.entry("proxy").or_default() += 1;
                    *proxy = start_proxy();
                }
                1 => {
                    let _ = consumers.0.kill();
                    let _ = consumers.0.wait();
                    *kills.entry("consumers").or_default() += 1;
                    *consumers = start_consumers();
                }
                2 => {
                    broker.kill();
                    std::thread::sleep(Duration::from_millis(500 + next(1000)));
                    broker.restart().unwrap();
                    *kills.entry("broker").or_default() += 1;
                }
                _ => {}
            }
        };
        let (session, key, rollout) = loop {
            chaos(&mut proxy, &mut consumers, &mut broker);
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
                chaos(&mut proxy, &mut consumers, &mut broker);
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
            chaos(&mut proxy, &mut consumers, &mut broker);
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
    }
    // A clean stop: the proxy flushes its spool, then the consumers catch up.
    unsafe { libc::kill(proxy.0.id() as i32, libc::SIGTERM) };
    assert!(proxy.0.wait().unwrap().success());
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
    drop(consumers);

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
    println!(
        "chaos: {kills:?}; {} calls recorded once each, {finished} rollouts; rebuild: {}",
        ends.len(),
        verdict.trim()
    );
    assert!(
        kills.values().sum::<usize>() >= 5,
        "too little chaos: {kills:?}"
    );
}
