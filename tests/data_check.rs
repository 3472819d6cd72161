//! End-to-end dataset checks on tiny generated media: every bad input the data layer must catch shows up in one
//! report naming its file or key, and real videos are probed, cut into clips, decoded and resized.
//! Tests that need ffmpeg generate their clips with it and are skipped, with a note, when it is not installed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use framesmith_data::bucket::BucketSelector;
use framesmith_data::config::DatasetConfig;
use framesmith_data::frames::{select_frames, WAN_TARGET_FPS};
use framesmith_data::media::MediaTools;
use framesmith_data::probe::decode_video;
use framesmith_data::report::{check_path, BucketKey};
use framesmith_data::resize::resize_to_bucket;
use framesmith_data::scan::ScanOptions;
use image::RgbImage;

fn tools() -> Option<MediaTools> {
    let tools = MediaTools::locate().ok();
    if tools.is_none() {
        eprintln!("note: ffmpeg/ffprobe not on PATH; skipping the parts of this test that need real videos");
    }
    tools
}

/// A `seconds`-long `w`x`h` test-pattern clip at `fps`, encoded with ffmpeg's built-in MPEG-4 encoder.
fn make_clip(tools: &MediaTools, path: &Path, w: u32, h: u32, fps: u32, seconds: u32) {
    let source = format!("testsrc=duration={seconds}:size={w}x{h}:rate={fps}");
    let status = Command::new(&tools.ffmpeg)
        .args([
            "-nostdin", "-v", "error", "-y", "-f", "lavfi", "-i", &source, "-c:v", "mpeg4",
            "-pix_fmt", "yuv420p",
        ])
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success(), "ffmpeg could not make {}", path.display());
}

fn write(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap();
}

fn problems_text(report: &framesmith_data::report::DatasetReport) -> Vec<String> {
    report.problems.iter().map(ToString::to_string).collect()
}

fn has(list: &[String], parts: &[&str]) -> bool {
    list.iter().any(|l| parts.iter().all(|p| l.contains(p)))
}

#[test]
fn image_folder_reports_every_bad_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    RgbImage::from_pixel(64, 48, image::Rgb([200, 10, 10]))
        .save(d.join("good.png"))
        .unwrap();
    write(&d.join("good.txt"), b"  a red square \n");
    RgbImage::new(48, 64).save(d.join("tall.jpg")).unwrap();
    write(&d.join("tall.txt"), b"a tall black image");
    RgbImage::new(32, 32).save(d.join("nocaption.png")).unwrap();
    RgbImage::new(32, 32).save(d.join("latin1.png")).unwrap();
    write(&d.join("latin1.txt"), b"caf\xe9 au lait");
    write(&d.join("broken.png"), b"\x89PNG\r\n\x1a\ntruncated");
    write(&d.join("broken.txt"), b"broken");

    let report = check_path(
        d,
        &ScanOptions {
            probe_media: true,
            tools: None,
            decode_check: true,
        },
    )
    .unwrap();
    let text = problems_text(&report);
    assert!(
        has(
            &text,
            &[
                "warning",
                "no caption file (expected nocaption.txt)",
                "nocaption.png"
            ]
        ),
        "{text:#?}"
    );
    assert!(
        has(&text, &["error", "not UTF-8", "latin1.txt"]),
        "{text:#?}"
    );
    assert!(
        has(&text, &["error", "cannot read the image", "broken.png"]),
        "{text:#?}"
    );
    assert_eq!(report.error_count(), 2, "{text:#?}");

    let ds = &report.datasets[0];
    // broken.png cannot be read, latin1.png's caption cannot, nocaption.png has none: two are used.
    assert_eq!((ds.media_found, ds.items, ds.captions), (5, 2, 3));
    assert_eq!(ds.missing_captions, vec![d.join("nocaption.png")]);
    assert_eq!(ds.unreadable.len(), 2);
    assert_eq!(ds.sizes.get(&(64, 48)), Some(&1));
    // No buckets in a bare folder: every image goes to the default 960x544.
    assert_eq!(
        ds.buckets.get(&BucketKey {
            width: 960,
            height: 544,
            frames: 1
        }),
        Some(&2)
    );
    let shown = report.to_string();
    assert!(
        shown.contains(
            "5 images found, 2 used (3 left out: 1 unreadable, 2 without a usable caption)"
        ) && shown.contains("Errors:"),
        "{shown}"
    );
}

