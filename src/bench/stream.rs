//! Block-streaming benchmark (`framesmith-bench stream`): the checkpointed LoRA step of a whole Wan DiT with all
//! blocks resident and with N blocks streamed in each mode, timed in one run; the streaming path's copy bandwidth
//! against a plain page-locked host → device copy; and, with a VRAM budget, a run that may use only that much of
//! the card. `check` first compares streamed and resident LoRA gradients on a tiny config.

use std::collections::HashMap;

use candle_core::{DType, Device, Result, Tensor};
use rayon::prelude::*;

use super::step::{block_forward_flops, flow_batch, latent_size, total_peak, video_tokens};
use super::{record, time, Record, Timing};
use crate::models::wan::config::WanConfig;
use crate::models::wan::random::{init_stats, random_weights, random_weights_on_device};
use crate::models::wan::weights::official_shapes;
use crate::models::wan::{ModelOptions, WanModel};
use crate::nn::fp8::Fp8Scale;
use crate::nn::lora::{attach_loras, LoraSet, LoraSpec, WAN_DEFAULT_EXCLUDE};
use crate::nn::offload::{streamed_blocks, OffloadOptions, Placement, StreamMode};
use crate::nn::vb::Vb;
use crate::train::step::{checkpointed_step, LossTarget, StepOptions};

/// One configuration to time.
#[derive(Clone, Debug)]
pub struct StreamCase {
    /// `None`: every block resident.
    pub mode: Option<StreamMode>,
    pub blocks: usize,
    pub placement: Placement,
    /// GPU slots in the ring (streamed cases).
    pub slots: usize,
}

