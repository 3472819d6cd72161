//! `framesmith inspect` for any model file a Wan run uses: the DiT as a [`ModelReport`], and a LoRA, the VAE, the
//! umT5 text encoder or a CLIP image encoder (or weights people mistake for them) as a [`ComponentReport`] that
//! says what the file is and where it goes. Headers and pickles only: no tensor data is read.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use super::error::{ForeignModel, ModelFormatError, NotSafetensors};
use super::header::read_header;
use super::keys::{classify_foreign, Foreign};
use super::pickle::pth_listing;
use super::report::{write_size_lines, ModelReport};

/// What a model file is.
#[derive(Debug, Clone)]
pub enum ModelFile {
    /// A Wan DiT checkpoint.
    Dit(Box<ModelReport>),
    /// Any other model file Framesmith recognises.
    Component(ComponentReport),
}

impl fmt::Display for ModelFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Dit(report) => report.fmt(f),
            Self::Component(report) => report.fmt(f),
        }
    }
}

/// What a model file other than the DiT is.
#[derive(Debug, Clone)]
pub struct ComponentReport {
    pub path: PathBuf,
    /// What kind of model it holds.
    pub kind: ForeignModel,
    /// The first line: the model, specifically (`Wan2.1 VAE (16 latent channels)`).
    pub title: String,
    /// Labelled facts (`rank`, `modules`, `layers` …), in display order.
    pub details: Vec<(&'static str, String)>,
    /// `safetensors` or `PyTorch .pth (zip)`.
    pub container: &'static str,
    /// Number of tensors per dtype (safetensors spelling).
    pub dtypes: BTreeMap<String, usize>,
    pub parameter_count: u64,
    pub bytes_on_disk: u64,
    /// Where the file goes in Framesmith.
    pub usage: &'static str,
}

/// One tensor's name, dtype and shape, from a safetensors header or a pickle.
struct Listed {
    name: String,
    dtype: String,
    shape: Vec<usize>,
}

/// Says what the model file at `path` is: the DiT report, or what other model it holds. Fails only when the file
/// is not a model Framesmith can name (the error says what it is instead).
pub fn identify(path: &Path) -> Result<ModelFile, ModelFormatError> {
    match super::inspect(path) {
        Ok(report) => Ok(ModelFile::Dit(Box::new(report))),
        Err(ModelFormatError::NotTheDit { what, .. }) => {
            let header = read_header(path)?;
            let listed = header
                .tensors
                .into_iter()
                .map(|t| Listed {
                    name: t.name,
                    dtype: t.dtype,
                    shape: t.shape,
                })
                .collect();
            let meta = header.metadata;
            Ok(ModelFile::Component(component(
                path,
                what,
                listed,
                &meta,
                "safetensors",
            )))
        }
        Err(
            err @ ModelFormatError::NotSafetensors {
                kind: NotSafetensors::PyTorchZip,
                ..
            },
        ) => identify_pth(path, err),
        Err(err) => Err(err),
    }
}

/// A PyTorch archive: named from its pickle's tensor names. A DiT in one is refused with `dit_error` (the DiT is
/// read only from safetensors).
fn identify_pth(path: &Path, dit_error: ModelFormatError) -> Result<ModelFile, ModelFormatError> {
    let listed: Vec<Listed> = pth_listing(path)?
        .into_iter()
        .map(|t| Listed {
            name: t.name,
            dtype: t.dtype,
            shape: t.shape,
        })
        .collect();
    let names: Vec<&str> = listed.iter().map(|t| t.name.as_str()).collect();
    match classify_foreign(&names) {
        Some(Foreign::Model(what)) => Ok(ModelFile::Component(component(
            path,
            what,
            listed,
            &BTreeMap::new(),
            "PyTorch .pth (zip)",
        ))),
        Some(Foreign::DiffusersWan) => Err(ModelFormatError::DiffusersTransformer {
            path: path.to_path_buf(),
        }),
        None if names.iter().any(|n| n.contains("patch_embedding")) => Err(dit_error),
        None => Err(ModelFormatError::UnknownModel {
            reason: match names.first() {
                Some(first) => format!(
                    "this PyTorch file's tensors (such as `{first}`) match no model Framesmith knows"
                ),
                None => "this PyTorch file holds no tensors".into(),
            },
            path: path.to_path_buf(),
        }),
    }
}

fn component(
    path: &Path,
    kind: ForeignModel,
    listed: Vec<Listed>,
    metadata: &BTreeMap<String, String>,
    container: &'static str,
) -> ComponentReport {
    let mut dtypes = BTreeMap::new();
    let mut parameter_count = 0u64;
    for t in &listed {
        *dtypes.entry(t.dtype.clone()).or_insert(0) += 1;
        let numel = t
            .shape
            .iter()
            .fold(1u64, |a, &d| a.saturating_mul(d as u64));
        parameter_count = parameter_count.saturating_add(numel);
    }
    // Only Wan's VAE among video VAEs has 3D (five-dimensional) convolutions, whatever its other keys say.
    let kind = match kind {
        ForeignModel::Vae
            if shape_of(&listed, "encoder.conv1.weight").is_some_and(|s| s.len() == 5) =>
        {
            ForeignModel::WanVae
        }
        other => other,
    };
    let (title, details) = describe(kind, &listed, metadata);
    ComponentReport {
        path: path.to_path_buf(),
        kind,
        title,
        details,
        container,
        dtypes,
        parameter_count,
        bytes_on_disk: std::fs::metadata(path).map_or(0, |m| m.len()),
        usage: usage(kind),
    }
}

type Details = Vec<(&'static str, String)>;

fn describe(
    kind: ForeignModel,
    listed: &[Listed],
    metadata: &BTreeMap<String, String>,
) -> (String, Details) {
    match kind {
        ForeignModel::Lora => describe_lora(listed, metadata),
        ForeignModel::OptimizerState => {
            let moments = listed
                .iter()
                .filter(|t| t.name.ends_with(".exp_avg"))
                .count();
            (
                "AdamW optimizer state of a training checkpoint (not a LoRA)".into(),
                vec![(
                    "moments",
                    format!("exp_avg and exp_avg_sq of {moments} LoRA tensors"),
                )],
            )
        }
        ForeignModel::LatentCache => describe_latent_cache(listed, metadata),
        ForeignModel::TextCache => describe_text_cache(listed, metadata),
        ForeignModel::Flux => (
            "part of a FLUX.1 model, not a whole FLUX.1 file".into(),
            vec![(
                "blocks",
                format!(
                    "{} double-stream, {} single-stream",
                    count_indices(listed, &["double_blocks."]),
                    count_indices(listed, &["single_blocks."])
                ),
            )],
        ),
        ForeignModel::WanVae => {
            let title = match shape_of(listed, "encoder.conv1.weight").and_then(|s| s.get(1)) {
                Some(3) => "Wan2.1 VAE (16 latent channels; also used by Wan2.2 A14B)",
                Some(12) => "Wan2.2 VAE (48 latent channels, for Wan2.2 TI2V-5B)",
                _ => "Wan VAE (variant not recognised from its encoder)",
            };
            (title.into(), Vec::new())
        }
        ForeignModel::Umt5 => {
            let layers = count_indices(listed, &["blocks.", "encoder.block."]);
            let dim = ["token_embedding.weight", "shared.weight"]
                .iter()
                .find_map(|n| shape_of(listed, n).and_then(|s| s.get(1).copied()));
            let mut details = vec![("layers", layers.to_string())];
            if let Some(dim) = dim {
                details.push(("width", dim.to_string()));
            }
            ("umT5 text encoder".into(), details)
        }
        ForeignModel::ClipVision => {
            let layers = count_indices(
                listed,
                &[
                    "visual.transformer.resblocks.",
                    "vision_model.encoder.layers.",
                ],
            );
            let text_tower = listed
                .iter()
                .any(|t| !t.name.starts_with("visual.") && !t.name.starts_with("vision_model."));
            let mut details = vec![("layers", format!("{layers} in the image tower"))];
            if text_tower {
                details.push((
                    "note",
                    "it also holds a text tower, which is not used".into(),
                ));
            }
            ("CLIP image encoder".into(), details)
        }
        other => (other.to_string(), Vec::new()),
    }
}

/// The family a cache was made for, from its `architecture` metadata.
fn cache_family(metadata: &BTreeMap<String, String>) -> String {
    match metadata.get("architecture").map(String::as_str) {
        Some("wan") => "Wan".into(),
        Some("flux") => "FLUX.1".into(),
        Some(other) => format!("`{other}`"),
        None => "unknown-architecture".into(),
    }
}

fn describe_latent_cache(
    listed: &[Listed],
    metadata: &BTreeMap<String, String>,
) -> (String, Details) {
    let mut details = Details::new();
    // `latents_{F}x{H}x{W}_{dtype}`, not the conditioning's `latents_image_…` / `latents_control_…`.
    let latents = listed.iter().find(|t| {
        t.name
            .strip_prefix("latents_")
            .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
    });
    if let Some(t) = latents {
        details.push((
            "latents",
            format!("{:?} (channels, frames, height, width)", t.shape),
        ));
    }
    if let (Some(w), Some(h)) = (metadata.get("width"), metadata.get("height")) {
        details.push(("source", format!("{w}x{h} pixels")));
    }
    if let Some(frames) = metadata.get("frame_count") {
        details.push(("frames", frames.clone()));
    }
    let conditioning: Vec<&str> = [
        ("latents_image_", "start-frame latents"),
        ("latents_control_", "control latents"),
        ("clip_", "CLIP image features"),
    ]
    .iter()
    .filter(|(prefix, _)| listed.iter().any(|t| t.name.starts_with(prefix)))
    .map(|(_, what)| *what)
    .collect();
    if !conditioning.is_empty() {
        details.push(("also", conditioning.join(", ")));
    }
    (format!("{} latent cache", cache_family(metadata)), details)
}

fn describe_text_cache(
    listed: &[Listed],
    metadata: &BTreeMap<String, String>,
) -> (String, Details) {
    let encoders = if listed.iter().any(|t| t.name.starts_with("varlen_t5_")) {
        "umT5"
    } else {
        "T5-XXL and CLIP-L"
    };
    let mut details = vec![("encoders", encoders.to_string())];
    if let Some(caption) = metadata.get("caption1") {
        let mut short: String = caption.chars().take(60).collect();
        if caption.chars().count() > 60 {
            short.push('…');
        }
        details.push(("caption", format!("\"{short}\"")));
    }
    (
        format!("{} text-encoder cache", cache_family(metadata)),
        details,
    )
}

/// An adapter file, described by the family-neutral [`crate::adapter_file`].
fn describe_lora(listed: &[Listed], metadata: &BTreeMap<String, String>) -> (String, Details) {
    let header: Vec<crate::adapter_file::HeaderTensor<'_>> = listed
        .iter()
        .map(|t| crate::adapter_file::HeaderTensor {
            name: &t.name,
            shape: &t.shape,
        })
        .collect();
    crate::adapter_file::describe(&header, metadata)
}

fn shape_of<'a>(listed: &'a [Listed], name: &str) -> Option<&'a [usize]> {
    listed
        .iter()
        .find(|t| t.name == name)
        .map(|t| t.shape.as_slice())
}

