//! `merge` on the tiny Wan model (a bf16 base file: the merged model computes what the base with the adapter
//! applied does, within bf16 rounding, for every kind), on FP8 weights (ComfyUI's scalar scale, per-row bf16
//! scales, no scale) and its refusals.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use framesmith_nn::adapter::AdapterKind;
use framesmith_nn::fp8::{self, Fp8Scale, Fp8Weight};
use framesmith_nn::lora::{attach_loras, LoraSpec};
use framesmith_nn::lora_file::LoraFile;
use framesmith_nn::testing::rel;
use framesmith_nn::vb::Vb;

use super::{randn, write_safetensors, RawEntry};
use crate::lora_tools::{merge, MergeInput};
use crate::wan::random::{random_inputs, random_weights};
use crate::wan::{WanConfig, WanModel};

const KINDS: [AdapterKind; 4] = [
    AdapterKind::Lora,
    AdapterKind::Lokr {
        factor: -1,
        decompose_both: false,
        full_matrix: false,
    },
    AdapterKind::Loha,
    AdapterKind::Dora,
];

fn model(weights: HashMap<String, Tensor>, cfg: &WanConfig) -> WanModel {
    let vb = Vb::from_tensors(weights, DType::F32, &Device::Cpu);
    WanModel::new(cfg, vb, &Default::default()).unwrap()
}

/// A trained-looking adapter file of `kind` for the tiny model, written to `path`.
fn write_adapter(cfg: &WanConfig, kind: AdapterKind, seed: u64, path: &Path) {
    let mut m = model(
        random_weights(cfg, 5, DType::F32, &Device::Cpu).unwrap(),
        cfg,
    );
    let spec = LoraSpec {
        rank: 4,
        alpha: 2.0,
        dtype: DType::F32,
        include_patterns: vec![],
        exclude_patterns: vec![],
        seed,
        kind,
    };
    let set = attach_loras(m.linears_mut(), &spec).unwrap();
    for (i, (_, adapter)) in set.iter().enumerate() {
        for (name, var) in adapter.named_vars() {
            let noise = randn(seed * 1000 + i as u64, var.dims(), 0.3);
            let value = if name == "dora_scale" {
                (var.as_tensor() * (noise + 1.0).unwrap()).unwrap()
            } else {
                noise
            };
            var.set(&value).unwrap();
        }
    }
    set.save(path, DType::F32, &HashMap::new()).unwrap();
}

/// `merge` then a forward equals a forward with the adapter applied at the same strength, within the bf16
/// rounding of the merged weights, for every kind (and the adapter does change the output).
#[test]
fn the_merged_model_computes_what_the_adapted_one_does_for_every_kind() {
    let cfg = WanConfig::tiny(2);
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.safetensors");
    let bf16: HashMap<String, Tensor> = random_weights(&cfg, 5, DType::F32, &Device::Cpu)
        .unwrap()
        .into_iter()
        .map(|(k, v)| (k, v.to_dtype(DType::BF16).unwrap()))
        .collect();
    candle_core::safetensors::save(&bf16, &base).unwrap();
    let inputs = random_inputs(&cfg, &[[2, 4, 4]], 3, &Device::Cpu).unwrap();
    let load = |p: &Path| candle_core::safetensors::load(p, &Device::Cpu).unwrap();
    let plain = model(load(&base), &cfg).forward_untracked(&inputs).unwrap();
    for (i, kind) in KINDS.into_iter().enumerate() {
        let lora = dir.path().join(format!("{}.safetensors", kind.name()));
        write_adapter(&cfg, kind, 11 + i as u64, &lora);
        let out = dir
            .path()
            .join(format!("merged-{}.safetensors", kind.name()));
        let report = merge(
            &base,
            &out,
            &[MergeInput {
                path: lora.clone(),
                strength: 0.7,
            }],
        )
        .unwrap();
        assert_eq!(report.modules_per_file, [20], "{kind:?}");
        let merged = model(load(&out), &cfg).forward_untracked(&inputs).unwrap();
        let mut adapted = model(load(&base), &cfg);
        let file = LoraFile::load(&lora, &Device::Cpu).unwrap();
        file.apply(adapted.linears_mut(), 0.7, DType::F32).unwrap();
        let want = adapted.forward_untracked(&inputs).unwrap();
        let err = rel(&merged[0], &want[0]).unwrap();
        let effect = rel(&plain[0], &want[0]).unwrap();
        assert!(err < 1e-2, "{kind:?}: merged differs by {err}");
        assert!(
            effect > 10.0 * err,
            "{kind:?}: the adapter changes the output by only {effect}"
        );
    }
}

