// Self-test of the CUDA emulator (cuda_emu.h), driven by tests/test_cuda_emu.py:
//   emu_selftest half       : every float read from stdin (one per line) -> its binary16 bits
//   emu_selftest warp       : shuffles, block barriers with exited threads, cp.async groups, the
//                             three mma shapes, __syncthreads_or and wgmma (u8 x s8 through a
//                             shared-memory descriptor) against plain loops; prints "ok" or what failed
//   emu_selftest deadlock   : a __syncwarp that one lane skips (the emulator must abort)
//   emu_selftest unfenced   : wgmma reading B that cp.async staged, first with fence.proxy.async
//                             (prints "fenced ok"), then without (the emulator must abort)
//   emu_selftest pipeline   : a warp-specialized pipeline on mbarriers, bulk copies and cp.async's
//                             arrivals, and named barriers (kernels/mbarrier.cuh); prints "ok" or
//                             what failed
//   emu_selftest stalled    : consumers waiting on a stage nobody fills (the emulator must abort)
#include "cuda_emu.h"
#include "async_copy.cuh"
#include "launch.cuh"
#include "mbarrier.cuh"

#include <random>
#include <string>
#include <vector>

namespace {

__global__ void shuffle_kernel(int * out) {
    const int l = threadIdx.x;
    out[0 * 64 + l] = __shfl_xor_sync(0xffffffffu, 100 + l, 5);
    out[1 * 64 + l] = __shfl_sync(0xffffffffu, 100 + l, 7, 16);
    out[2 * 64 + l] = __shfl_down_sync(0xffffffffu, 100 + l, 3);
    out[3 * 64 + l] = __shfl_up_sync(0xffffffffu, 100 + l, 2, 8);
}

// threads past `live` return before the barrier; the others still meet there
__global__ void barrier_kernel(int * out, int live) {
    __shared__ int cell[256];
    const int i = threadIdx.x;
    if (i >= live) return;
    cell[i] = i * 3;
    __syncthreads();
    out[i] = cell[live - 1 - i];
}

// cp.async: the bytes land at the wait, not before
__global__ void cp_async_kernel(const int * src, int * out) {
    __shared__ __align__(16) int buf[4 * 32];
    const int l = threadIdx.x;
    buf[4 * l] = -1;
    cuda_emu::cp_async_16(&buf[4 * l], &src[4 * l]);
    cuda_emu::cp_async_commit();
    out[l] = buf[4 * l];  // before the wait: neither the old -1 nor the data (in flight: poisoned)
    cuda_emu::cp_async_wait(0);
    out[32 + l] = buf[4 * l];
}

__global__ void mma_kernel(const int8_t * a, const int8_t * b, const uint16_t * ah, const uint16_t * bh, int * c32,
                           int * c16, float * cf) {
    const int l = threadIdx.x, g = l / 4, t = l % 4;
    auto pack4 = [](const int8_t * p) {
        uint32_t v = 0;
        for (int i = 0; i < 4; ++i) v |= (uint32_t)(uint8_t)p[i] << (8 * i);
        return (int)v;
    };
    // A 16 x 32 row-major, B 32 x 8 (column n at b + 32 n)
    int fa[4] = {pack4(a + g * 32 + 4 * t), pack4(a + (g + 8) * 32 + 4 * t), pack4(a + g * 32 + 16 + 4 * t),
                 pack4(a + (g + 8) * 32 + 16 + 4 * t)};
    int fb[2] = {pack4(b + g * 32 + 4 * t), pack4(b + g * 32 + 16 + 4 * t)};
    int acc[4] = {1, 2, 3, 4};
    cuda_emu::mma_m16n8k32_s8(acc, fa, fb);
    for (int i = 0; i < 4; ++i) c32[l * 4 + i] = acc[i];
    // the first 16 k only: m16n8k16
    int fa16[2] = {fa[0], fa[1]};
    int acc16[4] = {0, 0, 0, 0};
    cuda_emu::mma_m16n8k16_s8(acc16, fa16, fb[0]);
    for (int i = 0; i < 4; ++i) c16[l * 4 + i] = acc16[i];
    // f16: A 16 x 16 row-major, B 16 x 8 (column n at bh + 16 n)
    auto pack2 = [](const uint16_t * p) { return (uint32_t)p[0] | ((uint32_t)p[1] << 16); };
    uint32_t ha[4] = {pack2(ah + g * 16 + 2 * t), pack2(ah + (g + 8) * 16 + 2 * t), pack2(ah + g * 16 + 8 + 2 * t),
                      pack2(ah + (g + 8) * 16 + 8 + 2 * t)};
    uint32_t hb[2] = {pack2(bh + g * 16 + 2 * t), pack2(bh + g * 16 + 8 + 2 * t)};
    float accf[4] = {0.5f, 0.0f, 0.0f, -0.5f};
    cuda_emu::mma_m16n8k16_f16(accf, ha, hb);
    for (int i = 0; i < 4; ++i) cf[l * 4 + i] = accf[i];
}

// __syncthreads_or over rounds: round r's predicate is true for thread r only (none in the last)
__global__ void sync_or_kernel(int * out, int rounds) {
    for (int r = 0; r < rounds; ++r) out[r * 64 + threadIdx.x] = __syncthreads_or((int)threadIdx.x == r);
}

// wgmma m64n24k32 u8 x s8: A (64 x 32 u8, row-major) in each warp's mma A layout of its 16 rows;
// B (32 x 24 s8, column n at b + 32 n) staged into the dynamic shared memory as the descriptor
// reads it: core matrix (k / 16, n / 8) at 64 + (n / 8) sbo + (k / 16) lbo, row n % 8, byte k % 16.
// staging 0: plain stores; 1: cp.async of the shared-memory image (b_image) in 16-byte chunks, then
// fence.proxy.async; 2: the same without the fence (wgmma must not read such bytes).
constexpr int kWgN = 24, kWgLbo = 128, kWgSbo = 512, kWgSmem = 64 + 3 * kWgSbo;
__global__ void wgmma_kernel(const uint8_t * a, const int8_t * b, const int8_t * b_image, int * d_out,
                             int * d_before_wait, int accumulate, int staging) {
    char * smem = static_cast<char *>(cuda_emu::dynamic_smem());
    const int tid = threadIdx.x, w = tid / 32, l = tid % 32, g = l / 4, t = l % 4;
    if (staging == 0) {
        for (int i = tid; i < 32 * kWgN; i += 128) {
            const int k = i % 32, n = i / 32;
            smem[64 + (n / 8) * kWgSbo + (k / 16) * kWgLbo + (n % 8) * 16 + k % 16] = (char)b[i];
        }
    } else {
        for (int c = tid; c < kWgSmem / 16; c += 128) cuda_emu::cp_async_16(smem + 16 * c, b_image + 16 * c);
        cuda_emu::cp_async_commit();
        cuda_emu::cp_async_wait(0);
        if (staging == 1) cuda_emu::fence_proxy_async();
    }
    __syncthreads();
    auto pack4 = [](const uint8_t * p) {
        uint32_t v = 0;
        for (int i = 0; i < 4; ++i) v |= (uint32_t)p[i] << (8 * i);
        return (int)v;
    };
    const uint8_t * ar = a + (16 * w) * 32;
    const int fa[4] = {pack4(ar + g * 32 + 4 * t), pack4(ar + (g + 8) * 32 + 4 * t), pack4(ar + g * 32 + 16 + 4 * t),
                       pack4(ar + (g + 8) * 32 + 16 + 4 * t)};
    int d[kWgN / 2];
    for (int i = 0; i < kWgN / 2; ++i) d[i] = 1000 * i + tid;
    const uint64_t desc = (uint64_t)((cuda_emu::shared_offset(smem + 64) & 0x3FFFF) >> 4) |
                          ((uint64_t)(kWgLbo >> 4) << 16) | ((uint64_t)(kWgSbo >> 4) << 32);
    cuda_emu::wgmma_m64k32_u8s8(kWgN, d, fa, desc, accumulate != 0);
    cuda_emu::wgmma_commit();
    d_before_wait[tid] = d[0];  // the product runs at the wait, as the GPU's completes by then
    cuda_emu::wgmma_wait(0);
    for (int i = 0; i < kWgN / 2; ++i) d_out[tid * (kWgN / 2) + i] = d[i];
}

__global__ void sync_none_kernel(int * out) { out[threadIdx.x] = __syncthreads_or(0); }

// B (32 x kWgN, column n at b + 32 n) laid out as wgmma_kernel's shared memory holds it.
std::vector<int8_t> wgmma_b_image(const std::vector<int8_t> & b) {
    std::vector<int8_t> image(kWgSmem, 0);
    for (int i = 0; i < 32 * kWgN; ++i) {
        const int k = i % 32, n = i / 32;
        image[64 + (n / 8) * kWgSbo + (k / 16) * kWgLbo + (n % 8) * 16 + k % 16] = b[i];
    }
    return image;
}

__global__ void deadlock_kernel(int * out) {
    if (threadIdx.x != 0) __syncwarp();
    out[threadIdx.x] = 1;
}

int failures = 0;

void expect(bool ok, const std::string & what) {
    if (!ok) {
        std::printf("FAILED %s\n", what.c_str());
        ++failures;
    }
}

// A producer warp stages kPipeRounds chunks of kPipeInts ints through kPipeStages stages, completing
// on the stage's `full` barrier: lane 0 the first half with two bulk copies, and every lane 16 bytes
// of the second half with a cp.async and an arrival once it lands (cp.async.mbarrier.arrive.noinc,
// so the barrier counts 1 + 32 arrivals); warps 1 and 2 wait for each stage,
// sum 4 ints a thread into out[r * 64 + c] and release it on `empty` (one arrival a warp). *before:
// what the producer read of stage 0 right after issuing its copies (in flight until a thread tests
// the barrier: poison). With `fill` false the producer stages nothing, so the consumers' first wait
// can never pass.
constexpr int kPipeStages = 2, kPipeRounds = 5, kPipeInts = 64 * 4;
__global__ void pipeline_kernel(const int * src, int * out, int * before, bool fill) {
    __shared__ __align__(16) int stage[kPipeStages][kPipeInts];
    __shared__ __align__(8) uint64_t full[kPipeStages], empty[kPipeStages];
    const int tid = threadIdx.x, warp = tid / 32;
    if (tid == 0) {
        for (int s = 0; s < kPipeStages; ++s) {
            mbar_init(&full[s], 1 + 32);
            mbar_init(&empty[s], 2);
        }
        mbar_init_fence();
    }
    __syncthreads();
    if (warp == 0) {
        if (!fill) return;
        for (int r = 0; r < kPipeRounds; ++r) {
            const int s = r % kPipeStages, use = r / kPipeStages;
            mbar_wait_parity(&empty[s], (use & 1) ^ 1);  // the consumers released its use before (use 0: at once)
            constexpr int kHalf = kPipeInts / 2, kQuarter = kPipeInts / 4;
            if (tid == 0) {
                mbar_arrive_expect_tx(&full[s], kHalf * 4);
                bulk_copy_g2s(stage[s], src + r * kPipeInts, kQuarter * 4, &full[s]);
                bulk_copy_g2s(stage[s] + kQuarter, src + r * kPipeInts + kQuarter, kQuarter * 4, &full[s]);
            }
            cp_async_16(stage[s] + kHalf + 4 * tid, src + r * kPipeInts + kHalf + 4 * tid);
            cp_async_mbar_arrive_noinc(&full[s]);
            if (r == 0 && tid == 0) before[0] = stage[0][0], before[1] = stage[0][kHalf];
        }
        return;
    }
    const int c = tid - 32;
    for (int r = 0; r < kPipeRounds; ++r) {
        const int s = r % kPipeStages;
        mbar_wait_parity(&full[s], (r / kPipeStages) & 1);
        int sum = 0;
        for (int i = 0; i < 4; ++i) sum += stage[s][4 * c + i];
        out[r * 64 + c] = sum;
        __syncwarp();  // the warp's reads of the stage done before its arrival releases it
        if (tid % 32 == 0) mbar_arrive(&empty[s]);
    }
}

// Named barriers: warps 0-1 meet at barrier 1 and warps 2-3 at barrier 2 (64 threads each), each
// pair exchanging through shared memory; then warp 0 publishes a value and arrives at barrier 3
// without waiting, and warp 3 waits there (64 threads) before reading it.
__global__ void named_barrier_kernel(int * out) {
    __shared__ int cell[128];
    __shared__ int flag;
    const int tid = threadIdx.x, warp = tid / 32;
    cell[tid] = 7 * tid + 1;
    const int group = warp / 2, base = 64 * group;
    named_bar_sync(1 + group, 64);
    out[tid] = cell[base + 63 - (tid - base)];
    if (warp == 0) {
        if (tid == 0) flag = 4242;
        __syncwarp();
        named_bar_arrive(3, 64);
    } else if (warp == 3) {
        named_bar_sync(3, 64);
        out[128 + tid - 96] = flag;
    }
}

void pipeline_tests() {
    std::vector<int> src(kPipeRounds * kPipeInts), out(kPipeRounds * 64, -1);
    int before[2] = {-1, -1};
    for (size_t i = 0; i < src.size(); ++i) src[i] = (int)(i * 2654435761u % 100003u);
    DFLASH_LAUNCH(1, 96, 0, nullptr, pipeline_kernel)(src.data(), out.data(), before, true);
    expect(before[0] == 0x7B7B7B7B, "a bulk copy's destination not poisoned before its barrier's wait");
    expect(before[1] == 0x7B7B7B7B, "a cp.async's destination not poisoned before its barrier's wait");
    for (int c = 0; c < 64; ++c) {
        for (int r = 0; r < kPipeRounds; ++r) {
            int want = 0;
            for (int i = 0; i < 4; ++i) want += src[r * kPipeInts + 4 * c + i];
            expect(out[r * 64 + c] == want, "pipeline round " + std::to_string(r) + " consumer " + std::to_string(c));
        }
    }
    std::vector<int> named(160, -1);
    DFLASH_LAUNCH(1, 128, 0, nullptr, named_barrier_kernel)(named.data());
    for (int tid = 0; tid < 128; ++tid) {
        const int base = 64 * (tid / 64);
        expect(named[tid] == 7 * (base + 63 - (tid - base)) + 1,
               "named barrier exchange, thread " + std::to_string(tid));
    }
    for (int i = 0; i < 32; ++i) expect(named[128 + i] == 4242, "bar.arrive then bar.sync, lane " + std::to_string(i));
    if (failures == 0) std::printf("ok\n");
}

void warp_tests() {
    std::vector<int> out(4 * 64, 0);
    DFLASH_LAUNCH(1, 32, 0, nullptr, shuffle_kernel)(out.data());
    for (int l = 0; l < 32; ++l) {
        expect(out[l] == 100 + (l ^ 5), "shfl_xor lane " + std::to_string(l));
        expect(out[64 + l] == 100 + (l / 16) * 16 + 7, "shfl width 16 lane " + std::to_string(l));
        expect(out[128 + l] == 100 + (l + 3 < 32 ? l + 3 : l), "shfl_down lane " + std::to_string(l));
        const int up = l - 2 >= (l / 8) * 8 ? l - 2 : l;
        expect(out[192 + l] == 100 + up, "shfl_up width 8 lane " + std::to_string(l));
    }

    std::vector<int> bar(256, -7);
    DFLASH_LAUNCH(dim3(2), dim3(256), 0, nullptr, barrier_kernel)(bar.data(), 200);
    for (int i = 0; i < 200; ++i)
        expect(bar[i] == (199 - i) * 3, "barrier with exited threads, thread " + std::to_string(i));
    expect(bar[200] == -7, "an exited thread wrote");

    std::vector<int> src(128), cp(64, 0);
    for (int i = 0; i < 128; ++i) src[i] = 1000 + i;
    DFLASH_LAUNCH(1, 32, 0, nullptr, cp_async_kernel)(src.data(), cp.data());
    for (int l = 0; l < 32; ++l) {
        expect(cp[l] == 0x7B7B7B7B, "cp.async's destination not poisoned before its wait");
        expect(cp[32 + l] == 1000 + 4 * l, "cp.async did not land at its wait");
    }

    std::mt19937 gen(3);
    std::uniform_int_distribution<int> byte(-128, 127);
    std::vector<int8_t> a(16 * 32), b(8 * 32);
    for (auto & v : a) v = (int8_t)byte(gen);
    for (auto & v : b) v = (int8_t)byte(gen);
    std::uniform_real_distribution<float> real(-2.0f, 2.0f);
    std::vector<uint16_t> ah(16 * 16), bh(8 * 16);
    for (auto & v : ah) v = cuda_emu::float_to_half_bits(real(gen));
    for (auto & v : bh) v = cuda_emu::float_to_half_bits(real(gen));
    std::vector<int> c32(128), c16(128);
    std::vector<float> cf(128);
    DFLASH_LAUNCH(1, 32, 0, nullptr, mma_kernel)(a.data(), b.data(), ah.data(), bh.data(), c32.data(), c16.data(),
                                                 cf.data());
    const int init32[4] = {1, 2, 3, 4};
    const float initf[4] = {0.5f, 0.0f, 0.0f, -0.5f};
    for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4;
        for (int i = 0; i < 4; ++i) {
            const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
            int s32 = init32[i], s16 = 0;
            double sf = initf[i];
            for (int k = 0; k < 32; ++k) s32 += a[row * 32 + k] * b[col * 32 + k];
            for (int k = 0; k < 16; ++k) s16 += a[row * 32 + k] * b[col * 32 + k];
            for (int k = 0; k < 16; ++k) {
                sf += (double)cuda_emu::half_bits_to_float(ah[row * 16 + k]) *
                      (double)cuda_emu::half_bits_to_float(bh[col * 16 + k]);
            }
            const std::string at = " lane " + std::to_string(l) + " c" + std::to_string(i);
            expect(c32[l * 4 + i] == s32, "mma m16n8k32 s8" + at);
            expect(c16[l * 4 + i] == s16, "mma m16n8k16 s8" + at);
            expect(cf[l * 4 + i] == (float)sf, "mma m16n8k16 f16" + at);
        }
    }

