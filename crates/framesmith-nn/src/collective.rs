//! Collectives over the ranks of a data-parallel run: each rank (one process per GPU, or one thread in tests)
//! holds a [`Collective`] and calls the same operations in the same order. Three implementations:
//! - [`Solo`], a world of one: every operation returns its input (a one-GPU run pays nothing);
//! - [`threads::ThreadGroup`], ranks as threads of one process on any device (CPU tests): each reduction sums the
//!   ranks' values in rank order, so it is deterministic and identical on every rank;
//! - `nccl::NcclCollective` (feature `nccl`), one process per GPU through NCCL, its unique id exchanged over TCP
//!   by [`rendezvous`] (rank 0 listens on an address and port, like torchrun's MASTER_ADDR / MASTER_PORT).
//!
//! [`all_reduce_tensors`] sums tensors of any shape through flat f32 buckets.

use candle_core::{DType, Result, Tensor};

#[cfg(feature = "nccl")]
pub mod nccl;
pub mod rendezvous;
pub mod threads;

/// The operations a data-parallel step needs. Every rank must call the same operations, with buckets of the
/// same lengths, in the same order; a rank that stops (or dies) makes the others' calls fail — never hang
/// forever — within the implementation's timeout.
pub trait Collective: Send + Sync {
    /// This process's (or thread's) rank, 0-based.
    fn rank(&self) -> usize;
    /// How many ranks take part.
    fn world(&self) -> usize;
    /// Element-wise sums over all ranks of `buckets` (f32, 1-D, each the same length on every rank).
    fn all_reduce_sum(&self, buckets: &[Tensor]) -> Result<Vec<Tensor>>;
    /// `root`'s `buckets` (f32, 1-D) on every rank.
    fn broadcast(&self, buckets: &[Tensor], root: usize) -> Result<Vec<Tensor>>;
    /// Returns once every rank has reached it.
    fn barrier(&self) -> Result<()>;
}

/// What the process does when a rank waits in a collective on a rank that is gone (NCCL would wait forever).
pub type StuckHandler = Box<dyn Fn(&str) + Send + Sync>;

static STUCK: std::sync::OnceLock<StuckHandler> = std::sync::OnceLock::new();

/// Sets the process's [`StuckHandler`] (once; later calls are ignored). The command line's ends the process with
/// the reason, which the launcher reports; with none set, a stuck rank waits until something ends it.
pub fn on_stuck(handler: StuckHandler) {
    let _ = STUCK.set(handler);
}

#[cfg_attr(not(feature = "nccl"), allow(dead_code))]
pub(crate) fn stuck(why: &str) {
    if let Some(handler) = STUCK.get() {
        handler(why);
    }
}

/// A world of one: nothing to exchange.
#[derive(Debug, Clone, Copy, Default)]
pub struct Solo;

impl Collective for Solo {
    fn rank(&self) -> usize {
        0
    }

    fn world(&self) -> usize {
        1
    }

    fn all_reduce_sum(&self, buckets: &[Tensor]) -> Result<Vec<Tensor>> {
        Ok(buckets.to_vec())
    }

    fn broadcast(&self, buckets: &[Tensor], _root: usize) -> Result<Vec<Tensor>> {
        Ok(buckets.to_vec())
    }

    fn barrier(&self) -> Result<()> {
        Ok(())
    }
}

/// Why a build without the `nccl` feature cannot join a run of several processes.
#[cfg(not(feature = "nccl"))]
const WITHOUT_NCCL: &str =
    "this framesmith was built without NCCL, which training on several GPUs needs: build it \
                            with `--features nccl`, or train on one GPU";

/// Whether this process can take part in a run over several GPUs: `Err` says what to install or build when it
/// cannot (built without NCCL, or NCCL's library not found or too old). Loads NCCL the first time.
pub fn several_gpus_supported() -> std::result::Result<(), String> {
    #[cfg(feature = "nccl")]
    return nccl::library().map(|_| ());
    #[cfg(not(feature = "nccl"))]
    Err(WITHOUT_NCCL.to_string())
}

/// Joins a run of several processes on `device` (this rank's GPU) through NCCL; a world of one is [`Solo`] and
/// needs neither NCCL nor a GPU. `grace`: how long a rank may wait in a collective on a rank that is gone before
/// the [`StuckHandler`] ends it.
pub fn join_gpu(
    device: &candle_core::Device,
    spec: &rendezvous::RendezvousSpec,
    grace: std::time::Duration,
) -> Result<std::sync::Arc<dyn Collective>> {
    if spec.world == 1 {
        return Ok(std::sync::Arc::new(Solo));
    }
    match device {
        #[cfg(feature = "nccl")]
        candle_core::Device::Cuda(cuda) => Ok(std::sync::Arc::new(nccl::NcclCollective::new(
            cuda, spec, grace,
        )?)),
        #[cfg(not(feature = "nccl"))]
        candle_core::Device::Cuda(_) => {
            let _ = grace;
            candle_core::bail!("{WITHOUT_NCCL}")
        }
        _ => candle_core::bail!(
            "training on several GPUs needs training.device on CUDA; this run is on {device:?}: train on one \
             device, or set training.device = \"cuda\""
        ),
    }
}

