// The scale slots of one FP8 attention call (kernels/fp8_attention.cu, kernels/cudnn_sdpa.cpp and
// src/cuda/attention_fp8.rs share them): one f32 array on the GPU, made for the call and zeroed, so that every
// scale cuDNN reads is computed on the GPU and nothing waits for the host. A tensor x is held as
// x_fp8 = e4m3(x * scale_x) and read back as x_fp8 * descale_x (descale = 1 / scale). The Rust mirror is
// `Slot` in src/cuda/attention_fp8.rs: keep the two in the same order.
#pragma once

enum Fp8AttnSlot {
    // Largest magnitudes of the bf16 inputs (written by fs_fp8_attn_amax_bf16).
    FS_AMAX_Q = 0,
    FS_AMAX_K,
    FS_AMAX_V,
    FS_AMAX_O,
    FS_AMAX_DO,
    // Quantisation scales of the inputs and of the softmax probabilities S, and their descales.
    FS_SCALE_Q,
    FS_SCALE_K,
    FS_SCALE_V,
    FS_SCALE_O,
    FS_SCALE_DO,
    FS_SCALE_S,
    FS_DESCALE_Q,
    FS_DESCALE_K,
    FS_DESCALE_V,
    FS_DESCALE_O,
    FS_DESCALE_DO,
    FS_DESCALE_S,
    // Scales of the gradients cuDNN writes (dQ, dK, dV, and dP, its scaled softmax gradient), and their descales.
    FS_SCALE_DQ,
    FS_SCALE_DK,
    FS_SCALE_DV,
    FS_SCALE_DP,
    FS_DESCALE_DQ,
    FS_DESCALE_DK,
    FS_DESCALE_DV,
    FS_DESCALE_DP,
    // What cuDNN measured (largest magnitudes before scaling).
    FS_AMAX_OUT_S,
    FS_AMAX_OUT_O,
    FS_AMAX_OUT_DQ,
    FS_AMAX_OUT_DK,
    FS_AMAX_OUT_DV,
    FS_AMAX_OUT_DP,
    FS_SLOTS
};

// Gradient histories (delayed scaling, one array per device and attention shape): dQ, dK, dV, dP.
enum Fp8AttnHistory { FS_HIST_DQ = 0, FS_HIST_DK, FS_HIST_DV, FS_HIST_DP, FS_HIST_SATURATED, FS_HISTORY };
