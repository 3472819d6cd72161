//! Spatially tiled encode and decode: the frame is cut into overlapping tiles (aligned to latent pixels), each
//! tile runs the full chunked causal pipeline, and tiles are blended with linear ramps over the overlaps. Peak
//! memory then depends on the tile size, not the frame size. Tiling is an approximation: the VAE's receptive
//! field (and its per-frame attention) spans more than a tile.

use candle_core::{Result, Tensor};

use super::{LatentStats, WanVae};

/// Tile size and overlap, in latent pixels (×8 or ×16 in video pixels).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TileConfig {
    /// Tile side in latent pixels.
    pub tile: usize,
    /// Overlap between neighbouring tiles in latent pixels (less than `tile`).
    pub overlap: usize,
}

impl Default for TileConfig {
    /// 32-latent tiles (256 px for Wan 2.1, 512 px for Wan 2.2) with an 8-latent overlap.
    fn default() -> Self {
        Self {
            tile: 32,
            overlap: 8,
        }
    }
}

/// Tile starts covering `len`: a stride of `tile − overlap`, the last tile flush with the end.
fn tile_starts(len: usize, tile: usize, overlap: usize) -> Vec<usize> {
    if len <= tile {
        return vec![0];
    }
    let stride = (tile - overlap.min(tile - 1)).max(1);
    let mut starts: Vec<usize> = (0..)
        .map(|i| i * stride)
        .take_while(|&s| s + tile < len)
        .collect();
    starts.push(len - tile);
    starts
}

/// Blend weights per tile along one axis (in output pixels, `scale` per latent pixel): ramps over the parts
/// shared with a neighbour, normalised so the tiles' weights sum to 1 at every pixel.
fn axis_weights(starts: &[usize], tile: usize, len: usize, scale: usize) -> Vec<Vec<f32>> {
    let (tile_px, len_px) = (tile.min(len) * scale, len * scale);
    let raw: Vec<Vec<f32>> = starts
        .iter()
        .enumerate()
        .map(|(k, &s)| {
            let left = k.checked_sub(1).map(|p| (starts[p] + tile - s) * scale);
            let right = starts.get(k + 1).map(|&n| (s + tile - n) * scale);
            (0..tile_px)
                .map(|i| {
                    let mut w = 1.0f32;
                    if let Some(o) = left {
                        w = w.min((i + 1) as f32 / (o + 1) as f32);
                    }
                    if let Some(o) = right {
                        w = w.min((tile_px - i) as f32 / (o + 1) as f32);
                    }
                    w
                })
                .collect()
        })
        .collect();
    let mut total = vec![0f32; len_px];
    for (w, &s) in raw.iter().zip(starts) {
        for (i, v) in w.iter().enumerate() {
            total[s * scale + i] += v;
        }
    }
    raw.into_iter()
        .zip(starts)
        .map(|(w, &s)| {
            w.iter()
                .enumerate()
                .map(|(i, v)| v / total[s * scale + i])
                .collect()
        })
        .collect()
}

/// Runs `f` on every tile of `xs` (dims 3 and 4, `tile` units of `in_scale` pixels) and blends the results
/// (`out_scale` output pixels per unit) into one tensor.
fn tiled<F>(
    xs: &Tensor,
    tiles: &TileConfig,
    in_scale: usize,
    out_scale: usize,
    f: F,
) -> Result<Tensor>
where
    F: Fn(&Tensor) -> Result<Tensor>,
{
    if tiles.tile == 0 {
        candle_core::bail!("tiled VAE: tile size must be positive");
    }
    let (h, w) = (xs.dim(3)? / in_scale, xs.dim(4)? / in_scale);
    let (ys, xs_starts) = (
        tile_starts(h, tiles.tile, tiles.overlap),
        tile_starts(w, tiles.tile, tiles.overlap),
    );
    let (th, tw) = (tiles.tile.min(h), tiles.tile.min(w));
    let wy = axis_weights(&ys, tiles.tile, h, out_scale);
    let wx = axis_weights(&xs_starts, tiles.tile, w, out_scale);
    let dev = xs.device();
    let mut acc: Option<Tensor> = None;
    for (y0, wyk) in ys.iter().zip(&wy) {
        let mut strip: Option<Tensor> = None;
        for (x0, wxk) in xs_starts.iter().zip(&wx) {
            let tile = xs.narrow(3, y0 * in_scale, th * in_scale)?.narrow(
                4,
                x0 * in_scale,
                tw * in_scale,
            )?;
            let out = f(&tile)?;
            let mask_y = Tensor::new(wyk.as_slice(), dev)?.reshape((1, 1, 1, (), 1))?;
            let mask_x = Tensor::new(wxk.as_slice(), dev)?.reshape((1, 1, 1, 1, ()))?;
            let weighted = out
                .broadcast_mul(&mask_y.to_dtype(out.dtype())?)?
                .broadcast_mul(&mask_x.to_dtype(out.dtype())?)?;
            let right = (w - x0 - tw) * out_scale;
            let placed = weighted.pad_with_zeros(4, x0 * out_scale, right)?;
            strip = Some(match strip {
                Some(s) => (s + placed)?,
                None => placed,
            });
        }
        let Some(strip) = strip else { continue };
        let placed = strip.pad_with_zeros(3, y0 * out_scale, (h - y0 - th) * out_scale)?;
        acc = Some(match acc {
            Some(a) => (a + placed)?,
            None => placed,
        });
    }
    match acc {
        Some(a) => Ok(a),
        None => candle_core::bail!("tiled VAE: no tiles"),
    }
}

