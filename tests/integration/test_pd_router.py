#!/usr/bin/env python3
"""test_pd_router.py — the product end to end: pdserve-router in front of a real pdserve-prefill
and pdserve-decode on 127.0.0.1 (UCX over shared memory), a tiny model from pdserve-mkmodel,
--chunked-prefill-size 64 --page-size 16. What a user would notice:

  tokens    50 prompts of mixed lengths (1-3 tokens, page-boundary crossers, > 64 tokens, text
            and token ids): greedy text through the router equals pdserve-generate's, streamed
            and not, on /generate and /v1/completions; chat equals pdserve-generate on the
            rendered chat prompt; 32 concurrent streaming clients all correct; then both
            daemons' page pools are back to full (/server_info).
  failures  through the router: client disconnect mid-stream, /abort_request, SIGKILL of prefill
            while requests sit in decode's transfer queue (each fails within 10 s, decode pages
            recovered; the prefill restarts on its ports and decode re-pairs with it).
  kill_decode  SIGKILL of decode mid-request: every client gets an answer or an error, never
            silence; the surviving prefill answers /health within 5 s and its pages are
            recovered; decode restarts on its port and serves (kill_loop.py repeats this).
  startup   workers unreachable when the router starts: /health is not 200 and requests get a
            quick 503 until both are up; then they are served.
  restart_prefill  SIGKILL of prefill and a restart on its ports before decode learns the old
            one died (decode's UCX keepalive set to 60 s): the new prefill refuses the first
            Transfer under the old pairing (NOT_FOUND), decode pairs again at once, and every
            later request is served (router retries off, so no failure hides); before, every
            Transfer was refused until UCX noticed, and the router's breaker opened on the
            prefill for 30 s.
  local     --local-prefill-max-tokens 24: prompts the router estimates at <= 24 tokens (ids
            counted, text at 4 bytes a token) go to the decode alone, the rest take the PD path
            (the router's pdserve_router_path_requests_total and the decode's
            pdserve_local_prefill_requests_total count exactly those); texts equal
            pdserve-generate's on both paths, streamed and not, and 16 concurrent clients mixing
            them; /abort_request on a local stream; with the prefill SIGKILLed the local ones
            are still served and the others get an error; pools back to full.
  extras    daemon gaps: /health_generate runs a real 1-token generation; logprobs through the
            router (sum equals pdserve-generate's); 503 past --max-queued-requests; --api-key
            (401) on daemons and through the router.

No failure is excused: every check is a hard check (a 10 MB body gets its 413 from the router
itself; a prefill surviving a decode SIGKILL must keep serving).

Stdlib only. Usage: test_pd_router.py BUILD_DIR CASE. Every process is killed (by PID) on exit;
every wait is bounded.
"""
import http.client
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pd_cluster as pc  # noqa: E402

BUILD = os.path.abspath(sys.argv[1])
CASE = sys.argv[2] if len(sys.argv) > 2 else "tokens"
GENERATE = os.path.join(BUILD, "tools", "pdserve-generate")
TOKENIZE = os.path.join(BUILD, "tools", "pdserve-tokenize")
MAX_NEW = 16
check, step = pc.check, pc.step

# ---------------------------------------------------------------- references

WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly hex "
         "every jolly vexed bank clerk and the river runs to the sea under stars").split()


def make_prompts(rng):
    """50 prompts: 36 texts of 1..150 words, 14 token-id lists of exact lengths."""
    out = []
    for i in range(36):
        k = [1, 2, 4, 5, 6, 10, 11, 20, 21, 22, 40, 60, 100, 150][i % 14] + rng.randrange(2)
        out.append({"text": " ".join(rng.choice(WORDS) for _ in range(k))})
    for n in (1, 2, 3, 15, 16, 17, 31, 33, 63, 64, 65, 127, 129, 300):
        out.append({"ids": [rng.randrange(1000) for _ in range(n)]})
    return out


def token_counts(model, prompts):
    texts = [p["text"] for p in prompts if "text" in p]
    r = subprocess.run([TOKENIZE, "--model-path", model, "--jsonl"],
                       input="\n".join(json.dumps(t) for t in texts) + "\n",
                       capture_output=True, text=True, check=True, timeout=60)
    lines = r.stdout.strip().split("\n")
    it = iter(lines)
    out = []
    for p in prompts:
        out.append(len(next(it).split()) if "text" in p else len(p["ids"]))
    return out


def reference_one(model, prompt, max_new=MAX_NEW):
    """pdserve-generate's greedy text for a prompt ({"text": ...} or {"ids": [...]})."""
    return pc.generate(BUILD, model, prompt.get("ids", prompt.get("text")), max_new)


def references(model, prompts, max_new=MAX_NEW):
    return pc.pool_map(lambda i: reference_one(model, prompts[i], max_new), len(prompts))


# ---------------------------------------------------------------- requests

def gen_body(prompt, kind, stream, max_new=MAX_NEW, usage=False, **extra):
    if kind == "generate":
        b = {"stream": stream, "sampling_params": {"max_new_tokens": max_new, "temperature": 0}}
        if "ids" in prompt:
            b["input_ids"] = prompt["ids"]
        else:
            b["text"] = prompt["text"]
    else:
        b = {"prompt": prompt.get("text", prompt.get("ids")), "max_tokens": max_new,
             "temperature": 0, "stream": stream}
        if stream and usage:
            b["stream_options"] = {"include_usage": True}
    b.update(extra)
    return b


def text_of(kind, stream, raw):
    """(text, usage or None, finish) from a router answer body; raises on a malformed one."""
    if not stream:
        j = json.loads(raw)
        if kind == "generate":
            return j["text"], None, j["meta_info"]["finish_reason"]
        c = j["choices"][0]
        return (c["text"] if kind == "completions" else c["message"]["content"]), j.get("usage"), \
            c["finish_reason"]
    chunks = pc.stream_payloads(raw)
    if kind == "generate":
        return chunks[-1]["text"], None, chunks[-1]["meta_info"]["finish_reason"]
    usage, text, finish = None, "", None
    for c in chunks:
        if c.get("usage"):
            usage = c["usage"]
        for ch in c["choices"]:
            if kind == "completions":
                text += ch.get("text") or ""
            else:
                text += ch["delta"].get("content") or ""
            finish = ch.get("finish_reason") or finish
    return text, usage, finish


PATHS = {"generate": "/generate", "completions": "/v1/completions",
         "chat": "/v1/chat/completions"}


def through(rt, kind, body, timeout=120):
    st, raw = rt.post(PATHS[kind], body, timeout)
    return st, raw


