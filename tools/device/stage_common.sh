# Sourced by the staged GPU scripts (gpu_bench.sh, gpu_mmq_tiles.sh): build (setup.sh), the
# call's clock, and the 27B-shaped target + drafter written in the background.
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
mkdir -p "$OUT"
t0=$(date +%s)
# /tmp/q27.gguf + /tmp/d27.gguf, in the background (setsid: it outlives this call, not the
# machine; the next call, within 30 s, finds them)
start_27b_synth() {
  [ -f /tmp/d27.gguf ] && return
  setsid bash -c 'python3 -m dflash.synth model --preset qwen36-27b --out /tmp/q27.gguf &&
    python3 -m dflash_convert.synthetic /tmp/d27dir --preset 27b &&
    python3 -m dflash_convert.cli /tmp/d27dir -o /tmp/d27.part --outtype bf16 --target /tmp/q27.gguf &&
    mv /tmp/d27.part /tmp/d27.gguf' > /tmp/synth.log 2>&1 < /dev/null &
}
source tools/device/setup.sh
set +e +u +o pipefail
export DFLASH_COMMIT=${DFLASH_COMMIT:-unknown}
# seconds left of the call (CALL_S: the call's limit less a margin; 585 for a 600 s call)
left() { echo $((${CALL_S:-585} - ($(date +%s) - t0))); }

# The CUDA test suite (TF32 off: see tests/gpu_policy.py) into $OUT/cuda-tests.log:
# run_cuda_suite SECONDS [more pytest ids...]
CUDA_TESTS="tests/test_tree_ops.py tests/test_mul_mat_invariant.py tests/test_mul_mat_tiles.py tests/test_top_k_rows.py
  tests/test_gemv_kquant.py tests/test_stacked_projections.py tests/test_oracle_upstream.py tests/test_gdn_decode_inputs.py
  tests/test_verify_commit.py tests/test_tree_verify.py tests/test_spec_chain.py tests/test_ddtree.py
  tests/test_attn_paths.py tests/test_batch_invariant.py tests/test_gdn_chain.py tests/test_quantizer_fusions.py"
run_cuda_suite() {
  local secs=$1; shift
  # shellcheck disable=SC2086  # the list splits on purpose
  NVIDIA_TF32_OVERRIDE=0 DFLASH_TEST_NGL=99 DFLASH_REQUIRE_CUDA=1 timeout "$secs" python3 -m pytest -q -s \
    -p no:cacheprovider $CUDA_TESTS "$@" > "$OUT/cuda-tests.log" 2>&1
  echo "[gpu] CUDA tests rc=$? at $(($(date +%s) - t0)) s: $(tail -n 1 "$OUT/cuda-tests.log")"
  grep -E "^(FAILED|ERROR)|identical" "$OUT/cuda-tests.log" | head -n 30
}

# The CUDA tests of a pytest -k expression under each of several environments at once (a GPU is
# shared: for tests whose output, not time, differs by a switch), each into
# $OUT/env-tests-<VAR=VALUE set>.log: env_tests SECONDS KEXPR VAR=VALUE[,VAR=VALUE]...
env_tests() {
  local secs=$1 kexpr=$2; shift 2
  for vs in "$@"; do
    # shellcheck disable=SC2046  # VAR=VALUE pairs split on purpose
    (env $(echo "$vs" | tr ',' ' ') NVIDIA_TF32_OVERRIDE=0 DFLASH_TEST_NGL=99 DFLASH_REQUIRE_CUDA=1 timeout "$secs" \
      python3 -m pytest -q -p no:cacheprovider $CUDA_TESTS -k "$kexpr" > "$OUT/env-tests-$vs.log" 2>&1
      echo "[gpu] $vs: $(grep -E 'max abs diff|passed|failed' "$OUT/env-tests-$vs.log" | tr '\n' ' ' | cut -c1-400)") &
  done
  wait
}

