//! Flags every command shares: admin tokens, verbosity, `--json`, the
//! config file and completions.

use super::*;

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

/// A server's URL flag without its scheme (`127.0.0.1:8000`), of another
/// scheme, or with the `/v1` of an OpenAI base URL is refused at start,
/// with the URL meant. Found by probing: `proxy --upstream 127.0.0.1:9`
/// started and would have failed every call ("relative URL without a
/// base"), `run --proxy 127.0.0.1:8100` failed at its first session the
/// same way, `sync --upstream localhost:9` with "builder error".
#[test]
fn a_server_url_that_is_not_http_is_refused_at_start_with_the_url_meant() {
    let cases: [(&[&str], &str); 7] = [
        (
            &["proxy", "--upstream", "127.0.0.1:9"],
            "'127.0.0.1:9' for '--upstream <UPSTREAM>': not a URL: say http://127.0.0.1:9",
        ),
        (
            &["proxy", "--upstream", "http://127.0.0.1:9/v1"],
            "the server's root, not its OpenAI base URL: say http://127.0.0.1:9",
        ),
        (
            &[
                "proxy",
                "--upstream",
                "http://a:1",
                "--replicas",
                "http://a:2,b:3",
            ],
            "'b:3' for '--replicas <REPLICAS>': not a URL: say http://b:3",
        ),
        (
            &["sync", "--upstream", "localhost:9", "--engine", "vllm"],
            "'localhost:9' for '--upstream <UPSTREAM>': not a URL: say http://localhost:9",
        ),
        (
            &["up", "--upstream", "ftp://10.0.0.1:21"],
            "ftp:// is not HTTP: say http://",
        ),
        (
            &[
                "run",
                "tasks",
                "--proxy",
                "127.0.0.1:8100",
                "--admin-token",
                "t",
            ],
            "'127.0.0.1:8100' for '--proxy <PROXY>': not a URL: say http://127.0.0.1:8100",
        ),
        (
            &[
                "run",
                "tasks",
                "--backend",
                "kube",
                "--kube-proxy-url",
                "forgelog-proxy:8100",
            ],
            "not a URL: say http://forgelog-proxy:8100",
        ),
    ];
    for (args, said) in cases {
        let out = forgelog().args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(said), "{args:?}: {err}");
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

/// A value the learner or the proxy cannot work with is refused at start,
/// by flag or config file, whichever command passes it on: found by probing
/// `train`, where `--learning-rate nan` trained, `--tokens-per-step 0`
/// published an empty version every second and `--idle-flush nan`
/// panicked, and `proxy --upstream-timeout-secs 0`, which failed every call.
#[test]
fn a_value_no_component_can_work_with_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("forgelog.toml");
    std::fs::write(&config, "[train]\nidle_flush = -1.0\n").unwrap();
    let config = config.to_str().unwrap();
    let proxy = |flag| ["proxy", "--upstream", "http://127.0.0.1:9", flag, "0"];
    let cases: [(&[&str], &str); 12] = [
        (&proxy("--upstream-timeout-secs"), "0 is not in 1.."),
        (&proxy("--max-upstream-requests"), "must be 1 or more"),
        (&["sync", "--step-timeout", "0"], "0 is not in 1.."),
        (&["engine", "--max-checkpoint-mib", "0"], "0 is not in 1.."),
        (
            &["consume", "all", "--checkpoint-every", "0"],
            "must be 1 or more",
        ),
        (
            &["train", "--learning-rate", "nan"],
            "must be a finite number",
        ),
        (&["train", "--idle-flush", "inf"], "must be a finite number"),
        (&["--config", config, "train"], "must be 0 or more"),
        (
            &["up", "--train", "--tokens-per-step", "0"],
            "must be 1 or more",
        ),
        (&["up", "--train", "--lora-rank", "0"], "must be 1 or more"),
        (
            &["up", "--train", "--learning-rate=-1e-5"],
            "must be above 0",
        ),
        (
            &["run", "tasks", "--train", "--micro-batch-tokens", "0"],
            "must be 1 or more",
        ),
    ];
    for (args, why) in cases {
        let out = forgelog().args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("invalid value") && err.contains(why),
            "{args:?}: {err}"
        );
    }
}
