//! Windows only: the Media Foundation calls behind [`super::probe`] and [`super::decode`].

// Media Foundation is a COM API and every call through the `windows` crate is `unsafe`. This module holds
// those calls: owned interface pointers released by drop, and one read of a locked frame buffer checked
// against the length Media Foundation reports.
#![allow(unsafe_code)]

use std::os::windows::ffi::OsStrExt;
use std::path::Path;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use std::ffi::c_void;
use std::sync::OnceLock;

use image::RgbImage;
use windows::core::{s, w, Interface, HRESULT, PCSTR, PCWSTR};
use windows::Win32::Foundation::HMODULE;
use windows::Win32::Media::MediaFoundation::{
    IMF2DBuffer, IMFAttributes, IMFMediaBuffer, IMFMediaType, IMFSample, IMFSourceReader,
    MFMediaType_Video, MFVideoFormat_I420, MFVideoFormat_NV12, MFVideoFormat_RGB32,
    MFSTARTUP_NOSOCKET, MF_MT_DEFAULT_STRIDE, MF_MT_FRAME_RATE, MF_MT_FRAME_SIZE, MF_MT_MAJOR_TYPE,
    MF_MT_SUBTYPE, MF_SOURCE_READERF_CURRENTMEDIATYPECHANGED, MF_SOURCE_READERF_ENDOFSTREAM,
    MF_SOURCE_READERF_ERROR, MF_SOURCE_READER_ALL_STREAMS,
    MF_SOURCE_READER_ENABLE_VIDEO_PROCESSING, MF_SOURCE_READER_FIRST_VIDEO_STREAM, MF_VERSION,
};
use windows::Win32::System::Com::{CoInitializeEx, CoUninitialize, COINIT_MULTITHREADED};
use windows::Win32::System::LibraryLoader::{
    GetProcAddress, LoadLibraryExW, LOAD_LIBRARY_SEARCH_SYSTEM32,
};

use super::{bgra_to_rgb, codec_name, split_u64, yuv420_to_rgb, FrameLayout, PixelFormat, TOOL};
use crate::media::{MediaError, VideoInfo};

const VIDEO: u32 = MF_SOURCE_READER_FIRST_VIDEO_STREAM.0 as u32;

/// The flat Media Foundation functions, looked up when the first video is read. Importing them would stop
/// framesmith.exe from starting at all on Windows "N" editions, which have no Media Foundation until the
/// Media Feature Pack is installed; this way only reading videos fails there, with a message.
struct Api {
    startup: Startup,
    shutdown: Shutdown,
    create_attributes: CreateAttributes,
    create_media_type: CreateMediaType,
    create_source_reader_from_url: CreateSourceReaderFromUrl,
}

type Farproc = unsafe extern "system" fn() -> isize;
type Startup = unsafe extern "system" fn(u32, u32) -> HRESULT;
type Shutdown = unsafe extern "system" fn() -> HRESULT;
type CreateAttributes = unsafe extern "system" fn(*mut *mut c_void, u32) -> HRESULT;
type CreateMediaType = unsafe extern "system" fn(*mut *mut c_void) -> HRESULT;
type CreateSourceReaderFromUrl =
    unsafe extern "system" fn(PCWSTR, *mut c_void, *mut *mut c_void) -> HRESULT;

const NOT_AVAILABLE: &str =
    "Media Foundation is not available (Windows N editions need the Media Feature Pack)";

fn api() -> Result<&'static Api, String> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(load_api).as_ref().map_err(Clone::clone)
}

