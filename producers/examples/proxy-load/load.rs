//! One round of load: N concurrent sessions of multi-turn calls whose
//! prompts extend the previous turn, and what they measured.

use forgelog_api::{Finish, NewSession, SessionClient, Verdict};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

pub(crate) struct Round {
    pub(crate) latencies_us: Vec<u64>,
    pub(crate) errors: usize,
    pub(crate) wall: Duration,
}

pub(crate) fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0
}

/// The shape of one round's load.
#[derive(Clone, Copy)]
pub(crate) struct Load {
    pub(crate) sessions: usize,
    pub(crate) calls: usize,
    pub(crate) prompt_tokens: usize,
    /// Sessions per GRPO group: a group's rollouts share their task.
    pub(crate) group_size: usize,
    /// Pause between a session's calls.
    pub(crate) think: Duration,
    /// Upstream delay plus think: sessions start spread over it.
    pub(crate) cycle: Duration,
}

/// N sessions, each `calls` calls whose prompts extend the previous turn.
pub(crate) async fn round(base: &str, load: Load, admin: Option<&str>) -> Round {
    let with_sessions = admin.is_some();
    // Rollout ids are unique per round.
    static ROUNDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let round_no = ROUNDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let Load {
        sessions: n,
        calls,
        prompt_tokens,
        group_size,
        think,
        cycle,
    } = load;
    let group_size = group_size.max(1);
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
                    let new = NewSession::new(format!("load-{round_no}-{i}-{}", std::process::id()), "load", "proxy-load", format!("g{}", i / group_size)).group_size(group_size as i64);
                    match sessions.create(&new).await {
                        Ok(created) => (key, session) = (created.api_key, created.session_id),
                        Err(e) => {
                            eprintln!("error: session {i}: {e}");
                            return (latencies, calls + 1);
                        }
                    }
                }
                let mut messages = vec![json!({"role": "system", "content": "You are a load test."}), json!({"role": "user", "content": task(round_no, i / group_size, prompt_tokens)})];
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

/// Group `group`'s task in round `round`: `tokens` bytes of words, different
/// per group and round (no round finds another's prompts remembered).
fn task(round: usize, group: usize, tokens: usize) -> String {
    let i = round * 100_003 + group;
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
pub(crate) async fn drained(http: &reqwest::Client, base: &str) {
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

pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(usize::MAX)
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(300))
        .build()
        .expect("client")
}

pub(crate) async fn post(
    http: &reqwest::Client,
    url: &str,
    key: &str,
    body: &Value,
) -> Option<Value> {
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
