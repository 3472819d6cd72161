// The small per-layer passes of the adapters (`framesmith_nn::ops::adapter`), each one launch where
// candle's composition took several: LoHa's row-wise outer products and their gradients (cuBLAS ran them as
// batched products of 1-wide matrices, one tile per row), DoRA's row norms from their low-rank terms, and a LoRA
// layer's bias columns (candle's affine, cast and two three-way concatenations); and the merged weights W + ΔW of
// LoHa and LoKr. LoHa's, DoRA's and LoRA's factors are f32; a factor `a` of `n` vectors of `r` values is stored
// [n, r] (`columns` 0) or [r, n] (`columns` 1).
#include "common.cuh"

#define FOR_EACH(i, n) for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (long)gridDim.x * blockDim.x)

// Value `k` of vector `j` of a factor of `n` vectors of `r` values.
__device__ __forceinline__ float factor_at(const float* a, long j, long k, long n, long r, int columns) {
    return columns ? a[k * n + j] : a[j * r + k];
}

// out[j, p·r + q] = (a_j[p] · b_j[q]) · s, rounded once to TO; each product rounded as f32 first (the reference's
// batched product of a [r, 1] by a [1, r] column, then its scale).
template <typename TO>
__device__ void pair_products(const float* a, const float* b, TO* out, long n, long r, int columns, float s) {
    const long r2 = r * r;
    FOR_EACH(i, n * r2) {
        const long j = i / r2;
        const long pq = i - j * r2;
        const long p = pq / r;
        const long q = pq - p * r;
        float v = __fmul_rn(factor_at(a, j, p, n, r, columns), factor_at(b, j, q, n, r, columns));
        if (s != 1.f) v = __fmul_rn(v, s);
        out[i] = from_f32<TO>(v);
    }
}

// The gradients of pair_products for d [n, r²]: da_j[k] = s · Σ_q d[j, k·r + q] b_j[q] and
// db_j[k] = s · Σ_p d[j, p·r + k] a_j[p], written f32 in the factors' layout. One thread per (j, k), the index
// running over j fastest for column factors so that the writes stay contiguous.
template <typename TD>
__device__ void pair_products_bwd(const TD* d, const float* a, const float* b, float* da, float* db, long n, long r,
                                  int columns, float s) {
    FOR_EACH(i, n * r) {
        const long j = columns ? i % n : i / r;
        const long k = columns ? i / n : i % r;
        const TD* row = d + j * r * r;
        float sa = 0.f, sb = 0.f;
        for (long t = 0; t < r; ++t) {
            sa = fmaf(to_f32(row[k * r + t]), factor_at(b, j, t, n, r, columns), sa);
            sb = fmaf(to_f32(row[t * r + k]), factor_at(a, j, t, n, r, columns), sb);
        }
        if (s != 1.f) {
            sa = __fmul_rn(sa, s);
            sb = __fmul_rn(sb, s);
        }
        da[i] = sa;
        db[i] = sb;
    }
}

// DoRA's row norms ‖W_o + s·B_o A‖ + eps from their terms, one thread per output row o:
// squares[o] + 2s·Σ_p up[o, p] wa[p, o] + s²·Σ_{p,q} up[o, p] gram[p, q] up[o, q], clamped at zero (rounding can
// take a vanishing norm below it), square-rooted, eps added. `up` [out, r] and `gram` = A Aᵀ [r, r] f32, `wa` =
// A Wᵀ [r, out] in TW, `squares` = ‖W_o‖² [out] f32.
template <typename TW>
__device__ void dora_norms(const float* squares, const float* up, const TW* wa, const float* gram, float* norms,
                           long out, long r, float s, float eps) {
    FOR_EACH(o, out) {
        const float* u = up + o * r;
        float cross = 0.f, quad = 0.f;
        for (long p = 0; p < r; ++p) {
            cross = fmaf(u[p], to_f32(wa[p * out + o]), cross);
            float g = 0.f;
            for (long q = 0; q < r; ++q) g = fmaf(gram[p * r + q], u[q], g);
            quad = fmaf(u[p], g, quad);
        }
        float sq = squares[o] + cross * (2.f * s) + quad * (s * s);
        sq = fmaxf(sq, 0.f);
        norms[o] = __fsqrt_rn(sq) + eps;
    }
}

// out = w + p1 ⊙ p2 over n values of T, the product rounded to T before the sum (the reference's two separate ops,
// bit for bit: a product of two bf16 values is exact in f32). LoHa's merged weight W + ΔW in one pass. `vec`: 8
// values per thread through 16-byte accesses (n a multiple of 8, every buffer 16-byte aligned), else 1.
template <typename T, int W>
__device__ void add_product(const T* w, const T* p1, const T* p2, T* out, long n) {
    for (long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * W; i < n; i += (long)gridDim.x * blockDim.x * W) {
        float a[W], b[W], c[W];
        load_n<T, W>(w + i, a);
        load_n<T, W>(p1 + i, b);
        load_n<T, W>(p2 + i, c);
#pragma unroll
        for (int k = 0; k < W; ++k) a[k] = __fadd_rn(a[k], round_through<T>(__fmul_rn(b[k], c[k])));
        store_n<T, W>(out + i, a);
    }
}

