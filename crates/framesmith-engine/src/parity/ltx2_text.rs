//! Parity of LTX-2's text side (`ltx2_text` fixtures of `bench/reference/ltx2_text.py`): the Gemma 3 files read
//! through the users' loader (a Hugging Face folder, or one file with its config and tokenizer embedded), each
//! prompt's ids and mask from the tokenizer against ltx-core's, Gemma's every hidden state on the official ids, the
//! feature extractor's output, and the connector's output and mask, and the audio stream's features and audio
//! connector's output (the LTX-2 checkpoint's text parts read from `ltx_text.safetensors` as from a release file).

use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::{DType, Device, Tensor};

use super::{compare, compare_exact, Fixture, ParityRow, OUTPUT_REL_TOL};
use framesmith_models::gemma3::{load_text_model, GemmaTokenizer, LoadOptions, PaddedPrompt};
use framesmith_models::ltx2::text::{connect, connect_audio, PromptFeatures, TextParts};

/// The fixture's Gemma 3: its folder, or its single file.
fn gemma_path(dir: &Path) -> PathBuf {
    let folder = dir.join("gemma");
    if folder.is_dir() {
        folder
    } else {
        dir.join("gemma_3_12B_it.safetensors")
    }
}

fn ints(t: &Tensor) -> anyhow::Result<Vec<i64>> {
    Ok(t.to_dtype(DType::I64)?.flatten_all()?.to_vec1::<i64>()?)
}

/// Runs the case in `dir`.
pub fn check(fixture: &Fixture, dir: &Path) -> anyhow::Result<Vec<ParityRow>> {
    let prompts: Vec<String> = serde_json::from_value(
        fixture
            .config
            .get("prompts")
            .cloned()
            .context("fixture config: missing `prompts`")?,
    )?;
    let max_length = fixture
        .config
        .get("max_length")
        .and_then(serde_json::Value::as_u64)
        .context("fixture config: missing `max_length`")? as usize;
    let cpu = Device::Cpu;
    let gemma_file = gemma_path(dir);
    let options = LoadOptions {
        dtype: DType::F32,
        any_size: true,
        ..LoadOptions::new(&cpu)
    };
    let (file, gemma) = load_text_model(&gemma_file, &options)?;
    let tokenizer = GemmaTokenizer::for_weights(&gemma_file, None, max_length)?;
    let parts = TextParts::open(&dir.join("ltx_text.safetensors"))?;
    let states = file.config.num_hidden_layers + 1;
    let extractor =
        parts.feature_extractor_av((file.config.hidden_size, states), DType::F32, &cpu)?;
    let connector = parts.connector(DType::F32, &cpu)?;
    let audio_connector = parts.audio_connector(DType::F32, &cpu)?;
    let models = Models {
        tokenizer: &tokenizer,
        gemma: &gemma,
        extractor: &extractor,
        connector: &connector,
        audio_connector: &audio_connector,
    };
    let mut rows = Vec::new();
    for (i, prompt) in prompts.iter().enumerate() {
        rows.extend(prompt_rows(fixture, &models, i, prompt)?);
    }
    Ok(rows)
}

/// The models a case runs.
struct Models<'a> {
    tokenizer: &'a GemmaTokenizer,
    gemma: &'a framesmith_models::gemma3::Gemma3Text,
    extractor: &'a framesmith_models::ltx2::text::FeatureExtractor,
    connector: &'a framesmith_models::ltx2::text::Connector,
    audio_connector: &'a framesmith_models::ltx2::text::Connector,
}

