#!/usr/bin/env python3
"""gpu_results.py — merges what scripts/gpu-run.sh measured in OUTDIR (perf.json of bench/gpu,
xfer.json, torch.json, disagg.json, compare/*.jsonl) into OUTDIR/results.json and prints:

1. one table of what was measured: the limits (device copy, cuBLAS bf16 GEMM), decode ms/token
   at batch 1 against weight-bytes/HBM-rate, decode tokens/s at batch 64 and 256, prefill on
   llama-3.1-8b against the GEMM rate, the attention kernels' bandwidth, the KV transfer against
   a device copy, the PyTorch baseline, and the disaggregated runs;
2. issue 21's comparison with PyTorch on the same GPU in the same run, one row per op:
   "op | pdserve | PyTorch (same run) | ratio | target | check", ratio = pdserve's speed over
   PyTorch's (> 1: pdserve faster), check = PASS / FAIL against the issue's threshold (n/a when
   a number is missing); in results.json as "ratios";
3. colocated vs disaggregated under load (bench/compare-pd.sh): output tokens/s at saturation,
   goodput and median TTFT per request rate, PD's TTFT minus colocated's against issue 17's
   3 ms at the lightest rate; in results.json as "compare".

Missing files or entries are reported as missing / n/a. perf.json entries are matched by op and
shape substrings; a perf.json cut short (the perf mode timed out) is read line by line, and the
perf.txt lines fill in what it lacks. Stdlib only.

  gpu_results.py OUTDIR              everything above, writes OUTDIR/results.json
  gpu_results.py --compare OUTDIR    part 3 alone (for gpu-run.sh's summary), writes nothing
"""
import json
import math
import os
import re
import statistics
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


# ---- perf mode: perf.json, else what of it was written, plus perf.txt ----

def salvage_perf_json(path):
    """perf.json cut short: the header's fields and every complete entry line"""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    perf = {"results": [], "salvaged": True}
    for line in text.splitlines():
        line = line.strip().rstrip(",")
        if line.startswith('{"device"'):
            for k in ("device", "sms", "peak_gbps", "peak_tflops"):
                m = re.search(r'"%s":("[^"]*"|[0-9.eE+-]+)' % k, line)
                if m:
                    perf[k] = json.loads(m.group(1))
        elif line.startswith('{"op"'):
            try:
                perf["results"].append(json.loads(line))
            except ValueError:
                pass
        elif line.startswith('],"measured'):
            try:
                perf.update(json.loads("{" + line[2:]))
            except ValueError:
                pass
    return perf if perf["results"] else None


PERF_LINE = re.compile(r"^(?P<head>\S.*?)\s+(?P<us>[0-9]+(?:\.[0-9]+)?) us\b"
                       r"(?:\s+(?P<gbps>[0-9.]+) GB/s)?(?:.*?(?P<tf>[0-9.]+) TFLOP/s)?")


def parse_perf_txt(path):
    """the entries of perf.txt's report() lines: "%-22s %-34s %10.1f us [GB/s] [TFLOP/s]" """
    out = []
    try:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        m = PERF_LINE.match(line)
        if not m:
            continue
        head = m.group("head")
        if ":" in head:  # "breakdown: decode step ...: N us in ops" and other prose
            continue
        if len(head) > 23 and head[22] == " " and head[:22].strip():
            op, shape = head[:22].strip(), head[23:].strip()
        else:
            parts = re.split(r"\s{2,}", head, maxsplit=1)
            op, shape = parts[0].strip(), (parts[1].strip() if len(parts) > 1 else "")
        out.append({"op": op, "shape": shape, "us": float(m.group("us")),
                    "gbps": float(m.group("gbps") or 0), "tflops": float(m.group("tf") or 0),
                    "source": "perf.txt"})
    return out


