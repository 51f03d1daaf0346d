#include "draft_engine.h"

#include "errors.h"
#include "ggml-alloc.h"
#include "ggml.h"
#include "kv_types.h"

#include <algorithm>
#include <numeric>
#include <tuple>

namespace dflash {

namespace {

constexpr int GRAPH_NODES = 4096;

int round_up(int x, int m) { return (x + m - 1) / m * m; }

bool same_spec(const DraftSpec & a, const DraftSpec & b) {
    return a.n_inject == b.n_inject && a.n_block == b.n_block && a.top_k == b.top_k &&
           a.top_temperature == b.top_temperature && a.kv_hi == b.kv_hi && a.kv_lo_sliding == b.kv_lo_sliding &&
           a.feat_src == b.feat_src && a.feat_version == b.feat_version;
}

}  // namespace

DraftEngine::DraftEngine(const std::string & path, TargetEngine & target, const DraftEngineConfig & cfg,
                         const ProgressFn & progress)
    : cfg_(cfg), target_(target), backends_(target.backends()) {
    if (cfg_.n_ctx == 0) cfg_.n_ctx = target.config().n_ctx;
    if (cfg_.n_ctx < 1 || cfg_.n_ctx > (1 << 22)) {
        throw InvalidParameter("draft n_ctx must be in [1, 4194304], got " + std::to_string(cfg_.n_ctx));
    }
    if (cfg_.n_batch < 1) throw InvalidParameter("draft n_batch must be >= 1");
    const ggml_type kv_type = parse_kv_type(cfg_.kv_type);
    if (ggml_is_quantized(kv_type)) {
        throw InvalidParameter("draft KV type must be f16, bf16 or f32, got '" + cfg_.kv_type + "'");
    }

    file_ = std::make_unique<GgufFile>(path);
    model_ = std::make_unique<DflashModel>(*file_);
    model_->bind_target(target.model());
    const auto & hp = model_->hp;
    n_vocab_ = target.hparams().n_vocab;
    if (cfg_.top_k < 1 || cfg_.top_k > n_vocab_) {
        throw InvalidParameter("draft top_k must be in [1, n_vocab], got " + std::to_string(cfg_.top_k));
    }
    if (!(cfg_.tree_temperature >= 0.05f && cfg_.tree_temperature <= 20.0f)) {
        throw InvalidParameter("draft tree_temperature must be in [0.05, 20], got " +
                               std::to_string(cfg_.tree_temperature));
    }
    cfg_.n_batch = std::min(cfg_.n_batch, cfg_.n_ctx);
    // The target keeps this drafter's layers on the device (planned and checked there).
    target.reserve_features(hp.target_layers);

    // Draft KV: one row per position up to n_ctx, the block scratch past it, one trash row.
    kv_.n_rows = round_up(cfg_.n_ctx + hp.block_size + 1, 256);
    ggml_init_params p = {ggml_tensor_overhead() * (size_t)(2 * hp.n_layer + 4), nullptr, true};
    kv_ctx_.reset(ggml_init(p));
    for (int64_t il = 0; il < hp.n_layer; ++il) {
        kv_.k.push_back(ggml_new_tensor_2d(kv_ctx_.get(), kv_type, hp.kv_row(), kv_.n_rows));
        kv_.v.push_back(ggml_new_tensor_2d(kv_ctx_.get(), kv_type, hp.kv_row(), kv_.n_rows));
    }

    size_t free_b = 0, total_b = 0;
    backends_.memory(free_b, total_b);
    plan_.device = backends_.description();
    plan_.free_bytes = free_b;
    plan_.total_bytes = total_b;
    model_->assign_buffers(backends_);
    plan_.add("draft weights", model_->weight_bytes());
    plan_.add("draft kv cache (" + cfg_.kv_type + ", n_ctx " + std::to_string(cfg_.n_ctx) + ")",
              ggml_backend_alloc_ctx_tensors_from_buft_size(kv_ctx_.get(), backends_.main_buft));

    plan_.check();

    model_->load(*file_, progress);
    kv_buf_.reset(ggml_backend_alloc_ctx_tensors_from_buft(kv_ctx_.get(), backends_.main_buft));
    if (!kv_buf_) throw EngineError("could not allocate the draft KV cache");
    // Masked rows are still multiplied by 0 in attention, so they must never hold NaN garbage.
    ggml_backend_buffer_clear(kv_buf_.get(), 0);

    // Compute buffers, measured once the weights have their buffers. Worst case: a full
    // injection chunk plus a block attending over the whole cache.
    std::vector<ggml_backend_t> bks = {backends_.main};
    if (backends_.is_gpu) bks.push_back(backends_.cpu);
    graph_mem_.resize(ggml_tensor_overhead() * GRAPH_NODES * 2 + ggml_graph_overhead_custom(GRAPH_NODES, false));
    sched_.reset(backends_.new_sched(GRAPH_NODES));
    DraftSpec worst;
    worst.n_inject = round_up(cfg_.n_batch, hp.block_size);
    worst.n_block = hp.block_size;
    worst.top_k = cfg_.top_k;
    worst.top_temperature = cfg_.tree_temperature;
    worst.kv_hi = (int)kv_.n_rows;
    worst.kv_lo_sliding = 0;
    ggml_init_params gp = {graph_mem_.size(), graph_mem_.data(), true};
    std::unique_ptr<ggml_context, void (*)(ggml_context *)> gctx(ggml_init(gp), ggml_free);
    DraftGraph g = build_dflash_draft(gctx.get(), *model_, kv_, worst);
    std::vector<size_t> sizes(bks.size(), 0);
    ggml_backend_sched_reserve_size(sched_.get(), g.gf, sizes.data());
    plan_.add("draft compute", sizes[0]);
    if (device_inputs_enabled()) plan_.add("draft graph inputs", kDeviceInputsMaxBytes);
    MemoryPlan rest;  // the weights and the cache are already allocated (and counted by the device)
    rest.device = plan_.device;
    backends_.memory(rest.free_bytes, rest.total_bytes);
    rest.add("draft compute", sizes[0]);
    if (device_inputs_enabled()) rest.add("draft graph inputs", kDeviceInputsMaxBytes);
    rest.check();
    gctx.reset();  // a fresh build: the measured graph was already split
    gctx.reset(ggml_init(gp));
    g = build_dflash_draft(gctx.get(), *model_, kv_, worst);
    if (!ggml_backend_sched_reserve(sched_.get(), g.gf))
        throw EngineError("could not reserve the draft compute buffers");
}

DraftEngine::~DraftEngine() { drop_cached_graph(); }

TargetEngine::GraphShape DraftEngine::graph_shape() const {
    return cached_.ctx ? TargetEngine::graph_shape(sched_.get(), cached_.g.gf) : TargetEngine::GraphShape{};
}

void DraftEngine::drop_cached_graph() {
    if (cached_.ctx) ggml_free(cached_.ctx);
    cached_ = Cached{};
    cached_inputs_.release();
}

void DraftEngine::reset() {
    n_committed_ = 0;
    n_pending_ = 0;
    pending_.clear();
    pending_rows_.clear();
}

void DraftEngine::truncate(int n) {
    if (n < 0) throw InvalidParameter("truncate: n must be >= 0");
    if (n >= n_ctx()) return;
    if (n >= n_committed_) {
        n_pending_ = n - n_committed_;
    } else {
        n_committed_ = n;
        n_pending_ = 0;
    }
    if (pending_on_target_) {
        pending_rows_.resize(n_pending_);
    } else {
        pending_.resize((size_t)n_pending_ * model_->hp.n_feature());
    }
}

void DraftEngine::begin_inject(int n, int pos0) {
    if (n < 0) throw InvalidParameter("inject: negative row count");
    if (pos0 < 0 || pos0 > n_ctx()) {
        throw InvalidParameter("inject: rows must continue the context (pos0 " + std::to_string(pos0) +
                               ", context rows " + std::to_string(n_ctx()) + ")");
    }
    if (pos0 + n > cfg_.n_ctx) throw ContextOverflow(pos0 + n, cfg_.n_ctx);
    truncate(pos0);
}

void DraftEngine::inject(const float * rows, int n, int pos0) {
    begin_inject(n, pos0);
    if (pending_on_target_) flush();
    pending_on_target_ = false;
    pending_.insert(pending_.end(), rows, rows + (size_t)n * model_->hp.n_feature());
    n_pending_ += n;
    flush_full_chunks();
}

void DraftEngine::inject_target(const std::vector<int32_t> & rows, int pos0) {
    const int n = (int)rows.size();
    if (target_.feature_layers() != model_->hp.target_layers || !target_.features()) {
        throw InvalidParameter("inject_target: the target's last forward did not capture this drafter's layers");
    }
    const int64_t n_rows = target_.features()->ne[1];
    for (int32_t r : rows) {
        if (r < 0 || r >= n_rows)
            throw InvalidParameter("inject_target: feature row " + std::to_string(r) + " out of range");
    }
    begin_inject(n, pos0);
    // Rows of another forward (or host rows) go into the cache first.
    if (n_pending_ > 0 && (!pending_on_target_ || pending_gen_ != target_.feature_generation())) flush();
    pending_on_target_ = true;
    pending_gen_ = target_.feature_generation();
    pending_rows_.insert(pending_rows_.end(), rows.begin(), rows.end());
    n_pending_ += n;
    flush_full_chunks();
}

void DraftEngine::flush() {
    while (n_pending_ > 0) flush_rows(std::min(n_pending_, cfg_.n_batch));
}

DraftInputs DraftEngine::pending_inputs(int from, int n) const {
    if (n > 0 && pending_on_target_ && pending_gen_ != target_.feature_generation()) {
        // A caller bug, not bad input: the rows were overwritten by a later target forward.
        throw EngineError("queued feature rows were overwritten by a target forward before reaching the drafter");
    }
    DraftInputs in;
    if (pending_on_target_) {
        in.feat_rows = pending_rows_.data() + from;
    } else {
        in.feat = pending_.data() + (size_t)from * model_->hp.n_feature();
    }
    in.n_real_inject = n;
    in.inject_pos0 = n_committed_ + from;
    return in;
}

DraftSpec DraftEngine::spec_for(int n_inject, bool block, int start, bool top_k) const {
    const auto & hp = model_->hp;
    DraftSpec s;
    // Padded to whole blocks so that the chain loop (1..B accepted rows per step) reuses one graph.
    s.n_inject = n_inject == 0 ? 0 : std::min(round_up(n_inject, hp.block_size), round_up(cfg_.n_batch, hp.block_size));
    s.top_k = block && top_k ? cfg_.top_k : 0;
    s.top_temperature = cfg_.tree_temperature;
    if (n_inject > 0 && pending_on_target_) {
        s.feat_src = target_.features();
        s.feat_version = target_.features_version();
    }
    if (block) {
        s.n_block = hp.block_size;
        std::tie(s.kv_lo_sliding, s.kv_hi) = draft_kv_range(hp, start, hp.block_size, kv_.n_rows);
    }
    return s;
}

void DraftEngine::run(const DraftSpec & spec, const DraftInputs & in) {
    prepare(spec, in);
    if (!compute_and_read(sched_.get(), cached_.g.gf, {}))
        throw EngineError("the backend failed to compute the draft graph");
}

void DraftEngine::prepare(const DraftSpec & spec, const DraftInputs & in) {
    if (!cached_.ctx || !same_spec(cached_.spec, spec)) {
        drop_cached_graph();
        ggml_init_params p = {graph_mem_.size(), graph_mem_.data(), true};
        // Plan this graph's own allocation first (ggml would reuse the last plan when sizes fit,
        // ignoring which tensors are outputs), on a throwaway build: a graph the scheduler split
        // once has its sources rewired to input copies and must not be split again.
        {
            std::unique_ptr<ggml_context, void (*)(ggml_context *)> plan_ctx(ggml_init(p), ggml_free);
            DraftGraph plan = build_dflash_draft(plan_ctx.get(), *model_, kv_, spec);
            ggml_backend_sched_reset(sched_.get());
            if (!ggml_backend_sched_reserve(sched_.get(), plan.gf)) throw EngineError("could not plan the draft graph");
        }
        cached_.ctx = ggml_init(p);
        cached_.g = build_dflash_draft(cached_.ctx, *model_, kv_, spec);
        cached_.spec = spec;
        graphs_built_++;
        if (device_inputs_enabled() &&
            cached_inputs_.allocate(cached_.g.gf, backends_.main_buft, kDeviceInputsMaxBytes)) {
            cached_.g.upload = backends_.main;
        }
        if (!ggml_backend_sched_alloc_graph(sched_.get(), cached_.g.gf)) {
            drop_cached_graph();
            throw EngineError("could not allocate the draft graph");
        }
    }
    set_dflash_inputs(cached_.g, *model_, kv_, spec, in);
}

void DraftEngine::flush_rows(int n) {
    run(spec_for(n, false, 0), pending_inputs(0, n));
    if (pending_on_target_) {
        pending_rows_.erase(pending_rows_.begin(), pending_rows_.begin() + n);
    } else {
        pending_.erase(pending_.begin(), pending_.begin() + (size_t)n * model_->hp.n_feature());
    }
    n_pending_ -= n;
    n_committed_ += n;
}

void DraftEngine::flush_full_chunks() {
    while (n_pending_ > cfg_.n_batch) flush_rows(cfg_.n_batch);
}

DraftResult DraftEngine::draft(int32_t anchor, int start, bool want_logits, bool want_top_k) {
    const auto & hp = model_->hp;
    if (anchor < 0 || anchor >= n_vocab_) {
        throw InvalidParameter("anchor token " + std::to_string(anchor) + " is outside the vocabulary (" +
                               std::to_string(n_vocab_) + ")");
    }
    if (start < n_ctx()) {
        throw InvalidParameter("draft: the block must start at or after the context (start " + std::to_string(start) +
                               ", context rows " + std::to_string(n_ctx()) + "); truncate first");
    }
    if (start > cfg_.n_ctx) throw ContextOverflow(start + 1, cfg_.n_ctx);

    DraftInputs in = pending_inputs(0, n_pending_);
    in.anchor = anchor;
    in.start = start;
    in.n_ctx = n_ctx();
    in.all_bidirectional = cfg_.all_bidirectional;
    const DraftSpec spec = spec_for(n_pending_, true, start, want_top_k);
    prepare(spec, in);
    const DraftGraph & g = cached_.g;
    const int n_out = hp.block_size - 1, K = spec.top_k;
    DraftResult r;
    r.argmax.resize(n_out);
    std::vector<Readback> reads = {{g.argmax, r.argmax.data(), sizeof(int32_t) * n_out}};
    if (want_logits) {
        r.logits.resize((size_t)n_out * n_vocab_);
        reads.push_back({g.logits, r.logits.data(), sizeof(float) * r.logits.size()});
    }
    std::vector<int32_t> ids((size_t)K * n_out);
    std::vector<float> lp((size_t)K * n_out);
    if (K > 0) {
        reads.push_back({g.top_ids, ids.data(), sizeof(int32_t) * ids.size()});
        reads.push_back({g.top_logp, lp.data(), sizeof(float) * lp.size()});
    }
    if (!compute_and_read(sched_.get(), g.gf, reads))
        throw EngineError("the backend failed to compute the draft graph");
    n_committed_ += n_pending_;
    n_pending_ = 0;
    pending_.clear();
    pending_rows_.clear();
    if (K == 0) return r;
    // ggml_top_k leaves each row unordered: sort by log-probability (ties by token id).
    r.top_ids.resize(ids.size());
    r.top_logp.resize(lp.size());
    std::vector<int> order(K);
    for (int s = 0; s < n_out; ++s) {
        const size_t o = (size_t)s * K;
        std::iota(order.begin(), order.end(), 0);
        std::sort(order.begin(), order.end(), [&](int a, int b) {
            return lp[o + a] != lp[o + b] ? lp[o + a] > lp[o + b] : ids[o + a] < ids[o + b];
        });
        for (int k = 0; k < K; ++k) {
            r.top_ids[o + k] = ids[o + order[k]];
            r.top_logp[o + k] = lp[o + order[k]];
        }
    }
    return r;
}

}  // namespace dflash
