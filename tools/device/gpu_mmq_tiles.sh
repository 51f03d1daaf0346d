#!/usr/bin/env bash
# ggml_ext's mmq launch policy (ggml_ext::mul_mat_tiles, patches/0003) on the GPU, in two
# back-to-back calls. `gpu_mmq_tiles.sh d`: build, the 27B-shaped pair written in the background,
# the matmul op tests (CUDA vs ggml), the matmul bench (ggml / tiles / invariant), the tiny pair's
# step split and kernels with the policy off (DFLASH_MMQ_FIXUP_ITERS=0: ggml's own stream-k
# choice) and on, then the pair preset (ours only; upstream's modes do not use the policy).
# `gpu_mmq_tiles.sh e`: the 27B chain vs upstream draft-dflash and the 27B tree steps with it.
# `gpu_mmq_tiles.sh f`: a short re-check in one call (matmul bench, pair steps, pair chain/b64).
# Carry: .carry/upstream.tar.gz and .carry/whl. JSON and logs land in $OUT.
stage=${1:-d}
source "$(dirname "$0")/stage_common.sh"
PAIR=dflash/data/pair

if [ "$stage" = d ]; then
  start_27b_synth
  DFLASH_TEST_NGL=99 DFLASH_REQUIRE_CUDA=1 timeout 60 python3 -m pytest -q -p no:cacheprovider \
    tests/test_mul_mat_tiles.py tests/test_mul_mat_invariant.py > "$OUT/cuda-matmul-tests.log" 2>&1
  echo "[gpu] matmul tests rc=$? at $(($(date +%s) - t0)) s: $(tail -n 1 "$OUT/cuda-matmul-tests.log")"
  timeout 60 python3 -m dflash.bench --matmul -o "$OUT/h200-matmul-tiles.json" > "$OUT/matmul.log" 2>&1
  echo "[gpu] matmul bench rc=$?"; cat "$OUT/matmul.log"
  for it in 0 6; do
    DFLASH_MMQ_FIXUP_ITERS=$it timeout 40 python3 -m dflash.bench --tree-steps -m "$PAIR/target-q8_0.gguf" \
      --draft "$PAIR/drafter-q8_0.gguf" -ngl 99 -c 2048 --budgets 1,15,32,64 --synthetic-accept 6 --no-upstream \
      -o "$OUT/h200-pair-tree-steps-fixup$it.json" > "$OUT/pair-steps-fixup$it.log" 2>&1
    echo "[gpu] pair steps (DFLASH_MMQ_FIXUP_ITERS=$it) rc=$?"; tail -n 7 "$OUT/pair-steps-fixup$it.log"
  done
  timeout 40 python3 tools/device/kernel_profile.py -m "$PAIR/target-q8_0.gguf" --draft "$PAIR/drafter-q8_0.gguf" \
    --label pair-tiles -o "$OUT/h200-pair-kernels-tiles.json" > "$OUT/kernels-pair.log" 2>&1
  echo "[gpu] pair kernel profile rc=$?"; grep -v "^ " "$OUT/kernels-pair.log" | grep -v Warn
  timeout "$(left)" python3 -m dflash.bench --pair "$PAIR" --prompts bench/prompts/pair-heldout-code48.jsonl \
    -ngl 99 -n 512 --budgets 32,64,128 --no-upstream --no-upstream-spec -o "$OUT/h200-pair-tiles.json" \
    > "$OUT/pair-bench.log" 2>&1
  echo "[gpu] pair bench rc=$? at $(($(date +%s) - t0)) s"; head -n 6 "$OUT/pair-bench.log"
  exit 0
fi

if [ "$stage" = f ]; then  # a re-check after a change of the policy's cost (one call, fresh machine)
  timeout 40 python3 -m dflash.bench --matmul --shapes attn_q:12288:5120:q4_K,pair_up:1024:512:q8_0,pair_down:512:1024:q8_0 \
    -o "$OUT/h200-matmul-tiles.json" > "$OUT/matmul.log" 2>&1
  echo "[gpu] matmul bench rc=$?"; cat "$OUT/matmul.log"
  timeout 40 python3 -m dflash.bench --tree-steps -m "$PAIR/target-q8_0.gguf" --draft "$PAIR/drafter-q8_0.gguf" \
    -ngl 99 -c 2048 --budgets 1,15,32,64 --synthetic-accept 6 --no-upstream -o "$OUT/h200-pair-tree-steps-tiles.json" \
    > "$OUT/pair-steps.log" 2>&1
  echo "[gpu] pair steps rc=$?"; tail -n 7 "$OUT/pair-steps.log"
  timeout "$(left)" python3 -m dflash.bench --pair "$PAIR" --prompts bench/prompts/pair-heldout-code48.jsonl \
    -ngl 99 -n 512 --budgets 64 --no-upstream --no-upstream-spec -o "$OUT/h200-pair-tiles.json" > "$OUT/pair-bench.log" 2>&1
  echo "[gpu] pair bench rc=$? at $(($(date +%s) - t0)) s"; head -n 4 "$OUT/pair-bench.log"
  exit 0
fi

until [ -f /tmp/d27.gguf ] || [ "$(left)" -lt 300 ]; do sleep 2; done
timeout 150 python3 -m dflash.bench -m /tmp/q27.gguf --draft /tmp/d27.gguf --kv-types f16 -p 512 -n 128 -r 3 \
  --no-upstream --llama-server "$LLAMA_SERVER" --synth-len 10 -o "$OUT/h200-27b-chain-vs-upstream.json" \
  > "$OUT/chain-bench.log" 2>&1
echo "[gpu] chain bench rc=$? at $(($(date +%s) - t0)) s"; tail -n 5 "$OUT/chain-bench.log"
timeout "$(left)" python3 -m dflash.bench --tree-steps -m /tmp/q27.gguf --draft /tmp/d27.gguf -ngl 99 -c 4096 \
  --kv-type f16 --synthetic-accept 8 --budgets 1,4,16,32,64 -o "$OUT/h200-27b-tree-steps.json" \
  > "$OUT/tree-bench.log" 2>&1
echo "[gpu] tree-steps rc=$? at $(($(date +%s) - t0)) s"; tail -n 8 "$OUT/tree-bench.log"
