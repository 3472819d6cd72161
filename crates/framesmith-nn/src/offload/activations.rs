//! The saved block inputs of the checkpointed step (DESIGN.md §4.3), kept on the device or in host RAM
//! (`memory.activations = "host"`). On CUDA, host activations move asynchronously on a copy stream of their own:
//! to host buffers while the forward pass goes on, and back to the device one block ahead of the backward pass.
//! The buffers are page-locked (`activations_cuda.rs`, the fastest copies) or, for runs that promise little
//! page-locked memory, pageable (`activations_pageable.rs`). Elsewhere they are kept as they are (the CPU) or
//! copied synchronously.

use candle_core::{Device, Result, Tensor};

#[cfg(feature = "cuda")]
use super::activations_cuda::HostStash;
#[cfg(feature = "cuda")]
use super::activations_pageable::PageableStash;
use super::StreamMode;

/// Where the saved block inputs wait between a block's forward and its backward.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SavedPlacement {
    /// On the model's device.
    #[default]
    Device,
    /// In page-locked host RAM: the fastest copies, but page-locked memory is scarce (on Windows it is shared
    /// GPU memory, capped near half of RAM).
    PageLocked,
    /// In ordinary host RAM, copied through the driver's small staging buffers.
    Pageable,
}

impl SavedPlacement {
    /// Host RAM of the kind block streaming in `mode` promises: pageable with `staged` (whose point is to keep
    /// page-locked memory to a small ring), page-locked otherwise.
    pub fn host_for(mode: StreamMode) -> Self {
        match mode {
            StreamMode::Staged => Self::Pageable,
            StreamMode::Pinned | StreamMode::Host => Self::PageLocked,
        }
    }

    /// Whether the inputs leave the device.
    pub fn is_host(self) -> bool {
        self != Self::Device
    }
}

/// The inputs of the blocks, saved in forward order and taken back in reverse.
pub struct SavedInputs {
    kind: Kind,
}

enum Kind {
    /// Kept as they are: device activations, and host activations on the CPU device.
    Kept(Vec<Tensor>),
    /// Synchronous copies to host RAM and back (a device without an asynchronous stash).
    Copied { device: Device, saved: Vec<Tensor> },
    /// Asynchronous copies to page-locked host buffers and back.
    #[cfg(feature = "cuda")]
    Cuda(HostStash),
    /// Asynchronous copies to pageable host buffers and back, issued by a thread of their own.
    #[cfg(feature = "cuda")]
    CudaPageable(PageableStash),
}

impl SavedInputs {
    /// Saved inputs for a model on `device`, kept where `placement` says (on the CPU they stay as they are).
    pub fn new(device: &Device, placement: SavedPlacement) -> Result<Self> {
        let kind = match device {
            _ if !placement.is_host() || device.is_cpu() => Kind::Kept(Vec::new()),
            #[cfg(feature = "cuda")]
            Device::Cuda(dev) if placement == SavedPlacement::Pageable => {
                Kind::CudaPageable(PageableStash::new(dev)?)
            }
            #[cfg(feature = "cuda")]
            Device::Cuda(dev) => Kind::Cuda(HostStash::new(dev)?),
            _ => Kind::Copied {
                device: device.clone(),
                saved: Vec::new(),
            },
        };
        Ok(Self { kind })
    }

    /// Saves the input of the next block. For host activations on CUDA the copy starts after the work queued so
    /// far and overlaps what is queued next; `xs` must not be written in place afterwards.
    pub fn push(&mut self, xs: Tensor) -> Result<()> {
        match &mut self.kind {
            Kind::Kept(saved) => saved.push(xs),
            Kind::Copied { saved, .. } => saved.push(xs.to_device(&Device::Cpu)?),
            #[cfg(feature = "cuda")]
            Kind::Cuda(stash) => stash.push(xs)?,
            #[cfg(feature = "cuda")]
            Kind::CudaPageable(stash) => stash.push(xs)?,
        }
        Ok(())
    }

    /// The most recently saved input not yet taken, on the model's device and ordered before any work queued
    /// after this call; starts bringing back the one after it.
    pub fn pop(&mut self) -> Result<Tensor> {
        let taken = match &mut self.kind {
            Kind::Kept(saved) => saved.pop(),
            Kind::Copied { device, saved } => {
                saved.pop().map(|t| t.to_device(device)).transpose()?
            }
            #[cfg(feature = "cuda")]
            Kind::Cuda(stash) => stash.pop()?,
            #[cfg(feature = "cuda")]
            Kind::CudaPageable(stash) => stash.pop()?,
        };
        taken.ok_or_else(|| candle_core::Error::Msg("no saved block input left".into()))
    }

    /// Inputs saved and not yet taken.
    pub fn len(&self) -> usize {
        match &self.kind {
            Kind::Kept(saved) | Kind::Copied { saved, .. } => saved.len(),
            #[cfg(feature = "cuda")]
            Kind::Cuda(stash) => stash.len(),
            #[cfg(feature = "cuda")]
            Kind::CudaPageable(stash) => stash.len(),
        }
    }

