"""Kernels a step side by side: each kernel's share of the busy time in several kernel_profile.py
JSON files (`busy_us_per_step`: its time past the latest end before it, so overlapping kernels
under programmatic dependent launch are not counted twice), for one scenario.

    python3 tools/device/busy_compare.py --scenario forward16+captures A.json B.json [...]

Prints the step's busy time per file, then a row per kernel (the first file's order, then the
kernels only the later files have), in microseconds a step.
"""

from __future__ import annotations

import argparse
import json
import signal
from pathlib import Path


def _rows(path: Path, scenario: str) -> tuple[float, dict[str, dict[str, float]]]:
    rows = json.loads(path.read_text())["rows"]
    row = next((r for r in rows if r["scenario"] == scenario), None)
    if row is None:
        raise SystemExit(f"{path}: no scenario {scenario!r} (has {[r['scenario'] for r in rows]})")
    top = row["top"]
    if top and "busy_us_per_step" not in top[0]:
        raise SystemExit(f"{path}: no per-kernel busy time (kernel_profile.py before session 27)")
    return row["kernel_busy_ms_per_step"], {t["kernel"]: t for t in top}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="forward16+captures")
    ap.add_argument("--width", type=int, default=90, help="characters of a kernel's name")
    ap.add_argument("files", nargs="+", type=Path)
    a = ap.parse_args()
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the listing quietly
    tables = [_rows(f, a.scenario) for f in a.files]
    for f, (busy, _) in zip(a.files, tables, strict=True):
        print(f"{busy * 1000:9.0f} us busy  {f.name}")
    names: list[str] = []
    for _, kernels in tables:
        names += [n for n in kernels if n not in names]
    for n in names:
        cells = [kernels.get(n) for _, kernels in tables]
        busy = "".join(f"{c['busy_us_per_step']:9.0f}" if c else f"{'-':>9}" for c in cells)
        calls = next(c["per_step"] for c in cells if c)
        print(f"{busy} {calls:6.0f}x  {n[: a.width]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
