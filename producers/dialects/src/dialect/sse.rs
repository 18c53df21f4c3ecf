//! Server-sent events framing, shared by every dialect.

use bytes::Bytes;
use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
pub struct SseEvent {
    /// The `event:` line (Anthropic and Responses name their events; OpenAI chat and Gemini do not).
    pub event: Option<&'static str>,
    /// The `data:` payload: JSON, or a sentinel like `[DONE]`.
    pub data: String,
}

impl SseEvent {
    pub fn data(v: Value) -> SseEvent {
        SseEvent {
            event: None,
            data: v.to_string(),
        }
    }

    pub fn named(event: &'static str, v: Value) -> SseEvent {
        SseEvent {
            event: Some(event),
            data: v.to_string(),
        }
    }

    /// The wire bytes. JSON never contains a raw newline, so one `data:` line suffices.
    pub fn frame(&self) -> Bytes {
        let mut s = String::with_capacity(self.data.len() + 32);
        if let Some(e) = self.event {
            s.push_str("event: ");
            s.push_str(e);
            s.push('\n');
        }
        s.push_str("data: ");
        s.push_str(&self.data);
        s.push_str("\n\n");
        Bytes::from(s)
    }

    /// The payload as JSON (tests).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap_or(Value::Null)
    }
}

/// A comment line: keeps idle connections (and the harness's read timeout) alive.
pub const KEEP_ALIVE: &[u8] = b": keep-alive\n\n";
