//! Parity for fixture kind `ltx2_vae` (LTX-2's video VAE against ltx-core's `VideoEncoder` and
//! `ConvVideoDecoder`, `bench/reference/ltx2_vae.py`): the normalised latents and the decoded clip, whole, tiled
//! and of one image where the fixture has them; a timestep-conditioned decoder gets the noise the official call
//! drew.

use anyhow::Context;
use candle_core::{DType, Device};

use super::{compare, Fixture, ParityRow, OUTPUT_REL_TOL};
use framesmith_models::ltx2::vae::{
    vae_from_tensors, AxisTiles, DecodeConditioning, Ltx2VaeConfig, VaeTiling,
};

/// The fixture's tiling under `key` (`{axis: {tile_size, overlap}}`), if it has one.
fn tiling(fixture: &Fixture, key: &str) -> Option<VaeTiling> {
    let spec = fixture.config.get(key)?;
    let axis = |name: &str| {
        let a = spec.get(name)?;
        Some(AxisTiles {
            tile: a.get("tile_size")?.as_u64()? as usize,
            overlap: a.get("overlap")?.as_u64()? as usize,
        })
    };
    Some(VaeTiling {
        frames: axis("frames"),
        height: axis("height"),
        width: axis("width"),
    })
}

/// Runs the VAE of an `ltx2_vae` fixture and compares every expected tensor.
pub fn check(fixture: &Fixture) -> anyhow::Result<Vec<ParityRow>> {
    let cfg = Ltx2VaeConfig::from_vae_json(&fixture.config["vae"])
        .map_err(anyhow::Error::msg)
        .context("config.json `vae` is not an LTX-2 VAE config")?;
    let vae = vae_from_tensors(fixture.weights.clone(), &cfg, DType::F32, &Device::Cpu)
        .map_err(anyhow::Error::msg)
        .context("the fixture's weights are no LTX-2 video VAE")?;
    let (video, latents) = (fixture.input("video")?, fixture.input("latents")?);
    let cond = DecodeConditioning {
        noise: fixture.inputs.get("decode_noise").cloned(),
        ..DecodeConditioning::default()
    };
    let mut rows = vec![
        compare(
            "encoded",
            &vae.encode(video)?,
            fixture.expected("encoded")?,
            OUTPUT_REL_TOL,
        )?,
        compare(
            "decoded",
            &vae.decode(latents, &cond)?,
            fixture.expected("decoded")?,
            OUTPUT_REL_TOL,
        )?,
    ];
    if let Some(t) = tiling(fixture, "encode_tiles") {
        let got = vae.encode_tiled(video, &t)?;
        rows.push(compare(
            "encoded_tiled",
            &got,
            fixture.expected("encoded_tiled")?,
            OUTPUT_REL_TOL,
        )?);
    }
    if let Some(t) = tiling(fixture, "decode_tiles") {
        let got = vae.decode_tiled(latents, &t, &cond)?;
        rows.push(compare(
            "decoded_tiled",
            &got,
            fixture.expected("decoded_tiled")?,
            OUTPUT_REL_TOL,
        )?);
    }
    if let Ok(image) = fixture.input("image") {
        let got = vae.encode(image)?;
        rows.push(compare(
            "image_encoded",
            &got,
            fixture.expected("image_encoded")?,
            OUTPUT_REL_TOL,
        )?);
        let got = vae.decode(fixture.input("image_latents")?, &cond)?;
        rows.push(compare(
            "image_decoded",
            &got,
            fixture.expected("image_decoded")?,
            OUTPUT_REL_TOL,
        )?);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::super::tests::assert_cases_pass_and_a_perturbed_row_fails;

    #[test]
    fn both_cases_pass_and_a_perturbed_tiled_decode_fails() -> anyhow::Result<()> {
        assert_cases_pass_and_a_perturbed_row_fails(
            "ltx2",
            &[("vae_ltx2", 6), ("vae_ltx23", 2)],
            ("vae_ltx2", "decoded_tiled"),
        )
    }
}
