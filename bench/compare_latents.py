"""Relative L2 distance between the "latents" tensors of two `wan generate --save-latents` files.

Usage: python bench/compare_latents.py EXACT.safetensors OTHER.safetensors [--what TEXT] [--json FILE]
Prints {"what", "rel_l2", "max_abs"}: ||other - exact|| / ||exact|| over every element (fp32 or bf16 stored).
Reads safetensors by its documented layout (8-byte little-endian header length, JSON header, raw data),
so it needs only numpy.
"""
import argparse
import json
import struct

import numpy as np


def read_latents(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        meta = header["latents"]
        f.seek(8 + n + meta["data_offsets"][0])
        raw = f.read(meta["data_offsets"][1] - meta["data_offsets"][0])
    if meta["dtype"] == "F32":
        a = np.frombuffer(raw, dtype="<f4")
    elif meta["dtype"] == "BF16":
        a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        raise SystemExit(f"{path}: latents dtype {meta['dtype']} not handled")
    return a.astype(np.float64).reshape(meta["shape"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("exact")
    ap.add_argument("other")
    ap.add_argument("--what", default="final latents vs exact")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    x, y = read_latents(a.exact), read_latents(a.other)
    if x.shape != y.shape:
        raise SystemExit(f"shapes differ: {x.shape} vs {y.shape}")
    res = {"what": a.what, "rel_l2": float(np.linalg.norm(y - x) / np.linalg.norm(x)),
           "max_abs": float(np.abs(y - x).max())}
    print(json.dumps(res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
