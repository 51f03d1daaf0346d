"""tools/device/build_schedule.py, the replay of a build's per-object compile times on N jobs: a
.ninja_log and a `ninja -n` listing read back, and the list schedule's makespan against its bounds
(hypothesis over random times) and a case worked by hand (a long object listed last ends the
build; listed first it overlaps the rest)."""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

sys.path.append(str(Path(__file__).resolve().parents[1] / "tools" / "device"))
from build_schedule import key, makespan, read_log, read_order  # noqa: E402


def test_log_and_listing_are_read_by_checkout_independent_names(tmp_path: Path) -> None:
    log = tmp_path / "ninja_log"
    log.write_text(
        "# ninja log v7\n"
        "0\t1500\t0\tggml/a.cu.o\tabc\n"
        "10\t20510\t0\tx/ggml-cuda.dir/tmp/old/ggml_ext/kernels/g.cu.o\tdef\n"
        "0\t2000\t0\tggml/a.cu.o\tabc\n"  # a rebuild: the last record counts
    )
    assert read_log(log) == {"ggml/a.cu.o": 2.0, "ggml_ext/kernels/g.cu.o": 20.5}
    listing = tmp_path / "order"
    listing.write_text(
        "[1/3] Building CUDA object x/ggml-cuda.dir/work/main/ggml_ext/kernels/g.cu.o\n"
        "[2/3] Building CXX object ggml/a.cu.o\n"
        "[3/3] Linking CXX shared library lib.so\n"
    )
    assert read_order(listing) == ["ggml_ext/kernels/g.cu.o", "ggml/a.cu.o"]
    assert key("/w/ggml_ext/kernels/g.cu.o") == "ggml_ext/kernels/g.cu.o"


def test_a_long_object_listed_last_ends_the_build() -> None:
    short = [(f"s{i}", 10.0) for i in range(8)]
    span_last, ends = makespan([*short, ("long", 40.0)], 4)
    assert span_last == 60.0 and ends[-1] == (60.0, "long")  # starts once the short ones are done
    span_first, _ = makespan([("long", 40.0), *short], 4)
    assert span_first == 40.0  # the short ones run beside it


@given(st.lists(st.floats(0.1, 100.0), min_size=1, max_size=40), st.integers(1, 16))
def test_the_makespan_lies_between_its_bounds(times: list[float], jobs: int) -> None:
    span, ends = makespan([(str(i), t) for i, t in enumerate(times)], jobs)
    lower = max(max(times), sum(times) / jobs)
    assert lower - 1e-6 <= span <= sum(times) / jobs + max(times) + 1e-6  # list scheduling's bound
    assert len(ends) == len(times) and span == max(e for e, _ in ends)
