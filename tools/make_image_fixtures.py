#!/usr/bin/env python3
"""Writes tests/fixtures/image: small image files and what the reference stack makes of them.

The reference reads an image with Pillow (`Image.open(path).convert("RGB")`), normalises it with
`TF.to_tensor(img).sub_(0.5).div_(0.5)`, and resizes with `F.interpolate(..., mode="bicubic")` (I2V) or
`img.resize(..., Image.LANCZOS)` (TI2V). This script writes
  - image files (PNG variants, JPEG incl. CMYK and EXIF orientations 1..8 in both byte orders, lossless
    WebP, PPM/PGM, and a few malformed files) made with Pillow or by hand;
  - expected.safetensors: for each file "decode/<name>" [H, W, 3] u8 (Pillow's decode, after
    ImageOps.exif_transpose), and the op cases "bicubic/<i>/{in,out}" (f32, torch CPU),
    "lanczos/<i>/{in,out}" (u8, Pillow) and "to_tensor/{in,out}".
Deterministic: rerunning with the same Pillow / torch / libjpeg gives the same bytes.
Usage: .venv/bin/python tools/make_image_fixtures.py [OUT_DIR]
"""
import io
import os
import struct
import sys
import zlib

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageOps
from safetensors.numpy import save_file

W, H = 37, 23  # deliberately not multiples of 8 or 16 (JPEG blocks / MCUs)
ORIENTATION = 0x0112


def base_rgb():
    """A smooth image with a few edges; the bright block in the top-left corner makes every
    orientation distinguishable."""
    y, x = np.mgrid[0:H, 0:W].astype(np.float64)
    r = 40 + 180 * x / (W - 1)
    g = 30 + 200 * y / (H - 1)
    b = 128 + 90 * np.sin(x / 5.0) * np.cos(y / 4.0)
    img = np.stack([r, g, b], axis=-1)
    img[2:8, 3:12] = [250, 240, 20]          # top-left marker
    img[15:20, 28:33] = [20, 30, 200]         # bottom-right marker, different colour
    noise = np.random.default_rng(7).normal(0, 4, img.shape)
    return np.clip(np.rint(img + noise), 0, 255).astype(np.uint8)


def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def raw_png(width, height, bit_depth, colour_type, rows, idat=True):
    """A PNG written by hand (Pillow cannot write 16-bit RGB), filter type 0 on every row."""
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, colour_type, 0, 0, 0)
    out = b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr)
    if idat:
        out += png_chunk(b"IDAT", zlib.compress(b"".join(b"\x00" + r for r in rows), 9))
    return out + png_chunk(b"IEND", b"")


def exif_bytes(orientation, big_endian):
    """APP1 payload "Exif\\0\\0" + a TIFF header and IFD0 holding only the orientation (SHORT)."""
    e = ">" if big_endian else "<"
    tiff = (b"MM" if big_endian else b"II") + struct.pack(e + "HI", 42, 8)
    tiff += struct.pack(e + "H", 1) + struct.pack(e + "HHI", ORIENTATION, 3, 1)
    tiff += struct.pack(e + "H", orientation) + b"\x00\x00" + struct.pack(e + "I", 0)
    return b"Exif\x00\x00" + tiff


def inverse_orient(img, o):
    """The stored pixels that display (after exif_transpose) as `img`."""
    ops = {1: [], 2: [Image.Transpose.FLIP_LEFT_RIGHT], 3: [Image.Transpose.ROTATE_180],
           4: [Image.Transpose.FLIP_TOP_BOTTOM], 5: [Image.Transpose.TRANSPOSE],
           6: [Image.Transpose.ROTATE_90], 7: [Image.Transpose.TRANSVERSE], 8: [Image.Transpose.ROTATE_270]}
    for op in ops[o]:
        img = img.transpose(op)
    return img


def pillow_rgb(path):
    with Image.open(path) as im:
        return np.array(ImageOps.exif_transpose(im).convert("RGB"))


