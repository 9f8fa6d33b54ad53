#!/usr/bin/env python3
"""Oracle fixtures for the LoRA reader and merge (src/lora): diffusers' own LoRA loading and fusing.

(Re)writes tests/fixtures/lora/:
  native.safetensors   ComfyUI / official form: "diffusion_model." + official names, lora_down/lora_up
                       (BF16) with .alpha on the block modules, head.head.diff + diff_b (the LightX2V
                       form), text_embedding.0 / time_projection.1 LoRAs without alpha, diff_b biases.
  kohya.safetensors    musubi-tuner form: lora_unet_blocks_N_{self_attn,cross_attn}_{q,k,v,o}, ffn_{0,2},
                       lora_down/lora_up (F16) + alpha, on every block module (diffusers' converter needs all).
  peft.safetensors     diffusers / PEFT form written by WanPipeline.save_lora_weights: "transformer." +
                       diffusers names, lora_A/lora_B (F32), lora_B.bias, a Conv3d LoRA on patch_embedding,
                       and the LoraConfig (lora_alpha 8, r 4, one alpha_pattern) in the metadata key
                       "lora_adapter_metadata".
  oracle.safetensors   inputs "x" [1, 16, 2, 4, 6], "t" [1], "context" [1, 5, 32], "context_lens" (I64), and
                       per case the fp32 velocity of the fused transformer: "base" (no LoRA), "native",
                       "kohya", "peft", "stack" (native + kohya as two adapters); metadata "cases": JSON list of
                       {name, loras: [[file, strength], ...]}.
The base model is tests/fixtures/tiny_dit/transformer (not copied). Every LoRA goes through
WanPipeline.load_lora_weights (diffusers' key conversion, PEFT injection) and fuse_lora, with the LoRA
weights kept in fp32 (low_cpu_mem_usage=False: PEFT would otherwise round the fused delta to the
factors' bf16/f16). The sinusoidal time embedding is the official float64 one, as in make_fixtures.py.

--e2e additionally writes e2e/: the tiny pipeline of tests/fixtures/pipeline/model with a LoRA on each
expert (high.safetensors native form, low.safetensors kohya form), a 2-step run with output_type="latent",
"latents" in e2e/expected.safetensors and the exact settings in its metadata.
"""
import argparse
import json
import os
import sys

import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_fixtures as mf  # noqa: E402  (the tiny DiT's config and its official-sinusoid oracle)

mf.torch = torch
FIX = os.path.join(HERE, "..", "tests", "fixtures")
DEFAULT_OUT = os.path.join(FIX, "lora")
SEED = 20250811
RANK, ALPHA = 4, 2.0


def rnd(gen, *shape, std=1.0):
    return torch.randn(*shape, generator=gen) * std


def pair(gen, out, inn, dtype):
    """(up [out, r], down [r, in]) rounded to `dtype`, sized so scale·up@down is ~0.3 of a weight."""
    down = rnd(gen, RANK, inn, std=1.0 / inn**0.5)
    up = rnd(gen, out, RANK, std=0.6 / RANK**0.5)
    return up.to(dtype), down.to(dtype)


def block_modules(cfg):
    mods = []
    for i in range(cfg["num_layers"]):
        for a in ("self_attn", "cross_attn"):
            mods += [f"blocks.{i}.{a}.{p}" for p in "qkvo"]
        mods += [f"blocks.{i}.ffn.0", f"blocks.{i}.ffn.2"]
    return mods


def module_shape(sd_official, m):
    return tuple(sd_official[m + ".weight"].shape)


def official_state(model):
    return {mf_name: model.state_dict()[mf.official_to_diffusers(mf_name)]
            for mf_name in mf.official_names(mf.CONFIG["num_layers"])}


