//! Caching a tiny generated dataset with the fixture VAE and umT5: musubi-tuner names and keys, skipping what
//! exists, removing stale caches, reporting undecodable files; and training on these caches equals training
//! on caches written directly in musubi-tuner's format from the same tensors.

mod i2v;

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use image::RgbImage;

use super::*;
use crate::family::wan::text_cache::cache_text;
use crate::train::trainer::Trainer;
use framesmith_config::protocol::StartRun;
use framesmith_config::{presets, RunConfig};
use framesmith_data::cache::{
    read_wan_latent_cache, read_wan_text_cache, text_cache_name, write_wan_text_cache,
};
use framesmith_data::load_valid;
use framesmith_data::tensor_file::read_tensor_file;
use framesmith_models::wan::text_encoder::tokenizer::testkit::write_tiny_tokenizer;
use framesmith_models::wan::text_encoder::TextEncoder;
use framesmith_models::wan::vae::{load_vae_auto, VaeVariant};

fn fixture(case: &str) -> PathBuf {
    framesmith_models::fixtures::wan_case(case).join("weights.safetensors")
}

struct Models {
    vae: WanVae,
    stats: LatentStats,
    text: TextEncoder,
}

fn models(dir: &Path) -> anyhow::Result<Models> {
    let tokenizer = dir.join("tokenizer.json");
    write_tiny_tokenizer(&tokenizer)?;
    Ok(Models {
        vae: load_vae_auto(&fixture("wan21_vae_tiny"), DType::F32, &Device::Cpu)?,
        stats: LatentStats::official(VaeVariant::Wan21, &Device::Cpu)?,
        text: TextEncoder::load(
            &fixture("umt5_tiny"),
            Some(&tokenizer),
            DType::F32,
            &Device::Cpu,
        )?,
    })
}

fn encoder(m: &Models) -> LatentEncoder<'_> {
    LatentEncoder {
        vae: &m.vae,
        stats: &m.stats,
        device: Device::Cpu,
        dtype: DType::F32,
        tiles: None,
        image: Default::default(),
    }
}

fn image(path: &Path, w: u32, h: u32, seed: u8) -> anyhow::Result<()> {
    let img = RgbImage::from_fn(w, h, |x, y| {
        image::Rgb([(x * 7) as u8 ^ seed, (y * 5) as u8, seed.wrapping_mul(3)])
    });
    img.save(path)?;
    Ok(())
}

/// `images/` with two captioned PNGs and one corrupt "PNG", and the dataset TOML caching into `cache_dir`.
fn image_dataset(root: &Path, cache_dir: &str) -> anyhow::Result<PathBuf> {
    let images = root.join("images");
    std::fs::create_dir_all(&images)?;
    image(&images.join("red.png"), 40, 30, 1)?;
    std::fs::write(images.join("red.txt"), "a red cat")?;
    image(&images.join("blue.png"), 48, 32, 9)?;
    std::fs::write(images.join("blue.txt"), "a blue square on the left")?;
    std::fs::write(images.join("broken.png"), b"\x89PNG\r\n\x1a\nnot really")?;
    std::fs::write(images.join("broken.txt"), "a dog")?;
    let toml = root.join(format!("{cache_dir}.toml"));
    std::fs::write(
        &toml,
        format!(
            "[general]\nresolution = [32, 32]\ncaption_extension = \".txt\"\nbatch_size = 1\n\
             enable_bucket = false\n\n[[datasets]]\nimage_directory = \"images\"\n\
             cache_directory = \"{cache_dir}\"\n"
        ),
    )?;
    Ok(toml)
}

fn keys(path: &Path) -> anyhow::Result<Vec<String>> {
    let file = read_tensor_file(path, &Device::Cpu)?;
    let mut keys: Vec<String> = file.tensors.keys().cloned().collect();
    keys.sort();
    Ok(keys)
}

