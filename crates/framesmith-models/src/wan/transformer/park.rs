//! Parking a model in host RAM (Wan2.2 A14B: one expert on the GPU at a time). A parked model's resident blocks
//! hold their frozen weights in host memory and cannot run; unparking copies them back to the device. The first
//! park copies the weights to the host and the copies are kept (the weights are frozen), so a switch of experts
//! costs one host-to-device copy and no device-to-host one. Streamed blocks already live in host RAM and are left
//! as they are; the embeddings, the head and the LoRAs stay on the device (they are small next to the blocks).

use candle_core::{Device, Result, Tensor};

use super::WanModel;
use framesmith_nn::offload::Streamable;

impl WanModel {
    /// Whether the model is parked (see [`WanModel::park`]).
    pub fn is_parked(&self) -> bool {
        self.parked
    }

    /// Frees the device memory of the resident blocks' frozen weights, which then live in host RAM (copied there
    /// the first time, one block at a time, and kept). The model cannot run until [`WanModel::unpark`]. Does
    /// nothing when already parked.
    pub fn park(&mut self) -> Result<()> {
        if self.parked {
            return Ok(());
        }
        let indices: Vec<usize> = self.resident_indices().collect();
        if self.host_frozen.len() < self.blocks.len() {
            self.host_frozen.resize(self.blocks.len(), None);
        }
        for i in indices {
            let host = match &self.host_frozen[i] {
                Some(host) => host.clone(),
                None => {
                    let host = self.blocks[i]
                        .frozen_tensors()
                        .iter()
                        .map(|t| t.to_device(&Device::Cpu))
                        .collect::<Result<Vec<Tensor>>>()?;
                    self.host_frozen[i] = Some(host.clone());
                    host
                }
            };
            self.blocks[i] = self.blocks[i].with_frozen(&host)?;
        }
        self.parked = true;
        Ok(())
    }

    /// Brings a parked model's resident blocks back to its device from their host copies (which stay for the
    /// next park). Does nothing when not parked.
    pub fn unpark(&mut self) -> Result<()> {
        if !self.parked {
            return Ok(());
        }
        let device = self.device.clone();
        let indices: Vec<usize> = self.resident_indices().collect();
        for i in indices {
            let moved = self.blocks[i]
                .frozen_tensors()
                .iter()
                .map(|t| t.to_device(&device))
                .collect::<Result<Vec<Tensor>>>()?;
            self.blocks[i] = self.blocks[i].with_frozen(&moved)?;
        }
        self.parked = false;
        Ok(())
    }

    /// Makes `self` the model on the device in place of `going` (the other expert of a pair): `going` is parked
    /// first, the memory it freed goes back to the driver, then `self` is unparked, so the two never hold the
    /// device together. Returns whether anything moved (`false` when `self` was not parked).
    pub fn take_over_from(&mut self, going: &mut WanModel) -> Result<bool> {
        if !self.parked {
            return Ok(false);
        }
        going.park().map_err(|e| {
            candle_core::Error::msg(format!("parking the inactive expert in host RAM: {e}"))
        })?;
        framesmith_nn::offload::release_cached_memory(&self.device)?;
        self.unpark().map_err(|e| {
            candle_core::Error::msg(format!("bringing the expert's blocks back to the GPU: {e}"))
        })?;
        Ok(true)
    }

    /// Bytes of host RAM the model holds for parking: the resident blocks' frozen weights once it has been parked
    /// (kept while it runs), 0 before.
    pub fn parking_host_bytes(&self) -> usize {
        self.host_frozen
            .iter()
            .flatten()
            .flatten()
            .map(|t| t.elem_count() * t.dtype().size_in_bytes())
            .sum()
    }

    /// Bytes of frozen weights that parking moves (the resident blocks'); what the device gains when parked.
    pub fn resident_block_bytes(&self) -> usize {
        self.resident_indices()
            .map(|i| {
                self.blocks[i]
                    .frozen_tensors()
                    .iter()
                    .map(|t| t.elem_count() * t.dtype().size_in_bytes())
                    .sum::<usize>()
            })
            .sum()
    }

    fn resident_indices(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.blocks.len())
            .filter(|&i| !self.streamer.as_ref().is_some_and(|s| s.is_streamed(i)))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Result, Tensor};

    use crate::wan::random::{random_inputs, random_weights};
    use crate::wan::{ModelOptions, WanConfig, WanModel};
    use framesmith_nn::offload::OffloadOptions;
    use framesmith_nn::vb::Vb;

    fn values(out: &[Tensor]) -> Result<Vec<f32>> {
        Tensor::cat(out, 0)?.flatten_all()?.to_vec1::<f32>()
    }

    #[test]
    fn a_parked_model_refuses_to_run_and_unparks_to_the_same_output() -> Result<()> {
        let dev = Device::Cpu;
        let cfg = WanConfig::tiny(3);
        let weights = random_weights(&cfg, 3, DType::F32, &dev)?;
        let vb = Vb::from_tensors(weights, DType::F32, &dev);
        let options = ModelOptions::default();
        // One streamed block: parking moves only the two resident ones.
        let mut model =
            WanModel::new_streamed(&cfg, vb, &options, &[1], &OffloadOptions::default())?;
        let inputs = random_inputs(&cfg, &[[2, 4, 4]], 4, &dev)?;
        let before = values(&model.forward_untracked(&inputs)?)?;
        let one_block = model.resident_block_bytes() / 2;
        assert!(one_block > 0);
        assert_eq!(model.parking_host_bytes(), 0);
        model.park()?;
        model.park()?;
        assert!(model.is_parked());
        let err = model
            .forward_untracked(&inputs)
            .err()
            .map(|e| e.to_string());
        assert!(
            err.is_some_and(|e| e.contains("parked")),
            "a parked model must not run"
        );
        assert_eq!(model.parking_host_bytes(), 2 * one_block);
        model.unpark()?;
        model.unpark()?;
        assert!(!model.is_parked());
        assert_eq!(model.resident_block_bytes(), 2 * one_block);
        assert_eq!(before, values(&model.forward_untracked(&inputs)?)?);
        // The host copies stay for the next switch: parking again copies nothing more.
        assert_eq!(model.parking_host_bytes(), 2 * one_block);
        model.park()?;
        model.unpark()?;
        assert_eq!(model.parking_host_bytes(), 2 * one_block);
        assert_eq!(before, values(&model.forward_untracked(&inputs)?)?);
        Ok(())
    }
}
