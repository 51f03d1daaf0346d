// The runtime of the CUDA emulator (cuda_emu.h): fibers for a block's threads, barriers, warp
// exchange, the tensor-core products, half conversions and the host API.
#include "cuda_emu.h"

#include <chrono>
#include <unordered_map>
#include <unordered_set>
#include <vector>

// Under AddressSanitizer (the CI's memcheck of the kernels: tests/test_cuda_emu.py) every switch
// between the scheduler and a fiber is announced, so ASan follows the stacks.
#if defined(__SANITIZE_ADDRESS__)
#define CUDA_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CUDA_EMU_ASAN 1
#endif
#endif
#ifdef CUDA_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace cuda_emu {

// ---- half ----------------------------------------------------------------------------------------
uint16_t float_to_half_bits(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u, fexp = (x >> 23) & 0xFFu, mant = x & 0x7FFFFFu;
    if (fexp == 0xFF) return (uint16_t)(sign | 0x7C00u | (mant ? 0x200u | (mant >> 13) : 0u));  // inf, NaN
    const int e = (int)fexp - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7C00u);  // overflow
    if (e <= 0) {                                    // subnormal or zero
        if (e < -10) return (uint16_t)sign;
        const uint32_t m = mant | 0x800000u;
        const int shift = 14 - e;
        uint32_t h = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1u), halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (h & 1u))) ++h;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)e << 10) | (mant >> 13);
    const uint32_t rem = mant & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent: still right
    return (uint16_t)(sign | (h >= 0x7C00u ? 0x7C00u : h));
}

float half_bits_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
    uint32_t x;
    if (e == 0) {
        const float v = std::ldexp((float)mant, -24);
        return sign ? -v : v;
    }
    if (e == 31) {
        x = sign | 0x7F800000u | (mant << 13);
    } else {
        x = sign | ((e + 112) << 23) | (mant << 13);
    }
    float f;
    std::memcpy(&f, &x, 4);
    return f;
}

// ---- fibers --------------------------------------------------------------------------------------
namespace {

constexpr size_t kStackBytes = 256 * 1024;

// Asynchronous operations a thread issued, in commit groups (cp.async's and wgmma's): they take
// effect when a wait runs them, oldest group first.
template <typename Op>
struct AsyncGroups {
    std::vector<std::vector<Op>> groups;  // committed, oldest first
    std::vector<Op> open;                 // issued since the last commit

    void commit() {
        groups.push_back(std::move(open));
        open.clear();
    }
    // Runs every committed group but the newest n (cp.async.wait_group n, wgmma.wait_group n).
    template <typename Run>
    void run_all_but(int n, Run && run) {
        while ((int)groups.size() > n) {
            for (const auto & op : groups.front()) run(op);
            groups.erase(groups.begin());
        }
    }
    bool empty() const { return open.empty() && groups.empty(); }
    void clear() {
        groups.clear();
        open.clear();
    }
};

struct Fiber {
    void * sp = nullptr;  // saved stack pointer (x86-64) ...
#if !defined(__x86_64__)
    ucontext_t ctx;  // ... or context elsewhere
#endif
    std::vector<char> stack;
    uint3 tid{};
    int linear = 0;
    bool done = false;
    struct Copy {
        void * dst;
        const void * src;
    };
    AsyncGroups<Copy> cp;
    std::unordered_set<uintptr_t> unfenced;  // 16-byte chunks its landed copies wrote since its last proxy fence
    struct Wgmma {  // a wgmma.mma_async as issued: its registers are read and written when it runs
        int n;
        int * d;  // u8 x s8 (k32), or null: f16 (k16) into df
        const int * a;
        uint64_t desc;
        bool accumulate;
        float * df = nullptr;
        const uint32_t * ah = nullptr;
    };
    AsyncGroups<Wgmma> wg;
    void * asan_fake_stack = nullptr;
};

struct WarpBarrier {
    unsigned arrived = 0, mask = 0, gen = 0;
    unsigned char data[kWarpSize][64];
};

// An mbarrier's state (cuda_emu.h): arrivals left in the phase, transaction bytes still expected
// (it may dip below zero when bytes land before their expect_tx, as PTX allows), phases completed,
// and the bulk copies in flight that complete on it.
struct Mbarrier {
    unsigned count = 0, pending = 0;
    int64_t tx = 0;
    uint64_t phases = 0;
    struct Copy {
        void * dst;
        const void * src;
        unsigned bytes;
    };
    std::vector<Copy> copies;
    std::vector<std::vector<Fiber::Copy>> async_arrivals;  // cp.async's arrivals: each one's 16-byte copies
};

struct NamedBarrier {
    int arrived = 0, expected = 0;
    unsigned gen = 0;
};
constexpr int kNamedBarriers = 16;

struct Block {
    std::vector<Fiber> fibers;
    std::vector<WarpBarrier> warps;
    std::unordered_map<uintptr_t, Mbarrier> mbarriers;
    NamedBarrier named[kNamedBarriers];
    int live = 0, arrived = 0;
    unsigned gen = 0;
    uint64_t progress = 0;
    int or_acc = 0, or_result = 0;                // __syncthreads_or: this round's OR, and the last released round's
    std::unordered_map<uintptr_t, int> unfenced;  // chunk -> threads whose copy there is not yet fenced
};

Block g_block;
Fiber * g_current = nullptr;
void * g_sched_sp = nullptr;
#ifdef CUDA_EMU_ASAN
void * g_sched_fake_stack = nullptr;
const void * g_sched_stack_bottom = nullptr;
size_t g_sched_stack_size = 0;
#endif
#if !defined(__x86_64__)
ucontext_t g_sched_ctx;
#endif
uint3 g_block_idx{};
std::vector<unsigned char> g_dynamic_smem;
dim3 g_block_dim, g_grid_dim;
const std::function<void()> * g_body = nullptr;

}  // namespace
}  // namespace cuda_emu

