//! Ranks as threads of one process: the collective the CPU tests train through. Each operation gathers every
//! rank's buckets, then each rank reduces them itself in rank order — so every rank gets bit-identical sums, and
//! the same sums on every run. A rank that does not arrive within the group's timeout, or that is dropped while
//! the others wait, makes their calls fail with an error naming it.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use candle_core::{Result, Tensor};

use super::Collective;

/// Every rank's buckets of one round, in rank order.
type Gathered = Arc<Vec<Vec<Vec<f32>>>>;

struct Round {
    /// Completed rounds.
    generation: u64,
    arrived: Vec<Option<Vec<Vec<f32>>>>,
    /// The last completed round's contributions.
    done: Option<Gathered>,
    /// Why the group cannot go on (a rank left or timed out).
    broken: Option<String>,
}

struct Shared {
    world: usize,
    timeout: Duration,
    round: Mutex<Round>,
    ready: Condvar,
}

/// One rank of a [`ThreadGroup`]; move each to its own thread.
pub struct ThreadRank {
    rank: usize,
    shared: Arc<Shared>,
}

/// Builds the ranks of an in-process group.
pub struct ThreadGroup;

impl ThreadGroup {
    /// `world` ranks whose calls fail after waiting `timeout` for the others.
    pub fn ranks(world: usize, timeout: Duration) -> Vec<ThreadRank> {
        let shared = Arc::new(Shared {
            world,
            timeout,
            round: Mutex::new(Round {
                generation: 0,
                arrived: vec![None; world],
                done: None,
                broken: None,
            }),
            ready: Condvar::new(),
        });
        (0..world)
            .map(|rank| ThreadRank {
                rank,
                shared: shared.clone(),
            })
            .collect()
    }
}

impl ThreadRank {
    fn lock(&self) -> Result<MutexGuard<'_, Round>> {
        self.shared
            .round
            .lock()
            .map_err(|_| candle_core::Error::Msg("a rank of the thread group panicked".into()))
    }

    /// Contributes `data` and waits for every rank's.
    fn exchange(&self, data: Vec<Vec<f32>>) -> Result<Gathered> {
        let mut round = self.lock()?;
        if let Some(why) = &round.broken {
            candle_core::bail!("rank {}: the group stopped: {why}", self.rank);
        }
        round.arrived[self.rank] = Some(data);
        if round.arrived.iter().all(Option::is_some) {
            let all: Vec<Vec<Vec<f32>>> =
                round.arrived.iter_mut().filter_map(Option::take).collect();
            let all = Arc::new(all);
            round.done = Some(all.clone());
            round.generation += 1;
            self.shared.ready.notify_all();
            return Ok(all);
        }
        let generation = round.generation;
        let deadline = Instant::now() + self.shared.timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let (next, _) = self.shared.ready.wait_timeout(round, left).map_err(|_| {
                candle_core::Error::Msg("a rank of the thread group panicked".into())
            })?;
            round = next;
            // Completed rounds first: a rank that left after the last round does not fail it.
            if round.generation != generation {
                return match &round.done {
                    Some(all) => Ok(all.clone()),
                    None => candle_core::bail!("rank {}: the round vanished", self.rank),
                };
            }
            if let Some(why) = &round.broken {
                candle_core::bail!("rank {}: the group stopped: {why}", self.rank);
            }
            if Instant::now() >= deadline {
                let missing: Vec<String> = round
                    .arrived
                    .iter()
                    .enumerate()
                    .filter(|(_, a)| a.is_none())
                    .map(|(r, _)| r.to_string())
                    .collect();
                let why = format!(
                    "rank(s) {} did not reach the collective within {:.0?}",
                    missing.join(", "),
                    self.shared.timeout
                );
                round.broken = Some(why.clone());
                self.shared.ready.notify_all();
                candle_core::bail!("rank {}: {why}", self.rank);
            }
        }
    }

    fn check_lengths(&self, all: &Gathered) -> Result<()> {
        let mine: Vec<usize> = all[self.rank].iter().map(Vec::len).collect();
        for (r, theirs) in all.iter().enumerate() {
            let lens: Vec<usize> = theirs.iter().map(Vec::len).collect();
            if lens != mine {
                candle_core::bail!(
                    "rank {r} sent buckets of {lens:?} elements and rank {} of {mine:?}: the ranks are out of step",
                    self.rank
                );
            }
        }
        Ok(())
    }
}

fn host(buckets: &[Tensor]) -> Result<Vec<Vec<f32>>> {
    buckets.iter().map(|b| b.to_vec1::<f32>()).collect()
}

