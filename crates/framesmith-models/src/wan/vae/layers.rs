//! Building blocks shared by the Wan 2.1 and 2.2 VAEs: the causal 3D convolution (as 2D convolutions over the
//! temporal taps, since candle has no conv3d) with the official feature-cache semantics, channel RMS norm,
//! residual and attention blocks, and the spatial/temporal resampling layers.

use candle_core::{DType, Result, Tensor, D};

use framesmith_nn::vb::Vb;

/// Frames of the previous chunk kept per causal convolution (`CACHE_T` officially).
const CACHE_T: usize = 2;

/// One entry of the official `feat_cache` list.
pub(crate) enum Slot {
    /// Not visited yet (`None`).
    Empty,
    /// Temporal upsampling seen the first chunk and did nothing (`'Rep'`).
    Rep,
    /// The trailing input frames of the previous chunk.
    Frames(Tensor),
}

/// The feature cache of one chunked encode or decode: one slot per cached layer, visited in a fixed order each
/// chunk (the official `feat_cache` with `feat_idx`).
pub(crate) struct FeatCache {
    slots: Vec<Slot>,
    idx: usize,
}

impl FeatCache {
    pub(crate) fn new() -> Self {
        Self {
            slots: Vec::new(),
            idx: 0,
        }
    }

    /// Rewinds to the first layer before the next chunk.
    pub(crate) fn start_chunk(&mut self) {
        self.idx = 0;
    }

    /// Takes the current slot's content, leaving it empty.
    fn take(&mut self) -> Slot {
        if self.idx >= self.slots.len() {
            self.slots.resize_with(self.idx + 1, || Slot::Empty);
        }
        std::mem::replace(&mut self.slots[self.idx], Slot::Empty)
    }

    /// Stores the current slot and moves to the next layer.
    fn put(&mut self, slot: Slot) {
        if self.idx >= self.slots.len() {
            self.slots.resize_with(self.idx + 1, || Slot::Empty);
        }
        self.slots[self.idx] = slot;
        self.idx += 1;
    }
}

/// The last `n` frames (dim 2) of `xs`, copied so the cache does not keep the whole activation alive.
fn last_frames(xs: &Tensor, n: usize) -> Result<Tensor> {
    let t = xs.dim(2)?;
    let n = n.min(t);
    xs.narrow(2, t - n, n)?.contiguous()
}

/// A 2D convolution `weight` [out, in, kh, kw] with bias, symmetric padding and stride.
pub(crate) struct Conv2d {
    weight: Tensor,
    bias: Tensor,
    padding: usize,
    stride: usize,
}

impl Conv2d {
    pub(crate) fn new(
        vb: &Vb,
        c_in: usize,
        c_out: usize,
        k: usize,
        padding: usize,
        stride: usize,
    ) -> Result<Self> {
        Ok(Self {
            weight: vb.get((c_out, c_in, k, k), "weight")?,
            bias: vb.get(c_out, "bias")?,
            padding,
            stride,
        })
    }

    /// `xs` [n, in, h, w] → [n, out, h', w'].
    pub(crate) fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let ys = xs.conv2d(&self.weight, self.padding, self.stride, 1, 1)?;
        ys.broadcast_add(&self.bias.reshape((1, (), 1, 1))?)
    }
}

/// Causal 3D convolution: zero padding of `2·p_t` frames in front (none behind), symmetric spatial padding.
pub(crate) struct CausalConv3d {
    /// The kernel per temporal tap, [out, in, kh, kw] each.
    taps: Vec<Tensor>,
    bias: Tensor,
    stride_t: usize,
    pad_front: usize,
    pad_h: usize,
    pad_w: usize,
}

