"""_core.compute_timing(): the host time of the engine's graph computes, by kind, for the device
profiler (tools/device/kernel_profile.py). Counts are exact: one graph a draft, a verify and a
commit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dflash
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


def test_device_inputs_change_no_token(tmp_path: Path) -> None:
    """Graph inputs in the device's memory, written on its stream (the default; on the CPU the same
    allocation path in host memory), and left to the scheduler (DFLASH_DEVICE_INPUTS=0) decode the
    same tokens, chain and DDTree, and time every graph."""
    switch = "DFLASH_DEVICE_INPUTS"
    script = (
        "import sys; from pathlib import Path; from dflash import _core\n"
        f"pair = Path({str(PAIR)!r})\n"
        "cfg = _core.EngineConfig(); cfg.n_ctx = 512; cfg.n_verify_max = 17\n"
        "t = _core.TargetEngine(str(pair / 'target-q8_0.gguf'), cfg)\n"
        "d = _core.DraftEngine(str(pair / 'drafter-q8_0.gguf'), t, _core.DraftEngineConfig())\n"
        "for budget in (0, 16):\n"
        "    s = _core.DecodeSession(t, d, list(range(1, 300)), 40, 0.0, 0, 1.0, 0, [], budget=budget)\n"
        "    out = []\n"
        "    while not s.done:\n"
        "        out += s.step()\n"
        "    print(budget, out)\n"
        "print(_core.compute_timing()['graphs'] > 0)\n"
    )
    # the same dflash as this process, whatever the working directory holds
    path = os.pathsep.join(
        [str(Path(dflash.__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")]
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": path, switch: flag},
        )
        for flag in ("0", "1")
    ]
    for r in runs:
        assert r.returncode == 0, r.stderr[-2000:]
    assert runs[0].stdout == runs[1].stdout
    lines = runs[1].stdout.splitlines()
    assert lines[-1] == "True" and len(lines) == 3 and all(len(x) > 40 for x in lines[:2])
