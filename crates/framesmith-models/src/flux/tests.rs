//! FLUX.1's linears and LoRA files together: a LoRA of the real FLUX.1-dev (built without its 24 GB of weights)
//! has exactly the keys and shapes the official state dict implies under sd-scripts' / musubi-tuner's names, and
//! a LoRA saved from the tiny fixture model loads into a fresh one (in our layout, the PEFT-style one and
//! diffusers' module names) and computes what the trained model does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use rand::SeedableRng;

use crate::fixtures::ZeroTensors;
use crate::flux::testkit::Case;
use crate::flux::weights::official_shapes;
use crate::flux::{Flux, FluxConfig, FluxInputs};
use framesmith_nn::lora::{attach_family_loras, LoraFamily, LoraSet, LoraSpec};
use framesmith_nn::lora_file::LoraFile;
use framesmith_nn::vb::Vb;

fn spec(rank: usize, include: &[&str]) -> LoraSpec {
    LoraSpec {
        rank,
        alpha: 1.0,
        dtype: DType::F32,
        include_patterns: include.iter().map(|s| s.to_string()).collect(),
        exclude_patterns: vec![],
        seed: 1,
        kind: Default::default(),
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
    let source = ZeroTensors(official.iter().cloned().collect());
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
        let lora = lora.as_lora().unwrap();
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
        let lora = lora.as_lora().unwrap();
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

/// The diffusers modules an official module's adapter splits into, with their row counts (`h`: model width,
/// `mlp`: MLP width).
fn diffusers_parts(path: &str, h: usize, mlp: usize) -> Vec<(String, usize)> {
    let (block, index, module) = {
        let mut it = path.splitn(3, '.');
        (it.next().unwrap(), it.next().unwrap(), it.next().unwrap())
    };
    let parts: Vec<(&str, usize)> = match (block, module) {
        ("double_blocks", "img_attn.qkv") => {
            vec![("attn.to_q", h), ("attn.to_k", h), ("attn.to_v", h)]
        }
        ("double_blocks", "txt_attn.qkv") => {
            vec![
                ("attn.add_q_proj", h),
                ("attn.add_k_proj", h),
                ("attn.add_v_proj", h),
            ]
        }
        ("double_blocks", "img_attn.proj") => vec![("attn.to_out.0", h)],
        ("double_blocks", "txt_attn.proj") => vec![("attn.to_add_out", h)],
        ("double_blocks", "img_mlp.0") => vec![("ff.net.0.proj", mlp)],
        ("double_blocks", "img_mlp.2") => vec![("ff.net.2", h)],
        ("double_blocks", "txt_mlp.0") => vec![("ff_context.net.0.proj", mlp)],
        ("double_blocks", "txt_mlp.2") => vec![("ff_context.net.2", h)],
        ("double_blocks", "img_mod.lin") => vec![("norm1.linear", 6 * h)],
        ("double_blocks", "txt_mod.lin") => vec![("norm1_context.linear", 6 * h)],
        ("single_blocks", "linear1") => {
            vec![
                ("attn.to_q", h),
                ("attn.to_k", h),
                ("attn.to_v", h),
                ("proj_mlp", mlp),
            ]
        }
        ("single_blocks", "linear2") => vec![("proj_out", h)],
        ("single_blocks", "modulation.lin") => vec![("norm.linear", 3 * h)],
        other => panic!("no diffusers name for {other:?}"),
    };
    let list = if block == "double_blocks" {
        "transformer_blocks"
    } else {
        "single_transformer_blocks"
    };
    parts
        .into_iter()
        .map(|(name, rows)| (format!("{list}.{index}.{name}"), rows))
        .collect()
}

#[test]
fn a_lora_in_diffusers_module_names_fuses_onto_the_official_modules() -> anyhow::Result<()> {
    let case = Case::load("flux_dit")?;
    let inputs = inputs(&case)?;
    let mut trained = tiny_model(&case)?;
    let (h, mlp) = (
        trained.config().hidden_size,
        trained.config().mlp_hidden_dim(),
    );
    let set = attach_trained(&mut trained);
    // A file without the MLP input of single block 1: the fused adapter has zero rows there.
    let left_out = "single_transformer_blocks.1.proj_mlp";
    let mut tensors = HashMap::new();
    for (path, lora) in set.iter() {
        let lora = lora.as_lora().unwrap();
        let mut row = 0;
        for (name, rows) in diffusers_parts(path, h, mlp) {
            let up = (lora.up.as_tensor().narrow(0, row, rows)? * lora.scale())?;
            row += rows;
            if name == left_out {
                continue;
            }
            let key = format!("transformer.{name}");
            tensors.insert(
                format!("{key}.lora_A.weight"),
                lora.down.as_tensor().clone(),
            );
            tensors.insert(format!("{key}.lora_B.weight"), up);
        }
        assert_eq!(row, lora.out_dim(), "{path}");
    }
    let linear1 = set
        .get("single_blocks.1.linear1")
        .and_then(|a| a.as_lora())
        .expect("adapted");
    let up = linear1.up.as_tensor();
    let kept = up.narrow(0, 0, 3 * h)?;
    linear1.up.set(&Tensor::cat(
        &[&kept, &up.narrow(0, 3 * h, mlp)?.zeros_like()?],
        0,
    )?)?;
    let want = trained.forward(&inputs)?;

    let dir = tempfile::tempdir()?;
    let path = dir.path().join("diffusers.safetensors");
    candle_core::safetensors::save(&tensors, &path)?;
    let file = LoraFile::load(&path, &Device::Cpu)?;
    let names: Vec<&str> = file.modules.iter().map(|m| m.name.as_str()).collect();
    let ours: Vec<String> = set
        .iter()
        .map(|(p, _)| format!("lora_unet_{}", p.replace('.', "_")))
        .collect();
    assert_eq!(names, ours);
    let mut fresh = tiny_model(&case)?;
    assert_eq!(file.apply(fresh.linears_mut(), 1.0, DType::F32)?, set.len());
    let got = fresh.forward(&inputs)?;
    let diff = (&got - &want)?.abs()?.max_all()?.to_scalar::<f32>()?;
    assert!(diff <= 1e-5, "max difference {diff}");

    // A diffusers module with no official counterpart is named.
    tensors.insert(
        "transformer.transformer_blocks.0.attn.norm_q.lora_A.weight".into(),
        Tensor::zeros((3, 16), DType::F32, &Device::Cpu)?,
    );
    tensors.insert(
        "transformer.transformer_blocks.0.attn.norm_q.lora_B.weight".into(),
        Tensor::zeros((16, 3), DType::F32, &Device::Cpu)?,
    );
    candle_core::safetensors::save(&tensors, &path)?;
    let err = LoraFile::load(&path, &Device::Cpu).unwrap_err().to_string();
    assert!(
        err.contains("attn.norm_q") && err.contains("no official counterpart"),
        "{err}"
    );
    Ok(())
}
