#!/usr/bin/env python3
"""End-to-end oracle for the T2V pipeline: diffusers WanPipeline on a tiny two-expert checkpoint.

Writes tests/fixtures/pipeline/:
  model/            a diffusers-layout T2V-A14B checkpoint (what `wan generate --model` reads):
    model_index.json                 WanPipeline, boundary_ratio 0.875
    transformer/, transformer_2/     WanTransformer3DModel high- and low-noise experts: dim 128
                                     (1 head of 128), 1 block, ffn 96, text_dim 24; different seeded
                                     random weights, bf16-exact, stored as BF16
    text_encoder/                    UMT5EncoderModel, d_model 24 (= text_dim), 3 heads of 8, 2 layers,
                                     random weights, BF16
    tokenizer/                       copied from tests/fixtures/text/tokenizer (the SentencePiece
                                     model trained for the tests, 1600 ids, with its tokenizer.json)
    vae/                             AutoencoderKLWan (Wan 2.1 structure, base_dim 4), FP8 E4M3
    scheduler/scheduler_config.json  UniPCMultistepScheduler, flow sigmas, flow_shift 3.0
  prompt_embeds.safetensors          "prompt_embeds" [L, 24] f32: diffusers' encoding of PROMPT
                                     (tokenizer + text_encoder, trimmed to the L real tokens)
  negative_prompt_embeds.safetensors "prompt_embeds" [L', 24] f32: the same for the official default
                                     negative prompt (the negative prompt's file has the same tensor
                                     name: one embeddings-file format)
  init_latents.safetensors           "latents" [16, 3, 6, 8] f32 (9 frames of 48x64)
  expected.safetensors               "latents" [16, 3, 6, 8] f32: WanPipeline(output_type="latent")
                                     "video" [3, 9, 48, 64] f32: vae.decode of those latents as the
                                     pipeline does it (z / (1/std) + mean, clamp to [-1, 1]), before
                                     the video processor's quantisation
  metadata of expected.safetensors: the run's settings (steps, guidance, size, frames, flow_shift).

The run: 4 UniPC steps with flow_shift 3 give timesteps 999, 900 (high-noise expert, guidance 4.0)
and 750, 500 (low-noise expert, guidance_scale_2 3.0), so both experts, the switch and the multistep
history across it are exercised; classifier-free guidance on with prompts of different lengths.
The pipeline runs from the prompt TEXT (prompt=PROMPT, negative_prompt=the official default), so the
expected latents serve both the embeddings-file path and the full text path of `wan generate`; the
script checks that passing the stored embeddings (zero-padded to 512 rows, as diffusers pads them)
gives bit-identical latents.

Numerics of the oracle: diffusers fp32 throughout, except the sinusoidal timestep embedding, which is
replaced by the official float64 computation (spec §2.4 / §9.2), as tools/make_fixtures.py does; the
script prints how much diffusers' own fp32 embedding would have moved the result.

Usage: .venv/bin/python3 tools/make_pipeline_fixtures.py [--out DIR]
"""
import argparse
import json
import os

import torch
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "..", "tests", "fixtures", "pipeline")
SEED = 20250720

DIT = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=1,
    attention_head_dim=128,
    in_channels=16,
    out_channels=16,
    text_dim=24,
    freq_dim=256,
    ffn_dim=96,
    num_layers=1,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    eps=1e-6,
    image_dim=None,
    added_kv_proj_dim=None,
    rope_max_seq_len=1024,
)
VAE = dict(base_dim=4, z_dim=16)
UMT5 = dict(d_model=24, d_kv=8, num_heads=3, d_ff=40, num_layers=2, num_decoder_layers=0,
            relative_attention_num_buckets=32, relative_attention_max_distance=128, feed_forward_proj="gated-gelu",
            dense_act_fn="gelu_new", layer_norm_epsilon=1e-6, pad_token_id=0, eos_token_id=1,
            decoder_start_token_id=0, tie_word_embeddings=False)
