//! Gemma 3's files and tokenizer on the LTX-2 text fixtures (`tests/fixtures/ltx2_text`): the Hugging Face folder
//! and the packed single file named and loaded, a model of another size refused, LTX-2's prompt handling (left
//! padding, `<bos>` first, truncation) with and without Gemma's post-processor. The hidden states' parity with
//! transformers is checked by the engine's `ltx2_text` parity kind.

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};

use super::*;

fn fixture(case: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/ltx2_text")
        .join(case)
}

#[test]
fn the_folder_and_the_packed_file_are_named_and_load() -> anyhow::Result<()> {
    let folder = identify(&fixture("ltx2").join("gemma"))?;
    assert_eq!(
        (folder.prefix, folder.shards, folder.config_source),
        ("language_model.model.", 1, "config.json")
    );
    assert_eq!(
        folder.config.layer_types,
        [LayerType::Sliding, LayerType::Full, LayerType::Sliding]
    );
    assert_eq!(
        (
            folder.config.sliding_window,
            folder.config.global_rope.linear_factor
        ),
        (4, 8.0)
    );
    let packed = identify(&fixture("ltx23").join("gemma_3_12B_it.safetensors"))?;
    assert_eq!(packed.prefix, "model.");
    assert!(packed.embedded_tokenizer);
    assert_eq!(packed.config, folder.config);
    let report = packed.to_string();
    assert!(
        report.contains("not the 12B model") && report.contains("tokenizer_json"),
        "{report}"
    );

    // A small model is refused unless asked for.
    let err = load_text_model(&folder.path, &LoadOptions::new(&Device::Cpu)).err();
    assert!(
        matches!(err, Some(Gemma3FormatError::WrongSize { layers: 3, .. })),
        "{err:?}"
    );
    let options = LoadOptions {
        dtype: DType::F32,
        any_size: true,
        ..LoadOptions::new(&Device::Cpu)
    };
    let (_, model) = load_text_model(&packed.path, &options)?;
    let ids = Tensor::new(&[[0u32, 2, 5, 9]], &Device::Cpu)?;
    let mask = Tensor::new(&[[0u32, 1, 1, 1]], &Device::Cpu)?;
    let states = model.hidden_states(&ids, &mask)?;
    assert_eq!(states.len(), 4);
    assert_eq!(states[3].dims(), [1, 4, 16]);
    let bad = Tensor::new(&[[0u32, 2, 500, 9]], &Device::Cpu)?;
    assert!(model.hidden_states(&bad, &mask).is_err());

    // Another family's file is not Gemma 3's.
    let ltx = identify(&fixture("ltx2").join("ltx_text.safetensors")).err();
    assert!(
        ltx.as_ref().is_some_and(weights::is_unrecognised),
        "{ltx:?}"
    );
    Ok(())
}

#[test]
fn prompts_are_left_padded_with_bos_first_and_truncated() -> anyhow::Result<()> {
    let dir = fixture("ltx2").join("gemma");
    let tokenizer = GemmaTokenizer::for_weights(&dir, None, 6)?;
    let out = tokenizer.encode_padded("  a red fox  ")?;
    assert_eq!(out.ids, [0, 0, 2, 4, 5, 6]);
    assert_eq!(out.mask, [0, 0, 1, 1, 1, 1]);
    assert_eq!(out.len(), 4);
    let long = tokenizer.encode_padded("a red fox runs through deep snow")?;
    assert_eq!(long.ids, [2, 4, 5, 6, 7, 8]);
    assert_eq!(long.mask, [1; 6]);

    // Without the post-processor, `<bos>` is put first all the same.
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("tokenizer.json"))?)?;
    json["post_processor"] = serde_json::Value::Null;
    let bare = GemmaTokenizer::from_bytes(json.to_string().as_bytes(), &dir, 6)?;
    assert_eq!(bare.encode_padded("a red fox")?, out);
    assert_eq!(
        bare.encode_padded("a red fox runs through deep snow")?,
        long
    );

    // The packed file's embedded tokenizer is found beside nothing.
    let packed = fixture("ltx23").join("gemma_3_12B_it.safetensors");
    let embedded = GemmaTokenizer::for_weights(&packed, None, 6)?;
    assert_eq!(embedded.encode_padded("a red fox")?, out);
    // A tokenizer without `<bos>` is not Gemma's.
    json["added_tokens"] = serde_json::json!([]);
    if let Some(vocab) = json["model"]["vocab"].as_object_mut() {
        vocab.remove("<bos>");
    }
    let err = GemmaTokenizer::from_bytes(json.to_string().as_bytes(), &dir, 6).err();
    assert!(
        matches!(err, Some(GemmaTokenizerError::WrongTokenizer { .. })),
        "{err:?}"
    );
    Ok(())
}
