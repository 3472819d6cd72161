//! The Qwen2.5-VL vision tower (`Qwen2_5_VisionTransformerPretrainedModel`): the patch embedding (a Conv3d whose
//! kernel equals its stride, so a matmul over the processor's flattened patches), the 2-D rotary embedding, the
//! blocks with window attention (full attention at `fullatt_block_indexes`) over the patches reordered window by
//! window, and the patch merger (RMSNorm, 2×2 patches concatenated, MLP with GELU) whose output is put back in the
//! processor's order. Names are the checkpoint's without the `visual.` prefix. Frozen: inference only.

use candle_core::{DType, Device, Result, Tensor};

use super::block::{Segments, VisionBlock, EPS};
use super::window::{full_seqlens, inverse, patch_positions, window_index, Grid};
use super::Qwen25VlVisionConfig;
use framesmith_nn::linear::Linear;
use framesmith_nn::norm::rms_norm;
use framesmith_nn::vb::Vb;

/// `Qwen2_5_VLPatchMerger`.
struct Merger {
    ln_q: Tensor,
    mlp_0: Linear,
    mlp_2: Linear,
    width: usize,
}

impl Merger {
    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let (n, _) = xs.dims2()?;
        let xs = rms_norm(xs, Some(&self.ln_q), EPS)?
            .reshape((n * xs.dim(1)? / self.width, self.width))?;
        self.mlp_2.forward(&self.mlp_0.forward(&xs)?.gelu_erf()?)
    }
}

/// The vision tower.
pub struct Qwen25VlVision {
    patch_embed: Linear,
    blocks: Vec<VisionBlock>,
    merger: Merger,
    cfg: Qwen25VlVisionConfig,
    device: Device,
}

impl Qwen25VlVision {
    /// Builds the tower from `vb` (names without the `visual.` prefix) on `vb.device()`.
    pub fn new(cfg: &Qwen25VlVisionConfig, vb: &Vb) -> Result<Self> {
        if let Err(e) = cfg.validate() {
            candle_core::bail!("{e}");
        }
        let (h, t, p) = (cfg.hidden_size, cfg.temporal_patch_size, cfg.patch_size);
        let conv = vb
            .pp("patch_embed")
            .pp("proj")
            .get((h, 3, t, p, p), "weight")?;
        let width = h * cfg.spatial_merge_size * cfg.spatial_merge_size;
        let merger = vb.pp("merger");
        Ok(Self {
            patch_embed: Linear::from_weights(conv.reshape((h, cfg.patch_dim()))?, None),
            blocks: (0..cfg.depth)
                .map(|i| VisionBlock::new(cfg, &vb.pp("blocks").pp(i)))
                .collect::<Result<Vec<_>>>()?,
            merger: Merger {
                ln_q: merger.pp("ln_q").get(h, "weight")?,
                mlp_0: Linear::load(&merger.pp("mlp").pp("0"), width, width)?,
                mlp_2: Linear::load(&merger.pp("mlp").pp("2"), width, cfg.out_hidden_size)?,
                width,
            },
            cfg: cfg.clone(),
            device: vb.device().clone(),
        })
    }

    /// The tower's sizes.
    pub fn config(&self) -> &Qwen25VlVisionConfig {
        &self.cfg
    }

    /// The device it runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The compute dtype.
    pub fn dtype(&self) -> DType {
        self.merger.ln_q.dtype()
    }

    /// The cosine and sine tables [n, head_dim] (f32) of the patches at `positions` (row, column):
    /// `cat(row·inv_freq, column·inv_freq)` twice, as `Qwen2_5_VLVisionRotaryEmbedding` lays them out.
    fn rope(&self, positions: &[(usize, usize)]) -> Result<(Tensor, Tensor)> {
        let d = self.cfg.head_dim();
        let quarter = d / 4;
        let inv: Vec<f32> = (0..quarter)
            .map(|i| (1.0 / self.cfg.rope_theta.powf((2 * i) as f64 / (d / 2) as f64)) as f32)
            .collect();
        let mut angles = Vec::with_capacity(positions.len() * d);
        for &(y, x) in positions {
            let half: Vec<f32> = inv
                .iter()
                .map(|f| y as f32 * f)
                .chain(inv.iter().map(|f| x as f32 * f))
                .collect();
            angles.extend_from_slice(&half);
            angles.extend_from_slice(&half);
        }
        let angles = Tensor::from_vec(angles, (positions.len(), d), &self.device)?;
        Ok((angles.cos()?, angles.sin()?))
    }

    /// Rows of `xs` [n, ...] reordered by `index` over groups of `merge²` consecutive rows.
    fn permute_groups(&self, xs: &Tensor, index: &[usize]) -> Result<Tensor> {
        let unit = self.cfg.spatial_merge_size * self.cfg.spatial_merge_size;
        let rows: Vec<u32> = index
            .iter()
            .flat_map(|&g| (0..unit).map(move |j| (g * unit + j) as u32))
            .collect();
        let n = rows.len();
        xs.index_select(&Tensor::from_vec(rows, n, xs.device())?, 0)
    }

    /// The merged embeddings [Σ t·h·w / merge², out_hidden] of `pixels` [Σ t·h·w, patch_dim] (the processor's
    /// `pixel_values`, images one after the other) with `grids` (its `image_grid_thw`), in the processor's
    /// order: what transformers' `get_image_features` returns, concatenated.
    pub fn forward(&self, pixels: &Tensor, grids: &[Grid]) -> Result<Tensor> {
        let merge = self.cfg.spatial_merge_size;
        let n: usize = grids.iter().map(|[t, h, w]| t * h * w).sum();
        if pixels.dims() != [n, self.cfg.patch_dim()] {
            candle_core::bail!(
                "Qwen2.5-VL vision: pixel values of shape {:?} do not match grids {grids:?} ([{n}, {}] expected)",
                pixels.dims(),
                self.cfg.patch_dim()
            );
        }
        if grids
            .iter()
            .any(|[_, h, w]| h % merge != 0 || w % merge != 0)
        {
            candle_core::bail!("Qwen2.5-VL vision: grids {grids:?} are not multiples of {merge}");
        }
        let (index, cu_windows) = window_index(grids, merge, self.cfg.merged_window());
        let xs = pixels.to_device(&self.device)?.to_dtype(self.dtype())?;
        let xs = self.permute_groups(&self.patch_embed.forward(&xs)?, &index)?;
        let (cos, sin) = self.rope(&patch_positions(grids, merge))?;
        let rope = (
            self.permute_groups(&cos, &index)?,
            self.permute_groups(&sin, &index)?,
        );
        let full = Segments::new(&full_seqlens(grids), &self.device)?;
        let windows = Segments::new(&cu_windows, &self.device)?;
        let mut xs = xs;
        for (i, block) in self.blocks.iter().enumerate() {
            let segments = if self.cfg.fullatt_block_indexes.contains(&i) {
                &full
            } else {
                &windows
            };
            xs = block.forward(&xs, &rope, segments)?;
        }
        let merged = self.merger.forward(&xs)?;
        let back: Vec<u32> = inverse(&index).into_iter().map(|i| i as u32).collect();
        let m = back.len();
        merged.index_select(&Tensor::from_vec(back, m, &self.device)?, 0)
    }
}
