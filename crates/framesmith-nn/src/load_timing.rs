//! Where a model's build goes: process-wide totals of the time spent reading tensors out of their files,
//! converting FP8 weights, copying weights to the device, and page-locking and packing the streamed blocks' host
//! copies. A build reads the totals before and after ([`load_timing`], [`LoadTiming::since`]) and logs the
//! difference in one line, so a slow start shows which part to look at.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A part of a model's build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LoadPart {
    /// A tensor read from its source (a file: copied out of the page cache).
    Reading,
    /// FP8 weights taken apart, re-scaled or quantised.
    Fp8,
    /// Weights copied from host memory to the device.
    ToDevice,
    /// Page-locked host copies of streamed blocks allocated.
    PageLocking,
    /// Streamed blocks packed into their host copies.
    Packing,
}

const PARTS: usize = 5;

impl LoadPart {
    fn index(self) -> usize {
        match self {
            Self::Reading => 0,
            Self::Fp8 => 1,
            Self::ToDevice => 2,
            Self::PageLocking => 3,
            Self::Packing => 4,
        }
    }
}

struct Totals {
    nanos: [AtomicU64; PARTS],
    page_locked_bytes: AtomicU64,
}

static TOTALS: Totals = Totals {
    nanos: [const { AtomicU64::new(0) }; PARTS],
    page_locked_bytes: AtomicU64::new(0),
};

/// Adds `took` to `part`'s total.
pub(crate) fn add(part: LoadPart, took: Duration) {
    TOTALS.nanos[part.index()].fetch_add(
        u64::try_from(took.as_nanos()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
}

/// Runs `f`, adding its time to `part`'s total.
pub(crate) fn timed<T>(part: LoadPart, f: impl FnOnce() -> T) -> T {
    let began = Instant::now();
    let out = f();
    add(part, began.elapsed());
    out
}

/// Counts `bytes` of streamed blocks page-locked (their time goes to [`LoadPart::PageLocking`]).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn add_page_locked(bytes: usize) {
    TOTALS
        .page_locked_bytes
        .fetch_add(bytes as u64, Ordering::Relaxed);
}

/// Seconds spent in each part of model builds (and the streamed blocks' page-locked bytes), since the process
/// started or between two readings ([`LoadTiming::since`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LoadTiming {
    pub reading_secs: f64,
    pub fp8_secs: f64,
    pub to_device_secs: f64,
    pub page_locking_secs: f64,
    pub page_locked_bytes: u64,
    pub packing_secs: f64,
}

/// The totals so far.
pub fn load_timing() -> LoadTiming {
    let secs = |part: LoadPart| TOTALS.nanos[part.index()].load(Ordering::Relaxed) as f64 * 1e-9;
    LoadTiming {
        reading_secs: secs(LoadPart::Reading),
        fp8_secs: secs(LoadPart::Fp8),
        to_device_secs: secs(LoadPart::ToDevice),
        page_locking_secs: secs(LoadPart::PageLocking),
        page_locked_bytes: TOTALS.page_locked_bytes.load(Ordering::Relaxed),
        packing_secs: secs(LoadPart::Packing),
    }
}

impl LoadTiming {
    /// What was spent after `earlier` (a reading of the same totals).
    pub fn since(&self, earlier: &LoadTiming) -> LoadTiming {
        let d = |now: f64, then: f64| (now - then).max(0.0);
        LoadTiming {
            reading_secs: d(self.reading_secs, earlier.reading_secs),
            fp8_secs: d(self.fp8_secs, earlier.fp8_secs),
            to_device_secs: d(self.to_device_secs, earlier.to_device_secs),
            page_locking_secs: d(self.page_locking_secs, earlier.page_locking_secs),
            page_locked_bytes: self
                .page_locked_bytes
                .saturating_sub(earlier.page_locked_bytes),
            packing_secs: d(self.packing_secs, earlier.packing_secs),
        }
    }

    /// "model built in 35.8 s: reading 6.1 s, FP8 conversion 3.2 s, to the GPU 9.0 s, page-locking the streamed
    /// blocks 5.0 s (8.1 GiB), packing them 2.2 s, the rest 10.3 s" for a build of `total_secs` (parts under
    /// 0.05 s left out; the rest is what no part counts: building modules, dtype conversions, allocations).
    pub fn describe(&self, total_secs: f64) -> String {
        let gib = self.page_locked_bytes as f64 / (1u64 << 30) as f64;
        let counted = self.reading_secs
            + self.fp8_secs
            + self.to_device_secs
            + self.page_locking_secs
            + self.packing_secs;
        let parts = [
            ("reading", self.reading_secs, String::new()),
            ("FP8 conversion", self.fp8_secs, String::new()),
            ("to the GPU", self.to_device_secs, String::new()),
            (
                "page-locking the streamed blocks",
                self.page_locking_secs,
                format!(" ({gib:.1} GiB)"),
            ),
            ("packing them", self.packing_secs, String::new()),
            ("the rest", (total_secs - counted).max(0.0), String::new()),
        ];
        let shown: Vec<String> = parts
            .iter()
            .filter(|(_, secs, _)| *secs >= 0.05)
            .map(|(name, secs, extra)| format!("{name} {secs:.1} s{extra}"))
            .collect();
        if shown.is_empty() {
            format!("model built in {total_secs:.1} s")
        } else {
            format!("model built in {total_secs:.1} s: {}", shown.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_is_told_in_its_parts_and_the_rest() {
        let timing = LoadTiming {
            reading_secs: 6.12,
            fp8_secs: 3.21,
            to_device_secs: 9.04,
            page_locking_secs: 5.0,
            page_locked_bytes: 8 << 30,
            packing_secs: 0.01,
        };
        assert_eq!(
            timing.describe(35.8),
            "model built in 35.8 s: reading 6.1 s, FP8 conversion 3.2 s, to the GPU 9.0 s, page-locking the \
             streamed blocks 5.0 s (8.0 GiB), the rest 12.4 s"
        );
        assert_eq!(LoadTiming::default().describe(0.01), "model built in 0.0 s");
    }

    #[test]
    fn readings_subtract_and_timed_work_is_counted() {
        let before = load_timing();
        let answer = timed(LoadPart::Packing, || 42);
        add(LoadPart::Reading, Duration::from_millis(250));
        add_page_locked(1 << 20);
        let spent = load_timing().since(&before);
        assert_eq!(answer, 42);
        // Other tests in this process may add to the totals at the same time: at least what this one added.
        assert!(spent.reading_secs >= 0.25, "{spent:?}");
        assert!(spent.page_locked_bytes >= 1 << 20, "{spent:?}");
        assert!(spent.packing_secs >= 0.0);
    }
}
