//! Avro single-object encoding with a registry of writer schemas, so that
//! events written by older schema versions still decode into today's types.

use crate::{datum, Claim, Event, EventKind};
use apache_avro::{rabin::Rabin, Schema};
use std::collections::HashMap;
use std::sync::LazyLock;

pub(crate) const MAGIC: [u8; 2] = [0xC3, 0x01];
pub(crate) const HEADER_LEN: usize = 10;

/// The version of the schemas in `avro/`: one more than the newest in [`HISTORY`].
pub const SCHEMA_VERSION: u32 = 7;

/// Schemas of earlier versions, still readable: `(kind, version, avsc text)`,
/// the file being `avro/history/<version>/<kind>.avsc`.
///
/// When a schema in `avro/` changes, copy the old file to `avro/history/vN/` and
/// list it here; the fixture test in `tests/` proves old events still decode.
pub const HISTORY: &[(EventKind, &str, &str)] = &[
    (
        EventKind::CallFinished,
        "v1",
        include_str!("../avro/history/v1/CallFinished.avsc"),
    ),
    (
        EventKind::VerifierResult,
        "v2",
        include_str!("../avro/history/v2/VerifierResult.avsc"),
    ),
    (
        EventKind::RolloutStarted,
        "v3",
        include_str!("../avro/history/v3/RolloutStarted.avsc"),
    ),
    (
        EventKind::CallStarted,
        "v4",
        include_str!("../avro/history/v4/CallStarted.avsc"),
    ),
    (
        EventKind::CallFinished,
        "v4",
        include_str!("../avro/history/v4/CallFinished.avsc"),
    ),
    (
        EventKind::CallFinished,
        "v5",
        include_str!("../avro/history/v5/CallFinished.avsc"),
    ),
    (
        EventKind::CallFinished,
        "v6",
        include_str!("../avro/history/v6/CallFinished.avsc"),
    ),
];

#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    #[error("{kind} does not match its schema: {source}")]
    Schema {
        kind: &'static str,
        source: Box<apache_avro::Error>,
    },
    #[error("{kind} does not match its schema: {source}")]
    Datum {
        kind: &'static str,
        source: datum::DatumError,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("not a forgelog event: {len} bytes without the Avro single-object header C3 01")]
    NotSingleObject { len: usize },
    #[error("a claim check for a {kind} event of {size} bytes at {url}, not the event: read it through forgelog_stream, which fetches it")]
    Claim {
        kind: String,
        size: u64,
        url: String,
    },
    #[error("unknown schema fingerprint {0:016x}: written by a schema this build does not know (newer forgelog, or not a forgelog event)")]
    UnknownFingerprint(u64),
    #[error("corrupt {kind}: {len} bytes left after the record")]
    TrailingBytes { kind: &'static str, len: usize },
    #[error("corrupt {kind}: the body ends inside the record")]
    Truncated { kind: &'static str },
    #[error("corrupt {kind} body: {source}")]
    Body {
        kind: &'static str,
        source: Box<apache_avro::Error>,
    },
}

/// A body as the datum reader reads it, noting a read past its end: a whole
/// record is never read past, but apache-avro reads a nullable union it
/// finds no bytes for as null, so a body cut just before a trailing optional
/// field would decode, the field lost.
struct Body<'a> {
    rest: &'a [u8],
    ran_out: bool,
}

impl std::io::Read for Body<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.rest.len() < buf.len() {
            self.ran_out = true;
        }
        self.rest.read(buf)
    }
}

struct Writer {
    kind: EventKind,
    schema: Schema,
    /// Written by today's schema: decoding needs no resolution.
    current: bool,
}

/// Encodes and decodes [`Event`]s. Cheap to share; use [`Codec::global`].
pub struct Codec {
    current: HashMap<EventKind, Current>,
    writers: HashMap<u64, Writer>,
}

/// The schema events of a kind are written with.
#[derive(Debug)]
struct Current {
    schema: Schema,
    fingerprint: [u8; 8],
    names: datum::Names,
}

/// The schema's fingerprint as the specification defines it: CRC-64-AVRO of
/// its Parsing Canonical Form, little-endian (what fastavro and Java readers
/// look events up by).
pub fn fingerprint(schema: &Schema) -> [u8; 8] {
    crc64_avro(canonical_form(schema).as_bytes()).to_le_bytes()
}

/// The fingerprint forgelog wrote before it wrote the specification's (events
/// recorded until then carry it): apache-avro's, whose canonical form keeps
/// `{"type":"long"}` where a `timestamp-millis` field was.
pub fn legacy_fingerprint(schema: &Schema) -> [u8; 8] {
    schema
        .fingerprint::<Rabin>()
        .bytes
        .try_into()
        .expect("CRC-64-AVRO is 8 bytes")
}

