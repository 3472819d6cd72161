//! The umT5 text encoder of Wan (`T5Encoder` of `wan/modules/t5.py`): token embedding, pre-norm self-attention
//! blocks with a relative-position bias per block (umT5) or one shared table (T5), gated GELU-tanh feed-forward,
//! final T5 RMS norm. Official key names (`token_embedding.weight`, `blocks.N.attn.q.weight`,
//! `blocks.N.pos_embedding.embedding.weight`, `blocks.N.ffn.gate.0.weight`, `norm.weight`). [`UmT5Encoder::encode`]
//! takes token ids and a mask; [`TextEncoder`] adds the tokenizer (`tokenizer`, `spiece`) and takes prompts.

mod pipeline;
mod spiece;
pub mod tokenizer;

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Result, Tensor, D};

use super::weights::{read_whole_file, WeightsFileError};
use framesmith_nn::linear::Linear;
use framesmith_nn::vb::Vb;

pub use pipeline::{load_umt5_auto, t5_config_from_tensors, TextEncoder, TextEncoderError};

/// Sizes of a T5 encoder (constructor arguments of the official `T5Encoder`).
#[derive(Debug, Clone, PartialEq)]
pub struct T5Config {
    /// Vocabulary size (rows of the token embedding).
    pub vocab: usize,
    /// Model width.
    pub dim: usize,
    /// Total width of the attention projections (heads × head dim).
    pub dim_attn: usize,
    /// Hidden width of the gated feed-forward.
    pub dim_ffn: usize,
    /// Attention heads.
    pub num_heads: usize,
    /// Encoder blocks.
    pub num_layers: usize,
    /// Relative-position buckets.
    pub num_buckets: usize,
    /// One relative-position table for all blocks (T5) instead of one per block (umT5).
    pub shared_pos: bool,
    /// Distance at which relative positions saturate (128 officially).
    pub max_dist: usize,
    /// Epsilon of the T5 layer norms (1e-6 officially).
    pub eps: f64,
}

impl T5Config {
    /// umT5-XXL encoder as Wan uses it (`umt5_xxl(encoder_only=True)`): 24 layers, width 4096, 64 heads.
    pub fn umt5_xxl() -> Self {
        Self {
            vocab: 256_384,
            dim: 4096,
            dim_attn: 4096,
            dim_ffn: 10_240,
            num_heads: 64,
            num_layers: 24,
            num_buckets: 32,
            shared_pos: false,
            max_dist: 128,
            eps: 1e-6,
        }
    }

    /// The tiny encoder of the parity fixture (`umt5_tiny`): vocabulary 100, width 32, 2 heads, 2 blocks.
    pub fn tiny() -> Self {
        Self {
            vocab: 100,
            dim: 32,
            dim_attn: 32,
            dim_ffn: 64,
            num_heads: 2,
            num_layers: 2,
            num_buckets: 32,
            ..Self::umt5_xxl()
        }
    }

    fn head_dim(&self) -> usize {
        self.dim_attn / self.num_heads.max(1)
    }
}

/// Bucket of relative position `rel = key − query` as the official `_relative_position_bucket`. The logarithmic
/// part is evaluated in float32 like the official float32 tensors, then truncated.
pub fn relative_position_bucket(
    rel: i64,
    num_buckets: usize,
    bidirectional: bool,
    max_dist: usize,
) -> usize {
    let (num_buckets, mut bucket, rel) = if bidirectional {
        let half = num_buckets / 2;
        (
            half,
            if rel > 0 { half } else { 0 },
            rel.unsigned_abs() as usize,
        )
    } else {
        (num_buckets, 0, (-rel.min(0)) as usize)
    };
    let max_exact = num_buckets / 2;
    if rel < max_exact {
        bucket += rel;
    } else {
        let scale = ((max_dist as f64 / max_exact as f64).ln()) as f32;
        let v = (rel as f32 / max_exact as f32).ln() / scale * (num_buckets - max_exact) as f32;
        let large = max_exact + v as usize;
        bucket += large.min(num_buckets - 1);
    }
    bucket
}

