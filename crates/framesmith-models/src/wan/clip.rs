//! The CLIP image encoder of Wan2.1 I2V (`CLIPModel.visual` of `wan/modules/clip.py`): the visual tower of
//! open-clip `xlm-roberta-large-vit-huge-14` — a ViT-H/14 with a bias-free patch convolution, class token,
//! learned positions, `pre_norm` LayerNorm and pre-norm blocks (fused qkv attention, exact-GELU MLP) — read with
//! the official key names under `visual.` and run up to the penultimate block, as Wan does (`use_31_block`).
//! Images go in as `[3, H, W]` in [−1, 1] (bicubic resize and CLIP normalisation in [`preprocess`]); features
//! come out as `[1, 257, 1280]` for the DiT's `img_emb`.

pub mod preprocess;
mod weights;

use candle_core::{DType, Result, Tensor};

use framesmith_nn::linear::Linear;
use framesmith_nn::norm::layer_norm;
use framesmith_nn::vb::Vb;

pub use weights::load_clip_vision;

/// Sizes of the visual tower (constructor arguments of the official `VisionTransformer`) and its input
/// normalisation.
#[derive(Debug, Clone, PartialEq)]
pub struct ClipVisionConfig {
    /// Square input side in pixels.
    pub image_size: usize,
    pub patch_size: usize,
    /// Width of the tokens.
    pub dim: usize,
    /// Hidden width of the MLP (`dim · mlp_ratio`).
    pub mlp_dim: usize,
    pub num_heads: usize,
    /// Blocks in the checkpoint; Wan runs all but the last.
    pub num_layers: usize,
    /// LayerNorm epsilon.
    pub eps: f64,
    /// Per-channel mean and std applied to pixels in [0, 1].
    pub mean: [f64; 3],
    pub std: [f64; 3],
}

impl ClipVisionConfig {
    /// ViT-H/14 of `clip_xlm_roberta_vit_h_14` as Wan uses it: 224 px, 32 blocks of width 1280, 16 heads,
    /// MLP ratio 4, OpenAI CLIP normalisation.
    pub fn vit_h_14() -> Self {
        Self {
            image_size: 224,
            patch_size: 14,
            dim: 1280,
            mlp_dim: 5120,
            num_heads: 16,
            num_layers: 32,
            eps: 1e-5,
            mean: [0.48145466, 0.4578275, 0.40821073],
            std: [0.26862954, 0.26130258, 0.27577711],
        }
    }

    /// The tiny tower of the parity fixture (`tests/reference/clip_tiny.py`): 28 px, patch 7, 3 blocks of
    /// width 32, 4 heads, MLP width 64.
    pub fn tiny() -> Self {
        Self {
            image_size: 28,
            patch_size: 7,
            dim: 32,
            mlp_dim: 64,
            num_heads: 4,
            num_layers: 3,
            ..Self::vit_h_14()
        }
    }

    /// Tokens per image: the class token plus one per patch (257 for ViT-H/14).
    pub fn tokens(&self) -> usize {
        let g = self.image_size / self.patch_size.max(1);
        g * g + 1
    }
}

/// A LayerNorm's affine parameters, kept in f32 (the official `LayerNorm` computes in f32).
struct Norm {
    weight: Tensor,
    bias: Tensor,
}

impl Norm {
    fn new(vb: &Vb, dim: usize) -> Result<Self> {
        let vb = vb.with_dtype(DType::F32);
        Ok(Self {
            weight: vb.get(dim, "weight")?,
            bias: vb.get(dim, "bias")?,
        })
    }

    fn forward(&self, xs: &Tensor, eps: f64) -> Result<Tensor> {
        layer_norm(xs, Some(&self.weight), Some(&self.bias), eps)
    }
}

/// One pre-norm transformer block (`transformer.{i}`).
struct AttentionBlock {
    norm1: Norm,
    to_qkv: Linear,
    proj: Linear,
    norm2: Norm,
    fc1: Linear,
    fc2: Linear,
    num_heads: usize,
    eps: f64,
}

impl AttentionBlock {
    fn new(cfg: &ClipVisionConfig, vb: &Vb) -> Result<Self> {
        let d = cfg.dim;
        Ok(Self {
            norm1: Norm::new(&vb.pp("norm1"), d)?,
            to_qkv: Linear::load(&vb.pp("attn").pp("to_qkv"), d, 3 * d)?,
            proj: Linear::load(&vb.pp("attn").pp("proj"), d, d)?,
            norm2: Norm::new(&vb.pp("norm2"), d)?,
            fc1: Linear::load(&vb.pp("mlp").pp(0), d, cfg.mlp_dim)?,
            fc2: Linear::load(&vb.pp("mlp").pp(2), cfg.mlp_dim, d)?,
            num_heads: cfg.num_heads,
            eps: cfg.eps,
        })
    }

