#!/usr/bin/env python3
"""test_tls.py — TLS on every listener (--ssl-certfile, --ssl-keyfile, --ssl-ca-certs), with a CA
and a server certificate the openssl CLI makes in the test's scratch directory:

  * a prefill and a decode serving HTTPS (the prefill's bootstrap port TLS too, decode calling
    it with --ssl-ca-certs) behind a router serving HTTPS to https:// workers: the official
    `openai` client (the CA given through its httpx client's verify=) lists the model and
    streams a chat completion and a completion whose text is pdserve-generate's; /generate
    streamed over HTTPS too;
  * plain HTTP on each TLS port (router, prefill, decode) fails at once (no answer, no hang),
    each process logs the refused handshake with the peer's address at warning, and serves on;
  * a decode without TLS sent to the TLS bootstrap port, and a decode with TLS but another
    cluster key, are both refused: the request fails naming why, the prefill's log has the
    refusal at warning (the wrong key with the peer's address; never the key), and the cluster
    serves on with every page back in the pools;
  * the colocated server (pdserve-decode --disaggregation-mode null) over HTTPS;
  * pdserve-prefill, pdserve-decode (both modes) and pdserve-router refuse to start, exiting
    non-zero at once with a message naming the file, on: a missing certificate, a file that is
    no certificate, a key of another certificate, one of --ssl-certfile/--ssl-keyfile alone, a
    --ssl-ca-certs file with no certificate; every binary's --help documents the three flags.

Exits 77 (CTest SKIP) with a message when `import openai` fails. Usage: test_tls.py BUILD_DIR
"""
import json
import os
import socket
import subprocess
import sys
import time

try:
    import openai
except ImportError as e:
    print("SKIP: the openai package is not installed (%s); scripts/setup.sh pins it into "
          ".venv-tools/" % e)
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pd_cluster as pc  # noqa: E402
from pd_cluster import check, step  # noqa: E402

BUILD = os.path.abspath(sys.argv[1])
PREFILL = os.path.join(BUILD, "prefill", "pdserve-prefill")
DECODE = os.path.join(BUILD, "decode", "pdserve-decode")
ROUTER = os.path.join(BUILD, "router", "pdserve-router")
MAX_NEW = 12
PROMPT = "the quick brown fox jumps over the lazy dog"


def tls_args(t, ca=True):
    a = ["--ssl-certfile", t["cert"], "--ssl-keyfile", t["key"]]
    return a + (["--ssl-ca-certs", t["ca"]] if ca else [])


def log_lines(proc, since=0):
    with open(proc.log_path, errors="replace") as f:
        return f.read()[since:]


def log_size(proc):
    return os.path.getsize(proc.log_path)


def plain_http_refused(proc, what):
    """Plain HTTP on proc's TLS port: no HTTP answer, at once; the process logs the refused
    handshake with the client's address and still answers /health over HTTPS."""
    mark = log_size(proc)
    s = socket.create_connection(("127.0.0.1", proc.port), timeout=10)
    port = s.getsockname()[1]
    t0 = time.time()
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    try:
        got = s.recv(4096)
    except OSError:
        got = b""
    s.close()
    took = time.time() - t0
    check(not got.startswith(b"HTTP/") and took < 5,
          "%s: plain HTTP answered %r after %.1f s" % (what, got[:80], took))
    want = "TLS handshake with 127.0.0.1:%d failed" % port
    pc.wait_until(lambda: want in log_lines(proc, mark), 5)
    tail = log_lines(proc, mark)
    check(want in tail and "WARN" in tail.split(want)[0].rsplit("\n", 1)[-1],
          "%s: no warning '%s' in its log: %r" % (what, want, tail[-600:]))
    st, _ = proc.get("/health")
    check(st == 200, "%s: /health over HTTPS after the plain request: %d" % (what, st))


def openai_over_tls(rt, model, t):
    client = openai.OpenAI(base_url="https://127.0.0.1:%d/v1" % rt.port, api_key="none",
                           timeout=60, max_retries=0,
                           http_client=openai.DefaultHttpxClient(verify=t["ca"]))
    models = client.models.list()
    check([m.id for m in models.data] == [model], "openai models.list over HTTPS: %r" % models)
    ref = pc.generate(BUILD, model, PROMPT, MAX_NEW)
    text, n = "", 0
    for ch in client.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_NEW,
                                        temperature=0, stream=True):
        n += 1
        for c in ch.choices:
            text += c.text or ""
    check(text == ref and n > 2, "openai streamed completion over HTTPS: %d chunks %r != %r" %
          (n, text, ref))
    msgs = [{"role": "user", "content": "Where does the river run?"}]
    ids = pc.chat_prompt_ids(BUILD, model, rt, msgs, rt.tmp)
    cref = pc.generate(BUILD, model, ids, MAX_NEW)
    text, roles = "", []
    for ch in client.chat.completions.create(model=model, messages=msgs, max_tokens=MAX_NEW,
                                             temperature=0, stream=True):
        for c in ch.choices:
            roles += [c.delta.role] if c.delta.role else []
            text += c.delta.content or ""
    check(text == cref and roles[:1] == ["assistant"],
          "openai streamed chat over HTTPS: %r (roles %r) != %r" % (text, roles, cref))
    # a client that does not know the CA is refused by its own verification
    try:
        openai.OpenAI(base_url="https://127.0.0.1:%d/v1" % rt.port, api_key="none", timeout=10,
                      max_retries=0).models.list()
        check(False, "a client without the CA reached the router")
    except openai.APIConnectionError:
        pass
    return ref


