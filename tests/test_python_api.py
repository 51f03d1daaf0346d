"""The Python API (dflash.Engine, dflash.generate) on tiny synthetic models, and TextStream."""

from __future__ import annotations

import threading
import time
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import Any

import pytest

import dflash
import dflash.api
import dflash.models
from dflash import _core
from dflash.textstream import TextStream

PROMPT = "The quick brown fox"
N_CTX = 512
IM_START, IM_END = 4089, 4090


@pytest.fixture(scope="module")
def model_b(synth_model: Any) -> Path:
    return Path(synth_model("tiny-b", "f32"))


@pytest.fixture(scope="module")
def eng(model_b: Path) -> dflash.Engine:
    return dflash.Engine(model_path=str(model_b), n_ctx=N_CTX, n_threads=1)


def _raw_greedy(path: Path, tokens: list[int], n: int, n_ctx: int = N_CTX) -> list[int]:
    """Greedy ids straight from the native engine (no EOG handling: we cut at the first EOG)."""
    cfg = _core.EngineConfig()
    cfg.n_ctx, cfg.n_threads = n_ctx, 1
    core = _core.TargetEngine(str(path), cfg)
    out: list[int] = []

    def keep(t: int) -> bool:
        out.append(t)
        return True

    core.generate(tokens, n, 0.0, 0, 1.0, 0, [], keep)
    return out


def _decode(eng: dflash.Engine, ids: list[int]) -> str:
    return eng._vocab.detokenize(ids).decode("utf-8", errors="ignore")


def _text(res: dict[str, Any]) -> str:
    c = res["choices"][0]
    return str(c["message"]["content"] if "message" in c else c["text"])


def _greedy(eng: dflash.Engine, prompt: str | list[int] = PROMPT, **kw: Any) -> dict[str, Any]:
    kw.setdefault("max_tokens", 32)
    res = eng.create_completion(prompt, temperature=0.0, **kw)
    assert isinstance(res, dict)
    return res


def _stream(it: Any) -> list[dict[str, Any]]:
    assert not isinstance(it, dict)
    return list(it)


# ---- greedy results ---------------------------------------------------------------------------


def test_greedy_completion_equals_native_generate(eng: dflash.Engine, model_b: Path) -> None:
    tokens = eng.tokenize(PROMPT)
    ids = _raw_greedy(model_b, tokens, 32)
    eog = set(eng._eog)
    cut = next((i for i, t in enumerate(ids) if t in eog), len(ids))
    # Random weights may emit stray UTF-8 bytes; like llama-cpp-python, the API drops them.
    want = _decode(eng, ids[:cut])
    res = _greedy(eng)
    assert res["object"] == "text_completion"
    assert _text(res) == want
    assert res["choices"][0]["finish_reason"] == ("length" if cut == len(ids) else "stop")
    assert res["usage"] == {
        "prompt_tokens": len(tokens),
        "completion_tokens": min(cut + 1, 32),
        "total_tokens": len(tokens) + min(cut + 1, 32),
    }
    # A token-list prompt is the same request.
    assert _text(_greedy(eng, tokens)) == want


def test_stream_concatenates_to_the_full_text(eng: dflash.Engine) -> None:
    want = _greedy(eng)
    chunks = _stream(eng.create_completion(PROMPT, max_tokens=32, temperature=0.0, stream=True))
    assert len(chunks) > 2
    assert all(c["object"] == "text_completion" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert "".join(c["choices"][0]["text"] for c in chunks) == _text(want)
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] == want["choices"][0]["finish_reason"] == "length"
    assert last["usage"] == want["usage"]
    t = last["timings"]
    for key in ("prompt_per_second", "predicted_per_second", "draft_n", "draft_n_accepted"):
        assert key in t, key
    assert t["prompt_per_second"] > 0 and t["predicted_per_second"] > 0
    assert t["draft_n"] == 0 and t["draft_n_accepted"] == 0
    assert t["prompt_n"] == want["usage"]["prompt_tokens"]
    assert t["predicted_n"] == want["usage"]["completion_tokens"]
    for key in ("prompt_per_second", "predicted_per_second", "draft_n", "draft_n_accepted"):
        assert key in want["timings"]


