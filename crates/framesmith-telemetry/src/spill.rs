//! Detects the Windows driver spilling VRAM into shared system memory: VRAM near full, shared memory growing
//! and step time rising, all at once. Pure logic over the history and the step times.

use super::history::{History, Sample};

/// VRAM used fraction at or above which the card counts as full (WDDM keeps a little back).
pub const SPILL_VRAM_FRACTION: f64 = 0.9;
/// Shared-memory growth within the window that counts as spilling.
pub const SPILL_SHARED_GROWTH_BYTES: u64 = 256 << 20;
/// Seconds of telemetry looked at for shared-memory growth.
const WINDOW_SECS: f64 = 30.0;
/// Recent step time over the baseline that counts as a slowdown.
const STEP_SLOWDOWN_RATIO: f64 = 1.25;
/// Steps averaged for "recent"; the baseline is the steps before them, up to `BASELINE_STEPS`.
const RECENT_STEPS: usize = 3;
const BASELINE_STEPS: usize = 10;

/// The evidence behind a spill warning.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpillWarning {
    pub vram_fraction: f64,
    pub shared_growth_bytes: u64,
    /// Recent step time over the earlier baseline.
    pub step_time_ratio: f64,
}

impl SpillWarning {
    /// One line for the UI.
    pub fn message(&self) -> String {
        format!(
            "The driver is spilling VRAM into shared memory: VRAM {:.0}% full, shared memory +{} MiB, steps {:.1}× slower. Stream more blocks or lower the resolution",
            self.vram_fraction * 100.0,
            self.shared_growth_bytes >> 20,
            self.step_time_ratio
        )
    }
}

/// `Some` when all three signs of spilling are present. `step_secs` are the run's step times, oldest first.
pub fn detect_spill(history: &History, step_secs: &[f64]) -> Option<SpillWarning> {
    let latest = history.latest()?;
    let vram_fraction = latest
        .gpus
        .iter()
        .map(|gpu| gpu.memory_fraction())
        .fold(0.0, f64::max);
    if vram_fraction < SPILL_VRAM_FRACTION {
        return None;
    }
    let shared_growth_bytes = shared_growth(history, latest)?;
    if shared_growth_bytes < SPILL_SHARED_GROWTH_BYTES {
        return None;
    }
    let step_time_ratio = step_slowdown(step_secs)?;
    (step_time_ratio >= STEP_SLOWDOWN_RATIO).then_some(SpillWarning {
        vram_fraction,
        shared_growth_bytes,
        step_time_ratio,
    })
}

/// Growth of shared memory from its lowest point in the window to now. Our process's counter is preferred;
/// the adapter-wide one covers drivers that do not attribute shared memory per process.
fn shared_growth(history: &History, latest: &Sample) -> Option<u64> {
    let pick = |s: &Sample| {
        s.shared.map(|shared| {
            if latest.shared.is_some_and(|l| l.process_bytes > 0) {
                shared.process_bytes
            } else {
                shared.adapter_bytes
            }
        })
    };
    let now = pick(latest)?;
    let lowest = history
        .iter()
        .rev()
        .take_while(|s| s.at_secs >= latest.at_secs - WINDOW_SECS)
        .filter_map(pick)
        .min()?;
    Some(now.saturating_sub(lowest))
}

fn step_slowdown(step_secs: &[f64]) -> Option<f64> {
    if step_secs.len() < RECENT_STEPS + 2 {
        return None;
    }
    let (earlier, recent) = step_secs.split_at(step_secs.len() - RECENT_STEPS);
    let baseline = median(&earlier[earlier.len().saturating_sub(BASELINE_STEPS)..])?;
    let recent = median(recent)?;
    (baseline > 0.0).then(|| recent / baseline)
}

fn median(values: &[f64]) -> Option<f64> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    Some(sorted[sorted.len() / 2])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GpuSample, SharedMemorySample};

    fn history(vram_used: u64, shared_mib: &[u64]) -> History {
        let mut history = History::new(100);
        for (i, &mib) in shared_mib.iter().enumerate() {
            history.push(Sample {
                at_secs: i as f64,
                gpus: vec![GpuSample {
                    memory_used_bytes: vram_used,
                    memory_total_bytes: 100,
                    ..GpuSample::default()
                }],
                shared: Some(SharedMemorySample {
                    adapter_bytes: mib << 20,
                    process_bytes: 0,
                }),
                ..Sample::default()
            });
        }
        history
    }

    const SLOWING: [f64; 8] = [1.0, 1.0, 1.1, 1.0, 1.0, 3.0, 3.2, 3.1];

    #[test]
    fn warns_when_all_three_signs_are_present() {
        let warning = detect_spill(&history(97, &[100, 200, 600]), &SLOWING).unwrap();
        assert_eq!(warning.shared_growth_bytes, 500 << 20);
        assert!((warning.vram_fraction - 0.97).abs() < 1e-9);
        assert!(warning.step_time_ratio > 2.9);
        assert!(warning.message().contains("+500 MiB"));
    }

    #[test]
    fn silent_when_any_sign_is_missing() {
        // VRAM has room.
        assert!(detect_spill(&history(50, &[100, 600]), &SLOWING).is_none());
        // Shared memory flat.
        assert!(detect_spill(&history(97, &[600, 600]), &SLOWING).is_none());
        // Steps steady.
        assert!(detect_spill(&history(97, &[100, 600]), &[1.0; 8]).is_none());
        // Too few steps to tell.
        assert!(detect_spill(&history(97, &[100, 600]), &[1.0, 3.0]).is_none());
        // No shared-memory counters (not Windows).
        let mut no_shared = history(97, &[100, 600]);
        no_shared.push(Sample {
            at_secs: 3.0,
            gpus: no_shared.latest().unwrap().gpus.clone(),
            ..Sample::default()
        });
        assert!(detect_spill(&no_shared, &SLOWING).is_none());
    }

    #[test]
    fn growth_counts_only_inside_the_window() {
        let mut shared = vec![0u64];
        shared.extend(std::iter::repeat_n(600, 40));
        assert!(detect_spill(&history(97, &shared), &SLOWING).is_none());
    }
}
