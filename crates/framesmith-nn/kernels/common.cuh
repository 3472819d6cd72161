// Shared helpers for Framesmith's kernels: bf16 conversion and block-wide reductions.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

// Rounds through T and back: the official Wan code casts normalised values to the activation dtype before
// multiplying by the weight, and the kernels reproduce that rounding.
template <typename T> __device__ __forceinline__ float round_through(float x) { return to_f32(from_f32<T>(x)); }

struct SumOp {
    __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
    __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <typename Op> __device__ __forceinline__ float warp_reduce(float v, Op op) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) { return warp_reduce(v, SumOp{}); }

// `op` over the whole block (blockDim.x a multiple of 32, at most 1024; `identity` op's neutral value); every
// thread gets the result. `scratch` holds 32 floats in shared memory; the trailing barrier lets callers reuse it
// at once.
template <typename Op> __device__ __forceinline__ float block_reduce(float v, float* scratch, Op op, float identity) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    v = warp_reduce(v, op);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    const int nwarps = blockDim.x >> 5;
    float t = (threadIdx.x < nwarps) ? scratch[threadIdx.x] : identity;
    if (warp == 0) {
        t = warp_reduce(t, op);
        if (lane == 0) scratch[0] = t;
    }
    __syncthreads();
    const float r = scratch[0];
    __syncthreads();
    return r;
}

// Sum over the whole block (see block_reduce).
__device__ __forceinline__ float block_sum(float v, float* scratch) { return block_reduce(v, scratch, SumOp{}, 0.f); }

// Largest value over the whole block (see block_reduce); NaN inputs are skipped, as fmaxf skips them.
__device__ __forceinline__ float block_max(float v, float* scratch) {
    return block_reduce(v, scratch, MaxOp{}, -INFINITY);
}

// The modulation row of activation row `row` (of `L` per sample): one vector per sample (Ls 1) or per token
// (Ls L), stored [B * Ls, D].
__device__ __forceinline__ long mod_row(long row, long L, long Ls) {
    const long b = row / L;
    return Ls == 1 ? b : b * Ls + (row % L);
}

// ---- Vectorised access: W consecutive values through one 16-byte load / store (W = 16 / sizeof(T)), or one
// value (W = 1). Callers guarantee 16-byte alignment when W > 1. ----

template <typename T> __host__ __device__ constexpr int vec_width() { return 16 / sizeof(T); }

template <typename T, int W> __device__ __forceinline__ void load_vec(const T* p, float* out) {
    if constexpr (W == 1) {
        out[0] = to_f32(p[0]);
    } else {
        static_assert(W * sizeof(T) == 16, "one 16-byte access");
        const uint4 raw = *reinterpret_cast<const uint4*>(p);
        const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int k = 0; k < W; ++k) out[k] = to_f32(v[k]);
    }
}

template <typename T, int W> __device__ __forceinline__ void store_vec(T* p, const float* in) {
    if constexpr (W == 1) {
        p[0] = from_f32<T>(in[0]);
    } else {
        __align__(16) T v[W];
#pragma unroll
        for (int k = 0; k < W; ++k) v[k] = from_f32<T>(in[k]);
        *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(v);
    }
}

// W f32 values; 16-byte loads when W is a multiple of 4 (then 16-byte aligned), plain loads otherwise.
template <int W> __device__ __forceinline__ void load_f32(const float* p, float* out) {
    if constexpr (W % 4 != 0) {
#pragma unroll
        for (int k = 0; k < W; ++k) out[k] = p[k];
    } else {
#pragma unroll
        for (int k = 0; k < W; k += 4) {
            const float4 f = *reinterpret_cast<const float4*>(p + k);
            out[k] = f.x;
            out[k + 1] = f.y;
            out[k + 2] = f.z;
            out[k + 3] = f.w;
        }
    }
}

// Kernels whose input and output dtypes may differ (f32 <-> bf16) move MIXED_W = 8 values per chunk: one 16-byte
// bf16 access, two f32 ones. DISPATCH_MIXED runs `call` with that W when the kernel's `vec` is nonzero, else 1.
constexpr int MIXED_W = 8;

#define DISPATCH_MIXED(call) \
    if (vec) { \
        constexpr int W = MIXED_W; \
        call; \
    } else { \
        constexpr int W = 1; \
        call; \
    }

// W values of T through W * sizeof(T) / 16 16-byte accesses (W a multiple of 16 / sizeof(T), p 16-byte
// aligned), or one value (W = 1): lets kernels whose inputs and outputs differ in dtype move the same number of
// values per thread on each side.
template <typename T, int W> __device__ __forceinline__ void load_n(const T* p, float* out) {
    constexpr int V = W == 1 ? 1 : vec_width<T>();
    static_assert(W % V == 0, "whole 16-byte accesses");
#pragma unroll
    for (int c = 0; c < W; c += V) load_vec<T, V>(p + c, out + c);
}

template <typename T, int W> __device__ __forceinline__ void store_n(T* p, const float* in) {
    constexpr int V = W == 1 ? 1 : vec_width<T>();
    static_assert(W % V == 0, "whole 16-byte accesses");
#pragma unroll
    for (int c = 0; c < W; c += V) store_vec<T, V>(p + c, in + c);
}
