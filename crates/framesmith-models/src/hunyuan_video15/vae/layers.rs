//! The layers of HunyuanVideo 1.5's VAE (official `hunyuanvideo_15_vae.py`): the causal 3-D convolution with
//! replicate padding, the residual block, the frame-causal attention and the space/time-to-channel resamplers,
//! each able to run a clip in temporal chunks with a [`Stream`] carrying what the next chunk needs (the last two
//! frames per convolution, the keys and values of the attention), so that chunked and whole-clip results agree.
//! The temporal taps and the channel RMS norm are the Wan VAE's (`crate::wan::vae::layers`).

use candle_core::{DType, Result, Tensor};

use crate::wan::vae::layers::{CausalConv3d as Taps, RmsNorm};
use framesmith_nn::vb::Vb;

/// What a chunked pass keeps between chunks: one slot per stateful layer, visited in the same order each chunk.
pub(crate) struct Stream {
    slots: Vec<Option<Tensor>>,
    next: usize,
    first: bool,
}

impl Stream {
    pub(crate) fn new() -> Self {
        Self {
            slots: Vec::new(),
            next: 0,
            first: true,
        }
    }

    /// Rewinds to the first layer; `first` says whether the chunk starts the clip.
    pub(crate) fn start_chunk(&mut self, first: bool) {
        self.next = 0;
        self.first = first;
    }

    /// Whether the current chunk holds the clip's first frame.
    pub(crate) fn first(&self) -> bool {
        self.first
    }

    /// The current slot's content (left empty) without moving on.
    fn take(&mut self) -> Option<Tensor> {
        self.slots.get_mut(self.next).and_then(Option::take)
    }

    /// Stores the current slot and moves to the next.
    fn put(&mut self, t: Tensor) {
        if self.next >= self.slots.len() {
            self.slots.resize_with(self.next + 1, || None);
        }
        self.slots[self.next] = Some(t);
        self.next += 1;
    }
}

/// Frames before a chunk that a kernel-3 causal convolution reads.
const CONTEXT_FRAMES: usize = 2;

/// `CausalConv3d` (kernel 3): the clip padded in front with two copies of its first frame and spatially by one
/// pixel, both by replication; in a later chunk the previous chunk's last two frames take the front padding's
/// place. Keys `conv.weight` [out, in, 3, 3, 3], `conv.bias`.
pub(crate) struct CausalConv {
    taps: Taps,
}

impl CausalConv {
    pub(crate) fn new(vb: &Vb, c_in: usize, c_out: usize) -> Result<Self> {
        Ok(Self {
            taps: Taps::new(&vb.pp("conv"), (c_in, c_out), (3, 3, 3), 1, (0, 0, 0))?,
        })
    }

    pub(crate) fn forward(&self, xs: &Tensor, stream: &mut Stream) -> Result<Tensor> {
        let front = match stream.take() {
            Some(prev) if !stream.first() => prev,
            _ => {
                let first = xs.narrow(2, 0, 1)?;
                Tensor::cat(&[&first, &first], 2)?
            }
        };
        let padded = Tensor::cat(&[&front, xs], 2)?;
        let t = padded.dim(2)?;
        stream.put(
            padded
                .narrow(2, t - CONTEXT_FRAMES, CONTEXT_FRAMES)?
                .contiguous()?,
        );
        let padded = padded.pad_with_same(3, 1, 1)?.pad_with_same(4, 1, 1)?;
        self.taps.forward(&padded, None)
    }
}

/// `ResnetBlock`: RMS norm, SiLU, conv, RMS norm, SiLU, conv, plus the input (through the 1×1×1 `nin_shortcut`
/// when the width changes).
pub(crate) struct ResnetBlock {
    norm1: RmsNorm,
    conv1: CausalConv,
    norm2: RmsNorm,
    conv2: CausalConv,
    nin_shortcut: Option<Taps>,
}

