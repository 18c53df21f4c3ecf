use super::*;
use std::io::Write;

fn options(segment_bytes: u64) -> SpoolOptions {
    SpoolOptions {
        segment_bytes,
        max_bytes: 1 << 30,
        fsync: FsyncPolicy::Never,
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