def chat_reference(model, pf, messages, tmp, max_new=MAX_NEW):
    """pdserve-generate on the chat prompt: rendered by pdserve-tokenize --chat, tokenized as the
    daemons tokenize a rendered chat prompt (special tokens parsed, none added)."""
    ids = pc.chat_prompt_ids(BUILD, model, pf, messages, tmp)
    return reference_one(model, {"ids": ids}, max_new), len(ids)


# ---------------------------------------------------------------- cases

def case_tokens(model, tmp):
    pf, dc, rt = pc.start_cluster(BUILD, tmp, model)
    rng = random.Random(11)
    prompts = make_prompts(rng)
    counts = token_counts(model, prompts)
    step("prompt lengths (tokens): %s" % counts)
    check(len(prompts) == 50, "50 prompts")
    check(sum(1 for n in counts if n <= 3) >= 3, "prompts of 1-3 tokens: %s" % counts)
    check(sum(1 for n in counts if n > 64) >= 10, "prompts over one 64-token chunk: %s" % counts)
    check(sum(1 for n in counts if n > 16 and n % 16 in (0, 1, 15)) >= 5,
          "prompts at page boundaries: %s" % counts)
    ref = references(model, prompts)
    step("references from pdserve-generate done")
    # every prompt: /generate and /v1/completions, each streamed and not
    n_ok = 0
    for i, p in enumerate(prompts):
        for kind in ("generate", "completions"):
            for stream in (False, True):
                usage_wanted = stream and kind == "completions" and i % 2 == 0
                st, raw = through(rt, kind, gen_body(p, kind, stream, usage=usage_wanted))
                if not check(st == 200, "prompt %d %s stream=%s: HTTP %d %r" %
                             (i, kind, stream, st, raw[:200])):
                    continue
                try:
                    text, usage, finish = text_of(kind, stream, raw)
                except (ValueError, KeyError) as e:
                    check(False, "prompt %d %s stream=%s: %s" % (i, kind, stream, e))
                    continue
                ok = check(text == ref[i], "prompt %d (%d tokens, %s stream=%s): %r != reference %r"
                           % (i, counts[i], kind, stream, text, ref[i]))
                if kind == "completions" and (not stream or usage_wanted):
                    ok &= check(usage is not None and usage["prompt_tokens"] == counts[i] and
                                usage["total_tokens"] == usage["prompt_tokens"] +
                                usage["completion_tokens"],
                                "prompt %d usage %r (prompt has %d tokens)" % (i, usage, counts[i]))
                n_ok += ok
    step("sequential: %d/200 answers equal the reference" % n_ok)

    # chat: equals pdserve-generate on the rendered chat prompt, streamed and not
    chats = [[{"role": "user", "content": "hello there"}],
             [{"role": "system", "content": "You are terse."},
              {"role": "user", "content": " ".join(WORDS)}],
             [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
              {"role": "user", "content": "the river runs to the sea"}]]
    model_id = json.loads(rt.get("/v1/models")[1])["data"][0]["id"]
    for ci, msgs in enumerate(chats):
        cref, n_prompt = chat_reference(model, pf, msgs, tmp)
        for stream in (False, True):
            body = {"model": model_id, "messages": msgs, "max_tokens": MAX_NEW, "temperature": 0,
                    "stream": stream}
            if stream:
                body["stream_options"] = {"include_usage": True}
            st, raw = through(rt, "chat", body)
            if not check(st == 200, "chat %d stream=%s: HTTP %d %r" % (ci, stream, st, raw[:200])):
                continue
            try:
                text, usage, finish = text_of("chat", stream, raw)
            except (ValueError, KeyError) as e:
                check(False, "chat %d stream=%s: %s" % (ci, stream, e))
                continue
            check(text == cref, "chat %d stream=%s: %r != reference %r" % (ci, stream, text, cref))
            check(usage and usage["prompt_tokens"] == n_prompt,
                  "chat %d stream=%s usage %r (rendered prompt: %d tokens)" %
                  (ci, stream, usage, n_prompt))
            check(finish in ("stop", "length"), "chat %d finish_reason %r" % (ci, finish))
    step("chat done")

    # 32 concurrent streaming clients (/generate and /v1/completions), longer answers, all
    # released at once
    n_conc, conc_new = 32, 64
    conc_prompts = [prompts[(i * 7) % len(prompts)] for i in range(n_conc)]
    conc_ref = references(model, conc_prompts, conc_new)
    spans = [None] * n_conc

    def client(i):
        kind = ("generate", "completions")[i % 2]
        body = gen_body(conc_prompts[i], kind, True, conc_new)
        t_start = time.time()
        st, raw = through(rt, kind, body, timeout=180)
        spans[i] = (t_start, time.time())
        return st, text_of(kind, True, raw)[0] if st == 200 else raw[:200]

    t0 = time.time()
    results = pc.concurrent(client, n_conc, 200, 60)
    n_ok = 0
    for i, r in enumerate(results):
        n_ok += check(r is not None and r[0] == 200 and r[1] == conc_ref[i],
                      "concurrent stream %d: %r, reference %r" % (i, r, conc_ref[i]))
    edges = sorted([(a, 1) for a, b in filter(None, spans)] +
                   [(b, -1) for a, b in filter(None, spans)])
    overlap = cur = 0
    for _, d in edges:
        cur += d
        overlap = max(overlap, cur)
    step("%d concurrent streams of %d tokens: %d correct in %.1f s, up to %d in flight at once" %
         (n_conc, conc_new, n_ok, time.time() - t0, overlap))
    check(overlap >= 2, "the streams overlapped (%d at most)" % overlap)
    check(pf.pool_full(), "prefill pool back to full after the concurrent streams")
    check(dc.pool_full(), "decode pool back to full after the concurrent streams")
    for d in (pf, dc):
        info = d.server_info()
        check(info["live_requests"] == 0, "%s live requests after all: %r" % (d.role, info))
    # router pass-through endpoints and a clean stop of all three
    st, body = rt.get("/v1/models")
    check(st == 200 and json.loads(body)["data"][0]["owned_by"] == "sglang", "router /v1/models")
    for proc in (rt, dc, pf):
        rc = proc.terminate(30)
        check(rc == 0, "%s SIGTERM exit %s" % (proc.name, rc))


