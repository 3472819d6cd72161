//! Parity for fixture kind `siglip_vision` (the SigLIP image encoder against the official
//! `VisionEncoder("siglip")` of HunyuanVideo 1.5, `bench/reference/siglip.py`): the case folder is laid out as
//! FLUX.1-Redux-dev's and read through the users' loader; each image's processed pixels (exactly) and
//! `last_hidden_state` are compared.

use std::path::Path;

use anyhow::Context;
use candle_core::{DType, Device};
use image::RgbImage;

use super::{compare, Fixture, ParityRow, OUTPUT_REL_TOL};
use framesmith_models::siglip::{load_siglip, preprocess};

/// Runs the case in `dir` and compares every image's pixels and hidden states.
pub fn check(fixture: &Fixture, dir: &Path) -> anyhow::Result<Vec<ParityRow>> {
    let tower = load_siglip(dir, DType::F32, &Device::Cpu)
        .context("loading the fixture's SigLIP folder")?;
    let count = fixture
        .config
        .get("images")
        .and_then(|v| v.as_array())
        .map(Vec::len)
        .context("fixture config: missing `images`")?;
    let mut rows = Vec::with_capacity(2 * count);
    for i in 0..count {
        let input = fixture.input(&format!("image_{i}"))?;
        let (h, w, _) = input.dims3()?;
        let raw = input.flatten_all()?.to_vec1::<u8>()?;
        let image = RgbImage::from_raw(w as u32, h as u32, raw)
            .with_context(|| format!("fixture input image_{i} is not [H, W, 3]"))?;
        let size = tower.config().image_size;
        let pixels = preprocess::pixel_values(&image, size, &Device::Cpu)?.unsqueeze(0)?;
        let name = format!("pixel_values_{i}");
        rows.push(compare(&name, &pixels, fixture.expected(&name)?, 0.0)?);
        let name = format!("last_hidden_state_{i}");
        let states = tower.forward(&pixels)?;
        rows.push(compare(
            &name,
            &states,
            fixture.expected(&name)?,
            OUTPUT_REL_TOL,
        )?);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::super::tests::failed_when_bumped;

    #[test]
    fn the_fixture_passes_and_a_perturbed_reference_fails() -> anyhow::Result<()> {
        let case = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../framesmith-models/tests/fixtures/siglip");
        let rows = super::super::check_fixture(&case)?;
        for row in &rows {
            println!("{row}");
        }
        assert_eq!(rows.len(), 6);
        assert!(rows.iter().all(|r| r.passed));
        let files = [
            "config.json",
            "inputs.safetensors",
            "image_encoder/config.json",
            "image_encoder/model.safetensors",
        ];
        assert_eq!(
            failed_when_bumped(&case, &files, "last_hidden_state_1")?,
            vec!["last_hidden_state_1".to_string()]
        );
        Ok(())
    }
}
