//! Random weights of a whole Wan DiT at real size, made fast: FP8 block linears drawn as codes on the host.

use std::collections::HashMap;

use candle_core::{DType, Device, Result, Tensor};
use rayon::prelude::*;

use framesmith_models::wan::config::WanConfig;
use framesmith_models::wan::random::random_weights_on_device_where;
use framesmith_models::wan::weights::official_shapes;
use framesmith_nn::fp8::Fp8Scale;

/// Random e4m3 codes (never a NaN code) for a weight `[out, in]`, drawn in parallel on the host: building a 14B
/// model by quantising random bf16 weights on the host takes a minute, and the codes' values do not change the
/// timing.
fn random_codes(len: usize, seed: u64) -> Vec<u8> {
    let mut out = vec![0u8; len];
    out.par_chunks_mut(1 << 20)
        .enumerate()
        .for_each(|(c, chunk)| {
            let mut x =
                seed ^ (c as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x2545_F491_4F6C_DD1D;
            for b in chunk.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Codes 0..=0x57 and their negatives: |value| ≤ 2, no NaN (0x7F / 0xFF).
                let v = (x >> 32) as u8;
                *b = (v % 0x58) | (v & 0x80);
            }
        });
    out
}

/// Official-layout weights with the block linears already FP8 (codes on the host, block-64 or per-channel
/// scales) and everything else in bf16 on `dev`.
pub fn random_fp8_weights(
    cfg: &WanConfig,
    mode: Fp8Scale,
    seed: u64,
    dev: &Device,
) -> Result<HashMap<String, Tensor>> {
    let mut map = random_fp8_linears(cfg, mode, seed)?;
    map.extend(random_other_weights(cfg, seed, dev)?);
    Ok(map)
}

fn is_block_linear(name: &str, shape: &[usize]) -> bool {
    name.starts_with("blocks.") && name.ends_with(".weight") && shape.len() == 2
}

/// The FP8 codes and scales of every block linear, on the host (the bulk of a 14B model, and the slow part of
/// making one).
pub(super) fn random_fp8_linears(
    cfg: &WanConfig,
    mode: Fp8Scale,
    seed: u64,
) -> Result<HashMap<String, Tensor>> {
    let mut map = HashMap::new();
    for (i, (name, shape)) in official_shapes(cfg).into_iter().enumerate() {
        if !is_block_linear(&name, &shape) {
            continue;
        }
        let (out_dim, in_dim) = (shape[0], shape[1]);
        let codes = random_codes(out_dim * in_dim, seed.wrapping_add(i as u64));
        let codes =
            Tensor::from_raw_buffer(&codes, DType::F8E4M3, &[out_dim, in_dim], &Device::Cpu)?;
        let scale_dims = framesmith_nn::fp8::scale_dims(
            framesmith_nn::fp8::effective_mode(mode, in_dim),
            out_dim,
            in_dim,
        );
        let n: usize = scale_dims.iter().product();
        let scale =
            Tensor::full(0.02f32 / (in_dim as f32).sqrt(), n, &Device::Cpu)?.reshape(scale_dims)?;
        map.insert(
            format!("{}scale_weight", name.trim_end_matches("weight")),
            scale,
        );
        map.insert(name, codes);
    }
    Ok(map)
}

/// Every weight but the block linears, bf16 on `dev`.
pub(super) fn random_other_weights(
    cfg: &WanConfig,
    seed: u64,
    dev: &Device,
) -> Result<HashMap<String, Tensor>> {
    random_weights_on_device_where(cfg, seed, DType::BF16, dev, |name, shape| {
        !is_block_linear(name, shape)
    })
}
