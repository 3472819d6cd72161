//! The memory planner's answer (`framesmith plan`, the app's "Will it fit?"): plain, serialisable data that the
//! app can show without touching the engine. The arithmetic that fills it lives in `train::memory_plan`.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::run::{Checkpointing, StreamingMode};

/// Where a planned allocation lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// GPU memory.
    Device,
    /// Ordinary (pageable) host RAM.
    Host,
    /// Page-locked host RAM: counted in RAM and, on Windows, shown as shared GPU memory.
    HostPinned,
}

impl Placement {
    /// Whether the bytes count against host RAM.
    pub fn is_host(self) -> bool {
        matches!(self, Self::Host | Self::HostPinned)
    }
}

/// A memory limit a plan is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    /// The VRAM budget (`memory.vram_budget_gb`, else the card's free memory minus headroom).
    Vram,
    /// The RAM limit (`memory.ram_budget_gb`, else what the machine can give without swapping).
    Ram,
    /// The page-locked RAM limit (`memory.pinned_budget_gb`, else on Windows about half of RAM, else the RAM
    /// limit).
    PinnedRam,
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Vram => "VRAM",
            Self::Ram => "RAM",
            Self::PinnedRam => "page-locked RAM",
        })
    }
}

/// Where a plan puts what streams and what is saved: the settings' values, or the planner's choice where
/// `[memory]` says `"auto"`. A run uses these.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placements {
    /// How streamed blocks reach the GPU: `Pinned` (page-locked masters) or `Staged` (pageable masters through a
    /// page-locked ring); `Off` when no block streams. Never `Auto`.
    pub streaming: StreamingMode,
    /// Where the saved block inputs (and kept attention outputs) wait: the GPU, pageable or page-locked RAM.
    pub saved: Placement,
    /// What the step keeps from each block's forward. Never `Auto`.
    pub checkpointing: Checkpointing,
    /// The settings the planner chose (dotted keys), empty when none said `"auto"`.
    pub chosen: Vec<String>,
}

impl fmt::Display for Placements {
    /// "blocks from page-locked RAM, saved inputs in pageable RAM, checkpointing blocks (chosen: …)".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let blocks = match self.streaming {
            StreamingMode::Off => "no block streamed",
            StreamingMode::Pinned => "blocks streamed from page-locked RAM",
            StreamingMode::Staged | StreamingMode::Auto => {
                "blocks streamed from pageable RAM through a page-locked ring"
            }
        };
        let saved = match self.saved {
            Placement::Device => "saved inputs on the GPU",
            Placement::Host => "saved inputs in pageable RAM",
            Placement::HostPinned => "saved inputs in page-locked RAM",
        };
        let checkpointing = match self.checkpointing {
            Checkpointing::Blocks | Checkpointing::Auto => "blocks",
            Checkpointing::Attention => "attention",
            Checkpointing::AttentionProjection => "attention_projection",
            Checkpointing::Off => "off",
        };
        write!(f, "{blocks}, {saved}, checkpointing {checkpointing}")?;
        if !self.chosen.is_empty() {
            write!(f, " (chosen: {})", self.chosen.join(", "))?;
        }
        Ok(())
    }
}

/// Device memory a run holds back so that it runs as on a card of its VRAM budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VramHold {
    /// NVML's index of the GPU (the index the telemetry samples carry).
    pub gpu: u32,
    /// Bytes held back: allocated by the run, used by nothing.
    pub held_bytes: u64,
    /// The budget the run keeps within.
    pub budget_bytes: u64,
}

/// One component of the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanLine {
    /// What it is, in words ("resident blocks (10 × 391.9 MiB)").
    pub label: String,
    pub bytes: u64,
    pub placement: Placement,
}

/// Whether the plan's peak VRAM fits the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Fits,
    DoesNotFit,
    /// Neither a budget nor the card's free memory is known (no GPU here, no `vram_budget_gb`).
    NoBudget,
}

/// A change that makes a configuration fit, most preferred first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Suggestion {
    /// Stream this many blocks (turning streaming on when it is off).
    StreamBlocks { blocks_to_swap: usize },
    /// Checkpoint every block (`memory.checkpointing = "blocks"`: nothing kept but the block inputs), and stream
    /// this many blocks.
    CheckpointBlocks { blocks_to_swap: usize },
    /// Keep saved block inputs in RAM, and stream this many blocks.
    HostActivations { blocks_to_swap: usize },
    /// Store the base weights in FP8 (block-64 scales), and stream this many blocks.
    Fp8Base { blocks_to_swap: usize },
    /// Train on clips of at most this many frames (with every memory saving above).
    FewerFrames { frames: usize },
    /// Train at this resolution (with every memory saving above).
    LowerResolution { width: usize, height: usize },
    /// Nothing the planner can change fits: a larger card is needed.
    LargerCard,
}

