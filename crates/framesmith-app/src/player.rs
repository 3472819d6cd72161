//! The sample player: PNG frames from a sample's frames folder, decoded off the UI thread, shown at the clip's fps
//! (from `frames.json`, default 16) through one texture that is updated in place. An image sample (one PNG, as
//! an image model's runs make) is shown still, without the playback controls. A clip's MP4 with sound plays it
//! with the frames (`sound`: ffprobe and ffplay as child processes, `sync`: when to start and stop).

mod sound;
mod sync;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender};

use egui::{ColorImage, TextureHandle, TextureOptions, Ui};

use super::jobs::JobMode;
use super::theme;
use sound::{ClipSound, SoundTools};

/// Frame rate when a clip has no `frames.json`.
pub const DEFAULT_FPS: f64 = 16.0;
/// Longest frame interval the clock accepts, so a stalled UI does not skip a run of frames at once.
const MAX_DT_SECS: f64 = 0.1;

/// Which frame is due: play, pause, loop, step and seek, independent of egui.
#[derive(Debug, Clone, PartialEq)]
pub struct PlayerClock {
    pub frame: usize,
    pub count: usize,
    pub fps: f64,
    pub playing: bool,
    pub looping: bool,
    carry_secs: f64,
}

impl PlayerClock {
    pub fn new(count: usize, fps: f64) -> Self {
        Self {
            frame: 0,
            count,
            fps: if fps.is_finite() && fps > 0.0 {
                fps
            } else {
                DEFAULT_FPS
            },
            playing: false,
            looping: true,
            carry_secs: 0.0,
        }
    }

    /// Moves time on by `dt_secs`; returns whether the frame changed.
    pub fn advance(&mut self, dt_secs: f64) -> bool {
        if !self.playing || self.count == 0 {
            return false;
        }
        self.carry_secs += dt_secs.clamp(0.0, MAX_DT_SECS);
        let period = 1.0 / self.fps;
        let before = self.frame;
        while self.carry_secs >= period {
            self.carry_secs -= period;
            if self.frame + 1 < self.count {
                self.frame += 1;
            } else if self.looping {
                self.frame = 0;
            } else {
                self.playing = false;
                self.carry_secs = 0.0;
                break;
            }
        }
        self.frame != before
    }

    /// Steps by `delta` frames (pausing playback), clamped to the clip.
    pub fn step(&mut self, delta: isize) {
        self.playing = false;
        let last = self.count.saturating_sub(1) as isize;
        self.frame = (self.frame as isize + delta).clamp(0, last) as usize;
    }

    pub fn seek(&mut self, frame: usize) {
        self.frame = frame.min(self.count.saturating_sub(1));
        self.carry_secs = 0.0;
    }

    /// Where the clip is, in seconds from its start (between frames too).
    pub fn position_secs(&self) -> f64 {
        self.frame as f64 / self.fps + self.carry_secs
    }

    /// How long the clip's frames last.
    pub fn duration_secs(&self) -> f64 {
        self.count as f64 / self.fps
    }

    /// Play from the start when the clip has ended, else toggle.
    pub fn toggle_play(&mut self) {
        if !self.playing && !self.looping && self.frame + 1 >= self.count {
            self.frame = 0;
        }
        self.playing = !self.playing;
        self.carry_secs = 0.0;
    }
}

enum Request {
    Open(PathBuf),
    Frame(usize, PathBuf),
}

enum Decoded {
    Opened {
        frames_dir: PathBuf,
        result: Result<(Vec<PathBuf>, f64), String>,
    },
    Frame(usize, Result<ColorImage, String>),
}

/// Decodes on its own thread (or inline for tests); only the newest frame request is decoded.
struct Decoder {
    requests: Option<SyncSender<Request>>,
    results: Option<Receiver<Decoded>>,
    inline: VecDeque<Decoded>,
}

