// ggml_ext's CUDA matmul for tagged MUL_MAT nodes, called from ggml-cuda's dispatch
// (patches/0002): the invariant matmul (mul_mat_invariant.cu), and for mul_mat_tiles nodes the
// tensor-core GEMM (2..64 columns, gemm_kquant_mma.cu) or the GEMV (one column, or 1..8 columns of
// what the GEMM does not take; gemv_kquant.cu). Returns false when it does not take the node (ggml
// computes it as usual).
#pragma once

#include "ggml-cuda/common.cuh"

bool ggml_ext_cuda_mul_mat_invariant(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

// A 2-D f32 tensor whose columns (ne[0] values each) are contiguous, nb[1] bytes apart: what the
// quantizers read and the kernels write.
inline bool plain_f32_columns(const ggml_tensor * t) {
    return t->type == GGML_TYPE_F32 && t->nb[0] == sizeof(float) && t->ne[2] == 1 && t->ne[3] == 1;
}

// ggml-cuda's mul_mat + add fusion for tagged MUL_MAT nodes (patches/0008): mm's product of 2..48
// columns through the tensor-core GEMM with res (the add's other operand) added as add's outputs are written, the
// same float addition as the add node's. False when it does not take them (ggml runs both nodes).
bool ggml_ext_cuda_mul_mat_add(ggml_backend_cuda_context & ctx, const ggml_tensor * mm, ggml_tensor * add,
                               const ggml_tensor * res);

// ggml-cuda's fusion pass at a GLU node i (patches/0009): a split SwiGLU read only by the tagged
// MUL_MAT after it (and maybe an ADD of that product and a residual after that) runs as that
// product with the quantizer reading silu(a) * b from the GLU's inputs (glu_fusion.cu). Returns
// the nodes it took after node i (1 or 2), or 0: ggml runs them as usual.
int ggml_ext_cuda_try_fuse_glu(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i);

// The tagged MUL_MAT at node m, whose input (a SwiGLU node before it, skipped) the quantizer
// computes from x (n columns), and the residual ADD after it where the GEMM takes it: the nodes
// taken from m on (1 or 2), or 0 (nothing launched). glu_fusion.cu; rms_norm_fusion.cu's head norms.
struct ActSource;
int ggml_ext_cuda_run_glu_product(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int m, const ActSource & x,
                                  int64_t n);

// ggml-cuda's fusion pass at a CONT node i (patches/0011): the attention's output gate, copied out
// of a product's rows, its sigmoid and the multiply with the output read only by a tagged
// MUL_MAT run as that product, its quantizer reading the gate in place (glu_fusion.cu; when
// switched on). Returns the nodes it took after node i (3 or 4 with the residual ADD), or 0.
int ggml_ext_cuda_try_fuse_sigmoid_gate(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i);

// ggml-cuda's fusion pass at an RMS_NORM node i (patches/0010): rms_norm(x) * w read only by the
// tagged MUL_MAT after it runs as that product, the GEMM's quantizer computing the norm from x
// and w (rms_norm_fusion.cu); when switched on, also read by the two tagged MUL_MATs after it (one
// quantizer for both), or a per-head norm whose SwiGLU feeds a tagged MUL_MAT. Returns the nodes
// it took after node i (2: the MUL and the MUL_MAT; 3: the MUL and two MUL_MATs; for a head norm
// the MUL, views, the GLU, the MUL_MAT and maybe an ADD), or 0: ggml runs them as usual.
int ggml_ext_cuda_try_fuse_rms_norm(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i);

// mmq launch policy for MUL_MAT nodes tagged ggml_ext::kMulMatTilesTag (patches/0003). While
// ggml's mmq computes such a node (the scope, opened in ggml_cuda_mul_mat_q), launch_mul_mat_q
// asks ggml_ext_mmq_prefer_tiles whether to run one block per output tile instead of stream-k.
struct ggml_ext_mmq_tiles_scope {
    explicit ggml_ext_mmq_tiles_scope(const ggml_tensor * dst);
    ~ggml_ext_mmq_tiles_scope();
    ggml_ext_mmq_tiles_scope(const ggml_ext_mmq_tiles_scope &) = delete;
    ggml_ext_mmq_tiles_scope & operator=(const ggml_ext_mmq_tiles_scope &) = delete;
    bool prev;
};

// ntiles output tiles over nsm multiprocessors, k_iters mmq iterations (256 values of K) each.
bool ggml_ext_mmq_prefer_tiles(int ntiles, int nsm, int k_iters);
