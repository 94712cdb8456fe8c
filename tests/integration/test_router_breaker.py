#!/usr/bin/env python3
"""test_router_breaker.py — the router's circuit breaker, retries and static+DNS dedupe against
real pdserve-prefill / pdserve-decode daemons on 127.0.0.1 (tiny model, UCX shared memory).

A prefill whose HTTP port is fine but whose bootstrap port refuses is the failure the router
cannot see from /health: decode's Pair with it fails and decode answers "KV transfer failed".
The test makes that happen for real: the router is given, as each prefill's bootstrap port, a
TCP gate (a forwarder in this process) in front of the prefill's real bootstrap port; a closed
gate listens on nothing (connection refused) and cuts the connections it forwarded.

  breaker   two prefills, B's gate closed: every client request (generate / completions,
            streamed and not) succeeds with pdserve-generate's text (retried on A); after
            --cb-failure-threshold failures no request goes to B (the router's per-worker
            counters), its circuit is open in /workers and sgl_router_cb_state; decode counted
            exactly those bootstrap failures. B's gate opens: after --cb-timeout-duration-secs it
            is half-open, serves again, closes after --cb-success-threshold successes. Both
            gates closed: the first request exhausts its attempts, then every request gets a
            503 naming the prefill role and the open breakers at once (no worker tried).
  disabled  the same broken B with --disable-circuit-breaker: every request succeeds (retried)
            and B keeps getting its round-robin share, as before the breaker existed.
  dedupe    prefill A given statically (with a trailing slash) and found again by DNS (a
            stdlib DNS server answering its address), plus a static B: /workers lists two
            prefills, and ten round-robin requests split 5/5; when the name leaves DNS (NXDOMAIN)
            the static A stays in rotation.

Hard checks only. Stdlib only. Usage: test_router_breaker.py BUILD_DIR CASE.
"""
import json
import os
import re
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dns_server  # noqa: E402
import pd_cluster as pc  # noqa: E402

BUILD = os.path.abspath(sys.argv[1])
CASE = sys.argv[2] if len(sys.argv) > 2 else "breaker"
MAX_NEW = 8
check, step = pc.check, pc.step
PROMPTS = ["the quick brown fox", "a lazy dog while seven wizards", "stars",
           "every jolly vexed bank clerk and the river"]


