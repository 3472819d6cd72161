//! `framesmith-bench synth-project`: a training project of a real model and clip size with nothing to download —
//! random DiT weights in the official Wan layout (written tensor by tensor), one cached clip in musubi-tuner's
//! format (random latents of the Wan VAE's shape, a random umT5-shaped text embedding) with a grey stand-in video
//! and caption, its dataset TOML and a run config that trains from the caches alone (no VAE, no text encoder).
//! For memory and speed trials of the real trainer on a GPU machine; no training code depends on this.

pub mod cached;
pub(crate) mod tensors;
#[cfg(test)]
#[allow(clippy::expect_used, clippy::unwrap_used)]
// test code: a failed expectation is the test failing
pub(crate) mod testkit;

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use candle_core::{DType, Device};
use rand::rngs::StdRng;
use rand::SeedableRng;

use framesmith_config::run::{BlocksToSwap, DeviceSpec, StreamingMode};
use framesmith_config::RunConfig;
use framesmith_data::cache::{
    text_cache_name, video_latent_cache_name, write_wan_latent_cache, write_wan_text_cache,
    LatentCacheMetadata, WanLatentCache,
};
use framesmith_data::frames::FrameWindow;
use framesmith_data::video::encode::{write_mp4, RgbFrame};
use framesmith_engine::family::wan::plan::vae_for;
use framesmith_engine::train::samples::SAMPLE_FPS;
use framesmith_models::wan::random::init_stats;
use framesmith_models::wan::weights::official_shapes;
use framesmith_models::wan::{ModelType, WanConfig};
use framesmith_nn::init::randn;
use tensors::{
    encoder_init, mix, write_random_weights, write_safetensors, RandomTensor, RandomWeight,
    SynthTensor, FP8_MAX,
};

/// File names inside the project folder.
pub const DIT_FILE: &str = "dit.safetensors";
pub const DATASET_FILE: &str = "dataset.toml";
pub const RUN_FILE: &str = "run.toml";
/// Stem of the one cached clip.
const ITEM_STEM: &str = "synth_000";
/// The clip's caption (its text embedding is random all the same).
const CAPTION: &str = "a synthetic clip: random latents and a random text embedding";

/// What to write.
#[derive(Debug, Clone)]
pub struct SynthProject {
    /// The DiT (a text-to-video variant).
    pub cfg: WanConfig,
    /// Clip length (4k + 1 frames) and size in pixels.
    pub frames: usize,
    pub height: usize,
    pub width: usize,
    /// How the DiT weights are stored on disk.
    pub dit: DitFormat,
    pub seed: u64,
    /// Tokens of the text embedding (at most the model's text length).
    pub text_tokens: usize,
    /// Optimizer steps of the run config.
    pub steps: usize,
    /// Also write random umT5-XXL and Wan VAE weights (the Wan2.2 VAE for TI2V-5B, else Wan2.1's) in ComfyUI's
    /// layouts ([`write_random_encoders`]), with this SentencePiece model embedded as the umT5 file's tokenizer,
    /// and name them in the run config.
    pub encoders: Option<PathBuf>,
}

/// How [`write_random_dit`] stores the weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DitFormat {
    /// Every tensor in one float dtype (f32, f16 or bf16), official key names, as the official release ships.
    Dense(DType),
    /// A ComfyUI `scaled_fp8` single file (`wan2.1_t2v_14B_fp8_scaled.safetensors`'s layout): keys under
    /// `model.diffusion_model.`, the blocks' linear weights as `float8_e4m3fn` with a per-tensor f32
    /// `scale_weight`, everything else bf16, and the `scaled_fp8` marker.
    ComfyScaledFp8,
}

impl DitFormat {
    /// Parses `bf16`, `f16`, `f32` or `fp8-scaled`.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        Ok(match text {
            "bf16" => Self::Dense(DType::BF16),
            "f16" => Self::Dense(DType::F16),
            "f32" => Self::Dense(DType::F32),
            "fp8-scaled" => Self::ComfyScaledFp8,
            other => bail!("unknown DiT format `{other}` (bf16, f16, f32, fp8-scaled)"),
        })
    }
}

/// What [`write_project`] wrote.
#[derive(Debug, Clone)]
pub struct SynthFiles {
    pub dit: PathBuf,
    pub dataset: PathBuf,
    pub run: PathBuf,
    /// The latent cache of the clip.
    pub latents: PathBuf,
    /// Size of the DiT file.
    pub dit_bytes: u64,
}

