#include "vocab.h"

#include "errors.h"
#include "gguf_file.h"
#include "llama.h"

#include <cstdio>
#include <mutex>
#include <unordered_set>

namespace dflash {

namespace {
std::mutex g_log_mu;
bool g_verbose = false;
std::string g_errors;  // error lines since the last reset_log_errors()

void log_cb(ggml_log_level level, const char * text, void *) {
    std::lock_guard<std::mutex> lk(g_log_mu);
    if (level == GGML_LOG_LEVEL_ERROR && g_errors.size() < 4096) g_errors += text;
    if (g_verbose || level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}
}  // namespace

void set_log_verbosity(bool verbose) {
    std::lock_guard<std::mutex> lk(g_log_mu);
    g_verbose = verbose;
    llama_log_set(log_cb, nullptr);
}

void reset_log_errors() {
    std::lock_guard<std::mutex> lk(g_log_mu);
    g_errors.clear();
}

std::string last_log_error() {
    std::lock_guard<std::mutex> lk(g_log_mu);
    // One line: the errors since the reset, joined, the first (the cause) first.
    std::string s;
    for (char c : g_errors) s += c == '\n' ? ' ' : c;
    while (!s.empty() && s.back() == ' ') s.pop_back();
    return s;
}

// libllama asserts (aborts) on some malformed vocabularies, e.g. duplicate token strings;
// check those here first so a bad file is an exception, not a crash.
static void check_tokenizer_metadata(const std::string & path) {
    GgufFile f(path);
    // libllama's hparams loader asserts on this one (vocab-only loads read hparams too).
    const std::string arch = f.arch();
    if (!arch.empty() && f.has(arch + ".nextn_predict_layers") &&
        f.get_int(arch + ".nextn_predict_layers", false) > f.get_int(arch + ".block_count", false, 0)) {
        throw ModelLoadError(arch + ".nextn_predict_layers exceeds block_count in " + path);
    }
    const std::string model = f.get_str("tokenizer.ggml.model", "");
    if (model != "gpt2") {
        throw ModelLoadError("unsupported tokenizer model '" + model + "' in " + path +
                             " (qwen35 GGUFs carry a gpt2-style BPE vocabulary)");
    }
    const auto tokens = f.get_str_array("tokenizer.ggml.tokens");
    if (tokens.empty()) throw ModelLoadError("tokenizer.ggml.tokens is missing or not a string array in " + path);
    std::unordered_set<std::string> seen(tokens.begin(), tokens.end());
    if (seen.size() != tokens.size()) throw ModelLoadError("tokenizer.ggml.tokens has duplicate entries in " + path);
    if (f.get_str_array("tokenizer.ggml.merges").empty()) {
        throw ModelLoadError("tokenizer.ggml.merges is missing or not a string array in " + path);
    }
    for (const char * key :
         {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
          "tokenizer.ggml.padding_token_id", "tokenizer.ggml.unknown_token_id"}) {
        const int64_t id = f.get_int(key, false, -1);
        if (id < -1 || id >= (int64_t)tokens.size()) {
            throw ModelLoadError(std::string(key) + " = " + std::to_string(id) + " is outside the vocabulary in " +
                                 path);
        }
    }
}

Vocab::Vocab(const std::string & path) {
    check_tokenizer_metadata(path);
    reset_log_errors();
    llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    mp.n_gpu_layers = 0;
    model_ = llama_model_load_from_file(path.c_str(), mp);
    if (!model_) {
        throw ModelLoadError("could not load the tokenizer from " + path + ": " + last_log_error());
    }
    vocab_ = llama_model_get_vocab(model_);
}

Vocab::~Vocab() {
    if (model_) llama_model_free(model_);
}

std::vector<int32_t> Vocab::tokenize(const std::string & text, bool add_special, bool parse_special) const {
    std::vector<int32_t> out(text.size() + 8);
    int n = llama_tokenize(vocab_, text.data(), (int32_t)text.size(), out.data(), (int32_t)out.size(), add_special,
                           parse_special);
    if (n < 0) {
        out.resize(-n);
        n = llama_tokenize(vocab_, text.data(), (int32_t)text.size(), out.data(), (int32_t)out.size(), add_special,
                           parse_special);
    }
    if (n < 0) throw InvalidParameter("tokenization failed");
    out.resize(n);
    return out;
}

std::string Vocab::detokenize(const std::vector<int32_t> & tokens, bool remove_special, bool unparse_special) const {
    const int32_t nv = n_tokens();
    for (int32_t t : tokens) {
        if (t < 0 || t >= nv) throw InvalidParameter("token id " + std::to_string(t) + " is outside the vocabulary");
    }
    std::string out(tokens.size() * 8 + 16, '\0');
    int n = llama_detokenize(vocab_, tokens.data(), (int32_t)tokens.size(), out.data(), (int32_t)out.size(),
                             remove_special, unparse_special);
    if (n < 0) {
        out.resize(-n);
        n = llama_detokenize(vocab_, tokens.data(), (int32_t)tokens.size(), out.data(), (int32_t)out.size(),
                             remove_special, unparse_special);
    }
    if (n < 0) throw InvalidParameter("detokenization failed");
    out.resize(n);
    return out;
}

std::string Vocab::token_to_piece(int32_t token, bool special) const {
    if (token < 0 || token >= n_tokens()) throw InvalidParameter("token id out of range");
    char buf[256];
    int n = llama_token_to_piece(vocab_, token, buf, sizeof buf, 0, special);
    if (n < 0) {
        std::string s(-n, '\0');
        n = llama_token_to_piece(vocab_, token, s.data(), (int32_t)s.size(), 0, special);
        s.resize(std::max(n, 0));
        return s;
    }
    return std::string(buf, n);
}

int32_t Vocab::n_tokens() const { return llama_vocab_n_tokens(vocab_); }
int32_t Vocab::bos() const { return llama_vocab_bos(vocab_); }
int32_t Vocab::eos() const { return llama_vocab_eos(vocab_); }
int32_t Vocab::eot() const { return llama_vocab_eot(vocab_); }
bool Vocab::add_bos() const { return llama_vocab_get_add_bos(vocab_); }
bool Vocab::is_eog(int32_t token) const { return llama_vocab_is_eog(vocab_, token); }

std::vector<int32_t> Vocab::eog_tokens() const {
    std::vector<int32_t> out;
    const int32_t n = n_tokens();
    for (int32_t t = 0; t < n; ++t) {
        if (llama_vocab_is_eog(vocab_, t)) out.push_back(t);
    }
    return out;
}

std::string Vocab::chat_template() const {
    const char * t = llama_model_chat_template(model_, nullptr);
    return t ? t : "";
}

std::string Vocab::meta(const std::string & key) const {
    char buf[512];
    const int n = llama_model_meta_val_str(model_, key.c_str(), buf, sizeof buf);
    if (n < 0) return "";
    if ((size_t)n >= sizeof buf) {
        std::string s(n + 1, '\0');
        llama_model_meta_val_str(model_, key.c_str(), s.data(), s.size());
        s.resize(n);
        return s;
    }
    return std::string(buf, n);
}

}  // namespace dflash
