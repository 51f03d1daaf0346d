// ggml_top_k tagged for ggml_ext's CUDA kernel (kernels/top_k_rows.cu, patches/0004): one pass
// over each row for k <= 32 candidates over rows of >= 2048 values, instead of ggml's full sort
// of the row. The same op elsewhere (CPU, other shapes); the order of the k indices is open, as
// for ggml_top_k. Untagged nodes (upstream's) keep ggml's kernel.
#pragma once

#include "ggml.h"

namespace ggml_ext {

constexpr int kTopKTagSlot = 2;
constexpr int32_t kTopKRowsTag = 0x44465333;  // "DFS3"

ggml_tensor * top_k_rows(ggml_context * ctx, ggml_tensor * a, int k);

inline bool is_top_k_rows(const ggml_tensor * t) {
    return t->op == GGML_OP_TOP_K && t->op_params[kTopKTagSlot] == kTopKRowsTag;
}

}  // namespace ggml_ext
