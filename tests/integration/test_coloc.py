#!/usr/bin/env python3
"""test_coloc.py — pdserve-decode --disaggregation-mode null (colocated) alone on 127.0.0.1 with
the tiny model of pdserve-mkmodel, --page-size 16 --chunked-prefill-size 64. What a user would
notice:

  * 30 prompts of 1..300 tokens (text and token ids; many longer than a 64-token chunk) sent all
    at once, twice (the second time from the prefix cache), over /generate and /v1/completions,
    streamed and not, with different output lengths: greedy output ids (/generate) and text
    (/v1/completions) equal pdserve-generate's token for token while long prompts are chunked
    and mixed into the steps of requests already decoding (/server_info mixed_steps > 0); usage
    counts the prompt and the cached tokens; chat equals pdserve-generate on the rendered prompt.
  * bootstrap fields in a body are ignored (two requests with the same bootstrap_room both run).
  * a pool too small for the load: requests are retracted and recomputed, outputs unchanged.
  * --disable-mixed-chunk: the same outputs, and no mixed step.
  * client disconnect mid-stream, /abort_request: the stream ends with finish_reason abort, the
    pool is full again; /get_load, /v1/loads, /metrics, /health_generate; SIGTERM exits 0.
  * bad flags: contradicting mixed-chunk flags, mixed-chunk flags outside null mode,
    pdserve-prefill in null mode: exit 2 with a message naming the flag.

Stdlib only. Usage: test_coloc.py BUILD_DIR. Every process is killed (by PID) on exit.
"""
import json
import os
import random
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pd_cluster as pc  # noqa: E402
from pd_cluster import check, step  # noqa: E402
from test_pd_router import Stream  # noqa: E402

BUILD = os.path.abspath(sys.argv[1])
TOKENIZE = os.path.join(BUILD, "tools", "pdserve-tokenize")
DECODE = os.path.join(BUILD, "decode", "pdserve-decode")


def Coloc(model, tmp, extra=()):
    """The colocated daemon with 64-token prefill chunks."""
    return pc.Coloc(BUILD, model, tmp, ["--chunked-prefill-size", "64"] + list(extra))


WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly hex "
         "every jolly vexed bank clerk and the river runs to the sea under stars").split()


def make_prompts(rng):
    """30 prompts: 16 texts of 1..150 words, 14 token-id lists of exact lengths; max_new 4..40."""
    out = []
    for i in range(16):
        k = [1, 3, 6, 11, 20, 22, 40, 60, 100, 150][i % 10] + rng.randrange(2)
        out.append({"text": " ".join(rng.choice(WORDS) for _ in range(k))})
    for n in (1, 2, 15, 16, 17, 33, 63, 64, 65, 127, 129, 200, 257, 300):
        out.append({"ids": [rng.randrange(1000) for _ in range(n)]})
    for i, p in enumerate(out):
        p["max_new"] = 4 + (i * 13) % 37
    return out


def reference(model, prompt, max_new):
    """pdserve-generate's greedy answer: (text, output ids)."""
    return pc.generate(BUILD, model, prompt.get("ids", prompt.get("text")), max_new, ids=True)


def references(model, prompts, max_new=None):
    return pc.pool_map(lambda i: reference(model, prompts[i], max_new or prompts[i]["max_new"]),
                       len(prompts))


def body_of(prompt, kind, stream, max_new, **extra):
    if kind == "generate":
        b = {"stream": stream, "sampling_params": {"max_new_tokens": max_new, "temperature": 0}}
        if "ids" in prompt:
            b["input_ids"] = prompt["ids"]
        else:
            b["text"] = prompt["text"]
    else:
        b = {"prompt": prompt.get("text", prompt.get("ids")), "max_tokens": max_new,
             "temperature": 0, "stream": stream}
        if stream:
            b["stream_options"] = {"include_usage": True}
    b.update(extra)
    return b


PATHS = {"generate": "/generate", "completions": "/v1/completions",
         "chat": "/v1/chat/completions"}


