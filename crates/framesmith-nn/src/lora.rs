//! LoRA adapters: trainable `down` [rank, in] and `up` [out, rank] with `alpha` and a multiplier; which of a
//! model's linears get one (musubi-tuner's Wan, FLUX.1 and Qwen-Image targets with include/exclude patterns);
//! attaching fresh adapters of any kind ([`super::adapter`]); and [`LoraSet`], the adapters a trainer optimises.
//! Files live in [`super::lora_file`].

use std::cmp::Ordering;

use candle_core::{DType, Device, Result, Tensor, Var};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use regex::Regex;

use super::adapter::{Adapter, AdapterKind, AdapterShape};
use super::init;
use super::linear::Linear;

thread_local! {
    /// Set inside [`untracked`].
    static UNTRACKED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with every LoRA on this thread read as plain tensors rather than trainable variables: what `f`
/// computes records no autograd graph (inference: samples, generation, evaluation), so each intermediate is
/// freed as soon as it is used, whatever LoRAs being trained are attached.
pub fn untracked<T>(f: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            UNTRACKED.set(self.0);
        }
    }
    let _restore = Restore(UNTRACKED.replace(true));
    f()
}

/// Whether this thread is inside [`untracked`].
pub(crate) fn is_untracked() -> bool {
    UNTRACKED.get()
}

/// A LoRA pair. `up` starts at zero so a fresh adapter leaves the model unchanged.
#[derive(Clone)]
pub struct Lora {
    pub down: Var,
    pub up: Var,
    pub alpha: f64,
    pub multiplier: f64,
}

impl Lora {
    /// A fresh adapter: `down` Kaiming-uniform like musubi-tuner (bound 1/sqrt(in)), drawn on the host from
    /// `rng` (so the same seed gives the same adapter on every device and run), `up` zero.
    pub fn new(
        [in_dim, out_dim, rank]: [usize; 3],
        alpha: f64,
        dtype: DType,
        device: &Device,
        rng: &mut impl Rng,
    ) -> Result<Self> {
        let bound = 1.0 / (in_dim as f32).sqrt();
        let down = init::uniform(rng, (rank, in_dim), -bound, bound, device)?.to_dtype(dtype)?;
        let up = Tensor::zeros((out_dim, rank), dtype, device)?;
        Self::from_tensors(&down, &up, alpha)
    }

    /// An adapter from existing factors `down` [rank, in] and `up` [out, rank] (copied into new `Var`s),
    /// multiplier 1.
    pub fn from_tensors(down: &Tensor, up: &Tensor, alpha: f64) -> Result<Self> {
        let (rank, _) = down.dims2()?;
        let (_, up_rank) = up.dims2()?;
        if rank != up_rank || rank == 0 {
            candle_core::bail!(
                "LoRA factors do not fit: down {:?}, up {:?} (need [rank, in] and [out, rank], rank >= 1)",
                down.dims(),
                up.dims()
            );
        }
        Ok(Self {
            down: Var::from_tensor(down)?,
            up: Var::from_tensor(up)?,
            alpha,
            multiplier: 1.0,
        })
    }

    /// A full-rank adapter whose `down` is the identity and `up` zero, scale 1: the layer is unchanged and
    /// ∂L/∂up equals ∂L/∂W of the frozen base weight, so parity checks compare weight gradients without putting
    /// the base on candle's autograd path.
    pub fn identity([in_dim, out_dim]: [usize; 2], dtype: DType, device: &Device) -> Result<Self> {
        let down = Tensor::eye(in_dim, dtype, device)?;
        let up = Tensor::zeros((out_dim, in_dim), dtype, device)?;
        Self::from_tensors(&down, &up, in_dim as f64)
    }

    /// The rank (rows of `down`).
    pub fn rank(&self) -> usize {
        self.down.dims()[0]
    }

    /// Input width (columns of `down`).
    pub fn in_dim(&self) -> usize {
        self.down.dims()[1]
    }

