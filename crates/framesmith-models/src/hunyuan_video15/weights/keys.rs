//! The official HunyuanVideo 1.5 transformer state dict (the release's `diffusion_pytorch_model.safetensors`
//! names): every tensor name with its shape, for any [`HunyuanVideo15Config`], written down from the official
//! module tree without loading anything (the planner's sizes, the LoRA layout's checks).

use crate::hunyuan_video15::embeddings::TIMESTEP_DIM;
use crate::hunyuan_video15::HunyuanVideo15Config;

/// Every tensor of the official transformer of `cfg`, (name, shape), in module order.
pub fn official_shapes(cfg: &HunyuanVideo15Config) -> Vec<(String, Vec<usize>)> {
    let (dim, mlp) = (cfg.inner_dim(), cfg.mlp_hidden_dim());
    let (text, glyph, glyph_hidden, image) = (
        cfg.text_embed_dim,
        cfg.text_embed_2_dim,
        cfg.byt5_hidden_dim,
        cfg.image_embed_dim,
    );
    let mut out = Vec::new();
    let mut linear = |name: String, in_dim: usize, out_dim: usize| {
        out.push((format!("{name}.weight"), vec![out_dim, in_dim]));
        out.push((format!("{name}.bias"), vec![out_dim]));
    };
    linear("byt5_in.fc1".into(), glyph, glyph_hidden);
    linear("byt5_in.fc2".into(), glyph_hidden, glyph_hidden);
    linear("byt5_in.fc3".into(), glyph_hidden, dim);
    for i in 0..cfg.num_layers {
        for stream in ["img", "txt"] {
            let p = format!("double_blocks.{i}.{stream}");
            for x in ["q", "k", "v", "proj"] {
                linear(format!("{p}_attn_{x}"), dim, dim);
            }
            linear(format!("{p}_mlp.fc1"), dim, mlp);
            linear(format!("{p}_mlp.fc2"), mlp, dim);
            linear(format!("{p}_mod.linear"), dim, 6 * dim);
        }
    }
    linear("final_layer.adaLN_modulation.1".into(), dim, 2 * dim);
    linear("final_layer.linear".into(), dim, cfg.out_dim());
    linear("time_in.mlp.0".into(), TIMESTEP_DIM, dim);
    linear("time_in.mlp.2".into(), dim, dim);
    linear("txt_in.c_embedder.linear_1".into(), text, dim);
    linear("txt_in.c_embedder.linear_2".into(), dim, dim);
    for i in 0..cfg.num_refiner_layers {
        let p = format!("txt_in.individual_token_refiner.blocks.{i}");
        linear(format!("{p}.adaLN_modulation.1"), dim, 2 * dim);
        linear(format!("{p}.mlp.fc1"), dim, mlp);
        linear(format!("{p}.mlp.fc2"), mlp, dim);
        linear(format!("{p}.self_attn_proj"), dim, dim);
        linear(format!("{p}.self_attn_qkv"), dim, 3 * dim);
    }
    linear("txt_in.input_embedder".into(), text, dim);
    linear("txt_in.t_embedder.mlp.0".into(), TIMESTEP_DIM, dim);
    linear("txt_in.t_embedder.mlp.2".into(), dim, dim);
    linear("vision_in.proj.1".into(), image, image);
    linear("vision_in.proj.3".into(), image, dim);
    vectors(cfg, &mut out);
    out.push(("cond_type_embedding.weight".into(), vec![3, dim]));
    let (pt, p) = (cfg.patch_size_t, cfg.patch_size);
    out.push((
        "img_in.proj.weight".into(),
        vec![dim, cfg.in_channels, pt, p, p],
    ));
    out.push(("img_in.proj.bias".into(), vec![dim]));
    out
}

/// The LayerNorm parameters and q / k norm weights of `cfg`, appended to `out`.
fn vectors(cfg: &HunyuanVideo15Config, out: &mut Vec<(String, Vec<usize>)>) {
    let (dim, glyph, image) = (cfg.inner_dim(), cfg.text_embed_2_dim, cfg.image_embed_dim);
    let head = cfg.attention_head_dim;
    let mut vector = |name: String, len: usize| out.push((name, vec![len]));
    for suffix in ["weight", "bias"] {
        vector(format!("byt5_in.layernorm.{suffix}"), glyph);
        vector(format!("vision_in.proj.0.{suffix}"), image);
        vector(format!("vision_in.proj.4.{suffix}"), dim);
        for i in 0..cfg.num_refiner_layers {
            for norm in ["norm1", "norm2"] {
                vector(
                    format!("txt_in.individual_token_refiner.blocks.{i}.{norm}.{suffix}"),
                    dim,
                );
            }
        }
    }
    for i in 0..cfg.num_layers {
        for stream in ["img", "txt"] {
            for x in ["q", "k"] {
                vector(
                    format!("double_blocks.{i}.{stream}_attn_{x}_norm.weight"),
                    head,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::hunyuan_video15::testkit::Case;

    #[test]
    fn the_fixture_state_dict_is_the_official_one_of_its_config() -> anyhow::Result<()> {
        let case = Case::load("i2v")?;
        let fixture: BTreeMap<String, Vec<usize>> = case
            .weights
            .iter()
            .map(|(k, v)| (k.clone(), v.dims().to_vec()))
            .collect();
        let ours = official_shapes(&case.model_config()?);
        let names: BTreeMap<String, Vec<usize>> = ours.iter().cloned().collect();
        assert_eq!(names.len(), ours.len(), "names are unique");
        assert_eq!(names, fixture);
        Ok(())
    }

    #[test]
    fn the_released_model_has_8_3_billion_parameters() {
        let shapes = official_shapes(&HunyuanVideo15Config::hunyuan_video15());
        let params: usize = shapes
            .iter()
            .map(|(_, s)| s.iter().product::<usize>())
            .sum();
        assert!(
            (8_250_000_000..8_400_000_000).contains(&params),
            "{params} parameters"
        );
        // 54 blocks of 14 linears (weight and bias) and 4 q/k norms.
        let blocks = shapes
            .iter()
            .filter(|(n, _)| n.starts_with("double_blocks."))
            .count();
        assert_eq!(blocks, 54 * (28 + 4));
    }
}