/// Writes the project into `dir` (created when missing): `dit.safetensors`, `dataset.toml` with its cache
/// folder, and `run.toml` (bf16 base, LoRA rank 32, no samples, saving at the end only, on `cuda`). An
/// image-to-video variant's cache holds random image conditioning as well; with `encoders` it gets no cache (make one
/// with `framesmith cache latents --dit` and the written VAE).
pub fn write_project(dir: &Path, spec: &SynthProject) -> anyhow::Result<SynthFiles> {
    // TI2V-5B trains from plain latent caches in either mode. Without encoders an image-to-video model gets a
    // cache of random image conditioning as well (the first-frame mask, image latents and, for Wan2.1, CLIP
    // features); with them its caches come from `framesmith cache latents --dit` with the written VAE.
    let cached = spec.cfg.model_type != ModelType::I2v || spec.encoders.is_none();
    let latent = latent_shape(spec)?;
    if spec.text_tokens == 0 || spec.text_tokens > spec.cfg.text_len {
        bail!(
            "the text embedding needs 1 to {} tokens, not {}",
            spec.cfg.text_len,
            spec.text_tokens
        );
    }
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let dir = std::path::absolute(dir)
        .with_context(|| format!("cannot resolve the folder {}", dir.display()))?;
    let dit = dir.join(DIT_FILE);
    let dit_bytes = write_random_dit(&dit, &spec.cfg, spec.dit, spec.seed)?;
    let latents = if cached {
        write_cached_item(&dir, spec, latent)?
    } else {
        PathBuf::new()
    };
    if let Some(spiece) = &spec.encoders {
        let bytes =
            fs::read(spiece).with_context(|| format!("cannot read {}", spiece.display()))?;
        write_random_encoders(
            &dir,
            &framesmith_models::t5::T5Config::umt5_xxl(),
            &vae_for(&spec.cfg),
            &bytes,
            spec.seed,
        )?;
    }
    let dataset = dir.join(DATASET_FILE);
    fs::write(&dataset, dataset_toml(spec))
        .with_context(|| format!("cannot write {}", dataset.display()))?;
    let run = dir.join(RUN_FILE);
    let config = run_config(&dir, spec);
    fs::write(&run, run_config_toml(&config)?)
        .with_context(|| format!("cannot write {}", run.display()))?;
    Ok(SynthFiles {
        dit,
        dataset,
        run,
        latents,
        dit_bytes,
    })
}

/// The latents `[channels, frames, height, width]` the model's VAE makes of the clip (4× in time; 8× in space for
/// the Wan2.1 VAE, 16× for the Wan2.2 VAE of TI2V-5B), or why the clip size does not fit the model.
pub fn latent_shape(spec: &SynthProject) -> anyhow::Result<[usize; 4]> {
    let [_, p1, p2] = spec.cfg.patch_size;
    let s = vae_for(&spec.cfg).spatial_factor();
    let (step_h, step_w) = (s * p1, s * p2);
    if spec.frames == 0 || (spec.frames - 1) % 4 != 0 {
        bail!(
            "{} frames: the Wan VAE needs 4k + 1 frames (e.g. 81)",
            spec.frames
        );
    }
    if spec.height == 0 || spec.width == 0 || spec.height % step_h != 0 || spec.width % step_w != 0
    {
        bail!(
            "{}x{} (width x height): both must be multiples of {step_w} and {step_h} for this model",
            spec.width,
            spec.height
        );
    }
    let [f, h, w] = super::step::latent_size(&spec.cfg, spec.frames, spec.height, spec.width);
    Ok([spec.cfg.out_dim, f, h, w])
}

/// Writes random weights for `cfg` in `format`'s layout to `path`, drawn with the statistics of
/// [`framesmith_models::wan::random`]; one tensor is in memory at a time. Returns the file size.
pub fn write_random_dit(
    path: &Path,
    cfg: &WanConfig,
    format: DitFormat,
    seed: u64,
) -> anyhow::Result<u64> {
    let dense = match format {
        DitFormat::Dense(DType::F32) => safetensors::Dtype::F32,
        DitFormat::Dense(DType::F16) => safetensors::Dtype::F16,
        DitFormat::Dense(DType::BF16) | DitFormat::ComfyScaledFp8 => safetensors::Dtype::BF16,
        DitFormat::Dense(other) => {
            bail!("random DiT weights are written as f32, f16 or bf16, not {other:?}")
        }
    };
    let comfy = format == DitFormat::ComfyScaledFp8;
    let weights = official_shapes(cfg).into_iter().map(|(name, shape)| {
        let (mean, std) = init_stats(&name, &shape);
        // ComfyUI's scaled files keep the blocks' linear weights in FP8, the rest (norms, biases, modulation,
        // embeddings, head) in the model dtype.
        let fp8 =
            comfy && name.starts_with("blocks.") && name.ends_with(".weight") && shape.len() == 2;
        // Six standard deviations map to 448, the largest e4m3 value: the rare value beyond saturates.
        let fp8_scale = fp8.then(|| (mean.abs() + 6.0 * std).max(f32::MIN_POSITIVE) / FP8_MAX);
        RandomWeight {
            name,
            shape,
            mean,
            std,
            fp8_scale,
        }
    });
    write_random_weights(
        path,
        weights,
        dense,
        comfy.then_some("model.diffusion_model."),
        seed,
    )
}

