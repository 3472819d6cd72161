//! `framesmith-bench synth-project --model qwen-image`: a Qwen-Image training project of the released size with
//! nothing to download — random DiT weights under diffusers' names in one bf16 file (the layout of ComfyUI's
//! `qwen_image_bf16.safetensors` without its prefix), one cached image in musubi-tuner's `_qi` format (random
//! latents of the VAE's shape, a random Qwen2.5-VL output) with a grey stand-in image and caption, its dataset
//! TOML and a run config that trains from the caches alone. With `--sample-files` also a random Qwen2.5-VL-7B in
//! ComfyUI's scaled-FP8 layout, a random VAE (`qwen_image_vae.safetensors`) and a `captions/` dataset of many
//! captioned images, for timing the text cache, samples and `framesmith generate`.
//! For memory and speed trials of the real trainer on a GPU machine, and the weights for the PyTorch reference
//! (`bench/reference/qwen_image_step.py`).

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use candle_core::{DType, Device};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::synth::cached::{write_cached_project, CachedProject, CachedProjectFiles};
use crate::synth::tensors::{encoder_init, mix, write_random_weights, RandomWeight, FP8_MAX};
use crate::synth::{image_dataset_toml, write_stand_in_image};
use framesmith_config::run::TimestepSampling;
use framesmith_data::family::qwen_image::cache::{
    qwen_latent_cache_name, qwen_text_cache_name, write_qwen_text_cache, QwenTextCache,
    QWEN_IMAGE_CACHES,
};
use framesmith_models::qwen25vl::Qwen25VlTextConfig;
use framesmith_models::qwen_image::weights::official_shapes;
use framesmith_models::qwen_image::QwenImageConfig;
use framesmith_nn::init::randn;

/// The DiT's file name.
pub const DIT_FILE: &str = "qwen_image_bf16.safetensors";
/// The VAE's file name (ComfyUI's).
pub const VAE_FILE: &str = "qwen_image_vae.safetensors";
/// The text encoder's file name (ComfyUI's).
pub const TEXT_ENCODER_FILE: &str = "qwen_2.5_vl_7b_fp8_scaled.safetensors";
/// The dataset config of the captions to cache.
pub const CAPTIONS_DATASET_FILE: &str = "captions.toml";
/// Stem of the one cached image.
const ITEM_STEM: &str = "synth_000";
/// The image's caption (its text features are random all the same).
const CAPTION: &str = "a synthetic image: random latents and random text features";
/// The VAE's latent channels and down-sampling; the DiT packs 2×2 latent patches.
const LATENT_CHANNELS: usize = 16;
const VAE_FACTOR: usize = 8;
const PACK: usize = 2;
/// Side of the stand-in images of the captions dataset.
const CAPTION_IMAGE_SIDE: u32 = 64;

/// What to write.
#[derive(Debug, Clone)]
pub struct QwenImageSynthProject {
    pub cfg: QwenImageConfig,
    /// Image size in pixels (multiples of 16).
    pub height: usize,
    pub width: usize,
    pub seed: u64,
    /// Tokens of the cached text-encoder output.
    pub text_tokens: usize,
    /// Optimizer steps of the run config.
    pub steps: usize,
    /// LoRA rank (and alpha) of the run config.
    pub rank: usize,
    /// With this many captioned images and the text encoder of these sizes: the files for `framesmith cache text`.
    pub captions: Option<(usize, Qwen25VlTextConfig)>,
    /// Control images of the cached image (Qwen-Image-Edit; -2509 takes several), each of the image's size: random
    /// latents under musubi-tuner's `latents_control_{i}_…` keys, so the run trains an edit LoRA.
    pub controls: usize,
}

/// What [`write_qwen_image_project`] wrote.
#[derive(Debug, Clone)]
pub struct QwenImageSynthFiles {
    /// The DiT, the image's caches and the configs.
    pub project: CachedProjectFiles,
    /// The text encoder and the captions' dataset config, when asked for.
    pub captions: Option<(PathBuf, PathBuf)>,
    /// The VAE, written with the captions.
    pub vae: Option<PathBuf>,
}

