#!/usr/bin/env bash
# The multi-GPU DiT step benchmark (issue 5, item 6): builds `wan` with CUDA + NCCL, then for 480p and 720p
# (81 frames, T2V-A14B width, random weights, batch 2 = CFG on) times the single-GPU step and every valid
# (cfg, Ulysses, Ring) layout for the GPUs present, all in this one run on this machine, and writes
#   bench/results/dist-<kind>-<UTC date>.json   (also copied to $OUT)
# with rows {gpus, cfg, ulysses, ring, size, s_per_step, efficiency}, efficiency = t_1GPU / (gpus · t_layout)
# against the single-GPU engine measured in the same run on the same kind. Both sides are extrapolated to
# 40 blocks the same way (ANCHORS.md: (t_b - t_a)/(b - a) x 40 from two reduced depths), so the ratio is
# like for like; raw per-depth timings are kept in the JSON.
#
# Usage: WAN_COMMIT=<sha> bench/run_dist_bench.sh [full|quick]
#   full  (default) 480p and 720p        quick  480p only        720p  720p only
# Environment: WAN_DIST_GPUS (GPU count, default: all visible), WAN_DIST_KIND (label, default from the GPU
# name and count, e.g. nvidia-h200-x2), WAN_DIST_LAYERS_480 (default 2,6), WAN_DIST_LAYERS_720 (default
# 1,3), WAN_DIST_STEPS (timed forwards per depth, default 5 at 480p, 3 at 720p), WAN_BENCH_BUDGET_S
# (default 540: no configuration starts that cannot finish in time; skipped ones are listed), WAN_DIST_NEED_S
# (seconds one configuration is assumed to need: default 60 at 480p, 90 at 720p).
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
MODE=${1:-full}
bench_init 540 20
export NCCL_NVLS_ENABLE=0
WORK=/tmp/wan-dist-bench
rm -rf "$WORK" && mkdir -p "$WORK"
exec > >(tee "$OUTDIR/dist-bench.log") 2>&1

NGPU=${WAN_DIST_GPUS:-$(nvidia-smi -L | wc -l)}
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
KIND=${WAN_DIST_KIND:-$(echo "$GPU_NAME" | tr 'A-Z' 'a-z' | sed -E 's/[^a-z0-9]+/-/g; s/-+$//')-x$NGPU}
echo "$(elapsed) mode $MODE, commit $WAN_COMMIT, $NGPU GPUs ($GPU_NAME), kind $KIND, budget $BUDGET s"
bench_gpu_info
# The device image's system NCCL (/usr/lib/x86_64-linux-gnu) is older than the launcher needs
# (ncclCommRevoke, NCCL 2.28); the PyTorch wheel's NCCL 2.28 is named explicitly (header and library
# together) when present. $WAN_BIN skips the build.
if [ -n "${WAN_BIN:-}" ] && [ -x "$WAN_BIN" ]; then
  WAN=$WAN_BIN
else
  NCCL_ARGS=()
  NCCL_PY=$(python3 -c "import nvidia.nccl as n; print(list(n.__path__)[0])" 2>/dev/null)
  if [ -n "$NCCL_PY" ] && [ -f "$NCCL_PY/include/nccl.h" ]; then
    NCCL_ARGS=(-DNCCL_INCLUDE_DIR="$NCCL_PY/include" -DNCCL_LIBRARY="$(ls "$NCCL_PY"/lib/libnccl.so* | head -1)")
  fi
  cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DWAN_ENABLE_FFMPEG=OFF \
    -DCMAKE_PREFIX_PATH="$PWD/.carry/prefix" "${NCCL_ARGS[@]}" >"$OUTDIR/build.log" 2>&1 &&
    cmake --build build-bench -j 32 --target wan >>"$OUTDIR/build.log" 2>&1 || { tail -40 "$OUTDIR/build.log"; exit 1; }
  grep "wan: NCCL" "$OUTDIR/build.log"
  WAN=build-bench/wan
fi

# Every valid layout for NGPU GPUs and 40 heads: cfg in {1, 2}, Ulysses dividing 40 and NGPU/cfg.
LAYOUTS=()
for c in 1 2; do
  [ $((NGPU % c)) -eq 0 ] || continue
  rem=$((NGPU / c))
  for u in $(seq 1 "$rem"); do
    if [ $((rem % u)) -eq 0 ] && [ $((40 % u)) -eq 0 ]; then LAYOUTS+=("$c,$u,$((rem / u))"); fi
  done
done
echo "layouts (cfg,ulysses,ring): ${LAYOUTS[*]}"

run() {  # name, seconds it needs, then wan bench options
  local name=$1 need=$2
  shift 2
  if [ "$(left)" -lt "$need" ]; then echo "skip $name: $(left) s left, needs ~$need"; echo "$name" >>"$WORK/skipped"; return; fi
  echo "$(elapsed) wan bench $*"
  timeout --signal=KILL "$(left)" "$WAN" bench "$@" --json "$WORK/$name.json" || echo "run $name FAILED ($?)"
}