impl Decoder {
    fn new(mode: JobMode, repaint: Option<egui::Context>) -> Self {
        if mode == JobMode::Inline {
            return Self {
                requests: None,
                results: None,
                inline: VecDeque::new(),
            };
        }
        let (request_tx, request_rx) = std::sync::mpsc::sync_channel(8);
        let (result_tx, result_rx) = std::sync::mpsc::sync_channel(4);
        let spawned = std::thread::Builder::new()
            .name("frame decoder".into())
            .spawn(move || decode_loop(&request_rx, &result_tx, repaint.as_ref()));
        match spawned {
            Ok(_) => Self {
                requests: Some(request_tx),
                results: Some(result_rx),
                inline: VecDeque::new(),
            },
            // Without a thread the player still works, decoding on the UI thread.
            Err(_) => Self {
                requests: None,
                results: None,
                inline: VecDeque::new(),
            },
        }
    }

    /// False when the decoder is behind and the request was dropped; the caller asks again next frame.
    fn send(&mut self, request: Request) -> bool {
        match &self.requests {
            Some(tx) => tx.try_send(request).is_ok(),
            None => {
                self.inline.push_back(handle(request));
                true
            }
        }
    }

    fn poll(&mut self) -> Option<Decoded> {
        if let Some(decoded) = self.inline.pop_front() {
            return Some(decoded);
        }
        self.results.as_ref()?.try_recv().ok()
    }
}

fn decode_loop(
    requests: &Receiver<Request>,
    results: &SyncSender<Decoded>,
    repaint: Option<&egui::Context>,
) {
    while let Ok(mut request) = requests.recv() {
        // Skip frame requests that newer ones have replaced; an Open is always handled.
        while let Ok(next) = requests.try_recv() {
            if matches!(request, Request::Open(_)) && results.send(handle(request)).is_err() {
                return;
            }
            request = next;
        }
        if results.send(handle(request)).is_err() {
            return;
        }
        if let Some(ctx) = repaint {
            ctx.request_repaint();
        }
    }
}

fn handle(request: Request) -> Decoded {
    match request {
        Request::Open(frames_dir) => Decoded::Opened {
            result: list_frames(&frames_dir),
            frames_dir,
        },
        Request::Frame(index, path) => Decoded::Frame(index, decode_png(&path)),
    }
}

/// PNG frames sorted by name, and the fps from `frames.json` (`{"fps": 16}`); `frames` may also be one PNG image,
/// a sample of one frame.
pub fn list_frames(frames: &Path) -> Result<(Vec<PathBuf>, f64), String> {
    if frames.is_file() {
        let png = frames
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("png"));
        if !png {
            return Err(format!("not a PNG image: {}", frames.display()));
        }
        return Ok((vec![frames.to_path_buf()], DEFAULT_FPS));
    }
    let frames_dir = frames;
    let entries = std::fs::read_dir(frames_dir).map_err(|err| {
        format!(
            "cannot read the frames of this sample: {err}: {}",
            frames_dir.display()
        )
    })?;
    let mut frames: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e.eq_ignore_ascii_case("png")))
        .collect();
    frames.sort();
    if frames.is_empty() {
        return Err(format!("no PNG frames in {}", frames_dir.display()));
    }
    let fps = std::fs::read_to_string(frames_dir.join("frames.json"))
        .ok()
        .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        .and_then(|json| json.get("fps").and_then(serde_json::Value::as_f64))
        .unwrap_or(DEFAULT_FPS);
    Ok((frames, fps))
}

fn decode_png(path: &Path) -> Result<ColorImage, String> {
    let image = image::open(path)
        .map_err(|err| format!("cannot decode {}: {err}", path.display()))?
        .to_rgba8();
    let size = [image.width() as usize, image.height() as usize];
    Ok(ColorImage::from_rgba_unmultiplied(size, image.as_raw()))
}

/// The player panel's state.
pub struct Player {
    frames_dir: Option<PathBuf>,
    frames: Vec<PathBuf>,
    pub clock: PlayerClock,
    texture: Option<TextureHandle>,
    shown: Option<usize>,
    requested: Option<usize>,
    error: Option<String>,
    decoder: Decoder,
    sound: ClipSound,
}

