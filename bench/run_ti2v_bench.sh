#!/usr/bin/env bash
# The DiT step benchmark of the other two Wan 2.2 models (issue 23), one device call per mode: builds `wan`
# with CUDA, runs `wan bench` (engine) and bench/baselines/diffusers_dit.py (diffusers WanTransformer3DModel,
# eager and torch.compile) on the same GPU, and writes bench/results/<mode>-step-<UTC date>.json (a -b, -c
# suffix when that exists; also copied to $OUT) with device, commit, date and rows {name, engine_s,
# baseline, baseline_s, ratio}, ratio = engine_s / baseline_s, plus every raw measurement.
#   ti2v (default)  TI2V-5B 1280x704, 121 frames (latent 48x31x44x80, 27 280 tokens), CFG batch 2, the image
#                   mode's per-token timesteps on both sides (latent frame 0's tokens at 0, the rest at t).
#                   Engine 1/3 layers and the full 30-layer step; diffusers 1/3 blocks; both extrapolated to
#                   30 blocks ((t3 - t1)/2 x 30). Target: engine <= 0.85 x diffusers + torch.compile.
#   i2v             I2V-A14B 1280x720, 81 frames (in_dim 36), 1/3 layers on both sides, then the measured
#                   40-layer engine step when the time is left. Target: <= 0.90 x diffusers + torch.compile.
# Usage: WAN_COMMIT=<sha> bench/run_ti2v_bench.sh [ti2v|i2v]; carried: .carry/prefix and .whl/ (as
# run_dit_bench.sh). WAN_BIN=<path to wan> skips the build; WAN_BENCH_BUDGET_S (default 540) bounds the run:
# the baseline starts nothing it cannot finish, skips are listed in the JSON, diagnostics only run in
# the time left.
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-ti2v}
case "$MODE" in ti2v | i2v) ;; *) echo "usage: bench/run_ti2v_bench.sh [ti2v|i2v]"; exit 2 ;; esac
source bench/lib.sh
bench_init 540 20
WORK=/tmp/wan-bench-$MODE
rm -rf "$WORK" && mkdir -p "$WORK"
NAME=$MODE-step-$DATE
for s in b c d e f g; do [ -e "$RES/$NAME.json" ] && NAME=$MODE-step-$DATE-$s; done
exec > >(tee "$OUTDIR/bench-$MODE.log") 2>&1

echo "$(elapsed) mode $MODE, commit $WAN_COMMIT, budget $BUDGET s, result $RES/$NAME.json"
bench_gpu_info
bench_wheels || exit 1
bench_build_wan || exit 1
bench_smi_start "$OUTDIR/smi-$MODE.csv"
trap bench_smi_stop EXIT

engine() {  # name, then wan bench options
  local name=$1
  shift
  echo "$(elapsed) wan bench $*"
  "$WAN" bench "$@" --json "$WORK/engine-$name.json" || echo "engine run $name FAILED"
}
baseline() {  # seconds to stop before HARD_END, json name, then diffusers_dit.py options
  local end=$((HARD_END - $1)) name=$2
  shift 2
  local left=$((end - $(date +%s)))
  if [ "$left" -lt 30 ]; then echo "skip baseline $name: $left s left"; return; fi
  echo "$(elapsed) baseline $name, $left s left for it: $*"
  timeout --signal=KILL "$left" python3 bench/baselines/diffusers_dit.py "$@" --deadline "$((end - 5))" \
    --json "$WORK/$name.json" || echo "baseline $name ended with status $? (killed at the time limit if 137)"
}
if [ "$MODE" = ti2v ]; then
  GEO=(--task ti2v-5B --size 1280x704 --frames 121)
  engine 13 "${GEO[@]}" --layers 1,3 --steps 5 --warmup 2
  engine full "${GEO[@]}" --layers 30 --steps 3 --warmup 2 --no-breakdown
  baseline 10 diffusers --task ti2v-5B --sizes 1280x704 --frames 121 --blocks 1,3 --modes eager,compile \
    --warmup 1 --reps 5
  # Diagnostics (not in the rows): what the per-token timesteps cost each side (one timestep per sample).
  [ "$(left)" -gt 45 ] && engine 13-uniform "${GEO[@]}" --uniform-t --layers 1,3 --steps 5 --warmup 2 --no-breakdown
  [ "$(left)" -gt 60 ] && baseline 10 diffusers-uniform --task ti2v-5B --uniform-t --sizes 1280x704 --frames 121 \
    --blocks 1,3 --modes eager --warmup 1 --reps 5 --no-profile
else
  GEO=(--task i2v-A14B --size 1280x720 --frames 81)
  engine 13 "${GEO[@]}" --layers 1,3 --steps 3 --warmup 2
  baseline 10 diffusers --task i2v-A14B --sizes 1280x720 --frames 81 --blocks 1,3 --modes eager,compile \
    --warmup 1 --reps 5
  # The measured 40-layer step (~20 s a forward: 2 warm-up + 2 timed + create) when the time is left.
  [ "$(left)" -gt 120 ] && engine full "${GEO[@]}" --layers 40 --steps 2 --warmup 2 --no-breakdown --profile-reps 0
fi

echo "$(elapsed) merge"
python3 - "$WORK" "$RES/$NAME.json" "$MODE" <<'EOF'
import json, os, sys
work, dst, mode = sys.argv[1:]
def load(name):
    p = os.path.join(work, name + ".json")
    return json.load(open(p)) if os.path.exists(p) else None