impl WanVae {
    /// [`WanVae::decode`] over overlapping spatial tiles of the latent.
    pub fn decode_tiled(
        &self,
        z: &Tensor,
        stats: &LatentStats,
        tiles: &TileConfig,
    ) -> Result<Tensor> {
        let raw = stats.denormalize(z)?;
        tiled(&raw, tiles, 1, self.cfg.spatial_factor(), |t| {
            self.decode_raw(t)
        })
    }

    /// [`WanVae::encode`] over overlapping spatial tiles of the video (tile size in latent pixels).
    pub fn encode_tiled(
        &self,
        video: &Tensor,
        stats: &LatentStats,
        tiles: &TileConfig,
    ) -> Result<Tensor> {
        self.check_video(video)?;
        let mu = tiled(video, tiles, self.cfg.spatial_factor(), 1, |t| {
            Ok(self.encode_raw(t)?.0)
        })?;
        stats.normalize(&mu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wan::vae::{VaeConfig, VaeVariant};
    use candle_core::{DType, Device};
    use framesmith_nn::init::{randn, uniform};
    use framesmith_nn::vb::Vb;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn tiles_cover_the_axis_and_weights_sum_to_one() {
        assert_eq!(tile_starts(10, 16, 4), vec![0]);
        assert_eq!(tile_starts(20, 8, 2), vec![0, 6, 12]);
        assert_eq!(tile_starts(16, 8, 2), vec![0, 6, 8]);
        let starts = tile_starts(20, 8, 2);
        let w = axis_weights(&starts, 8, 20, 4);
        let mut total = vec![0f32; 80];
        for (wk, &s) in w.iter().zip(&starts) {
            assert_eq!(wk.len(), 32);
            for (i, v) in wk.iter().enumerate() {
                assert!(*v > 0.0);
                total[s * 4 + i] += v;
            }
        }
        assert!(total.iter().all(|t| (t - 1.0).abs() < 1e-6));
    }

    /// The tiny fixture VAE made spatially pointwise: only the centre tap of every 3×3 kernel kept and the
    /// attention output projection zeroed (its official initial value). Tiling is then exact, so any error in
    /// tile placement, scaling or blending shows up.
    fn pointwise_vae() -> anyhow::Result<WanVae> {
        let dir = crate::fixtures::wan_case("wan21_vae_tiny");
        let mut weights =
            candle_core::safetensors::load(dir.join("weights.safetensors"), &Device::Cpu)?;
        for (key, w) in weights.iter_mut() {
            let dims = w.dims().to_vec();
            let (kh, kw) = match dims.as_slice() {
                [.., kh, kw] if dims.len() >= 4 => (*kh, *kw),
                _ => continue,
            };
            if key.ends_with("proj.weight") {
                *w = w.zeros_like()?;
            } else if kh == 3 && kw == 3 {
                let mut mask = vec![0f32; 9];
                mask[4] = 1.0;
                let mut shape = vec![1usize; dims.len() - 2];
                shape.extend([3, 3]);
                *w = w.broadcast_mul(&Tensor::from_vec(mask, shape, &Device::Cpu)?)?;
            }
        }
        let cfg = VaeConfig {
            variant: VaeVariant::Wan21,
            dim: 8,
            dec_dim: 8,
            z_dim: 16,
            dim_mult: vec![1, 2, 2, 2],
            num_res_blocks: 1,
            attn_scales: vec![],
            temporal_downsample: vec![false, true, true],
        };
        Ok(WanVae::new(
            &cfg,
            &Vb::from_tensors(weights, DType::F32, &Device::Cpu),
        )?)
    }

    fn max_abs_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
        (a - b)?.abs()?.max_all()?.to_scalar::<f32>()
    }

    #[test]
    fn tiled_decode_and_encode_match_untiled_for_a_pointwise_vae() -> anyhow::Result<()> {
        let vae = pointwise_vae()?;
        let dev = Device::Cpu;
        let stats = LatentStats::official(VaeVariant::Wan21, &dev)?;
        let z = randn(
            &mut StdRng::seed_from_u64(37),
            (1, 16, 2, 6, 6),
            0.0,
            1.0,
            &dev,
        )?;
        let full = vae.decode(&z, &stats)?;
        let tiled = vae.decode_tiled(
            &z,
            &stats,
            &TileConfig {
                tile: 4,
                overlap: 2,
            },
        )?;
        assert_eq!(tiled.dims(), &[1, 3, 5, 48, 48]);
        let err = max_abs_diff(&tiled, &full)?;
        println!("tiled decode max abs diff {err:e}");
        assert!(err < 1e-5, "tiled decode differs by {err}");
        let one_tile = vae.decode_tiled(
            &z,
            &stats,
            &TileConfig {
                tile: 6,
                overlap: 2,
            },
        )?;
        assert!(max_abs_diff(&one_tile, &full)? == 0.0);

        let video = uniform(
            &mut StdRng::seed_from_u64(53),
            (1, 3, 5, 32, 32),
            -1.0,
            1.0,
            &dev,
        )?;
        let full = vae.encode(&video, &stats)?;
        let tiled = vae.encode_tiled(
            &video,
            &stats,
            &TileConfig {
                tile: 2,
                overlap: 1,
            },
        )?;
        assert_eq!(tiled.dims(), &[1, 16, 2, 4, 4]);
        let err = max_abs_diff(&tiled, &full)?;
        println!("tiled encode max abs diff {err:e}");
        assert!(err < 1e-5, "tiled encode differs by {err}");
        Ok(())
    }
}
