//! Tiled (flash-attention style) forward and backward on `[b*h, l, d]` tensors, written with candle ops so it runs
//! on every device. Memory is O(tokens × tile): the `[lq, lk]` score matrix is never built.

use std::sync::atomic::{AtomicUsize, Ordering};

use candle_core::{DType, Device, Result, Tensor, D};

/// Additive bias for masked keys. Finite (not -inf) so a fully masked tile never computes `-inf - -inf`; every
/// sample with at least one key sees key 0 in the first tile, so its running max is a real score from then on and
/// `exp(MASKED - max)` is exactly 0.
const MASKED: f32 = -1e30;

/// Query and key tile lengths, both at least 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tiles {
    q: usize,
    k: usize,
}

impl Tiles {
    /// Tiles of `q` queries by `k` keys (0 is taken as 1).
    pub const fn new(q: usize, k: usize) -> Tiles {
        let q = if q == 0 { 1 } else { q };
        let k = if k == 0 { 1 } else { k };
        Tiles { q, k }
    }

    /// CPU: a 128×256 f32 score tile is 128 KiB per head, so it stays in L2 across the ~10 ops that touch it, and
    /// a few hundred tokens need only a handful of tiles (per-op overhead is what costs on tiny models).
    pub const CPU: Tiles = Tiles::new(128, 256);
    /// GPU: every tile op is a kernel launch, so tiles are large: 32 × 32 tiles for 32k tokens, and a score tile of
    /// 4 MiB per head (160 MiB at 40 heads), far below the 171 GB the full matrix would take.
    pub const GPU: Tiles = Tiles::new(1024, 1024);

    /// Tiles suited to `device`.
    pub fn for_device(device: &Device) -> Tiles {
        if device.is_cpu() {
            Tiles::CPU
        } else {
            Tiles::GPU
        }
    }
}

/// Largest tensor (in elements) made inside the tile loops. Every tensor there is a tile of the inputs
/// (`[bh, tile, d]`), a matmul output, or an elementwise/reduction result of those with the same or a smaller
/// shape, so recording tile loads and matmul outputs bounds them all. Tests use it to show memory stays
/// O(tokens × tile).
#[derive(Debug, Default)]
pub(crate) struct PeakElems(AtomicUsize);

impl PeakElems {
    fn note(&self, t: Tensor) -> Tensor {
        self.0.fetch_max(t.elem_count(), Ordering::Relaxed);
        t
    }

    /// The largest element count recorded so far.
    #[cfg(test)]
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// Shapes and key lengths of one attention call; tensors are `[bh, l, d]` with `bh = b * h`, sample-major.
#[derive(Debug, Clone)]
pub(crate) struct Problem {
    pub b: usize,
    pub h: usize,
    pub lq: usize,
    pub lk: usize,
    pub d: usize,
    /// Keys attended per sample, already clamped to `lk`.
    pub lens: Vec<usize>,
}

impl Problem {
    fn scale(&self) -> f64 {
        1.0 / (self.d as f64).sqrt()
    }

    /// Keys past the longest sample are masked everywhere, so the loops stop there.
    fn max_len(&self) -> usize {
        self.lens.iter().copied().max().unwrap_or(0)
    }

    /// `[bh, 1, len]` bias masking keys `start..start + len` of samples shorter than that; `None` if none are.
    fn key_bias(&self, start: usize, len: usize, device: &Device) -> Result<Option<Tensor>> {
        if self.lens.iter().all(|&l| l >= start + len) {
            return Ok(None);
        }
        let mut bias = Vec::with_capacity(self.b * self.h * len);
        for &l in &self.lens {
            let row: Vec<f32> = (start..start + len)
                .map(|j| if j < l { 0.0 } else { MASKED })
                .collect();
            for _ in 0..self.h {
                bias.extend_from_slice(&row);
            }
        }
        Tensor::from_vec(bias, (self.b * self.h, 1, len), device).map(Some)
    }

    /// Biases of every key tile below `max_len`, made once per call (O(bh × lk) in all).
    fn key_tiles(&self, tk: usize, device: &Device) -> Result<Vec<(usize, usize, Option<Tensor>)>> {
        let max_len = self.max_len();
        (0..max_len)
            .step_by(tk)
            .map(|start| {
                let len = tk.min(max_len - start);
                Ok((start, len, self.key_bias(start, len, device)?))
            })
            .collect()
    }

