//! `framesmith lora convert`: an adapter file from one key layout to another, through musubi-tuner's names. The
//! tensors are renamed, never recomputed, where the layouts name the same modules, so a round trip gives the
//! same tensors bit for bit; only where a layout splits or stacks a module (FLUX.1's q, k, v in diffusers'
//! names, HunyuanVideo 1.5's in ComfyUI's) are they sliced or stacked, in a way the way back undoes exactly.
//!
//! - musubi-tuner: `lora_unet_{module_}.lora_down.weight`, `.lora_up.weight`, `.alpha`; LyCORIS' names for the
//!   other kinds (`.lokr_w1`, `.hada_w1_a`, `.dora_scale`).
//! - ComfyUI: `diffusion_model.{module}.lora_down.weight` etc. as ComfyUI saves LoRAs (it reads `lora_A` /
//!   `lora_B` too); HunyuanVideo 1.5 as musubi-tuner's `convert_hunyuan_video_1_5_lora_to_comfy.py` writes it.
//! - diffusers / PEFT: `transformer.{diffusers module}.lora_A.weight`, `.lora_B.weight`, plain LoRA only; PEFT has
//!   no per-module alpha tensor, so alphas go where diffusers reads them: the `lora_adapter_metadata` header
//!   entry (`transformer.lora_alpha`, `transformer.alpha_pattern`) that `save_lora_weights` writes.

mod flux;
mod peft;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::Path;
use std::str::FromStr;

use anyhow::{anyhow, bail, Context, Result};
use candle_core::Tensor;
use framesmith_nn::lora::LoraFamily;
use framesmith_nn::lora_file::{module_path, musubi_name, RawTensors, MUSUBI_PREFIX};

use super::family;
use crate::hunyuan_video15::lora_keys as hunyuan;
use crate::wan::lora_keys as wan;

/// A key layout of adapter files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    Musubi,
    Comfyui,
    Diffusers,
}

impl Layout {
    /// The name `--to` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Musubi => "musubi",
            Self::Comfyui => "comfyui",
            Self::Diffusers => "diffusers",
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Layout {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "musubi" | "musubi-tuner" | "kohya" => Ok(Self::Musubi),
            "comfyui" | "comfy" => Ok(Self::Comfyui),
            "diffusers" | "peft" => Ok(Self::Diffusers),
            other => Err(format!(
                "unknown layout `{other}` (expected musubi, comfyui or diffusers)"
            )),
        }
    }
}

/// What a conversion did.
#[derive(Clone, Debug, PartialEq)]
pub struct ConvertReport {
    pub family: LoraFamily,
    /// The layout most of the input's modules were in.
    pub from: Layout,
    pub to: Layout,
    /// Modules written.
    pub modules: usize,
}

/// The musubi-tuner-named tensors of one adapter file, grouped by module: suffix (`lora_down.weight`, `alpha`,
/// `lokr_w1`, …) → tensor.
pub(super) type Modules = BTreeMap<String, BTreeMap<String, Tensor>>;

/// Converts the adapter file `input` to `to`'s layout at `output` (a new file: never `input`), for `family`
/// (detected from the names when `None`).
pub fn convert(
    input: &Path,
    output: &Path,
    to: Layout,
    family: Option<LoraFamily>,
) -> Result<ConvertReport> {
    super::refuse_same_file(input, output, "convert")?;
    let raw = RawTensors::read(input).context("cannot read the adapter")?;
    // The input's path last in every message about its contents.
    let at = |e: anyhow::Error| anyhow!("{e:#}: {}", input.display());
    let keys: Vec<&str> = raw.tensors.iter().map(|(k, _)| k.as_str()).collect();
    let family = match family {
        Some(f) => f,
        None => family::detect(&keys).map_err(at)?,
    };
    let (modules, from) = to_musubi(&raw, family).map_err(at)?;
    if to != Layout::Musubi {
        check_family(&modules, family).map_err(at)?;
    }
    let count = modules.len();
    let out = from_musubi(modules, &raw.metadata, to, family)
        .context(format!(
            "no {to} layout for this adapter (convert to another layout, or keep musubi-tuner's)"
        ))
        .map_err(at)?;
    out.write(output)
        .with_context(|| format!("cannot write {}", output.display()))?;
    Ok(ConvertReport {
        family,
        from,
        to,
        modules: count,
    })
}