/// Relative-position bias table `embedding.weight` [num_buckets, num_heads].
struct RelativeEmbedding {
    embedding: Tensor,
    num_buckets: usize,
    max_dist: usize,
}

impl RelativeEmbedding {
    fn new(cfg: &T5Config, vb: &Vb) -> Result<Self> {
        Ok(Self {
            embedding: vb
                .pp("embedding")
                .get((cfg.num_buckets, cfg.num_heads), "weight")?,
            num_buckets: cfg.num_buckets,
            max_dist: cfg.max_dist,
        })
    }

    /// The bias [1, heads, lq, lk] (bidirectional, as the encoder uses it).
    fn forward(&self, lq: usize, lk: usize) -> Result<Tensor> {
        let mut buckets = Vec::with_capacity(lq * lk);
        for q in 0..lq as i64 {
            for k in 0..lk as i64 {
                buckets.push(
                    relative_position_bucket(k - q, self.num_buckets, true, self.max_dist) as u32,
                );
            }
        }
        let ids = Tensor::from_vec(buckets, lq * lk, self.embedding.device())?;
        let heads = self.embedding.dim(1)?;
        self.embedding
            .index_select(&ids, 0)?
            .reshape((lq, lk, heads))?
            .permute((2, 0, 1))?
            .unsqueeze(0)
    }
}

/// T5 layer norm: RMS without mean subtraction, statistics in f32, then `weight * x` in the weight's dtype.
fn t5_layer_norm(xs: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    let x = xs.to_dtype(DType::F32)?;
    let rms = (x.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?;
    x.broadcast_div(&rms)?
        .to_dtype(weight.dtype())?
        .broadcast_mul(weight)
}

/// Clamps ±inf away in f16 as the official `fp16_clamp` (no-op for other dtypes).
fn fp16_clamp(xs: Tensor) -> Result<Tensor> {
    if xs.dtype() != DType::F16 {
        return Ok(xs);
    }
    let has_inf = xs
        .to_dtype(DType::F32)?
        .abs()?
        .max_all()?
        .to_scalar::<f32>()?
        .is_infinite();
    if has_inf {
        let limit = 65504.0 - 1000.0;
        xs.clamp(-limit, limit)
    } else {
        Ok(xs)
    }
}

/// The most negative finite value of `dtype`, added at masked keys (`torch.finfo(dtype).min`).
fn dtype_min(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => f64::from(half::bf16::MIN),
        DType::F16 => f64::from(half::f16::MIN),
        DType::F64 => f64::MIN,
        _ => f64::from(f32::MIN),
    }
}

struct T5Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    num_heads: usize,
    head_dim: usize,
}

impl T5Attention {
    fn new(cfg: &T5Config, vb: &Vb) -> Result<Self> {
        Ok(Self {
            q: Linear::load(&vb.pp("q"), cfg.dim, cfg.dim_attn)?,
            k: Linear::load(&vb.pp("k"), cfg.dim, cfg.dim_attn)?,
            v: Linear::load(&vb.pp("v"), cfg.dim, cfg.dim_attn)?,
            o: Linear::load(&vb.pp("o"), cfg.dim_attn, cfg.dim)?,
            num_heads: cfg.num_heads,
            head_dim: cfg.head_dim(),
        })
    }

    /// Self-attention of `xs` [b, l, dim] with `bias` [b, heads, l, l] (position bias and key mask); no
    /// 1/sqrt(d) scaling (T5 folds it into the weights); softmax in f32.
    fn forward(&self, xs: &Tensor, bias: &Tensor) -> Result<Tensor> {
        let (b, l, _) = xs.dims3()?;
        let split = |t: Tensor| -> Result<Tensor> {
            t.reshape((b, l, self.num_heads, self.head_dim))?
                .transpose(1, 2)?
                .contiguous()
        };
        let q = split(self.q.forward(xs)?)?;
        let k = split(self.k.forward(xs)?)?;
        let v = split(self.v.forward(xs)?)?;
        let scores = (q.matmul(&k.t()?)? + bias)?;
        let probs = framesmith_nn::ops::softmax_last_dim(&scores.to_dtype(DType::F32)?)?
            .to_dtype(xs.dtype())?;
        let out =
            probs
                .matmul(&v)?
                .transpose(1, 2)?
                .reshape((b, l, self.num_heads * self.head_dim))?;
        self.o.forward(&out)
    }
}

