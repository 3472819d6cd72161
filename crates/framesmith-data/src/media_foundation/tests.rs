//! Tests of the frame layouts and codec names (every platform) and of reading a real clip (Windows).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

/// A 3×2 BGRA frame with 4 padding bytes per row; pixel (x, y) has blue x, green y, red 9.
fn padded_frame(bottom_up: bool) -> (Vec<u8>, FrameLayout) {
    let (w, h, pitch) = (3u32, 2u32, 16usize);
    let mut bytes = vec![0xEE; pitch * h as usize];
    for y in 0..h {
        let memory_row = if bottom_up { h - 1 - y } else { y } as usize;
        for x in 0..w {
            let at = memory_row * pitch + x as usize * 4;
            bytes[at..at + 4].copy_from_slice(&[x as u8, y as u8, 9, 255]);
        }
    }
    let pitch = if bottom_up { -16 } else { 16 };
    (
        bytes,
        FrameLayout {
            width: w,
            height: h,
            pitch,
        },
    )
}

#[test]
fn top_down_and_bottom_up_frames_read_the_same() {
    for bottom_up in [false, true] {
        let (bytes, layout) = padded_frame(bottom_up);
        let rgb = bgra_to_rgb(&bytes, layout, 3, 2).unwrap();
        for (x, y, px) in rgb.enumerate_pixels() {
            assert_eq!(
                px.0,
                [9, y as u8, x as u8],
                "bottom_up={bottom_up} at ({x}, {y})"
            );
        }
    }
}

#[test]
fn frames_are_cropped_to_the_picture_and_short_buffers_refused() {
    let (bytes, layout) = padded_frame(false);
    let cropped = bgra_to_rgb(&bytes, layout, 2, 1).unwrap();
    assert_eq!(cropped.dimensions(), (2, 1));
    assert_eq!(cropped.get_pixel(1, 0).0, [9, 0, 1]);
    assert!(
        bgra_to_rgb(&bytes, layout, 4, 2).is_none(),
        "wider than decoded"
    );
    assert!(
        bgra_to_rgb(&bytes[..20], layout, 3, 2).is_none(),
        "buffer too short"
    );
    let narrow = FrameLayout { pitch: 8, ..layout };
    assert!(bgra_to_rgb(&bytes, narrow, 3, 2).is_none(), "rows overlap");
}

#[test]
fn span_covers_every_row() {
    let layout = FrameLayout {
        width: 3,
        height: 2,
        pitch: -16,
    };
    assert_eq!(layout.span_bytes(), Some(16 + 12));
}

/// Media Foundation reads back a clip from our own H.264 encoder, at a path with a space and a non-ASCII
/// letter: the picture size (40 rows, coded as 48 and cropped), the frame count, and pixels close to the
/// originals, the right way up and with red and blue in place (each gradient runs along its own axis).
#[cfg(windows)]
#[test]
fn media_foundation_reads_back_our_clip() {
    use crate::media::MediaTools;
    use crate::video::encode::{write_mp4, RgbFrame};
    let (w, h, n) = (64usize, 40usize, 6usize);
    let frames: Vec<RgbFrame> = (0..n)
        .map(|t| RgbFrame {
            width: w,
            height: h,
            data: (0..w * h)
                .flat_map(|i| {
                    let (x, y) = (i % w, i / w);
                    [(x * 4) as u8, (255 - y * 6) as u8, (t * 40) as u8]
                })
                .collect(),
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("clip ü.mp4");
    write_mp4(&path, &frames, 16.0).unwrap();
    let tools = MediaTools::media_foundation();
    let info = tools.probe(&path).unwrap();
    assert_eq!((info.width, info.height, info.frame_count), (64, 40, 6));
    // Windows names the stream's codec (h264); Wine's reader decodes inside its media source and reports the
    // decoded format (i420) as the native one, so only "something" is required here.
    assert!(!info.codec.is_empty());
    let decoded = tools.decode(&path, &info, None).unwrap();
    assert_eq!(decoded.len(), n);
    for (t, (image, original)) in decoded.iter().zip(&frames).enumerate() {
        let error: f64 = image
            .as_raw()
            .iter()
            .zip(&original.data)
            .map(|(&a, &b)| (f64::from(a) - f64::from(b)).abs())
            .sum::<f64>()
            / original.data.len() as f64;
        assert!(error < 12.0, "frame {t}: mean absolute error {error:.1}");
    }
    assert_eq!(tools.decode(&path, &info, Some(2)).unwrap().len(), 2);
}

/// A 3×2 picture in a 4-wide, 2-row frame: white, black and red pixels, one chroma sample per 2×2 block.
fn yuv_frame(format: PixelFormat) -> (Vec<u8>, FrameLayout) {
    let layout = FrameLayout {
        width: 4,
        height: 2,
        pitch: 4,
    };
    // Luma: white, white, red, red / white, black, red, red. Chroma: neutral block, red block.
    let luma = [235, 235, 81, 81, 235, 16, 81, 81];
    let (u, v) = ([128u8, 90], [128u8, 240]);
    let mut bytes = luma.to_vec();
    match format {
        PixelFormat::I420 => bytes.extend(u.iter().chain(&v)),
        _ => bytes.extend([u[0], v[0], u[1], v[1]]),
    }
    (bytes, layout)
}

#[test]
fn yuv_frames_convert_with_bt601() {
    for format in [PixelFormat::I420, PixelFormat::Nv12] {
        let (bytes, layout) = yuv_frame(format);
        let rgb = yuv420_to_rgb(&bytes, format, layout, 3, 2).unwrap();
        assert_eq!(rgb.dimensions(), (3, 2));
        assert_eq!(rgb.get_pixel(0, 0).0, [255, 255, 255], "{format:?}");
        assert_eq!(rgb.get_pixel(1, 1).0, [0, 0, 0], "{format:?}");
        let red = rgb.get_pixel(2, 0).0;
        assert!(
            red[0] > 240 && red[1] < 10 && red[2] < 10,
            "{format:?}: {red:?}"
        );
        assert!(yuv420_to_rgb(&bytes[..9], format, layout, 3, 2).is_none());
        assert!(yuv420_to_rgb(&bytes, format, layout, 5, 2).is_none());
    }
    let (bytes, layout) = yuv_frame(PixelFormat::I420);
    assert!(yuv420_to_rgb(&bytes, PixelFormat::Bgra, layout, 3, 2).is_none());
}

#[test]
fn codec_names_follow_ffmpeg() {
    let fourcc = |s: &[u8; 4]| u32::from_le_bytes(*s);
    assert_eq!(codec_name(fourcc(b"H264")), "h264");
    assert_eq!(codec_name(fourcc(b"HEVC")), "hevc");
    assert_eq!(codec_name(fourcc(b"MP4V")), "mpeg4");
    assert_eq!(codec_name(fourcc(b"XYZ1")), "xyz1");
    assert_eq!(codec_name(0x16), "0x00000016");
    assert_eq!(split_u64((1920u64 << 32) | 1080), (1920, 1080));
}
