#!/usr/bin/env python3
"""fake_sse_server.py — a test fixture for pdserve-bench (not a product): an HTTP server that
streams SSE answers with controlled timing on /generate (SGLang shape), /v1/completions and
/v1/chat/completions (OpenAI shapes), and logs, for every request, its own server-side times.

Timing: the first token is written --first-ms after the request was read, then one token every
--itl-ms; a request gets exactly max_tokens / sampling_params.max_new_tokens tokens. Each request
appends one JSON line to --log: {"path", "recv", "first", "last", "n", "inflight"} where the
times are time.monotonic() (CLOCK_MONOTONIC, the clock pdserve-bench uses too) taken just after
the body was read, after the first chunk was flushed, and after the last ([DONE]) was flushed;
"inflight" is how many requests were being served when this one arrived (itself included). A
completed or failed answer also has "done": the time just before [DONE] (or the error) was
written, the earliest moment its client can have seen the end ("last" comes after the write,
so a quick client's next request may be read before it is taken).

A client that goes away mid-answer is logged with "gone": "fin" (it closed: an orderly end of
its stream) or "reset" (its connection was reset), and "n" is the tokens written before that was
seen; the server looks before every token.

--fail-every K answers every K-th generation request (1-based count) with HTTP 400 and an
OpenAI error body; --no-usage leaves out usage / meta_info token counts (the client must count
chunks); --log-bodies adds each request's JSON body ("body") and the answer's text ("answer")
to its log line, so a test can check what a client sent after what it was told.

As a pdserve daemon's stand-in for pdserve-bench's --kv-bytes-url and --flush-cache: with
--metrics, GET /metrics says pdserve_kv_transfer_bytes_total is 1000 per generation request
answered so far (counted before its first token; without it /metrics is a 404, as from a server
that is not pdserve); POST /flush_cache answers 200 and logs {"path": "/flush_cache", "recv"}. GET /v1/models names --model-id; GET /health is 200. Prints "port N" once listening.
Stdlib only.
"""
import argparse
import json
import select
import socket
import socketserver
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ARGS = None
LOCK = threading.Lock()
STATE = {"count": 0, "inflight": 0, "answered": 0}
KV_BYTES_PER_REQUEST = 1000


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # the body ends when the connection closes

    def log_message(self, fmt, *args):
        pass

    def send_json(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            self.send_json(200, {})
        elif self.path == "/metrics" and ARGS.metrics:
            with LOCK:
                v = STATE["answered"] * KV_BYTES_PER_REQUEST
            data = ('# TYPE pdserve_kv_transfer_bytes_total counter\n'
                    'pdserve_kv_transfer_bytes_total{model_name="%s"} %d\n' %
                    (ARGS.model_id, v)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        elif self.path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [
                {"id": ARGS.model_id, "object": "model", "owned_by": "sglang",
                 "max_model_len": 4096}]})
        else:
            self.send_json(404, {"error": {"message": "no such path"}})

    def event(self, obj):
        data = obj if isinstance(obj, str) else json.dumps(obj)
        self.wfile.write(("data: %s\n\n" % data).encode())
        self.wfile.flush()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        recv = time.monotonic()
        if self.path == "/flush_cache":
            self.send_json(200, {})
            with LOCK:
                with open(ARGS.log, "a") as f:
                    f.write(json.dumps({"path": self.path, "recv": recv}) + "\n")
            return
        with LOCK:
            STATE["count"] += 1
            STATE["inflight"] += 1
            nth, inflight = STATE["count"], STATE["inflight"]
        try:
            self.serve(body, recv, nth, inflight)
        finally:
            with LOCK:
                STATE["inflight"] -= 1

    def serve(self, body, recv, nth, inflight):
        path = self.path
        if ARGS.fail_every and nth % ARGS.fail_every == 0:
            done = time.monotonic()
            self.send_json(400, {"error": {"message": "injected failure %d" % nth,
                                           "type": "BadRequestError", "code": 400}})
            self.log(path, recv, recv, time.monotonic(), 0, inflight, failed=True, body=body,
                     done=done)
            return
        if path == "/generate":
            n = body["sampling_params"]["max_new_tokens"]
        elif path in ("/v1/completions", "/v1/chat/completions"):
            n = body["max_tokens"]
        else:
            self.send_json(404, {"error": {"message": "no such path"}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        with LOCK:
            STATE["answered"] += 1
        first = None
        text = ""
        time.sleep(ARGS.first_ms / 1e3)
        for k in range(1, n + 1):
            if k > 1:
                time.sleep(ARGS.itl_ms / 1e3)
            gone = self.client_gone()
            if gone:
                self.log(path, recv, first, time.monotonic(), k - 1, inflight, gone=gone,
                         body=body, answer=text)
                return
            piece = "t%d.%d " % (nth, k)  # differs between requests: a test can tell answers
            text += piece
            if path == "/generate":
                ev = {"text": text, "output_ids": list(range(k))}
                if not ARGS.no_usage:
                    ev["meta_info"] = {"id": "r%d" % nth, "prompt_tokens": 1,
                                       "completion_tokens": k}
            elif path == "/v1/completions":
                ev = {"object": "text_completion", "choices": [{"index": 0, "text": piece}]}
            else:
                ev = {"object": "chat.completion.chunk",
                      "choices": [{"index": 0, "delta": {"content": piece}}]}
            self.event(ev)
            if first is None:
                first = time.monotonic()
        if path != "/generate" and not ARGS.no_usage:
            self.event({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": n,
                                                 "total_tokens": n + 1}})
        done = time.monotonic()
        self.event("[DONE]")
        self.log(path, recv, first, time.monotonic(), n, inflight, body=body, answer=text,
                 done=done)

    def client_gone(self):
        """'fin' when the client closed its end, 'reset' when it reset the connection, else
        None (nothing to read: a streaming client sends nothing after its request)."""
        try:
            if not select.select([self.connection], [], [], 0)[0]:
                return None
            return "fin" if self.connection.recv(1, socket.MSG_PEEK) == b"" else None
        except ConnectionResetError:
            return "reset"
        except OSError:
            return "reset"

    def log(self, path, recv, first, last, n, inflight, failed=False, gone=None, body=None,
            answer=None, done=None):
        rec = {"path": path, "recv": recv, "first": first, "last": last, "n": n,
               "inflight": inflight, "failed": failed, "gone": gone}
        if done is not None:
            rec["done"] = done
        if ARGS.log_bodies:
            rec.update(body=body, answer=answer)
        with LOCK:
            with open(ARGS.log, "a") as f:
                f.write(json.dumps(rec) + "\n")


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--first-ms", type=float, default=150)
    ap.add_argument("--itl-ms", type=float, default=30)
    ap.add_argument("--log", required=True)
    ap.add_argument("--model-id", default="fake")
    ap.add_argument("--fail-every", type=int, default=0)
    ap.add_argument("--no-usage", action="store_true")
    ap.add_argument("--log-bodies", action="store_true")
    ap.add_argument("--metrics", action="store_true")
    ARGS = ap.parse_args()
    socketserver.TCPServer.request_queue_size = 1024
    ThreadingHTTPServer.daemon_threads = True
    srv = ThreadingHTTPServer(("127.0.0.1", ARGS.port), Handler)
    print("port %d" % srv.server_address[1], flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
