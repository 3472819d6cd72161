// AdamW in place, as torch.optim.AdamW's single-tensor path computes it in f32: the moments from the gradient (times
// the clipping factor), then the parameter. Every product and sum is rounded on its own (__fmul_rn / __fadd_rn, no
// fused multiply-add), the same roundings as the op-by-op CPU path. Gradients and parameters are f32 or bf16;
// moments are f32.
#include "common.cuh"

#define FOR_EACH(i, n) for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (long)gridDim.x * blockDim.x)

__device__ __forceinline__ float scaled_grad(float g, float grad_scale) {
    return grad_scale != 1.f ? __fmul_rn(g, grad_scale) : g;
}

// m += (g - m) * one_minus_beta1
template <typename TG>
__device__ void adamw_exp_avg(float* m, const TG* g, long n, float grad_scale, float one_minus_beta1) {
    FOR_EACH(i, n) {
        const float gi = scaled_grad(to_f32(g[i]), grad_scale);
        const float mi = m[i];
        m[i] = __fadd_rn(mi, __fmul_rn(__fsub_rn(gi, mi), one_minus_beta1));
    }
}

// v = v * beta2 + g² * one_minus_beta2
template <typename TG>
__device__ void adamw_exp_avg_sq(float* v, const TG* g, long n, float grad_scale, float beta2,
                                 float one_minus_beta2) {
    FOR_EACH(i, n) {
        const float gi = scaled_grad(to_f32(g[i]), grad_scale);
        v[i] = __fadd_rn(__fmul_rn(v[i], beta2), __fmul_rn(__fmul_rn(gi, gi), one_minus_beta2));
    }
}

// p = p * decay - (m / (sqrt(v) * inv_bc2_sqrt + eps)) * step_size.
template <typename TP>
__device__ void adamw_param(TP* p, const float* m, const float* v, long n, float decay, float inv_bc2_sqrt,
                            float eps, float step_size) {
    FOR_EACH(i, n) {
        float pi = to_f32(p[i]);
        if (decay != 1.f) pi = __fmul_rn(pi, decay);
        const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(v[i]), inv_bc2_sqrt), eps);
        pi = __fsub_rn(pi, __fmul_rn(__fdiv_rn(m[i], denom), step_size));
        p[i] = from_f32<TP>(pi);
    }
}

#define DEFINE(S, T)                                                                                                \
    extern "C" __global__ void fs_adamw_exp_avg_##S(float* m, const T* g, long n, float grad_scale,               \
                                                    float one_minus_beta1) {                                      \
        adamw_exp_avg<T>(m, g, n, grad_scale, one_minus_beta1);                                                   \
    }                                                                                                               \
    extern "C" __global__ void fs_adamw_exp_avg_sq_##S(float* v, const T* g, long n, float grad_scale,            \
                                                       float beta2, float one_minus_beta2) {                      \
        adamw_exp_avg_sq<T>(v, g, n, grad_scale, beta2, one_minus_beta2);                                         \
    }                                                                                                               \
    extern "C" __global__ void fs_adamw_param_##S(T* p, const float* m, const float* v, long n, float decay,      \
                                                  float inv_bc2_sqrt, float eps, float step_size) {               \
        adamw_param<T>(p, m, v, n, decay, inv_bc2_sqrt, eps, step_size);                                          \
    }

DEFINE(f32, float)
DEFINE(bf16, __nv_bfloat16)

// ---- Multi-tensor forms: one launch for all of an optimizer's tensors ----
//
// The host hands a table of `TABLE_WORDS` 64-bit words per tensor: the parameter, gradient, exp_avg and exp_avg_sq
// device pointers, the element count, the tensor's first block of the AdamW launch, and dtype flags (bit 0: the
// parameter is bf16, bit 1: the gradient is bf16; otherwise f32).
#define TABLE_WORDS 7
#define T_PARAM 0
#define T_GRAD 1
#define T_EXP_AVG 2
#define T_EXP_AVG_SQ 3
#define T_N 4
#define T_FIRST_BLOCK 5
#define T_FLAGS 6
#define FLAG_PARAM_BF16 1ull
#define FLAG_GRAD_BF16 2ull

// Elements one block of the multi-tensor AdamW updates.
#define ADAMW_CHUNK 4096

// The three passes above fused, element by element: the same operations in the same order on the same values, so
// the same bits as running them one after the other.
template <typename TP, typename TG>
__device__ void adamw_fused(TP* p, const TG* g, float* m, float* v, long start, long end, float grad_scale,
                            float one_minus_beta1, float beta2, float one_minus_beta2, float decay,
                            float inv_bc2_sqrt, float eps, float step_size) {
    for (long i = start + threadIdx.x; i < end; i += blockDim.x) {
        const float gi = scaled_grad(to_f32(g[i]), grad_scale);
        const float mi = m[i];
        const float m1 = __fadd_rn(mi, __fmul_rn(__fsub_rn(gi, mi), one_minus_beta1));
        const float v1 = __fadd_rn(__fmul_rn(v[i], beta2), __fmul_rn(__fmul_rn(gi, gi), one_minus_beta2));
        m[i] = m1;
        v[i] = v1;
        float pi = to_f32(p[i]);
        if (decay != 1.f) pi = __fmul_rn(pi, decay);
        const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(v1), inv_bc2_sqrt), eps);
        pi = __fsub_rn(pi, __fmul_rn(__fdiv_rn(m1, denom), step_size));
        p[i] = from_f32<TP>(pi);
    }
}

