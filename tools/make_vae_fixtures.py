#!/usr/bin/env python3
"""Oracle fixtures for the CPU Wan VAEs: diffusers AutoencoderKLWan at narrow widths, float32.

Writes tests/fixtures/vae/{wan21,wan22}/:
  config.json, diffusion_pytorch_model.safetensors
      diffusers layout via save_pretrained. The network keeps the released structure (4 stages,
      2 encoder / 3 decoder residual blocks per stage, temporal resampling in encoder stages 1-2,
      real z_dim and latent mean/std tables); only the widths are narrow. Seeded random weights
      (random RMS gammas and biases too, so a dropped or transposed term shows), rounded to
      values the storage dtype holds exactly: BF16 for wan21, FP8 E4M3 for wan22 (keeps the
      committed files small; the fp32 maths is unchanged). The oracle runs on the weights read
      back from the saved files, so the stored tensors are by construction what it used.
  cases.safetensors
      video   [3, 9, H, W]     input of encode, uniform in [-1, 1] (bf16-exact, stored BF16)
      latents [z, 3, h, w]     input of decode, normalised latents ~ N(0, 1) (bf16-exact, BF16)
      encoded [z, 3, h, w]     F32: normalised posterior mean, (mode() - mean) * (1/std)
      decoded [3, 9, H, W]     F32: decoder output BEFORE the [-1, 1] clamp of AutoencoderKLWan
  The C++ test also decodes/encodes 1 and 5 frames (1 and 2 latent frames): the VAE is causal, so
  those results are prefixes of the 9-frame ones; this script asserts that on the oracle itself
  (bit-exact), and that decode() == clamp(decoded, -1, 1), so only the 9-frame tensors are stored.

Oracle path: the plain (non-tiled, non-sliced) AutoencoderKLWan.encode/decode, i.e. _encode/_decode
with the chunked feature cache (1 + 4 + 4 pixel frames per encoder chunk, 1 latent frame per
decoder chunk), which reproduces the official WanVAE_ semantics (spec §5.4). Latent normalisation
follows the pipelines: inv = 1 / std (fp32); encode (mu - mean) * inv; decode z / inv + mean.

Usage: .venv/bin/python3 tools/make_vae_fixtures.py [--out DIR]
"""
import argparse
import json
import os

import torch
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "..", "tests", "fixtures", "vae")
SEED = 20250711

WAN22_MEAN = [
    -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557, -0.1382, 0.0542, 0.2813, 0.0891,
    0.1570, -0.0098, 0.0375, -0.1825, -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502,
    -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230, -0.0313, -0.1649, 0.0117, 0.0723,
    -0.2839, -0.2083, -0.0520, 0.3748, 0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667,
]
WAN22_STD = [
    0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013, 0.8158, 1.0344, 0.5894, 1.0901,
    0.6885, 0.6165, 0.8454, 0.4978, 0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
    0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093, 0.5709, 0.6065, 0.6415, 0.4944,
    0.5726, 1.2042, 0.5458, 1.6887, 0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744,
]

# name -> (diffusers config, storage dtype, pixel H, W). Widths differ between encoder and decoder
# for wan22 so that a swapped base_dim / decoder_base_dim cannot go unnoticed; H != W and odd latent
# sizes catch transposed spatial indices.
VARIANTS = {
    "wan21": (dict(base_dim=8, z_dim=16), torch.bfloat16, 40, 56),
    "wan22": (
        dict(base_dim=8, decoder_base_dim=12, z_dim=48, is_residual=True, in_channels=12, out_channels=12,
             patch_size=2, scale_factor_temporal=4, scale_factor_spatial=16, latents_mean=WAN22_MEAN,
             latents_std=WAN22_STD),
        torch.float8_e4m3fn, 48, 80),
}
FRAMES = 9  # 3 latent frames: chunks of 1, 4, 4 pixel frames


def init_weights(vae, gen, dtype):
    """Uniform conv weights with unit-variance gain, random biases and RMS gammas; rounded to dtype."""
    for name, p in vae.named_parameters():
        if name.endswith("gamma"):
            v = torch.rand(p.shape, generator=gen) + 0.5
        elif name.endswith("bias"):
            v = (torch.rand(p.shape, generator=gen) * 2 - 1) * 0.2
        else:
            fan_in = p[0].numel()
            # The decoder's last conv is wider than unit gain so that part of the output leaves
            # [-1, 1] and the clamp is exercised.
            gain = 1.5 if name.startswith("decoder.conv_out") else 1.0
            bound = gain * (3.0 / fan_in) ** 0.5
            v = (torch.rand(p.shape, generator=gen) * 2 - 1) * bound
        with torch.no_grad():
            p.copy_(v.to(dtype).float())


