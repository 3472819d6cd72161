//! The saved block inputs of the checkpointed step (DESIGN.md §4.3), kept on the device or in host RAM
//! (`memory.activations = "host"`). On CUDA, host activations move asynchronously on a copy stream of their own
//! (see `activations_cuda.rs`): to page-locked host buffers while the forward pass goes on, and back to the
//! device one block ahead of the backward pass. Elsewhere they are kept as they are (the CPU) or copied
//! synchronously.

use candle_core::{Device, Result, Tensor};

#[cfg(feature = "cuda")]
use super::activations_cuda::HostStash;

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
}

impl SavedInputs {
    /// Saved inputs for a model on `device`; `on_host` keeps them in host RAM.
    pub fn new(device: &Device, on_host: bool) -> Result<Self> {
        let kind = match device {
            _ if !on_host || device.is_cpu() => Kind::Kept(Vec::new()),
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
        };
        taken.ok_or_else(|| candle_core::Error::Msg("no saved block input left".into()))
    }

    /// Inputs saved and not yet taken.
    pub fn len(&self) -> usize {
        match &self.kind {
            Kind::Kept(saved) | Kind::Copied { saved, .. } => saved.len(),
            #[cfg(feature = "cuda")]
            Kind::Cuda(stash) => stash.len(),
        }
    }

    /// Whether every saved input has been taken.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Frees the page-locked buffers that host activations keep between steps (a no-op without CUDA). They are kept
/// so that a steady run allocates no page-locked memory; call this when a run ends.
pub fn release_host_activation_buffers() {
    #[cfg(feature = "cuda")]
    super::activations_cuda::release_pool();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_come_back_in_reverse_order_on_the_cpu() -> Result<()> {
        for on_host in [false, true] {
            let mut saved = SavedInputs::new(&Device::Cpu, on_host)?;
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
