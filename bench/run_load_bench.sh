#!/usr/bin/env bash
# The device command of the start-up benchmark (issue 6): builds `wan` with CUDA (or uses WAN_BIN),
# writes synthetic T2V-A14B checkpoints with `wan make-checkpoint` (14B width, WAN_LOAD_LAYERS-block
# experts, default 10; the real UMT5-XXL text encoder (bf16, 11.4 GB) and Wan 2.1 VAE) one layout at a
# time, and runs `wan bench --load` on each (page-cache reads 1 thread / all threads, pinned H2D, the
# engine's file -> GPU weights per component and together, process start -> first denoising step):
#   official  fp32 experts (safetensors) + .pth text encoder and VAE   ~ 2 x 14.8 + 11.4 + 0.5 GB
#   diffusers bf16 experts (sharded safetensors) + safetensors text encoder and VAE ~ 2 x 7.4 + 11.4 + 0.5 GB
# Each checkpoint is deleted before the next is written (the device disk is 64 GB; host RAM 128 GB holds
# one in the page cache). Writes bench/results/load-<UTC date>.json (also copied to $OUT): device,
# commit, date, one entry per layout (bandwidths, rows, fraction of min(parallel read, H2D), first step
# vs 1.3 x bytes / bound + text time, projection for the full-size model) and the targets met or not.
#
# Usage: WAN_COMMIT=<sha> bench/run_load_bench.sh [full|quick|bf16]
#   full  (default) both layouts, the official one with a reader / buffer sweep
#   quick           the official fp32 layout only, no sweep (~41 GB of checkpoint)
#   bf16            the diffusers bf16 layout only, no sweep (~26 GB: the lightest)
# Each --first-step runs `wan generate` once (the fast start: text encoder and experts streamed
# together, the warm-up after the text encoding) and reports it with its critical path.
# WAN_BIN=<path to wan> skips the build; WAN_BENCH_BUDGET_S (default 560) bounds the run; WAN_LOAD_WORK
# (default /tmp/wan-load-bench) is where the checkpoints go.
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-full}
source bench/lib.sh
bench_init 560 10
WORK=${WAN_LOAD_WORK:-/tmp/wan-load-bench}
LAYERS=${WAN_LOAD_LAYERS:-10}
rm -rf "$WORK"
mkdir -p "$WORK"
NAME=load-$DATE
[ "$MODE" = quick ] && NAME=load-quick-$DATE
[ "$MODE" = bf16 ] && NAME=load-bf16-$DATE
case "$MODE" in full | quick | bf16) ;; *) echo "unknown mode '$MODE' (full, quick or bf16)"; exit 2 ;; esac
exec > >(tee "$OUTDIR/load-bench.log") 2>&1

echo "$(elapsed) mode $MODE, commit $WAN_COMMIT, budget $BUDGET s, $LAYERS-block experts"
bench_gpu_info
nproc
free -g | head -2
df -h "$WORK" | tail -1
bench_build_wan || exit 1

LAYOUTS="official:fp32 diffusers:bf16"
[ "$MODE" = quick ] && LAYOUTS="official:fp32"
[ "$MODE" = bf16 ] && LAYOUTS="diffusers:bf16"
for lt in $LAYOUTS; do
  layout=${lt%%:*}
  dtype=${lt##*:}
  ck=$WORK/ck-$layout-$dtype
  # make-checkpoint (~40 GB at 1-2 GB/s) + the bench (warm read, reads, H2D, 4-10 loads, one generate)
  if [ "$(left)" -lt 150 ]; then echo "skip $layout $dtype: $(left) s left" | tee "$WORK/skip-$layout.txt"; continue; fi
  avail=$(df -B1 --output=avail "$WORK" | tail -1)
  echo "$(elapsed) make-checkpoint $layout $dtype ($((avail / 1000000000)) GB free)"
  timeout --signal=KILL "$(left)" "$WAN" make-checkpoint --config t2v-A14B --layout "$layout" --dtype "$dtype" \
    --layers "$LAYERS" --seed 1 --output "$ck" >"$WORK/make-$layout.log" 2>&1 ||
    { echo "make-checkpoint $layout FAILED"; tail -5 "$WORK/make-$layout.log"; rm -rf "$ck" "$ck".partial-*; continue; }
  du -sh "$ck"
  SWEEP=""
  [ "$MODE" = full ] && [ "$layout" = official ] && SWEEP=--sweep
  echo "$(elapsed) wan bench --load $ck $SWEEP --first-step"
  timeout --signal=KILL "$(left)" "$WAN" bench --load "$ck" $SWEEP --first-step --json "$WORK/load-$layout-$dtype.json" ||
    echo "bench $layout $dtype FAILED (status $?)"
  rm -rf "$ck"
done

echo "$(elapsed) merge"
python3 - "$WORK" "$RES/$NAME.json" "$LAYOUTS" <<'EOF'
import json, os, sys
work, dst, layouts = sys.argv[1], sys.argv[2], sys.argv[3].split()
out = {"bench": "load", "runs": {}, "skipped": []}
for lt in layouts:
    layout, dtype = lt.split(":")
    p = os.path.join(work, f"load-{layout}-{dtype}.json")
    if not os.path.exists(p):
        out["skipped"].append(f"{layout} {dtype}")
        continue
    j = json.load(open(p))
    for k in ("device", "commit", "date"):
        out.setdefault(k, j.get(k))
    out["runs"][f"{layout} {dtype}"] = j
targets = {}
for name, j in out["runs"].items():
    t = {"load_fraction": round(j["fraction_of_bound"], 3), "load_fraction_target": 0.8,
         "load_fraction_met": j["fraction_met"]}
    fs = j.get("first_step")
    if fs:
        t["first_step_s"] = round(fs["startup_to_first_step_s"], 3)
        t["first_step_target_s"] = round(fs["target_s"], 3)
        t["first_step_met"] = fs["met"]
    targets[name] = t
out["targets"] = targets
os.makedirs(os.path.dirname(dst), exist_ok=True)
json.dump(out, open(dst, "w"), indent=2)
print(json.dumps(targets, indent=2))
EOF
cp "$RES/$NAME.json" "$OUTDIR/" 2>/dev/null
echo "$(elapsed) wrote $RES/$NAME.json"
