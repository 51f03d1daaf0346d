#!/usr/bin/env bash
# GPU benches in back-to-back calls (the machine stays warm 30 s after a call, keeping the
# build and /tmp): `gpu_bench.sh a` builds, writes the 27B-shaped pair in the background, runs
# the CUDA test suite, the oracle diagnosis and the tensor-core GEMM's standalone check;
# `gpu_bench.sh m` the matmul benches; `gpu_bench.sh b` runs the 27B chain vs upstream
# draft-dflash at the same synthetic acceptance (issue 3), the 27B chain with decode-identical
# verifies, the DDTree step cost per budget (issue 4) and the kernels per step (issue 7, PyTorch's
# profiler around our engine) for the 27B and the tiny pair; `gpu_bench.sh c` runs where the tiny
# pair's step time goes (CUDA graphs on/off) and the packaged pair's preset (AR / chain / upstream
# / DDTree sweep; issue 5). JSON and logs land in $OUT. Carry: .carry/upstream.tar.gz,
# .carry/whl and .carry/gemv_standalone.gz (tools/device/gemv_standalone.sh; built there when absent).
# PAIR=/tmp/pair/export benches a pair that gpu_train_and_test.sh trained instead of the packaged one.
stage=${1:-a}
if { [ "$stage" = s ] || [ "$stage" = g1 ] || [ "$stage" = k1 ]; } && [ ! -x /tmp/gemv_standalone ]; then  # the standalone binary, built beside setup.sh's build
  mkdir -p /tmp/up && { [ -d /tmp/up/ggml ] || tar xzf .carry/upstream.tar.gz -C /tmp/up; }
  (T=/tmp/up/ggml; nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o /tmp/gemv_standalone.part tools/device/gemv_standalone.cu \
    -I$T/src -I$T/include -I$T/src/ggml-cuda -Iggml_ext/include -Iggml_ext/kernels -DGGML_USE_CUDA > /tmp/nvcc-sa.log 2>&1 &&
    mv /tmp/gemv_standalone.part /tmp/gemv_standalone) &
  SA_PID=$!
fi
# h1 with H1_WS64=1: the GEMM standalone's builds for tools/device/ws64_ab.sh (two with WS64_FLAG), beside the build
if [ "$stage" = h1 ] && [ "${H1_WS64:-0}" = 1 ]; then
  mkdir -p /tmp/up /tmp/ws64 && { [ -d /tmp/up/ggml ] || tar xzf .carry/upstream.tar.gz -C /tmp/up; }
  bash tools/device/ws64_ab.sh build > /tmp/ws64/build.log 2>&1 &
  WS64_PID=$!
