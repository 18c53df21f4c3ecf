//! The check tests make of a recorded log against the fake's answers.

use serde_json::Value;

/// Every ok CallFinished carries exactly the ids and logprobs some upstream answer
/// had, and the policy version it reported.
/// (A test helper: panics on the first call that does not.)
pub fn assert_calls_match(
    calls: &[forgelog_schemas::CallFinished],
    answers: &[Value],
    policy_version: i64,
) {
    for c in calls
        .iter()
        .filter(|c| c.status == forgelog_schemas::CallStatus::Ok)
    {
        // Equal requests may get answers equal in ids whose logprobs differ in
        // the last bits (an engine's prefix cache, batching): the call must be
        // exactly one of them.
        let ids = |v: &Value| {
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect::<Vec<_>>()
        };
        let logprobs = |a: &Value| -> Vec<f32> {
            a["choices"][0]["logprobs"]["content"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["logprob"].as_f64().unwrap() as f32)
                .collect()
        };
        let same_ids: Vec<&Value> = answers
            .iter()
            .filter(|a| {
                ids(&a["prompt_token_ids"]) == c.prompt_token_ids
                    && ids(&a["choices"][0]["token_ids"]) == c.completion_token_ids
            })
            .collect();
        assert!(
            !same_ids.is_empty(),
            "call {} has token ids no upstream answer had",
            c.call_index
        );
        assert!(
            same_ids
                .iter()
                .any(|a| logprobs(a) == c.completion_logprobs),
            "call {}: logprobs {:?} are none of the answers' with its ids: {:?}",
            c.call_index,
            c.completion_logprobs,
            same_ids.iter().map(|a| logprobs(a)).collect::<Vec<_>>()
        );
        assert!(
            c.trainable,
            "call {}: {:?}",
            c.call_index, c.untrainable_reason
        );
        assert_eq!(c.policy_version, Some(policy_version));
        assert_eq!(c.sampling_sent.top_p, Some(1.0));
        assert_eq!(c.sampling_sent.top_k, Some(-1));
        assert!(!c.response_body.is_empty());
    }
}
