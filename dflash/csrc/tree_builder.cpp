#include "tree_builder.h"

#include "errors.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace dflash {

namespace {

// One prefix waiting in the heap: the node it would become is (parent, depth, rank).
struct Cand {
    double logq;
    int32_t depth;
    int32_t parent;
    int32_t rank;
};

// Max-heap order: higher logq first, then shallower, then the earlier parent, then the lower rank.
// (depth, parent, rank) identifies a prefix, so the order is total and the result deterministic.
struct CandLess {
    bool operator()(const Cand & a, const Cand & b) const {
        if (a.logq != b.logq) return a.logq < b.logq;
        if (a.depth != b.depth) return a.depth > b.depth;
        if (a.parent != b.parent) return a.parent > b.parent;
        return a.rank > b.rank;
    }
};

void validate_candidates(const int32_t * top_ids, const float * top_logp, int n_depth, int top_k, int budget) {
    if (n_depth < 1 || n_depth > kTreeMaxDepth)
        throw InvalidParameter("build_tree: the number of depths must be in 1.." + std::to_string(kTreeMaxDepth) +
                               ", got " + std::to_string(n_depth));
    if (top_k < 1 || top_k > kTreeMaxTopK)
        throw InvalidParameter("build_tree: top_k must be in 1.." + std::to_string(kTreeMaxTopK) + ", got " +
                               std::to_string(top_k));
    if (budget < 1 || budget > kTreeMaxBudget)
        throw InvalidParameter("build_tree: the node budget must be in 1.." + std::to_string(kTreeMaxBudget) +
                               ", got " + std::to_string(budget));
    if (!top_ids || !top_logp) throw InvalidParameter("build_tree: missing candidate arrays");
    std::vector<int32_t> sorted(top_k);
    for (int d = 0; d < n_depth; ++d) {
        const int32_t * ids = top_ids + (size_t)d * top_k;
        const float * lp = top_logp + (size_t)d * top_k;
        const std::string where = " at depth " + std::to_string(d + 1);
        for (int r = 0; r < top_k; ++r) {
            if (ids[r] < 0)
                throw InvalidParameter("build_tree: negative token id " + std::to_string(ids[r]) + where + ", rank " +
                                       std::to_string(r));
            if (std::isnan(lp[r]) || lp[r] == INFINITY)
                throw InvalidParameter("build_tree: log-prob is NaN or +inf" + where + ", rank " + std::to_string(r));
            if (r > 0 && lp[r] > lp[r - 1])
                throw InvalidParameter("build_tree: log-probs are not sorted in descending order" + where + " (rank " +
                                       std::to_string(r - 1) + ": " + std::to_string(lp[r - 1]) + ", rank " +
                                       std::to_string(r) + ": " + std::to_string(lp[r]) + ")");
        }
        sorted.assign(ids, ids + top_k);
        std::sort(sorted.begin(), sorted.end());
        auto dup = std::adjacent_find(sorted.begin(), sorted.end());
        if (dup != sorted.end())
            throw InvalidParameter("build_tree: token id " + std::to_string(*dup) + " appears twice" + where);
    }
}

// Child map and max depth from parents/depths (parents already known to be topological).
void finish_tree(DraftTree & t) {
    const int n = t.size();
    t.child_start.assign(n + 2, 0);
    t.child_list.assign(n, 0);
    t.max_depth = 0;
    for (int i = 0; i < n; ++i) {
        t.child_start[t.parents[i] + 2]++;  // the parent's position is parents[i] + 1; count at position + 1
        t.max_depth = std::max(t.max_depth, t.depths[i]);
    }
    for (int p = 0; p <= n; ++p) t.child_start[p + 1] += t.child_start[p];
    // Fill in node order so each position's children stay sorted by node index.
    std::vector<int32_t> cursor(t.child_start.begin(), t.child_start.end() - 1);
    for (int i = 0; i < n; ++i) t.child_list[cursor[t.parents[i] + 1]++] = i;
}

}  // namespace

