//! A tiny Qwen-Image for CPU tests: a transformer of the released layout at small sizes with seeded random weights
//! (16 latent channels, so it takes the tiny Wan 2.1 VAE fixture's latents), that VAE as Qwen-Image's, the stand-in
//! text encoder ([`WordEncoder`], and [`WordEditEncoder`] for prompts with control images) of the transformer's
//! text width, and an image dataset.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::encoder::{
    EditPromptEncoder, EncoderFiles, EncoderLoaders, PromptEncoder, WordEditEncoder, WordEncoder,
};
use framesmith_models::qwen25vl::EditPipeline;
use framesmith_models::qwen_image::weights::official_shapes;
use framesmith_models::qwen_image::QwenImageConfig;
use framesmith_nn::init::randn;

/// The tiny transformer's sizes: 2 blocks of width 32, text width 24, 16 latent channels packed 2×2.
pub fn tiny_config() -> QwenImageConfig {
    QwenImageConfig {
        in_channels: 64,
        out_channels: Some(16),
        num_layers: 2,
        attention_head_dim: 16,
        num_attention_heads: 2,
        joint_attention_dim: 24,
        axes_dims_rope: vec![4, 6, 6],
        ..QwenImageConfig::qwen_image()
    }
}

/// The tiny transformer written into `dir` as a ComfyUI-style single file (seeded: the same weights every time).
pub fn tiny_dit(dir: &Path) -> anyhow::Result<PathBuf> {
    let rng = &mut StdRng::seed_from_u64(11);
    let mut tensors = HashMap::new();
    for (name, shape) in official_shapes(&tiny_config()) {
        let t = if name.ends_with("norm_q.weight")
            || name.ends_with("norm_k.weight")
            || name.contains("norm_added_")
            || name == "txt_norm.weight"
        {
            Tensor::ones(shape.as_slice(), DType::F32, &Device::Cpu)?
        } else {
            randn(rng, shape.as_slice(), 0.0, 0.2, &Device::Cpu)?
        };
        tensors.insert(format!("model.diffusion_model.{name}"), t);
    }
    std::fs::create_dir_all(dir)?;
    let path = dir.join("qwen_image_tiny.safetensors");
    candle_core::safetensors::save(&tensors, &path)?;
    Ok(path)
}

/// The tiny Wan 2.1 VAE fixture copied into `dir` as Qwen-Image's (ComfyUI names).
pub fn tiny_vae(dir: &Path) -> anyhow::Result<PathBuf> {
    let from = framesmith_models::fixtures::wan_case("wan21_vae_tiny").join("weights.safetensors");
    let to = dir.join("qwen_image_vae.safetensors");
    std::fs::copy(from, &to)?;
    Ok(to)
}

/// The stand-in encoder as a [`super::encoder::LoadEncoder`] gives it.
pub fn stand_in(
    _files: EncoderFiles<'_>,
    _dtype: DType,
    _device: &Device,
) -> anyhow::Result<Box<dyn PromptEncoder>> {
    Ok(Box::new(WordEncoder {
        dim: tiny_config().joint_attention_dim,
    }))
}

/// The stand-in edit encoder as a [`super::encoder::LoadEditEncoder`] gives it.
pub fn stand_in_edit(
    _files: EncoderFiles<'_>,
    pipeline: EditPipeline,
    _dtype: DType,
    _device: &Device,
) -> anyhow::Result<Box<dyn EditPromptEncoder>> {
    Ok(Box::new(WordEditEncoder {
        dim: tiny_config().joint_attention_dim,
        pipeline,
    }))
}

/// Both stand-ins as the loaders of a run or a generation.
pub fn stand_ins() -> EncoderLoaders<'static> {
    EncoderLoaders {
        text: &stand_in,
        edit: &stand_in_edit,
    }
}

/// A musubi-tuner image dataset in `dir`: three 32×32 images (two colours, a stripe) with captions, cached in
/// `cache/`, at `resolution` 32; returns its TOML.
pub fn dataset(dir: &Path, batch_size: usize) -> anyhow::Result<PathBuf> {
    let images = dir.join("images");
    std::fs::create_dir_all(&images)?;
    for (stem, colour, caption) in [
        ("a", [200u8, 30, 30], "a red square"),
        ("b", [30, 30, 200], "a blue square"),
        ("c", [30, 200, 30], "a green square with a stripe"),
    ] {
        let mut img = image::RgbImage::from_pixel(32, 32, image::Rgb(colour));
        if stem == "c" {
            for x in 0..32 {
                img.put_pixel(x, 16, image::Rgb([255, 255, 255]));
            }
        }
        img.save(images.join(format!("{stem}.png")))?;
        std::fs::write(images.join(format!("{stem}.txt")), caption)?;
    }
    let toml = dir.join("data.toml");
    std::fs::write(
        &toml,
        format!(
            "[general]\nresolution = [32, 32]\ncaption_extension = \".txt\"\nenable_bucket = true\n\
             [[datasets]]\nimage_directory = \"images\"\ncache_directory = \"cache\"\nbatch_size = {batch_size}\n"
        ),
    )?;
    Ok(toml)
}

/// The tiny Qwen2.5-VL with its vision tower that the official edit pipelines encoded (the models crate's
/// `qwen25vl_edit` fixture), loaded as Qwen-Image-Edit's encoder for `pipeline` on the CPU in f32.
pub fn tiny_edit_encoder(pipeline: EditPipeline) -> anyhow::Result<Box<dyn EditPromptEncoder>> {
    use super::encoder::load_edit_encoder_with;
    use framesmith_models::qwen25vl::vision::{Qwen25VlVisionConfig, VisionLoadOptions};
    use framesmith_models::qwen25vl::{EditPromptOptions, LoadOptions, Qwen25VlTextConfig};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../framesmith-models/tests/fixtures/qwen25vl_edit");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json"))?)?;
    let text = Qwen25VlTextConfig::from_hf_json(&json["text_config"].to_string())?;
    let vision = Qwen25VlVisionConfig::from_hf_json(&json["vision_config"].to_string())?;
    let options = LoadOptions {
        dtype: DType::F32,
        config: Some(text),
        ..LoadOptions::new(&Device::Cpu)
    };
    let vision = VisionLoadOptions {
        dtype: DType::F32,
        config: Some(vision),
        ..VisionLoadOptions::new(&Device::Cpu)
    };
    let (weights, tokenizer) = (dir.join("weights.safetensors"), dir.join("tokenizer.json"));
    let files = EncoderFiles {
        weights: &weights,
        tokenizer: Some(&tokenizer),
    };
    let edit = EditPromptOptions::new(pipeline);
    load_edit_encoder_with(files, edit, &options, &vision)
}
