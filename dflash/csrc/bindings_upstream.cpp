// dflash._core's vocabulary and upstream llama.cpp's reference models (the oracles of the tests).
#include "bindings_common.h"

using namespace dflash;

namespace dflash::bindings {

void bind_upstream(py::module_ & m) {
    py::class_<Vocab>(m, "Vocab")
        .def(py::init([](const std::string & path) {
                 py::gil_scoped_release rel;
                 return std::make_unique<Vocab>(path);
             }),
             py::arg("path"))
        .def("tokenize", &Vocab::tokenize, py::arg("text"), py::arg("add_special") = true,
             py::arg("parse_special") = false)
        .def(
            "detokenize",
            [](const Vocab & v, const std::vector<int32_t> & t, bool remove_special, bool unparse_special) {
                return py::bytes(v.detokenize(t, remove_special, unparse_special));
            },
            py::arg("tokens"), py::arg("remove_special") = false, py::arg("unparse_special") = false)
        .def(
            "token_to_piece",
            [](const Vocab & v, int32_t t, bool special) { return py::bytes(v.token_to_piece(t, special)); },
            py::arg("token"), py::arg("special") = false)
        .def_property_readonly("n_tokens", &Vocab::n_tokens)
        .def_property_readonly("bos", &Vocab::bos)
        .def_property_readonly("eos", &Vocab::eos)
        .def_property_readonly("eot", &Vocab::eot)
        .def_property_readonly("add_bos", &Vocab::add_bos)
        .def("is_eog", &Vocab::is_eog)
        .def("eog_tokens", &Vocab::eog_tokens)
        .def_property_readonly("chat_template", &Vocab::chat_template)
        .def("meta", &Vocab::meta);

    py::class_<UpstreamConfig>(m, "UpstreamConfig")
        .def(py::init<>())
        .def_readwrite("n_ctx", &UpstreamConfig::n_ctx)
        .def_readwrite("n_batch", &UpstreamConfig::n_batch)
        .def_readwrite("k_type", &UpstreamConfig::k_type)
        .def_readwrite("v_type", &UpstreamConfig::v_type)
        .def_readwrite("n_gpu_layers", &UpstreamConfig::n_gpu_layers)
        .def_readwrite("n_threads", &UpstreamConfig::n_threads);

    py::class_<UpstreamModel>(m, "UpstreamModel")
        .def(py::init([](const std::string & path, const UpstreamConfig & cfg) {
                 py::gil_scoped_release rel;
                 return std::make_unique<UpstreamModel>(path, cfg);
             }),
             py::arg("path"), py::arg("config"))
        .def_property_readonly("n_vocab", &UpstreamModel::n_vocab)
        .def("eval_logits",
             [](UpstreamModel & u, const std::vector<int32_t> & tokens) {
                 std::vector<float> v;
                 {
                     py::gil_scoped_release rel;
                     v = u.eval_logits(tokens);
                 }
                 return logits_array(std::move(v), u.n_vocab());
             })
        .def("eval_chunks",
             [](UpstreamModel & u, const std::vector<int32_t> & tokens, const std::vector<int> & chunks) {
                 std::vector<float> v;
                 {
                     py::gil_scoped_release rel;
                     v = u.eval_chunks(tokens, chunks);
                 }
                 return logits_array(std::move(v), u.n_vocab());
             })
        .def(
            "time_decode",
            [](UpstreamModel & u, const std::vector<int32_t> & prefix, const std::vector<int32_t> & tokens,
               bool all_logits) {
                py::gil_scoped_release rel;
                return u.time_decode(prefix, tokens, all_logits);
            },
            py::arg("prefix"), py::arg("tokens"), py::arg("all_logits") = true)
        .def("greedy", [](UpstreamModel & u, const std::vector<int32_t> & prompt, int n_gen) {
            UpstreamTimings tm;
            std::vector<int32_t> out;
            {
                py::gil_scoped_release rel;
                out = u.greedy(prompt, n_gen, &tm);
            }
            py::dict t;
            t["prefill_ms"] = tm.prefill_ms;
            t["decode_ms"] = tm.decode_ms;
            return py::make_tuple(out, t);
        });

    py::class_<UpstreamDraft>(m, "UpstreamDraft")
        .def(py::init([](const std::string & target, const std::string & draft, const UpstreamConfig & cfg) {
                 py::gil_scoped_release rel;
                 return std::make_unique<UpstreamDraft>(target, draft, cfg);
             }),
             py::arg("target_path"), py::arg("draft_path"), py::arg("config"))
        .def_property_readonly("n_vocab", &UpstreamDraft::n_vocab)
        .def_property_readonly("block_size", &UpstreamDraft::block_size)
        .def(
            "draft_logits",
            [](UpstreamDraft & u, const std::vector<int32_t> & context, int32_t anchor) {
                std::vector<float> logits, feat;
                {
                    py::gil_scoped_release rel;
                    logits = u.draft_logits(context, anchor, &feat);
                }
                return py::make_tuple(logits_array(std::move(logits), u.n_vocab()),
                                      rows_array(std::move(feat), u.n_feature()));
            },
            py::arg("context"), py::arg("anchor"));
}

}  // namespace dflash::bindings
