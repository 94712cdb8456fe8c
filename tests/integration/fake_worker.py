#!/usr/bin/env python3
"""TEST FIXTURE ONLY — a fake SGLang-style worker for pdserve-router's integration tests.

It is not a product and computes nothing: it speaks just enough of the SGLang/OpenAI HTTP surface
(/health, /get_load, /v1/models, /generate, /v1/completions, /v1/chat/completions with SSE,
/abort_request) for the router to route to it before the real pdserve-prefill/-decode daemons
exist, and it records what it saw so tests can check the router's behaviour:
  GET  /_fake/log     -> {"requests": [{path, body, headers}], "aborts": [rid], "sent": {rid: text}}
  POST /_fake/config  -> merge settings: health (status of /health), load, fail (HTTP status for
                         generation requests, 0 = none), hang (wait until aborted/unhung),
                         tokens, token_delay_ms, prefill_delay_ms, pad (bytes of filler per
                         streamed event, to make a stream large), cut_after (a stream sends
                         that many events, then half of the next and breaks the connection; -1
                         none)
With --api-key KEY it requires "Authorization: Bearer KEY" as an SGLang worker started with
--api-key does (not on /health or /_fake/*): others get 401 and their path is listed in the log's
"unauthorized"; "load_polls" counts the /get_load calls it answered.
Usage: fake_worker.py --role prefill|decode [--port N] [--api-key KEY]; prints "PORT <n>" on
stdout when ready.
"""
import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
COND = threading.Condition(LOCK)
STATE = {"requests": [], "aborts": [], "sent": {}, "unauthorized": [], "load_polls": 0}
CONFIG = {"health": 200, "load": 0, "fail": 0, "hang": False, "tokens": 5,
          "token_delay_ms": 10, "prefill_delay_ms": 0, "pad": 0, "cut_after": -1}
ROLE = "decode"
API_KEY = None


def rid_of(body):
    rid = body.get("rid") if isinstance(body, dict) else None
    return rid if isinstance(rid, str) else json.dumps(rid)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet
        pass

    def reply(self, status, body, ctype="application/json"):
        data = body if isinstance(body, bytes) else body.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def authorized(self):
        """False (after a 401) when --api-key is set and the request does not carry it."""
        if API_KEY is None or self.path == "/health" or self.path.startswith("/_fake/"):
            return True
        if self.headers.get("Authorization") == "Bearer " + API_KEY:
            return True
        with LOCK:
            STATE["unauthorized"].append(self.path)
        self.reply(401, b'{"error":"invalid api key"}')
        return False

    def do_GET(self):
        if not self.authorized():
            return
        if self.path == "/health":
            with LOCK:
                st = CONFIG["health"]
            self.reply(st, b"" if st == 200 else b'{"error":"unhealthy"}')
        elif self.path == "/get_load":
            with LOCK:
                STATE["load_polls"] += 1
                self.reply(200, json.dumps({"load": CONFIG["load"]}))
        elif self.path == "/v1/models":
            self.reply(200, json.dumps({"object": "list", "data": [{
                "id": "fake-model", "object": "model", "created": 0, "owned_by": "sglang",
                "root": "fake-model", "max_model_len": 4096}]}))
        elif self.path == "/_fake/log":
            with LOCK:
                self.reply(200, json.dumps(STATE))
        else:
            self.reply(404, b'{"error":"not found"}')

    def read_body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def do_POST(self):
        raw = self.read_body()
        if not self.authorized():
            return
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            self.reply(400, b'{"error":"bad json"}')
            return
        if self.path == "/_fake/config":
            with COND:
                CONFIG.update(body)
                COND.notify_all()
            self.reply(200, b"{}")
            return
        if self.path == "/abort_request":
            with COND:
                STATE["aborts"].append(body.get("rid"))
                COND.notify_all()
            self.reply(200, b"{}")
            return
        if self.path not in ("/generate", "/v1/completions", "/v1/chat/completions"):
            self.reply(404, b'{"error":"not found"}')
            return
        rid = rid_of(body)
        with COND:
            STATE["requests"].append({"path": self.path, "body": body,
                                      "auth": self.headers.get("Authorization")})
            cfg = dict(CONFIG)
            # hang until released (config) or aborted (or 30 s, so nothing waits forever)
            deadline = time.time() + 30
            while CONFIG["hang"] and rid not in STATE["aborts"] and time.time() < deadline:
                COND.wait(0.05)
            aborted = rid in STATE["aborts"]
            cfg = dict(CONFIG)
        if aborted:
            self.reply(200, json.dumps({"text": "", "meta_info": {
                "id": rid, "finish_reason": {"type": "abort"}}}))
            return
        if ROLE == "prefill":
            time.sleep(cfg["prefill_delay_ms"] / 1000.0)
        if cfg["fail"]:
            self.reply(cfg["fail"], json.dumps({"error": {"message": "fake %s failure" % ROLE,
                                                          "type": "server_error", "param": None,
                                                          "code": cfg["fail"]}}))
            return
        if ROLE == "prefill":
            self.reply(200, json.dumps({"text": "", "meta_info": {"id": rid}}))
            return
        self.decode_answer(body, rid, cfg)

    def decode_answer(self, body, rid, cfg):
        chat = self.path == "/v1/chat/completions"
        words = ["tok%d" % i for i in range(cfg["tokens"])]
        if not body.get("stream"):
            if chat:
                out = {"id": "chatcmpl-" + rid, "object": "chat.completion", "created": 0,
                       "model": "fake-model", "choices": [{"index": 0, "message": {
                           "role": "assistant", "content": " ".join(words)},
                           "finish_reason": "length"}]}
            else:
                out = {"text": " ".join(words), "meta_info": {"id": rid, "room": body.get(
                    "bootstrap_room"), "finish_reason": {"type": "length"}}}
            text = json.dumps(out)
            with LOCK:
                STATE["sent"][rid] = text
            self.reply(200, text)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        sent = []
        cut = False
        try:
            for i in range(len(words)):
                with LOCK:
                    if rid in STATE["aborts"]:
                        break
                if chat:
                    ev = {"id": "chatcmpl-" + rid, "object": "chat.completion.chunk",
                          "choices": [{"index": 0, "delta": {"content": words[i] + " "},
                                       "finish_reason": None}]}
                else:
                    ev = {"text": " ".join(words[:i + 1]), "meta_info": {"id": rid}}
                if cfg["pad"]:
                    ev["pad"] = "x" * cfg["pad"]
                chunk = "data: " + json.dumps(ev) + "\n\n"
                if i == cfg["cut_after"]:  # half an event, then the connection breaks
                    half = chunk[:len(chunk) // 2].encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(half), half))
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    sent.append("<cut>")
                    cut = True
                    break
                sent.append(chunk)
                data = chunk.encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
                time.sleep(cfg["token_delay_ms"] / 1000.0)
            if not cut:
                sent.append("data: [DONE]\n\n")
                data = sent[-1].encode()
                self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            sent.append("<client closed>")
        with LOCK:
            STATE["sent"][rid] = "".join(sent)


class Server(ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # the router closing a connection mid-answer is part of the tests


def main():
    global ROLE, API_KEY
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", choices=["prefill", "decode"], required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--api-key", default=None)
    a = ap.parse_args()
    ROLE = a.role
    API_KEY = a.api_key
    srv = Server(("127.0.0.1", a.port), Handler)
    print("PORT %d" % srv.server_address[1], flush=True)
    try:
        srv.serve_forever(poll_interval=0.05)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
