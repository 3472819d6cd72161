//! Parity with the official Wan implementation: every expected tensor of the shared DiT fixtures, through the
//! library and through `framesmith check-parity`.
#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

use std::path::PathBuf;
use std::process::Command;

fn fixture(case: &str) -> PathBuf {
    framesmith_models::fixtures::wan_case(case)
}

fn assert_case_passes(case: &str) {
    let dir = fixture(case);
    let rows =
        framesmith_engine::parity::check_fixture(&dir).unwrap_or_else(|e| panic!("{case}: {e:#}"));
    assert!(!rows.is_empty());
    for row in &rows {
        assert!(row.passed, "{case}: {row}");
    }
}

#[test]
fn wan21_t2v_tiny_matches_official() {
    assert_case_passes("wan21_t2v_tiny");
}

#[test]
fn wan21_i2v_tiny_matches_official() {
    assert_case_passes("wan21_i2v_tiny");
}

#[test]
fn wan22_ti2v_tiny_matches_official() {
    assert_case_passes("wan22_ti2v_tiny");
}

#[test]
fn t2v_case_compares_every_expected_tensor() {
    let rows =
        framesmith_engine::parity::check_fixture(&fixture("wan21_t2v_tiny")).expect("fixture runs");
    let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
    for name in [
        "out_0",
        "out_1",
        "block0_out",
        "freqs",
        "grad.x_0",
        "grad.x_1",
        "grad.blocks.1.ffn.2.weight",
    ] {
        assert!(names.contains(&name), "{name} not compared");
    }
    // 2 blocks × 10 Linear layers.
    assert_eq!(names.iter().filter(|n| n.ends_with(".weight")).count(), 20);
}

#[test]
fn cli_reports_rows_and_exit_status() {
    let out = Command::new(env!("CARGO_BIN_EXE_framesmith"))
        .arg("check-parity")
        .arg(fixture("wan21_t2v_tiny"))
        .output()
        .expect("framesmith runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout
        .lines()
        .any(|l| l.contains("out_0") && l.contains("rel")));
    assert_eq!(stdout.lines().last(), Some("26 passed, 0 failed"));

    let missing = Command::new(env!("CARGO_BIN_EXE_framesmith"))
        .arg("check-parity")
        .arg(fixture("no_such_case"))
        .output()
        .expect("framesmith runs");
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stdout).contains("0 passed, 1 failed"));
}

#[test]
fn a_perturbed_reference_fails() -> anyhow::Result<()> {
    let src = fixture("wan21_t2v_tiny");
    let dir = tempfile::tempdir()?;
    for f in ["config.json", "inputs.safetensors", "weights.safetensors"] {
        std::fs::copy(src.join(f), dir.path().join(f))?;
    }
    let mut expected = candle_core::safetensors::load(
        src.join("expected.safetensors"),
        &candle_core::Device::Cpu,
    )?;
    let out0 = expected.get("out_0").cloned().expect("out_0 present");
    expected.insert("out_0".into(), (out0 * 1.001)?);
    candle_core::safetensors::save(&expected, dir.path().join("expected.safetensors"))?;
    let rows = framesmith_engine::parity::check_fixture(dir.path())?;
    let failed: Vec<&str> = rows
        .iter()
        .filter(|r| !r.passed)
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(failed, ["out_0"]);
    Ok(())
}
