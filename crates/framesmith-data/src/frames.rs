//! Which frames of a video become training clips, computed exactly as musubi-tuner does: frame dropping from
//! `source_fps` to 16 fps, then head / chunk / slide / uniform / full windows over the kept frames.

use super::config::{round_down_to_4n1, FrameExtraction, VideoParams};

/// Wan's training frame rate: videos with `source_fps` are thinned to this.
pub const WAN_TARGET_FPS: f64 = 16.0;

/// One clip: `frames` consecutive kept frames from `start` (an index into the kept frames, which is what
/// musubi-tuner writes in cache names as `{start:05}-{frames:03}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FrameWindow {
    /// First kept frame of the clip.
    pub start: u32,
    /// Clip length.
    pub frames: u32,
}

/// A clip with the indices of the source video's frames (as decoded, from 0) that make it up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameSelection {
    /// Position among the kept frames.
    pub window: FrameWindow,
    /// Source frame indices, one per clip frame.
    pub source_indices: Vec<usize>,
}

/// The source frames musubi-tuner's `load_video` keeps, in order.
///
/// Without `source_fps` every frame in `[start, end)` is kept. With it, frame `i` gets the target index
/// `floor(i * target_fps / source_fps)` (accumulated in f64 as musubi-tuner does), frames repeating the previous
/// target index are dropped, and `start` / `end` bound the target index.
pub fn kept_source_frames(
    source_frame_count: usize,
    source_fps: Option<f64>,
    target_fps: f64,
    start: Option<usize>,
    end: Option<usize>,
) -> Vec<usize> {
    let Some(source_fps) = source_fps.filter(|f| f.is_finite() && *f > 0.0) else {
        let first = start.unwrap_or(0).min(source_frame_count);
        let last = end
            .map_or(source_frame_count, |e| e.min(source_frame_count))
            .max(first);
        return (first..last).collect();
    };
    let delta = target_fps / source_fps;
    let mut with_fraction = 0.0f64;
    let mut previous: Option<usize> = None;
    let mut kept = Vec::new();
    for i in 0..source_frame_count {
        // Python's int() of a non-negative float truncates, as `as usize` does.
        let target = with_fraction as usize;
        with_fraction += delta;
        if previous == Some(target) {
            continue;
        }
        previous = Some(target);
        if start.is_some_and(|s| target < s) {
            continue;
        }
        if end.is_some_and(|e| target >= e) {
            break;
        }
        kept.push(i);
    }
    kept
}

/// The clips musubi-tuner cuts from a video of `frame_count` (kept) frames, in its order: for each target length
/// (ascending), each window position. `uniform` may repeat a window, as in musubi-tuner.
pub fn extraction_windows(frame_count: usize, params: &VideoParams) -> Vec<FrameWindow> {
    let n = frame_count;
    let window = |start: usize, frames: usize| FrameWindow {
        start: u32::try_from(start).unwrap_or(u32::MAX),
        frames: u32::try_from(frames).unwrap_or(u32::MAX),
    };
    let targets = params
        .target_frames
        .iter()
        .map(|&t| t as usize)
        .filter(|&t| t > 0);
    let mut out = Vec::new();
    match params.frame_extraction {
        FrameExtraction::Head => out.extend(targets.filter(|&t| n >= t).map(|t| window(0, t))),
        FrameExtraction::Chunk => {
            for t in targets {
                out.extend(
                    (0..n)
                        .step_by(t)
                        .filter(|i| i + t <= n)
                        .map(|i| window(i, t)),
                );
            }
        }
        FrameExtraction::Slide => {
            let stride = (params.frame_stride as usize).max(1);
            for t in targets.filter(|&t| n >= t) {
                out.extend((0..=n - t).step_by(stride).map(|i| window(i, t)));
            }
        }
        FrameExtraction::Uniform => {
            for t in targets.filter(|&t| n >= t) {
                out.extend(
                    linspace_floor(n - t, params.frame_sample as usize)
                        .into_iter()
                        .map(|i| window(i, t)),
                );
            }
        }
        FrameExtraction::Full => {
            let t = round_down_to_4n1(
                u32::try_from(n.min(params.max_frames as usize)).unwrap_or(u32::MAX),
            );
            if t > 0 {
                out.push(window(0, t as usize));
            }
        }
    }
    out
}

