#!/usr/bin/env python3
"""Checks checkpoints written by `wan make-checkpoint` against the reference Python stacks.

For every folder given (layout detected: model_index.json -> diffusers, else official):
  diffusers: loads transformer(s), text encoder, VAE, tokenizer and scheduler with diffusers /
             transformers, requires strict loading (no missing, unexpected or mismatched keys), checks
             the pipeline attributes of model_index.json and loads the whole pipeline.
  official:  reads the DiT safetensors, torch.load(weights_only=True)s the T5 and VAE .pth files,
             requires the exact official tensor names and shapes (built here from the configs, per
             the module structure of WanModel, T5Encoder and WanVAE_), then maps them to diffusers /
             transformers names with an independent table and loads them strictly.
Then runs one forward of every model on random inputs: outputs must be finite with std > 0, and
with --depth-check every DiT / T5 block output must have a std within [1e-3, 1e3].
--compare A B: A and B (same config and seed, different layouts) must hold identical tensors.
Exit status 0 when everything holds, 1 otherwise (each problem is printed as "FAIL: ...").
"""
import argparse
import glob
import json
import math
import os
import sys

import torch

FAILS = []


def fail(msg):
    FAILS.append(msg)
    print("FAIL: " + msg, flush=True)


def ok(msg):
    print("ok: " + msg, flush=True)


def check(cond, msg):
    if not cond:
        fail(msg)
    return cond


# ---------------------------------------------------------------------------------------------
# Expected official names (spec §3.2, §4.4, §5.3, §6.2), built from configs.

def dit_official_shapes(cfg):
    D, F = cfg["dim"], cfg["ffn_dim"]
    in_dim, out_dim = cfg["in_dim"], cfg["out_dim"]
    text_dim = cfg.get("text_dim", 4096)
    s = {
        "patch_embedding.weight": (D, in_dim, 1, 2, 2), "patch_embedding.bias": (D,),
        "text_embedding.0.weight": (D, text_dim), "text_embedding.0.bias": (D,),
        "text_embedding.2.weight": (D, D), "text_embedding.2.bias": (D,),
        "time_embedding.0.weight": (D, cfg.get("freq_dim", 256)), "time_embedding.0.bias": (D,),
        "time_embedding.2.weight": (D, D), "time_embedding.2.bias": (D,),
        "time_projection.1.weight": (6 * D, D), "time_projection.1.bias": (6 * D,),
        "head.modulation": (1, 2, D), "head.head.weight": (out_dim * 4, D), "head.head.bias": (out_dim * 4,),
    }
    for i in range(cfg["num_layers"]):
        b = f"blocks.{i}."
        s[b + "modulation"] = (1, 6, D)
        for a in ("self_attn.", "cross_attn."):
            for p in "qkvo":
                s[b + a + p + ".weight"] = (D, D)
                s[b + a + p + ".bias"] = (D,)
            s[b + a + "norm_q.weight"] = (D,)
            s[b + a + "norm_k.weight"] = (D,)
        s[b + "norm3.weight"] = (D,)
        s[b + "norm3.bias"] = (D,)
        s[b + "ffn.0.weight"] = (F, D)
        s[b + "ffn.0.bias"] = (F,)
        s[b + "ffn.2.weight"] = (D, F)
        s[b + "ffn.2.bias"] = (D,)
    return s


DIT_SUBS = [  # spec §3.3, applied in order; norm2/norm3 swap through a placeholder
    ("time_embedding.0", "condition_embedder.time_embedder.linear_1"),
    ("time_embedding.2", "condition_embedder.time_embedder.linear_2"),
    ("text_embedding.0", "condition_embedder.text_embedder.linear_1"),
    ("text_embedding.2", "condition_embedder.text_embedder.linear_2"),
    ("time_projection.1", "condition_embedder.time_proj"),
    ("head.modulation", "scale_shift_table"),
    ("head.head", "proj_out"),
    ("modulation", "scale_shift_table"),
    ("ffn.0", "ffn.net.0.proj"),
    ("ffn.2", "ffn.net.2"),
    (".norm3.", ".@NORM2@."), (".norm2.", ".norm3."), (".@NORM2@.", ".norm2."),
    ("self_attn.o", "attn1.to_out.0"), ("cross_attn.o", "attn2.to_out.0"),
    ("self_attn.q", "attn1.to_q"), ("self_attn.k", "attn1.to_k"), ("self_attn.v", "attn1.to_v"),
    ("cross_attn.q", "attn2.to_q"), ("cross_attn.k", "attn2.to_k"), ("cross_attn.v", "attn2.to_v"),
    ("self_attn.norm_", "attn1.norm_"), ("cross_attn.norm_", "attn2.norm_"),
]


