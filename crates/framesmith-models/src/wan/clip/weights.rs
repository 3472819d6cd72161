//! Reading the CLIP visual tower from the files users have: Wan's official
//! `models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth` (both towers; only `visual.*` is read, tensor by
//! tensor, so the text tower never enters memory), the same keys in safetensors, open_clip's own layout
//! (`visual.conv1`, `visual.transformer.resblocks.*`) and Hugging Face / ComfyUI `clip_vision_h.safetensors`
//! (`vision_model.*`). Everything is renamed to Wan's keys.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};

use super::{ClipVision, ClipVisionConfig};
use crate::wan::weights::{read_whole_file, WeightsFileError};
use framesmith_nn::vb::Vb;

/// What the CLI tells users to give: the two files that hold this encoder.
const CLIP_FILES: &str =
    "give models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth from the Wan2.1 I2V \
                          folder or ComfyUI's clip_vision_h.safetensors";

/// Reads only the tensors whose names start with one of `prefixes` (all when empty) from a `.pth` file, looking
/// under a `state_dict` / `model` entry when the top level holds none.
fn read_pth_selected(
    path: &Path,
    prefixes: &[&str],
) -> candle_core::Result<HashMap<String, Tensor>> {
    let mut pth = candle_core::pickle::PthTensors::new(path, None)?;
    for key in ["state_dict", "model"] {
        if !pth.tensor_infos().is_empty() {
            break;
        }
        pth = candle_core::pickle::PthTensors::new(path, Some(key))?;
    }
    let names: Vec<String> = pth
        .tensor_infos()
        .keys()
        .filter(|k| prefixes.is_empty() || prefixes.iter().any(|p| k.starts_with(p)))
        .cloned()
        .collect();
    let mut out = HashMap::with_capacity(names.len());
    for name in names {
        if let Some(t) = pth.get(&name)? {
            out.insert(name, t);
        }
    }
    Ok(out)
}

/// The tensors of `path` that can belong to a visual tower.
fn read_visual(path: &Path) -> Result<HashMap<String, Tensor>, WeightsFileError> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    if path.is_file() && matches!(ext.as_str(), "pth" | "pt" | "ckpt" | "bin") {
        let selected = read_pth_selected(path, &["visual.", "vision_model."])
            .map_err(|e| WeightsFileError::read(path, &e))?;
        if !selected.is_empty() {
            return Ok(selected);
        }
    }
    read_whole_file(path)
}

/// Renames `from` to `to` when present.
fn rename(
    t: &mut HashMap<String, Tensor>,
    out: &mut HashMap<String, Tensor>,
    from: &str,
    to: &str,
) {
    if let Some(v) = t.remove(from) {
        out.insert(to.to_string(), v);
    }
}

/// open_clip's layout (`visual.conv1`, `class_embedding` [d], `positional_embedding` [n, d], `ln_pre`,
/// `transformer.resblocks.{i}.{ln_1,attn.in_proj_*,attn.out_proj,ln_2,mlp.c_fc,mlp.c_proj}`) in Wan's names.
fn from_open_clip(mut t: HashMap<String, Tensor>) -> candle_core::Result<HashMap<String, Tensor>> {
    let mut out = HashMap::new();
    rename(
        &mut t,
        &mut out,
        "visual.conv1.weight",
        "patch_embedding.weight",
    );
    if let Some(cls) = t.remove("visual.class_embedding") {
        out.insert("cls_embedding".into(), cls.reshape((1, 1, ()))?);
    }
    if let Some(pos) = t.remove("visual.positional_embedding") {
        out.insert("pos_embedding".into(), pos.unsqueeze(0)?);
    }
    for p in ["weight", "bias"] {
        rename(
            &mut t,
            &mut out,
            &format!("visual.ln_pre.{p}"),
            &format!("pre_norm.{p}"),
        );
    }
    for i in 0.. {
        let src = format!("visual.transformer.resblocks.{i}");
        if !t.contains_key(&format!("{src}.attn.in_proj_weight")) {
            break;
        }
        let dst = format!("transformer.{i}");
        rename(
            &mut t,
            &mut out,
            &format!("{src}.attn.in_proj_weight"),
            &format!("{dst}.attn.to_qkv.weight"),
        );
        rename(
            &mut t,
            &mut out,
            &format!("{src}.attn.in_proj_bias"),
            &format!("{dst}.attn.to_qkv.bias"),
        );
        for (a, b) in [
            ("ln_1", "norm1"),
            ("ln_2", "norm2"),
            ("attn.out_proj", "attn.proj"),
            ("mlp.c_fc", "mlp.0"),
            ("mlp.c_proj", "mlp.2"),
        ] {
            for p in ["weight", "bias"] {
                rename(
                    &mut t,
                    &mut out,
                    &format!("{src}.{a}.{p}"),
                    &format!("{dst}.{b}.{p}"),
                );
            }
        }
    }
    Ok(out)
}

