//! What a sampled token does to its sequence: it goes on, or it is done (a
//! stop token, a stop string, its length) and its generation is sent.

use super::{FinishReason, Generation, Loop, Sequence};
use crate::sampling::Sampled;
use tokenizers::Tokenizer;

impl Loop {
    /// Appends each sequence's sampled token (`None`: it sampled none this
    /// step) and replies to those that are done or failed.
    pub(super) fn settle(&mut self, sampled: Vec<Option<Result<Sampled, String>>>) {
        let context = self.model.config().max_position_embeddings;
        let mut still_active = Vec::with_capacity(self.active.len());
        for (mut sequence, sampled) in std::mem::take(&mut self.active).into_iter().zip(sampled) {
            let sampled = match sampled {
                None => {
                    still_active.push(sequence);
                    continue;
                }
                Some(Err(e)) => {
                    let _ = sequence.reply.send(Err(e));
                    continue;
                }
                Some(Ok(sampled)) => sampled,
            };
            if sequence.tokens.is_empty() {
                sequence.time_to_first_token = sequence.submitted.elapsed();
            }
            sequence.tokens.push(sampled.token);
            sequence.logprobs.push(sampled.logprob);
            match finish(&sequence, &self.stop_token_ids, &self.tokenizer, context) {
                None => still_active.push(sequence),
                Some((finish_reason, text)) => self.complete(sequence, finish_reason, text),
            }
        }
        self.active = still_active;
    }

    /// Sends a finished sequence its generation.
    fn complete(&mut self, sequence: Sequence, finish_reason: FinishReason, text: String) {
        record_finished(&sequence, &finish_reason);
        // Its keys and values, for the request that goes on from
        // it: all but the last sampled token, which was never fed.
        let Sequence {
            request,
            reply,
            cache,
            tokens,
            logprobs,
            policy_version,
            time_to_first_token,
            ..
        } = sequence;
        let mut fed = request.prompt;
        fed.extend_from_slice(&tokens[..tokens.len() - 1]);
        self.prefix_cache.insert(fed, cache);
        let generation = Generation {
            tokens,
            logprobs,
            text,
            finish_reason,
            policy_version,
            time_to_first_token,
        };
        let _ = reply.send(Ok(generation));
    }
}

/// A finished generation in the engine's metrics (vLLM's set: tokens,
/// time to first token, request time, by finish reason).
fn record_finished(sequence: &Sequence, reason: &FinishReason) {
    metrics::counter!("forgelog_engine_requests_total", "finish_reason" => reason.openai())
        .increment(1);
    metrics::counter!("forgelog_engine_prompt_tokens_total")
        .increment(sequence.request.prompt.len() as u64);
    metrics::counter!("forgelog_engine_generation_tokens_total")
        .increment(sequence.tokens.len() as u64);
    metrics::histogram!("forgelog_engine_time_to_first_token_seconds")
        .record(sequence.time_to_first_token.as_secs_f64());
    metrics::histogram!("forgelog_engine_request_seconds")
        .record(sequence.submitted.elapsed().as_secs_f64());
}

fn decode(tokenizer: &Tokenizer, tokens: &[u32]) -> String {
    tokenizer.decode(tokens, true).unwrap_or_default()
}

/// Whether `sequence` is done after its last token, and then why and its text.
fn finish(
    sequence: &Sequence,
    stop_token_ids: &[u32],
    tokenizer: &Tokenizer,
    context: usize,
) -> Option<(FinishReason, String)> {
    let tokens = &sequence.tokens;
    let last = *tokens.last()?;
    if stop_token_ids.contains(&last) && !sequence.request.ignore_eos {
        return Some((
            FinishReason::Stop,
            decode(tokenizer, &tokens[..tokens.len() - 1]),
        ));
    }
    if !sequence.request.stop.is_empty() {
        let text = decode(tokenizer, tokens);
        let first_stop = sequence
            .request
            .stop
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| text.find(s.as_str()))
            .min();
        if let Some(at) = first_stop {
            return Some((FinishReason::Stop, text[..at].to_string()));
        }
    }
    let at_context = sequence.request.prompt.len() + tokens.len() >= context;
    if tokens.len() >= sequence.request.max_tokens || at_context {
        return Some((FinishReason::Length, decode(tokenizer, tokens)));
    }
    None
}
