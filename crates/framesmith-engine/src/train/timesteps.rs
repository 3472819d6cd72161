//! Training timestep sampling and per-sample loss weighting, with musubi-tuner's semantics (v0.2.8,
//! `get_noisy_model_input_and_timesteps` and `compute_loss_weighting_for_sd3`), as pure functions of a seeded RNG.
//!
//! Conventions, as in musubi-tuner:
//! - `t` is the flow-matching sigma: the noisy input is `(1 − t)·latents + t·noise` and the target `noise − latents`;
//! - the DiT is given `model_timestep`: `t·1000 + 1` in the continuous modes (so 1 to 1001: musubi's
//!   `timesteps += 1` after `t * 1000`, which offsets the model's timestep from the noise level by 0.001) and the
//!   integer schedule timestep `t·1000` (1 to 1000) in `sigma` mode, where `t` is read off the schedule;
//! - `min_timestep` / `max_timestep` are in timestep units (0 to 1000).
//!
//! One deliberate difference: in `sigma` mode musubi-tuner indexes its descending schedule with the range, which
//! mirrors it (`max_timestep = 500` trains timesteps 501 to 1000). Here every mode keeps timesteps inside
//! [min_timestep, max_timestep]; with the default 0 and 1000 both give timesteps 1 to 1000.

use rand::rngs::StdRng;
use rand::Rng;
use rand_distr::{Distribution, StandardNormal};

use framesmith_config::run::{SamplingKind, ShiftLine, TimestepSampling, WeightingScheme};
use framesmith_config::training::{TimestepConfig, NUM_TRAIN_TIMESTEPS};

/// Mean and standard deviation of the second logSNR component of `qinglong` sampling.
const QINGLONG_LOGSNR2: (f64, f64) = (5.36, 1.0);

/// Tries per sample before `preserve_distribution_shape` falls back to scaling.
const MAX_REJECTION_TRIES: usize = 1000;

/// One sample's timestep.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimestepDraw {
    /// Noise level in [0, 1]: noisy input = (1 − t)·latents + t·noise.
    pub t: f64,
    /// The timestep given to the DiT (see the module docs for the +1).
    pub model_timestep: f64,
}

/// Draws one timestep per sample. `latent_hw` is the latent (height, width) of the batch, used only by the
/// resolution-dependent shifts ([`SamplingKind::ResolutionShift`], [`SamplingKind::Qinglong`],
/// [`SamplingKind::ShiftedLogitNormal`], which counts one frame).
pub fn sample_timesteps(
    cfg: &TimestepConfig,
    batch: usize,
    latent_hw: (usize, usize),
    rng: &mut StdRng,
) -> Vec<TimestepDraw> {
    sample_clip_timesteps(cfg, batch, (1, latent_hw.0, latent_hw.1), rng)
}

/// [`sample_timesteps`] for a batch of latent clips of `(frames, height, width)`: the frames count only in
/// [`SamplingKind::ShiftedLogitNormal`]'s token count.
pub fn sample_clip_timesteps(
    cfg: &TimestepConfig,
    batch: usize,
    latent: (usize, usize, usize),
    rng: &mut StdRng,
) -> Vec<TimestepDraw> {
    (0..batch).map(|_| sample_one(cfg, latent, rng)).collect()
}

/// Whether a draw belongs to the high-noise expert of a run of two experts: at or above `boundary` (timesteps,
/// 0..1000).
pub fn is_high_noise(draw: &TimestepDraw, boundary: f64) -> bool {
    draw.t * NUM_TRAIN_TIMESTEPS as f64 >= boundary
}

/// [`sample_timesteps`] for a run of two experts split at `boundary`, as musubi-tuner draws them: the first sample's
/// timestep picks the expert, and each other sample is drawn again (at most `MAX_REJECTION_TRIES` times) until
/// it falls on that expert's side of `boundary`, so the whole batch runs through one expert. Returns whether
/// that is the high-noise expert.
pub fn sample_expert_timesteps(
    cfg: &TimestepConfig,
    batch: usize,
    latent_hw: (usize, usize),
    rng: &mut StdRng,
    boundary: f64,
) -> (bool, Vec<TimestepDraw>) {
    let latent = (1, latent_hw.0, latent_hw.1);
    let first = sample_one(cfg, latent, rng);
    let high = is_high_noise(&first, boundary);
    let mut draws = vec![first];
    for _ in 1..batch {
        let mut draw = sample_one(cfg, latent, rng);
        for _ in 1..MAX_REJECTION_TRIES {
            if is_high_noise(&draw, boundary) == high {
                break;
            }
            draw = sample_one(cfg, latent, rng);
        }
        draws.push(draw);
    }
    (high, draws)
}

