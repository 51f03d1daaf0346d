#include "qwen35_graph.h"

#include "device_inputs.h"
#include "errors.h"
#include "ggml.h"
#include "graph_common.h"
#include "ggml_ext.h"
#include "ggml_ext_attn.h"
#include "ggml_ext_gdn.h"
#include "ggml_ext_matmul.h"
#include "ggml_ext_tree.h"
#include "kv_types.h"

#include <algorithm>
#include <cmath>

namespace dflash {

namespace {

struct Builder {
    ggml_context * ctx;
    const Qwen35Model & model;
    const Qwen35Hparams & hp;
    const TargetCache & cache;
    const ForwardSpec & spec;
    ForwardGraph & g;
    int n;           // tokens in this forward
    MatMulFn mm;     // weight matmuls (ForwardSpec::batch_invariant)
    bool invariant;  // a decode's or a verify's in the batch-invariant mode: every op as a decode does it

    // ggml_gated_delta_net over a chain of tokens; outside the batch-invariant mode CUDA may run its
    // sums in another order than a decode step's (ggml_ext::allow_reordered_delta_rule: one round of
    // reductions a token, or chunks of 64 tokens as matrix products; the chain kernel's bits otherwise).
    ggml_tensor * delta_rule(ggml_tensor * q, ggml_tensor * k, ggml_tensor * v, ggml_tensor * gate, ggml_tensor * beta,
                             ggml_tensor * state) {
        ggml_tensor * out = ggml_gated_delta_net(ctx, q, k, v, gate, beta, state, 1);
        return invariant ? out : ggml_ext::allow_reordered_delta_rule(out);
    }

    // ggml_ext::tree_gated_delta_net over a DDTree verify's nodes, chunked likewise.
    ggml_tensor * tree_delta_rule(ggml_tensor * q, ggml_tensor * k, ggml_tensor * v, ggml_tensor * gate,
                                  ggml_tensor * beta, ggml_tensor * state) {
        ggml_tensor * o =
            ggml_ext::tree_gated_delta_net(ctx, q, k, v, gate, beta, state, g.tree, ggml_ext::kTreeMaxDepth);
        return invariant ? o : ggml_ext::allow_reordered_delta_rule(o);
    }

    ggml_tensor * norm(ggml_tensor * x, ggml_tensor * w) { return rms_norm_mul(ctx, x, w, hp.rms_eps); }

    // Upstream's GDN L2 norm: rms_norm with eps/n, scaled by 1/sqrt(n).
    ggml_tensor * l2_norm(ggml_tensor * x) {
        const float d = (float)x->ne[0];
        return ggml_scale(ctx, ggml_rms_norm(ctx, x, hp.rms_eps / d), 1.0f / std::sqrt(d));
    }

    ggml_tensor * rotate(ggml_tensor * x, ggml_tensor * rot) {
        const int64_t r = rot->ne[0];
        ggml_tensor * y = ggml_is_contiguous(x) ? ggml_reshape_2d(ctx, x, r, ggml_nelements(x) / r)
                                                : ggml_cont_2d(ctx, x, r, ggml_nelements(x) / r);
        y = ggml_mul_mat(ctx, rot, y);
        return ggml_reshape_4d(ctx, y, x->ne[0], x->ne[1], x->ne[2], x->ne[3]);
    }

    // Stacked weights (Qwen35Layer::stacked, ffn_gate_up) as one product: same rows, same per-row
    // arithmetic, fewer launches. A decode keeps gate and up apart (ggml fuses them into one GEMV
    // with the SwiGLU), and so does a batch-invariant verify, which repeats the decode op for op.
    bool stack_ffn() const { return n > 1 && spec.stack_tokens && !spec.batch_invariant; }

    // [a, b, n(, 1)] with each token's a * b values contiguous -> [a * b, n] (tokens possibly apart);
    // a 2-D tensor as it is.
    ggml_tensor * token_rows(ggml_tensor * t) {
        if (ggml_n_dims(t) <= 2) return t;
        return ggml_view_2d(ctx, t, t->ne[0] * t->ne[1], t->ne[2], t->nb[2], 0);
    }

    // [a * b, n] -> [a, b, n]: a reshape that also takes a stacked product's row slice (rows apart).
    ggml_tensor * split_rows(ggml_tensor * t, int64_t a, int64_t b) {
        return ggml_view_3d(ctx, t, a, b, t->ne[1], ggml_row_size(t->type, a), t->nb[1], 0);
    }

