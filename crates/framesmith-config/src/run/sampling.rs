//! `training.timestep_sampling`: the modes by their musubi-tuner names, and what each draws ([`SamplingKind`]), so
//! the trainer draws from the kind and never names a mode that belongs to one model.

use serde::{Deserialize, Serialize};

/// How training timesteps are drawn (musubi-tuner's `timestep_sampling`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimestepSampling {
    Sigma,
    Uniform,
    Sigmoid,
    Shift,
    Logsnr,
    /// musubi-tuner's `qinglong_flux` (called `qinglong` before 2025-08-11): 80% resolution-shifted sigmoid,
    /// 7.5% logSNR(logit_mean, logit_std), 12.5% logSNR(5.36, 1).
    #[serde(alias = "qinglong_flux")]
    Qinglong,
    /// musubi-tuner's `qinglong_qwen`: as `qinglong` with the Qwen-Image resolution shift.
    QinglongQwen,
    /// sd-scripts' / musubi-tuner's `flux_shift`: a sigmoid draw shifted by FLUX.1's resolution-dependent shift
    /// exp(μ), μ linear in the packed token count through (256, 0.5) and (4096, 1.15).
    FluxShift,
    /// musubi-tuner's `qwen_shift`: a sigmoid draw shifted by Qwen-Image's resolution-dependent shift exp(μ), μ
    /// linear in the packed token count through (256, 0.5) and (8192, 0.9).
    QwenShift,
    /// ltx-trainer's `shifted_logit_normal` (LTX-2's official trainer): sigmoid(N(μ, 1)) with μ linear in the
    /// latent's token count through (1024, 0.95) and (4096, 2.05), stretched between its 0.5th and 99.9th
    /// percentiles, and a uniform draw 10% of the time.
    ShiftedLogitNormal,
}

impl TimestepSampling {
    /// Every mode by its TOML name, as the app lists them.
    pub const NAMES: [&'static str; 10] = [
        "sigma",
        "uniform",
        "sigmoid",
        "shift",
        "logsnr",
        "qinglong",
        "qinglong_qwen",
        "flux_shift",
        "qwen_shift",
        "shifted_logit_normal",
    ];

    /// Every mode, in the order of [`TimestepSampling::NAMES`].
    pub const ALL: [Self; 10] = [
        Self::Sigma,
        Self::Uniform,
        Self::Sigmoid,
        Self::Shift,
        Self::Logsnr,
        Self::Qinglong,
        Self::QinglongQwen,
        Self::FluxShift,
        Self::QwenShift,
        Self::ShiftedLogitNormal,
    ];

    /// What the mode draws.
    pub fn kind(self) -> SamplingKind {
        match self {
            Self::Sigma => SamplingKind::Sigma,
            Self::Uniform => SamplingKind::Uniform,
            Self::Sigmoid => SamplingKind::Sigmoid,
            Self::Shift => SamplingKind::Shift,
            Self::Logsnr => SamplingKind::Logsnr,
            Self::Qinglong => SamplingKind::Qinglong(ShiftLine::FLUX),
            Self::QinglongQwen => SamplingKind::Qinglong(ShiftLine::QWEN_IMAGE),
            Self::FluxShift => SamplingKind::ResolutionShift(ShiftLine::FLUX),
            Self::QwenShift => SamplingKind::ResolutionShift(ShiftLine::QWEN_IMAGE),
            Self::ShiftedLogitNormal => SamplingKind::ShiftedLogitNormal(ShiftLine::LTX2),
        }
    }
}

/// What a [`TimestepSampling`] mode draws (the trainer's semantics of each are musubi-tuner's).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SamplingKind {
    /// An integer timestep of the unshifted schedule.
    Sigma,
    /// Uniform on [0, 1].
    Uniform,
    /// sigmoid(scale · N(0, 1)).
    Sigmoid,
    /// The sigmoid draw shifted by `discrete_flow_shift`.
    Shift,
    /// sigmoid(−logSNR / 2) with logSNR ~ N(logit_mean, logit_std).
    Logsnr,
    /// The sigmoid draw shifted by the resolution-dependent shift of the line.
    ResolutionShift(ShiftLine),
    /// `qinglong`'s mix: 80% [`SamplingKind::ResolutionShift`] with the line, 7.5% logSNR(logit_mean, logit_std),
    /// 12.5% logSNR(5.36, 1).
    Qinglong(ShiftLine),
    /// A logit-normal draw of mean μ (the line's, at the latent's token count) and deviation 1, stretched between
    /// its 0.5th and 99.9th percentiles and reflected above 0.001, or a uniform draw 10% of the time.
    ShiftedLogitNormal(ShiftLine),
}

