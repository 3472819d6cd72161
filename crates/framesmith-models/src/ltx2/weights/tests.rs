//! The LTX-2 files as users have them, made from the fixtures: the official single file with its embedded config
//! (named and built), a transformer-only file without config (refused at sizes no release has), diffusers'
//! folder, an FP8 file with per-tensor scales, and Gemma 3 12B's token embedding at its real shape (header only).

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};

use super::super::layout::{diffusers_name, Layout};
use super::super::testkit;
use super::{identify, is_gemma3_12b, load, Ltx2FormatError};
use crate::fixtures::assert_close;
use crate::ltx2::Ltx2Version;
use framesmith_nn::testing::rel;

/// Saves `tensors` to `path` with `metadata` in the safetensors header.
fn save(
    path: &Path,
    tensors: &HashMap<String, Tensor>,
    metadata: &[(&str, String)],
) -> anyhow::Result<()> {
    candle_core::safetensors::save(tensors, path)?;
    let bytes = std::fs::read(path)?;
    let n = u64::from_le_bytes(bytes[..8].try_into()?) as usize;
    let mut header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + n])?;
    let meta: serde_json::Map<String, serde_json::Value> = metadata
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone().into()))
        .collect();
    header.insert("__metadata__".into(), meta.into());
    let mut text = serde_json::Value::Object(header).to_string();
    while text.len() % 8 != 0 {
        text.push(' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(path, out)?;
    Ok(())
}

fn config_metadata(case: &crate::fixtures::FixtureCase) -> (&'static str, String) {
    (
        "config",
        serde_json::json!({ "transformer": case.config["init"] }).to_string(),
    )
}

/// The model at `path` run on the case's inputs: its velocity.
fn velocity(path: &Path, case: &crate::fixtures::FixtureCase) -> anyhow::Result<Tensor> {
    let (_, model) = load(path, DType::F32, &Device::Cpu, None)?;
    Ok(model.forward(&testkit::inputs(case)?)?)
}

#[test]
fn the_official_single_file_is_named_and_built() -> anyhow::Result<()> {
    let case = testkit::load("ltx23_t2v")?;
    let path = testkit::fixtures_dir().join("ltx23_t2v/weights.safetensors");
    let file = identify(&path)?;
    assert_eq!(file.version, Ltx2Version::Ltx23);
    assert!(file.embedded_config && file.fp8.is_none());
    assert_eq!(
        file.layout,
        Layout::LtxCore {
            prefix: "model.diffusion_model.".into()
        }
    );
    assert_eq!(file.model_version.as_deref(), Some("2.3.0"));
    let shown = file.to_string();
    assert!(
        shown.contains("LTX-2.3 audio-video transformer") && shown.contains("gated attention on"),
        "{shown}"
    );
    assert_close(
        "out",
        &velocity(&path, &case)?,
        case.expected("out")?,
        1e-4,
        1e-4,
    )?;
    Ok(())
}

#[test]
fn a_file_without_config_needs_a_released_size_and_ltx2_is_told_from_its_keys() -> anyhow::Result<()>
{
    let case = testkit::load("ltx2_t2v")?;
    let bare = testkit::fixtures_dir().join("ltx2_t2v/weights.safetensors");
    assert!(matches!(
        identify(&bare),
        Err(Ltx2FormatError::NoConfig { .. })
    ));
    // As the release stores it: under the prefix, the config embedded, the VAE beside it.
    let dir = tempfile::tempdir()?;
    let mut tensors: HashMap<String, Tensor> = case
        .weights
        .iter()
        .map(|(k, v)| (format!("model.diffusion_model.{k}"), v.clone()))
        .collect();
    tensors.insert(
        "vae.decoder.conv_in.conv.weight".into(),
        Tensor::zeros(4, DType::F32, &Device::Cpu)?,
    );
    let path = dir.path().join("ltx-2-19b-dev.safetensors");
    save(&path, &tensors, &[config_metadata(&case)])?;
    let file = identify(&path)?;
    assert_eq!(
        (file.version, file.parts.as_slice()),
        (Ltx2Version::Ltx2, &["video VAE"][..])
    );
    assert!(file.to_string().contains("LTX-2 audio-video transformer"));
    assert_close(
        "out",
        &velocity(&path, &case)?,
        case.expected("out")?,
        1e-4,
        1e-4,
    )?;
    Ok(())
}

#[test]
fn a_diffusers_folder_is_read_under_ltx_core_names() -> anyhow::Result<()> {
    let case = testkit::load("ltx23_t2v")?;
    let dir = tempfile::tempdir()?;
    let tensors: HashMap<String, Tensor> = case
        .weights
        .iter()
        .map(|(k, v)| {
            let k = k.trim_start_matches("model.diffusion_model.");
            let k = k
                .replace("audio_patchify_proj.", "audio_proj_in.")
                .replace("audio_adaln_single.", "audio_time_embed.");
            (diffusers_name(&k), v.clone())
        })
        .collect();
    save(
        &dir.path().join("diffusion_pytorch_model.safetensors"),
        &tensors,
        &[],
    )?;
    let init = &case.config["init"];
    let config = serde_json::json!({
        "_class_name": "LTX2VideoTransformer3DModel",
        "num_attention_heads": init["num_attention_heads"], "attention_head_dim": init["attention_head_dim"],
        "in_channels": init["in_channels"], "out_channels": init["out_channels"], "num_layers": init["num_layers"],
        "cross_attention_dim": init["cross_attention_dim"], "rope_type": "split", "gated_attn": true,
        "cross_attn_mod": true, "use_prompt_embeddings": false
    });
    std::fs::write(dir.path().join("config.json"), config.to_string())?;
    let file = identify(dir.path())?;
    assert_eq!(
        (file.layout.clone(), file.version),
        (Layout::Diffusers, Ltx2Version::Ltx23)
    );
    assert_close(
        "out",
        &velocity(dir.path(), &case)?,
        case.expected("out")?,
        1e-4,
        1e-4,
    )?;
    Ok(())
}

#[test]
fn an_fp8_file_with_tensor_scales_is_named_and_dequantised() -> anyhow::Result<()> {
    let case = testkit::load("ltx23_t2v")?;
    let dir = tempfile::tempdir()?;
    let mut tensors = HashMap::new();
    for (k, v) in &case.weights {
        let linear = k.contains(".transformer_blocks.") && k.ends_with(".weight") && v.rank() == 2;
        if !linear {
            tensors.insert(k.clone(), v.clone());
            continue;
        }
        let scale = (v.abs()?.max_all()?.to_scalar::<f32>()? / 448.0).max(1e-12);
        tensors.insert(k.clone(), (v / scale as f64)?.to_dtype(DType::F8E4M3)?);
        tensors.insert(format!("{k}_scale"), Tensor::new(scale, &Device::Cpu)?);
    }
    let path = dir.path().join("ltx-2.3-22b-dev-fp8.safetensors");
    save(&path, &tensors, &[config_metadata(&case)])?;
    let file = identify(&path)?;
    assert_eq!(file.fp8, Some(true));
    assert!(file.to_string().contains("per-tensor weight_scale"));
    let r = rel(&velocity(&path, &case)?, case.expected("out")?)?;
    assert!(r < 0.1, "the FP8 model is {r:.3} away from the reference");
    Ok(())
}

/// A safetensors header of one tensor whose data is a hole (sparse): a real-size header costs no disk.
fn header_only(path: &Path, name: &str, shape: [usize; 2]) -> anyhow::Result<()> {
    let bytes = shape[0] * shape[1] * 2;
    let header =
        serde_json::json!({ name: {"dtype": "BF16", "shape": shape, "data_offsets": [0, bytes]} });
    let mut text = header.to_string();
    while text.len() % 8 != 0 {
        text.push(' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    std::fs::write(path, &out)?;
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)?
        .set_len((out.len() + bytes) as u64)?;
    Ok(())
}

#[test]
fn gemma3_12b_is_named_by_its_token_embedding() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let gemma = dir.path().join("gemma_3_12B_it.safetensors");
    header_only(
        &gemma,
        "model.language_model.embed_tokens.weight",
        [262_208, 3840],
    )?;
    assert!(is_gemma3_12b(&gemma));
    let qwen = dir.path().join("qwen_2.5_vl_7b.safetensors");
    header_only(&qwen, "model.embed_tokens.weight", [152_064, 3584])?;
    assert!(!is_gemma3_12b(&qwen));
    assert!(matches!(
        identify(&gemma),
        Err(Ltx2FormatError::NotLtx2 { .. })
    ));
    Ok(())
}

#[test]
fn both_streams_shapes_are_every_tensor_of_the_audio_video_model() -> anyhow::Result<()> {
    // ltx-core's `LTXModel` of the joint fixtures holds exactly the video and audio streams' tensors.
    for name in ["ltx2_av", "ltx23_av"] {
        let case = testkit::load(name)?;
        let cfg = testkit::config(&case)?;
        let prefix = if case.config["call"]["layout"] == "single_file" {
            "model.diffusion_model."
        } else {
            ""
        };
        let mut ours: Vec<(String, Vec<usize>)> = super::video_stream_shapes(&cfg)
            .into_iter()
            .chain(super::audio_stream_shapes(&cfg))
            .map(|(k, s)| (format!("{prefix}{k}"), s))
            .collect();
        ours.sort();
        let mut theirs: Vec<(String, Vec<usize>)> = case
            .weights
            .iter()
            .map(|(k, t)| (k.clone(), t.dims().to_vec()))
            .collect();
        theirs.sort();
        assert_eq!(ours, theirs, "{name}");
    }
    Ok(())
}
