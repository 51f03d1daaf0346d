#include "op_runner.h"

#include <cstring>

#include "backend.h"
#include "errors.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml_ext_attn.h"
#include "ggml_ext_gdn.h"
#include "ggml_ext_matmul.h"
#include "ggml_ext_top_k.h"
#include "ggml_ext_tree.h"
#include "graph_common.h"

#include <chrono>
#include <functional>
#include <random>
#include <string>

namespace dflash {

namespace {

// Allocates ctx's tensors on the backend; frees ctx and throws when that fails.
ggml_backend_buffer_t alloc_tensors(ggml_context * ctx, ggml_backend_t backend) {
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
    if (!buf) {
        ggml_free(ctx);
        throw EngineError("could not allocate the op's tensors");
    }
    return buf;
}

// Computes gf, reads `out`, and frees the buffer and the context either way.
std::vector<float> compute_and_free(ggml_backend_t backend, ggml_cgraph * gf, ggml_tensor * out,
                                    ggml_backend_buffer_t buf, ggml_context * ctx) {
    const bool ok = ggml_backend_graph_compute(backend, gf) == GGML_STATUS_SUCCESS;
    std::vector<float> r(ggml_nelements(out));
    if (ok) ggml_backend_tensor_get(out, r.data(), 0, ggml_nbytes(out));
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    if (!ok) throw EngineError("the backend failed to compute the op");
    return r;
}

// An op's input tensor and the bytes it is set from (t null: no such input).
struct Upload {
    ggml_tensor * t;
    const void * data;
};

// Builds out's graph, allocates ctx's tensors on the backend, sets the inputs, computes and reads
// out; frees the buffer and the context either way.
template <class Uploads>
std::vector<float> compute_op(ggml_backend_t backend, ggml_context * ctx, ggml_tensor * out, const Uploads & inputs) {
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_backend_buffer_t buf = alloc_tensors(ctx, backend);
    for (const Upload & in : inputs) {
        if (in.t) ggml_backend_tensor_set(in.t, in.data, 0, ggml_nbytes(in.t));
    }
    return compute_and_free(backend, gf, out, buf, ctx);
}
std::vector<float> compute_op(ggml_backend_t backend, ggml_context * ctx, ggml_tensor * out,
                              std::initializer_list<Upload> inputs) {
    return compute_op<std::initializer_list<Upload>>(backend, ctx, out, inputs);
}

// Whether a matmul op of n columns and `rows` outputs has a residual (ne [rows, n]; empty: none).
bool check_residual(const OpInput & residual, int64_t rows, int64_t n, const char * op) {
    if (residual.data.empty()) return false;
    if (residual.ne.size() != 2 || residual.ne[0] != rows || residual.ne[1] != n) {
        throw InvalidParameter(std::string(op) + ": residual must be [n, rows]");
    }
    return true;
}

using Build = std::function<ggml_tensor *(ggml_context *, const std::vector<ggml_tensor *> &, ggml_tensor * tree)>;

std::vector<float> run(const std::vector<const OpInput *> & ins, const std::vector<int32_t> & parents, bool gpu,
                       int n_threads, const Build & build) {
    ggml_ext::TreeIndex index;
    std::string why;
    if (!ggml_ext::make_tree_index(parents, index, &why)) throw InvalidParameter(why);
    Backends be(gpu ? 99 : 0, n_threads);
    if (gpu && !be.is_gpu) throw EngineError("no GPU backend");
    ggml_init_params p = {ggml_tensor_overhead() * 64 + ggml_graph_overhead(), nullptr, true};
    ggml_context * ctx = ggml_init(p);
    std::vector<ggml_tensor *> ts;
    for (const OpInput * in : ins) {
        int64_t ne[4] = {1, 1, 1, 1};
        if (in->ne.empty() || in->ne.size() > 4) throw InvalidParameter("op inputs have 1 to 4 dimensions");
        int64_t count = 1;
        for (size_t d = 0; d < in->ne.size(); ++d) count *= (ne[d] = in->ne[d]);
        if (count != (int64_t)in->data.size()) throw InvalidParameter("op input size does not match its shape");
        ts.push_back(ggml_new_tensor(ctx, GGML_TYPE_F32, 4, ne));
    }
    ggml_tensor * tree = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, index.n, 3);
    ggml_tensor * out = build(ctx, ts, tree);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_backend_buffer_t buf = alloc_tensors(ctx, be.main);
    for (size_t i = 0; i < ts.size(); ++i) {
        ggml_backend_tensor_set(ts[i], ins[i]->data.data(), 0, ggml_nbytes(ts[i]));
    }
    ggml_backend_tensor_set(tree, index.data.data(), 0, ggml_nbytes(tree));
    return compute_and_free(be.main, gf, out, buf, ctx);
}

}  // namespace

