//! `forgelog run`: what it refuses, and says, before any rollout.

use super::*;

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
    // Sandboxes speak plain HTTP to the proxy's address: an https:// one
    // is refused at once too (found by probing: "failed to lookup address
    // information", after the run's topics and sandboxes were set up).
    let out = forgelog()
        .args(["run", "/nowhere/tasks", "--proxy", "https://127.0.0.1:9"])
        .args(["--admin-token", "t"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("its address in https://127.0.0.1:9: sandboxes speak plain http:// to the proxy, not https://")
            && !err.contains("/nowhere/tasks"),
        "{err}"
    );
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

/// A count of rollouts of 0 is refused at start: found by probing,
/// `--concurrency 0` and `--group-size 0` ran as 1 without a word ("0 at a
/// time"), and `--groups-per-step 0` stepped on one group.
#[test]
fn a_count_of_zero_rollouts_or_groups_is_refused_at_start() {
    for flag in ["--group-size", "--concurrency", "--groups-per-step"] {
        let out = forgelog()
            .args(["run", "/nowhere/tasks", "--train", flag, "0"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag}: {err}");
        assert!(
            err.contains(&format!("invalid value '0' for '{flag} <"))
                && err.contains("must be 1 or more"),
            "{flag}: {err}"
        );
    }
}
