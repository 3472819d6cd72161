//! Parity for fixture kind `flux_ae` (the FLUX.1 autoencoder): encoder moments, the scaled latent, and the
//! decoder on it and on an independent latent; sizes read from `config.json`.

use anyhow::Context;
use candle_core::{DType, Device};

use super::{compare, Fixture, ParityRow, OUTPUT_REL_TOL};
use framesmith_models::flux::autoencoder::{AutoEncoder, AutoEncoderConfig};
use framesmith_nn::vb::Vb;

/// Runs the autoencoder of a `flux_ae` fixture and compares every expected tensor.
pub fn check(fixture: &Fixture) -> anyhow::Result<Vec<ParityRow>> {
    let cfg = AutoEncoderConfig::from_json(&fixture.config["init"].to_string())
        .context("config.json `init` is not AutoEncoderParams")?;
    let vb = Vb::from_tensors(fixture.weights.clone(), DType::F32, &Device::Cpu);
    let ae = AutoEncoder::new(&cfg, &vb)?;
    let mut rows = Vec::new();
    let mut row = |name: &str, got: &candle_core::Tensor| -> anyhow::Result<()> {
        if let Some(expected) = fixture.expected.get(name) {
            rows.push(compare(name, got, expected, OUTPUT_REL_TOL)?);
        }
        Ok(())
    };
    let x = fixture.input("x")?;
    let moments = ae.encoder.forward(x)?;
    row("moments", &moments)?;
    row("mean_raw", &moments.narrow(1, 0, cfg.z_channels)?)?;
    row(
        "logvar",
        &moments.narrow(1, cfg.z_channels, cfg.z_channels)?,
    )?;
    let z = ae.encode(x)?;
    row("z", &z)?;
    row("recon", &ae.decode(&z)?)?;
    if let Ok(z_in) = fixture.input("z_in") {
        row("decoded", &ae.decode(z_in)?)?;
    }
    Ok(rows)
}
