// ggml_ext's tensor-core GEMM through its entry points (gemm_kquant_mma.cu and the files of its forms,
// gemm_mma_forms.cuh, are compiled in here) on the CPU emulator: the host code that checks a
// product, picks its form, quantizes and launches, which tools/device/gemv_standalone.cu's kernel
// checks do not run. tests/test_cuda_emu.py writes
// the inputs into a folder and runs
//   gemm_entry_emu pair <dir>   meta: t1 t2 rows1 rows2 k n (ggml types); w1.bin w2.bin x.bin norm.bin
//     -> out.bin: the two products of rms_norm(x) * norm from one quantizer
//        (ggml_ext_cuda_gemm_mma_pair_from), then each alone (ggml_ext_cuda_gemm_mma_from)
//   gemm_entry_emu head <dir>   meta: t rows S n; w.bin o.bin z.bin norm.bin (o, z [n, k])
//     -> out.bin: w @ (silu(z) * (rms_norm(o per head of S) * norm)), the quantizer computing the
//        norm (ActSource::head_w); exit 3 when the GEMM refuses the source
//   (each mode also writes launches.txt: "tma N", the launches whose stages bulk tensor copies
//   filled, ggml_ext::mma_tma_launches: on by default, DFLASH_MMA_TMA=0 in the environment off)
//   gemm_entry_emu gate <dir>   meta: t rows hd n; w.bin o.bin rows.bin (o [n, k], rows [n, W])
//     -> out.bin: w @ (sigmoid(gate) * o), the gate's head h of a column at rows hd + 2 hd h of
//        the column's W floats (ActSource::gate: the [q; gate] heads of the attention's product)
// (rows x k weights, raw ggml bytes; x [n, k] f32; outputs [n, rows] f32 each).
#include "cuda_emu.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "harness_io.h"

#include <fstream>
#include <string>
#include <vector>

#include "../kernels/gemm_kquant_mma.cu"
#include "../kernels/gemm_mma_q4k.cu"
#include "../kernels/gemm_mma_q4k_int_mins.cu"
#include "../kernels/gemm_mma_q5k.cu"
#include "../kernels/gemm_mma_q5k_int_mins.cu"
#include "../kernels/gemm_mma_q6k.cu"
#include "../kernels/gemm_mma_q80.cu"
#include "../kernels/gemm_q4k_wgmma_forms.cu"
#include "../kernels/gemm_f16_wgmma.cu"

// The few functions of ggml and ggml_ext the entry points call (neither library is linked here).
extern "C" enum ggml_backend_buffer_usage ggml_backend_buffer_get_usage(ggml_backend_buffer_t) {
    return GGML_BACKEND_BUFFER_USAGE_WEIGHTS;
}
namespace ggml_ext {
bool q80_enabled() { return false; }
}  // namespace ggml_ext

namespace {

// Bytes in the emulator's device memory.
void * device_copy(const std::vector<char> & host) {
    void * p = nullptr;
    cudaMalloc(&p, host.size());
    cudaMemcpy(p, host.data(), host.size(), cudaMemcpyHostToDevice);
    return p;
}

int64_t row_bytes(ggml_type t, int64_t k) {
    switch (t) {
        case GGML_TYPE_Q4_K:
            return k / 256 * 144;
        case GGML_TYPE_Q5_K:
            return k / 256 * 176;
        case GGML_TYPE_Q6_K:
            return k / 256 * 210;
        case GGML_TYPE_Q8_0:
            return k / 32 * 34;
        default:
            std::fprintf(stderr, "gemm_entry_emu: type %d is not a GEMM type\n", (int)t);
            std::exit(2);
    }
}

ggml_backend_buffer * const kWeights = reinterpret_cast<ggml_backend_buffer *>(16);  // not a compute buffer

// rows x k weights of type t from a file, in device memory.
ggml_tensor weight(ggml_type t, const std::vector<char> & bytes, int64_t k, int64_t rows) {
    ggml_tensor w{};
    w.type = t;
    w.ne[0] = k, w.ne[1] = rows, w.ne[2] = w.ne[3] = 1;
    w.nb[1] = (size_t)row_bytes(t, k);
    w.nb[0] = t == GGML_TYPE_Q8_0 ? 34 : w.nb[1] / (k / 256);
    w.nb[2] = w.nb[3] = w.nb[1] * rows;
    if ((int64_t)bytes.size() != (int64_t)w.nb[1] * rows) {
        std::fprintf(stderr, "gemm_entry_emu: %zu weight bytes where %lld were expected\n", bytes.size(),
                     (long long)(w.nb[1] * rows));
        std::exit(2);
    }
    w.data = device_copy(bytes);
    w.buffer = kWeights;
    return w;
}

// An f32 output [rows, n] in device memory.
ggml_tensor output(int64_t rows, int64_t n) {
    ggml_tensor d{};
    d.type = GGML_TYPE_F32;
    d.ne[0] = rows, d.ne[1] = n, d.ne[2] = d.ne[3] = 1;
    d.nb[0] = 4, d.nb[1] = 4 * rows, d.nb[2] = d.nb[3] = 4 * rows * n;
    cudaMalloc(&d.data, (size_t)rows * n * 4);
    return d;
}

void append(std::vector<char> & out, const ggml_tensor & d) {
    const size_t bytes = (size_t)d.ne[0] * d.ne[1] * 4;
    const size_t at = out.size();
    out.resize(at + bytes);
    cudaMemcpy(out.data() + at, d.data, bytes, cudaMemcpyDeviceToHost);
}

}  // namespace

