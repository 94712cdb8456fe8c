#!/usr/bin/env python3
"""test_input_logprobs.py — prompt (input) logprobs against real daemons on 127.0.0.1 with the
tiny model of pdserve-mkmodel, checked against an independent computation: pdserve-generate
--logits-out run on every prefix P[:t+1] of the prompt gives the logits that predict P[t+1]
(one unchunked prefill per prefix, in another process), whose log-softmax at P[t+1] is the
reference.

  coloc  pdserve-decode --disaggregation-mode null (--chunked-prefill-size 64,
         --max-running-requests 8: a 100-token prompt is scored in pieces of 8 logits rows).
  pd     pdserve-router in front of pdserve-prefill + pdserve-decode (UCX shared memory): the
         prefill scores the prompt, the router merges its answer into the decode's.

What a user would notice, in both cases:
  * /generate logprob_start_len 0: input_token_logprobs has one [logprob, id, null] per prompt
    token, the first null, the rest equal the reference within 1e-4; input_top_logprobs (5)
    sorted, the first null, holding the prompt token whenever its logprob reaches the 5th.
  * logprob_start_len 37: exactly the entries from token 37 on, equal to the full answer's.
  * the prefix cache: the same prompt served before (no logprobs) gives no cache hit to a
    logprobs request past logprob_start_len - 1 (cached_tokens 0 for 0, <= 49 for 50), and the
    same logprobs request twice answers identical input logprobs.
  * streams: every /generate chunk carries the same input_token_logprobs as the whole answer.
  * /v1/completions echo + logprobs 3 (as lm-eval sends it, max_tokens 0): tokens /
    token_logprobs / top_logprobs / text_offset cover the prompt, the first logprob null, the
    rest equal the reference; no completion token. With max_tokens 2: the prompt's entries
    then the completion's, streamed or not, the same. A list of prompts: choice k equals prompt
    k's single answer. max_tokens 0 without echo: 400.

Stdlib only. Usage: test_input_logprobs.py BUILD_DIR coloc|pd. Every process is killed on exit.
"""
import json
import math
import os
import random
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pd_cluster as pc  # noqa: E402
from pd_cluster import (check, json_post as post, ok_post as ok, step,  # noqa: E402
                        stream_chunks as events)

BUILD = os.path.abspath(sys.argv[1])
CASE = sys.argv[2] if len(sys.argv) > 2 else "coloc"
TOL = float(os.environ.get("PD_TEST_LP_TOL", "1e-4"))


def reference(model, tmp, prompt):
    """ref[t] = log p(prompt[t] | prompt[:t]) for t >= 1, from pdserve-generate's logits."""
    out = os.path.join(tmp, "ref_logits.f32")
    prefixes = "; ".join(" ".join(str(x) for x in prompt[:t]) for t in range(1, len(prompt) + 1))
    subprocess.run([os.path.join(BUILD, "tools", "pdserve-generate"), "--model-path", model,
                    "--prompt-ids", prefixes, "--max-new-tokens", "1", "--logits-out", out,
                    "--threads", "1"], check=True, capture_output=True, timeout=60)
    with open(out, "rb") as f:
        raw = f.read()
    n = len(prompt)
    vocab = len(raw) // 4 // n
    check(vocab * 4 * n == len(raw), "logits file holds %d rows" % n)
    ref, lsm_rows = [None], []
    for t in range(n):
        row = struct.unpack_from("<%df" % vocab, raw, t * vocab * 4)
        mx = max(row)
        lse = mx + math.log(sum(math.exp(v - mx) for v in row))
        lsm_rows.append([v - lse for v in row])
        if t + 1 < n:
            ref.append(lsm_rows[t][prompt[t + 1]])
    return ref, lsm_rows


