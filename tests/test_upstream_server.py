"""OPTIONAL (set DFLASH_TEST_UPSTREAM_SERVER=1): upstream llama-server's draft-dflash and synthetic
acceptance through `run_server_bench` and `dflash bench --llama-server`, on the tiny pair.

Off by default because it builds llama-server (several more minutes on 2 cores on top of
llama-speculative-simple's build); the required upstream test is test_upstream_draft_dflash.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from dflash import bench
from dflash.upstream_tools import run_server_bench, upstream_binary

pytestmark = pytest.mark.skipif(
    os.environ.get("DFLASH_TEST_UPSTREAM_SERVER") != "1",
    reason="optional: set DFLASH_TEST_UPSTREAM_SERVER=1 to build and test upstream llama-server",
)
REPO = Path(__file__).resolve().parents[1]
TEST_NGL = int(os.environ.get("DFLASH_TEST_NGL", "0"))


@pytest.fixture(scope="module")
def server() -> Path:
    return upstream_binary("llama-server", source_root=REPO)


def test_server_bench_ar_spec_and_synthetic(server: Path, drafter_pair: Any) -> None:
    target, draft = drafter_pair(seed=1)
    kw: dict[str, Any] = {"ngl": TEST_NGL, "repeats": 2, "n_ctx": 512, "threads": 2}
    ar = run_server_bench(server, target, None, "def f(x):", 24, synth_len=None, **kw)
    assert len(ar["samples"]) == 2 and ar["warmup"] is not None
    assert all(s["predicted_n"] == 24 and s["draft_n"] == 0 for s in ar["samples"])
    assert ar["decode_tps_median"] > 0 and ar["acceptance_length"] == [1.0, 1.0]
    spec = run_server_bench(server, target, draft, [1, 2, 3, 4, 5], 24, synth_len=None, **kw)
    assert all(s["draft_n"] > 0 for s in spec["samples"]), "draft-dflash never drafted"
    synth = run_server_bench(server, target, draft, [1, 2, 3, 4, 5], 48, synth_len=4.0, **kw)
    assert "--spec-synth-len 4" in synth["command"]
    # upstream's synthetic acceptance is random per position (seeded): its mean is only near L
    assert all(s["acceptance_length_from"] == "server log" for s in synth["samples"])
    assert all(1.5 < al < 8.0 for al in synth["acceptance_length"])


def test_bench_records_upstream_server_next_to_ours(server: Path, drafter_pair: Any, tmp_path: Path) -> None:
    target, draft = drafter_pair(seed=1)
    out = tmp_path / "bench.json"
    argv = ["-m", str(target), "--draft", str(draft), "-p", "16", "-n", "24", "-r", "1", "-c", "512"]
    argv += ["-ngl", str(TEST_NGL), "-t", "2", "--no-upstream", "--llama-server", str(server)]
    assert bench.main([*argv, "--synth-len", "3", "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["config"]["synthetic_accept"] == 3  # set from --synth-len
    runs = {r["engine"]: r for r in doc["results"]}
    assert runs["dflash-chain"]["synthetic_acceptance_length"] == 3
    up = runs["upstream-llama-server-draft-dflash"]
    assert "error" not in up and up["synth_len"] == 3.0 and up["synthetic_acceptance_note"]
    assert up["ours_chain_acceptance_length"] == runs["dflash-chain"]["acceptance_length"]
    assert up["decode_ratio_ours_chain_vs_this"] > 0
    assert "error" not in runs["upstream-llama-server"]
