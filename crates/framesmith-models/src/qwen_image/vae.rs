//! Qwen-Image's VAE (diffusers' `AutoencoderKLQwenImage`): the Wan 2.1 causal VAE architecture used on single
//! frames, built through the shared entry point [`crate::wan::vae::vae_from_tensors`], with Qwen-Image's latent
//! normalisation kept here. Reads ComfyUI's `qwen_image_vae.safetensors` (the official Wan names: `encoder.conv1`,
//! `encoder.downsamples.*`, `conv1`, `conv2`, …) and diffusers' `vae/` folder or file (`encoder.conv_in`,
//! `encoder.down_blocks.*`, `quant_conv`, `decoder.up_blocks.*`, …), whose names are mapped to the official ones
//! (the inverse of musubi-tuner's `convert_comfyui_state_dict`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Result, Tensor};

use crate::wan::vae::{vae_from_tensors, LatentStats, VaeVariant, WanVae};
use crate::wan::weights::{read_header, read_whole_file, WeightsFileError};

/// diffusers' `latents_mean` of Qwen-Image's VAE (`vae/config.json`).
pub const LATENTS_MEAN: [f32; 16] = [
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508, 0.4134, -0.0715, 0.5517,
    -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
];
/// diffusers' `latents_std` of Qwen-Image's VAE.
pub const LATENTS_STD: [f32; 16] = [
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743, 3.2687, 2.1526, 2.8652, 1.5579,
    1.6382, 1.1253, 2.8251, 1.9160,
];

/// Latent channels of Qwen-Image's VAE.
pub const LATENT_CHANNELS: usize = 16;

/// The weights file of a diffusers folder (the pipeline's root or its `vae/`), else `path` itself.
fn weights_file(path: &Path) -> PathBuf {
    if !path.is_dir() {
        return path.to_path_buf();
    }
    let name = "diffusion_pytorch_model.safetensors";
    [path.join("vae").join(name), path.join(name)]
        .into_iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| path.join("vae").join(name))
}

/// The official name of a residual block's layer from diffusers' (`norm1` → `residual.0`, …).
fn residual_layer(layer: &str) -> Option<&'static str> {
    Some(match layer {
        "norm1" => "residual.0",
        "conv1" => "residual.2",
        "norm2" => "residual.3",
        "conv2" => "residual.6",
        "conv_shortcut" => "shortcut",
        _ => return None,
    })
}

/// `rest` (`0.norm1.gamma`) of a diffusers residual block list as the official `residual.0.gamma` under index `at`.
fn residual_name(prefix: &str, at: usize, rest: &str) -> Option<String> {
    let (layer, param) = rest.rsplit_once('.')?;
    Some(format!("{prefix}.{at}.{}.{param}", residual_layer(layer)?))
}

/// One diffusers name as the official one; `resnets` is the residual blocks per decoder stage. `None`: not a
/// diffusers name this architecture has.
fn official_name(name: &str, resnets: usize) -> Option<String> {
    let split = |s: &str| -> Option<(usize, String)> {
        let (i, rest) = s.split_once('.')?;
        Some((i.parse().ok()?, rest.to_string()))
    };
    if let Some(rest) = name.strip_prefix("quant_conv.") {
        return Some(format!("conv1.{rest}"));
    }
    if let Some(rest) = name.strip_prefix("post_quant_conv.") {
        return Some(format!("conv2.{rest}"));
    }
    let (side, rest) = name.split_once('.')?;
    if side != "encoder" && side != "decoder" {
        return None;
    }
    if let Some(r) = rest.strip_prefix("conv_in.") {
        return Some(format!("{side}.conv1.{r}"));
    }
    if let Some(r) = rest.strip_prefix("norm_out.") {
        return Some(format!("{side}.head.0.{r}"));
    }
    if let Some(r) = rest.strip_prefix("conv_out.") {
        return Some(format!("{side}.head.2.{r}"));
    }
    if let Some(r) = rest.strip_prefix("mid_block.attentions.0.") {
        return Some(format!("{side}.middle.1.{r}"));
    }
    if let Some(r) = rest.strip_prefix("mid_block.resnets.") {
        let (i, r) = split(r)?;
        return residual_name(&format!("{side}.middle"), 2 * i, &r);
    }
    if let Some(r) = rest.strip_prefix("down_blocks.") {
        let (i, r) = split(r)?;
        if r.starts_with("resample.") || r.starts_with("time_conv.") {
            return Some(format!("encoder.downsamples.{i}.{r}"));
        }
        return residual_name("encoder.downsamples", i, &r);
    }
    let (stage, r) = split(rest.strip_prefix("up_blocks.")?)?;
    let first = stage * (resnets + 1);
    if let Some(r) = r.strip_prefix("upsamplers.0.") {
        return Some(format!("decoder.upsamples.{}.{r}", first + resnets));
    }
    let (i, r) = split(r.strip_prefix("resnets.")?)?;
    residual_name("decoder.upsamples", first + i, &r)
}

