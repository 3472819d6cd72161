//! FP8 attention (`model.fp8_attention`) against cuDNN's bf16 kernel at a Wan variant's shapes: self attention
//! over the video tokens and cross attention over the text tokens (all keys, and padded), forward and backward
//! outside autograd as a training step runs them. Prints how far O, dQ, dK and dV land from the bf16 kernel's
//! (largest and mean absolute difference, each over the bf16 tensor's largest and mean magnitude), then times both.

use candle_core::{DType, Device, Result, Tensor};

use super::{record, time, Record};
use crate::attention::AttentionBench;
use framesmith_models::wan::config::WanConfig;
use framesmith_nn::cuda::{attention as bf16, attention_fp8 as fp8};

/// How far one FP8 tensor is from the bf16 kernel's.
#[derive(Clone, Debug)]
pub struct Deviation {
    /// `self`, `cross` or `cross padded`.
    pub case: String,
    /// `O`, `dQ`, `dK` or `dV`.
    pub tensor: &'static str,
    /// max |fp8 − bf16| / max |bf16|.
    pub max_rel: f64,
    /// mean |fp8 − bf16| / mean |bf16|.
    pub mean_rel: f64,
}

/// `(max |a − b| / max |b|, mean |a − b| / mean |b|)`, in f32.
fn deviation(a: &Tensor, b: &Tensor) -> Result<(f64, f64)> {
    let (a, b) = (a.to_dtype(DType::F32)?, b.to_dtype(DType::F32)?);
    let diff = (&a - &b)?.abs()?.flatten_all()?;
    let size = b.abs()?.flatten_all()?;
    let ratio = |num: f32, den: f32| f64::from(num) / f64::from(den).max(f64::MIN_POSITIVE);
    Ok((
        ratio(diff.max(0)?.to_scalar()?, size.max(0)?.to_scalar()?),
        ratio(diff.mean_all()?.to_scalar()?, size.mean_all()?.to_scalar()?),
    ))
}

fn random(shape: (usize, usize, usize, usize), gain: f64, dev: &Device) -> Result<Tensor> {
    (Tensor::randn(0f32, 1.0, shape, dev)? * gain)?.to_dtype(DType::BF16)
}

/// One case's inputs.
struct Case {
    name: &'static str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    d_o: Tensor,
    lens: Option<Vec<usize>>,
}

/// The deviations of FP8 attention from the bf16 kernel and the timings of both, for `cfg`'s heads and head dim.
/// `qk_gain` scales q and k (1: scores of unit variance; larger: sharper attention, as trained models have). FP8
/// attention must be on for `dev` ([`framesmith_nn::device::set_fp8_attention`]).
pub fn run(
    dev: &Device,
    cfg: &WanConfig,
    opts: &AttentionBench,
    qk_gain: f64,
) -> Result<(Vec<Deviation>, Vec<Record>)> {
    let (h, d, b, l) = (cfg.num_heads, cfg.head_dim(), opts.batch, opts.tokens);
    let mut cases = vec![("self", l, None), ("cross", opts.text_tokens, None)];
    if let Some(len) = opts.text_len {
        cases.push((
            "cross padded",
            opts.text_tokens,
            Some(vec![len.min(opts.text_tokens); b]),
        ));
    }
    let mut deviations = Vec::new();
    let mut records = Vec::new();
    for (name, lk, lens) in cases {
        let case = Case {
            name,
            q: random((b, l, h, d), qk_gain, dev)?,
            k: random((b, lk, h, d), qk_gain, dev)?,
            v: random((b, lk, h, d), 1.0, dev)?,
            d_o: random((b, l, h, d), 1.0, dev)?,
            lens,
        };
        deviations.extend(compare(&case)?);
        records.extend(timings(dev, &case, opts, (b, h, l, lk, d))?);
    }
    Ok((deviations, records))
}