#[test]
#[allow(clippy::too_many_lines)] // one caching scenario over three passes (write, skip, drop stale), checked in order
fn image_latents_use_musubi_names_skip_existing_and_drop_stale() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let m = models(dir.path())?;
    let toml = image_dataset(dir.path(), "cache")?;
    let valid = load_valid(&toml)?;
    let cache = dir.path().join("cache");

    let first = cache_latents(
        &valid,
        None,
        &encoder(&m),
        &CacheOptions::default(),
        &mut (),
    )?;
    assert_eq!(
        (first.items, first.written, first.skipped),
        (3, 2, 0),
        "{first}"
    );
    assert_eq!(first.failed.len(), 1);
    let (bad, why) = &first.failed[0];
    assert!(
        bad.ends_with("broken.png") && why.contains("cannot read the image"),
        "{why}"
    );
    let red = cache.join("red_0040x0030_wan.safetensors");
    assert_eq!(keys(&red)?, vec!["latents_1x4x4_float32".to_string()]);
    let (latent, meta) = read_wan_latent_cache(&red, &Device::Cpu)?;
    assert_eq!(latent.latents.dims(), &[16, 1, 4, 4]);
    assert_eq!((meta.width, meta.height, meta.frame_count), (40, 30, None));
    assert!(cache.join("blue_0048x0032_wan.safetensors").is_file());

    // A second run writes nothing; the broken file is reported again.
    let again = cache_latents(
        &valid,
        None,
        &encoder(&m),
        &CacheOptions::default(),
        &mut (),
    )?;
    assert_eq!(
        (again.written, again.skipped, again.failed.len()),
        (0, 2, 1),
        "{again}"
    );
    // A cache cut short (a run killed while writing) is made again.
    let bytes = std::fs::read(&red)?;
    std::fs::write(&red, &bytes[..bytes.len() - 4])?;
    let repaired = cache_latents(
        &valid,
        None,
        &encoder(&m),
        &CacheOptions::default(),
        &mut (),
    )?;
    assert_eq!((repaired.written, repaired.skipped), (1, 1), "{repaired}");
    assert!(read_wan_latent_cache(&red, &Device::Cpu).is_ok());

    // Stale: a cache of a removed image and of an item never in the dataset go; the failed item's old cache and
    // the text caches stay.
    std::fs::remove_file(dir.path().join("images/blue.png"))?;
    let gone = cache.join("gone_0032x0032_wan.safetensors");
    let broken_old = cache.join("broken_0016x0016_wan.safetensors");
    let text = cache.join(text_cache_name("gone"));
    for path in [&gone, &broken_old] {
        std::fs::copy(&red, path)?;
    }
    write_wan_text_cache(
        &text,
        &Tensor::zeros((2, 32), DType::F32, &Device::Cpu)?,
        "x",
    )?;
    let kept = cache_latents(
        &valid,
        None,
        &encoder(&m),
        &CacheOptions { keep_stale: true },
        &mut (),
    )?;
    assert!(kept.removed.is_empty() && gone.is_file());
    let cleaned = cache_latents(
        &valid,
        None,
        &encoder(&m),
        &CacheOptions::default(),
        &mut (),
    )?;
    let mut removed = cleaned.removed.clone();
    removed.sort();
    assert_eq!(
        removed,
        vec![cache.join("blue_0048x0032_wan.safetensors"), gone]
    );
    assert!(broken_old.is_file() && text.is_file() && red.is_file());
    Ok(())
}

/// A failing VAE is not one bad file: the run stops and names the item it was on.
#[test]
fn an_encoder_failure_stops_the_run() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let m = models(dir.path())?;
    let valid = load_valid(&image_dataset(dir.path(), "cache")?)?;
    let broken = LatentEncoder {
        tiles: Some(TileConfig {
            tile: 0,
            overlap: 0,
        }),
        ..encoder(&m)
    };
    let err = cache_latents(&valid, None, &broken, &CacheOptions::default(), &mut ())
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
    assert!(
        err.contains("caching") && err.contains("blue.png") && err.contains("tile size"),
        "{err}"
    );
    Ok(())
}

