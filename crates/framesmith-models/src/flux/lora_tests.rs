//! FLUX.1's linears and LoRA files together: a LoRA of the real FLUX.1-dev (built without its 24 GB of weights)
//! has exactly the keys and shapes the official state dict implies under sd-scripts' / musubi-tuner's names, and
//! a LoRA saved from the tiny fixture model loads into a fresh one (in our layout and the PEFT-style one) and
//! computes what the trained model does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use candle_core::{DType, Device, Result, Shape, Tensor};
use rand::SeedableRng;

use crate::flux::testkit::Case;
use crate::flux::weights::official_shapes;
use crate::flux::{Flux, FluxConfig, FluxInputs};
use framesmith_nn::lora::{attach_family_loras, LoraFamily, LoraSet, LoraSpec};
use framesmith_nn::lora_file::LoraFile;
use framesmith_nn::vb::{TensorSource, Vb};

/// The official tensors of a config as broadcast zeros: every shape is right, nothing is allocated.
struct Zeros(HashMap<String, Vec<usize>>);

impl TensorSource for Zeros {
    fn contains(&self, key: &str) -> bool {
        self.0.contains_key(key)
    }

    fn read(&self, key: &str) -> Result<Option<Tensor>> {
        let Some(shape) = self.0.get(key) else {
            return Ok(None);
        };
        let zero = Tensor::zeros((), DType::BF16, &Device::Cpu)?;
        zero.broadcast_as(Shape::from(shape.clone())).map(Some)
    }
}

fn spec(rank: usize, include: &[&str]) -> LoraSpec {
    LoraSpec {
        rank,
        alpha: 1.0,
        dtype: DType::F32,
        include_patterns: include.iter().map(|s| s.to_string()).collect(),
        exclude_patterns: vec![],
        seed: 1,
    }
}

