//! The log read outside forgelog: `schemas/python/forgelog_avro.py` (fastavro
//! and the `.avsc` files) finds every schema by the fingerprint forgelog writes,
//! and reads a recorded topic as forgelog does.

use forgelog_schemas::compact::SessionMemory;
use forgelog_schemas::{schema_files, testing, Event, Topic};
use forgelog_stream::testing::{shared_broker, unique_run_id, venv_python};
use forgelog_stream::{ReplayReader, StartAt};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn reader_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/python/forgelog_avro.py")
}

fn python(args: &[&str]) -> String {
    let out = Command::new(venv_python())
        .arg(reader_script())
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "forgelog_avro.py {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn every_schema_has_the_fingerprint_fastavro_computes() {
    let theirs: Value = serde_json::from_str(&python(&["fingerprints"])).unwrap();
    let ours = schema_files();
    // The events' schemas, and the claim check's.
    assert_eq!(
        theirs.as_object().unwrap().len(),
        ours.len() + 1,
        "{theirs}"
    );
    assert_eq!(
        theirs["EventClaim.avsc"],
        forgelog_schemas::hex(&forgelog_schemas::Claim::fingerprint()).as_str()
    );
    for f in ours {
        assert_eq!(
            theirs[&f.file],
            forgelog_schemas::hex(&f.fingerprint).as_str(),
            "{}",
            f.file
        );
    }
}

#[test]
fn the_python_reader_reads_a_recorded_topic_as_forgelog_does() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let stream = rt.block_on(shared_broker());
    let run = unique_run_id("python-reader");
    // A run of every kind of call-side event, calls stored compactly as the
    // proxy stores them.
    let mut events = testing::recorded_run(&run, 2, 2, 3, 40);
    let mut memory = SessionMemory::default();
    for (mut s, mut f) in testing::growing_session(&run, "s-growing", 6, 50) {
        memory.remember(memory.compact_started(&mut s));
        memory.remember(memory.compact_finished(&mut f));
        events.push(s.into());
        events.push(f.into());
    }
    rt.block_on(forgelog_stream::testing::produce(&stream, &events));

    // The topics' raw values, as any Kafka client gets them, then the
    // committed fixture (recorded through the proxy before forgelog wrote the
    // specification's fingerprints).
    let reader = ReplayReader::new(&stream).unwrap();
    let mut file = Vec::new();
    let mut expected: Vec<Event> = Vec::new();
    for topic in [Topic::Calls, Topic::Rollouts, Topic::Rewards] {
        for r in reader
            .read(topic.name(), StartAt::Beginning, Some(&run))
            .unwrap()
        {
            file.extend_from_slice(&(r.value.len() as u32).to_le_bytes());
            file.extend_from_slice(&r.value);
            expected.push(r.event.unwrap());
        }
    }
    assert_eq!(expected.len(), events.len());
    let fixture = forgelog_replay_tests::fixture_dir().join("events.bin");
    let fixture_bytes = std::fs::read(&fixture).unwrap();
    file.extend_from_slice(&fixture_bytes);
    expected.extend(forgelog_replay_tests::fixture().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.bin");
    std::fs::write(&path, &file).unwrap();

    let lines: Vec<Value> = python(&["read", path.to_str().unwrap()])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), expected.len());
    let b64 = |v: &Value| {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD
            .decode(v["base64"].as_str().unwrap())
            .unwrap()
    };
    for (line, event) in lines.iter().zip(&expected) {
        let ours = serde_json::to_value(event).unwrap();
        assert_eq!(line["type"], ours["type"]);
        assert_eq!(line["event_id"], ours["event_id"]);
        assert_eq!(line["run_id"], ours["run_id"]);
        match event {
            Event::CallFinished(c) => {
                let ids = b64(&line["prompt_token_ids"]);
                let packed: Vec<u8> = c
                    .prompt_token_ids
                    .iter()
                    .flat_map(|t| t.to_le_bytes())
                    .collect();
                assert_eq!(ids, packed);
                let splice = c.prompt_splice.map(|s| serde_json::json!({"base_call": s.base_call, "prefix": s.prefix, "suffix": s.suffix}));
                assert_eq!(line["prompt_splice"], splice.unwrap_or(Value::Null));
                assert_eq!(line["chat_request"], c.chat_request.as_str());
            }
            Event::CallStarted(s) => assert_eq!(b64(&line["raw_request"]), s.raw_request),
            Event::RolloutStarted(r) => {
                assert_eq!(line["group_size"], r.group_size);
                assert_eq!(line["started_at_ms"], r.started_at_ms);
            }
            Event::VerifierResult(v) => assert_eq!(line["reward"], serde_json::json!(v.reward)),
            _ => {}
        }
    }
    assert!(expected
        .iter()
        .any(|e| matches!(e, Event::CallFinished(c) if c.prompt_splice.is_some())));
}
