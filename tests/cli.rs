//! The `forgelog` binary against the real broker.

use forgelog_schemas::testing::call_finished;
use forgelog_schemas::Event;
use forgelog_stream::testing::{free_local_addr, shared_broker, unique_run_id};
use forgelog_stream::{EventProducer, SpoolOptions};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

fn forgelog() -> Command {
    Command::new(env!("CARGO_BIN_EXE_forgelog"))
}

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

/// `forgelog up` end to end: the real engine (SmolLM2) behind the proxy; one
/// OpenAI-dialect call lands in the log with the tokens the engine sampled.
#[test]
fn up_serves_a_recorded_call_through_engine_and_proxy() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = rt.block_on(shared_broker());
    let home = tempfile::tempdir().unwrap();
    let run = unique_run_id("up");
    // Read only what is written from now on: the shared topic may be large.
    let reader = forgelog_stream::ReplayReader::new(&config).unwrap();
    let starts: Vec<(i32, i64)> = reader
        .partitions("forgelog.calls")
        .unwrap()
        .into_iter()
        .map(|p| (p, reader.end("forgelog.calls", p).unwrap()))
        .collect();
    let (engine, proxy) = (free_local_addr(), free_local_addr());
    let mut child = forgelog()
        .args([
            "up",
            "--brokers",
            &config.brokers,
            "--run",
            &run,
            "--engine-listen",
            &engine.to_string(),
            "--proxy-listen",
            &proxy.to_string(),
            "--home",
        ])
        .arg(home.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut printed = String::new();
    while !printed.contains("(Ctrl-C to stop)") {
        let mut line = String::new();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "up exited early: {printed}"
        );
        printed.push_str(&line);
    }
    let key = printed
        .lines()
        .find(|l| l.contains("OPENAI_API_KEY="))
        .and_then(|l| l.split("OPENAI_API_KEY=").nth(1))
        .unwrap()
        .trim()
        .to_string();
    assert_eq!(
        printed.matches(&format!("http://{proxy}")).count(),
        4,
        "{printed}"
    );

    let answer: serde_json::Value = rt.block_on(async {
        reqwest::Client::new()
            .post(format!("http://{proxy}/v1/chat/completions"))
            .bearer_auth(&key)
            .json(&serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 8, "temperature": 0}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    });
    let text = answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(text.contains("Paris"), "{answer}");
    sigterm(&child);
    assert!(child.wait().unwrap().success());

    let mut finished = Vec::new();
    for (partition, from) in starts {
        let end = reader.end("forgelog.calls", partition).unwrap();
        let _ = reader.for_each_in("forgelog.calls", partition, from, end, |r| {
            if let Ok(Event::CallFinished(c)) = r.event {
                if c.run_id == run {
                    finished.push(c);
                }
            }
            std::ops::ControlFlow::Continue(())
        });
    }
    assert_eq!(finished.len(), 1);
    let c = &finished[0];
    assert!(c.trainable, "{:?}", c.untrainable_reason);
    assert!(!c.prompt_token_ids.is_empty() && !c.completion_token_ids.is_empty());
    assert_eq!(c.completion_token_ids.len(), c.completion_logprobs.len());
    assert!(c.completion_logprobs.iter().all(|&l| l <= 0.0));
    assert_eq!(c.policy_version, Some(0));
    assert!(c.chat_response.contains("Paris"), "{}", c.chat_response);
}

fn sigterm(child: &std::process::Child) {
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
}

/// An engine that cannot start (here: no such model; on a CPU build, `--device
/// cuda` the same way) used to leave `up` waiting two minutes for its health
/// check. It says why and exits at once.
/// `forgelog up ARGS` on free ports in a home of its own, which must fail:
/// what it said.
fn up_fails(args: &[&str]) -> String {
    let home = tempfile::tempdir().unwrap();
    let out = forgelog()
        .arg("up")
        .args(args)
        .args(["--engine-listen", &free_local_addr().to_string()])
        .args(["--proxy-listen", &free_local_addr().to_string(), "--home"])
        .arg(home.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{err}");
    err
}

#[test]
fn up_with_an_engine_that_cannot_start_says_why_at_once() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = rt.block_on(shared_broker());
    let started = std::time::Instant::now();
    let err = up_fails(&[
        "--brokers",
        &config.brokers,
        "--model",
        "/nowhere/model.gguf",
    ]);
    assert!(
        err.contains("/nowhere/model.gguf") && err.contains("did not start"),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "took {:?}",
        started.elapsed()
    );
}

