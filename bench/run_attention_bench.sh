#!/usr/bin/env bash
# The one device command of the attention benchmark (issue 7 item 5): builds `wan` with CUDA, runs
# `wan bench-attention` (the engine's own Hopper kernel and its cuDNN path, interleaved on the same inputs)
# and then bench/baselines/torch_sdpa.py (PyTorch SDPA, flash and cuDNN backends, several input layouts) in
# the same call on the same GPU, and writes
#   bench/results/attention-<UTC date>.json  (quick: attention-quick-<date>.json; also copied to $OUT)
# with device, commit, date, rows {name, engine_s, baseline, baseline_s, ratio} (ratio = engine_s /
# baseline_s, medians of CUDA-event-timed calls; engine = the own kernel) for own vs the engine's cuDNN
# path, own vs torch flash and own vs torch cuDNN, and the issue-7 targets as met / not met:
#   self L = 75600: own >= 640 TFLOP/s and >= 1.12x cuDNN (the engine's cuDNN path, same run)
#   self L = 32760: own >= 620 TFLOP/s
#   cross (Lk = 512, masked too): own no slower than cuDNN (the engine's cuDNN path, same run)
#
# Usage: WAN_COMMIT=<sha> bench/run_attention_bench.sh [full|quick]
#   full  (default) every case; torch layouts views, bshd, bhsd; 10 reps. About 3 minutes after the build.
#   quick           every case; torch layout views only; 5 reps
#        bench/run_attention_bench.sh merge <work dir> [out.json]   only the merge, from <dir>/engine.json and
#                                                                   <dir>/torch.json (default out: as full)
# Needs .carry/prefix (nlohmann_json, as scripts/device_test.sh), carried; torch comes with the device image.
# WAN_BIN=<path to wan> skips the build. WAN_BENCH_BUDGET_S (default 540) bounds the whole run: the baseline
# starts no (case, layout) it cannot finish in time, both sides are killed at the hard limit, and whatever
# was measured is still merged (skips are listed in the JSON).
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-full}
WORK=/tmp/wan-attn-bench
if [ "$MODE" = merge ]; then
  WORK=${2:?usage: bench/run_attention_bench.sh merge <work dir>}
fi
case $MODE in full | quick | merge) ;; *) echo "usage: bench/run_attention_bench.sh [full|quick|merge <dir> [out.json]]"; exit 2 ;; esac
source bench/lib.sh
bench_init 540 15  # HARD_END leaves time for the merge and the copies
NAME=attention-$DATE
[ "$MODE" = quick ] && NAME=attention-quick-$DATE
DST=$RES/$NAME.json
[ "$MODE" = merge ] && DST=${3:-$DST}

if [ "$MODE" != merge ]; then
  rm -rf "$WORK"
  mkdir -p "$WORK"
  exec > >(tee "$OUTDIR/attention-bench.log") 2>&1
  echo "$(elapsed) mode $MODE, commit $WAN_COMMIT, budget $BUDGET s"
  bench_gpu_info
  bench_build_wan || exit 1

  REPS=10
  LAYOUTS=views,bshd,bhsd
  if [ "$MODE" = quick ]; then
    REPS=5
    LAYOUTS=views
  fi
  # Engine: 6 cases, about 1 minute on an H100 (the self-attention calls take 0.1-0.4 s each).
  if [ "$(left)" -gt 60 ]; then
    echo "$(elapsed) wan bench-attention --reps $REPS"
    timeout --signal=KILL "$(left)" "$WAN" bench-attention --reps "$REPS" --warmup 2 --json "$WORK/engine.json" ||
      echo "engine run FAILED (status $?; killed at the time limit if 137)"
  else
    echo "skip engine: $(left) s left" | tee "$WORK/skip-engine.txt"
  fi
  # Baseline: the same cases, flash and cuDNN, every layout; the script skips what it cannot finish.
  if ! python3 -c "import torch" 2>/dev/null; then
    echo "no torch on this machine: baseline skipped" | tee "$WORK/skip-torch.txt"
  elif [ "$(left)" -gt 40 ]; then
    echo "$(elapsed) torch_sdpa.py --layouts $LAYOUTS --reps $REPS, $(left) s left"
    timeout --signal=KILL "$(left)" python3 bench/baselines/torch_sdpa.py --backends flash,cudnn --layouts "$LAYOUTS" \
      --warmup 2 --reps "$REPS" --deadline "$((HARD_END - 5))" --json "$WORK/torch.json" ||
      echo "baseline ended with status $? (killed at the time limit if 137)"
  else
    echo "skip baseline: $(left) s left" | tee "$WORK/skip-torch.txt"
  fi
  echo "$(elapsed) merge"