eng = {k: load(f"engine-{k}") for k in ("13", "full", "13-uniform")}
base, base_u = load("diffusers") or {}, load("diffusers-uniform") or {}
if mode == "ti2v":
    size, goal = "1280x704", 0.85
    label = "1280x704 121f ti2v-5B step (30 blocks, batch 2, per-token t: frame 0 at 0)"
else:
    size, goal = "1280x720", 0.90
    label = "1280x720 81f i2v-A14B step (40 blocks, in_dim 36, batch 2)"
labels = {"eager": "diffusers WanTransformer3DModel eager (bf16, batch 2, SDPA)",
          "compile": "diffusers WanTransformer3DModel + torch.compile (mode default)"}
def ext(b, m):
    return next((x for x in (b or {}).get("extrapolated", []) if x["size"] == size and x["mode"] == m), None)
e13, efull = eng["13"], eng["full"]
eng_ext = e13.get("extrapolated_step_s") if e13 else None
eng_full = efull["step_s"]["value"] if efull and efull["step_s"]["method"].startswith("measured") else None
rows, missing, targets = [], [], []
for m in ("eager", "compile"):
    b = ext(base, m)
    # (engine figure, its tag, baseline figure, its tag): the like-for-like pairs first.
    pairs = [(eng_ext, "engine 1/3-layer extrapolation (like for like)", b and b["step_s"], "1/3-block extrapolation"),
             (eng_full, "engine full step measured", b and b["step_s"],
              "1/3-block extrapolation (non-block time excluded: conservative for the engine)"),
             (eng_full, "engine full step measured (non-block time on both sides)", b and b.get("step_incl_nonblock_s"),
              "t1 + (blocks - 1) x per block from 1/3 blocks (non-block time included)")]
    for es, etag, bs, btag in pairs:
        name = f"{label}: {etag}"
        if es is None or bs is None:
            missing.append(f"{name} vs {m}: " + ("engine" if es is None else "baseline") + " not measured")
            continue
        rows.append({"name": name, "engine_s": round(es, 4), "baseline": f"{labels[m]}, {btag}",
                     "baseline_s": round(bs, 4), "ratio": round(es / bs, 4)})
        if m == "compile":
            targets.append({"target": f"{mode}: engine s/step <= {goal} x diffusers + torch.compile",
                            "engine": etag, "baseline": btag, "ratio": round(es / bs, 4), "met": es / bs <= goal})
# Diagnostics: the cost of the per-token timesteps on each side (same step with one timestep per sample).
diag_rows = []
eu = eng["13-uniform"]
if eng_ext and eu and eu.get("extrapolated_step_s"):
    diag_rows.append({"name": f"{label}: engine per-token t / one t per sample (1/3-layer extrapolations)",
                      "engine_s": round(eng_ext, 4), "baseline": "the engine with --uniform-t",
                      "baseline_s": round(eu["extrapolated_step_s"], 4),
                      "ratio": round(eng_ext / eu["extrapolated_step_s"], 4)})
bt, bu = ext(base, "eager"), ext(base_u, "eager")
if bt and bu:
    for key, what in (("step_s", "1/3-block extrapolations"), ("step_incl_nonblock_s", "with the non-block part")):
        diag_rows.append({"name": f"{label}: diffusers eager per-token t / one t per sample ({what})",
                          "engine_s": round(bt[key], 4), "baseline": "diffusers eager with --uniform-t",
                          "baseline_s": round(bu[key], 4), "ratio": round(bt[key] / bu[key], 4)})
ins = next((e["breakdown"]["in_step"] for e in (efull, e13) if e and "in_step" in e.get("breakdown", {})), None)
dev = next((e["device"]["name"] for e in eng.values() if e), base.get("device", "unknown"))
out = {"device": dev, "commit": os.environ.get("WAN_COMMIT", "unknown"),
       "date": next((e["date"] for e in eng.values() if e), None),
       "command": f"WAN_COMMIT=<sha> bench/run_ti2v_bench.sh {mode}",
       "timesteps": {"engine": (e13 or efull or {}).get("timesteps"), "baseline": base.get("timesteps")},
       "rows": rows, "targets": targets, "missing": missing, "diagnostic_rows": diag_rows,
       "in_step_other_fraction": ins and {"value": round(ins["other_fraction"], 4), "layers": ins.get("layers")},
       "method": "engine: wan bench (random weights on the GPU, batch 2, one latent for both samples, CUDA-graph "
                 "replay, CUDA events, median); baseline: bench/baselines/diffusers_dit.py (CUDA events, median); "
                 "both extrapolated from 1 and 3 blocks as (t3 - t1)/2 x the model's blocks (ANCHORS.md); the "
                 "engine's full step also measured directly",
       "engine": eng, "baseline": base, "baseline_uniform_t": base_u or None}
json.dump(out, open(dst, "w"), indent=2)
print(f"wrote {dst}")
print(f"{'name':120s} {'engine_s':>9s} {'baseline_s':>10s} {'ratio':>7s}  baseline")
for r in rows + diag_rows:
    print(f"{r['name']:120s} {r['engine_s']:9.3f} {r['baseline_s']:10.3f} {r['ratio']:7.3f}  {r['baseline'][:60]}")
for t in targets:
    print("target:", json.dumps(t))
for m in missing:
    print("missing:", m)
EOF
cp "$RES/$NAME.json" "$OUTDIR/" 2>/dev/null || true
echo "$(elapsed) done"