    /// Whether every saved input has been taken.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a block keeps from its forward for its recompute (selective checkpointing's attention output and
/// log-sum-exp, and what else a model keeps), as plain tensors that can wait in host RAM like the saved inputs.
pub trait Stashable: Sized {
    /// The tensors, always the same kinds in the same order for one model (each position waits in a stash of its
    /// own, brought back a block ahead).
    fn into_tensors(self) -> Vec<Tensor>;
    /// The value again from [`Stashable::into_tensors`]'s tensors, in that order.
    fn from_tensors(tensors: Vec<Tensor>) -> Result<Self>;
}

/// Every block's kept value, in forward order, taken back in reverse: as they are on the device, or in host RAM
/// (moved asynchronously on CUDA). In RAM each tensor position of the values has a [`SavedInputs`] of its own, so
/// that every tensor of the block before is brought back while a block's backward runs, not only the first.
pub enum KeptValues<K> {
    /// On the model's device.
    Device(Vec<K>),
    /// In host RAM: `stashes[j]` holds tensor `j` of every value that has one; `counts` is how many tensors each
    /// block's value has.
    Host {
        device: Device,
        placement: SavedPlacement,
        stashes: Vec<SavedInputs>,
        counts: Vec<usize>,
    },
}

impl<K: Stashable> KeptValues<K> {
    /// Kept values for a model on `device`, waiting where `placement` says.
    pub fn new(device: &Device, placement: SavedPlacement) -> Result<Self> {
        Ok(if placement.is_host() {
            Self::Host {
                device: device.clone(),
                placement,
                stashes: Vec::new(),
                counts: Vec::new(),
            }
        } else {
            Self::Device(Vec::new())
        })
    }

    /// Keeps the next block's value.
    pub fn push(&mut self, value: K) -> Result<()> {
        match self {
            Self::Device(values) => values.push(value),
            Self::Host {
                device,
                placement,
                stashes,
                counts,
            } => {
                let tensors = value.into_tensors();
                while stashes.len() < tensors.len() {
                    stashes.push(SavedInputs::new(device, *placement)?);
                }
                counts.push(tensors.len());
                for (stash, t) in stashes.iter_mut().zip(tensors) {
                    stash.push(t)?;
                }
            }
        }
        Ok(())
    }

    /// The latest value not yet taken (`None` when every value has been taken), on the model's device.
    pub fn pop(&mut self) -> Result<Option<K>> {
        match self {
            Self::Device(values) => Ok(values.pop()),
            Self::Host {
                stashes, counts, ..
            } => {
                let Some(n) = counts.pop() else {
                    return Ok(None);
                };
                let tensors = stashes[..n]
                    .iter_mut()
                    .map(SavedInputs::pop)
                    .collect::<Result<Vec<_>>>()?;
                K::from_tensors(tensors).map(Some)
            }
        }
    }
}

/// Frees the host buffers that host activations keep between steps (a no-op without CUDA). They are kept so that
/// a steady run allocates no host memory; call this when a run ends.
pub fn release_host_activation_buffers() {
    #[cfg(feature = "cuda")]
    {
        super::activations_cuda::release_pool();
        super::activations_pageable::release_pool();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_come_back_in_reverse_order_on_the_cpu() -> Result<()> {
        for placement in [
            SavedPlacement::Device,
            SavedPlacement::PageLocked,
            SavedPlacement::Pageable,
        ] {
            let mut saved = SavedInputs::new(&Device::Cpu, placement)?;
            for i in 0..3u32 {
                saved.push(Tensor::new(&[i, i + 10], &Device::Cpu)?)?;
            }
            assert_eq!(saved.len(), 3);
            for i in (0..3u32).rev() {
                assert_eq!(saved.pop()?.to_vec1::<u32>()?, vec![i, i + 10]);
            }
            assert!(saved.is_empty());
            assert!(saved.pop().is_err());
        }
        Ok(())
    }
}

#[cfg(test)]
mod placement_tests {
    use super::*;

    #[test]
    fn staged_streaming_keeps_host_activations_pageable() {
        assert_eq!(
            SavedPlacement::host_for(StreamMode::Staged),
            SavedPlacement::Pageable
        );
        assert_eq!(
            SavedPlacement::host_for(StreamMode::Pinned),
            SavedPlacement::PageLocked
        );
        assert!(!SavedPlacement::Device.is_host());
        assert!(SavedPlacement::Pageable.is_host());
    }

    /// Two or three tensors per value, so that an order mistake between or within values shows.
    struct Three(Vec<Tensor>);

    impl Stashable for Three {
        fn into_tensors(self) -> Vec<Tensor> {
            self.0
        }
        fn from_tensors(tensors: Vec<Tensor>) -> Result<Self> {
            Ok(Self(tensors))
        }
    }

    #[test]
    fn kept_values_come_back_in_reverse_block_order_each_in_its_own_order() -> Result<()> {
        let dev = Device::Cpu;
        // Block 1 keeps one tensor fewer than the others (its position 2 is skipped in that stash).
        let count = |block: usize| if block == 1 { 2 } else { 3 };
        let value = |block: usize| -> Result<Three> {
            let block_f = block as f32;
            Ok(Three(
                (0..count(block))
                    .map(|k| Tensor::full(block_f * 10.0 + k as f32, (2, 1 + k), &dev))
                    .collect::<Result<_>>()?,
            ))
        };
        for placement in [
            SavedPlacement::Device,
            SavedPlacement::PageLocked,
            SavedPlacement::Pageable,
        ] {
            let mut kept = KeptValues::new(&dev, placement)?;
            for block in 0..4 {
                kept.push(value(block)?)?;
            }
            for block in (0..4).rev() {
                let Some(Three(tensors)) = kept.pop()? else {
                    panic!("{placement:?}: block {block} missing");
                };
                let firsts = tensors
                    .iter()
                    .map(|t| Ok(t.flatten_all()?.to_vec1::<f32>()?[0]))
                    .collect::<Result<Vec<_>>>()?;
                let want: Vec<f32> = (0..count(block))
                    .map(|k| block as f32 * 10.0 + k as f32)
                    .collect();
                assert_eq!(firsts, want, "{placement:?}");
            }
            assert!(kept.pop()?.is_none(), "{placement:?}: nothing is left");
        }
        Ok(())
    }
}