def check_input(ilp, itop, prompt, start, ref, lsm_rows, what, top_n):
    if not check(isinstance(ilp, list) and len(ilp) == len(prompt) - start,
                 "%s: %d input entries for %d prompt tokens from %d: %s"
                 % (what, len(ilp or []), len(prompt), start, str(ilp)[:200])):
        return
    check([e[1] for e in ilp] == prompt[start:], "%s: the entries' ids are the prompt's" % what)
    for i, e in enumerate(ilp):
        t = start + i
        if t == 0:
            check(e[0] is None, "%s: the first prompt token's logprob is null: %s" % (what, e))
            continue
        if not check(e[0] is not None and abs(e[0] - ref[t]) < TOL,
                     "%s: token %d logprob %s, reference %.6f" % (what, t, e[0], ref[t])):
            return
    if itop is None:
        return
    check(len(itop) == len(ilp), "%s: one top entry per input token" % what)
    for i, tops in enumerate(itop):
        t = start + i
        if t == 0:
            check(tops is None, "%s: no top logprobs for the first prompt token" % what)
            continue
        lps = [x[0] for x in tops]
        if not check(len(tops) == top_n and lps == sorted(lps, reverse=True),
                     "%s: position %d top %d sorted: %s" % (what, t, top_n, tops)):
            return
        best = max(lsm_rows[t - 1])
        check(abs(lps[0] - best) < TOL, "%s: position %d top-1 %.6f = reference max %.6f"
              % (what, t, lps[0], best))
        if ref[t] >= lps[-1] + TOL:
            check(prompt[t] in [x[1] for x in tops],
                  "%s: token %d (logprob %.5f) in its top %d %s" % (what, t, ref[t], top_n, tops))


def case_generate(srv, prompt, ref, rows):
    step("/generate input_token_logprobs from 0 and from 37, top 5")
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 3, "temperature": 0},
            "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 5}
    g = ok(srv, "/generate", body, "generate start 0")
    if g:
        mi = g["meta_info"]
        check_input(mi.get("input_token_logprobs"), mi.get("input_top_logprobs"), prompt, 0, ref,
                    rows, "generate start 0", 5)
        check(len(mi.get("output_token_logprobs", [])) == 3, "3 output logprobs too")
    body37 = dict(body, logprob_start_len=37, top_logprobs_num=0)
    g37 = ok(srv, "/generate", body37, "generate start 37")
    if g37:
        mi = g37["meta_info"]
        check_input(mi.get("input_token_logprobs"), None, prompt, 37, ref, rows,
                    "generate start 37", 0)
        check("input_top_logprobs" not in mi, "no top logprobs when top_logprobs_num is 0")
    step("/generate stream: every chunk carries the input logprobs")
    evs = events(srv, "/generate", dict(body37, stream=True))
    if g37 and evs:
        want = g37["meta_info"]["input_token_logprobs"]
        check(all(e["meta_info"].get("input_token_logprobs") == want for e in evs),
              "each of %d chunks has the same input_token_logprobs" % len(evs))
    return g


def case_cache(srv, prompt, g):
    step("prefix cache: no hit past logprob_start_len - 1; the same request twice")
    plain = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    ok(srv, "/generate", plain, "warm the cache")
    again = ok(srv, "/generate", plain, "cached plain request")
    if again:
        check(again["meta_info"]["cached_tokens"] > 0, "the plain prompt hits the cache: %s"
              % again["meta_info"])
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 3, "temperature": 0},
            "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 5}
    a = ok(srv, "/generate", body, "lp after cache")
    b = ok(srv, "/generate", body, "lp again")
    if a and b and g:
        check(a["meta_info"]["cached_tokens"] == 0,
              "logprob_start_len 0 takes no cache hit: %d" % a["meta_info"]["cached_tokens"])
        check(a["meta_info"]["input_token_logprobs"] == b["meta_info"]["input_token_logprobs"]
              == g["meta_info"]["input_token_logprobs"] and
              a["meta_info"]["input_top_logprobs"] == g["meta_info"]["input_top_logprobs"],
              "the same input logprobs every time")
    c = ok(srv, "/generate", dict(body, logprob_start_len=50), "lp start 50 after cache")
    if c and g:
        ct = c["meta_info"]["cached_tokens"]
        check(0 < ct <= 49, "logprob_start_len 50: a cache hit of at most 49 tokens: %d" % ct)
        # positions 0..47 now come from the cache (KV of another step): equal within TOL
        check(close(c["meta_info"]["input_token_logprobs"],
                    g["meta_info"]["input_token_logprobs"][50:]),
              "start 50 equals the tail of start 0: %s vs %s"
              % (c["meta_info"]["input_token_logprobs"][:2],
                 g["meta_info"]["input_token_logprobs"][50:52]))


def close(a, b):
    """Two input_token_logprobs lists: the same ids, logprobs within TOL."""
    return len(a) == len(b) and all(
        x[1] == y[1] and (x[0] is None) == (y[0] is None) and
        (x[0] is None or abs(x[0] - y[0]) < TOL) for x, y in zip(a, b))


