//! The candle custom op around the tiled attention: moves storages in and out of `[b*h, l, d]` tensors and keeps
//! the forward's log-sum-exp for the backward.

use std::sync::{Arc, Mutex};

use candle_core::backend::{BackendDevice, BackendStorage};
use candle_core::op::BackpropOp;
use candle_core::{bail, CpuStorage, CustomOp3, Layout, Result, Shape, Storage, Tensor};

use super::tiled::{self, PeakElems, Problem, Saved, Tiles};

/// Scaled dot-product attention as one op with its own backward (see [`super::attention`]).
pub(crate) struct TiledAttention {
    pb: Problem,
    /// `None`: chosen from the device the op runs on.
    tiles: Option<Tiles>,
    peak: Arc<PeakElems>,
    /// Per-row log-sum-exp [bh, lq, 1] f32 from the forward. Kept rather than recomputed: it is `b·h·lq` floats
    /// (1/d of the output), while recomputing it takes another `Q Kᵀ` pass with its exps over every tile, about a
    /// fifth more work on top of the backward's five matmuls per tile.
    lse: Mutex<Option<Tensor>>,
}

impl TiledAttention {
    /// The op for one call; `tiles` overrides the per-device choice, `peak` records the largest tile tensor.
    pub fn new(pb: Problem, tiles: Option<Tiles>, peak: Arc<PeakElems>) -> Self {
        Self {
            pb,
            tiles,
            peak,
            lse: Mutex::new(None),
        }
    }

    fn tiles(&self, t: &Tensor) -> Tiles {
        self.tiles.unwrap_or_else(|| Tiles::for_device(t.device()))
    }

    /// Runs the tiled forward on one backend's storages; returns the output storage, [b, lq, h, d] in q's dtype.
    fn fwd<S: HeadStorage>(&self, qkv: [(&S, &Layout); 3]) -> Result<(S, Shape)> {
        let pb = &self.pb;
        let [(qs, ql), (ks, kl), (vs, vl)] = qkv;
        let q_shape = Shape::from((pb.b, pb.lq, pb.h, pb.d));
        let kv_shape = Shape::from((pb.b, pb.lk, pb.h, pb.d));
        if ql.shape() != &q_shape || kl.shape() != &kv_shape || vl.shape() != &kv_shape {
            let (q, k, v) = (ql.shape(), kl.shape(), vl.shape());
            bail!("attention op: got q {q:?}, k {k:?}, v {v:?}, built for q {q_shape:?}, k/v {kv_shape:?}");
        }
        let q = to_heads(qs, ql)?;
        let k = to_heads(ks, kl)?;
        let v = to_heads(vs, vl)?;
        let (out, lse) = tiled::forward(&q, &k, &v, pb, self.tiles(&q), &self.peak)?;
        *self.lse.lock().unwrap_or_else(|e| e.into_inner()) = Some(lse);
        let out = out
            .to_dtype(qs.dtype())?
            .reshape((pb.b, pb.h, pb.lq, pb.d))?;
        let (storage, layout) = out.storage_and_layout();
        let Some(storage) = S::of(&storage) else {
            bail!("attention op: output landed on another backend")
        };
        Ok((copy_strided(storage, &layout.transpose(1, 2)?)?, q_shape))
    }

    /// `[b, l, h, d]` tensor as detached `[b*h, l, d]`.
    fn heads(&self, xs: &Tensor) -> Result<Tensor> {
        let (b, l, h, d) = xs.dims4()?;
        xs.detach()
            .transpose(1, 2)?
            .contiguous()?
            .reshape((b * h, l, d))
    }

    /// f32 `[b*h, l, d]` gradient as `[b, l, h, d]` in `like`'s dtype.
    fn unheads(&self, grad: Tensor, like: &Tensor) -> Result<Tensor> {
        let (b, l, h, d) = like.dims4()?;
        grad.to_dtype(like.dtype())?
            .reshape((b, h, l, d))?
            .transpose(1, 2)?
            .contiguous()
    }
}

impl CustomOp3 for TiledAttention {
    fn name(&self) -> &'static str {
        "tiled-attention"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.fwd([(s1, l1), (s2, l2), (s3, l3)])
    }

    // The same tensor-op code on the GPU; a fused kernel is meant to take this place.
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        self.fwd([(s1, l1), (s2, l2), (s3, l3)])
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (qh, kh, vh) = (self.heads(q)?, self.heads(k)?, self.heads(v)?);
        let tiles = self.tiles(q);
        let stored = self.lse.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let lse = match stored {
            Some(lse) => lse,
            // Only reachable if the forward ran elsewhere; recomputing is correct, just slower.
            None => tiled::forward(&qh, &kh, &vh, &self.pb, tiles, &self.peak)?.1,
        };
        let saved = Saved {
            out: &self.heads(res)?,
            lse: &lse,
            grad_out: &self.heads(grad_res)?,
        };
        let (dq, dk, dv) = tiled::backward((&qh, &kh, &vh), &saved, &self.pb, tiles, &self.peak)?;
        Ok((
            Some(self.unheads(dq, q)?),
            Some(self.unheads(dk, k)?),
            Some(self.unheads(dv, v)?),
        ))
    }
}

/// A backend's storage that can be wrapped into, and found inside, a [`Storage`].
trait HeadStorage: BackendStorage<Device: BackendDevice<Storage = Self>> + Sized {
    fn wrap(self) -> Storage;
    fn of(storage: &Storage) -> Option<&Self>;
}

impl HeadStorage for CpuStorage {
    fn wrap(self) -> Storage {
        Storage::Cpu(self)
    }
    fn of(storage: &Storage) -> Option<&Self> {
        match storage {
            Storage::Cpu(s) => Some(s),
            _ => None,
        }
    }
}

#[cfg(feature = "cuda")]
impl HeadStorage for candle_core::CudaStorage {
    fn wrap(self) -> Storage {
        Storage::Cuda(self)
    }
    fn of(storage: &Storage) -> Option<&Self> {
        match storage {
            Storage::Cuda(s) => Some(s),
            _ => None,
        }
    }
}

/// Copies the elements `layout` describes into a fresh contiguous storage, in the layout's logical order.
fn copy_strided<S>(storage: &S, layout: &Layout) -> Result<S>
where
    S: BackendStorage,
    S::Device: BackendDevice<Storage = S>,
{
    let mut dst = storage
        .device()
        .zeros_impl(layout.shape(), storage.dtype())?;
    storage.copy_strided_src(&mut dst, 0, layout)?;
    Ok(dst)
}

/// `[b, l, h, d]` storage (any strides) as a contiguous `[b*h, l, d]` tensor: one copy, transposing on the way.
fn to_heads<S: HeadStorage>(storage: &S, layout: &Layout) -> Result<Tensor> {
    let (b, l, h, d) = layout.shape().dims4()?;
    let heads = copy_strided(storage, &layout.transpose(1, 2)?)?;
    Ok(Tensor::from_storage(
        heads.wrap(),
        (b * h, l, d),
        BackpropOp::none(),
        false,
    ))
}
