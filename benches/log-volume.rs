//! `cargo bench --bench log-volume`: what a session costs in the log, stored as
//! what is new in each call (schema v5) and as it would be stored whole, against
//! its final transcript. Sessions recorded through a real `forgelog proxy` in
//! front of the fake upstream (its tokens are bytes): a 55-call session that
//! grows about 4,000 tokens a turn (an OpenAI SDK-style client), and one session
//! of each kit harness with a budget of 6 calls (skipped, saying so, where the
//! kit is not installed). Uses the broker at `FORGELOG_BROKERS`, or starts one.

#[path = "../tests/support/mod.rs"]
mod support;

use forgelog_api::{Finish, NewSession};
use forgelog_schemas::testing;
use support::kit::{harnesses, volume_of, KitProxy, TASK};

fn main() {
    let _broker = std::env::var_os("FORGELOG_BROKERS").is_none().then(|| {
        let b = forgelog_stream::testing::PrivateBroker::start().expect("a private broker");
        std::env::set_var("FORGELOG_BROKERS", &b.config().brokers);
        b
    });
    let rt = tokio::runtime::Runtime::new().unwrap();
    let proxy = KitProxy::start(&rt, "log-volume");

    // The growing session: each request re-sends the whole conversation.
    let session = rt
        .block_on(
            proxy
                .sessions
                .create(&NewSession::new("growing", "task", "sdk", "g")),
        )
        .unwrap();
    let http = reqwest::Client::new();
    for (started, _) in testing::growing_session("bench", "s", 55, 900) {
        let resp = rt
            .block_on(
                http.post(format!("{}/v1/chat/completions", proxy.url))
                    .bearer_auth(&session.api_key)
                    .body(started.raw_request)
                    .send(),
            )
            .unwrap();
        let status = resp.status();
        let body = rt.block_on(resp.bytes()).unwrap();
        assert!(
            status.is_success(),
            "{status}: {}",
            String::from_utf8_lossy(&body)
        );
    }
    rt.block_on(
        proxy
            .sessions
            .finish(&session.session_id, &Finish::default()),
    )
    .unwrap();

    let mut sessions = vec!["growing".to_string()];
    let installed = std::panic::catch_unwind(support::kit::require_installed).is_ok();
    if installed {
        let outs = tempfile::tempdir().unwrap();
        for h in harnesses() {
            let status = proxy.run_harness(&rt, h, 6, TASK, &outs.path().join(h));
            println!("{h}: exited {status}");
            sessions.push(h.to_string());
        }
    } else {
        println!(
            "harness sessions: skipped (the kit is not installed: deploy/harnesses/install.sh)"
        );
    }
    let events = proxy.stop();

    let mut growing = 0.0;
    let mut harness_max: f64 = 0.0;
    for rollout in &sessions {
        let v = volume_of(&events, rollout);
        println!("{rollout}: {v}");
        if rollout == "growing" {
            growing = v.ratio();
        } else {
            harness_max = harness_max.max(v.ratio());
        }
    }
    let harness = if installed {
        format!("{harness_max:.2}×")
    } else {
        "not measured".into()
    };
    println!("log bytes / final transcript: growing session {growing:.2}×, harness sessions max {harness}");
}
