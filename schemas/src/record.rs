//! A message as read back from the log: where it sits, its raw bytes and what
//! they decode to. Pure data: the Kafka client fills it, the pure cores
//! (replay comparison, tests) read it.

use crate::{Codec, Event};

/// One message as read from the log.
#[derive(Debug, Clone, PartialEq)]
pub struct Received {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Vec<u8>,
    /// The raw value, for byte-level comparison and re-encoding checks.
    pub value: Vec<u8>,
    /// The decoded event; a message that is not a forgelog event is an error
    /// here, for the caller to record and skip, never a crash.
    pub event: Result<Event, String>,
}

impl Received {
    /// Decodes `value` with the process's [`Codec`].
    pub fn decode(topic: &str, partition: i32, offset: i64, key: &[u8], value: &[u8]) -> Received {
        Received {
            topic: topic.to_string(),
            partition,
            offset,
            key: key.to_vec(),
            value: value.to_vec(),
            event: Codec::global().decode(value).map_err(|e| e.to_string()),
        }
    }

    /// Whether this message belongs to `run` (any run when `None`). One that
    /// does not decode belongs to the run its first field names when it names
    /// one (a claim check whose event cannot be fetched, say), else to every
    /// run, so that it gets reported.
    pub fn in_run(&self, run: Option<&str>) -> bool {
        match (&self.event, run) {
            (_, None) => true,
            (Ok(e), Some(r)) => e.run_id() == r,
            (Err(_), Some(r)) => Codec::global()
                .peek_run_id(&self.value)
                .is_none_or(|id| id == r),
        }
    }

    /// The record as one line of JSON, as `forgelog tail` prints it: the
    /// event (`{"error", "partition", "offset"}` for one that does not
    /// decode), with `envelope` inside `{"partition", "offset", "key",
    /// "event"}`. A call's recorded bodies are bytes: shown as the text they
    /// almost always are.
    pub fn json_line(&self, envelope: bool) -> String {
        let event = match &self.event {
            Ok(e) => e,
            Err(err) => {
                let line = serde_json::json!({"error": err, "partition": self.partition, "offset": self.offset});
                return line.to_string();
            }
        };
        let mut event = serde_json::to_value(event).expect("events serialize to JSON");
        bodies_as_text(&mut event);
        if !envelope {
            return event.to_string();
        }
        let key = String::from_utf8_lossy(&self.key);
        serde_json::json!({"partition": self.partition, "offset": self.offset, "key": key, "event": event})
            .to_string()
    }
}

/// A call's `raw_request` and `response_body` (JSON arrays of numbers as
/// serialized) as strings where they are UTF-8.
fn bodies_as_text(event: &mut serde_json::Value) {
    for field in ["raw_request", "response_body"] {
        let Some(v) = event.get_mut(field) else {
            continue;
        };
        let bytes: Option<Vec<u8>> = v.as_array().and_then(|items| {
            items
                .iter()
                .map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok()))
                .collect()
        });
        if let Some(text) = bytes.and_then(|b| String::from_utf8(b).ok()) {
            *v = serde_json::Value::String(text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{call_finished, growing_session};

    fn received(event: &Event) -> Received {
        let value = Codec::global().encode(event).unwrap();
        Received::decode("forgelog.calls", 2, 41, b"s-1", &value)
    }

    #[test]
    fn a_call_is_a_line_with_its_bodies_as_text() {
        let (mut started, mut finished) = growing_session("r", "s-1", 1, 4).remove(0);
        started.raw_request = br#"{"model":"m"}"#.to_vec();
        let line = received(&Event::CallStarted(started)).json_line(false);
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["raw_request"], r#"{"model":"m"}"#);
        assert!(!line.contains('\n'));
        // Not UTF-8: left as the numbers it was.
        finished.response_body = vec![0xff, 0xfe];
        let line = received(&Event::CallFinished(finished)).json_line(false);
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["response_body"], serde_json::json!([255, 254]));
    }

    #[test]
    fn the_envelope_says_where_the_record_sits_and_a_bad_one_says_why() {
        let rec = received(&Event::CallFinished(call_finished("r", "s-1", 0, 3, 2)));
        let v: serde_json::Value = serde_json::from_str(&rec.json_line(true)).unwrap();
        assert_eq!(
            (v["partition"].as_i64(), v["offset"].as_i64()),
            (Some(2), Some(41))
        );
        assert_eq!(v["key"], "s-1");
        assert_eq!(v["event"]["session_id"], "s-1");
        let bad = Received::decode("forgelog.calls", 0, 7, b"k", b"not avro");
        let v: serde_json::Value = serde_json::from_str(&bad.json_line(true)).unwrap();
        assert_eq!(v["offset"], 7);
        assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{v}");
    }
}
