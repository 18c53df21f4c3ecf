//! Load bench for the capture proxy.
//!
//! `proxy-load fake-upstream --listen ADDR --delay-ms 50`: a vLLM-compatible
//! fake engine (token ids, logprobs, fixed delay).
//! `proxy-load run [--sessions 100,1000,10000]`: starts a fake upstream and a
//! proxy as child processes (so the proxy's CPU and RSS are its own, read
//! from /proc/PID), then for each N runs N concurrent sessions of 4
//! multi-turn calls whose prompts extend the previous turn: first straight
//! against the upstream (the baseline), then through the proxy.

use clap::{Parser, Subcommand};

// The proxy allocates per call (JSON, events); mimalloc costs about 30% less CPU per call here.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use forgelog_producers::fake_upstream::{self, FakeOptions};
use forgelog_producers::{raise_fd_limit, ProxyArgs};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(about = "forgelog capture proxy load bench")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve a fake vLLM-compatible upstream
    FakeUpstream {
        #[arg(long, default_value = "127.0.0.1:8000")]
        listen: SocketAddr,
        #[arg(long, default_value_t = 50)]
        delay_ms: u64,
        /// Answer without token ids and logprobs (an untrainable backend)
        #[arg(long)]
        without_ids: bool,
    },
    /// Serve the proxy (what `forgelog proxy` runs)
    Proxy(ProxyArgs),
    /// Run the load test
    Run {
        /// Concurrent sessions per round
        #[arg(long, value_delimiter = ',', default_value = "100,1000,10000")]
        sessions: Vec<usize>,
        #[arg(long, default_value_t = 4)]
        calls: usize,
        #[arg(long, default_value_t = 50)]
        delay_ms: u64,
        #[arg(long, env = "FORGELOG_BROKERS", default_value = "127.0.0.1:9092")]
        brokers: String,
    },
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    raise_fd_limit();
    let rt = tokio::runtime::Runtime::new()?;
    match Cli::parse().command {
        Cmd::FakeUpstream {
            listen,
            delay_ms,
            without_ids,
        } => rt.block_on(async {
            let options = FakeOptions {
                delay: Duration::from_millis(delay_ms),
                without_ids,
                ..Default::default()
            };
            let (addr, _) = fake_upstream::spawn(listen, options).await?;
            eprintln!("fake upstream on http://{addr} ({delay_ms} ms per call)");
            std::future::pending::<()>().await;
            Ok(())
        }),
        Cmd::Proxy(args) => rt.block_on(async { Ok(forgelog_producers::run(args).await?) }),
        Cmd::Run {
            sessions,
            calls,
            delay_ms,
            brokers,
        } => rt.block_on(run(sessions, calls, delay_ms, brokers)),
    }
}

/// Kills the child processes on every exit path.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_addr() -> SocketAddr {
    forgelog_stream::testing::free_local_addr()
}

async fn wait_ready(http: &reqwest::Client, url: &str) -> anyhow::Result<()> {
    for _ in 0..300 {
        if http
            .get(url)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!("{url} did not come up")
}

/// CPU time in ms (all threads, from each thread's `schedstat`: nanoseconds,
/// where `stat`'s clock ticks are too coarse for a few hundred calls), and peak
/// RSS in MiB, of a process.
fn proc_usage(pid: u32) -> (f64, f64) {
    let cpu_ns: u64 = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let hwm_kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    (cpu_ns as f64 / 1e6, hwm_kb / 1024.0)
}

struct Round {
    latencies_us: Vec<u64>,
    errors: usize,
    wall: Duration,
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0
}

/// N sessions at once, each `calls` calls whose prompts extend the previous turn.
async fn round(base: &str, n: usize, calls: usize, with_sessions: bool) -> Round {
    // A client per round: its connections close with it (fds are finite).
    let http = &client();
    let start = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (http, base) = (http.clone(), base.to_string());
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(calls);
                let mut errors = 0;
                let mut key = String::from("none");
                let mut session = String::new();
                if with_sessions {
                    let body = json!({"rollout_id": format!("load-{i}-{}", std::process::id()), "task_id": "load", "harness": "proxy-load", "group_id": format!("g{}", i / 8), "group_size": 8});
                    match post(&http, &format!("{base}/sessions"), "none", &body).await {
                        Some(v) => {
                            key = v["api_key"].as_str().unwrap_or_default().to_string();
                            session = v["session_id"].as_str().unwrap_or_default().to_string();
                        }
                        None => return (latencies, calls + 1),
                    }
                }
                let mut messages = vec![json!({"role": "system", "content": "You are a load test."}), json!({"role": "user", "content": format!("Task {i}: do the thing")})];
                for turn in 0..calls {
                    let body = json!({"model": "m", "messages": messages, "max_tokens": 64});
                    let t = Instant::now();
                    match post(&http, &format!("{base}/v1/chat/completions"), &key, &body).await {
                        Some(v) => {
                            latencies.push(t.elapsed().as_micros() as u64);
                            messages.push(v["choices"][0]["message"].clone());
                            messages.push(json!({"role": "user", "content": format!("turn {turn} done, continue")}));
                        }
                        None => errors += 1,
                    }
                }
                if with_sessions && post(&http, &format!("{base}/sessions/{session}/finish"), "none", &json!({"exit_status": 0, "verifier": {"ok": true, "reward": 1.0}})).await.is_none() {
                    errors += 1;
                }
                (latencies, errors)
            })
        })
        .collect();
    let mut out = Round {
        latencies_us: Vec::new(),
        errors: 0,
        wall: Duration::ZERO,
    };
    for t in tasks {
        let (l, e) = t.await.unwrap_or_default();
        out.latencies_us.extend(l);
        out.errors += e;
    }
    out.wall = start.elapsed();
    out.latencies_us.sort_unstable();
    out
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(usize::MAX)
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(300))
        .build()
        .expect("client")
}

