//! Parity of the Qwen2.5-VL text encoder (`qwen25vl_text_encoder` fixtures of `bench/reference/qwen25vl.py`): the
//! fixture's tokenizer on the templated prompts against the official ids, the language model's
//! `hidden_states[-1]` and `[-3]`, and Qwen-Image's prompt embeddings and masks (max_sequence_length 1024 and 5).

use std::path::Path;

use anyhow::Context;
use candle_core::{DType, Device, Tensor};

use super::{compare, compare_exact, Fixture, ParityRow, OUTPUT_REL_TOL};
use framesmith_models::qwen25vl::encoder::QWEN_IMAGE_TEMPLATE;
use framesmith_models::qwen25vl::{
    load_text_model, LoadOptions, Qwen25VlTextConfig, Qwen25VlTextEncoder, Qwen2Tokenizer,
};

fn ids(t: &Tensor) -> anyhow::Result<Vec<i64>> {
    Ok(t.to_dtype(DType::I64)?.flatten_all()?.to_vec1::<i64>()?)
}

/// Runs the case in `dir` (its `weights.safetensors` and `tokenizer.json` read through the users' loaders).
pub fn check(fixture: &Fixture, dir: &Path) -> anyhow::Result<Vec<ParityRow>> {
    let text_config = fixture
        .config
        .get("text_config")
        .context("fixture config: missing `text_config`")?;
    let cfg = Qwen25VlTextConfig::from_hf_json(&text_config.to_string())?;
    let prompts: Vec<String> = serde_json::from_value(
        fixture
            .config
            .get("prompts")
            .cloned()
            .context("fixture config: missing `prompts`")?,
    )?;
    let options = LoadOptions {
        dtype: DType::F32,
        config: Some(cfg),
        ..LoadOptions::new(&Device::Cpu)
    };
    let encoder = Qwen25VlTextEncoder {
        tokenizer: Qwen2Tokenizer::load(&dir.join("tokenizer.json"))?,
        model: load_text_model(&dir.join("weights.safetensors"), &options)?,
    };
    let texts: Vec<String> = prompts
        .iter()
        .map(|p| QWEN_IMAGE_TEMPLATE.replacen("{}", p, 1))
        .collect();
    let batch = encoder.tokenizer.encode_batch(&texts, 1058, &Device::Cpu)?;
    let (want_ids, want_mask) = (
        fixture.input("input_ids")?,
        fixture.input("attention_mask")?,
    );
    let mut rows = vec![
        compare_exact("input_ids", &ids(&batch.ids)?, want_ids)?,
        compare_exact("attention_mask", &ids(&batch.mask)?, want_mask)?,
    ];
    for (name, skip) in [("hidden_last", 0), ("hidden_skip2", 2)] {
        let hidden = encoder.model.hidden_states(want_ids, want_mask, skip)?;
        rows.push(compare(
            name,
            &hidden,
            fixture.expected(name)?,
            OUTPUT_REL_TOL,
        )?);
    }
    for (max_len, suffix) in [(1024, ""), (5, "_msl5")] {
        let out = encoder.encode_prompts_up_to(&prompts, max_len)?;
        let embeds = format!("prompt_embeds{suffix}");
        rows.push(compare(
            &embeds,
            &out.embeds,
            fixture.expected(&embeds)?,
            OUTPUT_REL_TOL,
        )?);
        let mask = format!("prompt_mask{suffix}");
        rows.push(compare_exact(
            &mask,
            &ids(&out.mask)?,
            fixture.expected(&mask)?,
        )?);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::PathBuf;

    use super::*;

    fn case_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../framesmith-models/tests/fixtures/qwen25vl")
    }

    fn failed(rows: &[ParityRow]) -> Vec<String> {
        rows.iter()
            .filter(|r| !r.passed)
            .map(|r| r.name.clone())
            .collect()
    }

    #[test]
    fn the_fixture_passes_and_a_perturbed_one_fails() -> anyhow::Result<()> {
        let rows = super::super::check_fixture(&case_dir())?;
        for row in &rows {
            println!("{row}");
        }
        assert_eq!(rows.len(), 8);
        assert!(failed(&rows).is_empty(), "failed rows {:?}", failed(&rows));

        let dir = tempfile::tempdir()?;
        for name in [
            "config.json",
            "tokenizer.json",
            "weights.safetensors",
            "inputs.safetensors",
        ] {
            std::fs::copy(case_dir().join(name), dir.path().join(name))?;
        }
        let mut expected: HashMap<String, Tensor> =
            candle_core::safetensors::load(case_dir().join("expected.safetensors"), &Device::Cpu)?;
        let hidden = &expected["hidden_skip2"];
        let bumped = (hidden
            + hidden
                .affine(0.0, 1e-2)?
                .narrow(2, 0, 1)?
                .broadcast_as(hidden.shape())?)?;
        expected.insert("hidden_skip2".into(), bumped);
        candle_core::safetensors::save(&expected, dir.path().join("expected.safetensors"))?;
        let rows = super::super::check_fixture(dir.path())?;
        assert_eq!(failed(&rows), vec!["hidden_skip2".to_string()]);
        Ok(())
    }
}