    // The layer's input projections of x (Qwen35Layer::input_projections order): the stacked ones
    // as a single product, each projection a slice of its rows ([rows, n], rows apart). Several
    // tokens (one with ForwardSpec::adjacent_products): the products enter the graph next to each
    // other, right after x's norm, so that ggml_ext can quantize the norm's output once for two of
    // them (rms_norm_fusion.cu's pairs: a Q6_K attn_qkv or attn_v beside the Q4_K stack of the others).
    std::vector<ggml_tensor *> project(const Qwen35Layer & L, ggml_tensor * x) {
        const auto ws = L.input_projections();
        std::vector<ggml_tensor *> out(ws.size(), nullptr), products;
        if (spec.stack_projections && (n == 1 || spec.stack_tokens)) {
            for (const auto & s : L.stacked) {
                ggml_tensor * y = mm(ctx, s.w, x);
                products.push_back(y);
                size_t off = 0;
                for (int i = s.first; i < s.first + s.count; ++i) {
                    out[i] = ggml_view_2d(ctx, y, ws[i]->ne[1], n, y->nb[1], off);
                    off += ggml_row_size(y->type, ws[i]->ne[1]);
                }
            }
        }
        for (size_t i = 0; i < ws.size(); ++i) {
            if (!out[i]) products.push_back(out[i] = mm(ctx, ws[i], x));
        }
        if (n > 1 || spec.adjacent_products) {
            for (ggml_tensor * y : products) ggml_build_forward_expand(g.gf, y);
        }
        return out;
    }

    ggml_tensor * attention(int il, ggml_tensor * x) {
        const auto & L = model.layers[il];
        const int64_t hd = hp.head_dim;
        const auto p = project(L, x);
        ggml_tensor * qg = p[0];  // [2*hd*n_head, n]: per head Q then gate
        const size_t es = ggml_element_size(qg);
        ggml_tensor * q = ggml_view_3d(ctx, qg, hd, hp.n_head, n, es * hd * 2, qg->nb[1], 0);
        q = norm(q, L.q_norm);
        ggml_tensor * k = norm(split_rows(p[1], hd, hp.n_head_kv), L.k_norm);
        ggml_tensor * gate = ggml_view_3d(ctx, qg, hd, hp.n_head, n, es * hd * 2, qg->nb[1], es * hd);
        gate = ggml_cont_2d(ctx, gate, hd * hp.n_head, n);
        ggml_tensor * v = split_rows(p[2], hd, hp.n_head_kv);

        int sections[4];
        std::copy(hp.rope_sections, hp.rope_sections + 4, sections);
        const int n_ctx_orig = (int)hp.n_ctx_train;
        q = ggml_rope_multi(ctx, q, g.pos, nullptr, hp.n_rot, sections, GGML_ROPE_TYPE_IMROPE, n_ctx_orig,
                            hp.rope_freq_base, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f);
        k = ggml_rope_multi(ctx, k, g.pos, nullptr, hp.n_rot, sections, GGML_ROPE_TYPE_IMROPE, n_ctx_orig,
                            hp.rope_freq_base, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f);
        if (g.k_rot) {
            q = rotate(q, g.k_rot);
            k = rotate(k, g.k_rot);
        }
        // [hd * n_head_kv, n], rows possibly apart (set_rows takes them so)
        ggml_tensor * v_rows = p[2];
        if (g.v_rot) {
            v = rotate(v, g.v_rot);
            v_rows = ggml_reshape_2d(ctx, v, hd * hp.n_head_kv, n);
        }

        // Write this forward's K/V rows, then attend over the first n_kv rows of the cache.
        ggml_tensor * kc = cache.k[il];
        ggml_tensor * vc = cache.v[il];
        ggml_build_forward_expand(g.gf, q);
        ggml_build_forward_expand(g.gf,
                                  ggml_set_rows(ctx, kc, ggml_reshape_2d(ctx, k, hd * hp.n_head_kv, n), g.kv_idx));
        ggml_build_forward_expand(g.gf, ggml_set_rows(ctx, vc, v_rows, g.kv_idx));
        ggml_tensor * kv_k = ggml_view_3d(ctx, kc, hd, hp.n_head_kv, g.n_kv, ggml_row_size(kc->type, hd), kc->nb[1], 0);
        ggml_tensor * kv_v = ggml_view_3d(ctx, vc, hd, hp.n_head_kv, g.n_kv, ggml_row_size(vc->type, hd), vc->nb[1], 0);

        const float scale = hp.attn_scale != 0.0f ? hp.attn_scale : 1.0f / std::sqrt((float)hd);
        ggml_tensor * o = nullptr;
        if (g.paths) {
            // Batch-invariant: each token over its own rows in a fixed order, the decode's (ggml_ext_attn.h)
            auto all_rows = [&](ggml_tensor * c) {
                return ggml_view_3d(ctx, c, hd, hp.n_head_kv, c->ne[1], ggml_row_size(c->type, hd), c->nb[1], 0);
            };
            o = ggml_ext::attn_paths(ctx, q, all_rows(kc), all_rows(vc), g.paths, scale);
        } else {
            o = ggml_flash_attn_ext(ctx, ggml_permute(ctx, q, 0, 2, 1, 3), ggml_permute(ctx, kv_k, 0, 2, 1, 3),
                                    ggml_permute(ctx, kv_v, 0, 2, 1, 3), g.mask, scale, 0.0f, 0.0f);
            ggml_prec_set_acc(o, GGML_PREC_F32);
        }
        o = ggml_reshape_2d(ctx, o, hd * hp.n_head, n);
        if (g.v_rot) o = rotate(o, g.v_rot);
        o = ggml_mul(ctx, o, ggml_sigmoid(ctx, gate));
        return mm(ctx, L.wo, o);
    }

