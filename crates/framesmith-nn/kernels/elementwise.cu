// Element-wise ops of the Wan block: adaptive modulation `x * (1 + scale) + shift`, the gated residual
// `x + y * gate`, GELU with the tanh approximation and the rotary embedding, forward and backward.
// Activations are T (f32 or bf16); modulation vectors are f32 [B * Ls, D] where Ls is 1 (one vector per sample)
// or L (one per token). Each thread handles chunks of W consecutive values: W = 16 / sizeof(T) (16-byte
// accesses) when the kernel's `vec` argument is nonzero (the caller checked sizes and alignment), else 1.
#include "common.cuh"

#define FOR_CHUNKS(i, n) \
    for (long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * W; i < (n); i += (long)gridDim.x * blockDim.x * W)


// Input dtype TI, output TO (the same for the plain kernels; f32 <-> bf16 for the mixed ones below). W values per
// chunk through whole 16-byte accesses on each side (load_n / store_n).
template <typename TI, typename TO, int W>
__device__ void modulate_fwd(const TI* x, const float* scale, const float* shift, TO* y, long rows, long D, long L,
                             long Ls) {
    FOR_CHUNKS(i, rows * D) {
        const long m = mod_row(i / D, L, Ls) * D + i % D;
        float v[W], s[W], h[W];
        load_n<TI, W>(x + i, v);
        load_f32<W>(scale + m, s);
        load_f32<W>(shift + m, h);
#pragma unroll
        for (int k = 0; k < W; ++k) v[k] = v[k] * (1.f + s[k]) + h[k];
        store_n<TO, W>(y + i, v);
    }
}

// dx = dy * (offset + scale): offset 1 for the modulation's input, 0 for the gated residual's branch.
template <typename TI, typename TO, int W>
__device__ void scaled_bwd(const TI* dy, const float* scale, float offset, TO* dx, long rows, long D, long L,
                           long Ls) {
    FOR_CHUNKS(i, rows * D) {
        const long m = mod_row(i / D, L, Ls) * D + i % D;
        float v[W], s[W];
        load_n<TI, W>(dy + i, v);
        load_f32<W>(scale + m, s);
#pragma unroll
        for (int k = 0; k < W; ++k) v[k] *= offset + s[k];
        store_n<TO, W>(dx + i, v);
    }
}

// out = x + y * gate with x and out in TX (the residual dtype) and y in TY (the branch's dtype).
template <typename TX, typename TY, int W>
__device__ void gated_fwd(const TX* x, const TY* y, const float* gate, TX* out, long rows, long D, long L, long Ls) {
    FOR_CHUNKS(i, rows * D) {
        const long m = mod_row(i / D, L, Ls) * D + i % D;
        float a[W], b[W], g[W];
        load_n<TX, W>(x + i, a);
        load_n<TY, W>(y + i, b);
        load_f32<W>(gate + m, g);
#pragma unroll
        for (int k = 0; k < W; ++k) a[k] += b[k] * g[k];
        store_n<TX, W>(out + i, a);
    }
}

// Gradients of the modulation vectors: ga[m, c] += sum g * a, gb[m, c] += sum g over the rows that use vector m.
// Grid: (ceil(D / blockDim.x), chunks of `rows_per_chunk` tokens, B). ga / gb (gb may be null) must be zeroed.
// Only needed when the modulation itself is trained, so kept simple (one column per thread).
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

template <typename T, int W>
__device__ void gelu_fwd(const T* x, T* y, long n) {
    FOR_CHUNKS(i, n) {
        float v[W];
        load_vec<T, W>(x + i, v);
#pragma unroll
        for (int k = 0; k < W; ++k) v[k] = gelu_tanh_f(v[k]);
        store_vec<T, W>(y + i, v);
    }
}

template <typename T, int W>
__device__ void gelu_bwd(const T* x, const T* dy, T* dx, long n) {
    FOR_CHUNKS(i, n) {
        float v[W], d[W];
        load_vec<T, W>(x + i, v);
        load_vec<T, W>(dy + i, d);
#pragma unroll
        for (int k = 0; k < W; ++k) v[k] = d[k] * gelu_tanh_grad(v[k]);
        store_vec<T, W>(dx + i, v);
    }
}