impl CausalConv3d {
    /// `weight` [out, in, kt, kh, kw] and `bias` [out] under `vb`; `padding` is the official (p_t, p_h, p_w).
    pub(crate) fn new(
        vb: &Vb,
        (c_in, c_out): (usize, usize),
        (kt, kh, kw): (usize, usize, usize),
        stride_t: usize,
        (pt, ph, pw): (usize, usize, usize),
    ) -> Result<Self> {
        let weight = vb.get((c_out, c_in, kt, kh, kw), "weight")?;
        let taps = (0..kt)
            .map(|k| weight.narrow(2, k, 1)?.squeeze(2)?.contiguous())
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            taps,
            bias: vb.get(c_out, "bias")?,
            stride_t,
            pad_front: 2 * pt,
            pad_h: ph,
            pad_w: pw,
        })
    }

    /// A `k×k×k` convolution with padding `k / 2`, stride 1 (the official `CausalConv3d(i, o, k, padding=k//2)`).
    pub(crate) fn cube(vb: &Vb, c_in: usize, c_out: usize, k: usize) -> Result<Self> {
        let p = k / 2;
        Self::new(vb, (c_in, c_out), (k, k, k), 1, (p, p, p))
    }

    /// `xs` [b, c, t, h, w]; `cache` holds frames of the previous chunk that replace front zero padding.
    pub(crate) fn forward(&self, xs: &Tensor, cache: Option<&Tensor>) -> Result<Tensor> {
        let mut front = self.pad_front;
        let xs = match cache {
            Some(c) if front > 0 => {
                front = front.saturating_sub(c.dim(2)?);
                Tensor::cat(&[c, xs], 2)?
            }
            _ => xs.clone(),
        };
        let (b, c, t, _, _) = xs.dims5()?;
        let kt = self.taps.len();
        let total = t + front;
        if total < kt {
            candle_core::bail!("causal conv: {total} frames for a temporal kernel of {kt}");
        }
        let t_out = (total - kt) / self.stride_t + 1;
        let (xs, pad) = if self.pad_h == self.pad_w {
            (xs, self.pad_h)
        } else {
            (
                xs.pad_with_zeros(3, self.pad_h, self.pad_h)?
                    .pad_with_zeros(4, self.pad_w, self.pad_w)?,
                0,
            )
        };
        let (hp, wp) = (xs.dim(3)?, xs.dim(4)?);
        // Frames first so that each tap reads a slab of whole frames: [b, front + t, c, h, w].
        let frames = xs
            .permute((0, 2, 1, 3, 4))?
            .contiguous()?
            .pad_with_zeros(1, front, 0)?;
        let mut acc: Option<Tensor> = None;
        for (tau, tap) in self.taps.iter().enumerate() {
            // Skip taps that only ever read the zero padding.
            if (t_out - 1) * self.stride_t + tau < front {
                continue;
            }
            let slab = if self.stride_t == 1 {
                frames.narrow(1, tau, t_out)?
            } else {
                let idx: Vec<u32> = (0..t_out)
                    .map(|j| (j * self.stride_t + tau) as u32)
                    .collect();
                frames.index_select(&Tensor::new(idx.as_slice(), frames.device())?, 1)?
            };
            let ys = slab
                .reshape((b * t_out, c, hp, wp))?
                .conv2d(tap, pad, 1, 1, 1)?;
            acc = Some(match acc {
                Some(a) => (a + ys)?,
                None => ys,
            });
        }
        let ys = match acc {
            Some(a) => a,
            None => {
                let (o, _, kh, kw) = self.taps[0].dims4()?;
                let (ho, wo) = (hp + 2 * pad - kh + 1, wp + 2 * pad - kw + 1);
                Tensor::zeros((b * t_out, o, ho, wo), xs.dtype(), xs.device())?
            }
        };
        let ys = ys.broadcast_add(&self.bias.reshape((1, (), 1, 1))?)?;
        let (_, o, ho, wo) = ys.dims4()?;
        ys.reshape((b, t_out, o, ho, wo))?
            .permute((0, 2, 1, 3, 4))?
            .contiguous()
    }

    /// The official cached call: convolve with the previous chunk's frames, then remember this input's last two
    /// frames (padded with the previous chunk's last frame when this chunk has only one).
    pub(crate) fn forward_cached(&self, xs: &Tensor, cache: &mut FeatCache) -> Result<Tensor> {
        let prev = match cache.take() {
            Slot::Frames(t) => Some(t),
            _ => None,
        };
        let mut keep = last_frames(xs, CACHE_T)?;
        if let (true, Some(p)) = (keep.dim(2)? < CACHE_T, prev.as_ref()) {
            keep = Tensor::cat(&[&last_frames(p, 1)?, &keep], 2)?;
        }
        let ys = self.forward(xs, prev.as_ref())?;
        cache.put(Slot::Frames(keep));
        Ok(ys)
    }
}

