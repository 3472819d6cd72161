//! Validation of `[validation]`: the schedule, the held-out fraction and the fixed timesteps. Whether the dataset
//! config has `[[validation_datasets]]` is known only once it is read, so the engine checks that part.

use super::plan::{validation_sigmas, ValidationPlan};
use super::run::RunConfig;
use super::validate::{period, Checker};

/// Most timesteps an evaluation may take (each is a forward pass per item).
pub const MAX_VALIDATION_TIMESTEPS: usize = 64;

pub(crate) fn check_validation(c: &mut Checker, cfg: &RunConfig) -> Option<ValidationPlan> {
    let v = &cfg.validation;
    let every_n_steps = period(v.validate_every_n_steps);
    let every_n_epochs = period(v.validate_every_n_epochs);
    let scheduled = every_n_steps.is_some() || every_n_epochs.is_some() || v.validate_at_save;
    let split = v.validation_split;
    if !(split.is_finite() && (0.0..1.0).contains(&split)) {
        c.problem(
            "validation.validation_split",
            format!("must be a fraction in (0, 1), or 0 for none, not {split}"),
            "use e.g. validation_split = 0.1 to hold out a tenth of the training items, or 0",
        );
    }
    if v.num_timesteps == 0 || v.num_timesteps > MAX_VALIDATION_TIMESTEPS {
        c.problem(
            "validation.num_timesteps",
            format!(
                "must be 1 to {MAX_VALIDATION_TIMESTEPS}, not {}",
                v.num_timesteps
            ),
            "use e.g. num_timesteps = 4 (each is one forward pass per validation item)",
        );
    }
    if !scheduled {
        if split > 0.0 {
            c.note(
                "validation.validation_split is ignored: no evaluation is scheduled (set \
                 validation.validate_every_n_steps), so no training item is held out",
            );
        }
        return None;
    }
    let t = &cfg.training;
    Some(ValidationPlan {
        every_n_steps,
        every_n_epochs,
        at_save: v.validate_at_save,
        split: (split > 0.0 && split < 1.0).then_some(split),
        seed: v.validation_seed.unwrap_or(t.seed),
        sigmas: validation_sigmas(
            v.num_timesteps.clamp(1, MAX_VALIDATION_TIMESTEPS),
            t.min_timestep,
            t.max_timestep,
        ),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use crate::plan::validation_sigmas;
    use crate::{validate, HostInfo, RunConfig};

    fn demo() -> RunConfig {
        let mut cfg = RunConfig::default();
        cfg.model.demo = true;
        cfg.dataset.synthetic = true;
        cfg.training.device = crate::run::DeviceSpec::Cpu;
        cfg
    }

    #[test]
    fn nothing_scheduled_is_no_validation() {
        let plan = validate(&demo(), &HostInfo::cpu_only()).unwrap();
        assert_eq!(plan.validation, None);
        let mut cfg = demo();
        cfg.validation.validation_split = 0.2;
        let plan = validate(&cfg, &HostInfo::cpu_only()).unwrap();
        assert_eq!(
            plan.validation, None,
            "a split without a schedule holds nothing out"
        );
        assert!(
            plan.notes
                .iter()
                .any(|n| n.contains("validation_split is ignored")),
            "{:?}",
            plan.notes
        );
    }

    #[test]
    fn a_schedule_resolves_seed_split_and_timesteps() {
        let mut cfg = demo();
        cfg.validation.validate_every_n_steps = Some(50);
        cfg.validation.validation_split = 0.25;
        cfg.validation.num_timesteps = 4;
        cfg.training.seed = 7;
        cfg.training.min_timestep = 200.0;
        cfg.training.max_timestep = 600.0;
        let v = validate(&cfg, &HostInfo::cpu_only())
            .unwrap()
            .validation
            .unwrap();
        assert_eq!(v.every_n_steps, Some(50));
        assert_eq!(v.split, Some(0.25));
        assert_eq!(v.seed, 7, "the training seed when validation_seed is unset");
        assert!(v
            .sigmas
            .iter()
            .zip(&[0.25, 0.35, 0.45, 0.55])
            .all(|(a, b)| (a - b).abs() < 1e-12));
        assert!(v.due(100, None, false) && !v.due(101, None, false) && !v.due(0, None, false));
        cfg.validation.validation_seed = Some(9);
        let v = validate(&cfg, &HostInfo::cpu_only())
            .unwrap()
            .validation
            .unwrap();
        assert_eq!(v.seed, 9);
    }

    #[test]
    fn bad_fractions_and_timestep_counts_name_the_key_and_the_fix() {
        for bad in [-0.1, 1.0, 1.5, f64::NAN] {
            let mut cfg = demo();
            cfg.validation.validate_every_n_steps = Some(10);
            cfg.validation.validation_split = bad;
            cfg.validation.num_timesteps = 0;
            let errors = validate(&cfg, &HostInfo::cpu_only()).unwrap_err();
            let split = errors.for_key("validation.validation_split").unwrap();
            assert!(split.message.contains("(0, 1)"), "{split}");
            assert!(split.fix.contains("validation_split = 0.1"), "{split}");
            assert!(errors.for_key("validation.num_timesteps").is_some());
        }
    }

    #[test]
    fn at_save_and_epochs_schedule_too() {
        let mut cfg = demo();
        cfg.validation.validate_at_save = true;
        cfg.validation.validate_every_n_epochs = Some(2);
        let v = validate(&cfg, &HostInfo::cpu_only())
            .unwrap()
            .validation
            .unwrap();
        assert!(v.due(7, None, true));
        assert!(v.due(8, Some(2), false) && !v.due(8, Some(1), false));
        assert_eq!(validation_sigmas(2, 0.0, 1000.0), [0.25, 0.75]);
    }
}
