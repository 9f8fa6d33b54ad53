#!/usr/bin/env python3
"""Baseline for `wan bench-vae` (issue 4 item 6, issue 23 items 6-7): the official Wan 2.1 / Wan 2.2 VAE
decode (or, with --encode, encode) in fp32, as diffusers' AutoencoderKLWan (the project's oracle for the
official code) runs it, timed on the same GPU in the same run.

Model: AutoencoderKLWan with the --vae config, written out below. Wan 2.1: base_dim 96, z_dim 16,
dim_mult [1, 2, 4, 4], 2 residual blocks, temperal_downsample [False, True, True] (the constructor's
defaults). Wan 2.2: base_dim 160, decoder_base_dim 256, z_dim 48, is_residual, patch_size 2, 12 in/out
channels, spatial factor 16. Random weights (PyTorch's default init, drawn on the GPU), fp32 parameters:
the official code runs its VAE in fp32. The whole VAE (encoder and decoder) is resident, as in the
official WanVAE / Wan2_2_VAE.

Decode input: one latent [1, z, T, H/sf, W/sf] fp32 ~ N(0, 1), T = (frames - 1)/4 + 1. vae.decode(z) runs
post_quant_conv, the decoder one latent frame at a time with the causal feature cache (the official
chunking; outputs concatenated with torch.cat as the official code does), Wan 2.2's unpatchify, the clamp.

Encode input (--encode): one video [1, 3, F, H, W] fp32 whose frame 0 is an image uniform in [-1, 1) and
whose other frames are zero: Wan 2.1's I2V conditioning video (default 81 frames at 1280x720) or Wan 2.2
TI2V's single image (default 1 frame at 1280x704). vae.encode(x) runs Wan 2.2's patchify, the encoder in
chunks of 1, 4, 4, ... frames with the feature cache, quant_conv; the timed op then takes the posterior
mean and normalises it with latents_mean / latents_std as the pipelines do (the engine's encode output;
Wan 2.2's 48 values are placeholders 0 / 1 here: they do not change the time).

Timing: torch.cuda.Event around the op under no_grad, median of --reps after --warmup untimed ones.
PyTorch's defaults are left as they are: cudnn.benchmark off, cudnn.allow_tf32 on (so the fp32
convolutions run in TF32 on Ampere and later, as the official code does when run as is), matmul TF32 off;
the JSON records them.

Memory: torch.cuda.max_memory_allocated and max_memory_reserved over the whole run (statistics reset
before the model is built: weights, input, the op and its output), and the device-wide used bytes
(torch.cuda.mem_get_info: total - free) after the run minus before the model existed, which also counts
the CUDA libraries' own memory and loaded kernels (the same measure as the engine's cudaMemGetInfo peak;
the caching allocator never returns memory during the run, so the end value is the peak).

A CPU smoke run (--device cpu, a tiny --size) checks the script; its times are wall clock.
"""
import argparse
import json
import statistics
import sys
import time

import torch

CONFIGS = {
    "wan2.1": dict(
        base_dim=96,
        z_dim=16,
        dim_mult=[1, 2, 4, 4],
        num_res_blocks=2,
        attn_scales=[],
        temperal_downsample=[False, True, True],
        dropout=0.0,
    ),
    "wan2.2": dict(
        base_dim=160,
        decoder_base_dim=256,
        z_dim=48,
        dim_mult=[1, 2, 4, 4],
        num_res_blocks=2,
        attn_scales=[],
        temperal_downsample=[False, True, True],
        dropout=0.0,
        is_residual=True,
        in_channels=12,
        out_channels=12,
        patch_size=2,
        scale_factor_temporal=4,
        scale_factor_spatial=16,
        latents_mean=[0.0] * 48,
        latents_std=[1.0] * 48,
    ),
}
# Per VAE and direction: (size, frames), the released models' cases.
DEFAULTS = {
    ("wan2.1", False): ("1280x720", 81),
    ("wan2.1", True): ("1280x720", 81),
    ("wan2.2", False): ("1280x704", 121),
    ("wan2.2", True): ("1280x704", 1),
}


def log(*a):
    print("[diffusers vae]", *a, flush=True)


def parse_size(s):
    w, h = s.lower().replace("*", "x").split("x")
    return int(w), int(h)


