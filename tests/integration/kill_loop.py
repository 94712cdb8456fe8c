#!/usr/bin/env python3
"""kill_loop.py — repeated SIGKILLs of pdserve-decode mid-request against a surviving
pdserve-prefill (and a router in front of both), to catch the prefill's loop thread getting
stuck inside UCX after a peer dies (seen on an older transfer engine over shared memory at the
4th and 11th kill of such a loop).

Each iteration: 10 requests through the router (streaming and not, long enough to be mid-flight),
SIGKILL of decode in turn once it runs one, once prefill has KV pages in flight, or a few ms
after the requests start, then
  - prefill answers GET /health within 5 s,
  - prefill's page pool is back to full (no page used, no live request) within 15 s,
  - decode restarts on its ports, the router sees it healthy and one request is served.
A prefill that does not answer /health gets `gdb -p PID -batch -ex 'thread apply all bt'`
(printed), and the run fails.

The transport is whatever UCX_TLS says (CTest sets it; by hand: UCX_TLS=posix,cma
UCX_MM_ERROR_HANDLING=y UCX_POSIX_ERROR_HANDLING=y, or UCX_TLS=tcp UCX_NET_DEVICES=lo).

Stdlib only. Usage: kill_loop.py BUILD_DIR [ITERATIONS]. Every process is killed (by PID) on
exit; every wait is bounded.
"""
import http.client
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pd_cluster as pc  # noqa: E402
from pd_cluster import step as log  # noqa: E402

BUILD = os.path.abspath(sys.argv[1])
ITERS = int(sys.argv[2]) if len(sys.argv) > 2 else 30
NCLIENTS = 10
WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly hex "
         "every jolly vexed bank clerk and the river runs to the sea under stars").split()


def client(rt, i, it, out):
    """One request through the router; records whether it ended (answer or error)."""
    if i % 2:  # ~1400 tokens, ~90 pages: transfers still going at the kill
        prompt = " ".join(WORDS[(i + it + k) % len(WORDS)] for k in range(600))
        sp = {"max_new_tokens": 300, "temperature": 0, "ignore_eos": True}
    else:
        prompt = "victim %d of round %d" % (i, it)
        sp = {"max_new_tokens": 1500, "temperature": 0, "ignore_eos": True}
    stream = i % 3 != 2
    body = json.dumps({"text": prompt, "stream": stream, "sampling_params": sp}).encode()
    c = http.client.HTTPConnection("127.0.0.1", rt.port, timeout=60)
    try:
        c.request("POST", "/generate", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        r.read()
        out[i] = ("ended", r.status)
    except (OSError, http.client.HTTPException) as e:
        out[i] = ("exc", repr(e))
    finally:
        c.close()


HEALTH_S = 5.0  # prefill's /health answers within this many seconds of the decode SIGKILL


def main():
    tls = os.environ.get("UCX_TLS", "(UCX default)")
    tmp = pc.tmpdir()
    model = pc.make_model(BUILD, tmp, ["--family", "llama", "--shape", "tiny"])
    fails = []
    done = 0
    try:
        pf, dc, rt = pc.start_cluster(BUILD, tmp, model, router_extra=pc.PD_PATH_ONLY)
        log("kill loop: %d iterations, UCX_TLS=%s, prefill pid %d" % (ITERS, tls, pf.p.pid))
        for it in range(1, ITERS + 1):
            out = {}
            ts = [threading.Thread(target=client, args=(rt, i, it, out), daemon=True)
                  for i in range(NCLIENTS)]
            for t in ts:
                t.start()
            # the kill lands in different phases: decoding, KV pages in flight, very early
            phase = ("running", "transfer", "early")[it % 3]
            if phase == "running":
                ran = pc.wait_until(lambda: dc.server_info()["queues"]["running"] >= 1, 20, 0.005)
                time.sleep((it % 5) * 0.02)
            elif phase == "transfer":
                ran = pc.wait_until(lambda: pf.server_info()["queues"]["inflight"] >= 1, 20,
                                    0.002)
            else:
                time.sleep(0.005 * (it % 7))
                ran = True
            t_kill = time.time()  # the bounds below are measured from here
            dc.kill()
            # the prefill answers /health while its peer's death is being handled, within
            # HEALTH_S of the kill (the clients may still be ending meanwhile)
            alive = pf.health_by(t_kill + HEALTH_S)
            t_health = time.time()
            if not alive:
                fails.append("iteration %d: prefill did not answer /health within %g s of the "
                             "decode SIGKILL" % (it, HEALTH_S))
                log(fails[-1] + "; stacks:\n" + pf.stacks())
                break
            for t in ts:
                t.join(max(0.0, t_kill + 40 - time.time()))
            silent = [i for i in range(NCLIENTS) if i not in out]
            if silent:
                fails.append("iteration %d: clients %s got no answer within 40 s of the kill" %
                             (it, silent))
            t_joined = time.time()
            if not pf.pool_full(15):
                fails.append("iteration %d: prefill pool not back to full" % it)
                log(fails[-1] + "; stacks:\n" + pf.stacks())
                break
            t_pool = time.time()
            dc.start(60)
            t_up = time.time()
            healthy = pc.wait_until(lambda: rt.get("/health", timeout=5)[0] == 200, 30, 0.1)
            t_healthy = time.time()
            tries = []
            served = healthy and pc.wait_until(lambda: tries.append(1) or pc.serves(rt), 20, 0.1)
            if not served:
                fails.append("iteration %d: not served after the decode restart "
                             "(router healthy: %s)" % (it, bool(healthy)))
                log(fails[-1] + "; prefill stacks:\n" + pf.stacks())
                break
            done = it
            log("iteration %d ok: kill at %s (%s); s after the kill: clients done %.2f, prefill "
                "/health %.2f, pool full %.2f, decode up %.2f, router healthy %.2f, served %.2f "
                "(%d tries); statuses %s" %
                (it, phase, "hit" if ran else "missed", t_joined - t_kill, t_health - t_kill,
                 t_pool - t_kill, t_up - t_kill, t_healthy - t_kill, time.time() - t_kill,
                 len(tries), sorted(str(v[1])[:40] for v in out.values())))
        if not fails:
            for proc in (rt, dc, pf):
                rc = proc.terminate(30)
                if rc != 0:
                    fails.append("%s SIGTERM exit %s" % (proc.name, rc))
    except Exception as e:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        fails.append("exception: %r" % e)
    finally:
        pc.kill_all()
    if fails:
        print("kill_loop (%s): FAIL after %d/%d iterations (%.1f s): %s; logs in %s" %
              (tls, done, ITERS, time.time() - pc.T0, fails, tmp))
        pc.dump_logs(tmp)
        sys.exit(1)
    print("kill_loop (%s): PASS, %d decode kills (%.1f s)" % (tls, ITERS, time.time() - pc.T0))


if __name__ == "__main__":
    main()