def write_native(path, gen, sdo):
    t = {}
    for m in block_modules(mf.CONFIG):
        out, inn = module_shape(sdo, m)
        up, down = pair(gen, out, inn, torch.bfloat16)
        t[f"diffusion_model.{m}.lora_up.weight"] = up
        t[f"diffusion_model.{m}.lora_down.weight"] = down
        t[f"diffusion_model.{m}.alpha"] = torch.tensor(ALPHA)
    for m in ("text_embedding.0", "time_projection.1"):  # no alpha: scale = strength
        out, inn = module_shape(sdo, m)
        up, down = pair(gen, out, inn, torch.bfloat16)
        t[f"diffusion_model.{m}.lora_up.weight"] = up
        t[f"diffusion_model.{m}.lora_down.weight"] = down
    for m in [m for m in ("blocks.0.self_attn.q", "blocks.1.ffn.2", "blocks.0.cross_attn.o", "time_projection.1")
              if m + ".bias" in sdo]:
        t[f"diffusion_model.{m}.diff_b"] = rnd(gen, sdo[m + ".bias"].shape[0], std=0.05).to(torch.bfloat16)
    out, inn = module_shape(sdo, "head.head")  # LightX2V's distill LoRAs: a full head delta
    t["diffusion_model.head.head.diff"] = rnd(gen, out, inn, std=0.3 / inn**0.5).to(torch.bfloat16)
    t["diffusion_model.head.head.diff_b"] = rnd(gen, out, std=0.05).to(torch.bfloat16)
    save_file({k: v.contiguous() for k, v in t.items()}, path)


def write_kohya(path, gen, sdo):
    t = {}
    for m in block_modules(mf.CONFIG):
        out, inn = module_shape(sdo, m)
        up, down = pair(gen, out, inn, torch.float16)
        k = "lora_unet_" + m.replace(".", "_")
        t[f"{k}.lora_up.weight"] = up
        t[f"{k}.lora_down.weight"] = down
        t[f"{k}.alpha"] = torch.tensor(ALPHA, dtype=torch.float16)
    save_file({k: v.contiguous() for k, v in t.items()}, path)


def write_peft(out_dir, gen, model):
    from diffusers import WanPipeline
    from peft import LoraConfig

    sd = model.state_dict()
    mods = ["blocks.0.attn1.to_q", "blocks.0.attn1.to_k", "blocks.0.attn1.to_v", "blocks.0.attn1.to_out.0",
            "blocks.1.attn2.to_k", "blocks.1.attn2.to_v", "blocks.1.ffn.net.0.proj", "blocks.0.ffn.net.2",
            "proj_out", "condition_embedder.time_proj", "condition_embedder.text_embedder.linear_2"]
    t = {}
    for m in mods:
        out, inn = sd[m + ".weight"].shape
        up, down = pair(gen, out, inn, torch.float32)
        t[f"{m}.lora_A.weight"], t[f"{m}.lora_B.weight"] = down, up
        t[f"{m}.lora_B.bias"] = rnd(gen, out, std=0.05)
    w = sd["patch_embedding.weight"]  # Conv3d [D, C, 1, 2, 2]: lora_A a conv of the same kernel, lora_B 1x1x1
    t["patch_embedding.lora_A.weight"] = rnd(gen, RANK, *w.shape[1:], std=1.0 / w[0].numel() ** 0.5)
    t["patch_embedding.lora_B.weight"] = rnd(gen, w.shape[0], RANK, 1, 1, 1, std=0.6 / RANK**0.5)
    t["patch_embedding.lora_B.bias"] = rnd(gen, w.shape[0], std=0.05)
    targets = sorted({k.split(".lora_")[0] for k in t})
    cfg = LoraConfig(r=RANK, lora_alpha=8, target_modules=targets, lora_bias=True,
                     alpha_pattern={"blocks.1.attn2.to_k": 2}).to_dict()
    cfg = {k: (sorted(v) if isinstance(v, set) else v) for k, v in cfg.items()}
    WanPipeline.save_lora_weights(out_dir, transformer_lora_layers={k: v.contiguous() for k, v in t.items()},
                                  transformer_lora_adapter_metadata=cfg, weight_name="peft.safetensors")


def pipeline_of(transformer, transformer_2=None):
    from diffusers import WanPipeline

    return WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=None, transformer=transformer,
                       transformer_2=transformer_2)