#[test]
fn config_problems_and_missing_ffprobe_are_listed_together() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("clips")).unwrap();
    write(&d.join("clips/a.mp4"), b"\0\0\0\x18ftypmp42");
    write(&d.join("clips/a.txt"), b"clip a");
    let toml = d.join("dataset.toml");
    write(
        &toml,
        b"[general]\nresolution = [960, 544]\ncaption_extension = \".txt\"\nshuffle = true\n\n[[datasets]]\nvideo_directory = \"clips\"\ntarget_frames = [1, 24]\n",
    );
    let report = check_path(
        &toml,
        &ScanOptions {
            probe_media: true,
            tools: None,
            decode_check: true,
        },
    )
    .unwrap();
    let text = problems_text(&report);
    let toml_name = toml.display().to_string();
    assert!(
        has(&text, &["general.shuffle", "unknown key", &toml_name]),
        "{text:#?}"
    );
    assert!(
        has(
            &text,
            &["datasets[0].target_frames", "24 is not N*4+1", &toml_name]
        ),
        "{text:#?}"
    );
    assert!(
        has(
            &text,
            &["ffprobe was not found", "apt install ffmpeg", "clips"]
        ),
        "{text:#?}"
    );
    assert_eq!(report.datasets.len(), 1);
}

#[test]
fn videos_are_probed_cut_decoded_and_resized() {
    let Some(tools) = tools() else { return };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    make_clip(&tools, &d.join("one.mp4"), 64, 48, 16, 1);
    write(&d.join("one.txt"), b"test pattern");
    make_clip(&tools, &d.join("fast.mp4"), 48, 64, 30, 1);
    write(&d.join("fast.txt"), b"thirty fps");
    write(&d.join("empty.mp4"), b"");
    write(&d.join("empty.txt"), b"empty");
    write(&d.join("garbage.mkv"), &[0x5a; 4096]);
    write(&d.join("garbage.txt"), b"garbage");
    make_clip(&tools, &d.join("nocap.avi"), 32, 32, 16, 1);
    let toml = d.join("dataset.toml");
    write(
        &toml,
        b"[general]\nresolution = [64, 48]\ncaption_extension = \".txt\"\nenable_bucket = true\n\n[[datasets]]\nvideo_directory = \".\"\ncache_directory = \"cache\"\ntarget_frames = [1, 9]\nframe_extraction = \"chunk\"\n",
    );
    let report = check_path(
        &toml,
        &ScanOptions {
            probe_media: true,
            tools: Some(tools.clone()),
            decode_check: true,
        },
    )
    .unwrap();
    let text = problems_text(&report);
    assert!(
        has(&text, &["error", "empty (0 bytes)", "empty.mp4"]),
        "{text:#?}"
    );
    assert!(
        has(
            &text,
            &["error", "ffprobe cannot read this video", "garbage.mkv"]
        ),
        "{text:#?}"
    );
    assert!(
        has(
            &text,
            &["error", "no caption file (expected nocap.txt)", "nocap.avi"]
        ),
        "{text:#?}"
    );
    assert!(
        has(&text, &["warning", "target_frames", "chunk"]),
        "{text:#?}"
    );
    assert_eq!(report.error_count(), 3, "{text:#?}");
    let ds = &report.datasets[0];
    assert_eq!((ds.media_found, ds.unreadable.len()), (5, 2));
    // empty.mp4 and garbage.mkv cannot be read, nocap.avi has no caption: one.mp4 and fast.mp4 are used.
    assert_eq!(ds.items, 2);
    assert!(
        report.to_string().contains(
            "5 videos found, 2 used (3 left out: 2 unreadable, 1 without a usable caption)"
        ),
        "{report}"
    );
    // ffprobe's own words, without its `[matroska,webm @ 0x…]` tags or the path in the middle.
    let garbage = text.iter().find(|l| l.contains("garbage.mkv")).unwrap();
    assert!(
        !garbage.contains(" @ 0x") && garbage.matches("garbage.mkv").count() == 1,
        "{garbage}"
    );
    let frames = ds.frame_counts.unwrap();
    assert_eq!((frames.min, frames.max), (16, 30));
    // one.mp4: 16 frames → 16 one-frame chunks + one 9-frame chunk; its 64x48 frames keep the 64x48 bucket.
    assert_eq!(
        ds.buckets.get(&BucketKey {
            width: 64,
            height: 48,
            frames: 9
        }),
        Some(&1)
    );

    let info = tools.probe(&d.join("one.mp4")).unwrap();
    assert_eq!((info.width, info.height, info.frame_count), (64, 48, 16));
    assert!((info.fps.unwrap() - 16.0).abs() < 1e-6);
    decode_and_resize(&tools, &d.join("fast.mp4"), &toml);
}

