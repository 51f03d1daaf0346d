"""dflash-serve with a drafter: chain DFlash behind the same API, same greedy output as the
plain engine, and the spec_decode_* metrics counting the drafts."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="module")
def pair(drafter_pair: Any) -> tuple[Path, Path]:
    return drafter_pair(seed=1)


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{name} ([0-9.e+]+)$", text, re.M)
    assert m, name
    return float(m.group(1))


def test_server_with_drafter(pair: tuple[Path, Path], make_server: Any) -> None:
    import dflash

    plain = dflash.Engine(str(pair[0]), n_ctx=256, n_threads=1)
    spec = dflash.Engine(str(pair[0]), draft_path=str(pair[1]), n_ctx=256, n_threads=1, max_draft=7)
    body = {"prompt": "def main():", "max_tokens": 24, "temperature": 0}
    expected = plain.create_completion(**body)["choices"][0]["text"]
    srv = make_server(lambda: spec)
    with srv.client() as c:
        r = c.post("/v1/completions", json=body).json()
        assert r["choices"][0]["text"] == expected
        assert r["timings"]["draft_n"] > 0
        metrics = c.get("/metrics").text
    assert _metric(metrics, "spec_decode_num_draft_tokens_total") == r["timings"]["draft_n"]
    assert _metric(metrics, "spec_decode_num_drafts_total") > 0


def test_server_with_ddtree_budget(pair: tuple[Path, Path], make_server: Any) -> None:
    import dflash

    plain = dflash.Engine(str(pair[0]), n_ctx=256, n_threads=1)
    tree = dflash.Engine(str(pair[0]), draft_path=str(pair[1]), n_ctx=256, n_threads=1, budget=8)
    body = {"prompt": "class A:", "max_tokens": 24, "temperature": 0, "stream": True}
    expected = plain.create_completion(**{**body, "stream": False})["choices"][0]["text"]
    srv = make_server(lambda: tree)
    with srv.client() as c, c.stream("POST", "/v1/completions", json=body) as resp:
        text = ""
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                text += chunk["choices"][0]["text"]
    assert text == expected
