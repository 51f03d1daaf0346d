"""Bench upstream's `llama-server`: decode speed with `--spec-type draft-dflash` (optionally with
upstream's synthetic acceptance `--spec-synth-len L`), or without speculation as the baseline.

One server per call on a free local port, one slot; after /health answers, one warm-up and then
`repeats` /completion requests (temperature 0, fixed n_predict, ignore_eos, no prompt cache). Per
request: the response's `timings` (predicted_per_second, prompt_per_second, draft_n,
draft_n_accepted) and the mean acceptance length the server logs for it ("mean len = X",
1 + accepted / verify steps), else one derived from the timings.

Upstream's synthetic acceptance is probabilistic: each draft position is accepted with a fixed
probability chosen so that the mean acceptance length is L, and the text it produces is not the
model's. (dflash bench's --synthetic-accept L accepts exactly L-1 drafts every step instead.)
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from dflash.upstream_spec import UpstreamRunError

# the per-request line of the server log (server_slot::print_timings)
_MEAN_LEN = re.compile(r"draft acceptance = [\d.]+ \(.*?\), mean len =\s*([\d.]+)")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, timeout: float) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def _post(url: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return dict(json.loads(r.read()))


def _sample(resp: dict[str, Any], wall_s: float) -> dict[str, Any]:
    t = resp.get("timings", {})
    n, acc = int(t.get("predicted_n", 0)), int(t.get("draft_n_accepted", 0))
    steps = n - 1 - acc  # the first token comes from the prompt pass
    return {
        "decode_tps": float(t.get("predicted_per_second", 0.0)),
        "prefill_tps": float(t.get("prompt_per_second", 0.0)),
        "predicted_n": n,
        "predicted_ms": float(t.get("predicted_ms", 0.0)),
        "prompt_n": int(t.get("prompt_n", 0)),
        "draft_n": int(t.get("draft_n", 0)),
        "draft_n_accepted": acc,
        "acceptance_length_derived": (n - 1) / steps if steps > 0 else 1.0,
        "wall_s": wall_s,
    }


def _tail(path: Path, n: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.is_file() else ""


def _wait_healthy(proc: subprocess.Popen[bytes], base: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with {proc.returncode} while loading")
        try:
            if _get(base + "/health", timeout=5) == 200:
                return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise RuntimeError("llama-server did not become healthy in time")


def server_command(
    binary: str | os.PathLike[str],
    target: str | os.PathLike[str],
    draft: str | os.PathLike[str] | None,
    port: int,
    *,
    synth_len: float | None,
    ngl: int,
    draft_max: int,
    n_ctx: int,
    threads: int | None,
    extra: list[str] | None,
) -> list[str]:
    cmd = [str(binary), "-m", str(target), "--host", "127.0.0.1", "--port", str(port), "-np", "1"]
    cmd += ["-c", str(n_ctx), "-ngl", str(ngl), "--no-webui"]
    if draft is not None:
        cmd += ["-md", str(draft), "-ngld", str(ngl), "--spec-type", "draft-dflash"]
        cmd += ["--spec-draft-n-max", str(draft_max)]
        if synth_len is not None:
            cmd += ["--spec-synth-len", f"{synth_len:g}"]
    if threads:
        cmd += ["-t", str(threads)]
    return cmd + list(extra or [])


def run_server_bench(
    binary: str | os.PathLike[str],
    target: str | os.PathLike[str],
    draft: str | os.PathLike[str] | None,
    prompt: str | list[int],
    n_predict: int,
    *,
    synth_len: float | None,
    ngl: int,
    repeats: int,
    draft_max: int = 15,
    n_ctx: int = 4096,
    threads: int | None = None,
    extra: list[str] | None = None,
    startup_timeout: float = 600,
    request_timeout: float = 600,
    check: bool = True,
) -> dict[str, Any]:
    """Decode speed of upstream llama-server (see module doc). `prompt` may be token ids. Returns
    command, samples (one per repeat; `warmup` apart), decode_tps / prefill_tps /
    acceptance_length lists and the decode median. A failure raises UpstreamRunError with the
    server log's tail (check=False: returned with `error` and `server_log_tail`)."""
    if synth_len is not None and draft is None:
        raise ValueError("synth_len needs a draft model (upstream's synthetic acceptance is speculative)")
    port = _free_port()
    cmd = server_command(
        binary,
        target,
        draft,
        port,
        synth_len=synth_len,
        ngl=ngl,
        draft_max=draft_max,
        n_ctx=n_ctx,
        threads=threads,
        extra=extra,
    )
    res: dict[str, Any] = {
        "engine": "upstream-llama-server" + ("-draft-dflash" if draft is not None else ""),
        "command": shlex.join(cmd),
        "speculative": draft is not None,
        "synth_len": synth_len,
        "draft_max": draft_max if draft is not None else None,
        "n_predict": n_predict,
    }
    base = f"http://127.0.0.1:{port}"
    body = {
        "prompt": prompt,
        "n_predict": n_predict,
        "temperature": 0.0,
        "seed": 0,
        "ignore_eos": True,
        "cache_prompt": False,
        "stream": False,
    }
    with tempfile.TemporaryDirectory(prefix="dflash-llama-server-") as tmp:
        log = Path(tmp) / "server.log"
        with log.open("wb") as logf:
            proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        samples: list[dict[str, Any]] = []
        try:
            _wait_healthy(proc, base, time.monotonic() + startup_timeout)
            for _ in range(repeats + 1):
                t0 = time.monotonic()
                resp = _post(base + "/completion", body, request_timeout)
                samples.append(_sample(resp, time.monotonic() - t0))
        except (RuntimeError, OSError, urllib.error.URLError, ValueError) as e:
            res["error"] = f"{type(e).__name__}: {e}"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        res["returncode"] = proc.returncode
        logged = [float(x) for x in _MEAN_LEN.findall(log.read_text(errors="replace"))]
        drafted = [s for s in samples if s["draft_n"] > 0]
        if len(logged) == len(drafted):
            for s, al in zip(drafted, logged, strict=True):
                s["acceptance_length"], s["acceptance_length_from"] = al, "server log"
        for s in samples:
            s.setdefault("acceptance_length", s["acceptance_length_derived"])
            s.setdefault("acceptance_length_from", "timings")
        if "error" in res:
            res["server_log_tail"] = _tail(log)
    res["warmup"] = samples[0] if samples else None
    res["samples"] = samples[1:]
    for k in ("decode_tps", "prefill_tps", "acceptance_length"):
        res[k] = [s[k] for s in res["samples"]]
    res["decode_tps_median"] = statistics.median(res["decode_tps"]) if res["decode_tps"] else 0.0
    if "error" in res and check:
        raise UpstreamRunError(f"llama-server bench failed: {res['error']}\n{res['server_log_tail']}", res)
    return res
