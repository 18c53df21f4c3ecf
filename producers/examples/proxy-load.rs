//! Load bench for the capture proxy.
//!
//! `proxy-load fake-upstream --listen ADDR --delay-ms 50`: a vLLM-compatible
//! fake engine (token ids, logprobs, fixed delay).
//! `proxy-load run [--sessions 100,1000,10000]`: starts a fake upstream and a
//! proxy as child processes (so the proxy's CPU and RSS are its own, read
//! from /proc/PID), then for each N runs N concurrent sessions of 4
//! multi-turn calls whose prompts extend the previous turn: first straight
//! against the upstream (the baseline), then through the proxy. With
//! `--upstream URL --proxy URL [--proxy-pid PID] [--no-sessions]` the same load
//! goes to servers already running: forgelog's or any other proxy, for comparison.
//!
//! `--token-in`: the proxy renders the prompts itself with the fake model's
//! tokenizer and template and splices each follow-up call onto the ids of the
//! one before (token in, as it runs for the embedded engine and vLLM).
//!
//! A real harness runs tools between its calls. `--think-ms` models that
//! pause: with it, the N sessions start spread over one call-and-think cycle
//! and N / (delay + think) calls per second are offered; with 0 every session
//! calls back to back, which saturates the machine from a few hundred
//! sessions on, and the added latency is then queueing for CPU.

use clap::{Parser, Subcommand};

// The proxy allocates per call (JSON, events); mimalloc costs about 30% less CPU per call here.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use forgelog_api::{Finish, NewSession, SessionClient, Verdict};
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
    Run(RunArgs),
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
        Cmd::Proxy(args) => {
            let token_in = args.tokenizer.as_deref().map(token_in).transpose()?;
            rt.block_on(async { Ok(forgelog_producers::run(args, token_in).await?) })
        }
        Cmd::Run(args) => rt.block_on(run(args)),
    }
}

/// The tokenizer and template of the model folder `dir` (the fake model's).
fn token_in(dir: &str) -> anyhow::Result<forgelog_producers::upstream::TokenIn> {
    let codec = forgelog_model::load_chat_codec(dir, std::path::Path::new(dir))?;
    let (tokenizer_sha256, chat_template_sha256) = codec.sha256s();
    Ok(forgelog_producers::upstream::TokenIn {
        renderer: std::sync::Arc::new(codec),
        tokenizer_sha256,
        chat_template_sha256,
    })
}

#[derive(clap::Args)]
struct RunArgs {
    /// Concurrent sessions per round
    #[arg(long, value_delimiter = ',', default_value = "100,1000,10000")]
    sessions: Vec<usize>,
    #[arg(long, default_value_t = 4)]
    calls: usize,
    /// Tokens of task text in each session's first message, re-sent with the
    /// growing history on every call (the fake upstream's tokens are bytes)
    #[arg(long, default_value_t = 0)]
    prompt_tokens: usize,
    /// Pause between a session's calls (its harness running tools), per round
    #[arg(long, value_delimiter = ',', default_value = "1000,0")]
    think_ms: Vec<u64>,
    /// Delay of the fake upstream started here
    #[arg(long, default_value_t = 50)]
    delay_ms: u64,
    /// The proxy started here renders prompts and splices follow-up calls
    /// (token in), with the fake model's tokenizer and template
    #[arg(long, conflicts_with = "proxy")]
    token_in: bool,
    /// Load this upstream instead of starting a fake one
    #[arg(long)]
    upstream: Option<String>,
    /// Load this proxy (in front of `--upstream`) instead of starting one
    #[arg(long, requires = "upstream")]
    proxy: Option<String>,
    /// With `--proxy`: it is not forgelog, so open no forgelog sessions
    #[arg(long, requires = "proxy")]
    no_sessions: bool,
    /// The session API's admin token of `--proxy`
    #[arg(long, env = "FORGELOG_ADMIN_TOKEN", requires = "proxy")]
    admin_token: Option<String>,
    /// The process to measure CPU and memory of, with `--proxy`
    #[arg(long, requires = "proxy")]
    proxy_pid: Option<u32>,
    #[arg(long, env = "FORGELOG_BROKERS", default_value = forgelog_stream::DEFAULT_BROKERS)]
    brokers: String,
}

/// The session API token of the proxy started here.
const ADMIN: &str = "proxy-load-admin";

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

