//! Reading an upstream chat completion: the answer the harness gets and the
//! training data the log keeps (token ids, logprobs, policy version).

use forgelog_dialects::canonical::*;
use forgelog_dialects::dialect::{DialectAdapter, DialectError, ErrorKind, OpenAiChatDialect};
use forgelog_dialects::hermes;
use serde_json::Value;

mod choice;
mod top_level;
pub(crate) use choice::ids_of;
pub use choice::{ChoiceTokens, TokenLogprob};
use top_level::is_json_space;

/// The training data of one upstream answer.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Sampled {
    pub prompt_token_ids: Vec<u32>,
    pub completion_token_ids: Vec<u32>,
    pub completion_logprobs: Vec<f32>,
    pub finish_reason: Option<String>,
    pub policy_version: Option<i64>,
    /// `None` when the answer is usable for training.
    pub untrainable_reason: Option<String>,
    /// Hermes tool-call text the proxy could not parse (left as text).
    pub unparsed_tool_calls: usize,
}

/// An upstream chat completion: its JSON less the token ids and logprobs,
/// which are read straight into numbers. A long prompt's ids are most of an
/// answer, and read as JSON values they were the largest part of the proxy's
/// CPU per call; a completion's logprobs, an object a token, the next.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UpstreamAnswer {
    pub body: Value,
    pub prompt_token_ids: Option<Vec<u32>>,
    /// Taken out of `body["choices"][0]`.
    pub first_choice: ChoiceTokens,
}

impl UpstreamAnswer {
    /// Reads an answer's JSON text. The prompt's ids, most of a long prompt's
    /// answer, are found by the object's structure alone and read in one pass;
    /// serde reads the rest with them cut out. Where that cannot be done
    /// exactly (no such field, twice, an escaped key, ids that are not ids)
    /// serde reads it all and has the last word.
    pub fn from_json(text: &[u8]) -> serde_json::Result<UpstreamAnswer> {
        let fast = top_level::top_level_field(text, "prompt_token_ids", token_ids_from).map(
            |(ids, at)| {
                let mut rest = Vec::with_capacity(text.len() - at.len() + 4);
                rest.extend_from_slice(&text[..at.start]);
                rest.extend_from_slice(b"null");
                rest.extend_from_slice(&text[at.end..]);
                (ids, rest)
            },
        );
        let Some((ids, rest)) = fast else {
            return serde_json::from_slice(text);
        };
        let mut answer: UpstreamAnswer = serde_json::from_slice(&rest)?;
        answer.prompt_token_ids = ids;
        Ok(answer)
    }
}

impl From<Value> for UpstreamAnswer {
    fn from(mut body: Value) -> UpstreamAnswer {
        let ids_value = body
            .as_object_mut()
            .and_then(|m| m.remove("prompt_token_ids"));
        let first_choice = body
            .get_mut("choices")
            .and_then(|c| c.get_mut(0))
            .map(ChoiceTokens::take_from)
            .unwrap_or_default();
        UpstreamAnswer {
            prompt_token_ids: ids_value.as_ref().and_then(ids_of),
            first_choice,
            body,
        }
    }
}

impl std::ops::Index<&str> for UpstreamAnswer {
    type Output = Value;
    fn index(&self, key: &str) -> &Value {
        &self.body[key]
    }
}

impl<'de> serde::Deserialize<'de> for UpstreamAnswer {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = UpstreamAnswer;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a chat completion object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<UpstreamAnswer, A::Error> {
                use serde::de::Error as _;
                let mut answer = UpstreamAnswer::default();
                let mut body = serde_json::Map::new();
                while let Some(key) = map.next_key::<String>()? {
                    if key == "prompt_token_ids" {
                        // Taken raw and split here: through serde's per-element
                        // visitor a long prompt's ids cost ~200 instructions
                        // each, most of the proxy's instructions per call.
                        let raw: Box<serde_json::value::RawValue> = map.next_value()?;
                        answer.prompt_token_ids =
                            token_ids(raw.get().as_bytes()).ok_or_else(|| {
                                A::Error::custom("prompt_token_ids: not an array of token ids")
                            })?;
                    } else if key == "choices" {
                        let choices = choice::Choices(&mut answer.first_choice);
                        body.insert(key, map.next_value_seed(choices)?);
                    } else {
                        body.insert(key, map.next_value()?);
                    }
                }
                answer.body = Value::Object(body);
                Ok(answer)
            }
        }
        d.deserialize_map(Visitor)
    }
}

