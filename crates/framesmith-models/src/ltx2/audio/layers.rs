//! The layers of LTX-2's audio VAE as ltx-core writes them (`audio_vae/causal_conv_2d.py`, `resnet.py`,
//! `attention.py`, `downsample.py`, `upsample.py`, `common/normalization.py`): the 2-D convolution padded causally
//! along one axis, the pixel norm (eps 1e-6), the residual block, the single-head attention over all positions, and
//! the stride-2 downsampler and nearest-neighbour upsampler with their causal trims. Spectrograms are
//! [b, c, time, mel]; `height` is time.

use candle_core::{DType, Result, Tensor};

use super::config::Causality;
use framesmith_nn::vb::Vb;

/// Zero padding (left, right, top, bottom) of `xs` [b, c, h, w], as `F.pad(x, (l, r, t, b))`.
fn pad2d(xs: &Tensor, (l, r, t, b): (usize, usize, usize, usize)) -> Result<Tensor> {
    xs.pad_with_zeros(3, l, r)?.pad_with_zeros(2, t, b)
}

/// A plain `Conv2d` (keys `weight` [out, in, k, k], `bias` [out]) without padding.
pub(crate) struct Conv2d {
    weight: Tensor,
    bias: Tensor,
    stride: usize,
}

impl Conv2d {
    pub(crate) fn new(vb: &Vb, c_in: usize, c_out: usize, k: usize, stride: usize) -> Result<Self> {
        Ok(Self {
            weight: vb.get((c_out, c_in, k, k), "weight")?,
            bias: vb.get(c_out, "bias")?,
            stride,
        })
    }

    pub(crate) fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let ys = xs.conv2d(&self.weight, 0, self.stride, 1, 1)?;
        ys.broadcast_add(&self.bias.reshape((1, (), 1, 1))?)
    }
}

/// `CausalConv2d` (stride 1; keys `conv.weight`, `conv.bias`): the kernel's reach padded in front along the causal
/// axis, split evenly on the other.
pub(crate) struct CausalConv2d {
    conv: Conv2d,
    pad: (usize, usize, usize, usize),
}

impl CausalConv2d {
    pub(crate) fn new(
        vb: &Vb,
        c_in: usize,
        c_out: usize,
        k: usize,
        axis: Causality,
    ) -> Result<Self> {
        let p = k - 1;
        let pad = match axis {
            Causality::None => (p / 2, p - p / 2, p / 2, p - p / 2),
            Causality::Width | Causality::WidthCompatibility => (p, 0, p / 2, p - p / 2),
            Causality::Height => (p / 2, p - p / 2, p, 0),
        };
        Ok(Self {
            conv: Conv2d::new(&vb.pp("conv"), c_in, c_out, k, 1)?,
            pad,
        })
    }

    pub(crate) fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        self.conv.forward(&pad2d(xs, self.pad)?)
    }
}

/// `PixelNorm(dim=1, eps=1e-6)`: `x / sqrt(mean(x², channels) + 1e-6)`, in f32.
pub(crate) fn pixel_norm(xs: &Tensor) -> Result<Tensor> {
    let x = xs.to_dtype(DType::F32)?;
    let rms = (x.sqr()?.mean_keepdim(1)? + 1e-6)?.sqrt()?;
    x.broadcast_div(&rms)?.to_dtype(xs.dtype())
}

/// `ResnetBlock` without a timestep (keys `conv1`, `conv2`, `nin_shortcut` when the width changes).
pub(crate) struct ResnetBlock {
    conv1: CausalConv2d,
    conv2: CausalConv2d,
    nin_shortcut: Option<CausalConv2d>,
}

impl ResnetBlock {
    pub(crate) fn new(vb: &Vb, c_in: usize, c_out: usize, axis: Causality) -> Result<Self> {
        let nin_shortcut = if c_in != c_out {
            Some(CausalConv2d::new(
                &vb.pp("nin_shortcut"),
                c_in,
                c_out,
                1,
                axis,
            )?)
        } else {
            None
        };
        Ok(Self {
            conv1: CausalConv2d::new(&vb.pp("conv1"), c_in, c_out, 3, axis)?,
            conv2: CausalConv2d::new(&vb.pp("conv2"), c_out, c_out, 3, axis)?,
            nin_shortcut,
        })
    }

