#!/usr/bin/env python3
"""Oracle fixtures for the CPU DiT: diffusers WanTransformer3DModel at a tiny config, float32.

Default mode (re)writes tests/fixtures/tiny_dit/:
  transformer/config.json, transformer/diffusion_pytorch_model.safetensors
      diffusers layout via save_pretrained; random seeded weights rounded to bf16-representable
      values and stored as BF16 (half the bytes, fp32 math unchanged).
  i2v_patch_embedding.safetensors
      patch_embedding.{weight,bias} (diffusers names) of an in_channels=36 (I2V) variant; every other
      tensor is shared with transformer/ (keeps the committed size small).
  cases.safetensors
      per case "<case>.x", ".t", ".context" [B, Lmax, text_dim] (rows >= length are zero),
      ".context_lens" (I64), ".out" (velocity) and "<case>.hook.<name>" intermediates; metadata
      "cases" is a JSON list of {name, model, seq_len}.

--official DIR writes the same weights under the OFFICIAL WanModel names (config.json in the
official style + diffusion_pytorch_model.safetensors), mapping names with this file's own
implementation of spec §3.3 (independent of the C++ map), reading the committed diffusers file so
the tensors are bit-identical.

Numerics of the oracle: diffusers fp32 throughout, except the sinusoidal timestep embedding, which
is replaced by the official float64 computation (spec §2.4 / §9.2): diffusers computes it in fp32,
which at t ~ 1000 perturbs the argument by up to ~3e-5 and the outputs by ~4e-6 relative, several
times the ~1e-6 agreement of everything else (the script prints the measured difference).
"""
import argparse
import json
import os
import re
import struct
import sys

# torch / diffusers are imported by main() only for the oracle mode: --official needs nothing beyond
# the standard library and runs in well under a second (the C++ test calls it).
torch = None
save_file = None

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "..", "tests", "fixtures", "tiny_dit")

# Real head_dim (128: RoPE split 22/21/21) and freq_dim, 2 heads (RMSNorm across heads is visible),
# 2 blocks; ffn_dim and text_dim differ from dim so a transposed weight cannot go unnoticed. Sizes
# are chosen to keep the committed weights under 4 MB.
CONFIG = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=2,
    attention_head_dim=128,
    in_channels=16,
    out_channels=16,
    text_dim=32,
    freq_dim=256,
    ffn_dim=128,
    num_layers=2,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    eps=1e-6,
    image_dim=None,
    added_kv_proj_dim=None,
    rope_max_seq_len=1024,
)
TEXT_LEN = 512  # official WanModel.text_len: context is zero-padded to this before text_embedding
SEED = 20250704


def official_timesteps_module():
    """Replacement for diffusers' Timesteps submodule (defined here: torch is imported lazily)."""

    class OfficialTimesteps(torch.nn.Module):
        def forward(self, t):
            return official_sinusoid(t)

    return OfficialTimesteps()


def official_sinusoid(t):
    """Official sinusoidal_embedding_1d(256, t): float64, cos half first, then fp32."""
    half = CONFIG["freq_dim"] // 2
    pos = t.to(torch.float64)
    sinusoid = torch.outer(pos, torch.pow(10000, -torch.arange(half).to(pos).div(half)))
    return torch.cat([torch.cos(sinusoid), torch.sin(sinusoid)], dim=1).float()


def bf16_round_(t):
    t.copy_(t.to(torch.bfloat16).to(torch.float32))


