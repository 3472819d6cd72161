// RMSNorm and LayerNorm over the last dimension, forward and backward. One thread block per row; statistics in
// f32. As in the official Wan code, the normalised value is rounded to the activation dtype before the weight
// multiplies it (RMSNorm), while LayerNorm applies its affine parameters in f32. Every kernel takes `vec`:
// nonzero when rows and pointers allow 16-byte accesses (cols a multiple of 16 / sizeof(T), aligned buffers).
#include "common.cuh"

// Loops over a row in chunks of W values: each thread takes every blockDim.x-th chunk.
#define FOR_CHUNKS(c, cols) for (long c = (long)threadIdx.x * W; c < (cols); c += (long)blockDim.x * W)

// A row of the weight `p` from column `c` (W values), or ones without a weight.
template <typename T, int W>
__device__ void load_param(const T* p, long c, float* out) {
    if (p) {
        load_n<T, W>(p + c, out);
    } else {
#pragma unroll
        for (int k = 0; k < W; ++k) out[k] = 1.f;
    }
}

// The gradient LayerNorm's backward sees: `dh · (1 + scale)` (the modulation's input gradient) or `dh`, rounded
// to TX as the separate kernels store it.
template <typename TX, typename TH, int W>
__device__ void load_dy(const TH* dh, const float* scale, float* out) {
    load_n<TH, W>(dh, out);
    if (scale) {
        float s[W];
        load_f32<W>(scale, s);
#pragma unroll
        for (int k = 0; k < W; ++k) out[k] = round_through<TX>(out[k] * (1.f + s[k]));
    } else {
#pragma unroll
        for (int k = 0; k < W; ++k) out[k] = round_through<TX>(out[k]);
    }
}

// ---- RMSNorm ----

template <typename T, int W>
__device__ float row_rstd_rms(const T* x, long cols, float eps, float* scratch) {
    float ss = 0.f;
    FOR_CHUNKS(c, cols) {
        float v[W];
        load_vec<T, W>(x + c, v);
#pragma unroll
        for (int k = 0; k < W; ++k) ss += v[k] * v[k];
    }
    ss = block_sum(ss, scratch);
    return rsqrtf(ss / (float)cols + eps);
}

// ---- LayerNorm ----

// With `rms` (uniform over the block) the mean is taken as 0, so `var` is RMSNorm's mean square, summed as
// row_rstd_rms sums it.
template <typename T, int W>
__device__ void row_stats_ln(const T* x, long cols, float* scratch, float* mean, float* var, bool rms = false) {
    float m = 0.f;
    if (!rms) {
        float s = 0.f;
        FOR_CHUNKS(c, cols) {
            float v[W];
            load_n<T, W>(x + c, v);
#pragma unroll
            for (int k = 0; k < W; ++k) s += v[k];
        }
        m = block_sum(s, scratch) / (float)cols;
    }
    float q = 0.f;
    FOR_CHUNKS(c, cols) {
        float v[W];
        load_n<T, W>(x + c, v);
#pragma unroll
        for (int k = 0; k < W; ++k) q += (v[k] - m) * (v[k] - m);
    }
    *mean = m;
    *var = block_sum(q, scratch) / (float)cols;
}

// Writes a row's LayerNorm from its statistics: `(x - mean) · rstd · w + b` in f32 (affine parameters in TI,
// optional), rounded to TI as the plain forward stores it, then, with a modulation, `· (1 + scale) + shift`;
// the result stored in TO. `scale` / `shift` point at the row's vectors (or are null).
template <typename TI, typename TO, int W>
__device__ void ln_write(const TI* x, const TI* w, const TI* b, const float* scale, const float* shift, TO* y,
                         long cols, float mean, float rstd) {
    FOR_CHUNKS(c, cols) {
        float v[W], g[W], o[W];
        load_n<TI, W>(x + c, v);
        load_param<TI, W>(w, c, g);
        if (b) {
            load_n<TI, W>(b + c, o);
        } else {
#pragma unroll
            for (int k = 0; k < W; ++k) o[k] = 0.f;
        }
#pragma unroll
        for (int k = 0; k < W; ++k) v[k] = round_through<TI>((v[k] - mean) * rstd * g[k] + o[k]);
        if (scale) {
            float s[W], t[W];
            load_f32<W>(scale + c, s);
            load_f32<W>(shift + c, t);
#pragma unroll
            for (int k = 0; k < W; ++k) v[k] = v[k] * (1.f + s[k]) + t[k];
        }
        store_n<TO, W>(y + c, v);
    }
}

