//! The latent pass with the fixture VAE (`hunyuan_video15_vae/video`, 4 latent channels like the tiny DiT):
//! musubi-tuner's `_hv15` names and keys, the latents as the VAE gives them (unscaled), the first-frame latents,
//! mask and SigLIP features of an image-to-video pass (the tiny SigLIP fixture), caches kept on a second pass, the
//! family chosen by the VAE file alone, an image-to-video pass without its image encoder refused, and the cache read
//! back by the trainer's reader.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use image::RgbImage;

use super::*;
use crate::family::family_of_cache;
use crate::prep::pass::CachePass;
use framesmith_data::family::hunyuan_video15::cache::read_hv15_latent_cache;
use framesmith_data::load_valid;
use framesmith_data::tensor_file::read_tensor_file;
use framesmith_models::hunyuan_video15::vae::load_hv15_vae;
use framesmith_models::siglip::load_siglip;

fn fixture_vae() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../framesmith-models/tests/fixtures/hunyuan_video15_vae/video/weights.safetensors")
}

fn fixture_siglip() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../framesmith-models/tests/fixtures/siglip")
}

fn image(path: &Path, w: u32, h: u32, seed: u8) -> anyhow::Result<()> {
    let img = RgbImage::from_fn(w, h, |x, y| {
        image::Rgb([(x * 7) as u8 ^ seed, (y * 5) as u8, seed.wrapping_mul(3)])
    });
    img.save(path)?;
    Ok(())
}

fn max_diff(a: &Tensor, b: &Tensor) -> anyhow::Result<f32> {
    Ok((a.to_dtype(DType::F32)? - b.to_dtype(DType::F32)?)?
        .abs()?
        .max_all()?
        .to_scalar::<f32>()?)
}

#[test]
fn image_latents_are_the_vaes_with_the_first_frame_mask() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let images = dir.path().join("images");
    std::fs::create_dir_all(&images)?;
    image(&images.join("red.png"), 40, 30, 1)?;
    std::fs::write(images.join("red.txt"), "a red cat")?;
    let toml = dir.path().join("d.toml");
    std::fs::write(
        &toml,
        "[general]\nresolution = [32, 32]\ncaption_extension = \".txt\"\nenable_bucket = false\n\n\
         [[datasets]]\nimage_directory = \"images\"\ncache_directory = \"cache\"\n",
    )?;
    let valid = load_valid(&toml)?;
    let vae = load_hv15_vae(&fixture_vae(), DType::F32, &Device::Cpu)?;
    let siglip = load_siglip(&fixture_siglip(), DType::F32, &Device::Cpu)?;
    let encoder = Hv15LatentEncoder {
        vae: &vae,
        device: Device::Cpu,
        dtype: DType::F32,
        tiles: None,
        image_encoder: Some(&siglip),
    };
    let summary = cache_hv15_latents(&valid, None, &encoder, &CacheOptions::default(), &mut ())?;
    assert_eq!((summary.items, summary.written), (1, 1), "{summary}");
    let path = dir.path().join("cache/red_0040x0030_hv15.safetensors");
    let mut keys: Vec<String> = read_tensor_file(&path, &Device::Cpu)?
        .tensors
        .into_keys()
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "latents_1x2x2_float32",
            "latents_image_1x2x2_float32",
            "siglip_float16"
        ]
    );
    let cache = read_hv15_latent_cache(&path, &Device::Cpu)?;
    // The latents are the VAE's posterior mean of the resized image, unscaled.
    let img = image::open(images.join("red.png"))?.to_rgb8();
    let resized = framesmith_data::resize::resize_to_bucket(&img, (32, 32));
    let video = frames_to_video(std::slice::from_ref(&resized), &Device::Cpu)?;
    let want = vae.encode(&video, None)?.squeeze(0)?;
    assert!(max_diff(&cache.latents, &want)? < 1e-5);
    let image = cache.latents_image.expect("latents_image");
    assert_eq!(image.dims(), &[5, 1, 2, 2]);
    assert!(max_diff(&image.narrow(0, 0, 4)?, &want)? < 1e-5);
    assert_eq!(
        image.narrow(0, 4, 1)?.flatten_all()?.to_vec1::<f32>()?,
        vec![1.0; 4]
    );
    // SigLIP's last hidden state of the resized first frame, in float16 as musubi-tuner stores it.
    let features = cache.siglip.expect("siglip");
    assert_eq!(
        (features.dims(), features.dtype()),
        (&[16, 32][..], DType::F16)
    );
    let want = siglip.encode_image(&resized)?.squeeze(0)?;
    assert!(max_diff(&features, &want)? < 1e-2);

    let again = cache_hv15_latents(&valid, None, &encoder, &CacheOptions::default(), &mut ())?;
    assert_eq!((again.written, again.skipped), (0, 1), "{again}");
    // The same cache is complete for a pass without --i2v.
    let t2v = Hv15LatentEncoder {
        image_encoder: None,
        ..encoder
    };
    assert!(t2v.cached(&path));
    Ok(())
}

