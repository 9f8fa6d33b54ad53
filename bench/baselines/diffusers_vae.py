#!/usr/bin/env python3
"""Baseline for `wan bench-vae` (issue 4 item 6): the official Wan 2.1 VAE decode in fp32, as diffusers'
AutoencoderKLWan (the project's oracle for the official code) runs it, timed on the same GPU in the same run.

Model: AutoencoderKLWan with the Wan 2.1 config (base_dim 96, z_dim 16, dim_mult [1, 2, 4, 4], 2 residual
blocks, temperal_downsample [False, True, True]: the constructor's defaults, written out below), random
weights (PyTorch's default init, drawn on the GPU), fp32 parameters: the official code decodes in fp32.
The whole VAE (encoder too) is resident, as in the official WanVAE.

Input: one latent [1, 16, T, H/8, W/8] fp32 ~ N(0, 1), T = (frames - 1)/4 + 1. vae.decode(z) runs
post_quant_conv, the decoder one latent frame at a time with the causal feature cache (the official
chunking; outputs concatenated with torch.cat as the official code does) and the clamp.

Timing: torch.cuda.Event around vae.decode under no_grad, median of --reps after --warmup untimed ones.
PyTorch's defaults are left as they are: cudnn.benchmark off, cudnn.allow_tf32 on (so the fp32
convolutions run in TF32 on Ampere and later, as the official code does when run as is), matmul TF32 off;
the JSON records them.

Memory: torch.cuda.max_memory_allocated and max_memory_reserved over the whole run (statistics reset
before the model is built: weights, latent, decode and output video), and the device-wide used bytes
(torch.cuda.mem_get_info: total - free) after the run minus before the model existed, which also counts
the CUDA libraries' own memory and loaded kernels (the same measure as the engine's cudaMemGetInfo peak;
the caching allocator never returns memory during the run, so the end value is the peak).
"""
import argparse
import json
import statistics
import sys
import time

import torch

CONFIG = dict(
    base_dim=96,
    z_dim=16,
    dim_mult=[1, 2, 4, 4],
    num_res_blocks=2,
    attn_scales=[],
    temperal_downsample=[False, True, True],
    dropout=0.0,
)


def log(*a):
    print("[diffusers vae]", *a, flush=True)


def parse_size(s):
    w, h = s.lower().replace("*", "x").split("x")
    return int(w), int(h)


def used_bytes():
    free, total = torch.cuda.mem_get_info()
    return total - free


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1280x720")
    ap.add_argument("--frames", type=int, default=81)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="fp32: the reference's decode dtype")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--deadline", type=float, default=0, help="unix time after which no new timed decode starts")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    W, H = parse_size(args.size)
    if W % 8 or H % 8 or (args.frames - 1) % 4:
        sys.exit(f"--size {args.size} / --frames {args.frames}: need multiples of 8 and 4n+1 frames")
    T = (args.frames - 1) // 4 + 1
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    dev = torch.device(args.device)

    import diffusers
    from diffusers import AutoencoderKLWan

    cuda = dev.type == "cuda"
    info = dict(
        tool="diffusers AutoencoderKLWan.decode",
        torch=torch.__version__,
        diffusers=diffusers.__version__,
        config=CONFIG,
        dtype=args.dtype,
        size=[W, H],
        frames=args.frames,
        latent=[1, 16, T, H // 8, W // 8],
        warmup=args.warmup,
        method="torch.cuda.Event around vae.decode (no_grad), median of reps after warm-up; memory: "
        "max_memory_allocated / max_memory_reserved since before the model was built, and mem_get_info used "
        "bytes after the run minus before the model",
    )
    if cuda:
        props = torch.cuda.get_device_properties(dev)
        info.update(
            device=props.name,
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),
            cudnn_benchmark=torch.backends.cudnn.benchmark,
            cudnn_allow_tf32=torch.backends.cudnn.allow_tf32,
            matmul_allow_tf32=torch.backends.cuda.matmul.allow_tf32,
        )
        torch.cuda.init()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        used0 = used_bytes()
    log(f"{info.get('device', args.device)}, torch {torch.__version__}, diffusers {diffusers.__version__}, "
        f"{args.dtype}, {W}x{H}, {args.frames} frames <- latent {info['latent']}")

    t0 = time.time()
    torch.manual_seed(args.seed)
    with dev:
        vae = AutoencoderKLWan(**CONFIG)
    if dtype != torch.float32:  # (it is built in fp32)
        vae = vae.to(dtype=dtype)
    vae = vae.eval().requires_grad_(False)
    model_bytes = sum(p.numel() * p.element_size() for p in vae.parameters())
    g = torch.Generator(device=dev).manual_seed(args.seed + 1)
    z = torch.randn(1, 16, T, H // 8, W // 8, device=dev, dtype=dtype, generator=g)
    info["build_s"] = time.time() - t0
    info["model_bytes"] = model_bytes

    def decode():
        with torch.no_grad():
            return vae.decode(z, return_dict=False)[0]

    t0 = time.time()
    for _ in range(args.warmup):
        out = decode()
    if cuda:
        torch.cuda.synchronize()
    info["warmup_s"] = time.time() - t0
    ms = []
    for i in range(args.reps):
        if ms and args.deadline > 0 and time.time() + max(ms) / 1e3 * 1.2 > args.deadline:
            log(f"deadline: stopping after {len(ms)} timed decode(s)")
            info["stopped_early"] = f"deadline after {len(ms)} of {args.reps} timed decodes"
            break
        if cuda:
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            out = decode()
            b.record()
            b.synchronize()
            ms.append(a.elapsed_time(b))
        else:
            t1 = time.perf_counter()
            out = decode()
            ms.append((time.perf_counter() - t1) * 1e3)
        log(f"decode {i + 1}: {ms[-1] / 1e3:.3f} s")
        info.update(decode_ms=ms, median_s=statistics.median(ms) / 1e3, min_s=min(ms) / 1e3)
    info["reps"] = len(ms)
    info["output_shape"] = list(out.shape)
    info["output_finite"] = bool(torch.isfinite(out).all().item())
    info["output_rms"] = float(out.float().pow(2).mean().sqrt().item())
    if cuda:
        torch.cuda.synchronize()
        info["memory"] = dict(
            max_allocated_bytes=torch.cuda.max_memory_allocated(dev),
            max_reserved_bytes=torch.cuda.max_memory_reserved(dev),
            device_used_before_bytes=used0,
            device_used_peak_bytes=used_bytes() - used0,
            model_bytes=model_bytes,
            latent_video_bytes=(z.numel() + out.numel()) * out.element_size(),
        )
        m = info["memory"]
        gib = 1024.0**3
        log(f"median {info['median_s']:.3f} s, min {info['min_s']:.3f} s ({len(ms)} timed after {args.warmup} warm-up); "
            f"peak allocated {m['max_allocated_bytes'] / gib:.2f} GiB, reserved {m['max_reserved_bytes'] / gib:.2f} GiB, "
            f"device used {m['device_used_peak_bytes'] / gib:.2f} GiB (model {model_bytes / 2**20:.1f} MiB)")
    else:
        log(f"median {info['median_s']:.3f} s ({len(ms)} timed after {args.warmup} warm-up; wall clock on {dev})")
    with open(args.json, "w") as f:
        json.dump(info, f, indent=2)
    log(f"wrote {args.json}")
    return 0 if info["output_finite"] else 1


if __name__ == "__main__":
    sys.exit(main())