// LayerNorm (affine parameters optional) of a TI row written in TO: with TO = TI the plain forward
// (fs_ln_fwd_*); otherwise that output cast to TO without the TI copy written and read back (Wan's `norm3`: an
// f32 residual normalised for a bf16 projection).
template <typename TI, typename TO, int W>
__device__ void ln_fwd_to(const TI* x, const TI* w, const TI* b, TO* y, long cols, float eps) {
    __shared__ float scratch[32];
    const long row = blockIdx.x;
    x += row * cols;
    y += row * cols;
    float mean, var;
    row_stats_ln<TI, W>(x, cols, scratch, &mean, &var);
    ln_write<TI, TO, W>(x, w, b, nullptr, nullptr, y, cols, mean, rsqrtf(var + eps));
}

// ---- LayerNorm fused with the Wan block's modulation, forward and backward ----
// These do in one pass what the block otherwise does in two or three: LayerNorm without affine parameters, then
// `x̂ · (1 + scale) + shift` written in the compute dtype TO (forward); the modulation's input gradient
// `dh · (1 + scale)`, LayerNorm's backward (weight optional) and the residual gradient's add (backward). Same
// arithmetic as the separate kernels, with the intermediate roundings they make (a value stored in the
// residual dtype TX is rounded to it here too), so results equal theirs. Modulation vectors are f32
// [B * Ls, cols] with Ls 1 (one per sample) or L (one per token), as in elementwise.cu. W is 8 (one or two
// 16-byte accesses per side: DISPATCH_MIXED) when `vec` is nonzero, else 1. With `rms` the statistics are
// RMSNorm's (mean 0, no affine parameters; LTX-2's blocks): `round(x · rstd)` as fs_rms_fwd stores it, and
// RMSNorm's backward.

template <typename TI, typename TO, int W>
__device__ void ln_mod_fwd(const TI* x, const float* scale, const float* shift, TO* y, long cols, long L, long Ls,
                           float eps, bool rms) {
    __shared__ float scratch[32];
    const long row = blockIdx.x;
    x += row * cols;
    y += row * cols;
    const long m = mod_row(row, L, Ls) * cols;
    float mean, var;
    row_stats_ln<TI, W>(x, cols, scratch, &mean, &var, rms);
    ln_write<TI, TO, W>(x, nullptr, nullptr, scale + m, shift + m, y, cols, mean, rsqrtf(var + eps));
}

