//! The plan's sampling phase: what is on the device and in RAM while a sample is made between two training steps
//! (`[sampling]`, [`crate::train::samples`]). It counts what that code does: the step's activations and LoRA
//! gradients are gone (a step frees them when it returns) and the device's cached memory is given back before
//! each sample; the resident blocks, the GPU slots and host masters of streamed blocks (the sampler streams them as
//! the step does), the LoRA, AdamW's moments and the CUDA context stay; the family's decoder weights and the
//! prompts' embeddings, loaded at the start, stay on the device for the whole run (so the step's plan counts them
//! too). On top come the DiT's forward at the sample's size (no gradients; a guided sample runs the negative
//! prompt's pass after the prompt's, holding one prediction meanwhile) and, after it, the decoder's working set.

use std::path::Path;

use super::breakdown::{blocks_label, line, parked_expert_lines, resident_counts, slot_counts};
use super::breakdown::{streamed_host_lines, total_bytes};
use super::model::ModelMemory;
use super::working_set::pool_fragmentation_bytes;
use super::{ClipShape, PlanError, PlanInput, WorkingSet, CUDA_CONTEXT_BYTES};
use crate::generate::prompts::read_prompt_file;
use framesmith_config::protocol::memory::{Placement, PlanLine};
use framesmith_config::run::Checkpointing;

/// The largest sample a run makes during training, from its prompt file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleShape {
    pub width: usize,
    pub height: usize,
    /// Video frames (1 for an image).
    pub frames: usize,
    /// Denoising steps (the most any prompt takes).
    pub steps: usize,
    /// Some prompt runs classifier-free guidance (a second pass per step with the negative prompt).
    pub guided: bool,
    /// Prompts in the file: each one's embeddings wait on the device for the whole run.
    pub prompts: usize,
}

impl SampleShape {
    /// The largest sample (pixels × frames) of the prompt file at `path`, each prompt's frames, guidance and
    /// negative prompt as the family reads them (`frames_of(spec)`, `guided(spec)`).
    pub fn from_prompt_file(
        path: &Path,
        frames_of: impl Fn(&crate::generate::prompts::PromptSpec) -> usize,
        guided: impl Fn(&crate::generate::prompts::PromptSpec) -> bool,
    ) -> Result<Self, String> {
        let specs = read_prompt_file(path).map_err(|e| format!("{e:#}"))?;
        let largest = specs
            .iter()
            .max_by_key(|s| (s.width * s.height).saturating_mul(frames_of(s)))
            .ok_or_else(|| format!("no prompt in {}", path.display()))?;
        Ok(Self {
            width: largest.width,
            height: largest.height,
            frames: frames_of(largest),
            steps: specs.iter().map(|s| s.steps).max().unwrap_or(0),
            guided: specs.iter().any(&guided),
            prompts: specs.len(),
        })
    }
}

/// The largest sample of the run config `cfg`'s prompt file (`sampling.prompts`), read as [`SampleShape::
/// from_prompt_file`] does, into `input.sampling`; a run whose prompt file cannot be read gets a sampling phase of
/// nothing but is refused at its start. `None` when it names no prompt file (a run with one loads the samples'
/// decoder and embeddings, and samples when asked, even with nothing scheduled).
pub fn settle_sampling(
    cfg: &framesmith_config::RunConfig,
    input: &mut PlanInput,
    frames_of: impl Fn(&crate::generate::prompts::PromptSpec) -> usize,
    guided: impl Fn(&crate::generate::prompts::PromptSpec) -> bool,
) {
    input.sampling = cfg
        .sampling
        .prompts
        .as_deref()
        .filter(|p| !p.as_os_str().is_empty())
        .and_then(|path| SampleShape::from_prompt_file(path, frames_of, guided).ok());
}

/// What a family's samples hold and add beyond the DiT's forward ([`super::DescribeModel::sampling`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SamplingMemory {
    /// On the device for the whole run (loaded at the start for the samples): the decoder's weights, the
    /// prompts' embeddings, by component.
    pub held: Vec<(String, u64)>,
    /// The denoising's own tensors beside the DiT's forward: latents, noise, predictions, the solver's history.
    pub denoise_state_bytes: u64,
    /// The decoder's working set at the sample's size (after the denoising, whose tensors are freed by then but
    /// the latents).
    pub decode_bytes: u64,
    /// The decoded sample in RAM (frames on their way to PNG / MP4).
    pub decoded_host_bytes: u64,
}