/// CPU time in ms of a whole process, as `ps` and `top` count it (user +
/// system, every thread it ever had, exited ones included: tokio's blocking
/// pool, the Kafka client's threads), and its peak RSS in MiB.
fn proc_usage(pid: u32) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) in parentheses:
    // utime and stime are the 12th and 13th, in clock ticks.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<u64>().ok())
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let hwm_kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    (ticks as f64 * 1000.0 / hz, hwm_kb / 1024.0)
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

/// The shape of one round's load.
#[derive(Clone, Copy)]
struct Load {
    sessions: usize,
    calls: usize,
    prompt_tokens: usize,
    /// Pause between a session's calls.
    think: Duration,
    /// Upstream delay plus think: sessions start spread over it.
    cycle: Duration,
}

/// N sessions, each `calls` calls whose prompts extend the previous turn.
async fn round(base: &str, load: Load, admin: Option<&str>) -> Round {
    let with_sessions = admin.is_some();
    // Rollout ids are unique per round.
    static ROUNDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let round_no = ROUNDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let Load {
        sessions: n,
        calls,
        prompt_tokens,
        think,
        cycle,
    } = load;
    // A client per round: its connections close with it (fds are finite).
    let http = &client();
    let start = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (http, base) = (http.clone(), base.to_string());
            let sessions = SessionClient::with_http(&base, admin.map(str::to_string), http.clone());
            // Without think time all sessions start at once (the saturating
            // case); with it their starts are spread evenly over a cycle.
            let offset = if think.is_zero() { Duration::ZERO } else { cycle.mul_f64(i as f64 / n as f64) };
            tokio::spawn(async move {
                tokio::time::sleep_until(tokio::time::Instant::from_std(start + offset)).await;
                let mut latencies = Vec::with_capacity(calls);
                let mut errors = 0;
                let mut key = String::from("none");
                let mut session = String::new();
                if with_sessions {
                    let new = NewSession::new(format!("load-{round_no}-{i}-{}", std::process::id()), "load", "proxy-load", format!("g{}", i / 8)).group_size(8);
                    match sessions.create(&new).await {
                        Ok(created) => (key, session) = (created.api_key, created.session_id),
                        Err(e) => {
                            eprintln!("error: session {i}: {e}");
                            return (latencies, calls + 1);
                        }
                    }
                }
                let mut messages = vec![json!({"role": "system", "content": "You are a load test."}), json!({"role": "user", "content": task(i, prompt_tokens)})];
                for turn in 0..calls {
                    if turn > 0 && !think.is_zero() {
                        tokio::time::sleep(think).await;
                    }
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
                let finish = Finish { exit_status: Some(0), verifier: Some(Verdict::scored(1.0, "")), ..Default::default() };
                if with_sessions && sessions.finish(&session, &finish).await.is_err() {
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

/// Session `i`'s task: `tokens` bytes of words, different per session.
fn task(i: usize, tokens: usize) -> String {
    const WORDS: [&str; 8] = [
        "grep",
        "the",
        "src/lib.rs",
        "for",
        "error",
        "and",
        "fix",
        "tests",
    ];
    let mut text = format!("Task {i}: do the thing.");
    for w in 0.. {
        if text.len() >= tokens {
            break;
        }
        text.push(' ');
        text.push_str(WORDS[(w * 7 + i) % WORDS.len()]);
    }
    text
}

/// Waits (up to 5 minutes) until a forgelog proxy has delivered every event it
/// sent, as its `/metrics` count them.
async fn drained(http: &reqwest::Client, base: &str) {
    let count = |text: &str, name: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    for _ in 0..3000 {
        let Ok(r) = http.get(format!("{base}/metrics")).send().await else {
            return;
        };
        let text = r.text().await.unwrap_or_default();
        let sent = count(&text, "forgelog_events_sent_total");
        if sent <= count(&text, "forgelog_events_delivered_total") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("warning: events still draining after 5 minutes");
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

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let spool = tempfile::tempdir()?;
    let model = tempfile::tempdir()?;
    let mut children = Children(Vec::new());
    let http = client();
    let (upstream, upstream_pid) = match &args.upstream {
        Some(url) => (url.trim_end_matches('/').to_string(), None),
        None => {
            let addr = free_addr();
            let delay = args.delay_ms.to_string();
            let child = Command::new(&exe)
                .args(["fake-upstream", "--listen", &addr.to_string()])
                .args(["--delay-ms", &delay])
                .spawn()?;
            let pid = child.id();
            children.0.push(child);
            (format!("http://{addr}"), Some(pid))
        }
    };
    wait_ready(&http, &format!("{upstream}/v1/models")).await?;
    let (base, proxy_pid, admin) = match &args.proxy {
        Some(url) => (
            url.trim_end_matches('/').to_string(),
            args.proxy_pid,
            (!args.no_sessions).then(|| args.admin_token.clone().unwrap_or_default()),
        ),
        None => {
            let addr = free_addr();
            let run_id = forgelog_stream::testing::unique_run_id("proxy-load");
            let mut proxy = Command::new(&exe);
            proxy.args(["proxy", "--upstream", &upstream]);
            if args.token_in {
                fake_upstream::write_model_dir(model.path())?;
                proxy.arg("--tokenizer").arg(model.path());
            }
            let child = proxy
                .args(["--listen", &addr.to_string(), "--brokers", &args.brokers])
                .args(["--run-id", &run_id, "--admin-token", ADMIN])
                .args(["--spool", &spool.path().display().to_string()])
                .args(["--max-calls-in-flight", &args.calls.to_string()])
                .spawn()?;
            println!("forgelog proxy pid {}, run {run_id}", child.id());
            let pid = child.id();
            children.0.push(child);
            let base = format!("http://{addr}");
            wait_ready(&http, &format!("{base}/healthz")).await?;
            (base, Some(pid), Some(ADMIN.to_string()))
        }
    };
    let calls = args.calls;
    // Unmeasured: connections, pools and the allocator's arenas warm up here.
    let warm_load = Load {
        sessions: 50,
        calls,
        prompt_tokens: args.prompt_tokens,
        think: Duration::ZERO,
        cycle: Duration::ZERO,
    };
    let warm = round(&base, warm_load, admin.as_deref()).await;
    println!(
        "{base} -> {upstream}, {calls} calls per session, a {}-token task (warm-up: {} calls)",
        args.prompt_tokens,
        warm.latencies_us.len()
    );
    // `up CPU`: the fake upstream's own CPU per call in the direct round, what
    // one bare HTTP hop with JSON costs here, for scale.
    println!(
        "{:>7} {:>7} {:>9} {:>10} {:>10} {:>10} {:>10} {:>12} {:>7} {:>9} {:>7}",
        "N",
        "think",
        "calls/s",
        "up p50",
        "up p99",
        "+p50 ms",
        "+p99 ms",
        "CPU ms/call",
        "up CPU",
        "peak MiB",
        "errors"
    );
    let usage = |pid: Option<u32>| pid.map(proc_usage).unwrap_or((f64::NAN, f64::NAN));
    for (think_ms, n) in args
        .think_ms
        .iter()
        .flat_map(|&t| args.sessions.iter().map(move |&n| (t, n)))
    {
        let think = Duration::from_millis(think_ms);
        let load = Load {
            sessions: n,
            calls,
            prompt_tokens: args.prompt_tokens,
            think,
            cycle: Duration::from_millis(args.delay_ms) + think,
        };
        let (up0, _) = usage(upstream_pid);
        let direct = round(&upstream, load, None).await;
        let (up1, _) = usage(upstream_pid);
        let (cpu0, _) = usage(proxy_pid);
        let proxied = round(&base, load, admin.as_deref()).await;
        if admin.is_some() {
            // The round's events are still draining to the broker: their CPU is
            // the round's, and must not land in the next one.
            drained(&http, &base).await;
        }
        let (cpu1, rss) = usage(proxy_pid);
        let done = proxied.latencies_us.len().max(1);
        println!(
            "{:>7} {:>7} {:>9.0} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>12.3} {:>7.3} {:>9.0} {:>7}",
            n,
            think_ms,
            proxied.latencies_us.len() as f64 / proxied.wall.as_secs_f64(),
            percentile(&direct.latencies_us, 0.5),
            percentile(&direct.latencies_us, 0.99),
            percentile(&proxied.latencies_us, 0.5) - percentile(&direct.latencies_us, 0.5),
            percentile(&proxied.latencies_us, 0.99) - percentile(&direct.latencies_us, 0.99),
            (cpu1 - cpu0) / done as f64,
            (up1 - up0) / direct.latencies_us.len().max(1) as f64,
            rss,
            proxied.errors + direct.errors,
        );
    }
    Ok(())
}