impl fmt::Display for Suggestion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::StreamBlocks { blocks_to_swap } => {
                write!(f, "stream {blocks_to_swap} blocks (memory.blocks_to_swap = {blocks_to_swap})")
            }
            Self::CheckpointBlocks { blocks_to_swap } => write!(
                f,
                "keep only block inputs for the backward (memory.checkpointing = \"blocks\") and stream {blocks_to_swap} blocks"
            ),
            Self::HostActivations { blocks_to_swap } => write!(
                f,
                "keep saved activations in RAM (memory.activations = \"host\") and stream {blocks_to_swap} blocks"
            ),
            Self::Fp8Base { blocks_to_swap } => write!(
                f,
                "use FP8 base weights (model.base_dtype = \"fp8\") and stream {blocks_to_swap} blocks"
            ),
            Self::FewerFrames { frames } => write!(
                f,
                "train on clips of at most {frames} frames (dataset.target_frames), with activations in RAM and blocks streamed"
            ),
            Self::LowerResolution { width, height } => write!(
                f,
                "train at {width}x{height} (dataset.resolution), with activations in RAM and blocks streamed"
            ),
            Self::LargerCard => f.write_str("no setting fits this budget: it needs a larger card"),
        }
    }
}

/// The memory of a run's samples during training (`[sampling]`): what is on the device and in RAM while the
/// largest sample is denoised and decoded between two steps, line by line as the training step's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingPhase {
    /// The largest sample, in words ("1024x1024, 1 frame, 20 steps, 4608 tokens").
    pub workload: String,
    pub peak_vram_bytes: u64,
    pub peak_ram_bytes: u64,
    /// Every component while sampling, device and host.
    pub breakdown: Vec<PlanLine>,
}

/// The part of a run whose memory is the plan's peak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The training step.
    Step,
    /// A sample during training.
    Sampling,
}

/// The memory plan of one training configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanReport {
    /// The model, in words ("Wan2.1 T2V-14B", or its shape).
    pub model: String,
    /// What one step trains on ("832x480, 81 frames, batch 1, 32760 tokens").
    pub workload: String,
    /// Transformer tokens of one step (all samples of the batch).
    pub tokens: u64,
    pub num_blocks: usize,
    /// Blocks whose weights live in RAM and are streamed in during the step.
    pub blocks_to_swap: usize,
    /// Whether the planner chose `blocks_to_swap` (`blocks_to_swap = "auto"`).
    pub blocks_chosen: bool,
    /// Frozen weights of one block in the chosen format, packed for streaming (a GPU slot's size).
    pub block_bytes: u64,
    /// The larger of the training step's peak VRAM (its breakdown's device lines) and the sampling phase's.
    pub peak_vram_bytes: u64,
    /// Host RAM the plan adds (streamed weights, staging ring, saved activations), the larger of the step's and
    /// the sampling phase's.
    pub peak_ram_bytes: u64,
    /// The page-locked part of `peak_ram_bytes`.
    pub pinned_ram_bytes: u64,
    /// The VRAM budget the verdict is against, when known.
    pub vram_budget_bytes: Option<u64>,
    /// Total host RAM, when known.
    pub host_ram_bytes: Option<u64>,
    pub verdict: Verdict,
    /// Every component, device and host.
    pub breakdown: Vec<PlanLine>,
    /// When it does not fit: what would, best first.
    pub suggestions: Vec<Suggestion>,
    /// Things worth knowing (RAM pressure, Windows' pinned-memory cap, settings that do not apply).
    pub notes: Vec<String>,
    /// A CPU run: every line is in RAM and the verdict is against the machine's RAM.
    #[serde(default)]
    pub on_cpu: bool,
    /// The GPU has less free memory now than the plan's peak under its explicit budget (other processes hold
    /// it): what to do, in words. Also among `notes`; a run logs it as a warning.
    #[serde(default)]
    pub busy_gpu: Option<String>,
    /// Processes of the run on this machine (one per GPU): the plan is each one's, against its own GPU, and
    /// their RAM adds up ([`PlanReport::machine_ram_bytes`]).
    #[serde(default = "one_rank")]
    pub ranks_on_machine: usize,
    /// Why this machine's RAM cannot hold the plan: the RAM of every rank on it, or its page-locked part (which
    /// cannot be swapped out, and which Windows caps near half of RAM), with what to change. The verdict is then
    /// `DoesNotFit`, whatever the VRAM.
    #[serde(default)]
    pub ram_shortfall: Option<String>,
    /// The RAM the plan must fit: `memory.ram_budget_gb`, else what the machine could give without swapping when
    /// it was planned, else its RAM (`None`: unknown).
    #[serde(default)]
    pub ram_budget_bytes: Option<u64>,
    /// `ram_budget_bytes` is `memory.ram_budget_gb`.
    #[serde(default)]
    pub ram_budget_set: bool,
    /// The samples during training, when the run makes any and its family samples (`breakdown` is the step's).
    #[serde(default)]
    pub sampling: Option<SamplingPhase>,
    /// The page-locked RAM the plan must fit (`memory.pinned_budget_gb`, else on Windows about half of RAM, else
    /// the RAM limit; `None`: unknown).
    #[serde(default)]
    pub pinned_budget_bytes: Option<u64>,
    /// Where streamed blocks and saved activations go and what the step keeps: the settings', or what the planner
    /// chose for those that say `"auto"`. `None` in reports made before placements were planned.
    #[serde(default)]
    pub placements: Option<Placements>,
    /// The limit that binds: the one that ruled out a faster plan (the VRAM when it set the streamed block
    /// count), or the one a plan that does not fit misses; `None` when nothing limits the plan.
    #[serde(default)]
    pub binding_limit: Option<Limit>,
}

