//! `framesmith-bench synth-project --model hunyuan-video15`: a HunyuanVideo 1.5 text-to-video training project of
//! the released size (8.3B) with nothing to download — random DiT weights under the official release's names in
//! one bf16 file, one cached clip in musubi-tuner's `_hv15` format (random latents of the VAE's shape: 32 channels,
//! 16× spatial and 4× temporal compression; a random Qwen2.5-VL output and an empty byT5 output, as a caption
//! that quotes nothing gives; for I2V also the first frame's condition latents and mask and 729 random SigLIP
//! features, as `hv_1_5_cache_latents.py --i2v` caches them), its dataset TOML and a run config that trains from
//! the caches alone. For memory
//! and speed trials of the real trainer on a GPU machine, and the weights for the PyTorch reference
//! (`bench/reference/hunyuan_video15_step.py`).

use std::path::{Path, PathBuf};

use anyhow::bail;
use candle_core::{DType, Device};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::synth::cached::{
    clip_cache_dir, clip_dataset_toml, write_cached_project, CachedProject, CachedProjectFiles,
    ClipVae,
};
use crate::synth::tensors::{mix, write_random_weights, RandomWeight};
use framesmith_config::run::TimestepSampling;
use framesmith_data::family::hunyuan_video15::cache::{
    hv15_latent_cache_name, hv15_text_cache_name, write_hv15_latent_cache, write_hv15_text_cache,
    Hv15LatentCache, Hv15TextCache,
};
use framesmith_data::frames::FrameWindow;
use framesmith_models::hunyuan_video15::weights::official_shapes;
use framesmith_models::hunyuan_video15::HunyuanVideo15Config;
use framesmith_nn::init::randn;

/// The DiT's file name.
pub const DIT_FILE: &str = "hunyuanvideo1.5_t2v_official_bf16.safetensors";
/// Stem of the one cached clip.
const ITEM_STEM: &str = "synth_000";
/// The clip's caption (its text features are random all the same).
const CAPTION: &str = "a synthetic clip: random latents and random text features";
/// The VAE's spatial and temporal compression.
const VAE: ClipVae = ClipVae {
    family: "HunyuanVideo 1.5",
    spatial: 16,
    temporal: 4,
};
/// The dataset config's comment.
const DATASET_HEADER: &str =
    "framesmith-bench synth-project --model hunyuan-video15: one cached clip of random \
     latents and random\ntext features; videos/ is empty: training reads the caches \
     (no VAE, no text encoders).";

/// What to write.
#[derive(Debug, Clone)]
pub struct Hv15SynthProject {
    pub cfg: HunyuanVideo15Config,
    /// Clip size in pixels (multiples of 16) and frames (4k + 1).
    pub height: usize,
    pub width: usize,
    pub frames: usize,
    pub seed: u64,
    /// Tokens of the cached Qwen2.5-VL output.
    pub text_tokens: usize,
    /// Optimizer steps of the run config.
    pub steps: usize,
    /// LoRA rank (and alpha) of the run config.
    pub rank: usize,
    /// Cache the image-to-video conditioning too, and train image-to-video.
    pub i2v: bool,
}

/// SigLIP tokens of the I2V image features.
const SIGLIP_TOKENS: usize = 729;

/// The latents `[32, (F − 1)/4 + 1, H/16, W/16]` the VAE makes of the clip, or why the size does not fit.
pub fn hv15_latent_shape(spec: &Hv15SynthProject) -> anyhow::Result<[usize; 4]> {
    let clip = (spec.width, spec.height, spec.frames);
    let shape = VAE.latent_shape(spec.cfg.out_channels, clip)?;
    if spec.cfg.in_channels != 2 * spec.cfg.out_channels + 1 {
        bail!(
            "the DiT takes {} input channels; HunyuanVideo 1.5 takes 2 × {} + 1 (noisy, condition, mask)",
            spec.cfg.in_channels,
            spec.cfg.out_channels
        );
    }
    Ok(shape)
}