    // Gated DeltaNet layer. A chain runs ggml's causal conv and delta rule over [cached state, new
    // tokens]; a tree (DDTree verify) runs ggml_ext's tree ops, where each node's conv window and
    // state continue from its parent's. A verify (deferred chain, or any tree) leaves the recurrent
    // state as it was and saves each token's delta-rule inputs: commit replays the accepted ones.
    ggml_tensor * gated_deltanet(int il, ggml_tensor * x) {
        const auto & L = model.layers[il];
        const int64_t S = hp.ssm_d_state, Hv = hp.ssm_n_v_heads, Hk = hp.ssm_n_k_heads;
        const int64_t C = hp.conv_channels(), K = hp.ssm_d_conv;
        const bool tree = g.tree != nullptr, defer = tree || spec.defer_recurrent;

        const auto p = project(L, x);  // rows possibly apart (a stacked product's slices)
        ggml_tensor * qkv = p[0];      // [C, n]
        ggml_tensor * z = p[1];        // [S*Hv, n]
        if (n == 1 && !defer && spec.fused_gdn_inputs) return gated_deltanet_step(il, p);
        if ((n > 1 || tree) && spec.fused_gdn_inputs) return gated_deltanet_tokens(il, p, defer);
        // CUDA's sigmoid wants a contiguous input; the add below takes rows apart
        ggml_tensor * b_in = ggml_is_contiguous(p[2]) ? p[2] : ggml_cont(ctx, p[2]);
        ggml_tensor * beta = ggml_sigmoid(ctx, ggml_reshape_4d(ctx, b_in, 1, Hv, n, 1));
        ggml_tensor * alpha = ggml_add(ctx, p[3], L.dt_bias);  // [Hv, n]
        ggml_tensor * gate = ggml_mul(ctx, ggml_softplus(ctx, alpha), L.ssm_a);
        gate = ggml_reshape_4d(ctx, gate, 1, Hv, n, 1);

        ggml_tensor * kernel = L.conv1d->type == GGML_TYPE_F32 ? L.conv1d : ggml_cast(ctx, L.conv1d, GGML_TYPE_F32);
        ggml_tensor * conv = nullptr;  // [C, n(, 1)]
        if (tree) {
            ggml_tensor * conv_state = ggml_reshape_2d(ctx, cache.conv[il], K - 1, C);
            conv = ggml_ext::tree_ssm_conv(ctx, qkv, conv_state, kernel, g.tree);
        } else {
            // Causal depthwise conv over [cached K-1 inputs, new inputs]; keep the last K-1 as state.
            ggml_tensor * conv_state = ggml_reshape_3d(ctx, cache.conv[il], K - 1, C, 1);
            ggml_tensor * conv_in =
                ggml_concat(ctx, conv_state,
                            ggml_transpose(ctx, ggml_view_3d(ctx, qkv, C, n, 1, qkv->nb[1], qkv->nb[1] * n, 0)), 0);
            // The copy below pairs tensors of different shapes on purpose: ggml's CUDA copy turns
            // same-shape strided copies into cudaMemcpy2DAsync, which moves these 12..76-byte rows
            // one at a time (7 us per 27B layer, against 2 us for its element-wise copy kernel).
            // (A verify keeps the state: its commit rebuilds it from the saved inputs.)
            if (!defer) {
                ggml_tensor * last = ggml_view_3d(ctx, conv_in, K - 1, C, 1, conv_in->nb[1], conv_in->nb[2],
                                                  ggml_row_size(conv_in->type, n));
                ggml_build_forward_expand(g.gf, ggml_cpy(ctx, last, ggml_reshape_1d(ctx, cache.conv[il], (K - 1) * C)));
            }
            conv = ggml_ssm_conv(ctx, conv_in, kernel);
        }
        conv = ggml_silu(ctx, conv);

        const size_t row = ggml_row_size(conv->type, C);
        const size_t es = ggml_element_size(conv);
        ggml_tensor * q = ggml_view_4d(ctx, conv, S, Hk, n, 1, es * S, row, row * n, 0);
        ggml_tensor * k = ggml_view_4d(ctx, conv, S, Hk, n, 1, es * S, row, row * n, es * S * Hk);
        ggml_tensor * v = ggml_view_4d(ctx, conv, S, Hv, n, 1, es * S, row, row * n, es * 2 * S * Hk);
        q = l2_norm(q);
        k = l2_norm(k);

        ggml_tensor * state = ggml_reshape_4d(ctx, cache.ssm[il], S, S, Hv, 1);
        ggml_tensor * o = nullptr;  // [S, Hv, n, 1]
        if (tree) {
            o = ggml_reshape_4d(ctx, tree_delta_rule(q, k, v, gate, beta, state), S, Hv, n, 1);
        } else {
            ggml_tensor * out = delta_rule(q, k, v, gate, beta, state);
            o = ggml_view_4d(ctx, out, S, Hv, n, 1, ggml_row_size(out->type, S), ggml_row_size(out->type, S * Hv),
                             ggml_row_size(out->type, S * Hv * n), 0);
            if (!defer) {
                ggml_tensor * new_state = ggml_view_1d(ctx, out, S * S * Hv, ggml_row_size(out->type, S * Hv * n));
                ggml_build_forward_expand(g.gf, ggml_cpy(ctx, new_state, cache.ssm_dst(ctx, il)));
            }
        }
        if (defer) {
            // Each token's inputs into the verify scratch: [w, n] -> [w, n] (rows apart on either
            // side: one 2-D copy each, no ggml_cont)
            const auto sv = cache.verify_views(ctx, il, n);
            auto save = [&](ggml_tensor * src, ggml_tensor * dst) {
                ggml_build_forward_expand(g.gf, ggml_cpy(ctx, token_rows(src), token_rows(dst)));
            };
            save(q, sv.q);
            save(k, sv.k);
            save(v, sv.v);
            save(gate, sv.g);
            save(beta, sv.b);
            save(qkv, sv.x);  // the commit rebuilds the conv state from these
        }

        return gated_output(il, o, z);
    }