/// `numpy.linspace(0, stop, num, dtype=int)`: `num` evenly spaced values from 0 to `stop` inclusive, computed as
/// `i * (stop / (num - 1))` in f64 and rounded down, with the last value exactly `stop`.
pub fn linspace_floor(stop: usize, num: usize) -> Vec<usize> {
    match num {
        0 => Vec::new(),
        1 => vec![0],
        _ => {
            let step = stop as f64 / (num - 1) as f64;
            (0..num)
                .map(|i| {
                    if i == num - 1 {
                        stop
                    } else {
                        (i as f64 * step).floor() as usize
                    }
                })
                .collect()
        }
    }
}

/// The last kept-frame index (exclusive) musubi-tuner decodes up to: only `head` stops early, at the longest
/// target length.
pub fn decode_end(params: &VideoParams) -> Option<usize> {
    (params.frame_extraction == FrameExtraction::Head)
        .then(|| params.target_frames.iter().max().map(|&m| m as usize))
        .flatten()
}

/// Every clip of a video with `source_frame_count` decoded frames, with its source frame indices.
pub fn select_frames(
    source_frame_count: usize,
    params: &VideoParams,
    target_fps: f64,
) -> Vec<FrameSelection> {
    let start = decode_end(params).map(|_| 0);
    let kept = kept_source_frames(
        source_frame_count,
        params.source_fps,
        target_fps,
        start,
        decode_end(params),
    );
    extraction_windows(kept.len(), params)
        .into_iter()
        .map(|window| {
            let from = window.start as usize;
            let to = from + window.frames as usize;
            FrameSelection {
                window,
                source_indices: kept
                    .get(from..to)
                    .map(<[usize]>::to_vec)
                    .unwrap_or_default(),
            }
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn params(extraction: FrameExtraction, targets: &[u32]) -> VideoParams {
        VideoParams {
            target_frames: targets.to_vec(),
            frame_extraction: extraction,
            frame_stride: 1,
            frame_sample: 1,
            max_frames: 129,
            source_fps: None,
        }
    }

    fn pairs(w: &[FrameWindow]) -> Vec<(u32, u32)> {
        w.iter().map(|w| (w.start, w.frames)).collect()
    }

    // The 40-frame examples of musubi-tuner's dataset_config.md, checked against its code.
    #[test]
    fn head_on_40_frames() {
        let w = extraction_windows(40, &params(FrameExtraction::Head, &[1, 13, 25]));
        assert_eq!(pairs(&w), vec![(0, 1), (0, 13), (0, 25)]);
        // A target longer than the video is skipped.
        let w = extraction_windows(20, &params(FrameExtraction::Head, &[1, 13, 25]));
        assert_eq!(pairs(&w), vec![(0, 1), (0, 13)]);
    }

    #[test]
    fn chunk_on_40_frames() {
        let w = extraction_windows(40, &params(FrameExtraction::Chunk, &[13, 25]));
        assert_eq!(pairs(&w), vec![(0, 13), (13, 13), (26, 13), (0, 25)]);
    }

    #[test]
    fn slide_on_40_frames_stride_10() {
        let mut p = params(FrameExtraction::Slide, &[1, 13, 25]);
        p.frame_stride = 10;
        let w = extraction_windows(40, &p);
        assert_eq!(
            pairs(&w),
            vec![
                (0, 1),
                (10, 1),
                (20, 1),
                (30, 1),
                (0, 13),
                (10, 13),
                (20, 13),
                (0, 25),
                (10, 25)
            ]
        );
    }

    #[test]
    fn uniform_on_40_frames_4_samples() {
        let mut p = params(FrameExtraction::Uniform, &[1, 13, 25]);
        p.frame_sample = 4;
        let w = extraction_windows(40, &p);
        // np.linspace(0, 39, 4, dtype=int) = [0, 13, 26, 39]; (0, 27) → [0, 9, 18, 27]; (0, 15) → [0, 5, 10, 15].
        assert_eq!(
            pairs(&w),
            vec![
                (0, 1),
                (13, 1),
                (26, 1),
                (39, 1),
                (0, 13),
                (9, 13),
                (18, 13),
                (27, 13),
                (0, 25),
                (5, 25),
                (10, 25),
                (15, 25)
            ]
        );
    }

    #[test]
    fn linspace_matches_numpy() {
        // np.linspace(0, 10, 4, dtype=int) = [0, 3, 6, 10]; (0, 2, 5) = [0, 0, 1, 1, 2]; (0, 7, 1) = [0].
        assert_eq!(linspace_floor(10, 4), vec![0, 3, 6, 10]);
        assert_eq!(linspace_floor(2, 5), vec![0, 0, 1, 1, 2]);
        assert_eq!(linspace_floor(7, 1), vec![0]);
        assert_eq!(linspace_floor(0, 3), vec![0, 0, 0]);
        assert!(linspace_floor(5, 0).is_empty());
    }

    #[test]
    fn full_trims_to_4n1_and_max_frames() {
        // dataset_config.md: videos of 20, 25, 35 frames with max_frames = 31.
        let mut p = params(FrameExtraction::Full, &[1]);
        p.max_frames = 31;
        assert_eq!(pairs(&extraction_windows(20, &p)), vec![(0, 17)]);
        assert_eq!(pairs(&extraction_windows(25, &p)), vec![(0, 25)]);
        // min(35, 31) = 31, rounded down to N*4+1 = 29 (the doc's drawing says 31, its code gives 29).
        assert_eq!(pairs(&extraction_windows(35, &p)), vec![(0, 29)]);
        assert!(extraction_windows(0, &p).is_empty());
    }

    #[test]
    fn fps_30_to_16_drops_frames_like_musubi() {
        // Target index of frame i = int(sum of 16/30), frames repeating an index dropped. Frame 15 lands on
        // 7.999999... after f64 accumulation (not 8), repeats frame 14's index and is dropped, as in musubi-tuner.
        let kept = kept_source_frames(16, Some(30.0), WAN_TARGET_FPS, None, None);
        assert_eq!(kept, vec![0, 2, 4, 6, 8, 10, 12, 14]);
        let kept = kept_source_frames(12, Some(60.0), WAN_TARGET_FPS, None, None);
        assert_eq!(kept, vec![0, 4, 8]);
        // Slower source than target: no frame is dropped, but target indices jump, so `end` counts them.
        let kept = kept_source_frames(20, Some(8.0), WAN_TARGET_FPS, Some(0), Some(5));
        assert_eq!(kept, vec![0, 1, 2]);
    }

    #[test]
    fn without_fps_start_and_end_bound_the_frames() {
        assert_eq!(
            kept_source_frames(10, None, WAN_TARGET_FPS, Some(0), Some(4)),
            vec![0, 1, 2, 3]
        );
        assert_eq!(
            kept_source_frames(3, None, WAN_TARGET_FPS, Some(0), Some(9)),
            vec![0, 1, 2]
        );
        assert_eq!(
            kept_source_frames(3, None, WAN_TARGET_FPS, None, None),
            vec![0, 1, 2]
        );
    }

    #[test]
    fn select_frames_maps_windows_to_source_indices() {
        let mut p = params(FrameExtraction::Chunk, &[5]);
        p.source_fps = Some(30.0);
        let sel = select_frames(24, &p, WAN_TARGET_FPS);
        // 24 frames at 30 fps keep 13 frames: 0,2,4,6,8,10,12,14,16,17,19,21,23; two chunks of 5.
        assert_eq!(sel.len(), 2);
        assert_eq!(sel[0].source_indices, vec![0, 2, 4, 6, 8]);
        assert_eq!(
            sel[1].window,
            FrameWindow {
                start: 5,
                frames: 5
            }
        );
        assert_eq!(sel[1].source_indices, vec![10, 12, 14, 16, 17]);
        // Head stops decoding at the longest target.
        let p = params(FrameExtraction::Head, &[1, 5]);
        assert_eq!(decode_end(&p), Some(5));
        let sel = select_frames(100, &p, WAN_TARGET_FPS);
        assert_eq!(sel[1].source_indices, vec![0, 1, 2, 3, 4]);
    }
}
