use crate::plan::tests::{fp8_14b, GIB};
use crate::plan::{plan, PlanInput};
use framesmith_config::protocol::memory::{Limit, Placement, PlanReport, Verdict};
use framesmith_config::run::{
    ActivationPlacement, AutoKeyword, BlocksToSwap, Checkpointing, StreamingMode,
};

/// A 14B video model in FP8 at 480×832×81 on a card of `vram_gib` with a RAM budget of `ram_gib`, every placement left
/// to the planner but the checkpointing (`checkpointing`).
fn auto_14b(vram_gib: u64, ram_gib: u64, checkpointing: Checkpointing) -> PlanInput {
    let mut i = fp8_14b();
    i.streaming.mode = StreamingMode::Auto;
    i.streaming.activations = ActivationPlacement::Auto;
    i.streaming.blocks_to_swap = BlocksToSwap::Auto(AutoKeyword::Auto);
    i.streaming.staging_slots = 4;
    i.checkpointing = checkpointing;
    i.vram_budget_bytes = Some(vram_gib * GIB);
    i.ram_budget_bytes = Some(ram_gib * GIB);
    i.host_ram_bytes = Some(512 * GIB);
    i
}

fn placements(r: &PlanReport) -> (StreamingMode, Placement, Checkpointing) {
    let p = r.placements.as_ref().expect("a GPU plan has placements");
    (p.streaming, p.saved, p.checkpointing)
}

/// Within every limit it names (`auto` never picks a plan that swaps).
fn assert_within(r: &PlanReport) {
    assert_eq!(r.verdict, Verdict::Fits, "{r}");
    assert!(r.peak_vram_bytes <= r.vram_budget_bytes.unwrap(), "{r}");
    assert!(r.peak_ram_bytes <= r.ram_budget_bytes.unwrap(), "{r}");
    assert!(r.pinned_ram_bytes <= r.pinned_budget_bytes.unwrap(), "{r}");
}

/// Generous RAM: everything that moves is page-locked (the fastest copies), and the VRAM is what binds (it
/// set how many blocks stream).
#[test]
fn generous_ram_keeps_page_locked_placements() {
    let r = plan(&auto_14b(24, 256, Checkpointing::Blocks)).unwrap();
    assert_within(&r);
    assert_eq!(
        placements(&r),
        (
            StreamingMode::Pinned,
            Placement::HostPinned,
            Checkpointing::Blocks
        ),
        "{r}"
    );
    assert_eq!(r.binding_limit, Some(Limit::Vram), "{r}");
    let p = r.placements.as_ref().unwrap();
    assert_eq!(p.chosen, ["memory.streaming", "memory.activations"]);
    assert!(
        r.to_string().contains(
            "placements: blocks streamed from page-locked RAM, saved inputs in \
             page-locked RAM, checkpointing blocks (chosen: memory.streaming, memory.activations)"
        ),
        "{r}"
    );
    assert!(
        r.to_string()
            .contains("VRAM binds (a faster plan needs more)"),
        "{r}"
    );
}

/// A tight page-locked budget: what does not fit page-locked moves to pageable RAM (the saved inputs, or the
/// streamed blocks through the staging ring), and the page-locked RAM is what binds. RAM too tight for any
/// placement is a refusal that names the RAM, never a plan past it.
#[test]
fn tight_memory_moves_to_pageable_ram_then_refuses() {
    let roomy = plan(&auto_14b(24, 256, Checkpointing::Blocks)).unwrap();
    let mut i = auto_14b(24, 256, Checkpointing::Blocks);
    i.pinned_budget_bytes = Some(roomy.pinned_ram_bytes - 2 * GIB);
    let r = plan(&i).unwrap();
    assert_within(&r);
    let (streaming, saved, _) = placements(&r);
    assert!(
        streaming == StreamingMode::Staged || saved == Placement::Host,
        "{r}"
    );
    assert_eq!(r.binding_limit, Some(Limit::PinnedRam), "{r}");
    assert!(r.to_string().contains("page-locked RAM binds"), "{r}");
    // Moving to pageable RAM moves; it does not shrink.
    assert!(r.peak_ram_bytes >= roomy.peak_ram_bytes, "{r}");

    let r = plan(&auto_14b(24, 4, Checkpointing::Blocks)).unwrap();
    assert_eq!(r.verdict, Verdict::DoesNotFit, "{r}");
    assert_eq!(r.binding_limit, Some(Limit::Ram), "{r}");
    assert!(
        r.ram_shortfall
            .as_deref()
            .is_some_and(|s| s.contains("the RAM budget (memory.ram_budget_gb) is 4.00 GiB")),
        "{r}"
    );
    assert!(
        r.to_string()
            .contains("RAM binds (the plan does not fit it)"),
        "{r}"
    );
}

/// A model whose saved inputs fit the card beside it keeps them on the GPU (no copies at all) when the planner
/// may choose, and puts them in RAM when the VRAM cannot hold them.
#[test]
fn saved_inputs_stay_on_the_gpu_when_it_holds_them() {
    let mut i = auto_14b(24, 256, Checkpointing::Blocks);
    i.clip.frames = 5;
    let r = plan(&i).unwrap();
    assert_within(&r);
    assert_eq!(placements(&r).1, Placement::Device, "{r}");
    let r = plan(&auto_14b(24, 256, Checkpointing::Blocks)).unwrap();
    assert_ne!(placements(&r).1, Placement::Device, "{r}");
}