    /// `[bh, 1, 1]` tensor, +inf on rows of samples with no keys and 0 elsewhere; `None` if every sample has keys.
    fn empty_rows(&self, device: &Device) -> Result<Option<Tensor>> {
        if self.lens.iter().all(|&l| l > 0) {
            return Ok(None);
        }
        let rows: Vec<f32> = self
            .lens
            .iter()
            .flat_map(|&l| std::iter::repeat_n(if l == 0 { f32::INFINITY } else { 0.0 }, self.h))
            .collect();
        Tensor::from_vec(rows, (self.b * self.h, 1, 1), device).map(Some)
    }
}

/// Rows `start..start + len` of `xs` [bh, l, d] in f32.
fn tile(xs: &Tensor, start: usize, len: usize, peak: &PeakElems) -> Result<Tensor> {
    Ok(peak.note(xs.narrow(1, start, len)?.to_dtype(DType::F32)?))
}

fn mm(a: &Tensor, b: &Tensor, peak: &PeakElems) -> Result<Tensor> {
    Ok(peak.note(a.matmul(b)?))
}

/// Running state of the online softmax for one query tile.
struct Online {
    /// Row max of the scaled, masked scores seen so far, [bh, tq, 1].
    max: Tensor,
    /// Row sum of `exp(score - max)`, [bh, tq, 1].
    sum: Tensor,
    /// Unnormalised output `Σ exp(score - max) v`, [bh, tq, d].
    acc: Tensor,
}

impl Online {
    fn update(
        state: Option<Online>,
        scores: &Tensor,
        v: &Tensor,
        peak: &PeakElems,
    ) -> Result<Online> {
        let row_max = scores.max_keepdim(D::Minus1)?;
        let Some(prev) = state else {
            let p = scores.broadcast_sub(&row_max)?.exp()?;
            return Ok(Online {
                sum: p.sum_keepdim(D::Minus1)?,
                acc: mm(&p, v, peak)?,
                max: row_max,
            });
        };
        let max = prev.max.maximum(&row_max)?;
        let alpha = (&prev.max - &max)?.exp()?;
        let p = scores.broadcast_sub(&max)?.exp()?;
        let sum = ((&prev.sum * &alpha)? + p.sum_keepdim(D::Minus1)?)?;
        let acc = (prev.acc.broadcast_mul(&alpha)? + mm(&p, v, peak)?)?;
        Ok(Online { max, sum, acc })
    }
}

/// Forward pass. `q` [bh, lq, d], `k`, `v` [bh, lk, d] in any float dtype. Returns the output [bh, lq, d] and the
/// per-row log-sum-exp of the scaled, masked scores [bh, lq, 1], both f32. Rows of samples without keys get a
/// zero output and LSE +inf (so the backward's `exp(score - LSE)` is 0 there).
pub(crate) fn forward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    pb: &Problem,
    tiles: Tiles,
    peak: &PeakElems,
) -> Result<(Tensor, Tensor)> {
    let device = q.device();
    let bh = pb.b * pb.h;
    let key_tiles = pb.key_tiles(tiles.k, device)?;
    let empty = pb.empty_rows(device)?;
    let mut outs = Vec::new();
    let mut lses = Vec::new();
    for qs in (0..pb.lq).step_by(tiles.q) {
        let ql = tiles.q.min(pb.lq - qs);
        let qi = (tile(q, qs, ql, peak)? * pb.scale())?;
        let mut state = None;
        for (ks, kl, bias) in &key_tiles {
            let kj = tile(k, *ks, *kl, peak)?;
            let vj = tile(v, *ks, *kl, peak)?;
            let mut scores = mm(&qi, &kj.t()?, peak)?;
            if let Some(bias) = bias {
                scores = scores.broadcast_add(bias)?;
            }
            state = Some(Online::update(state, &scores, &vj, peak)?);
        }
        let (out, lse) = match state {
            Some(s) => (s.acc.broadcast_div(&s.sum)?, (s.max + s.sum.log()?)?),
            None => (
                Tensor::zeros((bh, ql, pb.d), DType::F32, device)?,
                Tensor::full(f32::INFINITY, (bh, ql, 1), device)?,
            ),
        };
        let (out, lse) = match &empty {
            // (+inf == 0) is 1 for rows that keep their output, 0 for rows of samples without keys.
            Some(inf) => (
                out.broadcast_mul(&inf.eq(0f32)?.to_dtype(DType::F32)?)?,
                lse.broadcast_add(inf)?,
            ),
            None => (out, lse),
        };
        outs.push(out);
        lses.push(lse);
    }
    Ok((Tensor::cat(&outs, 1)?, Tensor::cat(&lses, 1)?))
}

/// Per query tile: where it starts, its length and `D = rowsum(dO ∘ O)` [bh, tq, 1].
struct QueryTile {
    start: usize,
    len: usize,
    delta: Tensor,
    lse: Tensor,
}

