//! A finished run read back from its output folder (`metrics.jsonl`, `samples/`, `run.toml` and its prompt file's
//! texts and control images) as the events the engine sent while it ran, so
//! `framesmith --screenshot shot.png --run DIR` shows a real run.

use std::path::{Path, PathBuf};

use framesmith_config::metrics::{parse_row, MetricsRow};
use framesmith_config::protocol::{Event, LogLevel, Progress, RunState};
use framesmith_config::RunConfig;

/// Weight of the newest loss in the smoothed loss (the engine's exponential moving average).
const SMOOTHING: f64 = 0.05;

/// The events of the run whose outputs are in `dir`: its progress, its samples, and its end.
pub fn run_events(dir: &Path) -> Result<Vec<Event>, String> {
    let config = RunConfig::load(&dir.join("run.toml")).map_err(|err| format!("{err:#}"))?;
    let total_steps = config.training.max_train_steps;
    let mut events = vec![
        Event::Log {
            level: LogLevel::Info,
            message: format!("Replayed from {}", dir.display()),
        },
        Event::StateChanged(RunState::Training),
    ];
    events.extend(progress_events(&dir.join("metrics.jsonl"), total_steps)?);
    let prompts = config
        .sampling
        .prompts
        .as_deref()
        .map(prompt_lines)
        .unwrap_or_default();
    events.extend(sample_events(&dir.join("samples"), &prompts)?);
    events.push(Event::StateChanged(RunState::Finished));
    Ok(events)
}

/// One `Progress` per training row of `metrics.jsonl` with a finite loss, and one `Validated` per validation row.
fn progress_events(metrics: &Path, total_steps: usize) -> Result<Vec<Event>, String> {
    let text = std::fs::read_to_string(metrics)
        .map_err(|err| format!("cannot read {}: {err}", metrics.display()))?;
    let mut smoothed: Option<f64> = None;
    let mut events = Vec::new();
    for line in text.lines() {
        let row = parse_row(line).map_err(|err| format!("{err}: {}", metrics.display()))?;
        let row = match row {
            MetricsRow::Step(row) => row,
            MetricsRow::Validation(v) => {
                events.push(Event::Validated(v));
                continue;
            }
            MetricsRow::Other => continue,
        };
        let Some(loss) = row.loss else { continue };
        let smooth = smoothed.map_or(loss, |s| (1.0 - SMOOTHING) * s + SMOOTHING * loss);
        smoothed = Some(smooth);
        events.push(Event::Progress(Progress {
            step: row.step,
            total_steps,
            epoch: row.epoch,
            loss,
            smoothed_loss: smooth,
            learning_rate: row.learning_rate,
            step_secs: row.step_secs,
            eta_secs: total_steps.saturating_sub(row.step) as f64 * row.step_secs,
        }));
    }
    Ok(events)
}

/// A sample prompt as the replay shows it: its text and its control images.
#[derive(Debug, Clone, Default, PartialEq)]
struct PromptLine {
    text: String,
    /// `--ci` images, beside the prompt file when relative (as the engine reads them).
    controls: Vec<PathBuf>,
}

/// Each line of a musubi-tuner prompt file: its text (before its ` --` options) and its `--ci` control images.
fn prompt_lines(path: &Path) -> Vec<PromptLine> {
    let folder = path.parent().unwrap_or(Path::new(""));
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let mut parts = l.split(" --");
            let text = parts.next().unwrap_or_default().trim().to_string();
            let controls = parts
                .filter_map(|option| option.strip_prefix("ci "))
                .map(|image| folder.join(image.trim()))
                .collect();
            PromptLine { text, controls }
        })
        .collect()
}

