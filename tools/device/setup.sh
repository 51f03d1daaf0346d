#!/usr/bin/env bash
# On the GPU machine: unpack the carried upstream tree and wheels, build dflash's _core and
# upstream's llama-bench, llama-server and llama-speculative-simple with CUDA for sm_90a (one
# build, the same ggml; sm_90a: the wgmma GEMM; DFLASH_CUDA_ARCH=90 builds without it). Source it: it exports PYTHONPATH, LLAMA_BENCH, LLAMA_SERVER,
# LLAMA_SPEC_SIMPLE and DFLASH_UPSTREAM_BIN (their folder, for dflash.upstream_tools).
# Carry: .carry (upstream.tar.gz = a trimmed vendor/llama.cpp of the pinned sdist, whl/).
# SETUP_CMAKE_ARGS: more arguments for the first configure (e.g. -DGGML_CUDA_FORCE_MMQ=ON).
set -euo pipefail
export PYTHONUNBUFFERED=1
ROOT=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .carry/whl/*.whl
export PYTHONPATH=/tmp/site:$ROOT:$ROOT/server:$ROOT/convert
# SYNTH_EARLY=1 (sourced from stage_common.sh): the 27B-shaped pair is written while the build runs
# (it needs only the wheels and the Python sources)
if [ "${SYNTH_EARLY-}" = 1 ] && declare -F start_27b_synth > /dev/null; then start_27b_synth; fi
if [ ! -d /tmp/up/ggml ]; then mkdir -p /tmp/up && tar xzf .carry/upstream.tar.gz -C /tmp/up; fi
export DFLASH_VENDOR_SRC=/tmp/up
if [ ! -f build/cuda/build.ninja ]; then
  cmake -S . -B build/cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DDFLASH_CUDA=ON -DDFLASH_UPSTREAM_TOOLS=ON \
    -DCMAKE_CUDA_ARCHITECTURES=${DFLASH_CUDA_ARCH:-90a} -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)" \
    ${SETUP_CMAKE_ARGS-} > /tmp/cmake.log 2>&1 \
    || { tail -40 /tmp/cmake.log; exit 1; }
fi
# SETUP_TARGETS: a shorter list when a call needs fewer of upstream's tools (each saves build time)
t_build=$(date +%s)
cmake --build build/cuda -j16 --target ${SETUP_TARGETS:-_core llama-bench llama-server llama-speculative-simple} 2>&1 \
  | grep -E "error|FAILED" -A5 | head -60 || true
echo "setup: build $(($(date +%s) - t_build)) s"
# each object's compile time, for tools/device/build_schedule.py (which object a parallel build waits on)
if [ -n "${OUT-}" ] && [ -f build/cuda/.ninja_log ]; then cp build/cuda/.ninja_log "$OUT/ninja_log.txt"; fi
cp build/cuda/dflash/csrc/_core*.so dflash/
export DFLASH_UPSTREAM_BIN=$ROOT/build/cuda/bin
export LLAMA_BENCH=$DFLASH_UPSTREAM_BIN/llama-bench
export LLAMA_SERVER=$DFLASH_UPSTREAM_BIN/llama-server
export LLAMA_SPEC_SIMPLE=$DFLASH_UPSTREAM_BIN/llama-speculative-simple
python3 -c "import dflash._core as c; print('dflash._core ok')"
