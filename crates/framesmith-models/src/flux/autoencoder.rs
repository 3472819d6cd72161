//! The FLUX.1 autoencoder (`AutoEncoder` of the official `modules/autoencoder.py`, the `ae.safetensors` file):
//! a convolutional encoder to 2 × 16 channels at 1/8 the resolution (mean and log-variance; the mean is used,
//! as the official `load_ae` does), the decoder back to RGB, and the latent scale and shift factors.

pub mod layers;

use candle_core::{Result, Tensor};
use serde::Deserialize;

use framesmith_nn::vb::Vb;
use layers::{AttnBlock, Conv2d, Downsample, GroupNorm, ResnetBlock, Upsample};

/// Constructor arguments of the official `AutoEncoder` (`AutoEncoderParams`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct AutoEncoderConfig {
    pub resolution: usize,
    pub in_channels: usize,
    pub ch: usize,
    pub out_ch: usize,
    pub ch_mult: Vec<usize>,
    pub num_res_blocks: usize,
    pub z_channels: usize,
    pub scale_factor: f64,
    pub shift_factor: f64,
}

impl AutoEncoderConfig {
    /// The FLUX.1 autoencoder (`ae.safetensors`): 16 latent channels, 8× down-sampling.
    pub fn flux1() -> Self {
        Self {
            resolution: 256,
            in_channels: 3,
            ch: 128,
            out_ch: 3,
            ch_mult: vec![1, 2, 4, 4],
            num_res_blocks: 2,
            z_channels: 16,
            scale_factor: 0.3611,
            shift_factor: 0.1159,
        }
    }

    /// Reads the official `AutoEncoderParams` names from JSON.
    pub fn from_json(json: &str) -> serde_json::Result<Self> {
        serde_json::from_str(json)
    }

    /// The spatial down-sampling factor, 2^(levels − 1).
    pub fn downsample_factor(&self) -> usize {
        1 << self.ch_mult.len().saturating_sub(1)
    }
}

/// The mid blocks: `block_1`, `attn_1`, `block_2`.
#[derive(Clone)]
pub struct Mid {
    pub block_1: ResnetBlock,
    pub attn_1: AttnBlock,
    pub block_2: ResnetBlock,
}

impl Mid {
    fn new(channels: usize, vb: &Vb) -> Result<Self> {
        Ok(Self {
            block_1: ResnetBlock::new(channels, channels, &vb.pp("block_1"))?,
            attn_1: AttnBlock::new(channels, &vb.pp("attn_1"))?,
            block_2: ResnetBlock::new(channels, channels, &vb.pp("block_2"))?,
        })
    }

    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let h = self.block_1.forward(xs)?;
        self.block_2.forward(&self.attn_1.forward(&h)?)
    }
}

/// One resolution level: `block.N` (and `downsample` or `upsample` except at the last / first level).
#[derive(Clone)]
pub struct Level<S> {
    pub block: Vec<ResnetBlock>,
    pub resample: Option<S>,
}

/// `encoder`.
#[derive(Clone)]
pub struct Encoder {
    pub conv_in: Conv2d,
    pub down: Vec<Level<Downsample>>,
    pub mid: Mid,
    pub norm_out: GroupNorm,
    pub conv_out: Conv2d,
}

impl Encoder {
    pub fn new(cfg: &AutoEncoderConfig, vb: &Vb) -> Result<Self> {
        let levels = cfg.ch_mult.len();
        let mut down = Vec::with_capacity(levels);
        let mut block_in = cfg.ch;
        for (i, &mult) in cfg.ch_mult.iter().enumerate() {
            let vb = vb.pp("down").pp(i);
            let block_out = cfg.ch * mult;
            let mut block = Vec::with_capacity(cfg.num_res_blocks);
            for j in 0..cfg.num_res_blocks {
                block.push(ResnetBlock::new(
                    block_in,
                    block_out,
                    &vb.pp("block").pp(j),
                )?);
                block_in = block_out;
            }
            let resample = if i + 1 != levels {
                Some(Downsample::new(block_in, &vb.pp("downsample"))?)
            } else {
                None
            };
            down.push(Level { block, resample });
        }
        Ok(Self {
            conv_in: Conv2d::new(&vb.pp("conv_in"), [cfg.in_channels, cfg.ch, 3], 1, 1)?,
            down,
            mid: Mid::new(block_in, &vb.pp("mid"))?,
            norm_out: GroupNorm::new(block_in, &vb.pp("norm_out"))?,
            conv_out: Conv2d::new(&vb.pp("conv_out"), [block_in, 2 * cfg.z_channels, 3], 1, 1)?,
        })
    }

    /// Image [b, in_channels, H, W] → moments [b, 2·z_channels, H/f, W/f] (mean, then log-variance).
    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let mut h = self.conv_in.forward(xs)?;
        for level in &self.down {
            for block in &level.block {
                h = block.forward(&h)?;
            }
            if let Some(down) = &level.resample {
                h = down.forward(&h)?;
            }
        }
        let h = self.mid.forward(&h)?;
        self.conv_out.forward(&self.norm_out.forward(&h)?.silu()?)
    }
}

/// `decoder`.
#[derive(Clone)]
pub struct Decoder {
    pub conv_in: Conv2d,
    pub mid: Mid,
    /// `up.0` (full resolution) … `up.{levels-1}`; run from the last to the first.
    pub up: Vec<Level<Upsample>>,
    pub norm_out: GroupNorm,
    pub conv_out: Conv2d,
}

