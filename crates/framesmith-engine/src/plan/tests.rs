use super::*;
use crate::family::testkit::video_14b;
use framesmith_config::protocol::memory::Suggestion;
use framesmith_config::run::{AutoKeyword, Fp8ScaleMode};
use framesmith_config::training::DEFAULT_GPU_SLOTS;
use framesmith_nn::fp8::Fp8Scale;

pub(crate) const GIB: u64 = 1 << 30;

pub(crate) fn input(model: impl Into<PlanModel>, base: BaseFormat) -> PlanInput {
    PlanInput {
        model: model.into(),
        base,
        compute: base.compute_dtype(),
        residual: ResidualDtype::F32,
        clip: DEFAULT_CLIP,
        lora: LoraShape {
            kind: Default::default(),
            rank: 32,
            include_patterns: Vec::new(),
            exclude_patterns: Vec::new(),
        },
        streaming: StreamingSetup {
            mode: StreamingMode::Pinned,
            blocks_to_swap: BlocksToSwap::Count(0),
            activations: ActivationPlacement::Device,
            gpu_slots: DEFAULT_GPU_SLOTS,
            staging_slots: 2,
        },
        vram_budget_bytes: None,
        free_vram_bytes: None,
        host_ram_bytes: None,
        ram_budget_bytes: None,
        available_ram_bytes: None,
        pinned_budget_bytes: None,
        ranks_on_machine: 1,
        windows: false,
        working_set: WORKING_SET,
        checkpointing: Checkpointing::Blocks,
        optimizer_and_context: true,
        on_cpu: false,
        sampling: None,
        experts: None,
        start_frame: false,
        fp8_products: false,
    }
}

/// The RAM a plan must fit: `memory.ram_budget_gb`, else what the machine can give now, else its RAM; each named
/// as such in the shortfall and the verdict line.
#[test]
fn ram_is_planned_against_the_budget_else_what_the_machine_can_give() {
    let mut i = fp8_14b();
    i.streaming.mode = StreamingMode::Staged;
    i.streaming.blocks_to_swap = BlocksToSwap::Count(20);
    i.streaming.activations = ActivationPlacement::Host;
    i.vram_budget_bytes = Some(80 * GIB);
    i.host_ram_bytes = Some(256 * GIB);
    let roomy = plan(&i).unwrap();
    let need = roomy.peak_ram_bytes;
    assert!(roomy.fits() && need > GIB, "{roomy}");
    assert!(
        roomy.verdict_line().contains(&format!(
            ", RAM {} of {}",
            format_gib(need),
            format_gib(256 * GIB)
        )),
        "{roomy}"
    );

    // What the machine can give now (less than it has) is the limit when no budget is set.
    i.available_ram_bytes = Some(need - 1);
    let busy = plan(&i).unwrap();
    assert!(!busy.fits(), "{busy}");
    let short = busy.ram_shortfall.clone().unwrap();
    assert!(
        short.contains(&format!(
            "this machine can give {} without swapping (256.00 GiB in all",
            format_gib(need - 1)
        )),
        "{short}"
    );
    assert_eq!(busy.ram_budget_bytes, Some(need - 1));

    // A budget wins over what is available, both ways.
    i.ram_budget_bytes = Some(need);
    let budgeted = plan(&i).unwrap();
    assert!(budgeted.fits(), "{budgeted}");
    assert!(budgeted.ram_budget_set);
    i.ram_budget_bytes = Some(need - 1);
    i.available_ram_bytes = Some(200 * GIB);
    let over = plan(&i).unwrap();
    assert!(!over.fits(), "{over}");
    assert!(
        over.ram_shortfall
            .as_deref()
            .is_some_and(|s| s.contains("the RAM budget (memory.ram_budget_gb) is")),
        "{over}"
    );

    // Near the limit is a warning that names the same limit.
    i.ram_budget_bytes = Some(need / 17 * 20);
    let near = plan(&i).unwrap();
    assert!(near.fits(), "{near}");
    assert!(
        near.notes
            .iter()
            .any(|n| n.contains("expect swapping") && n.contains("the RAM budget")),
        "{near}"
    );
}

pub(crate) fn fp8_14b() -> PlanInput {
    input(video_14b(), BaseFormat::Fp8(Fp8ScaleMode::Block64))
}

#[test]
fn config_and_nn_name_the_fp8_scales_alike() {
    assert_eq!(Fp8ScaleMode::NAMES, Fp8Scale::NAMES);
    let modes = [
        Fp8ScaleMode::Tensor,
        Fp8ScaleMode::Channel,
        Fp8ScaleMode::Block64,
    ];
    for (mode, name) in modes.into_iter().zip(Fp8ScaleMode::NAMES) {
        assert_eq!(fp8_scale(mode).as_str(), name);
    }
}

