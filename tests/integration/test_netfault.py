#!/usr/bin/env python3
"""test_netfault.py — prefill and decode in two network namespaces over a faulty link (issue 20,
network faults): the prefill alone on the far side (10.77.0.2), decode, router and clients on the
near side, so the bootstrap gRPC calls, the router's calls to the prefill and the UCX tcp lane
that carries the KV pages all cross the link (netlink.py: delay, loss, link down).

Phases, each under load (concurrent greedy requests, half of them streamed; every answer is
compared token for token with pdserve-generate's, so a page written into the wrong place or after
its room ended shows as a wrong token):
  1. a clean link: every answer right;
  2. 50 ms delay each way and 1% loss each way: every answer right;
  3. the same, and the link down for 10 s while clients keep sending: every request ends with
     the right answer or an error within the daemons' timeouts (--bootstrap-timeout and
     --waiting-timeout, 8 s: shorter than the outage, so rooms are given up mid-transfer), plus
     the outage and a margin; none hangs; within 10 s of the link coming back the cluster
     answers a new request right; both page pools return to full;
  4. a clean link again: every answer right (the pages the outage's failed requests held are
     reused here);
  5. the KV path alone, checked byte for byte (pdserve-xfer-test: sender far, receiver near, each
     page's content a function of its room, each room's checksum in its done notice), under the
     delay and loss, with the link down 10 s mid-run: no page differs, no page of a room that
     was lost to the outage is written after the room ended (its pages are held, marked, for
     longer than the outage, then checked), rooms after the outage go through; then a second
     run on the restored link loses no room.

Runs itself in a user + network namespace of its own (netlink.enter_namespace): nothing on the
host's network changes. Usage: test_netfault.py BUILD_DIR [ROUNDS_OF_PHASE_3].
"""
import json
import os
import random
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netlink  # noqa: E402
import pd_cluster as pc  # noqa: E402
from pd_cluster import check, step  # noqa: E402

netlink.enter_namespace()

BUILD = os.path.abspath(sys.argv[1])
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 1
TIMEOUT_S = 8        # --bootstrap-timeout and --waiting-timeout: shorter than the outage, so the
                     # requests it catches time out, and their rooms are given up mid-transfer
OUTAGE_S = 10         # the link down
SERVE_AGAIN_S = 10    # a right answer again at most this long after the link is back
N_LOAD = 8            # requests in flight in each phase
DELAY_S, LOSS = 0.050, 0.01


def prompts_and_refs(model, rng):
    """N_LOAD prompts of 17..300 token ids and their greedy answers (16..48 new tokens)."""
    lens = [17, 33, 64, 65, 129, 200, 257, 300]
    prompts = [[rng.randrange(1000) for _ in range(lens[i % len(lens)])] for i in range(N_LOAD)]
    news = [16 + 8 * (i % 5) for i in range(N_LOAD)]
    refs = []
    for n in sorted(set(news)):
        idx = [i for i in range(N_LOAD) if news[i] == n]
        ids = pc.generate_ids(BUILD, model, [prompts[i] for i in idx], n, what="reference")
        if ids is None:
            return None
        refs.append((idx, ids))
    out = [None] * N_LOAD
    for idx, ids in refs:
        for i, r in zip(idx, ids):
            out[i] = r
    return prompts, news, out


def ask(rt, prompt, max_new, stream, timeout):
    """(output ids, None) for a right-shaped 200 answer, else (None, what went wrong); and the
    seconds it took."""
    body = {"input_ids": prompt, "stream": stream,
            "sampling_params": {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}}
    t0 = time.time()
    try:
        st, raw = rt.post("/generate", body, timeout=timeout)
    except OSError as e:
        return None, "no answer: %r" % e, time.time() - t0
    took = time.time() - t0
    if st != 200:
        return None, "HTTP %d %s" % (st, raw[:200]), took
    try:
        j = pc.stream_payloads(raw)[-1] if stream else json.loads(raw)
        return j["output_ids"], None, took
    except (ValueError, KeyError, IndexError) as e:
        return None, "error answer: %r" % e, took


def load(rt, work, timeout):
    """work's requests at once: [(ids, error, seconds)] in order."""
    prompts, news, _ = work
    return pc.concurrent(lambda i: ask(rt, prompts[i], news[i], i % 2 == 1, timeout), N_LOAD,
                         timeout=timeout + 30)


def all_right(results, work, what):
    refs = work[2]
    for i, r in enumerate(results):
        if not check(r is not None, "%s: request %d still running" % (what, i)):
            continue
        ids, err, took = r
        check(err is None and ids == refs[i],
              "%s: request %d (%.1f s): %s" % (what, i, took, err or "ids %s != %s" %
                                                (ids[:8], refs[i][:8])))


