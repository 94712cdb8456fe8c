#!/usr/bin/env python3
"""test_daemons.py — pdserve-prefill + pdserve-decode as real processes on 127.0.0.1.

Drives both daemons the way a router does (the same body, with bootstrap fields, to both at
once; the client reads decode's answer, prefill's is drained) with a tiny model from
pdserve-mkmodel, and checks what a user would notice:
  tokens   greedy text equals pdserve-generate's, non-streamed and streamed, prompts of mixed
           lengths, --chunked-prefill-size 64 --page-size 16; 24 concurrent streams; pools full
  failures abort_request, client disconnect, bootstrap timeout, SIGKILL of decode mid-stream
           (prefill pages recovered), SIGKILL of prefill while requests wait in decode's transfer
           queue (each fails within 10 s, decode pages recovered); bad input -> 4xx; SIGTERM
           exits 0.
  device_choice  decode choosing on the device (PD_GREEDY_FAST_PATH=1: penalty slots, top-n)
           gives the host sampler's tokens and logprobs exactly: penalties, top-n, greedy and
           seeded sampling, one at a time and in one batch.
  local    --local-prefill: bodies without bootstrap fields sent to the decode are prefilled
           there: greedy and seeded texts equal pdserve-generate's, prompt logprobs, next to PD
           requests at once, an abort, the prefill SIGKILLed meanwhile, pools full; refused
           (400 naming bootstrap_room) with --local-prefill=false.
Stdlib only. Usage: test_daemons.py BUILD_DIR CASE   (CASE: tokens | failures | device_choice |
local)
Every process it starts is killed on exit.
"""
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pd_cluster as pc  # noqa: E402
from pd_cluster import check, text_of  # noqa: E402

BUILD = os.path.abspath(sys.argv[1])
CASE = sys.argv[2] if len(sys.argv) > 2 else "tokens"
# failures' prefill --bootstrap-timeout (s): how long a body with no decode keeps its room, so
# also the bound on seeing that room queued and sending a duplicate of it
BOOTSTRAP_TIMEOUT = 5.0
# extra flags of every prefill daemon (CTest: daemon_*_waiting runs the cases with the prefill
# waiting for each Transfer before computing, --eager-prefill=false)
PREFILL_FLAGS = os.environ.get("PD_TEST_PREFILL_FLAGS", "").split()


def Daemon(role, model, tmp, extra=(), env=None):
    """A prefill, decode or colocated ("null") daemon with --chunked-prefill-size 64 (pd_cluster's
    layout), quiet."""
    if role == "null":
        return pc.Coloc(BUILD, model, tmp, ["--chunked-prefill-size", "64"] + list(extra),
                        level="warning", ready_timeout=30, env=env)
    if role == "prefill":
        extra = list(extra) + PREFILL_FLAGS
    return pc.Daemon(BUILD, role, model, tmp, extra, level="warning", ready_timeout=30, env=env)


def body_for(prompt, max_new, room, pf, stream=False, kind="generate"):
    b = {"bootstrap_host": "127.0.0.1", "bootstrap_port": pf.bport, "bootstrap_room": room}
    if kind == "generate":
        b.update({"text": prompt, "stream": stream,
                  "sampling_params": {"max_new_tokens": max_new, "temperature": 0}})
    else:
        b.update({"prompt": prompt, "max_tokens": max_new, "temperature": 0, "stream": stream})
    return b


def pair(pf, dc, body, path="/generate", timeout=60):
    """Sends body to both; returns (decode status, decode body, prefill status, prefill body)."""
    res = {}

    def run_prefill():
        try:
            res["p"] = pf.post(path, body, timeout)
        except Exception as e:  # noqa: BLE001
            res["p"] = (0, str(e).encode())

    t = threading.Thread(target=run_prefill)
    t.start()
    try:
        d = dc.post(path, body, timeout)
    except Exception as e:  # noqa: BLE001
        d = (0, str(e).encode())
    t.join()
    return d[0], d[1], res["p"][0], res["p"][1]


def reference(model, prompts, max_new, sampling=None):
    """pdserve-generate's text for each prompt, one run per prompt (texts may hold newlines);
    sampling: extra flags (temperature, top-k/p, min-p, seed)."""
    return [pc.generate(BUILD, model, p, max_new, sampling or ()) for p in prompts]


WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly hex "
         "every jolly vexed bank clerk and the river runs to the sea under stars").split()


def make_prompts(n, rng):
    out = []
    for i in range(n):
        k = [1, 3, 8, 15, 16, 17, 30, 40, 64, 70, 100, 150][i % 12] + rng.randrange(3)
        out.append(" ".join(rng.choice(WORDS) for _ in range(k)))
    return out