#[test]
fn more_streamed_blocks_use_less_vram_and_more_ram() {
    for mode in [StreamingMode::Pinned, StreamingMode::Staged] {
        let mut prev: Option<PlanReport> = None;
        for n in 0..40 {
            let mut i = fp8_14b();
            i.streaming.mode = mode;
            i.streaming.blocks_to_swap = BlocksToSwap::Count(n);
            let r = plan(&i).unwrap();
            assert_eq!(r.device_bytes(), r.peak_vram_bytes);
            assert_eq!(r.host_bytes(), r.peak_ram_bytes);
            if let Some(p) = &prev {
                assert!(r.peak_vram_bytes <= p.peak_vram_bytes, "{n} blocks");
                assert!(r.peak_ram_bytes > p.peak_ram_bytes, "{n} blocks");
            }
            if n > 2 {
                assert!(r.peak_vram_bytes < prev.as_ref().unwrap().peak_vram_bytes);
            }
            prev = Some(r);
        }
    }
}

#[test]
fn staged_streaming_pins_only_the_ring() {
    let mut i = fp8_14b();
    i.streaming.blocks_to_swap = BlocksToSwap::Count(20);
    let pinned = plan(&i).unwrap();
    i.streaming.mode = StreamingMode::Staged;
    i.streaming.staging_slots = 3;
    let staged = plan(&i).unwrap();
    let block = staged.block_bytes;
    let chunk = framesmith_nn::offload::STAGING_CHUNK_BYTES as u64;
    assert_eq!(pinned.pinned_ram_bytes, 20 * block);
    assert_eq!(staged.pinned_ram_bytes, 3 * chunk);
    assert_eq!(staged.peak_ram_bytes, 20 * block + 3 * chunk);
    assert_eq!(staged.peak_vram_bytes, pinned.peak_vram_bytes);
    i.streaming.activations = ActivationPlacement::Host;
    let host = plan(&i).unwrap();
    let one_input = 32_760 * 5120 * 4;
    // Staged streaming keeps its promise: saved inputs in RAM are pageable; only the weights' ring and the saved
    // inputs' ring (4 × 8 MiB) are page-locked.
    let input_ring = 4 * (8 << 20);
    assert_eq!(host.pinned_ram_bytes, 3 * chunk + input_ring);
    assert_eq!(
        host.peak_ram_bytes,
        20 * block + 3 * chunk + input_ring + 40 * one_input
    );
    i.streaming.mode = StreamingMode::Pinned;
    let pinned_host = plan(&i).unwrap();
    assert_eq!(pinned_host.pinned_ram_bytes, 20 * block + 40 * one_input);
    i.streaming.mode = StreamingMode::Staged;
    // Every saved input leaves the card but the one prefetched back for the next block's backward.
    assert_eq!(
        host.peak_vram_bytes,
        staged.peak_vram_bytes - 40 * one_input + one_input
    );
}

#[test]
fn auto_blocks_picks_the_smallest_count_that_fits() {
    let i = fp8_14b();
    let at = |n| peak_vram_bytes(&i, n).unwrap();
    for n in [0, 7, 39] {
        assert_eq!(auto_blocks(&i, at(n)).unwrap(), Some(n));
    }
    // Streaming no more blocks than there are GPU slots saves nothing, so it is never chosen.
    assert_eq!(at(DEFAULT_GPU_SLOTS), at(0));
    assert_eq!(auto_blocks(&i, at(1)).unwrap(), Some(0));
    assert_eq!(auto_blocks(&i, at(7) - 1).unwrap(), Some(8));
    assert_eq!(auto_blocks(&i, at(39) - 1).unwrap(), None);
    assert_eq!(auto_blocks(&i, u64::MAX).unwrap(), Some(0));
}

