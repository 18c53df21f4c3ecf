use super::segment::segments;
use super::*;
use std::io::Write;

fn options(segment_bytes: u64) -> SpoolOptions {
    SpoolOptions {
        segment_bytes,
        max_bytes: 1 << 30,
        fsync: FsyncPolicy::Never,
        ..SpoolOptions::default()
    }
}

fn drain_all(spool: &Spool, from: u64) -> Vec<SpoolRecord> {
    let mut r = spool.reader(from);
    std::iter::from_fn(|| r.next_record().unwrap()).collect()
}

#[test]
fn appends_read_back_in_order_across_segments() {
    let dir = tempfile::tempdir().unwrap();
    let spool = Spool::open(dir.path(), options(256)).unwrap();
    for i in 0..100u64 {
        assert_eq!(
            spool
                .append("t", format!("k{i}").as_bytes(), &[i as u8; 40])
                .unwrap(),
            i
        );
    }
    assert!(segments(dir.path()).unwrap().len() > 10);
    let recs = drain_all(&spool, 0);
    assert_eq!(recs.len(), 100);
    assert!(recs
        .iter()
        .enumerate()
        .all(|(i, r)| r.seq == i as u64 && r.value == vec![i as u8; 40]));
    assert_eq!(drain_all(&spool, 57)[0].seq, 57);
}

#[test]
fn reopening_cuts_a_torn_tail_and_continues_the_sequence() {
    let dir = tempfile::tempdir().unwrap();
    {
        let spool = Spool::open(dir.path(), options(1 << 20)).unwrap();
        for i in 0..10u8 {
            spool.append("t", b"k", &[i]).unwrap();
        }
    }
    let (_, last) = segments(dir.path()).unwrap().pop().unwrap();
    let mut f = OpenOptions::new().append(true).open(&last).unwrap();
    f.write_all(&[9, 0, 0, 0, 1, 2]).unwrap(); // half a frame, as a crash mid-write leaves it
    drop(f);
    let spool = Spool::open(dir.path(), options(1 << 20)).unwrap();
    assert_eq!(spool.next_seq(), 10);
    assert_eq!(spool.append("t", b"k", b"after").unwrap(), 10);
    let recs = drain_all(&spool, 0);
    assert_eq!(recs.len(), 11);
    assert_eq!(recs[10].value, b"after");
}

#[test]
fn corrupt_record_is_not_returned() {
    let dir = tempfile::tempdir().unwrap();
    {
        let spool = Spool::open(dir.path(), options(1 << 20)).unwrap();
        spool.append("t", b"k", b"one").unwrap();
        spool.append("t", b"k", b"two").unwrap();
    }
    let (_, last) = segments(dir.path()).unwrap().pop().unwrap();
    let mut bytes = fs::read(&last).unwrap();
    let n = bytes.len();
    bytes[n - 1] ^= 0xFF; // flip a bit in the second record's value
    fs::write(&last, bytes).unwrap();
    let spool = Spool::open(dir.path(), options(1 << 20)).unwrap();
    let recs = drain_all(&spool, 0);
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].value, b"one");
}

#[test]
fn full_spool_refuses_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let spool = Spool::open(
        dir.path(),
        SpoolOptions {
            max_bytes: 200,
            ..options(1 << 20)
        },
    )
    .unwrap();
    let mut accepted = 0;
    let err = loop {
        match spool.append("t", b"k", &[0; 50]) {
            Ok(_) => accepted += 1,
            Err(e) => break e,
        }
    };
    assert!(accepted >= 1);
    assert!(matches!(err, SpoolError::Full { .. }));
    assert!(err.to_string().contains("full"), "{err}");
    assert_eq!(drain_all(&spool, 0).len(), accepted);
}

#[test]
fn acknowledged_segments_are_deleted_and_resume_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let spool = Spool::open(dir.path(), options(128)).unwrap();
    for i in 0..50u8 {
        spool.append("t", b"k", &[i; 30]).unwrap();
    }
    let before = spool.bytes();
    let cp = Checkpoint {
        acked_through: 40,
        ..Default::default()
    };
    spool.acknowledge(&cp).unwrap();
    assert!(spool.bytes() < before);
    assert_eq!(spool.pending(), 10);
    drop(spool);
    let spool = Spool::open(dir.path(), options(128)).unwrap();
    assert_eq!(spool.acked(), 40);
    let recs = drain_all(&spool, spool.acked());
    assert_eq!(
        recs.iter().map(|r| r.seq).collect::<Vec<_>>(),
        (40..50).collect::<Vec<_>>()
    );
}

#[test]
fn one_writer_per_directory() {
    let dir = tempfile::tempdir().unwrap();
    let spool = Spool::open(dir.path(), options(1 << 20)).unwrap();
    spool.append("t", b"k", b"one").unwrap();
    let err = Spool::open(dir.path(), options(1 << 20))
        .err()
        .expect("a second writer is refused");
    assert!(matches!(err, SpoolError::InUse { .. }), "{err}");
    drop(spool);
    let spool = Spool::open(dir.path(), options(1 << 20)).unwrap();
    assert_eq!(spool.next_seq(), 1);
}

/// `spool status` on a running producer's spool, whose last record is being
/// written at that moment, used to cut that record off as a torn tail: the
/// producer's next records then sat behind a gap for good.
#[test]
fn status_reads_a_spool_in_use_without_writing_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let spool = Spool::open(dir.path(), options(1 << 20)).unwrap();
    for i in 0..5u8 {
        spool.append("t", b"k", &[i; 10]).unwrap();
    }
    let (_, last) = segments(dir.path()).unwrap().pop().unwrap();
    // Half of the next frame, as a concurrent `status` can see it mid-write.
    let mut half = Vec::new();
    SpoolRecord::encode_into(5, "t", b"k", &[5; 10], &mut half);
    let (head, tail) = half.split_at(half.len() / 2);
    OpenOptions::new()
        .append(true)
        .open(&last)
        .unwrap()
        .write_all(head)
        .unwrap();
    let before = fs::read(&last).unwrap();

    let status = SpoolStatus::read(dir.path()).unwrap();
    assert!(status.in_use);
    assert_eq!(status.pending, 5);
    assert_eq!(status.incomplete_tail, head.len() as u64);
    assert_eq!(
        fs::read(&last).unwrap(),
        before,
        "status wrote to the spool"
    );

    // The writer finishes its record: it is read back whole, after the others.
    OpenOptions::new()
        .append(true)
        .open(&last)
        .unwrap()
        .write_all(tail)
        .unwrap();
    spool.shared.next_seq.store(6, Ordering::Release);
    assert_eq!(drain_all(&spool, 0).len(), 6);
    drop(spool);
    let status = SpoolStatus::read(dir.path()).unwrap();
    assert!(!status.in_use);
    assert_eq!((status.pending, status.incomplete_tail), (6, 0));
}

#[test]
fn parked_records_are_listed_with_their_reason_and_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let spool = Spool::open(dir.path(), options(1 << 20)).unwrap();
    spool.append("calls", b"k", &[7; 100]).unwrap();
    let rec = drain_all(&spool, 0).remove(0);
    let parked = spool.park(&rec, "too large").unwrap();
    let listed = ParkedRecord::list(dir.path()).unwrap();
    assert_eq!(listed, vec![parked.clone()]);
    assert_eq!(
        (parked.seq, parked.topic.as_str(), parked.reason.as_str()),
        (0, "calls", "too large")
    );
    assert_eq!(parked.record(dir.path()).unwrap(), Some(rec));
    assert_eq!(SpoolStatus::read(dir.path()).unwrap().parked.len(), 1);
}
