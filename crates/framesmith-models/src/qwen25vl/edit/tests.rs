//! Qwen-Image-Edit's prompt encoding against the fixtures made through diffusers' `QwenImageEditPipeline` and
//! `QwenImageEditPlusPipeline` (`bench/reference/qwen_image_edit_text.py`): one image for Edit, one and two for
//! Edit-2509.

use candle_core::{DType, Device, Tensor};
use image::RgbImage;

use super::{calculate_dimensions, encode_edit_prompt, EditPipeline, EditPromptOptions, IMAGE_PAD};
use crate::fixtures::FixtureCase;
use crate::qwen25vl::mrope::rope_index;
use crate::qwen25vl::tests::rel_error;
use crate::qwen25vl::vision::tests::{edit_case, edit_dir, image, vision_at};
use crate::qwen25vl::vision::ImageProcessorConfig;
use crate::qwen25vl::*;

fn encoder(case: &FixtureCase) -> anyhow::Result<Qwen25VlTextEncoder> {
    let cfg = Qwen25VlTextConfig::from_hf_json(&case.config["text_config"].to_string())?;
    let options = LoadOptions {
        dtype: DType::F32,
        config: Some(cfg),
        ..LoadOptions::new(&Device::Cpu)
    };
    Ok(Qwen25VlTextEncoder {
        tokenizer: Qwen2Tokenizer::load(&edit_dir().join("tokenizer.json"))?,
        model: load_text_model(&edit_dir().join("weights.safetensors"), &options)?,
    })
}

/// A case of the fixture: its options, prompt and images.
fn case_inputs(
    case: &FixtureCase,
    name: &str,
) -> anyhow::Result<(EditPromptOptions, String, Vec<RgbImage>)> {
    let c = &case.config["cases"][name];
    let pipeline = match c["pipeline"].as_str() {
        Some("QwenImageEditPipeline") => EditPipeline::Edit,
        Some("QwenImageEditPlusPipeline") => EditPipeline::EditPlus,
        other => anyhow::bail!("unknown pipeline {other:?}"),
    };
    let options = EditPromptOptions {
        pipeline,
        processor: ImageProcessorConfig {
            max_pixels: c["max_pixels"].as_u64().unwrap_or_default() as usize,
            ..ImageProcessorConfig::default()
        },
    };
    let images = c["images"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| image(case, n.as_str().unwrap_or_default()))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok((
        options,
        c["prompt"].as_str().unwrap_or_default().to_string(),
        images,
    ))
}

const CASES: [&str; 3] = ["edit", "plus1", "plus2"];

#[test]
fn edit_prompt_embeds_match_the_edit_pipelines() -> anyhow::Result<()> {
    let case = edit_case()?;
    let (encoder, vision) = (
        encoder(&case)?,
        vision_at(&edit_dir().join("weights.safetensors"), &case)?,
    );
    for name in CASES {
        let (options, prompt, images) = case_inputs(&case, name)?;
        let got = encode_edit_prompt(&encoder, &vision, &options, &prompt, &images)?;
        let want = case.expected(&format!("{name}_embeds"))?;
        let rel = rel_error(&got.embeds, want)?;
        assert!(rel <= 1e-4, "{name}: relative error {rel:.3e}");
        let mask = case
            .expected(&format!("{name}_mask"))?
            .to_dtype(DType::U32)?;
        assert_eq!(got.mask.to_vec2::<u32>()?, mask.to_vec2::<u32>()?, "{name}");
    }
    Ok(())
}

/// The 3-D positions of the official ids are transformers' `get_rope_index`.
#[test]
fn positions_match_get_rope_index() -> anyhow::Result<()> {
    let case = edit_case()?;
    let pad = Qwen2Tokenizer::load(&edit_dir().join("tokenizer.json"))?
        .token_id(IMAGE_PAD)
        .ok_or_else(|| anyhow::anyhow!("no image pad"))?;
    for name in CASES {
        let (options, _, images) = case_inputs(&case, name)?;
        let condition: Vec<RgbImage> = images
            .iter()
            .map(|i| options.pipeline.condition_image(i))
            .collect();
        let grids = options
            .processor
            .preprocess(&condition, &Device::Cpu)?
            .grids;
        let ids = case
            .expected(&format!("{name}_ids"))?
            .to_dtype(DType::U32)?
            .squeeze(0)?;
        let positions =
            rope_index(&ids.to_vec1::<u32>()?, pad, &grids, 2).map_err(anyhow::Error::msg)?;
        let want = case
            .expected(&format!("{name}_positions"))?
            .to_dtype(DType::U32)?
            .squeeze(1)?;
        let got: Vec<Vec<u32>> = positions.into_iter().collect();
        assert_eq!(got, want.to_vec2::<u32>()?, "{name}");
    }
    Ok(())
}

#[test]
fn a_perturbed_reference_or_the_other_pipeline_fails() -> anyhow::Result<()> {
    let case = edit_case()?;
    let (encoder, vision) = (
        encoder(&case)?,
        vision_at(&edit_dir().join("weights.safetensors"), &case)?,
    );
    let (options, prompt, images) = case_inputs(&case, "plus1")?;
    let got = encode_edit_prompt(&encoder, &vision, &options, &prompt, &images)?;
    let want = case.expected("plus1_embeds")?;
    let (_, l, h) = want.dims3()?;
    let mut bump = vec![0f32; l * h];
    bump[5 * h + 1] = 0.05 * want.abs()?.max_all()?.to_scalar::<f32>()? * 10.0;
    let perturbed = (want + Tensor::from_vec(bump, (1, l, h), &Device::Cpu)?)?;
    assert!(rel_error(&got.embeds, &perturbed)? > 1e-4);
    // The Edit pipeline's encoding of the same image and prompt is another one.
    let edit = EditPromptOptions {
        pipeline: EditPipeline::Edit,
        ..options
    };
    let other = encode_edit_prompt(&encoder, &vision, &edit, &prompt, &images)?;
    assert!(other.embeds.dims() != want.dims() || rel_error(&other.embeds, want)? > 1e-4);
    // Edit takes one image only.
    let two = [images[0].clone(), images[0].clone()];
    assert!(encode_edit_prompt(&encoder, &vision, &edit, &prompt, &two).is_err());
    Ok(())
}

/// diffusers' `calculate_dimensions` (Python 3.11).
#[test]
fn dimensions_match_the_pipelines() {
    assert_eq!(
        calculate_dimensions(1024.0 * 1024.0, 64.0 / 48.0),
        (1184, 896)
    );
    assert_eq!(calculate_dimensions(384.0 * 384.0, 64.0 / 48.0), (448, 320));
    assert_eq!(calculate_dimensions(384.0 * 384.0, 1.5), (480, 320));
    assert_eq!(calculate_dimensions(1024.0 * 1024.0, 1.0), (1024, 1024));
}