/// A `SampleReady` for every `{step:06}-{prompt:02}` sample, by step: a clip's frames folder (beside its MP4) or an
/// image's PNG.
fn sample_events(samples: &Path, prompts: &[PromptLine]) -> Result<Vec<Event>, String> {
    let entries = std::fs::read_dir(samples)
        .map_err(|err| format!("cannot read {}: {err}", samples.display()))?;
    let mut found: Vec<(usize, usize, PathBuf)> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_dir() || is_png(p))
        .filter_map(|p| {
            let name = p.file_stem()?.to_str()?.to_string();
            let (step, index) = name.split_once('-')?;
            Some((step.parse().ok()?, index.parse().ok()?, p))
        })
        .collect();
    found.sort();
    Ok(found
        .into_iter()
        .map(|(step, index, frames)| {
            let line = prompts.get(index).cloned().unwrap_or_else(|| PromptLine {
                text: format!("prompt {index}"),
                controls: Vec::new(),
            });
            Event::SampleReady {
                step,
                file: if frames.is_dir() {
                    frames.with_extension("mp4")
                } else {
                    frames.clone()
                },
                prompt: line.text,
                frames,
                controls: line.controls,
            }
        })
        .collect())
}

fn is_png(path: &Path) -> bool {
    path.is_file()
        && path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("png"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn a_run_folder_replays_as_its_events() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = RunConfig::default();
        config.training.max_train_steps = 2;
        config.sampling.prompts = Some(dir.path().join("prompts.txt"));
        config.save(&dir.path().join("run.toml")).unwrap();
        std::fs::write(
            dir.path().join("prompts.txt"),
            "a red dot --w 48 --i a.png --ci src.png --ci /abs/second.png\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("metrics.jsonl"),
            "{\"step\":1,\"epoch\":1,\"loss\":2.0,\"lr\":0.001,\"step_secs\":0.5}\n\
             {\"step\":2,\"epoch\":1,\"loss\":1.0,\"lr\":0.001,\"step_secs\":0.5}\n\
             {\"kind\":\"validation\",\"step\":2,\"val_loss\":1.5,\"items\":2,\"timesteps\":4}\n",
        )
        .unwrap();
        std::fs::create_dir_all(dir.path().join("samples/000002-00")).unwrap();
        // An image model's sample, and what is not a sample.
        image::RgbImage::new(2, 2)
            .save(dir.path().join("samples/000004-00.png"))
            .unwrap();
        std::fs::write(dir.path().join("samples/000002-00.mp4"), b"").unwrap();
        std::fs::write(dir.path().join("samples/notes.png"), b"").unwrap();
        let events = run_events(dir.path()).unwrap();
        let progress: Vec<&Progress> = events
            .iter()
            .filter_map(|e| match e {
                Event::Progress(p) => Some(p),
                _ => None,
            })
            .collect();
        assert_eq!(progress.len(), 2);
        assert_eq!(progress[1].loss, 1.0);
        assert!((progress[1].smoothed_loss - 1.95).abs() < 1e-12);
        let validation = framesmith_config::protocol::ValidationLoss {
            step: 2,
            loss: 1.5,
            items: 2,
            timesteps: 4,
        };
        assert!(events.contains(&Event::Validated(validation)));
        let samples: Vec<(usize, PathBuf, PathBuf)> = events
            .iter()
            .filter_map(|e| match e {
                Event::SampleReady {
                    step,
                    file,
                    frames,
                    prompt,
                    controls,
                } => {
                    assert_eq!(prompt, "a red dot");
                    let beside = dir.path().join("src.png");
                    assert_eq!(controls, &[beside, PathBuf::from("/abs/second.png")]);
                    Some((*step, file.clone(), frames.clone()))
                }
                _ => None,
            })
            .collect();
        let s = dir.path().join("samples");
        assert_eq!(
            samples,
            [
                (2, s.join("000002-00.mp4"), s.join("000002-00")),
                (4, s.join("000004-00.png"), s.join("000004-00.png")),
            ]
        );
        assert_eq!(
            events.last(),
            Some(&Event::StateChanged(RunState::Finished))
        );
    }
}