def test_max_tokens_and_finish_reason_length(eng: dflash.Engine) -> None:
    full = eng.tokenize(_text(_greedy(eng, max_tokens=20)), add_special=False)
    for n in (1, 5, 20):
        res = _greedy(eng, max_tokens=n)
        assert res["usage"]["completion_tokens"] == n
        assert res["choices"][0]["finish_reason"] == "length"
    assert _text(_greedy(eng, max_tokens=0)) == ""
    assert full  # the greedy text is not empty
    # max_tokens=None runs to the end of the context.
    short = dflash.Engine(model_path=eng.model_path, n_ctx=32, n_threads=1)
    to_end = short.create_completion(PROMPT, max_tokens=None, temperature=0.0)
    assert isinstance(to_end, dict)
    n_prompt = to_end["usage"]["prompt_tokens"]
    assert to_end["usage"]["completion_tokens"] == 32 - n_prompt
    assert to_end["choices"][0]["finish_reason"] == "length"


# ---- chat -------------------------------------------------------------------------------------

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Count to five."}]


def test_chat_template_from_the_gguf(eng: dflash.Engine) -> None:
    tmpl = (Path(dflash.__file__).parent / "data" / "chatml.jinja").read_text()
    assert eng._vocab.chat_template == tmpl
    assert eng.apply_chat_template(MESSAGES) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nCount to five.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert eng.apply_chat_template(MESSAGES, add_generation_prompt=False) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nCount to five.<|im_end|>\n"
    )


