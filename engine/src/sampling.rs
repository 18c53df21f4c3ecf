//! Choosing the next token and its logprob (pure).
//!
//! The logprob reported is vLLM's *processed* logprob: `log_softmax(logits / T)`
//! at the sampled token; with `T = 0` (greedy) it is taken from the raw
//! distribution. top-k/top-p restrict which tokens can be drawn but do not
//! renormalize the reported logprob (forgelog's proxy always sends `top_p = 1`).

use forgelog_model::log_softmax;

/// Temperatures below this are greedy (as in vLLM): dividing by them would overflow.
pub const GREEDY_BELOW: f32 = 1e-5;

#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// `0` (anything below [`GREEDY_BELOW`]) means greedy.
    pub temperature: f32,
    pub top_p: f32,
    /// `None` (or 0) means the whole vocabulary.
    pub top_k: Option<usize>,
    pub seed: Option<u64>,
}

impl Default for SamplerConfig {
    fn default() -> SamplerConfig {
        SamplerConfig {
            temperature: 1.0,
            top_p: 1.0,
            top_k: None,
            seed: None,
        }
    }
}

/// SplitMix64: tiny, seedable, and the same on every platform.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampled {
    pub token: u32,
    pub logprob: f32,
}

/// The processed logprobs the engine reports for `logits` (see the module docs).
pub fn processed_logprobs(logits: &[f32], temperature: f32) -> Vec<f32> {
    if temperature < GREEDY_BELOW {
        log_softmax(logits)
    } else {
        log_softmax(&logits.iter().map(|l| l / temperature).collect::<Vec<_>>())
    }
}

pub fn sample(logits: &[f32], params: &SamplerConfig, rng: &mut Rng) -> Sampled {
    let logprobs = processed_logprobs(logits, params.temperature);
    let token = if params.temperature < GREEDY_BELOW {
        argmax(&logprobs)
    } else {
        draw(&logprobs, params, rng.next_f64())
    };
    Sampled {
        token: token as u32,
        logprob: logprobs[token],
    }
}

/// The first index of the largest value.
fn argmax(values: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best
}

/// Inverse-CDF draw with `u` in `[0, 1)` over the tokens top-k/top-p keep.
fn draw(logprobs: &[f32], params: &SamplerConfig, u: f64) -> usize {
    let top_k = params.top_k.filter(|&k| k > 0 && k < logprobs.len());
    let restricted = top_k.is_some() || params.top_p < 1.0;
    let candidates: Vec<usize> = if restricted {
        let mut order: Vec<usize> = (0..logprobs.len()).collect();
        order.sort_by(|&a, &b| logprobs[b].total_cmp(&logprobs[a]).then(a.cmp(&b)));
        order.truncate(top_k.unwrap_or(order.len()));
        let mut mass = 0.0f64;
        let keep = order
            .iter()
            .position(|&i| {
                mass += (logprobs[i] as f64).exp();
                mass >= params.top_p as f64
            })
            .map_or(order.len(), |last| last + 1);
        order.truncate(keep);
        order
    } else {
        (0..logprobs.len()).collect()
    };
    let total: f64 = candidates.iter().map(|&i| (logprobs[i] as f64).exp()).sum();
    let target = u * total;
    let mut mass = 0.0f64;
    for &i in &candidates {
        mass += (logprobs[i] as f64).exp();
        if mass > target {
            return i;
        }
    }
    *candidates.last().expect("a vocabulary has tokens")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_argmax_with_its_raw_logprob() {
        let logits = [1.0, 3.0, 2.0];
        for temperature in [0.0, 1e-30] {
            let params = SamplerConfig {
                temperature,
                ..Default::default()
            };
            let s = sample(&logits, &params, &mut Rng::new(0));
            assert_eq!(s.token, 1);
            assert!((s.logprob - log_softmax(&logits)[1]).abs() < 1e-6);
        }
    }

    #[test]
    fn temperature_scales_before_log_softmax() {
        let logits = [0.5, 1.5, -1.0];
        let params = SamplerConfig {
            temperature: 0.5,
            seed: Some(7),
            ..Default::default()
        };
        let s = sample(&logits, &params, &mut Rng::new(7));
        let expected = log_softmax(&[1.0, 3.0, -2.0])[s.token as usize];
        assert!((s.logprob - expected).abs() < 1e-6);
    }

    #[test]
    fn seeded_draws_repeat_and_follow_the_distribution() {
        let logits = [0.0f32, (3.0f32).ln()]; // p = [0.25, 0.75]
        let params = SamplerConfig::default();
        let run = |seed| {
            let mut rng = Rng::new(seed);
            (0..4000)
                .map(|_| sample(&logits, &params, &mut rng).token)
                .collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        let ones = run(42).iter().filter(|&&t| t == 1).count() as f64 / 4000.0;
        assert!((ones - 0.75).abs() < 0.03, "{ones}");
    }

    #[test]
    fn top_k_and_top_p_restrict_the_candidates() {
        let logits = [3.0, 2.9, -5.0, 2.8];
        let mut rng = Rng::new(1);
        for _ in 0..200 {
            let k1 = sample(
                &logits,
                &SamplerConfig {
                    top_k: Some(1),
                    ..Default::default()
                },
                &mut rng,
            );
            assert_eq!(k1.token, 0);
            let p = sample(
                &logits,
                &SamplerConfig {
                    top_p: 0.5,
                    ..Default::default()
                },
                &mut rng,
            );
            assert!(p.token == 0 || p.token == 1, "{p:?}");
        }
    }
}