/// Number of distinct indices N in names `<prefix>N…`, for the first prefix that has any.
fn count_indices(listed: &[Listed], prefixes: &[&str]) -> usize {
    prefixes
        .iter()
        .map(|prefix| {
            listed
                .iter()
                .filter_map(|t| {
                    let rest = t.name.strip_prefix(prefix)?;
                    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                    digits.parse::<usize>().ok()
                })
                .collect::<BTreeSet<_>>()
                .len()
        })
        .find(|&n| n > 0)
        .unwrap_or(0)
}

fn usage(kind: ForeignModel) -> &'static str {
    match kind {
        ForeignModel::Lora => {
            "a LoRA goes on top of its base DiT: `framesmith generate --lora FILE`, or lora.init_from to continue \
             training it"
        }
        ForeignModel::WanVae => "the VAE: model.vae in a run config, --vae for `framesmith cache latents`",
        ForeignModel::Umt5 => {
            "the text encoder: model.text_encoder in a run config, --text-encoder for `framesmith cache text`"
        }
        ForeignModel::ClipVision => "the image encoder of Wan2.1 I2V: --clip for `framesmith generate`",
        ForeignModel::Vae => {
            "not the Wan VAE, which Framesmith needs: use Wan2.1_VAE.pth / Wan2.2_VAE.pth or a ComfyUI Wan VAE file"
        }
        ForeignModel::HunyuanVideo => "not a model Framesmith trains (Wan 2.1 / 2.2, FLUX.1)",
        ForeignModel::Flux => {
            "not usable alone: a FLUX.1 run takes whole files, flux1-dev.safetensors (the DiT), ae.safetensors, \
             clip_l.safetensors and a t5xxl_*.safetensors text encoder"
        }
        ForeignModel::OptimizerState => {
            "part of a training state folder (beside lora.safetensors and state.json): `framesmith train --resume \
             FOLDER` reads it; to generate, use the lora.safetensors beside it"
        }
        ForeignModel::LatentCache => {
            "made by `framesmith cache latents`; training reads it from the dataset's cache_directory"
        }
        ForeignModel::TextCache => {
            "made by `framesmith cache text`; training reads it from the dataset's cache_directory"
        }
    }
}

impl fmt::Display for ComponentReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.title)?;
        for (label, value) in &self.details {
            writeln!(f, "  {label:<11} {value}")?;
        }
        writeln!(f, "  {:<11} {}", "file", self.container)?;
        write_size_lines(f, &self.dtypes, self.parameter_count, self.bytes_on_disk)?;
        writeln!(f, "  {:<11} {}", "use", self.usage)?;
        write!(f, "  {:<11} {}", "path", self.path.display())
    }
}