// Rotary embedding on adjacent pairs (x[2j], x[2j+1]) of x [rows, heads, 2 * half] with per-row angle tables
// cos / sin [rows, half] (f32): out = (re·c − s·sign·im, sign·s·re + c·im). sign = 1 rotates forward; sign = −1
// rotates back, which is the backward of the forward rotation. A chunk of W values is W / 2 pairs of one head.
template <typename T, int W>
__device__ void rope(const T* x, const float* cosv, const float* sinv, float sign, T* out, long rows, long heads,
                     long half) {
    constexpr int P = W > 1 ? W / 2 : 1;
    FOR_CHUNKS(i, rows * heads * half * 2) {
        const long p = i / 2;
        const long t = (p / (heads * half)) * half + p % half;
        float v[W > 1 ? W : 2], c[P], s[P];
        if constexpr (W > 1) {
            load_vec<T, W>(x + i, v);
        } else {
            // Scalar path: the thread owning the even element does the pair.
            if (i % 2) continue;
            v[0] = to_f32(x[i]);
            v[1] = to_f32(x[i + 1]);
        }
        load_f32<P>(cosv + t, c);
        load_f32<P>(sinv + t, s);
#pragma unroll
        for (int k = 0; k < P; ++k) {
            const float re = v[2 * k], im = v[2 * k + 1], sk = sign * s[k];
            v[2 * k] = re * c[k] - im * sk;
            v[2 * k + 1] = re * sk + im * c[k];
        }
        if constexpr (W > 1) {
            store_vec<T, W>(out + i, v);
        } else {
            out[i] = from_f32<T>(v[0]);
            out[i + 1] = from_f32<T>(v[1]);
        }
    }
}

// Rows of a strided view copied into a dense [rows, cols] tensor: row r of the source starts `stride` values
// after row r - 1 (a narrow of the last dimension, or heads split out of a fused projection). With `vec`, whole
// 16-byte chunks (cols, stride and the source offset multiples of the chunk, checked by the caller); candle's
// generic strided copy computes a full index per value and ran at a fraction of the bandwidth (H200 profile).
template <typename T, int W>
__device__ void copy_rows(const T* x, T* y, long rows, long cols, long stride) {
    const long per_row = cols / W;
    const long n = rows * per_row;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const long r = i / per_row;
        const long c = (i - r * per_row) * W;
        if constexpr (W == 1) {
            y[r * cols + c] = x[r * stride + c];
        } else {
            *reinterpret_cast<uint4*>(y + r * cols + c) = *reinterpret_cast<const uint4*>(x + r * stride + c);
        }
    }
}

#define DISPATCH_VEC(T, call) \
    if (vec) { \
        constexpr int W = vec_width<T>(); \
        call; \
    } else { \
        constexpr int W = 1; \
        call; \
    }

// ---- Per-head gates (LTX-2.3's gated attention): rows of d values (a token's head), each times its gate ----

// y = x · g[row], rounded to T (a chunk of W values never straddles a row: the caller vectorises only when W
// divides d).
template <typename T, int W>
__device__ void head_gate_fwd(const T* x, const T* g, T* y, long n, long d) {
    FOR_CHUNKS(i, n) {
        const float gv = to_f32(g[i / d]);
        float v[W];
        load_vec<T, W>(x + i, v);
#pragma unroll
        for (int k = 0; k < W; ++k) v[k] = __fmul_rn(v[k], gv);
        store_vec<T, W>(y + i, v);
    }
}