/// Refuses a module (musubi-tuner's name) outside `family`'s blocks: an adapter for another model, or a
/// `--family` that is not its own.
fn check_family(modules: &Modules, family: LoraFamily) -> Result<()> {
    let lists: &[&str] = match family {
        LoraFamily::Wan => &["blocks."],
        LoraFamily::Flux => &["double_blocks.", "single_blocks."],
        LoraFamily::QwenImage => &["transformer_blocks."],
        LoraFamily::HunyuanVideo15 => &[],
        LoraFamily::Ltx2 => bail!("`lora convert` has no key map for LTX-2 LoRAs"),
    };
    for name in modules.keys() {
        let fits = match family {
            LoraFamily::HunyuanVideo15 => name.starts_with("lora_unet_double_blocks_"),
            _ => module_path(name).is_some_and(|p| lists.iter().any(|l| p.starts_with(l))),
        };
        if !fits {
            bail!(
                "`{name}` is not a block linear of a {} model (is the adapter for another model? give its \
                 --family)",
                family::family_name(family)
            );
        }
    }
    Ok(())
}

/// The part after a module's name, in musubi-tuner's spelling (`lora_A.weight` → `lora_down.weight`).
fn musubi_suffix(part: &str) -> &str {
    match part {
        "lora_A.weight" => "lora_down.weight",
        "lora_B.weight" => "lora_up.weight",
        other => other,
    }
}

