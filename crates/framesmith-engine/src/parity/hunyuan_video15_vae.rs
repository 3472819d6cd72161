//! Parity for fixture kind `hunyuan_video15_vae` (HunyuanVideo 1.5's VAE against the official
//! `AutoencoderKLConv3D`, `bench/reference/hunyuan_video15_vae.py`): the encoder's moments and the decoded clip,
//! whole and in chunks of one latent frame, and with the official spatial tiling where the fixture has it.

use anyhow::Context;
use candle_core::{DType, Device};

use super::{compare, Fixture, ParityRow, OUTPUT_REL_TOL};
use framesmith_models::hunyuan_video15::vae::weights::vae_from_tensors;
use framesmith_models::hunyuan_video15::vae::SpatialTiles;

/// The fixture's tiling (`tile`: `sample_size`, `overlap`), if it has one.
fn tiles(fixture: &Fixture) -> Option<SpatialTiles> {
    let tile = fixture.config.get("tile")?;
    Some(SpatialTiles {
        sample_size: tile.get("sample_size")?.as_u64()? as usize,
        overlap: tile.get("overlap")?.as_f64()?,
    })
}

/// Runs the VAE of a `hunyuan_video15_vae` fixture and compares every expected tensor.
pub fn check(fixture: &Fixture) -> anyhow::Result<Vec<ParityRow>> {
    let vae = vae_from_tensors(fixture.weights.clone(), DType::F32, &Device::Cpu)
        .map_err(anyhow::Error::msg)
        .context("the fixture's weights are no HunyuanVideo 1.5 VAE")?;
    let (video, latents) = (fixture.input("video")?, fixture.input("latents")?);
    let (moments, decoded) = (fixture.expected("moments")?, fixture.expected("decoded")?);
    let mut rows = vec![
        compare(
            "moments",
            &vae.encode_moments(video, None)?,
            moments,
            OUTPUT_REL_TOL,
        )?,
        compare(
            "moments (chunks of 1 latent frame)",
            &vae.encode_moments(video, Some(1))?,
            moments,
            OUTPUT_REL_TOL,
        )?,
        compare(
            "decoded",
            &vae.decode(latents, None)?,
            decoded,
            OUTPUT_REL_TOL,
        )?,
        compare(
            "decoded (chunks of 1 latent frame)",
            &vae.decode(latents, Some(1))?,
            decoded,
            OUTPUT_REL_TOL,
        )?,
    ];
    if let Some(t) = tiles(fixture) {
        let got = vae.encode_moments_tiled(video, Some(t), Some(1))?;
        rows.push(compare(
            "moments_tiled",
            &got,
            fixture.expected("moments_tiled")?,
            OUTPUT_REL_TOL,
        )?);
        let got = vae.decode_tiled(latents, Some(t), Some(1))?;
        rows.push(compare(
            "decoded_tiled",
            &got,
            fixture.expected("decoded_tiled")?,
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
            "hunyuan_video15_vae",
            &[("video", 6), ("image", 4)],
            ("video", "decoded_tiled"),
        )
    }
}
