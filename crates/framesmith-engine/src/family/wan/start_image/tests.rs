//! Image-to-video on tiny models: Wan2.1 I2V (random tiny DiT with `img_emb`, the tiny CLIP fixture, the tiny
//! Wan2.1 VAE) and Wan2.2 TI2V (fixture DiT and VAE): the image conditions the result, identical inputs give
//! identical clips, the TI2V first latent frame is the image's; sizes, crops and bad inputs.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::*;
use crate::family::wan::denoise::{generate_from, Experts, GenerateRequest};
use crate::family::wan::pipeline::{generate_clip_from, Conditioning};
use crate::generate::sampler::Solver;
use framesmith_models::wan::clip::{load_clip_vision, ClipVisionConfig};
use framesmith_models::wan::random::random_weights;
use framesmith_models::wan::vae::{load_vae_auto, LatentStats};
use framesmith_models::wan::{weights, ModelOptions, WanModel};
use framesmith_nn::init::randn;
use framesmith_nn::vb::Vb;

fn fixture(case: &str) -> PathBuf {
    framesmith_models::fixtures::wan_case(case).join("weights.safetensors")
}

fn decoder(case: &str) -> anyhow::Result<VaeDecoder> {
    let vae = load_vae_auto(&fixture(case), DType::F32, &Device::Cpu)?;
    Ok(VaeDecoder {
        stats: LatentStats::official(vae.config().variant, &Device::Cpu)?,
        vae,
        tiles: None,
        dtype: DType::F32,
    })
}

/// A tiny Wan2.1 I2V DiT whose `img_emb` takes the tiny CLIP's 32-wide features.
fn tiny_i2v() -> anyhow::Result<WanModel> {
    let cfg = WanConfig {
        model_type: ModelType::I2v,
        in_dim: 36,
        clip_dim: 32,
        clip_tokens: 17,
        ..WanConfig::tiny(2)
    };
    let weights = random_weights(&cfg, 5, DType::F32, &Device::Cpu)?;
    Ok(WanModel::new(
        &cfg,
        Vb::from_tensors(weights, DType::F32, &Device::Cpu),
        &ModelOptions::default(),
    )?)
}

/// The tiny CLIP vision tower of `tests/fixtures/clip_tiny`.
pub(crate) fn tiny_clip() -> anyhow::Result<ClipVision> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/clip_tiny/weights.safetensors");
    Ok(load_clip_vision(
        &path,
        &ClipVisionConfig::tiny(),
        DType::F32,
        &Device::Cpu,
    )?)
}

/// A gradient picture with a tint; `seed` changes the picture.
fn picture(w: u32, h: u32, seed: u8) -> RgbImage {
    RgbImage::from_fn(w, h, |x, y| {
        image::Rgb([
            (x * 255 / w) as u8 ^ seed,
            (y * 255 / h) as u8,
            seed.wrapping_mul(37),
        ])
    })
}

fn settings(width: usize, height: usize) -> ClipSettings {
    ClipSettings {
        width,
        height,
        frames: 5,
        steps: 2,
        shift: 5.0,
        guidance: 3.0,
        seed: 11,
        solver: Solver::Unipc,
    }
}

fn text(cfg: &WanConfig) -> anyhow::Result<(Tensor, Tensor)> {
    let dev = Device::Cpu;
    let rng = &mut StdRng::seed_from_u64(29);
    Ok((
        randn(rng, (3, cfg.text_dim), 0.0, 1.0, &dev)?,
        randn(rng, (2, cfg.text_dim), 0.0, 1.0, &dev)?,
    ))
}

fn run(
    dit: &WanModel,
    shape: [usize; 4],
    (context, negative): &(Tensor, Tensor),
    image: &ImageConditioning,
) -> anyhow::Result<Tensor> {
    let mut model = dit.clone();
    let mut experts = Experts::single(&mut model);
    let s = settings(0, 0);
    let req = GenerateRequest {
        context,
        negative: Some(negative),
        latent_shape: shape,
        steps: s.steps,
        shift: s.shift,
        guidance: s.guidance,
        seed: s.seed,
        solver: s.solver,
    };
    Ok(generate_from(&mut experts, &req, Some(image), &|| false)?)
}

fn max_diff(a: &Tensor, b: &Tensor) -> anyhow::Result<f32> {
    Ok((a - b)?.abs()?.max_all()?.to_scalar::<f32>()?)
}