impl ResnetBlock {
    pub(crate) fn new(vb: &Vb, c_in: usize, c_out: usize) -> Result<Self> {
        let nin_shortcut = if c_in != c_out {
            let vb = vb.pp("nin_shortcut");
            Some(Taps::new(&vb, (c_in, c_out), (1, 1, 1), 1, (0, 0, 0))?)
        } else {
            None
        };
        Ok(Self {
            norm1: RmsNorm::new(&vb.pp("norm1"), c_in, false)?,
            conv1: CausalConv::new(&vb.pp("conv1"), c_in, c_out)?,
            norm2: RmsNorm::new(&vb.pp("norm2"), c_out, false)?,
            conv2: CausalConv::new(&vb.pp("conv2"), c_out, c_out)?,
            nin_shortcut,
        })
    }

    pub(crate) fn forward(&self, xs: &Tensor, stream: &mut Stream) -> Result<Tensor> {
        let h = self.norm1.forward(xs)?.silu()?;
        let h = self.conv1.forward(&h, stream)?;
        let h = self.norm2.forward(&h)?.silu()?;
        let h = self.conv2.forward(&h, stream)?;
        let x = match &self.nin_shortcut {
            Some(s) => s.forward(xs, None)?,
            None => xs.clone(),
        };
        x + h
    }
}

/// A 1×1×1 convolution as a matrix over channels: `weight` [out, in, 1, 1, 1], `bias` [out].
struct Pointwise {
    weight: Tensor,
    bias: Tensor,
}

impl Pointwise {
    fn new(vb: &Vb, c: usize) -> Result<Self> {
        Ok(Self {
            weight: vb.get((c, c, 1, 1, 1), "weight")?.reshape((c, c))?,
            bias: vb.get(c, "bias")?,
        })
    }

    /// `xs` [n, c] → [n, c].
    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let w = self.weight.to_dtype(xs.dtype())?;
        let b = self.bias.to_dtype(xs.dtype())?;
        xs.matmul(&w.t()?)?.broadcast_add(&b)
    }
}

/// Queries per attention tile: bounds the score matrix at `QUERY_CHUNK` × the keys so far.
const QUERY_CHUNK: usize = 4096;

/// `AttnBlock`: one-head attention over every pixel of the clip, each frame seeing itself and the frames before
/// it; keys `norm`, `q`, `k`, `v`, `proj_out`. Later chunks attend to the keys and values kept from earlier ones.
pub(crate) struct AttnBlock {
    norm: RmsNorm,
    q: Pointwise,
    k: Pointwise,
    v: Pointwise,
    proj_out: Pointwise,
}

impl AttnBlock {
    pub(crate) fn new(vb: &Vb, c: usize) -> Result<Self> {
        Ok(Self {
            norm: RmsNorm::new(&vb.pp("norm"), c, false)?,
            q: Pointwise::new(&vb.pp("q"), c)?,
            k: Pointwise::new(&vb.pp("k"), c)?,
            v: Pointwise::new(&vb.pp("v"), c)?,
            proj_out: Pointwise::new(&vb.pp("proj_out"), c)?,
        })
    }

    pub(crate) fn forward(&self, xs: &Tensor, stream: &mut Stream) -> Result<Tensor> {
        let (b, c, f, h, w) = xs.dims5()?;
        let hw = h * w;
        let tokens = self.norm.forward(xs)?.to_dtype(DType::F32)?;
        let kept = match (stream.take(), stream.first()) {
            (Some(kv), false) => Some(kv),
            _ => None,
        };
        let mut outs = Vec::with_capacity(b);
        let mut new_kv = Vec::with_capacity(b);
        for i in 0..b {
            // [c, f, h, w] → [f·h·w, c]
            let x = tokens.get(i)?.reshape((c, f * hw))?.t()?.contiguous()?;
            let (q, k, v) = (
                self.q.forward(&x)?,
                self.k.forward(&x)?,
                self.v.forward(&x)?,
            );
            let (k, v) = match kept.as_ref() {
                Some(kv) => {
                    let kv = kv.get(i)?;
                    (
                        Tensor::cat(&[&kv.get(0)?, &k], 0)?,
                        Tensor::cat(&[&kv.get(1)?, &v], 0)?,
                    )
                }
                None => (k, v),
            };
            let before = k.dim(0)? - f * hw;
            outs.push(
                self.proj_out
                    .forward(&causal_attention(&q, &k, &v, hw, before)?)?,
            );
            new_kv.push(Tensor::stack(&[&k, &v], 0)?);
        }
        stream.put(Tensor::stack(&new_kv, 0)?);
        let ys = Tensor::stack(&outs, 0)?
            .transpose(1, 2)?
            .reshape((b, c, f, h, w))?
            .to_dtype(xs.dtype())?;
        xs + ys
    }
}

