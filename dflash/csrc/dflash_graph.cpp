#include "dflash_graph.h"

#include "device_inputs.h"
#include "ggml.h"
#include "ggml_ext_top_k.h"
#include "graph_common.h"

#include <algorithm>
#include <cmath>

namespace dflash {

namespace {

constexpr int KV_PAD = 256;  // the CUDA FA kernels want the attended K length padded to 256

struct Builder {
    ggml_context * ctx;
    const DflashModel & model;
    const DflashHparams & hp;
    const DraftKv & kv;
    const DraftSpec & spec;
    DraftGraph & g;

    ggml_tensor * norm(ggml_tensor * x, ggml_tensor * w) { return rms_norm_mul(ctx, x, w, hp.rms_eps); }

    ggml_tensor * rope(ggml_tensor * x, ggml_tensor * pos) {
        return ggml_rope_ext(ctx, x, pos, nullptr, hp.n_rot, GGML_ROPE_TYPE_NEOX, (int)hp.n_ctx_train,
                             hp.rope_freq_base, hp.rope_freq_scale, 0.0f, 1.0f, 32.0f, 1.0f);
    }

    // K (normed, roped) and V of `h` for layer il, as rows [kv_row, n] ready for the cache.
    std::pair<ggml_tensor *, ggml_tensor *> kv_rows(int il, ggml_tensor * h, ggml_tensor * pos) {
        const auto & L = model.layers[il];
        const int64_t n = h->ne[1];
        ggml_tensor * k = ggml_reshape_3d(ctx, ggml_ext::mul_mat_tiles(ctx, L.wk, h), hp.head_dim, hp.n_head_kv, n);
        k = rope(norm(k, L.k_norm), pos);
        ggml_tensor * v = ggml_ext::mul_mat_tiles(ctx, L.wv, h);
        return {ggml_reshape_2d(ctx, k, hp.kv_row(), n), v};
    }

    void write_rows(int il, std::pair<ggml_tensor *, ggml_tensor *> rows, ggml_tensor * idx) {
        ggml_build_forward_expand(g.gf, ggml_set_rows(ctx, kv.k[il], rows.first, idx));
        ggml_build_forward_expand(g.gf, ggml_set_rows(ctx, kv.v[il], rows.second, idx));
    }

    ggml_tensor * attention(int il, ggml_tensor * h) {
        const auto & L = model.layers[il];
        const int64_t hd = hp.head_dim, n = h->ne[1];
        ggml_tensor * q = ggml_reshape_3d(ctx, ggml_ext::mul_mat_tiles(ctx, L.wq, h), hd, hp.n_head, n);
        q = rope(norm(q, L.q_norm), g.pos);
        ggml_build_forward_expand(g.gf, q);
        write_rows(il, kv_rows(il, h, g.pos), g.blk_idx);

        const bool sliding = hp.is_sliding[il];
        const int64_t lo = sliding ? spec.kv_lo_sliding : 0;
        const int64_t n_kv = spec.kv_hi - lo;
        auto rows = [&](ggml_tensor * c) {  // cache rows [lo, kv_hi) as [head_dim, n_head_kv, n_kv]
            return ggml_view_3d(ctx, c, hd, hp.n_head_kv, n_kv, ggml_row_size(c->type, hd), c->nb[1], lo * c->nb[1]);
        };
        ggml_tensor * k = rows(kv.k[il]);
        ggml_tensor * v = rows(kv.v[il]);
        const float scale = hp.attn_scale != 0.0f ? hp.attn_scale : 1.0f / std::sqrt((float)hd);
        ggml_tensor * o =
            ggml_flash_attn_ext(ctx, ggml_permute(ctx, q, 0, 2, 1, 3), ggml_permute(ctx, k, 0, 2, 1, 3),
                                ggml_permute(ctx, v, 0, 2, 1, 3), g.mask[sliding][hp.causal[il]], scale, 0.0f, 0.0f);
        ggml_prec_set_acc(o, GGML_PREC_F32);
        return ggml_ext::mul_mat_tiles(ctx, L.wo, ggml_reshape_2d(ctx, o, hd * hp.n_head, n));
    }

