//! Host memory for block streaming: pageable buffers whose pages may be transparent huge pages (Linux), and a
//! parallel copy with non-temporal stores on a thread pool of its own, which moves a packed block from pageable
//! into page-locked memory about as fast as the copy engine drains it.

// `mmap`/`madvise` and SSE2 streaming stores are calls Rust cannot check: this module (with the CUDA backends)
// is where streaming uses `unsafe`. Each block says what it relies on.
#![allow(unsafe_code)]

use std::ops::{Deref, DerefMut};

use candle_core::Result;

/// The size (and alignment) of a transparent huge page on x86_64 and on common aarch64 kernels.
#[cfg(target_os = "linux")]
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// Below this many bytes a copy stays on the calling thread (waking the pool costs more than it saves).
const PARALLEL_MIN_BYTES: usize = 4 << 20;

/// Zero-initialised pageable host memory. On Linux, buffers of at least a huge page are a private anonymous
/// mapping aligned to 2 MiB and advised `MADV_HUGEPAGE` before anything touches them, so that with THP in
/// `madvise` mode the kernel backs them with huge pages (fewer TLB misses for the staging copy: measured 62 vs
/// 56 GB/s on the H200 test machine); everywhere else, and when the mapping fails, a plain heap buffer.
pub struct HostBuffer {
    inner: Inner,
}

enum Inner {
    #[cfg(target_os = "linux")]
    Mapped(Mapping),
    Heap(Vec<u8>),
}

impl HostBuffer {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> Self {
        #[cfg(target_os = "linux")]
        if len >= HUGE_PAGE_BYTES {
            if let Some(m) = Mapping::new(len) {
                return Self {
                    inner: Inner::Mapped(m),
                };
            }
        }
        Self {
            inner: Inner::Heap(vec![0u8; len]),
        }
    }

    /// Whether the kernel accepted the huge-page advice for this buffer (it may still back it with small pages).
    pub fn huge_page_advised(&self) -> bool {
        match &self.inner {
            #[cfg(target_os = "linux")]
            Inner::Mapped(m) => m.advised,
            Inner::Heap(_) => false,
        }
    }
}

impl Deref for HostBuffer {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.inner {
            #[cfg(target_os = "linux")]
            Inner::Mapped(m) => m.as_slice(),
            Inner::Heap(v) => v,
        }
    }
}

impl DerefMut for HostBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.inner {
            #[cfg(target_os = "linux")]
            Inner::Mapped(m) => m.as_mut_slice(),
            Inner::Heap(v) => v,
        }
    }
}

/// A private anonymous mapping of `len` usable bytes starting on a huge-page boundary.
#[cfg(target_os = "linux")]
struct Mapping {
    base: *mut libc::c_void,
    map_len: usize,
    start: *mut u8,
    len: usize,
    advised: bool,
}

// SAFETY: the mapping is owned by this value alone (like a `Vec<u8>`'s heap block); `&`/`&mut` access follows
// the usual borrow rules through `as_slice`/`as_mut_slice`.
#[cfg(target_os = "linux")]
unsafe impl Send for Mapping {}
// SAFETY: as above; shared access only reads.
#[cfg(target_os = "linux")]
unsafe impl Sync for Mapping {}

#[cfg(target_os = "linux")]
impl Mapping {
    fn new(len: usize) -> Option<Self> {
        // One extra huge page leaves room to start on a 2 MiB boundary; the advised range is whole huge pages.
        let advised_len = len.checked_next_multiple_of(HUGE_PAGE_BYTES)?;
        let map_len = advised_len.checked_add(HUGE_PAGE_BYTES)?;
        // SAFETY: a fresh private anonymous mapping; no existing memory is affected. Anonymous pages read as zero.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED || base.is_null() {
            return None;
        }
        let offset = (base as usize).next_multiple_of(HUGE_PAGE_BYTES) - base as usize;
        // SAFETY: `offset < HUGE_PAGE_BYTES` and `offset + advised_len <= map_len`, so the range lies in the mapping.
        let start = unsafe { base.cast::<u8>().add(offset) };
        // SAFETY: a page-aligned range inside our own mapping, advised before its first touch. Failure (THP
        // disabled, an old kernel) only means small pages.
        let advised = unsafe { libc::madvise(start.cast(), advised_len, libc::MADV_HUGEPAGE) } == 0;
        Some(Self {
            base,
            map_len,
            start,
            len,
            advised,
        })
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: `start` holds `len` readable, initialised (zero-filled) bytes for as long as the mapping lives.
        unsafe { std::slice::from_raw_parts(self.start, self.len) }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.start, self.len) }
    }
}

