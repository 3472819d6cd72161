//! Listing a dataset's items (directory with caption files, or JSONL), reading captions and measuring each image
//! and video, with one [`Problem`] per missing caption, unreadable file or name clash.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use super::config::{DatasetKind, DatasetSource, ResolvedDataset};
use super::media::{MediaTools, FFMPEG_INSTALL_HINT};
use super::probe::{image_size, is_image, is_video, list_files, probe_video, MediaInfo};
use super::problem::Problem;
use super::verify::{verify_image, verify_video};

/// What a scan measures.
#[derive(Clone, Debug, Default)]
pub struct ScanOptions {
    /// Read image headers and probe videos (sizes and frame counts); off only lists files and reads captions.
    pub probe_media: bool,
    /// ffmpeg/ffprobe; `None` when they are not installed (videos are then listed but not measured).
    pub tools: Option<MediaTools>,
    /// With probing: also decode every image and the first and last frame caching uses of every video, and
    /// check sizes and lengths are sane, so the files caching would fail on are found now
    /// ([`super::verify`]).
    pub decode_check: bool,
}

impl ScanOptions {
    /// Probing on, with ffmpeg found beside the executable or on `PATH` if it is there.
    pub fn locate() -> Self {
        Self {
            probe_media: true,
            tools: MediaTools::locate().ok(),
            decode_check: true,
        }
    }
}

/// One image or video of a dataset.
#[derive(Clone, Debug, PartialEq)]
pub struct ScannedItem {
    /// The image, video file, or folder of frames.
    pub media: PathBuf,
    /// The caption, trimmed; `None` when missing or unreadable.
    pub caption: Option<String>,
    /// Size and frame count; `None` when not probed or unreadable.
    pub info: Option<MediaInfo>,
}

/// Everything a scan found in one dataset.
#[derive(Clone, Debug)]
pub struct DatasetScan {
    /// The dataset scanned.
    pub dataset: ResolvedDataset,
    /// Items that take part in training. Images without a caption are left out, as musubi-tuner skips them;
    /// videos without one stay (musubi-tuner would stop on them) and are reported as errors.
    pub items: Vec<ScannedItem>,
    /// Captions read.
    pub captions: usize,
    /// Media files with no caption.
    pub missing_captions: Vec<PathBuf>,
    /// Media or caption files that could not be read.
    pub unreadable: Vec<PathBuf>,
    /// Everything wrong, each naming its file.
    pub problems: Vec<Problem>,
}

impl DatasetScan {
    fn new(dataset: &ResolvedDataset) -> Self {
        Self {
            dataset: dataset.clone(),
            items: Vec::new(),
            captions: 0,
            missing_captions: Vec::new(),
            unreadable: Vec::new(),
            problems: Vec::new(),
        }
    }
}

/// Lists, reads and (with `options.probe_media`) measures every item of `dataset`.
pub fn scan_dataset(dataset: &ResolvedDataset, options: &ScanOptions) -> DatasetScan {
    let mut scan = DatasetScan::new(dataset);
    let entries = match &dataset.source {
        DatasetSource::ImageDirectory(dir) => list_directory(dir, is_image, &mut scan),
        DatasetSource::VideoDirectory(dir) => list_directory(dir, is_video, &mut scan),
        DatasetSource::ImageJsonl(file) => {
            super::jsonl::read_jsonl(file, DatasetKind::Image, &mut scan.problems)
        }
        DatasetSource::VideoJsonl(file) => {
            super::jsonl::read_jsonl(file, DatasetKind::Video, &mut scan.problems)
        }
    };
    check_name_clashes(&entries, &mut scan.problems);
    let kind = dataset.kind();
    if kind == DatasetKind::Video
        && options.probe_media
        && options.tools.is_none()
        && !entries.is_empty()
    {
        scan.problems.push(Problem::error(
            dataset.source.path(),
            format!(
                "videos were listed but not measured: ffprobe was not found; {FFMPEG_INSTALL_HINT}"
            ),
        ));
    }
    let caption_ext = dataset.caption_extension.as_deref();
    let results: Vec<(Entry, CaptionResult, Result<Option<MediaInfo>, Problem>)> = entries
        .into_par_iter()
        .map(|entry| {
            let caption = entry.caption_result(caption_ext);
            let info = probe_item(&entry.media, dataset, options);
            (entry, caption, info)
        })
        .collect();
    for (entry, caption, info) in results {
        collect_item(&mut scan, kind, entry, caption, info);
    }
    scan
}

