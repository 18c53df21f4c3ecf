//! `x Wᵀ` for a weight nobody trains (LoRA's frozen base) while a gradient
//! flows through `x`. candle's matmul backward computes the gradient of both
//! sides whatever needs one, so a frozen weight would get a full-size
//! gradient per step (measured: LoRA's learner at 30 bytes a parameter
//! against full fine-tuning's 16). This op's backward gives only `x`'s:
//! `∂L/∂x = ∂L/∂y · W`.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Storage, Tensor};

pub(crate) struct FrozenMatmul {
    /// `(out, in)`; shared, not copied.
    weight: Tensor,
}

/// A storage matmul's `(batch, m, n, k)`, the right side's layout, and the
/// result's shape.
type MatmulPlan = ((usize, usize, usize, usize), Layout, Shape);

impl FrozenMatmul {
    /// The batched-matmul arguments of `x (rows, in) · Wᵀ (in, out)`:
    /// `(1, rows, out, in)` and the layout of `Wᵀ`.
    fn plan(&self, x: &Layout) -> Result<MatmulPlan> {
        let (rows, d_in) = x.shape().dims2()?;
        let d_out = self.weight.dim(0)?;
        let transposed = self.weight.layout().transpose(0, 1)?;
        Ok((
            (1, rows, d_out, d_in),
            transposed,
            Shape::from((rows, d_out)),
        ))
    }
}

impl CustomOp1 for FrozenMatmul {
    fn name(&self) -> &'static str {
        "frozen-matmul"
    }

    fn cpu_fwd(&self, x: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (bmnk, w_layout, shape) = self.plan(layout)?;
        let (storage, _) = self.weight.storage_and_layout();
        let Storage::Cpu(w) = &*storage else {
            candle_core::bail!("frozen-matmul: the weight is not on the CPU");
        };
        Ok((x.matmul(w, bmnk, layout, &w_layout)?, shape))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        x: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (bmnk, w_layout, shape) = self.plan(layout)?;
        let (storage, _) = self.weight.storage_and_layout();
        let Storage::Cuda(w) = &*storage else {
            candle_core::bail!("frozen-matmul: the weight is not on the GPU");
        };
        Ok((x.matmul(w, bmnk, layout, &w_layout)?, shape))
    }

    fn bwd(&self, _x: &Tensor, _y: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(grad.matmul(&self.weight)?))
    }
}

/// `x Wᵀ`, through [`FrozenMatmul`] when `x` carries a gradient and `W` does not.
pub(crate) fn matmul_t(x: &Tensor, weight: &Tensor) -> Result<Tensor> {
    if x.track_op() && !weight.track_op() {
        x.contiguous()?.apply_op1(FrozenMatmul {
            weight: weight.clone(),
        })
    } else {
        x.matmul(&weight.t()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::max_abs_diff;
    use candle_core::{Device, Var};

    /// The input's gradient is plain matmul's; the frozen weight gets none.
    #[test]
    fn only_the_input_gets_a_gradient_and_it_is_matmuls() {
        let dev = Device::Cpu;
        let x = Var::from_tensor(
            &Tensor::arange(0f32, 12.0, &dev)
                .unwrap()
                .reshape((3, 4))
                .unwrap()
                .sin()
                .unwrap(),
        )
        .unwrap();
        let w = Tensor::arange(0f32, 20.0, &dev)
            .unwrap()
            .reshape((5, 4))
            .unwrap()
            .cos()
            .unwrap();
        let c = Tensor::arange(1f32, 16.0, &dev)
            .unwrap()
            .reshape((3, 5))
            .unwrap();
        let frozen = matmul_t(x.as_tensor(), &w).unwrap();
        let w_t = w.t().unwrap();
        let plain = x.as_tensor().matmul(&w_t).unwrap();
        let diff = max_abs_diff(&frozen, &plain);
        assert!(diff < 1e-6, "{diff}");
        let loss = |y: &Tensor| (y * &c).unwrap().sum_all().unwrap();
        let (g_frozen, g_plain) = (
            loss(&frozen).backward().unwrap(),
            loss(&plain).backward().unwrap(),
        );
        let (a, b) = (
            g_frozen.get(x.as_tensor()).unwrap(),
            g_plain.get(x.as_tensor()).unwrap(),
        );
        let diff = max_abs_diff(a, b);
        assert!(diff < 1e-5, "{diff}");
        assert!(
            g_frozen.get(&w).is_none(),
            "no gradient for the frozen weight"
        );
        assert!(g_plain.get(&w_t).is_some(), "candle's matmul makes one");
    }
}
