#!/usr/bin/env python3
"""pdserve-mkmodel's output, read by the Hugging Face libraries themselves.

For every family the built pdserve-mkmodel writes a tiny model (bf16 single file, bf16 sharded,
f32); then:
  safetensors  safe_open(framework="numpy") lists exactly the tensors (names, shapes, dtypes)
               that config.json implies, computed here independently of pdserve's C code; f32
               tensors load as numpy arrays; bf16 ones (which numpy cannot represent) are read
               from the raw file through its header and must equal the f32 run's values rounded
               to bfloat16 (round to nearest even); the sharded copy holds the same bytes, and
               its index maps every tensor to the shard holding it with the right total_size.
  tokenizers   Tokenizer.from_file loads tokenizer.json; encode -> decode round-trips text in
               several scripts; the vocabulary fits config.json's vocab_size; the bos/eos ids in
               config.json are the family's special tokens.
  transformers AutoConfig reads the same numbers (sliding windows included); AutoTokenizer
               loads the directory, agrees with tokenizers, and renders the chat template.
Every group runs or none does: exits 77 (CTest: skipped) naming the package when numpy,
safetensors, tokenizers, transformers or jinja2 is not importable (scripts/setup.sh pins them
into .venv-tools/, the interpreter CMake gives this test).
usage: test_mkmodel_hf.py PATH/TO/pdserve-mkmodel
"""
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

try:
    import jinja2  # noqa: F401  (transformers renders chat templates with it)
    import numpy as np
    import tokenizers
    import transformers  # noqa: F401
    from safetensors import safe_open
    from transformers import AutoConfig, AutoTokenizer
except Exception as e:  # ImportError, or a broken install
    print(f"SKIP: a Hugging Face package is not importable: {type(e).__name__}: {e}; "
          "scripts/setup.sh installs numpy, safetensors, tokenizers, transformers and jinja2 "
          f"into .venv-tools/ (this is {sys.executable})")
    sys.exit(77)

FAMILIES = ["llama", "llama2", "mistral", "qwen2", "qwen3"]
SAMPLES = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "  def f(x):\n\treturn x ** 2  # squares\n",
    "Numbers 1234567 and 3.14159, dates 2024-05-17.",
    "Où est la bibliothèque ? Grüße aus München, ¿qué tal?",
    "中文：今天天气很好。日本語のテキスト。한국어 문장.",
    "emoji 🙂🚀 and unseen symbols ∮ ⊛ ꙮ",
    " leading and trailing spaces  ",
]

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)
    return cond


def mkmodel(binary, out, *args):
    cmd = [binary, "--out", out, "--log-level", "warning", *args]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout, r.stderr)
        raise SystemExit(f"FAIL: {' '.join(cmd)} exited {r.returncode}")


def expected_tensors(cfg):
    """name -> shape for a config, as transformers' Llama/Mistral/Qwen2/Qwen3 modules name them."""
    arch = cfg["architectures"][0]
    H, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // heads
    t = {"model.embed_tokens.weight": [V, H], "model.norm.weight": [H]}
    if not cfg.get("tie_word_embeddings", False):
        t["lm_head.weight"] = [V, H]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = [heads * hd, H]
        t[p + "self_attn.k_proj.weight"] = [kv * hd, H]
        t[p + "self_attn.v_proj.weight"] = [kv * hd, H]
        t[p + "self_attn.o_proj.weight"] = [H, heads * hd]
        if arch == "Qwen2ForCausalLM":
            t[p + "self_attn.q_proj.bias"] = [heads * hd]
            t[p + "self_attn.k_proj.bias"] = [kv * hd]
            t[p + "self_attn.v_proj.bias"] = [kv * hd]
        if arch == "Qwen3ForCausalLM":
            t[p + "self_attn.q_norm.weight"] = [hd]
            t[p + "self_attn.k_norm.weight"] = [hd]
        t[p + "mlp.gate_proj.weight"] = [I, H]
        t[p + "mlp.up_proj.weight"] = [I, H]
        t[p + "mlp.down_proj.weight"] = [H, I]
        t[p + "input_layernorm.weight"] = [H]
        t[p + "post_attention_layernorm.weight"] = [H]
    return t


def raw_tensors(path):
    """name -> (dtype, shape, bytes), parsed from the file without the safetensors library."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        out[name] = (info["dtype"], info["shape"], data[8 + n + b:8 + n + e])
    return out


def bf16_to_f32(raw):
    return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x):
    """Round to nearest even, as torch and pdserve do (inputs here are finite)."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def model_files(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            index = json.load(f)
        return sorted(set(index["weight_map"].values())), index
    return ["model.safetensors"], None