/// File names of [`write_random_encoders`], as ComfyUI users have them.
pub const UMT5_FILE: &str = "umt5_xxl_fp8_e4m3fn_scaled.safetensors";
pub const VAE_FILE: &str = "wan_2.1_vae.safetensors";
/// The Wan2.2 VAE's file name (TI2V-5B's), as ComfyUI users have it.
pub const VAE22_FILE: &str = "wan2.2_vae.safetensors";

/// The file name [`write_random_encoders`] gives the VAE of `vae`.
pub fn vae_file(vae: &framesmith_models::wan::vae::VaeConfig) -> &'static str {
    match vae.variant {
        framesmith_models::wan::vae::VaeVariant::Wan21 => VAE_FILE,
        framesmith_models::wan::vae::VaeVariant::Wan22 => VAE22_FILE,
    }
}

/// Writes random weights of the umT5 encoder and the Wan VAE of these sizes into `dir` in the layouts of
/// ComfyUI's files ([`UMT5_FILE`]: Hugging Face key names, Linears in FP8 with per-tensor `scale_weight`, the
/// rest bf16, the `scaled_fp8` marker and the SentencePiece model `spiece` embedded as `spiece_model`;
/// [`vae_file`]: official key names in bf16). Weights are drawn with a fan-in scale so activations stay finite;
/// norms are one. Returns the two paths.
pub fn write_random_encoders(
    dir: &Path,
    t5: &framesmith_models::t5::T5Config,
    vae: &framesmith_models::wan::vae::VaeConfig,
    spiece: &[u8],
    seed: u64,
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let umt5 = dir.join(UMT5_FILE);
    let mut views = Vec::new();
    let shapes = framesmith_models::t5::hf_t5_tensor_shapes(t5);
    for (i, (name, shape, linear)) in shapes.into_iter().enumerate() {
        let (mean, std) = encoder_init(&name, &shape);
        let scale = linear.then(|| (6.0 * std).max(f32::MIN_POSITIVE) / FP8_MAX);
        if let Some(scale) = scale {
            views.push((
                format!("{}.scale_weight", name.trim_end_matches(".weight")),
                SynthTensor::scale(scale),
            ));
        }
        let dtype = if linear {
            safetensors::Dtype::F8_E4M3
        } else {
            safetensors::Dtype::BF16
        };
        let tensor = RandomTensor {
            shape,
            dtype,
            mean,
            std,
            seed: mix(seed, i as u64),
            fp8_scale: scale,
        };
        views.push((name, SynthTensor::Random(tensor)));
    }
    views.push(("scaled_fp8".into(), SynthTensor::scaled_fp8_marker()));
    views.push((
        "spiece_model".into(),
        SynthTensor::Bytes {
            dtype: safetensors::Dtype::U8,
            shape: vec![spiece.len()],
            data: spiece.to_vec(),
        },
    ));
    write_safetensors(&umt5, views)?;

    let vae_path = dir.join(vae_file(vae));
    write_random_wan_vae(&vae_path, vae, seed)?;
    Ok((umt5, vae_path))
}

/// Writes random bf16 weights of the Wan VAE `vae` under the official key names to `path` (the layout of
/// ComfyUI's `wan_2.1_vae.safetensors`, and of `qwen_image_vae.safetensors`, the same architecture).
pub fn write_random_wan_vae(
    path: &Path,
    vae: &framesmith_models::wan::vae::VaeConfig,
    seed: u64,
) -> anyhow::Result<()> {
    let shapes = framesmith_models::wan::vae::WanVae::tensor_shapes(vae)?;
    let views = shapes
        .into_iter()
        .enumerate()
        .map(|(i, (name, shape))| {
            let (mean, std) = encoder_init(&name, &shape);
            let tensor = RandomTensor {
                shape,
                dtype: safetensors::Dtype::BF16,
                mean,
                std,
                seed: mix(mix(seed, u64::MAX - 1), i as u64),
                fp8_scale: None,
            };
            (name, SynthTensor::Random(tensor))
        })
        .collect();
    write_safetensors(path, views)
}

