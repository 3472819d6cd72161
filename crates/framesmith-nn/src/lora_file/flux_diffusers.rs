//! FLUX.1 LoRAs named after diffusers' transformer (PEFT files of diffusers, ai-toolkit, SimpleTuner:
//! `transformer.transformer_blocks.0.attn.to_q.lora_A.weight`) read as adapters of the official modules: the
//! separate q, k, v projections (and, in single-stream blocks, the MLP input) become one adapter on the fused
//! `qkv` / `linear1`, their `down` factors stacked and their `up` factors placed block-diagonally with each part's
//! alpha / rank folded in, so the fused adapter adds exactly what the parts would. A file whose names are
//! Qwen-Image's (its official names are diffusers' too) keeps them.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use candle_core::{DType, Tensor};

use super::{musubi_name, FileResult, LoadedLora, LoraFileError};
use crate::lora::QWEN_IMAGE_BLOCK_LINEARS;

/// A diffusers module under a block → (official module, part, parts).
type Mapping = (&'static str, &'static str, usize, usize);

/// The modules of a double-stream block.
const DOUBLE: [Mapping; 14] = [
    ("attn.to_q", "img_attn.qkv", 0, 3),
    ("attn.to_k", "img_attn.qkv", 1, 3),
    ("attn.to_v", "img_attn.qkv", 2, 3),
    ("attn.add_q_proj", "txt_attn.qkv", 0, 3),
    ("attn.add_k_proj", "txt_attn.qkv", 1, 3),
    ("attn.add_v_proj", "txt_attn.qkv", 2, 3),
    ("attn.to_out.0", "img_attn.proj", 0, 1),
    ("attn.to_add_out", "txt_attn.proj", 0, 1),
    ("ff.net.0.proj", "img_mlp.0", 0, 1),
    ("ff.net.2", "img_mlp.2", 0, 1),
    ("ff_context.net.0.proj", "txt_mlp.0", 0, 1),
    ("ff_context.net.2", "txt_mlp.2", 0, 1),
    // AdaLayerNormZero's six chunks are the official modulation's (shift, scale, gate) twice, in order.
    ("norm1.linear", "img_mod.lin", 0, 1),
    ("norm1_context.linear", "txt_mod.lin", 0, 1),
];

/// The modules of a single-stream block.
const SINGLE: [Mapping; 6] = [
    ("attn.to_q", "linear1", 0, 4),
    ("attn.to_k", "linear1", 1, 4),
    ("attn.to_v", "linear1", 2, 4),
    ("proj_mlp", "linear1", 3, 4),
    ("proj_out", "linear2", 0, 1),
    ("norm.linear", "modulation.lin", 0, 1),
];

/// FLUX.1's MLP width over the model width (the single-stream blocks' `proj_mlp` rows).
const MLP_RATIO: usize = 4;

/// The official module, part and part count of a diffusers module path; `Ok(None)` when the path is not named
/// after diffusers' FLUX.1 transformer.
pub fn official(module_path: &str) -> Result<Option<(String, usize, usize)>, String> {
    let (list, official_list, table): (&str, &str, &[Mapping]) =
        if module_path.starts_with("transformer_blocks.") {
            ("transformer_blocks.", "double_blocks", &DOUBLE)
        } else if module_path.starts_with("single_transformer_blocks.") {
            ("single_transformer_blocks.", "single_blocks", &SINGLE)
        } else {
            return Ok(None);
        };
    let rest = &module_path[list.len()..];
    let (index, sub) = rest
        .split_once('.')
        .ok_or_else(|| format!("`{module_path}` names no module"))?;
    if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("`{module_path}` has no block index"));
    }
    let (_, module, part, parts) = table
        .iter()
        .find(|(name, ..)| *name == sub)
        .ok_or_else(|| format!("diffusers' FLUX.1 module `{sub}` has no official counterpart"))?;
    Ok(Some((
        format!("{official_list}.{index}.{module}"),
        *part,
        *parts,
    )))
}

