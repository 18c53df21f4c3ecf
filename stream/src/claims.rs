//! Claim checks ([`forgelog_schemas::Claim`]): an event too large for one
//! record of the log goes to object storage under its content hash, and the
//! log holds a small claim in its place. The producer's side stores; every
//! reader of the log resolves a claim where it reads ([`receive`]), so
//! consumers, `tail`, `report`, `export`, `view` and `replay` see the event.
//!
//! Why: a broker acknowledges records it will not serve. tansu 0.6 takes a
//! 5 MiB record and never returns it (every reader of its partition stalls
//! there); a stock Kafka refuses anything over its 1 MiB `message.max.bytes`.

use crate::store::{self, Location, StoreError};
use forgelog_schemas::{Claim, Codec, Event, Received};
use object_store::path::Path as StorePath;
use object_store::{ObjectStoreExt, PutPayload};

/// Names the claim store (an object_store URL or a path); default `claims/`
/// under the forgelog home.
pub const CLAIMS_ENV: &str = "FORGELOG_CLAIMS";
/// Names the largest record (key and value, bytes) the log holds inline.
pub const MAX_RECORD_BYTES_ENV: &str = "FORGELOG_MAX_RECORD_BYTES";
/// What a stock Kafka broker serves (`message.max.bytes` 1 MiB) with room for
/// a batch's framing; tansu 0.6 serves up to about 4.75 MiB.
pub const DEFAULT_MAX_RECORD_BYTES: usize = 1_000_000;

/// Where claimed events go, and from what size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimsConfig {
    /// An object_store URL (`file:///dir`, `s3://bucket/prefix`, ...) or a path.
    pub location: String,
    /// Records (key and value) larger than this are claimed.
    pub max_record_bytes: usize,
}

impl ClaimsConfig {
    /// From `FORGELOG_CLAIMS` and `FORGELOG_MAX_RECORD_BYTES`, else `claims/`
    /// under the forgelog home and [`DEFAULT_MAX_RECORD_BYTES`].
    pub fn from_env() -> ClaimsConfig {
        let location = std::env::var(CLAIMS_ENV)
            .ok()
            .filter(|l| !l.trim().is_empty())
            .unwrap_or_else(|| crate::forgelog_home().join("claims").display().to_string());
        let max_record_bytes = std::env::var(MAX_RECORD_BYTES_ENV)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(DEFAULT_MAX_RECORD_BYTES);
        ClaimsConfig {
            location,
            max_record_bytes,
        }
    }
}

/// The claim store, opened.
#[derive(Debug, Clone)]
pub struct ClaimStore {
    location: Location,
    max_record_bytes: usize,
}

impl ClaimStore {
    /// Opens (for a path: creates) the store `config` names.
    pub fn open(config: &ClaimsConfig) -> Result<ClaimStore, StoreError> {
        Ok(ClaimStore {
            location: store::create(&config.location)?,
            max_record_bytes: config.max_record_bytes,
        })
    }

    /// Where claimed events go, as a URL.
    pub fn url(&self) -> &url::Url {
        &self.location.url
    }

    pub fn max_record_bytes(&self) -> usize {
        self.max_record_bytes
    }

    /// What the log holds for `event`, encoded as `encoded`: the encoding
    /// itself when the record fits, else a claim, the event stored first (so
    /// a claim in the log always names bytes that are there).
    pub fn record(&self, event: &Event, encoded: Vec<u8>) -> Result<Vec<u8>, StoreError> {
        if encoded.len() + event.key().len() <= self.max_record_bytes {
            return Ok(encoded);
        }
        let name = forgelog_schemas::content_hash(&encoded);
        let url = format!(
            "{}/{name}",
            self.location.url.as_str().trim_end_matches('/')
        );
        let claim = Claim::of(event, &encoded, url);
        let (store, path) = (self.location.store.clone(), self.location.path(&name));
        block_on(async move { store.put(&path, PutPayload::from(encoded)).await }).map_err(
            |e| StoreError {
                location: claim.url.clone(),
                why: e.to_string(),
            },
        )?;
        metrics::counter!("forgelog_events_claimed_total").increment(1);
        Ok(claim.encode())
    }
}