fn load_api() -> Result<Api, String> {
    // SAFETY: system DLLs from System32 only; the modules stay loaded for the life of the process, so the
    // function pointers taken from them stay valid.
    let (mfplat, mfreadwrite) = unsafe {
        let load = |name| LoadLibraryExW(name, None, LOAD_LIBRARY_SEARCH_SYSTEM32);
        (
            load(w!("mfplat.dll"))
                .map_err(|e| format!("{NOT_AVAILABLE}: mfplat.dll: {}", e.message()))?,
            load(w!("mfreadwrite.dll"))
                .map_err(|e| format!("{NOT_AVAILABLE}: mfreadwrite.dll: {}", e.message()))?,
        )
    };
    let find = |module: HMODULE, name: PCSTR| {
        // SAFETY: `name` is a NUL-terminated literal and `module` a loaded module.
        unsafe { GetProcAddress(module, name) }.ok_or_else(|| {
            // SAFETY: as above, the literal is NUL-terminated ASCII.
            let name = unsafe { name.to_string() }.unwrap_or_default();
            format!("{NOT_AVAILABLE}: {name} is missing")
        })
    };
    // SAFETY: each pointer is the named export, whose documented signature the field's type spells out.
    unsafe {
        Ok(Api {
            startup: std::mem::transmute::<Farproc, Startup>(find(mfplat, s!("MFStartup"))?),
            shutdown: std::mem::transmute::<Farproc, Shutdown>(find(mfplat, s!("MFShutdown"))?),
            create_attributes: std::mem::transmute::<Farproc, CreateAttributes>(find(
                mfplat,
                s!("MFCreateAttributes"),
            )?),
            create_media_type: std::mem::transmute::<Farproc, CreateMediaType>(find(
                mfplat,
                s!("MFCreateMediaType"),
            )?),
            create_source_reader_from_url: std::mem::transmute::<Farproc, CreateSourceReaderFromUrl>(
                find(mfreadwrite, s!("MFCreateSourceReaderFromURL"))?,
            ),
        })
    }
}

/// Takes ownership of an interface pointer a successful call handed out.
fn owned<T: Interface>(hr: HRESULT, raw: *mut c_void) -> windows::core::Result<T> {
    hr.ok()?;
    if raw.is_null() {
        return Err(windows::core::Error::from_hresult(HRESULT(
            0x8000_4003u32 as i32,
        )));
    }
    // SAFETY: the call succeeded and returned one reference, which the interface now owns and releases.
    Ok(unsafe { T::from_raw(raw) })
}

/// Size, frame count (compressed samples, as ffprobe's `-count_packets`), frame rate and codec of a video's
/// first video stream.
pub fn probe(path: &Path, timeout: Duration) -> Result<VideoInfo, MediaError> {
    let owned = path.to_path_buf();
    on_own_thread(path, timeout, move || probe_now(&owned))
}

/// Decodes up to `max_frames` frames (all when `None`) as RGB, cropped to the probed picture size.
pub fn decode(
    path: &Path,
    info: &VideoInfo,
    max_frames: Option<usize>,
    timeout: Duration,
) -> Result<Vec<RgbImage>, MediaError> {
    let owned = path.to_path_buf();
    let (width, height) = (info.width, info.height);
    on_own_thread(path, timeout, move || {
        decode_now(&owned, width, height, max_frames)
    })
}

/// Runs `job` on a new thread with COM and Media Foundation started for it. Past `timeout` the file is
/// reported and the thread is left to finish alone: an in-process decoder cannot be killed as an ffmpeg
/// process can, but the caller is not held.
fn on_own_thread<T: Send + 'static>(
    path: &Path,
    timeout: Duration,
    job: impl FnOnce() -> Result<T, MediaError> + Send + 'static,
) -> Result<T, MediaError> {
    let (tx, rx) = mpsc::sync_channel(1);
    let owned = path.to_path_buf();
    thread::Builder::new()
        .name("media-foundation".into())
        .spawn(move || {
            // The receiver is gone only after a timeout, when the answer is no longer wanted.
            let _ = tx.send(in_session(&owned, job));
        })
        .map_err(|source| MediaError::Io {
            tool: TOOL.into(),
            path: path.to_path_buf(),
            source,
        })?;
    match rx.recv_timeout(timeout) {
        Ok(result) => result,
        Err(mpsc::RecvTimeoutError::Timeout) => Err(MediaError::Timeout {
            tool: TOOL.into(),
            secs: timeout.as_secs_f64().ceil() as u64,
            path: path.to_path_buf(),
        }),
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(unreadable(
            "the decoder stopped without an answer".into(),
            path,
        )),
    }
}