def fused(base_state, loras, out_dir):
    """A fresh copy of the tiny transformer with `loras` [(file, strength)] loaded and fused by diffusers."""
    from diffusers import WanTransformer3DModel

    model = WanTransformer3DModel(**mf.CONFIG).float().eval()
    model.load_state_dict(base_state)
    if not loras:
        return model
    pipe = pipeline_of(model)
    names = []
    for i, (f, _) in enumerate(loras):
        pipe.load_lora_weights(os.path.join(out_dir, f), adapter_name=f"a{i}", low_cpu_mem_usage=False)
        names.append(f"a{i}")
    for n, p in model.named_parameters():
        assert "lora_" not in n or p.dtype == torch.float32, (n, p.dtype)
    pipe.set_adapters(names, [s for _, s in loras])
    pipe.fuse_lora(components=["transformer"], lora_scale=1.0, adapter_names=names)
    pipe.unload_lora_weights()  # the fused weights stay; PEFT's layers go
    return model


def forward(model, x, t, ctx):
    own = model.condition_embedder.timesteps_proj
    model.condition_embedder.timesteps_proj = mf.official_timesteps_module()
    out, _ = mf.run(model, x, t, ctx, False)
    model.condition_embedder.timesteps_proj = own
    return out


def write_fixtures(out_dir):
    from diffusers import WanTransformer3DModel
    from diffusers.utils import logging as dlog

    dlog.set_verbosity_error()
    os.makedirs(out_dir, exist_ok=True)
    base = WanTransformer3DModel.from_pretrained(os.path.join(FIX, "tiny_dit", "transformer")).float().eval()
    base_state = {k: v.clone() for k, v in base.state_dict().items()}
    gen = torch.Generator().manual_seed(SEED)
    sdo = official_state(base)
    write_native(os.path.join(out_dir, "native.safetensors"), gen, sdo)
    write_kohya(os.path.join(out_dir, "kohya.safetensors"), gen, sdo)
    write_peft(out_dir, gen, base)

    x = torch.randn(1, 16, 2, 4, 6, generator=gen)
    t = torch.tensor([700], dtype=torch.int64)
    ctx = torch.randn(1, 5, mf.CONFIG["text_dim"], generator=gen)
    cases = [("base", []), ("native", [("native.safetensors", 0.8)]), ("kohya", [("kohya.safetensors", 1.0)]),
             ("peft", [("peft.safetensors", 1.3)]),
             ("stack", [("native.safetensors", 0.8), ("kohya.safetensors", 0.5)])]
    tensors = {"x": x, "t": t.to(torch.float32), "context": ctx, "context_lens": torch.tensor([5])}
    ref = None
    for name, loras in cases:
        out = forward(fused(base_state, loras, out_dir), x, t, ctx)
        tensors[name] = out
        ref = out if ref is None else ref
        print(f"{name}: max|out| {out.abs().max():.3f}, max|out - base| / max|base| "
              f"{((out - ref).abs().max() / ref.abs().max()).item():.3f}")
    meta = [dict(name=n, loras=[[f, s] for f, s in l]) for n, l in cases]
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out_dir, "oracle.safetensors"),
              metadata={"cases": json.dumps(meta)})
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(out_dir) for f in fs)
    print(f"wrote {out_dir} ({total / 1e6:.2f} MB)")


