#!/usr/bin/env python3
"""Step-by-step oracle fixtures for the few-step distilled samplers (src/sampler, presets.h).

Each case re-implements a reference's sampling loop from its code, with the same torch float32
operations in the same order, on CPU tensors fed by a fixed fake two-expert "model" (guidance 1: the
conditional output only, as both recipes run without CFG), and records every step:
  lightning: Wan2.2-Lightning (ModelTC/Wan2.2-Lightning) wan/utils/fm_solvers_euler.py
      EulerScheduler: t = float32(np.linspace(T, 0, N+1)); sigma = t / T; sigma = shift * sigma /
      (1 + (shift - 1) * sigma); the DiT gets t = sigma * T (float32); the loop of
      wan/text2video.py runs timesteps[:-1] with step x + (sigma_next - sigma) * v; the expert is
      high while t.item() >= boundary * T.
  lightx2v: LightX2V (ModelTC/LightX2V) lightx2v/models/schedulers/wan/step_distill/scheduler.py
      Wan22StepDistillScheduler: grid = shift(torch.linspace(1, 0, T+1)[:-1]); sigma_i = grid[T -
      t_i], DiT t = grid[T - t_i] * T; step_post: x - v * sigma (.item()), + v * sigma_next except
      at the last step; the expert is high while step_index < boundary_step_index
      (wan_distill_runner.py). With bf16 (its default DTYPE=BF16, SENSITIVE_LAYER_DTYPE=None)
      BaseScheduler.step_pre casts the latent to bf16 and step_post writes back in bf16.
Also lightx2v_grid.json: the whole float32 grid (sigma and DiT t bits, index k = T - t) at two
shifts, to check the torch.linspace emulation everywhere.

Output, per case <name>: <name>.json (metadata: kind, steps, shift, timesteps given, boundary,
boundary_step_index, bf16, element count, sigmas and DiT t as float32 bit patterns, integer t,
per-step expert) and <name>.bin (little-endian float32: x_0 [n], then per step i: v_i, x_{i+1}).

Usage: make_distill_fixtures.py [--out DIR]   (default: tests/fixtures/sampler next to this tool)
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

T = 1000
SHAPE = (1, 4, 2, 3, 5)

# name, kind, steps or timestep list, shift, boundary (lightning) / boundary_step_index (lightx2v),
# bf16, seed. "boundary" in the JSON is the value the C++ ExpertSchedule must split with (for
# lightx2v: one that reproduces boundary_step_index on that list, or null when none is claimed).
CASES = [
    ("distill_lightning_t2v_n4", "lightning", 4, 5.0, 0.875, False, 1),
    ("distill_lightning_i2v_n4", "lightning", 4, 5.0, 0.900, False, 2),
    ("distill_lightning_n7_s3", "lightning", 7, 3.0, 0.875, False, 3),
    ("distill_lightx2v_4step", "lightx2v", [1000, 750, 500, 250], 5.0, 2, False, 4),
    ("distill_lightx2v_4step_bf16", "lightx2v", [1000, 750, 500, 250], 5.0, 2, True, 5),
    ("distill_lightx2v_list7", "lightx2v", [999, 995, 991, 980, 700, 333, 21], 5.1, 3, False, 6),
    ("distill_lightx2v_list7_bf16", "lightx2v", [999, 995, 991, 980, 700, 333, 21], 5.1, 3, True, 7),
]
# The boundary that must give the same split as boundary_step_index 2 on [1000, 750, 500, 250].
LIGHTX2V_EQUIVALENT_BOUNDARY = {2: 0.875}


def lightning_schedule(steps, shift):
    """Wan2.2-Lightning EulerScheduler.set_timesteps + set_shift: sigmas and t, both [steps + 1]."""
    t = torch.from_numpy(np.linspace(T, 0, steps + 1, dtype=np.float32)).to(torch.float32)
    sigmas = t / T
    sigmas = shift * sigmas / (1 + (shift - 1) * sigmas)
    return sigmas, sigmas * T


def lightx2v_grid(shift):
    """LightX2V WanStepDistillScheduler.set_denoising_timesteps before indexing: [T] each."""
    sigmas = torch.linspace(1.0, 0.0, T + 1)[:-1]
    sigmas = shift * sigmas / (1 + (shift - 1) * sigmas)
    return sigmas, sigmas * T


def fake_model(gen):
    """A fixed linear response to x per expert plus a fresh random field per call."""
    a = {e: torch.rand(SHAPE, generator=gen) * 1.5 - 0.5 for e in (0, 1)}
    return lambda x, e: a[e] * x + torch.randn(SHAPE, generator=gen)


def run_lightning(steps, shift, boundary, x, model):
    sigmas, ts = lightning_schedule(steps, shift)
    blobs, experts = [], []
    for i, t in enumerate(ts[:-1].clone()):
        high = t.item() >= boundary * T
        v = model(x, 0 if high else 1)
        sample = x.to(torch.float32)
        x = sample + (sigmas[i + 1] - sigmas[i]) * v
        blobs += [v, x]
        experts.append("high" if high else "low")
    return sigmas, ts[:-1], blobs, experts


def run_lightx2v(step_list, shift, bsi, bf16, x, model):
    grid, grid_t = lightx2v_grid(shift)
    idx = [T - t for t in step_list]
    sigmas, ts = grid[idx], grid_t[idx]
    n = len(step_list)
    latents = x
    blobs, experts = [], []
    for i in range(n):
        if bf16:
            latents = latents.to(torch.bfloat16)  # BaseScheduler.step_pre
        high = i < bsi
        v = model(latents.to(torch.float32), 0 if high else 1)
        sigma = sigmas[i].item()
        out = latents.to(torch.float32) - v * sigma
        if i < n - 1:
            out = out + v * sigmas[i + 1].item()
        latents = out.to(latents.dtype)
        blobs += [v, latents.to(torch.float32)]
        experts.append("high" if high else "low")
    return torch.cat([sigmas, torch.zeros(1)]), ts, blobs, experts


def bits(t):
    return [int(b) for b in t.to(torch.float32).numpy().view(np.uint32)]


def run_case(name, kind, steps, shift, bnd, bf16, seed, out_dir):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(SHAPE, generator=gen, dtype=torch.float32)
    model = fake_model(gen)
    if kind == "lightning":
        sigmas, ts, blobs, experts = run_lightning(steps, shift, bnd, x, model)
        given, boundary, bsi, n = [], bnd, None, steps
    else:
        sigmas, ts, blobs, experts = run_lightx2v(steps, shift, bnd, bf16, x, model)
        given, boundary, bsi, n = steps, None, bnd, len(steps)
        if steps == [1000, 750, 500, 250]:
            boundary = LIGHTX2V_EQUIVALENT_BOUNDARY[bnd]
    assert all(torch.isfinite(b).all() for b in blobs), name
    meta = {
        "name": name, "kind": kind, "steps": n, "shift": shift, "timesteps_given": given,
        "boundary": boundary, "boundary_step_index": bsi, "bf16": bf16, "num_train_timesteps": T,
        "n": int(np.prod(SHAPE)), "shape": list(SHAPE),
        "sigmas_bits": bits(sigmas), "model_t_bits": bits(ts),
        "model_t": [float(t) for t in ts], "timesteps": [int(t) for t in ts.to(torch.int64)],
        "experts": experts,
        "generator": f"tools/make_distill_fixtures.py, torch {torch.__version__}, numpy {np.__version__}",
    }
    with open(os.path.join(out_dir, name + ".json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    data = [x.numpy().ravel()] + [b.numpy().ravel() for b in blobs]
    with open(os.path.join(out_dir, name + ".bin"), "wb") as f:
        f.write(np.concatenate(data).astype("<f4").tobytes())


def write_grid(out_dir):
    grids = {}
    for shift in (5.0, 3.7):
        sigmas, ts = lightx2v_grid(shift)
        grids[str(shift)] = {"shift": shift, "sigmas_bits": bits(sigmas), "model_t_bits": bits(ts)}
    with open(os.path.join(out_dir, "distill_lightx2v_grid.json"), "w") as f:
        json.dump({"num_train_timesteps": T, "grids": list(grids.values()),
                   "generator": f"tools/make_distill_fixtures.py, torch {torch.__version__}"}, f)
        f.write("\n")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "sampler"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)
    for case in CASES:
        run_case(*case, args.out)
    write_grid(args.out)
    print(f"wrote {len(CASES)} distill fixtures and the grid to {os.path.normpath(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
