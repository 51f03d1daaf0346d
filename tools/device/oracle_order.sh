#!/usr/bin/env bash
# GPU (a fresh machine, SETUP_TARGETS=_core): why test_chunked_prefill_matches_upstream_chunking
# (tiny-b f32, 16-token chunks against upstream) failed in session 24's whole CUDA suite. Builds,
# then ORACLE_MODE=files (default): tools/device/diag_oracle_chunks.py (the gap per chunk with each
# ggml_ext form off), the test alone and its module, then the test after each test file that comes
# before it in the suite's order (stage_common.sh's CUDA_TESTS), four at a time; ORACLE_MODE=suite:
# the whole CUDA suite, and when the test failed there, the test after each prefix of the files
# before it. Logs: $OUT/order-*.log, $OUT/oracle-chunks.jsonl, $OUT/cuda-tests.log.
source "$(dirname "$0")/stage_common.sh"
trap "pack_out oracle" EXIT
T=tests/test_oracle_upstream.py::test_chunked_prefill_matches_upstream_chunking
run() {  # run NAME PYTEST-ARGS...
  local name=$1; shift
  NVIDIA_TF32_OVERRIDE=0 DFLASH_TEST_NGL=99 DFLASH_REQUIRE_CUDA=1 timeout 240 python3 -m pytest -q -s \
    -p no:cacheprovider "$@" > "$OUT/order-$name.log" 2>&1
  echo "[gpu] $name rc=$? at $(($(date +%s) - t0)) s: $(tail -n 1 "$OUT/order-$name.log")"
}
BEFORE="tree_ops mul_mat_invariant mul_mat_tiles top_k_rows gemv_kquant stacked_projections"
if [ "${ORACLE_MODE:-files}" = suite ]; then
  run_cuda_suite 200
  if grep -q "^FAILED.*chunked_prefill_matches_upstream" "$OUT/cuda-tests.log"; then
    prefix=""
    for f in $BEFORE; do
      prefix="$prefix tests/test_$f.py"
      [ "$(left)" -ge 60 ] || break
      # shellcheck disable=SC2086  # the list splits on purpose
      run "upto-$f" $prefix tests/test_oracle_upstream.py &
      while [ "$(jobs -rp | wc -l)" -ge 3 ]; do sleep 2; done
    done
    wait
  fi
else
  NVIDIA_TF32_OVERRIDE=0 timeout 120 python3 tools/device/diag_oracle_chunks.py > "$OUT/oracle-chunks.jsonl" 2>&1
  cut -c1-200 "$OUT/oracle-chunks.jsonl"
  run alone "$T"
  run module tests/test_oracle_upstream.py
  for f in ${ORDER_FILES:-$BEFORE}; do
    [ "$(left)" -ge 60 ] || break
    run "$f" "tests/test_$f.py" "$T" &
    while [ "$(jobs -rp | wc -l)" -ge 4 ]; do sleep 2; done
  done
  wait
fi
grep -h "max abs diff\|^FAILED" "$OUT"/order-*.log "$OUT/cuda-tests.log" 2>/dev/null | head -20
