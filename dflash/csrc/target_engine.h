// The target model ready to run: weights and caches on the device, a scheduler, and the
// forward/generate entry points the Python API and the speculative loops use.
#pragma once

#include "backend.h"
#include "commit_graphs.h"
#include "device_inputs.h"
#include "gguf_file.h"
#include "memory_plan.h"
#include "qwen35_graph.h"
#include "qwen35_model.h"
#include "sampler.h"
#include "target_cache.h"

#include "ggml-backend.h"
#include "ggml_ext_matmul.h"
#include "ggml.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace dflash {

struct EngineConfig {
    int n_ctx = 4096;
    std::string k_type = "f16";
    std::string v_type = "f16";
    int n_gpu_layers = -1;    // 0 = CPU only
    int n_threads = 0;        // 0 = all cores
    int n_batch = 512;        // prefill chunk
    int n_logits_batch = 64;  // chunk when every token's logits are wanted
    int n_verify_max = 16;    // most tokens one speculative verify may hold uncommitted
    // Batch-invariant mode (ggml_ext/BATCH_INVARIANCE.md): a verify's tokens and a DDTree's nodes
    // get the bits a one-token decode gives them on every backend, so greedy speculative output
    // equals autoregressive output exactly on CUDA too. Weight matmuls through
    // ggml_ext::mul_mat_invariant, the attention of decodes and verifies through ggml_ext::attn_paths
    // (f16, bf16 or f32 K/V only), the Gated DeltaNet inputs through the fused ops. Slower.
    bool batch_invariant = false;
    // Commits through graphs built once per shape and kept (commit_graphs.h); off: a graph built
    // and scheduled per step (the fallback where the main backend lacks a commit op; benches).
    bool cache_commit_graphs = true;
    // One-token forwards compute each layer's adjacent, alike input projections as one product
    // (Qwen35Layer::stacked); off: one product per weight (for comparisons).
    bool stack_projections = true;
    // On a GPU, forwards compute each Gated DeltaNet layer's small ops (conv, SiLU, L2 norms, gate,
    // beta) in one kernel (ggml_ext::gdn_decode_inputs, gdn_verify_inputs, gdn_tree_inputs: one
    // token's bits for every token or node); off (or on the CPU): ggml's ops.
    bool fuse_gdn_inputs = true;
};

struct ForwardResult {
    std::vector<float> logits;                 // n_out x n_vocab (empty unless requested)
    std::vector<int32_t> argmax;               // n_out
    std::vector<std::vector<float>> captures;  // per capture layer: n_tokens x n_embd (when read back)
};

struct GenerateStats {
    int n_prompt = 0;
    int n_generated = 0;
    double prompt_ms = 0;
    double predict_ms = 0;    // from the first generated token to the last
    std::string stop_reason;  // "eog", "length", "callback"
};

// Return false to stop generating after this token.
using TokenCallback = std::function<bool(int32_t token)>;

class TargetEngine {
  public:
    TargetEngine(const std::string & path, const EngineConfig & cfg, const ProgressFn & progress = {});
    ~TargetEngine();

    const Qwen35Hparams & hparams() const { return model_->hp; }
    const MemoryPlan & plan() const { return plan_; }
    const EngineConfig & config() const { return cfg_; }
    std::string backend_description() const { return backends_->description(); }
    // Diagnostics: the scheduler's splits (one per backend hand-over) and nodes of the last
    // forward and commit graphs; more than one split on a GPU means an op fell back to the CPU.
    struct GraphShape {
        int splits = 0, nodes = 0;
        int ops = 0;  // nodes that launch work (not views, reshapes or permutes): ~kernels before fusion
    };
    static GraphShape graph_shape(ggml_backend_sched_t sched, ggml_cgraph * gf);
    static GraphShape graph_shape(int n_splits, ggml_cgraph * gf);
    GraphShape forward_graph_shape() const;
    GraphShape commit_graph_shape() const { return last_commit_; }
    // Forward graphs built so far: a decode loop of one shape builds one and replays it (on CUDA a
    // rebuilt graph is a new CUDA graph to capture, not a replay).
    int64_t forward_graphs_built() const { return forward_graphs_built_; }
    // Commit graphs built and kept so far (0 when commits are scheduled per step instead).
    int commit_graphs_cached() const { return commits_ ? (int)commits_->n_cached() : 0; }
    // Stacked input-projection weights in the model (used by one-token forwards when enabled).
    int stacked_projections() const;
    // Whether one-token forwards compute the GDN layers' small ops in one op (EngineConfig::fuse_gdn_inputs).
    bool fused_gdn_inputs() const;
    // The nodes of the forward graph a CUDA engine builds for n tokens (a verify when `verify`) in
    // each form ggml_ext's norm and sigmoid-gate fusions take (ggml_ext::count_fusion_patterns):
    // built here on a throwaway context, on any backend, for tests.
    ggml_ext::FusionCounts fusion_patterns(int n, bool verify) const;
    const std::string & model_name() const { return model_->name; }
    int n_past() const { return cache_->n_past; }
    // The loaded weights and the device, for engines that share them (the drafter).
    const Qwen35Model & model() const { return *model_; }
    const Backends & backends() const { return *backends_; }

