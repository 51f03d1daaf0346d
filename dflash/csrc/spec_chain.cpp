#include "spec_chain.h"

#include "errors.h"

#include <algorithm>
#include <chrono>

namespace dflash {

namespace {

double now_ms() {
    using namespace std::chrono;
    return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

// Features of rows [r0, r0+n) of a forward: the capture layers' outputs side by side, in the
// drafter's target_layers order (what DraftEngine::inject takes).
std::vector<float> feature_rows(const ForwardResult & r, int64_t n_embd, int r0, int n) {
    const size_t L = r.captures.size();
    std::vector<float> rows((size_t)n * L * n_embd);
    for (int i = 0; i < n; ++i) {
        for (size_t l = 0; l < L; ++l) {
            const float * src = r.captures[l].data() + (size_t)(r0 + i) * n_embd;
            std::copy(src, src + n_embd, rows.data() + ((size_t)i * L + l) * n_embd);
        }
    }
    return rows;
}

}  // namespace

void SpecStats::add(const SpecStats & o) {
    drafts += o.drafts;
    draft_tokens += o.draft_tokens;
    accepted += o.accepted;
    target_forwards += o.target_forwards;
    if (accepted_per_pos.size() < o.accepted_per_pos.size()) accepted_per_pos.resize(o.accepted_per_pos.size(), 0);
    for (size_t i = 0; i < o.accepted_per_pos.size(); ++i) accepted_per_pos[i] += o.accepted_per_pos[i];
    draft_ms += o.draft_ms;
    verify_ms += o.verify_ms;
    commit_ms += o.commit_ms;
}

GenerateStats generate_chain(TargetEngine & target, DraftEngine & draft, const std::vector<int32_t> & prompt,
                             int max_tokens, const SamplingParams & sp, const std::vector<int32_t> & eog,
                             const TokenCallback & on_token, const ChainOptions & opt, SpecStats & stats) {
    validate(sp);
    const int n_ctx = target.config().n_ctx;
    if (prompt.empty()) throw InvalidParameter("the prompt is empty");
    if (max_tokens < 0) throw InvalidParameter("max_tokens must be >= 0");
    if ((int)prompt.size() + 1 > n_ctx) throw ContextOverflow((int)prompt.size() + 1, n_ctx);
    const int block = draft.hparams().block_size;
    const int max_draft = std::min({opt.max_draft, block - 1, target.config().n_verify_max - 1});
    if (max_draft < 0) throw InvalidParameter("max_draft must be >= 0");
    const std::vector<int> & layers = draft.hparams().target_layers;
    const int64_t E = target.hparams().n_embd, V = target.hparams().n_vocab;

    stats = SpecStats{};
    stats.accepted_per_pos.assign(std::max(max_draft, 0), 0);
    target.reset();
    draft.reset();
    Sampler sampler(sp);
    auto pick = [&](const ForwardResult & r, int row) {
        return sp.greedy() ? r.argmax[row] : sampler.sample(r.logits.data() + (size_t)row * V, V);
    };

    GenerateStats st;
    st.n_prompt = (int)prompt.size();
    const double t0 = now_ms();
    ForwardResult r;
    const int n_batch = target.config().n_batch;
    for (size_t i = 0; i < prompt.size(); i += n_batch) {
        const int n = (int)std::min<size_t>(n_batch, prompt.size() - i);
        r = target.forward(prompt.data() + i, n, false, !sp.greedy(), layers);
        const auto rows = feature_rows(r, E, 0, n);
        draft.inject(rows.data(), n, (int)i);
        stats.target_forwards++;
    }
    st.stop_reason = "length";
    if (max_tokens == 0) {
        st.prompt_ms = now_ms() - t0;
        return st;
    }

    int32_t anchor = pick(r, 0);
    double t_first = now_ms();
    st.prompt_ms = t_first - t0;
    // Emits one token; false when generation must stop.
    auto emit = [&](int32_t tok) {
        st.n_generated++;
        if (!on_token(tok)) {
            st.stop_reason = "callback";
            return false;
        }
        if (std::find(eog.begin(), eog.end(), tok) != eog.end()) {
            st.stop_reason = "eog";
            return false;
        }
        return st.n_generated < max_tokens;
    };
    if (!emit(anchor)) {
        st.predict_ms = now_ms() - t_first;
        return st;
    }

    int start = (int)prompt.size();  // position of the anchor
    while (true) {
        const int room = n_ctx - start;  // positions left for [anchor, drafts]
        if (room < 1) break;             // context full: "length"
        const int n_draft = std::max(0, std::min({max_draft, max_tokens - st.n_generated - 1, room - 1}));

        std::vector<int32_t> batch = {anchor};
        double t = now_ms();
        if (n_draft > 0) {
            DraftResult d = draft.draft(anchor, start, false);
            std::vector<int32_t> drafts(d.argmax.begin(), d.argmax.begin() + n_draft);
            if (opt.rewrite_drafts) {
                opt.rewrite_drafts(start, drafts);
                drafts.resize(n_draft, 0);
                for (int32_t & tok : drafts) tok = std::clamp<int32_t>(tok, 0, (int32_t)V - 1);
            }
            batch.insert(batch.end(), drafts.begin(), drafts.end());
            stats.drafts++;
            stats.draft_tokens += n_draft;
        }
        stats.draft_ms += now_ms() - t;

        t = now_ms();
        ForwardResult v = target.verify(batch.data(), (int)batch.size(), !sp.greedy(), layers);
        stats.verify_ms += now_ms() - t;
        stats.target_forwards++;

        // Walk: the target's token after each kept position; keep going while it is the draft's.
        std::vector<int32_t> out;
        int k = 0;
        while (true) {
            const int32_t y = pick(v, k);
            out.push_back(y);
            if (k < n_draft && y == batch[k + 1]) {
                stats.accepted_per_pos[k]++;
                ++k;
                continue;
            }
            break;
        }
        stats.accepted += k;

        t = now_ms();
        target.commit(k + 1);  // anchor + k accepted drafts; out.back() is the next anchor
        const auto rows = feature_rows(v, E, 0, k + 1);
        draft.inject(rows.data(), k + 1, start);
        stats.commit_ms += now_ms() - t;
        start += k + 1;

        bool go = true;
        for (int32_t tok : out) {
            if (!(go = emit(tok))) break;
        }
        if (!go) break;
        anchor = out.back();
    }
    st.predict_ms = now_ms() - t_first;
    return st;
}

}  // namespace dflash