impl Player {
    /// In `JobMode::Inline` (the UI tests) clips play without sound: no ffprobe or ffplay runs.
    pub fn new(mode: JobMode, repaint: Option<egui::Context>) -> Self {
        let tools = match mode {
            JobMode::Background => SoundTools::locate(),
            JobMode::Inline => SoundTools::default(),
        };
        Self {
            sound: ClipSound::new(tools, repaint.clone()),
            frames_dir: None,
            frames: Vec::new(),
            clock: PlayerClock::new(0, DEFAULT_FPS),
            texture: None,
            shown: None,
            requested: None,
            error: None,
            decoder: Decoder::new(mode, repaint),
        }
    }

    /// Loads a clip's frames (listed on the decoder thread); `file` is the sample's MP4, whose sound plays with
    /// the frames when it has any, or its PNG image.
    pub fn open(&mut self, frames_dir: &Path, file: &Path) {
        self.sound.open(file);
        self.frames_dir = Some(frames_dir.to_path_buf());
        self.frames.clear();
        self.clock = PlayerClock::new(0, DEFAULT_FPS);
        self.shown = None;
        self.requested = None;
        self.error = None;
        if !self.decoder.send(Request::Open(frames_dir.to_path_buf())) {
            self.error = Some("the frame decoder is busy; pick the sample again".into());
        }
    }

    /// The frames folder or image the player has open.
    pub fn frames_dir(&self) -> Option<&Path> {
        self.frames_dir.as_deref()
    }

    /// Whether clips play muted (a setting).
    pub fn muted(&self) -> bool {
        self.sound.muted()
    }

    pub fn set_muted(&mut self, muted: bool) {
        self.sound.set_muted(muted);
    }

    /// Pauses the clip (frames and sound).
    pub fn pause(&mut self) {
        self.clock.playing = false;
    }

    /// Stops the sound (the app exits).
    pub fn stop_sound(&mut self) {
        self.sound.stop();
    }

    /// The frame now in the texture.
    pub fn shown_frame(&self) -> Option<usize> {
        self.shown
    }

    /// Takes decoded results, moves the clock and asks for the due frame. No drawing.
    pub fn logic(&mut self, ctx: &egui::Context) {
        let dt = f64::from(ctx.input(|i| i.stable_dt));
        self.clock.advance(dt);
        // Inline decoding answers at once, so a second pass shows the frame in the same UI frame.
        for _ in 0..3 {
            while let Some(decoded) = self.decoder.poll() {
                self.take(ctx, decoded);
            }
            self.request_due_frame();
        }
        self.sound.logic(&self.clock);
        if self.clock.playing {
            ctx.request_repaint();
        }
    }

    fn take(&mut self, ctx: &egui::Context, decoded: Decoded) {
        match decoded {
            Decoded::Opened { frames_dir, result } => {
                if self.frames_dir.as_deref() != Some(&frames_dir) {
                    return;
                }
                match result {
                    Ok((frames, fps)) => {
                        self.clock = PlayerClock::new(frames.len(), fps);
                        self.frames = frames;
                    }
                    Err(err) => self.error = Some(err),
                }
            }
            Decoded::Frame(index, result) => {
                if self.requested == Some(index) {
                    self.requested = None;
                }
                match result {
                    Ok(image) => {
                        match &mut self.texture {
                            Some(texture) => texture.set(image, TextureOptions::LINEAR),
                            None => {
                                self.texture = Some(ctx.load_texture(
                                    "sample player",
                                    image,
                                    TextureOptions::LINEAR,
                                ));
                            }
                        }
                        self.shown = Some(index);
                    }
                    Err(err) => self.error = Some(err),
                }
            }
        }
    }

    fn request_due_frame(&mut self) {
        let due = self.clock.frame;
        if self.frames.is_empty() || self.shown == Some(due) || self.requested == Some(due) {
            return;
        }
        if let Some(path) = self.frames.get(due) {
            if self.decoder.send(Request::Frame(due, path.clone())) {
                self.requested = Some(due);
            }
        }
    }

