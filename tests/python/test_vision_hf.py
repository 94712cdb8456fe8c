#!/usr/bin/env python3
"""model/vision/ against transformers' Qwen2-VL and Qwen2.5-VL: the encoder, then the whole model.

For each family, transformers itself builds a small random model (torch.manual_seed; biases and
norm weights drawn too, so every tensor the C side reads changes the result) and writes it with
save_pretrained, next to a preprocessor_config.json from its own image processor. Images of
several sizes and aspect ratios are drawn with numpy and written as PNG by Pillow. Then:
  - HF: Qwen2VLImageProcessorPil on the opened file, then model.model.visual(pixel_values,
    grid_thw).pooler_output in f32, all images of a family in one call (as a prompt with several
    images runs) and each image alone;
  - C: tests/tools/vision_encode_dump.c decodes, processes and encodes each file.
Per image, the embeddings must agree within 1e-4 of the reference's largest magnitude; the
measured maximum is printed. Qwen2.5-VL's sizes cut windows of window_size pixels partly (sides
not multiples of a window) and wholly; its config puts full-attention blocks between windowed
ones. A config with a width that does not split into heads, and an image of a text-only model,
must fail with an error naming the problem.
Exits 77 (skipped, which make test counts as a failure) only when numpy, Pillow, torch or
transformers is not importable (scripts/setup.sh pins them into .venv-tools/).
Then the language model with images: three prompts of 1 to 3 images (placeholders between text),
HF's last-position logits and 32 greedy tokens (model.generate) against pdserve-generate --image
with the same images, unchunked and with chunked prefills of 7 and 64 tokens cutting through the
image tokens: logits within 1e-4 of their scale, tokens identical.
Last, pdserve-mkmodel's qwen2_vl and qwen2_5_vl models are loaded by transformers
(AutoProcessor, AutoModelForImageTextToText): a chat with an image renders through their chat
template to one <|image_pad|>, and HF's greedy tokens equal pdserve-generate's for it.
usage: test_vision_hf.py PATH/TO/pd_vision_encode_dump PATH/TO/pdserve-generate
       PATH/TO/pdserve-mkmodel
"""
import json
import os
import subprocess
import sys
import tempfile
import time

try:
    import numpy as np
    import torch
    from PIL import Image
    from transformers import (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration,
                              Qwen2VLConfig, Qwen2VLForConditionalGeneration,
                              Qwen2VLImageProcessorPil)
except Exception as e:  # ImportError, or a broken install
    print(f"SKIP: numpy, Pillow, torch or transformers is not importable: {type(e).__name__}: {e}; "
          "scripts/setup.sh installs them into .venv-tools/ "
          f"(this is {sys.executable})")
    sys.exit(77)

TOLERANCE = 1e-4
TEXT = dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, bos_token_id=None, eos_token_id=None,
            rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]})
# the placeholder ids inside the small vocabulary
TOKEN_IDS = dict(image_token_id=990, video_token_id=991, vision_start_token_id=992,
                 vision_end_token_id=993)
IMG, V_START, V_END = 990, 992, 993
NEW_TOKENS = 32
FAMILIES = {
    "qwen2_vl": (Qwen2VLConfig, Qwen2VLForConditionalGeneration,
                 dict(depth=2, embed_dim=48, hidden_size=64, num_heads=4, mlp_ratio=2,
                      patch_size=14, spatial_merge_size=2, temporal_patch_size=2)),
    "qwen2_5_vl": (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration,
                   dict(depth=4, hidden_size=48, intermediate_size=80, num_heads=4,
                        out_hidden_size=64, patch_size=14, spatial_merge_size=2,
                        temporal_patch_size=2, window_size=112, fullatt_block_indexes=[1, 3])),
}
# (width, height): square, wide, tall, small (upscaled to min_pixels), windows cut partly
SIZES = [(56, 56), (252, 364), (460, 100), (90, 600), (30, 40), (224, 224), (333, 257)]
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL: " + what)
    return ok


def make_image(rng, w, h):
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)),
                    ((x + y) % 64) * 4], axis=-1).astype(np.int32)
    img += rng.integers(-40, 40, size=img.shape)
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")


