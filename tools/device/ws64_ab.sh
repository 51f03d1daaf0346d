#!/usr/bin/env bash
# GPU: the int8 warp-specialized GEMM at 64 columns, the GEMM standalone (tools/device/gemv_standalone.cu,
# slim) in `ws64` mode ([gate; up], gdn_in, attn_q and ffn_down at 64 columns, code 91004014), twice.
# WS64_FLAG=-DNAME: an A/B, a build without and one with that flag, run alternately (the check lines'
# hashes, check_wgmma's at 64 columns and check_wgmma_split's, must agree between builds that should
# give the same bits; session 47 timed the 64-column scales' byte-permute words so, session 48 the
# split gather's one fence, both now the only form). Binaries built there from
# .carry/upstream.tar.gz's headers (nvcc -O3 -gencode arch=compute_90a,code=sm_90a
# -DGEMV_STANDALONE_SLIM [flag], ~1.5 min, both at once). WS64_ENV="VAR=VALUE[,VAR=VALUE] ...": also
# the first build run with each of those environments (A/Bs of launch switches, e.g.
# DFLASH_WG_STREAM=1), as `env-VAR-VALUE...`.
# WS64_NCU=1: then ncu (--set full) on one
# launch of each engine form at 64 columns (profile_64, the first build), the details and the SASS
# source page (per-instruction stall samples) into $OUT. Argument `build`: the binaries only
# (gpu_bench.sh h1 with H1_WS64=1 builds them beside the engine's build).
cd "$(dirname "$0")/../.." || exit 1
mkdir -p "$OUT" /tmp/ws64
builds="gemv_standalone${WS64_FLAG:+ gemv_standalone_flag}"
built=1
for v in $builds; do "/tmp/ws64/$v" none > /dev/null 2>&1 || built=0; done
if [ "$built" = 0 ]; then
  mkdir -p /tmp/up && { [ -d /tmp/up/ggml ] || tar xzf .carry/upstream.tar.gz -C /tmp/up; }
  T=/tmp/up/ggml
  for v in $builds; do
    flag=""
    [ "$v" = gemv_standalone_flag ] && flag=$WS64_FLAG
    # shellcheck disable=SC2086  # no flag: no argument
    nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -DGEMV_STANDALONE_SLIM $flag -o "/tmp/ws64/$v" \
      tools/device/gemv_standalone.cu -I$T/src -I$T/include -I$T/src/ggml-cuda -Iggml_ext/include \
      -Iggml_ext/kernels -DGGML_USE_CUDA > "/tmp/ws64/$v.log" 2>&1 &
  done
  wait
fi
[ "${1-}" = build ] && exit 0
runs=$builds
for vs in ${WS64_ENV-}; do runs="$runs env-$(echo "$vs" | tr '=,' '--')"; done
for round in 1 2; do
  for v in $runs; do
    if [ "${v#env-}" != "$v" ]; then
      vs=$(echo "${v#env-}" | sed -E 's/([A-Z0-9_]+)-([^-]+)-?/\1=\2 /g')
      # shellcheck disable=SC2086  # VAR=VALUE words
      timeout 60 env $vs /tmp/ws64/gemv_standalone ws64 >> "$OUT/ws64-$v.jsonl" 2>&1
    else
      timeout 60 "/tmp/ws64/$v" ws64 >> "$OUT/ws64-$v.jsonl" 2>&1
    fi
    echo "[gpu] $v round $round rc=$?"
  done
done
# shellcheck disable=SC2046  # one path per run
python3 - $(for v in $runs; do echo "$OUT/ws64-$v.jsonl"; done) <<'PY'
import json, sys
for path in sys.argv[1:]:
    rows = [json.loads(l) for l in open(path) if l.startswith("{")]
    bench = [(r["bench_mma"], r["us"]) for r in rows if "bench_mma" in r]
    bits = sorted({r["out_hash"] for r in rows if "check_wgmma" in r and r["ncols"] == 64})
    bits += sorted({r["out_hash"] + "/" + r["two_wg_hash"] for r in rows if "check_wgmma_split" in r})
    ok = all(r["ok"] for r in rows if "ok" in r)
    print(path.rsplit("/", 1)[-1], "checks ok" if ok else "CHECK FAILED", "out_hash", bits, bench)
PY
if [ "${WS64_NCU:-0}" = 1 ]; then
  cd /tmp/ws64 || exit 1
  timeout 90 ncu --clock-control none --set full -k regex:"gemm_q4k_wgmma_ws|gemm_kquant_mma_kernel" \
    -o "$OUT/p64" ./gemv_standalone profile_64 > "$OUT/ncu-p64.log" 2>&1
  echo "[gpu] ncu rc=$?"
  ncu -i "$OUT/p64.ncu-rep" --page details > "$OUT/p64-details.txt" 2>&1
  ncu -i "$OUT/p64.ncu-rep" --page source --csv --print-source sass > "$OUT/p64-source.csv" 2>&1
  gzip -f "$OUT/p64-source.csv" "$OUT/p64.ncu-rep"
  grep -E "Duration|Issued Warp|Eligible Warps|No Eligible" "$OUT/p64-details.txt" | head -20
fi
