#!/usr/bin/env python3
"""test_router_dns.py — router discovery by DNS (--prefill-dns / --decode-dns) while requests
flow, against real daemons and a DNS server whose answers the test changes (dns_server.py).

Workers sit on different loopback addresses with the same ports, as pods behind a Kubernetes
headless service do (Linux routes all of 127.0.0.0/8 to lo): prefills on 127.0.0.2 and 127.0.0.1
at one HTTP port and one bootstrap port, decodes on 127.0.0.3 and 127.0.0.1 at another port.
The router starts with --dns-server pointing at the test's server, --dns-refresh-secs 1, and
only the A pair (plus ::1 for the prefill name, where nothing listens: listed, never in
rotation). Three clients send a steady stream of greedy requests (/generate and
/v1/completions, streamed and not), each checked against pdserve-generate's text.

  add      B's addresses join the answers: both B workers enter rotation and take requests;
           then B leaves them while requests flow and is removed once idle.
  drain    decode A is SIGSTOPped, so every client's request sits on the A pair; B returns
           and A leaves the answers: /workers shows both A workers draining with requests in
           flight (a brief return to the answer revives one, listed once), new requests are
           served by B and none reaches A; after SIGCONT A's requests finish correctly, the
           A workers leave /workers, and only then are they killed.
  failures SERVFAIL keeps the current workers (logged once); NXDOMAIN drains a name (/health
           503), its return brings the workers back.
  silent   a third name never answers: its lookups time out in a pool thread while all of the
           above is served, and SIGTERM still ends the router within seconds.
  ipv6     a name answering 127.0.0.1 and ::1 with --dns-family ipv6: only the ::1 pair (real
           daemons on ::1) is used and serves, bootstrap over IPv6 (skipped without ::1).
  localhost  a second router with the system resolver and localhost:PORT names (the Helm
           chart's local test) serves through the B pair on 127.0.0.1.

Hard checks: no request fails, every output equals the reference, both routers exit 0 on
SIGTERM. Stdlib only. Usage: test_router_dns.py BUILD_DIR.
"""
import json
import os
import signal
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dns_server  # noqa: E402
import pd_cluster as pc  # noqa: E402
from pd_cluster import FAILS, check, step, text_of  # noqa: E402

BUILD = os.path.abspath(sys.argv[1])
MAX_NEW = 12
CLIENTS = []

PROMPTS = ["the quick brown fox", "a lazy dog while seven wizards",
           "every jolly vexed bank clerk and the river", "stars",
           "the river runs to the sea under stars and the quick brown fox jumps over",
           "quietly hex", "seven wizards quietly hex every jolly vexed bank clerk", "under"]


def reference(model, text):
    return pc.generate(BUILD, model, text, MAX_NEW, timeout=60)


def port_free_on(addrs):
    """A TCP port nobody listens on at any of addrs."""
    for _ in range(100):
        p = pc.free_port()
        socks = []
        try:
            for a in addrs:
                s = socket.socket(socket.AF_INET6 if ":" in a else socket.AF_INET)
                socks.append(s)
                s.bind((a, p))
            return p
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no common free port on %s" % addrs)


