//! `forgelog view` on a recorded SmolLM2 run in the real broker, looked at in
//! a real browser (headless Chromium): what the pages show is checked against
//! the log, the pages follow the log live, and a screenshot is kept.

mod support;

use forgelog_schemas::{CallFinished, Event, RolloutStarted};
use forgelog_stream::testing::{self, free_local_addr, shared_broker, unique_run_id};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::recorded;

struct Viewer(Child, String);

impl Drop for Viewer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `forgelog view --run run`, once it says it serves.
fn start_viewer(brokers: &str, run: &str) -> Viewer {
    let listen = free_local_addr().to_string();
    let mut child = Command::new(env!("CARGO_BIN_EXE_forgelog"))
        .args([
            "view",
            "--run",
            run,
            "--listen",
            &listen,
            "--brokers",
            brokers,
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let line = lines.next().expect("view exited").unwrap();
    assert!(line.contains("serving"), "{line}");
    // Keep draining its stderr so it never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    Viewer(child, format!("http://{listen}"))
}

fn chromium() -> Command {
    let bin = Path::new("/usr/bin/chromium");
    assert!(
        bin.exists(),
        "headless Chromium is missing: scripts/setup.sh installs Debian's chromium"
    );
    let profile = tempfile::tempdir().unwrap().keep();
    let mut cmd = Command::new(bin);
    // Without the background-networking flags Chromium dials out (and is refused) at start.
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1300,1400",
    ])
    .arg(format!("--user-data-dir={}", profile.display()));
    cmd
}

/// The page's DOM after the browser loaded it and ran its script.
fn dom(url: &str) -> String {
    let out = chromium().args(["--dump-dom", url]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn screenshot(url: &str, file: &Path) {
    let out = chromium()
        .arg(format!("--screenshot={}", file.display()))
        .arg(url)
        .output()
        .unwrap();
    assert!(
        out.status.success() && file.exists(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The text of the first element with `marker` in its opening tag.
fn text_after(html: &str, marker: &str) -> String {
    let at = html
        .find(marker)
        .unwrap_or_else(|| panic!("no {marker} in the page"));
    let rest = &html[at..];
    let open = rest.find('>').unwrap() + 1;
    let close = rest[open..].find('<').unwrap();
    rest[open..open + close].to_string()
}

/// The values of `data-server-sent` lines from `/live`, until `until` says stop.
fn sse_counts(base: &str, path: &str, until: impl Fn(&[u64]) -> bool) -> Vec<u64> {
    let addr = base.trim_start_matches("http://");
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n"
    )
    .unwrap();
    let mut counts = Vec::new();
    let mut buf = String::new();
    let mut chunk = [0u8; 4096];
    while !until(&counts) {
        let n = conn.read(&mut chunk).expect("live stream");
        assert!(n > 0, "live stream closed");
        buf.push_str(&String::from_utf8_lossy(&chunk[..n]));
        while let Some(end) = buf.find('\n') {
            let line: String = buf.drain(..=end).collect();
            if let Some(n) = line.trim().strip_prefix("data:") {
                counts.push(n.trim().parse().unwrap());
            }
        }
    }
    counts
}

/// A body from Chromium's DevTools HTTP endpoint (HTTP/1.1: it keeps the
/// connection open, so the body is read by its length).
fn devtools_get(port: u16, path: &str) -> Option<String> {
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(conn, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut got = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = conn.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        got.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&got);
        let Some((head, body)) = text.split_once("\r\n\r\n") else {
            continue;
        };
        let length: usize = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().to_string())
            })?
            .parse()
            .ok()?;
        if body.len() >= length {
            return Some(body[..length].to_string());
        }
    }
}

/// A page open in a headless Chromium, asked things over the DevTools protocol.
struct OpenPage {
    browser: Child,
    socket: std::cell::RefCell<tungstenite::WebSocket<std::net::TcpStream>>,
    next_id: std::cell::Cell<u64>,
}

impl OpenPage {
    fn new(url: &str) -> OpenPage {
        let port = free_local_addr().port();
        let browser = chromium()
            .arg(format!("--remote-debugging-port={port}"))
            .arg(url)
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let target = loop {
            assert!(
                Instant::now() < deadline,
                "Chromium's DevTools never listed {url}"
            );
            std::thread::sleep(Duration::from_millis(200));
            let Some(body) = devtools_get(port, "/json/list") else {
                continue;
            };
            let targets: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap_or_default();
            let page = targets
                .into_iter()
                .find(|t| t["type"] == "page" && t["url"] == url);
            if let Some(ws) =
                page.and_then(|t| t["webSocketDebuggerUrl"].as_str().map(String::from))
            {
                break ws;
            }
        };
        let stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (socket, _) = tungstenite::client(target.as_str(), stream).unwrap();
        OpenPage {
            browser,
            socket: socket.into(),
            next_id: 1.into(),
        }
    }

