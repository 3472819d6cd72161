//! Video probing and decoding through Media Foundation, the decoder built into Windows, so that reading mp4/mov
//! datasets needs nothing installed there. `media::MediaTools` uses it on Windows when ffmpeg is not found. The
//! COM calls are Windows-only; the frame-layout and codec-name helpers are plain code, tested on every platform.

use image::RgbImage;

/// Name of this decoder in messages (where ffmpeg's messages say `ffmpeg`).
pub const TOOL: &str = "Media Foundation";

/// How a decoded BGRA frame sits in its buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameLayout {
    /// Decoded width in pixels (may exceed the picture's, e.g. 1088 coded rows for 1080).
    pub width: u32,
    /// Decoded height in pixels.
    pub height: u32,
    /// Bytes from one row to the next; negative for a bottom-up image.
    pub pitch: i64,
}

impl FrameLayout {
    /// Bytes the frame spans in memory, from its lowest-addressed row to the end of its highest one.
    pub fn span_bytes(&self) -> Option<usize> {
        let row = usize::try_from(self.width).ok()?.checked_mul(4)?;
        if self.pitch.unsigned_abs() < row as u64 || self.height == 0 {
            return None;
        }
        let rows = usize::try_from(self.height - 1).ok()?;
        usize::try_from(self.pitch.unsigned_abs())
            .ok()?
            .checked_mul(rows)?
            .checked_add(row)
    }
}

/// Copies the top-left `width`×`height` pixels of a BGRA frame into an RGB image. `bytes` starts at the frame's
/// lowest-addressed row (the last row of a bottom-up frame). `None` when the frame is smaller than asked or the
/// buffer shorter than the layout says.
pub fn bgra_to_rgb(bytes: &[u8], layout: FrameLayout, width: u32, height: u32) -> Option<RgbImage> {
    if width > layout.width || height > layout.height || bytes.len() < layout.span_bytes()? {
        return None;
    }
    let pitch = usize::try_from(layout.pitch.unsigned_abs()).ok()?;
    let mut rgb = Vec::with_capacity(width as usize * height as usize * 3);
    for y in 0..height as usize {
        let memory_row = if layout.pitch >= 0 {
            y
        } else {
            layout.height as usize - 1 - y
        };
        let start = memory_row * pitch;
        let row = bytes.get(start..start + width as usize * 4)?;
        for bgra in row.chunks_exact(4) {
            rgb.extend_from_slice(&[bgra[2], bgra[1], bgra[0]]);
        }
    }
    RgbImage::from_raw(width, height, rgb)
}

/// The pixel formats asked of Media Foundation, in this order: 32-bit BGRA from its own colour conversion (what
/// Windows gives), else a decoder's YUV 4:2:0, converted here (Wine's reader has no colour conversion).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PixelFormat {
    /// 32-bit BGRA (`MFVideoFormat_RGB32`).
    Bgra,
    /// Planar Y, U, V (`MFVideoFormat_I420`).
    I420,
    /// Planar Y then interleaved U/V (`MFVideoFormat_NV12`).
    Nv12,
}

/// Converts the top-left `width`×`height` pixels of a YUV 4:2:0 frame to RGB with the BT.601 limited-range
/// matrix (ffmpeg's default). `layout.pitch` is the luma row pitch (top-down); the chroma planes follow
/// `layout.height` luma rows. `None` for a BGRA format, a frame smaller than asked or a buffer too short.
pub fn yuv420_to_rgb(
    bytes: &[u8],
    format: PixelFormat,
    layout: FrameLayout,
    width: u32,
    height: u32,
) -> Option<RgbImage> {
    if layout.pitch < i64::from(layout.width) || width > layout.width || height > layout.height {
        return None;
    }
    let pitch = usize::try_from(layout.pitch).ok()?;
    let rows = layout.height as usize;
    let luma = pitch.checked_mul(rows)?;
    let chroma_rows = rows.div_ceil(2);
    // (offset of U, offset of V, chroma row pitch, bytes from one U sample to the next)
    let (u_at, v_at, chroma_pitch, step) = match format {
        PixelFormat::Bgra => return None,
        PixelFormat::I420 => {
            let half = pitch.div_ceil(2);
            (luma, luma + half * chroma_rows, half, 1)
        }
        PixelFormat::Nv12 => (luma, luma + 1, pitch, 2),
    };
    let mut rgb = Vec::with_capacity(width as usize * height as usize * 3);
    for y in 0..height as usize {
        let chroma_row = (y / 2) * chroma_pitch;
        for x in 0..width as usize {
            let chroma = chroma_row + (x / 2) * step;
            let (luma_value, u, v) = (
                *bytes.get(y * pitch + x)?,
                *bytes.get(u_at + chroma)?,
                *bytes.get(v_at + chroma)?,
            );
            rgb.extend_from_slice(&bt601(luma_value, u, v));
        }
    }
    RgbImage::from_raw(width, height, rgb)
}

/// One BT.601 limited-range YUV sample as RGB, in the usual 8-bit fixed point.
fn bt601(y: u8, u: u8, v: u8) -> [u8; 3] {
    let c = 298 * (i32::from(y) - 16);
    let (d, e) = (i32::from(u) - 128, i32::from(v) - 128);
    let clip = |x: i32| ((x + 128) >> 8).clamp(0, 255) as u8;
    [
        clip(c + 409 * e),
        clip(c - 100 * d - 208 * e),
        clip(c + 516 * d),
    ]
}

/// ffmpeg's name for a Media Foundation video subtype, given the subtype's FourCC (the first field of its GUID).
pub fn codec_name(fourcc: u32) -> String {
    let code: String = fourcc
        .to_le_bytes()
        .iter()
        .map(|&b| b as char)
        .collect::<String>()
        .to_ascii_uppercase();
    match code.as_str() {
        "H264" | "AVC1" => "h264".into(),
        "HEVC" | "HVC1" | "H265" => "hevc".into(),
        "MP4V" | "M4S2" | "MP4S" => "mpeg4".into(),
        "VP80" => "vp8".into(),
        "VP90" => "vp9".into(),
        "AV01" => "av1".into(),
        "MJPG" => "mjpeg".into(),
        "WMV3" => "wmv3".into(),
        "WVC1" => "vc1".into(),
        _ if code.chars().all(|c| c.is_ascii_alphanumeric()) => code.to_ascii_lowercase(),
        _ => format!("0x{fourcc:08x}"),
    }
}

/// The two 32-bit halves of a Media Foundation packed attribute (frame size: width, height; rate: num, den).
pub fn split_u64(packed: u64) -> (u32, u32) {
    ((packed >> 32) as u32, packed as u32)
}

#[cfg(windows)]
mod com;
#[cfg(windows)]
pub use com::{decode, probe};
#[cfg(test)]
mod tests;