/// What to measure.
#[derive(Clone, Debug)]
pub struct StreamBench {
    pub frames: usize,
    pub height: usize,
    pub width: usize,
    pub rank: usize,
    pub fp8: Option<Fp8Scale>,
    pub residual: DType,
    pub activations_on_host: bool,
    /// No checkpointing ([`StepOptions::keep_tapes`]).
    pub keep_tapes: bool,
    pub slots: usize,
    pub staging_slots: usize,
    pub staging_chunk_bytes: usize,
    pub copy_threads: usize,
    pub warmup: usize,
    pub iters: usize,
    pub seed: u64,
}

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
    dev.set_seed(seed)?;
    let mut map = HashMap::new();
    for (i, (name, shape)) in official_shapes(cfg).into_iter().enumerate() {
        if !(name.starts_with("blocks.") && name.ends_with(".weight") && shape.len() == 2) {
            let (mean, std) = init_stats(&name, &shape);
            let t = Tensor::randn(mean, std, shape.as_slice(), dev)?.to_dtype(DType::BF16)?;
            map.insert(name, t);
            continue;
        }
        let (out_dim, in_dim) = (shape[0], shape[1]);
        let codes = random_codes(out_dim * in_dim, seed.wrapping_add(i as u64));
        let codes =
            Tensor::from_raw_buffer(&codes, DType::F8E4M3, &[out_dim, in_dim], &Device::Cpu)?;
        let scale_dims = crate::nn::fp8::scale_dims(
            crate::nn::fp8::effective_mode(mode, in_dim),
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

/// Builds the model with `streamed` blocks in host RAM and LoRA of `rank` on every adapted block linear.
pub fn build(
    cfg: &WanConfig,
    weights: HashMap<String, Tensor>,
    dev: &Device,
    opts: &StreamBench,
    streamed: &[usize],
    mode: StreamMode,
    slots: usize,
) -> Result<(WanModel, LoraSet)> {
    let vb = Vb::from_tensors(weights, DType::BF16, dev);
    let options = ModelOptions {
        residual_dtype: opts.residual,
        blocks_fp8: opts.fp8,
    };
    let offload = OffloadOptions {
        mode,
        slots,
        staging_slots: opts.staging_slots,
        staging_chunk_bytes: opts.staging_chunk_bytes,
        copy_threads: opts.copy_threads,
    };
    let mut model = if streamed.is_empty() {
        WanModel::new(cfg, vb, &options)?
    } else {
        WanModel::new_streamed(cfg, vb, &options, streamed, &offload)?
    };
    let spec = LoraSpec {
        rank: opts.rank,
        alpha: 0.0,
        dtype: DType::F32,
        include_patterns: Vec::new(),
        exclude_patterns: vec![WAN_DEFAULT_EXCLUDE.to_string()],
        seed: opts.seed,
    };
    let loras = attach_loras(model.linears_mut(), &spec)
        .map_err(|e| candle_core::Error::msg(e.to_string()))?;
    Ok((model, loras))
}

fn case_name(case: &StreamCase) -> String {
    match case.mode {
        None => "resident".into(),
        Some(m) => format!(
            "{} {} {}{}",
            m.as_str(),
            case.blocks,
            match case.placement {
                Placement::Spread => "spread",
                Placement::Last => "last",
            },
            if case.slots == 2 {
                String::new()
            } else {
                format!(" {} slots", case.slots)
            }
        ),
    }
}

/// Times the step for each case (one model per case, built from the same weights, dropped before the next).
/// Returns the records and, per case, the bytes streamed per step.
pub fn run(
    dev: &Device,
    name: &str,
    cfg: &WanConfig,
    opts: &StreamBench,
    cases: &[StreamCase],
) -> Result<Vec<(Record, u64)>> {
    let latent = latent_size(opts.frames, opts.height, opts.width);
    let tokens = video_tokens(cfg, latent);
    let mut out = Vec::new();
    for case in cases {
        let started = std::time::Instant::now();
        let weights = match opts.fp8 {
            Some(mode) => random_fp8_weights(cfg, mode, opts.seed, dev)?,
            None => random_weights_on_device(cfg, opts.seed, DType::BF16, dev)?,
        };
        let streamed = match case.mode {
            Some(_) => streamed_blocks(cfg.num_layers, case.blocks, case.placement),
            None => Vec::new(),
        };
        let mode = case.mode.unwrap_or(StreamMode::Pinned);
        let (model, loras) = build(cfg, weights, dev, opts, &streamed, mode, case.slots)?;
        let (inputs, targets) = flow_batch(cfg, latent, 512, 0.75, opts.seed, dev)?;
        dev.synchronize()?;
        eprintln!(
            "stream: {name} {} built in {:.1} s, {tokens} tokens",
            case_name(case),
            started.elapsed().as_secs_f64()
        );
        let target = LossTarget {
            targets: &targets,
            weights: None,
        };
        let step_options = StepOptions {
            activations_on_host: opts.activations_on_host,
            keep_tapes: opts.keep_tapes,
            ..StepOptions::default()
        };
        let vars = loras.vars();
        let mut loss = 0f32;
        #[cfg(feature = "cuda")]
        if let Device::Cuda(cuda) = dev {
            crate::nn::cuda::device::reset_peak_reserved(cuda)?;
        }
        let t = time(dev, opts.warmup, opts.iters, || {
            loss = checkpointed_step(&model, &inputs, &target, &vars, &step_options)?.loss;
            Ok(())
        })?;
        if !loss.is_finite() {
            candle_core::bail!("stream: loss is {loss}");
        }
        let per_step = match model.streamer() {
            Some(s) => {
                let st = s.stats()?;
                let steps = (opts.warmup + opts.iters.max(1)) as u64;
                eprintln!("stream: {st:?} over {steps} steps");
                st.bytes / steps
            }
            None => 0,
        };
        let peak = total_peak(dev, &t)?;
        #[cfg(feature = "cuda")]
        if let Device::Cuda(cuda) = dev {
            let reserved = crate::nn::cuda::device::peak_reserved_bytes(cuda)?;
            println!(
                "RESERVED {} {:.3} GiB (pool reserved high-water; used high-water {:.3} GiB)",
                case_name(case),
                reserved as f64 / (1u64 << 30) as f64,
                peak.unwrap_or(0) as f64 / (1u64 << 30) as f64
            );
        }
        let shape = format!(
            "b=1 {}x{}x{} tokens={tokens} r={} residual={:?} act={}",
            opts.frames,
            opts.height,
            opts.width,
            opts.rank,
            opts.residual,
            if opts.activations_on_host {
                "host"
            } else {
                "device"
            }
        );
        let flops = 4.0 * block_forward_flops(cfg, tokens, cfg.text_len);
        let timing = Timing {
            median_ms: t.median_ms,
            peak_bytes: peak,
        };
        out.push((
            record(
                "stream",
                &format!("{name} {}", case_name(case)),
                "lora step",
                &shape,
                flops,
                timing,
            ),
            per_step,
        ));
        drop((model, loras, inputs, targets));
        dev.synchronize()?;
    }
    Ok(out)
}

/// Bandwidths in GB/s: a plain page-locked copy of `bytes` into one device buffer, and the streaming path
/// fetching every streamed block of a model once with no compute.
pub struct CopyBandwidth {
    pub plain_gbs: f64,
    pub streaming_gbs: f64,
    pub bytes_per_block: usize,
}

/// Measures [`CopyBandwidth`] for `cfg`'s blocks (all but two streamed) in `mode`.
pub fn copy_bandwidth(
    dev: &Device,
    cfg: &WanConfig,
    opts: &StreamBench,
    mode: StreamMode,
) -> Result<CopyBandwidth> {
    let weights = match opts.fp8 {
        Some(m) => random_fp8_weights(cfg, m, opts.seed, dev)?,
        None => random_weights_on_device(cfg, opts.seed, DType::BF16, dev)?,
    };
    let streamed: Vec<usize> = (2..cfg.num_layers).collect();
    let (model, _loras) = build(cfg, weights, dev, opts, &streamed, mode, opts.slots)?;
    let streamer = model
        .streamer()
        .ok_or_else(|| candle_core::Error::Msg("no streamed blocks".into()))?;
    let bytes_per_block = streamer.block_bytes();
    let plain_gbs = plain_pinned_copy(dev, bytes_per_block * 4)?;
    // Warm-up pass, then two timed passes over every streamed block (fetch = queue the copy and make compute
    // wait for it; synchronize at the end).
    let passes = 2usize;
    let fetch_all = || -> Result<()> {
        let order: Vec<usize> = streamed.clone();
        model.begin_blocks(&order, false)?;
        for &i in &order {
            let _ = model.block(i)?;
        }
        streamer.synchronize()?;
        dev.synchronize()
    };
    fetch_all()?;
    streamer.reset_stats()?;
    let started = std::time::Instant::now();
    for _ in 0..passes {
        fetch_all()?;
    }
    let secs = started.elapsed().as_secs_f64();
    let bytes = streamer.stats()?.bytes as f64;
    Ok(CopyBandwidth {
        plain_gbs,
        streaming_gbs: bytes / secs / 1e9,
        bytes_per_block,
    })
}

#[cfg(feature = "cuda")]
fn plain_pinned_copy(dev: &Device, bytes: usize) -> Result<f64> {
    let Device::Cuda(cuda) = dev else {
        return Ok(0.0);
    };
    crate::nn::cuda::device::pinned_copy_bandwidth(cuda, bytes, 5)
}

#[cfg(not(feature = "cuda"))]
fn plain_pinned_copy(_dev: &Device, _bytes: usize) -> Result<f64> {
    Ok(0.0)
}

/// Streamed vs resident LoRA gradients of the tiny config on `dev`, for each streaming mode: the worst
/// max |streamed − resident| / max |resident| over the gradient tensors.
pub fn check_tiny(dev: &Device) -> Result<Vec<(String, f64)>> {
    let cfg = WanConfig::tiny(4);
    let opts = StreamBench {
        frames: 9,
        height: 32,
        width: 48,
        rank: 4,
        fp8: Some(Fp8Scale::Block64),
        residual: DType::F32,
        activations_on_host: false,
        keep_tapes: false,
        slots: 2,
        // Chunks far smaller than a block and cut off the 256-byte alignment, so the staged copy splits tensors
        // at odd places and wraps its ring many times per block.
        staging_slots: 3,
        staging_chunk_bytes: 3000,
        copy_threads: 3,
        warmup: 0,
        iters: 1,
        seed: 3,
    };
    let host = random_weights(&cfg, 7, DType::BF16, &Device::Cpu)?;
    let weights = || -> Result<HashMap<String, Tensor>> {
        host.iter()
            .map(|(k, v)| Ok((k.clone(), v.to_device(dev)?)))
            .collect()
    };
    let latent = latent_size(opts.frames, opts.height, opts.width);
    let (inputs, targets) = flow_batch(&cfg, latent, 5, 0.6, 11, dev)?;
    let target = LossTarget {
        targets: &targets,
        weights: None,
    };
    let grads = |streamed: &[usize], mode: StreamMode, on_host: bool| -> Result<Vec<Tensor>> {
        let (model, loras) = build(&cfg, weights()?, dev, &opts, streamed, mode, opts.slots)?;
        for (i, v) in loras.vars().iter().enumerate() {
            if i % 2 == 1 {
                v.set(&(v.as_tensor().ones_like()? * 0.01)?)?;
            }
        }
        let step_options = StepOptions {
            activations_on_host: on_host,
            ..StepOptions::default()
        };
        Ok(checkpointed_step(&model, &inputs, &target, &loras.vars(), &step_options)?.grads)
    };
    let reference = grads(&[], StreamMode::Pinned, false)?;
    let mut out = Vec::new();
    for (mode, on_host) in [
        (StreamMode::Pinned, false),
        (StreamMode::Staged, false),
        (StreamMode::Pinned, true),
        (StreamMode::Staged, true),
    ] {
        let got = grads(&[0, 2, 3], mode, on_host)?;
        let mut worst = 0f64;
        for (a, b) in reference.iter().zip(&got) {
            let scale = a
                .abs()?
                .max_all()?
                .to_dtype(DType::F32)?
                .to_scalar::<f32>()? as f64;
            let diff = (a - b)?
                .abs()?
                .max_all()?
                .to_dtype(DType::F32)?
                .to_scalar::<f32>()? as f64;
            let rel = if scale > 0.0 { diff / scale } else { diff };
            worst = if rel.is_finite() {
                worst.max(rel)
            } else {
                f64::INFINITY
            };
        }
        let act = if on_host { "host" } else { "device" };
        out.push((format!("{} activations={act}", mode.as_str()), worst));
    }
    Ok(out)
}
