//! The plan's lines: every component of peak VRAM and host RAM with the streamed blocks in RAM, and their totals.

use super::model::{BlockKind, ModelMemory};
use super::working_set::pool_fragmentation_bytes;
use super::{
    activations, PlanInput, CUDA_CONTEXT_BYTES, POOL_FRAGMENTATION_MIN_BYTES,
    POOL_FRAGMENTATION_PERCENT,
};
use framesmith_config::protocol::memory::{format_gib, Placement, PlanLine};
use framesmith_config::run::{ExpertMode, StreamingMode};
use framesmith_nn::adapter::AdapterKind;

pub(super) fn line(label: impl Into<String>, bytes: u64, placement: Placement) -> PlanLine {
    PlanLine {
        label: label.into(),
        bytes,
        placement,
    }
}

/// "N × size" of `counts` blocks of each kind (kinds with none left out), for the lines' labels.
pub(super) fn blocks_label(
    s: &ModelMemory,
    counts: &[usize],
    bytes: impl Fn(&BlockKind) -> u64,
) -> String {
    let parts: Vec<String> = s
        .kinds
        .iter()
        .zip(counts)
        .filter(|(_, &n)| n > 0 || s.kinds.len() == 1)
        .map(|(k, &n)| match s.kinds.len() {
            1 => format!("{n} × {}", format_gib(bytes(k))),
            _ => format!("{n} {} × {}", k.label, format_gib(bytes(k))),
        })
        .collect();
    if parts.is_empty() {
        "0".into()
    } else {
        parts.join(" + ")
    }
}

pub(super) fn total_bytes(
    s: &ModelMemory,
    counts: &[usize],
    bytes: impl Fn(&BlockKind) -> u64,
) -> u64 {
    s.kinds
        .iter()
        .zip(counts)
        .map(|(k, &n)| n as u64 * bytes(k))
        .sum()
}

/// The resident blocks of each kind with `streamed` streamed.
pub(super) fn resident_counts(s: &ModelMemory, streamed: &[usize]) -> Vec<usize> {
    s.kind_counts()
        .iter()
        .zip(s.per_kind(streamed))
        .map(|(all, st)| all - st)
        .collect()
}

/// The GPU slots of each kind with `streamed` streamed: each kind that streams has its own ring.
pub(super) fn slot_counts(input: &PlanInput, s: &ModelMemory, streamed: &[usize]) -> Vec<usize> {
    s.per_kind(streamed)
        .into_iter()
        .map(|n| input.streaming.gpu_slots.min(n))
        .collect()
}

/// The adapter's weights, gradients, working memory (LoKr, LoHa, DoRA) and AdamW moments.
fn adapter_lines(input: &PlanInput, s: &ModelMemory) -> Vec<PlanLine> {
    let mut out = Vec::with_capacity(4);
    let lora = 4 * s.lora.params;
    let modules = s.lora.modules;
    let kind = input.lora.kind;
    let name = if kind == AdapterKind::Lora {
        "LoRA"
    } else {
        kind.name()
    };
    out.push(line(
        format!(
            "{name} weights ({modules} linears, rank {}, f32)",
            input.lora.rank
        ),
        lora,
        Placement::Device,
    ));
    out.push(line(
        format!("{name} gradients (f32)"),
        lora,
        Placement::Device,
    ));
    let work = s.lora.work_bytes(kind, &s.shape);
    if work > 0 {
        out.push(line(
            format!("{name} working memory (one layer's update or norm terms)"),
            work,
            Placement::Device,
        ));
    }
    if input.optimizer_and_context {
        out.push(line("AdamW moments (2 × f32)", 2 * lora, Placement::Device));
    }
    out
}

/// Every component with `blocks_to_swap` blocks in RAM.
pub(super) fn breakdown(
    input: &PlanInput,
    s: &ModelMemory,
    blocks_to_swap: usize,
) -> Vec<PlanLine> {
    let set = s.streamed_blocks(blocks_to_swap);
    let resident = resident_counts(s, set);
    let mut out = vec![line(
        format!(
            "resident blocks ({})",
            blocks_label(s, &resident, |k| k.data_bytes)
        ),
        total_bytes(s, &resident, |k| k.data_bytes),
        Placement::Device,
    )];
    if !set.is_empty() {
        let slots = slot_counts(input, s, set);
        out.push(line(
            format!(
                "GPU slots for streamed blocks ({})",
                blocks_label(s, &slots, |k| k.packed_bytes)
            ),
            total_bytes(s, &slots, |k| k.packed_bytes),
            Placement::Device,
        ));
    }
    for &(label, bytes) in &s.resident {
        out.push(line(label, bytes, Placement::Device));
    }
    out.extend(adapter_lines(input, s));
    out.extend(activations::kept_lines(
        input.checkpointing,
        super::placement::saved_placement(input),
        s,
    ));
    for &(label, bytes) in &s.shared_inputs {
        out.push(line(label, bytes, Placement::Device));
    }
    let working = s.working_set_bytes;
    out.push(line(
        "block recompute + backward working set",
        working,
        Placement::Device,
    ));
    if !input.on_cpu {
        out.push(line(
            match s.fragmentation_bytes {
                None => format!(
                    "memory pool fragmentation ({POOL_FRAGMENTATION_PERCENT}% of the working set, at least {})",
                    format_gib(POOL_FRAGMENTATION_MIN_BYTES)
                ),
                Some(_) => "memory pool fragmentation (as measured for this block)".to_string(),
            },
            s.fragmentation_bytes
                .unwrap_or_else(|| pool_fragmentation_bytes(working)),
            Placement::Device,
        ));
    }
    if input.optimizer_and_context && !input.on_cpu {
        out.push(line(
            "CUDA context and workspaces",
            CUDA_CONTEXT_BYTES,
            Placement::Device,
        ));
    }
    out.extend(streamed_host_lines(input, s, set));
    if let Some(mode) = input.experts {
        out.extend(parked_expert_lines(input, s, set, mode));
    }
    out
}

