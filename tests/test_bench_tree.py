"""`dflash bench --tree-steps` runs on the tiny synthetic pair and writes every budget's step split,
plain forwards (ours and upstream's) and the overhead ratio; timings are positive."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from dflash.bench import main as bench_main

TEST_NGL = int(os.environ.get("DFLASH_TEST_NGL", "0"))  # 99 on the GPU machine


@pytest.mark.parametrize("accept", [0, 3])
def test_tree_steps_bench_writes_every_budget(drafter_pair: Any, tmp_path: Path, accept: int) -> None:
    target, drafter = drafter_pair()
    out = tmp_path / "tree.json"
    budgets = [1, 2, 4, 8]
    argv = ["--tree-steps", "-m", str(target), "--draft", str(drafter)]
    argv += ["--budgets", ",".join(map(str, budgets))]
    argv += ["-p", "8", "--steps", "4", "--warmup-steps", "1", "-r", "2", "-c", "256", "-t", "1"]
    argv += ["-ngl", str(TEST_NGL)]
    argv += ["--kv-type", "f16", "--synthetic-accept", str(accept), "-o", str(out)]
    assert bench_main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["command"].startswith("dflash bench --tree-steps ")
    assert doc["commit"] and doc["machine"]["cores"]
    assert [r["budget"] for r in doc["budgets"]] == budgets
    assert doc["ar_step_ms"]["dflash_median"] > 0 and doc["ar_step_ms"]["upstream_median"] > 0
    for r in doc["budgets"]:
        t = r["ddtree"]
        assert r["n_tokens"] == r["budget"] + 1
        assert t["n_full_steps"] == t["n_steps"] == 4
        assert t["samples"]["nodes"] == [r["budget"]] * 4
        for k in ("draft_ms", "tree_ms", "verify_ms", "commit_ms", "step_ms"):
            assert t["median"][k] > 0, (r["budget"], k)
        for k in ("forward_ms", "forward_capture_ms", "upstream_forward_ms"):
            assert len(r[k]) == 2 and min(r[k]) > 0, (r["budget"], k)
        assert r["tree_overhead_ratio"] > 0
        assert isinstance(r["meets_15pct"], bool)
        if accept:  # the seeded chain carries accept - 1 of the target's own tokens
            assert t["tokens_per_forward"] >= min(accept, r["budget"] + 1)
