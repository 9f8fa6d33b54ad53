#!/usr/bin/env python3
"""GGUF fixtures and oracle for tests/cpu/test_gguf.cpp and tests/gpu/test_gguf_gpu.cu, from the PyPI
`gguf` package (gguf-py, the reference reader/writer and numpy dequantisers of ggml's types).

  make_gguf_fixtures.py make [OUT_DIR]      (default tests/fixtures/gguf) writes, deterministically:
    dequant.gguf  for every supported type T: "q.T" = random blocks of type T (random bytes, the f16
                  scale fields random finite f16s), "ref.T" = gguf.quants.dequantize(q.T) as F32;
                  "src" = random f32 values and "quant.T" = gguf.quants.quantize(src, T) for the
                  types our writer quantises (F16, BF16, Q8_0).
    meta.gguf     GGUFWriter file with alignment 64, a KV of every value type, and tensors of several
                  types and ranks (a 5-D F32 one as ComfyUI-GGUF's fix_5d_tensors.py writes);
                  meta.json lists each tensor's type, torch shape and the FNV-1a 64 hash of its
                  gguf-py-dequantised float32 bytes.
  make_gguf_fixtures.py verify FILE OUT_STEM   reads FILE with gguf.GGUFReader and writes
    OUT_STEM.json ({"kv": {key: value}, "tensors": [{name, type, shape, offset, nbytes}]}) and
    OUT_STEM.bin (each tensor dequantised by gguf-py, float32, in file order); exit 1 if unreadable.
"""
import json
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

# (type, number of blocks, byte offsets of the f16 scale fields in a block)
DEQUANT_TYPES = [
    (T.F32, 1024, None), (T.F16, 1024, None), (T.BF16, 1024, None),
    (T.Q4_0, 48, [0]), (T.Q4_1, 48, [0, 2]), (T.Q5_0, 48, [0]), (T.Q5_1, 48, [0, 2]), (T.Q8_0, 48, [0]),
    (T.Q2_K, 6, [80, 82]), (T.Q3_K, 6, [108]), (T.Q4_K, 6, [0, 2]), (T.Q5_K, 6, [0, 2]), (T.Q6_K, 6, [208]),
]
QUANT_TYPES = [T.F16, T.BF16, T.Q8_0]


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def finite_f16(rng, n):
    """n random f16 bit patterns, never inf or NaN (subnormals, zeros and both signs included)."""
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
    bad = (bits & 0x7C00) == 0x7C00
    bits[bad] &= np.uint16(0xBFFF)  # clear the exponent's top bit: finite
    return bits


