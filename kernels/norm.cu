// RMSNorm and LayerNorm over the last dimension, forward and backward. One thread block per row; statistics in
// f32. As in the official Wan code, the normalised value is rounded to the activation dtype before the weight
// multiplies it (RMSNorm), while LayerNorm applies its affine parameters in f32.
#include "common.cuh"

// ---- RMSNorm ----

template <typename T>
__device__ float row_rstd_rms(const T* x, long cols, float eps, float* scratch) {
    float ss = 0.f;
    for (long c = threadIdx.x; c < cols; c += blockDim.x) {
        const float v = to_f32(x[c]);
        ss += v * v;
    }
    ss = block_sum(ss, scratch);
    return rsqrtf(ss / (float)cols + eps);
}

template <typename T>
__device__ void rms_fwd(const T* x, const T* w, T* y, long cols, float eps) {
    __shared__ float scratch[32];
    const long row = blockIdx.x;
    x += row * cols;
    y += row * cols;
    const float rstd = row_rstd_rms(x, cols, eps, scratch);
    for (long c = threadIdx.x; c < cols; c += blockDim.x) {
        float n = round_through<T>(to_f32(x[c]) * rstd);
        if (w) n *= to_f32(w[c]);
        y[c] = from_f32<T>(n);
    }
}

// dx = rstd * (g - xhat * mean(g * xhat)), g = dy * w. Statistics are recomputed rather than saved: a row
// re-read is cheaper than keeping per-row statistics alive across the checkpointed block's graph.
template <typename T>
__device__ void rms_bwd(const T* x, const T* w, const T* dy, T* dx, long cols, float eps) {
    __shared__ float scratch[32];
    const long row = blockIdx.x;
    x += row * cols;
    dy += row * cols;
    dx += row * cols;
    const float rstd = row_rstd_rms(x, cols, eps, scratch);
    float dot = 0.f;
    for (long c = threadIdx.x; c < cols; c += blockDim.x) {
        const float g = to_f32(dy[c]) * (w ? to_f32(w[c]) : 1.f);
        dot += g * to_f32(x[c]) * rstd;
    }
    const float mean_dot = block_sum(dot, scratch) / (float)cols;
    for (long c = threadIdx.x; c < cols; c += blockDim.x) {
        const float g = to_f32(dy[c]) * (w ? to_f32(w[c]) : 1.f);
        const float xhat = to_f32(x[c]) * rstd;
        dx[c] = from_f32<T>(rstd * (g - xhat * mean_dot));
    }
}

// ---- LayerNorm ----

template <typename T>
__device__ void row_stats_ln(const T* x, long cols, float eps, float* scratch, float* mean, float* rstd) {
    float s = 0.f;
    for (long c = threadIdx.x; c < cols; c += blockDim.x) s += to_f32(x[c]);
    const float m = block_sum(s, scratch) / (float)cols;
    float v = 0.f;
    for (long c = threadIdx.x; c < cols; c += blockDim.x) {
        const float d = to_f32(x[c]) - m;
        v += d * d;
    }
    const float var = block_sum(v, scratch) / (float)cols;
    *mean = m;
    *rstd = rsqrtf(var + eps);
}

template <typename T>
__device__ void ln_fwd(const T* x, const T* w, const T* b, T* y, long cols, float eps) {
    __shared__ float scratch[32];
    const long row = blockIdx.x;
    x += row * cols;
    y += row * cols;
    float mean, rstd;
    row_stats_ln(x, cols, eps, scratch, &mean, &rstd);
    for (long c = threadIdx.x; c < cols; c += blockDim.x) {
        float n = (to_f32(x[c]) - mean) * rstd;
        if (w) n *= to_f32(w[c]);
        if (b) n += to_f32(b[c]);
        y[c] = from_f32<T>(n);
    }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w.
template <typename T>
__device__ void ln_bwd(const T* x, const T* w, const T* dy, T* dx, long cols, float eps) {
    __shared__ float scratch[32];
    const long row = blockIdx.x;
    x += row * cols;
    dy += row * cols;
    dx += row * cols;
    float mean, rstd;
    row_stats_ln(x, cols, eps, scratch, &mean, &rstd);
    float sg = 0.f, sgx = 0.f;
    for (long c = threadIdx.x; c < cols; c += blockDim.x) {
        const float g = to_f32(dy[c]) * (w ? to_f32(w[c]) : 1.f);
        sg += g;
        sgx += g * (to_f32(x[c]) - mean) * rstd;
    }
    const float mean_g = block_sum(sg, scratch) / (float)cols;
    const float mean_gx = block_sum(sgx, scratch) / (float)cols;
    for (long c = threadIdx.x; c < cols; c += blockDim.x) {
        const float g = to_f32(dy[c]) * (w ? to_f32(w[c]) : 1.f);
        const float xhat = (to_f32(x[c]) - mean) * rstd;
        dx[c] = from_f32<T>(rstd * (g - mean_g - xhat * mean_gx));
    }
}

#define NORM_KERNELS(T, S)                                                                                      \
    extern "C" __global__ void fs_rms_fwd_##S(const T* x, const T* w, T* y, long cols, float eps) {             \
        rms_fwd<T>(x, w, y, cols, eps);                                                                         \
    }                                                                                                           \
    extern "C" __global__ void fs_rms_bwd_##S(const T* x, const T* w, const T* dy, T* dx, long cols,            \
                                              float eps) {                                                      \
        rms_bwd<T>(x, w, dy, dx, cols, eps);                                                              \
    }                                                                                                           \
    extern "C" __global__ void fs_ln_fwd_##S(const T* x, const T* w, const T* b, T* y, long cols, float eps) {  \
        ln_fwd<T>(x, w, b, y, cols, eps);                                                                       \
    }                                                                                                           \
    extern "C" __global__ void fs_ln_bwd_##S(const T* x, const T* w, const T* dy, T* dx, long cols, float eps) { \
        ln_bwd<T>(x, w, dy, dx, cols, eps);                                                                     \
    }

NORM_KERNELS(float, f32)
NORM_KERNELS(__nv_bfloat16, bf16)
