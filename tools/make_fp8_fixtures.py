#!/usr/bin/env python3
"""Writes tests/fixtures/fp8/quant.safetensors: row-wise e4m3 quantisation computed by PyTorch's own
float8_e4m3fn cast, the oracle of ops::quantize_rows_fp8 (src/ops/fp8_ref.h, scheme in src/core/fp8_rows.h).

For each row of x (float32, or bfloat16 read exactly as float32):
    amax  = max |x|                           (float32, exact)
    a     = max(amax, 2^-64)                  (rows here are never all zero or non-finite)
    inv   = float32(448) / a                  (one float32 division)
    q     = (x * inv).to(torch.float8_e4m3fn) (one float32 multiply, then torch's cast)
    scale = a / float32(448)
Cases "<name>.x" (F32 or BF16 [rows, K]), "<name>.q" (U8 [rows, K], the e4m3 bytes) and "<name>.scale"
(F32 [rows]): gauss (odd K, rows spanning 12 decades), bf16 (bf16 inputs), ties (amax 448, so inv = 1:
exact midpoints between e4m3 codes, normal and subnormal), subnormal (magnitudes 2^-24..1 of the row's
amax: most codes subnormal or zero), outlier (one element 10^4 times the rest), tiny (amax below 2^-64:
the floor). Deterministic (fixed seeds); metadata records the torch version.
Usage: .venv/bin/python tools/make_fp8_fixtures.py [OUT_DIR]   (default: tests/fixtures/fp8)
"""
import os
import sys

import torch
from safetensors.torch import save_file

E4M3_MAX = 448.0
MIN_AMAX = 2.0 ** -64


def quantize(x):
    """q bytes and scales of x [rows, K] (float32 math on x's exact float32 values)."""
    xf = x.to(torch.float32)
    amax = xf.abs().amax(dim=1)
    assert bool((amax > 0).all()) and bool(torch.isfinite(amax).all())
    a = torch.clamp(amax, min=MIN_AMAX)
    inv = torch.tensor(E4M3_MAX, dtype=torch.float32) / a
    v = xf * inv[:, None]
    assert float(v.abs().max()) <= 448.0001
    q = v.to(torch.float8_e4m3fn).view(torch.uint8)
    scale = a / torch.tensor(E4M3_MAX, dtype=torch.float32)
    return q.contiguous(), scale.contiguous()


def ties_rows():
    """amax = 448 -> inv = 1 exactly: every value below is converted as given."""
    s = 2.0 ** -9  # the smallest e4m3 subnormal
    mids = [1.0625, 1.1875, 1.3125, 400.0, 432.0, 416.0, s / 2, 3 * s / 2, 5 * s / 2, 15 * s / 2,
            2.0 ** -7 + 2.0 ** -11, 0.0, 2.0 ** -40, 447.9, 3.0]
    row = [448.0] + mids + [-m for m in mids]
    return torch.tensor([row, [-448.0] + mids[::-1] + [-m for m in mids]], dtype=torch.float32)


def cases():
    g = torch.Generator().manual_seed(2525)
    gauss = torch.randn(6, 67, generator=g)
    gauss *= torch.tensor([10.0 ** e for e in (-6, -2, 0, 1, 3, 6)])[:, None]
    bf16 = (torch.randn(5, 40, generator=g) * 3).to(torch.bfloat16)
    mags = 2.0 ** (-24 * torch.rand(4, 48, generator=g))
    sub = mags * torch.sign(torch.randn(4, 48, generator=g))
    outlier = torch.randn(3, 33, generator=g)
    outlier[0, 5] = 1.0e4
    outlier[1, 32] = -2.5e4
    outlier[2, 0] = 7.0e3
    tiny = torch.randn(2, 24, generator=g) * 1e-25
    return {"gauss": gauss, "bf16": bf16, "ties": ties_rows(), "subnormal": sub, "outlier": outlier,
            "tiny": tiny}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures",
                                                             "fp8")
    os.makedirs(out, exist_ok=True)
    tensors = {}
    for name, x in cases().items():
        q, scale = quantize(x)
        tensors[f"{name}.x"] = x.contiguous()
        tensors[f"{name}.q"] = q
        tensors[f"{name}.scale"] = scale
    path = os.path.join(out, "quant.safetensors")
    save_file(tensors, path, metadata={"torch": torch.__version__, "tool": "tools/make_fp8_fixtures.py"})
    print(f"wrote {path} ({os.path.getsize(path)} bytes, {len(tensors) // 3} cases)")


if __name__ == "__main__":
    main()
