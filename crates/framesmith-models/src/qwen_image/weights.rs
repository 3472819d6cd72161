//! Says what a Qwen-Image transformer file is, from safetensors headers only: a single file with diffusers' key
//! names (`transformer_blocks.0.img_mod.1.weight`, `txt_norm.weight`), as ComfyUI ships it (`qwen_image_bf16`,
//! `qwen_image_fp8_e4m3fn`; bare or under `model.diffusion_model.`), or a diffusers `transformer/` folder of
//! shards beside its `config.json`. Sizes come from the shapes (a folder's from its `config.json`). [`load_dit`]
//! builds the transformer from any of them, in bf16 or FP8.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use super::QwenImageConfig;
use crate::checkpoint::{comfy_prefix, read_shards, Names, Tally};
use crate::wan::weights::{read_header, write_size_lines, ModelFormatError, TensorInfo};

mod keys;
mod load;

pub use keys::official_shapes;
pub use load::{load_dit, load_dit_streamed, open, OpenedQwenImage};

/// diffusers' class name in a transformer folder's `config.json`.
const DIFFUSERS_CLASS: &str = "QwenImageTransformer2DModel";

/// Why a path is not a Qwen-Image transformer Framesmith can name.
#[derive(Debug, thiserror::Error)]
pub enum QwenImageFormatError {
    /// The file could not be read as safetensors.
    #[error(transparent)]
    File(#[from] ModelFormatError),

    /// Not a Qwen-Image transformer (another family's file, or not a model): other readers may name it.
    #[error("this is not a Qwen-Image transformer: {}", path.display())]
    NotQwenImage { path: PathBuf },

    /// Qwen-Image tensors, but not the whole transformer (one shard of a diffusers folder, a damaged file).
    #[error("this Qwen-Image transformer file is incomplete: {problem}; {fix}: {}", path.display())]
    Incomplete {
        problem: String,
        fix: &'static str,
        path: PathBuf,
    },

    /// A Qwen-Image transformer whose tensors do not make the model (a tensor missing or misshapen, an option
    /// of a later release).
    #[error("cannot build the Qwen-Image transformer from this file: {problem}: {}", path.display())]
    Build { problem: String, path: PathBuf },
}

/// Whether `err` only says the path is something else (so a caller trying other families goes on).
pub fn is_unrecognised(err: &QwenImageFormatError) -> bool {
    matches!(
        err,
        QwenImageFormatError::NotQwenImage { .. } | QwenImageFormatError::File(_)
    )
}

/// How the tensors are laid out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// One file with diffusers' names, under a ComfyUI prefix or none.
    SingleFile { prefix: Option<&'static str> },
    /// A diffusers `transformer/` folder: `config.json` and this many safetensors shards.
    DiffusersFolder { shards: usize },
}

impl Layout {
    /// The prefix before diffusers' names, if any.
    pub fn prefix(&self) -> Option<&'static str> {
        match self {
            Self::SingleFile { prefix } => *prefix,
            Self::DiffusersFolder { .. } => None,
        }
    }
}

/// What [`identify`] found.
#[derive(Debug, Clone)]
pub struct QwenImageFile {
    pub path: PathBuf,
    pub config: QwenImageConfig,
    pub layout: Layout,
    /// Number of tensors per dtype (safetensors spelling).
    pub dtypes: BTreeMap<String, usize>,
    /// FP8 weights stored with their scales (ComfyUI `scaled_fp8`, or `weight_scale` beside the weights).
    pub scaled_fp8: bool,
    pub parameter_count: u64,
    pub bytes_on_disk: u64,
}

/// Whether the names are a Qwen-Image transformer's (its blocks' modulation and text attention).
fn is_qwen_image(names: &Names) -> bool {
    names.shapes.keys().any(|n| {
        n.starts_with("transformer_blocks.")
            && (n.ends_with(".img_mod.1.weight") || n.ends_with(".attn.norm_added_q.weight"))
    })
}

/// The RoPE split of the released model (16, 56, 56 for heads of 128), scaled to other head widths.
fn axes_for_head_dim(head_dim: usize) -> Vec<usize> {
    let hw = 2 * (7 * head_dim / 32);
    vec![head_dim.saturating_sub(2 * hw), hw, hw]
}

