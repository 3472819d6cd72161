//! How much host memory the process has page-locked so far and how long the driver took to do it. Page-locking
//! tens of GiB (streamed blocks, saved activations in RAM) costs seconds at the start of a run; the start-up line
//! says how many.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Page-locked bytes and the time their allocations took, since the process started.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PageLocking {
    pub bytes: u64,
    pub secs: f64,
}

impl PageLocking {
    /// "45.2 GiB page-locked in 12.3 s", or `None` when nothing was.
    pub fn describe(&self) -> Option<String> {
        (self.bytes > 0).then(|| {
            format!(
                "{:.1} GiB page-locked in {:.1} s",
                self.bytes as f64 / (1u64 << 30) as f64,
                self.secs
            )
        })
    }

    /// What was page-locked after `earlier` (a reading of the same totals).
    pub fn since(&self, earlier: &PageLocking) -> PageLocking {
        PageLocking {
            bytes: self.bytes.saturating_sub(earlier.bytes),
            secs: (self.secs - earlier.secs).max(0.0),
        }
    }
}

/// The running totals every page-locked allocation adds to.
pub(crate) struct Totals {
    bytes: AtomicU64,
    nanos: AtomicU64,
}

impl Totals {
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn add(&self, bytes: usize, took: Duration) {
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        self.nanos.fetch_add(
            u64::try_from(took.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    fn read(&self) -> PageLocking {
        PageLocking {
            bytes: self.bytes.load(Ordering::Relaxed),
            secs: self.nanos.load(Ordering::Relaxed) as f64 * 1e-9,
        }
    }
}

pub(crate) static PAGE_LOCKING: Totals = Totals {
    bytes: AtomicU64::new(0),
    nanos: AtomicU64::new(0),
};

/// What the process has page-locked so far.
pub fn page_locking() -> PageLocking {
    PAGE_LOCKING.read()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_add_up_and_describe_themselves() {
        let totals = Totals {
            bytes: AtomicU64::new(0),
            nanos: AtomicU64::new(0),
        };
        assert_eq!(totals.read().describe(), None);
        totals.add(3 << 30, Duration::from_millis(1500));
        totals.add(1 << 29, Duration::from_millis(300));
        let read = totals.read();
        assert_eq!(read.bytes, (3 << 30) + (1 << 29));
        assert_eq!(
            read.describe().as_deref(),
            Some("3.5 GiB page-locked in 1.8 s")
        );
        let later = PageLocking {
            bytes: read.bytes + (1 << 30),
            secs: read.secs + 0.5,
        };
        let step = later.since(&read);
        assert_eq!(step.bytes, 1 << 30);
        assert!((step.secs - 0.5).abs() < 1e-9);
        assert_eq!(read.since(&read).describe(), None);
    }
}
