"""Summarise the tensor-core GEMM's standalone JSON lines (tools/device/gemv_standalone.cu mma):
failed checks, then per shape and column count the time of each variant code (see run_mma)."""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def main(path: str) -> None:
    rows = [json.loads(line) for line in open(path) if line.startswith("{")]
    checks = [r for r in rows if "check_mma" in r]
    bad = [r for r in checks if not r.get("ok")]
    print(f"{len(checks)} checks, {len(bad)} failed")
    for r in bad[:20]:
        print("  FAILED", r)
    table: dict[tuple[str, str, int], dict[int, float]] = defaultdict(dict)
    for r in rows:
        if "bench_mma" in r:
            table[(r["bench_mma"], r["type"], r["n"])][r["stages"]] = r["us"]
    codes = sorted({c for v in table.values() for c in v})
    print(f"{'shape':>9} {'type':>5} {'n':>3} " + " ".join(f"{c:>7}" for c in codes))
    for (name, t, n), v in sorted(table.items()):
        print(f"{name:>9} {t:>5} {n:>3} " + " ".join(f"{v.get(c, float('nan')):7.1f}" for c in codes))


if __name__ == "__main__":
    main(sys.argv[1])