#[cfg(target_os = "linux")]
impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping `mmap` returned; no slice of it outlives `self`.
        unsafe { libc::munmap(self.base, self.map_len) };
    }
}

/// A large copy spread over a rayon pool of its own, one contiguous piece per thread, each written with
/// non-temporal stores (x86_64): the destination (page-locked staging memory, read next by the copy engine) is
/// not pulled through the caches, which nearly doubles the copy rate (measured on the H200 test machine with a
/// concurrent host → device DMA: 35 GB/s with memcpy, 56 GB/s streaming from 12 threads). A pool of its own keeps
/// the copy from queueing behind, or stalling, work on the global pool.
pub struct CopyPool {
    pool: rayon::ThreadPool,
    threads: usize,
}

impl CopyPool {
    /// A pool of `min(available parallelism, max_threads)` threads (at least one).
    pub fn new(max_threads: usize) -> Result<Self> {
        let available = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = available.min(max_threads).max(1);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("framesmith-copy-{i}"))
            .build()
            .map_err(|e| candle_core::Error::Msg(format!("cannot start the copy threads: {e}")))?;
        Ok(Self { pool, threads })
    }

    /// Threads in the pool.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Copies `src` into `dst` (same length); returns once every byte is written and visible to other threads
    /// and to devices reading host memory.
    pub fn copy(&self, src: &[u8], dst: &mut [u8]) -> Result<()> {
        if src.len() != dst.len() {
            candle_core::bail!("copy of {} bytes into {} bytes", src.len(), dst.len());
        }
        if src.len() < PARALLEL_MIN_BYTES || self.threads == 1 {
            copy_streaming(src, dst);
            return Ok(());
        }
        // Pieces end on page boundaries of the destination (page-locked buffers are page-aligned), so every
        // piece after the first starts 16-byte aligned and whole cache lines are streamed.
        let piece = src.len().div_ceil(self.threads).next_multiple_of(4096);
        self.pool.scope(|scope| {
            for (d, s) in dst.chunks_mut(piece).zip(src.chunks(piece)) {
                scope.spawn(move |_| copy_streaming(s, d));
            }
        });
        Ok(())
    }
}