/// A schema file forgelog reads: `avro/<Kind>.avsc` (today's) or
/// `avro/history/<version>/<Kind>.avsc`, with its fingerprint and, where
/// different, the one forgelog wrote before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaFile {
    /// The path under `avro/`.
    pub file: String,
    pub kind: EventKind,
    pub fingerprint: [u8; 8],
    pub legacy_fingerprint: [u8; 8],
}

/// Every schema file, today's first.
pub fn schema_files() -> Vec<SchemaFile> {
    let current = EventKind::ALL
        .iter()
        .map(|&k| (format!("{}.avsc", k.name()), k, k.avsc()));
    let history = HISTORY
        .iter()
        .map(|&(k, v, avsc)| (format!("history/{v}/{}.avsc", k.name()), k, avsc));
    current
        .chain(history)
        .map(|(file, kind, avsc)| {
            let schema = parse(kind, avsc);
            SchemaFile {
                file,
                kind,
                fingerprint: fingerprint(&schema),
                legacy_fingerprint: legacy_fingerprint(&schema),
            }
        })
        .collect()
}

/// The Parsing Canonical Form. apache-avro's strips a logical type's attribute
/// but leaves `{"type":"long"}`, where the specification's [PRIMITIVES] rule
/// writes the primitive's simple form, `"long"`. In canonical form such an
/// object can only be a primitive schema (names cannot hold quotes or braces).
fn canonical_form(schema: &Schema) -> String {
    const PRIMITIVES: [&str; 8] = [
        "null", "boolean", "int", "long", "float", "double", "bytes", "string",
    ];
    let mut form = schema.canonical_form();
    for p in PRIMITIVES {
        form = form.replace(&format!(r#"{{"type":"{p}"}}"#), &format!(r#""{p}""#));
    }
    form
}

/// CRC-64-AVRO (the specification's Rabin fingerprint) of `bytes`.
fn crc64_avro(bytes: &[u8]) -> u64 {
    const EMPTY: u64 = 0xc15d_213a_a4d7_a795;
    static TABLE: LazyLock<[u64; 256]> = LazyLock::new(|| {
        let mut table = [0u64; 256];
        for (i, entry) in table.iter_mut().enumerate() {
            let mut fp = i as u64;
            for _ in 0..8 {
                fp = (fp >> 1) ^ (EMPTY & (fp & 1).wrapping_neg());
            }
            *entry = fp;
        }
        table
    });
    bytes.iter().fold(EMPTY, |fp, &b| {
        (fp >> 8) ^ TABLE[((fp ^ u64::from(b)) & 0xff) as usize]
    })
}

/// Whether a record schema's first field is `run_id`, a string.
fn starts_with_run_id(schema: &Schema) -> bool {
    matches!(schema, Schema::Record(r)
        if r.fields.first().is_some_and(|f| f.name == "run_id" && f.schema == Schema::String))
}

fn parse(kind: EventKind, avsc: &str) -> Schema {
    Schema::parse_str(avsc).unwrap_or_else(|e| panic!("schema {} does not parse: {e}", kind.name()))
}

impl Codec {
    fn new() -> Codec {
        Codec::with_history(HISTORY)
    }

    /// A codec that also reads events written by the given older schemas.
    pub fn with_history(history: &[(EventKind, &str, &str)]) -> Codec {
        // Packed per-token arrays serialize as bytes only for non-human-readable
        // serializers; Avro's serde is human-readable unless told otherwise.
        // Only the first call sets it; later calls report the value in force.
        assert!(
            !apache_avro::util::set_serde_human_readable(false),
            "apache-avro serde was already set human-readable by someone else"
        );
        let mut current = HashMap::new();
        let mut writers = HashMap::new();
        // Each writer schema under the specification's fingerprint and, where
        // it differs, the one forgelog wrote before (old logs still decode).
        let mut register = |kind: EventKind, schema: Schema, is_current: bool| {
            assert!(
                starts_with_run_id(&schema),
                "schema {} must start with `run_id` (a string): readers skip other runs' events by it",
                kind.name()
            );
            for fp in [fingerprint(&schema), legacy_fingerprint(&schema)] {
                writers.insert(
                    u64::from_le_bytes(fp),
                    Writer {
                        kind,
                        schema: schema.clone(),
                        current: is_current,
                    },
                );
            }
        };
        for &kind in EventKind::ALL {
            let schema = parse(kind, kind.avsc());
            let names = datum::Names::of(&schema)
                .unwrap_or_else(|e| panic!("schema {} does not resolve: {e}", kind.name()));
            current.insert(
                kind,
                Current {
                    fingerprint: fingerprint(&schema),
                    schema: schema.clone(),
                    names,
                },
            );
            register(kind, schema, true);
        }
        for &(kind, _, avsc) in history {
            register(kind, parse(kind, avsc), false);
        }
        Codec { current, writers }
    }

    /// The process-wide codec (schemas are parsed once).
    pub fn global() -> &'static Codec {
        static CODEC: LazyLock<Codec> = LazyLock::new(Codec::new);
        &CODEC
    }

    /// The current schema of `kind` and its fingerprint.
    pub fn schema(&self, kind: EventKind) -> (&Schema, u64) {
        let current = &self.current[&kind];
        (&current.schema, u64::from_le_bytes(current.fingerprint))
    }

    /// The record a log holds in place of the encoded event `value` that a
    /// broker refused for good (`reason`): a call's stand-in
    /// ([`crate::CallFinished::stand_in_for`]); `None` for any other record
    /// (it stays refused). A pure function of its input: a producer that
    /// retries after a crash sends the same bytes.
    pub fn stand_in(&self, value: &[u8], reason: &str) -> Option<Vec<u8>> {
        match self.decode(value).ok()? {
            Event::CallFinished(call) => self
                .encode(&Event::CallFinished(call.stand_in_for(reason)))
                .ok(),
            _ => None,
        }
    }

    pub fn encode(&self, event: &Event) -> Result<Vec<u8>, EncodeError> {
        let mut out = Vec::new();
        self.encode_into(event, &mut out)?;
        Ok(out)
    }

    /// Appends the encoded event to `out`.
    pub fn encode_into(&self, event: &Event, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let kind = event.kind();
        let current = &self.current[&kind];
        let value = event.to_avro().map_err(|e| EncodeError::Schema {
            kind: kind.name(),
            source: Box::new(e),
        })?;
        let start = out.len();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&current.fingerprint);
        datum::write(&value, &current.schema, &current.names, out).map_err(|source| {
            out.truncate(start);
            EncodeError::Datum {
                kind: kind.name(),
                source,
            }
        })
    }

    /// The kind of an encoded event, read from its header without decoding the body.
    pub fn peek_kind(&self, bytes: &[u8]) -> Result<EventKind, DecodeError> {
        Ok(self.writer(bytes)?.kind)
    }

    /// The run of an encoded event, read from the start of its body without
    /// decoding the rest (every schema, in every version, starts with
    /// `run_id`): a reader looking for one run skips the others' events at
    /// this cost. `None` when `bytes` is not an event this codec knows.
    pub fn peek_run_id<'a>(&self, bytes: &'a [u8]) -> Option<&'a str> {
        if !Claim::is_claim(bytes) {
            self.writer(bytes).ok()?;
        }
        let body = &bytes[HEADER_LEN..];
        let (len, at) = datum::read_long(body)?;
        let text = body.get(at..at.checked_add(usize::try_from(len).ok()?)?)?;
        std::str::from_utf8(text).ok()
    }

    fn writer(&self, bytes: &[u8]) -> Result<&Writer, DecodeError> {
        if bytes.len() < HEADER_LEN || bytes[..2] != MAGIC {
            return Err(DecodeError::NotSingleObject { len: bytes.len() });
        }
        if let Some(Ok(claim)) = Claim::decode(bytes) {
            return Err(DecodeError::Claim {
                kind: claim.kind,
                size: claim.size,
                url: claim.url,
            });
        }
        let fp = u64::from_le_bytes(bytes[2..HEADER_LEN].try_into().expect("8 bytes"));
        self.writers
            .get(&fp)
            .ok_or(DecodeError::UnknownFingerprint(fp))
    }

    pub fn decode(&self, bytes: &[u8]) -> Result<Event, DecodeError> {
        let writer = self.writer(bytes)?;
        let kind = writer.kind;
        let reader_schema = &self.current[&kind].schema;
        let body_err = |e: apache_avro::Error| DecodeError::Body {
            kind: kind.name(),
            source: Box::new(e),
        };
        let mut body = Body {
            rest: &bytes[HEADER_LEN..],
            ran_out: false,
        };
        // Resolution only for events written by an older schema version.
        let resolve = (!writer.current).then_some(reader_schema);
        let value =
            apache_avro::from_avro_datum(&writer.schema, &mut body, resolve).map_err(body_err)?;
        if body.ran_out {
            return Err(DecodeError::Truncated { kind: kind.name() });
        }
        if !body.rest.is_empty() {
            return Err(DecodeError::TrailingBytes {
                kind: kind.name(),
                len: body.rest.len(),
            });
        }
        kind.decode_value(value).map_err(body_err)
    }
}
