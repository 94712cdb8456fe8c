#!/usr/bin/env python3
"""model/vision/ against Pillow and transformers' Qwen2-VL image processor, bit for bit.

Images are made here with numpy (gradients, waves, noise and a hard-edged checkerboard, so the
resampling filter overshoots and clips), written as files by Pillow or, for what Pillow cannot
write (16-bit truecolour and grey+alpha, 2- and 4-bit grey, palettes with tRNS alphas, colour
keys, Adam7 interlacing), by a small PNG writer below. For every image the C driver
(tests/tools/image_process_dump.c) runs each stage and its raw output is compared with:
  decode   transformers' convert_to_rgb(Image.open(file)) (alpha composited on white), and
           Image.open(file).convert("RGB") for the drop-alpha mode: must be equal bytes;
  resize   Image.resize with every filter Pillow's convolution implements: equal bytes;
  process  Qwen2VLImageProcessorPil.from_pretrained(dir) on the opened file, for a Qwen2-VL
           style preprocessor_config.json (min/max_pixels), a Qwen2.5-VL one as transformers 5
           writes it (size.shortest_edge/longest_edge, every flag spelled out) and one with other
           pixel bounds, patch size, mean and std: grid_thw equal, pixel_values within 1e-6
           (the measured maximum per image kind is printed; equal bits are the aim).
Broken inputs (truncated PNG and JPEG, garbage, an aspect ratio over 200) must fail in both.
Exits 77 (CTest: skipped, which make test counts as a failure) only when numpy, Pillow or
transformers is not importable (scripts/setup.sh pins them into .venv-tools/).
usage: test_image_processor_hf.py PATH/TO/pd_image_process_dump
"""
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
import warnings
import zlib

try:
    import numpy as np
    from PIL import Image
    from transformers import Qwen2VLImageProcessorPil
    from transformers.image_transforms import convert_to_rgb
except Exception as e:  # ImportError, or a broken install
    print(f"SKIP: numpy, Pillow or transformers is not importable: {type(e).__name__}: {e}; "
          "scripts/setup.sh installs them into .venv-tools/ "
          f"(this is {sys.executable})")
    sys.exit(77)

# Pillow warns that a palette with tRNS alphas is better converted to RGBA, which is what the test
# does on purpose (transformers' convert_to_rgb makes it RGBA before compositing)
warnings.filterwarnings("ignore", message="Palette images with Transparency")
TOLERANCE = 1e-6
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
CONFIGS = {
    # Qwen/Qwen2-VL-7B-Instruct's preprocessor_config.json
    "qwen2_vl": {
        "min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14,
        "temporal_patch_size": 2, "merge_size": 2, "image_mean": CLIP_MEAN,
        "image_std": CLIP_STD, "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen2VLProcessor",
    },
    # Qwen2.5-VL's, as transformers 5 saves it: size instead of min/max_pixels, flags spelled out
    "qwen2_5_vl": {
        "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
        "image_mean": CLIP_MEAN, "image_std": CLIP_STD,
        "image_processor_type": "Qwen2VLImageProcessor", "merge_size": 2, "patch_size": 14,
        "processor_class": "Qwen2_5_VLProcessor", "resample": 3,
        "rescale_factor": 0.00392156862745098,
        "size": {"longest_edge": 12845056, "shortest_edge": 3136}, "temporal_patch_size": 2,
    },
    # other bounds (small images grow, large ones shrink hard), patches and statistics
    "custom": {
        "min_pixels": 64 * 64 * 3, "max_pixels": 32 * 32 * 96, "patch_size": 16,
        "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5], "image_processor_type": "Qwen2VLImageProcessor",
    },
}

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)
    return cond


rng = np.random.default_rng(20240518)


