// FP8 e4m3 (float8_e4m3fn) weight dequantisation with f32 scales into bf16 / f32.
// Scale modes: 0 = one scale for the tensor, 1 = one per row (output channel), 2 = one per block of `block`
// consecutive values along a row (block-64 in musubi-tuner's layout: scale[row, col / block]).
#include "common.cuh"

// e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities, 0x7f / 0xff are NaN.
__device__ __forceinline__ float e4m3_to_f32(uint32_t b) {
    const uint32_t sign = (b & 0x80u) << 24;
    const uint32_t exp = (b >> 3) & 0xfu;
    const uint32_t man = b & 0x7u;
    float v;
    if (exp == 0) {
        v = (sign ? -1.f : 1.f) * (float)man * 0.001953125f;  // man * 2^-9, signed zero kept
    } else if (exp == 0xfu && man == 0x7u) {
        v = __uint_as_float(0x7fc00000u);
    } else {
        v = __uint_as_float(sign | ((exp + 120u) << 23) | (man << 20));
    }
    return v;
}

__device__ __forceinline__ float scale_for(const float* scale, int mode, long row, long col, long cols,
                                           int block) {
    if (mode == 0) return scale[0];
    if (mode == 1) return scale[row];
    const long nblocks = (cols + block - 1) / block;
    return scale[row * nblocks + col / block];
}

// Generic path: one value per thread.
template <typename T>
__device__ void dequant_scalar(const uint8_t* w, const float* scale, T* out, long rows, long cols, int mode,
                               int block) {
    const long n = rows * cols;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const long row = i / cols, col = i % cols;
        out[i] = from_f32<T>(e4m3_to_f32(w[i]) * scale_for(scale, mode, row, col, cols, block));
    }
}

// Fast path (cols % 8 == 0, block % 8 == 0, 8-byte aligned input): 8 values per thread, one 8-byte load and
// one 16-byte (bf16) store.
__device__ void dequant8_bf16(const uint8_t* w, const float* scale, __nv_bfloat16* out, long rows, long cols,
                              int mode, int block) {
    const long n8 = rows * cols / 8;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += (long)gridDim.x * blockDim.x) {
        const long first = i * 8;
        const long row = first / cols, col = first % cols;
        const float s = scale_for(scale, mode, row, col, cols, block);
        const uint2 raw = reinterpret_cast<const uint2*>(w)[i];
        __align__(16) __nv_bfloat16 vals[8];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            vals[k] = __float2bfloat16_rn(e4m3_to_f32((raw.x >> (8 * k)) & 0xffu) * s);
            vals[4 + k] = __float2bfloat16_rn(e4m3_to_f32((raw.y >> (8 * k)) & 0xffu) * s);
        }
        reinterpret_cast<uint4*>(out)[i] = *reinterpret_cast<const uint4*>(vals);
    }
}

extern "C" __global__ void fs_fp8_dequant_bf16(const uint8_t* w, const float* scale, __nv_bfloat16* out,
                                               long rows, long cols, int mode, int block, int vec8) {
    if (vec8) {
        dequant8_bf16(w, scale, out, rows, cols, mode, block);
    } else {
        dequant_scalar(w, scale, out, rows, cols, mode, block);
    }
}

extern "C" __global__ void fs_fp8_dequant_f32(const uint8_t* w, const float* scale, float* out, long rows,
                                              long cols, int mode, int block) {
    dequant_scalar(w, scale, out, rows, cols, mode, block);
}
