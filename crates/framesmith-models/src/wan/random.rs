//! Random Wan DiT weights in the official layout, made in memory: for the demo's fresh tiny model, tests and
//! benchmarks of any variant without downloading a checkpoint. Drawn like the reference fixtures: matrices
//! N(0, 1/sqrt(fan_in)), biases N(0, 0.05), norm scales 1 + N(0, 0.1), modulation N(0, 0.1).

use std::collections::HashMap;

use candle_core::{DType, Device, Result, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::config::WanConfig;
use super::weights::official_shapes;
use framesmith_nn::init::randn;

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

/// Mean and standard deviation of a random official-layout tensor: modulation 0 ± 0.1, norm weights 1 ± 0.1,
/// biases 0 ± 0.05, everything else 0 ± 1/√fan_in.
pub fn init_stats(name: &str, shape: &[usize]) -> (f32, f32) {
    if name.ends_with("modulation") {
        (0.0, 0.1)
    } else if name.ends_with(".weight") && shape.len() == 1 {
        (1.0, 0.1)
    } else if name.ends_with(".bias") {
        (0.0, 0.05)
    } else {
        let fan_in: usize = shape[1..].iter().product();
        (0.0, 1.0 / (fan_in as f32).sqrt())
    }
}

/// Random weights for `cfg` in `dtype` drawn on `device` itself (seeded through [`Device::set_seed`]), with the
/// same distributions as [`random_weights`] but not the same values: what benchmarks of the 14B variants use,
/// where drawing 14 billion values on the host would take minutes.
pub fn random_weights_on_device(
    cfg: &WanConfig,
    seed: u64,
    dtype: DType,
    device: &Device,
) -> Result<HashMap<String, Tensor>> {
    random_weights_on_device_where(cfg, seed, dtype, device, |_, _| true)
}

/// [`random_weights_on_device`] for the weights `keep` accepts (by name and shape). On the CPU, whose generator
/// candle cannot seed, the values come from a seeded host generator instead, so the result is still
/// deterministic.
pub fn random_weights_on_device_where(
    cfg: &WanConfig,
    seed: u64,
    dtype: DType,
    device: &Device,
    keep: impl Fn(&str, &[usize]) -> bool,
) -> Result<HashMap<String, Tensor>> {
    let mut host_rng = if device.is_cpu() {
        Some(StdRng::seed_from_u64(seed))
    } else {
        device.set_seed(seed)?;
        None
    };
    let mut map = HashMap::new();
    for (name, shape) in official_shapes(cfg) {
        if !keep(&name, &shape) {
            continue;
        }
        let (mean, std) = init_stats(&name, &shape);
        let t = match host_rng.as_mut() {
            Some(rng) => randn(rng, shape.as_slice(), mean, std, device)?,
            None => Tensor::randn(mean, std, shape.as_slice(), device)?,
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
