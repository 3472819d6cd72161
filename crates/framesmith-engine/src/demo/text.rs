//! The demo text embedding (demo only, not umT5): each lower-cased word maps to a fixed random vector seeded by
//! a hash of the word, so captions that share words share embeddings. Shape [words, text_dim], at most
//! `max_tokens` words.

use candle_core::{Device, Result, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;

use framesmith_nn::init::randn;

/// FNV-1a: stable across platforms and releases (std's hasher is not).
fn word_seed(word: &str) -> u64 {
    word.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Embeds a caption.
pub fn embed(caption: &str, text_dim: usize, max_tokens: usize, device: &Device) -> Result<Tensor> {
    let words: Vec<String> = caption
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| w.to_lowercase())
        .take(max_tokens.max(1))
        .collect();
    let rows = if words.is_empty() {
        vec![String::new()]
    } else {
        words
    };
    let vectors = rows
        .iter()
        .map(|w| {
            randn(
                &mut StdRng::seed_from_u64(word_seed(w)),
                text_dim,
                0.0,
                1.0,
                device,
            )
        })
        .collect::<Result<Vec<_>>>()?;
    Tensor::stack(&vectors, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_words_share_vectors() -> Result<()> {
        let a = embed("A red circle", 8, 16, &Device::Cpu)?;
        let b = embed("red square", 8, 16, &Device::Cpu)?;
        assert_eq!(a.dims(), &[3, 8]);
        let diff = (a.get(1)? - b.get(0)?)?
            .abs()?
            .sum_all()?
            .to_scalar::<f32>()?;
        assert_eq!(diff, 0.0);
        Ok(())
    }
}