/// A resolution-dependent shift exp(μ): μ is linear in the packed token count (h/2)·(w/2) of the latent, through
/// the points (`tokens_1`, `mu_1`) and (`tokens_2`, `mu_2`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShiftLine {
    pub tokens_1: f64,
    pub mu_1: f64,
    pub tokens_2: f64,
    pub mu_2: f64,
}

impl ShiftLine {
    /// FLUX.1's line (sd-scripts' `flux_shift`, musubi-tuner's `qinglong_flux`): (256, 0.5) to (4096, 1.15).
    pub const FLUX: Self = Self {
        tokens_1: 256.0,
        mu_1: 0.5,
        tokens_2: 4096.0,
        mu_2: 1.15,
    };
    /// Qwen-Image's line (musubi-tuner's `qwen_shift`, `qinglong_qwen`): (256, 0.5) to (8192, 0.9).
    pub const QWEN_IMAGE: Self = Self {
        tokens_1: 256.0,
        mu_1: 0.5,
        tokens_2: 8192.0,
        mu_2: 0.9,
    };

    /// LTX-2's line (ltx-trainer's `_get_shift_for_sequence_length`), in the latent's tokens (1×1×1 patches,
    /// every frame): (1024, 0.95) to (4096, 2.05).
    pub const LTX2: Self = Self {
        tokens_1: 1024.0,
        mu_1: 0.95,
        tokens_2: 4096.0,
        mu_2: 2.05,
    };

    /// μ at `tokens` packed tokens.
    pub fn mu(self, tokens: f64) -> f64 {
        let slope = (self.mu_2 - self.mu_1) / (self.tokens_2 - self.tokens_1);
        slope * tokens + (self.mu_1 - slope * self.tokens_1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_resolution_shift_modes_take_musubi_tuners_lines() {
        let line = |mode: TimestepSampling| match mode.kind() {
            SamplingKind::ResolutionShift(line) | SamplingKind::Qinglong(line) => line,
            other => panic!("{mode:?} is {other:?}"),
        };
        // flux_shift: μ(4096) = 1.15; qwen_shift: μ(8192) = 0.9; both μ(256) = 0.5.
        assert!((line(TimestepSampling::FluxShift).mu(4096.0) - 1.15).abs() < 1e-12);
        assert!((line(TimestepSampling::QwenShift).mu(8192.0) - 0.9).abs() < 1e-12);
        for mode in [TimestepSampling::FluxShift, TimestepSampling::QwenShift] {
            assert!((line(mode).mu(256.0) - 0.5).abs() < 1e-12);
        }
        assert_eq!(
            line(TimestepSampling::Qinglong),
            line(TimestepSampling::FluxShift)
        );
        assert_eq!(
            line(TimestepSampling::QinglongQwen),
            line(TimestepSampling::QwenShift)
        );
        // At 4096 tokens Qwen-Image shifts less than FLUX.1 (μ 0.70 against 1.15).
        assert!(
            line(TimestepSampling::QwenShift).mu(4096.0)
                < line(TimestepSampling::FluxShift).mu(4096.0)
        );
    }

    #[test]
    fn the_names_are_the_toml_names_of_all_modes() {
        for (name, mode) in TimestepSampling::NAMES
            .into_iter()
            .zip(TimestepSampling::ALL)
        {
            let parsed: TimestepSampling = serde_json::from_value(serde_json::Value::from(name))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(parsed, mode);
            assert_eq!(
                serde_json::to_value(mode).ok(),
                Some(serde_json::Value::from(name))
            );
        }
    }
}
