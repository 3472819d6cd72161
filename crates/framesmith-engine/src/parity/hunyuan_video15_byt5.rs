//! Parity for fixture kind `hunyuan_video15_byt5` (HunyuanVideo 1.5's glyph encoder against the official
//! pipeline's glyph steps over transformers' T5 encoder, `bench/reference/hunyuan_video15_byt5.py`): the prompts'
//! quoted text tokenized as the pipeline does (`input_ids`, exact), and the encoder, loaded from the fixture's
//! official `byt5_model.pt` through the users' loader, on those texts (`hidden` at the valid tokens).

use std::path::Path;

use anyhow::Context;
use candle_core::{DType, Device, Tensor};

use super::{compare, compare_exact, Fixture, ParityRow, OUTPUT_REL_TOL};
use framesmith_models::hunyuan_video15::byt5::{tokenizer, GlyphEncoder, MAX_LENGTH};
use framesmith_models::hunyuan_video15::text::glyph_text;

/// Runs the case in `dir` and compares its token ids and hidden states.
pub fn check(fixture: &Fixture, dir: &Path) -> anyhow::Result<Vec<ParityRow>> {
    let prompts: Vec<String> = serde_json::from_value(
        fixture
            .config
            .get("prompts")
            .cloned()
            .context("fixture config: missing `prompts`")?,
    )?;
    let texts: Vec<String> = prompts.iter().filter_map(|p| glyph_text(p)).collect();
    let mut ids = Vec::with_capacity(texts.len() * MAX_LENGTH);
    for text in &texts {
        let mut row: Vec<i64> = tokenizer::token_ids(text, MAX_LENGTH)
            .into_iter()
            .map(i64::from)
            .collect();
        row.resize(MAX_LENGTH, 0);
        ids.extend(row);
    }
    let encoder = GlyphEncoder::load(&dir.join("byt5_model.pt"), DType::F32, &Device::Cpu)
        .context("loading the fixture's byt5_model.pt")?;
    let expected = fixture.expected("hidden")?;
    let mask = fixture
        .input("attention_mask")?
        .to_dtype(DType::F32)?
        .unsqueeze(2)?;
    let width = expected.dim(2)?;
    let rows = texts
        .iter()
        .map(|text| {
            let states = encoder.encode_text(text)?;
            let pad = MAX_LENGTH - states.dim(0)?;
            Ok(Tensor::cat(
                &[
                    &states,
                    &Tensor::zeros((pad, width), DType::F32, &Device::Cpu)?,
                ],
                0,
            )?)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let hidden = Tensor::stack(&rows, 0)?;
    Ok(vec![
        compare_exact("input_ids", &ids, fixture.input("input_ids")?)?,
        compare(
            "hidden (valid tokens)",
            &hidden,
            &expected.broadcast_mul(&mask)?,
            OUTPUT_REL_TOL,
        )?,
    ])
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::PathBuf;

    use candle_core::Tensor;

    use super::*;

    fn case_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../framesmith-models/tests/fixtures/hunyuan_video15_byt5")
    }

    fn failed(rows: &[ParityRow]) -> Vec<String> {
        rows.iter()
            .filter(|r| !r.passed)
            .map(|r| r.name.clone())
            .collect()
    }

    #[test]
    fn the_fixture_passes_and_a_perturbed_reference_fails() -> anyhow::Result<()> {
        let rows = super::super::check_fixture(&case_dir())?;
        for row in &rows {
            println!("{row}");
        }
        assert_eq!(rows.len(), 2);
        assert!(failed(&rows).is_empty(), "failed rows {:?}", failed(&rows));

        let dir = tempfile::tempdir()?;
        for name in ["config.json", "byt5_model.pt", "inputs.safetensors"] {
            std::fs::copy(case_dir().join(name), dir.path().join(name))?;
        }
        let mut expected: HashMap<String, Tensor> =
            candle_core::safetensors::load(case_dir().join("expected.safetensors"), &Device::Cpu)?;
        let hidden = &expected["hidden"];
        let bumped = (hidden + hidden.affine(0.0, 1e-2)?)?;
        expected.insert("hidden".into(), bumped);
        candle_core::safetensors::save(&expected, dir.path().join("expected.safetensors"))?;
        let rows = super::super::check_fixture(dir.path())?;
        assert_eq!(failed(&rows), vec!["hidden (valid tokens)".to_string()]);
        Ok(())
    }
}