def build(family, tmp):
    cfg_cls, model_cls, vision = FAMILIES[family]
    torch.manual_seed(7)
    model = model_cls(cfg_cls(text_config=TEXT, vision_config=vision, **TOKEN_IDS)).eval()
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
            elif p.ndim == 1:  # norm weights
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0, 0.08)
    d = os.path.join(tmp, family)
    model.save_pretrained(d)
    proc = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=28 * 28 * 160)
    proc.save_pretrained(d)
    return model, proc, d


def hf_embeddings(model, proc, files):
    imgs = [Image.open(f) for f in files]
    out = proc(images=imgs, return_tensors="pt")
    pv, thw = out["pixel_values"].float(), out["image_grid_thw"]
    with torch.no_grad():
        emb = model.model.visual(pv, grid_thw=thw).pooler_output.float().numpy()
    per, at = [], 0
    for t, h, w in thw.tolist():
        n = t * h * w // 4
        per.append(emb[at:at + n])
        at += n
    return per, thw.tolist()


def run_family(family, dump, tmp, rng):
    t0 = time.time()
    model, proc, d = build(family, tmp)
    files = []
    for i, (w, h) in enumerate(SIZES):
        f = os.path.join(tmp, "%s_%d.png" % (family, i))
        make_image(rng, w, h).save(f)
        files.append(f)
    ref, grids = hf_embeddings(model, proc, files)
    # each image alone through HF too: a prompt's images encoded together or one by one agree
    for i, f in enumerate(files):
        alone, _ = hf_embeddings(model, proc, [f])
        check(np.allclose(alone[0], ref[i], rtol=0, atol=1e-5 * np.abs(ref[i]).max()),
              "%s image %d: HF alone vs HF batched" % (family, i))
    prefix = os.path.join(tmp, family + "_out")
    r = subprocess.run([dump, d, prefix] + files, capture_output=True, text=True, timeout=300)
    if not check(r.returncode == 0, "%s: vision_encode_dump failed: %s" % (family, r.stderr)):
        return
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    worst = 0.0
    for i, (line, grid) in enumerate(zip(lines, grids)):
        check(line["grid_thw"] == grid, "%s image %d: grid %s vs HF %s" %
              (family, i, line["grid_thw"], grid))
        got = np.fromfile("%s.%d.f32" % (prefix, i), dtype=np.float32)
        want = ref[i]
        if not check(got.size == want.size, "%s image %d: %d values vs HF %d" %
                     (family, i, got.size, want.size)):
            continue
        got = got.reshape(want.shape)
        scale = float(np.abs(want).max())
        err = float(np.abs(got - want).max()) / scale
        worst = max(worst, err)
        check(err <= TOLERANCE, "%s image %d (%dx%d, grid %s): max error %.3g of max |ref| %.3g" %
              (family, i, SIZES[i][0], SIZES[i][1], grid, err, scale))
    print("%s: %d images, tokens %s, max error %.3g of max |ref| (limit %g), %.1f s" %
          (family, len(files), [g[0] * g[1] * g[2] // 4 for g in grids], worst, TOLERANCE,
           time.time() - t0))
    generate(family, model, proc, d, files, grids, tmp)


def prompt_ids(rng, n_images):
    """Text ids around n_images placeholders, each <|vision_start|><|image_pad|><|vision_end|>."""
    ids = list(rng.integers(0, 900, size=5))
    for _ in range(n_images):
        ids += [V_START, IMG, V_END] + list(rng.integers(0, 900, size=4))
    return [int(x) for x in ids]


def generate(family, model, proc, d, files, grids, tmp):
    """The language model with images: HF's last-position logits and 32 greedy tokens against
    pdserve-generate --image, unchunked and in chunks that cut through the image tokens."""
    gen = GENERATE[0]
    rng = np.random.default_rng(11)
    for picks in ([1], [2, 6], [0, 5, 3]):
        ids = prompt_ids(rng, len(picks))
        imgs = [Image.open(files[k]) for k in picks]
        out = proc(images=imgs, return_tensors="pt")
        expanded = []
        for t in ids:  # as the HF processor expands <|image_pad|>
            if t == IMG:
                t_, h, w = grids[picks[len([x for x in expanded if x == V_END])]]
                expanded += [IMG] * (t_ * h * w // 4)
            else:
                expanded.append(t)
        inp = torch.tensor([expanded])
        kw = dict(pixel_values=out["pixel_values"], image_grid_thw=out["image_grid_thw"],
                  mm_token_type_ids=(inp == IMG).int())
        with torch.no_grad():
            logits = model(input_ids=inp, **kw).logits[0, -1].float().numpy()
            toks = model.generate(inp, **kw, max_new_tokens=NEW_TOKENS, do_sample=False,
                                  min_new_tokens=NEW_TOKENS)[0, len(expanded):].tolist()
        what = "%s images %s (%d prompt tokens)" % (family, picks, len(expanded))
        for chunk in (4096, 7, 64):
            lf = os.path.join(tmp, "logits.f32")
            r = subprocess.run([gen, "--model-path", d, "--prompt-ids", " ".join(map(str, ids)),
                                "--image", ",".join(files[k] for k in picks), "--max-new-tokens",
                                str(NEW_TOKENS), "--ignore-eos", "--chunked-prefill-size",
                                str(chunk), "--logits-out", lf, "--threads", "2"],
                               capture_output=True, text=True, timeout=300)
            if not check(r.returncode == 0, "%s chunk %d: pdserve-generate failed: %s" %
                         (what, chunk, r.stderr)):
                continue
            got = np.fromfile(lf, dtype=np.float32)
            err = float(np.abs(got - logits).max() / np.abs(logits).max())
            ours = [int(x) for x in r.stdout.split()]
            check(err <= TOLERANCE, "%s chunk %d: last logits off by %.3g of their scale" %
                  (what, chunk, err))
            same = next((i for i, (a, b) in enumerate(zip(ours, toks)) if a != b), len(toks))
            check(ours == toks, "%s chunk %d: greedy tokens differ from token %d: %s vs HF %s" %
                  (what, chunk, same, ours, toks))
            print("%s chunk %d: logits max error %.3g of scale, %d greedy tokens %s" %
                  (what, chunk, err, len(ours), "equal" if ours == toks else "DIFFER"))


def bad_inputs(dump, tmp, rng):
    f = os.path.join(tmp, "bad.png")
    make_image(rng, 56, 56).save(f)
    # a text-only model has no vision encoder
    d = os.path.join(tmp, "text_only")
    os.makedirs(d, exist_ok=True)
    json.dump({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]},
              open(os.path.join(d, "config.json"), "w"))
    Qwen2VLImageProcessorPil().save_pretrained(d)
    r = subprocess.run([dump, d, os.path.join(tmp, "x"), f], capture_output=True, text=True)
    check(r.returncode == 1 and "has no vision encoder" in r.stderr,
          "text-only model: %r" % r.stderr)
    # heads that do not split the width
    d2 = os.path.join(tmp, "qwen2_vl")
    cfg = json.load(open(os.path.join(d2, "config.json")))
    cfg["vision_config"]["num_heads"] = 5
    d3 = os.path.join(tmp, "bad_heads")
    os.makedirs(d3, exist_ok=True)
    json.dump(cfg, open(os.path.join(d3, "config.json"), "w"))
    Qwen2VLImageProcessorPil().save_pretrained(d3)
    r = subprocess.run([dump, d3, os.path.join(tmp, "x"), f], capture_output=True, text=True)
    check(r.returncode == 1 and "heads" in r.stderr, "width not split into heads: %r" % r.stderr)


def mkmodel_family(family, mkmodel, tmp, rng):
    """pdserve-mkmodel's vision-language families, read by transformers: the processor (image
    processor, tokenizer, chat template) renders a chat with an image into input ids, and the
    model transformers loads generates what pdserve-generate does from those ids and the image."""
    d = os.path.join(tmp, "mk_" + family)
    r = subprocess.run([mkmodel, "--family", family, "--out", d], capture_output=True, text=True)
    if not check(r.returncode == 0, "mkmodel %s: %s" % (family, r.stderr)):
        return
    # the processor's parts (AutoProcessor would want torchvision for a video processor)
    from transformers import AutoModelForImageTextToText, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(d)
    improc = Qwen2VLImageProcessorPil.from_pretrained(d)
    model = AutoModelForImageTextToText.from_pretrained(d, dtype=torch.float32).eval()
    f = os.path.join(tmp, "mk_%s.png" % family)
    make_image(rng, 150, 100).save(f)
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text",
                                                            "text": "What is in it?"}]}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    cfg = json.load(open(os.path.join(d, "config.json")))
    img = cfg["image_token_id"]
    check("<|vision_start|><|image_pad|><|vision_end|>" in text,
          "mkmodel %s: the chat template puts the image placeholder: %r" % (family, text))
    one = tok(text)["input_ids"]
    check(one.count(img) == 1, "mkmodel %s: one <|image_pad|> (id %d) in %s" % (family, img, one))
    pv = improc(images=[Image.open(f)], return_tensors="pt")
    t_, h, w = pv["image_grid_thw"][0].tolist()
    expanded = []
    for t in one:  # as Qwen2VLProcessor expands <|image_pad|>
        expanded += [img] * (t_ * h * w // 4) if t == img else [t]
    ids = torch.tensor([expanded])
    with torch.no_grad():
        g = model.generate(ids, pixel_values=pv["pixel_values"],
                           image_grid_thw=pv["image_grid_thw"], mm_token_type_ids=(ids == img).int(),
                           max_new_tokens=NEW_TOKENS, do_sample=False, min_new_tokens=NEW_TOKENS,
                           eos_token_id=None, output_logits=True, return_dict_in_generate=True,
                           repetition_penalty=1.0)  # mkmodel's generation_config has 1.05
    toks = g.sequences[0, ids.shape[1]:].tolist()
    lf = os.path.join(tmp, "mk_logits.f32")
    r = subprocess.run([GENERATE[0], "--model-path", d, "--prompt-ids",
                        " ".join(map(str, one)), "--image", f, "--max-new-tokens",
                        str(NEW_TOKENS), "--ignore-eos", "--ids", "--threads", "2",
                        "--logits-out", lf], capture_output=True, text=True, timeout=300)
    if not check(r.returncode == 0, "mkmodel %s: pdserve-generate: %s" % (family, r.stderr)):
        return
    ours = [int(x) for x in r.stdout.strip().splitlines()[-1].split()]
    want = g.logits[0][0].float().numpy()
    err = float(np.abs(np.fromfile(lf, dtype=np.float32) - want).max() / np.abs(want).max())
    check(err <= TOLERANCE, "mkmodel %s: prompt logits off by %.3g of their scale" % (family, err))
    # bf16 weights at 1/sqrt(fan-in) give flat logits: greedy paths may part only where HF's top
    # two are within float noise of each other (1e-5 of the row's scale)
    k = next((i for i, (a, b) in enumerate(zip(ours, toks)) if a != b), len(toks))
    if k < len(toks):
        top2 = np.sort(g.logits[k][0].float().numpy())[-2:]
        gap = float(top2[1] - top2[0]) / float(np.abs(g.logits[k][0].float().numpy()).max())
        check(gap < 1e-5, "mkmodel %s: greedy tokens part at %d where HF's top two are %.3g of "
              "the scale apart: %s vs HF %s" % (family, k, gap, ours, toks))
    print("mkmodel %s: HF loads it; %d prompt tokens with the image, logits error %.3g, greedy "
          "tokens equal for %d of %d%s" % (family, ids.shape[1], err, k, len(toks),
                                           "" if k == len(toks) else " (then a tie)"))


GENERATE = []


def main():
    dump = sys.argv[1]
    GENERATE.append(sys.argv[2])
    mkmodel = sys.argv[3]
    torch.set_num_threads(2)
    base = os.environ.get("PD_TEST_TMPDIR")
    if base:
        os.makedirs(base, exist_ok=True)
    rng = np.random.default_rng(5)
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        for family in FAMILIES:
            run_family(family, dump, tmp, rng)
        bad_inputs(dump, tmp, rng)
        for family in FAMILIES:
            mkmodel_family(family, mkmodel, tmp, rng)
    if failures:
        print("%d failures" % len(failures))
        sys.exit(1)
    print("PASS")


if __name__ == "__main__":
    main()
