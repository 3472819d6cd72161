//! Copy bandwidths of block streaming: the streaming path against a plain page-locked copy, and the sweep over
//! staging settings (no compute, no whole-model build).

use candle_core::{DType, Device, Result, Tensor};

use super::weights::random_fp8_weights;
use super::{build, offload_options, StreamBench};
use framesmith_models::wan::block::Block;
use framesmith_models::wan::config::WanConfig;
use framesmith_models::wan::random::random_weights_on_device;
use framesmith_nn::offload::{BlockStreamer, OffloadOptions, StreamMode};

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
