//! The request the upstream is asked: its JSON value and its text, written
//! once. The call's chat form (`CallFinished.chat_request`) is cut from that
//! text rather than written again: both are mostly the conversation, and
//! escaping it twice was ~6% of the proxy's instructions per call.

use axum::body::Bytes;
use serde_json::Value;
use std::ops::Range;

/// A chat request for the upstream.
#[derive(Debug)]
pub struct UpstreamRequest {
    /// What a recorded upstream compares (`replay serve`).
    pub body: Value,
    /// `body` as serde_json writes it.
    text: Bytes,
    /// Where the values of `body`'s `messages` and `tools` are in `text`.
    messages: Option<Range<usize>>,
    tools: Option<Range<usize>>,
    /// The operator's `--extra-body` fields it carries, as their text.
    extra: Option<std::sync::Arc<str>>,
}

impl UpstreamRequest {
    pub fn new(body: Value) -> UpstreamRequest {
        let mut text = Vec::new();
        let (mut messages, mut tools) = (None, None);
        match &body {
            // Written field by field as serde_json writes a map (compact, in
            // its key order), noting where the two fields' values fall.
            Value::Object(fields) => {
                text.push(b'{');
                for (i, (key, value)) in fields.iter().enumerate() {
                    if i > 0 {
                        text.push(b',');
                    }
                    serde_json::to_writer(&mut text, key).expect("a string serializes");
                    text.push(b':');
                    let start = text.len();
                    serde_json::to_writer(&mut text, value).expect("a Value serializes");
                    match key.as_str() {
                        "messages" => messages = Some(start..text.len()),
                        "tools" => tools = Some(start..text.len()),
                        _ => {}
                    }
                }
                text.push(b'}');
            }
            other => serde_json::to_writer(&mut text, other).expect("a Value serializes"),
        }
        UpstreamRequest {
            body,
            text: text.into(),
            messages,
            tools,
            extra: None,
        }
    }

    /// `body` with the operator's fields added (none: as it is), written
    /// once; its chat form records them.
    pub fn with_extra(mut body: Value, extra: &super::ExtraBody) -> UpstreamRequest {
        if extra.is_empty() {
            return UpstreamRequest::new(body);
        }
        if let Value::Object(fields) = &mut body {
            fields.extend(extra.fields().clone());
        }
        UpstreamRequest {
            extra: Some(extra.text().into()),
            ..UpstreamRequest::new(body)
        }
    }

    /// The body's JSON text, as sent.
    pub fn text(&self) -> Bytes {
        self.text.clone()
    }

    /// The call's chat form as text: `{"messages":…,"tools":…}`, each `null`
    /// where the body has none, exactly as [`crate::replay::chat_form_text`]
    /// writes it from the value; then `"extra_body":…` where the operator
    /// added fields (replay compares the conversation, not them).
    pub fn chat_form_text(&self) -> String {
        let value = |at: &Option<Range<usize>>| at.clone().map_or(&b"null"[..], |r| &self.text[r]);
        let (messages, tools) = (value(&self.messages), value(&self.tools));
        let mut form = Vec::with_capacity(messages.len() + tools.len() + 24);
        form.extend_from_slice(b"{\"messages\":");
        form.extend_from_slice(messages);
        form.extend_from_slice(b",\"tools\":");
        form.extend_from_slice(tools);
        if let Some(extra) = &self.extra {
            form.extend_from_slice(b",\"extra_body\":");
            form.extend_from_slice(extra.as_bytes());
        }
        form.push(b'}');
        String::from_utf8(form).expect("JSON text cut at the ends of values")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::arbitrary::json_value;
    use proptest::prelude::*;

    proptest! {
        /// The text is serde_json's, and the chat form cut from it is the
        /// one written from the value, with or without either field.
        #[test]
        fn the_text_and_the_chat_form_are_as_serde_writes_them(
            others in prop::collection::btree_map("[a-z_]{1,10}", json_value(), 0..5),
            messages in prop::option::of(json_value()),
            tools in prop::option::of(json_value()),
        ) {
            let mut body: serde_json::Map<String, Value> = others.into_iter().collect();
            body.extend(messages.map(|m| ("messages".to_string(), m)));
            body.extend(tools.map(|t| ("tools".to_string(), t)));
            let body = Value::Object(body);
            let request = UpstreamRequest::new(body.clone());
            prop_assert_eq!(&request.text()[..], &serde_json::to_vec(&body).unwrap()[..]);
            prop_assert_eq!(request.chat_form_text(), crate::replay::chat_form_text(&body));
        }
    }

    #[test]
    fn the_operators_fields_are_sent_and_recorded_beside_the_conversation() {
        let body =
            serde_json::json!({"messages": [{"role": "user", "content": "x"}], "model": "m"});
        let extra: crate::upstream::ExtraBody =
            r#"{"structured_outputs": {"regex": "a|b"}}"#.parse().unwrap();
        let request = UpstreamRequest::with_extra(body.clone(), &extra);
        assert_eq!(request.body["structured_outputs"]["regex"], "a|b");
        let sent: Value = serde_json::from_slice(&request.text()).unwrap();
        assert_eq!(sent, request.body);
        let form: Value = serde_json::from_str(&request.chat_form_text()).unwrap();
        assert_eq!(form["messages"], body["messages"]);
        assert_eq!(form["extra_body"]["structured_outputs"]["regex"], "a|b");
        // What replay compares is the conversation alone.
        assert_eq!(
            crate::replay::divergence(&form, &crate::replay::chat_form(&body)),
            None
        );
        let plain = UpstreamRequest::with_extra(body.clone(), &Default::default());
        assert_eq!(plain.chat_form_text(), crate::replay::chat_form_text(&body));
    }

    #[test]
    fn a_body_that_is_not_an_object_is_written_whole_with_no_chat_form() {
        let request = UpstreamRequest::new(Value::from("hi"));
        assert_eq!(&request.text()[..], b"\"hi\"");
        assert_eq!(
            request.chat_form_text(),
            r#"{"messages":null,"tools":null}"#
        );
    }
}