std::vector<float> run_tree_ssm_conv(const OpInput & x, const OpInput & conv_state, const OpInput & w,
                                     const std::vector<int32_t> & parents, bool gpu, int n_threads) {
    if (x.ne.size() != 2 || w.ne.size() != 2 || conv_state.ne.size() != 2 || x.ne[1] != (int64_t)parents.size() ||
        w.ne[1] != x.ne[0] || conv_state.ne[1] != x.ne[0] || conv_state.ne[0] != w.ne[0] - 1 || w.ne[0] > 8) {
        throw InvalidParameter("tree_ssm_conv: shapes x [C, n], conv_state [K-1, C], w [K, C] (K <= 8)");
    }
    return run({&x, &conv_state, &w}, parents, gpu, n_threads,
               [](ggml_context * c, const auto & t, ggml_tensor * tree) {
                   return ggml_ext::tree_ssm_conv(c, t[0], ggml_reshape_2d(c, t[1], t[1]->ne[0], t[1]->ne[1]),
                                                  ggml_reshape_2d(c, t[2], t[2]->ne[0], t[2]->ne[1]), tree);
               });
}

std::vector<float> run_gated_delta_net(const OpInput & q, const OpInput & k, const OpInput & v, const OpInput & g,
                                       const OpInput & beta, const OpInput & state, bool gpu, int n_threads,
                                       bool reordered) {
    const bool shapes = q.ne.size() == 3 && k.ne == q.ne && v.ne.size() == 3 && g.ne.size() == 3 && beta.ne == g.ne &&
                        state.ne.size() == 3 && v.ne[0] == q.ne[0] && v.ne[2] == q.ne[2] && q.ne[1] > 0 &&
                        v.ne[1] % q.ne[1] == 0 && g.ne[0] == 1 && g.ne[1] == v.ne[1] && g.ne[2] == v.ne[2] &&
                        state.ne[0] == v.ne[0] && state.ne[1] == v.ne[0] && state.ne[2] == v.ne[1];
    if (!shapes) {
        throw InvalidParameter(
            "gated_delta_net: shapes q, k [S, Hk, n], v [S, Hv, n], g, beta [1, Hv, n], state [S, S, Hv]");
    }
    return run({&q, &k, &v, &g, &beta, &state}, {-1}, gpu, n_threads,
               [reordered](ggml_context * c, const auto & t, ggml_tensor *) {
                   auto r4 = [&](ggml_tensor * x) { return ggml_reshape_4d(c, x, x->ne[0], x->ne[1], x->ne[2], 1); };
                   ggml_tensor * out =
                       ggml_gated_delta_net(c, r4(t[0]), r4(t[1]), r4(t[2]), r4(t[3]), r4(t[4]),
                                            ggml_reshape_4d(c, t[5], t[5]->ne[0], t[5]->ne[1], t[5]->ne[2], 1), 1);
                   return reordered ? ggml_ext::allow_reordered_delta_rule(out) : out;
               });
}

std::vector<float> run_tree_gated_delta_net(const OpInput & q, const OpInput & k, const OpInput & v, const OpInput & g,
                                            const OpInput & beta, const OpInput & state,
                                            const std::vector<int32_t> & parents, bool gpu, int n_threads,
                                            bool reordered) {
    const bool shapes = q.ne.size() == 3 && k.ne == q.ne && v.ne.size() == 3 && g.ne.size() == 3 && beta.ne == g.ne &&
                        state.ne.size() == 3 && v.ne[0] == q.ne[0] && v.ne[2] == q.ne[2] && q.ne[1] > 0 &&
                        v.ne[1] % q.ne[1] == 0 && g.ne[0] == 1 && g.ne[1] == v.ne[1] && g.ne[2] == v.ne[2] &&
                        state.ne[0] == v.ne[0] && state.ne[1] == v.ne[0] && state.ne[2] == v.ne[1] &&
                        v.ne[2] == (int64_t)parents.size();
    if (!shapes) {
        throw InvalidParameter(
            "tree_gated_delta_net: shapes q, k [S, Hk, n], v [S, Hv, n], g, beta [1, Hv, n], state [S, S, Hv]");
    }
    return run({&q, &k, &v, &g, &beta, &state}, parents, gpu, n_threads,
               [reordered](ggml_context * c, const auto & t, ggml_tensor * tree) {
                   auto r4 = [&](ggml_tensor * x) { return ggml_reshape_4d(c, x, x->ne[0], x->ne[1], x->ne[2], 1); };
                   ggml_tensor * o = ggml_ext::tree_gated_delta_net(c, r4(t[0]), r4(t[1]), r4(t[2]), r4(t[3]), r4(t[4]),
                                                                    t[5], tree, ggml_ext::kTreeMaxDepth);
                   return reordered ? ggml_ext::allow_reordered_delta_rule(o) : o;
               });
}

