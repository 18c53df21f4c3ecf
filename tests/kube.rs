//! `forgelog run --backend kube` against the in-repo fake API server, whose
//! fake kubelet runs each Job's pod through the local podman backend: the
//! same rollouts as the local backend's end-to-end test, "on Kubernetes".
//! No real cluster is used here. With `KUBECONFIG` set, the command in the
//! README runs the same rollouts against a real one.

mod support;

use forgelog_kube_fake::{FakeCluster, Pods};
use forgelog_producers::fake_upstream::{self, FakeOptions};
use forgelog_schemas::{Event, Topic, VerifierResult};
use forgelog_stream::testing::{free_local_addr, shared_broker, unique_run_id};
use forgelog_stream::{ReplayReader, StartAt, StreamConfig};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;
use support::sandboxes::outcome_row;
use support::shipped;

struct Cluster {
    rt: tokio::runtime::Runtime,
    stream: StreamConfig,
    upstream: String,
    cluster: FakeCluster,
    proxy: SocketAddr,
    runs: support::RunDirs,
}

fn cluster() -> Cluster {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let stream = rt.block_on(shared_broker());
    let (addr, _) = rt
        .block_on(fake_upstream::spawn(
            "127.0.0.1:0".parse().unwrap(),
            FakeOptions {
                agent_steps: Some(2),
                ..Default::default()
            },
        ))
        .unwrap();
    // The proxy `forgelog run` will start, where the kubelet's pods reach it.
    let proxy = free_local_addr();
    let cluster = rt
        .block_on(FakeCluster::start(Pods::Podman(proxy)))
        .unwrap();
    Cluster {
        rt,
        stream,
        upstream: format!("http://{addr}"),
        cluster,
        proxy,
        runs: Default::default(),
    }
}

impl Cluster {
    fn run(&self, tasks: &Path, run: &str, harnesses: &str, extra: &[&str]) -> Output {
        self.runs.add(run);
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_forgelog"));
        cmd.arg("run")
            .arg(tasks)
            .args(["--backend", "kube", "--kube-api", &self.cluster.url])
            .args(["--proxy-listen", &self.proxy.to_string()])
            .args(["--harness", harnesses, "--run", run])
            .args(["--group-size", "1", "--concurrency", "4"])
            .args([
                "--upstream",
                &self.upstream,
                "--brokers",
                &self.stream.brokers,
            ])
            .args(["--max-model-calls", "8"])
            .args(extra);
        // Within the binary's budget, so a run that hangs says where (it
        // once ran past the 180 s budget under the full suite's load, and
        // the runner's kill kept nothing of what it said). 39 s in one full
        // suite, more than 100 s in another on a slow machine.
        let limit = Duration::from_secs(300);
        let (out, timed_out) = support::output_within(&mut cmd, limit);
        eprintln!(
            "forgelog run {run}{}: {}\n{}{}",
            if timed_out {
                format!(" (interrupted after {} s)", limit.as_secs())
            } else {
                String::new()
            },
            out.status,
            String::from_utf8_lossy(&out.stdout),
            {
                let e = String::from_utf8_lossy(&out.stderr);
                e[e.len().saturating_sub(3000)..].to_string()
            }
        );
        out
    }

    fn verdicts(&self, run: &str) -> BTreeMap<String, VerifierResult> {
        let reader = ReplayReader::new(&self.stream).unwrap();
        reader
            .read(Topic::Rewards.name(), StartAt::Beginning, Some(run))
            .unwrap()
            .into_iter()
            .filter_map(|r| match r.event {
                Ok(Event::VerifierResult(v)) => Some((v.rollout_id.clone(), v)),
                _ => None,
            })
            .collect()
    }
}

fn status_of(v: &VerifierResult) -> String {
    let d: serde_json::Value = serde_json::from_str(&v.details).unwrap();
    d["status"].as_str().unwrap_or("?").to_string()
}

#[test]
fn rollouts_run_as_jobs_on_the_fake_cluster_and_leave_nothing_behind() {
    let c = cluster();
    let run = unique_run_id("kube-e2e");
    let harnesses = "solve,claude-code,codex,opencode,mini-swe-agent";
    let tasks = ["hello-file", "fix-typos", "csv-sum"];
    let root = tempfile::tempdir().unwrap();
    for t in tasks {
        let to = root.path().join(t);
        Command::new("cp")
            .arg("-r")
            .arg(shipped().join(t))
            .arg(&to)
            .status()
            .unwrap();
    }
    let out = c.run(root.path(), &run, harnesses, &[]);
    assert!(out.status.success());
    let verdicts = c.verdicts(&run);
    assert_eq!(verdicts.len(), tasks.len() * 5);
    for (id, v) in &verdicts {
        assert!(!v.abandoned, "{id}");
        assert_eq!(status_of(v), "scored", "{id}: {v:?}");
        let want = if id.contains("-solve-") { 1.0 } else { 0.0 };
        assert_eq!(v.reward, Some(want), "{id}");
    }
    let store = c.cluster.store();
    for kind in ["Job", "Pod", "Secret", "ConfigMap", "NetworkPolicy"] {
        assert_eq!(store.count(kind), 0, "{kind}s left behind");
    }
    drop(c.rt);
}

