//! Says what a FLUX.1 model file is and opens it: the DiT (official `flux1-dev.safetensors` layout or ComfyUI's
//! `model.diffusion_model.` prefix; bf16 / fp16 or FP8 `float8_e4m3fn`, with ComfyUI's `scaled_fp8` scales), the
//! autoencoder (`ae.safetensors`), CLIP-L (`clip_l.safetensors`) and T5-XXL (`t5xxl_*.safetensors`, FP8 scaled
//! included). Headers only until a file is opened; a file that is not what was asked for — a diffusers folder,
//! schnell or Kontext given for dev, a Wan file given as FLUX — gets an error saying what it is and what to pick.

mod error;
mod keys;
mod load;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

pub use error::FluxFormatError;
pub use keys::official_shapes;
pub use load::{load_autoencoder, load_clip_text, load_dit, load_dit_streamed, load_t5_xxl};

use super::FluxConfig;
use crate::checkpoint::{comfy_prefix, entries, Names, Tally, SCALED_FP8_MARKER};
use crate::wan::weights::{read_header, write_size_lines, MappedTensors, TensorInfo};

/// The files a FLUX.1 run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FluxComponent {
    Dit,
    Autoencoder,
    ClipL,
    T5,
}

impl FluxComponent {
    /// Where the file goes.
    pub fn role(self) -> &'static str {
        match self {
            Self::Dit => "diffusion model (DiT)",
            Self::Autoencoder => "VAE (autoencoder)",
            Self::ClipL => "CLIP-L text encoder",
            Self::T5 => "T5-XXL text encoder",
        }
    }

    /// The released file to pick for it.
    pub fn file(self) -> &'static str {
        match self {
            Self::Dit => {
                "flux1-dev.safetensors (black-forest-labs/FLUX.1-dev, or ComfyUI's flux1-dev file)"
            }
            Self::Autoencoder => "ae.safetensors (from the FLUX.1 repository)",
            Self::ClipL => "clip_l.safetensors",
            Self::T5 => "t5xxl_fp16.safetensors or t5xxl_fp8_e4m3fn_scaled.safetensors",
        }
    }
}

/// The released FLUX.1 DiTs with the text-to-image shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FluxVariant {
    /// FLUX.1 [dev] (and Krea [dev]): guidance-distilled.
    Dev,
    /// FLUX.1 [schnell]: timestep-distilled, no guidance input.
    Schnell,
    /// FLUX.1 Kontext [dev]: dev's shapes, trained to edit a conditioning image; told apart by name or metadata.
    Kontext,
}

impl fmt::Display for FluxVariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Dev => "FLUX.1 [dev]",
            Self::Schnell => "FLUX.1 [schnell]",
            Self::Kontext => "FLUX.1 Kontext [dev]",
        })
    }
}

/// What a FLUX.1 file holds.
#[derive(Debug, Clone, PartialEq)]
pub enum FluxKind {
    /// The DiT, with the sizes read from its shapes.
    Dit {
        variant: FluxVariant,
        config: FluxConfig,
    },
    /// The autoencoder.
    Autoencoder { z_channels: usize, ch: usize },
    /// A CLIP text model (CLIP-L when 768 wide with 12 layers).
    ClipText { hidden: usize, layers: usize },
    /// A T5 v1.1 encoder (T5-XXL when 4096 wide).
    T5 { dim: usize, layers: usize },
}

impl FluxKind {
    /// The component this is.
    pub fn component(&self) -> FluxComponent {
        match self {
            Self::Dit { .. } => FluxComponent::Dit,
            Self::Autoencoder { .. } => FluxComponent::Autoencoder,
            Self::ClipText { .. } => FluxComponent::ClipL,
            Self::T5 { .. } => FluxComponent::T5,
        }
    }

    /// The model, specifically.
    pub fn title(&self) -> String {
        match self {
            Self::Dit { variant, config } if config.hidden_size == 3072 => format!("{variant} DiT"),
            Self::Dit { variant, config } => format!(
                "{variant}-style DiT (width {}, not a released size)",
                config.hidden_size
            ),
            Self::Autoencoder { z_channels: 16, .. } => {
                "FLUX.1 autoencoder (16 latent channels, 8× down-sampling)".into()
            }
            Self::Autoencoder { z_channels, .. } => {
                format!("autoencoder with {z_channels} latent channels")
            }
            Self::ClipText {
                hidden: 768,
                layers: 12,
            } => "CLIP-L text encoder".into(),
            Self::ClipText { hidden, layers } => {
                format!("CLIP text encoder (width {hidden}, {layers} layers)")
            }
            Self::T5 { dim: 4096, .. } => "T5-XXL v1.1 text encoder".into(),
            Self::T5 { dim, .. } => format!("T5 v1.1 text encoder (width {dim})"),
        }
    }
}

