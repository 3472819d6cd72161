//! The Samples tab: a gallery of samples by step — clips, or images from image models' runs — (last-frame thumbnails
//! made off the UI thread) and the player, which shows an image still; an edit model's sample is shown with the
//! control images it edits beside it (source and result side by side).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use egui::{RichText, TextureHandle, TextureOptions, Ui};

use super::backend::Thumbnail;
use super::jobs::{JobMode, JobResult, Jobs};
use super::player::{list_frames, Player};
use super::run_view::SampleClip;
use super::theme;

/// Gallery thumbnails and the player.
pub struct SamplesState {
    pub player: Player,
    thumbnails: HashMap<PathBuf, Option<TextureHandle>>,
    pending: HashMap<PathBuf, Option<Thumbnail>>,
    requested: HashSet<PathBuf>,
}

impl SamplesState {
    pub fn new(mode: JobMode, repaint: Option<egui::Context>) -> Self {
        Self {
            player: Player::new(mode, repaint),
            thumbnails: HashMap::new(),
            pending: HashMap::new(),
            requested: HashSet::new(),
        }
    }

    /// A sample arrived: asks for its last-frame thumbnail (`frames`: its frames folder or image) and for the
    /// previews of its control images, each once.
    pub fn sample_ready(&mut self, jobs: &mut Jobs, frames: &Path, controls: &[PathBuf]) {
        if self.requested.insert(frames.to_path_buf()) {
            let frames = frames.to_path_buf();
            jobs.spawn("sample thumbnail", move || JobResult::SampleThumbnail {
                thumbnail: last_frame_thumbnail(&frames),
                frames,
            });
        }
        for control in controls {
            if self.requested.insert(control.clone()) {
                let control = control.clone();
                jobs.spawn("control preview", move || JobResult::SampleThumbnail {
                    thumbnail: preview(&control, theme::CONTROL_PREVIEW as u32),
                    frames: control,
                });
            }
        }
    }

    /// The control images of the sample the player shows (shown beside it); empty when it has none.
    pub fn shown_controls<'a>(&self, clips: &'a [SampleClip]) -> &'a [PathBuf] {
        self.player
            .frames_dir()
            .and_then(|dir| clips.iter().find(|c| c.frames == dir))
            .map_or(&[], |clip| clip.controls.as_slice())
    }

    /// Keeps a finished thumbnail until the gallery draws it (textures are made on the UI thread).
    pub fn take_thumbnail(&mut self, frames: PathBuf, thumbnail: Option<Thumbnail>) {
        self.pending.insert(frames, thumbnail);
    }

    fn texture(&mut self, ctx: &egui::Context, frames_dir: &Path) -> Option<&TextureHandle> {
        if let Some(thumbnail) = self.pending.remove(frames_dir) {
            let texture = thumbnail.map(|t| {
                let image = egui::ColorImage::from_rgba_unmultiplied(
                    [t.width as usize, t.height as usize],
                    &t.rgba,
                );
                ctx.load_texture(
                    frames_dir.display().to_string(),
                    image,
                    TextureOptions::LINEAR,
                )
            });
            self.thumbnails.insert(frames_dir.to_path_buf(), texture);
        }
        self.thumbnails.get(frames_dir)?.as_ref()
    }
}

/// The sample's last frame: where a clip ends up (the first is the given start frame of an image-to-video
/// sample), or the image.
fn last_frame_thumbnail(frames: &Path) -> Option<Thumbnail> {
    let (frames, _) = list_frames(frames).ok()?;
    preview(frames.last()?, theme::GALLERY_THUMBNAIL as u32)
}

/// The image at `path` with its longest side at most `side` pixels.
fn preview(path: &Path, side: u32) -> Option<Thumbnail> {
    let image = image::open(path).ok()?.thumbnail(side, side).to_rgba8();
    Some(Thumbnail {
        path: path.to_path_buf(),
        width: image.width(),
        height: image.height(),
        rgba: image.into_raw(),
    })
}