// The fused GDN inputs' shapes: qkv [C(, n)], alpha, beta [Hv(, n)], dt_bias, a [Hv],
// conv_state [K-1, C], w [K, C], C = S (2 Hk + Hv); `tokens`: the n-token op's 2-D qkv/alpha/beta.
static void check_gdn_inputs(const char * op, bool tokens, const OpInput & qkv, const OpInput & alpha,
                             const OpInput & beta, const OpInput & conv_state, const OpInput & w,
                             const OpInput & dt_bias, const OpInput & a, int64_t S, int64_t Hk) {
    const size_t dims = tokens ? 2 : 1;
    const int64_t C = qkv.ne.empty() ? 0 : qkv.ne[0], Hv = alpha.ne.empty() ? 0 : alpha.ne[0];
    const bool shapes = qkv.ne.size() == dims && alpha.ne.size() == dims && (!tokens || alpha.ne[1] == qkv.ne[1]) &&
                        beta.ne == alpha.ne && dt_bias.ne.size() == 1 && dt_bias.ne[0] == Hv && a.ne == dt_bias.ne &&
                        w.ne.size() == 2 && w.ne[1] == C && w.ne[0] >= 2 && conv_state.ne.size() == 2 &&
                        conv_state.ne[0] == w.ne[0] - 1 && conv_state.ne[1] == C && S > 0 && Hk > 0 &&
                        C == S * (2 * Hk + Hv);
    if (!shapes) {
        const char * per_token =
            tokens ? ": shapes qkv [C, n], alpha, beta [Hv, n]" : ": shapes qkv [C], alpha, beta [Hv]";
        throw InvalidParameter(std::string(op) + per_token +
                               ", dt_bias, a [Hv], conv_state [K-1, C], w [K, C], C = S (2 Hk + Hv)");
    }
}

// One token: [out, the advanced conv state] (the concat node comes after the op in the graph's
// order); n tokens: the op's output.
// parents: a tree's (gdn_tree_inputs), else {} (a chain's tokens) or {-1} (one token).
static std::vector<float> run_gdn_inputs(bool tokens, const OpInput & qkv, const OpInput & alpha, const OpInput & beta,
                                         const OpInput & conv_state, const OpInput & w, const OpInput & dt_bias,
                                         const OpInput & a, int64_t S, int64_t Hk, float eps,
                                         const std::vector<int32_t> & parents, bool gpu, int n_threads) {
    const bool tree = tokens && !parents.empty();
    check_gdn_inputs(tree     ? "gdn_tree_inputs"
                     : tokens ? "gdn_verify_inputs"
                              : "gdn_decode_inputs",
                     tokens, qkv, alpha, beta, conv_state, w, dt_bias, a, S, Hk);
    if (tree && (int64_t)parents.size() != qkv.ne[1]) throw InvalidParameter("gdn_tree_inputs: one parent a node");
    return run({&qkv, &alpha, &beta, &conv_state, &w, &dt_bias, &a}, tree ? parents : std::vector<int32_t>{-1}, gpu,
               n_threads, [=](ggml_context * c, const auto & t, ggml_tensor * tr) {
                   if (tree) {
                       return ggml_ext::gdn_tree_inputs(c, t[0], t[1], t[2], t[3], t[4], t[5], t[6], tr, S, Hk, eps);
                   }
                   if (tokens) {
                       return ggml_ext::gdn_verify_inputs(c, t[0], t[1], t[2], t[3], t[4], t[5], t[6], S, Hk, eps);
                   }
                   ggml_tensor * out =
                       ggml_ext::gdn_decode_inputs(c, t[0], t[1], t[2], t[3], t[4], t[5], t[6], S, Hk, eps);
                   return ggml_concat(c, out, ggml_reshape_1d(c, t[3], ggml_nelements(t[3])), 0);
               });
}

std::vector<float> run_gdn_decode_inputs(const OpInput & qkv, const OpInput & alpha, const OpInput & beta,
                                         const OpInput & conv_state, const OpInput & w, const OpInput & dt_bias,
                                         const OpInput & a, int64_t S, int64_t Hk, float eps, bool gpu, int n_threads) {
    return run_gdn_inputs(false, qkv, alpha, beta, conv_state, w, dt_bias, a, S, Hk, eps, {-1}, gpu, n_threads);
}