/// What the expert not in use holds (a run of two experts): its resident blocks wait in host RAM and its
/// streamed blocks stay in their host buffers, while its embeddings, head and GPU slots stay on the device, and
/// with `split` its own LoRA and AdamW moments too (its gradients exist only while it runs). The expert in use
/// keeps the host copy of its resident blocks that parking made.
pub(super) fn parked_expert_lines(
    input: &PlanInput,
    s: &ModelMemory,
    streamed: &[usize],
    mode: ExpertMode,
) -> Vec<PlanLine> {
    let embeddings: u64 = s.resident.iter().map(|&(_, bytes)| bytes).sum();
    let mut out = vec![line(
        "parked expert: embeddings and head",
        embeddings,
        Placement::Device,
    )];
    if !streamed.is_empty() {
        let slots = slot_counts(input, s, streamed);
        out.push(line(
            format!(
                "parked expert: GPU slots ({})",
                blocks_label(s, &slots, |k| k.packed_bytes)
            ),
            total_bytes(s, &slots, |k| k.packed_bytes),
            Placement::Device,
        ));
    }
    if mode == ExpertMode::Split {
        out.push(line(
            "parked expert: its LoRA and AdamW moments (f32)",
            3 * 4 * s.lora.params,
            Placement::Device,
        ));
    }
    let resident = resident_counts(s, streamed);
    let resident_label = blocks_label(s, &resident, |k| k.data_bytes);
    let resident_bytes = total_bytes(s, &resident, |k| k.data_bytes);
    out.push(line(
        format!("parked expert: resident blocks in RAM ({resident_label})"),
        resident_bytes,
        Placement::Host,
    ));
    // Parking keeps the host copy of each expert's resident blocks, so the expert on the GPU has one too.
    out.push(line(
        format!("expert in use: host copy of its resident blocks ({resident_label})"),
        resident_bytes,
        Placement::Host,
    ));
    for mut l in streamed_host_lines(input, s, streamed) {
        l.label = format!("parked expert: {}", l.label);
        out.push(l);
    }
    out
}

/// Host RAM of the streamed blocks' masters and the staging ring.
pub(super) fn streamed_host_lines(
    input: &PlanInput,
    s: &ModelMemory,
    streamed: &[usize],
) -> Vec<PlanLine> {
    if streamed.is_empty() {
        return Vec::new();
    }
    let counts = s.per_kind(streamed);
    let masters = format!(
        "streamed blocks ({})",
        blocks_label(s, &counts, |k| k.packed_bytes)
    );
    let master_bytes = total_bytes(s, &counts, |k| k.packed_bytes);
    match input.streaming.mode {
        StreamingMode::Staged => {
            let slots = input.streaming.staging_slots;
            let largest = s
                .kinds
                .iter()
                .zip(&counts)
                .filter(|(_, &n)| n > 0)
                .map(|(k, _)| k.packed_bytes)
                .max()
                .unwrap_or(0);
            let chunk = largest.min(framesmith_nn::offload::STAGING_CHUNK_BYTES as u64);
            vec![
                line(masters, master_bytes, Placement::Host),
                line(
                    format!("pinned staging ring ({slots} × {})", format_gib(chunk)),
                    slots as u64 * chunk,
                    Placement::HostPinned,
                ),
            ]
        }
        // An unsettled "auto" (a caller that plans without choosing) is planned as `pinned`.
        StreamingMode::Pinned | StreamingMode::Off | StreamingMode::Auto => {
            vec![line(masters, master_bytes, Placement::HostPinned)]
        }
    }
}

pub(super) fn device_total(lines: &[PlanLine]) -> u64 {
    lines
        .iter()
        .filter(|l| l.placement == Placement::Device)
        .fold(0, |total, l| total.saturating_add(l.bytes))
}
