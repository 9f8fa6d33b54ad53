#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz, clang + ASan + UBSan) in build-fuzz and runs each one for a
# bounded time on its seeds (fuzz_make_seeds + small test fixtures), its crash regressions
# (tests/fuzz/regressions/<target>/, replayed first) and what earlier runs found (build-fuzz/corpus/).
# Fails when any target crashes, leaks, hangs, runs out of memory or hits undefined behaviour; the
# input is kept in build-fuzz/artifacts/<target>/. scripts/test.sh runs it as CI's smoke step.
#   scripts/fuzz.sh [-t SECONDS] [-p PARALLEL] [-n NICE] [-j JOBS] [--fresh] [--json FILE] [TARGET...]
#     -t  seconds per target (default 20)      -p  targets run at once (default 1)
#     -n  nice level of the runs (default 0)   -j  build jobs (default nproc)
#     --fresh  start from the seeds alone (drop build-fuzz/corpus)
#     --json FILE  write {"targets": [{name, seconds, executions, crashes, ...}]} from libFuzzer's stats
# Targets: safetensors safetensors_index pth config tokenizer state_files gguf video_request (default: all).
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER=20 PARALLEL=1 NICE=0 JOBS=$(nproc) FRESH=0 JSON="" INVOCATION="$0 $*"
TARGETS=()
while [ $# -gt 0 ]; do
  case "$1" in
    -t) SECONDS_PER=$2; shift 2 ;;
    -p) PARALLEL=$2; shift 2 ;;
    -n) NICE=$2; shift 2 ;;
    -j) JOBS=$2; shift 2 ;;
    --fresh) FRESH=1; shift ;;
    --json) JSON=$2; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) TARGETS+=("$1"); shift ;;
  esac
done
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(safetensors safetensors_index pth config tokenizer state_files gguf video_request)
B=build-fuzz
log() { printf '[fuzz] %s\n' "$*"; }

command -v clang++ >/dev/null || { echo "[fuzz] clang++ not found (scripts/setup.sh installs clang)"; exit 1; }
start=$(date +%s)
log "configuring and building $B (clang, libFuzzer, ASan + UBSan)"
CC=clang CXX=clang++ cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWAN_FUZZ=ON \
  -DWAN_ENABLE_CUDA=OFF -DWAN_ENABLE_MPI=OFF -DWAN_ENABLE_FFMPEG=OFF -DBUILD_TESTING=OFF \
  >"$B.configure.log" 2>&1 || { cat "$B.configure.log"; exit 1; }
nice -n "$NICE" cmake --build "$B" -j "$JOBS" --target fuzz_all
log "built in $(( $(date +%s) - start )) s"

# Seeds: the engine's writers, plus the small fixtures of the formats they cover.
rm -rf "$B/seeds"
"$B/tests/fuzz/fuzz_make_seeds" "$B/seeds"
for f in tests/fixtures/pipeline/prompt_embeds.safetensors tests/fixtures/pipeline/init_latents.safetensors; do
  cp "$f" "$B/seeds/safetensors/"
  cp "$f" "$B/seeds/state_files/"
done
cp tests/fixtures/tiny_dit/transformer/config.json "$B/seeds/config/fixture_tiny_dit.json"
cp tests/fixtures/pipeline/model/transformer/config.json "$B/seeds/config/fixture_pipeline.json"
[ "$FRESH" = 1 ] && rm -rf "$B/corpus"

