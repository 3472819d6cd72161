//! FLUX.1 caching of an image dataset with the fixtures' tiny autoencoder, CLIP-L and T5: each image's latents and
//! each caption's outputs are what the models give for them, second passes reuse the caches, an edited caption
//! is encoded again, Wan caches in the same folder are left alone and video datasets are refused.

use std::path::Path;

use candle_core::{DType, Device};

use super::{cache_flux_latents, cache_flux_text, FluxLatentEncoder};
use crate::prep::{frames_to_video, CacheOptions};
use framesmith_data::family::flux::cache::{
    flux_latent_cache_name, flux_text_cache_name, read_flux_latent_cache, read_flux_text_cache,
};
use framesmith_data::samples::image_sample;
use framesmith_models::fixtures::{clip_tokenizer_json, t5_tokenizer_json};
use framesmith_models::flux::autoencoder::{AutoEncoder, AutoEncoderConfig};
use framesmith_models::flux::clip_text::{text_model_prefix, ClipTextConfig, ClipTextModel};
use framesmith_models::flux::text_encoder::FluxTextEncoder;
use framesmith_models::flux::tokenizer::{FluxTokenizer, TextTokenizerKind};
use framesmith_models::t5::v1_1::{t5_config_from_hf_json, t5_from_tensors};
use framesmith_nn::vb::Vb;

/// The fixture case's config `init` and weights.
fn fixture(case: &str) -> anyhow::Result<(String, Vb)> {
    let dir = framesmith_models::fixtures::case_dir("flux", case);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json"))?)?;
    let weights = candle_core::safetensors::load(dir.join("weights.safetensors"), &Device::Cpu)?;
    Ok((
        json["init"].to_string(),
        Vb::from_tensors(weights, DType::F32, &Device::Cpu),
    ))
}

fn autoencoder() -> anyhow::Result<AutoEncoder> {
    let (init, vb) = fixture("flux_ae")?;
    Ok(AutoEncoder::new(
        &AutoEncoderConfig::from_json(&init)?,
        &vb,
    )?)
}

fn text_encoder(dir: &Path) -> anyhow::Result<FluxTextEncoder> {
    let words = ["a", "red", "blue", "cat", "dog"];
    let clip_tok = dir.join("clip_tokenizer.json");
    std::fs::write(&clip_tok, clip_tokenizer_json(&words))?;
    let t5_tok = dir.join("t5_tokenizer.json");
    std::fs::write(&t5_tok, t5_tokenizer_json(&words))?;
    let (init, vb) = fixture("clip_l")?;
    let clip = ClipTextModel::new(&ClipTextConfig::from_json(&init)?, &text_model_prefix(&vb))?;
    let (init, _) = fixture("t5_encoder")?;
    let weights = candle_core::safetensors::load(
        framesmith_models::fixtures::case_dir("flux", "t5_encoder").join("weights.safetensors"),
        &Device::Cpu,
    )?;
    let t5 = t5_from_tensors(
        weights,
        &t5_config_from_hf_json(&init)?,
        DType::F32,
        &Device::Cpu,
    )?;
    Ok(FluxTextEncoder::from_parts(
        clip,
        FluxTokenizer::load(&clip_tok, TextTokenizerKind::ClipL, 8)?,
        t5,
        FluxTokenizer::load(&t5_tok, TextTokenizerKind::T5, 6)?,
    ))
}

/// Two captioned images (32×48 and 16×16) in an image dataset cached to `cache/`.
fn dataset(dir: &Path) -> anyhow::Result<framesmith_data::ValidConfig> {
    let images = dir.join("images");
    std::fs::create_dir_all(&images)?;
    image::RgbImage::from_fn(32, 48, |x, y| {
        image::Rgb([(x * 8) as u8, (y * 5) as u8, 90])
    })
    .save(images.join("a.png"))?;
    image::RgbImage::from_pixel(16, 16, image::Rgb([200, 10, 10])).save(images.join("b.png"))?;
    std::fs::write(images.join("a.txt"), "a red cat")?;
    std::fs::write(images.join("b.txt"), "a blue dog")?;
    let toml = dir.join("data.toml");
    std::fs::write(
        &toml,
        "[general]\nresolution = [32, 32]\ncaption_extension = \".txt\"\nenable_bucket = true\n\
         [[datasets]]\nimage_directory = \"images\"\ncache_directory = \"cache\"\n",
    )?;
    Ok(framesmith_data::load_valid(&toml)?)
}

