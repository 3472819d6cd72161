//! A micro-step's random stream ([`StepRng`]) and its noise drawn ahead ([`NoiseAhead`]). Every micro-step draws
//! its timesteps and noise from `StdRng::seed_from_u64(mix(seed, index))`; the noise is millions of normal draws
//! on the host, made while the GPU would wait. So while the GPU runs one micro-step, a helper thread draws the
//! noise of the next one at the places in its stream where the last micro-step drew its own (the words drawn
//! before each noise tensor and its shape). A micro-step takes a tensor drawn ahead only when its stream stands
//! exactly where that draw started (same seed, same position) and asks for the same shape, and then continues
//! from where that draw ended: the values are the ones it would have drawn itself. Otherwise it draws inline.

use std::collections::VecDeque;
use std::ops::{Deref, DerefMut};
use std::thread::JoinHandle;

use candle_core::{Device, Result, Shape, Tensor};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

use framesmith_nn::init::randn;

/// The most words of the stream between two noise draws that are followed (timestep draws take a few).
const MAX_GAP_WORDS: usize = 4096;

/// One noise draw of a micro-step: the words of its stream drawn since the last noise draw (or the seed), and its
/// shape.
#[derive(Clone, Debug, PartialEq)]
struct PlannedDraw {
    gap_words: usize,
    shape: Shape,
}

/// N(0, 1) values drawn ahead from a stream, with its state before and after.
struct Drawn {
    start: StdRng,
    values: Tensor,
    end: StdRng,
}

/// A micro-step's random stream: timesteps and other draws read it as the `StdRng` it is; its noise comes from
/// [`StepRng::normal`], which uses the values drawn ahead when they are exactly the ones it would draw.
pub struct StepRng {
    rng: StdRng,
    /// The stream after the last noise draw (at first, as seeded): where the next draw's gap is counted from.
    mark: StdRng,
    /// The draws made ahead for this micro-step, in order (cleared once one does not match).
    ahead: VecDeque<Drawn>,
    /// What this micro-step drew; `None` once a gap could not be followed.
    plan: Option<Vec<PlannedDraw>>,
}

impl StepRng {
    /// The stream `rng`, with no noise drawn ahead (validation, tests).
    pub fn new(rng: StdRng) -> Self {
        Self::with_ahead(rng, Vec::new())
    }

    /// `StdRng::seed_from_u64(seed)` with no noise drawn ahead.
    pub fn seeded(seed: u64) -> Self {
        Self::new(StdRng::seed_from_u64(seed))
    }

    fn with_ahead(rng: StdRng, ahead: Vec<Drawn>) -> Self {
        Self {
            mark: rng.clone(),
            rng,
            ahead: ahead.into(),
            plan: Some(Vec::new()),
        }
    }

    /// A tensor of N(0, 1) samples of `shape` on `device`, the next ones of the stream: the values of
    /// `framesmith_nn::init::randn(rng, shape, 0.0, 1.0, device)`.
    pub fn normal<S: Into<Shape>>(&mut self, shape: S, device: &Device) -> Result<Tensor> {
        let shape = shape.into();
        let gap = words_between(&self.mark, &self.rng);
        match (&mut self.plan, gap) {
            (Some(plan), Some(gap_words)) => plan.push(PlannedDraw {
                gap_words,
                shape: shape.clone(),
            }),
            (plan, _) => *plan = None,
        }
        let values = match self.ahead.pop_front() {
            Some(drawn) if drawn.start == self.rng && drawn.values.shape() == &shape => {
                self.rng = drawn.end;
                drawn.values.to_device(device)?
            }
            _ => {
                self.ahead.clear();
                randn(&mut self.rng, shape, 0.0, 1.0, device)?
            }
        };
        self.mark = self.rng.clone();
        Ok(values)
    }
}

impl Deref for StepRng {
    type Target = StdRng;

    fn deref(&self) -> &StdRng {
        &self.rng
    }
}

// `RngCore` (and so `Rng`) comes with `DerefMut`: every draw other than the noise reads the stream itself.
impl DerefMut for StepRng {
    fn deref_mut(&mut self) -> &mut StdRng {
        &mut self.rng
    }
}

/// How many 32-bit words `from` must draw to stand where `to` does (`None` beyond [`MAX_GAP_WORDS`] or when `to`
/// is not ahead of `from` in the same stream). Every draw of the stream takes whole words in order, so its state is
/// its seed and the count of words drawn.
fn words_between(from: &StdRng, to: &StdRng) -> Option<usize> {
    let mut at = from.clone();
    for words in 0..=MAX_GAP_WORDS {
        if at == *to {
            return Some(words);
        }
        at.next_u32();
    }
    None
}

/// Draws `plan`'s noise from `StdRng::seed_from_u64(seed)`: each draw after its gap of words, on the host.
fn draw_plan(seed: u64, plan: &[PlannedDraw]) -> Result<Vec<Drawn>> {
    let mut rng = StdRng::seed_from_u64(seed);
    plan.iter()
        .map(|p| {
            for _ in 0..p.gap_words {
                rng.next_u32();
            }
            let start = rng.clone();
            let values = randn(&mut rng, p.shape.clone(), 0.0, 1.0, &Device::Cpu)?;
            Ok(Drawn {
                start,
                values,
                end: rng.clone(),
            })
        })
        .collect()
}

