//! Clips from the tiny fixture DiT, VAE and umT5: shapes, determinism, LoRAs, the written MP4; size checks; the
//! exact combination of several LoRAs.

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::*;
use crate::generate::run::{combine_loras, write_clip};
use framesmith_data::media::MediaTools;
use framesmith_models::wan::text_encoder::tokenizer::testkit::write_tiny_tokenizer;
use framesmith_models::wan::vae::{load_vae_auto, VaeVariant};
use framesmith_models::wan::{weights, ModelOptions, WanModel};
use framesmith_nn::init::randn;
use framesmith_nn::lora::Lora;
use framesmith_nn::lora_file::{LoadedLora, LoraFile};
use framesmith_nn::vb::Vb;

fn fixture(case: &str) -> PathBuf {
    framesmith_models::fixtures::wan_case(case).join("weights.safetensors")
}

fn tiny_dit() -> anyhow::Result<WanModel> {
    let loaded = weights::load(&fixture("wan21_t2v_tiny"), None, &Device::Cpu)?;
    let vb = Vb::from_tensors(loaded.tensors, DType::F32, &Device::Cpu);
    Ok(WanModel::new(&loaded.config, vb, &ModelOptions::default())?)
}

fn tiny_decoder() -> anyhow::Result<VaeDecoder> {
    Ok(VaeDecoder {
        vae: load_vae_auto(&fixture("wan21_vae_tiny"), DType::F32, &Device::Cpu)?,
        stats: LatentStats::official(VaeVariant::Wan21, &Device::Cpu)?,
        tiles: None,
        dtype: DType::F32,
    })
}

fn settings(seed: u64) -> ClipSettings {
    ClipSettings {
        width: 32,
        height: 48,
        frames: 5,
        steps: 3,
        shift: 5.0,
        guidance: 3.0,
        seed,
        solver: Solver::Unipc,
    }
}

