//! The GRPO objective, token level, with the logprobs recorded at sampling
//! time (never recomputed) as the behaviour policy of a truncated importance
//! weight, as pure tensor math.
//!
//! For each sampled token `t` of a member with group advantage `A`, `l` the
//! learner's logprob and `sg` a value without gradient:
//!
//! ```text
//! w_t   = min(exp(sg(l_t) − logp_recorded(t)), C)    the policy now over the one that sampled
//! J_t   = w_t A exp(l_t − sg(l_t))                    = w_t A; gradient w_t A ∇l_t
//! L     = −Σ_t n_t (J_t − β KL_t)                    KL_t = e^(r−l) − (r−l) − 1, r = logp_ref
//! ```
//!
//! The ratio is taken against the learner's own policy at the step (one
//! update per batch: the proximal policy of decoupled PPO is the learner's
//! weights as the step starts), and the sampling policy only weights each
//! token (truncated importance sampling, `C` default 2). PPO's clip against
//! the recorded logprobs cut the gradient wherever the engine's distribution
//! differs from the learner's by more than ε whatever the staleness: under a
//! grammar (vLLM's `structured_outputs`), whose recorded logprobs are over
//! the tokens it allowed, a third of a mini-swe-agent group's tokens had a
//! ratio below 0.8, so negative advantages carried no gradient and a step
//! raised the tokens of failed rollouts too. Here every token keeps a
//! gradient in its advantage's direction, scaled by how likely the policy
//! now finds it against how it was sampled. `n_t` is the normalisation:
//! `1 / tokens in the step` (per token) or `1 / (tokens in its sequence ×
//! sequences in the step)` (per sequence).

use candle_core::{Result, Tensor};

/// How a step's token losses are averaged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Normalisation {
    /// Every sampled token of the step weighs the same (long answers count more).
    PerToken,
    /// Mean over each sequence's tokens, then over sequences.
    PerSequence,
}

