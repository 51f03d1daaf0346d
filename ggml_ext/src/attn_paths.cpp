// Graph constructor of the path attention op; the kernels live in ../kernels.
#include "ggml_ext_attn.h"
#include "op_node.h"

#include <algorithm>
#include <cstring>

namespace ggml_ext {

ggml_tensor * attn_paths(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v, ggml_tensor * paths,
                         float scale) {
    const int64_t D = q->ne[0], H = q->ne[1], n = q->ne[2], Hkv = k->ne[1];
    GGML_ASSERT(q->type == GGML_TYPE_F32 && q->nb[0] == sizeof(float) && q->ne[3] == 1);
    GGML_ASSERT(attn_paths_supports_type(k->type) && attn_paths_supports_type(v->type));
    GGML_ASSERT(k->ne[0] == D && v->ne[0] == D && v->ne[1] == Hkv && v->ne[2] == k->ne[2] && Hkv > 0 && H % Hkv == 0);
    GGML_ASSERT(k->nb[0] == ggml_type_size(k->type) && v->nb[0] == ggml_type_size(v->type));
    GGML_ASSERT(paths->type == GGML_TYPE_I32 && paths->ne[1] == n && paths->ne[0] >= 3 && ggml_is_contiguous(paths));
    ggml_tensor * r = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, D, H, n);
    std::memcpy(r->op_params, &scale, sizeof(scale));
    return op_node(r, GGML_OP_ATTN_PATHS, {q, k, v, paths});
}

std::vector<int32_t> attn_paths_rows(int32_t start, int n, const std::vector<int32_t> & parents) {
    const int W = n + 2;
    std::vector<int32_t> out((size_t)W * n, 0);
    std::vector<int32_t> path;
    for (int i = 0; i < n; ++i) {
        path.clear();
        if (parents.empty()) {
            for (int j = 0; j <= i; ++j) path.push_back(start + j);
        } else {
            for (int a = i; a >= 0; a = parents[a]) path.push_back(start + a);
            std::reverse(path.begin(), path.end());
        }
        int32_t * col = out.data() + (size_t)i * W;
        col[0] = start;
        col[1] = (int32_t)path.size();
        std::copy(path.begin(), path.end(), col + 2);
    }
    return out;
}

}  // namespace ggml_ext
