"""tools/device/busy_time.py, the busy-time accounting of kernel_profile.py: the union of the
kernels' device intervals and each kernel's share of it, against a brute-force count on a grid of
integer times (hypothesis over random overlapping intervals)."""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

sys.path.append(str(Path(__file__).resolve().parents[1] / "tools" / "device"))
from busy_time import busy_shares  # noqa: E402

spans_st = st.lists(
    st.tuples(st.integers(0, 60), st.integers(1, 20), st.sampled_from("abcd")).map(
        lambda t: (float(t[0]), float(t[0] + t[1]), t[2])
    ),
    max_size=12,
)


@given(spans_st)
def test_busy_time_is_the_union_and_the_shares_add_up_to_it(spans: list[tuple[float, float, str]]) -> None:
    total, shares = busy_shares(spans)
    covered = {t for a, b, _ in spans for t in range(int(a), int(b))}  # unit cells [t, t + 1)
    assert total == len(covered)
    assert sum(shares.values()) == total
    for name, share in shares.items():  # never more than the kernel's own intervals
        assert 0 < share <= sum(b - a for a, b, n in spans if n == name)


@given(spans_st)
def test_a_kernel_running_alone_is_charged_its_whole_interval(spans: list[tuple[float, float, str]]) -> None:
    chained, t = [], 0.0  # the same lengths end to end: nothing overlaps
    for a, b, name in spans:
        chained.append((t, t + (b - a), name))
        t += b - a + 1.0
    total, shares = busy_shares(chained)
    assert total == sum(b - a for a, b, _ in chained)
    for name in {n for _, _, n in chained}:
        assert shares[name] == sum(b - a for a, b, n in chained if n == name)


def test_a_kernel_that_waits_is_charged_its_tail_only() -> None:
    # the GEMM (0..10), then a quantizer launched early at 4 that ends at 12: 2 of its 8
    total, shares = busy_shares([(0.0, 10.0, "gemm"), (4.0, 12.0, "quantize")])
    assert total == 12.0
    assert shares == {"gemm": 10.0, "quantize": 2.0}
