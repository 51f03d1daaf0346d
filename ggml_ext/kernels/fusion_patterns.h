// Where rms_norm_fusion.cu's and glu_fusion.cu's sigmoid-gate fusions apply in a graph, as far as
// the graph's structure and its tensors' shapes decide it (the products' types and column counts
// are the CUDA side's to judge). Shared with the CPU build: TargetEngine::fusion_patterns counts
// them in the engine's own graphs, so CI checks that every form finds what it is meant for.
#pragma once

#include "ggml-impl.h"
#include "ggml_ext_matmul.h"

namespace ggml_ext::fusion_patterns {

// A computed product of the engine's (tagged mul_mat_tiles) reading `in`.
inline bool tagged_product_of(const ggml_tensor * mm, const ggml_tensor * in) {
    return mm->op == GGML_OP_MUL_MAT && mm->src[1] == in && (mm->flags & GGML_TENSOR_FLAG_COMPUTE) &&
           is_mul_mat_tiles(mm);
}

// An RMS_NORM at node i read only by the MUL of its weight at i + 1, that MUL computed and read
// `uses` times.
inline bool norm_mul_at(const ggml_cgraph * g, int i, int uses) {
    if (i + 1 >= g->n_nodes) return false;
    const ggml_tensor * norm = g->nodes[i];
    const ggml_tensor * mul = g->nodes[i + 1];
    return norm->op == GGML_OP_RMS_NORM && mul->op == GGML_OP_MUL && mul->src[0] == norm &&
           (mul->flags & GGML_TENSOR_FLAG_COMPUTE) && ggml_node_has_n_uses(g, i, 1) &&
           ggml_node_has_n_uses(g, i + 1, uses);
}

// The norm's one product right after it (the FFN's [gate; up], a layer's one stacked input
// projection).
inline bool single_at(const ggml_cgraph * g, int i) {
    return i + 2 < g->n_nodes && norm_mul_at(g, i, 1) && tagged_product_of(g->nodes[i + 2], g->nodes[i + 1]);
}

// Two products right after the norm, both reading it (a Q6_K attn_qkv or attn_v beside the Q4_K
// stack of the layer's other input projections).
inline bool pair_at(const ggml_cgraph * g, int i) {
    return i + 3 < g->n_nodes && norm_mul_at(g, i, 2) && tagged_product_of(g->nodes[i + 2], g->nodes[i + 1]) &&
           tagged_product_of(g->nodes[i + 3], g->nodes[i + 1]);
}

// A pair whose two products are read only by the SwiGLU right after them, as its gate and up (the
// FFN of a decode step, whose gate and up stay apart: qwen35_graph.cpp's stack_ffn). The GLU is
// node i + 4.
inline bool glu_pair_at(const ggml_cgraph * g, int i) {
    if (i + 4 >= g->n_nodes || !pair_at(g, i)) return false;
    const ggml_tensor * glu = g->nodes[i + 4];
    const ggml_tensor * mm1 = g->nodes[i + 2];
    const ggml_tensor * mm2 = g->nodes[i + 3];
    if (glu->op != GGML_OP_GLU || ggml_get_glu_op(glu) != GGML_GLU_OP_SWIGLU || ggml_get_op_params_i32(glu, 1) != 0 ||
        (glu->flags & GGML_TENSOR_FLAG_COMPUTE) == 0) {
        return false;
    }
    const bool both = (glu->src[0] == mm1 && glu->src[1] == mm2) || (glu->src[0] == mm2 && glu->src[1] == mm1);
    return both && ggml_node_has_n_uses(g, i + 2, 1) && ggml_node_has_n_uses(g, i + 3, 1);
}

// The delta rule's gated output (qwen35_graph.cpp's gated_output): RMS_NORM of o [S, Hv, n] (heads
// adjacent, f32), the MUL of its weight [S], reshapes to [S * Hv, n], swiglu(z, that) read only
// by a product after it. The GLU's node index, or -1.
inline int head_norm_glu_at(const ggml_cgraph * g, int i) {
    if (!norm_mul_at(g, i, 1)) return -1;
    const ggml_tensor * norm = g->nodes[i];
    const ggml_tensor * mul = g->nodes[i + 1];
    // past the reshapes of the normed heads, each the one reader of the one before (a view's own
    // count: ggml_node_has_n_uses refuses views, whose source other views might read, which the
    // single uses of the mul and of each view rule out here)
    int k = i + 2;
    const ggml_tensor * b = mul;
    while (k < g->n_nodes && (g->nodes[k]->op == GGML_OP_RESHAPE || g->nodes[k]->op == GGML_OP_VIEW) &&
           g->nodes[k]->src[0] == b && ggml_is_contiguous(g->nodes[k]) && ggml_node_get_use_count(g, k) == 1) {
        b = g->nodes[k++];
    }
    if (k + 1 >= g->n_nodes) return -1;
    const ggml_tensor * glu = g->nodes[k];
    if (glu->op != GGML_OP_GLU || ggml_get_glu_op(glu) != GGML_GLU_OP_SWIGLU || ggml_get_op_params_i32(glu, 1) != 0 ||
        glu->src[1] != b || (glu->flags & GGML_TENSOR_FLAG_COMPUTE) == 0 || !ggml_node_has_n_uses(g, k, 1) ||
        !tagged_product_of(g->nodes[k + 1], glu)) {
        return -1;
    }
    const ggml_tensor * o = norm->src[0];
    const ggml_tensor * w = mul->src[1];
    const ggml_tensor * z = glu->src[0];
    const int64_t S = o->ne[0];
    const bool shapes = o->type == GGML_TYPE_F32 && norm->type == GGML_TYPE_F32 && mul->type == GGML_TYPE_F32 &&
                        glu->type == GGML_TYPE_F32 && z && z->type == GGML_TYPE_F32 && o->nb[0] == sizeof(float) &&
                        o->nb[1] == S * (int64_t)sizeof(float) && o->ne[3] == 1 && ggml_are_same_shape(o, norm) &&
                        ggml_are_same_shape(o, mul) && glu->ne[0] == S * o->ne[1] && glu->ne[1] == o->ne[2] &&
                        glu->ne[2] == 1 && glu->ne[3] == 1 && ggml_are_same_shape(z, glu) &&
                        z->nb[0] == sizeof(float) && w->type == GGML_TYPE_F32 && ggml_is_contiguous(w) &&
                        ggml_nelements(w) == S && w->ne[0] == S;
    return shapes ? k : -1;
}

// The attention's output gate (qwen35_graph.cpp's attention): a CONT at node i of a gate view
// [block, blocks, n] (f32, read in place: its blocks `stride` floats apart), sigmoid of it, the MUL
// of that and the output o [block * blocks, n], read only by a product after it, each node read
// once. The MUL's other operand's index among its sources (o), or -1.
inline int sigmoid_gate_at(const ggml_cgraph * g, int i) {
    if (i + 3 >= g->n_nodes) return -1;
    const ggml_tensor * cont = g->nodes[i];
    const ggml_tensor * sig = g->nodes[i + 1];
    const ggml_tensor * mul = g->nodes[i + 2];
    if (cont->op != GGML_OP_CONT || sig->op != GGML_OP_UNARY || ggml_get_unary_op(sig) != GGML_UNARY_OP_SIGMOID ||
        sig->src[0] != cont || mul->op != GGML_OP_MUL || (mul->src[0] != sig && mul->src[1] != sig) ||
        !(sig->flags & GGML_TENSOR_FLAG_COMPUTE) || !(mul->flags & GGML_TENSOR_FLAG_COMPUTE) ||
        !ggml_node_has_n_uses(g, i, 1) || !ggml_node_has_n_uses(g, i + 1, 1) || !ggml_node_has_n_uses(g, i + 2, 1) ||
        !tagged_product_of(g->nodes[i + 3], mul)) {
        return -1;
    }
    const int other = mul->src[0] == sig ? 1 : 0;
    const ggml_tensor * view = cont->src[0];
    const ggml_tensor * o = mul->src[other];
    const bool shapes = view && view->type == GGML_TYPE_F32 && cont->type == GGML_TYPE_F32 &&
                        sig->type == GGML_TYPE_F32 && mul->type == GGML_TYPE_F32 && o->type == GGML_TYPE_F32 &&
                        view->nb[0] == sizeof(float) && view->nb[1] % sizeof(float) == 0 &&
                        view->nb[2] % sizeof(float) == 0 && view->nb[1] >= view->ne[0] * (int64_t)sizeof(float) &&
                        view->ne[3] == 1 && cont->ne[0] == view->ne[0] * view->ne[1] && cont->ne[1] == view->ne[2] &&
                        cont->ne[2] == 1 && cont->ne[3] == 1 && ggml_are_same_shape(cont, sig) &&
                        ggml_are_same_shape(cont, mul) && ggml_are_same_shape(cont, o) && o->nb[0] == sizeof(float);
    return shapes ? other : -1;
}

struct Counts {
    int single = 0, pair = 0, head = 0, gate = 0, glu = 0;  // glu: the pairs a SwiGLU reads
};

// Each RMS_NORM node's form, if any, and the sigmoid gates.
inline Counts count(const ggml_cgraph * g) {
    Counts c;
    for (int i = 0; i < g->n_nodes; ++i) {
        if (g->nodes[i]->op == GGML_OP_CONT) {
            c.gate += sigmoid_gate_at(g, i) >= 0;
            continue;
        }
        if (g->nodes[i]->op != GGML_OP_RMS_NORM) continue;
        if (single_at(g, i)) {
            c.single++;
        } else if (pair_at(g, i)) {
            c.pair++;
            c.glu += glu_pair_at(g, i);
        } else if (head_norm_glu_at(g, i) >= 0) {
            c.head++;
        }
    }
    return c;
}

}  // namespace ggml_ext::fusion_patterns
