//! The system check's rules: from the facts alone (no machine is read here), what stops training — a GPU build
//! whose GPU cannot run it — and what slows or limits it, each with its fix. Blocking problems come first.

use framesmith_config::protocol::doctor::{
    Finding, GpuFacts, Severity, SystemFacts, BUILD_CUDA, MIN_COMPUTE_CAPABILITY, MIN_DRIVER_MAJOR,
};
use framesmith_config::protocol::memory::format_gib;

const GIB: u64 = 1 << 30;
/// Below this at the output folder, the first save fails: a LoRA plus a training state (AdamW's moments) of the
/// 14B models at rank 32 is about 1 GiB.
pub const BLOCKING_FREE_DISK_BYTES: u64 = GIB;
/// Below this, a run with states kept and samples is likely to fill the disk.
pub const LOW_FREE_DISK_BYTES: u64 = 10 * GIB;
/// Less RAM than this cannot hold the streamed FP8 blocks of the 14B models (about 13 GiB) beside the system.
pub const LOW_RAM_BYTES: u64 = 32 * GIB;

/// Every problem in `facts` with its fix, blocking ones first.
pub fn findings(facts: &SystemFacts) -> Vec<Finding> {
    let mut out = Vec::new();
    build(facts, &mut out);
    driver(facts, &mut out);
    compute_capability(facts, &mut out);
    cuda(facts, &mut out);
    vram(facts, &mut out);
    ram(facts, &mut out);
    media(facts, &mut out);
    disk(facts, &mut out);
    // A stable sort keeps each group's own order.
    out.sort_by_key(|f| f.severity != Severity::Blocking);
    out
}

fn push(out: &mut Vec<Finding>, severity: Severity, problem: String, fix: impl Into<String>) {
    out.push(Finding {
        severity,
        problem,
        fix: fix.into(),
    });
}

/// Blocking in the GPU build, where the problem stops it; a warning in the CPU build, about the GPU build.
fn gpu_severity(facts: &SystemFacts) -> Severity {
    if facts.build.cuda {
        Severity::Blocking
    } else {
        Severity::Warning
    }
}

fn gpu_build_fix(facts: &SystemFacts) -> String {
    if facts.build.is_windows() {
        format!(
            "install the GPU build, Framesmith-Setup-{}-cuda.exe (needs an NVIDIA driver {MIN_DRIVER_MAJOR} or newer)",
            facts.build.version
        )
    } else {
        "build the GPU version: scripts/cuda-toolchain.sh --cudnn, then `cargo build --release --features cudnn` \
         (README, \"Building the CUDA path\")"
            .into()
    }
}

fn build(facts: &SystemFacts, out: &mut Vec<Finding>) {
    if !facts.build.cuda {
        let gpu = match facts.gpus.gpus.first() {
            Some(g) => format!(", although this machine has an NVIDIA GPU ({})", g.name),
            None => String::new(),
        };
        push(
            out,
            Severity::Warning,
            format!(
                "This build has no CUDA: training runs on the CPU, which suits the demo and small experiments only{gpu}"
            ),
            gpu_build_fix(facts),
        );
    }
    if !facts.build.reads_machine {
        push(
            out,
            Severity::Warning,
            "This build does not read the GPUs, RAM or disks (built without the `telemetry` feature)".into(),
            "build with the default features, or add `--features telemetry`",
        );
    }
}

fn driver(facts: &SystemFacts, out: &mut Vec<Finding>) {
    let scan = &facts.gpus;
    if facts.build.cuda && facts.build.reads_machine && scan.gpus.is_empty() {
        let problem = match &scan.driver {
            None => "No NVIDIA driver found: training runs on the CPU",
            Some(_) => "No NVIDIA GPU found: training runs on the CPU",
        };
        push(
            out,
            Severity::Warning,
            problem.into(),
            format!(
                "train on a machine with an NVIDIA GPU (compute capability {MIN_COMPUTE_CAPABILITY} or newer) and \
                 its driver, {MIN_DRIVER_MAJOR} or newer"
            ),
        );
    }
    let Some(d) = &scan.driver else { return };
    let too_old = match d.cuda {
        Some(cuda) => cuda < BUILD_CUDA,
        None => d.major().is_some_and(|m| m < MIN_DRIVER_MAJOR),
    };
    if !too_old || scan.gpus.is_empty() {
        return;
    }
    let runs = d
        .cuda
        .map(|c| format!(" runs CUDA up to {c}"))
        .unwrap_or_else(|| " is too old".into());
    push(
        out,
        gpu_severity(facts),
        format!(
            "NVIDIA driver {}{runs}; the GPU build needs CUDA {BUILD_CUDA}, driver {MIN_DRIVER_MAJOR} or newer",
            d.version
        ),
        format!(
            "update the NVIDIA driver to {MIN_DRIVER_MAJOR} or newer (nvidia.com/drivers, or your distribution's \
             nvidia-driver-{MIN_DRIVER_MAJOR} package), then restart"
        ),
    );
}

fn usable(gpu: &GpuFacts) -> bool {
    gpu.compute_capability
        .is_none_or(|c| c >= MIN_COMPUTE_CAPABILITY)
}

