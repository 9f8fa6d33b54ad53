#!/usr/bin/env bash
# The one device command of the VAE benchmarks (issue 4 item 6; issue 23 items 6-7): builds `wan` with CUDA,
# then for each case runs `wan bench-vae` (engine: GPU decoder or encoder, bf16, causal chunk cache) and
# bench/baselines/diffusers_vae.py (diffusers AutoencoderKLWan, fp32: the official VAE) with the same
# arguments, one after the other on the same GPU, and writes bench/results/vae-<mode>-<UTC date>.json
# (also copied to $OUT) with device, commit, date, rows {name, engine_s, baseline, baseline_s, ratio}
# (ratio = engine_s / baseline_s, medians of CUDA-event-timed runs), both sides' peak memories, and the
# targets (ratio <= 0.5 and engine peak <= baseline peak) as met / not met where a case has them.
#
# Usage: WAN_COMMIT=<sha> bench/run_vae_bench.sh [full|quick|wan22]
#   full  (default) Wan 2.1 decode 1280x720 then 832x480, 81 frames; ~2 min on an H100 (vae-decode-*)
#   quick           Wan 2.1 decode 1280x720 only (vae-decode-quick-*)
#   wan22           Wan 2.2 decode 1280x704x121 (targeted), then Wan 2.1 encode of the 720p I2V video
#                   (1 image + 80 zero frames) and Wan 2.2 encode of one 1280x704 frame (report only);
#                   budget 540 s, ~5 min on an H100 with a fresh build (vae-wan22-*)
# Needs, carried in ignored folders: .carry/prefix (nlohmann_json, as scripts/device_test.sh) and .whl/
# (the diffusers wheel: the device image has torch but not diffusers). WAN_BIN=<path to wan> skips the
# build. WAN_BENCH_BUDGET_S (default 420, wan22 540) bounds the whole run: nothing new starts when it
# cannot finish, and skips are listed in the JSON. WAN_VAE_REPS (default 3) timed runs per side.
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-full}
source bench/lib.sh
case "$MODE" in
  full | quick) bench_init 420 15 ;;  # HARD_END leaves time for the merge and the copies
  wan22) bench_init 540 15 ;;
  *) echo "unknown mode '$MODE' (full, quick or wan22)" >&2; exit 2 ;;
esac
WORK=/tmp/wan-vae-bench
rm -rf "$WORK"
mkdir -p "$WORK"
case "$MODE" in
  full) NAME=vae-decode-$DATE ;;
  quick) NAME=vae-decode-quick-$DATE ;;
  wan22) NAME=vae-wan22-$DATE ;;
esac
exec > >(tee "$OUTDIR/vae-bench.log") 2>&1

REPS=${WAN_VAE_REPS:-3}
# One case a line: key | s needed to start it | s needed to start its baseline | timed reps | target
# (yes: ratio <= 0.5 and peak <= baseline's) | short label | row name | arguments of both sides.
# The time estimates are for an H100 (engine and fp32 baseline, warm-up + reps, start-up included).
case "$MODE" in
  full | quick)
    CASES="1280x720|90|30|$REPS|yes|720p/81 frames|Wan 2.1 VAE decode 1280x720 (720p), 81 frames (latent [16, 21, 90, 160])|--size 1280x720 --frames 81"
    [ "$MODE" = full ] && CASES="$CASES
832x480|60|30|$REPS|no|480p/81 frames|Wan 2.1 VAE decode 832x480 (480p), 81 frames (latent [16, 21, 60, 104])|--size 832x480 --frames 81"
    ;;
  wan22)
    # the targeted pair first; the 1-frame encode is short, so more reps
    CASES="wan22-decode|150|100|$REPS|yes|Wan 2.2 1280x704/121 frames|Wan 2.2 VAE decode 1280x704, 121 frames (latent [48, 31, 44, 80])|--vae wan2.2 --size 1280x704 --frames 121
