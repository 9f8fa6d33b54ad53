#!/usr/bin/env bash
# Shared preamble of the device benchmark scripts (bench/run_*.sh): sourced, never run.
#   bench_init BUDGET_DEFAULT MARGIN  sets START, BUDGET (WAN_BENCH_BUDGET_S or the default), HARD_END
#                                     (START + BUDGET - MARGIN), DATE (UTC), OUTDIR ($OUT or
#                                     /tmp/wan-bench-out), RES (bench/results), exports WAN_COMMIT (or
#                                     HEAD), PATH with CUDA, PYTHONUNBUFFERED; defines elapsed and left
#   bench_gpu_info                    one line: name, driver, memory, clocks, power limit
#   bench_wheels                      installs the carried .whl/ into /tmp/site (only when diffusers is
#                                     missing) and puts it on PYTHONPATH; returns 1 when it cannot
#   bench_build_wan                   sets WAN: $WAN_BIN when executable, else builds `wan` with CUDA into
#                                     build-bench (log in $OUTDIR/build.log); returns 1 on a failed build
bench_init() {
  START=$(date +%s)
  BUDGET=${WAN_BENCH_BUDGET_S:-$1}
  HARD_END=$((START + BUDGET - ${2:-15}))
  DATE=$(date -u +%Y-%m-%d)
  OUTDIR=${OUT:-/tmp/wan-bench-out}
  RES=bench/results
  mkdir -p "$OUTDIR" "$RES"
  export WAN_COMMIT=${WAN_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
  export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
}
elapsed() { echo "[$(($(date +%s) - START)) s]"; }
left() { echo $((HARD_END - $(date +%s))); }
bench_gpu_info() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
}
bench_wheels() {
  python3 -c "import diffusers" 2>/dev/null && return 0
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl ||
    { echo "cannot install the carried wheels (.whl/)"; return 1; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
}
bench_build_wan() {
  if [ -n "${WAN_BIN:-}" ] && [ -x "$WAN_BIN" ]; then
    WAN=$WAN_BIN
    echo "$(elapsed) using $WAN"
    return 0
  fi
  cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DWAN_ENABLE_FFMPEG=OFF \
    -DCMAKE_PREFIX_PATH="$PWD/.carry/prefix" >"$OUTDIR/build.log" 2>&1 &&
    cmake --build build-bench -j 16 --target wan >>"$OUTDIR/build.log" 2>&1 ||
    { tail -40 "$OUTDIR/build.log"; return 1; }
  echo "$(elapsed) built"
  WAN=build-bench/wan
}
# bench_smi_start FILE / bench_smi_stop: samples SM clock, power and the clock-event (throttle) reasons every
# 100 ms into FILE (CSV) while the benchmark runs, so sustained-power clock drops show up next to timings.
bench_smi_start() {
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
    --format=csv,noheader -lms 100 >"$1" 2>/dev/null &
  BENCH_SMI_PID=$!
}
bench_smi_stop() {
  [ -n "${BENCH_SMI_PID:-}" ] && kill "$BENCH_SMI_PID" 2>/dev/null
  BENCH_SMI_PID=""
}
