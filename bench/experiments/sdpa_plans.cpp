// Experiment (not part of the product): every execution plan cuDNN offers for the SDPA forward and backward graphs
// Framesmith builds (crates/framesmith-nn/kernels/cudnn_sdpa.cpp: bf16 [b, s, h, d], f32 stats, no mask), each
// timed alone with CUDA events, so a heuristic's first choice can be compared with the others.
//
// Build (here, with the toolchain of scripts/cuda-toolchain.sh --cudnn; CUDA_ROOT, CUDNN_ROOT and
// CUDNN_FRONTEND_INCLUDE as its --print-env sets them):
//   g++ -O2 -std=c++17 -DNV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING -I$CUDNN_FRONTEND_INCLUDE -I$CUDNN_ROOT/include \
//       -I$CUDA_ROOT/include bench/experiments/sdpa_plans.cpp -o sdpa_plans -ldl
// Run (libcudnn.so.9 and libcudart.so on the loader's path): sdpa_plans B H SQ SKV D [iters] [deterministic]
#include <cudnn_frontend.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace cudnn_frontend {
void *cudnn_dlhandle = nullptr;
}
namespace fe = cudnn_frontend;

enum Uid : int64_t { Q = 1, K, V, O, STATS, DO, DQ, DK, DV };

#define CHECK(x)                                                                       \
    do {                                                                               \
        auto st_ = (x);                                                                \
        if (st_.is_bad()) {                                                            \
            std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, st_.get_message().c_str()); \
            std::exit(1);                                                              \
        }                                                                              \
    } while (0)

struct Shape {
    int64_t b, h, sq, skv, d;
};

static std::shared_ptr<fe::graph::Tensor_attributes> bshd(fe::graph::Graph &g, const char *name, int64_t uid,
                                                          const Shape &s, int64_t seq) {
    return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim({s.b, s.h, seq, s.d}).set_stride(
        {seq * s.h * s.d, s.d, s.h * s.d, 1}));
}

static void out(const std::shared_ptr<fe::graph::Tensor_attributes> &t, int64_t uid, const Shape &s, int64_t seq) {
    t->set_output(true).set_uid(uid).set_dim({s.b, s.h, seq, s.d}).set_stride({seq * s.h * s.d, s.d, s.h * s.d, 1});
}

typedef int (*MallocFn)(void **, size_t);
typedef int (*EventCreateFn)(void **);
typedef int (*EventRecordFn)(void *, void *);
typedef int (*EventSyncFn)(void *);
typedef int (*ElapsedFn)(float *, void *, void *);
typedef int (*MemsetFn)(void *, int, size_t);

