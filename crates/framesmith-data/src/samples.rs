//! Turning one scanned item into what the VAE encodes, as musubi-tuner's latent caching does: the bucket, the
//! resized (and for videos, clipped) RGB frames, and the cache file name they go to.

use std::path::{Path, PathBuf};

use image::RgbImage;

use super::bucket::{BucketSelector, Size};
use super::cache::{image_latent_cache_name, media_stem, text_cache_name, video_latent_cache_name};
use super::config::ResolvedDataset;
use super::frames::{select_frames, FrameWindow, WAN_TARGET_FPS};
use super::media::MediaTools;
use super::probe::{decode_video, load_rgb, probe_video, ImageReadError, VideoProbeError};
use super::resize::resize_to_bucket;

/// Frames ready for the VAE, with where their caches go.
#[derive(Clone, Debug)]
pub struct Sample {
    /// The image or video it came from.
    pub media: PathBuf,
    /// The clip, for videos.
    pub window: Option<FrameWindow>,
    /// Media size before resizing (it is in the cache name).
    pub original_size: Size,
    /// Size after resizing and cropping.
    pub bucket: Size,
    /// One frame for an image; the clip's frames for a video; each `bucket` sized.
    pub frames: Vec<RgbImage>,
    /// Latent cache file (in the dataset's cache directory).
    pub latent_cache: PathBuf,
    /// Text-encoder cache file (shared by every clip of a video).
    pub text_cache: PathBuf,
    /// Where a clip lies in its video file, in seconds: the first frame's time and the span its source frames
    /// cover (what its sound is cut to); `None` for images, folders of frames and videos of unknown frame rate.
    pub span_secs: Option<(f64, f64)>,
}

/// The folder an item's caches go to: the dataset's cache directory, else the media's own folder.
pub fn cache_dir(ds: &ResolvedDataset, media: &Path) -> PathBuf {
    ds.cache_directory
        .clone()
        .or_else(|| media.parent().map(Path::to_path_buf))
        .unwrap_or_default()
}

/// An image resized to its bucket (chosen with the dataset's `enable_bucket` / `bucket_no_upscale`, sides in
/// `step`-pixel steps: [`crate::bucket::WAN_BUCKET_STEP`], or 32 for the Wan2.2 VAE).
pub fn image_sample(
    ds: &ResolvedDataset,
    media: &Path,
    step: u32,
) -> Result<Sample, ImageReadError> {
    let image = load_rgb(media)?;
    let original_size = image.dimensions();
    let bucket = BucketSelector::for_latent_caching(ds)
        .with_step(step)
        .bucket_for(original_size);
    let stem = media_stem(media);
    let dir = cache_dir(ds, media);
    Ok(Sample {
        media: media.to_path_buf(),
        window: None,
        original_size,
        bucket,
        frames: vec![resize_to_bucket(&image, bucket)],
        latent_cache: dir.join(image_latent_cache_name(&stem, original_size)),
        text_cache: dir.join(text_cache_name(&stem)),
        span_secs: None,
    })
}

/// Every clip musubi-tuner cuts from a video (file or folder of frames), decoded once, thinned to 16 fps when
/// the dataset has `source_fps`, and resized to the bucket of the first frame's size (sides in `step`-pixel
/// steps, as for [`image_sample`]). Non-video datasets give no clips.
pub fn video_samples(
    ds: &ResolvedDataset,
    tools: Option<&MediaTools>,
    media: &Path,
    step: u32,
) -> Result<Vec<Sample>, VideoProbeError> {
    video_samples_at(ds, tools, media, step, WAN_TARGET_FPS)
}

/// [`video_samples`] for a family whose clips are thinned to `target_fps` when the dataset has `source_fps`
/// (musubi-tuner's `TARGET_FPS_*` of the architecture).
pub fn video_samples_at(
    ds: &ResolvedDataset,
    tools: Option<&MediaTools>,
    media: &Path,
    step: u32,
    target_fps: f64,
) -> Result<Vec<Sample>, VideoProbeError> {
    let Some(params) = &ds.video else {
        return Ok(Vec::new());
    };
    let info = probe_video(tools, media)?;
    let source_frames = info.frame_count.unwrap_or(0) as usize;
    let clips = select_frames(source_frames, params, target_fps);
    let Some(needed) = clips
        .iter()
        .flat_map(|c| c.source_indices.iter())
        .max()
        .map(|m| m + 1)
    else {
        return Ok(Vec::new());
    };
    let decoded = decode_video(tools, media, Some(needed))?;
    let original_size = decoded
        .first()
        .map_or((info.width, info.height), RgbImage::dimensions);
    let bucket = BucketSelector::for_latent_caching(ds)
        .with_step(step)
        .bucket_for(original_size);
    let stem = media_stem(media);
    let dir = cache_dir(ds, media);
    let mut resized: Vec<Option<RgbImage>> = vec![None; decoded.len()];
    let mut samples = Vec::with_capacity(clips.len());
    for clip in clips {
        // The probe's count can exceed what decodes; a clip reaching past the end is dropped, not padded.
        if clip.source_indices.iter().any(|&i| i >= decoded.len()) {
            continue;
        }
        let frames = clip
            .source_indices
            .iter()
            .map(|&i| {
                resized[i]
                    .get_or_insert_with(|| resize_to_bucket(&decoded[i], bucket))
                    .clone()
            })
            .collect();
        samples.push(Sample {
            media: media.to_path_buf(),
            window: Some(clip.window),
            original_size,
            bucket,
            frames,
            latent_cache: dir.join(video_latent_cache_name(&stem, clip.window, original_size)),
            text_cache: dir.join(text_cache_name(&stem)),
            span_secs: clip_span(&clip.source_indices, info.fps),
        });
    }
    Ok(samples)
}

