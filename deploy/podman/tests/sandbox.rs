//! The local backend's parts on their own: a sandbox outlives no orchestrator
//! (podman kills it at its lifetime), and a sandbox network's only route is
//! its veth to the host, where the relay reaches the proxy, and its resolver
//! refuses every name at once, keeping what was asked.

use forgelog_podman::{PinnedClocks, Podman, SandboxNetwork, SandboxSpec};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

const BASE: &str = "localhost/forgelog-base:bookworm";

#[tokio::test]
async fn a_sandbox_is_gone_at_its_lifetime_whatever_its_orchestrator_does() {
    let podman = Podman::default();
    let run = format!("lifetime-{}", std::process::id());
    let spec = SandboxSpec {
        name: format!("forgelog-{run}"),
        run_id: run.clone(),
        lifetime: Some(Duration::from_secs(2)),
        ..Default::default()
    };
    let sandbox = podman.start(BASE, &spec).await.unwrap();
    // The orchestrator "dies": nothing of it touches the sandbox again.
    std::mem::forget(sandbox);
    assert!(podman.runs().await.unwrap().contains(&run));
    let deadline = Instant::now() + Duration::from_secs(30);
    while podman.runs().await.unwrap().contains(&run) {
        assert!(Instant::now() < deadline, "still there after 30 s");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `run --replay`'s pinned clock as the harnesses see it: the C library's
/// callers (`date`, Python) and Node (most harnesses) read the recorded
/// start, not today, and it runs on from there in every process.
#[tokio::test]
async fn a_pinned_clock_is_what_the_sandbox_and_node_read() {
    let libfaketime = PinnedClocks::find_libfaketime()
        .expect("libfaketime is installed (scripts/setup.sh: apt-get install libfaketime)");
    let home = std::env::var_os("FORGELOG_HOME")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(&std::env::var_os("HOME").unwrap()).join(".cache/forgelog")
        });
    let bundles = home.join("harnesses");
    let node = bundles.join("node/bin/node");
    assert!(
        node.exists(),
        "the kit's node (deploy/harnesses/install.sh): {node:?}"
    );
    let clocks = PinnedClocks {
        libfaketime,
        // 2001-09-09 01:46:40 UTC
        starts: [("a-0".to_string(), 1_000_000_000_000)].into(),
    };
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let (mount, env) = clocks.for_attempt("a-0", now_ms).unwrap();
    let run = format!("clock-{}", std::process::id());
    let spec = SandboxSpec {
        name: format!("forgelog-{run}"),
        run_id: run,
        mounts: vec![mount, forgelog_podman::Mount::same_path(&bundles)],
        lifetime: Some(Duration::from_secs(120)),
        ..Default::default()
    };
    let sandbox = Podman::default().start(BASE, &spec).await.unwrap();
    // Then two processes started two seconds apart: the clock runs on
    // across processes, it does not start again in each.
    let script = format!(
        "date -u +%F; python3 -c 'import datetime; print(datetime.datetime.now(datetime.timezone.utc).year)'; {} -e 'console.log(new Date().toISOString().slice(0, 10))'; date +%s; sleep 2; date +%s",
        node.display()
    );
    let out = sandbox
        .exec(&script, "/", &env, Duration::from_secs(60))
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines[..3],
        ["2001-09-09", "2001", "2001-09-09"],
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (a, b): (i64, i64) = (lines[3].parse().unwrap(), lines[4].parse().unwrap());
    // The offset is whole seconds: up to one early.
    assert!((999_999_999..1_000_000_060).contains(&a), "{stdout}");
    assert!((2..5).contains(&(b - a)), "{stdout}");
    sandbox.remove().await.unwrap();
}

// Two workers: the relay and the stand-in proxy serve while the test blocks on `ip`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_network_routes_only_to_the_relay_and_the_relay_reaches_the_proxy() {
    // A stand-in proxy on the host's loopback: answers "pong".
    let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = proxy.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = proxy.accept().await {
            let _ = s.write_all(b"pong").await;
        }
    });
    let net = SandboxNetwork::create(addr, 9000).await.unwrap();
    net.check_isolated().await.unwrap();
    let ns = net.namespace.clone();
    let route = |to: &str| {
        std::process::Command::new("ip")
            .args(["-n", &ns, "route", "get", to])
            .output()
            .unwrap()
    };
    let outside = route("1.1.1.1");
    assert!(!outside.status.success());
    assert!(String::from_utf8_lossy(&outside.stderr).contains("unreachable"));
    assert!(route(&net.host_ip.to_string()).status.success());
    // From inside the namespace, the host end's port is the proxy.
    let inside = std::process::Command::new("ip")
        .args(["netns", "exec", &ns, "bash", "-c"])
        .arg(format!(
            "exec 3<>/dev/tcp/{}/{}; timeout 5 cat <&3",
            net.host_ip, net.port
        ))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&inside.stdout), "pong");
    // A sandbox on it asks the network's resolver, which refuses at once and
    // keeps the name.
    let run = format!("dns-{}", std::process::id());
    let spec = SandboxSpec {
        name: format!("forgelog-{run}"),
        run_id: run,
        netns: Some(ns.clone()),
        dns: Some(net.host_ip),
        lifetime: Some(Duration::from_secs(120)),
        ..Default::default()
    };
    let sandbox = Podman::default().start(BASE, &spec).await.unwrap();
    let asked_at = Instant::now();
    let out = sandbox
        .exec(
            "cat /etc/resolv.conf; getent hosts telemetry.example.com; echo \"getent $?\"",
            "/",
            &[],
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    let waited = asked_at.elapsed();
    let _ = sandbox.remove().await;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        stdout.contains(&format!("nameserver {}", net.host_ip)),
        "{stdout}"
    );
    assert!(stdout.contains("getent 2"), "not found: {stdout}");
    assert!(
        waited < Duration::from_secs(20),
        "the lookup took {waited:?}"
    );
    let asked: Vec<String> = net.dns_asked().iter().map(|q| q.name.clone()).collect();
    assert!(
        asked.iter().any(|n| n == "telemetry.example.com"),
        "{asked:?}"
    );
    let slot = net.slot;
    net.remove().await;
    let gone = std::process::Command::new("ip")
        .args(["link", "show", &format!("flr{slot}h")])
        .output()
        .unwrap();
    assert!(
        !gone.status.success(),
        "the veth pair went with the namespace"
    );
}
