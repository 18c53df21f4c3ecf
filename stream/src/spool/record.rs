//! The spool's record framing: `[u32 len][u32 crc32][payload]`, payload =
//! `[u64 seq][u16 topic len][topic][u32 key len][key][value]`, all little-endian.
//! A torn or corrupt tail fails the CRC and is cut off on open.

pub const FRAME_HEADER: usize = 8;

/// One event waiting in the spool for the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpoolRecord {
    /// Position in the spool: dense, increasing, never reused.
    pub seq: u64,
    pub topic: String,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

impl SpoolRecord {
    /// Appends the framed record to `out`.
    pub fn encode_into(seq: u64, topic: &str, key: &[u8], value: &[u8], out: &mut Vec<u8>) {
        let payload_len = 8 + 2 + topic.len() + 4 + key.len() + value.len();
        out.reserve(FRAME_HEADER + payload_len);
        let start = out.len();
        out.extend_from_slice(&(payload_len as u32).to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&seq.to_le_bytes());
        out.extend_from_slice(&(topic.len() as u16).to_le_bytes());
        out.extend_from_slice(topic.as_bytes());
        out.extend_from_slice(&(key.len() as u32).to_le_bytes());
        out.extend_from_slice(key);
        out.extend_from_slice(value);
        let crc = crc32fast::hash(&out[start + FRAME_HEADER..]);
        out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    }

    /// Parses a payload whose CRC was already checked; `None` if its fields do not fit.
    pub fn decode_payload(payload: &[u8]) -> Option<SpoolRecord> {
        let seq = u64::from_le_bytes(payload.get(..8)?.try_into().ok()?);
        let topic_len = u16::from_le_bytes(payload.get(8..10)?.try_into().ok()?) as usize;
        let topic = std::str::from_utf8(payload.get(10..10 + topic_len)?)
            .ok()?
            .to_string();
        let at = 10 + topic_len;
        let key_len = u32::from_le_bytes(payload.get(at..at + 4)?.try_into().ok()?) as usize;
        let key = payload.get(at + 4..at + 4 + key_len)?.to_vec();
        let value = payload.get(at + 4 + key_len..)?.to_vec();
        Some(SpoolRecord {
            seq,
            topic,
            key,
            value,
        })
    }

    /// Splits a frame header into (payload length, crc).
    pub fn frame_header(header: &[u8; FRAME_HEADER]) -> (usize, u32) {
        let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
        (len, crc)
    }
}
