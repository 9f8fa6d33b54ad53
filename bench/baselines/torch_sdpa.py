#!/usr/bin/env python3
"""Baseline for `wan bench-attention` (issue 7 item 5): PyTorch's scaled_dot_product_attention on the same
cases, timed on the same GPU in the same device call (bench/run_attention_bench.sh).

Cases (B = 2, H = 40, D = 128, bf16; the names and shapes of src/cli/cmd_bench_attention.cpp):
  self-75600, self-32760, self-75601   self-attention, L = Lq = Lk
  cross-75600x512, cross-32760x512     cross-attention, Lk = 512
  cross-masked-75600x512               cross-attention with key lengths {300, 512}

Layouts. SDPA takes [B, H, L, D] tensors; each case is timed with the inputs laid out several ways, since
SDPA may copy a strided input before its kernel runs (the profile below says whether it did):
  views  self: q/k/v = buf[:, :, i].permute(0, 2, 1, 3) of one fused [B, L, 3, H, D] buffer (the engine's
         layout, token stride 3*H*D); cross: dense q [B, Lq, H, D] and dense k, v [B, Lk, H, D] as
         .transpose(1, 2) views (the engine's layout)
  bshd   self only: separate dense q, k, v [B, L, H, D] as .transpose(1, 2) views (what diffusers passes)
  bhsd   contiguous q, k, v [B, H, L, D] (SDPA's own layout: no copy is ever needed)

Backends: torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION) and (SDPBackend.CUDNN_ATTENTION)
(--backends also takes efficient and math). One backend per context, so a backend that cannot take the
inputs raises instead of falling back to another one; that is recorded as skipped with PyTorch's reason.
The masked case passes a boolean attn_mask [B, 1, 1, Lk] (True: the key takes part), broadcast over heads
and queries; flash cannot take a mask, so it is skipped there without trying.

Timing (as the engine's side): random bf16 ~ N(0, 1) inputs drawn on the GPU; --warmup untimed calls of
each backend, then --reps timed calls interleaved backend by backend (flash, cudnn, flash, ...), each
bracketed by torch.cuda.Event and preceded by an untimed 256 MiB fill on the same stream, so that
Python's dispatch overlaps the GPU work and every call starts with a cold L2; median and min. The timed
call is the whole F.scaled_dot_product_attention call, copies of strided inputs included. TFLOP/s =
4*B*H*Lq*Lk*D / median (masked: the valid keys). One call per (case, layout, backend) is also profiled
(torch.profiler): its CUDA kernels and times, and whether anything besides the attention kernel ran.
Sanity: every backend's output must be finite; the max abs difference between backends on every 37th
query row is reported.

--deadline (unix time): no (case, layout) starts that cannot finish by then (estimated at 400 TFLOP/s);
what is skipped is listed. --tiny shrinks every case (L / 200, H = 4) to check the script itself, e.g.
on the CPU (--device cpu: wall-clock timing, no profile, only the backends the CPU has).
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

B, H, D = 2, 40, 128
CASES = {  # name: (self-attention, Lq, Lk, k_lens or None)
    "self-75600": (True, 75600, 75600, None),
    "self-32760": (True, 32760, 32760, None),
    "self-75601": (True, 75601, 75601, None),
    "cross-75600x512": (False, 75600, 512, None),
    "cross-32760x512": (False, 32760, 512, None),
    "cross-masked-75600x512": (False, 75600, 512, [300, 512]),
}
LAYOUTS = {
    "views": "self: permute views of one fused [B, L, 3, H, D] buffer; cross: dense [B, L, H, D] .transpose(1, 2) "
    "(the engine's layouts)",
    "bshd": "separate dense [B, L, H, D] tensors as .transpose(1, 2) views (diffusers' layout)",
    "bhsd": "contiguous [B, H, L, D] tensors (SDPA's own layout)",
}
FILL_ELEMS = 128 << 20  # 256 MiB of bf16 before every timed call


def log(*a):
    print("[torch sdpa]", *a, flush=True)


def backends_enum():
    from torch.nn.attention import SDPBackend

    return {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }


def make_inputs(self_attn, lq, lk, h, layout, dev, gen):
    """q, k, v as [B, h, L, D] tensors in the given layout (random N(0, 1) bf16, drawn on `dev`)."""
    kw = dict(device=dev, dtype=torch.bfloat16, generator=gen)
    if self_attn and layout == "views":
        buf = torch.randn(B, lq, 3, h, D, **kw)
        return tuple(buf[:, :, i].permute(0, 2, 1, 3) for i in range(3))
    if layout in ("views", "bshd"):
        q = torch.randn(B, lq, h, D, **kw).transpose(1, 2)
        k = torch.randn(B, lk, h, D, **kw).transpose(1, 2)
        v = torch.randn(B, lk, h, D, **kw).transpose(1, 2)
        return q, k, v
    assert layout == "bhsd"
    return (torch.randn(B, h, lq, D, **kw), torch.randn(B, h, lk, D, **kw), torch.randn(B, h, lk, D, **kw))


def short_reason(e):
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return " | ".join(lines)[:600] or type(e).__name__


def profile_call(fn, dev):
    """CUDA kernels of one call: [{name, us}] and the total (None when the profiler is unavailable)."""
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize(dev)
        kernels = []
        for e in prof.events():
            dt = getattr(e, "device_type", None)
            if dt is None or "CUDA" not in str(dt):
                continue
            us = e.device_time_total  # a device event's own elapsed time (us)
            kernels.append({"name": e.name, "us": round(float(us), 2)})
        return kernels
    except Exception as e:  # noqa: BLE001 - the profile is extra information, never a failure
        return {"error": short_reason(e)}


def is_attention_kernel(name):
    n = name.lower()
    return any(s in n for s in ("flash", "fmha", "sdpa", "attention", "attn"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=",".join(CASES), help="comma list (default all): " + ", ".join(CASES))
    ap.add_argument("--backends", default="flash,cudnn", help="comma list of flash, cudnn, efficient, math")
    ap.add_argument("--layouts", default="views,bshd,bhsd", help="comma list of " + ", ".join(LAYOUTS))
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--deadline", type=float, default=0, help="unix time after which no (case, layout) starts")
    ap.add_argument("--no-profile", action="store_true", help="skip the one profiled call per backend")
    ap.add_argument("--tiny", action="store_true", help="check the script: L / 200, H = 4")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()

    def commas(s, valid, what):
        out = [x for x in s.split(",") if x]
        bad = [x for x in out if x not in valid]
        if bad or not out:
            sys.exit(f"--{what}: unknown {bad or '(none given)'}; valid: {', '.join(valid)}")
        return list(dict.fromkeys(out))

    cases = commas(args.cases, CASES, "cases")
    bnames = commas(args.backends, backends_enum(), "backends")
    layouts = commas(args.layouts, LAYOUTS, "layouts")
    if args.reps < 1 or args.warmup < 0:
        sys.exit("--reps must be >= 1 and --warmup >= 0")
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    info = dict(
        tool="torch.nn.functional.scaled_dot_product_attention",
        torch=torch.__version__,
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        commit=os.environ.get("WAN_COMMIT", "unknown"),
        B=B, H=H, D=D, warmup=args.warmup, reps=args.reps, tiny=args.tiny,
        layouts={k: LAYOUTS[k] for k in layouts},
        method="random bf16 N(0,1) inputs on the device; CUDA events around each F.scaled_dot_product_attention call "
        "under sdpa_kernel(<one backend>), each preceded by an untimed 256 MiB fill; warm-up calls, then reps "
        "interleaved backend by backend; median; TFLOP/s = 4*B*H*Lq*Lk*D / median (masked: valid keys)",
        results=[], skipped=[],
    )
    if cuda:
        if not torch.cuda.is_available():
            info["error"] = "no CUDA device visible to torch"
            json.dump(info, open(args.json, "w"), indent=2)
            sys.exit("torch_sdpa.py: no CUDA device is visible to torch (use --device cpu --tiny to check the script)")
        props = torch.cuda.get_device_properties(dev)
        info.update(device=props.name, cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
                    sm=f"{props.major}{props.minor}")
    else:
        info.update(device=str(dev), note="CPU check run: wall-clock times, not a benchmark")
    log(f"{info['device']}, torch {torch.__version__}, cuDNN {info.get('cudnn')}, cases {cases}, layouts {layouts}, "
        f"backends {bnames}, {args.warmup} warm-up + {args.reps} timed")

    be = backends_enum()
    from torch.nn.attention import sdpa_kernel

    fill = torch.empty(FILL_ELEMS if cuda else 1, device=dev, dtype=torch.bfloat16)
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    bad_outputs = []
    for cname in cases:
        self_attn, lq, lk, klens = CASES[cname]
        h = H
        if args.tiny:
            lq, h = max(1, lq // 200), 4
            lk = lq if self_attn else lk
            klens = [min(k, lk) for k in klens] if klens else None
        valid = sum(klens) if klens else B * lk
        flops = 4.0 * h * lq * D * valid
        for layout in layouts:
            if layout == "bshd" and not self_attn:
                continue  # for cross-attention, "views" is already the dense [B, L, H, D] layout
            tag = f"{cname}/{layout}"
            n_calls = (args.warmup + args.reps + 2) * len(bnames)
            est_s = n_calls * flops / 400e12 + 5
            if args.deadline > 0 and time.time() + est_s > args.deadline:
                info["skipped"].append({"case": cname, "layout": layout, "reason": f"deadline ({est_s:.0f} s needed)"})
                log(f"{tag}: skipped, not enough time left ({est_s:.0f} s needed)")
                continue
            q, k, v = make_inputs(self_attn, lq, lk, h, layout, dev, gen)
            mask = None
            if klens:
                mask = torch.arange(lk, device=dev)[None, :] < torch.tensor(klens, device=dev)[:, None]
                mask = mask[:, None, None, :]  # [B, 1, 1, Lk], True = take part
            strides = {n: list(t.stride()) for n, t in zip("qkv", (q, k, v))}

            def call(b):
                with sdpa_kernel([be[b]]):
                    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

            ok, outs = [], {}
            for b in bnames:
                base = dict(case=cname, kind="self" if self_attn else "cross", layout=layout, backend=b, B=B, H=h,
                            D=D, Lq=lq, Lk=lk, k_lens=klens, flops=flops, strides=strides)
                if mask is not None and b == "flash":
                    info["results"].append(dict(base, status="skipped", reason="flash attention takes no attn_mask"))
                    log(f"{tag} {b}: skipped (flash takes no mask)")
                    continue
                try:
                    with torch.no_grad():
                        outs[b] = call(b)
                    if cuda:
                        torch.cuda.synchronize(dev)
                except RuntimeError as e:
                    info["results"].append(dict(base, status="skipped", reason=short_reason(e)))
                    log(f"{tag} {b}: skipped: {short_reason(e)[:200]}")
                    continue
                ok.append((b, base))
            if not ok:
                del q, k, v
                continue
            with torch.no_grad():
                for _ in range(args.warmup):
                    for b, _base in ok:
                        call(b)
                if cuda:
                    torch.cuda.synchronize(dev)
                times = {b: dict(ms=[], enqueue_us=[], fill_ms=[]) for b, _ in ok}
                for _ in range(args.reps):
                    for b, _base in ok:
                        t = times[b]
                        if cuda:
                            e_fill, e0, e1 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
                            with sdpa_kernel([be[b]]):
                                e_fill.record()
                                fill.normal_()
                                e0.record()
                                h0 = time.perf_counter()
                                F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                                t["enqueue_us"].append((time.perf_counter() - h0) * 1e6)
                                e1.record()
                            e1.synchronize()
                            t["ms"].append(e0.elapsed_time(e1))
                            t["fill_ms"].append(e_fill.elapsed_time(e0))
                        else:
                            h0 = time.perf_counter()
                            call(b)
                            t["ms"].append((time.perf_counter() - h0) * 1e3)
                            t["enqueue_us"].append(t["ms"][-1] * 1e3)
                            t["fill_ms"].append(0.0)
            # Sanity: finite outputs; differences between backends on every 37th query row.
            rows = {b: o[:, :, ::37].float() for b, o in outs.items()}
            ref_b = next(iter(rows))
            for b, base in ok:
                t = times[b]
                med, mn = statistics.median(t["ms"]), min(t["ms"])
                finite = bool(torch.isfinite(rows[b]).all().item())
                r = dict(base, status="ok", ms=[round(x, 4) for x in t["ms"]], median_ms=med, min_ms=mn,
                         tflops=flops / (med * 1e9), tflops_at_min=flops / (mn * 1e9),
                         host_enqueue_us_median=statistics.median(t["enqueue_us"]),
                         fill_ms_median=statistics.median(t["fill_ms"]), output_finite=finite,
                         output_stride=list(outs[b].stride()))
                if b != ref_b:
                    r["max_abs_diff_vs_" + ref_b] = float((rows[b] - rows[ref_b]).abs().max().item())
                if not finite:
                    bad_outputs.append(f"{tag} {b}")
                if cuda and not args.no_profile:
                    with torch.no_grad():
                        kern = profile_call(lambda: call(b), dev)
                    r["profile_kernels"] = kern
                    if isinstance(kern, list):
                        extra = [x for x in kern if not is_attention_kernel(x["name"])]
                        r["extra_kernels"] = extra  # copies / transposes SDPA ran besides attention
                        r["attention_kernel_us"] = sum(x["us"] for x in kern if is_attention_kernel(x["name"]))
                if r["host_enqueue_us_median"] * 1e-3 > r["fill_ms_median"] and cuda:
                    r["warning"] = "host enqueue longer than the pre-call fill: the time may include a host gap"
                info["results"].append(r)
                extra_s = ""
                if r.get("extra_kernels"):
                    extra_s = f", +{len(r['extra_kernels'])} non-attention kernel(s) " \
                              f"({sum(x['us'] for x in r['extra_kernels']) / 1e3:.3f} ms)"
                log(f"{tag:32s} {b:9s} median {med:9.3f} ms  min {mn:9.3f} ms  {r['tflops']:7.1f} TFLOP/s{extra_s}")
            del q, k, v, outs, rows
            if cuda:
                torch.cuda.empty_cache()
            with open(args.json, "w") as f:  # after every case: a kill at the time limit keeps what was measured
                json.dump(info, f, indent=2)
    with open(args.json, "w") as f:
        json.dump(info, f, indent=2)
    log(f"wrote {args.json}")
    if bad_outputs:
        log("non-finite outputs: " + ", ".join(bad_outputs))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
