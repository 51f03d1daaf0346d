#!/usr/bin/env bash
# GPU: ggml_ext's k-quant GEMV and its tensor-core GEMM on their own (tools/device/gemv_standalone.cu;
# argument: all, check, bench, q6, q5q8, mma, long, rows, tiles, check_mma, wgmma, split, quant, q6wg or profile_engine): the binary carried
# gzipped as .carry/gemv_standalone.gz (built here with nvcc -O3 for sm_90a; gzip keeps the
# carry under 64 MiB; -DGEMV_STANDALONE_SLIM keeps the engine's forms only and, stripped, makes it
# ~3 MB gzipped: nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -DGEMV_STANDALONE_SLIM,
# sm_90a for the wgmma form; write its commit to .carry/gemv_standalone.commit), or built there from
# the carried upstream headers when it does not start. CALL_LEFT: seconds the caller has left. JSON lines in $OUT/gemv-standalone.jsonl.
cd "$(dirname "$0")/../.." || exit 1
mkdir -p "$OUT"
BIN=/tmp/gemv_standalone_carried
[ -f .carry/gemv_standalone.gz ] && [ ! -x "$BIN" ] && gzip -dc .carry/gemv_standalone.gz > "$BIN" && chmod +x "$BIN"
[ -x /tmp/gemv_standalone ] && ! "$BIN" none > /dev/null 2>&1 && BIN=/tmp/gemv_standalone  # built by an earlier call
if ! "$BIN" none > /dev/null 2>&1; then
  mkdir -p /tmp/up && tar xzf .carry/upstream.tar.gz -C /tmp/up
  T=/tmp/up/ggml
  nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o /tmp/gemv_standalone tools/device/gemv_standalone.cu -I$T/src -I$T/include \
    -I$T/src/ggml-cuda -Iggml_ext/include -Iggml_ext/kernels -DGGML_USE_CUDA 2>&1 | grep -E "error" | head
  BIN=/tmp/gemv_standalone
fi
# which binary ran: the carried one names its commit (.carry/gemv_standalone.commit, written when it
# is built); a binary older than the kernels it should time measures old code
if [ "$BIN" = /tmp/gemv_standalone_carried ]; then
  echo "binary: carried, built at $(cat .carry/gemv_standalone.commit 2>/dev/null || echo 'an unknown commit')"
else
  echo "binary: built here from this tree"
fi
timeout "$(( ${CALL_LEFT:-160} - 10 ))" "$BIN" "${1:-all}" > "$OUT/gemv-standalone.jsonl" 2>&1
echo "rc=$?"
grep check "$OUT/gemv-standalone.jsonl"
python3 - "$OUT/gemv-standalone.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
best = {}
for r in rows:
    if "bench" in r and "n" in r:
        key = (r["bench"], r["type"], r["n"])
        print(f'{r["bench"]:>9} {r["type"]} n={r["n"]} split={r["split"]} rows={r["rows_per_warp"]} '
              f'unroll={r.get("unroll", 2)} staged={r.get("staged", False)} {r["us"]:8.2f} us {r["GBps"]:6.0f} GB/s')
    elif "bench_mma_split" in r:
        form = "act_smem" if r.get("act_smem") else "warp_rows" if r.get("warp_rows") else "block"
        print(f'{r["bench_mma_split"]:>9} {r["type"]} split n={r["n"]} {form:>9} pieces={r["pieces"]} '
              f'{r["us"]:8.2f} us {r["GBps"]:6.0f} GB/s')
    elif "bench_f16_wgmma" in r:
        print(f'{r["bench_f16_wgmma"]:>11} {r["type"]} f16 wgmma n={r["n"]} int8 mma {r["us_mma"]:.2f} '
              f'int8 wgmma {r["us_int8_wgmma"]:.2f} | s3 {r["us_wg_s3"]:.2f} s3split {r["us_wg_s3_split"]:.2f} '
              f'(p{r["pieces_s3"]}) s4split {r["us_wg_s4_split"]:.2f} 2wg {r["us_wg_2wg_split"]:.2f} '
              f'(p{r["pieces_2wg"]}) ws {r.get("us_ws_split", 0):.2f} ws2 {r.get("us_ws2_split", 0):.2f} us; '
              f'quant {r["us_quantize_int8"]:.2f} f16 {r["us_convert_f16"]:.2f} us')
    elif "bench_quant" in r:
        print(f'quant {r["bench_quant"]:>6} {r["layout"]:>5} n={r["n"]:2d} {r["form"]:>15} {r["us"]:7.3f} us')
    elif "bench_mma" in r:
        print(f'{r["bench_mma"]:>9} {r["type"]} mma n={r["n"]} stages={r["stages"]} {r["us"]:8.2f} us {r["GBps"]:6.0f} GB/s')
    elif "bench" in r:
        print(r)
PY
