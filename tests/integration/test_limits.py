#!/usr/bin/env python3
"""test_limits.py — the request limits of the daemons (docs/running.md "Limits") and what the
logs leave out, against real processes on 127.0.0.1 with the tiny model of pdserve-mkmodel.

Case `limits`:
  * a colocated daemon with --context-length 200 --max-n 3: a prompt of 200 or more tokens is
    400 context_length_exceeded naming both lengths and --context-length; prompt + max_tokens
    (max_completion_tokens, sampling_params.max_new_tokens) over 200 is 400 naming the total,
    both parts and --context-length, while exactly 200 is served with every requested token;
    max_tokens negative / zero (chat) / past 2^31 is 400 naming the field and its range; n 4 is
    400 naming [1, 3] and --max-n, n 3 answers three choices; 70 kB of headers is 431 naming both
    sizes; a body over 8 MiB is 413 naming the limit.
  * a prefill daemon with --max-concurrent-requests-per-client 2 (its requests wait for a decode
    that never comes, so they stay in flight): the third from 127.0.0.1 is 429 with
    Retry-After: 1 naming the numbers and the flag, /health and /server_info are not counted,
    127.0.0.2 has its own budget; a request aborted (/abort_request) and a client that leaves
    both give their slot back.
  * every binary's --help documents --max-n and --max-concurrent-requests-per-client.

Case `secrets`: a prefill, a decode and a router with --api-key and --cluster-key, a colocated
daemon with --api-key, and a decode with another cluster key, all at --log-level info (the
default), get requests carrying a distinctive prompt — served ones (streamed and not), and
failing ones: wrong and missing API key, bad JSON, invalid UTF-8, too long a prompt, n over the
limit, a client leaving mid-stream, a decode refused at pairing for its wrong cluster key. No
process's log holds either key, the wrong ones, the prompt or the generated text; the logs do
hold the events (the requests' rids, the refused pairing), so the check is not vacuous.

Stdlib only. Usage: test_limits.py BUILD_DIR limits|secrets.
"""
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pd_cluster as pc  # noqa: E402
from pd_cluster import check, step  # noqa: E402

BUILD = os.path.abspath(sys.argv[1])
CASE = sys.argv[2] if len(sys.argv) > 2 else "limits"
CTX = 200
MAX_N = 3


