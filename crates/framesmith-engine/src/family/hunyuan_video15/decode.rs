//! Decoding a HunyuanVideo 1.5 clip, for samples and `framesmith generate` once they can condition the DiT: the
//! DiT's latents (the VAE's × its scaling factor) divided back, run through the VAE in temporal chunks and the
//! official pipeline's spatial tiles (256 pixels with overlap 0.125 on cards above 21 GiB, else 128 with 0.25),
//! and turned into RGB frames as the official `(video / 2 + 0.5).clamp(0, 1)` does.

use std::path::Path;

use candle_core::{DType, Device, Tensor};

use crate::generate::frames::video_to_frames;
use framesmith_data::video::encode::RgbFrame;
use framesmith_models::hunyuan_video15::vae::{load_hv15_vae, Hv15Vae, SpatialTiles};

/// Latent frames decoded per chunk (a chunk's activations, not the clip's, are held at once).
pub const DECODE_CHUNK_LATENTS: usize = 2;

/// Cards above this many bytes decode in the official pipeline's larger tiles.
const LARGE_TILES_ABOVE_BYTES: u64 = 21 * (1 << 30);

/// The official pipeline's tiles for a card of `vram_bytes` (`get_vae_inference_config`).
pub fn official_tiles(vram_bytes: u64) -> SpatialTiles {
    if vram_bytes > LARGE_TILES_ABOVE_BYTES {
        SpatialTiles::large()
    } else {
        SpatialTiles::small()
    }
}

/// The VAE that turns the DiT's latents into frames.
pub struct Hv15Decoder {
    pub vae: Hv15Vae,
    /// Spatial tiles (`None`: whole frames).
    pub tiles: Option<SpatialTiles>,
    /// Dtype of the VAE's weights (latents are converted to it).
    pub dtype: DType,
    /// Where the VAE's weights are.
    pub device: Device,
}

impl Hv15Decoder {
    /// The VAE of `path` on `device` in `dtype`, tiled as the official pipeline tiles for a card of `vram_bytes`.
    pub fn load(
        path: &Path,
        (dtype, device): (DType, &Device),
        vram_bytes: u64,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            vae: load_hv15_vae(path, dtype, device)?,
            tiles: Some(official_tiles(vram_bytes)),
            dtype,
            device: device.clone(),
        })
    }

    /// RGB frames of the DiT's latents `[C, F, H, W]` (the VAE's latents × its scaling factor): `4(F − 1) + 1`
    /// frames of `16H × 16W`.
    pub fn decode(&self, latents: &Tensor) -> anyhow::Result<Vec<RgbFrame>> {
        let scale = self.vae.config().scaling_factor;
        let z = framesmith_nn::ops::to_device(latents, &self.device)?
            .to_dtype(DType::F32)?
            .affine(1.0 / scale, 0.0)?
            .to_dtype(self.dtype)?
            .unsqueeze(0)?;
        let video = self
            .vae
            .decode_tiled(&z, self.tiles, Some(DECODE_CHUNK_LATENTS))?;
        video_to_frames(&video.squeeze(0)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn fixture_vae() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(
            "../framesmith-models/tests/fixtures/hunyuan_video15_vae/video/weights.safetensors",
        )
    }

    #[test]
    fn the_dit_latents_are_unscaled_then_decoded_to_frames() -> anyhow::Result<()> {
        let device = Device::Cpu;
        let mut decoder = Hv15Decoder::load(&fixture_vae(), (DType::F32, &device), 24 << 30)?;
        assert_eq!(decoder.tiles, Some(SpatialTiles::large()));
        assert_eq!(official_tiles(16 << 30), SpatialTiles::small());
        decoder.tiles = None;
        let z = (Tensor::randn(0f32, 1.0, (4, 2, 2, 3), &device)? * 0.5)?;
        let frames = decoder.decode(&(&z * decoder.vae.config().scaling_factor)?)?;
        assert_eq!(frames.len(), 5);
        assert_eq!((frames[0].width, frames[0].height), (48, 32));
        let direct = video_to_frames(&decoder.vae.decode(&z.unsqueeze(0)?, None)?.squeeze(0)?)?;
        let max_diff = frames
            .iter()
            .zip(&direct)
            .flat_map(|(a, b)| a.data.iter().zip(&b.data))
            .map(|(a, b)| a.abs_diff(*b))
            .max()
            .unwrap_or(u8::MAX);
        assert!(max_diff <= 1, "frames differ by {max_diff}");
        // Without the division the frames would differ (the test sees the scaling).
        let unscaled = decoder.decode(&z)?;
        assert!(unscaled.iter().zip(&direct).any(|(a, b)| a.data != b.data));
        Ok(())
    }
}
