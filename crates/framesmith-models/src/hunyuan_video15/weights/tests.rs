//! What `identify` says of HunyuanVideo files and how `load_dit` reads them: the 1.5 fixture written in every
//! layout users have (official single file and release folder, ComfyUI with stacked q / k / v bare or prefixed,
//! ComfyUI FP8 with scales, a sharded diffusers folder) runs as the reference; 1.0 files are named with what to
//! download instead and refused; damaged files and other models say so.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use super::super::testkit::Case;
use super::*;
use crate::checkpoint::SCALED_FP8_MARKER;
use crate::fixtures::assert_close;
use framesmith_nn::fp8::{e4m3_decode, e4m3_encode, Fp8Scale};
use framesmith_nn::linear::BaseWeight;

fn save(dir: &Path, name: &str, tensors: &HashMap<String, Tensor>) -> anyhow::Result<PathBuf> {
    let path = dir.join(name);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    candle_core::safetensors::save(tensors, &path)?;
    Ok(path)
}

/// The official tensors in ComfyUI's layout: each double block's q, k, v stacked, names under `prefix`.
fn comfy(
    official: &HashMap<String, Tensor>,
    prefix: &str,
) -> anyhow::Result<HashMap<String, Tensor>> {
    let mut out = HashMap::new();
    for (k, v) in official {
        let stacked = ["_attn_q.", "_attn_k.", "_attn_v."]
            .iter()
            .any(|p| k.contains(p));
        if !stacked || !k.starts_with("double_blocks.") {
            out.insert(format!("{prefix}{k}"), v.clone());
        } else if k.contains("_attn_q.") {
            let parts: Vec<&Tensor> = ["_attn_q.", "_attn_k.", "_attn_v."]
                .iter()
                .map(|p| {
                    official
                        .get(&k.replace("_attn_q.", p))
                        .ok_or_else(|| anyhow::anyhow!("no {k}"))
                })
                .collect::<anyhow::Result<_>>()?;
            out.insert(
                format!("{prefix}{}", k.replace("_attn_q.", "_attn_qkv.")),
                Tensor::cat(&parts, 0)?,
            );
        }
    }
    Ok(out)
}

fn run(path: &Path, fp8: Option<Fp8Scale>, case: &Case) -> anyhow::Result<Tensor> {
    let model = load_dit(path, DType::F32, &Device::Cpu, fp8)?;
    Ok(model.forward(&case.model_inputs()?)?)
}

#[test]
fn official_and_comfyui_files_load_as_the_fixture() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let case = Case::load("i2v")?;
    let want = case.expected("out")?;
    let bare = save(dir.path(), "official.safetensors", &case.weights)?;
    let release = dir.path().join("HunyuanVideo-1.5");
    save(
        &release,
        "transformer/480p_i2v/diffusion_pytorch_model.safetensors",
        &case.weights,
    )?;
    let release = release.join("transformer/480p_i2v");
    std::fs::write(
        release.join("config.json"),
        r#"{"_class_name": "HunyuanVideo_1_5_DiffusionTransformer"}"#,
    )?;
    let stacked = save(
        dir.path(),
        "stacked.safetensors",
        &comfy(&case.weights, "")?,
    )?;
    let prefixed = comfy(&case.weights, "model.diffusion_model.")?;
    let prefixed = save(
        dir.path(),
        "hunyuanvideo1.5_i2v_fp32.safetensors",
        &prefixed,
    )?;
    let layouts = [
        (&bare, KeyLayout::Official),
        (&release, KeyLayout::Official),
        (&stacked, KeyLayout::ComfyUi),
        (&prefixed, KeyLayout::ComfyUi),
    ];
    for (path, keys) in layouts {
        let file = identify(path)?;
        assert_eq!(
            (file.version, file.keys),
            (Version::V15, keys),
            "{}",
            path.display()
        );
        assert_eq!(
            file.config.as_ref(),
            Some(&case.model_config()?),
            "{}",
            path.display()
        );
        assert_close("out", &run(path, None, &case)?, want, 1e-4, 1e-4)?;
    }
    let report = crate::identify::identify(&prefixed)?.to_string();
    assert!(
        report.contains("HunyuanVideo 1.5") && report.contains("model.diffusion_model."),
        "{report}"
    );
    Ok(())
}

