#!/usr/bin/env bash
# GPU: build, find which ggml-cuda switch avoids the CUDA fault seen this session (tiny engine run
# under each), then the benches with it. Carry: .carry (upstream.tar.gz, whl/, pair/).
cd "$(dirname "$0")/../.."
mkdir -p "$OUT"
t0=$(date +%s)
source tools/device/setup.sh > /tmp/setup.log 2>&1
set +e +u +o pipefail
echo "[gpu] build done at $(($(date +%s) - t0)) s"
(python3 -m dflash.synth model --preset qwen36-27b --out /tmp/q27.gguf > /tmp/synth.log 2>&1 &&
  python3 -m dflash_convert.synthetic /tmp/d27dir --preset 27b >> /tmp/synth.log 2>&1 &&
  python3 -m dflash_convert.cli /tmp/d27dir -o /tmp/d27.gguf --outtype bf16 --target /tmp/q27.gguf >> /tmp/synth.log 2>&1) &
synth=$!
ENVS=("" "GGML_CUDA_DISABLE_FUSION=1" "GGML_CUDA_PDL=0" "GGML_CUDA_DISABLE_GRAPHS=1"
  "GGML_CUDA_DISABLE_FUSION=1 GGML_CUDA_PDL=0 GGML_CUDA_DISABLE_GRAPHS=1")
good=none
for e in "${ENVS[@]}"; do
  if env $e timeout 60 python3 tools/device/diag_cuda.py tiny-a > /tmp/d.log 2>&1 && env $e timeout 60 python3 tools/device/diag_cuda.py tiny-b >> /tmp/d.log 2>&1; then good=$e; break; fi
  echo "[gpu] env '$e': $(grep -m1 -i "error" /tmp/d.log)"
done
echo "[gpu] working env: '$good' at $(($(date +%s) - t0)) s"
[ "$good" = none ] && exit 0
# shellcheck disable=SC2163
for kv in $good; do export "$kv"; done
echo "$good" > "$OUT/cuda-env.txt"
DFLASH_TEST_NGL=99 timeout 60 python3 -m pytest -q -x -p no:cacheprovider tests/test_verify_commit.py tests/test_tree_verify.py > "$OUT/cuda-tests.log" 2>&1
echo "[gpu] tests rc=$? $(tail -n 1 "$OUT/cuda-tests.log")"
timeout 70 python3 -m dflash.bench --pair .carry/pair --prompts dflash/data/pair/prompts.jsonl -ngl 99 -n 128 \
  --budgets 4,16,64 -o "$OUT/h200-pair.json" > "$OUT/pair-bench.log" 2>&1
echo "[gpu] pair bench rc=$?"; tail -n 16 "$OUT/pair-bench.log"
wait "$synth"
timeout 130 python3 -m dflash.bench -m /tmp/q27.gguf --draft /tmp/d27.gguf --kv-types f16 -p 512 -n 128 -r 2 \
  --no-upstream --llama-server "$LLAMA_SERVER" --synth-len 10 -o "$OUT/h200-27b-chain-vs-upstream.json" \
  > "$OUT/chain-bench.log" 2>&1
echo "[gpu] chain bench rc=$? at $(($(date +%s) - t0)) s"; tail -n 12 "$OUT/chain-bench.log"
left=$((585 - ($(date +%s) - t0)))
timeout "$left" python3 -m dflash.bench --tree-steps -m /tmp/q27.gguf --draft /tmp/d27.gguf -ngl 99 -c 4096 \
  --kv-type f16 --synthetic-accept 8 --budgets 1,4,16,64,256 --steps 12 -r 5 -o "$OUT/h200-27b-tree-steps.json" > "$OUT/tree-bench.log" 2>&1
echo "[gpu] tree-steps rc=$? at $(($(date +%s) - t0)) s"; tail -n 12 "$OUT/tree-bench.log"
