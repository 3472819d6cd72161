//! Encoder and decoder of the Wan 2.2 VAE (`wan/modules/vae2_2.py`): 2×2 pixel patchify to 12 channels, stages
//! of residual blocks whose resampling is bypassed by a parameter-free shortcut (channel-averaging space/time
//! to depth on the way down, duplicating depth to space/time on the way up), a middle block with attention, and a
//! head back to 12 channels that are unpatchified.

use candle_core::{Result, Tensor};

use super::layers::{CausalConv3d, FeatCache, Resample, ResampleMode, ResidualBlock};
use super::wan21::{Head, Middle};
use super::VaeConfig;
use framesmith_nn::vb::Vb;

/// Pixel patch size of the Wan 2.2 VAE.
pub(super) const PATCH: usize = 2;

/// `patchify(x, 2)`: [b, c, f, h·q, w·r] → [b, c·r·q, f, h, w] (channel index `c·4 + r·2 + q`).
pub(super) fn patchify(xs: &Tensor) -> Result<Tensor> {
    let (b, c, f, hp, wp) = xs.dims5()?;
    let (h, w) = (hp / PATCH, wp / PATCH);
    xs.reshape(vec![b, c, f, h, PATCH, w, PATCH])?
        .permute(vec![0, 1, 6, 4, 2, 3, 5])?
        .reshape((b, c * PATCH * PATCH, f, h, w))
}

/// `unpatchify(x, 2)`, the inverse of [`patchify`].
pub(super) fn unpatchify(xs: &Tensor) -> Result<Tensor> {
    let (b, cp, f, h, w) = xs.dims5()?;
    let c = cp / (PATCH * PATCH);
    xs.reshape(vec![b, c, PATCH, PATCH, f, h, w])?
        .permute(vec![0, 1, 4, 5, 3, 6, 2])?
        .reshape((b, c, f, h * PATCH, w * PATCH))
}

/// `AvgDown3D`: folds `ft × fs × fs` neighbourhoods into channels and averages groups of channels down to
/// `c_out` (front zero padding in time to a multiple of `ft`).
struct AvgDown {
    c_out: usize,
    ft: usize,
    fs: usize,
}

impl AvgDown {
    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let t_in = xs.dim(2)?;
        let pad_t = (self.ft - t_in % self.ft) % self.ft;
        let xs = xs.pad_with_zeros(2, pad_t, 0)?;
        let (b, c, t, h, w) = xs.dims5()?;
        let (to, ho, wo) = (t / self.ft, h / self.fs, w / self.fs);
        let factor = self.ft * self.fs * self.fs;
        let group = c * factor / self.c_out;
        xs.reshape(vec![b, c, to, self.ft, ho, self.fs, wo, self.fs])?
            .permute(vec![0, 1, 3, 5, 7, 2, 4, 6])?
            .reshape(vec![b, self.c_out, group, to, ho, wo])?
            .mean(2)
    }
}

/// `DupUp3D`: repeats channels and unfolds them into `ft × fs × fs` neighbourhoods; on the first chunk the
/// leading `ft − 1` frames are dropped (the first frame is not upsampled in time).
struct DupUp {
    c_in: usize,
    c_out: usize,
    ft: usize,
    fs: usize,
}

impl DupUp {
    fn forward(&self, xs: &Tensor, first_chunk: bool) -> Result<Tensor> {
        let (b, c, t, h, w) = xs.dims5()?;
        let repeats = self.c_out * self.ft * self.fs * self.fs / self.c_in;
        // repeat_interleave over channels: channel i·repeats + r is input channel i.
        let xs = xs
            .unsqueeze(2)?
            .broadcast_as(vec![b, c, repeats, t, h, w])?
            .contiguous()?;
        let xs = xs
            .reshape(vec![b, self.c_out, self.ft, self.fs, self.fs, t, h, w])?
            .permute(vec![0, 1, 5, 2, 6, 3, 7, 4])?
            .reshape((b, self.c_out, t * self.ft, h * self.fs, w * self.fs))?;
        if first_chunk && self.ft > 1 {
            xs.narrow(2, self.ft - 1, t * self.ft - (self.ft - 1))
        } else {
            Ok(xs)
        }
    }
}

/// `Down_ResidualBlock`: residual blocks then an optional downsampler, plus the [`AvgDown`] shortcut.
struct DownStage {
    blocks: Vec<ResidualBlock>,
    resample: Option<Resample>,
    shortcut: AvgDown,
}

impl DownStage {
    fn forward(&self, xs: &Tensor, cache: &mut FeatCache) -> Result<Tensor> {
        let mut ys = xs.clone();
        for block in &self.blocks {
            ys = block.forward(&ys, cache)?;
        }
        if let Some(r) = &self.resample {
            ys = r.forward(&ys, cache)?;
        }
        ys + self.shortcut.forward(xs)?
    }
}

/// `Up_ResidualBlock`: residual blocks then an optional upsampler, plus the [`DupUp`] shortcut when upsampling.
struct UpStage {
    blocks: Vec<ResidualBlock>,
    resample: Option<Resample>,
    shortcut: Option<DupUp>,
}

impl UpStage {
    fn forward(&self, xs: &Tensor, cache: &mut FeatCache, first_chunk: bool) -> Result<Tensor> {
        let mut ys = xs.clone();
        for block in &self.blocks {
            ys = block.forward(&ys, cache)?;
        }
        if let Some(r) = &self.resample {
            ys = r.forward(&ys, cache)?;
        }
        match &self.shortcut {
            Some(s) => ys + s.forward(xs, first_chunk)?,
            None => Ok(ys),
        }
    }
}

