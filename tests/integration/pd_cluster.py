"""pd_cluster.py — a prefill, a decode and a router (or a colocated daemon) as real processes on
127.0.0.1, and what every integration test script repeats: the tiny model, pdserve-generate's
reference answers, check/step reporting and the verdict with the daemons' logs. Python stdlib
only.

Every process started here is registered and killed (by PID) by kill_all(), which the tests
call in a finally block; every wait polls with a deadline, so nothing waits forever. A daemon
restarted after a SIGKILL reuses its ports, since the router's worker list is fixed at start.
"""
import contextlib
import ctypes
import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import traceback

PROCS = []


def _die_with_parent():
    """In the child before exec: SIGKILL when the test process dies, even by SIGKILL (a CTest
    timeout), so no daemon outlives its test."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except OSError:
        pass


_PORTS_GIVEN = set()


def free_port():
    """A port nobody listens on now, and never one this process handed out before: two calls
    in a row can get the same port from the kernel (a prefill's HTTP and bootstrap ports once
    clashed: 'HTTP listen ... address already in use')."""
    for _ in range(1000):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        p = s.getsockname()[1]
        s.close()
        if p not in _PORTS_GIVEN:
            _PORTS_GIVEN.add(p)
            return p
    raise RuntimeError("no fresh free port")


def kill_all():
    for p in PROCS:
        if p.poll() is None:
            p.kill()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass


def wait_until(pred, timeout, step=0.05):
    """Polls pred() until it is truthy or timeout seconds pass; returns its last value."""
    deadline = time.time() + timeout
    while True:
        try:
            v = pred()
        except OSError:
            v = None
        if v or time.time() >= deadline:
            return v
        time.sleep(step)


def concurrent(fn, n, timeout=150, start_timeout=30):
    """fn(0) .. fn(n-1) on n threads released at once (a barrier, so they really overlap); their
    results in order. A call that raised gives (0, repr(exception)), which reads like a failed
    (status, body) answer; a call still running after timeout seconds gives None."""
    results = [None] * n
    barrier = threading.Barrier(n)

    def run(i):
        try:
            barrier.wait(start_timeout)
            results[i] = fn(i)
        except Exception as e:  # noqa: BLE001 - the caller checks every result
            results[i] = (0, repr(e))

    ts = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in ts:
        t.start()
    deadline = time.time() + timeout
    for t in ts:
        t.join(max(0.0, deadline - time.time()))
    return results


def pool_map(fn, n, workers=2):
    """[fn(0), ..., fn(n-1)] computed by a few threads (pdserve-generate references: each is a
    process, so two at a time halve the wait on two cores). The first exception a call raised
    is raised here once all have stopped."""
    out = [None] * n
    todo = list(range(n))
    errors = []
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                if not todo or errors:
                    return
                i = todo.pop()
            try:
                out[i] = fn(i)
            except Exception as e:  # noqa: BLE001 - raised again in the caller
                with lock:
                    errors.append(e)

    ts = [threading.Thread(target=worker) for _ in range(min(workers, n))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]
    return out


def http_call(port, method, path, body=None, timeout=60, headers=None, host="127.0.0.1",
              ssl_ctx=None):
    """One request on a fresh connection (HTTPS when ssl_ctx, an ssl.SSLContext, is given):
    (status, body bytes); raises OSError on failure."""
    c = (http.client.HTTPSConnection(host, port, timeout=timeout, context=ssl_ctx) if ssl_ctx
         else http.client.HTTPConnection(host, port, timeout=timeout))
    try:
        data = None
        h = dict(headers or {})
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            h.setdefault("Content-Type", "application/json")
        c.request(method, path, data, h)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def oversized_body_answer(port, path, length):
    """POSTs headers announcing a body of length bytes with Expect: 100-continue (as curl does,
    so a server that refuses the size answers before any of the body): (head, body) of what
    came back, read until the end of the JSON error or the connection."""
    s = socket.create_connection(("127.0.0.1", port), timeout=15)
    s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % (path.encode(), length))
    raw = b""
    while b"}}" not in raw:
        piece = s.recv(65536)
        if not piece:
            break
        raw += piece
    s.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return head, body


def sse_events(raw):
    """The data payloads of an SSE body, in order."""
    out = []
    for block in raw.decode("utf-8", "replace").split("\n\n"):
        block = block.strip()
        if block.startswith("data: "):
            out.append(block[6:])
    return out


def stream_payloads(raw):
    """The JSON events of an SSE answer before its [DONE]; ValueError when it does not end with
    [DONE] or an event carries an error."""
    evs = sse_events(raw)
    if not evs or evs[-1] != "[DONE]":
        raise ValueError("stream does not end with [DONE]: %r" % evs[-3:])
    chunks = [json.loads(e) for e in evs[:-1]]
    for c in chunks:
        if "error" in c:
            raise ValueError("stream carries an error: %r" % c)
    return chunks


def text_of(kind, stream, raw):
    """The generated text of a /generate (kind "generate") or /v1/completions answer, streamed
    or not; raises when it is malformed (stream_payloads)."""
    if not stream:
        j = json.loads(raw)
        return j["text"] if kind == "generate" else j["choices"][0]["text"]
    chunks = stream_payloads(raw)
    if kind == "generate":
        return chunks[-1]["text"]
    return "".join(ch["text"] for c in chunks for ch in c["choices"])


class Proc:
    """A process with a log file; ready once GET /health answers 200 on its port (over HTTPS
    when ssl_ctx, an ssl.SSLContext trusting its certificate, is given). wrap: a function of the
    command line that returns the one to run (e.g. an nsenter prefix)."""

    def __init__(self, name, args, port, tmp, env=None, ready_timeout=60, wait_ready=True,
                 host="127.0.0.1", ssl_ctx=None, wrap=None):
        self.name = name
        self.host = host
        self.ssl_ctx = ssl_ctx
        self.args = wrap(args) if wrap else args
        self.port = port
        self.tmp = tmp
        self.env = env
        tag = name if host == "127.0.0.1" else "%s-%s" % (name, host)
        self.log_path = os.path.join(tmp, "%s-%d.log" % (tag, port))
        self.p = None
        self.auth = {}  # headers sent when a call gives none (an API key)
        self.start(ready_timeout if wait_ready else None)

    def start(self, ready_timeout=60):
        log = open(self.log_path, "a")
        self.p = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                  preexec_fn=_die_with_parent)
        log.close()
        PROCS.append(self.p)
        if ready_timeout:
            self.wait_ready(ready_timeout)

    def wait_ready(self, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.p.poll() is not None:
                raise RuntimeError("%s exited at start (rc %s); log %s" %
                                   (self.name, self.p.returncode, self.log_path))
            try:
                if self.get("/health", timeout=5)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("%s not ready within %d s; log %s" % (self.name, timeout, self.log_path))

    def conn(self, timeout=60):
        """An HTTP connection to the process, for a test that reads a stream piece by piece."""
        if self.ssl_ctx:
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout,
                                               context=self.ssl_ctx)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def get(self, path, timeout=10, headers=None):
        return http_call(self.port, "GET", path, None, timeout,
                         self.auth if headers is None else headers, self.host, self.ssl_ctx)

    def server_info(self):
        st, body = self.get("/server_info")
        if st != 200:
            raise OSError("/server_info answered %d" % st)
        return json.loads(body)

    def post(self, path, body, timeout=60, headers=None):
        return http_call(self.port, "POST", path, body, timeout,
                         self.auth if headers is None else headers, self.host, self.ssl_ctx)

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(10)

    def pause(self):
        """SIGSTOP: the process stays, its sockets stay open, nothing it owns moves (a stuck
        or swapped-out server, as its peers see it)."""
        os.kill(self.p.pid, signal.SIGSTOP)

    def resume(self):
        os.kill(self.p.pid, signal.SIGCONT)

    def health_by(self, deadline):
        """True when GET /health answers 200 before deadline (a time.time()); each try may take
        only what is left, so a late 200 does not count."""
        while True:
            left = deadline - time.time()
            if left <= 0:
                return False
            try:
                if self.get("/health", timeout=left)[0] == 200 and time.time() <= deadline:
                    return True
            except OSError:
                pass
            time.sleep(min(0.05, max(0.0, deadline - time.time())))

    def terminate(self, timeout=30):
        """SIGTERM, then the exit code (or 'hung' after timeout, and a SIGKILL)."""
        if self.p.poll() is not None:
            return self.p.returncode
        self.p.terminate()
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait(10)
            return "hung"

    def stacks(self):
        """All threads' backtraces of the live process (gdb -batch attach), for a daemon that
        stopped answering; a line saying why when there are none."""
        if self.p.poll() is not None:
            return "(%s exited, rc %s)" % (self.name, self.p.returncode)
        try:
            r = subprocess.run(["gdb", "-p", str(self.p.pid), "-batch", "-ex",
                                "thread apply all bt"], capture_output=True, text=True,
                               timeout=120)
            return r.stdout + r.stderr[-2000:]
        except (OSError, subprocess.TimeoutExpired) as e:
            return "(gdb failed: %r)" % e

    def log_tail(self, n=3000):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-n:]
        except OSError:
            return ""


def log_level(default=None):
    """--log-level of a started process: $PD_TEST_LOG_LEVEL, else default, else info."""
    return os.environ.get("PD_TEST_LOG_LEVEL", default or "info")


class Daemon(Proc):
    def __init__(self, build, role, model, tmp, extra=(), port=None, bport=None,
                 host="127.0.0.1", level=None, **kw):
        self.role = role
        port = port or free_port()
        self.bport = (bport or free_port()) if role == "prefill" else None
        binary = os.path.join(build, role, "pdserve-" + role)
        args = [binary, "--model-path", model, "--host", host, "--port", str(port),
                "--disaggregation-mode", role, "--page-size", "16", "--chunked-prefill-size", "64",
                "--threads", "1", "--max-total-tokens", "16384", "--log-level", log_level(level)]
        if self.bport:
            args += ["--disaggregation-bootstrap-port", str(self.bport)]
        if role == "decode":
            # PD_TEST_DECODE_FLAGS: the suites again with the decode's other settings (CTest's
            # *_no_decode_cache entries: --disable-prefix-cache, no decode-side prefix reuse)
            args += os.environ.get("PD_TEST_DECODE_FLAGS", "").split()
        args += list(extra)
        super().__init__(role, args, port, tmp, host=host, **kw)

    def pool(self):
        return self.server_info()["kv_pool"]

    def pool_full(self, wait=10.0):
        """True once no page is in use and no request is live (polls up to wait seconds)."""
        last = {}

        def full():
            info = self.server_info()
            p = info["kv_pool"]
            last["p"] = p
            last["live"] = info.get("live_requests")
            return (p["used_pages"] == 0 and p["free_pages"] + p["cached_pages"] == p["num_pages"]
                    and info.get("live_requests", 0) == 0)

        if wait_until(full, wait):
            return True
        print("%s pool not full after %.0f s: %s live=%s" %
              (self.role, wait, last.get("p"), last.get("live")), flush=True)
        return False


# Router flags of a test whose premise is the PD path for every request (it counts transfers,
# hand-over stages or pairing refusals, or fails the prefill), whatever PD_TEST_ROUTER_FLAGS or
# the router's defaults say about the local path (--local-prefill-max-tokens).
PD_PATH_ONLY = ["--local-prefill-max-tokens", "0"]


class Router(Proc):
    def __init__(self, build, prefills, decodes, tmp, extra=(), port=None, scheme="http",
                 prefill_host="127.0.0.1", **kw):
        """prefills: [(url_port, bootstrap_port)] on prefill_host, decodes: [url_port] on
        127.0.0.1, reached at scheme://host:port."""
        port = port or free_port()
        args = [os.path.join(build, "router", "pdserve-router"), "--pd-disaggregation",
                "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin",
                "--health-check-interval-secs", "0.25", "--log-level",
                os.environ.get("PD_TEST_LOG_LEVEL", "info")]
        for hp, bp in prefills:
            args += ["--prefill", "%s://%s:%d" % (scheme, prefill_host, hp), str(bp)]
        for dp in decodes:
            args += ["--decode", "%s://127.0.0.1:%d" % (scheme, dp)]
        # PD_TEST_ROUTER_FLAGS: the suites again with the router's paths flipped (CTest's
        # *_pd_path entries: --local-prefill-max-tokens 0)
        args += os.environ.get("PD_TEST_ROUTER_FLAGS", "").split() + list(extra)
        super().__init__("router", args, port, tmp, **kw)


