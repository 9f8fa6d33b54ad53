#!/usr/bin/env python3
"""Baseline for `wan bench`: diffusers WanTransformer3DModel at a Wan 2.2 model's width, eager and
torch.compile, timed the way ANCHORS.md timed the peers.

Models (--task; the diffusers configs of the Wan 2.2 checkpoints): patch (1, 2, 2), head dim 128, text_dim
4096, freq_dim 256, qk RMSNorm across heads, cross-attention norm, no image embedder;
  t2v-A14B  dim 5120 (40 heads), ffn 13824, in/out 16, 40 blocks, VAE stride 8;
  i2v-A14B  the same with in_channels 36 (latent + mask + image latent concatenated), 40 blocks;
  ti2v-5B   dim 3072 (24 heads), ffn 14336, in/out 48, 30 blocks, VAE stride 16.
1 and 3 blocks with random weights (PyTorch's default init, drawn on the GPU). dtypes as
`from_pretrained(torch_dtype=bfloat16)` leaves them: bf16 parameters except the model's
`_keep_in_fp32_modules` (time embedder, modulation tables, norms), which stay fp32. Attention is
diffusers' default backend (PyTorch SDPA, whichever kernel PyTorch picks; the profile below names it).

Inputs (batch 2 = cond + uncond of a CFG step): latents [2, in_channels, T, H/s, W/s] bf16 ~ N(0, 1),
text states [2, 512, 4096] bf16 ~ 0.2 N(0, 1), timestep 937 for both samples; for ti2v-5B (unless
--uniform-t) per token, [2, seq_len] float32, latent frame 0's tokens at 0 and the rest at 937, as its
pipeline builds it in image mode (expand_timesteps: mask[:, ::2, ::2] * t flattened).

Timing: CUDA events around each forward under no_grad, median of --reps after --warmup untimed ones.
torch.compile: mode default (torch.compile(model)), static shapes; the first call (trace + compile +
one forward) is timed separately as compile_s, then warm-up and timed forwards as for eager. Each
compiled model starts from torch._dynamo.reset().

Extrapolation (ANCHORS.md): per block = (t3 - t1) / 2, step = the task's blocks (40; ti2v-5B 30) x per
block (the non-block parts cancel; they are reported as fixed_ms = t1 - per block, and step_incl_nonblock_s
= fixed + blocks x per block adds them back: for ti2v-5B they hold the per-token time embedding).

A wall-clock --deadline (unix seconds) skips configurations that would not finish in time; skipped
ones are listed in the JSON with the reason, never silently dropped. --device cpu (tiny sizes only) is
a smoke test of the script: wall-clock timing, no profile.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

BASE_CONFIG = dict(
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
# Per task: the config overrides, the full block count, the VAE's spatial stride, the default sizes and frames.
TASKS = {
    "t2v-A14B": dict(config={}, blocks=40, stride=8, sizes="832x480,1280x720", frames=81),
    "i2v-A14B": dict(config=dict(in_channels=36), blocks=40, stride=8, sizes="832x480,1280x720", frames=81),
    "ti2v-5B": dict(
        config=dict(num_attention_heads=24, in_channels=48, out_channels=48, ffn_dim=14336),
        blocks=30,
        stride=16,
        sizes="1280x704",
        frames=121,
    ),
}
TIMESTEP, FIRST_FRAME_TIMESTEP = 937.0, 0.0
# Set by main() from --task (the functions below read them).
TASK = "t2v-A14B"
CONFIG = dict(BASE_CONFIG)
FULL_BLOCKS = 40
STRIDE = 8
PER_TOKEN_T = False
DEVICE = "cuda"


def set_task(task, uniform_t, device):
    global TASK, CONFIG, FULL_BLOCKS, STRIDE, PER_TOKEN_T, DEVICE
    spec = TASKS[task]
    TASK, CONFIG = task, dict(BASE_CONFIG, **spec["config"])
    FULL_BLOCKS, STRIDE = spec["blocks"], spec["stride"]
    PER_TOKEN_T = task == "ti2v-5B" and not uniform_t
    DEVICE = device


def log(*a):
    print("[diffusers]", *a, flush=True)


def sync():
    if DEVICE != "cpu":
        torch.cuda.synchronize()


def free_cached():
    if DEVICE != "cpu":
        torch.cuda.empty_cache()


def parse_size(s):
    w, h = s.lower().replace("*", "x").split("x")
    return int(w), int(h)


def latent_shape(size, frames):
    w, h = size
    mult = STRIDE * 2  # the VAE's stride times the patch
    if w % mult or h % mult or (frames - 1) % 4:
        raise SystemExit(f"size {w}x{h}, {frames} frames: {TASK} needs multiples of {mult} and 4n+1 frames")
    return (frames - 1) // 4 + 1, h // STRIDE, w // STRIDE


def tokens_per_sample(size, frames):
    T, H, W = latent_shape(size, frames)
    return T * (H // 2) * (W // 2)


def timesteps(size, frames, batch):
    """[batch] one per sample, or (ti2v image mode) [batch, seq_len] with latent frame 0's tokens at 0."""
    if not PER_TOKEN_T:
        return torch.full((batch,), TIMESTEP, device=DEVICE)
    _, H, W = latent_shape(size, frames)
    t = torch.full((batch, tokens_per_sample(size, frames)), TIMESTEP, device=DEVICE)
    t[:, : (H // 2) * (W // 2)] = FIRST_FRAME_TIMESTEP
    return t


def build_model(blocks, seed):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    with torch.device(DEVICE):
        model = WanTransformer3DModel(num_layers=blocks, **CONFIG)
    keep = WanTransformer3DModel._keep_in_fp32_modules or []
    # The rule diffusers' loader applies to each parameter name (model_loading_utils.py).
    for name, p in model.named_parameters():
        fp32 = any(k in name.split(".") for k in keep)
        p.data = p.data.to(torch.float32 if fp32 else torch.bfloat16)
    return model.eval().requires_grad_(False)


def make_inputs(size, frames, batch, seed):
    T, H, W = latent_shape(size, frames)
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    x = torch.randn(batch, CONFIG["in_channels"], T, H, W, device=DEVICE, dtype=torch.bfloat16, generator=g)
    ctx = 0.2 * torch.randn(batch, 512, 4096, device=DEVICE, dtype=torch.bfloat16, generator=g)
    return x, timesteps(size, frames, batch), ctx


def timed(fn, warmup, reps):
    for _ in range(warmup):
        fn()
    if DEVICE == "cpu":
        ms = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            ms.append((time.perf_counter() - t0) * 1e3)
        return ms
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
    free_cached()
    if DEVICE != "cpu":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    model = build_model(blocks, args.seed)
    x, t, ctx = make_inputs(size, frames, args.batch, args.seed + 1)
    build_s = time.time() - t0
    fn_model = model
    compile_s = None
    if mode == "offload":
        # The peer of `wan bench --memory-budget` (issue 27): diffusers' group offload with CUDA streams,
        # one block per group, every group waiting in (pinned) CPU memory and prefetched on a side stream.
        model.to("cpu")
        free_cached()
        model.enable_group_offload(onload_device=torch.device(DEVICE), offload_device=torch.device("cpu"),
                                   offload_type="block_level", num_blocks_per_group=1, use_stream=True)
        torch.cuda.reset_peak_memory_stats()
        build_s = time.time() - t0
    if mode == "compile":
        torch._dynamo.reset()
        fn_model = torch.compile(model)

    def fwd():
        with torch.no_grad():
            return fn_model(hidden_states=x, timestep=t, encoder_hidden_states=ctx, return_dict=False)[0]

    if mode == "compile":
        t0 = time.time()
        out = fwd()
        sync()
        compile_s = time.time() - t0
        log(f"{key['size']} {blocks} block(s): first compiled call (trace + compile + 1 forward) {compile_s:.1f} s")
    else:
        out = fwd()
        sync()
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
        peak_memory_bytes=torch.cuda.max_memory_allocated() if DEVICE != "cpu" else None,
    )
    log(
        f"{key['size']} {frames}f {mode:7s} {blocks} block(s): median {run['median_ms']:.2f} ms "
        f"(min {run['min_ms']:.2f}; {reps} timed after {args.warmup} warm-up)"
        + (f", compile {compile_s:.1f} s" if compile_s is not None else "")
    )
    if args.profile and DEVICE != "cpu" and mode == "eager" and blocks == min(args.blocks) and not getattr(args, "_profiled", False):
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
    free_cached()
    return run


def extrapolate(runs, blocks):
    """ANCHORS.md: per block = (t_b - t_a)/(b - a), step = FULL_BLOCKS x per block."""
    out = []
    groups = {}
    for r in runs:
        if "median_ms" in r:
            groups.setdefault((r["size"], r["frames"], r["mode"]), {})[r["blocks"]] = r
    a, b = min(blocks), max(blocks)
    for (size, frames, mode), by in groups.items():
        if a in by and b in by and a != b:
            pb = (by[b]["median_ms"] - by[a]["median_ms"]) / (b - a)
            fixed = by[a]["median_ms"] - a * pb
            out.append(
                dict(
                    task=TASK,
                    size=size,
                    frames=frames,
                    mode=mode,
                    blocks=FULL_BLOCKS,
                    per_block_ms=pb,
                    fixed_ms=fixed,
                    step_s=pb * FULL_BLOCKS / 1e3,
                    step_incl_nonblock_s=(fixed + pb * FULL_BLOCKS) / 1e3,
                    method=f"(t{b} - t{a})/{b - a} per block x {FULL_BLOCKS}",
                )
            )
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=sorted(TASKS), default="t2v-A14B", help="the model's config and block count")
    ap.add_argument("--uniform-t", action="store_true", help="ti2v-5B: one timestep per sample (its text mode)")
    ap.add_argument("--sizes", default="", help="WxH,... (default: t2v/i2v 832x480,1280x720; ti2v-5B 1280x704)")
    ap.add_argument("--frames", type=int, default=0, help="pixel frames (default: 81; ti2v-5B 121)")
    ap.add_argument("--blocks", default="1,3")
    ap.add_argument("--modes", default="eager,compile", help="eager,compile,offload (offload: group offload with streams)")
    ap.add_argument("--compile-sizes", default="", help="sizes for torch.compile (default: all of --sizes)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--timed-budget-s", type=float, default=8, help="cap reps so timed forwards take about this long")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--deadline", type=float, default=0, help="unix time after which nothing new starts")
    ap.add_argument("--compile-estimate-s", type=float, default=90, help="assumed compile time before one is seen")
    ap.add_argument("--no-profile", dest="profile", action="store_false")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: a smoke test at tiny sizes")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    set_task(args.task, args.uniform_t, args.device)
    args.sizes = args.sizes or TASKS[args.task]["sizes"]
    args.frames = args.frames or TASKS[args.task]["frames"]
    args.blocks = [int(b) for b in args.blocks.split(",")]
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    compile_sizes = [parse_size(s) for s in args.compile_sizes.split(",")] if args.compile_sizes else sizes
    modes = args.modes.split(",")
    budget = Budget(args.deadline)

    import diffusers

    for size in sizes:
        latent_shape(size, args.frames)  # refuse a size the task's VAE cannot take before any work
    device_name = torch.cuda.get_device_properties(0).name if DEVICE != "cpu" else "cpu"
    T0, H0, W0 = latent_shape(sizes[0], args.frames)
    info = dict(
        tool="diffusers WanTransformer3DModel",
        task=TASK,
        device=device_name,
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
        config=dict(CONFIG, patch_size=list(CONFIG["patch_size"]), num_layers=FULL_BLOCKS),
        frames=args.frames,
        batch=args.batch,
        timesteps=(
            f"per token [batch, seq_len] float32: latent frame 0's {(H0 // 2) * (W0 // 2)} tokens at "
            f"{FIRST_FRAME_TIMESTEP:g}, the rest at {TIMESTEP:g} (ti2v image mode, expand_timesteps)"
            if PER_TOKEN_T
            else f"per sample [batch]: {TIMESTEP:g}"
        ),
        method="CUDA events around each forward (no_grad), median of reps after warm-up; "
        f"torch.compile mode default, first call timed as compile_s; step = (t3 - t1)/2 x {FULL_BLOCKS}",
    )
    log(f"{TASK}: {info['timesteps']}")
    log(f"{device_name}, torch {torch.__version__}, diffusers {diffusers.__version__}, cuDNN {info['cudnn']}")

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
    plan += [(s, b, "offload") for s in sizes for b in args.blocks if "offload" in modes]
    plan += [(s, b, "compile") for s in compile_sizes for b in args.blocks if "compile" in modes]
    for size, blocks, mode in plan:
        try:
            est_fwd = seen.get((size, blocks)) or (forward_ms(size, blocks) if seen else None)
            r = run_one(size, args.frames, blocks, mode, args, budget, estimate(size, blocks, mode), est_fwd)
        except Exception as e:  # one failing configuration must not lose the others
            log(f"FAILED {size} {blocks} {mode}: {e!r}")
            r = dict(size=f"{size[0]}x{size[1]}", frames=args.frames, blocks=blocks, mode=mode, error=repr(e))
            torch._dynamo.reset()
            free_cached()
        if "median_ms" in r and mode == "eager":
            seen[(size, blocks)] = r["median_ms"]
        runs.append(r)
        # Written after every configuration: a run killed at its time limit keeps what it measured.
        info.update(runs=runs, extrapolated=extrapolate(runs, args.blocks))
        with open(args.json, "w") as f:
            json.dump(info, f, indent=2)

    ext = extrapolate(runs, args.blocks)
    for e in ext:
        log(f"{TASK} {e['size']} {e['frames']}f {e['mode']:7s}: per block {e['per_block_ms']:.2f} ms, "
            f"non-block {e['fixed_ms']:.2f} ms -> {e['step_s']:.3f} s/step at {FULL_BLOCKS} blocks [{e['method']}]; "
            f"{e['step_incl_nonblock_s']:.3f} s with the non-block part")
    info.update(runs=runs, extrapolated=ext)
    with open(args.json, "w") as f:
        json.dump(info, f, indent=2)
    log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
