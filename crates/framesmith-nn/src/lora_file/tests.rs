#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};

use super::*;
use crate::fp8::tests::randn;
use crate::lora::{attach_loras, LoraSet, LoraSpec};

fn tensor(seed: u64, dims: &[usize], scale: f32) -> Tensor {
    let v: Vec<f32> = randn(seed, dims.iter().product())
        .into_iter()
        .map(|x| x * scale)
        .collect();
    Tensor::from_vec(v, dims, &Device::Cpu).unwrap()
}

/// Blocks 0 and 1 with `self_attn.q` [6, 8], `cross_attn.k_img` [6, 8] and `ffn.0` [10, 8].
fn toy_model() -> Vec<(String, Linear)> {
    let mut layers = Vec::new();
    for i in 0..2 {
        for (j, (name, out)) in [("self_attn.q", 6), ("cross_attn.k_img", 6), ("ffn.0", 10)]
            .into_iter()
            .enumerate()
        {
            let w = tensor(200 + 3 * i + j as u64, &[out, 8], 0.3);
            layers.push((format!("blocks.{i}.{name}"), Linear::from_weights(w, None)));
        }
    }
    layers
}

fn as_list(model: &mut [(String, Linear)]) -> Vec<(String, &mut Linear)> {
    model.iter_mut().map(|(p, l)| (p.clone(), l)).collect()
}

/// A trained-looking set: adapters attached with random (non-zero) `up`.
fn trained_set(model: &mut [(String, Linear)], rank: usize, alpha: f64) -> LoraSet {
    let spec = LoraSpec {
        rank,
        alpha,
        dtype: DType::F32,
        include_patterns: vec![],
        exclude_patterns: vec![],
        seed: 3,
        kind: Default::default(),
    };
    let set = attach_loras(as_list(model), &spec).unwrap();
    for (i, (_, lora)) in set.iter().enumerate() {
        let lora = lora.as_lora().unwrap();
        let dims = lora.up.dims().to_vec();
        lora.up.set(&tensor(300 + i as u64, &dims, 0.2)).unwrap();
    }
    set
}

fn bits(t: &Tensor) -> Vec<u32> {
    crate::testing::f32_bits(t).unwrap()
}

fn metadata() -> HashMap<String, String> {
    HashMap::from([
        ("ss_network_dim".to_string(), "4".to_string()),
        ("ss_network_alpha".to_string(), "2.0".to_string()),
        (
            "modelspec.architecture".to_string(),
            "wan2.1-t2v-14b/lora".to_string(),
        ),
        ("framesmith_fp8_scale".to_string(), "block64".to_string()),
    ])
}

#[test]
fn save_then_load_is_bit_identical_with_musubi_keys_and_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.safetensors");
    let mut model = toy_model();
    let set = trained_set(&mut model, 4, 2.0);
    set.save(&path, DType::F32, &metadata()).unwrap();

    let bytes = std::fs::read(&path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut keys: Vec<String> = st.names().into_iter().map(String::from).collect();
    keys.sort();
    let mut want = Vec::new();
    for i in 0..2 {
        for m in ["self_attn_q", "cross_attn_k_img", "ffn_0"] {
            for s in ["alpha", "lora_down.weight", "lora_up.weight"] {
                want.push(format!("lora_unet_blocks_{i}_{m}.{s}"));
            }
        }
    }
    want.sort();
    assert_eq!(keys, want);
    let alpha = st.tensor("lora_unet_blocks_0_ffn_0.alpha").unwrap();
    assert_eq!((alpha.dtype(), alpha.shape()), (StDtype::F32, &[][..]));
    assert_eq!(
        st.tensor("lora_unet_blocks_1_ffn_0.lora_up.weight")
            .unwrap()
            .shape(),
        &[10, 4]
    );

    let file = LoraFile::load(&path, &Device::Cpu).unwrap();
    assert_eq!(file.metadata, metadata());
    assert_eq!(file.modules.len(), 6);
    for (module_path, lora) in set.iter() {
        let lora = lora.as_lora().unwrap();
        let m = file.get(&musubi_name(module_path)).unwrap();
        assert_eq!(m.path.as_deref(), Some(module_path));
        assert_eq!(bits(&m.down), bits(lora.down.as_tensor()));
        assert_eq!(bits(&m.up), bits(lora.up.as_tensor()));
        assert_eq!(m.alpha, 2.0);
    }
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers, vec![std::ffi::OsString::from("out.safetensors")]);
}