    // Several tokens of a chain, or a tree's nodes, on the GPU: the conv, SiLU, q/k L2 norms, gate
    // and beta of all of them in one op (ggml_ext::gdn_verify_inputs, which also gives a chain's
    // conv state after its last token; gdn_tree_inputs), then ggml's delta rule or ggml_ext's tree
    // delta rule. A verify saves q|k|v, the conv inputs, gate and beta (4 copies).
    ggml_tensor * gated_deltanet_tokens(int il, const std::vector<ggml_tensor *> & p, bool defer) {
        const auto & L = model.layers[il];
        const int64_t S = hp.ssm_d_state, Hv = hp.ssm_n_v_heads, Hk = hp.ssm_n_k_heads;
        const int64_t C = hp.conv_channels(), K = hp.ssm_d_conv;
        ggml_tensor * kernel = L.conv1d->type == GGML_TYPE_F32 ? L.conv1d : ggml_cast(ctx, L.conv1d, GGML_TYPE_F32);
        ggml_tensor * conv_state = ggml_reshape_2d(ctx, cache.conv[il], K - 1, C);
        ggml_tensor * in = g.tree ? ggml_ext::gdn_tree_inputs(ctx, p[0], p[3], p[2], conv_state, kernel, L.dt_bias,
                                                              L.ssm_a, g.tree, S, Hk, hp.rms_eps)
                                  : ggml_ext::gdn_verify_inputs(ctx, p[0], p[3], p[2], conv_state, kernel, L.dt_bias,
                                                                L.ssm_a, S, Hk, hp.rms_eps);
        const size_t es = ggml_element_size(in), row = es * C, gates = row * n;
        ggml_tensor * q = ggml_view_4d(ctx, in, S, Hk, n, 1, es * S, row, row * n, 0);
        ggml_tensor * k = ggml_view_4d(ctx, in, S, Hk, n, 1, es * S, row, row * n, es * S * Hk);
        ggml_tensor * v = ggml_view_4d(ctx, in, S, Hv, n, 1, es * S, row, row * n, es * 2 * S * Hk);
        ggml_tensor * gate = ggml_view_4d(ctx, in, 1, Hv, n, 1, es, es * Hv, es * Hv * n, gates);
        ggml_tensor * beta = ggml_view_4d(ctx, in, 1, Hv, n, 1, es, es * Hv, es * Hv * n, gates + es * Hv * n);
        ggml_tensor * state = ggml_reshape_4d(ctx, cache.ssm[il], S, S, Hv, 1);
        if (g.tree) {
            ggml_tensor * o = tree_delta_rule(q, k, v, gate, beta, state);
            save_verify_inputs(il, in, p[0], gate, beta);
            return gated_output(il, ggml_reshape_4d(ctx, o, S, Hv, n, 1), p[1]);
        }
        ggml_tensor * out = delta_rule(q, k, v, gate, beta, state);
        ggml_tensor * o = ggml_view_4d(ctx, out, S, Hv, n, 1, ggml_row_size(out->type, S),
                                       ggml_row_size(out->type, S * Hv), ggml_row_size(out->type, S * Hv * n), 0);
        if (!defer) {
            ggml_tensor * new_state = ggml_view_1d(ctx, out, S * S * Hv, ggml_row_size(out->type, S * Hv * n));
            ggml_build_forward_expand(g.gf, ggml_cpy(ctx, new_state, cache.ssm_dst(ctx, il)));
            ggml_tensor * conv_after = ggml_view_1d(ctx, in, (K - 1) * C, gates + 2 * es * Hv * n);
            ggml_build_forward_expand(g.gf, ggml_cpy(ctx, conv_after, ggml_reshape_1d(ctx, conv_state, (K - 1) * C)));
        } else {
            save_verify_inputs(il, in, p[0], gate, beta);
        }
        return gated_output(il, o, p[1]);
    }