    /// Output width (rows of `up`).
    pub fn out_dim(&self) -> usize {
        self.up.dims()[0]
    }

    /// The factor applied to `up(down(x))`.
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank() as f64 * self.multiplier
    }

    /// `up(down(x)) · scale` for `xs` [m, in], in `xs`' dtype. Inside [`untracked`] the weights are read
    /// detached, so nothing is recorded for a backward.
    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let dtype = xs.dtype();
        let (down, up) = if UNTRACKED.get() {
            (self.down.as_tensor().detach(), self.up.as_tensor().detach())
        } else {
            (self.down.as_tensor().clone(), self.up.as_tensor().clone())
        };
        let (down, up) = (down.to_dtype(dtype)?, up.to_dtype(dtype)?);
        xs.matmul(&down.t()?)?.matmul(&up.t()?)? * self.scale()
    }
}

/// The linears of one Wan attention block that musubi-tuner adapts (paths under `blocks.{i}.`); `k_img` and
/// `v_img` exist in I2V models only.
pub const WAN_BLOCK_LINEARS: [&str; 12] = [
    "self_attn.q",
    "self_attn.k",
    "self_attn.v",
    "self_attn.o",
    "cross_attn.q",
    "cross_attn.k",
    "cross_attn.v",
    "cross_attn.o",
    "cross_attn.k_img",
    "cross_attn.v_img",
    "ffn.0",
    "ffn.2",
];

/// musubi-tuner's exclude pattern for Wan, always applied (user patterns are added to it).
pub const WAN_DEFAULT_EXCLUDE: &str =
    r".*(patch_embedding|text_embedding|time_embedding|time_projection|norm|head).*";

/// The linears of one FLUX.1 double-stream block (paths under `double_blocks.{i}.`), as in the official checkpoint.
pub const FLUX_DOUBLE_BLOCK_LINEARS: [&str; 10] = [
    "img_mod.lin",
    "img_attn.qkv",
    "img_attn.proj",
    "img_mlp.0",
    "img_mlp.2",
    "txt_mod.lin",
    "txt_attn.qkv",
    "txt_attn.proj",
    "txt_mlp.0",
    "txt_mlp.2",
];

/// The linears of one FLUX.1 single-stream block (paths under `single_blocks.{i}.`).
pub const FLUX_SINGLE_BLOCK_LINEARS: [&str; 3] = ["linear1", "linear2", "modulation.lin"];

/// musubi-tuner's default exclude pattern for FLUX.1 (`networks/lora_flux.py`): the modulation linears. Unlike
/// Wan's, it applies only when the user gives no exclude patterns of their own (sd-scripts adapts them too; an
/// include pattern such as `.*mod(ulation)?\.lin` brings them back).
pub const FLUX_DEFAULT_EXCLUDE: &str = r".*(img_mod\.lin|txt_mod\.lin|modulation\.lin).*";

/// musubi-tuner's exclude pattern for FLUX.1 that always applies.
pub const FLUX_ALWAYS_EXCLUDE: &str = r".*(norm).*";

/// The linears of one Qwen-Image block (paths under `transformer_blocks.{i}.`), diffusers' names: every `Linear`
/// of `QwenImageTransformerBlock`, which musubi-tuner adapts.
pub const QWEN_IMAGE_BLOCK_LINEARS: [&str; 14] = [
    "img_mod.1",
    "txt_mod.1",
    "attn.to_q",
    "attn.to_k",
    "attn.to_v",
    "attn.add_q_proj",
    "attn.add_k_proj",
    "attn.add_v_proj",
    "attn.to_out.0",
    "attn.to_add_out",
    "img_mlp.net.0.proj",
    "img_mlp.net.2",
    "txt_mlp.net.0.proj",
    "txt_mlp.net.2",
];