class Coloc(Daemon):
    """pdserve-decode --disaggregation-mode null: the whole server in one process. --page-size 16,
    one thread, --max-total-tokens 16384 unless extra sets it."""

    def __init__(self, build, model, tmp, extra=(), level=None, **kw):
        self.role = "colocated"
        self.bport = None
        port = free_port()
        args = [os.path.join(build, "decode", "pdserve-decode"), "--model-path", model,
                "--disaggregation-mode", "null", "--host", "127.0.0.1", "--port", str(port),
                "--page-size", "16", "--threads", "1", "--log-level", log_level(level)]
        args += list(extra)
        if "--max-total-tokens" not in extra:
            args += ["--max-total-tokens", "16384"]
        Proc.__init__(self, "colocated", args, port, tmp, **kw)


def make_tls_certs(tmp):
    """A CA and a server certificate it signed, for 127.0.0.1 and localhost, made with the
    openssl CLI in tmp/tls: {"ca", "cert", "key"} paths (PEM; the key unencrypted), and "ctx",
    an ssl.SSLContext that trusts the CA (for http_call and Proc)."""
    d = os.path.join(tmp, "tls")
    os.makedirs(d, exist_ok=True)
    p = {k: os.path.join(d, f) for k, f in (("ca", "ca.pem"), ("ca_key", "ca.key"),
                                            ("cert", "server.pem"), ("key", "server.key"),
                                            ("csr", "server.csr"), ("ext", "server.ext"))}
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]

    def run(args):
        r = subprocess.run(["openssl"] + args, capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError("openssl %s: %s" % (args[0], r.stderr))

    run(["req", "-x509"] + ec + ["-days", "2", "-subj", "/CN=pdserve test CA",
                                 "-keyout", p["ca_key"], "-out", p["ca"],
                                 "-addext", "basicConstraints=critical,CA:TRUE",
                                 "-addext", "keyUsage=critical,keyCertSign,cRLSign"])
    with open(p["ext"], "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                "basicConstraints=critical,CA:FALSE\n"
                "keyUsage=critical,digitalSignature,keyEncipherment\n"
                "extendedKeyUsage=serverAuth\n")
    run(["req"] + ec + ["-subj", "/CN=localhost", "-keyout", p["key"], "-out", p["csr"]])
    run(["x509", "-req", "-in", p["csr"], "-CA", p["ca"], "-CAkey", p["ca_key"],
         "-CAcreateserial", "-days", "2", "-out", p["cert"], "-extfile", p["ext"]])
    p["ctx"] = ssl.create_default_context(cafile=p["ca"])
    return p


def serves(rt, timeout=20):
    """True when one short greedy /generate through rt answers 200 with a text."""
    try:
        st, raw = rt.post("/generate", {"text": "the river runs to the sea", "sampling_params": {
            "max_new_tokens": 8, "temperature": 0}}, timeout)
    except OSError:
        return False
    return st == 200 and b'"text"' in raw


def served_within(rt, seconds, step=0.1):
    """Seconds until rt serves a request (serves(), each try bounded by what is left), or None
    when it does not within seconds."""
    t0 = time.time()
    while True:
        left = t0 + seconds - time.time()
        if left <= 0:
            return None
        if serves(rt, max(0.5, left)) and time.time() - t0 <= seconds:
            return time.time() - t0
        time.sleep(min(step, max(0.0, t0 + seconds - time.time())))


def make_model(build, tmp, extra=(), name="model"):
    """pdserve-mkmodel's model (the tiny default, or as extra flags say) in tmp/name."""
    model = os.path.join(tmp, name)
    subprocess.run([os.path.join(build, "tools", "pdserve-mkmodel"), "--out", model] + list(extra),
                   check=True, capture_output=True, timeout=60)
    return model


def chat_prompt_ids(build, model, srv, messages, tmp):
    """A chat's prompt as the daemons build it: rendered by pdserve-tokenize --chat (with the
    generation prompt), then token ids from srv's /tokenize without special tokens."""
    path = os.path.join(tmp, "chat.json")
    with open(path, "w") as f:
        json.dump({"messages": messages, "add_generation_prompt": True}, f)
    rendered = subprocess.run([os.path.join(build, "tools", "pdserve-tokenize"), "--model-path",
                               model, "--chat", path], capture_output=True, text=True, check=True,
                              timeout=60).stdout
    st, body = srv.post("/tokenize", {"prompt": rendered, "add_special_tokens": False})
    return json.loads(body)["tokens"]


def generate(build, model, prompt, max_new, extra=(), ids=False, timeout=120):
    """pdserve-generate's answer in the daemons' test layout (--page-size 16
    --chunked-prefill-size 64, one thread). prompt: a text, or a list of token ids; extra: more
    flags (sampling). The text (it may hold newlines); with ids, (text, output token ids)."""
    args = [os.path.join(build, "tools", "pdserve-generate"), "--model-path", model,
            "--max-new-tokens", str(max_new), "--chunked-prefill-size", "64", "--page-size", "16",
            "--threads", "1"] + list(extra)
    if ids:
        args.append("--ids")
    if isinstance(prompt, str):
        args += ["--", prompt]
    else:
        args += ["--prompt-ids", " ".join(map(str, prompt))]
    out = subprocess.run(args, capture_output=True, check=True, timeout=timeout).stdout
    out = out[:-1].decode("utf-8")  # the answer, then one newline
    if not ids:
        return out
    text, line = out.rsplit("\n", 1)  # the text, then a line of ids
    return text, [int(x) for x in line.split()]


def generate_ids(build, model, prompts, max_new, extra=(), what="generate"):
    """pdserve-generate's greedy output ids for every prompt (a list of token-id lists) in one
    run: --no-tokenizer --ids --ignore-eos, chunks of 32 (so longer prompts take several), page
    size 16; extra: more flags (--tp-size, --kv-cache-dtype, --logits-out, --threads). None, and
    a failure recorded under what, when it fails or answers another number of prompts."""
    args = [os.path.join(build, "tools", "pdserve-generate"), "--model-path", model, "--ids",
            "--max-new-tokens", str(max_new), "--chunked-prefill-size", "32", "--page-size", "16",
            "--ignore-eos", "--no-tokenizer",
            "--prompt-ids", "; ".join(" ".join(map(str, p)) for p in prompts)] + list(extra)
    r = subprocess.run(args, capture_output=True, text=True, timeout=120)
    if not check(r.returncode == 0, "%s rc %d: %s" % (what, r.returncode, r.stderr)):
        return None
    # --no-tokenizer: one line of ids per prompt (no text)
    lines = r.stdout.strip("\n").split("\n")
    ids = [[int(x) for x in ln.split()] for ln in lines if ln and not ln.startswith("#")]
    if not check(len(ids) == len(prompts), "%s: %d answers for %d prompts: %r" %
                 (what, len(ids), len(prompts), r.stdout[-500:])):
        return None
    return ids


def tmpdir():
    base = os.environ.get("PD_TEST_TMPDIR") or None
    if base:
        os.makedirs(base, exist_ok=True)
    return tempfile.mkdtemp(dir=base)


def start_cluster(build, tmp, model, prefill_extra=(), decode_extra=(), router_extra=()):
    pf = Daemon(build, "prefill", model, tmp, prefill_extra)
    dc = Daemon(build, "decode", model, tmp, decode_extra)
    rt = Router(build, [(pf.port, pf.bport)], [dc.port], tmp, router_extra)
    return pf, dc, rt


@contextlib.contextmanager
def cluster(build, tmp, model, prefill_extra=(), decode_extra=(), router_extra=()):
    """start_cluster for a with block: (prefill, decode, router), all three killed when the
    block ends, however it ends (run_test prints their logs when it failed)."""
    procs = start_cluster(build, tmp, model, prefill_extra, decode_extra, router_extra)
    try:
        yield procs
    finally:
        for p in reversed(procs):
            p.kill()


# ---------------------------------------------------------------- a test script's reporting

FAILS = []  # what failed in this test process, in order
T0 = time.time()


def check(cond, what):
    """Records and prints a failure unless cond; returns cond, so a caller can skip what
    depends on it."""
    if not cond:
        FAILS.append(what)
        print("FAIL:", what, flush=True)
    return cond


def step(msg):
    print("[%7.2f] %s" % (time.time() - T0, msg), flush=True)


def json_post(srv, path, body):
    """(status, the answer's JSON, or its raw bytes when it is not JSON)."""
    st, raw = srv.post(path, body)
    try:
        return st, json.loads(raw)
    except ValueError:
        return st, raw


def ok_post(srv, path, body, what):
    """The JSON answer of a request that must answer 200; None (a failure) otherwise."""
    st, j = json_post(srv, path, body)
    if not check(st == 200, "%s: status %s %s" % (what, st, j)):
        return None
    return j


def stream_chunks(srv, path, body):
    """A streamed request's JSON events; the stream must answer 200 and end with one [DONE]."""
    st, raw = srv.post(path, body)
    check(st == 200, "%s stream: status %s" % (path, st))
    evs = sse_events(raw)
    check(evs and evs[-1] == "[DONE]" and evs.count("[DONE]") == 1,
          "%s stream ends with one [DONE]: %s" % (path, evs[-2:]))
    return [json.loads(e) for e in evs if e != "[DONE]"]


def concurrent_generate(port, prompts, lens, what):
    """Posts every prompt (token ids; lens[i] new tokens, greedy, ignore_eos) at once to port's
    /generate; the answers' output ids, None for a request that failed (recorded under what)."""

    def one(i):
        body = {"input_ids": prompts[i], "sampling_params": {
            "max_new_tokens": lens[i], "temperature": 0, "ignore_eos": True}}
        return http_call(port, "POST", "/generate", body, 120)

    out = []
    for i, r in enumerate(concurrent(one, len(prompts))):
        ok = check(r is not None and r[0] == 200, "%s request %d: %r" % (what, i, r))
        out.append(json.loads(r[1])["output_ids"] if ok else None)
    return out


def request_text(srv, kind, body, stream, timeout=60):
    """POSTs body to /generate (kind "generate") or /v1/completions: (text, raw body, None) for
    a 200 with a well-formed answer (text_of), else (None, raw body or None, what went
    wrong)."""
    path = "/generate" if kind == "generate" else "/v1/completions"
    try:
        st, raw = srv.post(path, body, timeout=timeout)
    except OSError as e:
        return None, None, "%s stream=%s: %r" % (path, stream, e)
    if st != 200:
        return None, raw, "%s stream=%s: HTTP %d %s" % (path, stream, st, raw[:300])
    try:
        return text_of(kind, stream, raw), raw, None
    except (ValueError, KeyError, IndexError, TypeError) as e:
        return None, raw, "%s stream=%s: bad answer %r: %r" % (path, stream, e, raw[:300])


def pairing_refused(build, tmp, model, prefill_extra, decode_extra, words, what):
    """A prefill and a decode whose KV pages cannot be shared (prefill_extra and decode_extra
    say how they differ) behind the router: a request is refused at pairing with an error
    naming every one of words; the decode gives back the pages and keeps serving."""
    with cluster(build, tmp, model, prefill_extra, decode_extra, PD_PATH_ONLY) as (pf, dc, rt):
        body = {"input_ids": [1, 2, 3, 4, 5], "sampling_params": {"max_new_tokens": 4}}
        st, raw = http_call(rt.port, "POST", "/generate", body, 60)
        raw = raw.decode(errors="replace")
        check(st >= 400 and all(w in raw for w in words),
              "%s: %d %r (want an error naming %s)" % (what, st, raw[:400], ", ".join(words)))
        check(dc.pool_full(), "%s: decode pool full after the refusal" % what)
        st, _ = dc.get("/health", 10)
        check(st == 200, "%s: decode still serving after the refusal" % what)


def help_documents(build, flag, words):
    """pdserve-prefill's, pdserve-decode's and pdserve-generate's --help name flag and every one
    of words."""
    for binary in ("prefill/pdserve-prefill", "decode/pdserve-decode", "tools/pdserve-generate"):
        r = subprocess.run([os.path.join(build, binary), "--help"], capture_output=True,
                           text=True, timeout=30)
        check(r.returncode == 0 and flag in r.stdout and all(w in r.stdout for w in words),
              "%s --help documents %s" % (os.path.basename(binary), flag))


def dump_logs(tmp, tail=4000, warnings=60):
    """For a failed test's output: every process log in tmp, its first warnings and errors (a
    fault's cause is often long before the tail), then its tail."""
    for f in sorted(os.listdir(tmp)):
        if f.endswith(".log"):
            print("---", f)
            with open(os.path.join(tmp, f), errors="replace") as fh:
                text = fh.read()
            warned = [ln for ln in text.splitlines() if " WARN " in ln or " ERROR " in ln]
            if warned:
                print("(its first %d of %d warnings and errors)" %
                      (min(warnings, len(warned)), len(warned)))
                print("\n".join(warned[:warnings]))
                print("(its tail)")
            print(text[-tail:])


# What a sanitizer prints about a bug (binaries built with -DPD_SANITIZE=address,undefined):
# ASan/LSan's ERROR and SUMMARY lines, UBSan's "runtime error:".
SANITIZER_REPORT = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error: ",
                    "SUMMARY: UndefinedBehaviorSanitizer")