def call(port, method, path, body=None, headers=None, src="127.0.0.1", timeout=60):
    """(status, {lowercase header: value}, body bytes) of one request from address src."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout, source_address=(src, 0))
    try:
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        c.request(method, path, data, h)
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def error_of(raw):
    try:
        e = json.loads(raw)["error"]
        return e if isinstance(e, dict) else {}
    except (ValueError, KeyError, TypeError):
        return {}


def refused(srv, path, body, status, what, code=None, param=None, message=None, words=()):
    """srv answers body with status and an OpenAI error whose code/param/message are as given
    (message: exact; words: substrings). The error, or {}."""
    st, _, raw = call(srv.port, "POST", path, body)
    e = error_of(raw)
    ok = check(st == status and e, "%s: %d %r (want %d)" % (what, st, raw[:300], status))
    if ok and code is not None:
        check(e.get("code") == code, "%s: code %r, want %r" % (what, e.get("code"), code))
    if ok and param is not None:
        check(e.get("param") == param, "%s: param %r, want %r" % (what, e.get("param"), param))
    if ok and message is not None:
        check(e.get("message") == message, "%s: message\n  %r\nwant\n  %r" %
              (what, e.get("message"), message))
    for w in words:
        check(w in e.get("message", ""), "%s: message %r lacks %r" % (what, e.get("message"), w))
    return e


# ---------------------------------------------------------------- case limits


def ids(n, base=7):
    return [(base + 13 * i) % 900 + 20 for i in range(n)]


def context_limits(co):
    step("context length %d" % CTX)
    for n in (CTX, CTX + 50):
        refused(co, "/v1/completions", {"prompt": ids(n), "max_tokens": 1}, 400,
                "%d-token prompt" % n, "context_length_exceeded", "prompt",
                "The input (%d tokens) is longer than the model's context length (%d tokens, "
                "--context-length)." % (n, CTX))
    refused(co, "/generate", {"input_ids": ids(CTX + 1), "sampling_params": {"max_new_tokens": 1}},
            400, "/generate prompt too long", "context_length_exceeded", "input_ids",
            words=("(%d tokens)" % (CTX + 1), "(%d tokens, --context-length)" % CTX))

    def total_msg(n_in, n_out):
        return ("Requested token count exceeds the model's maximum context length of %d tokens "
                "(--context-length). You requested a total of %d tokens: %d tokens from the input "
                "and %d tokens for the completion. Please reduce the input or the completion to "
                "fit within the limit." % (CTX, n_in + n_out, n_in, n_out))

    refused(co, "/v1/completions", {"prompt": ids(150), "max_tokens": 51}, 400,
            "150 + max_tokens 51", "context_length_exceeded", "max_tokens", total_msg(150, 51))
    refused(co, "/generate", {"input_ids": ids(150),
                              "sampling_params": {"max_new_tokens": 60}}, 400,
            "150 + max_new_tokens 60", "context_length_exceeded",
            "sampling_params.max_new_tokens", total_msg(150, 60))
    n_chat = None
    st, _, raw = call(co.port, "POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "count the stars"}], "max_tokens": 1})
    if check(st == 200, "short chat: %d %r" % (st, raw[:200])):
        n_chat = json.loads(raw)["usage"]["prompt_tokens"]
        refused(co, "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "count the stars"}],
            "max_completion_tokens": CTX - n_chat + 1}, 400, "chat max_completion_tokens",
            "context_length_exceeded", "max_tokens", total_msg(n_chat, CTX - n_chat + 1))
    refused(co, "/v1/completions", {"prompt": ids(10), "max_tokens": 2 ** 31 - 1}, 400,
            "max_tokens 2^31-1", "context_length_exceeded", "max_tokens",
            total_msg(10, 2 ** 31 - 1))
    # exactly the context: served, every token generated
    st, _, raw = call(co.port, "POST", "/v1/completions", {
        "prompt": ids(150), "max_tokens": 50, "ignore_eos": True, "temperature": 0})
    u = json.loads(raw).get("usage", {}) if st == 200 else {}
    check(st == 200 and (u.get("prompt_tokens"), u.get("completion_tokens")) == (150, 50),
          "150 + 50 = the context: served whole: %d %r" % (st, raw[-300:]))
    st, _, raw = call(co.port, "POST", "/v1/completions", {
        "prompt": ids(CTX - 1), "max_tokens": 1, "ignore_eos": True})
    check(st == 200 and json.loads(raw)["usage"]["completion_tokens"] == 1,
          "%d + 1 = the context: served: %d %r" % (CTX - 1, st, raw[-200:]))
    # chat without max_tokens: the rest of the context, not a refusal
    if n_chat:
        st, _, raw = call(co.port, "POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "count the stars"}], "ignore_eos": True,
            "temperature": 0})
        check(st == 200 and json.loads(raw)["usage"]["completion_tokens"] == CTX - n_chat,
              "chat without max_tokens: the rest of the context (%d): %d %r" %
              (CTX - n_chat, st, raw[-200:]))


def max_tokens_limits(co):
    step("max_tokens range")
    refused(co, "/v1/completions", {"prompt": "a", "max_tokens": -1}, 400, "max_tokens -1",
            param="max_tokens",
            message="'max_tokens' is -1: must be in [0, 2147483647]")
    refused(co, "/v1/completions", {"prompt": "a", "max_tokens": 0}, 400, "max_tokens 0",
            param="max_tokens", words=("'max_tokens' 0 needs 'echo': true",))
    refused(co, "/v1/completions", {"prompt": "a", "max_tokens": 2 ** 31}, 400,
            "max_tokens 2^31", param="max_tokens",
            message="'max_tokens' is 2147483648: must be in [0, 2147483647]")
    msgs = [{"role": "user", "content": "hi"}]
    refused(co, "/v1/chat/completions", {"messages": msgs, "max_tokens": 0}, 400,
            "chat max_tokens 0", param="max_tokens",
            message="'max_tokens' is 0: must be in [1, 2147483647]")
    refused(co, "/v1/chat/completions", {"messages": msgs, "max_completion_tokens": -5}, 400,
            "chat max_completion_tokens -5", param="max_completion_tokens",
            message="'max_completion_tokens' is -5: must be in [1, 2147483647]")
    refused(co, "/generate", {"text": "a", "sampling_params": {"max_new_tokens": -1}}, 400,
            "max_new_tokens -1", param="sampling_params.max_new_tokens",
            message="'sampling_params.max_new_tokens' is -1: must be in [0, 2147483647]")


def n_limits(co):
    step("--max-n %d" % MAX_N)
    for path, body, param in (
            ("/v1/completions", {"prompt": "a", "max_tokens": 2, "n": MAX_N + 1}, "n"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}],
                                      "max_tokens": 2, "n": MAX_N + 1}, "n"),
            ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": 2,
                                                            "n": MAX_N + 1}},
             "sampling_params.n")):
        refused(co, path, body, 400, "%s n %d" % (path, MAX_N + 1), param=param,
                message="'%s' is %d: must be in [1, %d] (at most --max-n samples per prompt)" %
                (param, MAX_N + 1, MAX_N))
    st, _, raw = call(co.port, "POST", "/v1/completions", {"prompt": "a", "max_tokens": 2,
                                                           "n": MAX_N, "temperature": 0.5})
    check(st == 200 and [c["index"] for c in json.loads(raw)["choices"]] == list(range(MAX_N)),
          "n = --max-n: %d choices: %d %r" % (MAX_N, st, raw[:300]))


def http_limits(srv, what):
    step("%s: header and body limits" % what)
    st, _, raw = call(srv.port, "GET", "/v1/models", headers={"X-Pad": "p" * 70000})
    e = error_of(raw)
    sizes = [int(x) for x in re.findall(r"\d+", e.get("message", ""))]
    check(st == 431 and e.get("code") == "request_header_fields_too_large" and
          sizes[-1:] == [65536] and len(sizes) == 2 and 70000 < sizes[0] < 70300,
          "%s: 70 kB of headers: 431 naming both sizes: %d %r" % (what, st, raw[:300]))
    head, body = pc.oversized_body_answer(srv.port, "/v1/completions", (8 << 20) + 1)
    raw = head + b"\r\n\r\n" + body
    check(head.startswith(b"HTTP/1.1 413") and error_of(body).get("message") ==
          "The request body is larger than the limit of 8388608 bytes.",
          "%s: a body over 8 MiB: 413 naming the limit: %r" % (what, raw[:400]))


def per_client_limit(model, tmp):
    step("--max-concurrent-requests-per-client 2 on a prefill daemon")
    pf = pc.Daemon(BUILD, "prefill", model, tmp, ["--max-concurrent-requests-per-client", "2",
                                                  "--bootstrap-timeout", "60"])
    room = [1000]

    def body(rid):
        room[0] += 1
        return {"text": "wait for a decode", "rid": rid, "sampling_params": {"max_new_tokens": 2},
                "bootstrap_host": "127.0.0.1", "bootstrap_port": pf.bport,
                "bootstrap_room": room[0]}

    answers = {}

    def held(rid, src="127.0.0.1"):
        b = body(rid)
        t = threading.Thread(target=lambda: answers.__setitem__(
            rid, call(pf.port, "POST", "/generate", b, src=src, timeout=90)[0]), daemon=True)
        t.start()
        return t

    def live(n):
        return pc.wait_until(lambda: pf.server_info().get("live_requests") == n, 15)

    ta, tb = held("h-a"), held("h-b")
    check(live(2), "two requests in flight on the prefill")
    st, hdrs, raw = call(pf.port, "POST", "/generate", body("h-c"))
    check(st == 429 and hdrs.get("retry-after") == "1" and error_of(raw).get("message") ==
          "Too many concurrent requests from 127.0.0.1: 2 in flight, the limit is 2 per client "
          "address (--max-concurrent-requests-per-client). Retry once one has finished.",
          "third from 127.0.0.1: 429 with Retry-After naming the limit: %d %r %r" %
          (st, hdrs.get("retry-after"), raw[:300]))
    check(error_of(raw).get("code") == "rate_limit_exceeded", "429 code: %r" % raw[:200])
    for path in ("/health", "/server_info", "/get_load"):
        st = call(pf.port, "GET", path)[0]
        check(st == 200, "%s is not counted per client: %d" % (path, st))
    tc = held("h-d", src="127.0.0.2")
    check(live(3), "127.0.0.2 has its own budget: its request is admitted")
    # aborted: the request ends, its slot comes back
    st, _, raw = call(pf.port, "POST", "/abort_request", {"rid": "h-a"})
    check(st == 200, "abort_request: %d %r" % (st, raw[:200]))
    ta.join(30)
    check(answers.get("h-a") is not None, "the aborted request was answered: %r" % answers)
    td = held("h-e")
    check(live(3), "after the abort, 127.0.0.1 gets a request in again")
    check(call(pf.port, "POST", "/generate", body("h-f"))[0] == 429, "and is at its limit again")
    # a client that leaves: its slot comes back
    s = socket.create_connection(("127.0.0.1", pf.port), timeout=15)
    raw = json.dumps(body("h-g")).encode()
    for t in (tb, td):  # end the two in flight from 127.0.0.1 first: then h-g gets in
        call(pf.port, "POST", "/abort_request", {"rid": "h-b" if t is tb else "h-e"})
        t.join(30)
    s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(raw), raw))
    check(live(2), "h-g admitted (with 127.0.0.2's h-d)")
    th = held("h-h")
    check(live(3), "h-h admitted: 127.0.0.1 at its limit")
    check(call(pf.port, "POST", "/generate", body("h-i"))[0] == 429, "h-i refused at the limit")
    s.close()
    check(live(2), "the client of h-g left: its request ended")
    tj = held("h-j")
    check(live(3), "its slot is free again: h-j admitted")
    for rid in ("h-d", "h-h", "h-j"):
        call(pf.port, "POST", "/abort_request", {"rid": rid})
    for t in (tc, th, tj):
        t.join(30)
    check(pf.pool_full(), "prefill pool full after the aborts")


def help_documents():
    for binary in ("prefill/pdserve-prefill", "decode/pdserve-decode", "router/pdserve-router"):
        r = subprocess.run([os.path.join(BUILD, binary), "--help"], capture_output=True,
                           text=True, timeout=30)
        for flag in ("--max-n N", "--max-concurrent-requests-per-client N"):
            check(r.returncode == 0 and flag in r.stdout, "%s --help documents %s" %
                  (os.path.basename(binary), flag))


def run_limits(model, tmp):
    help_documents()
    co = pc.Coloc(BUILD, model, tmp, ["--context-length", str(CTX), "--max-n", str(MAX_N)])
    check(co.server_info().get("context_length") == CTX, "--context-length %d applied" % CTX)
    context_limits(co)
    max_tokens_limits(co)
    n_limits(co)
    http_limits(co, "colocated")
    check(co.pool_full(), "colocated pool full after the refusals")
    per_client_limit(model, tmp)


# ---------------------------------------------------------------- case secrets

API_KEY = "sk-limits-3c9f1d7e2ab4"
WRONG_API_KEY = "sk-wrong-8d2e6b0c4f91"
CLUSTER_KEY = "cluster-secret-5a7e2c9d1b3f"
WRONG_CLUSTER_KEY = "cluster-wrong-0f4b8e6a2d7c"
PROMPT = "Zanzibar quokka marmalade 4711 lighthouse"  # nothing in a log says this
SECRETS = (API_KEY, WRONG_API_KEY, CLUSTER_KEY, WRONG_CLUSTER_KEY, PROMPT, "Zanzibar quokka",
           "marmalade 4711")


def secret_requests(pf, dc, rt, co, wrong, tmp):
    auth = {"Authorization": "Bearer " + API_KEY}
    bad_auth = {"Authorization": "Bearer " + WRONG_API_KEY}
    generated = []
    msgs = [{"role": "user", "content": PROMPT}]
    step("served requests through the router and the colocated daemon")
    for srv in (rt, co):
        for path, body in (
                ("/v1/chat/completions", {"messages": msgs, "max_tokens": 24, "temperature": 0,
                                          "ignore_eos": True, "rid": "sec-chat"}),
                ("/v1/completions", {"prompt": PROMPT, "max_tokens": 24, "temperature": 0,
                                     "ignore_eos": True, "rid": "sec-cmpl"}),
                ("/generate", {"text": PROMPT, "rid": "sec-gen", "sampling_params": {
                    "max_new_tokens": 24, "temperature": 0, "ignore_eos": True}})):
            st, _, raw = call(srv.port, "POST", path, body, headers=auth)
            if check(st == 200, "%s %s: %d %r" % (srv.name, path, st, raw[:200])):
                j = json.loads(raw)
                text = (j["text"] if path == "/generate" else
                        j["choices"][0].get("text") or j["choices"][0]["message"]["content"])
                generated.append(text)
            body = dict(body, stream=True)
            st, _, raw = call(srv.port, "POST", path, body, headers=auth)
            check(st == 200 and raw.rstrip().endswith(b"data: [DONE]"),
                  "%s %s stream: %d %r" % (srv.name, path, st, raw[-200:]))
        st, _, raw = call(srv.port, "POST", "/tokenize", {"prompt": PROMPT}, headers=auth)
        check(st == 200, "%s /tokenize: %d" % (srv.name, st))

    step("failing requests")
    for srv in (rt, pf, dc, co):
        for h in (bad_auth, {}):
            st, _, raw = call(srv.port, "POST", "/v1/chat/completions",
                              {"messages": msgs, "max_tokens": 4}, headers=h)
            check(st == 401, "%s with a %s key: %d" % (srv.name, "wrong" if h else "missing", st))
    for srv in (rt, co):
        bad = ('{"messages": [{"role": "user", "content": "%s"}], "max_tokens": ' % PROMPT).encode()
        st, _, raw = call(srv.port, "POST", "/v1/chat/completions", bad, headers=auth)
        check(st == 400, "%s bad JSON: %d %r" % (srv.name, st, raw[:200]))
        utf = ('{"prompt": "%s \xff", "max_tokens": 2}' % PROMPT).encode("latin-1")
        st, _, raw = call(srv.port, "POST", "/v1/completions", utf, headers=auth)
        check(st == 400, "%s invalid UTF-8: %d %r" % (srv.name, st, raw[:200]))
        for stream in (False, True):
            st, _, raw = call(srv.port, "POST", "/v1/completions", {
                "prompt": (PROMPT + " ") * 400, "max_tokens": 4, "stream": stream,
                "rid": "sec-long"}, headers=auth)
            check(st == 400, "%s prompt longer than the context (stream %s): %d %r" %
                  (srv.name, stream, st, raw[:200]))
        st, _, raw = call(srv.port, "POST", "/v1/completions", {
            "prompt": PROMPT, "max_tokens": 4, "n": 1000}, headers=auth)
        check(st == 400, "%s n 1000: %d %r" % (srv.name, st, raw[:200]))
        st, _, raw = call(srv.port, "POST", "/v1/completions", {
            "prompt": PROMPT, "max_tokens": 4, "temperature": -3}, headers=auth)
        check(st == 400, "%s temperature -3: %d %r" % (srv.name, st, raw[:200]))
    st, _, raw = call(pf.port, "POST", "/generate", {"text": PROMPT}, headers=auth)
    check(st == 400, "prefill without bootstrap fields: %d" % st)
    # a client that leaves mid-stream
    for srv in (rt, co):
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
        raw = json.dumps({"prompt": PROMPT, "max_tokens": 150, "ignore_eos": True,
                          "stream": True, "rid": "sec-gone"}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" %
                  (API_KEY.encode(), len(raw), raw))
        first = s.recv(4096)
        check(first.startswith(b"HTTP/1.1 200"), "%s stream started: %r" % (srv.name, first[:80]))
        s.close()
    # a decode whose cluster key the prefill refuses
    st, _, raw = call(wrong.port, "POST", "/generate", {
        "text": PROMPT, "rid": "sec-wrong-key", "sampling_params": {"max_new_tokens": 4},
        "bootstrap_host": "127.0.0.1", "bootstrap_port": pf.bport, "bootstrap_room": 4242},
        headers=auth, timeout=60)
    check(st != 200 or b"error" in raw, "wrong cluster key: the request fails: %d %r" %
          (st, raw[:300]))
    check(pc.wait_until(lambda: "wrong cluster key" in pf.log_tail(1 << 20), 10),
          "the prefill logs the refused pairing (without the key)")
    check(pf.pool_full() and dc.pool_full() and co.pool_full(), "pools full after it all")
    return [g for g in generated if len(g) >= 16]


def run_secrets(model, tmp):
    os.environ["PD_TEST_LOG_LEVEL"] = "info"  # the default; a developer's debug must not leak in
    key_file = os.path.join(tmp, "cluster.key")
    wrong_file = os.path.join(tmp, "wrong.key")
    for path, key in ((key_file, CLUSTER_KEY), (wrong_file, WRONG_CLUSTER_KEY)):
        with open(path, "w") as f:
            f.write(key + "\n")
    common = ["--api-key", API_KEY, "--cluster-key", key_file]
    pf, dc, rt = pc.start_cluster(BUILD, tmp, model, common, common, ["--api-key", API_KEY])
    for p in (pf, dc, rt):
        p.auth = {"Authorization": "Bearer " + API_KEY}
    co = pc.Coloc(BUILD, model, tmp, ["--api-key", API_KEY])
    co.auth = dict(pf.auth)
    wrong = pc.Daemon(BUILD, "decode", model, tmp, ["--api-key", API_KEY, "--cluster-key",
                                                    wrong_file])
    wrong.name = "decode-wrong-key"
    generated = secret_requests(pf, dc, rt, co, wrong, tmp)
    check(len(generated) >= 4, "answers long enough to look for: %r" % generated)
    step("stopping every process; reading their logs")
    for p in (rt, co, wrong, dc, pf):
        check(p.terminate() == 0, "%s exits 0 on SIGTERM" % p.name)
    logs = {}
    for f in sorted(os.listdir(tmp)):
        if f.endswith(".log"):
            with open(os.path.join(tmp, f), errors="replace") as fh:
                logs[f] = fh.read()
    check(len(logs) == 5, "five process logs: %s" % sorted(logs))
    for f, text in logs.items():
        for s in SECRETS + tuple(generated):
            check(s not in text, "%s holds %r" % (f, s[:40]))
        check(re.search(r"(?i)authorization|bearer ", text) is None,
              "%s mentions the Authorization header" % f)
    joined = "".join(logs.values())
    # the logs are not empty of the events: requests by rid, the refused pairing
    for needle in ("rid=sec-chat", "rid=sec-cmpl", "rid=sec-gen", "rid=sec-gone",
                   "wrong cluster key"):
        check(needle in joined, "the logs record %r" % needle)


def main():
    tmp = pc.tmpdir()
    model = pc.make_model(BUILD, tmp)
    if CASE == "limits":
        pc.run_test("limits", lambda: run_limits(model, tmp), tmp)
    elif CASE == "secrets":
        pc.run_test("secrets in logs", lambda: run_secrets(model, tmp), tmp)
    else:
        sys.exit("unknown case %r" % CASE)


if __name__ == "__main__":
    main()
