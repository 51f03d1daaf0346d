"""Thread-by-thread model of ggml_ext/kernels/gemm_kquant_mma_impl.cuh (gemm_q4_k_mma_kernel, A order
not paired) under the PTX m16n8k32 int8 fragment layout, against a dequantized reference: checks
the kernel's index logic (loads, k permutation, integer scales, epilogue) on a machine without a GPU.
Keep it in step with the kernel; the GPU check is tools/device/gemv_standalone.sh mma."""

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import quants

rng = np.random.default_rng(0)
rows, K, ncols = 16, 512, 16
nb = K // 256
raw = rng.integers(0, 256, (rows, nb, 144), dtype=np.uint8)
raw[:, :, 0:2] = np.frombuffer(np.float16(rng.uniform(0.01, 0.1, rows * nb)).tobytes(), np.uint8).reshape(
    rows, nb, 2
)
raw[:, :, 2:4] = np.frombuffer(np.float16(rng.uniform(0.01, 0.1, rows * nb)).tobytes(), np.uint8).reshape(
    rows, nb, 2
)
W = quants.dequantize(raw.reshape(rows, -1), Q.Q4_K).reshape(rows, K).astype(np.float64)
X = rng.standard_normal((ncols, K)).astype(np.float32)
# activation quantization per 256 (quantize_act_k_kernel)
yq = np.zeros((ncols, K), np.int8)
yd = np.zeros((ncols, nb), np.float32)
ys = np.zeros((ncols, K // 32), np.int64)
for j in range(ncols):
    for kb in range(nb):
        v = X[j, kb * 256 : (kb + 1) * 256]
        amax = np.abs(v).max()
        d = np.float32(amax / np.float32(127))
        q = np.round(v / d).astype(np.int8)
        yq[j, kb * 256 : (kb + 1) * 256] = q
        yd[j, kb] = d
        for s in range(8):
            ys[j, kb * 8 + s] = int(q[32 * s : 32 * s + 32].astype(int).sum())
ref = (yq.astype(np.float64) * np.repeat(yd, 256, axis=1)) @ W.T  # [ncols, rows]


def u32(b, off):
    return int.from_bytes(bytes(b[off : off + 4]), "little")


def bytes4(x):
    return np.frombuffer(int(x & 0xFFFFFFFF).to_bytes(4, "little"), np.int8).astype(np.int64)


def scale_min(s0, s1, s2, j):
    if j < 4:
        return (s0 >> (8 * j)) & 63, (s1 >> (8 * j)) & 63
    b = 8 * (j - 4)
    return ((s2 >> b) & 15) | (((s0 >> (b + 6)) & 3) << 4), ((s2 >> (b + 4)) & 15) | (
        ((s1 >> (b + 6)) & 3) << 4
    )


NT = ncols // 8
acc = np.zeros((32, NT, 4))
for kb in range(nb):
    # per thread: loads and scales
    regs = {}
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        r0, r1 = g, g + 8
        b0, b1 = raw[r0, kb], raw[r1, kb]
        h0 = [u32(b0, 4 * i) for i in range(4)]
        h1 = [u32(b1, 4 * i) for i in range(4)]
        q0 = [(u32(b0, 16 + 32 * c + 8 * t), u32(b0, 16 + 32 * c + 8 * t + 4)) for c in range(4)]
        q1 = [(u32(b1, 16 + 32 * c + 8 * t), u32(b1, 16 + 32 * c + 8 * t + 4)) for c in range(4)]
        sc0 = [scale_min(h0[1], h0[2], h0[3], j) for j in range(8)]
        sc1 = [scale_min(h1[1], h1[2], h1[3], j) for j in range(8)]
        dm0 = np.frombuffer(bytes(b0[0:4]), np.float16).astype(np.float64)
        dm1 = np.frombuffer(bytes(b1[0:4]), np.float16).astype(np.float64)
        regs[lane] = (q0, q1, sc0, sc1, dm0, dm1)
    for nt in range(NT):
        cs = np.zeros((32, 4), np.int64)
        for j in range(8):
            c, sh = j >> 1, 4 * (j & 1)
            A = np.zeros((16, 32), np.int64)
            B = np.zeros((32, 8), np.int64)
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                q0, q1 = regs[lane][0], regs[lane][1]
                lo0 = (q0[c][0] >> sh) & 0x0F0F0F0F
                hi0 = (q0[c][1] >> sh) & 0x0F0F0F0F
                lo1 = (q1[c][0] >> sh) & 0x0F0F0F0F
                hi1 = (q1[c][1] >> sh) & 0x0F0F0F0F
                a = [lo0, lo1, hi0, hi1]  # a_rows_paired = false
                A[g, 4 * t : 4 * t + 4] = bytes4(a[0])
                A[g + 8, 4 * t : 4 * t + 4] = bytes4(a[1])
                A[g, 16 + 4 * t : 16 + 4 * t + 4] = bytes4(a[2])
                A[g + 8, 16 + 4 * t : 16 + 4 * t + 4] = bytes4(a[3])
                col = nt * 8 + g
                yb = yq[col, kb * 256 + 32 * j + 8 * t : kb * 256 + 32 * j + 8 * t + 8]
                B[4 * t : 4 * t + 4, g] = yb[0:4]
                B[16 + 4 * t : 16 + 4 * t + 4, g] = yb[4:8]
            C = A @ B
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                sc0, sc1 = regs[lane][2], regs[lane][3]
                cj = [C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t], C[g + 8, 2 * t + 1]]
                cs[lane] += [sc0[j][0] * cj[0], sc0[j][0] * cj[1], sc1[j][0] * cj[2], sc1[j][0] * cj[3]]
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            sc0, sc1, dm0, dm1 = regs[lane][2:]
            col0 = nt * 8 + 2 * t
            sa = ys[col0, kb * 8 : kb * 8 + 8]
            sb = ys[col0 + 1, kb * 8 : kb * 8 + 8]
            m00 = sum(sc0[j][1] * sa[j] for j in range(8))
            m01 = sum(sc0[j][1] * sb[j] for j in range(8))
            m10 = sum(sc1[j][1] * sa[j] for j in range(8))
            m11 = sum(sc1[j][1] * sb[j] for j in range(8))
            dya, dyb = yd[col0, kb], yd[col0 + 1, kb]
            acc[lane, nt] += [
                dya * (dm0[0] * cs[lane, 0] - dm0[1] * m00),
                dyb * (dm0[0] * cs[lane, 1] - dm0[1] * m01),
                dya * (dm1[0] * cs[lane, 2] - dm1[1] * m10),
                dyb * (dm1[0] * cs[lane, 3] - dm1[1] * m11),
            ]
out = np.zeros((ncols, rows))
for lane in range(32):
    g, t = lane >> 2, lane & 3
    for nt in range(NT):
        for i in range(4):
            row = g if i < 2 else g + 8
            col = nt * 8 + 2 * t + (i & 1)
            out[col, row] = acc[lane, nt, i]
err = np.abs(out - ref).max() / np.abs(ref).max()
print("max rel err", err)
assert err < 1e-9, "the model of the kernel disagrees with the reference"
