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


def launch_shares(spans: Iterable[tuple[float, float, str]]) -> list[tuple[float, float, str, float]]:
    """(start, end, name) intervals -> each one by start with its share: (start, end, name, share)."""
    out, end = [], float("-inf")
    for a, b, name in sorted(spans):
        share = b - max(a, end) if b > end else 0.0
        end = max(end, b)
        out.append((a, b, name, share))
    return out


def busy_shares(spans: Iterable[tuple[float, float, str]]) -> tuple[float, dict[str, float]]:
    """(start, end, name) intervals -> (the union's length, each name's share of it)."""
    shares: dict[str, float] = defaultdict(float)
    for _a, _b, name, share in launch_shares(spans):
        if share > 0:  # a kernel wholly inside others is not charged (nor listed)
            shares[name] += share
    return sum(shares.values()), dict(shares)