def dit_to_diffusers(name):
    for a, b in DIT_SUBS:
        name = name.replace(a, b)
    return name


def t5_official_shapes(vocab, dim, dim_ffn, heads, layers, buckets=32):
    s = {"token_embedding.weight": (vocab, dim), "norm.weight": (dim,)}
    for i in range(layers):
        b = f"blocks.{i}."
        s[b + "norm1.weight"] = (dim,)
        s[b + "norm2.weight"] = (dim,)
        for p in "qkvo":
            s[b + f"attn.{p}.weight"] = (dim, dim)
        s[b + "ffn.gate.0.weight"] = (dim_ffn, dim)
        s[b + "ffn.fc1.weight"] = (dim_ffn, dim)
        s[b + "ffn.fc2.weight"] = (dim, dim_ffn)
        s[b + "pos_embedding.embedding.weight"] = (buckets, heads)
    return s


T5_BLOCK = {
    "norm1.weight": "layer.0.layer_norm.weight",
    "attn.q.weight": "layer.0.SelfAttention.q.weight", "attn.k.weight": "layer.0.SelfAttention.k.weight",
    "attn.v.weight": "layer.0.SelfAttention.v.weight", "attn.o.weight": "layer.0.SelfAttention.o.weight",
    "pos_embedding.embedding.weight": "layer.0.SelfAttention.relative_attention_bias.weight",
    "norm2.weight": "layer.1.layer_norm.weight",
    "ffn.gate.0.weight": "layer.1.DenseReluDense.wi_0.weight",
    "ffn.fc1.weight": "layer.1.DenseReluDense.wi_1.weight",
    "ffn.fc2.weight": "layer.1.DenseReluDense.wo.weight",
}


def t5_to_hf(name):
    if name == "token_embedding.weight":
        return "shared.weight"
    if name == "norm.weight":
        return "encoder.final_layer_norm.weight"
    _, i, rest = name.split(".", 2)
    return f"encoder.block.{i}.{T5_BLOCK[rest]}"


