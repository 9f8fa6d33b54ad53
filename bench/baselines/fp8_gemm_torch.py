"""The FP8 GEMM scheme of `wan bench-gemm` emulated in PyTorch, and torch._scaled_mm as the peer kernel.

For each DiT GEMM shape: x [M, K] ~ N(0, 1) and w [N, K] ~ N(0, 0.02^2) in bf16, bias ~ N(0, 0.1^2);
e4m3 with one scale per row (amax / 448; q = e4m3(x * (448 / amax)), the engine's core/fp8_rows.h),
per token for x and per output channel for w. Reports, on every row_step-th row:
  - rel L2 of the emulated FP8 GEMM (dequantised operands, fp64 matmul) against the fp32 GEMM of the
    unquantised inputs: the scheme's own error, which the engine's kernels should reproduce;
  - rel L2 of torch._scaled_mm (row-wise scales, bf16 out) against the same reference;
and the median time of torch._scaled_mm and of the bf16 torch.matmul (CUDA events); also the time of the
same e4m3 product with one scalar scale per operand (tensor-wise, no bias), the speed the per-row
scaling costs against, and of the row-wise product with use_fast_accum=True (no fp32 promotion of the
tensor cores' partial sums; its rel L2 too, bias added after).
Usage: python bench/baselines/fp8_gemm_torch.py [--m 75600] [--json FILE]
"""
import argparse
import json
import time

import torch

SHAPES = [  # name, M (None: --m), K, N, gelu
    ("self-qkv", None, 5120, 15360, False),
    ("proj", None, 5120, 5120, False),
    ("ffn.0", None, 5120, 13824, True),
    ("ffn.2", None, 13824, 5120, False),
    ("cross-kv", 512, 5120, 5120, False),
]


def quantize_rows(x):
    a = x.float().abs().amax(dim=1, keepdim=True).clamp_min(2.0**-64)
    inv = torch.tensor(448.0, device=x.device) / a
    q = (x.float() * inv).to(torch.float8_e4m3fn)
    return q, (a / 448.0).float()


def median_ms(fn, reps=10, warmup=2):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e))
    return sorted(out)[len(out) // 2]


def rel_l2(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=75600)
    ap.add_argument("--json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for name, m, K, N, gelu in SHAPES:
        M = m or args.m
        x = torch.randn(M, K, device=dev, generator=g).bfloat16()
        w = (torch.randn(N, K, device=dev, generator=g) * 0.02).bfloat16()
        b = (torch.randn(N, device=dev, generator=g) * 0.1).bfloat16()
        act = (lambda t: torch.nn.functional.gelu(t, approximate="tanh")) if gelu else (lambda t: t)
        xq, sx = quantize_rows(x)
        wq, sw = quantize_rows(w)
        step = max(1, M // 1000)
        sel = torch.arange(0, M, step, device=dev)
        ref = act(x[sel].float() @ w.float().t() + b.float())
        emu = act((xq[sel].double() * sx[sel].double()) @ (wq.double() * sw.double()).t() + b.double())
        def fp8_mm():
            return torch._scaled_mm(xq, wq.t(), scale_a=sx, scale_b=sw.t(), bias=b, out_dtype=torch.bfloat16)
        try:
            y = act(fp8_mm()[sel].float())
        except RuntimeError:  # a build whose row-wise _scaled_mm takes no bias: the bias added after
            def fp8_mm():
                return torch._scaled_mm(xq, wq.t(), scale_a=sx, scale_b=sw.t(), out_dtype=torch.bfloat16) + b
            y = act(fp8_mm()[sel].float())
        bf16_mm = lambda: torch.nn.functional.linear(x, w, b)
        one = torch.ones((), device=dev)
        tensorwise_mm = lambda: torch._scaled_mm(xq, wq.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        fast_mm = lambda: torch._scaled_mm(xq, wq.t(), scale_a=sx, scale_b=sw.t(), out_dtype=torch.bfloat16,
                                           use_fast_accum=True)
        flops = 2.0 * M * N * K
        t8, t16, tt = median_ms(fp8_mm), median_ms(bf16_mm), median_ms(tensorwise_mm)
        try:
            y_fast = fast_mm()[sel].float()
            tf, fast_err = median_ms(fast_mm), rel_l2(act(y_fast + b[None].float()), ref)
        except RuntimeError:  # a build without fast accumulation for row-wise scales
            tf, fast_err = float("nan"), float("nan")
        row = {"name": name, "M": M, "K": K, "N": N, "gelu": gelu, "rows_checked": int(sel.numel()),
               "rel_l2_emulation": rel_l2(emu, ref), "rel_l2_scaled_mm": rel_l2(y, ref),
               "scaled_mm_ms": t8, "scaled_mm_tflops": flops / t8 / 1e9, "bf16_ms": t16,
               "bf16_tflops": flops / t16 / 1e9, "tensorwise_ms": tt, "tensorwise_tflops": flops / tt / 1e9,
               "fast_accum_ms": tf, "fast_accum_tflops": flops / tf / 1e9, "rel_l2_fast_accum": fast_err}
        rows.append(row)
        print(f"{name:9s} {M:6d} {K:6d} {N:6d} | emulation relL2 {row['rel_l2_emulation']:.4f} | _scaled_mm relL2 "
              f"{row['rel_l2_scaled_mm']:.4f} {row['scaled_mm_tflops']:7.0f} TF/s | tensor-wise {row['tensorwise_tflops']:6.0f} "
              f"TF/s | fast-accum {row['fast_accum_tflops']:6.0f} TF/s relL2 {fast_err:.4f} | bf16 {row['bf16_tflops']:6.0f} TF/s")
        del x, w, xq, wq
        torch.cuda.empty_cache()
    doc = {"tool": "bench/baselines/fp8_gemm_torch.py", "torch": torch.__version__,
           "device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "m": args.m, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
