//! Element-wise kernel benchmark at a Wan block's activation shapes (bf16): RMSNorm, LayerNorm, modulation,
//! gated residual, GELU-tanh and RoPE: forward, input gradient alone, and forward+backward through autograd
//! (seeded with ones, as candle's `backward()` on a non-scalar does; the PyTorch reference likewise).
//! Memory-bound ops: the record's `tflops` field carries effective bandwidth in TB/s instead (bytes each pass
//! must read and write once). CUDA builds only.

use candle_core::{DType, Device, Result, Tensor, Var};

use super::{record, time, Record};
use framesmith_models::wan::config::WanConfig;
use framesmith_nn::cuda::{elementwise as ew, norm, rope};

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
type Bwd = Box<dyn Fn(&Tensor, &Tensor) -> Result<Tensor>>;
/// An op's name, input shape, forward and input gradient.
type OpCase = (&'static str, Vec<usize>, Op, Bwd);

/// Each op with its input shape, its forward and its input gradient outside autograd.
fn ops(cfg: &WanConfig, dev: &Device, l: usize) -> Result<Vec<OpCase>> {
    let (d, f, h) = (cfg.dim, cfg.ffn_dim, cfg.num_heads);
    let hd = cfg.head_dim();
    let w = Tensor::randn(1f32, 0.1, d, dev)?.to_dtype(DType::BF16)?;
    let scale = Tensor::randn(0f32, 0.5, (1, 1, d), dev)?;
    let shift = Tensor::randn(0f32, 0.5, (1, 1, d), dev)?;
    let angles = Tensor::rand(-10f32, 10.0, (1, l, 1, hd / 2), dev)?;
    let (cos, sin) = (angles.cos()?, angles.sin()?);
    let eps = cfg.eps;
    let (w2, scale2, scale3) = (w.clone(), scale.clone(), scale.clone());
    let (cos2, sin2) = (cos.clone(), sin.clone());
    Ok(vec![
        (
            "rms_norm",
            vec![1, l, d],
            Box::new(move |x| norm::rms_norm(x, Some(&w), eps)),
            Box::new(move |x, dy| norm::rms_norm_backward(x, Some(&w2), dy, eps)),
        ),
        (
            "layer_norm",
            vec![1, l, d],
            Box::new(move |x| norm::layer_norm(x, None, None, eps)),
            Box::new(move |x, dy| norm::layer_norm_backward(x, None, dy, eps)),
        ),
        (
            "modulate",
            vec![1, l, d],
            Box::new(move |x| ew::modulate(x, &scale, &shift)),
            Box::new(move |_, dy| ew::modulate_backward(dy, &scale2)),
        ),
        (
            "gated_residual",
            vec![1, l, d],
            Box::new(move |x| ew::gated_residual(x, x, &scale3)),
            // Its input gradients are dy itself and dy · gate (the modulation backward's work): no bwd row.
            Box::new(|_, dy| Ok(dy.clone())),
        ),
        (
            "gelu_tanh",
            vec![l, f],
            Box::new(ew::gelu_tanh),
            Box::new(ew::gelu_tanh_backward),
        ),
        (
            "rope",
            vec![1, l, h, hd],
            Box::new(move |x| rope::rope_apply(x, &cos, &sin)),
            Box::new(move |_, dy| rope::rope_backward(dy, &cos2, &sin2)),
        ),
    ])
}

/// Bytes one forward must move: read the input once, write the output once (parameters are negligible).
fn fwd_bytes(shape: &[usize]) -> f64 {
    2.0 * 2.0 * shape.iter().product::<usize>() as f64
}

/// Runs every op forward, its input gradient alone (`bwd`: x and dy in, dx out), and forward+backward through
/// candle's autograd with the output gradient seeded with ones (`fwd+bwd autograd`).
pub fn run(dev: &Device, cfg: &WanConfig, opts: &KernelBench) -> Result<Vec<Record>> {
    let mut out = Vec::new();
    for (name, shape, op, bwd) in ops(cfg, dev, opts.tokens)? {
        let random = || Tensor::randn(0f32, 1.0, shape.as_slice(), dev)?.to_dtype(DType::BF16);
        let x = Var::from_tensor(&random()?)?;
        let dy = random()?;
        let label = format!("{shape:?}");
        let bytes = fwd_bytes(&shape);
        let t = time(dev, opts.warmup, opts.iters, || op(x.as_tensor()).map(drop))?;
        out.push(record("kernels", name, "fwd", &label, bytes, t));
        if name != "gated_residual" {
            // x and dy in, dx out.
            let t = time(dev, opts.warmup, opts.iters, || {
                bwd(x.as_tensor(), &dy).map(drop)
            })?;
            out.push(record("kernels", name, "bwd", &label, 1.5 * bytes, t));
        }
        let t = time(dev, opts.warmup, opts.iters, || {
            drop(op(x.as_tensor())?.backward()?);
            Ok(())
        })?;
        out.push(record(
            "kernels",
            name,
            "fwd+bwd autograd",
            &label,
            2.5 * bytes,
            t,
        ));
    }
    Ok(out)
}
