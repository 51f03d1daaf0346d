"""The server bench runs end to end: dflash-serve as a child process (as deployed) and the
engine called directly give the same output, and the report carries every figure. Speed
targets are checked from the bench JSON (bench/results/), never by a timed unit test."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from dflash_serve.bench import main as bench_main
from live_server import FAKE_ONLY


def test_server_bench_runs_and_reports(
    engine: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if FAKE_ONLY:
        pytest.skip("needs the real engine (DFLASH_SERVER_FAKE_ONLY=1)")
    out = tmp_path / "bench.json"
    argv = ["--model", engine.model_path, "--n-ctx", "512", "--n-threads", "1", "--max-tokens", "256"]
    assert bench_main([*argv, "--runs", "2", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    print(json.dumps(report))
    assert report["same_output"] is True
    assert report["completion_tokens"] > 0 and report["direct_tps"] > 0
    for key in ("server_tps", "server_stream_tps", "ratio_server", "ratio_server_stream"):
        assert report[key] > 0, key
