//! `framesmith --screenshot PATH`: the real window with the demo project as it opens — or, with `--run DIR`,
//! a finished run read back from its output folder, on the Samples tab; with `--generate PROMPT` as well, after
//! the run's LoRA was tried on that prompt in the Samples tab's "Try the LoRA" panel and the last frame of the clip
//! it made is in the player — captured to a PNG after a few frames, then closed.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use egui::ColorImage;

use framesmith_config::protocol::{Event, LogLevel, Progress, RunState};
use framesmith_config::RunConfig;

use super::player::Player;
use super::settings::Tab;
use super::window::FramesmithApp;

/// Frames drawn before the capture, so layout, fonts and charts have settled.
const WARMUP_FRAMES: u32 = 10;
/// Frames after which a capture that never arrived counts as failed.
const GIVE_UP_FRAMES: u32 = 600;
/// How long a capture waits for the generation it shows before it counts as failed.
pub const GENERATE_LIMIT: Duration = Duration::from_secs(300);
/// How often the window redraws while the generation runs (the capture has nothing to draw until it ends).
const GENERATE_POLL: Duration = Duration::from_millis(200);
/// Steps of the staged run, and how far it has got.
const STAGED_TOTAL_STEPS: usize = 200;
const STAGED_STEPS: usize = 80;

/// Where the PNG goes and how the capture went (read by `run_app` after the window closes).
#[derive(Debug, Clone)]
pub struct ScreenshotRequest {
    pub path: PathBuf,
    pub outcome: Arc<Mutex<Option<Result<(), String>>>>,
    /// The events of a finished run to show instead of the staged one.
    pub run_events: Option<Vec<Event>>,
    /// A generation to run in the "Try the LoRA" panel before the capture, which shows its clip in the player.
    pub generate: Option<GenerateFirst>,
}

/// What the capture generates first: `prompt` with the models and LoRA of the run `config`.
#[derive(Debug, Clone)]
pub struct GenerateFirst {
    pub config: Box<RunConfig>,
    pub prompt: String,
}

