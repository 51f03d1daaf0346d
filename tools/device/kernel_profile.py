"""Kernels per step on the GPU (issue 7: "kernels per decode token and per verify").

PyTorch's profiler (CUPTI) records every CUDA kernel the process launches, ours included: the
engine runs in the same process. For each scenario - an autoregressive step, a drafter block
(chain: argmax only; DDTree: with top-K), a plain forward of N tokens with the drafter's captures
(what a verify costs), a chain step and a DDTree step (draft + verify + commit) - it reports per
step: kernels launched, the sum of their device times, memcpys, the wall time without the profiler,
and the kernels that take the most time. Wall time well above the kernel sum means launch/host
overhead, split by _core.compute_timing() into launches, waits for the device, synchronous commits
and the rest (graph preparation, the loop); the top kernels say which kernels to write.

Runs on the GPU machine only (needs torch with CUDA):
    python3 tools/device/kernel_profile.py -m T.gguf --draft D.gguf -o $OUT/kernels.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from busy_time import busy_shares, launch_shares  # tools/device, the script's folder
from torch.profiler import ProfilerActivity, profile

from dflash import _core
from dflash.bench import _git_commit, _machine


def _kernel_table(prof: Any, steps: int) -> dict[str, Any]:
    per_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    runtime: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])  # CUDA runtime calls (host side)
    n_kernels = n_copies = 0
    kernel_us = copy_us = 0.0
    spans: list[tuple[float, float, str]] = []  # the kernels' device intervals (us)
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            if e.name.startswith("cuda"):
                runtime[e.name][0] += 1
                runtime[e.name][1] += e.time_range.elapsed_us()
            continue
        us = e.time_range.elapsed_us()
        if e.name.startswith(("Memcpy", "Memset")):
            n_copies += 1
            copy_us += us
            continue
        n_kernels += 1
        kernel_us += us
        spans.append((e.time_range.start, e.time_range.end, e.name))
        per_name[e.name][0] += 1
        per_name[e.name][1] += us
    # the time some kernel runs, and each kernel's share of it (busy_time.py: with programmatic
    # dependent launch, ours and ggml-cuda's, a kernel's interval includes its wait)
    busy_us, busy_by_name = busy_shares(spans)
    top = sorted(per_name.items(), key=lambda kv: -busy_by_name.get(kv[0], 0.0))[:25]
    return {
        "kernels_per_step": n_kernels / steps,
        "kernel_ms_per_step": kernel_us / steps / 1000,
        "kernel_busy_ms_per_step": busy_us / steps / 1000,
        "copies_per_step": n_copies / steps,
        "copy_ms_per_step": copy_us / steps / 1000,
        "top": [
            {
                "kernel": name[:160],
                "per_step": c / steps,
                "us_per_step": us / steps,
                "busy_us_per_step": busy_by_name.get(name, 0.0) / steps,
            }
            for name, (c, us) in top
        ],
        # which calls the host makes a step (a replayed CUDA graph is one cudaGraphLaunch; direct
        # launches are cudaLaunchKernel each; input uploads cudaMemcpyAsync + a synchronisation)
        "runtime_calls": {
            name: {"per_step": c / steps, "us_per_step": us / steps}
            for name, (c, us) in sorted(runtime.items(), key=lambda kv: -kv[1][1])
        },
    }


def _launches(prof: Any, per_step: int) -> list[list[Any]]:
    """The last step's kernels in launch order: [name, grid, block, us, busy us], busy being the
    time past the latest end before it (busy_time.py's share). The chrome trace carries the grid,
    which tells a launch's matrix apart from others of the same kernel."""
    try:
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            prof.export_chrome_trace(f.name)
            trace = json.load(open(f.name))
    except Exception as err:  # the profile's tables stand without the listing
        print(f"no launch listing: {err}", flush=True)
        return []
    ks = sorted((e for e in trace.get("traceEvents", []) if e.get("cat") == "kernel"), key=lambda e: e["ts"])[
        -per_step:
    ]
    spans = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)), str(i)) for i, e in enumerate(ks)]
    out = []
    for a, b, i, share in launch_shares(spans):
        e = ks[int(i)]
        args = e.get("args", {})
        out.append([e["name"][:90], args.get("grid"), args.get("block"), round(b - a, 2), round(share, 2)])
    return out