// LayerNorm's input gradient, dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * w, plus `dres`
// when given: dy = dh · (1 + scale) with a modulation, else dh, rounded to TX; dh in TH. The plain backward
// (fs_ln_bwd_*) is this with neither modulation nor residual gradient.
template <typename TX, typename TH, int W>
__device__ void ln_bwd(const TX* x, const TX* w, const TH* dh, const float* scale, const TX* dres, TX* dx,
                           long cols, long L, long Ls, float eps, bool rms = false) {
    __shared__ float scratch[32];
    const long row = blockIdx.x;
    x += row * cols;
    dh += row * cols;
    if (dres) dres += row * cols;
    dx += row * cols;
    if (scale) scale += mod_row(row, L, Ls) * cols;
    float mean, var;
    row_stats_ln<TX, W>(x, cols, scratch, &mean, &var, rms);
    const float rstd = rsqrtf(var + eps);
    float sg = 0.f, sgx = 0.f;
    FOR_CHUNKS(c, cols) {
        float v[W], d[W], g[W];
        load_n<TX, W>(x + c, v);
        load_dy<TX, TH, W>(dh + c, scale ? scale + c : nullptr, d);
        load_param<TX, W>(w, c, g);
#pragma unroll
        for (int k = 0; k < W; ++k) {
            sg += d[k] * g[k];
            sgx += d[k] * g[k] * (v[k] - mean) * rstd;
        }
    }
    // RMSNorm's gradient has no mean term: rstd · (g − x̂ · mean(g · x̂)).
    const float mean_g = rms ? 0.f : block_sum(sg, scratch) / (float)cols;
    const float mean_gx = block_sum(sgx, scratch) / (float)cols;
    FOR_CHUNKS(c, cols) {
        float v[W], d[W], g[W], r[W];
        load_n<TX, W>(x + c, v);
        load_dy<TX, TH, W>(dh + c, scale ? scale + c : nullptr, d);
        load_param<TX, W>(w, c, g);
        if (dres) load_n<TX, W>(dres + c, r);
#pragma unroll
        for (int k = 0; k < W; ++k) {
            const float grad = round_through<TX>(rstd * (d[k] * g[k] - mean_g - (v[k] - mean) * rstd * mean_gx));
            v[k] = dres ? __fadd_rn(r[k], grad) : grad;
        }
        store_n<TX, W>(dx + c, v);
    }
}

// ---- RMSNorm fused with the 3D RoPE that follows it (Wan's q and k) ----
// The row is one token's `heads` heads of `2 * half` values; `cosv` / `sinv` hold `half` angles per token. The
// forward writes `rope(rms_fwd(x))` with the values rounded to T where the separate kernels store them (the
// normalised value, the weighted value, the rotated value), so it equals `fs_rms_fwd` then `fs_rope`; the
// backward takes the rotated output's gradient, rotates it back (rounded to T as `fs_rope` stores it) and runs
// `rms_bwd` on it, equal to `fs_rope` (sign -1) then `fs_rms_bwd`. One intermediate written and read fewer each.

// W values of the row from column c rotated pairwise by the token's angles (sign +1 forward, -1 back).
template <int W>
__device__ __forceinline__ void rotate_pairs(float* v, const float* cosv, const float* sinv, long c, long half,
                                             float sign) {
    static_assert(W % 2 == 0, "whole pairs");
#pragma unroll
    for (int k = 0; k < W; k += 2) {
        const long j = ((c + k) / 2) % half;
        const float co = cosv[j], si = sign * sinv[j];
        const float re = v[k], im = v[k + 1];
        v[k] = re * co - im * si;
        v[k + 1] = re * si + im * co;
    }
}

// x[c .. c+W) normalised and weighted, as fs_rms_fwd stores them in T.
template <typename T, int W>
__device__ __forceinline__ void rms_values(const T* x, const T* w, long c, float rstd, float* v) {
    float g[W];
    load_vec<T, W>(x + c, v);
    load_param<T, W>(w, c, g);
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] = round_through<T>(round_through<T>(v[k] * rstd) * g[k]);
}

// The gradient of fs_rope's input at [c .. c+W) from its output gradient dy (pairs rotated back, rounded to T as
// fs_rope stores them); without tables (null `cosv`) dy itself. W = 1 reads the value's pair partner too.
template <typename T, int W>
__device__ __forceinline__ void unrotated(const T* dy, const float* cosv, const float* sinv, long c, long half,
                                          float* d) {
    if (!cosv) {
        load_vec<T, W>(dy + c, d);
    } else if constexpr (W > 1) {
        load_vec<T, W>(dy + c, d);
        rotate_pairs<W>(d, cosv, sinv, c, half, -1.f);
#pragma unroll
        for (int k = 0; k < W; ++k) d[k] = round_through<T>(d[k]);
    } else {
        const long e = c & ~1L;
        float p[2] = {to_f32(dy[e]), to_f32(dy[e + 1])};
        rotate_pairs<2>(p, cosv, sinv, e, half, -1.f);
        d[0] = round_through<T>(p[c - e]);
    }
}