    /// The value of a JavaScript expression in the page, as text.
    fn eval(&self, expression: &str) -> String {
        let id = self.next_id.replace(self.next_id.get() + 1);
        let ask = serde_json::json!({
            "id": id,
            "method": "Runtime.evaluate",
            "params": {"expression": expression, "returnByValue": true},
        });
        let mut socket = self.socket.borrow_mut();
        socket
            .send(tungstenite::Message::text(ask.to_string()))
            .unwrap();
        loop {
            let reply = socket.read().unwrap();
            let Ok(reply) =
                serde_json::from_str::<serde_json::Value>(reply.to_text().unwrap_or(""))
            else {
                continue;
            };
            if reply["id"] == id {
                return match &reply["result"]["result"]["value"] {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
            }
        }
    }
}

impl Drop for OpenPage {
    fn drop(&mut self) {
        let _ = self.browser.kill();
        let _ = self.browser.wait();
    }
}

#[test]
fn the_viewer_shows_a_recorded_run_as_the_log_has_it_in_a_real_browser() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = rt.block_on(shared_broker());
    let run = unique_run_id("view");
    let events = recorded(&run);
    rt.block_on(testing::produce(&config, &events));
    let viewer = start_viewer(&config.brokers, &run);
    let base = &viewer.1;

    // The run page: every rollout, each with the reward its batch gave it.
    let page = dom(&format!("{base}/runs/{run}"));
    let rollouts: Vec<&RolloutStarted> = events
        .iter()
        .filter_map(|e| match e {
            Event::RolloutStarted(s) => Some(s),
            _ => None,
        })
        .collect();
    assert_eq!(
        text_after(&page, "id=\"rollout-count\""),
        rollouts.len().to_string()
    );
    assert_eq!(
        page.matches("<tr class=\"rollout\"").count(),
        rollouts.len()
    );
    let members: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::TrainingBatch(b) => Some(b),
            _ => None,
        })
        .flat_map(|b| b.members.clone())
        .collect();
    assert_eq!(members.len(), rollouts.len());
    for m in &members {
        let row = format!("data-rollout=\"{}\"", m.rollout_id);
        let shown = text_after(&page[page.find(&row).unwrap()..], "class=\"reward");
        let want = m.reward.map_or("not scored".into(), |r| format!("{r:.3}"));
        assert_eq!(shown, want, "rollout {}", m.rollout_id);
    }
    // The recording has one rollout its verifier did not score.
    assert!(members.iter().any(|m| m.reward.is_none()));

    // A rollout's page: its calls, and each sampled token with its logprob and
    // its text by SmolLM2's own tokenizer.
    let rollout = &rollouts[0].rollout_id;
    let calls: Vec<&CallFinished> = events
        .iter()
        .filter_map(|e| match e {
            Event::CallFinished(c) if &c.rollout_id == rollout => Some(c),
            _ => None,
        })
        .collect();
    let url = format!("{base}/runs/{run}/rollouts/{rollout}");
    let page = dom(&url);
    assert_eq!(page.matches("<article class=\"call").count(), calls.len());
    let first = calls.iter().min_by_key(|c| c.call_index).unwrap();
    let token = format!(
        "data-id=\"{}\" data-logprob=\"{:.4}\"",
        first.completion_token_ids[0], first.completion_logprobs[0]
    );
    assert!(page.contains(&token), "no {token} in {url}");
    let tokenizer =
        forgelog_model::load_tokenizer("smollm2", &forgelog_stream::models_dir()).unwrap();
    let text = tokenizer
        .decode(&first.completion_token_ids[..1], false)
        .unwrap();
    // Hovering a token shows its id, text, logprob and the version that sampled it.
    let span = &page[page.find(&token).unwrap()..];
    let span = &span[..span.find('>').unwrap()];
    let version = first.policy_version.map_or("-".into(), |v| format!("v{v}"));
    let id = first.completion_token_ids[0];
    // (The DOM quotes the attribute's own quotes.)
    let quoted = format!("{text:?}").replace('"', "&quot;");
    assert!(
        span.contains(&format!("title=\"id {id} · {quoted} · ")),
        "{span}"
    );
    assert!(
        span.contains(&format!(
            " · logprob {:.4} · {version}\"",
            first.completion_logprobs[0]
        )),
        "{span}"
    );
    assert_eq!(text_after(&page, &token), text);
    let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    screenshot(&url, &shots.join("view-rollout.png"));
    screenshot(&format!("{base}/runs/{run}"), &shots.join("view-run.png"));
    eprintln!(
        "screenshots: {}/view-run.png, view-rollout.png",
        shots.display()
    );

    // Something the log does not have is a page that says so, not an error.
    let missing = dom(&format!("{base}/runs/{run}/rollouts/nope"));
    assert!(missing.contains("has no rollout"), "{missing}");

    // Live: a rollout that starts now reaches the live stream, and a browser
    // that has the run page open shows it without a reload (the page's script).
    let counts = sse_counts(base, &format!("/runs/{run}/live"), |c| !c.is_empty());
    let open_page = OpenPage::new(&format!("{base}/runs/{run}"));
    // The count the open page shows, once it shows `want` (or panics saying what it shows).
    let wait_for = |want: usize| {
        let shown = || open_page.eval("document.getElementById('rollout-count')?.textContent");
        let deadline = Instant::now() + Duration::from_secs(20);
        while shown() != want.to_string() {
            assert!(
                Instant::now() < deadline,
                "the open page shows {}, not {want}",
                shown()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    wait_for(rollouts.len());
    let mut started = rollouts[0].clone();
    started.rollout_id = format!("{run}-late");
    started.event_id = format!("{}-late", started.event_id);
    let t0 = Instant::now();
    rt.block_on(testing::produce(&config, &[Event::from(started)]));
    let later = sse_counts(base, &format!("/runs/{run}/live"), |c| {
        c.last() > counts.first()
    });
    eprintln!(
        "a new event reached the live stream {:?} after it was sent",
        t0.elapsed()
    );
    assert_eq!(later.last(), Some(&(counts[0] + 1)));
    wait_for(rollouts.len() + 1);
    eprintln!(
        "the open page showed it {:?} after it was sent",
        t0.elapsed()
    );
    let page = open_page.eval("document.documentElement.outerHTML");
    assert!(page.contains(&format!("data-rollout=\"{run}-late\"")));
}

/// `forgelog report --html`: one self-contained page with the tables and a
/// plot per measure, that a browser shows from the file alone.
#[test]
fn the_html_report_opens_in_a_browser_with_its_plots() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = rt.block_on(shared_broker());
    let run = unique_run_id("report");
    let mut events = recorded(&run);
    for version in 1..=3i64 {
        let metrics = [
            ("loss", 0.4 / version as f64),
            ("is_ratio_mean", 1.0),
            ("is_ratio_min", 0.9),
            ("is_ratio_max", 1.1),
            ("staleness_mean", 0.0),
            ("staleness_max", 1.0),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        events.push(
            forgelog_schemas::PolicyPublished {
                run_id: run.clone(),
                event_id: format!("{run}-published-{version}"),
                version,
                step: version,
                checkpoint_uri: format!("file:///nowhere/v{version}"),
                metrics,
            }
            .into(),
        );
    }
    rt.block_on(testing::produce(&config, &events));
    let dir = tempfile::tempdir().unwrap();
    let html = dir.path().join("report.html");
    let out = Command::new(env!("CARGO_BIN_EXE_forgelog"))
        .args([
            "report",
            "--run",
            &run,
            "--brokers",
            &config.brokers,
            "--html",
        ])
        .arg(&html)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let url = format!("file://{}", html.display());
    let page = dom(&url);
    let rollouts = events
        .iter()
        .filter(|e| matches!(e, Event::RolloutStarted(_)))
        .count();
    assert_eq!(
        text_after(&page, "id=\"rollout-count\""),
        rollouts.to_string()
    );
    assert_eq!(text_after(&page, "id=\"published-count\""), "3");
    assert_eq!(page.matches("<svg").count(), 6, "a plot per measure");
    assert!(page.contains("Staleness per published version"));
    assert!(page.contains("Sampled tokens per second per policy version"));
    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("report.png");
    screenshot(&url, &shot);
    eprintln!("screenshot: {}", shot.display());
}
