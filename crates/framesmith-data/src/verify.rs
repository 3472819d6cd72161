//! The decoding half of `dataset check`: finds the files latent caching would fail on, without decoding whole
//! videos. Images are decoded fully (they are small); videos have their sizes and lengths checked for sanity and
//! the first and the last frame caching uses decoded, each with the probe's time limit.

use std::path::Path;

use super::config::ResolvedDataset;
use super::frames::{select_frames, WAN_TARGET_FPS};
use super::media::{MediaTools, VideoInfo};
use super::probe::{image_size, is_image, list_files, load_rgb, MediaInfo};

/// Largest picture side read. Wan trains at up to 1280×720 and an 8K frame is 7680 wide; a side past this is a
/// damaged header, and decoding it would take gigabytes per frame.
pub const MAX_SIDE_PIXELS: u32 = 16_384;

/// Most decoded frame data caching may hold for one video: it decodes every frame up to the last one a clip
/// uses, at full size, before resizing.
pub const MAX_DECODED_BYTES: u64 = 16 << 30;

/// Decodes the whole image; `Err` holds the reason, without the path.
pub fn verify_image(path: &Path) -> Result<MediaInfo, String> {
    let (width, height) = image_size(path).map_err(|e| e.reason())?;
    check_size(width, height)?;
    let decoded = load_rgb(path).map_err(|e| e.reason())?;
    if decoded.dimensions() != (width, height) {
        return Err(format!(
            "the header says {width}x{height} but the picture decodes as {}x{}",
            decoded.width(),
            decoded.height()
        ));
    }
    Ok(MediaInfo {
        width,
        height,
        frame_count: None,
        fps: None,
    })
}

/// Checks a measured video (file or folder of frames) the way caching will read it: sane size, decoded frames
/// that fit in memory, and the first and last frames it uses decode. `Err` holds the reason, without the path.
pub fn verify_video(
    ds: &ResolvedDataset,
    tools: Option<&MediaTools>,
    path: &Path,
    info: &MediaInfo,
) -> Result<(), String> {
    check_size(info.width, info.height)?;
    let frames = info.frame_count.unwrap_or(0) as usize;
    let Some(last) = last_used_frame(ds, frames) else {
        // Too short for any clip: the report says so as a warning; nothing is decoded.
        return Ok(());
    };
    let frame_bytes = u64::from(info.width) * u64::from(info.height) * 3;
    let decoded_bytes = frame_bytes.saturating_mul(last as u64 + 1);
    if decoded_bytes > MAX_DECODED_BYTES {
        return Err(format!(
            "caching would decode {} frames of {}x{} ({:.1} GiB) to cut its clips; shorten the video, lower its \
             resolution or use frame_extraction = \"head\"",
            last + 1,
            info.width,
            info.height,
            decoded_bytes as f64 / f64::from(1u32 << 30)
        ));
    }
    if path.is_dir() {
        return verify_frame_folder(path, last);
    }
    let Some(tools) = tools else { return Ok(()) };
    let video = VideoInfo {
        width: info.width,
        height: info.height,
        frame_count: info.frame_count.unwrap_or(0),
        fps: info.fps,
        codec: String::new(),
    };
    tools
        .decode_frame(path, &video, None)
        .map_err(|e| format!("the first frame does not decode: {}", e.reason()))?;
    // A seek lands on the first frame at or after the time; two frames early, neither timestamp rounding nor a
    // variable frame rate (the probe gives the average) can put it past the end.
    let (Some(fps), 1..) = (info.fps, last) else {
        return Ok(());
    };
    let at_secs = (last as f64 - 2.0).max(0.0) / fps;
    tools.decode_frame(path, &video, Some(at_secs)).map_err(|e| {
        format!(
            "the frames near frame {} of {frames}, the last one caching uses, do not decode (is the file cut \
             short?): {}",
            last + 1,
            e.reason()
        )
    })?;
    Ok(())
}

/// The index of the last source frame any clip of the dataset takes, `None` when no clip fits.
fn last_used_frame(ds: &ResolvedDataset, frames: usize) -> Option<usize> {
    let params = ds.video.as_ref()?;
    select_frames(frames, params, WAN_TARGET_FPS)
        .iter()
        .flat_map(|c| c.source_indices.iter().copied())
        .max()
}

fn check_size(width: u32, height: u32) -> Result<(), String> {
    if width > MAX_SIDE_PIXELS || height > MAX_SIDE_PIXELS {
        return Err(format!(
            "the picture is {width}x{height}, larger than the {MAX_SIDE_PIXELS} pixels a side Framesmith reads (a damaged \
             header?); resize it"
        ));
    }
    Ok(())
}

/// Decodes the first and the last frame caching uses of a folder of frames.
fn verify_frame_folder(dir: &Path, last: usize) -> Result<(), String> {
    let frames = list_files(dir, is_image).map_err(|e| format!("cannot list the folder ({e})"))?;
    for index in [0, last] {
        let Some(frame) = frames.get(index) else {
            continue;
        };
        let name = frame.file_name().unwrap_or_default().to_string_lossy();
        verify_image(frame).map_err(|why| format!("frame {name}: {why}"))?;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::config::DatasetConfig;

    fn video_dataset(extra: &str) -> ResolvedDataset {
        let toml = format!(
            "[[datasets]]\nvideo_directory = \".\"\ncaption_extension = \".txt\"\nresolution = [832, 480]\n{extra}"
        );
        let parsed = DatasetConfig::parse(&toml, Path::new("/x/d.toml")).unwrap();
        parsed.config.resolve(Path::new("/x")).remove(0)
    }

    fn info(width: u32, height: u32, frames: u32) -> MediaInfo {
        MediaInfo {
            width,
            height,
            frame_count: Some(frames),
            fps: Some(30.0),
        }
    }

    #[test]
    fn absurd_sizes_and_lengths_are_refused_before_decoding() {
        // No ffmpeg is given: every answer here comes from the numbers alone.
        let path = Path::new("/x/v.mp4");
        let head = video_dataset("target_frames = [81]\n");
        let err = verify_video(&head, None, path, &info(40_000, 480, 100)).unwrap_err();
        assert!(err.contains("40000x480") && err.contains("16384"), "{err}");
        assert_eq!(
            verify_video(&head, None, path, &info(7680, 4320, 100_000)),
            Ok(())
        );
        let uniform = video_dataset(
            "target_frames = [81]\nframe_extraction = \"uniform\"\nframe_sample = 2\n",
        );
        let err = verify_video(&uniform, None, path, &info(7680, 4320, 100_000)).unwrap_err();
        assert!(
            err.contains("caching would decode 100000 frames of 7680x4320") && err.contains("GiB"),
            "{err}"
        );
    }
}
