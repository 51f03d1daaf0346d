"""Run upstream's `llama-speculative-simple` with `--spec-type draft-dflash` and read its figures.

What the program writes (upstream examples/speculative-simple, commit 0c1e570): on stdout two
newlines, the prompt's pieces, the generated pieces, then four newlines; on stderr (the log)
"encoded N tokens in S seconds, speed: X t/s", "decoded N tokens in ...", and `n_draft`,
`n_predict`, `n_drafted`, `n_accept` lines. Every verify step adds its accepted drafts plus one
target token to `n_predict`, so the steps number n_predict - n_accept and the mean acceptance
length is n_predict / (n_predict - n_accept) = 1 + n_accept / steps. The program generates
n_predict + 1 tokens for `-n n_predict` (it stops once the count exceeds it), or fewer at an
end-of-generation token.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

_SPEED = re.compile(r"(encoded|decoded)\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+|inf|nan) t/s")
_COUNT = re.compile(r"\b(n_draft|n_predict|n_drafted|n_accept)\s*=\s*(-?\d+)\s*$", re.M)


class UpstreamRunError(RuntimeError):
    """An upstream program failed; `.result` holds what was read (command, returncode, stderr_tail)."""

    def __init__(self, message: str, result: dict[str, Any]) -> None:
        super().__init__(message)
        self.result = result


def parse_log(stderr: str) -> dict[str, Any]:
    """The figures of llama-speculative-simple's log (missing ones are absent)."""
    out: dict[str, Any] = {}
    for kind, n, secs, tps in _SPEED.findall(stderr):
        pre = "encode" if kind == "encoded" else "decode"
        out[f"n_{pre}d"] = int(n)
        out[f"{pre}_s"] = float(secs)
        out[f"{pre}_tps"] = float(tps)
    for key, value in _COUNT.findall(stderr):
        out[key] = int(value)
    if "n_predict" in out and "n_accept" in out:
        steps = out["n_predict"] - out["n_accept"]
        out["draft_steps"] = steps
        out["acceptance_length"] = out["n_predict"] / steps if steps > 0 else None
    if "encode_tps" in out:
        out["prefill_tps"] = out["encode_tps"]  # dflash bench's name for it
    return out


def generated_text(stdout: bytes, prompt: str) -> tuple[str, bool]:
    """The generated part of stdout, and whether the prompt echo was found and removed. Bytes that
    are not UTF-8 survive as surrogates: ``text.encode("utf-8", "surrogateescape")`` is exact."""
    body = stdout.removeprefix(b"\n\n").removesuffix(b"\n\n\n\n")
    echo = prompt.encode()
    at = body.find(echo)
    found = 0 <= at < 64  # a BOS piece may precede the prompt text
    if found:
        body = body[at + len(echo) :]
    return body.decode("utf-8", errors="surrogateescape"), found


def run_speculative_simple(
    binary: str | os.PathLike[str],
    target: str | os.PathLike[str],
    draft: str | os.PathLike[str],
    prompt: str,
    n_predict: int,
    *,
    ngl: int = 0,
    draft_max: int = 15,
    n_ctx: int = 4096,
    threads: int | None = None,
    extra: list[str] | None = None,
    timeout: float = 600,
    check: bool = True,
) -> dict[str, Any]:
    """Greedy (temperature 0, seed 0) draft-dflash run of `binary` on `target` + `draft`.

    Returns the parsed figures (n_drafted, n_accept, n_predict, draft_steps, acceptance_length,
    decode_tps, encode_tps = prefill_tps, ...), `generated` (see generated_text), `command`,
    `returncode` and `wall_s`. A failed run (non-zero exit, timeout, no figures) raises
    UpstreamRunError with the stderr tail, or with check=False returns the dict with `error` and
    `stderr_tail`.
    """
    cmd = [
        str(binary),
        "-m",
        str(target),
        "-md",
        str(draft),
        "--spec-type",
        "draft-dflash",
        "--spec-draft-n-max",
        str(draft_max),
        "-p",
        prompt,
        "-n",
        str(n_predict),
        "-c",
        str(n_ctx),
        "-ngl",
        str(ngl),
        "-ngld",
        str(ngl),
        "--temp",
        "0",
        "--seed",
        "0",
    ]
    if threads:
        cmd += ["-t", str(threads)]
    cmd += list(extra or [])
    res: dict[str, Any] = {"command": shlex.join(cmd), "binary": str(Path(binary))}
    # Upstream logs through an asynchronous writer; about one run in 25 exits before its last
    # lines (the figures) are written although it succeeded. Such a run is repeated (twice at most).
    for _attempt in range(3):
        t0 = time.monotonic()
        try:
            r = subprocess.run(cmd, capture_output=True, timeout=timeout)
            res["returncode"] = r.returncode
            stdout, stderr = r.stdout, r.stderr.decode("utf-8", errors="replace")
        except subprocess.TimeoutExpired as e:
            res["returncode"] = None
            stdout = e.stdout or b""
            stderr = (e.stderr or b"").decode("utf-8", errors="replace")
            res["error"] = f"timed out after {timeout:.0f} s"
        res["wall_s"] = time.monotonic() - t0
        figures = parse_log(stderr)
        if "error" in res or res["returncode"] != 0 or ("decode_tps" in figures and "n_drafted" in figures):
            break
        res["log_retries"] = res.get("log_retries", 0) + 1
    res.update(figures)
    res["generated"], res["prompt_echo_found"] = generated_text(stdout, prompt)
    if "error" not in res and res["returncode"] != 0:
        res["error"] = f"exited with {res['returncode']}"
    if "error" not in res and ("decode_tps" not in res or "n_drafted" not in res):
        res["error"] = "no figures in its log"
    if "error" in res:
        res["stderr_tail"] = "\n".join(stderr.splitlines()[-30:])
        if check:
            raise UpstreamRunError(
                f"llama-speculative-simple {res['error']}: {res['command']}\n{res['stderr_tail']}", res
            )
    return res
