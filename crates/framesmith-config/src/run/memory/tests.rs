use std::path::Path;

use super::*;
use crate::plan::HostInfo;
use crate::run::RunConfig;
use crate::validate::validate;

/// Defaults with real (empty) files for the DiT and the dataset config, and `memory` as given.
fn with_memory(dir: &Path, memory: MemorySection) -> RunConfig {
    let dit = dir.join("wan.safetensors");
    let dataset = dir.join("dataset.toml");
    std::fs::write(&dit, b"").unwrap();
    std::fs::write(&dataset, b"").unwrap();
    let mut cfg = RunConfig::default();
    cfg.model.dit = dit;
    cfg.dataset.config = dataset;
    cfg.memory = memory;
    cfg
}

/// Existing configs keep their placements: nothing is left to the planner unless a config says "auto".
#[test]
fn placements_are_fixed_unless_a_config_says_auto() {
    let d = MemorySection::default();
    assert_eq!(
        (
            d.streaming,
            d.activations,
            d.checkpointing,
            d.pinned_budget_gb
        ),
        (
            StreamingMode::Off,
            ActivationPlacement::Device,
            Checkpointing::Blocks,
            None
        )
    );
    let text =
        "[memory]\nstreaming = \"auto\"\nblocks_to_swap = \"auto\"\nactivations = \"auto\"\n\
                checkpointing = \"auto\"\nram_budget_gb = 32.0\npinned_budget_gb = 14.5\n";
    let cfg = RunConfig::from_toml_str(text, Path::new("run.toml")).unwrap();
    let m = &cfg.memory;
    assert_eq!(
        (
            m.streaming,
            m.activations,
            m.checkpointing,
            m.pinned_budget_gb
        ),
        (
            StreamingMode::Auto,
            ActivationPlacement::Auto,
            Checkpointing::Auto,
            Some(14.5)
        )
    );
    for (name, placement) in [
        ("pinned", ActivationPlacement::Pinned),
        ("pageable", ActivationPlacement::Pageable),
        ("host", ActivationPlacement::Host),
    ] {
        let text = format!("[memory]\nactivations = \"{name}\"\n");
        let cfg = RunConfig::from_toml_str(&text, Path::new("run.toml")).unwrap();
        assert_eq!(cfg.memory.activations, placement);
    }
    // Written back as read.
    let again = RunConfig::from_toml_str(&cfg.to_toml_string().unwrap(), Path::new("x")).unwrap();
    assert_eq!(again.memory, cfg.memory);
}

/// A placement the config cannot take is refused with the values it can, and the file last.
#[test]
fn an_unknown_placement_names_the_choices_and_the_file() {
    for (key, value) in [
        ("activations", "gpu"),
        ("streaming", "mmap"),
        ("checkpointing", "some"),
    ] {
        let text = format!("[memory]\n{key} = \"{value}\"\n");
        let err = RunConfig::from_toml_str(&text, Path::new("/home/me/run.toml"))
            .expect_err("an unknown value")
            .to_string();
        assert!(err.contains(key) && err.contains(value), "{err}");
        assert!(
            err.contains("auto"),
            "the choices, \"auto\" among them: {err}"
        );
        assert!(err.ends_with("/home/me/run.toml"), "{err}");
    }
}

/// The page-locked budget is checked as the other budgets are, and may not be more than the RAM budget it is
/// part of; page-locked or pageable saved inputs need checkpointing, as "host" does.
#[test]
fn page_locked_budget_and_placements_are_validated() {
    let dir = tempfile::tempdir().unwrap();
    let host = HostInfo::new(1);
    let memory = |f: &dyn Fn(&mut MemorySection)| {
        let mut m = MemorySection::default();
        f(&mut m);
        with_memory(dir.path(), m)
    };
    let ok = memory(&|m| {
        m.streaming = StreamingMode::Auto;
        m.blocks_to_swap = BlocksToSwap::Auto(AutoKeyword::Auto);
        m.activations = ActivationPlacement::Auto;
        m.checkpointing = Checkpointing::Auto;
        m.ram_budget_gb = Some(32.0);
        m.pinned_budget_gb = Some(14.0);
    });
    let plan = validate(&ok, &host).expect("auto placements validate");
    assert_eq!(plan.memory.pinned_budget_bytes, Some(14 << 30));
    assert_eq!(plan.memory.streaming, StreamingMode::Auto);

    for (bad, fix) in [
        (Some(-1.0), "e.g. 14"),
        (Some(f64::NAN), "e.g. 14"),
        (Some(40.0), "at most memory.ram_budget_gb"),
    ] {
        let cfg = memory(&|m| {
            m.ram_budget_gb = Some(32.0);
            m.pinned_budget_gb = bad;
        });
        let e = validate(&cfg, &host).expect_err("a bad page-locked budget");
        let p = e.for_key("memory.pinned_budget_gb").expect("named");
        assert!(p.fix.contains(fix), "{p}");
    }

    for placement in [ActivationPlacement::Pinned, ActivationPlacement::Pageable] {
        let cfg = memory(&|m| {
            m.checkpointing = Checkpointing::Off;
            m.activations = placement;
        });
        let e = validate(&cfg, &host).expect_err("nothing to move without checkpointing");
        assert!(e.for_key("memory.checkpointing").is_some(), "{e}");
    }
}
