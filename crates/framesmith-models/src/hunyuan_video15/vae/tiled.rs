//! Spatial tiling of HunyuanVideo 1.5's VAE as the official `spatial_tiled_encode` / `spatial_tiled_decode` do
//! it: overlapping square tiles, each blended into its upper and left neighbours (already blended themselves)
//! with linear ramps, then cropped and joined. Each tile still runs in temporal chunks.

use candle_core::{Result, Tensor};

use super::Hv15Vae;

/// The official tiling settings (`set_tile_sample_min_size(sample_size, tile_overlap_factor)`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpatialTiles {
    /// Tile edge in pixels (a multiple of the VAE's 16).
    pub sample_size: usize,
    /// Fraction of a tile shared with its neighbour.
    pub overlap: f64,
}

impl SpatialTiles {
    /// musubi-tuner's latent caching default (`--vae_sample_size 128`, overlap 0.25), also the official pipeline's
    /// setting for cards of 21 GB or less.
    pub fn small() -> Self {
        Self {
            sample_size: 128,
            overlap: 0.25,
        }
    }

    /// The official pipeline's setting for cards with more than 21 GB (`sample_size` 256, overlap 0.125).
    pub fn large() -> Self {
        Self {
            sample_size: 256,
            overlap: 0.125,
        }
    }
}

/// One tiling pass: tiles of `tile_in` every `stride` input pixels, outputs blended over `blend` and cropped to
/// `keep` output pixels.
struct Grid {
    tile_in: usize,
    stride: usize,
    blend: usize,
    keep: usize,
}

impl Grid {
    fn new(tile_in: usize, tile_out: usize, overlap: f64) -> Result<Self> {
        // Python's int(): truncation of the products, as officially.
        let stride = (tile_in as f64 * (1.0 - overlap)) as usize;
        let blend = (tile_out as f64 * overlap) as usize;
        if stride == 0 || blend >= tile_out {
            candle_core::bail!(
                "VAE tiling: a {tile_in}-pixel tile with overlap {overlap} leaves no stride or nothing to keep"
            );
        }
        Ok(Self {
            tile_in,
            stride,
            blend,
            keep: tile_out - blend,
        })
    }

    fn run(&self, xs: &Tensor, f: impl Fn(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
        let (_, _, _, h, w) = xs.dims5()?;
        let mut rows: Vec<Vec<Tensor>> = Vec::new();
        for i in (0..h).step_by(self.stride) {
            let mut row: Vec<Tensor> = Vec::new();
            for j in (0..w).step_by(self.stride) {
                let tile = xs.narrow(3, i, self.tile_in.min(h - i))?.narrow(
                    4,
                    j,
                    self.tile_in.min(w - j),
                )?;
                let mut out = f(&tile)?;
                if let Some(above) = rows.last().and_then(|r| r.get(row.len())) {
                    out = blend(above, &out, self.blend, 3)?;
                }
                if let Some(left) = row.last() {
                    out = blend(left, &out, self.blend, 4)?;
                }
                row.push(out);
            }
            rows.push(row);
        }
        let mut joined = Vec::with_capacity(rows.len());
        for row in &rows {
            let cropped = row
                .iter()
                .map(|t| crop(t, self.keep))
                .collect::<Result<Vec<_>>>()?;
            joined.push(Tensor::cat(&cropped, 4)?);
        }
        Tensor::cat(&joined, 3)
    }
}

/// The first `keep` rows and columns of `t`.
fn crop(t: &Tensor, keep: usize) -> Result<Tensor> {
    let (h, w) = (t.dim(3)?, t.dim(4)?);
    t.narrow(3, 0, keep.min(h))?.narrow(4, 0, keep.min(w))
}

/// The official `blend_v` (dim 3) / `blend_h` (dim 4): the first `extent` rows of `b` become
/// `a[−extent + y]·(1 − y/extent) + b[y]·(y/extent)`.
fn blend(a: &Tensor, b: &Tensor, extent: usize, dim: usize) -> Result<Tensor> {
    let extent = extent.min(a.dim(dim)?).min(b.dim(dim)?);
    if extent == 0 {
        return Ok(b.clone());
    }
    let ramp: Vec<f32> = (0..extent)
        .map(|y| (y as f64 / extent as f64) as f32)
        .collect();
    let mut shape = vec![1usize; 5];
    shape[dim] = extent;
    let ramp = Tensor::new(ramp.as_slice(), b.device())?
        .to_dtype(b.dtype())?
        .reshape(shape)?;
    let tail = a.narrow(dim, a.dim(dim)? - extent, extent)?;
    let head = b.narrow(dim, 0, extent)?;
    let mixed = (tail.broadcast_mul(&ramp.affine(-1.0, 1.0)?)? + head.broadcast_mul(&ramp)?)?;
    let rest = b.dim(dim)? - extent;
    if rest == 0 {
        return Ok(mixed);
    }
    Tensor::cat(&[&mixed, &b.narrow(dim, extent, rest)?], dim)
}

impl Hv15Vae {
    /// [`Hv15Vae::encode_moments`] with the official spatial tiling when the frame is larger than a tile
    /// (`tiles` `None`: never tiled).
    pub fn encode_moments_tiled(
        &self,
        video: &Tensor,
        tiles: Option<SpatialTiles>,
        chunk_latents: Option<usize>,
    ) -> Result<Tensor> {
        let (_, _, _, h, w) = video.dims5()?;
        match tiles {
            Some(t) if h > t.sample_size || w > t.sample_size => {
                let latent = t.sample_size / self.cfg.ffactor_spatial.max(1);
                Grid::new(t.sample_size, latent, t.overlap)?
                    .run(video, |tile| self.encode_moments(tile, chunk_latents))
            }
            _ => self.encode_moments(video, chunk_latents),
        }
    }

    /// The latents (the moments' mean) of [`Hv15Vae::encode_moments_tiled`].
    pub fn encode_tiled(
        &self,
        video: &Tensor,
        tiles: Option<SpatialTiles>,
        chunk_latents: Option<usize>,
    ) -> Result<Tensor> {
        self.encode_moments_tiled(video, tiles, chunk_latents)?
            .narrow(1, 0, self.cfg.latent_channels)
    }

    /// [`Hv15Vae::decode`] with the official spatial tiling when the latent frame is larger than a tile's.
    pub fn decode_tiled(
        &self,
        z: &Tensor,
        tiles: Option<SpatialTiles>,
        chunk_latents: Option<usize>,
    ) -> Result<Tensor> {
        let (_, _, _, h, w) = z.dims5()?;
        match tiles {
            Some(t) => {
                let latent = t.sample_size / self.cfg.ffactor_spatial.max(1);
                if h <= latent && w <= latent {
                    return self.decode(z, chunk_latents);
                }
                Grid::new(latent, t.sample_size, t.overlap)?
                    .run(z, |tile| self.decode(tile, chunk_latents))
            }
            None => self.decode(z, chunk_latents),
        }
    }
}
