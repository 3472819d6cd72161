//! Data-parallel training over several GPUs (one process per GPU, like torchrun): who this process is, which
//! micro-batches it trains, and the collective its gradients are averaged through.
//!
//! **Sharding.** The run's micro-batches form one stream in the seeded order of `TrainSet::batch_at` (global
//! micro-batch `i` is the same batch whatever the world size). Optimizer step `s` takes `accumulation × world`
//! consecutive micro-batches from it, and rank `r` trains the `accumulation` of them starting at
//! `s × accumulation × world + r × accumulation`. So every batch is trained exactly once per epoch for any world
//! size, by exactly one rank. When batches per epoch is not a multiple of `accumulation × world`, the last step
//! of an epoch takes its remaining micro-batches from the start of the next epoch's order (as a one-GPU run with
//! accumulation does): nothing is dropped or repeated, and no rank idles.
//!
//! **Averaging.** Each rank scales its micro-batch gradients by `1 / (accumulation × world)` (so the all-reduced
//! sum is the mean), sums them, and the ranks all-reduce the sums; every rank then takes the same optimizer step
//! on the same gradients. This is the one-process run with `accumulation × world` micro-batches per step: with
//! one micro-batch per rank and a reduction in rank order (the CPU collective) bit-exact, otherwise equal within
//! rounding (the additions are grouped differently).

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use framesmith_nn::collective::rendezvous::RendezvousSpec;
use framesmith_nn::collective::{Collective, Solo};

/// One process of a run over several GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankSpec {
    pub rank: usize,
    /// How many processes (GPUs) train together.
    pub world: usize,
    /// The CUDA device this rank trains on (overrides `training.device`); `None` keeps the config's.
    pub gpu: Option<usize>,
    /// Rank 0's host, where it listens for the others.
    pub master_addr: String,
    pub master_port: u16,
    /// How long the ranks wait for each other to start, and for a lost rank before stopping.
    pub timeout: Duration,
    /// Ranks on this machine, whose host RAM adds up in the memory plan (torchrun's LOCAL_WORLD_SIZE; every rank
    /// when rank 0 is this machine's loopback address, as with `--gpus`; else 1).
    pub ranks_on_machine: usize,
}

/// Seconds the ranks wait for each other by default: long enough for every rank to load a 14B model.
pub const DEFAULT_TIMEOUT_SECS: u64 = 900;

impl RankSpec {
    pub fn rendezvous(&self) -> RendezvousSpec {
        RendezvousSpec {
            rank: self.rank,
            world: self.world,
            addr: self.master_addr.clone(),
            port: self.master_port,
            timeout: self.timeout,
        }
    }
}

/// Which ranks a trainer trains with.
#[derive(Clone, Default)]
pub enum Ranks {
    /// One process: no collective.
    #[default]
    One,
    /// Join the run `RankSpec` describes (NCCL over GPUs).
    Join(RankSpec),
    /// A collective made by the caller (tests: ranks as threads).
    Group(Arc<dyn Collective>),
}

impl Ranks {
    /// One process training on `gpu` (`framesmith train --gpus N`, the app's one chosen GPU): a world of one, on
    /// that GPU whatever `training.device` says; `None` keeps the config's device.
    pub fn on_gpu(gpu: Option<usize>, timeout: Duration) -> Self {
        Ranks::Join(RankSpec {
            rank: 0,
            world: 1,
            gpu,
            ranks_on_machine: 1,
            master_addr: "127.0.0.1".into(),
            master_port: 0,
            timeout,
        })
    }

    /// The collective for a trainer on `device`.
    pub fn collective(&self, device: &candle_core::Device) -> anyhow::Result<Arc<dyn Collective>> {
        Ok(match self {
            Ranks::One => Arc::new(Solo),
            Ranks::Group(c) => c.clone(),
            Ranks::Join(spec) => {
                framesmith_nn::collective::join_gpu(device, &spec.rendezvous(), spec.timeout)?
            }
        })
    }

    /// This process's rank (0 for one process).
    pub fn rank(&self) -> usize {
        match self {
            Ranks::One => 0,
            Ranks::Join(spec) => spec.rank,
            Ranks::Group(c) => c.rank(),
        }
    }
}

