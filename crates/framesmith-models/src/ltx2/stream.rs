//! Block streaming of LTX-2's blocks (DESIGN.md §4.4): the frozen tensors of a block (its video stream, then its
//! audio stream and audio-video cross-attentions when read) in one fixed
//! order, so the streamer can pack a block into host RAM and point its shell at a GPU slot. Every block has the
//! same layout, so one streamer holds them all.

use candle_core::{Result, Tensor};

use super::block::{Attention, AudioStream, FeedForward, Ltx2Block};
use framesmith_nn::offload::{frozen_fields, with_frozen_fields, Streamable};

impl Attention {
    fn frozen_tensors_mut(&mut self) -> Vec<&mut Tensor> {
        let mut out = self.to_q.frozen_tensors_mut();
        out.extend(self.to_k.frozen_tensors_mut());
        out.extend(self.to_v.frozen_tensors_mut());
        out.extend(self.to_out.frozen_tensors_mut());
        if let Some(gate) = self.to_gate_logits.as_mut() {
            out.extend(gate.frozen_tensors_mut());
        }
        out.extend([&mut self.q_norm, &mut self.k_norm]);
        out
    }
}

impl FeedForward {
    fn frozen_tensors_mut(&mut self) -> Vec<&mut Tensor> {
        let mut out = self.proj_in.frozen_tensors_mut();
        out.extend(self.proj_out.frozen_tensors_mut());
        out
    }
}

impl Ltx2Block {
    /// Every frozen tensor (linear bases, FP8 scales and biases, q/k norm weights, the AdaLN tables), in a fixed
    /// order.
    pub fn frozen_tensors_mut(&mut self) -> Vec<&mut Tensor> {
        let mut out = self.attn1.frozen_tensors_mut();
        out.extend(self.attn2.frozen_tensors_mut());
        out.extend(self.ff.frozen_tensors_mut());
        out.push(&mut self.scale_shift_table);
        if let Some(table) = self.prompt_scale_shift_table.as_mut() {
            out.push(table);
        }
        if let Some(audio) = self.audio.as_mut() {
            out.extend(audio.frozen_tensors_mut());
        }
        out
    }
}

impl AudioStream {
    fn frozen_tensors_mut(&mut self) -> Vec<&mut Tensor> {
        let mut out = self.attn1.frozen_tensors_mut();
        out.extend(self.attn2.frozen_tensors_mut());
        out.extend(self.ff.frozen_tensors_mut());
        out.extend(self.audio_to_video.frozen_tensors_mut());
        out.extend(self.video_to_audio.frozen_tensors_mut());
        out.push(&mut self.scale_shift_table);
        if let Some(table) = self.prompt_scale_shift_table.as_mut() {
            out.push(table);
        }
        out.extend([&mut self.av_table_video, &mut self.av_table_audio]);
        out
    }
}

/// What block streaming packs and swaps: every frozen tensor, in [`Ltx2Block::frozen_tensors_mut`]'s order.
impl Streamable for Ltx2Block {
    fn frozen_tensors(&self) -> Vec<Tensor> {
        frozen_fields(self, Ltx2Block::frozen_tensors_mut)
    }

    fn with_frozen(&self, tensors: &[Tensor]) -> Result<Self> {
        with_frozen_fields(self, Ltx2Block::frozen_tensors_mut, tensors, "LTX-2 block")
    }
}
