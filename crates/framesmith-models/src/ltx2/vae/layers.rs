//! The layers of LTX-2's video VAE as ltx-core writes them (`video_vae/convolution.py`, `resnet.py`,
//! `sampling.py`, `ops.py`): the kernel-3 `CausalConv3d` (time padded by repeating the first frame twice, or the
//! first and last once each when not causal; space padded by the configured mode), the pixel norm, the residual
//! block with its optional timestep scale-shift and spatial noise, the `res_x` stack with its timestep embedder,
//! the space-to-depth downsampler and depth-to-space upsampler, and the patchify that folds 4×4 pixels into
//! channels. The temporal taps are the Wan VAE's (`crate::wan::vae::layers`).

use candle_core::{DType, Result, Tensor};

use super::config::Padding;
use crate::ltx2::embeddings::timestep_sinusoid;
use crate::wan::vae::layers::CausalConv3d as Taps;
use framesmith_nn::linear::Linear;
use framesmith_nn::vb::Vb;

/// `xs` padded by one on both sides of `dim` as `mode` says.
fn pad1(xs: &Tensor, dim: usize, mode: Padding) -> Result<Tensor> {
    match mode {
        Padding::Zeros => xs.pad_with_zeros(dim, 1, 1),
        Padding::Replicate => xs.pad_with_same(dim, 1, 1),
        Padding::Reflect => {
            let n = xs.dim(dim)?;
            if n < 2 {
                candle_core::bail!("reflect padding needs at least 2 pixels, got {n}");
            }
            Tensor::cat(
                &[&xs.narrow(dim, 1, 1)?, xs, &xs.narrow(dim, n - 2, 1)?],
                dim,
            )
        }
    }
}

/// `CausalConv3d` (kernel 3, stride 1): keys `conv.weight` [out, in, 3, 3, 3], `conv.bias`.
pub(crate) struct CausalConv {
    taps: Taps,
    padding: Padding,
}

impl CausalConv {
    pub(crate) fn new(vb: &Vb, c_in: usize, c_out: usize, padding: Padding) -> Result<Self> {
        Ok(Self {
            taps: Taps::new(&vb.pp("conv"), (c_in, c_out), (3, 3, 3), 1, (0, 0, 0))?,
            padding,
        })
    }

    /// `xs` [b, c, t, h, w] → [b, out, t, h, w]; `causal`: the first frame twice in front, else the first in
    /// front and the last behind.
    pub(crate) fn forward(&self, xs: &Tensor, causal: bool) -> Result<Tensor> {
        let t = xs.dim(2)?;
        let first = xs.narrow(2, 0, 1)?;
        let padded = if causal {
            Tensor::cat(&[&first, &first, xs], 2)?
        } else {
            Tensor::cat(&[&first, xs, &xs.narrow(2, t - 1, 1)?], 2)?
        };
        let padded = pad1(&pad1(&padded, 3, self.padding)?, 4, self.padding)?;
        self.taps.forward(&padded, None)
    }
}

/// `PixelNorm`: `x / sqrt(mean(x², channels) + 1e-8)`, in f32.
pub(crate) fn pixel_norm(xs: &Tensor) -> Result<Tensor> {
    let x = xs.to_dtype(DType::F32)?;
    let rms = (x.sqr()?.mean_keepdim(1)? + 1e-8)?.sqrt()?;
    x.broadcast_div(&rms)?.to_dtype(xs.dtype())
}

/// `GroupNorm(1, c, eps=1e-6)` with its affine `weight`, `bias` [c]: over every value of a sample.
struct LayerNorm3d {
    weight: Tensor,
    bias: Tensor,
}

impl LayerNorm3d {
    fn new(vb: &Vb, c: usize) -> Result<Self> {
        Ok(Self {
            weight: vb.get(c, "weight")?.to_dtype(DType::F32)?,
            bias: vb.get(c, "bias")?.to_dtype(DType::F32)?,
        })
    }

    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let (b, c, t, h, w) = xs.dims5()?;
        let x = xs.to_dtype(DType::F32)?.reshape((b, c * t * h * w))?;
        let mean = x.mean_keepdim(1)?;
        let centred = x.broadcast_sub(&mean)?;
        let var = centred.sqr()?.mean_keepdim(1)?;
        let normed = centred
            .broadcast_div(&(var + 1e-6)?.sqrt()?)?
            .reshape((b, c, t, h, w))?;
        let shape = (1, c, 1, 1, 1);
        normed
            .broadcast_mul(&self.weight.reshape(shape)?)?
            .broadcast_add(&self.bias.reshape(shape)?)?
            .to_dtype(xs.dtype())
    }
}

/// A 1×1×1 convolution: `weight` [out, in, 1, 1, 1], `bias` [out].
struct Pointwise {
    weight: Tensor,
    bias: Tensor,
}

