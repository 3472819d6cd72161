//! The CLIP-L text encoder FLUX.1 takes its pooled vector from (`CLIPTextModel` of Hugging Face transformers, the
//! `clip_l.safetensors` file): token and position embeddings, pre-norm causal self-attention layers with a
//! quick-GELU MLP, a final LayerNorm, and the pooled output (the row at the first end-of-text token).
//! Key names are the released checkpoint's (`text_model.encoder.layers.N.self_attn.q_proj.weight`, …).

use candle_core::{DType, Result, Tensor};
use serde::Deserialize;

use framesmith_nn::linear::Linear;
use framesmith_nn::norm::layer_norm;
use framesmith_nn::ops::softmax_last_dim;
use framesmith_nn::vb::Vb;

/// `CLIPTextConfig` fields the text model uses (Hugging Face names).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ClipTextConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub max_position_embeddings: usize,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// 2 in clip-l's legacy config: pooling then takes the largest id's position (the end-of-text token).
    #[serde(default = "default_eos")]
    pub eos_token_id: i64,
}

fn default_eps() -> f64 {
    1e-5
}
fn default_act() -> String {
    "quick_gelu".into()
}
fn default_eos() -> i64 {
    2
}

impl ClipTextConfig {
    /// openai/clip-vit-large-patch14's text model, as FLUX.1 loads it.
    pub fn clip_l() -> Self {
        Self {
            vocab_size: 49_408,
            hidden_size: 768,
            intermediate_size: 3072,
            num_hidden_layers: 12,
            num_attention_heads: 12,
            max_position_embeddings: 77,
            layer_norm_eps: default_eps(),
            hidden_act: default_act(),
            eos_token_id: default_eos(),
        }
    }

    /// Reads the Hugging Face `CLIPTextConfig` names from JSON (unknown fields ignored).
    pub fn from_json(json: &str) -> serde_json::Result<Self> {
        serde_json::from_str(json)
    }
}

/// A LayerNorm with `weight` and `bias`.
#[derive(Clone)]
struct Norm {
    weight: Tensor,
    bias: Tensor,
    eps: f64,
}

impl Norm {
    fn new(dim: usize, eps: f64, vb: &Vb) -> Result<Self> {
        Ok(Self {
            weight: vb.get(dim, "weight")?,
            bias: vb.get(dim, "bias")?,
            eps,
        })
    }

    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        layer_norm(xs, Some(&self.weight), Some(&self.bias), self.eps)
    }
}

/// `self_attn`: `q_proj`, `k_proj`, `v_proj`, `out_proj`.
#[derive(Clone)]
pub struct ClipAttention {
    pub q_proj: Linear,
    pub k_proj: Linear,
    pub v_proj: Linear,
    pub out_proj: Linear,
    num_heads: usize,
}

impl ClipAttention {
    fn new(cfg: &ClipTextConfig, vb: &Vb) -> Result<Self> {
        let d = cfg.hidden_size;
        Ok(Self {
            q_proj: Linear::load(&vb.pp("q_proj"), d, d)?,
            k_proj: Linear::load(&vb.pp("k_proj"), d, d)?,
            v_proj: Linear::load(&vb.pp("v_proj"), d, d)?,
            out_proj: Linear::load(&vb.pp("out_proj"), d, d)?,
            num_heads: cfg.num_attention_heads,
        })
    }

    /// Attention of `xs` [b, l, dim] with the additive `mask` [l, l] (causal), softmax in f32.
    fn forward(&self, xs: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let (b, l, d) = xs.dims3()?;
        let head_dim = d / self.num_heads;
        let heads = |t: Tensor| -> Result<Tensor> {
            t.reshape((b, l, self.num_heads, head_dim))?
                .transpose(1, 2)?
                .contiguous()
        };
        let q = heads((self.q_proj.forward(xs)? * (head_dim as f64).powf(-0.5))?)?;
        let k = heads(self.k_proj.forward(xs)?)?;
        let v = heads(self.v_proj.forward(xs)?)?;
        let scores = q
            .matmul(&k.t()?)?
            .to_dtype(DType::F32)?
            .broadcast_add(mask)?;
        let probs = softmax_last_dim(&scores)?.to_dtype(xs.dtype())?;
        let out = probs.matmul(&v)?.transpose(1, 2)?.reshape((b, l, d))?;
        self.out_proj.forward(&out)
    }
}

/// `encoder.layers.N`.
#[derive(Clone)]
pub struct ClipEncoderLayer {
    pub self_attn: ClipAttention,
    layer_norm1: Norm,
    /// `mlp.fc1`, `mlp.fc2`.
    pub fc1: Linear,
    pub fc2: Linear,
    layer_norm2: Norm,
    quick_gelu: bool,
}

