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

/// A group of three through a proxy (fake upstream) on a broker of its own
/// whose client takes records up to 1 MiB (a stock Kafka's limit), the
/// second rollout's turn carrying a 6 MiB image: the log's config, the
/// base64 image, and what the proxy took as its record ceiling.
struct ImageGroup {
    _broker: PrivateBroker,
    dir: tempfile::TempDir,
    config: forgelog_stream::StreamConfig,
    run: String,
    image: String,
    max_record_bytes: usize,
}

impl ImageGroup {
    /// `topics_say`: the topics' `max.message.bytes`; `flag`: `--max-record-bytes`.
    fn record(rt: &tokio::runtime::Runtime, topics_say: Option<usize>, flag: usize) -> ImageGroup {
        let dir = tempfile::tempdir().unwrap();
        // A broker of its own: the claims' store goes with the test's
        // directory, and readers of a shared log would meet claims they
        // cannot fetch.
        let broker = PrivateBroker::start().unwrap();
        let mut config = broker.config();
        let layout = forgelog_stream::admin::TopicLayout {
            max_message_bytes: topics_say,
            ..Default::default()
        };
        rt.block_on(forgelog_stream::admin::create_topics(&config, &layout))
            .unwrap();
        config
            .extra
            .push(("message.max.bytes".into(), (1 << 20).to_string()));
        config.claims = ClaimsConfig {
            location: dir.path().join("claims").display().to_string(),
            max_record_bytes: flag,
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
        let max_record_bytes = proxy.max_record_bytes().unwrap();

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
        ImageGroup {
            _broker: broker,
            dir,
            config,
            run,
            image,
            max_record_bytes,
        }
    }

    /// The run's records on the calls topic.
    fn calls(&self) -> Vec<forgelog_stream::Received> {
        ReplayReader::new(&self.config)
            .unwrap()
            .read(Topic::Calls.name(), StartAt::Beginning, Some(&self.run))
            .unwrap()
    }

    /// Rebuilds the run's trajectories and groups with the consumers' cores
    /// from the log as they read it, and sends them to the log as `forgelog
    /// consume` would: how many of each.
    fn derive(&self, rt: &tokio::runtime::Runtime) -> (usize, usize) {
        let reader = ReplayReader::new(&self.config).unwrap();
        let (rebuilt, _) = forgelog_consumers::rebuild::rebuild_and_compare(
            &reader,
            &self.run,
            Default::default(),
        )
        .unwrap();
        let counts = (rebuilt.trajectories.len(), rebuilt.batches.len());
        let derived = [rebuilt.trajectories, rebuilt.batches].concat();
        rt.block_on(forgelog_stream::testing::produce(&self.config, &derived));
        counts
    }

    /// `forgelog ARGS... --run RUN --brokers B`, successful: its stdout.
    fn forgelog(&self, args: &[&str]) -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_forgelog"))
            .args(args)
            .args(["--run", &self.run, "--brokers", &self.config.brokers])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }
}

#[test]
fn a_6_mib_image_turn_is_claimed_and_every_rollout_is_built_and_exported() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let group = ImageGroup::record(&rt, None, 1_000_000);
    assert_eq!(
        group.max_record_bytes, 1_000_000,
        "tansu says no ceiling: the flag holds"
    );
    let image = &group.image;
    let claims = group.dir.path().join("claims");

    // The log holds claims, no record over the limit, and reads back whole.
    let calls = group.calls();
    let claimed = assert_claimed(&group, &calls, 1_000_000);
    for c in &claimed {
        let stored = std::fs::read(claims.join(&c.sha256)).unwrap();
        assert_eq!(stored.len() as u64, c.size);
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

    // The consumers: every rollout's trajectory built, the group whole.
    assert_eq!(
        group.derive(&rt),
        (3, 1),
        "every rollout's trajectory, the group"
    );

    // Every rollout exports, the image turn with its image: the message's
    // content in parts (text, then the image where it stood), the image in
    // the row's `images`, as vision-language trainers read them.
    let out_dir = group.dir.path().join("sft");
    group.forgelog(&["export", "sft", "--to", out_dir.to_str().unwrap()]);
    let jsonl = std::fs::read_to_string(out_dir.join("sdk/sft.jsonl")).unwrap();
    let rows: Vec<Value> = jsonl
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 3, "every rollout exported");
    let with_image: Vec<&Value> = rows.iter().filter(|r| r.get("images").is_some()).collect();
    let [row] = &with_image[..] else {
        panic!("one row with images expected: {jsonl:.2000}")
    };
    assert_eq!(
        row["images"],
        json!([format!("data:image/png;base64,{image}")])
    );
    assert_eq!(
        row["messages"][0]["content"],
        json!([{"type": "text", "text": "What is 1 + 1?"}, {"type": "image"}])
    );
    assert!(rows
        .iter()
        .filter(|r| r.get("images").is_none())
        .all(|r| r["messages"][0]["content"].is_string()));

    // `tail` resolves claims as every reader does.
    let stdout = group.forgelog(&["tail", "forgelog.calls", "--from-beginning"]);
    assert_eq!(stdout.lines().count(), 6);
    assert!(stdout.contains(&image[..1000]));
}