    std::vector<int> sor(5 * 64, -1);
    DFLASH_LAUNCH(1, 64, 0, nullptr, sync_or_kernel)(sor.data(), 5);
    for (int r = 0; r < 5; ++r) {
        for (int i = 0; i < 64; ++i) expect(sor[r * 64 + i] == 1, "__syncthreads_or round " + std::to_string(r));
    }
    std::vector<int> none(64, -1);
    DFLASH_LAUNCH(1, 64, 0, nullptr, sync_none_kernel)(none.data());
    for (int i = 0; i < 64; ++i) expect(none[i] == 0, "__syncthreads_or of no predicate");

    std::uniform_int_distribution<int> ubyte(0, 255);
    std::vector<uint8_t> wa(64 * 32);
    std::vector<int8_t> wb(32 * kWgN);
    for (auto & v : wa) v = (uint8_t)ubyte(gen);
    for (auto & v : wb) v = (int8_t)byte(gen);
    const std::vector<int8_t> image = wgmma_b_image(wb);
    for (int run = 0; run < 4; ++run) {
        const int accumulate = run % 2, staging = run / 2;  // plain stores, then cp.async and the fence
        std::vector<int> d(128 * (kWgN / 2)), before(128);
        DFLASH_LAUNCH(1, 128, kWgSmem, nullptr, wgmma_kernel)(wa.data(), wb.data(), image.data(), d.data(),
                                                              before.data(), accumulate, staging);
        for (int tid = 0; tid < 128; ++tid) {
            expect(before[tid] == tid, "wgmma's d changed before its wait_group");
            const int w = tid / 32, l = tid % 32, g = l / 4, t = l % 4;
            for (int i = 0; i < kWgN / 2; ++i) {
                const int row = 16 * w + g + (i % 4 >= 2 ? 8 : 0), col = 8 * (i / 4) + 2 * t + (i & 1);
                int want = accumulate ? 1000 * i + tid : 0;
                for (int k = 0; k < 32; ++k) want += (int)wa[row * 32 + k] * (int)wb[col * 32 + k];
                expect(d[tid * (kWgN / 2) + i] == want,
                       "wgmma m64n24k32 u8 s8 thread " + std::to_string(tid) + " d" + std::to_string(i) +
                           " accumulate " + std::to_string(accumulate) + " staging " + std::to_string(staging));
            }
        }
    }
    if (failures == 0) std::printf("ok\n");
}

}  // namespace

