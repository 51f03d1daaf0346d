"""Tensor encoders for synthetic GGUFs: f32 data -> ggml bytes, and random valid blocks.

Two ways to fill a quantised tensor:
- :func:`encode` quantises given f32 data (the same weights can then be written in any type);
  q8_0/q4_0/q5_0/q5_1/bf16 go through ``gguf.quants``, the K-quants through the small numpy
  encoders below (a plain min/max fit, not llama.cpp's iterative search).
- :func:`random_blocks` draws random codes and scales directly (no f32 data at all). It is
  the fast path for 27B-sized files.

Block layouts follow ``ggml/src/ggml-common.h`` (block_q4_K, block_q5_K, block_q6_K).
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

Q = GGMLQuantizationType
QK_K = 256

TYPE_NAMES: dict[str, Q] = {
    "f32": Q.F32,
    "f16": Q.F16,
    "bf16": Q.BF16,
    "q8_0": Q.Q8_0,
    "q4_0": Q.Q4_0,
    "q5_0": Q.Q5_0,
    "q5_1": Q.Q5_1,
    "q4_K": Q.Q4_K,
    "q5_K": Q.Q5_K,
    "q6_K": Q.Q6_K,
}
# What llama-quantize demotes a type to when a row length is not a multiple of its block.
_FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0}


def block_size(qtype: Q) -> int:
    return GGML_QUANT_SIZES[qtype][0]


def row_bytes(qtype: Q, n_cols: int) -> int:
    blk, size = GGML_QUANT_SIZES[qtype]
    return n_cols // blk * size


def fit_type(qtype: Q, n_cols: int) -> Q:
    """The type a row of ``n_cols`` values is stored in, following llama-quantize's fallback."""
    if n_cols % block_size(qtype) == 0:
        return qtype
    fallback = _FALLBACK.get(qtype, Q.F16)
    return fallback if n_cols % block_size(fallback) == 0 else Q.F16


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _f16_round(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


# --- packing (shared by the encoders and the random generator) ------------------------------


def _pack_scale_min_k4(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Eight 6-bit (scale, min) pairs per block -> the 12-byte layout read by get_scale_min_k4."""
    sc = sc.astype(np.uint8)
    mn = mn.astype(np.uint8)
    out = np.empty((sc.shape[0], 12), np.uint8)
    out[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = (mn[:, 0:4] & 63) | ((mn[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 0xF) | ((mn[:, 4:8] & 0xF) << 4)
    return out


def _pack_nibbles_k(q: np.ndarray) -> np.ndarray:
    """(nb, 256) codes -> 128 bytes: each 64-value chunk puts values l and l+32 in one byte."""
    q = q.reshape(-1, 4, 2, 32).astype(np.uint8)
    return ((q[:, :, 0] & 0xF) | ((q[:, :, 1] & 0xF) << 4)).reshape(-1, 128)


def pack_q4_k(d: np.ndarray, dmin: np.ndarray, sc: np.ndarray, mn: np.ndarray, q: np.ndarray) -> np.ndarray:
    return np.concatenate(
        [_f16_bytes(d), _f16_bytes(dmin), _pack_scale_min_k4(sc, mn), _pack_nibbles_k(q)], 1
    )


def pack_q5_k(d: np.ndarray, dmin: np.ndarray, sc: np.ndarray, mn: np.ndarray, q: np.ndarray) -> np.ndarray:
    hi = q.reshape(-1, 4, 2, 32).astype(np.uint8) >> 4  # chunk c, half h -> bit 2c+h of qh[l]
    shifts = (2 * np.arange(4)[:, None] + np.arange(2)[None, :]).astype(np.uint8)
    qh = (hi << shifts[None, :, :, None]).sum(axis=(1, 2), dtype=np.uint8)
    return np.concatenate(
        [_f16_bytes(d), _f16_bytes(dmin), _pack_scale_min_k4(sc, mn), qh, _pack_nibbles_k(q)], 1
    )


def pack_q6_k(d: np.ndarray, sc: np.ndarray, q: np.ndarray) -> np.ndarray:
    """q: unsigned codes 0..63 (value = d * sc * (q - 32)); sc: 16 int8 scales per block."""
    q = q.reshape(-1, 2, 4, 32).astype(np.uint8)  # half n, quarter k, lane l
    ql = np.concatenate(
        [(q[:, :, 0] & 0xF) | ((q[:, :, 2] & 0xF) << 4), (q[:, :, 1] & 0xF) | ((q[:, :, 3] & 0xF) << 4)], 2
    ).reshape(-1, 128)
    h = q >> 4
    qh = (h[:, :, 0] | (h[:, :, 1] << 2) | (h[:, :, 2] << 4) | (h[:, :, 3] << 6)).reshape(-1, 64)
    return np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8), _f16_bytes(d)], 1)


# --- encoding f32 data -------------------------------------------------------------------


def _encode_affine_k(x: np.ndarray, nmax: int) -> tuple[np.ndarray, ...]:
    """Per 32-value sub-block min/max fit with 6-bit scales and mins (q4_K: nmax 15, q5_K: 31)."""
    x = x.reshape(-1, 8, 32)
    lo = np.minimum(x.min(-1), 0.0)
    scale = (x.max(-1) - lo) / nmax
    d = _f16_round(scale.max(-1) / 63)
    dmin = _f16_round(-lo.min(-1) / 63)
    sc = np.clip(np.rint(np.divide(scale, d[:, None], out=np.zeros_like(scale), where=d[:, None] > 0)), 0, 63)
    mn = np.clip(
        np.rint(np.divide(-lo, dmin[:, None], out=np.zeros_like(lo), where=dmin[:, None] > 0)), 0, 63
    )
    step = (d[:, None] * sc)[..., None]
    off = (dmin[:, None] * mn)[..., None]
    q = np.divide(x + off, step, out=np.zeros_like(x), where=step > 0)
    return d, dmin, sc, mn, np.clip(np.rint(q), 0, nmax)


def _encode_q6_k(x: np.ndarray) -> np.ndarray:
    x = x.reshape(-1, 16, 16)
    scale = np.abs(x).max(-1) / 31
    d = _f16_round(scale.max(-1) / 127)
    sc = np.clip(
        np.rint(np.divide(scale, d[:, None], out=np.zeros_like(scale), where=d[:, None] > 0)), 0, 127
    )
    step = (d[:, None] * sc)[..., None]
    q = np.divide(x, step, out=np.zeros_like(x), where=step > 0)
    return pack_q6_k(d, sc, np.clip(np.rint(q), -32, 31) + 32)


def encode(x: np.ndarray, qtype: Q) -> np.ndarray:
    """Encode a 2-D f32 array row by row; returns f32/f16 arrays or uint8 (rows, row_bytes)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, cols = x.shape
    if qtype == Q.F32:
        return x
    if qtype == Q.F16:
        return x.astype(np.float16)
    if qtype in (Q.Q4_K, Q.Q5_K):
        nmax = 15 if qtype == Q.Q4_K else 31
        pack = pack_q4_k if qtype == Q.Q4_K else pack_q5_k
        return pack(*_encode_affine_k(x.reshape(-1, QK_K), nmax)).reshape(rows, -1)
    if qtype == Q.Q6_K:
        return _encode_q6_k(x.reshape(-1, QK_K)).reshape(rows, -1)
    return quants.quantize(x, qtype)


# --- random valid blocks -------------------------------------------------------------------


def _rand_u8(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return np.frombuffer(rng.bytes(int(np.prod(shape))), np.uint8).reshape(shape)


def _rms(values: range) -> float:
    return float(np.sqrt(np.mean(np.square(np.arange(values.start, values.stop, dtype=np.float64)))))


def random_blocks(rng: np.random.Generator, rows: int, cols: int, qtype: Q, std: float) -> np.ndarray:
    """Random codes with per-block scales chosen so values have mean ~0 and the given std.

    The whole block starts as random bytes (uniform codes), then the scale fields are
    overwritten; sub-block scales vary (as in real weights) to keep kernels' scale handling honest.
    """
    blk, size = GGML_QUANT_SIZES[qtype]
    nb = rows * cols // blk
    if qtype not in (Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q8_0, Q.Q4_0):
        # float and remaining block types: draw normal data and encode it
        return encode(rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(std), qtype)
    out = _rand_u8(rng, (nb, size)).copy()
    if qtype in (Q.Q4_K, Q.Q5_K):
        nmax = 15 if qtype == Q.Q4_K else 31
        sc = 32 | (_rand_u8(rng, (nb, 8)) & 31)  # 32..63
        # value = d*sc*q - dmin*sc; dmin = d*nmax/2 centres every sub-block on zero
        d = std / (np.sqrt(((nmax + 1) ** 2 - 1) / 12) * _rms(range(32, 64)))
        out[:, 0:2] = _f16_bytes(np.float32(d))[0]
        out[:, 2:4] = _f16_bytes(np.float32(d * nmax / 2))[0]
        out[:, 4:16] = _pack_scale_min_k4(sc, sc)
    elif qtype == Q.Q6_K:
        out[:, 192:208] = 64 | (out[:, 192:208] & 63)  # int8 scales 64..127
        out[:, 208:210] = _f16_bytes(np.float32(std / (np.sqrt((64**2 - 1) / 12) * _rms(range(64, 128)))))[0]
    else:  # q8_0: int8 codes (std 73.9); q4_0: nibbles - 8 (std 4.61)
        code_std = np.sqrt((256**2 - 1) / 12) if qtype == Q.Q8_0 else np.sqrt((16**2 - 1) / 12)
        out[:, 0:2] = _f16_bytes(np.float32(std / code_std))[0]
    return out.reshape(rows, -1)
