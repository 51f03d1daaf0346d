"""CLI: ``python -m dflash.synth model --preset tiny-a --type q8_0 --out x.gguf`` (or ``dflash synth``)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from .presets import PRESETS, get_preset
from .qwen35 import WEIGHT_TYPES, write_qwen35_gguf


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dflash synth", description="Write synthetic random-weight models.")
    sub = p.add_subparsers(dest="cmd", required=True)

    m = sub.add_parser("model", help="write a random-weight qwen35 GGUF")
    m.add_argument("--list", action="store_true", help="list the presets and exit")
    m.add_argument("--preset", default="tiny-a", help="model shape (see --list)")
    m.add_argument(
        "--type", dest="weight_type", choices=WEIGHT_TYPES, help="weight type (default: the preset's)"
    )
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--nextn", type=int, help="number of MTP blocks (default: the preset's)")
    m.add_argument("--out", help="output .gguf path")
    m.add_argument(
        "--random-blocks",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="fill quantised tensors with random valid blocks (default: only for >1e9 params)",
    )
    m.add_argument("--workers", type=int, help="generator processes (default: auto)")
    m.add_argument("--progress", action="store_true")

    t = sub.add_parser("tokenizer", help="train the byte-level BPE vocab (needs the `tokenizers` package)")
    t.add_argument("--vocab", type=int, default=4096, help="total vocab size, special tokens included")
    t.add_argument("--out", required=True, help="output .json path")
    return p


def _list() -> None:
    for name, p in PRESETS.items():
        c = p.config
        print(
            f"{name:12s} {p.weight_type:7s} hidden {c.hidden}, {c.n_layer} layers, ff {c.n_ff}, "
            f"heads {c.n_head}/{c.n_head_kv}x{c.head_dim}, gdn {c.n_v_heads}/{c.n_k_heads}x{c.ssm_state}, "
            f"interval {c.full_attention_interval}: {p.note}"
        )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "tokenizer":
        from .tokenizer import train_bpe

        vocab = train_bpe(args.vocab, args.out)
        print(f"wrote {args.out}: {vocab.n_vocab} tokens, {len(vocab.merges)} merges")
        return 0
    if args.list:
        _list()
        return 0
    if not args.out:
        print("error: --out is required", file=sys.stderr)
        return 2
    preset = get_preset(args.preset)
    cfg = preset.config
    if args.nextn is not None:
        cfg = dataclasses.replace(cfg, nextn_layers=args.nextn)
    t0 = time.perf_counter()
    path = write_qwen35_gguf(
        args.out,
        cfg,
        seed=args.seed,
        weight_type=args.weight_type or preset.weight_type,
        progress=args.progress,
        random_blocks=args.random_blocks,
        workers=args.workers,
    )
    print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB) in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
