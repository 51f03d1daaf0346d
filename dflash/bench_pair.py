"""`dflash bench --pair [DIR]`: the trained target + drafter pair (issue 5) on its held-out prompt
set, every mode greedy on the same prompts for the same number of tokens: our engine
autoregressive, chain DFlash and DDTree over a budget sweep; upstream llama.cpp autoregressive
(libllama in this process) and its draft-dflash speculative example. DIR: a train_pair export or
the package's `dflash/data/pair` (the default).

Prompts: --prompts FILE, else DIR/prompts.jsonl (code and prose, see tools/train_pair/bench_prompts.py),
else DIR/heldout_prompts.jsonl (code only). Per mode and prompt: decode and prefill t/s, TTFT,
acceptance length, per-depth acceptance, tokens per target forward, the greedy tokens; medians
over prompts, overall and per kind. JSON (command, machine, commit, raw samples) under
bench/results/ (REFERENCE.md section 8).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from dflash import models
from dflash.bench import _git_commit, _machine
from dflash.bench_pair_modes import Prompt, RunConfig, run_ours, run_upstream_ar, run_upstream_spec
from dflash.bench_pair_summary import mark_identity, markdown, summarise


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dflash bench --pair", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--pair", nargs="?", const="", default="", metavar="DIR", help="default: the packaged pair"
    )
    ap.add_argument("--prompts", type=Path, default=None, help="JSONL of {kind, prompt} (default: see above)")
    ap.add_argument(
        "--n-prompts", type=int, default=0, help="at most this many prompts of each kind (0: all)"
    )
    ap.add_argument("-n", "--n-predict", type=int, default=128, help="tokens generated per prompt")
    ap.add_argument("-r", "--repeats", type=int, default=1, help="runs per prompt (median), after a warm-up")
    ap.add_argument("-c", "--n-ctx", type=int, default=2048)
    ap.add_argument("-b", "--n-batch", type=int, default=512)
    ap.add_argument("-ngl", "--n-gpu-layers", type=int, default=-1, help="0: CPU only; -1: all layers")
    ap.add_argument("-t", "--threads", type=int, default=0)
    ap.add_argument("--kv-type", default="f16")
    ap.add_argument("--max-draft", type=int, default=15, help="chain DFlash (ours and upstream's)")
    ap.add_argument(
        "--budgets",
        default="4,8,16,31,47,63",
        help="DDTree budgets to sweep ('' for none); a tree of b nodes verifies b + 1 tokens, so 31 / 47 / "
        "63 fill the CUDA GEMM's 32- / 48- / 64-column tiles",
    )
    ap.add_argument(
        "--chain-seed",
        choices=["on", "off", "both"],
        default="on",
        help="DDTree trees seeded with the drafter's top-1 chain (the engine's default), not (modes "
        "ours-ddtree-bN-unseeded: the best-first tree alone), or both",
    )
    ap.add_argument(
        "--tree-temperature",
        type=float,
        default=1.0,
        help="softmax temperature of the drafter's log-probabilities the DDTree builder ranks by",
    )
    ap.add_argument(
        "--batch-invariant",
        action="store_true",
        help="our verifies compute each token as a decode step does, so greedy speculative output equals our "
        "autoregressive output bit for bit on CUDA too (ggml_ext/BATCH_INVARIANCE.md)",
    )
    ap.add_argument("--no-upstream", action="store_true", help="skip upstream autoregressive (libllama)")
    ap.add_argument("--no-upstream-spec", action="store_true", help="skip upstream llama-speculative-simple")
    ap.add_argument("--spec-binary", default=None, help="llama-speculative-simple (default: upstream_tools')")
    ap.add_argument("-o", "--out", default=None, help="JSON output (default bench/results/pair-<time>.json)")
    return ap


def load_prompts(path: Path, n_per_kind: int) -> list[dict[str, str]]:
    """Rows {kind, prompt, source} in file order, at most n_per_kind of each kind (0: all)."""
    rows: list[dict[str, str]] = []
    seen: dict[str, int] = {}
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(ln for ln in f if ln.strip()):
            row = json.loads(line)
            kind = str(row.get("kind", "code"))
            if n_per_kind and seen.get(kind, 0) >= n_per_kind:
                continue
            seen[kind] = seen.get(kind, 0) + 1
            rows.append(
                {"kind": kind, "prompt": row["prompt"], "source": row.get("source", f"{path.name}:{i}")}
            )
    return rows


def _prompt_file(pair: Path, given: Path | None) -> Path:
    for p in (given, pair / "prompts.jsonl", pair / "heldout_prompts.jsonl"):
        if p is not None and p.is_file():
            return p
    raise SystemExit(
        f"dflash bench --pair: no prompts: {pair} has neither prompts.jsonl nor heldout_prompts.jsonl"
    )


def _file(path: Path) -> dict[str, Any]:
    return {"path": str(path), "bytes": path.stat().st_size}


def run(a: argparse.Namespace, argv: list[str], out: Path | None = None) -> dict[str, Any]:
    """Runs every mode; with `out`, rewrites the JSON after each mode ("complete": false until
    the last), so that a bench cut short by a time limit keeps what it measured."""
    from dflash import _core

    pair = Path(a.pair) if a.pair else models.PAIR_DIR
    target, drafter = pair / models.PAIR_TARGET, pair / models.PAIR_DRAFTER
    if not target.is_file() or not drafter.is_file():
        raise SystemExit(f"dflash bench --pair: {pair} lacks {models.PAIR_TARGET} or {models.PAIR_DRAFTER}")
    pfile = _prompt_file(pair, a.prompts)
    vocab = _core.Vocab(str(target))
    prompts = [
        Prompt(r["kind"], r["prompt"], list(vocab.tokenize(r["prompt"], True, True)), r["source"])
        for r in load_prompts(pfile, a.n_prompts)
    ]
    budgets = [int(x) for x in a.budgets.split(",") if x.strip()]
    need = max(len(p.tokens) for p in prompts) + a.n_predict + max([a.max_draft, *budgets]) + 1
    if need > a.n_ctx:
        raise SystemExit(f"dflash bench --pair: -c {a.n_ctx} is too small, the longest prompt needs {need}")
    cfg = RunConfig(
        a.n_predict, a.repeats, a.n_ctx, a.n_batch, a.n_gpu_layers, a.threads, a.kv_type, a.batch_invariant
    )
    t, d = str(target), str(drafter)

    # Upstream's modes right after ours AR and chain: a run cut by a time limit keeps the comparison.
    plan: list[tuple[str, Any]] = [
        ("ours-ar", lambda: run_ours(t, None, prompts, cfg, a.max_draft, 0)),
        ("ours-chain", lambda: run_ours(t, d, prompts, cfg, a.max_draft, 0)),
    ]
    if not a.no_upstream:
        plan.append(("upstream-ar", lambda: run_upstream_ar(t, prompts, cfg)))
    if not a.no_upstream_spec:
        plan.append(
            ("upstream-spec", lambda: run_upstream_spec(t, d, prompts, cfg, a.max_draft, a.spec_binary))
        )
    seeds = {"on": [True], "off": [False], "both": [True, False]}[a.chain_seed]
    plan += [
        (
            f"ours-ddtree-b{b}" + ("" if seed else "-unseeded"),
            lambda b=b, s=seed: run_ours(t, d, prompts, cfg, a.max_draft, b, s, a.tree_temperature),
        )
        for b in budgets
        for seed in seeds
    ]

    summary_path = pair / "summary.json"
    trained = json.loads(summary_path.read_text(encoding="utf-8")) if summary_path.is_file() else {}
    kinds = {k: sum(p.kind == k for p in prompts) for k in sorted({p.kind for p in prompts})}
    modes: list[dict[str, Any]] = []
    doc: dict[str, Any] = {
        "command": "dflash bench " + shlex.join(argv),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": _git_commit(),
        "machine": _machine(),
        "backend": "",
        "complete": False,
        "pair": {
            "dir": str(pair),
            "target": _file(target),
            "drafter": _file(drafter),
            "training_acceptance": trained.get("acceptance"),
        },
        "prompts": {
            "file": str(pfile),
            "count": len(prompts),
            "kinds": kinds,
            "items": [
                {"kind": p.kind, "source": p.source, "text": p.text, "n_tokens": len(p.tokens)}
                for p in prompts
            ],
        },
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
        "modes": modes,
    }
    for i, (name, fn) in enumerate(plan):
        m: dict[str, Any] = {"mode": name, **fn()}
        ref = modes[0]["samples"] if modes else m["samples"]
        m["identical_to_ours_ar"] = mark_identity(m["samples"], ref)
        m["summary"] = summarise(m["samples"], ref)
        modes.append(m)
        _print(m)
        doc["backend"] = modes[0].get("backend", "")
        doc["complete"] = i == len(plan) - 1
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    return doc


def _print(m: dict[str, Any]) -> None:
    if "error" in m:
        print(f"{m['mode']:>18}  error: {m['error']}", flush=True)
        if not m["samples"]:
            return
    s = m["summary"]["all"]
    nan = float("nan")
    al, tpf = s["acceptance_length_median"], s["tokens_per_forward_median"]
    same = {None: "-", True: "yes", False: "NO"}[m["identical_to_ours_ar"]]
    print(
        f"{m['mode']:>18}  decode {s['decode_tps_median'] or 0:9.1f} t/s  "
        f"AL {nan if al is None else al:5.2f}  tok/fwd {nan if tpf is None else tpf:5.2f}  "
        f"same as ours-ar: {same}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = _parser().parse_args(argv)
    out = Path(a.out) if a.out else Path("bench/results") / f"pair-{int(time.time())}.json"
    doc = run(a, argv, out)
    print(markdown(doc), end="")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
