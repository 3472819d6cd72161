use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use super::*;
use crate::wan::text_encoder::tokenizer::testkit::write_tiny_tokenizer;
use crate::wan::text_encoder::tokenizer::{
    clean_prompt, TokenizerError, UmT5Tokenizer, SPM_FILE, TOKENIZER_FILE,
};
use crate::wan::text_encoder::TextEncoder;

/// The fixture of `testdata/spiece_tiny/make_fixture.py`: a tiny Unigram model trained by SentencePiece and the
/// ids its `SentencePieceProcessor.encode` gives, `</s>` appended.
fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/spiece_tiny")
}

fn model_bytes() -> anyhow::Result<Vec<u8>> {
    Ok(std::fs::read(fixture_dir().join("tiny_unigram.model"))?)
}

#[derive(serde::Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
}

fn cases() -> anyhow::Result<Vec<Case>> {
    let json = std::fs::read_to_string(fixture_dir().join("expected_ids.json"))?;
    Ok(serde_json::from_str(&json)?)
}

fn spm_tokenizer(bytes: &[u8]) -> anyhow::Result<Tokenizer> {
    tokenizer_from_spm(bytes).map_err(|p| anyhow::anyhow!("{p:?}"))
}

fn raw_ids(tokenizer: &Tokenizer, text: &str) -> anyhow::Result<Vec<u32>> {
    let encoding = tokenizer.encode(text, false).map_err(anyhow::Error::msg)?;
    let eos = tokenizer.token_to_id("</s>").unwrap_or(u32::MAX);
    Ok(encoding.get_ids().iter().copied().chain([eos]).collect())
}

/// Every fixture text, as it is (no Wan cleaning), gives exactly SentencePiece's ids: the normaliser table,
/// whitespace rules, dummy prefix, Unigram scores and byte fallback all agree.
#[test]
fn spm_tokenizer_gives_sentencepiece_ids() -> anyhow::Result<()> {
    let tokenizer = spm_tokenizer(&model_bytes()?)?;
    let cases = cases()?;
    assert!(cases.len() >= 20, "{} cases", cases.len());
    let wrong: Vec<String> = cases
        .iter()
        .filter_map(|case| match raw_ids(&tokenizer, &case.text) {
            Ok(ids) if ids == case.ids => None,
            got => Some(format!("{:?}: got {got:?}, want {:?}", case.text, case.ids)),
        })
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // The fixture does exercise byte fallback and the normaliser table.
    let byte = tokenizer.token_to_id("<0xF0>").unwrap_or(u32::MAX);
    assert!(cases.iter().any(|c| c.ids.contains(&byte)));
    Ok(())
}

#[test]
fn spm_tokenizer_decodes_byte_fallback_back_to_text() -> anyhow::Result<()> {
    let tokenizer = spm_tokenizer(&model_bytes()?)?;
    for text in [
        "a red cat walks on the left",
        "emoji 🦀🎬 and café",
        "東京の猫",
    ] {
        let ids = tokenizer.encode(text, false).map_err(anyhow::Error::msg)?;
        let decoded = tokenizer
            .decode(ids.get_ids(), true)
            .map_err(anyhow::Error::msg)?;
        assert_eq!(decoded, text);
    }
    Ok(())
}

/// The Wan wrapper keeps its own cleaning in front of a SentencePiece tokenizer: already clean prompts give the
/// reference ids, and the cleaning still changes the others.
#[test]
fn wan_cleaning_stays_in_front_of_the_spm_tokenizer() -> anyhow::Result<()> {
    let bytes = model_bytes()?;
    let tok = UmT5Tokenizer::from_spm(&bytes, "the SentencePiece model", Path::new("t.model"))?;
    let tokenizer = spm_tokenizer(&bytes)?;
    let cases = cases()?;
    let clean: Vec<&Case> = cases
        .iter()
        .filter(|c| clean_prompt(&c.text) == c.text)
        .collect();
    assert!(clean.len() >= 10, "{} clean cases", clean.len());
    for case in clean {
        assert_eq!(tok.tokenize(&case.text)?, case.ids, "{:?}", case.text);
    }
    for case in &cases {
        let cleaned = raw_ids(&tokenizer, &clean_prompt(&case.text))?;
        assert_eq!(tok.tokenize(&case.text)?, cleaned, "{:?}", case.text);
    }
    // Curly quotes become straight ones before the tokenizer sees them (SentencePiece alone keeps them).
    let quoted = "“curly quotes” and ‘single’ — dashes…";
    let reference = cases.iter().find(|c| c.text == quoted).map(|c| &c.ids);
    assert!(reference.is_some_and(|ids| *ids != tok.tokenize(quoted).unwrap_or_default()));
    Ok(())
}