def pools_full(pf, dc, what):
    check(pf.pool_full(30), "%s: prefill pool back to full" % what)
    check(dc.pool_full(30), "%s: decode pool back to full" % what)


def outage(link, rt, pf, dc, work, rnd):
    """Clients keep sending while the link goes down OUTAGE_S seconds and comes back; then the
    checks of phase 3."""
    bound = OUTAGE_S + 2 * TIMEOUT_S + 10  # the longest a request may take: no hang
    prompts, news, refs = work
    done = []  # (worker, i, ids, error, seconds, started)
    stop = threading.Event()

    def client(k):
        n = 0
        while not stop.is_set():
            i = (k + 4 * n) % N_LOAD
            n += 1
            t0 = time.time()
            ids, err, took = ask(rt, prompts[i], news[i], i % 2 == 1, bound + 5)
            done.append((k, i, ids, err, took, t0))
            if err:
                time.sleep(0.2)  # a client that got an error backs off a little

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(4)]
    for t in threads:
        t.start()
    # down once the prefill holds requests (bootstrapped or computing), so some are mid-transfer
    pc.wait_until(lambda: pf.server_info().get("live_requests", 0) > 0, 10, step=0.01)
    step("round %d: link down %d s" % (rnd, OUTAGE_S))
    down_at = time.time()
    link.set_down(True)
    time.sleep(OUTAGE_S)
    link.set_down(False)
    up_at = time.time()
    step("round %d: link up" % rnd)
    # serving again: a request started after the link came back answers right
    served = pc.wait_until(lambda: any(d[5] > up_at and d[3] is None for d in done),
                           SERVE_AGAIN_S + 5, step=0.1)
    served_s = time.time() - up_at
    if not served:  # what the daemons are doing while nothing gets through
        for p in (pf, dc):
            print("--- %s threads, %.1f s after the link came up:\n%s" %
                  (p.name, time.time() - up_at, p.stacks()[-6000:]), flush=True)
    stop.set()
    for t in threads:
        t.join(bound + 10)
    check(served and served_s <= SERVE_AGAIN_S,
          "round %d: no right answer within %d s of the link coming back (%.1f s)" %
          (rnd, SERVE_AGAIN_S, served_s))
    check(not any(t.is_alive() for t in threads), "round %d: a client still waits" % rnd)
    right = errors = 0
    for k, i, ids, err, took, t0 in done:
        if err is None:
            check(ids == refs[i], "round %d: request %d answered wrong ids %s != %s" %
                  (rnd, i, ids[:8], refs[i][:8]))
            right += 1
        else:
            errors += 1
        check(took <= bound, "round %d: request %d took %.1f s (bound %d): %s" %
              (rnd, i, took, bound, err))
    in_flight = [d for d in done if d[5] < down_at and d[5] + d[4] > down_at]
    step("round %d: %d requests (%d in flight at the cut): %d right, %d errors; served again "
         "%.1f s after the link came up" % (rnd, len(done), len(in_flight), right, errors,
                                            served_s))
    check(len(in_flight) > 0, "round %d: no request was in flight when the link went down" % rnd)


def xfer_run(link, port, rooms, what, outage=False):
    """pdserve-xfer-test's receiver (near) against the sender (far) for rooms rooms; with outage,
    the link goes down OUTAGE_S seconds once 50 rooms have ended. Its summary's key=value pairs,
    or None (a failure recorded)."""
    args = [os.path.join(BUILD, "tools", "pdserve-xfer-test"), "--role", "receiver", "--host",
            netlink.FAR_ADDR, "--port", str(port), "--rooms", str(rooms), "--window", "4",
            "--max-pages", "64", "--room-timeout", "4", "--watch-lost", str(OUTAGE_S + 4)]
    env = dict(os.environ, UCX_TLS="tcp", UCX_NET_DEVICES=netlink.NEAR_DEV)
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=env, preexec_fn=pc._die_with_parent)
    out = []
    cut = False
    deadline = time.time() + 120
    for line in p.stdout:
        out.append(line)
        if outage and not cut and "progress rooms=50" in line:
            cut = True
            step("%s: link down %d s at 50 rooms" % (what, OUTAGE_S))
            link.set_down(True)
            threading.Timer(OUTAGE_S, link.set_down, (False,)).start()
        if time.time() > deadline:
            break
    try:
        rc = p.wait(max(1, deadline - time.time()))
    except subprocess.TimeoutExpired:
        p.kill()
        rc = "hung"
    summary = [ln for ln in out if "role=receiver" in ln]
    if not check(rc == 0 and summary, "%s: receiver rc %s: %s" % (what, rc, "".join(out)[-3000:])):
        return None
    step("%s: %s" % (what, summary[-1].strip()))
    check(not outage or cut, "%s: the receiver never reached 50 rooms" % what)
    return dict(kv.split("=", 1) for kv in summary[-1].split() if "=" in kv)


