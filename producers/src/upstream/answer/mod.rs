//! Reading an upstream chat completion: the answer the harness gets and the
//! training data the log keeps (token ids, logprobs, policy version).

use forgelog_dialects::canonical::*;
use forgelog_dialects::dialect::{DialectAdapter, DialectError, ErrorKind, OpenAiChatDialect};
use forgelog_dialects::hermes;
use serde_json::Value;

mod choice;
mod top_level;
pub(crate) use choice::ids_of;
pub use choice::{token_id_of, ChoiceTokens, TokenLogprob};
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
mod tests;