def vae_official_shapes(version, base, dec, z):
    """Mirrors the module structure of vae2_1.py / vae2_2.py (dim_mult [1,2,4,4], 2 res blocks)."""
    s = {}
    io = 3 if version == 21 else 12
    mult = [1, 2, 4, 4]
    tdown = [False, True, True]

    def conv(n, i, o, k):
        s[n + ".weight"] = (o, i) + k
        s[n + ".bias"] = (o,)

    def res(n, i, o):
        s[n + ".residual.0.gamma"] = (i, 1, 1, 1)
        conv(n + ".residual.2", i, o, (3, 3, 3))
        s[n + ".residual.3.gamma"] = (o, 1, 1, 1)
        conv(n + ".residual.6", o, o, (3, 3, 3))
        if i != o:
            conv(n + ".shortcut", i, o, (1, 1, 1))

    def attn(n, c):
        s[n + ".norm.gamma"] = (c, 1, 1)
        conv(n + ".to_qkv", c, 3 * c, (1, 1))
        conv(n + ".proj", c, c, (1, 1))

    dims = [base * m for m in [1] + mult]
    conv("encoder.conv1", io, dims[0], (3, 3, 3))
    flat = 0
    for st in range(4):
        i, o = dims[st], dims[st + 1]
        for j in range(2):
            n = f"encoder.downsamples.{st}.downsamples.{j}" if version == 22 else f"encoder.downsamples.{flat}"
            flat += 1
            res(n, i, o)
            i = o
        if st != 3:
            n = f"encoder.downsamples.{st}.downsamples.2" if version == 22 else f"encoder.downsamples.{flat}"
            flat += 1
            conv(n + ".resample.1", o, o, (3, 3))
            if tdown[st]:
                conv(n + ".time_conv", o, o, (3, 1, 1))
    c = dims[-1]
    res("encoder.middle.0", c, c)
    attn("encoder.middle.1", c)
    res("encoder.middle.2", c, c)
    s["encoder.head.0.gamma"] = (c, 1, 1, 1)
    conv("encoder.head.2", c, 2 * z, (3, 3, 3))
    conv("conv1", 2 * z, 2 * z, (1, 1, 1))
    conv("conv2", z, z, (1, 1, 1))
    ddims = [dec * m for m in [mult[-1]] + mult[::-1]]
    tup = tdown[::-1]
    conv("decoder.conv1", z, ddims[0], (3, 3, 3))
    res("decoder.middle.0", ddims[0], ddims[0])
    attn("decoder.middle.1", ddims[0])
    res("decoder.middle.2", ddims[0], ddims[0])
    flat = 0
    for st in range(4):
        i, o = ddims[st], ddims[st + 1]
        if version == 21 and st > 0:
            i //= 2
        for j in range(3):
            n = f"decoder.upsamples.{st}.upsamples.{j}" if version == 22 else f"decoder.upsamples.{flat}"
            flat += 1
            res(n, i, o)
            i = o
        if st != 3:
            n = f"decoder.upsamples.{st}.upsamples.3" if version == 22 else f"decoder.upsamples.{flat}"
            flat += 1
            conv(n + ".resample.1", o, o if version == 22 else o // 2, (3, 3))
            if tup[st]:
                conv(n + ".time_conv", o, 2 * o, (3, 1, 1))
    s["decoder.head.0.gamma"] = (ddims[-1], 1, 1, 1)
    conv("decoder.head.2", ddims[-1], io, (3, 3, 3))
    return s


RES_LEAF = {"residual.0.gamma": "norm1.gamma", "residual.2.weight": "conv1.weight", "residual.2.bias": "conv1.bias",
            "residual.3.gamma": "norm2.gamma", "residual.6.weight": "conv2.weight", "residual.6.bias": "conv2.bias",
            "shortcut.weight": "conv_shortcut.weight", "shortcut.bias": "conv_shortcut.bias"}


def vae_to_diffusers(name, version):
    top = {"conv1": "quant_conv", "conv2": "post_quant_conv"}
    parts = name.split(".")
    if parts[0] in top:
        return top[parts[0]] + "." + parts[1]
    side, rest = parts[0], parts[1:]
    if rest[0] == "conv1":
        return f"{side}.conv_in.{rest[1]}"
    if rest[0] == "head":
        return f"{side}.{'norm_out' if rest[1] == '0' else 'conv_out'}.{rest[2]}"
    if rest[0] == "middle":
        leaf = ".".join(rest[2:])
        if rest[1] == "1":
            return f"{side}.mid_block.attentions.0.{leaf}"
        return f"{side}.mid_block.resnets.{0 if rest[1] == '0' else 1}.{RES_LEAF[leaf]}"
    if version == 21:
        n, leaf = int(rest[1]), ".".join(rest[2:])
        if side == "encoder":  # flat list with the same indices
            return f"encoder.down_blocks.{n}.{RES_LEAF.get(leaf, leaf)}"
        stage, j = divmod(n, 4)
        if j == 3:
            return f"decoder.up_blocks.{stage}.upsamplers.0.{leaf}"
        return f"decoder.up_blocks.{stage}.resnets.{j}.{RES_LEAF[leaf]}"
    stage, j, leaf = int(rest[1]), int(rest[3]), ".".join(rest[4:])
    blocks = "down_blocks" if side == "encoder" else "up_blocks"
    if leaf in RES_LEAF:
        return f"{side}.{blocks}.{stage}.resnets.{j}.{RES_LEAF[leaf]}"
    return f"{side}.{blocks}.{stage}.{'downsampler' if side == 'encoder' else 'upsampler'}.{leaf}"


# ---------------------------------------------------------------------------------------------
# Loading helpers

def load_safetensors_dir(d, prefix):
    from safetensors.torch import load_file
    index = os.path.join(d, prefix + ".safetensors.index.json")
    single = os.path.join(d, prefix + ".safetensors")
    out = {}
    if os.path.exists(index):
        wm = json.load(open(index))["weight_map"]
        for shard in sorted(set(wm.values())):
            t = load_file(os.path.join(d, shard))
            for k in t:
                check(wm.get(k) == shard, f"{d}: tensor {k} is in {shard} but the index says {wm.get(k)}")
            out.update(t)
        check(set(out) == set(wm), f"{d}: index and shards disagree")
        check(not os.path.exists(single), f"{d}: both an index and {prefix}.safetensors")
    else:
        check(os.path.exists(single), f"{d}: no {prefix}.safetensors")
        out = load_file(single)
    return out


def compare_names(what, got, expected):
    """got: {name: tensor}, expected: {name: shape}."""
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    check(not missing, f"{what}: missing tensors {missing[:5]} ({len(missing)})")
    check(not extra, f"{what}: unexpected tensors {extra[:5]} ({len(extra)})")
    bad = [k for k in expected if k in got and tuple(got[k].shape) != tuple(expected[k])]
    check(not bad, f"{what}: wrong shapes " + ", ".join(f"{k} {tuple(got[k].shape)} != {expected[k]}" for k in bad[:5]))
    if not (missing or extra or bad):
        ok(f"{what}: {len(got)} tensors with the official names and shapes")


def strict_load(what, model, sd, tied=()):
    res = model.load_state_dict(sd, strict=False)
    missing = [k for k in res.missing_keys if k not in tied]
    check(not missing and not res.unexpected_keys,
          f"{what}: strict load: missing {missing[:5]}, unexpected {res.unexpected_keys[:5]}")


def loading_info_ok(what, info, allowed_missing=()):
    missing = [k for k in info.get("missing_keys", []) if k not in allowed_missing]
    unexpected = list(info.get("unexpected_keys", []))
    mismatched = list(info.get("mismatched_keys", []))
    if check(not missing and not unexpected and not mismatched,
             f"{what}: missing {missing[:5]}, unexpected {unexpected[:5]}, mismatched {mismatched[:5]}"):
        ok(f"{what}: strict load")


def weights_sane(what, named):
    """Every tensor finite and not constant (a writer bug that leaves zeros or one value shows here)."""
    bad = []
    for k, v in named:
        v = v.detach().float()
        if not bool(torch.isfinite(v).all()) or (v.numel() > 1 and float(v.std()) == 0.0):
            bad.append(k)
    if check(not bad, f"{what}: non-finite or constant tensors {bad[:5]} ({len(bad)})"):
        ok(f"{what}: all tensors finite and non-constant")


def finite_std(what, t, lo=None, hi=None):
    t = t.detach().float()
    if not check(bool(torch.isfinite(t).all()), f"{what}: non-finite values"):
        return
    s = float(t.std())
    check(s > 0, f"{what}: degenerate output (std 0)")
    if lo is not None:
        check(lo <= s <= hi, f"{what}: std {s:.3g} outside [{lo}, {hi}]")
    return s


# ---------------------------------------------------------------------------------------------
# Forward checks

def run_transformer(what, model, depth_check):
    cfg = model.config
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, cfg.in_channels, 2, 4, 4, generator=g)
    ctx = torch.randn(1, 8, cfg.text_dim, generator=g)
    t = torch.tensor([700.0])
    stds = []
    hooks = [b.register_forward_hook(lambda m, i, o: stds.append(o if torch.is_tensor(o) else o[0]))
             for b in model.blocks]
    with torch.no_grad():
        out = model(hidden_states=x, timestep=t, encoder_hidden_states=ctx, return_dict=False)[0]
    for h in hooks:
        h.remove()
    check(tuple(out.shape) == (1, cfg.out_channels, 2, 4, 4), f"{what}: output shape {tuple(out.shape)}")
    s = finite_std(what + " output", out)
    lo, hi = (1e-3, 1e3) if depth_check else (None, None)
    block_stds = [finite_std(f"{what} block {i}", b, lo, hi) for i, b in enumerate(stds)]
    if s is not None:
        ok(f"{what}: forward finite, output std {s:.3g}, {len(stds)} blocks, stds " +
           " ".join(f"{v:.3g}" for v in block_stds if v is not None))


