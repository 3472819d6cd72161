//! The demo's base model (demo only): a tiny Wan-architecture DiT whose weights are laid out, not trained, as a
//! video model that knows one thing — a clip goes on as it started — so that a LoRA on its blocks learns the demo
//! clips' motion, shapes and colours in a few hundred CPU steps.
//!
//! - The residual stream keeps the latent exactly: an isometric patch embedding on the "content" channels, next
//!   to a large constant reference vector (the patch embedding's bias) on the other channels, so every layer norm
//!   acts as a near-constant scale and the blocks see the latent linearly, magnitudes included.
//! - The head reads the content channels back and divides by the noise level (a gain fitted by least squares
//!   into the time embedding), so a block update of −(the clean latent) becomes the flow-matching velocity
//!   (noisy − clean) / t: blocks only have to say what the clean clip looks like.
//! - Each block's self-attention looks at the same place in the previous latent frame (constant queries and keys
//!   under the 3D RoPE); in the first block each head copies one frame's slot of what it sees, so the untrained
//!   base predicts "the start frame, a little blurred" for every later frame — the start image held still. The LoRA learns where to look (the motion) and what to draw;
//!   with no q/k norms (`demo_model_config`) it can also sharpen the look, which the base keeps soft so that the
//!   gradient reaches the neighbouring tokens.
//! - The blocks learn the noise level from a smooth signal in their modulation shifts; gates start at 1 and the
//!   other output projections at 0.

mod time;

use std::collections::HashMap;

use candle_core::{DType, Device, Result, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};

use framesmith_models::wan::random::random_weights;
use framesmith_models::wan::rope;
use framesmith_models::wan::WanConfig;
use time::time_path;

/// Norm of the reference vector relative to an embedded noise token (a larger one makes the layer norms more
/// linear, a smaller one leaves the blocks more room).
const REFERENCE_SCALE: f64 = 3.0;
/// Weight of the self-attention query and key norms: how sharply the base looks at the previous frame's same
/// position (soft enough that the LoRA's gradient reaches the neighbours it should look at instead).
const ATTENTION_SHARPNESS: f64 = 1.2;
/// The spatial RoPE pairs the attention's position kernel uses and their weights: the two fastest pairs of a
/// 64-wide head (one and 0.4 radians a token), weighted so the kernel's drop from its peak is largest at its
/// smallest (no alias across the 16 tokens of a demo frame's row or column).
const SPATIAL_PAIRS: [(usize, f64); 2] = [(0, 0.56), (1, 0.44)];
/// Below this noise level the head's gain stops growing as 1/t (the sampler's last step starts above it).
const MIN_GAIN_T: f64 = 0.02;
/// Expected squared velocity per latent value, E(ε − x)², for latents of about half unit variance.
const VELOCITY_POWER: f64 = 1.5;
/// Expected squared value of a clean latent, for the copy's gain.
const LATENT_POWER: f64 = 0.5;
/// Largest model timestep (the trainer gives t·1000 + 1).
const MAX_TIMESTEP: f64 = 1001.0;
/// Ridge of the time embedding's least-squares fit, relative to its largest normal-equation entry.
const FIT_RIDGE: f64 = 1e-10;
/// Rows of a block's `modulation` [1, 6, dim] that are shifts and gates.
const SHIFT_ROWS: [usize; 2] = [0, 3];
const GATE_ROWS: [usize; 2] = [2, 5];

/// Channel layout of the residual stream.
struct Layout {
    dim: usize,
    /// Values per token (`in_dim` · patch).
    tokens: usize,
    /// Channels 0..content carry the latent (orthogonal to the all-ones vector), the rest the reference.
    content: usize,
    /// Scale of the patch embedding's orthonormal columns.
    rho: f64,
    /// Norm of the reference vector.
    reference: f64,
}

