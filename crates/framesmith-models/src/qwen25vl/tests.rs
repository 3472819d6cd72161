//! The language model, tokenizer and Qwen-Image prompt encoding against the fixtures made by transformers'
//! `Qwen2_5_VLForConditionalGeneration` through diffusers' `QwenImagePipeline` (`bench/reference/qwen25vl.py`).

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};

use super::encoder::{QWEN_IMAGE_DROP_TOKENS, QWEN_IMAGE_TEMPLATE};
use super::*;
use crate::fixtures::FixtureCase;

pub(super) fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen25vl")
}

/// The fixture case: its config.json, weights, inputs and expected outputs.
pub(super) fn case() -> anyhow::Result<FixtureCase> {
    FixtureCase::load_dir(&fixture_dir())
}

/// The fixture's config.json.
pub(super) fn fixture_json() -> anyhow::Result<serde_json::Value> {
    Ok(case()?.config)
}

/// The fixture model's sizes.
pub(super) fn fixture_config() -> anyhow::Result<Qwen25VlTextConfig> {
    let json = fixture_json()?;
    Ok(Qwen25VlTextConfig::from_hf_json(
        &json["text_config"].to_string(),
    )?)
}

/// f32 on the CPU with the fixture's sizes.
pub(super) fn f32_options() -> anyhow::Result<LoadOptions> {
    Ok(LoadOptions {
        dtype: DType::F32,
        config: Some(fixture_config()?),
        ..LoadOptions::new(&Device::Cpu)
    })
}

