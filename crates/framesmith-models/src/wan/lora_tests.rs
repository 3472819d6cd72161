//! Wan's linears and LoRA files together: adapters attached to the tiny model save under musubi-tuner's names
//! and load back into a fresh model that then computes what the trained one does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use rand::SeedableRng;

use crate::wan::random::random_weights;
use crate::wan::{WanConfig, WanModel};
use framesmith_nn::lora::{attach_loras, LoraSpec};
use framesmith_nn::lora_file::LoraFile;
use framesmith_nn::vb::Vb;

fn tensor(seed: u64, dims: &[usize], scale: f32) -> Tensor {
    let rng = &mut rand::rngs::StdRng::seed_from_u64(seed);
    framesmith_nn::init::randn(rng, dims, 0.0, scale, &Device::Cpu).unwrap()
}

/// The tiny two-block Wan model (seeded random weights) on the CPU.
fn tiny_model(cfg: &WanConfig) -> WanModel {
    let dev = Device::Cpu;
    let weights = random_weights(cfg, 5, DType::F32, &dev).unwrap();
    WanModel::new(
        cfg,
        Vb::from_tensors(weights, DType::F32, &dev),
        &Default::default(),
    )
    .unwrap()
}

/// Rank-2 f32 adapters attached to every block linear of `model`, with non-zero `up` factors (a trained LoRA).
fn attach_trained(model: &mut WanModel) -> framesmith_nn::lora::LoraSet {
    let spec = LoraSpec {
        rank: 2,
        alpha: 1.0,
        dtype: DType::F32,
        include_patterns: vec![],
        exclude_patterns: vec![],
        seed: 1,
    };
    let set = attach_loras(model.linears_mut(), &spec).unwrap();
    for (_, lora) in set.iter() {
        let dims = lora.up.dims().to_vec();
        lora.up.set(&tensor(9, &dims, 0.1)).unwrap();
    }
    set
}

fn bits(t: &Tensor) -> Vec<u32> {
    framesmith_nn::testing::f32_bits(t).unwrap()
}

/// On the tiny Wan model: adapters land on the 10 linears of each T2V block, save under musubi-tuner's names,
/// and a fresh model that applies the file computes what the trained one does.
#[test]
fn tiny_wan_model_round_trip() {
    let dev = Device::Cpu;
    let cfg = WanConfig::tiny(2);
    let mut trained = tiny_model(&cfg);
    let set = attach_trained(&mut trained);
    assert_eq!(set.len(), 2 * 10);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wan.safetensors");
    set.save(&path, DType::F32, &HashMap::new()).unwrap();
    let file = LoraFile::load(&path, &dev).unwrap();
    for name in [
        "lora_unet_blocks_0_self_attn_q",
        "lora_unet_blocks_1_cross_attn_o",
        "lora_unet_blocks_1_ffn_2",
    ] {
        assert!(file.get(name).is_some(), "{name}");
    }

    let mut applied = tiny_model(&cfg);
    assert_eq!(
        file.apply(applied.linears_mut(), 1.0, DType::F32).unwrap(),
        20
    );
    for ((pa, a), (pb, b)) in trained.linears_mut().into_iter().zip(applied.linears_mut()) {
        assert_eq!(pa, pb);
        let x = tensor(10, &[3, a.in_dim()], 1.0);
        let (ya, yb) = (a.forward(&x).unwrap(), b.forward(&x).unwrap());
        assert_eq!(bits(&ya), bits(&yb), "{pa}");
    }
}

/// Inference through [`WanModel::forward_untracked`] (generation, training samples) computes what the tracked
/// forward does with trainable LoRA attached, and its outputs carry no autograd graph (which kept every block's
/// intermediates alive and ran a 14B sample out of memory).
#[test]
fn untracked_forward_matches_the_tracked_one_without_a_graph() {
    let cfg = WanConfig::tiny(2);
    let mut model = tiny_model(&cfg);
    let _set = attach_trained(&mut model);
    let inputs = crate::wan::random::random_inputs(&cfg, &[[2, 4, 4]], 3, &Device::Cpu).unwrap();
    let tracked = model.forward(&inputs).unwrap();
    let untracked = model.forward_untracked(&inputs).unwrap();
    assert!(
        tracked[0].track_op(),
        "LoRA makes the plain forward tracked"
    );
    assert!(!untracked[0].track_op());
    let err = framesmith_nn::testing::rel(&untracked[0], &tracked[0]).unwrap();
    assert!(err <= 1e-5, "relative difference {err}");
}
