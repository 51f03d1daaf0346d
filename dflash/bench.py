"""`dflash bench`: prefill and decode speed of dflash and of upstream llama.cpp (libllama built
from the same vendor tree and linked into the same process, so both use the same ggml build)
on the same GGUF, in the same run. Results go to a JSON file with the command, machine,
commit and raw samples (REFERENCE.md section 8).

Decode t/s = (generated - 1) / (time from the first generated token to the last);
prefill t/s = prompt tokens / time to the first token's logits. Median over --repeats runs
after one warm-up run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from dflash import bench_upstream


def _git_commit() -> str:
    if os.environ.get("DFLASH_COMMIT"):  # the GPU machine's copy of the tree has no git metadata
        return os.environ["DFLASH_COMMIT"]
    try:
        root = Path(__file__).resolve().parent.parent
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
        sha = out.stdout.strip()
        return sha if out.returncode == 0 and len(sha) == 40 else "unknown"
    except OSError:
        return "unknown"


def _machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "hostname": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
    }
    try:
        q = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        if q.returncode == 0:
            info["gpu"] = q.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return info


def _ours(
    path: str, kv: str, prompt: list[int], n_gen: int, repeats: int, a: argparse.Namespace
) -> dict[str, Any]:
    from dflash import _core

    cfg = _core.EngineConfig()
    cfg.n_ctx, cfg.k_type, cfg.v_type = a.n_ctx, kv, kv
    cfg.n_gpu_layers, cfg.n_threads, cfg.n_batch = a.n_gpu_layers, a.threads, a.n_batch
    eng = _core.TargetEngine(path, cfg)
    pp, tg = [], []
    for r in range(repeats + 1):
        st = eng.generate(prompt, n_gen, 0.0, 0, 1.0, 0, [], lambda t: True)
        if r == 0:
            continue  # warm-up
        pp.append(len(prompt) / (st.prompt_ms / 1000))
        tg.append((st.n_generated - 1) / (st.predict_ms / 1000))
    out = {"engine": "dflash", "backend": eng.backend, "memory_plan": dict(eng.memory_plan)}
    del eng
    return {**out, "prefill_tps": pp, "decode_tps": tg}


def _chain(
    path: str, kv: str, prompt: list[int], n_gen: int, repeats: int, a: argparse.Namespace, budget: int = 0
) -> dict[str, Any]:
    """Chain DFlash with the given drafter. With --synthetic-accept L (bench only, labelled in the
    JSON) each verify accepts exactly L-1 drafts: engine speed separated from draft quality, like
    upstream's --spec-synth-len."""
    from dflash import _core

    cfg = _core.EngineConfig()
    cfg.n_ctx, cfg.k_type, cfg.v_type = a.n_ctx, kv, kv
    cfg.n_gpu_layers, cfg.n_threads, cfg.n_batch = a.n_gpu_layers, a.threads, a.n_batch
    cfg.n_verify_max = max(a.max_draft, budget) + 1
    cfg.batch_invariant = a.batch_invariant
    eng = _core.TargetEngine(path, cfg)
    dcfg = _core.DraftEngineConfig()
    draft = _core.DraftEngine(a.draft, eng, dcfg)
    # Bench only: exactly L-1 drafts accepted per step whatever the target says (the output is
    # not the model's), like upstream's --spec-synth-len. Drafts rewritten from an autoregressive
    # run would not do on a GPU: random weights give near-ties everywhere, and the verify's batched
    # kernels round them differently from single-token decoding, so acceptance collapses.
    forced = a.synthetic_accept - 1 if a.synthetic_accept else -1
    pp, tg, al = [], [], []
    spec: dict[str, Any] = {}
    for r in range(repeats + 1):
        st, spec = _core.generate_chain(
            eng,
            draft,
            prompt,
            n_gen,
            0.0,
            0,
            1.0,
            0,
            [],
            lambda t: True,
            a.max_draft,
            None,
            budget,
            forced_accept=forced,
        )
        if r == 0:
            continue
        pp.append(len(prompt) / (st.prompt_ms / 1000))
        tg.append((st.n_generated - 1) / (st.predict_ms / 1000))
        al.append(spec["acceptance_length"])
    out: dict[str, Any] = {
        "engine": f"dflash-ddtree-b{budget}" if budget else "dflash-chain",
        "backend": eng.backend,
        "drafter": a.draft,
    }
    if a.synthetic_accept:
        out["synthetic_acceptance_length"] = a.synthetic_accept
    if a.batch_invariant:
        out["batch_invariant"] = True
    out["last_run"] = {
        k: spec[k]
        for k in (
            "drafts",
            "draft_tokens",
            "accepted",
            "target_forwards",
            "draft_ms",
            "verify_ms",
            "commit_ms",
        )
    }
    return {**out, "prefill_tps": pp, "decode_tps": tg, "acceptance_length": al}