def content(h, w, channels=3):
    """A test picture: gradients, a wave, noise and a 0/255 checkerboard (hard edges)."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    planes = [xx * 255 / max(w - 1, 1), yy * 255 / max(h - 1, 1),
              127.5 + 127.5 * np.sin((xx + 2 * yy) / 7.0)]
    a = np.stack(planes[:channels] + planes[:max(0, channels - 3)], -1)
    a += rng.normal(0, 18, a.shape)
    y0, y1, x0, x1 = h // 3, max(h // 3 + 1, h // 2), w // 3, max(w // 3 + 1, w // 2)
    checker = ((xx[y0:y1, x0:x1] // 3 + yy[y0:y1, x0:x1] // 3) % 2) * 255
    a[y0:y1, x0:x1] = checker[..., None]
    return np.clip(np.rint(a), 0, 255).astype(np.uint8)


# ---- a PNG writer for what Pillow does not write ----

def _chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(
        ">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def _pack_row(samples, bit_depth):
    if bit_depth == 16:
        return samples.astype(">u2").tobytes()
    if bit_depth == 8:
        return samples.astype(np.uint8).tobytes()
    per_byte = 8 // bit_depth
    padded = np.zeros(-(-len(samples) // per_byte) * per_byte, np.uint8)
    padded[:len(samples)] = samples
    groups = padded.reshape(-1, per_byte).astype(np.uint16)
    shifts = np.arange(per_byte - 1, -1, -1) * bit_depth
    return (groups << shifts).sum(1).astype(np.uint8).tobytes()


ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
         (0, 1, 1, 2)]


def png_encode(samples, color_type, bit_depth, plte=None, trns=None, interlace=False):
    """samples: [h][w][channels] integers of bit_depth bits (palette indices for type 3)."""
    h, w = samples.shape[:2]
    flat = samples.reshape(h, w, -1)
    raw = bytearray()
    passes = ADAM7 if interlace else [(0, 0, 1, 1)]
    for x0, y0, dx, dy in passes:
        sub = flat[y0::dy, x0::dx]
        if sub.shape[0] == 0 or sub.shape[1] == 0:
            continue
        for row in sub:
            raw += b"\0" + _pack_row(row.reshape(-1), bit_depth)
    out = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(
        ">IIBBBBB", w, h, bit_depth, color_type, 0, 0, 1 if interlace else 0))
    if plte is not None:
        out += _chunk(b"PLTE", bytes(np.asarray(plte, np.uint8).reshape(-1)))
    if trns is not None:
        out += _chunk(b"tRNS", trns)
    return out + _chunk(b"IDAT", zlib.compress(bytes(raw), 6)) + _chunk(b"IEND", b"")


# ---- the images ----

def pil_bytes(im, fmt, **kw):
    import io
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def rgba(h, w):
    a = content(h, w, 4)
    a[..., 3][: h // 4] = 0       # fully transparent band
    a[..., 3][h // 4: h // 2] = 255
    return a


def palette_image(h, w, n_colors):
    idx = (content(h, w, 1)[..., 0].astype(np.int64) * n_colors // 256).astype(np.uint8)
    plte = rng.integers(0, 256, (n_colors, 3))
    return idx, plte


def make_images():
    imgs = {}  # name -> (kind, bytes)

    def add(kind, name, data):
        imgs[name] = (kind, data)

    for w, h in [(640, 480), (480, 640), (28, 28), (29, 27), (56, 30), (15, 40), (1, 1),
                 (3, 200), (1500, 1200), (300, 1400), (2000, 150)]:
        add("PNG RGB", f"rgb_{w}x{h}.png", pil_bytes(Image.fromarray(content(h, w)), "PNG"))
    add("PNG RGBA", "rgba_333x222.png", pil_bytes(Image.fromarray(rgba(222, 333), "RGBA"), "PNG"))
    add("PNG L", "l_200x150.png",
        pil_bytes(Image.fromarray(content(150, 200, 1)[..., 0], "L"), "PNG"))
    la = np.stack([content(200, 150, 1)[..., 0], rgba(200, 150)[..., 3]], -1)
    add("PNG LA", "la_150x200.png", pil_bytes(Image.fromarray(la, "LA"), "PNG"))
    idx, plte = palette_image(171, 256, 200)
    pim = Image.fromarray(idx, "P")
    pim.putpalette(plte.astype(np.uint8).reshape(-1).tolist())
    add("PNG P", "p_256x171.png", pil_bytes(pim, "PNG"))
    add("PNG P+tRNS", "p_single_trns.png", pil_bytes(pim, "PNG", transparency=7))
    alphas = bytes(rng.integers(0, 256, 120).astype(np.uint8))
    add("PNG P+tRNS", "p_alpha_trns.png", png_encode(idx, 3, 8, plte=plte, trns=alphas))
    idx4, plte4 = palette_image(90, 130, 16)
    add("PNG P", "p_4bit.png", png_encode(idx4, 3, 4, plte=plte4))
    grey = content(120, 161, 1)[..., 0]
    add("PNG 1-bit", "grey_1bit.png", pil_bytes(Image.fromarray(grey > 127), "PNG"))
    add("PNG 2/4-bit", "grey_2bit.png", png_encode(grey >> 6, 0, 2))
    add("PNG 2/4-bit", "grey_4bit.png", png_encode(grey >> 4, 0, 4))
    key = int(grey[5, 5])
    add("PNG key", "grey_trns.png", png_encode(grey, 0, 8, trns=struct.pack(">H", key)))
    rgb8 = content(97, 133)
    r, g, b = (int(v) for v in rgb8[10, 10])
    add("PNG key", "rgb_trns.png", png_encode(rgb8, 2, 8, trns=struct.pack(">HHH", r, g, b)))
    add("PNG interlaced", "rgb_adam7.png", png_encode(content(101, 203), 2, 8, interlace=True))
    add("PNG interlaced", "rgba_adam7.png", png_encode(rgba(37, 45), 6, 8, interlace=True))
    wide = content(140, 190).astype(np.uint16) * 257 + rng.integers(0, 257, (140, 190, 3))
    add("PNG 16-bit", "rgb16.png", png_encode(wide, 2, 16))
    a16 = rgba(110, 90).astype(np.uint16) * 257 + rng.integers(0, 257, (110, 90, 4))
    add("PNG 16-bit", "rgba16.png", png_encode(a16, 6, 16))
    add("PNG 16-bit", "la16.png", png_encode(a16[..., [0, 3]], 4, 16))
    g16 = content(130, 170, 1)[..., 0].astype(np.uint16) * 257
    g16[:40] //= 300  # values below 256: Pillow's I;16 -> RGB keeps them, clips the rest
    add("PNG 16-bit", "grey16.png", pil_bytes(Image.fromarray(g16.astype(np.uint16)), "PNG"))

    photo = Image.fromarray(content(480, 640))
    add("JPEG 4:2:0", "jpeg_420.jpg", pil_bytes(photo, "JPEG", quality=90))
    add("JPEG 4:2:0", "jpeg_odd.jpg",
        pil_bytes(Image.fromarray(content(199, 301)), "JPEG", quality=75))
    add("JPEG 4:4:4", "jpeg_444.jpg", pil_bytes(photo, "JPEG", quality=95, subsampling=0))
    add("JPEG 4:2:2", "jpeg_422.jpg",
        pil_bytes(Image.fromarray(content(129, 257)), "JPEG", subsampling=1))
    add("JPEG progressive", "jpeg_prog.jpg",
        pil_bytes(Image.fromarray(content(333, 250)), "JPEG", progressive=True))
    add("JPEG grey", "jpeg_grey.jpg", pil_bytes(photo.convert("L"), "JPEG"))
    add("JPEG CMYK", "jpeg_cmyk.jpg",
        pil_bytes(Image.fromarray(content(80, 120)).convert("CMYK"), "JPEG"))
    return imgs


# ---- running the driver ----

def run_tool(tool, *args):
    r = subprocess.run([tool, *args], capture_output=True, text=True, timeout=120)
    info = json.loads(r.stdout) if r.returncode == 0 and r.stdout.strip() else None
    return r.returncode, info, r.stderr


def check_decode(tool, tmp, name, path):
    ref = convert_to_rgb(Image.open(path), return_numpy=True)
    out = os.path.join(tmp, "decoded.raw")
    rc, info, err = run_tool(tool, "decode", path, out)
    if not check(rc == 0, f"{name}: decode failed: {err.strip()}"):
        return
    got = np.fromfile(out, np.uint8)
    if not check(got.size == ref.size, f"{name}: decoded {got.size} bytes, Pillow {ref.size}"):
        return
    n_diff = int((got != ref.reshape(-1)).sum())
    check(n_diff == 0, f"{name}: decoded pixels differ from transformers' convert_to_rgb "
                       f"in {n_diff} of {ref.size} values")
    plain = np.asarray(Image.open(path).convert("RGB"))
    rc, info, err = run_tool(tool, "decode", path, out, "drop")
    got = np.fromfile(out, np.uint8)
    check(rc == 0 and got.size == plain.size and (got == plain.reshape(-1)).all(),
          f"{name}: drop-alpha decode differs from Image.convert('RGB')")


def check_resize(tool, tmp, path):
    """Every convolution filter, up and down, both pass orders of Pillow 13."""
    im = Image.fromarray(convert_to_rgb(Image.open(path), return_numpy=True))
    w, h = im.size
    out = os.path.join(tmp, "resized.raw")
    sizes = [(max(1, w * 2 // 3), max(1, h // 4)), (w * 3 // 2 + 1, max(1, h - 3)),
             (max(1, w - 5), h * 2 + 7)]
    for filt in (1, 2, 3, 4, 5):
        for W, H in sizes:
            ref = np.asarray(im.resize((W, H), resample=filt))
            rc, info, err = run_tool(tool, "resize", path, out, str(W), str(H), str(filt))
            got = np.fromfile(out, np.uint8) if rc == 0 else None
            check(rc == 0 and got.size == ref.size and (got == ref.reshape(-1)).all(),
                  f"{os.path.basename(path)}: resize to {W}x{H} with filter {filt} differs "
                  f"from Pillow ({err.strip()})")


def check_process(tool, tmp, cfg_name, cfg_dir, proc, name, kind, path, worst):
    with Image.open(path) as im:
        ref = proc(images=im, return_tensors="np")
    ref_values = np.asarray(ref["pixel_values"], np.float32)
    ref_grid = [int(v) for v in np.asarray(ref["image_grid_thw"]).reshape(-1)]
    out = os.path.join(tmp, "values.f32")
    rc, info, err = run_tool(tool, "process", path, out,
                             os.path.join(cfg_dir, "preprocessor_config.json"))
    if not check(rc == 0, f"{cfg_name}/{name}: process failed: {err.strip()}"):
        return
    if not check(info["grid_thw"] == ref_grid,
                 f"{cfg_name}/{name}: grid_thw {info['grid_thw']}, transformers {ref_grid}"):
        return
    got = np.fromfile(out, np.float32)
    if not check(got.size == ref_values.size and
                 [info["rows"], info["cols"]] == list(ref_values.shape),
                 f"{cfg_name}/{name}: pixel_values {info['rows']}x{info['cols']}, "
                 f"transformers {list(ref_values.shape)}"):
        return
    got = got.reshape(ref_values.shape)
    diff = float(np.abs(got.astype(np.float64) - ref_values).max())
    equal = bool(np.array_equal(got.view(np.uint32), ref_values.view(np.uint32)))
    key = kind
    prev = worst.get(key, (0.0, True))
    worst[key] = (max(prev[0], diff), prev[1] and equal)
    check(diff <= TOLERANCE, f"{cfg_name}/{name}: pixel_values differ by {diff:g} "
                             f"(tolerance {TOLERANCE:g})")


def check_errors(tool, tmp, imgs, procs):
    def write(name, data):
        p = os.path.join(tmp, name)
        with open(p, "wb") as f:
            f.write(data)
        return p

    def pil_fails(p):
        try:
            with Image.open(p) as im:
                im.load()
            return False
        except Exception:
            return True

    out = os.path.join(tmp, "err.raw")
    png = imgs["rgb_640x480.png"][1]
    jpg = imgs["jpeg_420.jpg"][1]
    cases = [("truncated.png", png[: len(png) // 2], "truncated"),
             ("truncated.jpg", jpg[: len(jpg) // 2], "truncated"),
             ("garbage.png", bytes(rng.integers(0, 256, 500).astype(np.uint8)),
              "not a PNG or JPEG")]
    for name, data, needle in cases:
        p = write(name, data)
        rc, info, err = run_tool(tool, "decode", p, out)
        check(rc == 1 and needle in err, f"{name}: want an error naming '{needle}', got rc {rc} "
                                         f"'{err.strip()}'")
        check(pil_fails(p), f"{name}: Pillow loads it, so it is no broken-input case")
    thin = write("thin_201x1.png", pil_bytes(Image.fromarray(content(1, 201)), "PNG"))
    rc, info, err = run_tool(tool, "process", thin, out,
                             os.path.join(procs["qwen2_vl"][0], "preprocessor_config.json"))
    check(rc == 1 and "aspect ratio" in err, f"201x1 image: want the aspect-ratio error, got "
                                             f"rc {rc} '{err.strip()}'")
    try:
        procs["qwen2_vl"][1](images=Image.open(thin), return_tensors="np")
        check(False, "201x1 image: transformers accepts it, expected its aspect-ratio error")
    except ValueError as e:
        check("aspect ratio" in str(e), f"201x1 image: transformers fails otherwise: {e}")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    tool = sys.argv[1]
    start = time.monotonic()
    base = os.environ.get("PD_TEST_TMPDIR") or None
    if base:
        os.makedirs(base, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="image_processor_hf.", dir=base) as tmp:
        imgs = make_images()
        paths = {}
        for name, (kind, data) in imgs.items():
            paths[name] = os.path.join(tmp, name)
            with open(paths[name], "wb") as f:
                f.write(data)
        procs = {}
        for cfg_name, cfg in CONFIGS.items():
            d = os.path.join(tmp, cfg_name)
            os.makedirs(d)
            with open(os.path.join(d, "preprocessor_config.json"), "w") as f:
                json.dump(cfg, f, indent=2)
            procs[cfg_name] = (d, Qwen2VLImageProcessorPil.from_pretrained(d))

        for name, path in paths.items():
            check_decode(tool, tmp, name, path)
        for name in ("rgb_640x480.png", "rgb_300x1400.png", "rgb_29x27.png", "rgba_333x222.png"):
            check_resize(tool, tmp, paths[name])
        worst = {}
        for cfg_name, (d, proc) in procs.items():
            for name, path in paths.items():
                check_process(tool, tmp, cfg_name, d, proc, name, imgs[name][0], path, worst)
        check_errors(tool, tmp, imgs, procs)

    print("pixel_values against transformers' Qwen2VLImageProcessorPil, max |diff| per kind:")
    for kind, (diff, equal) in worst.items():
        print(f"  {kind:18s} {diff:.3g}{'  (bit-equal)' if equal else ''}")
    print(f"{len(imgs)} images x {len(CONFIGS)} configs, {time.monotonic() - start:.1f} s")
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
