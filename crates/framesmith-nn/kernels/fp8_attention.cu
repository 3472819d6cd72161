// Per-tensor e4m3fn scaling around cuDNN's FP8 fused attention (src/cuda/attention_fp8.rs): the largest magnitude
// of a bf16 tensor, the scales computed from it on the GPU, the quantisation to e4m3fn and back, and the delayed
// scaling of the gradients. Slots are named in fp8_attention.h.
//
// Scaling (the recipe of cuDNN's FP8 attention samples and Transformer Engine's per-tensor scaling):
// - q, k, v, o and dO: current scaling, scale = 448 / amax of the tensor itself (1 for an all-zero tensor);
// - S (the softmax probabilities, at most 1): fixed, scale 448;
// - O in the forward when cuDNN writes it in e4m3 (Hopper): every output row is a convex combination of rows of
//   v, so |O| <= amax(v), and O takes v's scale: nothing can overflow;
// - dQ, dK, dV (e4m3 on Hopper) and dP (always e4m3): delayed scaling, scale = 448 / (2 * history), where the
//   history is the largest amax cuDNN reported for the same attention shape, decayed a little at each call; a
//   value beyond the margin saturates at +-448 (cuDNN converts with saturation) and is counted.
#include <cuda_fp8.h>
#include <float.h>

#include "common.cuh"
#include "fp8_attention.h"

#define E4M3_MAX 448.f

// Headroom of the delayed scales: the gradients may grow by this factor over the history before they saturate.
#define GRAD_MARGIN 2.f

// 448 / amax, or 1 for a tensor without a usable magnitude (all zeros, or so small the scale would overflow).
__device__ __forceinline__ float scale_of(float amax) {
    return (amax > 1e-30f && isfinite(amax)) ? fminf(E4M3_MAX / amax, 1e30f) : 1.f;
}

// Largest |x| over n bf16 values, folded into slots[slot] (zeroed by the caller) with an integer atomic max: the
// bit patterns of non-negative floats order as integers. NaNs are skipped.
extern "C" __global__ void fs_fp8_attn_amax_bf16(const __nv_bfloat16* x, long n, int vec, float* slots, int slot) {
    __shared__ float scratch[32];
    float m = 0.f;
    if (vec) {
        const long n8 = n / 8;
        for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += (long)gridDim.x * blockDim.x) {
            float v[8];
            load_vec<__nv_bfloat16, 8>(x + i * 8, v);
#pragma unroll
            for (int k = 0; k < 8; ++k) m = fmaxf(m, fabsf(v[k]));
        }
    } else {
        for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
            m = fmaxf(m, fabsf(to_f32(x[i])));
        }
    }
    m = block_max(m, scratch);
    if (threadIdx.x == 0 && m > 0.f) atomicMax(reinterpret_cast<int*>(slots + slot), __float_as_int(m));
}

// codes = e4m3fn(x * slots[scale]), rounded to nearest even and saturated at +-448.
extern "C" __global__ void fs_fp8_attn_quantize_bf16(const __nv_bfloat16* x, uint8_t* codes, long n, int vec,
                                                     const float* slots, int scale) {
    const float s = slots[scale];
    if (vec) {
        const long n8 = n / 8;
        for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += (long)gridDim.x * blockDim.x) {
            float v[8];
            load_vec<__nv_bfloat16, 8>(x + i * 8, v);
            uint32_t lo = 0, hi = 0;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                lo |= (uint32_t)__nv_cvt_float_to_fp8(v[k] * s, __NV_SATFINITE, __NV_E4M3) << (8 * k);
                hi |= (uint32_t)__nv_cvt_float_to_fp8(v[4 + k] * s, __NV_SATFINITE, __NV_E4M3) << (8 * k);
            }
            *reinterpret_cast<uint2*>(codes + i * 8) = make_uint2(lo, hi);
        }
    } else {
        for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
            codes[i] = __nv_cvt_float_to_fp8(to_f32(x[i]) * s, __NV_SATFINITE, __NV_E4M3);
        }
    }
}

// out = bf16(codes * slots[descale]).
extern "C" __global__ void fs_fp8_attn_dequantize_bf16(const uint8_t* codes, __nv_bfloat16* out, long n,
                                                       const float* slots, int descale) {
    const float d = slots[descale];
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const __half_raw h = __nv_cvt_fp8_to_halfraw(codes[i], __NV_E4M3);
        out[i] = __float2bfloat16_rn(__half2float(__half(h)) * d);
    }
}

