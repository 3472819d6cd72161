//! Backward of the block's element-wise steps, outside autograd: the CUDA kernels' `*_backward` functions on
//! f32 / bf16 CUDA tensors, the same math written with candle ops elsewhere (the dispatch the forward in
//! `block.rs` makes).

use candle_core::{Result, Tensor};

use crate::wan::rope::Rope;

pub(super) use framesmith_nn::ops::{
    cast, gate_backward, gelu_tanh_backward, layer_norm_backward_add, layer_norm_modulate,
    residual_layer_norm,
};

/// Input gradient of [`Rope::apply`]: `dy` rotated by the negative angles.
pub(super) fn rope_backward(rope: &Rope, dy: &Tensor) -> Result<Tensor> {
    framesmith_nn::ops::rope_backward(dy, &rope.cos, &rope.sin)
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Var};
    use framesmith_nn::init::randn;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    use super::*;
    use framesmith_nn::ops::modulate_backward;
    use framesmith_nn::testing::rel;

    fn grad_of(x: &Var, y: &Tensor, dy: &Tensor) -> Result<Tensor> {
        let store = (y * dy)?.sum_all()?.backward()?;
        store
            .get(x.as_tensor())
            .cloned()
            .ok_or_else(|| candle_core::Error::msg("no reference gradient"))
    }

    /// Each backward equals candle's autograd through the forward composition, per-sample and per-token
    /// modulation, and RoPE with padded rows.
    #[test]
    fn elementwise_backwards_match_autograd() -> Result<()> {
        let dev = Device::Cpu;
        let rng = &mut StdRng::seed_from_u64(41);
        let x = Var::from_tensor(&randn(rng, (2, 6, 8), 0.0, 1.5, &dev)?)?;
        let dy = randn(rng, (2, 6, 8), 0.0, 1.0, &dev)?;
        for tokens in [1, 6] {
            let scale = randn(rng, (2, tokens, 8), 0.0, 0.3, &dev)?;
            let shift = randn(rng, (2, tokens, 8), 0.0, 0.3, &dev)?;
            let y = x
                .as_tensor()
                .broadcast_mul(&(&scale + 1.0)?)?
                .broadcast_add(&shift)?;
            let want = grad_of(&x, &y, &dy)?;
            assert!(rel(&modulate_backward(&dy, &scale, DType::F32)?, &want)? < 1e-6);
            let y = x.as_tensor().broadcast_mul(&scale)?;
            let want = grad_of(&x, &y, &dy)?;
            assert!(rel(&gate_backward(&dy, &scale, DType::F32)?, &want)? < 1e-6);
        }
        let want = grad_of(&x, &x.as_tensor().gelu()?, &dy)?;
        let r = rel(&gelu_tanh_backward(x.as_tensor(), &dy)?, &want)?;
        assert!(r < 1e-5, "gelu rel {r}");

        let rope = Rope::new(&[[2, 2, 3], [1, 2, 2]], 12, 16, DType::F32, &dev)?;
        let q = Var::from_tensor(&randn(rng, (2, 12, 2, 16), 0.0, 1.0, &dev)?)?;
        let dq = randn(rng, (2, 12, 2, 16), 0.0, 1.0, &dev)?;
        let want = grad_of(&q, &rope.apply(q.as_tensor())?, &dq)?;
        assert!(rel(&rope_backward(&rope, &dq)?, &want)? < 1e-6);
        Ok(())
    }
}