    // A verify's inputs of the fused op `in` into the verify scratch: its q|k|v, the conv inputs
    // x, gate and beta (4 copies).
    void save_verify_inputs(int il, ggml_tensor * in, ggml_tensor * x, ggml_tensor * gate, ggml_tensor * beta) {
        const int64_t C = hp.conv_channels();
        const auto sv = cache.verify_views(ctx, il, n);
        auto save = [&](ggml_tensor * src, ggml_tensor * dst) {
            ggml_build_forward_expand(g.gf, ggml_cpy(ctx, token_rows(src), token_rows(dst)));
        };
        save(ggml_view_2d(ctx, in, C, n, ggml_row_size(in->type, C), 0), sv.qkv);
        save(x, sv.x);
        save(gate, sv.g);
        save(beta, sv.b);
    }

    // The delta rule's output o [S, Hv, n, 1], normed and gated by SiLU(z) (z [S*Hv, n], rows
    // possibly apart: one fused SiLU-and-multiply takes them so), through ssm_out.
    ggml_tensor * gated_output(int il, ggml_tensor * o, ggml_tensor * z) {
        const auto & L = model.layers[il];
        const int64_t S = hp.ssm_d_state, Hv = hp.ssm_n_v_heads;
        o = ggml_swiglu_split(ctx, z, ggml_reshape_2d(ctx, norm(o, L.ssm_norm), S * Hv, n));
        return mm(ctx, L.ssm_out, o);
    }

    // One token that commits its state: the conv, SiLU, q/k norms, gate and beta in one op (which
    // also advances the conv state), then ggml's delta rule as in gated_deltanet().
    ggml_tensor * gated_deltanet_step(int il, const std::vector<ggml_tensor *> & p) {
        const auto & L = model.layers[il];
        const int64_t S = hp.ssm_d_state, Hv = hp.ssm_n_v_heads, Hk = hp.ssm_n_k_heads;
        const int64_t C = hp.conv_channels(), K = hp.ssm_d_conv;
        auto flat = [&](ggml_tensor * t) {
            return ggml_is_contiguous(t) ? ggml_reshape_1d(ctx, t, ggml_nelements(t)) : ggml_cont(ctx, t);
        };
        ggml_tensor * kernel = L.conv1d->type == GGML_TYPE_F32 ? L.conv1d : ggml_cast(ctx, L.conv1d, GGML_TYPE_F32);
        ggml_tensor * in = ggml_ext::gdn_decode_inputs(ctx, flat(p[0]), flat(p[3]), flat(p[2]),
                                                       ggml_reshape_2d(ctx, cache.conv[il], K - 1, C), kernel,
                                                       L.dt_bias, L.ssm_a, S, Hk, hp.rms_eps);
        const size_t es = ggml_element_size(in);
        ggml_tensor * q = ggml_view_4d(ctx, in, S, Hk, 1, 1, es * S, es * S * Hk, es * S * Hk, 0);
        ggml_tensor * k = ggml_view_4d(ctx, in, S, Hk, 1, 1, es * S, es * S * Hk, es * S * Hk, es * S * Hk);
        ggml_tensor * v = ggml_view_4d(ctx, in, S, Hv, 1, 1, es * S, es * S * Hv, es * S * Hv, es * 2 * S * Hk);
        ggml_tensor * gate = ggml_view_4d(ctx, in, 1, Hv, 1, 1, es, es * Hv, es * Hv, es * C);
        ggml_tensor * beta = ggml_view_4d(ctx, in, 1, Hv, 1, 1, es, es * Hv, es * Hv, es * (C + Hv));
        ggml_tensor * state = ggml_reshape_4d(ctx, cache.ssm[il], S, S, Hv, 1);
        ggml_tensor * out = ggml_gated_delta_net(ctx, q, k, v, gate, beta, state, 1);
        ggml_tensor * o = ggml_view_4d(ctx, out, S, Hv, 1, 1, ggml_row_size(out->type, S),
                                       ggml_row_size(out->type, S * Hv), ggml_row_size(out->type, S * Hv), 0);
        ggml_tensor * new_state = ggml_view_1d(ctx, out, S * S * Hv, ggml_row_size(out->type, S * Hv));
        ggml_build_forward_expand(g.gf, ggml_cpy(ctx, new_state, cache.ssm_dst(ctx, il)));
        return gated_output(il, o, p[1]);
    }

