#!/usr/bin/env python3
"""test_api_contract.py — /work/shared/API.md walked line by line against real processes: a
prefill, a decode and a router (--api-key, UCX over shared memory) and a colocated daemon, all
on 127.0.0.1 with the tiny model of pdserve-mkmodel. Every endpoint, request field, response
field, error status and metric name the contract lists is asserted here by a real request, so
a field that goes missing fails this test (deeper behaviour — equality with pdserve-generate,
failures, queue limits, 429, 502, mid-stream errors — is asserted by test_pd_router,
test_router, test_coloc, test_metrics and test_openai_client; here only cheaply).

Stdlib only. Usage: test_api_contract.py BUILD_DIR. Every process is killed (by PID) on exit.
"""
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pd_cluster as pc  # noqa: E402
from pd_cluster import check, step  # noqa: E402

BUILD = os.path.abspath(sys.argv[1])
KEY = "sk-api-contract"
AUTH = {"Authorization": "Bearer " + KEY}

TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
ITL_BUCKETS = [0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06,
               0.08, 0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8]


def get_json(srv, path, what):
    st, raw = srv.get(path)
    if not check(st == 200, "%s GET %s: status %s %r" % (what, path, st, raw[:200])):
        return None
    try:
        return json.loads(raw)
    except ValueError:
        check(False, "%s GET %s: not JSON %r" % (what, path, raw[:200]))
        return None


def has_keys(obj, keys, what):
    missing = [k for k in keys if not isinstance(obj, dict) or k not in obj]
    return check(not missing, "%s: missing %s in %r" % (what, missing, str(obj)[:300]))


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def error_shape(st, raw, want, what, param=None):
    """An OpenAI error body {"error": {"message", "type", "param", "code"}} with status want."""
    check(st == want, "%s: status %s, want %d (%r)" % (what, st, want, raw[:200]))
    try:
        e = json.loads(raw)["error"]
    except (ValueError, KeyError, TypeError):
        check(False, "%s: not an OpenAI error body: %r" % (what, raw[:200]))
        return None
    has_keys(e, ["message", "type", "param", "code"], what + " error")
    check(isinstance(e.get("message"), str) and e["message"], "%s: empty message" % what)
    if param is not None:
        check(e.get("param") == param, "%s: param %r, want %r" % (what, e.get("param"), param))
    return e


# ---------------------------------------------------------------- info endpoints


def info_endpoints(srv, what, role, ctx_len):
    """/health, /health_generate, /v1/models, /model_info (+alias), /get_load; for daemons also
    /server_info (+alias) and /v1/loads. Returns /v1/models' served name."""
    for path in ("/health", "/health_generate"):
        st, raw = srv.get(path, timeout=30)
        check(st == 200, "%s GET %s: %s %r" % (what, path, st, raw[:200]))
    m = get_json(srv, "/v1/models", what)
    name = None
    if m is not None and check(m.get("object") == "list" and len(m.get("data", [])) == 1,
                               "%s /v1/models: %r" % (what, m)):
        d = m["data"][0]
        has_keys(d, ["id", "object", "created", "owned_by", "root", "max_model_len"],
                 what + " /v1/models data[0]")
        name = d.get("id")
        check(d.get("object") == "model" and d.get("owned_by") == "sglang",
              "%s /v1/models object/owned_by: %r" % (what, d))
        check(is_int(d.get("created")) and abs(d["created"] - time.time()) < 3600,
              "%s /v1/models created is not a recent unix time: %r" % (what, d.get("created")))
        if ctx_len:
            check(d.get("max_model_len") == ctx_len, "%s max_model_len %r != context_length %d" %
                  (what, d.get("max_model_len"), ctx_len))
    for path in ("/model_info", "/get_model_info"):
        mi = get_json(srv, path, what)
        if mi is not None and has_keys(mi, ["model_path", "tokenizer_path", "is_generation",
                                            "model_type", "architectures"], what + " " + path):
            check(mi["is_generation"] is True and isinstance(mi["architectures"], list) and
                  isinstance(mi["model_type"], str), "%s %s values: %r" % (what, path, mi))
    gl = get_json(srv, "/get_load", what)
    if gl is not None:
        check(is_int(gl.get("load")), "%s /get_load: %r" % (what, gl))
    if role == "router":
        si = get_json(srv, "/server_info", what)
        if si is not None and has_keys(si, ["version", "workers", "internal_states"],
                                       what + " /server_info"):
            ist = si["internal_states"]
            check(isinstance(ist, list) and ist and all(isinstance(x, dict) for x in ist),
                  "%s /server_info internal_states must be [{...}]: %r" % (what, ist))
        return name
    for path in ("/server_info", "/get_server_info"):
        si = get_json(srv, path, what)
        if si is None:
            continue
        has_keys(si, ["model_path", "served_model_name", "tp_size", "dp_size",
                      "disaggregation_mode", "context_length", "max_total_tokens",
                      "max_running_requests", "page_size", "version", "internal_states",
                      "kv_pool", "transfer_transport"], "%s %s" % (what, path))
        check(si.get("disaggregation_mode") == role, "%s %s disaggregation_mode %r != %r" %
              (what, path, si.get("disaggregation_mode"), role))
        ist = si.get("internal_states")
        check(isinstance(ist, list) and len(ist) >= 1 and all(isinstance(x, dict) for x in ist),
              "%s %s internal_states must be [{...}]: %r" % (what, path, ist))
        check(si.get("dp_size") == 1 and si.get("tp_size") == 1 and si.get("page_size") == 16,
              "%s %s sizes: %r" % (what, path, {k: si.get(k) for k in
                                                 ("dp_size", "tp_size", "page_size")}))
        has_keys(si.get("kv_pool"), ["num_pages", "free_pages", "used_pages"],
                 "%s %s kv_pool" % (what, path))
        if ctx_len:
            check(si.get("context_length") == ctx_len, "%s context_length %r" %
                  (what, si.get("context_length")))
    lo = get_json(srv, "/v1/loads", what)
    if lo is not None and check(isinstance(lo.get("loads"), list) and lo["loads"],
                                "%s /v1/loads: %r" % (what, lo)):
        has_keys(lo["loads"][0], ["num_running_reqs", "num_waiting_reqs", "num_used_tokens",
                                  "max_total_num_tokens", "token_usage"], what + " /v1/loads")
    return name


