//! Listing a dataset's items (directory with caption files, or JSONL), reading captions and measuring each image
//! and video, with one [`Problem`] per missing caption, unreadable file or name clash.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use framesmith_config::file_read::{read_bounded, ReadLimit};

use super::config::{DatasetKind, DatasetSource, ResolvedDataset};
use super::entries::list_media;
use super::media::{MediaTools, FFMPEG_INSTALL_HINT};
use super::probe::{image_size, is_image, is_video, probe_video, MediaInfo};
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
        DatasetSource::ImageDirectory(dir) => list_directory(dir, DatasetKind::Image, &mut scan),
        DatasetSource::VideoDirectory(dir) => list_directory(dir, DatasetKind::Video, &mut scan),
        DatasetSource::ImageJsonl(file) => {
            super::jsonl::read_jsonl(file, DatasetKind::Image, &mut scan.problems)
        }
        DatasetSource::VideoJsonl(file) => {
            super::jsonl::read_jsonl(file, DatasetKind::Video, &mut scan.problems)
        }
    };
    check_name_clashes(&entries, &mut scan.problems);
    if let (DatasetSource::ImageDirectory(dir) | DatasetSource::VideoDirectory(dir), Some(ext)) =
        (&dataset.source, dataset.caption_extension.as_deref())
    {
        orphan_captions(dir, ext, &entries, &mut scan.problems);
    }
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
            let info = match &entry.unusable {
                // Never opened: a FIFO would block, a device would never end.
                Some(why) => Err(unusable_problem(
                    &entry.media,
                    why,
                    matches!(caption, CaptionResult::Read(_)),
                    kind,
                )),
                None => probe_item(&entry.media, dataset, options),
            };
            (entry, caption, info)
        })
        .collect();
    for (entry, caption, info) in results {
        collect_item(&mut scan, kind, entry, caption, info);
    }
    scan
}

/// The dataset's entries that cannot be read at all (dangling symbolic links, link loops, FIFOs, devices; for a
/// JSONL dataset also bad lines and listed media that do not exist), found by listing only: nothing is opened
/// or decoded, so this is cheap enough to run before every caching or training run.
pub fn entry_problems(dataset: &ResolvedDataset) -> Vec<Problem> {
    let mut scan = DatasetScan::new(dataset);
    let kind = dataset.kind();
    let entries = match &dataset.source {
        DatasetSource::ImageDirectory(dir) | DatasetSource::VideoDirectory(dir) => {
            list_directory(dir, kind, &mut scan)
        }
        DatasetSource::ImageJsonl(file) | DatasetSource::VideoJsonl(file) => {
            super::jsonl::read_jsonl(file, kind, &mut scan.problems)
        }
    };
    for entry in entries {
        if let Some(why) = &entry.unusable {
            let has_caption = entry.caption.is_some()
                || dataset
                    .caption_extension
                    .as_deref()
                    .is_some_and(|ext| caption_path(&entry.media, ext).is_file());
            scan.problems
                .push(unusable_problem(&entry.media, why, has_caption, kind));
        }
    }
    scan.problems
}

/// A listed item before it is read.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    pub(crate) media: PathBuf,
    /// Captions from a JSONL file come with the entry; directory entries read a file.
    pub(crate) caption: Option<String>,
    /// Why the media cannot be read at all (a dangling symlink, a FIFO, a device): it is reported, never opened.
    pub(crate) unusable: Option<String>,
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

/// What many of one kind of per-file problem are called together ([`Problem::group`]).
pub mod groups {
    /// Media entries that are not files (dangling symlinks, link loops, FIFOs, devices).
    pub const UNUSABLE_ENTRIES: &str = "dataset entries that are not readable files";
    /// Media that cannot be opened, decoded or measured.
    pub const UNREADABLE_MEDIA: &str = "unreadable images or videos";
    /// Captions that cannot be read or are not text.
    pub const UNREADABLE_CAPTIONS: &str = "unreadable caption files";
    /// Images without a caption file (left out).
    pub const IMAGES_WITHOUT_CAPTION: &str = "images without a caption file, left out";
    /// Videos without a caption file.
    pub const VIDEOS_WITHOUT_CAPTION: &str = "videos without a caption file";
    /// Captions that are empty.
    pub const EMPTY_CAPTIONS: &str = "empty captions";
    /// Media listed in a JSONL file that do not exist.
    pub const MISSING_LISTED_MEDIA: &str = "listed media that do not exist";
    /// Bad lines of a JSONL file.
    pub const BAD_JSONL_LINES: &str = "bad JSONL lines";
    /// Caption files without media beside them.
    pub const ORPHAN_CAPTIONS: &str = "captions with no image or video";
}