class Stream:
    """A streaming request read incrementally (http.client undoes the chunked framing)."""

    def __init__(self, port, path, body, timeout=60):
        self.c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        self.c.request("POST", path, json.dumps(body).encode(),
                       {"Content-Type": "application/json"})
        self.r = self.c.getresponse()
        self.status = self.r.status
        self.got = b""
        self.eof = False

    def read_events(self, n, timeout=60):
        """Reads until n events arrived (or EOF / timeout)."""
        deadline = time.time() + timeout
        while self.got.count(b"\n\n") < n and not self.eof and time.time() < deadline:
            self._read_some(deadline)
        return self.got

    def read_rest(self, timeout):
        """Reads to the end; (seconds taken, whether it ended)."""
        t0 = time.time()
        deadline = t0 + timeout
        while not self.eof and time.time() < deadline:
            self._read_some(deadline)
        return time.time() - t0, self.eof

    def _read_some(self, deadline):
        try:
            self.c.sock.settimeout(max(0.05, deadline - time.time()))
            chunk = self.r.read1(65536)
        except (OSError, http.client.HTTPException):
            chunk = b""
            if time.time() < deadline:
                self.eof = True
            return
        if not chunk:
            self.eof = True
        self.got += chunk

    def disconnect(self):
        self.c.sock.shutdown(socket.SHUT_RDWR)
        self.c.close()

    def close(self):
        self.c.close()


def router_healthy(rt, timeout=30):
    return pc.wait_until(lambda: rt.get("/health", timeout=5)[0] == 200, timeout, 0.1)


def one_ok(rt, model_ref_text=None, prompt=None, timeout=60):  # noqa: E302
    """One small request through the router: True when it answers 200 (and, given, the text)."""
    prompt = prompt or {"text": "the river runs to the sea"}
    st, raw = rt.post("/generate", gen_body(prompt, "generate", False), timeout)
    if st != 200:
        print("one_ok: HTTP %d %r" % (st, raw[:300]), flush=True)
        return False
    return model_ref_text is None or json.loads(raw)["text"] == model_ref_text