std::vector<float> run_gdn_verify_inputs(const OpInput & qkv, const OpInput & alpha, const OpInput & beta,
                                         const OpInput & conv_state, const OpInput & w, const OpInput & dt_bias,
                                         const OpInput & a, int64_t S, int64_t Hk, float eps,
                                         const std::vector<int32_t> & parents, bool gpu, int n_threads) {
    return run_gdn_inputs(true, qkv, alpha, beta, conv_state, w, dt_bias, a, S, Hk, eps, parents, gpu, n_threads);
}

std::vector<float> run_attn_paths(const OpInput & q, const OpInput & k, const OpInput & v,
                                  const std::vector<int32_t> & paths, int64_t width, const std::string & kv_type,
                                  float scale, bool gpu, int n_threads) {
    const ggml_type kvt = kv_type == "f16" ? GGML_TYPE_F16 : kv_type == "bf16" ? GGML_TYPE_BF16 : GGML_TYPE_F32;
    if (kv_type != "f16" && kv_type != "bf16" && kv_type != "f32") throw InvalidParameter("attn_paths: kv_type");
    const bool shapes = q.ne.size() == 3 && k.ne.size() == 3 && v.ne == k.ne && k.ne[0] == q.ne[0] && k.ne[1] > 0 &&
                        q.ne[1] % k.ne[1] == 0 && width >= 3 && (int64_t)paths.size() == width * q.ne[2];
    if (!shapes) throw InvalidParameter("attn_paths: shapes q [D, H, n], k, v [D, Hkv, rows], paths [W, n]");
    for (int64_t i = 0; i < q.ne[2]; ++i) {  // the op's contract, checked here for the tests' inputs
        const int32_t * col = paths.data() + i * width;
        bool ok = col[0] >= 0 && col[1] >= 1 && col[1] + 2 <= width && col[0] <= k.ne[2];
        for (int j = 0; ok && j < col[1]; ++j) ok = col[2 + j] >= 0 && col[2 + j] < k.ne[2];
        if (!ok) throw InvalidParameter("attn_paths: path " + std::to_string(i) + " is out of range");
    }
    Backends be(gpu ? 99 : 0, n_threads);
    if (gpu && !be.is_gpu) throw EngineError("no GPU backend");
    ggml_init_params p = {ggml_tensor_overhead() * 8 + ggml_graph_overhead(), nullptr, true};
    ggml_context * ctx = ggml_init(p);
    ggml_tensor * tq = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, q.ne[0], q.ne[1], q.ne[2]);
    ggml_tensor * tk = ggml_new_tensor_3d(ctx, kvt, k.ne[0], k.ne[1], k.ne[2]);
    ggml_tensor * tv = ggml_new_tensor_3d(ctx, kvt, v.ne[0], v.ne[1], v.ne[2]);
    ggml_tensor * tp = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, width, q.ne[2]);
    ggml_tensor * out = ggml_ext::attn_paths(ctx, tq, tk, tv, tp, scale);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_backend_buffer_t buf = alloc_tensors(ctx, be.main);
    ggml_backend_tensor_set(tq, q.data.data(), 0, ggml_nbytes(tq));
    for (auto [t, in] : {std::pair{tk, &k}, std::pair{tv, &v}}) {
        std::vector<uint8_t> bytes(ggml_nbytes(t));
        if (kvt == GGML_TYPE_F32) {
            std::memcpy(bytes.data(), in->data.data(), bytes.size());
        } else {
            ggml_get_type_traits(kvt)->from_float_ref(in->data.data(), bytes.data(), (int64_t)in->data.size());
        }
        ggml_backend_tensor_set(t, bytes.data(), 0, bytes.size());
    }
    ggml_backend_tensor_set(tp, paths.data(), 0, ggml_nbytes(tp));
    return compute_and_free(be.main, gf, out, buf, ctx);
}

ggml_type weight_type(const std::string & w_type) {
    for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
        const char * name = ggml_type_name((ggml_type)t);
        if (name && w_type == name && ggml_get_type_traits((ggml_type)t)->blck_size > 0) return (ggml_type)t;
    }
    throw InvalidParameter("mul_mat: unknown weight type '" + w_type + "'");
}

static ggml_tensor * mul_mat_tagged(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, MatMulTag tag) {
    switch (tag) {
        case MatMulTag::invariant:
            return ggml_ext::mul_mat_invariant(ctx, w, x);
        case MatMulTag::tiles:
            return ggml_ext::mul_mat_tiles(ctx, w, x);
        default:
            return ggml_mul_mat(ctx, w, x);
    }
}