def answer_of(kind, stream, raw):
    """(text, output ids or None, usage or None, finish) of an answer; raises when malformed."""
    if not stream:
        j = json.loads(raw)
        if kind == "generate":
            m = j["meta_info"]
            usage = {"prompt_tokens": m["prompt_tokens"], "cached_tokens": m["cached_tokens"]}
            return j["text"], j["output_ids"], usage, m["finish_reason"]["type"]
        c = j["choices"][0]
        text = c["text"] if kind == "completions" else c["message"]["content"]
        u = j["usage"]
        u["cached_tokens"] = u["prompt_tokens_details"]["cached_tokens"]
        return text, None, u, c["finish_reason"]
    chunks = pc.stream_payloads(raw)
    if kind == "generate":
        last = chunks[-1]
        m = last["meta_info"]
        usage = {"prompt_tokens": m["prompt_tokens"], "cached_tokens": m["cached_tokens"]}
        return last["text"], last["output_ids"], usage, m["finish_reason"]["type"]
    usage, text, finish = None, "", None
    for c in chunks:
        if c.get("usage"):
            usage = c["usage"]
            usage["cached_tokens"] = usage["prompt_tokens_details"]["cached_tokens"]
        for ch in c["choices"]:
            text += (ch.get("text") if kind == "completions" else ch["delta"].get("content")) or ""
            finish = ch.get("finish_reason") or finish
    return text, None, usage, finish


def token_counts(model, prompts):
    texts = [p["text"] for p in prompts if "text" in p]
    r = subprocess.run([TOKENIZE, "--model-path", model, "--jsonl"],
                       input="\n".join(json.dumps(t) for t in texts) + "\n",
                       capture_output=True, text=True, check=True, timeout=60)
    it = iter(r.stdout.strip().split("\n"))
    return [len(next(it).split()) if "text" in p else len(p["ids"]) for p in prompts]