export ASAN_OPTIONS=${WAN_FUZZ_ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
mkdir -p "$B/logs"
run_target() {
  local t=$1 dirs=("$B/corpus/$1" "$B/seeds/$1")
  mkdir -p "$B/corpus/$t" "$B/artifacts/$t"
  if [ -d "tests/fuzz/regressions/$t" ]; then dirs+=("tests/fuzz/regressions/$t"); fi
  local dict=tests/fuzz/dict/$t.dict t0 rc=0
  case "$t" in safetensors_index|state_files) dict=tests/fuzz/dict/safetensors.dict ;; esac
  t0=$(date +%s%N)
  nice -n "$NICE" "$B/tests/fuzz/fuzz_$t" -max_total_time="$SECONDS_PER" -timeout=30 -rss_limit_mb=2048 \
    -print_final_stats=1 -dict="$dict" -artifact_prefix="$B/artifacts/$t/" "${dirs[@]}" >"$B/logs/$t.log" 2>&1 || rc=$?
  echo "$rc $(( ($(date +%s%N) - t0) / 1000000 ))" >"$B/logs/$t.result"  # exit code, wall ms
}

log "running ${TARGETS[*]}: $SECONDS_PER s each, $PARALLEL at a time, nice $NICE"
running=0
for t in "${TARGETS[@]}"; do
  [ -x "$B/tests/fuzz/fuzz_$t" ] || { echo "[fuzz] unknown target '$t'"; exit 2; }
  rm -f "$B/logs/$t.result"
  run_target "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$PARALLEL" ]; then wait -n || true; running=$((running - 1)); fi
done
wait

failed=0
for t in "${TARGETS[@]}"; do
  read -r rc wall_ms <"$B/logs/$t.result"
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$B/logs/$t.log" | tail -1)
  if [ "$rc" = 0 ]; then
    log "$t: ok, ${execs:-?} executions in $((wall_ms / 1000)) s, corpus $(ls "$B/corpus/$t" | wc -l) files"
  else
    failed=1
    log "$t: FAILED (exit $rc) after $((wall_ms / 1000)) s; input kept in $B/artifacts/$t/:"
    ls "$B/artifacts/$t" | sed 's/^/    /'
    grep -E "ERROR|runtime error|invariant|terminate|==[0-9]+==" "$B/logs/$t.log" | head -20 | sed 's/^/    /'
    echo "    (full log: $B/logs/$t.log)"
  fi
done
if [ -n "$JSON" ]; then
  WAN_FUZZ_INVOCATION=${WAN_FUZZ_INVOCATION:-$INVOCATION} \
    python3 - "$B" "$JSON" "$SECONDS_PER" "$NICE" "$PARALLEL" "${TARGETS[@]}" <<'EOF'
import json, os, platform, re, subprocess, sys
b, out, seconds, nice, parallel, targets = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:]
rows = []
for t in targets:
    text = open(os.path.join(b, "logs", t + ".log"), errors="replace").read()
    rc, wall_ms = open(os.path.join(b, "logs", t + ".result")).read().split()
    execs = re.findall(r"^stat::number_of_executed_units: *(\d+)", text, re.M)
    done = re.findall(r"^#(\d+)\s+DONE", text, re.M)
    arts = sorted(f for f in os.listdir(os.path.join(b, "artifacts", t))
                  if f.split("-")[0] in ("crash", "leak", "timeout", "oom"))
    rows.append({"name": t, "seconds": round(int(wall_ms) / 1000), "executions": int(execs[-1]) if execs else None,
                 "crashes": len(arts) if int(rc) != 0 else 0, "exit_code": int(rc),
                 "done_line_executions": int(done[-1]) if done else None,
                 "corpus_files": len(os.listdir(os.path.join(b, "corpus", t))),
                 "peak_rss_mb": int((re.findall(r"^stat::peak_rss_mb: *(\d+)", text, re.M) or [0])[-1])})
commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
doc = {"targets": rows, "seconds_per_target": int(seconds), "parallel": int(parallel), "nice": int(nice),
       "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
       "compiler": subprocess.run(["clang++", "--version"], capture_output=True, text=True).stdout.splitlines()[0],
       "commit": commit + " (plus the working tree's changes)",
       "command": os.environ["WAN_FUZZ_INVOCATION"]}
with open(out, "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
print("[fuzz] wrote", out)
EOF
fi
log "total $(( $(date +%s) - start )) s"
exit "$failed"
