//! `stream` and `stage-sweep`: block streaming timed against the resident step, and the copy bandwidths of each
//! staging setting.

use anyhow::{bail, Result};
use candle_core::Device;

use crate::{counts, fp8_mode, report, variant, Workload};
use framesmith_bench::{self as bench, Record};
use framesmith_models::wan::config::WanConfig;

/// `stream`'s arguments.
#[derive(clap::Args)]
pub(crate) struct StreamArgs {
    #[arg(long, default_value = "t2v-14b")]
    variant: String,
    #[command(flatten)]
    workload: Workload,
    /// Cases, comma-separated: `resident`, `pinned`, `staged`.
    #[arg(long, default_value = "resident,pinned,staged")]
    modes: String,
    /// Streamed blocks.
    #[arg(long, default_value_t = 30)]
    blocks: usize,
    /// `spread` or `last`.
    #[arg(long, default_value = "spread")]
    placement: String,
    /// Residual stream dtype (`f32` or `bf16`).
    #[arg(long, default_value = "f32")]
    residual: String,
    /// Keep saved block inputs in host RAM.
    #[arg(long)]
    host_activations: bool,
    /// Keep every block's whole tape from the forward (no recompute in the backward).
    #[arg(long)]
    no_checkpointing: bool,
    /// Keep each block's self-attention output and LSE (selective checkpointing, `checkpointing =
    /// "attention"`); with --host-activations they wait in RAM with the saved inputs.
    #[arg(long, conflicts_with = "no_checkpointing")]
    keep_attention: bool,
    /// GPU slots in the ring; a comma-separated list times each streamed case with each count.
    #[arg(long, default_value = "2")]
    slots: String,
    /// Page-locked staging chunk buffers of `staged` streaming.
    #[arg(long, default_value_t = framesmith_nn::offload::STAGING_SLOTS)]
    staging_slots: usize,
    /// MiB of one staging chunk (`staged`).
    #[arg(long, default_value_t = framesmith_nn::offload::STAGING_CHUNK_BYTES >> 20)]
    staging_chunk_mib: usize,
    /// Threads of the staging copy (`staged`).
    #[arg(long, default_value_t = framesmith_nn::offload::STAGING_COPY_THREADS)]
    copy_threads: usize,
    /// KiB of one unit of work the staging copy hands to a free copy thread (`staged`).
    #[arg(long, default_value_t = framesmith_nn::offload::COPY_UNIT_BYTES >> 10)]
    copy_unit_kib: usize,
    /// Let the run use only this many GiB of device memory (the rest is reserved first).
    #[arg(long)]
    vram_budget_gb: Option<f64>,
    /// Also measure the copy bandwidth of a plain pinned copy and of the streaming path (each streaming mode
    /// in `--modes`).
    #[arg(long)]
    bandwidth: bool,
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    #[arg(long, default_value_t = 2)]
    iters: usize,
    /// First compare streamed and resident LoRA gradients on a tiny config.
    #[arg(long)]
    check: bool,
}

/// `stage-sweep`'s arguments.
#[derive(clap::Args)]
pub(crate) struct StageSweepArgs {
    #[arg(long, default_value = "t2v-14b")]
    variant: String,
    /// Block linears in FP8 (`block64`, `channel`, `tensor`); bf16 when absent.
    #[arg(long)]
    fp8: Option<String>,
    /// Streamed copies of the block.
    #[arg(long, default_value_t = 16)]
    blocks: usize,
    /// Timed passes over the blocks, after one warm-up pass.
    #[arg(long, default_value_t = 3)]
    passes: usize,
    /// Staging copy threads, comma-separated.
    #[arg(long, default_value = "8")]
    copy_threads: String,
    /// MiB of one staging chunk, comma-separated.
    #[arg(long, default_value = "8")]
    staging_chunk_mib: String,
    /// Staging chunk buffers, comma-separated.
    #[arg(long, default_value = "4")]
    staging_slots: String,
    /// KiB of one unit of work the staging copy hands to a free copy thread, comma-separated.
    #[arg(long, default_value_t = (framesmith_nn::offload::COPY_UNIT_BYTES >> 10).to_string())]
    copy_unit_kib: String,
    /// Measure the whole list of staged settings this many times.
    #[arg(long, default_value_t = 1)]
    repeats: usize,
    /// Also measure each setting while another thread launches kernels (as a training step's does).
    #[arg(long)]
    launch_load: bool,
}