#[test]
fn half_precision_saves_keep_alpha_in_f32() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = toy_model();
    let set = trained_set(&mut model, 2, 1.0);
    for (dtype, st_dtype) in [(DType::BF16, StDtype::BF16), (DType::F16, StDtype::F16)] {
        let path = dir.path().join(format!("{dtype:?}.safetensors"));
        set.save(&path, dtype, &HashMap::new()).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(
            st.tensor("lora_unet_blocks_0_self_attn_q.lora_down.weight")
                .unwrap()
                .dtype(),
            st_dtype
        );
        assert_eq!(
            st.tensor("lora_unet_blocks_0_self_attn_q.alpha")
                .unwrap()
                .dtype(),
            StDtype::F32
        );
        let file = LoraFile::load(&path, &Device::Cpu).unwrap();
        let m = file.get("lora_unet_blocks_0_self_attn_q").unwrap();
        let want = set
            .get("blocks.0.self_attn.q")
            .unwrap()
            .as_lora()
            .unwrap()
            .up
            .to_dtype(dtype)
            .unwrap();
        assert_eq!(m.up.dtype(), dtype);
        let diff =
            (m.up.to_dtype(DType::F32).unwrap() - want.to_dtype(DType::F32).unwrap()).unwrap();
        assert_eq!(
            diff.abs()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap(),
            0.0
        );
    }
    let err = set
        .save(
            &dir.path().join("x.safetensors"),
            DType::U8,
            &HashMap::new(),
        )
        .unwrap_err();
    assert!(matches!(err, LoraFileError::SaveDtype(DType::U8)));
}

#[test]
fn non_finite_adapters_are_never_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lora.safetensors");
    std::fs::write(&path, b"previous checkpoint").unwrap();
    let mut model = toy_model();
    let set = trained_set(&mut model, 2, 1.0);
    let lora = set.get("blocks.1.ffn.0").unwrap().as_lora().unwrap();
    let mut up = lora.up.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    up[3] = f32::NAN;
    lora.up
        .set(&Tensor::from_vec(up, (10, 2), &Device::Cpu).unwrap())
        .unwrap();
    let err = set.save(&path, DType::F32, &HashMap::new()).unwrap_err();
    assert!(
        err.to_string()
            .contains("lora_unet_blocks_1_ffn_0.lora_up.weight"),
        "{err}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), b"previous checkpoint");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "a temporary file was left behind"
    );
}

