// Runs one ggml_ext tree op on the CPU or the GPU, for op tests (CPU vs CUDA vs a numpy
// reference of every root-to-leaf path).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dflash {

struct OpInput {
    std::vector<float> data;
    std::vector<int64_t> ne;  // ggml order (ne[0] fastest)
};

// The first GPU backend when gpu is true (EngineError if there is none), else the CPU.
std::vector<float> run_tree_ssm_conv(const OpInput & x, const OpInput & conv_state, const OpInput & w,
                                     const std::vector<int32_t> & parents, bool gpu, int n_threads);
// The fused one-token GDN inputs (ggml_ext_gdn.h): [out (C + 2 Hv), advanced conv state ((K-1) C)].
std::vector<float> run_gdn_decode_inputs(const OpInput & qkv, const OpInput & alpha, const OpInput & beta,
                                         const OpInput & conv_state, const OpInput & w, const OpInput & dt_bias,
                                         const OpInput & a, int64_t S, int64_t Hk, float eps, bool gpu, int n_threads);
// The same for n tokens (gdn_verify_inputs): qkv [C, n], alpha, beta [Hv, n] -> [q|k|v (n C), gates
// (n Hv), betas (n Hv), the conv state after the last token ((K-1) C)]; with parents (one a node),
// a tree's nodes (gdn_tree_inputs; no conv state after).
std::vector<float> run_gdn_verify_inputs(const OpInput & qkv, const OpInput & alpha, const OpInput & beta,
                                         const OpInput & conv_state, const OpInput & w, const OpInput & dt_bias,
                                         const OpInput & a, int64_t S, int64_t Hk, float eps,
                                         const std::vector<int32_t> & parents, bool gpu, int n_threads);
// ggml_gated_delta_net over a chain of n tokens (one state out): q, k [S, Hk, n], v [S, Hv, n],
// g, beta [1, Hv, n], state [S, S, Hv] -> the n outputs [S Hv n], then the final state [S S Hv].
// reordered: the node marked for CUDA's reordered sums (ggml_ext::allow_reordered_delta_rule)
std::vector<float> run_gated_delta_net(const OpInput & q, const OpInput & k, const OpInput & v, const OpInput & g,
                                       const OpInput & beta, const OpInput & state, bool gpu, int n_threads,
                                       bool reordered = false);
std::vector<float> run_tree_gated_delta_net(const OpInput & q, const OpInput & k, const OpInput & v, const OpInput & g,
                                            const OpInput & beta, const OpInput & state,
                                            const std::vector<int32_t> & parents, bool gpu, int n_threads,
                                            bool reordered = false);
// ggml_ext::attn_paths (ggml_ext_attn.h): q [D, H, n], k, v [D, Hkv, rows] given as f32 and
// stored as kv_type ("f32", "f16", "bf16"), paths i32 [W, n] -> [D, H, n].
std::vector<float> run_attn_paths(const OpInput & q, const OpInput & k, const OpInput & v,
                                  const std::vector<int32_t> & paths, int64_t width, const std::string & kv_type,
                                  float scale, bool gpu, int n_threads);
// How a weight matmul is built: plain ggml_mul_mat, ggml_ext::mul_mat_invariant (ggml_ext's
// kernel on CUDA for 2..64 columns) or ggml_ext::mul_mat_tiles (ggml's mmq without the stream-k
// fixup where cheaper).
enum class MatMulTag { none = 0, invariant = 1, tiles = 2 };
// w (rows x k, raw ggml bytes of `w_type`, e.g. "q8_0") times x (ne [k, n]) -> n x rows.
std::vector<float> run_mul_mat(const std::vector<uint8_t> & w, const std::string & w_type, int64_t rows,
                               const OpInput & x, MatMulTag tag, bool gpu, int n_threads);
