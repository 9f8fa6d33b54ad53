#!/usr/bin/env python3
"""The diffusers side of tests/gpu/test_dit_vs_diffusers.cu (issue 4 item 12, issue 23): loads a DiT written by
`wan make-checkpoint --layout diffusers` (the transformer/ folder) with diffusers' WanTransformer3DModel,
draws fixed random inputs, runs one forward and writes inputs and outputs to one safetensors file for the
engine's forward to be compared against.

Model: WanTransformer3DModel.from_pretrained(folder, torch_dtype=bfloat16), loading checked strict (no
missing, unexpected or mismatched tensors): bf16 parameters except the model's _keep_in_fp32_modules
(upcast from the stored values), diffusers' default attention (PyTorch SDPA). With --fp32-reference the
same stored weights also run in fp32 (matmul TF32 off), as a measure of how far either bf16 forward is
from exact maths.

Inputs (batch 2, two CFG-like samples that differ in everything): x [2, in_channels, T, H, W] ~ N(0, 1)
rounded to bf16 (so both sides see the same values; in_channels from the model's config: 16 T2V, 36 I2V
with the condition channels, 48 TI2V), timesteps [--t0, --t1], or with --t-first0/--t-first1 per token
[2, seq_len]: latent frame 0's tokens (the first (H/2)(W/2)) at --t-firstB, the others at --tB; context [2, 512, text_dim] bf16 ~ 0.2
N(0, 1) with rows >= context_lens[b] zero (the official padding to text_len = 512 that diffusers'
pipeline does too), context_lens [--len0, --len1] (the default 512 and 37: one full, one padded prompt).
Drawn with torch.Generator(--seed) on the CPU.

Output file (--out): x f32, t f32 [2] (t_first f32 [2] with per-token timesteps), context bf16 [2, 512, D], context_lens i64 [2], out_bf16 f32 (the
bf16 forward, as produced: bf16 values), out_fp32 f32 (with --fp32-reference); metadata: versions,
device, attention backend.
Exit status 0 on success; 2 when torch/diffusers cannot run here (the test turns that into a skip), 1 on
anything else (loading not strict, non-finite output).
"""
import argparse
import json
import os
import sys
import time


