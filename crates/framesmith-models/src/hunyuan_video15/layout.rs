//! The key layouts HunyuanVideo 1.5 transformers come in, read through one internal layout (the official
//! release's names, [`super::transformer`]): the official `tencent/HunyuanVideo-1.5` files as they are; ComfyUI's
//! repackaged single files (bf16 and FP8), whose double blocks stack q, k and v in one `img_attn_qkv` /
//! `txt_attn_qkv`; and diffusers folders (`HunyuanVideo15Transformer3DModel`), whose names differ throughout,
//! whose refiner splits `self_attn_qkv` into `to_q` / `to_k` / `to_v` and whose head stores (scale, shift) where
//! the official one stores (shift, scale). [`LayoutSource`] answers official names from any of them.

use std::sync::Arc;

use candle_core::{Result, Tensor};

use framesmith_nn::vb::TensorSource;

/// How a checkpoint names the transformer's tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyLayout {
    /// The official release (`double_blocks.0.img_attn_q.weight`).
    Official,
    /// ComfyUI's repackaged files: official names with q, k, v stacked (`double_blocks.0.img_attn_qkv.weight`).
    ComfyUi,
    /// diffusers (`transformer_blocks.0.attn.to_q.weight`).
    Diffusers,
}

/// Where an official tensor is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Stored {
    /// Under another name.
    Renamed(String),
    /// Part `index` of three stacked along dim 0 under this name (ComfyUI's q, k, v).
    Third(String, usize),
    /// The three tensors stacked along dim 0 (diffusers' refiner `to_q`, `to_k`, `to_v`).
    Stacked([String; 3]),
    /// Under another name with its two halves swapped (diffusers' `norm_out.linear`).
    Swapped(String),
}

/// The official block modules (under `double_blocks.N.`) and their diffusers names (under
/// `transformer_blocks.N.`).
const DIFFUSERS_BLOCK: [(&str, &str); 18] = [
    ("img_mod.linear", "norm1.linear"),
    ("txt_mod.linear", "norm1_context.linear"),
    ("img_attn_q", "attn.to_q"),
    ("img_attn_k", "attn.to_k"),
    ("img_attn_v", "attn.to_v"),
    ("img_attn_q_norm", "attn.norm_q"),
    ("img_attn_k_norm", "attn.norm_k"),
    ("img_attn_proj", "attn.to_out.0"),
    ("txt_attn_q", "attn.add_q_proj"),
    ("txt_attn_k", "attn.add_k_proj"),
    ("txt_attn_v", "attn.add_v_proj"),
    ("txt_attn_q_norm", "attn.norm_added_q"),
    ("txt_attn_k_norm", "attn.norm_added_k"),
    ("txt_attn_proj", "attn.to_add_out"),
    ("img_mlp.fc1", "ff.net.0.proj"),
    ("img_mlp.fc2", "ff.net.2"),
    ("txt_mlp.fc1", "ff_context.net.0.proj"),
    ("txt_mlp.fc2", "ff_context.net.2"),
];

/// The official refiner-block modules (under `txt_in.individual_token_refiner.blocks.N.`) and their diffusers
/// names (under `context_embedder.token_refiner.refiner_blocks.N.`), `self_attn_qkv` aside.
const DIFFUSERS_REFINER_BLOCK: [(&str, &str); 6] = [
    ("norm1", "norm1"),
    ("norm2", "norm2"),
    ("self_attn_proj", "attn.to_out.0"),
    ("mlp.fc1", "ff.net.0.proj"),
    ("mlp.fc2", "ff.net.2"),
    ("adaLN_modulation.1", "norm_out.linear"),
];