/// O, dQ, dK and dV of both kernels on one case (FP8 run twice first: its gradient scales calibrated and used).
fn compare(c: &Case) -> Result<Vec<Deviation>> {
    let lens = c.lens.as_deref();
    let (q, k, v, d_o) = (&c.q, &c.k, &c.v, &c.d_o);
    if !fp8::ready(q, k, lens.is_some()) {
        candle_core::bail!(
            "FP8 attention does not run the {} case (q {:?}, k {:?}) on this GPU",
            c.name,
            q.dims(),
            k.dims()
        );
    }
    let (o_ref, lse_ref) = bf16::attention_forward_stats(q, k, v, lens)?;
    let (dq_ref, dk_ref, dv_ref) =
        bf16::attention_backward_stats([q, k, v, &o_ref, d_o], &lse_ref, lens)?;
    let mut got = None;
    for _ in 0..2 {
        let (o, lse) = fp8::forward_stats(q, k, v, lens)?;
        let (dq, dk, dv) = fp8::backward_stats([q, k, v, &o, d_o], &lse, lens)?;
        got = Some((o, dq, dk, dv));
    }
    let Some((o, dq, dk, dv)) = got else {
        candle_core::bail!("no FP8 result");
    };
    let mut out = Vec::new();
    for (tensor, a, r) in [
        ("O", &o, &o_ref),
        ("dQ", &dq, &dq_ref),
        ("dK", &dk, &dk_ref),
        ("dV", &dv, &dv_ref),
    ] {
        let (max_rel, mean_rel) = deviation(a, r)?;
        out.push(Deviation {
            case: c.name.into(),
            tensor,
            max_rel,
            mean_rel,
        });
    }
    Ok(out)
}

/// Forward and forward+backward of both kernels on one case.
fn timings(
    dev: &Device,
    c: &Case,
    opts: &AttentionBench,
    (b, h, l, lk, d): (usize, usize, usize, usize, usize),
) -> Result<Vec<Record>> {
    let lens = c.lens.as_deref();
    let (q, k, v, d_o) = (&c.q, &c.k, &c.v, &c.d_o);
    let shape = format!("b={b} h={h} lq={l} lk={lk} d={d}");
    let fwd_flops = 4.0 * (b * h * l * lk * d) as f64;
    let (w, n) = (opts.warmup, opts.iters);
    let mut out = Vec::new();
    let t = time(dev, w, n, || {
        bf16::attention_forward_stats(q, k, v, lens).map(drop)
    })?;
    out.push(record(
        "attention",
        c.name,
        "fwd bf16",
        &shape,
        fwd_flops,
        t,
    ));
    let t = time(dev, w, n, || fp8::forward_stats(q, k, v, lens).map(drop))?;
    out.push(record("attention", c.name, "fwd fp8", &shape, fwd_flops, t));
    let t = time(dev, w, n, || {
        let (o, lse) = bf16::attention_forward_stats(q, k, v, lens)?;
        bf16::attention_backward_stats([q, k, v, &o, d_o], &lse, lens).map(drop)
    })?;
    out.push(record(
        "attention",
        c.name,
        "fwd+bwd bf16",
        &shape,
        3.5 * fwd_flops,
        t,
    ));
    let t = time(dev, w, n, || {
        let (o, lse) = fp8::forward_stats(q, k, v, lens)?;
        fp8::backward_stats([q, k, v, &o, d_o], &lse, lens).map(drop)
    })?;
    out.push(record(
        "attention",
        c.name,
        "fwd+bwd fp8",
        &shape,
        3.5 * fwd_flops,
        t,
    ));
    Ok(out)
}

/// The deviations as a table.
pub fn deviation_table(rows: &[Deviation]) -> String {
    let mut out = format!(
        "{:<14} {:<4} {:>12} {:>12}\n",
        "case", "", "max rel", "mean rel"
    );
    for r in rows {
        out.push_str(&format!(
            "{:<14} {:<4} {:>12.3e} {:>12.3e}\n",
            r.case, r.tensor, r.max_rel, r.mean_rel
        ));
    }
    out
}
