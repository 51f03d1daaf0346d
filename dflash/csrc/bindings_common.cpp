// The binding files' shared conversions (bindings_common.h).
#include "bindings_common.h"

namespace dflash::bindings {

py::array_t<float> logits_array(std::vector<float> && v, int64_t n_vocab) {
    const int64_t rows = n_vocab ? (int64_t)v.size() / n_vocab : 0;
    auto * heap = new std::vector<float>(std::move(v));
    py::capsule owner(heap, [](void * p) { delete static_cast<std::vector<float> *>(p); });
    return py::array_t<float>({rows, n_vocab}, {n_vocab * (int64_t)sizeof(float), (int64_t)sizeof(float)}, heap->data(),
                              owner);
}

py::dict spec_dict(const SpecStats & ss) {
    py::dict spec;
    spec["drafts"] = ss.drafts;
    spec["draft_tokens"] = ss.draft_tokens;
    spec["accepted"] = ss.accepted;
    spec["accepted_per_pos"] = ss.accepted_per_pos;
    spec["target_forwards"] = ss.target_forwards;
    spec["steps"] = ss.steps;
    spec["verified_tokens"] = ss.verified_tokens;
    spec["committed"] = ss.committed;
    spec["tokens_per_forward"] = ss.tokens_per_forward();
    spec["acceptance_length"] = ss.acceptance_length();
    spec["draft_ms"] = ss.draft_ms;
    spec["tree_ms"] = ss.tree_ms;
    spec["verify_ms"] = ss.verify_ms;
    spec["commit_ms"] = ss.commit_ms;
    return spec;
}

// Python callable (start, drafts) -> drafts as the C++ rewrite hook (tests and benches only). The
// hook is copied without the GIL (into the session), so it holds the callable through a shared_ptr
// whose last owner is released with the GIL held (the binding's own ChainOptions or the session).
std::function<void(int, std::vector<int32_t> &)> rewrite_hook(const py::object & fn) {
    if (fn.is_none()) return {};
    auto f = std::make_shared<py::object>(fn);
    return [f](int start, std::vector<int32_t> & drafts) {
        py::gil_scoped_acquire g;
        drafts = (*f)(start, drafts).cast<std::vector<int32_t>>();
    };
}

ChainOptions chain_options(int max_draft, int budget, bool chain_seed, const py::object & rewrite_drafts,
                           int forced_accept) {
    ChainOptions opt;
    opt.max_draft = max_draft;
    opt.budget = budget;
    opt.chain_seed = chain_seed;
    opt.rewrite_drafts = rewrite_hook(rewrite_drafts);
    opt.forced_accept = forced_accept;
    return opt;
}

double elapsed_ms(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

SamplingParams sampling(float temperature, int top_k, float top_p, uint64_t seed) {
    SamplingParams sp;
    sp.temperature = temperature;
    sp.top_k = top_k;
    sp.top_p = top_p;
    sp.seed = seed;
    return sp;
}

py::dict hparams_dict(const Qwen35Hparams & hp) {
    py::dict d;
    d["n_vocab"] = hp.n_vocab;
    d["n_embd"] = hp.n_embd;
    d["n_layer"] = hp.n_layer;
    d["n_layer_nextn"] = hp.n_layer_nextn;
    d["n_ff"] = hp.n_ff;
    d["n_head"] = hp.n_head;
    d["n_head_kv"] = hp.n_head_kv;
    d["head_dim"] = hp.head_dim;
    d["n_ctx_train"] = hp.n_ctx_train;
    d["n_rot"] = hp.n_rot;
    d["ssm_d_state"] = hp.ssm_d_state;
    d["ssm_n_v_heads"] = hp.ssm_n_v_heads;
    d["ssm_n_k_heads"] = hp.ssm_n_k_heads;
    d["ssm_d_conv"] = hp.ssm_d_conv;
    std::vector<bool> rec(hp.is_recurrent.begin(), hp.is_recurrent.end());
    d["is_recurrent"] = rec;
    return d;
}

py::dict draft_hparams_dict(const DflashHparams & hp) {
    py::dict d;
    d["n_embd"] = hp.n_embd;
    d["n_layer"] = hp.n_layer;
    d["n_ff"] = hp.n_ff;
    d["n_head"] = hp.n_head;
    d["n_head_kv"] = hp.n_head_kv;
    d["head_dim"] = hp.head_dim;
    d["n_rot"] = hp.n_rot;
    d["rms_eps"] = hp.rms_eps;
    d["rope_freq_base"] = hp.rope_freq_base;
    d["rope_freq_scale"] = hp.rope_freq_scale;
    d["block_size"] = hp.block_size;
    d["mask_token_id"] = hp.mask_token_id;
    d["target_layers"] = hp.target_layers;
    d["sliding_window"] = hp.sliding_window;
    d["is_sliding"] = std::vector<bool>(hp.is_sliding.begin(), hp.is_sliding.end());
    d["causal"] = std::vector<bool>(hp.causal.begin(), hp.causal.end());
    return d;
}

py::dict tree_dict(DraftTree && t) {
    py::dict d;
    d["n_chain"] = t.n_chain;
    d["max_depth"] = t.max_depth;
    d["tokens"] = vec_array(std::move(t.tokens));
    d["parents"] = vec_array(std::move(t.parents));
    d["depths"] = vec_array(std::move(t.depths));
    d["ranks"] = vec_array(std::move(t.ranks));
    d["logq"] = vec_array(std::move(t.logq));
    d["child_start"] = vec_array(std::move(t.child_start));
    d["child_list"] = vec_array(std::move(t.child_list));
    return d;
}

py::tuple walk_arrays(const IdArray & tokens, const IdArray & parents, const IdArray & choices) {
    if (tokens.ndim() != 1 || parents.ndim() != 1 || choices.ndim() != 1)
        throw InvalidParameter("walk_tree: tokens, parents and choices must be 1-D");
    if (tokens.shape(0) != parents.shape(0))
        throw InvalidParameter("walk_tree: tokens and parents differ in length (" + std::to_string(tokens.shape(0)) +
                               " vs " + std::to_string(parents.shape(0)) + ")");
    if (tokens.shape(0) > kTreeMaxBudget) throw InvalidParameter("walk_tree: too many nodes");
    const DraftTree t = tree_from_parents(tokens.data(), parents.data(), (int)tokens.shape(0));
    const TreeWalk w = walk_tree(t, choices.data(), (int)std::min<py::ssize_t>(choices.shape(0), INT32_MAX));
    return py::make_tuple(w.path, w.next_token);
}

}  // namespace dflash::bindings