void build_tree(const int32_t * top_ids, const float * top_logp, int n_depth, int top_k, int budget, bool chain_seed,
                DraftTree & out) {
    validate_candidates(top_ids, top_logp, n_depth, top_k, budget);
    const int L = n_depth, K = top_k;
    auto lp = [&](int depth, int rank) { return (double)top_logp[(size_t)(depth - 1) * K + rank]; };
    auto id = [&](int depth, int rank) { return top_ids[(size_t)(depth - 1) * K + rank]; };

    out.tokens.clear();
    out.parents.clear();
    out.depths.clear();
    out.ranks.clear();
    out.logq.clear();
    std::vector<double> q;  // cumulative log-prob per node, in double for the heap keys
    q.reserve(budget);
    auto emit = [&](const Cand & c) {
        out.tokens.push_back(id(c.depth, c.rank));
        out.parents.push_back(c.parent);
        out.depths.push_back(c.depth);
        out.ranks.push_back(c.rank);
        out.logq.push_back((float)c.logq);
        q.push_back(c.logq);
    };

    // The chain seed: nodes 0..n_chain-1, node d-1 at depth d with rank 0.
    const int n_chain = chain_seed ? std::min(L, budget) : 0;
    double chain_q = 0;
    for (int d = 1; d <= n_chain; ++d) {
        chain_q += lp(d, 0);
        emit(Cand{chain_q, d, d - 2, 0});
    }
    out.n_chain = n_chain;

    // Best-first over rank tuples: each prefix is pushed once, by its previous sibling (rank > 0)
    // or by its parent (rank 0), so nothing is generated twice and pops are in topological order.
    std::vector<Cand> heap;
    heap.reserve(2 * (size_t)(budget + n_chain) + 2);
    const CandLess less;
    if (out.size() < budget) heap.push_back(Cand{lp(1, 0), 1, -1, 0});
    while (out.size() < budget && !heap.empty()) {
        std::pop_heap(heap.begin(), heap.end(), less);
        const Cand c = heap.back();
        heap.pop_back();
        // A chain prefix (rank 0 all the way down) is already a node: only expand it.
        const bool in_chain = c.rank == 0 && c.depth <= n_chain && c.parent == c.depth - 2;
        int self = c.depth - 1;
        if (!in_chain) {
            self = out.size();
            emit(c);
        }
        if (c.rank + 1 < K) {
            const double base = c.parent < 0 ? 0.0 : q[c.parent];
            heap.push_back(Cand{base + lp(c.depth, c.rank + 1), c.depth, c.parent, c.rank + 1});
            std::push_heap(heap.begin(), heap.end(), less);
        }
        if (c.depth < L) {
            heap.push_back(Cand{q[self] + lp(c.depth + 1, 0), c.depth + 1, self, 0});
            std::push_heap(heap.begin(), heap.end(), less);
        }
    }
    finish_tree(out);
}

DraftTree build_tree(const int32_t * top_ids, const float * top_logp, int n_depth, int top_k, int budget,
                     bool chain_seed) {
    DraftTree t;
    build_tree(top_ids, top_logp, n_depth, top_k, budget, chain_seed, t);
    return t;
}

DraftTree tree_from_parents(const int32_t * tokens, const int32_t * parents, int n) {
    if (n < 0 || n > kTreeMaxBudget)
        throw InvalidParameter("tree: the node count must be in 0.." + std::to_string(kTreeMaxBudget) + ", got " +
                               std::to_string(n));
    if (n > 0 && (!tokens || !parents)) throw InvalidParameter("tree: missing token or parent array");
    DraftTree t;
    t.tokens.assign(tokens, tokens + n);
    t.parents.assign(parents, parents + n);
    t.depths.resize(n);
    t.ranks.assign(n, -1);
    t.logq.assign(n, 0.0f);
    for (int i = 0; i < n; ++i) {
        const int p = parents[i];
        if (p < -1 || p >= i)
            throw InvalidParameter("tree: node " + std::to_string(i) + " has parent " + std::to_string(p) +
                                   " (must be -1 for the root or an earlier node)");
        t.depths[i] = p < 0 ? 1 : t.depths[p] + 1;
    }
    finish_tree(t);
    return t;
}

TreeWalk walk_tree(const DraftTree & tree, const int32_t * choices, int n_choices) {
    const int n = tree.size();
    if (n_choices != n + 1)
        throw InvalidParameter("walk_tree: need one choice per position (" + std::to_string(n + 1) + ": the root and " +
                               std::to_string(n) + " nodes), got " + std::to_string(n_choices));
    if (!choices) throw InvalidParameter("walk_tree: missing choices");
    if ((int)tree.child_start.size() != n + 2 || (int)tree.child_list.size() != n)
        throw InvalidParameter("walk_tree: the tree has no child map");
    TreeWalk w;
    int pos = 0;
    for (;;) {
        const int32_t y = choices[pos];
        w.next_token = y;
        int next = -1;
        for (int j = tree.child_start[pos]; j < tree.child_start[pos + 1]; ++j) {
            const int c = tree.child_list[j];
            if (tree.tokens[c] == y) {
                next = c;
                break;
            }
        }
        if (next < 0) break;
        w.path.push_back(next);
        pos = next + 1;
    }
    return w;
}

}  // namespace dflash