#if defined(__x86_64__)
// cuda_emu_switch(save, to): saves the callee-saved registers, MXCSR and the x87 control word on
// the current stack, stores its pointer in *save, and resumes the stack `to` the same way.
extern "C" void cuda_emu_switch(void ** save, void * to);
extern "C" void cuda_emu_trampoline();
asm(R"(
    .text
    .globl cuda_emu_switch
    .type cuda_emu_switch, @function
cuda_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $16, %rsp
    stmxcsr 8(%rsp)
    fnstcw (%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr 8(%rsp)
    fldcw (%rsp)
    addq $16, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size cuda_emu_switch, .-cuda_emu_switch

    .globl cuda_emu_trampoline
    .type cuda_emu_trampoline, @function
cuda_emu_trampoline:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size cuda_emu_trampoline, .-cuda_emu_trampoline
)");
#endif

namespace cuda_emu {
namespace {

void switch_to_scheduler() {
    Fiber * f = g_current;
#ifdef CUDA_EMU_ASAN
    __sanitizer_start_switch_fiber(f->done ? nullptr : &f->asan_fake_stack, g_sched_stack_bottom, g_sched_stack_size);
#endif
#if defined(__x86_64__)
    cuda_emu_switch(&f->sp, g_sched_sp);
#else
    swapcontext(&f->ctx, &g_sched_ctx);
#endif
#ifdef CUDA_EMU_ASAN
    __sanitizer_finish_switch_fiber(f->asan_fake_stack, &g_sched_stack_bottom, &g_sched_stack_size);
#endif
}

void resume(Fiber & f) {
    g_current = &f;
#ifdef CUDA_EMU_ASAN
    __sanitizer_start_switch_fiber(&g_sched_fake_stack, f.stack.data(), f.stack.size());
#endif
#if defined(__x86_64__)
    cuda_emu_switch(&g_sched_sp, f.sp);
#else
    swapcontext(&g_sched_ctx, &f.ctx);
#endif
#ifdef CUDA_EMU_ASAN
    __sanitizer_finish_switch_fiber(g_sched_fake_stack, nullptr, nullptr);
#endif
    g_current = nullptr;
}

void release_block_barrier_if_complete() {
    Block & b = g_block;
    if (b.arrived > 0 && b.arrived == b.live) {
        b.arrived = 0;
        b.or_result = b.or_acc;  // read by the round's threads as they resume, before any next barrier
        b.or_acc = 0;
        ++b.gen;
        ++b.progress;
    }
}

void fiber_main(Fiber * f) {
#ifdef CUDA_EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &g_sched_stack_bottom, &g_sched_stack_size);  // the first entry
#endif
    (*g_body)();
    if (!f->wg.empty()) fail("a thread ended with wgmmas not waited for");
    f->done = true;
    --g_block.live;
    ++g_block.progress;
    // a warp barrier this lane was named in can no longer complete: reported as a deadlock
    release_block_barrier_if_complete();
    switch_to_scheduler();
    fail("a finished fiber was resumed");
}

#if !defined(__x86_64__)
void fiber_entry_ucontext(int hi, int lo) {
    fiber_main(reinterpret_cast<Fiber *>(((uintptr_t)(unsigned)hi << 32) | (uintptr_t)(unsigned)lo));
}
#endif

void start_fiber(Fiber & f) {
    f.done = false;
    f.cp.clear();
    f.wg.clear();
    f.unfenced.clear();
    if (f.stack.empty()) f.stack.resize(kStackBytes);
#ifdef CUDA_EMU_ASAN
    // the last fiber on this stack never returned from fiber_main: its frames' redzones are still poisoned
    __asan_unpoison_memory_region(f.stack.data(), f.stack.size());
#endif
#if defined(__x86_64__)
    // the frame cuda_emu_switch pops: fpu cw + mxcsr (16 bytes), r15 r14 r13 r12 rbx rbp, return address
    uintptr_t top = (reinterpret_cast<uintptr_t>(f.stack.data()) + f.stack.size()) & ~uintptr_t(15);
    uint64_t * sp = reinterpret_cast<uint64_t *>(top - 72);  // 16-byte aligned at the trampoline's call
    uint32_t mxcsr;
    uint16_t fpucw;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fpucw));
    std::memset(sp, 0, 72);
    std::memcpy(reinterpret_cast<char *>(sp), &fpucw, 2);
    std::memcpy(reinterpret_cast<char *>(sp) + 8, &mxcsr, 4);
    sp[2] = 0;                                                 // r15
    sp[3] = 0;                                                 // r14
    sp[4] = reinterpret_cast<uint64_t>(&fiber_main);           // r13: the function
    sp[5] = reinterpret_cast<uint64_t>(&f);                    // r12: its argument
    sp[6] = 0;                                                 // rbx
    sp[7] = 0;                                                 // rbp
    sp[8] = reinterpret_cast<uint64_t>(&cuda_emu_trampoline);  // return address
    f.sp = sp;
#else
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack.data();
    f.ctx.uc_stack.ss_size = f.stack.size();
    f.ctx.uc_link = nullptr;
    const uintptr_t p = reinterpret_cast<uintptr_t>(&f);
    makecontext(&f.ctx, (void (*)())fiber_entry_ucontext, 2, (int)(p >> 32), (int)(p & 0xFFFFFFFFu));
#endif
}

// Waits in the scheduler until `released()`; each wait is one pass of the round robin.
template <typename F>
void wait_until(F && released) {
    while (!released()) switch_to_scheduler();
    ++g_block.progress;
}

}  // namespace

