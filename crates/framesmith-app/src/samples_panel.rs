//! The Samples tab: a gallery of samples by step — clips, or images from image models' runs — (last-frame thumbnails
//! made off the UI thread) and the player, which shows an image still.

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

    /// Asks for a sample's last-frame thumbnail (once per sample; `frames`: its frames folder or image).
    pub fn request_thumbnail(&mut self, jobs: &mut Jobs, frames: &Path) {
        if !self.requested.insert(frames.to_path_buf()) {
            return;
        }
        let frames = frames.to_path_buf();
        jobs.spawn("sample thumbnail", move || JobResult::SampleThumbnail {
            thumbnail: last_frame_thumbnail(&frames),
            frames,
        });
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
    let last = frames.last()?;
    let side = theme::GALLERY_THUMBNAIL as u32;
    let image = image::open(last).ok()?.thumbnail(side, side).to_rgba8();
    Some(Thumbnail {
        path: last.clone(),
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
                            open = Some(clip.frames.clone());
                        }
                        ui.label(RichText::new(&clip.prompt).small().color(theme::MUTED));
                    });
                }
            });
        });
    if let Some(frames) = open {
        state.player.open(&frames);
    }
    ui.separator();
    let playing = state
        .player
        .frames_dir()
        .and_then(|dir| clips.iter().find(|c| c.frames == dir));
    if let Some(clip) = playing {
        ui.label(format!("Step {} · {}", clip.step, clip.file.display()));
    }
    state.player.ui(ui);
}