/// How the weights are stored when some are FP8.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fp8Storage {
    /// `float8_e4m3fn` weights without scales.
    Plain,
    /// ComfyUI `scaled_fp8`: a scale per weight (`scale_weight` or `weight_scale`).
    Scaled,
}

/// What [`identify`] found, from the header alone.
#[derive(Debug, Clone)]
pub struct FluxFile {
    pub path: PathBuf,
    pub kind: FluxKind,
    /// The prefix before the official names (ComfyUI's `model.diffusion_model.`), if any.
    pub prefix: Option<&'static str>,
    pub fp8: Option<Fp8Storage>,
    /// Number of tensors per dtype (safetensors spelling).
    pub dtypes: BTreeMap<String, usize>,
    pub parameter_count: u64,
    pub bytes_on_disk: u64,
    /// Other models stored in the same file (ComfyUI's all-in-one checkpoints bundle the VAE and text encoders).
    pub bundled: Vec<&'static str>,
}

/// Says what the FLUX.1 file at `path` is. Anything else — a diffusers folder, a Wan or other model, an unknown
/// file — is an error that says what it is.
pub fn identify(path: &Path) -> Result<FluxFile, FluxFormatError> {
    if path.is_dir() {
        if path.join("model_index.json").is_file() || path.join("transformer").is_dir() {
            return Err(FluxFormatError::DiffusersFolder {
                path: path.to_path_buf(),
            });
        }
        return Err(FluxFormatError::Unknown {
            reason: "this is a folder; FLUX.1 files are single .safetensors files".into(),
            path: path.to_path_buf(),
        });
    }
    let header = read_header(path)?;
    let prefix = comfy_prefix(&header.tensors, "double_blocks.");
    let names = Names::new(&header.tensors, prefix);
    let kind = classify(&names, &header.metadata, path)?;
    let tally = Tally::of(&header.tensors);
    let fp8 = tally.dtypes.contains_key("F8_E4M3").then(|| {
        let scaled = names.has(SCALED_FP8_MARKER) || tally.scaled_fp8;
        if scaled {
            Fp8Storage::Scaled
        } else {
            Fp8Storage::Plain
        }
    });
    Ok(FluxFile {
        path: path.to_path_buf(),
        kind,
        prefix,
        fp8,
        dtypes: tally.dtypes,
        parameter_count: tally.parameter_count,
        bytes_on_disk: header.file_bytes,
        bundled: bundled(&header.tensors),
    })
}

/// [`identify`], then checks that the file is the `expected` component (and, for the DiT, variant).
pub fn identify_expected(
    path: &Path,
    expected: FluxComponent,
    variant: Option<FluxVariant>,
) -> Result<FluxFile, FluxFormatError> {
    let file = identify(path)?;
    let found = file.kind.component();
    if found != expected {
        return Err(FluxFormatError::WrongComponent {
            found: file.kind.title(),
            found_role: found.role(),
            expected: format!("the {}", expected.role()),
            expected_file: expected.file(),
            path: path.to_path_buf(),
        });
    }
    if let (FluxKind::Dit { variant: got, .. }, Some(want)) = (&file.kind, variant) {
        if *got != want {
            return Err(FluxFormatError::WrongVariant {
                found: got.to_string(),
                expected: want.to_string(),
                fix: format!("pick the {want} weights, or switch the run's model to {got}"),
                path: path.to_path_buf(),
            });
        }
    }
    Ok(file)
}

/// Key prefixes of the models ComfyUI bundles beside the DiT in one checkpoint, with their names.
const BUNDLED: [(&str, &str); 5] = [
    ("vae.", "a VAE"),
    ("first_stage_model.", "a VAE"),
    ("text_encoders.clip_l.", "CLIP-L"),
    ("cond_stage_model.", "a text encoder"),
    ("text_encoders.t5xxl.", "T5-XXL"),
];

/// The other models a checkpoint bundles, by their key prefixes.
fn bundled(tensors: &[TensorInfo]) -> Vec<&'static str> {
    let mut found: Vec<&'static str> = BUNDLED
        .iter()
        .filter(|(prefix, _)| tensors.iter().any(|t| t.name.starts_with(prefix)))
        .map(|(_, name)| *name)
        .collect();
    found.dedup();
    found
}