/// The official `RMS_norm` over channels (dim 1): `normalize(x) · sqrt(C) · gamma`, computed in f32.
pub(crate) struct RmsNorm {
    gamma: Tensor,
    scale: f64,
}

impl RmsNorm {
    /// `gamma` [C, 1, 1, 1] for video (`images=False`) or [C, 1, 1] for frames (`images=True`).
    pub(crate) fn new(vb: &Vb, dim: usize, images: bool) -> Result<Self> {
        let gamma = if images {
            vb.get((dim, 1, 1), "gamma")?
        } else {
            vb.get((dim, 1, 1, 1), "gamma")?
        };
        Ok(Self {
            gamma: gamma.flatten_all()?.to_dtype(DType::F32)?,
            scale: (dim as f64).sqrt(),
        })
    }

    pub(crate) fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let dtype = xs.dtype();
        let x = xs.to_dtype(DType::F32)?;
        // F.normalize: x / max(‖x‖₂, 1e-12) over channels.
        let norm = x.sqr()?.sum_keepdim(1)?.sqrt()?.maximum(1e-12)?;
        let mut gshape = vec![1usize; xs.rank()];
        gshape[1] = self.gamma.dim(0)?;
        let gamma = self.gamma.reshape(gshape)?;
        ((x.broadcast_div(&norm)? * self.scale)?.broadcast_mul(&gamma)?).to_dtype(dtype)
    }
}

/// `ResidualBlock`: RMS norm, SiLU, causal conv, RMS norm, SiLU, causal conv, plus a 1×1×1 shortcut when the
/// width changes. Keys `residual.{0,2,3,6}` and `shortcut`.
pub(crate) struct ResidualBlock {
    norm1: RmsNorm,
    conv1: CausalConv3d,
    norm2: RmsNorm,
    conv2: CausalConv3d,
    shortcut: Option<CausalConv3d>,
}

impl ResidualBlock {
    pub(crate) fn new(vb: &Vb, c_in: usize, c_out: usize) -> Result<Self> {
        let r = vb.pp("residual");
        let shortcut = if c_in != c_out {
            Some(CausalConv3d::cube(&vb.pp("shortcut"), c_in, c_out, 1)?)
        } else {
            None
        };
        Ok(Self {
            norm1: RmsNorm::new(&r.pp(0), c_in, false)?,
            conv1: CausalConv3d::cube(&r.pp(2), c_in, c_out, 3)?,
            norm2: RmsNorm::new(&r.pp(3), c_out, false)?,
            conv2: CausalConv3d::cube(&r.pp(6), c_out, c_out, 3)?,
            shortcut,
        })
    }

    pub(crate) fn forward(&self, xs: &Tensor, cache: &mut FeatCache) -> Result<Tensor> {
        let h = match &self.shortcut {
            Some(s) => s.forward(xs, None)?,
            None => xs.clone(),
        };
        let ys = self.norm1.forward(xs)?.silu()?;
        let ys = self.conv1.forward_cached(&ys, cache)?;
        let ys = self.norm2.forward(&ys)?.silu()?;
        let ys = self.conv2.forward_cached(&ys, cache)?;
        ys + h
    }
}

/// Queries per attention tile: bounds the score matrix at `QUERY_CHUNK × (h·w)` per frame.
const QUERY_CHUNK: usize = 4096;

/// `AttentionBlock`: single-head self-attention over the pixels of each frame, with a residual connection.
/// Keys `norm`, `to_qkv`, `proj`.
pub(crate) struct AttentionBlock {
    norm: RmsNorm,
    to_qkv: Conv2d,
    proj: Conv2d,
}

