//! Parity of the umT5 encoder (`umt5` fixtures): `T5Encoder(**init)(ids, mask)` against `hidden`.

use anyhow::Context;
use candle_core::{DType, Device};
use serde_json::Value;

use super::{compare, Fixture, ParityRow, OUTPUT_REL_TOL};
use framesmith_models::t5::{T5Config, UmT5Encoder};
use framesmith_nn::vb::Vb;

/// The encoder sizes from the fixture's `init` (official constructor kwargs); unspecified ones as officially.
fn config(init: &Value) -> anyhow::Result<T5Config> {
    let size = |key: &str| -> anyhow::Result<usize> {
        init.get(key)
            .and_then(Value::as_u64)
            .map(|v| v as usize)
            .with_context(|| format!("fixture config: `init.{key}` missing or not an integer"))
    };
    Ok(T5Config {
        vocab: size("vocab")?,
        dim: size("dim")?,
        dim_attn: size("dim_attn")?,
        dim_ffn: size("dim_ffn")?,
        num_heads: size("num_heads")?,
        num_layers: size("num_layers")?,
        num_buckets: size("num_buckets")?,
        shared_pos: init
            .get("shared_pos")
            .and_then(Value::as_bool)
            .unwrap_or(true),
        ..T5Config::umt5_xxl()
    })
}

/// Runs the encoder on the fixture's `ids` / `mask` and compares `hidden`.
pub fn check(fixture: &Fixture) -> anyhow::Result<Vec<ParityRow>> {
    let init = fixture
        .config
        .get("init")
        .context("fixture config: missing `init`")?;
    let cfg = config(init)?;
    let vb = Vb::from_tensors(fixture.weights.clone(), DType::F32, &Device::Cpu);
    let encoder = UmT5Encoder::new(&cfg, &vb)
        .context("building the umT5 encoder from the fixture weights")?;
    let hidden = encoder.encode(fixture.input("ids")?, fixture.input("mask")?)?;
    Ok(vec![compare(
        "hidden",
        &hidden,
        fixture.expected("hidden")?,
        OUTPUT_REL_TOL,
    )?])
}

#[cfg(test)]
mod tests {
    use super::super::schedulers::assert_case_passes;

    #[test]
    fn umt5_tiny_fixture() -> anyhow::Result<()> {
        assert_case_passes("umt5_tiny")?;
        Ok(())
    }
}