#[test]
fn text_caches_hold_the_caption_and_follow_caption_edits() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let m = models(dir.path())?;
    let toml = image_dataset(dir.path(), "cache")?;
    let valid = load_valid(&toml)?;
    let cache = dir.path().join("cache");
    let run = || {
        cache_text(
            &valid,
            None,
            &m.text,
            DType::F32,
            &CacheOptions::default(),
            &mut (),
        )
    };

    let first = run()?;
    // Text caches need no pixels: the broken image's caption is cached too.
    assert_eq!(
        (first.items, first.written, first.failed.len()),
        (3, 3, 0),
        "{first}"
    );
    let red = cache.join("red_wan_te.safetensors");
    assert_eq!(keys(&red)?, vec!["varlen_t5_float32".to_string()]);
    let cached = read_wan_text_cache(&red, &Device::Cpu)?;
    assert_eq!(cached.caption, "a red cat");
    assert_eq!(cached.t5.dims(), &[4, 32]);
    let direct = m.text.encode_prompts(&["a red cat"])?.remove(0);
    let diff = (cached.t5 - direct)?.abs()?.max_all()?.to_scalar::<f32>()?;
    assert!(diff == 0.0, "cached embedding differs by {diff}");

    assert_eq!(run()?.written, 0);
    std::fs::write(dir.path().join("images/red.txt"), "a green dog")?;
    let edited = load_valid(&toml)?;
    let after = cache_text(
        &edited,
        None,
        &m.text,
        DType::F32,
        &CacheOptions::default(),
        &mut (),
    )?;
    assert_eq!((after.written, after.skipped), (1, 2), "{after}");
    assert_eq!(
        read_wan_text_cache(&red, &Device::Cpu)?.caption,
        "a green dog"
    );
    Ok(())
}