wan21-encode-i2v|70|40|$REPS|no|Wan 2.1 I2V encode|Wan 2.1 VAE encode 1280x720, 1 image + 80 zero frames (video [3, 81, 720, 1280], I2V) -> latent [16, 21, 90, 160]|--vae wan2.1 --encode --size 1280x720 --frames 81
wan22-encode-ti2v|40|30|10|no|Wan 2.2 TI2V encode|Wan 2.2 VAE encode 1280x704, 1 frame (video [3, 1, 704, 1280], TI2V) -> latent [48, 1, 44, 80]|--vae wan2.2 --encode --size 1280x704 --frames 1"
    ;;
esac
printf '%s\n' "$CASES" >"$WORK/cases.txt"

echo "$(elapsed) mode $MODE, commit $WAN_COMMIT, budget $BUDGET s"
bench_gpu_info
bench_wheels || exit 1  # diffusers (and nothing else) from the carried wheels, into a private folder
bench_build_wan || exit 1

while IFS='|' read -r key need base_need reps target short name cargs; do
  [ -n "$key" ] || continue
  read -r -a argv <<<"$cargs"
  if [ "$(left)" -lt "$need" ]; then echo "skip $name: $(left) s left" | tee "$WORK/skip-$key.txt"; continue; fi
  echo "$(elapsed) wan bench-vae ${argv[*]}"
  timeout --signal=KILL "$(left)" "$WAN" bench-vae "${argv[@]}" --warmup 1 --reps "$reps" \
    --json "$WORK/engine-$key.json" </dev/null || echo "engine run $key FAILED (status $?)"
  if [ "$(left)" -lt "$base_need" ]; then
    echo "skip baseline of $name: $(left) s left" | tee "$WORK/skip-$key.txt"
    continue
  fi
  echo "$(elapsed) diffusers_vae.py ${argv[*]}"
  timeout --signal=KILL "$(left)" python3 bench/baselines/diffusers_vae.py "${argv[@]}" --warmup 1 --reps "$reps" \
    --deadline "$((HARD_END - 5))" --json "$WORK/diffusers-$key.json" </dev/null ||
    echo "baseline $key ended with status $? (killed at the time limit if 137)"
done <"$WORK/cases.txt"

echo "$(elapsed) merge"
python3 - "$WORK" "$RES/$NAME.json" "$MODE" <<'EOF'
import json, os, sys
work, dst, mode = sys.argv[1], sys.argv[2], sys.argv[3]
GiB = 1024.0 ** 3
def load(name):
    p = os.path.join(work, name)
    return json.load(open(p)) if os.path.exists(p) else None