/// What the names say the file is.
fn classify(
    names: &Names,
    metadata: &BTreeMap<String, String>,
    path: &Path,
) -> Result<FluxKind, FluxFormatError> {
    let path_buf = path.to_path_buf();
    if names.has("double_blocks.0.img_attn.qkv.weight")
        || names.has("single_blocks.0.linear1.weight")
    {
        return dit_kind(names, metadata, path);
    }
    if names.any_prefix("transformer_blocks.") && names.any_prefix("single_transformer_blocks.") {
        return Err(FluxFormatError::DiffusersTransformer { path: path_buf });
    }
    if names.has("encoder.conv_in.weight") && names.has("decoder.conv_in.weight") {
        let z_channels = names.dim("decoder.conv_in.weight", 1).unwrap_or(0);
        let ch = names.dim("encoder.conv_in.weight", 0).unwrap_or(0);
        return Ok(FluxKind::Autoencoder { z_channels, ch });
    }
    let clip = "text_model.embeddings.token_embedding.weight";
    if names.has(clip) {
        let hidden = names.dim(clip, 1).unwrap_or(0);
        let layers = names.count("text_model.encoder.layers.");
        return Ok(FluxKind::ClipText { hidden, layers });
    }
    if names.has("encoder.block.0.layer.0.SelfAttention.q.weight") {
        let vocab = names
            .dim("shared.weight", 0)
            .or_else(|| names.dim("encoder.embed_tokens.weight", 0));
        let per_layer_bias =
            names.has("encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight");
        if vocab == Some(256_384) || per_layer_bias {
            return Err(FluxFormatError::OtherFamily {
                found: "the umT5 text encoder of Wan (a relative-position table in every layer)"
                    .into(),
                fix: format!("FLUX.1 uses T5-XXL v1.1: pick {}", FluxComponent::T5.file()),
                path: path_buf,
            });
        }
        let dim = names
            .dim("encoder.block.0.layer.0.SelfAttention.q.weight", 1)
            .unwrap_or(0);
        return Ok(FluxKind::T5 {
            dim,
            layers: names.count("encoder.block."),
        });
    }
    Err(other_family(names, path_buf))
}

/// The error for a file of another family, naming it when its keys say what it is.
fn other_family(names: &Names, path: PathBuf) -> FluxFormatError {
    let (found, fix) =
        if names.any_prefix("patch_embedding.") && names.any_prefix("blocks.") {
            (
                "a Wan diffusion transformer (keys like `patch_embedding`, `blocks.0.self_attn`)",
                "train it as a Wan model, or pick flux1-dev.safetensors for FLUX.1",
            )
        } else if names.shapes.keys().any(|n| n.contains("img_attn_qkv")) {
            (
                "HunyuanVideo weights",
                "pick flux1-dev.safetensors for FLUX.1",
            )
        } else if names.shapes.keys().any(|n| {
            n.contains("lora_down") || n.contains(".lora_A.") || n.starts_with("lora_unet_")
        }) {
            (
                "a LoRA adapter",
                "a LoRA goes on top of its base model: give flux1-dev.safetensors here",
            )
        } else if names.any_prefix("encoder.") && names.any_prefix("decoder.") {
            (
                "the Wan VAE or another video VAE",
                "FLUX.1's autoencoder is ae.safetensors",
            )
        } else if names.any_prefix("token_embedding.")
            || names.any_prefix("visual.")
            || names.any_prefix("vision_model.")
        {
            (
                "a Wan text or image encoder",
                "FLUX.1 uses clip_l.safetensors and a t5xxl_*.safetensors file",
            )
        } else {
            let first = names.shapes.keys().next().copied().unwrap_or("");
            return FluxFormatError::Unknown {
                reason: if first.is_empty() {
                    "it holds no tensors".into()
                } else {
                    format!("its tensors (such as `{first}`) match no FLUX.1 component")
                },
                path,
            };
        };
    FluxFormatError::OtherFamily {
        found: found.into(),
        fix: fix.into(),
        path,
    }
}

/// The DiT's sizes and variant from its shapes (and, for Kontext, its name or metadata).
fn dit_kind(
    names: &Names,
    metadata: &BTreeMap<String, String>,
    path: &Path,
) -> Result<FluxKind, FluxFormatError> {
    let need = |name: &str, axis: usize| {
        names
            .dim(name, axis)
            .ok_or_else(|| FluxFormatError::Incomplete {
                what: "FLUX.1 DiT".into(),
                problem: format!("tensor `{name}` is missing"),
                path: path.to_path_buf(),
            })
    };
    let hidden_size = need("img_in.weight", 0)?;
    let head_dim = need("double_blocks.0.img_attn.norm.query_norm.scale", 0)
        .or_else(|_| need("single_blocks.0.norm.query_norm.scale", 0))?;
    let guidance_embed = names.has("guidance_in.in_layer.weight");
    let config = FluxConfig {
        in_channels: need("img_in.weight", 1)?,
        out_channels: need("final_layer.linear.weight", 0)?,
        vec_in_dim: need("vector_in.in_layer.weight", 1)?,
        context_in_dim: need("txt_in.weight", 1)?,
        hidden_size,
        mlp_ratio: names
            .dim("double_blocks.0.img_mlp.0.weight", 0)
            .unwrap_or(4 * hidden_size) as f64
            / hidden_size.max(1) as f64,
        num_heads: hidden_size / head_dim.max(1),
        depth: names.count("double_blocks."),
        depth_single_blocks: names.count("single_blocks."),
        axes_dim: axes_for_head_dim(head_dim),
        theta: 10_000.0,
        qkv_bias: names.has("double_blocks.0.img_attn.qkv.bias"),
        guidance_embed,
    };
    let says_kontext = path
        .file_name()
        .is_some_and(|n| n.to_string_lossy().to_lowercase().contains("kontext"))
        || metadata
            .values()
            .any(|v| v.to_lowercase().contains("kontext"));
    let variant = match (guidance_embed, says_kontext) {
        (false, _) => FluxVariant::Schnell,
        (true, true) => FluxVariant::Kontext,
        (true, false) => FluxVariant::Dev,
    };
    Ok(FluxKind::Dit { variant, config })
}