struct T5FeedForward {
    gate: Linear,
    fc1: Linear,
    fc2: Linear,
}

impl T5FeedForward {
    fn new(cfg: &T5Config, vb: &Vb) -> Result<Self> {
        Ok(Self {
            gate: Linear::load(&vb.pp("gate").pp(0), cfg.dim, cfg.dim_ffn)?,
            fc1: Linear::load(&vb.pp("fc1"), cfg.dim, cfg.dim_ffn)?,
            fc2: Linear::load(&vb.pp("fc2"), cfg.dim_ffn, cfg.dim)?,
        })
    }

    /// `fc2(fc1(x) * gelu_tanh(gate(x)))`.
    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let gated = (self.fc1.forward(xs)? * self.gate.forward(xs)?.gelu()?)?;
        self.fc2.forward(&gated)
    }
}

/// One encoder block (`T5SelfAttention` officially).
struct T5Block {
    norm1: Tensor,
    attn: T5Attention,
    norm2: Tensor,
    ffn: T5FeedForward,
    pos_embedding: Option<RelativeEmbedding>,
    eps: f64,
}

impl T5Block {
    fn new(cfg: &T5Config, vb: &Vb) -> Result<Self> {
        let pos_embedding = if cfg.shared_pos {
            None
        } else {
            Some(RelativeEmbedding::new(cfg, &vb.pp("pos_embedding"))?)
        };
        Ok(Self {
            norm1: vb.pp("norm1").get(cfg.dim, "weight")?,
            attn: T5Attention::new(cfg, &vb.pp("attn"))?,
            norm2: vb.pp("norm2").get(cfg.dim, "weight")?,
            ffn: T5FeedForward::new(cfg, &vb.pp("ffn"))?,
            pos_embedding,
            eps: cfg.eps,
        })
    }

    /// `keep` [b, 1, 1, l] is 1 at valid keys; `shared` is the model-level position bias when `shared_pos`.
    fn forward(&self, xs: &Tensor, keep: &Tensor, shared: Option<&Tensor>) -> Result<Tensor> {
        let (b, l, _) = xs.dims3()?;
        let pos = match (&self.pos_embedding, shared) {
            (Some(table), _) => table.forward(l, l)?,
            (None, Some(bias)) => bias.clone(),
            (None, None) => candle_core::bail!("T5 block without a relative-position table"),
        };
        let heads = pos.dim(1)?;
        let pos = pos.to_dtype(xs.dtype())?.broadcast_as((b, heads, l, l))?;
        let masked = Tensor::new(&[dtype_min(xs.dtype())], xs.device())?
            .to_dtype(xs.dtype())?
            .reshape((1, 1, 1, 1))?
            .broadcast_as((b, heads, l, l))?;
        let bias = keep
            .broadcast_as((b, heads, l, l))?
            .where_cond(&pos, &masked)?;
        let h = self
            .attn
            .forward(&t5_layer_norm(xs, &self.norm1, self.eps)?, &bias)?;
        let xs = fp16_clamp((xs + h)?)?;
        let h = self
            .ffn
            .forward(&t5_layer_norm(&xs, &self.norm2, self.eps)?)?;
        fp16_clamp((xs + h)?)
    }
}

/// The umT5 encoder. Frozen: inference only.
pub struct UmT5Encoder {
    token_embedding: Tensor,
    pos_embedding: Option<RelativeEmbedding>,
    blocks: Vec<T5Block>,
    norm: Tensor,
    cfg: T5Config,
}