/// Inputs of the backward pass beyond `q`, `k`, `v`: the forward output and LSE, and the output's gradient.
pub(crate) struct Saved<'a> {
    pub out: &'a Tensor,
    pub lse: &'a Tensor,
    pub grad_out: &'a Tensor,
}

/// Backward pass: gradients (f32, [bh, l, d]) of `q`, `k`, `v` given the forward's output, LSE and the output's
/// gradient. Recomputes each score tile: `P = exp(S·scale − LSE)`, `dV += Pᵀ dO`, `dP = dO Vᵀ`,
/// `dS = P ∘ (dP − D)`, `dQ += dS K·scale`, `dK += dSᵀ Q·scale`.
pub(crate) fn backward(
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    saved: &Saved,
    pb: &Problem,
    tiles: Tiles,
    peak: &PeakElems,
) -> Result<(Tensor, Tensor, Tensor)> {
    let device = q.device();
    let bh = pb.b * pb.h;
    let scale = pb.scale();
    let query_tiles = (0..pb.lq)
        .step_by(tiles.q)
        .map(|start| {
            let len = tiles.q.min(pb.lq - start);
            let d_o = tile(saved.grad_out, start, len, peak)?;
            let o = tile(saved.out, start, len, peak)?;
            Ok(QueryTile {
                start,
                len,
                delta: (d_o * o)?.sum_keepdim(D::Minus1)?,
                lse: saved.lse.narrow(1, start, len)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let mut dqs: Vec<Option<Tensor>> = vec![None; query_tiles.len()];
    let mut dks = Vec::new();
    let mut dvs = Vec::new();
    let key_tiles = pb.key_tiles(tiles.k, device)?;
    for (ks, kl, bias) in &key_tiles {
        // Scaling the key tile once here, rather than each query tile in the inner loop, gives
        // S·scale = Q (K·scale)ᵀ and dQ = dS (K·scale) directly; only dK needs the scale, once per key tile.
        let kj = (tile(k, *ks, *kl, peak)? * scale)?;
        let vj = tile(v, *ks, *kl, peak)?;
        let mut dk: Option<Tensor> = None;
        let mut dv: Option<Tensor> = None;
        for (qt, dq) in query_tiles.iter().zip(dqs.iter_mut()) {
            let qi = tile(q, qt.start, qt.len, peak)?;
            let d_o = tile(saved.grad_out, qt.start, qt.len, peak)?;
            let mut scores = mm(&qi, &kj.t()?, peak)?;
            if let Some(bias) = bias {
                scores = scores.broadcast_add(bias)?;
            }
            let p = scores.broadcast_sub(&qt.lse)?.exp()?;
            dv = Some(accumulate(dv, mm(&p.t()?, &d_o, peak)?)?);
            let dp = mm(&d_o, &vj.t()?, peak)?;
            let ds = (p * dp.broadcast_sub(&qt.delta)?)?;
            *dq = Some(accumulate(dq.take(), mm(&ds, &kj, peak)?)?);
            dk = Some(accumulate(dk, mm(&ds.t()?, &qi, peak)?)?);
        }
        let zeros = || Tensor::zeros((bh, *kl, pb.d), DType::F32, device);
        dks.push(dk.map_or_else(zeros, |dk| dk * scale)?);
        dvs.push(dv.map_or_else(zeros, Ok)?);
    }
    let dq = dqs
        .into_iter()
        .zip(&query_tiles)
        .map(|(dq, qt)| match dq {
            Some(dq) => Ok(dq),
            None => Tensor::zeros((bh, qt.len, pb.d), DType::F32, device),
        })
        .collect::<Result<Vec<_>>>()?;
    let dq = Tensor::cat(&dq, 1)?;
    Ok((dq, pad_keys(dks, pb, device)?, pad_keys(dvs, pb, device)?))
}

fn accumulate(acc: Option<Tensor>, x: Tensor) -> Result<Tensor> {
    match acc {
        Some(acc) => acc + x,
        None => Ok(x),
    }
}

/// Joins key-tile gradients and appends zeros for keys no sample attends (`max_len..lk`).
fn pad_keys(mut parts: Vec<Tensor>, pb: &Problem, device: &Device) -> Result<Tensor> {
    let max_len = pb.max_len();
    if parts.is_empty() {
        return Tensor::zeros((pb.b * pb.h, pb.lk, pb.d), DType::F32, device);
    }
    if max_len < pb.lk {
        parts.push(Tensor::zeros(
            (pb.b * pb.h, pb.lk - max_len, pb.d),
            DType::F32,
            device,
        )?);
    }
    Tensor::cat(&parts, 1)
}
