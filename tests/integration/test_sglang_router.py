#!/usr/bin/env python3
"""test_sglang_router.py — SGLang's own router in front of pdserve's daemons.

Users of SGLang's disaggregated mode already run sglang-router (PyPI `sglang-router`, a Rust
binary behind `python -m sglang_router.launch_router`); pdserve-prefill and pdserve-decode must
work behind it unchanged. scripts/setup.sh pins it into the ignored .venv-tools/ (test tooling
only); without it this test skips (77), saying so.

sglang-router --pd-disaggregation with one pdserve-prefill (its bootstrap port given as SGLang's
is) and one pdserve-decode, 2 workers of each role for the concurrent part:
  * /generate, non-streamed and streamed, greedy: pdserve-generate's text for prompts of 1 to
    ~150 tokens (several KV pages, more than one prefill chunk);
  * /v1/completions streamed and not, /v1/chat/completions (the daemons' chat template): the
    same text as pdserve-generate on the same prompt ids; /v1/models lists the model;
  * seeded sampling (temperature, top-p, top-k): pdserve-generate's text for the same seed;
  * 12 concurrent requests over 2 prefills and 2 decodes: every answer equals the reference,
    and every daemon's KV pool is full again afterwards (nothing leaked);
  * TLS: the daemons serve HTTPS (--ssl-certfile/--ssl-keyfile; the prefill's bootstrap port
    TLS, decode trusting it with --ssl-ca-certs), sglang-router reaches them at https:// URLs
    (its --ca-cert-paths) and serves HTTPS itself (--tls-cert-path/--tls-key-path): /generate
    and /v1/completions, streamed and not, give pdserve-generate's text.
Usage: test_sglang_router.py BUILD_DIR
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pd_cluster as pc  # noqa: E402
from pd_cluster import check, step  # noqa: E402

BUILD = os.path.abspath(sys.argv[1])
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV_PY = os.environ.get("PD_SGLANG_ROUTER_PYTHON") or os.path.join(ROOT, ".venv-tools", "bin",
                                                                   "python")
MAX_NEW = 12
WORDS = ("the of and a to in is you that it he was for on are as with his they at be this "
         "from have or by one had not but what all were when we there can an your which").split()


def sglang_router_python():
    """The interpreter that has sglang_router, or None."""
    for py in (VENV_PY, sys.executable):
        if os.path.exists(py) and subprocess.run(
                [py, "-c", "import sglang_router.launch_router"], capture_output=True,
                timeout=60).returncode == 0:
            return py
    return None


class SglangRouter(pc.Proc):
    def __init__(self, py, prefills, decodes, tmp, tls=None):
        """tls: pc.make_tls_certs's files: https:// workers checked against its CA, and the
        router's own port HTTPS with its certificate."""
        port = pc.free_port()
        args = [py, "-m", "sglang_router.launch_router", "--pd-disaggregation", "--host",
                "127.0.0.1", "--port", str(port), "--policy", "round_robin",
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(pc.free_port()),
                "--log-level", "warn"]
        scheme = "https" if tls else "http"
        for pf in prefills:
            args += ["--prefill", "%s://127.0.0.1:%d" % (scheme, pf.port), str(pf.bport)]
        for dc in decodes:
            args += ["--decode", "%s://127.0.0.1:%d" % (scheme, dc.port)]
        if tls:
            args += ["--ca-cert-paths", tls["ca"], "--tls-cert-path", tls["cert"],
                     "--tls-key-path", tls["key"]]
        super().__init__("sglang-router", args, port, tmp, ready_timeout=60,
                         ssl_ctx=tls["ctx"] if tls else None)
        # /health answers before the workers are registered (a workflow of their own):
        # ready once a generation goes through
        body = {"text": "hi", "sampling_params": {"max_new_tokens": 1}}
        if not pc.wait_until(lambda: self.post("/generate", body, 30)[0] == 200, 60, 0.2):
            raise RuntimeError("sglang-router never served a request; log %s" % self.log_path)


