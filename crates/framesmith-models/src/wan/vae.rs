//! The Wan video VAEs: Wan 2.1 (`wan/modules/vae.py`, 16 latent channels, 4×8×8 compression) and Wan 2.2
//! (`wan/modules/vae2_2.py`, 48 latent channels, 4×16×16 with a 2×2 patchify). Encode and decode follow the
//! official chunked causal processing: the first frame alone, then chunks of 4 frames, carrying a feature cache
//! between chunks; decoding goes one latent frame at a time. Latents are normalised per channel with
//! `(mu − mean) · inv_std`. Spatially tiled variants keep memory bounded for large frames. Qwen-Image's VAE is the
//! Wan 2.1 architecture on single frames: `crate::qwen_image::vae` builds it through [`vae_from_tensors`] and
//! [`WanVae`] with its own normalisation.

mod infer;
pub(crate) mod layers;
mod tiled;
mod wan21;
mod wan22;
mod weights;

use candle_core::{Device, Result, Tensor};

use framesmith_nn::vb::Vb;
use layers::{CausalConv3d, FeatCache};

pub use infer::{load_vae_auto, vae_config_from_tensors, vae_from_tensors};
pub use tiled::TileConfig;
pub use weights::{detect_vae_variant, load_vae};

/// Which official VAE architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VaeVariant {
    /// Wan 2.1 VAE (also used by Wan 2.2 A14B models).
    Wan21,
    /// Wan 2.2 VAE of the TI2V-5B model.
    Wan22,
}

/// Constructor arguments of the official `WanVAE_`.
#[derive(Debug, Clone, PartialEq)]
pub struct VaeConfig {
    /// Architecture.
    pub variant: VaeVariant,
    /// Encoder base width.
    pub dim: usize,
    /// Decoder base width (Wan 2.2 `dec_dim`; equal to `dim` for Wan 2.1).
    pub dec_dim: usize,
    /// Latent channels.
    pub z_dim: usize,
    /// Width multiplier per stage.
    pub dim_mult: Vec<usize>,
    /// Residual blocks per encoder stage (the decoder has one more).
    pub num_res_blocks: usize,
    /// Scales (1, 0.5, 0.25, ...) at which attention follows each residual block (Wan 2.1 only).
    pub attn_scales: Vec<f64>,
    /// Whether each encoder downsampling also halves time (the decoder mirrors it).
    pub temporal_downsample: Vec<bool>,
}

impl VaeConfig {
    /// The released Wan 2.1 VAE (`Wan2.1_VAE.pth`): dim 96, z 16.
    pub fn wan21() -> Self {
        Self {
            variant: VaeVariant::Wan21,
            dim: 96,
            dec_dim: 96,
            z_dim: 16,
            dim_mult: vec![1, 2, 4, 4],
            num_res_blocks: 2,
            attn_scales: Vec::new(),
            temporal_downsample: vec![false, true, true],
        }
    }

    /// The released Wan 2.2 VAE (`Wan2.2_VAE.pth`): dim 160, decoder dim 256, z 48.
    pub fn wan22() -> Self {
        Self {
            variant: VaeVariant::Wan22,
            dim: 160,
            dec_dim: 256,
            z_dim: 48,
            ..Self::wan21()
        }
    }

    /// Pixels per latent along height and width (8 for Wan 2.1, 16 for Wan 2.2).
    pub fn spatial_factor(&self) -> usize {
        let stages = 1usize << self.dim_mult.len().saturating_sub(1);
        match self.variant {
            VaeVariant::Wan21 => stages,
            VaeVariant::Wan22 => stages * wan22::PATCH,
        }
    }

    /// Frames per latent frame after the first (4 officially).
    pub fn temporal_factor(&self) -> usize {
        let n = self.dim_mult.len().saturating_sub(1);
        1usize
            << self
                .temporal_downsample
                .iter()
                .take(n)
                .filter(|&&t| t)
                .count()
    }

    /// Latent frames for `frames` video frames: `1 + (frames − 1) / temporal_factor` (trailing frames that do not
    /// fill a chunk are dropped, as officially).
    pub fn latent_frames(&self, frames: usize) -> usize {
        1 + frames.saturating_sub(1) / self.temporal_factor()
    }
}

