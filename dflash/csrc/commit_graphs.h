// The commits of a speculative step, as graphs cached by shape.
//
// A commit (recurrent state replayed along the accepted tokens, attention rows moved into
// place) is one of few shapes: chain or tree path, times the accepted length. Each shape's graph
// is built and allocated once, in one compute buffer shared by all of them (planned at load
// for the longest commit; commits run one at a time, so their intermediates may overlap); a
// commit then only sets its few inputs and computes. No graph build or allocation per step, and
// on CUDA ggml sees the same graph object again and replays it as a CUDA graph. Commit graphs
// touch only the target cache (on the main device), so they run on the main backend alone.
#pragma once

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "qwen35_model.h"
#include "target_cache.h"

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace dflash {

// The commit of `a` accepted tokens as a graph in ctx, for every layer at once. Inputs: the
// accepted tokens' verify indices `path` (i32 [a, GDN layers]: the first a for a chain, a tree's
// path) and, for a tree, the attention rows to gather `src` (i32 [a, attention layers]) and where
// they go `dst` (i64 [a]); set_commit_inputs repeats each list per layer slot. Null where the
// model has no such layers (or a chain: src, dst).
struct CommitGraph {
    ggml_cgraph * gf = nullptr;
    ggml_tensor * src = nullptr;
    ggml_tensor * dst = nullptr;
    ggml_tensor * path = nullptr;
    ggml_backend_t upload = nullptr;  // queues the input writes (device_inputs.h), or null
};
CommitGraph build_commit_graph(ggml_context * ctx, const Qwen35Model & model, const TargetCache & cache, bool tree,
                               int a);
// Sets a commit's inputs (those its graph has) once the graph is allocated.
void set_commit_inputs(const CommitGraph & c, const std::vector<int32_t> & path, const std::vector<int32_t> & src,
                       const std::vector<int64_t> & dst);
// A chain commit's path: 0 .. a-1.
std::vector<int32_t> chain_path(int a);
// Metadata bytes (no_alloc context) a commit graph of this model needs.
size_t commit_graph_mem(const Qwen35Model & model);

class CommitGraphs {
  public:
    // n_max: the longest commit (the engine's n_verify_max). Reserves the shared buffer.
    CommitGraphs(const Qwen35Model & model, const TargetCache & cache, ggml_backend_t backend, int n_max);
    ~CommitGraphs();
    CommitGraphs(const CommitGraphs &) = delete;
    CommitGraphs & operator=(const CommitGraphs &) = delete;

    // False when the backend lacks one of the commit's ops: the caller then schedules commits.
    bool usable() const { return galloc_ != nullptr; }
    size_t buffer_bytes() const;

    // Chain: the first a verify tokens. Returns the graph it ran.
    ggml_cgraph * run_chain(int a);
    // Tree: attention rows src[d] -> dst[d] and the recurrent state along the verify nodes `path`.
    ggml_cgraph * run_path(const std::vector<int32_t> & src, const std::vector<int64_t> & dst,
                           const std::vector<int32_t> & path);

    size_t n_cached() const { return graphs_.size(); }

  private:
    struct Graph {
        std::vector<uint8_t> mem;  // tensor and graph metadata (no_alloc context)
        ggml_context * ctx = nullptr;
        CommitGraph c;
    };
    enum Kind { chain = 0, tree = 1 };
    void build(Graph & g, Kind kind, int a) const;
    Graph & get(Kind kind, int a);
    ggml_cgraph * compute(Graph & g);

    const Qwen35Model & model_;
    const TargetCache & cache_;
    ggml_backend_t backend_;
    int n_max_;
    ggml_gallocr_t galloc_ = nullptr;
    std::map<std::pair<int, int>, Graph> graphs_;
};

}  // namespace dflash