/// Wan 2.2 encoder on patchified frames (12 channels) producing `2·z_dim` channels.
pub(super) struct Encoder {
    conv1: CausalConv3d,
    stages: Vec<DownStage>,
    middle: Middle,
    head: Head,
}

impl Encoder {
    pub(super) fn new(cfg: &VaeConfig, vb: &Vb) -> Result<Self> {
        let dims: Vec<usize> = std::iter::once(1)
            .chain(cfg.dim_mult.iter().copied())
            .map(|u| cfg.dim * u)
            .collect();
        let n = cfg.dim_mult.len();
        let mut stages = Vec::new();
        for (i, pair) in dims.windows(2).enumerate() {
            let (c_in, c_out) = (pair[0], pair[1]);
            let svb = vb.pp("downsamples").pp(i).pp("downsamples");
            let temporal = cfg.temporal_downsample.get(i).copied().unwrap_or(false);
            let down = i != n - 1;
            let mut blocks = Vec::new();
            for j in 0..cfg.num_res_blocks {
                let width_in = if j == 0 { c_in } else { c_out };
                blocks.push(ResidualBlock::new(&svb.pp(j), width_in, c_out)?);
            }
            let resample = if down {
                let mode = if temporal {
                    ResampleMode::Downsample3d
                } else {
                    ResampleMode::Downsample2d
                };
                Some(Resample::new(
                    &svb.pp(cfg.num_res_blocks),
                    c_out,
                    mode,
                    c_out,
                )?)
            } else {
                None
            };
            let shortcut = AvgDown {
                c_out,
                ft: if temporal { 2 } else { 1 },
                fs: if down { 2 } else { 1 },
            };
            stages.push(DownStage {
                blocks,
                resample,
                shortcut,
            });
        }
        let out = dims[dims.len() - 1];
        Ok(Self {
            conv1: CausalConv3d::cube(&vb.pp("conv1"), 3 * PATCH * PATCH, dims[0], 3)?,
            stages,
            middle: Middle::new(&vb.pp("middle"), out)?,
            head: Head::new(&vb.pp("head"), out, cfg.z_dim * 2)?,
        })
    }

    /// One chunk of patchified frames through the encoder, updating `cache`.
    pub(super) fn forward(&self, xs: &Tensor, cache: &mut FeatCache) -> Result<Tensor> {
        let mut xs = self.conv1.forward_cached(xs, cache)?;
        for stage in &self.stages {
            xs = stage.forward(&xs, cache)?;
        }
        let xs = self.middle.forward(&xs, cache)?;
        self.head.forward(&xs, cache)
    }
}

/// Wan 2.2 decoder from `z_dim` channels to 12 patchified channels.
pub(super) struct Decoder {
    conv1: CausalConv3d,
    middle: Middle,
    stages: Vec<UpStage>,
    head: Head,
}

impl Decoder {
    pub(super) fn new(cfg: &VaeConfig, vb: &Vb) -> Result<Self> {
        let n = cfg.dim_mult.len();
        let mults = std::iter::once(cfg.dim_mult[n - 1]).chain(cfg.dim_mult.iter().rev().copied());
        let dims: Vec<usize> = mults.map(|u| cfg.dec_dim * u).collect();
        let temporal_upsample: Vec<bool> = cfg.temporal_downsample.iter().rev().copied().collect();
        let mut stages = Vec::new();
        for (i, pair) in dims.windows(2).enumerate() {
            let (c_in, c_out) = (pair[0], pair[1]);
            let svb = vb.pp("upsamples").pp(i).pp("upsamples");
            let temporal = temporal_upsample.get(i).copied().unwrap_or(false);
            let up = i != n - 1;
            let mut blocks = Vec::new();
            for j in 0..cfg.num_res_blocks + 1 {
                let width_in = if j == 0 { c_in } else { c_out };
                blocks.push(ResidualBlock::new(&svb.pp(j), width_in, c_out)?);
            }
            let (resample, shortcut) = if up {
                let mode = if temporal {
                    ResampleMode::Upsample3d
                } else {
                    ResampleMode::Upsample2d
                };
                let r = Resample::new(&svb.pp(cfg.num_res_blocks + 1), c_out, mode, c_out)?;
                let ft = if temporal { 2 } else { 1 };
                (
                    Some(r),
                    Some(DupUp {
                        c_in,
                        c_out,
                        ft,
                        fs: 2,
                    }),
                )
            } else {
                (None, None)
            };
            stages.push(UpStage {
                blocks,
                resample,
                shortcut,
            });
        }
        let out = dims[dims.len() - 1];
        Ok(Self {
            conv1: CausalConv3d::cube(&vb.pp("conv1"), cfg.z_dim, dims[0], 3)?,
            middle: Middle::new(&vb.pp("middle"), dims[0])?,
            stages,
            head: Head::new(&vb.pp("head"), out, 3 * PATCH * PATCH)?,
        })
    }

    /// One latent frame through the decoder, updating `cache`; `first_chunk` for the first latent frame.
    pub(super) fn forward(
        &self,
        xs: &Tensor,
        cache: &mut FeatCache,
        first_chunk: bool,
    ) -> Result<Tensor> {
        let xs = self.conv1.forward_cached(xs, cache)?;
        let mut xs = self.middle.forward(&xs, cache)?;
        for stage in &self.stages {
            xs = stage.forward(&xs, cache, first_chunk)?;
        }
        self.head.forward(&xs, cache)
    }
}
