//! The demo base's time path: the time embedding that carries the head's 1/t gain (fitted by least squares over
//! the model timesteps) and the blocks' smooth signal of the noise level.

use std::collections::HashMap;

use candle_core::{DType, Device, Result, Tensor};
use rand::rngs::StdRng;

use super::{normals, tensor, Layout, FIT_RIDGE, MAX_TIMESTEP, MIN_GAIN_T, SHIFT_ROWS};
use framesmith_models::wan::embeddings::sinusoidal_embedding;
use framesmith_models::wan::WanConfig;

/// The time path. `time_embedding` gives e(τ) = u(τ) on every content channel, with 1 + u(τ) ≈ the head's gain
/// fitted by least squares over the model timesteps, and smooth features of τ on the reference channels. The
/// head's scale is 1 + e and its shift e: on the content channels a uniform gain (the shift lies along the
/// all-ones vector, which Pᵀ ignores). `time_projection` gives each block's shift rows a centred signal of the
/// noise level with unit spread on the reference channels; scales and gates do not depend on it.
pub(super) fn time_path(
    w: &mut HashMap<String, Tensor>,
    cfg: &WanConfig,
    layout: &Layout,
    rng: &mut StdRng,
) -> Result<()> {
    let (d, f) = (layout.dim, cfg.freq_dim);
    let (fc0, fc0_bias) = time_features(d, f, rng);
    let taus: Vec<f64> = (0..=MAX_TIMESTEP as usize).map(|i| i as f64).collect();
    let hidden = hidden_features(&fc0, &fc0_bias, f, &taus)?;
    let targets: Vec<f64> = taus
        .iter()
        .map(|tau| layout.gain(((tau - 1.0) / 1000.0).clamp(0.0, 1.0)) - 1.0)
        .collect();
    let (u_weight, u_bias) = least_squares(&hidden, &targets, FIT_RIDGE)?;
    let ramps = d / 2;
    let mut fc2 = vec![0f64; d * d];
    let mut fc2_bias = vec![0f64; d];
    for i in 0..d {
        if i < layout.content {
            fc2[i * d..(i + 1) * d].copy_from_slice(&u_weight);
            fc2_bias[i] = u_bias;
        } else {
            let row = normals(rng, d - ramps);
            for (j, v) in row.iter().enumerate() {
                fc2[i * d + ramps + j] = v / ((d - ramps) as f64).sqrt();
            }
        }
    }
    let silu_e: Vec<Vec<f64>> = hidden
        .iter()
        .map(|h| {
            (0..d)
                .map(|i| silu(fc2_bias[i] + (0..d).map(|j| fc2[i * d + j] * h[j]).sum::<f64>()))
                .collect()
        })
        .collect();
    let (proj, proj_bias) = shift_projection(layout, &silu_e, rng);
    w.insert("time_embedding.0.weight".into(), tensor(fc0, &[d, f])?);
    w.insert("time_embedding.0.bias".into(), tensor(fc0_bias, &[d])?);
    w.insert("time_embedding.2.weight".into(), tensor(fc2, &[d, d])?);
    w.insert("time_embedding.2.bias".into(), tensor(fc2_bias, &[d])?);
    w.insert(
        "time_projection.1.weight".into(),
        tensor(proj, &[6 * d, d])?,
    );
    w.insert(
        "time_projection.1.bias".into(),
        tensor(proj_bias, &[6 * d])?,
    );
    Ok(())
}

fn silu(z: f64) -> f64 {
    z / (1.0 + (-z).exp())
}

/// `time_embedding.0` [d, f] and its bias. The first half of the hidden units are ramps SiLU(a·(s − knot)) of the
/// slowest sine channel s(τ) ≈ t, with knots log-spaced over the noise levels (a basis for the head's gain); the
/// others are random mixes of the channels slower than half a turn over the timestep range (smooth features).
fn time_features(d: usize, f: usize, rng: &mut StdRng) -> (Vec<f64>, Vec<f64>) {
    let half = f / 2;
    let frequency = |j: usize| 10000f64.powf(-((j % half) as f64) / half as f64);
    let smooth: Vec<bool> = (0..f)
        .map(|j| MAX_TIMESTEP * frequency(j) <= std::f64::consts::PI)
        .collect();
    let n_smooth = smooth.iter().filter(|s| **s).count().max(1) as f64;
    let slow = f - 1;
    let slow_max = (frequency(slow) * MAX_TIMESTEP).sin();
    let ramps = d / 2;
    let lowest = MIN_GAIN_T / 4.0;
    let knot = |i: usize| lowest * (1.0 / lowest).powf(i as f64 / (ramps - 1) as f64);
    let mut weight = vec![0f64; d * f];
    let mut bias = vec![0f64; d];
    for i in 0..d {
        if i < ramps {
            let spacing = if i + 1 < ramps {
                knot(i + 1) - knot(i)
            } else {
                knot(i) - knot(i - 1)
            };
            let a = 2.0 / spacing;
            weight[i * f + slow] = a / slow_max;
            bias[i] = -a * knot(i);
        } else {
            let row = normals(rng, f);
            for j in (0..f).filter(|&j| smooth[j]) {
                weight[i * f + j] = row[j] / n_smooth.sqrt();
            }
            bias[i] = 0.5 * normals(rng, 1)[0];
        }
    }
    (weight, bias)
}