TOKENIZER_SRC = os.path.join(HERE, "..", "tests", "fixtures", "text", "tokenizer")
TOKENIZER_FILES = ["spiece.model", "tokenizer.json", "tokenizer_config.json"]
# Entity and whitespace clean-up of the official cleaning are exercised by the prompt itself.
PROMPT = "A small red fox runs through the snowy forest at sunset &amp; the  light   is golden"
DEFAULT_NEG = (
    "色调艳丽，过曝，静态，细节模糊不清，字幕，风格，作品，画作，画面，静止，整体发灰，最差质量，低质量，"
    "JPEG压缩残留，丑陋的，残缺的，多余的手指，画得不好的手部，画得不好的脸部，畸形的，毁容的，形态畸形的肢体，"
    "手指融合，静止不动的画面，杂乱的背景，三条腿，背景人很多，倒着走"
)
FLOW_SHIFT = 3.0
BOUNDARY = 0.875
STEPS = 4
GUIDE_HIGH, GUIDE_LOW = 4.0, 3.0
WIDTH, HEIGHT, FRAMES = 64, 48, 9
TEXT_LEN = 512


def official_sinusoid(t):
    """Official sinusoidal_embedding_1d(256, t): float64, cos half first, then fp32."""
    half = DIT["freq_dim"] // 2
    pos = t.to(torch.float64)
    sinusoid = torch.outer(pos, torch.pow(10000, -torch.arange(half).to(pos).div(half)))
    return torch.cat([torch.cos(sinusoid), torch.sin(sinusoid)], dim=1).float()


class OfficialTimesteps(torch.nn.Module):
    def forward(self, t):
        return official_sinusoid(t)


def randomize_dit(model, gen):
    """Every parameter random (norm weights too), bf16-exact; unit-variance Linear outputs."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("scale_shift_table"):
                v = torch.randn(p.shape, generator=gen) * 0.3
            elif "norm" in name and name.endswith("weight"):
                v = 1.0 + 0.2 * torch.randn(p.shape, generator=gen)
            elif name.endswith("bias"):
                v = 0.1 * torch.randn(p.shape, generator=gen)
            else:
                v = torch.randn(p.shape, generator=gen) / p[0].numel() ** 0.5
            p.copy_(v.to(torch.bfloat16).float())


def randomize_umt5(model, gen):
    """As tools/make_text_fixtures.py: random norms, biases, embedding; uniform unit-gain weights."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layer_norm.weight"):
                v = torch.rand(p.shape, generator=gen) + 0.5
            elif "relative_attention_bias" in name or name == "shared.weight":
                v = torch.randn(p.shape, generator=gen)
            else:
                v = (torch.rand(p.shape, generator=gen) * 2 - 1) * (3.0 / p.shape[1]) ** 0.5
            p.copy_(v.to(torch.bfloat16).float())


def randomize_vae(vae, gen):
    """Uniform conv weights with unit-variance gain, random biases and RMS gammas; fp8-exact."""
    with torch.no_grad():
        for name, p in vae.named_parameters():
            if name.endswith("gamma"):
                v = torch.rand(p.shape, generator=gen) + 0.5
            elif name.endswith("bias"):
                v = (torch.rand(p.shape, generator=gen) * 2 - 1) * 0.2
            else:
                bound = (3.0 / p[0].numel()) ** 0.5
                v = (torch.rand(p.shape, generator=gen) * 2 - 1) * bound
            p.copy_(v.to(torch.float8_e4m3fn).float())


