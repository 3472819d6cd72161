//! Every FLUX.1 fixture case through [`check_fixture`]: each row passes and every expected tensor is
//! compared.

use std::collections::BTreeSet;

use super::{check_fixture, Fixture};

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