def test_chat_completion_uses_special_tokens(eng: dflash.Engine) -> None:
    rendered = eng.apply_chat_template(MESSAGES)
    toks = eng.tokenize(rendered, add_special=False, parse_special=True)
    assert toks.count(IM_START) == 3 and toks.count(IM_END) == 2
    res = eng.create_chat_completion(MESSAGES, max_tokens=24, temperature=0.0)
    assert isinstance(res, dict)
    assert res["object"] == "chat.completion"
    msg = res["choices"][0]["message"]
    assert msg["role"] == "assistant"
    assert res["usage"]["prompt_tokens"] == len(toks)
    # The same ids sent as a plain completion give the same text.
    assert msg["content"] == _text(_greedy(eng, toks, max_tokens=24))
    chunks = _stream(eng.create_chat_completion(MESSAGES, max_tokens=24, temperature=0.0, stream=True))
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == msg["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == res["choices"][0]["finish_reason"]
    assert chunks[-1]["usage"] == res["usage"]
    assert "predicted_per_second" in chunks[-1]["timings"]


# ---- stop strings -----------------------------------------------------------------------------


def _boundary_stop(eng: dflash.Engine, n: int = 32) -> tuple[str, str]:
    """(full greedy text, a stop string that spans a token boundary in it)."""
    ids = _raw_greedy(Path(eng.model_path), eng.tokenize(PROMPT), n)
    text = _decode(eng, ids)
    for k in range(4, len(ids) - 1):
        at = len(_decode(eng, ids[:k]))
        stop = text[at - 2 : at + 2]
        if len(stop) == 4 and stop.strip() == stop and text.find(stop) == at - 2:
            return text, stop
    raise AssertionError(f"no usable token boundary in {text!r}")


def test_stop_string_cuts_and_never_leaks(eng: dflash.Engine) -> None:
    full, stop = _boundary_stop(eng)
    want = full[: full.find(stop)]
    res = _greedy(eng, stop=stop)
    assert _text(res) == want
    assert res["choices"][0]["finish_reason"] == "stop"
    chunks = _stream(eng.create_completion(PROMPT, max_tokens=32, temperature=0.0, stop=[stop], stream=True))
    pieces = [c["choices"][0]["text"] for c in chunks]
    assert "".join(pieces) == want
    assert not any(stop in p for p in pieces)
    assert stop not in "".join(pieces)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    # Several stops: the earliest match wins; a stop that never occurs changes nothing.
    assert _text(_greedy(eng, stop=["\x00never\x00", stop])) == want
    assert _text(_greedy(eng, stop="\x00never\x00")) == full
    # Chat honours stop strings too.
    chat = eng.create_chat_completion(MESSAGES, max_tokens=32, temperature=0.0)
    assert isinstance(chat, dict)
    content = chat["choices"][0]["message"]["content"]
    if len(content) > 6:
        s = content[3:6]
        cut = eng.create_chat_completion(MESSAGES, max_tokens=32, temperature=0.0, stop=s)
        assert isinstance(cut, dict)
        assert cut["choices"][0]["message"]["content"] == content[: content.find(s)]


# ---- state, sampling, cancellation ------------------------------------------------------------


def test_same_request_same_output_whatever_ran_between(eng: dflash.Engine) -> None:
    first = _text(_greedy(eng))
    eng.create_completion("Something else entirely, longer than before " * 4, max_tokens=40, temperature=0.9)
    eng.create_chat_completion(MESSAGES, max_tokens=10, temperature=0.0)
    it = eng.create_completion(PROMPT, max_tokens=200, temperature=0.5, stream=True)
    assert isinstance(it, Generator)
    next(it)
    it.close()
    eng.eval_logits(eng.tokenize("logits only"))
    assert _text(_greedy(eng)) == first
    # A fresh engine on the same file agrees.
    fresh = dflash.Engine(model_path=eng.model_path, n_ctx=N_CTX, n_threads=1)
    assert _text(_greedy(fresh)) == first


def test_seeded_sampling_is_reproducible(eng: dflash.Engine) -> None:
    def sample(seed: int) -> str:
        res = eng.create_completion(PROMPT, max_tokens=32, temperature=0.8, seed=seed)
        assert isinstance(res, dict)
        return _text(res)

    a, b, c = sample(1234), sample(1234), sample(99)
    assert a == b
    assert a != c
    assert a != _text(_greedy(eng))
    # The stream samples the same tokens.
    chunks = _stream(eng.create_completion(PROMPT, max_tokens=32, temperature=0.8, seed=1234, stream=True))
    assert "".join(ch["choices"][0]["text"] for ch in chunks) == a


def test_closing_a_stream_stops_generation(synth_model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(synth_model("tiny-c", "f32"))
    e = dflash.Engine(model_path=path, n_ctx=4096, n_threads=1)
    want = _text(_greedy(e, max_tokens=16))
    n_prompt = len(e.tokenize(PROMPT, True, True))
    max_tokens = 4000
    it = e.create_completion(PROMPT, max_tokens=max_tokens, temperature=0.0, stream=True)
    assert isinstance(it, Generator)
    got = [next(it) for _ in range(3)]
    assert all(g["choices"][0]["finish_reason"] is None for g in got)
    t0 = time.perf_counter()
    it.close()
    assert time.perf_counter() - t0 < 5.0
    # Tokens the target processed: generation stopped right after the chunks that were read.
    n_closed = e._target.n_past - n_prompt + 1  # the last emitted token is not run yet
    assert 3 <= n_closed < max_tokens // 2, n_closed
    assert not any(t.name == "dflash-generate" and t.is_alive() for t in threading.enumerate())
    # Immediately usable, with the same answer as before.
    assert _text(_greedy(e, max_tokens=16)) == want
    # Same for a chat stream, and for the user's cancel event.
    chat = e.create_chat_completion(MESSAGES, max_tokens=max_tokens, temperature=0.0, stream=True)
    assert isinstance(chat, Generator)
    next(chat)
    next(chat)
    chat.close()
    cancel = threading.Event()
    cancel.set()
    res = e.create_completion(PROMPT, max_tokens=max_tokens, temperature=0.0, cancel=cancel)
    assert isinstance(res, dict)
    assert res["usage"]["completion_tokens"] <= 2
    assert _text(_greedy(e, max_tokens=16)) == want


# ---- dflash.generate on the embedded default model --------------------------------------------


def test_generate_on_the_default_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DFLASH_CACHE", str(tmp_path))
    monkeypatch.setattr(dflash.api, "_default_engine", None)
    text = dflash.generate("def fibonacci(n):", max_tokens=12, n_ctx=256, n_threads=1)
    assert isinstance(text, str) and text
    written = list((tmp_path / "models").glob("*.gguf"))
    # the packaged pair's target when the package carries it, else the synthetic model written once
    assert dflash.models.packaged_target() is not None or len(written) == 1
    eng = dflash.api._default_engine
    assert eng is not None
    # Greedy by default, the loaded engine is reused, streaming gives the same text.
    assert dflash.generate("def fibonacci(n):", max_tokens=12) == text
    assert dflash.api._default_engine is eng
    pieces = dflash.generate("def fibonacci(n):", max_tokens=12, stream=True)
    assert not isinstance(pieces, str)
    assert "".join(pieces) == text
    chat = dflash.generate([{"role": "user", "content": "hi"}], max_tokens=8)
    assert isinstance(chat, str)
    assert dflash.api._default_engine is eng


# ---- tokens -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "Hello, world!",
        "  leading spaces\tand\ttabs\n\nnew lines  ",
        "naïve café, Straße, Ωμέγα",
        "emoji 😀🚀👍🏽 and 👨‍👩‍👧 family",
        "中文字符 日本語のテキスト 한국어",
        "",
    ],
)
def test_tokenize_detokenize_round_trip(eng: dflash.Engine, text: str) -> None:
    toks = eng.tokenize(text, add_special=False)
    assert all(0 <= t < eng.n_vocab for t in toks)
    assert eng.detokenize(toks) == text
    assert eng.tokenize(text) == toks  # add_bos is false in the synthetic vocab