/// The problem of an entry that cannot be read as media, saying when that leaves its caption unused.
fn unusable_problem(media: &Path, why: &str, has_caption: bool, kind: DatasetKind) -> Problem {
    let orphan = if has_caption {
        " (its caption is left unused)"
    } else {
        ""
    };
    let what = match kind {
        DatasetKind::Image => "image",
        DatasetKind::Video => "video",
    };
    Problem::error(media, format!("this {what} {why}{orphan}")).grouped(groups::UNUSABLE_ENTRIES)
}

fn read_caption(path: &Path) -> CaptionResult {
    match read_bounded(path, ReadLimit::CAPTION) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            CaptionResult::Missing(path.to_path_buf())
        }
        Err(e) => CaptionResult::Bad(
            Problem::error(path, format!("cannot read the caption ({e})"))
                .grouped(groups::UNREADABLE_CAPTIONS),
        ),
        Ok(bytes) => match String::from_utf8(bytes) {
            Ok(text) => CaptionResult::Read(text.trim().to_string()),
            Err(e) => CaptionResult::Bad(
                Problem::error(
                    path,
                    format!(
                        "the caption is not UTF-8 text (bad byte at offset {}); save it as UTF-8",
                        e.utf8_error().valid_up_to()
                    ),
                )
                .grouped(groups::UNREADABLE_CAPTIONS),
            ),
        },
    }
}

fn list_directory(dir: &Path, kind: DatasetKind, scan: &mut DatasetScan) -> Vec<Entry> {
    let keep = match kind {
        DatasetKind::Image => is_image,
        DatasetKind::Video => is_video,
    };
    match list_media(dir, keep, kind) {
        Ok(files) => files
            .into_iter()
            .map(|media| Entry {
                media: media.path,
                caption: None,
                unusable: media.unusable,
            })
            .collect(),
        Err(e) => {
            scan.problems
                .push(Problem::error(dir, format!("cannot list the folder ({e})")));
            Vec::new()
        }
    }
}

/// Caption files in `dir` with no image or video beside them (a clip renamed, moved or never copied): each is a
/// warning, as nothing trains on it.
fn orphan_captions(dir: &Path, ext: &str, entries: &[Entry], problems: &mut Vec<Problem>) {
    let Ok(listing) = std::fs::read_dir(dir) else {
        return; // the folder's own error is reported by the listing
    };
    let captioned: std::collections::HashSet<PathBuf> = entries
        .iter()
        .map(|e| caption_path(&e.media, ext))
        .collect();
    let mut orphans: Vec<PathBuf> = listing
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(ext) && !captioned.contains(p))
        .collect();
    orphans.sort();
    for orphan in orphans {
        problems.push(
            Problem::warning(
                &orphan,
                "a caption with no image or video of the same name beside it: nothing trains on it; add or \
                 rename its media file, or remove it",
            )
            .grouped(groups::ORPHAN_CAPTIONS),
        );
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
    let unreadable =
        |reason: String| Problem::error(media, reason).grouped(groups::UNREADABLE_MEDIA);
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
                scan.problems.push(
                    Problem::warning(&entry.media, "the caption is empty")
                        .grouped(groups::EMPTY_CAPTIONS),
                );
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
                ).grouped(groups::IMAGES_WITHOUT_CAPTION));
                return;
            }
            scan.problems.push(
                Problem::error(&entry.media, format!("no caption file (expected {name})"))
                    .grouped(groups::VIDEOS_WITHOUT_CAPTION),
            );
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
