// ggml_ext's CUDA top-K for few candidates over long rows, called from ggml-cuda's dispatch of
// GGML_OP_TOP_K (patches/0004): nodes tagged by ggml_ext::top_k_rows. Returns false when it does
// not take the node (ggml computes it).
#pragma once

#include "ggml-cuda/common.cuh"

bool ggml_ext_cuda_top_k(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
