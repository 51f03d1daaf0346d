"""Launches of a kernel_profile.py --launches JSON grouped by kernel and grid: count, mean time
and mean busy share a launch (busy_time.py's), sorted by busy time, for each scenario. A kernel's
grid tells its matrices apart (a GEMM's row tiles), which the per-name table cannot.

    python3 tools/device/launch_table.py bench/results/X.json[.gz] [--scenario forward16] [--top 30]
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from collections import defaultdict
from typing import Any


def short(name: str) -> str:
    """A kernel's name without its return type, namespaces and argument list."""
    name = re.sub(r"^void |\(anonymous namespace\)::", "", name)
    name = re.sub(r"\(.*$", "", name) if "<" not in name.split("(")[0] else name.split(">(")[0] + ">"
    return re.sub(r"\w+::", "", name)


def table(launches: list[list[Any]]) -> list[dict[str, Any]]:
    """[name, grid, block, us, busy] rows -> one row a (kernel, grid): n, us and busy a launch."""
    groups: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for name, grid, _block, us, busy in launches:
        g = groups[(short(name), "x".join(str(v) for v in grid) if grid else "?")]
        g[0] += 1
        g[1] += us
        g[2] += busy
    rows = [
        {"kernel": k, "grid": grid, "n": int(n), "us": us / n, "busy": busy / n, "busy_total": busy}
        for (k, grid), (n, us, busy) in groups.items()
    ]
    return sorted(rows, key=lambda r: -r["busy_total"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json")
    ap.add_argument("--scenario", default="", help="a prefix of the scenarios to list (all by default)")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    doc = json.load(gzip.open(a.json) if a.json.endswith(".gz") else open(a.json))
    for row in doc["rows"]:
        if "launches" not in row or not row["scenario"].startswith(a.scenario):
            continue
        busy = sum(r[4] for r in row["launches"])
        print(f"== {row['scenario']}: {len(row['launches'])} launches, {busy:.1f} us busy")
        for r in table(row["launches"])[: a.top]:
            print(
                f"  {r['n']:4d} x {r['us']:7.2f} us (busy {r['busy']:6.2f}, {r['busy_total']:7.1f})  "
                f"grid {r['grid']:>12}  {r['kernel'][:100]}"
            )


if __name__ == "__main__":
    main()