def save_component(module, d, dtype=torch.bfloat16, file="diffusion_pytorch_model.safetensors"):
    """save_pretrained in dtype; the oracle is a fresh from_pretrained of the stored file in fp32.

    (Reusing the converted module would keep bf16-rounded copies of its non-persistent buffers,
    e.g. the RoPE tables, which load_state_dict does not restore.)"""
    module.to(dtype).save_pretrained(d, safe_serialization=True)
    fresh = type(module).from_pretrained(d, torch_dtype=torch.float32).eval()
    stored = load_file(os.path.join(d, file))
    own = fresh.state_dict()
    assert set(stored) <= set(own), "stored tensors differ from the module's"
    for k, v in stored.items():
        assert own[k].dtype == torch.float32 and torch.equal(own[k], v.float()), k
    return fresh


def trim(embeds):
    """Rows up to the last non-zero one (diffusers pads with exact zeros after the real tokens)."""
    nz = (embeds != 0).any(dim=1).nonzero()
    return embeds[: int(nz[-1]) + 1].contiguous()


def padded(embeds):
    out = torch.zeros(1, TEXT_LEN, embeds.shape[1])
    out[0, : embeds.shape[0]] = embeds
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args()
    torch.set_num_threads(2)
    import shutil

    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    from transformers import AutoTokenizer, UMT5Config, UMT5EncoderModel

    out = os.path.abspath(args.out)
    model_dir = os.path.join(out, "model")
    gen = torch.Generator().manual_seed(SEED)

    experts = []
    for sub in ("transformer", "transformer_2"):
        m = WanTransformer3DModel(**DIT).float().eval()
        randomize_dit(m, gen)
        experts.append(save_component(m, os.path.join(model_dir, sub)))
    vae = AutoencoderKLWan(**VAE).eval()
    randomize_vae(vae, gen)
    vae = save_component(vae, os.path.join(model_dir, "vae"), dtype=torch.float8_e4m3fn)
    tok_dir = os.path.join(model_dir, "tokenizer")
    os.makedirs(tok_dir, exist_ok=True)
    for f in TOKENIZER_FILES:
        shutil.copyfile(os.path.join(TOKENIZER_SRC, f), os.path.join(tok_dir, f))
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    t5 = UMT5EncoderModel(UMT5Config(vocab_size=len(tokenizer), **UMT5)).eval()
    randomize_umt5(t5, gen)
    t5 = save_component(t5, os.path.join(model_dir, "text_encoder"), file="model.safetensors")
    scheduler = UniPCMultistepScheduler(num_train_timesteps=1000, solver_order=2, prediction_type="flow_prediction",
                                        use_flow_sigmas=True, flow_shift=FLOW_SHIFT, predict_x0=True,
                                        solver_type="bh2", lower_order_final=True, final_sigmas_type="zero")
    scheduler.save_pretrained(os.path.join(model_dir, "scheduler"))
    # model_index.json by hand: save_pretrained of the pipeline would also want tokenizer/text_encoder.
    import diffusers
    index = {
        "_class_name": "WanPipeline",
        "_diffusers_version": diffusers.__version__,
        "boundary_ratio": BOUNDARY,
        "expand_timesteps": False,
        "scheduler": ["diffusers", "UniPCMultistepScheduler"],
        "text_encoder": ["transformers", "UMT5EncoderModel"],
        "tokenizer": ["transformers", "T5Tokenizer"],
        "transformer": ["diffusers", "WanTransformer3DModel"],
        "transformer_2": ["diffusers", "WanTransformer3DModel"],
        "vae": ["diffusers", "AutoencoderKLWan"],
    }
    with open(os.path.join(model_dir, "model_index.json"), "w") as f:
        json.dump(index, f, indent=2, sort_keys=True)
        f.write("\n")

    t_lat, h_lat, w_lat = (FRAMES - 1) // 4 + 1, HEIGHT // 8, WIDTH // 8
    init = torch.randn(16, t_lat, h_lat, w_lat, generator=gen)

    pipe = WanPipeline(tokenizer=tokenizer, text_encoder=t5, vae=vae, scheduler=scheduler, transformer=experts[0],
                       transformer_2=experts[1], boundary_ratio=BOUNDARY)
    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad():  # diffusers' encoding: [1, 512, 24], real tokens first, zeros after
        cond_p, uncond_p = pipe.encode_prompt(PROMPT, DEFAULT_NEG, do_classifier_free_guidance=True,
                                             max_sequence_length=TEXT_LEN)
    cond, uncond = trim(cond_p[0]), trim(uncond_p[0])
    assert torch.equal(padded(cond), cond_p) and torch.equal(padded(uncond), uncond_p)
    print(f"prompt: {cond.shape[0]} tokens, negative prompt: {uncond.shape[0]} tokens")
    seen = []

    def run(from_text=True):
        seen.clear()
        text = dict(prompt=PROMPT, negative_prompt=DEFAULT_NEG) if from_text else dict(
            prompt_embeds=padded(cond), negative_prompt_embeds=padded(uncond))
        with torch.no_grad():
            return pipe(**text, latents=init[None].clone(), height=HEIGHT, width=WIDTH, num_frames=FRAMES,
                        num_inference_steps=STEPS, guidance_scale=GUIDE_HIGH, guidance_scale_2=GUIDE_LOW,
                        max_sequence_length=TEXT_LEN, output_type="latent", return_dict=False)[0]

    hooks = [e.register_forward_pre_hook(lambda m, a, kw, i=i: seen.append((i, int(kw["timestep"][0]))),
                                         with_kwargs=True) for i, e in enumerate(experts)]
    own = [e.condition_embedder.timesteps_proj for e in experts]
    fp32_latents = run()
    for e in experts:
        e.condition_embedder.timesteps_proj = OfficialTimesteps()
    latents = run()
    assert torch.equal(run(from_text=False), latents), "embeddings path differs from the text path"
    for e, o in zip(experts, own):
        e.condition_embedder.timesteps_proj = o
    for h in hooks:
        h.remove()
    # cond + uncond per step: expert 0 (high noise) at t >= 875, expert 1 after.
    ts = [int(t) for t in scheduler.timesteps]
    assert [t >= BOUNDARY * 1000 for t in ts] == [True, True, False, False], ts
    assert seen == [(int(t >= BOUNDARY * 1000) ^ 1, t) for t in ts for _ in range(2)], seen
    d = ((latents - fp32_latents).abs().max() / latents.abs().max()).item()
    print(f"final latents max|x| {latents.abs().max():.3f}; diffusers fp32 sinusoid would move them by {d:.1e} rel")

    with torch.no_grad():  # the decode of WanPipeline.__call__ for output_type != "latent"
        mean = torch.tensor(vae.config.latents_mean).view(1, 16, 1, 1, 1).float()
        inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, 16, 1, 1, 1).float()
        video = vae.decode(latents / inv_std + mean, return_dict=False)[0]
    assert video.shape == (1, 3, FRAMES, HEIGHT, WIDTH), video.shape
    clamped = (video.abs() >= 1).float().mean().item()
    print(f"video {tuple(video.shape[1:])}, fraction at the clamp {clamped:.3f}")
    assert clamped < 0.5, "most of the video should be inside (-1, 1)"

    save_file({"prompt_embeds": cond.contiguous()}, os.path.join(out, "prompt_embeds.safetensors"))
    save_file({"prompt_embeds": uncond.contiguous()}, os.path.join(out, "negative_prompt_embeds.safetensors"))
    save_file({"latents": init.contiguous()}, os.path.join(out, "init_latents.safetensors"))
    settings = dict(prompt=PROMPT, steps=STEPS, guide_high=GUIDE_HIGH, guide_low=GUIDE_LOW, width=WIDTH, height=HEIGHT,
                    frames=FRAMES, flow_shift=FLOW_SHIFT, boundary=BOUNDARY, timesteps=ts)
    save_file({"latents": latents[0].contiguous(), "video": video[0].contiguous()},
              os.path.join(out, "expected.safetensors"), metadata={"settings": json.dumps(settings)})
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(out) for f in fs)
    print(f"wrote {out} ({total / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
