//! The step's page-locked host-activation buffers locked on a thread of their own while the model is built,
//! rather than by the first step as it needs them (tens of GiB take the driver seconds). The caller sizes them
//! from the memory plan, one chunk per block (a block's saved input and what it keeps of its attention); once
//! installed they are the arena the step lays its saved tensors into (`arena.rs`), and what does not fit is
//! allocated as before. A failure leaves the step to allocate everything as before; dropping the handle (a run
//! stopped while its model is built) stops the thread after the chunk it is locking and frees what it locked.

#![cfg_attr(not(feature = "cuda"), allow(dead_code))]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use candle_core::Device;

use super::arena::HostChunk;

/// What setting the buffers aside did.
#[derive(Debug, Clone, PartialEq)]
pub struct PrelockReport {
    /// Bytes page-locked and handed to the step (0 after a failure).
    pub bytes: u64,
    /// How many chunks they are.
    pub chunks: usize,
    /// Seconds the thread took to lock them.
    pub secs: f64,
    /// Seconds the caller waited for the thread when it asked for them ([`ActivationBuffers::install`]).
    pub waited_secs: f64,
    /// Why nothing was set aside: the step then page-locks its buffers as it needs them.
    pub failure: Option<String>,
}

impl PrelockReport {
    /// The run log's line: what was locked beside the build and how long the first step waited for it, or why
    /// nothing was.
    pub fn describe(&self) -> String {
        match &self.failure {
            None => format!(
                "activation buffers: {:.1} GiB page-locked in {:.1} s on a thread of their own beside the setup ({} \
                 chunks); the first step waited {:.1} s for them",
                self.bytes as f64 / (1u64 << 30) as f64,
                self.secs,
                self.chunks,
                self.waited_secs
            ),
            Some(why) => format!(
                "activation buffers: could not page-lock them beside the setup ({why}); the first step page-locks \
                 them as it needs them"
            ),
        }
    }
}

/// What the thread locked.
struct Locked<C> {
    chunks: Vec<C>,
    secs: f64,
    failure: Option<String>,
}

/// Chunks allocated one after another on a thread of their own; a stop between two chunks ends it.
pub(crate) struct Prelocking<C: HostChunk> {
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<Locked<C>>>,
}

impl<C: HostChunk> Prelocking<C> {
    /// Starts allocating one chunk of each of `sizes` with `alloc`. A failed allocation frees the chunks made so
    /// far (on the thread, where `alloc` set up what freeing needs) and ends the thread.
    pub(crate) fn start<A>(sizes: Vec<usize>, mut alloc: A) -> std::io::Result<Self>
    where
        A: FnMut(usize) -> Result<C, String> + Send + 'static,
    {
        let stopping = Arc::new(AtomicBool::new(false));
        let stopped = stopping.clone();
        let thread = std::thread::Builder::new()
            .name("activation-buffers".into())
            .spawn(move || {
                let began = Instant::now();
                let mut chunks = Vec::with_capacity(sizes.len());
                let mut failure = None;
                for bytes in sizes {
                    if stopped.load(Ordering::Relaxed) {
                        break;
                    }
                    match alloc(bytes) {
                        Ok(chunk) => chunks.push(chunk),
                        Err(why) => {
                            failure = Some(why);
                            chunks.clear();
                            break;
                        }
                    }
                }
                Locked {
                    chunks,
                    secs: began.elapsed().as_secs_f64(),
                    failure,
                }
            })?;
        Ok(Self {
            stopping,
            thread: Some(thread),
        })
    }

    /// Waits for the thread: its chunks (none after a failure) and the report.
    pub(crate) fn finish(mut self) -> (Vec<C>, PrelockReport) {
        let waiting = Instant::now();
        let locked = match self.thread.take().map(JoinHandle::join) {
            Some(Ok(locked)) => locked,
            _ => Locked {
                chunks: Vec::new(),
                secs: 0.0,
                failure: Some("the page-locking thread ended without its buffers".into()),
            },
        };
        let report = PrelockReport {
            bytes: locked.chunks.iter().map(|c| c.len() as u64).sum(),
            chunks: locked.chunks.len(),
            secs: locked.secs,
            waited_secs: waiting.elapsed().as_secs_f64(),
            failure: locked.failure,
        };
        (locked.chunks, report)
    }

    /// Asks the thread to stop before its next chunk.
    fn stop(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }
}

impl<C: HostChunk> Drop for Prelocking<C> {
    /// Stops the thread after the chunk it is allocating and frees what it made.
    fn drop(&mut self) {
        self.stop();
        if let Some(thread) = self.thread.take() {
            drop(thread.join());
        }
    }
}

/// Buffers of one size allocated on a thread of their own ahead of their use and handed out in turn
/// ([`Ahead::next`]): the host copies of streamed blocks page-locked while the blocks before them are read and
/// packed. A failed allocation ends the thread; dropping the handle stops it and frees what was not taken.
pub(crate) struct Ahead<C: Send + 'static> {
    shared: Arc<Handoff<C>>,
    thread: Option<JoinHandle<()>>,
}