def log(*a):
    print("[dit_vs_diffusers]", *a, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="diffusers transformer folder (config.json + safetensors)")
    ap.add_argument("--out", help="output .safetensors")
    ap.add_argument("--frames", type=int, default=2, help="latent frames")
    ap.add_argument("--height", type=int, default=30, help="latent height (multiple of 2)")
    ap.add_argument("--width", type=int, default=52, help="latent width (multiple of 2)")
    ap.add_argument("--t0", type=float, default=937.0)
    ap.add_argument("--t1", type=float, default=413.0)
    ap.add_argument("--t-first0", type=float, help="per-token timesteps: sample 0's latent frame 0 at this")
    ap.add_argument("--t-first1", type=float, help="per-token timesteps: sample 1's latent frame 0 at this")
    ap.add_argument("--len0", type=int, default=512)
    ap.add_argument("--len1", type=int, default=37)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--fp32-reference", action="store_true")
    ap.add_argument("--check-only", action="store_true", help="exit 0 if torch + diffusers (+ the device) work")
    args = ap.parse_args()

    try:
        import torch
        import diffusers
        from diffusers import WanTransformer3DModel
        from safetensors.torch import save_file
    except Exception as e:  # noqa: BLE001 (any import failure means: cannot run here)
        log(f"cannot import torch / diffusers / safetensors: {e!r}")
        return 2
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        log("torch sees no CUDA device")
        return 2
    if args.check_only:
        log(f"ok: torch {torch.__version__}, diffusers {diffusers.__version__}")
        return 0
    if not args.model or not args.out:
        ap.error("--model and --out are required")
    per_token = args.t_first0 is not None
    if per_token != (args.t_first1 is not None):
        ap.error("--t-first0 and --t-first1 go together")

    TEXT_LEN = 512
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    t0 = time.time()
    model, info = WanTransformer3DModel.from_pretrained(args.model, torch_dtype=torch.bfloat16,
                                                        output_loading_info=True)
    bad = {k: info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs") if info.get(k)}
    if bad:
        log(f"loading is not strict: {bad}")
        return 1
    model = model.to(dev).eval().requires_grad_(False)
    cfg = model.config
    log(f"loaded {args.model} in {time.time() - t0:.1f} s: dim {cfg.num_attention_heads * cfg.attention_head_dim}, "
        f"{cfg.num_layers} blocks, ffn {cfg.ffn_dim}, text_dim {cfg.text_dim}; "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters")
    dtypes = sorted({str(p.dtype) for p in model.parameters()})

    B, C, T, H, W = 2, cfg.in_channels, args.frames, args.height, args.width
    lens = [args.len0, args.len1]
    if not all(1 <= n <= TEXT_LEN for n in lens):
        log(f"context lengths {lens}: expected 1..{TEXT_LEN}")
        return 1
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randn(B, C, T, H, W, generator=g).to(torch.bfloat16)
    t = torch.tensor([args.t0, args.t1], dtype=torch.float32)
    timestep = t
    if per_token:  # [B, seq_len]: the first patch frame's tokens (latent frame 0 at patch_t 1) at t_first
        p_t, p_h, p_w = cfg.patch_size
        if T % p_t or H % p_h or W % p_w:
            log(f"latent {T} x {H} x {W} is not a multiple of the patch {cfg.patch_size}")
            return 1
        seq_len, first = (T // p_t) * (H // p_h) * (W // p_w), (H // p_h) * (W // p_w)
        t_first = torch.tensor([args.t_first0, args.t_first1], dtype=torch.float32)
        timestep = t[:, None].repeat(1, seq_len)
        timestep[:, :first] = t_first[:, None]
        log(f"per-token timesteps [{B}, {seq_len}]: first {first} tokens at {t_first.tolist()}, rest at {t.tolist()}")
    ctx = torch.zeros(B, TEXT_LEN, cfg.text_dim)
    for b, n in enumerate(lens):
        ctx[b, :n] = 0.2 * torch.randn(n, cfg.text_dim, generator=g)
    ctx = ctx.to(torch.bfloat16)

    def forward(m, dtype):
        with torch.no_grad():
            return m(hidden_states=x.to(dev, dtype), timestep=timestep.to(dev), encoder_hidden_states=ctx.to(dev, dtype),
                     return_dict=False)[0]

    t0 = time.time()
    out_bf16 = forward(model, torch.bfloat16).float().cpu()
    log(f"bf16 forward {list(out_bf16.shape)} in {time.time() - t0:.2f} s (dtypes {dtypes}), "
        f"rms {out_bf16.pow(2).mean().sqrt().item():.4f}")
    tensors = {
        "x": x.float().contiguous(),
        "t": t.contiguous(),
        "context": ctx.contiguous(),
        "context_lens": torch.tensor(lens, dtype=torch.int64),
        "out_bf16": out_bf16.contiguous(),
    }
    if per_token:
        tensors["t_first"] = t_first.contiguous()
    finite = bool(torch.isfinite(out_bf16).all())
    if args.fp32_reference:
        model = model.float()
        t0 = time.time()
        out32 = forward(model, torch.float32).cpu()
        d = (out_bf16 - out32).double()
        rel = (d.pow(2).sum() / out32.double().pow(2).sum()).sqrt().item()
        log(f"fp32 forward in {time.time() - t0:.2f} s; diffusers bf16 vs fp32: rel L2 {rel:.3e}, "
            f"max abs {d.abs().max().item():.3e}")
        tensors["out_fp32"] = out32.contiguous()
        finite = finite and bool(torch.isfinite(out32).all())
    meta = {
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else str(dev),
        "bf16_param_dtypes": json.dumps(dtypes),
        "attention": "diffusers default (PyTorch SDPA)",
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    save_file(tensors, args.out, metadata=meta)
    log(f"wrote {args.out}")
    if not finite:
        log("non-finite output")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
