#!/usr/bin/env python3
"""End-to-end oracle for the I2V-A14B pipeline: diffusers WanImageToVideoPipeline on a tiny checkpoint.

Writes tests/fixtures/i2v/:
  model/            a diffusers-layout I2V-A14B checkpoint (what `wan generate --model` reads):
    model_index.json                 WanImageToVideoPipeline, boundary_ratio 0.9, expand_timesteps
                                     false, image_encoder / image_processor null (as in the released
                                     Wan2.2-I2V-A14B-Diffusers: Wan 2.2 has no CLIP image encoder)
    transformer/, transformer_2/     WanTransformer3DModel high- and low-noise experts: in_channels 36
                                     (16 noisy latent + 4 mask + 16 image latent), out_channels 16,
                                     otherwise the T2V fixture's sizes (dim 128 = 1 head of 128, 1 block,
                                     ffn 96, text_dim 24, image_dim None); different seeded random
                                     weights, bf16-exact, stored as BF16
    text_encoder/, tokenizer/        as tests/fixtures/pipeline (UMT5EncoderModel d_model 24, BF16; the
                                     tests' SentencePiece tokenizer), other random weights
    vae/                             AutoencoderKLWan (Wan 2.1 structure, base_dim 4), FP8 E4M3
    scheduler/scheduler_config.json  UniPCMultistepScheduler, flow sigmas, flow_shift 5.0
  image.png, last_image.png          8-bit RGB, exactly 64x48 (W x H): the run's size, so every resize
                                     on the way (official bicubic F.interpolate, diffusers' PIL resize)
                                     is the identity
  prompt_embeds.safetensors          "prompt_embeds" [L, 24] f32 (the prompt in the settings, trimmed to
                                     its real tokens); negative_prompt_embeds.safetensors: the same for
                                     the official default negative prompt (tests/fixtures/pipeline's format)
  init_latents.safetensors           "latents" [16, 3, 6, 8] f32 (9 frames of 64x48)
  expected.safetensors               image only:
                                     "latents" [16, 3, 6, 8] f32: WanImageToVideoPipeline(output_type="latent")
                                     "video" [3, 9, 48, 64] f32: vae.decode of them as the pipeline does it
                                       (z / (1/std) + mean; AutoencoderKLWan clamps to [-1, 1]), before the
                                       video processor's quantisation
                                     "y" [20, 3, 6, 8] f32: the conditioning, built by the official
                                       WanI2V.generate recipe (spec §7.5.2) and checked equal to what the
                                       pipeline concatenates to the noisy latents
                                     metadata "settings": JSON of the run
  expected_last.safetensors          the same run with last_image (diffusers' first-last-frame
                                     conditioning; "y" by the official Wan 2.1 FLF2V recipe)

The run: 4 UniPC steps on diffusers' flow grid with flow_shift 5 give timesteps 999, 937 (>= 900:
high-noise expert `transformer`, guidance_scale 4.0) and 833, 625 (low-noise `transformer_2`,
guidance_scale_2 3.0); CFG with prompts of different lengths; the same y in both CFG passes.
The pipeline runs from the prompt TEXT; the script checks that the stored embeddings (zero-padded to
512 rows) give bit-identical latents, so the expected files serve --prompt and --prompt-embeds alike.

Numerics of the oracle: diffusers fp32 throughout, with the official float64 sinusoidal timestep
embedding swapped in (as tools/make_pipeline_fixtures.py does); the script prints how much diffusers'
own fp32 embedding would have moved the result.

Usage: .venv/bin/python3 tools/make_i2v_fixtures.py [--out DIR]
"""
import argparse
import json
import os
import shutil
import sys

import numpy as np
import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_pipeline_fixtures as pf  # noqa: E402  (the T2V oracle: sizes, random weights, helpers)

DEFAULT_OUT = os.path.join(HERE, "..", "tests", "fixtures", "i2v")
SEED = 20250801

DIT = dict(pf.DIT, in_channels=36, out_channels=16)
PROMPT = "The fox in the picture lifts its head, turns toward the camera &amp; snow  starts   falling"
FLOW_SHIFT = 5.0
BOUNDARY = 0.9
STEPS = 4
GUIDE_HIGH, GUIDE_LOW = 4.0, 3.0
WIDTH, HEIGHT, FRAMES = 64, 48, 9
VAE_STRIDE = (4, 8, 8)


