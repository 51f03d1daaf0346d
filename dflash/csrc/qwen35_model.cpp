#include "qwen35_model.h"

#include "errors.h"
#include "ggml-alloc.h"
#include "ggml.h"
#include "gguf_file.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <sstream>

namespace dflash {

static const char * ARCH = "qwen35";

static std::string key(const char * suffix) { return std::string(ARCH) + "." + suffix; }

int64_t Qwen35Hparams::n_attn_layers() const {
    int64_t n = 0;
    for (int64_t i = 0; i < n_layer; ++i) n += is_recurrent[i] ? 0 : 1;
    return n;
}

static std::string shape_str(const int64_t * ne, int n) {
    std::ostringstream s;
    s << "[";
    for (int i = 0; i < n; ++i) s << (i ? ", " : "") << ne[i];
    s << "]";
    return s.str();
}

static void require(bool ok, const std::string & what) {
    if (!ok) throw ModelLoadError(what);
}

Qwen35Model::Qwen35Model(const GgufFile & f) {
    const std::string arch = f.arch();
    require(arch == ARCH,
            "unsupported model architecture '" + arch + "' in " + f.path() + " (dflash runs qwen35 targets)");
    name = f.get_str("general.name", "qwen35");

    const int64_t n_layer_all = f.get_int(key("block_count"), true);
    hp.n_layer_nextn = f.get_int(key("nextn_predict_layers"), false, 0);
    require(n_layer_all > 0 && n_layer_all < 4096, "implausible block_count " + std::to_string(n_layer_all));
    require(hp.n_layer_nextn >= 0 && hp.n_layer_nextn < n_layer_all,
            "nextn_predict_layers " + std::to_string(hp.n_layer_nextn) + " must be below block_count " +
                std::to_string(n_layer_all));
    hp.n_layer = n_layer_all - hp.n_layer_nextn;
    hp.n_embd = f.get_int(key("embedding_length"), true);
    hp.n_ctx_train = f.get_int(key("context_length"), false, 4096);
    const auto ff = f.get_int_or_array(key("feed_forward_length"), (size_t)n_layer_all, true);
    const auto nh = f.get_int_or_array(key("attention.head_count"), (size_t)n_layer_all, true);
    const auto nkv = f.get_int_or_array(key("attention.head_count_kv"), (size_t)n_layer_all, false, nh[0]);
    hp.n_ff = ff[0];
    hp.n_head = nh[0];
    hp.n_head_kv = nkv[0];
    for (int64_t i = 0; i < hp.n_layer; ++i) {
        require(ff[i] == hp.n_ff && nh[i] == hp.n_head && nkv[i] == hp.n_head_kv,
                "per-layer feed_forward_length/head counts that differ between layers are not supported");
    }
    require(
        hp.n_embd > 0 && hp.n_ff > 0 && hp.n_head > 0 && hp.n_head_kv > 0 && hp.n_head % hp.n_head_kv == 0,
        "invalid attention shape: heads " + std::to_string(hp.n_head) + ", kv heads " + std::to_string(hp.n_head_kv));
    hp.head_dim = f.get_int(key("attention.key_length"), false, hp.n_embd / hp.n_head);
    const int64_t v_len = f.get_int(key("attention.value_length"), false, hp.head_dim);
    require(v_len == hp.head_dim, "attention.value_length must equal key_length");
    hp.rms_eps = (float)f.get_float(key("attention.layer_norm_rms_epsilon"), true);
    hp.rope_freq_base = (float)f.get_float(key("rope.freq_base"), false, 10000.0);
    hp.attn_scale = (float)f.get_float(key("attention.scale"), false, 0.0);
    hp.n_rot = (int)f.get_int(key("rope.dimension_count"), false, hp.head_dim);
    require(hp.n_rot > 0 && hp.n_rot <= hp.head_dim && hp.n_rot % 2 == 0,
            "rope.dimension_count " + std::to_string(hp.n_rot) + " must be even and <= head dim " +
                std::to_string(hp.head_dim));
    auto sec = f.get_int_array(key("rope.dimension_sections"));
    for (size_t i = 0; i < 4 && i < sec.size(); ++i) hp.rope_sections[i] = (int)sec[i];

    hp.ssm_d_conv = f.get_int(key("ssm.conv_kernel"), true);
    hp.ssm_d_inner = f.get_int(key("ssm.inner_size"), true);
    hp.ssm_d_state = f.get_int(key("ssm.state_size"), true);
    hp.ssm_n_v_heads = f.get_int(key("ssm.time_step_rank"), true);
    hp.ssm_n_k_heads = f.get_int(key("ssm.group_count"), true);
    require(hp.ssm_d_conv >= 2 && hp.ssm_d_conv <= 16, "ssm.conv_kernel out of range");
    require(hp.ssm_d_state > 0 && hp.ssm_n_v_heads > 0 && hp.ssm_n_k_heads > 0 &&
                hp.ssm_n_v_heads % hp.ssm_n_k_heads == 0 && hp.ssm_d_inner == hp.ssm_d_state * hp.ssm_n_v_heads,
            "invalid Gated DeltaNet shape: inner " + std::to_string(hp.ssm_d_inner) + ", state " +
                std::to_string(hp.ssm_d_state) + ", v heads " + std::to_string(hp.ssm_n_v_heads) + ", k heads " +
                std::to_string(hp.ssm_n_k_heads));

    hp.is_recurrent.assign(hp.n_layer, false);
    auto recr = f.get_int_array(key("attention.recurrent_layers"));
    if (!recr.empty()) {
        require((int64_t)recr.size() >= hp.n_layer, "attention.recurrent_layers is shorter than block_count");
        for (int64_t i = 0; i < hp.n_layer; ++i) hp.is_recurrent[i] = recr[i] != 0;
    } else {
        const int64_t interval = f.get_int(key("full_attention_interval"), false, 4);
        require(interval > 0, "full_attention_interval must be positive");
        for (int64_t i = 0; i < hp.n_layer; ++i) hp.is_recurrent[i] = (i + 1) % interval != 0;
    }

    // Tensors: shapes as upstream loads them (ggml order, ne0 first).
    const int64_t E = hp.n_embd, hd = hp.head_dim;
    tok_embd = take(f, "token_embd.weight", {E, -1});
    hp.n_vocab = tok_embd->ne[1];
    output_norm = take(f, "output_norm.weight", {E});
    output = take(f, "output.weight", {E, hp.n_vocab}, false);
    if (!output) output = tok_embd;

    const int64_t key_dim = hp.ssm_d_state * hp.ssm_n_k_heads;
    const int64_t value_dim = hp.ssm_d_state * hp.ssm_n_v_heads;
    layers.resize(hp.n_layer);
    for (int64_t il = 0; il < hp.n_layer; ++il) {
        auto & L = layers[il];
        auto bn = [&](const char * s) { return "blk." + std::to_string(il) + "." + s; };
        L.attn_norm = take(f, bn("attn_norm.weight"), {E});
        L.attn_post_norm = take(f, bn("post_attention_norm.weight"), {E});
        if (!hp.is_recurrent[il]) {
            L.wq = take(f, bn("attn_q.weight"), {E, hd * hp.n_head * 2});
            L.wk = take(f, bn("attn_k.weight"), {E, hd * hp.n_head_kv});
            L.wv = take(f, bn("attn_v.weight"), {E, hd * hp.n_head_kv});
            L.wo = take(f, bn("attn_output.weight"), {hd * hp.n_head, E});
            L.q_norm = take(f, bn("attn_q_norm.weight"), {hd});
            L.k_norm = take(f, bn("attn_k_norm.weight"), {hd});
        } else {
            // the four input projections first and adjacent: they can be stacked (load())
            L.wqkv = take(f, bn("attn_qkv.weight"), {E, key_dim * 2 + value_dim});
            L.wgate = take(f, bn("attn_gate.weight"), {E, value_dim});
            L.w_beta = take(f, bn("ssm_beta.weight"), {E, hp.ssm_n_v_heads});
            L.w_alpha = take(f, bn("ssm_alpha.weight"), {E, hp.ssm_n_v_heads});
            L.conv1d = take(f, bn("ssm_conv1d.weight"), {hp.ssm_d_conv, key_dim * 2 + value_dim});
            L.dt_bias = take(f, bn("ssm_dt.bias"), {hp.ssm_n_v_heads});
            L.ssm_a = take(f, bn("ssm_a"), {hp.ssm_n_v_heads});
            L.ssm_norm = take(f, bn("ssm_norm.weight"), {hp.ssm_d_state});
            L.ssm_out = take(f, bn("ssm_out.weight"), {value_dim, E});
        }
        L.ffn_gate = take(f, bn("ffn_gate.weight"), {E, hp.n_ff});
        L.ffn_up = take(f, bn("ffn_up.weight"), {E, hp.n_ff});
        L.ffn_down = take(f, bn("ffn_down.weight"), {hp.n_ff, E});
    }
}

ggml_tensor * Qwen35Model::take(const GgufFile & f, const std::string & tname, std::vector<int64_t> shape,
                                bool required) {
    ggml_tensor * src = f.tensor(tname);
    if (!src) {
        require(!required, "tensor '" + tname + "' is missing in " + f.path());
        return nullptr;
    }
    int64_t want[GGML_MAX_DIMS] = {1, 1, 1, 1};
    for (size_t i = 0; i < shape.size(); ++i) want[i] = shape[i] < 0 ? src->ne[i] : shape[i];
    bool ok = true;
    for (int i = 0; i < GGML_MAX_DIMS; ++i) ok = ok && src->ne[i] == want[i];
    require(ok, "tensor '" + tname + "' has shape " + shape_str(src->ne, GGML_MAX_DIMS) + ", expected " +
                    shape_str(want, GGML_MAX_DIMS) + " in " + f.path());
    // Norms, biases and gates feed elementwise ops that need f32 (converters keep 1-D tensors f32);
    // the conv kernel may be f16/bf16 and is cast in the graph.
    if (shape.size() == 1) {
        require(src->type == GGML_TYPE_F32, "tensor '" + tname + "' must be f32, found " + ggml_type_name(src->type));
    } else if (tname.find("ssm_conv1d") != std::string::npos) {
        require(src->type == GGML_TYPE_F32 || src->type == GGML_TYPE_F16 || src->type == GGML_TYPE_BF16,
                "tensor '" + tname + "' must be f32/f16/bf16, found " + ggml_type_name(src->type));
    }
    return weights_.add(src, tname);
}

void Qwen35Model::assign_buffers(const Backends & b) {
    // The embedding is read with get_rows and conv kernels elementwise: default buffer type.
    weights_.assign_buffers(b, [this](const ggml_tensor * w, const std::string & n) {
        return w != tok_embd && n.find("ssm_conv1d") == std::string::npos;
    });
}

size_t Qwen35Model::weight_bytes() const { return weights_.bytes(); }

void Qwen35Model::load(const GgufFile & f, const ProgressFn & progress) {
    weights_.load(f, progress, "weights");
    // Longest runs of alike, adjacent input projections (e.g. a Q6_K qkv before Q4_K z, beta,
    // alpha stacks the last three).
    for (size_t il = 0; il < layers.size(); ++il) {
        auto & L = layers[il];
        const auto parts = L.input_projections();
        for (size_t a = 0; a < parts.size();) {
            size_t b = parts.size();
            ggml_tensor * w = nullptr;
            for (; b > a + 1 && !w; --b) {
                w = weights_.stacked(std::vector<ggml_tensor *>(parts.begin() + a, parts.begin() + b),
                                     "blk." + std::to_string(il) + ".stacked_in." + std::to_string(a));
                if (w) break;
            }
            if (w) {
                L.stacked.push_back({(int)a, (int)(b - a), w});
                a = b;
            } else {
                ++a;
            }
        }
        L.ffn_gate_up = weights_.stacked({L.ffn_gate, L.ffn_up}, "blk." + std::to_string(il) + ".stacked_ffn");
    }
}

int Qwen35Model::n_stacked() const {
    int n = 0;
    for (const auto & L : layers) n += (int)L.stacked.size() + (L.ffn_gate_up ? 1 : 0);
    return n;
}

Qwen35Model::~Qwen35Model() = default;

}  // namespace dflash
