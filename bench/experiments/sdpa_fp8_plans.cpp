// Which execution plans cuDNN offers for our fused attention graphs (FP8 as well as bf16; sdpa_plans.cpp, bf16 only, found the heuristics already pick the fastest), and how fast each runs: builds the bf16 and
// FP8 (e4m3fn in and out, Hopper) forward and backward graphs of kernels/cudnn_sdpa.cpp at one shape, asks the
// heuristics (modes A, B and the fallback list) for their engine configurations, builds every one and times it on
// synthetic data (2 runs after a warm-up, CUDA events). Answers whether picking a plan by measurement rather than
// by the heuristics' first choice can make attention faster.
//
// Build (here, with the CUDA toolchain of scripts/cuda-toolchain.sh; the frontend opens libcudnn.so.9 at run time):
//   source ~/.cache/framesmith-cuda/env.sh
//   g++ -O2 -std=c++17 -DNV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING -I "$CUDNN_FRONTEND_INCLUDE" \
//     -I "$CUDNN_ROOT/include" -I "$CUDA_ROOT/include" bench/experiments/sdpa_fp8_plans.cpp \
//     -L "$CUDA_ROOT/lib" -l:libcudart.so.13 -ldl -o devbin/sdpa_fp8_plans
// Run: sdpa_plans [heads] [tokens] [head_dim]   (default 40 32760 128: Wan2.1-14B at 480×832×81)
#include <cuda_runtime.h>
#include <cudnn_frontend.h>

#include <dlfcn.h>

#include <cmath>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace cudnn_frontend {
void *cudnn_dlhandle = nullptr;
}
namespace fe = cudnn_frontend;

enum Uid : int64_t { Q = 1, K, V, O, STATS, DO, DQ, DK, DV, SLOT0 = 100 };
constexpr int SLOTS = 40;

struct Shape {
    int64_t b, h, s, d;
};

std::shared_ptr<fe::graph::Tensor_attributes> bshd(fe::graph::Graph &g, const char *name, int64_t uid,
                                                   const Shape &s) {
    return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim({s.b, s.h, s.s, s.d}).set_stride(
        {s.s * s.h * s.d, s.d, s.h * s.d, 1}));
}

void out_bshd(const std::shared_ptr<fe::graph::Tensor_attributes> &t, int64_t uid, const Shape &s) {
    t->set_output(true).set_uid(uid).set_dim({s.b, s.h, s.s, s.d}).set_stride({s.s * s.h * s.d, s.d, s.h * s.d, 1});
}

std::shared_ptr<fe::graph::Tensor_attributes> slot(fe::graph::Graph &g, const char *name, int i) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(SLOT0 + i)
                        .set_dim({1, 1, 1, 1})
                        .set_stride({1, 1, 1, 1})
                        .set_data_type(fe::DataType_t::FLOAT));
}

void out_slot(const std::shared_ptr<fe::graph::Tensor_attributes> &t, int i) {
    t->set_output(true).set_uid(SLOT0 + i).set_dim({1, 1, 1, 1}).set_stride({1, 1, 1, 1}).set_data_type(
        fe::DataType_t::FLOAT);
}

std::shared_ptr<fe::graph::Tensor_attributes> stats_in(fe::graph::Graph &g, const Shape &s) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name("stats")
                        .set_uid(STATS)
                        .set_dim({s.b, s.h, s.s, 1})
                        .set_stride({s.h * s.s, s.s, 1, 1})
                        .set_data_type(fe::DataType_t::FLOAT));
}

