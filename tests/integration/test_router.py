#!/usr/bin/env python3
"""pdserve-router end to end: the real router binary on 127.0.0.1 in front of fake workers
(tests/integration/fake_worker.py, a test fixture) on ephemeral ports.

Checks what a user or operator would notice: routing and SSE pass-through byte for byte, the
bootstrap fields identical in the prefill and decode copies, prefill failure -> decode aborted +
502, client disconnect -> both aborted, unreachable worker -> retried once on another pair and
out of rotation, health recovery, timeout -> 504, 429 over --max-concurrent-requests, 401 without
the API key, clean SIGTERM exit without sanitizer reports; limits: 429 with Retry-After over
--max-concurrent-requests-per-client (per client address, the slot back when a client leaves),
400 over --max-n, 431 for 70 kB of headers, 413 for a body over 8 MiB; backpressure (a client that stops
reading: the router pauses decode and holds at most --stream-buffer-bytes, then every byte
arrives); graceful SIGTERM (no new connections, a stream in flight completes, exit 0 as soon as
it did) and its deadline (what is still running gets an error event and is aborted on both
workers).
Usage: test_router.py PDSERVE_ROUTER_BINARY
"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pd_cluster as pc  # noqa: E402  (its request helpers only; this test has its own checks)

ROUTER = sys.argv[1]
FAILURES = []
PROCS = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL: " + what, flush=True)
    return cond


class Fake:
    def __init__(self, role, port=0, api_key=None):
        self.role = role
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "fake_worker.py"),
                                      "--role", role, "--port", str(port)]
                                     + (["--api-key", api_key] if api_key else []),
                                     stdout=subprocess.PIPE, text=True)
        PROCS.append(self.proc)
        line = self.proc.stdout.readline()
        self.port = int(line.split()[1])
        self.url = "http://127.0.0.1:%d" % self.port

    def call(self, method, path, body=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        c.request(method, path, body=json.dumps(body) if body is not None else None)
        r = c.getresponse()
        data = r.read()
        c.close()
        return json.loads(data) if data else None

    def log(self):
        return self.call("GET", "/_fake/log")

    def config(self, **kw):
        self.call("POST", "/_fake/config", kw)

    def kill(self):
        self.proc.kill()
        self.proc.wait()


class Router:
    def __init__(self, args):
        self.proc = subprocess.Popen([ROUTER, "--port", "0", "--host", "127.0.0.1"] + args,
                                     stderr=subprocess.PIPE, text=True)
        PROCS.append(self.proc)
        self.lines = []
        self.port = None
        ready = threading.Event()

        def pump():
            for line in self.proc.stderr:
                self.lines.append(line)
                m = re.search(r"listening on http://[^:]+:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
                    ready.set()
            ready.set()

        self.pump = threading.Thread(target=pump, daemon=True)
        self.pump.start()
        if not ready.wait(10) or not self.port:
            raise RuntimeError("router did not start:\n" + "".join(self.lines))

    def request(self, method, path, body=None, headers=None, timeout=15):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request(method, path, body=json.dumps(body) if isinstance(body, dict) else body,
                  headers=h)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, r.getheader("Content-Type") or "", data

    def wait_healthy(self, want=200, timeout=10):
        end = time.time() + timeout
        while time.time() < end:
            if self.request("GET", "/health")[0] == want:
                return True
            time.sleep(0.05)
        return False

    def info(self, headers=None):
        return json.loads(self.request("GET", "/server_info", headers=headers)[2])

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        return self.wait_exit()

    def wait_exit(self, timeout=30):
        """The exit code (or "hung", and a SIGKILL, when it has not exited within timeout s);
        checks it is 0 and the log is free of sanitizer reports."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = "hung"
        self.pump.join(10)  # the pump has read every line once stderr reached its end
        log = "".join(self.lines)
        if FAILURES or os.environ.get("PD_TEST_VERBOSE"):
            print("---- router log\n" + log[-6000:], flush=True)
        check(rc == 0, "router exits 0 on SIGTERM (got %s)" % rc)
        check("Sanitizer" not in log and "runtime error" not in log,
              "router stderr free of sanitizer reports:\n" + log[-4000:])
        return rc


def wait_for(pred, timeout=5):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


def bodies(fake, rid):
    return [r["body"] for r in fake.log()["requests"] if r["body"].get("rid") == rid]