fn fp8_entries(w: &Tensor, name: &str, scale: Option<(Fp8Scale, DType)>) -> Vec<RawEntry> {
    let Some((mode, dtype)) = scale else {
        let codes: Vec<u8> = w
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .map(|v| fp8::e4m3_encode(*v))
            .collect();
        return vec![(
            format!("{name}.weight"),
            "F8_E4M3",
            w.dims().to_vec(),
            codes,
        )];
    };
    let q = fp8::quantize(w, mode).unwrap();
    let codes = q.codes().flatten_all().unwrap().to_vec1::<u8>().unwrap();
    let s = q.scale().to_dtype(dtype).unwrap();
    let st = if dtype == DType::BF16 { "BF16" } else { "F32" };
    let shape = if mode == Fp8Scale::Tensor {
        vec![]
    } else {
        s.dims().to_vec()
    };
    vec![
        (
            format!("{name}.weight"),
            "F8_E4M3",
            w.dims().to_vec(),
            codes,
        ),
        (
            format!("{name}.scale_weight"),
            st,
            shape,
            framesmith_nn::bytes::tensor_bytes(&s).unwrap(),
        ),
    ]
}

fn read_fp8(path: &Path, name: &str) -> Tensor {
    let tensors = candle_core::safetensors::load(path, &Device::Cpu).unwrap();
    let codes = &tensors[&format!("{name}.weight")];
    let scale = tensors.get(&format!("{name}.scale_weight"));
    Fp8Weight::from_checkpoint(codes, scale)
        .unwrap()
        .dequantize(DType::F32)
        .unwrap()
}

/// A base file of three FP8 attention weights (ComfyUI's scalar f32 scale, per-row bf16 scales, no scale), an
/// f32 bias and ComfyUI's `scaled_fp8` marker.
fn write_fp8_base(dir: &Path) -> PathBuf {
    let (w_q, w_k, w_v) = (
        randn(1, &[64, 64], 0.2),
        randn(2, &[64, 64], 0.2),
        randn(3, &[64, 64], 0.2),
    );
    let mut entries = fp8_entries(
        &w_q,
        "model.diffusion_model.blocks.0.self_attn.q",
        Some((Fp8Scale::Tensor, DType::F32)),
    );
    entries.extend(fp8_entries(
        &w_k,
        "model.diffusion_model.blocks.0.self_attn.k",
        Some((Fp8Scale::Channel, DType::BF16)),
    ));
    entries.extend(fp8_entries(
        &w_v,
        "model.diffusion_model.blocks.0.self_attn.v",
        None,
    ));
    let bias = randn(4, &[64], 1.0);
    entries.push((
        "model.diffusion_model.blocks.0.self_attn.q.bias".into(),
        "F32",
        vec![64],
        framesmith_nn::bytes::tensor_bytes(&bias).unwrap(),
    ));
    entries.push((
        "model.diffusion_model.scaled_fp8".into(),
        "F8_E4M3",
        vec![0],
        vec![],
    ));
    let base = dir.join("fp8.safetensors");
    write_safetensors(&base, &entries, &[("note", "kept")]);
    base
}

/// A rank-4 LoRA (alpha 2) on q, k and v written to `dir`, and each module's weight change.
fn write_qkv_lora(dir: &Path) -> (PathBuf, HashMap<&'static str, Tensor>) {
    let mut lora = framesmith_nn::lora_file::RawTensors::default();
    let mut deltas = HashMap::new();
    for (i, m) in ["q", "k", "v"].iter().enumerate() {
        let name = format!("lora_unet_blocks_0_self_attn_{m}");
        let (down, up) = (
            randn(10 + i as u64, &[4, 64], 0.3),
            randn(20 + i as u64, &[64, 4], 0.3),
        );
        deltas.insert(*m, (up.matmul(&down).unwrap() * 0.5).unwrap());
        lora.tensors
            .push((format!("{name}.lora_down.weight"), down));
        lora.tensors.push((format!("{name}.lora_up.weight"), up));
        lora.tensors.push((
            format!("{name}.alpha"),
            Tensor::new(2f32, &Device::Cpu).unwrap(),
        ));
    }
    let lora_path = dir.join("lora.safetensors");
    lora.write(&lora_path).unwrap();
    (lora_path, deltas)
}

