#!/usr/bin/env bash
# GPU: Nsight Compute on the kernels of one forward of N tokens of the 27B-shaped target (after
# setup.sh and a 27B file at /tmp/q27.gguf with its drafter /tmp/d27.gguf, e.g. after `gpu_bench.sh
# ar1`), through tools/device/ncu_forward.py (one forward, no PyTorch profiler beside ncu).
# NCU_N: forward sizes (default "16 64"); NCU_K: ncu's kernel regex (default the one-round delta
# rule and the mma.sync GEMM: at 16 tokens layer 0's [q; k; v; z], delta rule, ssm_out and [gate;
# up] come first, at 64 the delta rule and ssm_out of layers 0 and 1); NCU_COUNT: launches (4);
# NCU_SKIP: matches skipped first (0); NCU_S: seconds a size (60). Details of each launch in
# $OUT/ncu-forwardN.txt, and its key lines printed. Session 54's run showed the 27B's first layer
# as z (lone, 6144 rows), attn_qkv (Q6_K), the delta rule, ssm_out, then [gate; up]: at 16 tokens
# NCU_SKIP=4 NCU_COUNT=1 puts [gate; up] alone under ncu.
cd "$(dirname "$0")/../.." || exit 1
mkdir -p "$OUT"
for n in ${NCU_N:-16 64}; do
  timeout "${NCU_S:-60}" ncu --graph-profiling node -k "regex:${NCU_K:-gdn_chain_one_round|gemm_kquant_mma}" \
    --launch-skip "${NCU_SKIP:-0}" --launch-count "${NCU_COUNT:-4}" --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
    python3 tools/device/ncu_forward.py "$n" > "$OUT/ncu-forward$n.txt" 2>&1
  echo "[gpu] ncu forward $n rc=$?"
  grep -E "^  [a-z_].*\(|Duration|Memory Throughput|L2 Cache Throughput|DRAM Throughput|Issue Slots Busy|No Eligible|Achieved Occupancy|Stall" \
    "$OUT/ncu-forward$n.txt" | cut -c1-160 | head -80
done
