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