impl UmT5Encoder {
    /// Builds the encoder from official key names under `vb`.
    pub fn new(cfg: &T5Config, vb: &Vb) -> Result<Self> {
        let pos_embedding = if cfg.shared_pos {
            Some(RelativeEmbedding::new(cfg, &vb.pp("pos_embedding"))?)
        } else {
            None
        };
        let blocks = (0..cfg.num_layers)
            .map(|i| T5Block::new(cfg, &vb.pp("blocks").pp(i)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            token_embedding: vb
                .pp("token_embedding")
                .get((cfg.vocab, cfg.dim), "weight")?,
            pos_embedding,
            blocks,
            norm: vb.pp("norm").get(cfg.dim, "weight")?,
            cfg: cfg.clone(),
        })
    }

    /// The encoder's sizes.
    pub fn config(&self) -> &T5Config {
        &self.cfg
    }

    /// Hidden states [b, l, dim] for token `ids` [b, l] (integer) with `mask` [b, l] (non-zero = token). Every
    /// position is returned, padded ones included; see [`UmT5Encoder::encode_trimmed`] for the official trimming.
    pub fn encode(&self, ids: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let (b, l) = ids.dims2()?;
        if mask.dims() != [b, l] {
            candle_core::bail!(
                "umT5: mask shape {:?} differs from ids shape {:?}",
                mask.dims(),
                ids.dims()
            );
        }
        let flat = ids.flatten_all()?.to_dtype(DType::I64)?;
        let max_id = flat.max(0)?.to_scalar::<i64>()?;
        let min_id = flat.min(0)?.to_scalar::<i64>()?;
        if min_id < 0 || max_id as usize >= self.cfg.vocab {
            candle_core::bail!(
                "umT5: token id out of range [{min_id}, {max_id}] for vocabulary {}",
                self.cfg.vocab
            );
        }
        let device = self.token_embedding.device();
        let mut xs = self
            .token_embedding
            .index_select(&flat.to_device(device)?, 0)?
            .reshape((b, l, self.cfg.dim))?;
        let keep = mask
            .to_device(device)?
            .to_dtype(DType::I64)?
            .ne(0i64)?
            .reshape((b, 1, 1, l))?;
        let shared = self
            .pos_embedding
            .as_ref()
            .map(|p| p.forward(l, l))
            .transpose()?;
        for block in &self.blocks {
            xs = block.forward(&xs, &keep, shared.as_ref())?;
        }
        t5_layer_norm(&xs, &self.norm, self.cfg.eps)
    }

    /// As the official `T5EncoderModel.__call__`: row b trimmed to its number of tokens, [len_b, dim] each.
    pub fn encode_trimmed(&self, ids: &Tensor, mask: &Tensor) -> Result<Vec<Tensor>> {
        let hidden = self.encode(ids, mask)?;
        let lens = mask
            .to_dtype(DType::I64)?
            .ne(0i64)?
            .to_dtype(DType::U32)?
            .sum(1)?
            .to_vec1::<u32>()?;
        lens.iter()
            .enumerate()
            .map(|(i, &len)| hidden.get(i)?.narrow(0, 0, len as usize))
            .collect()
    }
}

/// Renames Hugging Face `UMT5EncoderModel` keys (ComfyUI's `umt5_xxl_*.safetensors`) to the official names;
/// official names pass through unchanged. The FP8 files' scales (`scale_weight`, `weight_scale`, `comfy_quant`)
/// follow their weights, so every weight is dequantised with its own scale when read.
pub fn official_t5_keys(tensors: HashMap<String, Tensor>) -> HashMap<String, Tensor> {
    tensors
        .into_iter()
        .filter_map(|(k, v)| hf_to_official(&k).map(|k| (k, v)))
        .collect()
}

/// The official name of a Linear's tensor (`weight` or one of the FP8 files' companions).
const LINEAR_TENSORS: [&str; 6] = [
    "weight",
    "scale_weight",
    "weight_scale",
    "scale_input",
    "input_scale",
    "comfy_quant",
];

