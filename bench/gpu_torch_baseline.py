#!/usr/bin/env python3
"""gpu_torch_baseline.py — the PyTorch baseline of bench/gpu (issues 7 and 21), run on the same
GPU in the same scripts/gpu-run.sh run as pdserve's perf mode, in two independent parts:

1. kernels (issue 21): PyTorch's own kernels on the perf mode's shapes, bf16, CUDA events around
   each repetition, warm-up first, the median of >= 20 repetitions:
   - causal prefill attention, 4096 tokens 32/8 heads d128 and 2048 tokens 16/16 heads d64:
     F.scaled_dot_product_attention(is_causal=True) under sdpa_kernel(cuDNN) and (flash);
     FLOPs = 4 * d * heads * n * (n + 1) / 2, as bench_gpu.c counts them
   - decode attention (one query per request, dense KV): batch 64 ctx 4096 32/8 d128 and batch
     256 ctx 1024 12/2 d128 with the fastest SDPA backend that takes it (cuDNN, flash,
     efficient); bytes = B * ctx * kv_heads * d * 2 (K and V) * 2 (bf16)
   - top-p sampling as a request needs it: f32 logits [rows][151936], temperature 0.7, top_p
     0.9: softmax(logits / T), sort descending, cumsum, mask, renormalize, torch.multinomial;
     rows 1, 64, 256 (eagerly; and replayed as a CUDA graph where capture works); torch.argmax
     over 1 and 64 rows
   - a 1 GiB device copy (copy_, read + written bytes) and an 8192^3 bf16 matmul
2. transformers (issue 7): loads a model directory written by pdserve-mkmodel (random weights,
   real config and tokenizer) in bf16 and times greedy generation the way bench_gpu times
   pdserve: decode ms/token at batch 1 (and tokens/s at --batch B), prefill of --prefill tokens.

  gpu_torch_baseline.py MODEL_DIR OUT_JSON [--new 64] [--batch 64] [--prefill 4096]
  gpu_torch_baseline.py --kernels-only OUT_JSON

A failure in one part (transformers missing, say) leaves the other's numbers; OUT_JSON is
written after each part. Exits 77 (skipped) when torch or a CUDA device is missing, 1 when a
part failed, else 0. OUT_JSON:
{"torch": ver, "device": name,
 "kernels": {"copy_gbps": .., "gemm_tflops": ..,
             "attn_prefill_4096_32_8_d128": {"cudnn_us", "cudnn_tflops", "flash_us", ...},
             "attn_prefill_2048_16_16_d64": {...},
             "attn_decode_b64_ctx4096_32_8": {"us", "gbs", "backend", "cudnn_us", ...},
             "attn_decode_b256_ctx1024_12_2": {...},
             "topp_rows1": {"us", "graph_us"}, "topp_rows64": .., "topp_rows256": ..,
             "argmax_rows1": {"us"}, "argmax_rows64": .., "seconds": ..},
 "transformers": ver, "decode_ms_b1": .., "decode_tok_s_bB": .., "prefill_s_P": ..,
 "first_ids": [...]} (first_ids: greedy ids of the first prompt, to compare with pdserve's)
A failed measurement leaves "<name>_error" (or "error") with the message instead of its numbers.
"""
import argparse
import json
import statistics
import sys
import time
import warnings

VOCAB = 151936


def short(e):
    s = "%s: %s" % (type(e).__name__, e)
    s = s.strip().splitlines()[0] if s.strip() else type(e).__name__
    return s[:200]


def write(out, res):
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


def bench(torch, fn, reps=20, warmup=3):
    """median seconds of fn over reps repetitions, each between two CUDA events"""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
           for _ in range(reps)]
    for a, b in evs:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in evs) / 1e3


def sdpa_backends(torch):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel, [("cudnn", SDPBackend.CUDNN_ATTENTION),
                         ("flash", SDPBackend.FLASH_ATTENTION),
                         ("efficient", SDPBackend.EFFICIENT_ATTENTION)]