#[test]
fn auto_in_the_plan_uses_the_budget_or_free_memory_minus_headroom() {
    let mut i = fp8_14b();
    i.streaming.blocks_to_swap = BlocksToSwap::Auto(AutoKeyword::Auto);
    i.streaming.activations = ActivationPlacement::Host;
    i.working_set = WorkingSet::FUSED_BACKWARD;
    let target = peak_vram_bytes(&i, 12).unwrap();
    i.free_vram_bytes = Some(target + VRAM_HEADROOM_BYTES);
    let r = plan(&i).unwrap();
    // "auto" keeps its margin below the budget: the fewest blocks whose peak leaves it free.
    let margin = auto_margin_bytes(target);
    let n = r.blocks_to_swap;
    assert!(
        n > 12 && r.blocks_chosen && r.verdict == Verdict::Fits,
        "{r:?}"
    );
    assert!(peak_vram_bytes(&i, n).unwrap() <= target - margin);
    assert!(peak_vram_bytes(&i, n - 1).unwrap() > target - margin);
    assert!(r.notes.iter().any(|n| n.contains("leave")), "{r:?}");
    assert_eq!(r.vram_budget_bytes, Some(target));
    // A budget with no count leaving the margin: the fewest that fit at all, with a warning.
    let tight = peak_vram_bytes(&i, 38).unwrap();
    i.free_vram_bytes = Some(tight + VRAM_HEADROOM_BYTES);
    let r = plan(&i).unwrap();
    assert_eq!(r.blocks_to_swap, 38, "{r:?}");
    assert!(r.notes.iter().any(|n| n.contains("may still")), "{r:?}");
    i.free_vram_bytes = Some(target + VRAM_HEADROOM_BYTES);
    // An explicit budget wins over the free memory.
    let budget = peak_vram_bytes(&i, 30).unwrap();
    i.vram_budget_bytes = Some(budget);
    let n = plan(&i).unwrap().blocks_to_swap;
    let room = budget - auto_margin_bytes(budget);
    assert!(n > 30 && peak_vram_bytes(&i, n).unwrap() <= room);
    assert!(peak_vram_bytes(&i, n - 1).unwrap() > room);
    // No budget at all: nothing streamed, and it says so.
    i.vram_budget_bytes = None;
    i.free_vram_bytes = None;
    let r = plan(&i).unwrap();
    assert_eq!((r.blocks_to_swap, r.verdict), (0, Verdict::NoBudget));
    assert!(
        r.notes.iter().any(|n| n.contains("vram_budget_gb")),
        "{r:?}"
    );
}

#[test]
fn suggestions_go_from_cheapest_to_clip_size() {
    let mut i = fp8_14b();
    i.streaming.mode = StreamingMode::Off;
    i.working_set = WorkingSet::FUSED_BACKWARD;
    let mut host = i.clone();
    host.streaming.activations = ActivationPlacement::Host;
    let host_at = |n| peak_vram_bytes(&host, n).unwrap();
    // Fits by streaming alone (activations stay on the GPU).
    i.vram_budget_bytes = Some(peak_vram_bytes(&i, 10).unwrap());
    let r = plan(&i).unwrap();
    assert_eq!(r.verdict, Verdict::DoesNotFit);
    assert_eq!(
        r.suggestions,
        vec![Suggestion::StreamBlocks { blocks_to_swap: 10 }]
    );
    // Needs the activations in RAM as well.
    i.vram_budget_bytes = Some(host_at(20));
    assert_eq!(
        plan(&i).unwrap().suggestions,
        vec![Suggestion::HostActivations { blocks_to_swap: 20 }]
    );
    // A bf16 base streams more (its blocks are twice the size), or needs FP8 when even that is not enough.
    let mut bf16 = i.clone();
    bf16.base = BaseFormat::Dense(FloatDtype::Bf16);
    assert_eq!(
        plan(&bf16).unwrap().suggestions,
        vec![Suggestion::HostActivations { blocks_to_swap: 31 }]
    );
    bf16.vram_budget_bytes = Some(host_at(37));
    assert_eq!(
        plan(&bf16).unwrap().suggestions,
        vec![Suggestion::Fp8Base { blocks_to_swap: 37 }]
    );
    // Nothing at this clip size: a shorter clip, then a lower resolution, then a larger card.
    i.vram_budget_bytes = Some(8 * GIB);
    assert!(matches!(
        plan(&i).unwrap().suggestions[..],
        [Suggestion::FewerFrames { frames }] if frames < 81
    ));
    i.clip.frames = 1;
    let mut one_frame = host.clone();
    one_frame.clip.frames = 1;
    i.vram_budget_bytes = Some(peak_vram_bytes(&one_frame, 39).unwrap() - 1);
    assert!(matches!(
        plan(&i).unwrap().suggestions[..],
        [Suggestion::LowerResolution { width, height }] if width < 832 && height < 480
    ));
    i.vram_budget_bytes = Some(GIB);
    assert_eq!(plan(&i).unwrap().suggestions, vec![Suggestion::LargerCard]);
}

