"""Server mechanics that need a slow, fully controllable engine: always on FakeEngine."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest
from fake_engine import FakeEngine, ModelLoadError, ProbeEngine


def _wait(cond: Any, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, what
        time.sleep(0.002)
    return time.monotonic() - t0


def test_non_streaming_client_timeout_stops_generation(make_server: Any) -> None:
    fake = FakeEngine(step_s=0.02)
    srv = make_server(lambda: fake)
    with srv.client(timeout=0.3) as c, pytest.raises(httpx.ReadTimeout):
        c.post("/v1/completions", json={"prompt": "long", "max_tokens": 400, "temperature": 0})  # ~8 s
    drafts = fake.stats()["drafts"]
    assert drafts < 100
    _wait(lambda: not srv.worker.busy, 1.0, "engine still busy after the client left")
    assert fake.stats()["drafts"] - drafts <= 3  # stopped within a step or so of noticing


def test_queued_request_of_a_departed_client_never_runs(make_server: Any) -> None:
    probe = ProbeEngine(FakeEngine(step_s=0.02))
    calls: list[str] = []
    inner = probe.create_completion
    probe.create_completion = lambda prompt, **kw: calls.append(prompt) or inner(prompt, **kw)  # type: ignore[method-assign]
    srv = make_server(lambda: probe)
    body = {"prompt": "first", "max_tokens": 40, "temperature": 0}
    t = threading.Thread(target=lambda: httpx.post(srv.url + "/v1/completions", json=body, timeout=30))
    t.start()
    _wait(lambda: srv.worker.busy, 5, "first request did not start")
    with httpx.Client(base_url=srv.url, timeout=0.2) as c, pytest.raises(httpx.ReadTimeout):
        c.post("/v1/completions", json={"prompt": "impatient", "max_tokens": 4})
    t.join(30)
    _wait(lambda: not srv.worker.busy and srv.worker.n_waiting == 0, 5, "queue not drained")
    assert calls == ["first"]


def test_load_failure_is_reported(make_server: Any) -> None:
    def broken() -> Any:
        raise ModelLoadError("does not fit: needs 81.2 GiB, 23.5 GiB available")

    fatal: list[BaseException] = []
    srv = make_server(broken, start=False)
    srv.app.state.on_fatal.append(fatal.append)
    srv.start(wait_ready=False)
    assert not srv.worker.wait_ready(10)
    assert isinstance(fatal[0], ModelLoadError)
    with srv.client() as c:
        resp = c.get("/health")
        assert resp.status_code == 503 and "81.2 GiB" in resp.json()["error"]["message"]
        assert c.post("/v1/completions", json={"prompt": "x"}).status_code == 503


def test_acceptance_statistics_reach_metrics(make_server: Any) -> None:
    fake = FakeEngine()
    srv = make_server(lambda: fake)
    with srv.client() as c:
        for stream in (False, True):
            body = {"prompt": "stats", "max_tokens": 30, "temperature": 0, "stream": stream}
            assert c.post("/v1/completions", json=body).status_code == 200
        text = c.get("/metrics").text
    stats = fake.stats()
    assert f"spec_decode_num_drafts_total {float(stats['drafts'])}" in text
    assert f"spec_decode_num_accepted_tokens_total {float(stats['accepted_tokens'])}" in text
    assert (
        f'spec_decode_num_accepted_tokens_per_pos_total{{position="1"}} {float(stats["accepted_per_pos"][1])}'
        in text
    )
    assert "dflash_acceptance_length_count 2.0" in text


def test_shutdown_answers_queued_requests_and_stops_the_engine(make_server: Any) -> None:
    """On shutdown queued requests get 503 at once; uvicorn lets the running one go on for its
    graceful period, then cancels it: the generation must stop then, not run on to max_tokens."""
    fake = FakeEngine(step_s=0.02)
    srv = make_server(lambda: fake)
    outcomes: list[Any] = []

    def client() -> None:
        body = {"prompt": "slow", "max_tokens": 500, "temperature": 0}  # ~7 s each
        try:
            outcomes.append(httpx.post(srv.url + "/v1/completions", json=body, timeout=30).status_code)
        except httpx.HTTPError as exc:
            outcomes.append(type(exc).__name__)

    threads = [threading.Thread(target=client) for _ in range(3)]
    for t in threads:
        t.start()
    # two queued, and the third generating (on a loaded machine the worker may take it late)
    _wait(lambda: srv.worker.n_waiting == 2 and fake.stats()["drafts"] > 0, 5, "requests did not queue")
    srv.worker.begin_shutdown()  # what SIGTERM does in dflash-serve (main.Server.handle_exit)
    _wait(lambda: sorted(map(str, outcomes)) == ["503", "503"], 2, "queued requests were not answered 503")
    t0 = time.monotonic()
    srv.stop()  # graceful period (2 s here) runs out: the running request is cancelled
    assert time.monotonic() - t0 < 6
    assert not srv.worker._thread.is_alive() and fake.stats()["drafts"] < 400
    for t in threads:
        t.join(5)
    assert len(outcomes) == 3 and 200 not in outcomes