[[noreturn]] void fail(const char * what) {
    std::fprintf(stderr, "cuda_emu: %s (block %u,%u,%u thread %u,%u,%u)\n", what, g_block_idx.x, g_block_idx.y,
                 g_block_idx.z, g_current ? g_current->tid.x : 0u, g_current ? g_current->tid.y : 0u,
                 g_current ? g_current->tid.z : 0u);
    std::fflush(stderr);
    std::abort();
}

uint3 & thread_idx() {
    if (!g_current) fail("threadIdx outside a kernel");
    return g_current->tid;
}
uint3 & block_idx() { return g_block_idx; }
void set_dynamic_smem(size_t bytes) { g_dynamic_smem.assign(bytes, (unsigned char)0xFF); }
void * dynamic_smem() { return g_dynamic_smem.empty() ? nullptr : g_dynamic_smem.data(); }
dim3 & block_dim() { return g_block_dim; }
dim3 & grid_dim() { return g_grid_dim; }
int lane() {
    if (!g_current) fail("a warp intrinsic outside a kernel");
    return g_current->linear % kWarpSize;
}

constexpr unsigned char kCpAsyncPoison = 0x7B;  // 0x7B7B7B7B: 1.3e36 as a float

void cp_async_16(void * dst, const void * src) {
    if (!g_current) fail("cp.async outside a kernel");
    if ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15)
        fail("cp.async of 16 bytes, unaligned");
    // In flight, the destination holds nothing defined: poisoned at issue (a finite float, int8 123),
    // the data lands at the wait. So a read before the wait, or of a stage overwritten while its
    // old data is still needed (a copy issued too soon), computes something else.
    std::memset(dst, kCpAsyncPoison, 16);
    g_current->cp.open.push_back({dst, src});
}

void cp_async_commit() {
    if (!g_current) fail("cp.async outside a kernel");
    g_current->cp.commit();
}

