//! `framesmith-bench synth-project --model flux-dev`: a FLUX.1 [dev] training project of a real size with nothing
//! to download — random DiT weights in the official `flux1-dev.safetensors` layout (bf16, or FP8 `float8_e4m3fn`
//! plain or ComfyUI `scaled_fp8`), one cached image in the FLUX.1 cache format (random AE-shaped latents, a random
//! T5-XXL output and CLIP-L pooled vector) with a grey stand-in image and caption, its image dataset TOML and a run
//! config that trains from the caches alone (no autoencoder, no text encoders). For memory and speed trials of the
//! real trainer on a GPU machine, and the same weights for the PyTorch reference (`bench/reference/flux_step.py`).

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use candle_core::{DType, Device};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::synth::cached::{write_cached_project, CachedProject, CachedProjectFiles};
use crate::synth::tensors::{mix, write_random_weights, RandomWeight, FP8_MAX};
use crate::synth::{base_run_config, image_dataset_toml, write_stand_in_image};
use framesmith_config::run::TimestepSampling;
use framesmith_config::RunConfig;
use framesmith_data::family::flux::cache::{
    flux_latent_cache_name, flux_text_cache_name, write_flux_text_cache, FluxTextCache, FLUX_CACHES,
};
use framesmith_models::flux::weights::official_shapes;
use framesmith_models::flux::FluxConfig;
use framesmith_nn::init::randn;

/// Stem of the one cached image.
const ITEM_STEM: &str = "synth_000";
/// The image's caption (its text features are random all the same).
const CAPTION: &str = "a synthetic image: random latents and random text features";
/// The FLUX.1 autoencoder's latent channels and down-sampling; the DiT packs 2×2 latent patches.
const LATENT_CHANNELS: usize = 16;
const AE_FACTOR: usize = 8;
const PACK: usize = 2;
/// The key prefix of ComfyUI's single files.
const COMFY_PREFIX: &str = "model.diffusion_model.";

/// What to write.
#[derive(Debug, Clone)]
pub struct FluxSynthProject {
    /// The DiT (dev: with the guidance embedding).
    pub cfg: FluxConfig,
    /// Image size in pixels (multiples of 16).
    pub height: usize,
    pub width: usize,
    /// How the DiT weights are stored on disk.
    pub dit: FluxDitFormat,
    pub seed: u64,
    /// Tokens of the T5 output (FLUX.1 [dev] pads captions to 512).
    pub text_tokens: usize,
    /// Optimizer steps of the run config.
    pub steps: usize,
    /// LoRA rank (and alpha) of the run config.
    pub rank: usize,
    /// FLUX.1 Kontext [dev]: the DiT named as Kontext's file and the image cached with one control image of its
    /// size (random latents under musubi-tuner's `latents_control_…` key), so the run trains an edit LoRA.
    pub kontext: bool,
}

impl FluxSynthProject {
    /// The DiT's file name in the project folder: the format's, `flux1-kontext-dev…` for Kontext (the name is
    /// what tells Kontext's weights from dev's).
    pub fn dit_file_name(&self) -> String {
        let name = self.dit.file_name();
        if self.kontext {
            name.replacen("flux1-dev", "flux1-kontext-dev", 1)
        } else {
            name.to_string()
        }
    }
}

/// How [`write_random_flux_dit`] stores the weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FluxDitFormat {
    /// Every tensor in one float dtype (f32, f16 or bf16) under the official names, as `flux1-dev.safetensors`.
    Dense(DType),
    /// The blocks' linear weights as `float8_e4m3fn` without scales, everything else bf16, official names (the
    /// layout of the community `flux1-dev-fp8` files).
    Fp8,
    /// A ComfyUI `scaled_fp8` single file: keys under `model.diffusion_model.`, the blocks' linear weights as
    /// `float8_e4m3fn` with a per-tensor f32 `scale_weight`, the rest bf16, and the `scaled_fp8` marker.
    ComfyScaledFp8,
}

impl FluxDitFormat {
    /// Parses `bf16`, `f16`, `f32`, `fp8` or `fp8-scaled`.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        Ok(match text {
            "bf16" => Self::Dense(DType::BF16),
            "f16" => Self::Dense(DType::F16),
            "f32" => Self::Dense(DType::F32),
            "fp8" => Self::Fp8,
            "fp8-scaled" => Self::ComfyScaledFp8,
            other => bail!("unknown FLUX.1 DiT format `{other}` (bf16, f16, f32, fp8, fp8-scaled)"),
        })
    }

    /// The DiT's file name in the project folder, as people name these files.
    pub fn file_name(self) -> &'static str {
        match self {
            Self::Dense(_) => "flux1-dev.safetensors",
            Self::Fp8 => "flux1-dev-fp8-e4m3fn.safetensors",
            Self::ComfyScaledFp8 => "flux1-dev-fp8-scaled.safetensors",
        }
    }
}

