//! Tiled encode and decode of LTX-2's video VAE as ltx-core does them (`ltx_core/tiling.py`,
//! `VideoEncoder.tiled_encode`, `ConvVideoDecoder.tiled_decode`): a `TileSizeConfig` (tile and overlap per axis
//! in frames and pixels) splits the latent grid into overlapping intervals (time split causally: each tile after
//! the first starts one latent frame earlier, so that its lone first frame is blended out), each tile runs
//! alone, and the results are summed with separable trapezoidal masks and divided by the summed masks (unless
//! those already sum to one).

use candle_core::{DType, Result, Tensor};

use super::{DecodeConditioning, Ltx2Vae};

/// One axis's tiles: size and overlap in frames (time) or pixels (space).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AxisTiles {
    pub tile: usize,
    pub overlap: usize,
}

/// A `TileSizeConfig`: which axes are tiled, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VaeTiling {
    pub frames: Option<AxisTiles>,
    pub height: Option<AxisTiles>,
    pub width: Option<AxisTiles>,
}

impl VaeTiling {
    /// ltx-core's `TileSizeConfig.default()`: 80 frames with 24 shared, 768 pixels with 64 shared.
    pub fn official() -> Self {
        let space = Some(AxisTiles {
            tile: 768,
            overlap: 64,
        });
        Self {
            frames: Some(AxisTiles {
                tile: 80,
                overlap: 24,
            }),
            height: space,
            width: space,
        }
    }
}

/// One interval of an axis of the latent grid, with its blend ramps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Interval {
    pub start: usize,
    pub end: usize,
    pub left: usize,
    pub right: usize,
}

/// `split_by_size(size, overlap)` on an axis of `n`.
pub(crate) fn split_by_size(n: usize, size: usize, overlap: usize) -> Vec<Interval> {
    if n <= size {
        return vec![Interval {
            start: 0,
            end: n,
            left: 0,
            right: 0,
        }];
    }
    let step = size - overlap;
    let amount = (n + size - 2 * overlap - 1) / step;
    let mut out = vec![Interval {
        start: 0,
        end: size,
        left: 0,
        right: overlap,
    }];
    for i in 1..amount.saturating_sub(1) {
        out.push(Interval {
            start: i * step,
            end: i * step + size,
            left: overlap,
            right: overlap,
        });
    }
    out.push(Interval {
        start: (amount - 1) * step,
        end: n,
        left: overlap,
        right: 0,
    });
    out
}

/// `split_temporal_causal(size, overlap)`: every tile after the first one latent frame earlier.
pub(crate) fn split_causal(n: usize, size: usize, overlap: usize) -> Vec<Interval> {
    let mut out = split_by_size(n, size, overlap);
    for iv in out.iter_mut().skip(1) {
        iv.start -= 1;
        iv.left += 1;
    }
    out
}

/// `compute_trapezoidal_mask_1d(len, left, right, left_starts_from_0)`.
pub(crate) fn trapezoid(len: usize, left: usize, right: usize, from_zero: bool) -> Vec<f32> {
    let (left, right) = (left.min(len), right.min(len));
    let mut mask = vec![1f32; len];
    for (i, m) in mask.iter_mut().take(left).enumerate() {
        *m *= if from_zero {
            i as f32 / left as f32
        } else {
            (i + 1) as f32 / (left + 1) as f32
        };
    }
    for (i, m) in mask.iter_mut().skip(len - right).enumerate() {
        *m *= 1.0 - (i + 1) as f32 / (right + 1) as f32;
    }
    mask
}

/// The latent intervals of an axis of `n` latents tiled by `tiles` (in units of `factor` per latent); `temporal`
/// splits causally. Sizes that are not on the VAE's grid are refused as ltx-core refuses them.
fn axis_intervals(
    n: usize,
    tiles: Option<AxisTiles>,
    factor: usize,
    (name, temporal): (&str, bool),
) -> Result<Vec<Interval>> {
    let Some(t) = tiles else {
        return Ok(split_by_size(n, n, 0));
    };
    if t.tile < 2 * factor || t.tile % factor != 0 || t.overlap % factor != 0 || t.overlap >= t.tile
    {
        candle_core::bail!(
            "LTX-2 VAE tiling: {name} tiles of {} with overlap {} must be multiples of {factor}, at least {}, and \
             overlap less than the tile",
            t.tile,
            t.overlap,
            2 * factor
        );
    }
    let overlap = t.overlap / factor;
    let size = (t.tile / factor).max(2).max(overlap + 1);
    Ok(if temporal {
        if n <= size {
            split_by_size(n, n, 0)
        } else {
            split_causal(n, size, overlap)
        }
    } else {
        split_by_size(n, size, overlap)
    })
}

