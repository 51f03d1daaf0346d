"""Fixtures for the dflash-serve tests.

`engine` is the real `dflash.Engine` on a tiny synthetic model. If dflash cannot be imported the
tests that use it FAIL, unless DFLASH_SERVER_FAKE_ONLY=1 (then they run on FakeEngine).
DFLASH_SERVER_MODEL=path.gguf uses that model instead of synthesising one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
try:
    import dflash_serve  # noqa: F401 - installed with the package
except ImportError:  # source tree
    sys.path.insert(0, str(REPO / "server"))

from dflash_serve.settings import Settings  # noqa: E402
from fake_engine import FakeEngine, ProbeEngine  # noqa: E402
from live_server import FAKE_ONLY, LiveServer  # noqa: E402

N_CTX = 512


def _real_engine(tmp: Path) -> Any:
    try:
        import dflash

        engine_cls = dflash.Engine
    except Exception as exc:  # noqa: BLE001
        pytest.fail(
            f"the real dflash engine is not importable ({exc!r}); build/install dflash, "
            "or set DFLASH_SERVER_FAKE_ONLY=1 to run the server tests on the fake engine only"
        )
    model = os.environ.get("DFLASH_SERVER_MODEL")
    if not model:
        model = str(tmp / "tiny-a.gguf")
        cmd = [sys.executable, "-m", "dflash.synth", "model", "--preset", "tiny-a", "--out", model]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            pytest.fail(f"could not synthesise the tiny model: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return engine_cls(model, n_ctx=N_CTX, seed=0, n_threads=1)  # 1 thread: no OpenMP spin on 2 cores


@pytest.fixture(scope="session")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The engine the acceptance tests run against (real, or fake with DFLASH_SERVER_FAKE_ONLY=1)."""
    if FAKE_ONLY:
        return FakeEngine(n_ctx=N_CTX, step_s=0.001)
    return _real_engine(tmp_path_factory.mktemp("model"))


@pytest.fixture
def make_server() -> Iterator[Callable[..., LiveServer]]:
    """make_server(factory, start=True, wait_ready=True, **settings) -> a started LiveServer."""
    servers: list[LiveServer] = []

    def make(
        factory: Callable[[], Any], start: bool = True, wait_ready: bool = True, **kw: Any
    ) -> LiveServer:
        srv = LiveServer(Settings(**kw), factory)
        servers.append(srv)
        return srv.start(wait_ready) if start else srv

    yield make
    for srv in servers:
        srv.stop()


@pytest.fixture(scope="module")
def probe(engine: Any) -> ProbeEngine:
    return ProbeEngine(engine)


@pytest.fixture(scope="module")
def server(engine: Any, probe: ProbeEngine) -> Iterator[LiveServer]:
    """A shared server over `probe` (the session's engine), no API key, queue of 16."""
    srv = LiveServer(Settings(model_alias="tiny", queue_size=16), lambda: probe).start()
    yield srv
    srv.stop()


@pytest.fixture(autouse=True)
def _reset_probe(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "probe" in request.fixturenames:
        p = request.getfixturevalue("probe")
        assert p.concurrent_calls == 0, "the engine was called concurrently"
        p.chunk_delay_s, p.fail_next = 0.0, None
