#!/usr/bin/env python3
"""The hot loop of each tensor-core kernel in a `cuobjdump -sass` listing: its instruction count
and mix, a CPU-side measure of what a warp issues per trip (for the GEMMs, one or two
super-blocks). On the H200 the GEMMs ran at 2-3 warps a scheduler with under one eligible (ncu,
session 26), so the instructions between a stage's barrier and its first tensor-core product, and
the count a trip, bound how soon the tensor cores start and how fast a warp can go.

    cuobjdump -sass kernels.cubin > k.sass
    python3 tools/device/sass_loops.py k.sass [regex] [--before old.sass]

A loop is a backward branch whose body holds a tensor-core instruction (IGMMA, HGMMA, IMMA, HMMA);
the longest one a kernel is reported. With --before, each kernel's trip is compared with the same
kernel in an older listing. `--json` prints one object a kernel.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_BRANCH = re.compile(r"\bBRA\s+(?:\S+\s+)?0x([0-9a-f]+)")
_PRED = re.compile(r"^@!?U?P\w+\s+")
TENSOR_OPS = ("IGMMA", "HGMMA", "IMMA", "HMMA")


@dataclass
class Loop:
    kernel: str
    length: int = 0
    tensor_ops: int = 0
    # instructions from the loop's first barrier (BAR.SYNC) to its first tensor-core op
    barrier_to_tensor: int | None = None
    mix: Counter = field(default_factory=Counter)


def opcode(text: str) -> str:
    return _PRED.sub("", text).split()[0].split(".")[0]


def kernels(listing: str) -> dict[str, list[tuple[int, str]]]:
    """Each function's instructions (address, text), by mangled name."""
    out: dict[str, list[tuple[int, str]]] = {}
    for chunk in re.split(r"(?:^|\n)\s*Function : ", listing)[1:]:
        name = chunk.split("\n", 1)[0].strip()
        out[name] = [(int(m.group(1), 16), m.group(2)) for m in map(_INSTR.match, chunk.split("\n")) if m]
    return out


def hot_loop(name: str, instrs: list[tuple[int, str]]) -> Loop | None:
    best: Loop | None = None
    for addr, text in instrs:
        m = _BRANCH.search(text)
        if not m or int(m.group(1), 16) >= addr:
            continue
        start = int(m.group(1), 16)
        body = [t for a, t in instrs if start <= a <= addr]
        ops = [opcode(t) for t in body]
        n_tensor = sum(op in TENSOR_OPS for op in ops)
        if not n_tensor or (best and len(body) <= best.length):
            continue
        loop = Loop(name, len(body), n_tensor, mix=Counter(ops))
        bar = next((i for i, op in enumerate(ops) if op == "BAR"), None)
        if bar is not None:
            first = next((i for i in range(bar, len(ops)) if ops[i] in TENSOR_OPS), None)
            loop.barrier_to_tensor = None if first is None else first - bar
        best = loop
    return best


def loops(listing: str, pattern: str) -> dict[str, Loop]:
    rx = re.compile(pattern)
    found = {}
    for name, instrs in kernels(listing).items():
        if rx.search(name):
            loop = hot_loop(name, instrs)
            if loop:
                found[name] = loop
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sass", type=Path)
    ap.add_argument("pattern", nargs="?", default="gemm")
    ap.add_argument("--before", type=Path, help="an older listing to compare each kernel's trip with")
    ap.add_argument("--top", type=int, default=8, help="instruction classes shown")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    now = loops(args.sass.read_text(), args.pattern)
    before = loops(args.before.read_text(), args.pattern) if args.before else {}
    for name, loop in now.items():
        old = before.get(name)
        if args.json:
            row = {
                "kernel": name,
                "instructions": loop.length,
                "tensor_ops": loop.tensor_ops,
                "barrier_to_tensor": loop.barrier_to_tensor,
                "mix": dict(loop.mix.most_common(args.top)),
            }
            if old:
                row["instructions_before"] = old.length
                row["barrier_to_tensor_before"] = old.barrier_to_tensor
            print(json.dumps(row))
            continue
        was = f" (was {old.length}, {old.barrier_to_tensor} to the first)" if old else ""
        mix = " ".join(f"{op}:{n}" for op, n in loop.mix.most_common(args.top))
        head = f"{loop.length:5d} instr, {loop.tensor_ops:3d} tensor, {loop.barrier_to_tensor}"
        print(f"{head} from the barrier to the first{was}  {name}\n      {mix}")
    if not now:
        print(f"no tensor-core loop in a kernel matching {args.pattern!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