def tokenizer_endpoints(srv, what, ref_tokens=None):
    """/tokenize {"prompt"} → ids, /detokenize {"tokens"} → the text back; /flush_cache;
    /abort_request {"rid"}. Returns the ids of the sample text."""
    text = "the contract says: field for field"
    st, j = pc.json_post(srv, "/tokenize", {"prompt": text, "add_special_tokens": False})
    ids = None
    if check(st == 200 and isinstance(j, dict), "%s /tokenize: %s %r" % (what, st, j)):
        ids = j.get("tokens")
        check(isinstance(ids, list) and ids and all(is_int(t) for t in ids),
              "%s /tokenize tokens: %r" % (what, j))
        if ref_tokens is not None:
            check(ids == ref_tokens, "%s /tokenize %r != the daemon's %r" % (what, ids, ref_tokens))
        st, d = pc.json_post(srv, "/detokenize", {"tokens": ids})
        check(st == 200 and isinstance(d, dict) and d.get("text") == text,
              "%s /detokenize of /tokenize is not the text back: %s %r" % (what, st, d))
    st, raw = srv.post("/flush_cache", {})
    check(st == 200, "%s /flush_cache: %s %r" % (what, st, raw[:200]))
    st, raw = srv.post("/abort_request", {"rid": "no-such-request"})
    check(st == 200, "%s /abort_request of an unknown rid: %s %r" % (what, st, raw[:200]))
    return ids


# ---------------------------------------------------------------- OpenAI endpoints


def usage_ok(u, what, n_prompt=None, n_completion=None):
    if not has_keys(u, ["prompt_tokens", "completion_tokens", "total_tokens",
                        "prompt_tokens_details"], what + " usage"):
        return
    check(u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"],
          "%s usage does not add up: %r" % (what, u))
    ptd = u["prompt_tokens_details"]
    check(isinstance(ptd, dict) and is_int(ptd.get("cached_tokens")),
          "%s usage.prompt_tokens_details.cached_tokens: %r" % (what, u))
    if n_prompt is not None:
        check(u["prompt_tokens"] == n_prompt, "%s prompt_tokens %r, want %d" %
              (what, u["prompt_tokens"], n_prompt))
    if n_completion is not None:
        check(u["completion_tokens"] == n_completion, "%s completion_tokens %r, want %d" %
              (what, u["completion_tokens"], n_completion))


def completion_ok(j, what, n_choices, name):
    """The shape of a /v1/completions answer."""
    if not has_keys(j, ["id", "object", "created", "model", "choices", "usage"], what):
        return False
    check(j["id"].startswith("cmpl-") and j["object"] == "text_completion" and
          is_int(j["created"]) and j["model"] == name, "%s head: %r" % (what, str(j)[:300]))
    ch = j["choices"]
    if not check(len(ch) == n_choices and [c.get("index") for c in ch] == list(range(n_choices)),
                 "%s: %d choices, want %d with index 0..: %r" % (what, len(ch), n_choices, ch)):
        return False
    for c in ch:
        has_keys(c, ["index", "text", "logprobs", "finish_reason"], what + " choice")
        check(c.get("finish_reason") in ("stop", "length"), "%s finish_reason %r" %
              (what, c.get("finish_reason")))
    usage_ok(j["usage"], what)
    return True


def chat_ok(j, what, name):
    if not has_keys(j, ["id", "object", "created", "model", "choices", "usage"], what):
        return False
    check(j["id"].startswith("chatcmpl-") and j["object"] == "chat.completion" and
          is_int(j["created"]) and j["model"] == name, "%s head: %r" % (what, str(j)[:300]))
    c = j["choices"][0] if j["choices"] else {}
    has_keys(c, ["index", "message", "logprobs", "finish_reason"], what + " choice")
    m = c.get("message", {})
    check(m.get("role") == "assistant" and isinstance(m.get("content"), str),
          "%s message: %r" % (what, m))
    check(c.get("finish_reason") in ("stop", "length"), "%s finish_reason %r" %
          (what, c.get("finish_reason")))
    usage_ok(j["usage"], what)
    return True