#[test]
fn ram_and_page_locked_memory_the_machine_cannot_hold_do_not_fit() {
    let mut i = fp8_14b();
    i.streaming.blocks_to_swap = BlocksToSwap::Count(39);
    i.streaming.activations = ActivationPlacement::Host;
    i.vram_budget_bytes = Some(24 * GIB);
    i.host_ram_bytes = Some(256 * GIB);
    let roomy = plan(&i).unwrap();
    assert!(roomy.fits() && roomy.notes.is_empty(), "{roomy}");
    let pinned = roomy.pinned_ram_bytes;
    assert!(pinned > GIB && pinned <= roomy.peak_ram_bytes, "{roomy}");

    // Page-locked memory cannot be swapped out: more of it than the RAM does not fit, whatever the VRAM.
    i.host_ram_bytes = Some(pinned - 1);
    let r = plan(&i).unwrap();
    assert_eq!(r.verdict, Verdict::DoesNotFit);
    assert!(
        r.verdict_line()
            .starts_with("Does not fit in RAM: peak VRAM"),
        "{r}"
    );
    assert!(r.suggestions.is_empty(), "the VRAM fits: {r}");
    let short = r.ram_shortfall.clone().unwrap();
    assert!(
        short.contains(&format!("{} of page-locked RAM", format_gib(pinned)))
            && short.contains(&format!("this machine has {}", format_gib(pinned - 1)))
            && short.contains("memory.streaming = \"staged\""),
        "{short}"
    );
    assert_eq!(r.notes, vec![short], "said once, not also as swapping");

    // Windows page-locks about half of RAM.
    i.host_ram_bytes = Some(2 * pinned - 2);
    i.windows = true;
    let r = plan(&i).unwrap();
    assert!(!r.fits(), "{r}");
    assert!(
        r.ram_shortfall
            .as_deref()
            .is_some_and(|s| s.contains("Windows allows about half of RAM")),
        "{r}"
    );

    // Staged streaming page-locks only its ring; RAM past the machine's still does not fit, near it is a warning.
    i.windows = false;
    i.streaming.mode = StreamingMode::Staged;
    i.host_ram_bytes = Some(256 * GIB);
    let staged = plan(&i).unwrap();
    assert!(staged.pinned_ram_bytes < GIB, "{staged}");
    i.host_ram_bytes = Some(staged.peak_ram_bytes - 1);
    let r = plan(&i).unwrap();
    assert!(!r.fits(), "{r}");
    assert!(
        r.ram_shortfall.as_deref().is_some_and(
            |s| s.contains("of RAM and this machine has") && !s.contains("page-locked")
        ),
        "{r}"
    );
    i.host_ram_bytes = Some(staged.peak_ram_bytes / 17 * 20);
    let near = plan(&i).unwrap();
    assert!(near.fits(), "{near}");
    assert!(
        near.notes.iter().any(|n| n.contains("expect swapping")),
        "{near}"
    );

    // A CPU run's verdict is already against the RAM.
    i.on_cpu = true;
    i.host_ram_bytes = Some(GIB);
    let cpu = plan(&i).unwrap();
    assert!(!cpu.fits() && cpu.ram_shortfall.is_none(), "{cpu}");
}

#[test]
fn absurd_sizes_are_refused_and_the_largest_plan_without_overflow() {
    let mut i = fp8_14b();
    i.clip = ClipShape {
        width: 100_000,
        height: 100_000,
        frames: 100_001,
        batch: 1,
    };
    assert!(matches!(
        plan(&i),
        Err(PlanError::ResolutionTooLarge { .. })
    ));
    i.clip = ClipShape {
        frames: 100_001,
        ..DEFAULT_CLIP
    };
    assert!(matches!(plan(&i), Err(PlanError::TooManyFrames { .. })));
    i.clip = ClipShape {
        batch: usize::MAX,
        ..DEFAULT_CLIP
    };
    assert!(matches!(plan(&i), Err(PlanError::TooManyTokens { .. })));
    i.clip = DEFAULT_CLIP;
    for rank in [5121, 100_000, usize::MAX] {
        i.lora.rank = rank;
        let err = plan(&i).unwrap_err();
        assert!(
            matches!(
                err,
                PlanError::Lora(LoraError::RankTooLarge { max: 5120, .. })
            ),
            "{err}"
        );
    }
    // The largest clip, rank and every kept tape: a plan (a very large one), not an overflow.
    i.lora.rank = 5120;
    i.clip = ClipShape {
        width: MAX_SIDE_PIXELS,
        height: MAX_SIDE_PIXELS,
        frames: MAX_FRAMES,
        batch: 1,
    };
    i.checkpointing = Checkpointing::Off;
    i.streaming.activations = ActivationPlacement::Host;
    i.vram_budget_bytes = Some(24 * GIB);
    i.host_ram_bytes = Some(64 * GIB);
    let r = plan(&i).unwrap();
    assert_eq!(r.tokens, MAX_STEP_TOKENS);
    assert!(
        !r.fits() && r.peak_vram_bytes > 1 << 40,
        "{}",
        r.verdict_line()
    );
}

