//! Data-parallel training on the demo model, ranks as threads through the in-process CPU collective: the LoRA
//! of N ranks equals the one-process run with N times the accumulation; only rank 0 writes; resume is exact on
//! the same world size and refused on another.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::train::ranks::Ranks;
use crate::train::tests::{all_lora_values, demo_config, start};
use crate::train::trainer::Trainer;
use framesmith_config::protocol::StartRun;
use framesmith_config::RunConfig;
use framesmith_nn::collective::threads::ThreadGroup;
use framesmith_nn::collective::Collective;

/// What a rank ended with: its LoRA values and the losses it reported.
type RankResult = (Vec<Vec<f32>>, Vec<Option<f64>>);

/// Trains `config` to `steps` on `world` ranks (threads), each resuming from `resume` when given; saves a
/// training state at the end when `save`. Returns every rank's result, or the first rank's error.
fn train_ranks(
    config: &RunConfig,
    world: usize,
    steps: usize,
    resume: Option<&Path>,
    save: bool,
) -> anyhow::Result<Vec<RankResult>> {
    let handles: Vec<_> = ThreadGroup::ranks(world, Duration::from_secs(300))
        .into_iter()
        .map(|rank| {
            let request = StartRun {
                config: config.clone(),
                resume_from: resume.map(Path::to_path_buf),
            };
            std::thread::spawn(move || -> anyhow::Result<RankResult> {
                let collective: Arc<dyn Collective> = Arc::new(rank);
                let ranks = Ranks::Group(collective);
                let mut trainer = Trainer::start_ranked(&request, &ranks, &mut |_, _| {})?;
                let mut losses = Vec::new();
                while trainer.step() < steps {
                    losses.push(trainer.train_step(&|| false)?.loss);
                }
                if save {
                    trainer.save(false)?;
                }
                Ok((all_lora_values(&trainer)?, losses))
            })
        })
        .collect();
    let mut out = Vec::new();
    for h in handles {
        match h.join() {
            Ok(r) => out.push(r?),
            Err(_) => anyhow::bail!("a rank panicked"),
        }
    }
    Ok(out)
}

fn config(dir: &Path, steps: usize, accumulation: usize) -> RunConfig {
    let mut config = demo_config(dir, steps);
    config.training.gradient_accumulation_steps = accumulation;
    config
}

fn one_process(dir: &Path, steps: usize, accumulation: usize) -> RankResult {
    let mut trainer = start(&config(dir, steps, accumulation), None);
    let mut losses = Vec::new();
    while trainer.step() < steps {
        losses.push(trainer.train_step(&|| false).expect("step").loss);
    }
    (all_lora_values(&trainer).expect("f32 LoRA"), losses)
}

fn max_difference(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs()))
        .fold(0.0, f32::max)
}

fn run_folders(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default()
}

#[test]
fn ranks_with_one_micro_batch_each_train_the_one_process_lora_bit_exactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let steps = 3;
    for world in [2, 3] {
        let (single, single_losses) =
            one_process(&dir.path().join(format!("one-{world}")), steps, world);
        let ranks = train_ranks(
            &config(&dir.path().join(format!("ranks-{world}")), steps, 1),
            world,
            steps,
            None,
            false,
        )
        .expect("ranks train");
        assert_eq!(ranks.len(), world);
        for (rank, (lora, losses)) in ranks.iter().enumerate() {
            // The gradients are summed in the same order as the one process accumulates them: bit-exact.
            assert_eq!(lora, &single, "world {world}, rank {rank}");
            // The loss is summed in f32 over the ranks (in f64 by the one process): equal within f32 rounding.
            for (l, s) in losses.iter().zip(&single_losses) {
                let (l, s) = (l.expect("finite"), s.expect("finite"));
                assert!((l - s).abs() <= 1e-6 * s.abs().max(1.0), "{l} vs {s}");
            }
        }
    }
}