/// An upstream that does not say which policy it serves (vLLM) would never
/// load the learner's versions: `up --train` refuses it, saying why.
#[test]
fn up_train_refuses_an_upstream_that_does_not_load_published_versions() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = rt.block_on(shared_broker());
    let (upstream, _) = rt
        .block_on(forgelog_producers::fake_upstream::spawn(
            "127.0.0.1:0".parse().unwrap(),
            Default::default(),
        ))
        .unwrap();
    let upstream = format!("http://{upstream}");
    let err = up_fails(&[
        "--train",
        "--brokers",
        &config.brokers,
        "--upstream",
        &upstream,
    ]);
    assert!(
        err.contains("does not report the policy version")
            && err.contains("forgelog engine --brokers"),
        "{err}"
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
fn export_of_an_unknown_run_is_a_clear_error_with_exit_2() {
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

/// `run --proxy` without the proxy's admin token is refused at once, with
/// what to pass, before the tasks are read or a run directory is taken
/// (found by probing: it was refused only after both).
#[test]
fn run_with_a_proxy_and_no_admin_token_says_what_to_pass() {
    let out = forgelog()
        .args(["run", "/nowhere/tasks", "--proxy", "http://127.0.0.1:9"])
        .env_remove("FORGELOG_ADMIN_TOKEN")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--proxy needs the proxy's --admin-token (or FORGELOG_ADMIN_TOKEN)"),
        "{err}"
    );
    assert!(
        !err.contains("/nowhere/tasks"),
        "the tasks were read first: {err}"
    );
}

/// A blank admin token, by flag or variable, is refused before anything
/// starts: an empty `x-api-key:` header would have matched it.
#[test]
fn a_blank_admin_token_is_refused_at_start() {
    let listen = free_local_addr().to_string();
    // The arguments, and a variable set.
    type Case<'a> = (&'a [&'a str], Option<(&'a str, &'a str)>);
    let cases: [Case; 4] = [
        (
            &[
                "proxy",
                "--upstream",
                "http://127.0.0.1:9",
                "--admin-token",
                "",
            ],
            None,
        ),
        (
            &["proxy", "--upstream", "http://127.0.0.1:9"],
            Some(("FORGELOG_ADMIN_TOKEN", " ")),
        ),
        (&["engine", "--listen", &listen, "--admin-token", " "], None),
        (
            &[
                "run",
                "tasks",
                "--proxy",
                "http://127.0.0.1:9",
                "--admin-token",
                "\t",
            ],
            None,
        ),
    ];
    for (args, env) in cases {
        let mut cmd = forgelog();
        cmd.args(args).env_remove("FORGELOG_ADMIN_TOKEN");
        if let Some((name, value)) = env {
            cmd.env(name, value);
        }
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?} {env:?}: {err}");
        assert!(
            err.contains("an empty admin token would let in any caller"),
            "{args:?} {env:?}: {err}"
        );
    }
}

/// `run --backend kube`'s proxy labels and bundle source are refused at
/// once when they do not parse. A label without `=` was dropped silently:
/// `--kube-proxy-labels app` left the run's NetworkPolicy an empty pod
/// selector, which lets sandboxes reach every pod of the namespace.
#[test]
fn kube_flags_that_do_not_parse_are_refused_before_the_run() {
    let cases: [(&str, &str, &str); 3] = [
        ("--kube-proxy-labels", "app", "\"app\" is not a label"),
        ("--kube-proxy-labels", "app=proxy,", "\"\" is not a label"),
        (
            "--bundles",
            "quay.io/forgelog/bundles:1",
            "image:REF, copy:REF or hostpath:DIR",
        ),
    ];
    for (flag, value, says) in cases {
        let out = forgelog()
            .args(["run", "tasks", "--harness", "solve", "--backend", "kube"])
            .args([flag, value])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(
            err.contains(flag) && err.contains(says),
            "{flag} {value}: {err}"
        );
    }
}

/// `-q` keeps only errors; `-v` adds what a command does.
#[test]
fn verbosity_flags_choose_the_log_level() {
    let dead = free_local_addr().to_string();
    let quiet = forgelog()
        .args(["-q", "report", "--run", "r", "--brokers", &dead])
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&quiet.stderr);
    assert!(!err.contains(" WARN ") && !err.contains(" INFO "), "{err}");
    let clash = forgelog()
        .args(["-q", "-v", "topics", "list"])
        .output()
        .unwrap();
    assert_eq!(clash.status.code(), Some(2));
}

/// `--json` says what the text says, in a form a script reads.
#[test]
fn json_output_says_what_the_text_says() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = rt.block_on(shared_broker());
    let list = |json: bool| {
        let out = forgelog()
            .args(["topics", "list", "--brokers", &config.brokers])
            .args(json.then_some("--json"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let topics: Vec<serde_json::Value> = serde_json::from_str(&list(true)).unwrap();
    let table = list(false);
    assert!(topics.iter().any(|t| t["name"] == "forgelog.calls"));
    for t in &topics {
        let line = table
            .lines()
            .find(|l| l.split_whitespace().next() == t["name"].as_str())
            .unwrap_or_else(|| panic!("{t} not in\n{table}"));
        let partitions: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        assert_eq!(t["partitions"].as_u64(), Some(partitions), "{line}");
    }

    let spool = tempfile::tempdir().unwrap();
    rt.block_on(async {
        let p = EventProducer::start(&config, spool.path(), SpoolOptions::default()).unwrap();
        p.send(&Event::from(call_finished(
            &unique_run_id("json"),
            "s",
            0,
            3,
            2,
        )))
        .unwrap();
        p.close(Duration::from_secs(30)).await.unwrap();
    });
    let out = forgelog()
        .args(["spool", "status", "--json", "--dir"])
        .arg(spool.path())
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&status["pending"], &status["in_use"], &status["parked"]),
        (&0.into(), &false.into(), &serde_json::json!([])),
        "{status}"
    );
    assert!(status["acked_through"].as_u64() >= Some(1), "{status}");
}

