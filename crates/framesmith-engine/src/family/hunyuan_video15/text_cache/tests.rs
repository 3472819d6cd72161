//! The text pass with the fixtures' tiny Qwen2.5-VL and glyph encoder over an image dataset: musubi-tuner's
//! `_hv15_te` names and keys (an empty glyph embedding of width 1472 for a caption that quotes nothing), caches
//! kept while their captions are unchanged, an edited caption encoded again, stale caches removed.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};

use super::*;
use crate::family::hunyuan_video15::encoder::testkit::{encoder_files, tiny_qwen};
use crate::family::hunyuan_video15::encoder::Hv15EncoderFiles;
use framesmith_data::family::hunyuan_video15::cache::read_hv15_text_cache;

/// Two captioned 32×32 images in `dir`, the second caption quoting text; returns the dataset TOML.
fn dataset(dir: &Path) -> anyhow::Result<PathBuf> {
    let images = dir.join("images");
    std::fs::create_dir_all(&images)?;
    for (stem, caption) in [("a", "a red fox in snow"), ("b", "a sign reading \"OPEN\"")] {
        image::RgbImage::from_pixel(32, 32, image::Rgb([90, 120, 200]))
            .save(images.join(format!("{stem}.png")))?;
        std::fs::write(images.join(format!("{stem}.txt")), caption)?;
    }
    let toml = dir.join("data.toml");
    std::fs::write(
        &toml,
        "[general]\nresolution = [32, 32]\ncaption_extension = \".txt\"\nenable_bucket = false\n\n\
         [[datasets]]\nimage_directory = \"images\"\ncache_directory = \"cache\"\nbatch_size = 1\n",
    )?;
    Ok(toml)
}

fn run(toml: &Path, calls: &std::cell::Cell<usize>) -> anyhow::Result<CacheSummary> {
    let valid = framesmith_data::load_valid(toml)?;
    let [text_encoder, tokenizer, glyph] = encoder_files();
    let files = Hv15EncoderFiles {
        text_encoder: &text_encoder,
        tokenizer: Some(&tokenizer),
        glyph: Some(&glyph),
    };
    let encode = |captions: &[&str]| {
        calls.set(calls.get() + captions.len());
        encode_texts(files, &tiny_qwen, captions, (DType::F32, &Device::Cpu))
    };
    cache_hv15_text(
        &valid,
        &encode,
        DType::F32,
        &CacheOptions::default(),
        &mut (),
    )
}

#[test]
fn captions_cache_under_musubi_names_and_keys_and_are_kept_until_edited() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let toml = dataset(dir.path())?;
    let calls = std::cell::Cell::new(0);
    let first = run(&toml, &calls)?;
    assert_eq!((first.written, calls.get()), (2, 2), "{first:?}");
    let cache = dir.path().join("cache");
    let a = read_hv15_text_cache(&cache.join("a_hv15_te.safetensors"), &Device::Cpu)?;
    assert_eq!(
        (a.vl_embed.dim(1)?, a.byt5_embed.dims()),
        (64, &[0, 1472][..])
    );
    assert_eq!(a.caption, "a red fox in snow");
    let b = read_hv15_text_cache(&cache.join("b_hv15_te.safetensors"), &Device::Cpu)?;
    // `Text "OPEN". ` and the end token.
    assert_eq!(b.byt5_embed.dims(), [14, 32]);

    let again = run(&toml, &calls)?;
    assert_eq!((again.written, again.skipped, calls.get()), (0, 2, 2));
    std::fs::write(dir.path().join("images/a.txt"), "a grey fox")?;
    std::fs::remove_file(dir.path().join("images/b.png"))?;
    let edited = run(&toml, &calls)?;
    assert_eq!((edited.written, calls.get()), (1, 3), "{edited:?}");
    assert_eq!(edited.removed, vec![cache.join("b_hv15_te.safetensors")]);
    Ok(())
}
