//! `framesmith-bench synth-project --model ltx2`: an LTX-2.3 (22B) text-to-video training project of the released
//! size with nothing to download — random weights of the transformer's video stream in the official single-file
//! layout (`model.diffusion_model.` names, bf16, the release's `config` metadata entry; the audio stream and the
//! audio-video cross-attentions, which text-to-video never reads, are left out, so the file is the video
//! stream's ~26 GB), one cached clip in the `_ltx2` format of musubi-tuner's LTX-2 branch (random latents of the
//! VAE's shape: 128 channels, 32× spatial and 8× temporal compression; a random connector output with its mask),
//! its dataset TOML and a run config that trains from the caches alone. With `audio` (`--audio`), the file holds
//! both streams and the audio-video cross-attentions (~37 GB), and the clip an `_ltx2_audio` cache (random audio
//! latents [8, T, 16], 25 frames a second of the clip at 24 fps) and the audio connector's output, so the run
//! trains audio and video jointly. For memory and speed trials of the real
//! trainer on a GPU machine, and the weights for the PyTorch reference (`bench/reference/ltx2_step.py`).

use std::collections::HashMap;

use std::path::{Path, PathBuf};

use anyhow::bail;
use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::synth::cached::{
    clip_cache_dir, clip_dataset_toml, write_cached_project, CachedProject, CachedProjectFiles,
    ClipVae,
};
use crate::synth::tensors::{mix, write_random_weights_with_metadata, RandomWeight};
use framesmith_config::run::TimestepSampling;
use framesmith_data::family::ltx2::cache::{
    ltx2_audio_cache_name, ltx2_latent_cache_name, ltx2_text_cache_name, write_ltx2_audio_cache,
    write_ltx2_latent_cache, write_ltx2_text_cache, Ltx2AudioCache, Ltx2TextCache,
};
use framesmith_data::frames::FrameWindow;
use framesmith_models::ltx2::config::metadata_config;
use framesmith_models::ltx2::weights::{audio_stream_shapes, video_stream_shapes};
use framesmith_models::ltx2::Ltx2Config;
use framesmith_nn::init::randn;

/// The DiT's file name.
pub const DIT_FILE: &str = "ltx-2.3-22b-video-stream-synth-bf16.safetensors";
/// The DiT's file name with both streams.
pub const AV_DIT_FILE: &str = "ltx-2.3-22b-audio-video-synth-bf16.safetensors";
/// Audio latent channels and mel bins of the release's audio VAE.
const AUDIO_CHANNELS: usize = 8;
const AUDIO_MEL_BINS: usize = 16;
/// Stem of the one cached clip.
const ITEM_STEM: &str = "synth_000";
/// The clip's caption (its text features are random all the same).
const CAPTION: &str = "a synthetic clip: random latents and random text features";
/// The VAE's spatial and temporal compression.
const VAE: ClipVae = ClipVae {
    family: "LTX-2",
    spatial: 32,
    temporal: 8,
};
/// The dataset config's comment.
const DATASET_HEADER: &str =
    "framesmith-bench synth-project --model ltx2: one cached clip of random latents and \
     random text\nfeatures; videos/ is empty: training reads the caches (no VAE, no text encoder).";

/// What to write.
#[derive(Debug, Clone)]
pub struct Ltx2SynthProject {
    pub cfg: Ltx2Config,
    /// Clip size in pixels (multiples of 32) and frames (8k + 1).
    pub height: usize,
    pub width: usize,
    pub frames: usize,
    pub seed: u64,
    /// Tokens of the cached connector output (the official pipeline pads captions to 1024).
    pub text_tokens: usize,
    /// Optimizer steps of the run config.
    pub steps: usize,
    /// LoRA rank (and alpha) of the run config.
    pub rank: usize,
    /// Both streams: the audio stream's weights and the clip's audio caches too.
    pub audio: bool,
}

/// The audio latent frames of a clip of `frames` frames at 24 fps (25 a second, as musubi-tuner sizes them).
pub fn ltx2_audio_frames(frames: usize) -> usize {
    (frames * 25 / 24).max(1)
}

/// The latents `[128, (F − 1)/8 + 1, H/32, W/32]` the VAE makes of the clip, or why the size does not fit.
pub fn ltx2_latent_shape(spec: &Ltx2SynthProject) -> anyhow::Result<[usize; 4]> {
    VAE.latent_shape(spec.cfg.in_channels, (spec.width, spec.height, spec.frames))
}

