"""A decode loop builds its verify and draft graphs once per shape and then reuses them: on CUDA,
ggml replays a graph it has seen as a CUDA graph, while a rebuilt one is captured anew. The
shapes of chain and DDTree steps do not depend on the position (the attention window is padded to
256 rows, the drafter's injected rows to whole blocks, a tree's structure is an input), so steps
at moving positions within one window must build nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash import _core

PAIR = Path(__file__).resolve().parents[1] / "dflash" / "data" / "pair"


def _built(target: _core.TargetEngine, draft: _core.DraftEngine) -> tuple[int, int]:
    return int(target.graph_shapes["forward_graphs_built"]), int(draft.graph_shape["graphs_built"])


@pytest.mark.parametrize("budget", [0, 16])
def test_speculative_steps_reuse_their_graphs(budget: int) -> None:
    cfg = _core.EngineConfig()
    cfg.n_ctx = 512
    cfg.n_verify_max = max(16, budget + 1)
    target = _core.TargetEngine(str(PAIR / "target-q8_0.gguf"), cfg)
    draft = _core.DraftEngine(str(PAIR / "drafter-q8_0.gguf"), target, _core.DraftEngineConfig())
    assert _built(target, draft) == (0, 0)
    # 32 prompt tokens + at most 16 a step: every step below stays within the first 256 rows
    session = _core.DecodeSession(target, draft, list(range(1, 33)), 200, 0.0, 0, 1.0, 0, [], budget=budget)
    session.step()  # the prompt (its own prefill graph)
    session.step()  # the first speculative step: the verify graph, a draft graph injecting the prompt
    session.step()  # later drafts inject 1..16 rows (padded to one block): their graph
    first = _built(target, draft)
    assert first == (2, 2)
    for _ in range(8):
        session.step()
    assert target.n_past < 256
    assert _built(target, draft) == first, "a step at a new position rebuilt a graph"
