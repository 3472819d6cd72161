//! Block-streaming benchmark (`framesmith-bench stream`): the checkpointed LoRA step of a whole Wan DiT with all
//! blocks resident and with N blocks streamed in each mode, timed in one run; the streaming path's copy bandwidth
//! against a plain page-locked host → device copy; and, with a VRAM budget, a run that may use only that much of
//! the card. `check` first compares streamed and resident LoRA gradients on a tiny config.

use std::collections::HashMap;

use candle_core::{DType, Device, Result, Tensor};
use rayon::prelude::*;

use super::step::{block_forward_flops, flow_batch, latent_size, total_peak, video_tokens};
use super::{record, time, Record, Timing};
use framesmith_engine::train::step::{checkpointed_step, LossTarget, StepOptions};
use framesmith_models::wan::block::Block;
use framesmith_models::wan::config::WanConfig;
use framesmith_models::wan::random::{
    random_weights, random_weights_on_device, random_weights_on_device_where,
};
use framesmith_models::wan::weights::official_shapes;
use framesmith_models::wan::{ModelOptions, WanModel};
use framesmith_nn::fp8::Fp8Scale;
use framesmith_nn::lora::{attach_loras, LoraSet, LoraSpec, WAN_DEFAULT_EXCLUDE};
use framesmith_nn::offload::{
    streamed_blocks, BlockStreamer, OffloadOptions, SavedPlacement, StreamMode, StreamPlacement,
};
use framesmith_nn::vb::Vb;

/// One configuration to time.
#[derive(Clone, Debug)]
pub struct StreamCase {
    /// `None`: every block resident.
    pub mode: Option<StreamMode>,
    pub blocks: usize,
    pub placement: StreamPlacement,
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
    /// Selective checkpointing ([`StepOptions::keep_attention`]).
    pub keep_attention: bool,
    pub slots: usize,
    pub staging_slots: usize,
    pub staging_chunk_bytes: usize,
    pub copy_threads: usize,
    /// [`OffloadOptions::copy_unit_bytes`].
    pub copy_unit_bytes: usize,
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
    let mut map = random_fp8_linears(cfg, mode, seed)?;
    map.extend(random_other_weights(cfg, seed, dev)?);
    Ok(map)
}

fn is_block_linear(name: &str, shape: &[usize]) -> bool {
    name.starts_with("blocks.") && name.ends_with(".weight") && shape.len() == 2
}