fn one_rank() -> usize {
    1
}

impl PlanReport {
    /// Whether the verdict is `Fits`.
    pub fn fits(&self) -> bool {
        self.verdict == Verdict::Fits
    }

    /// The warning when the RAM of every rank on this machine together nears the machine's (the OS, the app
    /// and the memory-mapped checkpoint need RAM too): what it needs, what the machine has, and what to change;
    /// `ram_shortfall` when the RAM cannot hold the plan at all.
    pub fn ram_pressure(&self) -> Option<String> {
        if let Some(shortfall) = &self.ram_shortfall {
            return Some(shortfall.clone());
        }
        let ram = self.ram_budget_bytes.or(self.host_ram_bytes)?;
        let all = self.machine_ram_bytes();
        // Placements the planner chose fit the RAM limit with room to spare by construction.
        let chosen = self
            .placements
            .as_ref()
            .is_some_and(|p| !p.chosen.is_empty());
        if all <= ram / 10 * 8 || (chosen && all <= ram) {
            return None;
        }
        let has = self.ram_limit_words(ram);
        Some(match self.ranks_on_machine {
            0 | 1 => format!(
                "the plan needs {} of RAM and {has}: expect swapping; use fewer streamed blocks or \
                 activations on the GPU",
                format_gib(all),
            ),
            ranks => format!(
                "the plan needs {} of RAM per rank, {} for the {ranks} ranks, and {has}: \
                 expect swapping; use fewer GPUs (--gpus), fewer streamed blocks or activations on the GPU",
                format_gib(self.peak_ram_bytes),
                format_gib(all),
            ),
        })
    }

    /// "this machine has …" or "the RAM budget is …" for a limit of `ram` bytes.
    fn ram_limit_words(&self, ram: u64) -> String {
        match (self.ram_budget_set, self.host_ram_bytes) {
            (true, _) => format!(
                "the RAM budget (memory.ram_budget_gb) is {}",
                format_gib(ram)
            ),
            (false, Some(total)) if total > ram => format!(
                "this machine can give {} without swapping ({} in all)",
                format_gib(ram),
                format_gib(total)
            ),
            _ => format!("this machine has {}", format_gib(ram)),
        }
    }

    /// ", RAM … of …" for the verdict line of a GPU run (empty when the RAM limit is unknown).
    fn ram_words(&self) -> String {
        match self.ram_budget_bytes {
            Some(limit) => format!(
                ", RAM {} of {}",
                format_gib(self.machine_ram_bytes()),
                format_gib(limit)
            ),
            None => String::new(),
        }
    }