#[test]
fn wan21_i2v_start_image_conditions_the_clip() -> anyhow::Result<()> {
    let dit = tiny_i2v()?;
    let vae = decoder("wan21_vae_tiny")?;
    let clip = tiny_clip()?;
    let s = settings(32, 32);
    let shape = latent_shape(dit.config(), vae.vae.config(), &s)?;
    assert_eq!(shape, [16, 2, 4, 4]);
    let cond_a = image_conditioning(dit.config(), &picture(48, 40, 1), &vae, Some(&clip), &s)?;
    let ImageConditioning::Channels { y, clip: Some(fea) } = &cond_a else {
        anyhow::bail!("Wan2.1 I2V conditioning must be channels with CLIP features");
    };
    assert_eq!(y.dims(), &[20, 2, 4, 4]);
    assert_eq!(fea.dims(), &[1, 17, 32]);
    // Mask channels: 1 on the first latent frame, 0 after.
    let mask = y.narrow(0, 0, 4)?;
    assert_eq!(mask.narrow(1, 0, 1)?.min_all()?.to_scalar::<f32>()?, 1.0);
    assert_eq!(mask.narrow(1, 1, 1)?.max_all()?.to_scalar::<f32>()?, 0.0);

    let prompt = text(dit.config())?;
    let a = run(&dit, shape, &prompt, &cond_a)?;
    let again = image_conditioning(dit.config(), &picture(48, 40, 1), &vae, Some(&clip), &s)?;
    assert_eq!(
        max_diff(&a, &run(&dit, shape, &prompt, &again)?)?,
        0.0,
        "same image, same clip"
    );
    let cond_b = image_conditioning(dit.config(), &picture(48, 40, 90), &vae, Some(&clip), &s)?;
    let b = run(&dit, shape, &prompt, &cond_b)?;
    assert!(max_diff(&a, &b)? > 1e-3, "another image, another clip");
    // CLIP features alone change the result too (the `y` of image A with the CLIP features of image B).
    let ImageConditioning::Channels { clip: fea_b, .. } = &cond_b else {
        anyhow::bail!("channels expected");
    };
    let mixed = ImageConditioning::Channels {
        y: y.clone(),
        clip: fea_b.clone(),
    };
    assert!(
        max_diff(&a, &run(&dit, shape, &prompt, &mixed)?)? > 1e-4,
        "CLIP features are used"
    );
    let ImageConditioning::Channels { y: y_b, .. } = &cond_b else {
        anyhow::bail!("channels expected");
    };
    let mixed = ImageConditioning::Channels {
        y: y_b.clone(),
        clip: Some(fea.clone()),
    };
    assert!(
        max_diff(&a, &run(&dit, shape, &prompt, &mixed)?)? > 1e-4,
        "the y latents are used"
    );

    let mut model = dit.clone();

    let mut experts = Experts::single(&mut model);
    let conditioning = Conditioning {
        context: prompt.0.clone(),
        negative: Some(prompt.1.clone()),
    };
    let frames = generate_clip_from(
        &mut experts,
        &vae,
        &conditioning,
        Some(&cond_a),
        &s,
        &|| false,
    )?;
    assert_eq!(frames.len(), 5);
    assert_eq!((frames[0].width, frames[0].height), (32, 32));
    Ok(())
}

#[test]
fn ti2v_first_latent_frame_is_the_image() -> anyhow::Result<()> {
    let loaded = weights::load(&fixture("wan22_ti2v_tiny"), None, &Device::Cpu)?;
    assert_eq!(loaded.config.model_type, ModelType::Ti2v);
    let dit = WanModel::new(
        &loaded.config,
        Vb::from_tensors(loaded.tensors, DType::F32, &Device::Cpu),
        &ModelOptions::default(),
    )?;
    let vae = decoder("wan22_vae_tiny")?;
    let s = settings(64, 32);
    let shape = latent_shape(dit.config(), vae.vae.config(), &s)?;
    assert_eq!(shape, [48, 2, 2, 4]);
    let image = picture(90, 50, 3);
    let cond = image_conditioning(dit.config(), &image, &vae, None, &s)?;
    let ImageConditioning::FirstFrame { latent } = &cond else {
        anyhow::bail!("TI2V conditioning must be a first-frame latent");
    };
    // The image's latent, encoded on its own (one frame) after the cover-resize and centre crop.
    let fitted = image_tensor(&fit_cover_lanczos(&image, 64, 32), &Device::Cpu)?;
    let expected = vae
        .vae
        .encode(&fitted.unsqueeze(1)?.unsqueeze(0)?, &vae.stats)?
        .squeeze(0)?;
    assert_eq!(latent.dims(), &[48, 1, 2, 4]);
    assert_eq!(max_diff(latent, &expected)?, 0.0);

    let prompt = text(dit.config())?;
    let a = run(&dit, shape, &prompt, &cond)?;
    assert_eq!(
        max_diff(&a.narrow(1, 0, 1)?, latent)?,
        0.0,
        "first frame kept exactly"
    );
    assert_eq!(
        max_diff(&a, &run(&dit, shape, &prompt, &cond)?)?,
        0.0,
        "deterministic"
    );
    let other = image_conditioning(dit.config(), &picture(90, 50, 77), &vae, None, &s)?;
    let b = run(&dit, shape, &prompt, &other)?;
    assert!(
        max_diff(&a.narrow(1, 1, 1)?, &b.narrow(1, 1, 1)?)? > 1e-4,
        "the image steers the later frames"
    );
    Ok(())
}

