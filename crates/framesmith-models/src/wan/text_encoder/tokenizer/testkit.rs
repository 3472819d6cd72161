//! A tiny umT5-style tokenizer built in code for tests: a Unigram model over a few English words and single
//! letters, Metaspace pre-tokenizer, a regex normaliser (the pure-Rust regex backend) and T5's `$A </s>`
//! post-processor. Ids: `<pad>` 0, `</s>` 1, `<unk>` 2; everything fits a vocabulary of 100 (the tiny umT5).

use std::path::Path;

use tokenizers::models::unigram::Unigram;
use tokenizers::normalizers::replace::{Replace, ReplacePattern};
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, Tokenizer};

/// Whole-word pieces of the tiny vocabulary (after the specials and the single characters).
pub const WORDS: [&str; 22] = [
    "▁a",
    "▁red",
    "▁blue",
    "▁green",
    "▁cat",
    "▁dog",
    "▁circle",
    "▁square",
    "▁moving",
    "▁left",
    "▁right",
    "▁on",
    "▁the",
    "▁background",
    "▁walk",
    "ing",
    "s",
    ",",
    ".",
    "\"",
    "'",
    "▁photo",
];

/// The tiny tokenizer.
pub fn tiny_tokenizer() -> anyhow::Result<Tokenizer> {
    let mut vocab: Vec<(String, f64)> = ["<pad>", "</s>", "<unk>"]
        .iter()
        .map(|s| (s.to_string(), 0.0))
        .collect();
    vocab.push(("▁".into(), -4.0));
    vocab.extend(('a'..='z').map(|c| (c.to_string(), -5.0)));
    vocab.extend(WORDS.iter().map(|w| (w.to_string(), -1.0)));
    let model = Unigram::from(vocab, Some(2), false).map_err(anyhow::Error::msg)?;
    let mut tokenizer = Tokenizer::new(model);
    tokenizer
        .with_normalizer(Some(
            Replace::new(ReplacePattern::Regex(" {2,}".into()), " ").map_err(anyhow::Error::msg)?,
        ))
        .map_err(anyhow::Error::msg)?;
    tokenizer.with_pre_tokenizer(Some(Metaspace::new('▁', PrependScheme::Always, true)));
    tokenizer.with_post_processor(Some(
        TemplateProcessing::builder()
            .try_single("$A </s>")
            .map_err(anyhow::Error::msg)?
            .special_tokens(vec![("</s>".to_string(), 1u32)])
            .build()?,
    ));
    tokenizer
        .add_special_tokens([
            AddedToken::from("<pad>", true),
            AddedToken::from("</s>", true),
            AddedToken::from("<unk>", true),
        ])
        .map_err(anyhow::Error::msg)?;
    Ok(tokenizer)
}

/// Saves the tiny tokenizer as `tokenizer.json` at `path`.
pub fn write_tiny_tokenizer(path: &Path) -> anyhow::Result<()> {
    tiny_tokenizer()?
        .save(path, false)
        .map_err(anyhow::Error::msg)
}