std::vector<float> run_mul_mat(const std::vector<uint8_t> & w, const std::string & w_type, int64_t rows,
                               const OpInput & x, MatMulTag tag, bool gpu, int n_threads) {
    const ggml_type type = weight_type(w_type);
    if (x.ne.size() != 2 || rows < 1) throw InvalidParameter("mul_mat: x must be [n, k] and rows >= 1");
    const int64_t k = x.ne[0], n = x.ne[1];
    if (k % ggml_blck_size(type) != 0 || (int64_t)w.size() != (int64_t)ggml_row_size(type, k) * rows) {
        throw InvalidParameter("mul_mat: w must hold rows x k values of its type");
    }
    Backends be(gpu ? 99 : 0, n_threads);
    if (gpu && !be.is_gpu) throw EngineError("no GPU backend");
    ggml_init_params p = {ggml_tensor_overhead() * 8 + ggml_graph_overhead(), nullptr, true};
    ggml_context * ctx = ggml_init(p);
    ggml_tensor * tw = ggml_new_tensor_2d(ctx, type, k, rows);
    ggml_tensor * tx = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, n);
    ggml_tensor * out = mul_mat_tagged(ctx, tw, tx, tag);
    return compute_op(be.main, ctx, out, {{tw, w.data()}, {tx, x.data.data()}});
}

std::vector<float> run_mul_mat_fused(const std::vector<uint8_t> & w, const std::vector<uint8_t> & gate,
                                     const std::string & w_type, int64_t rows, const OpInput & x,
                                     const OpInput & residual, const OpInput & norm, float eps, bool gpu, int n_threads,
                                     const std::string & gate_type) {
    const ggml_type type = weight_type(w_type);
    const ggml_type gtype = gate_type.empty() ? type : weight_type(gate_type);
    if (x.ne.size() != 2 || rows < 1) throw InvalidParameter("mul_mat: x must be [n, k] and rows >= 1");
    const int64_t k = x.ne[0], n = x.ne[1];
    const size_t w_bytes = ggml_row_size(type, k) * rows;
    if (k % ggml_blck_size(type) != 0 || k % ggml_blck_size(gtype) != 0 || w.size() != w_bytes ||
        (!gate.empty() && gate.size() != ggml_row_size(gtype, k) * rows)) {
        throw InvalidParameter("mul_mat: w (and gate) must hold rows x k values of its type");
    }
    const bool has_residual = check_residual(residual, rows, n, "mul_mat");
    const bool has_norm = !norm.ne.empty();
    if (has_norm && (norm.ne.size() != 1 || norm.ne[0] != k || !(eps > 0.0f))) {
        throw InvalidParameter("mul_mat: norm must hold k values and eps be > 0");
    }
    Backends be(gpu ? 99 : 0, n_threads);
    if (gpu && !be.is_gpu) throw EngineError("no GPU backend");
    ggml_init_params p = {ggml_tensor_overhead() * 16 + ggml_graph_overhead(), nullptr, true};
    ggml_context * ctx = ggml_init(p);
    ggml_tensor * tw = ggml_new_tensor_2d(ctx, type, k, rows);
    ggml_tensor * tg = gate.empty() ? nullptr : ggml_new_tensor_2d(ctx, gtype, k, rows);
    ggml_tensor * tx = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, n);
    ggml_tensor * tr = has_residual ? ggml_new_tensor_2d(ctx, GGML_TYPE_F32, rows, n) : nullptr;
    ggml_tensor * tn = has_norm ? ggml_new_tensor_1d(ctx, GGML_TYPE_F32, k) : nullptr;
    // The engine's norm, FFN and residual shapes (graph_common.h), which ggml-cuda fuses for one
    // column (and ggml_ext the norm into the GEMM's quantizer for more).
    ggml_tensor * in = tn ? rms_norm_mul(ctx, tx, tn, eps) : tx;
    ggml_tensor * out = ggml_ext::mul_mat_tiles(ctx, tw, in);
    if (tg) out = ggml_swiglu_split(ctx, ggml_ext::mul_mat_tiles(ctx, tg, in), out);
    if (tr) out = ggml_add(ctx, out, tr);
    return compute_op(
        be.main, ctx, out,
        {{tw, w.data()}, {tg, gate.data()}, {tx, x.data.data()}, {tr, residual.data.data()}, {tn, norm.data.data()}});
}