def check_safetensors(fam, d, cfg, dtype):
    want = expected_tensors(cfg)
    files, index = model_files(d)
    seen = {}
    for fn in files:
        with safe_open(os.path.join(d, fn), framework="numpy") as f:
            check(f.metadata() == {"format": "pt"}, f"{fam} {fn}: metadata {f.metadata()}")
            for k in f.keys():
                check(k not in seen, f"{fam}: tensor {k} in two files")
                sl = f.get_slice(k)
                seen[k] = (fn, list(sl.get_shape()), sl.get_dtype())
                if dtype == "F32":
                    arr = f.get_tensor(k)
                    check(arr.dtype == np.float32 and list(arr.shape) == want.get(k),
                          f"{fam}: {k} loads as {arr.dtype} {arr.shape}")
                    check(bool(np.isfinite(arr).all()) and float(np.abs(arr).max()) > 0,
                          f"{fam}: {k} is not finite and non-zero")
    check(set(seen) == set(want), f"{fam} {dtype}: tensors differ from config: "
          f"missing {sorted(set(want) - set(seen))[:3]}, extra {sorted(set(seen) - set(want))[:3]}")
    for k, (fn, shape, dt) in seen.items():
        check(shape == want.get(k), f"{fam}: {k} shape {shape}, config implies {want.get(k)}")
        check(dt == dtype, f"{fam}: {k} dtype {dt}, want {dtype}")
    if index is not None:
        check(len(files) >= 2, f"{fam}: sharded write produced {len(files)} file(s)")
        check(all(index["weight_map"][k] == fn for k, (fn, _, _) in seen.items()),
              f"{fam}: index weight_map names the wrong shard")
        size = sum(len(v[2]) for fn in files for v in raw_tensors(os.path.join(d, fn)).values())
        check(index["metadata"]["total_size"] == size,
              f"{fam}: index total_size {index['metadata']['total_size']} != {size}")
    return seen


def all_raw(d):
    files, _ = model_files(d)
    out = {}
    for fn in files:
        out.update(raw_tensors(os.path.join(d, fn)))
    return out


def check_values(fam, d_bf16, d_sharded, d_f32, cfg):
    a, b = all_raw(d_bf16), all_raw(d_sharded)
    check(a.keys() == b.keys() and all(a[k] == b[k] for k in a),
          f"{fam}: sharded and unsharded tensors differ")
    with safe_open(os.path.join(d_f32, "model.safetensors"), framework="numpy") as f:
        for k, (dt, shape, raw) in a.items():
            ref = f.get_tensor(k)
            got = np.frombuffer(raw, dtype="<u2")
            check(np.array_equal(got, f32_to_bf16_bits(ref.reshape(-1))),
                  f"{fam}: {k} bf16 is not the f32 value rounded")
            vals = bf16_to_f32(raw)
            if len(shape) == 2:  # documented init: N(0, 1/fan_in)
                std = float(vals.std())
                check(abs(std * math.sqrt(shape[1]) - 1) < 0.2,
                      f"{fam}: {k} std {std:.4f}, want ~{1 / math.sqrt(shape[1]):.4f}")
            elif k.endswith("norm.weight"):
                check(abs(float(vals.mean()) - 1) < 0.05, f"{fam}: {k} mean {vals.mean():.3f}")


def check_tokenizer(fam, d, cfg):
    tok = tokenizers.Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer.json")) as f:
        tj = json.load(f)
    n_vocab, n_merges = len(tj["model"]["vocab"]), len(tj["model"]["merges"])
    size = tok.get_vocab_size(with_added_tokens=True)
    check(size <= cfg["vocab_size"], f"{fam}: tokenizer has {size} ids > vocab_size")
    check(max(tok.get_vocab(with_added_tokens=True).values()) < cfg["vocab_size"],
          f"{fam}: a token id is outside the embedding")
    base = n_vocab - n_merges
    check(base == 256 if tj["model"]["byte_fallback"] is False else base > 259,
          f"{fam}: {n_vocab} tokens with {n_merges} merges")
    for s in SAMPLES:
        enc = tok.encode(s, add_special_tokens=False)
        dec = tok.decode(enc.ids, skip_special_tokens=False)
        check(dec == s, f"{fam}: round trip {s!r} -> {dec!r}")
        check(len(enc.ids) < len(s.encode()) or fam in ("llama2", "mistral"),
              f"{fam}: no merge applied to {s!r}")
    eos = cfg["eos_token_id"] if isinstance(cfg["eos_token_id"], list) else [cfg["eos_token_id"]]
    names = {tok.id_to_token(i) for i in eos}
    want_eos = {"llama": {"<|eot_id|>", "<|end_of_text|>"}, "llama2": {"</s>"},
                "mistral": {"</s>"}, "qwen2": {"<|im_end|>", "<|endoftext|>"},
                "qwen3": {"<|im_end|>", "<|endoftext|>"}}[fam]
    check(names == want_eos, f"{fam}: eos ids {eos} are {names}")
    bos = tok.id_to_token(cfg["bos_token_id"])
    check(bos == {"llama": "<|begin_of_text|>", "llama2": "<s>", "mistral": "<s>"}.get(
        fam, "<|endoftext|>"), f"{fam}: bos id is {bos}")
    with_special = tok.encode("Hi there").ids
    if fam in ("qwen2", "qwen3"):
        check(with_special == tok.encode("Hi there", add_special_tokens=False).ids,
              f"{fam}: the tokenizer added special tokens")
    else:
        check(with_special[0] == cfg["bos_token_id"], f"{fam}: BOS not prepended")


