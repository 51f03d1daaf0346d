#include "target_engine.h"

#include "ggml_ext_attn.h"
#include "ggml_ext_matmul.h"
#include "ggml_ext_tree.h"

#include "errors.h"
#include "ggml.h"
#include "kv_types.h"

#include <algorithm>
#include <chrono>

namespace dflash {

namespace {

double now_ms() {
    using namespace std::chrono;
    return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

// A scratch ggml context for one graph's tensor metadata (no data).
struct GraphCtx {
    explicit GraphCtx(std::vector<uint8_t> & mem) {
        ggml_init_params p = {mem.size(), mem.data(), true};
        ctx = ggml_init(p);
    }
    ~GraphCtx() { ggml_free(ctx); }
    ggml_context * ctx;
};

}  // namespace

TargetEngine::TargetEngine(const std::string & path, const EngineConfig & cfg, const ProgressFn & progress)
    : cfg_(cfg) {
    if (cfg.n_ctx < 16 || cfg.n_ctx > (1 << 22)) {
        throw InvalidParameter("n_ctx must be in [16, 4194304], got " + std::to_string(cfg.n_ctx));
    }
    if (cfg.n_batch < 1 || cfg.n_logits_batch < 1) throw InvalidParameter("n_batch must be >= 1");
    TargetCacheConfig cc;
    cc.n_ctx = cfg.n_ctx;
    cc.k_type = parse_kv_type(cfg.k_type);
    cc.v_type = parse_kv_type(cfg.v_type);
    if (cfg.n_verify_max < 1 || cfg.n_verify_max > 1024) {
        throw InvalidParameter("n_verify_max must be in [1, 1024], got " + std::to_string(cfg.n_verify_max));
    }
    cc.n_verify_max = cfg.n_verify_max;
    cfg_.n_batch = std::min(cfg.n_batch, cfg.n_ctx);
    cfg_.n_logits_batch =
        std::min(std::max(cfg.n_logits_batch, cfg.n_verify_max), std::max(cfg_.n_batch, cfg.n_verify_max));

    file_ = std::make_unique<GgufFile>(path);
    model_ = std::make_unique<Qwen35Model>(*file_);
    const auto & hp = model_->hp;
    if (hp.head_dim % ggml_blck_size(cc.k_type) != 0 || hp.head_dim % ggml_blck_size(cc.v_type) != 0) {
        throw InvalidParameter("KV type block size does not divide the head dim " + std::to_string(hp.head_dim));
    }
    if (cfg.batch_invariant &&
        !(ggml_ext::attn_paths_supports_type(cc.k_type) && ggml_ext::attn_paths_supports_type(cc.v_type))) {
        throw InvalidParameter("batch_invariant needs an f16, bf16 or f32 KV cache, not " + cfg.k_type + "/" +
                               cfg.v_type);
    }
    backends_ = std::make_unique<Backends>(cfg.n_gpu_layers, cfg.n_threads);
    cache_ = std::make_unique<TargetCache>(hp, cc);

    // Plan: weights + caches first (exact), then the measured compute buffer.
    size_t free_b = 0, total_b = 0;
    backends_->memory(free_b, total_b);
    plan_.device = backends_->description();
    plan_.free_bytes = free_b;
    plan_.total_bytes = total_b;
    model_->assign_buffers(*backends_);
    plan_.add("weights", model_->weight_bytes());
    auto [kv_b, rs_b] = cache_->bytes(backends_->main_buft);
    plan_.add("kv cache (" + cfg.k_type + "/" + cfg.v_type + ", n_ctx " + std::to_string(cfg.n_ctx) + ")", kv_b);
    plan_.add("recurrent state", rs_b);
    plan_.check();

    model_->load(*file_, progress);
    cache_->allocate(backends_->main_buft);

    std::vector<ggml_backend_t> bks = {backends_->main};
    if (backends_->is_gpu) bks.push_back(backends_->cpu);
    graph_mem_.resize(ggml_tensor_overhead() * 32768 + ggml_graph_overhead_custom(16384, false));
    sched_ = backends_->new_sched(16384);
    commit_sched_ = backends_->new_sched(COMMIT_GRAPH_NODES);
    commit_mem_.resize(commit_graph_mem(*model_));

    // Compute: measure the worst cases (a full prefill chunk at the end of the context, and an
    // all-logits chunk), check them against what weights and caches leave, then reserve both so
    // the buffers never grow mid-request.
    auto worst_case = [&](int pass) {
        ForwardSpec spec;
        spec.n_tokens = pass == 0 ? cfg_.n_batch : cfg_.n_logits_batch;
        spec.n_past = cfg_.n_ctx - spec.n_tokens;
        spec.all_logits = pass == 1;
        return spec;
    };
    size_t worst = 0;
    for (int pass = 0; pass < 2; ++pass) {
        GraphCtx gc(graph_mem_);
        ForwardGraph g = build_qwen35_forward(gc.ctx, *model_, *cache_, worst_case(pass));
        std::vector<size_t> sizes(bks.size(), 0);
        ggml_backend_sched_reserve_size(sched_, g.gf, sizes.data());
        worst = std::max(worst, sizes[0]);
    }
    if (cfg_.cache_commit_graphs) {
        commits_ = std::make_unique<CommitGraphs>(*model_, *cache_, backends_->main, cfg_.n_verify_max);
        if (!commits_->usable()) commits_.reset();
    }
    MemoryPlan rest;
    rest.device = plan_.device;
    rest.free_bytes = free_b > plan_.sum() ? free_b - plan_.sum() : 0;  // left after weights + caches
    rest.total_bytes = total_b;
    rest.add("compute", worst);
    if (commits_) rest.add("commit compute", commits_->buffer_bytes());
    if (device_inputs_enabled()) rest.add("graph inputs", kDeviceInputsMaxBytes);
    rest.check();
    plan_.add("compute", worst);
    if (commits_) plan_.add("commit compute", commits_->buffer_bytes());
    if (device_inputs_enabled()) plan_.add("graph inputs", kDeviceInputsMaxBytes);
    for (int pass = 0; pass < 2; ++pass) {
        GraphCtx gc(graph_mem_);
        ForwardGraph g = build_qwen35_forward(gc.ctx, *model_, *cache_, worst_case(pass));
        if (!ggml_backend_sched_reserve(sched_, g.gf)) throw EngineError("could not reserve the compute buffers");
    }
}

TargetEngine::~TargetEngine() {
    drop_cached_graph();
    if (sched_) ggml_backend_sched_free(sched_);
    if (commit_sched_) ggml_backend_sched_free(commit_sched_);
}

TargetEngine::GraphShape TargetEngine::graph_shape(ggml_backend_sched_t sched, ggml_cgraph * gf) {
    return graph_shape(ggml_backend_sched_get_n_splits(sched), gf);
}

TargetEngine::GraphShape TargetEngine::graph_shape(int n_splits, ggml_cgraph * gf) {
    GraphShape s{n_splits, ggml_graph_n_nodes(gf), 0};
    for (int i = 0; i < s.nodes; ++i) {
        switch (ggml_graph_node(gf, i)->op) {
            case GGML_OP_NONE:
            case GGML_OP_VIEW:
            case GGML_OP_RESHAPE:
            case GGML_OP_PERMUTE:
            case GGML_OP_TRANSPOSE:
                break;
            default:
                s.ops++;
        }
    }
    return s;
}

TargetEngine::GraphShape TargetEngine::forward_graph_shape() const {
    return cached_.ctx ? graph_shape(sched_, cached_.g.gf) : GraphShape{};
}

// Commit graphs are built per step (their shape follows the accepted length) and allocated on
// the commit scheduler; set_inputs runs once they have buffers.
void TargetEngine::run_commit(ggml_cgraph * gf, const std::function<void()> & set_inputs) {
    ggml_backend_sched_reset(commit_sched_);
    // Every node the main device can run stays there: the scheduler would otherwise follow a
    // gather's host-side row indices to the CPU and replay the delta rule there, in other bits
    // than the cached commit graphs' (seen on the H200 for tiny-b, session 10).
    for (int i = 0; i < ggml_graph_n_nodes(gf); ++i) {
        ggml_tensor * node = ggml_graph_node(gf, i);
        if (ggml_backend_supports_op(backends_->main, node)) {
            ggml_backend_sched_set_tensor_backend(commit_sched_, node, backends_->main);
        }
    }
    bool ok = ggml_backend_sched_alloc_graph(commit_sched_, gf);
    if (ok) {
        if (set_inputs) set_inputs();
        last_commit_ = graph_shape(commit_sched_, gf);
        ok = ggml_backend_sched_graph_compute(commit_sched_, gf) == GGML_STATUS_SUCCESS;
    }
    if (!ok) throw EngineError("the backend failed to compute the commit");
}

void TargetEngine::drop_cached_graph() {
    if (cached_.ctx) ggml_free(cached_.ctx);
    cached_ = Cached{};
    cached_inputs_.release();
}

void TargetEngine::reset() {
    cache_->clear();
    pending_n_ = 0;
    pending_parents_.clear();
}

void TargetEngine::check_fits(int n_new) const {
    if (cache_->n_past + n_new > cfg_.n_ctx) throw ContextOverflow(cache_->n_past + n_new, cfg_.n_ctx);
}

int TargetEngine::feature_rows() const { return std::max({cfg_.n_batch, cfg_.n_logits_batch, cfg_.n_verify_max}); }

void TargetEngine::reserve_features(const std::vector<int> & layers) {
    const auto & hp = model_->hp;
    for (int l : layers) {
        if (l < 0 || l >= hp.n_layer) throw InvalidParameter("capture layer " + std::to_string(l) + " out of range");
    }
    if (layers == feature_layers_ && (features_ || layers.empty())) return;
    drop_cached_graph();  // it writes into the old buffer
    features_version_++;
    features_ = nullptr;
    feat_buf_.reset();
    feat_ctx_.reset();
    feature_layers_.clear();
    auto planned = std::find_if(plan_.items.begin(), plan_.items.end(),
                                [](const auto & it) { return it.first.rfind("captured features", 0) == 0; });
    if (planned != plan_.items.end()) plan_.items.erase(planned);
    if (layers.empty()) return;

    ggml_init_params p = {ggml_tensor_overhead(), nullptr, true};
    feat_ctx_.reset(ggml_init(p));
    ggml_tensor * t =
        ggml_new_tensor_2d(feat_ctx_.get(), GGML_TYPE_F32, (int64_t)layers.size() * hp.n_embd, feature_rows());
    ggml_set_name(t, "captured_features");
    const std::string what = "captured features (" + std::to_string(layers.size()) + " layers x " +
                             std::to_string(feature_rows()) + " rows)";
    MemoryPlan more;
    more.device = plan_.device;
    backends_->memory(more.free_bytes, more.total_bytes);
    more.add(what, ggml_backend_alloc_ctx_tensors_from_buft_size(feat_ctx_.get(), backends_->main_buft));
    more.check();
    feat_buf_.reset(ggml_backend_alloc_ctx_tensors_from_buft(feat_ctx_.get(), backends_->main_buft));
    if (!feat_buf_) throw EngineError("could not allocate the captured-feature buffer");
    ggml_backend_buffer_clear(feat_buf_.get(), 0);  // rows a drafter pads with are read, never garbage
    plan_.add(what, more.items[0].second);
    features_ = t;
    feature_layers_ = layers;
}

ForwardResult TargetEngine::forward(const int32_t * tokens, int n, bool all_logits, bool want_logits,
                                    const std::vector<int> & capture_layers, bool read_captures) {
    return run_forward(tokens, n, all_logits, want_logits, capture_layers, read_captures, false);
}

ForwardResult TargetEngine::verify(const int32_t * tokens, int n, bool want_logits,
                                   const std::vector<int> & capture_layers, bool read_captures) {
    if (n < 1 || n > cfg_.n_verify_max) {
        throw InvalidParameter("verify of " + std::to_string(n) + " tokens; n_verify_max is " +
                               std::to_string(cfg_.n_verify_max));
    }
    ForwardResult r = run_forward(tokens, n, true, want_logits, capture_layers, read_captures, true);
    pending_n_ = n;
    return r;
}

void TargetEngine::commit(int a) {
    if (pending_n_ == 0) throw InvalidParameter("commit without a pending verify");
    if (!pending_parents_.empty()) throw InvalidParameter("a tree verify is pending: use commit_path");
    if (a < 1 || a > pending_n_) {
        throw InvalidParameter("commit of " + std::to_string(a) + " tokens; the verify had " +
                               std::to_string(pending_n_));
    }
    if (commits_) {
        last_commit_ = graph_shape(1, commits_->run_chain(a));
    } else {
        commit_scheduled(false, a, [&](const CommitGraph & c) { set_commit_inputs(c, chain_path(a), {}, {}); });
    }
    // Attention rows past the accepted ones are masked from now on and overwritten later.
    cache_->n_past -= pending_n_ - a;
    pending_n_ = 0;
}

std::pair<std::vector<float>, std::vector<float>> TargetEngine::recurrent_state(int layer) const {
    const auto & hp = model_->hp;
    if (layer < 0 || layer >= hp.n_layer || !hp.is_recurrent[layer]) {
        throw InvalidParameter("layer " + std::to_string(layer) + " is not a Gated DeltaNet layer");
    }
    std::vector<float> conv(ggml_nelements(cache_->conv[layer])), ssm(ggml_nelements(cache_->ssm[layer]));
    ggml_backend_tensor_get(cache_->conv[layer], conv.data(), 0, ggml_nbytes(cache_->conv[layer]));
    ggml_backend_tensor_get(cache_->ssm[layer], ssm.data(), 0, ggml_nbytes(cache_->ssm[layer]));
    return {conv, ssm};
}

ForwardResult TargetEngine::verify_tree(const int32_t * tokens, const std::vector<int32_t> & parents, bool want_logits,
                                        const std::vector<int> & capture_layers, bool read_captures) {
    const int n = (int)parents.size();
    if (n < 1 || n > cfg_.n_verify_max) {
        throw InvalidParameter("tree of " + std::to_string(n) + " tokens; n_verify_max is " +
                               std::to_string(cfg_.n_verify_max));
    }
    if (parents[0] != -1) throw InvalidParameter("the tree's first token is the root: its parent must be -1");
    for (int i = 1; i < n; ++i) {
        if (parents[i] < 0 || parents[i] >= i) {
            throw InvalidParameter("tree parent of token " + std::to_string(i) + " must be in [0, " +
                                   std::to_string(i) + ")");
        }
    }
    ggml_ext::TreeIndex index;
    std::string why;
    if (!ggml_ext::make_tree_index(parents, index, &why)) throw InvalidParameter("tree verify: " + why);
    ForwardResult r = run_forward(tokens, n, true, want_logits, capture_layers, read_captures, true, parents);
    pending_n_ = n;
    pending_parents_ = parents;
    return r;
}

void TargetEngine::commit_path(const std::vector<int32_t> & path) {
    if (pending_n_ == 0 || pending_parents_.empty())
        throw InvalidParameter("commit_path without a pending tree verify");
    if (path.empty() || path[0] != 0) throw InvalidParameter("a path starts at the root (node 0)");
    for (size_t d = 1; d < path.size(); ++d) {
        if (path[d] <= 0 || path[d] >= pending_n_ || pending_parents_[path[d]] != path[d - 1]) {
            throw InvalidParameter("path node " + std::to_string(path[d]) + " is not a child of the node before it");
        }
    }
    const int start = cache_->n_past - pending_n_;
    const int n = (int)path.size();
    std::vector<int32_t> src(n);  // get_rows takes i32 rows, set_rows i64
    std::vector<int64_t> dst(n);
    for (int d = 0; d < n; ++d) {
        src[d] = start + path[d];
        dst[d] = start + d;
    }
    if (commits_) {
        last_commit_ = graph_shape(1, commits_->run_path(src, dst, path));
    } else {
        commit_scheduled(true, n, [&](const CommitGraph & c) { set_commit_inputs(c, path, src, dst); });
    }
    cache_->n_past = start + n;
    pending_n_ = 0;
    pending_parents_.clear();
}

ForwardResult TargetEngine::run_forward(const int32_t * tokens, int n, bool all_logits, bool want_logits,
                                        const std::vector<int> & capture_layers, bool read_captures, bool defer,
                                        const std::vector<int32_t> & tree_parents) {
    if (pending_n_ > 0) throw InvalidParameter("a verify is pending: commit it before the next forward");
    const auto & hp = model_->hp;
    if (n < 1 || n > (all_logits ? cfg_.n_logits_batch : cfg_.n_batch)) {
        throw InvalidParameter("forward of " + std::to_string(n) + " tokens exceeds the batch size");
    }
    for (int i = 0; i < n; ++i) {
        if (tokens[i] < 0 || tokens[i] >= hp.n_vocab) {
            throw InvalidParameter("token id " + std::to_string(tokens[i]) + " is outside the vocabulary (" +
                                   std::to_string(hp.n_vocab) + ")");
        }
    }
    check_fits(n);
    reserve_features(capture_layers);  // a no-op for the drafter's layers
    ForwardSpec spec;
    spec.n_tokens = n;
    spec.n_past = cache_->n_past;
    spec.all_logits = all_logits;
    spec.capture_layers = capture_layers;
    spec.features = features_;
    spec.batch_invariant = cfg_.batch_invariant;
    spec.stack_projections = cfg_.stack_projections;
    spec.stack_tokens = cfg_.stack_projections && backends_->is_gpu;
    spec.fused_gdn_inputs = fused_gdn_inputs();
    spec.adjacent_products = ggml_ext::fuse_rms_norm_gemv_enabled();
    spec.defer_recurrent = defer;
    spec.tree_parents = tree_parents;

    const int n_kv = padded_n_kv(spec.n_past + n, cache_->cfg.n_ctx);
    // A tree's structure is a graph input: one graph serves every tree of n tokens.
    const bool tree = !tree_parents.empty();
    const bool reuse = cached_.ctx && cached_.n_tokens == n && cached_.n_kv == n_kv &&
                       cached_.all_logits == all_logits && cached_.captures == capture_layers &&
                       cached_.defer == defer && cached_.tree == tree;
    if (!reuse) {
        drop_cached_graph();
        // Plan this shape's allocation first (ggml would reuse the last plan when sizes fit,
        // ignoring which tensors are outputs, so other layers' captures could be overwritten).
        // The plan is made on a throwaway build: scheduling a graph rewrites its nodes' sources
        // to the backend copies of its inputs, so a graph that was split once must not be split
        // again (on CUDA the second split reads inputs that are never filled).
        {
            GraphCtx plan_ctx(graph_mem_);
            ForwardGraph plan = build_qwen35_forward(plan_ctx.ctx, *model_, *cache_, spec);
            ggml_backend_sched_reset(sched_);
            if (!ggml_backend_sched_reserve(sched_, plan.gf)) throw EngineError("could not plan the forward graph");
        }
        ggml_init_params p = {graph_mem_.size(), graph_mem_.data(), true};
        cached_.ctx = ggml_init(p);
        cached_.g = build_qwen35_forward(cached_.ctx, *model_, *cache_, spec);
        forward_graphs_built_++;
        if (device_inputs_enabled() &&
            cached_inputs_.allocate(cached_.g.gf, backends_->main_buft, kDeviceInputsMaxBytes)) {
            cached_.g.upload = backends_->main;
        }
        if (!ggml_backend_sched_alloc_graph(sched_, cached_.g.gf)) {
            drop_cached_graph();
            throw EngineError("could not allocate the forward graph");
        }
        cached_.n_tokens = n;
        cached_.n_kv = n_kv;
        cached_.all_logits = all_logits;
        cached_.captures = capture_layers;
        cached_.defer = defer;
        cached_.tree = tree;
    }
    const ForwardGraph & g = cached_.g;
    set_qwen35_inputs(g, *model_, spec, tokens);
    ForwardResult r;
    const int64_t n_out = g.argmax->ne[0];
    r.argmax.resize(n_out);
    std::vector<Readback> reads = {{g.argmax, r.argmax.data(), sizeof(int32_t) * n_out}};
    if (want_logits) {
        r.logits.resize((size_t)n_out * hp.n_vocab);
        reads.push_back({g.logits, r.logits.data(), sizeof(float) * r.logits.size()});
    }
    const bool captures = read_captures && !capture_layers.empty();
    std::vector<float> rows;
    if (captures) {
        rows.resize((size_t)n * capture_layers.size() * hp.n_embd);
        reads.push_back({features_, rows.data(), sizeof(float) * rows.size()});
    }
    if (!compute_and_read(sched_, g.gf, reads)) throw EngineError("the backend failed to compute the forward graph");
    cache_->n_past += n;
    if (!capture_layers.empty()) feature_gen_++;

    if (captures) {
        const int64_t E = hp.n_embd, L = (int64_t)capture_layers.size();
        r.captures.assign(L, std::vector<float>((size_t)n * E));
        for (int i = 0; i < n; ++i) {
            for (int64_t l = 0; l < L; ++l) {
                const float * src = rows.data() + ((size_t)i * L + l) * E;
                std::copy(src, src + E, r.captures[l].data() + (size_t)i * E);
            }
        }
    }
    return r;
}

std::vector<float> TargetEngine::eval_logits(const std::vector<int32_t> & tokens) {
    if (tokens.empty()) throw InvalidParameter("no tokens to evaluate");
    if ((int)tokens.size() > cfg_.n_ctx) throw ContextOverflow((int)tokens.size(), cfg_.n_ctx);
    reset();
    std::vector<float> out;
    out.reserve(tokens.size() * (size_t)model_->hp.n_vocab);
    for (size_t i = 0; i < tokens.size(); i += cfg_.n_logits_batch) {
        const int n = (int)std::min<size_t>(cfg_.n_logits_batch, tokens.size() - i);
        ForwardResult r = forward(tokens.data() + i, n, true, true);
        out.insert(out.end(), r.logits.begin(), r.logits.end());
    }
    return out;
}

GenerateStats TargetEngine::generate(const std::vector<int32_t> & prompt, int max_tokens, const SamplingParams & sp,
                                     const std::vector<int32_t> & eog, const TokenCallback & on_token) {
    validate(sp);
    if (prompt.empty()) throw InvalidParameter("the prompt is empty");
    if (max_tokens < 0) throw InvalidParameter("max_tokens must be >= 0");
    // The prompt plus one generated token must fit; generation stops at the context end.
    if ((int)prompt.size() + 1 > cfg_.n_ctx) throw ContextOverflow((int)prompt.size() + 1, cfg_.n_ctx);
    reset();
    Sampler sampler(sp);
    GenerateStats st;
    st.n_prompt = (int)prompt.size();
    const double t0 = now_ms();
    ForwardResult r;
    for (size_t i = 0; i < prompt.size(); i += cfg_.n_batch) {
        const int n = (int)std::min<size_t>(cfg_.n_batch, prompt.size() - i);
        r = forward(prompt.data() + i, n, false, !sp.greedy());
    }
    const int64_t V = model_->hp.n_vocab;
    auto pick = [&](const ForwardResult & fr) {
        return sp.greedy() ? fr.argmax[0] : sampler.sample(fr.logits.data(), V);
    };
    double t_first = 0;
    st.stop_reason = "length";
    for (int i = 0; i < max_tokens; ++i) {
        const int32_t tok = pick(r);
        if (i == 0) {
            t_first = now_ms();
            st.prompt_ms = t_first - t0;
        }
        st.n_generated++;
        const bool is_eog = std::find(eog.begin(), eog.end(), tok) != eog.end();
        if (!on_token(tok)) {
            st.stop_reason = "callback";
            break;
        }
        if (is_eog) {
            st.stop_reason = "eog";
            break;
        }
        if (i + 1 == max_tokens) break;
        if (cache_->n_past + 1 > cfg_.n_ctx) break;  // context full: stop with "length"
        r = forward(&tok, 1, false, !sp.greedy());
    }
    st.predict_ms = st.n_generated > 0 ? now_ms() - t_first : 0;
    if (st.n_generated == 0) st.prompt_ms = now_ms() - t0;
    return st;
}

// A commit where the main backend lacks one of its ops: built for this step, scheduled.
void TargetEngine::commit_scheduled(bool tree, int a, const std::function<void(const CommitGraph &)> & set_inputs) {
    ggml_init_params p = {commit_mem_.size(), commit_mem_.data(), true};
    ggml_context * ctx = ggml_init(p);
    const CommitGraph c = build_commit_graph(ctx, *model_, *cache_, tree, a);
    try {
        run_commit(c.gf, set_inputs ? [&] { set_inputs(c); } : std::function<void()>{});
    } catch (...) {
        ggml_free(ctx);
        throw;
    }
    ggml_free(ctx);
}

bool TargetEngine::fused_gdn_inputs() const {
    // The fused op runs on the GPU only where its CUDA kernel takes the head size (one thread per
    // channel of a head, whole warps): placed on the CPU it would advance a copy of the conv state.
    const int64_t S = model_->hp.ssm_d_state;
    return cfg_.fuse_gdn_inputs && backends_->is_gpu && S % 32 == 0 && S <= 256;
}

int TargetEngine::stacked_projections() const { return cfg_.stack_projections ? model_->n_stacked() : 0; }

ggml_ext::FusionCounts TargetEngine::fusion_patterns(int n, bool verify) const {
    if (n < 1 || n > cfg_.n_batch) throw InvalidParameter("fusion_patterns: n must be in [1, n_batch]");
    ForwardSpec spec;  // run_forward's, with the choices a CUDA engine makes
    spec.n_tokens = n;
    spec.n_past = cache_->n_past;
    spec.all_logits = verify;
    spec.features = features_;
    spec.batch_invariant = cfg_.batch_invariant;
    spec.stack_projections = cfg_.stack_projections;
    spec.stack_tokens = cfg_.stack_projections;
    spec.adjacent_products = ggml_ext::fuse_rms_norm_gemv_enabled();
    const int64_t S = model_->hp.ssm_d_state;
    spec.fused_gdn_inputs = cfg_.fuse_gdn_inputs && S % 32 == 0 && S <= 256;
    spec.defer_recurrent = verify;
    std::vector<uint8_t> mem(graph_mem_.size());  // graph_mem_ holds the cached graph
    GraphCtx c(mem);
    return ggml_ext::count_fusion_patterns(build_qwen35_forward(c.ctx, *model_, *cache_, spec).gf);
}

}  // namespace dflash
