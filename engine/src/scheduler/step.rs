//! One step: every sequence that feeds it, forwarded as one ragged batch;
//! then each sequence that has fed its whole prompt samples a token.

use super::Loop;
use crate::sampling::{sample, Sampled};
use candle_core::{Device, Tensor};
use forgelog_model::{KvCache, Logits};
use rayon::prelude::*;
use std::time::{Duration, Instant};

impl Loop {
    pub(super) fn step(&mut self) {
        let started = Instant::now();
        // A client that went away no longer needs its tokens.
        self.active.retain(|s| !s.reply.is_closed());
        let feeds = self.start_sequences();
        let mut batch: Vec<(&[u32], &mut KvCache)> = self
            .active
            .iter_mut()
            .zip(&feeds)
            .filter(|(_, &feeds)| feeds)
            .map(|(s, _)| {
                (
                    next_input(&s.request.prompt, s.prefilled, &s.tokens),
                    &mut s.cache,
                )
            })
            .collect();
        let forward = Instant::now();
        let logits = self
            .model
            .forward_batch(&mut batch, Logits::Last)
            // A GPU runs the step asynchronously: wait for it, so the phases
            // split device time from host time (reading the logits would wait anyway).
            .and_then(|logits| self.model.device().synchronize().map(|()| logits));
        let sampling = Instant::now();
        record_step_phase("schedule", forward - started);
        record_step_phase("forward", sampling - forward);
        let logits = match logits.and_then(on_host) {
            Ok(logits) => logits,
            Err(e) => {
                for sequence in self.active.drain(..) {
                    let _ = sequence.reply.send(Err(e.to_string()));
                }
                return;
            }
        };
        let rows = self.rows_to_sample(&feeds, logits);
        let sampled = self.sample(rows);
        self.settle(sampled);
        record_step_phase("sample", sampling.elapsed());
        metrics::gauge!("forgelog_engine_running").set(self.active.len() as f64);
        metrics::gauge!("forgelog_engine_prefix_cache_tokens").set(self.prefix_cache.held() as f64);
    }

    /// Which sequences sample now (decoding, or their prompt's last chunk
    /// fed), with their logits; a prompt fed whole goes into the prefix cache.
    fn rows_to_sample(&mut self, feeds: &[bool], logits: Vec<Tensor>) -> Vec<Option<Tensor>> {
        let mut logits = logits.into_iter();
        let mut rows: Vec<Option<Tensor>> = Vec::with_capacity(self.active.len());
        for (sequence, &fed) in self.active.iter_mut().zip(feeds) {
            let prompt_len = sequence.request.prompt.len();
            let row = fed.then(|| logits.next().expect("logits for every sequence fed"));
            if fed && sequence.prefilled < prompt_len {
                sequence.prefilled = (sequence.prefilled + PREFILL_CHUNK).min(prompt_len);
                if sequence.prefilled < prompt_len {
                    rows.push(None);
                    continue;
                }
                if let Ok(prompt_cache) = sequence.cache.fork() {
                    self.prefix_cache
                        .insert(sequence.request.prompt.clone(), prompt_cache);
                }
            }
            rows.push(row);
        }
        rows
    }

    /// Each sequence samples from its own logits with its own generator:
    /// independent, so spread over the cores (a vocabulary of 150k makes
    /// this the host's larger share of a step). `None` where a sequence has
    /// no row.
    fn sample(&mut self, rows: Vec<Option<Tensor>>) -> Vec<Option<Result<Sampled, String>>> {
        let stop_token_ids = &self.stop_token_ids;
        self.active
            .par_iter_mut()
            .zip(rows)
            .map(|(sequence, row)| {
                let mut row = match row?.flatten_all().and_then(|l| l.to_vec1::<f32>()) {
                    Ok(row) => row,
                    Err(e) => return Some(Err(e.to_string())),
                };
                let request = &mut sequence.request;
                if let Some(grammar) = &mut request.grammar {
                    grammar.mask(&mut row, stop_token_ids);
                }
                let sampled = sample(&row, &request.sampling, &mut sequence.rng);
                if let Some(grammar) = &mut request.grammar {
                    grammar.advance(sampled.token);
                }
                Some(Ok(sampled))
            })
            .collect()
    }
}

/// A step's logits on the host, in one copy. Each sequence's rows are a
/// view of one device matrix, and reading a view off a GPU copies its whole
/// matrix: per sequence, that is quadratic in the batch (1.7 s a step at 64
/// sequences of a 152k vocabulary on an H200).
fn on_host(logits: Vec<Tensor>) -> candle_core::Result<Vec<Tensor>> {
    if logits.first().is_none_or(|l| l.device().is_cpu()) {
        return Ok(logits);
    }
    let all = Tensor::cat(&logits, 0)?.to_device(&Device::Cpu)?;
    let mut row = 0;
    logits
        .iter()
        .map(|l| {
            let n = l.dim(0)?;
            row += n;
            all.narrow(0, row - n, n)
        })
        .collect()
}

/// Where a step's time goes: `schedule` (admission, prefix-cache lookups),
/// `forward` (the model, on its device), `sample` (logits to the host,
/// sampling, stop checks, replies).
fn record_step_phase(phase: &'static str, took: Duration) {
    metrics::histogram!("forgelog_engine_step_seconds", "phase" => phase)
        .record(took.as_secs_f64());
}

/// Prompt tokens fed per step: bounds the attention scores of a long prompt
/// and keeps decoding sequences moving while it prefills.
const PREFILL_CHUNK: usize = 512;

/// What a sequence feeds next: its next prompt chunk, then its last sampled token.
fn next_input<'a>(prompt: &'a [u32], prefilled: usize, sampled: &'a [u32]) -> &'a [u32] {
    if prefilled < prompt.len() {
        &prompt[prefilled..(prefilled + PREFILL_CHUNK).min(prompt.len())]
    } else {
        &sampled[sampled.len() - 1..]
    }
}