    ggml_tensor * ffn(int il, ggml_tensor * x) {
        const auto & L = model.layers[il];
        if (L.ffn_gate_up && stack_ffn()) {
            ggml_tensor * y = mm(ctx, L.ffn_gate_up, x);  // [2 * n_ff, n]
            const int64_t f = L.ffn_gate->ne[1];
            ggml_tensor * gate = ggml_view_2d(ctx, y, f, n, y->nb[1], 0);
            ggml_tensor * up = ggml_view_2d(ctx, y, f, n, y->nb[1], ggml_row_size(y->type, f));
            return mm(ctx, L.ffn_down, ggml_swiglu_split(ctx, gate, up));
        }
        return swiglu_ffn(ctx, x, L.ffn_gate, L.ffn_up, L.ffn_down, mm);
    }
};

ggml_tensor * input(ggml_context * ctx, ggml_type t, int64_t n0, int64_t n1 = 1) { return graph_input(ctx, t, n0, n1); }

}  // namespace

// The recurrent part of a commit, for every GDN layer at once (TargetCache keeps their states in
// one tensor each): the delta rule replayed along the accepted tokens' saved inputs as one
// ggml_gated_delta_net with the layers as its sequences (ggml's per-sequence arithmetic, so the
// states equal a per-layer replay's bit for bit; one launch instead of one per layer), its states
// written straight into ssm_all (the copy CUDA fuses into the kernel), and the conv states rebuilt
// from the tokens' conv inputs with one transposed copy (a path shorter than K-1 keeps part of the
// old states: three kernels).
void build_qwen35_commit_recurrent(ggml_context * ctx, ggml_cgraph * gf, const Qwen35Model & model,
                                   const TargetCache & cache, ggml_tensor * rows) {
    const auto & hp = model.hp;
    const int64_t S = hp.ssm_d_state, Hv = hp.ssm_n_v_heads, Hk = hp.ssm_n_k_heads, K = hp.ssm_d_conv;
    const int64_t C = hp.conv_channels(), a = rows->ne[0], L = rows->ne[1];
    // The tokens' rows of every layer's verify scratch: [W, a, L], [H_v, a, L] (three gathers)
    ggml_tensor * in = ggml_get_rows(ctx, cache.vin, rows);
    ggml_tensor * gate = ggml_get_rows(ctx, cache.vgate, rows);
    ggml_tensor * beta = ggml_get_rows(ctx, cache.vbeta, rows);
    const size_t es = sizeof(float);
    auto heads = [&](int64_t h, size_t off) {  // [S, h, a, L], rows apart
        return ggml_view_4d(ctx, in, S, h, a, L, es * S, in->nb[1], in->nb[2], off);
    };
    ggml_tensor * q = heads(Hk, 0);
    ggml_tensor * k = heads(Hk, es * S * Hk);
    ggml_tensor * v = heads(Hv, es * 2 * S * Hk);
    ggml_tensor * state = ggml_reshape_4d(ctx, cache.ssm_all, S, S, Hv, L);
    ggml_tensor * out = ggml_gated_delta_net(ctx, q, k, v, ggml_reshape_4d(ctx, gate, 1, Hv, a, L),
                                             ggml_reshape_4d(ctx, beta, 1, Hv, a, L), state, 1);
    ggml_tensor * states = ggml_view_2d(ctx, out, S * S * Hv, L, es * S * S * Hv, es * S * Hv * a * L);
    ggml_build_forward_expand(gf, ggml_cpy(ctx, states, cache.ssm_dst(ctx)));

    // conv inputs x [C, a, L] (rows apart); the conv states as [K-1, C, L]
    const size_t x_off = es * (2 * S * Hk + S * Hv);
    ggml_tensor * conv = ggml_reshape_3d(ctx, cache.conv_all, K - 1, C, L);
    ggml_tensor * conv_1d = ggml_reshape_1d(ctx, cache.conv_all, ggml_nelements(cache.conv_all));
    // 1-D destinations: ggml's element-wise copy, not a row-by-row cudaMemcpy2DAsync (see gated_deltanet)
    if (a >= K - 1) {
        ggml_tensor * tail =
            ggml_view_3d(ctx, in, C, K - 1, L, in->nb[1], in->nb[2], x_off + in->nb[1] * (a - (K - 1)));
        ggml_build_forward_expand(gf, ggml_cpy(ctx, ggml_permute(ctx, tail, 1, 0, 2, 3), conv_1d));
        return;
    }
    ggml_tensor * xs = ggml_view_3d(ctx, in, C, a, L, in->nb[1], in->nb[2], x_off);
    ggml_tensor * window = ggml_concat(ctx, conv, ggml_cont(ctx, ggml_permute(ctx, xs, 1, 0, 2, 3)), 0);
    ggml_tensor * last =
        ggml_view_3d(ctx, window, K - 1, C, L, window->nb[1], window->nb[2], ggml_row_size(window->type, a));
    ggml_build_forward_expand(gf, ggml_cpy(ctx, last, conv_1d));
}

void build_qwen35_kv_compact(ggml_context * ctx, ggml_cgraph * gf, const TargetCache & cache, ggml_tensor * src_rows,
                             ggml_tensor * dst_rows) {
    for (ggml_tensor * c : {cache.k_all, cache.v_all}) {
        // gather first (a copy), then scatter: sources and destinations may overlap
        ggml_tensor * rows = ggml_get_rows(ctx, c, src_rows);  // [row, a, n_attn]
        ggml_build_forward_expand(gf, ggml_set_rows(ctx, c, rows, dst_rows));
    }
}

int padded_n_kv(int n_end, int n_ctx) {
    const int pad = 256;
    return std::min(n_ctx, ((n_end + pad - 1) / pad) * pad);
}

ForwardGraph build_qwen35_forward(ggml_context * ctx, const Qwen35Model & model, const TargetCache & cache,
                                  const ForwardSpec & spec) {
    const auto & hp = model.hp;
    ForwardGraph g;
    const int n = spec.n_tokens;
    g.gf = ggml_new_graph_custom(ctx, 16384, false);
    g.n_kv = padded_n_kv(spec.n_past + n, cache.cfg.n_ctx);
    g.tokens = input(ctx, GGML_TYPE_I32, n);
    g.pos = input(ctx, GGML_TYPE_I32, 4 * (int64_t)n);
    g.kv_idx = input(ctx, GGML_TYPE_I64, n);
    if (kv_type_rotated(cache.cfg.k_type)) {
        const int r = ggml_ext::hadamard_size_for(hp.head_dim);
        if (r) g.k_rot = input(ctx, GGML_TYPE_F32, r, r);
    }
    if (kv_type_rotated(cache.cfg.v_type) && hp.head_dim % 64 == 0) g.v_rot = input(ctx, GGML_TYPE_F32, 64, 64);

    if (!spec.tree_parents.empty() && hp.n_recurrent_layers() > 0) g.tree = input(ctx, GGML_TYPE_I32, n, 3);
    // A decode's or a verify's matmuls and attention in the batch-invariant mode (a prefill keeps the
    // fast kernels: it is the same graph on both sides)
    const bool invariant = spec.batch_invariant && (n == 1 || spec.defer_recurrent || !spec.tree_parents.empty());
    if (invariant && hp.n_layer > hp.n_recurrent_layers()) {
        g.paths = input(ctx, GGML_TYPE_I32, n + 2, n);
    } else {
        g.mask = input(ctx, GGML_TYPE_F16, g.n_kv, n);
    }
    Builder b{ctx,      model, hp, cache, spec, g, n, invariant ? ggml_ext::mul_mat_invariant : ggml_ext::mul_mat_tiles,
              invariant};
    ggml_tensor * x = ggml_get_rows(ctx, model.tok_embd, g.tokens);
    for (int il = 0; il < hp.n_layer; ++il) {
        ggml_tensor * h = b.norm(x, model.layers[il].attn_norm);
        h = hp.is_recurrent[il] ? b.gated_deltanet(il, h) : b.attention(il, h);
        x = ggml_add(ctx, h, x);
        ggml_tensor * f = b.ffn(il, b.norm(x, model.layers[il].attn_post_norm));
        x = ggml_add(ctx, f, x);
        for (size_t c = 0; c < spec.capture_layers.size(); ++c) {
            if (spec.capture_layers[c] != il) continue;
            ggml_tensor * dst = ggml_view_2d(ctx, spec.features, hp.n_embd, n, spec.features->nb[1],
                                             ggml_row_size(GGML_TYPE_F32, hp.n_embd * (int64_t)c));
            ggml_build_forward_expand(g.gf, ggml_cpy(ctx, x, dst));
        }
    }
    x = b.norm(x, model.output_norm);
    if (!spec.all_logits && n > 1) x = ggml_view_2d(ctx, x, x->ne[0], 1, x->nb[1], x->nb[1] * (n - 1));
    g.logits = b.mm(ctx, model.output, x);
    g.argmax = ggml_argmax(ctx, g.logits);
    ggml_set_output(g.logits);
    ggml_set_output(g.argmax);
    ggml_build_forward_expand(g.gf, g.argmax);
    // A verify's tokens must get decoding's bits: on the CPU a verify's products then take the
    // one-column kernel for every column, and a verify's and a decode's attention the same
    // one-query path (ggml_ext/BATCH_INVARIANCE.md).
    if (n == 1 || spec.defer_recurrent || !spec.tree_parents.empty()) ggml_ext::mark_batch_invariant_on_cpu(g.gf);
    return g;
}

void set_qwen35_inputs(const ForwardGraph & g, const Qwen35Model & model, const ForwardSpec & spec,
                       const int32_t * tokens) {
    const int n = spec.n_tokens;
    set_input(g.upload, g.tokens, tokens, sizeof(int32_t) * n);
    std::vector<int32_t> pos(4 * (size_t)n, 0);
    std::vector<int64_t> idx(n);
    const bool tree = !spec.tree_parents.empty();
    std::vector<int> depth(n, 0);
    for (int i = 0; i < n; ++i) {
        if (tree && spec.tree_parents[i] >= 0) depth[i] = depth[spec.tree_parents[i]] + 1;
        const int p = spec.n_past + (tree ? depth[i] : i);
        pos[i] = pos[n + i] = pos[2 * n + i] = p;
        idx[i] = spec.n_past + i;  // cache rows: one per token, in forward order
    }
    set_input(g.upload, g.pos, pos.data(), sizeof(int32_t) * pos.size());
    set_input(g.upload, g.kv_idx, idx.data(), sizeof(int64_t) * idx.size());
    if (g.mask) {
        std::vector<ggml_fp16_t> mask((size_t)g.n_kv * n);
        const ggml_fp16_t zero = ggml_fp32_to_fp16(0.0f), ninf = ggml_fp32_to_fp16(-INFINITY);
        for (int i = 0; i < n; ++i) {  // fills, not per-element tests: a 257-node tree over 4k rows is 1M entries
            ggml_fp16_t * row = mask.data() + (size_t)i * g.n_kv;
            const int visible = tree ? spec.n_past : spec.n_past + i + 1;  // the committed prefix (+ chain)
            std::fill(row, row + visible, zero);
            std::fill(row + visible, row + g.n_kv, ninf);
            if (!tree) continue;
            for (int a = i; a >= 0; a = spec.tree_parents[a]) row[spec.n_past + a] = zero;  // ancestors-or-self
        }
        set_input(g.upload, g.mask, mask.data(), sizeof(ggml_fp16_t) * mask.size());
    }
    if (g.paths) {
        const auto rows = ggml_ext::attn_paths_rows(spec.n_past, n, spec.tree_parents);
        set_input(g.upload, g.paths, rows.data(), sizeof(int32_t) * rows.size());
    }
    if (g.tree) {
        ggml_ext::TreeIndex ti;
        std::string err;
        if (!ggml_ext::make_tree_index(spec.tree_parents, ti, &err))
            throw EngineError("tree verify: " + err);  // checked in verify_tree
        set_input(g.upload, g.tree, ti.data.data(), sizeof(int32_t) * ti.data.size());
    }
    if (g.k_rot) {
        auto h = ggml_ext::hadamard((int)g.k_rot->ne[0]);
        set_input(g.upload, g.k_rot, h.data(), sizeof(float) * h.size());
    }
    if (g.v_rot) {
        auto h = ggml_ext::hadamard((int)g.v_rot->ne[0]);
        set_input(g.upload, g.v_rot, h.data(), sizeof(float) * h.size());
    }
    (void)model;
}

}  // namespace dflash
