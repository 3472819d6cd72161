//! Linear benchmark: the frozen base layers of a Wan block (q/k/v/o `dim → dim`, FFN up `dim → ffn_dim`, FFN
//! down `ffn_dim → dim`) over the video tokens, forward plus input gradient (`y = x Wᵀ`, `dx = dy W`, never a
//! weight gradient), with a bf16 weight and with an FP8 block-64 weight dequantised on the fly.

use candle_core::{DType, Device, Result, Tensor};

use super::{record, time_interleaved, Case, Record};
use framesmith_models::wan::config::WanConfig;

/// What to measure.
#[derive(Clone, Debug)]
pub struct LinearBench {
    /// Rows of the activation (video tokens × batch).
    pub tokens: usize,
    /// Untimed repetitions first.
    pub warmup: usize,
    /// Timed repetitions.
    pub iters: usize,
}

impl Default for LinearBench {
    fn default() -> Self {
        Self {
            tokens: 32_760,
            warmup: 3,
            iters: 20,
        }
    }
}

/// Dequantises FP8 codes with block-64 scales into bf16 on this build's fastest path.
fn dequantize(codes: &Tensor, scale: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    {
        framesmith_nn::cuda::fp8::dequantize_fp8_cuda(codes, scale, DType::BF16)
    }
    #[cfg(not(feature = "cuda"))]
    {
        fp8_reference(codes, scale)
    }
}

#[cfg(not(feature = "cuda"))]
fn fp8_reference(codes: &Tensor, scale: &Tensor) -> Result<Tensor> {
    let (rows, cols) = codes.dims2()?;
    let table: Vec<f32> = (0..=255u8)
        .map(|c| float8::F8E4M3::from_bits(c).to_f32())
        .collect();
    let table = Tensor::from_vec(table, 256, codes.device())?;
    let values = table.index_select(&codes.flatten_all()?.to_dtype(DType::U32)?, 0)?;
    let blocks = cols / 64;
    values
        .reshape((rows, blocks, 64))?
        .broadcast_mul(&scale.reshape((rows, blocks, 1))?)?
        .reshape((rows, cols))?
        .to_dtype(DType::BF16)
}

/// Random FP8 codes (NaN codes avoided) and block-64 scales for a weight `[out, inp]`.
fn random_fp8(out: usize, inp: usize, dev: &Device) -> Result<(Tensor, Tensor)> {
    // Codes below 0x7f are the non-negative finite values; the sign bit is added for about half of them.
    let mag = (Tensor::rand(0f32, 126.0, (out, inp), dev)?.floor()?).to_dtype(DType::U8)?;
    let sign = Tensor::rand(0f32, 1.0, (out, inp), dev)?.ge(0.5)?;
    let codes = (mag.to_dtype(DType::F32)? + sign.to_dtype(DType::F32)?.affine(128.0, 0.0)?)?
        .to_dtype(DType::U8)?;
    let scale = Tensor::rand(1e-4f32, 1e-3, (out, inp / 64), dev)?;
    Ok((codes, scale))
}

/// bf16 forward + input gradient of `x [m, k] · w[n, k]ᵀ`, and the same with an FP8 block-64 weight
/// dequantised once per step (`fp8`) and twice (`fp8 x2`: forward and again for the backward, as a recomputed
/// block does), timed in round-robin so that the FP8 / bf16 ratio is not skewed by clock changes.
pub fn run(dev: &Device, cfg: &WanConfig, opts: &LinearBench) -> Result<Vec<Record>> {
    let (dim, ffn) = (cfg.dim, cfg.ffn_dim);
    let m = opts.tokens;
    let mut out = Vec::new();
    for (layer, n, k) in [
        ("qkvo", dim, dim),
        ("ffn_up", ffn, dim),
        ("ffn_down", dim, ffn),
    ] {
        let x = Tensor::randn(0f32, 1.0, (m, k), dev)?.to_dtype(DType::BF16)?;
        let dy = Tensor::randn(0f32, 1.0, (m, n), dev)?.to_dtype(DType::BF16)?;
        let w = Tensor::randn(0f32, 0.02, (n, k), dev)?.to_dtype(DType::BF16)?;
        let (codes, scale) = random_fp8(n, k, dev)?;
        let shape = format!("m={m} n={n} k={k}");
        let flops = 4.0 * (m * n * k) as f64;
        let step = |w: &Tensor| -> Result<()> {
            let y = x.matmul(&w.t()?)?;
            let dx = dy.matmul(w)?;
            drop((y, dx));
            Ok(())
        };
        let mut bf16 = || step(&w);
        let mut fp8 = || step(&dequantize(&codes, &scale)?);
        let mut fp8_twice = || {
            let y = x.matmul(&dequantize(&codes, &scale)?.t()?)?;
            let dx = dy.matmul(&dequantize(&codes, &scale)?)?;
            drop((y, dx));
            Ok(())
        };
        let mut dequant = || dequantize(&codes, &scale).map(drop);
        let cases: [(&str, f64, Case); 4] = [
            ("bf16", flops, &mut bf16),
            ("fp8", flops, &mut fp8),
            ("fp8 x2", flops, &mut fp8_twice),
            ("dequant", 0.0, &mut dequant),
        ];
        let (labels, mut fns): (Vec<_>, Vec<Case>) =
            cases.into_iter().map(|(l, f, c)| ((l, f), c)).unzip();
        let timings = time_interleaved(dev, opts.warmup, opts.iters, &mut fns)?;
        for ((label, flops), t) in labels.into_iter().zip(timings) {
            let pass = if label == "dequant" {
                "dequant"
            } else {
                "fwd+dgrad"
            };
            out.push(record(
                "linear",
                &format!("{layer} {label}"),
                pass,
                &shape,
                flops,
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
        let opts = LinearBench {
            tokens: 8,
            warmup: 0,
            iters: 1,
        };
        let records = run(&Device::Cpu, &WanConfig::tiny(1), &opts)?;
        assert_eq!(records.len(), 12);
        assert!(records.iter().all(|r| r.ms >= 0.0 && r.bench == "linear"));
        assert!(records.iter().any(|r| r.case == "ffn_up fp8 x2"));
        Ok(())
    }
}