/// Writes the project into `dir` (created when missing): [`DIT_FILE`], `dataset.toml` with its cache folder,
/// `run.toml` (LoRA rank `spec.rank`, the official trainer's `shifted_logit_normal` timesteps, no samples, saving at the end only,
/// every block resident, bf16 base, on `cuda`).
pub fn write_ltx2_project(
    dir: &Path,
    spec: &Ltx2SynthProject,
) -> anyhow::Result<CachedProjectFiles> {
    let latent = ltx2_latent_shape(spec)?;
    spec.cfg
        .validate()
        .map_err(|e| anyhow::anyhow!("the LTX-2 sizes: {e}"))?;
    if spec.text_tokens == 0 || spec.text_tokens > 1024 {
        bail!(
            "the connector's output needs 1 to 1024 tokens, not {}",
            spec.text_tokens
        );
    }
    if spec.audio {
        spec.cfg
            .validate_audio()
            .map_err(|e| anyhow::anyhow!("the LTX-2 sizes: {e}"))?;
        if spec.cfg.audio_in_channels != AUDIO_CHANNELS * AUDIO_MEL_BINS {
            bail!(
                "the audio cache holds {AUDIO_CHANNELS} channels × {AUDIO_MEL_BINS} mel bins a frame, but the \
                 model takes {}",
                spec.cfg.audio_in_channels
            );
        }
    }
    let project = CachedProject {
        dit_file: if spec.audio { AV_DIT_FILE } else { DIT_FILE },
        dataset_toml: clip_dataset_toml(DATASET_HEADER, (spec.width, spec.height, spec.frames)),
        steps_seed: (spec.steps, spec.seed),
        rank: spec.rank,
    };
    write_cached_project(
        dir,
        project,
        |dit| write_random_ltx2_dit(dit, &spec.cfg, spec.seed, spec.audio),
        |dir| write_cached_clip(dir, spec, latent),
        |config| {
            config.training.timestep_sampling = TimestepSampling::ShiftedLogitNormal;
            // Text-to-video on every step, as the PyTorch step it is timed against (the official default 0.1
            // conditions a random step in ten on the first frame, with per-token modulation rows).
            config.training.first_frame_conditioning_p = Some(0.0);
            config.output.output_name = "synth-ltx2-lora".into();
        },
    )
}

/// Mean and standard deviation of a random LTX-2 tensor: q / k norm scales 1 ± 0.1, biases 0 ± 0.05, the AdaLN
/// tables and linears small (0 ± 0.1 and 0 ± 0.1/√fan_in: small gates keep 48 residual updates in range), every
/// other weight 0 ± 1/√fan_in.
pub fn ltx2_init_stats(name: &str, shape: &[usize]) -> (f32, f32) {
    let fan_in = shape
        .get(1..)
        .map_or(1, |s| s.iter().product::<usize>().max(1));
    let scaled = 1.0 / (fan_in as f32).sqrt();
    if name.contains("_norm.") {
        (1.0, 0.1)
    } else if name.ends_with(".bias") {
        (0.0, 0.05)
    } else if name.contains("scale_shift_table") {
        (0.0, 0.1)
    } else if name.contains("adaln_single.linear.") || name.contains("_adaln_single.linear.") {
        (0.0, 0.1 * scaled)
    } else {
        (0.0, scaled)
    }
}

/// Writes random bf16 weights of `cfg`'s video stream (and with `audio` its audio stream and audio-video
/// cross-attentions) under the official single-file names to `path` with the `config` metadata, one tensor in
/// memory at a time; returns the file size.
pub fn write_random_ltx2_dit(
    path: &Path,
    cfg: &Ltx2Config,
    seed: u64,
    audio: bool,
) -> anyhow::Result<u64> {
    let mut shapes = video_stream_shapes(cfg);
    if audio {
        shapes.extend(audio_stream_shapes(cfg));
    }
    let weights = shapes.into_iter().map(|(name, shape)| {
        let (mean, std) = ltx2_init_stats(&name, &shape);
        RandomWeight {
            name: format!("model.diffusion_model.{name}"),
            shape,
            mean,
            std,
            fp8_scale: None,
        }
    });
    let metadata = HashMap::from([
        ("config".to_string(), metadata_config(cfg)),
        ("model_version".to_string(), "2.3.0".to_string()),
    ]);
    write_random_weights_with_metadata(path, weights, safetensors::Dtype::BF16, seed, metadata)
}

