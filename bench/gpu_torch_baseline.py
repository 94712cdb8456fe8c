#!/usr/bin/env python3
"""gpu_torch_baseline.py — the PyTorch + transformers baseline of bench/gpu (issue 7): loads a
model directory written by pdserve-mkmodel (random weights, real config and tokenizer) with
transformers in bf16 on the GPU and times greedy generation the way bench_gpu times pdserve:
decode ms/token at batch 1 (and tokens/s at --batch B), prefill of --prefill tokens.

  gpu_torch_baseline.py MODEL_DIR OUT_JSON [--new 64] [--batch 64] [--prefill 4096]

Exits 77 (skipped) when torch, transformers or a CUDA device is missing. Writes OUT_JSON:
{"torch": ver, "transformers": ver, "decode_ms_b1": .., "decode_tok_s_bB": .., "prefill_s": ..,
 "first_ids": [...]} (first_ids: greedy ids of the first prompt, to compare with pdserve's).
"""
import json
import sys
import time


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        sys.exit(2)
    model_dir, out = sys.argv[1], sys.argv[2]
    opts = {"--new": 64, "--batch": 64, "--prefill": 4096}
    a = sys.argv[3:]
    for i in range(0, len(a) - 1, 2):
        opts[a[i]] = int(a[i + 1])
    try:
        import torch
        import transformers
    except ImportError as e:
        print("skipped: %s" % e)
        sys.exit(77)
    if not torch.cuda.is_available():
        print("skipped: no CUDA device for torch")
        sys.exit(77)
    from transformers import AutoModelForCausalLM

    dev = "cuda"
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.bfloat16).to(dev)
    model.eval()
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    res = {"torch": torch.__version__, "transformers": transformers.__version__,
           "model": model_dir, "dtype": "bf16", "attn": str(model.config._attn_implementation)}

    def timed_generate(ids, new):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            o = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                               min_new_tokens=new, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        return time.perf_counter() - t0, o

    n = opts["--new"]
    ids = torch.randint(1, vocab, (1, 32), generator=gen).to(dev)
    timed_generate(ids, 4)  # warm-up
    t1, _ = timed_generate(ids, 1)
    tn, o = timed_generate(ids, n + 1)
    res["decode_ms_b1"] = (tn - t1) / n * 1e3
    res["first_ids"] = o[0, 32:].tolist()
    b = opts["--batch"]
    ids = torch.randint(1, vocab, (b, 32), generator=gen).to(dev)
    timed_generate(ids, 2)
    t1, _ = timed_generate(ids, 1)
    tn, _ = timed_generate(ids, 17)
    res["decode_tok_s_b%d" % b] = b * 16 / (tn - t1)
    p = opts["--prefill"]
    ids = torch.randint(1, vocab, (1, p), generator=gen).to(dev)
    with torch.no_grad():
        model(ids)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(3):
            model(ids, logits_to_keep=1) if "logits_to_keep" in \
                model.forward.__code__.co_varnames else model(ids)
        torch.cuda.synchronize()
    res["prefill_s_%d" % p] = (time.perf_counter() - t0) / 3
    print(json.dumps(res))
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