def load_perf(out):
    perf = load(os.path.join(out, "perf.json"))
    if perf is None:
        perf = salvage_perf_json(os.path.join(out, "perf.json"))
    txt = parse_perf_txt(os.path.join(out, "perf.txt"))
    if perf is None and not txt:
        return None
    if perf is None:
        perf = {"results": [], "from_perf_txt": True}
    have = {(r.get("op"), r.get("shape")) for r in perf.get("results", [])}
    perf.setdefault("results", [])
    perf["results"] += [r for r in txt if (r["op"], r["shape"]) not in have]
    res = perf["results"]
    for r in res:  # "gbps" in the perf mode's JSON; "gbs" accepted too
        if "gbps" not in r and "gbs" in r:
            r["gbps"] = r["gbs"]
    if not perf.get("measured_copy_gbps"):
        perf["measured_copy_gbps"] = max([r.get("gbps", 0) for r in res
                                          if r.get("op") == "hbm_copy"] or [0])
    if not perf.get("measured_gemm_tflops"):
        perf["measured_gemm_tflops"] = max([r.get("tflops", 0) for r in res
                                            if r.get("op") == "gemm_bf16"] or [0])
    return perf


def tokens(shape):
    return set(re.findall(r"[A-Za-z0-9_.+/-]+", shape.lower()))


def find(results, op_ok, want=(), avoid=(), prefer=("kv bf16",)):
    """the first entry whose op passes op_ok, whose shape has every token of want and no
    substring of avoid; entries whose shape has a substring of prefer come first"""
    hits = [r for r in results
            if op_ok(r.get("op", "").lower()) and tokens(r.get("shape", "")) >= set(want)
            and not any(a in r.get("shape", "").lower() for a in avoid)]
    hits.sort(key=lambda r: not any(p in r.get("shape", "").lower() for p in prefer))
    return hits[0] if hits else None


def rows_of(shape):
    s = shape.lower()
    m = re.match(r"\s*(\d+)\s*x\s*\d+", s) or re.search(r"\brows?\s*[=:]?\s*(\d+)", s) or \
        re.search(r"\b(\d+)\s*rows?\b", s) or re.search(r"\bb(\d+)\b", s)
    return int(m.group(1)) if m else None


def find_topp(results, rows):
    def ok(r, need_marker):
        s = r.get("shape", "").lower()
        if rows_of(s) != rows or any(a in s for a in ("penalt", "k20", "min_p", "greedy")):
            return False
        return not need_marker or re.search(r"top[_-]?p|\bp0?\.9", s) is not None
    for r in results:  # the perf mode's "sampling" entries are top-p by definition
        if r.get("op", "").lower() == "sampling" and ok(r, False):
            return r
    for r in results:
        op = r.get("op", "").lower()
        if (op.startswith("sampl") or op.startswith("top")) and ok(r, True):
            return r
    return None


def batch_of(shape):
    m = re.search(r"batch\s*(\d+)", shape)
    return int(m.group(1)) if m else None


# ---- formatting ----

def num(v, fmt):
    return "n/a" if v is None else fmt % v


def ratio_of(a, b):
    return a / b if a and b else None


def verdict(checks):
    """checks: (label, ok or None); PASS only when every check passed"""
    if not checks:
        return ""
    if any(ok is None for _, ok in checks):
        return "n/a"
    failed = [label for label, ok in checks if not ok]
    return "PASS" if not failed else "FAIL (%s)" % "; ".join(failed)


