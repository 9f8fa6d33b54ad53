#!/usr/bin/env python3
"""Cross-checks our safetensors reader/writer against the reference `safetensors` package.

Used by tests/cpu/test_safetensors.cpp through WAN_PYTHON.

  st_crosscheck.py write <out.safetensors> <expect.json> <seed>
      Writes random tensors of every dtype we support (bf16 and float8 through torch) with
      safetensors.torch.save_file, and an expectation file
      {"metadata": {...}, "tensors": {name: {"dtype": "BF16", "shape": [..], "hex": ".."}}}
      holding each tensor's exact bytes, for the C++ side to compare against what it reads.
  st_crosscheck.py check <in.safetensors> <expect.json>
      Loads a file (written by the C++ side) with safetensors.torch.load_file and compares
      names, dtypes, shapes, bytes and metadata with the expectation file.

Exit status: 0 when everything matches, 1 on any mismatch (each one printed), 2 on bad usage.
"""
import json
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

ST_NAMES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def tensor_bytes(t):
    # reshape(-1) first: view(dtype) refuses 0-dim tensors when element sizes differ.
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def random_tensor(dtype, shape, gen):
    if dtype.is_floating_point:
        scale = 4.0 if dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else 100.0
        return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, generator=gen, dtype=torch.int64).to(dtype)


def cmd_write(out_path, expect_path, seed):
    gen = torch.Generator().manual_seed(seed)
    shapes = [[3, 5], [7], [2, 3, 4], [], [0, 3], [1, 1, 6]]
    tensors = {}
    for i, dtype in enumerate(ST_NAMES):
        shape = shapes[i % len(shapes)]
        tensors[f"blocks.{i}.{ST_NAMES[dtype].lower()}"] = random_tensor(dtype, shape, gen)
    # A larger tensor so that offsets are not all tiny.
    tensors["big.weight"] = random_tensor(torch.bfloat16, [64, 33], gen)
    metadata = {"format": "pt", "producer": "st_crosscheck", "seed": str(seed)}
    save_file(tensors, out_path, metadata=metadata)
    expect = {
        "metadata": metadata,
        "tensors": {
            name: {"dtype": ST_NAMES[t.dtype], "shape": list(t.shape), "hex": tensor_bytes(t).hex()}
            for name, t in tensors.items()
        },
    }
    with open(expect_path, "w") as f:
        json.dump(expect, f)
    return 0


def cmd_check(in_path, expect_path):
    with open(expect_path) as f:
        expect = json.load(f)
    got = load_file(in_path)
    with safe_open(in_path, framework="pt") as f:
        metadata = f.metadata() or {}
    errors = []
    if metadata != expect.get("metadata", {}):
        errors.append(f"metadata {metadata!r} != expected {expect.get('metadata', {})!r}")
    want = expect["tensors"]
    if set(got) != set(want):
        errors.append(f"names differ: only ours {sorted(set(want) - set(got))}, only read {sorted(set(got) - set(want))}")
    for name in sorted(set(got) & set(want)):
        t, w = got[name], want[name]
        if ST_NAMES.get(t.dtype) != w["dtype"]:
            errors.append(f"{name}: dtype {t.dtype} != {w['dtype']}")
            continue
        if list(t.shape) != w["shape"]:
            errors.append(f"{name}: shape {list(t.shape)} != {w['shape']}")
            continue
        if tensor_bytes(t).hex() != w["hex"]:
            errors.append(f"{name}: bytes differ")
    for e in errors:
        print("st_crosscheck: mismatch:", e, file=sys.stderr)
    if not errors:
        print(f"st_crosscheck: {len(got)} tensors match")
    return 1 if errors else 0


def main(argv):
    if len(argv) == 5 and argv[1] == "write":
        return cmd_write(argv[2], argv[3], int(argv[4]))
    if len(argv) == 4 and argv[1] == "check":
        return cmd_check(argv[2], argv[3])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
