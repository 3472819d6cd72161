//! Sound for LTX-2 samples: the audio VAE's decoder and the vocoder read from the checkpoint, audio latents (or the
//! audio stream's tokens) turned into a stereo waveform at the vocoder's rate, and that waveform muxed into a
//! sample's MP4 with ffmpeg.

use std::path::Path;

use anyhow::Context;
use candle_core::{DType, Device, Tensor};

use framesmith_data::media::audio::AudioClip;
use framesmith_data::media::{MediaBackend, MediaTools};
use framesmith_models::ltx2::audio::{
    decode_audio, identify_audio, load_ltx2_audio, unpatchify_audio, AudioVae, Ltx2AudioParts,
    Vocoder,
};

/// The audio VAE's decoder and the vocoder (frozen).
pub struct Ltx2SoundDecoder {
    vae: AudioVae,
    vocoder: Vocoder,
}

impl Ltx2SoundDecoder {
    /// Reads the decoder and the vocoder of the LTX-2 checkpoint (or audio VAE file) `path` in `dtype` on `device`.
    pub fn load(path: &Path, dtype: DType, device: &Device) -> anyhow::Result<Self> {
        let parts = Ltx2AudioParts {
            encoder: false,
            decoder: true,
            vocoder: true,
        };
        let (vae, vocoder) = load_ltx2_audio(path, parts, dtype, device)?;
        let vocoder = vocoder.context("the checkpoint's vocoder")?;
        Ok(Self { vae, vocoder })
    }

    /// The latent channels the decoder takes.
    pub fn channels(&self) -> usize {
        self.vae.config().z_channels
    }

