//! Attention outside autograd, for hand-written backward passes: a forward that also returns the per-row
//! log-sum-exp, and the matching backward. cuDNN's fused kernels where [`super::attention`] uses them (its
//! statistics tensor is the LSE; FP8 ones on a device with `model.fp8_attention` on), the portable tiled kernels
//! elsewhere. Either way the LSE is `[b, h, lq]` f32, so a tape's kernels need not match its forward's.

use candle_core::{DType, Result, Tensor};

use super::tiled::{self, PeakElems, Saved, Tiles};

/// The kernels that run an attention call: cuDNN's FP8 ones (self-attention on a device with
/// `model.fp8_attention` on, for the shapes they take), cuDNN's bf16 ones, or the portable tiled ones; the same choice [`super::attention`] makes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kernels {
    #[cfg(feature = "cudnn")]
    Fp8,
    #[cfg(feature = "cudnn")]
    Fused,
    Portable,
}

fn kernels(q: &Tensor, k: &Tensor, v: &Tensor, padded: bool) -> Kernels {
    #[cfg(feature = "cudnn")]
    if crate::cuda::attention::runs_fused(q) && k.dtype() == DType::BF16 && v.dtype() == DType::BF16
    {
        if super::runs_fp8(q, k, padded) {
            return Kernels::Fp8;
        }
        return Kernels::Fused;
    }
    let _ = (q, k, v, padded);
    Kernels::Portable
}

/// One attention call's inputs, output and LSE: everything [`AttentionTape::backward`] needs.
#[derive(Clone, Debug)]
pub struct AttentionTape {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    kv_lens: Option<Vec<usize>>,
}

/// [`super::attention`] without autograd: `q` [b, lq, h, d] over `k`, `v` [b, lk, h, d] (same contract), returning
/// the output (in `q`'s dtype) together with what the backward needs.
pub fn attention_forward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    kv_lens: Option<&[usize]>,
) -> Result<AttentionTape> {
    let (q, k, v) = (q.detach(), k.detach(), v.detach());
    let (out, lse) = match kernels(&q, &k, &v, kv_lens.is_some()) {
        #[cfg(feature = "cudnn")]
        Kernels::Fp8 => crate::cuda::attention_fp8::forward_stats(&q, &k, &v, kv_lens)?,
        #[cfg(feature = "cudnn")]
        Kernels::Fused => crate::cuda::attention::attention_forward_stats(&q, &k, &v, kv_lens)?,
        Kernels::Portable => portable_forward(&q, &k, &v, kv_lens)?,
    };
    Ok(AttentionTape {
        q,
        k,
        v,
        out,
        lse,
        kv_lens: kv_lens.map(<[usize]>::to_vec),
    })
}

/// An attention's output and log-sum-exp from a first forward pass, kept so that a recompute of the block skips
/// the attention kernel (selective checkpointing). Costs `b · lq · h · d` values in the compute dtype plus
/// `b · h · lq` f32.
#[derive(Clone, Debug)]
pub struct KeptAttention {
    out: Tensor,
    lse: Tensor,
}

impl KeptAttention {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        held_bytes([&self.out, &self.lse])
    }

    /// The tape of the attention on `qkv` — the same q, k, v the kept output was computed from.
    pub fn tape(&self, qkv: [&Tensor; 3], kv_lens: Option<&[usize]>) -> Result<AttentionTape> {
        AttentionTape::from_saved(qkv, &self.out, &self.lse, kv_lens)
    }
}

impl crate::offload::Stashable for KeptAttention {
    fn into_tensors(self) -> Vec<Tensor> {
        vec![self.out, self.lse]
    }

    fn from_tensors(tensors: Vec<Tensor>) -> Result<Self> {
        match <[Tensor; 2]>::try_from(tensors) {
            Ok([out, lse]) => Ok(Self { out, lse }),
            Err(other) => candle_core::bail!(
                "a kept attention is an output and a log-sum-exp, not {} tensors",
                other.len()
            ),
        }
    }
}

/// Bytes of the elements of `tensors`.
fn held_bytes<'a>(tensors: impl IntoIterator<Item = &'a Tensor>) -> usize {
    tensors
        .into_iter()
        .map(|t| t.elem_count() * t.dtype().size_in_bytes())
        .sum()
}