/// The sizes of the sampling phase of a plan input (they do not depend on how many blocks stream).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct SamplingSizes {
    pub family: SamplingMemory,
    /// The DiT's forward at the sample's size: one block's working set, the tensors every block reads, the
    /// adapter's working memory.
    pub forward_bytes: u64,
    pub workload: String,
}

/// A decoder that runs chunk by chunk (a causal video VAE: one latent frame at a time, each chunk's convolutions
/// reading cached frames of the one before), at its widest: `channels` × `frames` (of one chunk) × `pixels` at the
/// stage with the most of them, each element `compute_bytes`. Ten such tensors are alive at its peak, counted from
/// the causal convolution: its input, the input joined to the two cached frames, that copied frames-first and
/// zero-padded (three copies of frames + 2), the two taps' outputs and their sum, and the residual block's input.
pub fn chunked_decode_bytes(channels: u64, frames: u64, pixels: u64, compute_bytes: u64) -> u64 {
    10 * channels * frames * pixels * compute_bytes
}

/// The sampling phase's sizes for `input`, `None` when it samples nothing or its family makes no samples during
/// training.
pub(super) fn sampling_sizes(input: &PlanInput) -> Result<Option<SamplingSizes>, PlanError> {
    let Some(sample) = input.sampling else {
        return Ok(None);
    };
    let Some(family) = input.model.sampling(input, &sample)? else {
        return Ok(None);
    };
    let mut forward = input.clone();
    forward.clip = ClipShape {
        width: sample.width,
        height: sample.height,
        frames: sample.frames,
        batch: 1,
    };
    forward.working_set = WorkingSet::FORWARD;
    forward.checkpointing = Checkpointing::Blocks;
    forward.start_frame = false;
    let m = input.model.describe(&forward)?;
    let shared: u64 = m.shared_inputs.iter().map(|&(_, b)| b).sum();
    let adapter = m.lora.work_bytes(input.lora.kind, &m.shape);
    Ok(Some(SamplingSizes {
        forward_bytes: m.working_set_bytes + shared + adapter,
        workload: format!(
            "{}x{}, {} frame{}, {} steps{}, {} tokens",
            sample.width,
            sample.height,
            sample.frames,
            if sample.frames == 1 { "" } else { "s" },
            sample.steps,
            if sample.guided { " with CFG" } else { "" },
            m.shape.tokens
        ),
        family,
    }))
}

/// The lines the samples add to the training step: what they keep on the device for the whole run.
pub(super) fn held_lines(sizes: &SamplingSizes) -> Vec<PlanLine> {
    sizes
        .family
        .held
        .iter()
        .map(|(label, bytes)| line(format!("samples: {label}"), *bytes, Placement::Device))
        .collect()
}

