#!/usr/bin/env python3
"""End-to-end oracle for the TI2V-5B pipeline: the official WanTI2V.t2v / .i2v loops around diffusers'
model classes on a tiny checkpoint.

Writes tests/fixtures/ti2v/:
  model/            a diffusers-layout TI2V-5B checkpoint (what `wan generate --model` reads), laid out
                    as the released Wan2.2-TI2V-5B-Diffusers:
    model_index.json                 WanPipeline, expand_timesteps true, boundary_ratio null,
                                     transformer_2 [null, null]
    transformer/                     WanTransformer3DModel, in/out channels 48, otherwise the T2V
                                     fixture's sizes (dim 128 = 1 head of 128, 1 block, ffn 96,
                                     text_dim 24); seeded random weights, bf16-exact, stored as BF16
    text_encoder/, tokenizer/        as tests/fixtures/pipeline (other random weights)
    vae/                             AutoencoderKLWan with the Wan 2.2 structure (z_dim 48, patch 2,
                                     is_residual, 4x16x16; as tests/fixtures/vae/wan22 but narrower:
                                     base_dim 4, decoder_base_dim 4), FP8 E4M3
    scheduler/scheduler_config.json  UniPCMultistepScheduler, flow sigmas, flow_shift 5.0
  image.png                          8-bit RGB, exactly 96x64 (W x H): with max area 96*64 the official
                                     best_output_size is (96, 64), the LANCZOS resize factor is 1 and
                                     the centre crop starts at (0, 0), so the preprocessing is the identity
  prompt_embeds.safetensors, negative_prompt_embeds.safetensors   as tests/fixtures/pipeline
  init_latents.safetensors           "latents" [48, 3, 4, 6] f32 (9 frames of 96x64); in image mode its
                                     latent frame 0 is replaced by the image latent (unused)
  expected_t2v.safetensors           text only: "latents" [48, 3, 4, 6] (final latents of the official
                                     WanTI2V.t2v loop), "video" [3, 9, 64, 96] (Wan 2.2 VAE decode,
                                     clamped to [-1, 1], before quantisation); metadata "settings"
  expected_i2v.safetensors           image mode (WanTI2V.i2v): "latents", "video" likewise, and "z"
                                     [48, 1, 4, 6] (normalised posterior mean of the image)

The oracle loop is written from the official wan/textimage2video.py (spec §7.5.3): per-token timesteps
[1, seq_len] (mask2[0][:, ::2, ::2] * t, flattened in (f, h, w) order; all t in text mode, 0 for the
frame-0 tokens in image mode); in image mode latent frame 0 := z at the start and after EVERY scheduler
step (the scheduler is fed the blended latent); CFG v = v_u + g (v_c - v_u) in fp32 with g = 5; the
official UniPC schedule (sigma_max = float32(0.999), linspace to 0, shift 5: what the engine's
`--schedule official` implements), built with tools/make_sampler_fixtures.py's make_scheduler, which
checks it against the formula (and `--official-scheduler FILE` reruns both loops with the official
FlowUniPCMultistepScheduler class itself and asserts identical latents). 5 steps: timesteps
999 952 882 768 555. Models: diffusers WanTransformer3DModel (per-token timesteps [B, seq_len]) with
the official float64 sinusoidal embedding swapped in (as tools/make_pipeline_fixtures.py); the Wan 2.2
AutoencoderKLWan for encode (posterior mean, (mu - mean) * (1/std)) and decode (z / (1/std) + mean).

For comparison the script also runs diffusers' own pipelines on the same inputs (WanPipeline with
expand_timesteps for text, WanImageToVideoPipeline with expand_timesteps for the image), once on the
official sigma grid and once on diffusers' own (flow_shift 5 on linspace(1, 1/1000)), prints how far
they are from the official loops and records it in the settings metadata. On the official grid both
agree bit for bit (asserted): diffusers blends frame 0 := z only into the model input and once after
the loop, the official loop after every step, but the UniPC update is elementwise and the model only
ever sees frame 0 = z, so frames 1.. cannot tell the difference and frame 0 ends as z either way. The
whole difference of diffusers' TI2V is its sigma grid (timesteps 999 952 882 769 556 here).

Usage: .venv/bin/python3 tools/make_ti2v_fixtures.py [--out DIR] [--official-scheduler fm_solvers_unipc.py]
"""
import argparse
import importlib.util
import json
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_i2v_fixtures as mi  # noqa: E402  (image, text encoder, index and embeddings helpers)
import make_pipeline_fixtures as pf  # noqa: E402  (sizes, random weights, official sinusoid)
import make_sampler_fixtures as msf  # noqa: E402  (official UniPC schedule)
import make_vae_fixtures as mv  # noqa: E402  (Wan 2.2 VAE config and weight init)

