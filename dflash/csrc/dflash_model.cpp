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
    for (auto & ft : file_tensors_) known.insert(ft.second);
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
    if (!ctx_) {
        ggml_init_params p = {ggml_tensor_overhead() * (size_t)(16 * hp.n_layer + 16), nullptr, true};
        ctx_ = ggml_init(p);
    }
    ggml_tensor * t = ggml_dup_tensor(ctx_, src);
    ggml_set_name(t, tname.c_str());
    file_tensors_.emplace_back(t, tname);
    return t;
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
    // As for the target: a device "extra" buffer type (the CPU's repacked layouts) where it
    // takes the weight's matmul, else the default type.
    std::vector<ggml_backend_buffer_type_t> extra;
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(b.main_dev);
    auto get_extra = reg ? (ggml_backend_dev_get_extra_bufts_t)ggml_backend_reg_get_proc_address(
                               reg, "ggml_backend_dev_get_extra_bufts")
                         : nullptr;
    if (get_extra) {
        for (auto ** p = get_extra(b.main_dev); p && *p; ++p) extra.push_back(*p);
    }
    ggml_init_params ip = {ggml_tensor_overhead() * 8, nullptr, true};
    ggml_context * probe = ggml_init(ip);
    buft_of_.assign(file_tensors_.size(), b.main_buft);
    for (size_t i = 0; i < file_tensors_.size(); ++i) {
        ggml_tensor * w = file_tensors_[i].first;
        if (ggml_n_dims(w) != 2) continue;
        for (auto * buft : extra) {
            ggml_tensor * x = ggml_new_tensor_2d(probe, GGML_TYPE_F32, w->ne[0], 1);
            ggml_tensor * op = ggml_mul_mat(probe, w, x);
            ggml_backend_buffer_t dummy = ggml_backend_buft_alloc_buffer(buft, 0);
            ggml_backend_buffer_t saved = w->buffer;
            w->buffer = dummy;
            const bool ok = ggml_backend_dev_supports_op(b.main_dev, op);
            w->buffer = saved;
            ggml_backend_buffer_free(dummy);
            ggml_reset(probe);
            if (ok) {
                buft_of_[i] = buft;
                break;
            }
        }
    }
    ggml_free(probe);
}

size_t DflashModel::weight_bytes() const {
    size_t total = 0;
    for (size_t i = 0; i < file_tensors_.size(); ++i) {
        total += GGML_PAD(ggml_backend_buft_get_alloc_size(buft_of_[i], file_tensors_[i].first),
                          ggml_backend_buft_get_alignment(buft_of_[i]));
    }
    return total;
}

void DflashModel::load(const GgufFile & f, const ProgressFn & progress) {
    std::vector<ggml_backend_buffer_type_t> types;
    for (auto * bt : buft_of_) {
        if (std::find(types.begin(), types.end(), bt) == types.end()) types.push_back(bt);
    }
    for (auto * bt : types) {
        size_t size = 0;
        const size_t align = ggml_backend_buft_get_alignment(bt);
        for (size_t i = 0; i < file_tensors_.size(); ++i) {
            if (buft_of_[i] == bt)
                size += GGML_PAD(ggml_backend_buft_get_alloc_size(bt, file_tensors_[i].first), align);
        }
        ggml_backend_buffer_t buf = ggml_backend_buft_alloc_buffer(bt, size);
        if (!buf)
            throw ModelLoadError("could not allocate " + std::to_string(size >> 20) + " MiB for the drafter weights");
        ggml_backend_buffer_set_usage(buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
        bufs_.push_back(buf);
        ggml_tallocr ta = ggml_tallocr_new(buf);
        for (size_t i = 0; i < file_tensors_.size(); ++i) {
            if (buft_of_[i] == bt) ggml_tallocr_alloc(&ta, file_tensors_[i].first);
        }
    }
    std::unique_ptr<FILE, int (*)(FILE *)> fp(fopen(f.path().c_str(), "rb"), fclose);
    if (!fp) throw ModelLoadError("cannot open " + f.path());
    size_t total = 0, done = 0;
    for (auto & [t, n] : file_tensors_) total += ggml_nbytes(t);
    std::vector<uint8_t> staging;
    for (auto & [t, n] : file_tensors_) {
        const size_t nbytes = ggml_nbytes(t);
        if (fseeko(fp.get(), (off_t)f.tensor_file_offset(n), SEEK_SET) != 0) {
            throw ModelLoadError("seek failed in " + f.path());
        }
        staging.resize(nbytes);
        if (fread(staging.data(), 1, nbytes, fp.get()) != nbytes) {
            throw ModelLoadError("read failed (truncated?) in " + f.path());
        }
        ggml_backend_tensor_set(t, staging.data(), 0, nbytes);
        done += nbytes;
        if (progress) progress(done, total);
    }
}

DflashModel::~DflashModel() {
    for (auto * b : bufs_) ggml_backend_buffer_free(b);
    if (ctx_) ggml_free(ctx_);
}

}  // namespace dflash