/// Writes `tensors` (name, f32 tensor) as a safetensors file.
fn write_raw(path: &Path, tensors: &[(&str, Tensor)]) {
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(k, t)| {
            let b = t
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            (k.to_string(), t.dims().to_vec(), b)
        })
        .collect();
    let views: Vec<(String, TensorView<'_>)> = data
        .iter()
        .map(|(k, s, b)| {
            (
                k.clone(),
                TensorView::new(StDtype::F32, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// ComfyUI / diffusers-style files (`lora_A` / `lora_B`, prefix optional, no alpha) load and apply with
/// alpha = rank, and the applied layer computes `W x + multiplier · up · down · x`.
#[test]
fn comfy_style_files_apply_with_a_multiplier() {
    let dir = tempfile::tempdir().unwrap();
    let (down, up) = (tensor(1, &[3, 8], 0.3), tensor(2, &[6, 3], 0.3));
    let (down_f, up_f) = (tensor(3, &[3, 8], 0.3), tensor(4, &[10, 3], 0.3));
    for prefix in ["diffusion_model.", ""] {
        let path = dir
            .path()
            .join(format!("comfy{}.safetensors", prefix.len()));
        let q_a = format!("{prefix}blocks.1.self_attn.q.lora_A.weight");
        let q_b = format!("{prefix}blocks.1.self_attn.q.lora_B.weight");
        let f_a = format!("{prefix}blocks.0.ffn.0.lora_A.weight");
        let f_b = format!("{prefix}blocks.0.ffn.0.lora_B.weight");
        let entries = [
            (q_a.as_str(), down.clone()),
            (q_b.as_str(), up.clone()),
            (f_a.as_str(), down_f.clone()),
            (f_b.as_str(), up_f.clone()),
        ];
        write_raw(&path, &entries);
        let file = LoraFile::load(&path, &Device::Cpu).unwrap();
        let names: Vec<&str> = file.modules.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            names,
            ["lora_unet_blocks_0_ffn_0", "lora_unet_blocks_1_self_attn_q"]
        );
        assert_eq!(
            file.modules[1].path.as_deref(),
            Some("blocks.1.self_attn.q")
        );
        assert_eq!(file.modules[1].alpha, 3.0);

        let mut model = toy_model();
        let x = tensor(5, &[2, 8], 1.0);
        let base = model[3].1.forward(&x).unwrap();
        assert_eq!(file.apply(as_list(&mut model), 0.7, DType::F32).unwrap(), 2);
        let got = model[3].1.forward(&x).unwrap();
        let delta = x
            .matmul(&down.t().unwrap())
            .unwrap()
            .matmul(&up.t().unwrap())
            .unwrap();
        let want = (base + (delta * 0.7).unwrap()).unwrap();
        let diff = (got - want)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(diff < 1e-5, "{diff}");
        assert!(model[0].1.lora().is_none() && model[2].1.lora().is_some());
    }
}

#[test]
fn files_for_another_model_are_refused_without_changes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other.safetensors");
    let mut entries = Vec::new();
    let names: Vec<String> = (0..8)
        .map(|i| format!("lora_unet_blocks_{}_self_attn_q", 10 + i))
        .collect();
    for n in &names {
        entries.push((format!("{n}.lora_down.weight"), tensor(6, &[2, 8], 0.1)));
        entries.push((format!("{n}.lora_up.weight"), tensor(7, &[6, 2], 0.1)));
    }
    entries.push((
        "lora_unet_blocks_0_self_attn_q.lora_down.weight".into(),
        tensor(8, &[2, 8], 0.1),
    ));
    entries.push((
        "lora_unet_blocks_0_self_attn_q.lora_up.weight".into(),
        tensor(9, &[6, 2], 0.1),
    ));
    let refs: Vec<(&str, Tensor)> = entries
        .iter()
        .map(|(k, t)| (k.as_str(), t.clone()))
        .collect();
    write_raw(&path, &refs);
    let file = LoraFile::load(&path, &Device::Cpu).unwrap();
    let mut model = toy_model();
    let err = file
        .apply(as_list(&mut model), 1.0, DType::F32)
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with("8 LoRA module(s)") && msg.contains("lora_unet_blocks_10_self_attn_q"),
        "{msg}"
    );
    assert!(
        model.iter().all(|(_, l)| l.lora().is_none()),
        "a failed apply must not change the model"
    );

    let shape_path = dir.path().join("shape.safetensors");
    write_raw(
        &shape_path,
        &[
            (
                "lora_unet_blocks_0_ffn_0.lora_down.weight",
                tensor(10, &[2, 9], 0.1),
            ),
            (
                "lora_unet_blocks_0_ffn_0.lora_up.weight",
                tensor(11, &[10, 2], 0.1),
            ),
        ],
    );
    let err = LoraFile::load(&shape_path, &Device::Cpu).unwrap().apply(
        as_list(&mut model),
        1.0,
        DType::F32,
    );
    let msg = err.unwrap_err().to_string();
    assert!(
        msg.contains("lora_unet_blocks_0_ffn_0") && msg.contains("[2, 9]"),
        "{msg}"
    );
}

#[test]
fn unsupported_and_incomplete_files_name_the_key() {
    let dir = tempfile::tempdir().unwrap();
    // (file name, tensors, what the error must mention)
    type Case<'a> = (&'a str, Vec<(&'a str, Tensor)>, &'a str);
    let cases: [Case; 3] = [
        (
            "dora",
            vec![(
                "lora_unet_blocks_0_ffn_0.dora_scale",
                tensor(1, &[10, 1], 1.0),
            )],
            "DoRA",
        ),
        (
            "model",
            vec![("blocks.0.ffn.0.weight", tensor(1, &[10, 8], 1.0))],
            "not a LoRA tensor",
        ),
        (
            "half",
            vec![(
                "lora_unet_blocks_0_ffn_0.lora_down.weight",
                tensor(1, &[2, 8], 1.0),
            )],
            "lora_up",
        ),
    ];
    for (name, entries, needle) in cases {
        let path = dir.path().join(format!("{name}.safetensors"));
        write_raw(&path, &entries);
        let msg = LoraFile::load(&path, &Device::Cpu).unwrap_err().to_string();
        assert!(
            msg.contains(needle) && msg.ends_with(&path.display().to_string()),
            "{msg}"
        );
    }
    let missing = dir.path().join("missing.safetensors");
    let msg = LoraFile::load(&missing, &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(
        msg.starts_with("cannot read") && msg.ends_with("missing.safetensors"),
        "{msg}"
    );
}

#[test]
fn load_weights_restores_a_set_for_resume() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("step.safetensors");
    let mut model = toy_model();
    let saved = trained_set(&mut model, 4, 2.0);
    saved.save(&path, DType::F32, &HashMap::new()).unwrap();
    let x = tensor(12, &[2, 8], 1.0);
    let want = model[5].1.forward(&x).unwrap();

    let mut fresh = toy_model();
    let set = attach_loras(
        as_list(&mut fresh),
        &LoraSpec {
            rank: 4,
            alpha: 2.0,
            dtype: DType::F32,
            include_patterns: vec![],
            exclude_patterns: vec![],
            seed: 99,
            kind: Default::default(),
        },
    )
    .unwrap();
    let file = LoraFile::load(&path, &Device::Cpu).unwrap();
    set.load_weights(&file).unwrap();
    let got = fresh[5].1.forward(&x).unwrap();
    assert_eq!(
        bits(&got),
        bits(&want),
        "the layer shares the restored variables"
    );

    let mut other = toy_model();
    let wrong_rank = attach_loras(
        as_list(&mut other),
        &LoraSpec {
            rank: 2,
            alpha: 2.0,
            dtype: DType::F32,
            include_patterns: vec![],
            exclude_patterns: vec![],
            seed: 1,
            kind: Default::default(),
        },
    )
    .unwrap();
    assert!(matches!(
        wrong_rank.load_weights(&file),
        Err(LoraFileError::ShapeMismatch { .. })
    ));
}

#[test]
fn musubi_names_map_back_to_wan_flux_and_qwen_image_paths() {
    assert_eq!(musubi_name("blocks.0.ffn.0"), "lora_unet_blocks_0_ffn_0");
    let cases = [
        (
            "blocks_12_cross_attn_v_img",
            Some("blocks.12.cross_attn.v_img"),
        ),
        ("blocks_3_ffn_2", Some("blocks.3.ffn.2")),
        (
            "double_blocks_0_img_mlp_0",
            Some("double_blocks.0.img_mlp.0"),
        ),
        (
            "double_blocks_18_txt_attn_qkv",
            Some("double_blocks.18.txt_attn.qkv"),
        ),
        (
            "double_blocks_2_txt_mod_lin",
            Some("double_blocks.2.txt_mod.lin"),
        ),
        ("single_blocks_37_linear1", Some("single_blocks.37.linear1")),
        (
            "single_blocks_5_modulation_lin",
            Some("single_blocks.5.modulation.lin"),
        ),
        (
            "transformer_blocks_59_img_mlp_net_0_proj",
            Some("transformer_blocks.59.img_mlp.net.0.proj"),
        ),
        (
            "transformer_blocks_0_attn_to_out_0",
            Some("transformer_blocks.0.attn.to_out.0"),
        ),
        (
            "transformer_blocks_3_txt_mod_1",
            Some("transformer_blocks.3.txt_mod.1"),
        ),
        ("transformer_blocks_3_attn_norm_q", None),
        ("text_embedding_0", None),
        ("blocks_x_ffn_0", None),
        ("single_blocks_0_img_attn_qkv", None),
        ("double_blocks_1_linear1", None),
    ];
    for (underscored, path) in cases {
        assert_eq!(block_path(underscored).as_deref(), path, "{underscored}");
        if let Some(path) = path {
            assert_eq!(musubi_name(path), format!("lora_unet_{underscored}"));
        }
    }
    // SimpleTuner's LyCORIS-style names, which ComfyUI reads for Qwen-Image, are musubi-tuner's.
    let (name, path) = normalize_module("lycoris_transformer_blocks_0_attn_to_q");
    assert_eq!(name, "lora_unet_transformer_blocks_0_attn_to_q");
    assert_eq!(path.as_deref(), Some("transformer_blocks.0.attn.to_q"));
    assert!(!is_dotted("lycoris_transformer_blocks_0_attn_to_q"));
    assert!(is_dotted("diffusion_model.transformer_blocks.0.attn.to_q"));
}

/// Two saves of the same adapters and metadata give the same bytes, the metadata keys in sorted order, whatever
/// order the map iterates in (the safetensors crate writes its map's order, different in each process).
#[test]
fn identical_saves_give_identical_bytes_with_sorted_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = toy_model();
    let set = trained_set(&mut model, 4, 2.0);
    let keys: Vec<String> = (0..40).map(|i| format!("ss_key_{i:02}")).collect();
    let forward: HashMap<String, String> = keys.iter().map(|k| (k.clone(), k.clone())).collect();
    let backward: HashMap<String, String> =
        keys.iter().rev().map(|k| (k.clone(), k.clone())).collect();
    let (a, b) = (
        dir.path().join("a.safetensors"),
        dir.path().join("b.safetensors"),
    );
    set.save(&a, DType::BF16, &forward).unwrap();
    set.save(&b, DType::BF16, &backward).unwrap();
    let bytes = std::fs::read(&a).unwrap();
    assert_eq!(bytes, std::fs::read(&b).unwrap());

    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    assert_eq!(header_len % 8, 0);
    let header = std::str::from_utf8(&bytes[8..8 + header_len]).unwrap();
    let positions: Vec<usize> = keys
        .iter()
        .map(|k| header.find(&format!("\"{k}\"")).unwrap())
        .collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{header}");

    let st = SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.names().len(), 18);
    let file = LoraFile::load(&a, &Device::Cpu).unwrap();
    assert_eq!(file.metadata, forward);
    set.save(&a, DType::F32, &HashMap::new()).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&std::fs::read(&a).unwrap()).unwrap();
    assert!(meta.metadata().is_none());
}

#[test]
fn a_file_holding_nan_is_refused_naming_the_tensor_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("init.safetensors");
    let mut up = tensor(5, &[6, 2], 1.0)
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    up[7] = f32::INFINITY;
    write_raw(
        &path,
        &[
            (
                "lora_unet_blocks_0_self_attn_q.lora_down.weight",
                tensor(4, &[2, 8], 1.0),
            ),
            (
                "lora_unet_blocks_0_self_attn_q.lora_up.weight",
                Tensor::from_vec(up, (6, 2), &Device::Cpu).unwrap(),
            ),
        ],
    );
    let file = LoraFile::load(&path, &Device::Cpu).unwrap();
    let err = file.check_finite(&path).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "LoRA tensor `lora_unet_blocks_0_self_attn_q.lora_up.weight` in the file holds NaN or infinite \
             values: {}",
            path.display()
        )
    );
}
