//! musubi-tuner's dataset config (`[general]` + `[[datasets]]` + `[[validation_datasets]]` TOML): serde types, reading with every bad key
//! reported, writing back, and the per-dataset values after `[general]` and musubi-tuner's defaults apply.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::ser::{SerializeSeq, Serializer};
use serde::{Deserialize, Serialize};

use super::problem::Problem;
pub use super::resolve::{
    resolve_path, round_down_to_4n1, DatasetSource, ResolvedDataset, VideoParams,
};
use framesmith_config::text_file::{read_text, TextFileError};

/// Keys musubi-tuner accepts in `[general]` (and, overriding them, in every `[[datasets]]`).
pub const GENERAL_KEYS: &[&str] = &[
    "resolution",
    "caption_extension",
    "batch_size",
    "num_repeats",
    "enable_bucket",
    "bucket_no_upscale",
];

/// Keys only image datasets accept (besides [`GENERAL_KEYS`] and [`SHARED_DATASET_KEYS`]).
pub const IMAGE_ONLY_KEYS: &[&str] = &[
    "image_directory",
    "image_jsonl_file",
    "multiple_target",
    "fp_1f_clean_indices",
    "fp_1f_target_index",
    "fp_1f_no_post",
    "no_resize_control",
    "control_resolution",
    "flux_kontext_no_resize_control",
    "qwen_image_edit_no_resize_control",
    "qwen_image_edit_control_resolution",
];

/// Keys only video datasets accept.
pub const VIDEO_ONLY_KEYS: &[&str] = &[
    "video_directory",
    "video_jsonl_file",
    "target_frames",
    "frame_extraction",
    "frame_stride",
    "frame_sample",
    "max_frames",
    "source_fps",
];

/// Keys both kinds of dataset accept besides [`GENERAL_KEYS`].
pub const SHARED_DATASET_KEYS: &[&str] = &[
    "cache_directory",
    "control_directory",
    "fp_latent_window_size",
];

/// musubi-tuner's default resolution, `[W, H]`.
pub const DEFAULT_RESOLUTION: (u32, u32) = (960, 544);
/// musubi-tuner's default `max_frames` for `frame_extraction = "full"`.
pub const DEFAULT_MAX_FRAMES: u32 = 129;

/// A whole dataset config file, exactly as written (nothing inherited or defaulted yet).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatasetConfig {
    /// `[general]`: defaults for every dataset.
    pub general: GeneralSection,
    /// `[[datasets]]`, in file order.
    pub datasets: Vec<DatasetSection>,
    /// `[[validation_datasets]]`: held-out data for the validation loss, same keys as `[[datasets]]`, cached the
    /// same way, never trained on (the name musubi-tuner's forks use for it).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub validation_datasets: Vec<DatasetSection>,
}

/// `[general]`. Only the keys musubi-tuner lets datasets inherit.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GeneralSection {
    /// One number (square) or `[width, height]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resolution: Option<Resolution>,
    /// Caption file extension, with its dot: `".txt"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub caption_extension: Option<String>,
    /// Items per batch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<u32>,
    /// How many times each item is repeated per epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_repeats: Option<u32>,
    /// Aspect-ratio buckets instead of one fixed resolution.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enable_bucket: Option<bool>,
    /// Never upscale small items into a bucket (only with `enable_bucket`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bucket_no_upscale: Option<bool>,
}

/// How clips are cut from a video (`frame_extraction`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FrameExtraction {
    /// The first N frames, for each N in `target_frames`.
    #[default]
    Head,
    /// Back-to-back chunks of N frames.
    Chunk,
    /// Windows of N frames every `frame_stride` frames.
    Slide,
    /// `frame_sample` windows of N frames spread evenly.
    Uniform,
    /// The whole video, cut to N*4+1 and at most `max_frames`.
    Full,
}

impl fmt::Display for FrameExtraction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FrameExtraction::Head => "head",
            FrameExtraction::Chunk => "chunk",
            FrameExtraction::Slide => "slide",
            FrameExtraction::Uniform => "uniform",
            FrameExtraction::Full => "full",
        })
    }
}