void cp_async_wait(int n) {
    if (!g_current) fail("cp.async outside a kernel");
    g_current->cp.run_all_but(n, [](const Fiber::Copy & c) {
        std::memcpy(c.dst, c.src, 16);
        if (g_current->unfenced.insert(reinterpret_cast<uintptr_t>(c.dst)).second)
            ++g_block.unfenced[reinterpret_cast<uintptr_t>(c.dst)];
    });
}

void fence_proxy_async() {
    if (!g_current) fail("fence.proxy.async outside a kernel");
    for (uintptr_t chunk : g_current->unfenced) {
        auto it = g_block.unfenced.find(chunk);
        if (it != g_block.unfenced.end() && --it->second == 0)
            g_block.unfenced.erase(it);  // a bulk copy may have cleared it
    }
    g_current->unfenced.clear();
}

void syncthreads() {
    Block & b = g_block;
    const unsigned gen = b.gen;
    ++b.arrived;
    release_block_barrier_if_complete();
    wait_until([&] { return b.gen != gen; });
}

int syncthreads_or(int pred) {
    g_block.or_acc |= pred != 0;
    syncthreads();
    return g_block.or_result;
}

namespace {

unsigned warp_lanes_present(int warp) {
    const int n = (int)g_block.fibers.size();
    unsigned m = 0;
    for (int l = 0; l < kWarpSize && warp * kWarpSize + l < n; ++l) m |= 1u << l;
    return m;
}

void warp_barrier(unsigned mask) {
    const int w = g_current->linear / kWarpSize, l = g_current->linear % kWarpSize;
    WarpBarrier & wb = g_block.warps[w];
    mask &= warp_lanes_present(w);  // a partial last warp has no lanes past the block's end
    if (!((mask >> l) & 1u)) fail("a warp-collective call whose mask leaves out the calling lane");
    if (wb.arrived == 0) {
        wb.mask = mask;
    } else if (wb.mask != mask) {
        fail("lanes of one warp meet at a warp-collective call with different masks");
    }
    wb.arrived |= 1u << l;
    const unsigned gen = wb.gen;
    if (wb.arrived == wb.mask) {
        wb.arrived = 0;
        ++wb.gen;
        ++g_block.progress;
        return;
    }
    wait_until([&] { return wb.gen != gen; });
}

}  // namespace

void syncwarp(unsigned mask) { warp_barrier(mask); }

void warp_all_gather(unsigned mask, const void * mine, void * all, size_t bytes) {
    if (bytes > 64) fail("warp exchange of more than 64 bytes");
    const int w = g_current->linear / kWarpSize, l = g_current->linear % kWarpSize;
    WarpBarrier & wb = g_block.warps[w];
    std::memcpy(wb.data[l], mine, bytes);
    warp_barrier(mask);
    for (int s = 0; s < kWarpSize; ++s) {
        if ((mask >> s) & 1u) std::memcpy(static_cast<char *>(all) + s * bytes, wb.data[s], bytes);
    }
    warp_barrier(mask);  // nobody overwrites data[] before every lane has read it
}

void run_grid(dim3 grid, dim3 block, const std::function<void()> & body) {
    const int nthreads = (int)(block.x * block.y * block.z);
    if (nthreads <= 0 || nthreads > 1024) fail("a block of more than 1024 threads");
    Block & b = g_block;
    if ((int)b.fibers.size() != nthreads) {
        b.fibers.clear();
        b.fibers.resize(nthreads);
    }
    b.warps.assign((nthreads + kWarpSize - 1) / kWarpSize, WarpBarrier{});
    g_block_dim = block;
    g_grid_dim = grid;
    g_body = &body;
    for (unsigned bz = 0; bz < grid.z; ++bz) {
        for (unsigned by = 0; by < grid.y; ++by) {
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                g_block_idx = {bx, by, bz};
                std::fill(g_dynamic_smem.begin(), g_dynamic_smem.end(), (unsigned char)0xFF);
                b.unfenced.clear();
                b.mbarriers.clear();
                for (auto & nb : b.named) nb = NamedBarrier{};
                b.live = nthreads;
                b.arrived = 0;
                for (int i = 0; i < nthreads; ++i) {
                    Fiber & f = b.fibers[i];
                    f.linear = i;
                    f.tid = {(unsigned)i % block.x, ((unsigned)i / block.x) % block.y,
                             (unsigned)i / (block.x * block.y)};
                    start_fiber(f);
                }
                for (auto & w : b.warps) w.arrived = 0;
                while (b.live > 0) {
                    const uint64_t before = b.progress;
                    for (auto & f : b.fibers) {
                        if (!f.done) resume(f);
                    }
                    if (b.live > 0 && b.progress == before) {
                        fail("deadlock: some threads wait at a barrier that others never reach");
                    }
                }
            }
        }
    }
    g_body = nullptr;
}