/// ‖got − want‖ / ‖want‖, after checking the shapes agree.
pub(super) fn rel_error(got: &Tensor, want: &Tensor) -> anyhow::Result<f64> {
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

fn assert_rel(name: &str, got: &Tensor, want: &Tensor) -> anyhow::Result<()> {
    let rel = rel_error(got, want)?;
    anyhow::ensure!(rel <= 1e-4, "{name}: relative error {rel:.3e} above 1e-4");
    Ok(())
}

fn encoder() -> anyhow::Result<Qwen25VlTextEncoder> {
    let weights = fixture_dir().join("weights.safetensors");
    Ok(Qwen25VlTextEncoder {
        tokenizer: Qwen2Tokenizer::load(&fixture_dir().join("tokenizer.json"))?,
        model: load_text_model(&weights, &f32_options()?)?,
    })
}

#[test]
fn hidden_states_match_transformers() -> anyhow::Result<()> {
    let case = case()?;
    let (inputs, expected) = (&case.inputs, &case.expected);
    let model = encoder()?.model;
    let (ids, mask) = (&inputs["input_ids"], &inputs["attention_mask"]);
    assert_rel(
        "hidden_last",
        &model.hidden_states(ids, mask, 0)?,
        &expected["hidden_last"],
    )?;
    assert_rel(
        "hidden_skip2",
        &model.hidden_states(ids, mask, 2)?,
        &expected["hidden_skip2"],
    )?;
    Ok(())
}

#[test]
fn a_perturbed_reference_fails() -> anyhow::Result<()> {
    let case = case()?;
    let (inputs, expected) = (&case.inputs, &case.expected);
    let model = encoder()?.model;
    let got = model.hidden_states(&inputs["input_ids"], &inputs["attention_mask"], 0)?;
    let want = &expected["hidden_last"];
    assert_rel("hidden_last", &got, want)?;
    // One state of one token moved by 1%: the comparison must see it.
    let (b, l, h) = want.dims3()?;
    let mut bump = vec![0f32; b * l * h];
    bump[h + 3] = 0.01 * want.abs()?.max_all()?.to_scalar::<f32>()? * 10.0;
    let perturbed = (want + Tensor::from_vec(bump, (b, l, h), &Device::Cpu)?)?;
    assert!(assert_rel("perturbed", &got, &perturbed).is_err());
    // Another layer's output is not the one asked for.
    assert!(assert_rel(
        "skip1",
        &model.hidden_states(&inputs["input_ids"], &inputs["attention_mask"], 1)?,
        want
    )
    .is_err());
    Ok(())
}

#[test]
fn prompt_embeds_match_the_qwen_image_pipeline() -> anyhow::Result<()> {
    let expected = case()?.expected;
    let json = fixture_json()?;
    let prompts: Vec<String> = serde_json::from_value(json["prompts"].clone())?;
    let encoder = encoder()?;
    let none = encoder.encode_prompts(&[])?;
    assert_eq!((none.embeds.dims(), none.lens.len()), (&[0, 0, 64][..], 0));
    for (max_len, suffix) in [(1024, ""), (5, "_msl5")] {
        let out = encoder.encode_prompts_up_to(&prompts, max_len)?;
        assert_rel(
            &format!("prompt_embeds{suffix}"),
            &out.embeds,
            &expected[&format!("prompt_embeds{suffix}")],
        )?;
        let want_mask = expected[&format!("prompt_mask{suffix}")].to_dtype(DType::U32)?;
        assert_eq!(
            out.mask.to_vec2::<u32>()?,
            want_mask.to_vec2::<u32>()?,
            "prompt_mask{suffix}"
        );
        let sums: Vec<usize> = want_mask
            .to_vec2::<u32>()?
            .iter()
            .map(|r| r.iter().sum::<u32>() as usize)
            .collect();
        assert_eq!(out.lens, sums);
    }
    Ok(())
}

#[test]
fn the_tokenizer_gives_the_official_ids() -> anyhow::Result<()> {
    let inputs = case()?.inputs;
    let json = fixture_json()?;
    let prompts: Vec<String> = serde_json::from_value(json["prompts"].clone())?;
    let texts: Vec<String> = prompts
        .iter()
        .map(|p| QWEN_IMAGE_TEMPLATE.replacen("{}", p, 1))
        .collect();
    let tokenizer = Qwen2Tokenizer::load(&fixture_dir().join("tokenizer.json"))?;
    let batch = tokenizer.encode_batch(&texts, 1058, &Device::Cpu)?;
    let want = |k: &str| -> anyhow::Result<Vec<Vec<u32>>> {
        Ok(inputs[k].to_dtype(DType::U32)?.to_vec2::<u32>()?)
    };
    assert_eq!(batch.ids.to_vec2::<u32>()?, want("input_ids")?);
    assert_eq!(batch.mask.to_vec2::<u32>()?, want("attention_mask")?);
    // Truncation keeps the first tokens.
    let cut = tokenizer.encode_batch(&texts[..1], 40, &Device::Cpu)?;
    assert_eq!(
        cut.ids.to_vec2::<u32>()?[0],
        want("input_ids")?[0][..40].to_vec()
    );
    Ok(())
}

/// The real template, tokenized by a Qwen2-style tokenizer whose vocabulary holds each of its words (as Qwen's
/// does): the part before the prompt is the 34 tokens the pipeline drops, so the embeddings start at the prompt.
#[test]
fn the_dropped_tokens_are_the_templates_system_part() -> anyhow::Result<()> {
    let json = fixture_json()?;
    assert_eq!(json["template"].as_str(), Some(QWEN_IMAGE_TEMPLATE));
    assert_eq!(
        encoder::chat_prompt(encoder::QWEN_IMAGE_SYSTEM, "{}"),
        QWEN_IMAGE_TEMPLATE
    );
    assert_eq!(
        json["drop_idx"].as_u64(),
        Some(QWEN_IMAGE_DROP_TOKENS as u64)
    );
    let tokenizer = Qwen2Tokenizer::load(&fixture_dir().join("tokenizer.json"))?;
    let (prefix, _) = QWEN_IMAGE_TEMPLATE.split_once("{}").unwrap_or_default();
    let ids = tokenizer.encode(prefix)?;
    let want = case()?.expected["template_prefix_ids"]
        .to_dtype(DType::U32)?
        .to_vec1::<u32>()?;
    assert_eq!(ids, want);
    assert_eq!(ids.len(), QWEN_IMAGE_DROP_TOKENS);
    let im_start = tokenizer.token_id(tokenizer::IM_START);
    assert_eq!(ids.iter().filter(|&&i| Some(i) == im_start).count(), 2);
    // A prompt's first token follows them directly.
    let full = tokenizer.encode(&QWEN_IMAGE_TEMPLATE.replacen("{}", "cat", 1))?;
    assert_eq!(full[..QWEN_IMAGE_DROP_TOKENS], ids[..]);
    assert_eq!(
        full[QWEN_IMAGE_DROP_TOKENS..],
        tokenizer.encode("cat<|im_end|>\n<|im_start|>assistant\n")?[..]
    );
    Ok(())
}

/// A `tokenizer/` folder with Qwen2's `vocab.json` + `merges.txt` + `tokenizer_config.json` (no tokenizer.json)
/// tokenizes as the tokenizer.json made from the same vocabulary.
#[test]
fn vocab_and_merges_tokenize_like_tokenizer_json() -> anyhow::Result<()> {
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        fixture_dir().join("tokenizer.json"),
    )?)?;
    let dir = tempfile::tempdir()?;
    let tok_dir = dir.path().join("tokenizer");
    std::fs::create_dir(&tok_dir)?;
    std::fs::write(
        tok_dir.join("vocab.json"),
        json["model"]["vocab"].to_string(),
    )?;
    let merges: Vec<String> = json["model"]["merges"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| match m.as_array() {
            Some(pair) => pair
                .iter()
                .filter_map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(" "),
            None => m.as_str().unwrap_or_default().to_string(),
        })
        .collect();
    std::fs::write(
        tok_dir.join("merges.txt"),
        format!("#version: 0.2\n{}\n", merges.join("\n")),
    )?;
    let decoder: serde_json::Map<String, serde_json::Value> = json["added_tokens"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            (
                t["id"].to_string(),
                serde_json::json!({"content": t["content"], "special": true}),
            )
        })
        .collect();
    std::fs::write(
        tok_dir.join("tokenizer_config.json"),
        serde_json::json!({ "added_tokens_decoder": decoder }).to_string(),
    )?;
    // Found from the text encoder's folder beside it, as diffusers lays them out.
    let weights = dir.path().join("text_encoder/model.safetensors");
    let from_folder = Qwen2Tokenizer::for_weights(&weights, None)?;
    let from_json = Qwen2Tokenizer::load(&fixture_dir().join("tokenizer.json"))?;
    let text = QWEN_IMAGE_TEMPLATE.replacen("{}", "A red fox, Ünïcode wörds", 1);
    assert_eq!(from_folder.encode(&text)?, from_json.encode(&text)?);
    assert_eq!(from_folder.pad_id(), from_json.pad_id());

    let nowhere = tempfile::tempdir()?;
    let err = Qwen2Tokenizer::for_weights(&nowhere.path().join("qwen_2.5_vl_7b.safetensors"), None)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("Qwen/Qwen-Image") && err.ends_with("qwen_2.5_vl_7b.safetensors"),
        "{err}"
    );
    Ok(())
}