/// One `[[datasets]]` table. Image and video keys share one struct; [`super::validate`] reports keys that do not
/// belong to the dataset's kind, as musubi-tuner's schema does.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[allow(missing_docs)]
pub struct DatasetSection {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_directory: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_jsonl_file: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub video_directory: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub video_jsonl_file: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub control_directory: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_directory: Option<PathBuf>,

    #[serde(skip_serializing_if = "Option::is_none")]
    pub resolution: Option<Resolution>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub caption_extension: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_repeats: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enable_bucket: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bucket_no_upscale: Option<bool>,

    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_frames: Option<Vec<u32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frame_extraction: Option<FrameExtraction>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frame_stride: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frame_sample: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_frames: Option<u32>,
    /// Frame rate the videos are taken to have; frames are dropped to reach 16 fps. musubi-tuner insists on a
    /// decimal (`30.0`); an integer is accepted here too.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_fps: Option<f64>,

    /// Kept so configs for other models round-trip; framesmith's Wan trainer does not use these.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub multiple_target: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fp_latent_window_size: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fp_1f_clean_indices: Option<Vec<u32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fp_1f_target_index: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fp_1f_no_post: Option<bool>,
    #[serde(
        skip_serializing_if = "Option::is_none",
        alias = "flux_kontext_no_resize_control",
        alias = "qwen_image_edit_no_resize_control"
    )]
    pub no_resize_control: Option<bool>,
    #[serde(
        skip_serializing_if = "Option::is_none",
        alias = "qwen_image_edit_control_resolution"
    )]
    pub control_resolution: Option<Resolution>,
}

impl DatasetSection {
    /// Image or video, decided as musubi-tuner does: a video key makes it a video dataset.
    pub fn kind(&self) -> DatasetKind {
        if self.video_directory.is_some() || self.video_jsonl_file.is_some() {
            DatasetKind::Video
        } else {
            DatasetKind::Image
        }
    }
}

/// Image or video dataset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DatasetKind {
    /// Still images, one latent frame each.
    Image,
    /// Videos (or folders of frames) cut into clips.
    Video,
}

impl fmt::Display for DatasetKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DatasetKind::Image => "image",
            DatasetKind::Video => "video",
        })
    }
}

/// `resolution = 512` or `resolution = [960, 544]`; the form written is kept for round trips.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// One number: width = height.
    Square(u32),
    /// `[width, height]`.
    WidthHeight(u32, u32),
}

impl Resolution {
    /// `(width, height)`.
    pub fn size(self) -> (u32, u32) {
        match self {
            Resolution::Square(s) => (s, s),
            Resolution::WidthHeight(w, h) => (w, h),
        }
    }
}

impl Serialize for Resolution {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match *self {
            Resolution::Square(s) => serializer.serialize_u32(s),
            Resolution::WidthHeight(w, h) => {
                let mut seq = serializer.serialize_seq(Some(2))?;
                seq.serialize_element(&w)?;
                seq.serialize_element(&h)?;
                seq.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Resolution {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ResolutionVisitor)
    }
}

struct ResolutionVisitor;

impl<'de> Visitor<'de> for ResolutionVisitor {
    type Value = Resolution;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a positive integer or [width, height]")
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Resolution, E> {
        u32::try_from(v)
            .map(Resolution::Square)
            .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Resolution, E> {
        u32::try_from(v)
            .map(Resolution::Square)
            .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &self))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Resolution, A::Error> {
        let w: u32 = seq
            .next_element()?
            .ok_or_else(|| de::Error::invalid_length(0, &self))?;
        let h: u32 = seq
            .next_element()?
            .ok_or_else(|| de::Error::invalid_length(1, &self))?;
        if seq.next_element::<de::IgnoredAny>()?.is_some() {
            return Err(de::Error::invalid_length(3, &self));
        }
        Ok(Resolution::WidthHeight(w, h))
    }
}

/// Reading or writing a dataset config failed as a whole (bad keys are [`Problem`]s, not this).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read the dataset config: {path}")]
    Read {
        /// The config file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not text at all (a video, an image, weights).
    #[error(
        "this is not a TOML file: it looks like {looks_like}; give a musubi-tuner dataset config, a TOML text \
         file such as dataset.toml: {path}"
    )]
    NotToml {
        /// The file.
        path: PathBuf,
        /// What it looks like (`a video (MP4/MOV)`).
        looks_like: &'static str,
    },
    /// The file is not TOML; the message has the line and column.
    #[error("the dataset config is not valid TOML: {message}: {path}")]
    Syntax {
        /// The config file.
        path: PathBuf,
        /// toml's description, with the line.
        message: String,
    },
    /// The file could not be written.
    #[error("cannot write the dataset config: {path}")]
    Write {
        /// The config file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The config has no TOML form (a path that is not UTF-8, a NaN `source_fps`).
    #[error("cannot write the dataset config as TOML: {0}")]
    Serialize(String),
    /// The config has errors; each problem names its key and file.
    #[error("the dataset config has {} error(s):\n{}", problems.len(), join_problems(problems))]
    Invalid {
        /// Every error found (warnings are left out).
        problems: Vec<Problem>,
    },
}