fn sample_one(
    cfg: &TimestepConfig,
    latent: (usize, usize, usize),
    rng: &mut StdRng,
) -> TimestepDraw {
    if cfg.sampling == TimestepSampling::Sigma {
        return sample_sigma(cfg, rng);
    }
    let lo = cfg.min_timestep / NUM_TRAIN_TIMESTEPS as f64;
    let hi = cfg.max_timestep / NUM_TRAIN_TIMESTEPS as f64;
    let t = if cfg.preserve_distribution_shape {
        (0..MAX_REJECTION_TRIES)
            .map(|_| raw_t(cfg, latent, rng))
            .find(|t| (lo..=hi).contains(t))
            .unwrap_or_else(|| raw_t(cfg, latent, rng) * (hi - lo) + lo)
    } else {
        raw_t(cfg, latent, rng) * (hi - lo) + lo
    };
    TimestepDraw {
        t,
        model_timestep: t * NUM_TRAIN_TIMESTEPS as f64 + 1.0,
    }
}

/// `sigma` mode: a uniform integer timestep of the unshifted 1000-step schedule (musubi's scheduler is built with
/// `shift` but applies it only in `set_timesteps`, so training sigmas are `timestep / 1000`).
fn sample_sigma(cfg: &TimestepConfig, rng: &mut StdRng) -> TimestepDraw {
    let lo = cfg.min_timestep.floor();
    let hi = cfg.max_timestep.floor();
    let u: f64 = rng.random();
    // Timesteps min+1 ..= max: musubi's 1 ..= 1000 at the default range.
    let offset = (u * (hi - lo)).floor().min(hi - lo - 1.0).max(0.0);
    let timestep = hi - offset;
    TimestepDraw {
        t: timestep / NUM_TRAIN_TIMESTEPS as f64,
        model_timestep: timestep,
    }
}

