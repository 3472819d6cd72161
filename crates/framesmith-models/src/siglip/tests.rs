//! The tower and its processor against the official `VisionEncoder("siglip")` (`bench/reference/siglip.py` →
//! `tests/fixtures/siglip/`, FLUX.1-Redux-dev's folder layout at a tiny size), the files users have, and what
//! `inspect` says of them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use image::RgbImage;

use super::files::COMFY_FILE;
use super::*;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/siglip")
}

/// ‖got − want‖ / ‖want‖.
fn relative_error(got: &Tensor, want: &Tensor) -> anyhow::Result<f64> {
    assert_eq!(got.dims(), want.dims());
    let diff = (got.to_dtype(DType::F64)? - want.to_dtype(DType::F64)?)?
        .sqr()?
        .sum_all()?
        .to_scalar::<f64>()?;
    let norm = want
        .to_dtype(DType::F64)?
        .sqr()?
        .sum_all()?
        .to_scalar::<f64>()?;
    Ok((diff / norm).sqrt())
}

/// The fixture's image `i` as an RGB image.
fn fixture_image(inputs: &HashMap<String, Tensor>, i: usize) -> anyhow::Result<RgbImage> {
    let t = &inputs[&format!("image_{i}")];
    let (h, w, _) = t.dims3()?;
    let raw = t.flatten_all()?.to_vec1::<u8>()?;
    RgbImage::from_raw(w as u32, h as u32, raw).ok_or_else(|| anyhow::anyhow!("image {i}"))
}

#[test]
fn the_tiny_tower_matches_the_official_encoder() -> anyhow::Result<()> {
    let inputs =
        candle_core::safetensors::load(fixture().join("inputs.safetensors"), &Device::Cpu)?;
    let expected =
        candle_core::safetensors::load(fixture().join("expected.safetensors"), &Device::Cpu)?;
    let tower = load_siglip(&fixture(), DType::F32, &Device::Cpu)?;
    assert_eq!(tower.config().tokens(), 16);
    let cfg = tower.config();
    assert_eq!(
        (cfg.num_attention_heads, cfg.image_size),
        (4, 30),
        "read from config.json"
    );
    for i in 0..3 {
        let image = fixture_image(&inputs, i)?;
        let pixels = preprocess::pixel_values(&image, 30, &Device::Cpu)?.unsqueeze(0)?;
        assert_eq!(
            relative_error(&pixels, &expected[&format!("pixel_values_{i}")])?,
            0.0,
            "image {i}: the processor's pixels differ"
        );
        let states = tower.encode_image(&image)?;
        let err = relative_error(&states, &expected[&format!("last_hidden_state_{i}")])?;
        assert!(
            err < 1e-5,
            "image {i}: last_hidden_state differs by {err:.2e}"
        );
    }
    Ok(())
}

#[test]
fn a_lone_file_needs_its_config_or_a_released_width() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let lone = dir.path().join(COMFY_FILE);
    std::fs::copy(fixture().join("image_encoder/model.safetensors"), &lone)?;
    let msg = load_siglip(dir.path(), DType::F32, &Device::Cpu)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        msg.contains("width 32")
            && msg.contains("config.json")
            && msg.ends_with(&lone.display().to_string()),
        "{msg}"
    );
    std::fs::copy(
        fixture().join("image_encoder/config.json"),
        dir.path().join("config.json"),
    )?;
    assert_eq!(
        load_siglip(&lone, DType::F32, &Device::Cpu)?
            .config()
            .num_attention_heads,
        4
    );
    Ok(())
}

#[test]
fn missing_and_foreign_files_say_what_to_give() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let err = |p: &Path| {
        load_siglip(p, DType::F32, &Device::Cpu)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    let missing = dir.path().join("nothing.safetensors");
    assert!(err(&missing).contains("not found"), "{}", err(&missing));
    let empty = err(dir.path());
    assert!(
        empty.contains("no SigLIP image encoder") && empty.contains(COMFY_FILE),
        "{empty}"
    );
    // A CLIP vision tower's names (class embedding, no post-norm) are not SigLIP's.
    let clip: HashMap<String, Tensor> = [
        ("vision_model.embeddings.class_embedding", vec![8]),
        (
            "vision_model.embeddings.patch_embedding.weight",
            vec![8, 3, 2, 2],
        ),
    ]
    .into_iter()
    .map(|(n, s)| Ok((n.to_string(), Tensor::zeros(s, DType::F32, &Device::Cpu)?)))
    .collect::<candle_core::Result<_>>()?;
    let path = dir.path().join("clip_vision_h.safetensors");
    candle_core::safetensors::save(&clip, &path)?;
    assert!(identify(&path).is_none());
    let msg = err(&path);
    assert!(
        msg.contains("position embedding") && msg.contains("SigLIP"),
        "{msg}"
    );
    Ok(())
}

#[test]
fn inspect_names_the_folder_and_the_so400m_sizes() -> anyhow::Result<()> {
    let file = identify(&fixture()).ok_or_else(|| anyhow::anyhow!("not named"))?;
    let shown = file.to_string();
    assert!(
        shown.starts_with("SigLIP image encoder")
            && shown.contains("2 layers, width 32 (4 heads), 16 tokens of 30-pixel images")
            && shown.contains("not the SigLIP HunyuanVideo 1.5 takes")
            && shown.ends_with("model.safetensors"),
        "{shown}"
    );
    let so400m = SiglipFile {
        config: Some(SiglipVisionConfig::so400m_patch14_384()),
        ..file
    };
    let shown = so400m.to_string();
    assert!(
        shown.contains("729 tokens")
            && shown.contains("--clip for `framesmith cache latents --i2v`"),
        "{shown}"
    );
    Ok(())
}

#[test]
fn released_sizes() {
    let cfg = SiglipVisionConfig::so400m_patch14_384();
    assert_eq!(
        (cfg.tokens(), cfg.hidden_size / cfg.num_attention_heads),
        (729, 72)
    );
    let shapes: HashMap<&str, Vec<usize>> = [
        ("embeddings.patch_embedding.weight", vec![1152, 3, 14, 14]),
        ("embeddings.position_embedding.weight", vec![729, 1152]),
        ("encoder.layers.0.mlp.fc1.weight", vec![4304, 1152]),
    ]
    .into();
    let read = files_config(&shapes, 27);
    assert_eq!(read.as_ref(), Ok(&cfg));
}

fn files_config(
    shapes: &HashMap<&str, Vec<usize>>,
    layers: usize,
) -> std::result::Result<SiglipVisionConfig, String> {
    files::config_from_shapes(
        |n| shapes.get(n).cloned(),
        layers,
        files::ConfigBeside::default(),
    )
}
