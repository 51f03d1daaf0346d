"""Prometheus metrics: speculative-decoding counters (vLLM names), throughput and acceptance histograms."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

disable_created_metrics()  # no `*_created` series next to every counter

TPS_BUCKETS = (1, 5, 10, 20, 40, 60, 80, 100, 150, 200, 300, 500, 1000, 2000, 5000, 10000)
AL_BUCKETS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0, 10.0, 16.0)
SECONDS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Metrics:
    """One registry per app, so several servers can live in one process (tests)."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.drafts = Counter("spec_decode_num_drafts", "Draft blocks proposed", registry=r)
        self.draft_tokens = Counter("spec_decode_num_draft_tokens", "Draft tokens proposed", registry=r)
        self.accepted_tokens = Counter(
            "spec_decode_num_accepted_tokens", "Draft tokens accepted by the target", registry=r
        )
        self.accepted_per_pos = Counter(
            "spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted, by position in the draft",
            ["position"],
            registry=r,
        )
        self.accepted_per_pos.labels(position="0")  # the series exists before the first draft
        self.requests = Counter(
            "dflash_requests", "HTTP requests answered", ["endpoint", "status"], registry=r
        )
        self.prompt_tokens = Counter("dflash_prompt_tokens", "Prompt tokens processed", registry=r)
        self.generation_tokens = Counter("dflash_generation_tokens", "Tokens generated", registry=r)
        self.decode_tps = Histogram(
            "dflash_decode_tokens_per_second", "Decode speed per request", buckets=TPS_BUCKETS, registry=r
        )
        self.prompt_tps = Histogram(
            "dflash_prompt_tokens_per_second", "Prompt speed per request", buckets=TPS_BUCKETS, registry=r
        )
        self.acceptance_length = Histogram(
            "dflash_acceptance_length",
            "Mean tokens per target step per request (1 + accepted / drafts)",
            buckets=AL_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "dflash_queue_wait_seconds", "Time waiting for the engine", buckets=SECONDS_BUCKETS, registry=r
        )
        self.waiting = Gauge("dflash_requests_waiting", "Requests waiting for the engine", registry=r)
        self.running = Gauge("dflash_requests_running", "Requests running on the engine", registry=r)

    def add_spec_stats(self, delta: Mapping[str, Any]) -> None:
        """Add a difference of two `Engine.stats()` snapshots."""
        self.drafts.inc(max(0, int(delta.get("drafts", 0))))
        self.draft_tokens.inc(max(0, int(delta.get("draft_tokens", 0))))
        self.accepted_tokens.inc(max(0, int(delta.get("accepted_tokens", 0))))
        for pos, n in enumerate(delta.get("accepted_per_pos", ())):
            if n > 0:
                self.accepted_per_pos.labels(position=str(pos)).inc(n)

    def observe_generation(
        self, usage: Mapping[str, Any], timings: Mapping[str, Any], al: float | None
    ) -> None:
        self.prompt_tokens.inc(max(0, int(usage.get("prompt_tokens", 0))))
        self.generation_tokens.inc(max(0, int(usage.get("completion_tokens", 0))))
        if timings.get("predicted_n", 0) and timings.get("predicted_per_second"):
            self.decode_tps.observe(float(timings["predicted_per_second"]))
        if timings.get("prompt_n", 0) and timings.get("prompt_per_second"):
            self.prompt_tps.observe(float(timings["prompt_per_second"]))
        if al is not None:
            self.acceptance_length.observe(al)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def stats_delta(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """after - before for `Engine.stats()` dicts (per-position lists may grow)."""
    b_pos: Sequence[int] = before.get("accepted_per_pos", ())
    a_pos: Sequence[int] = after.get("accepted_per_pos", ())
    return {
        "drafts": after.get("drafts", 0) - before.get("drafts", 0),
        "draft_tokens": after.get("draft_tokens", 0) - before.get("draft_tokens", 0),
        "accepted_tokens": after.get("accepted_tokens", 0) - before.get("accepted_tokens", 0),
        "accepted_per_pos": [a - (b_pos[i] if i < len(b_pos) else 0) for i, a in enumerate(a_pos)],
    }


def acceptance_length(delta: Mapping[str, Any]) -> float | None:
    """Mean acceptance length 1 + accepted / drafts, None without drafts."""
    drafts = delta.get("drafts", 0)
    return 1.0 + delta.get("accepted_tokens", 0) / drafts if drafts > 0 else None