def case_tokens(model, tmp):
    pf = Daemon("prefill", model, tmp)
    dc = Daemon("decode", model, tmp)
    if os.environ.get("PD_XFER_STAGE_HOST"):  # the staged GPU path on host memory
        for d in (pf, dc):
            tr = json.loads(d.get("/server_info")[1]).get("transfer_transport", "")
            check(tr.endswith("+staged"), "%s transport %r is staged" % (d.role, tr))
    rng = random.Random(7)
    prompts = make_prompts(36, rng)
    max_new = 16
    ref = reference(model, prompts, max_new)
    room = 1 << 40
    # sequential: non-streamed /generate, streamed /generate, OpenAI completions both ways
    for i, p in enumerate(prompts):
        kind = "generate" if i % 2 == 0 else "completions"
        path = "/generate" if kind == "generate" else "/v1/completions"
        for stream in (False, True):
            room += 1
            ds, db, ps, pb = pair(pf, dc, body_for(p, max_new, room, pf, stream, kind), path)
            check(ds == 200 and ps == 200, "prompt %d stream=%s: status %d/%d %r" %
                  (i, stream, ds, ps, db[:200]))
            if ds == 200:
                got = text_of(kind, stream, db)
                check(got == ref[i], "prompt %d (%s stream=%s) text %r != reference %r" %
                      (i, kind, stream, got, ref[i]))
    # seeded sampling: the daemons' text equals pdserve-generate's with the same parameters and
    # seed (the prefill daemon draws the first token, decode continues the request's random
    # stream; with PD_GREEDY_FAST_PATH=1 decode chooses through pd_backend_sample as on a GPU).
    # Prompts the daemons have not seen: a prompt served before would find its whole pages in
    # the prefill's cache and compute only its tail, a few rows through the decode product where
    # pdserve-generate computes every row through the prefill one; the two sum in other orders,
    # and at T = 1.3 that last-bit difference picks another token (as SGLang's outputs change
    # with its cache's state outside its deterministic mode)
    fresh = make_prompts(20, random.Random(70))
    sampled = [(0.8, 0, 1.0, 0.0, 11), (1.0, 40, 0.9, 0.0, 12), (0.7, 0, 0.95, 0.05, 13),
               (1.3, 0, 1.0, 0.1, 14)]
    for i, (t, k, tp, mp, seed) in enumerate(sampled):
        p = fresh[i * 5]
        want = reference(model, [p], max_new, ["--temperature", str(t), "--top-k", str(k),
                                               "--top-p", str(tp), "--min-p", str(mp),
                                               "--seed", str(seed), "--ignore-eos"])[0]
        room += 1
        b = body_for(p, max_new, room, pf)
        b["sampling_params"].update({"temperature": t, "top_k": k, "top_p": tp, "min_p": mp,
                                     "sampling_seed": seed, "ignore_eos": True})
        ds, db, ps, pb = pair(pf, dc, b, "/generate")
        check(ds == 200 and ps == 200, "sampled %d: status %d/%d %r" % (i, ds, ps, db[:200]))
        if ds == 200:
            got = text_of("generate", False, db)
            check(got == want, "sampled %d (T %g k %d p %g min_p %g seed %d) text %r != %r" %
                  (i, t, k, tp, mp, seed, got, want))
    # 24 concurrent streams
    results = [None] * 24
    threads = []

    def one(i):
        r = (1 << 41) + i
        ds, db, ps, pb = pair(pf, dc, body_for(prompts[i], max_new, r, pf, True), "/generate")
        results[i] = (ds, ps, text_of("generate", True, db) if ds == 200 else db)

    for i in range(24):
        t = threading.Thread(target=one, args=(i,))
        t.start()
        threads.append(t)
    for t in threads:
        t.join(120)
    for i, r in enumerate(results):
        check(r is not None and r[0] == 200 and r[1] == 200 and r[2] == ref[i],
              "concurrent stream %d: %r vs %r" % (i, r, ref[i]))
    check(pf.pool_full(5), "prefill pool back to full")
    check(dc.pool_full(5), "decode pool back to full")
    # chat through the template, both daemons, and info endpoints
    room += 1
    chat = {"model": model, "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": 5, "temperature": 0, "bootstrap_host": "127.0.0.1",
            "bootstrap_port": pf.bport, "bootstrap_room": room}
    ds, db, ps, pb = pair(pf, dc, chat, "/v1/chat/completions")
    check(ds == 200 and json.loads(db)["object"] == "chat.completion", "chat: %d %r" % (ds, db))
    st, body = dc.get("/v1/models")
    check(st == 200 and json.loads(body)["data"][0]["owned_by"] == "sglang", "/v1/models")
    for path in ("/model_info", "/get_model_info", "/get_load", "/get_server_info", "/metrics",
                 "/health_generate"):
        check(dc.get(path)[0] == 200, path)
    # bad input: 4xx and still serving
    bad = [
        b"{not json",
        json.dumps({"text": "hi", "sampling_params": {"temperature": -1},
                    "bootstrap_room": 5}).encode(),
        json.dumps({"text": 5, "bootstrap_room": 6}).encode(),
        json.dumps({"text": "hi", "bootstrap_room": -3}).encode(),
        b'{"text": "\xff\xfe", "bootstrap_room": 7}',
        json.dumps({"text": "word " * 5000, "bootstrap_room": 8}).encode(),  # > context
    ]
    for b in bad:
        st, out = dc.post("/generate", b)
        check(400 <= st < 500 and b"error" in out, "bad body %r -> %d %r" % (b[:40], st, out[:120]))
    st, out = dc.post("/v1/completions", {"model": "nope", "prompt": "x", "bootstrap_room": 9})
    check(st == 404, "unknown model -> %d" % st)
    check(dc.get("/health")[0] == 200 and pf.get("/health")[0] == 200, "still serving")
    # the transfer engines' counters once every room ended: nothing live, nothing dropped; on
    # the staged path every byte the prefill staged reached the decode's pool through its ring
    xt = {d.role: json.loads(d.get("/server_info")[1]).get("kv_transfer") or {} for d in (pf, dc)}
    for role, t in xt.items():
        check(t.get("live_rooms") == 0 and t.get("dropped_writes") == 0 and
              t.get("shards") == 1 and t.get("recv_copying_bytes") == 0,
              "%s kv_transfer after the requests: %r" % (role, t))
    if os.environ.get("PD_XFER_STAGE_HOST"):
        sent, got = xt["prefill"].get("staged_bytes"), xt["decode"].get("recv_staged_bytes")
        check(sent and sent == got and sent % xt["decode"].get("page_bytes", 0) == 0,
              "staged bytes: prefill sent %r, decode's ring copied %r" % (sent, got))
    # SIGTERM: exit 0
    for d in (pf, dc):
        d.p.send_signal(signal.SIGTERM)
    for d in (pf, dc):
        try:
            rc = d.p.wait(20)
        except subprocess.TimeoutExpired:
            rc = "hung"
        check(rc == 0, "%s SIGTERM exit %s" % (d.role, rc))


