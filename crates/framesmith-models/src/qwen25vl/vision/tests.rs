//! The image processor and the vision tower against the fixtures made by transformers' `Qwen2VLImageProcessorPil`
//! and `Qwen2_5_VLForConditionalGeneration` (`bench/reference/qwen_image_edit_text.py`), and the tower's loader on
//! the layouts users have.

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use image::RgbImage;

use super::*;
use crate::fixtures::FixtureCase;
use crate::qwen25vl::tests::rel_error;
use crate::qwen25vl::Qwen25VlFormatError;

pub(in crate::qwen25vl) fn edit_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen25vl_edit")
}

pub(in crate::qwen25vl) fn edit_case() -> anyhow::Result<FixtureCase> {
    FixtureCase::load_dir(&edit_dir())
}

pub(in crate::qwen25vl) fn vision_config(
    case: &FixtureCase,
) -> anyhow::Result<Qwen25VlVisionConfig> {
    Ok(Qwen25VlVisionConfig::from_hf_json(
        &case.config["vision_config"].to_string(),
    )?)
}

/// The fixture's tower in f32 on the CPU, loaded from `path`.
pub(in crate::qwen25vl) fn vision_at(
    path: &std::path::Path,
    case: &FixtureCase,
) -> anyhow::Result<Qwen25VlVision> {
    let options = VisionLoadOptions {
        dtype: DType::F32,
        config: Some(vision_config(case)?),
        ..VisionLoadOptions::new(&Device::Cpu)
    };
    Ok(load_vision_model(path, &options)?)
}

/// The input image `name` (u8 [h, w, 3]).
pub(in crate::qwen25vl) fn image(case: &FixtureCase, name: &str) -> anyhow::Result<RgbImage> {
    let t = case.input(name)?;
    let (h, w, _) = t.dims3()?;
    let raw = t.flatten_all()?.to_vec1::<u8>()?;
    RgbImage::from_raw(w as u32, h as u32, raw).ok_or_else(|| anyhow::anyhow!("bad image {name}"))
}

fn grid(t: &Tensor) -> anyhow::Result<Vec<Grid>> {
    Ok(t.to_dtype(DType::I64)?
        .to_vec2::<i64>()?
        .into_iter()
        .map(|r| [r[0] as usize, r[1] as usize, r[2] as usize])
        .collect())
}

fn assert_rel(name: &str, got: &Tensor, want: &Tensor, tol: f64) -> anyhow::Result<()> {
    let rel = rel_error(got, want)?;
    anyhow::ensure!(
        rel <= tol,
        "{name}: relative error {rel:.3e} above {tol:.0e}"
    );
    Ok(())
}

#[test]
fn the_processor_matches_transformers() -> anyhow::Result<()> {
    let case = edit_case()?;
    let cfg = ImageProcessorConfig::default();
    let small = cfg.preprocess(&[image(&case, "image_small")?], &Device::Cpu)?;
    assert_eq!(small.grids, grid(case.expected("small_grid")?)?);
    assert_rel(
        "small_pixel_values",
        &small.pixel_values,
        case.expected("small_pixel_values")?,
        1e-6,
    )?;
    // Pillow's bicubic, byte for byte.
    let wide = cfg.resized(&image(&case, "image_wide")?)?;
    let want = case.expected("wide_resized")?;
    let (h, w, _) = want.dims3()?;
    assert_eq!((wide.height() as usize, wide.width() as usize), (h, w));
    let want = want.flatten_all()?.to_vec1::<u8>()?;
    let differing = wide
        .as_raw()
        .iter()
        .zip(&want)
        .filter(|(a, b)| a != b)
        .count();
    assert_eq!(differing, 0, "{differing} of {} bytes differ", want.len());
    Ok(())
}