/// How a key's module part is named.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Naming<'a> {
    /// `lora_unet_…` (or SimpleTuner's `lycoris_…`): the rest.
    Musubi(&'a str),
    /// Official dotted module path (after `diffusion_model.`).
    Official(&'a str),
    /// diffusers' dotted module path (after `transformer.`).
    Diffusers(&'a str),
}

fn naming(module: &str, family: LoraFamily) -> Naming<'_> {
    if let Some(rest) = module.strip_prefix(MUSUBI_PREFIX) {
        return Naming::Musubi(rest);
    }
    if let Some(rest) = module.strip_prefix("lycoris_") {
        return Naming::Musubi(rest);
    }
    for p in ["model.diffusion_model.", "diffusion_model."] {
        if let Some(rest) = module.strip_prefix(p) {
            return Naming::Official(rest);
        }
    }
    for p in ["transformer.", "base_model.model."] {
        if let Some(rest) = module.strip_prefix(p) {
            return Naming::Diffusers(rest);
        }
    }
    // Unprefixed dotted names: diffusers' where they are the family's diffusers names, else official.
    let diffusers = match family {
        LoraFamily::Flux => {
            module.starts_with("transformer_blocks.")
                || module.starts_with("single_transformer_blocks.")
        }
        LoraFamily::Wan => wan::from_diffusers(module).is_some(),
        _ => false,
    };
    if diffusers {
        Naming::Diffusers(module)
    } else {
        Naming::Official(module)
    }
}

/// The file's modules under musubi-tuner's names and suffixes, and the layout most of them were in.
fn to_musubi(raw: &RawTensors, family: LoraFamily) -> Result<(Modules, Layout)> {
    let mut modules = Modules::new();
    let mut diffusers = Modules::new();
    let mut counts: HashMap<&'static str, usize> = HashMap::new();
    for (key, tensor) in &raw.tensors {
        let (module, part) = crate::adapter_file::split(key).with_context(|| {
            format!("`{key}` is not an adapter tensor (lora_down / lora_A, lora_up / lora_B, alpha, LyCORIS names)")
        })?;
        let suffix = musubi_suffix(part).to_string();
        let (layout, name) = match naming(module, family) {
            Naming::Musubi(rest) => (Layout::Musubi, format!("{MUSUBI_PREFIX}{rest}")),
            Naming::Official(path) => (Layout::Comfyui, musubi_name(path)),
            Naming::Diffusers(path) => {
                *counts.entry(Layout::Diffusers.name()).or_default() += 1;
                diffusers
                    .entry(path.to_string())
                    .or_default()
                    .insert(suffix, tensor.clone());
                continue;
            }
        };
        *counts.entry(layout.name()).or_default() += 1;
        modules
            .entry(name)
            .or_default()
            .insert(suffix, tensor.clone());
    }
    if !diffusers.is_empty() {
        peft::add_alphas(&mut diffusers, &raw.metadata)?;
        modules.extend(from_diffusers(diffusers, family)?);
    }
    let from = ["musubi", "comfyui", "diffusers"]
        .into_iter()
        .max_by_key(|l| counts.get(l).copied().unwrap_or(0))
        .and_then(|l| l.parse().ok())
        .unwrap_or(Layout::Musubi);
    if family == LoraFamily::HunyuanVideo15 {
        // ComfyUI's stacked q, k, v and its module names back to musubi-tuner's (a no-op on musubi-tuner's).
        let flat = flatten(modules);
        let from_comfy = hunyuan::from_comfyui(&flat)?;
        let stacked = flat
            .keys()
            .any(|k| k.contains("_attn_qkv.") || k.contains("_mlp_0.") || k.contains("_mod_lin."));
        let from = if stacked { Layout::Comfyui } else { from };
        return Ok((group(from_comfy)?, from));
    }
    Ok((modules, from))
}

/// Modules named by diffusers' module paths, under musubi-tuner's names.
fn from_diffusers(modules: Modules, family: LoraFamily) -> Result<Modules> {
    match family {
        LoraFamily::Flux => flux::fuse(modules),
        LoraFamily::QwenImage => Ok(modules
            .into_iter()
            .map(|(path, parts)| (musubi_name(&path), parts))
            .collect()),
        LoraFamily::Wan => modules
            .into_iter()
            .map(|(path, parts)| {
                let official = wan::from_diffusers(&path).with_context(|| {
                    format!("diffusers' Wan module `{path}` has no official counterpart")
                })?;
                Ok((musubi_name(&official), parts))
            })
            .collect(),
        LoraFamily::Ltx2 => bail!("`lora convert` has no key map for LTX-2 LoRAs"),
        LoraFamily::HunyuanVideo15 => {
            bail!("HunyuanVideo 1.5 LoRAs in diffusers' names are not read (use musubi-tuner's or ComfyUI's)")
        }
    }
}

/// `{module}.{suffix}` → tensor.
fn flatten(modules: Modules) -> HashMap<String, Tensor> {
    modules
        .into_iter()
        .flat_map(|(m, parts)| parts.into_iter().map(move |(s, t)| (format!("{m}.{s}"), t)))
        .collect()
}

/// The inverse of [`flatten`].
fn group(flat: HashMap<String, Tensor>) -> Result<Modules> {
    let mut modules = Modules::new();
    for (key, t) in flat {
        let (module, part) = crate::adapter_file::split(&key)
            .with_context(|| format!("`{key}` is not an adapter tensor"))?;
        modules
            .entry(module.to_string())
            .or_default()
            .insert(part.to_string(), t);
    }
    Ok(modules)
}

/// The official module path of a musubi-tuner module name, or why it cannot be told.
fn official_path(name: &str) -> Result<String> {
    module_path(name).with_context(|| {
        format!("`{name}`'s module path cannot be told from its underscores (only block linears can be renamed)")
    })
}

/// `modules` (musubi-tuner's names) in `to`'s layout, with `metadata` carried over (and, for diffusers, the
/// alphas added to it; out of it, for the other layouts).
fn from_musubi(
    modules: Modules,
    metadata: &HashMap<String, String>,
    to: Layout,
    family: LoraFamily,
) -> Result<RawTensors> {
    let mut metadata = metadata.clone();
    metadata.remove(peft::METADATA_KEY);
    let tensors: Vec<(String, Tensor)> = match (to, family) {
        (Layout::Musubi, _) => flatten(modules).into_iter().collect(),
        (Layout::Comfyui, LoraFamily::HunyuanVideo15) => hunyuan::to_comfyui(&flatten(modules))?
            .into_iter()
            .collect(),
        (Layout::Comfyui, _) => {
            let mut out = Vec::new();
            for (name, parts) in modules {
                let path = official_path(&name)?;
                out.extend(
                    parts
                        .into_iter()
                        .map(|(s, t)| (format!("diffusion_model.{path}.{s}"), t)),
                );
            }
            out
        }
        (Layout::Diffusers, LoraFamily::HunyuanVideo15) => {
            bail!("Framesmith has no diffusers key map for HunyuanVideo 1.5")
        }
        (Layout::Diffusers, _) => {
            let diffusers = to_diffusers_paths(modules, family)?;
            metadata.insert(peft::METADATA_KEY.into(), peft::metadata(&diffusers)?);
            peft::tensors(diffusers)
        }
    };
    let mut tensors = tensors;
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(RawTensors { tensors, metadata })
}

/// Plain LoRA modules under diffusers' module paths (FLUX.1's fused modules split); other kinds refused by name.
fn to_diffusers_paths(modules: Modules, family: LoraFamily) -> Result<Modules> {
    if let Some((name, parts)) = modules.iter().find(|(_, parts)| {
        parts
            .keys()
            .any(|s| !matches!(s.as_str(), "lora_down.weight" | "lora_up.weight" | "alpha"))
    }) {
        let kind = if parts.contains_key("dora_scale") {
            "DoRA"
        } else if parts.keys().any(|s| s.starts_with("lokr_")) {
            "LoKr"
        } else {
            "LoHa"
        };
        bail!("`{name}` is a {kind} module; the diffusers / PEFT layout holds plain LoRA only");
    }
    match family {
        LoraFamily::Flux => flux::split(modules),
        _ => modules
            .into_iter()
            .map(|(name, parts)| {
                let path = official_path(&name)?;
                let path = match family {
                    LoraFamily::Wan => wan::to_diffusers(&path)
                        .with_context(|| format!("`{path}` has no diffusers name"))?,
                    _ => path,
                };
                Ok((path, parts))
            })
            .collect(),
    }
}