class Gate:
    """A TCP forwarder on its own port to 127.0.0.1:target. Closed: nothing listens there
    (connection refused) and every connection it forwarded is cut."""

    def __init__(self, target):
        self.port = pc.free_port()
        self.target = target
        self.lsock = None
        self.conns = []
        self.lock = threading.Lock()

    def open(self):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(64)
        self.lsock = s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def close(self):
        s, self.lsock = self.lsock, None
        if s:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        with self.lock:
            conns, self.conns = self.conns, []
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()

    def _accept(self, s):
        while True:
            try:
                c, _ = s.accept()
            except OSError:
                return
            try:
                u = socket.create_connection(("127.0.0.1", self.target), timeout=5)
                u.settimeout(None)
            except OSError:
                c.close()
                continue
            with self.lock:
                if self.lsock is not s:  # closed meanwhile
                    c.close()
                    u.close()
                    return
                self.conns += [c, u]
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a, b):
        try:
            while True:
                d = a.recv(65536)
                if not d:
                    break
                b.sendall(d)
        except OSError:
            pass
        for x in (a, b):
            try:
                x.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def one_request(rt, refs, i):
    """Request i (prompt, endpoint and streaming vary with i): None when it got the reference
    text, else what went wrong."""
    text = PROMPTS[i % len(PROMPTS)]
    gen = (i // len(PROMPTS)) % 2 == 0
    stream = i % 2 == 1
    rid = None
    if gen:
        path, body = "/generate", {"text": text, "stream": stream,
                                   "sampling_params": {"max_new_tokens": MAX_NEW,
                                                       "temperature": 0}}
        if i % 3 == 0:  # the client's own rid: a retry keeps it (and waits for its aborts)
            rid = body["rid"] = "client-%d-%d" % (os.getpid(), i)
    else:
        path, body = "/v1/completions", {"prompt": text, "max_tokens": MAX_NEW,
                                         "temperature": 0, "stream": stream}
    got, raw, err = pc.request_text(rt, "generate" if gen else "completions", body, stream)
    if err:
        return err
    if rid and not stream:
        mid = json.loads(raw).get("meta_info", {}).get("id")
        if mid != rid:
            return "/generate: meta_info.id %r, not the client's rid %r" % (mid, rid)
    if got != refs[text]:
        return "%s stream=%s: %r != reference %r" % (path, stream, got, refs[text])
    return None


def run_requests(rt, refs, start, n, what):
    for i in range(start, start + n):
        err = one_request(rt, refs, i)
        check(err is None, "%s: request %d: %s" % (what, i, err))


def metrics(rt):
    st, raw = rt.get("/metrics")
    if st != 200:
        raise OSError("/metrics answered %d" % st)
    return raw.decode()


def metric(text, name, **labels):
    """The value of the series name{labels...} (labels a subset), 0 when absent."""
    total = 0.0
    for line in text.split("\n"):
        m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$', line)
        if not m or m.group(1) != name:
            continue
        have = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
    return total


def workers(rt):
    st, raw = rt.get("/workers")
    if st != 200:
        raise OSError("/workers answered %d" % st)
    return json.loads(raw)


def worker(rt, url):
    for w in workers(rt)["workers"]:
        if w["url"] == url:
            return w
    return None


def start(model, tmp, gated_prefills, router_extra, name_b_closed=True):
    """Prefills A and B behind gates (A's open, B's closed unless told), one decode, the
    router. Returns (prefills, gates, decode, router)."""
    pfs = [pc.Daemon(BUILD, "prefill", model, tmp) for _ in range(gated_prefills)]
    dc = pc.Daemon(BUILD, "decode", model, tmp)
    gates = [Gate(p.bport) for p in pfs]
    for i, g in enumerate(gates):
        if i == 0 or not name_b_closed:
            g.open()
    rt = pc.Router(BUILD, [(p.port, g.port) for p, g in zip(pfs, gates)], [dc.port], tmp,
                   ["--retry-initial-backoff-ms", "10", "--retry-max-backoff-ms", "50"]
                   + pc.PD_PATH_ONLY + list(router_extra))
    check(pc.wait_until(lambda: all(w["healthy"] for w in workers(rt)["workers"]), 15),
          "all workers in rotation")
    return pfs, gates, dc, rt


def url(d):
    return "http://127.0.0.1:%d" % d.port


def case_breaker(model, tmp, refs):
    pfs, gates, dc, rt = start(model, tmp, 2, [
        "--cb-failure-threshold", "2", "--cb-success-threshold", "2",
        "--cb-timeout-duration-secs", "3"])
    a, b = url(pfs[0]), url(pfs[1])
    step("B's bootstrap port refuses: 12 requests")
    run_requests(rt, refs, 0, 12, "B broken")
    m = metrics(rt)
    nb = metric(m, "sgl_router_pd_prefill_requests_total", worker=b)
    check(nb == 2, "after %d failures no request goes to B (B got %s)" % (2, nb))
    check(metric(m, "sgl_router_cb_state", worker=b) == 1, "sgl_router_cb_state{B} == 1 (open)")
    check(metric(m, "sgl_router_cb_state", worker=a) == 0, "sgl_router_cb_state{A} == 0")
    check(metric(m, "sgl_router_cb_outcomes_total", worker=b, outcome="failure") == 2,
          "B: 2 failure outcomes")
    check(metric(m, "sgl_router_cb_state_transitions_total", worker=b, **{"from": "closed"},
                 to="open") == 1, "B: one closed -> open transition")
    check(metric(m, "sgl_router_cb_outcomes_total", worker=url(dc), outcome="failure") == 0,
          "decode's breaker is not charged for B's failures")
    check(metric(m, "sgl_router_retries_total") == 2, "two requests were retried on A (%s)" %
          metric(m, "sgl_router_retries_total"))
    t_asked = time.monotonic()
    wb = worker(rt, b)
    check(wb and wb["circuit_breaker"]["state"] == "open" and not wb["available"]
          and wb["healthy"], "/workers: B healthy but its circuit open: %s" % wb)
    remaining = (wb or {}).get("circuit_breaker", {}).get("open_remaining_secs", -1)
    check(0 < remaining <= 3, "B's circuit opens for at most --cb-timeout-duration-secs 3: %s"
          % remaining)
    dm = metrics(dc)
    check(metric(dm, "sglang:num_bootstrap_failed_reqs_total") == 2,
          "decode counted the 2 bootstrap failures (%s)" %
          metric(dm, "sglang:num_bootstrap_failed_reqs_total"))

    step("B's bootstrap port is back: half-open after the timeout, then closed")
    gates[1].open()
    # the router's clock said `remaining` at t_asked or later: half-open is seen no sooner
    # (a bound load cannot break); 60 s is only the failure bound of the wait
    half = pc.wait_until(lambda: worker(rt, b)["circuit_breaker"]["state"] == "half_open", 60)
    waited = time.monotonic() - t_asked
    check(half and waited >= remaining - 0.01,
          "B half-open once its %.2f s left of --cb-timeout-duration-secs ran out (seen after "
          "%.2f s)" % (remaining, waited))
    run_requests(rt, refs, 12, 8, "B recovered")
    m = metrics(rt)
    nb2 = metric(m, "sgl_router_pd_prefill_requests_total", worker=b)
    check(nb2 >= nb + 2, "B serves again (%s requests, was %s)" % (nb2, nb))
    check(metric(m, "sgl_router_cb_state", worker=b) == 0, "B closed again")
    check(metric(m, "sgl_router_cb_state_transitions_total", worker=b, **{"from": "half_open"},
                 to="closed") == 1, "B: one half_open -> closed transition")
    check(metric(m, "sgl_router_cb_outcomes_total", worker=b, outcome="success") >= 2,
          "B: successes counted")

    step("both bootstrap ports refuse: 503 naming the role, quickly")
    for g in gates:
        g.close()
    # each request charges each prefill at most once (its retries do not count again): within
    # two requests both circuits are open; every answer meanwhile is an error, never a hang.
    # Decode's pair with A is up: a Transfer goes over the pair's UCX endpoint, to A itself,
    # while decode's bootstrap connection through the gate still looks up to it; the request
    # that comes before decode has read that the gate cut it is served, and does not count.
    seen = []
    for _ in range(4):
        st, raw = rt.post("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 2}})
        seen.append((st, raw[:200]))
        if st == 503 and b"prefill" in raw:
            break
    errs = seen[1:] if seen and seen[0][0] == 200 else seen
    check(errs and len(errs) <= 2 and all(st >= 500 for st, _ in errs) and errs[-1][0] == 503,
          "both circuits open within two requests (one served over the pair first at most): "
          "%r" % seen)
    # answered at once means without trying a worker: no prefill request, no retry counted
    m = metrics(rt)
    tried = (metric(m, "sgl_router_pd_prefill_requests_total"),
             metric(m, "sgl_router_retries_total"))
    for i in range(3):
        t = time.time()
        st, raw = rt.post("/v1/completions", {"prompt": "x", "max_tokens": 2})
        dt = time.time() - t
        msg = json.loads(raw)["error"]["message"] if st == 503 else raw[:300]
        check(st == 503 and "prefill" in msg and "circuit breaker" in msg,
              "all prefills open: 503 naming the role and the breakers (%d, %.2f s, %r)" %
              (st, dt, msg))
    m = metrics(rt)
    now = (metric(m, "sgl_router_pd_prefill_requests_total"),
           metric(m, "sgl_router_retries_total"))
    check(now == tried, "all prefills open: no prefill tried, no retry (prefill requests, "
          "retries %s, were %s)" % (now, tried))
    states = [w["circuit_breaker"]["state"] for w in workers(rt)["workers"]
              if w["worker_type"] == "prefill"]
    check(states == ["open", "open"], "/workers: both prefills open: %s" % states)
    check(rt.terminate() == 0, "router exits 0 on SIGTERM")


def case_disabled(model, tmp, refs):
    pfs, gates, dc, rt = start(model, tmp, 2, ["--disable-circuit-breaker",
                                                "--cb-failure-threshold", "1"])
    b = url(pfs[1])
    step("--disable-circuit-breaker: B's bootstrap refuses, 10 requests")
    run_requests(rt, refs, 0, 10, "breaker disabled")
    m = metrics(rt)
    nb = metric(m, "sgl_router_pd_prefill_requests_total", worker=b)
    check(nb >= 4, "B keeps getting its round-robin share (%s of 10)" % nb)
    check(metric(m, "sgl_router_cb_state", worker=b) == 0, "no breaker state")
    check(metric(m, "sgl_router_retries_total") == nb, "each of B's requests was retried")
    wb = worker(rt, b)
    check(wb and wb["circuit_breaker"]["state"] == "disabled" and wb["available"],
          "/workers: breaker disabled, B available: %s" % wb)
    step("4 concurrent clients x 5 requests, B still refusing")

    def client(k):
        return [one_request(rt, refs, 100 + 5 * k + j) for j in range(5)]

    res = pc.concurrent(client, 4, 120)
    errs = [e for r in res for e in (r if isinstance(r, list) else [r or "no answer"]) if e]
    check(not errs, "concurrent requests all succeed: %s" % errs[:3])
    m2 = metrics(rt)
    nb2 = metric(m2, "sgl_router_pd_prefill_requests_total", worker=b)
    check(nb2 - nb >= 6, "B still gets its share under concurrency (%s of 20)" % (nb2 - nb))
    check(metric(m2, "sgl_router_retries_total") == nb2, "each of B's requests was retried")
    check(rt.terminate() == 0, "router exits 0 on SIGTERM")


def case_dedupe(model, tmp, refs):
    pa = pc.Daemon(BUILD, "prefill", model, tmp)
    pb = pc.Daemon(BUILD, "prefill", model, tmp)
    dc = pc.Daemon(BUILD, "decode", model, tmp)
    dns = dns_server.DnsServer()
    dns.set("pf.test", ["127.0.0.1"])
    port = pc.free_port()
    args = [os.path.join(BUILD, "router", "pdserve-router"), "--pd-disaggregation",
            "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin",
            "--health-check-interval-secs", "0.25", "--dns-refresh-secs", "0.2",
            "--dns-server", "127.0.0.1:%d" % dns.port,
            "--prefill", "http://127.0.0.1:%d/" % pa.port, str(pa.bport),
            "--prefill", "http://127.0.0.1:%d" % pb.port, str(pb.bport),
            "--prefill-dns", "pf.test:%d:%d" % (pa.port, pa.bport),
            "--decode", url(dc)] + pc.PD_PATH_ONLY  # counts the prefills' requests
    rt = pc.Proc("router", args, port, tmp)
    step("static + DNS: one entry")
    check(pc.wait_until(lambda: dns.queries.get("pf.test", 0) >= 3, 10),
          "the name was resolved (and re-resolved)")
    w = workers(rt)
    pre = [x for x in w["workers"] if x["worker_type"] == "prefill"]
    check(len(pre) == 2 and w["stats"]["prefill_count"] == 2,
          "/workers: two prefills, not three: %s" % [x["url"] for x in pre])
    check(all(x["source"] == "static" for x in pre), "the static entry wins: %s" %
          [(x["url"], x["source"]) for x in pre])
    check(w["dns"][0]["state"] == "answered", "the name answered: %s" % w["dns"])
    st, raw = rt.get("/list_workers")
    check(st == 200 and len(json.loads(raw)["urls"]) == 3, "/list_workers: 3 urls: %r" % raw)
    check(pc.wait_until(lambda: all(x["healthy"] for x in workers(rt)["workers"]), 10),
          "all in rotation")
    run_requests(rt, refs, 0, 10, "dedupe")
    m = metrics(rt)
    na = metric(m, "sgl_router_pd_prefill_requests_total", worker=url(pa))
    nb = metric(m, "sgl_router_pd_prefill_requests_total", worker=url(pb))
    check(na == 5 and nb == 5, "round robin splits 5/5 (A %s, B %s)" % (na, nb))
    step("the name leaves DNS: the static worker stays")
    q = dns.queries.get("pf.test", 0)
    dns.remove("pf.test")
    check(pc.wait_until(lambda: dns.queries.get("pf.test", 0) >= q + 3, 10), "re-resolved")
    check(pc.wait_until(lambda: workers(rt)["dns"][0]["state"] == "empty", 5), "name empty")
    wa = worker(rt, url(pa))
    check(wa is not None and wa["healthy"] and wa["state"] == "healthy",
          "static A still listed and in rotation: %s" % wa)
    run_requests(rt, refs, 10, 4, "after NXDOMAIN")
    m = metrics(rt)
    check(metric(m, "sgl_router_pd_prefill_requests_total", worker=url(pa)) == na + 2,
          "A still gets its share")
    check(rt.terminate() == 0, "router exits 0 on SIGTERM")
    dns.stop()


def main():
    tmp = pc.tmpdir()

    def cases():
        model = pc.make_model(BUILD, tmp)
        refs = {t: pc.generate(BUILD, model, t, MAX_NEW, timeout=60) for t in PROMPTS}
        {"breaker": case_breaker, "disabled": case_disabled, "dedupe": case_dedupe}[CASE](
            model, tmp, refs)

    pc.run_test("router_breaker %s" % CASE, cases, tmp, log_tail=3000)


if __name__ == "__main__":
    main()
