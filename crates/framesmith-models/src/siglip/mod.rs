//! SigLIP's vision tower, transformers' `SiglipVisionModel` up to its `last_hidden_state`, for every family that
//! conditions on SigLIP image features; HunyuanVideo 1.5's image-to-video takes FLUX.1-Redux-dev's
//! `image_encoder` (siglip-so400m-patch14-384) as the official `VisionEncoder("siglip")` and musubi-tuner run it
//! (github:Tencent-Hunyuan/HunyuanVideo-1.5 @60783e7, `hyvideo/models/vision_encoder/__init__.py`). A patch
//! convolution with a bias plus learned positions (no class token), pre-norm layers (LayerNorm, attention with
//! q/k/v projections, LayerNorm, tanh-GELU MLP, each with a residual) and `post_layernorm`; the attention-pooling
//! head is neither loaded nor run. Images are prepared as `SiglipImageProcessor` prepares them ([`preprocess`]);
//! the files users have are found, read and named by [`files`].

pub mod files;
pub mod preprocess;

use candle_core::{Result, Tensor};
use image::RgbImage;

use framesmith_nn::linear::Linear;
use framesmith_nn::norm::AffineNorm;
use framesmith_nn::vb::Vb;

pub use files::{identify, load_siglip, siglip_weights_file, SiglipFile, SIGLIP_FILES};

/// The tower's sizes (transformers' `SiglipVisionConfig`).
#[derive(Debug, Clone, PartialEq)]
pub struct SiglipVisionConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// Square input side in pixels.
    pub image_size: usize,
    pub patch_size: usize,
    pub layer_norm_eps: f64,
}

impl SiglipVisionConfig {
    /// siglip-so400m-patch14-384, FLUX.1-Redux-dev's `image_encoder`: 27 layers of width 1152 (16 heads of 72),
    /// MLP 4304, 384-pixel images in 14-pixel patches (729 tokens).
    pub fn so400m_patch14_384() -> Self {
        Self {
            hidden_size: 1152,
            intermediate_size: 4304,
            num_hidden_layers: 27,
            num_attention_heads: 16,
            image_size: 384,
            patch_size: 14,
            layer_norm_eps: 1e-6,
        }
    }

    /// Patches per side: the patch convolution's outputs, so pixels past the last whole patch are not seen (6 of
    /// so400m-patch14-384's 384).
    pub fn grid(&self) -> usize {
        self.image_size / self.patch_size.max(1)
    }

    /// Tokens per image, one per patch (729 for so400m-patch14-384).
    pub fn tokens(&self) -> usize {
        self.grid() * self.grid()
    }

    /// What is wrong with the sizes, if anything.
    fn check(&self) -> std::result::Result<(), String> {
        let (d, h, p) = (self.hidden_size, self.num_attention_heads, self.patch_size);
        if d == 0 || h == 0 || d % h != 0 {
            return Err(format!("a width of {d} does not split into {h} heads"));
        }
        if p == 0 || self.image_size < p || self.num_hidden_layers == 0 {
            return Err(format!(
                "{} layers over {}-pixel images in {p}-pixel patches make no tower",
                self.num_hidden_layers, self.image_size
            ));
        }
        Ok(())
    }
}

/// One encoder layer (`encoder.layers.{i}`).
struct EncoderLayer {
    layer_norm1: AffineNorm,
    /// `self_attn.{q,k,v}_proj` as one projection to [q; k; v].
    qkv: Linear,
    out_proj: Linear,
    layer_norm2: AffineNorm,
    fc1: Linear,
    fc2: Linear,
    num_heads: usize,
}

impl EncoderLayer {
    fn new(cfg: &SiglipVisionConfig, vb: &Vb) -> Result<Self> {
        let (d, eps) = (cfg.hidden_size, cfg.layer_norm_eps);
        let attn = vb.pp("self_attn");
        let (mut weights, mut biases) = (Vec::with_capacity(3), Vec::with_capacity(3));
        for name in ["q_proj", "k_proj", "v_proj"] {
            let vb = attn.pp(name);
            weights.push(vb.get((d, d), "weight")?);
            biases.push(vb.get(d, "bias")?);
        }
        Ok(Self {
            layer_norm1: AffineNorm::new(d, eps, &vb.pp("layer_norm1"))?,
            qkv: Linear::from_weights(Tensor::cat(&weights, 0)?, Some(Tensor::cat(&biases, 0)?)),
            out_proj: Linear::load(&attn.pp("out_proj"), d, d)?,
            layer_norm2: AffineNorm::new(d, eps, &vb.pp("layer_norm2"))?,
            fc1: Linear::load(&vb.pp("mlp").pp("fc1"), d, cfg.intermediate_size)?,
            fc2: Linear::load(&vb.pp("mlp").pp("fc2"), cfg.intermediate_size, d)?,
            num_heads: cfg.num_attention_heads,
        })
    }

