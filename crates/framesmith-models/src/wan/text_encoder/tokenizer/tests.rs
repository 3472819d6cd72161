use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};

use super::testkit::{tiny_tokenizer, write_tiny_tokenizer};
use super::*;
use crate::t5::T5Config;
use crate::wan::text_encoder::{t5_config_from_tensors, TextEncoder};

fn saved_tiny(dir: &Path) -> anyhow::Result<PathBuf> {
    let path = dir.join(TOKENIZER_FILE);
    write_tiny_tokenizer(&path)?;
    Ok(path)
}

#[test]
fn prompts_are_cleaned_like_wans_whitespace_clean() {
    assert_eq!(
        clean_prompt("  a\t\u{201c}red\u{201d}  cat\n\n on the  left  "),
        "a \"red\" cat on the left"
    );
    // Unescaped twice, as `basic_clean` does.
    assert_eq!(
        clean_prompt("cats &amp;amp; dogs &#39;x&#x27;"),
        "cats & dogs 'x'"
    );
    assert_eq!(clean_prompt("&unknown; & so"), "&unknown; & so");
    // Full-width punctuation and the ideographic space of Chinese prompts become ASCII.
    assert_eq!(
        clean_prompt("色调艳丽，过曝\u{3000}静态"),
        "色调艳丽,过曝 静态"
    );
    assert_eq!(clean_prompt("\u{fb01}ne\u{0007}\u{feff}"), "fine");
}

#[test]
fn tokenizer_json_round_trips_with_eos_and_truncation() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = saved_tiny(dir.path())?;
    let tok = UmT5Tokenizer::load(&path)?;
    let reference = tiny_tokenizer()?;
    let id = |t: &str| reference.token_to_id(t).unwrap_or(u32::MAX);
    assert_eq!((id("<pad>"), id("</s>"), id("<unk>")), (0, 1, 2));
    let ids = tok.tokenize("  A red   cat ")?;
    // Upper-case `A` is not in the vocabulary: the Unigram model maps it to <unk>.
    assert_eq!(ids, vec![id("▁"), 2, id("▁red"), id("▁cat"), 1]);
    assert_eq!(
        tok.tokenize("a red cat")?,
        vec![id("▁a"), id("▁red"), id("▁cat"), 1]
    );
    // The limit counts `</s>`: the text is cut to 3 tokens and then closed.
    let short = UmT5Tokenizer::load(&path)?.with_max_tokens(4);
    assert_eq!(
        short.tokenize("a red blue green cat")?,
        vec![id("▁a"), id("▁red"), id("▁blue"), 1]
    );
    assert!(tok.vocab_size() < 100);

    let batch = tok.tokenize_batch(&["a red cat", "a dog"])?;
    assert_eq!(batch.lens(), vec![4, 3]);
    assert_eq!(batch.ids[1], vec![id("▁a"), id("▁dog"), 1, 0]);
    assert_eq!(batch.mask[1], vec![1, 1, 1, 0]);
    Ok(())
}

#[test]
fn a_missing_or_foreign_tokenizer_says_what_to_do() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let weights = dir.path().join("umt5.safetensors");
    let expected = dir.path().join(TOKENIZER_FILE);
    assert_eq!(tokenizer_beside(&weights), None);
    let msg = UmT5Tokenizer::load(&expected)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        msg.contains("put tokenizer.json from the umT5 folder (google/umt5-xxl")
            && msg.contains("--tokenizer")
            && msg.contains(&expected.display().to_string()),
        "{msg}"
    );

    // The layout of the official Wan model folders is found too.
    let nested = dir.path().join("google").join("umt5-xxl");
    std::fs::create_dir_all(&nested)?;
    std::fs::write(dir.path().join(SPM_FILE), b"")?;
    assert_eq!(tokenizer_beside(&weights), Some(dir.path().join(SPM_FILE)));
    // A tokenizer.json comes before a SentencePiece model, wherever each is.
    saved_tiny(&nested)?;
    assert_eq!(
        tokenizer_beside(&weights),
        Some(nested.join(TOKENIZER_FILE))
    );

    std::fs::write(&expected, "{\"not\": \"a tokenizer\"}")?;
    let msg = UmT5Tokenizer::load(&expected)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(msg.contains("cannot read the tokenizer"), "{msg}");
    Ok(())
}

fn umt5_fixture() -> PathBuf {
    crate::fixtures::wan_case("umt5_tiny").join("weights.safetensors")
}

#[test]
fn encoder_sizes_are_read_from_the_weights() -> anyhow::Result<()> {
    let tensors = candle_core::safetensors::load(umt5_fixture(), &Device::Cpu)?;
    let cfg = t5_config_from_tensors(&tensors).ok_or_else(|| anyhow::anyhow!("no config"))?;
    assert_eq!(cfg, T5Config::tiny());
    Ok(())
}

/// Prompts through the tiny tokenizer and the fixture umT5: one `[L_i, 32]` per prompt, equal to the encoder run
/// on the ids alone (so padding in a batch changes nothing).
#[test]
fn prompts_encode_to_trimmed_embeddings() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let tokenizer = saved_tiny(dir.path())?;
    let te = TextEncoder::load(&umt5_fixture(), Some(&tokenizer), DType::F32, &Device::Cpu)?;
    let out = te.encode_prompts(&["a red cat on the left", "a dog"])?;
    assert_eq!(out.len(), 2);
    assert_eq!(out[0].dims(), &[7, 32]);
    assert_eq!(out[1].dims(), &[3, 32]);
    for (prompt, batched) in ["a red cat on the left", "a dog"].iter().zip(&out) {
        let ids = te.tokenizer.tokenize(prompt)?;
        let n = ids.len();
        let ids = Tensor::from_vec(ids, (1, n), &Device::Cpu)?;
        let mask = Tensor::ones((1, n), DType::U32, &Device::Cpu)?;
        let alone = te.encoder.encode(&ids, &mask)?.squeeze(0)?;
        let err = (alone - batched)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(err < 1e-5, "{prompt}: batched differs by {err}");
    }
    assert!(te.encode_prompts(&[])?.is_empty());

    // Without a tokenizer beside or inside the weights (the fixture has neither), loading says so.
    let err = TextEncoder::load(&umt5_fixture(), None, DType::F32, &Device::Cpu)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("no umT5 tokenizer found"), "{err}");
    Ok(())
}
