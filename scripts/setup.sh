#!/usr/bin/env bash
# Sets up a fresh Debian/Ubuntu machine for building and testing wan, then builds it.
#   - Debian packages: compiler, CMake, Ninja, nlohmann-json, GoogleTest, Python venv support, Open MPI
#     (the MPI bootstrap of multi-process runs and its tests), clang with libFuzzer's runtime (the fuzz
#     targets of tests/fuzz, scripts/fuzz.sh).
#   - Python venv .venv with the test oracle (torch, diffusers, transformers, ...) from PyPI.
#   - Configures and builds into build/ (CUDA targets too when a CUDA toolkit is installed).
# Idempotent: re-running skips what is already there. Environment:
#   WAN_SKIP_ORACLE=1  do not create the Python venv (the oracle tests then fail, by design)
#   WAN_BUILD_DIR      build folder (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[setup] %s\n' "$*"; }

DEB_PKGS=(build-essential cmake ninja-build pkg-config nlohmann-json3-dev libgtest-dev python3 python3-venv python3-pip
          libavcodec-dev libavformat-dev libavutil-dev libswscale-dev ffmpeg libsentencepiece-dev
          libopenmpi-dev openmpi-bin clang libclang-rt-dev libcpp-httplib-dev)
missing=()
for p in "${DEB_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# python3/cmake may come from elsewhere (pyenv, pip); only ask apt for what is truly absent.
if [ ${#missing[@]} -gt 0 ]; then
  really=()
  for p in "${missing[@]}"; do
    case "$p" in
      python3) command -v python3 >/dev/null || really+=("$p") ;;
      python3-venv) python3 -c 'import venv, ensurepip' 2>/dev/null || really+=("$p") ;;
      python3-pip) python3 -m pip --version >/dev/null 2>&1 || really+=("$p") ;;
      cmake) command -v cmake >/dev/null || really+=("$p") ;;
      # libFuzzer's runtime is its own package on newer releases, part of clang's on older ones.
      libclang-rt-dev) [ -f "$(clang -print-file-name=libclang_rt.fuzzer-x86_64.a 2>/dev/null)" ] || really+=("$p") ;;
      *) really+=("$p") ;;
    esac
  done
  if [ ${#really[@]} -gt 0 ]; then
    log "installing Debian packages: ${really[*]}"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    keep=()
    for p in "${really[@]}"; do  # an older release has no libclang-rt-dev: clang's own package has the runtime
      [ "$p" = libclang-rt-dev ] && ! apt-cache show "$p" >/dev/null 2>&1 && continue
      keep+=("$p")
    done
    really=("${keep[@]}")
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${really[@]}"
  fi
fi

# Python oracle for the tests (pinned: fixtures were made with these versions).
if [ "${WAN_SKIP_ORACLE:-0}" != "1" ]; then
  if [ ! -x .venv/bin/python3 ] || ! .venv/bin/python3 -c 'import torch, diffusers, transformers, safetensors, sentencepiece, peft, gguf, openai, schemathesis' 2>/dev/null; then
    log "creating .venv with the test oracle (torch, diffusers, transformers)"
    python3 -m venv .venv
    .venv/bin/python3 -m pip install -q --upgrade pip
    .venv/bin/python3 -m pip install -q -r scripts/requirements-oracle.txt
  fi
fi

# CUDA toolkit: use it when present (nvcc on PATH or in /usr/local/cuda).
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
BUILD_DIR=${WAN_BUILD_DIR:-build}
log "configuring $BUILD_DIR (CUDA: $(command -v nvcc >/dev/null && echo yes || echo no))"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >"$BUILD_DIR.configure.log" 2>&1 ||
  { cat "$BUILD_DIR.configure.log"; exit 1; }
log "building"
cmake --build "$BUILD_DIR" -j "$(nproc)"
log "done: $BUILD_DIR/wan"