async fn post(http: &reqwest::Client, url: &str, key: &str, body: &Value) -> Option<Value> {
    let r = http
        .post(url)
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await;
    match r {
        Ok(r) if r.status().is_success() => serde_json::from_slice(&r.bytes().await.ok()?).ok(),
        Ok(r) => {
            eprintln!("error: {url}: HTTP {}", r.status());
            None
        }
        Err(e) => {
            eprintln!("error: {url}: {e}");
            None
        }
    }
}

async fn run(
    sessions: Vec<usize>,
    calls: usize,
    delay_ms: u64,
    brokers: String,
) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let (up_addr, proxy_addr) = (free_addr(), free_addr());
    let spool = tempfile::tempdir()?;
    let mut children = Children(Vec::new());
    children.0.push(
        Command::new(&exe)
            .args([
                "fake-upstream",
                "--listen",
                &up_addr.to_string(),
                "--delay-ms",
                &delay_ms.to_string(),
            ])
            .spawn()?,
    );
    let upstream = format!("http://{up_addr}");
    let http = client();
    wait_ready(&http, &format!("{upstream}/v1/models")).await?;
    let run_id = forgelog_stream::testing::unique_run_id("proxy-load");
    children.0.push(
        Command::new(&exe)
            .args([
                "proxy",
                "--upstream",
                &upstream,
                "--listen",
                &proxy_addr.to_string(),
                "--brokers",
                &brokers,
                "--run-id",
                &run_id,
            ])
            .args([
                "--spool",
                &spool.path().display().to_string(),
                "--max-calls-per-session",
                "4",
            ])
            .spawn()?,
    );
    let proxy_pid = children.0[1].id();
    let base = format!("http://{proxy_addr}");
    wait_ready(&http, &format!("{base}/healthz")).await?;
    // Unmeasured: connections, pools and the allocator's arenas warm up here.
    let warm = round(&base, 50, calls, true).await;
    println!("proxy pid {proxy_pid}, upstream delay {delay_ms} ms, {calls} calls per session, run {run_id} (warm-up: {} calls)", warm.latencies_us.len());
    println!(
        "{:>7} {:>9} {:>10} {:>10} {:>10} {:>10} {:>12} {:>9} {:>7}",
        "N",
        "calls/s",
        "up p50",
        "up p99",
        "+p50 ms",
        "+p99 ms",
        "CPU ms/call",
        "peak MiB",
        "errors"
    );
    for n in sessions {
        let direct = round(&upstream, n, calls, false).await;
        let (cpu0, _) = proc_usage(proxy_pid);
        let proxied = round(&base, n, calls, true).await;
        let (cpu1, rss) = proc_usage(proxy_pid);
        let done = proxied.latencies_us.len().max(1);
        println!(
            "{:>7} {:>9.0} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>12.3} {:>9.0} {:>7}",
            n,
            proxied.latencies_us.len() as f64 / proxied.wall.as_secs_f64(),
            percentile(&direct.latencies_us, 0.5),
            percentile(&direct.latencies_us, 0.99),
            percentile(&proxied.latencies_us, 0.5) - percentile(&direct.latencies_us, 0.5),
            percentile(&proxied.latencies_us, 0.99) - percentile(&direct.latencies_us, 0.99),
            (cpu1 - cpu0) / done as f64,
            rss,
            proxied.errors + direct.errors,
        );
    }
    Ok(())
}
