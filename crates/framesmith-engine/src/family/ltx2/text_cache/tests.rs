//! The text pass with the parity fixture's tiny Gemma 3 and LTX-2 text parts over an image dataset: musubi-tuner's
//! `_ltx2_te` names and keys at LTX-2's 1024 tokens, the caches equal to the models' own encoding of the caption,
//! kept while caption and release are unchanged, made again for an edited caption or another release, stale
//! caches removed; the audio connector's output cached too for an audio-video checkpoint; the family claims a text
//! pass by its `--dit` and refuses a checkpoint without the connector.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};

use super::*;
use crate::family::family_of_cache;
use crate::family::ltx2::testkit::{tiny_dit, tiny_gemma};
use crate::family::testkit::run::{error_of, refused_cache_request};
use crate::prep::pass::CachePass;
use framesmith_data::family::ltx2::cache::read_ltx2_text_cache;
use framesmith_models::gemma3::{self, GemmaTokenizer, LoadOptions, LTX2_MAX_LENGTH};
use framesmith_models::ltx2::text::{connect, connect_audio, prompt_features};

/// The fixture case whose Gemma folder and text parts the tests encode with.
fn case_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../framesmith-models/tests/fixtures/ltx2_text/ltx2")
}

/// Two captioned 32×32 images in `dir`; returns the dataset TOML.
fn dataset(dir: &Path) -> anyhow::Result<PathBuf> {
    let images = dir.join("images");
    std::fs::create_dir_all(&images)?;
    for (stem, caption) in [
        ("a", "a red fox runs through deep snow"),
        ("b", "neon city street at night"),
    ] {
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

fn run(
    toml: &Path,
    encoding: &str,
    calls: &std::cell::Cell<usize>,
) -> anyhow::Result<CacheSummary> {
    let valid = framesmith_data::load_valid(toml)?;
    let gemma = case_dir().join("gemma");
    let dit = case_dir().join("ltx_text.safetensors");
    let files = Ltx2EncoderFiles {
        text_encoder: &gemma,
        tokenizer: None,
        dit: &dit,
    };
    let audio = TextParts::open(&dit)?.has_audio();
    let mut encode = |captions: &[&str]| {
        calls.set(calls.get() + captions.len());
        encode_texts_for(
            files,
            &tiny_gemma,
            (captions, audio),
            (DType::F32, &Device::Cpu),
            &mut |_| {},
        )
    };
    cache_ltx2_text(
        &valid,
        (&mut encode, encoding),
        DType::F32,
        &CacheOptions::default(),
        &mut (),
    )
}

#[test]
fn captions_cache_under_musubi_names_and_are_kept_until_edited() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let toml = dataset(dir.path())?;
    let parts = TextParts::open(&case_dir().join("ltx_text.safetensors"))?;
    let encoding = encoding_tag(&parts);
    assert_eq!(encoding, "LTX-2 16 + audio 16");
    let calls = std::cell::Cell::new(0);
    let first = run(&toml, &encoding, &calls)?;
    assert_eq!((first.written, calls.get()), (2, 2), "{first:?}");

    let cache = dir.path().join("cache");
    let a = read_ltx2_text_cache(&cache.join("a_ltx2_te.safetensors"), &Device::Cpu)?;
    assert_eq!(a.video_prompt_embeds.dims(), [LTX2_MAX_LENGTH, 16]);
    assert_eq!(a.caption, "a red fox runs through deep snow");
    assert_eq!(a.encoding.as_deref(), Some("LTX-2 16 + audio 16"));
    let mask = a
        .prompt_attention_mask
        .map(|m| m.to_vec1::<i64>())
        .transpose()?;
    assert_eq!(mask, Some(vec![1; LTX2_MAX_LENGTH]));
    // The cache holds what the models give the caption directly.
    let (_, gemma) = gemma3::load_text_model(
        &case_dir().join("gemma"),
        &LoadOptions {
            dtype: DType::F32,
            any_size: true,
            ..LoadOptions::new(&Device::Cpu)
        },
    )?;
    let tokenizer = GemmaTokenizer::for_weights(&case_dir().join("gemma"), None, LTX2_MAX_LENGTH)?;
    let extractor = parts.feature_extractor_av((16, 4), DType::F32, &Device::Cpu)?;
    let features = prompt_features(
        (&gemma, &tokenizer),
        &extractor,
        "a red fox runs through deep snow",
    )?;
    assert_eq!(features.prompt.len(), 8);
    let (direct, _) = connect(&parts.connector(DType::F32, &Device::Cpu)?, &features)?;
    let diff = (direct - &a.video_prompt_embeds)?
        .abs()?
        .max_all()?
        .to_scalar::<f32>()?;
    assert!(diff < 1e-5, "{diff}");
    let audio = a
        .audio_prompt_embeds
        .ok_or_else(|| anyhow::anyhow!("no audio_prompt_embeds"))?;
    let direct = connect_audio(&parts.audio_connector(DType::F32, &Device::Cpu)?, &features)?;
    let diff = (direct - audio)?.abs()?.max_all()?.to_scalar::<f32>()?;
    assert!(diff < 1e-5, "the audio connector's output: {diff}");

    let again = run(&toml, &encoding, &calls)?;
    assert_eq!((again.written, again.skipped, calls.get()), (0, 2, 2));
    // Made for the other release: encoded again.
    let other = run(&toml, "LTX-2.3 4096", &calls)?;
    assert_eq!((other.written, calls.get()), (2, 4));
    std::fs::write(dir.path().join("images/a.txt"), "a grey fox")?;
    std::fs::remove_file(dir.path().join("images/b.png"))?;
    let edited = run(&toml, "LTX-2.3 4096", &calls)?;
    assert_eq!((edited.written, calls.get()), (1, 5), "{edited:?}");
    assert_eq!(edited.removed, vec![cache.join("b_ltx2_te.safetensors")]);
    Ok(())
}

#[test]
fn a_text_pass_is_ltx2s_by_its_dit_and_needs_the_connector() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let dit = tiny_dit(dir.path())?;
    let pass = CachePass::Text(TextFiles {
        text_encoder: Some(case_dir().join("gemma")),
        dit: Some(dit.clone()),
        ..TextFiles::default()
    });
    let family = family_of_cache(&pass);
    assert_eq!(family.name(), "LTX-2");
    // The tiny transformer file holds no text connector: refused before a device opens, naming the file to use.
    let err = error_of(family.cache(
        &refused_cache_request(dir.path(), pass),
        &mut (),
        &mut |_| {},
    ));
    assert!(
        err.contains("text connector") && err.contains("ltx-2-19b"),
        "{err}"
    );
    let no_encoder = CachePass::Text(TextFiles {
        dit: Some(dit),
        ..TextFiles::default()
    });
    let err = error_of(family.cache(
        &refused_cache_request(dir.path(), no_encoder),
        &mut (),
        &mut |_| {},
    ));
    assert!(
        err.contains("--text-encoder") && err.contains("Gemma 3"),
        "{err}"
    );
    Ok(())
}
