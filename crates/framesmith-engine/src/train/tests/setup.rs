//! Run setup: `model.fp8_attention` is recorded in the LoRA's metadata and refused by name on a device without
//! FP8 attention (the CPU).

use crate::train::setup::{device_for, lora_metadata};
use crate::train::tests::demo_config;
use framesmith_config::plan::PlanDevice;
use framesmith_config::{validate, HostInfo, RunPlan};

fn demo_plan() -> RunPlan {
    let dir = tempfile::tempdir().expect("temp dir");
    validate(&demo_config(dir.path(), 2), &HostInfo::new(1)).expect("demo-cpu validates")
}

#[test]
fn the_lora_records_whether_attention_ran_in_fp8() {
    let mut plan = demo_plan();
    let meta = lora_metadata(&plan, "base", "https://example.invalid/base");
    assert_eq!(
        meta.get("framesmith.fp8_attention").map(String::as_str),
        Some("false")
    );
    plan.model.fp8_attention = true;
    let meta = lora_metadata(&plan, "base", "https://example.invalid/base");
    assert_eq!(
        meta.get("framesmith.fp8_attention").map(String::as_str),
        Some("true")
    );
}

#[test]
fn fp8_attention_on_the_cpu_is_refused_by_name_with_the_fix() {
    let mut plan = demo_plan();
    plan.device = PlanDevice::Cpu;
    assert!(device_for(&plan).is_ok());
    plan.model.fp8_attention = true;
    let err = format!("{:#}", device_for(&plan).expect_err("refused"));
    assert!(
        err.contains("model.fp8_attention")
            && err.contains("not on the CPU")
            && err.contains("set fp8_attention = false"),
        "{err}"
    );
}