/// The latents `[16, 1, H/8, W/8]` the FLUX.1 autoencoder makes of the image, or why the size does not fit (both
/// sides must be multiples of 16: 8× down-sampling, then 2×2 packing).
pub fn flux_latent_shape(spec: &FluxSynthProject) -> anyhow::Result<[usize; 4]> {
    let step = AE_FACTOR * PACK;
    if spec.height == 0 || spec.width == 0 || spec.height % step != 0 || spec.width % step != 0 {
        bail!(
            "{}x{} (width x height): FLUX.1 needs both sides to be positive multiples of {step}",
            spec.width,
            spec.height
        );
    }
    if spec.cfg.in_channels != LATENT_CHANNELS * PACK * PACK {
        bail!(
            "the DiT takes {} input channels; text-to-image FLUX.1 takes {} (16 latent channels × 2 × 2)",
            spec.cfg.in_channels,
            LATENT_CHANNELS * PACK * PACK
        );
    }
    Ok([
        LATENT_CHANNELS,
        1,
        spec.height / AE_FACTOR,
        spec.width / AE_FACTOR,
    ])
}

/// Writes the project into `dir` (created when missing): the DiT ([`FluxDitFormat::file_name`]), `dataset.toml`
/// with its cache folder and stand-in image, and `run.toml` (LoRA rank `spec.rank`, `flux_shift` timesteps, no
/// samples, saving at the end only, every block resident, on `cuda`; an FP8 file trains with an FP8 base).
pub fn write_flux_project(
    dir: &Path,
    spec: &FluxSynthProject,
) -> anyhow::Result<CachedProjectFiles> {
    let latent = flux_latent_shape(spec)?;
    spec.cfg
        .validate()
        .map_err(|e| anyhow::anyhow!("the FLUX.1 sizes: {e}"))?;
    if spec.text_tokens == 0 || spec.text_tokens > 512 {
        bail!(
            "the T5 output needs 1 to 512 tokens, not {}",
            spec.text_tokens
        );
    }
    let dit_file = spec.dit_file_name();
    let project = CachedProject {
        dit_file: &dit_file,
        dataset_toml: dataset_toml(spec),
        steps_seed: (spec.steps, spec.seed),
        rank: spec.rank,
    };
    write_cached_project(
        dir,
        project,
        |dit| write_random_flux_dit(dit, &spec.cfg, spec.dit, spec.seed),
        |dir| write_cached_image(dir, spec, latent),
        |config| tune_flux_run_config(config, spec),
    )
}

/// Mean and standard deviation of a random official-layout FLUX.1 tensor: the q/k RMSNorm scales 1 ± 0.1,
/// biases 0 ± 0.05, the modulation linears 0 ± 0.1/√fan_in (small gates keep 57 residual updates in range),
/// every other weight 0 ± 1/√fan_in.
pub fn flux_init_stats(name: &str, shape: &[usize]) -> (f32, f32) {
    let fan_in = shape
        .get(1..)
        .map_or(1, |s| s.iter().product::<usize>().max(1));
    let scaled = 1.0 / (fan_in as f32).sqrt();
    if name.ends_with(".scale") {
        (1.0, 0.1)
    } else if name.ends_with(".bias") {
        (0.0, 0.05)
    } else if name.contains("mod.lin.") || name.contains("modulation.") {
        (0.0, 0.1 * scaled)
    } else {
        (0.0, scaled)
    }
}

/// Writes random weights of `cfg` in `format`'s layout to `path`, drawn with [`flux_init_stats`]; one tensor is in
/// memory at a time. Returns the file size.
pub fn write_random_flux_dit(
    path: &Path,
    cfg: &FluxConfig,
    format: FluxDitFormat,
    seed: u64,
) -> anyhow::Result<u64> {
    let dense = match format {
        FluxDitFormat::Dense(DType::F32) => safetensors::Dtype::F32,
        FluxDitFormat::Dense(DType::F16) => safetensors::Dtype::F16,
        FluxDitFormat::Dense(DType::BF16) | FluxDitFormat::Fp8 | FluxDitFormat::ComfyScaledFp8 => {
            safetensors::Dtype::BF16
        }
        FluxDitFormat::Dense(other) => {
            bail!("random DiT weights are written as f32, f16 or bf16, not {other:?}")
        }
    };
    let comfy = format == FluxDitFormat::ComfyScaledFp8;
    let weights = official_shapes(cfg).into_iter().map(|(name, shape)| {
        let (mean, std) = flux_init_stats(&name, &shape);
        // FP8 files keep the blocks' linear weights in FP8; embeddings, head, norms and biases stay bf16.
        let block = name.starts_with("double_blocks.") || name.starts_with("single_blocks.");
        let fp8 = !matches!(format, FluxDitFormat::Dense(_))
            && block
            && name.ends_with(".weight")
            && shape.len() == 2;
        // Scaled: six standard deviations map to 448, the largest e4m3 value. Plain: the values as they are.
        let fp8_scale = fp8.then(|| match format {
            FluxDitFormat::ComfyScaledFp8 => {
                (mean.abs() + 6.0 * std).max(f32::MIN_POSITIVE) / FP8_MAX
            }
            _ => 1.0,
        });
        RandomWeight {
            name,
            shape,
            mean,
            std,
            fp8_scale,
        }
    });
    write_random_weights(path, weights, dense, comfy.then_some(COMFY_PREFIX), seed)
}

