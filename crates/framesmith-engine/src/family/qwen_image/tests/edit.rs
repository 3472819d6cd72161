//! Qwen-Image-Edit (-2509) on the CPU with the tiny model: a dataset with two control images per item
//! (`control_directory`, musubi-tuner's `stem_0` / `stem_1` names) caches their latents beside the target's under
//! musubi-tuner's keys, a batch appends their tokens as frames 1 and 2 of the RoPE and learns on the target's tokens
//! only, a run config trains, and a missing control image is named.

use std::path::{Path, PathBuf};

use crate::train::noise::StepRng;
use candle_core::{DType, Device};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::family::qwen_image::encoder::WordEncoder;
use crate::family::qwen_image::prep::{
    cache_qwen_latents, cache_qwen_text, CaptionEncoder, QwenLatentEncoder,
};
use crate::family::qwen_image::testkit::{dataset, tiny_config, tiny_dit, tiny_vae};
use crate::family::qwen_image::train::{load_qwen_items, qwen_batch};
use crate::family::testkit::run::{
    assert_a_fixed_batch_learns, cached_run_config, fixed_draws, tiny_lora_spec,
};
use crate::prep::CacheOptions;
use crate::train::optimizer::AdamW;
use crate::train::tests::try_start;
use framesmith_config::run::TimestepSampling;
use framesmith_config::RunConfig;
use framesmith_data::tensor_file::read_tensor_file;
use framesmith_data::Unreadable;
use framesmith_models::qwen_image::rope::ImageGrid;
use framesmith_models::qwen_image::vae::load_vae;
use framesmith_models::qwen_image::weights::load_dit;
use framesmith_nn::lora::{attach_family_loras, LoraFamily};

/// Two control images per item of the tiny dataset in `dir` (`ctl/{stem}_0.png` the item's colours inverted,
/// `ctl/{stem}_1.png` a 48×32 grey), with `control_directory` in its TOML.
pub(crate) fn edit_dataset(dir: &Path, batch_size: usize) -> anyhow::Result<PathBuf> {
    let toml = dataset(dir, batch_size)?;
    let ctl = dir.join("ctl");
    std::fs::create_dir_all(&ctl)?;
    for stem in ["a", "b", "c"] {
        let mut img = image::open(dir.join("images").join(format!("{stem}.png")))?.to_rgb8();
        image::imageops::invert(&mut img);
        img.save(ctl.join(format!("{stem}_0.png")))?;
        image::RgbImage::from_pixel(48, 32, image::Rgb([128, 128, 128]))
            .save(ctl.join(format!("{stem}_1.png")))?;
    }
    let text = std::fs::read_to_string(&toml)?;
    std::fs::write(
        &toml,
        text.replace(
            "cache_directory",
            "control_directory = \"ctl\"\ncache_directory",
        ),
    )?;
    Ok(toml)
}

/// Caches `toml`'s dataset for Qwen-Image through the tiny VAE and the stand-in encoder.
fn cache(dir: &Path, toml: &Path) -> anyhow::Result<crate::prep::CacheSummary> {
    let valid = framesmith_data::load_valid(toml)?;
    let vae = load_vae(&tiny_vae(dir)?, DType::F32, &Device::Cpu)?;
    let encoder = QwenLatentEncoder {
        vae: &vae,
        device: Device::Cpu,
        dtype: DType::F32,
    };
    let summary = cache_qwen_latents(&valid, &encoder, &CacheOptions::default(), &mut ())?;
    let text = WordEncoder {
        dim: tiny_config().joint_attention_dim,
    };
    cache_qwen_text(
        &valid,
        CaptionEncoder::Text(&text),
        DType::F32,
        &CacheOptions::default(),
        &mut (),
    )?;
    Ok(summary)
}

#[test]
fn control_images_cache_beside_the_target_and_an_edit_batch_learns() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let toml = edit_dataset(dir.path(), 1)?;
    let summary = cache(dir.path(), &toml)?;
    assert_eq!(summary.written, 3, "{summary:?}");
    let file = read_tensor_file(
        &dir.path().join("cache/a_0032x0032_qi.safetensors"),
        &Device::Cpu,
    )?;
    // Both controls go to the target's bucket (musubi-tuner's default), whatever their own size.
    for key in [
        "latents_1x4x4_float32",
        "latents_control_0_1x4x4_float32",
        "latents_control_1_1x4x4_float32",
    ] {
        assert!(
            file.tensors.contains_key(key),
            "{key}: {:?}",
            file.tensors.keys()
        );
    }

    let items = load_qwen_items((&toml, Unreadable::Refuse), &tiny_config(), &Device::Cpu)?.items;
    let batch: Vec<_> = items.iter().map(|(i, _)| i).collect();
    assert!(batch.iter().all(|i| i.control.len() == 2));
    let draws = fixed_draws(batch.len(), 0.6, 601.0);
    let b = qwen_batch(&batch, &draws, &mut StepRng::seeded(9), DType::F32)?;
    assert_eq!(b.inputs.img_grids, vec![ImageGrid::image(2, 2); 3]);
    assert_eq!(
        b.inputs.img.dims(),
        &[3, 12, 64],
        "target then two controls"
    );
    assert_eq!(
        b.targets[0].dims(),
        &[4, 64],
        "the loss covers the target only"
    );

    let mut model = load_dit(
        &tiny_dit(&dir.path().join("dit"))?,
        DType::F32,
        &Device::Cpu,
        None,
    )?;
    let loras = attach_family_loras(
        model.linears_mut(),
        &tiny_lora_spec(),
        LoraFamily::QwenImage,
    )?;
    let mut optimizer = AdamW::new(crate::train::setup::named_vars(&loras), Default::default())?;
    assert_a_fixed_batch_learns(&model, &loras, &mut optimizer, || {
        let b = qwen_batch(&batch, &draws, &mut StepRng::seeded(9), DType::F32)?;
        Ok((b.inputs, b.targets))
    })
}