/// A safetensors file shaped like ComfyUI's umT5 files: weights plus the U8 `spiece_model` tensor.
fn write_weights(path: &Path, spm: Option<Tensor>) -> anyhow::Result<()> {
    let mut tensors = HashMap::new();
    tensors.insert(
        "token_embedding.weight".to_string(),
        Tensor::ones((8, 4), DType::F32, &Device::Cpu)?,
    );
    tensors.insert(
        "blocks.0.attn.q.weight".to_string(),
        Tensor::ones((4, 4), DType::F16, &Device::Cpu)?,
    );
    if let Some(spm) = spm {
        tensors.insert(SPIECE_TENSOR.to_string(), spm);
    }
    candle_core::safetensors::save(&tensors, path)?;
    Ok(())
}

fn bytes_tensor(bytes: &[u8]) -> anyhow::Result<Tensor> {
    Ok(Tensor::from_vec(bytes.to_vec(), bytes.len(), &Device::Cpu)?)
}

#[test]
fn the_spiece_model_tensor_is_found_and_used() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let weights = dir.path().join("umt5_xxl_fp16.safetensors");
    let bytes = model_bytes()?;
    write_weights(&weights, Some(bytes_tensor(&bytes)?))?;
    let tok = UmT5Tokenizer::for_weights(&weights, None)?;
    assert_eq!(tok.vocab_size(), 500);
    let case = cases()?
        .into_iter()
        .find(|c| c.text == "a red cat walks on the left")
        .ok_or_else(|| anyhow::anyhow!("no such case"))?;
    assert_eq!(tok.tokenize(&case.text)?, case.ids);

    // A spiece.model beside the weights comes before the tensor, and a tokenizer.json before both.
    std::fs::write(dir.path().join(SPM_FILE), &bytes)?;
    write_weights(&weights, Some(bytes_tensor(b"damaged")?))?;
    assert_eq!(
        UmT5Tokenizer::for_weights(&weights, None)?.tokenize(&case.text)?,
        case.ids
    );
    write_tiny_tokenizer(&dir.path().join(TOKENIZER_FILE))?;
    assert!(UmT5Tokenizer::for_weights(&weights, None)?.vocab_size() < 100);
    // So does a tokenizer given explicitly, `.model` read as SentencePiece.
    let explicit = UmT5Tokenizer::for_weights(&weights, Some(&dir.path().join(SPM_FILE)))?;
    assert_eq!(explicit.vocab_size(), 500);
    Ok(())
}

/// A ComfyUI-style file loads whole: the tokenizer from its tensor, the encoder without it.
#[test]
fn text_encoder_loads_from_one_file_with_its_tokenizer() -> anyhow::Result<()> {
    let fixture = crate::fixtures::wan_case("umt5_tiny").join("weights.safetensors");
    let mut tensors = candle_core::safetensors::load(&fixture, &Device::Cpu)?;
    tensors.insert(SPIECE_TENSOR.to_string(), bytes_tensor(&model_bytes()?)?);
    let dir = tempfile::tempdir()?;
    let weights = dir.path().join("umt5_tiny_comfy.safetensors");
    candle_core::safetensors::save(&tensors, &weights)?;
    let te = TextEncoder::load(&weights, None, DType::F32, &Device::Cpu)?;
    assert_eq!(te.tokenizer.vocab_size(), 500);
    assert_eq!(te.encoder.config().vocab, 100);
    Ok(())
}