/// The sizes the shapes say.
fn config_from_shapes(names: &Names, path: &Path) -> Result<QwenImageConfig, QwenImageFormatError> {
    let need = |name: &str, axis: usize| {
        names.dim(name, axis).ok_or_else(|| QwenImageFormatError::Incomplete {
            problem: format!("tensor `{name}` is missing"),
            fix: if path.to_string_lossy().contains("-of-") {
                "this looks like one shard of a diffusers transformer: give the folder that holds all of them"
            } else {
                "download it again"
            },
            path: path.to_path_buf(),
        })
    };
    let dim = need("img_in.weight", 0)?;
    let head_dim = need("transformer_blocks.0.attn.norm_q.weight", 0)?;
    let patch_size = 2;
    Ok(QwenImageConfig {
        patch_size,
        in_channels: need("img_in.weight", 1)?,
        out_channels: Some(need("proj_out.weight", 0)? / (patch_size * patch_size)),
        num_layers: names.count("transformer_blocks."),
        attention_head_dim: head_dim,
        num_attention_heads: dim / head_dim.max(1),
        joint_attention_dim: need("txt_in.weight", 1)?,
        guidance_embeds: false,
        axes_dims_rope: axes_for_head_dim(head_dim),
        zero_cond_t: false,
        use_additional_t_cond: names
            .dim("time_text_embed.addition_t_embedding.weight", 0)
            .is_some(),
        use_layer3d_rope: false,
    })
}

/// The diffusers transformer folder at `path` (itself, or its `transformer/`), with its config, when it is one.
fn diffusers_folder(path: &Path) -> Option<(PathBuf, QwenImageConfig)> {
    [path.to_path_buf(), path.join("transformer")]
        .into_iter()
        .find_map(|dir| {
            let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
            let json: serde_json::Value = serde_json::from_str(&text).ok()?;
            (json["_class_name"] == DIFFUSERS_CLASS)
                .then(|| QwenImageConfig::from_json(&text).ok().map(|cfg| (dir, cfg)))
                .flatten()
        })
}

/// The safetensors files at `path` and their tensors, as [`identify`] reads them.
struct Scan {
    files: Vec<PathBuf>,
    /// Each tensor with the index of its file in `files`.
    tensors: Vec<(usize, TensorInfo)>,
    bytes_on_disk: u64,
    layout: Layout,
    /// A diffusers folder's `config.json`.
    folder_config: Option<QwenImageConfig>,
}

/// Reads the headers at `path`: one file, or a diffusers transformer folder's shards.
fn scan(path: &Path) -> Result<Scan, QwenImageFormatError> {
    let not_qwen = || QwenImageFormatError::NotQwenImage {
        path: path.to_path_buf(),
    };
    if !path.is_dir() {
        let header = read_header(path)?;
        let layout = Layout::SingleFile {
            prefix: comfy_prefix(&header.tensors, "transformer_blocks."),
        };
        return Ok(Scan {
            files: vec![path.to_path_buf()],
            tensors: header.tensors.into_iter().map(|t| (0, t)).collect(),
            bytes_on_disk: header.file_bytes,
            layout,
            folder_config: None,
        });
    }
    let (dir, config) = diffusers_folder(path).ok_or_else(not_qwen)?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|_| not_qwen())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    let (tensors, bytes_on_disk) = read_shards(&files)?;
    let layout = Layout::DiffusersFolder {
        shards: files.len(),
    };
    Ok(Scan {
        files,
        tensors,
        bytes_on_disk,
        layout,
        folder_config: Some(config),
    })
}

/// What the scanned tensors at `path` are.
fn describe(path: &Path, scan: &Scan) -> Result<QwenImageFile, QwenImageFormatError> {
    let tensors = || scan.tensors.iter().map(|(_, t)| t);
    let names = Names::new(tensors(), scan.layout.prefix());
    if !is_qwen_image(&names) {
        return Err(QwenImageFormatError::NotQwenImage {
            path: path.to_path_buf(),
        });
    }
    let config = match &scan.folder_config {
        Some(config) => config.clone(),
        None => config_from_shapes(&names, path)?,
    };
    let tally = Tally::of(tensors());
    Ok(QwenImageFile {
        path: path.to_path_buf(),
        config,
        layout: scan.layout.clone(),
        dtypes: tally.dtypes,
        scaled_fp8: tally.scaled_fp8,
        parameter_count: tally.parameter_count,
        bytes_on_disk: scan.bytes_on_disk,
    })
}