def comparison(perf, torch):
    """issue 21's rows: pdserve against PyTorch on the same GPU"""
    res = perf.get("results", []) if perf else []
    k = (torch or {}).get("kernels") or {}
    copy = perf.get("measured_copy_gbps") if perf else None
    gemm = perf.get("measured_gemm_tflops") if perf else None
    rows = []

    def attn(pred, want):
        """the kernel's entry, and the one with the backend's f32 q/o conversions around it
        (the perf mode reports both for FlashInfer's kernels)"""
        return (find(res, pred, want, avoid=("fp8", "conversion")),
                find(res, pred, want + ("conversions",), avoid=("fp8",)))

    def add(op, pd_v, pd_txt, t_v, t_txt, ratio, target, checks, unit, extra=None):
        rows.append(dict({"op": op, "pdserve": pd_txt, "pytorch": t_txt,
                     "ratio": None if ratio is None else round(ratio, 3),
                     "target": target, "check": verdict(checks),
                     "pass": None if not checks or any(ok is None for _, ok in checks)
                     else all(ok for _, ok in checks),
                     "pdserve_value": pd_v, "pytorch_value": t_v, "unit": unit}, **(extra or {})))

    def ge(v, lim):
        return None if v is None else v >= lim

    def le(v, lim):
        return None if v is None else v <= lim

    # limits
    add("device copy (HBM)", copy or None, num(copy or None, "%.0f GB/s"), k.get("copy_gbps"),
        num(k.get("copy_gbps"), "%.0f GB/s"), ratio_of(copy, k.get("copy_gbps")), "", [],
        "GB/s")
    add("bf16 GEMM 8192^3", gemm or None, num(gemm or None, "%.0f TFLOP/s"),
        k.get("gemm_tflops"), num(k.get("gemm_tflops"), "%.0f TFLOP/s"),
        ratio_of(gemm, k.get("gemm_tflops")), "", [], "TFLOP/s")

    # causal prefill attention against cuDNN (the threshold) and flash
    def extend_op(op):
        return (op.startswith("attn_extend") or op.startswith("attn_prefill")) and \
            "chunk" not in op
    for n, h, kvh, d in ((4096, 32, 8, 128), (2048, 16, 16, 64)):
        e, ec = attn(extend_op, ("new%d" % n, "ctx%d" % n, "h%d/%d" % (h, kvh), "d%d" % d))
        pd_tf = e.get("tflops") if e else None
        conv = ec.get("tflops") if ec else None
        pd_txt = num(pd_tf, "%.0f TFLOP/s") + (" (%.0f with f32 q/o conversions)" % conv
                                              if conv else "")
        t = k.get("attn_prefill_%d_%d_%d_d%d" % (n, h, kvh, d)) or {}
        name = "causal attention %d tok %d/%d d%d" % (n, h, kvh, d)
        for be, label, thr in (("cudnn", "cuDNN", 0.8), ("flash", "flash", None)):
            tv = t.get(be + "_tflops")
            r = ratio_of(pd_tf, tv)
            ttxt = num(tv, "%.0f TFLOP/s") + " (" + label + ")"
            if tv is None and t.get(be + "_error"):
                ttxt = "n/a (%s: %s)" % (label, t[be + "_error"].split(": ", 1)[-1][:40])
            add("%s vs %s" % (name, label), pd_tf, pd_txt, tv, ttxt, r,
                ">= %.2fx %s" % (thr, label) if thr else "",
                [("%sx < %.2fx %s" % (num(r, "%.2f"), thr, label), ge(r, thr))] if thr else [],
                "TFLOP/s", {"pdserve_with_conversions": conv, "pdserve_shape":
                            e.get("shape") if e else None})

    # decode attention: against the run's copy rate and PyTorch
    for b, ctx, h, kvh, d, pct in ((64, 4096, 32, 8, 128, 90), (256, 1024, 12, 2, 128, 75)):
        e, ec = attn(lambda op: op.startswith("attn_decode") and "split" not in op,
                     ("b%d" % b, "new1", "ctx%d" % ctx, "h%d/%d" % (h, kvh), "d%d" % d))
        pd_g = e.get("gbps") if e else None
        conv = ec.get("gbps") if ec else None
        of_copy = 100 * pd_g / copy if pd_g and copy else None
        t = k.get("attn_decode_b%d_ctx%d_%d_%d" % (b, ctx, h, kvh)) or {}
        tv = t.get("gbs")
        r = ratio_of(pd_g, tv)
        add("decode attention b%d ctx%d %d/%d d%d" % (b, ctx, h, kvh, d), pd_g,
            "%s (%s of copy%s)" % (num(pd_g, "%.0f GB/s"), num(of_copy, "%.0f%%"),
                                   "; %.0f with conversions" % conv if conv else ""), tv,
            "%s (%s)" % (num(tv, "%.0f GB/s"), t.get("backend", "n/a")), r,
            ">= %d%% of copy, >= 0.90x" % pct,
            [("%s%% of copy < %d%%" % (num(of_copy, "%.0f"), pct), ge(of_copy, pct)),
             ("%sx < 0.90x" % num(r, "%.2f"), ge(r, 0.9))], "GB/s",
            {"pdserve_with_conversions": conv, "pdserve_shape": e.get("shape") if e else None})

    # top-p sampling (and greedy argmax) over Qwen's 151936 logits
    for rows_n, lim in ((1, None), (64, 120), (256, 250)):
        e = find_topp(res, rows_n)
        pd_us = e.get("us") if e else None
        t = k.get("topp_rows%d" % rows_n) or {}
        tv = t.get("us")
        ttxt = num(tv, "%.0f us")
        if t.get("graph_us") is not None:
            ttxt += " (graph %.0f us)" % t["graph_us"]
        add("top-p sampling %d rows x 151936" % rows_n, pd_us, num(pd_us, "%.1f us"), tv, ttxt,
            ratio_of(tv, pd_us), "<= %d us" % lim if lim else "",
            [("%s us > %d us" % (num(pd_us, "%.0f"), lim), le(pd_us, lim))] if lim else [],
            "us")
    for rows_n in (1, 64):
        e = next((r for r in res if r.get("op") == "argmax" and
                  rows_of(r.get("shape", "")) == rows_n), None)
        pd_us = e.get("us") if e else None
        tv = (k.get("argmax_rows%d" % rows_n) or {}).get("us")
        add("argmax %d rows x 151936" % rows_n, pd_us, num(pd_us, "%.1f us"), tv,
            num(tv, "%.1f us"), ratio_of(tv, pd_us), "", [], "us")

    # whole-model decode steps (qwen2.5-1.5b, ctx 1024) against the targets
    def step(batch):
        for r in res:
            if r.get("op") == "decode_step" and batch_of(r.get("shape", "")) == batch and \
                    "fp8" not in r.get("shape", ""):
                return r
        return None
    tq = torch or {}
    for batch, lim in ((1, 1.2), (64, 3.0)):
        e = step(batch)
        pd_ms = e["us"] / 1e3 if e else None
        if batch == 1:
            tv, tl = tq.get("decode_ms_b1"), "ms/token (transformers b1)"
        else:
            tps = tq.get("decode_tok_s_b%d" % batch)
            tv, tl = (batch / tps * 1e3 if tps else None), "ms/step (transformers b%d)" % batch
        add("decode step qwen2.5-1.5b batch %d" % batch, pd_ms, num(pd_ms, "%.3f ms"), tv,
            num(tv, "%.3f " + tl), ratio_of(tv, pd_ms), "<= %g ms" % lim,
            [("%s ms > %g ms" % (num(pd_ms, "%.3f"), lim), le(pd_ms, lim))], "ms")

    # prefill of 4096 tokens: qwen2.5-1.5b against transformers, llama-3.1-8b against the GEMM
    e = find(res, lambda op: op == "prefill", ("qwen2.5-1.5b", "4096"), prefer=())
    pd_ms = e["us"] / 1e3 if e else None
    ts = tq.get("prefill_s_4096")
    tv = ts * 1e3 if ts else None
    r = ratio_of(tv, pd_ms)
    add("prefill qwen2.5-1.5b 4096 tokens", pd_ms, "%s (%s)" % (
        num(pd_ms, "%.1f ms"), num(e.get("tflops") if e else None, "%.0f TFLOP/s")), tv,
        num(tv, "%.1f ms (transformers)"), r, "faster than transformers",
        [("%sx, slower than transformers" % num(r, "%.2f"), None if r is None else r > 1)],
        "ms")
    e = find(res, lambda op: op == "prefill", ("llama-3.1-8b", "4096"), prefer=())
    pd_tf = e.get("tflops") if e else None
    g = gemm or k.get("gemm_tflops")
    pct = 100 * pd_tf / g if pd_tf and g else None
    add("prefill llama-3.1-8b 4096 tokens", pd_tf, "%s (%s of gemm)" % (
        num(pd_tf, "%.0f TFLOP/s"), num(pct, "%.0f%%")), k.get("gemm_tflops"),
        num(k.get("gemm_tflops"), "gemm %.0f TFLOP/s"), None, ">= 50% of gemm rate",
        [("%s%% of gemm < 50%%" % num(pct, "%.0f"), ge(pct, 50))], "TFLOP/s")
    return rows


