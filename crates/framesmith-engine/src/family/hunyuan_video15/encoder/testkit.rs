//! The tiny encoders of the models crate's fixtures for CPU tests: the Qwen2.5-VL of `hunyuan_video15_text` (text
//! width 64, with its tokenizer), the glyph encoder of `hunyuan_video15_byt5` (width 32) and the SigLIP of `siglip`
//! (width 32), and a tiny DiT that takes their states.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::family::hunyuan_video15::testkit::tiny_config;
use framesmith_models::hunyuan_video15::weights::official_shapes;
use framesmith_models::hunyuan_video15::HunyuanVideo15Config;
use framesmith_models::qwen25vl::{
    load_text_model, LoadOptions, Qwen25VlTextConfig, Qwen25VlTextEncoder, Qwen2Tokenizer,
};
use framesmith_nn::init::randn;

/// A file of the models crate's fixtures.
pub fn fixture(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../framesmith-models/tests/fixtures")
        .join(path)
}

/// The tiny Qwen2.5-VL's weights and tokenizer, and the tiny glyph encoder.
pub fn encoder_files() -> [PathBuf; 3] {
    [
        fixture("hunyuan_video15_text/weights.safetensors"),
        fixture("hunyuan_video15_text/tokenizer.json"),
        fixture("hunyuan_video15_byt5/weights.safetensors"),
    ]
}

/// The fixture Qwen2.5-VL's weights and tokenizer copied into `dir` with the glyph encoder beside them under
/// ComfyUI's name (where a run finds it); returns the weights.
pub fn encoders_side_by_side(dir: &Path) -> anyhow::Result<PathBuf> {
    let [weights, tokenizer, glyph] = encoder_files();
    std::fs::create_dir_all(dir)?;
    let copied = dir.join("qwen_2.5_vl_tiny.safetensors");
    std::fs::copy(weights, &copied)?;
    std::fs::copy(tokenizer, dir.join("tokenizer.json"))?;
    std::fs::copy(glyph, dir.join("byt5_small_glyphxl_fp16.safetensors"))?;
    Ok(copied)
}

/// Loads the fixture's tiny Qwen2.5-VL (its own sizes, which the real loader refuses as not the 7B model); the
/// tokenizer is the fixture's when none is given.
pub fn tiny_qwen(
    weights: &Path,
    tokenizer: Option<&Path>,
    dtype: DType,
    device: &Device,
) -> anyhow::Result<Qwen25VlTextEncoder> {
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture(
        "hunyuan_video15_text/config.json",
    ))?)?;
    let config = Qwen25VlTextConfig::from_hf_json(&json["text_config"].to_string())?;
    let options = LoadOptions {
        dtype,
        config: Some(config),
        ..LoadOptions::new(device)
    };
    let [_, fixture_tokenizer, _] = encoder_files();
    let tokenizer = tokenizer.unwrap_or(&fixture_tokenizer);
    Ok(Qwen25VlTextEncoder {
        tokenizer: Qwen2Tokenizer::load(tokenizer)
            .with_context(|| format!("the tokenizer {}", tokenizer.display()))?,
        model: load_text_model(weights, &options)?,
    })
}

/// The tiny transformer's sizes with the fixture encoders' widths (Qwen2.5-VL 64, byT5 32, SigLIP 32).
pub fn encoder_width_config() -> HunyuanVideo15Config {
    HunyuanVideo15Config {
        text_embed_dim: 64,
        text_embed_2_dim: 32,
        image_embed_dim: 32,
        ..tiny_config()
    }
}

/// The tiny DiT of [`encoder_width_config`], written into `dir`.
pub fn dit(dir: &Path) -> anyhow::Result<PathBuf> {
    let cfg = encoder_width_config();
    let rng = &mut StdRng::seed_from_u64(3);
    let mut tensors = HashMap::new();
    for (name, shape) in official_shapes(&cfg) {
        let t = if name.contains("norm") && name.ends_with(".weight") {
            Tensor::ones(shape.as_slice(), DType::F32, &Device::Cpu)?
        } else {
            randn(rng, shape.as_slice(), 0.0, 0.2, &Device::Cpu)?
        };
        tensors.insert(name, t);
    }
    let path = dir.join("hunyuanvideo1.5_tiny.safetensors");
    candle_core::safetensors::save(&tensors, &path)?;
    Ok(path)
}
