//! Builds the Qwen-Image transformer from its files — a single safetensors file with diffusers' names (bare or
//! under ComfyUI's prefix) or a diffusers `transformer/` folder of shards — each checked as [`super::identify`]
//! does, its tensors read from the opened files as the model asks for them. FP8 files stay FP8 when the run keeps
//! its blocks in FP8 (plain `float8_e4m3fn` or ComfyUI `scaled_fp8` with per-tensor scales) and are dequantised
//! otherwise; bf16 files are quantised on load when asked.

use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device};

use super::{describe, scan, QwenImageFile, QwenImageFormatError};
use crate::checkpoint::entries;
use crate::qwen_image::QwenImageTransformer;
use crate::wan::weights::MappedTensors;
use framesmith_nn::fp8::Fp8Scale;
use framesmith_nn::offload::OffloadOptions;
use framesmith_nn::vb::Vb;

/// An opened Qwen-Image transformer: what it is, and its tensors under diffusers' names (prefix stripped), each
/// read when a module asks for it.
pub struct OpenedQwenImage {
    pub file: QwenImageFile,
    pub tensors: MappedTensors,
}

/// Opens the Qwen-Image transformer at `path` (a file or a diffusers folder), mapping its data.
pub fn open(path: &Path) -> Result<OpenedQwenImage, QwenImageFormatError> {
    let scanned = scan(path)?;
    let file = describe(path, &scanned)?;
    let prefix = file.layout.prefix();
    let entries = entries(scanned.tensors.iter().map(|(i, t)| (*i, t)), prefix);
    let tensors = MappedTensors::open(&scanned.files, &entries)?;
    Ok(OpenedQwenImage { file, tensors })
}

/// Builds the Qwen-Image transformer at `path` in `dtype` on `device`, its block linears kept in FP8 with `fp8`
/// set (FP8 files stay FP8; dense files are quantised), else dense.
pub fn load_dit(
    path: &Path,
    dtype: DType,
    device: &Device,
    fp8: Option<Fp8Scale>,
) -> Result<QwenImageTransformer, QwenImageFormatError> {
    load_dit_streamed(
        path,
        (dtype, device),
        fp8,
        false,
        (&[], &OffloadOptions::default()),
    )
}