def grpc_tls_env():
    """The environment of a decode that calls bootstrap ports over TLS: under LeakSanitizer, the
    suppressions of tests/lsan-grpc-tls.supp (gRPC's threads' OpenSSL error state, left when
    they outlive OpenSSL's exit cleanup) instead of tests/lsan.supp's."""
    env = dict(os.environ)
    lsan = env.get("LSAN_OPTIONS")
    if lsan:
        supp = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "lsan-grpc-tls.supp")
        env["LSAN_OPTIONS"] = ":".join(
            o for o in lsan.split(":") if not o.startswith("suppressions=")) + \
            ":suppressions=" + supp
    return env


def refused_bootstrap(pf, model, tmp, t, extra, what, want_reply, want_log, key_text=None):
    """A decode started with extra flags gets one request for pf's bootstrap port: it fails,
    the reply says want_reply, pf's log gets want_log at warning; the decode's pages come
    back."""
    dc = pc.Daemon(BUILD, "decode", model, tmp, extra, ssl_ctx=t["ctx"] if "--ssl-certfile"
                   in extra else None, env=grpc_tls_env())
    mark = log_size(pf)
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 4},
            "bootstrap_host": "127.0.0.1", "bootstrap_port": pf.bport,
            "bootstrap_room": 4242 + len(extra)}
    st, raw = dc.post("/generate", body, 30)
    raw = raw.decode(errors="replace")
    check(st >= 400 and want_reply in raw, "%s: decode answered %d %r (want '%s')" %
          (what, st, raw[:400], want_reply))
    pc.wait_until(lambda: want_log in log_lines(pf, mark), 5)
    tail = log_lines(pf, mark)
    line = next((ln for ln in tail.splitlines() if want_log in ln), "")
    check("WARN" in line, "%s: prefill log has no warning with '%s': %r" %
          (what, want_log, tail[-800:]))
    if key_text:
        check(key_text not in tail, "%s: the prefill's log shows the key" % what)
    check(dc.pool_full(), "%s: decode pool full after the refusal" % what)
    dc.kill()


def cluster_cases(model, tmp, t):
    key = os.path.join(tmp, "cluster.key")
    with open(key, "w") as f:
        f.write("cluster-secret-tls-test\n")
    common = ["--cluster-key", key]
    step("prefill + decode + router, all HTTPS; bootstrap over TLS")
    pf = pc.Daemon(BUILD, "prefill", model, tmp, common + tls_args(t, ca=False), ssl_ctx=t["ctx"])
    dc = pc.Daemon(BUILD, "decode", model, tmp, common + tls_args(t), ssl_ctx=t["ctx"],
                   env=grpc_tls_env())
    # the PD path for every request: the bootstrap's TLS is part of what is tested
    rt = pc.Router(BUILD, [(pf.port, pf.bport)], [dc.port], tmp, tls_args(t) + pc.PD_PATH_ONLY,
                   scheme="https", ssl_ctx=t["ctx"])
    check("grpc: serving on" in log_lines(pf) and "(TLS)" in log_lines(pf),
          "prefill's bootstrap port is not TLS: %r" % log_lines(pf)[-600:])
    pc.wait_until(lambda: rt.post("/generate", {"text": "hi", "sampling_params": {
        "max_new_tokens": 1}}, 30)[0] == 200, 30, 0.2)
    ref = openai_over_tls(rt, model, t)
    st, raw = rt.post("/generate", {"text": PROMPT, "stream": True, "sampling_params": {
        "max_new_tokens": MAX_NEW, "temperature": 0}}, 60)
    check(st == 200 and pc.text_of("generate", True, raw) == ref,
          "/generate streamed over HTTPS: %d %r" % (st, raw[-300:]))

    step("plain HTTP on the TLS ports")
    for proc in (rt, pf, dc):
        plain_http_refused(proc, proc.name)

    step("a decode without TLS, and one with another cluster key, at the TLS bootstrap port")
    refused_bootstrap(pf, model, tmp, t, common, "decode without TLS", "Pair",
                      "TLS handshake failed")
    other = os.path.join(tmp, "other.key")
    with open(other, "w") as f:
        f.write("not-the-cluster-secret\n")
    refused_bootstrap(pf, model, tmp, t, ["--cluster-key", other] + tls_args(t),
                      "decode with a wrong key", "wrong cluster key",
                      "refused: wrong cluster key", key_text="not-the-cluster-secret")
    line = next((ln for ln in log_lines(pf).splitlines() if "wrong cluster key" in ln), "")
    check("from ipv4:127.0.0.1:" in line, "the wrong-key refusal names no peer: %r" % line)

    step("the cluster serves on")
    st, raw = rt.post("/generate", {"text": PROMPT, "sampling_params": {
        "max_new_tokens": MAX_NEW, "temperature": 0}}, 60)
    check(st == 200 and json.loads(raw)["text"] == ref, "after the refusals: %d %r" %
          (st, raw[:300]))
    check(pf.pool_full() and dc.pool_full(), "pools full at the end")
    for proc in (rt, dc, pf):
        rc = proc.terminate(30)
        check(rc == 0, "%s SIGTERM over TLS: exit %s" % (proc.name, rc))


