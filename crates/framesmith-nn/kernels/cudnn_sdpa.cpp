// A small C ABI over cuDNN's fused scaled-dot-product attention (forward and backward, bf16, through the cuDNN
// frontend's graph API), for Framesmith's Rust code (crates/framesmith-nn/src/cuda/attention.rs).
//
// Layout: q, o, dO, dQ [b, sq, h, d]; k, v, dK, dV [b, skv, h, d], contiguous; stats (log-sum-exp) [b, h, sq]
// f32. Optional per-sample key lengths (padding mask; every query row is computed). Each call names its CUDA
// device (the caller has made its context current): a cuDNN handle belongs to one device, so there is one handle
// per device, made on its first call, and graphs are built once per device and shape and cached. On Linux the frontend is compiled with dynamic loading: libcudnn.so.9 and libcudart are
// opened at run time, so nothing here is linked against them. On Windows (MinGW) the frontend calls cuDNN and the
// CUDA runtime directly, through delay-load import libraries (packaging/windows/cuda.sh): cudnn64_9.dll is
// loaded from beside framesmith.exe by the first call, after init_locked has checked that it can be.
// Built plans can be kept on disk (fs_sdpa_set_cache_dir): a later run deserialises them instead of building them
// again, which for cuDNN's runtime-compiled attention kernels skips their compilation. A plan file that cannot be
// read back is built again and rewritten; a file that cannot be written only costs the next run the build.
// FP8 (fs_sdpa_fp8_*): the same attention with q, k, v (and, backward, o and dO) in e4m3fn, each with a per-tensor
// descale, the softmax probabilities and dP scaled into e4m3fn inside the kernels, and cuDNN's amax outputs; the
// scale and amax tensors are slots of one f32 array on the GPU (fp8_attention.h) that kernels/fp8_attention.cu
// fills. Outputs (O, dQ, dK, dV) are bf16 where cuDNN allows it (Blackwell, cuDNN 9.13+), e4m3fn otherwise.
// No C++ exception leaves this file: every entry point turns one into an error message.
#include <cudnn_frontend.h>
#ifdef _WIN32
#include <windows.h>
#else
#include <dlfcn.h>
#endif

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "fp8_attention.h"

#ifdef NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
namespace cudnn_frontend {
void *cudnn_dlhandle = nullptr;
}
#endif

namespace fe = cudnn_frontend;

namespace {

enum Uid : int64_t { Q = 1, K, V, O, STATS, DO, DQ, DK, DV, SEQ_Q, SEQ_KV, SLOT0 = 100 };

// What a graph computes in: bf16 throughout, or FP8 with e4m3fn or bf16 outputs.
enum Kind : int { BF16 = 0, FP8 = 1, FP8_BF16_OUT = 2 };

std::mutex g_mutex;
std::string g_error;
using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool, float, int>;

// A device's handle and the graphs built with it.
struct PerDevice {
    cudnnHandle_t handle = nullptr;
    std::map<Key, std::shared_ptr<fe::graph::Graph>> graphs;
};
std::map<int, PerDevice> g_devices;

// The folder each device's plans are kept in (none: plans are not kept), and what the disk cache did so far.
std::map<int, std::string> g_cache_dirs;
int64_t g_plans_read = 0, g_plans_built = 0, g_plans_unwritten = 0;

struct Shape {
    int64_t b, h, sq, skv, d;
};

int fail(const std::string &msg) {
    g_error = msg;
    return 1;
}

// The handle of CUDA device `device` (made now, on the current context, the first time), cuDNN loaded first.
int init_locked(int device, PerDevice **out) {
    auto found = g_devices.find(device);
    if (found != g_devices.end()) {
        *out = &found->second;
        return 0;
    }
#ifdef _WIN32
    // The delay-load import would fail hard on a missing DLL; ask first, from the same search path.
    if (!LoadLibraryA("cudnn64_9.dll")) {
        return fail("cannot load cudnn64_9.dll (Windows error " + std::to_string(GetLastError()) +
                    "): reinstall Framesmith's GPU installer, which puts it beside framesmith.exe");
    }
#else
    if (!fe::cudnn_dlhandle) {
        fe::cudnn_dlhandle = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
        if (!fe::cudnn_dlhandle) {
            const char *e = dlerror();
            return fail(std::string("cannot open libcudnn.so.9: ") + (e ? e : "unknown error"));
        }
    }
#endif
    cudnnHandle_t handle = nullptr;
    if (fe::detail::create_handle(&handle) != CUDNN_STATUS_SUCCESS) {
        return fail("cudnnCreate failed on CUDA device " + std::to_string(device));
    }
    PerDevice &dev = g_devices[device];
    dev.handle = handle;
    *out = &dev;
    return 0;
}

// [b, s, h, d] activations seen as cuDNN's [b, h, s, d] through strides.
std::shared_ptr<fe::graph::Tensor_attributes> bshd(fe::graph::Graph &g, const char *name, int64_t uid,
                                                   const Shape &s, int64_t seq) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({s.b, s.h, seq, s.d})
                        .set_stride({seq * s.h * s.d, s.d, s.h * s.d, 1}));
}