/// Writes the project into `dir` (created when missing): [`DIT_FILE`], `dataset.toml` with its cache folder,
/// `run.toml` (LoRA rank `spec.rank`, musubi-tuner's documented shift 2.0 timesteps, no samples, saving at the end
/// only, every block resident, bf16 base, on `cuda`).
pub fn write_hv15_project(
    dir: &Path,
    spec: &Hv15SynthProject,
) -> anyhow::Result<CachedProjectFiles> {
    let latent = hv15_latent_shape(spec)?;
    spec.cfg
        .validate()
        .map_err(|e| anyhow::anyhow!("the HunyuanVideo 1.5 sizes: {e}"))?;
    if spec.text_tokens == 0 || spec.text_tokens > 1000 {
        bail!(
            "the text encoder's output needs 1 to 1000 tokens, not {}",
            spec.text_tokens
        );
    }
    let project = CachedProject {
        dit_file: DIT_FILE,
        dataset_toml: clip_dataset_toml(DATASET_HEADER, (spec.width, spec.height, spec.frames)),
        steps_seed: (spec.steps, spec.seed),
        rank: spec.rank,
    };
    write_cached_project(
        dir,
        project,
        |dit| write_random_hv15_dit(dit, &spec.cfg, spec.seed),
        |dir| write_cached_clip(dir, spec, latent),
        |config| {
            config.training.timestep_sampling = TimestepSampling::Shift;
            config.training.discrete_flow_shift = 2.0;
            config.output.output_name = "synth-hunyuan-video15-lora".into();
            if spec.i2v {
                config.training.mode = framesmith_config::run::TrainingMode::ImageToVideo;
            }
        },
    )
}

/// Mean and standard deviation of a random official-layout HunyuanVideo 1.5 tensor: norm scales 1 ± 0.1, biases
/// 0 ± 0.05, the modulation linears 0 ± 0.1/√fan_in (small gates keep 54 residual updates in range), every other
/// weight 0 ± 1/√fan_in.
pub fn hv15_init_stats(name: &str, shape: &[usize]) -> (f32, f32) {
    let fan_in = shape
        .get(1..)
        .map_or(1, |s| s.iter().product::<usize>().max(1));
    let scaled = 1.0 / (fan_in as f32).sqrt();
    if name.contains("norm") && name.ends_with(".weight") && shape.len() == 1 {
        (1.0, 0.1)
    } else if name.ends_with(".bias") {
        (0.0, 0.05)
    } else if name.contains("_mod.") || name.contains("adaLN_modulation") {
        (0.0, 0.1 * scaled)
    } else {
        (0.0, scaled)
    }
}

/// Writes random bf16 weights of `cfg` under the official names to `path`, one tensor in memory at a time;
/// returns the file size.
pub fn write_random_hv15_dit(
    path: &Path,
    cfg: &HunyuanVideo15Config,
    seed: u64,
) -> anyhow::Result<u64> {
    let weights = official_shapes(cfg).into_iter().map(|(name, shape)| {
        let (mean, std) = hv15_init_stats(&name, &shape);
        RandomWeight {
            name,
            shape,
            mean,
            std,
            fp8_scale: None,
        }
    });
    write_random_weights(path, weights, safetensors::Dtype::BF16, None, seed)
}

/// The I2V condition channels of `latents` [C, F, H, W] as musubi-tuner caches them: the first frame's latents,
/// zeros, and the first-frame mask — [C + 1, F, H, W] in f32.
fn condition(latents: &candle_core::Tensor) -> anyhow::Result<candle_core::Tensor> {
    use candle_core::Tensor;
    let (c, f, h, w) = latents.dims4()?;
    let dev = latents.device();
    let zeros = |n: usize, frames: usize| Tensor::zeros((n, frames, h, w), DType::F32, dev);
    let cond = Tensor::cat(&[&latents.narrow(1, 0, 1)?, &zeros(c, f - 1)?], 1)?;
    let ones = Tensor::ones((1, 1, h, w), DType::F32, dev)?;
    let mask = Tensor::cat(&[&ones, &zeros(1, f - 1)?], 1)?;
    Ok(Tensor::cat(&[&cond, &mask], 0)?)
}

