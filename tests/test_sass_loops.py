"""tools/device/sass_loops.py on a small `cuobjdump -sass` listing written here: the longest
backward branch holding a tensor-core op is the hot loop, its length, the instructions from its
barrier to the first tensor-core op, and the comparison with an older listing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.append(str(Path(__file__).resolve().parents[1] / "tools" / "device"))
from sass_loops import loops, main  # noqa: E402


def listing(body: list[str], name: str = "_Z6kernelv") -> str:
    """A function whose instructions are body, 16 bytes apart from 0x0000."""
    lines = [f"\t\tFunction : {name}", '\t.headerflags\t@"EF_CUDA_SM90"']
    for i, text in enumerate(body):
        lines.append(f"        /*{16 * i:04x}*/                   {text} ;   /* 0x000000000000 */")
    return "\n".join(lines) + "\n"


# 0x00 setup; loop 0x10..0x90: barrier, 2 address ops, 2 wgmmas, float step, back-branch; a
# second, shorter loop without tensor ops (an epilogue) must not be picked
KERNEL = [
    "MOV R1, c[0x0][0x28]",
    "DEPBAR.LE SB0, 0x1",
    "BAR.SYNC.DEFER_BLOCKING 0x0",
    "IADD3 R2, R2, 0x10, RZ",
    "@!P0 LDGSTS.E.BYPASS.128 [R3], desc[UR4][R4.64]",
    "IGMMA.64x64x32.U8.S8 R24, R164, gdesc[UR24], RZ, !UPT",
    "IGMMA.64x64x32.U8.S8 R56, R160, gdesc[UR24], RZ, !UPT",
    "I2FP.F32.S32 R5, R24",
    "FFMA R6, R5, R7, R6",
    "@P1 BRA 0x10",
    "FADD R6, R6, R6",
    "@P2 BRA 0xa0",
    "EXIT",
]


def test_the_hot_loop_is_the_tensor_core_one() -> None:
    found = loops(listing(KERNEL), "kernel")
    loop = found["_Z6kernelv"]
    assert loop.length == 9  # 0x10 .. 0x90
    assert loop.tensor_ops == 2
    assert loop.barrier_to_tensor == 3  # BAR, IADD3, LDGSTS, then the first IGMMA
    assert loop.mix["IGMMA"] == 2 and loop.mix["LDGSTS"] == 1 and loop.mix["BRA"] == 1


def test_kernels_without_a_tensor_core_loop_are_left_out() -> None:
    plain = listing(["FADD R1, R1, R1", "@P0 BRA 0x0", "EXIT"], name="_Z5plainv")
    assert loops(plain, ".") == {}


def test_before_compares_each_kernel_with_the_older_listing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = KERNEL[:3] + ["IADD3 R8, R8, 0x1, RZ"] * 4 + KERNEL[3:]
    old[-2] = "@P2 BRA 0xe0"
    (tmp_path / "new.sass").write_text(listing(KERNEL))
    (tmp_path / "old.sass").write_text(listing(old))
    assert main([str(tmp_path / "new.sass"), "kernel", "--before", str(tmp_path / "old.sass")]) == 0
    out = capsys.readouterr().out
    assert "9 instr" in out and "(was 13, 7 to the first)" in out


def test_no_matching_kernel_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "k.sass").write_text(listing(KERNEL))
    assert main([str(tmp_path / "k.sass"), "no_such_kernel"]) == 1