/// `tensors` with diffusers' names (`encoder.conv_in.weight`) under the official ones; official names pass
/// through. A name of neither kind is kept, so the builder names it as missing or unused.
pub fn official_names(tensors: HashMap<String, Tensor>) -> HashMap<String, Tensor> {
    if !tensors.contains_key("encoder.conv_in.weight") {
        return tensors;
    }
    let resnets = tensors
        .keys()
        .filter_map(|k| k.strip_prefix("decoder.up_blocks.0.resnets."))
        .filter_map(|r| r.split_once('.')?.0.parse::<usize>().ok())
        .max()
        .map_or(0, |i| i + 1);
    tensors
        .into_iter()
        .map(|(k, v)| (official_name(&k, resnets).unwrap_or(k), v))
        .collect()
}

/// Whether `path` holds a causal video VAE in diffusers' names (a 3D `encoder.conv_in.weight`: a Qwen-Image `vae/`
/// file or the folder holding it; FLUX.1's 2D autoencoder is not), read from the safetensors header alone. ComfyUI's `qwen_image_vae.safetensors` has Wan 2.1's
/// official names and cannot be told from Wan's VAE by its tensors.
pub fn is_diffusers_layout(path: &Path) -> bool {
    read_header(&weights_file(path)).is_ok_and(|h| {
        h.tensors
            .iter()
            .any(|t| t.name.ends_with("encoder.conv_in.weight") && t.shape.len() == 5)
    })
}

/// Qwen-Image's VAE and its latent normalisation.
pub struct QwenImageVae {
    vae: WanVae,
    stats: LatentStats,
}

impl QwenImageVae {
    /// Qwen-Image's normalisation on `vae` (a Wan 2.1-architecture VAE of 16 latent channels).
    pub fn new(vae: WanVae, device: &Device) -> Result<Self> {
        let c = vae.config();
        if c.variant != VaeVariant::Wan21 || c.z_dim != LATENT_CHANNELS {
            candle_core::bail!(
                "Qwen-Image's VAE is the Wan 2.1 architecture with {LATENT_CHANNELS} latent channels, not {} with {}",
                if c.variant == VaeVariant::Wan22 { "Wan 2.2's" } else { "this" },
                c.z_dim
            );
        }
        let inv: Vec<f32> = LATENTS_STD.iter().map(|s| 1.0 / s).collect();
        let stats = LatentStats {
            mean: Tensor::new(&LATENTS_MEAN, device)?,
            inv_std: Tensor::new(inv.as_slice(), device)?,
        };
        Ok(Self { vae, stats })
    }

    /// Pixels per latent pixel along height and width (8).
    pub fn spatial_factor(&self) -> usize {
        self.vae.config().spatial_factor()
    }

    /// The normalised latents [b, 16, 1, h/8, w/8] of `images` [b, 3, h, w] in [−1, 1]: the posterior's mode, as
    /// musubi-tuner's `encode_pixels_to_latents` caches them.
    pub fn encode(&self, images: &Tensor) -> Result<Tensor> {
        self.vae.encode(&images.unsqueeze(2)?, &self.stats)
    }

    /// Images [b, 3, h, w] (about [−1, 1], not clamped) from normalised latents [b, 16, 1, h, w].
    pub fn decode(&self, latents: &Tensor) -> Result<Tensor> {
        self.vae.decode(latents, &self.stats)?.squeeze(2)
    }
}