// ---- tensor cores ----------------------------------------------------------------------------------
namespace {

int8_t byte_of(uint32_t w, int i) { return (int8_t)(w >> (8 * i)); }

}  // namespace

void mma_m16n8k32_s8(int (&c)[4], const int (&a)[4], const int (&b)[2]) {
    struct Frag {
        int a[4], b[2];
    } mine{{a[0], a[1], a[2], a[3]}, {b[0], b[1]}}, all[kWarpSize];
    warp_all_gather(0xffffffffu, &mine, all, sizeof(Frag));
    auto A = [&](int row, int k) {  // the lane and register holding A(row, k)
        const int g = row % 8, t = (k % 16) / 4, reg = (row >= 8 ? 1 : 0) + (k >= 16 ? 2 : 0);
        return (int)byte_of((uint32_t)all[4 * g + t].a[reg], k % 4);
    };
    auto B = [&](int k, int n) {
        const int t = (k % 16) / 4, reg = k >= 16 ? 1 : 0;
        return (int)byte_of((uint32_t)all[4 * n + t].b[reg], k % 4);
    };
    const int g = lane() / 4, t = lane() % 4;
    for (int i = 0; i < 4; ++i) {
        const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
        int s = 0;
        for (int k = 0; k < 32; ++k) s += A(row, k) * B(k, col);
        c[i] += s;
    }
}

void mma_m16n8k16_s8(int (&c)[4], const int (&a)[2], int b) {
    struct Frag {
        int a[2], b;
    } mine{{a[0], a[1]}, b}, all[kWarpSize];
    warp_all_gather(0xffffffffu, &mine, all, sizeof(Frag));
    const int g = lane() / 4, t = lane() % 4;
    for (int i = 0; i < 4; ++i) {
        const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
        int s = 0;
        for (int k = 0; k < 16; ++k) {
            const int av = byte_of((uint32_t)all[4 * (row % 8) + k / 4].a[row >= 8 ? 1 : 0], k % 4);
            const int bv = byte_of((uint32_t)all[4 * col + k / 4].b, k % 4);
            s += av * bv;
        }
        c[i] += s;
    }
}

void mma_m16n8k16_f16(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    struct Frag {
        uint32_t a[4], b[2];
    } mine{{a[0], a[1], a[2], a[3]}, {b[0], b[1]}}, all[kWarpSize];
    warp_all_gather(0xffffffffu, &mine, all, sizeof(Frag));
    auto half_of = [](uint32_t w, int hi) { return half_bits_to_float((uint16_t)(hi ? w >> 16 : w & 0xFFFFu)); };
    auto A = [&](int row, int k) {
        const int g = row % 8, t = (k % 8) / 2, reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
        return half_of(all[4 * g + t].a[reg], k & 1);
    };
    auto B = [&](int k, int n) {
        const int t = (k % 8) / 2, reg = k >= 8 ? 1 : 0;
        return half_of(all[4 * n + t].b[reg], k & 1);
    };
    const int g = lane() / 4, t = lane() % 4;
    for (int i = 0; i < 4; ++i) {
        const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
        double s = c[i];
        for (int k = 0; k < 16; ++k) s += (double)A(row, k) * (double)B(k, col);
        c[i] = (float)s;
    }
}

uint32_t shared_offset(const void * p) {
    const auto * c = static_cast<const unsigned char *>(p);
    const unsigned char * base = g_dynamic_smem.data();
    if (g_dynamic_smem.empty() || c < base || c >= base + g_dynamic_smem.size()) {
        fail("a shared-space address outside the launch's dynamic shared memory");
    }
    return (uint32_t)(c - base);
}