/// A record as read from the log, a claim resolved: `value` stays the
/// record's own bytes (what the producer's recovery compares), `event` is
/// the claimed event, or an error naming the record and the claim.
pub fn receive(topic: &str, partition: i32, offset: i64, key: &[u8], value: &[u8]) -> Received {
    let mut received = Received::decode(topic, partition, offset, key, value);
    if Claim::is_claim(value) {
        received.event = decode(value)
            .map_err(|e| format!("claim check at {topic}/{partition} offset {offset}: {e}"));
    }
    received
}

/// The event a record of the log holds: itself, or the one its claim names.
pub fn decode(value: &[u8]) -> Result<Event, String> {
    Codec::global()
        .decode(&event_bytes(value)?)
        .map_err(|e| e.to_string())
}

/// The encoded event a record of the log holds: its own bytes, or the bytes
/// its claim names (fetched and checked).
pub fn event_bytes(value: &[u8]) -> Result<std::borrow::Cow<'_, [u8]>, String> {
    match Claim::decode(value) {
        None => Ok(std::borrow::Cow::Borrowed(value)),
        Some(claim) => {
            let claim = claim.map_err(|e| e.to_string())?;
            let bytes = fetch(&claim)?;
            claim.check(&bytes).map_err(|e| e.to_string())?;
            Ok(std::borrow::Cow::Owned(bytes))
        }
    }
}

/// The bytes a claim names, as its store gives them.
fn fetch(claim: &Claim) -> Result<Vec<u8>, String> {
    let object = store::open(&claim.url).map_err(|e| e.to_string())?;
    let path = StorePath::from(object.prefix.as_str());
    block_on(async move {
        let got = object.store.get(&path).await?;
        got.bytes().await
    })
    .map(|b| b.to_vec())
    .map_err(|e| format!("{}: {e}", claim.url))
}

/// Runs `f` to its end from any context (a reader's loop, a tokio task, a
/// plain thread): on a thread of its own with its own runtime. A claim is
/// rare and large, so a thread per claim costs nothing that shows.
fn block_on<F>(f: F) -> F::Output
where
    F: std::future::Future + Send,
    F::Output: Send,
{
    std::thread::scope(|s| {
        s.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for claim I/O")
                .block_on(f)
        })
        .join()
        .expect("claim I/O does not panic")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use forgelog_schemas::VerifierResult;

    fn verdict(details: usize) -> Event {
        Event::VerifierResult(VerifierResult {
            run_id: "run-c".into(),
            event_id: "e".into(),
            rollout_id: "r".into(),
            ok: true,
            reward: Some(0.5),
            details: "d".repeat(details),
            abandoned: false,
        })
    }

    #[test]
    fn a_record_over_the_limit_is_claimed_and_read_back_as_its_event() {
        let dir = tempfile::tempdir().unwrap();
        let store = ClaimStore::open(&ClaimsConfig {
            location: dir.path().display().to_string(),
            max_record_bytes: 4096,
        })
        .unwrap();
        let small = verdict(100);
        let encoded = Codec::global().encode(&small).unwrap();
        assert_eq!(store.record(&small, encoded.clone()).unwrap(), encoded);

        let big = verdict(10_000);
        let encoded = Codec::global().encode(&big).unwrap();
        let record = store.record(&big, encoded.clone()).unwrap();
        assert!(Claim::is_claim(&record) && record.len() < 4096);
        let name = forgelog_schemas::content_hash(&encoded);
        assert_eq!(std::fs::read(dir.path().join(&name)).unwrap(), encoded);
        let received = receive("t", 2, 40, b"k", &record);
        assert_eq!(received.event.unwrap(), big);
        assert_eq!(received.value, record, "the record's own bytes kept");

        // Gone or altered: an error naming the record, never a panic.
        std::fs::write(dir.path().join(&name), &encoded[1..]).unwrap();
        let err = receive("t", 2, 40, b"k", &record).event.unwrap_err();
        assert!(
            err.contains("t/2 offset 40") && err.contains("SHA-256"),
            "{err}"
        );
        std::fs::remove_file(dir.path().join(&name)).unwrap();
        let err = receive("t", 2, 40, b"k", &record).event.unwrap_err();
        assert!(
            err.contains("t/2 offset 40") && err.contains(&name),
            "{err}"
        );
    }
}
