//! Host memory for block streaming: pageable buffers whose pages may be transparent huge pages (Linux).

// `mmap`/`madvise` are calls Rust cannot check: this module (with the CUDA backends)
// is where streaming uses `unsafe`. Each block says what it relies on.
#![allow(unsafe_code)]

use std::ops::{Deref, DerefMut};

/// The size (and alignment) of a transparent huge page on x86_64 and on common aarch64 kernels.
#[cfg(target_os = "linux")]
const HUGE_PAGE_BYTES: usize = 2 << 20;

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

#[cfg(test)]
mod tests {
    use super::*;

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