#[test]
fn a_sharded_diffusers_folder_loads_as_the_fixture() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let case = Case::load("t2v")?;
    let folder = dir.path().join("HunyuanVideo-1.5-Diffusers/transformer");
    let (blocks, rest): (HashMap<_, _>, HashMap<_, _>) = case
        .weights
        .clone()
        .into_iter()
        .partition(|(k, _)| k.starts_with("transformer_blocks."));
    save(
        &folder,
        "diffusion_pytorch_model-00001-of-00002.safetensors",
        &blocks,
    )?;
    save(
        &folder,
        "diffusion_pytorch_model-00002-of-00002.safetensors",
        &rest,
    )?;
    let mut config = case.config["init"].clone();
    config["_class_name"] = DIFFUSERS_CLASS.into();
    std::fs::write(folder.join("config.json"), config.to_string())?;
    let root = dir.path().join("HunyuanVideo-1.5-Diffusers");
    let file = identify(&root)?;
    assert_eq!(
        (file.version, file.keys),
        (Version::V15, KeyLayout::Diffusers)
    );
    assert_eq!(file.container, Container::Folder { shards: 2 });
    assert_eq!(file.config.as_ref(), Some(&case.model_config()?));
    assert_close(
        "out",
        &run(&root, None, &case)?,
        case.expected("out")?,
        1e-4,
        1e-4,
    )?;
    // A lone shard names what is missing.
    let shard = folder.join("diffusion_pytorch_model-00002-of-00002.safetensors");
    let err = identify(&shard)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("one shard"), "{err}");
    Ok(())
}

/// ComfyUI's `scaled_fp8` form of `tensors`: every 2-D block weight as e4m3 codes with a per-tensor
/// `scale_weight`, and the same tensors dequantised by hand.
fn scaled_fp8(tensors: &HashMap<String, Tensor>) -> anyhow::Result<[HashMap<String, Tensor>; 2]> {
    let (mut fp8, mut reference) = (tensors.clone(), tensors.clone());
    for (k, v) in tensors {
        if !k.contains("double_blocks.") || v.rank() != 2 || !k.ends_with(".weight") {
            continue;
        }
        let values = v.flatten_all()?.to_vec1::<f32>()?;
        let scale = values.iter().fold(0f32, |m, x| m.max(x.abs())) / 448.0;
        let codes: Vec<u8> = values.iter().map(|x| e4m3_encode(x / scale)).collect();
        let back: Vec<f32> = codes.iter().map(|&c| e4m3_decode(c) * scale).collect();
        fp8.insert(
            k.clone(),
            Tensor::from_raw_buffer(&codes, DType::F8E4M3, v.dims(), &Device::Cpu)?,
        );
        let module = k.trim_end_matches(".weight");
        fp8.insert(
            format!("{module}.scale_weight"),
            Tensor::new(scale, &Device::Cpu)?,
        );
        reference.insert(k.clone(), Tensor::from_vec(back, v.dims(), &Device::Cpu)?);
    }
    let marker = Tensor::from_raw_buffer(&[0u8], DType::F8E4M3, &[1], &Device::Cpu)?;
    fp8.insert(format!("model.diffusion_model.{SCALED_FP8_MARKER}"), marker);
    Ok([fp8, reference])
}

#[test]
fn a_comfyui_fp8_file_runs_as_its_dequantised_weights_and_stays_fp8() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let case = Case::load("i2v")?;
    let [fp8, reference] = scaled_fp8(&comfy(&case.weights, "model.diffusion_model.")?)?;
    let fp8_path = save(
        dir.path(),
        "hunyuanvideo1.5_i2v_fp8_scaled.safetensors",
        &fp8,
    )?;
    let ref_path = save(dir.path(), "reference.safetensors", &reference)?;
    let file = identify(&fp8_path)?;
    assert!(
        file.scaled_fp8 && file.to_string().contains("float8_e4m3fn"),
        "{file}"
    );
    let want = run(&ref_path, None, &case)?;
    assert_close(
        "dequantised",
        &run(&fp8_path, None, &case)?,
        &want,
        1e-5,
        1e-5,
    )?;
    let kept = Some(Fp8Scale::Tensor);
    assert_close(
        "kept in fp8",
        &run(&fp8_path, kept, &case)?,
        &want,
        1e-4,
        1e-4,
    )?;
    let mut model = load_dit(&fp8_path, DType::F32, &Device::Cpu, kept)?;
    for (path, linear) in model.linears_mut() {
        assert!(
            matches!(linear.base(), BaseWeight::Fp8(_)),
            "{path} was upcast"
        );
    }
    Ok(())
}