case $MODE in quick) SIZES=(480p) ;; 720p) SIZES=(720p) ;; *) SIZES=(480p 720p) ;; esac
for res in "${SIZES[@]}"; do
  if [ "$res" = 480p ]; then size=832x480; layers=${WAN_DIST_LAYERS_480:-2,6}; steps=${WAN_DIST_STEPS:-5}; need=${WAN_DIST_NEED_S:-60}
  else size=1280x720; layers=${WAN_DIST_LAYERS_720:-1,3}; steps=${WAN_DIST_STEPS:-3}; need=${WAN_DIST_NEED_S:-90}; fi
  common=(--size "$size" --frames 81 --layers "$layers" --steps "$steps" --warmup 2)
  run "$res-1gpu" "$need" "${common[@]}" --no-breakdown
  for l in "${LAYOUTS[@]}"; do
    IFS=, read -r c u r <<<"$l"
    opts=(--gpus "$NGPU" --ulysses "$u" --ring "$r")
    [ "$c" = 2 ] && opts+=(--cfg-parallel)
    run "$res-$NGPU-$c-$u-$r" "$need" "${common[@]}" "${opts[@]}"
  done
done

echo "$(elapsed) merge"
python3 - "$WORK" "$RES/dist-$KIND-$DATE.json" "$KIND" "$NGPU" "$MODE" <<'EOF'
import glob, json, os, sys
work, dst, kind, ngpu, mode = sys.argv[1:]
runs = {os.path.basename(p)[:-5]: json.load(open(p)) for p in sorted(glob.glob(os.path.join(work, "*.json")))}
skipped = open(os.path.join(work, "skipped")).read().split() if os.path.exists(os.path.join(work, "skipped")) else []
def step(j):  # the like-for-like figure: two-depth extrapolation when there is one, else the reported step
    return j.get("extrapolated_step_s") or j["step_s"]["value"]
rows, missing = [], list(f"{s}: skipped (time)" for s in skipped)
for res in ("480p", "720p"):
    base = runs.get(f"{res}-1gpu")
    if base:
        rows.append({"gpus": 1, "cfg": 1, "ulysses": 1, "ring": 1, "size": res, "s_per_step": round(step(base), 4),
                     "efficiency": 1.0})
    for name, j in runs.items():
        if not name.startswith(res + "-") or name.endswith("-1gpu"):
            continue
        p = j.get("parallel", {})
        t = step(j)
        eff = step(base) / (p["gpus"] * t) if base else None
        rows.append({"gpus": p["gpus"], "cfg": p["cfg"], "ulysses": p["ulysses"], "ring": p["ring"], "size": res,
                     "s_per_step": round(t, 4), "efficiency": round(eff, 4) if eff else None})
        if not base:
            missing.append(f"{res}: no single-GPU run, efficiency unknown")
dev = next((j["device"]["name"] for j in runs.values()), "unknown")
out = {"kind": kind, "device": dev, "gpus_present": int(ngpu), "commit": os.environ.get("WAN_COMMIT", "unknown"),
       "date": next((j["date"] for j in runs.values()), None), "mode": mode,
       "command": f"WAN_COMMIT=<sha> bench/run_dist_bench.sh {mode}",
       "method": "wan bench (T2V-A14B width, random weights drawn on the GPU, 81 frames, batch 2 = CFG, CUDA-graph "
                 "replay, CUDA events; multi-GPU: the slowest rank's median). s_per_step: 40 blocks extrapolated "
                 "from two reduced depths, (t_b - t_a)/(b - a) x 40 (ANCHORS.md; non-block time excluded), the same "
                 "for the single-GPU row; efficiency = t_1 / (gpus x t_layout), same kind, same run.",
       "targets": {"efficiency_720p_2_4_gpus": 0.9, "efficiency_720p_8_gpus": 0.85, "s_per_step_480p_8_gpus": 0.75},
       "rows": rows, "missing": missing, "runs": runs}
json.dump(out, open(dst, "w"), indent=2)
print(f"wrote {dst}")
print(f"{'size':5s} {'gpus':>4s} {'cfg':>3s} {'U':>3s} {'R':>3s} {'s/step':>8s} {'eff':>6s}")
for r in rows:
    e = f"{r['efficiency']:.3f}" if r["efficiency"] is not None else "-"
    print(f"{r['size']:5s} {r['gpus']:4d} {r['cfg']:3d} {r['ulysses']:3d} {r['ring']:3d} {r['s_per_step']:8.3f} {e:>6s}")
for m in missing:
    print("missing:", m)
EOF
cp "$RES/dist-$KIND-$DATE.json" "$OUTDIR/" 2>/dev/null || true
echo "$(elapsed) done"
