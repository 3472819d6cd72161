//! What the families' plan tests share, each check parametrised by what differs: a plan input as `framesmith plan
//! --variant` makes it, blocks that hold every weight, auto streaming within smaller budgets, streamed blocks that
//! spread, and presets that fit their cards.

use crate::plan::{plan, ClipShape, ModelMemory, PlanInput};
use framesmith_config::protocol::memory::PlanReport;
use framesmith_config::run::{
    ActivationPlacement, AutoKeyword, BaseDtype, BlocksToSwap, StreamingMode,
};
use framesmith_config::{ModelFamily, RunConfig};

use crate::family::image::plan::spread_streamed_blocks;

/// A GiB.
pub(crate) const GIB: u64 = 1 << 30;

/// The model `variant` with a rank-`rank` LoRA and `base` weights at `clip`, planned as `framesmith plan --variant`
/// does.
pub(crate) fn variant_input(
    variant: &str,
    rank: usize,
    base: BaseDtype,
    clip: ClipShape,
) -> anyhow::Result<PlanInput> {
    let mut cfg = RunConfig::default();
    cfg.model.variant = variant.into();
    cfg.model.base_dtype = base;
    cfg.lora.rank = rank;
    let model = crate::plan::model_for_config(&cfg)?;
    Ok(PlanInput::from_config(&cfg, model, clip))
}

/// The description `s` of a DiT whose tensors are `shapes`: `n` blocks of one kind whose f32 bytes with the
/// resident weights' make 4 bytes a parameter. Returns the parameter count.
pub(crate) fn assert_blocks_hold_every_weight(
    s: &ModelMemory,
    n: usize,
    shapes: &[(String, Vec<usize>)],
) -> u64 {
    assert_eq!(s.num_blocks(), n);
    assert_eq!(s.kind_counts(), [n]);
    let params: u64 = shapes
        .iter()
        .map(|(_, shape)| shape.iter().map(|&n| n as u64).product::<u64>())
        .sum();
    let resident: u64 = s.resident.iter().map(|(_, b)| b).sum();
    assert_eq!(n as u64 * s.kinds[0].data_bytes + resident, 4 * params);
    params
}

/// Auto streaming (pinned, activations on the host) of the input `input` makes, within each budget of
/// `budgets_gib` (largest first): a plan that fits with its blocks chosen, under the budget, streaming no fewer
/// blocks than in the budget before (`strictly`: more). Returns the plans.
pub(crate) fn assert_auto_streams_within(
    input: impl Fn() -> PlanInput,
    budgets_gib: &[u64],
    strictly: bool,
) -> Vec<PlanReport> {
    let mut last = 0;
    let mut reports = Vec::new();
    for &budget_gib in budgets_gib {
        let mut i = input();
        i.streaming.mode = StreamingMode::Pinned;
        i.streaming.blocks_to_swap = BlocksToSwap::Auto(AutoKeyword::Auto);
        i.streaming.activations = ActivationPlacement::Host;
        i.vram_budget_bytes = Some(budget_gib * GIB);
        let r = plan(&i).unwrap_or_else(|e| panic!("{budget_gib} GiB: {e}"));
        assert!(
            r.fits() && r.blocks_chosen,
            "{budget_gib} GiB: {}",
            r.verdict_line()
        );
        assert!(r.peak_vram_bytes <= budget_gib * GIB);
        assert!(
            r.blocks_to_swap > last || !strictly && r.blocks_to_swap == last,
            "{budget_gib} GiB streams {}",
            r.blocks_to_swap
        );
        last = r.blocks_to_swap;
        reports.push(r);
    }
    reports
}

/// The blocks a DiT of `n` blocks streams: none for 0; for 10, ten spread from the first tenth to past
/// `tenth_after`; for 100, every block but one.
pub(crate) fn assert_streamed_blocks_spread(n: usize, tenth_after: usize) {
    assert!(spread_streamed_blocks(n, 0).is_empty());
    let ten = spread_streamed_blocks(n, 10);
    assert_eq!(ten.len(), 10);
    assert!(ten[0] < 10 && ten[9] > tenth_after, "{ten:?}");
    assert_eq!(spread_streamed_blocks(n, 100).len(), n - 1);
}

/// Each of `presets` (name, card GiB) is `family`'s; planned as `framesmith plan --variant {variant} --preset …`
/// does, it reads `clip` (width, height and, when given, frames) and fits its card. Returns the plans.
pub(crate) fn assert_presets_fit(
    presets: &[(&str, u64)],
    (family, variant): (ModelFamily, &str),
    (width, height, frames): (usize, usize, Option<usize>),
) -> Vec<PlanReport> {
    let mut reports = Vec::new();
    for &(name, gib) in presets {
        let preset = framesmith_config::presets::builtin(name).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(preset.family, Some(family), "{name}");
        let mut cfg = preset
            .apply(&RunConfig::default())
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .config;
        cfg.model.variant = variant.into();
        let model = crate::plan::model_for_config(&cfg).unwrap_or_else(|e| panic!("{name}: {e}"));
        let (clip, _) = crate::plan::clip_for_config(&cfg);
        assert_eq!((clip.width, clip.height), (width, height), "{name}");
        if let Some(frames) = frames {
            assert_eq!(clip.frames, frames, "{name}");
        }
        let mut i = PlanInput::from_config(&cfg, model, clip);
        i.free_vram_bytes = Some(gib * GIB);
        let r = plan(&i).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(r.fits(), "{name}: {}", r.verdict_line());
        reports.push(r);
    }
    reports
}
