#!/usr/bin/env python3
"""Baseline for `wan bench`: diffusers WanTransformer3DModel at the Wan 2.2 T2V-A14B width, eager and
torch.compile, timed the way ANCHORS.md timed the peers.

Model: dim 5120 (40 heads x 128), ffn 13824, text_dim 4096, in/out 16, patch (1, 2, 2), qk RMSNorm
across heads, cross-attention norm; 1 and 3 blocks with random weights (PyTorch's default init, drawn
on the GPU). dtypes as `from_pretrained(torch_dtype=bfloat16)` leaves them: bf16 parameters except the
model's `_keep_in_fp32_modules` (time embedder, modulation tables, norms), which stay fp32. Attention is
diffusers' default backend (PyTorch SDPA, whichever kernel PyTorch picks; the profile below names it).

Inputs (batch 2 = cond + uncond of a CFG step): latents [2, 16, T, H/8, W/8] bf16 ~ N(0, 1), timestep
937 for both, text states [2, 512, 4096] bf16 ~ 0.2 N(0, 1).

Timing: CUDA events around each forward under no_grad, median of --reps after --warmup untimed ones.
torch.compile: mode default (torch.compile(model)), static shapes; the first call (trace + compile +
one forward) is timed separately as compile_s, then warm-up and timed forwards as for eager. Each
compiled model starts from torch._dynamo.reset().

Extrapolation (ANCHORS.md): per block = (t3 - t1) / 2, step = 40 x per block (the non-block parts
cancel; they are reported as t1 - per block).

A wall-clock --deadline (unix seconds) skips configurations that would not finish in time; skipped
ones are listed in the JSON with the reason, never silently dropped.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

FULL_BLOCKS = 40
CONFIG = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=40,
    attention_head_dim=128,
    in_channels=16,
    out_channels=16,
    text_dim=4096,
    freq_dim=256,
    ffn_dim=13824,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    eps=1e-6,
    image_dim=None,
    added_kv_proj_dim=None,
    rope_max_seq_len=1024,
)


def log(*a):
    print("[diffusers]", *a, flush=True)


def parse_size(s):
    w, h = s.lower().replace("*", "x").split("x")
    return int(w), int(h)


def latent_shape(size, frames):
    w, h = size
    return (frames - 1) // 4 + 1, h // 8, w // 8


def tokens_per_sample(size, frames):
    T, H, W = latent_shape(size, frames)
    return T * (H // 2) * (W // 2)


def build_model(blocks, seed):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = WanTransformer3DModel(num_layers=blocks, **CONFIG)
    keep = WanTransformer3DModel._keep_in_fp32_modules or []
    # The rule diffusers' loader applies to each parameter name (model_loading_utils.py).
    for name, p in model.named_parameters():
        fp32 = any(k in name.split(".") for k in keep)
        p.data = p.data.to(torch.float32 if fp32 else torch.bfloat16)
    return model.eval().requires_grad_(False)


def make_inputs(size, frames, batch, seed):
    T, H, W = latent_shape(size, frames)
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(batch, 16, T, H, W, device="cuda", dtype=torch.bfloat16, generator=g)
    ctx = 0.2 * torch.randn(batch, 512, 4096, device="cuda", dtype=torch.bfloat16, generator=g)
    t = torch.full((batch,), 937.0, device="cuda")
    return x, t, ctx


def timed(fn, warmup, reps):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ms = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ms.append(a.elapsed_time(b))
    return ms


def profile_kernels(fn, top=12):
    """Top CUDA kernels of one forward by device time (names which SDPA kernel PyTorch picked)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    rows = []
    for ev in prof.key_averages():
        us = getattr(ev, "device_time_total", None)
        if us is None:
            us = getattr(ev, "cuda_time_total", 0)
        if us and us > 0:
            rows.append((us, ev.key, ev.count))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    return {
        "total_ms": total / 1e3,
        "top": [{"kernel": k[:160], "ms": us / 1e3, "count": n} for us, k, n in rows[:top]],
    }


class Budget:
    def __init__(self, deadline):
        self.deadline = deadline

    def left(self):
        return float("inf") if self.deadline <= 0 else self.deadline - time.time()