def run_t5(what, model, tok, depth_check):
    enc = tok(["a cat 猫 🐱", "A beautiful golden sunset over the sea, cinematic shot."], padding="max_length",
              max_length=32, truncation=True, return_tensors="pt")
    check(int(enc.input_ids.max()) < model.config.vocab_size, f"{what}: token id beyond the embedding table")
    outs = []
    hooks = [b.register_forward_hook(lambda m, i, o: outs.append(o if torch.is_tensor(o) else o[0]))
             for b in model.encoder.block]
    with torch.no_grad():
        y = model(input_ids=enc.input_ids, attention_mask=enc.attention_mask).last_hidden_state
    for h in hooks:
        h.remove()
    s = finite_std(what + " output", y)
    lo, hi = (1e-3, 1e3) if depth_check else (None, None)
    for i, o in enumerate(outs):
        finite_std(f"{what} block {i}", o, lo, hi)
    if s is not None:
        ok(f"{what}: forward finite, output std {s:.3g}")


def run_vae(what, vae):
    cfg = vae.config
    g = torch.Generator().manual_seed(0)
    z = torch.randn(1, cfg.z_dim, 2, 4, 4, generator=g)
    with torch.no_grad():
        video = vae.decode(z).sample
        s = 8 * (cfg.patch_size or 1)
        check(tuple(video.shape) == (1, 3, 5, 4 * s, 4 * s), f"{what}: decoded shape {tuple(video.shape)}")
        sd = finite_std(what + " decode", video)
        px = torch.rand(1, 3, 5, 4 * s, 4 * s, generator=g) * 2 - 1
        mu = vae.encode(px).latent_dist.mean
        check(tuple(mu.shape) == (1, cfg.z_dim, 2, 4, 4), f"{what}: encoded shape {tuple(mu.shape)}")
        se = finite_std(what + " encode", mu)
    if sd is not None and se is not None:
        ok(f"{what}: decode std {sd:.3g}, encode std {se:.3g}")


