"""How long a parallel build's compile steps take with N jobs, from one build's per-object times.

Reads a .ninja_log (the seconds each object took) and the order Ninja starts them in (`ninja -n
-jN TARGET` of a fresh build folder: the objects in its listing's order), then replays them on N
workers: each object, in that order, on the worker that frees first (what Ninja does with equal
priorities). Prints the makespan and the objects that end last. `--time NAME=SECONDS` gives an
object the log lacks (or overrides it): e.g. a file measured alone before it was split.

  python3 tools/device/build_schedule.py BUILD/.ninja_log ORDER.txt --jobs 16 \\
      --time gemm_kquant_mma.cu.o=154

The log's times are its machine's (and its -j's); a ratio between two orders of one log is what
this tells, not the other machine's seconds.
"""

from __future__ import annotations

import argparse
import heapq
import re
from pathlib import Path


def key(path: str) -> str:
    """An object's name across checkouts: ggml_ext's from ggml_ext/ on, the others as they are."""
    return re.sub(r".*/(ggml_ext/)", r"\1", path)


def read_log(path: Path) -> dict[str, float]:
    """Seconds an output took, by key (the last record of each)."""
    times: dict[str, float] = {}
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) >= 4:
            times[key(fields[3])] = (int(fields[1]) - int(fields[0])) / 1000.0
    return times


def read_order(path: Path) -> list[str]:
    """The outputs of a `ninja -n` listing's "Building ... object X" lines, in order."""
    pat = re.compile(r"Building \S+ object (\S+)")
    return [key(m.group(1)) for m in map(pat.search, path.read_text().splitlines()) if m]


def makespan(durations: list[tuple[str, float]], jobs: int) -> tuple[float, list[tuple[float, str]]]:
    """List scheduling in order on `jobs` workers: the end of the last, and every (end, name)."""
    free = [0.0] * jobs
    heapq.heapify(free)
    ends = []
    for name, secs in durations:
        start = heapq.heappop(free)
        heapq.heappush(free, start + secs)
        ends.append((start + secs, name))
    return max(free), sorted(ends)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", type=Path)
    ap.add_argument("order", type=Path)
    ap.add_argument("--jobs", type=int, default=16)
    ap.add_argument("--time", action="append", default=[], help="NAME=SECONDS (a path ending)")
    ap.add_argument("--top", type=int, default=5)
    args = ap.parse_args()
    times = read_log(args.log)
    given = [(name, float(secs)) for name, secs in (spec.rsplit("=", 1) for spec in args.time)]
    order = []
    for o in read_order(args.order):
        secs = next((t for name, t in given if o.endswith(name)), times.get(o))
        if secs is not None:
            order.append((o, secs))
    total = sum(s for _, s in order)
    span, ends = makespan(order, args.jobs)
    print(f"{len(order)} objects, {total:.0f} s of compiles, -j{args.jobs}: {span:.0f} s", end="")
    print(f" (split evenly {total / args.jobs:.0f} s)")
    for end, name in ends[-args.top :]:
        print(f"  ends at {end:6.0f} s  {name.rsplit('/', 1)[-1]} ({dict(order)[name]:.0f} s)")


if __name__ == "__main__":
    main()