#[test]
fn the_vision_tower_matches_transformers() -> anyhow::Result<()> {
    let case = edit_case()?;
    let vision = vision_at(&edit_dir().join("weights.safetensors"), &case)?;
    let wide =
        ImageProcessorConfig::default().preprocess(&[image(&case, "image_wide")?], &Device::Cpu)?;
    assert_eq!(wide.grids, grid(case.expected("wide_grid")?)?);
    let got = vision.forward(&wide.pixel_values, &wide.grids)?;
    let want = case.expected("wide_vision")?;
    assert_rel("wide_vision", &got, want, 1e-4)?;

    // A perturbed reference fails, and so does the tower without its windows.
    let size = f64::from(want.abs()?.max_all()?.to_scalar::<f32>()?);
    let bump = (want.ones_like()? * (0.02 * size))?;
    assert!(assert_rel("perturbed", &got, &(want + bump)?, 1e-4).is_err());
    let mut cfg = vision_config(&case)?;
    cfg.fullatt_block_indexes = (0..cfg.depth).collect();
    let options = VisionLoadOptions {
        dtype: DType::F32,
        config: Some(cfg),
        ..VisionLoadOptions::new(&Device::Cpu)
    };
    let unwindowed = load_vision_model(&edit_dir().join("weights.safetensors"), &options)?;
    let got = unwindowed.forward(&wide.pixel_values, &wide.grids)?;
    assert!(assert_rel("no windows", &got, want, 1e-4).is_err());
    Ok(())
}

/// The names and shapes the tower is built from are the official model's (`model.visual.*` of the fixture).
#[test]
fn tensor_shapes_are_the_official_state_dicts() -> anyhow::Result<()> {
    let case = edit_case()?;
    let mut official: Vec<(String, Vec<usize>)> = case
        .weights
        .iter()
        .filter_map(|(n, t)| {
            Some((
                n.strip_prefix("model.visual.")?.to_string(),
                t.dims().to_vec(),
            ))
        })
        .collect();
    let mut ours = vision_config(&case)?.tensor_shapes();
    official.sort();
    ours.sort();
    assert_eq!(ours, official);
    Ok(())
}

/// ComfyUI's names (`visual.*`, `model.layers.*`) load the same tower, bf16 weights or FP8 with
/// `scale_weight`; a file without the tower is named with what to download.
#[test]
fn comfy_files_load_the_tower_and_one_without_it_is_named() -> anyhow::Result<()> {
    let case = edit_case()?;
    let dir = tempfile::tempdir()?;
    let comfy: HashMap<String, Tensor> = case
        .weights
        .iter()
        .map(|(k, v)| {
            let k = k
                .replace("model.visual.", "visual.")
                .replace("model.language_model.", "model.");
            (k, v.clone())
        })
        .collect();
    let path = dir.path().join("qwen_2.5_vl_7b.safetensors");
    candle_core::safetensors::save(&comfy, &path)?;
    let wide =
        ImageProcessorConfig::default().preprocess(&[image(&case, "image_wide")?], &Device::Cpu)?;
    let want = case.expected("wide_vision")?;
    let got = vision_at(&path, &case)?.forward(&wide.pixel_values, &wide.grids)?;
    assert_rel("comfy names", &got, want, 1e-4)?;

    // Every vision Linear in e4m3 with a per-tensor scale: the tower reads them dequantised.
    let mut fp8 = comfy.clone();
    for (k, v) in &comfy {
        let Some(module) = k.strip_suffix(".weight") else {
            continue;
        };
        if !k.starts_with("visual.blocks.") || v.rank() != 2 {
            continue;
        }
        let scale = v
            .abs()?
            .max_all()?
            .to_dtype(DType::F32)?
            .to_scalar::<f32>()?
            / 448.0;
        let codes = (v.to_dtype(DType::F32)? / f64::from(scale))?.to_dtype(DType::F8E4M3)?;
        fp8.insert(k.clone(), codes);
        fp8.insert(
            format!("{module}.scale_weight"),
            Tensor::new(scale, &Device::Cpu)?,
        );
    }
    let path = dir.path().join("qwen_2.5_vl_7b_fp8_scaled.safetensors");
    candle_core::safetensors::save(&fp8, &path)?;
    let got = vision_at(&path, &case)?.forward(&wide.pixel_values, &wide.grids)?;
    let rel = rel_error(&got, want)?;
    assert!(rel < 0.1, "fp8 tower: relative error {rel:.3e}");

    let text_only: HashMap<String, Tensor> = comfy
        .into_iter()
        .filter(|(k, _)| !k.starts_with("visual."))
        .collect();
    let path = dir.path().join("text_only.safetensors");
    candle_core::safetensors::save(&text_only, &path)?;
    let err = vision_at(&path, &case)
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
    assert!(
        err.contains("no vision tower") && err.contains("qwen_2.5_vl_7b.safetensors"),
        "{err}"
    );
    assert!(err.ends_with("text_only.safetensors"), "{err}");
    let typed = load_vision_model(&path, &VisionLoadOptions::new(&Device::Cpu)).err();
    assert!(matches!(
        typed,
        Some(Qwen25VlFormatError::NoVisionTower { .. })
    ));
    Ok(())
}
