// One-token Gated DeltaNet inputs in one op (the decode step's small GDN ops fused, issue 7): the
// short conv over [cached state, the new token] with SiLU, the per-head L2 norm of q and k, the
// gate softplus(alpha + dt_bias) * a and beta = sigmoid(beta_raw); the conv state is advanced in
// place. Replaces concat, copy, ssm_conv, silu, two l2 norms, add, softplus*mul and sigmoid (nine
// kernels per layer on CUDA) for one-token forwards. A new ggml op (GGML_OP_GDN_DECODE_INPUTS,
// hooked in by patches/0001-tree-ops-hooks.patch); kernels in kernels/gdn_decode_*.
#pragma once

#include "ggml.h"

namespace ggml_ext {

// qkv [C] (one token's conv channels: q of Hk heads, k of Hk heads, v; S values per head),
// alpha and beta_raw [Hv], conv_state [K-1, C] f32 contiguous (oldest column first; updated in
// place), w [K, C] f32, dt_bias and a [Hv] f32  ->  f32 [C + 2 Hv]: q, k (each head scaled to unit
// L2 norm the way the graph's l2_norm does: rms_norm with eps / S, times 1 / sqrt(S)), v, then
// the gate, then beta. All f32; every input contiguous.
ggml_tensor * gdn_decode_inputs(ggml_context * ctx, ggml_tensor * qkv, ggml_tensor * alpha, ggml_tensor * beta_raw,
                                ggml_tensor * conv_state, ggml_tensor * w, ggml_tensor * dt_bias, ggml_tensor * a,
                                int64_t S, int64_t Hk, float eps);

// The same for n tokens (a verify's or a short prefill's, the same op in its second mode): qkv
// [C, n], alpha and beta_raw [Hv, n] (rows may lie apart: a stacked product's slices); token i's
// conv window is columns i..i+K-1 of [conv_state, qkv], and conv_state is only read  ->  f32
// [n C + 2 n Hv + (K-1) C]: the n tokens' q, k, v ([C, n]), their gates ([Hv, n]), their betas
// ([Hv, n]), then the conv state after the last token ([K-1, C], conv_state's layout), each
// value as the one-token op gives it.
ggml_tensor * gdn_verify_inputs(ggml_context * ctx, ggml_tensor * qkv, ggml_tensor * alpha, ggml_tensor * beta_raw,
                                ggml_tensor * conv_state, ggml_tensor * w, ggml_tensor * dt_bias, ggml_tensor * a,
                                int64_t S, int64_t Hk, float eps);

// The same for the n nodes of a DDTree verify (tree: ggml_ext's tree index, ggml_ext_tree.h): node
// i's conv window is its own column and its nearest ancestors', then the conv state, as
// ggml_ext::tree_ssm_conv takes them  ->  f32 [n C + 2 n Hv]: q, k, v ([C, n]), gates, betas.
ggml_tensor * gdn_tree_inputs(ggml_context * ctx, ggml_tensor * qkv, ggml_tensor * alpha, ggml_tensor * beta_raw,
                              ggml_tensor * conv_state, ggml_tensor * w, ggml_tensor * dt_bias, ggml_tensor * a,
                              ggml_tensor * tree, int64_t S, int64_t Hk, float eps);

// gdn_*_inputs' op_params[4]: 0 one token (state advanced in place), 1 n tokens (gdn_verify_inputs),
// 2 a tree's nodes (gdn_tree_inputs).
constexpr int kGdnInputsModeParam = 4;
// Tokens a block of the CUDA kernel of gdn_verify_inputs / gdn_tree_inputs (a head's weights and a
// chain's conv window read once for them): 1, 4, 8 or 16 (DFLASH_GDN_INPUTS_TOKENS), or 0 (the
// default, anything else too): 8 from 48 tokens, else 1. The same bits for each. 0 without CUDA.
void set_gdn_inputs_tokens(int tokens);
int gdn_inputs_tokens();

// ggml_ext's CUDA delta rule kernels (kernels/gdn_chain.cu for ggml_gated_delta_net, through
// patches/0007; kernels/tree_ops.cu for tree_gated_delta_net): state columns a warp, 0 (by the
// grid, the default) or 1, 2, 4 forced (DFLASH_GDN_COLUMNS too; states of fewer than 64 rows take
// 1; the outputs are the same bits for each), and whether ggml_gated_delta_net takes ggml_ext's
// chain kernel (default; DFLASH_GDN_CHAIN=0 keeps ggml's). No effect without CUDA.
void set_gdn_columns(int columns);
int gdn_columns();
void set_gdn_chain_enabled(bool on);
bool gdn_chain_enabled();
// Whether the chain kernel stages a chunk of tokens' inputs in shared memory (states of 64 rows or
// more): on by default (DFLASH_GDN_STAGED=0 starts it off). The same bits; on the H200 the 27B's
// chain delta rule 563 / 1008 / 1879 us in forwards of 16 / 32 / 64 tokens against 602 / 1088 /
// 2048 (session 17). No effect without CUDA.
void set_gdn_staged(bool on);
bool gdn_staged();
// The CUDA tree delta rule's form (kernels/tree_ops.cu): 0 by the grid (the default: paths where
// the walk would leave most multiprocessors idle), 1 the walk (a warp visits every node), 2 the
// paths (a warp a preorder segment, ancestors replayed); DFLASH_TREE_GDN=walk|paths too. The same
// bits either way. No effect without CUDA.
void set_tree_gdn_mode(int mode);
int tree_gdn_mode();

// Nodes that need not give a decode step's bits: allow_reordered_delta_rule marks a
// ggml_gated_delta_net node (an op_params slot ggml does not use; no effect on the CPU), or a
// ggml_ext::tree_gated_delta_net node of at most 64 nodes (ggml_ext_tree.h); CUDA may then run its
// sums in another order:
// - a chain with one round of warp reductions a token (kernels/gdn_chain_one_round.cu, S of 64 or
//   128, 2 tokens or more): on by default; set_gdn_one_round(false) or DFLASH_GDN_ONE_ROUND=0 keep
//   the chain kernel;
// - the chunked delta rule (kernels/gdn_chunked.cu: 64 tokens at a time as matrix products, S of 64
//   or 128, from kChunkedDeltaRuleMinTokens to kChunkedDeltaRuleMaxTokens tokens; trees too). Off
//   by default: slower than the chain and tree kernels on the H200 so far (gdn_chunked.cu's
//   numbers); set_gdn_chunked(true) or DFLASH_GDN_CHUNKED=1 turn it on for marked nodes, and the
//   least tokens can be moved (DFLASH_GDN_CHUNKED_MIN) for benches. It goes before the one-round
//   kernel when on. No effect without CUDA.
constexpr int kChunkedDeltaRuleMinTokens = 8;
constexpr int kChunkedDeltaRuleMaxTokens = 512;
constexpr int kGdnReorderedSlot = 8;               // ggml's GATED_DELTA_NET keeps its K in slot 0
constexpr int32_t kGdnReorderedFlag = 0x44464743;  // "DFGC"
inline ggml_tensor * allow_reordered_delta_rule(ggml_tensor * gdn) {
    gdn->op_params[kGdnReorderedSlot] = kGdnReorderedFlag;
    return gdn;
}
inline bool reordered_delta_rule_allowed(const ggml_tensor * gdn) {  // or a tree_gated_delta_net node
    return gdn->op_params[kGdnReorderedSlot] == kGdnReorderedFlag;
}
void set_gdn_chunked(bool on);
bool gdn_chunked();
void set_gdn_chunked_min_tokens(int n);  // <= 0: the default
int gdn_chunked_min_tokens();
void set_gdn_one_round(bool on);
bool gdn_one_round();
// columns a lane of the one-round kernel: 1, 2 or 4 (DFLASH_GDN_ONE_ROUND_COLUMNS); 0, the default:
// by the form (a chain 2, a tree 1)
void set_gdn_one_round_columns(int columns);
int gdn_one_round_columns();
// lanes a state column of the one-round kernel: 8 or 16 (DFLASH_GDN_ONE_ROUND_LANES); 0, the default
// (8)
void set_gdn_one_round_lanes(int lanes);
int gdn_one_round_lanes();
// tokens a step of the one-round kernel (one round of reductions a step; in a tree, runs of nodes
// each the parent of the next): 1 (the default), 2 or 4 (DFLASH_GDN_ONE_ROUND_STEP); with 8 lanes
// a column only; anything else is 1
void set_gdn_one_round_step(int tokens);
int gdn_one_round_step();
// a marked chain's 16 tokens at a time in parallel (kernels/gdn_chain_gram.cu) in place of the
// one-round kernel (which must be on): off by default (slower on the H100, session 33);
// DFLASH_GDN_GRAM=1 turns it on
void set_gdn_gram(bool on);
bool gdn_gram();

}  // namespace ggml_ext
