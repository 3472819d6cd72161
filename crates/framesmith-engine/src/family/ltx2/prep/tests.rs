//! The latent pass with the fixture VAE (`ltx2/vae_ltx2`: 4 latent channels, 8× space and 4× time): the `_ltx2`
//! names and keys, the latents as the VAE gives them (normalised), caches kept on a second pass and read back by
//! the trainer's reader, clips cached per window, the family picked by the checkpoint alone, and clip lengths that
//! are not a multiple of the temporal factor plus one refused with the fix.

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use image::RgbImage;

use super::*;
use crate::family::family_of_cache;
use crate::prep::pass::CachePass;
use framesmith_data::family::ltx2::cache::{read_ltx2_audio_cache, read_ltx2_latent_cache};
use framesmith_data::load_valid;
use framesmith_models::ltx2::audio::{load_ltx2_audio, Ltx2AudioParts};
use framesmith_models::ltx2::vae::load_ltx2_vae;

fn fixture_vae() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../framesmith-models/tests/fixtures/ltx2/vae_ltx2/weights.safetensors")
}

const STEPS: Steps = Steps { space: 8, time: 4 };

fn max_diff(a: &Tensor, b: &Tensor) -> anyhow::Result<f32> {
    Ok((a.to_dtype(DType::F32)? - b.to_dtype(DType::F32)?)?
        .abs()?
        .max_all()?
        .to_scalar::<f32>()?)
}

#[test]
fn image_latents_are_the_vaes_normalised_and_kept_on_a_second_pass() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let images = dir.path().join("images");
    std::fs::create_dir_all(&images)?;
    let img = RgbImage::from_fn(40, 30, |x, y| {
        image::Rgb([(x * 7) as u8, (y * 5) as u8, 90])
    });
    img.save(images.join("red.png"))?;
    std::fs::write(images.join("red.txt"), "a red cat")?;
    let toml = dir.path().join("d.toml");
    std::fs::write(
        &toml,
        "[general]\nresolution = [32, 32]\ncaption_extension = \".txt\"\nenable_bucket = false\n\n\
         [[datasets]]\nimage_directory = \"images\"\ncache_directory = \"cache\"\n",
    )?;
    let valid = load_valid(&toml)?;
    let vae = load_ltx2_vae(&fixture_vae(), DType::F32, &Device::Cpu)?;
    let encoder = Ltx2LatentEncoder {
        vae: &vae,
        device: Device::Cpu,
        dtype: DType::F32,
        tiling: None,
        steps: STEPS,
        audio: None,
    };
    let summary = cache_ltx2_latents(&valid, None, &encoder, &CacheOptions::default(), &mut ())?;
    assert_eq!((summary.items, summary.written), (1, 1), "{summary}");
    let path = dir.path().join("cache/red_0040x0030_ltx2.safetensors");
    let latents = read_ltx2_latent_cache(&path, &Device::Cpu)?;
    assert_eq!(latents.dims(), &[4, 1, 4, 4]);
    let resized = framesmith_data::resize::resize_to_bucket(
        &image::open(images.join("red.png"))?.to_rgb8(),
        (32, 32),
    );
    let want = vae
        .encode(&frames_to_video(&[resized], &Device::Cpu)?)?
        .squeeze(0)?;
    assert!(max_diff(&latents, &want)? < 1e-5);
    let again = cache_ltx2_latents(&valid, None, &encoder, &CacheOptions::default(), &mut ())?;
    assert_eq!((again.written, again.skipped), (0, 1), "{again}");
    Ok(())
}

#[test]
fn clip_lengths_off_the_vae_grid_are_refused_with_the_fix() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    std::fs::create_dir_all(dir.path().join("videos"))?;
    let toml = dir.path().join("d.toml");
    let write = |extra: &str| -> anyhow::Result<ValidConfig> {
        std::fs::write(
            &toml,
            format!(
                "[general]\nresolution = [64, 64]\ncaption_extension = \".txt\"\n\n[[datasets]]\n\
                 video_directory = \"videos\"\ncache_directory = \"cache\"\n{extra}\n"
            ),
        )?;
        Ok(load_valid(&toml)?)
    };
    let steps = Steps { space: 32, time: 8 };
    let problems = frame_count_problems(&write("target_frames = [1, 13, 121]")?, steps);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("[13]")
            && problems[0].contains("8k + 1")
            && problems[0].contains("121")
    );
    let problems = frame_count_problems(
        &write("frame_extraction = \"full\"\nmax_frames = 121")?,
        steps,
    );
    assert!(
        problems.len() == 1 && problems[0].contains("target_frames"),
        "{problems:?}"
    );
    assert!(frame_count_problems(&write("target_frames = [9, 121]")?, steps).is_empty());

    let vae = load_ltx2_vae(&fixture_vae(), DType::F32, &Device::Cpu)?;
    let encoder = Ltx2LatentEncoder {
        vae: &vae,
        device: Device::Cpu,
        dtype: DType::F32,
        tiling: None,
        steps: STEPS,
        audio: None,
    };
    let frames = vec![RgbImage::new(16, 16); 8];
    let err = encoder.encode(&frames).unwrap_err().to_string();
    assert!(
        err.contains("4k + 1") && err.contains("target_frames"),
        "{err}"
    );
    Ok(())
}