/// Writes the clip's latent and text caches (bf16; every text token valid) into `dir/cache`, and the empty
/// `videos/`.
fn write_cached_clip(
    dir: &Path,
    spec: &Ltx2SynthProject,
    latent: [usize; 4],
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let cache = clip_cache_dir(dir)?;
    let size = (spec.width as u32, spec.height as u32);
    let rng = &mut StdRng::seed_from_u64(mix(spec.seed, u64::MAX));
    let dev = &Device::Cpu;
    let latents = randn(rng, latent.as_slice(), 0.0, 1.0, dev)?.to_dtype(DType::BF16)?;
    let window = FrameWindow {
        start: 0,
        frames: spec.frames as u32,
    };
    let latent_path = cache.join(ltx2_latent_cache_name(ITEM_STEM, Some(window), size));
    write_ltx2_latent_cache(&latent_path, &latents, size, Some(spec.frames as u32))?;
    if spec.audio {
        let frames = ltx2_audio_frames(spec.frames);
        let shape = (AUDIO_CHANNELS, frames, AUDIO_MEL_BINS);
        let audio = Ltx2AudioCache {
            latents: randn(rng, shape, 0.0, 1.0, dev)?.to_dtype(DType::BF16)?,
            length: Some(frames),
        };
        let name = latent_path
            .file_name()
            .and_then(|n| ltx2_audio_cache_name(&n.to_string_lossy()))
            .ok_or_else(|| anyhow::anyhow!("no audio cache name for {}", latent_path.display()))?;
        write_ltx2_audio_cache(&cache.join(name), &audio)?;
    }
    let audio_text = if spec.audio {
        let width = spec.cfg.audio_cross_attention_dim;
        Some(randn(rng, (spec.text_tokens, width), 0.0, 1.0, dev)?.to_dtype(DType::BF16)?)
    } else {
        None
    };
    let width = spec.cfg.cross_attention_dim;
    let text = Ltx2TextCache {
        video_prompt_embeds: randn(rng, (spec.text_tokens, width), 0.0, 1.0, dev)?
            .to_dtype(DType::BF16)?,
        audio_prompt_embeds: audio_text,
        prompt_attention_mask: Some(Tensor::ones(spec.text_tokens, DType::I64, dev)?),
        caption: CAPTION.into(),
        encoding: None,
    };
    let text_path = cache.join(ltx2_text_cache_name(ITEM_STEM));
    write_ltx2_text_cache(&text_path, &text)?;
    Ok((latent_path, text_path))
}

#[cfg(test)]
#[allow(clippy::expect_used, clippy::unwrap_used)]
// test code: a failed expectation is the test failing
mod tests {
    use super::*;

    /// The project trains as written: the DiT is an LTX-2.3 file of its sizes and the caches read back.
    #[test]
    fn a_tiny_project_is_an_ltx2_project() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let mut cfg = Ltx2Config::ltx23_22b();
        cfg.num_attention_heads = 2;
        cfg.attention_head_dim = 8;
        cfg.in_channels = 4;
        cfg.out_channels = 4;
        cfg.num_layers = 2;
        cfg.cross_attention_dim = 16;
        let spec = Ltx2SynthProject {
            cfg: cfg.clone(),
            height: 64,
            width: 96,
            frames: 17,
            seed: 3,
            text_tokens: 5,
            steps: 2,
            rank: 4,
            audio: false,
        };
        let files = write_ltx2_project(dir.path(), &spec)?;
        let dit = framesmith_models::ltx2::weights::identify(&files.dit)?;
        assert_eq!(dit.config, cfg);
        assert!(dit.embedded_config);
        let latents = framesmith_data::family::ltx2::cache::read_ltx2_latent_cache(
            &files.latents,
            &Device::Cpu,
        )?;
        assert_eq!(latents.dims(), &[4, 3, 2, 3]);
        let text =
            framesmith_data::family::ltx2::cache::read_ltx2_text_cache(&files.text, &Device::Cpu)?;
        assert_eq!(text.video_prompt_embeds.dims(), &[5, 16]);
        let config = framesmith_config::RunConfig::load(&files.run)?;
        assert_eq!((config.lora.rank, config.training.max_train_steps), (4, 2));
        assert!(ltx2_latent_shape(&Ltx2SynthProject {
            frames: 16,
            ..spec.clone()
        })
        .is_err());

        // With audio: both streams in the file, the audio latents and audio text beside the clip's.
        let mut av = spec;
        av.cfg.audio_num_attention_heads = 2;
        av.cfg.audio_attention_head_dim = 8;
        av.cfg.audio_cross_attention_dim = 16;
        av.audio = true;
        let av_dir = dir.path().join("av");
        let files = write_ltx2_project(&av_dir, &av)?;
        let names = safetensors_names(&files.dit)?;
        assert!(names
            .iter()
            .any(|n| n.ends_with("transformer_blocks.1.video_to_audio_attn.to_q.weight")));
        let audio_path = files
            .latents
            .file_name()
            .and_then(|n| ltx2_audio_cache_name(&n.to_string_lossy()))
            .map(|n| files.latents.with_file_name(n))
            .expect("an audio cache name");
        let audio =
            framesmith_data::family::ltx2::cache::read_ltx2_audio_cache(&audio_path, &Device::Cpu)?;
        assert_eq!(audio.latents.dims(), &[8, 17, 16]);
        let text =
            framesmith_data::family::ltx2::cache::read_ltx2_text_cache(&files.text, &Device::Cpu)?;
        assert_eq!(
            text.audio_prompt_embeds.expect("audio text").dims(),
            &[5, 16]
        );
        Ok(())
    }

    fn safetensors_names(path: &Path) -> anyhow::Result<Vec<String>> {
        let bytes = std::fs::read(path)?;
        let st = safetensors::SafeTensors::deserialize(&bytes)?;
        Ok(st.names().into_iter().map(String::from).collect())
    }
}
