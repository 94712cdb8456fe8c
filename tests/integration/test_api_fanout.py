#!/usr/bin/env python3
"""test_api_fanout.py — batches and n > 1 (SGLang's fan-out into sub-requests), stop strings and
logprobs of the first token, against real daemons on 127.0.0.1 with the tiny model of
pdserve-mkmodel. Every expected answer is the same daemon's answer to the single request.

  coloc  pdserve-decode --disaggregation-mode null, requests sent to it directly.
  pd     pdserve-router in front of pdserve-prefill + pdserve-decode (UCX shared memory): the
         router sends one bootstrap_room per sub-request, both daemons fan out alike.

What a user would notice, in both cases:
  * n = 3 at temperature 0: three identical choices (index 0..2) equal to the n = 1 answer;
    usage counts the prompt once and every choice's tokens.
  * n = 4 sampled with a seed: the choices differ, the same request again gives the same four,
    choice 0 equals the n = 1 answer with that seed.
  * /generate with a list of texts / of token-id lists (and n = 2): a JSON list in order, each
    equal to the single answer; /v1/completions with a prompt list and n = 2: choice k answers
    prompt k // 2.
  * streams: chat n = 2 with include_usage interleaves chunks by index (each index starts with
    the role, ends with one finish_reason), then one usage chunk, then one [DONE]; a batch
    /generate stream carries "index".
  * stop strings cut every choice; echo puts the prompt before each choice's text (with logprobs:
    the prompt's entries, then the completion's, per choice); the first output token's top_logprobs are
    filled.
  * 400 for n outside [1, 128] and for a batch with one bad prompt (nothing left running); a
    client that leaves a fanned-out stream aborts every sub-request: the pools are full again.

Stdlib only. Usage: test_api_fanout.py BUILD_DIR coloc|pd. Every process is killed on exit.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pd_cluster as pc  # noqa: E402
from pd_cluster import (check, json_post as post, ok_post as ok, step,  # noqa: E402
                        stream_chunks as events)

BUILD = os.path.abspath(sys.argv[1])
CASE = sys.argv[2] if len(sys.argv) > 2 else "coloc"


A = "the quick brown fox jumps over"
B = "a lazy dog while seven wizards"


def single_completion(srv, prompt, **kw):
    body = {"prompt": prompt, "max_tokens": 6, "temperature": 0}
    body.update(kw)
    return ok(srv, "/v1/completions", body, "single completion")


def case_n(srv):
    step("n = 3 greedy, n = 4 seeded")
    one = single_completion(srv, A)
    three = single_completion(srv, A, n=3)
    if one and three:
        ch = three["choices"]
        check([c["index"] for c in ch] == [0, 1, 2], "indices 0..2: %s" % ch)
        check(all(c["text"] == one["choices"][0]["text"] for c in ch),
              "greedy choices equal the n = 1 text: %s vs %s" % (ch, one["choices"][0]))
        u, u1 = three["usage"], one["usage"]
        check(u["prompt_tokens"] == u1["prompt_tokens"], "prompt counted once: %s" % u)
        check(u["completion_tokens"] == 3 * u1["completion_tokens"],
              "completion tokens summed: %s vs %s" % (u, u1))
        check(u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], "total: %s" % u)
    kw = {"temperature": 1.0, "seed": 11, "max_tokens": 8}
    s1 = single_completion(srv, A, **kw)
    s4 = single_completion(srv, A, n=4, **kw)
    s4b = single_completion(srv, A, n=4, **kw)
    if s1 and s4 and s4b:
        texts = [c["text"] for c in s4["choices"]]
        check(len(set(texts)) >= 2, "seeded samples differ: %s" % texts)
        check(texts == [c["text"] for c in s4b["choices"]], "the same seed, the same samples")
        check(texts[0] == s1["choices"][0]["text"], "choice 0 is the n = 1 sample: %s vs %s" %
              (texts[0], s1["choices"][0]["text"]))


def case_batches(srv, tok):
    step("batch /generate, prompt lists")
    sp = {"max_new_tokens": 5, "temperature": 0}
    sa = ok(srv, "/generate", {"text": A, "sampling_params": sp}, "single A")
    sb = ok(srv, "/generate", {"text": B, "sampling_params": sp}, "single B")
    batch = ok(srv, "/generate", {"text": [A, B], "sampling_params": sp}, "batch text")
    if sa and sb and check(isinstance(batch, list) and len(batch) == 2, "a list of 2: %s" % batch):
        check(batch[0]["output_ids"] == sa["output_ids"] and batch[1]["output_ids"] ==
              sb["output_ids"], "batch items equal the single answers")
        check(batch[0]["meta_info"]["id"] != batch[1]["meta_info"]["id"], "own rids")
    ids = ok(tok, "/tokenize", {"prompt": A}, "tokenize")  # the router has no /tokenize
    idb = ok(tok, "/tokenize", {"prompt": B}, "tokenize")
    if ids and idb and sa and sb:
        ia, ib = ids["tokens"], idb["tokens"]
        sp2 = dict(sp, n=2)
        out = ok(srv, "/generate", {"input_ids": [ia, ib], "sampling_params": sp2, "rid": "bq"},
                 "batch ids n = 2")
        if out and check(isinstance(out, list) and len(out) == 4, "4 items: %s" % out):
            want = [sa, sa, sb, sb]
            check(all(o["output_ids"] == w["output_ids"] for o, w in zip(out, want)),
                  "prompt-major order, greedy samples equal")
            check([o["meta_info"]["id"] for o in out] == ["bq_0", "bq_1", "bq_2", "bq_3"],
                  "rid_k: %s" % [o["meta_info"]["id"] for o in out])
    ca, cb = single_completion(srv, A), single_completion(srv, B)
    lst = single_completion(srv, [A, B], n=2)
    if ca and cb and lst:
        texts = [c["text"] for c in lst["choices"]]
        want = [ca["choices"][0]["text"]] * 2 + [cb["choices"][0]["text"]] * 2
        check(texts == want, "completions choice k answers prompt k // 2: %s vs %s" %
              (texts, want))
        check(lst["usage"]["prompt_tokens"] ==
              ca["usage"]["prompt_tokens"] + cb["usage"]["prompt_tokens"], "prompt tokens")


def case_streams(srv):
    step("streams: chat n = 2, batch /generate")
    msgs = [{"role": "user", "content": "hello there"}]
    one = ok(srv, "/v1/chat/completions", {"messages": msgs, "max_tokens": 6, "temperature": 0},
             "single chat")
    evs = events(srv, "/v1/chat/completions",
                 {"messages": msgs, "max_tokens": 6, "temperature": 0, "n": 2, "stream": True,
                  "stream_options": {"include_usage": True}})
    if one and evs:
        content, roles, finishes = {0: "", 1: ""}, {0: [], 1: []}, {0: [], 1: []}
        for e in evs[:-1]:
            for c in e["choices"]:
                i = c["index"]
                content[i] += c["delta"].get("content", "")
                roles[i].append(c["delta"].get("role"))
                if c["finish_reason"]:
                    finishes[i].append(c["finish_reason"])
        want = one["choices"][0]["message"]["content"]
        check(content[0] == want and content[1] == want,
              "streamed choices equal the single answer: %s vs %s" % (content, want))
        check(all(roles[i] and roles[i][0] == "assistant" for i in (0, 1)), "role first")
        check(all(len(finishes[i]) == 1 for i in (0, 1)), "one finish_reason each: %s" %
              finishes)
        last = evs[-1]
        check(last["choices"] == [] and last["usage"]["prompt_tokens"] ==
              one["usage"]["prompt_tokens"] and last["usage"]["completion_tokens"] ==
              2 * one["usage"]["completion_tokens"], "usage chunk: %s" % last)
    sp = {"max_new_tokens": 5, "temperature": 0}
    sa = ok(srv, "/generate", {"text": A, "sampling_params": sp}, "single A")
    sb = ok(srv, "/generate", {"text": B, "sampling_params": sp}, "single B")
    gevs = events(srv, "/generate", {"text": [A, B], "sampling_params": sp, "stream": True})
    if sa and sb and gevs:
        last = {}
        for e in gevs:
            check("index" in e, "batch stream events carry index: %s" % e)
            last[e.get("index")] = e
        check(set(last) == {0, 1}, "both indices streamed: %s" % list(last))
        check(last.get(0, {}).get("text") == sa["text"] and
              last.get(1, {}).get("text") == sb["text"], "final texts equal the single answers")


def case_stop_logprobs(srv):
    step("stop strings per choice; first token's top_logprobs")
    one = single_completion(srv, A, max_tokens=8)
    if one:
        text = one["choices"][0]["text"]
        stop = text[2:4]
        if check(len(stop) == 2, "reference text long enough: %r" % text):
            cut = single_completion(srv, A, max_tokens=8, n=2, stop=[stop])
            if cut:
                for c in cut["choices"]:
                    check(c["finish_reason"] == "stop" and c["text"] == text[:text.index(stop)],
                          "stop %r cuts %r: %s" % (stop, text, c))
    echo = single_completion(srv, A, max_tokens=8, n=2, echo=True)
    if one and echo:
        for c in echo["choices"]:
            check(c["text"] == A + one["choices"][0]["text"],
                  "echo: the prompt, then the completion: %r" % c["text"])
    sp = single_completion(srv, A, max_tokens=8, echo=True, stop=[A[:12]])
    if one and sp and one["choices"][0]["text"].find(A[:12]) < 0:
        check(sp["choices"][0]["text"] == A + one["choices"][0]["text"],
              "a stop string in the echoed prompt does not stop: %r" % sp["choices"][0])
    el = ok(srv, "/v1/completions", {"prompt": A, "echo": True, "logprobs": 1, "n": 2,
                                      "max_tokens": 2, "temperature": 0}, "echo + logprobs")
    if el and echo:
        for c in el["choices"]:  # test_input_logprobs.py checks the values
            lp = c["logprobs"]
            check(lp["token_logprobs"][0] is None and len(lp["tokens"]) ==
                  el["usage"]["prompt_tokens"] + 2, "echo + logprobs n = 2: the prompt's "
                  "entries, then 2: %s" % lp["tokens"])
    lp = ok(srv, "/v1/chat/completions",
            {"messages": [{"role": "user", "content": A}], "max_tokens": 3, "temperature": 0,
             "logprobs": True, "top_logprobs": 3}, "chat logprobs")
    if lp:
        content = lp["choices"][0]["logprobs"]["content"]
        check(len(content) == 3 and all(len(c["top_logprobs"]) == 3 for c in content),
              "every token, the first included, has 3 top logprobs: %s" % content)
        if content and content[0]["top_logprobs"]:
            top0 = content[0]["top_logprobs"][0]
            check(abs(top0["logprob"] - content[0]["logprob"]) < 1e-4,
                  "greedy first token is its own top-1: %s" % content[0])
    g = ok(srv, "/generate", {"text": A, "sampling_params": {"max_new_tokens": 2,
                                                             "temperature": 0},
                              "return_logprob": True, "top_logprobs_num": 2}, "generate lp")
    if g:
        top = g["meta_info"].get("output_top_logprobs", [])
        check(len(top) == 2 and all(len(t) == 2 for t in top), "output_top_logprobs: %s" % top)


def case_errors(srv, daemons):
    step("refusals, a failing batch, a client leaving a fanned-out stream")
    for n in (0, 129, 2.5):
        st, j = post(srv, "/v1/completions", {"prompt": A, "n": n})
        check(st == 400 and "'n'" in json.dumps(j), "n = %s: 400 naming n: %s %s" % (n, st, j))
    too_long = " ".join(["wizard"] * 3000)
    st, j = post(srv, "/v1/completions", {"prompt": [A, too_long], "max_tokens": 4})
    check(st == 400 and "context length" in json.dumps(j), "one bad prompt fails the batch: %s %s"
          % (st, j))
    s = pc_stream(srv.port, "/v1/completions",
                  {"prompt": A, "n": 3, "max_tokens": 400, "temperature": 0.7, "stream": True,
                   "ignore_eos": True})
    s.read_events(6, timeout=30)
    s.close()
    for d in daemons:
        check(d.pool_full(20), "%s pool full again after the client left" % d.role)


def pc_stream(port, path, body):
    from test_pd_router import Stream  # noqa: E402
    return Stream(port, path, body)


def case_direct_pd(dc):
    step("a daemon in PD mode: n > 1 needs a list of rooms")
    st, j = post(dc, "/v1/completions", {"prompt": A, "n": 2, "bootstrap_room": 5,
                                          "bootstrap_host": "127.0.0.1"})
    check(st == 400 and "list of 2 rooms" in json.dumps(j), "scalar room with n = 2: %s %s" %
          (st, j))


def main():
    tmp = pc.tmpdir()
    model = pc.make_model(BUILD, tmp)

    def cases():
        if CASE == "coloc":
            srv = pc.Coloc(BUILD, model, tmp)
            daemons = [srv]
        else:
            pf, dc, srv = pc.start_cluster(BUILD, tmp, model)
            daemons = [pf, dc]
            case_direct_pd(dc)
        case_n(srv)
        case_batches(srv, daemons[-1])
        case_streams(srv)
        case_stop_logprobs(srv)
        case_errors(srv, daemons)

    pc.run_test("api_fanout %s" % CASE, cases, tmp)


if __name__ == "__main__":
    main()
