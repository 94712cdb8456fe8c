#!/usr/bin/env python3
"""test_faults_load.py — faults under load (issue 20): while pdserve-bench sends a steady load
through the router (Poisson arrivals, ShareGPT-like lengths, 5 % of the clients aborting after a
few tokens and 5 % resetting their connection), each of prefill, decode and router is in turn
SIGKILLed (and restarted on its ports, as kill_loop.py does) and SIGSTOPped (then SIGCONTed).
After every fault:

  - no request hangs: each one in flight at the fault, or sent while the process was down,
    ends (text or an error) within 10 s of the fault, also when the fault is a stop longer than
    that (the router gives up on a worker whose /health is silent: --worker-unresponsive-secs,
    3 s here); a stopped router holds its clients' connections, so its requests are judged from
    the SIGCONT; no request runs into the bench's own timeout;
  - the cluster serves again within 10 s of the process being back (a probe through the
    router), and every request the load sends from a second after that succeeds;
  - prefill's and decode's KV pools are back to full (no page used, no request live) within
    15 s of the load's end, and no process died that the test did not kill.

The fault must hit requests: each kill or stop finds at least one in flight. Errors of the
requests the fault hit are expected and counted by kind. Cases: `short` (CTest, label
integration): one round, stops of 12 s (5 s for the router); `full` (label slow): five rounds,
stops of 20 s.

A stopped process keeps its sockets and looks alive to UCX's keepalive: before the router gave
up on silent workers, a stopped decode held its requests' streams for the whole stop (and a
wedged one until --request-timeout-secs, 30 min); a stopped prefill's requests end anyway,
since decode gives up a Transfer call after 5 s (PD_BOOTSTRAP_DEADLINE_MS) and aborts the room.

Stdlib only. Usage: test_faults_load.py BUILD_DIR short|full [FAULT...] where a FAULT
(kill-prefill, stop-decode, ...) narrows the run to those. Every process is killed on exit.
"""
import json
import os
import subprocess
import sys
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench"))
import pd_cluster as pc  # noqa: E402
import soak  # noqa: E402  (bench/soak.py: error kinds, shared with the soak's report)
from pd_cluster import check, step  # noqa: E402

BUILD = os.path.abspath(sys.argv[1])
MODE = sys.argv[2] if len(sys.argv) > 2 else "short"
ROUNDS, STOP_S, ROUTER_STOP_S = {"short": (1, 12.0, 5.0), "full": (5, 20.0, 20.0)}[MODE]
UNRESPONSIVE_S = 3.0  # the router's --worker-unresponsive-secs
ONLY = set(sys.argv[3:])
BENCH = os.path.join(BUILD, "bench", "pdserve-bench")
RATE = 8.0          # requests/s: a few in flight at any time with this model
PRE_S = 2.0         # load before the fault
POST_S = 4.0        # load after the process is back
BOUND_S = 10.0      # the bound: answers and service within 10 s
POOL_S = 15.0       # pools full this long after the load's end
TIMEOUT_S = 60.0    # the bench's per-request timeout: what runs into it hung


def start_load(tmp, rt, tag, seconds):
    """pdserve-bench against the router for about seconds of Poisson arrivals."""
    path = os.path.join(tmp, "req-%s.jsonl" % tag)
    n = max(4, int(RATE * seconds))
    args = [BENCH, "--backend", "openai", "--base-url", "http://127.0.0.1:%d" % rt.port,
            "--dataset-name", "sharegpt-synthetic", "--random-input-len", "96",
            "--random-output-len", "128", "--num-prompts", str(n), "--request-rate", str(RATE),
            "--seed", str(zlib.crc32(tag.encode()) % 100000), "--warmup-requests", "0",
            "--abort-fraction", "0.05", "--disconnect-fraction", "0.05",
            "--disconnect-window-ms", "300", "--request-timeout", str(TIMEOUT_S),
            "--disable-progress", "--output-requests", path]
    log = open(os.path.join(tmp, "bench-%s.log" % tag), "w")
    p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                         preexec_fn=pc._die_with_parent)
    log.close()
    pc.PROCS.append(p)
    return p, path


def read_requests(path):
    try:
        with open(path) as f:
            return [json.loads(x) for x in f if x.strip()]
    except OSError:
        return []