/// Clips of a real video file (ffmpeg's test pattern), when ffmpeg is installed.
#[test]
fn video_clips_are_cached_per_window() -> anyhow::Result<()> {
    let Ok(tools) = MediaTools::locate() else {
        eprintln!("ffmpeg not found: video caching not tested");
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let videos = dir.path().join("videos");
    std::fs::create_dir_all(&videos)?;
    let status = std::process::Command::new(&tools.ffmpeg)
        .args([
            "-v",
            "error",
            "-f",
            "lavfi",
            "-i",
            "testsrc=size=48x32:rate=16",
            "-frames:v",
            "12",
        ])
        .args(["-pix_fmt", "yuv420p"])
        .arg(videos.join("pattern.mp4"))
        .status()?;
    assert!(status.success());
    std::fs::write(videos.join("pattern.txt"), "a moving square")?;
    let toml = dir.path().join("d.toml");
    std::fs::write(
        &toml,
        "[general]\nresolution = [32, 32]\ncaption_extension = \".txt\"\nenable_bucket = false\n\n\
         [[datasets]]\nvideo_directory = \"videos\"\ncache_directory = \"cache\"\ntarget_frames = [5]\n\
         frame_extraction = \"chunk\"\n",
    )?;
    let valid = load_valid(&toml)?;
    let m = models(dir.path())?;
    let summary = cache_latents(
        &valid,
        Some(&tools),
        &encoder(&m),
        &CacheOptions::default(),
        &mut (),
    )?;
    assert_eq!((summary.items, summary.written), (1, 2), "{summary}");
    let cache = dir.path().join("cache");
    for start in [0, 5] {
        let path = cache.join(format!("pattern_{start:05}-005_0048x0032_wan.safetensors"));
        let (latent, meta) = read_wan_latent_cache(&path, &Device::Cpu)?;
        assert_eq!(latent.latents.dims(), &[16, 2, 4, 4]);
        assert_eq!(meta.frame_count, Some(5));
    }
    let again = cache_latents(
        &valid,
        Some(&tools),
        &encoder(&m),
        &CacheOptions::default(),
        &mut (),
    )?;
    assert_eq!((again.written, again.skipped), (0, 1), "{again}");
    Ok(())
}

/// The same two images cached by `cache_latents` / `cache_text` and, separately, by encoding them here and
/// writing musubi-tuner's files with `data::cache`: the files hold the same tensors and a few training steps on
/// each give the same losses.
#[test]
#[allow(clippy::too_many_lines)] // two cache layouts built side by side and trained on, then compared value by value
fn training_on_framesmith_caches_equals_musubi_format_caches() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let m = models(dir.path())?;
    let ours = image_dataset(dir.path(), "cache_ours")?;
    let musubi = image_dataset(dir.path(), "cache_musubi")?;
    let valid = load_valid(&ours)?;
    cache_latents(
        &valid,
        None,
        &encoder(&m),
        &CacheOptions::default(),
        &mut (),
    )?;
    cache_text(
        &valid,
        None,
        &m.text,
        DType::F32,
        &CacheOptions::default(),
        &mut (),
    )?;

    let target = dir.path().join("cache_musubi");
    std::fs::create_dir_all(&target)?;
    let t5 = m.text.encode_prompts(&["a dog"])?.remove(0);
    write_wan_text_cache(&target.join(text_cache_name("broken")), &t5, "a dog")?;
    for (stem, size, caption) in [
        ("red", (40, 30), "a red cat"),
        ("blue", (48, 32), "a blue square on the left"),
    ] {
        let img = image::open(dir.path().join(format!("images/{stem}.png")))?.to_rgb8();
        let resized = framesmith_data::resize::resize_to_bucket(&img, (32, 32));
        let pixels: Vec<f32> = resized
            .as_raw()
            .iter()
            .map(|&v| f32::from(v) / 127.5 - 1.0)
            .collect();
        let video = Tensor::from_vec(pixels, (1, 32, 32, 3), &Device::Cpu)?
            .permute((3, 0, 1, 2))?
            .unsqueeze(0)?;
        let latents = m.vae.encode(&video, &m.stats)?.squeeze(0)?;
        let cache = WanLatentCache {
            latents,
            latents_image: None,
            latents_control: None,
            clip: None,
            f_indices: None,
        };
        let name = image_latent_cache_name(stem, size);
        write_wan_latent_cache(
            &target.join(&name),
            &cache,
            &LatentCacheMetadata::wan(size, None),
        )?;
        let t5 = m.text.encode_prompts(&[caption])?.remove(0);
        write_wan_text_cache(&target.join(text_cache_name(stem)), &t5, caption)?;
    }
    let names = |d: &str| -> anyhow::Result<Vec<String>> {
        let mut n: Vec<String> = std::fs::read_dir(dir.path().join(d))?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        n.sort();
        Ok(n)
    };
    assert_eq!(names("cache_ours")?, names("cache_musubi")?);
    assert_eq!(names("cache_ours")?.len(), 5, "2 latent + 3 text caches");
    // The same tensors (bit for bit) under the same keys, and the same metadata. Not compared as bytes: the
    // header's metadata map is written in hash order.
    for name in names("cache_ours")? {
        let a = read_tensor_file(&dir.path().join("cache_ours").join(&name), &Device::Cpu)?;
        let b = read_tensor_file(&dir.path().join("cache_musubi").join(&name), &Device::Cpu)?;
        assert_eq!(a.metadata, b.metadata, "{name}");
        assert_eq!(a.tensors.len(), b.tensors.len(), "{name}");
        for (key, ta) in &a.tensors {
            let tb = b
                .tensors
                .get(key)
                .ok_or_else(|| anyhow::anyhow!("{name}: no {key}"))?;
            let bits = |t: &Tensor| -> anyhow::Result<Vec<u32>> {
                Ok(t.flatten_all()?
                    .to_vec1::<f32>()?
                    .iter()
                    .map(|v| v.to_bits())
                    .collect())
            };
            assert!(bits(ta)? == bits(tb)?, "{name}: {key} differs");
        }
    }

    let losses = |toml: &Path, out: &str| -> anyhow::Result<Vec<Option<f64>>> {
        let mut config = presets::builtin("demo-cpu")?
            .apply(&RunConfig::default())?
            .config;
        config.dataset.synthetic = false;
        config.dataset.config = toml.to_path_buf();
        // The tiny Wan2.1 DiT, whose 16 latent channels are the tiny Wan2.1 VAE's (the demo model takes the demo
        // codec's 48).
        config.model.demo = false;
        config.model.dit = fixture("wan21_t2v_tiny");
        config.training.max_train_steps = 3;
        config.optimizer.lr_warmup_steps = 0;
        config.output.output_dir = dir.path().join(out);
        config.output.save_every_n_steps = Some(0);
        let request = StartRun {
            config,
            resume_from: None,
        };
        let mut trainer = Trainer::start(&request, &mut |_, _| {})?;
        (0..3)
            .map(|_| Ok(trainer.train_step(&|| false)?.loss))
            .collect()
    };
    let a = losses(&ours, "run_ours")?;
    assert!(a.iter().all(|l| l.is_some_and(f64::is_finite)), "{a:?}");
    assert_eq!(a, losses(&musubi, "run_musubi")?);
    Ok(())
}