def case_device_choice(model, tmp):
    """Decode steps that choose on the device (PD_GREEDY_FAST_PATH=1: pd_backend_sample with
    penalty slots and top-n, as on a GPU) give exactly the tokens and logprobs of the host
    sampler on downloaded logits, for requests with penalties, top-n logprobs, greedy and
    seeded sampling, one at a time and batched together; colocated daemons too."""
    host_env = {k: v for k, v in os.environ.items() if k != "PD_GREEDY_FAST_PATH"}
    dev_env = dict(host_env, PD_GREEDY_FAST_PATH="1")
    # no prefix cache: a prompt sent twice is computed the same way twice, so both decodes get
    # the same KV bits (a cached prefix changes how the rest is batched, and its last bits)
    pf = Daemon("prefill", model, tmp, ["--disable-prefix-cache"])
    dh = Daemon("decode", model, tmp, env=host_env)
    dd = Daemon("decode", model, tmp, env=dev_env)
    rng = random.Random(11)
    prompts = make_prompts(10, rng)
    max_new = 20
    # (temperature, top_k, top_p, min_p, repetition, frequency, presence, top-n, seed)
    params = [(0, 0, 1.0, 0.0, 1.3, 0.0, 0.0, 5, 1), (0, 0, 1.0, 0.0, 1.0, 0.6, 0.4, 0, 2),
              (0.9, 0, 1.0, 0.0, 1.2, 0.3, -0.5, 20, 3), (0.8, 40, 0.9, 0.05, 0.8, 0.0, 1.0, 1, 4),
              (0, 0, 1.0, 0.0, 1.0, 0.0, 0.0, 3, 5), (1.2, 0, 0.95, 0.0, 1.0, -1.0, 0.0, 0, 6),
              (0, 0, 1.0, 0.0, 1.0, 0.0, 0.0, 0, 7), (0.7, 5, 1.0, 0.1, 1.5, 1.0, 1.0, 20, 8)]

    def body(i, room):
        t, k, tp, mp, rep, freq, pres, n, seed = params[i % len(params)]
        b = body_for(prompts[i], max_new, room, pf)
        b["sampling_params"].update({"temperature": t, "top_k": k, "top_p": tp, "min_p": mp,
                                     "repetition_penalty": rep, "frequency_penalty": freq,
                                     "presence_penalty": pres, "sampling_seed": seed,
                                     "ignore_eos": True})
        b["return_logprob"] = True
        b["top_logprobs_num"] = n
        return b

    def result(raw):
        j = json.loads(raw)
        mi = j["meta_info"]
        return j["text"], mi["output_token_logprobs"], mi.get("output_top_logprobs")

    room = 1 << 42
    want = []
    for i in range(len(prompts)):  # one at a time: the same logits on both decodes
        got = []
        for dc in (dh, dd):
            room += 1
            ds, db, ps, pb = pair(pf, dc, body(i, room))
            check(ds == 200 and ps == 200, "prompt %d: status %d/%d %r" % (i, ds, ps, db[:200]))
            got.append(result(db) if ds == 200 else None)
        want.append(got[0])
        if got[0] and got[1]:
            check(got[1][0] == got[0][0], "prompt %d (%r) text on the device %r != host %r" %
                  (i, params[i % len(params)], got[1][0], got[0][0]))
            check(got[1][1] == got[0][1], "prompt %d token logprobs differ:\n%r\n%r" %
                  (i, got[1][1], got[0][1]))
            check(got[1][2] == got[0][2], "prompt %d top logprobs differ:\n%r\n%r" %
                  (i, got[1][2], got[0][2]))
            n = params[i % len(params)][7]
            check(len(got[0][1]) == max_new and (n == 0 or all(
                len(t) == n for t in got[0][2])), "prompt %d: %d logprobs, top-%d" %
                (i, len(got[0][1]), n))
    # the penalties and the seeds are the request's own: pdserve-generate agrees on the text
    for i in (0, 2):
        t, k, tp, mp, rep, freq, pres, n, seed = params[i]
        ref = reference(model, [prompts[i]], max_new, [
            "--temperature", str(t), "--top-k", str(k), "--top-p", str(tp), "--min-p", str(mp),
            "--repetition-penalty", str(rep), "--frequency-penalty", str(freq),
            "--presence-penalty", str(pres), "--seed", str(seed), "--ignore-eos"])[0]
        check(want[i] and want[i][0] == ref, "prompt %d text %r != pdserve-generate %r" %
              (i, want[i] and want[i][0], ref))
    # all of them at once on the device path: one decode batch mixing every kind of row
    results = [None] * len(prompts)

    def one(i):
        ds, db, ps, pb = pair(pf, dd, body(i, (1 << 43) + i))
        results[i] = result(db) if ds == 200 else None

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i, r in enumerate(results):
        check(r is not None and want[i] is not None and r[0] == want[i][0],
              "batched prompt %d: %r != %r" % (i, r and r[0], want[i] and want[i][0]))
        if r and want[i]:
            d = max(abs(a[0] - b[0]) for a, b in zip(r[1], want[i][1]))
            check(d < 1e-4, "batched prompt %d: logprobs off by %g" % (i, d))
    info = [json.loads(d.get("/server_info")[1]) for d in (dh, dd)]
    n_dev = 2 * len(prompts) * (max_new - 1)  # every token after the prefill's
    check(info[0]["sampled_on_device"] == 0 and info[0]["sampled_on_host"] == n_dev // 2,
          "host decode sampled %r/%r" % (info[0]["sampled_on_device"], info[0]["sampled_on_host"]))
    check(info[1]["sampled_on_device"] == n_dev and info[1]["sampled_on_host"] == 0,
          "device decode sampled %r on the device, %r on the host (want %d, 0)" %
          (info[1]["sampled_on_device"], info[1]["sampled_on_host"], n_dev))
    check(dh.pool_full() and dd.pool_full() and pf.pool_full(), "pools back to full")
    # colocated (--disaggregation-mode null): steps of decode tokens alone choose on the device
    ch = Daemon("null", model, tmp, ["--disable-prefix-cache"], env=host_env)
    cd = Daemon("null", model, tmp, ["--disable-prefix-cache"], env=dev_env)
    for i in range(len(prompts)):
        got = []
        for c in (ch, cd):
            st, raw = c.post("/generate", body(i, 0))
            check(st == 200, "colocated prompt %d: %d %r" % (i, st, raw[:200]))
            got.append(result(raw) if st == 200 else None)
        if got[0] and got[1]:
            check(got[1] == got[0], "colocated prompt %d: device %r != host %r" %
                  (i, got[1][:2], got[0][:2]))
            check(want[i] and got[0][0] == want[i][0], "colocated prompt %d text %r != %r" %
                  (i, got[0][0], want[i] and want[i][0]))
    info = json.loads(cd.get("/server_info")[1])
    n = len(prompts)  # the first token of each comes from its prefill step, on the host
    check(info["sampled_on_device"] == n * (max_new - 1) and info["sampled_on_host"] == n,
          "colocated device daemon sampled %r on the device, %r on the host" %
          (info["sampled_on_device"], info["sampled_on_host"]))


