//! The files users have, made from the fixture's weights: ComfyUI's single files (bf16 and `scaled_fp8`), a
//! diffusers `text_encoder/` folder of shards, and wrong files.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use super::{identify, Layout};
use crate::qwen25vl::tests::{case, f32_options, fixture_dir, fixture_json, rel_error};
use crate::qwen25vl::*;
use framesmith_nn::fp8::{e4m3_decode, e4m3_encode, Fp8Scale};

fn fixture_weights() -> anyhow::Result<HashMap<String, Tensor>> {
    Ok(candle_core::safetensors::load(
        fixture_dir().join("weights.safetensors"),
        &Device::Cpu,
    )?)
}

/// transformers 5 names → ComfyUI's (`model.layers.*`, `visual.*`).
fn comfy_names(weights: HashMap<String, Tensor>) -> HashMap<String, Tensor> {
    weights
        .into_iter()
        .map(|(k, v)| {
            let k = match k.strip_prefix("model.language_model.") {
                Some(rest) => format!("model.{rest}"),
                None => k.replace("model.visual.", "visual."),
            };
            (k, v)
        })
        .collect()
}

fn save(path: &Path, tensors: &HashMap<String, Tensor>) -> anyhow::Result<PathBuf> {
    candle_core::safetensors::save(tensors, path)?;
    Ok(path.to_path_buf())
}

fn hidden_of(path: &Path, options: &LoadOptions) -> anyhow::Result<Tensor> {
    let inputs = case()?.inputs;
    let model = load_text_model(path, options)?;
    Ok(model.hidden_states(&inputs["input_ids"], &inputs["attention_mask"], 0)?)
}

fn expected_hidden() -> anyhow::Result<Tensor> {
    Ok(case()?.expected["hidden_last"].clone())
}

/// Every layer Linear's weight as e4m3 codes with a per-tensor `scale_weight`, and the `scaled_fp8` marker; and
/// the same weights dequantised by hand.
fn scaled_fp8(weights: &HashMap<String, Tensor>) -> anyhow::Result<[HashMap<String, Tensor>; 2]> {
    let (mut fp8, mut reference) = (weights.clone(), weights.clone());
    for (k, v) in weights {
        if !(k.starts_with("model.layers.") && k.ends_with("_proj.weight")) {
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
    fp8.insert(
        "scaled_fp8".into(),
        Tensor::from_raw_buffer(&[0u8], DType::F8E4M3, &[1], &Device::Cpu)?,
    );
    Ok([fp8, reference])
}

#[test]
fn comfy_single_files_load_bf16_and_scaled_fp8() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let comfy = comfy_names(fixture_weights()?);
    let path = save(&dir.path().join("qwen_2.5_vl_7b.safetensors"), &comfy)?;
    let file = identify(&path)?;
    assert_eq!(
        (file.layout.clone(), file.prefix),
        (Layout::SingleFile, "model.")
    );
    let shown = file.to_string();
    assert!(
        shown.contains("vision tower is present") && shown.contains("not the 7B model"),
        "{shown}"
    );
    // `framesmith inspect` names it so too, ahead of the other families' readers.
    let inspected = crate::identify::identify(&path)?.to_string();
    assert!(
        inspected.starts_with("Qwen2.5-VL-style language model"),
        "{inspected}"
    );
    let options = f32_options()?;
    let rel = rel_error(&hidden_of(&path, &options)?, &expected_hidden()?)?;
    assert!(rel <= 1e-4, "ComfyUI names: relative error {rel:.3e}");
    let streamed = LoadOptions {
        placement: LayerPlacement::Streamed,
        ..options.clone()
    };
    let rel = rel_error(&hidden_of(&path, &streamed)?, &expected_hidden()?)?;
    assert!(rel <= 1e-4, "streamed layers: relative error {rel:.3e}");

    let [fp8, reference] = scaled_fp8(&comfy)?;
    let fp8_path = save(
        &dir.path().join("qwen_2.5_vl_7b_fp8_scaled.safetensors"),
        &fp8,
    )?;
    let ref_path = save(&dir.path().join("reference.safetensors"), &reference)?;
    let shown = identify(&fp8_path)?.to_string();
    assert!(shown.contains("scaled_fp8"), "{shown}");
    let want = hidden_of(&ref_path, &options)?;
    // A missed scale would be off by ~1/scale; the rounding to e4m3 itself is in both.
    assert!(
        rel_error(&want, &expected_hidden()?)? > 1e-4,
        "the FP8 rounding must be visible"
    );
    for fp8_mode in [None, Some(Fp8Scale::Tensor)] {
        let opts = LoadOptions {
            fp8: fp8_mode,
            ..options.clone()
        };
        let rel = rel_error(&hidden_of(&fp8_path, &opts)?, &want)?;
        assert!(
            rel <= 1e-5,
            "scaled_fp8 with fp8 {fp8_mode:?}: relative error {rel:.3e}"
        );
    }
    Ok(())
}

#[test]
fn a_diffusers_folder_and_a_lone_shard() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let root = dir.path().join("Qwen-Image");
    let te = root.join("text_encoder");
    std::fs::create_dir_all(&te)?;
    let (layers, rest): (HashMap<_, _>, HashMap<_, _>) = fixture_weights()?
        .into_iter()
        .partition(|(k, _)| k.starts_with("model.language_model.layers."));
    let shard = |i: usize| te.join(format!("model-0000{i}-of-00002.safetensors"));
    save(&shard(1), &layers)?;
    save(&shard(2), &rest)?;
    let config = serde_json::json!({
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "model_type": "qwen2_5_vl",
        "text_config": fixture_json()?["text_config"],
    });
    std::fs::write(te.join("config.json"), config.to_string())?;

    // inspect names the text encoder's folder, not the pipeline's folder around it; loading takes either.
    assert!(identify(&root).is_err_and(|e| super::is_unrecognised(&e)));
    let file = identify(&te)?;
    assert_eq!(
        (file.layout.clone(), file.prefix),
        (Layout::Folder { shards: 2 }, "model.language_model.")
    );
    assert_eq!(file.config, crate::qwen25vl::tests::fixture_config()?);
    let rel = rel_error(&hidden_of(&root, &f32_options()?)?, &expected_hidden()?)?;
    assert!(rel <= 1e-4, "folder: relative error {rel:.3e}");

    let err = identify(&shard(1))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("incomplete") && err.contains("one shard"),
        "{err}"
    );
    Ok(())
}

