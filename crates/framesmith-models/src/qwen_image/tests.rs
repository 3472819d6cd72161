//! Qwen-Image's linears and LoRA files together: a LoRA of the released model (built without its 40 GB of
//! weights) has exactly the keys and shapes the official state dict implies under musubi-tuner's names
//! (`lora_unet_transformer_blocks_0_attn_to_q`, every linear of every block), and a LoRA saved from the tiny
//! fixture model loads into a fresh one in every layout ComfyUI reads for Qwen-Image and computes what the
//! trained model does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use candle_core::{DType, Device};
use rand::SeedableRng;

use super::testkit::Case;
use super::weights::official_shapes;
use super::{QwenImageConfig, QwenImageTransformer};
use crate::fixtures::ZeroTensors;
use crate::trainable::{attach_model_loras, TrainableModel};
use framesmith_nn::lora::{LoraSet, LoraSpec};
use framesmith_nn::lora_file::LoraFile;
use framesmith_nn::vb::Vb;

fn spec(rank: usize) -> LoraSpec {
    LoraSpec {
        rank,
        alpha: 1.0,
        dtype: DType::F32,
        include_patterns: vec![],
        exclude_patterns: vec![],
        seed: 1,
        kind: Default::default(),
    }
}

/// The LoRA tensors (name → shape) musubi-tuner writes for a Qwen-Image transformer with this state dict: every
/// 2-D weight inside `transformer_blocks.N` (its `Linear`s), under `lora_unet_` and the underscored module path.
fn expected_keys(official: &[(String, Vec<usize>)], rank: usize) -> BTreeMap<String, Vec<usize>> {
    let mut keys = BTreeMap::new();
    for (name, shape) in official {
        let Some(module) = name.strip_suffix(".weight") else {
            continue;
        };
        if !module.starts_with("transformer_blocks.") || shape.len() != 2 {
            continue;
        }
        let key = format!("lora_unet_{}", module.replace('.', "_"));
        keys.insert(format!("{key}.lora_down.weight"), vec![rank, shape[1]]);
        keys.insert(format!("{key}.lora_up.weight"), vec![shape[0], rank]);
        keys.insert(format!("{key}.alpha"), vec![]);
    }
    keys
}

#[test]
fn a_released_size_lora_has_the_keys_and_shapes_of_the_official_state_dict() -> anyhow::Result<()> {
    let cfg = QwenImageConfig::qwen_image();
    let official = official_shapes(&cfg);
    let source = ZeroTensors(official.iter().cloned().collect());
    let vb = Vb::from_source(Arc::new(source), DType::BF16, &Device::Cpu);
    let mut model = QwenImageTransformer::new(&cfg, &vb)?;
    let rank = 2;
    let set = attach_model_loras(&mut model, &spec(rank))?;
    assert_eq!(set.len(), 60 * 14);
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("qwen_image_lora.safetensors");
    set.save(&path, DType::BF16, &HashMap::new())?;
    let written: BTreeMap<String, Vec<usize>> =
        candle_core::safetensors::load(&path, &Device::Cpu)?
            .into_iter()
            .map(|(k, v)| (k, v.dims().to_vec()))
            .collect();
    let want = expected_keys(&official, rank);
    let missing: Vec<_> = want.keys().filter(|k| !written.contains_key(*k)).collect();
    let extra: Vec<_> = written.keys().filter(|k| !want.contains_key(*k)).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "missing {missing:?}, extra {extra:?}"
    );
    assert_eq!(written, want);
    // Read back, every module names its official path.
    let file = LoraFile::load(&path, &Device::Cpu)?;
    assert_eq!(file.modules.len(), set.len());
    for m in &file.modules {
        let p = m.path.as_deref().expect("a Qwen-Image block path");
        assert_eq!(format!("lora_unet_{}", p.replace('.', "_")), m.name);
    }
    Ok(())
}

/// Adapters on every block linear with random `up` (a trained-looking LoRA).
fn attach_trained(model: &mut QwenImageTransformer) -> LoraSet {
    let set = attach_model_loras(model, &spec(3)).unwrap();
    let rng = &mut rand::rngs::StdRng::seed_from_u64(4);
    for (_, lora) in set.iter() {
        let lora = lora.as_lora().unwrap();
        let up = framesmith_nn::init::randn(rng, lora.up.shape(), 0.0, 0.1, &Device::Cpu).unwrap();
        lora.up.set(&up).unwrap();
    }
    set
}

#[test]
fn a_saved_lora_loads_into_a_fresh_model_in_every_layout_comfyui_reads() -> anyhow::Result<()> {
    let case = Case::load("t2i")?;
    let inputs = case.model_inputs()?;
    let mut trained = case.model()?;
    let base = trained.forward(&inputs)?;
    let set = attach_trained(&mut trained);
    assert_eq!(set.len(), 2 * 14);
    let want = trained.forward(&inputs)?;
    let moved = (&want - &base)?.abs()?.max_all()?.to_scalar::<f32>()?;
    assert!(moved > 1e-4, "the LoRA changes the output ({moved})");

    let dir = tempfile::tempdir()?;
    let ours = dir.path().join("ours.safetensors");
    set.save(&ours, DType::F32, &HashMap::new())?;
    let mut paths = vec![ours.clone()];
    // PEFT-style files with the official (diffusers) module names, as ComfyUI reads them for Qwen-Image: under
    // `diffusion_model.`, `transformer.` or nothing, lora_A / lora_B, no alpha (the scale folded into B).
    for (i, prefix) in ["diffusion_model.", "transformer.", ""]
        .into_iter()
        .enumerate()
    {
        let mut tensors = HashMap::new();
        for (path, lora) in set.iter() {
            let lora = lora.as_lora().unwrap();
            let key = format!("{prefix}{path}");
            let down = lora.down.as_tensor().clone();
            tensors.insert(format!("{key}.lora_A.weight"), down);
            let up = (lora.up.as_tensor() * lora.scale())?;
            tensors.insert(format!("{key}.lora_B.weight"), up);
        }
        let path = dir.path().join(format!("peft{i}.safetensors"));
        candle_core::safetensors::save(&tensors, &path)?;
        paths.push(path);
    }
    for path in &paths {
        let mut fresh = case.model()?;
        let file = LoraFile::load(path, &Device::Cpu)?;
        let applied = file.apply(fresh.lora_linears(), 1.0, DType::F32)?;
        assert_eq!(applied, set.len(), "{}", path.display());
        let got = fresh.forward(&inputs)?;
        let diff = (&got - &want)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(diff <= 1e-5, "{}: max difference {diff}", path.display());
    }
    // Bit-identical through our own layout.
    let mut fresh = case.model()?;
    LoraFile::load(&ours, &Device::Cpu)?.apply(fresh.lora_linears(), 1.0, DType::F32)?;
    let got = fresh.forward(&inputs)?;
    assert_eq!(
        got.flatten_all()?.to_vec1::<f32>()?,
        want.flatten_all()?.to_vec1::<f32>()?
    );
    Ok(())
}
