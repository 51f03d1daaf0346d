// A deferred product (ggml_ext::defer_product) run beside the kernel before it.
//
// A verify of the 27B runs 48 Gated DeltaNet layers whose delta rule is latency-bound: 384 blocks
// of 64 threads, ~1.5 warps a scheduler, 15.6 / 28.0 us a layer at 32 / 64 tokens on the H100
// (session 57, bench/results/h100-s57-*), while the memory system idles. The layer's z product
// (6144 x 5120 of Q4_K, 13-18 us) reads only the layer's normed input, and only the gated output
// after the delta rule reads z. So the engine builds z's product right after the delta rule
// (qwen35_graph.cpp's defer_gate), and here:
// - the layer's input norm, which rms_norm_fusion.cu computes inside the quantizer of the layer's
//   other input products, is quantized for z too, into a buffer of its own (the stash below),
//   before those products run;
// - at z's node, its GEMM runs from the stash as a programmatic dependent launch of the delta rule
//   (which triggers its dependents as it starts: gdn_chain_one_round.cu) and waits for it only
//   before writing its outputs (gemm_kq's late_wait): its loads and multiplies overlap the delta
//   rule, and its outputs, which the graph allocator may have placed where the delta rule's inputs
//   were, are written after the delta rule is done. The kernels after it wait for it as usual, and
//   its completion implies the delta rule's.
// The same bits as the product in the layer's stack: the same quantizer, kernel and sums.
#include "ggml_ext_gemv_cuda.cuh"
#include "ggml_ext_matmul.h"
#include "ggml_ext_matmul_cuda.cuh"

#include <atomic>
#include <cstddef>

namespace {

// The activations of one deferred product, written by the norm's fusion and read at the product's
// node a few nodes later (one at a time: each layer's z before the next layer's norm). Device
// memory of its own, allocated once a device (a graph capture bakes its address into the
// kernels): the pool frees in reverse order of allocation, and the graph allocator may reuse what
// the delta rule reads.
struct Stash {
    const ggml_tensor * node = nullptr;  // the deferred product these activations are for
    char * mem = nullptr;
    size_t bytes = 0;
    int8_t * qs = nullptr;
    float * d = nullptr;
    int * sums = nullptr;
};
constexpr int kMaxDevices = 16;
Stash stashes[kMaxDevices];
// 64 columns of a 16384-wide input with their scales and sums (the 27B's hidden size is 5120)
constexpr size_t kStashBytes = (size_t)4 << 20;
std::atomic<int64_t> deferred_count{0};

size_t align256(size_t b) { return (b + 255) & ~(size_t)255; }

}  // namespace

namespace ggml_ext {
int64_t deferred_products() { return deferred_count.load(); }
}  // namespace ggml_ext

bool ggml_ext_cuda_stash_deferred(ggml_backend_cuda_context & ctx, const ggml_tensor * mm, const ActSource & x,
                                  int64_t n) {
    if (ctx.device < 0 || ctx.device >= kMaxDevices) return false;
    size_t act = 0, nd = 0, ns = 0;
    if (!ggml_ext_cuda_gemm_deferrable(ctx, mm->src[0], x, n, mm, act, nd, ns)) return false;
    const size_t need = align256(act) + align256(nd * sizeof(float)) + align256(ns * sizeof(int));
    Stash & s = stashes[ctx.device];
    if (need > kStashBytes) return false;
    if (!s.mem) {
        ggml_cuda_set_device(ctx.device);
        if (cudaMalloc(&s.mem, kStashBytes) != cudaSuccess) {
            (void)cudaGetLastError();
            s.mem = nullptr;
            return false;
        }
        s.bytes = kStashBytes;
    }
    s.qs = reinterpret_cast<int8_t *>(s.mem);
    s.d = reinterpret_cast<float *>(s.mem + align256(act));
    s.sums = reinterpret_cast<int *>(s.mem + align256(act) + align256(nd * sizeof(float)));
    ggml_ext_cuda_gemm_quantize_for(mm->src[0], x, n, s.qs, s.d, s.sums, ctx.stream());
    s.node = mm;
    return true;
}

bool ggml_ext_cuda_run_deferred(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    if (ctx.device < 0 || ctx.device >= kMaxDevices) return false;
    Stash & s = stashes[ctx.device];
    if (s.node != dst) return false;  // its norm ran as a node: the product reads it as usual
    s.node = nullptr;
    ggml_ext_cuda_gemm_late(ctx, dst->src[0], dst->ne[1], s.qs, s.d, s.sums, dst);
    deferred_count++;
    return true;
}
