"""dflash-serve with no model arguments: the packaged pair (a stand-in installed into a temporary
package-data folder, conftest `packaged_pair`) with its drafter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dflash.models as models

PROMPT = "def fibonacci(n):"


def test_server_default_loads_the_drafter(use_packaged_pair: Path, make_server: Any) -> None:
    from dflash_serve.app import default_engine_factory
    from dflash_serve.settings import Settings

    settings = Settings(n_ctx=256, n_threads=1)
    assert settings.engine_kwargs()["model_path"] is None and settings.engine_kwargs()["default_draft"]
    srv = make_server(default_engine_factory(settings), n_ctx=256, n_threads=1)
    with srv.client() as c:
        meta = c.get("/v1/models").json()["data"][0]["meta"]
        body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0}
        r = c.post("/v1/completions", json=body).json()
    assert meta["model_path"] == str(use_packaged_pair / models.PAIR_TARGET)
    assert meta["draft_path"] == str(use_packaged_pair / models.PAIR_DRAFTER)
    assert r["timings"]["draft_n"] > 0
    off = default_engine_factory(Settings(n_ctx=256, n_threads=1, default_draft=False))()
    assert not off.speculative