/// SiLU(fc0 · sinusoid(τ) + bias) for every τ: [τ][d].
fn hidden_features(fc0: &[f64], bias: &[f64], f: usize, taus: &[f64]) -> Result<Vec<Vec<f64>>> {
    let sin = sinusoidal_embedding(f, taus, &Device::Cpu)?
        .to_dtype(DType::F64)?
        .to_vec2::<f64>()?;
    Ok(sin
        .iter()
        .map(|s| {
            bias.iter()
                .enumerate()
                .map(|(i, b)| silu(b + (0..f).map(|j| fc0[i * f + j] * s[j]).sum::<f64>()))
                .collect()
        })
        .collect())
}

/// `time_projection.1` [6d, d] and its bias: the shift rows read SiLU(e) on the reference channels and write
/// the reference channels, centred over the timesteps and scaled to unit spread; every other row is zero.
fn shift_projection(
    layout: &Layout,
    silu_e: &[Vec<f64>],
    rng: &mut StdRng,
) -> (Vec<f64>, Vec<f64>) {
    let (d, content) = (layout.dim, layout.content);
    let width = d - content;
    let mut proj = vec![0f64; 6 * d * d];
    let mut bias = vec![0f64; 6 * d];
    for row in SHIFT_ROWS {
        let raw = normals(rng, width * width);
        let outs: Vec<Vec<f64>> = silu_e
            .iter()
            .map(|e| {
                (0..width)
                    .map(|o| {
                        (0..width)
                            .map(|j| raw[o * width + j] * e[content + j])
                            .sum()
                    })
                    .collect()
            })
            .collect();
        let count = outs.len() as f64;
        let mean: Vec<f64> = (0..width)
            .map(|o| outs.iter().map(|v| v[o]).sum::<f64>() / count)
            .collect();
        let variance = outs
            .iter()
            .flat_map(|v| v.iter().zip(&mean).map(|(a, m)| (a - m).powi(2)))
            .sum::<f64>()
            / (count * width as f64);
        let scale = 1.0 / variance.sqrt().max(1e-12);
        for o in 0..width {
            for j in 0..width {
                proj[(row * d + content + o) * d + content + j] = raw[o * width + j] * scale;
            }
            bias[row * d + content + o] = -mean[o] * scale;
        }
    }
    (proj, bias)
}

/// Ridge least squares: weights and intercept minimising Σ (b + w·x − y)² + λ‖w‖² (λ relative to the largest
/// diagonal entry), by the normal equations with Gauss–Jordan elimination and partial pivoting.
pub(super) fn least_squares(xs: &[Vec<f64>], ys: &[f64], lambda: f64) -> Result<(Vec<f64>, f64)> {
    let m = xs.first().map_or(0, Vec::len) + 1;
    let mut a = vec![vec![0f64; m + 1]; m];
    for (x, y) in xs.iter().zip(ys) {
        let row: Vec<f64> = x.iter().copied().chain([1.0]).collect();
        for i in 0..m {
            for j in 0..m {
                a[i][j] += row[i] * row[j];
            }
            a[i][m] += row[i] * y;
        }
    }
    let largest = (0..m).map(|i| a[i][i]).fold(0f64, f64::max).max(1e-12);
    for (i, r) in a.iter_mut().enumerate().take(m - 1) {
        r[i] += lambda * largest;
    }
    for col in 0..m {
        let pivot = (col..m)
            .max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))
            .unwrap_or(col);
        a.swap(col, pivot);
        let p = a[col][col];
        if p.abs() < 1e-300 {
            candle_core::bail!("the demo base's time fit is singular");
        }
        let pivot_row = a[col].clone();
        for (r, row) in a.iter_mut().enumerate() {
            let factor = row[col] / p;
            if r != col && factor != 0.0 {
                for k in col..=m {
                    row[k] -= factor * pivot_row[k];
                }
            }
        }
    }
    let solution: Vec<f64> = (0..m).map(|i| a[i][m] / a[i][i]).collect();
    Ok((solution[..m - 1].to_vec(), solution[m - 1]))
}
