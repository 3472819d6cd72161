//! Layers of the FLUX.1 autoencoder (`modules/autoencoder.py`): 2D convolution, GroupNorm (32 groups, eps 1e-6),
//! the residual block, the single-head mid-block attention, and the ×2 down- / up-sampling convolutions.
//! Statistics are computed in f32; convolutions run in the weights' dtype.

use candle_core::{DType, Result, Tensor, D};

use framesmith_nn::attention::attention;
use framesmith_nn::vb::Vb;

/// GroupNorm groups and epsilon of every norm in the autoencoder.
const GROUPS: usize = 32;
const EPS: f64 = 1e-6;

/// `nn.Conv2d` with a bias: `weight` [out, in, k, k], `bias` [out].
#[derive(Clone)]
pub struct Conv2d {
    pub weight: Tensor,
    pub bias: Tensor,
    stride: usize,
    padding: usize,
}

impl Conv2d {
    pub fn new(
        vb: &Vb,
        [in_ch, out_ch, kernel]: [usize; 3],
        stride: usize,
        padding: usize,
    ) -> Result<Self> {
        Ok(Self {
            weight: vb.get((out_ch, in_ch, kernel, kernel), "weight")?,
            bias: vb.get(out_ch, "bias")?,
            stride,
            padding,
        })
    }

    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let ys = xs.conv2d(&self.weight, self.padding, self.stride, 1, 1)?;
        ys.broadcast_add(&self.bias.reshape((1, (), 1, 1))?)
    }
}

/// `nn.GroupNorm(32, channels, eps=1e-6, affine=True)`.
#[derive(Clone)]
pub struct GroupNorm {
    pub weight: Tensor,
    pub bias: Tensor,
}

impl GroupNorm {
    pub fn new(channels: usize, vb: &Vb) -> Result<Self> {
        if channels % GROUPS != 0 {
            candle_core::bail!(
                "FLUX autoencoder: {channels} channels do not split into {GROUPS} groups"
            );
        }
        let vb = vb.with_dtype(DType::F32);
        Ok(Self {
            weight: vb.get(channels, "weight")?,
            bias: vb.get(channels, "bias")?,
        })
    }

    /// Each f32 intermediate is dropped as soon as the next one exists: at its peak the norm holds its input and
    /// two f32 copies, where keeping them all held five (the decoder's widest norm, 256 channels over every pixel
    /// of a 1024² image, then needed 6 GiB).
    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let (b, c, h, w) = xs.dims4()?;
        let x = xs
            .to_dtype(DType::F32)?
            .reshape((b, GROUPS, (c / GROUPS) * h * w))?;
        let mean = x.mean_keepdim(D::Minus1)?;
        let centred = x.broadcast_sub(&mean)?;
        drop(x);
        let var = centred.sqr()?.mean_keepdim(D::Minus1)?;
        let normed = centred
            .broadcast_div(&(var + EPS)?.sqrt()?)?
            .reshape((b, c, h, w))?;
        drop(centred);
        let scaled = normed.broadcast_mul(&self.weight.reshape((1, c, 1, 1))?)?;
        drop(normed);
        let shifted = scaled.broadcast_add(&self.bias.reshape((1, c, 1, 1))?)?;
        drop(scaled);
        shifted.to_dtype(xs.dtype())
    }
}

/// `ResnetBlock`: norm1 → swish → conv1 → norm2 → swish → conv2, plus the input (through `nin_shortcut`, a 1×1
/// convolution, when the width changes).
#[derive(Clone)]
pub struct ResnetBlock {
    pub norm1: GroupNorm,
    pub conv1: Conv2d,
    pub norm2: GroupNorm,
    pub conv2: Conv2d,
    pub nin_shortcut: Option<Conv2d>,
}