    void reset();
    // Captured features stay on the device: a forward with capture layers writes row i of
    // features() = those layers' outputs for its token i, side by side in the given order, and
    // copies them to the host only when read_captures is set. The drafter reads the rows in
    // place; the buffer is planned here (a drafter reserves it when it attaches).
    void reserve_features(const std::vector<int> & layers);
    ggml_tensor * features() const { return features_; }
    const std::vector<int> & feature_layers() const { return feature_layers_; }
    // Counts forwards that rewrote features(): rows from an older forward are gone.
    uint64_t feature_generation() const { return feature_gen_; }
    // Counts reallocations of features(): graphs that read the old tensor must be rebuilt.
    uint64_t features_version() const { return features_version_; }

    // One forward of tokens at the current position (<= n_batch tokens); advances n_past.
    ForwardResult forward(const int32_t * tokens, int n, bool all_logits, bool want_logits,
                          const std::vector<int> & capture_layers = {}, bool read_captures = false);
    // Speculative verify: a forward of n <= n_verify_max tokens with every position's argmax
    // (and logits if asked) whose recurrent update is held back until commit().
    ForwardResult verify(const int32_t * tokens, int n, bool want_logits, const std::vector<int> & capture_layers,
                         bool read_captures = false);
    // Keep the first n_accept tokens of the pending verify: the recurrent state becomes
    // exactly the state after them, and the context ends there.
    void commit(int n_accept);
    bool pending() const { return pending_n_ > 0; }
    // DDTree verify: tokens[0] is the anchor (parent -1), parents[i] < i. Every node's logits
    // are those of the sequence prefix + its root-to-node path (Gated DeltaNet layers run each
    // root-to-leaf path as a sequence of the existing ops; the tree ops of issue 4 replace that).
    ForwardResult verify_tree(const int32_t * tokens, const std::vector<int32_t> & parents, bool want_logits,
                              const std::vector<int> & capture_layers, bool read_captures = false);
    // Keep the root-to-node path (node indices, starting with 0) of the pending tree verify:
    // its K/V rows move to consecutive positions.
    void commit_path(const std::vector<int32_t> & path);
    // Copies of one GDN layer's recurrent state (conv window, delta-rule state) for tests.
    std::pair<std::vector<float>, std::vector<float>> recurrent_state(int layer) const;
    // From a clean state: every token's logits for the sequence (n x n_vocab), chunked.
    std::vector<float> eval_logits(const std::vector<int32_t> & tokens);
    // Prefill the prompt then sample up to max_tokens; stops on an end-of-generation token.
    GenerateStats generate(const std::vector<int32_t> & prompt, int max_tokens, const SamplingParams & sp,
                           const std::vector<int32_t> & eog_tokens, const TokenCallback & on_token);

  private:
    void check_fits(int n_new) const;
    EngineConfig cfg_;
    std::unique_ptr<GgufFile> file_;
    std::unique_ptr<Qwen35Model> model_;
    std::unique_ptr<Backends> backends_;
    std::unique_ptr<TargetCache> cache_;
    ggml_backend_sched_t sched_ = nullptr;
    std::vector<uint8_t> graph_mem_;
    // The last built and allocated graph. A forward of the same shape (tokens, attended rows,
    // outputs) reuses it and only refreshes the inputs, as upstream does: building and
    // allocating a 27B graph costs a few ms of CPU per step.
    struct Cached {
        ggml_context * ctx = nullptr;
        ForwardGraph g;
        int n_tokens = -1, n_kv = -1;
        bool all_logits = false;
        bool defer = false;
        bool tree = false;
        std::vector<int> captures;
    } cached_;
    DeviceInputs cached_inputs_;  // the cached graph's inputs in device memory (device_inputs.h)
    int64_t forward_graphs_built_ = 0;
    void drop_cached_graph();
    ForwardResult run_forward(const int32_t * tokens, int n, bool all_logits, bool want_logits,
                              const std::vector<int> & capture_layers, bool read_captures, bool defer,
                              const std::vector<int32_t> & tree_parents = {});
    // Device rows of captured features (see reserve_features).
    std::unique_ptr<ggml_context, void (*)(ggml_context *)> feat_ctx_{nullptr, ggml_free};
    std::unique_ptr<ggml_backend_buffer, void (*)(ggml_backend_buffer_t)> feat_buf_{nullptr, ggml_backend_buffer_free};
    ggml_tensor * features_ = nullptr;  // f32 [n_layers_captured * n_embd, feature_rows()]
    std::vector<int> feature_layers_;
    uint64_t feature_gen_ = 0;
    uint64_t features_version_ = 0;
    int feature_rows() const;
    // Commits: cached graphs on the main backend (commit_graphs.h; null when off or when that
    // backend lacks a commit op), else graphs built per step on their own scheduler (the cached
    // forward stays allocated).
    std::unique_ptr<CommitGraphs> commits_;
    ggml_backend_sched_t commit_sched_ = nullptr;
    std::vector<uint8_t> commit_mem_;
    GraphShape last_commit_;
    void run_commit(ggml_cgraph * gf, const std::function<void()> & set_inputs = {});
    void commit_scheduled(bool tree, int a, const std::function<void(const CommitGraph &)> & set_inputs);
    int pending_n_ = 0;                     // tokens of an uncommitted verify
    std::vector<int32_t> pending_parents_;  // of an uncommitted tree verify (empty: chain)
    MemoryPlan plan_;
};

}  // namespace dflash
