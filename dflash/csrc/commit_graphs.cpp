#include "commit_graphs.h"

#include "errors.h"
#include "qwen35_graph.h"

#include <string>

namespace dflash {

size_t commit_graph_mem(const Qwen35Model & model) {
    // Per layer: a recurrent layer's replay takes ~25 tensors (views included), an attention
    // layer's row moves 4; generous, it is metadata only.
    const size_t n_tensors = 40 * (size_t)model.hp.n_layer + 64;
    return ggml_tensor_overhead() * n_tensors + ggml_graph_overhead_custom(COMMIT_GRAPH_NODES, false);
}

CommitGraph build_commit_graph(ggml_context * ctx, const Qwen35Model & model, const TargetCache & cache, bool tree,
                               int a) {
    CommitGraph c;
    if (!tree) {
        c.gf = build_qwen35_commit(ctx, model, cache, a);
        return c;
    }
    c.src = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, a);  // get_rows takes i32 rows, set_rows i64
    c.dst = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, a);
    // the path once per GDN layer slot: one gather takes every layer's rows (build_qwen35_commit_tree)
    c.path = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, a, cache.vin ? cache.vin->ne[2] : 1);
    for (ggml_tensor * t : {c.src, c.dst, c.path}) ggml_set_input(t);
    c.gf = build_qwen35_kv_compact(ctx, model, cache, c.src, c.dst);
    if (model.hp.n_recurrent_layers() > 0) build_qwen35_commit_tree(ctx, c.gf, model, cache, c.path);
    return c;
}

void set_commit_path_inputs(const CommitGraph & c, const std::vector<int32_t> & src, const std::vector<int64_t> & dst,
                            const std::vector<int32_t> & path) {
    // A model without attention (recurrent) layers leaves src and dst (path) out of the graph.
    auto set = [](ggml_tensor * t, const void * data, size_t size) {
        if (t->buffer) ggml_backend_tensor_set(t, data, 0, size);
    };
    set(c.src, src.data(), sizeof(int32_t) * src.size());
    set(c.dst, dst.data(), sizeof(int64_t) * dst.size());
    if (c.path->buffer) {
        std::vector<int32_t> rows;
        for (int64_t s = 0; s < c.path->ne[1]; ++s) rows.insert(rows.end(), path.begin(), path.end());
        set(c.path, rows.data(), sizeof(int32_t) * rows.size());
    }
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
    // The buffer was reserved for the longest commit; should it have grown anyway, the graphs
    // cached so far point into the old one.
    if (buffer_bytes() != before) {
        for (auto & [key, old] : graphs_) ggml_free(old.ctx);
        graphs_.clear();
    }
    return graphs_.emplace(std::pair{(int)kind, a}, std::move(g)).first->second;
}

ggml_cgraph * CommitGraphs::compute(Graph & g) {
    if (ggml_backend_graph_compute(backend_, g.c.gf) != GGML_STATUS_SUCCESS) {
        throw EngineError("the backend failed to compute the commit");
    }
    return g.c.gf;
}

ggml_cgraph * CommitGraphs::run_chain(int a) { return compute(get(chain, a)); }

ggml_cgraph * CommitGraphs::run_path(const std::vector<int32_t> & src, const std::vector<int64_t> & dst,
                                     const std::vector<int32_t> & path) {
    const int a = (int)path.size();
    if ((int)src.size() != a || (int)dst.size() != a) throw InvalidParameter("commit path: sizes differ");
    Graph & g = get(tree, a);
    set_commit_path_inputs(g.c, src, dst, path);
    return compute(g);
}

}  // namespace dflash
