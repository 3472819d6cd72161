//! `StandaloneBackend`: the app's backend before `main.rs` wires in the real modules. It scans folders with the
//! `image` crate (videos are counted, not decoded), has no presets or validation, and has no engine.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use framesmith_config::protocol::EngineHandle;
use framesmith_config::RunConfig;

use super::backend::{Backend, DatasetSummary, FieldIssue, ModelRole, PresetView, Thumbnail};

const IMAGE_EXTENSIONS: [&str; 5] = ["png", "jpg", "jpeg", "webp", "bmp"];
const VIDEO_EXTENSIONS: [&str; 6] = ["mp4", "webm", "mov", "mkv", "avi", "gif"];
const CAPTION_EXTENSION: &str = "txt";
/// Thumbnails made per scan, and their longest side.
pub const THUMBNAILS: usize = 6;
const THUMBNAIL_SIDE: u32 = 96;

/// A backend that needs nothing but the file system.
#[derive(Debug, Clone, Copy, Default)]
pub struct StandaloneBackend;

impl Backend for StandaloneBackend {
    fn inspect_model(&self, _role: ModelRole, path: &Path) -> Result<String, String> {
        let meta = std::fs::metadata(path)
            .map_err(|err| format!("cannot read {}: {err}", path.display()))?;
        Ok(format!(
            "{} (the model inspector is not part of this build)",
            format_bytes(meta.len())
        ))
    }

    fn scan_dataset(&self, folders: &[PathBuf]) -> Result<DatasetSummary, String> {
        scan_folders(folders)
    }

    fn presets(&self) -> Vec<PresetView> {
        Vec::new()
    }

    fn apply_preset(&self, name: &str, _config: &RunConfig) -> Result<RunConfig, String> {
        Err(format!("no preset named {name}"))
    }

    fn validate(&self, _config: &RunConfig) -> Vec<FieldIssue> {
        Vec::new()
    }

    fn demo_project(&self) -> RunConfig {
        let mut config = RunConfig::default();
        config.model.demo = true;
        config.training.max_train_steps = 200;
        config.lora.rank = 8;
        config.lora.alpha = 8.0;
        config.output.output_name = "demo".into();
        config
    }

    fn spawn_engine(&self, _gpus: &[usize]) -> Result<EngineHandle, String> {
        Err("the training engine is not part of this build".into())
    }
}

/// "1.5 GiB", "12 MiB", "900 B".
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if value < 10.0 {
        format!("{value:.1} {}", UNITS[unit])
    } else {
        format!("{value:.0} {}", UNITS[unit])
    }
}

/// Scans the top level of each folder, as musubi-tuner reads `image_directory` / `video_directory`.
pub fn scan_folders(folders: &[PathBuf]) -> Result<DatasetSummary, String> {
    let mut summary = DatasetSummary {
        folders: folders.to_vec(),
        ..DatasetSummary::default()
    };
    for folder in folders {
        scan_folder(folder, &mut summary)?;
    }
    Ok(summary)
}

fn scan_folder(folder: &Path, summary: &mut DatasetSummary) -> Result<(), String> {
    let entries = std::fs::read_dir(folder)
        .map_err(|err| format!("cannot read the folder {}: {err}", folder.display()))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    let (mut images, mut videos) = (0usize, 0usize);
    for path in &files {
        let ext = extension(path);
        if ext == CAPTION_EXTENSION {
            summary.captions += 1;
            continue;
        }
        let is_image = IMAGE_EXTENSIONS.contains(&ext.as_str());
        let is_video = VIDEO_EXTENSIONS.contains(&ext.as_str());
        if !is_image && !is_video {
            continue;
        }
        if !path.with_extension(CAPTION_EXTENSION).is_file() {
            summary.missing_captions.push(path.clone());
        }
        if is_image {
            images += 1;
            scan_image(path, summary);
        } else {
            videos += 1;
            scan_video(path, summary);
        }
    }
    summary.images += images;
    summary.videos += videos;
    if videos > images {
        summary.video_folders.push(folder.to_path_buf());
    }
    Ok(())
}

fn scan_image(path: &Path, summary: &mut DatasetSummary) {
    match image::image_dimensions(path) {
        Ok(size) => {
            *summary.resolutions.entry(size).or_insert(0) += 1;
            if summary.thumbnails.len() < THUMBNAILS {
                if let Some(thumbnail) = thumbnail(path) {
                    summary.thumbnails.push(thumbnail);
                }
            }
        }
        Err(err) => summary
            .unreadable
            .push((path.to_path_buf(), err.to_string())),
    }
}