def run_one(size, frames, blocks, mode, args, budget, est_s, est_fwd_ms):
    """Times one (size, blocks, mode); returns a run dict, or a skip dict when the budget is short."""
    key = dict(size=f"{size[0]}x{size[1]}", frames=frames, blocks=blocks, mode=mode)
    reps = args.reps
    if args.timed_budget_s > 0 and est_fwd_ms:  # long forwards: fewer repetitions, never under 3
        reps = max(3, min(args.reps, int(args.timed_budget_s * 1e3 / est_fwd_ms)))
    if budget.left() < est_s:
        log(f"skip {key}: {budget.left():.0f} s left, needs about {est_s:.0f} s")
        return dict(key, skipped=f"time budget: {budget.left():.0f} s left, estimated {est_s:.0f} s")
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    model = build_model(blocks, args.seed)
    x, t, ctx = make_inputs(size, frames, args.batch, args.seed + 1)
    build_s = time.time() - t0
    fn_model = model
    compile_s = None
    if mode == "compile":
        torch._dynamo.reset()
        fn_model = torch.compile(model)

    def fwd():
        with torch.no_grad():
            return fn_model(hidden_states=x, timestep=t, encoder_hidden_states=ctx, return_dict=False)[0]

    if mode == "compile":
        t0 = time.time()
        out = fwd()
        torch.cuda.synchronize()
        compile_s = time.time() - t0
        log(f"{key['size']} {blocks} block(s): first compiled call (trace + compile + 1 forward) {compile_s:.1f} s")
    else:
        out = fwd()
        torch.cuda.synchronize()
    finite = bool(torch.isfinite(out.float()).all().item())
    ms = timed(fwd, args.warmup, reps)
    run = dict(
        key,
        tokens=tokens_per_sample(size, frames),
        batch=args.batch,
        step_ms=ms,
        median_ms=statistics.median(ms),
        min_ms=min(ms),
        warmup=args.warmup,
        build_s=build_s,
        compile_s=compile_s,
        output_finite=finite,
        peak_memory_bytes=torch.cuda.max_memory_allocated(),
    )
    log(
        f"{key['size']} {frames}f {mode:7s} {blocks} block(s): median {run['median_ms']:.2f} ms "
        f"(min {run['min_ms']:.2f}; {reps} timed after {args.warmup} warm-up)"
        + (f", compile {compile_s:.1f} s" if compile_s is not None else "")
    )
    if args.profile and mode == "eager" and blocks == min(args.blocks) and not getattr(args, "_profiled", False):
        try:
            run["profile"] = profile_kernels(fwd)
            args._profiled = True
            for r in run["profile"]["top"][:6]:
                log(f"  kernel {r['ms']:9.3f} ms x{r['count']:<3d} {r['kernel'][:100]}")
        except Exception as e:  # the profile is informative only
            run["profile_error"] = repr(e)
    del fn_model, model, out, x, t, ctx
    if mode == "compile":
        torch._dynamo.reset()
    torch.cuda.empty_cache()
    return run


