"""`dflash-serve` start-up: a model or configuration the engine refuses stops the process with exit
code 1 and the engine's reason, numbers included. (Whether a configuration fits in memory is the
engine's check; the tiny test model fits at any n_ctx the engine accepts.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dflash_serve.app
import pytest
from dflash_serve.main import main
from fake_engine import ModelLoadError
from live_server import FAKE_ONLY


def _serve(argv: list[str], caplog: pytest.LogCaptureFixture) -> tuple[int, str]:
    caplog.set_level("INFO", logger="dflash_serve")
    rc = main(["--host", "127.0.0.1", "--port", "0", *argv])
    return rc, "\n".join(r.getMessage() for r in caplog.records)


def test_missing_model_exits_1(
    engine: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "missing.gguf"
    if FAKE_ONLY:  # the real loader is not importable: stand in for it

        def factory(settings: Any) -> Any:
            def load() -> Any:
                raise ModelLoadError(f"cannot open {settings.model}: No such file")

            return load

        monkeypatch.setattr(dflash_serve.app, "default_engine_factory", factory)
    rc, log = _serve(["--model", str(missing)], caplog)
    assert rc == 1
    assert "ModelLoadError" in log and str(missing) in log


def test_refused_configuration_exits_1_with_numbers(
    engine: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    if FAKE_ONLY:

        def factory(settings: Any) -> Any:
            def load() -> Any:
                raise ModelLoadError(f"n_ctx {settings.n_ctx} needs 7450.6 GiB of KV cache, 20.1 GiB free")

            return load

        monkeypatch.setattr(dflash_serve.app, "default_engine_factory", factory)
    rc, log = _serve(["--model", engine.model_path, "--n-ctx", "2000000000"], caplog)
    assert rc == 1
    line = next(ln for ln in log.splitlines() if "could not be loaded" in ln)
    assert "2000000000" in line and ("ModelLoadError" in line or "InvalidParameterError" in line), line