def prompts():
    out = []
    for i, n in enumerate((1, 5, 17, 40, 70, 150)):
        out.append(" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(n)))
    return out


def gen_body(prompt, stream=False, sp=None):
    s = {"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True}
    s.update(sp or {})
    return {"text": prompt, "sampling_params": s, "stream": stream}


def single_pair(py, model, tmp, texts, ref):
    pf = pc.Daemon(BUILD, "prefill", model, tmp)
    dc = pc.Daemon(BUILD, "decode", model, tmp)
    rt = SglangRouter(py, [pf], [dc], tmp)
    step("one prefill + one decode behind sglang-router")
    st, raw = rt.get("/v1/models")
    models = [m.get("id") for m in json.loads(raw).get("data", [])] if st == 200 else []
    check(model in models, "sglang-router /v1/models lists %r: %d %r" % (model, st, raw[:300]))
    for i, p in enumerate(texts):
        for stream in (False, True):
            st, raw = rt.post("/generate", gen_body(p, stream), 60)
            ok = check(st == 200, "/generate %d stream=%s: %d %r" % (i, stream, st, raw[:300]))
            if ok:
                got = pc.text_of("generate", stream, raw)
                check(got == ref[i], "/generate %d stream=%s: %r != pdserve-generate's %r" %
                      (i, stream, got, ref[i]))
    for i in (1, 4):
        for stream in (False, True):
            body = {"model": model, "prompt": texts[i], "max_tokens": MAX_NEW, "temperature": 0,
                    "ignore_eos": True, "stream": stream}
            st, raw = rt.post("/v1/completions", body, 60)
            if check(st == 200, "completions %d stream=%s: %d %r" % (i, stream, st, raw[:300])):
                got = pc.text_of("completions", stream, raw)
                check(got == ref[i], "completions %d stream=%s: %r != %r" %
                      (i, stream, got, ref[i]))
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": texts[3]}]
    ids = pc.chat_prompt_ids(BUILD, model, dc, messages, tmp)
    want = pc.generate(BUILD, model, ids, MAX_NEW, ["--ignore-eos"])
    body = {"model": model, "messages": messages, "max_tokens": MAX_NEW, "temperature": 0,
            "ignore_eos": True}
    st, raw = rt.post("/v1/chat/completions", body, 60)
    if check(st == 200, "chat: %d %r" % (st, raw[:300])):
        got = json.loads(raw)["choices"][0]["message"]["content"]
        check(got == want, "chat: %r != pdserve-generate's %r" % (got, want))
    for seed, (t, k, top_p) in enumerate(((0.8, 0, 0.9), (1.2, 20, 1.0)), 5):
        want = pc.generate(BUILD, model, texts[2], MAX_NEW,
                           ["--temperature", str(t), "--top-k", str(k), "--top-p", str(top_p),
                            "--seed", str(seed), "--ignore-eos"])
        sp = {"temperature": t, "top_k": k if k else -1, "top_p": top_p, "sampling_seed": seed}
        st, raw = rt.post("/generate", gen_body(texts[2], False, sp), 60)
        if check(st == 200, "seeded %d: %d %r" % (seed, st, raw[:300])):
            got = json.loads(raw)["text"]
            check(got == want, "seeded %d: %r != pdserve-generate's %r" % (seed, got, want))
    for d in (pf, dc):
        check(d.pool_full(), "%s pool full after the requests" % d.role)
    for p in (rt, dc, pf):
        p.kill()


def two_pairs(py, model, tmp, texts, ref):
    step("12 concurrent requests, 2 prefills + 2 decodes behind sglang-router")
    pfs = [pc.Daemon(BUILD, "prefill", model, tmp) for _ in range(2)]
    dcs = [pc.Daemon(BUILD, "decode", model, tmp) for _ in range(2)]
    rt = SglangRouter(py, pfs, dcs, tmp)
    res = pc.concurrent(lambda i: rt.post("/generate", gen_body(texts[i % len(texts)],
                                                                i % 2 == 1), 120), 12)
    for i, r in enumerate(res):
        if check(r is not None and r[0] == 200, "concurrent %d: %r" % (i, r)):
            got = pc.text_of("generate", i % 2 == 1, r[1])
            check(got == ref[i % len(texts)], "concurrent %d: %r != %r" %
                  (i, got, ref[i % len(texts)]))
    served = []
    for d in pfs + dcs:
        check(d.pool_full(), "%s %d pool full after the requests" % (d.role, d.port))
        st, raw = d.get("/metrics")
        line = [ln for ln in raw.decode().splitlines()
                if ln.startswith("sglang:num_requests_total")]
        served.append(sum(float(ln.split()[-1]) for ln in line))
    check(all(n > 0 for n in served), "every worker served requests: %r" % served)


def tls_pair(py, model, tmp, texts, ref):
    step("one prefill + one decode over TLS behind sglang-router over TLS")
    t = pc.make_tls_certs(tmp)
    serve = ["--ssl-certfile", t["cert"], "--ssl-keyfile", t["key"]]
    pf = pc.Daemon(BUILD, "prefill", model, tmp, serve, ssl_ctx=t["ctx"])
    dc = pc.Daemon(BUILD, "decode", model, tmp, serve + ["--ssl-ca-certs", t["ca"]],
                   ssl_ctx=t["ctx"])
    rt = SglangRouter(py, [pf], [dc], tmp, tls=t)
    for i in (0, 3, 5):
        for stream in (False, True):
            st, raw = rt.post("/generate", gen_body(texts[i], stream), 60)
            if check(st == 200, "TLS /generate %d stream=%s: %d %r" % (i, stream, st, raw[:300])):
                got = pc.text_of("generate", stream, raw)
                check(got == ref[i], "TLS /generate %d stream=%s: %r != %r" %
                      (i, stream, got, ref[i]))
        body = {"model": model, "prompt": texts[i], "max_tokens": MAX_NEW, "temperature": 0,
                "ignore_eos": True, "stream": True}
        st, raw = rt.post("/v1/completions", body, 60)
        if check(st == 200, "TLS completions %d: %d %r" % (i, st, raw[:300])):
            got = pc.text_of("completions", True, raw)
            check(got == ref[i], "TLS completions %d: %r != %r" % (i, got, ref[i]))
    for d in (pf, dc):
        check(d.pool_full(), "TLS: %s pool full after the requests" % d.role)
    for p in (rt, dc, pf):
        p.kill()


def main():
    py = sglang_router_python()
    if not py:
        print("SKIP: sglang_router is not installed (scripts/setup.sh puts sglang-router into "
              ".venv-tools/; it needs PyPI)")
        return 77
    tmp = pc.tmpdir()
    model = pc.make_model(BUILD, tmp)
    texts = prompts()

    def body():
        ref = pc.pool_map(lambda i: pc.generate(BUILD, model, texts[i], MAX_NEW,
                                                ["--ignore-eos"]), len(texts))
        single_pair(py, model, tmp, texts, ref)
        two_pairs(py, model, tmp, texts, ref)
        tls_pair(py, model, tmp, texts, ref)

    pc.run_test("sglang-router", body, tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
