//! The demo learns: after a shortened `framesmith demo`, its sample clips match the training clips they were
//! prompted with (the caption and the clip's first frame) better than the samples the untrained base makes before
//! the first step, and better than noise.
#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

use std::path::Path;
use std::process::Command;

use framesmith_config::RunConfig;
use framesmith_data::video::encode::RgbFrame;
use framesmith_engine::demo::shapes;
use framesmith_engine::train::demo_setup::{DEMO_CLIPS, DEMO_FRAMES, DEMO_SAMPLES, DEMO_SIZE};

/// Steps of the shortened demo run (the real demo trains `demo-cpu`'s `max_train_steps`).
const STEPS: usize = 300;

fn read_png(path: &Path) -> RgbFrame {
    let image = image::open(path)
        .unwrap_or_else(|e| panic!("{e}: {}", path.display()))
        .to_rgb8();
    RgbFrame {
        width: image.width() as usize,
        height: image.height() as usize,
        data: image.into_raw(),
    }
}

/// Peak signal-to-noise ratio in dB over the frames after the given first one.
fn psnr(sample: &[RgbFrame], clip: &[RgbFrame]) -> f64 {
    assert_eq!(sample.len(), clip.len());
    let (mut sum, mut count) = (0f64, 0usize);
    for (a, b) in sample.iter().zip(clip).skip(1) {
        assert_eq!((a.width, a.height), (b.width, b.height));
        for (x, y) in a.data.iter().zip(&b.data) {
            let d = *x as f64 - *y as f64;
            sum += d * d;
            count += 1;
        }
    }
    10.0 * (255.0f64 * 255.0 / (sum / count as f64)).log10()
}

fn sample_frames(samples: &Path, step: usize, prompt: usize) -> Vec<RgbFrame> {
    let dir = samples.join(format!("{step:06}-{prompt:02}"));
    (0..DEMO_FRAMES)
        .map(|i| read_png(&dir.join(format!("frame_{i:04}.png"))))
        .collect()
}

/// Seeded uniform noise frames (splitmix64), the floor any learning must clear.
fn noise_frames(seed: u64) -> Vec<RgbFrame> {
    let mut state = seed;
    let mut next = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 56) as u8
    };
    (0..DEMO_FRAMES)
        .map(|_| RgbFrame {
            width: DEMO_SIZE,
            height: DEMO_SIZE,
            data: (0..DEMO_SIZE * DEMO_SIZE * 3).map(|_| next()).collect(),
        })
        .collect()
}

#[test]
fn demo_samples_match_their_training_clips() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(env!("CARGO_BIN_EXE_framesmith"))
        .args(["demo", "--steps", &STEPS.to_string(), "--out"])
        .arg(dir.path())
        .output()
        .expect("framesmith runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");

    // run.toml names absolute paths, so it is read from anywhere.
    let config = RunConfig::load(&dir.path().join("output/run.toml")).expect("run.toml");
    assert!(config.dataset.config.is_absolute());
    let clips = shapes::generate(DEMO_CLIPS, DEMO_FRAMES, DEMO_SIZE, config.training.seed);
    let samples = dir.path().join("output/samples");
    for (i, clip) in clips.iter().take(DEMO_SAMPLES).enumerate() {
        let base = psnr(&sample_frames(&samples, 0, i), &clip.frames);
        let trained = psnr(&sample_frames(&samples, STEPS, i), &clip.frames);
        let noise = psnr(&noise_frames(i as u64), &clip.frames);
        eprintln!(
            "\"{}\": PSNR base {base:.2} dB, trained {trained:.2} dB, noise {noise:.2} dB",
            clip.caption
        );
        // Margins a working run clears with room to spare; a run that learns nothing stays at the base.
        assert!(
            trained > base + 2.0 && trained > noise + 3.0,
            "\"{}\" did not learn: PSNR base {base:.2} dB, trained {trained:.2} dB, noise {noise:.2} dB",
            clip.caption
        );
    }
}
