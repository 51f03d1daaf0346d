// DDTree draft tree (REFERENCE.md section 4), host side: build the prefix-closed tree of the N
// most probable prefixes under Q(y) = prod_d q_d(y_d) from the drafter's per-depth top-K lists,
// and walk it with the target's choice at every node.
//
// Nodes are numbered 0..n-1 in emission order, which is topological (a parent comes before its
// children). "Positions" number the verify rows: position 0 is the root (the anchor token),
// position i+1 is node i.
#pragma once

#include <cstdint>
#include <vector>

namespace dflash {

constexpr int kTreeMaxBudget = 65536;  // nodes, root excluded
constexpr int kTreeMaxDepth = 4096;    // L (block size - 1)
constexpr int kTreeMaxTopK = 4096;     // K

struct DraftTree {
    std::vector<int32_t> tokens;   // [n] token of each node
    std::vector<int32_t> parents;  // [n] parent node index, -1 = the root (anchor)
    std::vector<int32_t> depths;   // [n] 1-based depth (root = 0)
    std::vector<int32_t> ranks;    // [n] 0-based rank of the token in its depth's top-K list (-1: unknown)
    std::vector<float> logq;       // [n] cumulative log-prob of the path root..node (0 when unknown)
    // Child map over positions (0 = root, i+1 = node i): the children of position p are the node
    // indices child_list[child_start[p] .. child_start[p+1]), in increasing node order (for a built
    // tree: most probable first).
    std::vector<int32_t> child_start;  // [n+2]
    std::vector<int32_t> child_list;   // [n]
    int n_chain = 0;                   // nodes 0..n_chain-1 are the seeded top-1 chain
    int max_depth = 0;

    int size() const { return (int)tokens.size(); }
};

// top_ids / top_logp: n_depth x top_k row-major, row d-1 = the candidates for depth d, log-probs
// non-increasing along a row (best first), token ids >= 0 and distinct within a row, no NaN or
// +inf (-inf is allowed). budget >= 1 is the number of draft nodes, root excluded; the tree has
// min(budget, number of distinct prefixes) nodes. chain_seed: nodes 0..min(L, budget)-1 are the
// top-1 chain, the rest of the budget is filled best-first with the other prefixes.
// Ties in logq are broken by depth (shallower first), then by the parent's node index, then by
// rank, so the result is deterministic. The set is optimal when every log-prob is <= 0.
// Throws InvalidParameter on bad arguments. `out` is overwritten (its capacity is reused).
void build_tree(const int32_t * top_ids, const float * top_logp, int n_depth, int top_k, int budget, bool chain_seed,
                DraftTree & out);
DraftTree build_tree(const int32_t * top_ids, const float * top_logp, int n_depth, int top_k, int budget,
                     bool chain_seed = true);

// A tree from its tokens and parents (parents[i] in [-1, i)); depths and the child map are
// derived, ranks are -1 and logq 0. Throws InvalidParameter when the parents are not topological.
DraftTree tree_from_parents(const int32_t * tokens, const int32_t * parents, int n);

struct TreeWalk {
    std::vector<int32_t> path;  // accepted node indices, root excluded, root to leaf
    int32_t next_token = -1;    // the target's choice at the last accepted position: the next anchor
};

// choices[p] is the target's token at position p (n_choices must be tree.size() + 1). From the
// root: y = choices[pos]; if a child of pos has token y (the first such child when several do)
// go there, else stop; the last y is the next anchor.
TreeWalk walk_tree(const DraftTree & tree, const int32_t * choices, int n_choices);

}  // namespace dflash
