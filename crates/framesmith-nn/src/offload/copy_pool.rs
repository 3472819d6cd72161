//! A copy split over a few threads that stay awake between copies: the staged mode copies each block as a
//! stream of 8 MiB chunks through a small page-locked ring, one chunk every ~150 µs, and waking sleeping threads
//! (a rayon scope) for every chunk would cost a good part of that. Helpers spin for a short while after each
//! copy and then sleep on a condition variable, so an idle pool costs nothing.
//!
//! Work is handed out in units: every thread, the caller included, takes the next unit as soon as it is done
//! with its last. A thread that runs slow — preempted, sharing its core with another program, waking late —
//! then holds up only the unit it has, where a fixed split would make every copy wait for its whole share.
//!
//! Plain (cached) stores, not streaming stores: the staging ring is small enough to stay in the last-level
//! cache, so the copy engine reads the chunk from the cache instead of DRAM. On the H200 test machine (300 MiB L3)
//! this moved 54 GB/s through the ring against 41 GB/s for whole-block staging with streaming stores (bench/RESULTS.md,
//! block streaming, session 4).

// The helpers write into the caller's destination through raw pointers: the caller blocks until every unit has
// been written, which is what makes those writes sound (see `copy` and `work`).
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use candle_core::Result;

/// Below this many bytes a copy runs on the calling thread alone.
const PARALLEL_MIN_BYTES: usize = 256 << 10;
/// How long a helper spins for the next copy before it sleeps: longer than the gap between two chunks of one
/// block (a chunk's device copy, ~150 µs), short enough that an idle pool stops burning cores at once.
const SPIN: Duration = Duration::from_millis(2);
/// Bits of the ticket that count units; the rest count copies.
const UNIT_BITS: u32 = 24;
const UNIT_MASK: u64 = (1 << UNIT_BITS) - 1;

/// One copy, as the threads see it.
struct Shared {
    /// The current copy's number (high bits) and the next unit not yet taken (low [`UNIT_BITS`] bits). Taking a
    /// unit is a compare-and-swap on both, so a thread can never take a unit of a copy other than the one whose
    /// parameters it read.
    ticket: AtomicU64,
    src: AtomicUsize,
    dst: AtomicUsize,
    len: AtomicUsize,
    unit: AtomicUsize,
    units: AtomicUsize,
    /// Units of the current copy written so far.
    written: AtomicUsize,
    /// Helpers waiting on `wake`.
    sleeping: AtomicUsize,
    quit: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

/// A copy spread over `threads` threads: the caller and `threads - 1` helpers, taking units of the copy in turn.
pub struct CopyPool {
    shared: Arc<Shared>,
    helpers: Vec<JoinHandle<()>>,
    /// Bytes of one unit (a multiple of the cache line).
    unit: usize,
}

impl CopyPool {
    /// A pool of `threads` threads, the caller included (at least one), handing out work in units of about
    /// `unit_bytes`. How many a machine should use is the caller's choice (`staging_copy_threads`).
    pub fn new(threads: usize, unit_bytes: usize) -> Result<Self> {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            ticket: AtomicU64::new(0),
            src: AtomicUsize::new(0),
            dst: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            unit: AtomicUsize::new(0),
            units: AtomicUsize::new(0),
            written: AtomicUsize::new(0),
            sleeping: AtomicUsize::new(0),
            quit: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let mut pool = Self {
            shared,
            helpers: Vec::with_capacity(threads - 1),
            unit: unit_bytes.max(64).next_multiple_of(64),
        };
        for index in 1..threads {
            let shared = pool.shared.clone();
            let handle = std::thread::Builder::new()
                .name(format!("framesmith-copy-{index}"))
                .spawn(move || helper(&shared))
                .map_err(|e| {
                    candle_core::Error::Msg(format!("cannot start the copy threads: {e}"))
                })?;
            pool.helpers.push(handle);
        }
        Ok(pool)
    }