/// Without a video decoder only empty files can be caught here; the real scanner probes with ffmpeg.
fn scan_video(path: &Path, summary: &mut DatasetSummary) {
    match std::fs::metadata(path) {
        Ok(meta) if meta.len() == 0 => summary
            .unreadable
            .push((path.to_path_buf(), "the file is empty".into())),
        Ok(_) => {}
        Err(err) => summary
            .unreadable
            .push((path.to_path_buf(), err.to_string())),
    }
}

/// Thumbnails of the first few readable images in the folders (top level, name order).
pub fn thumbnails(folders: &[PathBuf], count: usize) -> Vec<Thumbnail> {
    let mut out = Vec::new();
    for folder in folders {
        let Ok(entries) = std::fs::read_dir(folder) else {
            continue;
        };
        let mut images: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| IMAGE_EXTENSIONS.contains(&extension(p).as_str()))
            .collect();
        images.sort();
        out.extend(
            images
                .iter()
                .filter_map(|p| thumbnail(p))
                .take(count - out.len().min(count)),
        );
        if out.len() >= count {
            break;
        }
    }
    out.truncate(count);
    out
}

fn thumbnail(path: &Path) -> Option<Thumbnail> {
    let image = image::open(path).ok()?;
    let small = image.thumbnail(THUMBNAIL_SIDE, THUMBNAIL_SIDE).to_rgba8();
    Some(Thumbnail {
        path: path.to_path_buf(),
        width: small.width(),
        height: small.height(),
        rgba: small.into_raw(),
    })
}

fn extension(path: &Path) -> String {
    path.extension()
        .map(|e| e.to_string_lossy().to_lowercase())
        .unwrap_or_default()
}

/// Resolution spread as one line: "832×480 to 1280×720 (3 sizes)".
pub fn resolution_spread(resolutions: &BTreeMap<(u32, u32), usize>) -> Option<String> {
    let by_area = |&(&(w, h), _): &(&(u32, u32), &usize)| u64::from(w) * u64::from(h);
    let smallest = resolutions.iter().min_by_key(by_area)?.0;
    let largest = resolutions.iter().max_by_key(by_area)?.0;
    Some(if resolutions.len() == 1 {
        format!("{}×{}", smallest.0, smallest.1)
    } else {
        format!(
            "{}×{} to {}×{} ({} sizes)",
            smallest.0,
            smallest.1,
            largest.0,
            largest.1,
            resolutions.len()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(path: &Path, width: u32, height: u32) {
        image::RgbaImage::from_pixel(width, height, image::Rgba([200, 10, 10, 255]))
            .save(path)
            .unwrap();
    }

    #[test]
    fn scan_counts_media_captions_and_problems() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        png(&root.join("a.png"), 8, 4);
        std::fs::write(root.join("a.txt"), "a cat").unwrap();
        png(&root.join("b.png"), 16, 8);
        std::fs::write(root.join("c.jpg"), b"not a jpeg").unwrap();
        std::fs::write(root.join("c.txt"), "broken").unwrap();
        std::fs::write(root.join("clip.mp4"), b"").unwrap();
        std::fs::write(root.join("notes.md"), "ignored").unwrap();
        let summary = scan_folders(&[root.to_path_buf()]).unwrap();
        assert_eq!(
            (summary.images, summary.videos, summary.captions),
            (3, 1, 2)
        );
        assert_eq!(
            summary.missing_captions,
            vec![root.join("b.png"), root.join("clip.mp4")]
        );
        let unreadable: Vec<&PathBuf> = summary.unreadable.iter().map(|(p, _)| p).collect();
        assert_eq!(
            unreadable,
            vec![&root.join("c.jpg"), &root.join("clip.mp4")]
        );
        assert_eq!(summary.resolutions.len(), 2);
        assert_eq!(summary.thumbnails.len(), 2);
        assert!(summary.video_folders.is_empty());
        assert_eq!(
            resolution_spread(&summary.resolutions).unwrap(),
            "8×4 to 16×8 (2 sizes)"
        );
    }

    #[test]
    fn missing_folder_is_a_clear_error() {
        let err = scan_folders(&[PathBuf::from("/no/such/folder")]).unwrap_err();
        assert!(err.contains("/no/such/folder"), "{err}");
    }

    #[test]
    fn bytes_are_formatted_with_binary_units() {
        assert_eq!(format_bytes(900), "900 B");
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(format_bytes(30 << 30), "30 GiB");
    }
}
