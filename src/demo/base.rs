//! The demo's base model (demo only): a tiny Wan-architecture DiT with seeded random weights, arranged so the
//! frozen base is a sensible starting point for a LoRA — the head undoes the patch embedding (so the untrained
//! model passes its noisy input through, roughly the right velocity near pure noise) and the blocks start as small
//! residual updates. A fully random base would leave the LoRA mostly cancelling noise.

use std::collections::HashMap;

use candle_core::{DType, Device, Result, Tensor};

use crate::models::wan::random::random_weights;
use crate::models::wan::WanConfig;

/// Scale of the blocks' output projections (`self_attn.o`, `cross_attn.o`, `ffn.2`) relative to a random init.
const BLOCK_OUTPUT_SCALE: f64 = 0.1;

/// Demo base weights for `cfg` (patch size (1, 2, 2), `in_dim == out_dim`).
pub fn demo_base_weights(
    cfg: &WanConfig,
    seed: u64,
    device: &Device,
) -> Result<HashMap<String, Tensor>> {
    let mut w = random_weights(cfg, seed, DType::F32, device)?;
    let [pt, ph, pw] = cfg.patch_size;
    let patch = pt * ph * pw;
    let (d, c) = (cfg.dim, cfg.in_dim);
    if c != cfg.out_dim {
        candle_core::bail!("the demo base needs in_dim == out_dim");
    }
    // patch_embedding.weight [d, c, pt, ph, pw] as P [d, c·patch] (column order c, p);
    // head.head.weight rows are ordered (p, c): head = Pᵀ with its rows permuted to that order.
    let p = w
        .get("patch_embedding.weight")
        .map(|t| t.reshape((d, c * patch)))
        .transpose()?
        .ok_or_else(|| candle_core::Error::Msg("no patch embedding".into()))?;
    let head = p
        .t()?
        .reshape((c, patch, d))?
        .transpose(0, 1)?
        .reshape((patch * c, d))?
        .contiguous()?;
    w.insert("head.head.weight".into(), head);
    for key in ["head.head.bias", "head.modulation", "patch_embedding.bias"] {
        if let Some(t) = w.get(key) {
            let zero = t.zeros_like()?;
            w.insert(key.into(), zero);
        }
    }
    let scaled: Vec<(String, Tensor)> = w
        .iter()
        .filter(|(k, _)| {
            k.ends_with("self_attn.o.weight")
                || k.ends_with("cross_attn.o.weight")
                || k.ends_with("ffn.2.weight")
        })
        .map(|(k, t)| Ok((k.clone(), (t * BLOCK_OUTPUT_SCALE)?)))
        .collect::<Result<_>>()?;
    w.extend(scaled);
    Ok(w)
}
