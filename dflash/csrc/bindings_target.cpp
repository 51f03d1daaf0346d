// dflash._core's DDTree trees and walks, and the target engine (its config, forwards, generation,
// verify and commit).
#include "bindings_common.h"

using namespace dflash;

namespace dflash::bindings {

void bind_target(py::module_ & m) {
    m.def(
        "build_tree",
        [](const IdArray & top_ids, const py::array_t<float, py::array::c_style | py::array::forcecast> & top_logp,
           int budget, bool chain_seed) {
            if (top_ids.ndim() != 2 || top_logp.ndim() != 2)
                throw InvalidParameter("build_tree: top_ids and top_logp must be 2-D arrays (depths, top_k)");
            if (top_ids.shape(0) != top_logp.shape(0) || top_ids.shape(1) != top_logp.shape(1))
                throw InvalidParameter("build_tree: top_ids and top_logp differ in shape");
            if (top_ids.shape(0) > kTreeMaxDepth || top_ids.shape(1) > kTreeMaxTopK)
                throw InvalidParameter("build_tree: at most " + std::to_string(kTreeMaxDepth) + " depths and " +
                                       std::to_string(kTreeMaxTopK) + " candidates per depth");
            DraftTree t = build_tree(top_ids.data(), top_logp.data(), (int)top_ids.shape(0), (int)top_ids.shape(1),
                                     budget, chain_seed);
            return tree_dict(std::move(t));
        },
        py::arg("top_ids"), py::arg("top_logp"), py::arg("budget"), py::arg("chain_seed") = true);
    m.def("walk_tree", &walk_arrays, py::arg("tokens"), py::arg("parents"), py::arg("choices"));
    m.def(
        "walk_tree",
        [](const py::dict & tree, const IdArray & choices) {
            return walk_arrays(tree["tokens"].cast<IdArray>(), tree["parents"].cast<IdArray>(), choices);
        },
        py::arg("tree"), py::arg("choices"));

    py::class_<EngineConfig>(m, "EngineConfig")
        .def(py::init<>())
        .def_readwrite("n_ctx", &EngineConfig::n_ctx)
        .def_readwrite("k_type", &EngineConfig::k_type)
        .def_readwrite("v_type", &EngineConfig::v_type)
        .def_readwrite("n_gpu_layers", &EngineConfig::n_gpu_layers)
        .def_readwrite("n_threads", &EngineConfig::n_threads)
        .def_readwrite("n_batch", &EngineConfig::n_batch)
        .def_readwrite("n_logits_batch", &EngineConfig::n_logits_batch)
        .def_readwrite("n_verify_max", &EngineConfig::n_verify_max)
        .def_readwrite("batch_invariant", &EngineConfig::batch_invariant)
        .def_readwrite("stack_projections", &EngineConfig::stack_projections)
        .def_readwrite("fuse_gdn_inputs", &EngineConfig::fuse_gdn_inputs)
        .def_readwrite("cache_commit_graphs", &EngineConfig::cache_commit_graphs);

    py::class_<GenerateStats>(m, "GenerateStats")
        .def_readonly("n_prompt", &GenerateStats::n_prompt)
        .def_readonly("n_generated", &GenerateStats::n_generated)
        .def_readonly("prompt_ms", &GenerateStats::prompt_ms)
        .def_readonly("predict_ms", &GenerateStats::predict_ms)
        .def_readonly("stop_reason", &GenerateStats::stop_reason);

    py::class_<TargetEngine>(m, "TargetEngine")
        .def(py::init([](const std::string & path, const EngineConfig & cfg, py::object progress) {
                 ProgressFn fn;
                 if (!progress.is_none()) {
                     fn = [progress](size_t done, size_t total) {
                         py::gil_scoped_acquire g;
                         progress(done, total);
                     };
                 }
                 py::gil_scoped_release rel;
                 return std::make_unique<TargetEngine>(path, cfg, fn);
             }),
             py::arg("path"), py::arg("config"), py::arg("progress") = py::none())
        .def_property_readonly("hparams", [](const TargetEngine & e) { return hparams_dict(e.hparams()); })
        .def_property_readonly("backend", &TargetEngine::backend_description)
        .def_property_readonly("model_name", &TargetEngine::model_name)
        .def_property_readonly("n_past", &TargetEngine::n_past)
        .def_property_readonly("memory_plan",
                               [](const TargetEngine & e) {
                                   py::dict d;
                                   for (auto & [k, v] : e.plan().items) d[py::str(k)] = v;
                                   d["free"] = e.plan().free_bytes;
                                   d["total"] = e.plan().total_bytes;
                                   return d;
                               })
        .def("reset", &TargetEngine::reset)
        .def_property_readonly("graph_shapes",
                               [](const TargetEngine & e) {
                                   py::dict d;
                                   for (auto [name, g] : {std::pair{"forward", e.forward_graph_shape()},
                                                          std::pair{"commit", e.commit_graph_shape()}}) {
                                       d[name] = py::dict(py::arg("splits") = g.splits, py::arg("nodes") = g.nodes,
                                                          py::arg("ops") = g.ops);
                                   }
                                   d["commit_graphs_cached"] = e.commit_graphs_cached();
                                   d["forward_graphs_built"] = e.forward_graphs_built();
                                   d["stacked_projections"] = e.stacked_projections();
                                   d["fused_gdn_inputs"] = e.fused_gdn_inputs();
                                   return d;
                               })
        .def_property_readonly(
            "layer_products",
            [](const TargetEngine & e) {
                py::list out;
                for (const auto & L : e.model().layers) {
                    out.append(py::make_tuple(L.input_products(), L.ffn_gate_up ? 1 : 2, L.wqkv != nullptr));
                }
                return out;
            },
            "per layer: (products reading its normed input with stacked projections, products of its FFN's "
            "gate and up, whether it is a Gated DeltaNet layer)")
        .def(
            "fusion_patterns",
            [](const TargetEngine & e, int n, bool verify) {
                const auto c = e.fusion_patterns(n, verify);
                return py::dict(py::arg("single") = c.single, py::arg("pair") = c.pair, py::arg("head") = c.head,
                                py::arg("gate") = c.gate, py::arg("glu") = c.glu);
            },
            py::arg("n"), py::arg("verify") = false,
            "the nodes of the forward graph a CUDA engine builds for n tokens in each form ggml_ext's fusions "
            "take: RMS_NORMs read by one product (single), by two (pair), per-head norms of a gated output (head), "
            "the attention's sigmoid output gates (gate), and the pairs a SwiGLU right after reads (glu, among "
            "pair); built on a throwaway context, on any backend")
        .def("eval_logits",
             [](TargetEngine & e, const std::vector<int32_t> & tokens) {
                 std::vector<float> v;
                 {
                     py::gil_scoped_release rel;
                     v = e.eval_logits(tokens);
                 }
                 return logits_array(std::move(v), e.hparams().n_vocab);
             })
        .def(
            "forward",
            [](TargetEngine & e, const std::vector<int32_t> & tokens, bool all_logits,
               const std::vector<int> & capture_layers) {
                ForwardResult r;
                {
                    py::gil_scoped_release rel;
                    r = e.forward(tokens.data(), (int)tokens.size(), all_logits, true, capture_layers, true);
                }
                py::list caps;
                const int64_t E = e.hparams().n_embd;
                for (auto & c : r.captures) caps.append(logits_array(std::move(c), E));
                return py::make_tuple(logits_array(std::move(r.logits), e.hparams().n_vocab), r.argmax, caps);
            },
            py::arg("tokens"), py::arg("all_logits") = true, py::arg("capture_layers") = std::vector<int>{})
        .def(
            "time_forward",
            [](TargetEngine & e, const std::vector<int32_t> & tokens, bool all_logits,
               const std::vector<int> & capture_layers) {
                // Benches: forward() timed in C++ (argmax of the output rows read back; captures
                // stay on the device as in decoding; no logits), the wall time in ms. Advances
                // n_past like forward().
                py::gil_scoped_release rel;
                const auto t0 = std::chrono::steady_clock::now();
                e.forward(tokens.data(), (int)tokens.size(), all_logits, false, capture_layers);
                return elapsed_ms(t0);
            },
            py::arg("tokens"), py::arg("all_logits") = true, py::arg("capture_layers") = std::vector<int>{})
        .def(
            "verify",
            [](TargetEngine & e, const std::vector<int32_t> & tokens, const std::vector<int> & capture_layers) {
                ForwardResult r;
                {
                    py::gil_scoped_release rel;
                    r = e.verify(tokens.data(), (int)tokens.size(), true, capture_layers, true);
                }
                py::list caps;
                const int64_t E = e.hparams().n_embd;
                for (auto & c : r.captures) caps.append(logits_array(std::move(c), E));
                return py::make_tuple(logits_array(std::move(r.logits), e.hparams().n_vocab), r.argmax, caps);
            },
            py::arg("tokens"), py::arg("capture_layers") = std::vector<int>{})
        .def("commit",
             [](TargetEngine & e, int n_accept) {
                 py::gil_scoped_release rel;
                 e.commit(n_accept);
             })
        .def(
            "verify_tree",
            [](TargetEngine & e, const std::vector<int32_t> & tokens, const std::vector<int32_t> & parents) {
                if (tokens.size() != parents.size()) throw InvalidParameter("tokens and parents differ in length");
                ForwardResult r;
                {
                    py::gil_scoped_release rel;
                    r = e.verify_tree(tokens.data(), parents, true, {});
                }
                return py::make_tuple(logits_array(std::move(r.logits), e.hparams().n_vocab), r.argmax);
            },
            py::arg("tokens"), py::arg("parents"))
        .def("commit_path",
             [](TargetEngine & e, const std::vector<int32_t> & path) {
                 py::gil_scoped_release rel;
                 e.commit_path(path);
             })
        .def_property_readonly("pending", &TargetEngine::pending)
        .def("recurrent_state",
             [](const TargetEngine & e, int layer) {
                 auto [conv, ssm] = e.recurrent_state(layer);
                 return py::make_tuple(py::array_t<float>(conv.size(), conv.data()),
                                       py::array_t<float>(ssm.size(), ssm.data()));
             })
        .def(
            "generate",
            [](TargetEngine & e, const std::vector<int32_t> & prompt, int max_tokens, float temperature, int top_k,
               float top_p, uint64_t seed, const std::vector<int32_t> & eog, py::function on_token) {
                const SamplingParams sp = sampling(temperature, top_k, top_p, seed);
                py::gil_scoped_release rel;
                return e.generate(prompt, max_tokens, sp, eog, [&](int32_t tok) {
                    py::gil_scoped_acquire g;
                    return on_token(tok).cast<bool>();
                });
            },
            py::arg("prompt"), py::arg("max_tokens"), py::arg("temperature"), py::arg("top_k"), py::arg("top_p"),
            py::arg("seed"), py::arg("eog_tokens"), py::arg("on_token"));
}

}  // namespace dflash::bindings
