// FP8 e4m3 (float8_e4m3fn) weight dequantisation with f32 scales into bf16 / f32.
// Scale modes: 0 = one scale for the tensor, 1 = one per row (output channel), 2 = one per block of `block`
// consecutive values along a row (block-64 in musubi-tuner's layout: scale[row, col / block]).
// Also the row-wise quantisation of bf16 activations for FP8 tensor-core products (fs_fp8_quantize_rows_bf16).
#include <cuda_fp8.h>
#include <float.h>

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

// Row-wise e4m3fn quantisation of bf16 activations [rows, cols] for FP8 tensor-core products: scale[row] =
// amax(|row|) / 448 (FLT_MIN at least for a row of tiny values, 1 for an all-zero row), codes[row, c] =
// e4m3fn(x / scale), rounded to nearest even and saturated to +-448 (the hardware conversion on 8.9+). One block
// per row: a pass for the row's largest magnitude, then a pass that encodes (the row is read twice, the second
// time mostly from L2). `vec` (cols % 8 == 0, 16-byte aligned rows): 8 values per 16-byte load and 8-byte store.
// `col_scale` (f32 [cols], or null): each value is multiplied by its column's factor in f32 first, so what is
// quantised is x · diag(col_scale) (an input gradient dY · diag(s) whose product then takes the weight's bare codes).
__device__ __forceinline__ void scale_cols8(float* v, const float* col_scale, long c) {
    if (col_scale == nullptr) return;
    const float4 a = *reinterpret_cast<const float4*>(col_scale + c);
    const float4 b = *reinterpret_cast<const float4*>(col_scale + c + 4);
    v[0] *= a.x, v[1] *= a.y, v[2] *= a.z, v[3] *= a.w, v[4] *= b.x, v[5] *= b.y, v[6] *= b.z, v[7] *= b.w;
}

extern "C" __global__ void fs_fp8_quantize_rows_bf16(const __nv_bfloat16* x, const float* col_scale,
                                                     uint8_t* codes, float* scale, long rows, long cols, int vec) {
    __shared__ float scratch[32];
    const long row = blockIdx.x;
    if (row >= rows) return;
    const __nv_bfloat16* xr = x + row * cols;
    uint8_t* cr = codes + row * cols;
    float amax = 0.f;
    if (vec) {
        for (long c = (long)threadIdx.x * 8; c < cols; c += (long)blockDim.x * 8) {
            float v[8];
            load_vec<__nv_bfloat16, 8>(xr + c, v);
            scale_cols8(v, col_scale, c);
#pragma unroll
            for (int k = 0; k < 8; ++k) amax = fmaxf(amax, fabsf(v[k]));
        }
    } else {
        for (long c = threadIdx.x; c < cols; c += blockDim.x) {
            const float v = to_f32(xr[c]) * (col_scale ? col_scale[c] : 1.f);
            amax = fmaxf(amax, fabsf(v));
        }
    }
    amax = block_max(amax, scratch);
    float s = amax / 448.f;
    if (s < FLT_MIN) s = amax > 0.f ? FLT_MIN : 1.f;
    if (threadIdx.x == 0) scale[row] = s;
    if (vec) {
        for (long c = (long)threadIdx.x * 8; c < cols; c += (long)blockDim.x * 8) {
            float v[8];
            load_vec<__nv_bfloat16, 8>(xr + c, v);
            scale_cols8(v, col_scale, c);
            uint32_t lo = 0, hi = 0;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                lo |= (uint32_t)__nv_cvt_float_to_fp8(v[k] / s, __NV_SATFINITE, __NV_E4M3) << (8 * k);
                hi |= (uint32_t)__nv_cvt_float_to_fp8(v[4 + k] / s, __NV_SATFINITE, __NV_E4M3) << (8 * k);
            }
            *reinterpret_cast<uint2*>(cr + c) = make_uint2(lo, hi);
        }
    } else {
        for (long c = threadIdx.x; c < cols; c += blockDim.x) {
            const float v = to_f32(xr[c]) * (col_scale ? col_scale[c] : 1.f);
            cr[c] = __nv_cvt_float_to_fp8(v / s, __NV_SATFINITE, __NV_E4M3);
        }
    }
}

// out [cols, rows] = in [rows, cols]ᵀ for bytes (e4m3fn codes: an FP8 weight [out, in] as the [in, out] operand of
// its input-gradient product, which FP8 tensor cores take only with the reduced dimension contiguous). A 64 × 64
// tile per block of 16 × 16 threads through shared memory, each thread moving 4 consecutive bytes of a row in and
// of a column out: as one 32-bit word when `words` (rows and cols multiples of 4, 4-byte aligned buffers), byte by
// byte otherwise.
extern "C" __global__ void fs_transpose_u8(const uint8_t* in, uint8_t* out, long rows, long cols, int words) {
    __shared__ uint8_t tile[64][64 + 4];
    const long r0 = (long)blockIdx.y * 64, c0 = (long)blockIdx.x * 64;
    const int tx = threadIdx.x, ty = threadIdx.y;
    for (int r = ty; r < 64; r += 16) {
        const long row = r0 + r, col = c0 + tx * 4;
        if (row >= rows) continue;
        if (words) {
            if (col >= cols) continue;
            const uint32_t w = *reinterpret_cast<const uint32_t*>(in + row * cols + col);
#pragma unroll
            for (int k = 0; k < 4; ++k) tile[r][tx * 4 + k] = (uint8_t)(w >> (8 * k));
        } else {
            for (int k = 0; k < 4; ++k) {
                if (col + k < cols) tile[r][tx * 4 + k] = in[row * cols + col + k];
            }
        }
    }
    __syncthreads();
    for (int c = ty; c < 64; c += 16) {
        const long col = c0 + c, row = r0 + tx * 4;
        if (col >= cols) continue;
        if (words) {
            if (row >= rows) continue;
            uint32_t w = 0;
#pragma unroll
            for (int k = 0; k < 4; ++k) w |= (uint32_t)tile[tx * 4 + k][c] << (8 * k);
            *reinterpret_cast<uint32_t*>(out + col * rows + row) = w;
        } else {
            for (int k = 0; k < 4; ++k) {
                if (row + k < rows) out[col * rows + row + k] = tile[tx * 4 + k][c];
            }
        }
    }
}