/// One tile: where it reads (latent or pixel ranges per axis t, h, w), where it writes, and its masks.
struct Tile {
    input: [(usize, usize); 3],
    output: [(usize, usize); 3],
    masks: [Vec<f32>; 3],
}

/// Sums tiles' results weighted by their masks into a buffer of `shape` [b, c, t, h, w] and divides by the
/// summed weights unless every axis's masks already sum to one.
struct Blend {
    acc: Tensor,
    weights: Tensor,
    axis_sums: [Vec<f32>; 3],
}

impl Blend {
    fn new(
        shape: (usize, usize, usize, usize, usize),
        device: &candle_core::Device,
    ) -> Result<Self> {
        let (_, _, t, h, w) = shape;
        Ok(Self {
            acc: Tensor::zeros(shape, DType::F32, device)?,
            weights: Tensor::zeros((1, 1, t, h, w), DType::F32, device)?,
            axis_sums: [vec![0.0; t], vec![0.0; h], vec![0.0; w]],
        })
    }

    fn add(&mut self, tile: &Tile, ys: &Tensor, seen: &mut [Vec<(usize, usize)>; 3]) -> Result<()> {
        let device = ys.device();
        let mut mask: Option<Tensor> = None;
        for (axis, m) in tile.masks.iter().enumerate() {
            let mut shape = [1usize; 5];
            shape[axis + 2] = m.len();
            let m1 = Tensor::from_slice(m, m.len(), device)?.reshape(shape.to_vec())?;
            mask = Some(match mask {
                Some(acc) => acc.broadcast_mul(&m1)?,
                None => m1,
            });
            let range = tile.output[axis];
            if !seen[axis].contains(&range) {
                seen[axis].push(range);
                for (i, v) in m.iter().enumerate() {
                    self.axis_sums[axis][range.0 + i] += v;
                }
            }
        }
        let Some(mask) = mask else {
            candle_core::bail!("a tile without axes");
        };
        let ys = ys.to_dtype(DType::F32)?.broadcast_mul(&mask)?;
        let (b, c, _, _, _) = self.acc.dims5()?;
        let [t, h, w] = tile.output.map(|(a, e)| a..e);
        self.acc = add_at(
            &self.acc,
            [0..b, 0..c, t.clone(), h.clone(), w.clone()],
            &ys,
        )?;
        self.weights = add_at(&self.weights, [0..1, 0..1, t, h, w], &mask)?;
        Ok(())
    }

    fn finish(self) -> Result<Tensor> {
        let complementary = self
            .axis_sums
            .iter()
            .all(|sums| sums.iter().all(|s| (s - 1.0).abs() <= 1e-5));
        if complementary {
            return Ok(self.acc);
        }
        self.acc.broadcast_div(&self.weights.maximum(1e-8)?)
    }
}

/// `buf` with `src` added over `ranges`.
fn add_at(buf: &Tensor, ranges: [std::ops::Range<usize>; 5], src: &Tensor) -> Result<Tensor> {
    let mut cur = buf.clone();
    for (axis, r) in ranges.iter().enumerate() {
        cur = cur.narrow(axis, r.start, r.len())?;
    }
    buf.slice_assign(&ranges, &cur.broadcast_add(src)?)
}

/// `xs` [b, c, t, h, w] cut to `ranges` of its last three axes.
fn cut(xs: &Tensor, ranges: &[(usize, usize); 3]) -> Result<Tensor> {
    let mut part = xs.clone();
    for (axis, &(a, b)) in ranges.iter().enumerate() {
        part = part.narrow(axis + 2, a, b - a)?;
    }
    Ok(part)
}

