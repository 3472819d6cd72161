//! The demo's base model (demo only): a tiny Wan-architecture DiT with seeded random weights, arranged so the
//! frozen base is a sensible starting point for a LoRA — the head undoes the patch embedding (so the untrained
//! model passes its noisy input through, roughly the right velocity near pure noise), the blocks start as the
//! identity, and the frozen timestep path only nudges the modulation (gates near 1, shifts and scales
//! near 0, still telling the blocks the noise level). A fully random base would leave the LoRA mostly cancelling
//! noise and random per-timestep gates.

use std::collections::HashMap;

use candle_core::{DType, Device, Result, Tensor};

use framesmith_models::wan::random::random_weights;
use framesmith_models::wan::WanConfig;

/// Scale of the blocks' output projections (`self_attn.o`, `cross_attn.o`, `ffn.2`) relative to a random init: 0,
/// so the untrained blocks pass the noisy input through untouched and the LoRA writes every update.
const BLOCK_OUTPUT_SCALE: f64 = 0.0;
/// Scale of the time embedding's output (the head's shift and scale come straight from it).
const TIME_EMBEDDING_SCALE: f64 = 0.1;
/// Scale of the time projection (the blocks' per-timestep shift, scale and gate offsets) after the smaller time
/// embedding.
const TIME_PROJECTION_SCALE: f64 = 2.0;
/// Rows of a block's `modulation` [1, 6, dim] that are gates (after self-attention and after the FFN).
const GATE_ROWS: [usize; 2] = [2, 5];

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
    // Pᵀ·P ≈ (dim / (in_dim·patch))·I for a random P: scaled back, noise passes through at its own size.
    let head = (head * ((c * patch) as f64 / d as f64))?;
    w.insert("head.head.weight".into(), head);
    for key in ["head.head.bias", "head.modulation", "patch_embedding.bias"] {
        if let Some(t) = w.get(key) {
            let zero = t.zeros_like()?;
            w.insert(key.into(), zero);
        }
    }
    let scaled: Vec<(String, Tensor)> = w
        .iter()
        .filter_map(|(k, t)| {
            let scale = if k.ends_with("self_attn.o.weight")
                || k.ends_with("cross_attn.o.weight")
                || k.ends_with("ffn.2.weight")
            {
                BLOCK_OUTPUT_SCALE
            } else if k.starts_with("time_embedding.2.") {
                TIME_EMBEDDING_SCALE
            } else if k == "time_projection.1.weight" {
                TIME_PROJECTION_SCALE
            } else {
                return None;
            };
            Some((t * scale).map(|t| (k.clone(), t)))
        })
        .collect::<Result<_>>()?;
    w.extend(scaled);
    let gates: Vec<(String, Tensor)> = w
        .iter()
        .filter(|(k, _)| k.starts_with("blocks.") && k.ends_with(".modulation"))
        .map(|(k, t)| Ok((k.clone(), gates_at_one(t)?)))
        .collect::<Result<_>>()?;
    w.extend(gates);
    Ok(w)
}

/// A block's `modulation` [1, 6, dim] with its gate rows set to 1, so every block update passes at full weight.
fn gates_at_one(modulation: &Tensor) -> Result<Tensor> {
    let rows = (0..6)
        .map(|i| {
            let row = modulation.narrow(1, i, 1)?;
            if GATE_ROWS.contains(&i) {
                row.ones_like()
            } else {
                Ok(row)
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Tensor::cat(&rows, 1)
}
