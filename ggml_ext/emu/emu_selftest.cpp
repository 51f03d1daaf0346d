// Self-test of the CUDA emulator (cuda_emu.h), driven by tests/test_cuda_emu.py:
//   emu_selftest half       : every float read from stdin (one per line) -> its binary16 bits
//   emu_selftest warp       : shuffles, block barriers with exited threads, cp.async groups and
//                             the three mma shapes against plain loops; prints "ok" or what failed
//   emu_selftest deadlock   : a __syncwarp that one lane skips (the emulator must abort)
#include "cuda_emu.h"
#include "launch.cuh"

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
    out[l] = buf[4 * l];  // before the wait: still -1
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
    for (int i = 0; i < 200; ++i) expect(bar[i] == (199 - i) * 3, "barrier with exited threads, thread " + std::to_string(i));
    expect(bar[200] == -7, "an exited thread wrote");

    std::vector<int> src(128), cp(64, 0);
    for (int i = 0; i < 128; ++i) src[i] = 1000 + i;
    DFLASH_LAUNCH(1, 32, 0, nullptr, cp_async_kernel)(src.data(), cp.data());
    for (int l = 0; l < 32; ++l) {
        expect(cp[l] == -1, "cp.async landed before its wait");
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
    if (what == "deadlock") {
        std::vector<int> out(32);
        DFLASH_LAUNCH(1, 32, 0, nullptr, deadlock_kernel)(out.data());
        std::printf("no deadlock reported\n");
        return 0;
    }
    warp_tests();
    return failures == 0 ? 0 : 1;
}
