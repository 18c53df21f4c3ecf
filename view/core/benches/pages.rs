//! How long the viewer takes on big runs: the page of a 1,000-rollout run and
//! a 200-call rollout, rendered (the server's share) and, where Debian's
//! Chromium is installed, loaded and laid out by a headless browser (minus the
//! browser's start on an empty page). Prints its figures:
//! `cargo bench -p forgelog-view-core --bench pages`.

use forgelog_view_core::testing::recorded_run_with_trees;
use forgelog_view_core::{NoTokenizer, Pages, ViewIndex};
use std::path::Path;
use std::time::{Duration, Instant};

fn median(mut f: impl FnMut() -> String) -> (Duration, String) {
    let mut times = Vec::new();
    let mut out = String::new();
    for _ in 0..7 {
        let t = Instant::now();
        out = f();
        times.push(t.elapsed());
    }
    times.sort();
    (times[3], out)
}

/// Wall time of a headless Chromium loading `file` and dumping its DOM.
fn browser(file: &Path) -> Option<Duration> {
    let bin = Path::new("/usr/bin/chromium");
    if !bin.exists() {
        return None;
    }
    let profile = std::env::temp_dir().join("forgelog-view-bench-profile");
    let t = Instant::now();
    let out = std::process::Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("file://{}", file.display()))
        .output()
        .ok()?;
    out.status.success().then(|| t.elapsed())
}

fn main() {
    let dir = std::env::temp_dir().join("forgelog-view-bench");
    std::fs::create_dir_all(&dir).unwrap();
    let pages = Pages::new();
    let empty = dir.join("empty.html");
    std::fs::write(&empty, "<!doctype html><title>empty</title>").unwrap();
    let start = (0..3).filter_map(|_| browser(&empty)).min();

    let report = |name: &str, render: Duration, html: &str| {
        let file = dir.join(format!("{name}.html"));
        std::fs::write(&file, html).unwrap();
        let load = browser(&file)
            .zip(start)
            .map_or("no chromium".into(), |(l, s)| {
                format!(
                    "{:.0} ms in Chromium (+{:.0} ms its start)",
                    l.saturating_sub(s).as_secs_f64() * 1e3,
                    s.as_secs_f64() * 1e3
                )
            });
        println!(
            "{name:<24} render {:>7.1} ms, {:>6} KiB of HTML, {load}",
            render.as_secs_f64() * 1e3,
            html.len() / 1024
        );
    };

    // 250 groups of 4 rollouts of 8 calls: a 1,000-rollout run.
    let events = recorded_run_with_trees("big", 250, 4, 8, 40);
    let t = Instant::now();
    let mut index = ViewIndex::default();
    events.into_iter().for_each(|e| index.ingest(e));
    println!(
        "ingest 1,000 rollouts      {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    let log = index.run("big").unwrap();
    let (render, html) = median(|| pages.run("big", log).unwrap());
    assert_eq!(html.matches("<tr class=\"rollout\"").count(), 1000);
    report("run-1000-rollouts", render, &html);
    let (render, html) = median(|| pages.runs(&index).unwrap());
    report("runs", render, &html);

    // One rollout of 200 calls, 60 sampled tokens each.
    let events = recorded_run_with_trees("long", 1, 1, 200, 60);
    let mut index = ViewIndex::default();
    events.into_iter().for_each(|e| index.ingest(e));
    let log = index.run("long").unwrap();
    let (render, html) = median(|| {
        pages
            .rollout("long", log, "long-g0-r0", &NoTokenizer)
            .unwrap()
            .unwrap()
    });
    assert!(html.matches("<article class=\"call").count() >= 200);
    report("rollout-200-calls", render, &html);
    let longest = log
        .events
        .iter()
        .find_map(|e| match e {
            forgelog_schemas::Event::TrajectoryBuilt(t) => Some(t),
            _ => None,
        })
        .and_then(|t| (0..t.sequences.len()).max_by_key(|&i| t.sequences[i].token_ids.len()))
        .unwrap();
    let (render, html) = median(|| {
        pages
            .path("long", log, "long-g0-r0", longest, &NoTokenizer)
            .unwrap()
            .unwrap()
    });
    report("longest-path", render, &html);
}
