// The Python extension dflash._core: a thin layer; the Python API lives in dflash/api.py.
#include "draft_engine.h"
#include "decode_session.h"
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
#include <memory>
#include <optional>

namespace py = pybind11;
using namespace dflash;

namespace {

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

// A GEMM form's mode switch and its launch counter, named from one stem: set_<stem>_mode(mode),
// <stem>() and <stem>_launches() (the count so far, for tests). doc: what the modes select.
void def_form_mode(py::module_ & m, const std::string & stem, void (*set)(int), int (*get)(), int64_t (*launches)(),
                   const char * doc) {
    m.def(("set_" + stem + "_mode").c_str(), set, py::arg("mode"), doc);
    m.def(stem.c_str(), get);
    m.def((stem + "_launches").c_str(), launches, ("launches of " + stem + "'s GEMM form so far (tests)").c_str());
}

// The same for a form switched on or off: set_<stem>_enabled(on), <stem>_enabled(), <stem>_launches().
void def_form_switch(py::module_ & m, const std::string & stem, void (*set)(bool), bool (*get)(), int64_t (*launches)(),
                     const char * doc) {
    m.def(("set_" + stem + "_enabled").c_str(), set, py::arg("on"), doc);
    m.def((stem + "_enabled").c_str(), get);
    m.def((stem + "_launches").c_str(), launches, ("launches of " + stem + "'s GEMM form so far (tests)").c_str());
}

// A fusion's switch and counter: set_fuse_<stem>_enabled(on), fuse_<stem>_enabled() and
// mul_mat_<stem>_fusions() (the count so far, for tests). doc: what is fused; count_doc: what is counted.
void def_fusion(py::module_ & m, const std::string & stem, void (*set)(bool), bool (*get)(), int64_t (*count)(),
                const char * doc, const char * count_doc) {
    m.def(("set_fuse_" + stem + "_enabled").c_str(), set, py::arg("on"), doc);
    m.def(("fuse_" + stem + "_enabled").c_str(), get);
    m.def(("mul_mat_" + stem + "_fusions").c_str(), count, count_doc);
}

// A column threshold: set_<stem>_from(n) and <stem>_from_columns().
void def_from_columns(py::module_ & m, const std::string & stem, void (*set)(int), int (*get)(), const char * doc) {
    m.def(("set_" + stem + "_from").c_str(), set, py::arg("n"), doc);
    m.def((stem + "_from_columns").c_str(), get);
}

}  // namespace