/// fast.mp4 is 30 fps: with source_fps = 30.0, 30 frames thin to 16 and give one 9-frame head clip.
fn decode_and_resize(tools: &MediaTools, video: &Path, toml: &Path) {
    let text = "[[datasets]]\nvideo_directory = \".\"\ncaption_extension = \".txt\"\nresolution = [32, 48]\n\
                target_frames = [9]\nsource_fps = 30.0\n";
    let config = DatasetConfig::parse(text, toml).unwrap().config;
    let ds = &config.resolve(Path::new("/"))[0];
    let params = ds.video.as_ref().unwrap();
    let clips = select_frames(30, params, WAN_TARGET_FPS);
    assert_eq!(clips.len(), 1);
    assert_eq!(clips[0].source_indices, vec![0, 2, 4, 6, 8, 10, 12, 14, 16]);
    let needed = clips[0].source_indices.last().unwrap() + 1;
    let frames = decode_video(Some(tools), video, Some(needed)).unwrap();
    assert_eq!(frames.len(), needed);
    assert_eq!(frames[0].dimensions(), (48, 64));
    let bucket = BucketSelector::for_latent_caching(ds).bucket_for((48, 64));
    let clip: Vec<RgbImage> = clips[0]
        .source_indices
        .iter()
        .map(|&i| resize_to_bucket(&frames[i], bucket))
        .collect();
    assert!(clip.iter().all(|f| f.dimensions() == bucket));
    // testsrc frames differ from each other: the decoded frames are real pictures, not blank buffers.
    assert_ne!(frames[0].as_raw(), frames[8].as_raw());
}

#[test]
fn hung_or_missing_tools_are_reported_not_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let video = dir.path().join("v.mp4");
    write(&video, b"data");
    let missing = MediaTools::with_paths(PathBuf::from("/no/ffmpeg"), PathBuf::from("/no/ffprobe"));
    let err = missing.probe(&video).unwrap_err().to_string();
    assert!(
        err.contains("ffprobe was not found") && err.contains("apt install ffmpeg"),
        "{err}"
    );
    let err = decode_video(Some(&missing), &video, None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("was not found"), "{err}");
}

#[test]
fn a_folder_given_by_a_relative_path_is_checked_where_it_is() {
    // Tests run in the package folder; the dataset folder is made there and named relatively, as a user types it.
    let dir = tempfile::Builder::new()
        .prefix(".framesmith-relative-")
        .tempdir_in(".")
        .unwrap();
    let name = PathBuf::from(dir.path().file_name().unwrap());
    RgbImage::from_pixel(64, 48, image::Rgb([200, 10, 10]))
        .save(name.join("a.png"))
        .unwrap();
    write(&name.join("a.txt"), b"a red square");
    let options = ScanOptions {
        probe_media: true,
        tools: None,
        decode_check: true,
    };
    for path in [name.clone(), Path::new(".").join(&name)] {
        let report = check_path(&path, &options).unwrap();
        let text = problems_text(&report);
        assert!(report.is_ok(), "{}: {text:?}", path.display());
        assert_eq!(report.datasets.len(), 1, "{}", path.display());
    }
}

#[test]
fn sources_much_smaller_than_their_bucket_are_reported_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let images = d.join("images");
    std::fs::create_dir_all(&images).unwrap();
    for (name, w, h) in [
        ("tiny", 64u32, 48u32),
        ("small", 160, 120),
        ("fine", 512, 384),
    ] {
        RgbImage::new(w, h)
            .save(images.join(format!("{name}.png")))
            .unwrap();
        write(&images.join(format!("{name}.txt")), name.as_bytes());
    }
    let options = ScanOptions {
        probe_media: true,
        tools: None,
        decode_check: true,
    };
    let check = |extra: &str| {
        let toml = d.join("dataset.toml");
        let text = format!(
            "[general]\nresolution = [512, 384]\ncaption_extension = \".txt\"\n{extra}\n\
             [[datasets]]\nimage_directory = \"images\"\n"
        );
        write(&toml, text.as_bytes());
        problems_text(&check_path(&toml, &options).unwrap())
    };
    let text = check("");
    let upscaled: Vec<&String> = text.iter().filter(|p| p.contains("upscaled")).collect();
    assert_eq!(upscaled.len(), 1, "{text:?}");
    assert!(
        upscaled[0].contains("2 of 3 item(s)")
            && upscaled[0].contains("tiny.png at 64x48 → 512x384, 8.0×"),
        "{text:?}"
    );
    let text = check("bucket_no_upscale = true\nenable_bucket = true");
    assert!(!text.iter().any(|p| p.contains("upscaled")), "{text:?}");
}

/// A copy of `from` keeping only its first `keep` bytes.
fn truncated_copy(from: &Path, to: &Path, keep: f64) {
    let bytes = std::fs::read(from).unwrap();
    write(to, &bytes[..(bytes.len() as f64 * keep) as usize]);
}

