//! The servers a run loads (a fake upstream and a forgelog proxy started
//! here as child processes, or ones already running) and the run itself.

use crate::load::{client, drained, percentile, round, Load};
use crate::{RunArgs, ADMIN};
use forgelog_producers::fake_upstream;
use std::net::SocketAddr;
use std::process::{Child, Command};
use std::time::Duration;

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

/// What a run loads: the upstream (the baseline) and the proxy in front of
/// it, with the processes to measure where known.
struct Servers {
    upstream: String,
    upstream_pid: Option<u32>,
    base: String,
    proxy_pid: Option<u32>,
    /// The proxy's session API token, where it is forgelog's.
    admin: Option<String>,
    /// What lives as long as the servers started here.
    _children: Children,
    _dirs: [tempfile::TempDir; 2],
}

impl Servers {
    async fn start(args: &RunArgs, http: &reqwest::Client) -> anyhow::Result<Servers> {
        let exe = std::env::current_exe()?;
        let spool = tempfile::tempdir()?;
        let model = tempfile::tempdir()?;
        let mut children = Children(Vec::new());
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
        wait_ready(http, &format!("{upstream}/v1/models")).await?;
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
                    .args(["--run", &run_id, "--admin-token", ADMIN])
                    .args(["--spool", &spool.path().display().to_string()])
                    .args(["--max-calls-in-flight", &args.calls.to_string()])
                    .spawn()?;
                println!("forgelog proxy pid {}, run {run_id}", child.id());
                let pid = child.id();
                children.0.push(child);
                let base = format!("http://{addr}");
                wait_ready(http, &format!("{base}/healthz")).await?;
                (base, Some(pid), Some(ADMIN.to_string()))
            }
        };
        Ok(Servers {
            upstream,
            upstream_pid,
            base,
            proxy_pid,
            admin,
            _children: children,
            _dirs: [spool, model],
        })
    }
}

pub(crate) async fn run(args: RunArgs) -> anyhow::Result<()> {
    let http = client();
    let servers = Servers::start(&args, &http).await?;
    let (upstream, base) = (servers.upstream.as_str(), servers.base.as_str());
    let (upstream_pid, proxy_pid, admin) = (
        servers.upstream_pid,
        servers.proxy_pid,
        servers.admin.as_deref(),
    );
    let calls = args.calls;
    // Unmeasured: connections, pools and the allocator's arenas warm up here.
    let warm_load = Load {
        sessions: 50,
        calls,
        prompt_tokens: args.prompt_tokens,
        group_size: args.group_size,
        think: Duration::ZERO,
        cycle: Duration::ZERO,
    };
    let warm = round(base, warm_load, admin).await;
    println!(
        "{base} -> {upstream}, {calls} calls per session, a {}-token task per group of {} (warm-up: {} calls)",
        args.prompt_tokens,
        args.group_size,
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
            group_size: args.group_size,
            think,
            cycle: Duration::from_millis(args.delay_ms) + think,
        };
        let (up0, _) = usage(upstream_pid);
        let direct = round(upstream, load, None).await;
        let (up1, _) = usage(upstream_pid);
        let (cpu0, _) = usage(proxy_pid);
        let proxied = round(base, load, admin).await;
        if admin.is_some() {
            // The round's events are still draining to the broker: their CPU is
            // the round's, and must not land in the next one.
            drained(&http, base).await;
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