// The engine's fused shapes: x through an RMSNorm and its weight first when norm (ne [k]) is given
// (rms_norm(x, eps) * norm), swiglu(gate x, w x) when gate is given, + residual (ne [rows, n])
// when given; ggml-cuda fuses them into the matmul for one column, ggml_ext the norm for more
// (patches/0010).
// gate_type: the gate's weight type when it differs from w's (empty: w_type); a norm read by
// both products is what ggml_ext's pairs take (rms_norm_fusion.cu).
std::vector<float> run_mul_mat_fused(const std::vector<uint8_t> & w, const std::vector<uint8_t> & gate,
                                     const std::string & w_type, int64_t rows, const OpInput & x,
                                     const OpInput & residual, const OpInput & norm, float eps, bool gpu, int n_threads,
                                     const std::string & gate_type = "");
// w times silu(z) * (rms_norm(o per head of S values) * norm) (+ residual [n, rows]): the delta
// rule's gated output before ssm_out (qwen35_graph.cpp's gated_output), o and z [n, Hv * S], norm
// [S], the matmul tagged mul_mat_tiles; on CUDA its quantizer may compute the norm and the SwiGLU
// (rms_norm_fusion.cu's head norms, ggml_ext::set_fuse_head_norm_enabled).
std::vector<float> run_gated_norm_mul_mat(const std::vector<uint8_t> & w, const std::string & w_type, int64_t rows,
                                          const OpInput & o, const OpInput & z, const OpInput & norm, float eps,
                                          const OpInput & residual, bool gpu, int n_threads);
// w times sigmoid(gate) * o (+ residual [n, rows]): the attention's gated output before o_proj
// (qwen35_graph.cpp's attention), the gate's heads of hd values between the query heads of
// rows [n, W] (head h at hd + 2 hd h), copied out (CONT) before the sigmoid; o [n, k]. On CUDA
// o_proj's quantizer may read the gate in place (glu_fusion.cu's sigmoid gates).
std::vector<float> run_sigmoid_gate_mul_mat(const std::vector<uint8_t> & w, const std::string & w_type, int64_t rows,
                                            const OpInput & o, const OpInput & qg, int64_t hd, const OpInput & residual,
                                            bool gpu, int n_threads);
// w times swiglu(gate, up) (+ residual [n, rows]), gate and up the halves of gate_up [n, 2k] (the
// engine's stacked FFN), the matmul built the `tag` way: on CUDA the SwiGLU is read by the matmul's
// quantizer (patches/0009) unless ggml_ext::set_fuse_glu_enabled(false).
std::vector<float> run_swiglu_mul_mat(const std::vector<uint8_t> & w, const std::string & w_type, int64_t rows,
                                      const OpInput & gate_up, const OpInput & residual, MatMulTag tag, bool gpu,
                                      int n_threads);
// Benches: w (rows x k of w_type, random rows quantized once) times n random columns for each n,
// built each MatMulTag way (untagged: ggml's own kernels), each timed over
// `reps` computes of its own graph (8 copies of w, one product each) after a warm-up: ms per
// product, [n index][MatMulTag][rep].
std::vector<std::vector<std::vector<double>>> time_mul_mat(const std::string & w_type, int64_t rows, int64_t k,
                                                           const std::vector<int64_t> & ns, bool gpu, int reps,
                                                           int n_threads);
// Indices of the k largest values of each row of x (ne [n, rows]) -> rows x k, in no particular
// order; with tagged, through ggml_ext::top_k_rows (ggml_ext's kernel on CUDA for long rows).
std::vector<int32_t> run_top_k(const OpInput & x, int k, bool tagged, bool gpu, int n_threads);
// ggml_argmax of each row of x (ne [n, rows]) -> rows (CUDA: ggml_ext's kernel for long rows).
std::vector<int32_t> run_argmax(const OpInput & x, bool gpu, int n_threads);
bool gpu_backend_available();
// What ggml's CPU backend was built with (name, value), e.g. ("AVX2", "1"); AMX never (CMakeLists.txt).
std::vector<std::pair<std::string, std::string>> cpu_features();

}  // namespace dflash
