// ggml_ext's launch policy for tagged mmq products (ggml_ext_matmul_cuda.cuh, patches/0003).
//
// ggml's mmq runs stream-k: K is split evenly over the multiprocessors and a second kernel (the
// fixup) adds the partial tiles. For matrices with few output tiles and a short K (a small
// model, or a verify of 16-64 tokens) the fixup costs as much as the product (H200, the packaged
// tiny pair: 4.4 us vs 3.8 us per product, bench/results/h200-s4-pair-kernels.json). One block per
// tile needs no fixup; it loses when tiles are uneven over the multiprocessors and K is long.

#include "ggml_ext_matmul.h"
#include "ggml_ext_matmul_cuda.cuh"

#include <cstdlib>

namespace {

thread_local bool tagged_node = false;
bool tiles_policy_on = true;

// What a fixup pass costs, in mmq iterations of one tile; DFLASH_MMQ_FIXUP_ITERS overrides it
// (0 = ggml's own choice, for comparisons). Calibrated on the H200 (h200-s4-matmul-tiles.json):
// at 6, a 12288 x 5120 q4_K product of 16-64 columns (96 tiles, 20 iterations) went to one block
// per tile and ran 12-18% slower; at 3 it keeps stream-k, while the tiny pair's products (<= 32
// tiles of 2 iterations), 15-19% faster without the fixup, still drop it.
double fixup_iters() {
    static const double v = [] {
        const char * e = std::getenv("DFLASH_MMQ_FIXUP_ITERS");
        return e ? std::atof(e) : 3.0;
    }();
    return v;
}

}  // namespace

namespace ggml_ext {
void set_mmq_tiles_enabled(bool on) { tiles_policy_on = on; }
bool mmq_tiles_enabled() { return tiles_policy_on; }
}  // namespace ggml_ext

ggml_ext_mmq_tiles_scope::ggml_ext_mmq_tiles_scope(const ggml_tensor * dst) : prev(tagged_node) {
    tagged_node = ggml_ext::is_mul_mat_tiles(dst);
}

ggml_ext_mmq_tiles_scope::~ggml_ext_mmq_tiles_scope() { tagged_node = prev; }

bool ggml_ext_mmq_prefer_tiles(int ntiles, int nsm, int k_iters) {
    if (!tagged_node || !tiles_policy_on || fixup_iters() <= 0 || ntiles < 1 || nsm < 1) return false;
    const double waves = (double)((ntiles + nsm - 1) / nsm);
    // The busiest multiprocessor's iterations: whole tiles, or an even share plus the fixup.
    return waves * k_iters <= (double)ntiles * k_iters / nsm + fixup_iters();
}
