#!/usr/bin/env python3
"""test_metrics.py — /metrics of pdserve-prefill, pdserve-decode and pdserve-router move as they
should (real processes on 127.0.0.1, UCX over shared memory, a tiny model). Every scrape is read
by a strict stdlib parser of the Prometheus text format (0.0.4): HELP/TYPE before samples, label
escapes, cumulative buckets ending in +Inf, _count equal to the +Inf bucket.

  load     16 concurrent long streams through the router: decode's running gauge and
           token_usage rise above 0 during the load and return to 0 after; TTFT / E2E /
           queue-time _count equal the requests sent, ITL _count equals the sum of
           (completion_tokens - 1); prompt / generation / cached token counters equal the sums of
           the responses' meta_info; KV bytes sent by prefill equal bytes received by decode, a
           whole number of pages per prompt page; the router's per-worker counters equal what was
           sent (ok outcome), its TTFT count the streams, its in-flight gauges return to 0; every
           daemon series carries model_name.
  queues   requests sent to one daemon alone: prefill's bootstrap-queue gauges show them until
           --bootstrap-timeout, then 0 and sglang:num_bootstrap_failed_reqs_total counts them;
           decode's transfer-queue gauge shows them until they fail, then
           sglang:num_transfer_failed_reqs_total and the KV failure counter (by reason) count
           them; pages back, token_usage 0.
  router   outcomes per worker: N ok, one client gone mid-stream (decode: client_gone), one bad
           request (a prompt over the context: 400 from a worker); each role's outcomes sum to
           the calls sent; sgl_router_pd_*_requests_total equal them too. Then clients gone
           while their KV pages move: both daemons count every one as aborted, none as failed
           (the router aborts on both, and prefill's abort used to reach decode first as a
           failed transfer).
  promtool every scrape of prefill, decode and router after a few requests (so histograms hold
           samples) piped into `promtool check metrics` (Debian package prometheus; missing, the
           case fails): every finding fails it except the few allowed on SGLang's own sglang:
           names (PROMTOOL_ALLOWED, each with its reason); the classifier is first shown to
           refuse a pdserve name with a colon and a counter without _total.
  dashboard every metric name the Grafana dashboard deploy/grafana/pdserve.json queries (panel
           expressions and template variables, PromQL functions, labels, ranges and Grafana
           variables stripped, _bucket/_sum/_count read as their histogram) is exported by the
           live router, prefill or decode; every query parses (promtool check rules); the
           dashboard is Grafana JSON on a ${datasource} Prometheus variable; an unknown name is
           first shown to be caught.

  handover every PD request's hand-over stages (pdserve_handover_seconds{stage}): 12 requests
           (some concurrent, prompts of several chunks): decode observes reserve, the three
           prefill stages (from prefill's done notice), kv_other and first_token once per request,
           and their sums add up to decode's own sglang:time_to_first_token_seconds sum (within
           1 %: the stages partition it); prefill observes bootstrap_wait and its three stages
           once per request, and its spans equal the ones decode received; /server_info
           summarizes each stage (count, mean); each stage's sum is non-negative, kv_other below
           decode's TTFT. The router observes dispatch, decode and relay once per streamed
           request; they add up to its pdserve_router_time_to_first_token_seconds, its decode
           stage holds decode's whole TTFT, and its /server_info summarizes them.

Stdlib only (and promtool). Usage: test_metrics.py BUILD_DIR CASE. Each case takes well under
60 s.
"""
import http.client
import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pd_cluster as pc  # noqa: E402
from pd_cluster import check, step  # noqa: E402

BUILD = os.path.abspath(sys.argv[1])
CASE = sys.argv[2] if len(sys.argv) > 2 else "load"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "pdserve.json")


# ---------------------------------------------------------------- the text format

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r"[a-zA-Z_][a-zA-Z0-9_]*"


class ParseError(Exception):
    pass


def parse_value(s):
    if s in ("+Inf", "-Inf", "NaN"):
        return float(s.replace("Inf", "inf").replace("NaN", "nan"))
    if not re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", s):
        raise ParseError("not a number: %r" % s)
    return float(s)


def parse_labels(s, lineno):
    """'a="x",b="y\\"z"' -> dict; escapes \\\\, \\", \\n only."""
    out, i = {}, 0
    while i < len(s):
        m = re.match(LABEL + "=\"", s[i:])
        if not m:
            raise ParseError("line %d: bad label at %r" % (lineno, s[i:]))
        name = s[i:i + m.end() - 2]
        i += m.end()
        val = []
        while True:
            if i >= len(s):
                raise ParseError("line %d: unterminated label value" % lineno)
            c = s[i]
            if c == "\\":
                nxt = s[i + 1:i + 2]
                if nxt not in ("\\", "\"", "n"):
                    raise ParseError("line %d: bad escape \\%s" % (lineno, nxt))
                val.append("\n" if nxt == "n" else nxt)
                i += 2
                continue
            if c == "\"":
                i += 1
                break
            val.append(c)
            i += 1
        if name in out:
            raise ParseError("line %d: label %s twice" % (lineno, name))
        out[name] = "".join(val)
        if i < len(s):
            if s[i] != ",":
                raise ParseError("line %d: labels not separated by commas" % lineno)
            i += 1
    return out