DEFAULT_OUT = os.path.join(HERE, "..", "tests", "fixtures", "ti2v")
SEED = 20250802

DIT = dict(pf.DIT, in_channels=48, out_channels=48)
VAE = dict(mv.VARIANTS["wan22"][0], base_dim=4, decoder_base_dim=4)
PROMPT = "A paper boat drifts down a rain-soaked street &amp; ripples   spread in the  puddles"
FLOW_SHIFT = 5.0
STEPS = 5
GUIDE = 5.0
WIDTH, HEIGHT, FRAMES = 96, 64, 9
VAE_STRIDE = (4, 16, 16)
PATCH = (1, 2, 2)


def best_output_size(w, h, dw, dh, expected_area):
    """spec §7.5.3 (official wan/utils/utils.py best_output_size)."""
    ratio = w / h
    ow = (expected_area * ratio) ** 0.5
    oh = expected_area / ow
    ow1 = int(ow // dw * dw)  # width first
    oh1 = int(expected_area / ow1 // dh * dh)
    oh2 = int(oh // dh * dh)  # height first
    ow2 = int(expected_area / oh2 // dw * dw)
    r1, r2 = ow1 / oh1, ow2 / oh2
    return (ow1, oh1) if max(ratio / r1, r1 / ratio) < max(ratio / r2, r2 / ratio) else (ow2, oh2)


def official_preprocess(img, max_area):
    """WanTI2V.i2v's image preparation: best_output_size, LANCZOS resize to cover, centre crop."""
    from PIL import Image

    iw, ih = img.width, img.height
    dh, dw = PATCH[1] * VAE_STRIDE[1], PATCH[2] * VAE_STRIDE[2]
    ow, oh = best_output_size(iw, ih, dw, dh, max_area)
    scale = max(ow / iw, oh / ih)
    img = img.resize((round(iw * scale), round(ih * scale)), Image.LANCZOS)
    x1, y1 = (img.width - ow) // 2, (img.height - oh) // 2
    img = img.crop((x1, y1, x1 + ow, y1 + oh))
    assert img.width == ow and img.height == oh
    return img


def load_official_scheduler_class(path):
    spec = importlib.util.spec_from_file_location("official_fm_solvers_unipc", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.FlowUniPCMultistepScheduler


class OfficialGridUniPC:
    """Mixin for diffusers' UniPCMultistepScheduler: set_timesteps(N) builds the official sigma grid."""

    def set_timesteps(self, num_inference_steps=None, device=None, sigmas=None, mu=None):
        grid = msf.official_schedule("unipc", num_inference_steps, 1.0)  # unshifted; flow_shift applies
        super().set_timesteps(sigmas=grid, device=device)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--official-scheduler", default=None,
                    help="path of the official wan/utils/fm_solvers_unipc.py: rerun with its scheduler and compare")
    args = ap.parse_args()
    torch.set_num_threads(2)
    from diffusers import (AutoencoderKLWan, UniPCMultistepScheduler, WanImageToVideoPipeline, WanPipeline,
                           WanTransformer3DModel)

    out = os.path.abspath(args.out)
    model_dir = os.path.join(out, "model")
    gen = torch.Generator().manual_seed(SEED)

    model = WanTransformer3DModel(**DIT).float().eval()
    pf.randomize_dit(model, gen)
    model = pf.save_component(model, os.path.join(model_dir, "transformer"))
    vae = AutoencoderKLWan(**VAE).eval()
    mv.init_weights(vae, gen, torch.float8_e4m3fn)
    vae = pf.save_component(vae, os.path.join(model_dir, "vae"), dtype=torch.float8_e4m3fn)
    tokenizer, t5 = mi.build_text(model_dir, gen)
    scheduler_kw = dict(num_train_timesteps=1000, solver_order=2, prediction_type="flow_prediction",
                        use_flow_sigmas=True, flow_shift=FLOW_SHIFT, predict_x0=True, solver_type="bh2",
                        lower_order_final=True, final_sigmas_type="zero")
    UniPCMultistepScheduler(**scheduler_kw).save_pretrained(os.path.join(model_dir, "scheduler"))
    mi.write_index(model_dir, {
        "_class_name": "WanPipeline",
        "boundary_ratio": None,
        "expand_timesteps": True,
        "scheduler": ["diffusers", "UniPCMultistepScheduler"],
        "text_encoder": ["transformers", "UMT5EncoderModel"],
        "tokenizer": ["transformers", "T5Tokenizer"],
        "transformer": ["diffusers", "WanTransformer3DModel"],
        "transformer_2": [None, None],
        "vae": ["diffusers", "AutoencoderKLWan"],
    })

    image = mi.write_image(os.path.join(out, "image.png"), gen, WIDTH, HEIGHT)
    t_lat, h_lat, w_lat = (FRAMES - 1) // 4 + 1, HEIGHT // 16, WIDTH // 16
    init = torch.randn(48, t_lat, h_lat, w_lat, generator=gen)

    pipe = WanPipeline(tokenizer=tokenizer, text_encoder=t5, vae=vae, scheduler=UniPCMultistepScheduler(**scheduler_kw),
                       transformer=model, expand_timesteps=True)
    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad():
        cond_p, uncond_p = pipe.encode_prompt(PROMPT, pf.DEFAULT_NEG, do_classifier_free_guidance=True,
                                             max_sequence_length=pf.TEXT_LEN)
    cond, uncond = pf.trim(cond_p[0]), pf.trim(uncond_p[0])
    assert torch.equal(pf.padded(cond), cond_p) and torch.equal(pf.padded(uncond), uncond_p)
    print(f"prompt: {cond.shape[0]} tokens, negative prompt: {uncond.shape[0]} tokens")

    # Image mode preprocessing (official) is the identity on this image; z = normalised posterior mean.
    prepped = official_preprocess(image, max_area=WIDTH * HEIGHT)
    assert prepped.size == image.size and np.array_equal(np.array(prepped), np.array(image)), "preprocess moved pixels"
    mean, inv_std = mi.latent_stats(vae)
    with torch.no_grad():
        mu = vae.encode(mi.official_image_tensor(prepped)[None, :, None]).latent_dist.mean
    z = ((mu - mean) * inv_std)[0]
    assert z.shape == (48, 1, h_lat, w_lat), z.shape

    seen = []
    model.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["timestep"].clone()), with_kwargs=True)

    def official_loop(image_latent=None, scheduler_cls=None):
        """WanTI2V.t2v (image_latent None) / WanTI2V.i2v."""
        seen.clear()
        if scheduler_cls is None:
            sch, _, timesteps = msf.make_scheduler("unipc", "official", STEPS, FLOW_SHIFT)
            timesteps = torch.from_numpy(timesteps)
        else:
            sch = scheduler_cls(num_train_timesteps=1000, shift=1, use_dynamic_shifting=False)
            sch.set_timesteps(STEPS, device="cpu", shift=FLOW_SHIFT)
            timesteps = sch.timesteps
        mask2 = torch.ones_like(init)
        latent = init.clone()
        if image_latent is not None:
            mask2[:, 0] = 0
            latent = (1.0 - mask2) * image_latent + mask2 * latent
        ctx, ctx_null = pf.padded(cond), pf.padded(uncond)
        with torch.no_grad():
            for t in timesteps:
                temp_ts = (mask2[0][:, ::2, ::2] * torch.stack([t])).flatten()
                timestep = temp_ts.unsqueeze(0)  # [1, seq_len]; seq_len is the token count (no padding)
                v_c = model(hidden_states=latent[None], timestep=timestep, encoder_hidden_states=ctx,
                            return_dict=False)[0]
                v_u = model(hidden_states=latent[None], timestep=timestep, encoder_hidden_states=ctx_null,
                            return_dict=False)[0]
                v = v_u + GUIDE * (v_c - v_u)
                latent = sch.step(v, t, latent[None], return_dict=False)[0][0]
                if image_latent is not None:
                    latent = (1.0 - mask2) * image_latent + mask2 * latent
        return latent, [int(t) for t in timesteps]

    def decode(latent):
        with torch.no_grad():
            return vae.decode(latent[None] / inv_std + mean, return_dict=False)[0][0]

    own_proj = model.condition_embedder.timesteps_proj
    results = {}
    ts = None
    for name, zz in (("t2v", None), ("i2v", z)):
        fp32_latents, _ = official_loop(zz)
        model.condition_embedder.timesteps_proj = pf.OfficialTimesteps()
        latents, ts = official_loop(zz)
        assert ts == [999, 952, 882, 768, 555], ts
        # Per-token timesteps: [1, seq_len], frame-0 tokens at 0 in image mode, t elsewhere.
        per_frame = (h_lat // 2) * (w_lat // 2)
        assert len(seen) == 2 * STEPS and all(s.shape == (1, t_lat * per_frame) for s in seen)
        for i, t in enumerate(ts):
            s = seen[2 * i][0]
            assert torch.equal(seen[2 * i], seen[2 * i + 1])
            assert torch.all(s[per_frame:] == t) and torch.all(s[:per_frame] == (t if zz is None else 0)), (i, s)
        if args.official_scheduler:
            ref, ref_ts = official_loop(zz, load_official_scheduler_class(args.official_scheduler))
            assert ref_ts == ts and torch.equal(ref, latents), (ref - latents).abs().max()
            print(f"{name}: the official FlowUniPCMultistepScheduler gives bit-identical latents")
        model.condition_embedder.timesteps_proj = own_proj
        if zz is not None:
            assert torch.equal(latents[:, :1], zz)
        d = ((latents - fp32_latents).abs().max() / latents.abs().max()).item()
        print(f"{name}: final latents max|x| {latents.abs().max():.3f}; diffusers fp32 sinusoid would move them "
              f"by {d:.1e} rel")
        video = decode(latents)
        assert video.shape == (3, FRAMES, HEIGHT, WIDTH), video.shape
        clamped = (video.abs() >= 1).float().mean().item()
        print(f"{name}: video {tuple(video.shape)}, fraction at the clamp {clamped:.3f}")
        assert clamped < 0.5, "most of the video should be inside (-1, 1)"
        results[name] = (latents, video)
    d = (results["t2v"][0][:, 1:] - results["i2v"][0][:, 1:]).abs().max().item()
    print(f"image mode changes latent frames 1.. by max|diff| {d:.3f}")
    assert d > 1e-2

    # diffusers' own pipelines on the same inputs (official sinusoid swapped in as well).
    model.condition_embedder.timesteps_proj = pf.OfficialTimesteps()
    i2v_pipe = WanImageToVideoPipeline(tokenizer=tokenizer, text_encoder=t5, vae=vae,
                                       scheduler=UniPCMultistepScheduler(**scheduler_kw), image_processor=None,
                                       image_encoder=None, transformer=model, transformer_2=None,
                                       boundary_ratio=None, expand_timesteps=True)
    i2v_pipe.set_progress_bar_config(disable=True)
    official_grid = type("OfficialGridUniPC", (OfficialGridUniPC, UniPCMultistepScheduler), {})
    comparison = {}
    for grid_name, cls in (("official grid", official_grid), ("diffusers grid", UniPCMultistepScheduler)):
        for name, p, extra in (("t2v", pipe, {}), ("i2v", i2v_pipe, dict(image=image))):
            p.scheduler = cls(**scheduler_kw)
            seen.clear()
            with torch.no_grad():
                lat = p(prompt=PROMPT, negative_prompt=pf.DEFAULT_NEG, latents=init[None].clone(), height=HEIGHT,
                        width=WIDTH, num_frames=FRAMES, num_inference_steps=STEPS, guidance_scale=GUIDE,
                        max_sequence_length=pf.TEXT_LEN, output_type="latent", return_dict=False, **extra)[0][0]
            pts = [int(s[0, -1]) for s in seen[::2]]
            ref_lat, ref_video = results[name]
            video = decode(lat)
            scale = ref_lat.abs().max().item()
            dl = (lat - ref_lat).abs()
            dv = (video - ref_video).abs()
            line = (f"diffusers {type(p).__name__} ({grid_name}, timesteps {pts}) vs official {name}: latents "
                    f"max|diff| {dl.max():.3e} ({dl.max() / scale:.1e} rel), per latent frame "
                    f"[{', '.join(f'{x:.3e}' for x in dl.amax(dim=(0, 2, 3)).tolist())}]; video max|diff| "
                    f"{dv.max():.3e}, mean|diff| {dv.mean():.3e}")
            print(line)
            comparison[f"{name}, {grid_name}"] = dict(
                timesteps=pts, latents_max_abs=dl.max().item(), latents_max_rel=(dl.max() / scale).item(),
                latents_max_abs_per_frame=dl.amax(dim=(0, 2, 3)).tolist(), video_max_abs=dv.max().item(),
                video_mean_abs=dv.mean().item())
            if grid_name == "official grid":
                assert dl.max() == 0, f"diffusers' {name} loop should be the official one on the same grid"
    model.condition_embedder.timesteps_proj = own_proj

    mi.save_embeds(out, cond, uncond)
    save_file({"latents": init.contiguous()}, os.path.join(out, "init_latents.safetensors"))
    for name in ("t2v", "i2v"):
        latents, video = results[name]
        settings = dict(prompt=PROMPT, steps=STEPS, guide_scale=GUIDE, width=WIDTH, height=HEIGHT, frames=FRAMES,
                        shift=FLOW_SHIFT, schedule="official", timesteps=ts, image="image.png" if name == "i2v" else None,
                        diffusers_comparison={k.split(", ")[1]: v for k, v in comparison.items() if k.startswith(name)})
        tensors = {"latents": latents.contiguous(), "video": video.contiguous()}
        if name == "i2v":
            tensors["z"] = z.contiguous()
        save_file(tensors, os.path.join(out, f"expected_{name}.safetensors"), metadata={"settings": json.dumps(settings)})
    print(f"timesteps {ts}")
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(out) for f in fs)
    print(f"wrote {out} ({total / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
