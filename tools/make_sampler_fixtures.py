#!/usr/bin/env python3
"""Step-by-step oracle fixtures for the flow-matching samplers (src/sampler, spec §7).

Each case runs a sampler of the installed `diffusers` package (UniPCMultistepScheduler with
use_flow_sigmas / flow_prediction, DPMSolverMultistepScheduler dpmsolver++ 2M midpoint,
FlowMatchEulerDiscreteScheduler) on CPU float32 tensors, fed by a fixed fake two-expert "model" with
classifier-free guidance, and records every step. The sigma schedules are computed here from the
formulas of spec §7.2 / §7.4 / §7.6 with numpy (independently of the C++ code) and, where diffusers
can build the same schedule itself, checked against it:
  official UniPC / Euler: sigma_max = float32(1 - 1/1000) (the training grid), linspace(sigma_max, 0,
      N+1)[:N] in float64, shift s*x/(1+(s-1)x); diffusers' UniPC applies the identical shift to
      custom sigmas, so its set_timesteps(sigmas=grid) must reproduce it exactly;
  official DPM++: linspace(1, 0, N+1)[:N], shifted (get_sampling_sigmas), final 0; written into the
      diffusers DPM scheduler after set_timesteps (its own flow grid differs);
  diffusers: UniPCMultistepScheduler.set_timesteps(N) with use_flow_sigmas and flow_shift (the
      1e-6 adjustment of sigma_0 included), also recomputed here with numpy and compared.
The schedulers start at step 0 through set_begin_index(0) (the pipelines' index lookup by value
would do the same for every schedule used here).

Output, per case <name>: <name>.json (metadata: solver, schedule, steps, shift, boundary, guide
scales, element count, sigmas as float32 bit patterns, timesteps, per-step expert and guide scale)
and <name>.bin (little-endian float32: x_0 [n], then for each step i: v_cond_i, v_uncond_i, v_i (CFG
combined), x_{i+1}, each [n]).

Usage: make_sampler_fixtures.py [--out DIR]   (default: tests/fixtures/sampler next to this tool)
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
import diffusers
from diffusers import (DPMSolverMultistepScheduler, FlowMatchEulerDiscreteScheduler,
                       UniPCMultistepScheduler)

NUM_TRAIN = 1000
# Latent stand-in: [B, C, T, H, W] (the diffusers solvers stack history along dim 1, so >= 2-D).
SHAPE = (1, 4, 2, 3, 5)

# name, solver, schedule, steps, shift, boundary (None = single model), guide (low, high), seed
CASES = [
    ("unipc_official_t2v_n10", "unipc", "official", 10, 12.0, 0.875, (3.0, 4.0), 1),
    ("unipc_official_t2v_n40", "unipc", "official", 40, 12.0, 0.875, (3.0, 4.0), 2),
    ("unipc_official_i2v_n40", "unipc", "official", 40, 5.0, 0.900, (3.5, 3.5), 3),
    ("unipc_official_ti2v_n10", "unipc", "official", 10, 5.0, None, (5.0, 5.0), 4),
    ("unipc_official_ti2v_n50", "unipc", "official", 50, 5.0, None, (5.0, 5.0), 16),
    ("unipc_official_n1", "unipc", "official", 1, 5.0, None, (5.0, 5.0), 5),
    ("unipc_official_n2", "unipc", "official", 2, 5.0, 0.875, (3.0, 4.0), 6),
    ("unipc_official_n3", "unipc", "official", 3, 12.0, 0.875, (3.0, 4.0), 7),
    ("unipc_diffusers_n10", "unipc", "diffusers", 10, 3.0, 0.875, (3.0, 4.0), 8),
    ("unipc_diffusers_n40", "unipc", "diffusers", 40, 3.0, 0.875, (3.0, 4.0), 9),
    ("dpmpp_official_n10", "dpm++", "official", 10, 12.0, 0.875, (3.0, 4.0), 10),
    ("dpmpp_official_n40", "dpm++", "official", 40, 5.0, 0.900, (3.5, 3.5), 11),
    ("dpmpp_official_n2", "dpm++", "official", 2, 5.0, None, (5.0, 5.0), 12),
    ("dpmpp_diffusers_n10", "dpm++", "diffusers", 10, 3.0, 0.875, (3.0, 4.0), 13),
    ("euler_official_n10", "euler", "official", 10, 12.0, 0.875, (3.0, 4.0), 14),
    ("euler_diffusers_n40", "euler", "diffusers", 40, 5.0, 0.900, (3.5, 3.5), 15),
]


def shift_sigmas(s, shift):
    return shift * s / (1 + (shift - 1) * s)


def official_schedule(solver, steps, shift):
    """float64 sigmas [steps] before the float32 cast (spec §7.2 / §7.4)."""
    if solver == "dpm++":
        grid = np.linspace(1, 0, steps + 1)[:steps]
        # The scheduler's own shift is 1 (s*x/(1+0*x) == x exactly): the sigmas are shifted once.
        return shift_sigmas(grid, shift)
    # Training grid of the official scheduler (shift 1), stored as float32: its first and last
    # entries bound the inference grid.
    alphas = np.linspace(1, 1 / NUM_TRAIN, NUM_TRAIN)[::-1].copy()
    train = torch.from_numpy(1.0 - alphas).to(torch.float32)
    sigma_max, sigma_min = train[0].item(), train[-1].item()
    grid = np.linspace(sigma_max, sigma_min, steps + 1).copy()[:-1]
    return shift_sigmas(grid, shift)


def diffusers_schedule(steps, shift):
    grid = np.linspace(1, 1 / NUM_TRAIN, steps + 1)[:-1]
    s = shift_sigmas(grid, shift)
    if abs(s[0] - 1) < 1e-6:
        s[0] -= 1e-6
    return s


def unipc(shift):
    return UniPCMultistepScheduler(num_train_timesteps=NUM_TRAIN, solver_order=2,
                                   prediction_type="flow_prediction", use_flow_sigmas=True,
                                   flow_shift=shift, predict_x0=True, solver_type="bh2",
                                   lower_order_final=True, final_sigmas_type="zero")


def make_scheduler(solver, schedule, steps, shift):
    if schedule == "official":
        s64 = official_schedule(solver, steps, shift)
    else:
        s64 = diffusers_schedule(steps, shift)
    sigmas = np.concatenate([s64, [0.0]]).astype(np.float32)
    timesteps = (s64 * NUM_TRAIN).astype(np.int64)  # truncation toward zero, as torch .to(int64)

    if solver == "unipc":
        sch = unipc(shift)
        if schedule == "official":
            grid = official_schedule("unipc", steps, 1.0)  # unshifted: diffusers applies flow_shift
            sch.set_timesteps(sigmas=grid)
        else:
            sch.set_timesteps(steps)
        # diffusers builds this schedule itself: it must agree with the formula bit for bit.
        assert np.array_equal(sch.sigmas.numpy(), sigmas), (schedule, sch.sigmas, sigmas)
        assert np.array_equal(sch.timesteps.numpy(), timesteps), (schedule, sch.timesteps, timesteps)
    elif solver == "dpm++":
        sch = DPMSolverMultistepScheduler(num_train_timesteps=NUM_TRAIN, solver_order=2,
                                          prediction_type="flow_prediction",
                                          algorithm_type="dpmsolver++", solver_type="midpoint",
                                          lower_order_final=True, euler_at_final=False,
                                          final_sigmas_type="zero", use_flow_sigmas=True,
                                          flow_shift=1.0)
        sch.set_timesteps(steps)
        sch.sigmas = torch.from_numpy(sigmas.copy())
        sch.timesteps = torch.from_numpy(timesteps.copy())
    elif solver == "euler":
        sch = FlowMatchEulerDiscreteScheduler(num_train_timesteps=NUM_TRAIN, shift=1.0)
        sch.set_timesteps(steps)
        sch.sigmas = torch.from_numpy(sigmas.copy())
        sch.timesteps = torch.from_numpy(timesteps.astype(np.float32))
    else:
        raise ValueError(solver)
    sch.set_begin_index(0)
    return sch, sigmas, timesteps


def run_case(name, solver, schedule, steps, shift, boundary, guide, seed, out_dir):
    sch, sigmas, timesteps = make_scheduler(solver, schedule, steps, shift)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(SHAPE, generator=gen, dtype=torch.float32)
    # Fixed fake experts: a linear response to x plus a per-step random field, different for the
    # conditional / unconditional pass and for the high / low-noise expert.
    a = {(e, c): torch.rand(SHAPE, generator=gen) * 1.5 - 0.5 for e in (0, 1) for c in (0, 1)}
    blobs = [x.numpy().ravel()]
    experts, guides = [], []
    for i in range(steps):
        t = int(timesteps[i])
        high = boundary is None or t >= boundary * NUM_TRAIN
        g = guide[1] if high else guide[0]
        e = 0 if high else 1
        v_c = a[(e, 0)] * x + torch.randn(SHAPE, generator=gen)
        v_u = a[(e, 1)] * x + torch.randn(SHAPE, generator=gen)
        v = v_u + g * (v_c - v_u)
        ts = torch.tensor(float(t)) if solver == "euler" else torch.tensor(t)
        x = sch.step(v, ts, x, return_dict=False)[0]
        assert x.dtype == torch.float32
        blobs += [v_c.numpy().ravel(), v_u.numpy().ravel(), v.numpy().ravel(), x.numpy().ravel()]
        experts.append("high" if high else "low")
        guides.append(g)
    assert np.all(np.isfinite(x.numpy())), name
    meta = {
        "name": name, "solver": solver, "schedule": schedule, "steps": steps, "shift": shift,
        "boundary": boundary, "guide_low": guide[0], "guide_high": guide[1],
        "num_train_timesteps": NUM_TRAIN, "n": int(np.prod(SHAPE)), "shape": list(SHAPE),
        "sigmas_bits": [int(b) for b in sigmas.view(np.uint32)],
        "timesteps": [int(t) for t in timesteps],
        "experts": experts, "guides": guides,
        "generator": f"tools/make_sampler_fixtures.py, diffusers {diffusers.__version__}, "
                     f"torch {torch.__version__}, numpy {np.__version__}",
    }
    with open(os.path.join(out_dir, name + ".json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    with open(os.path.join(out_dir, name + ".bin"), "wb") as f:
        f.write(np.concatenate(blobs).astype("<f4").tobytes())


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "sampler"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)
    for case in CASES:
        run_case(*case, args.out)
    print(f"wrote {len(CASES)} sampler fixtures to {os.path.normpath(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
