#!/usr/bin/env bash
# The 40-block step with both sides measured in full (no extrapolation), one size per device call:
# `wan bench --layers 40` (engine), then diffusers' 40-block WanTransformer3DModel with torch.compile (and
# eager when asked), then the engine again, all in the same call on the same GPU. Writes
#   bench/results/dit-step-40-<480p|720p>-<UTC date>.json  (also copied to $OUT)
# with device, commit, date and rows {name, engine_s, baseline, baseline_s, ratio} (engine_s = mean of the
# runs before and after the baseline), the targets of issues 4 and 7, the SM clock and power while busy,
# and every raw measurement.
#
# Usage: WAN_COMMIT=<sha> bench/run_dit_bench_40.sh 832x480|1280x720 [eager]
#   480p with eager: ~280 s on an H100; 720p (compile only): ~430 s. Carry [".carry", ".whl"] as for
#   run_dit_bench.sh. WAN_BIN=<path to wan> skips the build; WAN_BENCH_BUDGET_S (default 590).
set -uo pipefail
cd "$(dirname "$0")/.."
SIZE=${1:?usage: run_dit_bench_40.sh 832x480|1280x720 [eager]}
EAGER=${2:-}
case "$SIZE" in 832x480) RES_NAME=480p ;; 1280x720) RES_NAME=720p ;; *) echo "size must be 832x480 or 1280x720"; exit 2 ;; esac
source bench/lib.sh
bench_init 590 10
WORK=/tmp/wan-bench-40
rm -rf "$WORK"; mkdir -p "$WORK"
NAME=dit-step-40-$RES_NAME-$DATE
exec > >(tee "$OUTDIR/bench-40.log") 2>&1
echo "$(elapsed) $SIZE, commit $WAN_COMMIT, budget $BUDGET s"
bench_gpu_info
bench_wheels || exit 1
bench_build_wan || exit 1
bench_smi_start "$WORK/smi.csv"
trap bench_smi_stop EXIT

engine() {  # before | after
  echo "$(elapsed) engine ($1)"
  "$WAN" bench --size "$SIZE" --frames 81 --layers 40 --steps 2 --warmup 2 --no-breakdown --profile-reps 0 \
    --json "$WORK/engine-$1.json" | grep -E "^layers 40|^s/step" || echo "engine run $1 FAILED"
}
baseline() {  # mode; the outer timeout is the only limit (the script's own estimate assumes no known forward)
  local left=$((HARD_END - $(date +%s) - ${2:-0}))
  [ "$left" -gt 60 ] || { echo "skip baseline $1: $left s left"; return; }
  echo "$(elapsed) diffusers $1, 40 blocks ($left s)"
  timeout --signal=KILL "$left" python3 bench/baselines/diffusers_dit.py --sizes "$SIZE" --frames 81 --blocks 40 \
    --modes "$1" --warmup 1 --reps 3 --timed-budget-s 1 --no-profile --deadline 0 --json "$WORK/diffusers-$1.json" 2>&1 |
    grep "^\[diffusers\]" || echo "baseline $1 ended with status $? (137: killed at the time limit)"
}
engine before
baseline compile 50  # leaves ~50 s for the second engine run at 480p (720p needs ~90: see the usage line)
engine after
[ "$EAGER" = eager ] && baseline eager
bench_smi_stop

python3 - "$WORK" "$RES/$NAME.json" "$RES_NAME" <<'PY'
import csv, json, os, statistics, sys
work, dst, res = sys.argv[1:]
def load(n):
    p = os.path.join(work, n)
    return json.load(open(p)) if os.path.exists(p) else None
eng = [e for e in (load("engine-before.json"), load("engine-after.json")) if e]
steps = [e["step_s"]["value"] for e in eng if e["step_s"]["method"].startswith("measured")]
clk, pw = [], []
for row in csv.reader(open(os.path.join(work, "smi.csv"))):
    try:
        c, w = float(row[1].split()[0]), float(row[2].split()[0])
    except (IndexError, ValueError):
        continue
    if w > 400:
        clk.append(c); pw.append(w)
labels = {"compile": "diffusers WanTransformer3DModel + torch.compile (mode default), 40 blocks measured",
          "eager": "diffusers WanTransformer3DModel eager (bf16, batch 2, SDPA), 40 blocks measured"}
rows, targets, missing, base = [], [], [], {}
for m in ("compile", "eager"):
    b = load(f"diffusers-{m}.json")
    run = next((r for r in (b or {}).get("runs", []) if "median_ms" in r), None)
    base[m] = b
    if not run or not steps:
        missing.append(f"{m}: " + ("engine" if not steps else "baseline") + " not measured")
        continue
    es, bs = statistics.mean(steps), run["median_ms"] / 1e3
    rows.append({"name": f"{res} 81f T2V-A14B step (40 blocks, batch 2): engine 40-layer step measured "
                         f"(mean of {', '.join(f'{s:.3f}' for s in steps)} s)",
                 "engine_s": round(es, 4), "baseline": labels[m], "baseline_s": round(bs, 4), "ratio": round(es / bs, 4)})
    if m == "compile":
        goals = [(0.85, "issue 4")] if res == "480p" else [(0.95, "issue 4"), (0.87, "issue 7")]
        for g, who in goals:
            targets.append({"target": f"{res}: engine s/step <= {g} x diffusers + torch.compile ({who})",
                            "ratio": round(es / bs, 4), "met": es / bs <= g})
out = {"device": eng[0]["device"]["name"] if eng else "unknown", "commit": os.environ.get("WAN_COMMIT", "unknown"),
       "date": eng[0]["date"] if eng else None, "command": f"WAN_COMMIT=<sha> bench/run_dit_bench_40.sh <size> [eager]",
       "method": "both sides measured at the full 40 blocks, no extrapolation: engine (graph replay, one latent as the "
                 "samplers run it, median of 2 after 2 warm-up) before and after the baseline; diffusers 40-block model "
                 "(PyTorch default init on the GPU, bf16 except _keep_in_fp32_modules), median of 3 after the first "
                 "(compiling) call and 1 warm-up",
       "rows": rows, "targets": targets, "missing": missing,
       "busy_clock": {"samples": len(clk), "median_sm_mhz": statistics.median(clk) if clk else None,
                      "median_power_w": round(statistics.median(pw), 1) if pw else None},
       "engine": eng, "baseline": base}
json.dump(out, open(dst, "w"), indent=2)
print(f"wrote {dst}")
for r in rows:
    print(f"{r['name'][:70]:70s} {r['engine_s']:8.3f} {r['baseline_s']:8.3f} {r['ratio']:6.3f}  {r['baseline'][:45]}")
for t in targets:
    print("target:", json.dumps(t))
for m in missing:
    print("missing:", m)
PY
cp "$RES/$NAME.json" "$OUTDIR/" 2>/dev/null || true
echo "$(elapsed) done"
