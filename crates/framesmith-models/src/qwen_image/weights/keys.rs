//! The official Qwen-Image transformer state dict (diffusers' `QwenImageTransformer2DModel.state_dict()`): every
//! tensor name with its shape, for any [`QwenImageConfig`], written down from the official module tree without
//! loading anything. Tests check the LoRA layout against it at the released size.

use crate::qwen_image::embeddings::TIMESTEP_DIM;
use crate::qwen_image::QwenImageConfig;

/// Every tensor of the official transformer of `cfg`, (name, shape), in module order.
pub fn official_shapes(cfg: &QwenImageConfig) -> Vec<(String, Vec<usize>)> {
    let (dim, mlp, head) = (
        cfg.inner_dim(),
        cfg.mlp_hidden_dim(),
        cfg.attention_head_dim,
    );
    let mut out = Vec::new();
    let mut linear = |name: String, in_dim: usize, out_dim: usize| {
        out.push((format!("{name}.weight"), vec![out_dim, in_dim]));
        out.push((format!("{name}.bias"), vec![out_dim]));
    };
    linear("img_in".into(), cfg.in_channels, dim);
    linear("txt_in".into(), cfg.joint_attention_dim, dim);
    let embedder = "time_text_embed.timestep_embedder";
    linear(format!("{embedder}.linear_1"), TIMESTEP_DIM, dim);
    linear(format!("{embedder}.linear_2"), dim, dim);
    let mut norms = Vec::new();
    for i in 0..cfg.num_layers {
        let p = format!("transformer_blocks.{i}");
        for stream in ["img", "txt"] {
            linear(format!("{p}.{stream}_mod.1"), dim, 6 * dim);
            linear(format!("{p}.{stream}_mlp.net.0.proj"), dim, mlp);
            linear(format!("{p}.{stream}_mlp.net.2"), mlp, dim);
        }
        for name in [
            "to_q",
            "to_k",
            "to_v",
            "add_q_proj",
            "add_k_proj",
            "add_v_proj",
            "to_out.0",
            "to_add_out",
        ] {
            linear(format!("{p}.attn.{name}"), dim, dim);
        }
        for name in ["norm_q", "norm_k", "norm_added_q", "norm_added_k"] {
            norms.push(format!("{p}.attn.{name}.weight"));
        }
    }
    linear("norm_out.linear".into(), dim, 2 * dim);
    linear("proj_out".into(), dim, cfg.out_dim());
    out.extend(norms.into_iter().map(|n| (n, vec![head])));
    out.push(("txt_norm.weight".into(), vec![cfg.joint_attention_dim]));
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::qwen_image::testkit::Case;

    #[test]
    fn the_fixture_state_dict_is_the_official_one_of_its_config() -> anyhow::Result<()> {
        let case = Case::load("t2i")?;
        let fixture: BTreeMap<String, Vec<usize>> = case
            .weights
            .iter()
            .map(|(k, v)| (k.clone(), v.dims().to_vec()))
            .collect();
        let ours = official_shapes(&case.model_config()?);
        let names: BTreeMap<String, Vec<usize>> = ours.iter().cloned().collect();
        assert_eq!(names.len(), ours.len(), "names are unique");
        assert_eq!(names, fixture);
        let released = official_shapes(&QwenImageConfig::qwen_image());
        // 60 blocks of 14 linears (weight and bias) and 4 q/k norms, 6 linears around them, `txt_norm`.
        assert_eq!(released.len(), 60 * (28 + 4) + 12 + 1);
        Ok(())
    }
}