/// Per-channel latent statistics: the official `scale = [mean, 1 / std]`.
#[derive(Debug, Clone)]
pub struct LatentStats {
    /// Channel means [z].
    pub mean: Tensor,
    /// Channel inverse standard deviations [z], `1.0 / std` computed in f32.
    pub inv_std: Tensor,
}

const WAN21_MEAN: [f32; 16] = [
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508, 0.4134, -0.0715, 0.5517,
    -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
];
const WAN21_STD: [f32; 16] = [
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743, 3.2687, 2.1526, 2.8652, 1.5579,
    1.6382, 1.1253, 2.8251, 1.9160,
];
const WAN22_MEAN: [f32; 48] = [
    -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557, -0.1382, 0.0542, 0.2813,
    0.0891, 0.1570, -0.0098, 0.0375, -0.1825, -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108,
    -0.2158, 0.2502, -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230, -0.0313,
    -0.1649, 0.0117, 0.0723, -0.2839, -0.2083, -0.0520, 0.3748, 0.0152, 0.1957, 0.1433, -0.2944,
    0.3573, -0.0548, -0.1681, -0.0667,
];
const WAN22_STD: [f32; 48] = [
    0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013, 0.8158, 1.0344, 0.5894, 1.0901,
    0.6885, 0.6165, 0.8454, 0.4978, 0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
    0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093, 0.5709, 0.6065, 0.6415, 0.4944,
    0.5726, 1.2042, 0.5458, 1.6887, 0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744,
];

impl LatentStats {
    /// The official constants of the wrapper for `variant` (`WanVAE` / `Wan2_2_VAE`).
    pub fn official(variant: VaeVariant, device: &Device) -> Result<Self> {
        let (mean, std): (&[f32], &[f32]) = match variant {
            VaeVariant::Wan21 => (&WAN21_MEAN, &WAN21_STD),
            VaeVariant::Wan22 => (&WAN22_MEAN, &WAN22_STD),
        };
        let inv: Vec<f32> = std.iter().map(|s| 1.0 / s).collect();
        Ok(Self {
            mean: Tensor::new(mean, device)?,
            inv_std: Tensor::new(inv.as_slice(), device)?,
        })
    }

    /// Identity statistics (mean 0, inv_std 1): raw latents.
    pub fn identity(z_dim: usize, device: &Device) -> Result<Self> {
        Ok(Self {
            mean: Tensor::zeros(z_dim, candle_core::DType::F32, device)?,
            inv_std: Tensor::ones(z_dim, candle_core::DType::F32, device)?,
        })
    }

    fn channel(t: &Tensor, like: &Tensor) -> Result<Tensor> {
        t.to_device(like.device())?
            .to_dtype(like.dtype())?
            .reshape((1, (), 1, 1, 1))
    }

    /// `(mu − mean) · inv_std`.
    pub fn normalize(&self, mu: &Tensor) -> Result<Tensor> {
        mu.broadcast_sub(&Self::channel(&self.mean, mu)?)?
            .broadcast_mul(&Self::channel(&self.inv_std, mu)?)
    }

    /// `z / inv_std + mean` (division, as officially).
    pub fn denormalize(&self, z: &Tensor) -> Result<Tensor> {
        z.broadcast_div(&Self::channel(&self.inv_std, z)?)?
            .broadcast_add(&Self::channel(&self.mean, z)?)
    }
}

enum Encoder {
    Wan21(wan21::Encoder),
    Wan22(wan22::Encoder),
}

enum Decoder {
    Wan21(wan21::Decoder),
    Wan22(wan22::Decoder),
}

/// A Wan VAE (frozen; inference only). Keys as the official state dict: `encoder.*`, `conv1`, `conv2`,
/// `decoder.*`.
pub struct WanVae {
    cfg: VaeConfig,
    encoder: Encoder,
    conv1: CausalConv3d,
    conv2: CausalConv3d,
    decoder: Decoder,
}