fn load_error(weights: &Path) -> String {
    UmT5Tokenizer::for_weights(weights, None)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default()
}

#[test]
fn weights_without_a_tokenizer_say_where_to_put_one() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let weights = dir.path().join("umt5.safetensors");
    write_weights(&weights, None)?;
    let msg = load_error(&weights);
    assert!(
        msg.starts_with("no umT5 tokenizer found")
            && msg.contains("no `spiece_model` tensor")
            && msg.contains("put tokenizer.json from the umT5 folder (google/umt5-xxl")
            && msg.contains("--tokenizer")
            && msg.ends_with(&weights.display().to_string()),
        "{msg}"
    );
    // The official PyTorch file holds no tokenizer either.
    let pth = dir.path().join("models_t5_umt5-xxl-enc-bf16.pth");
    std::fs::write(&pth, b"PK\x03\x04 a zip archive")?;
    assert!(load_error(&pth).contains("no `spiece_model` tensor"));
    // A missing file is named as missing.
    let absent = dir.path().join("absent.safetensors");
    assert!(load_error(&absent).contains("no file or folder at this path"));
    Ok(())
}

#[test]
fn a_damaged_spiece_model_tensor_is_named() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let weights = dir.path().join("umt5.safetensors");
    write_weights(&weights, Some(bytes_tensor(b"\xff\xff not a model")?))?;
    let msg = load_error(&weights);
    assert!(
        msg.starts_with("cannot read the `spiece_model` tensor (it is not a SentencePiece model")
            && msg.contains("tokenizer.json")
            && msg.ends_with(&weights.display().to_string()),
        "{msg}"
    );
    write_weights(&weights, Some(Tensor::ones(4, DType::F16, &Device::Cpu)?))?;
    assert!(load_error(&weights).contains("stored as F16, not as bytes"));
    Ok(())
}

/// The fixture model with `edit` applied, re-serialised.
fn edited(edit: impl FnOnce(&mut ModelProto)) -> anyhow::Result<Vec<u8>> {
    let mut proto = ModelProto::decode(model_bytes()?.as_slice())?;
    edit(&mut proto);
    Ok(proto.encode_to_vec())
}

fn spm_error(bytes: &[u8]) -> String {
    UmT5Tokenizer::from_spm(bytes, "the SentencePiece model", Path::new("spiece.model"))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default()
}

#[test]
fn foreign_or_damaged_spm_models_are_refused() -> anyhow::Result<()> {
    let bpe = edited(|p| {
        if let Some(t) = p.trainer_spec.as_mut() {
            t.model_type = Some(2);
        }
    })?;
    let msg = spm_error(&bpe);
    assert!(
        msg.contains("is a SentencePiece BPE model, but umT5's is Unigram")
            && msg.ends_with("spiece.model"),
        "{msg}"
    );

    let no_eos = edited(|p| {
        for piece in &mut p.pieces {
            if piece.piece.as_deref() == Some("</s>") {
                piece.piece = Some("<eos>".into());
            }
        }
    })?;
    assert!(spm_error(&no_eos).contains("has no `</s>` token"));

    let bad_table = edited(|p| {
        if let Some(n) = p.normalizer_spec.as_mut() {
            n.precompiled_charsmap = Some(vec![0xff, 0xff, 0xff, 0x7f, 1, 2, 3]);
        }
    })?;
    assert!(spm_error(&bad_table).contains("normaliser table (precompiled_charsmap) is damaged"));

    let bad_unk = edited(|p| {
        if let Some(t) = p.trainer_spec.as_mut() {
            t.unk_id = Some(100_000);
        }
    })?;
    assert!(spm_error(&bad_unk).contains("unknown-token id 100000"));

    assert!(spm_error(b"").contains("it has no pieces"));
    // A tokenizer.json given where a .model is expected does not parse as protobuf.
    assert!(spm_error(b"{\"version\": \"1.0\"}").contains("it is not a SentencePiece model"));
    assert!(matches!(
        UmT5Tokenizer::from_spm(&bpe, "x", Path::new("m")),
        Err(TokenizerError::NotUnigram { .. })
    ));
    Ok(())
}