/// Writes the clip's latent and text caches (bf16; no glyph tokens) into `dir/cache`, and the empty `videos/`.
fn write_cached_clip(
    dir: &Path,
    spec: &Hv15SynthProject,
    latent: [usize; 4],
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let cache = clip_cache_dir(dir)?;
    let size = (spec.width as u32, spec.height as u32);
    let rng = &mut StdRng::seed_from_u64(mix(spec.seed, u64::MAX));
    let dev = &Device::Cpu;
    let latents = randn(rng, latent.as_slice(), 0.0, 1.0, dev)?;
    let (latents_image, siglip) = if spec.i2v {
        let features = randn(
            rng,
            (SIGLIP_TOKENS, spec.cfg.image_embed_dim),
            0.0,
            1.0,
            dev,
        )?;
        (
            Some(condition(&latents)?),
            Some(features.to_dtype(DType::F16)?),
        )
    } else {
        (None, None)
    };
    let cached = Hv15LatentCache {
        latents: latents.to_dtype(DType::BF16)?,
        latents_image,
        siglip,
    };
    let window = FrameWindow {
        start: 0,
        frames: spec.frames as u32,
    };
    let latent_path = cache.join(hv15_latent_cache_name(ITEM_STEM, Some(window), size));
    write_hv15_latent_cache(&latent_path, &cached, size, Some(spec.frames as u32))?;
    let bf16 = |t: candle_core::Tensor| t.to_dtype(DType::BF16);
    let text = Hv15TextCache {
        vl_embed: bf16(randn(
            rng,
            (spec.text_tokens, spec.cfg.text_embed_dim),
            0.0,
            1.0,
            dev,
        )?)?,
        byt5_embed: bf16(randn(rng, (0, spec.cfg.text_embed_2_dim), 0.0, 1.0, dev)?)?,
        caption: CAPTION.into(),
    };
    let text_path = cache.join(hv15_text_cache_name(ITEM_STEM));
    write_hv15_text_cache(&text_path, &text)?;
    Ok((latent_path, text_path))
}

#[cfg(test)]
#[allow(clippy::expect_used, clippy::unwrap_used)]
// test code: a failed expectation is the test failing
mod tests {
    use super::*;

    /// The project trains as written: the DiT is a HunyuanVideo 1.5 file of its sizes and the caches read back.
    #[test]
    fn a_tiny_project_is_a_hunyuan_video15_project() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let cfg = HunyuanVideo15Config {
            in_channels: 9,
            out_channels: 4,
            num_attention_heads: 2,
            attention_head_dim: 16,
            num_layers: 2,
            num_refiner_layers: 1,
            text_embed_dim: 24,
            text_embed_2_dim: 12,
            byt5_hidden_dim: 16,
            image_embed_dim: 8,
            rope_axes_dim: vec![4, 6, 6],
            ..HunyuanVideo15Config::hunyuan_video15()
        };
        let spec = Hv15SynthProject {
            cfg: cfg.clone(),
            height: 32,
            width: 48,
            frames: 9,
            seed: 3,
            text_tokens: 5,
            steps: 2,
            rank: 4,
            i2v: true,
        };
        let files = write_hv15_project(dir.path(), &spec)?;
        let dit = framesmith_models::hunyuan_video15::weights::identify(&files.dit)?;
        assert_eq!(dit.config, Some(cfg));
        let latents = framesmith_data::family::hunyuan_video15::cache::read_hv15_latent_cache(
            &files.latents,
            &Device::Cpu,
        )?;
        assert_eq!(latents.latents.dims(), &[4, 3, 2, 3]);
        let image = latents.latents_image.map(|t| t.dims().to_vec());
        assert_eq!(image, Some(vec![5, 3, 2, 3]));
        let siglip = latents.siglip.map(|t| t.dims().to_vec());
        assert_eq!(siglip, Some(vec![729, 8]));
        let text = framesmith_data::family::hunyuan_video15::cache::read_hv15_text_cache(
            &files.text,
            &Device::Cpu,
        )?;
        assert_eq!(
            (text.vl_embed.dims(), text.byt5_embed.dims()),
            (&[5, 24][..], &[0, 12][..])
        );
        let config = framesmith_config::RunConfig::load(&files.run)?;
        assert_eq!(config.training.discrete_flow_shift, 2.0);
        assert_eq!(
            config.training.mode,
            framesmith_config::run::TrainingMode::ImageToVideo
        );
        assert_eq!((config.lora.rank, config.training.max_train_steps), (4, 2));
        assert!(hv15_latent_shape(&Hv15SynthProject { frames: 8, ..spec }).is_err());
        Ok(())
    }
}
