//! The GRPO objective, token level, with PPO clipping against the logprobs
//! recorded at sampling time (never recomputed), as pure tensor math.
//!
//! For each sampled token `t` of a member with group advantage `A`:
//!
//! ```text
//! ρ_t   = exp(logp_θ(t) − logp_recorded(t))
//! J_t   = min(ρ_t A, clip(ρ_t, 1 − ε_low, 1 + ε_high) A)
//! J_t   = max(J_t, C A)                       when A < 0 (truncated IS)
//! L     = −Σ_t w_t (J_t − β KL_t)             KL_t = e^(r−l) − (r−l) − 1, r = logp_ref, l = logp_θ
//! ```
//!
//! `C` (default 2) truncates the importance weight: for `A > 0` clipping
//! already bounds it at `1 + ε_high`, but for `A < 0` the unclipped branch
//! `ρ A` grows without bound when the learner's numerics (or staleness) make a
//! token far likelier than the engine sampled it; past `C` the token carries
//! no gradient (dual clip). `w_t` is the normalisation: `1 / tokens in the
//! step` (per token) or `1 / (tokens in its sequence × sequences in the step)`
//! (per sequence).

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
    pub clip_low: f64,
    pub clip_high: f64,
    /// Truncation `C` of the importance weight for negative advantages.
    pub is_cap: f64,
    pub normalisation: Normalisation,
    /// `β` of the KL to the reference policy; `None`: no reference.
    pub kl_coefficient: Option<f64>,
}

impl Default for LossConfig {
    fn default() -> LossConfig {
        LossConfig {
            clip_low: 0.2,
            clip_high: 0.2,
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
    /// Normalisation weights `w_t`, `(n,)`.
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
    let ratio = (logp - recorded)?.exp()?;
    let unclipped = (&ratio * advantages)?;
    let clipped = (ratio.clamp(1.0 - config.clip_low, 1.0 + config.clip_high)? * advantages)?;
    let surrogate = unclipped.minimum(&clipped)?;
    // C·A for negative advantages; a floor that never binds for the others.
    let floor = advantages.lt(0.0)?.where_cond(
        &(advantages * config.is_cap)?,
        &advantages.ones_like()?.affine(0.0, -1e30)?,
    )?;
    let mut objective = surrogate.maximum(&floor)?;
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
    pub ratio: f64,
    /// The token's gradient is cut by clipping or truncation.
    pub clipped: bool,
}

pub fn token_stats(logp: f64, recorded: f64, advantage: f64, config: &LossConfig) -> TokenStats {
    let ratio = (logp - recorded).exp();
    let clipped = (advantage > 0.0 && ratio > 1.0 + config.clip_high)
        || (advantage < 0.0 && (ratio < 1.0 - config.clip_low || ratio > config.is_cap));
    TokenStats { ratio, clipped }
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
    fn clipping_and_truncation_cut_the_gradient() {
        let c = LossConfig::default();
        let ln = |x: f32| x.ln();
        // A > 0, ρ = 1.5 > 1.2: clipped. A < 0, ρ = 0.5 < 0.8: clipped.
        // A < 0, ρ = 3 > C = 2: truncated. A < 0, ρ = 1.5: unclipped, gradient −ρA/n.
        let (_, g) = loss_and_grad(
            &[ln(1.5), ln(0.5), ln(3.0), ln(1.5)],
            &[0.0; 4],
            &[1.0, -1.0, -1.0, -1.0],
            &c,
        );
        assert_eq!(&g[..3], &[0.0, 0.0, 0.0]);
        assert!((g[3] - 1.5 / 4.0).abs() < 1e-6, "{g:?}");
        assert!(token_stats(ln(1.5) as f64, 0.0, 1.0, &c).clipped);
        assert!(token_stats(ln(3.0) as f64, 0.0, -1.0, &c).clipped);
        assert!(!token_stats(ln(1.5) as f64, 0.0, -1.0, &c).clipped);
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