impl AttentionBlock {
    pub(crate) fn new(vb: &Vb, dim: usize) -> Result<Self> {
        Ok(Self {
            norm: RmsNorm::new(&vb.pp("norm"), dim, true)?,
            to_qkv: Conv2d::new(&vb.pp("to_qkv"), dim, dim * 3, 1, 0, 1)?,
            proj: Conv2d::new(&vb.pp("proj"), dim, dim, 1, 0, 1)?,
        })
    }

    pub(crate) fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let (b, c, t, h, w) = xs.dims5()?;
        let frames = xs.permute((0, 2, 1, 3, 4))?.reshape((b * t, c, h, w))?;
        let qkv = self.to_qkv.forward(&self.norm.forward(&frames)?)?;
        // [bt, 3c, hw] → [bt, hw, 3c]; q, k, v are consecutive channel thirds.
        let qkv = qkv
            .reshape((b * t, 3 * c, h * w))?
            .transpose(1, 2)?
            .to_dtype(DType::F32)?;
        let scale = 1.0 / (c as f64).sqrt();
        let mut outs = Vec::with_capacity(b * t);
        for f in 0..b * t {
            let frame = qkv.get(f)?;
            let k = frame.narrow(1, c, c)?.contiguous()?;
            let v = frame.narrow(1, 2 * c, c)?.contiguous()?;
            let mut rows = Vec::new();
            for start in (0..h * w).step_by(QUERY_CHUNK) {
                let n = QUERY_CHUNK.min(h * w - start);
                let q = frame.narrow(0, start, n)?.narrow(1, 0, c)?.contiguous()?;
                let scores = (q.matmul(&k.t()?)? * scale)?;
                let probs = framesmith_nn::ops::softmax_last_dim(&scores)?;
                rows.push(probs.matmul(&v)?);
            }
            outs.push(Tensor::cat(&rows, 0)?);
        }
        let att = Tensor::stack(&outs, 0)?
            .transpose(1, 2)?
            .reshape((b * t, c, h, w))?
            .to_dtype(xs.dtype())?;
        let ys = self.proj.forward(&att)?;
        let ys = ys.reshape((b, t, c, h, w))?.permute((0, 2, 1, 3, 4))?;
        ys + xs
    }
}

/// Spatial (and optionally temporal) resampling of a `Resample` layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResampleMode {
    Upsample2d,
    Upsample3d,
    Downsample2d,
    Downsample3d,
}

/// `Resample`: nearest ×2 upsampling + 3×3 conv, or right/bottom zero pad + stride-2 3×3 conv; the 3D modes add a
/// causal temporal conv (`time_conv`) that doubles or halves the frames after the first chunk.
pub(crate) struct Resample {
    mode: ResampleMode,
    conv: Conv2d,
    time_conv: Option<CausalConv3d>,
}

impl Resample {
    /// `up_out` is the width after an upsampling conv (`dim / 2` in Wan 2.1, `dim` in Wan 2.2).
    pub(crate) fn new(vb: &Vb, dim: usize, mode: ResampleMode, up_out: usize) -> Result<Self> {
        let conv_vb = vb.pp("resample").pp(1);
        let time_vb = vb.pp("time_conv");
        let (conv, time_conv) = match mode {
            ResampleMode::Upsample2d => (Conv2d::new(&conv_vb, dim, up_out, 3, 1, 1)?, None),
            ResampleMode::Upsample3d => {
                let tc = CausalConv3d::new(&time_vb, (dim, dim * 2), (3, 1, 1), 1, (1, 0, 0))?;
                (Conv2d::new(&conv_vb, dim, up_out, 3, 1, 1)?, Some(tc))
            }
            ResampleMode::Downsample2d => (Conv2d::new(&conv_vb, dim, dim, 3, 0, 2)?, None),
            ResampleMode::Downsample3d => {
                let tc = CausalConv3d::new(&time_vb, (dim, dim), (3, 1, 1), 2, (0, 0, 0))?;
                (Conv2d::new(&conv_vb, dim, dim, 3, 0, 2)?, Some(tc))
            }
        };
        Ok(Self {
            mode,
            conv,
            time_conv,
        })
    }