    pub(crate) fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let h = self.conv1.forward(&pixel_norm(xs)?.silu()?)?;
        let h = self.conv2.forward(&pixel_norm(&h)?.silu()?)?;
        let x = match &self.nin_shortcut {
            Some(s) => s.forward(xs)?,
            None => xs.clone(),
        };
        x + h
    }
}

/// `AttnBlock`: pixel norm, 1×1 `q`, `k`, `v`, one head over every (time, mel) position, `proj_out`, residual.
pub(crate) struct AttnBlock {
    q: Conv2d,
    k: Conv2d,
    v: Conv2d,
    proj_out: Conv2d,
}

impl AttnBlock {
    pub(crate) fn new(vb: &Vb, c: usize) -> Result<Self> {
        Ok(Self {
            q: Conv2d::new(&vb.pp("q"), c, c, 1, 1)?,
            k: Conv2d::new(&vb.pp("k"), c, c, 1, 1)?,
            v: Conv2d::new(&vb.pp("v"), c, c, 1, 1)?,
            proj_out: Conv2d::new(&vb.pp("proj_out"), c, c, 1, 1)?,
        })
    }

    pub(crate) fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let (b, c, h, w) = xs.dims4()?;
        let normed = pixel_norm(xs)?;
        let flat = |t: Tensor| t.reshape((b, c, h * w));
        let q = flat(self.q.forward(&normed)?)?;
        let k = flat(self.k.forward(&normed)?)?;
        let v = flat(self.v.forward(&normed)?)?;
        let scores = (q.transpose(1, 2)?.contiguous()?.matmul(&k)? * (c as f64).powf(-0.5))?;
        let weights = framesmith_nn::ops::softmax_last_dim(&scores)?;
        let out = v.matmul(&weights.transpose(1, 2)?.contiguous()?)?;
        xs + self.proj_out.forward(&out.reshape((b, c, h, w))?)?
    }
}

/// `Downsample` with a convolution (keys `conv.*`, kernel 3, stride 2), padded as its causal axis says.
pub(crate) struct Downsample {
    conv: Conv2d,
    pad: (usize, usize, usize, usize),
}

impl Downsample {
    pub(crate) fn new(vb: &Vb, c: usize, axis: Causality) -> Result<Self> {
        let pad = match axis {
            Causality::None => (0, 1, 0, 1),
            Causality::Width => (2, 0, 0, 1),
            Causality::Height => (0, 1, 2, 0),
            Causality::WidthCompatibility => (1, 0, 0, 1),
        };
        Ok(Self {
            conv: Conv2d::new(&vb.pp("conv"), c, c, 3, 2)?,
            pad,
        })
    }

    pub(crate) fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        self.conv.forward(&pad2d(xs, self.pad)?)
    }
}

/// `Upsample` with a convolution (keys `conv.conv.*`): nearest ×2, the causal convolution, then the first row
/// along a `height` or `width` causal axis dropped (undoing the encoder's padding).
pub(crate) struct Upsample {
    conv: CausalConv2d,
    axis: Causality,
}

impl Upsample {
    pub(crate) fn new(vb: &Vb, c: usize, axis: Causality) -> Result<Self> {
        Ok(Self {
            conv: CausalConv2d::new(&vb.pp("conv"), c, c, 3, axis)?,
            axis,
        })
    }

    pub(crate) fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let (_, _, h, w) = xs.dims4()?;
        let x = self.conv.forward(&xs.upsample_nearest2d(2 * h, 2 * w)?)?;
        match self.axis {
            Causality::Height => x.narrow(2, 1, 2 * h - 1),
            Causality::Width => x.narrow(3, 1, 2 * w - 1),
            Causality::None | Causality::WidthCompatibility => Ok(x),
        }
    }
}
