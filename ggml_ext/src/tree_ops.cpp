// Graph constructors of the tree ops; the kernels live in ../kernels.
#include "ggml_ext_tree.h"
#include "op_node.h"

#include <cstring>

namespace ggml_ext {

bool make_tree_index(const std::vector<int32_t> & parents, TreeIndex & out, std::string * err) {
    const int n = (int)parents.size();
    auto fail = [&](const std::string & why) {
        if (err) *err = why;
        return false;
    };
    if (n == 0) return fail("empty tree");
    std::vector<int32_t> depth(n, 0);
    std::vector<std::vector<int32_t>> children(n);
    std::vector<int32_t> roots;
    int max_depth = 0;
    for (int i = 0; i < n; ++i) {
        const int p = parents[i];
        if (p < -1 || p >= i) return fail("node " + std::to_string(i) + " has parent " + std::to_string(p));
        if (p < 0) {
            roots.push_back(i);
        } else {
            depth[i] = depth[p] + 1;
            children[p].push_back(i);
        }
        max_depth = std::max(max_depth, (int)depth[i]);
    }
    if (max_depth > kTreeMaxDepth) {
        return fail("tree depth " + std::to_string(max_depth) + " > " + std::to_string(kTreeMaxDepth));
    }
    out.n = n;
    out.max_depth = max_depth;
    out.data.assign(3 * (size_t)n, 0);
    std::copy(parents.begin(), parents.end(), out.data.begin());
    std::copy(depth.begin(), depth.end(), out.data.begin() + 2 * n);
    // Preorder with an explicit stack; children in index order.
    int32_t * order = out.data.data() + n;
    int k = 0;
    std::vector<int32_t> stack(roots.rbegin(), roots.rend());
    while (!stack.empty()) {
        const int32_t v = stack.back();
        stack.pop_back();
        order[k++] = v;
        for (auto it = children[v].rbegin(); it != children[v].rend(); ++it) stack.push_back(*it);
    }
    return true;
}

ggml_tensor * tree_ssm_conv(ggml_context * ctx, ggml_tensor * x, ggml_tensor * conv_state, ggml_tensor * w,
                            ggml_tensor * tree) {
    const int64_t C = x->ne[0], n = x->ne[1], K = w->ne[0];
    GGML_ASSERT(x->type == GGML_TYPE_F32 && conv_state->type == GGML_TYPE_F32 && w->type == GGML_TYPE_F32);
    // x's rows may lie apart (a stacked product's slice): contiguous rows, 2-D
    GGML_ASSERT(ggml_is_contiguous_rows(x) && x->ne[2] == 1 && x->ne[3] == 1);
    GGML_ASSERT(ggml_is_contiguous(conv_state) && ggml_is_contiguous(w));
    GGML_ASSERT(w->ne[1] == C && conv_state->ne[0] == K - 1 && conv_state->ne[1] == C);
    GGML_ASSERT(tree->type == GGML_TYPE_I32 && tree->ne[0] == n && tree->ne[1] == 3 && ggml_is_contiguous(tree));
    return op_node(ggml_new_tensor_2d(ctx, GGML_TYPE_F32, C, n), GGML_OP_TREE_SSM_CONV, {x, conv_state, w, tree});
}

ggml_tensor * tree_gated_delta_net(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
                                   ggml_tensor * g, ggml_tensor * beta, ggml_tensor * state, ggml_tensor * tree,
                                   int max_depth) {
    const int64_t S = v->ne[0], H = v->ne[1], n = v->ne[2];
    for (ggml_tensor * t : {q, k, v, g, beta, state}) GGML_ASSERT(t->type == GGML_TYPE_F32);
    GGML_ASSERT(ggml_is_contiguous_rows(q) && ggml_is_contiguous_rows(k) && ggml_is_contiguous_rows(v));
    GGML_ASSERT(ggml_is_contiguous(g) && ggml_is_contiguous(beta) && ggml_is_contiguous(state));
    GGML_ASSERT(q->ne[0] == S && k->ne[0] == S && q->ne[1] == k->ne[1] && H % q->ne[1] == 0);
    GGML_ASSERT(q->ne[2] == n && k->ne[2] == n && v->ne[3] == 1 && q->ne[3] == 1);
    GGML_ASSERT(g->ne[0] == 1 && g->ne[1] == H && g->ne[2] == n && beta->ne[0] == 1 && beta->ne[1] == H);
    GGML_ASSERT(state->ne[0] == S && state->ne[1] == S && state->ne[2] == H && ggml_nelements(state) == S * S * H);
    GGML_ASSERT(tree->type == GGML_TYPE_I32 && tree->ne[0] == n && tree->ne[1] == 3 && ggml_is_contiguous(tree));
    GGML_ASSERT(max_depth >= 0 && max_depth <= kTreeMaxDepth);
    ggml_tensor * r = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, S * H, n);
    const int32_t params[1] = {max_depth};
    std::memcpy(r->op_params, params, sizeof(params));
    return op_node(r, GGML_OP_TREE_GATED_DELTA_NET, {q, k, v, g, beta, state, tree});
}

}  // namespace ggml_ext
