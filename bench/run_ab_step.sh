#!/usr/bin/env bash
# A/B of two source trees on the device, in one call: builds `wan` from a base tree (default .carry/base,
# e.g. `git archive <commit> CMakeLists.txt src scripts | tar -x -C .carry/base`) and from a new tree
# (default: this checkout), checks that the tiny GPU pipeline gives byte-identical latents and video, then
# times the 40-block DiT step at SIZE alternating base, new, base, new (same board, same power state).
# Writes $OUT/ab-step.json ({device, size, runs: [{tree, s_per_step}], base_s, new_s, ratio}) and logs.
# Needs .carry/prefix (nlohmann json) like scripts/device_test.sh. Usage: bench/run_ab_step.sh [832x480]
# WAN_AB_NEW_BIN=path/to/wan uses an already built new binary; WAN_AB_PAIRS=N times N (base, new) pairs (2).
set -euo pipefail
SIZE=${1:-832x480}
BASE=${WAN_AB_BASE:-.carry/base}
NEW=${WAN_AB_NEW:-.}
OUTDIR=${OUT:-/tmp/ab-out}
mkdir -p "$OUTDIR"
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
ROOT=$PWD
build() {  # tree dir
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH="$ROOT/.carry/prefix" >"$2.configure.log" 2>&1 || { cat "$2.configure.log"; return 1; }
  cmake --build "$2" -j "${WAN_AB_JOBS:-8}" --target wan >"$2.build.log" 2>&1 || { tail -30 "$2.build.log"; return 1; }
}
build "$BASE" "$ROOT/build-ab-base" & pb=$!
if [ -z "${WAN_AB_NEW_BIN:-}" ]; then build "$NEW" "$ROOT/build-ab-new" & pn=$!; wait $pn; fi
wait $pb
B=$ROOT/build-ab-base/wan N=${WAN_AB_NEW_BIN:-$ROOT/build-ab-new/wan}
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 >"$OUTDIR/device.txt"

T=/tmp/ab-tiny; rm -rf $T; mkdir -p $T
$B make-checkpoint --config tiny --layout official --seed 1 --out $T/ck >/dev/null  # --out: the base may predate --output
for w in base new; do
  W=$B; [ $w = new ] && W=$N
  $W generate --model $T/ck --prompt "a corgi running on a beach at sunset" --size 192x128 --frames 17 --steps 8 \
    --seed 42 --device cuda --output $T/$w.y4m --save-latents $T/$w.safetensors >$T/$w.log 2>&1 || { cat $T/$w.log; exit 1; }
done
(cd $T && sha256sum base.y4m new.y4m base.safetensors new.safetensors) | tee "$OUTDIR/gpu-pipeline-sums.txt"
cmp $T/base.y4m $T/new.y4m && cmp $T/base.safetensors $T/new.safetensors && echo "GPU pipeline: byte-identical" |
  tee -a "$OUTDIR/gpu-pipeline-sums.txt"

for i in $(seq 1 "${WAN_AB_PAIRS:-2}"); do
  for w in base new; do
    W=$B; [ $w = new ] && W=$N
    $W bench --size "$SIZE" --frames 81 --layers 40 --steps 2 --warmup 2 --no-breakdown --profile-reps 0 \
      --json "$OUTDIR/bench-$w-$i.json" >"$OUTDIR/bench-$w-$i.log" 2>&1 || { tail -20 "$OUTDIR/bench-$w-$i.log"; exit 1; }
    grep -E "^s/step" "$OUTDIR/bench-$w-$i.log" | sed "s/^/$w $i: /"
  done
done
python3 - "$OUTDIR" "$SIZE" <<'PY'
import json, sys, glob, os
out, size = sys.argv[1], sys.argv[2]
runs = []
for f in sorted(glob.glob(os.path.join(out, "bench-*-*.json"))):
    tree, i = os.path.basename(f)[6:-5].split("-")
    j = json.load(open(f))
    s = j["step_s"]["value"]
    runs.append({"tree": tree, "rep": int(i), "s_per_step": s})
b = [r["s_per_step"] for r in runs if r["tree"] == "base" and r["s_per_step"]]
n = [r["s_per_step"] for r in runs if r["tree"] == "new" and r["s_per_step"]]
res = {"device": open(os.path.join(out, "device.txt")).read().strip(), "size": size, "frames": 81, "layers": 40,
       "runs": runs, "base_s": min(b) if b else None, "new_s": min(n) if n else None}
if b and n: res["ratio"] = res["new_s"] / res["base_s"]
json.dump(res, open(os.path.join(out, "ab-step.json"), "w"), indent=1)
print(json.dumps(res))
PY