void set_bshd_output(const std::shared_ptr<fe::graph::Tensor_attributes> &t, int64_t uid, const Shape &s,
                     int64_t seq) {
    t->set_output(true).set_uid(uid).set_dim({s.b, s.h, seq, s.d}).set_stride({seq * s.h * s.d, s.d, s.h * s.d, 1});
}

std::shared_ptr<fe::graph::Tensor_attributes> seq_lens(fe::graph::Graph &g, const char *name, int64_t uid,
                                                       const Shape &s) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({s.b, 1, 1, 1})
                        .set_stride({1, 1, 1, 1})
                        .set_data_type(fe::DataType_t::INT32));
}

std::shared_ptr<fe::graph::Graph> new_graph(int kind) {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(kind == BF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::FP8_E4M3)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    return g;
}

int build(fe::graph::Graph &g, cudnnHandle_t handle) {
    auto st = g.validate();
    if (st.is_good()) st = g.build_operation_graph(handle);
    if (st.is_good()) st = g.create_execution_plans({fe::HeurMode_t::A});
    if (st.is_good()) st = g.check_support(handle);
    if (st.is_good()) st = g.build_plans(handle);
    if (st.is_bad()) return fail("cuDNN SDPA graph: " + st.get_message());
    return 0;
}

// The plan file of `s` in `dir`: the shape, mask, direction and scale, and the cuDNN and frontend versions that
// built it (a plan from another version is never read).
std::string plan_path(const std::string &dir, const Shape &s, bool padded, bool backward, float scale, int kind) {
    uint32_t scale_bits = 0;
    std::memcpy(&scale_bits, &scale, sizeof scale_bits);
    char name[256];
    const char *tag = kind == FP8 ? "fp8-" : kind == FP8_BF16_OUT ? "fp8b-" : "";
    std::snprintf(name, sizeof name, "sdpa-%s%s-b%lld-h%lld-q%lld-kv%lld-d%lld-%s-s%08x-cudnn%lld-fe%d.plan",
                  tag, backward ? "bwd" : "fwd", static_cast<long long>(s.b), static_cast<long long>(s.h),
                  static_cast<long long>(s.sq), static_cast<long long>(s.skv), static_cast<long long>(s.d),
                  padded ? "pad" : "full", scale_bits, static_cast<long long>(fe::detail::get_backend_version()),
                  CUDNN_FRONTEND_VERSION);
    return dir + "/" + name;
}

// The graph read back from `path`, or null when there is none or it cannot be used.
std::shared_ptr<fe::graph::Graph> read_plan(const std::string &path, cudnnHandle_t handle, int kind) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return nullptr;
    std::vector<uint8_t> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (data.empty()) return nullptr;
    auto g = new_graph(kind);
    try {
        if (g->deserialize(handle, data).is_bad()) return nullptr;
    } catch (const std::exception &) {
        return nullptr;
    }
    return g;
}

