#!/usr/bin/env bash
# GPU: build, then the smallest CUDA engine run under each scheduler switch (DFLASH_DEBUG_SCHED,
# see target_engine.cpp) to find which change since the last good CUDA run causes the fault.
cd "$(dirname "$0")/../.."
source tools/device/setup.sh > /tmp/setup.log 2>&1; set +e +u +o pipefail; tail -n 2 /tmp/setup.log
for m in 0 1 2 3 4 7; do
  for p in tiny-a tiny-b; do
    DFLASH_DEBUG_SCHED=$m timeout 60 python3 tools/device/diag_cuda.py "$p" > /tmp/d.log 2>&1
    echo "[gpu] DFLASH_DEBUG_SCHED=$m $p rc=$? $(grep -m1 -E 'generate ok|CUDA error' /tmp/d.log)"
  done
done
GGML_SCHED_DEBUG=2 DFLASH_DEBUG_SCHED=0 timeout 60 python3 tools/device/diag_cuda.py tiny-a > "$OUT/sched-debug.log" 2>&1
head -c 20000 "$OUT/sched-debug.log" | grep -n "SPLIT\|split\|set_rows\|SET_ROWS\|kv_idx\|CPU\|CUDA0" | head -40