def coloc_case(model, tmp, t):
    step("colocated over HTTPS")
    co = pc.Coloc(BUILD, model, tmp, tls_args(t, ca=False), ssl_ctx=t["ctx"])
    ref = pc.generate(BUILD, model, PROMPT, MAX_NEW)
    for stream in (False, True):
        st, raw = co.post("/generate", {"text": PROMPT, "stream": stream, "sampling_params": {
            "max_new_tokens": MAX_NEW, "temperature": 0}}, 60)
        check(st == 200 and pc.text_of("generate", stream, raw) == ref,
              "colocated /generate stream=%s over HTTPS: %d %r" % (stream, st, raw[-300:]))
    plain_http_refused(co, "colocated")
    check(co.terminate(30) == 0, "colocated SIGTERM over TLS")


def refuses(args, want, what):
    """The binary exits non-zero within 30 s, its output naming every one of want."""
    t0 = time.time()
    r = subprocess.run(args, capture_output=True, text=True, timeout=60)
    out = r.stdout + r.stderr
    check(r.returncode != 0 and all(w in out for w in want) and time.time() - t0 < 30,
          "%s: rc %d after %.1f s, output %r (want %s)" % (what, r.returncode, time.time() - t0,
                                                           out[-500:], want))


def startup_refusals(model, tmp, t):
    step("bad TLS files: every binary refuses to start, naming the file")
    junk = os.path.join(tmp, "junk.pem")
    with open(junk, "w") as f:
        f.write("this is no certificate\n")
    other = pc.make_tls_certs(os.path.join(tmp, "other"))
    missing = os.path.join(tmp, "no-such-cert.pem")
    port = str(pc.free_port())
    binaries = {
        "prefill": [PREFILL, "--model-path", model, "--port", port,
                    "--disaggregation-bootstrap-port", str(pc.free_port())],
        "decode": [DECODE, "--model-path", model, "--port", port],
        "colocated": [DECODE, "--model-path", model, "--port", port,
                      "--disaggregation-mode", "null"],
        "router": [ROUTER, "--port", port, "--prefill", "https://127.0.0.1:1", "2",
                   "--decode", "https://127.0.0.1:3"],
    }
    cases = [
        (["--ssl-certfile", missing, "--ssl-keyfile", t["key"]], [missing, "--ssl-certfile"],
         "missing certificate"),
        (["--ssl-certfile", junk, "--ssl-keyfile", t["key"]], [junk, "--ssl-certfile"],
         "no certificate in the file"),
        (["--ssl-certfile", t["cert"], "--ssl-keyfile", junk], [junk, "--ssl-keyfile"],
         "no key in the file"),
        (["--ssl-certfile", t["cert"], "--ssl-keyfile", other["key"]],
         [other["key"], "not the private key"], "a key of another certificate"),
        (["--ssl-certfile", t["cert"]], ["--ssl-keyfile"], "a certificate without a key"),
        (["--ssl-keyfile", t["key"]], ["--ssl-certfile"], "a key without a certificate"),
        (["--ssl-ca-certs", junk], [junk, "--ssl-ca-certs"], "a CA file with no certificate"),
    ]
    for name, base in binaries.items():
        r = subprocess.run([base[0], "--help"], capture_output=True, text=True, timeout=30)
        check(all(f in r.stdout for f in ("--ssl-certfile", "--ssl-keyfile", "--ssl-ca-certs")),
              "%s --help documents the --ssl-* flags" % name)
        for extra, want, what in cases:
            refuses(base + extra, want, "%s: %s" % (name, what))


def main():
    tmp = pc.tmpdir()

    def body():
        model = pc.make_model(BUILD, tmp)
        t = pc.make_tls_certs(tmp)
        startup_refusals(model, tmp, t)
        cluster_cases(model, tmp, t)
        coloc_case(model, tmp, t)

    pc.run_test("tls (openai %s)" % openai.__version__, body, tmp)


if __name__ == "__main__":
    main()