// A LoRA layer's low-rank activation as its forward uses it, from the down product `raw` [m, r] (row stride `ld`):
// `mid` = raw · s rounded to T ([m, r], candle's affine bit for bit: `s` comes already rounded to T, and the
// product's rounding is followed by the affine's `+ 0`), and `mid1` = [mid | 1 | 0…] [m, width] (the bias as one
// more rank column, zero columns up to `width`).
template <typename T>
__device__ void lora_mid(const T* raw, T* mid, T* mid1, long m, long r, long ld, long width, float s) {
    FOR_EACH(i, m * width) {
        const long row = i / width;
        const long j = i - row * width;
        T v;
        if (j < r) {
            v = from_f32<T>(__fadd_rn(round_through<T>(__fmul_rn(to_f32(raw[row * ld + j]), s)), 0.f));
            mid[row * r + j] = v;
        } else {
            v = from_f32<T>(j == r ? 1.f : 0.f);
        }
        mid1[i] = v;
    }
}

// `up1` = [up | bias | 0…] [n, width] in T from the f32 factor `up` [n, r] (rounded to nearest, as candle's cast)
// and the bias [n] in T: the other side of lora_mid's bias column.
template <typename T>
__device__ void lora_up(const float* up, const T* bias, T* up1, long n, long r, long width) {
    FOR_EACH(i, n * width) {
        const long row = i / width;
        const long j = i - row * width;
        up1[i] = j < r ? from_f32<T>(up[row * r + j]) : (j == r ? bias[row] : from_f32<T>(0.f));
    }
}

// out[o, p] = w[o, p] + w1[o / c, p / d] · w2[o % c, p % d] over a [rows, b·d] weight (rows = a·c): LoKr's merged
// weight W + ΔW, the scale already on w1, in one pass; the product and the sum in f32, rounded once to T (the
// reference's f32 Kronecker product added to the f32 base). `vec`: W values per thread through 16-byte accesses
// (d a multiple of 8, every buffer 16-byte aligned), so a thread's values share their w1 entry and read
// consecutive w2 ones; else 1.
template <typename T, int W>
__device__ void add_kron(const T* w, const T* w1, const T* w2, T* out, long rows, long b, long c, long d) {
    const long in = b * d;
    const long n = rows * in;
    // Row and column indices fit in 32 bits (each below a width): their divisions run on 32-bit integers, which
    // cost a fraction of 64-bit ones.
    const bool narrow = n <= 0x7fffffffL;
    for (long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * W; i < n; i += (long)gridDim.x * blockDim.x * W) {
        const unsigned o = narrow ? (unsigned)i / (unsigned)in : (unsigned)(i / in);
        const unsigned p = (unsigned)(i - (long)o * in);
        const unsigned oi = o / (unsigned)c, ok = o - oi * (unsigned)c;
        const unsigned pj = p / (unsigned)d, pl = p - pj * (unsigned)d;
        const float s = to_f32(w1[(long)oi * b + pj]);
        float a[W], q[W];
        load_n<T, W>(w + i, a);
        load_n<T, W>(w2 + (long)ok * d + pl, q);
#pragma unroll
        for (int k = 0; k < W; ++k) a[k] = __fadd_rn(a[k], __fmul_rn(s, q[k]));
        store_n<T, W>(out + i, a);
    }
}

#define DEFINE(S, T)                                                                                                \
    extern "C" __global__ void fs_pair_products_##S(const float* a, const float* b, T* out, long n, long r,       \
                                                    int columns, float s) {                                       \
        pair_products<T>(a, b, out, n, r, columns, s);                                                            \
    }                                                                                                               \
    extern "C" __global__ void fs_pair_products_bwd_##S(const T* d, const float* a, const float* b, float* da,     \
                                                        float* db, long n, long r, int columns, float s) {        \
        pair_products_bwd<T>(d, a, b, da, db, n, r, columns, s);                                                  \
    }                                                                                                               \
    extern "C" __global__ void fs_dora_norms_##S(const float* squares, const float* up, const T* wa,              \
                                                 const float* gram, float* norms, long out, long r, float s,      \
                                                 float eps) {                                                     \
        dora_norms<T>(squares, up, wa, gram, norms, out, r, s, eps);                                              \
    }                                                                                                               \
    extern "C" __global__ void fs_add_product_##S(const T* w, const T* p1, const T* p2, T* out, long n,          \
                                                  long vec) {                                                     \
        DISPATCH_MIXED((add_product<T, W>(w, p1, p2, out, n)))                                                    \
    }                                                                                                               \
    extern "C" __global__ void fs_lora_mid_##S(const T* raw, T* mid, T* mid1, long m, long r, long ld,           \
                                               long width, float s) {                                             \
        lora_mid<T>(raw, mid, mid1, m, r, ld, width, s);                                                          \
    }                                                                                                               \
    extern "C" __global__ void fs_lora_up_##S(const float* up, const T* bias, T* up1, long n, long r,             \
                                              long width) {                                                       \
        lora_up<T>(up, bias, up1, n, r, width);                                                                   \
    }                                                                                                               \
    extern "C" __global__ void fs_add_kron_##S(const T* w, const T* w1, const T* w2, T* out, long rows, long b,   \
                                               long c, long d, long vec) {                                        \
        DISPATCH_MIXED((add_kron<T, W>(w, w1, w2, out, rows, b, c, d)))                                           \
    }

DEFINE(f32, float)
DEFINE(bf16, __nv_bfloat16)
