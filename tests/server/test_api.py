"""Acceptance tests of dflash-serve over real HTTP on 127.0.0.1, against the `engine` fixture (the real
dflash.Engine on a tiny synthetic model; the fake one only with DFLASH_SERVER_FAKE_ONLY=1)."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
from fake_engine import ProbeEngine

PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time"
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Count to five."}]
N = 24  # max_tokens for the equality tests


def oai(server: Any, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=60)


def direct(probe: ProbeEngine, prompt: str = PROMPT, **kw: Any) -> dict[str, Any]:
    """What the engine itself answers (called while the server is idle)."""
    return probe.inner.create_completion(prompt, temperature=0, **kw)


def direct_chat(probe: ProbeEngine, messages: list[dict[str, Any]] = MESSAGES, **kw: Any) -> dict[str, Any]:
    return probe.inner.create_chat_completion(messages, temperature=0, **kw)


def assert_error(resp: httpx.Response, status: int, *fragments: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert err["code"] == status and isinstance(err["type"], str)
    for frag in fragments:
        assert frag in err["message"], err["message"]
    return err


# ---- outputs equal the engine's -------------------------------------------------------------
def test_completion_equals_engine(server: Any, probe: ProbeEngine) -> None:
    want = direct(probe, max_tokens=N)
    got = oai(server).completions.create(model="tiny", prompt=PROMPT, max_tokens=N, temperature=0)
    assert got.choices[0].text == want["choices"][0]["text"]
    assert got.choices[0].finish_reason == want["choices"][0]["finish_reason"]
    assert got.usage is not None and got.usage.completion_tokens == want["usage"]["completion_tokens"]
    assert got.usage.prompt_tokens == want["usage"]["prompt_tokens"]
    assert got.model == "tiny"
    timings = got.model_extra["timings"]
    for key in ("prompt_per_second", "predicted_per_second", "draft_n", "draft_n_accepted"):
        assert key in timings


def test_completion_stream_equals_engine(server: Any, probe: ProbeEngine) -> None:
    want = direct(probe, max_tokens=N)
    chunks = list(
        oai(server).completions.create(prompt=PROMPT, model="x", max_tokens=N, temperature=0, stream=True)
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want["choices"][0]["text"]
    assert chunks[-1].choices[0].finish_reason == want["choices"][0]["finish_reason"]
    assert (
        chunks[-1].usage is not None
        and chunks[-1].usage.completion_tokens == want["usage"]["completion_tokens"]
    )
    assert "predicted_per_second" in chunks[-1].model_extra["timings"]


def test_chat_equals_engine(server: Any, probe: ProbeEngine) -> None:
    want = direct_chat(probe, max_tokens=N)
    got = oai(server).chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=N, temperature=0)
    assert got.choices[0].message.content == want["choices"][0]["message"]["content"]
    assert got.choices[0].message.role == "assistant"
    assert got.usage is not None and got.usage.total_tokens == want["usage"]["total_tokens"]
    assert "draft_n" in got.model_extra["timings"]


def test_chat_stream_equals_engine(server: Any, probe: ProbeEngine) -> None:
    want = direct_chat(probe, max_tokens=N)
    stream = oai(server).chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=N,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want["choices"][0]["message"]["content"]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None  # include_usage: OpenAI's last chunk
    assert chunks[-1].usage.completion_tokens == want["usage"]["completion_tokens"]
    assert chunks[-2].choices[0].finish_reason == want["choices"][0]["finish_reason"]


def test_stop_and_token_prompt_equal_engine(server: Any, probe: ProbeEngine) -> None:
    text = direct(probe, max_tokens=N)["choices"][0]["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 2] or "x"
    want = direct(probe, max_tokens=N, stop=[stop])
    got = oai(server).completions.create(model="t", prompt=PROMPT, max_tokens=N, temperature=0, stop=[stop])
    assert got.choices[0].text == want["choices"][0]["text"]
    assert got.choices[0].finish_reason == want["choices"][0]["finish_reason"]
    ids = probe.inner.tokenize(PROMPT)
    want = probe.inner.create_completion(ids, max_tokens=N, temperature=0)
    got = oai(server).completions.create(model="t", prompt=ids, max_tokens=N, temperature=0)
    assert got.choices[0].text == want["choices"][0]["text"]


def test_raw_http_sse(server: Any, probe: ProbeEngine) -> None:
    want = direct(probe, max_tokens=N)["choices"][0]["text"]
    body = {"prompt": PROMPT, "max_tokens": N, "temperature": 0, "stream": True}
    with server.client() as c, c.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = [line for line in resp.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert "".join(ch["choices"][0]["text"] for ch in chunks) == want
    assert chunks[-1]["usage"]["completion_tokens"] > 0 and "timings" in chunks[-1]


def test_greedy_is_independent_of_history(server: Any) -> None:
    body = {"prompt": PROMPT, "max_tokens": N, "temperature": 0}
    with server.client() as c:
        first = c.post("/v1/completions", json=body).json()["choices"][0]["text"]
        c.post(
            "/v1/completions", json={"prompt": "Something else entirely", "max_tokens": 9, "temperature": 0.9}
        )
        c.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 5, "temperature": 0})
        assert c.post("/v1/completions", json=body).json()["choices"][0]["text"] == first


# ---- other endpoints --------------------------------------------------------------------------
def test_models(server: Any) -> None:
    assert [m.id for m in oai(server).models.list()] == ["tiny"]
    card = httpx.get(server.url + "/v1/models").json()["data"][0]
    assert card["meta"]["n_ctx"] == server.worker.info.n_ctx


def test_tokenize_detokenize(server: Any, probe: ProbeEngine) -> None:
    with server.client() as c:
        tokens = c.post("/tokenize", json={"content": PROMPT}).json()["tokens"]
        assert tokens == probe.inner.tokenize(PROMPT, add_special=False, parse_special=True)
        assert c.post("/detokenize", json={"tokens": tokens}).json()["content"] == PROMPT
        assert_error(c.post("/detokenize", json={"tokens": [probe.n_vocab + 5]}), 400, str(probe.n_vocab))
        assert_error(c.post("/v1/completions", json={"prompt": [probe.n_vocab]}), 400, "out of range")


def test_metrics(server: Any) -> None:
    oai(server).completions.create(model="t", prompt=PROMPT, max_tokens=8, temperature=0)
    text = httpx.get(server.url + "/metrics").text
    for name in (
        "spec_decode_num_drafts_total",
        "spec_decode_num_draft_tokens_total",
        "spec_decode_num_accepted_tokens_total",
        'spec_decode_num_accepted_tokens_per_pos_total{position="0"}',
        "dflash_decode_tokens_per_second_bucket",
        "# TYPE dflash_acceptance_length histogram",
        'dflash_requests_total{endpoint="/v1/completions",status="200"}',
        "dflash_generation_tokens_total",
    ):
        assert name in text, name


def test_health_loading_then_ok(make_server: Any, engine: Any) -> None:
    gate = threading.Event()

    def slow_load() -> Any:
        assert gate.wait(20)
        return engine

    srv = make_server(slow_load, wait_ready=False)
    with srv.client() as c:
        resp = c.get("/health")
        assert resp.status_code == 503
        assert resp.json() == {
            "error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}
        }
        assert_error(c.post("/v1/completions", json={"prompt": "hi"}), 503, "Loading model")
        gate.set()
        assert srv.worker.wait_ready(20)
        resp = c.get("/health")
        assert resp.status_code == 200 and resp.json() == {"status": "ok"}


def test_api_key(make_server: Any, engine: Any) -> None:
    srv = make_server(lambda: engine, api_key="sekrit")
    with srv.client() as c:
        assert c.get("/health").status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekrit"}):
            assert_error(c.get("/v1/models", headers=headers), 401, "API key")
            assert_error(c.post("/v1/completions", json={"prompt": "hi"}, headers=headers), 401)
            assert c.get("/metrics", headers=headers).status_code == 401
        assert c.get("/v1/models", headers={"Authorization": "Bearer sekrit"}).status_code == 200
    with pytest.raises(openai.AuthenticationError):
        oai(srv, key="wrong").models.list()
    assert oai(srv, key="sekrit").completions.create(model="t", prompt="hi", max_tokens=2, temperature=0)


# ---- concurrency -----------------------------------------------------------------------------
def test_eight_parallel_clients(server: Any, probe: ProbeEngine) -> None:
    prompts = [f"{PROMPT} {i}" for i in range(8)]
    want = [direct(probe, p, max_tokens=N)["choices"][0]["text"] for p in prompts]
    want_chat = direct_chat(probe, max_tokens=N)["choices"][0]["message"]["content"]
    probe.chunk_delay_s = 0.002  # keep streams overlapping

    def run(i: int) -> tuple[str, str]:
        client = oai(server)
        if i == 7:
            r = client.chat.completions.create(model="t", messages=MESSAGES, max_tokens=N, temperature=0)
            return r.choices[0].message.content or "", want_chat
        if i % 2:
            s = client.completions.create(
                model="t", prompt=prompts[i], max_tokens=N, temperature=0, stream=True
            )
            return "".join(c.choices[0].text for c in s if c.choices), want[i]
        r = client.completions.create(model="t", prompt=prompts[i], max_tokens=N, temperature=0)
        return r.choices[0].text, want[i]

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(run, range(8)))
    for got, expected in results:
        assert got == expected
    assert probe.concurrent_calls == 0


def _open_stream(client: httpx.Client, max_tokens: int) -> httpx.Response:
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    resp = client.send(client.build_request("POST", "/v1/completions", json=body), stream=True)
    assert resp.status_code == 200
    return resp


def _wait_idle(worker: Any, timeout: float) -> float:
    t0 = time.monotonic()
    while worker.busy:
        assert time.monotonic() - t0 < timeout, "engine still busy"
        time.sleep(0.002)
    return time.monotonic() - t0


def test_hangup_mid_stream_frees_engine(server: Any, probe: ProbeEngine) -> None:
    step = 0.05
    probe.chunk_delay_s = step  # one "decode step" per streamed chunk
    with server.client() as c:
        resp = _open_stream(c, max_tokens=400)  # ~20 s if nobody stopped it
        lines = resp.iter_lines()
        for _ in range(3):
            next(lines)
        assert probe.generating, "the generation ended on its own before the hang-up"
        before = probe.chunks
        resp.close()  # hang up
    idle_after = _wait_idle(server.worker, timeout=2.0)
    assert probe.chunks - before <= 2, "the engine kept generating after the client left"
    assert idle_after < 4 * step + 0.5
    t0 = time.monotonic()
    r = oai(server).completions.create(model="t", prompt="next", max_tokens=4, temperature=0)
    assert r.choices[0].text is not None and time.monotonic() - t0 < 5


def test_queue_full_answers_429(make_server: Any, engine: Any) -> None:
    probe = ProbeEngine(engine)
    probe.chunk_delay_s = 0.05
    srv = make_server(lambda: probe, queue_size=1)
    with srv.client() as c, srv.client() as c2, srv.client() as c3:
        running = _open_stream(c, max_tokens=400)
        # Keep the line iterator: a dropped one is closed at once, and closing it closes httpx's
        # stream, i.e. hangs up (the running job was then cancelled and the "queued" request
        # served at once, never waiting: the flake this test had).
        lines = running.iter_lines()
        next(lines)
        waiting: dict[str, Any] = {}
        body = {"prompt": "queued", "max_tokens": 4, "temperature": 0}
        t = threading.Thread(target=lambda: waiting.update(r=c2.post("/v1/completions", json=body)))
        t.start()
        deadline = time.monotonic() + 20  # a liveness bound: a loaded 2-core CI box can be slow
        while srv.worker.n_waiting < 1:
            got = waiting.get("r")
            assert time.monotonic() < deadline, f"never queued: busy={srv.worker.busy}, reply={got}"
            time.sleep(0.005)
        resp = c3.post("/v1/completions", json=body)
        assert_error(resp, 429, "queue")
        assert int(resp.headers["Retry-After"]) >= 1
        lines.close()
        running.close()  # the running request leaves; the queued one gets the engine
        t.join(10)
    want = probe.inner.create_completion("queued", max_tokens=4, temperature=0)["choices"][0]["text"]
    assert waiting["r"].status_code == 200 and waiting["r"].json()["choices"][0]["text"] == want
    assert probe.concurrent_calls == 0


# ---- errors ----------------------------------------------------------------------------------
def test_bad_parameters_400(server: Any) -> None:
    with server.client() as c:
        post = c.post
        assert_error(post("/v1/completions", json={"prompt": "hi", "temperature": -1}), 400, "temperature")
        assert_error(post("/v1/completions", json={"prompt": "hi", "top_p": 1.5}), 400, "top_p")
        assert_error(post("/v1/completions", json={"prompt": "hi", "n": 2}), 400, "n=1")
        assert_error(post("/v1/completions", json={"prompt": ""}), 400, "empty")
        assert_error(post("/v1/completions", json={"prompt": "hi", "max_tokens": 0}), 400, "max_tokens")
        assert_error(post("/v1/chat/completions", json={"messages": []}), 400, "messages")
        assert_error(post("/v1/chat/completions", json={"messages": [{"role": "pirate"}]}), 400, "role")
        assert_error(
            post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"}), 400
        )
        assert_error(
            post("/v1/completions", json={"prompt": "hi", "stream": True, "top_k": -3}), 400, "top_k"
        )
    with pytest.raises(openai.BadRequestError):
        oai(server).completions.create(model="t", prompt="hi", temperature=5)


@pytest.mark.parametrize("stream", [False, True])
def test_prompt_over_context_400(server: Any, stream: bool) -> None:
    n_ctx = server.worker.info.n_ctx
    prompt = " ".join(["word"] * (2 * n_ctx))
    resp = httpx.post(server.url + "/v1/completions", json={"prompt": prompt, "stream": stream}, timeout=60)
    err = assert_error(resp, 400, str(n_ctx))
    assert any(ch.isdigit() for ch in err["message"].replace(str(n_ctx), ""))  # the prompt's length too


@pytest.mark.parametrize("stream", [False, True])
def test_engine_failure_500_then_serves(server: Any, probe: ProbeEngine, stream: bool) -> None:
    probe.fail_next = RuntimeError("simulated engine failure")
    with server.client() as c:
        resp = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3, "stream": stream})
        assert_error(resp, 500, "simulated engine failure")
        assert c.get("/health").status_code == 200
        ok = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 3, "temperature": 0})
        assert ok.status_code == 200
        assert ok.json()["choices"][0]["text"] == direct(probe, max_tokens=3)["choices"][0]["text"]
