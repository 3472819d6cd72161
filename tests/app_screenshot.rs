//! `framesmith --screenshot`'s code path in a real window: needs a display (CI runs it under `xvfb-run`) and
//! skips, saying why, without one. Runs on the main thread (`harness = false`), as winit requires.

// A test with its own `main`: clippy does not see it as a test, and panicking is how it fails.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::Path;

fn main() {
    let has_display =
        std::env::var_os("DISPLAY").is_some() || std::env::var_os("WAYLAND_DISPLAY").is_some();
    if !has_display {
        println!("app_screenshot: skipped, no display (run under xvfb-run)");
        return;
    }
    // CI can keep the image as an artifact by naming where it goes.
    let dir = tempfile::tempdir().expect("temp dir");
    let path = std::env::var_os("APP_SCREENSHOT_PATH")
        .map_or_else(|| dir.path().join("framesmith.png"), Into::into);
    if let Err(err) = framesmith_app::screenshot(&path) {
        panic!("screenshot failed: {err:#}");
    }
    check_not_blank(&path);
    println!("app_screenshot: ok");
}

/// A real frame of the app has its size, many colours (text, charts) and no single colour covering almost all of it.
fn check_not_blank(path: &Path) {
    let image = image::open(path)
        .expect("the screenshot is a PNG")
        .to_rgba8();
    assert!(
        image.width() >= 640 && image.height() >= 400,
        "tiny screenshot {}x{}",
        image.width(),
        image.height()
    );
    let mut counts = std::collections::HashMap::new();
    for pixel in image.pixels() {
        *counts.entry(pixel.0).or_insert(0usize) += 1;
    }
    let total = (image.width() * image.height()) as usize;
    let most = counts.values().copied().max().unwrap_or(0);
    assert!(
        counts.len() >= 16,
        "only {} colours: the window looks blank",
        counts.len()
    );
    assert!(
        most * 100 < total * 98,
        "one colour covers {most} of {total} pixels: the window looks blank"
    );
}
