#include "op_runner.h"

#include "backend.h"
#include "errors.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml_ext_tree.h"

#include <functional>
#include <string>

namespace dflash {

namespace {

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
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be.main);
    if (!buf) {
        ggml_free(ctx);
        throw EngineError("could not allocate the op's tensors");
    }
    for (size_t i = 0; i < ts.size(); ++i) {
        ggml_backend_tensor_set(ts[i], ins[i]->data.data(), 0, ggml_nbytes(ts[i]));
    }
    ggml_backend_tensor_set(tree, index.data.data(), 0, ggml_nbytes(tree));
    const bool ok = ggml_backend_graph_compute(be.main, gf) == GGML_STATUS_SUCCESS;
    std::vector<float> r(ggml_nelements(out));
    if (ok) ggml_backend_tensor_get(out, r.data(), 0, ggml_nbytes(out));
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    if (!ok) throw EngineError("the backend failed to compute the op");
    return r;
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

std::vector<float> run_tree_gated_delta_net(const OpInput & q, const OpInput & k, const OpInput & v, const OpInput & g,
                                            const OpInput & beta, const OpInput & state,
                                            const std::vector<int32_t> & parents, bool gpu, int n_threads) {
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
               [](ggml_context * c, const auto & t, ggml_tensor * tree) {
                   auto r4 = [&](ggml_tensor * x) { return ggml_reshape_4d(c, x, x->ne[0], x->ne[1], x->ne[2], 1); };
                   return ggml_ext::tree_gated_delta_net(c, r4(t[0]), r4(t[1]), r4(t[2]), r4(t[3]), r4(t[4]), t[5],
                                                         tree, ggml_ext::kTreeMaxDepth);
               });
}

bool gpu_backend_available() {
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        if (ggml_backend_dev_type(ggml_backend_dev_get(i)) == GGML_BACKEND_DEVICE_TYPE_GPU) return true;
    }
    return false;
}

}  // namespace dflash
