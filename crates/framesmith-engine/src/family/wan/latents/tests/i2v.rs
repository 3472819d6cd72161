//! Latent caching for image-to-video models with the fixture VAE and the tiny CLIP: the `latents_image` and
//! `clip` parts musubi-tuner's `wan_cache_latents.py --i2v --clip` writes (keys, shapes, dtypes, values), and a
//! text-to-video cache made again when an image-to-video model needs more.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, IndexOp, Tensor};
use image::RgbImage;

use crate::family::wan::latents::*;
use crate::family::wan::start_image::tests::tiny_clip;
use framesmith_data::cache::read_wan_latent_cache;
use framesmith_data::load_valid;
use framesmith_data::tensor_file::read_tensor_file;
use framesmith_models::wan::vae::{load_vae_auto, VaeVariant};

fn vae() -> anyhow::Result<(WanVae, LatentStats)> {
    let path = framesmith_models::fixtures::wan_case("wan21_vae_tiny").join("weights.safetensors");
    Ok((
        load_vae_auto(&path, DType::F32, &Device::Cpu)?,
        LatentStats::official(VaeVariant::Wan21, &Device::Cpu)?,
    ))
}

fn frame(w: u32, h: u32, seed: u8) -> RgbImage {
    RgbImage::from_fn(w, h, |x, y| {
        image::Rgb([(x * 7) as u8 ^ seed, (y * 5) as u8, seed.wrapping_mul(3)])
    })
}

fn max_diff(a: &Tensor, b: &Tensor) -> anyhow::Result<f32> {
    assert_eq!(a.dims(), b.dims());
    Ok((a.to_dtype(DType::F32)? - b.to_dtype(DType::F32)?)?
        .abs()?
        .max_all()?
        .to_scalar::<f32>()?)
}

/// A 5-frame clip's cache, computed here step by step as `encode_and_save_batch` does it: the mask is 1 on the
/// first latent frame's 4 channels and 0 after; the image latents are the VAE's of [first frame, 4 zero
/// frames]; the CLIP features are the first frame's, in float16.
#[test]
fn a_clip_caches_mask_image_latents_and_clip_features_as_musubi_does() -> anyhow::Result<()> {
    let (vae, stats) = vae()?;
    let clip = tiny_clip()?;
    let frames: Vec<RgbImage> = (0..5).map(|i| frame(32, 16, 10 + 40 * i)).collect();
    let encoder = LatentEncoder {
        vae: &vae,
        stats: &stats,
        device: Device::Cpu,
        dtype: DType::F32,
        tiles: None,
        image: ImageParts::LatentsAndClip(&clip),
    };
    let cache = encoder.encode_cache(&frames)?;
    assert_eq!(cache.latents.dims(), &[16, 2, 2, 4]);
    let y = cache.latents_image.clone().expect("image latents");
    assert_eq!(y.dims(), &[20, 2, 2, 4]);
    assert_eq!(y.dtype(), DType::F32);

    let ones = Tensor::ones((4, 1, 2, 4), DType::F32, &Device::Cpu)?;
    assert_eq!(max_diff(&y.i((0..4, 0..1))?, &ones)?, 0.0);
    assert_eq!(max_diff(&y.i((0..4, 1..2))?, &ones.zeros_like()?)?, 0.0);

    let video = frames_to_video(&frames, &Device::Cpu)?;
    let first = video.narrow(2, 0, 1)?;
    let conditioned = Tensor::cat(
        &[
            &first,
            &Tensor::zeros((1, 3, 4, 16, 32), DType::F32, &Device::Cpu)?,
        ],
        2,
    )?;
    let want = vae.encode(&conditioned, &stats)?.squeeze(0)?;
    assert_eq!(max_diff(&y.i(4..)?, &want)?, 0.0);
    let latents = vae.encode(&video, &stats)?.squeeze(0)?;
    assert_eq!(max_diff(&cache.latents, &latents)?, 0.0);
    assert!(
        max_diff(&y.i(4..)?, &latents)? > 1e-3,
        "the image latents are the first frame's, not the clip's"
    );

    let features = cache.clip.clone().expect("CLIP features");
    assert_eq!(
        (features.dims(), features.dtype()),
        (&[17, 32][..], DType::F16)
    );
    let want = clip
        .encode_image(&first.squeeze(0)?.squeeze(1)?)?
        .squeeze(0)?
        .to_dtype(DType::F16)?;
    assert_eq!(max_diff(&features, &want)?, 0.0);

    // Wan2.2 I2V-A14B: the image latents only.
    let latents_only = LatentEncoder {
        image: ImageParts::Latents,
        ..encoder
    }
    .encode_cache(&frames)?;
    assert!(latents_only.clip.is_none());
    assert_eq!(
        max_diff(latents_only.latents_image.as_ref().expect("y"), &y)?,
        0.0
    );
    Ok(())
}