/// Writes the clip's latent and text caches (bf16, as musubi-tuner caches Wan) into `dir/cache`; returns the
/// latent cache's path.
fn write_cached_item(
    dir: &Path,
    spec: &SynthProject,
    latent: [usize; 4],
) -> anyhow::Result<PathBuf> {
    let cache = dir.join("cache");
    let videos = dir.join("videos");
    for d in [&cache, &videos] {
        fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
    }
    write_media(&videos, spec)?;
    let rng = &mut StdRng::seed_from_u64(mix(spec.seed, u64::MAX));
    let (latents_image, clip) = random_image_conditioning(rng, &spec.cfg, latent)?;
    let latents = WanLatentCache {
        latents: randn(rng, latent.as_slice(), 0.0, 1.0, &Device::Cpu)?.to_dtype(DType::BF16)?,
        latents_image,
        latents_control: None,
        clip,
        f_indices: None,
    };
    let window = FrameWindow {
        start: 0,
        frames: spec.frames as u32,
    };
    let size = (spec.width as u32, spec.height as u32);
    let latent_path = cache.join(video_latent_cache_name(ITEM_STEM, window, size));
    write_wan_latent_cache(
        &latent_path,
        &latents,
        &LatentCacheMetadata::wan(size, Some(window.frames)),
    )?;
    let text = randn(
        rng,
        (spec.text_tokens, spec.cfg.text_dim),
        0.0,
        1.0,
        &Device::Cpu,
    )?
    .to_dtype(DType::BF16)?;
    write_wan_text_cache(&cache.join(text_cache_name(ITEM_STEM)), &text, CAPTION)?;
    Ok(latent_path)
}

/// An image-to-video model's conditioning for a clip of `latent` shape, as the official code lays it out: the
/// first-frame mask (4 channels, ones on the first latent frame), random image latents on the first frame and
/// zeros after it (bf16), and random CLIP features (f16) where the model has the CLIP branch. `(None, None)` for
/// other models.
fn random_image_conditioning(
    rng: &mut StdRng,
    cfg: &WanConfig,
    latent: [usize; 4],
) -> anyhow::Result<(Option<candle_core::Tensor>, Option<candle_core::Tensor>)> {
    if cfg.model_type != ModelType::I2v {
        return Ok((None, None));
    }
    let [c, f, h, w] = latent;
    let dev = &Device::Cpu;
    let mut first = |channels: usize, value: Option<f32>| -> anyhow::Result<candle_core::Tensor> {
        let head = match value {
            Some(v) => candle_core::Tensor::full(v, (channels, 1, h, w), dev)?,
            None => randn(rng, &[channels, 1, h, w], 0.0, 1.0, dev)?,
        };
        let rest = candle_core::Tensor::zeros((channels, f - 1, h, w), DType::F32, dev)?;
        Ok(candle_core::Tensor::cat(&[head, rest], 1)?)
    };
    let mask = first(4, Some(1.0))?;
    let image = first(c, None)?;
    let y = candle_core::Tensor::cat(&[mask, image], 0)?.to_dtype(DType::BF16)?;
    let clip = if cfg.has_clip() {
        Some(randn(rng, &[cfg.clip_tokens, cfg.clip_dim], 0.0, 1.0, dev)?.to_dtype(DType::F16)?)
    } else {
        None
    };
    Ok((Some(y), clip))
}

/// The clip the caches stand for (plain grey frames) and its caption, so that the dataset checks as it would with
/// real media; training reads the caches only.
fn write_media(videos: &Path, spec: &SynthProject) -> anyhow::Result<()> {
    let frame = RgbFrame {
        width: spec.width,
        height: spec.height,
        data: vec![128; spec.width * spec.height * 3],
    };
    let clip = videos.join(format!("{ITEM_STEM}.mp4"));
    write_mp4(&clip, &vec![frame; spec.frames], SAMPLE_FPS)
        .with_context(|| format!("cannot write {}", clip.display()))?;
    let caption = videos.join(format!("{ITEM_STEM}.txt"));
    fs::write(&caption, CAPTION).with_context(|| format!("cannot write {}", caption.display()))
}

