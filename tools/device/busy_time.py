"""Busy time of overlapping kernels (tools/device/kernel_profile.py): the union of their device
intervals, and each kernel's share of it.

Under programmatic dependent launch a kernel starts before the one ahead of it ends and waits, so
its recorded interval includes the wait and summing intervals counts the overlap twice. Walking
the intervals by start, each one is charged only its time past the latest end before it: the
shares add up to the union, and a kernel that runs alone is charged its whole interval.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable


def busy_shares(spans: Iterable[tuple[float, float, str]]) -> tuple[float, dict[str, float]]:
    """(start, end, name) intervals -> (the union's length, each name's share of it)."""
    total, end = 0.0, float("-inf")
    shares: dict[str, float] = defaultdict(float)
    for a, b, name in sorted(spans):
        if b > end:
            share = b - max(a, end)
            total += share
            shares[name] += share
            end = b
    return total, dict(shares)