impl Layout {
    fn new(cfg: &WanConfig) -> Result<Self> {
        let patch: usize = cfg.patch_size.iter().product();
        let (dim, tokens) = (cfg.dim, cfg.in_dim * patch);
        let content = (tokens + 1 + dim) / 2;
        if cfg.in_dim != cfg.out_dim || content >= dim - 1 {
            candle_core::bail!("the demo base needs in_dim == out_dim and dim > in_dim·patch + 2");
        }
        let rho = (dim as f64 / tokens as f64).sqrt();
        Ok(Self {
            dim,
            tokens,
            content,
            rho,
            reference: REFERENCE_SCALE * rho * (tokens as f64).sqrt(),
        })
    }

    /// The residual's norm with the reference and a latent of squared norm `power` per value.
    fn residual_norm(&self, power: f64) -> f64 {
        (self.reference.powi(2) + self.rho.powi(2) * power * self.tokens as f64).sqrt()
    }

    /// The head's gain at noise level `t` relative to t = 1: 1/t, with the residual's growth at high noise undone.
    fn gain(&self, t: f64) -> f64 {
        let t = t.hypot(MIN_GAIN_T);
        self.residual_norm(VELOCITY_POWER * t * t) / (self.residual_norm(VELOCITY_POWER) * t)
    }
}

/// Demo base weights for `cfg` (`in_dim == out_dim`, `dim` > `in_dim`·patch + 2).
pub fn demo_base_weights(
    cfg: &WanConfig,
    seed: u64,
    device: &Device,
) -> Result<HashMap<String, Tensor>> {
    let layout = Layout::new(cfg)?;
    let mut w = random_weights(cfg, seed, DType::F32, &Device::Cpu)?;
    let rng = &mut StdRng::seed_from_u64(seed);
    // P: orthonormal columns on the content channels; the reference on the others.
    let p = orthonormal(rng, layout.content, layout.tokens);
    let b = orthonormal(rng, layout.dim - layout.content, 1);
    embedding(&mut w, cfg, &layout, &p, &b)?;
    head(&mut w, cfg, &layout, &p)?;
    time_path(&mut w, cfg, &layout, rng)?;
    let copy_gain = layout.residual_norm(LATENT_POWER) / (layout.dim as f64).sqrt();
    for block in 0..cfg.num_layers {
        identity_block(&mut w, block)?;
        let copy = (block == 0).then_some((p.as_slice(), copy_gain));
        previous_frame_attention(&mut w, cfg, block, copy)?;
    }
    w.into_iter()
        .map(|(k, t)| Ok((k, t.to_device(device)?)))
        .collect()
}

/// An f32 CPU tensor from f64 values.
fn tensor(values: Vec<f64>, shape: &[usize]) -> Result<Tensor> {
    let values: Vec<f32> = values.into_iter().map(|v| v as f32).collect();
    Tensor::from_vec(values, shape, &Device::Cpu)
}

fn normals(rng: &mut StdRng, count: usize) -> Vec<f64> {
    (0..count).map(|_| StandardNormal.sample(rng)).collect()
}

/// `cols` random orthonormal vectors of length `len`, each orthogonal to the all-ones vector (Gram–Schmidt), as
/// rows `[len][cols]`.
fn orthonormal(rng: &mut StdRng, len: usize, cols: usize) -> Vec<Vec<f64>> {
    let mut basis = vec![vec![1.0 / (len as f64).sqrt(); len]];
    while basis.len() <= cols {
        let mut v = normals(rng, len);
        for b in &basis {
            let dot: f64 = v.iter().zip(b).map(|(x, y)| x * y).sum();
            v.iter_mut().zip(b).for_each(|(x, y)| *x -= dot * y);
        }
        let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        if norm > 1e-6 {
            basis.push(v.into_iter().map(|x| x / norm).collect());
        }
    }
    (0..len)
        .map(|i| basis[1..].iter().map(|b| b[i]).collect())
        .collect()
}

