#include "commit_graphs.h"

#include "backend.h"
#include "device_inputs.h"
#include "errors.h"
#include "qwen35_graph.h"

#include <chrono>
#include <string>

namespace dflash {

std::vector<int32_t> chain_path(int a) {
    std::vector<int32_t> p(a);
    for (int i = 0; i < a; ++i) p[i] = i;
    return p;
}

size_t commit_graph_mem(const Qwen35Model & model) {
    // The recurrent replay and the K/V moves take ~40 tensors (views included) for all layers
    // together; generous, it is metadata only.
    (void)model;
    return ggml_tensor_overhead() * 128 + ggml_graph_overhead_custom(COMMIT_GRAPH_NODES, false);
}

CommitGraph build_commit_graph(ggml_context * ctx, const Qwen35Model & model, const TargetCache & cache, bool tree,
                               int a) {
    CommitGraph c;
    c.gf = ggml_new_graph_custom(ctx, COMMIT_GRAPH_NODES, false);
    // Row lists once per layer slot: one gather takes every layer's rows.
    if (tree && cache.k_all) {
        c.src = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, a, cache.k_all->ne[2]);  // get_rows takes i32 rows,
        c.dst = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, a);                      // set_rows i64
        ggml_set_input(c.src);
        ggml_set_input(c.dst);
        build_qwen35_kv_compact(ctx, c.gf, cache, c.src, c.dst);
    }
    if (cache.vin) {
        c.path = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, a, cache.vin->ne[2]);
        ggml_set_input(c.path);
        build_qwen35_commit_recurrent(ctx, c.gf, model, cache, c.path);
    }
    return c;
}

void set_commit_inputs(const CommitGraph & c, const std::vector<int32_t> & path, const std::vector<int32_t> & src,
                       const std::vector<int64_t> & dst) {
    // each list once per layer slot (the tensor's columns)
    auto set_repeated = [&c](ggml_tensor * t, const auto & v) {
        if (!t || !t->buffer) return;
        std::vector<typename std::decay_t<decltype(v)>::value_type> rows;
        for (int64_t s = 0; s < t->ne[1]; ++s) rows.insert(rows.end(), v.begin(), v.end());
        set_input(c.upload, t, rows.data(), ggml_nbytes(t));
    };
    set_repeated(c.path, path);
    set_repeated(c.src, src);
    set_repeated(c.dst, dst);
}

CommitGraphs::CommitGraphs(const Qwen35Model & model, const TargetCache & cache, ggml_backend_t backend, int n_max)
    : model_(model), cache_(cache), backend_(backend), n_max_(n_max) {
    ggml_gallocr_t galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend));
    // The longest commits of both kinds size the buffer; every node must run on the backend.
    for (Kind kind : {chain, tree}) {
        Graph g;
        build(g, kind, n_max);
        bool ok = true;
        for (int i = 0; i < ggml_graph_n_nodes(g.c.gf) && ok; ++i) {
            ok = ggml_backend_supports_op(backend, ggml_graph_node(g.c.gf, i));
        }
        if (ok) ok = ggml_gallocr_reserve(galloc, g.c.gf);
        ggml_free(g.ctx);
        if (!ok) {
            ggml_gallocr_free(galloc);
            return;  // usable() is false
        }
    }
    galloc_ = galloc;
}

CommitGraphs::~CommitGraphs() {
    for (auto & [key, g] : graphs_) ggml_free(g.ctx);
    if (galloc_) ggml_gallocr_free(galloc_);
}

size_t CommitGraphs::buffer_bytes() const { return galloc_ ? ggml_gallocr_get_buffer_size(galloc_, 0) : 0; }

void CommitGraphs::build(Graph & g, Kind kind, int a) const {
    g.mem.resize(commit_graph_mem(model_));
    ggml_init_params p = {g.mem.size(), g.mem.data(), true};
    g.ctx = ggml_init(p);
    g.c = build_commit_graph(g.ctx, model_, cache_, kind == tree, a);
}

CommitGraphs::Graph & CommitGraphs::get(Kind kind, int a) {
    if (a < 1 || a > n_max_) throw InvalidParameter("commit of " + std::to_string(a) + " tokens");
    auto it = graphs_.find({kind, a});
    if (it != graphs_.end()) return it->second;
    Graph g;
    build(g, kind, a);
    const size_t before = buffer_bytes();
    if (!ggml_gallocr_alloc_graph(galloc_, g.c.gf)) {
        ggml_free(g.ctx);
        throw EngineError("could not allocate a commit graph");
    }
    // the inputs are in the device's memory already (the graph has no scheduler)
    if (device_inputs_enabled()) g.c.upload = backend_;
    // The buffer was reserved for the longest commit; should it have grown anyway, the graphs
    // cached so far point into the old one.
    if (buffer_bytes() != before) {
        for (auto & [key, old] : graphs_) ggml_free(old.ctx);
        graphs_.clear();
    }
    return graphs_.emplace(std::pair{(int)kind, a}, std::move(g)).first->second;
}

ggml_cgraph * CommitGraphs::compute(Graph & g) {
    using namespace std::chrono;
    const auto t0 = steady_clock::now();
    if (ggml_backend_graph_compute(backend_, g.c.gf) != GGML_STATUS_SUCCESS) {
        throw EngineError("the backend failed to compute the commit");
    }
    ComputeTiming & timing = compute_timing();
    timing.sync_ms += duration<double, std::milli>(steady_clock::now() - t0).count();
    timing.graphs++;
    return g.c.gf;
}

ggml_cgraph * CommitGraphs::run_chain(int a) {
    Graph & g = get(chain, a);
    set_commit_inputs(g.c, chain_path(a), {}, {});
    return compute(g);
}

ggml_cgraph * CommitGraphs::run_path(const std::vector<int32_t> & src, const std::vector<int64_t> & dst,
                                     const std::vector<int32_t> & path) {
    const int a = (int)path.size();
    if ((int)src.size() != a || (int)dst.size() != a) throw InvalidParameter("commit path: sizes differ");
    Graph & g = get(tree, a);
    set_commit_inputs(g.c, path, src, dst);
    return compute(g);
}

}  // namespace dflash
