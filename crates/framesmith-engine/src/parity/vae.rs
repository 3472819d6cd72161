//! Parity of the Wan VAEs (`wan_vae` fixtures): chunked causal encode (`mu`, `mu_raw`, `log_var`) and
//! per-frame decode (`decoded`, unclamped) of the official `WanVAE_` built from the fixture's `init`.

use anyhow::{bail, Context};
use candle_core::{DType, Device};
use serde_json::Value;

use super::{compare, Fixture, ParityRow, OUTPUT_REL_TOL};
use framesmith_models::wan::vae::{LatentStats, VaeConfig, VaeVariant, WanVae};
use framesmith_nn::vb::Vb;

/// The VAE architecture from the fixture: the variant from `class` (`vae2_2.py` = Wan 2.2) or the presence of
/// `dec_dim`, sizes from `init` (unspecified ones as the official constructor defaults).
fn config(fixture: &Fixture) -> anyhow::Result<VaeConfig> {
    let c = &fixture.config;
    let init = c.get("init").context("fixture config: missing `init`")?;
    let class = c.get("class").and_then(Value::as_str).unwrap_or("");
    let wan22 = class.contains("vae2_2") || init.get("dec_dim").is_some();
    let size = |key: &str, default: usize| -> anyhow::Result<usize> {
        match init.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_u64()
                .map(|v| v as usize)
                .with_context(|| format!("fixture config: `init.{key}`")),
        }
    };
    let list = |key: &str| -> Option<&Vec<Value>> { init.get(key).and_then(Value::as_array) };
    let dim = size("dim", if wan22 { 160 } else { 128 })?;
    let dim_mult = match list("dim_mult") {
        Some(v) => v
            .iter()
            .map(|u| u.as_u64().map(|u| u as usize))
            .collect::<Option<Vec<_>>>(),
        None => Some(vec![1, 2, 4, 4]),
    }
    .context("fixture config: `init.dim_mult` must hold integers")?;
    let attn_scales = list("attn_scales")
        .map(|v| v.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default();
    let temporal_downsample = match list("temperal_downsample") {
        Some(v) => v.iter().map(Value::as_bool).collect::<Option<Vec<_>>>(),
        None => Some(vec![true, true, false]),
    }
    .context("fixture config: `init.temperal_downsample` must hold booleans")?;
    if init.get("dropout").and_then(Value::as_f64).unwrap_or(0.0) != 0.0 {
        bail!("fixture config: VAE dropout must be 0 (inference)");
    }
    Ok(VaeConfig {
        variant: if wan22 {
            VaeVariant::Wan22
        } else {
            VaeVariant::Wan21
        },
        dim,
        dec_dim: if wan22 { size("dec_dim", 256)? } else { dim },
        z_dim: size("z_dim", if wan22 { 16 } else { 4 })?,
        dim_mult,
        num_res_blocks: size("num_res_blocks", 2)?,
        attn_scales,
        temporal_downsample,
    })
}

/// Encodes the fixture video, compares `mu`, `mu_raw`, `log_var`; decodes the expected `mu` and compares
/// `decoded` (so encoder and decoder are judged separately).
pub fn check(fixture: &Fixture) -> anyhow::Result<Vec<ParityRow>> {
    let cfg = config(fixture)?;
    let dev = Device::Cpu;
    let vb = Vb::from_tensors(fixture.weights.clone(), DType::F32, &dev);
    let vae = WanVae::new(&cfg, &vb).context("building the VAE from the fixture weights")?;
    let stats = LatentStats {
        mean: fixture.input("latent_mean")?.clone(),
        inv_std: fixture.input("latent_inv_std")?.clone(),
    };
    let video = fixture.input("video")?;
    let (mu_raw, log_var) = vae.encode_raw(video)?;
    let mu = stats.normalize(&mu_raw)?;
    let mut rows = vec![
        compare("mu", &mu, fixture.expected("mu")?, OUTPUT_REL_TOL)?,
        compare(
            "mu_raw",
            &mu_raw,
            fixture.expected("mu_raw")?,
            OUTPUT_REL_TOL,
        )?,
        compare(
            "log_var",
            &log_var,
            fixture.expected("log_var")?,
            OUTPUT_REL_TOL,
        )?,
    ];
    let decoded = vae.decode(fixture.expected("mu")?, &stats)?;
    rows.push(compare(
        "decoded",
        &decoded,
        fixture.expected("decoded")?,
        OUTPUT_REL_TOL,
    )?);
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::super::schedulers::assert_case_passes;

    #[test]
    fn wan21_vae_tiny_fixture() -> anyhow::Result<()> {
        assert_case_passes("wan21_vae_tiny")?;
        Ok(())
    }

    #[test]
    fn wan22_vae_tiny_fixture() -> anyhow::Result<()> {
        assert_case_passes("wan22_vae_tiny")?;
        Ok(())
    }
}
