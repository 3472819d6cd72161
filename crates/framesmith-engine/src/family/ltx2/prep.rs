//! LTX-2's latent pass: the video VAE's normalised latents of every image and clip, written as the `_ltx2`
//! caches the LTX-2 run reads (musubi-tuner's LTX-2 branch's names and keys, `latents_{F}x{H}x{W}_{dtype}`).
//! Sides come in steps of the VAE's spatial factor and clips must have a multiple of its temporal factor plus one
//! frames (for the releases 32 and 8k + 1, as the official trainer requires); clips are thinned to 24 fps when the dataset gives `source_fps` (the rate the run's positions assume). The VAE is read
//! from the official checkpoint (`--vae`, or `--dit` alone: the same file holds it); `--tiled` encodes in
//! ltx-core's tiles of 512 pixels with 128 shared (the official trainer's sizes). A pass is LTX-2's when `--dit`
//! names its transformer or `--vae` a file holding its VAE. When that file also holds the audio VAE (the official
//! checkpoints do), each clip with sound gets its `_ltx2_audio` cache too ([`audio`]), and videos without sound are
//! named in the summary's warnings.

use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::{DType, Device};
use image::RgbImage;

use super::train::is_ltx2_file;
use crate::family::image::clip_prep::{cache_clip_latents, ClipLatents};
use crate::prep::pass::{load_dataset, CacheRequest, LatentFiles};
use crate::prep::{frames_to_video, header, CacheOptions, CacheProgress, CacheSummary};
use framesmith_data::family::ltx2::cache::{
    ltx2_latent_cache_name, write_ltx2_latent_cache, LTX2_ARCHITECTURE, LTX2_SUFFIX,
};
use framesmith_data::media::{MediaTools, FFMPEG_INSTALL_HINT};
use framesmith_data::samples::Sample;
use framesmith_data::{DatasetKind, FrameExtraction, ValidConfig};
use framesmith_models::ltx2::audio::{identify_audio, load_ltx2_audio, AudioVae, Ltx2AudioParts};
use framesmith_models::ltx2::vae::{identify_vae, load_ltx2_vae, AxisTiles, Ltx2Vae, VaeTiling};

mod audio;
pub use audio::Ltx2AudioEncoder;

/// The VAE's compression, which the samples must fit: bucket sides are multiples of `space` (32 for the
/// releases), clips `time`·k + 1 frames (8k + 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Steps {
    pub space: u32,
    pub time: usize,
}
/// The frame rate clips are thinned to when the dataset gives `source_fps` (the run's positions assume it).
pub const TARGET_FPS: f64 = 24.0;

/// The spatial tiles of `--tiled` (the official trainer's `process_videos.py` sizes).
pub fn cache_tiling() -> VaeTiling {
    let space = Some(AxisTiles {
        tile: 512,
        overlap: 128,
    });
    VaeTiling {
        frames: None,
        height: space,
        width: space,
    }
}

/// The file holding the VAE: `--vae`, else the `--dit` checkpoint.
fn vae_file(files: &LatentFiles) -> Option<PathBuf> {
    if !files.vae.as_os_str().is_empty() {
        return Some(files.vae.clone());
    }
    files.dit.clone()
}

/// Whether the latent pass `files` caches for LTX-2.
pub(super) fn is_ltx2_latent_pass(files: &LatentFiles) -> bool {
    files.dit.as_deref().is_some_and(is_ltx2_file)
        || vae_file(files).is_some_and(|p| identify_vae(&p).is_ok())
}

