//! Claim checks: an event too large for one record of the log is kept whole
//! in object storage under its content hash, and the log holds a small
//! `EventClaim` record (`avro/EventClaim.avsc`) in its place. Pure: the
//! claim's encoding and its check; the stream crate stores and fetches.

use crate::codec::{fingerprint, HEADER_LEN, MAGIC};
use crate::{hex, Event};
use apache_avro::Schema;
use sha2::{Digest, Sha256};
use std::sync::LazyLock;

/// What a claimed object is: one event, Avro single-object encoded.
pub const MEDIA_TYPE: &str = "application/vnd.forgelog.event+avro";

/// The record the log holds for a claimed event (fields in the schema's order).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Claim {
    pub run_id: String,
    /// The claimed event's kind.
    pub kind: String,
    /// Hex SHA-256 of the claimed bytes.
    pub sha256: String,
    pub size: u64,
    pub media_type: String,
    /// Where the bytes are.
    pub url: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error("corrupt EventClaim record: {0}")]
    Corrupt(String),
    #[error("claimed {kind} at {url}: {got} bytes with SHA-256 {got_sha256}, the claim says {size} bytes with {sha256}")]
    Mismatch {
        kind: String,
        url: String,
        size: u64,
        sha256: String,
        got: u64,
        got_sha256: String,
    },
}

struct ClaimSchema {
    schema: Schema,
    fingerprint: [u8; 8],
}

fn claim_schema() -> &'static ClaimSchema {
    static SCHEMA: LazyLock<ClaimSchema> = LazyLock::new(|| {
        let schema = Schema::parse_str(include_str!("../avro/EventClaim.avsc"))
            .expect("EventClaim.avsc parses");
        ClaimSchema {
            fingerprint: fingerprint(&schema),
            schema,
        }
    });
    &SCHEMA
}

/// The hex SHA-256 of `bytes`: a claimed object's name.
pub fn content_hash(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

impl Claim {
    /// The claim for `event`, encoded as `encoded`, stored at `url`.
    pub fn of(event: &Event, encoded: &[u8], url: String) -> Claim {
        Claim {
            run_id: event.run_id().to_string(),
            kind: event.kind().name().to_string(),
            sha256: content_hash(encoded),
            size: encoded.len() as u64,
            media_type: MEDIA_TYPE.to_string(),
            url,
        }
    }

    /// The fingerprint in a claim record's header (`avro/EventClaim.avsc`'s).
    pub fn fingerprint() -> [u8; 8] {
        claim_schema().fingerprint
    }

    /// Whether `value` (a record of the log) is a claim, by its header.
    pub fn is_claim(value: &[u8]) -> bool {
        value.len() >= HEADER_LEN
            && value[..2] == MAGIC
            && value[2..HEADER_LEN] == claim_schema().fingerprint
    }

    /// The record for the log: single-object encoded, as events are.
    pub fn encode(&self) -> Vec<u8> {
        let s = claim_schema();
        let record =
            apache_avro::to_value(self).expect("a claim is a record of strings and a long");
        let mut out = Vec::with_capacity(HEADER_LEN + 256);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&s.fingerprint);
        out.extend(
            apache_avro::to_avro_datum(&s.schema, record).expect("a claim matches its schema"),
        );
        out
    }

    /// The claim in `value`; `None` when `value` is not one.
    pub fn decode(value: &[u8]) -> Option<Result<Claim, ClaimError>> {
        if !Claim::is_claim(value) {
            return None;
        }
        let corrupt = |e: apache_avro::Error| ClaimError::Corrupt(e.to_string());
        let mut body = &value[HEADER_LEN..];
        Some(
            apache_avro::from_avro_datum(&claim_schema().schema, &mut body, None)
                .and_then(|v| apache_avro::from_value(&v))
                .map_err(corrupt),
        )
    }

    /// `bytes` if they are what this claim names (length and hash).
    pub fn check<'a>(&self, bytes: &'a [u8]) -> Result<&'a [u8], ClaimError> {
        let got_sha256 = content_hash(bytes);
        if bytes.len() as u64 != self.size || got_sha256 != self.sha256 {
            return Err(ClaimError::Mismatch {
                kind: self.kind.clone(),
                url: self.url.clone(),
                size: self.size,
                sha256: self.sha256.clone(),
                got: bytes.len() as u64,
                got_sha256,
            });
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Codec, VerifierResult};

    fn event() -> Event {
        Event::VerifierResult(VerifierResult {
            run_id: "run-7".into(),
            event_id: "e".into(),
            rollout_id: "r".into(),
            ok: true,
            reward: Some(1.0),
            details: "x".repeat(1000),
            abandoned: false,
        })
    }

    #[test]
    fn a_claim_round_trips_and_reads_as_its_run() {
        let event = event();
        let encoded = Codec::global().encode(&event).unwrap();
        let claim = Claim::of(&event, &encoded, "file:///claims/abc".into());
        let record = claim.encode();
        assert!(Claim::is_claim(&record) && !Claim::is_claim(&encoded));
        assert!(record.len() < 300, "{} bytes", record.len());
        assert_eq!(Claim::decode(&record).unwrap().unwrap(), claim);
        assert!(Claim::decode(&encoded).is_none());
        // Readers skip other runs' records by their first field, claims too.
        assert_eq!(Codec::global().peek_run_id(&record), Some("run-7"));
        assert_eq!(claim.check(&encoded).unwrap(), &encoded[..]);
        // Decoding a claim as an event says what it is.
        let err = Codec::global().decode(&record).unwrap_err().to_string();
        assert!(
            err.contains("claim check") && err.contains("VerifierResult"),
            "{err}"
        );
        // Unresolved, it still belongs to its run only.
        let received = crate::Received::decode("t", 0, 0, b"k", &record);
        assert!(received.event.is_err());
        assert!(received.in_run(Some("run-7")) && received.in_run(None));
        assert!(!received.in_run(Some("run-8")));
    }

    #[test]
    fn other_bytes_under_the_claim_are_refused() {
        let event = event();
        let encoded = Codec::global().encode(&event).unwrap();
        let claim = Claim::of(&event, &encoded, "s3://b/claims/x".into());
        let mut other = encoded.clone();
        *other.last_mut().unwrap() ^= 1;
        let err = claim.check(&other).unwrap_err().to_string();
        assert!(
            err.contains("s3://b/claims/x") && err.contains("VerifierResult"),
            "{err}"
        );
        assert!(claim.check(&encoded[1..]).is_err());
        // A cut claim record is corrupt, not a panic.
        let record = claim.encode();
        assert!(Claim::decode(&record[..record.len() - 3]).unwrap().is_err());
    }
}
