//! Tensor names: recognising other model families from their keys, stripping ComfyUI prefixes, normalising FP8
//! scale names, and the official key set (with shapes) of every Wan DiT configuration.

use super::error::ForeignModel;
use crate::wan::WanConfig;

/// Key prefixes ComfyUI and some trainers put before the official names, longest first.
const PREFIXES: [&str; 2] = ["model.diffusion_model.", "diffusion_model."];

/// The tensor ComfyUI adds to a `scaled_fp8` file; its dtype names the FP8 format, it holds no weights.
pub(crate) const SCALED_FP8_MARKER: &str = "scaled_fp8";

/// What the key names say a file is, when it is not an official-layout Wan DiT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Foreign {
    Model(ForeignModel),
    DiffusersWan,
}

/// The prefix the DiT tensors carry (ComfyUI's `model.diffusion_model.`), if any.
pub(crate) fn dit_prefix(names: &[&str]) -> Option<&'static str> {
    PREFIXES
        .into_iter()
        .find(|p| names.iter().any(|n| n.starts_with(p)))
}

/// Says what the file is when its (prefix-stripped) names are not a Wan DiT's. `None` means "looks like a Wan DiT
/// or like nothing known", which shape detection then sorts out.
pub(crate) fn classify_foreign(names: &[&str]) -> Option<Foreign> {
    let any = |pat: &str| names.iter().any(|n| n.contains(pat));
    let any_prefix = |pat: &str| names.iter().any(|n| n.starts_with(pat));
    // Framesmith's own files first: an optimizer state's moments are named after the LoRA's tensors.
    if names
        .iter()
        .any(|n| n.ends_with(".exp_avg") || n.ends_with(".exp_avg_sq"))
    {
        return Some(Foreign::Model(ForeignModel::OptimizerState));
    }
    if any_prefix("latents_") {
        return Some(Foreign::Model(ForeignModel::LatentCache));
    }
    if any_prefix("varlen_t5_") || any_prefix("t5_vec_") || any_prefix("clip_l_pooler_") {
        return Some(Foreign::Model(ForeignModel::TextCache));
    }
    if any_prefix("lora_unet_") || crate::adapter_file::is_adapter(names.iter().copied()) {
        return Some(Foreign::Model(ForeignModel::Lora));
    }
    if any_prefix("condition_embedder.") || any(".attn1.to_q") {
        return Some(Foreign::DiffusersWan);
    }
    if any_prefix("patch_embedding.") && any(".self_attn.") {
        return None;
    }
    let model = if any("img_attn_qkv") || any_prefix("txt_in.individual_token_refiner") {
        ForeignModel::HunyuanVideo
    } else if any_prefix("double_blocks.")
        || any_prefix("single_blocks.")
        || (any_prefix("img_in.") && any_prefix("guidance_in."))
    {
        ForeignModel::Flux
    } else if any_prefix("encoder.") && any_prefix("decoder.") {
        if any(".residual.0.gamma") || any_prefix("decoder.upsamples.") {
            ForeignModel::WanVae
        } else {
            ForeignModel::Vae
        }
    } else if any_prefix("token_embedding.")
        || any_prefix("shared.")
        || any_prefix("encoder.block.")
        || (any(".attn.q.") && any(".ffn.gate."))
    {
        ForeignModel::Umt5
    } else if any_prefix("vision_model.") || any_prefix("visual.") {
        ForeignModel::ClipVision
    } else {
        return None;
    };
    Some(Foreign::Model(model))
}

/// The official name of a stored tensor, without prefix and with FP8 scales named `<module>.scale_weight`; `None`
/// for the `scaled_fp8` marker, which carries no weights.
pub(crate) fn normalise(stored: &str, prefix: Option<&str>) -> Option<String> {
    let name = match prefix {
        Some(p) => stored.strip_prefix(p)?,
        None => stored,
    };
    if name == SCALED_FP8_MARKER {
        return None;
    }
    Some(match name.strip_suffix(".weight_scale") {
        Some(module) => format!("{module}.scale_weight"),
        None => name.to_string(),
    })
}

/// Whether an official name is an FP8 companion (scale) rather than a weight of the model.
pub(crate) fn is_scale(name: &str) -> bool {
    name.ends_with(".scale_weight") || name.ends_with(".scale_input")
}

