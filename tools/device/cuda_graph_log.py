"""GPU diagnostic: what ggml-cuda decides about CUDA graphs during speculative steps. Runs a few
chain (or DDTree) steps of a pair with ggml's debug log on and counts its CUDA-graph messages per
step: a step whose graphs replay logs "CUDA Graph id N reused" once a graph, one that re-captures
logs warmup or update lines (session 15's run matched "graph" in lower case only and so printed
nothing for replays; session 16's kernel_profile.py counts the CUDA runtime calls instead: the
pair's three graphs a step are replayed, cudaGraphLaunch 2.9 a step, and the host's share is the
scheduler's input uploads: 28 stream synchronisations and 15 copies a chain step). On the CPU no
graph is rebuilt between steps (tests/test_graph_reuse.py).

    python3 tools/device/cuda_graph_log.py -m TARGET --draft DRAFTER [--budget 0] [--steps 6]
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import tempfile

from dflash import _core


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--budget", type=int, default=0, help="0: chain; > 0: DDTree budget")
    ap.add_argument("--steps", type=int, default=6)
    a = ap.parse_args()

    cfg = _core.EngineConfig()
    cfg.n_ctx, cfg.n_gpu_layers = 1024, 99
    cfg.n_verify_max = max(16, a.budget + 1)
    target = _core.TargetEngine(a.model, cfg)
    draft = _core.DraftEngine(a.draft, target, _core.DraftEngineConfig())
    session = _core.DecodeSession(target, draft, list(range(1, 33)), 256, 0.0, 0, 1.0, 0, [], budget=a.budget)
    session.step()  # the prompt
    session.step()  # the first step builds this loop's graphs
    session.step()

    # ggml writes its log to stderr (fd 2): capture it per step
    per_step = []
    _core.set_log_verbosity(True)
    for _ in range(a.steps):
        with tempfile.TemporaryFile(mode="w+b") as f:
            saved = os.dup(2)
            os.dup2(f.fileno(), 2)
            try:
                session.step()
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            f.seek(0)
            text = f.read().decode(errors="replace")
        # ggml-cuda logs "CUDA Graph id N reused" on a replay: match "graph" in any case
        lines = [re.sub(r"\d+", "N", line.strip()) for line in text.splitlines() if "graph" in line.lower()]
        kinds = collections.Counter(lines)
        per_step.append(kinds)
    _core.set_log_verbosity(False)
    for i, kinds in enumerate(per_step):
        said = "; ".join(f"{n} x {k}" for k, n in kinds.most_common())
        print(f"step {i}: {said or 'no CUDA-graph messages'}")
    print("graphs built:", target.graph_shapes["forward_graphs_built"], draft.graph_shape["graphs_built"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
