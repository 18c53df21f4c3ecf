//! The long-running components on their own: the trainer waiting for a
//! broker, the consumers' metrics.

use super::*;

/// The trainer, a long-running process like the engine and the consumers,
/// waits for a broker that is away when it starts and goes on once it is back.
/// Restarted while the broker itself was restarting, it used to exit 2, and
/// the loop never trained again (the chaos test's "version 3 was never
/// published" in CI).
#[test]
fn the_trainer_waits_for_a_broker_that_is_away_at_start() {
    use forgelog_stream::testing::PrivateBroker;
    use forgelog_stream::ReplayReader;
    let mut broker = PrivateBroker::start().unwrap();
    broker.kill();
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    forgelog_model::testing::write_tiny_llama(&model, 3).unwrap();
    let log = dir.path().join("trainer.log");
    let mut trainer = Command::new(env!("CARGO_BIN_EXE_forgelog"))
        .arg("train")
        .arg("--model")
        .arg(&model)
        .arg("--checkpoints")
        .arg(format!(
            "file://{}",
            dir.path().join("checkpoints").display()
        ))
        .arg("--spool")
        .arg(dir.path().join("spool"))
        .args(["--run", "waits", "--brokers", &broker.config().brokers])
        .env("RUST_LOG", "warn")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let said = || std::fs::read_to_string(&log).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !said().contains("waiting for the broker") {
        assert!(
            trainer.try_wait().unwrap().is_none(),
            "it exited: {}",
            said()
        );
        assert!(std::time::Instant::now() < deadline, "{}", said());
        std::thread::sleep(Duration::from_millis(100));
    }
    broker.restart().unwrap();
    // Back, the broker gets the log's topics from the trainer (a fresh
    // broker has none), and the trainer goes on reading them.
    let reader = ReplayReader::new(&broker.config()).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while reader
        .partitions("forgelog.batches")
        .map_or(true, |p| p.is_empty())
    {
        assert!(
            trainer.try_wait().unwrap().is_none(),
            "it exited: {}",
            said()
        );
        assert!(
            std::time::Instant::now() < deadline,
            "no topics: {}",
            said()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        trainer.try_wait().unwrap().is_none(),
        "it exited: {}",
        said()
    );
    trainer.kill().unwrap();
    trainer.wait().unwrap();
}

/// `forgelog consume --metrics-listen` serves Prometheus text while it runs.
#[test]
fn the_consumers_serve_metrics_when_asked() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = rt.block_on(shared_broker());
    let state = tempfile::tempdir().unwrap();
    let addr = free_local_addr();
    let mut child = forgelog()
        .args(["consume", "all", "--metrics-listen", &addr.to_string()])
        .args(["--brokers", &config.brokers, "--state"])
        .arg(state.path())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let text = loop {
        assert!(
            std::time::Instant::now() < deadline,
            "no /metrics on {addr}"
        );
        let got = rt.block_on(async {
            reqwest::get(format!("http://{addr}/metrics"))
                .await
                .ok()?
                .text()
                .await
                .ok()
        });
        match got {
            Some(text) => break text,
            None => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    assert!(text.contains("# HELP forgelog_build_info "), "{text}");
    assert!(text.contains("forgelog_build_info{version="), "{text}");
    child.kill().unwrap();
    child.wait().unwrap();
}

/// A server's port in use is said with where, whichever command serves:
/// found by probing `forgelog engine --listen` on a taken port, which said
/// only "Address already in use" (so did `consume --metrics-listen`).
#[test]
fn a_port_in_use_is_named_by_every_server() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dead = free_local_addr().to_string();
    // The trainer binds its metrics once it reaches the log.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let brokers = rt.block_on(shared_broker()).brokers;
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let (state, spool) = (path("state"), path("spool"));
    let cases: [&[&str]; 4] = [
        &["engine", "--listen", &addr],
        &["view", "--brokers", &dead, "--listen", &addr],
        &[
            "consume",
            "all",
            "--state",
            &state,
            "--brokers",
            &dead,
            "--metrics-listen",
            &addr,
        ],
        &[
            "train",
            "--run",
            "r",
            "--brokers",
            &brokers,
            "--spool",
            &spool,
            "--metrics-listen",
            &addr,
        ],
    ];
    for args in cases {
        let out = forgelog().args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(&format!("cannot listen on {addr}: Address already in use")),
            "{args:?}: {err}"
        );
    }
}

/// The broker `forgelog broker` (or `up`) starts goes with it: found by
/// probing `kill -9` of `forgelog up --demo`, whose tansu kept running,
/// holding the port and the data, so the next `up` refused to start ("already
/// in use") until the operator found the orphan and killed it. Its data is
/// kept: the next broker on it serves what was written before.
#[test]
fn a_killed_forgelogs_broker_stops_with_it_and_the_next_one_starts_on_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_local_addr();
    let start = || {
        let child = forgelog()
            .args(["broker", "--listen", &addr.to_string(), "--data"])
            .arg(dir.path())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(addr).is_err() {
            assert!(std::time::Instant::now() < deadline, "no broker on {addr}");
            std::thread::sleep(Duration::from_millis(100));
        }
        child
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = forgelog_stream::StreamConfig::new(addr.to_string());
    let mut first = start();
    rt.block_on(forgelog_stream::admin::create_topics(
        &config,
        &Default::default(),
    ))
    .unwrap();
    first.kill().unwrap();
    first.wait().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(addr).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "the broker outlived its forgelog on {addr}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut second = start();
    let topics = forgelog_stream::admin::list_topics(&config).unwrap();
    assert!(
        topics.iter().any(|t| t.name == "forgelog.calls"),
        "the topics made before: {:?}",
        topics.iter().map(|t| &t.name).collect::<Vec<_>>()
    );
    sigterm(&second);
    assert!(second.wait().unwrap().success());
}
