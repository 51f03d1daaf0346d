"""Decode speed through dflash-serve (a child process, as deployed) vs the engine called directly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from dflash_serve.bench import main as bench_main
from live_server import FAKE_ONLY


def test_server_decode_speed_matches_direct(
    engine: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if FAKE_ONLY:
        pytest.skip("needs the real engine (DFLASH_SERVER_FAKE_ONLY=1)")
    out = tmp_path / "bench.json"
    argv = ["--model", engine.model_path, "--n-ctx", "512", "--n-threads", "1", "--max-tokens", "256"]
    assert bench_main([*argv, "--runs", "5", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    print(json.dumps(report))
    assert report["same_output"] is True
    assert report["completion_tokens"] > 0 and report["direct_tps"] > 0
    # Issue 6 asks >= 0.95 (non-streaming, engine-reported decode t/s); 0.9 leaves room for a busy
    # 2-core CI machine. Streams pay a per-token thread hop: visible only at thousands of t/s.
    assert report["ratio_server"] >= 0.9, report
    assert report["ratio_server_stream"] >= 0.3, report