def test_routing_and_streaming(router, prefills, decodes):
    # streamed /generate: the client gets decode's bytes exactly
    st, ct, data = router.request("POST", "/generate", {"text": "hi", "stream": True,
                                                        "rid": "s1", "sampling_params": {}})
    check(st == 200 and ct.startswith("text/event-stream"), "stream: 200 event-stream")
    # the fake records what it sent after its last write, which races with our read
    wait_for(lambda: any(d.log()["sent"].get("s1") for d in decodes))
    sent = [d.log()["sent"].get("s1") for d in decodes]
    sent = [s for s in sent if s]
    check(len(sent) == 1 and data.decode() == sent[0],
          "stream passes through byte-exact: %r vs %r" % (data[:200], sent[:1]))
    check(data.decode().endswith("data: [DONE]\n\n"), "stream ends with [DONE]")
    # the same bootstrap fields in both copies
    pb = [b for p in prefills for b in bodies(p, "s1")]
    db = [b for d in decodes for b in bodies(d, "s1")]
    check(len(pb) == 1 and len(db) == 1, "one prefill copy and one decode copy")
    if pb and db:
        for k in ("bootstrap_host", "bootstrap_port", "bootstrap_room", "text", "stream"):
            check(pb[0].get(k) == db[0].get(k), "field %s equal in both copies" % k)
        check(pb[0]["bootstrap_host"] == "127.0.0.1", "bootstrap_host is the prefill's host")
        room = pb[0]["bootstrap_room"]
        check(isinstance(room, int) and 0 <= room < 2 ** 63, "room in [0, 2^63)")

    # no rid from the client: rid = room; round robin spreads over both prefills; ports
    for i in range(4):
        st, ct, data = router.request("POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "q%d" % i}]})
        check(st == 200 and json.loads(data)["object"] == "chat.completion",
              "chat non-stream 200: %r" % data[:200])
    def chat_copies():
        return [sum(1 for r in p.log()["requests"] if r["path"] == "/v1/chat/completions")
                for p in prefills]
    # the client's answer is decode's; a prefill copy may be logged a moment later (the fake
    # decode does not wait for its prefill), so wait for all four before counting
    wait_for(lambda: sum(chat_copies()) >= 4)
    used = chat_copies()
    check(used == [2, 2], "round robin over the prefills: %s" % used)
    for i, p in enumerate(prefills):
        for r in p.log()["requests"]:
            b = r["body"]
            if r["path"] != "/v1/chat/completions":
                continue
            check(b["rid"] == str(b["bootstrap_room"]), "rid = room when the client gave none")
            check(b["bootstrap_port"] == (9001 if i == 0 else None),
                  "bootstrap_port from --prefill URL [PORT] (%r)" % b["bootstrap_port"])
            d = [x for dd in decodes for x in bodies(dd, b["rid"])]
            check(len(d) == 1 and d[0]["bootstrap_room"] == b["bootstrap_room"],
                  "decode copy has the same room")
    # batch: arrays
    st, _, data = router.request("POST", "/generate", {"text": ["a", "b"], "rid": ["b1", "b2"]})

    def prefill_batch_bodies():
        return [r["body"] for p in prefills for r in p.log()["requests"]
                if r["body"].get("rid") == ["b1", "b2"]]
    # the client's answer is decode's; the prefill copy may be logged a moment later
    wait_for(prefill_batch_bodies)
    pb = prefill_batch_bodies()
    check(len(pb) == 1 and len(pb[0]["bootstrap_room"]) == 2 and
          len(set(pb[0]["bootstrap_room"])) == 2, "batch: one room per prompt")
    # n > 1: one room per sub-request (prompts x n), the daemons fan out alike
    st, _, data = router.request("POST", "/generate",
                                 {"text": ["a", "b"], "rid": "nn", "sampling_params": {"n": 2}})

    def prefill_n_bodies():
        return [r["body"] for p in prefills for r in p.log()["requests"]
                if r["body"].get("rid") == "nn"]
    wait_for(prefill_n_bodies)
    pn = prefill_n_bodies()
    check(len(pn) == 1 and len(pn[0]["bootstrap_room"]) == 4 and
          len(set(pn[0]["bootstrap_room"])) == 4, "n = 2 x 2 prompts: four rooms")
    st, _, data = router.request("POST", "/generate", {"text": "a", "sampling_params": {"n": 129}})
    check(st == 400 and b"'n'" in data, "n = 129 refused with 400")
    st, _, data = router.request("POST", "/generate", "{not json")
    check(st == 400 and json.loads(data)["error"]["code"] == 400, "bad JSON: 400 OpenAI error")
    # pass-through GETs
    st, _, data = router.request("GET", "/v1/models")
    check(st == 200 and json.loads(data)["data"][0]["owned_by"] == "sglang", "/v1/models")
    info = router.info()
    check(len(info["workers"]) == 4 and info["internal_states"] == [{}], "/server_info")
    st, _, data = router.request("GET", "/get_load")
    check(st == 200 and "load" in json.loads(data), "/get_load")
    st, _, data = router.request("GET", "/nope")
    check(st == 404, "unknown path: 404")


def test_unreachable_retry(router, prefills, decodes):
    # kill a prefill, then a decode: the router only learns it from the requests themselves
    # (health interval is long here); each request that hits the dead one is retried once on
    # another pair. (Two unknown-dead workers at once can still fail a request: one retry.)
    for victim in (prefills[1], decodes[1]):
        victim.kill()
        for i in range(3):
            rid = "r%d-%d" % (victim.port, i)
            st, _, data = router.request("POST", "/generate", {"text": rid, "rid": rid})
            check(st == 200, "%s succeeds despite a dead worker: %d %r" % (rid, st, data[:200]))
    info = router.info()
    dead = [w for w in info["workers"] if not w["healthy"]]
    check(sorted(w["url"] for w in dead) == sorted([prefills[1].url, decodes[1].url]),
          "dead workers out of rotation: %s" % dead)
    check(info["num_retried_requests_total"] >= 1, "a retry happened")
    # the live decode got an abort for the room whose prefill was unreachable
    aborts = decodes[0].log()["aborts"]
    rids = set()
    for r in prefills[0].log()["requests"]:
        rid = r["body"].get("rid")
        rids.update(rid if isinstance(rid, list) else [rid])
    check(all(a in rids or a.startswith("r") for a in aborts), "aborts name real rids")


def test_failures(router, p, d, auth):
    h = {"Authorization": "Bearer secret"}
    # 401
    st, _, data = router.request("POST", "/generate", {"text": "x"})
    check(st == 401 and json.loads(data)["error"]["code"] == 401, "no key: 401")
    st, _, _ = router.request("POST", "/generate", {"text": "x"},
                              headers={"Authorization": "Bearer wrong"})
    check(st == 401, "wrong key: 401")
    check(router.request("GET", "/health")[0] == 200, "/health needs no key")
    st, _, _ = router.request("POST", "/generate", {"text": "x", "rid": "k1"}, headers=h)
    check(st == 200, "right key: 200")
    check(any(r["auth"] == "Bearer secret" for r in d.log()["requests"]),
          "Authorization forwarded to the workers")

    # prefill failure -> decode aborted, 502
    d.config(hang=True)
    p.config(fail=500)
    st, _, data = router.request("POST", "/generate", {"text": "x", "rid": "pf1"}, headers=h)
    check(st == 502 and b"prefill" in data, "prefill failure: 502 (%d %r)" % (st, data[:200]))
    check(wait_for(lambda: "pf1" in d.log()["aborts"]), "prefill failure: decode aborted")
    p.config(fail=0)
    d.config(hang=False)

    # client disconnect mid-stream -> both aborted
    d.config(tokens=200, token_delay_ms=20)
    s = socket.create_connection(("127.0.0.1", router.port))
    body = json.dumps({"text": "x", "stream": True, "rid": "cd1"})
    s.sendall(("POST /generate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer secret\r\n"
               "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
               % (len(body), body)).encode())
    first = s.recv(4096)
    check(b"200" in first.split(b"\r\n")[0], "disconnect test: stream started")
    s.close()
    check(wait_for(lambda: "cd1" in d.log()["aborts"] and "cd1" in p.log()["aborts"]),
          "client disconnect: abort on both workers")
    d.config(tokens=5, token_delay_ms=10)

    # client gone before decode's first byte (decode hangs) -> both aborted too
    d.config(hang=True)
    s = socket.create_connection(("127.0.0.1", router.port))
    body = json.dumps({"text": "x", "stream": True, "rid": "cd2"})
    s.sendall(("POST /generate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer secret\r\n"
               "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
               % (len(body), body)).encode())
    wait_for(lambda: any(r["body"].get("rid") == "cd2" for r in d.log()["requests"]))
    s.close()
    check(wait_for(lambda: "cd2" in d.log()["aborts"] and "cd2" in p.log()["aborts"]),
          "client gone before the first byte: abort on both workers")
    d.config(hang=False)

    # prefill fails after decode's stream started -> SSE error event + [DONE]
    d.config(tokens=40, token_delay_ms=20)
    p.config(fail=500, prefill_delay_ms=200)
    st, ct, data = router.request("POST", "/generate", {"text": "x", "stream": True,
                                                        "rid": "pf2"}, headers=h)
    text = data.decode()
    check(st == 200 and '"error"' in text and text.endswith("data: [DONE]\n\n")
          and text.count("[DONE]") == 1,
          "prefill failure mid-stream: SSE error event then [DONE]: %r" % text[-300:])
    check(wait_for(lambda: "pf2" in d.log()["aborts"]), "mid-stream prefill failure: decode aborted")
    p.config(fail=0, prefill_delay_ms=0)
    d.config(tokens=5, token_delay_ms=10)

    # decode's connection breaks mid-event -> every event the client gets is whole JSON, the
    # router's error last, then [DONE] (the half event is never relayed)
    d.config(tokens=12, token_delay_ms=5, cut_after=6, pad=3000)
    st, ct, data = router.request("POST", "/generate", {"text": "x", "stream": True,
                                                        "rid": "cut1"}, headers=h)
    events = [e for e in data.decode().split("\n\n") if e]
    bad = []
    for e in events[:-1]:
        try:
            json.loads(e[len("data: "):])
        except ValueError:
            bad.append(e[:80] + "..." + e[-80:])
    check(st == 200 and not bad and len(events) == 8 and '"error"' in events[-2]
          and events[-1] == "data: [DONE]",
          "decode cut mid-event: %d events (want 6 whole, the error, [DONE]), malformed %r, "
          "last %r" % (len(events), bad, events[-2:] if events else None))
    d.config(tokens=5, token_delay_ms=10, cut_after=-1, pad=0)
    check(router.wait_healthy(200), "the cut decode back in rotation")

    # decode error status passes through
    d.config(fail=503)
    st, _, data = router.request("POST", "/generate", {"text": "x"}, headers=h)
    check(st == 503, "decode's own error status reaches the client (%d)" % st)
    d.config(fail=0)

    # timeout -> 504 and aborts (--request-timeout-secs 2)
    d.config(hang=True)
    t0 = time.time()
    st, _, data = router.request("POST", "/generate", {"text": "x", "rid": "to1"}, headers=h)
    took = time.time() - t0
    # a hanging decode never answers (until the fake's own 30 s): the 504 and the abort below
    # are the router's timeout; our clock only says it did not fire early
    check(st == 504 and b"timed out" in data and took > 1.5,
          "timeout: 504 after --request-timeout-secs 2 (%d after %.1f s: %r)"
          % (st, took, data[:200]))
    check(wait_for(lambda: "to1" in d.log()["aborts"]), "timeout: decode aborted")

    # 429 over --max-concurrent-requests 2 (decode still hangs)
    results = []

    def bg(i):
        results.append(router.request("POST", "/generate", {"text": "x", "rid": "c%d" % i},
                                      headers=h)[0])

    ts = [threading.Thread(target=bg, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    wait_for(lambda: router.info(h)["num_running_reqs"] == 2)
    st, hdrs, data = call_from(router.port, "POST", "/generate", {"text": "x"}, headers=h)
    check(st == 429 and json.loads(data)["error"]["code"] == 429 and
          hdrs.get("retry-after") == "1", "third request: 429 with Retry-After: 1")
    d.config(hang=False)
    for t in ts:
        t.join(10)
    check(results == [200, 200], "the two admitted requests finish: %s" % results)

    # health: decode unhealthy -> out of rotation, router not ready; back on 200
    d.config(health=503)
    check(router.wait_healthy(503), "decode /health 503: router /health 503")
    st, _, data = router.request("POST", "/generate", {"text": "x"}, headers=h)
    check(st == 503 and b"no healthy decode" in data, "no healthy decode: 503")
    d.config(health=200)
    check(router.wait_healthy(200), "decode /health 200 again: back in rotation")
    st, _, _ = router.request("POST", "/generate", {"text": "x"}, headers=h)
    check(st == 200, "serving again after recovery")


def call_from(port, method, path, body=None, headers=None, src="127.0.0.1", timeout=15):
    """One request from source address src: (status, headers {lowercase: value}, body)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout, source_address=(src, 0))
    try:
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request(method, path, body=json.dumps(body) if isinstance(body, dict) else body,
                  headers=h)
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def error_of(data):
    try:
        return json.loads(data)["error"]
    except (ValueError, KeyError, TypeError):
        return {}


def test_limits(p, d):
    """--max-concurrent-requests-per-client 2, --max-n 4, the header and body limits."""
    r = Router(["--prefill", p.url, "--decode", d.url, "--health-check-interval-secs", "3600",
                "--max-concurrent-requests-per-client", "2", "--max-n", "4"])
    check(r.wait_healthy(), "limits router healthy")
    info = r.info()
    check(info.get("max_concurrent_requests_per_client") == 2 and info.get("max_n") == 4,
          "/server_info shows the limits: %r" % {k: info.get(k) for k in (
              "max_concurrent_requests_per_client", "max_n")})
    d.config(hang=True)
    held = {}

    def bg(rid, src):
        held[rid] = call_from(r.port, "POST", "/generate", {"text": "x", "rid": rid}, src=src,
                              timeout=30)[0]

    def reached_decode(rid):
        return wait_for(lambda: any(q["body"].get("rid") == rid for q in d.log()["requests"]))

    ts = [threading.Thread(target=bg, args=("pc%d" % i, "127.0.0.1")) for i in range(2)]
    for t in ts:
        t.start()
    check(reached_decode("pc0") and reached_decode("pc1"), "two requests from 127.0.0.1 held")
    st, hdrs, data = call_from(r.port, "POST", "/v1/completions", {"prompt": "x", "rid": "pc2"})
    e = error_of(data)
    check(st == 429 and hdrs.get("retry-after") == "1" and e.get("code") == "rate_limit_exceeded"
          and e.get("message", "").startswith(
              "Too many concurrent requests from 127.0.0.1: 2 in flight, the limit is 2 per "
              "client address (--max-concurrent-requests-per-client)"),
          "third request from 127.0.0.1: 429 with Retry-After naming the limit: %d %r %r" %
          (st, hdrs.get("retry-after"), data[:300]))
    check(not any(q["body"].get("rid") == "pc2" for q in d.log()["requests"]),
          "the refused request never reached a worker")
    for path in ("/health", "/server_info", "/v1/models"):
        st = call_from(r.port, "GET", path)[0]
        check(st in (200, 404) and st != 429, "%s is not counted per client: %d" % (path, st))
    # another client address has a budget of its own
    t2 = threading.Thread(target=bg, args=("pc3", "127.0.0.2"))
    t2.start()
    check(reached_decode("pc3"), "a request from 127.0.0.2 is admitted meanwhile")
    # answered requests free their slots
    d.config(hang=False)
    for t in ts + [t2]:
        t.join(30)
    check(held == {"pc0": 200, "pc1": 200, "pc3": 200}, "the admitted requests finish: %r" % held)
    # a client that leaves frees its slot at once (the router aborts its request)
    d.config(hang=True)
    s = socket.create_connection(("127.0.0.1", r.port), source_address=("127.0.0.1", 0))
    body = json.dumps({"text": "x", "stream": True, "rid": "pc4"})
    s.sendall(("POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               "Content-Length: %d\r\n\r\n%s" % (len(body), body)).encode())
    t3 = threading.Thread(target=bg, args=("pc5", "127.0.0.1"))
    t3.start()
    check(reached_decode("pc4") and reached_decode("pc5"), "two held again")
    st = call_from(r.port, "POST", "/generate", {"text": "x", "rid": "pc6"})[0]
    check(st == 429, "at the limit again: %d" % st)
    s.close()
    check(wait_for(lambda: "pc4" in d.log()["aborts"]), "the client that left was aborted")
    t4 = threading.Thread(target=bg, args=("pc7", "127.0.0.1"))
    t4.start()
    check(reached_decode("pc7"), "its slot is free again: the next request is admitted")
    d.config(hang=False)
    for t in (t3, t4):
        t.join(30)
    check(held.get("pc5") == 200 and held.get("pc7") == 200, "all finish: %r" % held)

    # --max-n 4
    st, _, data = r.request("POST", "/generate", {"text": "x", "sampling_params": {"n": 5}})
    msg = error_of(data).get("message", "")
    check(st == 400 and "[1, 4]" in msg and "--max-n" in msg,
          "n 5 over --max-n 4: 400 naming the limit: %d %r" % (st, data[:300]))
    st, _, data = r.request("POST", "/v1/completions", {"prompt": "x", "n": 4})
    check(st == 200, "n 4 (= --max-n) is routed: %d %r" % (st, data[:200]))

    # request line + headers over 64 KiB: 431 naming both sizes
    st, hdrs, data = call_from(r.port, "POST", "/generate", {"text": "x"},
                               headers={"X-Pad": "p" * 70000})
    msg = error_of(data).get("message", "")
    sizes = [int(x) for x in re.findall(r"\d+", msg)]
    check(st == 431 and error_of(data).get("code") == "request_header_fields_too_large" and
          65536 in sizes and any(70000 < x < 71000 for x in sizes),
          "70 kB of headers: 431 naming the sizes: %d %r" % (st, data[:300]))
    # a body over the router's limit (8 MiB less its room for the bootstrap fields): 413
    # (announced with Expect: 100-continue, as curl does, so the answer comes before the body)
    head, data = pc.oversized_body_answer(r.port, "/generate", (8 << 20) + 12)
    raw = head + b"\r\n\r\n" + data
    check(head.startswith(b"HTTP/1.1 413") and "larger than the limit of 8384512 bytes" in
          error_of(data).get("message", ""), "8 MiB body: 413 naming the limit: %r" % raw[:400])
    r.stop()


def send_stream_request(port, body, rcvbuf=None):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect(("127.0.0.1", port))
    data = json.dumps(body)
    s.sendall(("POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               "Content-Length: %d\r\n\r\n%s" % (len(data), data)).encode())
    return s


def read_chunked_response(s, buf=b""):
    """(status line, de-chunked body) of one chunked HTTP/1.1 response on socket s."""
    def more():
        b = s.recv(1 << 20)
        if not b:
            raise EOFError("connection closed mid-response")
        return b
    while b"\r\n\r\n" not in buf:
        buf += more()
    head, rest = buf.split(b"\r\n\r\n", 1)
    parts = []
    while True:
        while b"\r\n" not in rest:
            rest += more()
        line, rest = rest.split(b"\r\n", 1)
        n = int(line.split(b";")[0], 16)
        while len(rest) < n + 2:
            rest += more()
        parts.append(rest[:n])
        rest = rest[n + 2:]
        if n == 0:
            break
    return head.split(b"\r\n")[0], b"".join(parts)


def test_backpressure(router, p, d, limit):
    # ~8 MB of SSE from decode, as fast as it can write, to a client that reads nothing for a
    # while: more than any socket buffers hold, so without backpressure the router would hold
    # megabytes. With it, decode is paused and the router holds about `limit`.
    slack = 64 << 10  # one read from decode lands after the check that pauses it
    d.config(tokens=1000, token_delay_ms=0, pad=8192)
    s = send_stream_request(router.port, {"text": "x", "stream": True, "rid": "bp1"}, 4096)
    first = s.recv(256)
    check(first.startswith(b"HTTP/1.1 200"), "backpressure: stream started: %r" % first[:80])
    # the client reads nothing from here on until the router has paused decode
    check(wait_for(lambda: router.info()["num_stream_pauses_total"] >= 1, 30),
          "slow client: decode was paused (%d pauses)" % router.info()["num_stream_pauses_total"])
    info = router.info()
    check(info["stream_buffer_bytes"] <= limit + slack,
          "slow client: router holds <= %d bytes (%d)" % (limit + slack, info["stream_buffer_bytes"]))
    s.settimeout(30)
    status, body = read_chunked_response(s, first)
    s.close()
    check(wait_for(lambda: "bp1" in d.log()["sent"]), "decode finished the big stream")
    sent = d.log()["sent"].get("bp1", "")
    check(len(body) > 8000000 and body.decode() == sent,
          "slow client gets every byte in order (%d of %d)" % (len(body), len(sent)))
    info = router.info()
    check(info["stream_buffer_peak_bytes"] <= limit + slack,
          "router's peak backlog bounded: %d <= %d" % (info["stream_buffer_peak_bytes"],
                                                       limit + slack))
    check(info["num_slow_clients_cut_total"] == 0, "nobody cut for being slow")
    print("backpressure: %d pauses, peak %d bytes held for an %d-byte stream"
          % (info["num_stream_pauses_total"], info["stream_buffer_peak_bytes"], len(body)),
          flush=True)
    # a slow client that leaves while decode is paused (nothing is being written to it): still
    # seen at once, both workers aborted, nothing left buffered
    pauses = info["num_stream_pauses_total"]
    s = send_stream_request(router.port, {"text": "x", "stream": True, "rid": "bp2"}, 4096)
    s.recv(256)
    check(wait_for(lambda: router.info()["num_stream_pauses_total"] > pauses),
          "second slow client: decode paused")
    s.close()
    check(wait_for(lambda: "bp2" in d.log()["aborts"] and "bp2" in p.log()["aborts"]),
          "slow client gone while decode paused: abort on both workers")
    check(wait_for(lambda: router.info()["stream_buffer_bytes"] == 0),
          "nothing left buffered after it left")
    d.config(tokens=5, token_delay_ms=10, pad=0)


def refused(port):
    """True when nothing accepts a connection on port any more."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        return False
    except OSError:
        return True


def read_until(s, buf, marker):
    """buf plus what s gives until marker is in it (EOFError when the peer closes first)."""
    while marker not in buf:
        b = s.recv(65536)
        if not b:
            raise EOFError("connection closed before %r" % marker)
        buf += b
    return buf


def test_graceful_shutdown(router, p, d):
    # a stream of ~2 s is flowing through the router at SIGTERM (--shutdown-timeout 60, far
    # beyond every wait here): the router stops accepting, the stream completes whole, and the
    # router exits 0 once it ended, never having reached its deadline
    d.config(tokens=40, token_delay_ms=50)
    s = send_stream_request(router.port, {"text": "x", "stream": True, "rid": "gs1"})
    s.settimeout(30)
    try:
        got = read_until(s, b"", b"data: ")  # decode's first event came through the router
    except (EOFError, OSError) as e:
        got = b""
        check(False, "graceful: the stream started through the router: %r" % e)
    router.proc.send_signal(signal.SIGTERM)
    check(wait_for(lambda: refused(router.port), 30), "graceful: no new connections after SIGTERM")
    try:
        status, body = read_chunked_response(s, got)
    except (EOFError, OSError) as e:
        status, body = b"", ("<%s>" % e).encode()
    s.close()
    text = body.decode()
    check(wait_for(lambda: "gs1" in d.log()["sent"]), "graceful: decode finished the stream")
    check(status.startswith(b"HTTP/1.1 200") and text == d.log()["sent"].get("gs1")
          and text.endswith("data: [DONE]\n\n") and '"error"' not in text,
          "graceful: the stream in flight completed: %r %r" % (status, text[-200:]))
    rc = router.wait_exit(30)
    check(rc == 0, "graceful: exit 0 once the stream ended (%s)" % rc)
    check(not any("shutdown deadline" in ln for ln in router.lines),
          "graceful: the router left before its deadline (no 'shutdown deadline' in its log)")
    check("gs1" not in d.log()["aborts"] and "gs1" not in p.log()["aborts"],
          "graceful: a finished request is not aborted")
    d.config(tokens=5, token_delay_ms=10)


def test_shutdown_deadline(p, d):
    # --shutdown-timeout 1 and a stream that would run for 100 s: at the deadline the client
    # gets an error event and [DONE], both workers get an abort, and the router exits 0
    r = Router(["--prefill", p.url, "--decode", d.url, "--shutdown-timeout", "1",
                "--health-check-interval-secs", "3600"])
    check(r.wait_healthy(), "router 4 healthy")
    d.config(tokens=2000, token_delay_ms=50)
    s = send_stream_request(r.port, {"text": "x", "stream": True, "rid": "sd1"})
    s.settimeout(30)
    first = s.recv(4096)
    check(first.startswith(b"HTTP/1.1 200"), "deadline: stream started")
    t0 = time.time()
    r.proc.send_signal(signal.SIGTERM)
    try:
        status, body = read_chunked_response(s, first)
    except (EOFError, OSError) as e:
        status, body = b"", ("<%s>" % e).encode()
    s.close()
    took = time.time() - t0
    text = body.decode()
    # the stream cannot end on its own before the socket's 30 s: its end is the deadline's; our
    # clock (started before the signal) only says the router did not cut it early
    check(took > 0.8 and '"error"' in text and "shutting down" in text
          and text.endswith("data: [DONE]\n\n"),
          "deadline: error event and [DONE] after the 1 s deadline (%.1f s): %r"
          % (took, text[-300:]))
    check(wait_for(lambda: "sd1" in d.log()["aborts"] and "sd1" in p.log()["aborts"]),
          "deadline: aborted on both workers")
    rc = r.wait_exit(30)
    check(rc == 0, "deadline: exit 0 (%s)" % rc)
    check(any("shutdown deadline: aborting 1 requests" in ln for ln in r.lines),
          "deadline: the router logged its deadline aborting the one request")
    d.config(tokens=5, token_delay_ms=10)


def test_worker_api_key(p, d):
    """Workers that require the key (--api-key on them too): the router's own calls carry its
    --api-key — /get_load polls (the polled load shows in the router's /get_load), the aborts of
    a client's /abort_request and of a client that went away — and none is refused."""
    r = Router(["--prefill", p.url, "--decode", d.url, "--api-key", "k3y",
                "--health-check-interval-secs", "0.1"])
    h = {"Authorization": "Bearer k3y"}
    check(r.wait_healthy(), "router with worker keys healthy")
    d.config(load=7)
    check(wait_for(lambda: d.log()["load_polls"] >= 2 and p.log()["load_polls"] >= 2),
          "/get_load polled on workers that require the key")

    def decode_load():
        st, _, data = r.request("GET", "/get_load", headers=h)
        ws = json.loads(data).get("workers", []) if st == 200 else []
        return [w.get("load") for w in ws if w.get("url") == d.url]
    check(wait_for(lambda: decode_load() == [7]), "polled load 7 reaches the router (%r)"
          % decode_load())
    st, _, _ = r.request("POST", "/abort_request", {"rid": "ak1"}, headers=h)
    check(st == 200, "client abort_request: 200")
    check(wait_for(lambda: "ak1" in d.log()["aborts"] and "ak1" in p.log()["aborts"]),
          "client abort reaches both workers with the key")
    d.config(hang=True)
    s = socket.create_connection(("127.0.0.1", r.port))
    body = json.dumps({"text": "x", "stream": True, "rid": "ak2"})
    s.sendall(("POST /generate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k3y\r\n"
               "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
               % (len(body), body)).encode())
    wait_for(lambda: any(q["body"].get("rid") == "ak2" for q in d.log()["requests"]))
    s.close()
    check(wait_for(lambda: "ak2" in d.log()["aborts"] and "ak2" in p.log()["aborts"]),
          "disconnect abort reaches both workers with the key")
    d.config(hang=False, load=0)
    bad = d.log()["unauthorized"] + p.log()["unauthorized"]
    check(bad == [], "no router call refused by the workers: %r" % bad[:5])
    r.stop()


def main():
    t0 = time.time()
    try:
        prefills = [Fake("prefill"), Fake("prefill")]
        decodes = [Fake("decode"), Fake("decode")]
        r1 = Router(["--pd-disaggregation", "--prefill", prefills[0].url, "9001", "--prefill",
                     prefills[1].url, "--decode", decodes[0].url, "--decode", decodes[1].url,
                     "--policy", "round_robin", "--health-check-interval-secs", "3600"])
        check(r1.wait_healthy(), "router 1 healthy")
        # /health is 200 once one pair is up; round robin skips a worker whose first health
        # answer is still on its way (slow under load), which would shift which prefill gets
        # which request below: wait for all four
        check(wait_for(lambda: all(w["healthy"] for w in r1.info()["workers"]), 10),
              "router 1: all four workers in rotation")
        test_routing_and_streaming(r1, prefills, decodes)
        test_unreachable_retry(r1, prefills, decodes)
        r1.stop()

        p, d = Fake("prefill"), Fake("decode")
        # one pair whose failures are provoked on purpose, each checked as the client sees a
        # single attempt fail: no retries (this fake decode remembers an aborted rid forever,
        # so a retry with the client's rid would read as aborted) and no circuit breaker (the
        # provoked 5xx runs would open the pair's circuits for the checks that follow);
        # test_router_breaker.py covers both against real daemons
        r2 = Router(["--prefill", p.url, "--decode", d.url, "--api-key", "secret",
                     "--request-timeout-secs", "2", "--max-concurrent-requests", "2",
                     "--health-check-interval-secs", "0.1", "--policy", "cache_aware",
                     "--disable-circuit-breaker", "--disable-retries"])
        check(r2.wait_healthy(), "router 2 healthy")
        test_failures(r2, p, d, "secret")
        r2.stop()
        test_limits(p, d)

        limit = 64 << 10
        r3 = Router(["--prefill", p.url, "--decode", d.url, "--stream-buffer-bytes", str(limit),
                     "--shutdown-timeout", "60", "--health-check-interval-secs", "3600"])
        check(r3.wait_healthy(), "router 3 healthy")
        test_backpressure(r3, p, d, limit)
        test_graceful_shutdown(r3, p, d)
        test_shutdown_deadline(p, d)

        test_worker_api_key(Fake("prefill", api_key="k3y"), Fake("decode", api_key="k3y"))
    finally:
        for proc in PROCS:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    print("%s: %d failures in %.1f s" % (os.path.basename(__file__), len(FAILURES),
                                           time.time() - t0))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
