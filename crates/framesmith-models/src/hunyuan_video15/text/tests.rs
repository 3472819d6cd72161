//! The prompt encoding against the fixture made by diffusers' `HunyuanVideo15Pipeline._get_mllm_prompt_embeds`
//! over a tiny random Qwen2.5-VL (`bench/reference/hunyuan_video15_text.py`).

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};

use super::*;
use crate::qwen25vl::{load_text_model, LoadOptions, Qwen25VlTextConfig, Qwen2Tokenizer};

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hunyuan_video15_text")
}

fn fixture_json() -> anyhow::Result<serde_json::Value> {
    let text = std::fs::read_to_string(fixture_dir().join("config.json"))?;
    Ok(serde_json::from_str(&text)?)
}

fn expected() -> anyhow::Result<HashMap<String, Tensor>> {
    let path = fixture_dir().join("expected.safetensors");
    Ok(candle_core::safetensors::load(path, &Device::Cpu)?)
}

fn prompts() -> anyhow::Result<Vec<String>> {
    Ok(serde_json::from_value(fixture_json()?["prompts"].clone())?)
}

fn max_length() -> anyhow::Result<usize> {
    let n = fixture_json()?["tokenizer_max_length"].as_u64();
    n.map(|n| n as usize)
        .ok_or_else(|| anyhow::anyhow!("no tokenizer_max_length"))
}

fn encoder() -> anyhow::Result<Qwen25VlTextEncoder> {
    let config = Qwen25VlTextConfig::from_hf_json(&fixture_json()?["text_config"].to_string())?;
    let options = LoadOptions {
        dtype: DType::F32,
        config: Some(config),
        ..LoadOptions::new(&Device::Cpu)
    };
    Ok(Qwen25VlTextEncoder {
        tokenizer: Qwen2Tokenizer::load(&fixture_dir().join("tokenizer.json"))?,
        model: load_text_model(&fixture_dir().join("weights.safetensors"), &options)?,
    })
}

/// ‖got − want‖ / ‖want‖, after checking the shapes agree.
fn rel_error(got: &Tensor, want: &Tensor) -> anyhow::Result<f64> {
    anyhow::ensure!(
        got.dims() == want.dims(),
        "shape {:?}, expected {:?}",
        got.dims(),
        want.dims()
    );
    let (g, w) = (got.to_dtype(DType::F64)?, want.to_dtype(DType::F64)?);
    let diff = (g - &w)?.sqr()?.sum_all()?.to_scalar::<f64>()?.sqrt();
    let norm = w.sqr()?.sum_all()?.to_scalar::<f64>()?.sqrt();
    Ok(diff / norm.max(f64::MIN_POSITIVE))
}

/// The pipeline's embeddings with the pad tokens' states (under a zero mask) zeroed, as Framesmith returns them.
fn masked_reference(expected: &HashMap<String, Tensor>) -> anyhow::Result<Tensor> {
    let mask = expected["prompt_mask"].to_dtype(DType::F32)?.unsqueeze(2)?;
    Ok(expected["prompt_embeds"].broadcast_mul(&mask)?)
}

fn check(
    got: &PromptEmbeds,
    expected: &HashMap<String, Tensor>,
    want: &Tensor,
) -> anyhow::Result<f64> {
    let want_mask = expected["prompt_mask"].to_dtype(DType::U32)?;
    anyhow::ensure!(
        got.mask.to_vec2::<u32>()? == want_mask.to_vec2::<u32>()?,
        "mask {:?}, expected {:?}",
        got.mask.sum(1)?.to_vec1::<u32>()?,
        want_mask.sum(1)?.to_vec1::<u32>()?
    );
    let rel = rel_error(&got.embeds, want)?;
    anyhow::ensure!(
        rel <= 1e-4,
        "prompt_embeds: relative error {rel:.3e} above 1e-4"
    );
    Ok(rel)
}

#[test]
fn the_constants_are_the_pipelines() -> anyhow::Result<()> {
    let json = fixture_json()?;
    assert_eq!(json["system_message"].as_str(), Some(SYSTEM_MESSAGE));
    assert_eq!(json["crop_start"].as_u64(), Some(CROP_START as u64));
    Ok(())
}

