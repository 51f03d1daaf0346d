"""`dflash bench --llama-server PATH [--synth-len L]`: upstream llama-server on the same file, prompt
and lengths as our runs, recorded next to them in the bench JSON.

Two server runs per KV type: no speculation (upstream's autoregressive baseline) and, with
--draft, `--spec-type draft-dflash` with the same drafter and draft length, plus
`--spec-synth-len L` when given. The two synthetic modes differ: upstream accepts each draft
position at random with a probability set so that the *mean* acceptance length is L; ours
(--synthetic-accept L, which --synth-len sets when L is a whole number and it is not given)
accepts exactly L-1 drafts every step. Both measured acceptance lengths are in the JSON.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

SYNTH_NOTE = (
    "upstream --spec-synth-len L: each draft position accepted at random, mean acceptance length L "
    "(output not the model's); ours --synthetic-accept L: exactly L-1 drafts accepted every step"
)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--llama-server",
        default=None,
        metavar="PATH",
        help="upstream llama-server to bench as well ('auto': dflash.upstream_tools builds/finds it): "
        "no speculation, and draft-dflash with --draft",
    )
    ap.add_argument(
        "--synth-len",
        type=float,
        default=None,
        metavar="L",
        help="BENCH ONLY: upstream's synthetic mean acceptance length (--spec-synth-len) for the "
        "draft-dflash llama-server run; also sets --synthetic-accept L for ours when L is whole",
    )


def check_args(a: argparse.Namespace, ap: argparse.ArgumentParser) -> None:
    if a.synth_len is None:
        return
    if not a.llama_server or not a.draft:
        ap.error("--synth-len needs --llama-server and --draft")
    if not 1.0 <= a.synth_len <= a.max_draft + 1:
        ap.error(f"--synth-len must be within [1, {a.max_draft + 1}] (--max-draft + 1)")
    if not a.synthetic_accept and float(a.synth_len).is_integer():
        a.synthetic_accept = int(a.synth_len)


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else 0.0


def server_runs(
    path: str, kv: str, prompt: list[int], a: argparse.Namespace, ours: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The llama-server runs for one KV type; `ours` (this KV type's runs so far) gives the ratio."""
    from dflash import upstream_tools

    binary = a.llama_server
    if binary == "auto":
        binary = str(upstream_tools.upstream_binary("llama-server"))
    common: dict[str, Any] = {
        "ngl": 999 if a.n_gpu_layers != 0 else 0,
        "repeats": a.repeats,
        "draft_max": a.max_draft,
        "n_ctx": a.n_ctx,
        "threads": a.threads or None,
        "extra": ["-ctk", kv, "-ctv", kv, "-fa", "on", "-b", str(a.n_batch)],
        "check": False,
    }
    bench = upstream_tools.run_server_bench
    runs = [bench(binary, path, None, prompt, a.gen_tokens, synth_len=None, **common)]
    if a.draft:
        spec = bench(binary, path, a.draft, prompt, a.gen_tokens, synth_len=a.synth_len, **common)
        chain = next((r for r in ours if r.get("engine") == "dflash-chain"), None)
        if a.synth_len is not None:
            spec["synthetic_acceptance_note"] = SYNTH_NOTE
            spec["ours_synthetic_acceptance_length"] = a.synthetic_accept or None
        if chain is not None:
            ours_tps, up_tps = _median(chain.get("decode_tps", [])), _median(spec.get("decode_tps", []))
            spec["ours_chain_decode_tps_median"] = ours_tps
            spec["ours_chain_acceptance_length"] = chain.get("acceptance_length", [])
            spec["decode_ratio_ours_chain_vs_this"] = ours_tps / up_tps if up_tps > 0 else None
        runs.append(spec)
    for r in runs:
        if "error" in r:
            print(f"{r['engine']}: {r['error']}\n{r.get('server_log_tail', '')}", flush=True)
    return runs
