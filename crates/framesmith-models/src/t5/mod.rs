//! The T5 text encoder that Wan (umT5, `T5Encoder` of `wan/modules/t5.py`) and FLUX.1 (T5-XXL v1.1) share:
//! token embedding, pre-norm self-attention blocks with a relative-position bias per block (umT5) or one shared
//! table (T5), gated GELU-tanh feed-forward, final T5 RMS norm. Official key names (`token_embedding.weight`,
//! `blocks.N.attn.q.weight`, `blocks.N.pos_embedding.embedding.weight`, `blocks.N.ffn.gate.0.weight`,
//! `norm.weight`). [`UmT5Encoder::encode`] takes token ids and a mask; `keys` maps Hugging Face names onto these and
//! loads a file, `v1_1` gives T5 v1.1's sizes and loading; Wan's tokenizer and prompt pipeline are in
//! `wan::text_encoder`.

mod keys;
pub mod v1_1;

use candle_core::{DType, Result, Tensor, D};

use framesmith_nn::linear::Linear;
use framesmith_nn::vb::Vb;

pub use keys::{hf_t5_tensor_shapes, load_umt5, official_t5_keys};

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

    /// The device the encoder's weights are on.
    pub fn device(&self) -> &candle_core::Device {
        self.token_embedding.device()
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
}
