/* The CPU side of ggml_ext_matmul.h, in C for ggml-cpu.c (patches/0006): a MUL_MAT node flagged
   here is computed with ggml's per-element vec_dot for every column, never with the batched
   kernels (tiled k-quants from 8 columns, llamafile's sgemm from 2), which sum in another order.
   A one-column product always takes vec_dot, so a verify's columns then get the bits of
   one-token decoding (ggml_ext/BATCH_INVARIANCE.md). */
#pragma once

#include "ggml.h"

#define GGML_EXT_MUL_MAT_CPU_SLOT 3                    /* op_params slot (2 holds ggml_ext's CUDA tag) */
#define GGML_EXT_MUL_MAT_CPU_COLUMN_INVARIANT 0x44465343 /* "DFSC" */

static inline bool ggml_ext_cpu_column_invariant(const struct ggml_tensor * t) {
    return t->op == GGML_OP_MUL_MAT && t->op_params[GGML_EXT_MUL_MAT_CPU_SLOT] == GGML_EXT_MUL_MAT_CPU_COLUMN_INVARIANT;
}