    /// Host RAM of every rank on this machine together: each one's `peak_ram_bytes` (its streamed blocks, saved
    /// activations and parked expert are its own).
    pub fn machine_ram_bytes(&self) -> u64 {
        self.peak_ram_bytes
            .saturating_mul(self.ranks_on_machine.max(1) as u64)
    }

    /// Which phase's peak VRAM is the plan's: sampling when it needs more than the training step.
    pub fn binding_phase(&self) -> Phase {
        match &self.sampling {
            Some(s) if s.peak_vram_bytes > self.device_bytes() => Phase::Sampling,
            _ => Phase::Step,
        }
    }

    /// " while sampling (the training step: …)" or " in the training step (sampling: …)" for a run that samples:
    /// which phase the peak is, and the other's; empty without samples.
    pub fn phase_words(&self) -> String {
        let Some(sampling) = &self.sampling else {
            return String::new();
        };
        match self.binding_phase() {
            Phase::Sampling => format!(
                " while sampling (the training step: {})",
                format_gib(self.device_bytes())
            ),
            Phase::Step => format!(
                " in the training step (sampling: {})",
                format_gib(sampling.peak_vram_bytes)
            ),
        }
    }

    /// Sum of the training step's breakdown lines that live on the device (`peak_vram_bytes` unless sampling
    /// needs more).
    pub fn device_bytes(&self) -> u64 {
        self.sum(|p| p == Placement::Device)
    }

    /// Sum of the training step's breakdown lines that live in host RAM (`peak_ram_bytes` unless sampling needs
    /// more).
    pub fn host_bytes(&self) -> u64 {
        self.sum(Placement::is_host)
    }

    fn sum(&self, keep: impl Fn(Placement) -> bool) -> u64 {
        self.breakdown
            .iter()
            .filter(|l| keep(l.placement))
            .map(|l| l.bytes)
            .sum()
    }

    /// "limits: VRAM … of …, RAM … of …, page-locked … of …; RAM binds" (the known limits, and the one that binds);
    /// `None` for a CPU run.
    pub fn limits_line(&self) -> Option<String> {
        if self.on_cpu {
            return None;
        }
        let of = |used: u64, limit: Option<u64>| match limit {
            Some(limit) => format!("{} of {}", format_gib(used), format_gib(limit)),
            None => format!("{} (no limit known)", format_gib(used)),
        };
        let ranks = self.ranks_on_machine.max(1) as u64;
        let binds = match self.binding_limit {
            Some(limit) if self.fits() => format!("; {limit} binds (a faster plan needs more)"),
            Some(limit) => format!("; {limit} binds (the plan does not fit it)"),
            None => "; nothing binds".to_string(),
        };
        Some(format!(
            "limits: VRAM {}, RAM {}, page-locked {}{binds}",
            of(self.peak_vram_bytes, self.vram_budget_bytes),
            of(self.machine_ram_bytes(), self.ram_budget_bytes),
            of(
                self.pinned_ram_bytes.saturating_mul(ranks),
                self.pinned_budget_bytes
            ),
        ))
    }

    /// One line: the verdict with peak VRAM against the budget.
    pub fn verdict_line(&self) -> String {
        if self.on_cpu {
            let peak = format_gib(self.peak_ram_bytes);
            let ram = self.ram_budget_bytes.or(self.host_ram_bytes);
            return match (self.verdict, ram) {
                (Verdict::Fits, Some(ram)) => {
                    format!("Fits on the CPU: peak RAM {peak} of {}", format_gib(ram))
                }
                (Verdict::DoesNotFit, Some(ram)) => format!(
                    "Does not fit on the CPU: peak RAM {peak}, {}",
                    self.ram_limit_words(ram)
                ),
                _ => format!("Runs on the CPU: peak RAM {peak}"),
            };
        }
        let peak = format_gib(self.peak_vram_bytes);
        // With several ranks the VRAM figures are each GPU's.
        let peak = match self.ranks_on_machine {
            0 | 1 => peak,
            n => format!("{peak} per GPU ({n} GPUs)"),
        };
        let peak = format!("{peak}{}", self.phase_words());
        let streamed = match (self.blocks_to_swap, self.blocks_chosen) {
            (0, _) => String::new(),
            (n, true) => format!(", {n} of {} blocks streamed (chosen)", self.num_blocks),
            (n, false) => format!(", {n} of {} blocks streamed", self.num_blocks),
        };
        let vram_fits = self
            .vram_budget_bytes
            .is_none_or(|budget| self.peak_vram_bytes <= budget);
        if self.ram_shortfall.is_some() && vram_fits {
            let of = self
                .vram_budget_bytes
                .map(|b| format!(" of {}", format_gib(b)))
                .unwrap_or_default();
            return format!(
                "Does not fit in RAM: peak VRAM {peak}{of}{streamed}, but this machine's RAM cannot hold the \
                 plan (see the note)"
            );
        }
        match (self.verdict, self.vram_budget_bytes) {
            (Verdict::Fits, Some(budget)) => format!(
                "Fits: peak VRAM {peak} of {}{}{streamed}",
                format_gib(budget),
                self.ram_words()
            ),
            (Verdict::DoesNotFit, Some(budget)) => format!(
                "Does not fit: peak VRAM {peak}, budget {}{streamed}",
                format_gib(budget)
            ),
            _ => format!("Peak VRAM {peak}{streamed} (no budget known: set memory.vram_budget_gb)"),
        }
    }
}