#[test]
fn ranks_on_one_machine_share_its_ram() {
    let mut i = fp8_14b();
    i.streaming.blocks_to_swap = BlocksToSwap::Count(30);
    i.streaming.activations = ActivationPlacement::Host;
    let one = plan(&i).unwrap();
    // RAM that holds one rank's streamed blocks and saved inputs with room to spare, but not four ranks'.
    let ram = one.peak_ram_bytes * 2;
    i.host_ram_bytes = Some(ram);
    let one = plan(&i).unwrap();
    assert!(one.notes.is_empty(), "{:?}", one.notes);
    assert_eq!(one.ranks_on_machine, 1);
    assert_eq!(one.machine_ram_bytes(), one.peak_ram_bytes);

    i.ranks_on_machine = 2;
    let two = plan(&i).unwrap();
    // Each rank's own plan (VRAM against its own GPU) is unchanged; the machine needs both ranks' RAM.
    assert_eq!(two.peak_vram_bytes, one.peak_vram_bytes);
    assert_eq!(two.peak_ram_bytes, one.peak_ram_bytes);
    assert_eq!(two.machine_ram_bytes(), 2 * one.peak_ram_bytes);
    assert!(
        two.verdict_line().contains("per GPU (2 GPUs)"),
        "{}",
        two.verdict_line()
    );
    assert!(two.to_string().contains("2 ranks on this machine"), "{two}");

    i.ranks_on_machine = 4;
    let four = plan(&i).unwrap();
    // Four ranks need more RAM than the machine has (page-locked, here): the plan does not fit.
    assert!(!four.fits(), "{four}");
    let note = four.ram_shortfall.clone().unwrap_or_default();
    assert!(four.notes.contains(&note), "{:?}", four.notes);
    assert!(
        note.contains(&format!("(4 ranks × {})", format_gib(one.pinned_ram_bytes))),
        "{note}"
    );
    assert!(
        note.contains(&format_gib(ram)),
        "names the machine's RAM: {note}"
    );
    assert!(
        note.contains(&format_gib(4 * one.pinned_ram_bytes)),
        "{note}"
    );
    assert!(
        note.contains("fewer GPUs")
            && note.contains("fewer streamed blocks")
            && note.contains("activations on the GPU"),
        "{note}"
    );

    // Windows' page-locked cap counts every rank's pinned blocks too.
    i.windows = true;
    i.host_ram_bytes = Some(one.pinned_ram_bytes * 3);
    i.ranks_on_machine = 1;
    assert!(!plan(&i).unwrap().notes.iter().any(|n| n.contains("staged")));
    i.ranks_on_machine = 2;
    let pinned = plan(&i).unwrap();
    assert!(
        pinned
            .notes
            .iter()
            .any(|n| n.contains("staged") && n.contains("2 ranks")),
        "{:?}",
        pinned.notes
    );
}

#[test]
fn impossible_inputs_are_errors() {
    let mut i = fp8_14b();
    i.clip.width = 840;
    assert!(matches!(
        plan(&i),
        Err(PlanError::Resolution { multiple: 16, .. })
    ));
    let mut i = fp8_14b();
    i.clip.frames = 80;
    assert!(matches!(plan(&i), Err(PlanError::Frames { step: 4, .. })));
    let mut i = fp8_14b();
    i.streaming.blocks_to_swap = BlocksToSwap::Count(40);
    assert!(matches!(plan(&i), Err(PlanError::TooManyBlocks { .. })));
    i.streaming.mode = StreamingMode::Off;
    i.streaming.blocks_to_swap = BlocksToSwap::Count(3);
    assert!(matches!(plan(&i), Err(PlanError::StreamingOff(3))));
    let mut i = fp8_14b();
    i.lora.rank = 0;
    assert!(plan(&i).is_err());
    let mut i = fp8_14b();
    i.lora.include_patterns = vec!["(".into()];
    assert!(matches!(plan(&i), Err(PlanError::Lora(_))));
}