namespace {

// One wgmma as the tensor cores run it: every lane of the warp at once (a warp exchange).
void run_wgmma(const Fiber::Wgmma & op) {
    const bool f16 = op.df != nullptr;
    struct Frag {
        int a[4];
    } mine{f16 ? Frag{{(int)op.ah[0], (int)op.ah[1], (int)op.ah[2], (int)op.ah[3]}}
               : Frag{{op.a[0], op.a[1], op.a[2], op.a[3]}}},
        all[kWarpSize];
    warp_all_gather(0xffffffffu, &mine, all, sizeof(Frag));
    const uint64_t desc = op.desc;
    const size_t addr = (size_t)(desc & 0x3FFFu) << 4, lbo = (size_t)((desc >> 16) & 0x3FFFu) << 4,
                 sbo = (size_t)((desc >> 32) & 0x3FFFu) << 4;
    const unsigned char * smem = g_dynamic_smem.data();
    if (lane() == 0 && !g_block.unfenced.empty()) {  // B's 16-byte rows: each core matrix row, both K halves
        for (int col = 0; col < op.n; ++col) {
            for (int kh = 0; kh < 2; ++kh) {
                const size_t off = addr + (size_t)(col / 8) * sbo + (size_t)kh * lbo + (size_t)(col % 8) * 16;
                if (off < g_dynamic_smem.size() && g_block.unfenced.count(reinterpret_cast<uintptr_t>(smem + off)))
                    fail("wgmma read shared memory a cp.async wrote, with no fence.proxy.async after it");
            }
        }
    }
    auto B = [&](int k, int col) {  // core matrix (k / 16, col / 8), its row col % 8, byte k % 16
        const size_t off = addr + (size_t)(col / 8) * sbo + (size_t)(k / 16) * lbo + (size_t)(col % 8) * 16 + k % 16;
        if (off >= g_dynamic_smem.size()) fail("wgmma: B outside the dynamic shared memory");
        return (int)(int8_t)smem[off];
    };
    auto A = [&](int row, int k) {  // row of this warp's 16, as mma_m16n8k32_s8's A; unsigned bytes
        const int g = row % 8, t = (k % 16) / 4, reg = (row >= 8 ? 1 : 0) + (k >= 16 ? 2 : 0);
        return (int)(uint8_t)((uint32_t)all[4 * g + t].a[reg] >> (8 * (k % 4)));
    };
    const int g = lane() / 4, t = lane() % 4;
    if (f16) {  // k16: A in mma_m16n8k16_f16's layout, B's core matrices 8 halves of K a row
        auto half_at = [&](size_t off) {
            if (off + 1 >= g_dynamic_smem.size()) fail("wgmma: B outside the dynamic shared memory");
            return half_bits_to_float((uint16_t)(smem[off] | (smem[off + 1] << 8)));
        };
        auto Bh = [&](int k, int col) {
            return half_at(addr + (size_t)(col / 8) * sbo + (size_t)(k / 8) * lbo + (size_t)(col % 8) * 16 +
                           2 * (size_t)(k % 8));
        };
        auto Ah = [&](int row, int k) {
            const int gg = row % 8, tt = (k % 8) / 2, reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
            const uint32_t wv = (uint32_t)all[4 * gg + tt].a[reg];
            return half_bits_to_float((uint16_t)((k & 1) ? wv >> 16 : wv & 0xFFFFu));
        };
        for (int tile = 0; tile < op.n / 8; ++tile) {
            for (int i = 0; i < 4; ++i) {
                const int row = g + (i >= 2 ? 8 : 0), col = 8 * tile + 2 * t + (i & 1);
                double s = op.accumulate ? op.df[4 * tile + i] : 0.0;
                for (int k = 0; k < 16; ++k) s += (double)Ah(row, k) * (double)Bh(k, col);
                op.df[4 * tile + i] = (float)s;
            }
        }
        return;
    }
    for (int tile = 0; tile < op.n / 8; ++tile) {
        for (int i = 0; i < 4; ++i) {
            const int row = g + (i >= 2 ? 8 : 0), col = 8 * tile + 2 * t + (i & 1);
            int s = 0;
            for (int k = 0; k < 32; ++k) s += A(row, k) * B(k, col);
            op.d[4 * tile + i] = (op.accumulate ? op.d[4 * tile + i] : 0) + s;
        }
    }
}

}  // namespace

void wgmma_m64k32_u8s8(int n, int * d, const int (&a)[4], uint64_t desc, bool accumulate) {
    if (!g_current) fail("wgmma outside a kernel");
    if (n % 8 != 0 || n < 8 || n > 256) fail("wgmma: N must be a multiple of 8 up to 256");
    g_current->wg.open.push_back({n, d, a, desc, accumulate});
}

void wgmma_m64k16_f16(int n, float * d, const uint32_t (&a)[4], uint64_t desc, bool accumulate) {
    if (!g_current) fail("wgmma outside a kernel");
    if (n % 8 != 0 || n < 8 || n > 256) fail("wgmma: N must be a multiple of 8 up to 256");
    Fiber::Wgmma op{n, nullptr, nullptr, desc, accumulate};
    op.df = d;
    op.ah = a;
    g_current->wg.open.push_back(op);
}