/// The FP8 codes and scales of every block linear, on the host (the bulk of a 14B model, and the slow part of
/// making one).
fn random_fp8_linears(
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
fn random_other_weights(
    cfg: &WanConfig,
    seed: u64,
    dev: &Device,
) -> Result<HashMap<String, Tensor>> {
    random_weights_on_device_where(cfg, seed, DType::BF16, dev, |name, shape| {
        !is_block_linear(name, shape)
    })
}

/// The streaming settings `opts` asks for, in `mode` with `slots` GPU slots.
fn offload_options(opts: &StreamBench, mode: StreamMode, slots: usize) -> OffloadOptions {
    OffloadOptions {
        mode,
        slots,
        staging_slots: opts.staging_slots,
        staging_chunk_bytes: opts.staging_chunk_bytes,
        copy_threads: opts.copy_threads,
        copy_unit_bytes: opts.copy_unit_bytes,
    }
}

/// Builds the model with `streamed` blocks in host RAM (streamed as `offload` says) and LoRA of `rank` on every
/// adapted block linear.
pub fn build(
    cfg: &WanConfig,
    weights: HashMap<String, Tensor>,
    dev: &Device,
    opts: &StreamBench,
    streamed: &[usize],
    offload: &OffloadOptions,
) -> Result<(WanModel, LoraSet)> {
    let vb = Vb::from_tensors(weights, DType::BF16, dev);
    let options = ModelOptions {
        residual_dtype: opts.residual,
        blocks_fp8: opts.fp8,
        fp8_products: false,
    };
    let mut model = if streamed.is_empty() {
        WanModel::new(cfg, vb, &options)?
    } else {
        WanModel::new_streamed(cfg, vb, &options, streamed, offload)?
    };
    let spec = LoraSpec {
        rank: opts.rank,
        alpha: 0.0,
        dtype: DType::F32,
        include_patterns: Vec::new(),
        exclude_patterns: vec![WAN_DEFAULT_EXCLUDE.to_string()],
        seed: opts.seed,
        kind: Default::default(),
    };
    let loras = attach_loras(model.linears_mut(), &spec)
        .map_err(|e| candle_core::Error::msg(e.to_string()))?;
    Ok((model, loras))
}

/// Where a case keeps saved block inputs: in RAM when asked, of the kind its streaming mode promises (pageable
/// with `staged`, as `framesmith train` does).
fn saved_inputs(on_host: bool, mode: Option<StreamMode>) -> SavedPlacement {
    if on_host {
        SavedPlacement::host_for(mode.unwrap_or(StreamMode::Pinned))
    } else {
        SavedPlacement::Device
    }
}

fn case_name(case: &StreamCase) -> String {
    match case.mode {
        None => "resident".into(),
        Some(m) => format!(
            "{} {} {}{}",
            m.as_str(),
            case.blocks,
            match case.placement {
                StreamPlacement::Spread => "spread",
                StreamPlacement::Last => "last",
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
    // The FP8 block linears are made once, on the host (the slow part of a 14B build), and every case builds its
    // model from them; device weights are made for each case, so no case holds another's memory.
    let fp8_linears = match opts.fp8 {
        Some(mode) => Some(random_fp8_linears(cfg, mode, opts.seed)?),
        None => None,
    };
    let mut out = Vec::new();
    for case in cases {
        out.push(run_case(dev, name, cfg, opts, case, fp8_linears.as_ref())?);
        // The case's model and batch are gone: wait for their memory before the next case's build.
        dev.synchronize()?;
    }
    Ok(out)
}

/// Builds `case`'s model and times its step: the record, and the bytes streamed per step.
fn run_case(
    dev: &Device,
    name: &str,
    cfg: &WanConfig,
    opts: &StreamBench,
    case: &StreamCase,
    fp8_linears: Option<&HashMap<String, Tensor>>,
) -> Result<(Record, u64)> {
    let latent = latent_size(cfg, opts.frames, opts.height, opts.width);
    let tokens = video_tokens(cfg, latent);
    let started = std::time::Instant::now();
    let weights = case_weights(cfg, opts, dev, fp8_linears)?;
    let streamed = match case.mode {
        Some(_) => streamed_blocks(cfg.num_layers, case.blocks, case.placement),
        None => Vec::new(),
    };
    let offload = offload_options(opts, case.mode.unwrap_or(StreamMode::Pinned), case.slots);
    let (model, loras) = build(cfg, weights, dev, opts, &streamed, &offload)?;
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
        skip_frames: 0,
    };
    let saved_inputs = saved_inputs(opts.activations_on_host, case.mode);
    let step_options = StepOptions {
        saved_inputs,
        keep_tapes: opts.keep_tapes,
        keep_attention: opts.keep_attention,
        ..StepOptions::default()
    };
    let vars = loras.vars();
    let mut loss = 0f32;
    #[cfg(feature = "cuda")]
    if let Device::Cuda(cuda) = dev {
        framesmith_nn::cuda::device::reset_peak_reserved(cuda)?;
    }
    let t = time(dev, opts.warmup, opts.iters, || {
        loss = checkpointed_step(&model, &inputs, &target, &vars, &step_options)?.loss;
        Ok(())
    })?;
    if !loss.is_finite() {
        candle_core::bail!("stream: loss is {loss}");
    }
    let per_step = streamed_per_step(&model, opts)?;
    // Each case's time as soon as it is known: a run cut short still leaves the cases it finished.
    eprintln!(
        "stream: {name} {} step {:.1} ms, {per_step} bytes streamed per step",
        case_name(case),
        t.median_ms
    );
    let peak = total_peak(dev, &t)?;
    #[cfg(feature = "cuda")]
    if let Device::Cuda(cuda) = dev {
        let reserved = framesmith_nn::cuda::device::peak_reserved_bytes(cuda)?;
        println!(
            "RESERVED {} {:.3} GiB (pool reserved high-water; used high-water {:.3} GiB)",
            case_name(case),
            reserved as f64 / (1u64 << 30) as f64,
            peak.unwrap_or(0) as f64 / (1u64 << 30) as f64
        );
    }
    let flops = 4.0 * block_forward_flops(cfg, tokens, cfg.text_len);
    let timing = Timing {
        median_ms: t.median_ms,
        peak_bytes: peak,
    };
    let label = format!("{name} {}{}", case_name(case), checkpointing_label(opts));
    let shape = case_shape(opts, tokens, saved_inputs);
    Ok((
        record("stream", &label, "lora step", &shape, flops, timing),
        per_step,
    ))
}

/// Every weight of a case's model, made on `dev`: bf16, with the block linears of `fp8_linears` when given.
fn case_weights(
    cfg: &WanConfig,
    opts: &StreamBench,
    dev: &Device,
    fp8_linears: Option<&HashMap<String, Tensor>>,
) -> Result<HashMap<String, Tensor>> {
    match fp8_linears {
        Some(linears) => {
            let mut w = random_other_weights(cfg, opts.seed, dev)?;
            w.extend(linears.clone());
            Ok(w)
        }
        None => random_weights_on_device(cfg, opts.seed, DType::BF16, dev),
    }
}

/// The bytes `model`'s streamer copied per step over the warm-up and timed steps (0 with nothing streamed).
fn streamed_per_step(model: &WanModel, opts: &StreamBench) -> Result<u64> {
    Ok(match model.streamer() {
        Some(s) => {
            let st = s.stats()?;
            let steps = (opts.warmup + opts.iters.max(1)) as u64;
            eprintln!("stream: {st:?} over {steps} steps");
            st.bytes / steps
        }
        None => 0,
    })
}

/// The record's shape column: clip size, tokens, rank, residual dtype and where saved block inputs live.
fn case_shape(opts: &StreamBench, tokens: usize, saved_inputs: SavedPlacement) -> String {
    format!(
        "b=1 {}x{}x{} tokens={tokens} r={} residual={:?} act={}",
        opts.frames,
        opts.height,
        opts.width,
        opts.rank,
        opts.residual,
        match saved_inputs {
            SavedPlacement::Device => "device",
            SavedPlacement::PageLocked => "host-pinned",
            SavedPlacement::Pageable => "host-pageable",
        }
    )
}

/// The record label's suffix for the checkpointing `opts` asks for (none for full checkpointing).
fn checkpointing_label(opts: &StreamBench) -> &'static str {
    if opts.keep_tapes {
        " no checkpointing"
    } else if opts.keep_attention {
        " keep-attention"
    } else {
        ""
    }
}

/// Bandwidths in GB/s: a plain page-locked copy of `bytes` into one device buffer, and the streaming path
/// fetching every streamed block of a model once with no compute.
pub struct CopyBandwidth {
    pub plain_gbs: f64,
    pub streaming_gbs: f64,
    pub bytes_per_block: usize,
}

/// Measures [`CopyBandwidth`] for `cfg`'s block in `mode`: as many streamed blocks as the model streams at most
/// (all but two), copies of one block built once ([`stream_bandwidth`]), two timed passes.
pub fn copy_bandwidth(
    dev: &Device,
    cfg: &WanConfig,
    opts: &StreamBench,
    mode: StreamMode,
) -> Result<CopyBandwidth> {
    let block = one_block(cfg, opts, dev)?;
    let options = offload_options(opts, mode, opts.slots);
    let (streaming_gbs, bytes_per_block) = stream_bandwidth(
        dev,
        &block,
        cfg.num_layers.saturating_sub(2).max(1),
        &options,
        2,
        false,
    )?;
    Ok(CopyBandwidth {
        plain_gbs: plain_pinned_copy(dev, bytes_per_block * 4)?,
        streaming_gbs,
        bytes_per_block,
    })
}

/// One block of `cfg` (FP8 as `opts` asks), resident on `dev`: what the bandwidth measurements stream copies of.
fn one_block(cfg: &WanConfig, opts: &StreamBench, dev: &Device) -> Result<Block> {
    let one = WanConfig {
        num_layers: 1,
        ..cfg.clone()
    };
    let weights = match opts.fp8 {
        Some(m) => random_fp8_weights(&one, m, opts.seed, dev)?,
        None => random_weights_on_device(&one, opts.seed, DType::BF16, dev)?,
    };
    let offload = offload_options(opts, StreamMode::Pinned, 2);
    let (model, _loras) = build(&one, weights, dev, opts, &[], &offload)?;
    Ok(model.blocks()[0].clone())
}

/// GB/s of the streaming path over `count` streamed copies of `block`, fetched in order with no compute (a fetch
/// queues the copy and makes compute wait for it): one warm-up pass, then `passes` timed ones; and the bytes of
/// one packed block. With `launch_load`, another thread launches small kernels on a stream of its own in the same
/// CUDA context throughout the timed passes, as the thread issuing a training step's kernels does.
fn stream_bandwidth(
    dev: &Device,
    block: &Block,
    count: usize,
    options: &OffloadOptions,
    passes: usize,
    launch_load: bool,
) -> Result<(f64, usize)> {
    let blocks = (0..count).map(|i| Ok((i, block.clone())));
    let (streamer, _shells) = BlockStreamer::new(dev, count, blocks, options)?;
    let order: Vec<usize> = (0..count).collect();
    let pass = || -> Result<()> {
        streamer.begin(&order, false)?;
        for &i in &order {
            let _ = streamer.fetch(i)?;
        }
        streamer.synchronize()?;
        dev.synchronize()
    };
    pass()?;
    streamer.reset_stats()?;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let secs = std::thread::scope(|scope| -> Result<f64> {
        let load = launch_load.then(|| scope.spawn(|| launch_kernels(dev, &stop)));
        let started = std::time::Instant::now();
        let result = (0..passes.max(1)).try_for_each(|_| pass());
        let secs = started.elapsed().as_secs_f64();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(load) = load {
            load.join()
                .map_err(|_| candle_core::Error::Msg("the launch load panicked".into()))??;
        }
        result.map(|()| secs)
    })?;
    let bytes = streamer.stats()?.bytes;
    if bytes == 0 {
        candle_core::bail!(
            "no block was copied: {count} streamed blocks all stay in the ring's {} GPU slots",
            options.slots
        );
    }
    Ok((bytes as f64 / secs / 1e9, streamer.block_bytes()))
}

/// Launches small kernels on a stream of its own (same device, same CUDA context) until `stop`, waiting for them
/// every 1024 launches so the queue stays short.
fn launch_kernels(dev: &Device, stop: &std::sync::atomic::AtomicBool) -> Result<()> {
    let other = match dev.location() {
        candle_core::DeviceLocation::Cuda { gpu_id } => Device::new_cuda_with_stream(gpu_id)?,
        _ => return Ok(()),
    };
    let mut x = Tensor::zeros(4096, DType::F32, &other)?;
    let mut launches = 0u64;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        x = x.affine(1.0, 1.0)?;
        launches += 1;
        if launches % 1024 == 0 {
            other.synchronize()?;
        }
    }
    other.synchronize()
}

/// The staged settings [`staging_sweep`] measures: every combination of these.
pub struct StagingSweep {
    pub threads: Vec<usize>,
    pub chunk_bytes: Vec<usize>,
    /// Chunk buffers of the page-locked ring.
    pub rings: Vec<usize>,
    pub unit_bytes: Vec<usize>,
    /// Also measure each setting (pinned too) with another thread launching kernels meanwhile.
    pub launch_load: bool,
    pub repeats: usize,
}

/// One setting of [`staging_sweep`] and the streaming path's bandwidth with it.
pub struct SweepRow {
    pub options: OffloadOptions,
    pub launch_load: bool,
    pub gbs: f64,
}

/// The streaming path's copy bandwidth for each staging setting, cheaply (no whole-model build): `count` copies of
/// one block of `cfg` streamed in order `passes` times with no compute ([`stream_bandwidth`]). `pinned` first, for
/// reference; then `staged` with every combination in `sweep`, the whole list `repeats` times (the host side of a
/// shared machine varies from second to second). Returns a plain page-locked copy's bandwidth of one block,
/// measured as [`copy_bandwidth`]'s is, and a row per setting.
pub fn staging_sweep(
    dev: &Device,
    cfg: &WanConfig,
    opts: &StreamBench,
    count: usize,
    sweep: &StagingSweep,
    passes: usize,
) -> Result<(f64, Vec<SweepRow>)> {
    if count == 0 || passes == 0 {
        candle_core::bail!("the sweep needs at least one block and one pass");
    }
    let block = one_block(cfg, opts, dev)?;
    let mut settings = vec![offload_options(opts, StreamMode::Pinned, opts.slots)];
    for _ in 0..sweep.repeats.max(1) {
        for &copy_threads in &sweep.threads {
            for &staging_chunk_bytes in &sweep.chunk_bytes {
                for &staging_slots in &sweep.rings {
                    for &copy_unit_bytes in &sweep.unit_bytes {
                        settings.push(OffloadOptions {
                            mode: StreamMode::Staged,
                            slots: opts.slots,
                            staging_slots,
                            staging_chunk_bytes,
                            copy_threads,
                            copy_unit_bytes,
                        });
                    }
                }
            }
        }
    }
    let mut plain = 0.0;
    let mut rows = Vec::with_capacity(settings.len());
    let loads: &[bool] = if sweep.launch_load {
        &[false, true]
    } else {
        &[false]
    };
    for options in settings {
        for &launch_load in loads {
            let (gbs, block_bytes) =
                stream_bandwidth(dev, &block, count, &options, passes, launch_load)?;
            if plain == 0.0 {
                plain = plain_pinned_copy(dev, block_bytes * 4)?;
            }
            rows.push(SweepRow {
                options: options.clone(),
                launch_load,
                gbs,
            });
        }
    }
    Ok((plain, rows))
}

#[cfg(feature = "cuda")]
fn plain_pinned_copy(dev: &Device, bytes: usize) -> Result<f64> {
    let Device::Cuda(cuda) = dev else {
        return Ok(0.0);
    };
    framesmith_nn::cuda::device::pinned_copy_bandwidth(cuda, bytes, 5)
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
        keep_attention: false,
        slots: 2,
        // Chunks far smaller than a block and cut off the 256-byte alignment, so the staged copy splits tensors
        // at odd places and wraps its ring many times per block.
        staging_slots: 3,
        staging_chunk_bytes: 3000,
        copy_threads: 3,
        copy_unit_bytes: framesmith_nn::offload::COPY_UNIT_BYTES,
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
    let latent = latent_size(&cfg, opts.frames, opts.height, opts.width);
    let (inputs, targets) = flow_batch(&cfg, latent, 5, 0.6, 11, dev)?;
    let target = LossTarget {
        targets: &targets,
        weights: None,
        skip_frames: 0,
    };
    let grads = |streamed: &[usize], mode: StreamMode, on_host: bool| -> Result<Vec<Tensor>> {
        let offload = offload_options(&opts, mode, opts.slots);
        let (model, loras) = build(&cfg, weights()?, dev, &opts, streamed, &offload)?;
        for (i, v) in loras.vars().iter().enumerate() {
            if i % 2 == 1 {
                v.set(&(v.as_tensor().ones_like()? * 0.01)?)?;
            }
        }
        let step_options = StepOptions {
            saved_inputs: saved_inputs(on_host, Some(mode)),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny_opts(fp8: Option<Fp8Scale>) -> StreamBench {
        StreamBench {
            frames: 1,
            height: 32,
            width: 32,
            rank: 2,
            fp8,
            residual: DType::F32,
            activations_on_host: false,
            keep_tapes: false,
            keep_attention: false,
            slots: 2,
            staging_slots: 3,
            staging_chunk_bytes: 4096,
            copy_threads: 2,
            copy_unit_bytes: 1024,
            warmup: 0,
            iters: 1,
            seed: 1,
        }
    }

    #[test]
    fn streamed_gradients_match_resident_ones_on_the_cpu() -> Result<()> {
        for (what, rel) in check_tiny(&Device::Cpu)? {
            assert_eq!(rel, 0.0, "{what}");
        }
        Ok(())
    }

    #[test]
    fn the_sweep_measures_pinned_then_every_staged_setting() -> Result<()> {
        let sweep = StagingSweep {
            threads: vec![1, 2],
            chunk_bytes: vec![4096],
            rings: vec![2],
            unit_bytes: vec![512, 2048],
            launch_load: false,
            repeats: 2,
        };
        let opts = tiny_opts(None);
        let (_plain, rows) = staging_sweep(&Device::Cpu, &WanConfig::tiny(2), &opts, 3, &sweep, 1)?;
        assert_eq!(rows.len(), 1 + 2 * 2 * 2);
        assert_eq!(rows[0].options.mode, StreamMode::Pinned);
        assert!(rows[1..]
            .iter()
            .all(|r| r.options.mode == StreamMode::Staged));
        assert_eq!(
            rows[1..5]
                .iter()
                .map(|r| (r.options.copy_threads, r.options.copy_unit_bytes))
                .collect::<Vec<_>>(),
            vec![(1, 512), (1, 2048), (2, 512), (2, 2048)]
        );
        assert!(rows.iter().all(|r| r.gbs.is_finite() && r.gbs > 0.0));
        Ok(())
    }

    #[test]
    fn copy_bandwidth_streams_all_but_two_blocks() -> Result<()> {
        let cfg = WanConfig::tiny(6);
        let bw = copy_bandwidth(&Device::Cpu, &cfg, &tiny_opts(None), StreamMode::Staged)?;
        assert!(bw.streaming_gbs.is_finite() && bw.streaming_gbs > 0.0);
        assert!(bw.bytes_per_block > 0);
        // With no more streamed blocks than GPU slots nothing is copied after the warm-up: an error, not 0 GB/s.
        assert!(copy_bandwidth(
            &Device::Cpu,
            &WanConfig::tiny(4),
            &tiny_opts(None),
            StreamMode::Staged
        )
        .is_err());
        Ok(())
    }

    #[test]
    fn fp8_cases_share_the_linears_and_stream_what_they_should() -> Result<()> {
        let cfg = WanConfig::tiny(3);
        let opts = tiny_opts(Some(Fp8Scale::Block64));
        let case = |mode| StreamCase {
            mode,
            blocks: 2,
            placement: StreamPlacement::Spread,
            slots: 2,
        };
        let out = run(
            &Device::Cpu,
            "tiny",
            &cfg,
            &opts,
            &[case(None), case(Some(StreamMode::Pinned))],
        )?;
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].1, 0, "the resident case streams nothing");
        // Two of three blocks streamed into two slots: each copied once in the first step and then kept, so the
        // per-step average is the two blocks over the step count.
        let block = {
            let (model, _) = build(
                &cfg,
                random_fp8_weights(&cfg, Fp8Scale::Block64, 1, &Device::Cpu)?,
                &Device::Cpu,
                &opts,
                &[1, 2],
                &offload_options(&opts, StreamMode::Pinned, 2),
            )?;
            let bytes = model.streamer().map(|s| s.block_bytes()).unwrap_or(0);
            bytes as u64
        };
        assert!(
            out[1].1 >= 2 * block / 2,
            "streamed {} bytes per step",
            out[1].1
        );
        Ok(())
    }
}