int main(int argc, char ** argv) {
    const std::string what = argc > 1 ? argv[1] : "warp";
    if (what == "half") {
        float f;
        while (std::scanf("%f", &f) == 1) std::printf("%u\n", (unsigned)cuda_emu::float_to_half_bits(f));
        for (unsigned h = 0; h < 65536; ++h) {  // and back: binary16 -> float -> binary16 is the identity (NaNs aside)
            const float x = cuda_emu::half_bits_to_float((uint16_t)h);
            if (x == x && cuda_emu::float_to_half_bits(x) != h) {
                std::printf("FAILED round trip of %u\n", h);
                return 1;
            }
        }
        return 0;
    }
    if (what == "unfenced") {
        std::vector<uint8_t> a(64 * 32, 1);
        std::vector<int8_t> b(32 * kWgN, 2);
        const std::vector<int8_t> image = wgmma_b_image(b);
        std::vector<int> d(128 * (kWgN / 2)), before(128);
        DFLASH_LAUNCH(1, 128, kWgSmem, nullptr, wgmma_kernel)(a.data(), b.data(), image.data(), d.data(), before.data(),
                                                              0, 1);
        std::printf("fenced %s\n", d[0] == 64 ? "ok" : "wrong");
        std::fflush(stdout);
        DFLASH_LAUNCH(1, 128, kWgSmem, nullptr, wgmma_kernel)(a.data(), b.data(), image.data(), d.data(), before.data(),
                                                              0, 2);
        std::printf("no missing fence reported\n");
        return 0;
    }
    if (what == "pipeline") {
        pipeline_tests();
        return failures == 0 ? 0 : 1;
    }
    if (what == "stalled") {
        std::vector<int> src(kPipeRounds * kPipeInts), out(kPipeRounds * 64);
        int before[2] = {0, 0};
        DFLASH_LAUNCH(1, 96, 0, nullptr, pipeline_kernel)(src.data(), out.data(), before, false);
        std::printf("no stalled wait reported\n");
        return 0;
    }
    if (what == "deadlock") {
        std::vector<int> out(32);
        DFLASH_LAUNCH(1, 32, 0, nullptr, deadlock_kernel)(out.data());
        std::printf("no deadlock reported\n");
        return 0;
    }
    warp_tests();
    return failures == 0 ? 0 : 1;
}
