"""Bounded fuzzing of the HTTP API from its own OpenAPI schema (schemathesis): bad input never gets a
5xx, and the server still serves afterwards. Runs against the `engine` fixture, like test_api."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

MAX_EXAMPLES = 25
FUZZ_MAX_TOKENS = 8  # keeps generations short: the fuzz is about the HTTP layer


@pytest.fixture(scope="module")
def api_schema(server: Any) -> Any:
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")

    @schema.hook
    def map_body(_: Any, body: Any) -> Any:
        if isinstance(body, dict):
            for key in ("max_tokens", "max_completion_tokens"):
                if isinstance(body.get(key), int) and not isinstance(body[key], bool) and body[key] > 0:
                    body[key] = min(body[key], FUZZ_MAX_TOKENS)
            if "messages" in body and body.get("max_tokens") is None:
                body.setdefault("max_completion_tokens", FUZZ_MAX_TOKENS)
        return body

    return schema


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_server_errors(case: Any) -> None:
    response = case.call(timeout=30)
    case.validate_response(response, checks=[not_a_server_error])


def test_alive_after_fuzzing(server: Any) -> None:
    with server.client() as c:
        assert c.get("/health").json() == {"status": "ok"}
        r = c.post("/v1/completions", json={"prompt": "still there?", "max_tokens": 3, "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    assert not server.worker.busy and httpx.get(server.url + "/metrics").status_code == 200