// dx = dy · g[row] (as head_gate_fwd) and dg[row] = Σ round(dy · x) over the row, summed in f32 and rounded to T
// (the gate's gradient from the rounded products). One warp per row.
template <typename T, int W>
__device__ void head_gate_bwd(const T* dy, const T* x, const T* g, T* dx, T* dg, long rows, long d) {
    const long row = ((long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const long base = row * d;
    const float gv = to_f32(g[row]);
    float s = 0.f;
    for (long c = (long)lane * W; c < d; c += 32L * W) {
        float a[W], b[W];
        load_vec<T, W>(dy + base + c, a);
        load_vec<T, W>(x + base + c, b);
#pragma unroll
        for (int k = 0; k < W; ++k) {
            s += round_through<T>(__fmul_rn(a[k], b[k]));
            a[k] = __fmul_rn(a[k], gv);
        }
        store_vec<T, W>(dx + base + c, a);
    }
    s = warp_sum(s);
    if (lane == 0) dg[row] = from_f32<T>(s);
}

// The gates 2·sigmoid(z) from their logits as candle's composition `(exp(-z) + 1).recip() · 2` computes them, bit
// for bit: each step rounded to T by the same operation candle's unary and affine kernels use (for f32, its
// reciprocal's division in double). One value per thread.
__device__ __forceinline__ float sigmoid_gate(float z) {
    const float a = expf(-z) * 1.f + 1.f;
    const float r = (float)(1.0 / (double)a);
    return r * 2.f + 0.f;
}
__device__ __forceinline__ __nv_bfloat16 sigmoid_gate(__nv_bfloat16 z) {
    const __nv_bfloat16 one = __float2bfloat16(1.f), two = __float2bfloat16(2.f), zero = __float2bfloat16(0.f);
    const __nv_bfloat16 a = hexp(-z) * one + one;
    const __nv_bfloat16 r = one / a;
    return r * two + zero;
}

// The gates' logit gradient dz = (dg · g) · (1 − g · 0.5) (dg/dz of g = 2σ(z) is g · (1 − g/2)), as candle's
// products and affine ops round it.
__device__ __forceinline__ float sigmoid_gate_grad(float dg, float g) {
    const float h = g * 0.5f + 0.f;
    return (dg * g) * (h * -1.f + 1.f);
}
__device__ __forceinline__ __nv_bfloat16 sigmoid_gate_grad(__nv_bfloat16 dg, __nv_bfloat16 g) {
    const __nv_bfloat16 one = __float2bfloat16(1.f), half = __float2bfloat16(0.5f), zero = __float2bfloat16(0.f),
                        minus = __float2bfloat16(-1.f);
    const __nv_bfloat16 h = g * half + zero;
    return (dg * g) * (h * minus + one);
}

#define FOR_VALUES(i, n) for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (long)gridDim.x * blockDim.x)

#define ELEMENTWISE_KERNELS(T, S)                                                                               \
    extern "C" __global__ void fs_modulate_fwd_##S(const T* x, const float* scale, const float* shift, T* y,    \
                                                   long rows, long D, long L, long Ls, long vec) {              \
        DISPATCH_VEC(T, (modulate_fwd<T, T, W>(x, scale, shift, y, rows, D, L, Ls)))                               \
    }                                                                                                           \
    extern "C" __global__ void fs_scaled_bwd_##S(const T* dy, const float* scale, float offset, T* dx,          \
                                                 long rows, long D, long L, long Ls, long vec) {                \
        DISPATCH_VEC(T, (scaled_bwd<T, T, W>(dy, scale, offset, dx, rows, D, L, Ls)))                              \
    }                                                                                                           \
    extern "C" __global__ void fs_gated_fwd_##S(const T* x, const T* y, const float* gate, T* out, long rows,   \
                                                long D, long L, long Ls, long vec) {                            \
        DISPATCH_VEC(T, (gated_fwd<T, T, W>(x, y, gate, out, rows, D, L, Ls)))                                     \
    }                                                                                                           \
    extern "C" __global__ void fs_mod_param_grad_##S(const T* a, const T* g, float* ga, float* gb, long D,      \
                                                     long L, long Ls, long rows_per_chunk) {                    \
        mod_param_grad<T>(a, g, ga, gb, D, L, Ls, rows_per_chunk);                                              \
    }                                                                                                           \
    extern "C" __global__ void fs_rope_##S(const T* x, const float* c, const float* s, float sign, T* out,      \
                                           long rows, long heads, long half, long vec) {                        \
        DISPATCH_VEC(T, (rope<T, W>(x, c, s, sign, out, rows, heads, half)))                                    \
    }                                                                                                           \
    extern "C" __global__ void fs_copy_rows_##S(const T* x, T* y, long rows, long cols, long stride, long vec) { \
        DISPATCH_VEC(T, (copy_rows<T, W>(x, y, rows, cols, stride)))                                            \
    }                                                                                                           \
    extern "C" __global__ void fs_gelu_fwd_##S(const T* x, T* y, long n, long vec) {                            \
        DISPATCH_VEC(T, (gelu_fwd<T, W>(x, y, n)))                                                              \
    }                                                                                                           \
    extern "C" __global__ void fs_gelu_bwd_##S(const T* x, const T* dy, T* dx, long n, long vec) {              \
        DISPATCH_VEC(T, (gelu_bwd<T, W>(x, dy, dx, n)))                                                         \
    }                                                                                                           \
    extern "C" __global__ void fs_head_gate_fwd_##S(const T* x, const T* g, T* y, long n, long d, long vec) {   \
        DISPATCH_VEC(T, (head_gate_fwd<T, W>(x, g, y, n, d)))                                                   \
    }                                                                                                           \
    extern "C" __global__ void fs_head_gate_bwd_##S(const T* dy, const T* x, const T* g, T* dx, T* dg,          \
                                                    long rows, long d, long vec) {                              \
        DISPATCH_VEC(T, (head_gate_bwd<T, W>(dy, x, g, dx, dg, rows, d)))                                       \
    }                                                                                                           \
    extern "C" __global__ void fs_sigmoid_gate_fwd_##S(const T* z, T* g, long n) {                              \
        FOR_VALUES(i, n) g[i] = sigmoid_gate(z[i]);                                                             \
    }                                                                                                           \
    extern "C" __global__ void fs_sigmoid_gate_bwd_##S(const T* dg, const T* g, T* dz, long n) {                \
        FOR_VALUES(i, n) dz[i] = sigmoid_gate_grad(dg[i], g[i]);                                                \
    }