impl Pointwise {
    fn new(vb: &Vb, c_in: usize, c_out: usize) -> Result<Self> {
        Ok(Self {
            weight: vb
                .get((c_out, c_in, 1, 1, 1), "weight")?
                .reshape((c_out, c_in))?,
            bias: vb.get(c_out, "bias")?,
        })
    }

    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let (b, c, t, h, w) = xs.dims5()?;
        let o = self.weight.dim(0)?;
        let flat = xs.reshape((b, c, t * h * w))?;
        let w_ = self
            .weight
            .to_dtype(xs.dtype())?
            .unsqueeze(0)?
            .broadcast_as((b, o, c))?;
        w_.contiguous()?
            .matmul(&flat.contiguous()?)?
            .broadcast_add(&self.bias.to_dtype(xs.dtype())?.reshape((1, o, 1))?)?
            .reshape((b, o, t, h, w))
    }
}

/// `PixArtAlphaCombinedTimestepSizeEmbeddings` without sizes: keys `timestep_embedder.linear_{1,2}`.
pub(crate) struct TimeEmbedder {
    linear_1: Linear,
    linear_2: Linear,
}

impl TimeEmbedder {
    pub(crate) fn new(vb: &Vb, dim: usize) -> Result<Self> {
        let vb = vb.pp("timestep_embedder");
        Ok(Self {
            linear_1: Linear::load(&vb.pp("linear_1"), 256, dim)?,
            linear_2: Linear::load(&vb.pp("linear_2"), dim, dim)?,
        })
    }

    /// The embedding [b, dim] of scaled timesteps (one per sample), in `dtype`.
    pub(crate) fn forward(&self, timesteps: &[f32], dtype: DType) -> Result<Tensor> {
        let device = self.linear_1.base().device().clone();
        let proj = timestep_sinusoid(timesteps, &device)?.to_dtype(dtype)?;
        self.linear_2
            .forward(&self.linear_1.forward(&proj)?.silu()?)
    }
}

/// `x · (1 + scale) + shift` with `scale`, `shift` [b, c].
pub(crate) fn modulate(xs: &Tensor, shift: &Tensor, scale: &Tensor) -> Result<Tensor> {
    let (b, c) = shift.dims2()?;
    let shape = (b, c, 1, 1, 1);
    let scale = (scale.reshape(shape)? + 1.0)?.to_dtype(xs.dtype())?;
    xs.broadcast_mul(&scale)?
        .broadcast_add(&shift.reshape(shape)?.to_dtype(xs.dtype())?)
}

/// `ResnetBlock3D` (pixel norms): keys `conv1`, `conv2`, and when the width changes `norm3` and `conv_shortcut`;
/// `scale_shift_table` [4, c] when timestep-conditioned, `per_channel_scale{1,2}` [c, 1, 1] with noise.
pub(crate) struct ResnetBlock {
    conv1: CausalConv,
    conv2: CausalConv,
    shortcut: Option<(LayerNorm3d, Pointwise)>,
    scale_shift_table: Option<Tensor>,
    noise_scales: Option<(Tensor, Tensor)>,
}

/// What a residual block's switches are.
#[derive(Clone, Copy)]
pub(crate) struct ResnetOptions {
    pub padding: Padding,
    pub timestep_conditioning: bool,
    pub inject_noise: bool,
}

impl ResnetBlock {
    pub(crate) fn new(vb: &Vb, c_in: usize, c_out: usize, opts: ResnetOptions) -> Result<Self> {
        let shortcut = if c_in != c_out {
            Some((
                LayerNorm3d::new(&vb.pp("norm3"), c_in)?,
                Pointwise::new(&vb.pp("conv_shortcut"), c_in, c_out)?,
            ))
        } else {
            None
        };
        let scale_shift_table = opts
            .timestep_conditioning
            .then(|| vb.get((4, c_in), "scale_shift_table"))
            .transpose()?;
        let noise_scales = opts
            .inject_noise
            .then(|| -> Result<(Tensor, Tensor)> {
                Ok((
                    vb.get((c_in, 1, 1), "per_channel_scale1")?,
                    vb.get((c_in, 1, 1), "per_channel_scale2")?,
                ))
            })
            .transpose()?;
        Ok(Self {
            conv1: CausalConv::new(&vb.pp("conv1"), c_in, c_out, opts.padding)?,
            conv2: CausalConv::new(&vb.pp("conv2"), c_out, c_out, opts.padding)?,
            shortcut,
            scale_shift_table,
            noise_scales,
        })
    }