/// The latents `[16, 1, H/8, W/8]` the VAE makes of the image, or why the size does not fit.
pub fn qwen_latent_shape(spec: &QwenImageSynthProject) -> anyhow::Result<[usize; 4]> {
    let step = VAE_FACTOR * PACK;
    if spec.height == 0 || spec.width == 0 || spec.height % step != 0 || spec.width % step != 0 {
        bail!(
            "{}x{} (width x height): Qwen-Image needs both sides to be positive multiples of {step}",
            spec.width,
            spec.height
        );
    }
    if spec.cfg.in_channels != LATENT_CHANNELS * PACK * PACK {
        bail!(
            "the DiT takes {} input channels; Qwen-Image takes {} (16 latent channels × 2 × 2)",
            spec.cfg.in_channels,
            LATENT_CHANNELS * PACK * PACK
        );
    }
    Ok([
        LATENT_CHANNELS,
        1,
        spec.height / VAE_FACTOR,
        spec.width / VAE_FACTOR,
    ])
}

/// Writes the project into `dir` (created when missing): [`DIT_FILE`], `dataset.toml` with its cache folder and
/// stand-in image, `run.toml` (LoRA rank `spec.rank`, `qwen_shift` timesteps, no samples, saving at the end only,
/// every block resident, bf16 base, on `cuda`), and with `spec.captions` the text encoder and the captions.
pub fn write_qwen_image_project(
    dir: &Path,
    spec: &QwenImageSynthProject,
) -> anyhow::Result<QwenImageSynthFiles> {
    let latent = qwen_latent_shape(spec)?;
    spec.cfg
        .validate()
        .map_err(|e| anyhow::anyhow!("the Qwen-Image sizes: {e}"))?;
    if spec.text_tokens == 0 || spec.text_tokens > 1024 {
        bail!(
            "the text encoder's output needs 1 to 1024 tokens, not {}",
            spec.text_tokens
        );
    }
    let header = "framesmith-bench synth-project --model qwen-image: one cached image of random latents and\n\
                  random text features. The grey image in images/ only stands for it: training reads the caches.";
    let project = CachedProject {
        dit_file: DIT_FILE,
        dataset_toml: image_dataset_toml(header, ("images", "cache"), (spec.width, spec.height)),
        steps_seed: (spec.steps, spec.seed),
        rank: spec.rank,
    };
    let project = write_cached_project(
        dir,
        project,
        |dit| write_random_qwen_image_dit(dit, &spec.cfg, spec.seed),
        |dir| write_cached_image(dir, spec, latent),
        |config| {
            config.training.timestep_sampling = TimestepSampling::QwenShift;
            config.output.output_name = "synth-qwen-image-lora".into();
        },
    )?;
    let dir = &project.dir;
    let captions = match &spec.captions {
        Some((count, encoder)) => Some(write_captions(dir, *count, encoder, spec.seed)?),
        None => None,
    };
    let vae = match spec.captions {
        Some(_) => {
            let path = dir.join(VAE_FILE);
            let wan21 = framesmith_models::wan::vae::VaeConfig::wan21();
            crate::synth::write_random_wan_vae(&path, &wan21, mix(spec.seed, 11))?;
            Some(path)
        }
        None => None,
    };
    Ok(QwenImageSynthFiles {
        project,
        captions,
        vae,
    })
}

/// Mean and standard deviation of a random official-layout Qwen-Image tensor: the q/k RMSNorm and text-norm
/// scales 1 ± 0.1, biases 0 ± 0.05, the modulation linears 0 ± 0.1/√fan_in (small gates keep 60 residual updates
/// in range), every other weight 0 ± 1/√fan_in.
pub fn qwen_image_init_stats(name: &str, shape: &[usize]) -> (f32, f32) {
    let fan_in = shape
        .get(1..)
        .map_or(1, |s| s.iter().product::<usize>().max(1));
    let scaled = 1.0 / (fan_in as f32).sqrt();
    if name.contains("norm_") && shape.len() == 1 || name == "txt_norm.weight" {
        (1.0, 0.1)
    } else if name.ends_with(".bias") {
        (0.0, 0.05)
    } else if name.contains("_mod.") {
        (0.0, 0.1 * scaled)
    } else {
        (0.0, scaled)
    }
}

