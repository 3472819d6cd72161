//! Wan's linears and LoRA files together: adapters attached to the tiny model save under musubi-tuner's names
//! and load back into a fresh model that then computes what the trained one does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};

use candle_core::{DType, Device, Tensor};
use rand::SeedableRng;

use crate::wan::random::random_weights;
use crate::wan::weights::official_shapes;
use crate::wan::{WanConfig, WanModel};
use framesmith_nn::adapter::{factorization, AdapterKind};
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
        kind: Default::default(),
    };
    let set = attach_loras(model.linears_mut(), &spec).unwrap();
    for (_, lora) in set.iter() {
        let lora = lora.as_lora().unwrap();
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

/// The tensors (name → shape) LyCORIS writes, and ComfyUI reads, for an adapter of `kind` at `rank` on every
/// 2-D weight inside `blocks.N` of this state dict: LoKr splits each width as LyCORIS' `factorization` does and
/// makes a factor a rank-`rank` product when the rank is under half its larger side (`w1` only with
/// `decompose_both`); LoHa has two rank-`rank` products; DoRA is a LoRA with `dora_scale` [out, 1].
fn lycoris_keys(
    official: &[(String, Vec<usize>)],
    kind: AdapterKind,
    rank: usize,
) -> BTreeMap<String, Vec<usize>> {
    let mut keys = BTreeMap::new();
    for (name, shape) in official {
        let (Some(module), [out, inp]) = (name.strip_suffix(".weight"), shape.as_slice()) else {
            continue;
        };
        if !module.starts_with("blocks.") {
            continue;
        }
        let key = format!("lora_unet_{}", module.replace('.', "_"));
        let mut put = |suffix: &str, dims: Vec<usize>| keys.insert(format!("{key}.{suffix}"), dims);
        put("alpha", vec![]);
        match kind {
            AdapterKind::Lokr { decompose_both, .. } => {
                let ((out_l, out_k), (in_m, in_n)) =
                    (factorization(*out, -1), factorization(*inp, -1));
                let low = |r: usize, c: usize| 2 * rank < r.max(c);
                for (w, r, c, can) in [
                    ("w1", out_l, in_m, decompose_both),
                    ("w2", out_k, in_n, true),
                ] {
                    if can && low(r, c) {
                        put(&format!("lokr_{w}_a"), vec![r, rank]);
                        put(&format!("lokr_{w}_b"), vec![rank, c]);
                    } else {
                        put(&format!("lokr_{w}"), vec![r, c]);
                    }
                }
            }
            AdapterKind::Loha => {
                for w in ["w1", "w2"] {
                    put(&format!("hada_{w}_a"), vec![*out, rank]);
                    put(&format!("hada_{w}_b"), vec![rank, *inp]);
                }
            }
            _ => {
                put("lora_down.weight", vec![rank, *inp]);
                put("lora_up.weight", vec![*out, rank]);
                put("dora_scale", vec![*out, 1]);
            }
        }
    }
    keys
}

/// For each kind, the file of an adapter on the Wan model has exactly the keys and shapes that its state dict
/// implies under LyCORIS' (and ComfyUI's) names, and reads back as that kind on every module.
#[test]
fn every_kind_has_the_keys_comfyui_reads_for_the_state_dict() {
    let cfg = WanConfig::tiny(2);
    let official = official_shapes(&cfg);
    let dir = tempfile::tempdir().unwrap();
    for (kind, rank) in [
        (
            AdapterKind::Lokr {
                factor: -1,
                decompose_both: true,
                full_matrix: false,
            },
            1,
        ),
        (
            AdapterKind::Lokr {
                factor: -1,
                decompose_both: false,
                full_matrix: false,
            },
            2,
        ),
        (AdapterKind::Loha, 2),
        (AdapterKind::Dora, 2),
    ] {
        let mut model = tiny_model(&cfg);
        let spec = LoraSpec {
            rank,
            alpha: 1.0,
            dtype: DType::F32,
            include_patterns: vec![],
            exclude_patterns: vec![],
            seed: 1,
            kind,
        };
        let set = attach_loras(model.linears_mut(), &spec).unwrap();
        let path = dir.path().join(format!("{}.safetensors", kind.name()));
        set.save(&path, DType::BF16, &HashMap::new()).unwrap();
        let written: BTreeMap<String, Vec<usize>> =
            candle_core::safetensors::load(&path, &Device::Cpu)
                .unwrap()
                .into_iter()
                .map(|(k, v)| (k, v.dims().to_vec()))
                .collect();
        assert_eq!(written, lycoris_keys(&official, kind, rank), "{kind:?}");
        let file = LoraFile::load(&path, &Device::Cpu).unwrap();
        assert_eq!(file.adapters.len(), set.len(), "{kind:?}");
        assert!(
            file.adapters.iter().all(|m| m.kind_name() == kind.name()),
            "{kind:?}"
        );
    }
}