/// Copies `src` into `dst` (equal lengths) with non-temporal 16-byte stores on x86_64: a plain copy for the head
/// up to the first 16-byte-aligned destination address and for the tail, streaming stores between, and a store
/// fence at the end so the bytes are visible once this returns. A plain copy on other targets.
fn copy_streaming(src: &[u8], dst: &mut [u8]) {
    let len = src.len().min(dst.len());
    let (src, dst) = (&src[..len], &mut dst[..len]);
    #[cfg(target_arch = "x86_64")]
    {
        let head = dst.as_ptr().align_offset(16).min(len);
        let body = (len - head) / 16 * 16;
        let (dst_head, rest) = dst.split_at_mut(head);
        let (dst_body, dst_tail) = rest.split_at_mut(body);
        dst_head.copy_from_slice(&src[..head]);
        stream_aligned(&src[head..head + body], dst_body);
        dst_tail.copy_from_slice(&src[head + body..]);
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
}

/// The streaming part: `dst` starts 16-byte aligned and both have the same length, a multiple of 16.
#[cfg(target_arch = "x86_64")]
fn stream_aligned(src: &[u8], dst: &mut [u8]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    let n = dst.len().min(src.len()) / 16;
    if n == 0 {
        return;
    }
    let s = src.as_ptr().cast::<__m128i>();
    let d = dst.as_mut_ptr().cast::<__m128i>();
    // Four vectors (one cache line) per iteration keeps several loads in flight.
    let lines = n / 4;
    // SAFETY: SSE2 is part of the x86_64 baseline. Every index below `n` addresses 16 bytes inside `src` (unaligned
    // loads) and inside `dst`, whose start is 16-byte aligned as the streaming store requires; `dst` is borrowed
    // mutably, so nothing else reads or writes it meanwhile. The fence orders the streaming stores before any
    // later store, and so before whatever tells another thread or a device that the copy is done.
    unsafe {
        for i in 0..lines {
            let k = i * 4;
            let a = _mm_loadu_si128(s.add(k));
            let b = _mm_loadu_si128(s.add(k + 1));
            let c = _mm_loadu_si128(s.add(k + 2));
            let e = _mm_loadu_si128(s.add(k + 3));
            _mm_stream_si128(d.add(k), a);
            _mm_stream_si128(d.add(k + 1), b);
            _mm_stream_si128(d.add(k + 2), c);
            _mm_stream_si128(d.add(k + 3), e);
        }
        for k in lines * 4..n {
            _mm_stream_si128(d.add(k), _mm_loadu_si128(s.add(k)));
        }
        _mm_sfence();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, RngCore, SeedableRng};

    fn random_bytes(rng: &mut impl RngCore, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        rng.fill_bytes(&mut v);
        v
    }

    /// Copies a random range of a random source into a random offset of a canary-filled destination and checks
    /// the copied range byte for byte and that nothing around it changed.
    fn check_copy(rng: &mut rand::rngs::StdRng, len: usize, copy: &dyn Fn(&[u8], &mut [u8])) {
        let (src_off, dst_off) = (rng.random_range(0..64), rng.random_range(0..64));
        let src = random_bytes(rng, src_off + len);
        let mut dst = vec![0xA5u8; dst_off + len + 64];
        copy(&src[src_off..], &mut dst[dst_off..dst_off + len]);
        assert_eq!(
            &dst[dst_off..dst_off + len],
            &src[src_off..],
            "len {len} src +{src_off} dst +{dst_off}"
        );
        assert!(dst[..dst_off].iter().all(|&b| b == 0xA5), "head clobbered");
        assert!(
            dst[dst_off + len..].iter().all(|&b| b == 0xA5),
            "tail clobbered"
        );
    }

    #[test]
    fn streaming_copy_equals_the_source_at_every_size_and_offset() {
        let rng = &mut rand::rngs::StdRng::seed_from_u64(1);
        for len in (0..80).chain([127, 128, 129, 4095, 4096, 65_537]) {
            check_copy(rng, len, &|s, d| copy_streaming(s, d));
        }
        for _ in 0..20 {
            let len = rng.random_range(0..200_000);
            check_copy(rng, len, &|s, d| copy_streaming(s, d));
        }
    }

    #[test]
    fn pool_copy_equals_the_source_across_pieces() -> Result<()> {
        let pool = CopyPool::new(3)?;
        assert!((1..=3).contains(&pool.threads()));
        let rng = &mut rand::rngs::StdRng::seed_from_u64(2);
        for len in [
            0,
            1000,
            PARALLEL_MIN_BYTES - 1,
            PARALLEL_MIN_BYTES + 4097,
            9 << 20,
        ] {
            check_copy(rng, len, &|s, d| pool.copy(s, d).unwrap());
        }
        for _ in 0..3 {
            let len = rng.random_range(PARALLEL_MIN_BYTES..7 << 20);
            check_copy(rng, len, &|s, d| pool.copy(s, d).unwrap());
        }
        let mut short = vec![0u8; 10];
        assert!(pool.copy(&[1u8; 11], &mut short).is_err());
        Ok(())
    }

    #[test]
    fn host_buffers_are_zeroed_writable_and_huge_page_aligned() {
        for len in [
            0,
            5,
            HUGE_PAGE_BYTES - 1,
            HUGE_PAGE_BYTES + 3,
            3 * HUGE_PAGE_BYTES,
        ] {
            let mut buf = HostBuffer::zeroed(len);
            assert_eq!(buf.len(), len);
            assert!(buf.iter().all(|&b| b == 0));
            if len > 0 {
                buf[len - 1] = 7;
                buf[0] = 9;
                assert_eq!((buf[0], buf[len - 1]), (9, 7));
            }
            #[cfg(target_os = "linux")]
            if len >= HUGE_PAGE_BYTES {
                assert_eq!(buf.as_ptr() as usize % HUGE_PAGE_BYTES, 0, "len {len}");
            }
        }
    }
}