impl ClipEncoderLayer {
    fn new(cfg: &ClipTextConfig, vb: &Vb) -> Result<Self> {
        let (d, ff, eps) = (cfg.hidden_size, cfg.intermediate_size, cfg.layer_norm_eps);
        Ok(Self {
            self_attn: ClipAttention::new(cfg, &vb.pp("self_attn"))?,
            layer_norm1: Norm::new(d, eps, &vb.pp("layer_norm1"))?,
            fc1: Linear::load(&vb.pp("mlp").pp("fc1"), d, ff)?,
            fc2: Linear::load(&vb.pp("mlp").pp("fc2"), ff, d)?,
            layer_norm2: Norm::new(d, eps, &vb.pp("layer_norm2"))?,
            quick_gelu: cfg.hidden_act == "quick_gelu",
        })
    }

    fn forward(&self, xs: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let xs = (xs
            + self
                .self_attn
                .forward(&self.layer_norm1.forward(xs)?, mask)?)?;
        let h = self.fc1.forward(&self.layer_norm2.forward(&xs)?)?;
        let h = if self.quick_gelu {
            (&h / ((&h * -1.702)?.exp()? + 1.0)?)?
        } else {
            h.gelu_erf()?
        };
        xs + self.fc2.forward(&h)?
    }
}

/// The output of [`ClipTextModel::forward`].
pub struct ClipTextOutput {
    /// [b, l, dim], after `final_layer_norm`.
    pub last_hidden_state: Tensor,
    /// [b, dim]: the row at each sample's end-of-text token (FLUX's `y`).
    pub pooler_output: Tensor,
}

/// `text_model`.
#[derive(Clone)]
pub struct ClipTextModel {
    token_embedding: Tensor,
    position_embedding: Tensor,
    pub layers: Vec<ClipEncoderLayer>,
    final_layer_norm: Norm,
    cfg: ClipTextConfig,
}

impl ClipTextModel {
    /// The tensors (names under `text_model.`, as the released `clip_l.safetensors`, and shapes) of a model of
    /// these sizes.
    pub fn tensor_shapes(cfg: &ClipTextConfig) -> Vec<(String, Vec<usize>)> {
        let (d, ff) = (cfg.hidden_size, cfg.intermediate_size);
        let mut out: Vec<(String, Vec<usize>)> = vec![
            (
                "text_model.embeddings.token_embedding.weight".into(),
                vec![cfg.vocab_size, d],
            ),
            (
                "text_model.embeddings.position_embedding.weight".into(),
                vec![cfg.max_position_embeddings, d],
            ),
        ];
        let linear = |out: &mut Vec<(String, Vec<usize>)>, name: &str, rows: usize, cols: usize| {
            out.push((format!("{name}.weight"), vec![rows, cols]));
            out.push((format!("{name}.bias"), vec![rows]));
        };
        let norm = |out: &mut Vec<(String, Vec<usize>)>, name: &str| {
            out.push((format!("{name}.weight"), vec![d]));
            out.push((format!("{name}.bias"), vec![d]));
        };
        for i in 0..cfg.num_hidden_layers {
            let layer = format!("text_model.encoder.layers.{i}");
            for proj in ["q_proj", "k_proj", "v_proj", "out_proj"] {
                linear(&mut out, &format!("{layer}.self_attn.{proj}"), d, d);
            }
            norm(&mut out, &format!("{layer}.layer_norm1"));
            linear(&mut out, &format!("{layer}.mlp.fc1"), ff, d);
            linear(&mut out, &format!("{layer}.mlp.fc2"), d, ff);
            norm(&mut out, &format!("{layer}.layer_norm2"));
        }
        norm(&mut out, "text_model.final_layer_norm");
        out
    }