    /// `temb` [b, 4c]: the block's timestep embedding when timestep-conditioned.
    pub(crate) fn forward(
        &self,
        xs: &Tensor,
        causal: bool,
        temb: Option<&Tensor>,
    ) -> Result<Tensor> {
        let ada = match (&self.scale_shift_table, temb) {
            (Some(table), Some(temb)) => {
                let (b, _) = temb.dims2()?;
                let (_, c) = table.dims2()?;
                let rows = temb
                    .reshape((b, 4, c))?
                    .broadcast_add(&table.to_dtype(temb.dtype())?.unsqueeze(0)?)?;
                Some(
                    (0..4)
                        .map(|i| rows.narrow(1, i, 1)?.squeeze(1))
                        .collect::<Result<Vec<_>>>()?,
                )
            }
            (Some(_), None) => {
                candle_core::bail!("a timestep-conditioned VAE block needs a timestep")
            }
            _ => None,
        };
        let mut h = pixel_norm(xs)?;
        if let Some(a) = &ada {
            h = modulate(&h, &a[0], &a[1])?;
        }
        h = self.conv1.forward(&h.silu()?, causal)?;
        if let Some((s1, _)) = &self.noise_scales {
            h = spatial_noise(&h, s1)?;
        }
        h = pixel_norm(&h)?;
        if let Some(a) = &ada {
            h = modulate(&h, &a[2], &a[3])?;
        }
        h = self.conv2.forward(&h.silu()?, causal)?;
        if let Some((_, s2)) = &self.noise_scales {
            h = spatial_noise(&h, s2)?;
        }
        let x = match &self.shortcut {
            Some((norm, conv)) => conv.forward(&norm.forward(xs)?)?,
            None => xs.clone(),
        };
        x + h
    }
}

/// `_feed_spatial_noise`: one standard-normal image [h, w] scaled per channel, added to every frame.
fn spatial_noise(xs: &Tensor, scale: &Tensor) -> Result<Tensor> {
    let (_, c, _, h, w) = xs.dims5()?;
    let noise = Tensor::randn(0f32, 1f32, (1, h, w), xs.device())?.to_dtype(xs.dtype())?;
    let scaled = noise.broadcast_mul(&scale.to_dtype(xs.dtype())?)?;
    xs.broadcast_add(&scaled.reshape((1, c, 1, h, w))?)
}

/// `UNetMidBlock3D` (`res_x`): keys `res_blocks.{i}`, and `time_embedder` (width 4c) when timestep-conditioned.
pub(crate) struct ResStack {
    res_blocks: Vec<ResnetBlock>,
    time_embedder: Option<TimeEmbedder>,
}

impl ResStack {
    pub(crate) fn new(vb: &Vb, c: usize, layers: usize, opts: ResnetOptions) -> Result<Self> {
        let time_embedder = opts
            .timestep_conditioning
            .then(|| TimeEmbedder::new(&vb.pp("time_embedder"), 4 * c))
            .transpose()?;
        let res_blocks = (0..layers)
            .map(|i| ResnetBlock::new(&vb.pp("res_blocks").pp(i), c, c, opts))
            .collect::<Result<_>>()?;
        Ok(Self {
            res_blocks,
            time_embedder,
        })
    }

    /// `timesteps`: the scaled timestep per sample, when timestep-conditioned.
    pub(crate) fn forward(
        &self,
        xs: &Tensor,
        causal: bool,
        timesteps: Option<&[f32]>,
    ) -> Result<Tensor> {
        let temb = match (&self.time_embedder, timesteps) {
            (Some(e), Some(t)) => Some(e.forward(t, xs.dtype())?),
            (Some(_), None) => {
                candle_core::bail!("a timestep-conditioned VAE block needs a timestep")
            }
            _ => None,
        };
        let mut h = xs.clone();
        for block in &self.res_blocks {
            h = block.forward(&h, causal, temb.as_ref())?;
        }
        Ok(h)
    }
}

/// `b c (d p1) (h p2) (w p3) → b (c p1 p2 p3) d h w`.
fn space_to_depth(xs: &Tensor, (p1, p2, p3): (usize, usize, usize)) -> Result<Tensor> {
    let (b, c, t, h, w) = xs.dims5()?;
    let (d, hh, ww) = (t / p1, h / p2, w / p3);
    xs.reshape(vec![b, c, d, p1, hh, p2, ww, p3])?
        .permute(vec![0, 1, 3, 5, 7, 2, 4, 6])?
        .reshape((b, c * p1 * p2 * p3, d, hh, ww))
}

/// `b (c p1 p2 p3) d h w → b c (d p1) (h p2) (w p3)`.
fn depth_to_space(xs: &Tensor, (p1, p2, p3): (usize, usize, usize)) -> Result<Tensor> {
    let (b, packed, d, h, w) = xs.dims5()?;
    let c = packed / (p1 * p2 * p3);
    xs.reshape(vec![b, c, p1, p2, p3, d, h, w])?
        .permute(vec![0, 1, 5, 2, 6, 3, 7, 4])?
        .reshape((b, c, d * p1, h * p2, w * p3))
}