// Keeps `g`'s plan at `path` (written beside it, then renamed, so a reader never sees half a file).
void write_plan(const std::string &path, fe::graph::Graph &g) {
    std::vector<uint8_t> data;
    if (g.serialize(data).is_bad() || data.empty()) {
        g_plans_unwritten++;
        return;
    }
    const std::string tmp = path + ".part";
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        out.write(reinterpret_cast<const char *>(data.data()), static_cast<std::streamsize>(data.size()));
        if (!out) {
            g_plans_unwritten++;
            std::remove(tmp.c_str());
            return;
        }
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        std::remove(path.c_str());
        if (std::rename(tmp.c_str(), path.c_str()) != 0) {
            g_plans_unwritten++;
            std::remove(tmp.c_str());
        }
    }
}

// The bf16 graph of `s` (forward: o and stats; backward: dq, dk, dv).
void describe_bf16(fe::graph::Graph &graph, const Shape &s, bool padded, bool backward, float scale) {
    auto *g = &graph;
    auto q = bshd(graph, "Q", Q, s, s.sq);
    auto k = bshd(graph, "K", K, s, s.skv);
    auto v = bshd(graph, "V", V, s, s.skv);
    if (!backward) {
        auto opts = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true).set_attn_scale(scale);
        if (padded) {
            opts.set_padding_mask(true)
                .set_seq_len_q(seq_lens(graph, "seq_q", SEQ_Q, s))
                .set_seq_len_kv(seq_lens(graph, "seq_kv", SEQ_KV, s));
        }
        auto [o, stats] = g->sdpa(q, k, v, opts);
        set_bshd_output(o, O, s, s.sq);
        stats->set_output(true).set_uid(STATS).set_data_type(fe::DataType_t::FLOAT);
    } else {
        auto o = bshd(graph, "O", O, s, s.sq);
        auto d_o = bshd(graph, "dO", DO, s, s.sq);
        auto stats = g->tensor(fe::graph::Tensor_attributes()
                                   .set_name("stats")
                                   .set_uid(STATS)
                                   .set_dim({s.b, s.h, s.sq, 1})
                                   .set_stride({s.h * s.sq, s.sq, 1, 1})
                                   .set_data_type(fe::DataType_t::FLOAT));
        auto opts = fe::graph::SDPA_backward_attributes().set_name("sdpa_backward").set_attn_scale(scale);
        if (padded) {
            opts.set_padding_mask(true)
                .set_seq_len_q(seq_lens(graph, "seq_q", SEQ_Q, s))
                .set_seq_len_kv(seq_lens(graph, "seq_kv", SEQ_KV, s));
        }
        auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, d_o, stats, opts);
        set_bshd_output(dq, DQ, s, s.sq);
        set_bshd_output(dk, DK, s, s.skv);
        set_bshd_output(dv, DV, s, s.skv);
    }
}

// A per-call scale or amax tensor: slot `slot` of the f32 array of fp8_attention.h.
std::shared_ptr<fe::graph::Tensor_attributes> slot(fe::graph::Graph &g, const char *name, int slot) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(SLOT0 + slot)
                        .set_dim({1, 1, 1, 1})
                        .set_stride({1, 1, 1, 1})
                        .set_data_type(fe::DataType_t::FLOAT));
}

void set_slot_output(const std::shared_ptr<fe::graph::Tensor_attributes> &t, int slot) {
    t->set_output(true).set_uid(SLOT0 + slot).set_dim({1, 1, 1, 1}).set_stride({1, 1, 1, 1}).set_data_type(
        fe::DataType_t::FLOAT);
}