def check_transformers(fam, d, cfg):
    c = AutoConfig.from_pretrained(d)
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
                "tie_word_embeddings"):
        check(getattr(c, key) == cfg[key], f"{fam}: AutoConfig {key} {getattr(c, key)} != {cfg[key]}")
    check(getattr(c, "head_dim", None) == cfg["head_dim"], f"{fam}: AutoConfig head_dim")
    check(abs(c.rms_norm_eps - cfg["rms_norm_eps"]) < 1e-12, f"{fam}: AutoConfig rms_norm_eps")
    rope = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {}
    theta = rope.get("rope_theta", getattr(c, "rope_theta", None))
    check(theta == cfg["rope_theta"], f"{fam}: AutoConfig rope_theta {theta}")
    if cfg.get("rope_scaling"):
        check(rope.get("rope_type") == "llama3" and rope.get("factor") ==
              cfg["rope_scaling"]["factor"], f"{fam}: AutoConfig rope scaling {rope}")
    t = AutoTokenizer.from_pretrained(d)
    eos = cfg["eos_token_id"] if isinstance(cfg["eos_token_id"], list) else [cfg["eos_token_id"]]
    check(t.eos_token_id in eos, f"{fam}: AutoTokenizer eos {t.eos_token_id} not in {eos}")
    tok = tokenizers.Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    for s in SAMPLES[:4]:
        check(t(s)["input_ids"] == tok.encode(s).ids, f"{fam}: AutoTokenizer disagrees on {s!r}")
    msgs = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Bye"}]
    text = t.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    marker = {"llama": "<|start_header_id|>", "llama2": "[INST]", "mistral": "[INST]",
              "qwen2": "<|im_start|>", "qwen3": "<|im_start|>"}[fam]
    check(marker in text and "Bye" in text, f"{fam}: chat template gave {text!r}")


def check_sliding_window(binary, tmp):
    """A windowed model means to transformers what it means to pdserve: mistral slides on every
    layer, qwen2 with --max-window-layers 1 on layer 1 only (transformers' layer_types;
    its MistralConfig has none: the window holds on every layer)."""
    for fam, extra, want in (("mistral", [], ["sliding_attention"] * 2),
                             ("qwen2", ["--max-window-layers", "1"],
                              ["full_attention", "sliding_attention"])):
        d = os.path.join(tmp, f"{fam}-window")
        mkmodel(binary, d, "--family", fam, "--seed", "3", "--sliding-window", "8", *extra)
        c = AutoConfig.from_pretrained(d)
        check(c.sliding_window == 8, f"{fam}: AutoConfig sliding_window {c.sliding_window}")
        types = getattr(c, "layer_types", None)
        if types is not None or fam == "qwen2":  # qwen2's window is per layer: it must say which
            check(list(types or []) == want, f"{fam}: AutoConfig layer_types {types} != {want}")
        print(f"{fam}: sliding window checked (layer_types {types})")


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    binary = sys.argv[1]
    root = os.environ.get("PD_TEST_TMPDIR") or None
    if root:
        os.makedirs(root, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mkmodel-hf-", dir=root) as tmp:
        for fam in FAMILIES:
            d = {k: os.path.join(tmp, f"{fam}-{k}") for k in ("bf16", "sharded", "f32", "again")}
            mkmodel(binary, d["bf16"], "--family", fam, "--seed", "3", "--shard-size", "0")
            mkmodel(binary, d["sharded"], "--family", fam, "--seed", "3", "--shard-size", "64K")
            mkmodel(binary, d["f32"], "--family", fam, "--seed", "3", "--dtype", "f32")
            mkmodel(binary, d["again"], "--family", fam, "--seed", "4", "--shard-size", "0")
            with open(os.path.join(d["bf16"], "config.json")) as f:
                cfg = json.load(f)
            check(cfg["torch_dtype"] == "bfloat16", f"{fam}: torch_dtype {cfg['torch_dtype']}")
            check_safetensors(fam, d["bf16"], cfg, "BF16")
            check_safetensors(fam, d["sharded"], cfg, "BF16")
            check_safetensors(fam, d["f32"], cfg, "F32")
            check_values(fam, d["bf16"], d["sharded"], d["f32"], cfg)
            a, b = all_raw(d["bf16"]), all_raw(d["again"])
            check(all(a[k][2] != b[k][2] for k in a), f"{fam}: another seed left a tensor unchanged")
            check_tokenizer(fam, d["bf16"], cfg)
            check_transformers(fam, d["bf16"], cfg)
            print(f"{fam}: checked ({len(a)} tensors)")
        check_sliding_window(binary, tmp)
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all Hugging Face checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
