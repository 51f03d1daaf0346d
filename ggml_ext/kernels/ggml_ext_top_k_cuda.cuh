// ggml_ext's CUDA top-K for few candidates over long rows and argmax of long rows, called from
// ggml-cuda's dispatch of GGML_OP_TOP_K and GGML_OP_ARGMAX (patches/0004): top-K nodes tagged by
// ggml_ext::top_k_rows (top_k_rows.cu), every argmax of rows of 32768 values or more
// (argmax_rows.cu). Each returns false when it does not take the node (ggml computes it).
#pragma once

#include "ggml-cuda/common.cuh"

bool ggml_ext_cuda_top_k(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
bool ggml_ext_cuda_argmax(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
