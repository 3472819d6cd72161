//! FLUX.1 file recognition on tiny synthetic files (the fixtures' weights renamed, stripped or quantised the way
//! the released files are): what `identify` says, the errors for the wrong file, and FP8 scaled files loading
//! to the same model as their dequantised weights.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use super::*;
use crate::flux::testkit::{assert_close, Case};
use crate::flux::FluxInputs;
use framesmith_nn::fp8::{e4m3_decode, e4m3_encode, Fp8Scale};

fn save(dir: &Path, name: &str, tensors: &HashMap<String, Tensor>) -> anyhow::Result<PathBuf> {
    let path = dir.join(name);
    candle_core::safetensors::save(tensors, &path)?;
    Ok(path)
}

fn prefixed(tensors: &HashMap<String, Tensor>, prefix: &str) -> HashMap<String, Tensor> {
    tensors
        .iter()
        .map(|(k, v)| (format!("{prefix}{k}"), v.clone()))
        .collect()
}

fn message(err: FluxFormatError) -> String {
    err.to_string()
}

#[test]
fn names_dev_schnell_and_kontext_files() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let dev = Case::load("flux_dit")?.0.weights;
    let path = save(dir.path(), "flux1-dev.safetensors", &dev)?;
    let file = identify(&path)?;
    let FluxKind::Dit { variant, config } = &file.kind else {
        anyhow::bail!("not a DiT: {file}");
    };
    assert_eq!(*variant, FluxVariant::Dev);
    let case = Case::load("flux_dit")?;
    assert_eq!(
        *config,
        FluxConfig::from_json(&case.config["init"].to_string())?
    );
    assert_eq!(file.prefix, None);
    let shown = file.to_string();
    assert!(
        shown.contains("FLUX.1 [dev]") && shown.contains("2 double-stream + 2 single-stream"),
        "{shown}"
    );

    let schnell = save(
        dir.path(),
        "flux1-schnell.safetensors",
        &Case::load("flux_dit_schnell")?.weights,
    )?;
    let err = message(
        identify_expected(&schnell, FluxComponent::Dit, Some(FluxVariant::Dev))
            .err()
            .ok_or_else(|| anyhow::anyhow!("accepted"))?,
    );
    assert!(
        err.contains("FLUX.1 [schnell]") && err.contains("FLUX.1 [dev] was asked for"),
        "{err}"
    );

    let kontext = save(dir.path(), "flux1-kontext-dev.safetensors", &dev)?;
    let err = message(
        identify_expected(&kontext, FluxComponent::Dit, Some(FluxVariant::Dev))
            .err()
            .ok_or_else(|| anyhow::anyhow!("accepted"))?,
    );
    assert!(
        err.contains("Kontext") && err.contains("flux1-kontext-dev.safetensors"),
        "{err}"
    );
    Ok(())
}

#[test]
fn comfy_prefixed_dit_loads_and_matches_the_fixture() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let case = Case::load("flux_dit_schnell")?;
    let path = save(
        dir.path(),
        "flux1-schnell.safetensors",
        &prefixed(&case.weights, "model.diffusion_model."),
    )?;
    let file = identify(&path)?;
    assert_eq!(file.prefix, Some("model.diffusion_model."));
    assert!(file.to_string().contains("ComfyUI single file"));
    assert!(file.bundled.is_empty());

    let mut all_in_one = prefixed(&case.weights, "model.diffusion_model.");
    all_in_one.extend(prefixed(&Case::load("flux_ae")?.weights, "vae."));
    all_in_one.extend(prefixed(
        &Case::load("clip_l")?.weights,
        "text_encoders.clip_l.",
    ));
    let bundle = save(dir.path(), "flux1-schnell-fp8.safetensors", &all_in_one)?;
    let shown = identify(&bundle)?.to_string();
    assert!(shown.contains("bundles     a VAE, CLIP-L too"), "{shown}");
    let model = load_dit(
        &path,
        Some(FluxVariant::Schnell),
        DType::F32,
        &Device::Cpu,
        None,
    )?;
    let out = model.forward(&inputs(&case)?)?;
    assert_close("out", &out, case.expected("out")?, 1e-4, 1e-4)?;
    Ok(())
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

