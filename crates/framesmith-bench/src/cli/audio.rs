//! `ltx2-audio`: LTX-2's audio VAE and vocoder at the size of the file given (the released architecture on the test
//! machine): a deterministic stereo waveform of `--seconds` encoded to latents, decoded to a spectrogram and vocoded
//! on the device, each timed after a warm-up, the device's outputs checked against the CPU's (f32) on a short piece
//! of the same waveform, and the vocoded sound muxed into an MP4 beside a still video when ffmpeg is there.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};

use framesmith_data::media::audio::{write_wav, AudioClip};
use framesmith_data::media::MediaTools;
use framesmith_data::video::encode::{write_mp4, RgbFrame};
use framesmith_models::ltx2::audio::{load_ltx2_audio, AudioVae, Ltx2AudioParts, Vocoder};

#[derive(clap::Args)]
pub(crate) struct AudioArgs {
    /// The file holding the audio VAE and the vocoder (an LTX-2 checkpoint).
    #[arg(long)]
    file: PathBuf,
    /// Length of the waveform encoded and decoded on the device.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Length of the piece checked against the CPU.
    #[arg(long, default_value_t = 1.0)]
    check_seconds: f64,
    /// `bf16` or `f32` weights on the device.
    #[arg(long, default_value = "bf16")]
    dtype: String,
    /// Where the vocoded WAV and MP4 go.
    #[arg(long)]
    out: PathBuf,
}

/// Two tones and a sweep, [1, 2, seconds · rate].
fn waveform(seconds: f64, rate: usize, dev: &Device) -> Result<Tensor> {
    let n = (seconds * rate as f64) as usize;
    let tau = std::f64::consts::TAU;
    let mut data = Vec::with_capacity(2 * n);
    for c in 0..2 {
        for i in 0..n {
            let t = i as f64 / rate as f64;
            let f = if c == 0 { 220.0 } else { 330.0 };
            let v = 0.3 * (tau * f * t).sin() + 0.2 * (tau * (200.0 + 800.0 * t) * t).sin();
            data.push(v as f32);
        }
    }
    Ok(Tensor::from_vec(data, (1, 2, n), dev)?)
}

fn rel(a: &Tensor, b: &Tensor) -> Result<f64> {
    let a = a.to_device(&Device::Cpu)?.to_dtype(DType::F64)?;
    let b = b.to_device(&Device::Cpu)?.to_dtype(DType::F64)?;
    let diff = (&a - &b)?.sqr()?.sum_all()?.to_scalar::<f64>()?.sqrt();
    Ok(diff / b.sqr()?.sum_all()?.to_scalar::<f64>()?.sqrt().max(1e-12))
}

fn load(args: &AudioArgs, dtype: DType, dev: &Device) -> Result<(AudioVae, Vocoder)> {
    let parts = Ltx2AudioParts {
        encoder: true,
        decoder: true,
        vocoder: true,
    };
    let (vae, vocoder) = load_ltx2_audio(&args.file, parts, dtype, dev)?;
    Ok((vae, vocoder.context("the file holds no vocoder")?))
}

/// Times `f` after one warm-up call, on `dev`.
fn timed(dev: &Device, f: impl Fn() -> Result<Tensor>) -> Result<(Tensor, f64)> {
    f()?;
    dev.synchronize()?;
    let t0 = Instant::now();
    let out = f()?;
    dev.synchronize()?;
    Ok((out, t0.elapsed().as_secs_f64() * 1000.0))
}

pub(crate) fn run_audio(dev: &Device, args: &AudioArgs) -> Result<()> {
    let dtype = match args.dtype.as_str() {
        "f32" => DType::F32,
        _ => DType::BF16,
    };
    let (vae, vocoder) = load(args, dtype, dev)?;
    let rate = vae.config().sample_rate;
    let wave = waveform(args.seconds, rate, dev)?;
    let (latents, encode_ms) = timed(dev, || Ok(vae.encode(&wave)?))?;
    let (mel, decode_ms) = timed(dev, || Ok(vae.decode(&latents)?))?;
    let (sound, vocoder_ms) = timed(dev, || Ok(vocoder.forward(&mel)?))?;
    let finite = sound
        .to_dtype(DType::F32)?
        .abs()?
        .max_all()?
        .to_scalar::<f32>()?
        .is_finite();

    // The same layers on the CPU in f32, on a short piece, against the device in f32.
    let (cpu_vae, cpu_vocoder) = load(args, DType::F32, &Device::Cpu)?;
    let (dev_vae, dev_vocoder) = load(args, DType::F32, dev)?;
    let piece = waveform(args.check_seconds, rate, &Device::Cpu)?;
    let want_latents = cpu_vae.encode(&piece)?;
    let got_latents = dev_vae.encode(&piece.to_device(dev)?)?;
    let want_sound = cpu_vocoder.forward(&cpu_vae.decode(&want_latents)?)?;
    let got_sound = dev_vocoder.forward(&dev_vae.decode(&want_latents.to_device(dev)?)?)?;
    let (latents_rel, sound_rel) = (
        rel(&got_latents, &want_latents)?,
        rel(&got_sound, &want_sound)?,
    );

    std::fs::create_dir_all(&args.out)?;
    let out_rate = vocoder.output_sampling_rate();
    let planes: Vec<Vec<f32>> = (0..2)
        .map(|c| -> Result<Vec<f32>> {
            Ok(sound
                .get(0)?
                .get(c)?
                .to_dtype(DType::F32)?
                .to_device(&Device::Cpu)?
                .to_vec1()?)
        })
        .collect::<Result<_>>()?;
    let clip = AudioClip::from_planar(out_rate as u32, &planes);
    write_wav(&args.out.join("ltx2-audio.wav"), &clip)?;
    let mp4 = args.out.join("ltx2-audio.mp4");
    let frames = (args.seconds * 24.0) as usize;
    let still = RgbFrame {
        width: 64,
        height: 64,
        data: vec![128; 64 * 64 * 3],
    };
    write_mp4(&mp4, &vec![still; frames.max(1)], 24.0)?;
    let muxed = match MediaTools::locate() {
        Ok(tools) => tools
            .mux_audio(&mp4, &clip)
            .map(|_| "yes".to_string())
            .unwrap_or_else(|e| format!("{e:#}")),
        Err(e) => format!("{e:#}"),
    };
    let line = serde_json::json!({
        "seconds": args.seconds,
        "dtype": args.dtype,
        "latent_shape": latents.dims(),
        "mel_shape": mel.dims(),
        "samples": sound.dim(2)?,
        "output_rate": out_rate,
        "encode_ms": encode_ms,
        "decode_ms": decode_ms,
        "vocoder_ms": vocoder_ms,
        "finite": finite,
        "check_seconds": args.check_seconds,
        "latents_rel_vs_cpu": latents_rel,
        "waveform_rel_vs_cpu": sound_rel,
        "muxed": muxed,
    });
    println!("LTX2_AUDIO_OURS {line}");
    Ok(())
}
