//! Validation-loss tests on the demo model: validation leaves training bit-identical, evaluations repeat exactly,
//! the held-out split is deterministic and disjoint, `metrics.jsonl` records parse, and a resumed run evaluates
//! at the same steps with the same values.

use std::path::Path;

use crate::train::tests::start;
use crate::train::trainer::Trainer;
use crate::train::validation::hold_out;
use framesmith_config::metrics::{parse_row, MetricsRow};
use framesmith_config::protocol::ValidationLoss;
use framesmith_config::RunConfig;
use framesmith_nn::testing::f32_bits;

/// The demo run of `tests.rs`, evaluating every `validate_every` steps.
fn demo_config(dir: &Path, steps: usize, validate_every: Option<usize>) -> RunConfig {
    let mut config = crate::train::tests::demo_config(dir, steps);
    config.validation.validate_every_n_steps = validate_every;
    config
}

fn lora_bits(trainer: &Trainer) -> Vec<Vec<u32>> {
    trainer
        .loras()
        .vars()
        .iter()
        .map(|v| f32_bits(v.as_tensor()).expect("f32 LoRA"))
        .collect()
}

/// Trains to `steps` as the engine loop does: a step, then an evaluation when one is due.
fn train_to(trainer: &mut Trainer, steps: usize) -> (Vec<Option<u64>>, Vec<ValidationLoss>) {
    let (mut losses, mut evaluations) = (Vec::new(), Vec::new());
    while trainer.step() < steps {
        let report = trainer.train_step(&|| false).expect("step");
        losses.push(report.loss.map(f64::to_bits));
        if trainer.validation_due() {
            evaluations.push(
                trainer
                    .validate(&|| false)
                    .expect("validate")
                    .expect("validation on"),
            );
        }
    }
    (losses, evaluations)
}

#[test]
fn validation_on_trains_the_bit_identical_lora() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut off = start(&demo_config(&dir.path().join("off"), 6, None), None);
    let mut on = start(&demo_config(&dir.path().join("on"), 6, Some(2)), None);
    let (losses_off, none) = train_to(&mut off, 6);
    let (losses_on, evaluations) = train_to(&mut on, 6);
    assert!(none.is_empty());
    assert_eq!(
        evaluations.iter().map(|v| v.step).collect::<Vec<_>>(),
        [2, 4, 6]
    );
    assert!(evaluations
        .iter()
        .all(|v| v.loss.is_finite() && v.items == 2 && v.timesteps == 4));
    assert_eq!(losses_off, losses_on, "the training losses, bit for bit");
    assert_eq!(lora_bits(&off), lora_bits(&on), "the LoRA, bit for bit");
    assert_eq!(
        off.data.items().len(),
        on.data.items().len(),
        "generated held-out clips are extra"
    );
}

#[test]
fn an_evaluation_repeats_exactly_and_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = demo_config(&dir.path().join("a"), 3, Some(1));
    let mut trainer = start(&config, None);
    train_to(&mut trainer, 2);
    let before = lora_bits(&trainer);
    let first = trainer.validate(&|| false).expect("validate").expect("on");
    let second = trainer.validate(&|| false).expect("validate").expect("on");
    assert_eq!(first.loss.to_bits(), second.loss.to_bits());
    assert_eq!(
        lora_bits(&trainer),
        before,
        "an evaluation leaves the LoRA alone"
    );

    // Another run with the same seed sees the same items and noise: the same number at step 0.
    let fresh = |name: &str| {
        let mut t = start(&demo_config(&dir.path().join(name), 3, Some(1)), None);
        t.validate(&|| false).expect("validate").expect("on").loss
    };
    let (x, y) = (fresh("b"), fresh("c"));
    assert_eq!(x.to_bits(), y.to_bits());
    // Training moved the LoRA, so the loss after two steps differs from the untrained one.
    assert_ne!(x.to_bits(), first.loss.to_bits());
}