/// The official modules outside the blocks and their diffusers names.
const DIFFUSERS_MODULES: [(&str, &str); 18] = [
    ("img_in.proj", "x_embedder.proj"),
    ("time_in.mlp.0", "time_embed.timestep_embedder.linear_1"),
    ("time_in.mlp.2", "time_embed.timestep_embedder.linear_2"),
    ("cond_type_embedding", "cond_type_embed"),
    ("vision_in.proj.0", "image_embedder.norm_in"),
    ("vision_in.proj.1", "image_embedder.linear_1"),
    ("vision_in.proj.3", "image_embedder.linear_2"),
    ("vision_in.proj.4", "image_embedder.norm_out"),
    ("byt5_in.layernorm", "context_embedder_2.norm"),
    ("byt5_in.fc1", "context_embedder_2.linear_1"),
    ("byt5_in.fc2", "context_embedder_2.linear_2"),
    ("byt5_in.fc3", "context_embedder_2.linear_3"),
    ("txt_in.input_embedder", "context_embedder.proj_in"),
    (
        "txt_in.t_embedder.mlp.0",
        "context_embedder.time_text_embed.timestep_embedder.linear_1",
    ),
    (
        "txt_in.t_embedder.mlp.2",
        "context_embedder.time_text_embed.timestep_embedder.linear_2",
    ),
    (
        "txt_in.c_embedder.linear_1",
        "context_embedder.time_text_embed.text_embedder.linear_1",
    ),
    (
        "txt_in.c_embedder.linear_2",
        "context_embedder.time_text_embed.text_embedder.linear_2",
    ),
    ("final_layer.linear", "proj_out"),
];

/// The diffusers path of the official block module `double_blocks.{i}.{module}` (`transformer_blocks.{i}.attn.to_q`
/// for `double_blocks.{i}.img_attn_q`), `None` for another path.
pub fn diffusers_block_path(path: &str) -> Option<String> {
    let (i, module) = path.strip_prefix("double_blocks.")?.split_once('.')?;
    let (_, d) = DIFFUSERS_BLOCK.iter().find(|(o, _)| *o == module)?;
    Some(format!("transformer_blocks.{i}.{d}"))
}

/// The name diffusers stores the official tensor `key` under (the first of the three it stacks, for the refiner's
/// `self_attn_qkv`).
pub(crate) fn diffusers_name(key: &str) -> String {
    match diffusers_stored(key) {
        Stored::Renamed(k) | Stored::Swapped(k) | Stored::Third(k, _) => k,
        Stored::Stacked([q, _, _]) => q,
    }
}

const REFINER_PREFIX: &str = "txt_in.individual_token_refiner.blocks.";

/// `prefix` + an index + `.` + the rest: (index, rest).
fn indexed<'a>(key: &'a str, prefix: &str) -> Option<(&'a str, &'a str)> {
    key.strip_prefix(prefix)?.split_once('.')
}

impl KeyLayout {
    /// Where the official tensor `key` is stored in this layout.
    fn stored(self, key: &str) -> Stored {
        match self {
            Self::Official => Stored::Renamed(key.to_string()),
            Self::ComfyUi => comfy_stored(key),
            Self::Diffusers => diffusers_stored(key),
        }
    }
}

fn comfy_stored(key: &str) -> Stored {
    if let Some((i, rest)) = indexed(key, "double_blocks.") {
        for stream in ["img", "txt"] {
            for (index, x) in ["q", "k", "v"].into_iter().enumerate() {
                if let Some(leaf) = rest.strip_prefix(&format!("{stream}_attn_{x}.")) {
                    return Stored::Third(
                        format!("double_blocks.{i}.{stream}_attn_qkv.{leaf}"),
                        index,
                    );
                }
            }
        }
    }
    Stored::Renamed(key.to_string())
}

