"""Upstream llama.cpp's own DFlash decoding (`llama-speculative-simple --spec-type draft-dflash`,
built here from the same vendor tree) on our synthetic target and a convert-draft drafter: it
loads both, really drafts, and its greedy text is our engine's greedy autoregressive text.

The binary is built by the session fixture when it is not cached yet (minutes on 2 cores; the
time is shown in the terminal summary): this test never skips.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from dflash import _core
from dflash.upstream_spec import generated_text, parse_log
from dflash.upstream_tools import run_speculative_simple, upstream_binary

REPO = Path(__file__).resolve().parents[1]
TEST_NGL = int(os.environ.get("DFLASH_TEST_NGL", "0"))
PROMPT = "def fibonacci(n):"
N = 32


@pytest.fixture(scope="session")
def spec_simple() -> Path:
    # Builds it when not cached; conftest's terminal summary prints BUILD_SECONDS.
    return upstream_binary("llama-speculative-simple", source_root=REPO)


def _greedy_pieces(target: Path, prompt: str, n: int) -> tuple[list[int], bytes]:
    """Our engine's greedy autoregressive tokens, cut at the first end-of-generation token as
    upstream stops there, and their pieces as upstream prints them (special tokens as text)."""
    cfg = _core.EngineConfig()
    cfg.n_ctx, cfg.n_gpu_layers, cfg.n_threads = 512, TEST_NGL, 2
    eng = _core.TargetEngine(str(target), cfg)
    vocab = _core.Vocab(str(target))
    out: list[int] = []
    prompt_tokens = list(vocab.tokenize(prompt, True, True))  # as upstream's common_tokenize
    eng.generate(prompt_tokens, n, 0.0, 0, 1.0, 0, [], lambda t: out.append(t) or True)
    eog = set(vocab.eog_tokens())
    cut = next((i for i, t in enumerate(out) if t in eog), len(out))
    return out[:cut], b"".join(vocab.token_to_piece(t, True) for t in out[:cut])


def test_upstream_draft_dflash_drafts_and_matches_our_greedy(spec_simple: Path, drafter_pair: Any) -> None:
    target, draft = drafter_pair(seed=1)
    r = run_speculative_simple(spec_simple, target, draft, PROMPT, N, ngl=TEST_NGL, n_ctx=512, threads=2)
    assert r["returncode"] == 0
    assert r["n_drafted"] > 0, "upstream loaded the drafter but never drafted"
    assert 0 <= r["n_accept"] <= r["n_drafted"]
    assert r["decode_tps"] > 0 and r["acceptance_length"] >= 1.0
    # Upstream stops once it has more than -n tokens, so it makes N + 1 (fewer at an end token).
    # Its greedy speculative output must be the target's greedy output: compared as the exact
    # bytes it prints, against our autoregressive tokens' pieces.
    assert r["prompt_echo_found"], r["generated"][:200]
    tokens, ours = _greedy_pieces(target, PROMPT, N + 1)
    assert r["n_predict"] == len(tokens)
    # The blank lines upstream prints after the text varied between runs (one CI run kept two
    # more than the usual framing), so the bytes are compared without trailing newlines.
    assert r["generated"].encode("utf-8", "surrogateescape").rstrip(b"\n") == ours.rstrip(b"\n")


def test_parse_log_and_output() -> None:
    log = (
        "I encoded    8 tokens in    1.690 seconds, speed:    4.734 t/s\n"
        "I decoded   33 tokens in    2.056 seconds, speed:   16.048 t/s\n"
        "I n_draft   = 15\nI n_predict = 33\nI n_drafted = 390\nI n_accept  = 11\n"
    )
    got = parse_log(log)
    assert got["n_encoded"] == 8 and got["decode_tps"] == pytest.approx(16.048)
    assert (got["n_draft"], got["n_predict"], got["n_drafted"], got["n_accept"]) == (15, 33, 390, 11)
    assert got["draft_steps"] == 22 and got["acceptance_length"] == pytest.approx(1.5)
    text, found = generated_text(b"\n\nhi there\xff!\n\n\n\n", "hi")
    assert found and text.encode("utf-8", "surrogateescape") == b" there\xff!"