    ggml_tensor * ffn(int il, ggml_tensor * x) {
        const auto & L = model.layers[il];
        return swiglu_ffn(ctx, x, L.ffn_gate, L.ffn_up, L.ffn_down);
    }
};

ggml_tensor * input(ggml_context * ctx, ggml_type t, int64_t n0, int64_t n1 = 1) { return graph_input(ctx, t, n0, n1); }

int round_up(int x, int m) { return (x + m - 1) / m * m; }

}  // namespace

std::pair<int, int> draft_kv_range(const DflashHparams & hp, int start, int n_block, int64_t n_rows) {
    const int hi = (int)std::min<int64_t>(n_rows, round_up(start + n_block, KV_PAD));
    int lo = 0;
    if (hp.sliding_window > 0) {
        // The earliest query (the anchor) sees positions > start - window.
        const int64_t first = std::max<int64_t>(0, start - hp.sliding_window + 1);
        lo = (int)(first / KV_PAD * KV_PAD);
    }
    return {std::min(lo, hi), hi};
}

DraftGraph build_dflash_draft(ggml_context * ctx, const DflashModel & model, const DraftKv & kv,
                              const DraftSpec & spec) {
    const auto & hp = model.hp;
    DraftGraph g;
    g.gf = ggml_new_graph_custom(ctx, 4096, false);
    Builder b{ctx, model, hp, kv, spec, g};

    // (a) context injection: only K/V of the new rows, into the cache.
    if (spec.n_inject > 0) {
        ggml_tensor * feat = nullptr;
        if (spec.feat_src) {
            g.feat_rows = input(ctx, GGML_TYPE_I32, spec.n_inject);
            feat = ggml_get_rows(ctx, spec.feat_src, g.feat_rows);
        } else {
            feat = g.feat = input(ctx, GGML_TYPE_F32, hp.n_feature(), spec.n_inject);
        }
        g.inj_pos = input(ctx, GGML_TYPE_I32, spec.n_inject);
        g.inj_idx = input(ctx, GGML_TYPE_I64, spec.n_inject);
        ggml_tensor * h = b.norm(ggml_ext::mul_mat_tiles(ctx, model.fc, feat), model.hidden_norm);
        for (int il = 0; il < hp.n_layer; ++il) b.write_rows(il, b.kv_rows(il, h, g.inj_pos), g.inj_idx);
    }
    if (spec.n_block == 0) return g;

    // (b) the block.
    const int n = spec.n_block;
    g.tokens = input(ctx, GGML_TYPE_I32, n);
    g.pos = input(ctx, GGML_TYPE_I32, n);
    g.blk_idx = input(ctx, GGML_TYPE_I64, n);
    for (int il = 0; il < hp.n_layer; ++il) {
        const bool s = hp.is_sliding[il], c = hp.causal[il];
        if (!g.mask[s][c]) g.mask[s][c] = input(ctx, GGML_TYPE_F16, spec.kv_hi - (s ? spec.kv_lo_sliding : 0), n);
    }
    ggml_tensor * x = ggml_get_rows(ctx, model.tok_embd, g.tokens);
    for (int il = 0; il < hp.n_layer; ++il) {
        const auto & L = model.layers[il];
        x = ggml_add(ctx, b.attention(il, b.norm(x, L.attn_norm)), x);
        x = ggml_add(ctx, b.ffn(il, b.norm(x, L.ffn_norm)), x);
    }
    x = b.norm(x, model.output_norm);
    // Slot 0 (the anchor) predicts nothing; slots 1..B-1 predict the tokens at their own positions.
    x = ggml_view_2d(ctx, x, x->ne[0], n - 1, x->nb[1], x->nb[1]);
    g.logits = ggml_ext::mul_mat_tiles(ctx, model.output, x);
    g.argmax = ggml_argmax(ctx, g.logits);
    for (ggml_tensor * t : {g.logits, g.argmax}) {
        ggml_set_output(t);
        ggml_build_forward_expand(g.gf, t);
    }
    if (spec.top_k == 0) return g;  // chain decoding needs only the argmax
    g.top_ids = ggml_ext::top_k_rows(ctx, g.logits, spec.top_k);
    ggml_tensor * probs = ggml_soft_max_ext(ctx, g.logits, nullptr, 1.0f / spec.top_temperature, 0.0f);
    probs = ggml_reshape_3d(ctx, probs, 1, probs->ne[0], probs->ne[1]);
    g.top_logp = ggml_log(ctx, ggml_reshape_2d(ctx, ggml_get_rows(ctx, probs, g.top_ids), spec.top_k, n - 1));
    for (ggml_tensor * t : {g.top_ids, g.top_logp}) {
        ggml_set_output(t);
        ggml_build_forward_expand(g.gf, t);
    }
    return g;
}

void set_dflash_inputs(const DraftGraph & g, const DflashModel & model, const DraftKv & kv, const DraftSpec & spec,
                       const DraftInputs & in) {
    const auto & hp = model.hp;
    if (spec.n_inject > 0) {
        if (g.feat_rows) {
            std::vector<int32_t> rows(spec.n_inject, 0);  // padding reads row 0, lands in the trash row
            std::copy(in.feat_rows, in.feat_rows + in.n_real_inject, rows.begin());
            set_input(g.upload, g.feat_rows, rows.data(), sizeof(int32_t) * rows.size());
        } else {
            const int64_t nf = hp.n_feature();
            std::vector<float> feat((size_t)nf * spec.n_inject, 0.0f);
            std::copy(in.feat, in.feat + (size_t)nf * in.n_real_inject, feat.begin());
            set_input(g.upload, g.feat, feat.data(), sizeof(float) * feat.size());
        }
        std::vector<int32_t> pos(spec.n_inject, 0);
        std::vector<int64_t> idx(spec.n_inject, kv.trash_row());
        for (int i = 0; i < in.n_real_inject; ++i) pos[i] = (int32_t)(idx[i] = in.inject_pos0 + i);
        set_input(g.upload, g.inj_pos, pos.data(), sizeof(int32_t) * pos.size());
        set_input(g.upload, g.inj_idx, idx.data(), sizeof(int64_t) * idx.size());
    }
    if (spec.n_block == 0) return;

    const int n = spec.n_block;
    std::vector<int32_t> tokens(n, hp.mask_token_id), pos(n);
    std::vector<int64_t> idx(n);
    tokens[0] = in.anchor;
    for (int i = 0; i < n; ++i) pos[i] = (int32_t)(idx[i] = in.start + i);
    set_input(g.upload, g.tokens, tokens.data(), sizeof(int32_t) * n);
    set_input(g.upload, g.pos, pos.data(), sizeof(int32_t) * n);
    set_input(g.upload, g.blk_idx, idx.data(), sizeof(int64_t) * n);

    // Key row r holds position r: committed context below n_ctx, the block at start..start+n-1,
    // anything else (stale rows, padding, the trash row) is hidden.
    const ggml_fp16_t zero = ggml_fp32_to_fp16(0.0f), ninf = ggml_fp32_to_fp16(-INFINITY);
    std::vector<ggml_fp16_t> m;
    for (int s = 0; s < 2; ++s) {
        for (int c = 0; c < 2; ++c) {
            if (!g.mask[s][c]) continue;
            const bool causal = c && !in.all_bidirectional;
            const int64_t lo = s ? spec.kv_lo_sliding : 0, n_kv = g.mask[s][c]->ne[0];
            m.assign((size_t)n_kv * n, ninf);
            for (int i = 0; i < n; ++i) {
                const int64_t q = in.start + i;
                // visible rows: the context and the block (up to q if causal), inside the window
                const int64_t w0 = s ? q - hp.sliding_window + 1 : 0;
                auto open = [&](int64_t a, int64_t b) {
                    a = std::max({a, w0, lo});
                    b = std::min(b, lo + n_kv);
                    if (a < b) std::fill(m.begin() + i * n_kv + (a - lo), m.begin() + i * n_kv + (b - lo), zero);
                };
                open(0, in.n_ctx);
                open(in.start, causal ? q + 1 : in.start + n);
            }
            set_input(g.upload, g.mask[s][c], m.data(), sizeof(ggml_fp16_t) * m.size());
        }
    }
}

}  // namespace dflash