/// `images/` with two captioned pictures and the dataset TOML caching into `cache/`.
fn image_dataset(root: &Path) -> anyhow::Result<PathBuf> {
    let images = root.join("images");
    std::fs::create_dir_all(&images)?;
    frame(40, 30, 1).save(images.join("red.png"))?;
    std::fs::write(images.join("red.txt"), "a red cat")?;
    frame(48, 32, 9).save(images.join("blue.png"))?;
    std::fs::write(images.join("blue.txt"), "a blue square")?;
    let toml = root.join("data.toml");
    std::fs::write(
        &toml,
        "[general]\nresolution = [32, 32]\ncaption_extension = \".txt\"\nenable_bucket = false\n\n\
         [[datasets]]\nimage_directory = \"images\"\ncache_directory = \"cache\"\n",
    )?;
    Ok(toml)
}

fn keys(path: &Path) -> anyhow::Result<Vec<(String, DType, Vec<usize>)>> {
    let file = read_tensor_file(path, &Device::Cpu)?;
    let mut keys: Vec<_> = file
        .tensors
        .iter()
        .map(|(k, t)| (k.clone(), t.dtype(), t.dims().to_vec()))
        .collect();
    keys.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(keys)
}

/// `cache_latents` for Wan2.1 I2V writes musubi-tuner's keys (`clip_` named after the latents' dtype though
/// it holds float16), the files round-trip, a text-to-video cache already there is made again with the
/// image parts, and a complete image-to-video cache is kept.
#[test]
fn i2v_caches_have_musubis_keys_and_replace_text_to_video_caches() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (vae, stats) = vae()?;
    let clip = tiny_clip()?;
    let valid = load_valid(&image_dataset(dir.path())?)?;
    let t2v = LatentEncoder {
        vae: &vae,
        stats: &stats,
        device: Device::Cpu,
        dtype: DType::F32,
        tiles: None,
        image: ImageParts::None,
    };
    let run = |encoder: &LatentEncoder| {
        cache_latents(&valid, None, encoder, &CacheOptions::default(), &mut ())
    };
    assert_eq!(run(&t2v)?.written, 2);
    let red = dir.path().join("cache/red_0040x0030_wan.safetensors");
    assert_eq!(keys(&red)?.len(), 1);

    let i2v = LatentEncoder {
        vae: &vae,
        stats: &stats,
        device: Device::Cpu,
        dtype: DType::F32,
        tiles: None,
        image: ImageParts::LatentsAndClip(&clip),
    };
    let summary = run(&i2v)?;
    assert_eq!((summary.written, summary.skipped), (2, 0), "{summary}");
    assert_eq!(
        keys(&red)?,
        vec![
            ("clip_float32".to_string(), DType::F16, vec![17, 32]),
            (
                "latents_1x4x4_float32".to_string(),
                DType::F32,
                vec![16, 1, 4, 4]
            ),
            (
                "latents_image_1x4x4_float32".to_string(),
                DType::F32,
                vec![20, 1, 4, 4]
            ),
        ]
    );
    let (back, meta) = read_wan_latent_cache(&red, &Device::Cpu)?;
    assert_eq!((meta.width, meta.height, meta.frame_count), (40, 30, None));
    let y = back.latents_image.expect("image latents read back");
    // An image is its own first frame: mask 1, then its latents.
    assert_eq!(max_diff(&y.i(0..4)?, &y.i(0..4)?.ones_like()?)?, 0.0);
    assert_eq!(max_diff(&y.i(4..)?, &back.latents)?, 0.0);
    assert_eq!(back.clip.expect("clip read back").dims(), &[17, 32]);

    let again = run(&i2v)?;
    assert_eq!((again.written, again.skipped), (0, 2), "{again}");
    // A text-to-video run keeps the richer caches.
    assert_eq!(run(&t2v)?.skipped, 2);
    Ok(())
}
