//! Peak activation memory of the checkpointed step grows by one saved block input per block, not by a block's
//! whole graph, and each checkpointing setting keeps what the memory planner counts for it: measured with a
//! counting global allocator (CPU tensors live on the heap).
#![allow(clippy::expect_used, clippy::unwrap_used)]
// test code: a failed expectation is the test failing
// A global allocator is an unsafe trait; this one only forwards to the system allocator and counts bytes.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use candle_core::{DType, Device, Tensor, Var};
use framesmith_engine::family::wan::whole_graph::whole_graph_step;
use framesmith_engine::train::step::{checkpointed_step, LossTarget, StepOptions};
use framesmith_models::wan::random::{random_inputs, random_weights};
use framesmith_models::wan::{WanConfig, WanModel};
use framesmith_nn::lora::Lora;
use framesmith_nn::vb::Vb;
use rand::rngs::StdRng;
use rand::SeedableRng;

struct Counting;
static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
/// The counters are process-wide: tests that measure take turns.
static MEASURING: std::sync::Mutex<()> = std::sync::Mutex::new(());

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let now = CURRENT.fetch_add(layout.size(), Ordering::SeqCst) + layout.size();
        PEAK.fetch_max(now, Ordering::SeqCst);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        CURRENT.fetch_sub(layout.size(), Ordering::SeqCst);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The step to measure: checkpointed with a checkpointing setting, or the whole-graph baseline.
#[derive(Clone, Copy)]
enum Step {
    Checkpointed {
        keep_attention: bool,
        keep_tapes: bool,
    },
    WholeGraph,
}

const CKPT: Step = Step::Checkpointed {
    keep_attention: false,
    keep_tapes: false,
};
const KEEP_ATTENTION: Step = Step::Checkpointed {
    keep_attention: true,
    keep_tapes: false,
};
const KEEP_TAPES: Step = Step::Checkpointed {
    keep_attention: false,
    keep_tapes: true,
};
const WHOLE: Step = Step::WholeGraph;

impl Step {
    /// One step's loss.
    fn run(
        self,
        m: &WanModel,
        i: &framesmith_models::wan::WanInputs,
        t: &LossTarget,
        v: &[Var],
    ) -> candle_core::Result<f32> {
        match self {
            Step::Checkpointed {
                keep_attention,
                keep_tapes,
            } => {
                let options = StepOptions {
                    keep_attention,
                    keep_tapes,
                    ..Default::default()
                };
                checkpointed_step(m, i, t, v, &options).map(|o| o.loss)
            }
            Step::WholeGraph => whole_graph_step(m, i, t, v).map(|o| o.loss),
        }
    }
}

/// Peak bytes allocated during one step above what was allocated before it.
fn step_peak(layers: usize, step: Step) -> candle_core::Result<usize> {
    let dev = Device::Cpu;
    let cfg = WanConfig::tiny(layers);
    let vb = Vb::from_tensors(random_weights(&cfg, 1, DType::F32, &dev)?, DType::F32, &dev);
    let mut model = WanModel::new(&cfg, vb, &Default::default())?;
    let mut vars = Vec::new();
    let rng = &mut StdRng::seed_from_u64(3);
    for (_, linear) in model.linears_mut() {
        let lora = Lora::new(
            [linear.in_dim(), linear.out_dim(), 4],
            4.0,
            DType::F32,
            &dev,
            rng,
        )?;
        vars.push(lora.down.clone());
        vars.push(lora.up.clone());
        linear.set_lora(Some(lora));
    }
    let inputs = random_inputs(&cfg, &[[4, 16, 16]], 2, &dev)?;
    let targets = vec![Tensor::zeros((16, 4, 16, 16), DType::F32, &dev)?];
    let target = LossTarget {
        targets: &targets,
        weights: None,
        skip_frames: 0,
    };
    let base = CURRENT.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    step.run(&model, &inputs, &target, &vars)?;
    Ok(PEAK.load(Ordering::SeqCst) - base)
}

#[test]
fn checkpointed_step_memory_grows_by_saved_block_inputs() -> candle_core::Result<()> {
    let _turn = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    // The first step in a process also allocates one-time state (thread pools, lazily built tables).
    step_peak(2, CKPT)?;
    step_peak(2, WHOLE)?;
    let tokens = 4 * 8 * 8;
    let block_input_bytes = tokens * 64 * 4;
    let ckpt_growth = step_peak(8, CKPT)?.saturating_sub(step_peak(2, CKPT)?);
    let whole_growth = step_peak(8, WHOLE)?.saturating_sub(step_peak(2, WHOLE)?);
    eprintln!(
        "6 extra blocks: checkpointed +{ckpt_growth} B, whole graph +{whole_growth} B, saved inputs {} B",
        6 * block_input_bytes
    );
    // Six more saved inputs, plus small per-block LoRA gradients; nowhere near six block graphs.
    assert!(
        ckpt_growth * 2 <= 6 * block_input_bytes * 3,
        "checkpointed step grew by {ckpt_growth} B"
    );
    assert!(
        whole_growth >= 4 * ckpt_growth,
        "the whole-graph baseline should grow far more ({whole_growth} B)"
    );
    Ok(())
}

#[test]
fn each_checkpointing_setting_keeps_what_the_planner_counts() -> candle_core::Result<()> {
    let _turn = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    use framesmith_engine::family::wan::plan::{block_tape_bytes, kept_attention_bytes};
    use framesmith_engine::plan::StepShape;
    for step in [CKPT, KEEP_ATTENTION, KEEP_TAPES] {
        step_peak(2, step)?;
    }
    let growth = |step: Step| -> candle_core::Result<f64> {
        Ok(step_peak(8, step)?.saturating_sub(step_peak(2, step)?) as f64 / 6.0)
    };
    let blocks = growth(CKPT)?;
    let attention = growth(KEEP_ATTENTION)? - blocks;
    // The tape holds the block input, which per-block checkpointing saves as well.
    let tokens = 4 * 8 * 8;
    let tape = growth(KEEP_TAPES)? - blocks + (tokens * 64 * 4) as f64;
    let cfg = WanConfig::tiny(8);
    let shape = StepShape {
        tokens: tokens as u64,
        compute_bytes: 4,
        residual_bytes: 4,
        dequantised_weight_bytes: 0,
        quantised_input_bytes: 0,
        per_token_time: false,
    };
    let planned_attention = kept_attention_bytes(&cfg, &shape) as f64;
    let planned_tape = block_tape_bytes(&cfg, 1, 4, &shape) as f64;
    eprintln!(
        "per block: kept attention {attention} B (planned {planned_attention}), tape {tape} B (planned {planned_tape})"
    );
    assert!(
        (attention / planned_attention - 1.0).abs() < 0.05,
        "kept attention {attention} B per block, planned {planned_attention}"
    );
    assert!(
        (tape / planned_tape - 1.0).abs() < 0.05,
        "tape {tape} B per block, planned {planned_tape}"
    );
    Ok(())
}