/// Hugging Face `CLIPVisionModel` names (ComfyUI's `clip_vision_h.safetensors`) in Wan's names; the separate
/// q, k, v projections are stacked into `to_qkv`.
fn from_hugging_face(
    mut t: HashMap<String, Tensor>,
) -> candle_core::Result<HashMap<String, Tensor>> {
    let mut out = HashMap::new();
    let pre = "vision_model.";
    rename(
        &mut t,
        &mut out,
        &format!("{pre}embeddings.patch_embedding.weight"),
        "patch_embedding.weight",
    );
    if let Some(cls) = t.remove(&format!("{pre}embeddings.class_embedding")) {
        out.insert("cls_embedding".into(), cls.reshape((1, 1, ()))?);
    }
    if let Some(pos) = t.remove(&format!("{pre}embeddings.position_embedding.weight")) {
        out.insert("pos_embedding".into(), pos.unsqueeze(0)?);
    }
    for p in ["weight", "bias"] {
        // "layrnorm" is Hugging Face's spelling.
        rename(
            &mut t,
            &mut out,
            &format!("{pre}pre_layrnorm.{p}"),
            &format!("pre_norm.{p}"),
        );
    }
    for i in 0.. {
        let src = format!("{pre}encoder.layers.{i}");
        if !t.contains_key(&format!("{src}.self_attn.q_proj.weight")) {
            break;
        }
        let dst = format!("transformer.{i}");
        for p in ["weight", "bias"] {
            let parts = ["q_proj", "k_proj", "v_proj"]
                .iter()
                .filter_map(|n| t.remove(&format!("{src}.self_attn.{n}.{p}")))
                .collect::<Vec<_>>();
            if parts.len() == 3 {
                out.insert(format!("{dst}.attn.to_qkv.{p}"), Tensor::cat(&parts, 0)?);
            }
            for (a, b) in [
                ("layer_norm1", "norm1"),
                ("layer_norm2", "norm2"),
                ("self_attn.out_proj", "attn.proj"),
                ("mlp.fc1", "mlp.0"),
                ("mlp.fc2", "mlp.2"),
            ] {
                rename(
                    &mut t,
                    &mut out,
                    &format!("{src}.{a}.{p}"),
                    &format!("{dst}.{b}.{p}"),
                );
            }
        }
    }
    Ok(out)
}

/// The visual tower's tensors under Wan's names (`patch_embedding.weight`, `transformer.0.attn.to_qkv.weight`,
/// ...), from any supported layout; `None` when the file holds no CLIP visual tower.
fn wan_visual_keys(
    tensors: HashMap<String, Tensor>,
) -> candle_core::Result<Option<HashMap<String, Tensor>>> {
    let has = |k: &str| tensors.contains_key(k);
    if has("visual.patch_embedding.weight") {
        return Ok(Some(
            tensors
                .into_iter()
                .filter_map(|(k, v)| k.strip_prefix("visual.").map(|k| (k.to_string(), v)))
                .collect(),
        ));
    }
    if has("patch_embedding.weight") && has("transformer.0.attn.to_qkv.weight") {
        return Ok(Some(tensors));
    }
    if has("visual.conv1.weight") {
        return from_open_clip(tensors).map(Some);
    }
    if has("vision_model.embeddings.patch_embedding.weight") {
        return from_hugging_face(tensors).map(Some);
    }
    Ok(None)
}

/// What a file that holds no CLIP visual tower seems to be.
fn describe_non_clip(tensors: &HashMap<String, Tensor>) -> String {
    let has = |p: &str| tensors.keys().any(|k| k.starts_with(p));
    let what = if has("blocks.0.self_attn.") || has("model.diffusion_model.") {
        "this is a Wan diffusion model (DiT), not the CLIP image encoder"
    } else if has("decoder.conv1.") || has("encoder.conv1.") {
        "this is a VAE, not the CLIP image encoder"
    } else if has("token_embedding.") || has("shared.weight") || has("encoder.block.") {
        "this is a T5 text encoder, not the CLIP image encoder"
    } else if has("textual.") || has("text_model.") {
        "this file holds a CLIP text tower but no visual tower"
    } else {
        "this file holds no CLIP visual tower (no `visual.patch_embedding.weight`)"
    };
    format!("{what}; {CLIP_FILES}")
}

