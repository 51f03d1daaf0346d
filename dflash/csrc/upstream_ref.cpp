#include "upstream_ref.h"

#include "errors.h"
#include "kv_types.h"
#include "llama.h"
#include "vocab.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <thread>

// From upstream's staging header src/llama-ext.h, which is not on the public include path.
LLAMA_API void llama_set_embeddings_layer_inp(struct llama_context * ctx, uint32_t lid, bool value);
LLAMA_API float * llama_get_embeddings_layer_inp(struct llama_context * ctx, uint32_t lid);
LLAMA_API const int32_t * llama_model_target_layer_ids(const struct llama_model * model);
LLAMA_API uint32_t llama_model_target_layer_ids_n(const struct llama_model * model);

namespace dflash {

static double now_ms() {
    using namespace std::chrono;
    return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

static llama_model * load_model(const std::string & path, const UpstreamConfig & cfg) {
    llama_backend_init();
    reset_log_errors();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = cfg.n_gpu_layers < 0 ? 999 : cfg.n_gpu_layers;
    llama_model * m = llama_model_load_from_file(path.c_str(), mp);
    if (!m) throw ModelLoadError("upstream llama.cpp could not load " + path + ": " + last_log_error());
    return m;
}

static llama_context_params context_params(const UpstreamConfig & cfg) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = cfg.n_ctx;
    cp.n_batch = cfg.n_batch;
    cp.n_ubatch = cfg.n_batch;
    cp.n_seq_max = 1;
    cp.type_k = parse_kv_type(cfg.k_type);
    cp.type_v = parse_kv_type(cfg.v_type);
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    const int nt = cfg.n_threads > 0 ? cfg.n_threads : (int)std::max(1u, std::thread::hardware_concurrency());
    cp.n_threads = nt;
    cp.n_threads_batch = nt;
    cp.no_perf = true;
    return cp;
}

UpstreamModel::UpstreamModel(const std::string & path, const UpstreamConfig & cfg) : cfg_(cfg) {
    const llama_context_params cp = context_params(cfg);  // validates the KV types first
    model_ = load_model(path, cfg);
    ctx_ = llama_init_from_model(model_, cp);
    if (!ctx_) throw ModelLoadError("upstream llama.cpp could not create a context: " + last_log_error());
}

UpstreamModel::~UpstreamModel() {
    if (ctx_) llama_free(ctx_);
    if (model_) llama_model_free(model_);
}

int32_t UpstreamModel::n_vocab() const { return llama_vocab_n_tokens(llama_model_get_vocab(model_)); }

void UpstreamModel::clear() { llama_memory_clear(llama_get_memory(ctx_), true); }

void UpstreamModel::decode(const int32_t * tokens, int n, int pos0, bool all_logits) {
    llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; ++i) {
        b.token[i] = tokens[i];
        b.pos[i] = pos0 + i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = all_logits || i == n - 1;
    }
    b.n_tokens = n;
    const int rc = llama_decode(ctx_, b);
    llama_batch_free(b);
    if (rc != 0) throw EngineError("llama_decode failed with code " + std::to_string(rc));
}

std::vector<float> UpstreamModel::eval_logits(const std::vector<int32_t> & tokens) {
    std::vector<int> chunks;
    for (size_t i = 0; i < tokens.size(); i += cfg_.n_batch)
        chunks.push_back((int)std::min<size_t>(cfg_.n_batch, tokens.size() - i));
    return eval_chunks(tokens, chunks);
}

std::vector<float> UpstreamModel::eval_chunks(const std::vector<int32_t> & tokens, const std::vector<int> & chunks) {
    if ((int)tokens.size() > cfg_.n_ctx) throw ContextOverflow((int)tokens.size(), cfg_.n_ctx);
    size_t total = 0;
    for (int c : chunks) {
        if (c < 1 || c > cfg_.n_batch) throw InvalidParameter("chunk size out of range");
        total += c;
    }
    if (total != tokens.size()) throw InvalidParameter("chunk sizes do not add up to the token count");
    clear();
    const int V = n_vocab();
    const int32_t nv = V;
    for (int32_t t : tokens) {
        if (t < 0 || t >= nv) throw InvalidParameter("token id outside the vocabulary");
    }
    std::vector<float> out;
    size_t i = 0;
    for (int n : chunks) {
        decode(tokens.data() + i, n, (int)i, true);
        for (int j = 0; j < n; ++j) {
            const float * l = llama_get_logits_ith(ctx_, j);
            out.insert(out.end(), l, l + V);
        }
        i += n;
    }
    return out;
}

