#!/usr/bin/env python3
"""Sliding-window attention against an independent reference: a plain numpy forward pass of the
Hugging Face architecture (RMSNorm, rotate-half RoPE, GQA attention with transformers' sliding
mask: position p sees keys p - W + 1 .. p, SwiGLU MLP), written here from the model files alone.

For a mistral model (window on every layer) and a qwen2 model (q/k/v bias, tied embeddings,
window on layers >= max_window_layers = 1) made by pdserve-mkmodel with --sliding-window 8 and a
37-token prompt, pdserve-generate's last-position logits must match the reference within 1e-4
(max |ours - ref| / max |ref|) and its 8 greedy tokens must be the reference's. The same
reference without the window must disagree (the window matters for this prompt), so the check
cannot pass by ignoring it.

Exits 77 (CTest: skipped) when numpy is not installed (scripts/setup.sh installs python3-numpy).
usage: test_sliding_window_ref.py BUILD_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError as e:
    print(f"SKIP: numpy is needed ({e}); apt-get install python3-numpy (scripts/setup.sh)")
    sys.exit(77)

WINDOW = 8
PROMPT = 37
GREEDY = 8
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)


def load_file(path):
    """An f32 safetensors file (8-byte header length, JSON header, data) as numpy arrays."""
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] != "F32":
            raise SystemExit(f"{path}: {name} is {t['dtype']}; this reference reads F32 only")
        b, e = t["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + b:8 + n + e], dtype="<f4").reshape(t["shape"])
    return out


def rmsnorm(x, w, eps):
    return (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)) * w


def rope(x, theta):
    """x [T][heads][d]: transformers' rotate_half convention, positions 0..T-1."""
    t, _, d = x.shape
    inv = 1.0 / (theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    ang = np.outer(np.arange(t, dtype=np.float64), inv)
    cos = np.cos(np.concatenate([ang, ang], -1))[:, None, :]
    sin = np.sin(np.concatenate([ang, ang], -1))[:, None, :]
    rot = np.concatenate([-x[..., d // 2:], x[..., :d // 2]], -1)
    return x * cos + rot * sin


def forward(w, cfg, ids, window_layers):
    """Last-position logits of ids; window_layers: the layers that slide (others see all)."""
    f64 = {k: v.astype(np.float64) for k, v in w.items()}
    H, KVH, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    x = f64["model.embed_tokens.weight"][ids]
    t = len(ids)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rmsnorm(x, f64[p + "input_layernorm.weight"], eps)

        def proj(name):
            y = h @ f64[p + f"self_attn.{name}_proj.weight"].T
            b = f64.get(p + f"self_attn.{name}_proj.bias")
            return y + b if b is not None else y
        q = rope(proj("q").reshape(t, H, d), theta)
        k = rope(proj("k").reshape(t, KVH, d), theta)
        v = proj("v").reshape(t, KVH, d)
        k = np.repeat(k, H // KVH, axis=1)
        v = np.repeat(v, H // KVH, axis=1)
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(d)
        qi, ki = np.arange(t)[:, None], np.arange(t)[None, :]
        mask = ki <= qi
        if l in window_layers:
            mask &= ki > qi - WINDOW
        s = np.where(mask[None], s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        a = np.einsum("hqk,khd->qhd", s, v).reshape(t, H * d)
        x = x + a @ f64[p + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, f64[p + "post_attention_layernorm.weight"], eps)
        g = h @ f64[p + "mlp.gate_proj.weight"].T
        u = h @ f64[p + "mlp.up_proj.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * u) @ f64[p + "mlp.down_proj.weight"].T
    x = rmsnorm(x[-1], f64["model.norm.weight"], eps)
    head = f64.get("lm_head.weight", f64["model.embed_tokens.weight"])
    return head @ x


def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def run_case(build, tmp, fam, extra, window_layers_of):
    d = os.path.join(tmp, fam)
    subprocess.run([os.path.join(build, "tools", "pdserve-mkmodel"), "--shape", "tiny",
                    "--family", fam, "--dtype", "f32", "--seed", "21", "--out", d,
                    "--sliding-window", str(WINDOW), "--log-level", "warning"] + extra,
                   check=True, timeout=120)
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    w = load_file(os.path.join(d, "model.safetensors"))
    vocab = cfg["vocab_size"]
    ids = [(i * 389 + 17) % vocab for i in range(PROMPT)]
    logits_path = os.path.join(tmp, fam + ".f32")
    out = subprocess.run([os.path.join(build, "tools", "pdserve-generate"), "--model-path", d,
                          "--no-tokenizer", "--prompt-ids", " ".join(map(str, ids)), "--ids",
                          "--ignore-eos", "--max-new-tokens", str(GREEDY), "--threads", "1",
                          "--chunked-prefill-size", "16", "--logits-out", logits_path],
                         check=True, capture_output=True, text=True, timeout=120).stdout
    ours = np.fromfile(logits_path, dtype="<f4").astype(np.float64)
    layers = window_layers_of(cfg["num_hidden_layers"])
    ref = forward(w, cfg, ids, layers)
    e = rel_err(ours, ref)
    print(f"{fam}: window {WINDOW} on layers {sorted(layers)}: logits rel err {e:.2e}")
    check(e < 1e-4, f"{fam}: logits rel err {e} against the numpy reference")
    full = forward(w, cfg, ids, set())
    check(rel_err(full, ref) > 1e-3, f"{fam}: the window changes nothing for this prompt")
    seq, gen = list(ids), []
    for _ in range(GREEDY):
        nxt = int(np.argmax(forward(w, cfg, seq, layers)))
        gen.append(nxt)
        seq.append(nxt)
    got = [int(t) for t in out.split() if t.lstrip("-").isdigit()][-GREEDY:]
    check(got == gen, f"{fam}: greedy {got} != reference {gen} (output {out!r})")


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    build = os.path.abspath(sys.argv[1])
    root = os.environ.get("PD_TEST_TMPDIR") or None
    if root:
        os.makedirs(root, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="swa-", dir=root) as tmp:
        run_case(build, tmp, "mistral", [], lambda n: set(range(n)))
        run_case(build, tmp, "qwen2", ["--max-window-layers", "1"], lambda n: set(range(1, n)))
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("sliding window matches the numpy reference")
    return 0


if __name__ == "__main__":
    sys.exit(main())