class Metrics:
    """One scrape: types[name], samples[(sample_name, frozenset(labels))] = value."""

    def __init__(self, text):
        self.types, self.samples, self.helps = {}, {}, {}
        family = None
        hist = {}  # labels without le -> [last le, last count, saw +Inf]
        if not text.endswith("\n"):
            raise ParseError("no newline at the end")
        for lineno, line in enumerate(text[:-1].split("\n"), 1):
            if line.startswith("# HELP "):
                m = re.fullmatch("# HELP (" + NAME + ") (.*)", line)
                if not m or re.search(r"\\[^\\n]", m.group(2).replace("\\\\", "")):
                    raise ParseError("line %d: bad HELP" % lineno)
                self.helps[m.group(1)] = m.group(2)
                continue
            if line.startswith("# TYPE "):
                m = re.fullmatch("# TYPE (" + NAME + ") (counter|gauge|histogram)", line)
                if not m or m.group(1) in self.types:
                    raise ParseError("line %d: bad or repeated TYPE: %r" % (lineno, line))
                for k, v in hist.items():
                    if v is not None:
                        raise ParseError("line %d: histogram %s without _count" % (lineno, k))
                family = m.group(1)
                self.types[family] = m.group(2)
                hist = {}
                continue
            if not line or line.startswith("#"):
                raise ParseError("line %d: unexpected %r" % (lineno, line))
            m = re.fullmatch("(" + NAME + r")(?:\{(.*)\})? (\S+)", line)
            if not m:
                raise ParseError("line %d: not a sample: %r" % (lineno, line))
            name, labels = m.group(1), parse_labels(m.group(2) or "", lineno)
            value = parse_value(m.group(3))
            if family is None:
                raise ParseError("line %d: sample before TYPE" % lineno)
            kind = self.types[family]
            suffix = name[len(family):] if name.startswith(family) else None
            if kind == "histogram":
                if suffix not in ("_bucket", "_sum", "_count"):
                    raise ParseError("line %d: %s in histogram %s" % (lineno, name, family))
                key = frozenset((k, v) for k, v in labels.items() if k != "le")
                if suffix == "_bucket":
                    le = parse_value(labels["le"])
                    last = hist.get(key) or [-math.inf, 0, False]
                    if not le > last[0] or value < last[1] or last[2]:
                        raise ParseError("line %d: buckets not increasing/cumulative" % lineno)
                    hist[key] = [le, value, le == math.inf]
                elif suffix == "_count":
                    if not hist.get(key) or not hist[key][2] or hist[key][1] != value:
                        raise ParseError("line %d: _count differs from +Inf bucket" % lineno)
                    hist[key] = None
            else:
                if suffix != "" or "le" in labels:
                    raise ParseError("line %d: %s does not belong to %s" % (lineno, name, family))
                if kind == "counter" and not value >= 0:
                    raise ParseError("line %d: negative counter" % lineno)
            sk = (name, frozenset(labels.items()))
            if sk in self.samples:
                raise ParseError("line %d: duplicate sample %s" % (lineno, line))
            self.samples[sk] = value
        for k, v in hist.items():
            if v is not None:
                raise ParseError("histogram %s without _count at the end" % (k,))

    def get(self, name, **labels):
        """The sample whose labels include the given ones (exactly one must match)."""
        hits = [v for (n, ls), v in self.samples.items()
                if n == name and all((k, v2) in ls for k, v2 in labels.items())]
        if len(hits) != 1:
            raise KeyError("%s %s: %d samples" % (name, labels, len(hits)))
        return hits[0]

    def sum(self, name, **labels):
        return sum(v for (n, ls), v in self.samples.items()
                   if n == name and all((k, v2) in ls for k, v2 in labels.items()))

    def names(self):
        return {n for n, _ in self.samples}


def scrape(proc):
    st, body = proc.get("/metrics")
    if st != 200:
        raise OSError("/metrics answered %d" % st)
    return Metrics(body.decode())


def parser_refuses():
    """The parser must refuse broken text (else the checks could not fail)."""
    bad = ["a 1\n",
           "# TYPE a counter\na -1\n",
           "# TYPE a gauge\na{x=\"\\q\"} 1\n",
           "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 0\nh_count 1\n",
           "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 0\nh_count 1\n",
           "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 0\nh_count 1\n"]
    for t in bad:
        try:
            Metrics(t)
            check(False, "the parser accepted %r" % t)
        except ParseError:
            pass
    good = Metrics("# HELP h x\\\\y\\n\n# TYPE h histogram\nh_bucket{a=\"q\\\"\",le=\"1\"} 1\n"
                   "h_bucket{a=\"q\\\"\",le=\"+Inf\"} 2\nh_sum{a=\"q\\\"\"} 3\n"
                   "h_count{a=\"q\\\"\"} 2\n")
    check(good.get("h_count", a="q\"") == 2, "the parser reads escaped label values")


# ---------------------------------------------------------------- requests

def stream_generate(port, body, timeout=120, stop_after=None):
    """POST /generate with stream true; returns the last event's meta_info. stop_after=k: close
    the connection after k events instead (a client going away) and return None."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", "/generate", json.dumps(body).encode(),
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            raise OSError("answered %d: %r" % (r.status, r.read()[:300]))
        meta, events = None, 0
        while True:
            line = r.readline()
            if not line:
                return meta
            line = line.strip()
            if line.startswith(b"data: {"):
                events += 1
                meta = json.loads(line[6:]).get("meta_info", meta)
                if stop_after is not None and events >= stop_after:
                    return None
    finally:
        c.close()


def wait_metric(proc, pred, timeout):
    """Polls proc's /metrics until pred(m) holds; returns the last scrape."""
    last = {}

    def ok():
        last["m"] = scrape(proc)
        return pred(last["m"])

    pc.wait_until(ok, timeout, step=0.05)
    return last.get("m") or scrape(proc)


def all_labelled(m, model):
    return all(dict(ls).get("model_name") == model for _, ls in m.samples)


# ---------------------------------------------------------------- cases