def random_blocks(rng, qtype, n_blocks, scale_offsets):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    if qtype == T.F32:
        return rng.standard_normal(n_blocks).astype(np.float32) * np.float32(3)
    if qtype == T.F16:
        return finite_f16(rng, n_blocks).view(np.float16)
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint16).astype(np.uint8)
    if qtype == T.BF16:  # any bit pattern (NaNs, infinities, subnormals): the conversion is a shift
        return raw
    for off in scale_offsets:
        raw[:, off:off + 2] = finite_f16(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return raw


def add(writer, name, arr, qtype):
    writer.add_tensor(name, arr, raw_dtype=qtype if qtype not in (T.F32, T.F16) else None)


def make_dequant(out_dir):
    rng = np.random.default_rng(20240622)
    w = gguf.GGUFWriter(os.path.join(out_dir, "dequant.gguf"), arch="wan-test")
    for qtype, n_blocks, offsets in DEQUANT_TYPES:
        blocks = random_blocks(rng, qtype, n_blocks, offsets)
        ref = gguf.quants.dequantize(blocks, qtype).astype(np.float32, copy=False).reshape(-1)
        add(w, f"q.{qtype.name}", blocks.reshape(1, -1) if blocks.ndim == 2 else blocks, qtype)
        w.add_tensor(f"ref.{qtype.name}", ref)
    src = (rng.standard_normal(2048) * rng.choice([1e-3, 1.0, 40.0], size=2048)).astype(np.float32)
    src[:32] = 0  # an all-zero Q8_0 block (d = 0)
    src[40] = np.float32(1e-30)  # tiny values: f16 underflow
    w.add_tensor("src", src)
    for qtype in QUANT_TYPES:
        q = gguf.quants.quantize(src.reshape(8, 256), qtype)
        add(w, f"quant.{qtype.name}", q, qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


META_KVS = [  # (key, gguf value type, value)
    ("test.u8", gguf.GGUFValueType.UINT8, 200), ("test.i8", gguf.GGUFValueType.INT8, -100),
    ("test.u16", gguf.GGUFValueType.UINT16, 60000), ("test.i16", gguf.GGUFValueType.INT16, -30000),
    ("test.u32", gguf.GGUFValueType.UINT32, 4000000000), ("test.i32", gguf.GGUFValueType.INT32, -2000000000),
    ("test.f32", gguf.GGUFValueType.FLOAT32, 1.5), ("test.bool", gguf.GGUFValueType.BOOL, True),
    ("test.string", gguf.GGUFValueType.STRING, "h\u00e9llo wan"),
    ("test.u64", gguf.GGUFValueType.UINT64, 18000000000000000000), ("test.i64", gguf.GGUFValueType.INT64, -9000000000000000000),
    ("test.f64", gguf.GGUFValueType.FLOAT64, -2.25),
]


def make_meta(out_dir):
    rng = np.random.default_rng(7)
    path = os.path.join(out_dir, "meta.gguf")
    w = gguf.GGUFWriter(path, arch="wan")
    w.add_custom_alignment(64)
    for key, vtype, val in META_KVS:
        w.add_key_value(key, val, vtype)
    w.add_key_value("test.arr_i32", [1, -2, 3], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)
    w.add_key_value("test.arr_f32", [0.5, -1.0], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.FLOAT32)
    w.add_key_value("test.arr_str", ["a", "", "bc"], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.STRING)
    w.add_key_value("test.arr_bool", [True, False], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.BOOL)
    w.add_key_value("test.arr_u64", [1, 2 ** 63], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.UINT64)
    w.add_key_value("comfy.gguf.orig_shape.blocks.0.ffn.0.weight", [64, 32], gguf.GGUFValueType.ARRAY,
                    sub_type=gguf.GGUFValueType.INT32)
    x = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    tensors = [  # (name, float data, stored type)
        ("blocks.0.self_attn.q.weight", x(64, 256), T.Q8_0),
        ("blocks.0.self_attn.k.weight", x(32, 256), T.Q4_K),
        ("blocks.0.ffn.0.weight", x(8, 256), T.Q6_K),  # stored 2-D, orig_shape [64, 32]
        ("blocks.0.norm3.weight", x(48), T.F32),
        ("blocks.0.modulation", x(1, 6, 48), T.F32),
        ("text_embedding.0.weight", x(48, 40), T.F16),
        ("head.head.weight", x(16, 48), T.BF16),
        ("patch_embedding.weight", x(48, 4, 1, 2, 2), T.F32),
        ("blocks.0.self_attn.v.weight", x(32, 64), T.Q5_0),
    ]
    manifest = []
    for name, data, qtype in tensors:
        if qtype in (T.Q4_K, T.Q6_K):  # gguf-py has no quantiser for these: random blocks of that shape
            offsets = {T.Q4_K: [0, 2], T.Q6_K: [208]}[qtype]
            n_blocks = data.size // 256
            q = random_blocks(rng, qtype, n_blocks, offsets).reshape(*data.shape[:-1], -1)
        else:
            q = gguf.quants.quantize(data, qtype) if qtype != T.F32 else data
        add(w, name, q, qtype)
        deq = gguf.quants.dequantize(q, qtype).astype(np.float32, copy=False)
        manifest.append({"name": name, "type": qtype.name, "shape": list(deq.shape),
                         "fnv": "%016x" % fnv1a64(np.ascontiguousarray(deq).tobytes())})
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump({"tensors": manifest}, f, indent=1)


def kv_json(field):
    v = field.contents()
    if isinstance(v, (np.generic,)):
        v = v.item()
    if isinstance(v, list):
        v = [i.item() if isinstance(i, np.generic) else i for i in v]
    if isinstance(v, float) and not np.isfinite(v):
        v = str(v)
    return {"type": [int(t) for t in field.types], "value": v}


def verify(path, stem):
    r = gguf.GGUFReader(path)
    out = {"kv": {}, "tensors": []}
    for name, field in r.fields.items():
        if name.startswith("GGUF."):
            continue
        out["kv"][name] = kv_json(field)
    blob = bytearray()
    for t in r.tensors:
        deq = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        raw = np.ascontiguousarray(deq).tobytes()
        out["tensors"].append({"name": t.name, "type": t.tensor_type.name,
                               "shape": [int(s) for s in reversed(t.shape.tolist())],
                               "offset": len(blob), "nbytes": len(raw)})
        blob += raw
    with open(stem + ".json", "w") as f:
        json.dump(out, f)
    with open(stem + ".bin", "wb") as f:
        f.write(blob)


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "verify" and len(sys.argv) == 4:
        verify(sys.argv[2], sys.argv[3])
    elif len(sys.argv) in (2, 3) and sys.argv[1] == "make":
        here = os.path.dirname(os.path.abspath(__file__))
        out = sys.argv[2] if len(sys.argv) == 3 else os.path.join(here, "..", "tests", "fixtures", "gguf")
        os.makedirs(out, exist_ok=True)
        make_dequant(out)
        make_meta(out)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
