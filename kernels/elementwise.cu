// Element-wise ops of the Wan block: adaptive modulation `x * (1 + scale) + shift`, the gated residual
// `x + y * gate`, GELU with the tanh approximation and the rotary embedding, forward and backward.
// Activations are T (f32 or bf16); modulation vectors are f32 [B * Ls, D] where Ls is 1 (one vector per sample)
// or L (one per token).
#include "common.cuh"

__device__ __forceinline__ long mod_row(long row, long L, long Ls) {
    const long b = row / L;
    return Ls == 1 ? b : b * Ls + (row % L);
}

template <typename T>
__device__ void modulate_fwd(const T* x, const float* scale, const float* shift, T* y, long rows, long D, long L,
                             long Ls) {
    const long n = rows * D;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const long row = i / D, c = i % D;
        const long m = mod_row(row, L, Ls) * D + c;
        y[i] = from_f32<T>(to_f32(x[i]) * (1.f + scale[m]) + shift[m]);
    }
}

// dx = dy * (offset + scale): offset 1 for the modulation's input, 0 for the gated residual's branch.
template <typename T>
__device__ void scaled_bwd(const T* dy, const float* scale, float offset, T* dx, long rows, long D, long L,
                           long Ls) {
    const long n = rows * D;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const long row = i / D, c = i % D;
        dx[i] = from_f32<T>(to_f32(dy[i]) * (offset + scale[mod_row(row, L, Ls) * D + c]));
    }
}

template <typename T>
__device__ void gated_fwd(const T* x, const T* y, const float* gate, T* out, long rows, long D, long L, long Ls) {
    const long n = rows * D;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const long row = i / D, c = i % D;
        out[i] = from_f32<T>(to_f32(x[i]) + to_f32(y[i]) * gate[mod_row(row, L, Ls) * D + c]);
    }
}

// Gradients of the modulation vectors: ga[m, c] += sum g * a, gb[m, c] += sum g over the rows that use vector m.
// Grid: (ceil(D / blockDim.x), chunks of `rows_per_chunk` tokens, B). ga / gb (gb may be null) must be zeroed.
template <typename T>
__device__ void mod_param_grad(const T* a, const T* g, float* ga, float* gb, long D, long L, long Ls,
                               long rows_per_chunk) {
    const long c = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= D) return;
    const long b = blockIdx.z;
    const long l0 = (long)blockIdx.y * rows_per_chunk;
    const long l1 = min(L, l0 + rows_per_chunk);
    if (Ls == 1) {
        float sa = 0.f, sb = 0.f;
        for (long l = l0; l < l1; ++l) {
            const long i = (b * L + l) * D + c;
            const float gv = to_f32(g[i]);
            sa += gv * to_f32(a[i]);
            sb += gv;
        }
        atomicAdd(ga + b * D + c, sa);
        if (gb) atomicAdd(gb + b * D + c, sb);
    } else {
        for (long l = l0; l < l1; ++l) {
            const long i = (b * L + l) * D + c;
            const float gv = to_f32(g[i]);
            ga[i] += gv * to_f32(a[i]);
            if (gb) gb[i] += gv;
        }
    }
}

__device__ __forceinline__ float gelu_tanh_f(float x) {
    const float k = 0.7978845608028654f;  // sqrt(2 / pi)
    return 0.5f * x * (1.f + tanhf(k * (x + 0.044715f * x * x * x)));
}

__device__ __forceinline__ float gelu_tanh_grad(float x) {
    const float k = 0.7978845608028654f;
    const float t = tanhf(k * (x + 0.044715f * x * x * x));
    return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * k * (1.f + 3.f * 0.044715f * x * x);
}

template <typename T>
__device__ void gelu_fwd(const T* x, T* y, long n) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        y[i] = from_f32<T>(gelu_tanh_f(to_f32(x[i])));
}

template <typename T>
__device__ void gelu_bwd(const T* x, const T* dy, T* dx, long n) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        dx[i] = from_f32<T>(to_f32(dy[i]) * gelu_tanh_grad(to_f32(x[i])));
}

// Rotary embedding on adjacent pairs (x[2j], x[2j+1]) of x [rows, heads, 2 * half] with per-row angle tables
// cos / sin [rows, half] (f32): out = (re·c − s·sign·im, sign·s·re + c·im). sign = 1 rotates forward; sign = −1
// rotates back, which is the backward of the forward rotation. One thread per pair.
template <typename T>
__device__ void rope(const T* x, const float* cosv, const float* sinv, float sign, T* out, long rows, long heads,
                     long half) {
    const long pairs = rows * heads * half;
    for (long p = (long)blockIdx.x * blockDim.x + threadIdx.x; p < pairs; p += (long)gridDim.x * blockDim.x) {
        const long j = p % half;
        const long row = p / (heads * half);
        const float c = cosv[row * half + j];
        const float s = sign * sinv[row * half + j];
        const float re = to_f32(x[2 * p]), im = to_f32(x[2 * p + 1]);
        out[2 * p] = from_f32<T>(re * c - im * s);
        out[2 * p + 1] = from_f32<T>(re * s + im * c);
    }
}

#define ELEMENTWISE_KERNELS(T, S)                                                                               \
    extern "C" __global__ void fs_modulate_fwd_##S(const T* x, const float* scale, const float* shift, T* y,    \
                                                   long rows, long D, long L, long Ls) {                        \
        modulate_fwd<T>(x, scale, shift, y, rows, D, L, Ls);                                                    \
    }                                                                                                           \
    extern "C" __global__ void fs_scaled_bwd_##S(const T* dy, const float* scale, float offset, T* dx,          \
                                                 long rows, long D, long L, long Ls) {                          \
        scaled_bwd<T>(dy, scale, offset, dx, rows, D, L, Ls);                                                   \
    }                                                                                                           \
    extern "C" __global__ void fs_gated_fwd_##S(const T* x, const T* y, const float* gate, T* out, long rows,   \
                                                long D, long L, long Ls) {                                      \
        gated_fwd<T>(x, y, gate, out, rows, D, L, Ls);                                                          \
    }                                                                                                           \
    extern "C" __global__ void fs_mod_param_grad_##S(const T* a, const T* g, float* ga, float* gb, long D,      \
                                                     long L, long Ls, long rows_per_chunk) {                    \
        mod_param_grad<T>(a, g, ga, gb, D, L, Ls, rows_per_chunk);                                              \
    }                                                                                                           \
    extern "C" __global__ void fs_rope_##S(const T* x, const float* c, const float* s, float sign, T* out,        \
                                           long rows, long heads, long half) {                                  \
        rope<T>(x, c, s, sign, out, rows, heads, half);                                                         \
    }                                                                                                           \
    extern "C" __global__ void fs_gelu_fwd_##S(const T* x, T* y, long n) { gelu_fwd<T>(x, y, n); }              \
    extern "C" __global__ void fs_gelu_bwd_##S(const T* x, const T* dy, T* dx, long n) {                        \
        gelu_bwd<T>(x, dy, dx, n);                                                                              \
    }

ELEMENTWISE_KERNELS(float, f32)
ELEMENTWISE_KERNELS(__nv_bfloat16, bf16)
