//! Parity of the CLIP visual tower and its preprocessing with the independent NumPy reference
//! (`tests/reference/clip_tiny.py` → `tests/fixtures/clip_tiny/`), and the ViT-H/14 sizes.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use super::*;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/clip_tiny")
        .join(name)
}

/// Largest `|got − want| / (1e-4 + |want|)`-style error: max abs difference over the max abs reference value.
fn relative_error(got: &Tensor, want: &Tensor) -> anyhow::Result<f32> {
    assert_eq!(got.dims(), want.dims());
    let diff = (got - want)?.abs()?.max_all()?.to_scalar::<f32>()?;
    let scale = want.abs()?.max_all()?.to_scalar::<f32>()?;
    Ok(diff / scale.max(1e-6))
}

#[test]
fn tiny_tower_matches_the_numpy_reference() -> anyhow::Result<()> {
    let io = candle_core::safetensors::load(fixture("io.safetensors"), &Device::Cpu)?;
    let clip = load_clip_vision(
        &fixture("weights.safetensors"),
        &ClipVisionConfig::tiny(),
        DType::F32,
        &Device::Cpu,
    )?;
    assert_eq!(clip.blocks.len(), 2, "the last block is not run");
    let pixels = preprocess::clip_pixels(&io["image"], clip.config())?;
    let err = relative_error(&pixels.unsqueeze(0)?, &io["pixels"])?;
    eprintln!("CLIP preprocessing: max relative error {err:.2e}");
    assert!(err <= 1e-5, "preprocessing differs by {err}");

    let features = clip.forward(&io["pixels"])?;
    let err = relative_error(&features, &io["features"])?;
    eprintln!("CLIP tiny tower: max relative error {err:.2e}");
    assert!(err <= 1e-4, "features differ by {err}");
    let end_to_end = clip.encode_image(&io["image"])?;
    assert!(relative_error(&end_to_end, &io["features"])? <= 1e-4);
    Ok(())
}

#[test]
fn a_wrong_size_names_the_tensor_and_the_file() -> anyhow::Result<()> {
    let cfg = ClipVisionConfig {
        dim: 48,
        ..ClipVisionConfig::tiny()
    };
    let msg = load_clip_vision(
        &fixture("weights.safetensors"),
        &cfg,
        DType::F32,
        &Device::Cpu,
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(
        msg.contains("patch_embedding.weight")
            && msg.contains("do not fit the CLIP image encoder")
            && msg.ends_with("weights.safetensors"),
        "{msg}"
    );
    Ok(())
}

#[test]
fn vit_h_14_has_wans_sizes() {
    let cfg = ClipVisionConfig::vit_h_14();
    assert_eq!(cfg.tokens(), 257);
    assert_eq!(
        (cfg.dim, cfg.num_heads, cfg.num_layers, cfg.mlp_dim),
        (1280, 16, 32, 5120)
    );
    assert_eq!(ClipVisionConfig::tiny().tokens(), 17);
}
