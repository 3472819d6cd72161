//! Block-streaming benchmark (`framesmith-bench stream`): the checkpointed LoRA step of a whole Wan DiT with all
//! blocks resident and with N blocks streamed in each mode, timed in one run; the streaming path's copy bandwidth
//! against a plain page-locked host → device copy; and, with a VRAM budget, a run that may use only that much of
//! the card. `check` first compares streamed and resident LoRA gradients on a tiny config.

mod bandwidth;
mod check;
mod weights;

use std::collections::HashMap;

use candle_core::{DType, Device, Result, Tensor};

use super::step::{block_forward_flops, flow_batch, latent_size, total_peak, video_tokens};
use super::{record, time, Record, Timing};
pub use bandwidth::{copy_bandwidth, staging_sweep, CopyBandwidth, StagingSweep, SweepRow};
pub use check::check_tiny;
use framesmith_engine::train::step::{checkpointed_step, LossTarget, StepOptions};
use framesmith_models::wan::config::WanConfig;
use framesmith_models::wan::random::random_weights_on_device;
use framesmith_models::wan::{ModelOptions, WanModel};
use framesmith_nn::fp8::Fp8Scale;
use framesmith_nn::lora::{attach_loras, LoraSet, LoraSpec, WAN_DEFAULT_EXCLUDE};
use framesmith_nn::offload::{
    streamed_blocks, OffloadOptions, SavedPlacement, StreamMode, StreamPlacement,
};
use framesmith_nn::vb::Vb;
pub use weights::random_fp8_weights;
use weights::{random_fp8_linears, random_other_weights};

/// One configuration to time.
#[derive(Clone, Debug)]
pub struct StreamCase {
    /// `None`: every block resident.
    pub mode: Option<StreamMode>,
    pub blocks_to_swap: usize,
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
            case.blocks_to_swap,
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
        Some(_) => streamed_blocks(cfg.num_layers, case.blocks_to_swap, case.placement),
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
            blocks_to_swap: 2,
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