int main(int argc, char **argv) {
    if (argc < 6) {
        std::fprintf(stderr, "usage: sdpa_plans B H SQ SKV D [iters]\n");
        return 2;
    }
    Shape s{atoll(argv[1]), atoll(argv[2]), atoll(argv[3]), atoll(argv[4]), atoll(argv[5])};
    int iters = argc > 6 ? atoi(argv[6]) : 5;
    bool deterministic = argc > 7 && atoi(argv[7]) != 0;
    fe::cudnn_dlhandle = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
    void *rt = dlopen("libcudart.so.13", RTLD_NOW | RTLD_GLOBAL);
    if (!fe::cudnn_dlhandle || !rt) {
        std::fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    auto cmalloc = (MallocFn)dlsym(rt, "cudaMalloc");
    auto cmemset = (MemsetFn)dlsym(rt, "cudaMemset");
    auto ecreate = (EventCreateFn)dlsym(rt, "cudaEventCreate");
    auto erecord = (EventRecordFn)dlsym(rt, "cudaEventRecord");
    auto esync = (EventSyncFn)dlsym(rt, "cudaEventSynchronize");
    auto elapsed = (ElapsedFn)dlsym(rt, "cudaEventElapsedTime");
    cudnnHandle_t handle;
    if (fe::detail::create_handle(&handle) != CUDNN_STATUS_SUCCESS) return 1;
    size_t qn = s.b * s.sq * s.h * s.d, kn = s.b * s.skv * s.h * s.d;
    void *q, *k, *v, *o, *stats, *dO, *dq, *dk, *dv;
    cmalloc(&q, qn * 2), cmalloc(&k, kn * 2), cmalloc(&v, kn * 2), cmalloc(&o, qn * 2), cmalloc(&dO, qn * 2);
    cmalloc(&dq, qn * 2), cmalloc(&dk, kn * 2), cmalloc(&dv, kn * 2), cmalloc(&stats, s.b * s.h * s.sq * 4);
    // Small values (0x2f2f ≈ 1.6e-10 bf16 pairs are too small: 0x3c00 ≈ 0.0078): a finite, even attention.
    for (void *p : {q, k, v, dO}) cmemset(p, 0x3c, (p == k || p == v) ? kn * 2 : qn * 2);
    void *start, *stop;
    ecreate(&start), ecreate(&stop);
    float scale = 1.0f / std::sqrt((float)s.d);
    for (int backward = 0; backward < 2; ++backward) {
        auto g = std::make_shared<fe::graph::Graph>();
        g->set_io_data_type(fe::DataType_t::BFLOAT16)
            .set_intermediate_data_type(fe::DataType_t::FLOAT)
            .set_compute_data_type(fe::DataType_t::FLOAT);
        auto tq = bshd(*g, "Q", Q, s, s.sq), tk = bshd(*g, "K", K, s, s.skv), tv = bshd(*g, "V", V, s, s.skv);
        if (!backward) {
            auto [to, ts] = g->sdpa(tq, tk, tv, fe::graph::SDPA_attributes().set_generate_stats(true).set_attn_scale(scale));
            out(to, O, s, s.sq);
            ts->set_output(true).set_uid(STATS).set_data_type(fe::DataType_t::FLOAT);
        } else {
            auto to = bshd(*g, "O", O, s, s.sq), tdo = bshd(*g, "dO", DO, s, s.sq);
            auto ts = g->tensor(fe::graph::Tensor_attributes().set_name("stats").set_uid(STATS).set_dim({s.b, s.h, s.sq, 1}).set_stride(
                {s.h * s.sq, s.sq, 1, 1}).set_data_type(fe::DataType_t::FLOAT));
            auto [tdq, tdk, tdv] =
                g->sdpa_backward(tq, tk, tv, to, tdo, ts,
                                 fe::graph::SDPA_backward_attributes().set_attn_scale(scale).set_deterministic_algorithm(
                                     deterministic));
            out(tdq, DQ, s, s.sq), out(tdk, DK, s, s.skv), out(tdv, DV, s, s.skv);
        }
        CHECK(g->validate());
        CHECK(g->build_operation_graph(handle));
        CHECK(g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}));
        CHECK(g->check_support(handle));
        CHECK(g->build_plans(fe::BuildPlanPolicy_t::ALL));
        int64_t n = g->get_execution_plan_count();
        std::string chosen;
        (void)g->get_plan_name(chosen);
        std::printf("%s%s b=%ld h=%ld sq=%ld skv=%ld d=%ld: %ld plans (heuristic's first: %s)\n",
                    backward ? "backward" : "forward", backward && deterministic ? " (deterministic)" : "", s.b, s.h, s.sq, s.skv, s.d, n, chosen.c_str());
        std::unordered_map<int64_t, void *> pack{{Q, q}, {K, k}, {V, v}, {O, o}, {STATS, stats}};
        if (backward) pack.insert({{DO, dO}, {DQ, dq}, {DK, dk}, {DV, dv}});
        for (int64_t i = 0; i < n; ++i) {
            std::string name;
            if (g->get_plan_name_at_index(i, name).is_bad()) {
                std::printf("  plan %ld: not built\n", i);
                continue;
            }
            int64_t ws = 0;
            (void)g->get_workspace_size_plan_at_index(i, ws);
            void *w = nullptr;
            if (ws) cmalloc(&w, ws);
            std::vector<float> t;
            bool ok = true;
            for (int it = 0; it <= iters && ok; ++it) {
                erecord(start, nullptr);
                ok = g->execute_plan_at_index(handle, pack, w, i).is_good();
                erecord(stop, nullptr);
                esync(stop);
                float ms = 0;
                elapsed(&ms, start, stop);
                if (it) t.push_back(ms);
            }
            if (!ok) {
                std::printf("  plan %ld %s: execution failed\n", i, name.c_str());
                continue;
            }
            std::sort(t.begin(), t.end());
            std::printf("  plan %ld %-90s ws %8ld B  median %8.3f ms  min %8.3f ms\n", i, name.c_str(), ws, t[t.size() / 2],
                        t[0]);
        }
        // The forward's outputs feed the backward.
    }
    return 0;
}