fn back(values: &[Vec<f32>], like: &[Tensor]) -> Result<Vec<Tensor>> {
    values
        .iter()
        .zip(like)
        .map(|(v, t)| Tensor::from_slice(v, v.len(), t.device()))
        .collect()
}

impl Collective for ThreadRank {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.shared.world
    }

    fn all_reduce_sum(&self, buckets: &[Tensor]) -> Result<Vec<Tensor>> {
        let all = self.exchange(host(buckets)?)?;
        self.check_lengths(&all)?;
        let mut sums = all[0].clone();
        for theirs in &all[1..] {
            for (sum, bucket) in sums.iter_mut().zip(theirs) {
                sum.iter_mut().zip(bucket).for_each(|(s, v)| *s += v);
            }
        }
        back(&sums, buckets)
    }

    fn broadcast(&self, buckets: &[Tensor], root: usize) -> Result<Vec<Tensor>> {
        if root >= self.shared.world {
            candle_core::bail!(
                "broadcast from rank {root} in a world of {}",
                self.shared.world
            );
        }
        let all = self.exchange(host(buckets)?)?;
        self.check_lengths(&all)?;
        back(&all[root], buckets)
    }

    fn barrier(&self) -> Result<()> {
        self.exchange(Vec::new()).map(|_| ())
    }
}

impl Drop for ThreadRank {
    fn drop(&mut self) {
        if let Ok(mut round) = self.shared.round.lock() {
            // Safe after the last round too: every rank had arrived there, so none still waits on it.
            if round.broken.is_none() {
                round.broken = Some(format!("rank {} left the group", self.rank));
                self.shared.ready.notify_all();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn run<T: Send + 'static>(
        world: usize,
        timeout: Duration,
        f: impl Fn(ThreadRank) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let f = Arc::new(f);
        let handles: Vec<_> = ThreadGroup::ranks(world, timeout)
            .into_iter()
            .map(|rank| {
                let f = f.clone();
                std::thread::spawn(move || f(rank))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| panic!("a rank panicked")))
            .collect()
    }

    #[test]
    fn sums_in_rank_order_on_every_rank() {
        let out = run(4, Duration::from_secs(10), |c| -> Result<Vec<Vec<f32>>> {
            let r = c.rank() as f32;
            let a = Tensor::new(&[r, 1.0, 1e8], &Device::Cpu)?;
            let b = Tensor::new(&[r * 10.0], &Device::Cpu)?;
            let mut results = Vec::new();
            for _ in 0..3 {
                let sums = c.all_reduce_sum(&[a.clone(), b.clone()])?;
                results.push(sums[0].to_vec1::<f32>()?);
                results.push(sums[1].to_vec1::<f32>()?);
            }
            results.push(c.broadcast(std::slice::from_ref(&a), 2)?[0].to_vec1::<f32>()?);
            c.barrier()?;
            Ok(results)
        });
        let want_a = vec![6.0, 4.0, ((1e8f32 + 1e8) + 1e8) + 1e8];
        for rank in out {
            let rank = rank.unwrap_or_else(|e| panic!("{e}"));
            for round in 0..3 {
                assert_eq!(rank[2 * round], want_a);
                assert_eq!(rank[2 * round + 1], vec![60.0]);
            }
            assert_eq!(rank[6], vec![2.0, 1.0, 1e8]);
        }
    }

    #[test]
    fn a_rank_that_leaves_or_never_comes_fails_the_others_instead_of_hanging() {
        let started = Instant::now();
        let out = run(3, Duration::from_secs(30), |c| {
            if c.rank() == 1 {
                // Leaves after a short while, having done nothing: the others must not wait 30 s.
                std::thread::sleep(Duration::from_millis(200));
                return Ok(());
            }
            c.barrier()
        });
        assert!(out[1].is_ok());
        for r in [0, 2] {
            let err = out[r]
                .as_ref()
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains("rank 1 left"), "{err}");
        }
        assert!(started.elapsed() < Duration::from_secs(20));

        let out = run(2, Duration::from_millis(300), |c| {
            if c.rank() == 0 {
                std::thread::sleep(Duration::from_secs(2));
                return Ok(());
            }
            c.barrier()
        });
        let err = out[1]
            .as_ref()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("rank(s) 0 did not reach"), "{err}");
    }

    #[test]
    fn mismatched_buckets_are_an_error_not_garbage() {
        let out = run(2, Duration::from_secs(10), |c| {
            let n = 2 + c.rank();
            let t = Tensor::zeros(n, candle_core::DType::F32, &Device::Cpu)?;
            c.all_reduce_sum(&[t]).map(|_| ())
        });
        for r in out {
            let err = r.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains("out of step"), "{err}");
        }
    }
}