/// Bytes as GiB with two decimals ("21.37 GiB"), or MiB below 1 GiB.
pub fn format_gib(bytes: u64) -> String {
    const MIB: f64 = (1u64 << 20) as f64;
    const GIB: f64 = (1u64 << 30) as f64;
    let b = bytes as f64;
    if b >= GIB {
        format!("{:.2} GiB", b / GIB)
    } else {
        format!("{:.1} MiB", b / MIB)
    }
}

/// The table rows of `lines` (component, VRAM, RAM; `*` marks page-locked RAM), labels `width` wide.
fn lines_fmt(f: &mut fmt::Formatter<'_>, lines: &[PlanLine], width: usize) -> fmt::Result {
    for l in lines {
        let size = format_gib(l.bytes);
        let (vram, ram, mark) = match l.placement {
            Placement::Device => (size, String::new(), ' '),
            Placement::Host => (String::new(), size, ' '),
            Placement::HostPinned => (String::new(), size, '*'),
        };
        writeln!(f, "{:<width$}  {vram:>11}  {ram:>11}{mark}", l.label)?;
    }
    Ok(())
}

impl fmt::Display for PlanReport {
    /// A table (component, VRAM, RAM), the totals and the verdict, for the terminal.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} — {}", self.model, self.workload)?;
        let sampling_lines = self.sampling.iter().flat_map(|s| &s.breakdown);
        let width = self
            .breakdown
            .iter()
            .chain(sampling_lines)
            .map(|l| l.label.chars().count())
            .max()
            .unwrap_or(0)
            .max(18);
        writeln!(f, "{:<width$}  {:>11}  {:>11}", "component", "VRAM", "RAM")?;
        lines_fmt(f, &self.breakdown, width)?;
        let step = if self.sampling.is_some() {
            "training step peak"
        } else {
            "peak"
        };
        writeln!(
            f,
            "{:<width$}  {:>11}  {:>11}",
            step,
            format_gib(self.device_bytes()),
            format_gib(self.host_bytes())
        )?;
        if let Some(sampling) = &self.sampling {
            writeln!(f, "sampling during training — {}", sampling.workload)?;
            lines_fmt(f, &sampling.breakdown, width)?;
            writeln!(
                f,
                "{:<width$}  {:>11}  {:>11}",
                "sampling peak",
                format_gib(sampling.peak_vram_bytes),
                format_gib(sampling.peak_ram_bytes)
            )?;
        }
        if self.pinned_ram_bytes > 0 {
            writeln!(
                f,
                "* page-locked: {} of the RAM",
                format_gib(self.pinned_ram_bytes)
            )?;
        }
        if self.ranks_on_machine > 1 {
            writeln!(
                f,
                "each of the {} ranks on this machine: the lines above, on its own GPU; their RAM together: {}",
                self.ranks_on_machine,
                format_gib(self.machine_ram_bytes())
            )?;
        }
        writeln!(f, "{}", self.verdict_line())?;
        if let Some(placements) = &self.placements {
            writeln!(f, "placements: {placements}")?;
        }
        if let Some(line) = self.limits_line() {
            writeln!(f, "{line}")?;
        }
        for s in &self.suggestions {
            writeln!(f, "suggestion: {s}")?;
        }
        for n in &self.notes {
            writeln!(f, "note: {n}")?;
        }
        Ok(())
    }
}
