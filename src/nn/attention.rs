//! Scaled dot-product attention for the Wan DiT, `[b, l, heads, head_dim]` layout, with per-sample key lengths
//! (keys at or beyond a sample's length are masked; every query row is computed, as flash-attention varlen does).

use candle_core::{DType, Result, Tensor, D};

/// Attention of `q` [b, lq, h, d] over `k`, `v` [b, lk, h, d], scale 1/sqrt(d). `kv_lens[i]` keys of sample i are
/// attended (`None`: all). Differentiable; computed in f32 and returned in `q`'s dtype.
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, kv_lens: Option<&[usize]>) -> Result<Tensor> {
    naive_attention(q, k, v, kv_lens)
}

/// Reference attention that materialises the score matrix. For tests and tiny shapes only.
pub fn naive_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    kv_lens: Option<&[usize]>,
) -> Result<Tensor> {
    let dtype = q.dtype();
    let (b, lq, h, d) = q.dims4()?;
    let lk = k.dim(1)?;
    let q = q.to_dtype(DType::F32)?.transpose(1, 2)?.contiguous()?;
    let k = k.to_dtype(DType::F32)?.transpose(1, 2)?.contiguous()?;
    let v = v.to_dtype(DType::F32)?.transpose(1, 2)?.contiguous()?;
    let scores = (q.matmul(&k.t()?)? / (d as f64).sqrt())?;
    let scores = match kv_lens {
        Some(lens) => {
            let mut mask = vec![0f32; b * lk];
            for (i, &len) in lens.iter().enumerate().take(b) {
                for j in len.min(lk)..lk {
                    mask[i * lk + j] = f32::NEG_INFINITY;
                }
            }
            let mask = Tensor::from_vec(mask, (b, 1, 1, lk), q.device())?;
            scores.broadcast_add(&mask)?
        }
        None => scores,
    };
    let max = scores.max_keepdim(D::Minus1)?.detach();
    let e = scores.broadcast_sub(&max)?.exp()?;
    let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
    let out = p.matmul(&v)?;
    debug_assert_eq!(out.dims(), &[b, h, lq, d]);
    out.transpose(1, 2)?.contiguous()?.to_dtype(dtype)
}
