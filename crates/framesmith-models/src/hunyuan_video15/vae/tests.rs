//! The VAE against the official implementation's fixtures (`tests/fixtures/hunyuan_video15_vae`, made by
//! `bench/reference/hunyuan_video15_vae.py`): whole-clip, chunked and tiled encode and decode, both key layouts,
//! the architecture read from the shapes, and what other files are called.

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};

use super::weights::{config_from_shapes, vae_from_tensors};
use super::*;

struct Case {
    vae: Hv15Vae,
    inputs: HashMap<String, Tensor>,
    expected: HashMap<String, Tensor>,
}

fn case(name: &str) -> anyhow::Result<Case> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hunyuan_video15_vae")
        .join(name);
    let read = |f: &str| candle_core::safetensors::load(dir.join(f), &Device::Cpu);
    let vae = vae_from_tensors(read("weights.safetensors")?, DType::F32, &Device::Cpu)
        .map_err(anyhow::Error::msg)?;
    Ok(Case {
        vae,
        inputs: read("inputs.safetensors")?,
        expected: read("expected.safetensors")?,
    })
}

/// ‖got − want‖ / ‖want‖.
fn rel(got: &Tensor, want: &Tensor) -> anyhow::Result<f64> {
    anyhow::ensure!(
        got.dims() == want.dims(),
        "shape {:?} != {:?}",
        got.dims(),
        want.dims()
    );
    let d = (got - want)?.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
    let r = want.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
    Ok((d / r.max(f64::MIN_POSITIVE)).sqrt())
}

fn check(name: &str, got: &Tensor, want: &Tensor) -> anyhow::Result<()> {
    let r = rel(got, want)?;
    anyhow::ensure!(r <= 1e-4, "{name}: relative error {r:.3e}");
    Ok(())
}

const FIXTURE_TILES: SpatialTiles = SpatialTiles {
    sample_size: 64,
    overlap: 0.25,
};

#[test]
fn video_encode_matches_official_whole_chunked_and_tiled() -> anyhow::Result<()> {
    let c = case("video")?;
    let video = &c.inputs["video"];
    for chunk in [None, Some(1), Some(2)] {
        let got = c.vae.encode_moments(video, chunk)?;
        check(
            &format!("moments chunk {chunk:?}"),
            &got,
            &c.expected["moments"],
        )?;
    }
    for chunk in [None, Some(1)] {
        let got = c
            .vae
            .encode_moments_tiled(video, Some(FIXTURE_TILES), chunk)?;
        check(
            &format!("moments tiled chunk {chunk:?}"),
            &got,
            &c.expected["moments_tiled"],
        )?;
    }
    // Tiling changes the result (the fixture would not see a tiling that did nothing).
    assert!(rel(&c.expected["moments_tiled"], &c.expected["moments"])? > 1e-3);
    let latents = c.vae.encode(video, Some(1))?;
    check("latents", &latents, &c.expected["moments"].narrow(1, 0, 4)?)?;
    Ok(())
}

#[test]
fn video_decode_matches_official_whole_chunked_and_tiled() -> anyhow::Result<()> {
    let c = case("video")?;
    let z = &c.inputs["latents"];
    for chunk in [None, Some(1), Some(2)] {
        check(
            &format!("decoded chunk {chunk:?}"),
            &c.vae.decode(z, chunk)?,
            &c.expected["decoded"],
        )?;
    }
    let tiled = c.vae.decode_tiled(z, Some(FIXTURE_TILES), Some(1))?;
    check("decoded tiled", &tiled, &c.expected["decoded_tiled"])?;
    assert!(rel(&c.expected["decoded_tiled"], &c.expected["decoded"])? > 1e-3);
    Ok(())
}

#[test]
fn diffusers_layout_image_matches_official() -> anyhow::Result<()> {
    let c = case("image")?;
    let got = c
        .vae
        .encode_moments_tiled(&c.inputs["video"], Some(SpatialTiles::small()), None)?;
    check("moments", &got, &c.expected["moments"])?;
    let got = c
        .vae
        .decode_tiled(&c.inputs["latents"], Some(SpatialTiles::small()), None)?;
    check("decoded", &got, &c.expected["decoded"])?;
    Ok(())
}

#[test]
fn a_perturbed_weight_fails_the_comparison() -> anyhow::Result<()> {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hunyuan_video15_vae/video");
    let mut weights =
        candle_core::safetensors::load(dir.join("weights.safetensors"), &Device::Cpu)?;
    let key = "encoder.mid.attn_1.q.weight";
    let w = &weights[key];
    weights.insert(key.into(), w.affine(1.05, 0.0)?);
    let vae = vae_from_tensors(weights, DType::F32, &Device::Cpu).map_err(anyhow::Error::msg)?;
    let c = case("video")?;
    let got = vae.encode_moments(&c.inputs["video"], None)?;
    assert!(check("moments", &got, &c.expected["moments"]).is_err());
    Ok(())
}

#[test]
fn the_released_architecture_is_read_back_from_its_shapes() -> anyhow::Result<()> {
    let cfg = Hv15VaeConfig::released();
    let shapes: HashMap<String, Vec<usize>> = Hv15Vae::tensor_shapes(&cfg)?.into_iter().collect();
    assert_eq!(
        config_from_shapes(&shapes).map_err(anyhow::Error::msg)?,
        cfg
    );
    assert_eq!(
        shapes["encoder.conv_out.conv.weight"],
        vec![64, 1024, 3, 3, 3]
    );
    assert_eq!(
        shapes["decoder.up.0.upsample.conv.conv.weight"],
        vec![8192, 1024, 3, 3, 3]
    );
    assert_eq!(cfg.latent_frames(121), 31);
    let json = r#"{"_class_name": "AutoencoderKLConv3D", "block_out_channels": [128, 256, 512, 1024, 1024],
        "ffactor_spatial": 16, "ffactor_temporal": 4, "in_channels": 3, "latent_channels": 32,
        "layers_per_block": 2, "out_channels": 3, "sample_size": 256, "sample_tsize": 64,
        "scaling_factor": 1.03682, "shift_factor": null}"#;
    assert_eq!(Hv15VaeConfig::from_json(json)?, cfg);
    Ok(())
}

#[test]
fn other_files_are_named_with_what_to_give_instead() -> anyhow::Result<()> {
    let one = |key: &str| -> anyhow::Result<String> {
        let t = Tensor::zeros((2, 2), DType::F32, &Device::Cpu)?;
        let tensors = HashMap::from([(key.to_string(), t)]);
        Ok(vae_from_tensors(tensors, DType::F32, &Device::Cpu)
            .err()
            .unwrap_or_default())
    };
    let v10 = one("encoder.down_blocks.0.resnets.0.norm1.weight")?;
    assert!(
        v10.contains("HunyuanVideo 1.0") && v10.contains("hunyuanvideo15_vae_fp16"),
        "{v10}"
    );
    assert!(one("decoder.conv1.weight")?.contains("Wan VAE"));
    assert!(one("double_blocks.0.img_attn_q.weight")?.contains("transformer"));
    Ok(())
}