fn zeros(shape: &[usize]) -> candle_core::Result<Tensor> {
    Tensor::zeros(shape, DType::BF16, &Device::Cpu)
}

#[test]
fn hunyuan_video_10_files_are_named_with_what_to_download() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let official: HashMap<String, Tensor> = [
        ("double_blocks.0.img_attn_qkv.weight", &[12usize, 4][..]),
        ("single_blocks.0.linear1.weight", &[16, 4]),
        (
            "txt_in.individual_token_refiner.blocks.0.norm1.weight",
            &[4],
        ),
        ("vector_in.in_layer.weight", &[4, 8]),
    ]
    .into_iter()
    .map(|(k, s)| Ok((format!("model.diffusion_model.{k}"), zeros(s)?)))
    .collect::<candle_core::Result<_>>()?;
    let diffusers: HashMap<String, Tensor> = [
        ("transformer_blocks.0.attn.to_q.weight", &[4usize, 4][..]),
        ("single_transformer_blocks.0.attn.to_q.weight", &[4, 4]),
        (
            "context_embedder.token_refiner.refiner_blocks.0.norm1.weight",
            &[4],
        ),
    ]
    .into_iter()
    .map(|(k, s)| Ok((k.to_string(), zeros(s)?)))
    .collect::<candle_core::Result<_>>()?;
    for (name, tensors, keys) in [
        (
            "hunyuan_video_t2v_720p_bf16.safetensors",
            &official,
            KeyLayout::Official,
        ),
        (
            "diffusion_pytorch_model.safetensors",
            &diffusers,
            KeyLayout::Diffusers,
        ),
    ] {
        let path = save(dir.path(), name, tensors)?;
        let file = identify(&path)?;
        assert_eq!((file.version, file.keys), (Version::V10, keys), "{name}");
        let report = crate::identify::identify(&path)?.to_string();
        assert!(
            report.contains("HunyuanVideo 1.0") && report.contains("tencent/HunyuanVideo-1.5"),
            "{report}"
        );
        let err = load_dit(&path, DType::F32, &Device::Cpu, None)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("HunyuanVideo 1.0") && err.ends_with(&path.display().to_string()),
            "{err}"
        );
    }
    Ok(())
}

#[test]
fn a_damaged_file_and_another_model_are_named() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let case = Case::load("i2v")?;
    let mut damaged = case.weights.clone();
    damaged.remove("double_blocks.1.txt_attn_proj.weight");
    let path = save(dir.path(), "damaged.safetensors", &damaged)?;
    let err = load_dit(&path, DType::F32, &Device::Cpu, None)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("double_blocks.1.txt_attn_proj.weight")
            && err.ends_with(&path.display().to_string()),
        "{err}"
    );
    let wan = HashMap::from([("blocks.0.self_attn.q.weight".to_string(), zeros(&[4, 4])?)]);
    let path = save(dir.path(), "wan.safetensors", &wan)?;
    let err = load_dit(&path, DType::F32, &Device::Cpu, None)
        .err()
        .ok_or_else(|| anyhow::anyhow!("a Wan file loaded as HunyuanVideo"))?;
    assert!(is_unrecognised(&err), "{err}");
    Ok(())
}