def case_local(model, tmp):
    """--local-prefill: a decode daemon in PD mode takes bodies without bootstrap fields and
    prefills them itself; texts equal pdserve-generate's (greedy and seeded), next to PD requests
    at the same time; aborts; the prefill's death does not touch them; pools back to full; a
    decode with --local-prefill=false refuses them naming the field."""
    pf = Daemon("prefill", model, tmp)
    dc = Daemon("decode", model, tmp)
    info = json.loads(dc.get("/server_info")[1])
    check(info.get("local_prefill") is True, "decode /server_info local_prefill: %r" %
          info.get("local_prefill"))
    rng = random.Random(11)
    prompts = make_prompts(12, rng)
    max_new = 16
    ref = reference(model, prompts, max_new)
    n_local = 0
    for i, p in enumerate(prompts):  # local, each way of asking
        kind = "generate" if i % 2 == 0 else "completions"
        path = "/generate" if kind == "generate" else "/v1/completions"
        for stream in (False, True):
            b = {"text": p, "sampling_params": {"max_new_tokens": max_new, "temperature": 0},
                 "stream": stream} if kind == "generate" else \
                {"model": model, "prompt": p, "max_tokens": max_new, "temperature": 0,
                 "stream": stream}
            st, out = dc.post(path, b)
            n_local += 1
            check(st == 200, "local prompt %d: %d %r" % (i, st, out[:200]))
            if st == 200:
                got = text_of(kind, stream, out)
                check(got == ref[i], "local prompt %d (%s stream=%s) text %r != reference %r" %
                      (i, kind, stream, got, ref[i]))
    # seeded sampling: the decode draws the first token itself, as pdserve-generate does
    for i, (t, tp, seed) in enumerate([(0.8, 1.0, 21), (1.1, 0.9, 22)]):
        p = prompts[i * 3]
        want = reference(model, [p], max_new, ["--temperature", str(t), "--top-p", str(tp),
                                               "--seed", str(seed), "--ignore-eos"])[0]
        st, out = dc.post("/generate", {"text": p, "sampling_params": {
            "max_new_tokens": max_new, "temperature": t, "top_p": tp, "sampling_seed": seed,
            "ignore_eos": True}})
        n_local += 1
        check(st == 200 and text_of("generate", False, out) == want,
              "local sampled %d (T %g p %g seed %d): %d %r != %r" %
              (i, t, tp, seed, st, out[:200], want))
    # prompt logprobs, scored where the prompt is prefilled: here
    st, out = dc.post("/generate", {"text": prompts[5], "return_logprob": True,
                                    "logprob_start_len": 0,
                                    "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
    n_local += 1
    lp = json.loads(out).get("meta_info", {}).get("input_token_logprobs") if st == 200 else None
    n_prompt = json.loads(out)["meta_info"]["prompt_tokens"] if st == 200 else -1
    check(lp is not None and len(lp) == n_prompt and lp[0][0] is None and
          all(isinstance(x[0], float) and x[0] <= 0 for x in lp[1:]),
          "local prompt logprobs: %d, %d of %d: %r" % (st, len(lp or []), n_prompt, out[:300]))
    # local and PD requests at once
    results = {}
    threads = []

    def local_one(i):
        results[("l", i)] = dc.post("/generate", {"text": prompts[i], "stream": True,
                                                  "sampling_params": {"max_new_tokens": max_new,
                                                                      "temperature": 0}})

    def pd_one(i):
        ds, db, ps, pb = pair(pf, dc, body_for(prompts[i], max_new, (1 << 45) + i, pf, True))
        results[("p", i)] = (ds, db)

    for i in range(len(prompts)):
        for f in (local_one, pd_one):
            t = threading.Thread(target=f, args=(i,))
            t.start()
            threads.append(t)
    for t in threads:
        t.join(120)
    n_local += len(prompts)
    for (way, i), (st, out) in sorted(results.items()):
        got = text_of("generate", True, out) if st == 200 else None
        check(st == 200 and got == ref[i], "concurrent %s %d: %d %r != %r" %
              ("local" if way == "l" else "PD", i, st, got if st == 200 else out[:200], ref[i]))
    m = dc.get("/metrics")[1].decode()
    got = [float(x.split()[-1]) for x in m.splitlines()
           if x.startswith("pdserve_local_prefill_requests_total")]
    check(got == [n_local], "pdserve_local_prefill_requests_total %r, want %d" % (got, n_local))
    # abort mid-stream on the local path
    long_sp = {"max_new_tokens": 1500, "temperature": 0, "ignore_eos": True}
    for attempt in range(5):
        body = {"text": "abort me locally", "sampling_params": long_sp, "stream": True,
                "rid": "l-abort-%d" % attempt}
        c, r, got = stream_some(dc, body, 3)
        st, out = dc.post("/abort_request", {"rid": "l-abort-%d" % attempt})
        rest = r.read()
        c.close()
        if st == 200 and not json.loads(out)["success"] and attempt < 4 and \
                b'"type":"length"' in got + rest:
            continue  # the tiny model finished first: again
        check(st == 200 and json.loads(out)["success"] and b"[DONE]" in rest,
              "local abort_request: %d %r" % (st, out))
        break
    check(dc.pool_full(5), "decode pool back to full after the local requests")
    # the prefill dies: local requests go on
    pf.p.kill()
    pf.p.wait()
    for i in (0, 7):
        st, out = dc.post("/generate", {"text": prompts[i], "sampling_params": {
            "max_new_tokens": max_new, "temperature": 0}})
        check(st == 200 and text_of("generate", False, out) == ref[i],
              "local prompt %d after the prefill died: %d %r" % (i, st, out[:200]))
    check(dc.pool_full(5) and dc.get("/health")[0] == 200, "decode full and healthy")
    # refused where turned off, naming the field
    dc2 = Daemon("decode", model, tmp, ["--local-prefill=false"])
    st, out = dc2.post("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 4}})
    check(st == 400 and b"bootstrap_room" in out, "--local-prefill=false: %d %r" % (st, out[:200]))
    check(json.loads(dc2.get("/server_info")[1]).get("local_prefill") is False,
          "--local-prefill=false in /server_info")


def metric(d, name):
    """The value of a series with one sample in d's /metrics (None when absent)."""
    for line in d.get("/metrics")[1].decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.split()[-1])
    return None


def case_reuse(model, tmp):
    """Decode-side prefix reuse: a conversation's next turn on the same decode finds the previous
    turn's prompt + output in decode's prefix cache. Decode holds those pages and asks the prefill
    only for the rest: both daemons' pdserve_kv_transfer_bytes_total grow by exactly the pages not
    held, pdserve_decode_prefix_cache_hit_tokens_total by the tokens held, and the output ids equal
    pdserve-generate's on the whole prompt. The same on the local path (a prompt decode prefills
    itself starts after its held pages). A prefill that dies: the turn fails, decode keeps serving
    and its pool is whole; a new prefill serves the next turn with held pages.
    --disable-prefix-cache moves every page."""
    pf = Daemon("prefill", model, tmp)
    dc = Daemon("decode", model, tmp)
    pool = dc.pool()
    ps, pb = pool["page_size"], pool["page_bytes"]
    rng = random.Random(23)
    convs = [[rng.randrange(3, 200) for _ in range(37 + 11 * c)] for c in range(3)]
    max_new = 10
    sp = {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}
    rooms = iter(range(1 << 46, (1 << 46) + 1000))
    kept = [0] * len(convs)  # tokens of each conversation whose KV the decode keeps

    def held_for(i):
        return min(kept[i] // ps, (len(convs[i]) - 1) // ps)

    def turn(d, what, local=False):
        """One turn of every conversation on decode d, one at a time; returns (pages moved,
        tokens held) as the daemon should count them."""
        ref = pc.generate_ids(BUILD, model, convs, max_new, what=what + " reference")
        moved = held = 0
        for i, prompt in enumerate(convs):
            body = {"input_ids": prompt, "sampling_params": sp}
            if local:
                st, out = d.post("/generate", body)
            else:
                body.update({"bootstrap_host": "127.0.0.1", "bootstrap_port": pf.bport,
                             "bootstrap_room": next(rooms)})
                st, out, _, _ = pair(pf, d, body)
            ids = json.loads(out).get("output_ids") if st == 200 else None
            check(ref is not None and ids == ref[i], "%s conversation %d: %d %r != %r" %
                  (what, i, st, ids if ids else out[:200], ref and ref[i]))
            h = held_for(i)
            held += h * ps
            if local and st == 200:  # usage: what decode's own cache served
                got = json.loads(out)["meta_info"].get("cached_tokens")
                check(got == h * ps, "%s conversation %d: cached_tokens %r, want %d" %
                      (what, i, got, h * ps))
            moved += 0 if local else (len(prompt) + ps - 1) // ps - h
            kept[i] = len(prompt) + max_new - 1
            convs[i] = prompt + (ids or []) + [rng.randrange(3, 200) for _ in range(5 + 2 * i)]
        return moved, held

    def counted(what, d, moved, held, before):
        """d's and the prefill's counters grew by exactly these (polled: they count at the
        room's end on each side)."""
        want = (before[0] + moved * pb, before[1] + moved * pb, before[2] + held)
        now = {}

        def got():
            now["v"] = (metric(pf, "pdserve_kv_transfer_bytes_total"),
                        metric(d, "pdserve_kv_transfer_bytes_total"),
                        metric(d, "pdserve_decode_prefix_cache_hit_tokens_total"))
            return now["v"] == want
        check(pc.wait_until(got, 10), "%s: (prefill KV bytes, decode KV bytes, held tokens) %r, "
              "want %r" % (what, now.get("v"), want))

    def counters(d):
        return (metric(pf, "pdserve_kv_transfer_bytes_total"),
                metric(d, "pdserve_kv_transfer_bytes_total"),
                metric(d, "pdserve_decode_prefix_cache_hit_tokens_total"))

    for t in range(3):
        before = counters(dc)
        moved, held = turn(dc, "turn %d" % t)
        check((held > 0) == (t > 0), "turn %d holds %d tokens" % (t, held))
        counted("turn %d" % t, dc, moved, held, before)
        full = sum((len(c) + ps - 1) // ps for c in convs)
        pc.step("turn %d: %d pages moved, %d tokens held (whole prompts: %d pages)" %
             (t, moved, held, full))
    # the local path starts after the held pages
    before = counters(dc)
    moved, held = turn(dc, "local turn", local=True)
    check(held > 0, "local turn held nothing")
    counted("local turn", dc, 0, held, before)
    check(dc.pool_full(5) and pf.pool_full(5), "pools whole after the turns")
    check(dc.pool()["cached_pages"] > 0, "decode keeps its conversations' pages")

    # the prefill dies: the turn fails cleanly, decode serves on, its pool whole
    pf.p.kill()
    pf.p.wait()
    body = {"input_ids": convs[0], "sampling_params": sp, "bootstrap_host": "127.0.0.1",
            "bootstrap_port": pf.bport, "bootstrap_room": next(rooms)}
    st, out = dc.post("/generate", body)
    check(st >= 400, "a turn whose prefill is dead: %d %r" % (st, out[:200]))
    check(dc.pool_full(10) and dc.get("/health")[0] == 200, "decode whole after the prefill died")
    pf = Daemon("prefill", model, tmp)  # a new one (as a rescheduled pod: a new address)
    before = counters(dc)
    moved, held = turn(dc, "turn after the prefill restart")
    check(held > 0, "no pages held after the prefill restart")
    counted("turn after the prefill restart", dc, moved, held, before)

    # --disable-prefix-cache: nothing kept, every page moves
    dn = Daemon("decode", model, tmp, ["--disable-prefix-cache"])
    kept[:] = [0] * len(convs)
    for t in range(2):
        before = counters(dn)
        moved, held = turn(dn, "uncached turn %d" % t)
        counted("uncached turn %d" % t, dn, moved, 0, before)
        kept[:] = [0] * len(convs)
    check(dn.pool()["cached_pages"] == 0 and dn.pool_full(5), "uncached decode keeps nothing")
    check(pf.pool_full(5) and dc.pool_full(5), "pools whole at the end")


def stream_some(dc, body, n_events, path="/generate"):
    """Opens a stream on decode, reads n_events events, returns the open connection."""
    c = dc.conn(30)
    c.request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    r = c.getresponse()
    got = b""
    while got.count(b"\n\n") < n_events:
        chunk = r.read1(4096) if hasattr(r, "read1") else r.read(64)
        if not chunk:
            break
        got += chunk
    return c, r, got


def case_failures(model, tmp):
    pf = Daemon("prefill", model, tmp, ["--bootstrap-timeout", str(BOOTSTRAP_TIMEOUT)])
    dc = Daemon("decode", model, tmp, ["--waiting-timeout", "20"])
    long_sp = {"max_new_tokens": 1500, "temperature": 0, "ignore_eos": True}

    # 1. abort_request mid-stream: the stream ends (finish abort), pools refill
    print('step 1: abort_request mid-stream: the stream ends (finish abort), pools refill', flush=True)
    room = 1 << 50
    # the tiny model can finish 1500 tokens before the abort lands (success false): try again
    for attempt in range(5):
        room += 1
        body = {"text": "abort me please", "sampling_params": long_sp, "stream": True,
                "rid": "r-abort-%d" % attempt, "bootstrap_host": "127.0.0.1",
                "bootstrap_port": pf.bport, "bootstrap_room": room}
        pt = threading.Thread(target=lambda: pf.post("/generate", body))
        pt.start()
        c, r, got = stream_some(dc, body, 3)
        st, out = dc.post("/abort_request", {"rid": "r-abort-%d" % attempt})
        rest = r.read()
        c.close()
        pt.join(10)
        if st == 200 and not json.loads(out)["success"] and attempt < 4 and \
                b'"type":"length"' in got + rest:
            continue
        check(st == 200 and json.loads(out)["success"], "abort_request: %d %r" % (st, out))
        check(b"[DONE]" in rest, "aborted stream ends with [DONE]")
        break

    # 2. client disconnect mid-stream
    print('step 2: client disconnect mid-stream', flush=True)
    room += 1
    body.update({"bootstrap_room": room, "rid": "r-gone"})
    pt = threading.Thread(target=lambda: pf.post("/generate", body))
    pt.start()
    c, r, got = stream_some(dc, body, 3)
    c.sock.shutdown(socket.SHUT_RDWR)
    c.close()
    pt.join(10)
    check(dc.pool_full(5) and pf.pool_full(5), "pools full after abort and disconnect")

    # 3. bootstrap timeout: prefill gets a body, no decode ever asks; 4. while that request
    # waits in prefill's bootstrap queue (seen there), a second body with its room is refused
    print('step 3: bootstrap timeout: prefill gets a body, no decode ever asks', flush=True)
    room += 1
    lonely_body = {"text": "lonely", "bootstrap_host": "127.0.0.1", "bootstrap_port": pf.bport,
                   "bootstrap_room": room}
    lonely = {}

    def lonely_post():
        t = time.time()
        lonely["r"] = pf.post("/generate", lonely_body)
        lonely["took"] = time.time() - t

    holder = threading.Thread(target=lonely_post)
    holder.start()
    queued = pc.wait_until(lambda: pf.server_info()["queues"]["bootstrap"] >= 1, 30)
    check(queued, "the lonely request waits in prefill's bootstrap queue")
    print('step 4: duplicate room on one daemon', flush=True)
    dup = {"text": "dup", "sampling_params": long_sp, "bootstrap_host": "127.0.0.1",
           "bootstrap_port": pf.bport, "bootstrap_room": room}
    st, out = pf.post("/generate", dup)
    check(st in (400, 409), "duplicate room -> %d %r" % (st, out[:160]))
    holder.join(60)
    st, out = lonely.get("r", (0, b"no answer"))
    # the prefill starts its clock when the body arrives, after ours: never earlier than it
    took = lonely.get("took", 0)
    check(st >= 500 and b"bootstrap" in out and took >= BOOTSTRAP_TIMEOUT,
          "bootstrap timeout: %d %r after %.1f s (--bootstrap-timeout %g)" %
          (st, out[:160], took, BOOTSTRAP_TIMEOUT))

    # 5. SIGKILL decode mid-stream: prefill recovers its pages, keeps serving
    print('step 5: SIGKILL decode mid-stream: prefill recovers its pages, keeps serving', flush=True)
    room += 1
    body.update({"bootstrap_room": room, "rid": "r-kill"})
    pres = {}
    pt = threading.Thread(target=lambda: pres.update(r=pf.post("/generate", body)))
    pt.start()
    c, r, got = stream_some(dc, body, 2)
    dc.p.kill()
    dc.p.wait()
    c.close()
    pt.join(15)
    check(pf.pool_full(10), "prefill pages recovered after decode SIGKILL")
    check(pf.get("/health")[0] == 200, "prefill serves after decode died")

    # 6. SIGKILL prefill while requests sit in decode's transfer queue
    print('step 6: SIGKILL prefill while requests sit in decodes transfer queue', flush=True)
    dc = Daemon("decode", model, tmp)
    n = 6
    done = [None] * n

    def waiter(i):
        b = {"text": "waiting %d" % i, "sampling_params": {"max_new_tokens": 4},
             "bootstrap_host": "127.0.0.1", "bootstrap_port": pf.bport,
             "bootstrap_room": room + 100 + i}
        st, out = dc.post("/generate", b, 30)
        done[i] = (st, time.time())  # when the answer came, on the clock t_kill is read from

    ws = [threading.Thread(target=waiter, args=(i,)) for i in range(n)]
    for w in ws:
        w.start()
    # every one paired with prefill and waiting for its KV (no prefill body ever comes)
    check(pc.wait_until(lambda: dc.server_info()["queues"]["transfer"] == n, 30),
          "the %d requests wait in decode's transfer queue: %r" %
          (n, dc.server_info()["queues"]))
    t_kill = time.time()
    pf.p.kill()
    pf.p.wait()
    for w in ws:
        w.join(20)
    # each request failed because of the kill: answered with an error after it, not before
    # (a request refused for another cause would end early), and within 12 s of it
    for i, d in enumerate(done):
        check(d is not None and d[0] >= 500 and t_kill <= d[1] < t_kill + 12,
              "waiting request %d: an error between the prefill SIGKILL and 12 s after it: %r"
              % (i, d and (d[0], round(d[1] - t_kill, 2))))
    check(dc.pool_full(5), "decode pages recovered after prefill SIGKILL")
    dc.p.send_signal(signal.SIGTERM)
    check(dc.p.wait(20) == 0, "decode SIGTERM exit 0")


def main():
    tmp = pc.tmpdir()
    model = pc.make_model(BUILD, tmp)
    cases = {"tokens": case_tokens, "device_choice": case_device_choice,
             "failures": case_failures, "local": case_local, "reuse": case_reuse}
    pc.run_test("daemons %s" % CASE, lambda: cases[CASE](model, tmp), tmp, log_tail=3000)


if __name__ == "__main__":
    main()
