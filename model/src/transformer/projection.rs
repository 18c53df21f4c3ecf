//! The linear projections, each with its LoRA update where an adapter
//! adapts it, and the MLP made of them.

use super::Adapter;
use crate::lora::LowRank;
use crate::ModelConfig;
use candle_core::{Module, Result, Tensor};
use candle_nn::{Linear, VarBuilder};

/// A linear projection, with its LoRA update where one adapts it.
#[derive(Clone)]
pub(super) struct Projection {
    linear: Linear,
    low_rank: Option<LowRank>,
}

impl Module for Projection {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = match (&self.low_rank, self.linear.bias()) {
            // A frozen weight under an adapter: no gradient made for it.
            (Some(_), bias) => {
                let y = crate::frozen::matmul_t(x, self.linear.weight())?;
                match bias {
                    Some(b) => y.broadcast_add(b)?,
                    None => y,
                }
            }
            (None, _) => self.linear.forward(x)?,
        };
        match &self.low_rank {
            Some(update) => y + update.forward(x)?,
            None => Ok(y),
        }
    }
}

/// The projection `name` under `vb`, `d_in → d_out`, with its LoRA update
/// when `adapter` adapts it.
pub(super) fn projection(
    vb: &VarBuilder,
    name: &str,
    (d_in, d_out): (usize, usize),
    bias: bool,
    adapter: Option<&Adapter>,
) -> Result<Projection> {
    let vb = vb.pp(name);
    let weight = vb.get((d_out, d_in), "weight")?;
    let bias = if bias {
        Some(vb.get(d_out, "bias")?)
    } else {
        None
    };
    let low_rank = match adapter {
        Some(adapter) => LowRank::load(adapter, &vb.prefix(), d_in, d_out)?,
        None => None,
    };
    Ok(Projection {
        linear: Linear::new(weight, bias),
        low_rank,
    })
}

#[derive(Clone)]
pub(super) struct Mlp {
    gate_proj: Projection,
    up_proj: Projection,
    down_proj: Projection,
}

impl Mlp {
    pub(super) fn load(vb: &VarBuilder, c: &ModelConfig, adapter: Option<&Adapter>) -> Result<Mlp> {
        let (hidden, ffn) = (c.hidden_size, c.intermediate_size);
        Ok(Mlp {
            gate_proj: projection(vb, "gate_proj", (hidden, ffn), false, adapter)?,
            up_proj: projection(vb, "up_proj", (hidden, ffn), false, adapter)?,
            down_proj: projection(vb, "down_proj", (ffn, hidden), false, adapter)?,
        })
    }

    /// SwiGLU: `down(silu(gate(x)) * up(x))`.
    pub(super) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let gate = candle_nn::ops::silu(&self.gate_proj.forward(x)?)?;
        self.down_proj.forward(&(gate * self.up_proj.forward(x)?)?)
    }
}