/// Every clip length the datasets ask for that is not `steps.time`·k + 1, as one message per dataset.
pub fn frame_count_problems(valid: &ValidConfig, steps: Steps) -> Vec<String> {
    let t = steps.time;
    let examples: Vec<String> = [0, 1, 2, 3, 4, 6, 8, 10, 12, 15]
        .iter()
        .map(|k| (k * t + 1).to_string())
        .collect();
    let examples = examples.join(", ");
    let mut out = Vec::new();
    for ds in &valid.datasets {
        let Some(params) = ds.video.as_ref() else {
            continue;
        };
        let bad: Vec<u32> = params
            .target_frames
            .iter()
            .copied()
            .filter(|&f| f as usize % t != 1 % t)
            .collect();
        if params.frame_extraction == FrameExtraction::Full {
            out.push(format!(
                "dataset {}: frame_extraction \"full\" gives clips of any length, and LTX-2 needs {t}k + 1 frames: \
                 use \"head\", \"chunk\", \"slide\" or \"uniform\" with target_frames (e.g. {examples})",
                ds.index + 1
            ));
        } else if !bad.is_empty() {
            out.push(format!(
                "dataset {}: target_frames {bad:?} are not of the form {t}k + 1, which LTX-2's VAE needs (e.g. \
                 {examples})",
                ds.index + 1
            ));
        }
    }
    out
}

/// The latent pass with LTX-2's video VAE.
pub(super) fn latents(
    request: &CacheRequest<'_>,
    files: &LatentFiles,
    progress: &mut dyn CacheProgress,
    log: &mut dyn FnMut(&str),
) -> anyhow::Result<CacheSummary> {
    if let Some(clip) = &files.clip {
        anyhow::bail!(
            "LTX-2 conditions on no image encoder; drop --clip: {}",
            clip.display()
        );
    }
    let vae_path = vae_file(files).context(
        "LTX-2's VAE is in the official checkpoint: give it with --vae (or --dit) ltx-2-19b-*.safetensors or \
         ltx-2.3-22b-*.safetensors",
    )?;
    let file = identify_vae(&vae_path)?;
    let (space, time) = file.config.encoder_factors();
    let steps = Steps {
        space: space as u32,
        time,
    };
    let valid = load_dataset(request, log)?;
    let problems = frame_count_problems(&valid, steps);
    if !problems.is_empty() {
        anyhow::bail!("{}: {}", problems.join("; "), request.dataset.display());
    }
    let tools = MediaTools::locate().ok();
    if tools.is_none()
        && valid
            .datasets
            .iter()
            .any(|d| d.kind() == DatasetKind::Video)
    {
        log(&format!(
            "warning: ffmpeg was not found, so video files cannot be decoded; {FFMPEG_INSTALL_HINT}"
        ));
    }
    let (device, dtype) = (request.open)()?;
    let vae = load_ltx2_vae(&vae_path, dtype, &device)?;
    log(&format!(
        "VAE: LTX-2 video VAE, {} latent channels, on {device:?} in {dtype:?}{}",
        vae.config().latent_channels,
        if files.tiled {
            ", tiles of 512 pixels"
        } else {
            ""
        }
    ));
    if files.i2v {
        log("image-to-video: the first latent frame of each clip is its conditioning; the caches need nothing more");
    }
    let audio_vae = load_audio_encoder(&vae_path, &valid, tools.as_ref(), (dtype, &device), log)?;
    let audio = match (&audio_vae, &tools) {
        (Some(vae), Some(tools)) => Some(Ltx2AudioEncoder {
            vae,
            tools,
            dtype,
            silent: Default::default(),
        }),
        _ => None,
    };
    let encoder = Ltx2LatentEncoder {
        vae: &vae,
        device,
        dtype,
        tiling: files.tiled.then(cache_tiling),
        steps,
        audio,
    };
    let options = CacheOptions {
        keep_stale: request.keep_stale,
    };
    cache_ltx2_latents(&valid, tools.as_ref(), &encoder, &options, progress)
}