/// `forgelog.toml` in the working directory sets option defaults (shown by
/// `--help`); a mistake in it is named; completions print for a shell.
#[test]
fn a_config_file_sets_defaults_and_completions_print() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("forgelog.toml"),
        "[train]\nlearning-rate = 3e-6\n",
    )
    .unwrap();
    let help = forgelog()
        .args(["train", "--help"])
        .current_dir(dir.path())
        .env_remove("FORGELOG_CONFIG")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(text.contains("[default: 0.000003]"), "{text}");

    std::fs::write(
        dir.path().join("forgelog.toml"),
        "[train]\nlearning-rat = 1\n",
    )
    .unwrap();
    let bad = forgelog()
        .args(["train", "--help"])
        .current_dir(dir.path())
        .env_remove("FORGELOG_CONFIG")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(2), "{err}");
    assert!(
        err.contains("forgelog.toml: [train] has no option `learning-rat`"),
        "{err}"
    );

    let missing = forgelog()
        .args(["--config", "/no/such/forgelog.toml", "topics", "list"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(2));

    let bash = forgelog().args(["completions", "bash"]).output().unwrap();
    let script = String::from_utf8_lossy(&bash.stdout);
    assert!(
        bash.status.success() && script.contains("_forgelog()"),
        "{script}"
    );
    assert!(script.contains("--learning-rate"), "completes options too");
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

/// `forgelog run` on a machine where only the first command ran (the broker
/// and the model): before anything starts, one line naming what is missing
/// and the script that installs it, exit 2. Here: no harness bundles (a
/// FORGELOG_HOME of its own), no podman, and a task built FROM a local image
/// that is not there (with the real podman).
#[test]
fn run_without_its_sandbox_tools_names_what_is_missing_and_the_script() {
    let home = tempfile::tempdir().unwrap();
    let tasks = home.path().join("tasks");
    let task = tasks.join("hello");
    std::fs::create_dir_all(task.join("environment")).unwrap();
    std::fs::create_dir_all(task.join("tests")).unwrap();
    std::fs::write(task.join("instruction.md"), "Say hello.\n").unwrap();
    std::fs::write(task.join("task.toml"), "version = \"1.0\"\n").unwrap();
    std::fs::write(task.join("tests/test.sh"), "exit 0\n").unwrap();
    std::fs::write(
        task.join("environment/Dockerfile"),
        "FROM localhost/forgelog-no-such-base:1\n",
    )
    .unwrap();
    let run = |harness: &str, podman: Option<&str>| {
        let mut cmd = forgelog();
        cmd.arg("run")
            .arg(&tasks)
            .args(["--harness", harness, "--brokers", "127.0.0.1:1"])
            .env("FORGELOG_HOME", home.path().join("home"));
        if let Some(p) = podman {
            cmd.env("FORGELOG_PODMAN", p);
        }
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(err.contains("scripts/sandbox-setup.sh"), "{err}");
        err
    };
    let err = run("codex", None);
    assert!(err.contains("harness codex"), "{err}");
    let err = run("solve", Some("/nowhere/podman"));
    assert!(err.contains("podman is not installed"), "{err}");
    let err = run("solve", None);
    assert!(
        err.contains("task hello builds FROM localhost/forgelog-no-such-base:1"),
        "{err}"
    );
}

/// An engine that is down when `run --train --upstream` starts is named by
/// its flag and the route that failed, exit 2 (it was reported as "starting
/// the engine and the proxy (or pass --upstream)", with --upstream passed).
#[test]
fn a_run_whose_upstream_is_down_says_so_by_its_flag() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let stream = rt.block_on(shared_broker());
    let down = format!("http://{}", free_local_addr());
    let tasks = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/tasks");
    for (engine, route) in [("vllm", "/weight_info"), ("forgelog", "/v1/models")] {
        let run = unique_run_id("run-engine-down");
        let out = forgelog()
            .args(["run", tasks, "--harness", "solve", "--task", "hello-file"])
            .args(["--train", "--upstream", &down, "--engine", engine])
            .args(["--run", &run, "--brokers", &stream.brokers])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{engine}: {err}");
        assert!(
            err.contains("the engine at --upstream: ") && err.contains(route),
            "{engine}: {err}"
        );
        assert!(!err.contains("or pass --upstream"), "{engine}: {err}");
        let _ = std::fs::remove_dir_all(forgelog_stream::forgelog_home().join("runs").join(&run));
    }
}