/// The start and length in seconds of a clip made of `source_indices` of a video at `fps`: from its first frame's
/// time to the end of its last frame.
fn clip_span(source_indices: &[usize], fps: Option<f64>) -> Option<(f64, f64)> {
    let fps = fps.filter(|f| *f > 0.0)?;
    let (first, last) = (source_indices.first()?, source_indices.last()?);
    Some((*first as f64 / fps, (last + 1 - first) as f64 / fps))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::bucket::WAN_BUCKET_STEP;
    use crate::config::DatasetConfig;

    #[test]
    fn a_clip_spans_its_source_frames() {
        assert_eq!(
            clip_span(&[24, 25, 26, 27], Some(24.0)),
            Some((1.0, 4.0 / 24.0))
        );
        // Thinned from 30 to 24 fps: the span covers the source frames skipped in between.
        assert_eq!(clip_span(&[0, 1, 2, 3, 5], Some(30.0)), Some((0.0, 0.2)));
        assert_eq!(clip_span(&[0, 1], None), None);
        assert_eq!(clip_span(&[], Some(24.0)), None);
    }

    #[test]
    fn folder_of_frames_gives_named_resized_clips() {
        let dir = tempfile::tempdir().unwrap();
        let frames = dir.path().join("walk");
        std::fs::create_dir(&frames).unwrap();
        for i in 0..12u8 {
            RgbImage::from_pixel(40, 30, image::Rgb([i * 20, 0, 0]))
                .save(frames.join(format!("{i:03}.png")))
                .unwrap();
        }
        let toml = "[[datasets]]\nvideo_jsonl_file = \"m.jsonl\"\ncache_directory = \"cache\"\n\
                    resolution = [32, 32]\ntarget_frames = [5]\nframe_extraction = \"chunk\"\n";
        let parsed = DatasetConfig::parse(toml, Path::new("/x/d.toml")).unwrap();
        let ds = &parsed.config.resolve(dir.path())[0];
        let samples = video_samples(ds, None, &frames, WAN_BUCKET_STEP).unwrap();
        // 12 frames → chunks at 0 and 5 (10..15 does not fit).
        assert_eq!(samples.len(), 2);
        let s = &samples[1];
        assert_eq!(
            s.window,
            Some(FrameWindow {
                start: 5,
                frames: 5
            })
        );
        assert_eq!(s.original_size, (40, 30));
        assert_eq!(s.frames.len(), 5);
        assert!(s.frames.iter().all(|f| f.dimensions() == s.bucket));
        // Frame 5 of the folder is red 100.
        assert_eq!(s.frames[0].get_pixel(0, 0).0[0], 100);
        let cache = dir.path().join("cache");
        assert_eq!(
            s.latent_cache,
            cache.join("walk_00005-005_0040x0030_wan.safetensors")
        );
        assert_eq!(s.text_cache, cache.join("walk_wan_te.safetensors"));
    }

    #[test]
    fn image_sample_uses_dataset_buckets() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("photo.png");
        RgbImage::from_pixel(300, 200, image::Rgb([1, 2, 3]))
            .save(&path)
            .unwrap();
        let toml = "[[datasets]]\nimage_directory = \".\"\ncaption_extension = \".txt\"\nresolution = 256\n\
                    enable_bucket = true\nbucket_no_upscale = true\n";
        let parsed = DatasetConfig::parse(toml, Path::new("/x/d.toml")).unwrap();
        let ds = &parsed.config.resolve(dir.path())[0];
        let s = image_sample(ds, &path, WAN_BUCKET_STEP).unwrap();
        // 300x200 is under 256x256 in area, so no upscaling: kept at 288x192 (16-pixel multiples).
        assert_eq!(s.bucket, (288, 192));
        assert_eq!(s.frames[0].dimensions(), (288, 192));
        assert_eq!(
            s.latent_cache,
            dir.path().join("photo_0300x0200_wan.safetensors")
        );
    }
}
