//! `ModelReport`: what a checkpoint is (variant, layout, dtypes, FP8 scaling, size), printed as the short human
//! report of `framesmith inspect`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use crate::wan::config::Expert;
use crate::wan::WanConfig;

/// How the safetensors files are laid out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// The official Wan-AI layout: `diffusion_pytorch_model-0000N-of-0000M.safetensors`, with or without the
    /// `….safetensors.index.json` that maps tensors to shards.
    Sharded { shards: usize, indexed: bool },
    /// One safetensors file (official single file, ComfyUI file, FP8 file …).
    SingleFile,
}

/// Where the number of attention heads came from (nothing in the weights records it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadsSource {
    /// The `config.json` beside the weights.
    ConfigJson,
    /// The rule of [`super::heads_for_dim`] (128-wide heads for every official size).
    Rule,
}

/// How FP8 weights are scaled back to real values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fp8Scaling {
    /// No scale tensor: the FP8 values are the weights (a plain cast).
    Unscaled,
    /// One scale per weight matrix.
    Tensor,
    /// One scale per output channel (row).
    Channel,
    /// One scale per block of `size` consecutive input values of a row.
    Block { size: usize },
    /// One scale per `rows × cols` tile.
    Tile { rows: usize, cols: usize },
    /// A scale whose shape fits none of the above.
    Unrecognised,
}

/// How a file names its FP8 scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaleNaming {
    /// ComfyUI: a `scaled_fp8` marker tensor plus `<module>.scale_weight`.
    ComfyScaledFp8,
    /// `<module>.scale_weight` without the marker (musubi-tuner).
    ScaleWeight,
    /// `<module>.weight_scale` (other FP8 exporters).
    WeightScale,
    /// No scale tensors.
    None,
}

/// The FP8 side of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fp8Info {
    /// The FP8 number format (`float8_e4m3fn`, `float8_e5m2`).
    pub format: String,
    /// Number of FP8 weight tensors.
    pub weights: usize,
    /// Scaling modes found, with how many weights use each.
    pub scaling: BTreeMap<Fp8Scaling, usize>,
    pub naming: ScaleNaming,
}

/// What a checkpoint file or folder is.
#[derive(Debug, Clone)]
pub struct ModelReport {
    /// The path that was inspected.
    pub path: PathBuf,
    /// The variant's name, or two names when the shapes cannot tell them apart (Wan2.1 T2V-14B and a Wan2.2
    /// T2V-A14B expert).
    pub variants: Vec<String>,
    /// The detected hyper-parameters.
    pub config: WanConfig,
    /// The Wan2.2 A14B expert, when the path names one.
    pub expert: Option<Expert>,
    pub heads_source: HeadsSource,
    pub layout: Layout,
    /// The key prefix stripped from every DiT tensor (ComfyUI's `model.diffusion_model.`).
    pub key_prefix: Option<String>,
    /// The safetensors files read.
    pub files: Vec<PathBuf>,
    /// Number of DiT tensors per dtype (safetensors spelling, e.g. `BF16`, `F8_E4M3`).
    pub dtypes: BTreeMap<String, usize>,
    pub fp8: Option<Fp8Info>,
    /// Parameters of the DiT (FP8 scales not counted).
    pub parameter_count: u64,
    /// Number of DiT tensors (scales included).
    pub tensor_count: usize,
    /// Size of the files on disk.
    pub bytes_on_disk: u64,
    /// Anything else worth knowing: ignored tensors, ignored `config.json`, ambiguity.
    pub notes: Vec<String>,
}

impl ModelReport {
    /// A one-line description of the layout (`ComfyUI scaled_fp8 single file …`).
    pub fn layout_label(&self) -> String {
        let comfy_fp8 = self
            .fp8
            .as_ref()
            .is_some_and(|f| f.naming == ScaleNaming::ComfyScaledFp8);
        let single = if comfy_fp8 {
            "ComfyUI scaled_fp8 single file"
        } else {
            "single file"
        };
        match (&self.layout, self.key_prefix.as_deref()) {
            (Layout::Sharded { shards, indexed }, _) => format!(
                "official Wan-AI shards, {shards} files {}{}",
                if *indexed {
                    "with index"
                } else {
                    "without index"
                },
                if comfy_fp8 {
                    ", ComfyUI scaled_fp8"
                } else {
                    ""
                }
            ),
            (Layout::SingleFile, Some(prefix)) if !comfy_fp8 => {
                format!("ComfyUI single file (keys prefixed `{prefix}`)")
            }
            (Layout::SingleFile, Some(prefix)) => format!("{single} (keys prefixed `{prefix}`)"),
            (Layout::SingleFile, None) => format!("{single}, official key names"),
        }
    }
}

