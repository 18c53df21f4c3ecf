//! The Kubernetes backend's bench: `forgelog run --backend kube` with 1,000
//! rollouts queued against the in-repo fake API server, whose kubelet ends
//! each pod at once (a reference solution that scored 1): what is measured
//! is the orchestrator and its API traffic (Jobs, Secrets, watches, lease),
//! with the in-process proxy recording every session to a broker of its own.
//! Prints Jobs created and reconciled per second, the orchestrator's CPU per
//! rollout and its peak memory. No real cluster is involved.
//!
//! ```sh
//! cargo build --bin forgelog --example kube-bench
//! target/debug/examples/kube-bench [ROLLOUTS] [CONCURRENCY]
//! ```
//! (defaults: 1000, 256).

use forgelog_kube_fake::{FakeCluster, Pods};
use forgelog_producers::fake_upstream;
use forgelog_stream::testing::PrivateBroker;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let rollouts: usize = args.next().map_or(1000, |n| n.parse().expect("ROLLOUTS"));
    let concurrency: usize = args.next().map_or(256, |n| n.parse().expect("CONCURRENCY"));
    let exe = std::env::current_exe().unwrap();
    let forgelog = exe.parent().unwrap().parent().unwrap().join("forgelog");
    assert!(
        forgelog.exists(),
        "build it first: cargo build --bin forgelog"
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let broker = PrivateBroker::start().expect("tansu (scripts/setup.sh installs it)");
    let (upstream, _) = rt
        .block_on(fake_upstream::spawn(
            "127.0.0.1:0".parse().unwrap(),
            Default::default(),
        ))
        .unwrap();
    let cluster = rt.block_on(FakeCluster::start(Pods::Instant)).unwrap();
    let tasks = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/tasks");
    let run = format!("kube-bench-{}", std::process::id());
    let started = Instant::now();
    let out = Command::new(&forgelog)
        .arg("run")
        .arg(&tasks)
        .args(["--task", "hello-file", "--harness", "solve", "--run", &run])
        .args(["--group-size", &rollouts.to_string()])
        .args(["--concurrency", &concurrency.to_string()])
        .args(["--backend", "kube", "--kube-api", &cluster.url])
        .args(["--creates-per-second", "100000"])
        .args(["--upstream", &format!("http://{upstream}")])
        .args(["--brokers", &broker.addr.to_string()])
        .output()
        .unwrap();
    let wall = started.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // SAFETY: getrusage fills the struct it is given.
    let peak_kib = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut u);
        u.ru_maxrss
    };
    let created = cluster
        .store()
        .watch(0)
        .0
        .iter()
        .filter(|c| c.kind == "Job" && c.what == "ADDED")
        .count();
    println!("{stdout}");
    println!(
        "{created} Jobs created and reconciled in {wall:.1} s at concurrency {concurrency}: {:.0} Jobs/s; \
         {} API requests; orchestrator peak RSS {:.0} MiB",
        created as f64 / wall,
        cluster
            .server
            .requests
            .load(std::sync::atomic::Ordering::Relaxed),
        peak_kib as f64 / 1024.0
    );
}
