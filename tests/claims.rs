//! Claim checks, end to end: a turn carrying a 6 MiB image through the proxy,
//! on a log whose records may not exceed 1 MiB (a stock Kafka's limit; the
//! client here refuses more, as such a broker would). Before, that turn's
//! events were over what the broker serves: tansu acknowledged and never
//! returned them (every later reader of the partition stalled), a stock
//! Kafka refused them and the rollout stayed one call short for ever.

use base64::Engine as _;
use forgelog_api::{Finish, NewSession, SessionClient, Verdict};
use forgelog_producers::fake_upstream;
use forgelog_producers::server::ProxyConfig;
use forgelog_producers::RunningProxy;
use forgelog_schemas::{Claim, Event, Topic};
use forgelog_stream::claims::ClaimsConfig;
use forgelog_stream::testing::{unique_run_id, PrivateBroker};
use forgelog_stream::{ReplayReader, StartAt};
use serde_json::{json, Value};
use std::process::Command;
use std::time::Duration;

const ADMIN: &str = "claims-admin";

#[test]
fn a_6_mib_image_turn_is_claimed_and_every_rollout_is_built_and_exported() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let claims = dir.path().join("claims");
    // A broker of its own: the claims' store goes with the test's directory,
    // and readers of a shared log would meet claims they cannot fetch.
    let broker = PrivateBroker::start().unwrap();
    let mut config = broker.config();
    rt.block_on(forgelog_stream::admin::create_topics(
        &config,
        &Default::default(),
    ))
    .unwrap();
    config
        .extra
        .push(("message.max.bytes".into(), (1 << 20).to_string()));
    config.claims = ClaimsConfig {
        location: claims.display().to_string(),
        max_record_bytes: 1_000_000,
    };
    let (upstream, _) = rt
        .block_on(fake_upstream::spawn(
            "127.0.0.1:0".parse().unwrap(),
            Default::default(),
        ))
        .unwrap();
    let run = unique_run_id("claims");
    let proxy = rt
        .block_on(RunningProxy::start(
            ProxyConfig {
                run_id: Some(run.clone()),
                admin_token: Some(ADMIN.into()),
                ..ProxyConfig::new(format!("http://{upstream}"))
            },
            &config,
            dir.path().join("spool"),
            "127.0.0.1:0".parse().unwrap(),
        ))
        .unwrap();

    // 4.75 MB of bytes no compressor shrinks, as 6.3 MB (6.04 MiB) of base64.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let pixels: Vec<u8> = (0..4_750_000)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        })
        .collect();
    let image = base64::engine::general_purpose::STANDARD.encode(&pixels);
    assert!(image.len() > 6 << 20);
    let data_url = format!("data:image/png;base64,{image}");

    // A group of three; the second rollout's turn carries the image.
    let sessions = SessionClient::new(proxy.url(), Some(ADMIN.into()));
    let http = reqwest::Client::new();
    for i in 0..3 {
        let rollout = format!("r{i}");
        let new = NewSession::new(&rollout, "task-1", "sdk", "g1").group_size(3);
        let s = rt.block_on(sessions.create(&new)).unwrap();
        let mut content = vec![json!({"type": "text", "text": format!("What is {i} + 1?")})];
        if i == 1 {
            content.push(json!({"type": "image_url", "image_url": {"url": data_url}}));
        }
        let body = json!({"model": "m", "messages": [{"role": "user", "content": content}]});
        let r = rt
            .block_on(
                http.post(format!("{}/v1/chat/completions", proxy.url()))
                    .bearer_auth(&s.api_key)
                    .json(&body)
                    .send(),
            )
            .unwrap();
        assert_eq!(r.status(), 200, "{rollout}");
        let finish = Finish {
            exit_status: Some(0),
            verifier: Some(Verdict::scored(i as f64 / 2.0, "")),
            ..Default::default()
        };
        let done = rt
            .block_on(sessions.finish(&s.session_id, &finish))
            .unwrap();
        assert_eq!(done.model_calls, 1, "{rollout}");
    }
    rt.block_on(proxy.shutdown(Duration::from_secs(30)))
        .unwrap();

    // The log holds claims, no record over the limit, and reads back whole.
    let reader = ReplayReader::new(&config).unwrap();
    let calls = reader
        .read(Topic::Calls.name(), StartAt::Beginning, Some(&run))
        .unwrap();
    let claimed: Vec<Claim> = calls
        .iter()
        .filter_map(|r| Claim::decode(&r.value).map(Result::unwrap))
        .collect();
    assert_eq!(
        claimed.iter().map(|c| c.kind.as_str()).collect::<Vec<_>>(),
        ["CallStarted", "CallFinished"],
        "the image turn's two events, claimed"
    );
    assert!(calls
        .iter()
        .all(|r| r.key.len() + r.value.len() <= 1_000_000));
    for c in &claimed {
        let stored = std::fs::read(claims.join(&c.sha256)).unwrap();
        assert_eq!(stored.len() as u64, c.size);
        assert!(c.size > 6 << 20, "{c:?}");
    }
    let events: Vec<Event> = calls.into_iter().map(|r| r.event.unwrap()).collect();
    assert_eq!(events.len(), 6, "three calls, started and finished");
    let image_call = events
        .iter()
        .find_map(|e| match e {
            Event::CallFinished(f) if f.rollout_id == "r1" => Some(f),
            _ => None,
        })
        .unwrap();
    assert!(image_call.trainable && image_call.error.is_none());
    assert!(image_call.chat_request.contains(&image[..1000]));

    // The consumers' cores, from the log as they read it: every rollout's
    // trajectory built, the group whole. Their outputs go to the log as
    // `forgelog consume` would send them.
    let (rebuilt, _) =
        forgelog_consumers::rebuild::rebuild_and_compare(&reader, &run, Default::default())
            .unwrap();
    assert_eq!(rebuilt.trajectories.len(), 3, "every rollout's trajectory");
    assert_eq!(rebuilt.batches.len(), 1, "the group");
    let derived = [rebuilt.trajectories, rebuilt.batches].concat();
    rt.block_on(forgelog_stream::testing::produce(&config, &derived));

    // Every rollout exports.
    let out_dir = dir.path().join("sft");
    let out = Command::new(env!("CARGO_BIN_EXE_forgelog"))
        .args(["export", "sft", "--run", &run, "--brokers", &config.brokers])
        .arg("--to")
        .arg(&out_dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let jsonl = std::fs::read_to_string(out_dir.join("sdk/sft.jsonl")).unwrap();
    let rows: Vec<Value> = jsonl
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 3, "every rollout exported");
    // SFT's messages are the text chat form chat templates read: the image
    // turn is there by its text (its image stays in the log's call).
    assert_eq!(
        rows.iter()
            .filter(|r| r.to_string().contains("What is 1 + 1?"))
            .count(),
        1,
        "the image turn exported"
    );

    // `tail` resolves claims as every reader does.
    let out = Command::new(env!("CARGO_BIN_EXE_forgelog"))
        .args(["tail", "forgelog.calls", "--from-beginning", "--run", &run])
        .args(["--brokers", &config.brokers])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.lines().count(), 6);
    assert!(stdout.contains(&image[..1000]));
}
