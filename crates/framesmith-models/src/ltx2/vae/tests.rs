//! The video VAE against ltx-core's fixtures (`tests/fixtures/ltx2/vae_*`, made by `bench/reference/ltx2_vae.py`):
//! encode and decode whole, tiled and of one image, the file read with its metadata, the tile splits and masks
//! against ltx-core's definitions, tiled against untiled, and the errors of files and shapes it refuses.

use candle_core::{DType, Device, Tensor};

use super::tiled::{split_by_size, split_causal, trapezoid, Interval};
use super::*;
use crate::fixtures::{assert_close, FixtureCase};
use crate::ltx2::testkit::fixtures_dir;

const ATOL: f64 = 1e-4;
const RTOL: f64 = 1e-4;

fn case(name: &str) -> anyhow::Result<(FixtureCase, Ltx2Vae)> {
    let dir = fixtures_dir().join(name);
    let case = FixtureCase::load_dir(&dir)?;
    let vae = load_ltx2_vae(&dir.join("weights.safetensors"), DType::F32, &Device::Cpu)?;
    Ok((case, vae))
}

fn tiling(spec: &serde_json::Value) -> VaeTiling {
    let axis = |name: &str| {
        spec.get(name).map(|a| AxisTiles {
            tile: a["tile_size"].as_u64().unwrap_or(0) as usize,
            overlap: a["overlap"].as_u64().unwrap_or(0) as usize,
        })
    };
    VaeTiling {
        frames: axis("frames"),
        height: axis("height"),
        width: axis("width"),
    }
}

#[test]
fn ltx2_case_matches_ltx_core_whole_tiled_and_image() -> anyhow::Result<()> {
    let (c, vae) = case("vae_ltx2")?;
    assert!(!vae.config().timestep_conditioning);
    assert_eq!(vae.config().encoder_padding, Padding::Zeros);
    assert_eq!(vae.config().decoder_padding, Padding::Reflect);
    let (video, latents) = (c.input("video")?, c.input("latents")?);
    let cond = DecodeConditioning::default();
    assert_close(
        "encoded",
        &vae.encode(video)?,
        c.expected("encoded")?,
        ATOL,
        RTOL,
    )?;
    assert_close(
        "decoded",
        &vae.decode(latents, &cond)?,
        c.expected("decoded")?,
        ATOL,
        RTOL,
    )?;
    let enc = tiling(&c.config["encode_tiles"]);
    let got = vae.encode_tiled(video, &enc)?;
    assert_close(
        "encoded_tiled",
        &got,
        c.expected("encoded_tiled")?,
        ATOL,
        RTOL,
    )?;
    let dec = tiling(&c.config["decode_tiles"]);
    let got = vae.decode_tiled(latents, &dec, &cond)?;
    assert_close(
        "decoded_tiled",
        &got,
        c.expected("decoded_tiled")?,
        ATOL,
        RTOL,
    )?;
    let image = vae.encode(c.input("image")?)?;
    assert_close(
        "image_encoded",
        &image,
        c.expected("image_encoded")?,
        ATOL,
        RTOL,
    )?;
    let image = vae.decode(c.input("image_latents")?, &cond)?;
    assert_close(
        "image_decoded",
        &image,
        c.expected("image_decoded")?,
        ATOL,
        RTOL,
    )?;
    Ok(())
}