int main(int argc, char ** argv) {
    const HarnessDir io("gemm_entry_emu", argc, argv);
    const std::string & mode = io.mode;
    const std::vector<int64_t> & m = io.meta;
    auto in = [&](const char * name) { return io.in(name); };
    ggml_backend_cuda_context ctx;
    std::vector<char> out;
    constexpr float kEps = 1e-6f;
    if (mode == "pair") {  // meta: t1 t2 rows1 rows2 k n
        const int64_t k = m[4], n = m[5];
        ggml_tensor w1 = weight((ggml_type)m[0], in("w1"), k, m[2]), w2 = weight((ggml_type)m[1], in("w2"), k, m[3]);
        ActSource x;
        x.x = static_cast<const float *>(device_copy(in("x")));
        x.sx = k;
        x.norm_w = static_cast<const float *>(device_copy(in("norm")));
        x.norm_eps = kEps;
        x.norm_threads = k < 1024 ? 256 : 1024;
        ggml_tensor d1 = output(m[2], n), d2 = output(m[3], n), s1 = output(m[2], n), s2 = output(m[3], n);
        if (!ggml_ext_cuda_gemm_mma_pair_from(ctx, &w1, &d1, &w2, &d2, x, n)) {
            std::fprintf(stderr, "gemm_entry_emu: the pair was refused\n");
            return 3;
        }
        if (!ggml_ext_cuda_gemm_mma_from(ctx, &w1, x, n, &s1) || !ggml_ext_cuda_gemm_mma_from(ctx, &w2, x, n, &s2)) {
            std::fprintf(stderr, "gemm_entry_emu: a product alone was refused\n");
            return 2;
        }
        for (const ggml_tensor * d : {&d1, &d2, &s1, &s2}) append(out, *d);
    } else if (mode == "head") {  // meta: t rows S n
        const int64_t rows = m[1], n = m[3];
        const std::vector<char> o = in("o");
        const int64_t k = (int64_t)o.size() / 4 / n;
        ggml_tensor w = weight((ggml_type)m[0], in("w"), k, rows);
        ActSource x;
        x.x = static_cast<const float *>(device_copy(in("z")));
        x.sx = k;
        x.up = static_cast<const float *>(device_copy(o));
        x.sup = k;
        x.head_w = static_cast<const float *>(device_copy(in("norm")));
        x.head = (int)m[2];
        x.head_eps = kEps;
        ggml_tensor d = output(rows, n);
        if (!ggml_ext_cuda_gemm_mma_from(ctx, &w, x, n, &d)) {
            std::fprintf(stderr, "gemm_entry_emu: the head-norm source was refused\n");
            return 3;
        }
        append(out, d);
    } else if (mode == "gate") {  // meta: t rows hd n
        const int64_t rows = m[1], hd = m[2], n = m[3];
        const std::vector<char> o = in("o"), qg = in("rows");
        const int64_t k = (int64_t)o.size() / 4 / n, wq = (int64_t)qg.size() / 4 / n;
        ggml_tensor w = weight((ggml_type)m[0], in("w"), k, rows);
        ActSource x;
        x.x = static_cast<const float *>(device_copy(o));
        x.sx = k;
        x.gate = static_cast<const float *>(device_copy(qg)) + hd;
        x.sgate = wq;
        x.gate_block = (int)hd;
        x.gate_stride = (int)(2 * hd);
        ggml_tensor d = output(rows, n);
        if (!ggml_ext_cuda_gemm_mma_from(ctx, &w, x, n, &d)) {
            std::fprintf(stderr, "gemm_entry_emu: the gate source was refused\n");
            return 3;
        }
        append(out, d);
    } else {
        std::fprintf(stderr, "gemm_entry_emu: unknown mode %s\n", mode.c_str());
        return 2;
    }
    io.write_out(out);
    std::ofstream(io.dir + "launches.txt") << "tma " << ggml_ext::mma_tma_launches() << "\n";
    return 0;
}