/// Runs `f` on each tile's input (and where it reads) and blends the results into a tensor of `shape`.
fn run_tiles(
    xs: &Tensor,
    tiles: &[Tile],
    shape: (usize, usize, usize, usize, usize),
    f: impl Fn(&Tensor, &[(usize, usize); 3]) -> Result<Tensor>,
) -> Result<Tensor> {
    let mut blend = Blend::new(shape, xs.device())?;
    let mut seen: [Vec<(usize, usize)>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    for tile in tiles {
        let ys = f(&cut(xs, &tile.input)?, &tile.input)?;
        let want: Vec<usize> = tile.output.iter().map(|&(a, b)| b - a).collect();
        if ys.dims()[2..] != want[..] {
            candle_core::bail!(
                "LTX-2 VAE tiling: a tile gave {:?}, expected {want:?}",
                ys.dims()
            );
        }
        blend.add(tile, &ys, &mut seen)?;
    }
    blend.finish()
}

impl Ltx2Vae {
    /// [`Ltx2Vae::encode`] in tiles (`VideoEncoder.tiled_encode`); ltx-core asks for at least 16 frames and 64
    /// pixels of overlap on tiled axes.
    pub fn encode_tiled(&self, video: &Tensor, tiling: &VaeTiling) -> Result<Tensor> {
        let (b, c, t, h, w) = video.dims5()?;
        let (fs, ft) = self.cfg.encoder_factors();
        if c != self.cfg.in_channels || t == 0 || (t - 1) % ft != 0 || h % fs != 0 || w % fs != 0 {
            return self.encode(video);
        }
        for (name, axis, least) in [
            ("frames", tiling.frames, 16),
            ("height", tiling.height, 64),
            ("width", tiling.width, 64),
        ] {
            if let Some(a) = axis.filter(|a| a.overlap < least) {
                candle_core::bail!(
                    "LTX-2 VAE tiled encode: {name} overlap {} is below the required {least}",
                    a.overlap
                );
            }
        }
        let (lt, lh, lw) = ((t - 1) / ft + 1, h / fs, w / fs);
        let ts = axis_intervals(lt, tiling.frames, ft, ("frames", true))?;
        let hs = axis_intervals(lh, tiling.height, fs, ("height", false))?;
        let ws = axis_intervals(lw, tiling.width, fs, ("width", false))?;
        let mut tiles = Vec::new();
        for it in &ts {
            for ih in &hs {
                for iw in &ws {
                    tiles.push(Tile {
                        input: [
                            (it.start * ft, 1 + (it.end - 1) * ft),
                            (ih.start * fs, ih.end * fs),
                            (iw.start * fs, iw.end * fs),
                        ],
                        output: [(it.start, it.end), (ih.start, ih.end), (iw.start, iw.end)],
                        masks: [
                            trapezoid(it.end - it.start, it.left, it.right, true),
                            trapezoid(ih.end - ih.start, ih.left, ih.right, false),
                            trapezoid(iw.end - iw.start, iw.left, iw.right, false),
                        ],
                    });
                }
            }
        }
        let shape = (b, self.cfg.latent_channels, lt, lh, lw);
        run_tiles(video, &tiles, shape, |tile, _| self.encode(tile))
    }

    /// [`Ltx2Vae::decode`] in tiles (`ConvVideoDecoder.tiled_decode`, its chunks joined). A timestep-conditioned
    /// decoder mixes each tile with the part of `cond.noise` (of `z`'s shape) under it, so that a seeded noise
    /// gives the same clip however it is tiled; without one, each tile draws its own.
    pub fn decode_tiled(
        &self,
        z: &Tensor,
        tiling: &VaeTiling,
        cond: &DecodeConditioning,
    ) -> Result<Tensor> {
        if let Some(noise) = cond.noise.as_ref().filter(|n| n.dims() != z.dims()) {
            candle_core::bail!(
                "LTX-2 VAE tiled decode: the noise is {:?}, the latents {:?}; give noise of the latents' shape",
                noise.dims(),
                z.dims()
            );
        }
        let (b, _, f, h, w) = z.dims5()?;
        let (fs, ft) = self.cfg.decoder_factors();
        let ts = axis_intervals(f, tiling.frames, ft, ("frames", true))?;
        let hs = axis_intervals(h, tiling.height, fs, ("height", false))?;
        let ws = axis_intervals(w, tiling.width, fs, ("width", false))?;
        let time = |iv: &Interval| -> ((usize, usize), Vec<f32>) {
            let out = (iv.start * ft, 1 + (iv.end - 1) * ft);
            let left = if iv.left == 0 {
                0
            } else {
                1 + (iv.left - 1) * ft
            };
            (out, trapezoid(out.1 - out.0, left, iv.right * ft, true))
        };
        let space = |iv: &Interval| -> ((usize, usize), Vec<f32>) {
            let out = (iv.start * fs, iv.end * fs);
            (
                out,
                trapezoid(out.1 - out.0, iv.left * fs, iv.right * fs, false),
            )
        };
        let mut tiles = Vec::new();
        for it in &ts {
            for ih in &hs {
                for iw in &ws {
                    let (ot, mt) = time(it);
                    let (oh, mh) = space(ih);
                    let (ow, mw) = space(iw);
                    tiles.push(Tile {
                        input: [(it.start, it.end), (ih.start, ih.end), (iw.start, iw.end)],
                        output: [ot, oh, ow],
                        masks: [mt, mh, mw],
                    });
                }
            }
        }
        let shape = (b, self.cfg.out_channels, (f - 1) * ft + 1, h * fs, w * fs);
        run_tiles(z, &tiles, shape, |tile, ranges| {
            let noise = cond.noise.as_ref().map(|n| cut(n, ranges)).transpose()?;
            let cond = DecodeConditioning {
                noise,
                ..cond.clone()
            };
            self.decode(tile, &cond)
        })
    }
}