#[test]
fn video_clips_are_cached_per_window() -> anyhow::Result<()> {
    let Ok(tools) = MediaTools::locate() else {
        eprintln!("ffmpeg not found: video caching not tested");
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let videos = dir.path().join("videos");
    std::fs::create_dir_all(&videos)?;
    let status = std::process::Command::new(&tools.ffmpeg)
        .args([
            "-v",
            "error",
            "-f",
            "lavfi",
            "-i",
            "testsrc=size=48x32:rate=24",
        ])
        .args(["-frames:v", "10", "-pix_fmt", "yuv420p"])
        .arg(videos.join("pattern.mp4"))
        .status()?;
    assert!(status.success());
    std::fs::write(videos.join("pattern.txt"), "a moving square")?;
    let toml = dir.path().join("d.toml");
    std::fs::write(
        &toml,
        "[general]\nresolution = [32, 32]\ncaption_extension = \".txt\"\nenable_bucket = false\n\n\
         [[datasets]]\nvideo_directory = \"videos\"\ncache_directory = \"cache\"\ntarget_frames = [5]\n\
         frame_extraction = \"chunk\"\n",
    )?;
    let valid = load_valid(&toml)?;
    let vae = load_ltx2_vae(&fixture_vae(), DType::F32, &Device::Cpu)?;
    let encoder = Ltx2LatentEncoder {
        vae: &vae,
        device: Device::Cpu,
        dtype: DType::F32,
        tiling: None,
        steps: STEPS,
        audio: None,
    };
    let summary = cache_ltx2_latents(
        &valid,
        Some(&tools),
        &encoder,
        &CacheOptions::default(),
        &mut (),
    )?;
    assert_eq!((summary.items, summary.written), (1, 2), "{summary}");
    // Video datasets are always bucketed (as musubi-tuner does): 48×32 within a 32×32 area in the fixture VAE's
    // 8-pixel steps is the 40×24 bucket, 5×3 latent pixels.
    for start in [0, 5] {
        let path = dir.path().join(format!(
            "cache/pattern_{start:05}-005_0048x0032_ltx2.safetensors"
        ));
        assert_eq!(
            read_ltx2_latent_cache(&path, &Device::Cpu)?.dims(),
            &[4, 2, 3, 5]
        );
    }
    Ok(())
}

#[test]
fn the_checkpoint_alone_picks_the_family() {
    let pass = CachePass::Latents(LatentFiles {
        vae: fixture_vae(),
        ..LatentFiles::default()
    });
    assert_eq!(family_of_cache(&pass).name(), "LTX-2");
}

/// A 24 fps 48×32 test pattern of `frames` frames, with a 440 Hz stereo tone at 44.1 kHz when `sound`.
fn pattern(
    tools: &MediaTools,
    path: &std::path::Path,
    frames: usize,
    sound: bool,
) -> anyhow::Result<()> {
    let mut cmd = std::process::Command::new(&tools.ffmpeg);
    cmd.args([
        "-v",
        "error",
        "-f",
        "lavfi",
        "-i",
        "testsrc=size=48x32:rate=24",
    ]);
    if sound {
        cmd.args([
            "-f",
            "lavfi",
            "-i",
            "sine=frequency=440:sample_rate=44100:duration=2",
        ])
        .args(["-ac", "2", "-c:a", "aac"]);
    }
    // A length in seconds, not in frames: `-frames:v` would end the file before the sound's encoder caught up.
    let status = cmd
        .args([
            "-t",
            &format!("{:.4}", frames as f64 / 24.0),
            "-pix_fmt",
            "yuv420p",
        ])
        .arg(path)
        .status()?;
    anyhow::ensure!(
        status.success(),
        "ffmpeg could not write {}",
        path.display()
    );
    Ok(())
}

/// A dataset of two videos cut into 5-frame chunks: `tone.mp4` (10 frames, with sound), `quiet.mp4` (5, without).
fn tone_and_quiet(tools: &MediaTools) -> anyhow::Result<(tempfile::TempDir, ValidConfig)> {
    let dir = tempfile::tempdir()?;
    let videos = dir.path().join("videos");
    std::fs::create_dir_all(&videos)?;
    pattern(tools, &videos.join("tone.mp4"), 10, true)?;
    pattern(tools, &videos.join("quiet.mp4"), 5, false)?;
    for stem in ["tone", "quiet"] {
        std::fs::write(videos.join(format!("{stem}.txt")), "a pattern")?;
    }
    let toml = dir.path().join("d.toml");
    std::fs::write(
        &toml,
        "[general]\nresolution = [32, 32]\ncaption_extension = \".txt\"\nenable_bucket = false\n\n\
         [[datasets]]\nvideo_directory = \"videos\"\ncache_directory = \"cache\"\ntarget_frames = [5]\n\
         frame_extraction = \"chunk\"\n",
    )?;
    let valid = load_valid(&toml)?;
    Ok((dir, valid))
}

/// Clips with sound get `_ltx2_audio` caches of the audio VAE's latents of their own span (the fixture audio VAE:
/// one latent channel × 16 mel bins, 16 kHz, hop 160), read back by the trainer's reader; a video without sound is
/// named in a warning; a second pass keeps them all.
#[test]
fn clips_with_sound_get_audio_caches_and_silent_videos_are_named() -> anyhow::Result<()> {
    let Ok(tools) = MediaTools::locate() else {
        eprintln!("ffmpeg not found: audio caching not tested");
        return Ok(());
    };
    let (dir, valid) = tone_and_quiet(&tools)?;
    let videos = dir.path().join("videos");
    let vae = load_ltx2_vae(&fixture_vae(), DType::F32, &Device::Cpu)?;
    let audio_file = fixture_vae().with_file_name("../audio_ltx2/weights.safetensors");
    let parts = Ltx2AudioParts {
        encoder: true,
        decoder: false,
        vocoder: false,
    };
    let (audio_vae, _) = load_ltx2_audio(&audio_file, parts, DType::F32, &Device::Cpu)?;
    let encoder = || Ltx2LatentEncoder {
        vae: &vae,
        device: Device::Cpu,
        dtype: DType::F32,
        tiling: None,
        steps: STEPS,
        audio: Some(Ltx2AudioEncoder {
            vae: &audio_vae,
            tools: &tools,
            dtype: DType::F32,
            silent: Default::default(),
        }),
    };
    let summary = cache_ltx2_latents(
        &valid,
        Some(&tools),
        &encoder(),
        &CacheOptions::default(),
        &mut (),
    )?;
    assert_eq!((summary.items, summary.written), (2, 3), "{summary}");
    let warning = summary.warnings.join("\n");
    assert!(
        warning.contains("1 video(s) have no sound") && warning.contains("quiet.mp4"),
        "{warning}"
    );
    assert!(!warning.contains("tone.mp4"), "{warning}");
    let cache = dir.path().join("cache");
    assert!(!cache
        .join("quiet_00000-005_0048x0032_ltx2_audio.safetensors")
        .exists());
    // The second clip's sound, decoded as the pass decodes it: 5 frames from frame 5 at 24 fps.
    let clip = tools
        .decode_audio(&videos.join("tone.mp4"), (5.0 / 24.0, 5.0 / 24.0), 16000)?
        .ok_or_else(|| anyhow::anyhow!("no sound"))?;
    let len = (5.0 / 24.0 * 16000.0) as usize;
    let mut planes = [clip.channel(0), clip.channel(1)];
    planes.iter_mut().for_each(|p| p.resize(len, 0.0));
    let data: Vec<f32> = planes.iter().flatten().copied().collect();
    let want = audio_vae
        .encode(&Tensor::from_vec(data, (1, 2, len), &Device::Cpu)?)?
        .squeeze(0)?;
    for start in [0, 5] {
        let path = cache.join(format!(
            "tone_{start:05}-005_0048x0032_ltx2_audio.safetensors"
        ));
        let got = read_ltx2_audio_cache(&path, &Device::Cpu)?;
        // 3333 samples: 21 mel frames, 6 latent frames, all with sound.
        assert_eq!(got.latents.dims(), &[1, 6, 16]);
        assert_eq!(got.length, Some(6));
        if start == 5 {
            assert!(max_diff(&got.latents, &want)? < 1e-5);
        }
    }
    let again = cache_ltx2_latents(
        &valid,
        Some(&tools),
        &encoder(),
        &CacheOptions::default(),
        &mut (),
    )?;
    assert_eq!((again.written, again.skipped), (0, 2), "{again}");
    Ok(())
}