// RMSNorm forward, `round(round(x · rstd) · w)` in T, then rotated when `cosv` is given (null: plain RMSNorm).
template <typename T, int W>
__device__ void rms_fwd(const T* x, const T* w, const float* cosv, const float* sinv, T* y, long cols, long half,
                        float eps) {
    __shared__ float scratch[32];
    const long row = blockIdx.x;
    x += row * cols;
    y += row * cols;
    if (cosv) {
        cosv += row * half;
        sinv += row * half;
    }
    const float rstd = row_rstd_rms<T, W>(x, cols, eps, scratch);
    FOR_CHUNKS(c, cols) {
        if (!cosv) {
            float v[W];
            rms_values<T, W>(x, w, c, rstd, v);
            store_vec<T, W>(y + c, v);
        } else if constexpr (W > 1) {
            float v[W];
            rms_values<T, W>(x, w, c, rstd, v);
            rotate_pairs<W>(v, cosv, sinv, c, half, 1.f);
            store_vec<T, W>(y + c, v);
        } else {
            const long e = c & ~1L;
            float p[2];
            rms_values<T, 1>(x, w, e, rstd, p);
            rms_values<T, 1>(x, w, e + 1, rstd, p + 1);
            rotate_pairs<2>(p, cosv, sinv, e, half, 1.f);
            y[c] = from_f32<T>(p[c - e]);
        }
    }
}

// RMSNorm backward, dx = rstd * (g - xhat * mean(g * xhat)) with g = dy * w, for the gradient of the rotated
// output when `cosv` is given (null: of the plain RMSNorm). Statistics are recomputed rather than saved: a row
// re-read is cheaper than keeping per-row statistics alive across the checkpointed block's graph.
template <typename T, int W>
__device__ void rms_bwd(const T* x, const T* w, const T* dy, const float* cosv, const float* sinv, T* dx,
                        long cols, long half, float eps) {
    __shared__ float scratch[32];
    const long row = blockIdx.x;
    x += row * cols;
    dy += row * cols;
    dx += row * cols;
    if (cosv) {
        cosv += row * half;
        sinv += row * half;
    }
    const float rstd = row_rstd_rms<T, W>(x, cols, eps, scratch);
    float dot = 0.f;
    FOR_CHUNKS(c, cols) {
        float v[W], d[W], g[W];
        load_vec<T, W>(x + c, v);
        unrotated<T, W>(dy, cosv, sinv, c, half, d);
        load_param<T, W>(w, c, g);
#pragma unroll
        for (int k = 0; k < W; ++k) dot += d[k] * g[k] * v[k] * rstd;
    }
    const float mean_dot = block_sum(dot, scratch) / (float)cols;
    FOR_CHUNKS(c, cols) {
        float v[W], d[W], g[W];
        load_vec<T, W>(x + c, v);
        unrotated<T, W>(dy, cosv, sinv, c, half, d);
        load_param<T, W>(w, c, g);
#pragma unroll
        for (int k = 0; k < W; ++k) v[k] = rstd * (d[k] * g[k] - v[k] * rstd * mean_dot);
        store_vec<T, W>(dx + c, v);
    }
}

// ---- RMSNorm fused with the rotate-half RoPE that follows it (LTX-2's q and k) ----
// Each head of `d` values rotates its first half against its second, `y₁ = x₁ c − x₂ s`, `y₂ = x₂ c + x₁ s`, by
// per-head tables `c`, `s` of d/2 values in T (cols/2 per row). Each product and the sum are rounded to T as the
// separate element-wise ops store them (`x · cos + swap_halves(x) · sin`), and the normalised value as fs_rms_fwd
// stores it; the backward rotates the gradient back the same way (`dy · cos + swap_halves(dy · sin)`) and runs
// rms_bwd's arithmetic on it. A chunk of W values never straddles a half (the launcher vectorises only when d/2
// is a multiple of W).

