// The DFlash drafter ready to run next to a TargetEngine: its weights and draft KV cache on
// the target's device, its own scheduler, and the inject/draft entry points a speculative loop
// calls. The target's embedding and LM head are used in place, so the target engine must
// outlive this one.
#pragma once

#include "dflash_graph.h"
#include "dflash_model.h"
#include "ggml.h"
#include "gguf_file.h"
#include "memory_plan.h"
#include "target_engine.h"

#include <memory>
#include <string>
#include <vector>

namespace dflash {

struct DraftEngineConfig {
    int n_ctx = 0;                   // highest context position + 1; 0 = the target's n_ctx
    std::string kv_type = "f16";     // draft KV cache: f16, bf16 or f32
    int top_k = 8;                   // candidates per slot returned by draft() (for DDTree)
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
    DraftEngine(const std::string & path, const TargetEngine & target, const DraftEngineConfig & cfg,
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

    void reset();
    // Forget context rows at positions >= n.
    void truncate(int n);
    // Feature rows (n x n_feature: the target layers' outputs concatenated in hparams().target_layers
    // order) for positions pos0..pos0+n-1; pos0 <= n_ctx() (a lower pos0 replaces the rows from there).
    // Rows are queued and enter the cache in the next draft() graph (or in n_batch chunks).
    void inject(const float * rows, int n, int pos0);
    // Drafts the block [anchor, MASK x (B-1)] at positions start..start+B-1 (start >= n_ctx()).
    DraftResult draft(int32_t anchor, int start, bool want_logits);

  private:
    struct Cached {
        ggml_context * ctx = nullptr;
        DraftGraph g;
        DraftSpec spec;
    };
    void run(const DraftSpec & spec, const DraftInputs & in);
    void flush_full_chunks();
    void drop_cached_graph();
    DraftSpec spec_for(int n_inject, bool block, int start) const;

    DraftEngineConfig cfg_;
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
    Cached cached_;  // the last graph; reused when the next run has the same spec
    MemoryPlan plan_;

    int n_committed_ = 0;         // rows already in the cache
    int n_pending_ = 0;           // queued rows, positions n_committed_..
    std::vector<float> pending_;  // n_pending_ x n_feature
};

}  // namespace dflash