/// A block's Linears: Hugging Face module path under `encoder.block.{i}.`, official path under `blocks.{i}.`.
const HF_BLOCK_LINEARS: [(&str, &str); 7] = [
    ("layer.0.SelfAttention.q", "attn.q"),
    ("layer.0.SelfAttention.k", "attn.k"),
    ("layer.0.SelfAttention.v", "attn.v"),
    ("layer.0.SelfAttention.o", "attn.o"),
    ("layer.1.DenseReluDense.wi_0", "ffn.gate.0"),
    ("layer.1.DenseReluDense.wi_1", "ffn.fc1"),
    ("layer.1.DenseReluDense.wo", "ffn.fc2"),
];

/// The tensors of a Hugging Face `UMT5EncoderModel` file of this size (the layout of ComfyUI's
/// `umt5_xxl_*.safetensors`), with whether each is a Linear's weight (what FP8 files store in FP8).
pub fn hf_t5_tensor_shapes(cfg: &T5Config) -> Vec<(String, Vec<usize>, bool)> {
    let mut out = vec![("shared.weight".to_string(), vec![cfg.vocab, cfg.dim], false)];
    for i in 0..cfg.num_layers {
        let block = |name: &str| format!("encoder.block.{i}.{name}");
        for (hf, official) in HF_BLOCK_LINEARS {
            let (rows, cols) = match official {
                "attn.q" | "attn.k" | "attn.v" => (cfg.dim_attn, cfg.dim),
                "attn.o" => (cfg.dim, cfg.dim_attn),
                "ffn.fc2" => (cfg.dim, cfg.dim_ffn),
                _ => (cfg.dim_ffn, cfg.dim),
            };
            out.push((block(&format!("{hf}.weight")), vec![rows, cols], true));
        }
        out.push((block("layer.0.layer_norm.weight"), vec![cfg.dim], false));
        out.push((block("layer.1.layer_norm.weight"), vec![cfg.dim], false));
        if !cfg.shared_pos || i == 0 {
            out.push((
                block("layer.0.SelfAttention.relative_attention_bias.weight"),
                vec![cfg.num_buckets, cfg.num_heads],
                false,
            ));
        }
    }
    out.push((
        "encoder.final_layer_norm.weight".to_string(),
        vec![cfg.dim],
        false,
    ));
    out
}

fn hf_to_official(key: &str) -> Option<String> {
    let mapped = match key {
        "shared.weight" | "encoder.embed_tokens.weight" => "token_embedding.weight".to_string(),
        "shared.scale_weight" | "encoder.embed_tokens.scale_weight" => {
            "token_embedding.scale_weight".to_string()
        }
        "encoder.final_layer_norm.weight" => "norm.weight".to_string(),
        _ => {
            let Some(rest) = key.strip_prefix("encoder.block.") else {
                return Some(key.to_string());
            };
            let (block, tail) = rest.split_once('.')?;
            let name = match tail {
                // The position table, with a scale when an FP8 file quantised it too.
                _ if tail.starts_with("layer.0.SelfAttention.relative_attention_bias.") => {
                    let (_, tensor) = tail.rsplit_once('.')?;
                    if !LINEAR_TENSORS.contains(&tensor) {
                        return None;
                    }
                    format!("pos_embedding.embedding.{tensor}")
                }
                "layer.0.layer_norm.weight" => "norm1.weight".to_string(),
                "layer.1.layer_norm.weight" => "norm2.weight".to_string(),
                _ => {
                    let (module, tensor) = tail.rsplit_once('.')?;
                    if !LINEAR_TENSORS.contains(&tensor) {
                        return None;
                    }
                    let (_, official) = HF_BLOCK_LINEARS.iter().find(|(hf, _)| *hf == module)?;
                    format!("{official}.{tensor}")
                }
            };
            format!("blocks.{block}.{name}")
        }
    };
    Some(mapped)
}