impl WanVae {
    /// Builds the VAE from official key names under `vb`.
    pub fn new(cfg: &VaeConfig, vb: &Vb) -> Result<Self> {
        if cfg.dim_mult.len() < 2 {
            candle_core::bail!("VAE config: dim_mult needs at least two stages");
        }
        let (encoder, decoder) = match cfg.variant {
            VaeVariant::Wan21 => (
                Encoder::Wan21(wan21::Encoder::new(cfg, &vb.pp("encoder"))?),
                Decoder::Wan21(wan21::Decoder::new(cfg, &vb.pp("decoder"))?),
            ),
            VaeVariant::Wan22 => (
                Encoder::Wan22(wan22::Encoder::new(cfg, &vb.pp("encoder"))?),
                Decoder::Wan22(wan22::Decoder::new(cfg, &vb.pp("decoder"))?),
            ),
        };
        let z2 = cfg.z_dim * 2;
        Ok(Self {
            cfg: cfg.clone(),
            encoder,
            conv1: CausalConv3d::cube(&vb.pp("conv1"), z2, z2, 1)?,
            conv2: CausalConv3d::cube(&vb.pp("conv2"), cfg.z_dim, cfg.z_dim, 1)?,
            decoder,
        })
    }

    /// The tensors (official names, shapes) of a checkpoint of this architecture, in the order the model reads
    /// them: the layout `Wan2.1_VAE.pth`, `Wan2.2_VAE.pth` and ComfyUI's `wan_2.1_vae.safetensors` /
    /// `wan2.2_vae.safetensors` share.
    pub fn tensor_shapes(cfg: &VaeConfig) -> Result<Vec<(String, Vec<usize>)>> {
        let recorder = std::sync::Arc::new(framesmith_nn::vb::ShapeRecorder::default());
        let vb = Vb::from_source(recorder.clone(), candle_core::DType::F32, &Device::Cpu);
        Self::new(cfg, &vb)?;
        Ok(recorder.shapes())
    }

    /// The architecture this VAE was built with.
    pub fn config(&self) -> &VaeConfig {
        &self.cfg
    }

    fn check_video(&self, video: &Tensor) -> Result<()> {
        let (_, c, t, h, w) = video.dims5()?;
        let f = self.cfg.spatial_factor();
        if c != 3 || t == 0 || h % f != 0 || w % f != 0 {
            candle_core::bail!(
                "VAE encode: video must be [b, 3, t ≥ 1, h, w] with h and w multiples of {f}, got {:?}",
                video.dims()
            );
        }
        Ok(())
    }

    /// The un-normalised posterior `(mu, log_var)` of `video` [b, 3, t, h, w] in [−1, 1]: chunked causal encode
    /// (frame 0, then frames 1–4, 5–8, ...) followed by `conv1`.
    pub fn encode_raw(&self, video: &Tensor) -> Result<(Tensor, Tensor)> {
        self.check_video(video)?;
        let xs = match self.encoder {
            Encoder::Wan21(_) => video.clone(),
            Encoder::Wan22(_) => wan22::patchify(video)?,
        };
        let t = xs.dim(2)?;
        let step = self.cfg.temporal_factor();
        let chunks = 1 + (t - 1) / step;
        let mut cache = FeatCache::new();
        let mut outs = Vec::with_capacity(chunks);
        for i in 0..chunks {
            cache.start_chunk();
            let chunk = if i == 0 {
                xs.narrow(2, 0, 1)?
            } else {
                xs.narrow(2, 1 + step * (i - 1), step)?
            };
            outs.push(match &self.encoder {
                Encoder::Wan21(e) => e.forward(&chunk, &mut cache)?,
                Encoder::Wan22(e) => e.forward(&chunk, &mut cache)?,
            });
        }
        let out = self.conv1.forward(&Tensor::cat(&outs, 2)?, None)?;
        let z = self.cfg.z_dim;
        Ok((out.narrow(1, 0, z)?, out.narrow(1, z, z)?))
    }

    /// The normalised latent mean `(mu − mean) · inv_std` of `video` (the official `encode(video, scale)`).
    pub fn encode(&self, video: &Tensor, stats: &LatentStats) -> Result<Tensor> {
        let (mu, _) = self.encode_raw(video)?;
        stats.normalize(&mu)
    }