/// The ids of a JSON array of token ids (`[1,2,3]`, whitespace allowed);
/// `Some(None)` for `null`; `None` for anything else.
fn token_ids(json: &[u8]) -> Option<Option<Vec<u32>>> {
    let json = json.trim_ascii();
    let (ids, len) = token_ids_from(json)?;
    (len == json.len()).then_some(ids)
}

/// Room left in a prompt's ids for the completion's: the proxy keeps the two
/// together ([`forgelog_schemas::compact::SessionMemory`]), without a copy
/// when the completion fits.
const COMPLETION_ROOM: usize = 1024;

/// [`token_ids`] of the JSON value `text` starts with, and its length in bytes:
/// one pass, an id of up to 7 digits read as one word ([`short_id`]). Through
/// serde's per-element visitor a long prompt's ids cost ~200 instructions
/// each, most of the proxy's instructions per call. Refuses what JSON refuses
/// (`007`).
fn token_ids_from(text: &[u8]) -> Option<(Option<Vec<u32>>, usize)> {
    if text.starts_with(b"null") {
        return Some((None, 4));
    }
    let (b'[', rest) = text.split_first()? else {
        return None;
    };
    fn skip_space(r: &[u8]) -> &[u8] {
        &r[r.iter().take_while(|&&b| is_json_space(b)).count()..]
    }
    // Sized by the ids counted (commas before the first `]`), with room for
    // the completion that the session memory appends.
    let end = memchr::memchr(b']', text).unwrap_or(text.len());
    let mut ids = Vec::with_capacity(count_commas(&text[..end]) + 1 + COMPLETION_ROOM);
    let mut rest = skip_space(rest);
    if let Some((b']', tail)) = rest.split_first() {
        return Some((Some(ids), text.len() - tail.len()));
    }
    loop {
        let (id, digits) = short_id(rest).or_else(|| any_id(rest))?;
        ids.push(id);
        rest = &rest[digits..];
        let (mut next, mut tail) = rest.split_first()?;
        if is_json_space(*next) {
            (next, tail) = skip_space(rest).split_first()?;
        }
        match next {
            b',' => rest = skip_space(tail),
            b']' => return Some((Some(ids), text.len() - tail.len())),
            _ => return None,
        }
    }
}

/// The id `text` starts with, read digit by digit, and its digit count: any
/// JSON number that is a `u32` (no sign, fraction, exponent or leading zero).
fn any_id(text: &[u8]) -> Option<(u32, usize)> {
    let digits = text.iter().take_while(|b| b.is_ascii_digit()).count();
    let (first, more) = text[..digits].split_first()?;
    if *first == b'0' && !more.is_empty() {
        return None;
    }
    let id = text[..digits].iter().try_fold(0u32, |id, &b| {
        id.checked_mul(10)?.checked_add(u32::from(b - b'0'))
    })?;
    Some((id, digits))
}

/// [`any_id`] for ids of 1 to 7 digits with 8 bytes to read, as one word:
/// finding where the digits end and adding them up take a few operations
/// whatever their count. A byte at a time, an answer with 100,000 prompt ids
/// below 152,000 (a Qwen vocabulary) took 0.88–0.92 ms to read; this way,
/// 0.48–0.49 (`cargo bench -p forgelog-producers --bench answer-read`).
/// `None` where it cannot tell (8 digits or more, a leading zero, fewer than
/// 8 bytes left): [`any_id`] reads those.
fn short_id(text: &[u8]) -> Option<(u32, usize)> {
    let word = u64::from_le_bytes(text.get(..8)?.try_into().ok()?);
    // Each byte less b'0': a digit is 0..=9. The first byte that is no digit
    // has its top bit set here or once 0x76 is added, and borrows and carries
    // only reach the bytes after it.
    let values = word.wrapping_sub(0x3030_3030_3030_3030);
    let not_digits = (values | values.wrapping_add(0x7676_7676_7676_7676)) & 0x8080_8080_8080_8080;
    let digits = (not_digits.trailing_zeros() / 8) as usize;
    if digits == 0 || digits == 8 || (digits > 1 && text[0] == b'0') {
        return None;
    }
    // The digits moved to the word's top, zeros (leading zeros) below, then
    // paired, quadrupled and the halves joined: the first byte is the most
    // significant digit.
    let v = values << (8 * (8 - digits));
    let v = v.wrapping_mul(10).wrapping_add(v >> 8);
    let v = ((v & 0x0000_00FF_0000_00FF).wrapping_mul(0x000F_4240_0000_0064)
        + ((v >> 16) & 0x0000_00FF_0000_00FF).wrapping_mul(0x0000_2710_0000_0001))
        >> 32;
    Some((v as u32, digits))
}