#[test]
fn presets_plan_as_issue_7_wires_them() {
    use framesmith_config::presets::builtin;
    use framesmith_config::RunConfig;
    let mut base = RunConfig::default();
    base.model.variant = "t2v-14b".into();
    let planned = |name: &str, budget_gb: f64| {
        let mut base = base.clone();
        base.memory.vram_budget_gb = Some(budget_gb);
        let cfg = builtin(name).unwrap().apply(&base).unwrap().config;
        let model = model_for_config(&cfg).unwrap();
        let (clip, _) = clip_for_config(&cfg);
        let mut i = PlanInput::from_config(&cfg, model, clip);
        i.working_set = WorkingSet::FUSED_BACKWARD;
        plan(&i).unwrap()
    };
    let compatible = planned("e7adb86-compatible", 24.0);
    assert!(compatible.blocks_chosen && compatible.blocks_to_swap > 0);
    assert!(compatible.model.contains("fp8 tensor"));
    // Pinned: every streamed block is page-locked.
    assert_eq!(
        compatible.pinned_ram_bytes,
        compatible.blocks_to_swap as u64 * compatible.block_bytes
    );
    let low = planned("low-vram-windows", 12.0);
    assert!(low.blocks_chosen && low.blocks_to_swap > 0);
    assert!(
        low.workload.starts_with("832x480, 33 frames"),
        "{}",
        low.workload
    );
    let ring = low
        .breakdown
        .iter()
        .find(|l| l.label.starts_with("pinned staging ring (4 × 8.0 MiB)"))
        .expect("a staging ring");
    assert_eq!(ring.placement, Placement::HostPinned);
    assert!(low
        .breakdown
        .iter()
        .any(|l| l.label.starts_with("saved block inputs") && l.placement.is_host()));
    // The preset's promise: the weights' ring and the saved inputs' ring are all the page-locked memory (saved
    // inputs in RAM are pageable).
    assert_eq!(low.pinned_ram_bytes, 2 * 4 * (8 << 20));
    // Issue #7's headline: balanced-24gb trains 14B at 480p × 81 frames on a 24 GB card.
    let balanced = planned("balanced-24gb", 24.0);
    assert!(
        balanced.workload.starts_with("832x480, 81 frames"),
        "{}",
        balanced.workload
    );
    assert_eq!(balanced.verdict, Verdict::Fits, "{balanced}");
    assert!(balanced.blocks_chosen && balanced.blocks_to_swap > 0);
    // fast-24gb: the same on 24 GB, the kept attention page-locked beside the saved inputs (a block or two more
    // streamed for the two blocks' worth on the card).
    let fast = planned("fast-24gb", 24.0);
    assert_eq!(fast.verdict, Verdict::Fits, "{fast}");
    assert!(fast.blocks_to_swap > balanced.blocks_to_swap);
    let kept = fast
        .breakdown
        .iter()
        .find(|l| l.label.starts_with("kept self-attention outputs ("))
        .expect("kept attention");
    assert_eq!(kept.placement, Placement::HostPinned);
    assert!(fast.pinned_ram_bytes > balanced.pinned_ram_bytes + kept.bytes);
    let full = planned("full-speed-80gb", 80.0);
    assert_eq!((full.blocks_to_swap, full.pinned_ram_bytes), (0, 0));
    assert!(full.model.contains("bf16"));
}

/// The 16 GB presets fit a 14B video model in FP8 at 480×832×81 on a 16 GB card within the RAM budgets they set (the RAM
/// their names say, less what an OS and the app keep), on Linux and on Windows (page-locked memory within half of
/// the machine's RAM), the planner choosing the placements; 64 GB's preset in 28 GiB does not fit, and says so.
#[test]
fn the_16gb_presets_fit_the_card_and_the_ram_they_name() {
    use framesmith_config::presets::builtin;
    use framesmith_config::RunConfig;
    let planned = |name: &str, machine_gib: u64, windows: bool| {
        let mut base = RunConfig::default();
        base.model.variant = "t2v-14b".into();
        base.memory.vram_budget_gb = Some(16.0);
        let cfg = builtin(name).unwrap().apply(&base).unwrap().config;
        let model = model_for_config(&cfg).unwrap();
        let (mut clip, _) = clip_for_config(&cfg);
        clip.frames = 81;
        let mut i = PlanInput::from_config(&cfg, model, clip);
        i.host_ram_bytes = Some(machine_gib * GIB);
        i.windows = windows;
        plan(&i).unwrap()
    };
    for (name, machine, budget) in [("16gb-32gb-ram", 32, 28), ("16gb-64gb-ram", 64, 60)] {
        for windows in [false, true] {
            let r = planned(name, machine, windows);
            assert!(r.fits() && r.blocks_chosen, "{name}: {r}");
            assert_eq!(r.ram_budget_bytes, Some(budget * GIB), "{name}");
            assert!(r.peak_ram_bytes <= budget * GIB, "{name}: {r}");
            assert!(r.peak_vram_bytes <= 16 * GIB, "{name}: {r}");
            if windows {
                assert!(r.pinned_ram_bytes <= machine * GIB / 2, "{name}: {r}");
            }
            let chosen = &r.placements.as_ref().unwrap().chosen;
            assert_eq!(
                chosen.len(),
                3,
                "{name}: every placement is the planner's: {r}"
            );
            assert!(r.to_string().contains("Fits: peak VRAM"), "{r}");
        }
    }
    let mut base = RunConfig::default();
    base.model.variant = "t2v-14b".into();
    base.memory.vram_budget_gb = Some(16.0);
    let mut cfg = builtin("16gb-64gb-ram")
        .unwrap()
        .apply(&base)
        .unwrap()
        .config;
    cfg.memory.ram_budget_gb = Some(28.0);
    let i = PlanInput::from_config(&cfg, model_for_config(&cfg).unwrap(), DEFAULT_CLIP);
    let too_long = plan(&i).unwrap();
    assert!(too_long.ram_shortfall.is_some(), "{too_long}");
    assert_eq!(
        too_long.binding_limit,
        Some(framesmith_config::protocol::memory::Limit::Ram)
    );
}

