//! AdamW (decoupled weight decay) with global-norm gradient clipping. Written
//! out rather than taken from candle-nn so that its moments can be saved with
//! a checkpoint and a restarted learner continues exactly where it stopped.

use candle_core::{Result, Tensor, Var};
use std::collections::HashMap;

#[derive(Debug, Clone, PartialEq)]
pub struct AdamWConfig {
    pub learning_rate: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// Gradients are scaled down so that their global L2 norm is at most this.
    pub max_grad_norm: f64,
}

impl Default for AdamWConfig {
    fn default() -> AdamWConfig {
        AdamWConfig {
            learning_rate: 1e-6,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            max_grad_norm: 1.0,
        }
    }
}

/// First and second moments per variable, and the number of updates made.
pub struct AdamW {
    pub config: AdamWConfig,
    pub steps: u64,
    /// By variable name.
    pub moments: HashMap<String, (Tensor, Tensor)>,
}

impl AdamW {
    pub fn new(config: AdamWConfig) -> AdamW {
        AdamW {
            config,
            steps: 0,
            moments: HashMap::new(),
        }
    }

    /// One update of `vars` with `grads` (same order; `None`: no gradient
    /// reached the variable). Returns the global gradient norm before clipping.
    pub fn step(&mut self, vars: &[(String, Var)], grads: &[Option<Tensor>]) -> Result<f64> {
        let mut square_sum = 0.0f64;
        for g in grads.iter().flatten() {
            square_sum += g
                .sqr()?
                .sum_all()?
                .to_dtype(candle_core::DType::F64)?
                .to_scalar::<f64>()?;
        }
        let norm = square_sum.sqrt();
        let scale = if norm > self.config.max_grad_norm {
            self.config.max_grad_norm / norm
        } else {
            1.0
        };
        self.steps += 1;
        let c = &self.config;
        let t = self.steps as i32;
        let (bias1, bias2) = (1.0 - c.beta1.powi(t), 1.0 - c.beta2.powi(t));
        for ((name, var), grad) in vars.iter().zip(grads) {
            let Some(grad) = grad else { continue };
            let grad = (grad * scale)?;
            let (m, v) = match self.moments.remove(name) {
                Some(moments) => moments,
                None => (grad.zeros_like()?, grad.zeros_like()?),
            };
            let m = ((m * c.beta1)? + (&grad * (1.0 - c.beta1))?)?;
            let v = ((v * c.beta2)? + (grad.sqr()? * (1.0 - c.beta2))?)?;
            let update = ((&m / bias1)? / ((&v / bias2)?.sqrt()? + c.eps)?)?;
            let decayed = (var.as_tensor() * (1.0 - c.learning_rate * c.weight_decay))?;
            var.set(&(decayed - (update * c.learning_rate)?)?)?;
            self.moments.insert(name.clone(), (m, v));
        }
        Ok(norm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn first_step_moves_each_weight_by_the_learning_rate_against_its_gradient() {
        let var = Var::new(&[1.0f32, -1.0], &Device::Cpu).unwrap();
        let vars = vec![("w".to_string(), var.clone())];
        let mut adam = AdamW::new(AdamWConfig {
            learning_rate: 0.1,
            max_grad_norm: 100.0,
            ..Default::default()
        });
        let grad = Tensor::new(&[3.0f32, -0.5], &Device::Cpu).unwrap();
        let norm = adam.step(&vars, &[Some(grad)]).unwrap();
        assert!((norm - (9.25f64).sqrt()).abs() < 1e-6);
        let w = var.as_tensor().to_vec1::<f32>().unwrap();
        assert!(
            (w[0] - 0.9).abs() < 1e-5 && (w[1] + 0.9).abs() < 1e-5,
            "{w:?}"
        );
    }
}