/// The commas in `text`, counted in runs of 255 bytes with a byte-sized sum
/// each: that the compiler vectorizes. A `usize` count per byte it did not,
/// and it took 14× as long (6 µs for a 4,000-token prompt's ids).
fn count_commas(text: &[u8]) -> usize {
    text.chunks(255)
        .map(|run| usize::from(run.iter().fold(0u8, |n, &b| n + u8::from(b == b','))))
        .sum()
}

/// Reads a vLLM (or forgelog engine) chat completion. `call_id_prefix` names
/// the tool calls the proxy itself parses from Hermes text. The prompt's ids
/// are taken out of `answer`, not copied: they are most of a long call's answer.
pub fn read_response(
    answer: &mut UpstreamAnswer,
    call_id_prefix: &str,
) -> Result<(ChatResponse, Sampled), DialectError> {
    let bad = |m: &str| DialectError::new(ErrorKind::Upstream, format!("upstream answer: {m}"));
    let body = &answer.body;
    let mut resp = OpenAiChatDialect::decode_response(body).map_err(|e| bad(&e.message))?;
    let choice = &body["choices"][0];
    let tokens = std::mem::take(&mut answer.first_choice);
    let mut sampled = Sampled {
        prompt_token_ids: answer
            .prompt_token_ids
            .take()
            .or_else(|| choice.get("prompt_token_ids").and_then(ids_of))
            .unwrap_or_default(),
        completion_token_ids: tokens.token_ids.unwrap_or_default(),
        finish_reason: choice["finish_reason"].as_str().map(str::to_string),
        policy_version: body["policy_version"].as_i64(),
        ..Default::default()
    };
    let content = tokens.logprobs;
    if let Some(content) = &content {
        sampled.completion_logprobs = content.iter().map(|t| t.logprob as f32).collect();
        // Without return_token_ids, `--return-tokens-as-token-ids` still names each token.
        if sampled.completion_token_ids.is_empty() {
            sampled.completion_token_ids = content.iter().filter_map(|t| t.token_id).collect();
        }
    }
    sampled.untrainable_reason = if sampled.prompt_token_ids.is_empty() {
        Some("upstream returned no prompt token ids".into())
    } else if sampled.completion_token_ids.is_empty() && resp.usage.output > 0 {
        Some("upstream returned no completion token ids".into())
    } else if content.is_none() {
        Some("upstream returned no logprobs".into())
    } else if sampled.completion_logprobs.len() != sampled.completion_token_ids.len() {
        Some(format!(
            "{} logprobs for {} completion tokens",
            sampled.completion_logprobs.len(),
            sampled.completion_token_ids.len()
        ))
    } else if sampled.completion_logprobs.iter().any(|l| !l.is_finite()) {
        Some("upstream returned a non-finite logprob".into())
    } else {
        None
    };
    if resp.usage.input == 0 {
        resp.usage.input = sampled.prompt_token_ids.len() as u64;
    }
    if resp.usage.output == 0 {
        resp.usage.output = sampled.completion_token_ids.len() as u64;
    }
    sampled.unparsed_tool_calls = hermes::parse_parts(&mut resp.parts, call_id_prefix);
    // Calls parsed here end the turn as an engine's own tool parser says
    // (vLLM's chat route: `tool_calls`), for the harness and the record alike.
    if resp.parts.iter().any(|p| matches!(p, Part::ToolCall(_)))
        && resp.finish == FinishReason::Stop
    {
        resp.finish = FinishReason::ToolCalls;
        sampled.finish_reason = Some("tool_calls".into());
    }
    Ok((resp, sampled))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Hermes tool call in the text (token in, or an engine without a
    /// tool parser) ends the turn with `tool_calls`, as the harness is told
    /// and the call is recorded.
    #[test]
    fn a_tool_call_parsed_from_the_text_ends_the_turn_with_tool_calls() {
        let text =
            "<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>";
        let body = serde_json::json!({"choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": text}, "token_ids": [7, 8],
            "logprobs": {"content": [{"token": "a", "logprob": -0.5}, {"token": "b", "logprob": -0.25}]}}],
            "prompt_token_ids": [1, 2]});
        let mut answer = UpstreamAnswer::from_json(body.to_string().as_bytes()).unwrap();
        let (resp, sampled) = read_response(&mut answer, "c_").unwrap();
        assert_eq!(resp.finish, FinishReason::ToolCalls);
        assert_eq!(sampled.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(sampled.unparsed_tool_calls, 0);
        // Plain text keeps the engine's reason.
        let plain = body.to_string().replace("<tool_call>", "no call");
        let mut answer = UpstreamAnswer::from_json(plain.as_bytes()).unwrap();
        let (resp, sampled) = read_response(&mut answer, "c_").unwrap();
        assert_eq!(resp.finish, FinishReason::Stop);
        assert_eq!(sampled.finish_reason.as_deref(), Some("stop"));
    }

    /// An answer read from its text, checked against serde's reading of it all.
    fn read(text: &str) -> serde_json::Result<UpstreamAnswer> {
        let answer = UpstreamAnswer::from_json(text.as_bytes());
        let by_serde = serde_json::from_str::<UpstreamAnswer>(text);
        assert_eq!(answer.as_ref().ok(), by_serde.as_ref().ok(), "{text}");
        answer
    }

    /// A completion's prompt ids read from its text are the ids the JSON holds,
    /// however it is spaced; anything but an array of u32 (or null) is refused.
    #[test]
    fn prompt_ids_are_read_from_the_answer_text() {
        for (text, ids) in [
            (
                r#"{"prompt_token_ids": [1,2,3], "id": "x"}"#,
                Some(vec![1, 2, 3]),
            ),
            (
                r#"{"prompt_token_ids":[ 0 , 4294967295 ]}"#,
                Some(vec![0, u32::MAX]),
            ),
            ("{\"prompt_token_ids\":[\n7\t]}", Some(vec![7])),
            (r#"{"prompt_token_ids": []}"#, Some(vec![])),
            (r#"{"prompt_token_ids": [ ]}"#, Some(vec![])),
            (r#"{"prompt_token_ids": null}"#, None),
            (r#"{"id": "x"}"#, None),
            // Twice: the last one, as serde_json's own maps keep.
            (
                r#"{"prompt_token_ids": [1], "prompt_token_ids": [2]}"#,
                Some(vec![2]),
            ),
            (r#"{"prompt\u005ftoken_ids": [3]}"#, Some(vec![3])),
            (
                r#"{"prompt_token_ids": [4], "prompt\u005ftoken_ids": null}"#,
                None,
            ),
        ] {
            let answer = read(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(answer.prompt_token_ids, ids, "{text}");
            assert_eq!(
                answer,
                UpstreamAnswer::from(serde_json::from_str::<Value>(text).unwrap())
            );
        }
        assert_eq!(
            read(r#"{"id": "x", "prompt_token_ids": [5]}"#).unwrap()["id"],
            "x"
        );
        for bad in [
            "[-1]",
            "[4294967296]",
            "[1.0]",
            "[1e3]",
            r#"["1"]"#,
            "[[1,2]]",
            "[1,null]",
            "{}",
            r#""1,2""#,
            "7",
        ] {
            let text = format!(r#"{{"prompt_token_ids": {bad}}}"#);
            let err = read(&text).expect_err(&text).to_string();
            assert!(err.contains("prompt_token_ids"), "{text}: {err}");
        }
        // Not JSON at all: refused as serde refuses it.
        for bad in [
            "[007]", "[01]", "[1,]", "[,1]", "[1 2]", "[1", "nul", "null1",
            // A form feed is ASCII whitespace, not JSON's.
            "[\x0c]", "[1\x0c]", "[\x0c1]",
        ] {
            let text = format!(r#"{{"prompt_token_ids": {bad}}}"#);
            read(&text).expect_err(&text);
        }
    }

    /// The ids come sized by their count with room for a completion: none
    /// of the slack of sizing by the text's length kept with each call.
    #[test]
    fn prompt_ids_come_with_room_for_a_completion_only() {
        let sent: Vec<u32> = (0..5000).collect();
        let text = format!(r#"{{"prompt_token_ids": {sent:?}, "id": "a,b,c]"}}"#);
        let ids = read(&text).unwrap().prompt_token_ids.unwrap();
        assert_eq!(ids, sent);
        let room = sent.len() + COMPLETION_ROOM;
        assert!(
            (room..room + 8).contains(&ids.capacity()),
            "{}",
            ids.capacity()
        );
    }

    proptest::proptest! {
        /// Wherever the ids are among other fields (strings full of JSON's own
        /// punctuation, nested objects), the answer read is serde's.
        #[test]
        fn an_answer_reads_as_serde_reads_it(
            fields in proptest::collection::vec(("[a-z_]{1,8}", "[\\[\\]{}\",:\\\\a-z ]{0,12}"), 0..6),
            ids in proptest::collection::vec(proptest::prelude::any::<u32>(), 0..50),
            at in 0usize..6,
            pretty in proptest::prelude::any::<bool>(),
        ) {
            let mut object = serde_json::Map::new();
            for (i, (key, text)) in fields.iter().enumerate() {
                if i == at {
                    object.insert("prompt_token_ids".into(), ids.clone().into());
                }
                object.insert(key.clone(), serde_json::json!({"text": text, "list": [text, 1.5, null]}));
            }
            object.entry("prompt_token_ids").or_insert_with(|| ids.clone().into());
            let object = Value::Object(object);
            let text = if pretty { serde_json::to_string_pretty(&object) } else { serde_json::to_string(&object) }.unwrap();
            let answer = read(&text).unwrap();
            proptest::prop_assert_eq!(answer.prompt_token_ids, Some(ids));
        }

        #[test]
        fn commas_are_counted(text in proptest::collection::vec(proptest::sample::select(vec![b',', b'1']), 0..2000)) {
            proptest::prop_assert_eq!(count_commas(&text), text.iter().filter(|&&b| b == b',').count());
        }

        /// Ids of every count of digits, 0 to 10, read back exactly.
        #[test]
        fn ids_of_any_length_read_back(
            ids in proptest::collection::vec((0u32..=10, proptest::prelude::any::<u32>()), 0..40),
        ) {
            let ids: Vec<u32> = ids.iter().map(|&(digits, n)| n % 10u32.saturating_pow(digits).max(1)).collect();
            let text = format!("{{\"prompt_token_ids\":{}}}", serde_json::to_string(&ids).unwrap());
            proptest::prop_assert_eq!(read(&text).unwrap().prompt_token_ids, Some(ids));
        }

        /// Whatever an array holds, JSON or not, it is read as serde reads it
        /// (refused where serde refuses it).
        #[test]
        fn any_array_text_reads_as_serde_reads_it(
            pieces in proptest::collection::vec(proptest::sample::select(vec![
                "0", "7", "42", "01", "12345678", "123456789", "4294967295", "4294967296",
                "99999999999", ",", " ", "\t", "\n", "\r", "\x0c", "]", "-", "1.5", "1e3",
            ]), 0..12),
        ) {
            let array = format!("[{}]", pieces.concat());
            let _ = read(&format!("{{\"prompt_token_ids\":{array}, \"id\": 1}}"));
            // `read` compares the two ways an answer is read, which both read
            // the ids with `token_ids`: these are compared with serde's own.
            proptest::prop_assert_eq!(
                token_ids(array.as_bytes()).flatten(),
                serde_json::from_str::<Vec<u32>>(&array).ok()
            );
        }

        /// An id read as one word is the id read digit by digit; only what
        /// a word cannot tell is left to the digits.
        #[test]
        fn a_short_id_reads_as_digit_by_digit(text in "[0-9,\\] a-]{0,12}") {
            let text = text.as_bytes();
            match short_id(text) {
                Some(id) => proptest::prop_assert_eq!(Some(id), any_id(text)),
                None => proptest::prop_assert!(
                    text.len() < 8 || any_id(text).is_none_or(|(_, digits)| digits >= 8)
                ),
            }
        }

        #[test]
        fn any_ids_in_any_spacing_read_back(
            ids in proptest::collection::vec(proptest::prelude::any::<u32>(), 0..200),
            spaces in proptest::collection::vec("[ \t\n\r]{0,2}", 0..400),
        ) {
            let mut text = String::from("{\"prompt_token_ids\":[");
            for (i, id) in ids.iter().enumerate() {
                let space = |k: usize| spaces.get(k).map(String::as_str).unwrap_or("");
                if i > 0 {
                    text.push(',');
                }
                text.push_str(space(2 * i));
                text.push_str(&id.to_string());
                text.push_str(space(2 * i + 1));
            }
            text.push_str("]}");
            let answer = read(&text).unwrap();
            proptest::prop_assert_eq!(answer.prompt_token_ids, Some(ids));
        }
    }
}
