//! The log's own commands: `tail`, `topics`, `broker`, the Kafka
//! properties file, `export` of a run the log does not hold, and any
//! command without a broker.

use super::*;

#[test]
fn tail_prints_a_runs_events_as_json_lines() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = rt.block_on(shared_broker());
    let run = unique_run_id("tail");
    let spool = tempfile::tempdir().unwrap();
    rt.block_on(async {
        let p = EventProducer::start(&config, spool.path(), SpoolOptions::default()).unwrap();
        for i in 0..30 {
            let mut c = call_finished(&run, "s1", i, 5, 3);
            c.response_body = format!("{{\"i\":{i}}}").into_bytes();
            p.send(&Event::from(c)).unwrap();
        }
        p.close(Duration::from_secs(30)).await.unwrap();
    });
    let out = forgelog()
        .args([
            "tail",
            "forgelog.calls",
            "--from-beginning",
            "--run",
            &run,
            "--brokers",
            &config.brokers,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 30);
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["type"], "CallFinished");
        assert_eq!(l["run_id"], run.as_str());
        assert_eq!(
            l["call_index"], i as i64,
            "one key, one partition: in order"
        );
        let expected = call_finished(&run, "s1", i as i64, 5, 3);
        assert_eq!(
            l["prompt_token_ids"],
            serde_json::json!(expected.prompt_token_ids)
        );
        // Bodies print as the text they are, not arrays of byte numbers.
        assert_eq!(l["response_body"], format!("{{\"i\":{i}}}").as_str());
        assert_eq!(
            l["completion_logprobs"],
            serde_json::json!(expected.completion_logprobs)
        );
    }
    let limited = forgelog()
        .args([
            "tail",
            "forgelog.calls",
            "--from-beginning",
            "--run",
            &run,
            "--limit",
            "4",
            "--envelope",
            "--brokers",
            &config.brokers,
        ])
        .output()
        .unwrap();
    let first: serde_json::Value = serde_json::from_str(
        String::from_utf8_lossy(&limited.stdout)
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        (first["key"].as_str(), first["offset"].is_i64()),
        (Some("rollout-s1"), true),
        "{first}"
    );
    assert_eq!(first["event"]["type"], "CallFinished");
    assert_eq!(
        String::from_utf8(limited.stdout).unwrap().lines().count(),
        4
    );
}

#[test]
fn unknown_topic_is_a_clear_cli_error() {
    let out = forgelog()
        .args(["tail", "calls", "--from-beginning"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown topic \"calls\"") && err.contains("forgelog.calls"),
        "{err}"
    );
}

#[test]
fn broker_command_runs_tansu_and_stops_it_on_sigterm() {
    let data = tempfile::tempdir().unwrap();
    let addr = free_local_addr();
    let mut child = forgelog()
        .args(["broker", "--listen", &addr.to_string(), "--data"])
        .arg(data.path())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    assert!(line.contains("tansu on"), "{line}");
    let list = forgelog()
        .args(["topics", "create", "--brokers", &addr.to_string()])
        .output()
        .unwrap();
    assert!(
        list.status.success(),
        "{}",
        String::from_utf8_lossy(&list.stderr)
    );
    assert!(data.path().join("tansu.db").exists());
    // A second broker on the busy address is refused, saying how to use the first.
    let other = tempfile::tempdir().unwrap();
    let second = forgelog()
        .args(["broker", "--listen", &addr.to_string(), "--data"])
        .arg(other.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "{err}");
    assert!(
        err.contains("already in use") && err.contains(&format!("--brokers {addr}")),
        "{err}"
    );
    sigterm(&child);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(
        std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(300)).is_err(),
        "tansu still listening"
    );
}

#[test]
fn kafka_properties_file_reaches_the_clients_and_a_broken_one_is_refused() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = rt.block_on(shared_broker());
    let dir = tempfile::tempdir().unwrap();
    let topics_with = |properties: &str| {
        let path = dir.path().join("client.properties");
        std::fs::write(&path, properties).unwrap();
        let out = forgelog()
            .args(["topics", "list"])
            .env("FORGELOG_BROKERS", &config.brokers)
            .env(forgelog_stream::PROPERTIES_ENV, &path)
            .output()
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        );
        (out.status.success(), stdout, stderr)
    };
    // Tuning that the broker does not notice: the topics are listed.
    let (ok, stdout, stderr) = topics_with("# tuning\nsocket.keepalive.enable = true\n");
    assert!(ok && stdout.contains("forgelog.calls"), "{stderr}");
    // A property librdkafka does not know fails at the client: the file is applied.
    let (ok, _, stderr) = topics_with("no.such.property=1\n");
    assert!(!ok && stderr.contains("no.such.property"), "{stderr}");
    // A line that is not key=value is refused before anything connects, by line.
    let (ok, _, stderr) = topics_with("socket.keepalive.enable=true\nsasl.mechanism PLAIN\n");
    assert!(
        !ok && stderr.contains("FORGELOG_KAFKA_CONFIG=") && stderr.contains("line 2"),
        "{stderr}"
    );
}

/// An unknown run used to export an empty dataset and exit 0.
#[test]
fn export_or_rebuild_of_an_unknown_run_is_a_clear_error_with_exit_2() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = rt.block_on(forgelog_stream::testing::shared_broker());
    let to = tempfile::tempdir().unwrap();
    let out = forgelog()
        .args([
            "export",
            "sft",
            "--run",
            "no-such-run-anywhere",
            "--brokers",
            &config.brokers,
            "--to",
        ])
        .arg(to.path().join("plain/relative-or-not"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no-such-run-anywhere has no rollouts"),
        "{err}"
    );
    assert!(!to.path().join("plain").exists(), "nothing written");
    // Nor is it an identical rebuild (found by probing: `replay rebuild`
    // said "identical: 0 trajectories, 0 batches" and exited 0).
    let out = forgelog()
        .args(["replay", "rebuild", "--run", "no-such-run-anywhere"])
        .args(["--brokers", &config.brokers])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("run no-such-run-anywhere has no rollouts in the log at"),
        "{err}"
    );
}

/// With no broker, a command says so in one line (not librdkafka's hundreds,
/// one per reconnect attempt) and exits 2: trouble, not a difference.
#[test]
fn a_command_with_no_broker_says_so_once_and_exits_2() {
    let dead = free_local_addr().to_string();
    let listen = free_local_addr().to_string();
    // Each waits out its broker timeout: the four wait together.
    let commands = [
        &["report", "--run", "r"][..],
        &["replay", "show", "--run", "r"][..],
        &["topics", "create"][..],
        &["view", "--listen", &listen][..],
    ];
    let started = std::time::Instant::now();
    let children: Vec<_> = commands
        .iter()
        .map(|args| {
            forgelog()
                .args(*args)
                .args(["--brokers", &dead])
                .env_remove("RUST_LOG")
                .env("RUST_BACKTRACE", "0")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (args, child) in commands.iter().zip(children) {
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(&format!("the broker at {dead} cannot be reached")),
            "{args:?}: {err}"
        );
        assert!(err.lines().count() <= 3, "{args:?} said too much:\n{err}");
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{args:?} took {:?}",
            started.elapsed()
        );
    }
}