/// What a block's first forward keeps for its recompute: its attention's output and LSE ([`KeptAttention`]) and,
/// optionally, outputs of the products that feed its residuals, which the recompute then reuses instead of
/// running those products again (selective checkpointing). Which outputs, and in which order, is the model's.
#[derive(Clone, Debug)]
pub struct KeptBlock {
    attention: KeptAttention,
    outputs: Vec<Tensor>,
}

impl KeptBlock {
    /// The attention, and `outputs` (empty: the attention alone).
    pub fn new(attention: KeptAttention, outputs: Vec<Tensor>) -> Self {
        Self { attention, outputs }
    }

    /// The kept attention.
    pub fn attention(&self) -> &KeptAttention {
        &self.attention
    }

    /// The kept outputs, in the model's order (empty when only the attention is kept).
    pub fn outputs(&self) -> &[Tensor] {
        &self.outputs
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.attention.bytes() + held_bytes(&self.outputs)
    }
}

impl crate::offload::Stashable for KeptBlock {
    fn into_tensors(self) -> Vec<Tensor> {
        let mut out = crate::offload::Stashable::into_tensors(self.attention);
        out.extend(self.outputs);
        out
    }

    fn from_tensors(mut tensors: Vec<Tensor>) -> Result<Self> {
        if tensors.len() < 2 {
            candle_core::bail!(
                "a block's kept value is an attention's output and LSE and more, not {} tensors",
                tensors.len()
            );
        }
        let outputs = tensors.split_off(2);
        Ok(Self {
            attention: crate::offload::Stashable::from_tensors(tensors)?,
            outputs,
        })
    }
}

impl AttentionTape {
    /// A tape from an output and LSE computed earlier by [`attention_forward`] on the same `q`, `k`, `v` (the
    /// backward of a recomputed block that kept its attention from the first forward).
    pub fn from_saved(
        qkv: [&Tensor; 3],
        out: &Tensor,
        lse: &Tensor,
        kv_lens: Option<&[usize]>,
    ) -> Result<Self> {
        let [q, k, v] = qkv;
        if out.dims() != q.dims() || lse.elem_count() != q.dim(0)? * q.dim(1)? * q.dim(2)? {
            candle_core::bail!(
                "saved attention output {:?} / LSE {:?} do not fit q {:?}",
                out.dims(),
                lse.dims(),
                q.dims()
            );
        }
        Ok(Self {
            q: q.detach(),
            k: k.detach(),
            v: v.detach(),
            out: out.detach(),
            lse: lse.detach(),
            kv_lens: kv_lens.map(<[usize]>::to_vec),
        })
    }

    /// The output and LSE, to keep for a recompute ([`KeptAttention::tape`]).
    pub fn kept(&self) -> KeptAttention {
        KeptAttention {
            out: self.out.clone(),
            lse: self.lse.clone(),
        }
    }

    /// The attention output [b, lq, h, d].
    pub fn out(&self) -> &Tensor {
        &self.out
    }

    /// The per-row log-sum-exp of the scaled scores, [b, h, lq] f32.
    pub fn lse(&self) -> &Tensor {
        &self.lse
    }

    /// Gradients of `q`, `k`, `v` (in their dtypes and shapes) for the output gradient `d_out`.
    pub fn backward(&self, d_out: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        if d_out.dims() != self.out.dims() {
            candle_core::bail!(
                "attention backward: gradient {:?} for an output {:?}",
                d_out.dims(),
                self.out.dims()
            );
        }
        let lens = self.kv_lens.as_deref();
        match kernels(&self.q, &self.k, &self.v, lens.is_some()) {
            #[cfg(feature = "cudnn")]
            Kernels::Fp8 => crate::cuda::attention_fp8::backward_stats(
                [&self.q, &self.k, &self.v, &self.out, d_out],
                &self.lse,
                lens,
            ),
            #[cfg(feature = "cudnn")]
            Kernels::Fused => self.fused_backward(d_out),
            Kernels::Portable => self.portable_backward(d_out),
        }
    }

