"""The training corpus: this interpreter's standard-library sources, tokenised with the committed BPE.

What: every ``*.py`` file under ``sysconfig.get_paths()["stdlib"]`` (recursively, tests and
``pydoc_data/topics.py``'s prose included), minus ``site-packages``/``dist-packages`` and files
that are not valid UTF-8, sorted by relative path. Each file is one document; documents end with
``<|endoftext|>``. The split is by file and depends on the path only: ``sha256(path) % 1000 <
heldout_permille`` is held out, so the same files are held out on every machine with that file.

Tokeniser: the committed ``dflash/data/bpe-4096.json``, through dflash's own ``_core.Vocab`` (the
engine that will run the model) when the native module imports, else the ``tokenizers`` package
built from the same vocab (the GPU image has it, not our native build); ``check=True`` encodes
every file with both and records disagreements. Output: ``train.npy``/``heldout.npy`` (uint16) and
``manifest.json`` listing every file with its bytes, tokens and split.
"""

from __future__ import annotations

import hashlib
import json
import platform
import sysconfig
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dflash.synth.tokenizer import ENDOFTEXT, QWEN35_SPLIT_REGEX, default_vocab_path, load_vocab

Encoder = Callable[[Sequence[str]], list[list[int]]]
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}


@dataclass(frozen=True)
class Document:
    path: str  # relative to the stdlib root, POSIX
    text: str
    n_bytes: int


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def collect(root: Path | None = None, max_files: int = 0) -> tuple[list[Document], list[dict[str, str]]]:
    """(documents, skipped files with the reason), in relative-path order."""
    root = root or stdlib_root()
    files = sorted(
        (p for p in root.rglob("*.py") if p.is_file() and not _SKIP_DIRS & set(p.relative_to(root).parts)),
        key=lambda p: p.relative_to(root).as_posix(),
    )
    docs: list[Document] = []
    skipped: list[dict[str, str]] = []
    for p in files:
        rel = p.relative_to(root).as_posix()
        raw = p.read_bytes()
        try:
            docs.append(Document(rel, raw.decode("utf-8"), len(raw)))
        except UnicodeDecodeError as e:
            skipped.append({"path": rel, "reason": f"not UTF-8 ({e.reason})"})
        if max_files and len(docs) >= max_files:
            break
    return docs, skipped


def is_heldout(path: str, heldout_permille: int) -> bool:
    return int.from_bytes(hashlib.sha256(path.encode()).digest()[:8], "little") % 1000 < heldout_permille


def core_encoder() -> Encoder:
    """dflash's tokenizer on a throwaway GGUF that carries the committed vocab."""
    from dflash import _core
    from dflash.synth import get_preset, write_qwen35_gguf

    with tempfile.TemporaryDirectory() as d:
        # _core.Vocab reads a model file's header; the smallest preset carries the same vocab
        vocab = _core.Vocab(str(write_qwen35_gguf(Path(d) / "vocab.gguf", get_preset("tiny-a").config)))
    return lambda texts: [vocab.tokenize(t, False, False) for t in texts]