/// The diffusers modules (in part order, with their share of the output rows in model widths: 1, or 4 for a
/// single-stream block's MLP input) that make up the official FLUX.1 module `official_path`
/// (`double_blocks.0.img_attn.qkv` → `transformer_blocks.0.attn.to_q`, `.to_k`, `.to_v`); `None` for a path
/// that is not a FLUX.1 block linear. The inverse of [`official`].
pub fn diffusers_parts(official_path: &str) -> Option<Vec<(String, usize)>> {
    let (list, table, rest): (&str, &[Mapping], &str) =
        if let Some(rest) = official_path.strip_prefix("double_blocks.") {
            ("transformer_blocks", &DOUBLE, rest)
        } else {
            let rest = official_path.strip_prefix("single_blocks.")?;
            ("single_transformer_blocks", &SINGLE, rest)
        };
    let (index, module) = rest.split_once('.')?;
    if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut parts: Vec<(usize, String, usize)> = table
        .iter()
        .filter(|(_, m, ..)| *m == module)
        .map(|(name, _, part, _)| {
            let width = if *name == "proj_mlp" { MLP_RATIO } else { 1 };
            (*part, format!("{list}.{index}.{name}"), width)
        })
        .collect();
    parts.sort();
    (!parts.is_empty()).then(|| parts.into_iter().map(|(_, n, w)| (n, w)).collect())
}

/// The attentions and feed-forwards of an LTX-2 block (ltx-core's names, which its official trainer's LoRA files
/// keep: `transformer_blocks.{i}.attn1.to_q`); diffusers' FLUX.1 blocks have none of them (their feed-forwards'
/// names are the same, so those tell nothing).
const LTX2_BLOCK_MODULES: [&str; 7] = [
    "attn1.",
    "attn2.",
    "audio_attn1.",
    "audio_attn2.",
    "audio_to_video_attn.",
    "video_to_audio_attn.",
    "audio_ff.",
];

/// Whether the dotted module paths (`paths`) name LTX-2's transformer: a block module of ltx-core's own (an
/// `attn1` / `attn2` or an audio module), whose names are official already.
fn names_ltx2(paths: &[&str]) -> bool {
    paths.iter().any(|p| {
        p.strip_prefix("transformer_blocks.")
            .and_then(|rest| rest.split_once('.'))
            .is_some_and(|(_, sub)| LTX2_BLOCK_MODULES.iter().any(|m| sub.starts_with(m)))
    })
}

/// FLUX.1's double-stream blocks (`transformer_blocks.0` to `.18` in diffusers' names).
const FLUX_DOUBLE_BLOCKS: usize = 19;

/// Whether the dotted module paths (`paths`) name Qwen-Image's transformer, whose official names are diffusers'
/// (`transformer_blocks.{i}.…` too): a linear only Qwen-Image's blocks have (`img_mod.1`, `img_mlp.net.2`, …)
/// or a block past FLUX.1's double-stream blocks, and no single-stream block.
fn names_qwen_image<'a>(paths: impl IntoIterator<Item = &'a str>) -> bool {
    let (mut qwen, mut flux) = (false, false);
    for p in paths {
        flux |= p.starts_with("single_transformer_blocks.");
        let Some((index, sub)) = p
            .strip_prefix("transformer_blocks.")
            .and_then(|rest| rest.split_once('.'))
        else {
            continue;
        };
        let qwen_only = QWEN_IMAGE_BLOCK_LINEARS.contains(&sub)
            && !DOUBLE.iter().any(|(name, ..)| *name == sub);
        let past_flux = index
            .parse::<usize>()
            .is_ok_and(|i| i >= FLUX_DOUBLE_BLOCKS);
        qwen |= qwen_only || past_flux;
    }
    qwen && !flux
}