/// A listed item before it is read.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    pub(crate) media: PathBuf,
    /// Captions from a JSONL file come with the entry; directory entries read a file.
    pub(crate) caption: Option<String>,
}

enum CaptionResult {
    Read(String),
    Missing(PathBuf),
    Bad(Problem),
    /// No caption_extension for a directory dataset: validation reports that once, not per item.
    NotConfigured,
}

impl Entry {
    fn caption_result(&self, ext: Option<&str>) -> CaptionResult {
        if let Some(caption) = &self.caption {
            return CaptionResult::Read(caption.clone());
        }
        let Some(ext) = ext else {
            return CaptionResult::NotConfigured;
        };
        read_caption(&caption_path(&self.media, ext))
    }
}

/// The caption file of `media`: its path without the extension, plus `ext` (musubi-tuner's rule).
pub fn caption_path(media: &Path, ext: &str) -> PathBuf {
    let mut name = media.file_stem().unwrap_or_default().to_os_string();
    name.push(ext);
    media.with_file_name(name)
}

fn read_caption(path: &Path) -> CaptionResult {
    match std::fs::read(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            CaptionResult::Missing(path.to_path_buf())
        }
        Err(e) => CaptionResult::Bad(Problem::error(
            path,
            format!("cannot read the caption ({e})"),
        )),
        Ok(bytes) => match String::from_utf8(bytes) {
            Ok(text) => CaptionResult::Read(text.trim().to_string()),
            Err(e) => CaptionResult::Bad(Problem::error(
                path,
                format!(
                    "the caption is not UTF-8 text (bad byte at offset {}); save it as UTF-8",
                    e.utf8_error().valid_up_to()
                ),
            )),
        },
    }
}

fn list_directory(dir: &Path, keep: fn(&Path) -> bool, scan: &mut DatasetScan) -> Vec<Entry> {
    match list_files(dir, keep) {
        Ok(files) => files
            .into_iter()
            .map(|media| Entry {
                media,
                caption: None,
            })
            .collect(),
        Err(e) => {
            scan.problems
                .push(Problem::error(dir, format!("cannot list the folder ({e})")));
            Vec::new()
        }
    }
}

/// Cache files are named after the media file's name without extension, all in one cache directory, so two
/// items with the same stem would overwrite each other's caches.
fn check_name_clashes(entries: &[Entry], problems: &mut Vec<Problem>) {
    let mut first: HashMap<&std::ffi::OsStr, &Path> = HashMap::new();
    for entry in entries {
        let Some(stem) = entry.media.file_stem() else {
            continue;
        };
        match first.get(stem) {
            Some(other) if *other != entry.media.as_path() => problems.push(Problem::error(
                &entry.media,
                format!(
                    "same name without extension as {}, so their cache files would overwrite each other; \
                     rename one",
                    other.display()
                ),
            )),
            Some(_) => problems.push(Problem::warning(&entry.media, "listed twice; it is used once")),
            None => {
                first.insert(stem, &entry.media);
            }
        }
    }
}

fn probe_item(
    media: &Path,
    dataset: &ResolvedDataset,
    options: &ScanOptions,
) -> Result<Option<MediaInfo>, Problem> {
    if !options.probe_media {
        return Ok(None);
    }
    let unreadable = |reason: String| Problem::error(media, reason);
    match dataset.kind() {
        DatasetKind::Image if options.decode_check => {
            verify_image(media).map(Some).map_err(unreadable)
        }
        DatasetKind::Image => image_size(media)
            .map(|(width, height)| {
                Some(MediaInfo {
                    width,
                    height,
                    frame_count: None,
                    fps: None,
                })
            })
            .map_err(|e| unreadable(e.reason())),
        // Without ffprobe, video files are reported once per dataset; folders of frames need no ffprobe.
        DatasetKind::Video if options.tools.is_none() && !media.is_dir() => Ok(None),
        DatasetKind::Video => {
            let info =
                probe_video(options.tools.as_ref(), media).map_err(|e| unreadable(e.reason()))?;
            if options.decode_check {
                verify_video(dataset, options.tools.as_ref(), media, &info).map_err(unreadable)?;
            }
            Ok(Some(info))
        }
    }
}

