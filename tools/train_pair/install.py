"""Install a training run's export as the package's embedded default pair (``dflash/data/pair``).

    PYTHONPATH=.:tools python -m train_pair.install RUN/export [--dest dflash/data/pair]

Copies the shipped files (target and drafter GGUFs, model card, summary, held-out prompts, loss
plots), writes the bench prompt set ``prompts.jsonl`` (code prompts from the export's held-out
prompts, prose prompts from held-out files of the same corpus split; see bench_prompts.py) and
refuses a pair over ``MAX_BYTES``. Files of an earlier pair that the new export lacks (a plot) are
removed, so the folder always holds one run's files.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from . import bench_prompts

REQUIRED = ("target-q8_0.gguf", "drafter-q8_0.gguf", "summary.json", "heldout_prompts.jsonl")
OPTIONAL = ("MODEL_CARD.md", "target_loss.png", "drafter_loss.png")
PROMPTS = "prompts.jsonl"
MAX_BYTES = 40 * 10**6  # package data budget for the pair
DEFAULT_DEST = Path(__file__).resolve().parents[2] / "dflash" / "data" / "pair"


class InstallError(RuntimeError):
    pass


def install(export: Path, dest: Path = DEFAULT_DEST, n_code: int = 16, n_prose: int = 8) -> list[Path]:
    """Copy the export's files into ``dest``; returns the files written."""
    missing = [f for f in REQUIRED if not (export / f).is_file()]
    if missing:
        raise InstallError(f"{export} is not a train_pair export: missing {', '.join(missing)}")
    files = [export / f for f in (*REQUIRED, *OPTIONAL) if (export / f).is_file()]
    total = sum(f.stat().st_size for f in files)
    if total > MAX_BYTES:
        raise InstallError(
            f"the pair is {total / 1e6:.1f} MB, over the {MAX_BYTES / 1e6:.0f} MB package budget"
        )
    summary = json.loads((export / "summary.json").read_text(encoding="utf-8"))
    corpus = summary.get("corpus", {})
    permille = int(corpus.get("heldout_permille", 20))
    if corpus.get("python") and corpus["python"] != ".".join(map(str, sys.version_info[:3])):
        print(
            f"[install] note: the corpus was Python {corpus['python']}'s standard library; prose prompts "
            "come from this interpreter's copy of the same held-out files",
            flush=True,
        )
    dest.mkdir(parents=True, exist_ok=True)
    for stale in (*REQUIRED, *OPTIONAL):
        if not (export / stale).is_file() and (dest / stale).exists():
            (dest / stale).unlink()
    written = []
    for f in files:
        shutil.copyfile(f, dest / f.name)
        written.append(dest / f.name)
    rows = bench_prompts.build(n_code, n_prose, permille, export / "heldout_prompts.jsonl")
    written.append(bench_prompts.write(rows, dest / PROMPTS))
    return written


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m train_pair.install", description=__doc__.splitlines()[0])
    p.add_argument("export", type=Path, help="a run's export/ folder")
    p.add_argument("--dest", type=Path, default=DEFAULT_DEST, help=f"default: {DEFAULT_DEST}")
    p.add_argument("--code", type=int, default=16, help="code prompts in prompts.jsonl")
    p.add_argument("--prose", type=int, default=8, help="prose prompts in prompts.jsonl")
    a = p.parse_args(argv)
    try:
        written = install(a.export, a.dest, a.code, a.prose)
    except InstallError as e:
        print(f"install: error: {e}", file=sys.stderr)
        return 2
    for f in written:
        print(f"{f.stat().st_size:>12,}  {f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
