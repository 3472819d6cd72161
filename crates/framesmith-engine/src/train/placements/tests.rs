use super::*;
use crate::plan::tests::{fp8_14b, GIB};
use framesmith_config::protocol::memory::Placements;
use framesmith_config::run::{AutoKeyword, BlocksToSwap};

fn memory(
    streaming: StreamingMode,
    activations: ActivationPlacement,
    checkpointing: Checkpointing,
) -> MemoryPlan {
    MemoryPlan {
        applies: true,
        streaming,
        blocks_to_swap: BlocksToSwap::Auto(AutoKeyword::Auto),
        activations,
        checkpointing,
        vram_budget_bytes: Some(24 * GIB),
        staging_slots: 4,
        ..MemoryPlan::default()
    }
}

/// A plan of 14B within 24 GiB whose placements are `placements`.
fn report_with(placements: Placements) -> PlanReport {
    let mut i = fp8_14b();
    i.streaming.mode = StreamingMode::Pinned;
    i.streaming.activations = ActivationPlacement::Host;
    i.streaming.blocks_to_swap = BlocksToSwap::Auto(AutoKeyword::Auto);
    i.vram_budget_bytes = Some(24 * GIB);
    let mut r = crate::plan::plan(&i).unwrap();
    r.placements = Some(placements);
    r
}

fn placements(streaming: StreamingMode, saved: Placement) -> Placements {
    Placements {
        streaming,
        saved,
        checkpointing: Checkpointing::Attention,
        chosen: vec!["memory.streaming".into(), "memory.activations".into()],
    }
}

/// The run takes the plan's choice for every "auto" placement, as it takes its block count.
#[test]
fn auto_placements_run_as_the_plan_chose() {
    let m = memory(
        StreamingMode::Auto,
        ActivationPlacement::Auto,
        Checkpointing::Auto,
    );
    let report = report_with(placements(StreamingMode::Staged, Placement::Host));
    let memory_report: MemoryReport = Ok(report.clone());
    assert_eq!(
        stream_mode(&m, Some(&memory_report)).unwrap(),
        Some(StreamMode::Staged)
    );
    assert_eq!(
        saved_at(&m, Some(&report)).unwrap(),
        SavedPlacement::Pageable
    );
    assert_eq!(
        checkpointing_for(&m, Some(&report)),
        Checkpointing::Attention
    );

    let report = report_with(placements(StreamingMode::Pinned, Placement::HostPinned));
    let memory_report: MemoryReport = Ok(report.clone());
    assert_eq!(
        stream_mode(&m, Some(&memory_report)).unwrap(),
        Some(StreamMode::Pinned)
    );
    assert_eq!(
        saved_at(&m, Some(&report)).unwrap(),
        SavedPlacement::PageLocked
    );
    // Nothing streams when the plan streams nothing.
    let report = report_with(placements(StreamingMode::Off, Placement::Device));
    assert_eq!(stream_mode(&m, Some(&Ok(report.clone()))).unwrap(), None);
    assert_eq!(saved_at(&m, Some(&report)).unwrap(), SavedPlacement::Device);
}

/// Without a plan an "auto" placement does not guess (checkpointing excepted: block inputs only, the least
/// memory); fixed placements run as set.
#[test]
fn placements_without_a_plan_are_the_settings() {
    let auto = memory(
        StreamingMode::Auto,
        ActivationPlacement::Auto,
        Checkpointing::Auto,
    );
    let err = format!("{:#}", stream_mode(&auto, None).unwrap_err());
    assert!(
        err.contains("streaming = \"auto\" needs the run's memory plan"),
        "{err}"
    );
    let failed: MemoryReport = Err("no model".into());
    let err = format!("{:#}", stream_mode(&auto, Some(&failed)).unwrap_err());
    assert!(err.contains("no model"), "{err}");
    let err = format!("{:#}", saved_at(&auto, None).unwrap_err());
    assert!(err.contains("name the placement"), "{err}");
    assert_eq!(checkpointing_for(&auto, None), Checkpointing::Blocks);

    let staged = memory(
        StreamingMode::Staged,
        ActivationPlacement::Host,
        Checkpointing::Attention,
    );
    assert_eq!(
        stream_mode(&staged, None).unwrap(),
        Some(StreamMode::Staged)
    );
    assert_eq!(saved_at(&staged, None).unwrap(), SavedPlacement::Pageable);
    assert_eq!(checkpointing_for(&staged, None), Checkpointing::Attention);
    let pinned = memory(
        StreamingMode::Staged,
        ActivationPlacement::Pinned,
        Checkpointing::Blocks,
    );
    assert_eq!(saved_at(&pinned, None).unwrap(), SavedPlacement::PageLocked);
    let off = memory(
        StreamingMode::Off,
        ActivationPlacement::Device,
        Checkpointing::Blocks,
    );
    assert_eq!(stream_mode(&off, None).unwrap(), None);
    assert_eq!(saved_at(&off, None).unwrap(), SavedPlacement::Device);
}

/// An "auto" placement never starts a plan that does not fit the RAM; fixed placements leave that to the
/// verdict's warning, as before.
#[test]
fn auto_placements_refuse_a_plan_past_the_ram() {
    let mut short = report_with(placements(StreamingMode::Pinned, Placement::HostPinned));
    short.ram_shortfall = Some("the plan needs 40.00 GiB of RAM".into());
    let short: MemoryReport = Ok(short);
    let auto = memory(
        StreamingMode::Pinned,
        ActivationPlacement::Auto,
        Checkpointing::Blocks,
    );
    let err = format!("{:#}", refuse_swapping(&auto, Some(&short)).unwrap_err());
    assert!(
        err.contains("memory.activations = \"auto\" found no placement that fits the RAM")
            && err.contains("40.00 GiB"),
        "{err}"
    );
    let fixed = memory(
        StreamingMode::Pinned,
        ActivationPlacement::Host,
        Checkpointing::Blocks,
    );
    assert!(refuse_swapping(&fixed, Some(&short)).is_ok());
}