    /// Video [b, 3, t, h, w] from un-normalised latents `z` [b, z_dim, f, h', w'], one latent frame at a time.
    /// Not clamped (the official wrapper clamps to [−1, 1] afterwards).
    pub fn decode_raw(&self, z: &Tensor) -> Result<Tensor> {
        let (_, c, frames, _, _) = z.dims5()?;
        if c != self.cfg.z_dim || frames == 0 {
            candle_core::bail!(
                "VAE decode: latents must be [b, {}, f ≥ 1, h, w], got {:?}",
                self.cfg.z_dim,
                z.dims()
            );
        }
        let xs = self.conv2.forward(z, None)?;
        let mut cache = FeatCache::new();
        let mut outs = Vec::with_capacity(frames);
        for i in 0..frames {
            cache.start_chunk();
            let frame = xs.narrow(2, i, 1)?;
            outs.push(match &self.decoder {
                Decoder::Wan21(d) => d.forward(&frame, &mut cache)?,
                Decoder::Wan22(d) => d.forward(&frame, &mut cache, i == 0)?,
            });
        }
        let out = Tensor::cat(&outs, 2)?;
        match self.decoder {
            Decoder::Wan21(_) => Ok(out),
            Decoder::Wan22(_) => wan22::unpatchify(&out),
        }
    }

    /// The official `decode(z, scale)`: un-normalise with `stats`, then [`WanVae::decode_raw`].
    pub fn decode(&self, z: &Tensor, stats: &LatentStats) -> Result<Tensor> {
        self.decode_raw(&stats.denormalize(z)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use framesmith_nn::init::randn;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn named_configs_have_the_official_factors() {
        let a = VaeConfig::wan21();
        assert_eq!(
            (a.spatial_factor(), a.temporal_factor(), a.z_dim),
            (8, 4, 16)
        );
        let b = VaeConfig::wan22();
        assert_eq!(
            (
                b.spatial_factor(),
                b.temporal_factor(),
                b.z_dim,
                b.dim,
                b.dec_dim
            ),
            (16, 4, 48, 160, 256)
        );
        assert_eq!(a.latent_frames(81), 21);
        assert_eq!(a.latent_frames(1), 1);
    }

    #[test]
    fn patchify_round_trips_and_matches_the_einops_layout() -> Result<()> {
        let dev = Device::Cpu;
        let xs = Tensor::arange(0f32, 3.0 * 2.0 * 4.0 * 6.0, &dev)?.reshape((1, 3, 2, 4, 6))?;
        let p = wan22::patchify(&xs)?;
        assert_eq!(p.dims(), &[1, 12, 2, 2, 3]);
        // Channel c·4 + r·2 + q holds pixel (2h + q, 2w + r) of channel c.
        let v = |t: &Tensor, idx: [usize; 5]| -> Result<f32> {
            t.get(idx[0])?
                .get(idx[1])?
                .get(idx[2])?
                .get(idx[3])?
                .get(idx[4])?
                .to_scalar::<f32>()
        };
        let (c, r, q, f, h, w) = (1, 1, 0, 1, 1, 2);
        assert_eq!(
            v(&p, [0, c * 4 + r * 2 + q, f, h, w])?,
            v(&xs, [0, c, f, 2 * h + q, 2 * w + r])?
        );
        let back = wan22::unpatchify(&p)?;
        assert_eq!(
            back.flatten_all()?.to_vec1::<f32>()?,
            xs.flatten_all()?.to_vec1::<f32>()?
        );
        Ok(())
    }

    #[test]
    fn latent_stats_round_trip() -> Result<()> {
        let dev = Device::Cpu;
        let rng = &mut StdRng::seed_from_u64(47);
        let stats = LatentStats::official(VaeVariant::Wan21, &dev)?;
        let mu = randn(rng, (1, 16, 2, 3, 3), 0.0, 1.0, &dev)?;
        let back = stats.denormalize(&stats.normalize(&mu)?)?;
        let err = (back - &mu)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(err < 1e-5, "round trip error {err}");
        Ok(())
    }
}