#[test]
fn a_missing_control_image_is_named_and_its_item_not_cached() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let toml = edit_dataset(dir.path(), 1)?;
    for i in 0..2 {
        std::fs::remove_file(dir.path().join(format!("ctl/b_{i}.png")))?;
    }
    std::fs::write(dir.path().join("ctl/c_1.png"), b"not a png")?;
    let summary = cache(dir.path(), &toml)?;
    assert_eq!(summary.written, 1, "{summary:?}");
    let reason = |stem: &str| {
        summary
            .failed
            .iter()
            .find(|(media, _)| media.ends_with(format!("images/{stem}.png")))
            .map(|(_, why)| why.clone())
            .unwrap_or_default()
    };
    let b = reason("b");
    assert!(
        b.contains("no control image for") && b.contains("b_0.png"),
        "{b}"
    );
    assert!(
        b.ends_with(&dir.path().join("ctl").display().to_string()),
        "{b}"
    );
    let c = reason("c");
    assert!(
        c.contains("cannot be read") && c.ends_with("c_1.png"),
        "{c}"
    );
    Ok(())
}

/// A `steps`-long Qwen-Image-Edit run on the tiny edit dataset cached in `dir`.
fn config(dir: &Path, steps: usize) -> anyhow::Result<RunConfig> {
    std::fs::create_dir_all(dir)?;
    let toml = edit_dataset(dir, 2)?;
    cache(dir, &toml)?;
    let files = (tiny_dit(dir)?, toml);
    cached_run_config(dir, files, steps, TimestepSampling::QwenShift)
}

#[test]
fn a_qwen_image_edit_run_config_trains_on_its_control_images() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut run = try_start(&config(dir.path(), 3)?, None)?;
    while run.step() < 3 {
        let loss = run.train_step(&|| false)?.loss;
        assert!(loss.is_some_and(|l| l.is_finite() && l > 0.0), "{loss:?}");
    }
    Ok(())
}

#[test]
fn an_edit_sample_follows_its_control_images() -> anyhow::Result<()> {
    use crate::family::qwen_image::pipeline::{denoise_image, QwenImagePrompt, QwenImageSettings};
    use framesmith_nn::init::randn;
    let dir = tempfile::tempdir()?;
    let model = load_dit(&tiny_dit(dir.path())?, DType::F32, &Device::Cpu, None)?;
    let rng = &mut StdRng::seed_from_u64(4);
    let dim = tiny_config().joint_attention_dim;
    let embed = randn(rng, (3, dim), 0.0, 1.0, &Device::Cpu)?;
    let settings = QwenImageSettings {
        width: 32,
        height: 32,
        steps: 2,
        cfg_scale: 1.0,
        seed: 1,
    };
    let mut control = || randn(rng, (1, 16, 4, 6), 0.0, 1.0, &Device::Cpu);
    let (a, b, second) = (control()?, control()?, control()?);
    let sample = |controls: Vec<candle_core::Tensor>| -> anyhow::Result<candle_core::Tensor> {
        let prompt = QwenImagePrompt {
            embed: embed.clone(),
            negative: None,
            controls,
        };
        denoise_image(&model, &prompt, &settings, [4, 4], DType::F32, &|| false)
    };
    let diff = |x: &candle_core::Tensor, y: &candle_core::Tensor| -> anyhow::Result<f32> {
        Ok((x - y)?.abs()?.max_all()?.to_scalar::<f32>()?)
    };
    let with_a = sample(vec![a.clone()])?;
    assert_eq!(with_a.dims(), &[1, 16, 1, 4, 4]);
    assert!(
        diff(&with_a, &sample(vec![b])?)? > 1e-4,
        "two controls, two images"
    );
    assert!(
        diff(&with_a, &sample(Vec::new())?)? > 1e-4,
        "the control is read"
    );
    assert!(
        diff(&with_a, &sample(vec![a, second])?)? > 1e-4,
        "a second control is read too"
    );
    Ok(())
}
