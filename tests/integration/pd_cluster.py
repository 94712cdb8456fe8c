"""pd_cluster.py — a prefill, a decode and a router as real processes on 127.0.0.1, for the
end-to-end tests (test_pd_router.py, test_openai_client.py). Python stdlib only.

Every process started here is registered and killed (by PID) by kill_all(), which the tests
call in a finally block; every wait polls with a deadline, so nothing waits forever. A daemon
restarted after a SIGKILL reuses its ports, since the router's worker list is fixed at start.
"""
import ctypes
import http.client
import json
import os
import socket
import subprocess
import tempfile
import time

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


def http_call(port, method, path, body=None, timeout=60, headers=None, host="127.0.0.1"):
    """One request on a fresh connection: (status, body bytes); raises OSError on failure."""
    c = http.client.HTTPConnection(host, port, timeout=timeout)
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


def sse_events(raw):
    """The data payloads of an SSE body, in order."""
    out = []
    for block in raw.decode("utf-8", "replace").split("\n\n"):
        block = block.strip()
        if block.startswith("data: "):
            out.append(block[6:])
    return out


class Proc:
    """A process with a log file; ready once GET /health answers 200 on its port."""

    def __init__(self, name, args, port, tmp, env=None, ready_timeout=60, wait_ready=True,
                 host="127.0.0.1"):
        self.name = name
        self.host = host
        self.args = args
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

    def get(self, path, timeout=10, headers=None):
        return http_call(self.port, "GET", path, None, timeout,
                         self.auth if headers is None else headers, self.host)

    def post(self, path, body, timeout=60, headers=None):
        return http_call(self.port, "POST", path, body, timeout,
                         self.auth if headers is None else headers, self.host)

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(10)

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


class Daemon(Proc):
    def __init__(self, build, role, model, tmp, extra=(), port=None, bport=None,
                 host="127.0.0.1", **kw):
        self.role = role
        port = port or free_port()
        self.bport = (bport or free_port()) if role == "prefill" else None
        binary = os.path.join(build, role, "pdserve-" + role)
        args = [binary, "--model-path", model, "--host", host, "--port", str(port),
                "--disaggregation-mode", role, "--page-size", "16", "--chunked-prefill-size", "64",
                "--threads", "1", "--max-total-tokens", "16384", "--log-level",
                os.environ.get("PD_TEST_LOG_LEVEL", "info")]
        if self.bport:
            args += ["--disaggregation-bootstrap-port", str(self.bport)]
        args += list(extra)
        super().__init__(role, args, port, tmp, host=host, **kw)

    def server_info(self):
        st, body = self.get("/server_info")
        if st != 200:
            raise OSError("/server_info answered %d" % st)
        return json.loads(body)

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


class Router(Proc):
    def __init__(self, build, prefills, decodes, tmp, extra=(), port=None, **kw):
        """prefills: [(url_port, bootstrap_port)], decodes: [url_port]."""
        port = port or free_port()
        args = [os.path.join(build, "router", "pdserve-router"), "--pd-disaggregation",
                "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin",
                "--health-check-interval-secs", "0.25", "--log-level",
                os.environ.get("PD_TEST_LOG_LEVEL", "info")]
        for hp, bp in prefills:
            args += ["--prefill", "http://127.0.0.1:%d" % hp, str(bp)]
        for dp in decodes:
            args += ["--decode", "http://127.0.0.1:%d" % dp]
        args += list(extra)
        super().__init__("router", args, port, tmp, **kw)


def make_model(build, tmp):
    model = os.path.join(tmp, "model")
    subprocess.run([os.path.join(build, "tools", "pdserve-mkmodel"), "--out", model], check=True,
                   capture_output=True, timeout=60)
    return model


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