// AdamW over `count` tensors: block b updates elements [c * ADAMW_CHUNK, (c + 1) * ADAMW_CHUNK) of the tensor whose
// first block is the last one at or before b (c = b minus that first block).
extern "C" __global__ void fs_adamw_multi(const unsigned long long* table, int count, float grad_scale,
                                          float one_minus_beta1, float beta2, float one_minus_beta2, float decay,
                                          float inv_bc2_sqrt, float eps, float step_size) {
    const long b = blockIdx.x;
    int lo = 0, hi = count - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if ((long)table[mid * TABLE_WORDS + T_FIRST_BLOCK] <= b) lo = mid;
        else hi = mid - 1;
    }
    const unsigned long long* t = table + (long)lo * TABLE_WORDS;
    const long n = (long)t[T_N];
    const long start = (b - (long)t[T_FIRST_BLOCK]) * ADAMW_CHUNK;
    const long end = min(start + (long)ADAMW_CHUNK, n);
    float* m = reinterpret_cast<float*>(t[T_EXP_AVG]);
    float* v = reinterpret_cast<float*>(t[T_EXP_AVG_SQ]);
    const unsigned long long flags = t[T_FLAGS];
#define FUSED(TP, TG)                                                                                               \
    adamw_fused<TP, TG>(reinterpret_cast<TP*>(t[T_PARAM]), reinterpret_cast<const TG*>(t[T_GRAD]), m, v, start, end, \
                        grad_scale, one_minus_beta1, beta2, one_minus_beta2, decay, inv_bc2_sqrt, eps, step_size)
    switch (flags & (FLAG_PARAM_BF16 | FLAG_GRAD_BF16)) {
        case 0: FUSED(float, float); break;
        case FLAG_GRAD_BF16: FUSED(float, __nv_bfloat16); break;
        case FLAG_PARAM_BF16: FUSED(__nv_bfloat16, float); break;
        default: FUSED(__nv_bfloat16, __nv_bfloat16); break;
    }
#undef FUSED
}

template <typename TG> __device__ __forceinline__ float square(const TG* g, long i) {
    const float x = to_f32(g[i]);
    return __fmul_rn(x, x);
}

// One gradient's f32 sum of squares in the order candle sums `g.to_dtype(f32).sqr().sum_all()` (its usqr_f32, then
// its fast_sum_f32 over a fresh, so 16-byte aligned, buffer: one block of next_pow2(min(1024, n)) threads, each
// summing groups of four, then warp butterflies; fast_sum_small_f32's left-to-right sum for n <= 32), so the norm
// keeps its bits. Launched with 1024 threads: the threads past candle's block size add nothing.
template <typename TG> __device__ void sum_squares(const TG* g, long n, float* out) {
    const unsigned tid = threadIdx.x;
    if (n <= 32) {
        if (tid == 0) {
            float sum = 0.f;
            for (long i = 0; i < n; ++i) sum = __fadd_rn(sum, square(g, i));
            *out = sum;
        }
        return;
    }
    unsigned bd = 1024;
    if (n < 1024) {
        bd = 1;
        while (bd < (unsigned)n) bd <<= 1;
    }
    float local = 0.f;
    if (tid < bd) {
        const long groups = n / 4;
        for (long q = tid; q < groups; q += bd) {
            const float s = __fadd_rn(__fadd_rn(__fadd_rn(square(g, 4 * q), square(g, 4 * q + 1)), square(g, 4 * q + 2)),
                                      square(g, 4 * q + 3));
            local = __fadd_rn(local, s);
        }
        for (long i = groups * 4 + tid; i < n; i += bd) local = __fadd_rn(local, square(g, i));
    }
    for (int o = 16; o > 0; o >>= 1) local = __fadd_rn(local, __shfl_xor_sync(0xffffffffu, local, o));
    __shared__ float warps[32];
    const unsigned warp = tid / 32, lane = tid % 32;
    if (lane == 0) warps[warp] = local;
    __syncthreads();
    if (tid < 32) {
        local = tid < bd / 32 ? warps[tid] : 0.f;
        for (int o = 16; o > 0; o >>= 1) local = __fadd_rn(local, __shfl_xor_sync(0xffffffffu, local, o));
        if (tid == 0) *out = local;
    }
}

// out[i] = the i-th table entry's gradient's sum of squares in f32; one block (of 1024 threads) per tensor.
extern "C" __global__ void fs_sum_squares_multi(const unsigned long long* table, float* out) {
    const unsigned long long* t = table + (long)blockIdx.x * TABLE_WORDS;
    const long n = (long)t[T_N];
    if (t[T_FLAGS] & FLAG_GRAD_BF16) {
        sum_squares(reinterpret_cast<const __nv_bfloat16*>(t[T_GRAD]), n, out + blockIdx.x);
    } else {
        sum_squares(reinterpret_cast<const float*>(t[T_GRAD]), n, out + blockIdx.x);
    }
}