def decode_unclamped(vae, mu):
    """AutoencoderKLWan._decode without its final clamp (the same module code, clamp made a no-op)."""
    orig = torch.clamp
    torch.clamp = lambda x, min=None, max=None: x  # _decode calls torch.clamp(out, min=-1.0, max=1.0)
    try:
        return vae.decode(mu).sample
    finally:
        torch.clamp = orig


def build(name, out_dir):
    from diffusers import AutoencoderKLWan

    cfg, dtype, H, W = VARIANTS[name]
    gen = torch.Generator().manual_seed(SEED + (0 if name == "wan21" else 1))
    vae = AutoencoderKLWan(**cfg).eval()
    init_weights(vae, gen, dtype)
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    vae.to(dtype).save_pretrained(d, safe_serialization=True)
    # Oracle = what was stored, read back and up-cast to fp32.
    vae = AutoencoderKLWan(**cfg).eval()
    sd = {k: v.float() for k, v in load_file(os.path.join(d, "diffusion_pytorch_model.safetensors")).items()}
    missing, unexpected = vae.load_state_dict(sd, strict=True)
    assert not missing and not unexpected
    with open(os.path.join(d, "config.json")) as f:
        assert json.load(f)["z_dim"] == cfg["z_dim"]

    z_dim = cfg["z_dim"]
    sf = cfg.get("scale_factor_spatial", 8)
    h, w = H // sf, W // sf
    t_lat = 1 + (FRAMES - 1) // 4
    mean = torch.tensor(vae.config.latents_mean, dtype=torch.float32).view(1, z_dim, 1, 1, 1)
    inv = 1.0 / torch.tensor(vae.config.latents_std, dtype=torch.float32).view(1, z_dim, 1, 1, 1)

    video = (torch.rand(1, 3, FRAMES, H, W, generator=gen) * 2 - 1).to(torch.bfloat16).float()
    latents = torch.randn(1, z_dim, t_lat, h, w, generator=gen).to(torch.bfloat16).float()

    with torch.no_grad():
        def encode(v):
            return (vae.encode(v).latent_dist.mode() - mean) * inv

        def decode(z, clamp):
            mu = z / inv + mean
            return vae.decode(mu).sample if clamp else decode_unclamped(vae, mu)

        encoded = encode(video)
        decoded = decode(latents, clamp=False)
        assert encoded.shape == (1, z_dim, t_lat, h, w), encoded.shape
        assert decoded.shape == (1, 3, FRAMES, H, W), decoded.shape
        assert torch.equal(decode(latents, clamp=True), decoded.clamp(-1.0, 1.0))
        for tl in (1, 2):  # causality: shorter inputs give exact prefixes
            f = 1 + 4 * (tl - 1)
            assert torch.equal(encode(video[:, :, :f]), encoded[:, :, :tl]), (name, "encode prefix", tl)
            assert torch.equal(decode(latents[:, :, :tl], clamp=False), decoded[:, :, :f]), (name, "decode prefix", tl)

    clamped = (decoded.abs() > 1).float().mean().item()
    print(f"{name}: params {sum(p.numel() for p in vae.parameters())}, video {tuple(video.shape[1:])}, "
          f"latents {tuple(latents.shape[1:])}, decoded |x|>1 fraction {clamped:.3f}, "
          f"max|decoded| {decoded.abs().max():.3f}, max|encoded| {encoded.abs().max():.3f}")
    assert 0.05 < clamped < 0.6, "the clamp should matter for part of the output, not all of it"
    save_file(
        {
            "video": video[0].to(torch.bfloat16).contiguous(),
            "latents": latents[0].to(torch.bfloat16).contiguous(),
            "encoded": encoded[0].contiguous(),
            "decoded": decoded[0].contiguous(),
        },
        os.path.join(d, "cases.safetensors"),
        metadata={"seed": str(SEED), "frames": str(FRAMES), "diffusers_class": "AutoencoderKLWan"},
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--only", choices=sorted(VARIANTS), default=None)
    args = ap.parse_args()
    torch.manual_seed(SEED)
    torch.set_num_threads(2)
    for name in VARIANTS:
        if args.only is None or args.only == name:
            build(name, os.path.abspath(args.out))


if __name__ == "__main__":
    main()