// Where chunk c's partner chunk and its table entries are, and whether it is in the first half of its head.
struct HalfPos {
    long partner;
    long table;
    bool first;
};

__device__ __forceinline__ HalfPos half_pos(long c, long d) {
    const long half = d / 2, o = c % d;
    const bool first = o < half;
    return HalfPos{first ? c + half : c - half, (c / d) * half + (first ? o : o - half), first};
}

// `round(round(a · c) + sign · round(b · s))` for W values, in T's rounding.
template <typename T, int W>
__device__ __forceinline__ void rotate_half(float* a, const float* b, const T* cosv, const T* sinv, float sign) {
    float co[W], si[W];
    load_vec<T, W>(cosv, co);
    load_vec<T, W>(sinv, si);
#pragma unroll
    for (int k = 0; k < W; ++k) {
        const float left = round_through<T>(__fmul_rn(a[k], co[k]));
        const float right = round_through<T>(__fmul_rn(b[k], si[k]));
        a[k] = round_through<T>(__fadd_rn(left, sign * right));
    }
}

template <typename T, int W>
__device__ void rms_rope_halves_fwd(const T* x, const T* w, const T* cosv, const T* sinv, T* y, long cols, long d,
                                    float eps) {
    __shared__ float scratch[32];
    const long row = blockIdx.x;
    x += row * cols;
    y += row * cols;
    cosv += row * (cols / 2);
    sinv += row * (cols / 2);
    const float rstd = row_rstd_rms<T, W>(x, cols, eps, scratch);
    FOR_CHUNKS(c, cols) {
        const HalfPos at = half_pos(c, d);
        float v[W], p[W];
        rms_values<T, W>(x, w, c, rstd, v);
        rms_values<T, W>(x, w, at.partner, rstd, p);
        rotate_half<T, W>(v, p, cosv + at.table, sinv + at.table, at.first ? -1.f : 1.f);
        store_vec<T, W>(y + c, v);
    }
}

// The gradient of the rotation's input at [c .. c+W) from its output gradient dy.
template <typename T, int W>
__device__ __forceinline__ void unrotated_halves(const T* dy, const T* cosv, const T* sinv, long c, long d, float* g) {
    const HalfPos at = half_pos(c, d);
    float p[W];
    load_vec<T, W>(dy + c, g);
    load_vec<T, W>(dy + at.partner, p);
    rotate_half<T, W>(g, p, cosv + at.table, sinv + at.table, at.first ? 1.f : -1.f);
}

template <typename T, int W>
__device__ void rms_rope_halves_bwd(const T* x, const T* w, const T* dy, const T* cosv, const T* sinv, T* dx,
                                    long cols, long d, float eps) {
    __shared__ float scratch[32];
    const long row = blockIdx.x;
    x += row * cols;
    dy += row * cols;
    dx += row * cols;
    cosv += row * (cols / 2);
    sinv += row * (cols / 2);
    const float rstd = row_rstd_rms<T, W>(x, cols, eps, scratch);
    float dot = 0.f;
    FOR_CHUNKS(c, cols) {
        float v[W], g[W], wt[W];
        load_vec<T, W>(x + c, v);
        unrotated_halves<T, W>(dy, cosv, sinv, c, d, g);
        load_param<T, W>(w, c, wt);
#pragma unroll
        for (int k = 0; k < W; ++k) dot += g[k] * wt[k] * v[k] * rstd;
    }
    const float mean_dot = block_sum(dot, scratch) / (float)cols;
    FOR_CHUNKS(c, cols) {
        float v[W], g[W], wt[W];
        load_vec<T, W>(x + c, v);
        unrotated_halves<T, W>(dy, cosv, sinv, c, d, g);
        load_param<T, W>(w, c, wt);
#pragma unroll
        for (int k = 0; k < W; ++k) v[k] = rstd * (g[k] * wt[k] - v[k] * rstd * mean_dot);
        store_vec<T, W>(dx + c, v);
    }
}

