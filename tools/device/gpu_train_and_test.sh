#!/usr/bin/env bash
# GPU call 1 of 2: start training the pair in the background (setsid, so it outlives this call;
# gpu_bench.sh collects it), build for sm_90, write the 27B-shaped benchmark files, and run the
# engine tests on CUDA. Carry: .carry (upstream.tar.gz, whl/, pair-run/ = the corpus stage built
# on the dev machine, so the device trains on exactly the corpus the prompt set was drawn from).
cd "$(dirname "$0")/../.." || exit 1
mkdir -p "$OUT"
t0=$(date +%s)
rm -rf /tmp/pair && cp -r .carry/pair-run /tmp/pair
setsid nohup bash tools/train_pair/run.sh /tmp/pair --resume --target-minutes "${TARGET_MIN:-4.5}" \
  --regen-minutes "${REGEN_MIN:-1}" --drafter-minutes "${DRAFTER_MIN:-3.5}" > /tmp/pair-run.log 2>&1 < /dev/null &
source tools/device/setup.sh
set +e +u +o pipefail
echo "[gpu] build done at $(($(date +%s) - t0)) s"
# 27B-shaped target (Q4_K_M-like) + BF16 drafter of the 27B drafter's shape
(python3 -m dflash.synth model --preset qwen36-27b --out /tmp/q27.gguf > /tmp/synth.log 2>&1 &&
  python3 -m dflash_convert.synthetic /tmp/d27dir --preset 27b >> /tmp/synth.log 2>&1 &&
  python3 -m dflash_convert.cli /tmp/d27dir -o /tmp/d27.gguf --outtype bf16 --target /tmp/q27.gguf >> /tmp/synth.log 2>&1;
  echo "[gpu] 27B files rc=$? at $(($(date +%s) - t0)) s" >> /tmp/synth.log) &
synth=$!
export DFLASH_TEST_NGL=99 DFLASH_REQUIRE_CUDA=1
left=$((560 - ($(date +%s) - t0)))
timeout "$left" python3 -m pytest -q -p no:cacheprovider tests/test_tree_ops.py tests/test_tree_verify.py \
  tests/test_oracle_upstream.py tests/test_verify_commit.py tests/test_spec_chain.py tests/test_ddtree.py \
  > "$OUT/cuda-tests.log" 2>&1
echo "[gpu] tests rc=$? at $(($(date +%s) - t0)) s"
tail -n 25 "$OUT/cuda-tests.log"
wait "$synth"  # not the training: it carries on into the next call
cat /tmp/synth.log | tail -3
tail -n 4 /tmp/pair/train.log
cp /tmp/pair/train.log /tmp/pair-run.log "$OUT/" 2>/dev/null
nvidia-smi --query-gpu=name,memory.used --format=csv