/// Starts COM (multithreaded) and Media Foundation for this thread, runs `job`, and shuts both down again.
/// `job` returns plain data, so every interface it used is released before the shutdown.
fn in_session<T>(
    path: &Path,
    job: impl FnOnce() -> Result<T, MediaError>,
) -> Result<T, MediaError> {
    let api = api().map_err(|message| unreadable(message, path))?;
    let com = unsafe { CoInitializeEx(None, COINIT_MULTITHREADED) };
    if let Err(e) = com.ok() {
        return Err(failed("cannot start COM", &e, path));
    }
    let result = match unsafe { (api.startup)(MF_VERSION, MFSTARTUP_NOSOCKET) }.ok() {
        Ok(()) => {
            let result = job();
            // Nothing useful can be done when shutting down fails; the frames are already read.
            let _ = unsafe { (api.shutdown)() };
            result
        }
        Err(e) => Err(failed(NOT_AVAILABLE, &e, path)),
    };
    unsafe { CoUninitialize() };
    result
}

fn probe_now(path: &Path) -> Result<VideoInfo, MediaError> {
    let reader = open(path, false)?;
    let native = unsafe { reader.GetNativeMediaType(VIDEO, 0) }
        .map_err(|e| failed("no video stream", &e, path))?;
    let (width, height) = unsafe { native.GetUINT64(&MF_MT_FRAME_SIZE) }
        .map(split_u64)
        .map_err(|e| failed("the video stream has no picture size", &e, path))?;
    if width == 0 || height == 0 {
        return Err(unreadable(
            "the video stream has no picture size".into(),
            path,
        ));
    }
    let fps = unsafe { native.GetUINT64(&MF_MT_FRAME_RATE) }
        .ok()
        .map(split_u64)
        .filter(|&(num, den)| num > 0 && den > 0)
        .map(|(num, den)| f64::from(num) / f64::from(den));
    let codec = unsafe { native.GetGUID(&MF_MT_SUBTYPE) }
        .map(|guid| codec_name(guid.data1))
        .unwrap_or_default();
    // With no output type set the reader hands out compressed samples: counting them decodes nothing.
    let mut frame_count = 0u32;
    loop {
        let read = read_sample(&reader, path)?;
        if read.sample.is_some() {
            frame_count = frame_count.saturating_add(1);
        }
        if read.end {
            break;
        }
    }
    if frame_count == 0 {
        return Err(unreadable("the video has no frames".into(), path));
    }
    Ok(VideoInfo {
        width,
        height,
        frame_count,
        fps,
        codec,
    })
}

fn decode_now(
    path: &Path,
    width: u32,
    height: u32,
    max_frames: Option<usize>,
) -> Result<Vec<RgbImage>, MediaError> {
    let reader = open(path, true)?;
    let api = api().map_err(|message| unreadable(message, path))?;
    let format = [
        (PixelFormat::Bgra, MFVideoFormat_RGB32),
        (PixelFormat::I420, MFVideoFormat_I420),
        (PixelFormat::Nv12, MFVideoFormat_NV12),
    ]
    .into_iter()
    .find(|(_, subtype)| set_output(&reader, api, subtype).is_ok())
    .map(|(format, _)| format)
    .ok_or_else(|| {
        unreadable(
            "no decoder gives RGB or YUV 4:2:0 frames for this video".into(),
            path,
        )
    })?;
    let mut layout = current_layout(&reader, format, path)?;
    let mut frames = Vec::new();
    while max_frames.is_none_or(|n| frames.len() < n) {
        let read = read_sample(&reader, path)?;
        if read.type_changed {
            layout = current_layout(&reader, format, path)?;
        }
        if let Some(sample) = read.sample {
            frames.push(frame_to_rgb(
                &sample,
                format,
                layout,
                (width, height),
                path,
            )?);
        }
        if read.end {
            break;
        }
    }
    if frames.is_empty() {
        return Err(unreadable("no frames were decoded".into(), path));
    }
    Ok(frames)
}