/// Every component while sampling with `blocks_to_swap` blocks streamed (`s`: the step's description).
pub(super) fn sampling_lines(
    input: &PlanInput,
    s: &ModelMemory,
    sizes: &SamplingSizes,
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
    out.push(line(
        "LoRA weights (f32)",
        4 * s.lora.params,
        Placement::Device,
    ));
    if input.optimizer_and_context {
        out.push(line(
            "AdamW moments (2 × f32)",
            8 * s.lora.params,
            Placement::Device,
        ));
    }
    out.extend(held_lines(sizes));
    let f = &sizes.family;
    let denoise = sizes.forward_bytes + f.denoise_state_bytes;
    // The decoder runs after the denoising: the larger of the two is the phase's working set.
    let working = denoise.max(f.decode_bytes);
    out.push(line(
        format!(
            "sampling working set: the larger of the DiT's forward at the sample's size ({}) and the decode ({})",
            framesmith_config::protocol::memory::format_gib(denoise),
            framesmith_config::protocol::memory::format_gib(f.decode_bytes)
        ),
        working,
        Placement::Device,
    ));
    if !input.on_cpu {
        out.push(line(
            "memory pool fragmentation (of the sampling working set)",
            pool_fragmentation_bytes(working),
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
    out.push(line(
        "the decoded sample",
        f.decoded_host_bytes,
        Placement::Host,
    ));
    if input.on_cpu {
        for l in &mut out {
            l.placement = Placement::Host;
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::plan::plan;
    use crate::plan::tests::{fp8_14b, GIB};
    use framesmith_config::protocol::memory::Phase;
    use framesmith_config::run::AutoKeyword;
    use framesmith_config::run::BlocksToSwap;

    /// The 14B in FP8 within 24 GiB, `auto`, sampling `sample` (or nothing).
    fn within_24(sample: Option<SampleShape>) -> PlanInput {
        let mut i = fp8_14b();
        i.streaming.blocks_to_swap = BlocksToSwap::Auto(AutoKeyword::Auto);
        i.streaming.activations = framesmith_config::run::ActivationPlacement::Host;
        i.vram_budget_bytes = Some(24 * GIB);
        i.sampling = sample;
        i
    }

    fn clip(width: usize, height: usize, frames: usize) -> SampleShape {
        SampleShape {
            width,
            height,
            frames,
            steps: 20,
            guided: true,
            prompts: 1,
        }
    }

    #[test]
    fn without_samples_the_plan_is_the_steps() {
        let r = plan(&within_24(None)).unwrap();
        assert!(r.sampling.is_none());
        assert_eq!(r.binding_phase(), Phase::Step);
        assert_eq!(r.device_bytes(), r.peak_vram_bytes);
        assert!(!r.breakdown.iter().any(|l| l.label.starts_with("samples:")));
        assert!(!r.verdict_line().contains("sampling"), "{r}");
    }

    #[test]
    fn a_sample_larger_than_the_step_makes_auto_stream_more() {
        let plain = plan(&within_24(None)).unwrap();
        // A 720p clip of 81 frames: its untiled decode needs more than the 480p step.
        let r = plan(&within_24(Some(clip(1280, 720, 81)))).unwrap();
        let sampling = r.sampling.as_ref().expect("a sampling phase");
        assert_eq!(r.binding_phase(), Phase::Sampling, "{r}");
        assert_eq!(r.peak_vram_bytes, sampling.peak_vram_bytes);
        assert!(r.peak_vram_bytes <= 24 * GIB && r.fits(), "{r}");
        assert!(r.blocks_to_swap > plain.blocks_to_swap, "{r}\n{plain}");
        assert!(
            r.verdict_line()
                .contains("while sampling (the training step: "),
            "{}",
            r.verdict_line()
        );
        // The samples' VAE and embeddings stay on the device through the step too.
        assert!(r.breakdown.iter().any(|l| l.label == "samples: VAE"), "{r}");
    }

    #[test]
    fn a_small_sample_leaves_the_step_binding_and_auto_unchanged() {
        let plain = plan(&within_24(None)).unwrap();
        let r = plan(&within_24(Some(clip(832, 480, 17)))).unwrap();
        assert_eq!(r.binding_phase(), Phase::Step, "{r}");
        assert!(r.sampling.as_ref().unwrap().peak_vram_bytes < r.peak_vram_bytes);
        // Only the VAE and the embeddings the samples keep are added to the step.
        let held: u64 = r
            .breakdown
            .iter()
            .filter(|l| l.label.starts_with("samples:"))
            .map(|l| l.bytes)
            .sum();
        assert!(held > 0);
        assert!(r.blocks_to_swap >= plain.blocks_to_swap);
    }

    #[test]
    fn the_largest_prompt_of_the_file_is_planned() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("prompts.txt");
        std::fs::write(
            &path,
            "small --w 512 --h 512 --f 17 --s 10\nlarge --w 1280 --h 720 --f 81 --s 30 --l 1\n",
        )
        .unwrap();
        let guided = |s: &crate::generate::prompts::PromptSpec| s.clip_guidance() > 1.0;
        let shape = SampleShape::from_prompt_file(&path, |s| s.clip_frames(), guided).unwrap();
        assert_eq!(
            shape,
            SampleShape {
                width: 1280,
                height: 720,
                frames: 81,
                steps: 30,
                guided: true,
                prompts: 2,
            }
        );
        assert!(
            SampleShape::from_prompt_file(&dir.path().join("none.txt"), |_| 1, |_| false).is_err()
        );
    }
}
