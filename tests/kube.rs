//! `forgelog run --backend kube` against the in-repo fake API server, whose
//! fake kubelet runs each Job's pod through the local podman backend: the
//! same rollouts as the local backend's end-to-end test, "on Kubernetes".
//! No real cluster is used here. With `KUBECONFIG` set, the command in the
//! README runs the same rollouts against a real one.

mod support;

use forgelog_kube::fake::FakeCluster;
use forgelog_producers::fake_upstream::{self, FakeOptions};
use forgelog_schemas::{Event, Topic, VerifierResult};
use forgelog_stream::testing::{free_local_addr, shared_broker, unique_run_id};
use forgelog_stream::{ReplayReader, StartAt, StreamConfig};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output};
use support::shipped;

struct Cluster {
    rt: tokio::runtime::Runtime,
    stream: StreamConfig,
    upstream: String,
    cluster: FakeCluster,
    proxy: SocketAddr,
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
    let cluster = rt.block_on(FakeCluster::start(Some(proxy))).unwrap();
    Cluster {
        rt,
        stream,
        upstream: format!("http://{addr}"),
        cluster,
        proxy,
    }
}

impl Cluster {
    fn run(&self, tasks: &Path, run: &str, harnesses: &str, extra: &[&str]) -> Output {
        let out = Command::new(env!("CARGO_BIN_EXE_forgelog"))
            .arg("run")
            .arg(tasks)
            .args(["--backend", "kube", "--kube-api", &self.cluster.url])
            .args(["--proxy-listen", &self.proxy.to_string()])
            .args(["--harness", harnesses, "--run", run])
            .args(["--group-size", "1", "--concurrency", "4"])
            .args(["--upstream", &self.upstream, "--brokers", &self.stream.brokers])
            .args(["--max-model-calls", "8"])
            .args(extra)
            .output()
            .unwrap();
        eprintln!(
            "forgelog run {run}: {}\n{}{}",
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