def time_sdpa(torch, q, k, v, causal, backend, reps):
    """seconds of one SDPA call under one backend; GQA natively (enable_gqa) when the backend
    takes it, else with K and V repeated per query head beforehand (outside the timing)"""
    import torch.nn.functional as F
    sdpa_kernel, _ = sdpa_backends(torch)
    h, kvh = q.shape[1], k.shape[1]
    tries = [("mha", k, v, {})] if h == kvh else [("enable_gqa", k, v, {"enable_gqa": True}),
                                                  ("expanded", None, None, {})]
    err = None
    for how, kk, vv, kw in tries:
        if kk is None:
            kk = k.repeat_interleave(h // kvh, dim=1)
            vv = v.repeat_interleave(h // kvh, dim=1)

        def call(kk=kk, vv=vv, kw=kw):
            return F.scaled_dot_product_attention(q, kk, vv, is_causal=causal, **kw)
        try:
            with sdpa_kernel([backend]), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                call()
                torch.cuda.synchronize()
                return bench(torch, call, reps=reps), how
        except Exception as e:  # noqa: BLE001 ("No available kernel", a rejected shape or flag)
            err = e
    raise err


def attn_prefill(torch, n, h, kvh, d):
    dev, bf16 = "cuda", torch.bfloat16
    q = torch.randn(1, h, n, d, device=dev, dtype=bf16)
    k = torch.randn(1, kvh, n, d, device=dev, dtype=bf16)
    v = torch.randn(1, kvh, n, d, device=dev, dtype=bf16)
    flops = 4.0 * d * h * n * (n + 1) / 2
    e = {"tokens": n, "heads": h, "kv_heads": kvh, "head_dim": d, "flops": flops}
    _, backends = sdpa_backends(torch)
    for name, be in backends[:2]:  # cuDNN and flash
        try:
            s, how = time_sdpa(torch, q, k, v, True, be, 20)
            e[name + "_us"] = s * 1e6
            e[name + "_tflops"] = flops / s / 1e12
            e[name + "_gqa"] = how
        except Exception as ex:  # noqa: BLE001 (a backend that cannot run is a result)
            e[name + "_error"] = short(ex)
    return e


def attn_decode(torch, b, ctx, h, kvh, d):
    dev, bf16 = "cuda", torch.bfloat16
    q = torch.randn(b, h, 1, d, device=dev, dtype=bf16)
    k = torch.randn(b, kvh, ctx, d, device=dev, dtype=bf16)
    v = torch.randn(b, kvh, ctx, d, device=dev, dtype=bf16)
    nbytes = float(b) * ctx * kvh * d * 2 * 2
    e = {"batch": b, "ctx": ctx, "heads": h, "kv_heads": kvh, "head_dim": d, "bytes": nbytes}
    _, backends = sdpa_backends(torch)
    best = None
    for name, be in backends:
        try:
            s, how = time_sdpa(torch, q, k, v, False, be, 30)
            e[name + "_us"] = s * 1e6
            e[name + "_gqa"] = how
            if best is None or s < best[0]:
                best = (s, name)
        except Exception as ex:  # noqa: BLE001
            e[name + "_error"] = short(ex)
    if best:
        e["us"] = best[0] * 1e6
        e["gbs"] = nbytes / best[0] / 1e9
        e["backend"] = best[1]
    return e


def top_p_sample(torch, logits, temperature=0.7, top_p=0.9):
    probs = torch.softmax(logits / temperature, dim=-1)
    sp, si = torch.sort(probs, dim=-1, descending=True)
    cum = torch.cumsum(sp, dim=-1)
    sp = sp.masked_fill(cum - sp > top_p, 0.0)  # keep the smallest prefix reaching top_p
    sp = sp / sp.sum(dim=-1, keepdim=True)
    return torch.gather(si, -1, torch.multinomial(sp, 1))


def topp(torch, rows):
    # uniform in [-8, 8), as bench_gpu.c fills its logits
    x = (torch.rand(rows, VOCAB, device="cuda", dtype=torch.float32) * 2 - 1) * 8
    e = {"rows": rows, "vocab": VOCAB, "temperature": 0.7, "top_p": 0.9,
         "us": bench(torch, lambda: top_p_sample(torch, x), reps=30) * 1e6}
    return e, x


def topp_graph(torch, x):
    """the same sampling replayed as one CUDA graph (no launch overhead)"""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            top_p_sample(torch, x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        top_p_sample(torch, x)
    return bench(torch, g.replay, reps=30) * 1e6


def kernel_timings(torch, res, out):
    k = res["kernels"] = {}
    t0 = time.time()

    def step(name, fn):
        try:
            fn()
        except Exception as ex:  # noqa: BLE001 (one failed measurement must not stop the rest)
            k[name + "_error"] = short(ex)
            print("kernels: %s failed: %s" % (name, short(ex)), flush=True)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        write(out, res)

    def copy():
        n = 1 << 30
        a = torch.empty(n, dtype=torch.uint8, device="cuda").fill_(1)
        b = torch.empty_like(a)
        s = bench(torch, lambda: b.copy_(a), reps=20)
        k["copy_gbps"] = 2.0 * n / s / 1e9
        k["copy_bytes"] = 2 * n

    def gemm():
        n = 8192
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
        s = bench(torch, lambda: torch.matmul(a, b, out=c), reps=20)
        k["gemm_tflops"] = 2.0 * n * n * n / s / 1e12
        k["gemm_shape"] = "8192x8192x8192 bf16"

    def prefill(n, h, kvh, d):
        k["attn_prefill_%d_%d_%d_d%d" % (n, h, kvh, d)] = attn_prefill(torch, n, h, kvh, d)

    def decode(b, ctx, h, kvh, d):
        k["attn_decode_b%d_ctx%d_%d_%d" % (b, ctx, h, kvh)] = attn_decode(torch, b, ctx, h, kvh, d)

    def sampling(rows):
        e, x = topp(torch, rows)
        k["topp_rows%d" % rows] = e
        try:
            e["graph_us"] = topp_graph(torch, x)
        except Exception as ex:  # noqa: BLE001 (capture of multinomial may be refused)
            e["graph_error"] = short(ex)

    def argmax(rows):
        x = (torch.rand(rows, VOCAB, device="cuda", dtype=torch.float32) * 2 - 1) * 8
        k["argmax_rows%d" % rows] = {
            "us": bench(torch, lambda: torch.argmax(x, dim=-1), reps=50) * 1e6}

    step("copy", copy)
    step("gemm", gemm)
    step("attn_prefill_4096_32_8_d128", lambda: prefill(4096, 32, 8, 128))
    step("attn_prefill_2048_16_16_d64", lambda: prefill(2048, 16, 16, 64))
    step("attn_decode_b64_ctx4096_32_8", lambda: decode(64, 4096, 32, 8, 128))
    step("attn_decode_b256_ctx1024_12_2", lambda: decode(256, 1024, 12, 2, 128))
    for rows in (1, 64):
        step("argmax_rows%d" % rows, lambda r=rows: argmax(r))
    for rows in (1, 64, 256):  # graph capture last of all: the riskiest
        step("topp_rows%d" % rows, lambda r=rows: sampling(r))
    k["seconds"] = round(time.time() - t0, 1)
    write(out, res)
    return not any(key.endswith("_error") for key in k)


def transformers_baseline(torch, res, out, model_dir, opts):
    import transformers
    from transformers import AutoModelForCausalLM

    res["transformers"] = transformers.__version__
    dev = "cuda"
    major = int(transformers.__version__.split(".")[0])
    kw = {"dtype": torch.bfloat16} if major >= 5 else {"torch_dtype": torch.bfloat16}
    model = AutoModelForCausalLM.from_pretrained(model_dir, **kw).to(dev, dtype=torch.bfloat16)
    model.eval()
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    res.update({"model": model_dir, "dtype": "bf16",
                "attn": str(getattr(model.config, "_attn_implementation", "?"))})

    def timed_generate(ids, new):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            o = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                               min_new_tokens=new, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        return time.perf_counter() - t0, o

    n = opts.new
    ids = torch.randint(1, vocab, (1, 32), generator=gen).to(dev)
    timed_generate(ids, 4)  # warm-up
    t1, _ = timed_generate(ids, 1)
    tn, o = timed_generate(ids, n + 1)
    res["decode_ms_b1"] = (tn - t1) / n * 1e3
    res["first_ids"] = o[0, 32:].tolist()
    write(out, res)
    b = opts.batch
    ids = torch.randint(1, vocab, (b, 32), generator=gen).to(dev)
    timed_generate(ids, 2)
    t1, _ = timed_generate(ids, 1)
    tn, _ = timed_generate(ids, 17)
    res["decode_tok_s_b%d" % b] = b * 16 / (tn - t1)
    write(out, res)
    p = opts.prefill
    ids = torch.randint(1, vocab, (1, p), generator=gen).to(dev)
    one = "logits_to_keep" in model.forward.__code__.co_varnames
    with torch.no_grad():
        model(ids)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(3):
            model(ids, logits_to_keep=1) if one else model(ids)
        torch.cuda.synchronize()
    res["prefill_s_%d" % p] = (time.perf_counter() - t0) / 3
    write(out, res)


def main():
    ap = argparse.ArgumentParser(
        usage="%(prog)s MODEL_DIR OUT_JSON [--new N] [--batch B] [--prefill P] [--no-kernels]\n"
              "       %(prog)s --kernels-only OUT_JSON",
        description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", metavar="PATH",
                    help="the model directory (not with --kernels-only), then the JSON to write")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prefill", type=int, default=4096)
    ap.add_argument("--kernels-only", action="store_true",
                    help="the kernel timings alone (no model directory needed)")
    ap.add_argument("--no-kernels", action="store_true", help="the transformers part alone")
    opts = ap.parse_args()
    if opts.kernels_only:
        if len(opts.paths) > 2:
            ap.error("--kernels-only takes [MODEL_DIR] OUT_JSON")
        model_dir, out = None, opts.paths[-1]
    elif len(opts.paths) != 2:
        ap.error("MODEL_DIR OUT_JSON expected (or --kernels-only OUT_JSON)")
    else:
        model_dir, out = opts.paths
    try:
        import torch
    except ImportError as e:
        print("skipped: %s" % e)
        sys.exit(77)
    if not torch.cuda.is_available():
        print("skipped: no CUDA device for torch")
        sys.exit(77)
    res = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0)}
    ok, parts = True, []
    if not opts.no_kernels:
        try:
            kok = kernel_timings(torch, res, out)
            parts.append("kernels %s in %ss" % ("ok" if kok else "with errors",
                                                res["kernels"].get("seconds")))
            ok = ok and kok
        except Exception as e:  # noqa: BLE001 (the transformers part still runs)
            res.setdefault("kernels", {})["error"] = short(e)
            parts.append("kernels FAILED: %s" % short(e))
            ok = False
        write(out, res)
        print(json.dumps(res.get("kernels")), flush=True)
        try:
            torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001
            pass
    if model_dir:
        try:
            transformers_baseline(torch, res, out, model_dir, opts)
            parts.append("transformers %s ok (decode b1 %.3f ms/token, prefill %d %.1f ms)" %
                         (res["transformers"], res["decode_ms_b1"], opts.prefill,
                          res["prefill_s_%d" % opts.prefill] * 1e3))
        except Exception as e:  # noqa: BLE001 (the kernel numbers are kept)
            res["transformers_error"] = short(e)
            parts.append("transformers FAILED: %s" % short(e))
            ok = False
        write(out, res)
    print("torch %s on %s: %s" % (res["torch"], res["device"], "; ".join(parts)))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
