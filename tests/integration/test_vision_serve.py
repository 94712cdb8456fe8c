#!/usr/bin/env python3
"""test_vision_serve.py — images through the daemons (issue 18), with pdserve-mkmodel's tiny
qwen2_vl model and PNG images this test draws itself (stdlib zlib), --chunked-prefill-size 64 so
the prefill cuts through every image's tokens:

  * colocated (pdserve-decode --disaggregation-mode null), then prefill + decode + router (PD):
    a chat with one image and a chat with two equal pdserve-generate --image on the prompt the
    chat template renders (pdserve-tokenize --chat), greedy, token for token, and so do both
    choices of n = 2 (the fan-out path); SGLang's /generate with image_data (data: URL and raw
    base64) likewise;
  * the encoder runs once per image per request however many chunks cut it, and not again for
    the same image in a prompt with another prefix (pdserve_mm_embedding_cache_hits_total); in
    PD it runs on the prefill, never on the decode;
  * bad input: broken base64, a truncated PNG, a 1x1 image, a 20000x20000 one (refused from its
    header), too many images, a remote URL, an image for a text-only model: each a 400 naming
    the problem, and the daemon still answers;
  * a colocated pool too small for six image chats: retracted and recomputed (crossing the
    prompt's end), outputs unchanged; a decode without bootstrap fields refuses images;
  * 1,000 distinct images through a colocated daemon with a 1 MB embedding cache: its bytes stay
    within the bound; every pool is full after.

  * --allow-image-urls: an http URL is fetched and equals the same file; larger than
    --image-url-max-bytes, slower than --image-url-timeout, a 404: 400s naming each; without
    the flag a remote URL is a 400 that names it.

Usage: test_vision_serve.py BUILD_DIR CASE (coloc | pd | bad | urls | load).
"""
import base64
import json
import os
import struct
import subprocess
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pd_cluster as pc  # noqa: E402
from pd_cluster import check, step  # noqa: E402

BUILD = os.path.abspath(sys.argv[1])
CASE = sys.argv[2]
NEW = 12
CHUNK = ["--chunked-prefill-size", "64"]


def png(w, h, seed, truncate=None, claim=None):
    """An RGB8 PNG of w x h pixels (a pattern from seed); claim: (W, H) written in the header
    instead; truncate: the file cut to that many bytes."""
    rows = []
    x = seed * 2654435761 & 0xFFFFFFFF
    for y in range(h):
        row = bytearray([0])
        for i in range(w):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
            row += bytes(((i * 7 + y * 3 + seed) & 255, (x >> 16) & 255, (i * y + seed * 5) & 255))
        rows.append(bytes(row))

    def chunk(kind, data):
        c = kind + data
        return struct.pack(">I", len(data)) + c + struct.pack(">I", zlib.crc32(c) & 0xFFFFFFFF)

    cw, ch = claim or (w, h)
    data = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", cw, ch, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(b"".join(rows))) + chunk(b"IEND", b""))
    return data[:truncate] if truncate else data


def data_url(b):
    return "data:image/png;base64," + base64.b64encode(b).decode()


def write(tmp, name, b):
    path = os.path.join(tmp, name)
    with open(path, "wb") as f:
        f.write(b)
    return path


def metric(d, name):
    st, raw = d.get("/metrics")
    for ln in raw.decode().splitlines():
        if ln.startswith(name + "{") or ln.startswith(name + " "):
            return float(ln.split()[-1])
    return None


def chat_body(model_id, parts, system=None):
    msgs = [{"role": "system", "content": system}] if system else []
    return {"model": model_id, "messages": msgs + [{"role": "user", "content": parts}],
            "max_tokens": NEW, "temperature": 0}


def chat_ref(model, srv, tmp, parts, files, system=None):
    """pdserve-generate's greedy text for the chat's rendered prompt with these image files."""
    tmpl_parts = [{"type": "image"} if p["type"] == "image_url" else p for p in parts]
    msgs = ([{"role": "system", "content": system}] if system else []) + \
        [{"role": "user", "content": tmpl_parts}]
    ids = pc.chat_prompt_ids(BUILD, model, srv, msgs, tmp)
    return pc.generate(BUILD, model, ids, NEW, ["--image", ",".join(files), "--ignore-eos"])