/// Draws the Samples tab: `clips` (the run's samples) in the gallery, `state`'s thumbnails and player.
pub(super) fn samples_ui(state: &mut SamplesState, clips: &[SampleClip], ui: &mut Ui) {
    if clips.is_empty() {
        ui.label("No samples yet: set sample prompts in the Config tab, or press Sample now while training");
        // A clip made by the generate panel still plays.
        if state.player.frames_dir().is_some() {
            state.player.ui(ui);
        }
        return;
    }
    ui.heading("Gallery");
    let mut open = None;
    egui::ScrollArea::horizontal()
        .id_salt("gallery")
        .show(ui, |ui| {
            ui.horizontal(|ui| {
                for clip in clips {
                    ui.vertical(|ui| {
                        ui.set_width(theme::GALLERY_THUMBNAIL + 8.0);
                        if let Some(texture) = state.texture(ui.ctx(), &clip.frames) {
                            ui.add(egui::Image::new((texture.id(), texture.size_vec2())));
                        }
                        let verb = if clip.is_image() { "Show" } else { "Play" };
                        if ui.button(format!("{verb} step {}", clip.step)).clicked() {
                            open = Some(clip);
                        }
                        ui.label(RichText::new(&clip.prompt).small().color(theme::MUTED));
                    });
                }
            });
        });
    if let Some(clip) = open {
        state.player.open(&clip.frames, &clip.file);
    }
    ui.separator();
    let playing = state
        .player
        .frames_dir()
        .and_then(|dir| clips.iter().find(|c| c.frames == dir));
    if let Some(clip) = playing {
        ui.label(format!("Step {} · {}", clip.step, clip.file.display()));
    }
    let controls = state.shown_controls(clips);
    if controls.is_empty() {
        state.player.ui(ui);
        return;
    }
    ui.horizontal_top(|ui| {
        ui.vertical(|ui| {
            for control in controls {
                control_ui(state, control, ui);
            }
        });
        ui.vertical(|ui| {
            ui.strong("Result");
            state.player.ui(ui);
        });
    });
}

/// One control image of the sample shown: what the edit model was given.
fn control_ui(state: &mut SamplesState, control: &Path, ui: &mut Ui) {
    let name = control.file_name().map_or_else(
        || control.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    ui.strong(format!("Source: {name}"));
    match state.texture(ui.ctx(), control) {
        Some(texture) => {
            ui.add(egui::Image::new((texture.id(), texture.size_vec2())));
        }
        None => {
            ui.label(RichText::new(control.display().to_string()).color(theme::MUTED));
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn png(path: &Path, (w, h): (u32, u32)) {
        image::RgbImage::from_pixel(w, h, image::Rgb([200, 40, 40]))
            .save(path)
            .unwrap();
    }

    #[test]
    fn an_edit_sample_shows_its_control_images_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        let (sample, source) = (dir.path().join("000004-00.png"), dir.path().join("src.jpg"));
        png(&sample, (8, 6));
        png(&source, (640, 480));
        let edit = SampleClip {
            step: 4,
            file: sample.clone(),
            frames: sample.clone(),
            prompt: "make it red".into(),
            controls: vec![source.clone()],
        };
        let plain = SampleClip {
            step: 6,
            frames: dir.path().join("000006-00.png"),
            controls: Vec::new(),
            ..edit.clone()
        };
        let clips = [edit.clone(), plain.clone()];
        let mut jobs = Jobs::new(JobMode::Inline, None);
        let mut state = SamplesState::new(JobMode::Inline, None);
        state.sample_ready(&mut jobs, &edit.frames, &edit.controls);
        state.sample_ready(&mut jobs, &edit.frames, &edit.controls);
        let mut previews = HashMap::new();
        for result in jobs.drain() {
            match result {
                JobResult::SampleThumbnail { frames, thumbnail } => {
                    assert!(previews.insert(frames, thumbnail).is_none(), "asked twice");
                }
                other => panic!("{other:?}"),
            }
        }
        let control = previews[&source].as_ref().unwrap();
        assert_eq!((control.width, control.height), (320, 240));
        assert!(previews[&sample].is_some());

        assert!(state.shown_controls(&clips).is_empty(), "nothing open");
        state.player.open(&edit.frames, &edit.file);
        assert_eq!(state.shown_controls(&clips), [source]);
        state.player.open(&plain.frames, &plain.file);
        assert!(state.shown_controls(&clips).is_empty());
    }
}