/// The Wan2.2 VAE of TI2V-5B (16× in space, then 2×2 patches): 48-channel latents of buckets in 32-pixel steps, a
/// Wan2.1-VAE cache under the same name made again, and a fixed resolution the patches cannot divide refused
/// before anything is encoded.
#[test]
fn wan22_vae_caches_48_channels_in_32_pixel_buckets() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let m = models(dir.path())?;
    let vae = load_vae_auto(&fixture("wan22_vae_tiny"), DType::F32, &Device::Cpu)?;
    let stats = LatentStats::official(VaeVariant::Wan22, &Device::Cpu)?;
    let wan22 = LatentEncoder {
        vae: &vae,
        stats: &stats,
        ..encoder(&m)
    };
    assert_eq!((encoder(&m).bucket_step(), wan22.bucket_step()), (16, 32));
    let toml = image_dataset(dir.path(), "cache")?;
    let valid = load_valid(&toml)?;
    // A Wan2.1-VAE cache first: the Wan2.2 VAE makes it again rather than keeping it.
    let first = cache_latents(&valid, None, &encoder(&m), &Default::default(), &mut ())?;
    assert_eq!(first.written, 2, "{first}");
    let summary = cache_latents(&valid, None, &wan22, &Default::default(), &mut ())?;
    assert_eq!((summary.written, summary.skipped), (2, 0), "{summary}");
    let red = dir.path().join("cache/red_0040x0030_wan.safetensors");
    let (latent, _) = read_wan_latent_cache(&red, &Device::Cpu)?;
    assert_eq!(latent.latents.dims(), &[48, 1, 2, 2]);
    let again = cache_latents(&valid, None, &wan22, &Default::default(), &mut ())?;
    assert_eq!((again.written, again.skipped), (0, 2), "{again}");

    // Bucketed: every bucket side a multiple of 32 (48×48's area gives only 32×64 and 64×32).
    let text = std::fs::read_to_string(&toml)?
        .replace("[32, 32]", "[48, 48]")
        .replace("enable_bucket = false", "enable_bucket = true")
        .replace("\"cache\"", "\"bucketed\"");
    std::fs::write(&toml, &text)?;
    let bucketed = cache_latents(
        &load_valid(&toml)?,
        None,
        &wan22,
        &Default::default(),
        &mut (),
    )?;
    assert_eq!(bucketed.written, 2, "{bucketed}");
    let red = dir.path().join("bucketed/red_0040x0030_wan.safetensors");
    let (latent, _) = read_wan_latent_cache(&red, &Device::Cpu)?;
    assert_eq!(
        latent.latents.dims(),
        &[48, 1, 2, 4],
        "64x32: nearest to 4:3"
    );

    // Unbucketed at a size the 32-pixel step does not divide: refused with the fix, nothing written.
    std::fs::write(
        &toml,
        text.replace("enable_bucket = true", "enable_bucket = false"),
    )?;
    let err = cache_latents(
        &load_valid(&toml)?,
        None,
        &wan22,
        &Default::default(),
        &mut (),
    )
    .err()
    .map(|e| format!("{e:#}"))
    .unwrap_or_default();
    assert!(
        err.contains("multiples of 32 pixels") && err.contains("use [32, 32]"),
        "{err}"
    );
    Ok(())
}