def serve_checks(front, encoder, others, model, tmp, what):
    """Chats and /generate through front; encoder is the daemon that runs the vision encoder."""
    model_id = json.loads(front.get("/v1/models")[1])["data"][0]["id"]
    a, b = png(280, 252, 1), png(130, 200, 2)  # 90 and 35 image tokens: chunks of 64 cut them
    fa, fb = write(tmp, "a.png", a), write(tmp, "b.png", b)
    one = [{"type": "image_url", "image_url": {"url": data_url(a)}},
           {"type": "text", "text": "What is in the picture?"}]
    two = [{"type": "text", "text": "Compare"}, {"type": "image_url", "image_url": {"url":
                                                                                    data_url(a)}},
           {"type": "text", "text": "with"}, {"type": "image_url", "image_url": {"url":
                                                                                 data_url(b)}}]
    runs0 = metric(encoder, "pdserve_mm_encoder_runs_total")
    for parts, files, name in ((one, [fa], "one image"), (two, [fa, fb], "two images")):
        ref = chat_ref(model, front if front is encoder else encoder, tmp, parts, files)
        st, raw = front.post("/v1/chat/completions", chat_body(model_id, parts))
        if check(st == 200, "%s %s: HTTP %d %r" % (what, name, st, raw[:300])):
            got = json.loads(raw)["choices"][0]["message"]["content"]
            check(got == ref, "%s %s: %r != pdserve-generate %r" % (what, name, got, ref))
            step("%s %s: %r" % (what, name, got))
    # n = 2 (the fan-out path: each sub-request loads its images itself): both choices equal
    body = chat_body(model_id, one)
    body["n"] = 2
    ref1 = chat_ref(model, front if front is encoder else encoder, tmp, one, [fa])
    st, raw = front.post("/v1/chat/completions", body)
    if check(st == 200, "%s n=2: HTTP %d %r" % (what, st, raw[:300])):
        got = [c["message"]["content"] for c in json.loads(raw)["choices"]]
        check(got == [ref1, ref1], "%s n=2: %r != 2 x %r" % (what, got, ref1))
    runs = metric(encoder, "pdserve_mm_encoder_runs_total") - runs0
    # image a in the first chat, then a again (a new request, but the prefix cache holds the
    # first chat's image pages only up to its text) and b: a comes from the embedding cache
    step("%s: encoder runs %s, embedding cache hits %s" %
         (what, runs, metric(encoder, "pdserve_mm_embedding_cache_hits_total")))
    check(runs == 2, "%s: the encoder ran %s times for images a, a again, b (want 2)" % (what, runs))
    check(metric(encoder, "pdserve_mm_embedding_cache_hits_total") >= 1,
          "%s: the repeated image came from the embedding cache" % what)
    for d in others:
        check(metric(d, "pdserve_mm_encoder_runs_total") == 0,
              "%s: the %s daemon ran no encoder" % (what, d.role))
    # the same image after another system prompt: no prefix in common, the embeddings cached
    hits0 = metric(encoder, "pdserve_mm_embedding_cache_hits_total")
    ref = chat_ref(model, encoder, tmp, one, [fa], system="Be brief.")
    st, raw = front.post("/v1/chat/completions", chat_body(model_id, one, system="Be brief."))
    if check(st == 200, "%s other prefix: HTTP %d" % (what, st)):
        check(json.loads(raw)["choices"][0]["message"]["content"] == ref,
              "%s other prefix: equals pdserve-generate" % what)
    check(metric(encoder, "pdserve_mm_encoder_runs_total") - runs0 == 2 and
          metric(encoder, "pdserve_mm_embedding_cache_hits_total") == hits0 + 1,
          "%s: a known image after another prefix is a cache hit, not an encoder run" % what)
    # /generate with image_data: a data: URL, then raw base64; the text carries the placeholder
    text = "<|vision_start|><|image_pad|><|vision_end|>Describe it."
    ref = pc.generate(BUILD, model, text, NEW, ["--image", fb, "--ignore-eos"])
    for img in (data_url(b), base64.b64encode(b).decode()):
        body = {"text": text, "image_data": img, "sampling_params": {
            "max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}}
        st, raw = front.post("/generate", body)
        if check(st == 200, "%s /generate: HTTP %d %r" % (what, st, raw[:300])):
            check(json.loads(raw)["text"] == ref, "%s /generate image_data: %r != %r" %
                  (what, json.loads(raw)["text"], ref))


def case_coloc(tmp):
    model = pc.make_model(BUILD, tmp, ["--family", "qwen2_vl"])
    d = pc.Coloc(BUILD, model, tmp, CHUNK)
    step("colocated: chats with images equal pdserve-generate --image")
    serve_checks(d, d, [], model, tmp, "colocated")
    check(d.pool_full(), "colocated pool full after")


def case_pd(tmp):
    model = pc.make_model(BUILD, tmp, ["--family", "qwen2_5_vl"])
    pf = pc.Daemon(BUILD, "prefill", model, tmp)
    dc = pc.Daemon(BUILD, "decode", model, tmp)
    rt = pc.Router(BUILD, [(pf.port, pf.bport)], [dc.port], tmp, pc.PD_PATH_ONLY)
    step("prefill + decode + router: chats with images equal pdserve-generate --image")
    serve_checks(rt, pf, [dc], model, tmp, "PD")
    # the decode alone (no bootstrap fields: a local prefill) cannot encode: a 400 saying so
    model_id = json.loads(dc.get("/v1/models")[1])["data"][0]["id"]
    st, raw = dc.post("/v1/chat/completions", chat_body(model_id, [
        {"type": "image_url", "image_url": {"url": data_url(png(60, 60, 9))}},
        {"type": "text", "text": "hi"}]))
    check(st == 400 and b"prefill daemon" in raw, "decode alone with an image: %d %r" %
          (st, raw[:200]))
    # broken after its header: the decode places it from the header, the prefill refuses it
    model_id = json.loads(rt.get("/v1/models")[1])["data"][0]["id"]
    st, raw = rt.post("/v1/chat/completions", chat_body(model_id, [
        {"type": "image_url", "image_url": {"url": data_url(png(60, 60, 10, truncate=150))}},
        {"type": "text", "text": "hi"}]))
    check(st == 400 and b"truncated" in raw, "PD, truncated PNG: %d %r" % (st, raw[:200]))
    for d in (pf, dc):
        check(d.pool_full(), "%s pool full after" % d.role)


def case_bad(tmp):
    model = pc.make_model(BUILD, tmp, ["--family", "qwen2_vl"])
    d = pc.Coloc(BUILD, model, tmp, CHUNK + ["--limit-mm-per-prompt", "3"])
    model_id = json.loads(d.get("/v1/models")[1])["data"][0]["id"]
    good = png(60, 60, 3)

    def with_urls(urls):
        return chat_body(model_id, [{"type": "image_url", "image_url": {"url": u}} for u in urls] +
                         [{"type": "text", "text": "hi"}])

    cases = [
        ("broken base64", with_urls(["data:image/png;base64,iVBO%%%%"]), "base64"),
        ("truncated PNG", with_urls([data_url(png(60, 60, 4, truncate=120))]), "truncated"),
        ("1x1 image", with_urls([data_url(png(1, 1, 5))]), "too small"),
        ("20000x20000 image", with_urls([data_url(png(8, 8, 6, claim=(20000, 20000)))]),
         "20000"),
        ("too many images", with_urls([data_url(good)] * 4), "too many images"),
        ("a remote URL", with_urls(["https://example.com/cat.png"]), "not fetched"),
        ("not an image", with_urls([data_url(b"hello, world")]), "image 0"),
    ]
    for name, body, want in cases:
        st, raw = d.post("/v1/chat/completions", body)
        msg = json.loads(raw)["error"]["message"] if st == 400 else raw[:200]
        check(st == 400 and want in msg, "%s: want a 400 saying %r, got %d %r" %
              (name, want, st, msg))
    st, raw = d.post("/v1/chat/completions", with_urls([data_url(good)]))
    check(st == 200, "after the bad ones a good image is served: %d %r" % (st, raw[:200]))
    check(d.pool_full(), "pool full after the bad inputs")
    # an image for a text-only model
    text_model = pc.make_model(BUILD, tmp, [], name="text")
    t = pc.Coloc(BUILD, text_model, tmp, CHUNK)
    tid = json.loads(t.get("/v1/models")[1])["data"][0]["id"]
    body = chat_body(tid, [{"type": "image_url", "image_url": {"url": data_url(good)}},
                           {"type": "text", "text": "hi"}])
    st, raw = t.post("/v1/chat/completions", body)
    check(st == 400 and b"takes no images" in raw, "text-only model: %d %r" % (st, raw[:200]))
    st, raw = t.post("/v1/chat/completions", chat_body(tid, "hi"))
    check(st == 200, "the text-only daemon still answers: %d" % st)


def case_urls(tmp):
    """--allow-image-urls: an http image URL is fetched (equal to the same image as a file);
    too large, too slow, a 404: 400s naming the limit or the status; a fetch waiting on its
    server (2 s) does not hold the loop; without the flag a 400."""
    import http.server
    import threading
    import time
    a, big = png(200, 140, 7), png(300, 300, 8)
    fa = write(tmp, "url_a.png", a)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            if self.path == "/slow.png":
                time.sleep(4)
            body = {"/a.png": a, "/slow.png": a, "/big.png": big}.get(self.path)
            self.send_response(200 if body else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    base = "http://127.0.0.1:%d" % srv.server_address[1]
    model = pc.make_model(BUILD, tmp, ["--family", "qwen2_vl"])
    d = pc.Coloc(BUILD, model, tmp, CHUNK + ["--allow-image-urls", "--image-url-max-bytes",
                                             str(len(a) + 1000), "--image-url-timeout", "2"])
    model_id = json.loads(d.get("/v1/models")[1])["data"][0]["id"]

    def parts(url):
        return [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "?"}]

    step("an http image URL fetched, equal to the same file")
    ref = chat_ref(model, d, tmp, parts(base + "/a.png"), [fa])
    st, raw = d.post("/v1/chat/completions", chat_body(model_id, parts(base + "/a.png")))
    if check(st == 200, "fetched image: HTTP %d %r" % (st, raw[:300])):
        got = json.loads(raw)["choices"][0]["message"]["content"]
        check(got == ref, "fetched image: %r != pdserve-generate %r" % (got, ref))
    for path, want in (("/big.png", "larger than --image-url-max-bytes"),
                       ("/slow.png", "took longer than --image-url-timeout"),
                       ("/missing.png", "HTTP 404")):
        t0 = time.time()
        st, raw = d.post("/v1/chat/completions", chat_body(model_id, parts(base + path)))
        msg = json.loads(raw)["error"]["message"] if st == 400 else raw[:200]
        check(st == 400 and want in msg, "%s: want a 400 saying %r, got %d %r" %
              (path, want, st, msg))
        check(time.time() - t0 < 3.5, "%s answered within the timeout's reach" % path)
    st, _ = d.post("/v1/chat/completions", chat_body(model_id, parts(base + "/a.png")))
    check(st == 200, "still serving after the failed fetches: %d" % st)
    # a fetch waiting on its server holds a worker, not the loop: a text chat is answered
    slow = threading.Thread(target=lambda: d.post("/v1/chat/completions",
                                                  chat_body(model_id, parts(base + "/slow.png"))))
    slow.start()
    time.sleep(0.2)
    t0 = time.time()
    st, _ = d.post("/v1/chat/completions", chat_body(model_id, "hello"))
    took = time.time() - t0
    slow.join()
    check(st == 200 and took < 1.2, "a text chat during a slow image fetch (2 s): %d in %.2f s" %
          (st, took))
    check(d.pool_full(), "pool full after")
    plain = pc.Coloc(BUILD, model, tmp, CHUNK)
    st, raw = plain.post("/v1/chat/completions", chat_body(model_id, parts(base + "/a.png")))
    check(st == 400 and b"--allow-image-urls" in raw, "without the flag: %d %r" % (st, raw[:200]))
    srv.shutdown()


def case_retract(tmp):
    """A colocated pool too small for six image chats at once, admitted without an output
    reservation (--schedule-conservativeness 0.01): requests are retracted and recomputed
    (their image tokens from the embedding cache, the rest by index + delta), outputs
    unchanged."""
    model = pc.make_model(BUILD, tmp, ["--family", "qwen2_vl"])
    d = pc.Coloc(BUILD, model, tmp, CHUNK + ["--max-total-tokens", "448",
                                             "--schedule-conservativeness", "0.01"])
    model_id = json.loads(d.get("/v1/models")[1])["data"][0]["id"]
    jobs = []
    for i in range(6):
        b = png(140 + 28 * (i % 3), 112, 20 + i)
        f = write(tmp, "r%d.png" % i, b)
        parts = [{"type": "image_url", "image_url": {"url": data_url(b)}},
                 {"type": "text", "text": "tell me about picture %d" % i}]
        body = chat_body(model_id, parts)
        body["max_tokens"] = 40
        body["ignore_eos"] = True
        tmpl = [{"type": "image"}, parts[1]]
        ids = pc.chat_prompt_ids(BUILD, model, d, [{"role": "user", "content": tmpl}], tmp)
        ref = pc.generate(BUILD, model, ids, 40, ["--image", f, "--ignore-eos"])
        jobs.append((body, ref))
    for rnd in range(3):  # rounds until the timing gave a retraction (the first one does here)
        step("round %d: six image chats at once in a pool of 448 tokens" % rnd)
        res = pc.concurrent(lambda i: d.post("/v1/chat/completions", jobs[i][0]), len(jobs))
        for i, r in enumerate(res):
            if check(r and r[0] == 200, "chat %d: %r" % (i, r and r[1][:200])):
                got = json.loads(r[1])["choices"][0]["message"]["content"]
                check(got == jobs[i][1], "chat %d: %r != pdserve-generate %r" %
                      (i, got, jobs[i][1]))
        if d.server_info()["queues"]["retractions"] > 0:
            break
    retr = d.server_info()["queues"]["retractions"]
    step("retractions %d" % retr)
    check(retr > 0, "requests were retracted")
    check(d.pool_full(), "pool full after")


def case_load(tmp):
    model = pc.make_model(BUILD, tmp, ["--family", "qwen2_vl"])
    d = pc.Coloc(BUILD, model, tmp, CHUNK + ["--mm-embedding-cache-mb", "1"])
    text = "<|vision_start|><|image_pad|><|vision_end|>x"
    worst = 0
    step("1000 distinct images, a 1 MB embedding cache")

    def one(i):
        body = {"text": text, "image_data": data_url(png(56 + (i % 3) * 28, 84, 100 + i)),
                "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
        return d.post("/generate", body, timeout=120)

    for base in range(0, 1000, 50):
        res = pc.concurrent(lambda j: one(base + j), 50)
        bad = [r for r in res if not r or r[0] != 200]
        check(not bad, "images %d..%d: %r" % (base, base + 49, bad[:2]))
        worst = max(worst, metric(d, "pdserve_mm_embedding_cache_bytes"))
    runs = metric(d, "pdserve_mm_encoder_runs_total")
    step("encoder runs %d, cache bytes at most %d (bound 1000000), entries %d" %
         (runs, worst, metric(d, "pdserve_mm_embedding_cache_entries")))
    check(runs == 1000, "every distinct image encoded once: %s" % runs)
    check(worst <= 1000000, "the cache stayed within 1 MB: %d bytes" % worst)
    check(d.pool_full(), "pool full after")


def main():
    tmp = pc.tmpdir()
    body = {"coloc": case_coloc, "pd": case_pd, "bad": case_bad, "urls": case_urls,
            "retract": case_retract, "load": case_load}[CASE]
    pc.run_test("test_vision_serve %s" % CASE, lambda: body(tmp), tmp)


if __name__ == "__main__":
    main()
