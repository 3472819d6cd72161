//! The Wan VAE from its weight files (read by [`crate::wan::weights::read_whole_file`]): official names at the
//! top level or under a known prefix, the variant told from the tensors. Errors name the file and say what it holds
//! when it is not what was asked for.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};

use super::{VaeConfig, VaeVariant, WanVae};
use crate::wan::weights::{read_whole_file, WeightsFileError};
use framesmith_nn::vb::Vb;

/// Prefixes under which other tools store the VAE's official keys.
const VAE_PREFIXES: [&str; 3] = ["first_stage_model.", "vae.", "model."];

/// Strips a known prefix when the official keys are not at the top level.
pub(super) fn strip_vae_prefix(tensors: HashMap<String, Tensor>) -> HashMap<String, Tensor> {
    if tensors.contains_key("decoder.conv1.weight") {
        return tensors;
    }
    for prefix in VAE_PREFIXES {
        if tensors.contains_key(&format!("{prefix}decoder.conv1.weight")) {
            return tensors
                .into_iter()
                .filter_map(|(k, v)| k.strip_prefix(prefix).map(|k| (k.to_string(), v)))
                .collect();
        }
    }
    tensors
}

/// The VAE architecture of a state dict (official names), from the encoder's input channels: 3 (Wan 2.1) or
/// 12 patchified channels (Wan 2.2). `None` when it is not a Wan VAE.
pub fn detect_vae_variant(tensors: &HashMap<String, Tensor>) -> Option<VaeVariant> {
    let conv = tensors.get("encoder.conv1.weight")?;
    match conv.dims() {
        [_, 3, 3, 3, 3] => Some(VaeVariant::Wan21),
        [_, 12, 3, 3, 3] => Some(VaeVariant::Wan22),
        _ => None,
    }
}

fn variant_name(v: VaeVariant) -> &'static str {
    match v {
        VaeVariant::Wan21 => "Wan 2.1 VAE (16 latent channels)",
        VaeVariant::Wan22 => "Wan 2.2 VAE (48 latent channels)",
    }
}

/// What a file that is not a Wan VAE seems to be, for the error message.
pub(super) fn describe_non_vae(tensors: &HashMap<String, Tensor>) -> String {
    let has = |p: &str| tensors.keys().any(|k| k.starts_with(p) || k.contains(p));
    if has("decoder.up_blocks.") || has("encoder.down_blocks.") {
        "this is a diffusers-format VAE; give the official Wan2.1_VAE.pth / Wan2.2_VAE.pth or a ComfyUI VAE file".into()
    } else if has("blocks.0.self_attn.") || has("patch_embedding.") {
        "this is a Wan diffusion model (DiT), not the VAE".into()
    } else if has("token_embedding.") || has("encoder.block.") || has("shared.weight") {
        "this is a T5 text encoder, not the VAE".into()
    } else {
        "this file holds no Wan VAE (no `encoder.conv1.weight` / `decoder.conv1.weight`)".into()
    }
}