// The FP8 forward of `s`: e4m3fn q, k, v in, o (e4m3fn, or bf16 with `bf16_out`) and stats out, with S's and O's
// amaxes.
void describe_fp8_forward(fe::graph::Graph &g, const Shape &s, bool padded, float scale, bool bf16_out) {
    auto q = bshd(g, "Q", Q, s, s.sq);
    auto k = bshd(g, "K", K, s, s.skv);
    auto v = bshd(g, "V", V, s, s.skv);
    auto opts = fe::graph::SDPA_fp8_attributes().set_name("sdpa_fp8").set_generate_stats(true).set_attn_scale(scale);
    if (padded) {
        opts.set_padding_mask(true)
            .set_seq_len_q(seq_lens(g, "seq_q", SEQ_Q, s))
            .set_seq_len_kv(seq_lens(g, "seq_kv", SEQ_KV, s));
    }
    auto [o, stats, amax_s, amax_o] =
        g.sdpa_fp8(q, k, v, slot(g, "descale_q", FS_DESCALE_Q), slot(g, "descale_k", FS_DESCALE_K),
                   slot(g, "descale_v", FS_DESCALE_V), slot(g, "descale_s", FS_DESCALE_S),
                   slot(g, "scale_s", FS_SCALE_S), slot(g, "scale_o", FS_SCALE_O), opts);
    set_bshd_output(o, O, s, s.sq);
    if (bf16_out) o->set_data_type(fe::DataType_t::BFLOAT16);
    stats->set_output(true).set_uid(STATS).set_data_type(fe::DataType_t::FLOAT);
    set_slot_output(amax_s, FS_AMAX_OUT_S);
    set_slot_output(amax_o, FS_AMAX_OUT_O);
}

// The FP8 backward of `s`: e4m3fn q, k, v, o, dO and the forward's stats in; dq, dk, dv (e4m3fn, or bf16 with
// `bf16_out`) out, with the amaxes of dQ, dK, dV and dP.
void describe_fp8_backward(fe::graph::Graph &g, const Shape &s, bool padded, float scale, bool bf16_out) {
    auto q = bshd(g, "Q", Q, s, s.sq);
    auto k = bshd(g, "K", K, s, s.skv);
    auto v = bshd(g, "V", V, s, s.skv);
    auto o = bshd(g, "O", O, s, s.sq);
    auto d_o = bshd(g, "dO", DO, s, s.sq);
    auto stats = g.tensor(fe::graph::Tensor_attributes()
                              .set_name("stats")
                              .set_uid(STATS)
                              .set_dim({s.b, s.h, s.sq, 1})
                              .set_stride({s.h * s.sq, s.sq, 1, 1})
                              .set_data_type(fe::DataType_t::FLOAT));
    auto opts = fe::graph::SDPA_fp8_backward_attributes().set_name("sdpa_fp8_backward").set_attn_scale(scale);
    if (padded) {
        opts.set_padding_mask(true)
            .set_seq_len_q(seq_lens(g, "seq_q", SEQ_Q, s))
            .set_seq_len_kv(seq_lens(g, "seq_kv", SEQ_KV, s));
    }
    auto [dq, dk, dv, amax_dq, amax_dk, amax_dv, amax_dp] = g.sdpa_fp8_backward(
        q, k, v, o, d_o, stats, slot(g, "descale_q", FS_DESCALE_Q), slot(g, "descale_k", FS_DESCALE_K),
        slot(g, "descale_v", FS_DESCALE_V), slot(g, "descale_o", FS_DESCALE_O), slot(g, "descale_do", FS_DESCALE_DO),
        slot(g, "descale_s", FS_DESCALE_S), slot(g, "descale_dp", FS_DESCALE_DP), slot(g, "scale_s", FS_SCALE_S),
        slot(g, "scale_dq", FS_SCALE_DQ), slot(g, "scale_dk", FS_SCALE_DK), slot(g, "scale_dv", FS_SCALE_DV),
        slot(g, "scale_dp", FS_SCALE_DP), opts);
    set_bshd_output(dq, DQ, s, s.sq);
    set_bshd_output(dk, DK, s, s.skv);
    set_bshd_output(dv, DV, s, s.skv);
    if (bf16_out) {
        for (auto &t : {dq, dk, dv}) t->set_data_type(fe::DataType_t::BFLOAT16);
    }
    set_slot_output(amax_dq, FS_AMAX_OUT_DQ);
    set_slot_output(amax_dk, FS_AMAX_OUT_DK);
    set_slot_output(amax_dv, FS_AMAX_OUT_DV);
    set_slot_output(amax_dp, FS_AMAX_OUT_DP);
}