def test_special_tokens_parse_only_when_asked(eng: dflash.Engine) -> None:
    assert eng.tokenize("<|im_start|>", add_special=False, parse_special=True) == [IM_START]
    plain = eng.tokenize("<|im_start|>", add_special=False, parse_special=False)
    assert IM_START not in plain and len(plain) > 1
    assert eng.detokenize(plain) == "<|im_start|>"


# ---- TextStream -------------------------------------------------------------------------------

PIECES: dict[int, bytes] = {
    1: b"Hel",
    2: b"lo",
    3: b" \xe2\x82",  # the first two bytes of the euro sign
    4: b"\xac!",  # its last byte
    5: b" ST",
    6: b"OP",
    7: b" more",
    8: b"S",
    9: b"X",
    10: b"\xf0\x9f",
    11: b"\x98",
    12: b"\x80",
}


def _detok(token: int) -> bytes:
    return PIECES[token]


def _feed(ts: TextStream, ids: Sequence[int]) -> list[str]:
    return [ts.push(i) for i in ids]


def test_textstream_utf8_split_across_tokens() -> None:
    ts = TextStream(_detok)
    assert _feed(ts, [1, 2, 3]) == ["Hel", "lo", " "]
    assert ts.push(4) == "€!"
    assert _feed(ts, [10, 11]) == ["", ""]  # a 4-byte emoji in three tokens
    assert ts.push(12) == "😀"
    assert ts.flush() == ""
    assert ts.text == "Hello €!😀"


def test_textstream_stop_string_spanning_tokens() -> None:
    ts = TextStream(_detok, stop=["STOP"])
    out = _feed(ts, [1, 2, 5])
    assert out == ["Hel", "lo", " "]  # "ST" is held back: it may start the stop string
    assert not ts.stopped
    assert ts.push(6) == ""
    assert ts.stopped
    assert ts.text == "Hello "
    assert "".join(out) == "Hello "


def test_textstream_hold_back_released() -> None:
    ts = TextStream(_detok, stop=["STOP", "SXY"])
    assert _feed(ts, [1, 8]) == ["Hel", ""]  # "S" could start either stop string
    assert ts.push(9) == ""  # "SX" could still be "SXY"
    assert ts.push(7) == "SX more"  # no longer a stop prefix: released in order
    assert _feed(ts, [5]) == [" "]
    assert ts.flush() == "ST"  # generation ended without a match: the held text is emitted
    assert not ts.stopped
    assert ts.text == "HelSX more ST"


def test_textstream_stop_inside_one_token_and_utf8_hold() -> None:
    ts = TextStream(_detok, stop=["lo €"])
    assert _feed(ts, [1, 2]) == ["He", "l"]  # "l", then "lo", may start the stop string
    assert ts.push(3) == ""  # "lo " + half a euro sign: held
    assert ts.push(4) == ""
    assert ts.stopped and ts.text == "Hel"
    # Empty stop strings are ignored.
    ts2 = TextStream(_detok, stop=[""])
    assert _feed(ts2, [1, 2]) == ["Hel", "lo"]