def check_tokenizer(what, d):
    import sentencepiece as spm
    from transformers import AutoTokenizer
    sp = spm.SentencePieceProcessor(model_file=os.path.join(d, "spiece.model"))
    check((sp.pad_id(), sp.eos_id(), sp.unk_id(), sp.bos_id()) == (0, 1, 2, -1),
          f"{what}: special ids pad/eos/unk/bos {(sp.pad_id(), sp.eos_id(), sp.unk_id(), sp.bos_id())}")
    text = "a cat 猫 🐱"
    pieces = sp.encode(text, out_type=str)
    check("<0xE7>" in pieces and "<0xF0>" in pieces, f"{what}: no byte fallback for non-ASCII: {pieces}")
    check(sp.decode(sp.encode(text)) == text, f"{what}: sentencepiece does not round-trip '{text}'")
    tok = AutoTokenizer.from_pretrained(d)
    ids = tok(text).input_ids
    check(ids[-1] == 1 and tok.pad_token_id == 0 and tok.eos_token_id == 1, f"{what}: eos/pad ids")
    check(tok.convert_tokens_to_ids("<extra_id_0>") == len(tok) - 1, f"{what}: <extra_id_0> is not the last id")
    hf = tok("A red car on the road").input_ids
    check(hf == sp.encode("A red car on the road") + [1], f"{what}: transformers and sentencepiece disagree")
    ok(f"{what}: sentencepiece ({sp.get_piece_size()} pieces) and {type(tok).__name__} ({len(tok)} ids)")
    return tok


# ---------------------------------------------------------------------------------------------
# Layouts

