#include "dflash_model.h"

#include "errors.h"
#include "ggml-alloc.h"
#include "ggml.h"
#include "gguf_file.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <set>
#include <sstream>

namespace dflash {

static const char * ARCH = "dflash";

static std::string key(const char * suffix) { return std::string(ARCH) + "." + suffix; }

static void require(bool ok, const std::string & what) {
    if (!ok) throw ModelLoadError(what);
}

static std::string shape_str(const int64_t * ne) {
    std::ostringstream s;
    s << "[" << ne[0] << ", " << ne[1] << ", " << ne[2] << ", " << ne[3] << "]";
    return s.str();
}

static std::string list_str(const std::vector<int> & v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
}

// A per-layer bool array key; empty when absent, an error when present but too short.
static std::vector<bool> layer_flags(const GgufFile & f, const std::string & k, int64_t n_layer) {
    const auto v = f.get_int_array(k);
    if (v.empty()) return {};
    require((int64_t)v.size() >= n_layer, "GGUF key '" + k + "' has " + std::to_string(v.size()) + " values for " +
                                              std::to_string(n_layer) + " layers in " + f.path());
    std::vector<bool> out(n_layer);
    for (int64_t i = 0; i < n_layer; ++i) out[i] = v[i] != 0;
    return out;
}

DflashModel::DflashModel(const GgufFile & f) : path_(f.path()) {
    const std::string arch = f.arch();
    require(arch == ARCH,
            "'" + f.path() + "' is not a DFlash drafter (architecture '" + arch + "', expected 'dflash')");
    name = f.get_str("general.name", "dflash");

    hp.n_layer = f.get_int(key("block_count"), true);
    require(hp.n_layer > 0 && hp.n_layer <= 256, "implausible drafter block_count " + std::to_string(hp.n_layer));
    hp.n_embd = f.get_int(key("embedding_length"), true);
    hp.n_ctx_train = f.get_int(key("context_length"), false, 0);
    const auto ff = f.get_int_or_array(key("feed_forward_length"), (size_t)hp.n_layer, true);
    const auto nh = f.get_int_or_array(key("attention.head_count"), (size_t)hp.n_layer, true);
    const auto nkv = f.get_int_or_array(key("attention.head_count_kv"), (size_t)hp.n_layer, false, nh[0]);
    hp.n_ff = ff[0];
    hp.n_head = nh[0];
    hp.n_head_kv = nkv[0];
    for (int64_t i = 0; i < hp.n_layer; ++i) {
        require(ff[i] == hp.n_ff && nh[i] == hp.n_head && nkv[i] == hp.n_head_kv,
                "drafter layers with different feed_forward_length/head counts are not supported");
    }
    require(hp.n_embd > 0 && hp.n_ff > 0 && hp.n_head > 0 && hp.n_head_kv > 0 && hp.n_head % hp.n_head_kv == 0,
            "invalid drafter attention shape: heads " + std::to_string(hp.n_head) + ", kv heads " +
                std::to_string(hp.n_head_kv));
    hp.head_dim = f.get_int(key("attention.key_length"), false, hp.n_embd / hp.n_head);
    require(hp.head_dim > 0 && f.get_int(key("attention.value_length"), false, hp.head_dim) == hp.head_dim,
            "drafter attention.value_length must equal key_length (and be positive)");
    hp.rms_eps = (float)f.get_float(key("attention.layer_norm_rms_epsilon"), true);
    require(hp.rms_eps > 0.0f && hp.rms_eps < 1.0f, "drafter rms epsilon out of range");
    hp.attn_scale = (float)f.get_float(key("attention.scale"), false, 0.0);

    // RoPE: NeoX over the first n_rot dims. A draft for an M-RoPE target carries sections
    // [n_rot/2, 0, 0, 0]: every pair on the text axis, which is exactly NeoX.
    hp.rope_freq_base = (float)f.get_float(key("rope.freq_base"), false, 10000.0);
    require(hp.rope_freq_base > 0.0f, "drafter rope.freq_base must be positive");
    hp.n_rot = (int)f.get_int(key("rope.dimension_count"), false, hp.head_dim);
    require(hp.n_rot > 0 && hp.n_rot <= hp.head_dim && hp.n_rot % 2 == 0,
            "drafter rope.dimension_count " + std::to_string(hp.n_rot) + " must be even and <= head dim " +
                std::to_string(hp.head_dim));
    const auto sec = f.get_int_array(key("rope.dimension_sections"));
    const bool any_sec = std::any_of(sec.begin(), sec.end(), [](int64_t s) { return s != 0; });
    if (any_sec) {
        bool text_only = sec[0] * 2 == hp.n_rot;
        for (size_t i = 1; i < sec.size(); ++i) text_only = text_only && sec[i] == 0;
        require(text_only, "drafter rope.dimension_sections must be [n_rot/2, 0, 0, 0] (text-only M-RoPE)");
    }
    const std::string scaling = f.get_str(key("rope.scaling.type"), "none");
    if (scaling == "linear") {
        const double factor = f.get_float(key("rope.scaling.factor"), true);
        require(factor > 0.0, "drafter rope.scaling.factor must be positive");
        hp.rope_freq_scale = (float)(1.0 / factor);
    } else {
        require(scaling == "none", "drafter rope scaling '" + scaling + "' is not supported (none or linear)");
    }

    hp.block_size = (int)f.get_int(key("block_size"), false, 16);
    require(hp.block_size >= 2 && hp.block_size <= 256,
            "drafter block_size " + std::to_string(hp.block_size) + " out of range [2, 256]");
    const auto tl = f.get_int_array(key("target_layers"));
    require(!tl.empty(), "GGUF key '" + key("target_layers") + "' is missing or empty in " + f.path());
    for (int64_t id : tl) {
        // The file stores HF id + 1 (upstream taps the input of the next layer).
        require(id >= 1 && id <= 4096, "drafter target layer " + std::to_string(id) + " out of range in " + f.path());
        hp.target_layers.push_back((int)id - 1);
    }
    hp.n_target_layers_trained = f.get_int(key("num_target_layers"), false, 0);
    hp.n_vocab = f.get_int(key("vocab_size"), false, 0);
    hp.mask_token_id = (int32_t)f.get_int("tokenizer.ggml.mask_token_id", true);
    require(hp.mask_token_id >= 0, "drafter mask token id must be >= 0");

    hp.sliding_window = f.get_int(key("attention.sliding_window"), false, 0);
    require(hp.sliding_window >= 0, "drafter sliding_window must be >= 0");
    hp.is_sliding.assign(hp.n_layer, false);
    if (hp.sliding_window > 0) {
        hp.is_sliding = layer_flags(f, key("attention.sliding_window_pattern"), hp.n_layer);
        require(!hp.is_sliding.empty(), "drafter has a sliding_window but no sliding_window_pattern");
    }
    // Causality inside the block: our per-layer key, else upstream's global flag, else the
    // reference rule (sliding layers causal, full layers bidirectional).
    hp.causal = layer_flags(f, key("attention.causal_layers"), hp.n_layer);
    if (hp.causal.empty()) {
        if (f.has(key("attention.causal"))) {
            hp.causal.assign(hp.n_layer, f.get_int(key("attention.causal"), true) != 0);
        } else {
            hp.causal = hp.is_sliding;
        }
    }

    // Tensors: exactly the plain DFlash set. Variants (DFlash2 selector, DSpark heads, reduced
    // vocabularies, own embeddings) carry extra tensors and are refused by name.
    const int64_t E = hp.n_embd, hd = hp.head_dim;
    fc = take(f, "fc.weight", {hp.n_feature(), E});
    hidden_norm = take(f, "enc.output_norm.weight", {E});
    output_norm = take(f, "output_norm.weight", {E});
    layers.resize(hp.n_layer);
    for (int64_t il = 0; il < hp.n_layer; ++il) {
        auto & L = layers[il];
        auto bn = [&](const char * s) { return "blk." + std::to_string(il) + "." + s; };
        L.attn_norm = take(f, bn("attn_norm.weight"), {E});
        L.wq = take(f, bn("attn_q.weight"), {E, hd * hp.n_head});
        L.wk = take(f, bn("attn_k.weight"), {E, hd * hp.n_head_kv});
        L.wv = take(f, bn("attn_v.weight"), {E, hd * hp.n_head_kv});
        L.wo = take(f, bn("attn_output.weight"), {hd * hp.n_head, E});
        L.q_norm = take(f, bn("attn_q_norm.weight"), {hd});
        L.k_norm = take(f, bn("attn_k_norm.weight"), {hd});
        L.ffn_norm = take(f, bn("ffn_norm.weight"), {E});
        L.ffn_gate = take(f, bn("ffn_gate.weight"), {E, hp.n_ff});
        L.ffn_up = take(f, bn("ffn_up.weight"), {E, hp.n_ff});
        L.ffn_down = take(f, bn("ffn_down.weight"), {hp.n_ff, E});
    }
    std::set<std::string> known;
    for (const auto & n : weights_.names()) known.insert(n);
    for (ggml_tensor * t = ggml_get_first_tensor(f.meta()); t; t = ggml_get_next_tensor(f.meta(), t)) {
        require(known.count(ggml_get_name(t)) != 0,
                "unexpected tensor '" + std::string(ggml_get_name(t)) + "' in " + f.path() +
                    ": this DFlash variant (own embedding/LM head, DFlash2, DSpark, ...) is not supported");
    }
}

ggml_tensor * DflashModel::take(const GgufFile & f, const std::string & tname, std::vector<int64_t> shape) {
    ggml_tensor * src = f.tensor(tname);
    require(src != nullptr, "tensor '" + tname + "' is missing in " + f.path());
    int64_t want[GGML_MAX_DIMS] = {1, 1, 1, 1};
    for (size_t i = 0; i < shape.size(); ++i) want[i] = shape[i];
    bool ok = true;
    for (int i = 0; i < GGML_MAX_DIMS; ++i) ok = ok && src->ne[i] == want[i];
    require(ok, "tensor '" + tname + "' has shape " + shape_str(src->ne) + ", expected " + shape_str(want) + " in " +
                    f.path());
    if (shape.size() == 1) {
        // Norm weights feed elementwise ops, which need f32 (converters keep 1-D tensors f32).
        require(src->type == GGML_TYPE_F32, "tensor '" + tname + "' must be f32, found " + ggml_type_name(src->type));
    }
    return weights_.add(src, tname);
}

void DflashModel::bind_target(const Qwen35Model & target) {
    const auto & th = target.hp;
    require(hp.n_embd == th.n_embd, "drafter hidden size " + std::to_string(hp.n_embd) +
                                        " does not match the target's " + std::to_string(th.n_embd));
    for (int id : hp.target_layers) {
        require(id < th.n_layer, "drafter target layers " + list_str(hp.target_layers) +
                                     " (HF ids) are out of range for the target's " + std::to_string(th.n_layer) +
                                     " layers");
    }
    require(hp.n_target_layers_trained == 0 || hp.n_target_layers_trained == th.n_layer,
            "drafter was trained for a " + std::to_string(hp.n_target_layers_trained) +
                "-layer target; this target has " + std::to_string(th.n_layer) + " layers");
    require(hp.n_vocab == 0 || hp.n_vocab == th.n_vocab, "drafter vocabulary size " + std::to_string(hp.n_vocab) +
                                                             " does not match the target's " +
                                                             std::to_string(th.n_vocab));
    require(hp.mask_token_id < th.n_vocab, "drafter mask token id " + std::to_string(hp.mask_token_id) +
                                               " is outside the target vocabulary (" + std::to_string(th.n_vocab) +
                                               ")");
    tok_embd = target.tok_embd;
    output = target.output;
}

void DflashModel::assign_buffers(const Backends & b) {
    // The embedding is read with get_rows and conv kernels elementwise: default buffer type.
    weights_.assign_buffers(b, [this](const ggml_tensor * w, const std::string & n) { return true; });
}

size_t DflashModel::weight_bytes() const { return weights_.bytes(); }

void DflashModel::load(const GgufFile & f, const ProgressFn & progress) {
    weights_.load(f, progress, "drafter weights");
}

DflashModel::~DflashModel() = default;

}  // namespace dflash