fi
# `gpu_bench.sh t1` (session 17; session 18's first call): the chain delta rule alone
# (.carry/gdn_sa/*: tools/device/gdn_chain_standalone.cu built here, default and staged; same
# checksums expected), then the engine: the delta rule / tree / batch-invariant / fused residual /
# oracle CUDA tests, the trained pair's kernels and host calls a step (defaults; graph inputs left
# to the scheduler), then the 27B's kernels a step with the defaults (a 1-token forward beside the
# AR step) and with each of T1_VARS (default: the fused residual off, the scheduler's inputs, the
# unstaged chain kernel, ggml's mmq). Every file lands in $OUT/all-t1.tgz (a call returns 8 files).
if [ "$stage" = t1 ]; then
  mkdir -p "$OUT"
  for b in .carry/gdn_sa/*; do
    [ -x "$b" ] || continue
    "$b" "$(basename "$b")" >> "$OUT/gdn-chain-standalone.jsonl" 2>&1
    DFLASH_GDN_STAGED=0 "$b" "$(basename "$b")-unstaged" >> "$OUT/gdn-chain-standalone.jsonl" 2>&1
  done
  cut -c1-170 "$OUT/gdn-chain-standalone.jsonl"; grep -o '"checksum[^,}]*' "$OUT/gdn-chain-standalone.jsonl" | sort | uniq -c
fi
# `gpu_bench.sh p1` (session 23, a fresh machine, SETUP_TARGETS="_core llama-server"), then `p2`
# within 30 s (or P1_ALL=1: p2 in p1 without the chain). p1: beside the build, builds of the GEMM standalone
# (tools/device/gemv_standalone.cu, slim): `new` this tree, `base` / `mid` with the headers of an
# untracked sa_base/ / sa_mid/ first on the include path (earlier kernels, for the A/B); after the build the
# 27B's kernels a step (forwards of 1, 16, 32 and 64 tokens), then the standalones alternately
# (P1_RUNS: BUILD:MODE pairs) into $OUT/sa-BUILD-MODE.jsonl, compared by sa_compare.py. p2: the
# GEMM / oracle / speculative CUDA tests, the AR next to libllama, the chain next to upstream
# llama-server draft-dflash at synthetic acceptance 10.
if [ "$stage" = p1 ]; then
  mkdir -p "$OUT" /tmp/sa /tmp/up && { [ -d /tmp/up/ggml ] || tar xzf .carry/upstream.tar.gz -C /tmp/up; }
  sa_build() {  # sa_build NAME [nvcc flags...]
    local n=$1; shift; T=/tmp/up/ggml
    nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -DGEMV_STANDALONE_SLIM "$@" -o "/tmp/sa/$n" \
      tools/device/gemv_standalone.cu -I$T/src -I$T/include -I$T/src/ggml-cuda -Iggml_ext/include -Iggml_ext/kernels \
      -DGGML_USE_CUDA > "/tmp/sa/$n.log" 2>&1 || tail -5 "/tmp/sa/$n.log"
  }
  sa_build new &
  [ -d sa_base ] && sa_build base -Isa_base &
  [ -d sa_mid ] && sa_build mid -Isa_mid &
fi
source "$(dirname "$0")/stage_common.sh"

PAIR_T=dflash/data/pair/target-q8_0.gguf PAIR_D=dflash/data/pair/drafter-q8_0.gguf
profile_variants() {  # profile_variants VAR[=VALUE]...: the 27B's kernels per step with each (VAR: VAR=1)
  for v in "$@"; do
    [ "$(left)" -ge 45 ] || break
    case $v in *=*) ;; *) v=$v=1 ;; esac
    kernel_profile 40 "h200-27b-kernels-$(echo "${v#DFLASH_}" | tr 'A-Z_=' 'a-z--').json" "$v"
  done
  grep -E "wall|gdn_chain|tree_gdn" "$OUT"/h200-27b-kernels*.log | cut -c1-240
}
# The trained pair's kernels and host calls a step: pair_profile JSON [VAR=VALUE...] (PP_ARGS:
# kernel_profile.py's sizes)
pair_profile() {
  local json=$1; shift
  # shellcheck disable=SC2086  # PP_ARGS splits on purpose
  env "$@" timeout 45 python3 tools/device/kernel_profile.py -m $PAIR_T --draft $PAIR_D --label pair \
    ${PP_ARGS:---forwards 16,17,65 --budgets 16,64} --synthetic-accept 6 --steps 20 -o "$OUT/$json" \
    > "$OUT/${json%.json}.log" 2>&1
  echo "[gpu] pair kernel profile $json $* rc=$? at $(($(date +%s) - t0)) s"; grep -E "wall|host calls" "$OUT/${json%.json}.log"
}

# `gpu_bench.sh u1` (session 18's first call), then `u2` within 30 s. u1: the build, the GEMM /
# GEMV / speculative CUDA tests (Q8_0 through the tensor-core GEMM with activations per 32, more
# than 64 columns in launches of 64), the trained pair's kernels a step with that GEMM for its Q8_0
# weights (the default now) and without (DFLASH_MMA_Q80=0), then the 27B's forwards of 1..128
# tokens with the defaults (128: two launches) and with ggml's mmq above 64 columns
# (DFLASH_MMA_MAX_COLUMNS=64). u2: the pair's modes on its 48 held-out prompts (upstream beside),
# then again with DFLASH_MMA_Q80=0.
if [ "$stage" = u1 ]; then
  trap 'pack_out u1' EXIT
  start_27b_synth
  run_cuda_suite 170 -k "gemm or gemv or residual or spec_chain or ddtree or batch_invariant or oracle"
  export PP_ARGS="--forwards 16,17,65,129 --budgets 16,32,64,128"
  pair_profile h200-pair-kernels.json
  pair_profile h200-pair-kernels-mma-q80-0.json DFLASH_MMA_Q80=0
  wait_27b 120
  KP_ARGS="--forwards 1,16,32,64,128" kernel_profile 60
  KP_ARGS="--forwards 64,128" profile_variants DFLASH_MMA_MAX_COLUMNS=64
  exit 0
fi
# The trained pair's modes on its 48 held-out prompts into $OUT/JSON (upstream beside unless told):
# pair_bench SECONDS JSON [VAR=VALUE...] [-- bench args] (PAIR_BUDGETS: the DDTree budgets)
pair_bench() {
  local secs=$1 json=$2; shift 2; split_env_args "$@"
  env "${ENVS[@]}" timeout "$secs" python3 -m dflash.bench --pair dflash/data/pair \
    --prompts bench/prompts/pair-heldout-code48.jsonl -ngl 99 -n 512 --budgets "${PAIR_BUDGETS:-16,32,64,128}" \
    --chain-seed both "${XARGS[@]}" -o "$OUT/$json" > "$OUT/${json%.json}.log" 2>&1
  echo "[gpu] pair bench $json ${ENVS[*]} rc=$? at $(($(date +%s) - t0)) s"; tail -n 20 "$OUT/${json%.json}.log"
}
if [ "$stage" = u2 ]; then
  trap 'pack_out u2' EXIT
  pair_bench "$(( $(left) * 6 / 10 ))" h200-pair-upstream.json ${U2_ENV-}
  pair_bench "$(($(left) - 5))" h200-pair-mma-q80-0.json DFLASH_MMA_Q80=0 -- --no-upstream --no-upstream-spec
  exit 0
fi
# `gpu_bench.sh u3` (session 18, a fresh machine): the trained pair at budgets on the GEMM's column
# tiles (b31 / b47 / b63 verify 32 / 48 / 64 tokens; b32 / b64 verify 33 / 65: a 48-column tile,
# a second launch), upstream beside; then the same with the tree built at temperature 1.2 (on the
# CPU +0.5-0.8% acceptance at b16 / b32); then the 27B's forwards of 64 / 128 tokens with and
# without the GEMM above 64 columns, as time allows.
if [ "$stage" = u3 ]; then
  trap 'pack_out u3' EXIT
  start_27b_synth
  export PAIR_BUDGETS=${PAIR_BUDGETS:-16,24,31,32,47,63}
  pair_bench 150 h200-pair-tiles-upstream.json
  pair_bench 110 h200-pair-tiles-t12.json -- --tree-temperature 1.2 --no-upstream --no-upstream-spec
  wait_27b 100
  [ -f /tmp/d27.gguf ] && KP_ARGS="--forwards 64,128" kernel_profile 45 h200-27b-kernels-128.json
  [ -f /tmp/d27.gguf ] && KP_ARGS="--forwards 64,128" kernel_profile 45 h200-27b-kernels-128-max64.json DFLASH_MMA_MAX_COLUMNS=64
  grep -E "wall" "$OUT"/h200-27b-kernels*.log | cut -c1-200
  exit 0
fi

# `gpu_bench.sh w1` (a fresh machine, SETUP_TARGETS="_core llama-server"): the 27B with session
# 18's GEMM (65..256 columns through it): issue 4's step cost for budgets 1..256 next to upstream's
# forward of the same tokens, then issue 7's AR next to libllama and the chain next to upstream
# llama-server draft-dflash at synthetic acceptance 10, as time allows. The 27B files take ~40 s
# after the build (~285 s in session 19, whose run waited only until 300 s were left and found no
# file): wait until 180 s are left.
if [ "$stage" = w1 ]; then
  trap 'pack_out w1' EXIT
  start_27b_synth
  wait_27b 180
  tree_steps 170 h200-27b-tree-steps.json 1,2,4,8,16,31,32,63,64,128,256
  [ "$(left)" -ge 60 ] && ar_bench 50 /tmp/q27.gguf h200-27b-ar.json
  [ "$(left)" -ge 60 ] && chain_bench "$(($(left) - 5))" h200-27b-chain-vs-upstream.json -- --llama-server "$LLAMA_SERVER" --synth-len 10
  exit 0
fi

# `gpu_bench.sh x1` (session 20), then `x2` within 30 s: the chunked delta rule
# (kernels/gdn_chunked.cu) and the wgmma GEMM engaged (sm_90a build). x1: the build
# (SETUP_TARGETS="_core" saves upstream's tools), the delta rule / tree / speculative /
# batch-invariant / GEMM CUDA tests, then the 27B's kernels a step (forwards of 1..128 tokens, a
# chain step, a DDTree step) with the defaults as time allows. x2: the same with each of X2_VARS
# (default: the chunked form off, the wgmma GEMM off).
if [ "$stage" = x1 ] || [ "$stage" = x2 ]; then
  trap "pack_out $stage" EXIT
  start_27b_synth
  export KP_ARGS="--forwards 1,8,16,32,64,128"
  if [ "$stage" = x1 ]; then
    run_cuda_suite 170 -k "gdn or delta or tree or spec or ddtree or invariant or commit or wgmma or mma_gemm_equals"
    wait_27b 70
    [ "$(left)" -ge 65 ] && kernel_profile 60
  else
    wait_27b 140
    for v in ${X2_VARS:-DFLASH_GDN_CHUNKED=0 DFLASH_WGMMA=0}; do
      [ "$(left)" -ge 65 ] && kernel_profile 60 "h200-27b-kernels-$(echo "${v#DFLASH_}" | tr 'A-Z_=' 'a-z--').json" "$v"
    done
    grep -E "wall|gdn_chunk|gdn_chain|tree_gdn|wgmma" "$OUT"/h200-27b-kernels*.log | cut -c1-200
  fi
  exit 0
fi

# `gpu_bench.sh y1` (session 21, a fresh machine, SETUP_TARGETS="_core llama-server"), then `y2`
# within 30 s: the one-round delta rule (kernels/gdn_chain_one_round.cu) for verify chains and
# DDTree trees, and issue 7's figures with today's defaults in one run. y1: the build, the delta
# rule / tree / speculative CUDA tests (Y1_TESTS: a pytest -k expression), the 27B's kernels a
# step (forwards of 1..128 tokens, chain and DDTree steps) with the defaults, then forwards of
# 16 / 32 / 64 and the DDTree step with each of Y1_VARS (default: the one-round kernel with 1 and 4
# columns a lane). y2: the profile with the one-round form off, the AR next to libllama, the chain
# next to upstream llama-server draft-dflash at synthetic acceptance 10, then the DDTree step cost
# per budget, as time allows.
if [ "$stage" = y1 ] || [ "$stage" = y2 ]; then
  trap "pack_out $stage" EXIT
  start_27b_synth
  export KP_ARGS="--forwards 1,8,16,32,64,128"
  if [ "$stage" = y1 ]; then
    run_cuda_suite "$(( $(left) - 200 ))" -k "${Y1_TESTS:-gdn or delta or one_round or tree or spec or ddtree}"
    wait_27b 70
    [ "$(left)" -ge 65 ] && kernel_profile 60
    for v in ${Y1_VARS-DFLASH_GDN_ONE_ROUND_COLUMNS=1 DFLASH_GDN_ONE_ROUND_COLUMNS=4}; do
      [ "$(left)" -ge 45 ] && KP_ARGS="--forwards 16,32,64" kernel_profile 40 \
        "h200-27b-kernels-$(echo "${v#DFLASH_}" | tr 'A-Z_=' 'a-z--').json" "$v"
    done
    # Y1_TREE_STEPS=1: then the DDTree step cost per budget, as time allows
    [ -n "${Y1_TREE_STEPS-}" ] && [ "$(left)" -ge 40 ] &&
      tree_steps "$(($(left) - 5))" h200-27b-tree-steps.json 1,4,8,16,32,64,128 -- --no-upstream
  else
    wait_27b 400
    kernel_profile 60 h200-27b-kernels-gdn-one-round-0.json DFLASH_GDN_ONE_ROUND=0
    [ "$(left)" -ge 80 ] && ar_bench 70 /tmp/q27.gguf h200-27b-ar.json
    [ "$(left)" -ge 140 ] && chain_bench 130 h200-27b-chain-vs-upstream.json -- --llama-server "$LLAMA_SERVER" --synth-len 10
    [ "$(left)" -ge 40 ] && tree_steps "$(($(left) - 5))" h200-27b-tree-steps.json 1,4,8,16,32,64,128 -- --no-upstream
  fi
  grep -E "wall|gdn_chain|one_round|tree_gdn" "$OUT"/h200-27b-kernels*.log | cut -c1-200
  exit 0
fi

# `gpu_bench.sh z1` (session 22, a fresh machine, SETUP_TARGETS="_core llama-server"), then `z2`
# within 30 s: the SwiGLU read by the matmuls' quantizers (patches/0009, kernels/glu_fusion.cu).
# z1: the build, the CUDA tests it touches (Z1_TESTS: a pytest -k expression), the 27B's kernels
# a step with the defaults (forwards of 1..128 tokens, chain and DDTree steps), then with the
# fusion off (forwards of 1, 16, 32, 64). z2: the AR next to libllama, the chain next to upstream
# llama-server draft-dflash at synthetic acceptance 10, then more of the CUDA suite (Z2_TESTS) as
# time allows.
if [ "$stage" = z1 ] || [ "$stage" = z2 ]; then
  trap "pack_out $stage" EXIT
  start_27b_synth
  export KP_ARGS="--forwards 1,8,16,32,64,128"
  if [ "$stage" = z1 ]; then
    run_cuda_suite "$(( $(left) - 150 ))" \
      -k "${Z1_TESTS:-glu or swiglu or stacked or invariant or one_round or reordered or residual or spec_chain}"
    wait_27b 70
    [ "$(left)" -ge 65 ] && kernel_profile 60
    [ "$(left)" -ge 45 ] && KP_ARGS="--forwards 1,16,32,64" kernel_profile 40 h200-27b-kernels-fuse-glu-0.json \
      DFLASH_FUSE_GLU=0
  else
    wait_27b 400
    [ "$(left)" -ge 80 ] && ar_bench 70 /tmp/q27.gguf h200-27b-ar.json
    [ "$(left)" -ge 140 ] && chain_bench 130 h200-27b-chain-vs-upstream.json -- --llama-server "$LLAMA_SERVER" --synth-len 10
    [ "$(left)" -ge 60 ] && run_cuda_suite "$(($(left) - 10))" -k "${Z2_TESTS:-oracle or verify or ddtree or tree}"
  fi
  grep -E "wall|unary_gated|kernels_per" "$OUT"/h200-27b-kernels*.log | cut -c1-200
  exit 0
fi

# `gpu_bench.sh r1` (session 25, a fresh machine, SETUP_TARGETS=_core): the GEMM's activation
# quantizer a warp per super-block. Beside the build, the standalone (tools/device/gemv_standalone.cu);
# after it the 27B's kernels a step (forwards of 1, 16, 32, 64 tokens), the standalone's check_quick
# (the quantizer's bytes against a host reference, every layout), then the whole CUDA suite; when
# test_chunked_prefill_matches_upstream_chunking fails there (session 24), that test after each
# prefix of the files before it (logs $OUT/order-upto-*.log).
if [ "$stage" = r1 ]; then
  trap "pack_out $stage" EXIT
  start_27b_synth
  mkdir -p /tmp/up && { [ -d /tmp/up/ggml ] || tar xzf .carry/upstream.tar.gz -C /tmp/up; }
  (T=/tmp/up/ggml; nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -DGEMV_STANDALONE_SLIM -o /tmp/sa_r1 \
    tools/device/gemv_standalone.cu -I$T/src -I$T/include -I$T/src/ggml-cuda -Iggml_ext/include -Iggml_ext/kernels \
    -DGGML_USE_CUDA > /tmp/sa_r1.log 2>&1) &
  wait_27b 70
  KP_ARGS="--forwards 1,16,32,64" kernel_profile 70
  grep -E "wall" "$OUT"/h200-27b-kernels*.log | cut -c1-200
  wait
  timeout 60 /tmp/sa_r1 check_quick > "$OUT/sa-check-quick.jsonl" 2>&1
  echo "[gpu] standalone check_quick rc=$?: $(grep -c '"ok": true' "$OUT/sa-check-quick.jsonl") ok," \
    "$(grep -c '"ok": false' "$OUT/sa-check-quick.jsonl") failed; $(grep check_quantize_bytes "$OUT/sa-check-quick.jsonl")"
  [ "$(left)" -ge 100 ] && run_cuda_suite "$(( $(left) > 160 ? 150 : $(left) - 10 ))"
  if grep -q "^FAILED.*chunked_prefill_matches_upstream" "$OUT/cuda-tests.log" 2>/dev/null; then
    prefix=""
    for f in tree_ops mul_mat_invariant mul_mat_tiles top_k_rows gemv_kquant stacked_projections; do
      prefix="$prefix tests/test_$f.py"
      [ "$(left)" -ge 40 ] || break
      # shellcheck disable=SC2086  # the list splits on purpose
      NVIDIA_TF32_OVERRIDE=0 DFLASH_TEST_NGL=99 DFLASH_REQUIRE_CUDA=1 timeout "$(( $(left) - 10 ))" python3 -m pytest \
        -q -s -p no:cacheprovider $prefix tests/test_oracle_upstream.py > "$OUT/order-upto-$f.log" 2>&1 &
      while [ "$(jobs -rp | wc -l)" -ge 3 ]; do sleep 2; done
    done
    wait
    grep -H "passed\|failed" "$OUT"/order-upto-*.log | cut -c1-160
  fi
  exit 0
fi

# `gpu_bench.sh r2` (session 25's last call, a fresh machine, SETUP_TARGETS=_core): the quantizer
# with both forms (a value a thread up to 16 columns): the whole CUDA suite while the 27B-shaped
# files are written, then the 27B's kernels a step (forwards of 1, 16, 32, 64 tokens). `e1` (session
# 26: programmatic dependent launch, kernels/pdl.cuh) is the same stage.
if [ "$stage" = r2 ] || [ "$stage" = e1 ]; then
  trap "pack_out $stage" EXIT
  start_27b_synth
  run_cuda_suite 150
  wait_27b 80
  [ "$(left)" -ge 75 ] && KP_ARGS="--forwards 1,16,32,64" kernel_profile "$(( $(left) - 5 ))"
  grep -E "wall" "$OUT"/h200-27b-kernels*.log | cut -c1-200
  exit 0
fi

# `gpu_bench.sh e2` (session 26, a fresh machine, SETUP_TARGETS=_core): the 27B's AR step and
# forwards (kernel_profile.py --quick) with each DFLASH_PDL mask of E2_MASKS (0: none; the bits of
# kernels/pdl.cuh's dflash_pdl::Kind), then the AR next to libllama with E2_AR_MASK when set.
if [ "$stage" = e2 ]; then
  trap "pack_out $stage" EXIT
  start_27b_synth
  export KP_ARGS="--forwards 1,16,32,64 --quick ${KP_EXTRA-}"  # KP_EXTRA=--launches: one by one too
  wait_27b 100
  for m in ${E2_MASKS:-0 3 11 15 27}; do  # pdl.cuh's kinds since session 27 (session 26's bits differ)
    [ "$(left)" -ge 45 ] || break
    kernel_profile 40 "h200-27b-kernels-pdl-$m.json" DFLASH_PDL=$m
    grep -E "wall" "$OUT/h200-27b-kernels-pdl-$m.log" | cut -c1-150
  done
  [ -n "${E2_AR_MASK-}" ] && [ "$(left)" -ge 80 ] && ar_bench 75 /tmp/q27.gguf h200-27b-ar.json DFLASH_PDL=$E2_AR_MASK
  exit 0
fi

# `gpu_bench.sh f1` (session 27, a fresh machine, SETUP_TARGETS=_core): the GEMM's CUDA tests
# (F1_TESTS, a pytest -k expression; `all`: the whole suite) while the 27B-shaped files are written, then the 27B's AR step
# and forwards (kernel_profile.py --quick) with the defaults and with each of F1_VARS (a
# VAR=VALUE[,VAR=VALUE] set each; default, most telling first (the call's time cuts the list, ~27 s
# a profile): by default session 30's new defaults switched off (the wgmma GEMM's early staging and
# tail split), then the pipelined kernel (it tied at 64 columns: bench/results/h200-s30-*); set
# F1_VARS to time new switches).
if [ "$stage" = f1 ]; then
  trap "pack_out $stage" EXIT
  start_27b_synth
  if [ "${F1_TESTS-}" = all ]; then
    run_cuda_suite 160
  else
    run_cuda_suite 100 -k "${F1_TESTS:-wgmma or one_round or q6k_long}"
  fi
  export KP_ARGS="--forwards 1,16,32,64 --quick ${KP_EXTRA-}"  # KP_EXTRA=--launches: one by one too
  wait_27b 100
  kernel_profile 45 "h200-27b-kernels-default.json"
  grep -E "wall" "$OUT/h200-27b-kernels-default.log" | cut -c1-150
  for vs in ${F1_VARS:-DFLASH_WGMMA_EARLY=0,DFLASH_WGMMA_SPLIT=0 DFLASH_WGMMA_PIPE=1}; do
    [ "$(left)" -ge 45 ] || break
    name=$(echo "$vs" | sed 's/DFLASH_//g; s/_MAX_COLUMNS//g' | tr 'A-Z_=,' 'a-z---')
    # shellcheck disable=SC2046  # VAR=VALUE pairs split on purpose
    kernel_profile 40 "h200-27b-kernels-$name.json" $(echo "$vs" | tr ',' ' ')
    grep -E "wall" "$OUT/h200-27b-kernels-$name.log" | cut -c1-150
  done
  exit 0
fi

# `gpu_bench.sh h1` (session 34, a fresh machine, SETUP_TARGETS="_core llama-server", SYNTH_EARLY=1),
# then `h2` within 30 s (the build and the 27B files kept). h1: the 27B's kernels a step (forwards
# of 1, 16, 32, 64 tokens) with the defaults, the GEMM standalone's `split` mode (the norm-fused
# quantizer's forms, then the K split; carried binary), the profiles of H1_VARS (VAR=VALUE[,VAR=VALUE]
# sets as in f1), then the CUDA tests by H1_TESTS (a pytest -k expression) in the time left
# (H1_SA: the standalone's mode, split by default; H1_SA_S its seconds, 40; H1_MIN_LEFT: the seconds
# a profile must leave, 100; H1_FORWARDS: the forwards' token counts, 1,16,32,64; H1_KP_S: a
# profile's seconds, 40; H1_WS64=1: after the default profile, tools/device/ws64_ab.sh, its
# binaries built beside the engine's build (WS64_FLAG: an A/B), H1_WS64_NCU=1 with its ncu pass). h2: AR
# next to libllama with the defaults and with each of H2_AR_VARS, then the chain next to upstream
# llama-server draft-dflash at synthetic acceptance 10: the issue's table.
if [ "$stage" = h1 ]; then
  trap "pack_out $stage" EXIT
  start_27b_synth
  # H1_ENV_TESTS (VAR=VALUE[,VAR=VALUE] sets; "X=1" for none) with H1_ENV_K: env_tests while the 27B is written (H1_ENV_S seconds, 60)
  # shellcheck disable=SC2086  # the sets split on purpose
  [ -n "${H1_ENV_TESTS-}" ] && env_tests "${H1_ENV_S:-60}" "${H1_ENV_K:-oracle}" $H1_ENV_TESTS
  export KP_ARGS="--forwards ${H1_FORWARDS:-1,16,32,64} --quick"
  wait_27b 100
  kernel_profile 45 "h200-27b-kernels-default.json"
  grep -E "wall" "$OUT/h200-27b-kernels-default.log" | cut -c1-150
  [ -f .carry/gemv_standalone.gz ] && CALL_LEFT=${H1_SA_S:-40} bash tools/device/gemv_standalone.sh "${H1_SA:-split}" 2>&1 | grep -v '^{' | tail -n 60
  if [ -n "${WS64_PID-}" ] && [ "$(left)" -ge 90 ]; then  # the 64-column GEMM (WS64_FLAG: an A/B; H1_WS64_NCU=1: and ncu)
    wait "$WS64_PID"
    WS64_NCU=${H1_WS64_NCU:-0} timeout "$(($(left) - 40))" bash tools/device/ws64_ab.sh 2>&1 | tail -n 30
  fi
  for vs in ${H1_VARS-}; do
    [ "$(left)" -ge "${H1_MIN_LEFT:-100}" ] || break  # seconds kept for the tests
    name=$(echo "$vs" | sed 's/DFLASH_//g' | tr 'A-Z_=,' 'a-z---')
    # shellcheck disable=SC2046  # VAR=VALUE pairs split on purpose
    kernel_profile "${H1_KP_S:-40}" "h200-27b-kernels-$name.json" $(echo "$vs" | tr ',' ' ')
    grep -E "wall" "$OUT/h200-27b-kernels-$name.log" | cut -c1-150
  done
  [ "$(left)" -ge 40 ] && run_cuda_suite "$(( $(left) - 10 ))" -k "${H1_TESTS:-mma_split or quantizer_fusions or fusion_changes}"
  exit 0
fi
# `gpu_bench.sh h3` (session 38), within 30 s of h1 (its build and 27B files kept): the profiles of
# H3_VARS (VAR=VALUE[,VAR=VALUE] sets, forwards of 1, 16, 32, 64 tokens), the DDTree step cost at
# budgets H3_BUDGETS (15,31,63: a tree of b nodes verifies b + 1 tokens) with the defaults and with
# each of H3_TREE_VARS, then the CUDA tests by H3_TESTS (a pytest -k expression) in the time left
# (H3_FORWARDS and H3_KP_S as h1's H1_FORWARDS and H1_KP_S).
if [ "$stage" = h3 ]; then
  trap "pack_out $stage" EXIT
  export KP_ARGS="--forwards ${H3_FORWARDS:-1,16,32,64} --quick"
  wait_27b 100
  for vs in ${H3_VARS-}; do
    [ "$(left)" -ge 60 ] || break
    name=$(echo "$vs" | sed 's/DFLASH_//g' | tr 'A-Z_=,' 'a-z---')
    # shellcheck disable=SC2046  # VAR=VALUE pairs split on purpose
    kernel_profile "${H3_KP_S:-40}" "h200-27b-kernels-$name.json" $(echo "$vs" | tr ',' ' ')
    grep -E "wall" "$OUT/h200-27b-kernels-$name.log" | cut -c1-150
  done
  for vs in default ${H3_TREE_VARS-}; do
    [ "$(left)" -ge 70 ] || break
    name=$(echo "$vs" | sed 's/DFLASH_//g' | tr 'A-Z_=,' 'a-z---')
    # shellcheck disable=SC2046  # VAR=VALUE pairs split on purpose
    tree_steps 50 "h200-27b-tree-steps-$name.json" "${H3_BUDGETS:-15,31,63}" $([ "$vs" = default ] || echo "$vs" | tr ',' ' ') -- --no-upstream
  done
  [ -n "${H3_TESTS-}" ] && [ "$(left)" -ge 40 ] && run_cuda_suite "$(( $(left) - 10 ))" -k "$H3_TESTS"
  exit 0
fi
if [ "$stage" = h2 ]; then
  trap "pack_out $stage" EXIT
  wait_27b 200
  ar_bench 75 /tmp/q27.gguf h200-27b-ar.json
  for v in ${H2_AR_VARS-}; do
    [ "$(left)" -ge 220 ] && ar_bench 75 /tmp/q27.gguf "h200-27b-ar-$(echo "${v#DFLASH_}" | tr 'A-Z_=' 'a-z--').json" "$v"
  done
  [ "$(left)" -ge 140 ] && chain_bench 135 h200-27b-chain-vs-upstream.json -- --llama-server "$LLAMA_SERVER" --synth-len 10
  exit 0
fi
# `gpu_bench.sh tb1` (session 50; a fresh H200, SETUP_TARGETS="_core llama-server", SYNTH_EARLY=1),
# then `tb2` within 30 s: issue 7's table on one machine with the defaults. tb1: the 27B's kernels a
# step (forwards of 1, 16, 32, 64 tokens), AR next to libllama, then the DDTree step costs (fwd(N)
# beside the AR step) in the time left. tb2: the chain next to upstream llama-server draft-dflash at
# synthetic acceptance 10, then what tb1 did not reach. Both then profile TB_VARS in the time left.
if [ "$stage" = tb1 ] || [ "$stage" = tb2 ]; then
  trap "pack_out $stage" EXIT
  start_27b_synth
  export KP_ARGS="--forwards 1,16,32,64 --quick ${KP_EXTRA-}"  # KP_EXTRA=--launches: one by one too
  wait_27b 100
  [ "$stage" = tb2 ] && [ "$(left)" -ge 140 ] && chain_bench 135 h200-27b-chain-vs-upstream.json -- --llama-server "$LLAMA_SERVER" --synth-len 10
  # each once over both calls (a marker in /tmp once its JSON came out)
  once() {  # once MIN_LEFT JSON FUNCTION ARGS...: FUNCTION ARGS unless JSON came out before
    local min=$1 json=$2; shift 2
    { [ -f "/tmp/tb-$json" ] || [ "$(left)" -lt "$min" ]; } && return
    "$@"; [ -f "$OUT/$json" ] && touch "/tmp/tb-$json"
  }
  once 50 h200-27b-kernels-default.json kernel_profile 45 h200-27b-kernels-default.json
  grep -E "wall" "$OUT/h200-27b-kernels-default.log" 2> /dev/null | cut -c1-150
  once 80 h200-27b-ar.json ar_bench 75 /tmp/q27.gguf h200-27b-ar.json
  once 55 h200-27b-tree-steps-default.json tree_steps 50 h200-27b-tree-steps-default.json 15,31,63 -- --no-upstream
  for vs in ${TB_VARS-}; do  # then the profiles of TB_VARS (VAR=VALUE[,VAR=VALUE] sets) in the time left
    name=$(echo "$vs" | sed 's/DFLASH_//g' | tr 'A-Z_=,' 'a-z---')
    # shellcheck disable=SC2046  # VAR=VALUE pairs split on purpose
    once 45 "h200-27b-kernels-$name.json" kernel_profile 40 "h200-27b-kernels-$name.json" $(echo "$vs" | tr ',' ' ')
    grep -E "wall" "$OUT/h200-27b-kernels-$name.log" 2> /dev/null | cut -c1-150
  done
  exit 0
fi

# `gpu_bench.sh ar1` (session 51; a fresh machine, SETUP_TARGETS=_core, SYNTH_EARLY=1): the decode
# step with switches in one call. The 27B's kernels a step (forwards of 1, 16, 32, 64 tokens) with
# the defaults, AR next to libllama with the defaults and with each of AR_VARS (VAR=VALUE[,VAR=VALUE]
# sets), the kernel profile of each set, then the CUDA tests by AR_TESTS (a pytest -k expression)
# under the first set. A cold H100 reached the first profile at 440 s (session 51); each AR run and
# profile then takes ~20 s.
if [ "$stage" = ar1 ]; then
  trap "pack_out $stage" EXIT
  start_27b_synth
  export KP_ARGS="--forwards 1,16,32,64 --quick ${KP_EXTRA-}"  # KP_EXTRA=--launches: one by one too
  wait_27b 100
  set_name() { name=$(echo "$1" | sed 's/DFLASH_//g' | tr 'A-Z_=,' 'a-z---'); }
  kernel_profile 45 h200-27b-kernels-default.json
  grep -E "wall" "$OUT/h200-27b-kernels-default.log" | cut -c1-150
  [ "$(left)" -ge 60 ] && ar_bench 50 /tmp/q27.gguf h200-27b-ar.json
  for vs in ${AR_VARS-}; do
    [ "$(left)" -ge 60 ] || break
    set_name "$vs"
    # shellcheck disable=SC2046  # VAR=VALUE pairs split on purpose
    ar_bench 50 /tmp/q27.gguf "h200-27b-ar-$name.json" $(echo "$vs" | tr ',' ' ')
  done
  for vs in ${AR_VARS-}; do
    [ "$(left)" -ge 45 ] || break
    set_name "$vs"
    # shellcheck disable=SC2046  # VAR=VALUE pairs split on purpose
    kernel_profile 40 "h200-27b-kernels-$name.json" $(echo "$vs" | tr ',' ' ')
    grep -E "wall" "$OUT/h200-27b-kernels-$name.log" | cut -c1-150
  done
  first=${AR_VARS%% *}
  # shellcheck disable=SC2046  # VAR=VALUE pairs split on purpose
  [ -n "${AR_TESTS-}" ] && [ "$(left)" -ge 30 ] && export $(echo "$first" | tr ',' ' ') &&
    run_cuda_suite "$(($(left) - 5))" -k "$AR_TESTS"
  exit 0
fi

# `gpu_bench.sh q1` (session 24, a fresh machine, SETUP_TARGETS=_core): the RMSNorm read by the
# GEMM's quantizer (patches/0010) and two row tiles a warp by the wave count up to 16 columns. After
# the build the 27B's kernels a step (forwards of 1, 16, 32, 64 tokens) with both, then with each
# of Q1_VARS (VAR=VALUE:FORWARDS), then the CUDA tests of the GEMM, the fusions and the
# speculative loops (Q1_TESTS), then AR next to libllama when Q1_AR is set and time is left.
if [ "$stage" = q1 ]; then
  trap "pack_out $stage" EXIT
  start_27b_synth
  wait_27b 70
  KP_ARGS="--forwards 1,16,32,64" kernel_profile 70
  for vf in ${Q1_VARS-DFLASH_FUSE_RMS_NORM=0:1,16 DFLASH_MMA_ROW_TILES=1:1,16}; do
    [ "$(left)" -ge 150 ] || break
    v=${vf%%:*}
    KP_ARGS="--forwards ${vf#*:}" kernel_profile 50 "h200-27b-kernels-$(echo "${v#DFLASH_}" | tr 'A-Z_=' 'a-z--').json" "$v"
  done
  grep -E "wall" "$OUT"/h200-27b-kernels*.log | cut -c1-200
  [ "$(left)" -ge 60 ] && run_cuda_suite "$(( $(left) > 200 ? 150 : $(left) - 45 ))" \
    -k "${Q1_TESTS:-rms_norm or glu or gemm or mma or stacked or residual or spec_chain or verify}"
  [ -n "${Q1_AR-1}" ] && [ "$(left)" -ge 80 ] && ar_bench 70 /tmp/q27.gguf h200-27b-ar.json
  exit 0
fi

if [ "$stage" = p1 ] || [ "$stage" = p2 ]; then
  trap "pack_out $stage" EXIT
  start_27b_synth
  if [ "$stage" = p1 ]; then
    wait  # the standalones' builds
    wait_27b 70
    KP_ARGS="--forwards 1,16,32,64" kernel_profile 60
    grep -E "wall" "$OUT"/h200-27b-kernels.log | cut -c1-200
    for run in ${P1_RUNS:-base:tiles mid:tiles new:tiles base:long mid:long new:long new:wgmma mid:wgmma base:wgmma}; do
      [ "$(left)" -ge 60 ] || break
      n=${run%%:*} m=${run#*:}
      timeout "$(( $(left) - 15 ))" "/tmp/sa/$n" "$m" > "$OUT/sa-$n-$m.jsonl" 2>&1
      echo "[gpu] standalone $n $m rc=$? at $(($(date +%s) - t0)) s"
    done
    python3 tools/device/sa_compare.py "$OUT"/sa-*.jsonl > "$OUT/sa-compare.txt"
    grep -E "FAILED" "$OUT/sa-compare.txt" | head
    # P1_ALL=1: then p2's tests and AR in this call (p2 needs llama-server for its chain)
    [ -n "${P1_ALL-}" ] && [ "$(left)" -ge 60 ] && run_cuda_suite "$(( $(left) > 230 ? 150 : $(left) - 80 ))" \
      -k "${P2_TESTS:-gemm or gemv or mma or residual or glu or stacked or oracle or spec_chain or verify or tiles}"
    [ -n "${P1_ALL-}" ] && [ "$(left)" -ge 75 ] && ar_bench 70 /tmp/q27.gguf h200-27b-ar.json
  else
    run_cuda_suite 200 -k "${P2_TESTS:-gemm or gemv or mma or residual or glu or stacked or oracle or spec_chain or verify}"
    wait_27b 300
    [ "$(left)" -ge 80 ] && ar_bench 70 /tmp/q27.gguf h200-27b-ar.json
    [ "$(left)" -ge 140 ] && chain_bench 130 h200-27b-chain-vs-upstream.json -- --llama-server "$LLAMA_SERVER" --synth-len 10
  fi
  exit 0
fi

# `gpu_bench.sh z3` (session 22's last call, SETUP_TARGETS=_core): the RMS norm standalone
# (tools/device/rms_norm_standalone.cu), the CUDA tests z1 and z2 left out (Z3_TESTS), then the
# oracle forms diagnosis on tiny-c f32 and q4_K (tools/device/diag_oracle_forms.py).
if [ "$stage" = z3 ]; then
  trap "pack_out $stage" EXIT
  nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/rms_sa tools/device/rms_norm_standalone.cu && /tmp/rms_sa > "$OUT/rms-norm-standalone.jsonl"
  cat "$OUT/rms-norm-standalone.jsonl"
  run_cuda_suite "$(( $(left) - 60 ))" \
    -k "${Z3_TESTS:-oracle or attn_paths or top_k or decode_inputs or gdn_chain or mul_mat_tiles or glu or swiglu}"
  timeout "$(( $(left) - 5 ))" python3 tools/device/diag_oracle_forms.py --presets tiny-c:f32,tiny-c:q4_K \
    > "$OUT/oracle-forms.jsonl" 2>&1
  cut -c1-220 "$OUT/oracle-forms.jsonl"
  exit 0
fi

# `gpu_bench.sh v` (a short call: CALL_S=<its limit less 15 s>): build, the CUDA suite, then the
# 27B's AR and chain with the defaults (no upstream), as time allows.
if [ "$stage" = v ]; then
  start_27b_synth
  run_cuda_suite "$(($(left) - 40))"
  until [ -f /tmp/d27.gguf ] || [ "$(left)" -lt 45 ]; do sleep 2; done
  [ -f /tmp/d27.gguf ] && [ "$(left)" -ge 45 ] && chain_bench "$(($(left) - 5))" h200-27b-chain-defaults.json
  exit 0
fi

# `gpu_bench.sh s` (session 8's first call; sessions 6 and 7 left kernels that never ran on a
# GPU): the CUDA suite, the GEMV standalone (every type's checks, then the benches), the 27B AR
# with the default GEMV and with Q6_K's direct loads (DFLASH_GEMV_Q6K_STAGED=0), then the tensor-core GEMM's checks and
# benches (Q4_K / Q6_K, then Q5_K / Q8_0), as time allows.
if [ "$stage" = s ]; then
  start_27b_synth
  run_cuda_suite 150
  [ -n "${SA_PID-}" ] && wait "$SA_PID"  # the standalone binary's build
  bash tools/device/gemv_standalone.sh all 2>&1 | grep -v '^{' | tail -n 40
  mv "$OUT/gemv-standalone.jsonl" "$OUT/gemv-standalone-all.jsonl"
  until [ -f /tmp/d27.gguf ] || [ "$(left)" -lt 200 ]; do sleep 2; done
  [ "$(left)" -ge 100 ] && ar_bench 90 /tmp/q27.gguf h200-27b-ar.json
  [ "$(left)" -ge 100 ] && ar_bench 90 /tmp/q27.gguf h200-27b-ar-q6k-direct.json DFLASH_GEMV_Q6K_STAGED=0
  for m in mma q5q8; do
    [ "$(left)" -lt 40 ] && break
    CALL_LEFT=$(left) bash tools/device/gemv_standalone.sh $m 2>&1 | grep -v '^{' | tail -n 40
    mv "$OUT/gemv-standalone.jsonl" "$OUT/gemv-standalone-$m.jsonl"
  done
  exit 0
fi

# `gpu_bench.sh f1`, then `f2` within 30 s (the build kept): f1 the CUDA suite, the chain next to
# upstream llama-server draft-dflash at synthetic acceptance 10, the DDTree step cost per budget;
# f2 the 27B AR next to upstream libllama, the kernels per step (forwards of 16 / 32 / 64 tokens
# among them), and the verifies of 33 / 65 nodes with ggml's mmq above 32 columns
# (DFLASH_MMA_MAX_COLUMNS=32) next to the tensor-core GEMM's default 64.
if [ "$stage" = f1 ]; then
  start_27b_synth
  run_cuda_suite 130
  until [ -f /tmp/d27.gguf ] || [ "$(left)" -lt 200 ]; do sleep 2; done
  [ "$(left)" -ge 120 ] && chain_bench 110 h200-27b-chain-vs-upstream.json -- --llama-server "$LLAMA_SERVER" --synth-len 10
  [ "$(left)" -ge 40 ] && tree_steps "$(($(left) - 5))" h200-27b-tree-steps.json 1,2,4,8,16,32,64,128,256
  exit 0
fi
if [ "$stage" = f2 ]; then
  ar_bench 60 /tmp/q27.gguf h200-27b-ar.json
  timeout 100 python3 tools/device/kernel_profile.py -m /tmp/q27.gguf --draft /tmp/d27.gguf --label 27b-q4km \
    --steps 10 -o "$OUT/h200-27b-kernels.json" > "$OUT/kernels-27b.log" 2>&1
  echo "[gpu] 27B kernel profile rc=$? at $(($(date +%s) - t0)) s"; head -c 3000 "$OUT/kernels-27b.log"
  [ "$(left)" -ge 60 ] && tree_steps 70 h200-27b-tree-steps-mma32.json 32,64 DFLASH_MMA_MAX_COLUMNS=32 -- --no-upstream
  [ "$(left)" -ge 130 ] && [ ! -s "$OUT/h200-27b-tree-steps.json" ] &&
    tree_steps "$(($(left) - 5))" h200-27b-tree-steps.json 1,2,4,8,16,32,64,128,256
  exit 0
fi

# `gpu_bench.sh f3` (one call when the device time left is short): the CUDA suite, the DDTree step
# cost for budgets 1..64 without upstream, then the kernels per step.
if [ "$stage" = f3 ]; then
  start_27b_synth
  run_cuda_suite 130
  wait_27b 100
  [ "$(left)" -ge 60 ] && tree_steps 50 h200-27b-tree-steps.json 1,2,4,8,16,32,64 -- --no-upstream
  [ "$(left)" -ge 50 ] && kernel_profile "$(($(left) - 5))"
  exit 0
fi

# Session 12's calls. `gpu_bench.sh k1` (one call): the CUDA suite, the GEMM's two row tiles a
# warp on the standalone (checked against the host reference, then timed against one: `tiles`),
# the kernels per step. Then `l1`, and `l2` within 30 s: l1 the CUDA suite (the chain delta rule
# kernel against ggml's among it), the kernels per step with 4 state columns a warp in the delta
# rule kernels (the default) and with 1 (DFLASH_GDN_COLUMNS=1, ggml's decomposition); l2 the
# DDTree step cost for budgets 1..256, the 27B AR next to upstream libllama, the chain next to
# upstream llama-server draft-dflash at synthetic acceptance 10, then the trained pair's modes as
# time allows.
if [ "$stage" = k1 ]; then
  start_27b_synth
  run_cuda_suite 170
  [ -n "${SA_PID-}" ] && wait "$SA_PID"; tail -n 5 /tmp/nvcc-sa.log
  for m in check_mma tiles; do
    [ "$(left)" -lt 150 ] && break
    CALL_LEFT=60 bash tools/device/gemv_standalone.sh $m 2>&1 | grep -v '^{' | grep -v '"ok": true' | tail -n 60
    mv "$OUT/gemv-standalone.jsonl" "$OUT/gemv-standalone-$m.jsonl"
  done
  wait_27b 80
  [ "$(left)" -ge 70 ] && kernel_profile "$(($(left) - 5))"
  exit 0
fi
if [ "$stage" = l1 ]; then
  start_27b_synth
  run_cuda_suite 170
  wait_27b 120
  kernel_profile 80
  [ "$(left)" -ge 50 ] && kernel_profile "$(($(left) - 5))" h200-27b-kernels-gdn-columns-1.json DFLASH_GDN_COLUMNS=1
  exit 0
fi
# `gpu_bench.sh l3` (one short call, CALL_S=<the device time left less the start>): the build, the
# delta rule kernels' CUDA tests, then the trained pair's modes (DDTree at budgets 16 and 64).
if [ "$stage" = l3 ]; then
  run_cuda_suite 60 -k "gdn or tree_ops"
  timeout "$(($(left) - 5))" python3 -m dflash.bench --pair dflash/data/pair --prompts bench/prompts/pair-heldout-code48.jsonl \
    -ngl 99 -n 512 --budgets 16,64 -o "$OUT/h200-pair.json" > "$OUT/pair-bench.log" 2>&1
  echo "[gpu] pair bench rc=$? at $(($(date +%s) - t0)) s"; tail -n 12 "$OUT/pair-bench.log"
  exit 0
fi
# Session 14's calls. `gpu_bench.sh n1` (SETUP_TARGETS="_core llama-speculative-simple": no
# 27B comparison in these calls), then `n2` within 30 s: n1 the delta rule and tree CUDA tests (the
# walk and paths forms bit-equal among them), the trained pair's modes with the paths form (upstream
# AR and speculative beside them) and its DDTree with the walk; n2 the pair's kernels per step and
# its step split (draft / tree / verify / commit) per budget, with each form.
if [ "$stage" = n1 ]; then
  run_cuda_suite 80 -k "gdn or tree_ops or batch_invariant"
  for form in paths walk; do
    [ "$(left)" -lt 40 ] && break
    extra=(); [ $form = walk ] && extra=(--no-upstream --no-upstream-spec)
    DFLASH_TREE_GDN=$form timeout "$(($(left) - 5))" python3 -m dflash.bench --pair dflash/data/pair \
      --prompts bench/prompts/pair-heldout-code48.jsonl -ngl 99 -n 512 --budgets 16,32,64 "${extra[@]}" \
      -o "$OUT/h200-pair-tree-$form.json" > "$OUT/pair-bench-$form.log" 2>&1
    echo "[gpu] pair bench ($form) rc=$? at $(($(date +%s) - t0)) s"; tail -n 10 "$OUT/pair-bench-$form.log"
  done
  exit 0
fi
if [ "$stage" = n2 ]; then
  for form in paths walk; do
    [ "$(left)" -lt 40 ] && break
    DFLASH_TREE_GDN=$form timeout 100 python3 tools/device/kernel_profile.py -m $PAIR_T --draft $PAIR_D --label pair \
      --forwards 16,17,33,65 --budgets 16,32,64 --synthetic-accept 6 --steps 20 \
      -o "$OUT/h200-pair-kernels-$form.json" > "$OUT/pair-kernels-$form.log" 2>&1
    echo "[gpu] pair kernel profile ($form) rc=$? at $(($(date +%s) - t0)) s"; tail -n 3 "$OUT/pair-kernels-$form.log"
    DFLASH_TREE_GDN=$form timeout 100 python3 -m dflash.bench --tree-steps -m $PAIR_T --draft $PAIR_D -ngl 99 -c 4096 \
      --kv-type f16 --synthetic-accept 6 --budgets 1,4,16,32,64,128 --no-upstream \
      -o "$OUT/h200-pair-tree-steps-$form.json" > "$OUT/pair-tree-steps-$form.log" 2>&1
    echo "[gpu] pair tree-steps ($form) rc=$? at $(($(date +%s) - t0)) s"; tail -n 10 "$OUT/pair-tree-steps-$form.log"
  done
  exit 0
fi

# `gpu_bench.sh n3` (one call, after n1/n2): the delta rule and tree CUDA tests, the trained pair's
# modes (DDTree at budgets 16..128, upstream beside them), the 27B's kernels per step (the chain
# delta rule loading a token ahead), then the pair's step split and its kernels per step (with the
# host time of each step's graph computes: _core.compute_timing) as time allows.
if [ "$stage" = n3 ]; then
  start_27b_synth
  run_cuda_suite 80 -k "gdn or tree_ops or batch_invariant"
  timeout 150 python3 -m dflash.bench --pair dflash/data/pair --prompts bench/prompts/pair-heldout-code48.jsonl \
    -ngl 99 -n 512 --budgets 16,32,64,128 -o "$OUT/h200-pair.json" > "$OUT/pair-bench.log" 2>&1
  echo "[gpu] pair bench rc=$? at $(($(date +%s) - t0)) s"; tail -n 12 "$OUT/pair-bench.log"
  wait_27b 100
  [ "$(left)" -ge 100 ] && kernel_profile 90
  [ "$(left)" -ge 30 ] && timeout "$(($(left) - 5))" python3 -m dflash.bench --tree-steps -m $PAIR_T --draft $PAIR_D \
    -ngl 99 -c 4096 --kv-type f16 --synthetic-accept 6 --budgets 1,16,32,64,128 --no-upstream \
    -o "$OUT/h200-pair-tree-steps.json" > "$OUT/pair-tree-steps.log" 2>&1
  echo "[gpu] pair tree-steps rc=$? at $(($(date +%s) - t0)) s"; tail -n 8 "$OUT/pair-tree-steps.log"
  [ "$(left)" -ge 25 ] && timeout "$(($(left) - 5))" python3 tools/device/kernel_profile.py -m $PAIR_T --draft $PAIR_D \
    --label pair --forwards 16,17,65 --budgets 16,64 --synthetic-accept 6 --steps 20 \
    -o "$OUT/h200-pair-kernels.json" > "$OUT/pair-kernels.log" 2>&1
  echo "[gpu] pair kernel profile rc=$? at $(($(date +%s) - t0)) s"; grep -E "^ +[a-z_0-9+]+: wall" "$OUT/pair-kernels.log"
  exit 0
fi

# `gpu_bench.sh q1` (session 15's last call, a short budget: _core only): where the trained pair's
# step time goes (kernels per step and the host's share through _core.compute_timing), its step
# split per budget, then the 27B's kernels per step (issue 7's forwards of 16 / 32 / 64 tokens).
# Q1_TESTS=1 runs the delta rule, tree and batch-invariant CUDA tests first (a kernel change).
if [ "$stage" = q1 ]; then
  start_27b_synth
  [ -n "${Q1_TESTS-}" ] && run_cuda_suite 80 -k "gdn or tree_ops or batch_invariant"
  for b in 0 16; do  # ggml-cuda's CUDA-graph decisions in the pair's steps (chain, DDTree b16)
    timeout 40 python3 tools/device/cuda_graph_log.py -m $PAIR_T --draft $PAIR_D --budget $b \
      > "$OUT/cuda-graph-log-b$b.txt" 2>&1
    echo "[gpu] CUDA-graph log (budget $b) rc=$?"; tail -n 8 "$OUT/cuda-graph-log-b$b.txt"
  done
  timeout 60 python3 tools/device/kernel_profile.py -m $PAIR_T --draft $PAIR_D --label pair --forwards 16,17,65 \
    --budgets 16,64 --synthetic-accept 6 --steps 20 -o "$OUT/h200-pair-kernels.json" > "$OUT/pair-kernels.log" 2>&1
  echo "[gpu] pair kernel profile rc=$? at $(($(date +%s) - t0)) s"; grep -E "^ +[a-z_0-9+]+: wall" "$OUT/pair-kernels.log"
  timeout 50 python3 -m dflash.bench --tree-steps -m $PAIR_T --draft $PAIR_D -ngl 99 -c 4096 --kv-type f16 \
    --synthetic-accept 6 --budgets 1,16,32,64,128 --no-upstream -o "$OUT/h200-pair-tree-steps.json" \
    > "$OUT/pair-tree-steps.log" 2>&1
  echo "[gpu] pair tree-steps rc=$? at $(($(date +%s) - t0)) s"; tail -n 8 "$OUT/pair-tree-steps.log"
  wait_27b 70
  [ "$(left)" -ge 50 ] && kernel_profile "$(($(left) - 5))"
  exit 0
fi

# `gpu_bench.sh t3` (warm, after t1): the 27B variants t1 had no time for (T1_VARS="VAR ...").
# T3_TEST_ENV="VAR=VALUE ...": first the speculative-decoding CUDA tests with those set (a switch to
# make the default).
if [ "$stage" = t3 ]; then
  trap 'pack_out t3' EXIT
  [ -n "${T3_TEST_ENV-}" ] && (export $T3_TEST_ENV; run_cuda_suite "${T3_TEST_S:-100}" -k "spec_chain or ddtree or batch_invariant or verify_commit")
  wait_27b 60
  profile_variants ${T1_VARS-}
  exit 0
fi
if [ "$stage" = t1 ]; then
  start_27b_synth
  run_cuda_suite 110 -k "gdn or tree_ops or batch_invariant or residual or oracle"
  pair_profile h200-pair-kernels.json
  pair_profile h200-pair-kernels-device-inputs-0.json DFLASH_DEVICE_INPUTS=0
  wait_27b 150
  # a 1-token forward through the same path (reset, all logits, captures) next to the AR step:
  # is the forwards' ~1 ms of launch tied to that path or to the token count?
  KP_ARGS="--forwards 1,16,32,64" kernel_profile 50
  profile_variants ${T1_VARS-DFLASH_FUSE_ADD=0 DFLASH_DEVICE_INPUTS=0 DFLASH_GDN_STAGED=0 DFLASH_MMA=0}
  pack_out t1
  exit 0
fi

# `gpu_bench.sh t2` (after t1, within 30 s, or alone): the trained pair's modes on its 48 held-out
# prompts with DDTree trees seeded with the top-1 chain and not (on the CPU the unseeded tree
# accepted 1.24x the chain at budget 16 against 1.06x seeded: bench/results/README.md, session 16),
# upstream's AR and draft-dflash beside them: issue 4's t/s criterion at the best budget.
if [ "$stage" = t2 ]; then
  timeout "$(($(left) - 5))" python3 -m dflash.bench --pair dflash/data/pair --prompts bench/prompts/pair-heldout-code48.jsonl \
    -ngl 99 -n 512 --budgets 8,16,32,64 --chain-seed both -o "$OUT/h200-pair-seeds.json" > "$OUT/pair-bench.log" 2>&1
  echo "[gpu] pair bench rc=$? at $(($(date +%s) - t0)) s"; tail -n 16 "$OUT/pair-bench.log"
  exit 0
fi

# `gpu_bench.sh m1` (session 13's plan, one call): the build, the delta rule and tree CUDA tests
# (the tree kernel's walk and paths forms bit-equal among them), then the trained pair's DDTree at
# budgets 16, 32, 64 with the paths form (the default for its 8 heads of 64) and with the walk
# (DFLASH_TREE_GDN=walk), the 48 held-out prompts each.
if [ "$stage" = m1 ]; then
  run_cuda_suite 70 -k "gdn or tree_ops or batch_invariant"
  for form in paths walk; do
    [ "$(left)" -lt 60 ] && break
    DFLASH_TREE_GDN=$form timeout "$(( ($(left) - 10) / 2 ))" python3 -m dflash.bench --pair dflash/data/pair \
      --prompts bench/prompts/pair-heldout-code48.jsonl -ngl 99 -n 512 --budgets 16,32,64 \
      -o "$OUT/h200-pair-tree-$form.json" > "$OUT/pair-bench-$form.log" 2>&1
    echo "[gpu] pair bench ($form) rc=$? at $(($(date +%s) - t0)) s"; tail -n 10 "$OUT/pair-bench-$form.log"
  done
  exit 0
fi
if [ "$stage" = l2 ]; then
  tree_steps 130 h200-27b-tree-steps.json 1,2,4,8,16,32,64,128,256 -- --no-upstream
  ar_bench 45 /tmp/q27.gguf h200-27b-ar.json
  chain_bench 80 h200-27b-chain-vs-upstream.json -- --llama-server "$LLAMA_SERVER" --synth-len 10
  [ "$(left)" -ge 60 ] && timeout "$(($(left) - 5))" python3 -m dflash.bench --pair dflash/data/pair \
    --prompts bench/prompts/pair-heldout-code48.jsonl -ngl 99 -n 512 --budgets 16,32,64,128 -o "$OUT/h200-pair.json" \
    > "$OUT/pair-bench.log" 2>&1
  echo "[gpu] pair bench rc=$? at $(($(date +%s) - t0)) s"; tail -n 14 "$OUT/pair-bench.log"
  exit 0
fi

# Session 11's calls. `gpu_bench.sh j1`, then `j2` within 30 s: j1 the CUDA suite (the path
# attention and the batch-invariant mode's greedy checks among it), then the DDTree step cost for
# budgets 1..256 (the commits of all layers in one replay); j2 the kernels per step, the 27B AR next
# to upstream libllama, the chain next to upstream llama-server draft-dflash at synthetic acceptance
# 10, then the trained pair's modes (DDTree at budgets 16..128, upstream speculative) as time allows.
if [ "$stage" = j1 ]; then
  start_27b_synth
  run_cuda_suite 240
  wait_27b 70
  [ "$(left)" -ge 60 ] && tree_steps "$(($(left) - 5))" h200-27b-tree-steps.json 1,2,4,8,16,32,64,128,256 -- --no-upstream
  exit 0
fi
if [ "$stage" = j2 ]; then
  kernel_profile 90
  ar_bench 45 /tmp/q27.gguf h200-27b-ar.json
  chain_bench 80 h200-27b-chain-vs-upstream.json -- --llama-server "$LLAMA_SERVER" --synth-len 10
  timeout "$(($(left) - 5))" python3 -m dflash.bench --pair dflash/data/pair --prompts bench/prompts/pair-heldout-code48.jsonl \
    -ngl 99 -n 512 --budgets 16,32,64,128 -o "$OUT/h200-pair.json" > "$OUT/pair-bench.log" 2>&1
  echo "[gpu] pair bench rc=$? at $(($(date +%s) - t0)) s"; tail -n 14 "$OUT/pair-bench.log"
  exit 0
fi
# `gpu_bench.sh j3` (one call): the CUDA suite, the 27B's chain and DDTree (budget 16) in the
# batch-invariant mode, then the trained pair's chain and DDTree with ggml_ext's Q8_0 GEMV and GEMM
# (DFLASH_Q80=1; ggml's mmvq / mmq otherwise), as time allows.
if [ "$stage" = j3 ]; then
  start_27b_synth
  run_cuda_suite 150
  wait_27b 150
  chain_bench 100 h200-27b-chain-ddtree-batch-invariant.json -- --batch-invariant --budgets 16
  DFLASH_Q80=1 timeout "$(($(left) - 5))" python3 -m dflash.bench --pair dflash/data/pair \
    --prompts bench/prompts/pair-heldout-code48.jsonl -ngl 99 -n 512 --budgets 16,64 --no-upstream --no-upstream-spec \
    -o "$OUT/h200-pair-q80.json" > "$OUT/pair-bench-q80.log" 2>&1
  echo "[gpu] pair bench (DFLASH_Q80=1) rc=$? at $(($(date +%s) - t0)) s"; tail -n 12 "$OUT/pair-bench-q80.log"
  exit 0
fi

# Session 10's calls. `gpu_bench.sh g1` (or `h1`), then `g2` (or `h2`) within 30 s: g1/h1 the CUDA
# suite (g1 also the GEMM's warps per block on long rows: standalone `long`, 4 against 6 and 8),
# the DDTree step cost for budgets 1..64 without upstream; g2/h2 the kernels per step, the 27B AR
# next to upstream libllama, the chain next to upstream llama-server draft-dflash at synthetic
# acceptance 10 (h2 then the trained pair's modes, DDTree at budgets 16, 32, 64), as time allows.
# `gpu_bench.sh h3` (one machine start): h1's work, then g2's as time allows.
if [ "$stage" = g1 ] || [ "$stage" = h1 ] || [ "$stage" = h3 ]; then
  start_27b_synth
  run_cuda_suite "$([ "$stage" = h3 ] && echo 120 || echo 150)"
  if [ "$stage" = g1 ]; then
    [ -n "${SA_PID-}" ] && wait "$SA_PID"
    [ "$(left)" -ge 120 ] && CALL_LEFT=60 bash tools/device/gemv_standalone.sh long 2>&1 | grep -v '^{' | tail -n 40
    [ -f "$OUT/gemv-standalone.jsonl" ] && mv "$OUT/gemv-standalone.jsonl" "$OUT/gemv-standalone-long.jsonl"
  fi
  wait_27b 100
  [ "$(left)" -ge 60 ] && tree_steps 60 h200-27b-tree-steps.json 1,2,4,8,16,32,64 -- --no-upstream
  [ "$stage" = h3 ] || exit 0
fi
if [ "$stage" = g2 ] || [ "$stage" = h2 ] || [ "$stage" = h3 ]; then
  [ "$(left)" -ge 60 ] && kernel_profile 90
  [ "$(left)" -ge 45 ] && ar_bench 45 /tmp/q27.gguf h200-27b-ar.json
  [ "$(left)" -ge 70 ] && chain_bench 80 h200-27b-chain-vs-upstream.json -- --llama-server "$LLAMA_SERVER" --synth-len 10
  if [ "$stage" = h2 ] && [ "$(left)" -ge 60 ]; then
    timeout "$(($(left) - 5))" python3 -m dflash.bench --pair "${PAIR:-dflash/data/pair}" \
      --prompts bench/prompts/pair-heldout-code48.jsonl -ngl 99 -n 512 --budgets 16,32,64 -o "$OUT/h200-pair.json" \
      > "$OUT/pair-bench.log" 2>&1
    echo "[gpu] pair bench rc=$? at $(($(date +%s) - t0)) s"; tail -n 14 "$OUT/pair-bench.log"
  fi
  exit 0
fi

# `gpu_bench.sh t` (right after s, the machine warm): the 27B as an all-Q5_K file with ggml's
# mul_mat_vec_q (DFLASH_GEMV=0) and with our Q5_K GEMV (the default), then the Q4_K_M 27B's chain
# next to upstream llama-server draft-dflash at the same synthetic acceptance, and the DDTree
# step cost per budget.
if [ "$stage" = t ]; then
  python3 -m dflash.synth model --preset qwen36-27b --type q5_K --out /tmp/q27-q5_K.gguf > /dev/null 2>&1
  [ "$(left)" -ge 100 ] && ar_bench 90 /tmp/q27-q5_K.gguf h200-27b-q5_K-ar.json
  [ "$(left)" -ge 100 ] && ar_bench 90 /tmp/q27-q5_K.gguf h200-27b-q5_K-ar-mmvq.json DFLASH_GEMV=0
  rm -f /tmp/q27-q5_K.gguf
  [ "$(left)" -ge 160 ] && chain_bench 150 h200-27b-chain-vs-upstream.json -- --llama-server "$LLAMA_SERVER" --synth-len 10
  [ "$(left)" -ge 60 ] && tree_steps "$(($(left) - 5))" h200-27b-tree-steps.json 1,2,4,8,16,32,64,128,256
  exit 0
fi

if [ "$stage" = a ]; then
  start_27b_synth
  run_cuda_suite "$(($(left) - 60))" tests/test_dflash_reference.py::test_device_feature_rows_match_host_rows
  # our logits vs upstream's, each side on CPU and GPU (DIAG_ORACLE="DFLASH_GEMV=0 ..." adds runs)
  for e in "" $DIAG_ORACLE; do
    echo "[gpu] diag_oracle $e"; env $e timeout 60 python3 tools/device/diag_oracle.py tiny-c q4_K 2>&1 | tail -n 8
  done
  # the tensor-core GEMM (Q4_K / Q6_K, 9..64 columns) alone against a host reference, each
  # pipeline depth, and timed
  bash tools/device/gemv_standalone.sh mma 2>&1 | tail -n 100
  # the 27B's AR next to upstream libllama in the same process (ggml's own kernels), if time is left
  until [ -f /tmp/d27.gguf ] || [ "$(left)" -lt 130 ]; do sleep 2; done  # d27: q27 is complete
  [ -f /tmp/d27.gguf ] && [ "$(left)" -ge 130 ] && ar_bench "$(($(left) - 10))" /tmp/q27.gguf h200-27b-ar.json
  exit 0
fi

# Matmul benches (`gpu_bench.sh m`, after a): ggml's kernels, the engine's, the invariant
# matmul; the tensor-core GEMM widened to 64 columns; then the 27B's chain with mmq verifies
# (DFLASH_MMA=0) next to the default. (The GEMV's layouts: DFLASH_GEMV_SPLIT / DFLASH_GEMV_ROWS,
# or tools/device/gemv_standalone.sh bench.)
if [ "$stage" = m ]; then
  timeout "$(left)" python3 -m dflash.bench --matmul -o "$OUT/h200-matmul.json" > "$OUT/matmul.log" 2>&1
  echo "[gpu] matmul bench rc=$? at $(($(date +%s) - t0)) s"; cat "$OUT/matmul.log"
  # the tensor-core GEMM in the engine's matmul at every column count, next to ggml's mmq
  DFLASH_MMA_MAX_COLUMNS=64 timeout 60 python3 -m dflash.bench --matmul --columns 16,32,64 --reps 10 \
    --shapes ffn_up:17408:5120:q4_K,ffn_down4:5120:17408:q4_K,attn_q:12288:5120:q4_K,gdn_qkv:10240:5120:q4_K \
    -o "$OUT/h200-matmul-mma64.json" > "$OUT/matmul-mma64.log" 2>&1
  echo "[gpu] matmul (DFLASH_MMA_MAX_COLUMNS=64) rc=$?"; cat "$OUT/matmul-mma64.log"
  until [ -f /tmp/d27.gguf ] || [ "$(left)" -lt 200 ]; do sleep 2; done
  chain_bench 120 h200-27b-chain-mmq.json DFLASH_MMA=0
  exit 0
fi

if [ "$stage" = b ]; then
until [ -f /tmp/d27.gguf ] || [ "$(left)" -lt 400 ]; do sleep 2; done
tail -n 3 /tmp/synth.log
chain_bench 150 h200-27b-chain-vs-upstream.json -- --llama-server "$LLAMA_SERVER" --synth-len 10
# AR with ggml_ext's GEMV off (ggml's mul_mat_vec_q), next to upstream libllama in-process
ar_bench 100 /tmp/q27.gguf h200-27b-ar-gemv-off.json DFLASH_GEMV=0
# the same chain with decode-identical verifies (experimental; ggml_ext/BATCH_INVARIANCE.md)
chain_bench 90 h200-27b-chain-invariant.json -- --invariant-matmul
tree_steps 90 h200-27b-tree-steps.json 1,2,4,8,16,32,64,128,256
# the chain with mmq verifies (DFLASH_MMA=0), and forwards of N tokens with the tensor-core GEMM
# at every column count (DFLASH_MMA_MAX_COLUMNS=64)
if [ -n "$MMA_TOO" ]; then
  chain_bench 100 h200-27b-chain-mmq.json DFLASH_MMA=0
  tree_steps 90 h200-27b-tree-steps-mma64.json 1,16,32,64 DFLASH_MMA_MAX_COLUMNS=64 -- --no-upstream
fi
fi
PAIR=${PAIR:-dflash/data/pair}
if [ "$stage" = b ]; then
  timeout 100 python3 tools/device/kernel_profile.py -m /tmp/q27.gguf --draft /tmp/d27.gguf --label 27b-q4km \
    --steps 10 -o "$OUT/h200-27b-kernels.json" > "$OUT/kernels-27b.log" 2>&1
  echo "[gpu] 27B kernel profile rc=$?"; cat "$OUT/kernels-27b.log"
  for inv in "${PAIR_PROFILE-}"; do  # PAIR_PROFILE=none skips; --invariant-matmul too when there is time
    [ "$inv" = none ] && continue
    timeout 50 python3 tools/device/kernel_profile.py -m "$PAIR/target-q8_0.gguf" --draft "$PAIR/drafter-q8_0.gguf" \
      --label pair$inv $inv -o "$OUT/h200-pair-kernels$inv.json" > "$OUT/kernels-pair$inv.log" 2>&1
    echo "[gpu] pair kernel profile $inv rc=$?"; cat "$OUT/kernels-pair$inv.log"
  done
  echo "[gpu] stage b done at $(($(date +%s) - t0)) s"
  # a call returns at most 8 files: stage b's JSON and logs travel as one archive
  (cd "$OUT" && tar czf /tmp/stage-b.tgz ./*.json ./*.log && rm -f ./*.json ./*.log && mv /tmp/stage-b.tgz .)
  exit 0
fi
# Where the tiny pair's step time goes: plain forwards of N tokens vs the AR step and the DDTree
# step split, with and without ggml's CUDA graphs (does the verify replay a graph?).
for graphs in on off; do
  env $([ $graphs = off ] && echo GGML_CUDA_DISABLE_GRAPHS=1) timeout 45 python3 -m dflash.bench --tree-steps \
    -m "$PAIR/target-q8_0.gguf" --draft "$PAIR/drafter-q8_0.gguf" -ngl 99 -c 2048 --budgets 1,15,32 \
    --synthetic-accept 6 -o "$OUT/h200-pair-tree-steps-graphs-$graphs.json" > "$OUT/pair-steps-$graphs.log" 2>&1
  echo "[gpu] pair steps (CUDA graphs $graphs) rc=$?"; tail -n 5 "$OUT/pair-steps-$graphs.log"
done
timeout "$(left)" python3 -m dflash.bench --pair "$PAIR" --prompts bench/prompts/pair-heldout-code48.jsonl \
  -ngl 99 -n 512 --budgets "${PAIR_BUDGETS-16,32,64,128}" -o "$OUT/h200-pair.json" > "$OUT/pair-bench.log" 2>&1
echo "[gpu] pair bench rc=$? at $(($(date +%s) - t0)) s"; head -n 12 "$OUT/pair-bench.log"