#[test]
fn the_clip_comes_from_the_dataset_config_then_the_overrides() {
    use framesmith_config::RunConfig;
    let dir = tempfile::tempdir().unwrap();
    let dataset = dir.path().join("dataset.toml");
    std::fs::write(
        &dataset,
        r#"
[general]
caption_extension = ".txt"


[[datasets]]
image_directory = "images"
resolution = [960, 544]
batch_size = 4


[[datasets]]
video_directory = "videos"
resolution = [832, 480]
target_frames = [17, 33]
batch_size = 2
"#,
    )
    .unwrap();
    let mut cfg = RunConfig::default();
    cfg.dataset.config = dataset;
    let (clip, note) = clip_for_config(&cfg);
    // The video dataset moves more pixels per step than the images.
    assert_eq!(
        clip,
        ClipShape {
            width: 832,
            height: 480,
            frames: 33,
            batch: 2
        }
    );
    assert_eq!(note, None);
    cfg.dataset.resolution = Some([512, 512]);
    cfg.dataset.target_frames = Some(vec![49, 9]);
    let (clip, _) = clip_for_config(&cfg);
    assert_eq!(
        (clip.width, clip.height, clip.frames, clip.batch),
        (512, 512, 49, 2)
    );
    // Nothing known: the assumed clip, said so.
    let (clip, note) = clip_for_config(&RunConfig::default());
    assert_eq!(clip, DEFAULT_CLIP);
    assert!(note.unwrap().contains("assumed"));
}

#[test]
fn a_validated_run_plans_like_its_config() {
    use framesmith_config::plan::HostInfo;
    use framesmith_config::{validate, RunConfig};
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = RunConfig::default();
    for (path, name) in [
        (&mut cfg.model.dit, "dit.safetensors"),
        (&mut cfg.dataset.config, "d.toml"),
    ] {
        *path = dir.path().join(name);
        std::fs::write(&*path, b"").unwrap();
    }
    cfg.model.variant = "t2v-14b".into();
    cfg.model.base_dtype = framesmith_config::run::BaseDtype::Fp8;
    cfg.memory.streaming = StreamingMode::Staged;
    cfg.memory.blocks_to_swap = BlocksToSwap::Count(20);
    cfg.memory.staging_slots = 3;
    cfg.memory.vram_budget_gb = Some(30.0);
    let run = validate(&cfg, &HostInfo::new(1)).unwrap();
    let model = video_14b();
    let from_run = PlanInput::from_run_plan(&run, model.clone(), DEFAULT_CLIP);
    let from_cfg = PlanInput::from_config(&cfg, model, DEFAULT_CLIP);
    assert_eq!(from_run, from_cfg);
    assert_eq!(from_run.base, BaseFormat::Fp8(Fp8ScaleMode::Block64));
    assert_eq!(from_run.vram_budget_bytes, Some(30 * GIB));
    let report = plan(&from_run).unwrap();
    assert_eq!((report.blocks_to_swap, report.blocks_chosen), (20, false));
}

