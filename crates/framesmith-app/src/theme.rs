//! Colours and sizes, in one place so panels never carry their own literals.

use egui::Color32;

/// Validation errors and failures.
pub const ERROR: Color32 = Color32::from_rgb(0xE0, 0x5A, 0x4F);
/// Warnings (spilling, missing captions).
pub const WARNING: Color32 = Color32::from_rgb(0xE6, 0xA2, 0x3C);
/// Preset marks and highlights.
pub const ACCENT: Color32 = Color32::from_rgb(0x5A, 0xA9, 0xE6);
/// Things that went right (model recognised, run finished).
pub const GOOD: Color32 = Color32::from_rgb(0x6C, 0xC0, 0x6A);
/// Secondary text.
pub const MUTED: Color32 = Color32::from_gray(0x9A);

/// Chart series.
pub const LOSS_RAW: Color32 = Color32::from_rgba_premultiplied(0x5A, 0x7A, 0x99, 0xC0);
pub const LOSS_SMOOTHED: Color32 = Color32::from_rgb(0xF0, 0x8A, 0x3C);
/// The validation loss, beside the training loss.
pub const LOSS_VALIDATION: Color32 = Color32::from_rgb(0x3C, 0xB8, 0x78);
pub const LEARNING_RATE: Color32 = Color32::from_rgb(0x8E, 0x7C, 0xE0);
pub const VRAM: Color32 = Color32::from_rgb(0x6C, 0xC0, 0x6A);
pub const VRAM_PROCESS: Color32 = Color32::from_rgb(0x3E, 0x8E, 0x3C);
pub const RAM: Color32 = Color32::from_rgb(0x5A, 0xA9, 0xE6);
pub const RAM_PROCESS: Color32 = Color32::from_rgb(0x2F, 0x6F, 0xA8);
pub const SHARED: Color32 = Color32::from_rgb(0xE6, 0xA2, 0x3C);
pub const SHARED_PROCESS: Color32 = Color32::from_rgb(0xE0, 0x5A, 0x4F);

/// Width of the column that holds field marks (preset reasons, validation messages).
pub const MARK_WIDTH: f32 = 360.0;
/// Height of a chart.
pub const CHART_HEIGHT: f32 = 180.0;
/// Longest side of a sample thumbnail in the gallery.
pub const GALLERY_THUMBNAIL: f32 = 120.0;
/// Longest side of an edit sample's control image, shown beside the sample.
pub const CONTROL_PREVIEW: f32 = 320.0;

/// Applies the app's look to a context.
pub fn apply(ctx: &egui::Context) {
    ctx.set_theme(egui::Theme::Dark);
}