/// Every 2D block weight as e4m3 codes with a per-tensor `scale_weight` (ComfyUI `scaled_fp8`), and the same
/// weights dequantised by hand.
fn scaled_fp8(tensors: &HashMap<String, Tensor>) -> anyhow::Result<[HashMap<String, Tensor>; 2]> {
    let (mut scaled, mut reference) = (HashMap::new(), HashMap::new());
    for (k, v) in tensors {
        if v.rank() != 2 || !k.ends_with(".weight") {
            scaled.insert(k.clone(), v.clone());
            reference.insert(k.clone(), v.clone());
            continue;
        }
        let values = v.flatten_all()?.to_vec1::<f32>()?;
        let scale = values.iter().fold(0f32, |m, x| m.max(x.abs())) / 448.0;
        let codes: Vec<u8> = values.iter().map(|x| e4m3_encode(x / scale)).collect();
        let back: Vec<f32> = codes.iter().map(|&c| e4m3_decode(c) * scale).collect();
        let module = k.trim_end_matches(".weight");
        scaled.insert(
            k.clone(),
            Tensor::from_raw_buffer(&codes, DType::F8E4M3, v.dims(), &Device::Cpu)?,
        );
        scaled.insert(
            format!("{module}.scale_weight"),
            Tensor::new(scale, &Device::Cpu)?,
        );
        reference.insert(k.clone(), Tensor::from_vec(back, v.dims(), &Device::Cpu)?);
    }
    scaled.insert(
        SCALED_FP8_MARKER.into(),
        Tensor::from_raw_buffer(&[0u8], DType::F8E4M3, &[1], &Device::Cpu)?,
    );
    Ok([scaled, reference])
}

#[test]
fn comfy_scaled_fp8_dit_runs_as_its_dequantised_weights() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let case = Case::load("flux_dit")?;
    let [scaled, reference] = scaled_fp8(&prefixed(&case.weights, "model.diffusion_model."))?;
    let fp8_path = save(dir.path(), "flux1-dev-fp8-scaled.safetensors", &scaled)?;
    let ref_path = save(dir.path(), "flux1-dev-ref.safetensors", &reference)?;
    let file = identify(&fp8_path)?;
    assert_eq!(file.fp8, Some(Fp8Storage::Scaled));
    assert!(file.to_string().contains("scaled_fp8"));
    let inputs = inputs(&case)?;
    let run = |path: &Path, fp8| -> anyhow::Result<Tensor> {
        let model = load_dit(path, Some(FluxVariant::Dev), DType::F32, &Device::Cpu, fp8)?;
        Ok(model.forward(&inputs)?)
    };
    let want = run(&ref_path, None)?;
    assert_close("dequantised", &run(&fp8_path, None)?, &want, 1e-5, 1e-5)?;
    assert_close(
        "kept in fp8",
        &run(&fp8_path, Some(Fp8Scale::Tensor))?,
        &want,
        1e-4,
        1e-4,
    )?;
    // Kept in FP8, the file's block linears stay FP8 codes with their scales (nothing upcast); the embeddings and
    // the final layer, outside the blocks, are dense in the compute dtype.
    let fp8 = Some(Fp8Scale::Tensor);
    let mut model = load_dit(
        &fp8_path,
        Some(FluxVariant::Dev),
        DType::F32,
        &Device::Cpu,
        fp8,
    )?;
    let is_fp8 = |l: &framesmith_nn::linear::Linear| {
        matches!(l.base(), framesmith_nn::linear::BaseWeight::Fp8(_))
    };
    assert!(!is_fp8(&model.img_in) && !is_fp8(&model.txt_in));
    let linears = model.linears_mut();
    assert!(!linears.is_empty());
    for (path, linear) in linears {
        assert!(is_fp8(linear), "{path} was upcast");
    }
    Ok(())
}

#[test]
fn names_the_autoencoder_and_text_encoders() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let ae = save(
        dir.path(),
        "ae.safetensors",
        &Case::load("flux_ae")?.weights,
    )?;
    let file = identify(&ae)?;
    assert_eq!(file.kind.component(), FluxComponent::Autoencoder);
    assert!(file.to_string().contains("FLUX.1 autoencoder"), "{file}");
    let err = message(
        identify_expected(&ae, FluxComponent::Dit, None)
            .err()
            .ok_or_else(|| anyhow::anyhow!("accepted"))?,
    );
    assert!(
        err.contains("not the diffusion model") && err.contains("flux1-dev.safetensors"),
        "{err}"
    );

    let clip = save(
        dir.path(),
        "clip_l.safetensors",
        &Case::load("clip_l")?.weights,
    )?;
    assert_eq!(
        identify(&clip)?.kind,
        FluxKind::ClipText {
            hidden: 32,
            layers: 2
        }
    );

    let t5 = Case::load("t5_encoder")?.0.weights;
    let [scaled, _] = scaled_fp8(&t5)?;
    let t5_path = save(dir.path(), "t5xxl_fp8_e4m3fn_scaled.safetensors", &scaled)?;
    let file = identify(&t5_path)?;
    assert_eq!(
        (file.kind.clone(), file.fp8),
        (
            FluxKind::T5 { dim: 32, layers: 2 },
            Some(Fp8Storage::Scaled)
        )
    );
    Ok(())
}

