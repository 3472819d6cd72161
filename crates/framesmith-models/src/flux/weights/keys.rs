//! The official FLUX.1 DiT state dict (`Flux` of black-forest-labs' `model.py`): every tensor name with its shape,
//! for any [`FluxConfig`], written down from the official module tree without loading anything. Tests check the
//! model code and the LoRA layout against it at the released sizes.

use crate::flux::FluxConfig;

/// Width of the sinusoidal embedding `time_in` and `guidance_in` take.
const TIMESTEP_DIM: usize = crate::flux::embeddings::TIMESTEP_DIM;

/// Every tensor of the official DiT of `cfg`, (name, shape), in module order.
pub fn official_shapes(cfg: &FluxConfig) -> Vec<(String, Vec<usize>)> {
    let (h, mlp, head) = (cfg.hidden_size, cfg.mlp_hidden_dim(), cfg.head_dim());
    let mut out = Vec::new();
    let mut linear = |name: String, in_dim: usize, out_dim: usize, bias: bool| {
        out.push((format!("{name}.weight"), vec![out_dim, in_dim]));
        if bias {
            out.push((format!("{name}.bias"), vec![out_dim]));
        }
    };
    let embedder = |linear: &mut dyn FnMut(String, usize, usize, bool), name: &str, in_dim| {
        linear(format!("{name}.in_layer"), in_dim, h, true);
        linear(format!("{name}.out_layer"), h, h, true);
    };
    linear("img_in".into(), cfg.in_channels, h, true);
    embedder(&mut linear, "time_in", TIMESTEP_DIM);
    embedder(&mut linear, "vector_in", cfg.vec_in_dim);
    if cfg.guidance_embed {
        embedder(&mut linear, "guidance_in", TIMESTEP_DIM);
    }
    linear("txt_in".into(), cfg.context_in_dim, h, true);
    let mut norms = Vec::new();
    for i in 0..cfg.depth {
        for stream in ["img", "txt"] {
            let p = format!("double_blocks.{i}.{stream}");
            linear(format!("{p}_mod.lin"), h, 6 * h, true);
            linear(format!("{p}_attn.qkv"), h, 3 * h, cfg.qkv_bias);
            norms.push(format!("{p}_attn.norm"));
            linear(format!("{p}_attn.proj"), h, h, true);
            linear(format!("{p}_mlp.0"), h, mlp, true);
            linear(format!("{p}_mlp.2"), mlp, h, true);
        }
    }
    for i in 0..cfg.depth_single_blocks {
        let p = format!("single_blocks.{i}");
        linear(format!("{p}.linear1"), h, 3 * h + mlp, true);
        linear(format!("{p}.linear2"), h + mlp, h, true);
        norms.push(format!("{p}.norm"));
        linear(format!("{p}.modulation.lin"), h, 3 * h, true);
    }
    linear("final_layer.linear".into(), h, cfg.out_channels, true);
    linear("final_layer.adaLN_modulation.1".into(), h, 2 * h, true);
    for norm in norms {
        for which in ["query_norm", "key_norm"] {
            out.push((format!("{norm}.{which}.scale"), vec![head]));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_and_schnell_have_the_released_parameter_counts() {
        let count = |cfg: &FluxConfig| -> u64 {
            official_shapes(cfg)
                .iter()
                .map(|(_, s)| s.iter().product::<usize>() as u64)
                .sum()
        };
        let dev = official_shapes(&FluxConfig::dev());
        // Embedders; 19 double blocks of 10 linears (weight, bias) and 2 q/k norms; 38 single blocks of 3 and 1; the head.
        assert_eq!(dev.len(), 2 + 3 * 4 + 2 + 19 * (20 + 4) + 38 * (6 + 2) + 4);
        assert_eq!(count(&FluxConfig::dev()), 11_901_408_320);
        assert_eq!(
            count(&FluxConfig::schnell()),
            11_901_408_320 - 3072 * (256 + 3072 + 2)
        );
        let names: std::collections::BTreeSet<&str> = dev.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names.len(), dev.len(), "names are unique");
        for name in [
            "guidance_in.out_layer.bias",
            "double_blocks.18.txt_attn.norm.key_norm.scale",
            "single_blocks.37.linear2.weight",
            "final_layer.adaLN_modulation.1.weight",
        ] {
            assert!(names.contains(name), "{name}");
        }
    }
}