    fn portable_backward(&self, d_out: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let (q, k, v) = (&self.q, &self.k, &self.v);
        let pb = super::problem(q, k, v, self.kv_lens.as_deref())?;
        if q.elem_count() == 0 {
            return Ok((q.zeros_like()?, k.zeros_like()?, v.zeros_like()?));
        }
        let lse = self.lse.reshape((pb.b * pb.h, pb.lq, 1))?;
        let saved = Saved {
            out: &heads(&self.out)?,
            lse: &lse,
            grad_out: &heads(d_out)?,
        };
        let tiles = Tiles::for_device(q.device());
        let peak = PeakElems::default();
        let (dq, dk, dv) = tiled::backward(
            (&heads(q)?, &heads(k)?, &heads(v)?),
            &saved,
            &pb,
            tiles,
            &peak,
        )?;
        Ok((unheads(dq, q)?, unheads(dk, k)?, unheads(dv, v)?))
    }

    #[cfg(feature = "cudnn")]
    fn fused_backward(&self, d_out: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let d_out = d_out.to_dtype(DType::BF16)?.contiguous()?;
        crate::cuda::attention::attention_backward_stats(
            [&self.q, &self.k, &self.v, &self.out, &d_out],
            &self.lse,
            self.kv_lens.as_deref(),
        )
    }
}

fn portable_forward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    kv_lens: Option<&[usize]>,
) -> Result<(Tensor, Tensor)> {
    let pb = super::problem(q, k, v, kv_lens)?;
    if q.elem_count() == 0 {
        let lse = Tensor::zeros((pb.b, pb.h, pb.lq), DType::F32, q.device())?;
        return Ok((q.zeros_like()?, lse));
    }
    let tiles = Tiles::for_device(q.device());
    let peak = PeakElems::default();
    let (out, lse) = tiled::forward(&heads(q)?, &heads(k)?, &heads(v)?, &pb, tiles, &peak)?;
    Ok((unheads(out, q)?, lse.reshape((pb.b, pb.h, pb.lq))?))
}

/// `[b, l, h, d]` as a contiguous `[b*h, l, d]`.
fn heads(xs: &Tensor) -> Result<Tensor> {
    let (b, l, h, d) = xs.dims4()?;
    xs.transpose(1, 2)?.contiguous()?.reshape((b * h, l, d))
}

/// f32 `[b*h, l, d]` as `[b, l, h, d]` in `like`'s dtype.
fn unheads(xs: Tensor, like: &Tensor) -> Result<Tensor> {
    let (b, l, h, d) = like.dims4()?;
    xs.to_dtype(like.dtype())?
        .reshape((b, h, l, d))?
        .transpose(1, 2)?
        .contiguous()
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Var};

    use super::*;
    use crate::init::randn;
    use crate::testing::rel;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    /// Output and gradients equal the differentiable op's under candle's autograd, with padded keys; a tape
    /// rebuilt from the saved output and LSE gives the same gradients.
    #[test]
    fn forward_and_backward_match_the_autograd_op() -> Result<()> {
        let dev = Device::Cpu;
        let rng = &mut StdRng::seed_from_u64(17);
        let q = Var::from_tensor(&randn(rng, (2, 5, 2, 8), 0.0, 1.0, &dev)?)?;
        let k = Var::from_tensor(&randn(rng, (2, 7, 2, 8), 0.0, 1.0, &dev)?)?;
        let v = Var::from_tensor(&randn(rng, (2, 7, 2, 8), 0.0, 1.0, &dev)?)?;
        let d_out = randn(rng, (2, 5, 2, 8), 0.0, 1.0, &dev)?;
        let lens = [7, 3];
        let out = super::super::attention(&q, &k, &v, Some(&lens))?;
        let store = (&out * &d_out)?.sum_all()?.backward()?;
        let tape = attention_forward(&q, &k, &v, Some(&lens))?;
        assert!(rel(tape.out(), &out)? < 1e-6);
        assert_eq!(tape.lse().dims(), &[2, 2, 5]);
        let again = AttentionTape::from_saved([&q, &k, &v], tape.out(), tape.lse(), Some(&lens))?;
        for t in [&tape, &again] {
            let (dq, dk, dv) = t.backward(&d_out)?;
            for (got, var) in [(dq, &q), (dk, &k), (dv, &v)] {
                let want = store
                    .get(var.as_tensor())
                    .ok_or_else(|| candle_core::Error::msg("no reference gradient"))?;
                assert!(rel(&got, want)? < 1e-5);
            }
        }
        Ok(())
    }
}