/// A 24-bit BMP header claiming `w`x`h` pixels, followed by a few bytes of pixel data.
fn bmp_header(w: u32, h: u32) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(b"BM");
    b.extend_from_slice(&(54u32 + 64).to_le_bytes());
    b.extend_from_slice(&[0; 4]);
    b.extend_from_slice(&54u32.to_le_bytes());
    b.extend_from_slice(&40u32.to_le_bytes());
    b.extend_from_slice(&w.to_le_bytes());
    b.extend_from_slice(&h.to_le_bytes());
    b.extend_from_slice(&1u16.to_le_bytes());
    b.extend_from_slice(&24u16.to_le_bytes());
    b.extend_from_slice(&[0; 24]);
    b.extend_from_slice(&[0x7f; 64]);
    b
}

#[test]
fn images_that_caching_cannot_decode_fail_the_check() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Seeded noise, so the PNG's compressed data is long enough to damage in the middle.
    let mut state = 0x2545_f491_u32;
    let noise = RgbImage::from_fn(64, 64, |_, _| {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        image::Rgb([state as u8, (state >> 8) as u8, (state >> 16) as u8])
    });
    noise.save(d.join("good.png")).unwrap();
    let mut png = std::fs::read(d.join("good.png")).unwrap();
    let middle = png.len() / 2;
    png[middle..middle + 64].fill(0xff);
    write(&d.join("corrupt.png"), &png);
    truncated_copy(&d.join("good.png"), &d.join("cut.png"), 0.5);
    write(&d.join("huge.bmp"), &bmp_header(40_000, 40_000));
    for name in ["good", "corrupt", "cut", "huge"] {
        write(&d.join(format!("{name}.txt")), name.as_bytes());
    }
    let options = ScanOptions {
        probe_media: true,
        tools: None,
        decode_check: true,
    };
    let report = check_path(d, &options).unwrap();
    let text = problems_text(&report);
    for name in ["corrupt.png", "cut.png"] {
        assert!(
            has(&text, &["error", "cannot read the image", name]),
            "{text:#?}"
        );
    }
    assert!(
        has(&text, &["error", "40000x40000", "huge.bmp"]),
        "{text:#?}"
    );
    assert_eq!(report.error_count(), 3, "{text:#?}");
    assert_eq!(report.datasets[0].items, 1);
}

#[test]
fn videos_that_caching_cannot_decode_fail_the_check() {
    let Some(tools) = tools() else { return };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let clip = |name: &str, codec: &str| {
        Command::new(&tools.ffmpeg)
            .args([
                "-nostdin",
                "-v",
                "error",
                "-y",
                "-f",
                "lavfi",
                "-i",
                "testsrc=duration=2:size=64x48:rate=16",
                "-c:v",
                codec,
                "-pix_fmt",
                "yuv420p",
                "-movflags",
                "+faststart",
            ])
            .arg(d.join(name))
            .status()
            .unwrap()
            .success()
    };
    assert!(clip("good.mp4", "mpeg4"));
    // The index at the front survives, the frames at the end do not.
    truncated_copy(&d.join("good.mp4"), &d.join("cut.mp4"), 0.6);
    // A valid container whose H.264 data is noise: measured fine, no frame decodes.
    let garbled = clip("garbled.mp4", "libx264");
    if garbled {
        let mut bytes = std::fs::read(d.join("garbled.mp4")).unwrap();
        let mdat = bytes.windows(4).position(|w| w == b"mdat").unwrap() + 4;
        bytes[mdat..].fill(0x5a);
        write(&d.join("garbled.mp4"), &bytes);
    } else {
        eprintln!("note: this ffmpeg has no libx264; skipping the garbled-data part");
    }
    for name in ["good", "cut", "garbled"] {
        write(&d.join(format!("{name}.txt")), name.as_bytes());
    }
    let toml = d.join("dataset.toml");
    write(
        &toml,
        b"[general]\nresolution = [64, 48]\ncaption_extension = \".txt\"\n\n[[datasets]]\nvideo_directory = \".\"\n\
          cache_directory = \"cache\"\ntarget_frames = [1, 29]\nframe_extraction = \"uniform\"\nframe_sample = 2\n",
    );
    let options = ScanOptions {
        probe_media: true,
        tools: Some(tools.clone()),
        decode_check: true,
    };
    let report = check_path(&toml, &options).unwrap();
    let text = problems_text(&report);
    assert!(
        has(
            &text,
            &["error", "cut short: it lists 32 frames", "cut.mp4"]
        ),
        "{text:#?}"
    );
    if garbled {
        assert!(
            has(
                &text,
                &["error", "the first frame does not decode", "garbled.mp4"]
            ),
            "{text:#?}"
        );
    }
    assert!(!text.iter().any(|l| l.contains("good.mp4")), "{text:#?}");
    assert_eq!(report.error_count(), 1 + usize::from(garbled), "{text:#?}");
    assert_eq!(report.datasets[0].items, 1);
}