ELEMENTWISE_KERNELS(float, f32)
ELEMENTWISE_KERNELS(__nv_bfloat16, bf16)

// ---- Mixed-dtype variants (input dtype TI, output TO; f32 <-> bf16): the residual stream is f32 while the
// block computes in bf16, and these fuse the cast into the op so the f32 tensor is read or written once.
// Vectorised chunks hold MIXED_W values (common.cuh). ----

template <typename TI, typename TO, int W>
__device__ void cast_n(const TI* x, TO* y, long n) {
    FOR_CHUNKS(i, n) {
        float v[W];
        load_n<TI, W>(x + i, v);
        store_n<TO, W>(y + i, v);
    }
}

#define MIXED_KERNELS(TI, SI, TO, SO)                                                                           \
    extern "C" __global__ void fs_cast_##SI##_##SO(const TI* x, TO* y, long n, long vec) {                     \
        DISPATCH_MIXED((cast_n<TI, TO, W>(x, y, n)))                                                            \
    }                                                                                                           \
    extern "C" __global__ void fs_modulate_fwd_##SI##_##SO(const TI* x, const float* scale, const float* shift, \
                                                           TO* y, long rows, long D, long L, long Ls,           \
                                                           long vec) {                                          \
        DISPATCH_MIXED((modulate_fwd<TI, TO, W>(x, scale, shift, y, rows, D, L, Ls)))                     \
    }                                                                                                           \
    extern "C" __global__ void fs_scaled_bwd_##SI##_##SO(const TI* dy, const float* scale, float offset,        \
                                                         TO* dx, long rows, long D, long L, long Ls,            \
                                                         long vec) {                                            \
        DISPATCH_MIXED((scaled_bwd<TI, TO, W>(dy, scale, offset, dx, rows, D, L, Ls)))                    \
    }                                                                                                           \
    extern "C" __global__ void fs_gated_fwd_##SI##_##SO(const TI* x, const TO* y, const float* gate, TI* out,  \
                                                        long rows, long D, long L, long Ls, long vec) {         \
        DISPATCH_MIXED((gated_fwd<TI, TO, W>(x, y, gate, out, rows, D, L, Ls)))                           \
    }

MIXED_KERNELS(float, f32, __nv_bfloat16, bf16)
MIXED_KERNELS(__nv_bfloat16, bf16, float, f32)