#[test]
fn wan_diffusers_and_unknown_files_say_what_they_are() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let z = |shape: &[usize]| Tensor::zeros(shape, DType::F32, &Device::Cpu);
    let wan: HashMap<String, Tensor> = [
        ("patch_embedding.weight".to_string(), z(&[8, 16, 1, 2, 2])?),
        ("blocks.0.self_attn.q.weight".to_string(), z(&[8, 8])?),
    ]
    .into();
    let path = save(dir.path(), "wan2.1_t2v_1.3B_bf16.safetensors", &wan)?;
    let err = message(
        identify(&path)
            .err()
            .ok_or_else(|| anyhow::anyhow!("accepted"))?,
    );
    assert!(
        err.contains("Wan diffusion transformer") && err.contains("flux1-dev.safetensors"),
        "{err}"
    );

    let diffusers: HashMap<String, Tensor> = [
        (
            "transformer_blocks.0.attn.to_q.weight".to_string(),
            z(&[8, 8])?,
        ),
        (
            "single_transformer_blocks.0.proj_out.weight".to_string(),
            z(&[8, 8])?,
        ),
    ]
    .into();
    let path = save(
        dir.path(),
        "diffusion_pytorch_model.safetensors",
        &diffusers,
    )?;
    let err = message(
        identify(&path)
            .err()
            .ok_or_else(|| anyhow::anyhow!("accepted"))?,
    );
    assert!(err.contains("diffusers format"), "{err}");

    std::fs::create_dir(dir.path().join("FLUX.1-dev"))?;
    std::fs::write(dir.path().join("FLUX.1-dev/model_index.json"), "{}")?;
    let err = message(
        identify(&dir.path().join("FLUX.1-dev"))
            .err()
            .ok_or_else(|| anyhow::anyhow!("accepted"))?,
    );
    assert!(err.contains("diffusers-format pipeline folder"), "{err}");

    let other: HashMap<String, Tensor> = [("foo.weight".to_string(), z(&[2])?)].into();
    let path = save(dir.path(), "other.safetensors", &other)?;
    let err = identify(&path)
        .err()
        .ok_or_else(|| anyhow::anyhow!("accepted"))?;
    assert!(
        is_unrecognised(&err) && err.to_string().contains("`foo.weight`"),
        "{err}"
    );

    let truncated = dir.path().join("cut.safetensors");
    std::fs::write(&truncated, [1u8, 0, 0])?;
    assert!(matches!(
        identify(&truncated),
        Err(FluxFormatError::File(_))
    ));
    Ok(())
}

#[test]
fn rope_axes_follow_the_released_split() {
    assert_eq!(axes_for_head_dim(128), vec![16, 56, 56]);
    assert_eq!(axes_for_head_dim(16), vec![4, 6, 6]);
}

#[test]
fn autoencoder_clip_and_scaled_fp8_t5_load_from_their_files() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let case = Case::load("flux_ae")?;
    let ae = load_autoencoder(
        &save(dir.path(), "ae.safetensors", &case.weights)?,
        DType::F32,
        &Device::Cpu,
    )?;
    assert_close(
        "ae z",
        &ae.encode(case.input("x")?)?,
        case.expected("z")?,
        1e-4,
        1e-4,
    )?;

    let case = Case::load("clip_l")?;
    let heads = case.config["init"]["num_attention_heads"]
        .as_u64()
        .map(|h| h as usize);
    let path = save(dir.path(), "clip_l.safetensors", &case.weights)?;
    // Its 32 channels are not one head per 64: without the count, a message that asks for config.json; with a
    // Hugging Face config.json beside the file, the count comes from there.
    let Err(err) = load_clip_text(&path, None, DType::F32, &Device::Cpu) else {
        anyhow::bail!("a CLIP whose head count cannot be known loaded");
    };
    assert!(err.to_string().contains("config.json"), "{err}");
    std::fs::write(
        dir.path().join("config.json"),
        case.config["init"].to_string(),
    )?;
    let beside = load_clip_text(&path, None, DType::F32, &Device::Cpu)?;
    assert_eq!(beside.config().num_attention_heads, 2);
    let clip = load_clip_text(&path, heads, DType::F32, &Device::Cpu)?;
    let pooled = clip.forward(case.input("input_ids")?)?.pooler_output;
    assert_close(
        "clip pooled",
        &pooled,
        case.expected("pooler_output")?,
        1e-4,
        1e-4,
    )?;

    let case = Case::load("t5_encoder")?;
    let [scaled, reference] = scaled_fp8(&case.weights)?;
    let fp8_path = save(dir.path(), "t5xxl_fp8_e4m3fn_scaled.safetensors", &scaled)?;
    let ref_path = save(dir.path(), "t5xxl_ref.safetensors", &reference)?;
    let (ids, mask) = (case.input("input_ids")?, case.input("attention_mask")?);
    let encode = |path: &Path| -> anyhow::Result<Tensor> {
        Ok(load_t5_xxl(path, DType::F32, &Device::Cpu)?.encode(ids, mask)?)
    };
    assert_close(
        "t5 fp8 scaled",
        &encode(&fp8_path)?,
        &encode(&ref_path)?,
        1e-5,
        1e-5,
    )?;
    let dense = save(dir.path(), "t5xxl_fp16.safetensors", &case.weights)?;
    assert_close(
        "t5 dense",
        &encode(&dense)?,
        case.expected("hidden")?,
        1e-4,
        1e-4,
    )?;
    Ok(())
}