    fn time_conv(&self) -> Result<&CausalConv3d> {
        match &self.time_conv {
            Some(tc) => Ok(tc),
            None => candle_core::bail!("resample: {:?} has no temporal conv", self.mode),
        }
    }

    /// Temporal doubling of the 3D upsampler: nothing on the first chunk, then `time_conv` yields two
    /// channel halves that are interleaved as even and odd frames.
    fn upsample_time(&self, xs: &Tensor, cache: &mut FeatCache) -> Result<Tensor> {
        let prev = cache.take();
        if let Slot::Empty = prev {
            cache.put(Slot::Rep);
            return Ok(xs.clone());
        }
        let (b, c, t, h, w) = xs.dims5()?;
        let mut keep = last_frames(xs, CACHE_T)?;
        if keep.dim(2)? < CACHE_T {
            let pad = match &prev {
                Slot::Frames(p) => last_frames(p, 1)?,
                _ => keep.zeros_like()?,
            };
            keep = Tensor::cat(&[&pad, &keep], 2)?;
        }
        let ys = match &prev {
            Slot::Frames(p) => self.time_conv()?.forward(xs, Some(p))?,
            _ => self.time_conv()?.forward(xs, None)?,
        };
        cache.put(Slot::Frames(keep));
        ys.reshape((b, 2, c, t, h, w))?
            .permute((0, 2, 3, 1, 4, 5))?
            .reshape((b, c, t * 2, h, w))
    }

    /// Temporal halving of the 3D downsampler: nothing on the first chunk, then a stride-2 conv over the previous
    /// chunk's last frame and this chunk.
    fn downsample_time(&self, xs: &Tensor, cache: &mut FeatCache) -> Result<Tensor> {
        match cache.take() {
            Slot::Frames(prev) => {
                let keep = last_frames(xs, 1)?;
                let ys = self
                    .time_conv()?
                    .forward(&Tensor::cat(&[&last_frames(&prev, 1)?, xs], 2)?, None)?;
                cache.put(Slot::Frames(keep));
                Ok(ys)
            }
            _ => {
                cache.put(Slot::Frames(last_frames(xs, 1)?));
                Ok(xs.clone())
            }
        }
    }

    pub(crate) fn forward(&self, xs: &Tensor, cache: &mut FeatCache) -> Result<Tensor> {
        let xs = match self.mode {
            ResampleMode::Upsample3d => self.upsample_time(xs, cache)?,
            _ => xs.clone(),
        };
        let (b, c, t, h, w) = xs.dims5()?;
        let frames = xs.permute((0, 2, 1, 3, 4))?.reshape((b * t, c, h, w))?;
        let ys = match self.mode {
            ResampleMode::Upsample2d | ResampleMode::Upsample3d => {
                // Nearest-exact ×2 equals plain nearest ×2; done in f32 like the official bf16 workaround.
                let up = frames
                    .to_dtype(DType::F32)?
                    .upsample_nearest2d(2 * h, 2 * w)?
                    .to_dtype(xs.dtype())?;
                self.conv.forward(&up)?
            }
            ResampleMode::Downsample2d | ResampleMode::Downsample3d => {
                self.conv
                    .forward(&frames.pad_with_zeros(D::Minus2, 0, 1)?.pad_with_zeros(
                        D::Minus1,
                        0,
                        1,
                    )?)?
            }
        };
        let (_, c_out, ho, wo) = ys.dims4()?;
        let ys = ys
            .reshape((b, t, c_out, ho, wo))?
            .permute((0, 2, 1, 3, 4))?
            .contiguous()?;
        match self.mode {
            ResampleMode::Downsample3d => self.downsample_time(&ys, cache),
            _ => Ok(ys),
        }
    }
}