def used_bytes():
    free, total = torch.cuda.mem_get_info()
    return total - free


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vae", default="wan2.1", choices=sorted(CONFIGS))
    ap.add_argument("--encode", action="store_true", help="time the encoder (posterior mean) instead of the decoder")
    ap.add_argument("--size", default=None, help="WxH; default 1280x720, wan2.2 1280x704")
    ap.add_argument("--frames", type=int, default=None, help="4n+1; default 81, wan2.2 121 (--encode: 1)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="fp32: the reference's VAE dtype")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--deadline", type=float, default=0, help="unix time after which no new timed run starts")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    size, frames = DEFAULTS[(args.vae, args.encode)]
    args.size = args.size or size
    args.frames = args.frames if args.frames is not None else frames
    return args


def make_input(args, cfg, W, H, T, dtype, dev):
    """The decode latent or the encode video (frame 0 an image in [-1, 1), the rest zero)."""
    sf = cfg.get("scale_factor_spatial", 8)
    g = torch.Generator(device=dev).manual_seed(args.seed + 1)
    if not args.encode:
        return torch.randn(1, cfg["z_dim"], T, H // sf, W // sf, device=dev, dtype=dtype, generator=g)
    x = torch.zeros(1, 3, args.frames, H, W, device=dev, dtype=dtype)
    x[:, :, 0] = torch.rand(1, 3, H, W, device=dev, dtype=dtype, generator=g) * 2 - 1
    return x


def timed_runs(args, op, cuda, info):
    """--warmup untimed runs, then --reps timed ones (CUDA events, or wall clock on the CPU)."""
    t0 = time.time()
    out = None
    for _ in range(args.warmup):
        out = op()
    if cuda:
        torch.cuda.synchronize()
    info["warmup_s"] = time.time() - t0
    ms = []
    what = "encode" if args.encode else "decode"
    for i in range(args.reps):
        if ms and args.deadline > 0 and time.time() + max(ms) / 1e3 * 1.2 > args.deadline:
            log(f"deadline: stopping after {len(ms)} timed {what}(s)")
            info["stopped_early"] = f"deadline after {len(ms)} of {args.reps} timed {what}s"
            break
        if cuda:
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            out = op()
            b.record()
            b.synchronize()
            ms.append(a.elapsed_time(b))
        else:
            t1 = time.perf_counter()
            out = op()
            ms.append((time.perf_counter() - t1) * 1e3)
        log(f"{what} {i + 1}: {ms[-1] / 1e3:.3f} s")
        info.update({f"{what}_ms": ms, "median_s": statistics.median(ms) / 1e3, "min_s": min(ms) / 1e3})
    info["reps"] = len(ms)
    return out


def main():
    args = parse_args()
    cfg = CONFIGS[args.vae]
    sf = cfg.get("scale_factor_spatial", 8)
    W, H = parse_size(args.size)
    if W % sf or H % sf or (args.frames - 1) % 4:
        sys.exit(f"--size {args.size} / --frames {args.frames}: need multiples of {sf} and 4n+1 frames")
    T = (args.frames - 1) // 4 + 1
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    dev = torch.device(args.device)
    what = "encode" if args.encode else "decode"

    import diffusers
    from diffusers import AutoencoderKLWan

    cuda = dev.type == "cuda"
    latent = [1, cfg["z_dim"], T, H // sf, W // sf]
    info = dict(
        tool=f"diffusers AutoencoderKLWan.{what}",
        vae=args.vae,
        op=what,
        torch=torch.__version__,
        diffusers=diffusers.__version__,
        config=cfg,
        dtype=args.dtype,
        size=[W, H],
        frames=args.frames,
        latent=latent,
        video=[1, 3, 1 + 4 * (T - 1), H, W],
        input="video: frame 0 uniform in [-1, 1), the other frames zero; output: normalised posterior mean"
        if args.encode
        else "latent ~ N(0, 1); output: the clamped video",
        warmup=args.warmup,
        method=f"torch.cuda.Event around vae.{what} (no_grad), median of reps after warm-up; memory: "
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
        f"{args.vae} {what}, {args.dtype}, {W}x{H}, {args.frames} frames, latent {latent}")

    t0 = time.time()
    torch.manual_seed(args.seed)
    with dev:
        vae = AutoencoderKLWan(**cfg)
    if dtype != torch.float32:  # (it is built in fp32)
        vae = vae.to(dtype=dtype)
    vae = vae.eval().requires_grad_(False)
    model_bytes = sum(p.numel() * p.element_size() for p in vae.parameters())
    x = make_input(args, cfg, W, H, T, dtype, dev)
    mean = torch.tensor(cfg.get("latents_mean", vae.config.latents_mean), device=dev, dtype=dtype)
    inv_std = 1.0 / torch.tensor(cfg.get("latents_std", vae.config.latents_std), device=dev, dtype=dtype)
    mean, inv_std = mean.view(1, -1, 1, 1, 1), inv_std.view(1, -1, 1, 1, 1)
    info["build_s"] = time.time() - t0
    info["model_bytes"] = model_bytes

    def op():
        with torch.no_grad():
            if args.encode:
                return (vae.encode(x, return_dict=False)[0].mean - mean) * inv_std
            return vae.decode(x, return_dict=False)[0]

    out = timed_runs(args, op, cuda, info)
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
            latent_video_bytes=(x.numel() + out.numel()) * out.element_size(),
        )
        m = info["memory"]
        gib = 1024.0**3
        log(f"{what}: median {info['median_s']:.3f} s, min {info['min_s']:.3f} s ({info['reps']} timed after "
            f"{args.warmup} warm-up); peak allocated {m['max_allocated_bytes'] / gib:.2f} GiB, reserved "
            f"{m['max_reserved_bytes'] / gib:.2f} GiB, device used {m['device_used_peak_bytes'] / gib:.2f} GiB "
            f"(model {model_bytes / 2**20:.1f} MiB)")
    else:
        log(f"{what}: median {info['median_s']:.3f} s ({info['reps']} timed after {args.warmup} warm-up; wall clock "
            f"on {dev}); output {info['output_shape']}")
    with open(args.json, "w") as f:
        json.dump(info, f, indent=2)
    log(f"wrote {args.json}")
    return 0 if info["output_finite"] else 1


if __name__ == "__main__":
    sys.exit(main())
