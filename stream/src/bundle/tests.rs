use super::*;
use crate::MemoryLog;
use forgelog_schemas::testing::recorded_run;

fn log_of_two_runs() -> MemoryLog {
    let log = MemoryLog::new(3);
    for e in recorded_run("run-a", 2, 2, 2, 8)
        .iter()
        .chain(&recorded_run("run-b", 1, 2, 2, 8))
    {
        log.append(e).unwrap();
    }
    log
}

#[test]
fn a_bundle_reads_back_as_its_run_in_the_log() {
    let log = log_of_two_runs();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.avro");
    let written = write_bundle(&log, "run-a", &path, BTreeMap::new()).unwrap();
    let bundle = Bundle::open(&path).unwrap();
    assert_eq!(bundle.manifest, written);
    assert_eq!(bundle.run(), "run-a");
    let mut total = 0;
    for topic in Topic::ALL {
        let (ours, theirs) = (
            bundle.read_run(topic.name(), "run-a").unwrap(),
            log.read_run(topic.name(), "run-a").unwrap(),
        );
        let at = |r: &[Received]| -> Vec<(i32, i64, Vec<u8>)> {
            r.iter()
                .map(|r| (r.partition, r.offset, r.value.clone()))
                .collect()
        };
        assert_eq!(at(&ours), at(&theirs), "{}", topic.name());
        total += ours.len() as u64;
        // None of the other run's.
        assert!(bundle.read_run(topic.name(), "run-b").unwrap().is_empty());
    }
    assert_eq!(total, written.records);
    assert!(written.records > 0);
}

#[test]
fn a_run_the_log_does_not_hold_is_no_bundle() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("none.avro");
    let err = write_bundle(&log_of_two_runs(), "run-c", &path, BTreeMap::new());
    assert!(matches!(err, Err(BundleError::Empty(_))), "{err:?}");
    assert!(!path.exists(), "nothing written");
}

/// Avro's reader skips an `avro.` key it does not know: an altered
/// `avro.codec` key opened, read as uncompressed, until the header's keys
/// were checked.
#[test]
fn an_altered_avro_key_in_the_header_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.avro");
    write_bundle(&log_of_two_runs(), "run-a", &path, BTreeMap::new()).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    let key = b"avro.codec";
    let at = bytes.windows(key.len()).position(|w| w == key).unwrap();
    bytes[at + key.len() - 1] ^= 0x01; // avro.codeb
    std::fs::write(&path, &bytes).unwrap();
    let err = Bundle::open(&path).expect_err("refused").to_string();
    assert!(err.contains("header's keys are"), "{err}");
    assert!(err.contains("avro.codeb"), "{err}");
}

/// `--bundle /dev/null`, or a file truncated to nothing, to less than
/// Avro's magic or inside the header: said in those words, not as Avro's
/// "failed to fill whole buffer".
#[test]
fn an_empty_or_cut_short_file_is_named_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.avro");
    std::fs::write(&path, b"").unwrap();
    for empty in [path.as_path(), Path::new("/dev/null")] {
        let err = Bundle::open(empty).expect_err("refused").to_string();
        assert!(
            err.contains("not a forgelog bundle: it is empty (0 bytes)"),
            "{err}"
        );
    }
    std::fs::write(&path, b"Obj").unwrap();
    let err = Bundle::open(&path).expect_err("refused").to_string();
    assert!(err.contains("it is cut short: 3 bytes"), "{err}");
    // Avro's magic and nothing more, or a real bundle cut inside its header.
    std::fs::write(&path, b"Obj\x01").unwrap();
    let err = Bundle::open(&path).expect_err("refused").to_string();
    assert!(
        err.contains("it is cut short: 4 bytes, ending inside its header"),
        "{err}"
    );
    write_bundle(&log_of_two_runs(), "run-a", &path, BTreeMap::new()).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..40]).unwrap();
    let err = Bundle::open(&path).expect_err("refused").to_string();
    assert!(
        err.contains("it is cut short: 40 bytes, ending inside its header"),
        "{err}"
    );
}

#[test]
fn every_changed_byte_or_cut_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.avro");
    write_bundle(&log_of_two_runs(), "run-a", &path, BTreeMap::new()).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let bad = dir.path().join("bad.avro");
    // Every 97th byte flipped in turn, and cuts at as many places: none
    // opens (the header's magic, metadata, a record, a sync marker).
    for at in (0..bytes.len()).step_by(97) {
        let mut changed = bytes.clone();
        changed[at] ^= 0x01;
        std::fs::write(&bad, &changed).unwrap();
        assert!(Bundle::open(&bad).is_err(), "byte {at} flipped opened");
        std::fs::write(&bad, &bytes[..at]).unwrap();
        assert!(Bundle::open(&bad).is_err(), "cut at {at} opened");
    }
}