#[test]
fn ltx23_case_matches_ltx_core_with_timestep_and_noise() -> anyhow::Result<()> {
    let (c, vae) = case("vae_ltx23")?;
    assert!(vae.config().timestep_conditioning && vae.config().causal_decoder);
    assert_close(
        "encoded",
        &vae.encode(c.input("video")?)?,
        c.expected("encoded")?,
        ATOL,
        RTOL,
    )?;
    let cond = DecodeConditioning {
        noise: Some(c.input("decode_noise")?.clone()),
        ..DecodeConditioning::default()
    };
    let got = vae.decode(c.input("latents")?, &cond)?;
    assert_close("decoded", &got, c.expected("decoded")?, ATOL, RTOL)?;
    // Other noise gives another result: the noise is read.
    let other = DecodeConditioning {
        noise: Some(c.input("decode_noise")?.affine(-1.0, 0.0)?),
        ..DecodeConditioning::default()
    };
    let got = vae.decode(c.input("latents")?, &other)?;
    assert!(assert_close("other noise", &got, c.expected("decoded")?, ATOL, RTOL).is_err());
    // Tiled, each tile takes the given noise under it: one tile covering the clip is the untiled decode.
    let latents = c.input("latents")?;
    let (_, _, f, h, w) = latents.dims5()?;
    let (fs, ft) = vae.config().decoder_factors();
    let axis = |n: usize| {
        Some(AxisTiles {
            tile: n,
            overlap: n / 2,
        })
    };
    let one = VaeTiling {
        frames: axis(((f - 1) * ft + 1).max(32)),
        height: axis((h * fs).max(128)),
        width: axis((w * fs).max(128)),
    };
    let tiled = vae.decode_tiled(latents, &one, &cond)?;
    assert_close(
        "tiled, given noise",
        &tiled,
        c.expected("decoded")?,
        ATOL,
        RTOL,
    )?;
    let short = DecodeConditioning {
        noise: Some(c.input("decode_noise")?.narrow(2, 0, 1)?),
        ..DecodeConditioning::default()
    };
    assert!(vae.decode_tiled(latents, &one, &short).is_err());
    Ok(())
}

#[test]
fn splits_and_masks_follow_ltx_core() {
    let iv = |start, end, left, right| Interval {
        start,
        end,
        left,
        right,
    };
    // split_by_size(10, 4)(24): amount (24 + 10 − 8 − 1) // 6 = 4.
    assert_eq!(
        split_by_size(24, 10, 4),
        vec![
            iv(0, 10, 0, 4),
            iv(6, 16, 4, 4),
            iv(12, 22, 4, 4),
            iv(18, 24, 4, 0)
        ]
    );
    assert_eq!(split_by_size(10, 10, 4), vec![iv(0, 10, 0, 0)]);
    assert_eq!(split_causal(7, 6, 4), vec![iv(0, 6, 0, 4), iv(1, 7, 5, 0)]);
    // linspace(0, 1, 4)[1:-1] = (1/3, 2/3); linspace(1, 0, 4)[1:-1] = (2/3, 1/3).
    let m = trapezoid(6, 2, 2, false);
    let want = [1.0 / 3.0, 2.0 / 3.0, 1.0, 1.0, 2.0 / 3.0, 1.0 / 3.0];
    assert!(
        m.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-6),
        "{m:?}"
    );
    // From zero: linspace(0, 1, 3)[:-1] = (0, 1/2).
    let m = trapezoid(4, 2, 0, true);
    assert_eq!(m, vec![0.0, 0.5, 1.0, 1.0]);
}

#[test]
fn tiles_larger_than_the_clip_give_the_untiled_result() -> anyhow::Result<()> {
    let (c, vae) = case("vae_ltx2")?;
    let (video, latents) = (c.input("video")?, c.input("latents")?);
    let big = VaeTiling {
        frames: Some(AxisTiles {
            tile: 64,
            overlap: 16,
        }),
        height: Some(AxisTiles {
            tile: 128,
            overlap: 64,
        }),
        width: Some(AxisTiles {
            tile: 128,
            overlap: 64,
        }),
    };
    let cond = DecodeConditioning::default();
    let whole = vae.encode(video)?;
    assert_close("encode", &vae.encode_tiled(video, &big)?, &whole, 0.0, 0.0)?;
    let whole = vae.decode(latents, &cond)?;
    assert_close(
        "decode",
        &vae.decode_tiled(latents, &big, &cond)?,
        &whole,
        0.0,
        0.0,
    )?;
    Ok(())
}

