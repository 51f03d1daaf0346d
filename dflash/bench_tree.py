"""`dflash bench --tree-steps`: the cost of one DDTree step per budget, split into draft / tree
build / verify / commit (median over the steps of one generation), next to a plain target forward
of the same N = budget + 1 tokens (ours and upstream libllama's, same file, same process) and an
autoregressive step (ours and upstream's).

The criterion of issue 4: the tree machinery - tree build and walk, the verify's cost over a plain
forward, the commit - adds at most 15% to a plain forward of N tokens, i.e.
(tree_ms + verify_ms + commit_ms) / forward_ms(N) <= 1.15 ("tree_overhead_ratio" in the JSON).

Plain forwards (ours: TargetEngine.forward with every row's argmax, no logits copied, also with the
drafter's layer captures as the verify takes them; upstream: one llama_decode with every row's
logits, as its verify asks, and with the last row's only, as llama-bench's pp) run from an empty
context with the graph already built, so each sample is the warm steady state; the DDTree steps run
after a --prompt-tokens prompt, so the verify attends to a slightly longer context (a conservative
ratio). Autoregressive steps are single-token forwards after the prompt. tree_ms is host work
(building the tree from the drafter's top-K, walking it); the top-K itself is in the draft graph.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from dflash.bench import (
    _git_commit,
    _machine,
    _median,
    add_synthetic_accept_argument,
    model_path,
    write_result,
)

DEFAULT_BUDGETS = "1,2,4,8,16,32,64,128,256"
STEP_KEYS = ("draft_ms", "tree_ms", "verify_ms", "commit_ms")


def _target_config(a: argparse.Namespace, n_verify: int) -> Any:
    from dflash import _core

    cfg = _core.EngineConfig()
    cfg.n_ctx, cfg.k_type, cfg.v_type = a.n_ctx, a.cache_type_k, a.cache_type_v
    cfg.n_gpu_layers, cfg.n_threads, cfg.n_batch = a.n_gpu_layers, a.threads, a.n_batch
    cfg.n_verify_max = n_verify
    cfg.n_logits_batch = max(cfg.n_logits_batch, n_verify)  # a verify computes every row
    cfg.cache_commit_graphs = not a.scheduled_commits
    return cfg


def _tree_steps(
    target: Any, draft: Any, prompt: list[int], budget: int, a: argparse.Namespace
) -> dict[str, Any]:
    """One generation with DDTree at `budget`: the per-step split of the measured steps (after
    the prefill and --warmup-steps) from the session's statistics."""
    from dflash import _core

    s = _core.DecodeSession(
        target,
        draft,
        prompt,
        a.max_tokens,
        0.0,
        0,
        1.0,
        0,
        [],
        budget=budget,
        chain_seed=not a.no_chain_seed,
        forced_accept=a.synthetic_accept - 1 if a.synthetic_accept else -1,
    )
    s.step()  # prefill
    rows: dict[str, list[float]] = {k: [] for k in (*STEP_KEYS, "step_ms", "nodes", "accepted", "committed")}
    prev = s.spec
    for i in range(a.warmup_steps + a.steps):
        if s.done:
            break
        t0 = time.perf_counter()
        out = s.step()
        wall = (time.perf_counter() - t0) * 1000
        cur = s.spec
        if i >= a.warmup_steps:
            for k in STEP_KEYS:
                rows[k].append(cur[k] - prev[k])
            rows["step_ms"].append(wall)
            rows["nodes"].append(cur["draft_tokens"] - prev["draft_tokens"])
            rows["accepted"].append(cur["accepted"] - prev["accepted"])
            rows["committed"].append(len(out))
        prev = cur
    # Steps near the end of the token budget draft shallower trees: keep the full ones.
    full = [j for j, n in enumerate(rows["nodes"]) if n == budget]
    med = {k: _median([rows[k][j] for j in full]) for k in (*STEP_KEYS, "step_ms")}
    machinery = _median([sum(rows[k][j] for k in ("tree_ms", "verify_ms", "commit_ms")) for j in full])
    return {
        "samples": rows,
        "n_steps": len(rows["nodes"]),
        "n_full_steps": len(full),
        "median": med,
        "machinery_ms_median": machinery,
        "acceptance_length": 1 + sum(rows["accepted"]) / max(1, len(rows["accepted"])),
        "tokens_per_forward": sum(rows["committed"]) / max(1, len(rows["committed"])),
        "spec": {k: v for k, v in s.spec.items() if not isinstance(v, list)},
    }


def _forward_samples(target: Any, tokens: list[int], repeats: int, capture: list[int]) -> list[float]:
    """A plain forward of `tokens` from an empty context, repeated: the first run builds the
    graph (dropped), the others reuse it."""
    out = []
    for r in range(repeats + 1):
        target.reset()
        ms = target.time_forward(tokens, True, capture)
        if r > 0:
            out.append(ms)
    target.reset()
    return out