/// The streaming benchmark's settings from `stream`'s arguments, with `slots` GPU slots.
fn stream_bench(args: &StreamArgs, slots: usize) -> Result<bench::stream::StreamBench> {
    let workload = &args.workload;
    Ok(bench::stream::StreamBench {
        frames: workload.clip.frames,
        height: workload.clip.height,
        width: workload.clip.width,
        rank: workload.rank,
        fp8: fp8_mode(workload.fp8.as_deref())?,
        residual: match args.residual.as_str() {
            "f32" => candle_core::DType::F32,
            "bf16" => candle_core::DType::BF16,
            other => bail!("unknown residual dtype `{other}` (f32, bf16)"),
        },
        activations_on_host: args.host_activations,
        keep_tapes: args.no_checkpointing,
        keep_attention: args.keep_attention,
        slots,
        staging_slots: args.staging_slots.max(1),
        staging_chunk_bytes: args.staging_chunk_mib.max(1) << 20,
        copy_threads: args.copy_threads,
        copy_unit_bytes: args.copy_unit_kib.max(1) << 10,
        warmup: args.warmup,
        iters: args.iters,
        seed: 0,
    })
}

/// `stream`: streamed and resident gradients compared first when asked, then each case timed.
pub(crate) fn run_stream(dev: &Device, args: &StreamArgs) -> Result<()> {
    let slots = counts("--slots", &args.slots)?;
    let opts = stream_bench(args, slots[0])?;
    let name = args.variant.as_str();
    if args.check {
        stream_check(dev)?;
    }
    let cfg = variant(name)?;
    let cases = stream_cases(&args.modes, args.blocks, &args.placement, &slots)?;
    let vram_budget_gb = args.vram_budget_gb;
    #[cfg(feature = "cuda")]
    let _reservation = match (dev, vram_budget_gb) {
        (Device::Cuda(cuda), Some(gb)) => {
            // GiB, as cards are sized: a "24 GB" card has 24 GiB.
            let r = framesmith_nn::cuda::device::VramReservation::leave_budget(
                cuda,
                (gb * (1u64 << 30) as f64) as u64,
            )?;
            if let Some(r) = &r {
                eprintln!(
                    "stream: reserved {:.2} GiB, leaving a {gb} GiB budget",
                    r.bytes() as f64 / (1u64 << 30) as f64
                );
            }
            r
        }
        _ => None,
    };
    #[cfg(not(feature = "cuda"))]
    let _ = vram_budget_gb;
    if args.bandwidth {
        print_bandwidths(dev, &cfg, &opts, &cases)?;
    }
    let results = bench::stream::run(dev, name, &cfg, &opts, &cases)?;
    for (r, bytes) in &results {
        println!("STREAMED_BYTES_PER_STEP {} {bytes}", r.case);
    }
    let records: Vec<Record> = results.into_iter().map(|(r, _)| r).collect();
    report(&records);
    Ok(())
}

/// Streamed and resident LoRA gradients of a tiny config compared in each mode; an error on a mismatch.
fn stream_check(dev: &Device) -> Result<()> {
    for (what, rel) in bench::stream::check_tiny(dev)? {
        let ok = rel <= 1e-2;
        println!(
            "{} stream tiny(4) LoRA grads streamed ({what}) vs resident: max rel {rel:.2e} (tol 1e-2)",
            if ok { "ok  " } else { "FAIL" }
        );
        if !ok {
            bail!("streamed and resident gradients differ");
        }
    }
    Ok(())
}

/// The cases `--modes` and `--placement` ask for: each streaming mode at each placement and slot count, and the
/// resident case once.
fn stream_cases(
    modes: &str,
    blocks_to_swap: usize,
    placement: &str,
    slots: &[usize],
) -> Result<Vec<bench::stream::StreamCase>> {
    use framesmith_nn::offload::{StreamMode, StreamPlacement};
    let placements: Vec<StreamPlacement> = match placement {
        "spread" => vec![StreamPlacement::Spread],
        "last" => vec![StreamPlacement::Last],
        "both" => vec![StreamPlacement::Spread, StreamPlacement::Last],
        other => bail!("unknown placement `{other}` (spread, last, both)"),
    };
    let mut cases = Vec::new();
    for m in modes.split(',').map(str::trim).filter(|m| !m.is_empty()) {
        let mode = match m {
            "resident" => None,
            "pinned" => Some(StreamMode::Pinned),
            "staged" => Some(StreamMode::Staged),
            other => bail!("unknown mode `{other}` (resident, pinned, staged)"),
        };
        let places = if mode.is_some() {
            placements.clone()
        } else {
            vec![StreamPlacement::Spread]
        };
        let counts = if mode.is_some() { slots } else { &slots[..1] };
        for p in places {
            for &n in counts {
                cases.push(bench::stream::StreamCase {
                    mode,
                    blocks_to_swap,
                    placement: p,
                    slots: n,
                });
            }
        }
    }
    Ok(cases)
}

