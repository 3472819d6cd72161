//! The audio half of LTX-2's latent pass: each clip's sound, cut to the clip's span of its video file and decoded
//! by ffmpeg at the audio VAE's sample rate, made stereo as musubi-tuner's LTX-2 branch does (mono doubled, more
//! than two channels averaged and doubled), padded with silence to the clip's length as the official trainer's
//! `process_videos.py` does, encoded by the audio VAE and written as the `_ltx2_audio` cache beside the clip's
//! latents (`audio_lengths`: the latent frames that hold sound). Clips without sound are remembered so the pass
//! can name them.

use std::cell::RefCell;
use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::{DType, Device, Tensor};

use crate::prep::header;
use framesmith_data::family::ltx2::cache::{
    ltx2_audio_cache_name, write_ltx2_audio_cache, Ltx2AudioCache, LTX2_ARCHITECTURE,
};
use framesmith_data::media::audio::AudioClip;
use framesmith_data::media::MediaTools;
use framesmith_data::probe::is_video;
use framesmith_data::samples::Sample;
use framesmith_models::ltx2::audio::{AudioVae, LATENT_DOWNSAMPLE_FACTOR};

/// The audio side of the pass.
pub struct Ltx2AudioEncoder<'a> {
    pub vae: &'a AudioVae,
    pub tools: &'a MediaTools,
    /// Dtype the latents are stored in.
    pub dtype: DType,
    /// Clips (their video files) found without sound during the pass.
    pub silent: RefCell<Vec<PathBuf>>,
}

/// The `_ltx2_audio` cache beside the latent cache `latent_path`.
pub fn audio_cache_path(latent_path: &Path) -> Option<PathBuf> {
    let name = latent_path.file_name()?.to_string_lossy().into_owned();
    Some(latent_path.with_file_name(ltx2_audio_cache_name(&name)?))
}

/// Two planes of `clip`'s sound, each `len` samples (cut or padded with silence): mono doubled, stereo as it is,
/// more channels averaged and doubled.
fn stereo(clip: &AudioClip, len: usize) -> [Vec<f32>; 2] {
    let fit = |mut v: Vec<f32>| {
        v.resize(len, 0.0);
        v
    };
    match clip.channels {
        2 => [fit(clip.channel(0)), fit(clip.channel(1))],
        1 => {
            let mono = fit(clip.channel(0));
            [mono.clone(), mono]
        }
        c => {
            let mono: Vec<f32> = clip
                .samples
                .chunks_exact(c)
                .map(|frame| frame.iter().sum::<f32>() / c as f32)
                .collect();
            let mono = fit(mono);
            [mono.clone(), mono]
        }
    }
}

impl Ltx2AudioEncoder<'_> {
    /// Whether the item `media` cached at `latent_path` needs no more audio cache: an image or a folder of
    /// frames, a clip whose audio cache is complete, or a video without sound (remembered).
    pub fn cached(&self, media: &Path, latent_path: &Path) -> bool {
        if !is_video(media) || self.audio_cached(latent_path) {
            return true;
        }
        let silent = matches!(self.tools.audio_channels(media), Ok(None));
        if silent {
            self.silent.borrow_mut().push(media.to_path_buf());
        }
        silent
    }

    fn audio_cached(&self, latent_path: &Path) -> bool {
        audio_cache_path(latent_path).is_some_and(|p| {
            header::complete_cache(&p, &["audio_latents_"], LTX2_ARCHITECTURE).is_some()
        })
    }

    /// The audio latents [C, T, mel] of `clip` (stereo, `len` samples at the VAE's rate) and the latent frames
    /// that hold its `real` samples of sound.
    pub fn encode(&self, planes: &[Vec<f32>; 2], real: usize) -> anyhow::Result<Ltx2AudioCache> {
        let len = planes[0].len();
        let data: Vec<f32> = planes.iter().flatten().copied().collect();
        let waveform = Tensor::from_vec(data, (1, 2, len), self.vae.device())?;
        let latents = self
            .vae
            .encode(&waveform)?
            .squeeze(0)?
            .to_dtype(self.dtype)?
            .to_device(&Device::Cpu)?;
        let mel_frames = 1 + real / self.vae.config().hop_length;
        let with_sound = (mel_frames - 1) / LATENT_DOWNSAMPLE_FACTOR + 1;
        let t = latents.dim(1)?;
        Ok(Ltx2AudioCache {
            latents,
            length: Some(with_sound.min(t)),
        })
    }

    /// Writes the audio cache of `sample` beside its latent cache `latent_path`, unless it is complete already;
    /// a clip without sound (or not from a video file) is remembered, not written.
    pub fn write(&self, sample: &Sample, latent_path: &Path) -> anyhow::Result<()> {
        let Some(path) = audio_cache_path(latent_path) else {
            return Ok(());
        };
        if self.audio_cached(latent_path) {
            return Ok(());
        }
        let silent = || self.silent.borrow_mut().push(sample.media.clone());
        let Some((start, duration)) = sample.span_secs else {
            silent();
            return Ok(());
        };
        let rate = self.vae.config().sample_rate;
        let clip = self
            .tools
            .decode_audio(&sample.media, (start, duration), rate as u32)
            .with_context(|| format!("decoding the sound of {}", sample.media.display()))?;
        let Some(clip) = clip else {
            silent();
            return Ok(());
        };
        let len = (duration * rate as f64) as usize;
        let planes = stereo(&clip, len);
        let cache = self
            .encode(&planes, clip.frames().min(len))
            .with_context(|| format!("encoding the sound of {}", sample.media.display()))?;
        write_ltx2_audio_cache(&path, &cache)?;
        Ok(())
    }

    /// A warning naming the clips without sound, when there were any.
    pub fn silent_warning(&self) -> Option<String> {
        let mut silent = self.silent.borrow().clone();
        silent.sort();
        silent.dedup();
        if silent.is_empty() {
            return None;
        }
        let names: Vec<String> = silent.iter().map(|p| p.display().to_string()).collect();
        Some(format!(
            "warning: {} video(s) have no sound, so their clips have no _ltx2_audio cache (joint audio-video training \
             needs sound in every clip; text-to-video training uses them all): {}",
            silent.len(),
            names.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_become_stereo_as_musubi_tuner_makes_them() {
        let mono = AudioClip::from_planar(16000, &[vec![0.5, -0.5]]);
        assert_eq!(
            stereo(&mono, 3),
            [vec![0.5, -0.5, 0.0], vec![0.5, -0.5, 0.0]]
        );
        let two = AudioClip::from_planar(16000, &[vec![1.0, 2.0], vec![3.0, 4.0]]);
        assert_eq!(stereo(&two, 1), [vec![1.0], vec![3.0]]);
        let four = AudioClip::from_planar(16000, &[vec![1.0], vec![2.0], vec![3.0], vec![6.0]]);
        assert_eq!(stereo(&four, 1), [vec![3.0], vec![3.0]]);
        assert_eq!(
            audio_cache_path(Path::new("/c/a_00000-017_0064x0032_ltx2.safetensors")),
            Some(PathBuf::from(
                "/c/a_00000-017_0064x0032_ltx2_audio.safetensors"
            ))
        );
    }
}
