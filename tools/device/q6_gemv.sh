#!/usr/bin/env bash
# GPU: the staged Q6_K GEMV of a decode step on its own (session 51: the AR step's Q6_K GEMVs other
# than the LM head read at ~1.7 TB/s on the H100). The GEMM standalone (slim, ws64_ab.sh's build
# from .carry/upstream.tar.gz's headers, ~1.5 min), then its `q6` mode twice (every layout of the
# 27B's Q6_K ffn_down, GDN attn_qkv and LM head at 1, 2 and 8 columns; staged with 2 stages, and with
# 3 at one column: "stages" in each line; each of those at one column also with its blocks copied
# as runs, "spans") into $OUT/q6.jsonl, then ncu (--set full) on `profile_q6`'s eight launches
# (ffn_down and attn_qkv, 2 and 3 stages, without and with runs): details, and the SASS page gzipped.
cd "$(dirname "$0")/../.." || exit 1
mkdir -p "$OUT"
bash tools/device/ws64_ab.sh build
BIN=/tmp/ws64/gemv_standalone
for round in 1 2; do
  timeout 90 "$BIN" q6 >> "$OUT/q6.jsonl" 2>&1
  echo "[gpu] q6 round $round rc=$?"
done
python3 - "$OUT/q6.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
for r in rows:
    if r.get("n") == 1 and r.get("staged"):
        print(f'{r["bench"]:>9} split={r["split"]} rows={r["rows_per_warp"]} stages={r["stages"]} '
              f'spans={int(r.get("spans", False))} '
              f'{r["us"]:8.2f} us {r["GBps"]:6.0f} GB/s')
PY
cd /tmp/ws64 || exit 1
timeout 150 ncu --clock-control none --set full -k regex:gemv_q6k_staged -o "$OUT/q6" ./gemv_standalone profile_q6 \
  > "$OUT/ncu-q6.log" 2>&1
echo "[gpu] ncu rc=$?"
ncu -i "$OUT/q6.ncu-rep" --page details > "$OUT/q6-details.txt" 2>&1
ncu -i "$OUT/q6.ncu-rep" --page source --csv --print-source sass > "$OUT/q6-source.csv" 2>&1
gzip -f "$OUT/q6-source.csv" "$OUT/q6.ncu-rep"
grep -E "Duration|Memory Throughput|Achieved Occupancy|Issued Warp|Eligible Warps|No Eligible" "$OUT/q6-details.txt" | head -40