int graph_for(int device, PerDevice &dev, const Shape &s, bool padded, bool backward, float scale, int kind,
              std::shared_ptr<fe::graph::Graph> *out) {
    const Key key{s.b, s.h, s.sq, s.skv, s.d, padded, backward, scale, kind};
    auto it = dev.graphs.find(key);
    if (it != dev.graphs.end()) {
        *out = it->second;
        return 0;
    }
    auto dir = g_cache_dirs.find(device);
    std::string path;
    if (dir != g_cache_dirs.end()) {
        path = plan_path(dir->second, s, padded, backward, scale, kind);
        if (auto kept = read_plan(path, dev.handle, kind)) {
            g_plans_read++;
            dev.graphs.emplace(key, kept);
            *out = kept;
            return 0;
        }
    }
    auto g = new_graph(kind);
    if (kind == BF16) {
        describe_bf16(*g, s, padded, backward, scale);
    } else if (backward) {
        describe_fp8_backward(*g, s, padded, scale, kind == FP8_BF16_OUT);
    } else {
        describe_fp8_forward(*g, s, padded, scale, kind == FP8_BF16_OUT);
    }
    if (build(*g, dev.handle)) return 1;
    g_plans_built++;
    if (!path.empty()) write_plan(path, *g);
    dev.graphs.emplace(key, g);
    *out = g;
    return 0;
}

// The graph for `s` on `device`, and the device's handle.
int prepare(int device, const Shape &s, bool padded, bool backward, float scale, int kind,
            std::shared_ptr<fe::graph::Graph> *g, cudnnHandle_t *handle) {
    PerDevice *dev = nullptr;
    if (init_locked(device, &dev)) return 1;
    *handle = dev->handle;
    return graph_for(device, *dev, s, padded, backward, scale, kind, g);
}

// Runs `body` under the lock; a C++ exception (the frontend throws on a missing symbol or library) becomes
// the error message and a failed return, never an exception unwinding into Rust.
template <typename F>
int guarded(F body) {
    std::lock_guard<std::mutex> lock(g_mutex);
    try {
        return body();
    } catch (const std::exception &e) {
        return fail(std::string("cuDNN attention: ") + e.what());
    } catch (...) {
        return fail("cuDNN attention: unknown C++ exception");
    }
}

// Adds slots `which` of the f32 array `slots` to a variant pack.
void add_slots(std::unordered_map<int64_t, void *> &pack, void *slots, std::initializer_list<int> which) {
    for (int i : which) pack[SLOT0 + i] = static_cast<float *>(slots) + i;
}

}  // namespace