std::shared_ptr<fe::graph::Graph> describe(const Shape &s, bool fp8, bool backward, float scale, int &slots) {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fp8 ? fe::DataType_t::FP8_E4M3 : fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto q = bshd(*g, "Q", Q, s), k = bshd(*g, "K", K, s), v = bshd(*g, "V", V, s);
    int n = 0;
    auto sl = [&](const char *name) { return slot(*g, name, n++); };
    if (!fp8 && !backward) {
        auto [o, st] = g->sdpa(q, k, v, fe::graph::SDPA_attributes().set_generate_stats(true).set_attn_scale(scale));
        out_bshd(o, O, s);
        st->set_output(true).set_uid(STATS).set_data_type(fe::DataType_t::FLOAT);
    } else if (!fp8) {
        auto [dq, dk, dv] = g->sdpa_backward(q, k, v, bshd(*g, "O", O, s), bshd(*g, "dO", DO, s), stats_in(*g, s),
                                             fe::graph::SDPA_backward_attributes().set_attn_scale(scale));
        out_bshd(dq, DQ, s);
        out_bshd(dk, DK, s);
        out_bshd(dv, DV, s);
    } else if (!backward) {
        auto dq = sl("dq"), dk = sl("dk"), dv = sl("dv"), ds = sl("ds"), ss = sl("ss"), so = sl("so");
        auto [o, st, amax_s, amax_o] = g->sdpa_fp8(
            q, k, v, dq, dk, dv, ds, ss, so,
            fe::graph::SDPA_fp8_attributes().set_generate_stats(true).set_attn_scale(scale));
        out_bshd(o, O, s);
        st->set_output(true).set_uid(STATS).set_data_type(fe::DataType_t::FLOAT);
        out_slot(amax_s, n++);
        out_slot(amax_o, n++);
    } else {
        auto o = bshd(*g, "O", O, s), d_o = bshd(*g, "dO", DO, s);
        auto a = sl("dq"), b = sl("dk"), c = sl("dv"), d = sl("do_"), e = sl("ddo"), f = sl("ds"), h = sl("ddp"),
             i = sl("ss"), j = sl("sdq"), k2 = sl("sdk"), l = sl("sdv"), m = sl("sdp");
        auto [dq, dk, dv, a1, a2, a3, a4] =
            g->sdpa_fp8_backward(q, k, v, o, d_o, stats_in(*g, s), a, b, c, d, e, f, h, i, j, k2, l, m,
                                 fe::graph::SDPA_fp8_backward_attributes().set_attn_scale(scale));
        out_bshd(dq, DQ, s);
        out_bshd(dk, DK, s);
        out_bshd(dv, DV, s);
        for (auto &t : {a1, a2, a3, a4}) out_slot(t, n++);
    }
    slots = n;
    return g;
}