/// Says what the Qwen-Image transformer at `path` is (a single file or a diffusers folder).
pub fn identify(path: &Path) -> Result<QwenImageFile, QwenImageFormatError> {
    describe(path, &scan(path)?)
}

/// Width of Qwen2.5-VL-7B's token embedding: Qwen-Image's text width.
const QWEN25_VL_WIDTH: usize = 3584;

/// Whether `path` holds Qwen-Image's text encoder, Qwen2.5-VL-7B (ComfyUI's `qwen_2.5_vl_7b*.safetensors`, or a
/// shard of diffusers' `text_encoder/` holding the token embedding): a `*embed_tokens.weight` of width 3584, read
/// from the safetensors header alone (umT5 and T5 call theirs `shared`, CLIP `token_embedding`).
pub fn is_qwen25_vl(path: &Path) -> bool {
    let files: Vec<PathBuf> = if path.is_dir() {
        std::fs::read_dir(path)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                    .collect()
            })
            .unwrap_or_default()
    } else {
        vec![path.to_path_buf()]
    };
    files.iter().any(|f| {
        read_header(f).is_ok_and(|h| {
            h.tensors.iter().any(|t| {
                t.name.ends_with("embed_tokens.weight") && t.shape.get(1) == Some(&QWEN25_VL_WIDTH)
            })
        })
    })
}

impl QwenImageFile {
    /// The model, specifically.
    pub fn title(&self) -> String {
        let c = &self.config;
        let later = c.zero_cond_t || c.use_additional_t_cond || c.use_layer3d_rope;
        if later {
            "Qwen-Image transformer of a later release (options Framesmith does not support yet)"
                .into()
        } else if c.inner_dim() == 3072 && c.num_layers == 60 {
            "Qwen-Image transformer (MMDiT)".into()
        } else {
            format!(
                "Qwen-Image-style transformer (width {}, {} blocks: not a released size)",
                c.inner_dim(),
                c.num_layers
            )
        }
    }
}