def _measure(
    name: str, setup: Callable[[], Callable[[], None]], steps: int, launches: bool = False
) -> dict[str, Any]:
    """setup() prepares a state and returns one step; each step is timed bare, then profiled
    (launches: the last step's kernels one by one too, _launches)."""
    step = setup()
    for _ in range(3):
        step()  # warm: graphs built, CUDA graphs captured
    _core.reset_compute_timing()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    wall = (time.perf_counter() - t0) * 1000 / steps
    # host time by kind (backend.h's ComputeTiming); the rest of the wall time is graph
    # preparation (inputs, masks) and the loop's own work
    host = {k: v / steps for k, v in _core.compute_timing().items()}
    host["other_ms"] = wall - host["launch_ms"] - host["wait_ms"] - host["sync_ms"]
    step = setup()
    for _ in range(3):
        step()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    row = {"scenario": name, "steps": steps, "wall_ms_per_step": wall, "host_per_step": host}
    row.update(_kernel_table(prof, steps))
    if launches:
        row["launches"] = _launches(prof, round(row["kernels_per_step"]))
    print(
        f"{name:>18}: wall {wall:7.3f} ms  kernels {row['kernels_per_step']:7.1f}  kernel time "
        f"{row['kernel_ms_per_step']:7.3f} ms (busy {row['kernel_busy_ms_per_step']:7.3f})  "
        f"copies {row['copies_per_step']:5.1f}  host: launch "
        f"{host['launch_ms']:.3f} wait {host['wait_ms']:.3f} sync {host['sync_ms']:.3f} "
        f"other {host['other_ms']:.3f} ms ({host['graphs']:.1f} graphs)",
        flush=True,
    )
    calls = "  ".join(
        f"{n} {c['per_step']:.1f}x {c['us_per_step']:.0f}us" for n, c in row["runtime_calls"].items()
    )
    print(f"{'':>20}host calls: {calls or '(none recorded)'}", flush=True)
    for t in row["top"][:10]:
        print(
            f"{'':>20}{t['busy_us_per_step']:9.1f} us busy ({t['us_per_step']:9.1f}) {t['per_step']:6.1f}x  "
            f"{t['kernel'][:90]}",
            flush=True,
        )
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--label", default="", help="name of the pair in the output")
    ap.add_argument("--forwards", default="16,32,64", help="forward sizes N to profile")
    ap.add_argument("--budgets", default="32", help="DDTree budgets of the tree scenarios")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--synthetic-accept", type=int, default=8, help="forced acceptance length (bench-only)")
    ap.add_argument("-c", "--n-ctx", type=int, default=4096)
    ap.add_argument("--batch-invariant", action="store_true")
    ap.add_argument("--quick", action="store_true", help="the AR step and the forwards only")
    ap.add_argument("--launches", action="store_true", help="list the last step's kernels one by one")
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()

    ns = [int(x) for x in a.forwards.split(",") if x]
    cfg = _core.EngineConfig()
    cfg.n_ctx, cfg.n_gpu_layers = a.n_ctx, 99
    budgets = [int(x) for x in a.budgets.split(",") if x]
    cfg.n_verify_max = max(max(ns), max(budgets) + 1, 16)
    cfg.n_logits_batch = max(cfg.n_logits_batch, cfg.n_verify_max)
    cfg.batch_invariant = a.batch_invariant
    target = _core.TargetEngine(a.model, cfg)
    draft = _core.DraftEngine(a.draft, target, _core.DraftEngineConfig())
    layers = [int(x) for x in draft.hparams["target_layers"]]
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, int(target.hparams["n_vocab"]), size=128).tolist()
    toks = rng.integers(0, int(target.hparams["n_vocab"]), size=max(ns)).tolist()

    def ar() -> Callable[[], None]:
        target.reset()
        target.time_forward(prompt, False, [])
        return lambda: target.time_forward(prompt[-1:], False, [])

    def forward(n: int) -> Callable[[], Callable[[], None]]:
        def setup() -> Callable[[], None]:
            def step() -> None:
                target.reset()
                target.time_forward(toks[:n], True, layers)

            return step

        return setup

    def session(budget: int) -> Callable[[], Callable[[], None]]:
        def setup() -> Callable[[], None]:
            n_max = a.n_ctx - len(prompt) - 2 * cfg.n_verify_max
            s = _core.DecodeSession(
                target, draft, prompt, n_max, 0.0, 0, 1.0, 0, [], budget=budget,
                forced_accept=a.synthetic_accept - 1,
            )  # fmt: skip
            s.step()  # prefill
            return lambda: s.step()

        return setup

    def drafting(top_k: bool) -> Callable[[], Callable[[], None]]:
        def setup() -> Callable[[], None]:
            s = _core.DecodeSession(target, draft, prompt, 64, 0.0, 0, 1.0, 0, [])
            s.step()  # prefill: the drafter's context holds the prompt
            return lambda: draft.draft(prompt[-1], len(prompt), False, top_k)

        return setup

    steps = a.steps
    rows = [_measure("ar", ar, steps * 4, a.launches)]
    # the drafter alone: a block at the same position (chain: argmax only; DDTree: + top-K)
    if not a.quick:
        rows.append(_measure("draft_chain", drafting(False), steps))
        rows.append(_measure("draft_tree", drafting(True), steps))
    rows += [_measure(f"forward{n}+captures", forward(n), steps, a.launches) for n in ns]
    if not a.quick:
        rows.append(_measure("chain_step", session(0), steps))
        rows += [_measure(f"ddtree_b{b}_step", session(b), steps) for b in budgets]
    doc = {
        "bench": "kernel_profile",
        "command": "python3 tools/device/kernel_profile.py " + " ".join(sys.argv[1:]),
        # the switches of this run (DFLASH_PDL, DFLASH_FUSE_*, ...): the command line alone does not say
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("DFLASH_")},
        "machine": _machine(),
        "commit": _git_commit(),
        "label": a.label,
        "model": a.model,
        "draft": a.draft,
        "synthetic_accept": a.synthetic_accept,
        "batch_invariant": a.batch_invariant,
        "graph_shapes": {"target": target.graph_shapes, "draft": draft.graph_shape},
        "rows": rows,
    }
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