def print_comparison(rows):
    head = ("op", "pdserve", "PyTorch (same run)", "ratio", "target", "check")
    cells = [head] + [(r["op"], r["pdserve"], r["pytorch"], num(r["ratio"], "%.2fx"),
                       r["target"], r["check"]) for r in rows]
    w = [max(len(c[i]) for c in cells) for i in range(5)]
    print("\nissue 21: pdserve vs PyTorch on the same GPU, same run (ratio = pdserve speed / "
          "PyTorch speed; > 1: pdserve faster)")
    for i, c in enumerate(cells):
        print(" | ".join("%-*s" % (w[j], c[j]) for j in range(5)) + " | " + c[5])
        if i == 0:
            print("-+-".join("-" * x for x in w) + "-+------")
    checked = [r for r in rows if r["check"]]
    print("issue 21 thresholds: %d PASS, %d FAIL, %d n/a" % (
        sum(r["pass"] is True for r in checked), sum(r["pass"] is False for r in checked),
        sum(r["pass"] is None for r in checked)))


# ---- colocated vs disaggregated (bench/compare-pd.sh's JSON Lines) ----

def rate_key(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.inf


def load_compare(out):
    d = os.path.join(out, "compare")
    runs = {}
    for label in ("colocated", "pd"):
        try:
            with open(os.path.join(d, label + ".jsonl")) as f:
                runs[label] = [json.loads(x) for x in f if x.strip()]
        except (OSError, ValueError):
            runs[label] = None
    if not any(runs.values()):
        return None
    res = {"runs": {}}
    for label, rs in runs.items():
        if not rs:
            res["runs"][label] = None
            continue
        sat = [r for r in rs if rate_key(r.get("request_rate")) == math.inf]
        top = sat[0] if sat else max(rs, key=lambda r: r.get("output_throughput", 0))
        res["runs"][label] = {
            "saturation_rate": top.get("request_rate") if sat else
            "%s, the best; no inf run" % top.get("request_rate"),
            "output_tok_s": top.get("output_throughput"),
            "per_rate": [{k: r.get(k) for k in (
                "request_rate", "output_throughput", "request_goodput", "request_throughput",
                "completed", "failed", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms",
                "median_itl_ms", "p99_itl_ms")} for r in rs]}
        for r in rs[:1]:
            res.update({k: r.get(k) for k in ("random_input_len", "random_output_len",
                                               "num_prompts", "slo_ttft_ms", "slo_tpot_ms")})
    # issue 17: PD's median TTFT minus colocated's per rate, at most 3 ms at the lightest
    res["ttft_gap_ms"] = ttft_gaps(runs.get("colocated"), runs.get("pd"))
    return res


def ttft_gaps(colo, pd):
    # per rate: the repeats' medians, and the median of the differences within a repeat (the
    # k-th load of a rate on one setup against the k-th on the other), as compare-pd.sh does
    by = {}
    for label, rs in (("colocated", colo), ("pd", pd)):
        for r in rs or []:
            if r.get("median_ttft_ms") is not None:
                by.setdefault(r.get("request_rate"), {}).setdefault(label, []).append(
                    r["median_ttft_ms"])
    gaps = []
    for rate in sorted(by, key=rate_key):
        c, p = by[rate].get("colocated"), by[rate].get("pd")
        if c and p:
            gaps.append({"request_rate": rate, "colocated_ms": statistics.median(c),
                         "pd_ms": statistics.median(p),
                         "gap_ms": statistics.median([b - a for a, b in zip(c, p)]),
                         "repeats": min(len(c), len(p))})
    return gaps


def print_compare(c):
    if not c:
        print("compare: missing (compare/colocated.jsonl, compare/pd.jsonl)")
        return
    runs = c["runs"]
    print("compare (colocated vs PD, %s in / %s out, %s prompts per rate):" % (
        c.get("random_input_len"), c.get("random_output_len"), c.get("num_prompts")))
    sat = []
    for label in ("colocated", "pd"):
        r = runs.get(label)
        sat.append("%s %s" % (label, "missing" if not r else "%.0f tok/s (rate %s)" % (
            r["output_tok_s"] or 0, r["saturation_rate"])))
    a, b = runs.get("pd"), runs.get("colocated")
    if a and b and b["output_tok_s"]:
        sat.append("pd/colocated %.2f" % (a["output_tok_s"] / b["output_tok_s"]))
    print("compare: output tok/s at saturation: " + ", ".join(sat))
    rates = []
    for r in runs.values():
        for x in (r or {}).get("per_rate", []):
            if x["request_rate"] not in rates:
                rates.append(x["request_rate"])
    rates.sort(key=rate_key)
    parts = []
    for rate in rates:
        vals = []
        for label in ("colocated", "pd"):
            x = next((x for x in (runs.get(label) or {}).get("per_rate", [])
                      if x["request_rate"] == rate), None)
            vals.append("%s %s" % (label, num(x and x.get("request_goodput"), "%.2f")))
        parts.append("rate %s: %s" % (rate, ", ".join(vals)))
    print("compare: goodput req/s (TTFT <= %s ms, TPOT <= %s ms): %s" % (
        c.get("slo_ttft_ms"), c.get("slo_tpot_ms"), "; ".join(parts)))
    gaps = c.get("ttft_gap_ms") or []
    if gaps:
        print("compare: median TTFT colocated / PD (PD - colocated), ms: " + "; ".join(
            "rate %s: %.2f / %.2f (%+.2f)" % (g["request_rate"], g["colocated_ms"], g["pd_ms"],
                                              g["gap_ms"]) for g in gaps))
        g = gaps[0]
        print("compare: issue 17, at the lightest rate (%s req/s) PD's median TTFT within 3 ms of "
              "colocated's: %+.2f ms, %s" % (g["request_rate"], g["gap_ms"],
                                             "PASS" if g["gap_ms"] <= 3 else "FAIL"))


# ---- everything ----

def main():
    args = sys.argv[1:]
    if args and args[0] == "--compare":
        print_compare(load_compare(args[1] if len(args) > 1 else "."))
        return
    if len(args) != 1:
        print(__doc__)
        sys.exit(2)
    out = args[0]
    perf = load_perf(out)
    xfers = [x for x in (load(os.path.join(out, "xfer.json")),
                         load(os.path.join(out, "xfer-ucx.json"))) if x]
    torch = load(os.path.join(out, "torch.json"))
    disagg = load(os.path.join(out, "disagg.json"))
    compare = load_compare(out)
    rows = []  # (what, value, against)
    res = {"perf": perf, "xfer": xfers, "torch": torch, "disagg": disagg, "compare": compare}
    pd_b1_ms = None
    if perf:
        copy, gemm = perf.get("measured_copy_gbps", 0), perf.get("measured_gemm_tflops", 0)
        rows.append(("HBM copy rate (device copy)", "%.0f GB/s" % copy,
                     "peak %.0f" % perf.get("peak_gbps", 0)))
        rows.append(("cuBLAS bf16 GEMM", "%.0f TFLOP/s" % gemm,
                     "peak %.0f" % perf.get("peak_tflops", 0)))
        if perf.get("salvaged") or perf.get("from_perf_txt"):
            rows.append(("perf mode", "incomplete", "perf.json missing or cut short: read line"
                         " by line and from perf.txt"))
        for r in perf.get("results", []):
            op, shape = r.get("op", ""), r.get("shape", "")
            if op == "decode_step":
                b = shape.split("batch ")[1].split()[0] if "batch " in shape else "?"
                ms = r["us"] / 1e3
                if b == "1":
                    pd_b1_ms = pd_b1_ms or ms
                    bound = r.get("gbps") and (r["gbps"] * ms / copy) if copy else 0
                    rows.append(("decode qwen2.5-1.5b batch 1", "%.3f ms/token" % ms,
                                 "%.0f%% of weight-bytes/HBM-rate (%.3f ms; target >= 60%%)" %
                                 (100 * bound / ms if ms else 0, bound)))
                else:
                    kv = shape.split(" kv ")[1].split()[0] if " kv " in shape else ""
                    rows.append(("decode qwen2.5-1.5b batch %s%s" % (b, " kv " + kv if kv else ""),
                                 "%.0f tokens/s" % (int(b) / (ms / 1e3)) if b.isdigit() else "?",
                                 "%.3f ms/step" % ms))
            elif op == "prefill":
                rows.append(("prefill " + shape, "%.1f TFLOP/s" % r.get("tflops", 0),
                             "%.0f%% of GEMM rate (target >= 50%% on llama-3.1-8b); %.1f ms" %
                             (100 * r.get("tflops", 0) / gemm if gemm else 0, r["us"] / 1e3)))
            elif op.startswith("attn") and not r.get("gbps") and r.get("tflops"):
                rows.append((op + " " + shape, "%.0f TFLOP/s" % r["tflops"],
                             "%.0f%% of GEMM rate" % (100 * r["tflops"] / gemm if gemm else 0)))
            elif op.startswith("attn"):
                rows.append((op + " " + shape, "%.0f GB/s" % r.get("gbps", 0),
                             "%.0f%% of copy" % (100 * r.get("gbps", 0) / copy if copy else 0)))
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
        rows.append(("PyTorch %s + transformers %s decode b1" % (
            torch.get("torch"), torch.get("transformers", "(none)")),
            num(t, "%.3f ms/token"),
            "pdserve/torch time ratio %.2f" % (pd_b1_ms / t) if pd_b1_ms and t else
            torch.get("transformers_error", "")))
        for key, v in torch.items():
            if key.startswith("decode_tok_s_b"):
                rows.append(("PyTorch decode batch " + key[len("decode_tok_s_b"):],
                             "%.0f tokens/s" % v, ""))
            if key.startswith("prefill_s_"):
                rows.append(("PyTorch prefill %s tokens (qwen2.5-1.5b)" % key[len("prefill_s_"):],
                             "%.1f ms" % (v * 1e3), ""))
        kern = torch.get("kernels") or {}
        errs = sorted(key for key in kern if key.endswith("_error") or key == "error")
        rows.append(("PyTorch kernel timings", "%d measured" % sum(
            1 for key in kern if not key.endswith("_error") and key not in ("error", "seconds")),
            "in %s s%s" % (kern.get("seconds", "?"),
                           "; failed: " + ", ".join(errs) if errs else "")))
    else:
        rows.append(("PyTorch baseline", "missing", "torch.json"))
    for d in disagg or []:
        rows.append(("disaggregated %s on the GPU" % d["shape"],
                     "%s/%s equal" % (d.get("equal"), d.get("prompts")),
                     "%s; %s" % ("PASS" if d.get("ok") else "FAIL " + d.get("error", ""),
                                 d.get("decode_transport"))))
    if not disagg:
        rows.append(("disaggregated path", "missing", "disagg.json"))
    ratios = comparison(perf, torch)
    res["table"] = [{"what": a, "value": b, "against": c} for a, b, c in rows]
    res["ratios"] = ratios
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    w = max(len(a) for a, _, _ in rows)
    for a, b, c in rows:
        print("%-*s  %-18s %s" % (w, a, b, c))
    print_comparison(ratios)
    print()
    print_compare(compare)


if __name__ == "__main__":
    main()