/// Softmax attention of `q` [f·hw, c] over `k`, `v` [before + f·hw, c], query frame `j` seeing the first
/// `before + (j + 1)·hw` keys; scale `1/√c`.
fn causal_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    hw: usize,
    before: usize,
) -> Result<Tensor> {
    let (n, c) = q.dims2()?;
    let scale = 1.0 / (c as f64).sqrt();
    let mut rows = Vec::new();
    for frame in 0..n / hw {
        let seen = before + (frame + 1) * hw;
        let (k, v) = (k.narrow(0, 0, seen)?, v.narrow(0, 0, seen)?);
        let kt = k.t()?;
        for start in (0..hw).step_by(QUERY_CHUNK) {
            let rows_n = QUERY_CHUNK.min(hw - start);
            let q = q.narrow(0, frame * hw + start, rows_n)?;
            let scores = (q.matmul(&kt)? * scale)?;
            let probs = framesmith_nn::ops::softmax_last_dim(&scores)?;
            rows.push(probs.matmul(&v)?);
        }
    }
    Tensor::cat(&rows, 0)
}

/// `b c (f r1) (h 2) (w 2) → b (r1 2 2 c) f h w`.
fn space_to_channels(xs: &Tensor, r1: usize) -> Result<Tensor> {
    let (b, c, t, h, w) = xs.dims5()?;
    let (f, h2, w2) = (t / r1, h / 2, w / 2);
    xs.reshape(vec![b, c, f, r1, h2, 2, w2, 2])?
        .permute(vec![0, 3, 5, 7, 1, 2, 4, 6])?
        .reshape((b, r1 * 4 * c, f, h2, w2))
}

/// `b (r1 2 2 c) f h w → b c (f r1) (h 2) (w 2)`.
fn channels_to_space(xs: &Tensor, r1: usize) -> Result<Tensor> {
    let (b, packed, f, h, w) = xs.dims5()?;
    let c = packed / (r1 * 4);
    xs.reshape(vec![b, r1, 2, 2, c, f, h, w])?
        .permute(vec![0, 4, 5, 1, 6, 2, 7, 3])?
        .reshape((b, c, f * r1, h * 2, w * 2))
}

/// The mean over groups of `group` consecutive channels: [b, c·group, ...] → [b, c, ...].
pub(crate) fn group_mean(xs: &Tensor, group: usize) -> Result<Tensor> {
    let (b, c, f, h, w) = xs.dims5()?;
    if group == 1 {
        return Ok(xs.clone());
    }
    xs.reshape(vec![b, c / group, group, f, h, w])?.mean(2)
}

/// `repeat_interleave(repeats, dim=1)`: each channel repeated `repeats` times in place.
pub(crate) fn repeat_channels(xs: &Tensor, repeats: usize) -> Result<Tensor> {
    let (b, c, f, h, w) = xs.dims5()?;
    if repeats == 1 {
        return Ok(xs.clone());
    }
    xs.unsqueeze(2)?
        .broadcast_as(vec![b, c, repeats, f, h, w])?
        .reshape((b, c * repeats, f, h, w))
}

/// The first frame's result followed by the other frames' (either may be absent, not both).
fn join_frames(head: Option<Tensor>, rest: Option<Tensor>) -> Result<Tensor> {
    match (head, rest) {
        (Some(a), Some(b)) => Tensor::cat(&[&a, &b], 2),
        (Some(a), None) | (None, Some(a)) => Ok(a),
        (None, None) => candle_core::bail!("VAE resample: a chunk without frames"),
    }
}

/// `Downsample`: a conv to `out / factor` channels whose pixels (and frame pairs) are folded into channels, plus
/// the input folded the same way and averaged to `out` channels. With time halving, the clip's first frame is
/// folded alone (its conv channels doubled, its shortcut averaged over half the group).
pub(crate) struct Downsample {
    conv: CausalConv,
    temporal: bool,
    group: usize,
}