/// With the saved inputs in RAM, the kept attention goes there too: two blocks' worth stay on the card (the one
/// brought back ahead, and the last block's, which never leaves), the rest is page-locked RAM (pageable with
/// `staged` streaming, plus a ring of its own).
#[test]
fn kept_attention_waits_in_ram_with_the_saved_inputs() {
    let per_block = 32_760 * 5120 * 2 + 32_760 * 40 * 4;
    let mut i = fp8_14b();
    i.streaming.mode = StreamingMode::Pinned;
    i.streaming.blocks_to_swap = BlocksToSwap::Count(20);
    i.streaming.activations = ActivationPlacement::Host;
    let blocks = plan(&i).unwrap();
    i.checkpointing = Checkpointing::Attention;
    let attention = plan(&i).unwrap();
    assert_eq!(
        attention.peak_vram_bytes - blocks.peak_vram_bytes,
        2 * per_block
    );
    assert_eq!(
        attention.pinned_ram_bytes - blocks.pinned_ram_bytes,
        40 * per_block
    );
    i.streaming.mode = StreamingMode::Staged;
    let staged = plan(&i).unwrap();
    i.checkpointing = Checkpointing::Blocks;
    let staged_blocks = plan(&i).unwrap();
    let ring = 4 * (8 << 20);
    assert_eq!(
        staged.pinned_ram_bytes - staged_blocks.pinned_ram_bytes,
        ring
    );
    assert_eq!(
        staged.peak_ram_bytes - staged_blocks.peak_ram_bytes,
        40 * per_block + ring
    );
}

/// A budget the card cannot give now (other processes hold most of it) is said, with what is free and what to do;
/// a card with room, or a run without an explicit budget (planned against the free memory), says nothing.
#[test]
fn a_gpu_other_processes_hold_is_named_in_the_plan() {
    let mut i = fp8_14b();
    i.streaming.mode = StreamingMode::Pinned;
    i.streaming.blocks_to_swap = BlocksToSwap::Count(20);
    i.streaming.activations = ActivationPlacement::Host;
    i.vram_budget_bytes = Some(24 * GIB);
    i.free_vram_bytes = Some(10 * GIB);
    let busy = plan(&i).unwrap();
    let note = busy.busy_gpu.clone().expect("a busy GPU is named");
    assert!(
        note.contains("10.00 GiB free") && note.contains("vram_budget_gb"),
        "{note}"
    );
    assert!(busy.notes.contains(&note));
    i.free_vram_bytes = Some(80 * GIB);
    assert_eq!(plan(&i).unwrap().busy_gpu, None);
    i.vram_budget_bytes = None;
    i.free_vram_bytes = Some(10 * GIB);
    assert_eq!(plan(&i).unwrap().busy_gpu, None);
}

/// The plan's line for a block's recompute + backward working set, in bytes.
pub(crate) fn working_set_line(input: &PlanInput) -> u64 {
    plan(input)
        .unwrap()
        .breakdown
        .iter()
        .find(|l| l.label.starts_with("block recompute"))
        .map(|l| l.bytes)
        .unwrap()
}

/// Each adapter kind's plan holds its own parameters (weights, gradients and AdamW's two moments: 16 bytes each,
/// counted per linear by `AdapterKind::parameter_count`) and its working memory (one widest linear's update,
/// factored terms or DoRA's output-sized product; DoRA's kept outputs are the block's own), and differs from
/// plain LoRA's by exactly that.
#[test]
fn each_adapter_kind_plans_its_parameters_moments_and_working_memory() {
    let lora = plan(&fp8_14b()).unwrap();
    let lokr = AdapterKind::Lokr {
        factor: -1,
        decompose_both: false,
        full_matrix: false,
    };
    // A 14B block's adapted linears ([in, out]): q, k, v, o of both attentions and the FFN's two.
    let linears: Vec<[usize; 2]> = [[5120, 5120]; 8]
        .into_iter()
        .chain([[5120, 13824], [13824, 5120]])
        .collect();
    let params = |k: AdapterKind| {
        40 * linears
            .iter()
            .map(|&d| k.parameter_count(d, 32))
            .sum::<u64>()
    };
    for kind in [lokr, AdapterKind::Loha, AdapterKind::Dora] {
        let mut i = fp8_14b();
        i.lora.kind = kind;
        let r = plan(&i).unwrap();
        let s = sizes(&i).unwrap();
        let (tokens, compute) = (s.shape.tokens, s.shape.compute_bytes);
        let work = kind.work_bytes([5120, 13824], 32, tokens as usize, compute);
        let line = |what: &str| {
            r.breakdown
                .iter()
                .find(|l| l.label.starts_with(&format!("{} {what}", kind.name())))
                .map(|l| l.bytes)
        };
        assert_eq!(line("weights"), Some(4 * params(kind)), "{kind:?}");
        assert_eq!(line("gradients"), Some(4 * params(kind)), "{kind:?}");
        assert_eq!(line("working memory"), Some(work), "{kind:?}");
        let more = 16 * (params(kind) as i64 - params(AdapterKind::Lora) as i64) + work as i64;
        assert_eq!(
            r.peak_vram_bytes as i64 - lora.peak_vram_bytes as i64,
            more,
            "{kind:?}"
        );
    }
}