/// musubi-tuner's exclude pattern for Qwen-Image (`networks/lora_qwen_image.py`), always added to the user's. It
/// is matched, like every pattern, against the dotted path (`transformer_blocks.0.img_mod.1`), where `_mod_` never
/// occurs: musubi-tuner's Qwen-Image LoRAs adapt the modulation linears too, and so do ours.
pub const QWEN_IMAGE_ALWAYS_EXCLUDE: &str = r".*(_mod_).*";

/// musubi-tuner's exclude pattern for HunyuanVideo 1.5 (`networks/lora_hv_1_5.py`), always added to the user's:
/// the input embedders (`img_in`, `txt_in`, `byt5_in`, …), which lie outside the double blocks anyway, so every
/// linear of a double block, the modulations included, is adapted.
pub const HUNYUAN_VIDEO15_ALWAYS_EXCLUDE: &str = r".*(_in).*";

/// The official LTX-2 trainer's default targets (`to_q`, `to_k`, `to_v`, `to_out.0` of every attention: video,
/// audio and the audio-video cross-attentions) as an exclude pattern: the feed-forwards (`ff`, `audio_ff`) and
/// LTX-2.3's head gates, left out only when the user gives no exclude patterns of their own (the trainer's configs
/// add `ff.net.0.proj` / `ff.net.2` by hand).
pub const LTX2_DEFAULT_EXCLUDE: &str = r".*(ff\.net\.|to_gate_logits).*";

/// The model family a LoRA is for: which block lists hold its adapted linears and musubi-tuner's default
/// exclusions for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LoraFamily {
    /// Wan 2.1 / 2.2: `blocks.{i}.…`.
    #[default]
    Wan,
    /// FLUX.1: `double_blocks.{i}.…` and `single_blocks.{i}.…`.
    Flux,
    /// Qwen-Image (and its Edit models): `transformer_blocks.{i}.…`.
    QwenImage,
    /// HunyuanVideo 1.5: `double_blocks.{i}.…` (official names).
    HunyuanVideo15,
    /// LTX-2 / LTX-2.3: `transformer_blocks.{i}.…` (ltx-core's names).
    Ltx2,
}

impl LoraFamily {
    /// The block lists whose linears can be adapted.
    fn block_lists(self) -> &'static [&'static str] {
        match self {
            Self::Wan => &["blocks"],
            Self::Flux => &["double_blocks", "single_blocks"],
            Self::QwenImage => &["transformer_blocks"],
            Self::HunyuanVideo15 => &["double_blocks"],
            Self::Ltx2 => &["transformer_blocks"],
        }
    }

    /// The exclude patterns added to the user's (`user_excludes`: whether the user gave any).
    fn default_excludes(self, user_excludes: bool) -> Vec<&'static str> {
        match self {
            Self::Wan => vec![WAN_DEFAULT_EXCLUDE],
            Self::Flux if user_excludes => vec![FLUX_ALWAYS_EXCLUDE],
            Self::Flux => vec![FLUX_DEFAULT_EXCLUDE, FLUX_ALWAYS_EXCLUDE],
            Self::QwenImage => vec![QWEN_IMAGE_ALWAYS_EXCLUDE],
            Self::HunyuanVideo15 => vec![HUNYUAN_VIDEO15_ALWAYS_EXCLUDE],
            Self::Ltx2 if user_excludes => Vec::new(),
            Self::Ltx2 => vec![LTX2_DEFAULT_EXCLUDE],
        }
    }
}