def case_failures(model, tmp):
    pf, dc, rt = pc.start_cluster(BUILD, tmp, model, decode_extra=["--waiting-timeout", "60"])
    probe = {"text": "the river runs to the sea"}
    probe_ref = reference_one(model, probe)
    long_sp = {"max_new_tokens": 1800, "temperature": 0, "ignore_eos": True}

    step("1. client disconnect mid-stream: both daemons release the request's pages")
    body = {"text": "disconnect me", "stream": True, "sampling_params": long_sp}
    s = Stream(rt.port, "/generate", body)
    got = s.read_events(3)
    check(got.count(b"data: ") >= 3, "stream started before the disconnect: %r" % got[:300])
    s.disconnect()
    check(dc.pool_full(10) and pf.pool_full(10), "pools full after a client disconnect")

    step("2. /abort_request through the router: the stream ends, pools refill")
    # The tiny model writes 1800 tokens in a fraction of a second on an idle machine: when the
    # answer is complete before the abort lands (finish "length"), try again with a new rid.
    for attempt in range(5):
        rid = "e2e-abort-%d" % attempt
        body = {"text": "abort me please", "stream": True, "sampling_params": long_sp,
                "rid": rid}
        s = Stream(rt.port, "/generate", body)
        s.read_events(3)
        st, out = rt.post("/abort_request", {"rid": rid}, 10)
        check(st == 200, "router /abort_request: %d %r" % (st, out))
        dt, finished = s.read_rest(10)
        s.close()
        evs = pc.sse_events(s.got)
        check(s.status == 200 and finished and evs and evs[-1] == "[DONE]",
              "aborted stream ends with [DONE] within 10 s (HTTP %d, %.1f s): %r" %
              (s.status, dt, s.got[-400:]))
        last = json.loads(evs[-2]) if len(evs) >= 2 else {}
        fr = (last.get("meta_info") or {}).get("finish_reason") or {}
        if fr.get("type") == "length" and attempt < 4:
            step("   the answer was complete before the abort landed; again")
            continue
        check(fr.get("type") == "abort" or "error" in last,
              "aborted stream's last event says abort: %r" % last)
        break
    check(dc.pool_full(10) and pf.pool_full(10), "pools full after abort_request")
    check(one_ok(rt, probe_ref), "served after the abort")

    step("3. SIGKILL of prefill while requests sit in decode's transfer queue")
    n = 6
    results = {}
    os.kill(pf.p.pid, signal.SIGSTOP)  # prefill accepts connections but computes nothing

    def waiter(i):
        # long enough for the PD path under any --local-prefill-max-tokens of the suite's runs
        # (estimated ~380 tokens): a local one would not wait for the prefill at all
        b = {"text": "waiting %d " % i + "for the prefill " * 95, "stream": i % 2 == 0,
             "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
        t0 = time.time()
        try:
            st, raw = rt.post("/generate", b, 60)
            results[i] = (st, raw[:300], time.time())
        except Exception as e:  # noqa: BLE001
            results[i] = (0, repr(e).encode(), time.time())

    ts = [threading.Thread(target=waiter, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    queued = pc.wait_until(lambda: dc.server_info()["queues"]["transfer"] >= n, 15, 0.02)
    check(queued, "%d requests in decode's transfer queue: %r" % (n, dc.server_info()["queues"]))
    t_kill = time.time()
    pf.kill()
    for t in ts:
        t.join(30)
    for i in range(n):
        r = results.get(i)
        failed = r is not None and (r[0] >= 500 or b'"error"' in r[1])
        check(failed and r[2] - t_kill < 10,
              "request %d in transfer: error within 10 s of the prefill kill: %r" %
              (i, r and (r[0], r[1][:160], round(r[2] - t_kill, 2))))
    check(dc.pool_full(10), "decode pages recovered after the prefill SIGKILL")
    check(dc.get("/health")[0] == 200, "decode still serving after the prefill died")
    pf.start(60)  # same HTTP and bootstrap ports
    check(router_healthy(rt), "router healthy again once the prefill is back")
    check(pc.wait_until(lambda: one_ok(rt, probe_ref), 30, 0.5),
          "served (decode re-paired with the restarted prefill)")
    check(pf.pool_full(10) and dc.pool_full(10), "pools full at the end")
    for proc in (rt, dc, pf):
        rc = proc.terminate(30)
        check(rc == 0, "%s SIGTERM exit %s" % (proc.name, rc))



def case_kill_decode(model, tmp):
    """SIGKILL of decode mid-request: every client gets an answer or an error (never silence),
    prefill recovers its pages and serves again once decode is back on its port."""
    pf, dc, rt = pc.start_cluster(BUILD, tmp, model)
    probe = {"text": "the river runs to the sea"}
    probe_ref = reference_one(model, probe)
    long_sp = {"max_new_tokens": 1800, "temperature": 0, "ignore_eos": True}
    step("SIGKILL of decode mid-request: every client gets an error, prefill recovers")
    results = {}
    streaming = threading.Event()  # a client is receiving tokens: requests are in flight

    def victim(i):
        if i % 2:  # long prompts: some are still in prefill / transfer at the kill
            prompt = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(300))
            sp = {"max_new_tokens": 600, "temperature": 0, "ignore_eos": True}
        else:
            prompt = "victim %d" % i
            sp = long_sp
        stream = i % 4 < 2
        b = {"text": prompt, "stream": stream, "sampling_params": sp}
        try:
            if stream:
                sk = Stream(rt.port, "/generate", b, 60)
                sk.read_events(2, 60)
                streaming.set()
                dt, fin = sk.read_rest(60)
                sk.close()
                evs = pc.sse_events(sk.got)
                # an error event in the stream, or an error status + JSON before it started
                err = (sk.status >= 500 and b'"error"' in sk.got) or \
                    any(e.startswith('{"error"') for e in evs)
                if err and sk.status == 200:  # the error event is followed by [DONE]
                    err = evs[-1] == "[DONE]"
                done_ok = sk.status == 200 and bool(evs) and evs[-1] == "[DONE]" and not err
                results[i] = ("stream", fin, err, done_ok, time.time(), sk.got[-300:])
            else:
                st, raw = rt.post("/generate", b, 60)
                results[i] = ("json", True, st >= 500 and b"error" in raw, st == 200,
                              time.time(), raw[:200])
        except Exception as e:  # noqa: BLE001
            results[i] = ("exc", False, False, False, time.time(), repr(e))

    ts = [threading.Thread(target=victim, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    # the kill once a client sees tokens flowing, not once the decode's /server_info says
    # running: a loaded machine answered those polls too late (> 1 s) to catch requests the tiny
    # model finishes in about a second, and the kill then hit none
    check(streaming.wait(20), "a victim stream received tokens within 20 s")
    t_kill = time.time()
    dc.kill()
    for t in ts:
        t.join(30)
    n_err = sum(1 for r in results.values() if r[2])
    step("   after the kill: %d/8 got an error, %d/8 had finished" %
         (n_err, sum(1 for r in results.values() if r[3])))
    for i in range(8):
        r = results.get(i)
        check(r is not None and r[1] and (r[2] or r[3]),
              "decode killed: client %d got neither an answer nor an error: %r" % (i, r))
        if r and r[2]:
            check(r[4] - t_kill < 15, "client %d's error came %.1f s after the kill" %
                  (i, r[4] - t_kill))
    check(n_err >= 1, "the decode kill hit at least one request in flight")
    # The surviving prefill's loop must not be stuck in UCX (an older transfer engine's was,
    # over shared memory): /health within 5 s, then its pages back.
    if not check(pc.wait_until(lambda: pf.get("/health", timeout=5)[0] == 200, 5, 0.05),
                 "prefill answers /health within 5 s of the decode SIGKILL"):
        print("prefill stacks:\n" + pf.stacks(), flush=True)
        return
    check(pf.pool_full(15), "prefill pages recovered after the decode SIGKILL")
    check(pc.wait_until(lambda: rt.get("/health")[0] != 200, 10, 0.1),
          "router /health not 200 while the decode is down")
    st, raw = rt.post("/generate", gen_body(probe, "generate", False), 30)
    check(st in (502, 503) and b"error" in raw,
          "request while the decode is down: %d %r" % (st, raw[:200]))
    dc.start(60)  # same ports
    check(router_healthy(rt), "router healthy again once the decode is back")
    try:
        served = one_ok(rt, probe_ref, timeout=20)
    except OSError as e:
        served = False
        print("request after the decode restart: %r" % e, flush=True)
    if not check(served, "served after the decode restarted"):
        print("prefill stacks:\n" + pf.stacks(), flush=True)
    check(pf.pool_full(10) and dc.pool_full(10), "pools full after the decode restart")

    for proc in (rt, dc, pf):
        rc = proc.terminate(30)
        check(rc == 0, "%s SIGTERM exit %s" % (proc.name, rc))


def case_startup(model, tmp):
    pport, bport, dport = pc.free_port(), pc.free_port(), pc.free_port()
    rt = pc.Router(BUILD, [(pport, bport)], [dport], tmp, wait_ready=False)
    # the router itself is up (it answers), but not ready
    up = pc.wait_until(lambda: rt.get("/health", timeout=5)[0], 30, 0.05)
    check(up == 503, "router /health with no worker up: %r" % up)
    t0 = time.time()
    st, raw = rt.post("/generate", {"text": "hi"}, 30)  # 30 s: the failure bound
    check(st == 503 and b"error" in raw,
          "request with no worker up: %d %r in %.1f s" % (st, raw[:160], time.time() - t0))
    st, raw = rt.post("/v1/completions", {"prompt": "hi", "stream": True}, 30)
    check(st == 503 and b"error" in raw, "streamed request with no worker up: %d %r" %
          (st, raw[:160]))
    pf = pc.Daemon(BUILD, "prefill", model, tmp, port=pport, bport=bport)
    # once the router has seen the prefill healthy, it is still not ready without a decode
    check(pc.wait_until(lambda: [w["healthy"] for w in json.loads(rt.get("/workers")[1])[
        "workers"] if w["worker_type"] == "prefill"] == [True], 30),
          "the router sees the prefill healthy")
    check(rt.get("/health")[0] == 503, "router /health with only the prefill up")
    st, raw = rt.post("/generate", {"text": "hi"}, 30)
    check(st == 503 and b"decode" in raw, "request with only the prefill up: %d %r" %
          (st, raw[:160]))
    dc = pc.Daemon(BUILD, "decode", model, tmp, port=dport)
    check(router_healthy(rt, 30), "router /health 200 once both workers are up")
    probe = {"text": "the river runs to the sea"}
    check(one_ok(rt, reference_one(model, probe), probe), "served once both workers are up")
    for proc in (rt, dc, pf):
        rc = proc.terminate(30)
        check(rc == 0, "%s SIGTERM exit %s" % (proc.name, rc))


def post_early_answer(port, path, body, timeout=30):
    """POSTs a large body on a raw socket, reading the answer even when the server answers (413)
    and closes before the body is all sent (http.client gives up with EPIPE then)."""
    sk = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        sk.sendall(("POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    "Content-Length: %d\r\nConnection: close\r\n\r\n" %
                    (path, len(body))).encode())
        try:
            sk.sendall(body)
        except (BrokenPipeError, ConnectionResetError):
            pass
        got = b""
        try:
            while True:
                chunk = sk.recv(65536)
                if not chunk:
                    break
                got += chunk
        except (ConnectionResetError, socket.timeout):
            pass
    finally:
        sk.close()
    head, _, rest = got.partition(b"\r\n\r\n")
    status = int(head.split()[1]) if head.startswith(b"HTTP/") else 0
    return status, rest


def case_extras(model, tmp):
    # /health_generate: a real 1-token generation on each daemon and through the router
    pf, dc, rt = pc.start_cluster(BUILD, tmp, model)
    def probes_ok(d):
        for line in d.get("/metrics")[1].decode().split("\n"):
            if line.startswith("pdserve_health_generate_total") and 'result="ok"' in line:
                return int(float(line.split()[-1]))
        return None

    for d in (pf, dc, rt):
        before = probes_ok(d) if d is not rt else None
        st, body = d.get("/health_generate", timeout=30)
        check(st == 200, "%s /health_generate: %d %r" % (d.name, st, body[:200]))
        if d is not rt:
            after = probes_ok(d)
            check(before is not None and after == before + 1,
                  "%s /health_generate ran one generation (ok count %r -> %r)" %
                  (d.name, before, after))
    check(pf.pool_full(5) and dc.pool_full(5), "pools full after /health_generate")

    # logprobs through the router: SGLang return_logprob, OpenAI completions and chat
    step("logprobs")
    model_id = json.loads(rt.get("/v1/models")[1])["data"][0]["id"]
    text = "the quick brown fox jumps over the lazy dog"
    gen = subprocess.run([GENERATE, "--model-path", model, "--max-new-tokens", "8", "--threads",
                          "1", "--logprobs", "2", "--", text], capture_output=True, text=True,
                         check=True, timeout=60)
    m = re.search(r"sum logprob (-?[0-9.]+) over (\d+) tokens", gen.stdout + gen.stderr)
    st, raw = rt.post("/generate", {"text": text, "return_logprob": True, "top_logprobs_num": 2,
                                    "sampling_params": {"max_new_tokens": 8, "temperature": 0}})
    j = json.loads(raw) if st == 200 else {}
    mi = j.get("meta_info", {})
    otl, top = mi.get("output_token_logprobs", []), mi.get("output_top_logprobs", [])
    check(st == 200 and len(otl) == mi.get("completion_tokens") and
          [t[1] for t in otl] == j.get("output_ids"), "generate logprobs: %d %r" % (st, raw[:300]))
    check(all(t[0] <= 0 for t in otl), "logprobs are <= 0: %r" % otl)
    # greedy: the chosen token is the most likely one (the first token's top-n stays with the
    # prefill: the done notice carries its logprob only)
    check(all(top[i] and top[i][0][1] == otl[i][1] and abs(top[i][0][0] - otl[i][0]) < 1e-6
              for i in range(1, len(otl))), "greedy token is top-1: %r" % top)
    check(m and int(m.group(2)) == len(otl) and abs(float(m.group(1)) - sum(t[0] for t in otl))
          < 1e-3, "sum of logprobs %r vs pdserve-generate %r" %
          (sum(t[0] for t in otl), m and m.groups()))
    st, raw = rt.post("/v1/completions", {"prompt": text, "logprobs": 2, "max_tokens": 8,
                                          "temperature": 0, "stream": True})
    chunks = [json.loads(e) for e in pc.sse_events(raw)[:-1]]
    lps = [x for c in chunks for ch in c["choices"] if ch.get("logprobs")
           for x in ch["logprobs"]["token_logprobs"]]
    check(st == 200 and len(lps) == len(otl) and
          all(abs(a - b[0]) < 1e-6 for a, b in zip(lps, otl)),
          "streamed completion logprobs %r vs /generate's %r" % (lps, otl))
    st, raw = rt.post("/v1/chat/completions", {"model": model_id, "logprobs": True,
                                               "top_logprobs": 1, "max_tokens": 4,
                                               "temperature": 0, "messages": [
                                                   {"role": "user", "content": "hi"}]})
    j = json.loads(raw) if st == 200 else {}
    content = ((j.get("choices") or [{}])[0].get("logprobs") or {}).get("content")
    check(content is not None and len(content) == j["usage"]["completion_tokens"] and
          all(c["logprob"] <= 0 for c in content),
          "chat logprobs: %d %r" % (st, raw[:300]))
    # bad input: a 4xx OpenAI error JSON, from the router and from a daemon, and still serving
    step("bad input")
    big = b'{"prompt": "' + b"x" * (10 << 20) + b'", "max_tokens": 4}'
    bad = [("/generate", b"{not json"),
           ("/generate", json.dumps({"text": 5}).encode()),
           ("/v1/completions", json.dumps({"model": model_id, "max_tokens": 4}).encode()),
           ("/v1/chat/completions", json.dumps({"model": model_id, "max_tokens": 4}).encode()),
           ("/v1/chat/completions", json.dumps({"model": model_id, "messages": "hi"}).encode()),
           ("/v1/completions", json.dumps({"prompt": "hi", "max_tokens": -5}).encode()),
           ("/v1/completions", json.dumps({"prompt": "hi", "max_tokens": 10 ** 12}).encode()),
           ("/v1/completions", json.dumps({"prompt": "hi", "temperature": -0.5}).encode()),
           ("/v1/completions", json.dumps({"prompt": "word " * 5000}).encode()),
           ("/v1/completions", json.dumps({"model": "nope", "prompt": "hi"}).encode()),
           ("/generate", b'{"text": "\xff\xfe"}'),
           ("/v1/completions", big)]
    for target in (rt, dc):
        for path, b in bad:
            hdr = {} if target is rt else None
            if target is dc:  # a daemon needs the bootstrap fields to get past them
                try:
                    jb = json.loads(b)
                    if isinstance(jb, dict):
                        jb.update({"bootstrap_host": "127.0.0.1", "bootstrap_port": pf.bport,
                                   "bootstrap_room": 77})
                        b = json.dumps(jb).encode()
                except ValueError:
                    pass
            try:
                if len(b) > 1 << 20:
                    st, out = post_early_answer(target.port, path, b)
                else:
                    st, out = target.post(path, b, 60, headers=hdr)
            except OSError as e:
                st, out = 0, repr(e).encode()
            err = {}
            try:
                err = json.loads(out).get("error") or {}
            except ValueError:
                pass
            check(400 <= st < 500 and err.get("message") and err.get("type"),
                  "%s %s %r... -> %d %r" % (target.name, path, b[:50], st, out[:160]))
        check(pc.wait_until(lambda: target.get("/health")[0] == 200, 10, 0.1),
              "%s still serving after bad input" % target.name)
    check(one_ok(rt), "router serves after bad input")
    for proc in (rt, dc, pf):
        proc.terminate(30)

    # --max-queued-requests: the request past the bound gets 503 with an OpenAI error
    step("max-queued-requests")
    pf = pc.Daemon(BUILD, "prefill", model, tmp)
    dc = pc.Daemon(BUILD, "decode", model, tmp, ["--max-queued-requests", "2"])
    holders = []
    for i in range(2):  # no prefill body for these rooms: they wait in decode's transfer queue
        b = {"text": "hold %d" % i, "bootstrap_host": "127.0.0.1", "bootstrap_port": pf.bport,
             "bootstrap_room": 1000 + i, "rid": "hold-%d" % i}
        t = threading.Thread(target=lambda b=b: dc.post("/generate", b, 60))
        t.start()
        holders.append(t)
    check(pc.wait_until(lambda: dc.server_info()["live_requests"] >= 2, 10),
          "two requests held in decode")
    st, raw = dc.post("/generate", {"text": "one too many", "bootstrap_host": "127.0.0.1",
                                    "bootstrap_port": pf.bport, "bootstrap_room": 1002})
    err = json.loads(raw).get("error", {}) if raw.startswith(b"{") else {}
    check(st == 503 and "max-queued-requests" in err.get("message", ""),
          "past --max-queued-requests: %d %r" % (st, raw[:200]))
    for i in range(2):
        dc.post("/abort_request", {"rid": "hold-%d" % i})
    for t in holders:
        t.join(30)
    check(dc.pool_full(10), "decode pool full after the held requests were aborted")
    for proc in (dc, pf):
        proc.terminate(30)

    # --api-key on the daemons, and through a router that has the same key
    step("api-key")
    key = "sk-e2e-test"
    pf, dc, rt = pc.start_cluster(BUILD, tmp, model, ["--api-key", key], ["--api-key", key],
                                  ["--api-key", key])
    for d in (pf, dc, rt):
        st, raw = d.post("/generate", {"text": "hi"})
        check(st == 401 and b"error" in raw, "%s without a key: %d %r" % (d.name, st, raw[:120]))
        st, raw = d.post("/generate", {"text": "hi"}, headers={"Authorization": "Bearer nope"})
        check(st == 401, "%s with a wrong key: %d" % (d.name, st))
        check(d.get("/health")[0] == 200, "%s /health needs no key" % d.name)
    st, raw = pf.get("/server_info", headers={"Authorization": "Bearer " + key})
    check(st == 200, "prefill /server_info with the key: %d" % st)
    probe = {"text": "the river runs to the sea"}
    st, raw = rt.post("/generate", gen_body(probe, "generate", False),
                      headers={"Authorization": "Bearer " + key})
    check(st == 200 and json.loads(raw)["text"] == reference_one(model, probe),
          "through the router with the key: %d %r" % (st, raw[:200]))
    for proc in (rt, dc, pf):
        rc = proc.terminate(30)
        check(rc == 0, "%s SIGTERM exit %s" % (proc.name, rc))


def metric_values(srv, name):
    """{labels text: value} of every sample of name on srv's /metrics."""
    out = {}
    for line in srv.get("/metrics")[1].decode().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            key, _, v = line.rpartition(" ")
            out[key[len(name):]] = float(v)
    return out


def case_local(model, tmp):
    lmax = 24
    pf, dc, rt = pc.start_cluster(BUILD, tmp, model,
                                  router_extra=["--local-prefill-max-tokens", str(lmax)])
    info = json.loads(rt.get("/server_info")[1])
    check(info.get("local_prefill_max_tokens") == lmax, "router /server_info "
          "local_prefill_max_tokens: %r" % info.get("local_prefill_max_tokens"))
    rng = random.Random(5)
    prompts = make_prompts(rng)[::2]  # 25: texts and ids of every size
    ref = references(model, prompts)

    def est(p):  # the router's estimate (router/prompt_size.c) at the rate it has learned now
        if "ids" in p:
            return len(p["ids"])
        rate = rt.server_info()["local_prefill_bytes_per_token"]
        return math.ceil(len(p["text"].encode()) / rate)

    n_local = n_pd = 0
    streams = {"local": 0, "decode": 0}  # the router's hand-over stage of each path's streams
    for i, p in enumerate(prompts):
        for kind in ("generate", "completions"):
            for stream in (False, True):
                if est(p) <= lmax:
                    n_local += 1
                    streams["local"] += stream
                else:
                    n_pd += 1
                    streams["decode"] += stream
                st, raw = through(rt, kind, gen_body(p, kind, stream))
                ok = check(st == 200, "prompt %d (%s, est %d) %s stream=%s: HTTP %d %r" % (
                    i, "local" if est(p) <= lmax else "PD", est(p), kind, stream, st, raw[:200]))
                if ok:
                    text = text_of(kind, stream, raw)[0]
                    check(text == ref[i], "prompt %d (%s) %s stream=%s: %r != reference %r" % (
                        i, "local" if est(p) <= lmax else "PD", kind, stream, text, ref[i]))
    check(n_local >= 16 and n_pd >= 16, "both paths exercised: %d local, %d PD" % (n_local, n_pd))
    paths = metric_values(rt, "pdserve_router_path_requests_total")
    check(paths.get('{path="local"}') == n_local and paths.get('{path="pd"}') == n_pd,
          "router paths %r, want %d local and %d pd" % (paths, n_local, n_pd))
    lp = metric_values(dc, "pdserve_local_prefill_requests_total")
    check(list(lp.values()) == [n_local], "decode local prefills %r, want %d" % (lp, n_local))
    ho = rt.server_info()["handover"]
    check(all(ho.get(k, {}).get("count") == v for k, v in streams.items()) and
          ho["dispatch"]["count"] == ho["relay"]["count"] == sum(streams.values()),
          "router hand-over stages %r: want local and decode by the streams' paths %r" %
          (ho, streams))
    # 16 clients at once, both paths
    results = [None] * 16

    def client(i):
        p = prompts[i % len(prompts)]
        st, raw = through(rt, "generate", gen_body(p, "generate", True))
        results[i] = (st, text_of("generate", True, raw)[0] if st == 200 else raw[:200])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i, r in enumerate(results):
        check(r == (200, ref[i % len(prompts)]), "concurrent %d: %r" % (i, r))
    # abort a local stream through the router
    short = {"text": "abort me"}
    check(est(short) <= lmax, "the abort prompt is local")
    for attempt in range(5):
        s = Stream(rt.port, "/generate", {"text": short["text"], "stream": True,
                                          "rid": "local-abort-%d" % attempt,
                                          "sampling_params": {"max_new_tokens": 1500,
                                                              "temperature": 0,
                                                              "ignore_eos": True}})
        s.read_events(3)
        st, out = rt.post("/abort_request", {"rid": "local-abort-%d" % attempt})
        took, ended = s.read_rest(15)
        s.close()
        if attempt < 4 and b'"type":"length"' in s.got:
            continue  # the tiny model finished first
        check(st == 200 and ended and b"[DONE]" in s.got,
              "local abort: %d %r, stream ended %s" % (st, out[:200], ended))
        break
    check(pf.pool_full() and dc.pool_full(), "pools back to full")
    # the prefill dies: local prompts are still served, the others fail with an error
    pf.p.kill()
    pf.p.wait()
    small = next(p for p in prompts if est(p) <= lmax)
    big = next(p for p in prompts if est(p) > lmax)
    st, raw = through(rt, "generate", gen_body(small, "generate", False))
    check(st == 200 and text_of("generate", False, raw)[0] == ref[prompts.index(small)],
          "local prompt with the prefill dead: %d %r" % (st, raw[:200]))
    st, raw = through(rt, "generate", gen_body(big, "generate", False), timeout=60)
    check(st >= 500, "PD prompt with the prefill dead: %d %r" % (st, raw[:200]))
    check(dc.pool_full(), "decode pool back to full")


# ---------------------------------------------------------------- the local path's cases

GREEK = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho "
         "sigma tau upsilon phi chi psi omega").split()


def word_text(rng, n):
    """n words of GREEK, space-separated: text the tiny tokenizer makes about 1.6 bytes a token."""
    return " ".join(rng.choice(GREEK) for _ in range(n))


def held_tokens(dc):
    """Prompt tokens the decode served from its own prefix cache so far."""
    return sum(metric_values(dc, "pdserve_decode_prefix_cache_hit_tokens_total").values())


def send_on_path(rt, kind, stream, prompt, ref, path, what):
    """Sends prompt through the router; checks the text against ref and that the router's
    pdserve_router_path_requests_total{path} went up by one. Returns (status, text or None)."""
    before = metric_values(rt, "pdserve_router_path_requests_total")
    st, raw = through(rt, kind, gen_body(prompt, kind, stream))
    got = text_of(kind, stream, raw)[0] if st == 200 else None
    check(got == ref, "%s: %d %r != %r" % (what, st, raw[:200], ref))
    after = metric_values(rt, "pdserve_router_path_requests_total")
    key = '{path="%s"}' % path
    check(after.get(key, 0) == before.get(key, 0) + 1,
          "%s took the other path: %r -> %r, want %s" % (what, before, after, path))
    return st, got


def case_local_capability(model, tmp):
    """The router's local path is on by default (--local-prefill-max-tokens 256), for the
    decodes whose /get_load says "local_prefill": true only: a decode started with
    --local-prefill=false (refusing bodies without bootstrap fields, as SGLang's decode does)
    gets a short prompt on the PD path, and a decode that comes back with the local path on is
    asked again and gets it alone, from the first request once the router is ready again (a
    decode joins rotation once its /get_load answered). Texts equal pdserve-generate's."""
    prompt = {"text": "a short prompt"}
    ref = references(model, [prompt])[0]
    pf = pc.Daemon(BUILD, "prefill", model, tmp)
    dc = pc.Daemon(BUILD, "decode", model, tmp, ("--local-prefill=false",))
    dport = dc.port
    load = json.loads(dc.get("/get_load")[1])
    check("local_prefill" not in load, "decode --local-prefill=false: /get_load %r" % load)
    rt = pc.Router(BUILD, [(pf.port, pf.bport)], [dport], tmp)
    check(rt.server_info().get("local_prefill_max_tokens") == 256,
          "router default local_prefill_max_tokens: %r" %
          rt.server_info().get("local_prefill_max_tokens"))

    def decode_entry():
        ws = json.loads(rt.get("/workers")[1])["workers"]
        return next((w for w in ws if w["worker_type"] == "decode"), {})

    check(decode_entry().get("local_prefill") is False,
          "/workers: the decode without --local-prefill: %r" % decode_entry())
    st, raw = dc.post("/generate", gen_body(prompt, "generate", False))
    check(st == 400, "that decode refuses a body without bootstrap fields: %d %r" % (st, raw[:200]))
    for kind in ("generate", "completions"):
        send_on_path(rt, kind, False, prompt, ref, "pd", "%s to a decode without the local path"
                     % kind)
    lp = metric_values(dc, "pdserve_local_prefill_requests_total")
    check(list(lp.values()) == [0], "that decode prefilled nothing: %r" % lp)

    # the same decode port, now with the local path on (its default)
    dc.kill()
    check(pc.wait_until(lambda: rt.get("/health", timeout=5)[0] == 503, 30, 0.05),
          "the router saw the decode go")
    dc = pc.Daemon(BUILD, "decode", model, tmp, port=dport)
    check(json.loads(dc.get("/get_load")[1]).get("local_prefill") is True,
          "decode --local-prefill: /get_load says local_prefill")
    check(router_healthy(rt), "router healthy once the decode is back")
    send_on_path(rt, "generate", True, prompt, ref, "local",
                 "the first request after the decode came back with the local path")
    check(decode_entry().get("local_prefill") is True,
          "/workers: the decode with --local-prefill: %r" % decode_entry())
    lp = metric_values(dc, "pdserve_local_prefill_requests_total")
    check(list(lp.values()) == [1], "the decode prefilled it: %r" % lp)
    check(pf.pool_full() and dc.pool_full(), "pools back to full")


def case_local_cached(model, tmp):
    """--decode-policy cache_aware with --local-prefill-max-tokens: a follow-up whose prompt
    repeats an earlier one goes to the decode alone when what the decode is not likely to hold
    (the part of the text its tree did not match) is within the limit, however long the whole
    prompt; the decode's own prefix cache serves the repeated pages, so it computes only the
    rest. Texts equal pdserve-generate's; a new long prompt still takes the PD path."""
    lmax = 24
    pf, dc, rt = pc.start_cluster(BUILD, tmp, model, router_extra=[
        "--local-prefill-max-tokens", str(lmax), "--decode-policy", "cache_aware"])
    rng = random.Random(9)

    def text(n):
        return word_text(rng, n)

    first = [text(60), text(70)]           # ~90-100 estimated tokens each: PD
    follow = [f + " " + text(6) for f in first]  # a few more words: local
    fresh = text(65)                       # nothing matched: PD
    prompts = [{"text": t} for t in first + follow + [fresh]]
    ref = references(model, prompts)
    want = ["pd", "pd", "local", "local", "pd"]
    held0 = held_tokens(dc)

    def send(i, path):
        send_on_path(rt, "generate", False, prompts[i], ref[i], path,
                     "prompt %d (%d bytes)" % (i, len(prompts[i]["text"])))

    for i in range(len(prompts)):
        send(i, want[i])
    held = held_tokens(dc)
    check(held - held0 >= 2 * 16, "the local follow-ups held %d tokens of the decode's cache" %
          (held - held0))
    step("POST /flush_cache: the router forgets what the flushed workers held")
    st, raw = rt.post("/flush_cache", "{}", 30)
    check(st == 200, "flush_cache: %d %r" % (st, raw[:200]))
    send(2, "pd")  # its prefix no longer counts as held: the whole prompt is over the limit
    check(pf.pool_full() and dc.pool_full(), "pools back to full")


def case_local_answer(model, tmp):
    """With --decode-policy cache_aware the router records a finished request's prompt and
    answer text for its decode, which caches both: a follow-up turn that repeats them and adds
    two words goes to that decode alone, though the answer's share alone is over the limit.
    Once after a streamed first turn (its last event's text), once after a non-streamed one.
    Texts equal pdserve-generate's; the decode serves the follow-ups from its own cache."""
    lmax, first_new = 24, 48
    pf, dc, rt = pc.start_cluster(BUILD, tmp, model, router_extra=[
        "--local-prefill-max-tokens", str(lmax), "--decode-policy", "cache_aware"])
    rng = random.Random(13)

    def text(n):
        return word_text(rng, n)

    first = [text(60), text(70)]
    ref1 = references(model, [{"text": t} for t in first], max_new=first_new)
    held0 = held_tokens(dc)
    for i, stream in enumerate((True, False)):
        st, raw = through(rt, "generate", gen_body({"text": first[i]}, "generate", stream,
                                                   max_new=first_new))
        got = text_of("generate", stream, raw)[0] if st == 200 else None
        check(got == ref1[i], "turn 1 (stream %s): %d %r != %r" % (stream, st, raw[:200], ref1[i]))
        follow = {"text": first[i] + (got or "") + " " + text(2)}
        send_on_path(rt, "generate", False, follow, reference_one(model, follow), "local",
                     "turn 2 after a %s first turn" % ("streamed" if stream else "non-streamed"))
    held = held_tokens(dc)
    check(held - held0 >= 2 * 16, "the follow-ups held %d tokens of the decode's cache" %
          (held - held0))
    check(pf.pool_full() and dc.pool_full(), "pools back to full")


def case_prompt_mismatch(model, tmp):
    """A decode that renders chat prompts differently (its chat template puts a system line
    first) states another prompt length in its Transfer than the prefill computed: the request
    fails with an error naming both counts, nothing hangs, and a request both tokenize alike
    (token ids) is served right after, with pdserve-generate's text; pools back to full."""
    other = os.path.join(tmp, "model-other-template")
    shutil.copytree(model, other)
    cfg_path = os.path.join(other, "tokenizer_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    check(cfg.get("chat_template"), "the test model has a chat template")
    cfg["chat_template"] = "system line one two three\n" + cfg["chat_template"]
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    pf = pc.Daemon(BUILD, "prefill", model, tmp)
    dc = pc.Daemon(BUILD, "decode", other, tmp)
    rt = pc.Router(BUILD, [(pf.port, pf.bport)], [dc.port], tmp,
                   pc.PD_PATH_ONLY + ["--disable-retries"])
    st, raw = rt.post("/v1/chat/completions",
                      {"messages": [{"role": "user", "content": "alpha beta gamma"}],
                       "max_tokens": 8, "temperature": 0}, 60)
    check(st >= 500 and b"tokenized the prompt to" in raw and b"same tokenizer" in raw,
          "a chat prompt rendered differently: %d %r" % (st, raw[:400]))
    ids = {"ids": [5, 17, 29, 41, 53, 65, 77, 89, 101, 113]}
    ref = reference_one(model, ids)
    st, raw = through(rt, "generate", gen_body(ids, "generate", False), timeout=60)
    check(st == 200 and text_of("generate", False, raw)[0] == ref,
          "token ids after the mismatch: %d %r != %r" % (st, raw[:200], ref))
    check(pf.pool_full() and dc.pool_full(), "pools back to full")


def case_local_estimate(model, tmp):
    """The router's token estimate learns from the decodes' answers: digits separated by spaces
    run about 1 byte a token with this tokenizer, not the 4 the router assumes at first. The first
    such prompt (about 200 tokens, estimated 50) goes local; its answer, a stream whose first
    event reports prompt_tokens, moves the rate near 1 (/server_info), and the next prompt of the
    same size takes the PD path. A non-stream answer (usage) counts as well. Texts equal
    pdserve-generate's either way."""
    lmax = 60
    pf, dc, rt = pc.start_cluster(BUILD, tmp, model, router_extra=[
        "--local-prefill-max-tokens", str(lmax)])
    rng = random.Random(5)
    prompts = [{"text": " ".join(str(rng.randrange(10)) for _ in range(100))} for _ in range(3)]
    ref = references(model, prompts)

    def rate():
        info = rt.server_info()
        return info["local_prefill_bytes_per_token"], info["local_prefill_rate_answers"]

    check(rate() == (4.0, 0), "the rate before any answer: %r" % (rate(),))
    for i, (kind, stream, path) in enumerate([("generate", True, "local"),
                                              ("completions", False, "pd"),
                                              ("generate", False, "pd")]):
        send_on_path(rt, kind, stream, prompts[i], ref[i], path, "prompt %d (%d bytes, rate %r)"
                     % (i, len(prompts[i]["text"]), rate()))
        bpt, answers = rate()
        check(answers == i + 1 and 1.0 <= bpt <= 1.1,
              "after answer %d the rate is %r bytes a token from %r answers" %
              (i + 1, bpt, answers))
    check(pf.pool_full() and dc.pool_full(), "pools back to full")


def case_restart_prefill(model, tmp):
    slow_ka = dict(os.environ, UCX_KEEPALIVE_INTERVAL="60s")  # the old prefill's death unseen
    pf = pc.Daemon(BUILD, "prefill", model, tmp)
    dc = pc.Daemon(BUILD, "decode", model, tmp, env=slow_ka)
    rt = pc.Router(BUILD, [(pf.port, pf.bport)], [dc.port], tmp, ["--disable-retries"])
    check(one_ok(rt), "served before the restart (decode paired)")
    step("SIGKILL of prefill, restarted on its ports at once")
    pf.kill()
    pf.start(60)
    check(router_healthy(rt), "router healthy once the prefill is back")
    outcomes = [one_ok(rt, timeout=20) for _ in range(6)]
    step("   requests after the restart, in order: %s" % outcomes)
    check(all(outcomes[1:]), "every request after the first is served (decode paired again "
          "after one refusal): %s" % outcomes)
    with open(dc.log_path, errors="replace") as f:
        log = f.read()
    check(not outcomes[0] or "pairing again" not in log,
          "the first request failed only if decode had to pair again")
    check(pf.pool_full(10) and dc.pool_full(10), "pools full at the end")


def main():
    tmp = pc.tmpdir()
    model = pc.make_model(BUILD, tmp)
    cases = {"tokens": case_tokens, "failures": case_failures, "kill_decode": case_kill_decode,
             "startup": case_startup, "extras": case_extras,
             "restart_prefill": case_restart_prefill, "local": case_local,
             "local_capability": case_local_capability,
             "local_cached": case_local_cached, "local_estimate": case_local_estimate,
             "local_answer": case_local_answer, "prompt_mismatch": case_prompt_mismatch}
    pc.run_test("pd_router %s" % CASE, lambda: cases[CASE](model, tmp), tmp)


if __name__ == "__main__":
    main()