/// The audio VAE's encoder, when the file holds it, the datasets have videos and ffmpeg is there to decode their
/// sound (said in the log either way).
fn load_audio_encoder(
    path: &Path,
    valid: &ValidConfig,
    tools: Option<&MediaTools>,
    (dtype, device): (DType, &Device),
    log: &mut dyn FnMut(&str),
) -> anyhow::Result<Option<AudioVae>> {
    if !valid
        .datasets
        .iter()
        .any(|d| d.kind() == DatasetKind::Video)
    {
        return Ok(None);
    }
    let file = match identify_audio(path) {
        Ok(file) if file.encoder => file,
        _ => {
            log("no audio VAE in this file: clips are cached without their sound (text-to-video training)");
            return Ok(None);
        }
    };
    if tools.is_none() {
        log("warning: ffmpeg was not found, so the clips' sound cannot be decoded: no _ltx2_audio caches");
        return Ok(None);
    }
    let parts = Ltx2AudioParts {
        encoder: true,
        decoder: false,
        vocoder: false,
    };
    let (vae, _) = load_ltx2_audio(path, parts, dtype, device)?;
    log(&format!(
        "audio VAE: clips with sound get _ltx2_audio caches ({} Hz, {} mel bins, {} latent channels)",
        file.config.sample_rate, file.config.mel_bins, file.config.z_channels
    ));
    Ok(Some(vae))
}

/// The VAE side of the pass.
pub struct Ltx2LatentEncoder<'a> {
    pub vae: &'a Ltx2Vae,
    pub device: Device,
    /// Dtype the frames are fed and the latents stored in.
    pub dtype: DType,
    /// Tiles, for frames larger than a tile.
    pub tiling: Option<VaeTiling>,
    /// The VAE's compression.
    pub steps: Steps,
    /// The audio VAE, for clips' sound (`_ltx2_audio` caches) when the file holds it.
    pub audio: Option<Ltx2AudioEncoder<'a>>,
}

impl Ltx2LatentEncoder<'_> {
    fn latents_cached(path: &Path) -> bool {
        header::complete_cache(path, &["latents_"], LTX2_ARCHITECTURE).is_some()
    }

    /// Whether an item's caches are complete: its latents, and a clip's sound's when the audio VAE is there.
    fn cached(&self, media: &Path, path: &Path) -> bool {
        Self::latents_cached(path) && self.audio.as_ref().is_none_or(|a| a.cached(media, path))
    }

    /// The latents `[C, F, H, W]` of a clip or image in `self.dtype` on the CPU.
    pub fn encode(&self, frames: &[RgbImage]) -> anyhow::Result<candle_core::Tensor> {
        let t = self.steps.time;
        if frames.len() % t != 1 % t {
            anyhow::bail!(
                "a clip of {} frames; LTX-2 needs {t}k + 1 frames (set target_frames to such counts)",
                frames.len()
            );
        }
        let video = frames_to_video(frames, &self.device)?;
        let latents = match &self.tiling {
            Some(t) => self.vae.encode_tiled(&video, t)?,
            None => self.vae.encode(&video)?,
        };
        Ok(latents
            .squeeze(0)?
            .to_dtype(self.dtype)?
            .to_device(&Device::Cpu)?)
    }
}

/// Writes the `_ltx2` latent cache of every image and clip of the dataset config.
pub fn cache_ltx2_latents(
    valid: &ValidConfig,
    tools: Option<&MediaTools>,
    encoder: &Ltx2LatentEncoder,
    options: &CacheOptions,
    progress: &mut dyn CacheProgress,
) -> anyhow::Result<CacheSummary> {
    let write = |sample: &Sample, path: &Path| -> anyhow::Result<()> {
        if !Ltx2LatentEncoder::latents_cached(path) {
            let latents = encoder.encode(&sample.frames)?;
            let frames = sample.window.map(|w| w.frames);
            write_ltx2_latent_cache(path, &latents, sample.original_size, frames)?;
        }
        match (&encoder.audio, sample.window) {
            (Some(audio), Some(_)) => audio.write(sample, path),
            _ => Ok(()),
        }
    };
    let latents = ClipLatents {
        suffix: LTX2_SUFFIX,
        name: ltx2_latent_cache_name,
        step: encoder.steps.space,
        fps: TARGET_FPS,
        cached: &|media: &Path, path: &Path| encoder.cached(media, path),
        write: &write,
    };
    let mut summary = cache_clip_latents(valid, tools, &latents, options, progress)?;
    if let Some(warning) = encoder
        .audio
        .as_ref()
        .and_then(Ltx2AudioEncoder::silent_warning)
    {
        summary.warnings.push(warning);
    }
    Ok(summary)
}

// Tests may unwrap (STYLE.md: no unwrap outside tests).
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
