//! Host memory set aside before a run's first step for the step's host activations: a few large chunks (one per
//! block, as the plan sizes them), into which the step's saved tensors are laid one after the other as they come
//! (a block's input, then what it keeps of its attention, then the next block's). Space is handed out, never
//! reused while any of it is out, and the layout starts over once every piece has come back (the step's end).
//! A tensor that does not fit what is left is not placed: the caller allocates it on its own, as without chunks.
// The pieces handed out are byte ranges of the chunks, made into slices here: this module is where the host
// activations' lending uses `unsafe`. Each block says what it relies on.
#![allow(unsafe_code)]
// Only CUDA builds lend from an arena (their page-locked chunks); elsewhere the tests use it.
#![cfg_attr(not(feature = "cuda"), allow(dead_code))]

use std::sync::{Arc, Mutex};

/// A chunk of host memory the arena lends from: its bytes stay where they are for as long as it lives.
pub(crate) trait HostChunk: Send + 'static {
    /// The chunk's first byte.
    fn base(&mut self) -> *mut u8;
    /// Its length in bytes.
    fn len(&self) -> usize;
}

#[cfg(test)]
impl HostChunk for Vec<u8> {
    fn base(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }

    fn len(&self) -> usize {
        Vec::len(self)
    }
}

/// Where the next piece goes and how many are out: pieces are laid in order through the chunks (a piece that does
/// not fit what is left of a chunk goes to the start of the next one it fits), and the layout starts over when
/// none is out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cursor {
    chunks: Vec<usize>,
    chunk: usize,
    offset: usize,
    out: usize,
}

impl Cursor {
    /// A layout over chunks of these lengths.
    pub(crate) fn new(chunks: Vec<usize>) -> Self {
        Self {
            chunks,
            chunk: 0,
            offset: 0,
            out: 0,
        }
    }

    /// (chunk, offset) of a new piece of `bytes`, or `None` when no chunk from here on has room (nothing moves).
    pub(crate) fn place(&mut self, bytes: usize) -> Option<(usize, usize)> {
        let (chunk, offset) = (self.chunk..self.chunks.len()).find_map(|k| {
            let start = if k == self.chunk { self.offset } else { 0 };
            (self.chunks[k] - start >= bytes).then_some((k, start))
        })?;
        self.chunk = chunk;
        self.offset = offset + bytes;
        self.out += 1;
        Some((chunk, offset))
    }

    /// A piece came back; with none out, the next piece goes to the start again.
    pub(crate) fn give_back(&mut self) {
        self.out = self.out.saturating_sub(1);
        if self.out == 0 {
            self.chunk = 0;
            self.offset = 0;
        }
    }

    /// Pieces handed out and not yet back.
    #[cfg(test)]
    pub(crate) fn out(&self) -> usize {
        self.out
    }
}

/// The address of a chunk's first byte, usable from any thread (the chunk is owned by the arena alongside it).
#[derive(Clone, Copy)]
struct Base(*mut u8);
// SAFETY: a plain address of memory the arena owns; who may touch which bytes is the cursor's to say.
unsafe impl Send for Base {}
// SAFETY: as above; the address itself is only read.
unsafe impl Sync for Base {}

struct Shared<C> {
    bases: Vec<Base>,
    cursor: Mutex<Cursor>,
    /// Owns the memory behind `bases`; freed once the arena and every piece lent from it are gone. Never locked:
    /// the mutex only makes the arena shareable between threads whatever the chunk type.
    _chunks: Mutex<Vec<C>>,
}

/// Chunks lending pieces of themselves ([`Arena::lend`]). Cheap to clone; the chunks are freed when the arena and
/// every piece lent from it are gone, so no piece outlives its memory.
pub(crate) struct Arena<C> {
    shared: Arc<Shared<C>>,
}

impl<C> Clone for Arena<C> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<C: HostChunk> Arena<C> {
    /// An arena over `chunks`.
    pub(crate) fn new(mut chunks: Vec<C>) -> Self {
        let bases = chunks.iter_mut().map(|c| Base(c.base())).collect();
        let lens = chunks.iter().map(HostChunk::len).collect();
        Self {
            shared: Arc::new(Shared {
                bases,
                cursor: Mutex::new(Cursor::new(lens)),
                _chunks: Mutex::new(chunks),
            }),
        }
    }

    /// A piece of `bytes` laid after the pieces already out, or `None` when it does not fit what is left.
    pub(crate) fn lend(&self, bytes: usize) -> Option<Lent<C>> {
        let (chunk, offset) = self.shared.cursor.lock().ok()?.place(bytes)?;
        // SAFETY: the cursor placed `offset + bytes` within chunk `chunk`, so the address lies inside it.
        let ptr = unsafe { self.shared.bases[chunk].0.add(offset) };
        Some(Lent {
            shared: self.shared.clone(),
            ptr: Base(ptr),
            len: bytes,
        })
    }