#[test]
fn first_frame_latents_lead_and_the_mask_marks_frame_zero() -> anyhow::Result<()> {
    let first = Tensor::arange(0f32, 8.0, &Device::Cpu)?.reshape((2, 1, 2, 2))?;
    let y = image_latents(&first, 3)?;
    assert_eq!(y.dims(), &[3, 3, 2, 2]);
    assert_eq!(max_diff(&y.narrow(0, 0, 2)?.narrow(1, 0, 1)?, &first)?, 0.0);
    assert_eq!(
        y.narrow(0, 0, 2)?
            .narrow(1, 1, 2)?
            .abs()?
            .sum_all()?
            .to_scalar::<f32>()?,
        0.0
    );
    let mask = y.narrow(0, 2, 1)?.sum((0, 2, 3))?.to_vec1::<f32>()?;
    assert_eq!(mask, vec![4.0, 0.0, 0.0]);
    Ok(())
}

#[test]
fn video_clips_are_cached_per_window_at_24_fps_names() -> anyhow::Result<()> {
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
        .args(["-frames:v", "12", "-pix_fmt", "yuv420p"])
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
    let vae = load_hv15_vae(&fixture_vae(), DType::F32, &Device::Cpu)?;
    let encoder = Hv15LatentEncoder {
        vae: &vae,
        device: Device::Cpu,
        dtype: DType::F32,
        tiles: Some(SpatialTiles::small()),
        image_encoder: None,
    };
    let summary = cache_hv15_latents(
        &valid,
        Some(&tools),
        &encoder,
        &CacheOptions::default(),
        &mut (),
    )?;
    assert_eq!((summary.items, summary.written), (1, 2), "{summary}");
    for start in [0, 5] {
        let path = dir.path().join(format!(
            "cache/pattern_{start:05}-005_0048x0032_hv15.safetensors"
        ));
        let cache = read_hv15_latent_cache(&path, &Device::Cpu)?;
        assert_eq!(cache.latents.dims(), &[4, 2, 2, 2]);
        assert!(cache.latents_image.is_none());
    }
    Ok(())
}

/// The error of the pass `files` over a dataset that is never read: the files are checked first.
fn refused(files: LatentFiles) -> String {
    let pass = CachePass::Latents(files);
    let family = family_of_cache(&pass);
    assert_eq!(family.name(), "HunyuanVideo 1.5");
    let request = CacheRequest {
        dataset: PathBuf::from("data.toml"),
        pass,
        keep_stale: false,
        unreadable: framesmith_data::Unreadable::Refuse,
        open: &|| anyhow::bail!("no device is opened for a refused pass"),
    };
    family
        .cache(&request, &mut (), &mut |_| {})
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default()
}

#[test]
fn the_vae_file_alone_picks_the_family_and_i2v_needs_siglip() {
    let err = refused(LatentFiles {
        vae: fixture_vae(),
        i2v: true,
        ..LatentFiles::default()
    });
    assert!(
        err.contains("--i2v")
            && err.contains("--clip")
            && err.contains("sigclip_vision_patch14_384"),
        "{err}"
    );
    let missing = PathBuf::from("no/such/sigclip_vision_patch14_384.safetensors");
    let err = refused(LatentFiles {
        vae: fixture_vae(),
        clip: Some(missing.clone()),
        ..LatentFiles::default()
    });
    assert!(
        err.contains("--clip")
            && err.contains("not found")
            && err.ends_with(&missing.display().to_string()),
        "{err}"
    );
}