// rows x k weights of w_type times the n columns `input` builds in ctx (adding its inputs to
// uploads), tagged mul_mat_tiles, + residual [n, rows] when given: the engine's gated outputs
// before ssm_out and o_proj, for the fusion tests.
static std::vector<float> run_product_of(
    const char * what, const std::vector<uint8_t> & w, const std::string & w_type, int64_t rows, int64_t k, int64_t n,
    const OpInput & residual, bool gpu, int n_threads,
    const std::function<ggml_tensor *(ggml_context *, std::vector<Upload> &)> & input) {
    const ggml_type type = weight_type(w_type);
    if (k % ggml_blck_size(type) != 0 || w.size() != ggml_row_size(type, k) * rows) {
        throw InvalidParameter(std::string(what) + ": w must hold rows x k values of its type");
    }
    const bool has_residual = check_residual(residual, rows, n, what);
    Backends be(gpu ? 99 : 0, n_threads);
    if (gpu && !be.is_gpu) throw EngineError("no GPU backend");
    ggml_init_params p = {ggml_tensor_overhead() * 16 + ggml_graph_overhead(), nullptr, true};
    ggml_context * ctx = ggml_init(p);
    ggml_tensor * tw = ggml_new_tensor_2d(ctx, type, k, rows);
    std::vector<Upload> uploads = {{tw, w.data()}};
    ggml_tensor * out = ggml_ext::mul_mat_tiles(ctx, tw, input(ctx, uploads));
    if (has_residual) {
        ggml_tensor * tr = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, rows, n);
        uploads.push_back({tr, residual.data.data()});
        out = ggml_add(ctx, out, tr);
    }
    return compute_op(be.main, ctx, out, uploads);
}

std::vector<float> run_gated_norm_mul_mat(const std::vector<uint8_t> & w, const std::string & w_type, int64_t rows,
                                          const OpInput & o, const OpInput & z, const OpInput & norm, float eps,
                                          const OpInput & residual, bool gpu, int n_threads) {
    if (o.ne.size() != 2 || z.ne != o.ne || norm.ne.size() != 1 || norm.ne[0] < 1 || o.ne[0] % norm.ne[0] != 0 ||
        rows < 1 || !(eps > 0.0f)) {
        throw InvalidParameter("gated_norm_mul_mat: o and z must be [n, Hv * S], norm [S], rows >= 1 and eps > 0");
    }
    const int64_t k = o.ne[0], n = o.ne[1], S = norm.ne[0];
    return run_product_of("gated_norm_mul_mat", w, w_type, rows, k, n, residual, gpu, n_threads,
                          [&](ggml_context * ctx, std::vector<Upload> & up) {
                              ggml_tensor * to = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, n);
                              ggml_tensor * tz = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, n);
                              ggml_tensor * tn = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, S);
                              up.insert(up.end(), {{to, o.data.data()}, {tz, z.data.data()}, {tn, norm.data.data()}});
                              // qwen35_graph.cpp's gated_output: the norm over heads of S, then the SwiGLU with z
                              ggml_tensor * normed = rms_norm_mul(ctx, ggml_reshape_3d(ctx, to, S, k / S, n), tn, eps);
                              return ggml_swiglu_split(ctx, tz, ggml_reshape_2d(ctx, normed, k, n));
                          });
}

std::vector<float> run_sigmoid_gate_mul_mat(const std::vector<uint8_t> & w, const std::string & w_type, int64_t rows,
                                            const OpInput & o, const OpInput & qg, int64_t hd, const OpInput & residual,
                                            bool gpu, int n_threads) {
    if (o.ne.size() != 2 || qg.ne.size() != 2 || qg.ne[1] != o.ne[1] || hd < 1 || o.ne[0] % hd != 0 ||
        qg.ne[0] < 2 * o.ne[0] || rows < 1) {
        throw InvalidParameter("sigmoid_gate_mul_mat: o must be [n, k], rows [n, >= 2k] and hd divide k");
    }
    const int64_t k = o.ne[0], n = o.ne[1];
    return run_product_of("sigmoid_gate_mul_mat", w, w_type, rows, k, n, residual, gpu, n_threads,
                          [&](ggml_context * ctx, std::vector<Upload> & up) {
                              ggml_tensor * to = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, n);
                              ggml_tensor * tq = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, qg.ne[0], n);
                              up.insert(up.end(), {{to, o.data.data()}, {tq, qg.data.data()}});
                              // qwen35_graph.cpp's attention: the gate heads out of the [q; gate] rows,
                              // then o * sigmoid(gate)
                              const size_t es = sizeof(float);
                              ggml_tensor * gate =
                                  ggml_view_3d(ctx, tq, hd, k / hd, n, es * hd * 2, tq->nb[1], es * hd);
                              gate = ggml_cont_2d(ctx, gate, k, n);
                              return ggml_mul(ctx, to, ggml_sigmoid(ctx, gate));
                          });
}

