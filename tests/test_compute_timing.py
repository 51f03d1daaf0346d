"""_core.compute_timing(): the host time of the engine's graph computes, by kind, for the device
profiler (tools/device/kernel_profile.py). Counts are exact: one graph a draft, a verify and a
commit."""

from __future__ import annotations

from pathlib import Path

from dflash import _core

PAIR = Path(__file__).resolve().parents[1] / "dflash" / "data" / "pair"


def test_a_speculative_step_times_its_draft_verify_and_commit() -> None:
    cfg = _core.EngineConfig()
    cfg.n_ctx = 256
    target = _core.TargetEngine(str(PAIR / "target-q8_0.gguf"), cfg)
    draft = _core.DraftEngine(str(PAIR / "drafter-q8_0.gguf"), target, _core.DraftEngineConfig())
    session = _core.DecodeSession(target, draft, list(range(1, 33)), 32, 0.0, 0, 1.0, 0, [])
    session.step()  # the prompt
    _core.reset_compute_timing()
    assert _core.compute_timing() == {"launch_ms": 0.0, "wait_ms": 0.0, "sync_ms": 0.0, "graphs": 0}
    steps = 3
    for _ in range(steps):
        session.step()
    t = _core.compute_timing()
    assert t["graphs"] == 3 * steps  # a draft, a verify and a commit each
    assert t["launch_ms"] > 0 and t["sync_ms"] > 0 and t["wait_ms"] >= 0