/// Loads the umT5 encoder from the official `.pth` (`models_t5_umt5-xxl-enc-bf16.pth`) or a safetensors file
/// with official or Hugging Face key names, converting to `dtype`.
pub fn load_umt5(
    path: &Path,
    cfg: &T5Config,
    dtype: DType,
    device: &Device,
) -> std::result::Result<UmT5Encoder, WeightsFileError> {
    let tensors = official_t5_keys(read_whole_file(path)?);
    if !tensors.contains_key("token_embedding.weight")
        || !tensors.contains_key("blocks.0.attn.q.weight")
    {
        return Err(WeightsFileError::WrongModel {
            path: path.to_path_buf(),
            what: "this file holds no T5 encoder (no `token_embedding.weight` / `blocks.0.attn.q.weight`)".into(),
        });
    }
    let vb = Vb::from_tensors(tensors, dtype, device);
    UmT5Encoder::new(cfg, &vb).map_err(|e| WeightsFileError::Mismatch {
        path: path.to_path_buf(),
        model: "umT5 encoder",
        detail: format!("{e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_follow_the_t5_layout() {
        // Bidirectional, 32 buckets: 16 per direction, exact below 8, logarithmic up to 128, then saturated.
        let b = |rel| relative_position_bucket(rel, 32, true, 128);
        assert_eq!(b(0), 0);
        assert_eq!(b(-3), 3);
        assert_eq!(b(3), 19);
        assert_eq!(b(-7), 7);
        assert_eq!(b(-8), 8);
        assert_eq!(b(-16), 10);
        // Exact float boundaries (log ratio exactly 2, 4, 6): buckets as PyTorch 2.11 computes them.
        for (rel, want) in [
            (15, 25),
            (16, 26),
            (31, 27),
            (32, 28),
            (33, 28),
            (63, 29),
            (64, 30),
            (127, 31),
        ] {
            assert_eq!(b(rel), want, "rel {rel}");
        }
        assert_eq!((b(-32), b(-64), b(-128)), (12, 14, 15));
        assert_eq!(b(-127), 15);
        assert_eq!(b(-1000), 15);
        assert_eq!(b(1000), 31);
    }

    #[test]
    fn hf_tensor_shapes_are_the_official_encoders_tensors() -> anyhow::Result<()> {
        let dir = crate::fixtures::wan_case("umt5_tiny");
        let tensors =
            candle_core::safetensors::load(dir.join("weights.safetensors"), &Device::Cpu)?;
        let mut official: Vec<(String, Vec<usize>)> = tensors
            .iter()
            .map(|(k, t)| (k.clone(), t.dims().to_vec()))
            .collect();
        official.sort();
        let mut listed: Vec<(String, Vec<usize>)> = hf_t5_tensor_shapes(&T5Config::tiny())
            .into_iter()
            .map(|(k, shape, _)| (hf_to_official(&k).unwrap_or(k), shape))
            .collect();
        listed.sort();
        assert_eq!(listed, official);
        Ok(())
    }

    #[test]
    fn hf_keys_map_to_official_names() {
        assert_eq!(
            hf_to_official("shared.weight").as_deref(),
            Some("token_embedding.weight")
        );
        assert_eq!(
            hf_to_official("encoder.block.3.layer.1.DenseReluDense.wi_0.weight").as_deref(),
            Some("blocks.3.ffn.gate.0.weight")
        );
        assert_eq!(
            hf_to_official("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight")
                .as_deref(),
            Some("blocks.0.pos_embedding.embedding.weight")
        );
        assert_eq!(
            hf_to_official("blocks.1.attn.o.weight").as_deref(),
            Some("blocks.1.attn.o.weight")
        );
        assert_eq!(
            hf_to_official("encoder.block.0.layer.9.unknown.weight"),
            None
        );
    }

    /// The Hugging Face (ComfyUI) name of an official umT5 key.
    fn official_to_hf(k: &str) -> String {
        let tail_map = [
            ("attn.q.weight", "layer.0.SelfAttention.q.weight"),
            ("attn.k.weight", "layer.0.SelfAttention.k.weight"),
            ("attn.v.weight", "layer.0.SelfAttention.v.weight"),
            ("attn.o.weight", "layer.0.SelfAttention.o.weight"),
            (
                "pos_embedding.embedding.weight",
                "layer.0.SelfAttention.relative_attention_bias.weight",
            ),
            ("norm1.weight", "layer.0.layer_norm.weight"),
            ("ffn.gate.0.weight", "layer.1.DenseReluDense.wi_0.weight"),
            ("ffn.fc1.weight", "layer.1.DenseReluDense.wi_1.weight"),
            ("ffn.fc2.weight", "layer.1.DenseReluDense.wo.weight"),
            ("norm2.weight", "layer.1.layer_norm.weight"),
        ];
        match k {
            "token_embedding.weight" => "shared.weight".into(),
            "norm.weight" => "encoder.final_layer_norm.weight".into(),
            _ => {
                let rest = k.strip_prefix("blocks.").unwrap_or(k);
                let (block, tail) = rest.split_once('.').unwrap_or((rest, ""));
                let hf = tail_map
                    .iter()
                    .find(|(o, _)| *o == tail)
                    .map(|(_, h)| *h)
                    .unwrap_or(tail);
                format!("encoder.block.{block}.{hf}")
            }
        }
    }

    /// The fixture's official-name weights renamed to Hugging Face names (as in ComfyUI's umT5 files), saved,
    /// loaded through [`load_umt5`] and run: the output must equal the official `hidden`.
    #[test]
    fn hf_named_safetensors_load_and_match_the_fixture() -> anyhow::Result<()> {
        let case = crate::fixtures::wan_case("umt5_tiny");
        let weights =
            candle_core::safetensors::load(case.join("weights.safetensors"), &Device::Cpu)?;
        let inputs = candle_core::safetensors::load(case.join("inputs.safetensors"), &Device::Cpu)?;
        let expected =
            candle_core::safetensors::load(case.join("expected.safetensors"), &Device::Cpu)?;
        let hf: HashMap<String, Tensor> = weights
            .iter()
            .map(|(k, v)| (official_to_hf(k), v.clone()))
            .collect();
        assert!(hf.keys().all(|k| !k.starts_with("blocks.")));
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("umt5_hf.safetensors");
        candle_core::safetensors::save(&hf, &path)?;
        let cfg = T5Config::tiny();
        let encoder = load_umt5(&path, &cfg, DType::F32, &Device::Cpu)?;
        let hidden = encoder.encode(&inputs["ids"], &inputs["mask"])?;
        let err = (hidden - &expected["hidden"])?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?;
        assert!(err < 1e-4, "max abs error {err}");
        let trimmed = encoder.encode_trimmed(&inputs["ids"], &inputs["mask"])?;
        assert_eq!(
            trimmed
                .iter()
                .map(|t| t.dim(0))
                .collect::<candle_core::Result<Vec<_>>>()?,
            vec![12, 7]
        );

        let err = load_umt5(&path, &T5Config::umt5_xxl(), DType::F32, &Device::Cpu).err();
        let msg = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            msg.contains("do not fit the umT5 encoder") && msg.contains("umt5_hf.safetensors"),
            "{msg}"
        );
        Ok(())
    }

    /// ComfyUI's scaled-FP8 umT5 layout (`umt5_xxl_fp8_e4m3fn_scaled.safetensors`): Hugging Face names, every
    /// Linear and the embedding as e4m3 codes with a per-tensor `scale_weight`, and the `scaled_fp8` marker. It
    /// must encode exactly as the same weights dequantised by hand (a missed scale is off by ~1/scale).
    #[test]
    fn comfy_scaled_fp8_umt5_loads_with_its_scales() -> anyhow::Result<()> {
        use framesmith_nn::fp8::{e4m3_decode, e4m3_encode};
        let case = crate::fixtures::wan_case("umt5_tiny");
        let weights =
            candle_core::safetensors::load(case.join("weights.safetensors"), &Device::Cpu)?;
        let inputs = candle_core::safetensors::load(case.join("inputs.safetensors"), &Device::Cpu)?;
        let mut scaled = HashMap::new();
        let mut dequantized = HashMap::new();
        let mut min_scale = f32::INFINITY;
        for (k, v) in &weights {
            let hf = official_to_hf(k);
            let quantize = v.rank() == 2 && !k.contains("pos_embedding");
            if !quantize {
                scaled.insert(hf.clone(), v.clone());
                dequantized.insert(hf, v.clone());
                continue;
            }
            let values = v.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
            let amax = values.iter().fold(0f32, |m, x| m.max(x.abs()));
            let scale = amax / 448.0;
            min_scale = min_scale.min(scale);
            let codes: Vec<u8> = values.iter().map(|x| e4m3_encode(x / scale)).collect();
            let back: Vec<f32> = codes.iter().map(|&c| e4m3_decode(c) * scale).collect();
            let module = hf.trim_end_matches(".weight");
            scaled.insert(
                hf.clone(),
                Tensor::from_raw_buffer(&codes, DType::F8E4M3, v.dims(), &Device::Cpu)?,
            );
            scaled.insert(
                format!("{module}.scale_weight"),
                Tensor::new(scale, &Device::Cpu)?,
            );
            dequantized.insert(hf, Tensor::from_vec(back, v.dims(), &Device::Cpu)?);
        }
        assert!(min_scale < 0.1, "the test needs scales far from 1");
        scaled.insert(
            "scaled_fp8".into(),
            Tensor::from_raw_buffer(&[0u8], DType::F8E4M3, &[1], &Device::Cpu)?,
        );
        let dir = tempfile::tempdir()?;
        let (fp8_path, ref_path) = (
            dir.path().join("fp8.safetensors"),
            dir.path().join("ref.safetensors"),
        );
        candle_core::safetensors::save(&scaled, &fp8_path)?;
        candle_core::safetensors::save(&dequantized, &ref_path)?;
        let encode = |path: &Path| -> anyhow::Result<Tensor> {
            let encoder = load_umt5(path, &T5Config::tiny(), DType::F32, &Device::Cpu)?;
            Ok(encoder.encode(&inputs["ids"], &inputs["mask"])?)
        };
        let max_abs = |a: Tensor, b: &Tensor| -> anyhow::Result<f32> {
            Ok((a - b)?.abs()?.max_all()?.to_scalar::<f32>()?)
        };
        let want = encode(&ref_path)?;
        let err = max_abs(encode(&fp8_path)?, &want)?;
        assert!(
            err < 1e-5,
            "max abs error {err} against the hand-dequantised weights"
        );
        let auto = load_umt5_auto(&fp8_path, DType::F32, &Device::Cpu)?;
        let err = max_abs(auto.encode(&inputs["ids"], &inputs["mask"])?, &want)?;
        assert!(err < 1e-5, "load_umt5_auto: max abs error {err}");
        Ok(())
    }

    #[test]
    fn scales_follow_their_linears() {
        assert_eq!(
            hf_to_official("encoder.block.3.layer.1.DenseReluDense.wi_0.scale_weight").as_deref(),
            Some("blocks.3.ffn.gate.0.scale_weight")
        );
        assert_eq!(
            hf_to_official("encoder.block.0.layer.0.SelfAttention.k.comfy_quant").as_deref(),
            Some("blocks.0.attn.k.comfy_quant")
        );
        assert_eq!(
            hf_to_official("shared.scale_weight").as_deref(),
            Some("token_embedding.scale_weight")
        );
        assert_eq!(
            hf_to_official("encoder.block.0.layer.0.SelfAttention.q.bogus"),
            None
        );
        assert_eq!(
            hf_to_official(
                "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.scale_weight"
            )
            .as_deref(),
            Some("blocks.0.pos_embedding.embedding.scale_weight")
        );
    }
}
