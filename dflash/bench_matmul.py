"""`dflash bench --matmul`: one weight matrix times N activation columns, three ways: `ggml`,
ggml's own kernels (mul_mat_vec_q for N <= 8, mul_mat_q above); `dflash`, what the engine runs
(ggml_ext's GEMV for Q4_K / Q6_K up to 8 columns, mmq with ggml_ext's launch policy above:
ggml_ext::mul_mat_tiles); `invariant`, ggml_ext's column-invariant matmul
(ggml_ext/BATCH_INVARIANCE.md); the 27B's largest shapes and the packaged tiny pair's FFN by
default. Median ms per product over `--reps` computes of a graph of 8 products (distinct copies
of the weights, so none is served from L2), effective weight bandwidth, JSON under bench/results/."""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from typing import Any

from dflash.bench import _git_commit, _machine, write_result

# (name, rows, k, type): Qwen3.6-27B's FFN up/gate and down, Q4_K_M's types for them
BITS_PER_WEIGHT = {"q4_0": 4.5, "q4_K": 4.5, "q5_K": 5.5, "q6_K": 6.5625, "q8_0": 8.5}
DEFAULT_SHAPES = (
    "ffn_up:17408:5120:q4_K,ffn_down:5120:17408:q6_K,attn_q:12288:5120:q4_K,gdn_qkv:10240:5120:q4_K,"
    "attn_k:1024:5120:q4_K,pair_up:1024:512:q8_0,pair_down:512:1024:q8_0"
)
VARIANTS = ("ggml", "dflash", "invariant")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="dflash bench --matmul", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="name:rows:k:type,...")
    ap.add_argument("--columns", default="1,2,4,8,16,32,64", help="N values")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("-ngl", "--n-gpu-layers", type=int, default=-1, help="0: CPU")
    ap.add_argument("-o", "--out", default=None)
    a = ap.parse_args(argv)
    from dflash import _core

    gpu = a.n_gpu_layers != 0 and _core.gpu_backend_available()
    rows_out: list[dict[str, Any]] = []
    head = f"{'shape':>10} {'N':>3} " + " ".join(f"{v + ' ms':>9}" for v in VARIANTS)
    head += " " + " ".join(f"{v + ' GB/s':>10}" for v in VARIANTS)
    print(head, flush=True)
    ns = [int(x) for x in a.columns.split(",")]
    for spec in a.shapes.split(","):
        name, rows, k, wtype = spec.split(":")
        rows_i, k_i = int(rows), int(k)
        timings = _core.time_mul_mat(wtype, rows_i, k_i, ns, gpu, a.reps)
        gb = rows_i * k_i * BITS_PER_WEIGHT.get(wtype, 8.0) / 8 / 1e6  # weight bytes / 1e6: ms -> GB/s
        for n, (ggml_ms, invariant_ms, dflash_ms) in zip(ns, timings, strict=True):
            samples = {"ggml": ggml_ms, "dflash": dflash_ms, "invariant": invariant_ms}
            med = {v: statistics.median(samples[v]) for v in VARIANTS}
            row: dict[str, Any] = {"shape": name, "rows": rows_i, "k": k_i, "type": wtype, "n": n}
            for v in VARIANTS:
                row[f"{v}_ms"] = samples[v]
                row[f"{v}_ms_median"] = med[v]
            rows_out.append(row)
            line = f"{name:>10} {n:3d} " + " ".join(f"{med[v]:9.4f}" for v in VARIANTS)
            print(line + " " + " ".join(f"{gb / med[v]:10.0f}" for v in VARIANTS), flush=True)
    doc = {
        "command": "dflash bench --matmul " + shlex.join(argv),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": _git_commit(),
        "machine": _machine(),
        "backend": "gpu" if gpu else "cpu",
        "note": "ggml = ggml's kernels (ggml_ext's GEMV off); dflash = the engine's (GEMV for Q4_K/Q6_K "
        "<= 8 columns, mmq launched by ggml_ext::mul_mat_tiles above); invariant = "
        "ggml_ext::mul_mat_invariant; on the CPU all run ggml's kernels",
        "results": rows_out,
    }
    write_result(doc, a.out, f"matmul-{int(time.time())}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