/// [`load_dit`] with the blocks in `streamed` (indices into `transformer_blocks`) kept in host RAM and streamed
/// through GPU slots ([`QwenImageTransformer::new_streamed`]) with `offload`; `fp8_products`: FP8 bases held for FP8
/// tensor-core products.
pub fn load_dit_streamed(
    path: &Path,
    (dtype, device): (DType, &Device),
    fp8: Option<Fp8Scale>,
    fp8_products: bool,
    (streamed, offload): (&[usize], &OffloadOptions),
) -> Result<QwenImageTransformer, QwenImageFormatError> {
    let opened = open(path)?;
    let config = opened.file.config.clone();
    let vb = Vb::from_source(Arc::new(opened.tensors), dtype, device)
        .with_fp8(fp8)
        .with_fp8_products(fp8_products);
    QwenImageTransformer::new_streamed(&config, &vb, streamed, offload).map_err(|e| {
        QwenImageFormatError::Build {
            problem: e.to_string(),
            path: path.to_path_buf(),
        }
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::PathBuf;

    use candle_core::Tensor;

    use super::*;
    use crate::checkpoint::SCALED_FP8_MARKER;
    use crate::fixtures::assert_close;
    use crate::qwen_image::testkit::Case;
    use framesmith_nn::fp8::{e4m3_decode, e4m3_encode};
    use framesmith_nn::linear::{BaseWeight, Linear};

    fn save(dir: &Path, name: &str, tensors: &HashMap<String, Tensor>) -> anyhow::Result<PathBuf> {
        let path = dir.join(name);
        candle_core::safetensors::save(tensors, &path)?;
        Ok(path)
    }

    fn converted(
        tensors: &HashMap<String, Tensor>,
        prefix: &str,
        dtype: DType,
    ) -> anyhow::Result<HashMap<String, Tensor>> {
        tensors
            .iter()
            .map(|(k, v)| Ok((format!("{prefix}{k}"), v.to_dtype(dtype)?)))
            .collect()
    }

    /// Every 2D block weight as e4m3 codes, with a per-tensor `scale_weight` and the `scaled_fp8` marker when
    /// `scaled` (ComfyUI `scaled_fp8`), else plain casts with the blocks' biases and norm weights cast too
    /// (ComfyUI `fp8_e4m3fn`); and the same tensors dequantised by hand.
    fn fp8_file(
        tensors: &HashMap<String, Tensor>,
        scaled: bool,
    ) -> anyhow::Result<[HashMap<String, Tensor>; 2]> {
        let (mut fp8, mut reference) = (tensors.clone(), tensors.clone());
        for (k, v) in tensors {
            if !k.contains("transformer_blocks.") {
                continue;
            }
            if v.rank() != 2 || !k.ends_with(".weight") {
                if !scaled {
                    let cast = v.to_dtype(DType::F8E4M3)?;
                    reference.insert(k.clone(), cast.to_dtype(DType::F32)?);
                    fp8.insert(k.clone(), cast);
                }
                continue;
            }
            let values = v.flatten_all()?.to_vec1::<f32>()?;
            let scale = if scaled {
                values.iter().fold(0f32, |m, x| m.max(x.abs())) / 448.0
            } else {
                1.0
            };
            let codes: Vec<u8> = values.iter().map(|x| e4m3_encode(x / scale)).collect();
            let back: Vec<f32> = codes.iter().map(|&c| e4m3_decode(c) * scale).collect();
            let raw = Tensor::from_raw_buffer(&codes, DType::F8E4M3, v.dims(), &Device::Cpu)?;
            fp8.insert(k.clone(), raw);
            if scaled {
                let module = k.trim_end_matches(".weight");
                fp8.insert(
                    format!("{module}.scale_weight"),
                    Tensor::new(scale, &Device::Cpu)?,
                );
            }
            reference.insert(k.clone(), Tensor::from_vec(back, v.dims(), &Device::Cpu)?);
        }
        if scaled {
            let marker = Tensor::from_raw_buffer(&[0u8], DType::F8E4M3, &[1], &Device::Cpu)?;
            fp8.insert(SCALED_FP8_MARKER.into(), marker);
        }
        Ok([fp8, reference])
    }

    fn run(path: &Path, fp8: Option<Fp8Scale>, case: &Case) -> anyhow::Result<Tensor> {
        let model = load_dit(path, DType::F32, &Device::Cpu, fp8)?;
        Ok(model.forward(&case.model_inputs()?)?)
    }

    #[test]
    fn single_files_and_a_diffusers_folder_load_as_the_fixture() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let case = Case::load("t2i")?;
        let want = case.expected("out")?;
        let bare = save(dir.path(), "bare.safetensors", &case.weights)?;
        let comfy = converted(&case.weights, "model.diffusion_model.", DType::F32)?;
        let comfy = save(dir.path(), "qwen_image_f32.safetensors", &comfy)?;
        for path in [&bare, &comfy] {
            assert_close("out", &run(path, None, &case)?, want, 1e-4, 1e-4)?;
        }
        let folder = dir.path().join("Qwen-Image/transformer");
        std::fs::create_dir_all(&folder)?;
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
        config["_class_name"] = "QwenImageTransformer2DModel".into();
        std::fs::write(folder.join("config.json"), config.to_string())?;
        let from_folder = run(&dir.path().join("Qwen-Image"), None, &case)?;
        assert_close("out", &from_folder, want, 1e-4, 1e-4)?;
        // A bf16 file runs near the f32 reference, in f32.
        let bf16 = converted(&case.weights, "model.diffusion_model.", DType::BF16)?;
        let bf16 = save(dir.path(), "qwen_image_bf16.safetensors", &bf16)?;
        assert_close("bf16 file", &run(&bf16, None, &case)?, want, 5e-2, 5e-2)?;
        Ok(())
    }

    #[test]
    fn fp8_files_run_as_their_dequantised_weights_and_stay_fp8() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let case = Case::load("edit")?;
        let comfy = converted(&case.weights, "model.diffusion_model.", DType::F32)?;
        for (scaled, name) in [
            (false, "qwen_image_fp8_e4m3fn.safetensors"),
            (true, "qwen_image_fp8_e4m3fn_scaled.safetensors"),
        ] {
            let [fp8, reference] = fp8_file(&comfy, scaled)?;
            let fp8_path = save(dir.path(), name, &fp8)?;
            let ref_path = save(dir.path(), "reference.safetensors", &reference)?;
            let file = super::super::identify(&fp8_path)?;
            assert_eq!(file.scaled_fp8, scaled, "{name}");
            assert!(file.to_string().contains("float8_e4m3fn"), "{file}");
            let want = run(&ref_path, None, &case)?;
            assert_close(
                "dequantised",
                &run(&fp8_path, None, &case)?,
                &want,
                1e-5,
                1e-5,
            )?;
            let fp8 = Some(Fp8Scale::Tensor);
            assert_close(
                "kept in fp8",
                &run(&fp8_path, fp8, &case)?,
                &want,
                1e-4,
                1e-4,
            )?;
            // The file's block linears stay FP8 codes (nothing upcast); the embeddings and head are dense.
            let mut model = load_dit(&fp8_path, DType::F32, &Device::Cpu, fp8)?;
            let is_fp8 = |l: &Linear| matches!(l.base(), BaseWeight::Fp8(_));
            assert!(!is_fp8(&model.img_in) && !is_fp8(&model.proj_out));
            for (path, linear) in model.linears_mut() {
                assert!(is_fp8(linear), "{path} was upcast");
            }
        }
        // A bf16 file is quantised on load when asked.
        let bf16 = converted(&case.weights, "", DType::BF16)?;
        let bf16 = save(dir.path(), "qwen_image_bf16.safetensors", &bf16)?;
        let mut model = load_dit(&bf16, DType::BF16, &Device::Cpu, Some(Fp8Scale::Tensor))?;
        let (path, linear) = model
            .linears_mut()
            .into_iter()
            .next()
            .ok_or_else(|| anyhow::anyhow!("no linear"))?;
        assert!(matches!(linear.base(), BaseWeight::Fp8(_)), "{path}");
        Ok(())
    }

    #[test]
    fn a_damaged_file_and_another_model_are_named() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let case = Case::load("t2i")?;
        let mut damaged = case.weights.clone();
        damaged.remove("transformer_blocks.1.attn.to_add_out.weight");
        let path = save(dir.path(), "qwen_image_bf16.safetensors", &damaged)?;
        let err = load_dit(&path, DType::F32, &Device::Cpu, None)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("transformer_blocks.1.attn.to_add_out.weight")
                && err.ends_with(&path.display().to_string()),
            "{err}"
        );
        let wan = HashMap::from([(
            "blocks.0.self_attn.q.weight".to_string(),
            Tensor::zeros((4, 4), DType::F32, &Device::Cpu)?,
        )]);
        let path = save(dir.path(), "wan.safetensors", &wan)?;
        let err = load_dit(&path, DType::F32, &Device::Cpu, None)
            .err()
            .ok_or_else(|| anyhow::anyhow!("a Wan file loaded as Qwen-Image"))?;
        assert!(super::super::is_unrecognised(&err), "{err}");
        assert!(
            err.to_string().ends_with(&path.display().to_string()),
            "{err}"
        );
        Ok(())
    }

    #[test]
    fn streamed_blocks_load_from_the_file() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let case = Case::load("t2i")?;
        let path = save(dir.path(), "qwen_image.safetensors", &case.weights)?;
        let offload = OffloadOptions::default();
        let model = load_dit_streamed(
            &path,
            (DType::F32, &Device::Cpu),
            None,
            false,
            (&[0], &offload),
        )?;
        assert!(model.streamer().is_some_and(|s| s.is_streamed(0)));
        let out = model.forward(&case.model_inputs()?)?;
        assert_close("streamed", &out, case.expected("out")?, 1e-4, 1e-4)?;
        Ok(())
    }
}