/// Errors building LoRA targets or adapters.
#[derive(Debug, thiserror::Error)]
pub enum LoraError {
    #[error("invalid LoRA module pattern `{pattern}`: {source}")]
    Pattern {
        pattern: String,
        #[source]
        source: Box<regex::Error>,
    },
    #[error("LoRA rank must be at least 1")]
    ZeroRank,
    #[error(
        "lora.rank = {rank} is more than the narrowest adapted linear allows ({module}: {in_dim} in, {out_dim} \
         out; a wider adapter only adds parameters): use lora.rank <= {max}"
    )]
    RankTooLarge {
        rank: usize,
        max: usize,
        module: String,
        in_dim: usize,
        out_dim: usize,
    },
    #[error("no linear layer matches the LoRA targets (include patterns {include:?}, exclude patterns {exclude:?})")]
    NoTargets {
        include: Vec<String>,
        exclude: Vec<String>,
    },
    #[error("the other model has no linear layer `{path}` for the shared LoRA")]
    NotShared { path: String },
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// Which module paths get an adapter, with musubi-tuner's rules: only linears inside the transformer blocks
/// (`blocks.{i}.…` for Wan, `double_blocks.{i}.…` / `single_blocks.{i}.…` for FLUX.1); a path is skipped when an
/// exclude pattern matches it in full, unless an include pattern also matches it in full (include patterns
/// re-admit excluded modules; they do not narrow the selection).
#[derive(Clone, Debug)]
pub struct LoraTargets {
    include: Vec<Regex>,
    exclude: Vec<Regex>,
    family: LoraFamily,
}

impl LoraTargets {
    /// Compiles the user's patterns for a Wan model; [`WAN_DEFAULT_EXCLUDE`] is always added to the excludes.
    pub fn new(include: &[String], exclude: &[String]) -> std::result::Result<Self, LoraError> {
        Self::for_family(LoraFamily::Wan, include, exclude)
    }

    /// Compiles the user's patterns for a model of `family`, with musubi-tuner's default excludes for it.
    pub fn for_family(
        family: LoraFamily,
        include: &[String],
        exclude: &[String],
    ) -> std::result::Result<Self, LoraError> {
        let compile = |p: &str| {
            // Python's re.fullmatch: the whole path must match.
            Regex::new(&format!("^(?:{p})$")).map_err(|source| LoraError::Pattern {
                pattern: p.to_string(),
                source: Box::new(source),
            })
        };
        let include = include
            .iter()
            .map(|p| compile(p))
            .collect::<std::result::Result<_, _>>()?;
        let mut exclude: Vec<Regex> = exclude
            .iter()
            .map(|p| compile(p))
            .collect::<std::result::Result<_, _>>()?;
        for pattern in family.default_excludes(!exclude.is_empty()) {
            exclude.push(compile(pattern)?);
        }
        Ok(Self {
            include,
            exclude,
            family,
        })
    }

    /// Whether the linear at `module_path` (e.g. `blocks.0.self_attn.q`) gets an adapter.
    pub fn matches(&self, module_path: &str) -> bool {
        let in_block = self
            .family
            .block_lists()
            .iter()
            .any(|list| in_block_list(list, module_path));
        if !in_block {
            return false;
        }
        let excluded = self.exclude.iter().any(|r| r.is_match(module_path));
        !excluded || self.include.iter().any(|r| r.is_match(module_path))
    }
}

/// Whether `path` is `{list}.{index}.{something}`.
fn in_block_list(list: &str, path: &str) -> bool {
    let mut parts = path.splitn(3, '.');
    parts.next() == Some(list)
        && parts
            .next()
            .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
        && parts.next().is_some_and(|rest| !rest.is_empty())
}

/// Refuses a `rank` above `min(in, out)` of the narrowest of `linears` (module path, `[in, out]`): the product
/// `up · down` of a wider adapter has no higher rank, so the extra rows only cost memory (a rank of 100000 on a
/// 128-wide model makes gigabytes of adapter). Checked before anything is allocated.
pub fn check_rank<'a>(
    rank: usize,
    linears: impl IntoIterator<Item = (&'a str, [usize; 2])>,
) -> std::result::Result<(), LoraError> {
    let narrowest = linears
        .into_iter()
        .min_by_key(|(_, [in_dim, out_dim])| (*in_dim).min(*out_dim));
    match narrowest {
        Some((module, [in_dim, out_dim])) if rank > in_dim.min(out_dim) => {
            Err(LoraError::RankTooLarge {
                rank,
                max: in_dim.min(out_dim),
                module: module.to_string(),
                in_dim,
                out_dim,
            })
        }
        _ => Ok(()),
    }
}

