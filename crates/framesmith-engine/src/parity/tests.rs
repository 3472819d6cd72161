//! Every FLUX.1 fixture case through [`check_fixture`]: each row passes and every expected tensor is
//! compared; and the check the other kinds' tests share ([`assert_cases_pass_and_a_perturbed_row_fails`]).

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use candle_core::{Device, Tensor};

use super::{check_fixture, Fixture, ParityRow};

/// The names of the rows of `rows` that failed.
fn failed(rows: &[ParityRow]) -> Vec<String> {
    rows.iter()
        .filter(|r| !r.passed)
        .map(|r| r.name.clone())
        .collect()
}

/// Each case of the fixture folder `family` (this workspace's `framesmith-models/tests/fixtures/<family>`) passes with its count of rows, and a copy of case `perturbed` whose
/// expected tensor `row` is bumped by 1 % fails on that row alone.
pub(super) fn assert_cases_pass_and_a_perturbed_row_fails(
    family: &str,
    cases: &[(&str, usize)],
    (perturbed, row): (&str, &str),
) -> anyhow::Result<()> {
    let fixtures = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../framesmith-models/tests/fixtures")
        .join(family);
    let case_dir = |case: &str| fixtures.join(case);
    for &(case, count) in cases {
        let rows = check_fixture(&case_dir(case))?;
        for row in &rows {
            println!("{case}: {row}");
        }
        assert_eq!(rows.len(), count, "{case}");
        assert!(
            failed(&rows).is_empty(),
            "{case}: failed rows {:?}",
            failed(&rows)
        );
    }
    let files = ["config.json", "weights.safetensors", "inputs.safetensors"];
    assert_eq!(
        failed_when_bumped(&case_dir(perturbed), &files, row)?,
        vec![row.to_string()]
    );
    Ok(())
}

/// The rows that fail on a copy of the case in `case_dir` (its `files`, paths inside it) whose expected tensor
/// `row` is raised by 0.01 everywhere.
pub(super) fn failed_when_bumped(
    case_dir: &Path,
    files: &[&str],
    row: &str,
) -> anyhow::Result<Vec<String>> {
    let dir = tempfile::tempdir()?;
    for name in files {
        let to = dir.path().join(name);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::copy(case_dir.join(name), to)?;
    }
    let mut expected: HashMap<String, Tensor> =
        candle_core::safetensors::load(case_dir.join("expected.safetensors"), &Device::Cpu)?;
    let out = &expected[row];
    let bumped = (out + out.affine(0.0, 1e-2)?)?;
    expected.insert(row.into(), bumped);
    candle_core::safetensors::save(&expected, dir.path().join("expected.safetensors"))?;
    Ok(failed(&check_fixture(dir.path())?))
}

fn assert_case(case: &str) -> anyhow::Result<()> {
    let dir = framesmith_models::fixtures::case_dir("flux", case);
    let rows = check_fixture(&dir)?;
    for row in &rows {
        eprintln!("{case}: {row}");
        assert!(row.passed, "{case}: {row}");
    }
    let compared: BTreeSet<&str> = rows.iter().map(|r| r.name.as_str()).collect();
    let fixture = Fixture::load(&dir)?;
    let missed: Vec<&String> = fixture
        .expected
        .keys()
        .filter(|k| !compared.contains(k.as_str()))
        .collect();
    assert!(missed.is_empty(), "{case}: not compared: {missed:?}");
    Ok(())
}

#[test]
fn flux_dit_cases_match_official() -> anyhow::Result<()> {
    for case in ["flux_dit", "flux_dit_schnell", "flux_dit_kontext"] {
        assert_case(case)?;
    }
    Ok(())
}

#[test]
fn flux_autoencoder_matches_official() -> anyhow::Result<()> {
    assert_case("flux_ae")
}

#[test]
fn flux_text_encoders_match_transformers() -> anyhow::Result<()> {
    assert_case("clip_l")?;
    assert_case("t5_encoder")
}

#[test]
fn flux_sampling_matches_official() -> anyhow::Result<()> {
    assert_case("flux_schedule")
}