double UpstreamModel::time_decode(const std::vector<int32_t> & prefix, const std::vector<int32_t> & tokens,
                                  bool all_logits) {
    const int n = (int)tokens.size();
    if (n < 1 || n > cfg_.n_batch) throw InvalidParameter("time_decode: 1..n_batch tokens");
    if ((int)(prefix.size() + tokens.size()) > cfg_.n_ctx) {
        throw ContextOverflow((int)(prefix.size() + tokens.size()), cfg_.n_ctx);
    }
    const int32_t V = n_vocab();
    for (const auto * v : {&prefix, &tokens}) {
        for (int32_t t : *v) {
            if (t < 0 || t >= V) throw InvalidParameter("token id outside the vocabulary");
        }
    }
    clear();
    for (size_t i = 0; i < prefix.size(); i += cfg_.n_batch) {
        decode(prefix.data() + i, (int)std::min<size_t>(cfg_.n_batch, prefix.size() - i), (int)i, false);
    }
    llama_synchronize(ctx_);
    const double t0 = now_ms();
    decode(tokens.data(), n, (int)prefix.size(), all_logits);
    llama_synchronize(ctx_);
    return now_ms() - t0;
}

std::vector<int32_t> UpstreamModel::greedy(const std::vector<int32_t> & prompt, int n_gen, UpstreamTimings * tm) {
    if ((int)prompt.size() + n_gen > cfg_.n_ctx) throw ContextOverflow((int)prompt.size() + n_gen, cfg_.n_ctx);
    clear();
    const int V = n_vocab();
    double t0 = now_ms();
    for (size_t i = 0; i < prompt.size(); i += cfg_.n_batch) {
        const int n = (int)std::min<size_t>(cfg_.n_batch, prompt.size() - i);
        decode(prompt.data() + i, n, (int)i, false);
    }
    llama_synchronize(ctx_);
    if (tm) tm->prefill_ms = now_ms() - t0;
    std::vector<int32_t> out;
    int pos = (int)prompt.size();
    for (int i = 0; i < n_gen; ++i) {
        const float * l = llama_get_logits_ith(ctx_, -1);
        const int32_t tok = (int32_t)(std::max_element(l, l + V) - l);
        out.push_back(tok);
        if (i + 1 == n_gen) break;
        t0 = now_ms();
        decode(&tok, 1, pos++, false);
        llama_synchronize(ctx_);
        if (tm) tm->decode_ms.push_back(now_ms() - t0);
    }
    return out;
}

UpstreamDraft::UpstreamDraft(const std::string & target_path, const std::string & draft_path,
                             const UpstreamConfig & cfg)
    : cfg_(cfg) {
    const llama_context_params tp = context_params(cfg);
    try {
        target_ = load_model(target_path, cfg);
        tctx_ = llama_init_from_model(target_, tp);
        if (!tctx_) throw ModelLoadError("upstream llama.cpp could not create the target context: " + last_log_error());
        draft_ = load_model(draft_path, cfg);
        const int32_t * ids = llama_model_target_layer_ids(draft_);
        layers_.assign(ids, ids + llama_model_target_layer_ids_n(draft_));
        char buf[32] = {};
        if (llama_model_meta_val_str(draft_, "dflash.block_size", buf, sizeof buf) >= 0) block_size_ = std::atoi(buf);
        mask_token_ = llama_vocab_mask(llama_model_get_vocab(draft_));
        if (block_size_ < 2 || block_size_ > cfg.n_batch || mask_token_ < 0) {
            throw ModelLoadError("upstream drafter has block size " + std::to_string(block_size_) + " and mask token " +
                                 std::to_string(mask_token_));
        }
        for (int32_t l : layers_) llama_set_embeddings_layer_inp(tctx_, (uint32_t)l, true);

        llama_context_params dp = tp;
        dp.ctx_other = tctx_;  // the draft reads the target's token embedding and LM head
        dctx_ = llama_init_from_model(draft_, dp);
        if (!dctx_) throw ModelLoadError("upstream llama.cpp could not create the draft context: " + last_log_error());
        llama_set_causal_attn(dctx_, false);
    } catch (...) {
        release();
        throw;
    }
}

UpstreamDraft::~UpstreamDraft() { release(); }