fi

python3 - "$WORK" "$DST" "$MODE" <<'EOF'
import glob, json, os, sys
work, dst, mode = sys.argv[1:]
def load(name):
    p = os.path.join(work, name)
    try:
        return json.load(open(p)) if os.path.exists(p) else None
    except json.JSONDecodeError as e:  # a run killed while writing
        return {"error": f"{name}: {e}"}
eng, tor = load("engine.json"), load("torch.json")
missing = [open(p).read().strip() for p in sorted(glob.glob(os.path.join(work, "skip-*.txt")))]
if not eng or "cases" not in eng:
    missing.append("engine (wan bench-attention) not measured" + (f": {eng['error']}" if eng and "error" in eng else ""))
if not tor or "results" not in tor:
    missing.append("baseline (torch_sdpa.py) not measured" + (f": {tor['error']}" if tor and "error" in tor else ""))
ecases = {c["name"]: c for c in (eng or {}).get("cases", [])}
tres = [r for r in (tor or {}).get("results", []) if r.get("status") == "ok"]
tskip = [r for r in (tor or {}).get("results", []) if r.get("status") == "skipped"] + (tor or {}).get("skipped", [])
order = ["self-75600", "self-32760", "self-75601", "cross-75600x512", "cross-32760x512", "cross-masked-75600x512"]
names = [n for n in order if n in ecases] + [n for n in ecases if n not in order]
DESC = {"self": "self-attention B=2 H=40 D=128 bf16, Q/K/V views of a fused [B, L, 3, H, D] buffer",
        "cross": "cross-attention B=2 H=40 D=128 bf16, dense Q and K/V"}
LAYOUT = {"views": "the engine's layout (permute/transpose views)", "bshd": "separate dense [B, L, H, D] as "
          ".transpose(1, 2) views (diffusers' layout)", "bhsd": "contiguous [B, H, L, D]"}
edev = (eng or {}).get("device", {})
cudnn_ver = edev.get("cudnn")
tver = (tor or {}).get("torch", "?")
rows, targets = [], []
def ms(side):
    return side["median_ms"] if side else None
for n in names:
    c = ecases[n]
    desc = f"{n}: {DESC[c['kind']]}, Lq={c['Lq']} Lk={c['Lk']}" + (f", k_lens {c['k_lens']}" if c.get("k_lens") else "")
    own, cud = ms(c.get("own")), ms(c.get("cudnn"))
    if own is None:
        missing.append(f"{n}: own kernel not measured" + (" (unsupported on this device)" if not eng.get("own_supported", True) else ""))
        continue
    def row(baseline, bms, btf, extra=None):
        r = {"name": desc + ": own kernel", "engine_s": round(own / 1e3, 6), "baseline": baseline,
             "baseline_s": round(bms / 1e3, 6), "ratio": round(own / bms, 4),
             "engine_tflops": round(c["own"]["tflops"], 1), "baseline_tflops": round(btf, 1)}
        r.update(extra or {})
        rows.append(r)
    if cud is not None:
        row(f"cuDNN {cudnn_ver} fused attention through the engine's CudnnAttention (same process, same inputs, "
            f"interleaved)", cud, c["cudnn"]["tflops"])
    else:
        missing.append(f"{n}: the engine's cuDNN path not measured")
    for b, bname in (("flash", "FLASH_ATTENTION"), ("cudnn", "CUDNN_ATTENTION")):
        got = [r for r in tres if r["case"] == n and r["backend"] == b]
        if not got:
            why = [r.get("reason", "") for r in tskip if r.get("case") == n and r.get("backend") == b]
            missing.append(f"{n}: torch SDPA {b} not measured" + (f" ({why[0][:200]})" if why else ""))
        for r in sorted(got, key=lambda r: list(LAYOUT).index(r["layout"])):
            extra = {"baseline_layout": r["layout"]}
            if r.get("extra_kernels"):
                extra["baseline_extra_kernels_ms"] = round(sum(k["us"] for k in r["extra_kernels"]) / 1e3, 4)
            row(f"torch {tver} SDPA {bname} (cuDNN {tor.get('cudnn')}), inputs: {LAYOUT[r['layout']]}",
                r["median_ms"], r["tflops"], extra)