/// The trainer's draws ahead: what the last micro-step drew, and the helper thread drawing for the next one.
#[derive(Default)]
pub(crate) struct NoiseAhead {
    /// The noise draws of the last micro-step (what the next one is expected to draw).
    plan: Option<Vec<PlannedDraw>>,
    /// The micro-step (by its stream's seed) whose noise the helper thread draws.
    pending: Option<(u64, JoinHandle<Result<Vec<Drawn>>>)>,
}

impl NoiseAhead {
    /// The stream seeded with `seed` for the micro-step about to run, with what was drawn ahead for it; then starts
    /// drawing for the micro-step seeded with `next` (when there is one) as the last micro-step drew.
    pub(crate) fn stream(&mut self, seed: u64, next: Option<u64>) -> StepRng {
        let ahead = match self.pending.take() {
            // A helper that failed or panicked leaves the micro-step to draw inline.
            Some((s, handle)) if s == seed => handle.join().ok().and_then(Result::ok),
            // Drawn for another micro-step (the run changed course): left to finish on its own.
            _ => None,
        };
        if let (Some(next), Some(plan)) = (next, self.plan.clone()) {
            if !plan.is_empty() {
                let handle = std::thread::Builder::new()
                    .name("noise-ahead".into())
                    .spawn(move || draw_plan(next, &plan));
                // Without a thread the next micro-step draws inline.
                self.pending = handle.ok().map(|h| (next, h));
            }
        }
        StepRng::with_ahead(StdRng::seed_from_u64(seed), ahead.unwrap_or_default())
    }

    /// Keeps what the micro-step that used `rng` drew, for drawing the next ones ahead.
    pub(crate) fn record(&mut self, rng: StepRng) {
        self.plan = rng.plan;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    fn values(t: &Tensor) -> Vec<f32> {
        t.flatten_all()
            .and_then(|t| t.to_vec1::<f32>())
            .unwrap_or_default()
    }

    /// A micro-step as the families draw: a few words (timesteps), noise, more words, more noise.
    fn micro_step(rng: &mut StepRng, words: usize, shapes: &[(usize, usize)]) -> Vec<Vec<f32>> {
        let mut out = Vec::new();
        for &shape in shapes {
            for _ in 0..words {
                let _: f64 = rng.random();
            }
            let noise = rng.normal(shape, &Device::Cpu).map(|t| values(&t));
            out.push(noise.unwrap_or_default());
        }
        out.push(vec![rng.random::<f32>()]);
        out
    }

    fn inline(seed: u64, words: usize, shapes: &[(usize, usize)]) -> Vec<Vec<f32>> {
        micro_step(&mut StepRng::seeded(seed), words, shapes)
    }

    #[test]
    fn noise_drawn_ahead_is_the_inline_draw() {
        let mut ahead = NoiseAhead::default();
        let shapes = [(64, 33), (5, 7)];
        for i in 0..6u64 {
            let mut rng = ahead.stream(100 + i, Some(101 + i));
            let used_ahead = !rng.ahead.is_empty();
            let drawn = micro_step(&mut rng, 3, &shapes);
            ahead.record(rng);
            assert_eq!(drawn, inline(100 + i, 3, &shapes), "micro-step {i}");
            // The first micro-step has nothing to go by; the second's draw started while the first ran.
            assert_eq!(used_ahead, i >= 2, "micro-step {i}");
        }
    }

    #[test]
    fn a_different_draw_falls_back_to_drawing_inline() {
        let mut ahead = NoiseAhead::default();
        for (i, (words, shapes)) in [
            (3, vec![(8, 8)]),
            (3, vec![(8, 8)]),
            (4, vec![(8, 8)]), // more timestep words than the last micro-step drew
            (4, vec![(8, 9)]), // another shape
            (4, vec![(8, 9), (2, 2)]), // one draw more
            (4, vec![(8, 9)]),
        ]
        .into_iter()
        .enumerate()
        {
            let seed = 7 + i as u64;
            let mut rng = ahead.stream(seed, Some(seed + 1));
            let drawn = micro_step(&mut rng, words, &shapes);
            ahead.record(rng);
            assert_eq!(drawn, inline(seed, words, &shapes), "micro-step {i}");
        }
    }

    #[test]
    fn a_resumed_stream_draws_what_the_uninterrupted_one_did() {
        let shapes = [(16, 16)];
        let mut whole = NoiseAhead::default();
        let uninterrupted: Vec<_> = (0..5u64)
            .map(|i| {
                let mut rng = whole.stream(i, Some(i + 1));
                let d = micro_step(&mut rng, 2, &shapes);
                whole.record(rng);
                d
            })
            .collect();
        // Resumed at micro-step 3: a fresh NoiseAhead, nothing drawn ahead for it.
        let mut resumed = NoiseAhead::default();
        for i in 3..5u64 {
            let mut rng = resumed.stream(i, Some(i + 1));
            assert_eq!(micro_step(&mut rng, 2, &shapes), uninterrupted[i as usize]);
            resumed.record(rng);
        }
    }

    #[test]
    fn gaps_are_counted_in_words() {
        let start = StdRng::seed_from_u64(3);
        let mut rng = start.clone();
        let _: u64 = rng.next_u64();
        let _: u32 = rng.next_u32();
        let mut bytes = [0u8; 5];
        rng.fill_bytes(&mut bytes);
        assert_eq!(words_between(&start, &rng), Some(5));
        assert_eq!(words_between(&rng, &start), None);
    }
}