def write_e2e(out_dir):
    """WanPipeline on the tiny pipeline fixture with a LoRA fused into each expert; 2 steps, latents."""
    import make_pipeline_fixtures as mp
    from diffusers import UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    from safetensors.torch import load_file

    e2e = os.path.join(out_dir, "e2e")
    os.makedirs(e2e, exist_ok=True)
    pdir = os.path.join(FIX, "pipeline")
    model = os.path.join(pdir, "model")
    experts = [WanTransformer3DModel.from_pretrained(os.path.join(model, s)).float().eval()
               for s in ("transformer", "transformer_2")]
    gen = torch.Generator().manual_seed(SEED + 1)
    sdo = official_state_of(experts[0], mp.DIT["num_layers"])
    saved_cfg = dict(mf.CONFIG)
    mf.CONFIG.update(num_layers=mp.DIT["num_layers"])  # block_modules() reads the layer count
    write_native(os.path.join(e2e, "high.safetensors"), gen, sdo)
    write_kohya(os.path.join(e2e, "low.safetensors"), gen, official_state_of(experts[1], mp.DIT["num_layers"]))
    mf.CONFIG.clear()
    mf.CONFIG.update(saved_cfg)
    strength_high, strength_low, steps = 0.9, 0.7, 2
    scheduler = UniPCMultistepScheduler.from_pretrained(os.path.join(model, "scheduler"))
    pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=scheduler, transformer=experts[0],
                       transformer_2=experts[1], boundary_ratio=mp.BOUNDARY)
    pipe.set_progress_bar_config(disable=True)
    pipe.load_lora_weights(os.path.join(e2e, "high.safetensors"), adapter_name="high", low_cpu_mem_usage=False)
    pipe.load_lora_weights(os.path.join(e2e, "low.safetensors"), adapter_name="low", low_cpu_mem_usage=False,
                           load_into_transformer_2=True)
    pipe.fuse_lora(components=["transformer"], lora_scale=strength_high, adapter_names=["high"])
    pipe.fuse_lora(components=["transformer_2"], lora_scale=strength_low, adapter_names=["low"])
    pipe.unload_lora_weights()
    for e in experts:
        e.condition_embedder.timesteps_proj = mp.OfficialTimesteps()
    cond = load_file(os.path.join(pdir, "prompt_embeds.safetensors"))["prompt_embeds"]
    uncond = load_file(os.path.join(pdir, "negative_prompt_embeds.safetensors"))["prompt_embeds"]
    init = load_file(os.path.join(pdir, "init_latents.safetensors"))["latents"]
    seen = []
    hooks = [e.register_forward_pre_hook(lambda m, a, kw, i=i: seen.append(i), with_kwargs=True)
             for i, e in enumerate(experts)]
    with torch.no_grad():
        latents = pipe(prompt_embeds=mp.padded(cond), negative_prompt_embeds=mp.padded(uncond), latents=init[None].clone(),
                       height=mp.HEIGHT, width=mp.WIDTH, num_frames=mp.FRAMES, num_inference_steps=steps,
                       guidance_scale=mp.GUIDE_HIGH, guidance_scale_2=mp.GUIDE_LOW, max_sequence_length=mp.TEXT_LEN,
                       output_type="latent", return_dict=False)[0]
    for h in hooks:
        h.remove()
    assert sorted(set(seen)) == [0, 1], seen  # both experts (and so both LoRAs) ran
    ts = [int(t) for t in scheduler.timesteps]
    settings = dict(model="tests/fixtures/pipeline/model", prompt_embeds="tests/fixtures/pipeline/prompt_embeds.safetensors",
                    negative_prompt_embeds="tests/fixtures/pipeline/negative_prompt_embeds.safetensors",
                    init_latents="tests/fixtures/pipeline/init_latents.safetensors", steps=steps,
                    guide_high=mp.GUIDE_HIGH, guide_low=mp.GUIDE_LOW, width=mp.WIDTH, height=mp.HEIGHT,
                    frames=mp.FRAMES, flow_shift=mp.FLOW_SHIFT, boundary=mp.BOUNDARY, timesteps=ts,
                    lora_high=["high.safetensors", strength_high], lora_low=["low.safetensors", strength_low],
                    schedule="diffusers", time_embedding="official float64 sinusoid")
    save_file({"latents": latents[0].contiguous()}, os.path.join(e2e, "expected.safetensors"),
              metadata={"settings": json.dumps(settings)})
    print(f"e2e: timesteps {ts}, experts {seen}, max|latents| {latents.abs().max():.3f}")


def official_state_of(model, num_layers):
    return {n: model.state_dict()[mf.official_to_diffusers(n)] for n in mf.official_names(num_layers)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT, help="fixture folder to (re)write")
    ap.add_argument("--e2e", action="store_true", help="also write the end-to-end pipeline case in <out>/e2e")
    a = ap.parse_args()
    torch.set_num_threads(2)
    write_fixtures(a.out)
    if a.e2e:
        write_e2e(a.out)
    for root, _, files in os.walk(a.out):  # safetensors writes 0600; fixtures are read by everyone
        for f in files:
            os.chmod(os.path.join(root, f), 0o644)


if __name__ == "__main__":
    main()