/// Writes random bf16 weights of `cfg` under diffusers' names to `path`, one tensor in memory at a time; returns
/// the file size.
pub fn write_random_qwen_image_dit(
    path: &Path,
    cfg: &QwenImageConfig,
    seed: u64,
) -> anyhow::Result<u64> {
    let weights = official_shapes(cfg).into_iter().map(|(name, shape)| {
        let (mean, std) = qwen_image_init_stats(&name, &shape);
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

/// Writes the image's latent and text caches (bf16) into `dir/cache` and its stand-in into `dir/images`.
fn write_cached_image(
    dir: &Path,
    spec: &QwenImageSynthProject,
    latent: [usize; 4],
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let cache = dir.join("cache");
    fs::create_dir_all(&cache).with_context(|| format!("cannot create {}", cache.display()))?;
    let size = (spec.width as u32, spec.height as u32);
    write_stand_in_image(&dir.join("images"), ITEM_STEM, size, CAPTION)?;
    let rng = &mut StdRng::seed_from_u64(mix(spec.seed, u64::MAX));
    let dev = &Device::Cpu;
    let latents = randn(rng, latent.as_slice(), 0.0, 1.0, dev)?.to_dtype(DType::BF16)?;
    let latent_path = cache.join(qwen_latent_cache_name(ITEM_STEM, size));
    let controls = (0..spec.controls)
        .map(|_| randn(rng, latent.as_slice(), 0.0, 1.0, dev)?.to_dtype(DType::BF16))
        .collect::<candle_core::Result<Vec<_>>>()?;
    QWEN_IMAGE_CACHES.write_latent_cache_with_controls(&latent_path, &latents, &controls, size)?;
    let text = QwenTextCache {
        vl_embed: randn(
            rng,
            (spec.text_tokens, spec.cfg.joint_attention_dim),
            0.0,
            1.0,
            dev,
        )?
        .to_dtype(DType::BF16)?,
        caption: CAPTION.into(),
    };
    let text_path = cache.join(qwen_text_cache_name(ITEM_STEM));
    write_qwen_text_cache(&text_path, &text)?;
    Ok((latent_path, text_path))
}

/// Writes the random text encoder ([`TEXT_ENCODER_FILE`]: ComfyUI's names under `model.`, the linears FP8 with a
/// per-tensor `scale_weight`, the rest bf16) and `count` captioned stand-in images in `dir/captions` with their
/// dataset config [`CAPTIONS_DATASET_FILE`]. Captions differ in length (one to a few dozen words).
fn write_captions(
    dir: &Path,
    count: usize,
    encoder: &Qwen25VlTextConfig,
    seed: u64,
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let weights = encoder
        .tensor_shapes()
        .into_iter()
        .map(|(name, shape, linear)| {
            let (mean, std) = encoder_init(&name, &shape);
            let fp8_scale = linear.then(|| (6.0 * std).max(f32::MIN_POSITIVE) / FP8_MAX);
            RandomWeight {
                name,
                shape,
                mean,
                std,
                fp8_scale,
            }
        });
    let encoder_path = dir.join(TEXT_ENCODER_FILE);
    write_random_weights(
        &encoder_path,
        weights,
        safetensors::Dtype::BF16,
        Some("model."),
        mix(seed, 7),
    )?;
    let words = [
        "a", "red", "fox", "sits", "on", "mossy", "rock", "at", "dawn", "with", "mist", "over",
        "the", "lake", "and", "text", "reading", "HELLO", "in", "bold", "letters",
    ];
    let images = dir.join("captions");
    for i in 0..count {
        let n = 1 + (i * 7) % 40;
        let caption: Vec<&str> = (0..n).map(|j| words[(i + j * 3) % words.len()]).collect();
        let side = CAPTION_IMAGE_SIDE;
        write_stand_in_image(
            &images,
            &format!("caption_{i:04}"),
            (side, side),
            &caption.join(" "),
        )?;
    }
    let dataset = dir.join(CAPTIONS_DATASET_FILE);
    let header = "framesmith-bench synth-project --model qwen-image --sample-files: captioned grey images, for\n\
                  timing `framesmith cache text`.";
    let side = CAPTION_IMAGE_SIDE as usize;
    fs::write(
        &dataset,
        image_dataset_toml(header, ("captions", "captions_cache"), (side, side)),
    )
    .with_context(|| format!("cannot write {}", dataset.display()))?;
    Ok((encoder_path, dataset))
}

#[cfg(test)]
#[allow(clippy::expect_used, clippy::unwrap_used)]
// test code: a failed expectation is the test failing
mod tests {
    use super::*;

    fn tiny() -> QwenImageConfig {
        QwenImageConfig {
            num_layers: 2,
            attention_head_dim: 32,
            num_attention_heads: 2,
            joint_attention_dim: 24,
            axes_dims_rope: vec![4, 14, 14],
            ..QwenImageConfig::qwen_image()
        }
    }

    /// The project trains as written (on the CPU): the DiT is a Qwen-Image file of its sizes, the caches read
    /// back, and the encoder is a Qwen2.5-VL file of its sizes.
    #[test]
    fn a_tiny_project_is_a_qwen_image_project() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        // Heads of 128, as every released Qwen2.5 has (a single file's shapes give heads × head width only).
        let encoder = Qwen25VlTextConfig {
            vocab_size: 300,
            hidden_size: 256,
            intermediate_size: 64,
            num_hidden_layers: 2,
            num_attention_heads: 2,
            num_key_value_heads: 1,
            ..Qwen25VlTextConfig::qwen25_vl_7b()
        };
        let spec = QwenImageSynthProject {
            cfg: tiny(),
            height: 64,
            width: 48,
            seed: 3,
            text_tokens: 5,
            steps: 2,
            rank: 4,
            captions: Some((12, encoder.clone())),
            controls: 2,
        };
        let files = write_qwen_image_project(dir.path(), &spec)?;
        let dit = framesmith_models::qwen_image::weights::identify(&files.project.dit)?;
        assert_eq!(dit.config, spec.cfg);
        let latents = framesmith_data::family::qwen_image::cache::read_qwen_latent_cache(
            &files.project.latents,
            &Device::Cpu,
        )?;
        assert_eq!(latents.dims(), &[16, 1, 8, 6]);
        let (_, controls) = QWEN_IMAGE_CACHES
            .read_latent_cache_with_controls(&files.project.latents, &Device::Cpu)?;
        assert_eq!(
            controls.len(),
            2,
            "Qwen-Image-Edit-2509's two control images"
        );
        let text = framesmith_data::family::qwen_image::cache::read_qwen_text_cache(
            &files.project.text,
            &Device::Cpu,
        )?;
        assert_eq!(text.vl_embed.dims(), &[5, 24]);
        let config = framesmith_config::RunConfig::load(&files.project.run)?;
        assert_eq!(
            config.training.timestep_sampling,
            TimestepSampling::QwenShift
        );
        assert_eq!((config.lora.rank, config.training.max_train_steps), (4, 2));
        let (encoder_path, captions) = files.captions.clone().unwrap_or_default();
        assert_eq!(encoder_path.file_name(), Some(TEXT_ENCODER_FILE.as_ref()));
        let found = framesmith_models::qwen25vl::identify(&encoder_path)?;
        assert!(found.scaled_fp8);
        assert_eq!(found.config, encoder);
        let listed = fs::read_dir(dir.path().join("captions"))?.count();
        assert_eq!(listed, 24);
        assert!(fs::read_to_string(captions)?.contains("image_directory = \"captions\""));
        let vae = files.vae.clone().expect("a VAE with the sample files");
        assert_eq!(vae.file_name(), Some(VAE_FILE.as_ref()));
        framesmith_models::qwen_image::vae::load_vae(&vae, DType::F32, &Device::Cpu)?;
        assert!(qwen_latent_shape(&QwenImageSynthProject {
            width: 40,
            ..spec.clone()
        })
        .is_err());
        Ok(())
    }
}