cases = [l.rstrip("\n").split("|") for l in open(os.path.join(work, "cases.txt")) if l.strip()]
rows, targets, missing, memory = [], [], [], []
eng_all, base_all = {}, {}
for key, _need, _base_need, _reps, target, short, name, _args in cases:
    e, b = load(f"engine-{key}.json"), load(f"diffusers-{key}.json")
    eng_all[key], base_all[key] = e, b
    skip = os.path.join(work, f"skip-{key}.txt")
    if os.path.exists(skip):
        missing.append(open(skip).read().strip())
    es = e.get("median_s") if e else None
    bs = b.get("median_s") if b else None
    if es is None or bs is None:
        missing.append(f"{name}: " + ("engine" if es is None else "baseline") + " not measured")
        continue
    op = e.get("op", "decode")
    rows.append({"name": name, "engine_s": round(es, 4),
                 "baseline": f"diffusers {b['diffusers']} AutoencoderKLWan.{op}, fp32 (the official VAE dtype; "
                             f"torch {b['torch']}, cuDNN TF32 {'on' if b.get('cudnn_allow_tf32') else 'off'})",
                 "baseline_s": round(bs, 4), "ratio": round(es / bs, 4)})
    em, bm = e["memory"], b.get("memory", {})
    memory.append({"case": key, "name": name,
                   "engine_peak_bytes": em["peak_bytes"], "engine_plan_bytes": em["plan_bytes"],
                   "engine_planned_device_bytes": em.get("planned_device_bytes"),
                   "engine_weight_bytes": em["weight_bytes"], "engine_arena_bytes": em["arena_bytes"],
                   "baseline_max_allocated_bytes": bm.get("max_allocated_bytes"),
                   "baseline_max_reserved_bytes": bm.get("max_reserved_bytes"),
                   "baseline_device_used_peak_bytes": bm.get("device_used_peak_bytes"),
                   "engine_measure": "cudaMemGetInfo used bytes, peak over the run minus before (libraries, kernels, "
                                     "weights, arena, input + output)",
                   "baseline_measures": "torch max_memory_allocated / max_memory_reserved (tensors / caching "
                                        "allocator), and mem_get_info used bytes after the run minus before (the "
                                        "engine's measure)"})
    if target != "yes":
        continue
    targets.append({"target": f"{short}: engine {op} s <= 0.5 x official fp32 {op} s (same run)",
                    "engine_s": round(es, 4), "baseline_s": round(bs, 4), "ratio": round(es / bs, 4),
                    "met": es / bs <= 0.5})
    ba = bm.get("max_allocated_bytes")
    if not ba:
        missing.append(f"{short}: peak memory of the baseline not measured")
        continue
    # The engine's figure counts everything on the device; the baseline's allocator figure only its tensors,
    # so this is the strict comparison. The like-for-like one (same measure on both sides) is listed too.
    targets.append({"target": f"{short}: engine peak memory <= official fp32 {op} peak memory",
                    "engine_peak_gib": round(em["peak_bytes"] / GiB, 3),
                    "baseline_max_allocated_gib": round(ba / GiB, 3),
                    "baseline_max_reserved_gib": round(bm["max_reserved_bytes"] / GiB, 3),
                    "baseline_device_used_peak_gib": round(bm["device_used_peak_bytes"] / GiB, 3),
                    "compared": "engine cudaMemGetInfo peak vs baseline max_memory_allocated (strictest)",
                    "met": em["peak_bytes"] <= ba})
dev = next((e["device"]["name"] for e in eng_all.values() if e), None) or \
      next((b.get("device") for b in base_all.values() if b), "unknown")
out = {"device": dev, "commit": os.environ.get("WAN_COMMIT", "unknown"),
       "date": next((e["date"] for e in eng_all.values() if e), None),
       "command": f"WAN_COMMIT=<sha> bench/run_vae_bench.sh {mode}",
       "rows": rows, "peak_memory": memory, "targets": targets, "missing": missing,
       "method": "engine: wan bench-vae (random weights as make-checkpoint draws them, CUDA events, median of reps "
                 "after 1 warm-up); baseline: bench/baselines/diffusers_vae.py with the same arguments (random "
                 "weights, fp32, CUDA events, median of reps after 1 warm-up); one process each, one after the "
                 "other, same GPU",
       "engine": eng_all, "baseline": base_all}
json.dump(out, open(dst, "w"), indent=2)
print(f"wrote {dst}")
print(f"{'name':100s} {'engine_s':>9s} {'baseline_s':>10s} {'ratio':>7s}")
for r in rows:
    print(f"{r['name']:100s} {r['engine_s']:9.3f} {r['baseline_s']:10.3f} {r['ratio']:7.3f}")
for m in memory:
    print(f"peak memory {m['case']}: engine {m['engine_peak_bytes'] / GiB:.2f} GiB (plan {m['engine_plan_bytes'] / GiB:.2f}); "
          f"baseline allocated {(m['baseline_max_allocated_bytes'] or 0) / GiB:.2f}, reserved "
          f"{(m['baseline_max_reserved_bytes'] or 0) / GiB:.2f}, device used {(m['baseline_device_used_peak_bytes'] or 0) / GiB:.2f} GiB")
for t in targets:
    print("target:", json.dumps(t))
for m in missing:
    print("missing:", m)
EOF
cp "$RES/$NAME.json" "$OUTDIR/" 2>/dev/null || true
echo "$(elapsed) done"