fn collect_item(
    scan: &mut DatasetScan,
    kind: DatasetKind,
    entry: Entry,
    caption: CaptionResult,
    info: Result<Option<MediaInfo>, Problem>,
) {
    let info = match info {
        Ok(info) => info,
        Err(problem) => {
            scan.unreadable.push(entry.media.clone());
            scan.problems.push(problem);
            None
        }
    };
    let caption = match caption {
        CaptionResult::Read(text) => {
            scan.captions += 1;
            if text.is_empty() {
                scan.problems
                    .push(Problem::warning(&entry.media, "the caption is empty"));
            }
            Some(text)
        }
        CaptionResult::Missing(caption_file) => {
            scan.missing_captions.push(entry.media.clone());
            let name = caption_file
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            if kind == DatasetKind::Image {
                // musubi-tuner silently skips images without captions; say so rather than fail.
                scan.problems.push(Problem::warning(
                    &entry.media,
                    format!("no caption file (expected {name}), so this image is left out as musubi-tuner does"),
                ));
                return;
            }
            scan.problems.push(Problem::error(
                &entry.media,
                format!("no caption file (expected {name})"),
            ));
            None
        }
        CaptionResult::NotConfigured => None,
        CaptionResult::Bad(problem) => {
            if let Some(file) = &problem.file {
                scan.unreadable.push(file.clone());
            }
            scan.problems.push(problem);
            None
        }
    };
    scan.items.push(ScannedItem {
        media: entry.media,
        caption,
        info,
    });
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::config::DatasetConfig;

    fn dataset(toml: &str, base: &Path) -> ResolvedDataset {
        let parsed = DatasetConfig::parse(toml, &base.join("d.toml")).unwrap();
        assert!(parsed.problems.is_empty(), "{:?}", parsed.problems);
        parsed.config.resolve(base).remove(0)
    }

    #[test]
    fn caption_path_replaces_only_the_last_extension() {
        assert_eq!(
            caption_path(Path::new("/d/a.b.mp4"), ".txt"),
            PathBuf::from("/d/a.b.txt")
        );
        assert_eq!(
            caption_path(Path::new("x.png"), ".caption"),
            PathBuf::from("x.caption")
        );
    }

    #[test]
    fn same_stem_in_one_dataset_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for name in ["a.png", "a.jpg"] {
            image::RgbImage::new(16, 16).save(d.join(name)).unwrap();
        }
        std::fs::write(d.join("a.txt"), "caption").unwrap();
        let ds = dataset(
            "[[datasets]]\nimage_directory = \".\"\ncaption_extension = \".txt\"\n",
            d,
        );
        let scan = scan_dataset(&ds, &ScanOptions::default());
        assert_eq!(scan.items.len(), 2);
        assert!(
            scan.items.iter().all(|i| i.info.is_none()),
            "probing was off"
        );
        let text: Vec<String> = scan.problems.iter().map(ToString::to_string).collect();
        assert_eq!(text.len(), 1, "{text:#?}");
        assert!(
            text[0].contains("same name without extension as") && text[0].ends_with("a.png"),
            "{text:#?}"
        );
    }

    #[test]
    fn jsonl_items_resolve_against_the_file_and_missing_media_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("img")).unwrap();
        image::RgbImage::new(32, 16)
            .save(d.join("img/one.png"))
            .unwrap();
        std::fs::write(
            d.join("meta.jsonl"),
            "{\"image_path\": \"img/one.png\", \"caption\": \" kept as written \"}\n{\"image_path\": \"img/two.png\", \"caption\": \"x\"}\n",
        )
        .unwrap();
        let ds = dataset(
            "[[datasets]]\nimage_jsonl_file = \"meta.jsonl\"\ncache_directory = \"cache\"\n",
            d,
        );
        let options = ScanOptions {
            probe_media: true,
            tools: None,
            decode_check: false,
        };
        let scan = scan_dataset(&ds, &options);
        assert_eq!(scan.items.len(), 1);
        assert_eq!(scan.items[0].media, d.join("img/one.png"));
        assert_eq!(scan.items[0].caption.as_deref(), Some(" kept as written "));
        assert_eq!(
            scan.items[0].info.as_ref().map(|i| (i.width, i.height)),
            Some((32, 16))
        );
        let text: Vec<String> = scan.problems.iter().map(ToString::to_string).collect();
        assert_eq!(text.len(), 1, "{text:#?}");
        assert!(
            text[0].contains("line 2 of meta.jsonl") && text[0].ends_with("two.png"),
            "{text:#?}"
        );
    }
}