impl Normalisation {
    /// The names `--normalisation` takes.
    pub const NAMES: [&'static str; 2] = ["per-token", "per-sequence"];
}

impl std::str::FromStr for Normalisation {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Normalisation, String> {
        match s {
            "per-token" => Ok(Normalisation::PerToken),
            "per-sequence" => Ok(Normalisation::PerSequence),
            other => Err(format!("{other:?} is not one of {:?}", Self::NAMES)),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct LossConfig {
    /// Truncation `C` of the importance weight.
    pub is_cap: f64,
    pub normalisation: Normalisation,
    /// `β` of the KL to the reference policy; `None`: no reference.
    pub kl_coefficient: Option<f64>,
}

impl Default for LossConfig {
    fn default() -> LossConfig {
        LossConfig {
            is_cap: 2.0,
            normalisation: Normalisation::PerToken,
            kl_coefficient: None,
        }
    }
}

/// The loss's inputs for a set of sampled tokens, one entry per token.
pub struct TokenInputs<'a> {
    /// `logp_θ`, differentiable, `(n,)`.
    pub logp: &'a Tensor,
    /// Sampling-time logprobs from the log, `(n,)`.
    pub recorded: &'a Tensor,
    /// The advantage of each token's member, `(n,)`.
    pub advantages: &'a Tensor,
    /// Normalisation weights `n_t`, `(n,)`.
    pub weights: &'a Tensor,
    /// Reference logprobs (no gradient), `(n,)`, when the KL term is on.
    pub reference: Option<&'a Tensor>,
}

/// `L` over the given tokens (a scalar, differentiable through `logp`).
pub fn grpo_loss(inputs: &TokenInputs, config: &LossConfig) -> Result<Tensor> {
    let TokenInputs {
        logp,
        recorded,
        advantages,
        weights,
        reference,
    } = *inputs;
    let now = logp.detach();
    let importance = (&now - recorded)?.exp()?.clamp(0.0, config.is_cap)?;
    // exp(l − sg(l)) is 1 with the gradient of l.
    let ratio = (logp - &now)?.exp()?;
    let mut objective = ((ratio * importance)? * advantages)?;
    if let (Some(beta), Some(reference)) = (config.kl_coefficient, reference) {
        let log_ratio = (reference - logp)?;
        let kl = ((log_ratio.exp()? - &log_ratio)? - 1.0)?;
        objective = (objective - (kl * beta)?)?;
    }
    (objective * weights)?.sum_all()?.neg()
}

/// Per-token diagnostics of the same formula, on plain numbers.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TokenStats {
    /// `exp(l − logp_recorded)`, before truncation.
    pub ratio: f64,
    /// The token's importance weight is truncated at `C`.
    pub truncated: bool,
}

pub fn token_stats(logp: f64, recorded: f64, config: &LossConfig) -> TokenStats {
    let ratio = (logp - recorded).exp();
    TokenStats {
        ratio,
        truncated: ratio > config.is_cap,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn loss_and_grad(
        logp: &[f32],
        recorded: &[f32],
        adv: &[f32],
        config: &LossConfig,
    ) -> (f32, Vec<f32>) {
        let d = &Device::Cpu;
        let n = logp.len();
        let var = Var::new(logp, d).unwrap();
        let recorded = Tensor::new(recorded, d).unwrap();
        let advantages = Tensor::new(adv, d).unwrap();
        let weights = Tensor::full(1.0 / n as f32, n, d).unwrap();
        let inputs = TokenInputs {
            logp: var.as_tensor(),
            recorded: &recorded,
            advantages: &advantages,
            weights: &weights,
            reference: None,
        };
        let loss = grpo_loss(&inputs, config).unwrap();
        let grads = loss.backward().unwrap();
        let g = grads
            .get(var.as_tensor())
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        (loss.to_scalar::<f32>().unwrap(), g)
    }

    #[test]
    fn on_policy_loss_is_minus_the_mean_advantage_and_its_gradient_the_policy_gradient() {
        let (loss, grad) = loss_and_grad(
            &[-1.0, -2.0],
            &[-1.0, -2.0],
            &[1.0, -0.5],
            &LossConfig::default(),
        );
        assert!((loss - (-(1.0 - 0.5) / 2.0)).abs() < 1e-6);
        // d(−ρA/n)/dlogp = −ρA/n at ρ = 1.
        assert!(
            (grad[0] + 0.5).abs() < 1e-6 && (grad[1] - 0.25).abs() < 1e-6,
            "{grad:?}"
        );
    }

    #[test]
    fn every_token_keeps_its_advantages_direction_weighted_by_its_truncated_ratio() {
        let c = LossConfig::default();
        let ln = |x: f32| x.ln();
        // Ratios to the sampling policy 1.5, 0.5 (under PPO's clip these two
        // carried no gradient), 3 (truncated at C = 2) and 0.01 (a token a
        // grammar forced that the policy alone rarely writes).
        let (loss, g) = loss_and_grad(
            &[ln(1.5), ln(0.5), ln(3.0), ln(0.01)],
            &[0.0; 4],
            &[1.0, -1.0, -1.0, -1.0],
            &c,
        );
        // d(−w A exp(l − sg l)/n)/dl = −w A / n.
        let want = [-1.5 / 4.0, 0.5 / 4.0, 2.0 / 4.0, 0.01 / 4.0];
        for (got, want) in g.iter().zip(want) {
            assert!((got - want).abs() < 1e-6, "{g:?}");
        }
        assert!((loss - (-(1.5 - 0.5 - 2.0 - 0.01) / 4.0)).abs() < 1e-6);
        assert!(token_stats(ln(3.0) as f64, 0.0, &c).truncated);
        assert!(!token_stats(ln(1.5) as f64, 0.0, &c).truncated);
    }

    #[test]
    fn kl_to_the_reference_is_zero_at_the_reference_and_positive_elsewhere() {
        let d = &Device::Cpu;
        let logp = Tensor::new(&[-1.0f32, -1.0], d).unwrap();
        let zeros = Tensor::zeros(2, candle_core::DType::F32, d).unwrap();
        let weights = Tensor::new(&[0.5f32, 0.5], d).unwrap();
        let c = LossConfig {
            kl_coefficient: Some(1.0),
            ..Default::default()
        };
        let at = |reference: &Tensor| {
            grpo_loss(
                &TokenInputs {
                    logp: &logp,
                    recorded: &logp,
                    advantages: &zeros,
                    weights: &weights,
                    reference: Some(reference),
                },
                &c,
            )
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
        };
        assert!(at(&logp).abs() < 1e-7);
        assert!(at(&(&logp - 0.5).unwrap()) > 0.0);
    }
}