/// Every tensor of the official Wan DiT `state_dict()` for `cfg`, with its shape, in a stable order. A checkpoint
/// that holds these (in any float dtype, FP8 weights with optional scales) can build the model.
pub fn official_shapes(cfg: &WanConfig) -> Vec<(String, Vec<usize>)> {
    let d = cfg.dim;
    let [p0, p1, p2] = cfg.patch_size;
    let mut out: Vec<(String, Vec<usize>)> = Vec::new();
    fn linear(out: &mut Vec<(String, Vec<usize>)>, name: &str, i: usize, o: usize) {
        out.push((format!("{name}.weight"), vec![o, i]));
        out.push((format!("{name}.bias"), vec![o]));
    }
    out.push((
        "patch_embedding.weight".into(),
        vec![d, cfg.in_dim, p0, p1, p2],
    ));
    out.push(("patch_embedding.bias".into(), vec![d]));
    linear(&mut out, "text_embedding.0", cfg.text_dim, d);
    linear(&mut out, "text_embedding.2", d, d);
    linear(&mut out, "time_embedding.0", cfg.freq_dim, d);
    linear(&mut out, "time_embedding.2", d, d);
    linear(&mut out, "time_projection.1", d, 6 * d);
    for i in 0..cfg.num_layers {
        let b = format!("blocks.{i}");
        for attn in ["self_attn", "cross_attn"] {
            for proj in ["q", "k", "v", "o"] {
                linear(&mut out, &format!("{b}.{attn}.{proj}"), d, d);
            }
            if cfg.qk_norm {
                out.push((format!("{b}.{attn}.norm_q.weight"), vec![d]));
                out.push((format!("{b}.{attn}.norm_k.weight"), vec![d]));
            }
        }
        if cfg.has_clip() {
            linear(&mut out, &format!("{b}.cross_attn.k_img"), d, d);
            linear(&mut out, &format!("{b}.cross_attn.v_img"), d, d);
            if cfg.qk_norm {
                out.push((format!("{b}.cross_attn.norm_k_img.weight"), vec![d]));
            }
        }
        if cfg.cross_attn_norm {
            out.push((format!("{b}.norm3.weight"), vec![d]));
            out.push((format!("{b}.norm3.bias"), vec![d]));
        }
        linear(&mut out, &format!("{b}.ffn.0"), d, cfg.ffn_dim);
        linear(&mut out, &format!("{b}.ffn.2"), cfg.ffn_dim, d);
        out.push((format!("{b}.modulation"), vec![1, 6, d]));
    }
    linear(&mut out, "head.head", d, cfg.out_dim * p0 * p1 * p2);
    out.push(("head.modulation".into(), vec![1, 2, d]));
    if cfg.has_clip() {
        let c = cfg.clip_dim;
        out.push(("img_emb.proj.0.weight".into(), vec![c]));
        out.push(("img_emb.proj.0.bias".into(), vec![c]));
        linear(&mut out, "img_emb.proj.1", c, c);
        linear(&mut out, "img_emb.proj.3", c, d);
        out.push(("img_emb.proj.4.weight".into(), vec![d]));
        out.push(("img_emb.proj.4.bias".into(), vec![d]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn official_shapes_count_the_published_parameters() {
        let mut configs: Vec<WanConfig> = WanConfig::named_variants()
            .into_iter()
            .map(|(_, c)| c)
            .collect();
        configs.push(WanConfig::tiny(2));
        for cfg in configs {
            let total: u64 = official_shapes(&cfg)
                .iter()
                .map(|(_, s)| s.iter().product::<usize>() as u64)
                .sum();
            assert_eq!(total, cfg.parameter_count(), "{cfg:?}");
        }
    }

    #[test]
    fn normalises_prefixes_and_scale_names() {
        let p = Some("model.diffusion_model.");
        let n = |s: &str, p: Option<&str>| normalise(s, p);
        assert_eq!(
            n("model.diffusion_model.head.modulation", p).as_deref(),
            Some("head.modulation")
        );
        assert_eq!(n("model.diffusion_model.scaled_fp8", p), None);
        assert_eq!(n("vae.encoder.conv1.weight", p), None);
        assert_eq!(
            n("blocks.0.ffn.0.weight_scale", None).as_deref(),
            Some("blocks.0.ffn.0.scale_weight")
        );
    }

    #[test]
    fn recognises_other_models_by_their_keys() {
        let f = |names: &[&str]| classify_foreign(names);
        assert_eq!(
            f(&[
                "double_blocks.0.img_attn_qkv.weight",
                "txt_in.individual_token_refiner.blocks.0.norm1.weight"
            ]),
            Some(Foreign::Model(ForeignModel::HunyuanVideo))
        );
        assert_eq!(
            f(&[
                "double_blocks.0.img_attn.qkv.weight",
                "single_blocks.0.linear1.weight",
                "img_in.weight"
            ]),
            Some(Foreign::Model(ForeignModel::Flux))
        );
        assert_eq!(
            f(&["token_embedding.weight", "blocks.0.attn.q.weight"]),
            Some(Foreign::Model(ForeignModel::Umt5))
        );
        assert_eq!(
            f(&[
                "encoder.block.0.layer.0.SelfAttention.q.weight",
                "shared.weight"
            ]),
            Some(Foreign::Model(ForeignModel::Umt5))
        );
        assert_eq!(
            f(&["vision_model.encoder.layers.0.mlp.fc1.weight"]),
            Some(Foreign::Model(ForeignModel::ClipVision))
        );
        assert_eq!(
            f(&[
                "blocks.0.self_attn.q.lora_A.weight",
                "blocks.0.self_attn.q.lora_B.weight"
            ]),
            Some(Foreign::Model(ForeignModel::Lora))
        );
        // LyCORIS modules under module paths.
        assert_eq!(
            f(&["blocks.0.ffn.0.lokr_w1", "blocks.0.ffn.0.lokr_w2"]),
            Some(Foreign::Model(ForeignModel::Lora))
        );
        assert_eq!(
            f(&["patch_embedding.weight", "blocks.0.self_attn.q.weight"]),
            None
        );
        assert_eq!(
            f(&[
                "blocks.0.self_attn.q.lora_down.weight.exp_avg",
                "blocks.0.self_attn.q.lora_down.weight.exp_avg_sq",
                "step"
            ]),
            Some(Foreign::Model(ForeignModel::OptimizerState))
        );
        assert_eq!(
            f(&["latents_2x16x16_float32", "latents_image_2x16x16_float32"]),
            Some(Foreign::Model(ForeignModel::LatentCache))
        );
        for text in [
            &["varlen_t5_bfloat16"][..],
            &["t5_vec_bfloat16", "clip_l_pooler_bfloat16"],
        ] {
            assert_eq!(f(text), Some(Foreign::Model(ForeignModel::TextCache)));
        }
    }
}