std::vector<float> run_swiglu_mul_mat(const std::vector<uint8_t> & w, const std::string & w_type, int64_t rows,
                                      const OpInput & gate_up, const OpInput & residual, MatMulTag tag, bool gpu,
                                      int n_threads) {
    const ggml_type type = weight_type(w_type);
    if (gate_up.ne.size() != 2 || gate_up.ne[0] % 2 != 0 || rows < 1) {
        throw InvalidParameter("swiglu_mul_mat: gate_up must be [n, 2k] and rows >= 1");
    }
    const int64_t k = gate_up.ne[0] / 2, n = gate_up.ne[1];
    if (k % ggml_blck_size(type) != 0 || w.size() != ggml_row_size(type, k) * rows) {
        throw InvalidParameter("swiglu_mul_mat: w must hold rows x k values of its type");
    }
    const bool has_residual = check_residual(residual, rows, n, "swiglu_mul_mat");
    Backends be(gpu ? 99 : 0, n_threads);
    if (gpu && !be.is_gpu) throw EngineError("no GPU backend");
    ggml_init_params p = {ggml_tensor_overhead() * 12 + ggml_graph_overhead(), nullptr, true};
    ggml_context * ctx = ggml_init(p);
    ggml_tensor * tw = ggml_new_tensor_2d(ctx, type, k, rows);
    ggml_tensor * tgu = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 2 * k, n);
    ggml_tensor * tr = has_residual ? ggml_new_tensor_2d(ctx, GGML_TYPE_F32, rows, n) : nullptr;
    // The engine's stacked FFN (qwen35_graph.cpp's ffn): gate and up are the halves of one product.
    ggml_tensor * gate = ggml_view_2d(ctx, tgu, k, n, tgu->nb[1], 0);
    ggml_tensor * up = ggml_view_2d(ctx, tgu, k, n, tgu->nb[1], ggml_row_size(GGML_TYPE_F32, k));
    ggml_tensor * out = mul_mat_tagged(ctx, tw, ggml_swiglu_split(ctx, gate, up), tag);
    if (tr) out = ggml_add(ctx, out, tr);
    return compute_op(be.main, ctx, out, {{tw, w.data()}, {tgu, gate_up.data.data()}, {tr, residual.data.data()}});
}

// An i32 op over the rows of x [n, rows] (build: its node from x) -> its values.
static std::vector<int32_t> run_rows_to_ids(const OpInput & x, bool gpu, int n_threads,
                                            const std::function<ggml_tensor *(ggml_context *, ggml_tensor *)> & build) {
    Backends be(gpu ? 99 : 0, n_threads);
    if (gpu && !be.is_gpu) throw EngineError("no GPU backend");
    ggml_init_params p = {ggml_tensor_overhead() * 4 + ggml_graph_overhead(), nullptr, true};
    ggml_context * ctx = ggml_init(p);
    ggml_tensor * tx = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, x.ne[0], x.ne[1]);
    ggml_tensor * out = build(ctx, tx);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_backend_buffer_t buf = alloc_tensors(ctx, be.main);
    ggml_backend_tensor_set(tx, x.data.data(), 0, ggml_nbytes(tx));
    const std::vector<float> raw = compute_and_free(be.main, gf, out, buf, ctx);  // i32 bits
    std::vector<int32_t> ids(raw.size());
    std::memcpy(ids.data(), raw.data(), sizeof(int32_t) * ids.size());
    return ids;
}

std::vector<int32_t> run_top_k(const OpInput & x, int k, bool tagged, bool gpu, int n_threads) {
    if (x.ne.size() != 2 || k < 1 || k > x.ne[0]) throw InvalidParameter("top_k: x must be [rows, n] with 1 <= k <= n");
    return run_rows_to_ids(x, gpu, n_threads, [=](ggml_context * ctx, ggml_tensor * tx) {
        return tagged ? ggml_ext::top_k_rows(ctx, tx, k) : ggml_top_k(ctx, tx, k);
    });
}

std::vector<int32_t> run_argmax(const OpInput & x, bool gpu, int n_threads) {
    if (x.ne.size() != 2 || x.ne[0] < 1) throw InvalidParameter("argmax: x must be [rows, n] with n >= 1");
    return run_rows_to_ids(x, gpu, n_threads,
                           [](ggml_context * ctx, ggml_tensor * tx) { return ggml_argmax(ctx, tx); });
}