PYBIND11_MODULE(_core, m) {
    m.doc() = "dflash native core (qwen35 engine over vendored ggml)";

    // Exception classes as raw, never-freed objects (safe at interpreter shutdown).
    static PyObject * base = PyErr_NewException("dflash._core.DflashError", PyExc_RuntimeError, nullptr);
    static PyObject * load_err = PyErr_NewException("dflash._core.ModelLoadError", base, nullptr);
    static PyObject * param_err = PyErr_NewException("dflash._core.InvalidParameterError", base, nullptr);
    static PyObject * ctx_err = PyErr_NewException("dflash._core.ContextOverflowError", base, nullptr);
    static PyObject * engine_err = PyErr_NewException("dflash._core.EngineError", base, nullptr);
    m.add_object("DflashError", py::handle(base));
    m.add_object("ModelLoadError", py::handle(load_err));
    m.add_object("InvalidParameterError", py::handle(param_err));
    m.add_object("ContextOverflowError", py::handle(ctx_err));
    m.add_object("EngineError", py::handle(engine_err));
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const ContextOverflow & e) {
            py::object exc = py::reinterpret_borrow<py::object>(ctx_err)(e.what());
            exc.attr("n_prompt") = e.n_tokens;
            exc.attr("n_ctx") = e.n_ctx;
            PyErr_SetObject(ctx_err, exc.ptr());
        } catch (const ModelLoadError & e) {
            PyErr_SetString(load_err, e.what());
        } catch (const InvalidParameter & e) {
            PyErr_SetString(param_err, e.what());
        } catch (const EngineError & e) {
            PyErr_SetString(engine_err, e.what());
        }
    });

    m.def("set_log_verbosity", &set_log_verbosity, py::arg("verbose"));

    // ggml_ext op tests: run one tree op on the CPU or the GPU (arrays in numpy order).
    using F32Array = py::array_t<float, py::array::c_style | py::array::forcecast>;
    auto op_input = [](const F32Array & a) {
        OpInput in;
        in.data.assign(a.data(), a.data() + a.size());
        for (py::ssize_t d = a.ndim() - 1; d >= 0; --d) in.ne.push_back(a.shape(d));
        return in;
    };
    auto shaped = [](std::vector<float> && v, std::vector<py::ssize_t> shape) {
        return py::array_t<float>(shape, v.data());
    };
    m.def(
        "op_tree_ssm_conv",
        [=](const F32Array & x, const F32Array & conv_state, const F32Array & w, std::vector<int32_t> parents, bool gpu,
            int n_threads) {
            auto r = run_tree_ssm_conv(op_input(x), op_input(conv_state), op_input(w), parents, gpu, n_threads);
            return shaped(std::move(r), {x.shape(0), x.shape(1)});
        },
        py::arg("x"), py::arg("conv_state"), py::arg("w"), py::arg("parents"), py::arg("gpu") = false,
        py::arg("n_threads") = 2, "x [n, C], conv_state [C, K-1], w [C, K] -> [n, C]");
    m.def(
        "op_gdn_decode_inputs",
        [=](const F32Array & qkv, const F32Array & alpha, const F32Array & beta, const F32Array & conv_state,
            const F32Array & w, const F32Array & dt_bias, const F32Array & a, int64_t S, int64_t Hk, float eps,
            bool gpu, int n_threads) {
            auto r = run_gdn_decode_inputs(op_input(qkv), op_input(alpha), op_input(beta), op_input(conv_state),
                                           op_input(w), op_input(dt_bias), op_input(a), S, Hk, eps, gpu, n_threads);
            const int64_t n_out = qkv.shape(0) + 2 * alpha.shape(0);
            std::vector<float> state(r.begin() + n_out, r.end());
            r.resize(n_out);
            return py::make_tuple(shaped(std::move(r), {n_out}),
                                  shaped(std::move(state), {conv_state.shape(0), conv_state.shape(1)}));
        },
        py::arg("qkv"), py::arg("alpha"), py::arg("beta"), py::arg("conv_state"), py::arg("w"), py::arg("dt_bias"),
        py::arg("a"), py::arg("S"), py::arg("Hk"), py::arg("eps"), py::arg("gpu") = false, py::arg("n_threads") = 2,
        "qkv [C], alpha, beta, dt_bias, a [Hv], conv_state [C, K-1], w [C, K] -> (q|k|v|gate|beta [C + 2 Hv], "
        "the advanced conv state [C, K-1])");
    m.def(
        "op_gdn_verify_inputs",
        [=](const F32Array & qkv, const F32Array & alpha, const F32Array & beta, const F32Array & conv_state,
            const F32Array & w, const F32Array & dt_bias, const F32Array & a, int64_t S, int64_t Hk, float eps,
            const std::vector<int32_t> & parents, bool gpu, int n_threads) {
            auto r =
                run_gdn_verify_inputs(op_input(qkv), op_input(alpha), op_input(beta), op_input(conv_state), op_input(w),
                                      op_input(dt_bias), op_input(a), S, Hk, eps, parents, gpu, n_threads);
            const py::ssize_t n = qkv.shape(0), C = qkv.shape(1), Hv = alpha.shape(1);
            auto part = [&](size_t off, std::vector<py::ssize_t> shape) {
                size_t count = 1;
                for (auto d : shape) count *= (size_t)d;
                return shaped(std::vector<float>(r.begin() + off, r.begin() + off + count), std::move(shape));
            };
            py::tuple out = py::make_tuple(part(0, {n, C}), part(n * C, {n, Hv}), part(n * (C + Hv), {n, Hv}));
            if (!parents.empty()) return out;
            return py::tuple(out + py::make_tuple(part(n * (C + 2 * Hv), {conv_state.shape(0), conv_state.shape(1)})));
        },
        py::arg("qkv"), py::arg("alpha"), py::arg("beta"), py::arg("conv_state"), py::arg("w"), py::arg("dt_bias"),
        py::arg("a"), py::arg("S"), py::arg("Hk"), py::arg("eps"), py::arg("parents") = std::vector<int32_t>{},
        py::arg("gpu") = false, py::arg("n_threads") = 2,
        "qkv [n, C], alpha, beta [n, Hv], dt_bias, a [Hv], conv_state [C, K-1], w [C, K] -> (q|k|v [n, C], gates "
        "[n, Hv], betas [n, Hv], the conv state after the last token [C, K-1]); with parents (one a node): a "
        "tree's nodes (gdn_tree_inputs), without the conv state after");
    m.def(
        "op_gated_delta_net",
        [=](const F32Array & q, const F32Array & k, const F32Array & v, const F32Array & g, const F32Array & beta,
            const F32Array & state, bool gpu, int n_threads, bool reordered) {
            auto r = run_gated_delta_net(op_input(q), op_input(k), op_input(v), op_input(g), op_input(beta),
                                         op_input(state), gpu, n_threads, reordered);
            const py::ssize_t n = v.shape(0), Hv = v.shape(1), S = v.shape(2);
            const auto mid = r.begin() + n * Hv * S;
            return py::make_tuple(shaped(std::vector<float>(r.begin(), mid), {n, Hv, S}),
                                  shaped(std::vector<float>(mid, r.end()), {Hv, S, S}));
        },
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("g"), py::arg("beta"), py::arg("state"),
        py::arg("gpu") = false, py::arg("n_threads") = 2, py::arg("reordered") = false,
        "ggml_gated_delta_net over a chain: q, k [n, Hk, S], v [n, Hv, S], g, beta [n, Hv, 1], state [Hv, S, S] "
        "(row j = column j of S) -> (outputs [n, Hv, S], the final state [Hv, S, S]); reordered: the node marked "
        "for CUDA's reordered sums (ggml_ext::allow_reordered_delta_rule: the chunked form when on, else one "
        "reduction round a token; the chain kernel's bits otherwise)");
    m.def(
        "op_tree_gated_delta_net",
        [=](const F32Array & q, const F32Array & k, const F32Array & v, const F32Array & g, const F32Array & beta,
            const F32Array & state, std::vector<int32_t> parents, bool gpu, int n_threads, bool reordered) {
            auto r = run_tree_gated_delta_net(op_input(q), op_input(k), op_input(v), op_input(g), op_input(beta),
                                              op_input(state), parents, gpu, n_threads, reordered);
            return shaped(std::move(r), {v.shape(0), v.shape(1), v.shape(2)});
        },
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("g"), py::arg("beta"), py::arg("state"), py::arg("parents"),
        py::arg("gpu") = false, py::arg("n_threads") = 2, py::arg("reordered") = false,
        "q, k [n, Hk, S], v [n, Hv, S], g, beta [n, Hv, 1], state [Hv, S, S] (row j = column j of S) -> [n, Hv, S]; "
        "reordered: the node marked for CUDA's reordered sums (ggml_ext::allow_reordered_delta_rule: the chunked "
        "form when on, up to 64 nodes)");
    m.def(
        "op_attn_paths",
        [=](const F32Array & q, const F32Array & k, const F32Array & v,
            const py::array_t<int32_t, py::array::c_style | py::array::forcecast> & paths, const std::string & kv_type,
            float scale, bool gpu, int n_threads) {
            if (paths.ndim() != 2) throw InvalidParameter("attn_paths: paths [n, W]");
            std::vector<int32_t> p(paths.data(), paths.data() + paths.size());
            auto r = run_attn_paths(op_input(q), op_input(k), op_input(v), p, paths.shape(1), kv_type, scale, gpu,
                                    n_threads);
            return shaped(std::move(r), {q.shape(0), q.shape(1), q.shape(2)});
        },
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("paths"), py::arg("kv_type") = "f32", py::arg("scale") = 1.0f,
        py::arg("gpu") = false, py::arg("n_threads") = 2,
        "q [n, H, D], k, v [rows, Hkv, D] (stored as kv_type), paths [n, W] (P, L, L rows) -> [n, H, D]: each "
        "query's softmax attention over rows 0..P-1 then its L rows (ggml_ext::attn_paths)");
    m.def(
        "op_mul_mat",
        [=](const py::bytes & w, const std::string & w_type, int64_t rows, const F32Array & x, bool tagged, bool tiles,
            bool gpu, int n_threads) {
            if (tagged && tiles) throw InvalidParameter("op_mul_mat: tagged and tiles are exclusive");
            const std::string raw = w;
            std::vector<uint8_t> wb(raw.begin(), raw.end());
            const MatMulTag tag = tagged ? MatMulTag::invariant : tiles ? MatMulTag::tiles : MatMulTag::none;
            auto r = run_mul_mat(wb, w_type, rows, op_input(x), tag, gpu, n_threads);
            return shaped(std::move(r), {x.shape(0), (py::ssize_t)rows});
        },
        py::arg("w"), py::arg("w_type"), py::arg("rows"), py::arg("x"), py::arg("tagged") = false,
        py::arg("tiles") = false, py::arg("gpu") = false, py::arg("n_threads") = 2,
        "w: rows x k weights as raw ggml bytes of w_type; x [n, k] -> [n, rows]; tagged: "
        "ggml_ext::mul_mat_invariant; tiles: ggml_ext::mul_mat_tiles");
    m.def(
        "op_mul_mat_fused",
        [=](const py::bytes & w, const std::string & w_type, int64_t rows, const F32Array & x,
            const std::optional<py::bytes> & gate, const std::optional<F32Array> & residual,
            const std::optional<F32Array> & norm, float eps, bool gpu, int n_threads, const std::string & gate_type) {
            const std::string raw = w, raw_gate = gate ? std::string(*gate) : std::string();
            std::vector<uint8_t> wb(raw.begin(), raw.end()), gb(raw_gate.begin(), raw_gate.end());
            auto r = run_mul_mat_fused(wb, gb, w_type, rows, op_input(x), residual ? op_input(*residual) : OpInput{},
                                       norm ? op_input(*norm) : OpInput{}, eps, gpu, n_threads, gate_type);
            return shaped(std::move(r), {x.shape(0), (py::ssize_t)rows});
        },
        py::arg("w"), py::arg("w_type"), py::arg("rows"), py::arg("x"), py::arg("gate") = py::none(),
        py::arg("residual") = py::none(), py::arg("norm") = py::none(), py::arg("eps") = 1e-6f, py::arg("gpu") = false,
        py::arg("n_threads") = 2, py::arg("gate_type") = "",
        "swiglu(gate @ x', w @ x') (+ residual [n, rows]), x' = rms_norm(x, eps) * norm when norm [k] is given, "
        "else x: the engine's norm / FFN / residual shapes; gate_type: the gate's type (default w_type)");
    m.def(
        "op_gated_norm_mul_mat",
        [=](const py::bytes & w, const std::string & w_type, int64_t rows, const F32Array & o, const F32Array & z,
            const F32Array & norm, float eps, const std::optional<F32Array> & residual, bool gpu, int n_threads) {
            const std::string raw = w;
            std::vector<uint8_t> wb(raw.begin(), raw.end());
            auto r = run_gated_norm_mul_mat(wb, w_type, rows, op_input(o), op_input(z), op_input(norm), eps,
                                            residual ? op_input(*residual) : OpInput{}, gpu, n_threads);
            return shaped(std::move(r), {o.shape(0), (py::ssize_t)rows});
        },
        py::arg("w"), py::arg("w_type"), py::arg("rows"), py::arg("o"), py::arg("z"), py::arg("norm"),
        py::arg("eps") = 1e-6f, py::arg("residual") = py::none(), py::arg("gpu") = false, py::arg("n_threads") = 2,
        "w @ (silu(z) * (rms_norm(o per head of S, eps) * norm)) (+ residual [n, rows]), o and z [n, Hv * S], norm "
        "[S]: the delta rule's gated output before ssm_out");
    m.def(
        "op_sigmoid_gate_mul_mat",
        [=](const py::bytes & w, const std::string & w_type, int64_t rows, const F32Array & o, const F32Array & rows_qg,
            int64_t hd, const std::optional<F32Array> & residual, bool gpu, int n_threads) {
            const std::string raw = w;
            std::vector<uint8_t> wb(raw.begin(), raw.end());
            auto r = run_sigmoid_gate_mul_mat(wb, w_type, rows, op_input(o), op_input(rows_qg), hd,
                                              residual ? op_input(*residual) : OpInput{}, gpu, n_threads);
            return shaped(std::move(r), {o.shape(0), (py::ssize_t)rows});
        },
        py::arg("w"), py::arg("w_type"), py::arg("rows"), py::arg("o"), py::arg("qg"), py::arg("hd"),
        py::arg("residual") = py::none(), py::arg("gpu") = false, py::arg("n_threads") = 2,
        "w @ (o * sigmoid(gate)) (+ residual [n, rows]), o [n, k], the gate's heads of hd values at hd + 2 hd h "
        "of each row of qg [n, >= 2k] (the attention's [q; gate] product): its gated output before o_proj");
    m.def(
        "op_swiglu_mul_mat",
        [=](const py::bytes & w, const std::string & w_type, int64_t rows, const F32Array & gate_up,
            const std::optional<F32Array> & residual, bool invariant, bool gpu, int n_threads) {
            const std::string raw = w;
            std::vector<uint8_t> wb(raw.begin(), raw.end());
            auto r = run_swiglu_mul_mat(wb, w_type, rows, op_input(gate_up), residual ? op_input(*residual) : OpInput{},
                                        invariant ? MatMulTag::invariant : MatMulTag::tiles, gpu, n_threads);
            return shaped(std::move(r), {gate_up.shape(0), (py::ssize_t)rows});
        },
        py::arg("w"), py::arg("w_type"), py::arg("rows"), py::arg("gate_up"), py::arg("residual") = py::none(),
        py::arg("invariant") = false, py::arg("gpu") = false, py::arg("n_threads") = 2,
        "w @ swiglu(gate, up) (+ residual [n, rows]), gate_up [n, 2k] holding gate then up in each row (the "
        "engine's stacked FFN); the matmul tagged mul_mat_tiles, or mul_mat_invariant");
    m.def(
        "op_top_k",
        [=](const F32Array & x, int k, bool tagged, bool gpu, int n_threads) {
            std::vector<int32_t> r;
            {
                const OpInput in = op_input(x);
                py::gil_scoped_release rel;
                r = run_top_k(in, k, tagged, gpu, n_threads);
            }
            return py::array_t<int32_t>({x.shape(0), (py::ssize_t)k}, r.data());
        },
        py::arg("x"), py::arg("k"), py::arg("tagged") = false, py::arg("gpu") = false, py::arg("n_threads") = 2,
        "x [rows, n] -> [rows, k] indices of each row's k largest values (no particular order); tagged: "
        "ggml_ext::top_k_rows");
    m.def(
        "op_argmax",
        [=](const F32Array & x, bool gpu, int n_threads) {
            std::vector<int32_t> r;
            {
                const OpInput in = op_input(x);
                py::gil_scoped_release rel;
                r = run_argmax(in, gpu, n_threads);
            }
            return py::array_t<int32_t>({x.shape(0)}, r.data());
        },
        py::arg("x"), py::arg("gpu") = false, py::arg("n_threads") = 2,
        "x [rows, n] -> [rows] index of each row's largest value (ggml_argmax)");
    m.def(
        "time_mul_mat",
        [](const std::string & w_type, int64_t rows, int64_t k, const std::vector<int64_t> & ns, bool gpu, int reps,
           int n_threads) {
            py::gil_scoped_release rel;
            return time_mul_mat(w_type, rows, k, ns, gpu, reps, n_threads);
        },
        py::arg("w_type"), py::arg("rows"), py::arg("k"), py::arg("ns"), py::arg("gpu") = false, py::arg("reps") = 20,
        py::arg("n_threads") = 2, "-> per n: [ggml ms samples, tagged ms samples]");
    m.def("gpu_backend_available", &gpu_backend_available);
    m.def(
        "compute_timing",
        [] {
            const ComputeTiming & t = compute_timing();
            py::dict d;
            d["launch_ms"] = t.launch_ms;
            d["wait_ms"] = t.wait_ms;
            d["sync_ms"] = t.sync_ms;
            d["graphs"] = t.graphs;
            return d;
        },
        "host time of this thread's engine graph computes since reset_compute_timing(): launch_ms (scheduling, "
        "uploads, launches), wait_ms (the wait for the device and the result copies), sync_ms (commit graphs), "
        "graphs");
    m.def("reset_compute_timing", [] { compute_timing() = ComputeTiming{}; }, "zero compute_timing()");
    m.def("cpu_features", &cpu_features,
          "ggml's CPU backend build features as (name, value) pairs, e.g. ('AVX2', '1'); no AMX (CMakeLists.txt)");
    m.def("set_gemv_enabled", &ggml_ext::set_gemv_enabled, py::arg("on"),
          "ggml_ext's Q4_K / Q6_K GEMV for 1..8 columns on CUDA (on by default; DFLASH_GEMV=0 starts it off); "
          "off: ggml's mul_mat_vec_q");
    m.def("gemv_enabled", &ggml_ext::gemv_enabled);
    m.def("set_q80_enabled", &ggml_ext::set_q80_enabled, py::arg("on"),
          "ggml_ext's GEMV for Q8_0 weights too (off by default: slower than ggml's mul_mat_vec_q on the H200; "
          "DFLASH_Q80=1 starts it on; on, it also sends Q8_0 to the tensor-core GEMM, see set_mma_q80_enabled); "
          "no effect without CUDA");
    m.def("q80_enabled", &ggml_ext::q80_enabled);
    m.def("set_gdn_columns", &ggml_ext::set_gdn_columns, py::arg("columns"),
          "CUDA delta rule kernels (chain and tree): state columns a warp, 0 (by the grid, the default) or 1, 2, 4 "
          "forced (DFLASH_GDN_COLUMNS; states of fewer than 64 rows take 1); no effect without CUDA");
    m.def("gdn_columns", &ggml_ext::gdn_columns);
    m.def("set_gdn_chain_enabled", &ggml_ext::set_gdn_chain_enabled, py::arg("on"),
          "ggml_gated_delta_net on CUDA through ggml_ext's chain kernel (on by default; DFLASH_GDN_CHAIN=0) or "
          "ggml's; no effect without CUDA");
    m.def("gdn_chain_enabled", &ggml_ext::gdn_chain_enabled);
    m.def("set_gdn_staged", &ggml_ext::set_gdn_staged, py::arg("on"),
          "CUDA chain delta rule: stage a chunk of tokens' inputs in shared memory (S >= 64; on by default, "
          "DFLASH_GDN_STAGED=0 starts it off; the same bits; no effect without CUDA)");
    m.def("gdn_staged", &ggml_ext::gdn_staged);
    m.def("set_tree_gdn_mode", &ggml_ext::set_tree_gdn_mode, py::arg("mode"),
          "CUDA tree delta rule: 0 by the grid (default), 1 the walk (a warp every node), 2 the paths (a warp a "
          "preorder segment; DFLASH_TREE_GDN=walk|paths); the same bits; no effect without CUDA");
    m.def("tree_gdn_mode", &ggml_ext::tree_gdn_mode);
    m.def("set_gdn_chunked", &ggml_ext::set_gdn_chunked, py::arg("on"),
          "CUDA: marked ggml_gated_delta_net nodes (a verify's or a prefill's chain outside the batch-invariant "
          "mode) take the chunked delta rule, 64 tokens at a time as matrix products (off by default: slower than "
          "the chain kernel on the H200 so far; DFLASH_GDN_CHUNKED=1 starts it on); no effect without CUDA");
    m.def("gdn_chunked", &ggml_ext::gdn_chunked);
    m.def("set_gdn_chunked_min_tokens", &ggml_ext::set_gdn_chunked_min_tokens, py::arg("n"),
          "the fewest tokens that take the chunked delta rule (<= 0: the default, 8; DFLASH_GDN_CHUNKED_MIN)");
    m.def("gdn_chunked_min_tokens", &ggml_ext::gdn_chunked_min_tokens);
    m.def("set_gdn_one_round", &ggml_ext::set_gdn_one_round, py::arg("on"),
          "CUDA: marked ggml_gated_delta_net nodes take the chain with one round of warp reductions a token "
          "(on by default; DFLASH_GDN_ONE_ROUND=0 starts it off: the chain kernel's bits); no effect without CUDA");
    m.def("gdn_one_round", &ggml_ext::gdn_one_round);
    m.def("set_gdn_one_round_columns", &ggml_ext::set_gdn_one_round_columns, py::arg("columns"),
          "state columns a lane of the one-round kernel: 1, 2 or 4 (DFLASH_GDN_ONE_ROUND_COLUMNS); 0, the default: "
          "by the form (a chain 2, a tree 1)");
    m.def("gdn_one_round_columns", &ggml_ext::gdn_one_round_columns);
    m.def("set_gdn_one_round_lanes", &ggml_ext::set_gdn_one_round_lanes, py::arg("lanes"),
          "lanes a state column of the one-round kernel: 8 or 16 (DFLASH_GDN_ONE_ROUND_LANES); 0, the default (8)");
    m.def("gdn_one_round_lanes", &ggml_ext::gdn_one_round_lanes);
    m.def("set_gdn_one_round_step", &ggml_ext::set_gdn_one_round_step, py::arg("tokens"),
          "tokens a step of the one-round kernel (one round of reductions a step; a tree's runs of parent-child "
          "links): 1 (the default), 2 or 4 (DFLASH_GDN_ONE_ROUND_STEP), with 8 lanes a column; 0 without CUDA");
    m.def("gdn_one_round_step", &ggml_ext::gdn_one_round_step);
    m.def("set_gdn_inputs_tokens", &ggml_ext::set_gdn_inputs_tokens, py::arg("tokens"),
          "tokens a block of the CUDA kernel of the n-token and tree GDN inputs: 1, 4, 8 or 16, or 0 (the default: 8 "
          "from 48 tokens, else 1; DFLASH_GDN_INPUTS_TOKENS; the same bits); 0 without CUDA");
    m.def("gdn_inputs_tokens", &ggml_ext::gdn_inputs_tokens);
    m.def("set_gdn_gram", &ggml_ext::set_gdn_gram, py::arg("on"),
          "CUDA: marked chains of 2 tokens or more take 16 tokens at a time in parallel (gdn_chain_gram.cu) in place "
          "of the one-round kernel, which must be on (off by default; DFLASH_GDN_GRAM=1 starts it on)");
    m.def("gdn_gram", &ggml_ext::gdn_gram);
    m.def("set_mma_enabled", &ggml_ext::set_mma_enabled, py::arg("on"),
          "ggml_ext's tensor-core GEMM for Q4_K / Q5_K / Q6_K / Q8_0 x 2..mma_max_columns() columns on CUDA instead of "
          "ggml's mmq (on by default; DFLASH_MMA=0 starts it off)");
    m.def("mma_enabled", &ggml_ext::mma_enabled);
    m.def("set_mma_q80_enabled", &ggml_ext::set_mma_q80_enabled, py::arg("on"),
          "Q8_0 weights through ggml_ext's tensor-core GEMM too (on by default; DFLASH_MMA_Q80=0 starts it off)");
    m.def("mma_q80_enabled", &ggml_ext::mma_q80_enabled);
    m.def("set_mma_max_columns", &ggml_ext::set_mma_max_columns, py::arg("n"),
          "the most columns ggml_ext's GEMM takes: 16, 32, 64, 128 or 256 (the default; DFLASH_MMA_MAX_COLUMNS); "
          "above 64 it runs launches of 64; 0 without CUDA");
    m.def("mma_max_columns", &ggml_ext::mma_max_columns);
    m.def("set_wgmma_enabled", &ggml_ext::set_wgmma_enabled, py::arg("on"),
          "within the tensor-core GEMM, Q4_K x 25..64 columns of matrices of 16384 rows or more through Hopper's "
          "wgmma (an sm_90a build on an sm_90 GPU; on by default there, DFLASH_WGMMA=0 starts it off)");
    m.def("wgmma_enabled", &ggml_ext::wgmma_enabled);
    m.def("wgmma_built", &ggml_ext::wgmma_built, "whether this build has the wgmma GEMM (CUDA for sm_90a)");
    m.def("wgmma_launches", &ggml_ext::wgmma_launches, "launches of the wgmma GEMM so far (tests)");
    m.def("set_wgmma_split_enabled", &ggml_ext::set_wgmma_split_enabled, py::arg("on"),
          "the wgmma GEMM's last wave of row tiles split along K where it holds few tiles (on by default; "
          "DFLASH_WGMMA_SPLIT=0 turns it off)");
    m.def("wgmma_split_enabled", &ggml_ext::wgmma_split_enabled);
    m.def("set_mma_q6k_long_8", &ggml_ext::set_mma_q6k_long_8, py::arg("mode"),
          "CUDA: Q6_K rows of 24 super-blocks or more at up to 16 columns with 8 warps a block, the stages in dynamic "
          "shared memory: 0 off (the default until measured), 1 at 3 blocks a multiprocessor, 2 with the compiler's "
          "registers (DFLASH_MMA_Q6K_LONG_8)");
    m.def("mma_q6k_long_8", &ggml_ext::mma_q6k_long_8);
    m.def("set_mma_split", &ggml_ext::set_mma_split, py::arg("pieces"),
          "CUDA: rows of 24 super-blocks or more at 17..64 columns in the mma.sync GEMM split along K into this many "
          "blocks a row tile, the last adding their sums in order: 0 or 1 off (the default: slower on the H100), 2..8, "
          "or -1: every matrix of 4 super-blocks a row or more, in the pieces that fill a wave (DFLASH_MMA_SPLIT, "
          "auto for -1)");
    m.def("mma_split", &ggml_ext::mma_split);
    m.def("set_mma_act_smem", &ggml_ext::set_mma_act_smem, py::arg("on"),
          "CUDA: that split's activations staged in shared memory once a block (the same outputs; off: slower than "
          "the unsplit GEMM on the H100, DFLASH_MMA_ACT_SMEM=1)");
    m.def("mma_act_smem", &ggml_ext::mma_act_smem);
    m.def("mma_split_launches", &ggml_ext::mma_split_launches, "launches of the split mma.sync GEMM so far (tests)");
    def_from_columns(
        m, "q6k_wgmma", &ggml_ext::set_q6k_wgmma_from, &ggml_ext::q6k_wgmma_from_columns,
        "CUDA (sm_90a build, sm_90 GPU): Q6_K products of n..64 columns through the f16 wgmma GEMM (scales folded "
        "into f16 weight operands): 0 off, 2..64 (DFLASH_Q6K_WGMMA; 9 by default, through its warp-specialized "
        "form: on the H100 the 16-, 32- and 64-token forwards gained; the output matrix from 17 at least)");
    def_from_columns(
        m, "q4k_f16", &ggml_ext::set_q4k_f16_from, &ggml_ext::q4k_f16_from_columns,
        "CUDA (sm_90a build, sm_90 GPU): Q4_K products of n..64 columns through the f16 wgmma GEMM (scales and "
        "mins folded into f16 weight operands) instead of the int8 forms: 0 off (the default: slower on the H100), "
        "2..64 (DFLASH_Q4K_F16)");
    def_from_columns(
        m, "q4k_f16_tall", &ggml_ext::set_q4k_f16_tall_from, &ggml_ext::q4k_f16_tall_from_columns,
        "CUDA (sm_90a build, sm_90 GPU): Q4_K matrices of 16384 rows or more through the f16 wgmma GEMM from n "
        "columns whatever set_q4k_f16_from says: 33 by default (session 54), 0 off, 2..64 "
        "(DFLASH_Q4K_F16_TALL)");
    def_from_columns(
        m, "q6k_output", &ggml_ext::set_q6k_output_from, &ggml_ext::q6k_output_from_columns,
        "CUDA (sm_90a build, sm_90 GPU): the output matrix (65536 rows or more) takes Q6_K's f16 wgmma form from "
        "max(q6k_wgmma_from_columns, n) columns: 2..64 (DFLASH_Q6K_WGMMA_OUTPUT, 17 by default), 0 for no floor");
    def_from_columns(
        m, "q6k_other", &ggml_ext::set_q6k_other_from, &ggml_ext::q6k_other_from_columns,
        "CUDA (sm_90a build, sm_90 GPU): Q6_K's other matrices (neither long rows nor the output matrix) take its "
        "f16 wgmma form from max(q6k_wgmma_from_columns, n) columns: 2..64 (DFLASH_Q6K_WGMMA_OTHER, 25 by default), "
        "0 never");
    m.def("set_f16_wgmma_all", &ggml_ext::set_f16_wgmma_all, py::arg("on"),
          "the f16 wgmma GEMM for every matrix of its types, not only long rows (24 super-blocks or more) and the "
          "output matrix (65536 rows or more) (DFLASH_F16_WGMMA_ALL=1)");
    m.def("f16_wgmma_all", &ggml_ext::f16_wgmma_all);
    m.def("set_f16_convert_v8", &ggml_ext::set_f16_convert_v8, py::arg("on"),
          "the f16 wgmma GEMM's activations converted with 8 values a thread above 16 columns (on by default; "
          "DFLASH_F16_CONVERT_V8=0 starts it off: a value a thread; the same halves); no effect without CUDA");
    m.def("f16_convert_v8", &ggml_ext::f16_convert_v8);
    def_form_switch(m, "f16_ws", &ggml_ext::set_f16_ws_enabled, &ggml_ext::f16_ws_enabled, &ggml_ext::f16_ws_launches,
                    "the f16 wgmma GEMM through its warp-specialized form (a producer warpgroup staging on mbarriers; "
                    "the same bits where both split alike): on by default (DFLASH_F16_WS=0 starts it off); no effect "
                    "without CUDA");
    m.def(
        "f16_wgmma_last_split",
        [] {
            const ggml_ext::GemmSplit s = ggml_ext::f16_wgmma_last_split();
            return py::make_tuple(s.full_tiles, s.tail, s.pieces);
        },
        "the last f16 wgmma launch's tail split, (row tiles in full, tiles split, pieces a split tile): (tiles, 0, "
        "1) unsplit; the two forms' bits agree where their splits do (tests)");
    m.def("f16_wgmma_launches", &ggml_ext::f16_wgmma_launches,
          "launches of the f16 wgmma GEMM (Q6_K, Q4_K) so far (tests)");
    m.def("wgmma_split_launches", &ggml_ext::wgmma_split_launches,
          "launches of the wgmma GEMM with a split tail so far (tests)");
    m.def("set_wgmma_pipe", &ggml_ext::set_wgmma_pipe, py::arg("mode"),
          "the wgmma GEMM pipelined (a super-block's float step while the next one's wgmmas run; the same bits): 0 "
          "off (the default until measured), 1 on, 2 on and also for 25..32 columns of [gate; up] "
          "(DFLASH_WGMMA_PIPE)");
    m.def("wgmma_pipe", &ggml_ext::wgmma_pipe);
    m.def("wgmma_pipe_launches", &ggml_ext::wgmma_pipe_launches, "launches of the pipelined wgmma GEMM so far (tests)");
    def_form_switch(m, "wgmma_early", &ggml_ext::set_wgmma_early_enabled, &ggml_ext::wgmma_early_enabled,
                    &ggml_ext::wgmma_early_launches,
                    "the unpipelined wgmma GEMM with the pipelined one's staging (the next stage's copies after a "
                    "super-block's first wgmmas; the same bits), where the pipe mode is 0 (on by default; "
                    "DFLASH_WGMMA_EARLY=0 turns it off)");
    m.def("set_wgmma_short_enabled", &ggml_ext::set_wgmma_short_enabled, py::arg("on"),
          "Q4_K matrices of fewer than 16384 rows at 33..64 columns through the wgmma GEMM too, split along K to "
          "fill the GPU (mode 1; the default is mode 2; DFLASH_WGMMA_SHORT=1 starts mode 1)");
    m.def("wgmma_short_enabled", &ggml_ext::wgmma_short_enabled);
    m.def("set_wgmma_short_mode", &ggml_ext::set_wgmma_short_mode, py::arg("mode"),
          "Q4_K matrices of fewer than 16384 rows at 33..64 columns through the wgmma GEMM: 0 none, 1 all, 2 rows of "
          "64 super-blocks or more only (DFLASH_WGMMA_SHORT; 2 by default); 0 without CUDA");
    m.def("wgmma_short", &ggml_ext::wgmma_short);
    m.def("set_wgmma_tall_from", &ggml_ext::set_wgmma_tall_from, py::arg("n"),
          "columns from which Q4_K matrices of 32768 rows or more take the wgmma GEMM: 25 by default, 25..64 "
          "(DFLASH_WGMMA_TALL_FROM); 0 without CUDA");
    m.def("wgmma_tall_from", &ggml_ext::wgmma_tall_from_columns);
    def_form_switch(m, "mma_tall_two_tiles", &ggml_ext::set_mma_tall_two_tiles, &ggml_ext::mma_tall_two_tiles,
                    &ggml_ext::mma_tall_two_tiles_launches,
                    "Q4_K / Q5_K matrices of 32768 rows or more at up to 16 columns on two row tiles a warp in the "
                    "mma.sync GEMM (DFLASH_MMA_TALL_TWO_TILES=1; off by default); false without CUDA");
    def_form_switch(m, "mma_tma", &ggml_ext::set_mma_tma, &ggml_ext::mma_tma, &ggml_ext::mma_tma_launches,
                    "Q4_K's mma.sync GEMM of up to 32 columns with its stages filled by 2D bulk tensor copies on a "
                    "Hopper GPU (on by default; DFLASH_MMA_TMA=1 up to 16 columns, =0 off); false without CUDA or an "
                    "sm_90 build");
    m.def("set_wgmma_warpgroups", &ggml_ext::set_wgmma_warpgroups, py::arg("n"),
          "warpgroups a block of the wgmma GEMM: 1 (the default), 2 (the early-staging kernel) or 3 (the "
          "chunk-waiting kernel; DFLASH_WGMMA_WG); 0 without CUDA");
    m.def("wgmma_warpgroups", &ggml_ext::wgmma_warpgroups);
    m.def("wgmma_two_wg_launches", &ggml_ext::wgmma_two_wg_launches,
          "launches of the wgmma GEMM with two or three warpgroups a block so far (tests)");
    m.def("set_wgmma_chunks_enabled", &ggml_ext::set_wgmma_chunks_enabled, py::arg("on"),
          "the early wgmma GEMM waiting a chunk at a time, 2 stages and 3 blocks a multiprocessor, on every wgmma "
          "launch (mode 1; DFLASH_WGMMA_CHUNKS=1; the same bits); off: mode 0");
    m.def("wgmma_chunks_enabled", &ggml_ext::wgmma_chunks_enabled);
    def_form_mode(m, "wgmma_chunks", &ggml_ext::set_wgmma_chunks_mode, &ggml_ext::wgmma_chunks,
                  &ggml_ext::wgmma_chunks_launches,
                  "the chunk-waiting wgmma GEMM: 0 off, 1 every wgmma launch, 2 matrices of 32768 rows or more at 32 "
                  "columns or fewer only (the default; DFLASH_WGMMA_CHUNKS); 0 without CUDA");
    def_form_mode(m, "wgmma_res", &ggml_ext::set_wgmma_res_mode, &ggml_ext::wgmma_res, &ggml_ext::wgmma_res_launches,
                  "Q4_K products with a fused residual through the wgmma GEMM with the residual fused: 0 off (the "
                  "default), 1 rows of 64 super-blocks or more only, 2 every one (DFLASH_WGMMA_RES); 0 without CUDA");
    def_form_mode(m, "wgmma_ws", &ggml_ext::set_wgmma_ws_mode, &ggml_ext::wgmma_ws, &ggml_ext::wgmma_ws_launches,
                  "the warp-specialized wgmma GEMM (a producer warpgroup's copies on mbarriers) in place of the "
                  "early form: 0 off, 1 one consumer warpgroup a block, 2 two, at every column count, 3 one from 33 "
                  "columns, 4 one by each Q4_K matrix's shape, a fused residual too (the default; "
                  "DFLASH_WGMMA_WS); 0 without CUDA");
    m.def("set_mmq_tiles_enabled", &ggml_ext::set_mmq_tiles_enabled, py::arg("on"),
          "ggml_ext's mmq launch policy for the engine's products on CUDA (on by default); off: ggml's own");
    m.def("mmq_tiles_enabled", &ggml_ext::mmq_tiles_enabled);
    def_fusion(m, "add", &ggml_ext::set_fuse_add_enabled, &ggml_ext::fuse_add_enabled, &ggml_ext::mul_mat_add_fusions,
               "ggml-cuda's mul_mat + add fusion for the tensor-core GEMM's products (the residual added as it "
               "writes; on by default; DFLASH_FUSE_ADD=0 starts it off); no effect without CUDA",
               "how many mul_mat + add pairs the GEMM took fused in this process (0 without CUDA)");
    m.def("set_fuse_add_max_columns", &ggml_ext::set_fuse_add_max_columns, py::arg("n"),
          "the most columns of a product the mul_mat + add fusion takes: 64 (the default) or 48 "
          "(DFLASH_FUSE_ADD_MAX_COLUMNS=48); 0 without CUDA");
    m.def("fuse_add_max_columns", &ggml_ext::fuse_add_max_columns);
    def_fusion(
        m, "glu", &ggml_ext::set_fuse_glu_enabled, &ggml_ext::fuse_glu_enabled, &ggml_ext::mul_mat_glu_fusions,
        "a SwiGLU read only by the engine's matmul after it is computed by that matmul's activation quantizer "
        "(the same outputs, one kernel fewer; on by default; DFLASH_FUSE_GLU=0 starts it off); no effect without "
        "CUDA",
        "how many SwiGLU nodes the matmuls' quantizers took in this process (0 without CUDA)");
    def_fusion(m, "rms_norm", &ggml_ext::set_fuse_rms_norm_enabled, &ggml_ext::fuse_rms_norm_enabled,
               &ggml_ext::mul_mat_rms_norm_fusions,
               "an RMSNorm and its weight read only by the engine's matmul after them (2..64 columns) are computed by "
               "that matmul's activation quantizer (the same outputs, one kernel fewer; on by default; "
               "DFLASH_FUSE_RMS_NORM=0 starts it off); no effect without CUDA",
               "how many RMSNorm nodes the matmuls' quantizers took in this process (0 without CUDA)");
    def_fusion(m, "rms_norm_gemv", &ggml_ext::set_fuse_rms_norm_gemv_enabled, &ggml_ext::fuse_rms_norm_gemv_enabled,
               &ggml_ext::mul_mat_rms_norm_gemv_fusions,
               "at one column (a decode step) that RMSNorm is computed by the GEMV's activation quantizer (the same "
               "outputs; on by default; DFLASH_FUSE_RMS_NORM_GEMV=0 starts it off); no effect without CUDA",
               "how many RMSNorm nodes the GEMV's quantizer took at one column in this process (0 without CUDA)");
    def_fusion(m, "rms_norm_pair", &ggml_ext::set_fuse_rms_norm_pair_enabled, &ggml_ext::fuse_rms_norm_pair_enabled,
               &ggml_ext::mul_mat_rms_norm_pair_fusions,
               "an RMSNorm and its weight read by exactly two tagged matmuls right after them (2..64 columns): one "
               "quantizer for both products computes the norm (the same outputs; on by default; "
               "DFLASH_FUSE_RMS_NORM_PAIR=0 starts it off); no effect without CUDA",
               "how many RMSNorm nodes the quantizers of matmul pairs took in this process (0 without CUDA)");
    def_fusion(m, "pair_act", &ggml_ext::set_fuse_pair_act_enabled, &ggml_ext::fuse_pair_act_enabled,
               &ggml_ext::mul_mat_pair_act_fusions,
               "in such a pair where one product takes the f16 wgmma form and the other an int8 form, both activation "
               "forms come from one launch (the same outputs; on by default; DFLASH_FUSE_PAIR_ACT=0 starts it off); no "
               "effect without CUDA",
               "how many matmul pairs took both activation forms from one launch in this process (0 without CUDA)");
    def_fusion(m, "head_norm", &ggml_ext::set_fuse_head_norm_enabled, &ggml_ext::fuse_head_norm_enabled,
               &ggml_ext::mul_mat_head_norm_fusions,
               "a per-head RMSNorm (and weight) whose SwiGLU feeds a tagged matmul (2..256 columns: the delta rule's "
               "gated output) is computed by that matmul's quantizer with the SwiGLU (the same outputs; on by "
               "default; DFLASH_FUSE_HEAD_NORM=0 starts it off); no effect without CUDA",
               "how many per-head RMSNorm nodes the matmuls' quantizers took in this process (0 without CUDA)");
    def_fusion(m, "sigmoid_gate", &ggml_ext::set_fuse_sigmoid_gate_enabled, &ggml_ext::fuse_sigmoid_gate_enabled,
               &ggml_ext::mul_mat_sigmoid_gate_fusions,
               "the attention's sigmoid output gate is read in place by o_proj's quantizer (2..256 columns; the copy "
               "and the sigmoid-multiply kernels skipped, the same outputs; on by default; "
               "DFLASH_FUSE_SIGMOID_GATE=0 starts it off); no effect without CUDA",
               "how many sigmoid gates the matmuls' quantizers took in this process (0 without CUDA)");

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
    set_log_verbosity(false);

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