/// Loads a Wan VAE of architecture `cfg` from `path` (official `.pth`, ComfyUI or other safetensors with the
/// official key names), converting weights to `dtype` on `device`.
pub fn load_vae(
    path: &Path,
    cfg: &VaeConfig,
    dtype: DType,
    device: &Device,
) -> Result<WanVae, WeightsFileError> {
    let tensors = strip_vae_prefix(read_whole_file(path)?);
    let wrong = |what: String| WeightsFileError::WrongModel {
        path: path.to_path_buf(),
        what,
    };
    let Some(found) = detect_vae_variant(&tensors) else {
        return Err(wrong(describe_non_vae(&tensors)));
    };
    if found != cfg.variant {
        return Err(wrong(format!(
            "this is a {}, but a {} was asked for",
            variant_name(found),
            variant_name(cfg.variant)
        )));
    }
    let vb = Vb::from_tensors(tensors, dtype, device);
    WanVae::new(cfg, &vb).map_err(|e| WeightsFileError::Mismatch {
        path: path.to_path_buf(),
        model: variant_name(cfg.variant),
        detail: format!("{e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use framesmith_nn::testing::zero_tensors as tensors;

    #[test]
    fn unreadable_files_name_the_path() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let missing = dir.path().join("absent.safetensors");
        let e = read_whole_file(&missing)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("not found") && e.contains("absent.safetensors"),
            "{e}"
        );
        let message = |name: &str, bytes: &[u8]| -> anyhow::Result<String> {
            let path = dir.path().join(name);
            std::fs::write(&path, bytes)?;
            let e = read_whole_file(&path).err().map(|e| e.to_string());
            let e = e.unwrap_or_default();
            assert!(e.contains(name), "{e}");
            Ok(e)
        };
        assert!(message("junk.safetensors", b"not a tensor file")?
            .contains("a text file (it starts with \"not a tensor file\")"));
        assert!(message(
            "Wan2.1_VAE.pth",
            b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\n"
        )?
        .contains("Git LFS pointer"));
        assert!(message("vae.safetensors", b"<!DOCTYPE html><html>")?.contains("web page"));
        assert!(message("empty.pth", b"")?.contains("the file is empty"));
        let e = message(
            "noise.bin",
            &[0xb7, 0xe2, 0x38, 0x05, 0x0e, 0x36, 0xc9, 0x19, 0x00],
        )?;
        assert!(
            e.contains("this PyTorch file cannot be read"),
            "a .bin is read as a PyTorch file, whose reader fails: {e}"
        );
        let e = message(
            "noise.weights",
            &[0xb7, 0xe2, 0x38, 0x05, 0x0e, 0x36, 0xc9, 0x19],
        )?;
        assert!(e.contains("its first bytes are b7 e2 38 05"), "{e}");
        Ok(())
    }

    /// `protocol4.pth` is a zip archive like torch.save's whose `data.pkl` was written by Python's pickle with
    /// protocol 4 (its FRAME op-code, 149, is one candle's reader does not know).
    #[test]
    fn pickles_the_safe_reader_cannot_read_are_explained() -> anyhow::Result<()> {
        let testdata =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/wan/vae/testdata");
        let message = |path: &Path| {
            read_whole_file(path)
                .err()
                .map(|e| format!("{:#}", anyhow::Error::from(e)))
                .unwrap_or_default()
        };
        let e = message(&testdata.join("protocol4.pth"));
        assert!(
            e.contains("op-code 149 (FRAME, from pickle protocol 4 or newer)")
                && e.contains("convert it to .safetensors")
                && e.ends_with("protocol4.pth"),
            "{e}"
        );
        assert!(!e.contains('\n') && !e.contains("unknown op-code"), "{e}");

        let dir = tempfile::tempdir()?;
        let legacy = dir.path().join("Wan2.1_VAE.pth");
        std::fs::write(
            &legacy,
            [0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20],
        )?;
        let e = message(&legacy);
        assert!(
            e.contains("legacy PyTorch pickle") && e.ends_with("Wan2.1_VAE.pth"),
            "{e}"
        );
        Ok(())
    }

    #[test]
    fn the_content_decides_the_reader_not_the_extension() -> anyhow::Result<()> {
        let testdata =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/wan/vae/testdata");
        let dir = tempfile::tempdir()?;
        let renamed = dir.path().join("plain.safetensors");
        std::fs::copy(testdata.join("plain.pth"), &renamed)?;
        assert_eq!(read_whole_file(&renamed)?.len(), 3);
        let st = dir.path().join("weights.pth");
        candle_core::safetensors::save(&tensors(&[("a", &[2, 2])])?, &st)?;
        assert_eq!(read_whole_file(&st)?.len(), 1);
        Ok(())
    }

    /// `plain.pth` / `nested.pth` were written by `torch.save` (PyTorch 2.11) from a state dict with f32 and bf16
    /// tensors, the second under a `state_dict` entry as training checkpoints store it.
    #[test]
    fn pytorch_pth_files_are_read() -> anyhow::Result<()> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/wan/vae/testdata");
        for name in ["plain.pth", "nested.pth"] {
            let t = read_whole_file(&dir.join(name))?;
            assert_eq!(t.len(), 3, "{name}");
            let conv = &t["encoder.conv1.weight"];
            assert_eq!(conv.dims(), &[2, 3, 3, 3, 3]);
            let v = conv.flatten_all()?.to_vec1::<f32>()?;
            assert!(v
                .iter()
                .enumerate()
                .all(|(i, x)| (x - i as f32 / 10.0).abs() < 1e-6));
            let q = &t["blocks.0.attn.q.weight"];
            assert_eq!((q.dtype(), q.dims()), (DType::BF16, &[2usize, 4][..]));
            let qv = q.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
            assert_eq!(qv, (0..8).map(|i| i as f32 / 4.0).collect::<Vec<_>>());
            assert_eq!(detect_vae_variant(&t), Some(VaeVariant::Wan21));
        }
        Ok(())
    }

    #[test]
    fn variants_and_foreign_files_are_told_apart() -> anyhow::Result<()> {
        let wan22 = tensors(&[
            ("encoder.conv1.weight", &[8, 12, 3, 3, 3]),
            ("decoder.conv1.weight", &[1]),
        ])?;
        assert_eq!(detect_vae_variant(&wan22), Some(VaeVariant::Wan22));
        let prefixed = strip_vae_prefix(tensors(&[
            ("vae.encoder.conv1.weight", &[8, 3, 3, 3, 3]),
            ("vae.decoder.conv1.weight", &[1]),
        ])?);
        assert_eq!(detect_vae_variant(&prefixed), Some(VaeVariant::Wan21));
        let dit = tensors(&[("blocks.0.self_attn.q.weight", &[2, 2])])?;
        assert!(describe_non_vae(&dit).contains("diffusion model"));

        let dir = tempfile::tempdir()?;
        let path = dir.path().join("wan22.safetensors");
        candle_core::safetensors::save(&wan22, &path)?;
        let err = load_vae(&path, &VaeConfig::wan21(), DType::F32, &Device::Cpu).err();
        let msg = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            msg.contains("Wan 2.2 VAE")
                && msg.contains("Wan 2.1 VAE (16 latent channels) was asked for"),
            "{msg}"
        );
        assert!(msg.contains("wan22.safetensors"), "{msg}");
        Ok(())
    }

    #[test]
    fn fixture_weights_load_and_a_size_mismatch_names_the_file() -> anyhow::Result<()> {
        let path = crate::fixtures::wan_case("wan21_vae_tiny").join("weights.safetensors");
        let tiny = VaeConfig {
            dim: 8,
            dec_dim: 8,
            dim_mult: vec![1, 2, 2, 2],
            num_res_blocks: 1,
            ..VaeConfig::wan21()
        };
        let vae = load_vae(&path, &tiny, DType::F32, &Device::Cpu)?;
        assert_eq!(vae.config().z_dim, 16);
        let msg = load_vae(&path, &VaeConfig::wan21(), DType::F32, &Device::Cpu)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            msg.contains("do not fit the Wan 2.1 VAE") && msg.contains("weights.safetensors"),
            "{msg}"
        );
        Ok(())
    }
}
