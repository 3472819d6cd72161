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