def tokenizers_encoder() -> Encoder:
    """The same BPE through the ``tokenizers`` package (no added tokens: specials stay plain text)."""
    import tokenizers as tk

    v = load_vocab()
    tok = tk.Tokenizer(
        tk.models.BPE(
            vocab={t: i for i, t in enumerate(v.tokens)},
            merges=[(a, b) for a, b in (m.split(" ", 1) for m in v.merges)],
        )
    )
    tok.pre_tokenizer = tk.pre_tokenizers.Sequence(
        [
            tk.pre_tokenizers.Split(tk.Regex(QWEN35_SPLIT_REGEX), behavior="isolated"),
            tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    return lambda texts: [e.ids for e in tok.encode_batch(list(texts), add_special_tokens=False)]


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the vocab's token strings -> bytes."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = dict(zip(keep, keep, strict=True))
    extra = (b for b in range(256) if b not in chars)
    chars.update({b: 256 + i for i, b in enumerate(extra)})
    return {chr(c): b for b, c in chars.items()}


def decode(ids: Sequence[int]) -> str:
    """Token ids -> text (special tokens as their text; invalid UTF-8 replaced)."""
    v, table = load_vocab(), _byte_decoder()
    toks, n_bpe = v.all_tokens, len(v.tokens)
    out = bytearray()
    for i in ids:
        t = toks[int(i)]
        out += t.encode() if int(i) >= n_bpe else bytes(table[ch] for ch in t)
    return out.decode("utf-8", errors="replace")


ENCODERS: dict[str, Callable[[], Encoder]] = {"core": core_encoder, "tokenizers": tokenizers_encoder}


def pick_encoder(name: str) -> tuple[str, Encoder]:
    if name != "auto":
        return name, ENCODERS[name]()
    for n, make in ENCODERS.items():
        try:
            return n, make()
        except ImportError:
            continue
    raise RuntimeError("no tokenizer: build dflash's native module or `pip install tokenizers`")


def build(
    out: Path,
    tokenizer: str = "auto",
    heldout_permille: int = 20,
    max_files: int = 0,
    check: bool = False,
    root: Path | None = None,
) -> dict[str, object]:
    """Write train.npy, heldout.npy and manifest.json under ``out``; returns the manifest."""
    t0 = time.time()
    out.mkdir(parents=True, exist_ok=True)
    docs, skipped = collect(root, max_files)
    backend, encode = pick_encoder(tokenizer)
    ids = encode([d.text for d in docs])
    mismatches: list[str] | None = None
    other = "tokenizers" if backend == "core" else "core"
    if check:
        ref = ENCODERS[other]()([d.text for d in docs])
        mismatches = [d.path for d, a, b in zip(docs, ids, ref, strict=True) if a != b]
    eot = load_vocab().token_id(ENDOFTEXT)
    parts: dict[str, list[np.ndarray]] = {"train": [], "heldout": []}
    files: list[dict[str, Any]] = []
    for d, seq in zip(docs, ids, strict=True):
        split = "heldout" if is_heldout(d.path, heldout_permille) else "train"
        parts[split].append(np.asarray([*seq, eot], dtype=np.uint16))
        files.append({"path": d.path, "bytes": d.n_bytes, "tokens": len(seq), "split": split})
    totals: dict[str, dict[str, int]] = {}
    for split, arrs in parts.items():
        arr = np.concatenate(arrs) if arrs else np.zeros(0, np.uint16)
        np.save(out / f"{split}.npy", arr)
        sel = [f for f in files if f["split"] == split]
        totals[split] = {
            "files": len(sel),
            "bytes": sum(int(f["bytes"]) for f in sel),
            "tokens": int(arr.size),  # documents + one <|endoftext|> each
        }
    manifest: dict[str, object] = {
        "description": "*.py files of the Python standard library (recursive; no site-packages), "
        "one document each, <|endoftext|> after each; split by sha256(path) % 1000 < heldout_permille",
        "python": platform.python_version(),
        "source": "interpreter" if root is None else "given root",
        "implementation": platform.python_implementation(),
        "stdlib_root": str(root or stdlib_root()),
        "tokenizer": {
            "vocab": default_vocab_path().name,
            "vocab_sha256": hashlib.sha256(default_vocab_path().read_bytes()).hexdigest(),
            "backend": backend,
            "checked_against": other if check else None,
            "mismatched_files": mismatches,
        },
        "heldout_permille": heldout_permille,
        "totals": totals,
        "skipped": skipped,
        "seconds": round(time.time() - t0, 1),
        "files": files,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return manifest


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m train_pair.corpus", description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--tokenizer", choices=["auto", *ENCODERS], default="auto")
    p.add_argument("--heldout-permille", type=int, default=20)
    p.add_argument("--max-files", type=int, default=0, help="first N files only (tests)")
    p.add_argument("--check", action="store_true", help="also encode with the other backend and compare")
    p.add_argument("--root", type=Path, help="another stdlib tree (default: this interpreter's)")
    a = p.parse_args(argv)
    m = build(a.out, a.tokenizer, a.heldout_permille, a.max_files, a.check, a.root)
    print(json.dumps({k: m[k] for k in ("python", "tokenizer", "totals", "seconds")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
