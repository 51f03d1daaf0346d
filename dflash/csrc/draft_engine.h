// The DFlash drafter ready to run next to a TargetEngine: its weights and draft KV cache on
// the target's device, its own scheduler, and the inject/draft entry points a speculative loop
// calls. The target's embedding, LM head and captured-feature rows are used in place, so the
// target engine must outlive this one.
#pragma once

#include "dflash_graph.h"
#include "dflash_model.h"
#include "device_inputs.h"
#include "ggml.h"
#include "gguf_file.h"
#include "memory_plan.h"
#include "target_engine.h"

#include <memory>
#include <string>
#include <vector>

namespace dflash {

struct DraftEngineConfig {
    int n_ctx = 0;                // highest context position + 1; 0 = the target's n_ctx
    std::string kv_type = "f16";  // draft KV cache: f16, bf16 or f32
    int top_k = 8;                // candidates per slot returned by draft() (for DDTree)
    // DDTree: the softmax temperature of the top-K log-probabilities the tree builder ranks by
    // (a calibration of the drafter's marginals; the drafted tokens and the output do not change).
    float tree_temperature = 1.0f;
    int n_batch = 512;               // injection chunk
    bool all_bidirectional = false;  // every layer bidirectional inside the block (upstream's behaviour)
};

struct DraftResult {
    std::vector<int32_t> argmax;   // per slot 1..B-1
    std::vector<int32_t> top_ids;  // (B-1) x top_k, best first
    std::vector<float> top_logp;   // (B-1) x top_k log-probabilities, descending
    std::vector<float> logits;     // (B-1) x n_vocab when requested
};

class DraftEngine {
  public:
    DraftEngine(const std::string & path, TargetEngine & target, const DraftEngineConfig & cfg,
                const ProgressFn & progress = {});
    ~DraftEngine();
    DraftEngine(const DraftEngine &) = delete;
    DraftEngine & operator=(const DraftEngine &) = delete;

    const DflashHparams & hparams() const { return model_->hp; }
    const MemoryPlan & plan() const { return plan_; }
    const DraftEngineConfig & config() const { return cfg_; }
    int64_t n_vocab() const { return n_vocab_; }
    // Context rows held: positions 0..n_ctx()-1 have features (committed or queued).
    int n_ctx() const { return n_committed_ + n_pending_; }
    void set_all_bidirectional(bool on) { cfg_.all_bidirectional = on; }
    // Diagnostics: scheduler splits and nodes of the last draft graph (see TargetEngine).
    TargetEngine::GraphShape graph_shape() const;
    // Draft graphs built so far (see TargetEngine::forward_graphs_built).
    int64_t graphs_built() const { return graphs_built_; }

    void reset();
    // Forget context rows at positions >= n.
    void truncate(int n);
    // Feature rows (n x n_feature: the target layers' outputs concatenated in hparams().target_layers
    // order) for positions pos0..pos0+n-1; pos0 <= n_ctx() (a lower pos0 replaces the rows from there).
    // Rows are queued and enter the cache in the next draft() graph (or in n_batch chunks).
    void inject(const float * rows, int n, int pos0);
    // The same from the target's device feature rows (rows[i] of target.features(), captured by
    // its last forward with this drafter's layers) for positions pos0..: nothing goes through the
    // host. Queued rows must reach the cache before the target's next forward overwrites them:
    // draft() or flush() does that.
    void inject_target(const std::vector<int32_t> & rows, int pos0);
    // Moves every queued row into the cache now.
    void flush();
    // Drafts the block [anchor, MASK x (B-1)] at positions start..start+B-1 (start >= n_ctx()).
    // want_top_k = false (chain decoding) skips the top-K candidates (top_ids / top_logp empty).
    DraftResult draft(int32_t anchor, int start, bool want_logits, bool want_top_k = true);

  private:
    struct Cached {
        ggml_context * ctx = nullptr;
        DraftGraph g;
        DraftSpec spec;
    };
    void run(const DraftSpec & spec, const DraftInputs & in);      // prepare, then compute
    void prepare(const DraftSpec & spec, const DraftInputs & in);  // the graph of spec, with its inputs set
    void flush_full_chunks();
    void flush_rows(int n);  // the first n queued rows, inject only
    void begin_inject(int n, int pos0);
    // Queued rows [from, from + n) as a graph's inputs.
    DraftInputs pending_inputs(int from, int n) const;
    void drop_cached_graph();
    DraftSpec spec_for(int n_inject, bool block, int start, bool top_k = false) const;

    DraftEngineConfig cfg_;
    TargetEngine & target_;
    const Backends & backends_;
    std::unique_ptr<GgufFile> file_;
    std::unique_ptr<DflashModel> model_;
    int64_t n_vocab_ = 0;
    // Owned ggml objects, freed even when the constructor throws half way.
    std::unique_ptr<ggml_context, void (*)(ggml_context *)> kv_ctx_{nullptr, ggml_free};
    std::unique_ptr<ggml_backend_buffer, void (*)(ggml_backend_buffer_t)> kv_buf_{nullptr, ggml_backend_buffer_free};
    std::unique_ptr<ggml_backend_sched, void (*)(ggml_backend_sched_t)> sched_{nullptr, ggml_backend_sched_free};
    DraftKv kv_;
    std::vector<uint8_t> graph_mem_;
    Cached cached_;               // the last graph; reused when the next run has the same spec
    DeviceInputs cached_inputs_;  // its inputs in device memory (device_inputs.h)
    int64_t graphs_built_ = 0;
    MemoryPlan plan_;

    int n_committed_ = 0;  // rows already in the cache
    int n_pending_ = 0;    // queued rows, positions n_committed_..
    // Queued rows are host rows (pending_, n_pending_ x n_feature) or rows of the target's
    // feature buffer (pending_rows_, written by the target forward number pending_gen_).
    bool pending_on_target_ = false;
    std::vector<float> pending_;
    std::vector<int32_t> pending_rows_;
    uint64_t pending_gen_ = 0;
};

}  // namespace dflash