def _ar_samples(target: Any, prompt: list[int], repeats: int, n_batch: int) -> list[float]:
    target.reset()
    for i in range(0, len(prompt), n_batch):
        target.time_forward(prompt[i : i + n_batch], False, [])
    tok = [prompt[-1]]
    out = [target.time_forward(tok, False, []) for _ in range(repeats + 1)][1:]
    target.reset()
    return out


def _upstream(
    path: str, prompt: list[int], ns: list[int], toks: list[int], a: argparse.Namespace
) -> dict[str, Any]:
    from dflash import _core

    cfg = _core.UpstreamConfig()
    cfg.n_ctx, cfg.k_type, cfg.v_type = a.n_ctx, a.cache_type_k, a.cache_type_v
    cfg.n_gpu_layers, cfg.n_threads = a.n_gpu_layers, a.threads
    cfg.n_batch = max(a.n_batch, max(ns))
    up = _core.UpstreamModel(path, cfg)
    # every row's logits (what its verify asks for), and the last row's only (llama-bench's pp)
    fwd = {n: [up.time_decode([], toks[:n], True) for _ in range(a.repeats + 1)][1:] for n in ns}
    last = {n: [up.time_decode([], toks[:n], False) for _ in range(a.repeats + 1)][1:] for n in ns}
    _, t = up.greedy(prompt, a.repeats + 2)
    del up
    return {"forward_ms": fwd, "forward_last_ms": last, "ar_step_ms": list(t["decode_ms"])[1:]}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="dflash bench --tree-steps", description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default=None, help="target GGUF (default: --preset)")
    ap.add_argument("--preset", default="tiny-b", help="synthetic preset written when no --model is given")
    ap.add_argument("--weight-type", default=None, help="weight type for --preset")
    ap.add_argument("--draft", required=True, help="drafter GGUF (convert-draft output)")
    ap.add_argument("--budgets", default=DEFAULT_BUDGETS, help="comma-separated DDTree budgets")
    ap.add_argument("-p", "--prompt-tokens", type=int, default=64)
    ap.add_argument("--steps", type=int, default=32, help="measured DDTree steps per budget")
    ap.add_argument("--warmup-steps", type=int, default=4, help="DDTree steps run before measuring")
    ap.add_argument("-r", "--repeats", type=int, default=10, help="samples of each plain forward")
    ap.add_argument("-c", "--n-ctx", type=int, default=4096)
    ap.add_argument("-b", "--n-batch", type=int, default=512)
    ap.add_argument("-ngl", "--n-gpu-layers", type=int, default=-1)
    ap.add_argument("-t", "--threads", type=int, default=0)
    ap.add_argument("--kv-type", default="f16", help="target KV cache type (K and V)")
    ap.add_argument("-ctk", "--cache-type-k", default=None, help="target K cache type (default --kv-type)")
    ap.add_argument("-ctv", "--cache-type-v", default=None, help="target V cache type (default --kv-type)")
    ap.add_argument("--draft-kv-type", default="f16", help="draft KV cache type")
    ap.add_argument("--top-k", type=int, default=8, help="drafter candidates per depth")
    ap.add_argument("--no-chain-seed", action="store_true", help="do not seed the tree with the top-1 chain")
    add_synthetic_accept_argument(ap)
    ap.add_argument("--no-upstream", action="store_true", help="skip upstream libllama's forwards")
    ap.add_argument(
        "--scheduled-commits",
        action="store_true",
        help="commit through a graph built and scheduled per step, not the cached commit graphs",
    )
    ap.add_argument("-o", "--out", default=None, help="JSON output (default bench/results/<name>.json)")
    a = ap.parse_args(argv)
    a.cache_type_k = a.cache_type_k or a.kv_type
    a.cache_type_v = a.cache_type_v or a.kv_type
    budgets = [int(x) for x in a.budgets.split(",") if x.strip()]
    if not budgets or min(budgets) < 1:
        ap.error("--budgets: a comma-separated list of budgets >= 1")
    if a.synthetic_accept < 0:
        ap.error("--synthetic-accept must be >= 0")

    path = model_path(a)

    from dflash import _core

    n_max = max(budgets) + 1
    target = _core.TargetEngine(path, _target_config(a, n_max))
    dcfg = _core.DraftEngineConfig()
    dcfg.kv_type, dcfg.top_k = a.draft_kv_type, a.top_k
    draft = _core.DraftEngine(a.draft, target, dcfg)
    block = int(draft.hparams["block_size"])
    n_vocab = int(target.hparams["n_vocab"])
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, n_vocab, size=a.prompt_tokens).tolist()
    toks = rng.integers(0, n_vocab, size=n_max).tolist()
    # Room for every step to accept a whole block, and the widest verify after the last one.
    a.max_tokens = min((a.warmup_steps + a.steps + 1) * block + 1, a.n_ctx - a.prompt_tokens - n_max - 1)
    if a.max_tokens < a.warmup_steps + a.steps + 2:
        ap.error(f"-c {a.n_ctx} is too small for the prompt, the steps and a verify of {n_max} tokens")
    layers = [int(x) for x in draft.hparams["target_layers"]]

    rows: list[dict[str, Any]] = []
    for b in budgets:
        n = b + 1
        row: dict[str, Any] = {"budget": b, "n_tokens": n}
        row["ddtree"] = _tree_steps(target, draft, prompt, b, a)
        row["graph_shapes"] = {"target": target.graph_shapes, "draft": draft.graph_shape}
        row["forward_ms"] = _forward_samples(target, toks[:n], a.repeats, [])
        row["forward_capture_ms"] = _forward_samples(target, toks[:n], a.repeats, layers)
        rows.append(row)
        m = row["ddtree"]["median"]
        print(  # progress, in case a time limit cuts the run before the table
            f"budget {b}: draft {m['draft_ms']:.2f} tree {m['tree_ms']:.3f} verify {m['verify_ms']:.2f} "
            f"commit {m['commit_ms']:.2f} fwd(N) {_median(row['forward_ms']):.2f} ms",
            flush=True,
        )
    ar = _ar_samples(target, prompt, a.repeats, a.n_batch)
    backend = target.backend
    del draft, target

    up = None if a.no_upstream else _upstream(path, prompt, [r["n_tokens"] for r in rows], toks, a)
    print(
        f"{'budget':>6} {'N':>4} {'draft':>8} {'tree':>8} {'verify':>8} {'commit':>8} {'fwd(N)':>8} "
        f"{'fwd+cap':>8} {'up fwd':>8} {'ratio':>6}  (ms, medians; ratio = (tree+verify+commit)/fwd)",
        flush=True,
    )
    for row in rows:
        t = row["ddtree"]
        fwd = _median(row["forward_ms"])
        row["forward_ms_median"] = fwd
        row["forward_capture_ms_median"] = _median(row["forward_capture_ms"])
        if up is not None:
            row["upstream_forward_ms"] = up["forward_ms"][row["n_tokens"]]
            row["upstream_forward_ms_median"] = _median(row["upstream_forward_ms"])
            row["upstream_forward_last_logits_ms"] = up["forward_last_ms"][row["n_tokens"]]
            row["upstream_forward_last_logits_ms_median"] = _median(row["upstream_forward_last_logits_ms"])
        ratio = t["machinery_ms_median"] / fwd if fwd > 0 and t["n_full_steps"] else None
        row["tree_overhead_ratio"] = ratio
        row["tree_overhead_ratio_vs_capture"] = (
            t["machinery_ms_median"] / row["forward_capture_ms_median"]
            if row["forward_capture_ms_median"] > 0 and t["n_full_steps"]
            else None
        )
        row["meets_15pct"] = ratio is not None and ratio <= 1.15
        m = t["median"]
        print(
            f"{row['budget']:6d} {row['n_tokens']:4d} {m['draft_ms']:8.2f} {m['tree_ms']:8.3f} "
            f"{m['verify_ms']:8.2f} {m['commit_ms']:8.2f} {fwd:8.2f} {row['forward_capture_ms_median']:8.2f} "
            f"{row.get('upstream_forward_ms_median', float('nan')):8.2f} "
            f"{ratio if ratio is not None else float('nan'):6.3f}",
            flush=True,
        )
    ar_doc: dict[str, Any] = {"dflash": ar, "dflash_median": _median(ar)}
    if up is not None:
        ar_doc["upstream"] = up["ar_step_ms"]
        ar_doc["upstream_median"] = _median(up["ar_step_ms"])
    print(
        f"AR step: dflash {ar_doc['dflash_median']:.2f} ms"
        + (f", upstream {ar_doc['upstream_median']:.2f} ms" if up is not None else ""),
        flush=True,
    )

    doc = {
        "command": "dflash bench --tree-steps " + shlex.join(argv),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": _git_commit(),
        "machine": _machine(),
        "backend": backend,
        "model": {"path": path, "bytes": os.path.getsize(path)},
        "drafter": {"path": a.draft, "bytes": os.path.getsize(a.draft), "block_size": block},
        "config": dict(vars(a)),
        "criterion": "tree_overhead_ratio = median over full-budget steps of (tree_ms + verify_ms + "
        "commit_ms) / median forward_ms(N = budget + 1); issue 4 asks for <= 1.15",
        "synthetic_acceptance_length": a.synthetic_accept or None,
        "ar_step_ms": ar_doc,
        "budgets": rows,
    }
    write_result(doc, a.out, f"tree-steps-{Path(path).stem}-{int(time.time())}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