impl Decoder {
    pub fn new(cfg: &AutoEncoderConfig, vb: &Vb) -> Result<Self> {
        let levels = cfg.ch_mult.len();
        let mut block_in = cfg.ch * cfg.ch_mult.last().copied().unwrap_or(1);
        let conv_in = Conv2d::new(&vb.pp("conv_in"), [cfg.z_channels, block_in, 3], 1, 1)?;
        let mid = Mid::new(block_in, &vb.pp("mid"))?;
        let mut up = Vec::with_capacity(levels);
        for i in (0..levels).rev() {
            let vb = vb.pp("up").pp(i);
            let block_out = cfg.ch * cfg.ch_mult[i];
            let mut block = Vec::with_capacity(cfg.num_res_blocks + 1);
            for j in 0..=cfg.num_res_blocks {
                block.push(ResnetBlock::new(
                    block_in,
                    block_out,
                    &vb.pp("block").pp(j),
                )?);
                block_in = block_out;
            }
            let resample = if i != 0 {
                Some(Upsample::new(block_in, &vb.pp("upsample"))?)
            } else {
                None
            };
            up.push(Level { block, resample });
        }
        up.reverse();
        Ok(Self {
            conv_in,
            mid,
            up,
            norm_out: GroupNorm::new(block_in, &vb.pp("norm_out"))?,
            conv_out: Conv2d::new(&vb.pp("conv_out"), [block_in, cfg.out_ch, 3], 1, 1)?,
        })
    }

    /// Latent [b, z_channels, h, w] (unscaled) → image [b, out_ch, h·f, w·f] (not clamped).
    pub fn forward(&self, z: &Tensor) -> Result<Tensor> {
        let mut h = self.mid.forward(&self.conv_in.forward(z)?)?;
        for level in self.up.iter().rev() {
            for block in &level.block {
                h = block.forward(&h)?;
            }
            if let Some(up) = &level.resample {
                h = up.forward(&h)?;
            }
        }
        self.conv_out.forward(&self.norm_out.forward(&h)?.silu()?)
    }
}

/// The autoencoder: `encoder`, `decoder`, scale and shift factors.
#[derive(Clone)]
pub struct AutoEncoder {
    pub encoder: Encoder,
    pub decoder: Decoder,
    cfg: AutoEncoderConfig,
}

impl AutoEncoder {
    /// Builds the autoencoder from official key names under `vb` (`encoder.*`, `decoder.*`).
    pub fn new(cfg: &AutoEncoderConfig, vb: &Vb) -> Result<Self> {
        Ok(Self {
            encoder: Encoder::new(cfg, &vb.pp("encoder"))?,
            decoder: Decoder::new(cfg, &vb.pp("decoder"))?,
            cfg: cfg.clone(),
        })
    }

    /// The tensors (official names, shapes) of an `ae.safetensors` of these sizes, in the order the model reads
    /// them.
    pub fn tensor_shapes(cfg: &AutoEncoderConfig) -> Result<Vec<(String, Vec<usize>)>> {
        let recorder = std::sync::Arc::new(framesmith_nn::vb::ShapeRecorder::default());
        let vb = Vb::from_source(
            recorder.clone(),
            candle_core::DType::F32,
            &candle_core::Device::Cpu,
        );
        Self::new(cfg, &vb)?;
        Ok(recorder.shapes())
    }

    /// The autoencoder's sizes.
    pub fn config(&self) -> &AutoEncoderConfig {
        &self.cfg
    }

    /// Image in [−1, 1], [b, 3, H, W] (H, W multiples of the down-sampling factor) → scaled latent
    /// `scale · (mean − shift)` [b, z_channels, H/f, W/f].
    pub fn encode(&self, xs: &Tensor) -> Result<Tensor> {
        let (_, _, h, w) = xs.dims4()?;
        let f = self.cfg.downsample_factor();
        if h % f != 0 || w % f != 0 {
            candle_core::bail!("FLUX autoencoder: image size {h}×{w} is not a multiple of {f}");
        }
        let moments = self.encoder.forward(xs)?;
        let mean = moments.narrow(1, 0, self.cfg.z_channels)?;
        (mean - self.cfg.shift_factor)? * self.cfg.scale_factor
    }

    /// Scaled latent → image (`z / scale + shift`, then the decoder; not clamped).
    pub fn decode(&self, z: &Tensor) -> Result<Tensor> {
        let z = ((z / self.cfg.scale_factor)? + self.cfg.shift_factor)?;
        self.decoder.forward(&z)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flux::testkit::{assert_close, Case};
    use candle_core::{DType, Device};

    #[test]
    fn matches_the_official_autoencoder() -> anyhow::Result<()> {
        let case = Case::load("flux_ae")?;
        let cfg = AutoEncoderConfig::from_json(&case.config["init"].to_string())?;
        let vb = Vb::from_tensors(case.weights.clone(), DType::F32, &Device::Cpu);
        let ae = AutoEncoder::new(&cfg, &vb)?;
        let x = case.input("x")?;
        let (atol, rtol) = (1e-4, 1e-4);
        assert_close(
            "moments",
            &ae.encoder.forward(x)?,
            case.expected("moments")?,
            atol,
            rtol,
        )?;
        let z = ae.encode(x)?;
        assert_close("z", &z, case.expected("z")?, atol, rtol)?;
        assert_close(
            "recon",
            &ae.decode(&z)?,
            case.expected("recon")?,
            atol,
            rtol,
        )?;
        let decoded = ae.decode(case.input("z_in")?)?;
        assert_close("decoded", &decoded, case.expected("decoded")?, atol, rtol)?;
        Ok(())
    }

    #[test]
    fn flux1_is_16_channels_at_one_eighth() {
        let cfg = AutoEncoderConfig::flux1();
        assert_eq!((cfg.z_channels, cfg.downsample_factor()), (16, 8));
    }
}