def tflops_target(n, goal):
    c = ecases.get(n)
    t = {"target": f"{n}: own kernel >= {goal} TFLOP/s"}
    if not c or not c.get("own"):
        t["met"] = None
        missing.append(t["target"] + ": not measured")
    else:
        t.update(own_tflops=round(c["own"]["tflops"], 1), met=c["own"]["tflops"] >= goal)
    targets.append(t)
def speed_target(n, goal, text):
    c = ecases.get(n)
    t = {"target": f"{n}: {text}"}
    if not c or not c.get("own") or not c.get("cudnn"):
        t["met"] = None
        missing.append(t["target"] + ": not measured")
    else:
        sp = c["cudnn"]["median_ms"] / c["own"]["median_ms"]
        t.update(own_ms=round(c["own"]["median_ms"], 4), cudnn_ms=round(c["cudnn"]["median_ms"], 4),
                 speedup=round(sp, 4), met=sp >= goal)
        tc = [r for r in tres if r["case"] == n and r["backend"] == "cudnn" and r["layout"] == "views"]
        if tc:  # for information: PyTorch's cuDNN on the engine's layout
            t["info_speedup_vs_torch_cudnn_views"] = round(tc[0]["median_ms"] / c["own"]["median_ms"], 4)
    targets.append(t)
tflops_target("self-75600", 640)
speed_target("self-75600", 1.12, "own kernel >= 1.12x cuDNN (the engine's cuDNN path, same run)")
tflops_target("self-32760", 620)
for n in ("cross-75600x512", "cross-32760x512", "cross-masked-75600x512"):
    speed_target(n, 1.0, "own kernel no slower than cuDNN (the engine's cuDNN path, same run)")

out = {"device": edev.get("name") or (tor or {}).get("device", "unknown"),
       "commit": (eng or {}).get("commit") or os.environ.get("WAN_COMMIT", "unknown"),
       "date": (eng or {}).get("date") or (tor or {}).get("date"),
       "command": f"WAN_COMMIT=<sha> bench/run_attention_bench.sh {mode}",
       "rows": rows, "targets": targets, "missing": missing,
       "baseline_skipped": [{k: r.get(k) for k in ("case", "layout", "backend", "reason")} for r in tskip],
       "method": "engine: wan bench-attention (random bf16 inputs on the GPU, own and cuDNN interleaved call by call, "
                 "CUDA events, each call after an untimed 256 MiB fill, median of reps after 2 warm-ups); baseline: "
                 "bench/baselines/torch_sdpa.py (same cases and method, F.scaled_dot_product_attention under "
                 "sdpa_kernel(one backend), whole call timed, copies included); ratio = engine_s / baseline_s; "
                 "TFLOP/s = 4*B*H*Lq*Lk*D / median (masked: valid keys)",
       "engine": eng, "baseline": tor}
json.dump(out, open(dst, "w"), indent=2)
print(f"wrote {dst}")
print(f"{'case':24s} {'layout':6s} {'own ms':>9s} {'own TF':>7s} {'base ms':>9s} {'base TF':>7s} {'ratio':>7s}  baseline")
for r in rows:
    print(f"{r['name'].split(':')[0]:24s} {r.get('baseline_layout', '-'):6s} {r['engine_s'] * 1e3:9.3f} "
          f"{r['engine_tflops']:7.1f} {r['baseline_s'] * 1e3:9.3f} {r['baseline_tflops']:7.1f} {r['ratio']:7.3f}  "
          f"{r['baseline'][:60]}")
for t in targets:
    print("target:", json.dumps(t))
for m in missing:
    print("missing:", m)
EOF
[ "$MODE" = merge ] || cp "$DST" "$OUTDIR/" 2>/dev/null || true
echo "$(elapsed) done"
