//! The audio VAE and vocoder against ltx-core's fixtures (`tests/fixtures/ltx2/audio_*`, made by
//! `bench/reference/ltx2_audio.py`): the mel spectrogram, the encoded latents, the decoded spectrogram and the
//! vocoded waveform of LTX-2's plain vocoder and LTX-2.3's with bandwidth extension, the files read with their
//! metadata, and the errors of files and shapes they refuse.

use candle_core::{DType, Device, Tensor};

use super::*;
use crate::fixtures::{assert_close, FixtureCase};
use crate::ltx2::testkit::fixtures_dir;

const ATOL: f64 = 1e-4;
const RTOL: f64 = 1e-4;

const ALL: Ltx2AudioParts = Ltx2AudioParts {
    encoder: true,
    decoder: true,
    vocoder: true,
};

fn case(name: &str) -> anyhow::Result<(FixtureCase, AudioVae, Vocoder)> {
    let dir = fixtures_dir().join(name);
    let case = FixtureCase::load_dir(&dir)?;
    let (vae, vocoder) = load_ltx2_audio(
        &dir.join("weights.safetensors"),
        ALL,
        DType::F32,
        &Device::Cpu,
    )?;
    let vocoder = vocoder.ok_or_else(|| anyhow::anyhow!("{name}: no vocoder"))?;
    Ok((case, vae, vocoder))
}

fn check_case(name: &str) -> anyhow::Result<()> {
    let (c, vae, vocoder) = case(name)?;
    let waveform = c.input("waveform")?;
    assert_close("mel", &vae.mel(waveform)?, c.expected("mel")?, ATOL, RTOL)?;
    assert_close(
        "encoded",
        &vae.encode(waveform)?,
        c.expected("encoded")?,
        ATOL,
        RTOL,
    )?;
    let latents = c.input("latents")?;
    let mel = vae.decode(latents)?;
    assert_close("decoded_mel", &mel, c.expected("decoded_mel")?, ATOL, RTOL)?;
    let wave = vocoder.forward(&mel)?.squeeze(0)?;
    assert_close("waveform", &wave, c.expected("waveform")?, ATOL, RTOL)?;
    // The same from the audio stream's tokens, as a sampler has them.
    let (b, ch, t, f) = latents.dims4()?;
    let tokens = latents.transpose(1, 2)?.reshape((b, t, ch * f))?;
    let wave = decode_audio(&vae, &vocoder, &unpatchify_audio(&tokens, ch)?)?.squeeze(0)?;
    assert_close(
        "waveform from tokens",
        &wave,
        c.expected("waveform")?,
        ATOL,
        RTOL,
    )?;
    let rate = c.config["output_sampling_rate"].as_u64().unwrap_or(0) as usize;
    assert_eq!(vocoder.output_sampling_rate(), rate);
    Ok(())
}

#[test]
fn ltx2_audio_vae_and_vocoder_match_ltx_core() -> anyhow::Result<()> {
    check_case("audio_ltx2")
}

#[test]
fn ltx23_attention_and_bandwidth_extension_match_ltx_core() -> anyhow::Result<()> {
    check_case("audio_ltx23")
}

#[test]
fn a_perturbed_reference_fails() -> anyhow::Result<()> {
    let (c, vae, _) = case("audio_ltx2")?;
    let expected = c.expected("encoded")?;
    let bumped = (expected + 1e-2)?;
    assert!(assert_close(
        "encoded",
        &vae.encode(c.input("waveform")?)?,
        &bumped,
        ATOL,
        RTOL
    )
    .is_err());
    Ok(())
}

#[test]
fn the_file_is_identified_with_its_parts() -> anyhow::Result<()> {
    let dir = fixtures_dir();
    let two = identify_audio(&dir.join("audio_ltx2/weights.safetensors"))?;
    assert!(two.encoder && two.decoder);
    assert_eq!(
        (two.config.z_channels, two.config.latent_mel_bins()),
        (1, 16)
    );
    assert!(two.vocoder.as_ref().is_some_and(|v| v.bwe.is_none()));
    let three = identify_audio(&dir.join("audio_ltx23/weights.safetensors"))?;
    assert!(three.vocoder.as_ref().is_some_and(|v| v.bwe.is_some()));
    // The video VAE's fixture holds no audio VAE: the error names the file and what to give.
    let video = dir.join("vae_ltx2/weights.safetensors");
    let err = identify_audio(&video).unwrap_err().to_string();
    assert!(
        err.contains("no LTX-2 audio VAE") && err.ends_with("weights.safetensors"),
        "{err}"
    );
    Ok(())
}

#[test]
fn shapes_it_cannot_take_are_refused() -> anyhow::Result<()> {
    let (_, vae, vocoder) = case("audio_ltx2")?;
    let mono = Tensor::zeros((1, 1, 4000), DType::F32, &Device::Cpu)?;
    assert!(vae
        .encode(&mono)
        .unwrap_err()
        .to_string()
        .contains("2-channel"));
    let short = Tensor::zeros((1, 2, 100), DType::F32, &Device::Cpu)?;
    assert!(vae
        .encode(&short)
        .unwrap_err()
        .to_string()
        .contains("too short"));
    let latents = Tensor::zeros((1, 3, 4, 16), DType::F32, &Device::Cpu)?;
    assert!(vae.decode(&latents).is_err());
    let mel = Tensor::zeros((1, 2, 5, 32), DType::F32, &Device::Cpu)?;
    assert!(vocoder
        .forward(&mel)
        .unwrap_err()
        .to_string()
        .contains("stereo mel"));
    Ok(())
}

#[test]
fn configs_take_the_configurator_defaults_and_refuse_unknown_switches() {
    let cfg = AudioVaeConfig::from_json(
        &serde_json::json!({"model": {"params": {"ddconfig": {"mel_bins": 64}}}}),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (cfg.ch, cfg.z_channels, cfg.latent_mel_bins()),
        (128, 8, 16)
    );
    assert_eq!(
        (cfg.sample_rate, cfg.hop_length, cfg.n_fft),
        (16000, 160, 1024)
    );
    assert_eq!(cfg.causality, Causality::Height);
    assert_eq!(cfg.decoded_frames(26), 101);
    let group = serde_json::json!({"model": {"params": {"ddconfig": {"mel_bins": 64, "norm_type": "group"}}}});
    assert!(AudioVaeConfig::from_json(&group).is_err());
    let no_mels = serde_json::json!({"model": {"params": {"ddconfig": {}}}});
    assert!(AudioVaeConfig::from_json(&no_mels).is_err());
    let plain = VocoderConfig::from_json(&serde_json::json!({})).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (
            plain.output_sampling_rate(),
            plain.vocoder.upsample_rates.len()
        ),
        (24000, 5)
    );
    let mono = serde_json::json!({"stereo": false});
    assert!(VocoderConfig::from_json(&mono).is_err());
}
