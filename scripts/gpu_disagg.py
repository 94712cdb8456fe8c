#!/usr/bin/env python3
"""gpu_disagg.py — the disaggregated path on one GPU (issue 7): pdserve-prefill and pdserve-decode
with --device cuda as two processes on GPU 0 (each --mem-fraction-static small enough that both
fit), pdserve-router in front, and the greedy text of each prompt through the router compared
with pdserve-generate --device cuda on the same model (one process per prompt, as the router
sends them one at a time, so both run batch 1).

  gpu_disagg.py BUILD_DIR OUTDIR [--shapes tiny,qwen2.5-1.5b] [--prompts N] [--max-new N]
                [--device cuda|cpu]      (cpu: the same run without a GPU, to check the script)

Models come from pdserve-mkmodel (random weights; qwen2.5-1.5b = the qwen2.5-0.5b family with
Qwen2.5-1.5B's published sizes). Writes OUTDIR/disagg.json and the daemons' logs; prints one
line per shape. Exit status 1 when any text differs or anything fails. Stdlib only; reuses
tests/integration/pd_cluster.py to start and kill the processes.
"""
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import pd_cluster as pc  # noqa: E402

SHAPES = {
    "tiny": [],
    "qwen2.5-1.5b": ["--shape", "qwen2.5-0.5b", "--hidden-size", "1536", "--intermediate-size",
                     "8960", "--layers", "28", "--heads", "12", "--kv-heads", "2",
                     "--head-dim", "128"],
}
PROMPTS = ["The quick brown fox", "Hello", "Once upon a time in a land far away, there lived",
           "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30",
           "Disaggregated serving splits prefill and decode", "a", "What is the capital of",
           "The KV cache of every layer moves page by page between the two daemons"]


DEVICE = "cuda"


def generate_ref(build, model, prompt, max_new):
    args = [os.path.join(build, "tools", "pdserve-generate"), "--model-path", model,
            "--device", DEVICE, "--max-new-tokens", str(max_new), "--page-size", "16",
            "--chunked-prefill-size", "64", "--", prompt]
    out = subprocess.run(args, capture_output=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError("pdserve-generate: %s" % out.stderr.decode()[-500:])
    return out.stdout[:-1].decode("utf-8")


def run_shape(build, outdir, shape, n_prompts, max_new):
    res = {"shape": shape, "ok": False}
    tmp = os.path.join(outdir, "disagg-" + shape)
    os.makedirs(tmp, exist_ok=True)
    model = os.path.join(tmp, "model")
    t0 = time.time()
    subprocess.run([os.path.join(build, "tools", "pdserve-mkmodel"), "--out", model,
                    "--log-level", "warning"] + SHAPES[shape], check=True, timeout=600)
    res["mkmodel_s"] = round(time.time() - t0, 1)
    prompts = PROMPTS[:n_prompts]
    t0 = time.time()
    refs = [generate_ref(build, model, p, max_new) for p in prompts]
    res["generate_s"] = round(time.time() - t0, 1)
    gpu = ["--device", DEVICE, "--base-gpu-id", "0", "--mem-fraction-static", "0.3",
           "--max-total-tokens", "65536", "--chunked-prefill-size", "64", "--log-level", "info"]
    pf = dc = rt = None
    try:
        pf = pc.Daemon(build, "prefill", model, tmp, gpu, ready_timeout=300)
        dc = pc.Daemon(build, "decode", model, tmp, gpu, ready_timeout=300)
        rt = pc.Router(build, [(pf.port, pf.bport)], [dc.port], tmp)
        for d in (pf, dc):
            info = d.server_info()
            res["%s_backend" % d.role] = info.get("backend")
            res["%s_transport" % d.role] = info.get("transfer_transport")
        same = 0
        diffs = []
        t0 = time.time()
        for p, ref in zip(prompts, refs):
            st, raw = rt.post("/generate", {"text": p, "sampling_params": {
                "max_new_tokens": max_new, "temperature": 0}}, timeout=300)
            text = json.loads(raw)["text"] if st == 200 else None
            if text == ref:
                same += 1
            else:
                diffs.append({"prompt": p, "status": st, "got": text if st == 200 else
                              raw[:300].decode("utf-8", "replace"), "want": ref})
        res["serve_s"] = round(time.time() - t0, 1)
        res["prompts"] = len(prompts)
        res["equal"] = same
        res["diffs"] = diffs
        res["pools_full"] = pf.pool_full(10) and dc.pool_full(10)
        res["ok"] = same == len(prompts) and res["pools_full"]
    except Exception as e:  # noqa: BLE001 — reported, the run goes on to the next shape
        res["error"] = repr(e)
        for d in (pf, dc, rt):
            if d is not None:
                res.setdefault("logs", {})[d.name] = d.log_tail(2000)
    finally:
        pc.kill_all()
        pc.PROCS.clear()
    return res


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        sys.exit(2)
    build, outdir = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    global DEVICE
    shapes, n_prompts, max_new = ["tiny", "qwen2.5-1.5b"], len(PROMPTS), 32
    a = sys.argv[3:]
    for i in range(0, len(a) - 1, 2):
        if a[i] == "--shapes":
            shapes = a[i + 1].split(",")
        elif a[i] == "--prompts":
            n_prompts = int(a[i + 1])
        elif a[i] == "--max-new":
            max_new = int(a[i + 1])
        elif a[i] == "--device":
            DEVICE = a[i + 1]
    os.makedirs(outdir, exist_ok=True)
    results = []
    for s in shapes:
        try:
            r = run_shape(build, outdir, s, n_prompts, max_new)
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            # e.g. no GPU: the reference run refuses at once; say so in disagg.json and the
            # summary line instead of a traceback, and try the next shape
            r = {"shape": s, "ok": False, "error": str(e).strip()[-300:]}
        results.append(r)
        print("disagg %-14s %s: %s/%s prompts equal to pdserve-generate --device %s; "
              "backend %s; transport %s%s" %
              (s, "PASS" if r["ok"] else "FAIL", r.get("equal"), r.get("prompts"), DEVICE,
               r.get("decode_backend"), r.get("decode_transport"),
               ("; error " + r["error"]) if "error" in r else ""), flush=True)
    with open(os.path.join(outdir, "disagg.json"), "w") as f:
        json.dump(results, f, indent=1)
    sys.exit(0 if all(r["ok"] for r in results) else 1)


if __name__ == "__main__":
    main()