def ipv6_loopback():
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def body_of(kind, text, stream):
    if kind == "generate":
        return "/generate", {"text": text, "stream": stream,
                             "sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0}}
    return "/v1/completions", {"prompt": text, "max_tokens": MAX_NEW, "temperature": 0,
                               "stream": stream}


def one_request(rt, refs, i):
    """Request number i (prompt, endpoint and streaming vary with i), checked against refs;
    None when right, else what went wrong."""
    k = i % len(PROMPTS)
    kind = ("generate", "completions")[(i // len(PROMPTS)) % 2]
    stream = (i // 2) % 2 == 0
    path, body = body_of(kind, PROMPTS[k], stream)
    got, _, err = pc.request_text(rt, kind, body, stream)
    if err:
        return err
    if got != refs[k]:
        return "%s stream=%s prompt %d: %r != reference %r" % (path, stream, k, got,
                                                               refs[k])
    return None


class Clients:
    """n threads sending requests in turn until stop(); every answer is checked."""

    def __init__(self, rt, refs, n=3):
        self.rt, self.refs = rt, refs
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.done, self.errors = 0, []
        self.threads = [threading.Thread(target=self.run, args=(i, n), daemon=True)
                        for i in range(n)]
        CLIENTS.append(self)
        for t in self.threads:
            t.start()

    def run(self, i, n):
        while not self.stopping.is_set():
            err = one_request(self.rt, self.refs, i)
            with self.lock:
                self.done += 1
                if err:
                    self.errors.append(err)
                    if len(self.errors) <= 20:
                        print("request failed:", err, flush=True)
            if err:
                time.sleep(0.05)  # a broken router must not make this spin
            i += n

    def count(self):
        with self.lock:
            return self.done

    def stop(self):
        self.stopping.set()
        for t in self.threads:
            t.join(90)


def workers(rt):
    st, raw = rt.get("/workers")
    if st != 200:
        raise OSError("/workers answered %d" % st)
    return {w["url"]: w for w in json.loads(raw)["workers"]}


def log_count(proc, needle):
    with open(proc.log_path, errors="replace") as f:
        return f.read().count(needle)


def main():
    tmp = pc.tmpdir()
    model = pc.make_model(BUILD, tmp)
    refs = [reference(model, t) for t in PROMPTS]
    P = port_free_on(["127.0.0.1", "127.0.0.2"])
    BP = port_free_on(["127.0.0.1", "127.0.0.2"])
    D = port_free_on(["127.0.0.1", "127.0.0.3"])
    step("ports: prefill %d bootstrap %d decode %d" % (P, BP, D))
    pa = pc.Daemon(BUILD, "prefill", model, tmp, port=P, bport=BP, host="127.0.0.2",
                   wait_ready=False)
    pb = pc.Daemon(BUILD, "prefill", model, tmp, port=P, bport=BP, host="127.0.0.1",
                   wait_ready=False)
    da = pc.Daemon(BUILD, "decode", model, tmp, port=D, host="127.0.0.3", wait_ready=False)
    db = pc.Daemon(BUILD, "decode", model, tmp, port=D, host="127.0.0.1", wait_ready=False)
    for d in (pa, pb, da, db):
        d.wait_ready(60)
    step("four daemons up")

    dns = dns_server.DnsServer()
    dns.set("pf.test", ["127.0.0.2", "::1"])
    dns.set("dc.test", ["127.0.0.3"])
    dns.silent("silent.test")  # every lookup of it times out in the router's pool thread
    url_pa, url_pb = "http://127.0.0.2:%d" % P, "http://127.0.0.1:%d" % P
    url_da, url_db = "http://127.0.0.3:%d" % D, "http://127.0.0.1:%d" % D
    url_v6 = "http://[::1]:%d" % P
    rport = pc.free_port()
    rt = pc.Proc("router", [
        os.path.join(BUILD, "router", "pdserve-router"), "--pd-disaggregation", "--host",
        "127.0.0.1", "--port", str(rport), "--policy", "round_robin",
        "--health-check-interval-secs", "5", "--log-level",
        os.environ.get("PD_TEST_LOG_LEVEL", "info"),
        "--prefill-dns", "pf.test:%d:%d" % (P, BP), "--decode-dns", "dc.test:%d" % D,
        "--decode-dns", "silent.test:%d" % D, "--dns-server", "127.0.0.1:%d" % dns.port,
        "--dns-refresh-secs", "1"] + pc.PD_PATH_ONLY, rport, tmp)  # counts pairs' requests
    w = workers(rt)
    step("router up through DNS: %s" % sorted(w))
    check(set(w) == {url_pa, url_v6, url_da}, "first answer: A pair and ::1 listed (%s)" % list(w))
    check(w[url_pa]["source"] == "dns" and w[url_pa]["bootstrap_port"] == BP,
          "a DNS prefill carries its bootstrap port: %s" % w[url_pa])
    check(dns.count("pf.test") >= 1, "the router asked the test's DNS server")

    cl = Clients(rt, refs)
    pc.wait_until(lambda: cl.count() >= 10, 30)
    step("steady traffic: %d requests" % cl.count())

    # ---- add: B joins the answers and takes traffic
    dns.set("pf.test", ["127.0.0.2", "127.0.0.1", "::1"])
    dns.set("dc.test", ["127.0.0.3", "127.0.0.1"])

    def b_serving():
        w = workers(rt)
        return all(u in w and w[u]["state"] == "healthy" and w[u]["requests_total"] > 0
                   for u in (url_pb, url_db))

    check(pc.wait_until(b_serving, 20), "B prefill and decode joined and took requests")
    w = workers(rt)
    step("B serving: %s" % {u: w[u]["requests_total"] for u in w})

    # ---- B leaves the answers while requests flow: whatever runs on it finishes, then it is
    # removed (its processes stay up)
    dns.set("pf.test", ["127.0.0.2", "::1"])
    dns.set("dc.test", ["127.0.0.3"])
    check(pc.wait_until(lambda: url_pb not in workers(rt) and url_db not in workers(rt), 20),
          "B removed after leaving the answers")
    n = cl.count()
    check(pc.wait_until(lambda: cl.count() >= n + 20, 30), "served by A after B left")
    step("B removed; %d requests so far" % cl.count())

    # ---- drain with requests held: decode A stops, so every client's request sits on the
    # A pair (the only one); then B returns and A leaves the answers. (A stopped decode is
    # safe to hold: decode calls the prefill's bootstrap, never the other way round.)
    da.p.send_signal(signal.SIGSTOP)
    # The clients' requests may all be past their prefill when decode stops (prefill answers
    # once the KV cache went over, decode then generates; under load that is the longer part),
    # leaving nothing on prefill A. One more request now certainly holds both A workers: prefill
    # A waits for the stopped decode to fetch the cache.
    held_answer = []
    held_client = threading.Thread(target=lambda: held_answer.append(one_request(rt, refs, 1)),
                                   daemon=True)
    held_client.start()

    def a_held():
        w = workers(rt)
        return w[url_pa]["router_inflight"] > 0 and w[url_da]["router_inflight"] > 0

    check(pc.wait_until(a_held, 10), "requests sit on the A pair while its decode is stopped")
    dns.set("pf.test", ["127.0.0.1", "::1"])
    dns.set("dc.test", ["127.0.0.1"])

    def a_draining():
        w = workers(rt)
        return all(w.get(u, {}).get("state") == "draining" for u in (url_pa, url_da))

    check(pc.wait_until(a_draining, 10), "A pair draining once gone from the answers")
    w = workers(rt)
    held = {u: (w[u]["router_inflight"], w[u]["requests_total"]) for u in (url_pa, url_da)}
    step("A draining (in flight, total): %s" % held)
    check(all(v[0] > 0 for v in held.values()), "draining with requests in flight: %s" % held)
    # back in the answer while draining: revived and re-checked, listed once; gone: draining
    dns.set("pf.test", ["127.0.0.2", "127.0.0.1", "::1"])
    check(pc.wait_until(lambda: workers(rt)[url_pa]["state"] != "draining", 10),
          "a returning draining worker is revived")
    st, raw = rt.get("/list_workers")
    check(json.loads(raw)["urls"].count(url_pa) == 1, "a revived worker is listed once")
    dns.set("pf.test", ["127.0.0.1", "::1"])
    check(pc.wait_until(a_draining, 10), "and drains again when it leaves")
    # the clients all wait on A; new requests are served by B alone meanwhile
    for i in range(6):
        err = one_request(rt, refs, i)
        check(err is None, "served by B while A drains: %s" % err)
    w = workers(rt)
    check(all(w[u]["state"] == "draining" and w[u]["requests_total"] == held[u][1]
              for u in (url_pa, url_da)),
          "no new request reached a draining worker: %s" % {u: w.get(u) for u in held})
    check(w[url_pb]["requests_total"] > 0 and w[url_db]["requests_total"] > 0,
          "B took the new requests: %s" % {u: w[u]["requests_total"] for u in w})
    da.p.send_signal(signal.SIGCONT)
    held_client.join(60)
    check(held_answer == [None], "the request held on A finished right: %s" % held_answer)
    check(pc.wait_until(lambda: url_pa not in workers(rt) and url_da not in workers(rt), 20),
          "A pair removed once its requests finished")
    check(log_count(rt, "drained: removed") >= 2, "router logged both drains")
    step("A removed; killing it")
    for d in (pa, da):
        d.kill()
    n = cl.count()
    pc.wait_until(lambda: cl.count() >= n + 10, 30)
    cl.stop()
    step("clients: %d requests, %d failed" % (cl.done, len(cl.errors)))
    check(not cl.errors, "no request failed or differed (%d): %s" % (len(cl.errors),
                                                                       cl.errors[:3]))
    w = workers(rt)
    check(w[url_v6]["state"] == "unhealthy" and w[url_v6]["requests_total"] == 0,
          "::1, where nothing listens, never took a request: %s" % w[url_v6])

    # ---- failures: SERVFAIL keeps the set, logged once; NXDOMAIN drains; return restores
    def lookups(name):
        st, raw = rt.get("/workers")
        return {d["name"]: d for d in json.loads(raw)["dns"]}[name]["lookups"]

    # three refreshes that all fail (the first may have started before the failure)
    dns.fail("pf.test")
    n0 = lookups("pf.test")
    pc.wait_until(lambda: lookups("pf.test") >= n0 + 4, 30)
    check(lookups("pf.test") >= n0 + 4, "pf.test: four more lookups within 30 s (%d -> %d)" %
          (n0, lookups("pf.test")))
    w = workers(rt)
    check(url_pb in w and w[url_pb]["state"] == "healthy", "SERVFAIL keeps the workers")
    check(log_count(rt, "dns pf.test (--prefill-dns): lookup failed") == 1,
          "a failing lookup is logged once, not on every refresh")
    st, raw = rt.get("/workers")
    names = {d["name"]: d for d in json.loads(raw)["dns"]}
    check(names["pf.test"]["state"] == "failed", "/workers shows the failing name: %s" % names)
    dns.fail("pf.test", False)
    dns.remove("dc.test")
    check(pc.wait_until(lambda: url_db not in workers(rt), 10), "NXDOMAIN drains the name")
    check(rt.get("/health")[0] == 503, "no decode worker: router /health 503")
    st, raw = rt.post("/generate", body_of("generate", PROMPTS[0], False)[1])
    check(st == 503, "no decode worker: requests get 503 (got %d)" % st)
    check(log_count(rt, "dns dc.test (--decode-dns): no addresses") == 1, "empty answer logged")
    dns.set("dc.test", ["127.0.0.1"])
    check(pc.wait_until(lambda: rt.get("/health")[0] == 200, 10), "decode back after NXDOMAIN")
    st, raw = rt.post("/generate", body_of("generate", PROMPTS[1], False)[1])
    check(st == 200 and json.loads(raw)["text"] == refs[1], "served again after NXDOMAIN")

    # ---- localhost names through the system resolver (the chart's local test)
    rt2 = pc.Router(BUILD, [], [], tmp, extra=[
        "--prefill-dns", "localhost:%d:%d" % (P, BP), "--decode-dns", "localhost:%d" % D,
        "--dns-refresh-secs", "1"])
    for k, stream in ((2, True), (3, False)):
        path, body = body_of("completions", PROMPTS[k], stream)
        st, raw = rt2.post(path, body)
        check(st == 200 and text_of("completions", stream, raw) == refs[k],
              "localhost router: %s stream=%s" % (path, stream))
    w2 = workers(rt2)
    step("localhost router workers: %s" % {u: v["state"] for u, v in w2.items()})
    check(w2[url_pb]["state"] == "healthy" and w2[url_db]["state"] == "healthy",
          "localhost resolved to the 127.0.0.1 workers")

    # ---- IPv6: a name answering both families with --dns-family ipv6 gives only the ::1
    # workers; their URLs carry brackets and decode pairs with the prefill's bootstrap at ::1
    if ipv6_loopback():
        P6 = port_free_on(["::1"])
        BP6 = port_free_on(["::1"])
        D6 = port_free_on(["::1"])
        p6 = pc.Daemon(BUILD, "prefill", model, tmp, port=P6, bport=BP6, host="::1",
                       wait_ready=False)
        d6 = pc.Daemon(BUILD, "decode", model, tmp, port=D6, host="::1", wait_ready=False)
        for d in (p6, d6):
            d.wait_ready(60)
        dns.set("both.test", ["127.0.0.1", "::1"])
        rport3 = pc.free_port()
        rt3 = pc.Proc("router", [
            os.path.join(BUILD, "router", "pdserve-router"), "--pd-disaggregation", "--host",
            "127.0.0.1", "--port", str(rport3), "--prefill-dns",
            "both.test:%d:%d" % (P6, BP6), "--decode-dns", "both.test:%d" % D6,
            "--dns-server", "127.0.0.1:%d" % dns.port, "--dns-family", "ipv6"] + pc.PD_PATH_ONLY,
            rport3, tmp)  # the pair meets at the prefill's ::1 bootstrap
        for k, stream in ((4, True), (5, False)):
            path, body = body_of("generate", PROMPTS[k], stream)
            st, raw = rt3.post(path, body)
            check(st == 200 and text_of("generate", stream, raw) == refs[k],
                  "IPv6 pair through DNS: %s stream=%s (%d %s)" % (path, stream, st, raw[:200]))
        w3 = workers(rt3)
        check(set(w3) == {"http://[::1]:%d" % P6, "http://[::1]:%d" % D6},
              "--dns-family ipv6 keeps only the ::1 addresses: %s" % list(w3))
        check(rt3.terminate(30) == 0, "IPv6 router exits 0")
    else:
        check(False, "the IPv6 phase needs an IPv6 loopback (::1), which this machine lacks: the "
              "test does not pass with a phase left out")

    # a name whose lookups never answer held a pool thread all along without stalling the
    # loop (everything above was served); it is listed as failed and costs no worker
    st, raw = rt.get("/workers")
    names = {d["name"]: d for d in json.loads(raw)["dns"]}
    check(names["silent.test"]["state"] == "failed" and dns.count("silent.test") >= 2,
          "an unanswered name: lookups time out and are retried: %s" % names["silent.test"])
    for r in (rt2, rt):
        t = time.time()
        rc = r.terminate(30)
        check(rc == 0, "router exits 0 on SIGTERM (got %s)" % rc)
        check(time.time() - t < 10, "router exits within 10 s with a lookup pending (%.1f s)" %
              (time.time() - t))
    dns.stop()


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - report, then fail
        FAILS.append("exception: %r" % e)
        import traceback
        traceback.print_exc()
    finally:
        for c in CLIENTS:
            c.stopping.set()
        pc.kill_all()
    step("%s: %d failures" % ("FAIL" if FAILS else "PASS", len(FAILS)))
    for f in FAILS:
        print("  -", f)
    sys.exit(1 if FAILS else 0)