impl ScreenshotRequest {
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
            outcome: Arc::new(Mutex::new(None)),
            run_events: None,
            generate: None,
        }
    }

    /// The capture's result; `None` if the window closed before it finished.
    pub fn take_outcome(&self) -> Option<Result<(), String>> {
        self.outcome
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

/// The capture in progress.
pub struct ScreenshotState {
    request: ScreenshotRequest,
    /// When the window opened (a generation shown must end within [`GENERATE_LIMIT`] of it).
    opened: Instant,
    frames: u32,
    requested: bool,
    tx: SyncSender<Arc<ColorImage>>,
    rx: Receiver<Arc<ColorImage>>,
}

impl ScreenshotState {
    /// The finished run's events, when the capture shows one.
    pub fn run_events(&self) -> Option<&[Event]> {
        self.request.run_events.as_deref()
    }

    pub fn new(request: ScreenshotRequest) -> Self {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        Self {
            request,
            opened: Instant::now(),
            frames: 0,
            requested: false,
            tx,
            rx,
        }
    }

    /// Counts frames, asks for the capture, saves it and closes the window. `generated` is how the generation the
    /// capture shows went (`None` while it runs; `Ok(true)` once its clip is in the player): the frames are counted
    /// from then on.
    pub fn logic(&mut self, ctx: &egui::Context, generated: Option<Result<bool, String>>) {
        if let Some(outcome) = self.generation_pending(generated) {
            match outcome {
                Ok(()) => ctx.request_repaint_after(GENERATE_POLL),
                Err(err) => self.finish(ctx, Err(err)),
            }
            return;
        }
        self.frames += 1;
        ctx.request_repaint();
        if !self.requested && self.frames >= WARMUP_FRAMES {
            self.requested = true;
            let tx = self.tx.clone();
            let callback = egui::ScreenshotCallback::new(move |image| {
                let _ = tx.try_send(image);
            });
            ctx.send_viewport_cmd(egui::ViewportCommand::Screenshot(callback));
        }
        let outcome = match self.rx.try_recv() {
            Ok(image) => Some(save_png(&self.request.path, &image)),
            Err(_) if self.frames > GIVE_UP_FRAMES => Some(Err(format!(
                "no screenshot arrived after {GIVE_UP_FRAMES} frames"
            ))),
            Err(_) => None,
        };
        if let Some(outcome) = outcome {
            self.finish(ctx, outcome);
        }
    }

    /// `Some(Ok(()))` while the capture waits for its generation (and its clip in the player), `Some(Err(…))` when
    /// that failed or took longer than [`GENERATE_LIMIT`], `None` when there is nothing (left) to wait for.
    fn generation_pending(
        &self,
        generated: Option<Result<bool, String>>,
    ) -> Option<Result<(), String>> {
        self.request.generate.as_ref()?;
        match generated {
            Some(Ok(true)) => None,
            Some(Err(err)) => Some(Err(format!("generating the clip failed: {err}"))),
            Some(Ok(false)) | None if self.opened.elapsed() > GENERATE_LIMIT => Some(Err(format!(
                "the generated clip was not in the player after {} s",
                GENERATE_LIMIT.as_secs()
            ))),
            Some(Ok(false)) | None => Some(Ok(())),
        }
    }

    /// Records how the capture went and closes the window.
    fn finish(&mut self, ctx: &egui::Context, outcome: Result<(), String>) {
        *self
            .request
            .outcome
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(outcome);
        ctx.send_viewport_cmd(egui::ViewportCommand::Close);
    }
}

fn save_png(path: &Path, image: &ColorImage) -> Result<(), String> {
    let [width, height] = image.size;
    let rgba: Vec<u8> = image.pixels.iter().flat_map(|c| c.to_array()).collect();
    let buffer = image::RgbaImage::from_raw(width as u32, height as u32, rgba)
        .ok_or_else(|| "the screenshot has the wrong size".to_owned())?;
    buffer
        .save(path)
        .map_err(|err| format!("cannot save the screenshot: {err}: {}", path.display()))
}

/// Stages what the capture shows: the finished run it was given (with the generation to make first, on the run's
/// models), else nothing — the window as it opens with the demo project (no run is made up).
pub fn stage(app: &mut FramesmithApp) {
    let Some(screenshot) = &app.screenshot else {
        return;
    };
    let run = screenshot.run_events().map(<[Event]>::to_vec);
    let generate = screenshot.request.generate.clone();
    if let Some(events) = run {
        stage_run(app, events);
    }
    if let Some(GenerateFirst { config, prompt }) = generate {
        app.settings.tab = Tab::Samples;
        app.editor.replace(*config);
        app.generate.queue(prompt);
    }
}

/// The capture's part of the app's `logic`: how the generation it waits for went, then [`ScreenshotState::logic`].
pub fn logic(app: &mut FramesmithApp, ctx: &egui::Context) {
    let Some(screenshot) = &mut app.screenshot else {
        return;
    };
    let player = &mut app.samples.player;
    let generated = match screenshot.request.generate {
        Some(_) => app
            .generate
            .ended()
            .map(|result| result.map(|clip| last_frame_shown(player, &clip.frames))),
        None => None,
    };
    screenshot.logic(ctx, generated);
}

/// Whether `player` shows the last frame of the clip in `frames` (sought once the clip is open): where a generated
/// clip ends up — the first frame of an image-to-video clip is the given start image.
fn last_frame_shown(player: &mut Player, frames: &Path) -> bool {
    if player.frames_dir() != Some(frames) || player.clock.count == 0 {
        return false;
    }
    let last = player.clock.count - 1;
    if player.clock.frame != last {
        player.clock.seek(last);
    }
    player.shown_frame() == Some(last)
}

/// Puts a finished run on the Samples tab with its last sample in the player.
fn stage_run(app: &mut FramesmithApp, events: Vec<Event>) {
    app.settings.tab = Tab::Samples;
    app.run_name = Some("demo".into());
    app.run.begin_run();
    let mut last = None;
    for event in events {
        if let Event::SampleReady {
            file,
            frames,
            controls,
            ..
        } = &event
        {
            app.samples.sample_ready(&mut app.jobs, frames, controls);
            last = Some((frames.clone(), file.clone()));
        }
        app.apply_event(event);
    }
    if let Some((frames, file)) = last {
        app.samples.player.open(&frames, &file);
    }
}

/// A made-up run for the UI tests' snapshots (never shown to a user): warmup then constant LR, loss falling with
/// deterministic noise.
pub fn staged_events() -> Vec<Event> {
    let mut events = vec![
        Event::Log {
            level: LogLevel::Info,
            message: "Demo project: the built-in tiny model on synthetic clips".into(),
        },
        Event::StateChanged(RunState::Training),
    ];
    let mut smoothed = 0.0;
    for step in 1..=STAGED_STEPS {
        let t = step as f64;
        let noise = (unit_hash(step as u64) - 0.5) * 0.04;
        let loss = 0.09 + 0.12 * (-t / 25.0).exp() + noise;
        smoothed = if step == 1 {
            loss
        } else {
            0.9 * smoothed + 0.1 * loss
        };
        let learning_rate = 2e-4 * (t / 20.0).min(1.0);
        events.push(Event::Progress(Progress {
            step,
            total_steps: STAGED_TOTAL_STEPS,
            epoch: 1 + step / 50,
            loss,
            smoothed_loss: smoothed,
            learning_rate,
            step_secs: 0.42,
            eta_secs: (STAGED_TOTAL_STEPS - step) as f64 * 0.42,
        }));
        if step % 40 == 0 {
            events.push(Event::Log {
                level: LogLevel::Info,
                message: format!("step {step}: loss {loss:.4}"),
            });
        }
    }
    events
}

/// A value in [0, 1) from a step number (splitmix64), so the staged noise is the same on every machine.
fn unit_hash(x: u64) -> f64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staged_run_is_mid_way_and_deterministic() {
        let events = staged_events();
        assert_eq!(events, staged_events());
        let progress = events
            .iter()
            .filter(|e| matches!(e, Event::Progress(_)))
            .count();
        assert_eq!(progress, STAGED_STEPS);
    }

    #[test]
    fn png_is_written_with_the_image_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shot.png");
        let image = ColorImage::new([3, 2], vec![egui::Color32::RED; 6]);
        save_png(&path, &image).unwrap();
        let read = image::open(&path).unwrap().to_rgba8();
        assert_eq!((read.width(), read.height()), (3, 2));
        assert_eq!(read.get_pixel(0, 0).0, [255, 0, 0, 255]);
    }
}