/// Three copies of `hello-file` whose solution takes `secs` seconds.
fn slow_tasks(root: &Path, secs: u32) {
    for t in ["slow-a", "slow-b", "slow-c"] {
        support::variant(
            root,
            t,
            "solution/solve.sh",
            &format!("sleep {secs}; printf 'Hello, forgelog!\\n' > /app/hello.txt\n"),
        );
    }
}

/// The run's Jobs created, by name, from the fake's history.
fn jobs_created(c: &Cluster) -> Vec<String> {
    let (past, _) = c.cluster.store().watch(0);
    past.iter()
        .filter(|ch| ch.kind == "Job" && ch.what == "ADDED")
        .map(|ch| ch.object["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

/// The API server answers 500s and 429s for a while: every call is retried,
/// every rollout still scores, and no Job is created twice.
#[test]
fn an_api_server_failing_for_a_while_duplicates_nothing() {
    let c = cluster();
    let root = tempfile::tempdir().unwrap();
    slow_tasks(root.path(), 0);
    c.cluster.fail_next(8, 500);
    c.cluster.fail_next(8, 429);
    let run = unique_run_id("kube-faults");
    let out = c.run(root.path(), &run, "solve", &[]);
    assert!(out.status.success());
    let verdicts = c.verdicts(&run);
    assert_eq!(verdicts.len(), 3);
    assert!(
        verdicts.values().all(|v| v.reward == Some(1.0)),
        "{verdicts:?}"
    );
    let mut jobs = jobs_created(&c);
    assert_eq!(jobs.len(), 3, "{jobs:?}");
    jobs.dedup();
    assert_eq!(jobs.len(), 3);
    assert!(
        c.cluster.server.faults.lock().unwrap().is_empty(),
        "the faults were met"
    );
}

/// A Job deleted from outside ends its attempt as `infra:sandbox` with a
/// null reward; it never reached the model, so it is abandoned and run again.
#[test]
fn a_job_deleted_from_outside_fails_its_attempt_with_a_typed_status() {
    let c = cluster();
    let root = tempfile::tempdir().unwrap();
    slow_tasks(root.path(), 4);
    let run = unique_run_id("kube-deleted");
    let store = c.cluster.server.store.clone();
    // Deletes the first Job of slow-a once its pod runs.
    let deleter = std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while std::time::Instant::now() < deadline {
            let (pods, _) = store.list("Pod", "forgelog", Some("forgelog.dev/task=slow-a"));
            if let Some(p) = pods.iter().find(|p| p["status"]["phase"] == "Running") {
                let job = p["metadata"]["labels"]["job-name"]
                    .as_str()
                    .unwrap()
                    .to_string();
                store.delete("Job", "forgelog", &job).unwrap();
                return job;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("no pod of slow-a ran");
    });
    let out = c.run(root.path(), &run, "solve", &[]);
    let deleted = deleter.join().unwrap();
    assert!(out.status.success());
    let verdicts = c.verdicts(&run);
    let first = &verdicts[&format!("{run}-slow-a-solve-0")];
    assert_eq!(
        status_of(first),
        "infra:sandbox",
        "{first:?} (Job {deleted})"
    );
    assert!(first.details.contains("deleted"), "{}", first.details);
    assert_eq!((first.reward, first.abandoned), (None, true));
    let again = &verdicts[&format!("{run}-slow-a-solve-0~1")];
    assert_eq!((again.reward, again.abandoned), (Some(1.0), false));
    assert_eq!(c.cluster.store().count("Job"), 0);
}

/// `kill -9` of the orchestrator mid-run: its Jobs run on until its lease
/// expires; then the next orchestrator's start deletes the lease and the
/// garbage collector takes every Job and Pod of the run (the kubelet stops
/// their sandboxes).
#[test]
fn a_killed_orchestrator_leaks_nothing_once_its_lease_expires() {
    let c = cluster();
    let root = tempfile::tempdir().unwrap();
    slow_tasks(root.path(), 30);
    let run = unique_run_id("kube-killed");
    c.runs.add(&run);
    let mut child = Command::new(env!("CARGO_BIN_EXE_forgelog"))
        .arg("run")
        .arg(root.path())
        .args(["--backend", "kube", "--kube-api", &c.cluster.url])
        .args(["--proxy-listen", &c.proxy.to_string()])
        .args(["--harness", "solve", "--run", &run, "--group-size", "1"])
        .args(["--upstream", &c.upstream, "--brokers", &c.stream.brokers])
        .args(["--lease-seconds", "3"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let store = c.cluster.server.store.clone();
    let running = || {
        store
            .list("Pod", "forgelog", None)
            .0
            .iter()
            .filter(|p| p["status"]["phase"] == "Running")
            .count()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while running() < 3 {
        assert!(std::time::Instant::now() < deadline, "the pods never ran");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    std::thread::sleep(std::time::Duration::from_secs(1));
    assert_eq!(
        store.count("Job"),
        3,
        "the Jobs outlive their orchestrator a while"
    );
    std::thread::sleep(std::time::Duration::from_secs(4));
    // The next orchestrator (any run) starts by deleting expired runs.
    let empty = tempfile::tempdir().unwrap();
    support::variant(
        empty.path(),
        "quick",
        "instruction.md",
        "Write hello.txt.\n",
    );
    let next = unique_run_id("kube-next");
    let out = c.run(empty.path(), &next, "solve", &[]);
    assert!(out.status.success());
    for kind in ["Job", "Pod", "Secret", "ConfigMap", "NetworkPolicy"] {
        assert_eq!(store.count(kind), 0, "{kind}s of the dead run left");
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while containers_of_kubelet() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the pods' sandboxes still run"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// The fake kubelet's sandboxes still there.
fn containers_of_kubelet() -> usize {
    let out = Command::new("podman")
        .args(["ps", "-a", "-q", "--filter", "label=forgelog.kube/pod"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .count()
}

/// A pod that cannot start (its image cannot be pulled) stays Pending; past
/// the schedule timeout its attempt is `infra:schedule` with a null reward,
/// tried again twice, and its Jobs are gone.
#[test]
fn a_pod_stuck_pending_is_infra_schedule() {
    let c = cluster();
    let root = tempfile::tempdir().unwrap();
    support::variant(
        root.path(),
        "unpullable",
        "instruction.md",
        "Write hello.txt.\n",
    );
    let run = unique_run_id("kube-pending");
    let extra = [
        "--image-registry",
        "registry.invalid",
        "--schedule-timeout-sec",
        "2",
    ];
    let out = c.run(root.path(), &run, "solve", &extra);
    assert!(out.status.success());
    let verdicts = c.verdicts(&run);
    let id = format!("{run}-unpullable-solve-0");
    for (n, attempt) in [id.clone(), format!("{id}~1"), format!("{id}~2")]
        .iter()
        .enumerate()
    {
        let v = &verdicts[attempt];
        assert_eq!(status_of(v), "infra:schedule", "{v:?}");
        assert_eq!((v.reward, v.abandoned), (None, n < 2), "{attempt}");
    }
    assert_eq!(c.cluster.store().count("Job"), 0);
}

/// The same rollouts on a real cluster, when one is given: `KUBECONFIG` set,
/// plus where pods reach this machine's proxy (`FORGELOG_KUBE_PROXY_URL`),
/// the registry holding the shipped tasks' images
/// (`FORGELOG_KUBE_REGISTRY`, images `forgelog-task-ID:latest`) and the
/// namespace (`FORGELOG_KUBE_NAMESPACE`, with the RBAC of
/// `deploy/k8s/base/rbac.yaml`); the proxy listens on
/// `FORGELOG_KUBE_PROXY_LISTEN` (default 0.0.0.0:8100). Without `KUBECONFIG` it says so and checks
/// nothing: nothing here ever stands in for a real cluster.
#[test]
fn on_a_real_cluster_when_one_is_configured() {
    let Ok(kubeconfig) = std::env::var("KUBECONFIG") else {
        eprintln!("skipped: KUBECONFIG is not set (no real cluster here)");
        return;
    };
    let need = |k: &str| {
        std::env::var(k)
            .unwrap_or_else(|_| panic!("KUBECONFIG={kubeconfig} is set: {k} is needed too"))
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let stream = rt.block_on(shared_broker());
    let (addr, _) = rt
        .block_on(fake_upstream::spawn(
            "127.0.0.1:0".parse().unwrap(),
            Default::default(),
        ))
        .unwrap();
    let run = unique_run_id("kube-real");
    let out = Command::new(env!("CARGO_BIN_EXE_forgelog"))
        .arg("run")
        .arg(shipped())
        .args([
            "--backend",
            "kube",
            "--namespace",
            &need("FORGELOG_KUBE_NAMESPACE"),
        ])
        .args(["--kube-proxy-url", &need("FORGELOG_KUBE_PROXY_URL")])
        .args(["--image-registry", &need("FORGELOG_KUBE_REGISTRY")])
        .args([
            "--proxy-listen",
            "0.0.0.0:0",
            "--harness",
            "solve",
            "--group-size",
            "1",
        ])
        .args([
            "--run",
            &run,
            "--upstream",
            &format!("http://{addr}"),
            "--brokers",
            &stream.brokers,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    let solve = outcome_row(&table, "solve");
    assert_eq!(solve[1], solve[3], "every rollout scored: {table}");
    assert_eq!(solve[4], "100%", "{table}");
}
