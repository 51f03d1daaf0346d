"""``convert-draft``: z-lab DFlash drafter directory -> GGUF (arch ``dflash``)."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any

from .config import ConvertError
from .tensors import OUTTYPES
from .writer import convert_draft

PROG = "convert-draft"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Convert a z-lab DFlash drafter (config.json + safetensors) to a GGUF of arch 'dflash'.",
    )
    p.add_argument(
        "draft_dir", metavar="DRAFT_DIR", type=Path, help="drafter directory (config.json + safetensors)"
    )
    p.add_argument("-o", "--output", metavar="OUT.gguf", type=Path, required=True, help="output GGUF path")
    p.add_argument(
        "--outtype",
        choices=list(OUTTYPES),
        default="bf16",
        help="type of the 2-D weights (norms stay f32); default bf16",
    )
    p.add_argument(
        "--target",
        metavar="T.gguf",
        type=Path,
        help="target model GGUF: checks compatibility and copies its tokenizer (needed by upstream)",
    )
    p.add_argument("--force", action="store_true", help="overwrite OUT.gguf if it exists")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar, warnings or summary")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def show(message: Any, *_: Any, **__: Any) -> None:
        if not args.quiet:
            print(f"{PROG}: warning: {message}", file=sys.stderr)

    warnings.showwarning = show
    try:
        out = convert_draft(
            args.draft_dir, args.output, args.outtype, args.target, force=args.force, progress=not args.quiet
        )
    except ConvertError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    if not args.quiet:
        print(f"{PROG}: wrote {out} ({out.stat().st_size / 2**20:.1f} MiB, {args.outtype})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
