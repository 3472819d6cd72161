//! Parity for fixture kind `ltx2_audio` (LTX-2's audio VAE and vocoder against ltx-core's `AudioProcessor`,
//! `AudioEncoder`, `AudioDecoder` and `Vocoder` / `VocoderWithBWE`, `bench/reference/ltx2_audio.py`): the log-mel
//! of a waveform, its normalised latents, the spectrogram decoded from latents and the waveform vocoded from it.

use anyhow::Context;
use candle_core::{DType, Device};

use super::{compare, Fixture, ParityRow, OUTPUT_REL_TOL};
use framesmith_models::ltx2::audio::{audio_from_tensors, AudioVaeConfig, VocoderConfig};

/// Runs the audio VAE and vocoder of an `ltx2_audio` fixture and compares every expected tensor.
pub fn check(fixture: &Fixture) -> anyhow::Result<Vec<ParityRow>> {
    let audio = AudioVaeConfig::from_json(&fixture.config["audio_vae"])
        .map_err(anyhow::Error::msg)
        .context("config.json `audio_vae` is not an LTX-2 audio VAE config")?;
    let vocoder = VocoderConfig::from_json(&fixture.config["vocoder"])
        .map_err(anyhow::Error::msg)
        .context("config.json `vocoder` is not an LTX-2 vocoder config")?;
    let (vae, vocoder) = audio_from_tensors(
        &fixture.weights,
        (&audio, &vocoder),
        DType::F32,
        &Device::Cpu,
    )
    .context("the fixture's weights are no LTX-2 audio VAE and vocoder")?;
    let waveform = fixture.input("waveform")?;
    let mel = vae.decode(fixture.input("latents")?)?;
    Ok(vec![
        compare(
            "mel",
            &vae.mel(waveform)?,
            fixture.expected("mel")?,
            OUTPUT_REL_TOL,
        )?,
        compare(
            "encoded",
            &vae.encode(waveform)?,
            fixture.expected("encoded")?,
            OUTPUT_REL_TOL,
        )?,
        compare(
            "decoded_mel",
            &mel,
            fixture.expected("decoded_mel")?,
            OUTPUT_REL_TOL,
        )?,
        compare(
            "waveform",
            &vocoder.forward(&mel)?.squeeze(0)?,
            fixture.expected("waveform")?,
            OUTPUT_REL_TOL,
        )?,
    ])
}

#[cfg(test)]
mod tests {
    use super::super::tests::assert_cases_pass_and_a_perturbed_row_fails;

    #[test]
    fn both_cases_pass_and_a_perturbed_waveform_fails() -> anyhow::Result<()> {
        assert_cases_pass_and_a_perturbed_row_fails(
            "ltx2",
            &[("audio_ltx2", 4), ("audio_ltx23", 4)],
            ("audio_ltx23", "waveform"),
        )
    }
}