std::vector<std::vector<std::vector<double>>> time_mul_mat(const std::string & w_type, int64_t rows, int64_t k,
                                                           const std::vector<int64_t> & ns, bool gpu, int reps,
                                                           int n_threads) {
    const ggml_type type = weight_type(w_type);
    if (rows < 1 || reps < 1 || ns.empty() || k % ggml_blck_size(type) != 0) {
        throw InvalidParameter("time_mul_mat: bad shape");
    }
    for (int64_t n : ns) {
        if (n < 1) throw InvalidParameter("time_mul_mat: column counts must be >= 1");
    }
    Backends be(gpu ? 99 : 0, n_threads);
    if (gpu && !be.is_gpu) throw EngineError("no GPU backend");
    // Each graph multiplies kCopies copies of the weights (distinct memory, more than the GPU's L2
    // together for the 27B's shapes) by the same columns: the launch and synchronisation of a
    // compute are shared by kCopies products, as in a model's forward.
    constexpr int kCopies = 8;
    constexpr int n_tags = 3;
    const size_t n_graphs = n_tags * ns.size();
    ggml_init_params p = {
        ggml_tensor_overhead() * ((kCopies + 1) * n_graphs + kCopies + 4) + ggml_graph_overhead() * n_graphs, nullptr,
        true};
    ggml_context * ctx = ggml_init(p);
    std::vector<ggml_tensor *> tws;
    for (int c = 0; c < kCopies; ++c) tws.push_back(ggml_new_tensor_2d(ctx, type, k, rows));
    std::vector<ggml_tensor *> xs;
    std::vector<ggml_cgraph *> graphs;
    for (int64_t n : ns) {
        ggml_tensor * tx = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, n);
        xs.push_back(tx);
        for (int tag = 0; tag < n_tags; ++tag) {
            ggml_cgraph * gf = ggml_new_graph(ctx);
            for (ggml_tensor * tw : tws) ggml_build_forward_expand(gf, mul_mat_tagged(ctx, tw, tx, (MatMulTag)tag));
            graphs.push_back(gf);
        }
    }
    ggml_backend_buffer_t buf = alloc_tensors(ctx, be.main);
    std::mt19937 gen(1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    {  // valid blocks whatever the type: ggml's own quantizer on random rows
        std::vector<float> wf((size_t)k * rows);
        for (auto & v : wf) v = 0.05f * normal(gen);
        std::vector<uint8_t> wq(ggml_row_size(type, k) * rows);
        ggml_quantize_chunk(type, wf.data(), wq.data(), 0, rows, k, nullptr);
        for (ggml_tensor * tw : tws) ggml_backend_tensor_set(tw, wq.data(), 0, wq.size());
    }
    for (ggml_tensor * tx : xs) {
        std::vector<float> v(ggml_nelements(tx));
        for (auto & e : v) e = normal(gen);
        ggml_backend_tensor_set(tx, v.data(), 0, ggml_nbytes(tx));
    }
    std::vector<std::vector<std::vector<double>>> ms(ns.size(), std::vector<std::vector<double>>(n_tags));
    bool ok = true;
    for (size_t g = 0; g < graphs.size() && ok; ++g) {
        for (int i = 0; i <= reps && ok; ++i) {
            const auto t0 = std::chrono::steady_clock::now();
            ok = ggml_backend_graph_compute(be.main, graphs[g]) == GGML_STATUS_SUCCESS;
            ggml_backend_synchronize(be.main);
            const auto dt = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0);
            if (i > 0) ms[g / n_tags][g % n_tags].push_back(dt.count() / kCopies);  // the first compute warms up
        }
    }
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    if (!ok) throw EngineError("the backend failed to compute the op");
    return ms;
}

bool gpu_backend_available() {
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        if (ggml_backend_dev_type(ggml_backend_dev_get(i)) == GGML_BACKEND_DEVICE_TYPE_GPU) return true;
    }
    return false;
}

std::vector<std::pair<std::string, std::string>> cpu_features() {
    std::vector<std::pair<std::string, std::string>> out;
    ggml_backend_reg_t reg = ggml_backend_reg_by_name("CPU");
    auto get = reg ? (ggml_backend_get_features_t)ggml_backend_reg_get_proc_address(reg, "ggml_backend_get_features")
                   : nullptr;
    if (get) {
        for (const ggml_backend_feature * f = get(reg); f && f->name; ++f) out.emplace_back(f->name, f->value);
    }
    return out;
}

}  // namespace dflash