namespace {

Mbarrier & mbarrier_at(uint64_t * bar) {
    if (!g_current) fail("an mbarrier outside a kernel");
    auto it = g_block.mbarriers.find(reinterpret_cast<uintptr_t>(bar));
    if (it == g_block.mbarriers.end()) fail("an mbarrier used before mbarrier.init");
    return it->second;
}

void mbarrier_complete_if_done(Mbarrier & m) {
    if (m.pending == 0 && m.tx == 0) {
        ++m.phases;
        m.pending = m.count;
        ++g_block.progress;
    }
}

}  // namespace

void mbarrier_init(uint64_t * bar, unsigned count) {
    if (!g_current) fail("an mbarrier outside a kernel");
    if (reinterpret_cast<uintptr_t>(bar) & 7) fail("an mbarrier not 8-byte aligned");
    if (count == 0) fail("mbarrier.init with a count of 0");
    Mbarrier & m = g_block.mbarriers[reinterpret_cast<uintptr_t>(bar)];
    m = Mbarrier{};
    m.count = m.pending = count;
    *bar = 0;
}

unsigned mbarrier_arrive(uint64_t * bar, unsigned tx_bytes) {
    Mbarrier & m = mbarrier_at(bar);
    if (m.pending == 0) fail("mbarrier: more arrivals in a phase than its count");
    const unsigned parity = (unsigned)(m.phases & 1);
    m.tx += tx_bytes;
    --m.pending;
    mbarrier_complete_if_done(m);
    return parity;
}

bool mbarrier_try_wait_parity(uint64_t * bar, unsigned parity) {
    Mbarrier & m = mbarrier_at(bar);
    auto done = [&] { return (unsigned)(m.phases & 1) != (parity & 1u); };
    // What is in flight lands one copy or arrival at a time, bulk copies first, and no more once the
    // phase waited for completes: the waiter sees as little landed as a GPU may show it, so a count
    // that leaves some copies out of a phase lets it read their poison.
    size_t landed = 0;
    for (; landed < m.copies.size() && !done(); ++landed) {
        const auto & c = m.copies[landed];
        std::memcpy(c.dst, c.src, c.bytes);
        if (!g_block.unfenced.empty()) {  // the async proxy wrote these bytes: no fence is owed for them
            for (unsigned o = 0; o < c.bytes; o += 16) g_block.unfenced.erase(reinterpret_cast<uintptr_t>(c.dst) + o);
        }
        m.tx -= c.bytes;
        mbarrier_complete_if_done(m);
    }
    m.copies.erase(m.copies.begin(), m.copies.begin() + (std::ptrdiff_t)landed);
    size_t arrived = 0;
    for (; arrived < m.async_arrivals.size() && !done(); ++arrived) {  // cp.async's: the copies, then the arrival
        for (const auto & c : m.async_arrivals[arrived]) {
            std::memcpy(c.dst, c.src, 16);
            ++g_block.unfenced[reinterpret_cast<uintptr_t>(c.dst)];  // nobody's to fence: no wgmma may read it
        }
        if (m.pending == 0) fail("mbarrier: more arrivals in a phase than its count (cp.async's)");
        --m.pending;
        mbarrier_complete_if_done(m);
    }
    m.async_arrivals.erase(m.async_arrivals.begin(), m.async_arrivals.begin() + (std::ptrdiff_t)arrived);
    if (landed + arrived > 0) ++g_block.progress;
    return done();
}

void mbarrier_wait_parity(uint64_t * bar, unsigned parity) {
    wait_until([&] { return mbarrier_try_wait_parity(bar, parity); });
}

void cp_async_bulk_g2s(void * dst, const void * src, unsigned bytes, uint64_t * bar) {
    Mbarrier & m = mbarrier_at(bar);
    if (bytes == 0 || bytes % 16 != 0) fail("cp.async.bulk: a size that is not a multiple of 16 bytes");
    if ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15)
        fail("cp.async.bulk: an address not 16-byte aligned");
    std::memset(dst, kCpAsyncPoison, bytes);  // in flight: nothing defined there until its barrier is tested
    m.copies.push_back({dst, src, bytes});
}