def long_context_model(model, tmp, context):
    """model's files with max_position_embeddings = context (the tiny model's 2048 ends a stream
    in well under a second; the weights and RoPE do not change)."""
    long = os.path.join(tmp, "model-long")
    shutil.copytree(model, long)
    path = os.path.join(long, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg["max_position_embeddings"] = context
    with open(path + ".tmp", "w") as f:
        json.dump(cfg, f)
    os.replace(path + ".tmp", path)
    return long


def completion_stream(port, body, on_chunk, timeout=120):
    """POST /v1/completions with stream true (delta chunks: a client that reads slowly falls
    behind by the new text only, where /generate's events repeat the whole text); on_chunk(k)
    after the k-th chunk. Returns (the last finish_reason seen, the usage chunk's
    completion_tokens or None)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", "/v1/completions", json.dumps(body).encode(),
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            raise OSError("answered %d: %r" % (r.status, r.read()[:300]))
        finish, tokens, k = None, None, 0
        while True:
            line = r.readline()
            if not line:
                return finish, tokens
            line = line.strip()
            if not line.startswith(b"data: {"):
                continue
            ev = json.loads(line[6:])
            for ch in ev.get("choices") or []:
                finish = ch.get("finish_reason") or finish
            if ev.get("usage"):
                tokens = ev["usage"].get("completion_tokens")
            k += 1
            on_chunk(k)
    finally:
        c.close()


def held_stream_scrape(rt, dc, model, max_new):
    """Scrapes taken while a stream is known to be running: after its second chunk arrived (the
    first token comes with the prefill's done notice; the second from decode's running batch)
    and before the test aborts it, with its end checked to be that abort (ignore_eos and no stop
    strings: an end before max_new tokens is the abort), so it never finished in between. Every
    such scrape must show it: nothing depends on a scrape catching a moment of a load. Returns
    (decode scrape, router scrape), or None when the stream did not end by the abort (then a
    check has failed)."""
    second = threading.Event()
    out = {}

    def run():
        try:
            out["end"] = completion_stream(rt.port, {
                "model": model, "prompt": "a stream held open " * 4, "stream": True,
                "stream_options": {"include_usage": True}, "rid": "held-stream",
                "max_tokens": max_new, "temperature": 0, "ignore_eos": True},
                lambda k: k >= 2 and second.set())
        except Exception as e:  # noqa: BLE001
            out["error"] = repr(e)
        second.set()

    t = threading.Thread(target=run)
    t.start()
    check(second.wait(60) and "error" not in out, "the held stream's tokens arrived: %s" %
          out.get("error"))
    d, r = scrape(dc), scrape(rt)
    status, body = rt.post("/abort_request", {"rid": "held-stream"})
    check(status == 200, "the router took /abort_request for the held stream (%s %s)" %
          (status, body[:200]))
    t.join(60)
    finish, tokens = out.get("end") or (None, None)
    cut = finish is not None and tokens is not None and 0 < tokens < max_new
    check(cut, "the held stream ended by the abort, after the scrapes (finish %r after %s of %d "
          "tokens; %s)" % (finish, tokens, max_new, out.get("error")))
    return (d, r) if cut else None


def case_load(model, tmp):
    served = "metrics-model"
    model = long_context_model(model, tmp, 16384)
    extra = ("--served-model-name", served)
    pf, dc, rt = pc.start_cluster(BUILD, tmp, model, prefill_extra=extra, decode_extra=extra,
                                  router_extra=pc.PD_PATH_ONLY)
    for p in (pf, dc, rt):
        scrape(p)  # parses before any request
    # long enough that a scrape every 10 ms sees the streams running even on a loaded machine
    # (400 tokens finished between two scrapes under four busy loops); 16 x ~940 tokens fit
    # the 16384-token pool
    n, max_new = 16, 800
    prompts = ["the river runs to the sea %d " % i + "under stars " * (3 + i * 4) for i in range(n)]
    prompts[1] = prompts[0]  # a prefix-cache hit on prefill (sent after the first finished)
    metas = [None] * n
    errors = []

    def one(i):
        try:
            metas[i] = stream_generate(rt.port, {
                "text": prompts[i], "stream": True,
                "sampling_params": {"max_new_tokens": max_new, "temperature": 0,
                                    "ignore_eos": True}})
        except Exception as e:  # noqa: BLE001
            errors.append("request %d: %r" % (i, e))

    one(0)  # alone first, so request 1 finds its prompt in prefill's cache
    threads = [threading.Thread(target=one, args=(i,)) for i in range(1, n)]
    step("%d streams of %d tokens" % (n, max_new))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(not errors, "every stream finished: %s" % errors)
    if errors:
        return

    sum_prompt = sum(x["prompt_tokens"] for x in metas)
    sum_out = sum(x["completion_tokens"] for x in metas)
    sum_cached = sum(x.get("cached_tokens", 0) for x in metas)
    check(all(x["completion_tokens"] == max_new for x in metas), "every stream has max_new tokens")
    check(sum_cached > 0, "the repeated prompt hit prefill's prefix cache (cached_tokens %d)" %
          sum_cached)

    idle = (lambda m: m.get("sglang:num_running_reqs") == 0 and m.get("sglang:num_queue_reqs") == 0
            and m.get("sglang:token_usage") == 0)
    d = wait_metric(dc, idle, 10)
    p = wait_metric(pf, idle, 10)
    r = wait_metric(rt, lambda m: m.sum("sgl_router_running_requests") == 0, 10)
    for name, m in (("decode", d), ("prefill", p)):
        check(idle(m), "%s: running, queue and token_usage back to 0" % name)
        check(m.get("sglang:num_used_tokens") == 0, "%s: num_used_tokens back to 0" % name)
        check(m.get("sglang:max_total_num_tokens") == 16384, "%s: max_total_num_tokens" % name)
        check(m.get("sglang:cache_config_info", page_size="16", num_pages="1024") == 1,
              "%s: cache_config_info{page_size=16,num_pages=1024} = 1" % name)
        check(all_labelled(m, served), "%s: every series has model_name=%s" % (name, served))
        check(m.get("sglang:num_requests_total") == n, "%s: num_requests_total == %d (got %s)" %
              (name, n, m.get("sglang:num_requests_total")))
        for h in ("time_to_first_token", "e2e_request_latency", "queue_time"):
            c = m.get("sglang:%s_seconds_count" % h)
            check(c == n, "%s: sglang:%s_seconds_count == %d (got %s)" % (name, h, n, c))
        check(m.get("sglang:prompt_tokens_total") == sum_prompt,
              "%s: prompt_tokens_total == %d (got %s)" % (name, sum_prompt,
                                                          m.get("sglang:prompt_tokens_total")))
        check(m.get("sglang:cached_tokens_total") == sum_cached,
              "%s: cached_tokens_total == %d (got %s)" % (name, sum_cached,
                                                          m.get("sglang:cached_tokens_total")))
        check(abs(m.get("sglang:cache_hit_rate") - sum_cached / sum_prompt) < 1e-9,
              "%s: cache_hit_rate == cached / prompt tokens" % name)
        for c in ("sglang:num_aborted_requests_total", "pdserve_num_failed_requests_total",
                  "sglang:num_bootstrap_failed_reqs_total", "sglang:num_transfer_failed_reqs_total"):
            check(m.get(c) == 0, "%s: %s == 0" % (name, c))
        check(m.sum("pdserve_kv_transfer_failures_total") == 0, "%s: no KV failures" % name)
        check(m.get("pdserve_kv_transfer_latency_seconds_count") == n,
              "%s: one KV transfer latency per request" % name)
    check(d.get("sglang:generation_tokens_total") == sum_out,
          "decode: generation_tokens_total == %d (got %s)" %
          (sum_out, d.get("sglang:generation_tokens_total")))
    check(p.get("sglang:generation_tokens_total") == n, "prefill: one generated token per request")
    itl = d.get("sglang:inter_token_latency_seconds_count")
    check(itl == sum_out - n, "decode: ITL count == sum(tokens - 1) == %d (got %s)" %
          (sum_out - n, itl))
    check(p.get("pdserve_prefix_cache_tokens") > 0, "prefill: the prefix cache keeps pages "
          "(they do not count in token_usage)")
    # every prompt page moves but those the decode's own prefix cache held (whole pages)
    held = d.get("pdserve_decode_prefix_cache_hit_tokens_total")
    pages = sum((x["prompt_tokens"] + 15) // 16 for x in metas) - held // 16
    sent, recv = p.get("pdserve_kv_transfer_bytes_total"), d.get("pdserve_kv_transfer_bytes_total")
    check(sent == recv and sent > 0 and held % 16 == 0 and sent % pages == 0,
          "KV bytes: prefill sent %s, decode received %s, %d prompt pages moved (%s tokens held)" %
          (sent, recv, pages, held))
    for q in ("sglang:num_prefill_prealloc_queue_reqs", "pdserve_num_bootstrap_queue_reqs",
              "pdserve_num_waiting_queue_reqs", "sglang:num_prefill_inflight_queue_reqs"):
        check(p.get(q) == 0, "prefill: %s == 0 after the load" % q)
    for q in ("sglang:num_decode_prealloc_queue_reqs", "sglang:num_decode_transfer_queue_reqs"):
        check(d.get(q) == 0, "decode: %s == 0 after the load" % q)

    pu, du = "http://127.0.0.1:%d" % pf.port, "http://127.0.0.1:%d" % dc.port
    for url, role in ((pu, "prefill"), (du, "decode")):
        ok = r.get("pdserve_router_requests_total", worker=url, role=role, outcome="ok")
        check(ok == n, "router: %s ok calls == %d (got %s)" % (role, n, ok))
        check(r.sum("pdserve_router_requests_total", worker=url) == n,
              "router: %s has no other outcomes" % role)
        check(r.get("sgl_router_pd_%s_requests_total" % role, worker=url) == n,
              "router: sgl_router_pd_%s_requests_total == %d" % (role, n))
        check(r.get("sgl_router_processed_requests_total", worker=url) == n,
              "router: processed requests of %s" % role)
        check(r.get("sgl_router_worker_health", worker=url) == 1, "router: %s healthy" % role)
        check(r.get("sgl_router_running_requests", worker=url) == 0, "router: %s idle" % role)
    check(r.get("sgl_router_requests_total", route="/generate") == n, "router: requests_total")
    check(r.get("sgl_router_request_duration_seconds_count", route="/generate") == n,
          "router: one duration per request")
    check(r.get("pdserve_router_time_to_first_token_seconds_count") == n,
          "router: one TTFT per stream")
    check(r.get("sgl_router_active_workers") == 2, "router: 2 active workers")
    # TTFT as the router sees it cannot be shorter than decode's own
    check(r.get("pdserve_router_time_to_first_token_seconds_sum") >=
          d.get("sglang:time_to_first_token_seconds_sum"), "router TTFT sum >= decode TTFT sum")

    # the gauges of a running request, scraped while one is known to run (12000 tokens of the
    # tiny model take seconds; its second token and the abort bracket the scrapes)
    step("a stream held open while decode and the router are scraped")
    held = held_stream_scrape(rt, dc, served, 12000)
    if held:
        hd, hr = held
        check(hd.get("sglang:num_running_reqs") == 1,
              "decode's sglang:num_running_reqs is 1 while the held stream runs (got %s)" %
              hd.get("sglang:num_running_reqs"))
        check(hd.get("sglang:token_usage") > 0, "decode's sglang:token_usage > 0 while it runs")
        check(hr.get("sgl_router_running_requests", worker=du) == 1,
              "the router's sgl_router_running_requests of decode is 1 while it runs (got %s)" %
              hr.get("sgl_router_running_requests", worker=du))


def case_queues(model, tmp):
    pf = pc.Daemon(BUILD, "prefill", model, tmp, ("--bootstrap-timeout", "3"))
    dc = pc.Daemon(BUILD, "decode", model, tmp, ("--waiting-timeout", "3"))
    k = 5
    body = lambda room, port: {  # noqa: E731
        "text": "a prompt that waits " * 4, "sampling_params": {"max_new_tokens": 4},
        "bootstrap_host": "127.0.0.1", "bootstrap_port": port, "bootstrap_room": room}
    answers = []

    def post(proc, b):
        try:
            answers.append(proc.post("/generate", b, timeout=30)[0])
        except OSError as e:
            answers.append(repr(e))

    step("%d requests to prefill alone (no decode asks for them)" % k)
    ts = [threading.Thread(target=post, args=(pf, body(1000 + i, pf.bport))) for i in range(k)]
    for t in ts:
        t.start()
    m = wait_metric(pf, lambda m: m.get("pdserve_num_bootstrap_queue_reqs") == k, 5)
    check(m.get("pdserve_num_bootstrap_queue_reqs") == k,
          "prefill: bootstrap queue gauge == %d" % k)
    check(m.get("sglang:num_prefill_prealloc_queue_reqs") == k,
          "prefill: sglang:num_prefill_prealloc_queue_reqs == %d" % k)
    check(m.get("sglang:num_queue_reqs") == k, "prefill: num_queue_reqs == %d" % k)
    for t in ts:
        t.join()
    check(answers.count(500) == k, "prefill: every request failed at its bootstrap timeout: %s" %
          answers)
    m = wait_metric(pf, lambda m: m.get("pdserve_num_bootstrap_queue_reqs") == 0, 5)
    check(m.get("pdserve_num_bootstrap_queue_reqs") == 0, "prefill: bootstrap gauge back to 0")
    check(m.get("sglang:num_bootstrap_failed_reqs_total") == k,
          "prefill: num_bootstrap_failed_reqs_total == %d (got %s)" %
          (k, m.get("sglang:num_bootstrap_failed_reqs_total")))
    check(m.get("sglang:num_requests_total") == k, "prefill: num_requests_total == %d" % k)
    check(m.get("sglang:e2e_request_latency_seconds_count") == k, "prefill: e2e count")
    check(m.get("sglang:e2e_request_latency_seconds_sum") >= 3 * k * 0.9,
          "prefill: each e2e lasted the bootstrap timeout")
    # --eager-prefill (the default): each was computed while it waited for its decode, so each
    # has its queue time (arrival -> first chunk), though its KV never left
    check(m.get("sglang:queue_time_seconds_count") == k,
          "prefill: queue time of each (eager: computed before a Transfer that never came): %s"
          % m.get("sglang:queue_time_seconds_count"))
    check(m.get("sglang:prompt_tokens_total") == 0, "prefill: failed prompts are not counted")

    step("%d requests to decode whose prefill never gets their bodies" % k)
    answers.clear()
    ts = [threading.Thread(target=post, args=(dc, body(2000 + i, pf.bport))) for i in range(k)]
    for t in ts:
        t.start()
    m = wait_metric(dc, lambda m: m.get("sglang:num_decode_transfer_queue_reqs") == k, 5)
    check(m.get("sglang:num_decode_transfer_queue_reqs") == k,
          "decode: transfer queue gauge == %d" % k)
    check(m.get("sglang:token_usage") > 0, "decode: pages reserved for them")
    check(m.get("sglang:queue_time_seconds_count") == 0, "decode: no queue time before admission")
    for t in ts:
        t.join()
    check(answers.count(500) == k, "decode: every request failed: %s" % answers)
    idle = lambda m: (m.get("sglang:num_decode_transfer_queue_reqs") == 0  # noqa: E731
                      and m.get("sglang:token_usage") == 0)
    m = wait_metric(dc, idle, 10)
    check(idle(m), "decode: transfer gauge and token_usage back to 0")
    check(m.get("sglang:num_transfer_failed_reqs_total") == k,
          "decode: num_transfer_failed_reqs_total == %d (got %s)" %
          (k, m.get("sglang:num_transfer_failed_reqs_total")))
    check(m.get("sglang:num_bootstrap_failed_reqs_total") == 0, "decode: no bootstrap failures")
    fails = m.sum("pdserve_kv_transfer_failures_total")
    check(fails == k, "decode: kv_transfer_failures_total sums to %d (got %s)" % (k, fails))
    check(m.get("sglang:queue_time_seconds_count") == k, "decode: queue time once admitted")
    check(m.get("sglang:time_to_first_token_seconds_count") == 0, "decode: no first token")
    check(m.get("pdserve_kv_transfer_bytes_total") == 0, "decode: no KV bytes")

    step("a Transfer the prefill refuses: bootstrap failure on decode")
    answers.clear()
    post(dc, body(3000, 1))  # nothing listens on port 1: the Transfer cannot be placed
    m = wait_metric(dc, lambda m: m.get("sglang:num_requests_total") == k + 1, 10)
    check(m.get("sglang:num_bootstrap_failed_reqs_total") == 1,
          "decode: an unreachable bootstrap counts as a bootstrap failure (got %s)" %
          m.get("sglang:num_bootstrap_failed_reqs_total"))
    check(m.get("sglang:token_usage") == 0, "decode: pages back after it")


def case_router(model, tmp):
    pf, dc, rt = pc.start_cluster(BUILD, tmp, model, router_extra=pc.PD_PATH_ONLY)
    n = 6
    for i in range(n):
        meta = stream_generate(rt.port, {"text": "count %d" % i, "stream": True,
                                         "sampling_params": {"max_new_tokens": 8}})
        check(meta is not None, "stream %d answered" % i)
    step("a client that goes away mid-stream")
    stream_generate(rt.port, {"text": "going away", "stream": True,
                              "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}},
                    stop_after=2)
    step("a prompt over the context length")
    st, _ = rt.post("/generate", {"input_ids": [5] * 100000,
                                  "sampling_params": {"max_new_tokens": 4}})
    check(st == 400, "an over-long prompt gets 400 (got %s)" % st)
    pu, du = "http://127.0.0.1:%d" % pf.port, "http://127.0.0.1:%d" % dc.port
    r = wait_metric(rt, lambda m: m.sum("sgl_router_running_requests") == 0
                    and m.sum("pdserve_router_requests_total") == 2 * (n + 2), 10)
    check(r.sum("sgl_router_running_requests") == 0, "router: nothing in flight at the end")
    for url, role in ((pu, "prefill"), (du, "decode")):
        total = r.sum("pdserve_router_requests_total", worker=url, role=role)
        check(total == n + 2, "router: %s outcomes sum to the %d calls sent (got %s)" %
              (role, n + 2, total))
        check(r.get("sgl_router_pd_%s_requests_total" % role, worker=url) == n + 2,
              "router: sgl_router_pd_%s_requests_total == %d" % (role, n + 2))
        ok = r.get("pdserve_router_requests_total", worker=url, role=role, outcome="ok")
        check(ok >= n, "router: %s ok >= %d (got %s)" % (role, n, ok))
    gone = r.get("pdserve_router_requests_total", worker=du, role="decode", outcome="client_gone")
    check(gone == 1, "router: decode client_gone == 1 (got %s)" % gone)
    bad = (r.sum("pdserve_router_requests_total", outcome="error")
           + r.sum("pdserve_router_requests_total", outcome="aborted"))
    check(bad >= 1 and bad <= 2, "router: the over-long prompt ended 1-2 calls as error/aborted "
          "(got %s)" % bad)
    errs = r.sum("sgl_router_pd_prefill_errors_total") + r.sum("sgl_router_pd_decode_errors_total")
    check(errs == r.sum("pdserve_router_requests_total", outcome="error"),
          "router: sgl_router_pd_*_errors_total equal the error outcomes")
    check(r.get("sgl_router_requests_total", route="/generate") == n + 2, "router: requests_total")
    check(r.get("sgl_router_request_duration_seconds_count", route="/generate") == n + 2,
          "router: a duration per request, also the failed and the abandoned one")
    check(r.get("pdserve_router_time_to_first_token_seconds_count") == n + 1,
          "router: a TTFT per stream that sent a byte (got %s)" %
          r.get("pdserve_router_time_to_first_token_seconds_count"))
    d = scrape(dc)
    check(d.get("sglang:num_aborted_requests_total") == 1,
          "decode: the abandoned stream counts as aborted (got %s)" %
          d.get("sglang:num_aborted_requests_total"))

    k = 8
    step("%d clients gone while their KV pages move" % k)
    before = {p.role: scrape(p) for p in (pf, dc)}
    seen = 0
    for i in range(k):
        body = {"input_ids": [(j * 7 + i) % 900 + 1 for j in range(1800)], "stream": True,
                "sampling_params": {"max_new_tokens": 100, "ignore_eos": True}}
        c = rt.conn(30)
        c.request("POST", "/generate", json.dumps(body), {"Content-Type": "application/json"})
        seen += bool(pc.wait_until(lambda: dc.server_info()["queues"]["transfer"] >= 1, 20,
                                   0.002))
        c.close()
        check(pc.wait_until(lambda: pf.server_info()["live_requests"] == 0
                            and dc.server_info()["live_requests"] == 0, 20),
              "the abandoned request %d ended on both daemons" % i)
    check(seen == k, "every client left while decode waited for its KV (%d of %d)" % (seen, k))
    for p in (pf, dc):
        m = scrape(p)
        for name, want in (("pdserve_num_failed_requests_total", 0),
                           ("sglang:num_aborted_requests_total", k)):
            got = m.sum(name) - before[p.role].sum(name)
            check(got == want, "%s: %s grew by %s, want %d" % (p.role, name, got, want))
        check(p.pool_full(), "%s: pool full after the abandoned transfers" % p.role)


# ---------------------------------------------------------------- promtool and the dashboard

def busy_cluster(model, tmp):
    """Prefill, decode and router after a few requests through the router (streamed and not,
    so every histogram of the three holds samples); their /metrics texts by role."""
    pf, dc, rt = pc.start_cluster(BUILD, tmp, model, router_extra=pc.PD_PATH_ONLY)
    for i in range(4):
        meta = stream_generate(rt.port, {"text": "the metrics of request %d" % i, "stream": True,
                                         "sampling_params": {"max_new_tokens": 8}})
        check(meta is not None, "stream %d answered" % i)
    st, _ = rt.post("/generate", {"text": "one plain answer",
                                  "sampling_params": {"max_new_tokens": 4}})
    check(st == 200, "a plain /generate answered 200 (got %s)" % st)
    wait_metric(rt, lambda m: m.sum("sgl_router_running_requests") == 0, 10)
    texts = {}
    for p in (pf, dc, rt):
        st, body = p.get("/metrics")
        check(st == 200, "%s /metrics answered %s" % (p.name, st))
        texts[p.name] = body.decode()
        Metrics(texts[p.name])  # the strict parser accepts it
    for role, h in (("decode", "sglang:inter_token_latency_seconds_count"),
                    ("prefill", "pdserve_kv_transfer_latency_seconds_count"),
                    ("router", "pdserve_router_time_to_first_token_seconds_count")):
        check(Metrics(texts[role]).get(h) > 0, "%s: %s > 0 (histograms hold samples)" % (role, h))
    return texts


# Findings of `promtool check metrics` allowed on SGLang's own names: (name pattern, the finding,
# why). Only sglang: names may be listed; a finding on any other name fails the test.
PROMTOOL_ALLOWED = [
    (r"sglang:\w+", "metric names should not contain ':'",
     "SGLang spells its series with a colon, and dashboards and the Kubernetes inference "
     "gateway read them by those names (API.md \"Metrics\")"),
    (r"sglang:kv_transfer_(speed_gb_s|latency_ms|total_mb)",
     "metric names should not contain abbreviated units",
     "SGLang's last-transfer gauges under SGLang's names; pdserve_kv_transfer_bytes_total and "
     "pdserve_kv_transfer_latency_seconds carry the same in base units"),
]
assert all(pat.startswith("sglang:") for pat, _, _ in PROMTOOL_ALLOWED)


def promtool_path():
    """promtool ($PD_PROMTOOL, else on PATH), or None and a failure saying how to install it:
    these cases fail without it rather than skip."""
    path = os.environ.get("PD_PROMTOOL") or shutil.which("promtool")
    check(path is not None, "promtool not found: install Debian's package prometheus "
          "(scripts/setup.sh does)")
    return path


def promtool_findings(promtool, text):
    """(exit code, [(metric, finding)], [lines promtool printed that are not findings])."""
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=60)
    found, other = [], []
    for line in (r.stdout + r.stderr).splitlines():
        if not line.strip():
            continue
        m = re.fullmatch("(" + NAME + r") (.+)", line.strip())
        if m:
            found.append((m.group(1), m.group(2)))
        else:
            other.append(line)
    return r.returncode, found, other


def promtool_verdict(what, promtool, text, quiet=False):
    """Runs promtool over text: (the findings not allowed, every one unless PROMTOOL_ALLOWED
    excuses it, as 'what: metric finding' lines; {index in PROMTOOL_ALLOWED: [names]} of the
    allowed ones, which are printed with their reasons unless quiet)."""
    rc, found, other = promtool_findings(promtool, text)
    bad, allowed = [], {}
    for name, finding in sorted(set(found)):
        rule = next((i for i, (pat, f, _) in enumerate(PROMTOOL_ALLOWED)
                     if re.fullmatch(pat, name) and f in finding), None)
        if rule is None:
            bad.append("%s: %s %s" % (what, name, finding))
        else:
            allowed.setdefault(rule, []).append(name)
    bad += ["%s: promtool printed %r" % (what, line) for line in other]
    if rc not in (0, 3) or (rc == 3) != bool(found):
        bad.append("%s: promtool exited %d with %d findings" % (what, rc, len(found)))
    if not quiet:
        for rule, names in sorted(allowed.items()):
            _, finding, why = PROMTOOL_ALLOWED[rule]
            print("  %s: allowed \"%s\" on %d SGLang names (%s): %s" %
                  (what, finding, len(names), why, " ".join(names)))
    return bad, allowed


def case_promtool(model, tmp):
    promtool = promtool_path()
    if not promtool:
        return
    ver = subprocess.run([promtool, "--version"], capture_output=True, text=True, timeout=30)
    step("%s" % ((ver.stdout + ver.stderr).strip().splitlines() or ["promtool ?"])[0])
    # the classifier can fail: a pdserve name with a colon, a counter without _total; an sglang:
    # name's colon alone passes
    bad, _ = promtool_verdict("control", promtool,
                              "# HELP pdserve:bad_requests a control\n"
                              "# TYPE pdserve:bad_requests counter\npdserve:bad_requests 1\n",
                              quiet=True)
    check(any("pdserve:bad_requests" in b and "':'" in b for b in bad) and
          any("pdserve:bad_requests" in b and "_total" in b for b in bad),
          "promtool findings on a pdserve name fail the test (got %s)" % bad)
    bad, allowed = promtool_verdict("control", promtool,
                                    "# HELP sglang:ok_reqs a control\n"
                                    "# TYPE sglang:ok_reqs gauge\nsglang:ok_reqs 1\n", quiet=True)
    check(not bad and allowed == {0: ["sglang:ok_reqs"]}, "an sglang: name's colon alone is "
          "allowed (bad %s, allowed %s)" % (bad, allowed))

    texts = busy_cluster(model, tmp)
    for role, text in texts.items():
        step("promtool check metrics on %s's /metrics (%d lines)" % (role, text.count("\n")))
        bad, _ = promtool_verdict(role, promtool, text)
        for b in bad:
            check(False, b)


PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
                "or", "unless", "offset", "inf", "nan", "Inf", "NaN"}


def promql_names(expr):
    """The metric names a PromQL expression selects: strings, label matchers, ranges, groupings
    and Grafana variables removed, functions and keywords left out."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"' + r"|'(?:[^'\\]|\\.)*'", '""', expr)
    e = re.sub(r"\$\{[^}]*\}|\$\w+", "", e)
    e = re.sub(r"\{[^{}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", "", e)
    names = set()
    for m in re.finditer(NAME, e):
        before = e[m.start() - 1] if m.start() else " "
        if before.isdigit() or before == ".":
            continue  # the exponent of a number (1e9)
        if e[m.end():].lstrip().startswith("(") or m.group(0) in PROMQL_WORDS:
            continue  # a function or aggregation; a keyword
        names.add(m.group(0))
    return names


def dashboard_queries(dash):
    """(where, PromQL) of every panel target and query variable of a Grafana dashboard."""
    out = []

    def panels(ps):
        for p in ps or []:
            for t in p.get("targets") or []:
                if t.get("expr"):
                    out.append(("panel %r" % p.get("title"), t["expr"]))
            panels(p.get("panels"))

    panels(dash.get("panels"))
    for v in (dash.get("templating") or {}).get("list") or []:
        if v.get("type") != "query":
            continue
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        m = re.fullmatch(r"\s*label_values\((.*),\s*\w+\)\s*", q or "")
        out.append(("variable %r" % v.get("name"), m.group(1) if m else q))
    return out


def missing_names(queries, scrapes):
    """(where, name) of every name queries select that no scrape exports: a family in a TYPE
    line or a sample; X_bucket, X_sum and X_count need X to be a histogram."""
    types = {}
    samples = set()
    for m in scrapes:
        types.update(m.types)
        samples |= m.names()
    out = []
    for where, q in queries:
        for n in sorted(promql_names(q)):
            base = re.sub(r"_(bucket|sum|count)$", "", n)
            ok = n in types or n in samples or (base != n and types.get(base) == "histogram")
            if not ok:
                out.append((where, n))
    return out


def promql_parses(queries, tmp):
    """Every query is valid PromQL: written (Grafana's variables replaced) as recording rules
    that `promtool check rules` parses."""
    promtool = promtool_path()
    if not promtool:
        return
    rules = []
    for i, (_, q) in enumerate(queries):
        q = re.sub(r"\$__\w+|\$\{__\w+\}", "5m", q)
        q = re.sub(r"\$\{?\w+\}?", ".*", q)
        rules.append({"record": "dashboard:query_%d" % i, "expr": q})
    path = os.path.join(tmp, "dashboard-rules.json")
    with open(path, "w") as f:
        json.dump({"groups": [{"name": "dashboard", "rules": rules}]}, f, indent=1)
    r = subprocess.run([promtool, "check", "rules", path], capture_output=True, text=True,
                       timeout=60)
    check(r.returncode == 0 and "SUCCESS: %d rules found" % len(rules) in r.stdout,
          "the dashboard's PromQL parses (promtool check rules %s): rc %d %s %s" %
          (path, r.returncode, r.stdout[-1500:], r.stderr[-1500:]))


def case_dashboard(model, tmp):
    with open(DASHBOARD) as f:
        dash = json.load(f)
    # the extraction itself
    ttft = ("histogram_quantile(0.99, sum by (le) (rate(sglang:time_to_first_token_seconds_bucket"
            "{model_name=~\"$model\"}[$__rate_interval])))")
    want = [(ttft, {"sglang:time_to_first_token_seconds_bucket"}),
            ("sum(rate(pdserve_kv_transfer_bytes_total[5m])) / 1e9",
             {"pdserve_kv_transfer_bytes_total"}),
            ("sum without (le) (a_b) / on (x) group_left c{l=\"d e\"} > bool 0", {"a_b", "c"})]
    for q, names in want:
        check(promql_names(q) == names, "promql_names(%r) = %s, want %s" %
              (q, promql_names(q), names))
    check(dash.get("schemaVersion", 0) >= 36, "dashboard schemaVersion %s (Grafana 9+)" %
          dash.get("schemaVersion"))
    check(dash.get("uid") and dash.get("title"), "the dashboard has a uid and a title")
    ds = [v for v in dash.get("templating", {}).get("list", []) if v.get("type") == "datasource"]
    check(len(ds) == 1 and ds[0].get("name") == "datasource" and ds[0].get("query") ==
          "prometheus", "one Prometheus datasource variable named datasource: %s" % ds)

    def all_panels(ps):
        for p in ps or []:
            yield p
            yield from all_panels(p.get("panels"))

    ids = []
    for p in all_panels(dash.get("panels")):
        ids.append(p.get("id"))
        if p.get("type") == "row":
            continue
        check(p.get("datasource") == {"type": "prometheus", "uid": "${datasource}"},
              "panel %r reads ${datasource}: %s" % (p.get("title"), p.get("datasource")))
        check(p.get("targets"), "panel %r has queries" % p.get("title"))
    check(len(ids) == len(set(ids)) and None not in ids, "panel ids unique: %s" % ids)
    queries = dashboard_queries(dash)
    names = set().union(*(promql_names(q) for _, q in queries)) if queries else set()
    step("the dashboard: %d queries over %d names" % (len(queries), len(names)))
    for n in ("sglang:time_to_first_token_seconds_bucket",
              "sglang:inter_token_latency_seconds_bucket", "pdserve_kv_transfer_bytes_total",
              "pdserve_kv_transfer_latency_seconds_bucket",
              "sglang:num_prefill_prealloc_queue_reqs", "pdserve_num_bootstrap_queue_reqs",
              "pdserve_num_waiting_queue_reqs", "sglang:num_prefill_inflight_queue_reqs",
              "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
              "sglang:num_requests_total", "pdserve_num_failed_requests_total",
              "pdserve_router_requests_total"):
        check(n in names, "the dashboard queries %s" % n)

    promql_parses(queries, tmp)

    texts = busy_cluster(model, tmp)
    scrapes = [Metrics(t) for t in texts.values()]
    control = missing_names([("control", "rate(pdserve_no_such_series_total[5m])"),
                             ("control", "sglang:num_running_reqs_bucket")], scrapes)
    check(control == [("control", "pdserve_no_such_series_total"),
                      ("control", "sglang:num_running_reqs_bucket")],
          "an unknown name and _bucket of a gauge are caught: %s" % control)
    for where, n in missing_names(queries, scrapes):
        check(False, "the dashboard's %s queries %s, which no process exports" % (where, n))


DECODE_STAGES = ("reserve", "prefill_queue", "prefill_first_chunk", "prefill_rest", "kv_other",
                 "first_token")
PREFILL_STAGES = ("bootstrap_wait", "prefill_queue", "prefill_first_chunk", "prefill_rest")


def case_handover(model, tmp):
    pf, dc, rt = pc.start_cluster(BUILD, tmp, model, router_extra=pc.PD_PATH_ONLY)
    n = 12
    prompts = ["the hand-over %d " % i + "of pages " * (5 + 20 * i) for i in range(n)]
    errors = []

    def one(i):
        try:
            stream_generate(rt.port, {"text": prompts[i], "stream": True, "sampling_params": {
                "max_new_tokens": 6, "temperature": 0, "ignore_eos": True}})
        except Exception as e:  # noqa: BLE001
            errors.append("request %d: %r" % (i, e))

    for i in range(4):  # alone
        one(i)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(4, n)]
    for t in threads:  # together: queueing on both sides
        t.start()
    for t in threads:
        t.join(120)
    check(not errors, "every request answered: %s" % errors)
    md = wait_metric(dc, lambda m: m.sum("sglang:num_requests_total") >= n, 10)
    mp = wait_metric(pf, lambda m: m.sum("sglang:num_requests_total") >= n, 10)
    name = "pdserve_handover_seconds"
    for st in DECODE_STAGES:
        check(md.get(name + "_count", stage=st) == n,
              "decode observed %s once per request: %s" % (st, md.get(name + "_count", stage=st)))
        check(md.get(name + "_sum", stage=st) >= 0, "decode's %s sum >= 0" % st)
    for st in ("bootstrap_wait",):
        check(md.get(name + "_count", stage=st) == 0, "decode has no %s" % st)
    for st in PREFILL_STAGES:
        check(mp.get(name + "_count", stage=st) == n,
              "prefill observed %s once per request: %s" % (st, mp.get(name + "_count", stage=st)))
    for st in ("reserve", "kv_other", "first_token"):
        check(mp.get(name + "_count", stage=st) == 0, "prefill has no %s" % st)
    ttft = md.get("sglang:time_to_first_token_seconds_sum")
    parts = {st: md.get(name + "_sum", stage=st) for st in DECODE_STAGES}
    total = sum(parts.values())
    step("decode TTFT sum %.2f ms; stages %s = %.2f ms" % (
        ttft * 1e3, {k: round(v * 1e3, 2) for k, v in parts.items()}, total * 1e3))
    check(abs(total - ttft) <= 0.01 * ttft + 1e-4,
          "decode's stages add up to its TTFT: %.3f vs %.3f ms" % (total * 1e3, ttft * 1e3))
    check(parts["kv_other"] < ttft, "kv_other is part of the TTFT, not all of it")
    # the prefill spans decode got in the notices are the ones prefill measured (µs rounding)
    for st in ("prefill_queue", "prefill_first_chunk", "prefill_rest"):
        a, b = md.get(name + "_sum", stage=st), mp.get(name + "_sum", stage=st)
        check(abs(a - b) <= n * 1e-6 + 1e-9,
              "%s: decode's sum %.6f s equals prefill's %.6f s" % (st, a, b))
    info = dc.server_info().get("handover", {})
    for st in DECODE_STAGES:
        s = info.get(st, {})
        check(s.get("count") == n and abs(s.get("mean_ms", -1) - parts[st] / n * 1e3) < 1e-6 + 1e-3 * parts[st] / n * 1e3,
              "/server_info handover %s: %s" % (st, s))
    # the router's part: dispatch + decode + relay is its TTFT; its decode stage holds decode's
    # whole TTFT (same machine, both on CLOCK_MONOTONIC-based durations)
    mr = wait_metric(rt, lambda m: m.get("pdserve_router_time_to_first_token_seconds_count") == n,
                     10)
    rname = "pdserve_router_handover_seconds"
    rparts = {st: mr.get(rname + "_sum", stage=st) for st in ("dispatch", "decode", "relay")}
    for st, v in rparts.items():
        check(mr.get(rname + "_count", stage=st) == n and v >= 0,
              "router observed %s once per request: count %s, sum %s" %
              (st, mr.get(rname + "_count", stage=st), v))
    rttft = mr.get("pdserve_router_time_to_first_token_seconds_sum")
    step("router TTFT sum %.2f ms; stages %s" % (
        rttft * 1e3, {k: round(v * 1e3, 2) for k, v in rparts.items()}))
    check(abs(sum(rparts.values()) - rttft) <= 1e-3 * rttft + 1e-5,
          "the router's stages add up to its TTFT: %.3f vs %.3f ms" %
          (sum(rparts.values()) * 1e3, rttft * 1e3))
    check(ttft <= rparts["decode"] + 1e-5 and rparts["decode"] < rttft,
          "decode's TTFT (%.3f ms) inside the router's decode stage (%.3f ms)" %
          (ttft * 1e3, rparts["decode"] * 1e3))
    rinfo = json.loads(rt.get("/server_info")[1]).get("handover", {})
    for st, v in rparts.items():
        s = rinfo.get(st, {})
        check(s.get("count") == n and abs(s.get("mean_ms", -1) - v / n * 1e3) <= 1e-6 + 1e-3 * v / n * 1e3,
              "router /server_info handover %s: %s" % (st, s))


def main():
    parser_refuses()
    tmp = pc.tmpdir()

    def cases():
        model = pc.make_model(BUILD, tmp)
        {"load": case_load, "queues": case_queues, "router": case_router,
         "promtool": case_promtool, "dashboard": case_dashboard,
         "handover": case_handover}[CASE](model, tmp)

    pc.run_test("metrics %s" % CASE, cases, tmp, log_tail=3000)


if __name__ == "__main__":
    main()
