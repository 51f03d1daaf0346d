"""The pair bench's fixed prompt set (``prompts.jsonl``), labelled by kind, from held-out files only.

- ``code``: an export's ``heldout_prompts.jsonl`` (the prompts its acceptance was measured on:
  held-out-file text starting at a line), or, without one, the opening lines of functions of
  held-out files (signature and the first body lines, cut at a line end).
- ``prose``: docstrings of held-out files, cut inside the text (after ``PROSE_CHARS`` characters,
  at a space), so that the continuation is English prose rather than code.

Held-out files are those of the corpus split (``corpus.is_heldout``: by path, the same on every
machine), read from this interpreter's standard library. Output lines:
``{"kind": "code"|"prose", "prompt": str, "source": str}``; the order is deterministic.

    PYTHONPATH=.:tools python -m train_pair.bench_prompts -o dflash/data/pair/prompts.jsonl \\
        [--heldout-prompts EXPORT/heldout_prompts.jsonl] [--heldout-permille 20]
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .corpus import Document, collect, is_heldout

PROSE_CHARS = 160  # docstring text kept in a prose prompt
MIN_DOCSTRING = 240  # docstrings shorter than this leave too little to continue
CODE_LINES = 6  # lines of a function kept in a code prompt built from a file
_WORD_END = re.compile(r"\w ")
_CODE_MARKS = (">>>", "(self", "---", "==", "Example")  # docstrings that are examples or tables, not prose


def heldout_documents(heldout_permille: int, root: Path | None = None) -> list[Document]:
    docs, _ = collect(root)
    return [d for d in docs if is_heldout(d.path, heldout_permille)]


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def _docstring_nodes(tree: ast.Module) -> Iterator[ast.Constant]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    yield body[0].value


def _parse(doc: Document) -> ast.Module | None:
    try:
        return ast.parse(doc.text)
    except (SyntaxError, ValueError):
        return None


def prose_prompt(doc: Document, tree: ast.Module) -> dict[str, str] | None:
    """The first long docstring of the file, from its line's start to PROSE_CHARS characters into
    the text; None when the file has none."""
    lines = doc.text.splitlines(keepends=True)
    for node in sorted(_docstring_nodes(tree), key=lambda n: n.lineno):
        text = node.value
        if not isinstance(text, str) or len(text.strip()) < MIN_DOCSTRING:
            continue
        src = "".join(lines[node.lineno - 1 :])
        body_start = src.find(text.strip()[:20])
        if body_start < 0:  # escapes in the source: the value differs from the text
            continue
        # end after a word, before the space that follows it (the next token starts with it)
        ends = [m.start() + 1 for m in _WORD_END.finditer(src, body_start, body_start + PROSE_CHARS)]
        kept = src[body_start : ends[-1]] if ends else ""
        if not kept or any(mark in kept for mark in _CODE_MARKS):
            continue
        return {"kind": "prose", "prompt": src[: ends[-1]], "source": f"{doc.path}:{node.lineno}"}
    return None


def code_prompt(doc: Document, tree: ast.Module) -> dict[str, str] | None:
    """The first function of the file with a body of more than CODE_LINES lines, cut after its
    first CODE_LINES lines (the continuation is the rest of the function)."""
    lines = doc.text.splitlines(keepends=True)
    for fn in sorted(_functions(tree), key=lambda n: n.lineno):
        end = fn.end_lineno or fn.lineno
        if end - fn.lineno < 2 * CODE_LINES:
            continue
        start = min([fn.lineno, *(d.lineno for d in fn.decorator_list)])
        return {
            "kind": "code",
            "prompt": "".join(lines[start - 1 : start - 1 + CODE_LINES]),
            "source": f"{doc.path}:{start}",
        }
    return None


def build(
    n_code: int,
    n_prose: int,
    heldout_permille: int = 20,
    heldout_prompts: Path | None = None,
    root: Path | None = None,
) -> list[dict[str, str]]:
    code: list[dict[str, str]] = []
    if heldout_prompts is not None:
        with open(heldout_prompts, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        for i, row in enumerate(rows[:n_code]):
            code.append({"kind": "code", "prompt": row["prompt"], "source": f"{heldout_prompts.name}:{i}"})
    prose: list[dict[str, str]] = []
    for doc in heldout_documents(heldout_permille, root):
        if len(prose) >= n_prose and len(code) >= n_code:
            break
        tree = _parse(doc)
        if tree is None:
            continue
        if len(prose) < n_prose and (p := prose_prompt(doc, tree)) is not None:
            prose.append(p)
        if heldout_prompts is None and len(code) < n_code and (c := code_prompt(doc, tree)) is not None:
            code.append(c)
    return code + prose


def write(rows: list[dict[str, Any]], out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m train_pair.bench_prompts", description=__doc__.splitlines()[0]
    )
    p.add_argument("-o", "--out", type=Path, required=True)
    p.add_argument("--heldout-prompts", type=Path, help="an export's heldout_prompts.jsonl (code prompts)")
    p.add_argument("--heldout-permille", type=int, default=20, help="the training run's corpus split")
    p.add_argument("--code", type=int, default=16, help="code prompts")
    p.add_argument("--prose", type=int, default=8, help="prose prompts")
    p.add_argument("--root", type=Path, help="another stdlib tree (default: this interpreter's)")
    a = p.parse_args(argv)
    rows = build(a.code, a.prose, a.heldout_permille, a.heldout_prompts, a.root)
    write(rows, a.out)
    kinds = {k: sum(r["kind"] == k for r in rows) for k in ("code", "prose")}
    print(f"wrote {a.out}: {kinds}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
