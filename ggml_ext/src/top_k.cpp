#include "ggml_ext_top_k.h"

namespace ggml_ext {

ggml_tensor * top_k_rows(ggml_context * ctx, ggml_tensor * a, int k) {
    ggml_tensor * t = ggml_top_k(ctx, a, k);
    t->op_params[kTopKTagSlot] = kTopKRowsTag;  // ggml's TOP_K reads no op params
    return t;
}

}  // namespace ggml_ext
