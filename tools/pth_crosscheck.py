#!/usr/bin/env python3
"""PyTorch oracle for the .pth reader/writer tests (tests/cpu/test_pth.cpp).

make <dir> <seed>
    Writes torch.save files of fresh random tensors into <dir>, each with <stem>.json (manifest
    {name: {dtype, shape, offset, nbytes}}) and <stem>.bin (the contiguous bytes of every tensor
    at its offset): mixed.pth (every dtype, a transposed view, a strided view with an offset,
    two tensors sharing one storage, a 0-dim and an empty tensor, a Parameter), proto4.pth (the
    same with pickle_protocol=4), nested.pth
    ({"model": module.state_dict(), "ema": {...}, "step": 3, ...}), pyzip.pth (mixed.pth re-zipped
    by Python's zipfile under another top folder, data unaligned), deflated.pth (same, compressed)
    and legacy.pth (torch<1.6 format). Only the manifests are written for the last two.
check <pth> <manifest.json> <raw.bin> [<pth> <manifest.json> <raw.bin> ...]
    Loads each <pth> with torch.load(weights_only=True) and with mmap=True and compares names, dtypes,
    shapes and bytes against the manifest/raw dump written by the C++ test; also checks every zip
    entry's CRC-32 (zipfile.testzip) and that tensor records start 64-byte aligned.
Exit status 0 when everything matches; messages on stderr otherwise.
"""
import collections
import json
import os
import struct
import sys
import zipfile

import torch

DTYPES = {
    torch.float32: "F32", torch.float64: "F64", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2", torch.int64: "I64",
    torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
}


def raw_bytes(t):
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def dump(flat, stem, out_dir):
    manifest, blob = {}, bytearray()
    for name, t in flat.items():
        b = raw_bytes(t)
        manifest[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "offset": len(blob), "nbytes": len(b)}
        blob += b
    with open(os.path.join(out_dir, stem + ".json"), "w") as f:
        json.dump(manifest, f)
    with open(os.path.join(out_dir, stem + ".bin"), "wb") as f:
        f.write(blob)


def flatten(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, torch.Tensor):
            out[prefix + str(k)] = v
        elif isinstance(v, dict):
            out.update(flatten(v, prefix + str(k) + "."))
    return out


def make(out_dir, seed):
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g)

    def randint(lo, hi, shape, dtype):
        return torch.randint(lo, hi, shape, generator=g, dtype=dtype)

    base = randn(4, 6)
    shared = randn(20)
    sd = collections.OrderedDict()
    sd["f32"] = randn(3, 5)
    sd["f64"] = randn(7).double()
    sd["f16"] = randn(2, 3, 4).half()
    sd["bf16"] = randn(5, 3).bfloat16()
    sd["f8e4m3"] = (randn(4, 8) * 8).to(torch.float8_e4m3fn)
    sd["f8e5m2"] = (randn(9) * 100).to(torch.float8_e5m2)
    sd["i64"] = randint(-2**40, 2**40, (6,), torch.int64)
    sd["i32"] = randint(-2**30, 2**30, (2, 2), torch.int32)
    sd["i16"] = randint(-30000, 30000, (3,), torch.int16)
    sd["i8"] = randint(-128, 128, (5,), torch.int8)
    sd["u8"] = randint(0, 256, (4, 2), torch.uint8)
    sd["bool"] = randint(0, 2, (7,), torch.uint8).bool()
    sd["scalar"] = randn(())
    sd["empty"] = randn(0, 4)
    sd["base"] = base
    sd["base_t"] = base.t()                      # non-contiguous, shares base's storage
    sd["window"] = base[1:, 2:5]                 # strided view with a storage offset
    sd["share_a"] = shared[2:8].view(2, 3)       # contiguous views at offsets into one storage
    sd["share_b"] = shared[10:18].view(4, 2)
    sd["param"] = torch.nn.Parameter(randn(3, 3))
    sd["big5d"] = randn(2, 1, 3, 2, 2)
    sd["bf16_t"] = randn(3, 4).bfloat16().t()    # 2-byte elements gathered
    torch.save(sd, os.path.join(out_dir, "mixed.pth"))
    dump(sd, "mixed", out_dir)
    # Protocol 4 brings FRAME, MEMOIZE, SHORT_BINUNICODE and STACK_GLOBAL.
    torch.save(sd, os.path.join(out_dir, "proto4.pth"), pickle_protocol=4)
    dump(sd, "proto4", out_dir)

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(randn(*p.shape))
    nested = {
        "model": model.state_dict(),             # carries _metadata (pickled via BUILD)
        "ema": {"inner": {"w": randn(2, 2)}, "decay": 0.999},
        "step": 3,
        "name": "run",
        "hist": [1, 2, 3],
    }
    torch.save(nested, os.path.join(out_dir, "nested.pth"))
    dump(flatten(nested), "nested", out_dir)

    # The same records under another top folder, written by Python's zipfile (no alignment padding,
    # no ZIP64 records), and once more compressed.
    src = zipfile.ZipFile(os.path.join(out_dir, "mixed.pth"))
    for stem, method in (("pyzip", zipfile.ZIP_STORED), ("deflated", zipfile.ZIP_DEFLATED)):
        with zipfile.ZipFile(os.path.join(out_dir, stem + ".pth"), "w", method) as dst:
            for info in src.infolist():
                dst.writestr("custom_top/" + info.filename.split("/", 1)[1], src.read(info))
    dump(sd, "pyzip", out_dir)

    torch.save(sd, os.path.join(out_dir, "legacy.pth"), _use_new_zipfile_serialization=False)


def check(pth, manifest_path, raw_path):
    with open(manifest_path) as f:
        manifest = json.load(f)
    with open(raw_path, "rb") as f:
        raw = f.read()
    errors = []
    with zipfile.ZipFile(pth) as z:
        bad = z.testzip()
        if bad is not None:
            errors.append(f"CRC-32 mismatch in entry {bad}")
        with open(pth, "rb") as f:
            for info in z.infolist():
                if "/data/" not in info.filename:
                    continue
                f.seek(info.header_offset)
                hdr = f.read(30)
                name_len, extra_len = struct.unpack("<HH", hdr[26:30])
                start = info.header_offset + 30 + name_len + extra_len
                if start % 64:
                    errors.append(f"{info.filename}: data starts at {start}, not 64-byte aligned")
    for mmap in (False, True):
        sd = torch.load(pth, weights_only=True, mmap=mmap)
        flat = flatten(sd)
        if list(flat) != list(manifest):
            errors.append(f"mmap={mmap}: names differ: {list(flat)[:5]}... vs {list(manifest)[:5]}...")
            continue
        for name, m in manifest.items():
            t = flat[name]
            if DTYPES.get(t.dtype) != m["dtype"] or list(t.shape) != m["shape"]:
                errors.append(f"mmap={mmap}: {name}: {t.dtype} {list(t.shape)} vs {m['dtype']} {m['shape']}")
            elif raw_bytes(t) != raw[m["offset"]:m["offset"] + m["nbytes"]]:
                errors.append(f"mmap={mmap}: {name}: bytes differ")
    for e in errors:
        print(f"{pth}: {e}", file=sys.stderr)
    if not errors:
        print(f"{pth}: ok: {len(manifest)} tensors match (torch {torch.__version__})")
    return 1 if errors else 0


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "make":
        make(sys.argv[2], int(sys.argv[3]))
        return 0
    if len(sys.argv) >= 5 and len(sys.argv) % 3 == 2 and sys.argv[1] == "check":
        args = sys.argv[2:]
        return max(check(*args[i:i + 3]) for i in range(0, len(args), 3))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