/// The image turn's two events are claims, every record of the log within
/// `ceiling`, the claims' objects larger than 6 MiB: the claims.
fn assert_claimed(
    group: &ImageGroup,
    calls: &[forgelog_stream::Received],
    ceiling: usize,
) -> Vec<Claim> {
    let claimed: Vec<Claim> = calls
        .iter()
        .filter_map(|r| Claim::decode(&r.value).map(Result::unwrap))
        .collect();
    assert_eq!(
        claimed.iter().map(|c| c.kind.as_str()).collect::<Vec<_>>(),
        ["CallStarted", "CallFinished"],
        "the image turn's two events, claimed"
    );
    assert!(calls.iter().all(|r| r.key.len() + r.value.len() <= ceiling));
    assert!(claimed.iter().all(|c| c.size > 6 << 20), "{claimed:?}");
    assert_eq!(
        calls.iter().filter(|r| r.event.is_ok()).count(),
        6,
        "{}",
        group.run
    );
    claimed
}

/// Topics that say their `max.message.bytes` (a stock Kafka's always do;
/// tansu's when created with it): the proxy takes the lower of that and its
/// flag as the ceiling, so a flag above what the broker takes still never
/// sends a record it refuses.
#[test]
fn the_proxy_takes_the_ceiling_the_brokers_topics_say() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let group = ImageGroup::record(&rt, Some(1 << 20), 8_000_000);
    assert_eq!(group.max_record_bytes, (1 << 20) - (1 << 15));
    assert_claimed(&group, &group.calls(), group.max_record_bytes);
    assert_eq!(group.derive(&rt), (3, 1));
}

/// A record the broker refuses for good (here: over its limit, with the
/// ceiling set above it and the broker saying nothing) is parked in the
/// proxy's spool; a call's event is stood in for in the log by its tokens,
/// so the rollout counts every call: every trajectory is built, the group
/// whole, and `report` counts the stand-in. Before, the rollout stayed a
/// call short for ever.
#[test]
fn a_call_the_broker_refuses_is_stood_in_for_and_its_rollout_is_built() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let group = ImageGroup::record(&rt, None, 8_000_000);
    assert_eq!(group.max_record_bytes, 8_000_000);
    let calls = group.calls();
    assert!(calls.iter().all(|r| !Claim::is_claim(&r.value)));
    let events: Vec<Event> = calls.into_iter().map(|r| r.event.unwrap()).collect();
    let kinds = |rollout: &str| {
        events
            .iter()
            .filter(|e| match e {
                Event::CallStarted(c) => c.rollout_id == rollout,
                Event::CallFinished(c) => c.rollout_id == rollout,
                _ => false,
            })
            .map(|e| e.kind().name())
            .collect::<Vec<_>>()
    };
    assert_eq!(kinds("r0"), ["CallStarted", "CallFinished"]);
    assert_eq!(
        kinds("r1"),
        ["CallFinished"],
        "its CallStarted parked, no stand-in"
    );
    let stand_in = events
        .iter()
        .find_map(|e| match e {
            Event::CallFinished(f) if f.rollout_id == "r1" => Some(f),
            _ => None,
        })
        .unwrap();
    let why = stand_in.stand_in.as_deref().unwrap();
    assert!(why.contains("too large"), "{why}");
    assert!(!stand_in.trainable && stand_in.chat_request.is_empty());
    assert!(!stand_in.prompt_token_ids.is_empty() && !stand_in.completion_token_ids.is_empty());
    let status = forgelog_stream::SpoolStatus::read(&group.dir.path().join("spool")).unwrap();
    assert_eq!(
        status
            .parked
            .iter()
            .map(|p| p.topic.as_str())
            .collect::<Vec<_>>(),
        [Topic::Calls.name(); 2],
        "both of the turn's events parked whole"
    );
    assert_eq!(status.pending, 0);

    assert_eq!(
        group.derive(&rt),
        (3, 1),
        "every rollout's trajectory, the group"
    );
    let report = group.forgelog(&["report"]);
    assert!(report.contains("STAND-INS: 1 calls"), "{report}");
}
