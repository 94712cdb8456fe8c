#!/usr/bin/env python3
"""test_xfer_stall.py — a wedged transfer engine must not look healthy (issue 17): prefill's
/health turns 503 while its KV transfer engine holds operations that do not complete, and 200
again once they do.

The KV pages move over UCX's tcp lane (UCX_TLS=tcp on loopback), where page data goes as active
messages that complete only as the receiver reads its socket. A request with a long prompt (tens
of MB of KV, far more than the sockets buffer) is sent; as soon as prefill has the decode's room
(Transfer arrived), the decode is stopped (SIGSTOP: its sockets stay open, it reads nothing).
Prefill computes the prompt and writes its pages until the sockets are full; from then on its
operations are outstanding and none completes. Checked:
  1. before: prefill's /health 200, /server_info kv_transfer.stuck false;
  2. stopped: within --transfer-stall-timeout (1 s) plus a margin, /health answers 503 naming the
     stuck engine, and /server_info says stuck with operations outstanding;
  3. SIGCONT: /health 200 again within 10 s; the request ends with the right answer (the pages
     arrived whole: greedy output equal to pdserve-generate's); both pools full; the cluster
     serves a new request;
  4. a prefill started with --transfer-stall-timeout 0 never reports a stall (the check is off);
  5. the transfer self-test each daemon runs at start (/server_info kv_transfer.self_test): the
     lanes UCX picked name the transport in use (tcp here; posix/cma shared memory with
     UCX_TLS=posix,cma), a page and a room moved at a measured rate, no error.

Usage: test_xfer_stall.py BUILD_DIR
"""
import json
import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pd_cluster as pc  # noqa: E402
from pd_cluster import check, step  # noqa: E402

BUILD = os.path.abspath(sys.argv[1])
STALL_S = 1.0
PROMPT_LEN = 1900  # x 32 KiB of KV per token (16 layers, 4 kv heads of 128, bf16): ~59 MiB
MAX_NEW = 8


def kv_transfer(d):
    return d.server_info()["kv_transfer"]


def self_test_ok(d, transport, what):
    """The daemon's start-up self-test found lanes of transport and measured both sizes."""
    st = kv_transfer(d)["self_test"]
    step("%s self-test: %s" % (what, st))
    check(st["error"] == "" and transport in st["lanes"] and st["path"] in ("put", "am"),
          "%s self-test ran over %s: %s" % (what, transport, st))
    check(st["page_gbps"] > 0 and st["room_gbps"] > 0 and st["room_bytes"] >= st["page_bytes"] > 0,
          "%s self-test measured a page and a room: %s" % (what, st))


def one_stall(model, prompt, ref, stall_timeout, tmp):
    """Runs the scenario with prefill's --transfer-stall-timeout stall_timeout; returns whether
    /health answered 503 while the decode was stopped."""
    env = dict(os.environ, UCX_TLS="tcp", UCX_NET_DEVICES="lo")
    timeouts = ["--bootstrap-timeout", "120", "--waiting-timeout", "120"]
    pf = pc.Daemon(BUILD, "prefill", model, tmp, timeouts + [
        "--transfer-stall-timeout", str(stall_timeout), "--max-total-tokens", "8192"], env=env)
    dc = pc.Daemon(BUILD, "decode", model, tmp, timeouts + ["--max-total-tokens", "8192"],
                   env=env)
    rt = pc.Router(BUILD, [(pf.port, pf.bport)], [dc.port], tmp,
                   ["--worker-unresponsive-secs", "60"] + pc.PD_PATH_ONLY)
    check(pf.get("/health")[0] == 200, "prefill healthy before the request")
    check(kv_transfer(pf)["stuck"] is False, "prefill's engine not stuck before the request")
    self_test_ok(pf, "tcp", "prefill")
    self_test_ok(dc, "tcp", "decode")

    answer = {}

    def ask():
        body = {"input_ids": prompt, "sampling_params": {
            "max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True}}
        t0 = time.time()
        try:
            answer["r"] = rt.post("/generate", body, timeout=120)
        except OSError as e:
            answer["r"] = (None, repr(e).encode())
        answer["s"] = time.time() - t0

    th = threading.Thread(target=ask)
    th.start()
    # prefill has the decode's room once its Transfer arrived; stop the decode at once
    check(pc.wait_until(lambda: kv_transfer(pf)["live_rooms"] >= 1, 30, step=0.005),
          "prefill got the decode's room")
    dc.pause()
    t_stop = time.time()
    step("decode stopped (stall timeout %g s)" % stall_timeout)
    saw = {}

    def unhealthy():
        st, body = pf.get("/health", timeout=5)
        if st == 503:
            saw["body"] = body.decode(errors="replace")
            saw["info"] = kv_transfer(pf)
            return True
        return False

    wait = STALL_S + 9.0 if stall_timeout > 0 else 4.0
    got_503 = pc.wait_until(unhealthy, wait, step=0.05)
    if got_503:
        step("prefill /health 503 %.2f s after the stop: %s" % (time.time() - t_stop,
                                                                saw["body"]))
        check("transfer engine stuck" in saw["body"],
              "the 503 names the stuck engine: %s" % saw["body"])
        check(saw["info"]["stuck"] is True and saw["info"]["outstanding_ops"] > 0,
              "/server_info says stuck with operations outstanding: %s" % saw["info"])
    else:
        info = kv_transfer(pf)
        step("no 503 within %.0f s of the stop; engine %s" % (wait, info))
    dc.resume()
    t_cont = time.time()
    check(pf.health_by(t_cont + 10), "prefill /health 200 within 10 s of SIGCONT")
    step("prefill healthy again %.2f s after SIGCONT" % (time.time() - t_cont))
    th.join(60)
    check(not th.is_alive(), "the request ended within 60 s of SIGCONT")
    st, raw = answer.get("r", (None, b""))
    if check(st == 200, "the request answered 200: %s %s" % (st, raw[:300])):
        ids = json.loads(raw).get("output_ids")
        check(ids == ref, "the answer equals pdserve-generate's: %s vs %s" % (ids, ref))
    check(pf.pool_full(10) and dc.pool_full(10), "both pools full after the request")
    check(pc.serves(rt), "the cluster serves a new request")
    for p in (rt, dc, pf):
        p.kill()
    return got_503


def main():
    tmp = pc.tmpdir()

    def body():
        model = pc.make_model(BUILD, tmp, ["--layers", "16", "--hidden-size", "256", "--heads",
                                           "4", "--kv-heads", "4", "--head-dim", "128"])
        rng = random.Random(17)
        prompt = [rng.randrange(1000) for _ in range(PROMPT_LEN)]
        ref = pc.generate_ids(BUILD, model, [prompt], MAX_NEW, what="reference")
        if ref is None:
            return
        step("stall check on (%g s)" % STALL_S)
        check(one_stall(model, prompt, ref[0], STALL_S, tmp),
              "prefill /health answered 503 while its engine was stuck")
        step("self-test over shared memory")
        shm = dict(os.environ, UCX_TLS="posix,cma", UCX_MM_ERROR_HANDLING="y",
                   UCX_POSIX_ERROR_HANDLING="y")
        d = pc.Daemon(BUILD, "decode", model, tmp, env=shm)
        self_test_ok(d, "posix", "decode on shared memory")
        d.kill()
        step("stall check off (0)")
        check(not one_stall(model, prompt, ref[0], 0, tmp),
              "with --transfer-stall-timeout 0 /health never answers 503 for a stall")

    pc.run_test("xfer_stall", body, tmp)


main()
