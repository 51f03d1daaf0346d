// SwiGLU read by the quantizer of the weight matmul after it (patches/0009). A verify of the 27B
// runs 112 SwiGLU nodes (the FFN's silu(gate) * up before ffn_down, the delta rule's gated output
// before ssm_out), each a kernel that writes n x 17408 (or 6144) floats for the next matmul's
// quantizer to read back; decode runs the 48 of the gated outputs. Here the quantizer computes
// silu(a) * b from the GLU's inputs instead (act_source.cuh: ggml's float operations, so the
// quantized activations, and the outputs, are the unfused graph's bits) and the GLU node is
// skipped. The quantizer is a kernel of its own that reads a and b before the matmul's kernel
// writes, so the matmul's output may reuse their memory (ggml-alloc frees them after the GLU).
#include "ggml_ext_gemv_cuda.cuh"
#include "ggml_ext_matmul.h"
#include "ggml_ext_matmul_cuda.cuh"

#include <atomic>
#include <cstdlib>

#include "fusion_patterns.h"
#include "ggml-impl.h"

namespace {

bool fuse_glu_flag = [] {
    const char * e = std::getenv("DFLASH_FUSE_GLU");
    return !(e && e[0] == '0');
}();
std::atomic<int64_t> glu_fusions{0};
// The attention's sigmoid output gate read in place by o_proj's quantizer (patches/0011): on by
// default since session 33 (h100-s33-*); DFLASH_FUSE_SIGMOID_GATE=0 turns it off.
bool fuse_gate_flag = [] {
    const char * e = std::getenv("DFLASH_FUSE_SIGMOID_GATE");
    return !(e && e[0] == '0');
}();
std::atomic<int64_t> gate_fusions{0};

// The source of a split SwiGLU node (silu(src0) * src1, not swapped), f32 matrices of its shape.
bool swiglu_source(const ggml_tensor * glu, ActSource & s) {
    const ggml_tensor * a = glu->src[0];
    const ggml_tensor * b = glu->src[1];
    if (glu->op != GGML_OP_GLU || ggml_get_glu_op(glu) != GGML_GLU_OP_SWIGLU || ggml_get_op_params_i32(glu, 1) != 0 ||
        !a || !b || !plain_f32_columns(glu) || !plain_f32_columns(a) || !plain_f32_columns(b) ||
        !ggml_are_same_shape(a, glu) || !ggml_are_same_shape(b, glu)) {
        return false;
    }
    s.x = (const float *)a->data;
    s.sx = (int64_t)(a->nb[1] / sizeof(float));
    s.up = (const float *)b->data;
    s.sup = (int64_t)(b->nb[1] / sizeof(float));
    return true;
}

// The engine's path for a tagged product of n columns (ggml_ext_cuda_mul_mat_invariant's choice)
// from x, into dst (+ res).
bool run_product(ggml_backend_cuda_context & ctx, const ggml_tensor * mm, const ActSource & x, int64_t n,
                 ggml_tensor * dst, const ggml_tensor * res) {
    const ggml_tensor * w = mm->src[0];
    if (ggml_ext::is_mul_mat_tiles(mm)) {
        if (ggml_ext_cuda_gemm_mma_from(ctx, w, x, n, dst, res)) return true;
        return n <= kGemvMaxColumns && ggml_ext_cuda_gemv_from(ctx, w, x, n, dst, res);
    }
    return ggml_ext::is_mul_mat_invariant(mm) && ggml_ext_cuda_gemv_from(ctx, w, x, n, dst, res);
}

}  // namespace

namespace ggml_ext {
void set_fuse_glu_enabled(bool on) { fuse_glu_flag = on; }
bool fuse_glu_enabled() { return fuse_glu_flag; }
int64_t mul_mat_glu_fusions() { return glu_fusions.load(); }
void set_fuse_sigmoid_gate_enabled(bool on) { fuse_gate_flag = on; }
bool fuse_sigmoid_gate_enabled() { return fuse_gate_flag; }
int64_t mul_mat_sigmoid_gate_fusions() { return gate_fusions.load(); }
}  // namespace ggml_ext

int ggml_ext_cuda_run_glu_product(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int m, const ActSource & x,
                                  int64_t n) {
    ggml_tensor * mm = cgraph->nodes[m];
    // The residual add after the product (ggml's mul_mat + add fusion, which this one takes over).
    if (m + 1 < cgraph->n_nodes && ggml_ext::fuse_add_enabled() && ggml_node_has_n_uses(cgraph, m, 1)) {
        ggml_tensor * add = cgraph->nodes[m + 1];
        const bool adds_mm = add->op == GGML_OP_ADD && (add->src[0] == mm || add->src[1] == mm);
        if (adds_mm && (add->flags & GGML_TENSOR_FLAG_COMPUTE) && ggml_are_same_shape(add->src[0], add->src[1]) &&
            ggml_are_same_shape(add, mm) && run_product(ctx, mm, x, n, add, add->src[add->src[0] == mm ? 1 : 0])) {
            return 2;
        }
    }
    return run_product(ctx, mm, x, n, mm, nullptr) ? 1 : 0;
}

int ggml_ext_cuda_try_fuse_glu(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i) {
    if (!fuse_glu_flag || i + 1 >= cgraph->n_nodes) return 0;
    const ggml_tensor * glu = cgraph->nodes[i];
    ggml_tensor * mm = cgraph->nodes[i + 1];
    ActSource x;
    if (mm->op != GGML_OP_MUL_MAT || mm->src[1] != glu || (mm->flags & GGML_TENSOR_FLAG_COMPUTE) == 0 ||
        !ggml_node_has_n_uses(cgraph, i, 1) || !swiglu_source(glu, x)) {
        return 0;
    }
    const int taken = ggml_ext_cuda_run_glu_product(ctx, cgraph, i + 1, x, glu->ne[1]);
    if (taken > 0) glu_fusions++;
    return taken;
}

// The attention's output gate (qwen35_graph.cpp's attention; fusion_patterns' sigmoid_gate_at):
// the gate's copy out of the [q; gate] rows (CONT), its sigmoid and the multiply with the output
// o are skipped, o_proj's quantizer computing sigmoid(gate) * o from the rows in place (16 copy and
// 16 sigmoid-multiply kernels a verify of the 27B). The residual add after the product is taken
// as for a SwiGLU.
int ggml_ext_cuda_try_fuse_sigmoid_gate(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i) {
    if (!fuse_gate_flag) return 0;
    const int other = ggml_ext::fusion_patterns::sigmoid_gate_at(cgraph, i);
    if (other < 0) return 0;
    const ggml_tensor * view = cgraph->nodes[i]->src[0];
    const ggml_tensor * o = cgraph->nodes[i + 2]->src[other];
    const int64_t n = o->ne[1];
    if (n < 2) return 0;  // one column: the GEMV, whose quantizer does not take a gate
    ActSource x;
    x.x = (const float *)o->data;
    x.sx = (int64_t)(o->nb[1] / sizeof(float));
    x.gate = (const float *)view->data;
    x.sgate = (int64_t)(view->nb[2] / sizeof(float));
    x.gate_block = (int)view->ne[0];
    x.gate_stride = (int)(view->nb[1] / sizeof(float));
    const int taken = ggml_ext_cuda_run_glu_product(ctx, cgraph, i + 3, x, n);
    if (taken == 0) return 0;
    gate_fusions++;
    return 2 + taken;
}