impl Downsample {
    pub(crate) fn new(vb: &Vb, c_in: usize, c_out: usize, temporal: bool) -> Result<Self> {
        let factor = if temporal { 8 } else { 4 };
        if c_out % factor != 0 || (factor * c_in) % c_out != 0 {
            candle_core::bail!("VAE downsample: {c_in} → {c_out} channels do not fold by {factor}");
        }
        Ok(Self {
            conv: CausalConv::new(&vb.pp("conv"), c_in, c_out / factor)?,
            temporal,
            group: factor * c_in / c_out,
        })
    }

    pub(crate) fn forward(&self, xs: &Tensor, stream: &mut Stream) -> Result<Tensor> {
        let h = self.conv.forward(xs, stream)?;
        if !self.temporal {
            let short = group_mean(&space_to_channels(xs, 1)?, self.group)?;
            return space_to_channels(&h, 1)? + short;
        }
        let (head, hs, xt) = if stream.first() {
            let hf = space_to_channels(&h.narrow(2, 0, 1)?, 1)?;
            let hf = Tensor::cat(&[&hf, &hf], 1)?;
            let xf = group_mean(&space_to_channels(&xs.narrow(2, 0, 1)?, 1)?, self.group / 2)?;
            let t = h.dim(2)? - 1;
            (Some((hf, xf)), h.narrow(2, 1, t)?, xs.narrow(2, 1, t)?)
        } else {
            (None, h, xs.clone())
        };
        let rest = if hs.dim(2)? == 0 {
            None
        } else {
            let short = group_mean(&space_to_channels(&xt, 2)?, self.group)?;
            Some((space_to_channels(&hs, 2)? + short)?)
        };
        join_frames(head.map(|(hf, xf)| hf + xf).transpose()?, rest)
    }
}

/// `Upsample`: a conv to `out · factor` channels unfolded into pixels (and frame pairs), plus the input unfolded
/// the same way with channels repeated to `out`. With time doubling, the clip's first frame unfolds alone (the first
/// half of its channels kept, its shortcut repeated half as often).
pub(crate) struct Upsample {
    conv: CausalConv,
    temporal: bool,
    repeats: usize,
}

impl Upsample {
    pub(crate) fn new(vb: &Vb, c_in: usize, c_out: usize, temporal: bool) -> Result<Self> {
        let factor = if temporal { 8 } else { 4 };
        if (factor * c_out) % c_in != 0 || c_in % factor != 0 {
            candle_core::bail!("VAE upsample: {c_in} → {c_out} channels do not unfold by {factor}");
        }
        Ok(Self {
            conv: CausalConv::new(&vb.pp("conv"), c_in, c_out * factor)?,
            temporal,
            repeats: factor * c_out / c_in,
        })
    }

    pub(crate) fn forward(&self, xs: &Tensor, stream: &mut Stream) -> Result<Tensor> {
        let h = self.conv.forward(xs, stream)?;
        if !self.temporal {
            let short = channels_to_space(&repeat_channels(xs, self.repeats)?, 1)?;
            return channels_to_space(&h, 1)? + short;
        }
        let (head, hs, xt) = if stream.first() {
            let hf = channels_to_space(&h.narrow(2, 0, 1)?, 1)?;
            let hf = hf.narrow(1, 0, hf.dim(1)? / 2)?;
            let xf = repeat_channels(
                &channels_to_space(&xs.narrow(2, 0, 1)?, 1)?,
                self.repeats / 2,
            )?;
            let t = h.dim(2)? - 1;
            (Some((hf, xf)), h.narrow(2, 1, t)?, xs.narrow(2, 1, t)?)
        } else {
            (None, h, xs.clone())
        };
        let rest = if hs.dim(2)? == 0 {
            None
        } else {
            let short = repeat_channels(&channels_to_space(&xt, 2)?, self.repeats)?;
            Some((channels_to_space(&hs, 2)? + short)?)
        };
        join_frames(head.map(|(hf, xf)| hf + xf).transpose()?, rest)
    }
}
