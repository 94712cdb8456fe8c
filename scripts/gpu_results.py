#!/usr/bin/env python3
"""gpu_results.py — merges what scripts/gpu-run.sh measured in OUTDIR (perf.json of bench/gpu,
xfer.json, torch.json, disagg.json) into OUTDIR/results.json and prints one table: the limits
(device copy, cuBLAS bf16 GEMM), decode ms/token at batch 1 against weight-bytes/HBM-rate,
decode tokens/s at batch 64 and 256, prefill on llama-3.1-8b against the GEMM rate, the
attention kernels' bandwidth, the KV transfer against a device copy, the PyTorch baseline and
its ratio, and the disaggregated runs. Missing files are reported as missing. Stdlib only.

  gpu_results.py OUTDIR
"""
import json
import os
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def main():
    out = sys.argv[1]
    perf = load(os.path.join(out, "perf.json"))
    xfers = [x for x in (load(os.path.join(out, "xfer.json")),
                         load(os.path.join(out, "xfer-ucx.json"))) if x]
    torch = load(os.path.join(out, "torch.json"))
    disagg = load(os.path.join(out, "disagg.json"))
    rows = []  # (what, value, against)
    res = {"perf": perf, "xfer": xfers, "torch": torch, "disagg": disagg}
    pd_b1_ms = None
    if perf:
        copy, gemm = perf.get("measured_copy_gbps", 0), perf.get("measured_gemm_tflops", 0)
        rows.append(("HBM copy rate (device copy)", "%.0f GB/s" % copy,
                     "peak %.0f" % perf.get("peak_gbps", 0)))
        rows.append(("cuBLAS bf16 GEMM", "%.0f TFLOP/s" % gemm,
                     "peak %.0f" % perf.get("peak_tflops", 0)))
        for r in perf.get("results", []):
            op, shape = r.get("op", ""), r.get("shape", "")
            if op == "decode_step":
                b = shape.split("batch ")[1].split()[0] if "batch " in shape else "?"
                ms = r["us"] / 1e3
                if b == "1":
                    pd_b1_ms = ms
                    bound = r["gbps"] and (r["gbps"] * ms / copy) if copy else 0
                    rows.append(("decode qwen2.5-1.5b batch 1", "%.3f ms/token" % ms,
                                 "%.0f%% of weight-bytes/HBM-rate (%.3f ms; target >= 60%%)" %
                                 (100 * bound / ms if ms else 0, bound)))
                else:
                    kv = shape.split(" kv ")[1].split()[0] if " kv " in shape else ""
                    rows.append(("decode qwen2.5-1.5b batch %s%s" % (b, " kv " + kv if kv else ""),
                                 "%.0f tokens/s" % (int(b) / (ms / 1e3)), "%.3f ms/step" % ms))
            elif op == "prefill":
                rows.append(("prefill " + shape, "%.1f TFLOP/s" % r["tflops"],
                             "%.0f%% of GEMM rate (target >= 50%% on llama-3.1-8b); %.1f ms" %
                             (100 * r["tflops"] / gemm if gemm else 0, r["us"] / 1e3)))
            elif op.startswith("attn"):
                rows.append((op + " " + shape, "%.0f GB/s" % r["gbps"],
                             "%.0f%% of copy" % (100 * r["gbps"] / copy if copy else 0)))
    else:
        rows.append(("bench/gpu", "missing", "perf.json"))
    for xfer in xfers:
        rows.append(("KV transfer between daemon pools (%s)" % xfer["path"],
                     "%.2f GB/s" % xfer["xfer_gbps"],
                     "device copy %.1f GB/s, ratio %.3f; %s" %
                     (xfer["copy_gbps"], xfer["ratio"], xfer["lane"])))
    if not xfers:
        rows.append(("KV transfer", "missing", "xfer.json"))
    if torch:
        t = torch.get("decode_ms_b1")
        rows.append(("PyTorch %s + transformers %s decode b1" % (torch["torch"],
                     torch["transformers"]), "%.3f ms/token" % t,
                     "pdserve/torch time ratio %.2f" % (pd_b1_ms / t) if pd_b1_ms and t else ""))
        for k, v in torch.items():
            if k.startswith("decode_tok_s_b"):
                rows.append(("PyTorch decode batch " + k[len("decode_tok_s_b"):],
                             "%.0f tokens/s" % v, ""))
            if k.startswith("prefill_s_"):
                rows.append(("PyTorch prefill %s tokens (qwen2.5-1.5b)" % k[len("prefill_s_"):],
                             "%.1f ms" % (v * 1e3), ""))
    else:
        rows.append(("PyTorch baseline", "missing", "torch.json"))
    for d in disagg or []:
        rows.append(("disaggregated %s on the GPU" % d["shape"],
                     "%s/%s equal" % (d.get("equal"), d.get("prompts")),
                     "%s; %s" % ("PASS" if d.get("ok") else "FAIL " + d.get("error", ""),
                                 d.get("decode_transport"))))
    if not disagg:
        rows.append(("disaggregated path", "missing", "disagg.json"))
    res["table"] = [{"what": a, "value": b, "against": c} for a, b, c in rows]
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    w = max(len(a) for a, _, _ in rows)
    for a, b, c in rows:
        print("%-*s  %-18s %s" % (w, a, b, c))


if __name__ == "__main__":
    main()
