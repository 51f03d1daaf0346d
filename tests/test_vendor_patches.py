"""vendor/materialise.py: the upstream tree is copied, patched from ggml_ext/patches/series,
and a patch that does not apply stops the build with a clear message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "vendor" / "materialise.py"

PATCH = """--- a/ggml/CMakeLists.txt
+++ b/ggml/CMakeLists.txt
@@ -1 +1,2 @@
 project(ggml)
+# patched by ggml_ext
"""


def _run(tmp: Path, patches: dict[str, str]) -> subprocess.CompletedProcess[str]:
    src = tmp / "src"
    (src / "ggml").mkdir(parents=True, exist_ok=True)
    (src / "ggml" / "CMakeLists.txt").write_text("project(ggml)\n")
    pdir = tmp / "patches"
    pdir.mkdir(exist_ok=True)
    for name, text in patches.items():
        (pdir / name).write_text(text)
    (pdir / "series").write_text("# test series\n" + "\n".join(patches) + "\n")
    env = {**os.environ, "DFLASH_VENDOR_SRC": str(src), "DFLASH_PATCH_DIR": str(pdir)}
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--dest", str(tmp / "out")], capture_output=True, text=True, env=env
    )


def test_patch_applies(tmp_path: Path) -> None:
    r = _run(tmp_path, {"0001-mark.patch": PATCH})
    assert r.returncode == 0, r.stderr
    tree = Path(r.stdout.strip())
    assert "patched by ggml_ext" in (tree / "ggml" / "CMakeLists.txt").read_text()
    # a second run reuses the stamped tree
    assert _run(tmp_path, {"0001-mark.patch": PATCH}).stdout.strip() == str(tree)


def test_patch_that_does_not_apply_fails_clearly(tmp_path: Path) -> None:
    bad = PATCH.replace(" project(ggml)", " project(something_else)")
    r = _run(tmp_path, {"0001-bad.patch": bad})
    assert r.returncode == 1
    assert "ggml_ext patch 0001-bad.patch does not apply" in r.stderr


def test_repo_series_applies_to_pinned_upstream() -> None:
    # the committed series (possibly empty) is what the build used: every listed file exists
    series = ROOT / "ggml_ext" / "patches" / "series"
    names = [ln.strip() for ln in series.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    for n in names:
        assert (series.parent / n).is_file(), n