def randomize(model, gen, only=None):
    """Every parameter random (also norm weights, which diffusers initialises to 1/0), bf16-exact."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if only is not None and not name.startswith(only):
                continue
            if name.endswith("scale_shift_table"):
                v = torch.randn(p.shape, generator=gen) * 0.3
            elif "norm" in name and name.endswith("weight"):
                v = 1.0 + 0.2 * torch.randn(p.shape, generator=gen)
            elif name.endswith("bias"):
                v = 0.1 * torch.randn(p.shape, generator=gen)
            else:  # Linear / Conv3d weight: unit-variance outputs
                fan_in = p[0].numel()
                v = torch.randn(p.shape, generator=gen) / fan_in**0.5
            p.copy_(v)
            bf16_round_(p)


def build_models():
    from diffusers import WanTransformer3DModel

    gen = torch.Generator().manual_seed(SEED)
    t2v = WanTransformer3DModel(**CONFIG).float().eval()
    randomize(t2v, gen)
    i2v = WanTransformer3DModel(**{**CONFIG, "in_channels": 36}).float().eval()
    sd = {k: v for k, v in t2v.state_dict().items() if not k.startswith("patch_embedding")}
    missing, unexpected = i2v.load_state_dict(sd, strict=False)
    assert sorted(missing) == ["patch_embedding.bias", "patch_embedding.weight"], missing
    assert not unexpected
    randomize(i2v, gen, only="patch_embedding")
    return t2v, i2v


def attach_hooks(model, cap):
    hs = []
    hs.append(model.patch_embedding.register_forward_hook(
        lambda m, i, o: cap.__setitem__("patch_embed", o.flatten(2).transpose(1, 2).contiguous())))

    def cond_hook(m, i, o):
        temb, tproj, text = o[0], o[1], o[2]
        if temb.ndim == 2:  # per-sample timestep: [B, D] -> [B, 1, D] (one row per sample)
            temb, tproj = temb.unsqueeze(1), tproj.unsqueeze(1)
        cap["time_embed"] = temb
        cap["time_proj"] = tproj
        cap["text_embed"] = text[:, :16].contiguous()  # rows >= lengths are all the padding constant
    hs.append(model.condition_embedder.register_forward_hook(cond_hook))
    for i, b in enumerate(model.blocks):
        hs.append(b.register_forward_hook(lambda m, inp, o, i=i: cap.__setitem__(f"block.{i}", o)))
    hs.append(model.proj_out.register_forward_hook(lambda m, i, o: cap.__setitem__("head", o)))
    return hs


def make_case(gen, B, in_ch, T, H, W, t, lens):
    x = torch.randn(B, in_ch, T, H, W, generator=gen)
    lmax = max(lens)
    ctx = torch.zeros(B, lmax, CONFIG["text_dim"])
    for b, n in enumerate(lens):
        ctx[b, :n] = torch.randn(n, CONFIG["text_dim"], generator=gen)
    return x, t, ctx, torch.tensor(lens, dtype=torch.int64)


def run(model, x, t, ctx, hooks):
    padded = torch.zeros(ctx.shape[0], TEXT_LEN, ctx.shape[2])
    padded[:, : ctx.shape[1]] = ctx
    cap = {}
    hs = attach_hooks(model, cap) if hooks else []
    with torch.no_grad():
        out = model(hidden_states=x, timestep=t, encoder_hidden_states=padded, return_dict=False)[0]
    for h in hs:
        h.remove()
    return out, cap


def write_fixtures(out_dir):
    t2v, i2v = build_models()
    os.makedirs(out_dir, exist_ok=True)
    # diffusers layout in BF16 (values are bf16-exact, so the fp32 oracle used the same numbers)
    t2v_bf16 = type(t2v)(**CONFIG)
    t2v_bf16.load_state_dict(t2v.state_dict())
    from diffusers.utils import logging as dlog

    dlog.set_verbosity_error()  # its "keep in fp32" advice concerns running in bf16, not storing
    t2v_bf16.to(torch.bfloat16).save_pretrained(os.path.join(out_dir, "transformer"), safe_serialization=True)
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in i2v.state_dict().items()
               if k.startswith("patch_embedding")}, os.path.join(out_dir, "i2v_patch_embedding.safetensors"))

    gen = torch.Generator().manual_seed(SEED + 1)
    # (name, model, B, in_ch, T, H, W, timestep, context lengths, hooks to keep: "all" or names)
    L_ti2v = 3 * 2 * 3
    t_tok = torch.full((1, L_ti2v), 700.0)
    t_tok[0, :6] = 0.0  # TI2V image mode: first-frame tokens at t = 0
    specs = [
        ("t2v_cfg", "t2v", 2, 16, 2, 4, 6, torch.tensor([999, 500], dtype=torch.int64), [7, 3], "all"),
        ("odd_grid", "t2v", 1, 16, 3, 6, 10, torch.tensor([437], dtype=torch.int64), [12], ""),
        ("i2v", "i2v", 1, 36, 2, 4, 8, torch.tensor([875], dtype=torch.int64), [5], ""),
        ("ti2v_tokens", "t2v", 1, 16, 3, 4, 6, t_tok, [4], "time_embed"),
        ("tall_single_frame", "t2v", 1, 16, 1, 10, 4, torch.tensor([1], dtype=torch.int64), [1], ""),
    ]
    tensors, meta = {}, []
    worst = 0.0
    for name, kind, B, ch, T, H, W, t, lens, hooks in specs:
        model = t2v if kind == "t2v" else i2v
        x, t, ctx, clens = make_case(gen, B, ch, T, H, W, t, lens)
        # diffusers' own fp32 sinusoid, for the record
        ref_diffusers, _ = run(model, x, t, ctx, False)
        own = model.condition_embedder.timesteps_proj
        model.condition_embedder.timesteps_proj = official_timesteps_module()
        out, cap = run(model, x, t, ctx, bool(hooks))
        if hooks != "all":
            cap = {k: v for k, v in cap.items() if k in hooks.split(",")}
        model.condition_embedder.timesteps_proj = own
        d = ((out - ref_diffusers).abs().max() / out.abs().max()).item()
        worst = max(worst, d)
        print(f"{name}: out {list(out.shape)} max|out| {out.abs().max():.3f}; "
              f"diffusers fp32 sinusoid vs official fp64: rel diff {d:.2e}")
        seq_len = (T // 1) * (H // 2) * (W // 2)
        meta.append(dict(name=name, model=kind, seq_len=seq_len))
        tensors[f"{name}.x"] = x
        tensors[f"{name}.t"] = t.to(torch.float32)
        tensors[f"{name}.context"] = ctx
        tensors[f"{name}.context_lens"] = clens
        tensors[f"{name}.out"] = out
        for k, v in cap.items():
            tensors[f"{name}.hook.{k}"] = v.float()
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out_dir, "cases.safetensors"),
              metadata={"cases": json.dumps(meta)})  # one key: safetensors orders metadata keys at random
    print(f"oracle sinusoid: official float64 (diffusers' fp32 one moves outputs by up to {worst:.1e} rel)")
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(out_dir) for f in fs)
    print(f"wrote {out_dir} ({total / 1e6:.2f} MB)")


# ---- official names (spec §3.3), implemented independently of src/ckpt/names.cpp ----

def official_names(num_layers):
    top = ["patch_embedding.weight", "patch_embedding.bias", "head.modulation",
           "head.head.weight", "head.head.bias"]
    for m in ["text_embedding.0", "text_embedding.2", "time_embedding.0", "time_embedding.2",
              "time_projection.1"]:
        top += [m + ".weight", m + ".bias"]
    blk = ["modulation", "norm3.weight", "norm3.bias", "ffn.0.weight", "ffn.0.bias", "ffn.2.weight", "ffn.2.bias"]
    for a in ["self_attn", "cross_attn"]:
        for p in "qkvo":
            blk += [f"{a}.{p}.weight", f"{a}.{p}.bias"]
        blk += [f"{a}.norm_q.weight", f"{a}.norm_k.weight"]
    return top + [f"blocks.{i}.{n}" for i in range(num_layers) for n in blk]


def official_to_diffusers(name):
    """Ordered substitutions of spec §3.3 (the norm2/norm3 swap goes through a placeholder)."""
    subs = [
        (r"^time_embedding\.0", "condition_embedder.time_embedder.linear_1"),
        (r"^time_embedding\.2", "condition_embedder.time_embedder.linear_2"),
        (r"^text_embedding\.0", "condition_embedder.text_embedder.linear_1"),
        (r"^text_embedding\.2", "condition_embedder.text_embedder.linear_2"),
        (r"^time_projection\.1", "condition_embedder.time_proj"),
        (r"^head\.modulation$", "scale_shift_table"),
        (r"^head\.head", "proj_out"),
        (r"^(blocks\.\d+)\.modulation$", r"\1.scale_shift_table"),
        (r"\.ffn\.0\.", ".ffn.net.0.proj."),
        (r"\.ffn\.2\.", ".ffn.net.2."),
        (r"\.norm3\.", ".@NORM2@."),
        (r"\.norm2\.", ".norm3."),
        (r"\.@NORM2@\.", ".norm2."),
        (r"\.self_attn\.([qkv])\.", r".attn1.to_\1."),
        (r"\.self_attn\.o\.", ".attn1.to_out.0."),
        (r"\.self_attn\.norm_", ".attn1.norm_"),
        (r"\.cross_attn\.([qkv])\.", r".attn2.to_\1."),
        (r"\.cross_attn\.o\.", ".attn2.to_out.0."),
        (r"\.cross_attn\.norm_", ".attn2.norm_"),
    ]
    for pat, rep in subs:
        name = re.sub(pat, rep, name)
    return name


def read_safetensors_raw(path):
    """(header dict without __metadata__, data section bytes): tensors are copied as raw bytes."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    return header, data