/// `modules` with every adapter named (by a dotted path, its name in `dotted`) after diffusers' FLUX.1
/// transformer replaced by one on its official module; others unchanged. A file whose dotted names are
/// Qwen-Image's is returned as it is. `path` is the file, for errors.
pub(super) fn to_official(
    modules: Vec<LoadedLora>,
    dotted: &HashSet<String>,
    path: &Path,
) -> FileResult<Vec<LoadedLora>> {
    let dotted_paths: Vec<&str> = modules
        .iter()
        .filter(|m| dotted.contains(&m.name))
        .filter_map(|m| m.path.as_deref())
        .collect();
    if names_ltx2(&dotted_paths) || names_qwen_image(dotted_paths.iter().copied()) {
        return Ok(modules);
    }
    let mut out = Vec::with_capacity(modules.len());
    let mut fused: BTreeMap<String, Vec<Option<LoadedLora>>> = BTreeMap::new();
    for m in modules {
        let dotted_path = m.path.as_deref().filter(|_| dotted.contains(&m.name));
        let target = match dotted_path.map(official).transpose() {
            Ok(target) => target.flatten(),
            Err(reason) => {
                return Err(LoraFileError::UnsupportedKey {
                    key: m.name.clone(),
                    reason,
                    path: path.to_path_buf(),
                })
            }
        };
        match target {
            None => out.push(m),
            Some((module, part, parts)) => {
                let slots = fused
                    .entry(module)
                    .or_insert_with(|| (0..parts).map(|_| None).collect());
                slots[part] = Some(m);
            }
        }
    }
    for (module, parts) in fused {
        out.push(fuse(&module, parts)?);
    }
    Ok(out)
}