/// The project's musubi-tuner dataset config: one video dataset of the clip's size and length.
fn dataset_toml(spec: &SynthProject) -> String {
    format!(
        "# framesmith-bench synth-project: one cached clip of random latents and a random text embedding. The\n\
         # grey clip in videos/ only stands for it: training reads the caches (no VAE, no text encoder).\n\
         [general]\nresolution = [{w}, {h}]\ncaption_extension = \".txt\"\nbatch_size = 1\nenable_bucket = false\n\n\
         [[datasets]]\nvideo_directory = \"videos\"\ncache_directory = \"cache\"\ntarget_frames = [{f}]\n\
         frame_extraction = \"head\"\n",
        w = spec.width,
        h = spec.height,
        f = spec.frames
    )
}

/// The project's run config: defaults, the DiT and dataset of `dir`, bf16 base, LoRA rank 32, `spec.steps`
/// steps on `cuda`, no samples, the LoRA saved at the end only, outputs in `dir/output`, every block resident.
pub fn run_config(dir: &Path, spec: &SynthProject) -> RunConfig {
    let mut config = base_run_config(dir, &dir.join(DIT_FILE), (spec.steps, spec.seed), 32);
    config.output.output_name = "synth-lora".into();
    if spec.encoders.is_some() {
        config.model.vae = dir.join(vae_file(&vae_for(&spec.cfg)));
        config.model.text_encoder = dir.join(UMT5_FILE);
    }
    config
}

/// What every synthetic project's run config shares: defaults, the DiT `dit` and the dataset of `dir`, bf16 base,
/// LoRA rank and alpha `rank`, (`steps`, `seed`) on `cuda`, no samples, the LoRA saved at the end only, outputs in
/// `dir/output`, every block resident.
pub(crate) fn base_run_config(
    dir: &Path,
    dit: &Path,
    (steps, seed): (usize, u64),
    rank: usize,
) -> RunConfig {
    let mut config = RunConfig::default();
    config.model.dit = dit.to_path_buf();
    config.model.base_dtype = framesmith_config::run::BaseDtype::Bf16;
    config.dataset.config = dir.join(DATASET_FILE);
    config.lora.rank = rank;
    config.lora.alpha = rank as f64;
    config.training.max_train_steps = steps;
    config.training.seed = seed;
    config.training.device = DeviceSpec::Cuda(0);
    config.memory.streaming = StreamingMode::Off;
    config.memory.blocks_to_swap = BlocksToSwap::Count(0);
    config.output.output_dir = dir.join("output");
    config.output.save_every_n_steps = Some(0);
    config.output.save_every_n_epochs = Some(0);
    config.output.save_state = false;
    config
}

/// A grey `width` x `height` PNG `images/{stem}.png` with its caption in `images/{stem}.txt`: what an image
/// dataset's item looks like, standing in for the cached item.
pub(crate) fn write_stand_in_image(
    images: &Path,
    stem: &str,
    (width, height): (u32, u32),
    caption: &str,
) -> anyhow::Result<()> {
    fs::create_dir_all(images).with_context(|| format!("cannot create {}", images.display()))?;
    let png = images.join(format!("{stem}.png"));
    image::RgbImage::from_pixel(width, height, image::Rgb([128, 128, 128]))
        .save(&png)
        .with_context(|| format!("cannot write {}", png.display()))?;
    let text = images.join(format!("{stem}.txt"));
    fs::write(&text, caption).with_context(|| format!("cannot write {}", text.display()))
}

/// A musubi-tuner image dataset config: one dataset of `images` cached into `cache`, `width` x `height`, batch 1,
/// no buckets, under the `# ` comment lines of `header`.
pub(crate) fn image_dataset_toml(
    header: &str,
    (images, cache): (&str, &str),
    (width, height): (usize, usize),
) -> String {
    let comment: String = header.lines().map(|l| format!("# {l}\n")).collect();
    format!(
        "{comment}[general]\nresolution = [{width}, {height}]\ncaption_extension = \".txt\"\nbatch_size = 1\n\
         enable_bucket = false\n\n[[datasets]]\nimage_directory = \"{images}\"\ncache_directory = \"{cache}\"\n"
    )
}

/// `config` as TOML, with `vram_budget_gb` (which TOML cannot write while it is unset) as a commented line in
/// `[memory]`, so that every memory key can be edited in place.
pub fn run_config_toml(config: &RunConfig) -> anyhow::Result<String> {
    let text = config.to_toml_string()?;
    if config.memory.vram_budget_gb.is_some() {
        return Ok(text);
    }
    let budget_line = "[memory]\n# vram_budget_gb = 24.0  # unset: the card's free memory\n";
    if !text.contains("[memory]\n") {
        bail!("the run config has no [memory] table to annotate");
    }
    Ok(text.replacen("[memory]\n", budget_line, 1))
}