#[test]
fn drop_and_repad_cuts_each_row_and_pads_with_zeros() -> anyhow::Result<()> {
    let hidden = Tensor::arange(1f32, 25., &Device::Cpu)?.reshape((2, 6, 2))?;
    let out = encoder::drop_and_repad(&hidden, &[6, 4], 2, 10)?;
    assert_eq!(out.lens, vec![4, 2]);
    assert_eq!(
        out.mask.to_vec2::<u32>()?,
        vec![vec![1, 1, 1, 1], vec![1, 1, 0, 0]]
    );
    let rows = out.embeds.to_vec3::<f32>()?;
    assert_eq!(
        rows[1],
        vec![vec![17., 18.], vec![19., 20.], vec![0., 0.], vec![0., 0.]]
    );
    let cut = encoder::drop_and_repad(&hidden, &[6, 4], 2, 3)?;
    assert_eq!(
        (cut.embeds.dims(), cut.lens.clone()),
        (&[2, 3, 2][..], vec![3, 2])
    );
    Ok(())
}

/// Text positions given as 3-D positions (all three axes 0..l, as `get_rope_index` gives text) reproduce the
/// text-only states exactly; the height axis held at 0 changes them.
#[test]
fn text_positions_through_the_multimodal_path_are_the_text_path() -> anyhow::Result<()> {
    let case = case()?;
    let model = encoder()?.model;
    let (ids, mask) = (&case.inputs["input_ids"], &case.inputs["attention_mask"]);
    let (b, l) = ids.dims2()?;
    let want = model.hidden_states(ids, mask, 0)?;
    let text: Vec<u32> = (0..l as u32).collect();
    let positions = vec![[text.clone(), text.clone(), text.clone()]; b];
    let got = model.hidden_states_at(&model.embed(ids)?, mask, &positions, 0)?;
    assert_eq!(rel_error(&got, &want)?, 0.0);
    let mut moved = positions.clone();
    for row in &mut moved {
        row[1] = vec![0; l];
    }
    let got = model.hidden_states_at(&model.embed(ids)?, mask, &moved, 0)?;
    assert!(rel_error(&got, &want)? > 1e-4);
    Ok(())
}