/// What the allocating thread hands over: the buffers made and not yet taken, whether it has finished, and
/// whether it was asked to stop.
struct Handoff<C> {
    state: Mutex<HandoffState<C>>,
    changed: Condvar,
}

struct HandoffState<C> {
    made: VecDeque<Result<C, String>>,
    finished: bool,
    stopping: bool,
}

impl<C> Handoff<C> {
    /// Runs `f` on the state (a poisoned lock still holds usable buffers: the thread only pushes to it).
    fn with<R>(&self, f: impl FnOnce(&mut HandoffState<C>) -> R) -> R {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let out = f(&mut state);
        self.changed.notify_all();
        out
    }
}

impl<C: Send + 'static> Ahead<C> {
    /// Starts allocating `count` buffers with `alloc`, one after another.
    pub(crate) fn start<A>(count: usize, mut alloc: A) -> std::io::Result<Self>
    where
        A: FnMut() -> Result<C, String> + Send + 'static,
    {
        let shared = Arc::new(Handoff {
            state: Mutex::new(HandoffState {
                made: VecDeque::new(),
                finished: false,
                stopping: false,
            }),
            changed: Condvar::new(),
        });
        let theirs = shared.clone();
        let thread = std::thread::Builder::new()
            .name("host-buffers-ahead".into())
            .spawn(move || {
                for _ in 0..count {
                    if theirs.with(|s| s.stopping) {
                        break;
                    }
                    let made = alloc();
                    let failed = made.is_err();
                    theirs.with(|s| s.made.push_back(made));
                    if failed {
                        break;
                    }
                }
                theirs.with(|s| s.finished = true);
            })?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// The next buffer, waiting for it; `None` when the thread has none left to give (every one was taken, or an
    /// allocation failed): the caller then allocates it itself.
    pub(crate) fn next(&self) -> Option<C> {
        let h = &self.shared;
        let mut state = h
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        loop {
            if let Some(made) = state.made.pop_front() {
                return made.ok();
            }
            if state.finished {
                return None;
            }
            state = h
                .changed
                .wait(state)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }
}

impl<C: Send + 'static> Drop for Ahead<C> {
    /// Stops the thread after the buffer it is allocating; what it made and nobody took is freed here.
    fn drop(&mut self) {
        self.shared.with(|s| s.stopping = true);
        if let Some(thread) = self.thread.take() {
            drop(thread.join());
        }
        let left = self.shared.with(|s| std::mem::take(&mut s.made));
        drop(left);
    }
}

/// The step's host-activation buffers being page-locked on a thread of their own ([`ActivationBuffers::start`]);
/// dropping it before [`ActivationBuffers::install`] stops the thread and frees them.
pub struct ActivationBuffers {
    #[cfg(feature = "cuda")]
    work: Prelocking<super::activations_cuda::Pooled>,
    #[cfg(not(feature = "cuda"))]
    never: std::convert::Infallible,
}

impl ActivationBuffers {
    /// Starts page-locking one chunk of each of `chunk_bytes` (as the plan sizes a step's page-locked saved
    /// inputs and kept attention, one chunk per block) for host activations on a CUDA `device`. `Ok(None)` on any
    /// other device or with nothing to lock; an error when the thread cannot start.
    pub fn start(device: &Device, chunk_bytes: Vec<usize>) -> std::io::Result<Option<Self>> {
        if chunk_bytes.iter().all(|&b| b == 0) {
            return Ok(None);
        }
        #[cfg(feature = "cuda")]
        if let Device::Cuda(dev) = device {
            let alloc = super::activations_cuda::chunk_allocator(dev);
            return Prelocking::start(chunk_bytes, alloc).map(|work| Some(Self { work }));
        }
        let _ = device;
        Ok(None)
    }