def verify_diffusers(d, depth_check):
    import diffusers
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanTransformer3DModel
    from transformers import UMT5EncoderModel
    mi = json.load(open(os.path.join(d, "model_index.json")))
    cls = mi.get("_class_name")
    check(cls in ("WanPipeline", "WanImageToVideoPipeline"), f"{d}: pipeline class {cls}")
    ti2v = mi.get("expand_timesteps") is True
    if ti2v:
        check(mi.get("boundary_ratio") is None and mi.get("transformer_2") == [None, None],
              f"{d}: TI2V must have no boundary_ratio and no transformer_2")
    else:
        want = 0.9 if cls == "WanImageToVideoPipeline" else 0.875
        check(mi.get("boundary_ratio") == want, f"{d}: boundary_ratio {mi.get('boundary_ratio')} != {want}")
        check(mi.get("transformer_2") == ["diffusers", "WanTransformer3DModel"], f"{d}: transformer_2 entry")
    for comp, (lib, name) in [(k, v) for k, v in mi.items() if not k.startswith("_") and isinstance(v, list)]:
        if lib is not None:
            check(os.path.isdir(os.path.join(d, comp)), f"{d}: component folder {comp}/ missing")
    ok(f"{d}: model_index {cls}")

    experts = ["transformer"] + ([] if ti2v else ["transformer_2"])
    for sub in experts:
        m, info = WanTransformer3DModel.from_pretrained(os.path.join(d, sub), output_loading_info=True)
        loading_info_ok(f"{d}/{sub}", info)
        weights_sane(f"{d}/{sub}", m.state_dict().items())
        run_transformer(f"{d}/{sub}", m.eval(), depth_check)
    te, info = UMT5EncoderModel.from_pretrained(os.path.join(d, "text_encoder"), output_loading_info=True)
    loading_info_ok(f"{d}/text_encoder", info, allowed_missing=("encoder.embed_tokens.weight",))
    check(te.dtype == torch.bfloat16, f"{d}/text_encoder: dtype {te.dtype}")
    weights_sane(f"{d}/text_encoder", te.state_dict().items())
    check(torch.equal(te.encoder.embed_tokens.weight, te.shared.weight), f"{d}/text_encoder: embeddings not tied")
    tok = check_tokenizer(f"{d}/tokenizer", os.path.join(d, "tokenizer"))
    run_t5(f"{d}/text_encoder", te.float().eval(), tok, depth_check)
    vae, info = AutoencoderKLWan.from_pretrained(os.path.join(d, "vae"), output_loading_info=True)
    loading_info_ok(f"{d}/vae", info)
    weights_sane(f"{d}/vae", vae.state_dict().items())
    run_vae(f"{d}/vae", vae.eval())
    sch = UniPCMultistepScheduler.from_pretrained(os.path.join(d, "scheduler"))
    check(sch.config.use_flow_sigmas and sch.config.prediction_type == "flow_prediction" and
          sch.config.flow_shift == (5.0 if ti2v else 3.0), f"{d}/scheduler: config {dict(sch.config)}")
    pipe = diffusers.DiffusionPipeline.from_pretrained(d)
    check(type(pipe).__name__ == cls, f"{d}: DiffusionPipeline loaded {type(pipe).__name__}")
    check((pipe.transformer_2 is None) == ti2v, f"{d}: pipeline transformer_2")
    ok(f"{d}: {type(pipe).__name__}.from_pretrained")


def official_vae_config(sd):
    version = 22 if any(k.startswith("encoder.downsamples.0.downsamples.") for k in sd) else 21
    base = sd["encoder.conv1.weight"].shape[0]
    z = sd["conv2.weight"].shape[0]
    dec = sd["decoder.conv1.weight"].shape[0] // 4
    return version, base, dec, z