/// The global micro-batch indices rank `rank` of `world` trains in optimizer step `step` (0-based).
pub fn micro_indices(step: usize, accumulation: usize, rank: usize, world: usize) -> Range<usize> {
    let start = (step * world + rank) * accumulation;
    start..start + accumulation
}

/// Optimizer steps of `epochs` epochs of `batches_per_epoch` batches, `accumulation × world` micro-batches a
/// step (the last step of the run may reach into the next epoch's order).
pub fn steps_for_epochs(
    epochs: usize,
    batches_per_epoch: usize,
    accumulation: usize,
    world: usize,
) -> usize {
    epochs * batches_per_epoch.div_ceil((accumulation * world).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::data::{TrainItem, TrainSet};
    use candle_core::{DType, Device, Tensor};

    fn item(key: String, frames: usize) -> TrainItem {
        TrainItem {
            key,
            latents: Tensor::zeros((1, frames, 2, 2), DType::F32, &Device::Cpu).unwrap(),
            context: Tensor::zeros((1, 1), DType::F32, &Device::Cpu).unwrap(),
            image: None,
            clip: None,
            control: Vec::new(),
            second_text: None,
            audio: None,
        }
    }

    /// Items of two latent shapes, so that buckets of several sizes make up the batches.
    fn train_set(items: usize, batch: usize, seed: u64) -> TrainSet {
        let items = (0..items)
            .map(|i| item(format!("item{i}"), 1 + i % 2))
            .collect();
        TrainSet::new(items, batch, 1, seed).unwrap()
    }

    #[test]
    fn every_batch_is_trained_once_per_epoch_by_one_rank_for_any_world() {
        for world in 1..=8 {
            for accumulation in 1..=3 {
                for items in [1usize, 2, 3, 5, 7, 8, 13, 16, 31] {
                    // Half the items (rounded up) share the larger bucket; no batch can be larger.
                    for batch in [1, 2, 3].into_iter().filter(|&b| b <= items.div_ceil(2)) {
                        let set = train_set(items, batch, 7 + world as u64);
                        let per_epoch = set.batches_per_epoch();
                        let epochs = 3;
                        let steps = steps_for_epochs(epochs, per_epoch, accumulation, world);
                        // (epoch, batch's first key) → how many times it was trained, and by which rank.
                        let mut seen =
                            std::collections::BTreeMap::<(usize, String), Vec<usize>>::new();
                        for step in 0..steps {
                            for rank in 0..world {
                                for index in micro_indices(step, accumulation, rank, world) {
                                    let (epoch, batch) = set.batch_at(index);
                                    let keys: Vec<&str> =
                                        batch.iter().map(|i| i.key.as_str()).collect();
                                    seen.entry((epoch, keys.join("+"))).or_default().push(rank);
                                }
                            }
                        }
                        let case = format!("world {world}, accumulation {accumulation}, {items} items, batch {batch}");
                        for epoch in 1..=epochs {
                            let in_epoch: Vec<_> =
                                seen.iter().filter(|((e, _), _)| *e == epoch).collect();
                            assert_eq!(
                                in_epoch.len(),
                                per_epoch,
                                "{case}: epoch {epoch} misses batches"
                            );
                            for (key, ranks) in in_epoch {
                                assert_eq!(
                                    ranks.len(),
                                    1,
                                    "{case}: {key:?} trained by ranks {ranks:?}"
                                );
                            }
                        }
                        // The ranks' micro-batches of a step are the one-process step's, with
                        // `accumulation × world` micro-batches.
                        for step in 0..steps {
                            let mut all: Vec<usize> = (0..world)
                                .flat_map(|r| micro_indices(step, accumulation, r, world))
                                .collect();
                            all.sort_unstable();
                            assert_eq!(
                                all,
                                micro_indices(step, accumulation * world, 0, 1).collect::<Vec<_>>()
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_world_of_one_trains_what_one_process_does() {
        assert_eq!(micro_indices(0, 1, 0, 1), 0..1);
        assert_eq!(micro_indices(5, 2, 0, 1), 10..12);
        assert_eq!(micro_indices(5, 2, 1, 3), 32..34);
        assert_eq!(steps_for_epochs(2, 10, 1, 1), 20);
        assert_eq!(steps_for_epochs(2, 10, 2, 2), 6);
        assert_eq!(steps_for_epochs(1, 3, 1, 8), 1);
    }
}