/// The rows of prompt `i`: its tokens, Gemma's hidden states on the official tokens, the features, the
/// connector's output and mask.
fn prompt_rows(
    fixture: &Fixture,
    m: &Models<'_>,
    i: usize,
    prompt: &str,
) -> anyhow::Result<Vec<ParityRow>> {
    let (ids, mask) = (fixture.input("ids")?, fixture.input("mask")?);
    let mut rows = Vec::new();
    let padded = m.tokenizer.encode_padded(prompt)?;
    let want_ids = ids.get(i)?;
    let want_mask = mask.get(i)?;
    let as_i64 = |v: &[u32]| v.iter().map(|&x| i64::from(x)).collect::<Vec<_>>();
    rows.push(compare_exact(
        &format!("p{i}.ids"),
        &as_i64(&padded.ids),
        &want_ids,
    )?);
    rows.push(compare_exact(
        &format!("p{i}.mask"),
        &as_i64(&padded.mask),
        &want_mask,
    )?);
    // The model runs on the official tokens, so a tokenizer mismatch shows in its own rows only.
    let official = PaddedPrompt {
        ids: ints(&want_ids)?.into_iter().map(|x| x as u32).collect(),
        mask: ints(&want_mask)?.into_iter().map(|x| x as u32).collect(),
    };
    let ids_t = want_ids.unsqueeze(0)?.to_dtype(DType::U32)?;
    let mask_t = want_mask.unsqueeze(0)?.to_dtype(DType::U32)?;
    let hidden = m.gemma.hidden_states(&ids_t, &mask_t)?;
    for (k, state) in hidden.iter().enumerate() {
        let name = format!("p{i}.hidden.{k}");
        rows.push(compare(
            &name,
            &state.squeeze(0)?,
            fixture.expected(&name)?,
            OUTPUT_REL_TOL,
        )?);
    }
    let (features, audio) = m.extractor.forward_av(&hidden, &mask_t)?;
    let features = features.squeeze(0)?;
    let audio_features = audio
        .context("the feature extractor gave no audio features")?
        .squeeze(0)?;
    for (name, got) in [("features", &features), ("audio_features", &audio_features)] {
        let name = format!("p{i}.{name}");
        rows.push(compare(
            &name,
            got,
            fixture.expected(&name)?,
            OUTPUT_REL_TOL,
        )?);
    }
    let prompt = PromptFeatures {
        features,
        audio_features: Some(audio_features),
        prompt: official,
    };
    let (encoding, out_mask) = connect(m.connector, &prompt)?;
    let name = format!("p{i}.audio_encoding");
    rows.push(compare(
        &name,
        &connect_audio(m.audio_connector, &prompt)?,
        fixture.expected(&name)?,
        OUTPUT_REL_TOL,
    )?);
    let name = format!("p{i}.video_encoding");
    rows.push(compare(
        &name,
        &encoding,
        fixture.expected(&name)?,
        OUTPUT_REL_TOL,
    )?);
    let name = format!("p{i}.attention_mask");
    rows.push(compare_exact(
        &name,
        &as_i64(&out_mask),
        fixture.expected(&name)?,
    )?);
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn case_dir(case: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../framesmith-models/tests/fixtures/ltx2_text")
            .join(case)
    }

    fn failed(rows: &[ParityRow]) -> Vec<String> {
        rows.iter()
            .filter(|r| !r.passed)
            .map(|r| r.name.clone())
            .collect()
    }

    /// Copies the case `case` into a temporary folder (the Gemma folder too).
    fn copy_case(case: &str, to: &Path) -> anyhow::Result<()> {
        for entry in std::fs::read_dir(case_dir(case))? {
            let path = entry?.path();
            let target = to.join(path.file_name().context("a file name")?);
            if path.is_dir() {
                std::fs::create_dir_all(&target)?;
                for inner in std::fs::read_dir(&path)? {
                    let inner = inner?.path();
                    std::fs::copy(
                        &inner,
                        target.join(inner.file_name().context("a file name")?),
                    )?;
                }
            } else {
                std::fs::copy(&path, &target)?;
            }
        }
        Ok(())
    }

    #[test]
    fn both_releases_pass_and_a_perturbed_reference_fails() -> anyhow::Result<()> {
        for case in ["ltx2", "ltx23"] {
            let rows = super::super::check_fixture(&case_dir(case))?;
            for row in &rows {
                println!("{case} {row}");
            }
            assert_eq!(rows.len(), 4 * 11, "{case}");
            assert!(
                failed(&rows).is_empty(),
                "{case}: failed rows {:?}",
                failed(&rows)
            );
        }
        let dir = tempfile::tempdir()?;
        copy_case("ltx23", dir.path())?;
        let mut expected: HashMap<String, Tensor> = candle_core::safetensors::load(
            case_dir("ltx23").join("expected.safetensors"),
            &Device::Cpu,
        )?;
        for row in ["p2.video_encoding", "p1.audio_encoding"] {
            let encoding = &expected[row];
            let bumped = (encoding + encoding.affine(0.0, 1e-2)?)?;
            expected.insert(row.into(), bumped);
        }
        candle_core::safetensors::save(&expected, dir.path().join("expected.safetensors"))?;
        let rows = super::super::check_fixture(dir.path())?;
        assert_eq!(
            failed(&rows),
            vec![
                "p1.audio_encoding".to_string(),
                "p2.video_encoding".to_string()
            ]
        );
        Ok(())
    }
}