    /// Waits for the thread and hands what it locked to the step's page-locked host activations: from the next
    /// step on their saved tensors are laid into these chunks (what does not fit is allocated as before).
    pub fn install(self) -> PrelockReport {
        #[cfg(feature = "cuda")]
        {
            let (chunks, report) = self.work.finish();
            if !chunks.is_empty() {
                super::activations_cuda::install_arena(chunks);
            }
            report
        }
        #[cfg(not(feature = "cuda"))]
        match self.never {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::mpsc;

    /// A chunk that counts how many of its kind are alive.
    struct Counted {
        bytes: Vec<u8>,
        alive: Arc<AtomicUsize>,
    }

    impl Counted {
        fn new(len: usize, alive: &Arc<AtomicUsize>) -> Self {
            alive.fetch_add(1, Ordering::SeqCst);
            Self {
                bytes: vec![0; len],
                alive: alive.clone(),
            }
        }
    }

    impl Drop for Counted {
        fn drop(&mut self) {
            self.alive.fetch_sub(1, Ordering::SeqCst);
        }
    }

    impl HostChunk for Counted {
        fn base(&mut self) -> *mut u8 {
            self.bytes.as_mut_ptr()
        }
        fn len(&self) -> usize {
            self.bytes.len()
        }
    }

    #[test]
    fn every_chunk_is_allocated_once_at_its_size() {
        let alive = Arc::new(AtomicUsize::new(0));
        let made = alive.clone();
        let work = Prelocking::start(vec![3, 5, 7], move |n| Ok(Counted::new(n, &made)))
            .expect("thread starts");
        let (chunks, report) = work.finish();
        assert_eq!(
            chunks.iter().map(HostChunk::len).collect::<Vec<_>>(),
            [3, 5, 7]
        );
        assert_eq!((report.bytes, report.chunks, report.failure), (15, 3, None));
        assert_eq!(alive.load(Ordering::SeqCst), 3, "nothing allocated twice");
        drop(chunks);
        assert_eq!(alive.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_failed_allocation_frees_what_was_made_and_says_why() {
        let alive = Arc::new(AtomicUsize::new(0));
        let made = alive.clone();
        let work = Prelocking::start(vec![4, 4, 4], move |n| {
            if made.load(Ordering::SeqCst) == 2 {
                Err("out of page-locked memory".to_string())
            } else {
                Ok(Counted::new(n, &made))
            }
        })
        .expect("thread starts");
        let (chunks, report) = work.finish();
        assert!(chunks.is_empty());
        assert_eq!(alive.load(Ordering::SeqCst), 0, "the two made are freed");
        assert_eq!((report.bytes, report.chunks), (0, 0));
        let line = report.describe();
        assert!(
            line.contains("out of page-locked memory")
                && line.contains("the first step page-locks them as it needs them"),
            "{line}"
        );
    }

    #[test]
    fn a_stopped_thread_makes_no_more_chunks_and_frees_its_own() {
        let alive = Arc::new(AtomicUsize::new(0));
        let calls = Arc::new(AtomicUsize::new(0));
        let (made, called) = (alive.clone(), calls.clone());
        // The thread makes its first chunk, says so, and waits to be let go before returning it.
        let (made_tx, made_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let work = Prelocking::start(vec![8; 100], move |n| {
            called.fetch_add(1, Ordering::SeqCst);
            let chunk = Counted::new(n, &made);
            let _ = made_tx.send(());
            let _ = go_rx.recv();
            Ok(chunk)
        })
        .expect("thread starts");
        made_rx.recv().expect("the first chunk is being made");
        work.stop();
        drop(go_tx);
        drop(work);
        assert_eq!(calls.load(Ordering::SeqCst), 1, "no chunk after the stop");
        assert_eq!(
            alive.load(Ordering::SeqCst),
            0,
            "the stopped thread's chunk is freed"
        );
    }

    #[test]
    fn buffers_made_ahead_come_in_turn_then_the_caller_makes_its_own() {
        let alive = Arc::new(AtomicUsize::new(0));
        let made = alive.clone();
        let ahead = Ahead::start(2, move || Ok(Counted::new(4, &made))).expect("thread starts");
        let first = ahead.next().expect("first");
        let second = ahead.next().expect("second");
        assert_eq!((first.len(), second.len()), (4, 4));
        assert!(ahead.next().is_none(), "only two were asked for");
        drop(ahead);
        assert_eq!(alive.load(Ordering::SeqCst), 2, "the taken ones stay");
        drop((first, second));
        assert_eq!(alive.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_failure_ahead_leaves_the_rest_to_the_caller() {
        let alive = Arc::new(AtomicUsize::new(0));
        let made = alive.clone();
        let ahead = Ahead::start(5, move || {
            if made.load(Ordering::SeqCst) == 2 {
                Err("no more page-locked memory".to_string())
            } else {
                Ok(Counted::new(4, &made))
            }
        })
        .expect("thread starts");
        let taken = [ahead.next(), ahead.next(), ahead.next(), ahead.next()];
        assert_eq!(
            taken.iter().map(Option::is_some).collect::<Vec<_>>(),
            [true, true, false, false]
        );
        drop((ahead, taken));
        assert_eq!(alive.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn buffers_nobody_took_are_freed_with_the_handle() {
        let alive = Arc::new(AtomicUsize::new(0));
        let made = alive.clone();
        let ahead = Ahead::start(3, move || Ok(Counted::new(4, &made))).expect("thread starts");
        let taken = ahead.next().expect("one");
        drop(ahead);
        assert_eq!(
            alive.load(Ordering::SeqCst),
            1,
            "only the taken one is left"
        );
        drop(taken);
        assert_eq!(alive.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn the_line_says_what_was_locked_and_the_wait() {
        let report = PrelockReport {
            bytes: 45 << 30,
            chunks: 40,
            secs: 17.94,
            waited_secs: 0.31,
            failure: None,
        };
        assert_eq!(
            report.describe(),
            "activation buffers: 45.0 GiB page-locked in 17.9 s on a thread of their own beside the setup (40 \
             chunks); the first step waited 0.3 s for them"
        );
    }

    #[test]
    fn nothing_to_lock_or_no_cuda_device_starts_nothing() {
        assert!(ActivationBuffers::start(&Device::Cpu, vec![1 << 20])
            .expect("no thread needed")
            .is_none());
        assert!(ActivationBuffers::start(&Device::Cpu, vec![0, 0])
            .expect("no thread needed")
            .is_none());
    }
}