def smooth_image(gen, width, height):
    """A smooth random RGB picture (bicubic blow-up of a coarse random grid plus a little grain), uint8."""
    coarse = torch.rand(1, 3, 3, 4, generator=gen, dtype=torch.float64)
    img = torch.nn.functional.interpolate(coarse, size=(height, width), mode="bicubic", align_corners=True)[0]
    img = img + 0.02 * torch.randn(img.shape, generator=gen, dtype=torch.float64)
    img = (img.clamp(0, 1) * 215 + 20).round().to(torch.uint8)
    return img.permute(1, 2, 0).contiguous().numpy()  # [H, W, 3]


def write_image(path, gen, width, height):
    """Write a PNG and return it read back (the oracle uses the file's pixels)."""
    from PIL import Image

    Image.fromarray(smooth_image(gen, width, height), mode="RGB").save(path, format="PNG")
    img = Image.open(path)
    img.load()
    assert img.mode == "RGB" and img.size == (width, height), (img.mode, img.size)
    return img


def official_image_tensor(img):
    """TF.to_tensor(img).sub_(0.5).div_(0.5): [3, H, W] f32 in [-1, 1]."""
    x = torch.from_numpy(np.array(img)).permute(2, 0, 1).contiguous().float().div(255)
    return x.sub_(0.5).div_(0.5)


def build_text(model_dir, gen):
    """tokenizer/ (copied from the tests' tokenizer) and a random UMT5 text_encoder/, as the T2V fixture."""
    from transformers import AutoTokenizer, UMT5Config, UMT5EncoderModel

    tok_dir = os.path.join(model_dir, "tokenizer")
    os.makedirs(tok_dir, exist_ok=True)
    for f in pf.TOKENIZER_FILES:
        shutil.copyfile(os.path.join(pf.TOKENIZER_SRC, f), os.path.join(tok_dir, f))
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    t5 = UMT5EncoderModel(UMT5Config(vocab_size=len(tokenizer), **pf.UMT5)).eval()
    pf.randomize_umt5(t5, gen)
    t5 = pf.save_component(t5, os.path.join(model_dir, "text_encoder"), file="model.safetensors")
    return tokenizer, t5


def write_index(model_dir, index):
    import diffusers

    index = dict(index, _diffusers_version=diffusers.__version__)
    with open(os.path.join(model_dir, "model_index.json"), "w") as f:
        json.dump(index, f, indent=2, sort_keys=True)
        f.write("\n")


def save_embeds(out, cond, uncond):
    save_file({"prompt_embeds": cond.contiguous()}, os.path.join(out, "prompt_embeds.safetensors"))
    save_file({"prompt_embeds": uncond.contiguous()}, os.path.join(out, "negative_prompt_embeds.safetensors"))


def latent_stats(vae):
    z = vae.config.z_dim
    mean = torch.tensor(vae.config.latents_mean).view(1, z, 1, 1, 1).float()
    inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, z, 1, 1, 1).float()
    return mean, inv_std


