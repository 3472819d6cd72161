//! Which block goes into which GPU slot, and when: the access order of a step is known in advance (the forward
//! walk, then the reverse walk of the checkpointed backward; or the forward walk repeated for sampling), so a
//! slot is refilled with the block whose next use is soonest, evicting the one used farthest in the future
//! (Belady's rule). That alone keeps the last blocks of the forward in their slots for the start of the backward.

/// A copy the ring asks the backend for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Load {
    pub slot: usize,
    pub block: usize,
}

/// What a fetch decided: where the block is, what to copy first, and which slot's previous use is now over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The slot the fetched block is (or will be) in.
    pub slot: usize,
    /// The slot of the previous fetch, whose reads are all queued now (it may be refilled after them).
    pub released: Option<usize>,
    /// Copies to start, the fetched block's first if it was not resident.
    pub loads: Vec<Load>,
}

/// Slot bookkeeping over a declared access order.
#[derive(Clone, Debug)]
pub struct Ring {
    slots: Vec<Option<usize>>,
    order: Vec<usize>,
    cyclic: bool,
    /// Index into `order` of the next expected fetch.
    pos: usize,
    current: Option<usize>,
}

impl Ring {
    /// A ring of `slots` empty slots (at least 1).
    pub fn new(slots: usize) -> Self {
        Self {
            slots: vec![None; slots.max(1)],
            order: Vec::new(),
            cyclic: false,
            pos: 0,
            current: None,
        }
    }

    /// Number of slots.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Always false: a ring has at least one slot.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The block held by each slot.
    pub fn contents(&self) -> &[Option<usize>] {
        &self.slots
    }

    /// Declares the order of the coming fetches (streamed blocks only). `cyclic`: the order repeats (sampling's
    /// forward passes), so the first blocks are prefetched while the last ones run.
    pub fn begin(&mut self, order: Vec<usize>, cyclic: bool) {
        self.order = order;
        self.cyclic = cyclic;
        self.pos = 0;
    }

    /// Positions from `pos` (exclusive) until `block` is used again; `None` if never.
    fn next_use(&self, block: usize, pos: usize) -> Option<usize> {
        let n = self.order.len();
        let horizon = if self.cyclic {
            n
        } else {
            n.saturating_sub(pos + 1)
        };
        (1..=horizon).find(|d| self.order[(pos + d) % n.max(1)] == block)
    }

    fn slot_of(&self, block: usize) -> Option<usize> {
        self.slots.iter().position(|s| *s == Some(block))
    }

    /// The slot to overwrite for a block needed `needed_in` positions after `pos`: an empty one, else the one
    /// whose block is needed farthest away (and later than `needed_in`); never `keep`.
    fn victim(&self, pos: Option<usize>, needed_in: usize, keep: Option<usize>) -> Option<usize> {
        let mut best: Option<(usize, usize)> = None;
        for (i, content) in self.slots.iter().enumerate() {
            if Some(i) == keep {
                continue;
            }
            let distance = match (content, pos) {
                (None, _) => usize::MAX,
                (Some(b), Some(p)) => self.next_use(*b, p).unwrap_or(usize::MAX - 1),
                (Some(_), None) => usize::MAX - 1,
            };
            if distance > needed_in && best.is_none_or(|(_, d)| distance > d) {
                best = Some((i, distance));
            }
        }
        best.map(|(i, _)| i)
    }

    /// Fetches `block`: returns where it is, the copies to start (the block itself if absent, then prefetches of
    /// the next blocks of the declared order into slots that are not needed sooner), and the slot released.
    pub fn fetch(&mut self, block: usize) -> Decision {
        let n = self.order.len();
        let pos = if n > 0 && (self.cyclic || self.pos < n) && self.order[self.pos % n] == block {
            let p = self.pos % n;
            self.pos = if self.cyclic {
                (p + 1) % n
            } else {
                self.pos + 1
            };
            Some(p)
        } else {
            None
        };
        let released = self.current.take();
        let mut loads = Vec::new();
        let slot = match self.slot_of(block) {
            Some(s) => s,
            None => {
                // Any slot will do when the block is needed now; prefer one not needed soon.
                let s = self.victim(pos, 0, None).unwrap_or(0);
                self.slots[s] = Some(block);
                loads.push(Load { slot: s, block });
                s
            }
        };
        self.current = Some(slot);
        if let Some(p) = pos {
            let ahead = if self.cyclic { n - 1 } else { n - p - 1 };
            for d in 1..=ahead.min(self.slots.len().saturating_sub(1)) {
                let next = self.order[(p + d) % n];
                if self.slot_of(next).is_some() {
                    continue;
                }
                match self.victim(Some(p), d, Some(slot)) {
                    Some(v) => {
                        self.slots[v] = Some(next);
                        loads.push(Load {
                            slot: v,
                            block: next,
                        });
                    }
                    None => break,
                }
            }
        }
        Decision {
            slot,
            released,
            loads,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replays `order` through a ring and returns the number of copies.
    fn copies(ring: &mut Ring, order: &[usize]) -> usize {
        let mut total = 0;
        for &b in order {
            let d = ring.fetch(b);
            assert_eq!(ring.contents()[d.slot], Some(b));
            total += d.loads.len();
        }
        total
    }

    #[test]
    fn step_order_reuses_the_last_forward_blocks() {
        let forward: Vec<usize> = (0..6).collect();
        let order: Vec<usize> = forward
            .iter()
            .chain(forward.iter().rev())
            .copied()
            .collect();
        let mut ring = Ring::new(2);
        ring.begin(order.clone(), false);
        // 6 forward loads; the backward starts with 5 and 4 still resident, then loads 3, 2, 1, 0.
        assert_eq!(copies(&mut ring, &order), 10);
    }

    #[test]
    fn prefetch_runs_one_ahead_and_never_evicts_the_block_in_use() {
        let order = vec![0, 1, 2, 3];
        let mut ring = Ring::new(2);
        ring.begin(order, false);
        let d = ring.fetch(0);
        assert_eq!(
            d.loads,
            vec![Load { slot: 0, block: 0 }, Load { slot: 1, block: 1 }]
        );
        let d = ring.fetch(1);
        assert_eq!(d.slot, 1);
        assert_eq!(d.released, Some(0));
        assert_eq!(d.loads, vec![Load { slot: 0, block: 2 }]);
    }

    #[test]
    fn cyclic_order_prefetches_the_first_block_during_the_last() {
        let mut ring = Ring::new(2);
        ring.begin(vec![0, 1, 2], true);
        copies(&mut ring, &[0, 1]);
        let d = ring.fetch(2);
        assert_eq!(d.loads.last(), Some(&Load { slot: 1, block: 0 }));
        // Three passes, 3 blocks, 2 slots: every fetch after the first needs exactly one copy.
        assert_eq!(copies(&mut ring, &[0, 1, 2, 0, 1, 2]), 6);
    }

    #[test]
    fn off_plan_fetches_still_load_the_block() {
        let mut ring = Ring::new(3);
        ring.begin(vec![0, 1, 2], false);
        let d = ring.fetch(7);
        assert_eq!(d.loads, vec![Load { slot: 0, block: 7 }]);
        assert_eq!(ring.fetch(7).loads, vec![]);
    }

    #[test]
    fn a_large_ring_keeps_everything_after_the_first_pass() {
        let order: Vec<usize> = (0..4).chain((0..4).rev()).collect();
        let mut ring = Ring::new(4);
        ring.begin(order.clone(), false);
        assert_eq!(copies(&mut ring, &order), 4);
    }
}