/// The fixture VAE with every 3×3×3 kernel cut to its tap at the current frame and pixel (the last temporal tap
/// in the causal encoder, the middle one in the symmetric decoder): each output then depends on its own place only.
fn pointwise_vae(case: &FixtureCase) -> anyhow::Result<Ltx2Vae> {
    let cfg = Ltx2VaeConfig::from_vae_json(&case.config["vae"]).map_err(anyhow::Error::msg)?;
    let mut tensors = case.weights.clone();
    for (name, t) in tensors.iter_mut() {
        let dims = t.dims().to_vec();
        if dims.len() != 5 || dims[2..] != [3, 3, 3] {
            continue;
        }
        let tap = if name.contains(".encoder.") || cfg.causal_decoder {
            2
        } else {
            1
        };
        let mut mask = vec![0f32; 27];
        mask[tap * 9 + 4] = 1.0;
        let mask = Tensor::from_vec(mask, (1, 1, 3, 3, 3), &Device::Cpu)?;
        *t = t.broadcast_mul(&mask)?;
    }
    vae_from_tensors(tensors, &cfg, DType::F32, &Device::Cpu).map_err(anyhow::Error::msg)
}

/// With local kernels a tiled encode and decode must give the untiled result everywhere: the tiles' places, the
/// causal shift of later time tiles and the blend's weights are all checked.
#[test]
fn tiled_agrees_with_untiled_when_every_output_is_local() -> anyhow::Result<()> {
    let c = FixtureCase::load_dir(&fixtures_dir().join("vae_ltx2"))?;
    let vae = pointwise_vae(&c)?;
    let (video, latents) = (c.input("video")?, c.input("latents")?);
    let enc = tiling(&c.config["encode_tiles"]);
    let whole = vae.encode(video)?;
    assert_close(
        "encode",
        &vae.encode_tiled(video, &enc)?,
        &whole,
        1e-5,
        1e-5,
    )?;
    let cond = DecodeConditioning::default();
    let dec = tiling(&c.config["decode_tiles"]);
    let whole = vae.decode(latents, &cond)?;
    assert_close(
        "decode",
        &vae.decode_tiled(latents, &dec, &cond)?,
        &whole,
        1e-5,
        1e-5,
    )?;
    // The real (non-local) VAE's tiles do differ, so the comparison above is not vacuous.
    let (_, real) = case("vae_ltx2")?;
    let diff = (real.decode_tiled(latents, &dec, &cond)? - real.decode(latents, &cond)?)?
        .abs()?
        .max_all()?
        .to_scalar::<f32>()?;
    assert!(diff > 1e-2, "{diff}");
    Ok(())
}

#[test]
fn bad_shapes_and_files_are_refused_with_the_fix() -> anyhow::Result<()> {
    let (c, vae) = case("vae_ltx2")?;
    let video = c.input("video")?;
    let err = vae
        .encode(&video.narrow(2, 0, 24)?)
        .unwrap_err()
        .to_string();
    assert!(err.contains("4k + 1"), "{err}");
    let tiles = VaeTiling {
        frames: Some(AxisTiles {
            tile: 24,
            overlap: 8,
        }),
        ..VaeTiling::default()
    };
    let err = vae.encode_tiled(video, &tiles).unwrap_err().to_string();
    assert!(err.contains("below the required 16"), "{err}");
    // A file without the config metadata.
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("vae.safetensors");
    candle_core::safetensors::save(&c.weights, &path)?;
    let err = load_ltx2_vae(&path, DType::F32, &Device::Cpu)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("no `config` metadata") && err.contains("official"),
        "{err}"
    );
    // A file without the VAE.
    let other = dir.path().join("other.safetensors");
    let t = Tensor::zeros(2, DType::F32, &Device::Cpu)?;
    candle_core::safetensors::save(
        &std::collections::HashMap::from([("x".to_string(), t)]),
        &other,
    )?;
    let err = load_ltx2_vae(&other, DType::F32, &Device::Cpu)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("no LTX-2 video VAE"), "{err}");
    Ok(())
}

#[test]
fn configs_outside_the_supported_set_are_named() {
    let err =
        Ltx2VaeConfig::from_vae_json(&serde_json::json!({"_class_name": "CausalDiffusionVAE"}))
            .unwrap_err();
    assert!(err.contains("diffusion decoder"), "{err}");
    let err = Ltx2VaeConfig::from_vae_json(&serde_json::json!({"encoder_blocks": [["attn", {}]]}))
        .unwrap_err();
    assert!(err.contains("`attn` is not supported"), "{err}");
    let err =
        Ltx2VaeConfig::from_vae_json(&serde_json::json!({"norm_layer": "group_norm"})).unwrap_err();
    assert!(err.contains("pixel_norm"), "{err}");
}
