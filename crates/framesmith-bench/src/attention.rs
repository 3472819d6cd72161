//! Attention benchmark: bf16 self attention over the video tokens and cross attention over the text tokens of a
//! Wan variant, forward and forward+backward, through the same entry point training uses on this build
//! (cuDNN's fused kernels with the `cudnn` feature on CUDA, the portable implementation otherwise).

use candle_core::{DType, Device, Result, Tensor, Var};

use super::{record, time, Record};
use framesmith_models::wan::config::WanConfig;

/// What to measure.
#[derive(Clone, Debug)]
pub struct AttentionBench {
    /// Number of video tokens (32,760 for 480×832×81 frames).
    pub tokens: usize,
    /// Text tokens of the cross attention (Wan pads the prompt to 512).
    pub text_tokens: usize,
    /// Valid text tokens per sample for the padded cross-attention case (`None`: skip that case).
    pub text_len: Option<usize>,
    /// Batch size.
    pub batch: usize,
    /// Untimed repetitions first.
    pub warmup: usize,
    /// Timed repetitions.
    pub iters: usize,
    /// Time the portable tiled kernel (the CPU path, and what a GPU build without cuDNN ran) instead of the
    /// build's own attention.
    pub portable: bool,
}

impl Default for AttentionBench {
    fn default() -> Self {
        Self {
            tokens: 32_760,
            text_tokens: 512,
            text_len: Some(120),
            batch: 1,
            warmup: 3,
            iters: 10,
            portable: false,
        }
    }
}

/// The attention function this build trains with, or the portable kernel.
fn attention_of(
    portable: bool,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    kv_lens: Option<&[usize]>,
) -> Result<Tensor> {
    if portable {
        framesmith_nn::attention::portable_attention(q, k, v, kv_lens)
    } else {
        attention(q, k, v, kv_lens)
    }
}

/// The attention function this build trains with.
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, kv_lens: Option<&[usize]>) -> Result<Tensor> {
    #[cfg(feature = "cudnn")]
    {
        framesmith_nn::cuda::attention::attention(q, k, v, kv_lens)
    }
    #[cfg(not(feature = "cudnn"))]
    {
        framesmith_nn::attention::attention(q, k, v, kv_lens)
    }
}

/// Forward and backward for the output gradient `d_o`, as a training step runs them: the fused entry point
/// without a loss where this build has it, candle's autograd otherwise.
fn forward_backward(
    portable: bool,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    d_o: &Tensor,
    lens: Option<&[usize]>,
) -> Result<()> {
    #[cfg(feature = "cudnn")]
    if !portable && framesmith_nn::cuda::attention::runs_fused(q) {
        drop(framesmith_nn::cuda::attention::attention_forward_backward(
            q, k, v, d_o, lens,
        )?);
        return Ok(());
    }
    let o = attention_of(portable, q, k, v, lens)?;
    drop(o.mul(d_o)?.sum_all()?.backward()?);
    Ok(())
}

fn random(shape: (usize, usize, usize, usize), dev: &Device) -> Result<Tensor> {
    Tensor::randn(0f32, 1.0, shape, dev)?.to_dtype(DType::BF16)
}

/// Runs the self-attention, cross-attention and padded cross-attention cases for `cfg`'s head count and head
/// dimension.
pub fn run(dev: &Device, cfg: &WanConfig, opts: &AttentionBench) -> Result<Vec<Record>> {
    let (h, d, b, l) = (cfg.num_heads, cfg.head_dim(), opts.batch, opts.tokens);
    let mut cases: Vec<(&str, usize, Option<Vec<usize>>)> =
        vec![("self", l, None), ("cross", opts.text_tokens, None)];
    if let Some(len) = opts.text_len {
        cases.push((
            "cross padded",
            opts.text_tokens,
            Some(vec![len.min(opts.text_tokens); b]),
        ));
    }
    let mut out = Vec::new();
    let portable = opts.portable;
    for (case, lk, lens) in cases {
        let q = Var::from_tensor(&random((b, l, h, d), dev)?)?;
        let k = Var::from_tensor(&random((b, lk, h, d), dev)?)?;
        let v = Var::from_tensor(&random((b, lk, h, d), dev)?)?;
        let d_o = random((b, l, h, d), dev)?;
        let lens = lens.as_deref();
        let shape = format!("b={b} h={h} lq={l} lk={lk} d={d}");
        let fwd_flops = 4.0 * (b * h * l * lk * d) as f64;
        let t = time(dev, opts.warmup, opts.iters, || {
            attention_of(portable, q.as_tensor(), k.as_tensor(), v.as_tensor(), lens).map(drop)
        })?;
        let kind = if portable { "portable" } else { "attention" };
        out.push(record(kind, case, "fwd", &shape, fwd_flops, t));
        let t = time(dev, opts.warmup, opts.iters, || {
            forward_backward(
                portable,
                q.as_tensor(),
                k.as_tensor(),
                v.as_tensor(),
                &d_o,
                lens,
            )
        })?;
        out.push(record(kind, case, "fwd+bwd", &shape, 3.5 * fwd_flops, t));
        if case == "self" {
            // The same through candle's autograd with a loss `sum(o · dO)`: shows what the bookkeeping of a
            // loss on a large tensor costs (not part of a training step's attention).
            let t = time(dev, opts.warmup, opts.iters, || {
                let o = attention_of(portable, q.as_tensor(), k.as_tensor(), v.as_tensor(), lens)?;
                drop(o.mul(&d_o)?.sum_all()?.backward()?);
                Ok(())
            })?;
            out.push(record(
                kind,
                case,
                "fwd+bwd autograd",
                &shape,
                3.5 * fwd_flops,
                t,
            ));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_every_case_on_a_tiny_config() -> Result<()> {
        let opts = AttentionBench {
            tokens: 12,
            text_tokens: 5,
            text_len: Some(3),
            batch: 1,
            warmup: 0,
            iters: 1,
            portable: false,
        };
        let records = run(&Device::Cpu, &WanConfig::tiny(1), &opts)?;
        let passes: Vec<_> = records
            .iter()
            .map(|r| format!("{} {}", r.case, r.pass))
            .collect();
        assert_eq!(
            passes,
            [
                "self fwd",
                "self fwd+bwd",
                "self fwd+bwd autograd",
                "cross fwd",
                "cross fwd+bwd",
                "cross padded fwd",
                "cross padded fwd+bwd"
            ]
        );
        Ok(())
    }
}