    /// The sound of normalised audio latents `latents` ([C, T, mel] as the caches hold them, or [1, C, T, mel]).
    pub fn decode_audio(&self, latents: &Tensor) -> anyhow::Result<AudioClip> {
        let z = match latents.rank() {
            3 => latents.unsqueeze(0)?,
            4 if latents.dim(0)? == 1 => latents.clone(),
            _ => anyhow::bail!(
                "audio latents of one sample must be [C, T, mel] or [1, C, T, mel], got {:?}",
                latents.dims()
            ),
        };
        let z = z.to_device(self.vae.device())?;
        let wave = decode_audio(&self.vae, &self.vocoder, &z)?.squeeze(0)?;
        let planes = (0..wave.dim(0)?)
            .map(|c| {
                wave.get(c)?
                    .to_dtype(DType::F32)?
                    .to_device(&Device::Cpu)?
                    .to_vec1::<f32>()
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(AudioClip::from_planar(
            self.vocoder.output_sampling_rate() as u32,
            &planes,
        ))
    }

    /// The sound of the audio stream's tokens [1, T, C·mel] (what the transformer's audio stream denoises).
    pub fn decode_tokens(&self, tokens: &Tensor) -> anyhow::Result<AudioClip> {
        self.decode_audio(&unpatchify_audio(tokens, self.channels())?)
    }
}

/// The first of `candidates` (each with the setting that names it) holding the audio VAE's decoder and the
/// vocoder, checked against the transformer's audio stream of `audio_in_channels` (channels × mel bins per latent
/// frame), from the files' headers; none holding them is refused, naming each file and what to pass (`what`:
/// "model.dit", "--dit", …).
pub fn sound_file<'a>(
    candidates: &[&'a Path],
    audio_in_channels: usize,
    what: &str,
) -> anyhow::Result<&'a Path> {
    let mut problems = Vec::new();
    for &path in candidates {
        match identify_audio(path) {
            Ok(file) if file.decoder && file.vocoder.is_some() => {
                let c = &file.config;
                let per_frame = c.z_channels * c.latent_mel_bins();
                if per_frame != audio_in_channels {
                    anyhow::bail!(
                        "the audio VAE of {} makes latents of {per_frame} channels × mel bins a frame, but the \
                         transformer's audio stream takes {audio_in_channels} (the audio VAE of another release?): \
                         give the checkpoint matching the transformer",
                        path.display()
                    );
                }
                return Ok(path);
            }
            Ok(file) => problems.push(format!(
                "{} holds no audio {}",
                path.display(),
                if file.decoder {
                    "vocoder"
                } else {
                    "VAE decoder"
                }
            )),
            Err(e) => problems.push(format!("{e}")),
        }
    }
    anyhow::bail!(
        "sound needs LTX-2's audio VAE decoder and vocoder ({}); point {what} at the official ltx-2-19b-* or \
         ltx-2.3-22b-* checkpoint, which holds them",
        problems.join("; ")
    )
}

/// The ffmpeg that muxes sound into clips (Windows' Media Foundation, which reads videos, writes no sound), found
/// beside the executable or on `PATH`.
pub fn muxer() -> anyhow::Result<MediaTools> {
    match MediaTools::locate() {
        Ok(tools) if tools.backend == MediaBackend::Ffmpeg => Ok(tools),
        _ => anyhow::bail!(
            "sound is muxed into the MP4 by ffmpeg, which is not found: install ffmpeg (on PATH, or beside the \
             framesmith executable)"
        ),
    }
}

/// Muxes `sound` into the sample clip `mp4` (its video kept as it is, the sound as AAC) with ffmpeg.
pub fn mux_sound(mp4: &Path, sound: &AudioClip) -> anyhow::Result<()> {
    let tools = muxer()?;
    tools
        .mux_audio(mp4, sound)
        .with_context(|| format!("adding the sound to {}", mp4.display()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use framesmith_data::video::encode::{write_mp4, RgbFrame};

    fn fixture(name: &str) -> std::path::PathBuf {
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../framesmith-models/tests/fixtures/ltx2")
            .join(name)
    }

    /// The fixture's latents decode to ltx-core's waveform, from the cache layout and from tokens, and the sound is
    /// muxed into a sample clip.
    #[test]
    fn latents_decode_to_ltx_cores_waveform_and_mux_into_the_sample() -> anyhow::Result<()> {
        let dir = fixture("audio_ltx2");
        let decoder =
            Ltx2SoundDecoder::load(&dir.join("weights.safetensors"), DType::F32, &Device::Cpu)?;
        let inputs = candle_core::safetensors::load(dir.join("inputs.safetensors"), &Device::Cpu)?;
        let expected =
            candle_core::safetensors::load(dir.join("expected.safetensors"), &Device::Cpu)?;
        let latents = inputs["latents"].squeeze(0)?;
        let sound = decoder.decode_audio(&latents)?;
        let want = &expected["waveform"];
        assert_eq!((sound.channels, sound.frames()), (2, want.dim(1)?));
        assert_eq!(sound.sample_rate, 600);
        for c in 0..2 {
            let want = want.get(c)?.to_vec1::<f32>()?;
            let worst = sound
                .channel(c)
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(worst < 1e-4, "channel {c}: {worst}");
        }
        let (c, t, f) = latents.dims3()?;
        let tokens = latents.transpose(0, 1)?.reshape((1, t, c * f))?;
        assert_eq!(decoder.decode_tokens(&tokens)?, sound);
        assert!(decoder
            .decode_audio(&inputs["latents"].repeat((2, 1, 1, 1))?)
            .is_err());

        if MediaTools::locate().is_err() {
            return Ok(());
        }
        let tmp = tempfile::tempdir()?;
        let mp4 = tmp.path().join("sample.mp4");
        let frame = RgbFrame {
            width: 32,
            height: 32,
            data: vec![60; 32 * 32 * 3],
        };
        write_mp4(&mp4, &vec![frame; 5], 24.0)?;
        mux_sound(&mp4, &sound)?;
        assert_eq!(MediaTools::locate()?.audio_channels(&mp4)?, Some(2));
        Ok(())
    }
}