/// Elements (f32) per bucket of [`all_reduce_tensors`]: 32 Mi elements, 128 MiB. A LoRA of a 14B model at rank 32
/// is a few buckets; one tensor larger than a bucket travels alone.
pub const BUCKET_ELEMENTS: usize = 32 << 20;

/// Consecutive groups of `sizes` (element counts) of at most `bucket` elements each (a larger one alone), as index
/// ranges into `sizes`.
pub fn bucket_ranges(sizes: &[usize], bucket: usize) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut filled) = (0, 0);
    for (i, &n) in sizes.iter().enumerate() {
        if i > start && filled + n > bucket.max(1) {
            out.push(start..i);
            (start, filled) = (i, 0);
        }
        filled += n;
    }
    if start < sizes.len() {
        out.push(start..sizes.len());
    }
    out
}

/// Sums `tensors` (any shapes, any float dtype, all on one device) over the ranks of `c`: flattened to f32 and
/// concatenated into buckets of at most `bucket` elements, reduced, and cut back into f32 tensors of the
/// original shapes. A world of one returns the tensors as they are.
pub fn all_reduce_tensors(
    c: &dyn Collective,
    tensors: &[Tensor],
    bucket: usize,
) -> Result<Vec<Tensor>> {
    bucketed(c, tensors, bucket, |buckets| c.all_reduce_sum(buckets))
}

/// Rank `root`'s `tensors` on every rank (in f32, through buckets as [`all_reduce_tensors`]).
pub fn broadcast_tensors(
    c: &dyn Collective,
    tensors: &[Tensor],
    root: usize,
) -> Result<Vec<Tensor>> {
    bucketed(c, tensors, BUCKET_ELEMENTS, |buckets| {
        c.broadcast(buckets, root)
    })
}

fn bucketed(
    c: &dyn Collective,
    tensors: &[Tensor],
    bucket: usize,
    op: impl Fn(&[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<Vec<Tensor>> {
    if c.world() == 1 || tensors.is_empty() {
        return Ok(tensors.to_vec());
    }
    let sizes: Vec<usize> = tensors.iter().map(|t| t.elem_count()).collect();
    let ranges = bucket_ranges(&sizes, bucket);
    let mut buckets = Vec::with_capacity(ranges.len());
    for range in &ranges {
        let flat = tensors[range.clone()]
            .iter()
            .map(|t| t.to_dtype(DType::F32)?.flatten_all())
            .collect::<Result<Vec<_>>>()?;
        buckets.push(Tensor::cat(&flat, 0)?);
    }
    let done = op(&buckets)?;
    if done.len() != buckets.len() {
        candle_core::bail!(
            "a collective returned {} buckets for {}",
            done.len(),
            buckets.len()
        );
    }
    let mut out = Vec::with_capacity(tensors.len());
    for (range, bucket) in ranges.iter().zip(&done) {
        let mut offset = 0;
        for i in range.clone() {
            out.push(
                bucket
                    .narrow(0, offset, sizes[i])?
                    .reshape(tensors[i].shape())?,
            );
            offset += sizes[i];
        }
    }
    Ok(out)
}

/// Sums a few host numbers (losses, counts, flags) over the ranks of `c`, on `device` (the device the collective
/// reduces on); in f32 as NCCL reduces them. A world of one returns them unchanged.
pub fn all_reduce_scalars(
    c: &dyn Collective,
    values: &[f32],
    device: &candle_core::Device,
) -> Result<Vec<f32>> {
    if c.world() == 1 {
        return Ok(values.to_vec());
    }
    let t = Tensor::from_slice(values, values.len(), device)?;
    let summed = c.all_reduce_sum(&[t])?;
    match summed.first() {
        Some(t) => t.to_vec1::<f32>(),
        None => candle_core::bail!("all-reduce returned no bucket"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn buckets_group_consecutive_tensors_and_isolate_large_ones() {
        assert_eq!(bucket_ranges(&[3, 3, 3, 3], 6), vec![0..2, 2..4]);
        assert_eq!(bucket_ranges(&[10, 1, 1], 4), vec![0..1, 1..3]);
        assert_eq!(bucket_ranges(&[1, 10, 1], 4), vec![0..1, 1..2, 2..3]);
        assert_eq!(bucket_ranges(&[], 4), Vec::<std::ops::Range<usize>>::new());
        let sizes = [5, 7, 2, 9, 1, 1, 30, 4];
        let ranges = bucket_ranges(&sizes, 10);
        let covered: Vec<usize> = ranges.iter().flat_map(|r| r.clone()).collect();
        assert_eq!(covered, (0..sizes.len()).collect::<Vec<_>>());
        for r in &ranges {
            let n: usize = sizes[r.clone()].iter().sum();
            assert!(n <= 10 || r.len() == 1, "{r:?} holds {n}");
        }
    }

    #[test]
    fn solo_returns_its_input() -> Result<()> {
        let t = Tensor::new(&[[1f32, 2.], [3., 4.]], &Device::Cpu)?;
        let out = all_reduce_tensors(&Solo, std::slice::from_ref(&t), 3)?;
        assert_eq!(out[0].to_vec2::<f32>()?, t.to_vec2::<f32>()?);
        assert_eq!(
            all_reduce_scalars(&Solo, &[1.5, 2.0], &Device::Cpu)?,
            [1.5, 2.0]
        );
        Solo.barrier()
    }
}