int main(int argc, char **argv) {
    const Shape s{1, argc > 1 ? atol(argv[1]) : 40, argc > 2 ? atol(argv[2]) : 32760, argc > 3 ? atol(argv[3]) : 128};
    const float scale = 1.f / std::sqrt(static_cast<float>(s.d));
    setvbuf(stdout, nullptr, _IONBF, 0);
    fe::cudnn_dlhandle = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
    if (!fe::cudnn_dlhandle) {
        std::printf("cannot open libcudnn.so.9: %s\n", dlerror());
        return 1;
    }
    std::printf("cuDNN opened\n");
    cudnnHandle_t handle;
    if (fe::detail::create_handle(&handle) != CUDNN_STATUS_SUCCESS) {
        std::printf("cudnnCreate failed\n");
        return 1;
    }
    const size_t n = s.b * s.h * s.s * s.d;
    std::unordered_map<int64_t, void *> all;
    for (int64_t uid : {Q, K, V, O, DO, DQ, DK, DV}) {
        void *p;
        cudaMalloc(&p, n * 2);
        // bf16 0x3c00 ≈ 0.0078, e4m3 0x3c = 1.5: finite, mild values for either dtype.
        cudaMemset(p, 0x3c, n * 2);
        all[uid] = p;
    }
    void *stats;
    cudaMalloc(&stats, s.b * s.h * s.s * 4);
    cudaMemset(stats, 0, s.b * s.h * s.s * 4);
    all[STATS] = stats;
    float *slots;
    cudaMalloc(&slots, SLOTS * 4);
    std::vector<float> ones(SLOTS, 1.f);
    cudaMemcpy(slots, ones.data(), SLOTS * 4, cudaMemcpyHostToDevice);
    for (int i = 0; i < SLOTS; ++i) all[SLOT0 + i] = slots + i;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    std::printf("buffers ready\n");
    std::printf("shape b=%ld h=%ld s=%ld d=%ld, cuDNN %ld\n", s.b, s.h, s.s, s.d, (long)fe::detail::get_backend_version());
    auto alloc = [](size_t bytes) {
        void *p = nullptr;
        cudaError_t e = cudaMalloc(&p, bytes);
        if (e != cudaSuccess) std::printf("cudaMalloc(%zu): %s\n", bytes, cudaGetErrorString(e));
        return p;
    };
    // Times plan `i` of a built graph (best of 3 after a warm-up).
    auto time_plan = [&](fe::graph::Graph &g, std::unordered_map<int64_t, void *> &pack, int64_t i) {
        std::string name;
        if (g.get_plan_name_at_index(i, name).is_bad()) {
            std::printf("  [%ld] not built\n", (long)i);
            return;
        }
        int64_t ws = 0;
        (void)g.get_workspace_size_plan_at_index(i, ws);
        const int64_t total = std::max<int64_t>(ws, g.get_autotune_workspace_size());
        std::printf("  [%ld] %s, workspace %ld MiB: ", (long)i, name.c_str(), (long)(total >> 20));
        void *work = total > 0 ? alloc(total) : nullptr;
        auto r = g.execute_plan_at_index(handle, pack, work, i);
        cudaDeviceSynchronize();
        if (r.is_bad()) {
            std::printf("fails to run: %s\n", r.get_message().substr(0, 200).c_str());
        } else {
            float best = 1e30f;
            for (int rep = 0; rep < 3; ++rep) {
                cudaEventRecord(e0);
                (void)g.execute_plan_at_index(handle, pack, work, i);
                cudaEventRecord(e1);
                cudaEventSynchronize(e1);
                float ms = 0;
                cudaEventElapsedTime(&ms, e0, e1);
                if (ms < best) best = ms;
            }
            std::printf("%.2f ms\n", best);
        }
        if (work) cudaFree(work);
    };
    for (bool fp8 : {true, false}) {
        for (bool backward : {true, false}) {
            const char *what = fp8 ? (backward ? "fp8 bwd" : "fp8 fwd") : (backward ? "bf16 bwd" : "bf16 fwd");
            int nslots = 0;
            auto fresh = [&]() { return describe(s, fp8, backward, scale, nslots); };
            auto g = fresh();
            std::unordered_map<int64_t, void *> pack{{Q, all[Q]}, {K, all[K]}, {V, all[V]}, {O, all[O]},
                                                     {STATS, all[STATS]}};
            if (backward) {
                for (int64_t uid : {DO, DQ, DK, DV}) pack[uid] = all[uid];
            }
            for (int i = 0; i < nslots; ++i) pack[SLOT0 + i] = all[SLOT0 + i];
            auto st = g->validate();
            if (st.is_good()) st = g->build_operation_graph(handle);
            if (st.is_good()) st = g->create_execution_plans({fe::HeurMode_t::A});
            if (st.is_good()) st = g->check_support(handle);
            if (st.is_good()) st = g->build_plans(fe::BuildPlanPolicy_t::ALL);
            if (st.is_bad()) {
                std::printf("%s: %s\n", what, st.get_message().substr(0, 300).c_str());
                continue;
            }
            const int64_t count = g->get_execution_plan_count();
            std::printf("%s, heuristics mode A: %ld engine configs\n", what, (long)count);
            std::string first;
            for (int64_t i = 0; i < count; ++i) {
                if (first.empty()) (void)g->get_plan_name_at_index(i, first);
                time_plan(*g, pack, i);
            }
            if (!fp8 || first.size() < 4) continue;
            // Every value of each knob of the heuristics' engine, one knob at a time (the others left to cuDNN).
            const int64_t engine = std::atol(first.c_str() + 3);
            std::vector<fe::Knob> knobs;
            if (g->get_knobs_for_engine(engine, knobs).is_bad()) {
                std::printf("  knobs of engine %ld: not available\n", (long)engine);
                continue;
            }
            for (const auto &knob : knobs) {
                std::printf("  engine %ld knob %d: %ld..%ld step %ld\n", (long)engine, (int)knob.type,
                            (long)knob.minValue, (long)knob.maxValue, (long)knob.stride);
                for (int64_t v = knob.minValue; v <= knob.maxValue; v += std::max<int64_t>(knob.stride, 1)) {
                    auto h = fresh();
                    auto hs = h->validate();
                    if (hs.is_good()) hs = h->build_operation_graph(handle);
                    if (hs.is_good()) hs = h->create_execution_plan(engine, {{knob.type, v}});
                    if (hs.is_good()) hs = h->check_support(handle);
                    if (hs.is_good()) hs = h->build_plans(fe::BuildPlanPolicy_t::ALL);
                    if (hs.is_bad()) {
                        std::printf("  value %ld: unsupported\n", (long)v);
                        continue;
                    }
                    std::printf("  value %ld:", (long)v);
                    time_plan(*h, pack, 0);
                }
            }
        }
    }
    return 0;
}