/// The copy bandwidths of the streaming modes `cases` use (pinned alone when every case is resident): each costs
/// a model build.
fn print_bandwidths(
    dev: &Device,
    cfg: &WanConfig,
    opts: &bench::stream::StreamBench,
    cases: &[bench::stream::StreamCase],
) -> Result<()> {
    use framesmith_nn::offload::StreamMode;
    let mut measured: Vec<StreamMode> = Vec::new();
    for mode in cases.iter().filter_map(|c| c.mode) {
        if !measured.contains(&mode) {
            measured.push(mode);
        }
    }
    if measured.is_empty() {
        measured.push(StreamMode::Pinned);
    }
    for mode in measured {
        let bw = bench::stream::copy_bandwidth(dev, cfg, opts, mode)?;
        println!(
            "BANDWIDTH {{\"mode\":\"{}\",\"plain_pinned_gbs\":{:.2},\"streaming_gbs\":{:.2},\"ratio\":{:.3},\"block_bytes\":{}}}",
            mode.as_str(),
            bw.plain_gbs,
            bw.streaming_gbs,
            bw.streaming_gbs / bw.plain_gbs.max(1e-9),
            bw.bytes_per_block
        );
    }
    Ok(())
}

/// `stage-sweep`: the streaming path's copy bandwidth for each staging setting, a `SWEEP` JSON line each.
pub(crate) fn run_stage_sweep(dev: &Device, args: &StageSweepArgs) -> Result<()> {
    let sweep = bench::stream::StagingSweep {
        threads: counts("--copy-threads", &args.copy_threads)?,
        chunk_bytes: counts("--staging-chunk-mib", &args.staging_chunk_mib)?
            .into_iter()
            .map(|m| m << 20)
            .collect(),
        rings: counts("--staging-slots", &args.staging_slots)?,
        unit_bytes: counts("--copy-unit-kib", &args.copy_unit_kib)?
            .into_iter()
            .map(|k| k << 10)
            .collect(),
        launch_load: args.launch_load,
        repeats: args.repeats,
    };
    // Only the block's shapes, dtype and the ring's GPU slots matter here.
    let opts = bench::stream::StreamBench {
        frames: 1,
        height: 64,
        width: 64,
        rank: 1,
        fp8: fp8_mode(args.fp8.as_deref())?,
        residual: candle_core::DType::BF16,
        activations_on_host: false,
        keep_tapes: false,
        keep_attention: false,
        slots: 2,
        staging_slots: sweep.rings[0],
        staging_chunk_bytes: sweep.chunk_bytes[0],
        copy_threads: sweep.threads[0],
        copy_unit_bytes: sweep.unit_bytes[0],
        warmup: 0,
        iters: 0,
        seed: 0,
    };
    let cfg = variant(&args.variant)?;
    let (plain, rows) =
        bench::stream::staging_sweep(dev, &cfg, &opts, args.blocks, &sweep, args.passes)?;
    println!("plain pinned copy: {plain:.2} GB/s");
    for r in rows {
        println!("{}", sweep_line(&r, plain));
    }
    Ok(())
}

/// A `SWEEP` JSON line: the row's setting and bandwidth, and its ratio to a plain pinned copy's `plain` GB/s.
fn sweep_line(r: &bench::stream::SweepRow, plain: f64) -> String {
    let o = &r.options;
    // The staging settings mean nothing for pinned streaming.
    let staging = match o.mode {
        framesmith_nn::offload::StreamMode::Staged => format!(
            ",\"copy_threads\":{},\"chunk_mib\":{},\"staging_slots\":{},\"unit_kib\":{}",
            o.copy_threads,
            o.staging_chunk_bytes >> 20,
            o.staging_slots,
            o.copy_unit_bytes >> 10
        ),
        _ => String::new(),
    };
    format!(
        "SWEEP {{\"mode\":\"{}\"{staging},\"launch_load\":{},\"gbs\":{:.2},\"ratio\":{:.3}}}",
        o.mode.as_str(),
        r.launch_load,
        r.gbs,
        r.gbs / plain.max(1e-9)
    )
}
