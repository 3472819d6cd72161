//! Random Wan DiT weights in the official layout, made in memory: for the demo's fresh tiny model, tests and
//! benchmarks of any variant without downloading a checkpoint. Drawn like the reference fixtures: matrices
//! N(0, 1/sqrt(fan_in)), biases N(0, 0.05), norm scales 1 + N(0, 0.1), modulation N(0, 0.1).

use std::collections::HashMap;

use candle_core::{DType, Device, Result, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::config::WanConfig;
use crate::nn::init::randn;

/// Every tensor name of the official `WanModel.state_dict()` for `cfg`, with its shape.
pub fn official_shapes(cfg: &WanConfig) -> Vec<(String, Vec<usize>)> {
    let (d, f) = (cfg.dim, cfg.ffn_dim);
    let [pt, ph, pw] = cfg.patch_size;
    let patch = pt * ph * pw;
    let mut out: Vec<(String, Vec<usize>)> = Vec::new();
    let mut linear = |name: String, i: usize, o: usize| {
        out.push((format!("{name}.weight"), vec![o, i]));
        out.push((format!("{name}.bias"), vec![o]));
    };
    linear("text_embedding.0".into(), cfg.text_dim, d);
    linear("text_embedding.2".into(), d, d);
    linear("time_embedding.0".into(), cfg.freq_dim, d);
    linear("time_embedding.2".into(), d, d);
    linear("time_projection.1".into(), d, 6 * d);
    linear("head.head".into(), d, cfg.out_dim * patch);
    if cfg.has_clip() {
        linear("img_emb.proj.1".into(), cfg.clip_dim, cfg.clip_dim);
        linear("img_emb.proj.3".into(), cfg.clip_dim, d);
    }
    for i in 0..cfg.num_layers {
        let b = format!("blocks.{i}");
        for attn in ["self_attn", "cross_attn"] {
            for p in ["q", "k", "v", "o"] {
                linear(format!("{b}.{attn}.{p}"), d, d);
            }
        }
        if cfg.has_clip() {
            linear(format!("{b}.cross_attn.k_img"), d, d);
            linear(format!("{b}.cross_attn.v_img"), d, d);
        }
        linear(format!("{b}.ffn.0"), d, f);
        linear(format!("{b}.ffn.2"), f, d);
    }
    out.push((
        "patch_embedding.weight".into(),
        vec![d, cfg.in_dim, pt, ph, pw],
    ));
    out.push(("patch_embedding.bias".into(), vec![d]));
    out.push(("head.modulation".into(), vec![1, 2, d]));
    if cfg.has_clip() {
        for n in ["img_emb.proj.0", "img_emb.proj.4"] {
            let width = if n.ends_with('0') { cfg.clip_dim } else { d };
            out.push((format!("{n}.weight"), vec![width]));
            out.push((format!("{n}.bias"), vec![width]));
        }
    }
    for i in 0..cfg.num_layers {
        let b = format!("blocks.{i}");
        out.push((format!("{b}.modulation"), vec![1, 6, d]));
        if cfg.qk_norm {
            for n in [
                "self_attn.norm_q",
                "self_attn.norm_k",
                "cross_attn.norm_q",
                "cross_attn.norm_k",
            ] {
                out.push((format!("{b}.{n}.weight"), vec![d]));
            }
            if cfg.has_clip() {
                out.push((format!("{b}.cross_attn.norm_k_img.weight"), vec![d]));
            }
        }
        if cfg.cross_attn_norm {
            out.push((format!("{b}.norm3.weight"), vec![d]));
            out.push((format!("{b}.norm3.bias"), vec![d]));
        }
    }
    out
}

/// Random weights for `cfg` in `dtype` on `device`, deterministic for a given seed. Drawn on the host, so meant
/// for small models; benchmarks of large variants draw on the device instead.
pub fn random_weights(
    cfg: &WanConfig,
    seed: u64,
    dtype: DType,
    device: &Device,
) -> Result<HashMap<String, Tensor>> {
    let rng = &mut StdRng::seed_from_u64(seed);
    let mut map = HashMap::new();
    for (name, shape) in official_shapes(cfg) {
        let t = if name.ends_with("modulation") {
            randn(rng, shape.as_slice(), 0.0, 0.1, device)?
        } else if name.ends_with(".weight") && shape.len() == 1 {
            // 1-D weights are the norm scales (norm_q/k, norm3, img_emb's LayerNorms).
            randn(rng, shape.as_slice(), 1.0, 0.1, device)?
        } else if name.ends_with(".bias") {
            randn(rng, shape.as_slice(), 0.0, 0.05, device)?
        } else {
            let fan_in: usize = shape[1..].iter().product();
            randn(
                rng,
                shape.as_slice(),
                0.0,
                1.0 / (fan_in as f32).sqrt(),
                device,
            )?
        };
        map.insert(name, t.to_dtype(dtype)?);
    }
    Ok(map)
}

/// Random inputs for a batch of latents with the given latent sizes `[frames, height, width]`: latents, per-sample
/// timesteps in 0..1000, text contexts of varying length, and (for I2V) conditioning and CLIP features.
pub fn random_inputs(
    cfg: &WanConfig,
    sizes: &[[usize; 3]],
    seed: u64,
    device: &Device,
) -> Result<super::WanInputs> {
    let rng = &mut StdRng::seed_from_u64(seed);
    let c = cfg.out_dim;
    let y_channels = cfg.in_dim.saturating_sub(c);
    let latents = sizes
        .iter()
        .map(|&[f, h, w]| randn(rng, (c, f, h, w), 0.0, 1.0, device))
        .collect::<Result<Vec<_>>>()?;
    let context = (0..sizes.len())
        .map(|i| {
            randn(
                rng,
                ((3 + 2 * i).min(cfg.text_len).max(1), cfg.text_dim),
                0.0,
                1.0,
                device,
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let y = if y_channels > 0 {
        Some(
            sizes
                .iter()
                .map(|&[f, h, w]| randn(rng, (y_channels, f, h, w), 0.0, 1.0, device))
                .collect::<Result<Vec<_>>>()?,
        )
    } else {
        None
    };
    let clip = if cfg.has_clip() {
        Some(randn(
            rng,
            (sizes.len(), cfg.clip_tokens, cfg.clip_dim),
            0.0,
            1.0,
            device,
        )?)
    } else {
        None
    };
    let timesteps = (0..sizes.len())
        .map(|i| 1000.0 * (i as f64 + 0.5) / sizes.len() as f64)
        .collect();
    Ok(super::WanInputs {
        latents,
        timesteps: super::Timesteps::PerSample(timesteps),
        context,
        seq_len: None,
        clip,
        y,
    })
}