fn normal(rng: &mut StdRng) -> f64 {
    StandardNormal.sample(rng)
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// The SD3 / flow-matching time shift t ↦ s·t / (1 + (s − 1)·t).
pub fn shift_t(t: f64, shift: f64) -> f64 {
    (t * shift) / (1.0 + (shift - 1.0) * t)
}

/// A draw of the mode's distribution on [0, 1], before the range is applied, for a latent of `(frames, height,
/// width)`.
fn raw_t(cfg: &TimestepConfig, (f, h, w): (usize, usize, usize), rng: &mut StdRng) -> f64 {
    let latent_hw = (h, w);
    match cfg.sampling.kind() {
        // Handled by `sample_sigma`; uniform here keeps the match total.
        SamplingKind::Sigma | SamplingKind::Uniform => rng.random(),
        SamplingKind::Sigmoid => sigmoid(cfg.sigmoid_scale * normal(rng)),
        SamplingKind::Shift => shifted_sigmoid(cfg, cfg.discrete_flow_shift, rng),
        SamplingKind::Logsnr => logsnr_t(cfg.logit_mean, cfg.logit_std, rng),
        SamplingKind::ResolutionShift(line) => {
            shifted_sigmoid(cfg, resolution_shift(line, latent_hw), rng)
        }
        SamplingKind::Qinglong(line) => {
            let decision: f64 = rng.random();
            if decision < 0.80 {
                shifted_sigmoid(cfg, resolution_shift(line, latent_hw), rng)
            } else if decision < 0.875 {
                logsnr_t(cfg.logit_mean, cfg.logit_std, rng)
            } else {
                logsnr_t(QINGLONG_LOGSNR2.0, QINGLONG_LOGSNR2.1, rng)
            }
        }
        SamplingKind::ShiftedLogitNormal(line) => {
            shifted_logit_normal(line.mu((f * h * w) as f64), rng)
        }
    }
}

/// ltx-trainer's `ShiftedLogitNormalTimestepSampler` (Lightricks/LTX-2 @400fd31, timestep_samplers.py:48-120) at
/// mean `mu`: sigmoid(N(mu, 1)) stretched so its 0.5th and 99.9th percentiles become 0 and 1, reflected above
/// 0.001 and clamped to [0, 1]; with probability 0.1 a uniform draw on [0.001, 1] instead.
fn shifted_logit_normal(mu: f64, rng: &mut StdRng) -> f64 {
    const EPS: f64 = 1e-3;
    const UNIFORM_PROB: f64 = 0.1;
    const PERCENTILE_999: f64 = 3.0902;
    const PERCENTILE_005: f64 = -2.5758;
    let drawn = sigmoid(mu + normal(rng));
    let (lo, hi) = (sigmoid(mu + PERCENTILE_005), sigmoid(mu + PERCENTILE_999));
    let raw = (drawn - lo) / (hi - lo);
    let stretched = if raw >= EPS { raw } else { 2.0 * EPS - raw }.clamp(0.0, 1.0);
    let uniform = (1.0 - EPS) * rng.random::<f64>() + EPS;
    if rng.random::<f64>() > UNIFORM_PROB {
        stretched
    } else {
        uniform
    }
}

fn shifted_sigmoid(cfg: &TimestepConfig, shift: f64, rng: &mut StdRng) -> f64 {
    shift_t(sigmoid(cfg.sigmoid_scale * normal(rng)), shift)
}

/// t = sigmoid(−logSNR / 2) with logSNR ~ N(mean, std) (arXiv 2411.14793).
fn logsnr_t(mean: f64, std: f64, rng: &mut StdRng) -> f64 {
    let logsnr = mean + std * normal(rng);
    sigmoid(-logsnr / 2.0)
}

/// The resolution-dependent shift exp(μ) of a latent of (h, w): μ on `line` at its packed token count (h/2)·(w/2).
pub fn resolution_shift(line: ShiftLine, latent_hw: (usize, usize)) -> f64 {
    let tokens = ((latent_hw.0 / 2) * (latent_hw.1 / 2)) as f64;
    line.mu(tokens).exp()
}

/// The loss weight of a sample with the given model timestep. musubi-tuner looks the timestep up in the
/// unshifted 1000-step schedule (nearest entry, so `t·1000 + 1` maps to sigma ≈ t + 0.001) and weighs by
/// `sigma_sqrt`: σ⁻², or `cosmap`: 2 / (π(1 − 2σ + 2σ²)); `none` weighs 1. musubi-tuner evaluates this in the
/// DiT dtype (bf16, which rounds σ to 8 significant bits); here it is exact.
pub fn loss_weight(scheme: WeightingScheme, model_timestep: f64) -> f64 {
    let sigma = schedule_sigma(model_timestep);
    match scheme {
        WeightingScheme::None => 1.0,
        WeightingScheme::SigmaSqrt => sigma.powi(-2),
        WeightingScheme::Cosmap => {
            2.0 / (std::f64::consts::PI * (1.0 - 2.0 * sigma + 2.0 * sigma * sigma))
        }
    }
}

/// The schedule sigma nearest to a model timestep (ties go to the larger timestep, as torch's `argmin` over the
/// descending schedule does).
fn schedule_sigma(model_timestep: f64) -> f64 {
    let max = NUM_TRAIN_TIMESTEPS as f64;
    let nearest = (model_timestep + 0.5).floor().clamp(1.0, max);
    nearest / max
}

// Tests may unwrap (STYLE.md: no unwrap outside tests); the crate-wide lint does not know about tests.
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    fn draws(cfg: &TimestepConfig, n: usize) -> Vec<TimestepDraw> {
        let mut rng = StdRng::seed_from_u64(7);
        sample_timesteps(cfg, n, (60, 104), &mut rng)
    }

    fn mean_t(draws: &[TimestepDraw]) -> f64 {
        draws.iter().map(|d| d.t).sum::<f64>() / draws.len() as f64
    }

    fn cfg(sampling: TimestepSampling) -> TimestepConfig {
        TimestepConfig {
            sampling,
            ..TimestepConfig::default()
        }
    }

    #[test]
    fn a_batch_of_both_experts_stays_on_the_first_draws_side() {
        let cfg = cfg(TimestepSampling::Shift);
        let mut rng = StdRng::seed_from_u64(11);
        let (mut high, mut low) = (0usize, 0usize);
        for _ in 0..400 {
            let (is_high, draws) = sample_expert_timesteps(&cfg, 4, (60, 104), &mut rng, 875.0);
            assert_eq!(draws.len(), 4);
            assert!(draws.iter().all(|d| is_high_noise(d, 875.0) == is_high));
            *if is_high { &mut high } else { &mut low } += 1;
        }
        // The first draw is an ordinary draw: batches go high as often as single draws land high.
        let share = high as f64 / (high + low) as f64;
        let singles = sample_timesteps(&cfg, 4000, (60, 104), &mut StdRng::seed_from_u64(12));
        let expected = singles.iter().filter(|d| is_high_noise(d, 875.0)).count() as f64 / 4000.0;
        assert!(
            (share - expected).abs() < 0.06,
            "high-noise share {share}, single draws {expected}"
        );
        // One sample draws exactly what the one-expert sampler draws.
        let (a, b) = (&mut StdRng::seed_from_u64(5), &mut StdRng::seed_from_u64(5));
        let (_, one) = sample_expert_timesteps(&cfg, 1, (60, 104), a, 875.0);
        assert_eq!(one[0].t, sample_timesteps(&cfg, 1, (60, 104), b)[0].t);
    }

    #[test]
    fn shift_formula_exact_values() {
        assert_eq!(shift_t(0.5, 3.0), 0.75);
        assert_eq!(shift_t(0.25, 3.0), 0.5);
        assert_eq!(shift_t(0.0, 3.0), 0.0);
        assert_eq!(shift_t(1.0, 3.0), 1.0);
        assert_eq!(shift_t(0.3, 1.0), 0.3);
        assert!((shift_t(0.2, 5.0) - 1.0 / 1.8).abs() < 1e-15);
    }

    #[test]
    fn every_mode_stays_in_range_with_plus_one() {
        for sampling in [
            TimestepSampling::Uniform,
            TimestepSampling::Sigmoid,
            TimestepSampling::Shift,
            TimestepSampling::Logsnr,
            TimestepSampling::Qinglong,
            TimestepSampling::QinglongQwen,
        ] {
            for d in draws(&cfg(sampling), 2000) {
                assert!((0.0..=1.0).contains(&d.t), "{sampling:?} {d:?}");
                assert_eq!(d.model_timestep, d.t * 1000.0 + 1.0);
            }
        }
    }

    #[test]
    fn means_match_the_distributions() {
        // Uniform: 0.5. Sigmoid of a symmetric normal: 0.5. Shift 3 of sigmoid(N(0,1)): E = 0.7140 (quadrature).
        // logSNR N(0,1): symmetric around 0.5. Tolerances are ~5 standard errors at n = 20000.
        let n = 20_000;
        let expect = [
            (TimestepSampling::Uniform, 0.5, 0.011),
            (TimestepSampling::Sigmoid, 0.5, 0.008),
            (TimestepSampling::Logsnr, 0.5, 0.005),
        ];
        for (sampling, mean, tol) in expect {
            let m = mean_t(&draws(&cfg(sampling), n));
            assert!((m - mean).abs() < tol, "{sampling:?}: mean {m}");
        }
        let shifted = mean_t(&draws(&cfg(TimestepSampling::Shift), n));
        assert!((0.709..0.719).contains(&shifted), "shift mean {shifted}");
        // Shift moves mass toward t = 1; the median maps exactly: shift_t(0.5, 3) = 0.75.
        let mut ts: Vec<f64> = draws(&cfg(TimestepSampling::Shift), n)
            .iter()
            .map(|d| d.t)
            .collect();
        ts.sort_by(f64::total_cmp);
        assert!(
            (ts[n / 2] - 0.75).abs() < 0.01,
            "shift median {}",
            ts[n / 2]
        );
    }

    #[test]
    fn qinglong_mixes_three_components() {
        // 12.5% of draws come from logSNR N(5.36, 1), whose t = sigmoid(-logsnr/2) is below 0.15 97% of the time;
        // the other two parts put 0.7% and 0.03% there: 0.127 in all (quadrature).
        let d = draws(&cfg(TimestepSampling::Qinglong), 20_000);
        let low = d.iter().filter(|d| d.t < 0.15).count() as f64 / d.len() as f64;
        assert!((0.115..0.139).contains(&low), "fraction below 0.15: {low}");
        // 60x104 latent: 30*52 = 1560 tokens, mu = 0.5 + 1304 * 0.65 / 3840.
        let expected = (0.5 + 1304.0 * 0.65 / 3840.0_f64).exp();
        assert!(
            (resolution_shift(line(TimestepSampling::Qinglong), (60, 104)) - expected).abs()
                < 1e-12
        );
        let qwen = (0.5 + 1304.0 * 0.4 / 7936.0_f64).exp();
        let shift = resolution_shift(line(TimestepSampling::QinglongQwen), (60, 104));
        assert!((shift - qwen).abs() < 1e-12);
    }

    /// The line of a mode with a resolution-dependent shift.
    fn line(mode: TimestepSampling) -> ShiftLine {
        match mode.kind() {
            SamplingKind::ResolutionShift(line) | SamplingKind::Qinglong(line) => line,
            other => panic!("{mode:?} draws {other:?}"),
        }
    }

    /// Every mode that is a sigmoid draw shifted by the resolution, with its line.
    fn resolution_modes() -> Vec<(TimestepSampling, ShiftLine)> {
        let modes: Vec<_> = TimestepSampling::ALL
            .into_iter()
            .filter_map(|mode| match mode.kind() {
                SamplingKind::ResolutionShift(line) => Some((mode, line)),
                _ => None,
            })
            .collect();
        assert!(modes.len() >= 2, "{modes:?}");
        modes
    }

    #[test]
    fn resolution_shift_modes_are_the_sigmoid_shifted_by_their_line() {
        // As sd-scripts and musubi-tuner draw them: the `shift` mode's draw with exp(μ) of the packed token count
        // as its shift, μ on the mode's line through (tokens_1, mu_1) and (tokens_2, mu_2).
        for (mode, line) in resolution_modes() {
            for (hw, tokens) in [
                ((32, 32), 256.0),
                ((128, 128), 4096.0),
                ((60, 104), 1560.0),
                ((128, 256), 8192.0),
            ] {
                let slope = (line.mu_2 - line.mu_1) / (line.tokens_2 - line.tokens_1);
                let mu = line.mu_1 + (tokens - line.tokens_1) * slope;
                let drawn = sample_timesteps(&cfg(mode), 500, hw, &mut StdRng::seed_from_u64(3));
                let shift = TimestepConfig {
                    discrete_flow_shift: mu.exp(),
                    ..cfg(TimestepSampling::Shift)
                };
                let shifted = sample_timesteps(&shift, 500, hw, &mut StdRng::seed_from_u64(3));
                for (a, b) in drawn.iter().zip(&shifted) {
                    assert!((a.t - b.t).abs() < 1e-12, "{mode:?} {hw:?}: {a:?} vs {b:?}");
                    assert_eq!(a.model_timestep, a.t * 1000.0 + 1.0);
                }
            }
        }
    }

    #[test]
    fn resolution_shift_modes_train_larger_images_at_higher_noise() {
        // The median of a sigmoid draw shifted by s is s / (1 + s): 0.62 at 256 tokens (μ 0.5 on every line), and
        // higher for larger images.
        for (mode, line) in resolution_modes() {
            let median = |hw| {
                let mut ts: Vec<f64> =
                    sample_timesteps(&cfg(mode), 20_001, hw, &mut StdRng::seed_from_u64(5))
                        .iter()
                        .map(|d| d.t)
                        .collect();
                ts.sort_by(f64::total_cmp);
                ts[10_000]
            };
            let expected = |hw| {
                let s = resolution_shift(line, hw);
                s / (1.0 + s)
            };
            assert!((median((32, 32)) - 0.6225).abs() < 0.01, "{mode:?}");
            assert!((expected((32, 32)) - 0.6225).abs() < 0.001, "{mode:?}");
            assert!(
                (median((128, 128)) - expected((128, 128))).abs() < 0.01,
                "{mode:?}"
            );
            assert!(median((128, 128)) > median((32, 32)) + 0.02, "{mode:?}");
        }
    }

    #[test]
    fn sigma_mode_draws_integer_schedule_timesteps() {
        let d = draws(&cfg(TimestepSampling::Sigma), 20_000);
        let mut seen_max = false;
        let mut seen_min = false;
        for x in &d {
            assert_eq!(x.model_timestep.fract(), 0.0);
            assert!((1.0..=1000.0).contains(&x.model_timestep), "{x:?}");
            assert_eq!(x.t, x.model_timestep / 1000.0);
            seen_max |= x.model_timestep >= 995.0;
            seen_min |= x.model_timestep <= 5.0;
        }
        assert!(seen_max && seen_min);
        assert!((mean_t(&d) - 0.5005).abs() < 0.011);
    }

    #[test]
    fn range_limits_every_mode() {
        for sampling in [
            TimestepSampling::Sigma,
            TimestepSampling::Shift,
            TimestepSampling::Uniform,
        ] {
            for preserve in [false, true] {
                let c = TimestepConfig {
                    sampling,
                    min_timestep: 200.0,
                    max_timestep: 500.0,
                    preserve_distribution_shape: preserve,
                    ..TimestepConfig::default()
                };
                for d in draws(&c, 3000) {
                    assert!((0.2..=0.5).contains(&d.t), "{sampling:?} {d:?}");
                    assert!((201.0..=501.0).contains(&d.model_timestep), "{d:?}");
                }
            }
        }
    }

    #[test]
    fn preserving_the_shape_differs_from_scaling() {
        // Shift 3 on [0, 500]: scaling squeezes the whole distribution (mean 0.7140 / 2 = 0.3570); rejection keeps
        // only the part already below 0.5 (mean 0.3825, by quadrature).
        let base = TimestepConfig {
            sampling: TimestepSampling::Shift,
            min_timestep: 0.0,
            max_timestep: 500.0,
            ..TimestepConfig::default()
        };
        let scaled = mean_t(&draws(&base, 10_000));
        let rejected = mean_t(&draws(
            &TimestepConfig {
                preserve_distribution_shape: true,
                ..base
            },
            10_000,
        ));
        assert!((scaled - 0.3570).abs() < 0.006, "scaled {scaled}");
        assert!((rejected - 0.3825).abs() < 0.006, "rejected {rejected}");
    }

    #[test]
    fn same_seed_same_draws() {
        let c = cfg(TimestepSampling::Qinglong);
        assert_eq!(draws(&c, 64), draws(&c, 64));
    }

    /// The means of ltx-trainer's sampler at 1024, 4096 and 6144 tokens (2,000,000 draws of
    /// `ShiftedLogitNormalTimestepSampler().sample(n, tokens)`, torch 2.15): 0.6259, 0.7429, 0.7890.
    #[test]
    fn shifted_logit_normal_matches_the_official_sampler_by_token_count() {
        let cfg = cfg(TimestepSampling::ShiftedLogitNormal);
        for ((f, h, w), official) in [
            ((1, 32, 32), 0.6259),
            ((4, 32, 32), 0.7429),
            ((16, 16, 24), 0.7890),
        ] {
            let draws =
                sample_clip_timesteps(&cfg, 200_000, (f, h, w), &mut StdRng::seed_from_u64(7));
            assert!(draws.iter().all(|d| (0.0..=1.0).contains(&d.t)));
            let mean = mean_t(&draws);
            assert!(
                (mean - official).abs() < 0.005,
                "{f}x{h}x{w}: {mean} vs {official}"
            );
        }
        // Images count one frame: the same draws as a one-frame clip.
        let image = sample_timesteps(&cfg, 8, (32, 32), &mut StdRng::seed_from_u64(1));
        let clip = sample_clip_timesteps(&cfg, 8, (1, 32, 32), &mut StdRng::seed_from_u64(1));
        assert_eq!(image, clip);
    }

    #[test]
    fn loss_weights() {
        assert_eq!(loss_weight(WeightingScheme::None, 501.0), 1.0);
        // model timestep 500.0 + 1 -> sigma 0.501
        assert!(
            (loss_weight(WeightingScheme::SigmaSqrt, 501.0) - 1.0 / (0.501f64 * 0.501)).abs()
                < 1e-12
        );
        assert_eq!(loss_weight(WeightingScheme::SigmaSqrt, 1000.0), 1.0);
        assert_eq!(
            loss_weight(WeightingScheme::SigmaSqrt, 1001.0),
            1.0,
            "1001 is clamped onto 1000"
        );
        // cosmap at sigma 0.5 is 2 / (pi * 0.5) = 4 / pi, its maximum.
        assert!(
            (loss_weight(WeightingScheme::Cosmap, 500.0) - 4.0 / std::f64::consts::PI).abs()
                < 1e-12
        );
        assert!(
            (loss_weight(WeightingScheme::Cosmap, 1000.0) - 2.0 / std::f64::consts::PI).abs()
                < 1e-12
        );
        // Nearest schedule entry; a tie goes to the larger timestep.
        assert_eq!(schedule_sigma(250.4), 0.25);
        assert_eq!(schedule_sigma(250.5), 0.251);
        assert_eq!(schedule_sigma(0.2), 0.001);
    }
}