void UpstreamDraft::release() {
    if (dctx_) llama_free(dctx_);
    if (draft_) llama_model_free(draft_);
    if (tctx_) llama_free(tctx_);
    if (target_) llama_model_free(target_);
    dctx_ = tctx_ = nullptr;
    draft_ = target_ = nullptr;
}

int32_t UpstreamDraft::n_vocab() const { return llama_vocab_n_tokens(llama_model_get_vocab(target_)); }

int64_t UpstreamDraft::n_feature() const { return (int64_t)layers_.size() * llama_model_n_embd(target_); }

std::vector<float> UpstreamDraft::draft_logits(const std::vector<int32_t> & context, int32_t anchor,
                                               std::vector<float> * features) {
    const int n = (int)context.size();
    const int32_t V = n_vocab();
    if (n < 1 || n > cfg_.n_batch) throw InvalidParameter("the context must fit one batch of the target");
    if (n + block_size_ > cfg_.n_ctx) throw ContextOverflow(n + block_size_, cfg_.n_ctx);
    for (int32_t t : context) {
        if (t < 0 || t >= V) throw InvalidParameter("token id outside the vocabulary");
    }
    if (anchor < 0 || anchor >= V) throw InvalidParameter("anchor token outside the vocabulary");
    llama_memory_clear(llama_get_memory(tctx_), true);
    llama_memory_clear(llama_get_memory(dctx_), true);

    // Target prefill, extracting the drafter's layers for every token.
    llama_batch tb = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; ++i) {
        tb.token[i] = context[i];
        tb.pos[i] = i;
        tb.n_seq_id[i] = 1;
        tb.seq_id[i][0] = 0;
        tb.logits[i] = i == n - 1;
    }
    tb.n_tokens = n;
    const int rc = llama_decode(tctx_, tb);
    llama_batch_free(tb);
    if (rc != 0) throw EngineError("llama_decode (target) failed with code " + std::to_string(rc));
    const int64_t E = llama_model_n_embd(target_), nf = n_feature();
    std::vector<float> feat((size_t)n * nf);
    for (size_t k = 0; k < layers_.size(); ++k) {
        const float * src = llama_get_embeddings_layer_inp(tctx_, (uint32_t)layers_[k]);
        for (int i = 0; i < n; ++i) {
            std::copy(src + (size_t)i * E, src + (size_t)(i + 1) * E, feat.data() + i * nf + k * E);
        }
    }

    std::unique_ptr<llama_batch_ext, void (*)(llama_batch_ext *)> batch(llama_batch_ext_init(dctx_),
                                                                        llama_batch_ext_free);
    // Injection: one embedding row per context token at its position.
    for (int i = 0; i < n; ++i) {
        const int32_t idx = llama_batch_ext_add_embd(batch.get(), 0, {feat.data() + i * nf, 1, (size_t)nf});
        const llama_pos pos[4] = {i, i, i, 0};  // an M-RoPE draft reads four, others the first
        if (idx < 0 || !llama_batch_ext_set_pos(batch.get(), idx, pos)) {
            throw EngineError("could not build the injection batch");
        }
    }
    int rc2 = llama_process(dctx_, LLAMA_PROCESS_TYPE_DECODE, batch.get());
    if (rc2 != 0) throw EngineError("llama_process (draft injection) failed with code " + std::to_string(rc2));

    // The block [anchor, MASK x (B-1)] at positions n.., every slot's logits.
    llama_batch_ext_clear(batch.get());
    for (int i = 0; i < block_size_; ++i) {
        const int32_t idx = llama_batch_ext_add_token(batch.get(), 0, i == 0 ? anchor : mask_token_);
        const llama_pos pos = n + i;
        if (idx < 0 || !llama_batch_ext_set_pos(batch.get(), idx, &pos) ||
            !llama_batch_ext_set_output_logits(batch.get(), idx, true)) {
            throw EngineError("could not build the draft block batch");
        }
    }
    rc2 = llama_process(dctx_, LLAMA_PROCESS_TYPE_DECODE, batch.get());
    if (rc2 != 0) throw EngineError("llama_process (draft block) failed with code " + std::to_string(rc2));
    std::vector<float> out;
    out.reserve((size_t)(block_size_ - 1) * V);
    for (int i = 1; i < block_size_; ++i) {
        const float * l = llama_get_logits_ith(dctx_, i);
        out.insert(out.end(), l, l + V);
    }
    if (features) *features = std::move(feat);
    return out;
}

}  // namespace dflash