fn diffusers_stored(key: &str) -> Stored {
    let Some((module, leaf)) = key.rsplit_once('.') else {
        return Stored::Renamed(key.to_string());
    };
    if let Some((i, rest)) = indexed(module, "double_blocks.").map(|(i, r)| (i, r.to_string())) {
        if let Some((_, d)) = DIFFUSERS_BLOCK.iter().find(|(o, _)| *o == rest) {
            return Stored::Renamed(format!("transformer_blocks.{i}.{d}.{leaf}"));
        }
    }
    if let Some((i, rest)) = indexed(key, REFINER_PREFIX) {
        let base = format!("context_embedder.token_refiner.refiner_blocks.{i}");
        if let Some(leaf) = rest.strip_prefix("self_attn_qkv.") {
            return Stored::Stacked(["q", "k", "v"].map(|x| format!("{base}.attn.to_{x}.{leaf}")));
        }
        if let Some((m, leaf)) = rest.rsplit_once('.') {
            if let Some((_, d)) = DIFFUSERS_REFINER_BLOCK.iter().find(|(o, _)| *o == m) {
                return Stored::Renamed(format!("{base}.{d}.{leaf}"));
            }
        }
    }
    if module == "final_layer.adaLN_modulation.1" {
        return Stored::Swapped(format!("norm_out.linear.{leaf}"));
    }
    match DIFFUSERS_MODULES.iter().find(|(o, _)| *o == module) {
        Some((_, d)) => Stored::Renamed(format!("{d}.{leaf}")),
        None => Stored::Renamed(key.to_string()),
    }
}

/// Part `index` of three along dim 0; a scale that is one value for the whole stacked tensor is shared as is.
fn third(t: &Tensor, index: usize) -> Result<Tensor> {
    match t.dims().first() {
        Some(&n) if n >= 3 && n % 3 == 0 => t.narrow(0, index * n / 3, n / 3),
        _ => Ok(t.clone()),
    }
}

/// The tensors of a checkpoint in `layout`, answered by their official names.
pub struct LayoutSource {
    inner: Arc<dyn TensorSource>,
    layout: KeyLayout,
}

impl LayoutSource {
    pub fn new(inner: Arc<dyn TensorSource>, layout: KeyLayout) -> Self {
        Self { inner, layout }
    }
}

impl TensorSource for LayoutSource {
    fn contains(&self, key: &str) -> bool {
        match self.layout.stored(key) {
            Stored::Renamed(k) | Stored::Third(k, _) | Stored::Swapped(k) => {
                self.inner.contains(&k)
            }
            Stored::Stacked(keys) => keys.iter().all(|k| self.inner.contains(k)),
        }
    }

    fn read(&self, key: &str) -> Result<Option<Tensor>> {
        match self.layout.stored(key) {
            Stored::Renamed(k) => self.inner.read(&k),
            Stored::Third(k, index) => self.inner.read(&k)?.map(|t| third(&t, index)).transpose(),
            Stored::Swapped(k) => self
                .inner
                .read(&k)?
                .map(|t| {
                    let n = t.dim(0)? / 2;
                    Tensor::cat(&[t.narrow(0, n, n)?, t.narrow(0, 0, n)?], 0)
                })
                .transpose(),
            Stored::Stacked(keys) => {
                let mut parts = Vec::with_capacity(3);
                for k in &keys {
                    match self.inner.read(k)? {
                        Some(t) => parts.push(t),
                        None => return Ok(None),
                    }
                }
                Tensor::cat(&parts, 0).map(Some)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn official_names_map_to_each_layout() {
        let d = KeyLayout::Diffusers;
        assert_eq!(
            d.stored("double_blocks.3.txt_mlp.fc2.bias"),
            Stored::Renamed("transformer_blocks.3.ff_context.net.2.bias".into())
        );
        assert_eq!(
            d.stored("txt_in.individual_token_refiner.blocks.1.mlp.fc1.weight"),
            Stored::Renamed(
                "context_embedder.token_refiner.refiner_blocks.1.ff.net.0.proj.weight".into()
            )
        );
        assert_eq!(
            d.stored("final_layer.adaLN_modulation.1.weight"),
            Stored::Swapped("norm_out.linear.weight".into())
        );
        assert_eq!(
            d.stored("img_in.proj.bias"),
            Stored::Renamed("x_embedder.proj.bias".into())
        );
        let c = KeyLayout::ComfyUi;
        assert_eq!(
            c.stored("double_blocks.0.txt_attn_v.scale_weight"),
            Stored::Third("double_blocks.0.txt_attn_qkv.scale_weight".into(), 2)
        );
        assert_eq!(
            c.stored("double_blocks.0.txt_attn_q_norm.weight"),
            Stored::Renamed("double_blocks.0.txt_attn_q_norm.weight".into())
        );
    }
}
