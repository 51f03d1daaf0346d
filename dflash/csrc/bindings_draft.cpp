// dflash._core's draft engine, the decode session and the speculative chain (generate_chain).
#include "bindings_common.h"

using namespace dflash;

namespace dflash::bindings {

void bind_draft(py::module_ & m) {
    py::class_<DraftEngineConfig>(m, "DraftEngineConfig")
        .def(py::init<>())
        .def_readwrite("n_ctx", &DraftEngineConfig::n_ctx)
        .def_readwrite("kv_type", &DraftEngineConfig::kv_type)
        .def_readwrite("top_k", &DraftEngineConfig::top_k)
        .def_readwrite("tree_temperature", &DraftEngineConfig::tree_temperature)
        .def_readwrite("n_batch", &DraftEngineConfig::n_batch)
        .def_readwrite("all_bidirectional", &DraftEngineConfig::all_bidirectional);

    py::class_<DraftEngine>(m, "DraftEngine")
        .def(py::init([](const std::string & path, TargetEngine & target, const DraftEngineConfig & cfg) {
                 py::gil_scoped_release rel;
                 return std::make_unique<DraftEngine>(path, target, cfg);
             }),
             py::arg("path"), py::arg("target"), py::arg("config"),
             py::keep_alive<1, 3>())  // the drafter uses the target's embedding, LM head and device
        .def_property_readonly("hparams", [](const DraftEngine & e) { return draft_hparams_dict(e.hparams()); })
        .def_property_readonly("n_ctx", &DraftEngine::n_ctx)
        .def_property_readonly("n_vocab", &DraftEngine::n_vocab)
        .def_property(
            "all_bidirectional", [](const DraftEngine & e) { return e.config().all_bidirectional; },
            &DraftEngine::set_all_bidirectional)
        .def_property_readonly("memory_plan",
                               [](const DraftEngine & e) {
                                   py::dict d;
                                   for (auto & [k, v] : e.plan().items) d[py::str(k)] = v;
                                   d["free"] = e.plan().free_bytes;
                                   d["total"] = e.plan().total_bytes;
                                   return d;
                               })
        .def("reset", &DraftEngine::reset)
        .def_property_readonly("graph_shape",
                               [](const DraftEngine & e) {
                                   auto g = e.graph_shape();
                                   return py::dict(py::arg("splits") = g.splits, py::arg("nodes") = g.nodes,
                                                   py::arg("ops") = g.ops, py::arg("graphs_built") = e.graphs_built());
                               })
        .def("truncate", &DraftEngine::truncate, py::arg("n"))
        .def(
            "inject",
            [](DraftEngine & e, py::array_t<float, py::array::c_style | py::array::forcecast> rows, int pos0) {
                const int64_t nf = e.hparams().n_feature();
                if (rows.ndim() != 2 || rows.shape(1) != nf) {
                    throw InvalidParameter("inject: features must be a 2-D array (n, " + std::to_string(nf) + ")");
                }
                const float * data = rows.data();
                const int n = (int)rows.shape(0);
                py::gil_scoped_release rel;
                e.inject(data, n, pos0);
            },
            py::arg("features"), py::arg("pos0"))
        .def(
            "inject_target",
            [](DraftEngine & e, const std::vector<int32_t> & rows, int pos0) {
                py::gil_scoped_release rel;
                e.inject_target(rows, pos0);
            },
            py::arg("rows"), py::arg("pos0"))
        .def("flush",
             [](DraftEngine & e) {
                 py::gil_scoped_release rel;
                 e.flush();
             })
        .def(
            "draft",
            [](DraftEngine & e, int32_t anchor, int start, bool want_logits, bool want_top_k) {
                DraftResult r;
                {
                    py::gil_scoped_release rel;
                    r = e.draft(anchor, start, want_logits, want_top_k);
                }
                const int64_t k = e.config().top_k;
                py::dict d;
                d["argmax"] = r.argmax;
                d["top_ids"] = want_top_k ? py::object(rows_array(std::move(r.top_ids), k)) : py::none();
                d["top_logp"] = want_top_k ? py::object(rows_array(std::move(r.top_logp), k)) : py::none();
                d["logits"] = want_logits ? py::object(rows_array(std::move(r.logits), e.n_vocab())) : py::none();
                return d;
            },
            py::arg("anchor"), py::arg("start"), py::arg("want_logits") = false, py::arg("want_top_k") = true);

    py::class_<DecodeSession>(m, "DecodeSession")
        .def(
            py::init([](TargetEngine & target, DraftEngine * draft, const std::vector<int32_t> & prompt, int max_tokens,
                        float temperature, int top_k, float top_p, uint64_t seed, const std::vector<int32_t> & eog,
                        int max_draft, int budget, bool chain_seed, py::object rewrite_drafts, int forced_accept) {
                const SamplingParams sp = sampling(temperature, top_k, top_p, seed);
                const ChainOptions opt = chain_options(max_draft, budget, chain_seed, rewrite_drafts, forced_accept);
                return std::make_unique<DecodeSession>(target, draft, prompt, max_tokens, sp, eog, opt);
            }),
            py::arg("target"), py::arg("draft"), py::arg("prompt"), py::arg("max_tokens"), py::arg("temperature"),
            py::arg("top_k"), py::arg("top_p"), py::arg("seed"), py::arg("eog_tokens"), py::arg("max_draft") = 15,
            py::arg("budget") = 0, py::arg("chain_seed") = true, py::arg("rewrite_drafts") = py::none(),
            py::arg("forced_accept") = -1, py::keep_alive<1, 2>(), py::keep_alive<1, 3>())
        .def("step",
             [](DecodeSession & s) {
                 py::gil_scoped_release rel;
                 return s.step();
             })
        .def_property_readonly("done", &DecodeSession::done)
        .def_property_readonly("stats", [](const DecodeSession & s) { return s.stats(); })
        .def_property_readonly("spec", [](const DecodeSession & s) { return spec_dict(s.spec()); });

    m.def(
        "generate_chain",
        [](TargetEngine & target, DraftEngine & draft, const std::vector<int32_t> & prompt, int max_tokens,
           float temperature, int top_k, float top_p, uint64_t seed, const std::vector<int32_t> & eog,
           py::function on_token, int max_draft, py::object rewrite_drafts, int budget, bool chain_seed,
           int forced_accept) {
            const SamplingParams sp = sampling(temperature, top_k, top_p, seed);
            const ChainOptions opt = chain_options(max_draft, budget, chain_seed, rewrite_drafts, forced_accept);
            SpecStats ss;
            GenerateStats st;
            {
                py::gil_scoped_release rel;
                st = generate_chain(
                    target, draft, prompt, max_tokens, sp, eog,
                    [&](int32_t tok) {
                        py::gil_scoped_acquire g;
                        return on_token(tok).cast<bool>();
                    },
                    opt, ss);
            }
            return py::make_tuple(st, spec_dict(ss));
        },
        py::arg("target"), py::arg("draft"), py::arg("prompt"), py::arg("max_tokens"), py::arg("temperature"),
        py::arg("top_k"), py::arg("top_p"), py::arg("seed"), py::arg("eog_tokens"), py::arg("on_token"),
        py::arg("max_draft") = 15, py::arg("rewrite_drafts") = py::none(), py::arg("budget") = 0,
        py::arg("chain_seed") = true, py::arg("forced_accept") = -1);
}

}  // namespace dflash::bindings
