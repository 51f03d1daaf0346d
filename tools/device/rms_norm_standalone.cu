// GPU: what an RMS norm times its weight costs at the 27B's width (5120) for 1 / 16 / 64 rows, as a
// step replays it: 129 launches in a CUDA graph (a step's count, bench/results/h200-s22-*), timed
// with events. Forms: ggml's shape (one block of 1024 threads a row, scalar loads, block-wide
// reduction, the row read again for the outputs: rms_norm_f32<1024, true>, which takes 4.5 us a
// launch in the 27B's steps) and narrower blocks reading float4s that keep the row in registers
// between the sum and the outputs (256 and 128 threads). Each prints a JSON line: us a launch,
// and the largest difference from the first form's outputs (the sums run in another order).
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -o rms_norm_sa tools/device/rms_norm_standalone.cu && ./rms_norm_sa
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda_check.h"

namespace {

// A block's sum of v (kThreads threads, a multiple of 32).
template <int kThreads>
__device__ float block_sum(float v) {
    __shared__ float part[kThreads / 32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
    __syncthreads();
    __shared__ float total;
    if (threadIdx.x < 32) {  // warp 0 adds the warps' sums and hands the total to every thread
        v = threadIdx.x < kThreads / 32 ? part[threadIdx.x] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
        if (threadIdx.x == 0) total = v;
    }
    __syncthreads();
    return total;
}

// ggml's shape: 1024 threads, strided scalar loads, the row read twice.
__global__ void __launch_bounds__(1024) norm_scalar(const float * x, const float * w, float * y, int n, float eps) {
    const float * xr = x + (int64_t)blockIdx.x * n;
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += 1024) s += xr[i] * xr[i];
    const float r = rsqrtf(block_sum<1024>(s) / n + eps);
    for (int i = threadIdx.x; i < n; i += 1024) y[(int64_t)blockIdx.x * n + i] = r * xr[i] * w[i];
}

// kThreads threads, kVec float4s each (n = 4 kVec kThreads), the row kept in registers.
template <int kThreads, int kVec>
__global__ void __launch_bounds__(kThreads) norm_vec(const float * x, const float * w, float * y, int n, float eps) {
    const float4 * xr = reinterpret_cast<const float4 *>(x + (int64_t)blockIdx.x * n);
    const float4 * wr = reinterpret_cast<const float4 *>(w);
    float4 * yr = reinterpret_cast<float4 *>(y + (int64_t)blockIdx.x * n);
    float4 v[kVec];
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
        v[i] = xr[threadIdx.x + i * kThreads];
        s += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
    }
    const float r = rsqrtf(block_sum<kThreads>(s) / n + eps);
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
        const float4 g = wr[threadIdx.x + i * kThreads];
        yr[threadIdx.x + i * kThreads] = make_float4(r * v[i].x * g.x, r * v[i].y * g.y, r * v[i].z * g.z, r * v[i].w * g.w);
    }
}

}  // namespace

int main() {
    constexpr int n = 5120, launches = 129, reps = 50;
    const float eps = 1e-6f;
    for (int rows : {1, 16, 64}) {
        std::vector<float> hx((size_t)rows * n), hw(n);
        uint32_t seed = 7;
        auto rnd = [&] {
            seed = seed * 1664525u + 1013904223u;
            return ((seed >> 8) & 0xffff) / 65536.0f - 0.5f;
        };
        for (auto & v : hx) v = rnd() * 4.0f;
        for (auto & v : hw) v = 1.0f + rnd();
        float *x, *w, *y;
        check(cudaMalloc(&x, hx.size() * 4), "malloc");
        check(cudaMalloc(&w, n * 4), "malloc");
        check(cudaMalloc(&y, hx.size() * 4), "malloc");
        check(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice), "copy");
        check(cudaMemcpy(w, hw.data(), n * 4, cudaMemcpyHostToDevice), "copy");
        std::vector<float> ref(hx.size()), got(hx.size());
        for (int form = 0; form < 3; ++form) {
            cudaStream_t st;
            check(cudaStreamCreate(&st), "stream");
            auto launch = [&] {
                if (form == 0) norm_scalar<<<rows, 1024, 0, st>>>(x, w, y, n, eps);
                if (form == 1) norm_vec<256, n / 1024><<<rows, 256, 0, st>>>(x, w, y, n, eps);
                if (form == 2) norm_vec<128, n / 512><<<rows, 128, 0, st>>>(x, w, y, n, eps);
            };
            cudaGraph_t graph;
            cudaGraphExec_t exec;
            check(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), "capture");
            for (int i = 0; i < launches; ++i) launch();
            check(cudaStreamEndCapture(st, &graph), "capture");
            check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
            check(cudaGraphLaunch(exec, st), "warm-up");
            cudaEvent_t e0, e1;
            cudaEventCreate(&e0);
            cudaEventCreate(&e1);
            cudaEventRecord(e0, st);
            for (int r = 0; r < reps; ++r) check(cudaGraphLaunch(exec, st), "launch");
            cudaEventRecord(e1, st);
            check(cudaEventSynchronize(e1), "sync");
            float ms = 0.0f;
            cudaEventElapsedTime(&ms, e0, e1);
            check(cudaMemcpy(got.data(), y, got.size() * 4, cudaMemcpyDeviceToHost), "copy");
            if (form == 0) ref = got;
            double err = 0.0;
            for (size_t i = 0; i < got.size(); ++i) err = std::fmax(err, std::fabs((double)got[i] - ref[i]));
            const char * names[] = {"scalar_1024", "float4_256", "float4_128"};
            std::printf("{\"bench\": \"rms_norm_mul\", \"form\": \"%s\", \"rows\": %d, \"n\": %d, \"us_per_launch\": %.3f, "
                        "\"max_abs_diff\": %.3g}\n",
                        names[form], rows, n, 1000.0 * ms / (reps * launches), err);
            cudaGraphExecDestroy(exec);
            cudaGraphDestroy(graph);
            cudaStreamDestroy(st);
        }
        cudaFree(x);
        cudaFree(w);
        cudaFree(y);
    }
    return 0;
}