/// CRC-32 (IEEE), as zip readers check it.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A zip archive of stored (uncompressed) entries, as `torch.save` writes one.
fn zip(entries: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let (mut out, mut central) = (Vec::new(), Vec::new());
    for (name, data) in entries {
        let offset = out.len() as u32;
        let fields = |sig: &[u8], central: bool| {
            let mut h = sig.to_vec();
            h.extend(if central {
                &[20u8, 0, 20, 0][..]
            } else {
                &[20u8, 0][..]
            });
            h.extend([0u8; 6]); // flags, method (stored), time
            h.extend([0u8; 2]); // date
            h.extend(crc32(data).to_le_bytes());
            h.extend((data.len() as u32).to_le_bytes());
            h.extend((data.len() as u32).to_le_bytes());
            h.extend((name.len() as u16).to_le_bytes());
            h.extend([0u8; 2]); // extra length
            h
        };
        out.extend(fields(b"PK\x03\x04", false));
        out.extend(name.as_bytes());
        out.extend(data);
        central.extend(fields(b"PK\x01\x02", true));
        central.extend([0u8; 10]); // comment length, disk, internal and external attributes
        central.extend(offset.to_le_bytes());
        central.extend(name.as_bytes());
    }
    let start = out.len() as u32;
    out.extend(&central);
    out.extend(b"PK\x05\x06\0\0\0\0");
    out.extend((entries.len() as u16).to_le_bytes());
    out.extend((entries.len() as u16).to_le_bytes());
    out.extend((central.len() as u32).to_le_bytes());
    out.extend(start.to_le_bytes());
    out.extend([0u8; 2]);
    out
}

/// A protocol-2 pickle of a state dict holding HunyuanVideo 1.0 names, each a 2×2 bf16 tensor of storage `i`,
/// and with `evil` an entry whose value calls `posix.system` when unpickled by Python.
fn state_dict_pickle(names: &[&str], evil: Option<&str>) -> Vec<u8> {
    let text = |s: &str| {
        let mut b = vec![b'X'];
        b.extend((s.len() as u32).to_le_bytes());
        b.extend(s.as_bytes());
        b
    };
    let mut p = vec![0x80, 2, b'}', b'('];
    for (i, name) in names.iter().enumerate() {
        p.extend(text(name));
        p.extend(b"ctorch._utils\n_rebuild_tensor_v2\n(");
        p.extend(b"(");
        p.extend(text("storage"));
        p.extend(b"ctorch\nBFloat16Storage\n");
        p.extend(text(&i.to_string()));
        p.extend(text("cpu"));
        p.extend(b"K\x04tQK\x00K\x02K\x02\x86K\x02K\x01\x86\x89ccollections\nOrderedDict\n)RtR");
    }
    if let Some(command) = evil {
        p.extend(text("extra_state"));
        p.extend(b"cposix\nsystem\n");
        p.extend(text(command));
        p.extend(b"\x85R");
    }
    p.extend(b"u.");
    p
}

#[test]
fn a_10_pt_file_is_named_and_one_with_a_malicious_pickle_is_refused_unrun() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let names = [
        "double_blocks.0.img_attn_qkv.weight",
        "single_blocks.0.linear1.weight",
        "txt_in.individual_token_refiner.blocks.0.norm1.weight",
    ];
    let marker = dir.path().join("pwned");
    let archive = |evil: Option<&str>| {
        let mut entries = vec![("archive/data.pkl", state_dict_pickle(&names, evil))];
        let storages: Vec<String> = (0..names.len())
            .map(|i| format!("archive/data/{i}"))
            .collect();
        entries.extend(storages.iter().map(|s| (s.as_str(), vec![0u8; 8])));
        entries.push(("archive/version", b"3\n".to_vec()));
        zip(&entries)
    };
    let clean = dir.path().join("mp_rank_00_model_states.pt");
    std::fs::write(&clean, archive(None))?;
    let file = identify(&clean)?;
    assert_eq!(
        (file.version, &file.container),
        (Version::V10, &Container::PyTorch)
    );
    assert!(file.to_string().contains("HunyuanVideo 1.0"), "{file}");

    let command = format!("touch {}", marker.display());
    let evil = dir.path().join("evil.pt");
    std::fs::write(&evil, archive(Some(&command)))?;
    let err = identify(&evil)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("posix.system") && err.contains("refused"),
        "{err}"
    );
    let err = crate::identify::identify(&evil)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("posix.system"), "{err}");
    assert!(!marker.exists(), "the pickle ran");
    Ok(())
}