impl fmt::Display for QwenImageFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        writeln!(f, "{}", self.title())?;
        writeln!(
            f,
            "  {:<11} {} dual-stream, width {}, {} heads of {}",
            "blocks",
            c.num_layers,
            c.inner_dim(),
            c.num_attention_heads,
            c.attention_head_dim
        )?;
        writeln!(
            f,
            "  {:<11} {}-channel packed latents, text width {}",
            "input", c.in_channels, c.joint_attention_dim
        )?;
        let layout = match &self.layout {
            Layout::SingleFile { prefix: Some(p) } => {
                format!("ComfyUI single file (keys under `{p}`)")
            }
            Layout::SingleFile { prefix: None } => "single file with diffusers key names".into(),
            Layout::DiffusersFolder { shards } => {
                format!("diffusers transformer folder ({shards} safetensors shards)")
            }
        };
        writeln!(f, "  {:<11} {layout}", "layout")?;
        match (self.dtypes.contains_key("F8_E4M3"), self.scaled_fp8) {
            (true, true) => writeln!(
                f,
                "  {:<11} float8_e4m3fn weights with their scales (scaled_fp8)",
                "fp8"
            )?,
            (true, false) => writeln!(f, "  {:<11} float8_e4m3fn weights", "fp8")?,
            (false, _) => {}
        }
        write_size_lines(f, &self.dtypes, self.parameter_count, self.bytes_on_disk)?;
        writeln!(
            f,
            "  {:<11} Qwen-Image, Qwen-Image-Edit and Edit-2509 share these tensors",
            "note"
        )?;
        writeln!(
            f,
            "  {:<11} the diffusion model of a Qwen-Image run (Qwen-Image training is not available yet)",
            "use"
        )?;
        write!(f, "  {:<11} {}", "path", self.path.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qwen_image::testkit::fixtures_dir;
    use candle_core::{Device, Tensor};
    use std::collections::HashMap;

    fn fixture_weights() -> anyhow::Result<HashMap<String, Tensor>> {
        let path = fixtures_dir().join("t2i/weights.safetensors");
        Ok(candle_core::safetensors::load(path, &Device::Cpu)?)
    }

    #[test]
    fn qwen25_vl_is_told_by_its_token_embedding_width() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let file = |name: &str, key: &str, width: usize| -> anyhow::Result<std::path::PathBuf> {
            let path = dir.path().join(name);
            let t = Tensor::zeros((2, width), candle_core::DType::BF16, &Device::Cpu)?;
            candle_core::safetensors::save(&HashMap::from([(key.to_string(), t)]), &path)?;
            Ok(path)
        };
        let comfy = file(
            "qwen_2.5_vl_7b.safetensors",
            "model.embed_tokens.weight",
            3584,
        )?;
        let umt5 = file("umt5.safetensors", "shared.weight", 4096)?;
        let smaller = file(
            "qwen2.5_vl_3b.safetensors",
            "model.embed_tokens.weight",
            2048,
        )?;
        assert!(is_qwen25_vl(&comfy) && is_qwen25_vl(dir.path()));
        assert!(!is_qwen25_vl(&umt5) && !is_qwen25_vl(&smaller));
        assert!(!is_qwen25_vl(&dir.path().join("absent.safetensors")));
        Ok(())
    }

    #[test]
    fn a_comfyui_file_reads_as_the_fixture_config() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let comfy: HashMap<String, Tensor> = fixture_weights()?
            .into_iter()
            .map(|(k, v)| (format!("model.diffusion_model.{k}"), v))
            .collect();
        let path = dir.path().join("qwen_image_bf16.safetensors");
        candle_core::safetensors::save(&comfy, &path)?;
        let file = identify(&path)?;
        let text = std::fs::read_to_string(fixtures_dir().join("t2i/config.json"))?;
        let json: serde_json::Value = serde_json::from_str(&text)?;
        let expected = QwenImageConfig::from_json(&json["init"].to_string())?;
        assert_eq!(file.config, expected);
        assert_eq!(
            file.layout,
            Layout::SingleFile {
                prefix: Some("model.diffusion_model.")
            }
        );
        let shown = file.to_string();
        assert!(
            shown.contains("2 dual-stream, width 32, 2 heads of 16"),
            "{shown}"
        );
        assert!(shown.ends_with(&path.display().to_string()), "{shown}");
        Ok(())
    }

    #[test]
    fn a_diffusers_folder_and_a_lone_shard() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let folder = dir.path().join("Qwen-Image");
        let transformer = folder.join("transformer");
        std::fs::create_dir_all(&transformer)?;
        let (blocks, rest): (HashMap<_, _>, HashMap<_, _>) = fixture_weights()?
            .into_iter()
            .partition(|(k, _)| k.starts_with("transformer_blocks."));
        let shard = |i: usize| {
            transformer.join(format!(
                "diffusion_pytorch_model-0000{i}-of-00002.safetensors"
            ))
        };
        candle_core::safetensors::save(&blocks, shard(1))?;
        candle_core::safetensors::save(&rest, shard(2))?;
        let config = r#"{"_class_name": "QwenImageTransformer2DModel", "patch_size": 2, "in_channels": 16,
            "out_channels": 4, "num_layers": 2, "attention_head_dim": 16, "num_attention_heads": 2,
            "joint_attention_dim": 24, "axes_dims_rope": [4, 6, 6]}"#;
        std::fs::write(transformer.join("config.json"), config)?;

        let file = identify(&folder)?;
        assert_eq!(file.layout, Layout::DiffusersFolder { shards: 2 });
        assert_eq!(file.config.num_layers, 2);

        let err = identify(&shard(1))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("one shard") && err.contains("img_in.weight"),
            "{err}"
        );

        let other = dir.path().join("other.safetensors");
        let z = Tensor::zeros((2, 2), candle_core::DType::F32, &Device::Cpu)?;
        candle_core::safetensors::save(
            &HashMap::from([("blocks.0.self_attn.q.weight".to_string(), z)]),
            &other,
        )?;
        assert!(identify(&other).is_err_and(|e| is_unrecognised(&e)));
        Ok(())
    }
}