    /// Pieces out now.
    #[cfg(test)]
    pub(crate) fn out(&self) -> usize {
        self.shared.cursor.lock().map_or(0, |c| c.out())
    }
}

/// A piece of an arena's chunk, handed back when dropped.
pub(crate) struct Lent<C> {
    shared: Arc<Shared<C>>,
    ptr: Base,
    len: usize,
}

impl<C> Lent<C> {
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` bytes inside a chunk that `shared` keeps alive; the cursor hands a range to one piece at a
        // time and reuses it only after every piece came back, so no other piece overlaps this one.
        unsafe { std::slice::from_raw_parts(self.ptr.0, self.len) }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes this the only view of the range.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.0, self.len) }
    }
}

impl<C> Drop for Lent<C> {
    fn drop(&mut self) {
        if let Ok(mut cursor) = self.shared.cursor.lock() {
            cursor.give_back();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_of_the_planned_sizes_fills_one_chunk_per_block() {
        // Two blocks: a saved input of 8, an attention output of 8 and a log-sum-exp of 2 each.
        let mut cursor = Cursor::new(vec![18, 18]);
        let placed: Vec<_> = [8, 8, 2, 8, 8, 2]
            .into_iter()
            .map(|b| cursor.place(b))
            .collect();
        assert_eq!(
            placed,
            [
                Some((0, 0)),
                Some((0, 8)),
                Some((0, 16)),
                Some((1, 0)),
                Some((1, 8)),
                Some((1, 16))
            ]
        );
        assert_eq!(cursor.place(1), None, "nothing is left");
        assert_eq!(cursor.out(), 6);
    }

    #[test]
    fn smaller_steps_fit_and_larger_ones_spill_without_overlap() {
        let mut cursor = Cursor::new(vec![18, 18]);
        // A smaller clip: every block's pieces fit, the second block's input in what the first left.
        for b in [6, 6, 1, 6, 6, 1] {
            assert!(cursor.place(b).is_some());
        }
        (0..6).for_each(|_| cursor.give_back());
        // A larger clip: the third piece no longer fits chunk 0 and goes to chunk 1; what fits nowhere is refused
        // and moves nothing, so a smaller piece after it still finds room.
        assert_eq!(cursor.place(9), Some((0, 0)));
        assert_eq!(cursor.place(9), Some((0, 9)));
        assert_eq!(cursor.place(3), Some((1, 0)));
        assert_eq!(cursor.place(16), None);
        assert_eq!(cursor.place(15), Some((1, 3)));
        assert_eq!(cursor.place(0), Some((1, 18)));
    }

    #[test]
    fn space_is_reused_only_once_every_piece_is_back() {
        let mut cursor = Cursor::new(vec![10]);
        assert_eq!(cursor.place(4), Some((0, 0)));
        assert_eq!(cursor.place(4), Some((0, 4)));
        cursor.give_back();
        assert_eq!(
            cursor.place(4),
            None,
            "a piece is still out: its bytes are not handed out again"
        );
        cursor.give_back();
        assert_eq!(cursor.place(10), Some((0, 0)), "all back: start over");
    }

    #[test]
    fn lent_pieces_are_disjoint_and_come_back_on_drop() {
        let arena = Arena::new(vec![vec![0u8; 12], vec![0u8; 12]]);
        let mut pieces: Vec<Lent<Vec<u8>>> = [5, 7, 6, 6]
            .into_iter()
            .map(|b| arena.lend(b).expect("room for it"))
            .collect();
        assert!(arena.lend(1).is_none());
        for (i, piece) in pieces.iter_mut().enumerate() {
            piece.as_mut_slice().fill(i as u8 + 1);
        }
        for (i, piece) in pieces.iter().enumerate() {
            assert!(
                piece.as_slice().iter().all(|&b| b == i as u8 + 1),
                "piece {i} was overwritten by another"
            );
        }
        assert_eq!(pieces.iter().map(Lent::len).sum::<usize>(), 24);
        pieces.pop();
        assert_eq!(arena.out(), 3);
        drop(pieces);
        assert_eq!(arena.out(), 0);
        assert!(
            arena.lend(12).is_some(),
            "every piece back: the layout starts over"
        );
    }

    #[test]
    fn chunks_live_as_long_as_a_piece_of_them() {
        let arena = Arena::new(vec![vec![7u8; 4]]);
        let piece = arena.lend(4).expect("room");
        drop(arena);
        assert_eq!(piece.as_slice(), [7, 7, 7, 7]);
    }
}