/// `patch_embedding`: ρ·P on the content channels, the reference vector as its bias.
fn embedding(
    w: &mut HashMap<String, Tensor>,
    cfg: &WanConfig,
    layout: &Layout,
    p: &[Vec<f64>],
    b: &[Vec<f64>],
) -> Result<()> {
    let (d, n) = (layout.dim, layout.tokens);
    let mut weight = vec![0f64; d * n];
    for (i, row) in p.iter().enumerate() {
        for (j, v) in row.iter().enumerate() {
            weight[i * n + j] = v * layout.rho;
        }
    }
    let mut bias = vec![0f64; d];
    for (i, row) in b.iter().enumerate() {
        bias[layout.content + i] = row[0] * layout.reference;
    }
    let [pt, ph, pw] = cfg.patch_size;
    w.insert(
        "patch_embedding.weight".into(),
        tensor(weight, &[d, cfg.in_dim, pt, ph, pw])?,
    );
    w.insert("patch_embedding.bias".into(), tensor(bias, &[d])?);
    Ok(())
}

/// `head`: Pᵀ with its rows in the head's (patch, channel) order, scaled so the gain at t = 1 is 1; no bias and
/// no modulation of its own (the time embedding alone sets its scale).
fn head(
    w: &mut HashMap<String, Tensor>,
    cfg: &WanConfig,
    layout: &Layout,
    p: &[Vec<f64>],
) -> Result<()> {
    let (d, n, c) = (layout.dim, layout.tokens, cfg.in_dim);
    let patch = n / c;
    // LN(h) on the content channels is ρ·P·x·√d / ‖h‖; the head maps it back to x at the residual's norm at t = 1.
    let scale = layout.residual_norm(VELOCITY_POWER) / (layout.rho.powi(2) * (d as f64).sqrt())
        * layout.rho;
    let mut weight = vec![0f64; n * d];
    for ci in 0..c {
        for pi in 0..patch {
            let (col, row) = (ci * patch + pi, pi * c + ci);
            for (i, prow) in p.iter().enumerate() {
                weight[row * d + i] = prow[col] * scale;
            }
        }
    }
    w.insert("head.head.weight".into(), tensor(weight, &[n, d])?);
    w.insert("head.head.bias".into(), tensor(vec![0.0; n], &[n])?);
    w.insert(
        "head.modulation".into(),
        tensor(vec![0.0; 2 * d], &[1, 2, d])?,
    );
    Ok(())
}

/// A block that starts as the identity: its output projections (and their biases) zero, its modulation zero
/// but for gates of 1, so a LoRA update passes at full weight.
fn identity_block(w: &mut HashMap<String, Tensor>, block: usize) -> Result<()> {
    let prefix = format!("blocks.{block}.");
    for name in ["self_attn.o", "cross_attn.o", "ffn.2"] {
        for part in ["weight", "bias"] {
            let key = format!("{prefix}{name}.{part}");
            if let Some(t) = w.get(&key) {
                let zero = t.zeros_like()?;
                w.insert(key, zero);
            }
        }
    }
    let key = format!("{prefix}modulation");
    if let Some(t) = w.get(&key) {
        let rows = (0..6)
            .map(|i| {
                let row = t.narrow(1, i, 1)?;
                if GATE_ROWS.contains(&i) {
                    row.ones_like()
                } else {
                    row.zeros_like()
                }
            })
            .collect::<Result<Vec<_>>>()?;
        w.insert(key, Tensor::cat(&rows, 1)?);
    }
    Ok(())
}