def close_values(a, b):
    """Two token_logprobs lists (completions): the same length and nulls, values within TOL.
    Separate requests may be batched and chunked differently by the scheduler, which changes
    float summation order, so equal answers agree to rounding, not to the bit."""
    return a is not None and b is not None and len(a) == len(b) and all(
        (x is None) == (y is None) and (x is None or abs(x - y) < TOL) for x, y in zip(a, b))


def completion_lists(lp):
    return lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], lp["text_offset"]


def case_completions(srv, prompt, ref):
    step("/v1/completions echo + logprobs (max_tokens 0, then 2, streamed)")
    body = {"prompt": prompt, "echo": True, "logprobs": 3, "max_tokens": 0, "temperature": 0}
    c = ok(srv, "/v1/completions", body, "echo logprobs max_tokens 0")
    if c:
        ch = c["choices"][0]
        toks, tlp, top, off = completion_lists(ch["logprobs"])
        check(len(toks) == len(tlp) == len(top) == len(off) == len(prompt),
              "one entry per prompt token: %d %d" % (len(tlp), len(prompt)))
        check(tlp[0] is None and top[0] is None, "the first prompt token's logprob is null")
        bad = [t for t in range(1, len(prompt)) if abs(tlp[t] - ref[t]) >= TOL]
        check(not bad, "prompt logprobs equal the reference (bad at %s)" % bad[:5])
        check(all(len(x) <= 3 for x in top[1:]), "at most 3 top logprobs per position")
        check(off == sorted(off) and off[0] == 0, "text offsets ascend from 0: %s" % off[:8])
        check(c["usage"]["completion_tokens"] == 0 and ch["finish_reason"] == "length",
              "max_tokens 0: no completion token: %s" % c["usage"])
    body2 = dict(body, max_tokens=2)
    c2 = ok(srv, "/v1/completions", body2, "echo logprobs max_tokens 2")
    if c2 and c:
        lp2 = c2["choices"][0]["logprobs"]
        check(len(lp2["token_logprobs"]) == len(prompt) + 2 and
              close_values(lp2["token_logprobs"][:len(prompt)],
                           c["choices"][0]["logprobs"]["token_logprobs"]),
              "the prompt's entries, then the completion's 2")
        evs = events(srv, "/v1/completions", dict(body2, stream=True))
        got = []
        for e in evs:
            for ch in e.get("choices", []):
                if ch.get("logprobs"):
                    got += ch["logprobs"]["token_logprobs"]
        check(close_values(got, lp2["token_logprobs"]),
              "streamed logprobs equal the whole answer's: %s vs %s"
              % (got[:3], lp2["token_logprobs"][:3]))
    step("a batch of prompts (lm-eval sends lists): choice k is prompt k's answer")
    other = prompt[:40]
    b = ok(srv, "/v1/completions", dict(body, prompt=[other, prompt]), "echo logprobs batch")
    one = ok(srv, "/v1/completions", dict(body, prompt=other), "echo logprobs other")
    if b and c and one:
        got = {ch["index"]: ch["logprobs"]["token_logprobs"] for ch in b["choices"]}
        check(close_values(got.get(0), one["choices"][0]["logprobs"]["token_logprobs"]) and
              close_values(got.get(1), c["choices"][0]["logprobs"]["token_logprobs"]),
              "batch choices equal the single answers: %s" % {k: len(v) for k, v in got.items()})
    st, j = post(srv, "/v1/completions", {"prompt": prompt, "max_tokens": 0})
    check(st == 400 and "max_tokens" in json.dumps(j), "max_tokens 0 without echo: 400 %s" % j)


def main():
    tmp = pc.tmpdir()
    model = pc.make_model(BUILD, tmp)
    rng = random.Random(7)
    prompt = [rng.randrange(1000) for _ in range(100)]

    def cases():
        ref, rows = reference(model, tmp, prompt)
        step("reference from pdserve-generate: %d prefixes" % len(prompt))
        if CASE == "coloc":
            srv = pc.Coloc(BUILD, model, tmp, ("--chunked-prefill-size", "64",
                                               "--max-running-requests", "8"))
        else:
            # the prefill's logprobs merged into the decode's answer: the PD path
            _, _, srv = pc.start_cluster(BUILD, tmp, model,
                                         prefill_extra=("--chunked-prefill-size", "64"),
                                         router_extra=pc.PD_PATH_ONLY)
        g = case_generate(srv, prompt, ref, rows)
        case_cache(srv, prompt, g)
        case_completions(srv, prompt, ref)

    pc.run_test("input_logprobs %s" % CASE, cases, tmp, log_tail=3000)


if __name__ == "__main__":
    main()
