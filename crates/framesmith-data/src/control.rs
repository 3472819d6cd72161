//! The control images of a dataset's items (the source images of edit models: FLUX.1 Kontext, Qwen-Image-Edit),
//! found and resized as musubi-tuner does: from `control_directory` by the image's stem (`stem.png`, or several as
//! `stem_0.png`, `stem_1.png`, … in the order of their numbers, the plain `stem.*` first), or from a JSONL line's
//! `control_path` / `control_path_N`; each resized to its target's bucket, to its own bucket at
//! `control_resolution`, or (`no_resize_control`) kept at its size. Family-neutral: a family's cache pass encodes
//! what this returns.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use image::RgbImage;

use super::bucket::{round_down_to, Size};
use super::config::{resolve_path, DatasetSource, ResolvedDataset};
use super::jsonl::parse_jsonl;
use super::probe::{is_image, list_files, load_rgb};
use super::resize::resize_to_bucket;
use crate::DatasetKind;
use framesmith_config::file_read::{open_regular, read_bounded, ReadLimit};
use sha2::{Digest, Sha256};

/// Why an item's control images cannot be found or read.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The control directory or the JSONL file cannot be read.
    #[error("cannot read the control images' listing ({reason}): {}", path.display())]
    Listing { reason: String, path: PathBuf },
    /// A control file's name after the image's stem has a suffix that is not a number.
    #[error(
        "a control image of {} is named neither `{stem}.*` nor `{stem}_N.*` with N a number; rename it: {}",
        media.display(),
        path.display()
    )]
    BadSuffix {
        stem: String,
        media: PathBuf,
        path: PathBuf,
    },
    /// The dataset has control images, but not for this item.
    #[error(
        "no control image for {}: put `{stem}.png` (or `{stem}_0.png`, `{stem}_1.png`, …) in the control \
         directory, or give the line a control_path: {}",
        media.display(),
        place.display()
    )]
    Missing {
        stem: String,
        media: PathBuf,
        place: PathBuf,
    },
    /// A control image does not decode or does not exist.
    #[error("the control image of {} cannot be read ({reason}): {}", media.display(), path.display())]
    Unreadable {
        reason: String,
        media: PathBuf,
        path: PathBuf,
    },
}

/// The control images of every item of one dataset.
#[derive(Clone, Debug, Default)]
pub struct DatasetControls {
    /// Each item's control files in order, by the item's media path.
    by_media: HashMap<PathBuf, Vec<PathBuf>>,
    /// Where they come from (the control directory or the JSONL file), for messages.
    place: PathBuf,
}

impl DatasetControls {
    /// The control images of `ds`'s items: none for a dataset without `control_directory` and without
    /// `control_path` in its JSONL lines.
    pub fn find(ds: &ResolvedDataset) -> Result<Self, ControlError> {
        match (&ds.source, &ds.control_directory) {
            (DatasetSource::ImageDirectory(images), Some(dir)) => from_directory(images, dir),
            (DatasetSource::ImageJsonl(file), _) => from_jsonl(file),
            _ => Ok(Self::default()),
        }
    }

    /// Whether the dataset has control images at all.
    pub fn any(&self) -> bool {
        !self.by_media.is_empty()
    }

    /// The control files of the item `media`, in order: none when the dataset has no control images, an error
    /// naming the item when it has them but not for this one.
    pub fn of(&self, media: &Path) -> Result<&[PathBuf], ControlError> {
        if !self.any() {
            return Ok(&[]);
        }
        self.by_media
            .get(media)
            .map(Vec::as_slice)
            .ok_or_else(|| ControlError::Missing {
                stem: stem_of(media),
                media: media.to_path_buf(),
                place: self.place.clone(),
            })
    }
}

fn stem_of(path: &Path) -> String {
    path.file_stem()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned()
}

fn listing_error(path: &Path, e: impl std::fmt::Display) -> ControlError {
    ControlError::Listing {
        reason: e.to_string(),
        path: path.to_path_buf(),
    }
}

/// musubi-tuner's matching: images with longer names first, each taking the control files named `stem.*` or
/// `stem_*` not taken yet, the plain `stem.*` first, then by the number after the last `_`.
fn from_directory(images: &Path, dir: &Path) -> Result<DatasetControls, ControlError> {
    let mut controls = list_files(dir, is_image).map_err(|e| listing_error(dir, e))?;
    let mut media = list_files(images, is_image).map_err(|e| listing_error(images, e))?;
    media.sort_by_key(|p| std::cmp::Reverse(p.file_name().map_or(0, |n| n.len())));
    let mut by_media = HashMap::new();
    for image in media {
        let stem = stem_of(&image);
        let (mine, rest): (Vec<PathBuf>, Vec<PathBuf>) = controls.into_iter().partition(|c| {
            let name = c.file_name().unwrap_or_default().to_string_lossy();
            name.starts_with(&format!("{stem}.")) || name.starts_with(&format!("{stem}_"))
        });
        controls = rest;
        if mine.is_empty() {
            continue;
        }
        let mut keyed = Vec::with_capacity(mine.len());
        for path in mine {
            let own = stem_of(&path);
            let key = if own == stem {
                0
            } else {
                let suffix = own.rsplit_once('_').map_or("", |(_, s)| s);
                let n: u64 = suffix.parse().map_err(|_| ControlError::BadSuffix {
                    stem: stem.clone(),
                    media: image.clone(),
                    path: path.clone(),
                })?;
                n + 1
            };
            keyed.push((key, path));
        }
        keyed.sort();
        by_media.insert(image, keyed.into_iter().map(|(_, p)| p).collect());
    }
    Ok(DatasetControls {
        by_media,
        place: dir.to_path_buf(),
    })
}