/// Writes the image's latent and text caches (bf16, as the FLUX.1 caches are made) into `dir/cache`, and a grey
/// stand-in image with its caption into `dir/images`; returns the two cache paths.
fn write_cached_image(
    dir: &Path,
    spec: &FluxSynthProject,
    latent: [usize; 4],
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let cache = dir.join("cache");
    let images = dir.join("images");
    fs::create_dir_all(&cache).with_context(|| format!("cannot create {}", cache.display()))?;
    let (w, h) = (spec.width as u32, spec.height as u32);
    write_stand_in_image(&images, ITEM_STEM, (w, h), CAPTION)?;

    let rng = &mut StdRng::seed_from_u64(mix(spec.seed, u64::MAX));
    let dev = &Device::Cpu;
    let latents = randn(rng, latent.as_slice(), 0.0, 1.0, dev)?.to_dtype(DType::BF16)?;
    let latent_path = cache.join(flux_latent_cache_name(ITEM_STEM, (w, h)));
    let controls = if spec.kontext {
        vec![randn(rng, latent.as_slice(), 0.0, 1.0, dev)?.to_dtype(DType::BF16)?]
    } else {
        Vec::new()
    };
    FLUX_CACHES.write_latent_cache_with_controls(&latent_path, &latents, &controls, (w, h))?;
    let text = FluxTextCache {
        t5: randn(
            rng,
            (spec.text_tokens, spec.cfg.context_in_dim),
            0.0,
            1.0,
            dev,
        )?
        .to_dtype(DType::BF16)?,
        clip_l_pooler: randn(rng, spec.cfg.vec_in_dim, 0.0, 1.0, dev)?.to_dtype(DType::BF16)?,
        caption: CAPTION.into(),
    };
    let text_path = cache.join(flux_text_cache_name(ITEM_STEM));
    write_flux_text_cache(&text_path, &text)?;
    Ok((latent_path, text_path))
}

/// The project's musubi-tuner dataset config: one image dataset of the image's size, no buckets.
fn dataset_toml(spec: &FluxSynthProject) -> String {
    image_dataset_toml(
        "framesmith-bench synth-project --model flux-dev: one cached image of random latents and random text\n\
         features. The grey image in images/ only stands for it: training reads the caches (no autoencoder, no\n\
         text encoders).",
        ("images", "cache"),
        (spec.width, spec.height),
    )
}

/// The project's run config: defaults, the DiT and dataset of `dir`, LoRA rank and alpha `spec.rank`, `flux_shift`
/// timesteps, `spec.steps` steps on `cuda`, no samples, the LoRA saved at the end only, outputs in `dir/output`,
/// every block resident; an FP8 DiT file trains with an FP8 base (its own scales), a dense one with a bf16 base.
pub fn flux_run_config(dir: &Path, spec: &FluxSynthProject) -> RunConfig {
    let dit = dir.join(spec.dit_file_name());
    let mut config = base_run_config(dir, &dit, (spec.steps, spec.seed), spec.rank);
    tune_flux_run_config(&mut config, spec);
    config
}

/// What a FLUX.1 project's run config sets beyond every project's: an FP8 base for an FP8 DiT file, `flux_shift`
/// timesteps, its output name.
fn tune_flux_run_config(config: &mut RunConfig, spec: &FluxSynthProject) {
    if !matches!(spec.dit, FluxDitFormat::Dense(_)) {
        config.model.base_dtype = framesmith_config::run::BaseDtype::Fp8;
    }
    config.training.timestep_sampling = TimestepSampling::FluxShift;
    config.output.output_name = "synth-flux-lora".into();
}

#[cfg(test)]
#[allow(clippy::expect_used, clippy::unwrap_used)]
// test code: a failed expectation is the test failing
mod tests;