def _upstream(
    path: str, kv: str, prompt: list[int], n_gen: int, repeats: int, a: argparse.Namespace
) -> dict[str, Any]:
    from dflash import _core

    cfg = _core.UpstreamConfig()
    cfg.n_ctx, cfg.k_type, cfg.v_type = a.n_ctx, kv, kv
    cfg.n_gpu_layers, cfg.n_threads, cfg.n_batch = a.n_gpu_layers, a.threads, a.n_batch
    up = _core.UpstreamModel(path, cfg)
    pp, tg = [], []
    for r in range(repeats + 1):
        _, t = up.greedy(prompt, n_gen)
        if r == 0:
            continue
        pp.append(len(prompt) / (t["prefill_ms"] / 1000))
        tg.append(len(t["decode_ms"]) / (sum(t["decode_ms"]) / 1000))
    del up
    return {"engine": "upstream-libllama", "prefill_tps": pp, "decode_tps": tg}


def _llama_bench(binary: str, path: str, kv: str, a: argparse.Namespace) -> dict[str, Any]:
    """Upstream's own llama-bench (pp/tg) on the same file: the canonical upstream figure."""
    cmd = [
        binary,
        "-m",
        path,
        "-p",
        str(a.prompt_tokens),
        "-n",
        str(a.gen_tokens),
        "-r",
        str(a.repeats),
        "-ctk",
        kv,
        "-ctv",
        kv,
        "-fa",
        "1",
        "-ngl",
        "999" if a.n_gpu_layers != 0 else "0",
        "-o",
        "json",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return {"engine": "upstream-llama-bench", "error": r.stderr[-2000:], "command": shlex.join(cmd)}
    rows = json.loads(r.stdout)
    res: dict[str, Any] = {"engine": "upstream-llama-bench", "command": shlex.join(cmd)}
    for row in rows:
        key = "prefill_tps" if row.get("n_prompt", 0) > 0 else "decode_tps"
        res[key] = [float(x) for x in row.get("samples_ts", [row.get("avg_ts", 0.0)])]
    return res


def model_path(a: argparse.Namespace) -> str:
    """-m, or the synthetic --preset model (--weight-type) written once into $TMPDIR."""
    if a.model is not None:
        return str(a.model)
    from dflash.synth import get_preset, write_qwen35_gguf

    pre = get_preset(a.preset)
    wt = a.weight_type or pre.weight_type
    path = str(Path(os.environ.get("TMPDIR", "/tmp")) / f"dflash-bench-{a.preset}-{wt}.gguf")
    if not Path(path).exists():
        write_qwen35_gguf(path, pre.config, seed=0, weight_type=wt, progress=True)
    return path


def add_synthetic_accept_argument(ap: argparse.ArgumentParser) -> None:
    """--synthetic-accept L, shared by the chain/DDTree benches and --tree-steps."""
    ap.add_argument(
        "--synthetic-accept",
        type=int,
        default=0,
        help="BENCH ONLY: every step accepts exactly L-1 drafts (a DDTree: its top-1 path that deep) "
        "whatever the target says (acceptance length L; the output is not the model's); measures "
        "engine speed apart from draft quality",
    )


def write_result(doc: dict[str, Any], out: str | None, default_name: str) -> Path:
    """Writes a bench JSON (to bench/results/<default_name> unless `out` is given) and says where."""
    path = Path(out) if out else Path("bench/results") / default_name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2))
    print(f"wrote {path}")
    return path


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else 0.0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if any(x == "--pair" or x.startswith("--pair=") for x in args):
        from dflash.bench_pair import main as pair_main

        return pair_main(args)
    if "--matmul" in args:
        from dflash.bench_matmul import main as matmul_main

        return matmul_main([x for x in args if x != "--matmul"])
    if "--tree-steps" in args:
        from dflash.bench_tree import main as tree_main

        return tree_main([x for x in args if x != "--tree-steps"])
    ap = argparse.ArgumentParser(prog="dflash bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree-steps", action="store_true", help="DDTree step cost per budget (bench_tree)")
    ap.add_argument("--matmul", action="store_true", help="one matmul per column count (bench_matmul)")
    ap.add_argument(
        "--pair",
        nargs="?",
        metavar="DIR",
        help="bench the trained target + drafter pair on its held-out prompts instead (dflash.bench_pair; "
        "see `dflash bench --pair -h`)",
    )
    ap.add_argument("-m", "--model", default=None, help="GGUF to bench (default: --preset)")
    ap.add_argument("--preset", default="tiny-b", help="synthetic preset written when no --model is given")
    ap.add_argument("--weight-type", default=None, help="weight type for --preset")
    ap.add_argument("--kv-types", default="f16", help="comma-separated KV types")
    ap.add_argument("-p", "--prompt-tokens", type=int, default=512)
    ap.add_argument("-n", "--gen-tokens", type=int, default=128)
    ap.add_argument("-r", "--repeats", type=int, default=3)
    ap.add_argument("-c", "--n-ctx", type=int, default=4096)
    ap.add_argument("-b", "--n-batch", type=int, default=512)
    ap.add_argument("-ngl", "--n-gpu-layers", type=int, default=-1)
    ap.add_argument("-t", "--threads", type=int, default=0)
    ap.add_argument("--no-upstream", action="store_true", help="skip the in-process upstream baseline")
    ap.add_argument("--draft", default=None, help="drafter GGUF: also bench chain DFlash")
    ap.add_argument("--max-draft", type=int, default=15, help="draft tokens verified per step")
    ap.add_argument("--budgets", default="", help="comma-separated DDTree budgets to sweep (with --draft)")
    add_synthetic_accept_argument(ap)
    ap.add_argument(
        "--batch-invariant",
        action="store_true",
        help="batch-invariant mode: chain/DDTree verifies compute each token as a decode step does "
        "(ggml_ext/BATCH_INVARIANCE.md)",
    )
    ap.add_argument("--llama-bench", default=None, help="path of upstream's llama-bench to run as well")
    bench_upstream.add_arguments(ap)  # --llama-server, --synth-len
    ap.add_argument("-o", "--out", default=None, help="JSON output (default bench/results/<name>.json)")
    a = ap.parse_args(argv)
    bench_upstream.check_args(a, ap)

    path = model_path(a)

    from dflash import _core

    n_vocab = _core.Vocab(path).n_tokens
    prompt = np.random.default_rng(0).integers(0, n_vocab, size=a.prompt_tokens).tolist()
    results = []
    for kv in a.kv_types.split(","):
        runs = [_ours(path, kv, prompt, a.gen_tokens, a.repeats, a)]
        if a.draft:
            runs.append(_chain(path, kv, prompt, a.gen_tokens, a.repeats, a))
            for b in (int(x) for x in a.budgets.split(",") if x.strip()):
                runs.append(_chain(path, kv, prompt, a.gen_tokens, a.repeats, a, budget=b))
        if not a.no_upstream:
            runs.append(_upstream(path, kv, prompt, a.gen_tokens, a.repeats, a))
        if a.llama_bench:
            runs.append(_llama_bench(a.llama_bench, path, kv, a))
        if a.llama_server:
            runs.extend(bench_upstream.server_runs(path, kv, prompt, a, runs))
        for r in runs:
            r["kv_type"] = kv
            r["prefill_tps_median"] = _median(r.get("prefill_tps", []))
            r["decode_tps_median"] = _median(r.get("decode_tps", []))
            print(
                f"{r['engine']:>22} kv={kv:5} prefill {r['prefill_tps_median']:9.1f} t/s   "
                f"decode {r['decode_tps_median']:8.2f} t/s",
                flush=True,
            )
        results.extend(runs)

    doc = {
        "command": "dflash bench " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": _git_commit(),
        "machine": _machine(),
        "model": {"path": path, "bytes": os.path.getsize(path)},
        "config": {k: v for k, v in vars(a).items()},
        "results": results,
    }
    write_result(doc, a.out, f"bench-{Path(path).stem}-{int(time.time())}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