/// Loads the CLIP visual tower of architecture `cfg` from `path`, converting weights to `dtype` on `device`.
/// Errors name the file and say which file to give instead.
pub fn load_clip_vision(
    path: &Path,
    cfg: &ClipVisionConfig,
    dtype: DType,
    device: &Device,
) -> Result<ClipVision, WeightsFileError> {
    let tensors = read_visual(path)?;
    let described = describe_non_clip(&tensors);
    let wan = wan_visual_keys(tensors).map_err(|e| WeightsFileError::read(path, &e))?;
    let Some(wan) = wan else {
        return Err(WeightsFileError::WrongModel {
            path: path.to_path_buf(),
            what: described,
        });
    };
    let vb = Vb::from_tensors(wan, dtype, device);
    ClipVision::new(cfg, &vb).map_err(|e| WeightsFileError::Mismatch {
        path: path.to_path_buf(),
        model: "CLIP image encoder (open-clip ViT-H/14)",
        // The first line only: with RUST_BACKTRACE set, candle appends a backtrace.
        detail: format!(
            "{}; {CLIP_FILES}",
            e.to_string().lines().next().unwrap_or_default()
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use framesmith_nn::testing::zero_tensors as zeros;

    #[test]
    fn hugging_face_qkv_are_stacked_in_order() -> anyhow::Result<()> {
        let dev = Device::Cpu;
        let mut t = zeros(&[(
            "vision_model.embeddings.patch_embedding.weight",
            &[4, 3, 2, 2],
        )])?;
        for (i, n) in ["q_proj", "k_proj", "v_proj"].iter().enumerate() {
            let pre = format!("vision_model.encoder.layers.0.self_attn.{n}");
            t.insert(
                format!("{pre}.weight"),
                Tensor::full(i as f32, (4, 4), &dev)?,
            );
            t.insert(format!("{pre}.bias"), Tensor::full(i as f32, 4, &dev)?);
        }
        t.insert(
            "vision_model.embeddings.class_embedding".into(),
            Tensor::zeros(4, DType::F32, &dev)?,
        );
        let wan = wan_visual_keys(t)?.unwrap_or_default();
        let qkv = wan["transformer.0.attn.to_qkv.weight"].to_vec2::<f32>()?;
        assert_eq!(qkv.len(), 12);
        assert_eq!((qkv[0][0], qkv[4][0], qkv[8][0]), (0.0, 1.0, 2.0));
        assert_eq!(wan["transformer.0.attn.to_qkv.bias"].dims(), &[12]);
        assert_eq!(wan["cls_embedding"].dims(), &[1, 1, 4]);
        assert!(wan.contains_key("patch_embedding.weight"));
        Ok(())
    }

    #[test]
    fn open_clip_layout_is_renamed() -> anyhow::Result<()> {
        let t = zeros(&[
            ("visual.conv1.weight", &[4, 3, 2, 2]),
            ("visual.positional_embedding", &[5, 4]),
            (
                "visual.transformer.resblocks.0.attn.in_proj_weight",
                &[12, 4],
            ),
            ("visual.transformer.resblocks.0.mlp.c_fc.weight", &[8, 4]),
        ])?;
        let wan = wan_visual_keys(t)?.unwrap_or_default();
        assert_eq!(wan["pos_embedding"].dims(), &[1, 5, 4]);
        assert!(wan.contains_key("transformer.0.attn.to_qkv.weight"));
        assert!(wan.contains_key("transformer.0.mlp.0.weight"));
        Ok(())
    }

    #[test]
    fn foreign_files_say_what_they_are_and_what_to_give() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("umt5.safetensors");
        candle_core::safetensors::save(&zeros(&[("token_embedding.weight", &[4, 2])])?, &path)?;
        let msg = load_clip_vision(&path, &ClipVisionConfig::tiny(), DType::F32, &Device::Cpu)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            msg.contains("T5 text encoder")
                && msg.contains("clip_vision_h")
                && msg.contains("umt5.safetensors"),
            "{msg}"
        );
        let missing = dir.path().join("absent.pth");
        let msg = load_clip_vision(
            &missing,
            &ClipVisionConfig::tiny(),
            DType::F32,
            &Device::Cpu,
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(
            msg.contains("not found") && msg.contains("absent.pth"),
            "{msg}"
        );
        Ok(())
    }

    /// `plain.pth` (written by `torch.save`) holds `encoder.conv1.weight`, `decoder.conv1.weight` and
    /// `blocks.0.attn.q.weight`: only the selected one is read.
    #[test]
    fn pth_tensors_are_read_selectively() -> anyhow::Result<()> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/wan/vae/testdata/plain.pth");
        let t = read_pth_selected(&path, &["blocks."])?;
        assert_eq!(t.keys().collect::<Vec<_>>(), vec!["blocks.0.attn.q.weight"]);
        assert_eq!(read_pth_selected(&path, &[])?.len(), 3);
        let msg = load_clip_vision(&path, &ClipVisionConfig::tiny(), DType::F32, &Device::Cpu)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            msg.contains("VAE, not the CLIP") && msg.contains("plain.pth"),
            "{msg}"
        );
        Ok(())
    }
}
