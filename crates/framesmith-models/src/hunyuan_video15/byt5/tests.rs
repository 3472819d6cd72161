//! The glyph encoder against the fixture made by the official code (`bench/reference/hunyuan_video15_byt5.py`:
//! the pipeline's glyph extraction and tokenization, transformers' T5 encoder with Glyph-SDXL-v2's tokens added),
//! loaded from both of its layouts.

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};

use super::*;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hunyuan_video15_byt5")
}

fn fixture_json() -> anyhow::Result<serde_json::Value> {
    let text = std::fs::read_to_string(fixture_dir().join("config.json"))?;
    Ok(serde_json::from_str(&text)?)
}

fn tensors(name: &str) -> anyhow::Result<HashMap<String, Tensor>> {
    Ok(candle_core::safetensors::load(
        fixture_dir().join(name),
        &Device::Cpu,
    )?)
}

/// The fixture's prompts and the official glyph texts (`None`: nothing quoted).
fn cases() -> anyhow::Result<Vec<(String, Option<String>)>> {
    let json = fixture_json()?;
    let prompts: Vec<String> = serde_json::from_value(json["prompts"].clone())?;
    let texts: Vec<Option<String>> = serde_json::from_value(json["glyph_texts"].clone())?;
    Ok(prompts.into_iter().zip(texts).collect())
}

#[test]
fn glyph_texts_and_tokens_are_the_pipelines() -> anyhow::Result<()> {
    let inputs = tensors("inputs.safetensors")?;
    let ids = inputs["input_ids"].to_dtype(DType::I64)?.to_vec2::<i64>()?;
    let mask = inputs["attention_mask"]
        .to_dtype(DType::I64)?
        .to_vec2::<i64>()?;
    let quoted: Vec<String> = cases()?
        .into_iter()
        .filter_map(|(prompt, want)| {
            assert_eq!(glyph_text(&prompt), want, "{prompt:?}");
            want
        })
        .collect();
    assert_eq!(quoted.len(), ids.len());
    for ((text, want_ids), want_mask) in quoted.iter().zip(&ids).zip(&mask) {
        let got: Vec<i64> = tokenizer::token_ids(text, MAX_LENGTH)
            .into_iter()
            .map(i64::from)
            .collect();
        let valid = want_mask.iter().filter(|&&m| m != 0).count();
        assert_eq!(got.len(), valid, "{text:?}");
        assert_eq!(&got[..], &want_ids[..valid], "{text:?}");
        assert!(want_ids[valid..].iter().all(|&id| id == 0));
    }
    Ok(())
}

/// Both layouts load, and the states of each glyph text's tokens are the official encoder's.
#[test]
fn both_layouts_encode_as_the_official_encoder() -> anyhow::Result<()> {
    let (inputs, expected) = (
        tensors("inputs.safetensors")?,
        tensors("expected.safetensors")?,
    );
    let mask = inputs["attention_mask"]
        .to_dtype(DType::I64)?
        .to_vec2::<i64>()?;
    for file in ["byt5_model.pt", "weights.safetensors"] {
        let encoder = GlyphEncoder::load(&fixture_dir().join(file), DType::F32, &Device::Cpu)?;
        assert_eq!(encoder.config().vocab, tokenizer::GLYPH_VOCAB);
        let mut row = 0;
        for (prompt, text) in cases()? {
            let got = encoder.encode_prompt(&prompt)?;
            let Some(got) = got else {
                assert!(text.is_none(), "{prompt:?}");
                continue;
            };
            let valid = mask[row].iter().filter(|&&m| m != 0).count();
            let want = expected["hidden"].get(row)?.narrow(0, 0, valid)?;
            assert_eq!(got.dims(), want.dims());
            let err = (&got - &want)?.abs()?.max_all()?.to_scalar::<f32>()?;
            let scale = want.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(err <= 1e-4 * scale.max(1.0), "{file} row {row}: {err}");
            row += 1;
        }
        assert_eq!(row, mask.len());
    }
    Ok(())
}

#[test]
fn folders_and_the_base_byt5_are_told_apart() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let checkpoints = dir.path().join("text_encoder/Glyph-SDXL-v2/checkpoints");
    std::fs::create_dir_all(&checkpoints)?;
    std::fs::copy(
        fixture_dir().join("byt5_model.pt"),
        checkpoints.join("byt5_model.pt"),
    )?;
    for folder in ["", "text_encoder", "text_encoder/Glyph-SDXL-v2"] {
        let path = dir.path().join(folder);
        assert_eq!(
            glyph_weights_file(&path)?,
            checkpoints.join("byt5_model.pt")
        );
    }
    let llm = dir.path().join("text_encoder/llm");
    std::fs::create_dir_all(&llm)?;
    assert_eq!(glyph_beside(&llm), Some(checkpoints.join("byt5_model.pt")));
    let err = glyph_weights_file(&checkpoints.join("missing"))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("not found"), "{err}");

    // google/byt5-small itself: its 384-row embedding.
    let mut base = tensors("weights.safetensors")?;
    let shared = base["shared.weight"].narrow(0, 0, tokenizer::BASE_VOCAB)?;
    base.insert("shared.weight".into(), shared);
    let path = dir.path().join("byt5-small.safetensors");
    candle_core::safetensors::save(&base, &path)?;
    let err = GlyphEncoder::load(&path, DType::F32, &Device::Cpu)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("google/byt5-small")
            && err.contains("byt5_small_glyphxl_fp16")
            && err.ends_with("byt5-small.safetensors"),
        "{err}"
    );
    Ok(())
}

#[test]
fn inspect_names_both_layouts() -> anyhow::Result<()> {
    for (file, layout) in [
        ("byt5_model.pt", "official byt5_model.pt"),
        ("weights.safetensors", "Hugging Face names"),
    ] {
        let path = fixture_dir().join(file);
        let shown = identify(&path).map(|f| f.to_string()).unwrap_or_default();
        assert!(
            shown.starts_with("byT5-small glyph encoder with Glyph-SDXL-v2's")
                && shown.contains(layout)
                && shown.contains("vocabulary 1510")
                && shown.contains("HunyuanVideo 1.5"),
            "{file}:\n{shown}"
        );
    }
    Ok(())
}