/// Asks the reader for frames of `subtype`.
fn set_output(
    reader: &IMFSourceReader,
    api: &Api,
    subtype: &windows::core::GUID,
) -> windows::core::Result<()> {
    let mut raw = std::ptr::null_mut();
    let wanted: IMFMediaType = owned(unsafe { (api.create_media_type)(&mut raw) }, raw)?;
    unsafe {
        wanted.SetGUID(&MF_MT_MAJOR_TYPE, &MFMediaType_Video)?;
        wanted.SetGUID(&MF_MT_SUBTYPE, subtype)?;
        reader.SetCurrentMediaType(VIDEO, None, &wanted)
    }
}

/// A source reader on the first video stream only; with `rgb`, allowed to convert the decoder's output.
fn open(path: &Path, rgb: bool) -> Result<IMFSourceReader, MediaError> {
    // The URL resolver wants an absolute path; UTF-16 keeps spaces and non-ASCII names intact.
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let wide: Vec<u16> = absolute
        .as_os_str()
        .encode_wide()
        .chain(std::iter::once(0))
        .collect();
    let api = api().map_err(|message| unreadable(message, path))?;
    let mut raw = std::ptr::null_mut();
    let attributes: IMFAttributes = owned(unsafe { (api.create_attributes)(&mut raw, 1) }, raw)
        .map_err(|e| failed("cannot make reader attributes", &e, path))?;
    if rgb {
        unsafe { attributes.SetUINT32(&MF_SOURCE_READER_ENABLE_VIDEO_PROCESSING, 1) }
            .map_err(|e| failed("cannot enable colour conversion", &e, path))?;
    }
    let mut raw = std::ptr::null_mut();
    let hr = unsafe {
        (api.create_source_reader_from_url)(PCWSTR(wide.as_ptr()), attributes.as_raw(), &mut raw)
    };
    let reader: IMFSourceReader =
        owned(hr, raw).map_err(|e| failed("cannot open the file", &e, path))?;
    unsafe {
        reader
            .SetStreamSelection(MF_SOURCE_READER_ALL_STREAMS.0 as u32, false)
            .and_then(|()| reader.SetStreamSelection(VIDEO, true))
    }
    .map_err(|e| failed("no video stream", &e, path))?;
    Ok(reader)
}

struct Read {
    sample: Option<IMFSample>,
    end: bool,
    type_changed: bool,
}

fn read_sample(reader: &IMFSourceReader, path: &Path) -> Result<Read, MediaError> {
    let mut flags = 0u32;
    let mut sample: Option<IMFSample> = None;
    unsafe { reader.ReadSample(VIDEO, 0, None, Some(&mut flags), None, Some(&mut sample)) }
        .map_err(|e| failed("cannot read a frame", &e, path))?;
    let flags = flags as i32;
    if flags & MF_SOURCE_READERF_ERROR.0 != 0 {
        return Err(unreadable("the stream reported an error".into(), path));
    }
    Ok(Read {
        sample,
        end: flags & MF_SOURCE_READERF_ENDOFSTREAM.0 != 0,
        type_changed: flags & MF_SOURCE_READERF_CURRENTMEDIATYPECHANGED.0 != 0,
    })
}

/// Size and (luma) row pitch of the frames the reader now gives. Without a stated stride, rows are packed
/// top-down (Media Foundation's default).
fn current_layout(
    reader: &IMFSourceReader,
    format: PixelFormat,
    path: &Path,
) -> Result<FrameLayout, MediaError> {
    let current = unsafe { reader.GetCurrentMediaType(VIDEO) }
        .map_err(|e| failed("no output format", &e, path))?;
    let (width, height) = unsafe { current.GetUINT64(&MF_MT_FRAME_SIZE) }
        .map(split_u64)
        .map_err(|e| failed("the decoded frames have no size", &e, path))?;
    let pitch = unsafe { current.GetUINT32(&MF_MT_DEFAULT_STRIDE) }
        .map(|s| i64::from(s as i32))
        .unwrap_or(i64::from(width) * if format == PixelFormat::Bgra { 4 } else { 1 });
    Ok(FrameLayout {
        width,
        height,
        pitch,
    })
}