#[test]
fn the_held_out_split_is_deterministic_disjoint_and_leaves_something_to_train() {
    let items: Vec<(usize, usize)> = (0..20).map(|i| (i, 2)).collect();
    let (train, held) = hold_out(items.clone(), 0.25, 3).expect("split");
    let (train_again, held_again) = hold_out(items.clone(), 0.25, 3).expect("split");
    assert_eq!((&train, &held), (&train_again, &held_again));
    assert_eq!(held.len(), 5);
    assert!(train
        .iter()
        .all(|(i, repeats)| !held.contains(i) && *repeats == 2));
    let mut all: Vec<usize> = train
        .iter()
        .map(|(i, _)| *i)
        .chain(held.iter().copied())
        .collect();
    all.sort();
    assert_eq!(all, (0..20).collect::<Vec<_>>());
    let (_, other) = hold_out(items.clone(), 0.25, 4).expect("split");
    assert_ne!(held, other, "another seed holds out other items");
    // A tiny fraction still holds one item out; one that takes everything is refused, naming the setting.
    assert_eq!(hold_out(items.clone(), 0.01, 3).expect("split").1.len(), 1);
    let err = hold_out(items[..2].to_vec(), 0.9, 3)
        .expect_err("nothing left")
        .to_string();
    assert!(
        err.contains("validation.validation_split = 0.9") && err.contains("nothing to train on"),
        "{err}"
    );
}

#[test]
fn a_split_run_never_trains_on_its_held_out_items() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = demo_config(dir.path(), 2, Some(1));
    config.validation.validation_split = 0.25;
    let trainer = start(&config, None);
    let validation = trainer.validation.as_ref().expect("validation on");
    let held: Vec<&str> = validation.items.iter().map(|i| i.key.as_str()).collect();
    assert_eq!(held.len(), 2, "a quarter of the 8 demo clips");
    assert_eq!(trainer.data.items().len(), 6);
    assert!(trainer
        .data
        .items()
        .iter()
        .all(|i| !held.contains(&i.key.as_str())));
}

#[test]
fn metrics_records_parse_and_a_resumed_run_evaluates_at_the_same_steps() {
    let dir = tempfile::tempdir().expect("tempdir");
    let straight_dir = dir.path().join("straight");
    let mut straight = start(&demo_config(&straight_dir, 6, Some(3)), None);
    let (_, straight_evals) = train_to(&mut straight, 6);

    let split_dir = dir.path().join("split");
    let config = demo_config(&split_dir, 6, Some(3));
    let mut first = start(&config, None);
    let (_, mut resumed_evals) = train_to(&mut first, 4);
    first.save(false).expect("save");
    drop(first);
    let mut second = start(&config, Some(&split_dir));
    assert_eq!(second.step(), 4);
    resumed_evals.extend(train_to(&mut second, 6).1);
    let bits = |evals: &[ValidationLoss]| {
        evals
            .iter()
            .map(|v| (v.step, v.loss.to_bits()))
            .collect::<Vec<_>>()
    };
    assert_eq!(bits(&resumed_evals), bits(&straight_evals));
    assert_eq!(
        straight_evals.iter().map(|v| v.step).collect::<Vec<_>>(),
        [3, 6]
    );

    drop(second);
    let text = std::fs::read_to_string(split_dir.join("metrics.jsonl")).expect("metrics.jsonl");
    let rows: Vec<MetricsRow> = text.lines().map(|l| parse_row(l).expect("a row")).collect();
    let steps: Vec<usize> = rows
        .iter()
        .filter_map(|r| match r {
            MetricsRow::Step(s) => Some(s.step),
            _ => None,
        })
        .collect();
    assert_eq!(
        steps,
        [1, 2, 3, 4, 5, 6],
        "one training row per step, none repeated"
    );
    let validation: Vec<ValidationLoss> = rows
        .into_iter()
        .filter_map(|r| match r {
            MetricsRow::Validation(v) => Some(v),
            _ => None,
        })
        .collect();
    assert_eq!(bits(&validation), bits(&straight_evals));
}