def verify_official(d, depth_check):
    from diffusers import AutoencoderKLWan, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel
    experts = [s for s in ("high_noise_model", "low_noise_model") if os.path.isdir(os.path.join(d, s))]
    dit_dirs = [os.path.join(d, s) for s in experts] if experts else [d]
    check(len(experts) in (0, 2), f"{d}: expected both high_noise_model/ and low_noise_model/")
    dit_cfg = None
    for sub in dit_dirs:
        cfg = json.load(open(os.path.join(sub, "config.json")))
        check(cfg.get("_class_name") == "WanModel", f"{sub}: config _class_name {cfg.get('_class_name')}")
        sd = load_safetensors_dir(sub, "diffusion_pytorch_model")
        compare_names(f"{sub} DiT", sd, dit_official_shapes(cfg))
        weights_sane(f"{sub} DiT", sd.items())
        dcfg = dict(patch_size=(1, 2, 2), num_attention_heads=cfg["num_heads"],
                    attention_head_dim=cfg["dim"] // cfg["num_heads"], in_channels=cfg["in_dim"],
                    out_channels=cfg["out_dim"], text_dim=cfg.get("text_dim", 4096), freq_dim=cfg["freq_dim"],
                    ffn_dim=cfg["ffn_dim"], num_layers=cfg["num_layers"], cross_attn_norm=True,
                    qk_norm="rms_norm_across_heads", eps=cfg["eps"])
        m = WanTransformer3DModel(**dcfg)
        strict_load(f"{sub} DiT -> WanTransformer3DModel", m, {dit_to_diffusers(k): v.float() for k, v in sd.items()})
        run_transformer(f"{sub} DiT", m.eval(), depth_check)
        dit_cfg = cfg
    t5_path = os.path.join(d, "models_t5_umt5-xxl-enc-bf16.pth")
    sd = torch.load(t5_path, map_location="cpu", weights_only=True)
    check(all(v.dtype == torch.bfloat16 for v in sd.values()), f"{t5_path}: not all bf16")
    vocab, dim = sd["token_embedding.weight"].shape
    layers = len({k.split(".")[1] for k in sd if k.startswith("blocks.")})
    dim_ffn = sd["blocks.0.ffn.fc1.weight"].shape[0]
    heads = sd["blocks.0.pos_embedding.embedding.weight"].shape[1]
    compare_names(t5_path, sd, t5_official_shapes(vocab, dim, dim_ffn, heads, layers))
    weights_sane(t5_path, sd.items())
    tcfg = UMT5Config(vocab_size=vocab, d_model=dim, d_kv=dim // heads, d_ff=dim_ffn, num_heads=heads,
                      num_layers=layers, feed_forward_proj="gated-gelu", layer_norm_epsilon=1e-6,
                      pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    te = UMT5EncoderModel(tcfg)
    strict_load(f"{t5_path} -> UMT5EncoderModel", te, {t5_to_hf(k): v.float() for k, v in sd.items()},
                tied=("encoder.embed_tokens.weight",))
    if dit_cfg is not None:
        text_dim = dit_cfg.get("text_dim", 4096)
        check(text_dim == dim, f"{d}: DiT text_dim {text_dim} != T5 dim {dim} (the components do not chain)")
    tok = check_tokenizer(f"{d}/google/umt5-xxl", os.path.join(d, "google", "umt5-xxl"))
    run_t5(t5_path, te.eval(), tok, depth_check)
    vae_files = glob.glob(os.path.join(d, "Wan2.*_VAE.pth"))
    if not check(len(vae_files) == 1, f"{d}: expected one Wan2.x_VAE.pth, found {vae_files}"):
        return
    sd = torch.load(vae_files[0], map_location="cpu", weights_only=True)
    version, base, dec, z = official_vae_config(sd)
    check(os.path.basename(vae_files[0]) == ("Wan2.2_VAE.pth" if version == 22 else "Wan2.1_VAE.pth"),
          f"{vae_files[0]}: file name does not match the VAE version {version}")
    compare_names(vae_files[0], sd, vae_official_shapes(version, base, dec, z))
    weights_sane(vae_files[0], sd.items())
    kw = dict(base_dim=base, z_dim=z)
    if version == 22:
        kw.update(decoder_base_dim=dec, is_residual=True, in_channels=12, out_channels=12, patch_size=2,
                  scale_factor_spatial=16, latents_mean=[0.0] * z, latents_std=[1.0] * z)
    elif z != 16:
        kw.update(latents_mean=[0.0] * z, latents_std=[1.0] * z)
    vae = AutoencoderKLWan(**kw)
    strict_load(f"{vae_files[0]} -> AutoencoderKLWan", vae, {vae_to_diffusers(k, version): v for k, v in sd.items()})
    run_vae(vae_files[0], vae.eval())


def tensors_by_official_name(d):
    """{(component, official name): tensor} for either layout."""
    out = {}
    if os.path.exists(os.path.join(d, "model_index.json")):
        mi = json.load(open(os.path.join(d, "model_index.json")))
        subs = {"transformer": "dit_high", "transformer_2": "dit_low"}
        for sub, comp in subs.items():
            if mi.get(sub, [None])[0] is None:
                continue
            sd = load_safetensors_dir(os.path.join(d, sub), "diffusion_pytorch_model")
            cfg = json.load(open(os.path.join(d, sub, "config.json")))
            names = dit_official_shapes(dict(dim=cfg["num_attention_heads"] * cfg["attention_head_dim"],
                                             ffn_dim=cfg["ffn_dim"], in_dim=cfg["in_channels"],
                                             out_dim=cfg["out_channels"], num_layers=cfg["num_layers"]))
            for k in names:
                out[(comp, k)] = sd.get(dit_to_diffusers(k))
        sd = load_safetensors_dir(os.path.join(d, "text_encoder"), "model")
        layers = len({k.split(".")[2] for k in sd if k.startswith("encoder.block.")})
        for k in t5_official_shapes(1, 1, 1, 1, layers):
            out[("t5", k)] = sd.get(t5_to_hf(k))
        sd = load_safetensors_dir(os.path.join(d, "vae"), "diffusion_pytorch_model")
        cfg = json.load(open(os.path.join(d, "vae", "config.json")))
        version = 22 if cfg.get("is_residual") else 21
        names = vae_official_shapes(version, cfg["base_dim"], cfg.get("decoder_base_dim") or cfg["base_dim"],
                                    cfg["z_dim"])
        for k in names:
            out[("vae", k)] = sd.get(vae_to_diffusers(k, version))
    else:
        experts = os.path.isdir(os.path.join(d, "high_noise_model"))
        for sub, comp in ([("high_noise_model", "dit_high"), ("low_noise_model", "dit_low")] if experts
                          else [("", "dit_high")]):
            for k, v in load_safetensors_dir(os.path.join(d, sub), "diffusion_pytorch_model").items():
                out[(comp, k)] = v
        for k, v in torch.load(os.path.join(d, "models_t5_umt5-xxl-enc-bf16.pth"), weights_only=True).items():
            out[("t5", k)] = v
        for k, v in torch.load(glob.glob(os.path.join(d, "Wan2.*_VAE.pth"))[0], weights_only=True).items():
            out[("vae", k)] = v
    return out


def compare_layouts(a, b):
    ta, tb = tensors_by_official_name(a), tensors_by_official_name(b)
    check(set(ta) == set(tb), f"compare {a} {b}: different tensor sets")
    diff = [k for k in ta if k in tb and (ta[k] is None or tb[k] is None or not torch.equal(ta[k], tb[k]))]
    if check(not diff, f"compare {a} {b}: {len(diff)} tensors differ, e.g. {diff[:3]}"):
        ok(f"{a} and {b} hold identical tensors ({len(ta)})")
    q = "blocks.0.self_attn.q.weight"
    if ("dit_low", q) in ta:
        check(not torch.equal(ta[("dit_high", q)], ta[("dit_low", q)]),
              f"{a}: the high- and low-noise experts have the same weights")


def check_real_shapes(path):
    """Tensor names and shapes we would write for the real-size configs vs the reference models."""
    from diffusers import AutoencoderKLWan, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel
    spec = json.load(open(path))
    for entry, e in spec.items():
        cfg = {k: v for k, v in e["config"].items() if not k.startswith("_")}
        with torch.device("meta"):
            if e["kind"] == "dit":
                model = WanTransformer3DModel.from_config(cfg)
            elif e["kind"] == "t5":
                model = UMT5EncoderModel(UMT5Config(**cfg))
            else:
                model = AutoencoderKLWan.from_config(cfg)
        ref = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        if e["kind"] == "t5":
            ref.pop("encoder.embed_tokens.weight", None)  # tied to shared.weight, not saved
        compare_names(f"real-size {entry}", {k: torch.empty(v, device="meta") for k, v in e["tensors"].items()}, ref)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="*", help="checkpoint folders to verify")
    ap.add_argument("--compare", nargs=2, action="append", default=[], metavar=("A", "B"),
                    help="the two folders must hold identical tensors (same config and seed)")
    ap.add_argument("--real-shapes", metavar="JSON",
                    help="{entry: {kind, config, tensors: {name: shape}}}: compare with meta-device reference models")
    ap.add_argument("--depth-check", action="store_true", help="bound every block's output std to [1e-3, 1e3]")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    for d in args.dirs:
        try:
            if os.path.exists(os.path.join(d, "model_index.json")):
                verify_diffusers(d, args.depth_check)
            else:
                verify_official(d, args.depth_check)
        except Exception as e:  # a crash is a failed check, reported with its cause
            import traceback
            traceback.print_exc()
            fail(f"{d}: {type(e).__name__}: {e}")
    for a, b in args.compare:
        try:
            compare_layouts(a, b)
        except Exception as e:
            import traceback
            traceback.print_exc()
            fail(f"compare {a} {b}: {type(e).__name__}: {e}")
    if args.real_shapes:
        try:
            check_real_shapes(args.real_shapes)
        except Exception as e:
            import traceback
            traceback.print_exc()
            fail(f"real shapes: {type(e).__name__}: {e}")
    if FAILS:
        print(f"{len(FAILS)} problem(s)")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