/// One adapter on `module` adding what its `parts` (in output order; `None`: no adapter there) add: `down`
/// stacked [Σr, in], `up` block-diagonal [Σout, Σr] with each part's alpha / rank folded in, alpha = Σr.
fn fuse(module: &str, parts: Vec<Option<LoadedLora>>) -> FileResult<LoadedLora> {
    if let [Some(only)] = parts.as_slice() {
        return Ok(LoadedLora {
            name: musubi_name(module),
            path: Some(module.to_string()),
            ..only.clone()
        });
    }
    let present: Vec<&LoadedLora> = parts.iter().flatten().collect();
    let Some(first) = present.first() else {
        return Err(candle_core::Error::Msg(format!("no adapter parts for `{module}`")).into());
    };
    let in_dim = first.down.dim(1)?;
    let total_rank: usize = present
        .iter()
        .map(|m| m.down.dim(0))
        .sum::<candle_core::Result<_>>()?;
    let device = first.down.device().clone();
    let mut rows = Vec::with_capacity(parts.len());
    let mut rank_before = 0;
    for (i, part) in parts.iter().enumerate() {
        // q, k and v are as wide as the model; the MLP input (a single-stream block's fourth part) 4× that.
        let out_dim = match part {
            Some(m) => m.up.dim(0)?,
            None if i == 3 => MLP_RATIO * in_dim,
            None => in_dim,
        };
        let Some(m) = part else {
            rows.push(Tensor::zeros((out_dim, total_rank), DType::F32, &device)?);
            continue;
        };
        let rank = m.down.dim(0)?;
        let up = (m.up.to_dtype(DType::F32)? * (m.alpha / rank as f64))?;
        let after = total_rank - rank_before - rank;
        let mut pieces = Vec::with_capacity(3);
        if rank_before > 0 {
            pieces.push(Tensor::zeros((out_dim, rank_before), DType::F32, &device)?);
        }
        pieces.push(up);
        if after > 0 {
            pieces.push(Tensor::zeros((out_dim, after), DType::F32, &device)?);
        }
        rows.push(Tensor::cat(&pieces, 1)?);
        rank_before += rank;
    }
    let downs = present
        .iter()
        .map(|m| m.down.to_dtype(DType::F32))
        .collect::<candle_core::Result<Vec<_>>>()?;
    Ok(LoadedLora {
        name: musubi_name(module),
        path: Some(module.to_string()),
        down: Tensor::cat(&downs, 0)?,
        up: Tensor::cat(&rows, 0)?,
        alpha: total_rank as f64,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::path::PathBuf;

    use candle_core::Device;

    use super::*;

    /// A rank-2 adapter of an 8-wide linear named by the dotted `path`, as `LoraFile::load` reads it.
    fn module(path: &str) -> LoadedLora {
        let zeros = |dims: (usize, usize)| Tensor::zeros(dims, DType::F32, &Device::Cpu);
        LoadedLora {
            name: musubi_name(path),
            path: Some(path.to_string()),
            down: zeros((2, 8)).unwrap(),
            up: zeros((8, 2)).unwrap(),
            alpha: 2.0,
        }
    }

    /// The names `to_official` gives `paths`, read as dotted names (or, with `dotted` false, as underscored).
    fn converted(paths: &[&str], dotted: bool) -> Vec<String> {
        let modules: Vec<LoadedLora> = paths.iter().map(|p| module(p)).collect();
        let names = modules
            .iter()
            .filter(|_| dotted)
            .map(|m| m.name.clone())
            .collect();
        let out = to_official(modules, &names, &PathBuf::from("lora.safetensors")).unwrap();
        let mut names: Vec<String> = out.into_iter().map(|m| m.name).collect();
        names.sort();
        names
    }

    /// LTX-2's official names (`transformer_blocks.{i}.attn1.to_q`, the official trainer's files) are kept, its
    /// feed-forwards too, where the same feed-forward alone in diffusers' FLUX.1 names is moved to FLUX.1's.
    #[test]
    fn ltx2_names_are_kept() {
        let paths = [
            "transformer_blocks.0.attn1.to_q",
            "transformer_blocks.3.attn2.to_out.0",
            "transformer_blocks.3.ff.net.2",
        ];
        let mut kept: Vec<String> = paths.iter().map(|p| musubi_name(p)).collect();
        kept.sort();
        assert_eq!(converted(&paths, true), kept);
        assert_eq!(
            converted(&["transformer_blocks.3.ff.net.2"], true),
            ["lora_unet_double_blocks_3_img_mlp_2"]
        );
    }

    /// Qwen-Image's official names are diffusers' (`transformer_blocks.{i}.attn.to_q`): a file naming
    /// Qwen-Image's modules keeps them, where a FLUX.1 file in diffusers' names is fused onto FLUX.1's modules.
    #[test]
    fn qwen_image_names_are_kept_and_flux_diffusers_names_are_fused() {
        let q = "transformer_blocks.0.attn.to_q";
        let mlp = "transformer_blocks.0.img_mlp.net.0.proj";
        let late_q = "transformer_blocks.30.attn.to_q";
        let kept = |paths: &[&str]| {
            let mut names: Vec<String> = paths.iter().map(|p| musubi_name(p)).collect();
            names.sort();
            names
        };
        // A linear only Qwen-Image's blocks have, or attention past FLUX.1's 19 double-stream blocks.
        assert_eq!(converted(&[q, mlp], true), kept(&[q, mlp]));
        assert_eq!(converted(&[q, late_q], true), kept(&[q, late_q]));
        // musubi-tuner's names of Qwen-Image's attention in the first blocks are never diffusers' FLUX.1 names.
        assert_eq!(converted(&[q], false), kept(&[q]));
        // The same attention in diffusers' names, with a single-stream block: FLUX.1.
        let flux = converted(&[q, "single_transformer_blocks.0.proj_out"], true);
        assert_eq!(
            flux,
            [
                "lora_unet_double_blocks_0_img_attn_qkv",
                "lora_unet_single_blocks_0_linear2"
            ]
        );
        // Attention of the first blocks alone reads as FLUX.1's, as before.
        assert_eq!(
            converted(&[q], true),
            ["lora_unet_double_blocks_0_img_attn_qkv"]
        );
    }
}
