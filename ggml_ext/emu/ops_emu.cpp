// ggml_ext's CUDA ops on the CPU emulator, through their real ggml entry points (the .cu files are
// compiled in here): tests/test_cuda_emu.py writes an op's inputs into a folder, runs
//   ops_emu <op> <dir>     op: tree_ssm_conv | tree_gated_delta_net | gated_delta_net | gdn_decode_inputs |
//                              gdn_verify_inputs | top_k_rows | attn_paths
// and compares dir/out.bin with the CPU op of the same inputs. Files: meta.txt (the op's sizes,
// whitespace-separated integers), then one raw little-endian array per input (f32, tree index i32).
#include "cuda_emu.h"
#include "ggml.h"
#include "harness_io.h"

#include <cmath>
#include <cstdarg>
#include <string>
#include <vector>

#include "../kernels/attn_paths.cu"
#include "../kernels/gdn_chain.cu"
#include "../kernels/gdn_chain_one_round.cu"
#include "../kernels/gdn_chain_gram.cu"
#include "../kernels/gdn_chunked.cu"
#include "../kernels/gdn_decode.cu"
#include "../kernels/top_k_rows.cu"
#include "../kernels/tree_ops.cu"

// The few ggml functions the entry points call (ggml-base is not linked here).
extern "C" {
void ggml_abort(const char * file, int line, const char * fmt, ...) {
    std::fprintf(stderr, "GGML_ABORT %s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    std::vfprintf(stderr, fmt, ap);
    va_end(ap);
    std::fprintf(stderr, "\n");
    std::abort();
}
int64_t ggml_nelements(const struct ggml_tensor * t) { return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]; }
int64_t ggml_nrows(const struct ggml_tensor * t) { return t->ne[1] * t->ne[2] * t->ne[3]; }
bool ggml_is_contiguous(const struct ggml_tensor * t) {
    size_t s = 4;  // the harness makes f32 and i32 tensors only
    for (int d = 0; d < 4; ++d) {
        if (t->ne[d] != 1 && t->nb[d] != s) return false;
        s *= (size_t)t->ne[d];
    }
    return true;
}
}

namespace {

// A contiguous f32/i32 tensor over `data` (kept alive by the caller), ne in ggml order.
ggml_tensor tensor(ggml_type type, std::vector<char> & data, std::initializer_list<int64_t> ne) {
    ggml_tensor t{};
    t.type = type;
    int d = 0;
    for (int64_t n : ne) t.ne[d++] = n;
    for (; d < 4; ++d) t.ne[d] = 1;
    t.nb[0] = 4;
    for (int i = 1; i < 4; ++i) t.nb[i] = t.nb[i - 1] * t.ne[i - 1];
    if ((size_t)ggml_nelements(&t) * 4 != data.size()) {
        std::fprintf(stderr, "ops_emu: an input of %zu bytes where %lld values were expected\n", data.size(),
                     (long long)ggml_nelements(&t));
        std::exit(2);
    }
    t.data = data.data();
    return t;
}

}  // namespace

