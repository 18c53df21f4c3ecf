use super::super::UpstreamAnswer;
use crate::upstream::arbitrary::json_value;
use proptest::prelude::*;
use serde_json::{json, Value};

/// The answer read from its text, and the answer taken from serde's
/// values of it, as text: a NaN logprob is not equal to itself.
fn both_ways(text: &str) -> (String, String) {
    let read = UpstreamAnswer::from_json(text.as_bytes()).expect(text);
    let taken = UpstreamAnswer::from(serde_json::from_str::<Value>(text).expect(text));
    (format!("{read:?}"), format!("{taken:?}"))
}

#[test]
fn the_first_choice_gives_its_ids_and_logprobs() {
    let text = json!({"choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "token_ids": [7, 8],
         "logprobs": {"content": [
            {"token": "token_id:7", "logprob": -0.5, "bytes": [104], "top_logprobs": []},
            {"token": "token_id:8", "logprob": -1, "bytes": [105], "top_logprobs": [{"token": "x", "logprob": -2.0}]}]}},
        {"index": 1, "token_ids": [9], "logprobs": {"content": []}}]})
    .to_string();
    let answer = UpstreamAnswer::from_json(text.as_bytes()).unwrap();
    let tokens = &answer.first_choice;
    assert_eq!(tokens.token_ids, Some(vec![7, 8]));
    let logprobs = tokens.logprobs.as_ref().unwrap();
    assert_eq!(
        logprobs
            .iter()
            .map(|t| (t.logprob, t.token_id))
            .collect::<Vec<_>>(),
        [(-0.5, Some(7)), (-1.0, Some(8))]
    );
    // Taken out of the first choice only; the rest is as it came.
    assert_eq!(
        answer.body["choices"][0],
        json!({"index": 0, "message": {"role": "assistant", "content": "hi"}})
    );
    assert_eq!(answer.body["choices"][1]["token_ids"], json!([9]));
    let (read, taken) = both_ways(&text);
    assert_eq!(read, taken);
}

/// Fields of the wrong kind read as "none", twice as the last one, escaped
/// keys as their text: as they did through serde's values.
#[test]
fn odd_choices_read_as_through_values() {
    for text in [
        r#"{"choices": [{"token_ids": [1, -2]}]}"#,
        r#"{"choices": [{"token_ids": [1, 4294967296]}]}"#,
        r#"{"choices": [{"token_ids": [1.0]}]}"#,
        r#"{"choices": [{"token_ids": null, "logprobs": null}]}"#,
        r#"{"choices": [{"token_ids": [1], "token_ids": [2]}]}"#,
        r#"{"choices": [{"token\u005fids": [3], "logprobs": {"content": [{"logprob": "x", "token": 5}]}}]}"#,
        r#"{"choices": [{"logprobs": [{"logprob": -1}]}]}"#,
        r#"{"choices": [{"logprobs": {"content": {"logprob": -1}}}]}"#,
        r#"{"choices": [{"logprobs": {"content": [1, null, [], {"logprob": -1, "logprob": true}]}}]}"#,
        r#"{"choices": [{"logprobs": {"content": [{"token": "token_id:+5"}, {"token": "token_id:x"}]}}]}"#,
        r#"{"choices": [{"logprobs": {"content": []}, "logprobs": {"content": [{"logprob": -3}]}}]}"#,
        r#"{"choices": [{"token_ids": [1]}], "choices": [{"message": {}}]}"#,
        r#"{"choices": [{"token_ids": [1]}], "choices": {"0": {"token_ids": [2]}}}"#,
        r#"{"choices": [[{"token_ids": [1]}], {"token_ids": [2]}]}"#,
        r#"{"choices": "none"}"#,
        r#"{"choices": []}"#,
        r#"{"choices": [null, {"token_ids": [2]}]}"#,
    ] {
        let (read, taken) = both_ways(text);
        assert_eq!(read, taken, "{text}");
    }
}

/// A token entry, a `logprobs`, a choice: of the shape vLLM writes, or any
/// other JSON in its place.
fn or_any(shaped: impl Strategy<Value = Value> + 'static) -> BoxedStrategy<Value> {
    prop_oneof![3 => shaped, 1 => json_value()].boxed()
}

fn choice() -> impl Strategy<Value = Value> {
    let token = or_any(
        (
            or_any(any::<u32>().prop_map(|id| json!(format!("token_id:{id}")))),
            or_any((any::<i16>(), 0..4i32).prop_map(|(m, e)| json!(f64::from(m) / 2f64.powi(e)))),
            json_value(),
        )
            .prop_map(|(token, logprob, top)| {
                json!({"token": token, "logprob": logprob, "bytes": [1], "top_logprobs": top})
            }),
    );
    let logprobs = or_any(
        or_any(prop::collection::vec(token, 0..6).prop_map(Value::from))
            .prop_map(|content| json!({"content": content})),
    );
    let ids = or_any(prop::collection::vec(any::<u32>(), 0..6).prop_map(Value::from));
    (
        prop::option::of(ids),
        prop::option::of(logprobs),
        json_value(),
    )
        .prop_map(|(ids, logprobs, message)| {
            let mut choice = json!({"index": 0, "message": message, "finish_reason": "stop"});
            if let Some(ids) = ids {
                choice["token_ids"] = ids;
            }
            if let Some(logprobs) = logprobs {
                choice["logprobs"] = logprobs;
            }
            choice
        })
}

proptest! {
    /// However the first choice's ids and logprobs are shaped, reading
    /// the text gives what taking them from serde's values of it gives.
    #[test]
    fn any_choices_read_as_through_values(
        choices in or_any(prop::collection::vec(or_any(choice()), 0..3).prop_map(Value::from)),
        pretty in any::<bool>(),
    ) {
        let answer = json!({"id": "x", "choices": choices, "prompt_token_ids": [1, 2]});
        let text = if pretty { serde_json::to_string_pretty(&answer) } else { serde_json::to_string(&answer) }.unwrap();
        let (read, taken) = both_ways(&text);
        prop_assert_eq!(read, taken);
    }
}