    /// Full (unmasked) self-attention over `xs` [b, s, c]; scores and softmax in f32.
    fn attention(&self, xs: &Tensor) -> Result<Tensor> {
        let (b, s, c) = xs.dims3()?;
        let (n, d) = (self.num_heads, c / self.num_heads);
        let qkv = self
            .to_qkv
            .forward(xs)?
            .reshape((b, s, 3, n, d))?
            .permute((2, 0, 3, 1, 4))?;
        let head = |i: usize| qkv.get(i)?.contiguous();
        let (q, k, v) = (head(0)?, head(1)?, head(2)?);
        let scores = (q.matmul(&k.t()?)? * (1.0 / (d as f64).sqrt()))?;
        let weights = framesmith_nn::ops::softmax_last_dim(&scores.to_dtype(DType::F32)?)?;
        let out = weights.to_dtype(v.dtype())?.matmul(&v)?;
        self.proj.forward(&out.transpose(1, 2)?.reshape((b, s, c))?)
    }

    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let xs = (xs + self.attention(&self.norm1.forward(xs, self.eps)?)?)?;
        let h = self.fc1.forward(&self.norm2.forward(&xs, self.eps)?)?;
        &xs + self.fc2.forward(&h.gelu_erf()?)?
    }
}

/// The CLIP visual tower up to its penultimate block.
pub struct ClipVision {
    cfg: ClipVisionConfig,
    /// The patch convolution as a matrix [dim, 3·p·p] (it has no bias when `pre_norm` is on).
    patch_embedding: Linear,
    cls_embedding: Tensor,
    pos_embedding: Tensor,
    pre_norm: Norm,
    blocks: Vec<AttentionBlock>,
}

impl ClipVision {
    /// Builds the tower from official names under `vb` (`visual.` stripped): `patch_embedding.weight`,
    /// `cls_embedding`, `pos_embedding`, `pre_norm.*`, `transformer.{i}.*`. The last block is not loaded: Wan
    /// never runs it.
    pub fn new(cfg: &ClipVisionConfig, vb: &Vb) -> Result<Self> {
        let (d, p) = (cfg.dim, cfg.patch_size);
        if cfg.num_layers < 2 || cfg.num_heads == 0 || d % cfg.num_heads != 0 {
            candle_core::bail!(
                "CLIP config: needs at least 2 blocks and a width divisible by the heads"
            );
        }
        let patch = vb
            .get((d, 3, p, p), "patch_embedding.weight")?
            .reshape((d, 3 * p * p))?;
        let blocks = (0..cfg.num_layers - 1)
            .map(|i| AttentionBlock::new(cfg, &vb.pp("transformer").pp(i)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            cfg: cfg.clone(),
            patch_embedding: Linear::from_weights(patch, None),
            cls_embedding: vb.get((1, 1, d), "cls_embedding")?,
            pos_embedding: vb.get((1, cfg.tokens(), d), "pos_embedding")?,
            pre_norm: Norm::new(&vb.pp("pre_norm"), d)?,
            blocks,
        })
    }

    /// The architecture this tower was built with.
    pub fn config(&self) -> &ClipVisionConfig {
        &self.cfg
    }

    /// Features [b, tokens, dim] of normalised pixels [b, 3, S, S] after every block but the last.
    pub fn forward(&self, pixels: &Tensor) -> Result<Tensor> {
        let (b, c, h, w) = pixels.dims4()?;
        let (s, p) = (self.cfg.image_size, self.cfg.patch_size);
        if (c, h, w) != (3, s, s) {
            candle_core::bail!(
                "CLIP expects pixels [b, 3, {s}, {s}], got {:?}",
                pixels.dims()
            );
        }
        let g = s / p;
        let patches = pixels
            .to_dtype(self.cls_embedding.dtype())?
            .reshape(&[b, 3, g, p, g, p][..])?
            .permute(vec![0, 2, 4, 1, 3, 5])?
            .reshape((b, g * g, 3 * p * p))?;
        let tokens = self.patch_embedding.forward(&patches)?;
        let cls = self.cls_embedding.broadcast_as((b, 1, self.cfg.dim))?;
        let xs = Tensor::cat(&[&cls, &tokens], 1)?.broadcast_add(&self.pos_embedding)?;
        let mut xs = self.pre_norm.forward(&xs, self.cfg.eps)?;
        for block in &self.blocks {
            xs = block.forward(&xs)?;
        }
        Ok(xs)
    }

    /// Features [1, tokens, dim] of one image [3, H, W] in [−1, 1], preprocessed as the official
    /// `CLIPModel.visual`.
    pub fn encode_image(&self, image: &Tensor) -> Result<Tensor> {
        let pixels = preprocess::clip_pixels(image, &self.cfg)?;
        self.forward(&pixels.unsqueeze(0)?)
    }
}

#[cfg(test)]
mod tests;
