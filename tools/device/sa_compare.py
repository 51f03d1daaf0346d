"""Compare builds of the GEMM standalone (tools/device/gemv_standalone.cu): the JSON lines of each
build's runs side by side, a column a file (sa-NAME-MODE.jsonl), per shape, type, column count and
variant code; failed checks first."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path


def main(paths: list[str]) -> None:
    table: dict[tuple[str, str, int, int], dict[str, float]] = defaultdict(dict)
    builds: list[str] = []
    for p in paths:
        mode_build = Path(p).stem.removeprefix("sa-")
        build = mode_build.rsplit("-", 1)[0]
        if build not in builds:
            builds.append(build)
        for line in open(p):
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            if any(k.startswith("check") for k in r) and not r.get("ok", True):
                print("FAILED", build, r)
            if "bench_mma" in r:
                table[(r["bench_mma"], r["type"], r["n"], r["stages"])][build] = r["us"]
    print(f"{'shape':>12} {'type':>5} {'n':>3} {'code':>9} " + " ".join(f"{b:>9}" for b in builds))
    for (name, t, n, code), v in sorted(table.items()):
        times = " ".join(f"{v.get(b, float('nan')):9.1f}" for b in builds)
        print(f"{name:>12} {t:>5} {n:>3} {code:>9} {times}")


if __name__ == "__main__":
    main(sys.argv[1:])
