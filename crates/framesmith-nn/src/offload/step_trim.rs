//! Whether a training step starts from a trimmed memory pool. A trim ([`super::release_cached_memory`]: the stream
//! is waited for, then every free chunk goes back to the driver) makes a step lay its memory out as the first step
//! did, so it peaks where the first did: a pool that keeps the last step's free chunks splits them differently and
//! can need more. But the GPU idles while the host waits and trims, and the step then maps its whole working set
//! from the driver again. [`StepTrim`] trims only where keeping the chunks could matter: at the first step, after
//! a step that started on kept chunks and raised the pool's high-water mark, and whenever the card has no room for
//! a step that could use none of the kept chunks (a VRAM budget's hold counts as taken). The pool is read without
//! waiting for the stream.

use candle_core::{Device, Result};

/// What the decision reads of a device's pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolReading {
    /// The bytes the pool has reserved from the driver at most (since its mark was last restarted).
    pub peak_reserved: u64,
    /// The bytes of the pool in use (between steps: the run's lasting tensors).
    pub used: u64,
    /// The bytes of the card free.
    pub free: u64,
}

/// The trims of one device's pool, step by step.
#[derive(Clone, Debug, Default)]
pub struct StepTrim {
    /// The pool's mark when the last step began, and whether that step began from a trimmed pool.
    last: Option<(u64, bool)>,
    /// The highest mark read after a step that began trimmed: what a step laid out afresh needs.
    trimmed_peak: u64,
}

impl StepTrim {
    /// Called as a step begins: trims `device`'s pool when [`StepTrim::decide`] says so, and returns whether it did.
    pub fn before_step(&mut self, device: &Device) -> Result<bool> {
        let trim = self.decide(read(device)?);
        if trim {
            super::release_cached_memory(device)?;
        }
        Ok(trim)
    }

    /// Whether the step about to begin starts from a trimmed pool, the pool being as `now` says (`None`: a device
    /// without a pool, where a trim does nothing).
    pub fn decide(&mut self, now: Option<PoolReading>) -> bool {
        let Some(now) = now else {
            return true;
        };
        let trim = match self.last {
            // The first step, or the mark was restarted since (a sampling round): start as the first step did.
            None => true,
            Some((mark, _)) if now.peak_reserved < mark => true,
            Some((mark, began_trimmed)) => {
                if began_trimmed {
                    self.trimmed_peak = self.trimmed_peak.max(now.peak_reserved);
                }
                // A step on kept chunks needed more than any step before it.
                let grew = !began_trimmed && now.peak_reserved > mark;
                // No room beside the kept chunks for a step laid out afresh.
                let tight = now.free < self.trimmed_peak.saturating_sub(now.used);
                grew || tight
            }
        };
        self.last = Some((now.peak_reserved, trim));
        trim
    }
}

/// `device`'s pool now; `None` for a device without one.
fn read(device: &Device) -> Result<Option<PoolReading>> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(dev) = device {
        use crate::cuda::device;
        let (free, _) = device::memory_info(dev)?;
        return Ok(Some(PoolReading {
            peak_reserved: device::peak_reserved_bytes(dev)?,
            used: device::used_memory_bytes(dev)?,
            free,
        }));
    }
    let _ = device;
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn reading(peak_gib: u64, free_gib: u64) -> Option<PoolReading> {
        Some(PoolReading {
            peak_reserved: peak_gib * GIB,
            used: 10 * GIB,
            free: free_gib * GIB,
        })
    }

    #[test]
    fn a_roomy_card_keeps_the_chunks_until_a_step_needs_more() {
        let mut trims = StepTrim::default();
        // Step 1 starts trimmed and peaks at 30 GiB (20 beyond the lasting 10) on a card with 100 free.
        assert!(trims.decide(reading(12, 100)));
        // Steps 2 and 3 keep the chunks: room for 20 GiB more beside them, and no new high.
        assert!(!trims.decide(reading(30, 100)));
        assert!(!trims.decide(reading(30, 100)));
        // Step 3 raised the mark to 31: step 4 starts trimmed, step 5 keeps the chunks again.
        assert!(trims.decide(reading(31, 100)));
        assert!(!trims.decide(reading(31, 100)));
    }

    #[test]
    fn a_tight_card_trims_before_every_step() {
        let mut trims = StepTrim::default();
        assert!(trims.decide(reading(12, 100)));
        // 15 GiB free under the budget: a step that found no kept chunk usable (20 GiB) would not fit.
        for _ in 0..3 {
            assert!(trims.decide(reading(30, 15)));
        }
    }

    #[test]
    fn a_restarted_mark_or_no_pool_trims() {
        let mut trims = StepTrim::default();
        assert!(trims.decide(reading(12, 100)));
        assert!(!trims.decide(reading(30, 100)));
        // A sampling round restarted the mark (now below the last step's): start afresh.
        assert!(trims.decide(reading(20, 100)));
        assert!(StepTrim::default().decide(None));
    }
}