def xfer_checked(link, tmp):
    port = pc.free_port()
    env = dict(os.environ, UCX_TLS="tcp", UCX_NET_DEVICES=netlink.FAR_DEV)
    log = open(os.path.join(tmp, "xfer-sender.log"), "w")
    sender = subprocess.Popen(link.far_cmd([
        os.path.join(BUILD, "tools", "pdserve-xfer-test"), "--role", "sender", "--host",
        netlink.FAR_ADDR, "--port", str(port), "--window", "4"]), stdout=log,
        stderr=subprocess.STDOUT, env=env, preexec_fn=pc._die_with_parent)
    log.close()
    pc.PROCS.append(sender)
    ready = pc.wait_until(lambda: "READY" in open(os.path.join(tmp, "xfer-sender.log")).read(), 30)
    if not check(ready, "xfer sender not ready"):
        return
    r = xfer_run(link, port, 150, "xfer across an outage", outage=True)
    if r:
        check(r["late_writes"] == "0" and r["bad_pages"] == "0" and r["bad_checksums"] == "0",
              "xfer across an outage: pages written after their room ended or wrong: %r" % r)
        # every room ended; lost: at most the rooms in flight at the cut and those issued as it
        # began (their slots are then held past the outage, so nothing else is issued into it)
        check(r["rooms"] == "150" and int(r["ok"]) + int(r["lost"]) == 150 and
              int(r["lost"]) <= 8, "xfer across an outage: rooms lost or unended: %r" % r)
    r = xfer_run(link, port, 60, "xfer after the outage")
    if r:
        check(r["lost"] == "0" and r["ok"] == "60" and r["bad_pages"] == "0",
              "xfer after the outage: every room must go through: %r" % r)
    sender.terminate()
    sender.wait(10)


def body():
    tmp = TMP
    link = netlink.Link(seed=20)
    try:
        model = pc.make_model(BUILD, tmp)
        work = prompts_and_refs(model, random.Random(20))
        if not check(work is not None, "references"):
            return
        timeouts = ["--bootstrap-timeout", str(TIMEOUT_S), "--waiting-timeout", str(TIMEOUT_S)]
        far_env = dict(os.environ, UCX_TLS="tcp", UCX_NET_DEVICES=netlink.FAR_DEV)
        near_env = dict(os.environ, UCX_TLS="tcp", UCX_NET_DEVICES=netlink.NEAR_DEV)
        pf = pc.Daemon(BUILD, "prefill", model, tmp, timeouts, host=netlink.FAR_ADDR,
                       env=far_env, wrap=link.far_cmd)
        dc = pc.Daemon(BUILD, "decode", model, tmp, timeouts, env=near_env)
        # a circuit opened by the outage's failures turns half-open after 3 s, not sglang-router's
        # 30: what an operator sets where a network blip must not cost half a minute of 503s
        # every request crosses the faulty link (the local path would spare the short ones)
        rt = pc.Router(BUILD, [(pf.port, pf.bport)], [dc.port], tmp,
                       ["--cb-timeout-duration-secs", "3"] + pc.PD_PATH_ONLY,
                       prefill_host=netlink.FAR_ADDR)

        step("phase 1: clean link")
        all_right(load(rt, work, 60), work, "clean")
        pools_full(pf, dc, "clean")

        step("phase 2: %d ms delay and %.0f%% loss each way" % (DELAY_S * 1000, LOSS * 100))
        link.set_faults(DELAY_S, LOSS)
        t0 = time.time()
        all_right(load(rt, work, 90), work, "delay+loss")
        step("phase 2: load took %.1f s; link forwarded %d packets, dropped %d" %
             (time.time() - t0, link.forwarded, link.dropped))
        pools_full(pf, dc, "delay+loss")

        for rnd in range(1, ROUNDS + 1):
            step("phase 3, round %d: link down under load (delay and loss stay)" % rnd)
            outage(link, rt, pf, dc, work, rnd)
            pools_full(pf, dc, "after outage %d" % rnd)

        step("phase 4: clean link again")
        link.set_faults(0, 0)
        all_right(load(rt, work, 60), work, "clean after outages")
        pools_full(pf, dc, "clean after outages")
        for p in (pf, dc, rt):
            check(p.p.poll() is None, "%s still running" % p.name)

        step("phase 5: the KV path alone, byte for byte, delay, loss and an outage")
        link.set_faults(DELAY_S, LOSS)
        xfer_checked(link, tmp)
    finally:
        pc.kill_all()
        link.close()


TMP = pc.tmpdir()
pc.run_test("test_netfault", body, TMP)