impl ResnetBlock {
    pub fn new(in_ch: usize, out_ch: usize, vb: &Vb) -> Result<Self> {
        let nin_shortcut = if in_ch != out_ch {
            Some(Conv2d::new(
                &vb.pp("nin_shortcut"),
                [in_ch, out_ch, 1],
                1,
                0,
            )?)
        } else {
            None
        };
        Ok(Self {
            norm1: GroupNorm::new(in_ch, &vb.pp("norm1"))?,
            conv1: Conv2d::new(&vb.pp("conv1"), [in_ch, out_ch, 3], 1, 1)?,
            norm2: GroupNorm::new(out_ch, &vb.pp("norm2"))?,
            conv2: Conv2d::new(&vb.pp("conv2"), [out_ch, out_ch, 3], 1, 1)?,
            nin_shortcut,
        })
    }

    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let h = self.conv1.forward(&self.norm1.forward(xs)?.silu()?)?;
        let h = self.conv2.forward(&self.norm2.forward(&h)?.silu()?)?;
        match &self.nin_shortcut {
            Some(conv) => conv.forward(xs)? + h,
            None => xs + h,
        }
    }
}

/// `AttnBlock`: GroupNorm, 1×1 `q`, `k`, `v`, one-head attention over the h·w positions, 1×1 `proj_out`,
/// plus the input.
#[derive(Clone)]
pub struct AttnBlock {
    pub norm: GroupNorm,
    pub q: Conv2d,
    pub k: Conv2d,
    pub v: Conv2d,
    pub proj_out: Conv2d,
}

impl AttnBlock {
    pub fn new(channels: usize, vb: &Vb) -> Result<Self> {
        let conv = |name: &str| Conv2d::new(&vb.pp(name), [channels, channels, 1], 1, 0);
        Ok(Self {
            norm: GroupNorm::new(channels, &vb.pp("norm"))?,
            q: conv("q")?,
            k: conv("k")?,
            v: conv("v")?,
            proj_out: conv("proj_out")?,
        })
    }

    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let (b, c, h, w) = xs.dims4()?;
        let normed = self.norm.forward(xs)?;
        // [b, c, h, w] → [b, h·w, 1 head, c]
        let tokens = |t: Tensor| -> Result<Tensor> {
            t.reshape((b, c, h * w))?
                .transpose(1, 2)?
                .contiguous()?
                .unsqueeze(2)
        };
        let q = tokens(self.q.forward(&normed)?)?;
        let k = tokens(self.k.forward(&normed)?)?;
        let v = tokens(self.v.forward(&normed)?)?;
        let out = attention(&q, &k, &v, None)?
            .squeeze(2)?
            .transpose(1, 2)?
            .reshape((b, c, h, w))?;
        xs + self.proj_out.forward(&out)?
    }
}

/// `Downsample`: zero padding on the right and bottom, then a 3×3 convolution with stride 2.
#[derive(Clone)]
pub struct Downsample {
    pub conv: Conv2d,
}

impl Downsample {
    pub fn new(channels: usize, vb: &Vb) -> Result<Self> {
        Ok(Self {
            conv: Conv2d::new(&vb.pp("conv"), [channels, channels, 3], 2, 0)?,
        })
    }

    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let padded = xs
            .pad_with_zeros(D::Minus1, 0, 1)?
            .pad_with_zeros(D::Minus2, 0, 1)?;
        self.conv.forward(&padded)
    }
}

/// `Upsample`: nearest-neighbour ×2, then a 3×3 convolution.
#[derive(Clone)]
pub struct Upsample {
    pub conv: Conv2d,
}

impl Upsample {
    pub fn new(channels: usize, vb: &Vb) -> Result<Self> {
        Ok(Self {
            conv: Conv2d::new(&vb.pp("conv"), [channels, channels, 3], 1, 1)?,
        })
    }

    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let (_, _, h, w) = xs.dims4()?;
        self.conv.forward(&xs.upsample_nearest2d(2 * h, 2 * w)?)
    }
}
