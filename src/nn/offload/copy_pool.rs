//! A copy split over a few threads that stay awake between copies: the staged mode copies each block as a
//! stream of 8 MiB chunks through a small page-locked ring, one chunk every ~150 µs, and waking sleeping threads
//! (a rayon scope) for every chunk would cost a good part of that. Helpers spin for a short while after each
//! copy and then sleep on a condition variable, so an idle pool costs nothing.
//!
//! Plain (cached) stores, not streaming stores: the staging ring is small enough to stay in the last-level
//! cache, so the copy engine reads the chunk from the cache instead of DRAM. On the H200 test machine (300 MiB L3)
//! this moved 54 GB/s through the ring against 41 GB/s for whole-block staging with streaming stores (bench/RESULTS.md,
//! block streaming, session 4).

// The helpers write into the caller's destination through raw pointers: the caller blocks until every helper has
// finished its piece, which is what makes those writes sound (see `copy`).
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

/// One copy, as the helpers see it.
struct Shared {
    /// Bumped once per parallel copy; a helper works on each generation exactly once.
    generation: AtomicU64,
    src: AtomicUsize,
    dst: AtomicUsize,
    len: AtomicUsize,
    piece: AtomicUsize,
    /// Helper pieces of the current copy not yet written.
    remaining: AtomicUsize,
    /// Helpers waiting on `wake`.
    sleeping: AtomicUsize,
    quit: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

/// A copy spread over `threads` threads: the caller and `threads - 1` helpers, each writing one contiguous
/// piece.
pub struct CopyPool {
    shared: Arc<Shared>,
    helpers: Vec<JoinHandle<()>>,
}

impl CopyPool {
    /// A pool of `min(available parallelism, max_threads)` threads, the caller included (at least one).
    pub fn new(max_threads: usize) -> Result<Self> {
        let available = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = available.min(max_threads).max(1);
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            src: AtomicUsize::new(0),
            dst: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            piece: AtomicUsize::new(0),
            remaining: AtomicUsize::new(0),
            sleeping: AtomicUsize::new(0),
            quit: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let mut pool = Self {
            shared,
            helpers: Vec::with_capacity(threads - 1),
        };
        for index in 1..threads {
            let shared = pool.shared.clone();
            let handle = std::thread::Builder::new()
                .name(format!("framesmith-copy-{index}"))
                .spawn(move || helper(&shared, index))
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
        // Pieces end on cache-line boundaries so no two threads write one line.
        let piece = len.div_ceil(self.threads()).next_multiple_of(64);
        let s = &self.shared;
        s.src.store(src.as_ptr() as usize, Ordering::Relaxed);
        s.dst.store(dst.as_mut_ptr() as usize, Ordering::Relaxed);
        s.len.store(len, Ordering::Relaxed);
        s.piece.store(piece, Ordering::Relaxed);
        // Helpers beyond the last piece find an empty range and only count down.
        s.remaining.store(self.helpers.len(), Ordering::Relaxed);
        s.generation.fetch_add(1, Ordering::SeqCst);
        if s.sleeping.load(Ordering::SeqCst) > 0 {
            let _guard = s.lock.lock().unwrap_or_else(PoisonError::into_inner);
            s.wake.notify_all();
        }
        let first = piece.min(len);
        dst[..first].copy_from_slice(&src[..first]);
        while s.remaining.load(Ordering::Acquire) > 0 {
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

/// Helper `index`'s loop: wait for a new generation (spinning, then sleeping), write piece `index`, count down.
fn helper(s: &Shared, index: usize) {
    let mut seen = 0u64;
    loop {
        let started = Instant::now();
        loop {
            if s.quit.load(Ordering::SeqCst) {
                return;
            }
            if s.generation.load(Ordering::Acquire) != seen {
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
                    s.generation.load(Ordering::SeqCst) == seen && !s.quit.load(Ordering::SeqCst)
                })
                .unwrap_or_else(PoisonError::into_inner);
            s.sleeping.fetch_sub(1, Ordering::SeqCst);
            drop(guard);
        }
        seen = s.generation.load(Ordering::Acquire);
        let (len, piece) = (
            s.len.load(Ordering::Relaxed),
            s.piece.load(Ordering::Relaxed),
        );
        let start = (index * piece).min(len);
        let end = (start + piece).min(len);
        if end > start {
            let src = s.src.load(Ordering::Relaxed) as *const u8;
            let dst = s.dst.load(Ordering::Relaxed) as *mut u8;
            // SAFETY: `copy` published `src`/`dst` for `len` bytes before bumping the generation and blocks until
            // `remaining` reaches zero, so both buffers are live and unaliased here; pieces are disjoint ranges of
            // `dst`, and `[start, end)` lies inside `len`.
            unsafe { std::ptr::copy_nonoverlapping(src.add(start), dst.add(start), end - start) };
        }
        s.remaining.fetch_sub(1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, RngCore, SeedableRng};

    #[test]
    fn pool_copy_equals_the_source_across_pieces() -> Result<()> {
        let rng = &mut rand::rngs::StdRng::seed_from_u64(2);
        for threads in [1, 3] {
            let pool = CopyPool::new(threads)?;
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
        let pool = CopyPool::new(3)?;
        if pool.threads() < 2 {
            return Ok(());
        }
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
}