#[test]
fn the_crop_is_the_templates_part_before_the_prompt() -> anyhow::Result<()> {
    // The official repository computes its crop as the tokens up to `<|im_start|>user\n`; the fixture's tokenizer
    // spells the template as Qwen's does, so that is the 108 the pipeline drops.
    let tokenizer = encoder()?.tokenizer;
    let full = tokenizer.encode(&templated("cat"))?;
    let prefix = tokenizer.encode(templated("cat").split("cat").next().unwrap_or_default())?;
    assert_eq!(prefix.len(), CROP_START);
    assert_eq!(full[..CROP_START], prefix[..]);
    assert_eq!(templated(""), templated(" "));
    Ok(())
}

#[test]
fn the_tokenizer_gives_the_pipelines_ids() -> anyhow::Result<()> {
    let (enc, expected) = (encoder()?, expected()?);
    let texts: Vec<String> = prompts()?.iter().map(|p| templated(p)).collect();
    let batch = enc
        .tokenizer
        .encode_batch(&texts, max_length()? + CROP_START, &Device::Cpu)?;
    let want = expected["input_ids"].to_dtype(DType::U32)?;
    assert_eq!(batch.ids.to_vec2::<u32>()?, want.to_vec2::<u32>()?);
    Ok(())
}

#[test]
fn prompt_embeds_match_the_pipeline() -> anyhow::Result<()> {
    let (enc, expected) = (encoder()?, expected()?);
    let got = encode_prompts_up_to(&enc, &prompts()?, max_length()?)?;
    let rel = check(&got, &expected, &masked_reference(&expected)?)?;
    println!("HunyuanVideo 1.5 prompt embeds: relative error {rel:.3e}");
    // At the official length nothing more is cut from these short prompts.
    let full = encode_prompts(&enc, &prompts()?[..3])?;
    assert_eq!(full.lens, got.lens[..3]);
    Ok(())
}

#[test]
fn a_perturbed_reference_or_selection_fails() -> anyhow::Result<()> {
    let (enc, expected) = (encoder()?, expected()?);
    let (prompts, max_length) = (prompts()?, max_length()?);
    let want = masked_reference(&expected)?;
    let got = encode_prompts_up_to(&enc, &prompts, max_length)?;
    check(&got, &expected, &want)?;
    // One state of one token moved by 1% of the largest.
    let (b, l, h) = want.dims3()?;
    let mut bump = vec![0f32; b * l * h];
    bump[h + 5] = 0.01 * want.abs()?.max_all()?.to_scalar::<f32>()?;
    let perturbed = (&want + Tensor::from_vec(bump, (b, l, h), &Device::Cpu)?)?;
    assert!(check(&got, &expected, &perturbed).is_err());
    // Another layer, or a crop one token short, is not the pipeline's.
    let texts: Vec<String> = prompts.iter().map(|p| templated(p)).collect();
    for (skip, crop) in [(1, CROP_START), (SKIP_LAST_LAYERS, CROP_START - 1)] {
        let (hidden, mask) = enc.hidden_states_of_texts(&texts, max_length + crop, skip)?;
        let lens: Vec<usize> = mask
            .sum(1)?
            .to_vec1::<u32>()?
            .into_iter()
            .map(|n| n as usize)
            .collect();
        let other = drop_and_repad(&hidden, &lens, crop, max_length)?;
        assert!(
            check(&other, &expected, &want).is_err(),
            "skip {skip}, crop {crop} passed"
        );
    }
    Ok(())
}

#[test]
fn glyph_text_is_the_pipelines() {
    // Outputs of diffusers 0.42.1's `extract_glyph_texts` on these prompts.
    let cases: [(&str, Option<&str>); 7] = [
        (
            "A sign reads \"OPEN\" and \"OPEN\" and \u{201c}Caf\u{e9}\u{201d}.",
            Some("Text \"OPEN\". Text \"Caf\u{e9}\". "),
        ),
        ("no quotes", None),
        ("empty \"\" here", Some("Text \"\". ")),
        (
            "broken \"line\nend\" then \"ok\"",
            Some("Text \" then \". "),
        ),
        (
            "\u{201c}a\"b\u{201d} \"c\u{201c}d\"",
            Some("Text \"a\"b\". Text \"c\u{201c}d\". "),
        ),
        ("odd \" one", None),
        ("\u{201c}unclosed \"x\"", Some("Text \"x\". ")),
    ];
    for (prompt, want) in cases {
        assert_eq!(glyph_text(prompt).as_deref(), want, "{prompt:?}");
    }
}