def official_y(vae, image, last_image=None):
    """The conditioning of the official WanI2V.generate (Wan 2.2, spec §7.5.2), or with last_image that of
    the Wan 2.1 WanFLF2V.generate: mask [4, T_lat, h, w] then the normalised VAE mean of
    [image, zeros x (F-1)] (resp. [image, zeros x (F-2), last_image]), each image resized bicubically
    (F.interpolate on the [-1, 1] tensor) to (H, W)."""
    F_, (H, W) = FRAMES, (HEIGHT, WIDTH)
    lat_h, lat_w = H // VAE_STRIDE[1], W // VAE_STRIDE[2]

    def resized(img):
        x = official_image_tensor(img)
        r = torch.nn.functional.interpolate(x[None], size=(H, W), mode="bicubic")
        assert torch.equal(r[0], x), "the image is not exactly the run's size"
        return r.transpose(0, 1)  # [3, 1, H, W]

    msk = torch.ones(1, F_, lat_h, lat_w)
    if last_image is None:
        msk[:, 1:] = 0
        frames = [resized(image), torch.zeros(3, F_ - 1, H, W)]
    else:
        msk[:, 1:-1] = 0
        frames = [resized(image), torch.zeros(3, F_ - 2, H, W), resized(last_image)]
    msk = torch.concat([torch.repeat_interleave(msk[:, 0:1], repeats=4, dim=1), msk[:, 1:]], dim=1)
    msk = msk.view(1, msk.shape[1] // 4, 4, lat_h, lat_w).transpose(1, 2)[0]
    video = torch.concat(frames, dim=1)
    mean, inv_std = latent_stats(vae)
    with torch.no_grad():
        mu = vae.encode(video[None]).latent_dist.mean
    lat = ((mu - mean) * inv_std)[0]
    return torch.concat([msk, lat])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args()
    torch.set_num_threads(2)
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanImageToVideoPipeline, WanTransformer3DModel

    out = os.path.abspath(args.out)
    model_dir = os.path.join(out, "model")
    gen = torch.Generator().manual_seed(SEED)

    experts = []
    for sub in ("transformer", "transformer_2"):
        m = WanTransformer3DModel(**DIT).float().eval()
        pf.randomize_dit(m, gen)
        experts.append(pf.save_component(m, os.path.join(model_dir, sub)))
    vae = AutoencoderKLWan(**pf.VAE).eval()
    pf.randomize_vae(vae, gen)
    vae = pf.save_component(vae, os.path.join(model_dir, "vae"), dtype=torch.float8_e4m3fn)
    tokenizer, t5 = build_text(model_dir, gen)
    scheduler = UniPCMultistepScheduler(num_train_timesteps=1000, solver_order=2, prediction_type="flow_prediction",
                                        use_flow_sigmas=True, flow_shift=FLOW_SHIFT, predict_x0=True,
                                        solver_type="bh2", lower_order_final=True, final_sigmas_type="zero")
    scheduler.save_pretrained(os.path.join(model_dir, "scheduler"))
    write_index(model_dir, {
        "_class_name": "WanImageToVideoPipeline",
        "boundary_ratio": BOUNDARY,
        "expand_timesteps": False,
        "image_encoder": [None, None],
        "image_processor": [None, None],
        "scheduler": ["diffusers", "UniPCMultistepScheduler"],
        "text_encoder": ["transformers", "UMT5EncoderModel"],
        "tokenizer": ["transformers", "T5Tokenizer"],
        "transformer": ["diffusers", "WanTransformer3DModel"],
        "transformer_2": ["diffusers", "WanTransformer3DModel"],
        "vae": ["diffusers", "AutoencoderKLWan"],
    })

    image = write_image(os.path.join(out, "image.png"), gen, WIDTH, HEIGHT)
    last_image = write_image(os.path.join(out, "last_image.png"), gen, WIDTH, HEIGHT)
    t_lat, h_lat, w_lat = (FRAMES - 1) // 4 + 1, HEIGHT // 8, WIDTH // 8
    init = torch.randn(16, t_lat, h_lat, w_lat, generator=gen)

    pipe = WanImageToVideoPipeline(tokenizer=tokenizer, text_encoder=t5, vae=vae, scheduler=scheduler,
                                   image_processor=None, image_encoder=None, transformer=experts[0],
                                   transformer_2=experts[1], boundary_ratio=BOUNDARY)
    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad():
        cond_p, uncond_p = pipe.encode_prompt(PROMPT, pf.DEFAULT_NEG, do_classifier_free_guidance=True,
                                             max_sequence_length=pf.TEXT_LEN)
    cond, uncond = pf.trim(cond_p[0]), pf.trim(uncond_p[0])
    assert torch.equal(pf.padded(cond), cond_p) and torch.equal(pf.padded(uncond), uncond_p)
    print(f"prompt: {cond.shape[0]} tokens, negative prompt: {uncond.shape[0]} tokens")

    # The image as diffusers' video processor hands it to prepare_latents vs the official to_tensor.
    pre = pipe.video_processor.preprocess(image, height=HEIGHT, width=WIDTH)
    assert torch.equal(pre[0], official_image_tensor(image)), "diffusers' image preprocessing differs"

    seen, ys = [], []

    def hook(i):
        def f(m, a, kw):
            seen.append((i, int(kw["timestep"][0])))
            ys.append(kw["hidden_states"][0, 16:].clone())
        return f

    hooks = [e.register_forward_pre_hook(hook(i), with_kwargs=True) for i, e in enumerate(experts)]

    def run(last=None, from_text=True):
        seen.clear()
        ys.clear()
        text = dict(prompt=PROMPT, negative_prompt=pf.DEFAULT_NEG) if from_text else dict(
            prompt_embeds=pf.padded(cond), negative_prompt_embeds=pf.padded(uncond))
        with torch.no_grad():
            return pipe(image=image, last_image=last, **text, latents=init[None].clone(), height=HEIGHT,
                        width=WIDTH, num_frames=FRAMES, num_inference_steps=STEPS, guidance_scale=GUIDE_HIGH,
                        guidance_scale_2=GUIDE_LOW, max_sequence_length=pf.TEXT_LEN, output_type="latent",
                        return_dict=False)[0]

    own = [e.condition_embedder.timesteps_proj for e in experts]
    results = {}
    ts = None
    for name, last in (("expected", None), ("expected_last", last_image)):
        for e, o in zip(experts, own):
            e.condition_embedder.timesteps_proj = o
        fp32_latents = run(last)
        for e in experts:
            e.condition_embedder.timesteps_proj = pf.OfficialTimesteps()
        latents = run(last)
        # cond + uncond per step: expert 0 (high noise) at t >= 900, expert 1 after; one y throughout.
        ts = [int(t) for t in scheduler.timesteps]
        assert [t >= BOUNDARY * 1000 for t in ts] == [True, True, False, False], ts
        assert seen == [(int(t >= BOUNDARY * 1000) ^ 1, t) for t in ts for _ in range(2)], seen
        assert all(torch.equal(y, ys[0]) for y in ys)
        y_pipe = ys[0]
        y = official_y(vae, image, last)
        dy = (y - y_pipe).abs().max().item()
        print(f"{name}: y {tuple(y.shape)} official recipe vs WanImageToVideoPipeline: max|diff| {dy:.1e} "
              f"(max|y| {y.abs().max():.3f})")
        assert dy == 0.0, "the official conditioning differs from the pipeline's"
        assert torch.equal(run(last, from_text=False), latents), "embeddings path differs from the text path"
        d = ((latents - fp32_latents).abs().max() / latents.abs().max()).item()
        print(f"{name}: final latents max|x| {latents.abs().max():.3f}; diffusers fp32 sinusoid would move them "
              f"by {d:.1e} rel")
        mean, inv_std = latent_stats(vae)
        with torch.no_grad():  # the decode of WanImageToVideoPipeline.__call__ for output_type != "latent"
            video = vae.decode(latents / inv_std + mean, return_dict=False)[0]
        assert video.shape == (1, 3, FRAMES, HEIGHT, WIDTH), video.shape
        clamped = (video.abs() >= 1).float().mean().item()
        print(f"{name}: video {tuple(video.shape[1:])}, fraction at the clamp {clamped:.3f}")
        assert clamped < 0.5, "most of the video should be inside (-1, 1)"
        results[name] = (latents[0], video[0], y)
    for h in hooks:
        h.remove()
    d = (results["expected"][0] - results["expected_last"][0]).abs().max().item()
    print(f"last_image changes the final latents by max|diff| {d:.3f}")
    assert d > 1e-2

    save_embeds(out, cond, uncond)
    save_file({"latents": init.contiguous()}, os.path.join(out, "init_latents.safetensors"))
    experts_used = ["high" if t >= BOUNDARY * 1000 else "low" for t in ts]
    for name, last in (("expected", None), ("expected_last", "last_image.png")):
        latents, video, y = results[name]
        settings = dict(prompt=PROMPT, steps=STEPS, guide_high=GUIDE_HIGH, guide_low=GUIDE_LOW, width=WIDTH,
                        height=HEIGHT, frames=FRAMES, flow_shift=FLOW_SHIFT, boundary=BOUNDARY, schedule="diffusers",
                        timesteps=ts, experts=experts_used, image="image.png", last_image=last)
        save_file({"latents": latents.contiguous(), "video": video.contiguous(), "y": y.contiguous()},
                  os.path.join(out, name + ".safetensors"), metadata={"settings": json.dumps(settings)})
    print(f"timesteps {ts}, experts {experts_used}")
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(out) for f in fs)
    print(f"wrote {out} ({total / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