#[test]
fn clip_sizes_follow_the_image_as_officially() {
    let i2v = WanConfig::wan21_i2v_14b();
    // Expected values from the official formulas run in Python (NumPy floats). An 832×480 image gets 464
    // rows there too: √(399360 · 480/832) lands a hair under 480.
    assert_eq!(official_size(&i2v, (1920, 1080), 832 * 480), (832, 464));
    assert_eq!(official_size(&i2v, (832, 480), 832 * 480), (832, 464));
    assert_eq!(official_size(&i2v, (480, 832), 832 * 480), (480, 832));
    assert_eq!(official_size(&i2v, (1024, 768), 832 * 480), (720, 544));
    assert_eq!(official_size(&i2v, (500, 500), 832 * 480), (624, 624));
    let ti2v = WanConfig::wan22_ti2v_5b();
    assert_eq!(default_max_area(&ti2v), 1280 * 704);
    assert_eq!(official_size(&ti2v, (1280, 704), 1280 * 704), (1280, 704));
    assert_eq!(official_size(&ti2v, (704, 1280), 1280 * 704), (704, 1280));
    assert_eq!(official_size(&ti2v, (1024, 768), 1280 * 704), (1088, 800));
}

#[test]
fn sizes_and_crops_follow_the_official_fits() {
    let wide = picture(100, 50, 0);
    assert_eq!(crop_to_aspect(&wide, 32, 32).dimensions(), (50, 50));
    assert_eq!(crop_to_aspect(&wide, 64, 32).dimensions(), (100, 50));
    assert_eq!(
        crop_to_aspect(&picture(40, 90, 0), 832, 480).dimensions(),
        (40, 23)
    );
    assert_eq!(fit_cover_lanczos(&wide, 64, 32).dimensions(), (64, 32));
    assert_eq!(
        fit_cover_lanczos(&picture(30, 90, 0), 64, 32).dimensions(),
        (64, 32)
    );
    let t = image_tensor(&picture(4, 2, 0), &Device::Cpu).map(|t| t.dims().to_vec());
    assert_eq!(t.ok(), Some(vec![3, 2, 4]));
}

#[test]
fn bad_start_images_are_explained() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let missing = dir.path().join("nope.png");
    let msg = load_start_image(&missing)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        msg.contains("not found") && msg.ends_with("nope.png"),
        "{msg}"
    );
    let junk = dir.path().join("junk.png");
    std::fs::write(&junk, b"this is not an image")?;
    let msg = load_start_image(&junk)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        msg.contains("cannot read the start image") && msg.ends_with("junk.png"),
        "{msg}"
    );
    let good = dir.path().join("good.jpg");
    picture(20, 10, 5).save(&good)?;
    assert_eq!(load_start_image(&good)?.dimensions(), (20, 10));

    let t2v = WanConfig::wan21_t2v_1_3b();
    let msg = check_image_use(&t2v, "Wan2.1 T2V-1.3B", true)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        msg.contains("drop --image") && msg.contains("T2V-1.3B"),
        "{msg}"
    );
    assert!(check_image_use(&t2v, "t2v", false).is_ok());
    let i2v = WanConfig::wan21_i2v_14b();
    let msg = check_image_use(&i2v, "Wan2.1 I2V-14B", false)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(msg.contains("--image PATH"), "{msg}");
    let ti2v = WanConfig::wan22_ti2v_5b();
    assert!(
        check_image_use(&ti2v, "ti2v", false).is_ok()
            && check_image_use(&ti2v, "ti2v", true).is_ok()
    );

    // Wan2.1 I2V without the CLIP encoder.
    let dit = tiny_i2v()?;
    let vae = decoder("wan21_vae_tiny")?;
    let msg = image_conditioning(
        dit.config(),
        &picture(32, 32, 0),
        &vae,
        None,
        &settings(32, 32),
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(msg.contains("--clip"), "{msg}");
    Ok(())
}