def write_images(out):
    """Writes the image files; returns {name: expected RGB array}."""
    rgb = base_rgb()
    im = Image.fromarray(rgb)
    files, expected = {}, {}

    def put(name, data):
        files[name] = data
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)

    def save(name, image, **kw):
        b = io.BytesIO()
        image.save(b, **kw)
        put(name, b.getvalue())

    save("rgb.png", im, format="PNG")
    alpha = np.tile(np.linspace(0, 255, W).astype(np.uint8), (H, 1))
    alpha[:, :4] = 0  # fully transparent columns keep their colour in Image.convert("RGB")
    save("rgba.png", Image.fromarray(np.dstack([rgb, alpha]), "RGBA"), format="PNG")
    save("grey.png", im.convert("L"), format="PNG")
    save("grey_alpha.png", Image.merge("LA", [im.convert("L"), Image.fromarray(alpha)]), format="PNG")
    save("palette.png", im.quantize(colors=23, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE),
         format="PNG")
    save("bilevel.png", im.convert("L").point(lambda v: 255 if v > 120 else 0).convert("1"), format="PNG")

    rng = np.random.default_rng(11)
    rgb16 = rng.integers(0, 65536, size=(H, W, 3), dtype=np.uint16)
    rgb16[0, :6, 0] = [0, 127, 128, 255, 32895, 65535]  # rounding corners of the 16 -> 8 bit rule
    put("rgb16.png", raw_png(W, H, 16, 2, [r.astype(">u2").tobytes() for r in rgb16]))
    grey16 = rng.integers(0, 65536, size=(H, W), dtype=np.uint16)
    put("grey16.png", raw_png(W, H, 16, 0, [r.astype(">u2").tobytes() for r in grey16]))
    # Pillow opens 16-bit grey as "I;16" and convert("RGB") clips it at 255; we keep the high byte, as
    # Pillow does for 16-bit RGB ("RGB;16B").
    expected["grey16.png"] = np.repeat((grey16 >> 8).astype(np.uint8)[:, :, None], 3, axis=2)

    save("lossless.webp", Image.fromarray(np.dstack([rgb, alpha]), "RGBA"), format="WEBP", lossless=True,
         exact=True)
    save("lossy.webp", im, format="WEBP", quality=90)
    save("q90_420.jpg", im, format="JPEG", quality=90)  # Pillow's default 4:2:0
    save("q90_444.jpg", im, format="JPEG", quality=90, subsampling=0)
    save("q90_422.jpg", im, format="JPEG", quality=90, subsampling=1)
    save("progressive.jpg", im, format="JPEG", quality=85, progressive=True)
    save("grey.jpg", im.convert("L"), format="JPEG", quality=90)
    save("cmyk.jpg", im.convert("CMYK"), format="JPEG", quality=95)
    for o in range(1, 9):
        for big in (False, True):
            save(f"orient{o}_{'mm' if big else 'ii'}.jpg", inverse_orient(im, o), format="JPEG", quality=95,
                 subsampling=0, exif=exif_bytes(o, big))
    save("orient6.png", inverse_orient(im, 6), format="PNG", exif=exif_bytes(6, True)[6:])
    save("orient3.webp", inverse_orient(im, 3), format="WEBP", lossless=True, exif=exif_bytes(3, False))

    # PPM / PGM with comments between the header tokens.
    put("rgb.ppm", b"P6\n# a comment\n%d %d\n255\n" % (W, H) + rgb.tobytes())
    put("grey.pgm", b"P5 %d %d 255\n" % (W, H) + np.array(im.convert("L")).tobytes())
    put("rgb16.ppm", b"P6\n%d %d\n# deep\n65535\n" % (W, H) + rgb16.astype(">u2").tobytes())
    put("rgb15.ppm", b"P6 %d %d 15\n" % (W, H) + (rgb >> 4).tobytes())
    deep = rng.integers(0, 1001, size=(H, W), dtype=np.uint16)
    deep[0, 0] = 1000
    put("grey1000.pgm", b"P5 %d %d 1000\n" % (W, H) + deep.astype(">u2").tobytes())
    # Pillow reads a PGM with maxval > 255 as "I" and clips; we scale as for PPM (Pillow's PPM rule).
    expected["grey1000.pgm"] = np.repeat(
        np.minimum(255, np.round(deep / 1000 * 255)).astype(np.uint8)[:, :, None], 3, axis=2)

    # Malformed inputs.
    put("bomb.png", raw_png(100000, 100000, 8, 2, [b"\x00" * 3] * 1))
    put("zero.png", raw_png(0, 5, 8, 2, [], idat=False))
    put("truncated.png", files["rgb.png"][: len(files["rgb.png"]) // 2])
    put("truncated.jpg", files["q90_420.jpg"][: len(files["q90_420.jpg"]) * 2 // 3])
    put("not_an_image.txt", b"hello, this is plain text and not an image at all\n" * 4)
    put("truncated.ppm", b"P6 %d %d 255\n" % (W, H) + rgb.tobytes()[:100])

    for name in sorted(files):
        if name in expected or name.startswith(("bomb", "zero", "truncated", "not_an")):
            continue
        expected[name] = pillow_rgb(os.path.join(out, name))
    assert (expected["rgb.png"] == rgb).all()
    assert (expected["rgb16.png"] == (rgb16 >> 8)).all()
    return {f"decode/{k}": np.ascontiguousarray(v) for k, v in expected.items()}


def op_cases():
    g = torch.Generator().manual_seed(1234)
    cases = {}
    # (H_in, W_in, H_out, W_out): up, down, non-integer ratios, mixed, identity, 1-pixel edges.
    bicubic = [(12, 19, 29, 43), (20, 32, 9, 15), (23, 37, 31, 45), (23, 37, 61, 20), (23, 37, 23, 37),
               (1, 1, 3, 4), (9, 7, 1, 1), (5, 8, 13, 3), (24, 32, 15, 26)]
    for i, (hi, wi, ho, wo) in enumerate(bicubic):
        x = torch.rand(3, hi, wi, generator=g) * 2 - 1
        if i == 0:
            x = x * 3  # values outside [-1, 1]: bicubic overshoot is not clamped
        y = F.interpolate(x[None], size=(ho, wo), mode="bicubic", align_corners=False)[0]
        cases[f"bicubic/{i}/in"] = x.numpy()
        cases[f"bicubic/{i}/out"] = y.contiguous().numpy()
    # (W_in, H_in, W_out, H_out)
    # Pillow 13 runs the vertical pass first when h - H > 2 * (w - W) or the width does not shrink: cases
    # on both sides of that rule, its boundary (30x60 -> 25x50 is a tie, horizontal first), a tall
    # TI2V-like uniform downscale, single passes and 1-pixel edges.
    lanczos = [(37, 23, 80, 50), (37, 23, 16, 9), (37, 23, 50, 13), (37, 23, 37, 23), (37, 23, 37, 40),
               (37, 23, 60, 23), (1, 1, 5, 3), (37, 23, 1, 1), (5, 1, 1, 7), (64, 48, 13, 7), (40, 30, 41, 29),
               (30, 60, 25, 50), (30, 60, 25, 49), (30, 60, 25, 51), (20, 70, 9, 31), (37, 23, 37, 9)]
    rng = np.random.default_rng(99)
    for _ in range(14):  # random size pairs: every mix of up / down / unchanged per axis
        wi, hi, wo, ho = (int(v) for v in rng.integers(1, 49, 4))
        lanczos.append((wi, hi, wo, ho))
    smooth = np.array(Image.fromarray(base_rgb()))
    for i, (wi, hi, wo, ho) in enumerate(lanczos):
        src = smooth if (wi, hi) == (W, H) and i % 2 == 1 else rng.integers(0, 256, (hi, wi, 3), dtype=np.uint8)
        out = np.array(Image.fromarray(src).resize((wo, ho), Image.LANCZOS))
        cases[f"lanczos/{i}/in"] = np.ascontiguousarray(src)
        cases[f"lanczos/{i}/out"] = out
    img = base_rgb()
    t = torch.from_numpy(img).permute(2, 0, 1).contiguous().to(torch.float32).div(255)  # TF.to_tensor
    cases["to_tensor/in"] = img
    cases["to_tensor/out"] = t.sub_(0.5).div_(0.5).numpy()
    return cases


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures",
                                                             "image")
    os.makedirs(out, exist_ok=True)
    tensors = write_images(out)
    tensors.update(op_cases())
    save_file(tensors, os.path.join(out, "expected.safetensors"))
    os.chmod(os.path.join(out, "expected.safetensors"), 0o644)
    total = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"wrote {len(os.listdir(out))} files, {total} bytes, to {out}")


if __name__ == "__main__":
    main()