int main(int argc, char ** argv) {
    const HarnessDir io("ops_emu", argc, argv);
    const std::string & op = io.mode;
    const std::vector<int64_t> & m = io.meta;
    auto in = [&](const char * name) { return io.in(name); };
    ggml_backend_cuda_context ctx;
    std::vector<char> out;
    if (op == "tree_ssm_conv") {  // meta: C n K
        const int64_t C = m[0], n = m[1], K = m[2];
        auto x = in("x"), cs = in("conv_state"), w = in("w"), tree = in("tree");
        ggml_tensor tx = tensor(GGML_TYPE_F32, x, {C, n}), tc = tensor(GGML_TYPE_F32, cs, {K - 1, C}),
                    tw = tensor(GGML_TYPE_F32, w, {K, C}), tt = tensor(GGML_TYPE_I32, tree, {n, 3});
        out.assign((size_t)C * n * 4, 0);
        ggml_tensor dst = tensor(GGML_TYPE_F32, out, {C, n});
        dst.op = GGML_OP_TREE_SSM_CONV;
        dst.src[0] = &tx, dst.src[1] = &tc, dst.src[2] = &tw, dst.src[3] = &tt;
        ggml_ext_cuda_tree_ssm_conv(ctx, &dst);
    } else if (op == "gated_delta_net") {  // meta: S Hk Hv n columns [staged [form: 1 chunked, 2 one round, 3 gram
                                           // [lanes [tokens a step]]]] (a chain; outputs, then the final state)
        const int64_t S = m[0], Hk = m[1], Hv = m[2], n = m[3];
        ggml_ext::set_gdn_columns((int)m[4]);
        ggml_ext::set_gdn_staged(m.size() > 5 && m[5] != 0);
        auto q = in("q"), k = in("k"), v = in("v"), g = in("g"), b = in("beta"), st = in("state");
        out.assign((size_t)(S * Hv * n + S * S * Hv) * 4, 0);
        float * o = reinterpret_cast<float *>(out.data());
        auto f = [](std::vector<char> & x) { return reinterpret_cast<const float *>(x.data()); };
        const GdnChainArgs args{f(q),   f(k),       f(v), f(g), f(b),   f(st),  o,          o + S * Hv * n,
                                S,      Hv,         n,    1,    S,      S * Hk, S * Hk * n, S,
                                S * Hv, S * Hv * n, 1,    Hv,   Hv * n, Hk,     1,          1.0f / std::sqrt((float)S)};
        const int64_t form = m.size() > 6 ? m[6] : 0;
        if (form == 1) {  // the chunked form, from one token up
            ggml_ext::set_gdn_chunked(true);
            ggml_ext::set_gdn_chunked_min_tokens(1);
            if (!ggml_ext_cuda_gated_delta_net_chunked(args, ctx)) {
                std::fprintf(stderr, "ops_emu: the chunked delta rule does not take S = %lld, n = %lld\n", (long long)S,
                             (long long)n);
                return 2;
            }
        } else if (form == 2) {  // columns: the one-round kernel's columns a lane
            ggml_ext::set_gdn_one_round(true);
            ggml_ext::set_gdn_gram(false);
            ggml_ext::set_gdn_one_round_columns((int)m[4]);
            ggml_ext::set_gdn_one_round_lanes(m.size() > 7 ? (int)m[7] : 0);
            ggml_ext::set_gdn_one_round_step(m.size() > 8 ? (int)m[8] : 1);
            if (!ggml_ext_cuda_gated_delta_net_one_round(args, nullptr)) {
                std::fprintf(stderr, "ops_emu: the one-round chain does not take S = %lld\n", (long long)S);
                return 2;
            }
        } else if (form == 3) {  // 16 tokens at a time in parallel
            ggml_ext::set_gdn_gram(true);
            if (!ggml_ext_cuda_gated_delta_net_gram(args, nullptr)) {
                std::fprintf(stderr, "ops_emu: the gram chain does not take S = %lld\n", (long long)S);
                return 2;
            }
        } else if (!ggml_ext_cuda_gated_delta_net(args, nullptr)) {
            std::fprintf(stderr, "ops_emu: gated_delta_net does not take S = %lld\n", (long long)S);
            return 2;
        }
    } else if (op == "tree_gated_delta_net") {  // meta: S Hk Hv n max_depth [columns [form: 1 walk, 2 paths [reordered
                                                // [lanes [tokens a step]]]]]
        const int64_t S = m[0], Hk = m[1], Hv = m[2], n = m[3];
        ggml_ext::set_gdn_columns(m.size() > 5 ? (int)m[5] : 0);
        ggml_ext::set_tree_gdn_mode(m.size() > 6 ? (int)m[6] : 0);
        auto q = in("q"), k = in("k"), v = in("v"), g = in("g"), b = in("beta"), st = in("state"), tree = in("tree");
        ggml_tensor tq = tensor(GGML_TYPE_F32, q, {S, Hk, n}), tk = tensor(GGML_TYPE_F32, k, {S, Hk, n}),
                    tv = tensor(GGML_TYPE_F32, v, {S, Hv, n}), tg = tensor(GGML_TYPE_F32, g, {1, Hv, n}),
                    tb = tensor(GGML_TYPE_F32, b, {1, Hv, n}), ts = tensor(GGML_TYPE_F32, st, {S, S, Hv}),
                    tt = tensor(GGML_TYPE_I32, tree, {n, 3});
        out.assign((size_t)S * Hv * n * 4, 0);
        ggml_tensor dst = tensor(GGML_TYPE_F32, out, {S * Hv, n});
        dst.op = GGML_OP_TREE_GATED_DELTA_NET;
        dst.op_params[0] = (int32_t)m[4];
        ggml_tensor * srcs[] = {&tq, &tk, &tv, &tg, &tb, &ts, &tt};
        for (int i = 0; i < 7; ++i) dst.src[i] = srcs[i];
        if (m.size() > 7 && m[7] != 0) {  // reordered sums: 1 the chunked form (from one node up), 2 one round
            ggml_ext::set_gdn_chunked(m[7] == 1);
            ggml_ext::set_gdn_chunked_min_tokens(1);
            ggml_ext::set_gdn_one_round(m[7] == 2);
            ggml_ext::set_gdn_one_round_columns(m.size() > 5 ? (int)m[5] : 0);
            ggml_ext::set_gdn_one_round_lanes(m.size() > 8 ? (int)m[8] : 0);
            ggml_ext::set_gdn_one_round_step(m.size() > 9 ? (int)m[9] : 1);
            ggml_ext::allow_reordered_delta_rule(&dst);
        }
        ggml_ext_cuda_tree_gated_delta_net(ctx, &dst);
    } else if (op == "gdn_decode_inputs") {  // meta: C Hv K S Hk; eps / S and 1 / sqrt(S) in params.bin
        const int64_t C = m[0], Hv = m[1], K = m[2];
        auto x = in("qkv"), al = in("alpha"), be = in("beta"), cs = in("conv_state"), w = in("w"), dt = in("dt_bias"),
             a = in("a"), params = in("params");
        ggml_tensor tx = tensor(GGML_TYPE_F32, x, {C}), ta = tensor(GGML_TYPE_F32, al, {Hv}),
                    tb = tensor(GGML_TYPE_F32, be, {Hv}), tc = tensor(GGML_TYPE_F32, cs, {K - 1, C}),
                    tw = tensor(GGML_TYPE_F32, w, {K, C}), td = tensor(GGML_TYPE_F32, dt, {Hv}),
                    tA = tensor(GGML_TYPE_F32, a, {Hv});
        out.assign((size_t)(C + 2 * Hv) * 4, 0);
        ggml_tensor dst = tensor(GGML_TYPE_F32, out, {C + 2 * Hv});
        dst.op = GGML_OP_GDN_DECODE_INPUTS;
        dst.op_params[0] = (int32_t)m[3];
        dst.op_params[1] = (int32_t)m[4];
        std::memcpy(dst.op_params + 2, params.data(), 8);
        ggml_tensor * srcs[] = {&tx, &ta, &tb, &tc, &tw, &td, &tA};
        for (int i = 0; i < 7; ++i) dst.src[i] = srcs[i];
        ggml_ext_cuda_gdn_decode_inputs(ctx, &dst);
        out.insert(out.end(), cs.begin(), cs.end());  // the advanced conv state after the outputs
    } else if (op == "gdn_verify_inputs") {  // meta: C Hv K S Hk n tokens-a-block [tree]; eps / S, 1 / sqrt(S) in
                                             // params.bin; a tree's index in tree.bin (parents, preorder, depths)
        const int64_t C = m[0], Hv = m[1], K = m[2], n = m[5];
        const bool tree = m.size() > 7 && m[7] != 0;
        ggml_ext::set_gdn_inputs_tokens((int)m[6]);
        auto x = in("qkv"), al = in("alpha"), be = in("beta"), cs = in("conv_state"), w = in("w"), dt = in("dt_bias"),
             a = in("a"), params = in("params");
        std::vector<char> tr = tree ? in("tree") : std::vector<char>();
        ggml_tensor tx = tensor(GGML_TYPE_F32, x, {C, n}), ta = tensor(GGML_TYPE_F32, al, {Hv, n}),
                    tb = tensor(GGML_TYPE_F32, be, {Hv, n}), tc = tensor(GGML_TYPE_F32, cs, {K - 1, C}),
                    tw = tensor(GGML_TYPE_F32, w, {K, C}), td = tensor(GGML_TYPE_F32, dt, {Hv}),
                    tA = tensor(GGML_TYPE_F32, a, {Hv});
        ggml_tensor tt = tree ? tensor(GGML_TYPE_I32, tr, {n, 3}) : ggml_tensor{};
        out.assign((size_t)(n * C + 2 * n * Hv + (tree ? 0 : (K - 1) * C)) * 4, 0);
        ggml_tensor dst = tensor(GGML_TYPE_F32, out, {(int64_t)out.size() / 4});
        dst.op = GGML_OP_GDN_DECODE_INPUTS;
        dst.op_params[0] = (int32_t)m[3];
        dst.op_params[1] = (int32_t)m[4];
        std::memcpy(dst.op_params + 2, params.data(), 8);
        dst.op_params[ggml_ext::kGdnInputsModeParam] = tree ? 2 : 1;
        ggml_tensor * srcs[] = {&tx, &ta, &tb, &tc, &tw, &td, &tA, &tt};
        for (int i = 0; i < (tree ? 8 : 7); ++i) dst.src[i] = srcs[i];
        ggml_ext_cuda_gdn_decode_inputs(ctx, &dst);
    } else if (op == "top_k_rows") {  // meta: ncols nrows k
        const int64_t ncols = m[0], nrows = m[1], k = m[2];
        auto x = in("x");
        ggml_tensor tx = tensor(GGML_TYPE_F32, x, {ncols, nrows});
        out.assign((size_t)k * nrows * 4, 0);
        ggml_tensor dst = tensor(GGML_TYPE_I32, out, {k, nrows});
        dst.op = GGML_OP_TOP_K;
        dst.op_params[ggml_ext::kTopKTagSlot] = ggml_ext::kTopKRowsTag;
        dst.src[0] = &tx;
        if (!ggml_ext_cuda_top_k(ctx, &dst)) {
            std::fprintf(stderr, "ops_emu: the CUDA top-K does not take this shape\n");
            return 3;
        }
    } else if (op == "attn_paths") {  // meta: D H Hkv rows n W; f32 K/V; the scale in params.bin
        const int64_t D = m[0], H = m[1], Hkv = m[2], R = m[3], n = m[4], W = m[5];
        auto q = in("q"), k = in("k"), v = in("v"), paths = in("paths"), params = in("params");
        ggml_tensor tq = tensor(GGML_TYPE_F32, q, {D, H, n}), tk = tensor(GGML_TYPE_F32, k, {D, Hkv, R}),
                    tv = tensor(GGML_TYPE_F32, v, {D, Hkv, R}), tp = tensor(GGML_TYPE_I32, paths, {W, n});
        out.assign((size_t)D * H * n * 4, 0);
        ggml_tensor dst = tensor(GGML_TYPE_F32, out, {D, H, n});
        dst.op = GGML_OP_ATTN_PATHS;
        std::memcpy(dst.op_params, params.data(), 4);
        dst.src[0] = &tq, dst.src[1] = &tk, dst.src[2] = &tv, dst.src[3] = &tp;
        if (!ggml_ext_cuda_attn_paths_supported(&dst)) {
            std::fprintf(stderr, "ops_emu: the CUDA path attention does not take this shape\n");
            return 3;
        }
        ggml_ext_cuda_attn_paths(ctx, &dst);
    } else {
        std::fprintf(stderr, "ops_emu: unknown op %s\n", op.c_str());
        return 2;
    }
    io.write_out(out);
    return 0;
}