def write_safetensors_raw(path, entries):
    """entries: list of (name, dtype, shape, bytes), written in order, 8-byte aligned header."""
    header, off = {}, 0
    for name, dtype, shape, raw in entries:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for *_, raw in entries:
            f.write(raw)


def write_official(out_dir, src_dir):
    """Byte-level rename of the committed diffusers file (no torch: fast, and bit-identical by construction)."""
    cfg = json.load(open(os.path.join(src_dir, "transformer", "config.json")))
    header, data = read_safetensors_raw(os.path.join(src_dir, "transformer", "diffusion_pytorch_model.safetensors"))
    names = official_names(cfg["num_layers"])
    mapped = {n: official_to_diffusers(n) for n in names}
    assert sorted(mapped.values()) == sorted(header.keys()), (
        sorted(set(header) - set(mapped.values())), sorted(set(mapped.values()) - set(header)))
    entries = []
    for n, d in mapped.items():
        h = header[d]
        b, e = h["data_offsets"]
        entries.append((n, h["dtype"], h["shape"], data[b:e]))
    os.makedirs(out_dir, exist_ok=True)
    write_safetensors_raw(os.path.join(out_dir, "diffusion_pytorch_model.safetensors"), entries)
    official_cfg = {
        "_class_name": "WanModel", "_diffusers_version": "0.33.0",
        "dim": cfg["num_attention_heads"] * cfg["attention_head_dim"], "eps": cfg["eps"],
        "ffn_dim": cfg["ffn_dim"], "freq_dim": cfg["freq_dim"], "in_dim": cfg["in_channels"],
        "model_type": "t2v", "num_heads": cfg["num_attention_heads"], "num_layers": cfg["num_layers"],
        "out_dim": cfg["out_channels"], "text_len": TEXT_LEN, "text_dim": cfg["text_dim"],
    }
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(official_cfg, f, indent=2, sort_keys=True)
    print(f"wrote {len(names)} tensors with official names to {out_dir}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT, help="fixture folder to (re)write")
    ap.add_argument("--official", metavar="DIR", help="write the committed weights with official names to DIR")
    ap.add_argument("--src", default=DEFAULT_OUT, help="fixture folder read by --official")
    a = ap.parse_args()
    if a.official:
        write_official(a.official, a.src)
    else:
        global torch, save_file
        import torch
        from safetensors.torch import save_file

        torch.set_num_threads(2)
        write_fixtures(a.out)


if __name__ == "__main__":
    sys.exit(main())
