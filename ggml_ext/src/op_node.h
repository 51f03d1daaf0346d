// The last step of every ggml_ext graph constructor: the result tensor becomes node `op` over srcs
// (in order); op_params are the constructor's to set.
#pragma once

#include "ggml.h"

#include <initializer_list>

namespace ggml_ext {

inline ggml_tensor * op_node(ggml_tensor * r, ggml_op op, std::initializer_list<ggml_tensor *> srcs) {
    GGML_ASSERT(srcs.size() <= GGML_MAX_SRC);
    r->op = op;
    int i = 0;
    for (ggml_tensor * t : srcs) r->src[i++] = t;
    return r;
}

}  // namespace ggml_ext