#[test]
fn images_cache_to_flux_latents_beside_wan_caches() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let valid = dataset(dir.path())?;
    let ae = autoencoder()?;
    let encoder = FluxLatentEncoder {
        ae: &ae,
        device: Device::Cpu,
        dtype: DType::F32,
    };
    let cache = dir.path().join("cache");
    std::fs::create_dir_all(&cache)?;
    let wan = cache.join("a_0032x0048_wan.safetensors");
    std::fs::write(&wan, b"a Wan cache")?;
    let options = CacheOptions::default();
    let summary = cache_flux_latents(&valid, &encoder, &options, &mut ())?;
    assert_eq!(
        (summary.written, summary.skipped, summary.failed.len()),
        (2, 0, 0)
    );
    assert!(wan.exists(), "Wan caches are not FLUX.1's to remove");

    let ds = &valid.datasets[0];
    for (name, size) in [("a", (32, 48)), ("b", (16, 16))] {
        let path = cache.join(flux_latent_cache_name(name, size));
        let cached = read_flux_latent_cache(&path, &Device::Cpu)?;
        let media = dir.path().join(format!("images/{name}.png"));
        let sample = image_sample(ds, &media, encoder.bucket_step())?;
        let image = frames_to_video(&sample.frames, &Device::Cpu)?.squeeze(2)?;
        let want = ae.encode(&image)?.transpose(0, 1)?;
        assert_eq!(cached.dims(), want.dims());
        let diff = (&cached - &want)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert_eq!(diff, 0.0, "{name}");
    }
    let again = cache_flux_latents(&valid, &encoder, &options, &mut ())?;
    assert_eq!((again.written, again.skipped), (0, 2));
    Ok(())
}

#[test]
fn captions_cache_to_t5_and_pooled_clip_and_edits_are_encoded_again() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let valid = dataset(dir.path())?;
    let encoder = text_encoder(dir.path())?;
    let options = CacheOptions::default();
    let summary = cache_flux_text(&valid, &encoder, DType::F32, &options, &mut ())?;
    assert_eq!((summary.written, summary.skipped), (2, 0));
    let path = dir.path().join("cache").join(flux_text_cache_name("a"));
    let cached = read_flux_text_cache(&path, &Device::Cpu)?;
    let (txt, vec) = encoder.encode(&["a red cat"])?;
    assert_eq!(cached.caption, "a red cat");
    assert_eq!(cached.t5.dims(), [6, 32]);
    assert_eq!(cached.clip_l_pooler.dims(), [32]);
    let same = |a: &candle_core::Tensor, b: &candle_core::Tensor| -> anyhow::Result<f32> {
        Ok((a - b)?.abs()?.max_all()?.to_scalar::<f32>()?)
    };
    assert_eq!(same(&cached.t5, &txt.squeeze(0)?)?, 0.0);
    assert_eq!(same(&cached.clip_l_pooler, &vec.squeeze(0)?)?, 0.0);

    std::fs::write(dir.path().join("images/a.txt"), "a blue cat")?;
    let valid = framesmith_data::load_valid(&dir.path().join("data.toml"))?;
    let again = cache_flux_text(&valid, &encoder, DType::F32, &options, &mut ())?;
    assert_eq!((again.written, again.skipped), (1, 1));
    assert_eq!(
        read_flux_text_cache(&path, &Device::Cpu)?.caption,
        "a blue cat"
    );
    Ok(())
}

#[test]
fn video_datasets_are_refused_before_anything_is_encoded() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    std::fs::create_dir_all(dir.path().join("videos"))?;
    let toml = dir.path().join("data.toml");
    std::fs::write(
        &toml,
        "[general]\nresolution = [32, 32]\ncaption_extension = \".txt\"\n\
         [[datasets]]\nvideo_directory = \"videos\"\ncache_directory = \"cache\"\ntarget_frames = [1]\n",
    )?;
    let valid = framesmith_data::load_valid(&toml)?;
    let ae = autoencoder()?;
    let encoder = FluxLatentEncoder {
        ae: &ae,
        device: Device::Cpu,
        dtype: DType::F32,
    };
    let err = cache_flux_latents(&valid, &encoder, &CacheOptions::default(), &mut ())
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("FLUX.1 trains on images"), "{err}");
    assert!(!dir.path().join("cache").exists());
    Ok(())
}