extern "C" {

/// The last error message (valid until the next call).
const char *fs_sdpa_last_error() { return g_error.c_str(); }

/// Keeps the plans built for CUDA device `device` in the existing folder `dir` and reads them back from it (an
/// empty `dir`: plans of that device are no longer kept).
int fs_sdpa_set_cache_dir(int device, const char *dir) {
    return guarded([&] {
        if (dir == nullptr || *dir == 0) {
            g_cache_dirs.erase(device);
        } else {
            g_cache_dirs[device] = dir;
        }
        return 0;
    });
}

/// How many plans were read from the disk cache, built, and built but not kept, since the process started.
int fs_sdpa_cache_counts(int64_t *read, int64_t *built, int64_t *unwritten) {
    return guarded([&] {
        *read = g_plans_read;
        *built = g_plans_built;
        *unwritten = g_plans_unwritten;
        return 0;
    });
}

/// Workspace bytes the forward (backward = 0) or backward graph needs on CUDA device `device` (whose context is
/// current); builds and caches the graph.
int fs_sdpa_workspace(int device, int64_t b, int64_t h, int64_t sq, int64_t skv, int64_t d, int padded,
                      int backward, float scale, int64_t *bytes) {
    return guarded([&] {
        std::shared_ptr<fe::graph::Graph> g;
        cudnnHandle_t handle = nullptr;
        if (prepare(device, {b, h, sq, skv, d}, padded != 0, backward != 0, scale, BF16, &g, &handle)) return 1;
        auto st = g->get_workspace_size(*bytes);
        if (st.is_bad()) return fail("cuDNN workspace size: " + st.get_message());
        return 0;
    });
}

/// Forward: o = softmax(q kᵀ · scale) v, stats = log-sum-exp per query row. `seq_q` / `seq_kv` (int32 [b]) are
/// read only when `padded`. `stream` is on CUDA device `device`, whose context is current.
int fs_sdpa_forward(int device, int64_t b, int64_t h, int64_t sq, int64_t skv, int64_t d, int padded, float scale,
                    void *stream, const void *q, const void *k, const void *v, void *o, void *stats,
                    const void *seq_q, const void *seq_kv, void *workspace) {
    return guarded([&] {
        std::shared_ptr<fe::graph::Graph> g;
        cudnnHandle_t handle = nullptr;
        if (prepare(device, {b, h, sq, skv, d}, padded != 0, false, scale, BF16, &g, &handle)) return 1;
        if (fe::detail::set_stream(handle, static_cast<cudaStream_t>(stream)) != CUDNN_STATUS_SUCCESS)
            return fail("cudnnSetStream failed");
        std::unordered_map<int64_t, void *> pack{{Q, const_cast<void *>(q)}, {K, const_cast<void *>(k)},
                                                 {V, const_cast<void *>(v)}, {O, o}, {STATS, stats}};
        if (padded) {
            pack[SEQ_Q] = const_cast<void *>(seq_q);
            pack[SEQ_KV] = const_cast<void *>(seq_kv);
        }
        auto st = g->execute(handle, pack, workspace);
        if (st.is_bad()) return fail("cuDNN SDPA forward: " + st.get_message());
        return 0;
    });
}

/// Backward: dq, dk, dv from q, k, v, o, d_o and the forward's stats, on CUDA device `device` as the forward.
int fs_sdpa_backward(int device, int64_t b, int64_t h, int64_t sq, int64_t skv, int64_t d, int padded, float scale,
                     void *stream, const void *q, const void *k, const void *v, const void *o, const void *d_o,
                     const void *stats, void *dq, void *dk, void *dv, const void *seq_q, const void *seq_kv,
                     void *workspace) {
    return guarded([&] {
        std::shared_ptr<fe::graph::Graph> g;
        cudnnHandle_t handle = nullptr;
        if (prepare(device, {b, h, sq, skv, d}, padded != 0, true, scale, BF16, &g, &handle)) return 1;
        if (fe::detail::set_stream(handle, static_cast<cudaStream_t>(stream)) != CUDNN_STATUS_SUCCESS)
            return fail("cudnnSetStream failed");
        std::unordered_map<int64_t, void *> pack{
            {Q, const_cast<void *>(q)}, {K, const_cast<void *>(k)},    {V, const_cast<void *>(v)},
            {O, const_cast<void *>(o)}, {DO, const_cast<void *>(d_o)}, {STATS, const_cast<void *>(stats)},
            {DQ, dq},                   {DK, dk},                      {DV, dv}};
        if (padded) {
            pack[SEQ_Q] = const_cast<void *>(seq_q);
            pack[SEQ_KV] = const_cast<void *>(seq_kv);
        }
        auto st = g->execute(handle, pack, workspace);
        if (st.is_bad()) return fail("cuDNN SDPA backward: " + st.get_message());
        return 0;
    });
}

/// Workspace bytes of the FP8 forward (backward = 0) or backward graph on CUDA device `device` (whose context is
/// current), with bf16 outputs when `bf16_out`; builds and caches the graph, so this is also the check that cuDNN
/// can run it there.
int fs_sdpa_fp8_workspace(int device, int64_t b, int64_t h, int64_t sq, int64_t skv, int64_t d, int padded,
                          int backward, int bf16_out, float scale, int64_t *bytes) {
    return guarded([&] {
        std::shared_ptr<fe::graph::Graph> g;
        cudnnHandle_t handle = nullptr;
        const int kind = bf16_out ? FP8_BF16_OUT : FP8;
        if (prepare(device, {b, h, sq, skv, d}, padded != 0, backward != 0, scale, kind, &g, &handle)) return 1;
        auto st = g->get_workspace_size(*bytes);
        if (st.is_bad()) return fail("cuDNN workspace size: " + st.get_message());
        return 0;
    });
}

/// FP8 forward: o (e4m3fn, or bf16 with `bf16_out`) and stats from e4m3fn q, k, v, with the scales in `slots`
/// (fp8_attention.h) and the amaxes of S and O written there.
int fs_sdpa_fp8_forward(int device, int64_t b, int64_t h, int64_t sq, int64_t skv, int64_t d, int padded,
                        int bf16_out, float scale, void *stream, const void *q, const void *k, const void *v,
                        void *o, void *stats, void *slots, const void *seq_q, const void *seq_kv, void *workspace) {
    return guarded([&] {
        std::shared_ptr<fe::graph::Graph> g;
        cudnnHandle_t handle = nullptr;
        const int kind = bf16_out ? FP8_BF16_OUT : FP8;
        if (prepare(device, {b, h, sq, skv, d}, padded != 0, false, scale, kind, &g, &handle)) return 1;
        if (fe::detail::set_stream(handle, static_cast<cudaStream_t>(stream)) != CUDNN_STATUS_SUCCESS)
            return fail("cudnnSetStream failed");
        std::unordered_map<int64_t, void *> pack{{Q, const_cast<void *>(q)}, {K, const_cast<void *>(k)},
                                                 {V, const_cast<void *>(v)}, {O, o}, {STATS, stats}};
        add_slots(pack, slots,
                  {FS_DESCALE_Q, FS_DESCALE_K, FS_DESCALE_V, FS_DESCALE_S, FS_SCALE_S, FS_SCALE_O, FS_AMAX_OUT_S,
                   FS_AMAX_OUT_O});
        if (padded) {
            pack[SEQ_Q] = const_cast<void *>(seq_q);
            pack[SEQ_KV] = const_cast<void *>(seq_kv);
        }
        auto st = g->execute(handle, pack, workspace);
        if (st.is_bad()) return fail("cuDNN FP8 SDPA forward: " + st.get_message());
        return 0;
    });
}

/// FP8 backward: dq, dk, dv (e4m3fn, or bf16 with `bf16_out`) from e4m3fn q, k, v, o, d_o and the forward's
/// stats, with the scales in `slots` and the amaxes of dQ, dK, dV and dP written there.
int fs_sdpa_fp8_backward(int device, int64_t b, int64_t h, int64_t sq, int64_t skv, int64_t d, int padded,
                         int bf16_out, float scale, void *stream, const void *q, const void *k, const void *v,
                         const void *o, const void *d_o, const void *stats, void *dq, void *dk, void *dv, void *slots,
                         const void *seq_q, const void *seq_kv, void *workspace) {
    return guarded([&] {
        std::shared_ptr<fe::graph::Graph> g;
        cudnnHandle_t handle = nullptr;
        const int kind = bf16_out ? FP8_BF16_OUT : FP8;
        if (prepare(device, {b, h, sq, skv, d}, padded != 0, true, scale, kind, &g, &handle)) return 1;
        if (fe::detail::set_stream(handle, static_cast<cudaStream_t>(stream)) != CUDNN_STATUS_SUCCESS)
            return fail("cudnnSetStream failed");
        std::unordered_map<int64_t, void *> pack{
            {Q, const_cast<void *>(q)}, {K, const_cast<void *>(k)},    {V, const_cast<void *>(v)},
            {O, const_cast<void *>(o)}, {DO, const_cast<void *>(d_o)}, {STATS, const_cast<void *>(stats)},
            {DQ, dq},                   {DK, dk},                      {DV, dv}};
        add_slots(pack, slots,
                  {FS_DESCALE_Q, FS_DESCALE_K, FS_DESCALE_V, FS_DESCALE_O, FS_DESCALE_DO, FS_DESCALE_S,
                   FS_DESCALE_DP, FS_SCALE_S, FS_SCALE_DQ, FS_SCALE_DK, FS_SCALE_DV, FS_SCALE_DP, FS_AMAX_OUT_DQ,
                   FS_AMAX_OUT_DK, FS_AMAX_OUT_DV, FS_AMAX_OUT_DP});
        if (padded) {
            pack[SEQ_Q] = const_cast<void *>(seq_q);
            pack[SEQ_KV] = const_cast<void *>(seq_kv);
        }
        auto st = g->execute(handle, pack, workspace);
        if (st.is_bad()) return fail("cuDNN FP8 SDPA backward: " + st.get_message());
        return 0;
    });
}

}  // extern "C"