/// The LoRA tensors (name → shape) sd-scripts / musubi-tuner write for a FLUX.1 DiT with this state dict: every
/// 2-D weight inside `double_blocks.N` / `single_blocks.N`, modulation linears only when `modulation`.
fn expected_keys(
    official: &[(String, Vec<usize>)],
    rank: usize,
    modulation: bool,
) -> BTreeMap<String, Vec<usize>> {
    let mut keys = BTreeMap::new();
    for (name, shape) in official {
        let Some(module) = name.strip_suffix(".weight") else {
            continue;
        };
        let in_block = module.starts_with("double_blocks.") || module.starts_with("single_blocks.");
        let is_mod = module.ends_with("_mod.lin") || module.ends_with("modulation.lin");
        if !in_block || shape.len() != 2 || (is_mod && !modulation) {
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
fn a_dev_lora_has_the_keys_and_shapes_of_the_official_state_dict() -> anyhow::Result<()> {
    let cfg = FluxConfig::dev();
    let official = official_shapes(&cfg);
    let source = Zeros(official.iter().cloned().collect());
    let vb = Vb::from_source(Arc::new(source), DType::BF16, &Device::Cpu);
    let mut model = Flux::new(&cfg, &vb)?;
    let dir = tempfile::tempdir()?;
    let rank = 2;
    for (include, modulation, modules) in [
        (&[][..], false, 19 * 8 + 38 * 2),
        (&[r".*mod(ulation)?\.lin"][..], true, 19 * 10 + 38 * 3),
    ] {
        let set = attach_family_loras(model.linears_mut(), &spec(rank, include), LoraFamily::Flux)?;
        assert_eq!(set.len(), modules);
        let path = dir.path().join("dev.safetensors");
        set.save(&path, DType::BF16, &HashMap::new())?;
        let written: BTreeMap<String, Vec<usize>> =
            candle_core::safetensors::load(&path, &Device::Cpu)?
                .into_iter()
                .map(|(k, v)| (k, v.dims().to_vec()))
                .collect();
        let want = expected_keys(&official, rank, modulation);
        let missing: Vec<_> = want.keys().filter(|k| !written.contains_key(*k)).collect();
        let extra: Vec<_> = written.keys().filter(|k| !want.contains_key(*k)).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "missing {missing:?}, extra {extra:?}"
        );
        assert_eq!(written, want);
        // Read back, every module names its official path.
        let file = LoraFile::load(&path, &Device::Cpu)?;
        assert_eq!(file.modules.len(), modules);
        for m in &file.modules {
            let p = m.path.as_deref().expect("a FLUX block path");
            assert_eq!(format!("lora_unet_{}", p.replace('.', "_")), m.name);
        }
    }
    Ok(())
}

fn tiny_model(case: &Case) -> anyhow::Result<Flux> {
    let cfg = FluxConfig::from_json(&case.config["init"].to_string())?;
    let vb = Vb::from_tensors(case.weights.clone(), DType::F32, &Device::Cpu);
    Ok(Flux::new(&cfg, &vb)?)
}

fn inputs(case: &Case) -> anyhow::Result<FluxInputs> {
    Ok(FluxInputs {
        img: case.input("img")?.clone(),
        img_ids: case.input("img_ids")?.clone(),
        txt: case.input("txt")?.clone(),
        txt_ids: case.input("txt_ids")?.clone(),
        timesteps: case.input("timesteps")?.clone(),
        y: case.input("y")?.clone(),
        guidance: case.inputs.get("guidance").cloned(),
    })
}

/// Adapters on every block linear with random `up` (a trained-looking LoRA).
fn attach_trained(model: &mut Flux) -> LoraSet {
    let set = attach_family_loras(
        model.linears_mut(),
        &spec(3, &[r".*mod(ulation)?\.lin"]),
        LoraFamily::Flux,
    )
    .unwrap();
    let rng = &mut rand::rngs::StdRng::seed_from_u64(4);
    for (_, lora) in set.iter() {
        let up = framesmith_nn::init::randn(rng, lora.up.shape(), 0.0, 0.1, &Device::Cpu).unwrap();
        lora.up.set(&up).unwrap();
    }
    set
}

#[test]
fn a_saved_flux_lora_loads_into_a_fresh_model_in_either_layout() -> anyhow::Result<()> {
    let case = Case::load("flux_dit")?;
    let inputs = inputs(&case)?;
    let mut trained = tiny_model(&case)?;
    let base = trained.forward(&inputs)?;
    let set = attach_trained(&mut trained);
    let want = trained.forward(&inputs)?;
    let moved = (&want - &base)?.abs()?.max_all()?.to_scalar::<f32>()?;
    assert!(moved > 1e-4, "the LoRA changes the output ({moved})");

    let dir = tempfile::tempdir()?;
    let ours = dir.path().join("ours.safetensors");
    set.save(&ours, DType::F32, &HashMap::new())?;
    // The PEFT-style layout: official module names, `transformer.` prefix, lora_A / lora_B, no alpha (scale 1, so
    // the rank-3 adapters of alpha 1 get their scale folded into B).
    let peft = dir.path().join("peft.safetensors");
    let mut tensors = HashMap::new();
    for (path, lora) in set.iter() {
        let key = format!("transformer.{path}");
        tensors.insert(
            format!("{key}.lora_A.weight"),
            lora.down.as_tensor().clone(),
        );
        let up = (lora.up.as_tensor() * lora.scale())?;
        tensors.insert(format!("{key}.lora_B.weight"), up);
    }
    candle_core::safetensors::save(&tensors, &peft)?;

    for path in [&ours, &peft] {
        let mut fresh = tiny_model(&case)?;
        let file = LoraFile::load(path, &Device::Cpu)?;
        let applied = file.apply(fresh.linears_mut(), 1.0, DType::F32)?;
        assert_eq!(applied, set.len());
        let got = fresh.forward(&inputs)?;
        let diff = (&got - &want)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(diff <= 1e-5, "{}: max difference {diff}", path.display());
    }
    // Bit-identical through our own layout.
    let mut fresh = tiny_model(&case)?;
    LoraFile::load(&ours, &Device::Cpu)?.apply(fresh.linears_mut(), 1.0, DType::F32)?;
    let got = fresh.forward(&inputs)?;
    assert_eq!(
        got.flatten_all()?.to_vec1::<f32>()?,
        want.flatten_all()?.to_vec1::<f32>()?
    );
    Ok(())
}
