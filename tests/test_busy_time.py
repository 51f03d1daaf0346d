"""tools/device/busy_time.py, the busy-time accounting of kernel_profile.py: the union of the
kernels' device intervals and each kernel's share of it, against a brute-force count on a grid of
integer times (hypothesis over random overlapping intervals); launch_table.py's grouping of the
launches one by one."""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

sys.path.append(str(Path(__file__).resolve().parents[1] / "tools" / "device"))
from busy_time import busy_shares, launch_shares  # noqa: E402
from launch_table import short, table  # noqa: E402

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


@given(spans_st)
def test_each_launch_share_adds_up_to_the_union(spans: list[tuple[float, float, str]]) -> None:
    each = launch_shares(spans)
    total, _ = busy_shares(spans)
    assert [(a, b, n) for a, b, n, _ in each] == sorted(spans)
    assert sum(s for *_, s in each) == total
    assert all(0 <= s <= b - a for a, b, _, s in each)


def test_launches_group_by_kernel_and_grid() -> None:
    gemm = "void gemm_kq::gemm_kquant_mma_kernel<gemm_kq::Q4KT<true, false>, 2, 2>(char const*, int)"
    argmax = "(anonymous namespace)::argmax_reduce_kernel((anonymous namespace)::Best const*)"
    rows = table(
        [
            [gemm, [320, 1, 1], [128, 1, 1], 9.0, 8.0],
            [gemm, [320, 1, 1], [128, 1, 1], 11.0, 10.0],
            [gemm, [1088, 1, 1], [128, 1, 1], 30.0, 29.0],
            [argmax, None, None, 2, 2],
        ]
    )
    assert [(r["kernel"], r["grid"], r["n"]) for r in rows] == [
        ("gemm_kquant_mma_kernel<Q4KT<true, false>, 2, 2>", "1088x1x1", 1),
        ("gemm_kquant_mma_kernel<Q4KT<true, false>, 2, 2>", "320x1x1", 2),
        ("argmax_reduce_kernel", "?", 1),
    ]
    assert rows[1]["us"] == 10.0 and rows[1]["busy"] == 9.0
    assert short("gemv::quantize_act_kernel(int)") == "quantize_act_kernel"