void cp_async_bulk_tensor_2d_g2s(void * dst, const char * base, int64_t row_bytes, int rows, int box_bytes,
                                 int box_rows, int x, int y, uint64_t * bar) {
    alignas(16) static const char zeros[256] = {};
    if (reinterpret_cast<uintptr_t>(dst) & 127)
        fail("cp.async.bulk.tensor: a shared-memory address not 128-byte aligned");
    if (box_bytes <= 0 || box_bytes > 256 || box_rows <= 0 || box_rows > 256)
        fail("cp.async.bulk.tensor: a box dimension outside 1..256");
    if (x < 0 || x + box_bytes > row_bytes) fail("cp.async.bulk.tensor: a box across a row's end (not modelled)");
    for (int r = 0; r < box_rows; ++r) {
        const int64_t row = (int64_t)y + r;
        const char * src = row >= 0 && row < rows ? base + row * row_bytes + x : zeros;
        cp_async_bulk_g2s(static_cast<char *>(dst) + (int64_t)r * box_bytes, src, (unsigned)box_bytes, bar);
    }
}

void cp_async_mbarrier_arrive_noinc(uint64_t * bar) {
    Mbarrier & m = mbarrier_at(bar);
    std::vector<Fiber::Copy> copies;
    auto take = [&](const Fiber::Copy & c) { copies.push_back(c); };
    g_current->cp.commit();
    g_current->cp.run_all_but(0, take);  // every copy the thread issued: they now complete on the barrier
    m.async_arrivals.push_back(std::move(copies));
}

namespace {

NamedBarrier & named_barrier(int id, int nthreads) {
    if (!g_current) fail("a named barrier outside a kernel");
    if (id < 1 || id >= kNamedBarriers) fail("a named barrier id outside 1..15");
    if (nthreads <= 0 || nthreads % kWarpSize != 0) fail("a named barrier count that is not a multiple of 32");
    NamedBarrier & nb = g_block.named[id];
    if (nb.arrived == 0) {
        nb.expected = nthreads;
    } else if (nb.expected != nthreads) {
        fail("threads meet at a named barrier with different counts");
    }
    return nb;
}

// One arrival; true when it completed the round (the barrier is released).
bool named_arrival(NamedBarrier & nb) {
    if (++nb.arrived < nb.expected) return false;
    nb.arrived = 0;
    ++nb.gen;
    ++g_block.progress;
    return true;
}

}  // namespace

void named_barrier_sync(int id, int nthreads) {
    NamedBarrier & nb = named_barrier(id, nthreads);
    const unsigned gen = nb.gen;
    if (named_arrival(nb)) return;
    wait_until([&] { return nb.gen != gen; });
}

void named_barrier_arrive(int id, int nthreads) { named_arrival(named_barrier(id, nthreads)); }

void wgmma_commit() {
    if (!g_current) fail("wgmma outside a kernel");
    g_current->wg.commit();
}

void wgmma_wait(int n) {
    if (!g_current) fail("wgmma outside a kernel");
    g_current->wg.run_all_but(n, run_wgmma);
}

}  // namespace cuda_emu

// ---- host API ----------------------------------------------------------------------------------------
struct cuda_emu_event {
    std::chrono::steady_clock::time_point t;
};

// `bytes` rounded up to 16 (256-byte aligned): the kernels may read whole aligned 16-byte chunks
// (cp.async) and words that hold a valid byte, which cannot fault on a GPU, but nothing past
// the chunk holding an allocation's last byte; AddressSanitizer reports what reads further, which
// a GPU's allocation granularity would hide.
cudaError_t cudaMalloc(void ** p, size_t bytes) {
    const size_t n = (bytes + 15) / 16 * 16;
    if (posix_memalign(p, 256, n ? n : 16) != 0) return cudaErrorMemoryAllocation;
    std::memset(*p, 0xFF, n);
    return cudaSuccess;
}
cudaError_t cudaFree(void * p) {
    std::free(p);
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void * dst, const void * src, size_t bytes, cudaMemcpyKind) {
    std::memmove(dst, src, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void * dst, const void * src, size_t bytes, cudaMemcpyKind k, cudaStream_t) {
    return cudaMemcpy(dst, src, bytes, k);
}
cudaError_t cudaMemset(void * p, int value, size_t bytes) {
    std::memset(p, value, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void * p, int value, size_t bytes, cudaStream_t) { return cudaMemset(p, value, bytes); }
cudaError_t cudaGetLastError() { return cudaSuccess; }
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
const char * cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "out of memory"; }
cudaError_t cudaEventCreate(cudaEvent_t * e) {
    *e = new cuda_emu_event;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
    e->t = std::chrono::steady_clock::now();
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float * ms, cudaEvent_t a, cudaEvent_t b) {
    *ms = std::chrono::duration<float, std::milli>(b->t - a->t).count();
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete e;
    return cudaSuccess;
}