    /// Draws the frame and the controls.
    pub fn ui(&mut self, ui: &mut Ui) {
        if let Some(error) = &self.error {
            ui.colored_label(theme::ERROR, error);
        }
        if self.frames.is_empty() {
            ui.label("Pick a sample to play it");
            return;
        }
        if let Some(texture) = &self.texture {
            let size = texture.size_vec2();
            let scale = (ui.available_width() / size.x).clamp(0.1, 1.5);
            ui.add(egui::Image::new((texture.id(), size * scale)));
        }
        if self.is_still() {
            if let Some(texture) = &self.texture {
                let [w, h] = texture.size();
                ui.label(egui::RichText::new(format!("Image, {w}×{h}")).color(theme::MUTED));
            }
        } else {
            self.controls_ui(ui);
        }
    }

    /// Whether the open sample is one frame (an image): shown without playback controls.
    pub fn is_still(&self) -> bool {
        self.frames.len() == 1
    }

    fn controls_ui(&mut self, ui: &mut Ui) {
        let count = self.clock.count;
        ui.horizontal(|ui| {
            let play_label = if self.clock.playing { "Pause" } else { "Play" };
            if ui.button(play_label).clicked() {
                self.clock.toggle_play();
            }
            if ui.button("Previous frame").clicked() {
                self.clock.step(-1);
            }
            if ui.button("Next frame").clicked() {
                self.clock.step(1);
            }
            ui.checkbox(&mut self.clock.looping, "Loop");
            ui.label(format!("Frame {} / {count}", self.clock.frame + 1));
            ui.label(egui::RichText::new(format!("{:.0} fps", self.clock.fps)).color(theme::MUTED));
            self.sound.controls_ui(ui);
        });
        self.sound.note_ui(ui);
        let mut frame = self.clock.frame;
        let last = count.saturating_sub(1);
        let slider = ui.add(
            egui::Slider::new(&mut frame, 0..=last)
                .show_value(false)
                .text("Scrub"),
        );
        if slider.changed() {
            self.clock.playing = false;
            self.clock.seek(frame);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_plays_at_fps_and_loops() {
        let mut clock = PlayerClock::new(3, 10.0);
        assert!(!clock.advance(1.0), "paused clocks do not move");
        clock.toggle_play();
        assert!(clock.advance(0.1));
        assert_eq!(clock.frame, 1);
        assert!(!clock.advance(0.05));
        clock.advance(0.06);
        assert_eq!(clock.frame, 2);
        clock.advance(0.1);
        assert_eq!(clock.frame, 0, "loops back");
    }

    #[test]
    fn clock_stops_at_the_end_without_loop_and_restarts_on_play() {
        let mut clock = PlayerClock::new(2, 10.0);
        clock.looping = false;
        clock.toggle_play();
        clock.advance(0.1);
        clock.advance(0.1);
        assert_eq!((clock.frame, clock.playing), (1, false));
        clock.toggle_play();
        assert_eq!((clock.frame, clock.playing), (0, true));
    }

    #[test]
    fn step_and_seek_clamp_and_pause() {
        let mut clock = PlayerClock::new(3, 16.0);
        clock.toggle_play();
        clock.step(-1);
        assert_eq!((clock.frame, clock.playing), (0, false));
        clock.step(5);
        assert_eq!(clock.frame, 2);
        clock.seek(10);
        assert_eq!(clock.frame, 2);
        assert_eq!(PlayerClock::new(0, 0.0).fps, DEFAULT_FPS);
    }

    #[test]
    fn frames_are_listed_in_order_with_fps_from_json() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["0002.png", "0001.png"] {
            image::RgbaImage::new(2, 2)
                .save(dir.path().join(name))
                .unwrap();
        }
        std::fs::write(dir.path().join("frames.json"), r#"{"fps": 24}"#).unwrap();
        let (frames, fps) = list_frames(dir.path()).unwrap();
        assert_eq!(frames[0].file_name().unwrap(), "0001.png");
        assert_eq!(fps, 24.0);
        let empty = tempfile::tempdir().unwrap();
        assert!(list_frames(empty.path())
            .unwrap_err()
            .contains("no PNG frames"));
        // An image sample is one frame.
        let image = dir.path().join("0001.png");
        assert_eq!(list_frames(&image).unwrap(), (vec![image], DEFAULT_FPS));
        let json = dir.path().join("frames.json");
        assert!(list_frames(&json).unwrap_err().contains("not a PNG image"));
    }
}