def one_fault(tmp, procs, kind, name, k):
    pf, dc, rt = procs
    victim = {"prefill": pf, "decode": dc, "router": rt}[name]
    tag = "%s-%s-%d" % (kind, name, k)
    stop_s = ROUTER_STOP_S if name == "router" else STOP_S
    outage = stop_s if kind == "stop" else 2.0
    bench, path = start_load(tmp, rt, tag, PRE_S + outage + POST_S)
    time.sleep(PRE_S)
    # the fault must find requests at work: wait for two streaming from decode (a queued one
    # may be a client that already left)
    pc.wait_until(lambda: dc.server_info()["queues"]["running"] >= 2, 10, 0.01)
    t_fault = time.time()
    if kind == "kill":
        victim.kill()
        victim.start(60)  # same ports; waits for /health
    else:
        victim.pause()
        time.sleep(stop_s)
        victim.resume()
    t_back = time.time()
    recovered = pc.served_within(rt, BOUND_S)
    t_served = time.time()
    try:
        bench.wait(TIMEOUT_S + 30)
    except subprocess.TimeoutExpired:
        bench.kill()
        check(False, "%s: pdserve-bench still running %d s after the load" % (tag, TIMEOUT_S + 30))
    t_load_end = time.time()
    reqs = read_requests(path)

    # what the fault hit, and whether each request ended in time
    # a stopped router holds its clients' connections: only the SIGCONT can answer them
    t_from = t_back if (kind, name) == ("stop", "router") else t_fault
    hit = [r for r in reqs if r["start_unix"] <= t_fault <= r["end_unix"]]
    down = [r for r in reqs if t_fault < r["start_unix"] < t_back]
    late = [r for r in hit + down if r["end_unix"] > max(t_from, r["start_unix"]) + BOUND_S]
    hung = [r for r in reqs if r["outcome"] == "failed" and
            soak.error_kind(r.get("error")) == "timeout"]
    after = [r for r in reqs if recovered is not None and r["start_unix"] > t_served + 1.0]
    after_bad = [r for r in after if r["outcome"] == "failed"]
    kinds = {}
    for r in reqs:
        if r["outcome"] == "failed":
            e = soak.error_kind(r.get("error"))
            kinds[e] = kinds.get(e, 0) + 1
    worst = max((r["end_unix"] - max(t_fault, r["start_unix"]) for r in hit + down),
                default=0.0)

    check(len(reqs) == max(4, int(RATE * (PRE_S + outage + POST_S))),
          "%s: pdserve-bench reported %d requests" % (tag, len(reqs)))
    check(hit, "%s: the fault hit no request in flight (%d sent)" % (tag, len(reqs)))
    check(not late, "%s: %d requests hit by the fault ended more than %g s after it%s: %s" %
          (tag, len(late), BOUND_S, " was resumed" if t_from == t_back else "",
           [(r["index"], round(r["end_unix"] - t_fault, 1), r["outcome"]) for r in late[:5]]))
    check(not hung, "%s: %d requests ran into the %g s timeout (hung): %s" %
          (tag, len(hung), TIMEOUT_S, [r.get("error") for r in hung[:3]]))
    check(recovered is not None, "%s: the cluster did not serve within %g s of %s being back" %
          (tag, BOUND_S, name))
    check(not after_bad, "%s: %d of %d requests sent after the recovery failed: %s" %
          (tag, len(after_bad), len(after), [r.get("error") for r in after_bad[:3]]))
    t0 = time.time()
    full = pf.pool_full(POOL_S) and dc.pool_full(max(0.5, POOL_S - (time.time() - t0)))
    t_full = time.time() - t_load_end
    check(full, "%s: the KV pools are not full %g s after the load" % (tag, POOL_S))
    for p in procs:
        check(p.p.poll() is None, "%s: %s exited (rc %s) without being killed" %
              (tag, p.name, p.p.returncode))
    step("%-13s %2d in flight, %2d sent while down; all ended by %4.1f s after the fault; "
         "back %4.1f s after it, served %4.1f s after that; pools full %4.2f s after the load; "
         "%d sent, %d failed %s" % (
             tag, len(hit), len(down), worst, t_back - t_fault,
             recovered if recovered is not None else -1, t_full, len(reqs),
             sum(kinds.values()), kinds or ""))
    return {"fault": tag, "hit": len(hit), "down": len(down), "answered_s": worst,
            "back_s": t_back - t_fault, "recover_s": recovered, "pools_full_s": t_full,
            "errors": kinds}


def main():
    if not os.path.exists(BENCH):
        print("FAIL: %s not built" % BENCH)
        return 1
    tmp = pc.tmpdir()

    def body():
        # a model that takes a few ms a token on one thread, so requests overlap
        model = pc.make_model(BUILD, tmp, ["--family", "llama", "--shape", "tiny",
                                           "--hidden-size", "256", "--intermediate-size", "768",
                                           "--layers", "4", "--heads", "4", "--kv-heads", "2"])
        procs = pc.start_cluster(BUILD, tmp, model, router_extra=[
            "--worker-unresponsive-secs", str(UNRESPONSIVE_S)] + pc.PD_PATH_ONLY)
        step("faults under load: %s, %d round(s), stops of %g s (router %g s), %g req/s, "
             "UCX_TLS=%s" % (MODE, ROUNDS, STOP_S, ROUTER_STOP_S, RATE,
                             os.environ.get("UCX_TLS", "(UCX default)")))
        out = []
        for k in range(1, ROUNDS + 1):
            for kind in ("kill", "stop"):
                for name in ("prefill", "decode", "router"):
                    if not ONLY or "%s-%s" % (kind, name) in ONLY:
                        out.append(one_fault(tmp, procs, kind, name, k))
        with open(os.path.join(tmp, "faults.json"), "w") as f:
            json.dump(out, f, indent=1)
        for p in reversed(procs):
            rc = p.terminate(30)
            check(rc == 0, "%s: SIGTERM exit %s" % (p.name, rc))

    pc.run_test("faults_load %s" % MODE, body, tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