#[test]
fn wrong_files_say_what_to_pick() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let comfy = comfy_names(fixture_weights()?);
    let path = save(&dir.path().join("qwen_2.5_vl_3b.safetensors"), &comfy)?;
    // Without sizes to build, only the 7B model is taken.
    let err = load_text_model(&path, &LoadOptions::new(&Device::Cpu))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("not Qwen2.5-VL-7B")
            && err.contains("qwen_2.5_vl_7b.safetensors")
            && err.ends_with("qwen_2.5_vl_3b.safetensors"),
        "{err}"
    );
    let transformer = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/qwen_image/t2i/weights.safetensors");
    let err = load_text_model(&transformer, &f32_options()?).err();
    assert!(
        matches!(err, Some(Qwen25VlFormatError::NotQwen25Vl { .. })),
        "{err:?}"
    );
    let shown = err.map(|e| e.to_string()).unwrap_or_default();
    assert!(shown.contains("Comfy-Org/Qwen-Image_ComfyUI"), "{shown}");
    Ok(())
}

/// A safetensors file of these tensors whose data is a hole (sparse): a real-size header costs no disk.
fn header_only(path: &Path, tensors: &[(String, &str, Vec<usize>)]) -> anyhow::Result<()> {
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for (name, dtype, shape) in tensors {
        let bytes = shape.iter().product::<usize>()
            * if *dtype == "BF16" {
                2
            } else if *dtype == "F32" {
                4
            } else {
                1
            };
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    let mut text = serde_json::Value::Object(header).to_string();
    while text.len() % 8 != 0 {
        text.push(' ');
    }
    let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(text.as_bytes());
    std::fs::write(path, &bytes)?;
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)?
        .set_len((bytes.len() + offset) as u64)?;
    Ok(())
}

/// ComfyUI's 7B files at their real shapes (headers only): named as the 7B encoder, with the vision tower and
/// FP8 said.
#[test]
fn the_real_7b_files_are_named() -> anyhow::Result<()> {
    let c = Qwen25VlTextConfig::qwen25_vl_7b();
    let (h, kv) = (c.hidden_size, c.num_key_value_heads * c.head_dim());
    for (file_name, linear_dtype) in [
        ("qwen_2.5_vl_7b.safetensors", "BF16"),
        ("qwen_2.5_vl_7b_fp8_scaled.safetensors", "F8_E4M3"),
    ] {
        let mut tensors = vec![
            (
                "model.embed_tokens.weight".to_string(),
                "BF16",
                vec![c.vocab_size, h],
            ),
            ("model.norm.weight".to_string(), "BF16", vec![h]),
            (
                "visual.patch_embed.proj.weight".to_string(),
                "BF16",
                vec![1280, 3, 2, 14, 14],
            ),
            ("visual.merger.ln_q.weight".to_string(), "BF16", vec![1280]),
        ];
        for i in 0..c.num_hidden_layers {
            let layer = |n: &str| format!("model.layers.{i}.{n}");
            for (n, shape) in [
                ("self_attn.q_proj", vec![h, h]),
                ("self_attn.k_proj", vec![kv, h]),
                ("self_attn.v_proj", vec![kv, h]),
                ("self_attn.o_proj", vec![h, h]),
                ("mlp.gate_proj", vec![c.intermediate_size, h]),
                ("mlp.up_proj", vec![c.intermediate_size, h]),
                ("mlp.down_proj", vec![h, c.intermediate_size]),
            ] {
                if n.ends_with("q_proj") || n.ends_with("k_proj") || n.ends_with("v_proj") {
                    tensors.push((layer(&format!("{n}.bias")), "BF16", vec![shape[0]]));
                }
                tensors.push((layer(&format!("{n}.weight")), linear_dtype, shape));
                if linear_dtype == "F8_E4M3" {
                    tensors.push((layer(&format!("{n}.scale_weight")), "F32", vec![]));
                }
            }
            tensors.push((layer("input_layernorm.weight"), "BF16", vec![h]));
            tensors.push((layer("post_attention_layernorm.weight"), "BF16", vec![h]));
        }
        let dir = tempfile::tempdir()?;
        let path = dir.path().join(file_name);
        header_only(&path, &tensors)?;
        let file = identify(&path)?;
        assert_eq!(file.config, c);
        let shown = crate::identify::identify(&path)?.to_string();
        for part in [
            "Qwen2.5-VL-7B text encoder",
            "28 layers, width 3584, 28 heads / 4 key-value heads of 128, vocabulary 152064",
            "vision tower is present (2 tensors",
            "text encoder of a Qwen-Image or HunyuanVideo 1.5 run",
        ] {
            assert!(shown.contains(part), "{part} missing:\n{shown}");
        }
        assert_eq!(
            shown.contains("scaled_fp8"),
            linear_dtype == "F8_E4M3",
            "{shown}"
        );
    }
    Ok(())
}