/// One line per problem, except many of one kind, which share a line ([`super::problem::summary_lines`]).
fn join_problems(problems: &[Problem]) -> String {
    super::problem::summary_lines(problems)
        .iter()
        .map(|line| format!("  {line}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A TOML syntax error with its line and column. toml's own display quotes the whole offending line, which in
/// a damaged file (all zero bytes, one endless line) can be megabytes, so only its message is kept, cut short.
fn syntax_error(err: &toml::de::Error, text: &str, file: &Path) -> ConfigError {
    let at = framesmith_config::error::location_of(text, err.span().map_or(0, |s| s.start));
    ConfigError::Syntax {
        path: file.to_path_buf(),
        message: format!(
            "{} at {at}",
            framesmith_config::file_read::excerpt(err.message().trim(), 300)
        ),
    }
}

/// A config read leniently: every key that could be read, plus one problem for each key that could not.
#[derive(Clone, Debug)]
pub struct ParsedConfig {
    /// The config with every bad key left out.
    pub config: DatasetConfig,
    /// Unknown keys, keys in the wrong section and values of the wrong type.
    pub problems: Vec<Problem>,
}

impl DatasetConfig {
    /// Reads TOML text. A syntax error is fatal; every unknown key or badly typed value becomes a [`Problem`]
    /// naming the key and `file`, and is left out of the returned config.
    pub fn parse(text: &str, file: &Path) -> Result<ParsedConfig, ConfigError> {
        let mut table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| syntax_error(&e, text, file))?;
        let mut problems = Vec::new();
        super::keys::strip_bad_keys(&mut table, file, &mut problems);
        let config = match table.try_into::<DatasetConfig>() {
            Ok(config) => config,
            Err(e) => {
                // Every key was checked one by one above, so this only happens for shapes the check missed.
                problems.push(Problem::error(
                    file,
                    format!("cannot read the dataset config: {e}"),
                ));
                DatasetConfig::default()
            }
        };
        Ok(ParsedConfig { config, problems })
    }

    /// Reads a config file leniently (see [`DatasetConfig::parse`]).
    pub fn read(path: &Path) -> Result<ParsedConfig, ConfigError> {
        let text = read_text(path).map_err(|e| match e {
            TextFileError::NotText(looks_like) => ConfigError::NotToml {
                path: path.to_path_buf(),
                looks_like,
            },
            TextFileError::Io(source) => ConfigError::Read {
                path: path.to_path_buf(),
                source,
            },
        })?;
        Self::parse(&text, path)
    }

    /// The config as TOML in musubi-tuner's layout. Comments in the original file are not kept.
    pub fn to_toml_string(&self) -> Result<String, ConfigError> {
        toml::to_string(self).map_err(|e| ConfigError::Serialize(e.to_string()))
    }

    /// Writes the config as TOML.
    pub fn write(&self, path: &Path) -> Result<(), ConfigError> {
        let text = self.to_toml_string()?;
        std::fs::write(path, text).map_err(|source| ConfigError::Write {
            path: path.to_path_buf(),
            source,
        })
    }
}

#[cfg(test)]
mod tests;
