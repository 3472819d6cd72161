use candle_core::{DType, Device, Result, Tensor};

use super::*;

#[test]
fn spread_placement_is_even_and_last_is_the_tail() {
    assert_eq!(
        streamed_blocks(8, 4, StreamPlacement::Spread),
        vec![1, 3, 5, 7]
    );
    assert_eq!(streamed_blocks(8, 3, StreamPlacement::Last), vec![5, 6, 7]);
    assert_eq!(
        streamed_blocks(4, 4, StreamPlacement::Spread),
        vec![0, 1, 2, 3]
    );
    assert!(streamed_blocks(4, 0, StreamPlacement::Spread).is_empty());
    let s = streamed_blocks(40, 30, StreamPlacement::Spread);
    assert_eq!(s.len(), 30);
    assert!(s.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(s.last(), Some(&39));
}

/// A block of two frozen tensors and a trained one, as a model's block holds them.
#[derive(Clone)]
struct TwoFrozen {
    weight: Tensor,
    bias: Tensor,
    lora: Tensor,
}

impl TwoFrozen {
    fn frozen_mut(&mut self) -> Vec<&mut Tensor> {
        vec![&mut self.weight, &mut self.bias]
    }
}

#[test]
fn frozen_fields_are_listed_and_replaced_in_order_with_their_shapes() -> Result<()> {
    let dev = Device::Cpu;
    let block = TwoFrozen {
        weight: Tensor::zeros((2, 3), DType::F32, &dev)?,
        bias: Tensor::zeros(3, DType::F32, &dev)?,
        lora: Tensor::ones(4, DType::F32, &dev)?,
    };
    let frozen = frozen_fields(&block, TwoFrozen::frozen_mut);
    assert_eq!(frozen.len(), 2);
    assert_eq!(frozen[0].dims(), &[2, 3]);
    let new = [
        Tensor::ones((2, 3), DType::F32, &dev)?,
        Tensor::full(2f32, 3, &dev)?,
    ];
    let swapped = with_frozen_fields(&block, TwoFrozen::frozen_mut, &new, "test block")?;
    assert_eq!(swapped.bias.to_vec1::<f32>()?, vec![2.0; 3]);
    assert_eq!(swapped.weight.sum_all()?.to_scalar::<f32>()?, 6.0);
    assert_eq!(
        swapped.lora.to_vec1::<f32>()?,
        vec![1.0; 4],
        "the LoRA is not frozen"
    );
    assert_eq!(
        block.bias.to_vec1::<f32>()?,
        vec![0.0; 3],
        "the block itself is untouched"
    );
    let short = with_frozen_fields(&block, TwoFrozen::frozen_mut, &new[..1], "test block");
    assert!(short.is_err_and(|e| e
        .to_string()
        .contains("test block has 2 frozen tensors, 1 given")));
    let wrong = [new[0].clone(), Tensor::ones(3, DType::BF16, &dev)?];
    let wrong = with_frozen_fields(&block, TwoFrozen::frozen_mut, &wrong, "test block");
    assert!(wrong.is_err_and(|e| e
        .to_string()
        .contains("test block: frozen tensor [3] F32 replaced by [3] BF16")));
    Ok(())
}

#[test]
fn packing_round_trips_every_dtype() -> Result<()> {
    let dev = Device::Cpu;
    let tensors = vec![
        Tensor::arange(0u8, 200, &dev)?.reshape((10, 20))?,
        Tensor::new(&[1.5f32, -2.25, 3.0], &dev)?,
        Tensor::new(&[0.5f32, 7.0], &dev)?.to_dtype(DType::BF16)?,
        Tensor::new(&[0.25f32], &dev)?.to_dtype(DType::F16)?,
    ];
    let layout = BlockLayout::of(&tensors);
    assert!(layout.specs.iter().all(|s| s.offset % ALIGN == 0));
    let mut packed = vec![0u8; layout.total_bytes];
    layout.pack_into(&tensors, &mut packed)?;
    let back = layout.unpack(&packed, &dev)?;
    for (a, b) in tensors.iter().zip(&back) {
        assert_eq!(a.dtype(), b.dtype());
        assert_eq!(tensor_bytes(a)?, tensor_bytes(b)?);
    }
    let wrong = vec![tensors[1].clone()];
    assert!(layout.check(&wrong).is_err());
    Ok(())
}

#[test]
fn error_summaries_drop_the_backtrace() {
    // What candle's error printed on the H200 when a CUDA allocation failed (with its backtrace frames).
    let with_trace = candle_core::Error::Msg(
        "DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")\n   0: <unknown>\n   1: <unknown>".into(),
    );
    let summary = super::OutOfMemory::classify(with_trace)
        .expect("an allocation failure")
        .summary();
    assert!(summary.contains("CUDA_ERROR_OUT_OF_MEMORY"), "{summary}");
    assert!(!summary.contains("<unknown>"), "{summary}");
    let other = candle_core::Error::Msg("shape mismatch in matmul".into());
    assert!(super::OutOfMemory::classify(other).is_err());
}

#[test]
fn the_staging_copy_leaves_a_core_to_the_thread_issuing_gpu_work() {
    use crate::offload::{staging_copy_threads, STAGING_COPY_THREADS};
    // The default on the 16-core test machine as measured; a 6-core desktop keeps one core free.
    assert_eq!(staging_copy_threads(STAGING_COPY_THREADS, 16), 12);
    assert_eq!(staging_copy_threads(STAGING_COPY_THREADS, 6), 5);
    assert_eq!(staging_copy_threads(8, 16), 8);
    assert_eq!(staging_copy_threads(8, 2), 1);
    assert_eq!(staging_copy_threads(8, 1), 1);
    assert_eq!(staging_copy_threads(0, 16), 1);
}