    /// Full (unmasked) self-attention over `xs` [b, s, d], scale 1/√head_dim.
    fn attention(&self, xs: &Tensor) -> Result<Tensor> {
        let (b, s, d) = xs.dims3()?;
        let n = self.num_heads;
        let qkv = self.qkv.forward(xs)?.reshape((b, s, 3, n, d / n))?;
        let part = |i: usize| qkv.narrow(2, i, 1)?.squeeze(2)?.contiguous();
        let out = framesmith_nn::attention::attention(&part(0)?, &part(1)?, &part(2)?, None)?;
        self.out_proj.forward(&out.reshape((b, s, d))?)
    }

    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let xs = (xs + self.attention(&self.layer_norm1.forward(xs)?)?)?;
        let h = self.fc1.forward(&self.layer_norm2.forward(&xs)?)?.gelu()?;
        &xs + self.fc2.forward(&h)?
    }
}

/// The SigLIP vision tower. Frozen: inference only.
pub struct SiglipVision {
    cfg: SiglipVisionConfig,
    /// The patch convolution as a matrix [d, 3·p·p] with its bias.
    patch_embedding: Linear,
    /// `embeddings.position_embedding.weight` [tokens, d].
    position_embedding: Tensor,
    layers: Vec<EncoderLayer>,
    post_layernorm: AffineNorm,
}

impl SiglipVision {
    /// Builds the tower from transformers' names under `vb` (`vision_model.` stripped): `embeddings.*`,
    /// `encoder.layers.{i}.*`, `post_layernorm.*`.
    pub fn new(cfg: &SiglipVisionConfig, vb: &Vb) -> Result<Self> {
        cfg.check().map_err(candle_core::Error::Msg)?;
        let (d, p) = (cfg.hidden_size, cfg.patch_size);
        let emb = vb.pp("embeddings");
        let patch = emb
            .get((d, 3, p, p), "patch_embedding.weight")?
            .reshape((d, 3 * p * p))?;
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| EncoderLayer::new(cfg, &vb.pp("encoder").pp("layers").pp(i)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            cfg: cfg.clone(),
            patch_embedding: Linear::from_weights(patch, Some(emb.get(d, "patch_embedding.bias")?)),
            position_embedding: emb.get((cfg.tokens(), d), "position_embedding.weight")?,
            layers,
            post_layernorm: AffineNorm::new(d, cfg.layer_norm_eps, &vb.pp("post_layernorm"))?,
        })
    }

    /// The tower's sizes.
    pub fn config(&self) -> &SiglipVisionConfig {
        &self.cfg
    }

    /// `last_hidden_state` [b, tokens, d] of normalised pixels [b, 3, S, S].
    pub fn forward(&self, pixels: &Tensor) -> Result<Tensor> {
        let (b, c, h, w) = pixels.dims4()?;
        let (s, p, g) = (self.cfg.image_size, self.cfg.patch_size, self.cfg.grid());
        if (c, h, w) != (3, s, s) {
            candle_core::bail!(
                "SigLIP takes pixels [b, 3, {s}, {s}], got {:?}",
                pixels.dims()
            );
        }
        let seen = g * p;
        let patches = pixels
            .to_dtype(self.position_embedding.dtype())?
            .to_device(self.position_embedding.device())?
            .narrow(2, 0, seen)?
            .narrow(3, 0, seen)?
            .contiguous()?
            .reshape(&[b, 3, g, p, g, p][..])?
            .permute(vec![0, 2, 4, 1, 3, 5])?
            .reshape((b, g * g, 3 * p * p))?;
        let mut xs = self
            .patch_embedding
            .forward(&patches)?
            .broadcast_add(&self.position_embedding)?;
        for layer in &self.layers {
            xs = layer.forward(&xs)?;
        }
        self.post_layernorm.forward(&xs)
    }

    /// `last_hidden_state` [1, tokens, d] of an RGB image of any size, prepared as `SiglipImageProcessor` does.
    pub fn encode_image(&self, image: &RgbImage) -> Result<Tensor> {
        let pixels =
            preprocess::pixel_values(image, self.cfg.image_size, self.position_embedding.device())?;
        self.forward(&pixels.unsqueeze(0)?)
    }
}

#[cfg(test)]
mod tests;