/// Every RAM limit from tight to generous, on Linux and on Windows: a plan that fits is within each of its limits
/// (page-locked memory within half of RAM on Windows); one that does not says which limit it misses.
#[test]
fn auto_never_plans_past_the_ram_limits() {
    for ram in (8..=96).step_by(4) {
        for windows in [false, true] {
            let mut i = auto_14b(16, ram, Checkpointing::Auto);
            i.windows = windows;
            i.ram_budget_bytes = None;
            i.available_ram_bytes = Some(ram * GIB);
            i.host_ram_bytes = Some(ram * GIB + 4 * GIB);
            let r = plan(&i).unwrap();
            if r.fits() {
                assert!(r.peak_ram_bytes <= ram * GIB, "{ram} GiB: {r}");
                assert!(r.pinned_ram_bytes <= r.pinned_budget_bytes.unwrap(), "{r}");
                if windows {
                    assert!(r.pinned_ram_bytes <= (ram * GIB + 4 * GIB) / 2, "{r}");
                }
            } else {
                assert!(
                    r.ram_shortfall.is_some() || r.binding_limit == Some(Limit::Vram),
                    "{r}"
                );
            }
        }
    }
}

/// `checkpointing = "auto"` keeps self-attention outputs (less recompute) when the RAM holds them, and only
/// block inputs ("fewer saved") when it does not.
#[test]
fn checkpointing_auto_keeps_what_the_ram_holds() {
    let rich = plan(&auto_14b(24, 256, Checkpointing::Auto)).unwrap();
    assert_within(&rich);
    assert_eq!(
        placements(&rich).2,
        Checkpointing::AttentionProjection,
        "{rich}"
    );
    let blocks = plan(&auto_14b(24, 256, Checkpointing::Blocks)).unwrap();
    // Just enough for block inputs only.
    let r = plan(&auto_14b(
        24,
        blocks.peak_ram_bytes / GIB + 1,
        Checkpointing::Auto,
    ))
    .unwrap();
    assert_within(&r);
    assert_eq!(placements(&r).2, Checkpointing::Blocks, "{r}");
    assert_eq!(r.binding_limit, Some(Limit::Ram), "{r}");
    assert!(
        r.placements
            .as_ref()
            .unwrap()
            .chosen
            .contains(&"memory.checkpointing".to_string()),
        "{r}"
    );
}

/// Windows caps page-locked memory near half of RAM: with RAM enough for everything page-locked but not half of
/// it, the plan page-locks no more than the cap and says the page-locked RAM binds.
#[test]
fn windows_caps_page_locked_memory_near_half_of_ram() {
    let linux = plan(&auto_14b(24, 256, Checkpointing::Blocks)).unwrap();
    let pinned = linux.pinned_ram_bytes;
    let mut i = auto_14b(24, 256, Checkpointing::Blocks);
    i.windows = true;
    i.ram_budget_bytes = None;
    // RAM enough for everything, pageable; half of it less than everything page-locked.
    i.host_ram_bytes = Some(pinned * 2 - 2 * GIB);
    i.available_ram_bytes = i.host_ram_bytes;
    let r = plan(&i).unwrap();
    assert_within(&r);
    assert_eq!(r.pinned_budget_bytes, Some(pinned - GIB));
    assert!(r.pinned_ram_bytes < pinned, "{r}");
    assert_eq!(r.binding_limit, Some(Limit::PinnedRam), "{r}");
    assert!(r.to_string().contains("page-locked RAM binds"), "{r}");

    // An explicit page-locked budget wins, on any system.
    i.windows = false;
    i.pinned_budget_bytes = Some(GIB);
    let r = plan(&i).unwrap();
    assert_within(&r);
    assert_eq!(
        placements(&r).0,
        StreamingMode::Staged,
        "a gibibyte holds no page-locked blocks: {r}"
    );
    assert_eq!(placements(&r).1, Placement::Host, "{r}");
    assert_eq!(r.binding_limit, Some(Limit::PinnedRam), "{r}");
}

/// Settings that leave nothing to the planner are planned as they are: the same lines as before placements
/// were chosen, no key chosen, and a plan that misses the RAM says so rather than moving anything.
#[test]
fn fixed_placements_are_planned_as_set() {
    let mut i = auto_14b(24, 256, Checkpointing::Blocks);
    i.streaming.mode = StreamingMode::Pinned;
    i.streaming.activations = ActivationPlacement::Host;
    let r = plan(&i).unwrap();
    let p = r.placements.clone().unwrap();
    assert!(p.chosen.is_empty(), "{r}");
    assert_eq!(
        (p.streaming, p.saved),
        (StreamingMode::Pinned, Placement::HostPinned)
    );
    i.ram_budget_bytes = Some(r.peak_ram_bytes - 1);
    let short = plan(&i).unwrap();
    assert_eq!(short.verdict, Verdict::DoesNotFit, "{short}");
    assert_eq!(placements(&short), placements(&r));
    assert_eq!(short.binding_limit, Some(Limit::Ram), "{short}");

    // "host" with staged streaming stays pageable.
    i.streaming.mode = StreamingMode::Staged;
    let staged = plan(&i).unwrap();
    assert_eq!(placements(&staged).1, Placement::Host, "{staged}");
}
