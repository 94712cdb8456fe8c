#!/usr/bin/env python3
"""test_device_cuda.py — `--device cuda` on the daemons and pdserve-generate.

Without a usable GPU (no CUDA device, or the CUDA backend not in this build) every binary must
refuse at start: exit non-zero within seconds, with a message naming the cause ("no CUDA
device" / "not in this build") and the flag. With a GPU (the H200 run of scripts/gpu-run.sh),
the daemons must start on it and /server_info must report device "cuda", the GPU index and a
"cuda (...)" backend. --device cuda --tp-size 2 (prefill, decode, colocated) needs NCCL and a
second GPU; without them it is refused at start, naming what is missing.
Stdlib only. Usage: test_device_cuda.py BUILD_DIR
"""
import http.client
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pd_cluster as pc  # noqa: E402
from pd_cluster import free_port  # noqa: E402

BUILD = sys.argv[1]
PREFILL = os.path.join(BUILD, "prefill/pdserve-prefill")
DECODE = os.path.join(BUILD, "decode/pdserve-decode")
GENERATE = os.path.join(BUILD, "tools/pdserve-generate")
FAILS = []
NO_GPU = ("no CUDA device", "not in this build")


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)


def gpu_present():
    """True when pdserve-generate can start the cuda backend here."""
    return os.environ.get("PD_TEST_GPU") == "1"


def gpu_count():
    """GPUs nvidia-smi lists (0 when it is absent)."""
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for ln in r.stdout.splitlines() if ln.startswith("GPU "))


def daemon_args(role, model, extra=()):
    port = free_port()
    args = [PREFILL if role == "prefill" else DECODE, "--model-path", model, "--port", str(port),
            "--page-size", "16", "--max-total-tokens", "4096", "--log-level", "warning"]
    if role == "prefill":
        args += ["--disaggregation-mode", "prefill",
                 "--disaggregation-bootstrap-port", str(free_port())]
    elif role == "decode":
        args += ["--disaggregation-mode", "decode"]
    else:
        args += ["--disaggregation-mode", "null"]
    return port, args + list(extra)


def refused(name, args, want):
    t0 = time.time()
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        check(False, "%s: exits at start (it kept running)" % name)
        return
    msg = p.stderr.strip()
    check(p.returncode != 0, "%s: exit status non-zero (got %d)" % (name, p.returncode))
    check(any(w in msg for w in want), "%s: message names the cause: %r" % (name, msg[-300:]))
    check(time.time() - t0 < 30, "%s: refused within 30 s" % name)


def serve_on_gpu(role, model):
    port, args = daemon_args(role, model, ["--device", "cuda", "--mem-fraction-static", "0.3"])
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        info = None
        while time.time() < deadline and p.poll() is None and info is None:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/server_info")
                r = c.getresponse()
                if r.status == 200:
                    info = json.loads(r.read())
                c.close()
            except OSError:
                time.sleep(0.2)
        if info is None:
            err = p.stderr.read() if p.poll() is not None else ""
            check(False, "%s --device cuda starts on the GPU (%s)" % (role, err.strip()[-300:]))
            return
        check(info.get("device") == "cuda", "%s /server_info device == cuda" % role)
        check(info.get("base_gpu_id") == 0, "%s /server_info base_gpu_id == 0" % role)
        check(str(info.get("backend", "")).startswith("cuda"),
              "%s /server_info backend %r is cuda" % (role, info.get("backend")))
    finally:
        p.terminate()
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main():
    tmp = pc.tmpdir()
    model = pc.make_model(BUILD, tmp)
    if not gpu_present() or gpu_count() < 2:
        for role in ("prefill", "decode", "null"):
            _, args = daemon_args(role, model, ["--device", "cuda", "--tp-size", "2"])
            refused("%s --device cuda --tp-size 2" % role, args,
                    NO_GPU + ("NCCL", "GPU 1", "device 1 of 1"))
    if gpu_present():
        for role in ("null", "prefill", "decode"):
            serve_on_gpu(role, model)
    else:
        for role in ("prefill", "decode", "null"):
            _, args = daemon_args(role, model, ["--device", "cuda", "--base-gpu-id", "1"])
            refused("%s --device cuda" % role, args, NO_GPU)
        refused("pdserve-generate --device cuda",
                [GENERATE, "--model-path", model, "--device", "cuda", "hi",
                 "--max-new-tokens", "2"], NO_GPU)
    if FAILS:
        print("%d failures" % len(FAILS))
        sys.exit(1)
    print("all passed")


if __name__ == "__main__":
    main()
