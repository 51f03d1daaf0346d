"""`dflash` command line: generate, info, synth, bench."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", default=None, help="target GGUF (default: the embedded default model)")
    p.add_argument(
        "-md",
        "--draft",
        default=None,
        help="drafter GGUF or z-lab directory (default: the packaged drafter, with the default model only)",
    )
    p.add_argument("--no-draft", action="store_true", help="no drafter, not even the packaged one")
    p.add_argument("--max-draft", type=int, default=15, help="chain DFlash: draft tokens per step")
    p.add_argument("--budget", type=int, default=0, help="DDTree draft nodes per step (0: chain DFlash)")
    p.add_argument(
        "--batch-invariant",
        action="store_true",
        help="greedy speculative output equal to decoding bit for bit on the GPU too (slower)",
    )
    p.add_argument("-c", "--n-ctx", type=int, default=4096)
    p.add_argument("--kv-type", default="f16", help="KV cache type: f16, q8_0, q4_0, bf16, f32")
    p.add_argument("-ngl", "--n-gpu-layers", type=int, default=-1, help="0 = CPU only")
    p.add_argument("-t", "--threads", type=int, default=0)
    p.add_argument("-v", "--verbose", action="store_true")


def _engine(a: argparse.Namespace) -> Any:
    from dflash import Engine

    return Engine(
        model_path=a.model,
        draft_path=None if a.no_draft else a.draft,
        default_draft=not a.no_draft,
        max_draft=a.max_draft,
        budget=a.budget,
        batch_invariant=a.batch_invariant,
        n_ctx=a.n_ctx,
        kv_type=a.kv_type,
        n_gpu_layers=a.n_gpu_layers,
        n_threads=a.threads,
        verbose=a.verbose,
        progress=True,
    )


def cmd_generate(a: argparse.Namespace) -> int:
    eng = _engine(a)
    kw: dict[str, Any] = dict(
        max_tokens=a.max_tokens,
        temperature=a.temperature,
        top_p=a.top_p,
        top_k=a.top_k,
        seed=a.seed,
        stream=True,
    )
    if a.chat:
        chunks = eng.create_chat_completion([{"role": "user", "content": a.prompt}], **kw)
    else:
        chunks = eng.create_completion(a.prompt, **kw)
    last: dict[str, Any] = {}
    if not a.chat:
        sys.stdout.write(a.prompt)
    for c in chunks:
        ch = c["choices"][0]
        piece = ch["delta"].get("content", "") if a.chat else ch["text"]
        sys.stdout.write(piece or "")
        sys.stdout.flush()
        last = c
    t = last.get("timings", {})
    sys.stdout.write("\n")
    spec = f", acceptance length {t.get('acceptance_length', 0):.2f}" if eng.speculative else ""
    print(
        f"[{eng.backend}] prompt {t.get('prompt_n', 0)} tokens at {t.get('prompt_per_second', 0):.1f} t/s, "
        f"generated {t.get('predicted_n', 0)} tokens at {t.get('predicted_per_second', 0):.1f} t/s{spec}",
        file=sys.stderr,
    )
    return 0


def cmd_info(a: argparse.Namespace) -> int:
    eng = _engine(a)
    print(
        json.dumps(
            {
                "model": eng.model_path,
                "draft": eng.draft_path,
                "backend": eng.backend,
                "hparams": eng.hparams,
                "memory_plan": eng.memory_plan,
            },
            indent=2,
        )
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="dflash", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)

    g = sub.add_parser("generate", help="generate text from a prompt")
    g.add_argument("prompt", nargs="?", default="def fibonacci(n):")
    _engine_args(g)
    g.add_argument("-n", "--max-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=0.95)
    g.add_argument("--top-k", type=int, default=40)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.set_defaults(fn=cmd_generate)

    i = sub.add_parser("info", help="print a model's shape and memory plan")
    _engine_args(i)
    i.set_defaults(fn=cmd_info)

    s = sub.add_parser("synth", help="write synthetic models (see `dflash synth -h`)", add_help=False)
    s.add_argument("rest", nargs=argparse.REMAINDER)
    s.set_defaults(fn=lambda a: __import__("dflash.synth.__main__", fromlist=["main"]).main(a.rest))

    b = sub.add_parser(
        "bench", help="benchmark dflash against upstream llama.cpp (see `dflash bench -h`)", add_help=False
    )
    b.add_argument("rest", nargs=argparse.REMAINDER)
    b.set_defaults(fn=lambda a: __import__("dflash.bench", fromlist=["main"]).main(a.rest))

    args = sys.argv[1:] if argv is None else argv
    # bench and synth have their own parsers: hand them the rest of the line as it is
    # (argparse.REMAINDER drops a remainder that starts with an option).
    if args and args[0] in ("bench", "synth"):
        if args[0] == "bench":
            from dflash.bench import main as bench_main

            return int(bench_main(args[1:]) or 0)
        from dflash.synth.__main__ import main as synth_main

        return int(synth_main(args[1:]) or 0)
    a = ap.parse_args(args)
    try:
        return int(a.fn(a) or 0)
    except Exception as e:  # noqa: BLE001 - one clear line for the user, not a traceback
        from dflash.errors import DflashError

        if isinstance(e, DflashError):
            print(f"dflash: error: {e}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