/// `SpaceToDepthDownsample`: key `conv` (to `out / prod(stride)` channels). The conv's result and the input are
/// both folded by `stride`, the input averaged over groups of channels to `out`; time-halving repeats the first
/// frame in front first.
pub(crate) struct Downsample {
    conv: CausalConv,
    stride: (usize, usize, usize),
    group: usize,
}

impl Downsample {
    pub(crate) fn new(
        vb: &Vb,
        (c_in, c_out): (usize, usize),
        stride: (usize, usize, usize),
        padding: Padding,
    ) -> Result<Self> {
        let fold = stride.0 * stride.1 * stride.2;
        if c_out % fold != 0 || (c_in * fold) % c_out != 0 {
            candle_core::bail!("VAE downsample: {c_in} → {c_out} channels do not fold by {fold}");
        }
        Ok(Self {
            conv: CausalConv::new(&vb.pp("conv"), c_in, c_out / fold, padding)?,
            stride,
            group: c_in * fold / c_out,
        })
    }

    pub(crate) fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let xs = if self.stride.0 == 2 {
            Tensor::cat(&[&xs.narrow(2, 0, 1)?, xs], 2)?
        } else {
            xs.clone()
        };
        let folded = space_to_depth(&xs, self.stride)?;
        let (b, c, d, h, w) = folded.dims5()?;
        let shortcut = if self.group == 1 {
            folded
        } else {
            folded
                .reshape(vec![b, c / self.group, self.group, d, h, w])?
                .mean(2)?
        };
        space_to_depth(&self.conv.forward(&xs, true)?, self.stride)? + shortcut
    }
}

/// `DepthToSpaceUpsample`: key `conv` (to `prod(stride) · in / reduction` channels) unfolded by `stride`, the
/// first frame dropped when time doubles; with `residual` the input unfolded the same way, its channels tiled
/// `prod(stride) / reduction` times, is added.
pub(crate) struct Upsample {
    conv: CausalConv,
    stride: (usize, usize, usize),
    residual: bool,
    repeats: usize,
}

impl Upsample {
    pub(crate) fn new(
        vb: &Vb,
        c_in: usize,
        (stride, reduction, residual): ((usize, usize, usize), usize, bool),
        padding: Padding,
    ) -> Result<Self> {
        let fold = stride.0 * stride.1 * stride.2;
        if reduction == 0 || (fold * c_in) % reduction != 0 || fold % reduction != 0 && residual {
            candle_core::bail!(
                "VAE upsample: {c_in} channels do not unfold by {fold} with reduction {reduction}"
            );
        }
        Ok(Self {
            conv: CausalConv::new(&vb.pp("conv"), c_in, fold * c_in / reduction, padding)?,
            stride,
            residual,
            repeats: fold / reduction,
        })
    }

    pub(crate) fn forward(&self, xs: &Tensor, causal: bool) -> Result<Tensor> {
        let drop_first = |t: Tensor| -> Result<Tensor> {
            if self.stride.0 == 2 {
                let n = t.dim(2)?;
                t.narrow(2, 1, n - 1)
            } else {
                Ok(t)
            }
        };
        let h = drop_first(depth_to_space(
            &self.conv.forward(xs, causal)?,
            self.stride,
        )?)?;
        if !self.residual {
            return Ok(h);
        }
        let x = depth_to_space(xs, self.stride)?;
        let x = Tensor::cat(&vec![&x; self.repeats], 1)?;
        h + drop_first(x)?
    }
}

/// `patchify(x, p, 1)`: `b c f (h q) (w r) → b (c r q) f h w`.
pub(crate) fn patchify(xs: &Tensor, p: usize) -> Result<Tensor> {
    if p == 1 {
        return Ok(xs.clone());
    }
    let (b, c, f, h, w) = xs.dims5()?;
    let (hh, ww) = (h / p, w / p);
    xs.reshape(vec![b, c, f, hh, p, ww, p])?
        .permute(vec![0, 1, 6, 4, 2, 3, 5])?
        .reshape((b, c * p * p, f, hh, ww))
}

/// `unpatchify(x, p, 1)`: `b (c r q) f h w → b c f (h q) (w r)`.
pub(crate) fn unpatchify(xs: &Tensor, p: usize) -> Result<Tensor> {
    if p == 1 {
        return Ok(xs.clone());
    }
    let (b, packed, f, h, w) = xs.dims5()?;
    let c = packed / (p * p);
    xs.reshape(vec![b, c, p, p, f, h, w])?
        .permute(vec![0, 1, 4, 5, 3, 6, 2])?
        .reshape((b, c, f, h * p, w * p))
}
