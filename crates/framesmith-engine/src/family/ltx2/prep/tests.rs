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
use framesmith_data::family::ltx2::cache::read_ltx2_latent_cache;
use framesmith_data::load_valid;
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