    /// Threads a copy uses, the caller included.
    pub fn threads(&self) -> usize {
        self.helpers.len() + 1
    }

    /// Copies `src` into `dst` (same length); returns once every byte is written and visible to this thread and
    /// to devices reading host memory.
    pub fn copy(&self, src: &[u8], dst: &mut [u8]) -> Result<()> {
        if src.len() != dst.len() {
            candle_core::bail!("copy of {} bytes into {} bytes", src.len(), dst.len());
        }
        let len = src.len();
        if len < PARALLEL_MIN_BYTES || self.helpers.is_empty() {
            dst.copy_from_slice(src);
            return Ok(());
        }
        // Units end on cache-line boundaries so no two threads write one line; a huge copy gets larger units so
        // that their count fits the ticket.
        let unit = self
            .unit
            .max(len.div_ceil(UNIT_MASK as usize))
            .next_multiple_of(64);
        let units = len.div_ceil(unit);
        let s = &self.shared;
        s.src.store(src.as_ptr() as usize, Ordering::Relaxed);
        s.dst.store(dst.as_mut_ptr() as usize, Ordering::Relaxed);
        s.len.store(len, Ordering::Relaxed);
        s.unit.store(unit, Ordering::Relaxed);
        s.units.store(units, Ordering::Relaxed);
        s.written.store(0, Ordering::Relaxed);
        // Only this thread changes the copy number; the store publishes the parameters above.
        let copy = (s.ticket.load(Ordering::Relaxed) >> UNIT_BITS) + 1;
        s.ticket.store(copy << UNIT_BITS, Ordering::SeqCst);
        if s.sleeping.load(Ordering::SeqCst) > 0 {
            let _guard = s.lock.lock().unwrap_or_else(PoisonError::into_inner);
            s.wake.notify_all();
        }
        work(s, copy);
        while s.written.load(Ordering::Acquire) < units {
            std::hint::spin_loop();
        }
        Ok(())
    }
}

impl Drop for CopyPool {
    fn drop(&mut self) {
        self.shared.quit.store(true, Ordering::SeqCst);
        {
            let _guard = self
                .shared
                .lock
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            self.shared.wake.notify_all();
        }
        for h in self.helpers.drain(..) {
            let _ = h.join();
        }
    }
}

/// Takes and writes units of copy number `copy` until none is left (or a later copy has started).
fn work(s: &Shared, copy: u64) {
    loop {
        let ticket = s.ticket.load(Ordering::Acquire);
        if ticket >> UNIT_BITS != copy {
            return;
        }
        let u = (ticket & UNIT_MASK) as usize;
        if u >= s.units.load(Ordering::Relaxed) {
            return;
        }
        let (src, dst, len, unit) = (
            s.src.load(Ordering::Relaxed) as *const u8,
            s.dst.load(Ordering::Relaxed) as *mut u8,
            s.len.load(Ordering::Relaxed),
            s.unit.load(Ordering::Relaxed),
        );
        // Taking unit `u` succeeds only while the ticket still names this copy with `u` untaken. The copy cannot
        // have finished then (a unit is untaken), and its parameters change only after it finishes, so the ones
        // read above (published before the ticket this thread acquired) are this copy's.
        if s.ticket
            .compare_exchange_weak(ticket, ticket + 1, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            continue;
        }
        let start = u * unit;
        let end = (start + unit).min(len);
        // SAFETY: `copy` published `src`/`dst` for `len` bytes and blocks until `written` counts every unit, so
        // both buffers are live and unaliased until this unit is counted below; units are disjoint ranges of
        // `dst`, each taken by one thread only (the compare-and-swap above), and `[start, end)` lies inside `len`.
        unsafe { std::ptr::copy_nonoverlapping(src.add(start), dst.add(start), end - start) };
        s.written.fetch_add(1, Ordering::Release);
    }
}

/// A helper's loop: wait for a new copy (spinning, then sleeping) and take units of it.
fn helper(s: &Shared) {
    let mut seen = 0u64;
    loop {
        let started = Instant::now();
        loop {
            if s.quit.load(Ordering::SeqCst) {
                return;
            }
            if s.ticket.load(Ordering::Acquire) >> UNIT_BITS != seen {
                break;
            }
            if started.elapsed() < SPIN {
                std::hint::spin_loop();
                continue;
            }
            let guard = s.lock.lock().unwrap_or_else(PoisonError::into_inner);
            s.sleeping.fetch_add(1, Ordering::SeqCst);
            let guard = s
                .wake
                .wait_while(guard, |()| {
                    s.ticket.load(Ordering::SeqCst) >> UNIT_BITS == seen
                        && !s.quit.load(Ordering::SeqCst)
                })
                .unwrap_or_else(PoisonError::into_inner);
            s.sleeping.fetch_sub(1, Ordering::SeqCst);
            drop(guard);
        }
        seen = s.ticket.load(Ordering::Acquire) >> UNIT_BITS;
        work(s, seen);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, RngCore, SeedableRng};

    #[test]
    fn pool_copy_equals_the_source_across_units() -> Result<()> {
        let rng = &mut rand::rngs::StdRng::seed_from_u64(2);
        for (threads, unit) in [(1, 256 << 10), (3, 256 << 10), (3, 4000), (4, 8 << 20)] {
            let pool = CopyPool::new(threads, unit)?;
            assert!((1..=threads).contains(&pool.threads()));
            let mut lens = vec![
                0,
                1000,
                PARALLEL_MIN_BYTES - 1,
                PARALLEL_MIN_BYTES + 4097,
                3 << 20,
            ];
            lens.extend((0..20).map(|_| rng.random_range(PARALLEL_MIN_BYTES..2 << 20)));
            for len in lens {
                let (src_off, dst_off) = (rng.random_range(0..64), rng.random_range(0..64));
                let mut src = vec![0u8; src_off + len];
                rng.fill_bytes(&mut src);
                let mut dst = vec![0xA5u8; dst_off + len + 64];
                pool.copy(&src[src_off..], &mut dst[dst_off..dst_off + len])?;
                assert_eq!(&dst[dst_off..dst_off + len], &src[src_off..], "len {len}");
                assert!(dst[..dst_off].iter().all(|&b| b == 0xA5), "head clobbered");
                assert!(
                    dst[dst_off + len..].iter().all(|&b| b == 0xA5),
                    "tail clobbered"
                );
            }
            let mut short = vec![0u8; 10];
            assert!(pool.copy(&[1u8; 11], &mut short).is_err());
        }
        Ok(())
    }

    #[test]
    fn an_idle_pool_sleeps_and_wakes_for_the_next_copy() -> Result<()> {
        let pool = CopyPool::new(3, 64 << 10)?;
        let src: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        pool.copy(&src, &mut dst)?;
        // Past the spin window every helper is asleep; the next copy must still be complete.
        let deadline = Instant::now() + Duration::from_secs(5);
        while pool.shared.sleeping.load(Ordering::SeqCst) < pool.threads() - 1 {
            assert!(Instant::now() < deadline, "helpers never went to sleep");
            std::thread::sleep(SPIN);
        }
        dst.fill(0);
        pool.copy(&src, &mut dst)?;
        assert_eq!(dst, src);
        Ok(())
    }

    #[test]
    fn back_to_back_copies_with_small_units_never_mix() -> Result<()> {
        // Many short copies in a row, each into the same buffer with a different pattern: a thread that took a
        // unit of one copy and wrote it during the next would leave a byte of the wrong pattern behind.
        let pool = CopyPool::new(4, 4096)?;
        let len = PARALLEL_MIN_BYTES + 12_345;
        let mut dst = vec![0u8; len];
        for round in 0..300u32 {
            let byte = (round % 251) as u8;
            let src = vec![byte; len];
            pool.copy(&src, &mut dst)?;
            assert!(dst.iter().all(|&b| b == byte), "round {round}");
        }
        Ok(())
    }
}