/// The RoPE split of the released models (16, 56, 56 for head dim 128), scaled to other head dims: height and
/// width get 2·⌊7·d/32⌋ each, time the rest.
pub fn axes_for_head_dim(head_dim: usize) -> Vec<usize> {
    let hw = 2 * (7 * head_dim / 32);
    vec![head_dim.saturating_sub(2 * hw), hw, hw]
}

impl fmt::Display for FluxFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.kind.title())?;
        if let FluxKind::Dit { config, variant } = &self.kind {
            writeln!(
                f,
                "  {:<11} {} double-stream + {} single-stream, width {}, {} heads",
                "blocks",
                config.depth,
                config.depth_single_blocks,
                config.hidden_size,
                config.num_heads
            )?;
            let task = match config.in_channels {
                64 => "text to image (64-channel packed latents)".to_string(),
                128 => {
                    "structural conditioning (FLUX.1 Canny / Depth, 128 input channels)".to_string()
                }
                384 => "inpainting (FLUX.1 Fill, 384 input channels)".to_string(),
                n => format!("{n} input channels"),
            };
            writeln!(f, "  {:<11} {task}", "input")?;
            let guidance = if config.guidance_embed {
                "yes (guidance-distilled)"
            } else {
                "no"
            };
            writeln!(f, "  {:<11} {guidance}", "guidance")?;
            if *variant != FluxVariant::Schnell {
                writeln!(
                    f,
                    "  {:<11} dev and Kontext [dev] have the same tensors: a file named *kontext* is taken as Kontext",
                    "note"
                )?;
            }
        }
        let layout = match self.prefix {
            Some(p) => format!("ComfyUI single file (keys under `{p}`)"),
            None => "official key names".into(),
        };
        writeln!(f, "  {:<11} {layout}", "layout")?;
        if !self.bundled.is_empty() {
            writeln!(
                f,
                "  {:<11} {} too (not read from here: give each as its own file)",
                "bundles",
                self.bundled.join(", ")
            )?;
        }
        let fp8 = match self.fp8 {
            Some(Fp8Storage::Scaled) => "float8_e4m3fn with per-weight scales (ComfyUI scaled_fp8)",
            Some(Fp8Storage::Plain) => "float8_e4m3fn weights without scales",
            None => "none",
        };
        writeln!(f, "  {:<11} {fp8}", "fp8")?;
        write_size_lines(f, &self.dtypes, self.parameter_count, self.bytes_on_disk)?;
        writeln!(
            f,
            "  {:<11} the {} of a FLUX.1 run",
            "use",
            self.kind.component().role()
        )?;
        write!(f, "  {:<11} {}", "path", self.path.display())
    }
}

/// The error [`identify`] gives when `path` is not a FLUX.1 file but something it could not name (so a caller
/// trying other families knows to go on).
pub fn is_unrecognised(err: &FluxFormatError) -> bool {
    matches!(
        err,
        FluxFormatError::Unknown { .. } | FluxFormatError::OtherFamily { .. }
    )
}

/// An opened FLUX.1 file: what it is, and its tensors under the official names (prefix stripped), each read when
/// a module asks for it.
pub struct OpenedFlux {
    pub file: FluxFile,
    pub tensors: MappedTensors,
}

/// Opens the `expected` component at `path` (checked as [`identify_expected`] does), mapping its data.
pub fn open(
    path: &Path,
    expected: FluxComponent,
    variant: Option<FluxVariant>,
) -> Result<OpenedFlux, FluxFormatError> {
    let file = identify_expected(path, expected, variant)?;
    let header = read_header(path)?;
    let entries = entries(header.tensors.iter().map(|t| (0, t)), file.prefix);
    let tensors = MappedTensors::open(&[path.to_path_buf()], &entries)?;
    Ok(OpenedFlux { file, tensors })
}
