//! The demo dataset: short clips of a coloured shape moving right over a coloured background, each with a caption
//! that names the colours, the shape and the motion. Deterministic for a seed. Every clip moves the same way, eight
//! pixels (two tokens at 64×64) per frame along a random row: the demo's LoRA learns one motion, as a motion LoRA
//! does, and the tiny model does not learn to pick a direction from the caption within the demo's few hundred
//! steps.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use framesmith_data::video::encode::RgbFrame;

const COLOURS: [(&str, [u8; 3]); 6] = [
    ("red", [220, 40, 40]),
    ("green", [40, 190, 70]),
    ("blue", [40, 80, 220]),
    ("yellow", [230, 210, 40]),
    ("white", [240, 240, 240]),
    ("black", [20, 20, 20]),
];
const SHAPES: [&str; 2] = ["circle", "square"];
/// The motion of every clip: its name in captions and its direction (x, y).
const MOTION: (&str, (f32, f32)) = ("right", (1.0, 0.0));

/// One generated clip.
#[derive(Debug, Clone)]
pub struct DemoClip {
    pub name: String,
    pub caption: String,
    pub frames: Vec<RgbFrame>,
}

/// Generates `count` clips of `frames` frames at `size`×`size` pixels.
pub fn generate(count: usize, frames: usize, size: usize, seed: u64) -> Vec<DemoClip> {
    let rng = &mut StdRng::seed_from_u64(seed);
    (0..count)
        .map(|i| {
            let fg = rng.random_range(0..COLOURS.len());
            let bg = (fg + rng.random_range(1..COLOURS.len())) % COLOURS.len();
            let shape = SHAPES[i % SHAPES.len()];
            let (motion, (dx, dy)) = MOTION;
            let caption = format!(
                "a {} {shape} moving {motion} on a {} background",
                COLOURS[fg].0, COLOURS[bg].0
            );
            let radius = size as f32 * rng.random_range(0.1..0.17);
            let travel = size as f32 * 0.5;
            // Centred along the motion, anywhere across it that keeps the shape in the frame.
            let across = size as f32 * rng.random_range(-0.2..0.2);
            let (cx0, cy0) = (
                size as f32 / 2.0 - dx * travel / 2.0 + dy.abs() * across,
                size as f32 / 2.0 - dy * travel / 2.0 + dx.abs() * across,
            );
            let frames = (0..frames)
                .map(|t| {
                    let p = if frames > 1 {
                        t as f32 / (frames - 1) as f32
                    } else {
                        0.0
                    };
                    let centre = (cx0 + dx * travel * p, cy0 + dy * travel * p);
                    draw(size, centre, radius, shape, COLOURS[fg].1, COLOURS[bg].1)
                })
                .collect();
            DemoClip {
                name: format!("clip_{i:03}"),
                caption,
                frames,
            }
        })
        .collect()
}

fn draw(
    size: usize,
    centre: (f32, f32),
    radius: f32,
    shape: &str,
    fg: [u8; 3],
    bg: [u8; 3],
) -> RgbFrame {
    let mut data = Vec::with_capacity(size * size * 3);
    for y in 0..size {
        for x in 0..size {
            let (px, py) = (x as f32 + 0.5 - centre.0, y as f32 + 0.5 - centre.1);
            let inside = match shape {
                "circle" => px * px + py * py <= radius * radius,
                _ => px.abs() <= radius && py.abs() <= radius,
            };
            data.extend_from_slice(if inside { &fg } else { &bg });
        }
    }
    RgbFrame {
        width: size,
        height: size,
        data,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clips_are_deterministic_and_move() {
        let a = generate(3, 5, 16, 1);
        let b = generate(3, 5, 16, 1);
        assert_eq!(a.len(), 3);
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.caption, y.caption);
            assert_eq!(x.frames, y.frames);
            assert_ne!(x.frames[0], x.frames[4], "the shape moves");
        }
        assert!(a[0].caption.starts_with("a ") && a[0].caption.contains("moving"));
    }
}