# Autoregressive decoding of MODEL next to upstream libllama in the same process, into $OUT/JSON:
# ar_bench SECONDS MODEL JSON [VAR=VALUE...]
ar_bench() {
  local secs=$1 model=$2 json=$3; shift 3
  env "$@" timeout "$secs" python3 -m dflash.bench -m "$model" --kv-types f16 -p 512 -n 128 -r 3 \
    -o "$OUT/$json" > "$OUT/ar.log" 2>&1
  echo "[gpu] AR $json $* rc=$? at $(($(date +%s) - t0)) s"; tail -n 3 "$OUT/ar.log"
}

# Split "VAR=VALUE ... -- bench args ..." into $ENVS and $XARGS (helpers below).
split_env_args() {
  ENVS=(); XARGS=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do ENVS+=("$1"); shift; done
  [ "${1-}" = "--" ] && shift
  XARGS=("$@")
}

# The 27B's chain (synthetic acceptance 10) into $OUT/JSON: chain_bench SECONDS JSON [VAR=VALUE...]
# [-- bench args]; with "-- --llama-server ..." upstream's draft-dflash runs beside it.
chain_bench() {
  local secs=$1 json=$2; shift 2; split_env_args "$@"
  env "${ENVS[@]}" timeout "$secs" python3 -m dflash.bench -m /tmp/q27.gguf --draft /tmp/d27.gguf --kv-types f16 \
    -p 512 -n 128 -r 3 --no-upstream --synthetic-accept 10 "${XARGS[@]}" -o "$OUT/$json" > "$OUT/${json%.json}.log" 2>&1
  echo "[gpu] chain $json ${ENVS[*]} rc=$? at $(($(date +%s) - t0)) s"; tail -n 6 "$OUT/${json%.json}.log"
}

# The 27B's DDTree step cost per budget into $OUT/JSON: tree_steps SECONDS JSON BUDGETS [VAR=VALUE...]
# [-- bench args]
tree_steps() {
  local secs=$1 json=$2 budgets=$3; shift 3; split_env_args "$@"
  env "${ENVS[@]}" timeout "$secs" python3 -m dflash.bench --tree-steps -m /tmp/q27.gguf --draft /tmp/d27.gguf \
    -ngl 99 -c 4096 --kv-type f16 --synthetic-accept 8 --budgets "$budgets" "${XARGS[@]}" -o "$OUT/$json" \
    > "$OUT/${json%.json}.log" 2>&1
  echo "[gpu] tree-steps $json ${ENVS[*]} rc=$? at $(($(date +%s) - t0)) s"; tail -n 12 "$OUT/${json%.json}.log"
}

# Waits (up to the call's last MIN_LEFT seconds) for start_27b_synth's pair: wait_27b MIN_LEFT
wait_27b() {
  until [ -f /tmp/d27.gguf ] || [ "$(left)" -lt "$1" ]; do sleep 2; done
}

# The 27B's kernels per step (tools/device/kernel_profile.py) into $OUT/JSON (h200-27b-kernels.json):
# kernel_profile SECONDS [JSON [VAR=VALUE...]] (KP_ARGS: more kernel_profile.py arguments)
kernel_profile() {
  local secs=$1 json=${2:-h200-27b-kernels.json}; shift; [ $# -gt 0 ] && shift
  env "$@" timeout "$secs" python3 tools/device/kernel_profile.py -m /tmp/q27.gguf --draft /tmp/d27.gguf \
    --label 27b-q4km --steps 10 ${KP_ARGS-} -o "$OUT/$json" > "$OUT/${json%.json}.log" 2>&1
  echo "[gpu] 27B kernel profile $json $* rc=$? at $(($(date +%s) - t0)) s"
}

# A call returns at most 8 files: pack_out NAME moves everything in $OUT into $OUT/all-NAME.tgz.
pack_out() {
  (cd "$OUT" && ls | grep -v '^all-.*\.tgz$' > /tmp/pack.list && tar czf "all-$1.tgz" -T /tmp/pack.list &&
    xargs rm -f < /tmp/pack.list)
  echo "[gpu] packed $OUT/all-$1.tgz"
}