/// The `control_path` / `control_path_N` of each line, resolved against the JSONL file's folder.
fn from_jsonl(file: &Path) -> Result<DatasetControls, ControlError> {
    let bytes = read_bounded(file, ReadLimit::JSONL).map_err(|e| listing_error(file, e))?;
    let text = String::from_utf8(bytes).map_err(|e| listing_error(file, e))?;
    let (items, _) = parse_jsonl(&text, DatasetKind::Image, file);
    let base = file.parent().map(Path::to_path_buf).unwrap_or_default();
    let by_media = items
        .into_iter()
        .filter(|item| !item.controls.is_empty())
        .map(|item| {
            let media = resolve_path(&base, Path::new(&item.path));
            let controls = item
                .controls
                .iter()
                .map(|c| resolve_path(&base, Path::new(c)))
                .collect();
            (media, controls)
        })
        .collect();
    Ok(DatasetControls {
        by_media,
        place: file.to_path_buf(),
    })
}

/// The size a control image of `size` is resized to, as musubi-tuner decides: the target's `bucket`; with
/// `control_resolution`, the bucket of that area nearest its aspect ratio; with `no_resize_control`, its own size
/// rounded down to `step` (brought down to `control_resolution`'s area when larger).
pub fn control_size(ds: &ResolvedDataset, size: Size, bucket: Size, step: u32) -> Size {
    let (w, h) = size;
    match (ds.no_resize_control, ds.control_resolution) {
        (true, Some(max)) if u64::from(w) * u64::from(h) > u64::from(max.0) * u64::from(max.1) => {
            bucket_at_area(size, max, step)
        }
        (true, _) => (round_down_to(w, step), round_down_to(h, step)),
        (false, Some(res)) => bucket_at_area(size, res, step),
        (false, None) => bucket,
    }
}

/// musubi-tuner's `calculate_bucket_resolution`: the `step`-multiple size of about `resolution`'s area whose aspect
/// ratio is nearest `size`'s, trying five widths around the ideal one.
pub fn bucket_at_area(size: Size, resolution: Size, step: u32) -> Size {
    let area = u64::from(resolution.0) * u64::from(resolution.1);
    let aspect = f64::from(size.0) / f64::from(size.1.max(1));
    let ideal_w = round_down_to(((area as f64) * aspect).sqrt() as u32, step);
    let ideal_h = round_down_to(((area as f64) / aspect).sqrt() as u32, step);
    let mut best: Option<(f64, Size)> = None;
    for i in -2i64..=2 {
        let w = i64::from(ideal_w) + i * i64::from(step);
        let Ok(w) = u32::try_from(w) else { continue };
        if w == 0 {
            continue;
        }
        let h = round_down_to(u32::try_from(area / u64::from(w)).unwrap_or(u32::MAX), step);
        if h == 0 {
            continue;
        }
        let diff = (f64::from(w) / f64::from(h) - aspect).abs();
        if best.is_none_or(|(d, _)| diff < d) {
            best = Some((diff, (w, h)));
        }
    }
    best.map_or((ideal_w.max(step), ideal_h.max(step)), |(_, s)| s)
}

/// The control images `paths` of the item `media` (whose image went to `bucket`), each decoded and resized as
/// [`control_size`] says.
pub fn load_controls(
    ds: &ResolvedDataset,
    media: &Path,
    paths: &[PathBuf],
    (bucket, step): (Size, u32),
) -> Result<Vec<RgbImage>, ControlError> {
    read_controls(media, paths)?
        .iter()
        .map(|image| {
            let size = control_size(ds, image.dimensions(), bucket, step);
            Ok(resize_to_bucket(image, size))
        })
        .collect()
}

/// The control images `paths` of the item `media`, each decoded at its own size (for an encoder that sizes them
/// as its pipeline does, such as Qwen-Image-Edit's vision-language text encoder).
pub fn read_controls(media: &Path, paths: &[PathBuf]) -> Result<Vec<RgbImage>, ControlError> {
    paths
        .iter()
        .map(|path| {
            load_rgb(path).map_err(|e| ControlError::Unreadable {
                reason: e.message,
                media: media.to_path_buf(),
                path: path.clone(),
            })
        })
        .collect()
}

/// What identifies the contents of the control images `paths` of the item `media`: each file's SHA-256, in order
/// (`sha256:{hex}`, space-separated), so that an encoding made from them is known to be stale once one changes.
pub fn control_stamp(media: &Path, paths: &[PathBuf]) -> Result<String, ControlError> {
    let mut stamps = Vec::with_capacity(paths.len());
    for path in paths {
        let unreadable = |e: std::io::Error| ControlError::Unreadable {
            reason: e.to_string(),
            media: media.to_path_buf(),
            path: path.clone(),
        };
        let mut file = open_regular(path).map_err(unreadable)?;
        let mut hasher = Sha256::new();
        std::io::copy(&mut file, &mut hasher).map_err(unreadable)?;
        let hex: String = hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        stamps.push(format!("sha256:{hex}"));
    }
    Ok(stamps.join(" "))
}

#[cfg(test)]
mod tests;