#[test]
fn ranks_with_accumulation_train_the_one_process_lora_within_rounding() {
    let dir = tempfile::tempdir().expect("tempdir");
    let steps = 3;
    let (single, _) = one_process(&dir.path().join("one"), steps, 4);
    let ranks = train_ranks(
        &config(&dir.path().join("ranks"), steps, 2),
        2,
        steps,
        None,
        false,
    )
    .expect("ranks train");
    // Every rank holds the same LoRA.
    assert_eq!(ranks[0].0, ranks[1].0);
    // ((a + b) + (c + d)) against (((a + b) + c) + d): equal up to f32 rounding, amplified a little by AdamW.
    let scale = single
        .iter()
        .flatten()
        .fold(0f32, |m, v| m.max(v.abs()))
        .max(1e-3);
    let diff = max_difference(&ranks[0].0, &single);
    assert!(
        diff <= 1e-4 * scale,
        "max difference {diff} (scale {scale})"
    );
    // Not trivially equal to the untrained or a one-micro-batch LoRA: the test can tell runs apart.
    let (other, _) = one_process(&dir.path().join("other"), steps, 2);
    assert!(max_difference(&other, &single) > 10.0 * diff.max(1e-7));
}

#[test]
fn only_rank_0_writes_and_resume_needs_the_same_world_size() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("out");
    let config = config(&out, 4, 1);
    // Straight through on two ranks.
    let straight = train_ranks(&config, 2, 4, None, false).expect("ranks train");
    // The same run stopped after step 2 and resumed on two ranks.
    let first_out = dir.path().join("first");
    let first_config = {
        let mut c = config.clone();
        c.output.output_dir = first_out.clone();
        c
    };
    train_ranks(&first_config, 2, 2, None, true).expect("first half");
    // One run folder (the configured one: rank 1 took none, so there is no `run-2`), one LoRA, one state.
    let entries = run_folders(&first_out);
    let names: Vec<String> = entries
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    assert!(!names.iter().any(|n| n.starts_with("run-")), "{names:?}");
    assert_eq!(
        names.iter().filter(|n| n.ends_with(".safetensors")).count(),
        1,
        "{names:?}"
    );
    assert_eq!(
        names.iter().filter(|n| n.contains("-state-")).count(),
        1,
        "{names:?}"
    );
    let metrics = std::fs::read_to_string(first_out.join("metrics.jsonl")).expect("metrics");
    assert_eq!(
        metrics.lines().count(),
        2,
        "one row per step, by rank 0 only:\n{metrics}"
    );
    let resumed =
        train_ranks(&first_config, 2, 4, Some(&first_out), false).expect("resumes on 2 ranks");
    assert_eq!(
        resumed[0].0, straight[0].0,
        "resume on the same world size is exact"
    );
    assert_eq!(resumed[1].0, straight[1].0);

    // Another world size is refused, saying why.
    let err = match train_ranks(&first_config, 3, 4, Some(&first_out), false) {
        Ok(_) => panic!("a state of 2 GPUs resumed on 3"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.contains("trained on 2 GPU(s) and this run has 3")
            && err.contains("Resume it on 2 GPU(s)"),
        "{err}"
    );
    let err = match Trainer::start(
        &StartRun {
            config: first_config.clone(),
            resume_from: Some(first_out.clone()),
        },
        &mut |_, _| {},
    ) {
        Ok(_) => panic!("a state of 2 GPUs resumed on 1"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.contains("trained on 2 GPU(s) and this run has 1"),
        "{err}"
    );
}

#[test]
fn a_stop_on_one_rank_stops_every_rank_after_the_same_step() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config(dir.path(), 10, 1);
    let handles: Vec<_> = ThreadGroup::ranks(2, Duration::from_secs(300))
        .into_iter()
        .map(|rank| {
            let request = StartRun {
                config: config.clone(),
                resume_from: None,
            };
            std::thread::spawn(move || -> anyhow::Result<usize> {
                let is_1 = rank.rank() == 1;
                let collective: Arc<dyn Collective> = Arc::new(rank);
                let mut trainer =
                    Trainer::start_ranked(&request, &Ranks::Group(collective), &mut |_, _| {})?;
                loop {
                    // Rank 1 alone is asked to stop during its third step.
                    let asked = is_1 && trainer.step() == 2;
                    let report = trainer.train_step(&|| asked)?;
                    if report.stop_requested {
                        return Ok(trainer.step());
                    }
                    anyhow::ensure!(trainer.step() < 10, "never stopped");
                }
            })
        })
        .collect();
    for h in handles {
        let stopped_at = h.join().expect("no panic").expect("trains");
        assert_eq!(stopped_at, 3);
    }
}