__device__ __forceinline__ void put_scale(float* slots, int scale, int descale, float s) {
    slots[scale] = s;
    slots[descale] = 1.f / s;
}

// The forward's scales from the amaxes of q, k and v (one thread). `fp8_out`: cuDNN writes O in e4m3 (with v's
// scale), else in bf16 (unscaled).
extern "C" __global__ void fs_fp8_attn_forward_scales(float* slots, int fp8_out) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    put_scale(slots, FS_SCALE_Q, FS_DESCALE_Q, scale_of(slots[FS_AMAX_Q]));
    put_scale(slots, FS_SCALE_K, FS_DESCALE_K, scale_of(slots[FS_AMAX_K]));
    const float sv = scale_of(slots[FS_AMAX_V]);
    put_scale(slots, FS_SCALE_V, FS_DESCALE_V, sv);
    put_scale(slots, FS_SCALE_O, FS_DESCALE_O, fp8_out ? sv : 1.f);
    put_scale(slots, FS_SCALE_S, FS_DESCALE_S, E4M3_MAX);
}

// A gradient's delayed scale from its history (1 before the first measurement).
__device__ __forceinline__ float grad_scale(float history) {
    return history > 0.f ? scale_of(GRAD_MARGIN * history) : 1.f;
}

// The backward's scales from the amaxes of q, k, v, o and dO and the gradient histories (one thread).
// `fp8_grads`: cuDNN writes dQ, dK, dV in e4m3 (else in bf16, unscaled).
extern "C" __global__ void fs_fp8_attn_backward_scales(float* slots, const float* history, int fp8_grads) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    put_scale(slots, FS_SCALE_Q, FS_DESCALE_Q, scale_of(slots[FS_AMAX_Q]));
    put_scale(slots, FS_SCALE_K, FS_DESCALE_K, scale_of(slots[FS_AMAX_K]));
    put_scale(slots, FS_SCALE_V, FS_DESCALE_V, scale_of(slots[FS_AMAX_V]));
    put_scale(slots, FS_SCALE_O, FS_DESCALE_O, scale_of(slots[FS_AMAX_O]));
    put_scale(slots, FS_SCALE_DO, FS_DESCALE_DO, scale_of(slots[FS_AMAX_DO]));
    put_scale(slots, FS_SCALE_S, FS_DESCALE_S, E4M3_MAX);
    put_scale(slots, FS_SCALE_DQ, FS_DESCALE_DQ, fp8_grads ? grad_scale(history[FS_HIST_DQ]) : 1.f);
    put_scale(slots, FS_SCALE_DK, FS_DESCALE_DK, fp8_grads ? grad_scale(history[FS_HIST_DK]) : 1.f);
    put_scale(slots, FS_SCALE_DV, FS_DESCALE_DV, fp8_grads ? grad_scale(history[FS_HIST_DV]) : 1.f);
    put_scale(slots, FS_SCALE_DP, FS_DESCALE_DP, grad_scale(history[FS_HIST_DP]));
}

// After a backward: folds cuDNN's gradient amaxes into the history (history = max(history * decay, amax); decay 0
// replaces it) and counts the gradients that went beyond their scale's range (saturated) in
// history[FS_HIST_SATURATED]. `counted`: the call's outputs are used (not a calibration pass).
extern "C" __global__ void fs_fp8_attn_update_history(const float* slots, float* history, float decay,
                                                      int fp8_grads, int counted) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    const int amax[4] = {FS_AMAX_OUT_DQ, FS_AMAX_OUT_DK, FS_AMAX_OUT_DV, FS_AMAX_OUT_DP};
    const int descale[4] = {FS_DESCALE_DQ, FS_DESCALE_DK, FS_DESCALE_DV, FS_DESCALE_DP};
    for (int g = 0; g < 4; ++g) {
        const float a = slots[amax[g]];
        if (!isfinite(a)) continue;
        const bool scaled = fp8_grads || g == FS_HIST_DP;
        if (counted && scaled && a * (1.f / slots[descale[g]]) > E4M3_MAX * 1.001f) {
            history[FS_HIST_SATURATED] += 1.f;
        }
        history[g] = fmaxf(history[g] * decay, a);
    }
}