    /// Builds the model from the keys under `vb` (`text_model` of the released checkpoint).
    pub fn new(cfg: &ClipTextConfig, vb: &Vb) -> Result<Self> {
        let emb = vb.pp("embeddings");
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| ClipEncoderLayer::new(cfg, &vb.pp("encoder").pp("layers").pp(i)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            token_embedding: emb
                .pp("token_embedding")
                .get((cfg.vocab_size, cfg.hidden_size), "weight")?,
            position_embedding: emb
                .pp("position_embedding")
                .get((cfg.max_position_embeddings, cfg.hidden_size), "weight")?,
            layers,
            final_layer_norm: Norm::new(
                cfg.hidden_size,
                cfg.layer_norm_eps,
                &vb.pp("final_layer_norm"),
            )?,
            cfg: cfg.clone(),
        })
    }

    /// The model's sizes.
    pub fn config(&self) -> &ClipTextConfig {
        &self.cfg
    }

    /// The device the model runs on.
    pub fn device(&self) -> &candle_core::Device {
        self.token_embedding.device()
    }

    /// Encodes token ids [b, l] (l ≤ max positions) with the causal mask only, as FLUX's `HFEmbedder` calls it.
    pub fn forward(&self, input_ids: &Tensor) -> Result<ClipTextOutput> {
        let (b, l) = input_ids.dims2()?;
        if l > self.cfg.max_position_embeddings {
            candle_core::bail!(
                "CLIP: {l} tokens, the model has {} positions",
                self.cfg.max_position_embeddings
            );
        }
        let ids = input_ids.to_dtype(DType::I64)?.to_vec2::<i64>()?;
        if ids
            .iter()
            .flatten()
            .any(|&id| id < 0 || id as usize >= self.cfg.vocab_size)
        {
            candle_core::bail!(
                "CLIP: token id out of range for vocabulary {}",
                self.cfg.vocab_size
            );
        }
        let device = self.token_embedding.device();
        let flat: Vec<u32> = ids.iter().flatten().map(|&id| id as u32).collect();
        let tokens = self
            .token_embedding
            .index_select(&Tensor::from_vec(flat, b * l, device)?, 0)?
            .reshape((b, l, self.cfg.hidden_size))?;
        let mut xs =
            tokens.broadcast_add(&self.position_embedding.narrow(0, 0, l)?.unsqueeze(0)?)?;
        let mask = causal_mask(l, device)?;
        for layer in &self.layers {
            xs = layer.forward(&xs, &mask)?;
        }
        let last_hidden_state = self.final_layer_norm.forward(&xs)?;
        let rows: Vec<u32> = ids
            .iter()
            .enumerate()
            .map(|(i, row)| (i * l + pooled_position(self.cfg.eos_token_id, row)) as u32)
            .collect();
        let pooler_output = last_hidden_state
            .reshape((b * l, self.cfg.hidden_size))?
            .index_select(&Tensor::from_vec(rows, b, device)?, 0)?;
        Ok(ClipTextOutput {
            last_hidden_state,
            pooler_output,
        })
    }
}

/// Where a sample is pooled: the first largest id for clip-l's legacy `eos_token_id` 2 (the end-of-text token
/// has the largest id), else the first end-of-text token (the last position when there is none).
fn pooled_position(eos_token_id: i64, row: &[i64]) -> usize {
    if eos_token_id == 2 {
        let max = row.iter().copied().max().unwrap_or(0);
        row.iter().position(|&id| id == max).unwrap_or(0)
    } else {
        row.iter()
            .position(|&id| id == eos_token_id)
            .unwrap_or(row.len().saturating_sub(1))
    }
}

/// The additive causal mask [l, l] (f32): 0 on and below the diagonal, the most negative f32 above.
fn causal_mask(l: usize, device: &candle_core::Device) -> Result<Tensor> {
    let values: Vec<f32> = (0..l)
        .flat_map(|i| (0..l).map(move |j| if j > i { f32::MIN } else { 0.0 }))
        .collect();
    Tensor::from_vec(values, (l, l), device)
}

/// Whether `vb` holds a CLIP text model under `text_model.` (the released layout) or at the root.
pub fn text_model_prefix(vb: &Vb) -> Vb {
    if vb.contains("text_model.embeddings.token_embedding.weight") {
        vb.pp("text_model")
    } else {
        vb.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flux::testkit::{assert_close, Case};
    use candle_core::Device;

    #[test]
    fn matches_the_hf_clip_text_model() -> anyhow::Result<()> {
        let case = Case::load("clip_l")?;
        let cfg = ClipTextConfig::from_json(&case.config["init"].to_string())?;
        let vb = Vb::from_tensors(case.weights.clone(), DType::F32, &Device::Cpu);
        let model = ClipTextModel::new(&cfg, &text_model_prefix(&vb))?;
        let out = model.forward(case.input("input_ids")?)?;
        let want = case.expected("last_hidden_state")?;
        assert_close(
            "last_hidden_state",
            &out.last_hidden_state,
            want,
            1e-4,
            1e-4,
        )?;
        let want = case.expected("pooler_output")?;
        assert_close("pooler_output", &out.pooler_output, want, 1e-4, 1e-4)?;
        Ok(())
    }

    #[test]
    fn pools_at_the_first_end_of_text() {
        assert_eq!(pooled_position(2, &[49_406, 3, 49_407, 49_407]), 2);
        assert_eq!(pooled_position(7, &[9, 7, 8, 7]), 1);
        assert_eq!(pooled_position(7, &[9, 8]), 1);
    }
}