/// FP8 weights are dequantised, merged and quantised again in the file's own layout: ComfyUI's scalar f32
/// `scale_weight` gives exactly what quantising the merged weight per tensor gives; per-row bf16 scales and
/// scale-less weights stay within FP8 rounding of the merged values; the header and every other tensor are
/// copied byte for byte.
#[test]
fn fp8_weights_are_merged_and_quantised_again_in_their_own_layout() {
    let dir = tempfile::tempdir().unwrap();
    let base = write_fp8_base(dir.path());
    let (lora_path, deltas) = write_qkv_lora(dir.path());
    let out = dir.path().join("merged.safetensors");
    let report = merge(
        &base,
        &out,
        &[MergeInput {
            path: lora_path,
            strength: 1.0,
        }],
    )
    .unwrap();
    assert_eq!((report.weights, report.fp8_weights), (3, 3));
    let (before, after) = (std::fs::read(&base).unwrap(), std::fs::read(&out).unwrap());
    let header = 8 + u64::from_le_bytes(before[..8].try_into().unwrap()) as usize;
    assert_eq!(before[..header], after[..header], "the header is copied");
    let bias_at = |p: &Path| {
        let t = candle_core::safetensors::load(p, &Device::Cpu).unwrap();
        framesmith_nn::testing::f32_bits(&t["model.diffusion_model.blocks.0.self_attn.q.bias"])
            .unwrap()
    };
    assert_eq!(bias_at(&base), bias_at(&out));
    for (m, tolerance) in [("q", 0.0f64), ("k", 0.07), ("v", 0.07)] {
        let name = format!("model.diffusion_model.blocks.0.self_attn.{m}");
        let dequantised_base = read_fp8(&base, &name);
        let want = (dequantised_base + &deltas[m]).unwrap();
        let got = read_fp8(&out, &name);
        let err = if tolerance == 0.0 {
            let requantised = fp8::quantize(&want, Fp8Scale::Tensor)
                .unwrap()
                .dequantize(DType::F32)
                .unwrap();
            rel(&got, &requantised).unwrap()
        } else {
            rel(&got, &want).unwrap()
        };
        assert!(err <= tolerance, "{m}: {err}");
        let change = rel(&got, &read_fp8(&base, &name)).unwrap();
        assert!(change > 0.1, "{m} changed by only {change}");
    }
}

/// The output is never the base; an adapter for another model names its modules and the base file; a missing
/// adapter file is named.
#[test]
fn merge_refuses_the_base_as_output_foreign_adapters_and_missing_files() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = WanConfig::tiny(1);
    let base = dir.path().join("base.safetensors");
    candle_core::safetensors::save(
        &random_weights(&cfg, 5, DType::BF16, &Device::Cpu).unwrap(),
        &base,
    )
    .unwrap();
    let lora = dir.path().join("flux-lora.safetensors");
    let mut flux = framesmith_nn::lora_file::RawTensors::default();
    flux.tensors.push((
        "lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight".into(),
        randn(1, &[2, 64], 1.0),
    ));
    flux.tensors.push((
        "lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight".into(),
        randn(2, &[192, 2], 1.0),
    ));
    flux.write(&lora).unwrap();
    let input = |p: &PathBuf| {
        vec![MergeInput {
            path: p.clone(),
            strength: 1.0,
        }]
    };
    let err = |r: anyhow::Result<crate::lora_tools::MergeReport>| format!("{:#}", r.err().unwrap());
    let same = err(merge(&base, &base, &input(&lora)));
    assert!(
        same.contains("never overwrites") && same.ends_with("base.safetensors"),
        "{same}"
    );
    let out = dir.path().join("out.safetensors");
    let foreign = err(merge(&base, &out, &input(&lora)));
    assert!(
        foreign.contains("lora_unet_double_blocks_0_img_attn_qkv")
            && foreign.contains("another model"),
        "{foreign}"
    );
    assert!(foreign.ends_with("base.safetensors"), "{foreign}");
    assert!(
        !out.exists(),
        "nothing is written when the merge is refused"
    );
    let missing = dir.path().join("missing.safetensors");
    let gone = err(merge(&base, &out, &input(&missing)));
    assert!(gone.contains("missing.safetensors"), "{gone}");
}
