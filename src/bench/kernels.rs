//! Element-wise kernel benchmark at a Wan block's activation shapes (bf16): RMSNorm, LayerNorm, modulation,
//! gated residual, GELU-tanh and RoPE, forward and forward+backward. Memory-bound ops: the record's `tflops`
//! field carries effective bandwidth in TB/s instead (bytes each pass must read and write once). The backward
//! is seeded with ones (candle's `backward()` on a non-scalar), the PyTorch reference likewise. CUDA builds only.

use candle_core::{DType, Device, Result, Tensor, Var};

use super::{record, time, Record};
use crate::models::wan::config::WanConfig;
use crate::nn::cuda::{elementwise as ew, norm, rope};

/// What to measure.
#[derive(Clone, Debug)]
pub struct KernelBench {
    /// Video tokens.
    pub tokens: usize,
    /// Untimed repetitions first.
    pub warmup: usize,
    /// Timed repetitions.
    pub iters: usize,
}

impl Default for KernelBench {
    fn default() -> Self {
        Self {
            tokens: 32_760,
            warmup: 3,
            iters: 20,
        }
    }
}

type Op = Box<dyn Fn(&Tensor) -> Result<Tensor>>;

/// Each op with its input shape.
fn ops(cfg: &WanConfig, dev: &Device, l: usize) -> Result<Vec<(&'static str, Vec<usize>, Op)>> {
    let (d, f, h) = (cfg.dim, cfg.ffn_dim, cfg.num_heads);
    let hd = cfg.head_dim();
    let w = Tensor::randn(1f32, 0.1, d, dev)?.to_dtype(DType::BF16)?;
    let scale = Tensor::randn(0f32, 0.5, (1, 1, d), dev)?;
    let shift = Tensor::randn(0f32, 0.5, (1, 1, d), dev)?;
    let angles = Tensor::rand(-10f32, 10.0, (1, l, 1, hd / 2), dev)?;
    let (cos, sin) = (angles.cos()?, angles.sin()?);
    let eps = cfg.eps;
    Ok(vec![
        (
            "rms_norm",
            vec![1, l, d],
            Box::new(move |x| norm::rms_norm(x, Some(&w), eps)),
        ),
        (
            "layer_norm",
            vec![1, l, d],
            Box::new(move |x| norm::layer_norm(x, None, None, eps)),
        ),
        ("modulate", vec![1, l, d], {
            let (scale, shift) = (scale.clone(), shift.clone());
            Box::new(move |x| ew::modulate(x, &scale, &shift))
        }),
        (
            "gated_residual",
            vec![1, l, d],
            Box::new(move |x| ew::gated_residual(x, x, &scale)),
        ),
        ("gelu_tanh", vec![l, f], Box::new(ew::gelu_tanh)),
        (
            "rope",
            vec![1, l, h, hd],
            Box::new(move |x| rope::rope_apply(x, &cos, &sin)),
        ),
    ])
}

/// Bytes one forward must move: read the input once, write the output once (parameters are negligible).
fn fwd_bytes(shape: &[usize]) -> f64 {
    2.0 * 2.0 * shape.iter().product::<usize>() as f64
}

/// Runs every op forward, and forward+backward with the output gradient seeded with ones.
pub fn run(dev: &Device, cfg: &WanConfig, opts: &KernelBench) -> Result<Vec<Record>> {
    let mut out = Vec::new();
    for (name, shape, op) in ops(cfg, dev, opts.tokens)? {
        let x = Var::from_tensor(
            &Tensor::randn(0f32, 1.0, shape.as_slice(), dev)?.to_dtype(DType::BF16)?,
        )?;
        let label = format!("{shape:?}");
        let bytes = fwd_bytes(&shape);
        let t = time(dev, opts.warmup, opts.iters, || op(x.as_tensor()).map(drop))?;
        out.push(record("kernels", name, "fwd", &label, bytes, t));
        let t = time(dev, opts.warmup, opts.iters, || {
            drop(op(x.as_tensor())?.backward()?);
            Ok(())
        })?;
        // Backward reads x and dy and writes dx: 1.5× the forward's bytes on top of it.
        out.push(record("kernels", name, "fwd+bwd", &label, 2.5 * bytes, t));
    }
    Ok(out)
}