// ---- A residual update fused with the LayerNorm that reads its result (Wan's `x1 = x + gate·y` then `norm3`, and
// `x2 = x1 + y` then `norm2` with the modulation) ----
// Writes the residual `xo = x + y · gate` (gate null: 1) in TX as fs_gated_fwd does, and the normalised row
// `h` in TY: LayerNorm of xo as ln_write computes it (affine parameters w, b in TX, optional; with a modulation,
// `· (1 + scale) + shift`). Equal to the separate kernels, without reading the residual back from memory.
// Modulation and gate vectors are f32 rows of `cols` values, one per sample (Lg / Ls = 1) or per token (= L).
template <typename TX, typename TY, int W>
__device__ void res_ln_fwd(const TX* x, const TY* y, const float* gate, const TX* w, const TX* b,
                           const float* scale, const float* shift, TX* xo, TY* h, long cols, long L, long Lg,
                           long Ls, float eps, bool rms) {
    __shared__ float scratch[32];
    const long row = blockIdx.x;
    x += row * cols;
    y += row * cols;
    xo += row * cols;
    h += row * cols;
    if (gate) gate += mod_row(row, L, Lg) * cols;
    if (scale) {
        scale += mod_row(row, L, Ls) * cols;
        shift += mod_row(row, L, Ls) * cols;
    }
    FOR_CHUNKS(c, cols) {
        float a[W], v[W];
        load_n<TX, W>(x + c, a);
        load_n<TY, W>(y + c, v);
        if (gate) {
            float g[W];
            load_f32<W>(gate + c, g);
#pragma unroll
            for (int k = 0; k < W; ++k) a[k] += v[k] * g[k];
        } else {
#pragma unroll
            for (int k = 0; k < W; ++k) a[k] += v[k];
        }
        store_n<TX, W>(xo + c, a);
    }
    // Each thread reads back only the chunks it wrote.
    float mean, var;
    row_stats_ln<TX, W>(xo, cols, scratch, &mean, &var, rms);
    ln_write<TX, TY, W>(xo, w, b, scale, shift, h, cols, mean, rsqrtf(var + eps));
}

#define DISPATCH_VEC(T, call) \
    if (vec) { \
        constexpr int W = vec_width<T>(); \
        call; \
    } else { \
        constexpr int W = 1; \
        call; \
    }