/// Lower-case dtype name as users know it from PyTorch.
pub(crate) fn dtype_label(dtype: &str) -> String {
    match dtype {
        "F8_E4M3" => "float8_e4m3fn".into(),
        "F8_E5M2" => "float8_e5m2".into(),
        other => other.to_ascii_lowercase(),
    }
}

/// `1234567` → `1,234,567`.
pub(crate) fn group_digits(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn scaling_label(s: Fp8Scaling) -> String {
    match s {
        Fp8Scaling::Unscaled => "no scales (plain cast)".into(),
        Fp8Scaling::Tensor => "per-tensor scales".into(),
        Fp8Scaling::Channel => "per-channel scales".into(),
        Fp8Scaling::Block { size } => format!("per-block scales (blocks of {size} inputs)"),
        Fp8Scaling::Tile { rows, cols } => format!("per-tile scales ({rows}×{cols})"),
        Fp8Scaling::Unrecognised => "scales of an unrecognised shape".into(),
    }
}

fn naming_label(n: ScaleNaming) -> &'static str {
    match n {
        ScaleNaming::ComfyScaledFp8 => "ComfyUI `scaled_fp8` marker, `.scale_weight`",
        ScaleNaming::ScaleWeight => "`.scale_weight`",
        ScaleNaming::WeightScale => "`.weight_scale`",
        ScaleNaming::None => "no scale tensors",
    }
}

/// The `dtypes`, `parameters` and `on disk` lines of an inspect report (the labels padded to one column).
pub(crate) fn write_size_lines(
    f: &mut fmt::Formatter<'_>,
    dtypes: &BTreeMap<String, usize>,
    parameter_count: u64,
    bytes_on_disk: u64,
) -> fmt::Result {
    let dtypes: Vec<String> = dtypes
        .iter()
        .map(|(d, n)| format!("{} ({n} tensors)", dtype_label(d)))
        .collect();
    writeln!(f, "  {:<11} {}", "dtypes", dtypes.join(", "))?;
    writeln!(
        f,
        "  {:<11} {}",
        "parameters",
        params_label(parameter_count)
    )?;
    writeln!(
        f,
        "  {:<11} {} ({} bytes)",
        "on disk",
        bytes_label(bytes_on_disk),
        group_digits(bytes_on_disk)
    )
}

pub(crate) fn params_label(n: u64) -> String {
    match n {
        0..1_000_000 => group_digits(n),
        1_000_000..1_000_000_000 => format!("{:.2} M ({})", n as f64 / 1e6, group_digits(n)),
        _ => format!("{:.2} B ({})", n as f64 / 1e9, group_digits(n)),
    }
}

pub(crate) fn bytes_label(n: u64) -> String {
    match n {
        0..1_000_000 => format!("{:.1} kB", n as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1} MB", n as f64 / 1e6),
        _ => format!("{:.2} GB", n as f64 / 1e9),
    }
}

impl fmt::Display for ModelReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        writeln!(f, "{}", self.variants.join(" or "))?;
        writeln!(f, "  layout      {}", self.layout_label())?;
        let dtypes: Vec<String> = self
            .dtypes
            .iter()
            .map(|(d, n)| format!("{} ({n} tensors)", dtype_label(d)))
            .collect();
        writeln!(f, "  dtypes      {}", dtypes.join(", "))?;
        if let Some(fp8) = &self.fp8 {
            let modes: Vec<String> = fp8
                .scaling
                .iter()
                .map(|(s, n)| format!("{} on {n} weights", scaling_label(*s)))
                .collect();
            writeln!(
                f,
                "  fp8         {}: {} ({})",
                fp8.format,
                modes.join(", "),
                naming_label(fp8.naming)
            )?;
        }
        let heads = match self.heads_source {
            HeadsSource::ConfigJson => "from config.json",
            HeadsSource::Rule => "inferred, no config.json beside the weights",
        };
        writeln!(
            f,
            "  shape       dim {}, {} layers, {} heads of {} ({heads}), ffn {}, {} → {} latent channels, text {}, freq {}",
            c.dim,
            c.num_layers,
            c.num_heads,
            c.head_dim(),
            c.ffn_dim,
            c.in_dim,
            c.out_dim,
            c.text_dim,
            c.freq_dim
        )?;
        writeln!(f, "  parameters  {}", params_label(self.parameter_count))?;
        writeln!(
            f,
            "  on disk     {} ({} bytes in {} file{})",
            bytes_label(self.bytes_on_disk),
            group_digits(self.bytes_on_disk),
            self.files.len(),
            if self.files.len() == 1 { "" } else { "s" }
        )?;
        for note in &self.notes {
            writeln!(f, "  note        {note}")?;
        }
        write!(f, "  path        {}", self.path.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_digits() {
        assert_eq!(group_digits(0), "0");
        assert_eq!(group_digits(999), "999");
        assert_eq!(group_digits(1000), "1,000");
        assert_eq!(group_digits(14_288_491_584), "14,288,491,584");
    }
}