def sse_ok(srv, path, body, what):
    """A streamed answer: text/event-stream, JSON events, one [DONE] last; the events."""
    c = srv.conn(60)
    try:
        c.request("POST", path, json.dumps(body), dict(srv.auth, **{
            "Content-Type": "application/json"}))
        r = c.getresponse()
        raw = r.read()
        ctype = r.getheader("Content-Type", "")
    finally:
        c.close()
    check(r.status == 200, "%s: status %s %r" % (what, r.status, raw[:200]))
    check(ctype.startswith("text/event-stream"), "%s Content-Type %r" % (what, ctype))
    evs = pc.sse_events(raw)
    check(evs and evs[-1] == "[DONE]" and evs.count("[DONE]") == 1,
          "%s: does not end with one [DONE]: %r" % (what, evs[-2:]))
    out = []
    for e in evs:
        if e != "[DONE]":
            try:
                out.append(json.loads(e))
            except ValueError:
                check(False, "%s: event not JSON: %r" % (what, e[:200]))
    for e in out:
        check("error" not in e, "%s: error event %r" % (what, e))
    return out


def stream_checks(srv, what, name, prompt_ids, ref_text, ref_usage):
    """Completions and chat streamed, with and without stream_options.include_usage."""
    body = {"model": name, "prompt": prompt_ids, "max_tokens": 4, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    evs = sse_ok(srv, "/v1/completions", body, what + " completions stream")
    if evs:
        choice_evs, last = evs[:-1], evs[-1]
        check(last.get("choices") == [] and isinstance(last.get("usage"), dict),
              "%s completions include_usage: last chunk %r" % (what, last))
        usage_ok(last.get("usage"), what + " usage chunk", ref_usage["prompt_tokens"],
                 ref_usage["completion_tokens"])
        text = ""
        for i, e in enumerate(choice_evs):
            check(e.get("object") == "text_completion" and e.get("id", "").startswith("cmpl-"),
                  "%s completion chunk head %r" % (what, str(e)[:200]))
            for c in e.get("choices", []):
                text += c.get("text", "")
                fin = c.get("finish_reason")
                if i < len(choice_evs) - 1:
                    check(fin is None, "%s chunk %d finish_reason %r before the end" %
                          (what, i, fin))
                else:
                    check(fin in ("stop", "length"), "%s last chunk finish %r" % (what, fin))
            check(e.get("usage") is None, "%s chunk %d carries usage %r" % (what, i, e))
        check(text == ref_text, "%s streamed text %r != not streamed %r" % (what, text, ref_text))
    body.pop("stream_options")
    evs = sse_ok(srv, "/v1/completions", body, what + " completions stream, no usage")
    check(evs and all(e.get("choices") and not e.get("usage") for e in evs),
          "%s: without include_usage no usage chunk: %r" % (what, [e.get("usage") for e in evs]))

    msgs = [{"role": "user", "content": "Stream the answer."}]
    body = {"model": name, "messages": msgs, "max_tokens": 5, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
            "logprobs": True, "top_logprobs": 2}
    evs = sse_ok(srv, "/v1/chat/completions", body, what + " chat stream")
    if evs:
        choice_evs, last = evs[:-1], evs[-1]
        check(last.get("choices") == [] and isinstance(last.get("usage"), dict),
              "%s chat include_usage: last chunk %r" % (what, last))
        usage_ok(last.get("usage"), what + " chat usage chunk", None, 5)
        roles, fins, n_lp = [], [], 0
        for e in choice_evs:
            check(e.get("object") == "chat.completion.chunk" and
                  e.get("id", "").startswith("chatcmpl-"), "%s chat chunk head %r" %
                  (what, str(e)[:200]))
            for c in e.get("choices", []):
                has_keys(c, ["index", "delta", "finish_reason"], what + " chat chunk choice")
                roles.append(c.get("delta", {}).get("role"))
                fins.append(c.get("finish_reason"))
                lp = c.get("logprobs") or {}
                for t in lp.get("content") or []:
                    n_lp += 1
                    has_keys(t, ["token", "logprob", "bytes", "top_logprobs"],
                             what + " chat chunk logprob")
        check(roles and roles[0] == "assistant" and all(r is None for r in roles[1:]),
              "%s chat stream: delta.role must come first and once: %r" % (what, roles))
        check(fins and all(f is None for f in fins[:-1]) and fins[-1] in ("stop", "length"),
              "%s chat stream finish_reason null → value: %r" % (what, fins))
        check(n_lp == 5, "%s chat stream: %d logprob entries for 5 tokens" % (what, n_lp))


def openai_checks(srv, what, name, ctx_len, prompt_ids):
    step("%s: OpenAI endpoints" % what)
    post = srv.post
    # prompt: str | [str] | [int] | [[int]]
    base = {"model": name, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    ref = None
    for prompt, n in (("a plain text prompt", 1), (["first", "second"], 2), (prompt_ids, 1),
                      ([prompt_ids, prompt_ids[:3]], 2)):
        st, j = pc.json_post(srv, "/v1/completions", dict(base, prompt=prompt))
        w = "%s completions prompt=%s" % (what, json.dumps(prompt)[:40])
        if check(st == 200, "%s: %s %r" % (w, st, j)) and completion_ok(j, w, n, name):
            for c in j["choices"]:
                check(c["finish_reason"] == "length", "%s: ignore_eos, finish %r" %
                      (w, c["finish_reason"]))
            check(j["usage"]["completion_tokens"] == 4 * n, "%s completion_tokens %r" %
                  (w, j["usage"]))
            if prompt is prompt_ids:
                usage_ok(j["usage"], w, len(prompt_ids), 4)
                ref = j
    # n, logprobs (int), seed, user, stop, extensions
    st, j = pc.json_post(srv, "/v1/completions", dict(base, prompt=prompt_ids, n=2, logprobs=2,
                                                      user="contract-user"))
    if check(st == 200, "%s n=2 logprobs=2: %s %r" % (what, st, j)) and \
            completion_ok(j, what + " n=2", 2, name):
        lp = j["choices"][0]["logprobs"]
        if has_keys(lp, ["tokens", "token_logprobs", "top_logprobs", "text_offset"],
                    what + " completions logprobs"):
            check(len(lp["tokens"]) == 4 and len(lp["token_logprobs"]) == 4 and
                  all(isinstance(t, dict) and 1 <= len(t) <= 2 for t in lp["top_logprobs"]),
                  "%s completions logprobs sizes: %r" % (what, lp))
        if ref:
            check(j["choices"][0]["text"] == ref["choices"][0]["text"],
                  "%s greedy n=2 choice 0 %r != n=1 %r" % (what, j["choices"][0]["text"],
                                                          ref["choices"][0]["text"]))
    seeded = dict(base, prompt=prompt_ids, temperature=1.0, seed=1234, max_tokens=8)
    a = pc.json_post(srv, "/v1/completions", seeded)
    b = pc.json_post(srv, "/v1/completions", seeded)
    check(a[0] == 200 and b[0] == 200 and a[1]["choices"][0]["text"] ==
          b[1]["choices"][0]["text"], "%s seed: the same seed gave different text %r %r" %
          (what, a[1], b[1]))
    full, cut = "", ""
    if ref:
        # stop: a piece of the greedy text stops it there, finish "stop"
        st, j = pc.json_post(srv, "/v1/completions", dict(base, prompt=prompt_ids,
                                                          max_tokens=12))
        full = j["choices"][0]["text"] if st == 200 else ""
        cut = full[len(full) // 2:len(full) // 2 + 2]
        if check(len(cut) == 2 and full.find(cut) > 0, "%s: greedy text %r too short for a stop" %
                 (what, full)):
            st, j = pc.json_post(srv, "/v1/completions", dict(base, prompt=prompt_ids,
                                                              max_tokens=12, stop=[cut]))
            check(st == 200 and j["choices"][0]["finish_reason"] == "stop" and
                  j["choices"][0]["text"] == full[:full.find(cut)],
                  "%s stop %r in %r: %r" % (what, cut, full, j))
    ext = dict(base, prompt=prompt_ids, top_k=5, min_p=0.05, repetition_penalty=1.1,
               presence_penalty=0.5, frequency_penalty=0.5, min_tokens=3, stop_token_ids=[0],
               skip_special_tokens=True, logit_bias={}, temperature=0.7, top_p=0.9,
               ignore_eos=False)
    st, j = pc.json_post(srv, "/v1/completions", ext)
    if check(st == 200, "%s completions with every extension: %s %r" % (what, st, j)):
        completion_ok(j, what + " extensions", 1, name)
        check(j["usage"]["completion_tokens"] >= 3, "%s min_tokens 3: %r" % (what, j["usage"]))
    # logit_bias: +100 on one token makes greedy pick it every time (the prefill's first token
    # and the decode's after it); -100 on greedy's tokens changes the text; bad entries are a 400
    forced = 77
    st, d = pc.json_post(srv, "/detokenize", {"tokens": [forced] * 4})
    st2, j = pc.json_post(srv, "/v1/completions", dict(base, prompt=prompt_ids,
                                                       logit_bias={str(forced): 100}))
    check(st == 200 and st2 == 200 and j["choices"][0]["text"] == d["text"],
          "%s logit_bias +100 on token %d: %r, want %r" % (what, forced, j, d))
    st, g = pc.json_post(srv, "/generate", {"input_ids": prompt_ids, "sampling_params": {
        "max_new_tokens": 4, "temperature": 0, "ignore_eos": True}})
    if ref and check(st == 200, "%s /generate greedy ids: %s %r" % (what, st, g)):
        bias = {str(t): -100 for t in g["output_ids"]}
        st, j = pc.json_post(srv, "/v1/chat/completions", {
            "model": name, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1,
            "temperature": 0, "logit_bias": bias, "logprobs": True})
        check(st == 200, "%s chat with logit_bias: %s %r" % (what, st, j))
        st, j = pc.json_post(srv, "/v1/completions", dict(base, prompt=prompt_ids, logit_bias=bias,
                                                          logprobs=1))
        toks = j["choices"][0]["logprobs"]["tokens"] if st == 200 else None
        check(st == 200 and j["choices"][0]["text"] != ref["choices"][0]["text"],
              "%s logit_bias -100 on greedy's tokens %r left the text %r" % (what, bias, toks))
        # min_tokens: greedy's first token as a stop token ends the request at once, unless
        # min_tokens keeps it (and EOS) from being chosen until then; stop strings wait too
        g0 = g["output_ids"][0]
        st, j = pc.json_post(srv, "/v1/completions", dict(base, prompt=prompt_ids,
                                                          stop_token_ids=[g0], max_tokens=8))
        check(st == 200 and j["usage"]["completion_tokens"] == 1 and
              j["choices"][0]["finish_reason"] == "stop",
              "%s stop_token_ids [%d] (greedy's first): %r" % (what, g0, j))
        st, j = pc.json_post(srv, "/v1/completions", dict(base, prompt=prompt_ids, min_tokens=3,
                                                          stop_token_ids=[g0], max_tokens=8))
        check(st == 200 and j["usage"]["completion_tokens"] >= 3,
              "%s min_tokens 3 with stop_token_ids [%d]: %r" % (what, g0, j))
        if full and len(cut) == 2:
            st, j = pc.json_post(srv, "/v1/completions", dict(base, prompt=prompt_ids,
                                                              max_tokens=12, stop=[cut],
                                                              min_tokens=12))
            check(st == 200 and j["choices"][0]["text"] == full and
                  j["choices"][0]["finish_reason"] == "length",
                  "%s stop %r before min_tokens 12 must not stop: %r (full %r)" %
                  (what, cut, j, full))
        st, j = pc.json_post(srv, "/generate", {"input_ids": prompt_ids, "sampling_params": {
            "max_new_tokens": 8, "temperature": 0, "stop_token_ids": [g0],
            "min_new_tokens": 2}})
        check(st == 200 and j["meta_info"]["completion_tokens"] >= 2 and j["output_ids"][0] != g0,
              "%s /generate min_new_tokens 2 with stop_token_ids [%d]: %r" % (what, g0, j))
    st, raw = post("/v1/completions", dict(base, prompt=prompt_ids, logit_bias={"5": 1000}))
    error_shape(st, raw, 400, what + " logit_bias out of range", "logit_bias")
    st, raw = post("/v1/completions", dict(base, prompt=prompt_ids,
                                           logit_bias={str(10 ** 6): 1}))
    error_shape(st, raw, 400, what + " logit_bias token outside the vocabulary", "logit_bias")

    # chat
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello?"}]
    cbase = {"model": name, "messages": msgs, "temperature": 0, "ignore_eos": True}
    st, j = pc.json_post(srv, "/v1/chat/completions", dict(cbase, max_completion_tokens=3))
    n_chat = None
    if check(st == 200, "%s chat: %s %r" % (what, st, j)) and chat_ok(j, what + " chat", name):
        check(j["usage"]["completion_tokens"] == 3, "%s max_completion_tokens 3: %r" %
              (what, j["usage"]))
        n_chat = j["usage"]["prompt_tokens"]
    chat_ext = dict(cbase, max_tokens=3, logprobs=True, top_logprobs=2, n=2, seed=7,
                    stop=["\x00"], user="u", top_k=3, min_p=0.0, repetition_penalty=1.0,
                    skip_special_tokens=True, chat_template_kwargs={"enable_thinking": False})
    st, j = pc.json_post(srv, "/v1/chat/completions", chat_ext)
    if check(st == 200, "%s chat logprobs n=2: %s %r" % (what, st, j)) and \
            chat_ok(j, what + " chat logprobs", name):
        check(len(j["choices"]) == 2 and [c["index"] for c in j["choices"]] == [0, 1],
              "%s chat n=2 choices %r" % (what, j["choices"]))
        lp = (j["choices"][0].get("logprobs") or {}).get("content") or []
        check(len(lp) == 3 and all(len(t.get("top_logprobs", [])) == 2 for t in lp),
              "%s chat logprobs.content: %r" % (what, lp))
        for t in lp:
            has_keys(t, ["token", "logprob", "bytes", "top_logprobs"], what + " chat logprob")
    st, j = pc.json_post(srv, "/v1/chat/completions", dict(cbase, max_tokens=2,
                                                           add_generation_prompt=False))
    if check(st == 200, "%s add_generation_prompt false: %s %r" % (what, st, j)) and n_chat:
        check(j["usage"]["prompt_tokens"] < n_chat, "%s add_generation_prompt false: %d prompt "
              "tokens, with it %d" % (what, j["usage"]["prompt_tokens"], n_chat))

    # cached_tokens: the same long prompt again is served from the prefix cache
    long_ids = [(i * 37) % 900 + 20 for i in range(80)]
    pc.json_post(srv, "/v1/completions", dict(base, prompt=long_ids, max_tokens=1))
    st, j = pc.json_post(srv, "/v1/completions", dict(base, prompt=long_ids, max_tokens=1))
    check(st == 200 and j["usage"]["prompt_tokens_details"]["cached_tokens"] >= 64,
          "%s: the repeated 80-token prompt reports cached_tokens %r" %
          (what, st == 200 and j["usage"]))

    if ref:
        stream_checks(srv, what, name, prompt_ids, ref["choices"][0]["text"], ref["usage"])

    # errors
    st, raw = post("/v1/completions", dict(base, prompt=list(range(5, 5 + ctx_len + 10))))
    e = error_shape(st, raw, 400, what + " prompt longer than the context")
    if e:
        nums = re.findall(r"\d+", e["message"])
        check(str(ctx_len + 10) in nums and str(ctx_len) in nums,
              "%s too-long message must say both lengths (%d, %d): %r" %
              (what, ctx_len + 10, ctx_len, e["message"]))
    st, raw = post("/v1/completions", dict(base, model="no-such-model", prompt="x"))
    error_shape(st, raw, 404, what + " unknown model", "model")
    st, raw = post("/v1/chat/completions", dict(cbase, model="no-such-model"))
    error_shape(st, raw, 404, what + " chat unknown model", "model")
    st, raw = post("/v1/completions", dict(base, prompt="x", max_tokens="many"))
    error_shape(st, raw, 400, what + " max_tokens not a number")
    st, raw = post("/v1/chat/completions", dict(cbase, messages="not a list"))
    error_shape(st, raw, 400, what + " messages not a list")


def generate_checks(srv, what, prompt_ids):
    step("%s: /generate" % what)
    body = {"input_ids": prompt_ids, "sampling_params": {"max_new_tokens": 4, "temperature": 0,
                                                         "ignore_eos": True},
            "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 2,
            "rid": "contract-rid-1"}
    st, j = pc.json_post(srv, "/generate", body)
    if check(st == 200, "%s /generate: %s %r" % (what, st, j)) and \
            has_keys(j, ["text", "output_ids", "meta_info"], what + " /generate"):
        mi = j["meta_info"]
        has_keys(mi, ["id", "finish_reason", "prompt_tokens", "completion_tokens",
                      "cached_tokens", "e2e_latency", "input_token_logprobs",
                      "output_token_logprobs"], what + " /generate meta_info")
        check(mi.get("id") == "contract-rid-1", "%s rid not the meta_info.id: %r" % (what, mi))
        check(mi.get("finish_reason") == {"type": "length", "length": 4},
              "%s finish_reason %r" % (what, mi.get("finish_reason")))
        check(len(j["output_ids"]) == 4 and mi.get("completion_tokens") == 4 and
              mi.get("prompt_tokens") == len(prompt_ids), "%s counts %r" % (what, mi))
        check(len(mi.get("output_token_logprobs") or []) == 4, "%s output_token_logprobs %r" %
              (what, mi.get("output_token_logprobs")))
        text = j["text"]
        # stop string: finish_reason {"type": "stop", "matched": ...}
        cut = text[1:3]
        if check(len(cut) == 2 and text.find(cut) > 0, "%s: /generate text %r too short for a "
                 "stop string" % (what, text)):
            st, s = pc.json_post(srv, "/generate", {"input_ids": prompt_ids, "sampling_params": {
                "max_new_tokens": 4, "temperature": 0, "ignore_eos": True, "stop": cut}})
            check(st == 200 and s["meta_info"]["finish_reason"] == {"type": "stop",
                                                                    "matched": cut},
                  "%s /generate stop %r: %r" % (what, cut, s))
        evs = sse_ok(srv, "/generate", {"input_ids": prompt_ids, "stream": True,
                                        "sampling_params": {"max_new_tokens": 4,
                                                            "temperature": 0,
                                                            "ignore_eos": True}},
                     what + " /generate stream")
        if evs:
            texts = [e.get("text", "") for e in evs]
            check(all(texts[i + 1].startswith(texts[i]) for i in range(len(texts) - 1)) and
                  texts[-1] == text, "%s /generate stream text is not cumulative to %r: %r" %
                  (what, text, texts))
            check(evs[-1]["meta_info"]["finish_reason"] is not None and
                  all(e["meta_info"]["finish_reason"] is None for e in evs[:-1]),
                  "%s /generate stream finish_reason: %r" % (what, [e["meta_info"] for e in evs]))
    # sampling_params: every field the contract lists is accepted
    sp = {"max_new_tokens": 3, "temperature": 0.8, "top_p": 0.9, "top_k": 10, "min_p": 0.01,
          "stop": ["zzz"], "stop_token_ids": [0], "ignore_eos": False, "n": 2,
          "frequency_penalty": 0.1, "presence_penalty": 0.1, "repetition_penalty": 1.05,
          "skip_special_tokens": True}
    st, j = pc.json_post(srv, "/generate", {"text": ["one", "two"], "sampling_params": sp})
    check(st == 200 and isinstance(j, list) and len(j) == 4,
          "%s /generate batch of 2 texts × n 2: %s %r" % (what, st, str(j)[:300]))


# ---------------------------------------------------------------- metrics


def metrics_checks(srv, what, decode_side):
    step("%s: /metrics" % what)
    st, raw = srv.get("/metrics", headers={})  # public, like SGLang's
    if not check(st == 200, "%s /metrics: %s" % (what, st)):
        return
    text = raw.decode()
    series = [ln for ln in text.split("\n") if ln and not ln.startswith("#")]
    names = {re.split(r"[{ ]", ln, 1)[0] for ln in series}
    want = ["sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
            "sglang:num_used_tokens", "sglang:max_total_num_tokens", "sglang:cache_hit_rate",
            "sglang:cache_config_info", "sglang:prompt_tokens_total",
            "sglang:generation_tokens_total", "sglang:num_requests_total",
            "sglang:num_aborted_requests_total", "sglang:num_bootstrap_failed_reqs_total",
            "sglang:num_transfer_failed_reqs_total", "sglang:kv_transfer_speed_gb_s",
            "sglang:kv_transfer_latency_ms", "sglang:kv_transfer_total_mb"]
    for h in ("time_to_first_token_seconds", "e2e_request_latency_seconds",
              "queue_time_seconds") + (("inter_token_latency_seconds",) if decode_side else ()):
        want += ["sglang:%s_%s" % (h, s) for s in ("bucket", "sum", "count")]
    want += (["sglang:num_decode_prealloc_queue_reqs", "sglang:num_decode_transfer_queue_reqs"]
             if decode_side else
             ["sglang:num_prefill_prealloc_queue_reqs", "sglang:num_prefill_inflight_queue_reqs",
              "pdserve_num_bootstrap_queue_reqs"])
    want.append("pdserve_num_waiting_queue_reqs")  # pdserve's own queues (API.md)
    missing = [n for n in want if n not in names]
    check(not missing, "%s /metrics lacks %s" % (what, missing))
    unlabelled = [ln for ln in series if ln.startswith("sglang:") and 'model_name="' not in ln]
    check(not unlabelled, "%s: series without model_name: %r" % (what, unlabelled[:3]))
    cci = [ln for ln in series if ln.startswith("sglang:cache_config_info{")]
    check(len(cci) == 1 and 'page_size="16"' in cci[0] and 'num_pages="' in cci[0] and
          cci[0].endswith(" 1"), "%s cache_config_info: %r" % (what, cci))

    def buckets(name):
        les = re.findall(r'^%s_bucket\{[^}]*le="([^"]+)"' % re.escape(name), text, re.M)
        return [float(x) for x in les if x != "+Inf"], "+Inf" in les

    got, inf = buckets("sglang:time_to_first_token_seconds")
    check(got == TTFT_BUCKETS and inf, "%s TTFT buckets %r" % (what, got))
    if decode_side:
        got, inf = buckets("sglang:inter_token_latency_seconds")
        check(got == ITL_BUCKETS and inf, "%s ITL buckets %r" % (what, got))
    for n in ("sglang:prompt_tokens_total", "sglang:generation_tokens_total",
              "sglang:num_requests_total"):
        v = [float(ln.rsplit(" ", 1)[1]) for ln in series if ln.startswith(n + "{")]
        check(v and v[0] > 0, "%s %s is %r after requests" % (what, n, v))


# ---------------------------------------------------------------- the whole walk


def auth_checks(srv, what):
    for hdr, label in (({}, "missing"), ({"Authorization": "Bearer wrong"}, "wrong")):
        st, raw = srv.get("/v1/models", headers=hdr)
        e = error_shape(st, raw, 401, "%s %s API key" % (what, label))
        if e:
            check(e["type"] in ("invalid_request_error", "authentication_error"),
                  "%s 401 type %r" % (what, e["type"]))
        st, raw = http_post_raw(srv, "/v1/completions", {"prompt": "x", "max_tokens": 1}, hdr)
        check(st == 401, "%s completions with a %s key: %s" % (what, label, st))
    st, _ = srv.get("/health", headers={})
    check(st == 200, "%s /health needs no key (probes): %s" % (what, st))


def http_post_raw(srv, path, body, headers):
    return pc.http_call(srv.port, "POST", path, body, 30, headers)


def router_flags():
    r = subprocess.run([os.path.join(BUILD, "router", "pdserve-router"), "--help"],
                       capture_output=True, text=True, timeout=30)
    out = r.stdout + r.stderr
    for flag in ("--pd-disaggregation", "--prefill", "--decode", "--policy", "--host", "--port",
                 "--api-key", "--request-timeout-secs", "--max-concurrent-requests"):
        check(re.search(r"(^|\s)%s(\s|=|$)" % re.escape(flag), out, re.M),
              "pdserve-router --help lacks %s" % flag)
    for pol in ("round_robin", "random", "power_of_two", "cache_aware"):
        check(pol in out, "pdserve-router --help lacks policy %s" % pol)


def run(model, tmp):
    router_flags()
    key = ["--api-key", KEY]
    pf, dc, rt = pc.start_cluster(BUILD, tmp, model, key, key,
                                  key + ["--request-timeout-secs", "60",
                                         "--max-concurrent-requests", "64"])
    for p in (pf, dc, rt):
        p.auth = dict(AUTH)
    # the colocated daemon chooses tokens with the backend's sampler (as on CUDA), so a
    # logit_bias request must be seen to move that step to the host sampler
    co = pc.Coloc(BUILD, model, tmp, env=dict(os.environ, PD_GREEDY_FAST_PATH="1"))
    ctx = dc.server_info()["context_length"]

    step("info endpoints")
    names = {}
    for srv, what, role in ((pf, "prefill", "prefill"), (dc, "decode", "decode"),
                            (co, "colocated", "null"), (rt, "router", "router")):
        names[what] = info_endpoints(srv, what, role, ctx)
    check(len(set(names.values())) == 1, "served names differ: %r" % names)
    name = names["decode"]

    step("tokenizer, flush, abort endpoints")
    ids = tokenizer_endpoints(dc, "decode")
    for srv, what in ((pf, "prefill"), (co, "colocated"), (rt, "router")):
        tokenizer_endpoints(srv, what, ids)
    st, raw = rt.post("/abort_request", {})
    error_shape(st, raw, 400, "router /abort_request without rid")

    step("API key")
    for srv, what in ((pf, "prefill"), (dc, "decode"), (rt, "router")):
        auth_checks(srv, what)

    step("disaggregation fields")
    # (a decode takes such a body and prefills it itself: --local-prefill, test_daemons.py local)
    st, raw = pf.post("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 1}})
    error_shape(st, raw, 400, "prefill /generate without bootstrap fields", "bootstrap_room")

    prompt_ids = [(i * 53) % 700 + 30 for i in range(12)]
    for srv, what in ((rt, "router"), (co, "colocated")):
        openai_checks(srv, what, name, ctx, prompt_ids)
        generate_checks(srv, what, prompt_ids)

    metrics_checks(dc, "decode", True)
    metrics_checks(co, "colocated", True)
    metrics_checks(pf, "prefill", False)

    step("flush_cache through the router reaches the workers")
    long_ids = [(i * 41) % 800 + 40 for i in range(96)]
    pc.json_post(rt, "/v1/completions", {"prompt": long_ids, "max_tokens": 1})
    check(pc.wait_until(lambda: pf.pool()["cached_pages"] > 0, 10),
          "prefill caches nothing after a 96-token prompt: %r" % pf.pool())
    st, raw = rt.post("/flush_cache", {})
    check(st == 200, "router /flush_cache: %s %r" % (st, raw))
    check(pc.wait_until(lambda: pf.pool()["cached_pages"] == 0, 10),
          "router /flush_cache did not empty the prefill's cache: %r" % pf.pool())
    pc.json_post(co, "/v1/completions", {"prompt": long_ids, "max_tokens": 1})
    check(co.pool()["cached_pages"] > 0, "colocated caches nothing: %r" % co.pool())
    st, raw = co.post("/flush_cache", {})
    check(st == 200 and pc.wait_until(lambda: co.pool()["cached_pages"] == 0, 10),
          "colocated /flush_cache: %s, pool %r" % (st, co.pool()))

    st = co.server_info()
    check(st.get("sampled_on_device", 0) > 0 and st.get("sampled_on_host", 0) > 0,
          "colocated: tokens chosen on the device %r and on the host %r" %
          (st.get("sampled_on_device"), st.get("sampled_on_host")))

    step("pools full")
    check(pf.pool_full() and dc.pool_full() and co.pool_full(), "pools full at the end")

    step("not ready: a router whose workers are down")
    dead = pc.Router(BUILD, [(pc.free_port(), pc.free_port())], [pc.free_port()], tmp,
                     wait_ready=False)
    # up (it answers at all) and has tried its workers: none is healthy
    check(pc.wait_until(lambda: dead.get("/health", timeout=5)[0], 30),
          "the router without workers answers /health")
    check(pc.wait_until(lambda: all(not w["healthy"] and w.get("last_error")
                                    for w in json.loads(dead.get("/workers")[1])["workers"]),
                        30), "the router without workers has found each one down")
    st, raw = dead.get("/health")
    error_shape(st, raw, 503, "router /health without workers")
    st, raw = dead.post("/v1/completions", {"prompt": "x", "max_tokens": 1})
    error_shape(st, raw, 503, "router completions without workers")


def main():
    tmp = pc.tmpdir()
    model = pc.make_model(BUILD, tmp)
    pc.run_test("api contract", lambda: run(model, tmp), tmp, log_tail=3000)


if __name__ == "__main__":
    main()