def concurrent_round(d, prompts, refs, counts, flip, label):
    """Every prompt at once; prompt i goes to /generate or /v1/completions, streamed or not
    (flip swaps both). Returns the answers' usages."""
    n = len(prompts)
    results = [None] * n
    barrier = threading.Barrier(n)

    def client(i):
        kind = ("generate", "completions")[(i + flip) % 2]
        stream = (i // 2 + flip) % 2 == 0
        body = body_of(prompts[i], kind, stream, prompts[i]["max_new"])
        try:
            barrier.wait(30)
            st, raw = d.post(PATHS[kind], body, 120)
            results[i] = (kind, stream, st, answer_of(kind, stream, raw) if st == 200 else raw)
        except Exception as e:  # noqa: BLE001
            results[i] = (kind, stream, 0, repr(e))

    ts = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(150)
    n_ok = 0
    usages = []
    for i, r in enumerate(results):
        if not check(r is not None and r[2] == 200, "%s prompt %d: %r" % (label, i, r)):
            continue
        kind, stream, _, (text, ids, usage, finish) = r
        ref_text, ref_ids = refs[i]
        what = "%s prompt %d (%d tokens, %s stream=%s)" % (label, i, counts[i], kind, stream)
        ok = True
        if ids is not None:
            ok &= check(ids == ref_ids, "%s: ids %r != reference %r" % (what, ids, ref_ids))
        ok &= check(text == ref_text, "%s: %r != reference %r" % (what, text, ref_text))
        ok &= check(usage is not None and usage["prompt_tokens"] == counts[i],
                    "%s: usage %r (prompt has %d tokens)" % (what, usage, counts[i]))
        ok &= check(finish in ("stop", "length"), "%s: finish %r" % (what, finish))
        usages.append(usage)
        n_ok += ok
    step("%s: %d/%d concurrent answers equal pdserve-generate's" % (label, n_ok, n))
    return usages


def pool_checks(d, label):
    check(d.pool_full(10), "%s: pool back to full" % label)
    info = d.server_info()
    check(info["live_requests"] == 0 and info["queues"]["waiting"] == 0 and
          info["queues"]["running"] == 0, "%s: queues empty: %r" % (label, info["queues"]))
    st, body = d.get("/v1/loads")
    loads = json.loads(body) if st == 200 else {}
    rank = (loads.get("loads") or [{}])[0]
    check(st == 200 and rank.get("num_used_tokens") == 0 and rank.get("token_usage") == 0 and
          rank.get("max_total_num_tokens") == info["max_total_tokens"],
          "%s: /v1/loads %d %r" % (label, st, loads))
    st, body = d.get("/get_load")
    check(st == 200 and json.loads(body)["load"] == 0, "%s: /get_load %d %r" % (label, st, body))


def case_main(model, tmp):
    d = Coloc(model, tmp)
    info = d.server_info()
    check(info["disaggregation_mode"] == "null" and info["transfer_transport"] == "none" and
          info["enable_mixed_chunk"] is True, "server_info of null mode: %r" %
          {k: info.get(k) for k in ("disaggregation_mode", "transfer_transport",
                                    "enable_mixed_chunk")})
    check(info["max_total_tokens"] == 16384, "max_total_tokens %r" % info["max_total_tokens"])
    rng = random.Random(7)
    prompts = make_prompts(rng)
    counts = token_counts(model, prompts)
    step("prompt lengths (tokens): %s" % counts)
    check(sum(1 for n in counts if n > 64) >= 8, "prompts over one 64-token chunk: %s" % counts)
    refs = references(model, prompts)
    step("references from pdserve-generate done")

    concurrent_round(d, prompts, refs, counts, 0, "round 1")
    info = d.server_info()
    step("steps %d, mixed steps %d" % (info["steps"], info["mixed_steps"]))
    check(info["mixed_steps"] > 0, "prefill chunks ran mixed with decode tokens: %r" % info)
    pool_checks(d, "round 1")
    check(d.pool()["cached_pages"] > 0, "the prefix cache kept pages: %r" % d.pool())
    usages = concurrent_round(d, prompts, refs, counts, 1, "round 2 (prefix cache warm)")
    cached = [u["cached_tokens"] for u in usages if u]
    check(sum(1 for c in cached if c >= 64) >= 5, "round 2 served prompts from the cache: %r" %
          cached)
    pool_checks(d, "round 2")

    # chat: equals pdserve-generate on the rendered chat prompt
    msgs = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": " ".join(WORDS)}]
    chat_ids = pc.chat_prompt_ids(BUILD, model, d, msgs, tmp)
    cref, _ = reference(model, {"ids": chat_ids}, 16)
    model_id = json.loads(d.get("/v1/models")[1])["data"][0]["id"]
    for stream in (False, True):
        body = {"model": model_id, "messages": msgs, "max_tokens": 16, "temperature": 0,
                "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        st, raw = d.post("/v1/chat/completions", body)
        if check(st == 200, "chat stream=%s: HTTP %d %r" % (stream, st, raw[:200])):
            text, _, usage, _ = answer_of("chat", stream, raw)
            check(text == cref, "chat stream=%s: %r != reference %r" % (stream, text, cref))
            check(usage["prompt_tokens"] == len(chat_ids), "chat usage %r" % usage)

    # bootstrap fields are ignored: the same room twice at once, both served
    p = prompts[3]
    res = [None, None]

    def boot(i):
        b = body_of(p, "generate", False, p["max_new"], bootstrap_host="10.0.0.1",
                    bootstrap_port=8998, bootstrap_room=12345)
        res[i] = d.post("/generate", b)

    ts = [threading.Thread(target=boot, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    for r in res:
        check(r is not None and r[0] == 200 and json.loads(r[1])["output_ids"] == refs[3][1],
              "bootstrap fields ignored: %r" % (r,))
    step("chat and bootstrap fields done")

    # client disconnect mid-stream, then /abort_request: pool full again each time
    long_sp = {"max_new_tokens": 1900, "temperature": 0, "ignore_eos": True}
    s = Stream(d.port, "/generate", {"text": "disconnect me", "stream": True,
                                     "sampling_params": long_sp})
    got = s.read_events(3)
    check(got.count(b"data: ") >= 3, "stream started before the disconnect: %r" % got[:300])
    s.disconnect()
    check(d.pool_full(10), "pool full after a client disconnect")
    aborted = False
    for attempt in range(5):
        rid = "coloc-abort-%d" % attempt
        s = Stream(d.port, "/generate", {"text": "abort me please", "stream": True, "rid": rid,
                                         "sampling_params": long_sp})
        s.read_events(2)
        st, out = d.post("/abort_request", {"rid": rid}, 10)
        took, ended = s.read_rest(10)
        evs = pc.sse_events(s.got)
        s.close()
        check(ended and evs and evs[-1] == "[DONE]", "aborted stream ends within 10 s: %r" %
              evs[-2:])
        last = json.loads(evs[-2]) if len(evs) >= 2 else {}
        fr = last.get("meta_info", {}).get("finish_reason", {})
        if fr.get("type") == "length":
            continue  # the answer was complete before the abort landed
        check(st == 200 and json.loads(out)["success"], "/abort_request: %d %r" % (st, out))
        check(fr.get("type") == "abort", "aborted stream's last event says abort: %r" % last)
        aborted = True
        break
    check(aborted, "an abort landed mid-stream in 5 attempts")
    check(d.pool_full(10), "pool full after /abort_request")
    # a prompt + output over the context, and over the pool: clear 400s
    st, body = d.post("/generate", {"input_ids": [1] * 2000,
                                    "sampling_params": {"max_new_tokens": 100}})
    check(st == 400 and b"context" in body, "over the context: %d %r" % (st, body[:200]))
    st, body = d.get("/health_generate", timeout=30)
    check(st == 200, "/health_generate: %d %r" % (st, body[:200]))
    st, body = d.get("/metrics")
    check(st == 200 and b"sglang:num_queue_reqs" in body and b"sglang:token_usage" in body,
          "/metrics: %d" % st)
    rc = d.terminate(30)
    check(rc == 0, "SIGTERM exit %s" % rc)
    return prompts, refs, counts


def case_small_pool(model, tmp):
    """32 pages of 16 tokens for 12 requests that grow to 6 pages each, admitted without an
    output reservation (--schedule-conservativeness 0.01): retractions."""
    d = Coloc(model, tmp, ["--max-total-tokens", "512", "--schedule-conservativeness", "0.01"])
    rng = random.Random(3)
    prompts = [{"ids": [rng.randrange(1000) for _ in range(20 + 7 * i)], "max_new": 60}
               for i in range(12)]
    refs = references(model, prompts)
    counts = [len(p["ids"]) for p in prompts]
    for rnd in range(3):
        concurrent_round(d, prompts, refs, counts, rnd, "small pool %d" % rnd)
        if d.server_info()["queues"]["retractions"] > 0:
            break
    info = d.server_info()
    step("small pool: %d retractions" % info["queues"]["retractions"])
    check(info["queues"]["retractions"] > 0, "the small pool retracted requests: %r" %
          info["queues"])
    pool_checks(d, "small pool")
    check(d.terminate(30) == 0, "small pool daemon SIGTERM exit 0")


def case_unmixed(model, tmp, prompts, refs, counts, flag):
    d = Coloc(model, tmp, [flag])
    check(d.server_info()["enable_mixed_chunk"] is False, "%s in server_info" % flag)
    concurrent_round(d, prompts, refs, counts, 0, "no mixing (%s)" % flag)
    info = d.server_info()
    check(info["mixed_steps"] == 0 and info["steps"] > 0,
          "no mixed step without mixing: %r" % {k: info[k] for k in ("steps", "mixed_steps")})
    pool_checks(d, "no mixing")
    check(d.terminate(30) == 0, "unmixed daemon SIGTERM exit 0")


def case_bad_flags(model):
    prefill = os.path.join(BUILD, "prefill", "pdserve-prefill")
    for args, want in (
            ([DECODE, "--disaggregation-mode", "null", "--enable-mixed-chunk",
              "--disable-mixed-chunk"], "contradict"),
            ([DECODE, "--disaggregation-mode", "decode", "--enable-mixed-chunk"], "null only"),
            ([prefill, "--disaggregation-mode", "null"], "must be prefill")):
        r = subprocess.run(args + ["--model-path", model, "--port", str(pc.free_port())],
                           capture_output=True, text=True, timeout=60)
        check(r.returncode == 2 and want in r.stderr, "%s: rc %d %r" %
              (" ".join(args[1:]), r.returncode, r.stderr[-300:]))
    r = subprocess.run([DECODE, "--help"], capture_output=True, text=True, timeout=30)
    check(r.returncode == 0 and "--enable-mixed-chunk" in r.stdout and "null" in r.stdout,
          "--help documents null mode and --enable-mixed-chunk")


def main():
    tmp = pc.tmpdir()

    def cases():
        model = pc.make_model(BUILD, tmp)
        case_bad_flags(model)
        prompts, refs, counts = case_main(model, tmp)
        case_unmixed(model, tmp, prompts, refs, counts, "--disable-mixed-chunk")
        case_unmixed(model, tmp, prompts, refs, counts, "--enable-mixed-chunk=false")
        case_small_pool(model, tmp)

    pc.run_test("coloc_daemon", cases, tmp)


if __name__ == "__main__":
    main()
