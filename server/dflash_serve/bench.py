"""Decode speed through the server vs the engine called directly, same model, prompt and greedy request.

    python -m dflash_serve.bench --model tiny.gguf --max-tokens 256 --runs 5 --out bench.json

The server runs as a child process (as deployed), the client here. Prints (and writes with --out) a
JSON report. Speeds are medians over the runs: `predicted_per_second`
as the engine reports it in `timings`, and for streams also as the client sees it (tokens after the
first over the time between the first and the last chunk). `ratio_X` = X_tps / direct_tps.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

DEFAULT_PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def _server(argv: list[str], timeout: float = 600) -> Iterator[str]:
    """`dflash-serve ARGV` in a child process on 127.0.0.1; yields its URL once /health is 200."""
    port = _free_port()
    cmd = [sys.executable, "-m", "dflash_serve.main", "--host", "127.0.0.1", "--port", str(port), *argv]
    # the child imports the same dflash_serve and dflash as this process
    import dflash

    paths = [str(Path(__file__).resolve().parents[1]), str(Path(dflash.__file__).resolve().parents[1])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")])}
    log = tempfile.TemporaryFile("w+")
    # cwd elsewhere: `python -m` puts cwd first on sys.path, and a source checkout's dflash/ has no _core
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=log, text=True, env=env, cwd=tempfile.gettempdir()
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"dflash-serve exited with {proc.returncode}: {log.read()[-2000:]}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("dflash-serve did not become ready")
            time.sleep(0.1)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _stream(client: httpx.Client, body: dict[str, Any]) -> tuple[str, dict[str, Any], float | None]:
    """(text, final chunk, client-side decode t/s) of one streamed completion."""
    text, last, stamps = [], {}, []
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["text"]:
                stamps.append(time.perf_counter())
                text.append(chunk["choices"][0]["text"])
            last = chunk
    n = last.get("usage", {}).get("completion_tokens", 0)
    tps = (n - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 and stamps[-1] > stamps[0] else None
    return "".join(text), last, tps


def _median(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def run_bench(
    model: str | None,
    engine_kwargs: dict[str, Any] | None = None,
    prompt: str = DEFAULT_PROMPT,
    max_tokens: int = 256,
    runs: int = 5,
) -> dict[str, Any]:
    """Direct runs in this process first (then the engine is freed), then the same requests to a
    dflash-serve child process with the same engine settings."""
    import dflash

    kw = dict(engine_kwargs or {})
    engine: Any = dflash.Engine(model, **kw)
    model_path = str(engine.model_path)
    draft_path = getattr(engine, "draft_path", None)  # the packaged drafter too, with the default model
    engine.create_completion(prompt, max_tokens=8, temperature=0)  # warm-up
    direct: list[dict[str, Any]] = [
        engine.create_completion(prompt, max_tokens=max_tokens, temperature=0) for _ in range(runs)
    ]
    del engine
    gc.collect()

    argv = ["--model", model_path, "--log-level", "warning"]
    if draft_path and "draft_path" not in kw:
        argv += ["--draft", str(draft_path)]
    for key, value in kw.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    req = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    with _server(argv) as url, httpx.Client(base_url=url, timeout=600) as client:
        client.post("/v1/completions", json={**req, "max_tokens": 8})  # warm-up
        plain = [client.post("/v1/completions", json=req).json() for _ in range(runs)]
        streams = [_stream(client, req) for _ in range(runs)]

    def tps(results: list[dict[str, Any]]) -> float | None:
        return _median([r.get("timings", {}).get("predicted_per_second") for r in results])

    want = direct[0]["choices"][0]["text"]
    report: dict[str, Any] = {
        "model": model_path,
        "draft": draft_path,
        "engine": kw,
        "prompt_tokens": direct[0]["usage"]["prompt_tokens"],
        "completion_tokens": direct[0]["usage"]["completion_tokens"],
        "runs": runs,
        "direct_tps": tps(direct),
        "server_tps": tps(plain),
        "server_stream_tps": tps([s[1] for s in streams]),
        "server_stream_client_tps": _median([s[2] for s in streams]),
        "same_output": all(p["choices"][0]["text"] == want for p in plain)
        and all(s[0] == want for s in streams),
    }
    base = report["direct_tps"]
    for key in ("server", "server_stream", "server_stream_client"):
        value = report[f"{key}_tps"]
        report[f"ratio_{key}"] = value / base if value and base else None
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dflash_serve.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--model", "-m", default=None, help="target GGUF (default: the embedded model)")
    parser.add_argument("--n-ctx", type=int, default=4096)
    parser.add_argument("--n-threads", type=int, default=0)
    parser.add_argument("--n-gpu-layers", type=int, default=-1)
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", default=None, help="write the JSON report here too")
    args = parser.parse_args(argv)
    kwargs: dict[str, Any] = {"n_ctx": args.n_ctx, "n_gpu_layers": args.n_gpu_layers}
    if args.n_threads:
        kwargs["n_threads"] = args.n_threads
    report = run_bench(args.model, kwargs, args.prompt, args.max_tokens, args.runs)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