fn frame_to_rgb(
    sample: &IMFSample,
    format: PixelFormat,
    layout: FrameLayout,
    (width, height): (u32, u32),
    path: &Path,
) -> Result<RgbImage, MediaError> {
    let buffer = unsafe { sample.ConvertToContiguousBuffer() }
        .map_err(|e| failed("cannot read a frame buffer", &e, path))?;
    let image = match (format, buffer.cast::<IMF2DBuffer>()) {
        (PixelFormat::Bgra, Ok(buffer2d)) => read_2d(&buffer2d, layout, width, height, path)?,
        _ => read_contiguous(&buffer, format, layout, (width, height), path)?,
    };
    image.ok_or_else(|| {
        unreadable(
            format!(
                "a decoded frame ({}x{}) does not hold the {width}x{height} picture",
                layout.width, layout.height
            ),
            path,
        )
    })
}

/// A 2-D buffer states its own first row and pitch (negative when bottom-up), which wins over the media type.
fn read_2d(
    buffer: &IMF2DBuffer,
    layout: FrameLayout,
    width: u32,
    height: u32,
    path: &Path,
) -> Result<Option<RgbImage>, MediaError> {
    let mut scanline0: *mut u8 = std::ptr::null_mut();
    let mut pitch = 0i32;
    unsafe { buffer.Lock2D(&mut scanline0, &mut pitch) }
        .map_err(|e| failed("cannot lock a frame", &e, path))?;
    let layout = FrameLayout {
        pitch: i64::from(pitch),
        ..layout
    };
    let image = layout.span_bytes().and_then(|span| {
        if scanline0.is_null() {
            return None;
        }
        // The lowest-addressed row is the first for top-down frames and the last for bottom-up ones.
        let back = if pitch < 0 {
            pitch.unsigned_abs() as usize * (layout.height as usize - 1)
        } else {
            0
        };
        // SAFETY: while locked, Media Foundation guarantees `height` rows of `width * 4` bytes starting at
        // `scanline0` and `pitch` apart, which is exactly the `span` bytes from the lowest row.
        let bytes = unsafe { std::slice::from_raw_parts(scanline0.sub(back), span) };
        bgra_to_rgb(bytes, layout, width, height)
    });
    let _ = unsafe { buffer.Unlock2D() };
    Ok(image)
}

/// The buffer in its contiguous form: rows `layout.pitch` apart (planes one after the other for YUV).
fn read_contiguous(
    buffer: &IMFMediaBuffer,
    format: PixelFormat,
    layout: FrameLayout,
    (width, height): (u32, u32),
    path: &Path,
) -> Result<Option<RgbImage>, MediaError> {
    let mut data: *mut u8 = std::ptr::null_mut();
    let mut len = 0u32;
    unsafe { buffer.Lock(&mut data, None, Some(&mut len)) }
        .map_err(|e| failed("cannot lock a frame", &e, path))?;
    let image = if data.is_null() {
        None
    } else {
        // SAFETY: a locked buffer holds `len` valid bytes at `data` until it is unlocked below.
        let bytes = unsafe { std::slice::from_raw_parts(data, len as usize) };
        match format {
            PixelFormat::Bgra => bgra_to_rgb(bytes, layout, width, height),
            PixelFormat::I420 | PixelFormat::Nv12 => {
                yuv420_to_rgb(bytes, format, layout, width, height)
            }
        }
    };
    let _ = unsafe { buffer.Unlock() };
    Ok(image)
}

fn failed(what: &str, err: &windows::core::Error, path: &Path) -> MediaError {
    unreadable(
        format!("{what}: {} (0x{:08x})", err.message(), err.code().0),
        path,
    )
}

fn unreadable(message: String, path: &Path) -> MediaError {
    MediaError::Unreadable {
        tool: TOOL.into(),
        message,
        path: path.to_path_buf(),
    }
}
