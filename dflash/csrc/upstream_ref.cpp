#include "upstream_ref.h"

#include "errors.h"
#include "kv_types.h"
#include "llama.h"
#include "vocab.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace dflash {

static double now_ms() {
    using namespace std::chrono;
    return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

UpstreamModel::UpstreamModel(const std::string & path, const UpstreamConfig & cfg) : cfg_(cfg) {
    const ggml_type kt = parse_kv_type(cfg.k_type), vt = parse_kv_type(cfg.v_type);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = cfg.n_gpu_layers < 0 ? 999 : cfg.n_gpu_layers;
    model_ = llama_model_load_from_file(path.c_str(), mp);
    if (!model_) throw ModelLoadError("upstream llama.cpp could not load " + path + ": " + last_log_error());
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = cfg.n_ctx;
    cp.n_batch = cfg.n_batch;
    cp.n_ubatch = cfg.n_batch;
    cp.n_seq_max = 1;
    cp.type_k = kt;
    cp.type_v = vt;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    const int nt = cfg.n_threads > 0 ? cfg.n_threads : (int) std::max(1u, std::thread::hardware_concurrency());
    cp.n_threads = nt;
    cp.n_threads_batch = nt;
    cp.no_perf = true;
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
    for (size_t i = 0; i < tokens.size(); i += cfg_.n_batch) chunks.push_back((int) std::min<size_t>(cfg_.n_batch, tokens.size() - i));
    return eval_chunks(tokens, chunks);
}

std::vector<float> UpstreamModel::eval_chunks(const std::vector<int32_t> & tokens, const std::vector<int> & chunks) {
    if ((int) tokens.size() > cfg_.n_ctx) throw ContextOverflow((int) tokens.size(), cfg_.n_ctx);
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
        decode(tokens.data() + i, n, (int) i, true);
        for (int j = 0; j < n; ++j) {
            const float * l = llama_get_logits_ith(ctx_, j);
            out.insert(out.end(), l, l + V);
        }
        i += n;
    }
    return out;
}

std::vector<int32_t> UpstreamModel::greedy(const std::vector<int32_t> & prompt, int n_gen, UpstreamTimings * tm) {
    if ((int) prompt.size() + n_gen > cfg_.n_ctx) throw ContextOverflow((int) prompt.size() + n_gen, cfg_.n_ctx);
    clear();
    const int V = n_vocab();
    double t0 = now_ms();
    for (size_t i = 0; i < prompt.size(); i += cfg_.n_batch) {
        const int n = (int) std::min<size_t>(cfg_.n_batch, prompt.size() - i);
        decode(prompt.data() + i, n, (int) i, false);
    }
    llama_synchronize(ctx_);
    if (tm) tm->prefill_ms = now_ms() - t0;
    std::vector<int32_t> out;
    int pos = (int) prompt.size();
    for (int i = 0; i < n_gen; ++i) {
        const float * l = llama_get_logits_ith(ctx_, -1);
        const int32_t tok = (int32_t) (std::max_element(l, l + V) - l);
        out.push_back(tok);
        if (i + 1 == n_gen) break;
        t0 = now_ms();
        decode(&tok, 1, pos++, false);
        llama_synchronize(ctx_);
        if (tm) tm->decode_ms.push_back(now_ms() - t0);
    }
    return out;
}

}  // namespace dflash