#define NORM_KERNELS(T, S)                                                                                      \
    extern "C" __global__ void fs_rms_fwd_##S(const T* x, const T* w, T* y, long cols, float eps, int vec) {    \
        DISPATCH_VEC(T, (rms_fwd<T, W>(x, w, nullptr, nullptr, y, cols, 1, eps)))                              \
    }                                                                                                           \
    extern "C" __global__ void fs_rms_bwd_##S(const T* x, const T* w, const T* dy, T* dx, long cols,            \
                                              float eps, int vec) {                                             \
        DISPATCH_VEC(T, (rms_bwd<T, W>(x, w, dy, nullptr, nullptr, dx, cols, 1, eps)))                         \
    }                                                                                                           \
    extern "C" __global__ void fs_ln_fwd_##S(const T* x, const T* w, const T* b, T* y, long cols, float eps,    \
                                             int vec) {                                                         \
        DISPATCH_VEC(T, (ln_fwd_to<T, T, W>(x, w, b, y, cols, eps)))                                                  \
    }                                                                                                           \
    extern "C" __global__ void fs_ln_bwd_##S(const T* x, const T* w, const T* dy, T* dx, long cols, float eps,  \
                                             int vec) {                                                         \
        DISPATCH_VEC(T, (ln_bwd<T, T, W>(x, w, dy, nullptr, nullptr, dx, cols, 1, 1, eps)))                     \
    }                                                                                                           \
    extern "C" __global__ void fs_rms_rope_fwd_##S(const T* x, const T* w, const float* c, const float* s, T* y, \
                                                   long cols, long half, float eps, int vec) {                  \
        DISPATCH_VEC(T, (rms_fwd<T, W>(x, w, c, s, y, cols, half, eps)))                                       \
    }                                                                                                           \
    extern "C" __global__ void fs_rms_rope_bwd_##S(const T* x, const T* w, const T* dy, const float* c,          \
                                                   const float* s, T* dx, long cols, long half, float eps,      \
                                                   int vec) {                                                   \
        DISPATCH_VEC(T, (rms_bwd<T, W>(x, w, dy, c, s, dx, cols, half, eps)))                                  \
    }                                                                                                           \
    extern "C" __global__ void fs_rms_rope_halves_fwd_##S(const T* x, const T* w, const T* c, const T* s, T* y,  \
                                                          long cols, long d, float eps, int vec) {              \
        DISPATCH_VEC(T, (rms_rope_halves_fwd<T, W>(x, w, c, s, y, cols, d, eps)))                              \
    }                                                                                                           \
    extern "C" __global__ void fs_rms_rope_halves_bwd_##S(const T* x, const T* w, const T* dy, const T* c,       \
                                                          const T* s, T* dx, long cols, long d, float eps,      \
                                                          int vec) {                                            \
        DISPATCH_VEC(T, (rms_rope_halves_bwd<T, W>(x, w, dy, c, s, dx, cols, d, eps)))                         \
    }

NORM_KERNELS(float, f32)
NORM_KERNELS(__nv_bfloat16, bf16)

#define FUSED_NORM_KERNELS(TA, SA, TB, SB)                                                                      \
    extern "C" __global__ void fs_ln_mod_fwd_##SA##_##SB(const TA* x, const float* scale, const float* shift,   \
                                                         TB* y, long cols, long L, long Ls, float eps, int vec,  \
                                                         int rms) {                                              \
        DISPATCH_MIXED((ln_mod_fwd<TA, TB, W>(x, scale, shift, y, cols, L, Ls, eps, rms != 0)))                 \
    }                                                                                                           \
    extern "C" __global__ void fs_ln_fwd_to_##SA##_##SB(const TA* x, const TA* w, const TA* b, TB* y, long cols,  \
                                                        float eps, int vec) {                                   \
        DISPATCH_MIXED((ln_fwd_to<TA, TB, W>(x, w, b, y, cols, eps)))                                           \
    }                                                                                                           \
    extern "C" __global__ void fs_res_ln_fwd_##SA##_##SB(const TA* x, const TB* y, const float* gate, const TA* w, \
                                                         const TA* b, const float* scale, const float* shift,   \
                                                         TA* xo, TB* h, long cols, long L, long Lg, long Ls,    \
                                                         float eps, int vec, int rms) {                         \
        DISPATCH_MIXED((res_ln_fwd<TA, TB, W>(x, y, gate, w, b, scale, shift, xo, h, cols, L, Lg, Ls, eps,      \
                                              rms != 0)))                                                       \
    }                                                                                                           \
    extern "C" __global__ void fs_ln_bwd_add_##SA##_##SB(const TA* x, const TA* w, const TB* dh,                \
                                                         const float* scale, const TA* dres, TA* dx, long cols, \
                                                         long L, long Ls, float eps, int vec, int rms) {        \
        DISPATCH_MIXED((ln_bwd<TA, TB, W>(x, w, dh, scale, dres, dx, cols, L, Ls, eps, rms != 0)))          \
    }

FUSED_NORM_KERNELS(float, f32, float, f32)
FUSED_NORM_KERNELS(float, f32, __nv_bfloat16, bf16)
FUSED_NORM_KERNELS(__nv_bfloat16, bf16, float, f32)
FUSED_NORM_KERNELS(__nv_bfloat16, bf16, __nv_bfloat16, bf16)