/// Loads Qwen-Image's VAE from `path` (ComfyUI's `qwen_image_vae.safetensors`, a diffusers `vae/` weights file, or
/// the folder holding it) in `dtype` on `device`.
pub fn load_vae(
    path: &Path,
    dtype: DType,
    device: &Device,
) -> std::result::Result<QwenImageVae, WeightsFileError> {
    let file = weights_file(path);
    let tensors = official_names(read_whole_file(&file)?);
    let vae = vae_from_tensors(tensors, &file, dtype, device)?;
    QwenImageVae::new(vae, device).map_err(|e| WeightsFileError::WrongModel {
        path: file,
        what: format!("{e}; give qwen_image_vae.safetensors"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{assert_close, wan_case};
    use crate::wan::vae::load_vae_auto;
    use framesmith_nn::init::randn;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    /// The diffusers name of an official one, written from diffusers' module tree (`resnets` per decoder stage).
    fn diffusers_name(name: &str, resnets: usize) -> String {
        let (module, param) = name.rsplit_once('.').unwrap_or((name, ""));
        let parts: Vec<&str> = module.split('.').collect();
        fn res(l: &str) -> &str {
            match l {
                "residual.0" => "norm1",
                "residual.2" => "conv1",
                "residual.3" => "norm2",
                "residual.6" => "conv2",
                "shortcut" => "conv_shortcut",
                other => other,
            }
        }
        let joined = |from: usize| parts[from..].join(".");
        let module = match parts.as_slice() {
            ["conv1"] => "quant_conv".to_string(),
            ["conv2"] => "post_quant_conv".to_string(),
            [side, "conv1"] => format!("{side}.conv_in"),
            [side, "head", "0"] => format!("{side}.norm_out"),
            [side, "head", "2"] => format!("{side}.conv_out"),
            [side, "middle", "1", ..] => format!("{side}.mid_block.attentions.0.{}", joined(3)),
            [side, "middle", i, ..] => format!(
                "{side}.mid_block.resnets.{}.{}",
                i.parse::<usize>().unwrap_or(0) / 2,
                res(&joined(3))
            ),
            ["encoder", "downsamples", i, ..] => {
                format!("encoder.down_blocks.{i}.{}", res(&joined(3)))
            }
            ["decoder", "upsamples", i, ..] => {
                let i: usize = i.parse().unwrap_or(0);
                let (stage, at) = (i / (resnets + 1), i % (resnets + 1));
                if at == resnets {
                    format!("decoder.up_blocks.{stage}.upsamplers.0.{}", joined(3))
                } else {
                    format!("decoder.up_blocks.{stage}.resnets.{at}.{}", res(&joined(3)))
                }
            }
            _ => module.to_string(),
        };
        format!("{module}.{param}")
    }

    #[test]
    fn diffusers_names_map_as_musubi_tuners_table() {
        // Entries of musubi-tuner's `convert_comfyui_state_dict` (the released VAE: 3 residual blocks a stage).
        for (diffusers, official) in [
            ("quant_conv.weight", "conv1.weight"),
            ("post_quant_conv.bias", "conv2.bias"),
            ("decoder.conv_in.weight", "decoder.conv1.weight"),
            ("decoder.norm_out.gamma", "decoder.head.0.gamma"),
            ("encoder.conv_out.bias", "encoder.head.2.bias"),
            (
                "decoder.mid_block.resnets.1.norm2.gamma",
                "decoder.middle.2.residual.3.gamma",
            ),
            (
                "encoder.mid_block.attentions.0.to_qkv.weight",
                "encoder.middle.1.to_qkv.weight",
            ),
            (
                "decoder.up_blocks.2.resnets.2.norm1.gamma",
                "decoder.upsamples.10.residual.0.gamma",
            ),
            (
                "decoder.up_blocks.1.upsamplers.0.time_conv.weight",
                "decoder.upsamples.7.time_conv.weight",
            ),
            (
                "decoder.up_blocks.3.resnets.0.conv1.weight",
                "decoder.upsamples.12.residual.2.weight",
            ),
            (
                "decoder.up_blocks.1.resnets.0.conv_shortcut.bias",
                "decoder.upsamples.4.shortcut.bias",
            ),
            (
                "encoder.down_blocks.5.resample.1.weight",
                "encoder.downsamples.5.resample.1.weight",
            ),
            (
                "encoder.down_blocks.6.conv_shortcut.weight",
                "encoder.downsamples.6.shortcut.weight",
            ),
        ] {
            assert_eq!(
                official_name(diffusers, 3).as_deref(),
                Some(official),
                "{diffusers}"
            );
            assert_eq!(diffusers_name(official, 3), diffusers, "{official}");
        }
        assert_eq!(official_name("decoder.up_blocks.x.resnets", 3), None);
    }

    #[test]
    fn comfyui_and_diffusers_layouts_load_the_same_vae() -> anyhow::Result<()> {
        let fixture = wan_case("wan21_vae_tiny").join("weights.safetensors");
        let official = candle_core::safetensors::load(&fixture, &Device::Cpu)?;
        let dir = tempfile::tempdir()?;
        let comfy = dir.path().join("qwen_image_vae.safetensors");
        std::fs::copy(&fixture, &comfy)?;
        // The fixture has one residual block a stage: two a decoder stage.
        let renamed: HashMap<String, Tensor> = official
            .iter()
            .map(|(k, v)| (diffusers_name(k, 2), v.clone()))
            .collect();
        assert!(renamed.contains_key("encoder.conv_in.weight"));
        assert_eq!(renamed.len(), official.len());
        let folder = dir.path().join("Qwen-Image").join("vae");
        std::fs::create_dir_all(&folder)?;
        candle_core::safetensors::save(
            &renamed,
            folder.join("diffusion_pytorch_model.safetensors"),
        )?;

        let dev = Device::Cpu;
        let z = randn(
            &mut StdRng::seed_from_u64(5),
            (1, 16, 1, 4, 4),
            0.0,
            1.0,
            &dev,
        )?;
        let reference = QwenImageVae::new(load_vae_auto(&fixture, DType::F32, &dev)?, &dev)?;
        let want = reference.decode(&z)?;
        assert_eq!(want.dims(), &[1, 3, 32, 32]);
        assert!(!is_diffusers_layout(&comfy));
        let flux_ae = crate::fixtures::case_dir("flux", "flux_ae").join("weights.safetensors");
        assert!(
            !is_diffusers_layout(&flux_ae),
            "FLUX.1's autoencoder is not Qwen-Image's"
        );
        assert!(
            is_diffusers_layout(&folder) && is_diffusers_layout(&dir.path().join("Qwen-Image"))
        );
        for path in [comfy, dir.path().join("Qwen-Image"), folder] {
            let vae = load_vae(&path, DType::F32, &dev)?;
            assert_close("decoded", &vae.decode(&z)?, &want, 0.0, 0.0)?;
            let latents = vae.encode(&want.clamp(-1f32, 1f32)?)?;
            assert_eq!(latents.dims(), &[1, 16, 1, 4, 4]);
        }
        Ok(())
    }

    #[test]
    fn the_normalisation_is_qwen_images() -> anyhow::Result<()> {
        let dev = Device::Cpu;
        let fixture = wan_case("wan21_vae_tiny").join("weights.safetensors");
        let vae = QwenImageVae::new(load_vae_auto(&fixture, DType::F32, &dev)?, &dev)?;
        // Channel c of a latent z decodes as the raw latent z·std[c] + mean[c].
        let z = Tensor::zeros((1, 16, 1, 2, 2), DType::F32, &dev)?;
        let raw = Tensor::new(&LATENTS_MEAN, &dev)?.reshape((1, 16, 1, 1, 1))?;
        let raw = raw.broadcast_as((1, 16, 1, 2, 2))?.contiguous()?;
        let inner = load_vae_auto(&fixture, DType::F32, &dev)?;
        let want = inner.decode_raw(&raw)?.squeeze(2)?;
        assert_close("mean", &vae.decode(&z)?, &want, 1e-6, 1e-6)?;
        let wan22 = wan_case("wan22_vae_tiny").join("weights.safetensors");
        let err = load_vae(&wan22, DType::F32, &dev)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("Wan 2.1 architecture") && err.ends_with("weights.safetensors"),
            "{err}"
        );
        Ok(())
    }
}
