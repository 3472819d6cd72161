//! LTX-2 LoRA files in the official trainer's layout. Framesmith writes musubi-tuner's names
//! (`lora_unet_transformer_blocks_0_attn1_to_q.lora_down.weight`, `lora_up`, `alpha`), which ComfyUI loads for any
//! model; the official trainer saves PEFT's state dict under ComfyUI's prefix
//! (`diffusion_model.transformer_blocks.0.attn1.to_q.lora_A.weight`, `lora_B`, no alpha), and ltx-core fuses
//! `B · A · strength` without an alpha / rank scale (ComfyUI reads a LoRA without alpha at scale 1 too). So
//! [`to_official`] folds each module's `alpha / rank` into `lora_B`: the same delta in every loader. [`from_official`]
//! reads such a file back (alpha = rank). Module paths are ltx-core's ([`modules`] under each block).

use std::collections::HashMap;

use candle_core::{Result, Tensor};

/// ComfyUI's and the official trainer's prefix.
pub const OFFICIAL_PREFIX: &str = "diffusion_model.";
const MUSUBI_BLOCKS: &str = "lora_unet_transformer_blocks_";

/// The attentions of a block (video, audio, and the two audio-video cross-attentions).
const ATTENTIONS: [&str; 6] = [
    "attn1",
    "attn2",
    "audio_attn1",
    "audio_attn2",
    "audio_to_video_attn",
    "video_to_audio_attn",
];
/// An attention's linears (`to_gate_logits`: LTX-2.3).
const PROJECTIONS: [&str; 5] = ["to_q", "to_k", "to_v", "to_out.0", "to_gate_logits"];

/// The adaptable linears of a block (both streams), by their path under `transformer_blocks.{i}.`.
pub fn modules() -> Vec<String> {
    let attention = ATTENTIONS
        .iter()
        .flat_map(|a| PROJECTIONS.iter().map(move |p| format!("{a}.{p}")));
    let ff = ["ff", "audio_ff"].iter().flat_map(|f| {
        ["net.0.proj", "net.2"]
            .iter()
            .map(move |n| format!("{f}.{n}"))
    });
    attention.chain(ff).collect()
}

/// The dotted module path of musubi-tuner's module name (`lora_unet_transformer_blocks_3_ff_net_0_proj` →
/// `transformer_blocks.3.ff.net.0.proj`), for the linears of [`modules`].
pub fn dotted_path(musubi: &str) -> Option<String> {
    let rest = musubi.strip_prefix(MUSUBI_BLOCKS)?;
    let (index, module) = rest.split_once('_')?;
    index.parse::<usize>().ok()?;
    let known = modules()
        .into_iter()
        .find(|m| m.replace('.', "_") == module)?;
    Some(format!("transformer_blocks.{index}.{known}"))
}

/// A musubi-tuner layout LoRA (`lora_unet_….lora_down.weight`, `.lora_up.weight`, `.alpha`) in the official
/// trainer's layout, `alpha / rank` folded into `lora_B`. A module this family does not have is an error.
pub fn to_official(tensors: &HashMap<String, Tensor>) -> Result<HashMap<String, Tensor>> {
    let mut out = HashMap::new();
    for (key, down) in tensors {
        let Some(module) = key.strip_suffix(".lora_down.weight") else {
            continue;
        };
        let path = dotted_path(module).ok_or_else(|| {
            candle_core::Error::Msg(format!("`{module}` is not a module of an LTX-2 block"))
        })?;
        let up = tensors
            .get(&format!("{module}.lora_up.weight"))
            .ok_or_else(|| {
                candle_core::Error::Msg(format!("the LoRA's `{module}` has no lora_up.weight"))
            })?;
        let rank = down.dim(0)? as f64;
        let alpha = match tensors.get(&format!("{module}.alpha")) {
            Some(a) => a
                .to_dtype(candle_core::DType::F64)?
                .flatten_all()?
                .to_vec1::<f64>()?[0],
            None => rank,
        };
        let up = (up.to_dtype(candle_core::DType::F32)? * (alpha / rank))?.to_dtype(up.dtype())?;
        out.insert(
            format!("{OFFICIAL_PREFIX}{path}.lora_A.weight"),
            down.clone(),
        );
        out.insert(format!("{OFFICIAL_PREFIX}{path}.lora_B.weight"), up);
    }
    Ok(out)
}

/// The official trainer's layout read back into musubi-tuner's (alpha = rank: the scale is in `lora_B`).
pub fn from_official(tensors: &HashMap<String, Tensor>) -> Result<HashMap<String, Tensor>> {
    let mut out = HashMap::new();
    for (key, down) in tensors {
        let Some(path) = key
            .strip_prefix(OFFICIAL_PREFIX)
            .and_then(|k| k.strip_suffix(".lora_A.weight"))
        else {
            continue;
        };
        let up = tensors
            .get(&format!("{OFFICIAL_PREFIX}{path}.lora_B.weight"))
            .ok_or_else(|| {
                candle_core::Error::Msg(format!("the LoRA's `{path}` has no lora_B.weight"))
            })?;
        let module = format!("lora_unet_{}", path.replace('.', "_"));
        let rank = down.dim(0)? as f32;
        out.insert(format!("{module}.lora_down.weight"), down.clone());
        out.insert(format!("{module}.lora_up.weight"), up.clone());
        out.insert(format!("{module}.alpha"), Tensor::new(rank, down.device())?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    #[test]
    fn musubi_names_map_to_ltx_core_paths() {
        assert_eq!(
            dotted_path("lora_unet_transformer_blocks_12_attn1_to_out_0").as_deref(),
            Some("transformer_blocks.12.attn1.to_out.0")
        );
        assert_eq!(
            dotted_path("lora_unet_transformer_blocks_0_audio_ff_net_0_proj").as_deref(),
            Some("transformer_blocks.0.audio_ff.net.0.proj")
        );
        assert_eq!(
            dotted_path("lora_unet_transformer_blocks_0_attn1_norm_q"),
            None
        );
        assert_eq!(dotted_path("lora_unet_double_blocks_0_img_attn_q"), None);
    }

    #[test]
    fn the_official_layout_carries_the_same_delta() -> anyhow::Result<()> {
        let dev = &Device::Cpu;
        let down = Tensor::randn(0f32, 1.0, (4, 16), dev)?;
        let up = Tensor::randn(0f32, 1.0, (16, 4), dev)?;
        let m = "lora_unet_transformer_blocks_0_attn2_to_v";
        let musubi = HashMap::from([
            (format!("{m}.lora_down.weight"), down.clone()),
            (format!("{m}.lora_up.weight"), up.clone()),
            (format!("{m}.alpha"), Tensor::new(8f32, dev)?),
        ]);
        let official = to_official(&musubi)?;
        let a = &official["diffusion_model.transformer_blocks.0.attn2.to_v.lora_A.weight"];
        let b = &official["diffusion_model.transformer_blocks.0.attn2.to_v.lora_B.weight"];
        // ltx-core's fused delta B·A equals musubi's (alpha / rank) · up · down.
        let want = (up.matmul(&down)? * 2.0)?;
        let err = (b.matmul(a)? - &want)?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?;
        assert!(err < 1e-5, "{err}");
        let back = from_official(&official)?;
        let alpha = back[&format!("{m}.alpha")]
            .to_dtype(DType::F32)?
            .to_scalar::<f32>()?;
        assert_eq!(alpha, 4.0);
        let bad = HashMap::from([(
            "lora_unet_transformer_blocks_0_attn1_norm_q.lora_down.weight".to_string(),
            down,
        )]);
        assert!(to_official(&bad).is_err());
        Ok(())
    }
}