/// Block `block`'s self-attention looks at the same position in the previous frame: constant queries and keys
/// (biases only) on the fastest two RoPE frequencies of each axis, the query's frame part turned one frame back.
/// With `copy` (P and a gain), its values read the latent off the content channels and its output writes it back
/// negated, so the block predicts "the previous frame" as the clean clip.
fn previous_frame_attention(
    w: &mut HashMap<String, Tensor>,
    cfg: &WanConfig,
    block: usize,
    copy: Option<(&[Vec<f64>], f64)>,
) -> Result<()> {
    let (d, heads) = (cfg.dim, cfg.num_heads);
    let head_dim = d / heads;
    let [frame_pairs, height_pairs, _] = rope::split(head_dim);
    let angles = rope::angle_table(head_dim);
    let [(fast, fast_weight), (slow, slow_weight)] = SPATIAL_PAIRS;
    // (pair, frames back, weight): the fastest frame pair; two pairs of each spatial axis.
    let pairs = [
        (0, 1.0, 1.0),
        (frame_pairs + fast, 0.0, fast_weight),
        (frame_pairs + slow, 0.0, slow_weight),
        (frame_pairs + height_pairs + fast, 0.0, fast_weight),
        (frame_pairs + height_pairs + slow, 0.0, slow_weight),
    ];
    let mut query = vec![0f64; d];
    let mut key = vec![0f64; d];
    for head in 0..heads {
        for (pair, frames_back, weight) in pairs {
            let phase = -angles[1][pair] * frames_back;
            let at = head * head_dim + 2 * pair;
            let amplitude = weight.sqrt();
            query[at] = amplitude * phase.cos();
            query[at + 1] = amplitude * phase.sin();
            key[at] = amplitude;
        }
    }
    // Without q/k norms the biases are scaled to what the norms would give (RMS `ATTENTION_SHARPNESS`), and the
    // LoRA can sharpen the attention as it learns where to look.
    let rms = (query.iter().map(|v| v * v).sum::<f64>() / d as f64)
        .sqrt()
        .max(1e-12);
    let scale = if cfg.qk_norm {
        1.0
    } else {
        ATTENTION_SHARPNESS / rms
    };
    let prefix = format!("blocks.{block}.self_attn");
    for (name, bias) in [("q", query), ("k", key)] {
        w.insert(
            format!("{prefix}.{name}.weight"),
            tensor(vec![0.0; d * d], &[d, d])?,
        );
        let bias = bias.into_iter().map(|v| v * scale).collect();
        w.insert(format!("{prefix}.{name}.bias"), tensor(bias, &[d])?);
        if cfg.qk_norm {
            w.insert(
                format!("{prefix}.norm_{name}.weight"),
                tensor(vec![ATTENTION_SHARPNESS; d], &[d])?,
            );
        }
    }
    let Some((p, gain)) = copy else {
        return Ok(());
    };
    // Head h's first n/heads value dimensions read latent coordinates h·n/heads.. of P; `o` writes them back.
    let n = p.first().map_or(0, Vec::len);
    let per_head = n / heads;
    let mut value = vec![0f64; d * d];
    let mut out = vec![0f64; d * d];
    for coord in 0..per_head * heads {
        let row = (coord / per_head) * head_dim + coord % per_head;
        for (i, prow) in p.iter().enumerate() {
            value[row * d + i] = prow[coord];
            out[i * d + row] = -prow[coord] * gain;
        }
    }
    w.insert(format!("{prefix}.v.weight"), tensor(value, &[d, d])?);
    w.insert(format!("{prefix}.v.bias"), tensor(vec![0.0; d], &[d])?);
    w.insert(format!("{prefix}.o.weight"), tensor(out, &[d, d])?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::time::least_squares;
    use super::*;
    use crate::family::wan::demo_setup::demo_model_config;
    use crate::family::wan::denoise::first_frame_row;
    use framesmith_models::wan::embeddings::sinusoidal_embedding;
    use framesmith_models::wan::{ModelOptions, Timesteps, WanInputs, WanModel};
    use framesmith_nn::vb::Vb;

    #[test]
    fn orthonormal_columns_are_orthonormal_and_zero_mean() {
        let rows = orthonormal(&mut StdRng::seed_from_u64(3), 12, 5);
        for a in 0..5 {
            assert!(rows.iter().map(|r| r[a]).sum::<f64>().abs() < 1e-12);
            for b in 0..5 {
                let dot: f64 = rows.iter().map(|r| r[a] * r[b]).sum();
                assert!((dot - f64::from(u8::from(a == b))).abs() < 1e-12);
            }
        }
    }

    #[test]
    fn least_squares_recovers_a_line() -> Result<()> {
        let xs: Vec<Vec<f64>> = (0..20).map(|i| vec![i as f64, (i * i) as f64]).collect();
        let ys: Vec<f64> = xs.iter().map(|x| 3.0 - 2.0 * x[0] + 0.5 * x[1]).collect();
        let (w, b) = least_squares(&xs, &ys, 0.0)?;
        assert!((w[0] + 2.0).abs() < 1e-6 && (w[1] - 0.5).abs() < 1e-6 && (b - 3.0).abs() < 1e-6);
        Ok(())
    }

    /// The head's gain, read off the model's own time embedding, follows 1/t to within 2% over every timestep.
    #[test]
    fn the_time_embedding_gives_the_head_a_one_over_t_gain() -> Result<()> {
        let cfg = demo_model_config();
        let layout = Layout::new(&cfg)?;
        let w = demo_base_weights(&cfg, 1, &Device::Cpu)?;
        let get = |k: &str| -> Result<Vec<f32>> { w[k].flatten_all()?.to_vec1::<f32>() };
        let (fc0, b0, fc2, b2) = (
            get("time_embedding.0.weight")?,
            get("time_embedding.0.bias")?,
            get("time_embedding.2.weight")?,
            get("time_embedding.2.bias")?,
        );
        let (d, f) = (cfg.dim, cfg.freq_dim);
        let taus: Vec<f64> = (0..=1001).step_by(7).map(|i| i as f64).collect();
        let sin = sinusoidal_embedding(f, &taus, &Device::Cpu)?.to_vec2::<f32>()?;
        for (tau, s) in taus.iter().zip(&sin) {
            let hidden: Vec<f32> = (0..d)
                .map(|i| {
                    let z = b0[i] + (0..f).map(|j| fc0[i * f + j] * s[j]).sum::<f32>();
                    z / (1.0 + (-z).exp())
                })
                .collect();
            // Content channel 0: e = u(τ), the head's scale is 1 + u.
            let u = b2[0] + (0..d).map(|j| fc2[j] * hidden[j]).sum::<f32>();
            let want = layout.gain(((tau - 1.0) / 1000.0).clamp(0.0, 1.0));
            let error = (f64::from(1.0 + u) / want - 1.0).abs();
            assert!(error < 0.02, "τ = {tau}: gain {} for {want}", 1.0 + u);
        }
        Ok(())
    }

    /// Untrained, the base predicts the previous frame: on a still clip of one colour, its velocity for the first
    /// generated frame is the flow-matching target noise − latent.
    #[test]
    fn the_untrained_base_holds_the_start_frame() -> Result<()> {
        let cfg = demo_model_config();
        let dev = Device::Cpu;
        let w = demo_base_weights(&cfg, 2024, &dev)?;
        let model = WanModel::new(
            &cfg,
            Vb::from_tensors(w, DType::F32, &dev),
            &ModelOptions::default(),
        )?;
        let shape = [cfg.in_dim, 3, 8, 8];
        let colour = [0.6f32, -0.4, 0.2];
        // Every demo-codec channel is one colour of one pixel phase.
        let clean: Vec<f32> = (0..cfg.in_dim * 3 * 64)
            .map(|i| colour[(i / (3 * 64)) % 3])
            .collect();
        let clean = Tensor::from_vec(clean, shape.as_slice(), &dev)?;
        let noise = randn_tensor(&shape)?;
        let t = 0.5;
        let noisy = ((&clean * (1.0 - t))? + (&noise * t)?)?;
        let noisy = Tensor::cat(&[clean.narrow(1, 0, 1)?, noisy.narrow(1, 1, 2)?], 1)?;
        let inputs = WanInputs {
            latents: vec![noisy],
            timesteps: Timesteps::PerToken(vec![first_frame_row(&cfg, shape, t * 1000.0 + 1.0)]),
            context: vec![Tensor::zeros((4, cfg.text_dim), DType::F32, &dev)?],
            seq_len: None,
            clip: None,
            y: None,
        };
        let velocity = model.forward(&inputs)?.remove(0).narrow(1, 1, 1)?;
        let target = (noise - clean)?.narrow(1, 1, 1)?;
        let error = (&velocity - &target)?
            .sqr()?
            .sum_all()?
            .to_scalar::<f32>()?
            / target.sqr()?.sum_all()?.to_scalar::<f32>()?;
        assert!(error < 0.05, "relative squared error {error}");
        Ok(())
    }

    fn randn_tensor(shape: &[usize]) -> Result<Tensor> {
        let values = normals(&mut StdRng::seed_from_u64(9), shape.iter().product());
        tensor(values, shape)
    }
}