/// A LoRA file for two modules of the tiny DiT with random factors.
fn random_lora(seed: u64, rank: usize) -> anyhow::Result<LoraFile> {
    let dev = Device::Cpu;
    let rng = &mut StdRng::seed_from_u64(seed);
    let modules = ["blocks.0.self_attn.q", "blocks.1.ffn.0"]
        .iter()
        .enumerate()
        .map(|(i, path)| {
            let (in_dim, out_dim) = if path.ends_with("ffn.0") {
                (64, 128)
            } else {
                (64, 64)
            };
            let s = (seed * 10 + i as u64) as f64;
            Ok(LoadedLora {
                name: framesmith_nn::lora_file::musubi_name(path),
                path: Some(path.to_string()),
                down: (randn(rng, (rank, in_dim), 0.0, 0.5, &dev)? + s * 0.01)?,
                up: randn(rng, (out_dim, rank), 0.0, 0.5, &dev)?,
                alpha: rank as f64 / 2.0,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(LoraFile {
        modules,
        ..Default::default()
    })
}

#[test]
fn combined_loras_add_up_exactly() -> anyhow::Result<()> {
    let (a, b) = (random_lora(1, 4)?, random_lora(2, 2)?);
    let combined = combine_loras(&[(a.clone(), 0.7), (b.clone(), -1.5)])?;
    let xs = randn(
        &mut StdRng::seed_from_u64(31),
        (3, 64),
        0.0,
        1.0,
        &Device::Cpu,
    )?;
    for (i, module) in combined.modules.iter().enumerate() {
        assert_eq!(module.down.dim(0)?, 6);
        let adapter = |m: &LoadedLora, mult: f64| -> anyhow::Result<Tensor> {
            let mut l = Lora::from_tensors(&m.down, &m.up, m.alpha)?;
            l.multiplier = mult;
            let x = xs.narrow(1, 0, m.down.dim(1)?)?;
            Ok(l.forward(&x)?)
        };
        let sum = (adapter(&a.modules[i], 0.7)? + adapter(&b.modules[i], -1.5)?)?;
        let got = adapter(module, 1.0)?;
        let err = (got - &sum)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(err < 1e-4, "{}: combined differs by {err}", module.name);
    }
    Ok(())
}

#[test]
fn sizes_that_do_not_fit_are_explained() {
    let dit = WanConfig::wan21_t2v_1_3b();
    let vae = VaeConfig::wan21();
    let mut s = ClipSettings {
        width: 832,
        height: 480,
        frames: 81,
        ..settings(0)
    };
    assert_eq!(latent_shape(&dit, &vae, &s).ok(), Some([16, 21, 60, 104]));
    s.width = 840;
    let msg = latent_shape(&dit, &vae, &s)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        msg.contains("multiples of 16") && msg.contains("832x480"),
        "{msg}"
    );
    s.width = 832;
    s.frames = 80;
    let msg = latent_shape(&dit, &vae, &s)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(msg.contains("4k + 1") && msg.contains("77"), "{msg}");
    s.frames = 81;
    let msg = latent_shape(&dit, &VaeConfig::wan22(), &s)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(msg.contains("48 latent channels"), "{msg}");
    // A prompt file's `--s 0`, `--fs -1` or `--l nan` is refused here too, before anything is sampled.
    for (bad, want) in [
        (
            ClipSettings {
                steps: 0,
                ..s.clone()
            },
            "0 steps sample nothing",
        ),
        (
            ClipSettings {
                shift: -1.0,
                ..s.clone()
            },
            "flow shift -1 does not work",
        ),
        (
            ClipSettings {
                guidance: f64::NAN,
                ..s.clone()
            },
            "guidance scale NaN does not work",
        ),
    ] {
        let msg = latent_shape(&dit, &vae, &bad)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(msg.contains(want), "{msg}");
    }
}

#[test]
fn tiny_models_make_a_deterministic_clip_with_loras() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let tokenizer = dir.path().join("tokenizer.json");
    write_tiny_tokenizer(&tokenizer)?;
    let text = TextEncoder::load(
        &fixture("umt5_tiny"),
        Some(&tokenizer),
        DType::F32,
        &Device::Cpu,
    )?;
    let cond = Conditioning::encode(&text, "a red cat on the left", Some("a dog"), 3.0)?;
    assert_eq!(cond.context.dims(), &[7, 32]);
    assert_eq!(
        cond.negative.as_ref().map(Tensor::dims),
        Some(&[3usize, 32][..])
    );
    // Unguided: no negative prompt is encoded, the default included.
    assert!(Conditioning::encode(&text, "a cat", None, 1.0)?
        .negative
        .is_none());
    drop(text);

    let mut dit = tiny_dit()?;
    let decoder = tiny_decoder()?;
    let run = |dit: &WanModel, seed| {
        let mut model = dit.clone();
        let mut experts = Experts::single(&mut model);
        generate_clip(&mut experts, &decoder, &cond, &settings(seed), &|| false)
    };
    let frames = run(&dit, 7)?;
    assert_eq!(frames.len(), 5);
    assert!(frames.iter().all(|f| (f.width, f.height) == (32, 48)));
    assert_eq!(frames, run(&dit, 7)?, "same seed, same clip");
    assert_ne!(frames, run(&dit, 8)?, "another seed, another clip");

    let lora = combine_loras(&[(random_lora(3, 4)?, 1.0), (random_lora(4, 2)?, 0.5)])?;
    assert_eq!(lora.apply(dit.linears_mut(), 1.0, DType::F32)?, 2);
    let with_lora = run(&dit, 7)?;
    assert_ne!(frames, with_lora, "the LoRA changes the clip");

    let out = dir.path().join("clips").join("clip.mp4");
    let frames_dir = write_clip(&out, &with_lora, CLIP_FPS)?;
    assert!(out.is_file());
    assert_eq!(frames_dir, dir.path().join("clips").join("clip_frames"));
    assert!(frames_dir.join("frame_0004.png").is_file());
    if let Ok(tools) = MediaTools::locate() {
        let info = tools.probe(&out)?;
        assert_eq!((info.width, info.height, info.frame_count), (32, 48, 5));
    }
    Ok(())
}

#[test]
fn cancelling_stops_generation() -> anyhow::Result<()> {
    let dit = tiny_dit()?;
    let decoder = tiny_decoder()?;
    let cond = Conditioning {
        context: Tensor::zeros((3, 32), DType::F32, &Device::Cpu)?,
        negative: None,
    };
    let mut model = dit.clone();
    let mut experts = Experts::single(&mut model);
    let err = generate_clip(&mut experts, &decoder, &cond, &settings(1), &|| true)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("cancelled"), "{err}");
    Ok(())
}