def sanitizer_reports(tmp):
    """(log, line) of every sanitizer report in tmp's process logs: a daemon that hit one may
    still have answered every request (a leak found at exit, UBSan without halt)."""
    found = []
    for f in sorted(os.listdir(tmp)):
        if not f.endswith(".log"):
            continue
        with open(os.path.join(tmp, f), errors="replace") as fh:
            for line in fh:
                if any(m in line for m in SANITIZER_REPORT):
                    found.append((f, line.strip()[:300]))
    return found


def run_test(name, body, tmp, log_tail=4000):
    """Runs body() (the test's cases): an exception is one more failure, with its traceback;
    every process started here is killed whatever happens. A sanitizer report in a process log
    is a failure too. Then the verdict: the failures and the process logs of tmp, exit 1; or
    '<name>: PASS'."""
    try:
        body()
    except Exception as e:  # noqa: BLE001 - a failure like any other, reported below
        traceback.print_exc()
        FAILS.append("exception: %r" % e)
    finally:
        kill_all()
    for log, line in sanitizer_reports(tmp):
        FAILS.append("sanitizer report in %s: %s" % (log, line))
    if FAILS:
        print("%s: %d failures (%.1f s); logs in %s" % (name, len(FAILS), time.time() - T0, tmp))
        for f in FAILS:
            print("  -", f)
        dump_logs(tmp, log_tail)
        sys.exit(1)
    print("%s: PASS (%.1f s)" % (name, time.time() - T0))
