/* The CPU side of batch invariance (ggml_ext/BATCH_INVARIANCE.md), in C for ggml-cpu (patch 0006):
   nodes flagged here take the kernels whose arithmetic for one token does not depend on how many
   tokens the node has, so a verify gives each token the bits of one-token decoding.
   - MUL_MAT: ggml's per-element vec_dot for every column, never the batched kernels (tiled k-quants
     from 8 columns, llamafile's sgemm from 2), which sum in other orders. A one-column product
     always takes vec_dot. Weights that ggml-cpu repacked (Q4_K and others on AVX2 / AVX-512, the
     "CPU_REPACK" buffer) take the repack's gemv for every column instead of its 4-column gemm.
   - FLASH_ATTN_EXT: the reference path, one query at a time over all its rows in order, never the
     tiled kernel for many queries nor the split over threads of one query's rows (from 512 rows). */
#pragma once

#include "ggml.h"

#define GGML_EXT_CPU_INVARIANT_FLAG 0x44465343 /* "DFSC" */
/* op_params slot of a MUL_MAT: ggml keeps the accumulator precision in 0, the hint in 1 and the
   src1 precision in 3 (ggml_prec_set_src; CUDA's mmq asserts on it), ggml_ext's CUDA tag is in 2 */
#define GGML_EXT_MUL_MAT_CPU_SLOT 8
#define GGML_EXT_FLASH_ATTN_CPU_SLOT 8         /* of a FLASH_ATTN_EXT (0..3: scale, bias, softcap, prec) */

static inline bool ggml_ext_cpu_column_invariant(const struct ggml_tensor * t) {
    return t->op == GGML_OP_MUL_MAT && t->op_params[GGML_EXT_MUL_MAT_CPU_SLOT] == GGML_EXT_CPU_INVARIANT_FLAG;
}

static inline bool ggml_ext_cpu_attention_reference(const struct ggml_tensor * t) {
    return t->op == GGML_OP_FLASH_ATTN_EXT && t->op_params[GGML_EXT_FLASH_ATTN_CPU_SLOT] == GGML_EXT_CPU_INVARIANT_FLAG;
}
