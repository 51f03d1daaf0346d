// Shared by the extension's binding files (bindings*.cpp): conversions of the engine's results to
// numpy arrays and dicts, and each file's entry point, which bindings.cpp's module calls in turn.
#pragma once

#include "decode_session.h"
#include "draft_engine.h"
#include "errors.h"
#include "ggml_ext_gdn.h"
#include "ggml_ext_matmul.h"
#include "op_runner.h"
#include "spec_chain.h"
#include "target_engine.h"
#include "tree_builder.h"
#include "upstream_ref.h"
#include "vocab.h"

#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dflash::bindings {

namespace py = pybind11;

template <typename T>
py::array_t<T> rows_array(std::vector<T> && v, int64_t cols) {
    const int64_t rows = cols ? (int64_t)v.size() / cols : 0;
    auto * heap = new std::vector<T>(std::move(v));
    py::capsule owner(heap, [](void * p) { delete static_cast<std::vector<T> *>(p); });
    return py::array_t<T>({rows, cols}, {cols * (int64_t)sizeof(T), (int64_t)sizeof(T)}, heap->data(), owner);
}

template <typename T>
py::array_t<T> vec_array(std::vector<T> && v) {
    const int64_t n = (int64_t)v.size();
    auto * heap = new std::vector<T>(std::move(v));
    py::capsule owner(heap, [](void * p) { delete static_cast<std::vector<T> *>(p); });
    return py::array_t<T>({n}, {(int64_t)sizeof(T)}, heap->data(), owner);
}

using IdArray = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

// bindings_common.cpp
py::array_t<float> logits_array(std::vector<float> && v, int64_t n_vocab);
py::dict spec_dict(const SpecStats & ss);
std::function<void(int, std::vector<int32_t> &)> rewrite_hook(const py::object & fn);
ChainOptions chain_options(int max_draft, int budget, bool chain_seed, const py::object & rewrite_drafts,
                           int forced_accept);
double elapsed_ms(std::chrono::steady_clock::time_point t0);
SamplingParams sampling(float temperature, int top_k, float top_p, uint64_t seed);
py::dict hparams_dict(const Qwen35Hparams & hp);
py::dict draft_hparams_dict(const DflashHparams & hp);
py::dict tree_dict(DraftTree && t);
py::tuple walk_arrays(const IdArray & tokens, const IdArray & parents, const IdArray & choices);

// One subject a file, each compiled on its own.
void bind_ops(py::module_ & m);       // bindings_ops.cpp: ggml_ext's op tests, timings and build facts
void bind_switches(py::module_ & m);  // bindings_switches.cpp: ggml_ext's kernel switches and counters
void bind_target(py::module_ & m);    // bindings_target.cpp: DDTree's trees, the target engine
void bind_draft(py::module_ & m);     // bindings_draft.cpp: the draft engine, decode session, chain
void bind_upstream(py::module_ & m);  // bindings_upstream.cpp: the vocabulary, upstream's reference models

}  // namespace dflash::bindings