/// How fresh adapters are made.
#[derive(Clone, Debug)]
pub struct LoraSpec {
    pub rank: usize,
    /// `alpha / rank` scales the adapter's output; 0 means `alpha = rank` (scale 1), as musubi-tuner does.
    pub alpha: f64,
    /// Storage dtype of `down` and `up`.
    pub dtype: DType,
    pub include_patterns: Vec<String>,
    pub exclude_patterns: Vec<String>,
    /// Seeds `down`'s initialisation (mixed with each module's path, so adding a module changes no other).
    pub seed: u64,
    /// LoRA, LoKr, LoHa or DoRA.
    pub kind: AdapterKind,
}

/// Attaches a fresh adapter to every linear in `modules` (path, layer) of a Wan model that the spec targets,
/// replacing any adapter already there, and returns them in [`LoraSet`] order. `down` is Kaiming-uniform like
/// musubi-tuner (bound 1/√in), drawn on the host from the spec's seed mixed with the module path; `up` is zero;
/// both live on the layer's device.
pub fn attach_loras<'a, I>(modules: I, spec: &LoraSpec) -> std::result::Result<LoraSet, LoraError>
where
    I: IntoIterator<Item = (String, &'a mut Linear)>,
{
    attach_family_loras(modules, spec, LoraFamily::Wan)
}

/// [`attach_loras`] for a model of `family` (its block lists and default excludes).
pub fn attach_family_loras<'a, I>(
    modules: I,
    spec: &LoraSpec,
    family: LoraFamily,
) -> std::result::Result<LoraSet, LoraError>
where
    I: IntoIterator<Item = (String, &'a mut Linear)>,
{
    if spec.rank == 0 {
        return Err(LoraError::ZeroRank);
    }
    let targets = LoraTargets::for_family(family, &spec.include_patterns, &spec.exclude_patterns)?;
    let alpha = if spec.alpha == 0.0 {
        spec.rank as f64
    } else {
        spec.alpha
    };
    let selected: Vec<(String, &mut Linear)> = modules
        .into_iter()
        .filter(|(path, _)| targets.matches(path))
        .collect();
    // LoKr's rank only bounds its factors' products; a rank past them makes those factors full (LyCORIS).
    if !matches!(spec.kind, AdapterKind::Lokr { .. }) {
        check_rank(
            spec.rank,
            selected
                .iter()
                .map(|(path, l)| (path.as_str(), [l.in_dim(), l.out_dim()])),
        )?;
    }
    let mut created = Vec::new();
    for (path, linear) in selected {
        let shape = AdapterShape {
            in_dim: linear.in_dim(),
            out_dim: linear.out_dim(),
            rank: spec.rank,
            alpha,
            dtype: spec.dtype,
        };
        let adapter = Adapter::new(
            spec.kind,
            shape,
            linear.base(),
            &mut StdRng::seed_from_u64(spec.seed ^ fnv1a(path.as_bytes())),
        )?;
        linear.set_adapter(Some(adapter.clone()));
        created.push((path, adapter));
    }
    if created.is_empty() {
        return Err(LoraError::NoTargets {
            include: spec.include_patterns.clone(),
            exclude: spec.exclude_patterns.clone(),
        });
    }
    Ok(LoraSet::of_adapters(created))
}

/// FNV-1a: a fixed hash of the module path (std's hasher may change between Rust releases).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Compares dotted paths segment by segment, numeric segments as numbers.
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    let mut xs = a.split('.');
    let mut ys = b.split('.');
    loop {
        match (xs.next(), ys.next()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) => {
                let ord = match (x.parse::<u64>(), y.parse::<u64>()) {
                    (Ok(i), Ok(j)) => i.cmp(&j),
                    _ => x.cmp(y),
                };
                if ord != Ordering::Equal {
                    return ord;
                }
            }
        }
    }
}

mod set;
#[cfg(test)]
mod tests;

pub use set::LoraSet;