def extrapolate(runs, blocks):
    """ANCHORS.md: per block = (t_b - t_a)/(b - a), step = 40 x per block."""
    out = []
    groups = {}
    for r in runs:
        if "median_ms" in r:
            groups.setdefault((r["size"], r["frames"], r["mode"]), {})[r["blocks"]] = r
    a, b = min(blocks), max(blocks)
    for (size, frames, mode), by in groups.items():
        if a in by and b in by and a != b:
            pb = (by[b]["median_ms"] - by[a]["median_ms"]) / (b - a)
            out.append(
                dict(
                    size=size,
                    frames=frames,
                    mode=mode,
                    per_block_ms=pb,
                    fixed_ms=by[a]["median_ms"] - a * pb,
                    step_s=pb * FULL_BLOCKS / 1e3,
                    method=f"(t{b} - t{a})/{b - a} per block x {FULL_BLOCKS}",
                )
            )
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="832x480,1280x720")
    ap.add_argument("--frames", type=int, default=81)
    ap.add_argument("--blocks", default="1,3")
    ap.add_argument("--modes", default="eager,compile")
    ap.add_argument("--compile-sizes", default="", help="sizes for torch.compile (default: all of --sizes)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--timed-budget-s", type=float, default=8, help="cap reps so timed forwards take about this long")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--deadline", type=float, default=0, help="unix time after which nothing new starts")
    ap.add_argument("--compile-estimate-s", type=float, default=90, help="assumed compile time before one is seen")
    ap.add_argument("--no-profile", dest="profile", action="store_false")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    args.blocks = [int(b) for b in args.blocks.split(",")]
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    compile_sizes = [parse_size(s) for s in args.compile_sizes.split(",")] if args.compile_sizes else sizes
    modes = args.modes.split(",")
    budget = Budget(args.deadline)

    import diffusers

    props = torch.cuda.get_device_properties(0)
    info = dict(
        tool="diffusers WanTransformer3DModel",
        device=props.name,
        torch=torch.__version__,
        diffusers=diffusers.__version__,
        cuda=torch.version.cuda,
        cudnn=torch.backends.cudnn.version(),
        sdp_enabled=dict(
            flash=torch.backends.cuda.flash_sdp_enabled(),
            cudnn=torch.backends.cuda.cudnn_sdp_enabled(),
            mem_efficient=torch.backends.cuda.mem_efficient_sdp_enabled(),
            math=torch.backends.cuda.math_sdp_enabled(),
        ),
        config=dict(CONFIG, patch_size=list(CONFIG["patch_size"])),
        frames=args.frames,
        batch=args.batch,
        method="CUDA events around each forward (no_grad), median of reps after warm-up; "
        "torch.compile mode default, first call timed as compile_s; step = (t3 - t1)/2 x 40",
    )
    log(f"{props.name}, torch {torch.__version__}, diffusers {diffusers.__version__}, cuDNN {info['cudnn']}")

    runs = []
    # Per-(size, blocks) eager forward time, to estimate what a configuration needs.
    seen = {}

    def forward_ms(size, blocks):
        base = seen.get((size, blocks))
        if base is None:  # scale from a known block count at this size, else a generous guess
            known = [(b, ms) for (s, b), ms in seen.items() if s == size]
            base = known[0][1] * blocks / known[0][0] if known else 2000.0 * blocks
        return base

    def estimate(size, blocks, mode):
        fwd_s = forward_ms(size, blocks) / 1e3 * (args.warmup + args.reps + 2)
        comp = 0
        if mode == "compile":
            comps = [r["compile_s"] for r in runs if r.get("compile_s")]
            comp = max(comps) * 1.2 if comps else args.compile_estimate_s
        return 10 + fwd_s + comp

    plan = [(s, b, "eager") for s in sizes for b in args.blocks if "eager" in modes]
    plan += [(s, b, "compile") for s in compile_sizes for b in args.blocks if "compile" in modes]
    for size, blocks, mode in plan:
        try:
            est_fwd = seen.get((size, blocks)) or (forward_ms(size, blocks) if seen else None)
            r = run_one(size, args.frames, blocks, mode, args, budget, estimate(size, blocks, mode), est_fwd)
        except Exception as e:  # one failing configuration must not lose the others
            log(f"FAILED {size} {blocks} {mode}: {e!r}")
            r = dict(size=f"{size[0]}x{size[1]}", frames=args.frames, blocks=blocks, mode=mode, error=repr(e))
            torch._dynamo.reset()
            torch.cuda.empty_cache()
        if "median_ms" in r and mode == "eager":
            seen[(size, blocks)] = r["median_ms"]
        runs.append(r)
        # Written after every configuration: a run killed at its time limit keeps what it measured.
        info.update(runs=runs, extrapolated=extrapolate(runs, args.blocks))
        with open(args.json, "w") as f:
            json.dump(info, f, indent=2)

    ext = extrapolate(runs, args.blocks)
    for e in ext:
        log(f"{e['size']} {e['frames']}f {e['mode']:7s}: per block {e['per_block_ms']:.2f} ms, "
            f"non-block {e['fixed_ms']:.2f} ms -> {e['step_s']:.3f} s/step at {FULL_BLOCKS} blocks [{e['method']}]")
    info.update(runs=runs, extrapolated=ext)
    with open(args.json, "w") as f:
        json.dump(info, f, indent=2)
    log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
