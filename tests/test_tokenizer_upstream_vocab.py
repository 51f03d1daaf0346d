"""Tokenizer: upstream's own vocab test vectors pass exactly (issue 2, acceptance criterion).

Upstream's tests/test-tokenizer-0.cpp loads `models/ggml-vocab-<name>.gguf` vocab-only and checks
`common_tokenize(ctx, text, add_special=false, parse_special=false)` against each `.out` line. We
do the same through `_core.Vocab`. The files come from the pinned sdist (dflash.vendor_files);
the qwen2 case is required and fails (never skips) when the files cannot be found.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from dflash import _core
from dflash.vendor_files import (
    VOCAB_TEST_SEPARATOR,
    VendorFileError,
    parse_vocab_tests,
    upstream_files,
    vocab_test_files,
)

REPO = Path(__file__).resolve().parent.parent


def _check_vocab(name: str, download: bool) -> int:
    files = vocab_test_files(name, REPO, download=download)
    cases = parse_vocab_tests(files.inp, files.out)
    assert len(cases) >= 40, f"only {len(cases)} cases parsed from {files.inp}"
    vocab = _core.Vocab(str(files.gguf))
    failures = []
    for text, expected in cases.items():
        got = list(vocab.tokenize(text, add_special=False, parse_special=False))
        if got != expected:
            failures.append(f"{text!r}: expected {expected}, got {got}")
    assert not failures, f"{len(failures)}/{len(cases)} {name} cases differ:\n" + "\n".join(failures)
    # Byte-level BPE loses nothing: the expected ids decode back to the text.
    for text, expected in cases.items():
        assert vocab.detokenize(expected).decode("utf-8") == text
    return len(cases)


def test_qwen2_vocab_upstream_cases_exact() -> None:
    # Required: a VendorFileError here is a failure, not a skip.
    n = _check_vocab("qwen2", download=True)
    assert n == 46


def test_qwen35_vocab_upstream_cases_exact() -> None:
    try:
        vocab_test_files("qwen35", REPO, download=False)
    except VendorFileError as e:
        pytest.skip(f"ggml-vocab-qwen35 not in the upstream sources: {e}")
    _check_vocab("qwen35", download=False)


def test_upstream_cases_cover_hard_text() -> None:
    # The vectors must exercise what matters: empty text, whitespace runs, non-ASCII, digits.
    files = vocab_test_files("qwen2", REPO)
    cases = parse_vocab_tests(files.inp, files.out)
    assert "" in cases and cases[""] == []
    assert any("\n" in t for t in cases)
    assert any(any(ord(c) > 0xFFFF for c in t) for t in cases)  # astral-plane emoji
    assert any(any(0x4E00 <= ord(c) <= 0x9FFF for c in t) for t in cases)  # CJK
    assert any(t.isdigit() and len(t) > 3 for t in cases)


# ---- the parser and the file lookup, on small made-up inputs ---------------------------------


def test_parse_vocab_tests_format(tmp_path: Path) -> None:
    sep = VOCAB_TEST_SEPARATOR
    inp = tmp_path / "v.inp"
    out = tmp_path / "v.out"
    inp.write_bytes(("a b" + sep + "" + sep + "\n" + sep + "é" + sep + "a b" + sep).encode())
    out.write_bytes(b" 1 2\n\n 7\n 3 4 \n 5 6\n")
    cases = parse_vocab_tests(inp, out)
    # Empty text and a text that is one newline are cases; a repeated text keeps the last ids.
    assert cases == {"a b": [5, 6], "": [], "\n": [7], "é": [3, 4]}
    out.write_bytes(b"1\n2\n")
    with pytest.raises(VendorFileError, match="cases but"):
        parse_vocab_tests(inp, out)


def _fake_repo(root: Path, sha: str) -> None:
    (root / "vendor").mkdir(parents=True)
    (root / "vendor" / "manifest.toml").write_text(
        f'[upstream]\npackage = "llama-cpp-python"\nversion = "0.3.36"\n'
        f'sdist = "llama_cpp_python-0.3.36.tar.gz"\nsha256 = "{sha}"\nsubdir = "vendor/llama.cpp"\n'
    )


def _fake_sdist(path: Path, files: dict[str, bytes]) -> str:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"llama_cpp_python-0.3.36/vendor/llama.cpp/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_lookup_order_and_sha_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DFLASH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(Path, "home", lambda: tmp_path / "home")
    monkeypatch.delenv("DFLASH_VENDOR_SRC", raising=False)
    sdist = tmp_path / "llama_cpp_python-0.3.36.tar.gz"
    sha = _fake_sdist(sdist, {"models/x.inp": b"from-sdist"})
    monkeypatch.setenv("DFLASH_VENDOR_SDIST", str(sdist))

    good = tmp_path / "good"
    _fake_repo(good, sha)
    got = upstream_files(["models/x.inp"], good, download=False)
    assert got["models/x.inp"].read_bytes() == b"from-sdist"

    # DFLASH_VENDOR_SRC wins over the sdist.
    tree = tmp_path / "tree"
    (tree / "models").mkdir(parents=True)
    (tree / "models" / "x.inp").write_bytes(b"from-tree")
    monkeypatch.setenv("DFLASH_VENDOR_SRC", str(tree))
    assert upstream_files(["models/x.inp"], good, download=False)["models/x.inp"].read_bytes() == b"from-tree"
    monkeypatch.delenv("DFLASH_VENDOR_SRC")

    # A tarball whose sha256 differs from the pin is refused, and the error says so.
    bad = tmp_path / "bad"
    _fake_repo(bad, "0" * 64)
    monkeypatch.setenv("DFLASH_CACHE", str(tmp_path / "cache2"))
    with pytest.raises(VendorFileError, match="sha256"):
        upstream_files(["models/x.inp"], bad, download=False)

    # A member the sdist lacks is an error too.
    monkeypatch.setenv("DFLASH_CACHE", str(tmp_path / "cache3"))
    with pytest.raises(VendorFileError, match="no member"):
        upstream_files(["models/missing.gguf"], good, download=False)