fn compute_capability(facts: &SystemFacts, out: &mut Vec<Finding>) {
    let gpus = &facts.gpus.gpus;
    let other = gpus.iter().find(|g| usable(g));
    for gpu in gpus.iter().filter(|g| !usable(g)) {
        let Some(cc) = gpu.compute_capability else {
            continue;
        };
        let (severity, fix) = match other {
            Some(good) => (
                Severity::Warning,
                format!(
                    "train on GPU {} ({}): training.device = \"cuda:{}\"",
                    good.index, good.name, good.index
                ),
            ),
            None => (
                gpu_severity(facts),
                format!(
                    "train on a card with compute capability {MIN_COMPUTE_CAPABILITY} or newer (RTX 30 series, A100 \
                     or later), or on the CPU: training.device = \"cpu\""
                ),
            ),
        };
        push(
            out,
            severity,
            format!(
                "GPU {} ({}) has compute capability {cc}; Framesmith's GPU kernels need {MIN_COMPUTE_CAPABILITY} \
                 or newer",
                gpu.index, gpu.name
            ),
            fix,
        );
    }
}

fn cuda(facts: &SystemFacts, out: &mut Vec<Finding>) {
    let Some(cuda) = &facts.cuda else { return };
    let listed = facts.gpus.gpus.len();
    match (&cuda.device_error, cuda.device_count) {
        (Some(err), _) if listed > 0 => push(
            out,
            Severity::Blocking,
            format!("CUDA cannot use the {listed} GPU(s) NVML lists: {err}"),
            format!(
                "update or reinstall the NVIDIA driver ({MIN_DRIVER_MAJOR} or newer) and restart; in a container, \
                 pass the GPUs through (docker run --gpus all)"
            ),
        ),
        (None, Some(0)) if listed > 0 => push(
            out,
            Severity::Blocking,
            format!("CUDA sees no device, although NVML lists {listed}"),
            "unset CUDA_VISIBLE_DEVICES, or list the GPUs to use in it",
        ),
        _ => {}
    }
    for lib in &cuda.libraries {
        // The driver library's failure is the device error above.
        if let (Some(err), None) = (&lib.error, &cuda.device_error) {
            push(
                out,
                Severity::Warning,
                format!("{} does not answer: {err}", lib.name),
                "reinstall the GPU build: its CUDA 13 libraries may be missing or mixed with other versions",
            );
        }
    }
    let has_device = cuda.device_count.unwrap_or(0) > 0;
    if let Some(cudnn) = cuda.cudnn.as_ref().filter(|_| has_device) {
        if let Some(err) = &cudnn.error {
            push(
                out,
                Severity::Blocking,
                format!(
                    "cuDNN cannot be loaded ({err}); this build's attention needs it on the GPU"
                ),
                "install cuDNN 9 for CUDA 13 (pip install nvidia-cudnn-cu13) and put its lib folder on \
                 LD_LIBRARY_PATH, or use a build without the `cudnn` feature (portable attention)",
            );
        }
    }
}

fn vram(facts: &SystemFacts, out: &mut Vec<Finding>) {
    if !facts.build.cuda {
        return;
    }
    for gpu in &facts.gpus.gpus {
        // A desktop takes a little; a quarter of the card is another program.
        if gpu.memory_total_bytes > 0 && gpu.memory_free_bytes < gpu.memory_total_bytes / 4 * 3 {
            push(
                out,
                Severity::Warning,
                format!(
                    "GPU {} ({}) has only {} free of {}: other programs hold the rest",
                    gpu.index,
                    gpu.name,
                    format_gib(gpu.memory_free_bytes),
                    format_gib(gpu.memory_total_bytes)
                ),
                "close the programs using it (nvidia-smi lists them); memory.blocks_to_swap = \"auto\" plans for \
                 what is free",
            );
        }
    }
}

fn ram(facts: &SystemFacts, out: &mut Vec<Finding>) {
    let Some(total) = facts.memory.ram_total_bytes else {
        return;
    };
    if total < LOW_RAM_BYTES {
        push(
            out,
            Severity::Warning,
            format!(
                "{} of RAM: the 14B models stream their FP8 blocks (about 13 GiB) from RAM",
                format_gib(total)
            ),
            "train the 1.3B or 5B models, or check a config first with `framesmith plan` (it counts RAM)",
        );
    }
}

fn media(facts: &SystemFacts, out: &mut Vec<Finding>) {
    let m = &facts.media;
    for (name, tool) in [("ffmpeg", &m.ffmpeg), ("ffprobe", &m.ffprobe)] {
        match tool {
            None if !m.media_foundation => push(
                out,
                Severity::Warning,
                format!(
                    "{name} was not found: video datasets cannot be read (image datasets and existing latent \
                     caches still train)"
                ),
                framesmith_data::media::FFMPEG_INSTALL_HINT,
            ),
            Some(t) => {
                if let Err(err) = &t.version {
                    push(
                        out,
                        Severity::Warning,
                        format!("{name} does not run: {err}: {}", t.path.display()),
                        format!("reinstall ffmpeg, or remove this {name} so another is found"),
                    );
                }
            }
            None => {}
        }
    }
}

fn disk(facts: &SystemFacts, out: &mut Vec<Finding>) {
    let d = &facts.disk;
    let Some(free) = d.free_bytes else { return };
    let severity = if free < BLOCKING_FREE_DISK_BYTES {
        Severity::Blocking
    } else if free < LOW_FREE_DISK_BYTES {
        Severity::Warning
    } else {
        return;
    };
    push(
        out,
        severity,
        format!(
            "Only {} free for the output folder: each save writes the LoRA and, with output.save_state, a \
             training state (up to about 1 GiB together): {}",
            format_gib(free),
            d.folder.display()
        ),
        "free disk space, or set output.output_dir to a folder on a disk with room",
    );
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
