// dflash._core's ggml_ext op tests (one op on the CPU or the GPU, arrays in numpy order), the
// matmul timer, the engine's compute timings and the CPU backend's build features.
#include "bindings_common.h"

using namespace dflash;

namespace dflash::bindings {

void bind_ops(py::module_ & m) {
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
}

}  // namespace dflash::bindings
