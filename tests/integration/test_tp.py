#!/usr/bin/env python3
"""test_tp.py — tensor parallelism (--tp-size) on the cpu backend, end to end, with the tiny
models of pdserve-mkmodel (4 query heads, 2 kv heads: tp 2 splits the kv heads, tp 4 replicates
each on 2 ranks). What a user would notice:

  * pdserve-generate --tp-size 2 and 4 give tp 1's greedy token ids (ids, not only text) for a
    Llama and a Qwen2 (q/k/v bias, tied embeddings) model, prompts of 1..70 tokens prefilled in
    chunks of 32, 24 new tokens each. The all-reduce changes only the float summation order;
    these models' greedy margins are wide enough that no token flips (a flip fails the test).
  * --tp-size 3 is refused at start with a message naming the tp size and the kv heads.
  * pdserve-decode --disaggregation-mode null --tp-size 2 serves 8 concurrent /generate requests
    with tp 1's ids and text, /server_info says tp_size 2, the pool is full again afterwards,
    /health_generate answers, SIGTERM exits 0.
  * pdserve-prefill --tp-size 2 and pdserve-decode --tp-size 2 behind the router (each rank's
    pool is one shard of the transferred page) serve 8 concurrent /generate requests with tp 1's
    ids; both pools are full again afterwards; so does a tp 2 prefill with a tp 1 decode (the
    prefill regroups the kv heads into the decode's one rank; test_tp_hetero.py has every pair).
    Every binary's --help documents --tp-size.

Stdlib only. Usage: test_tp.py BUILD_DIR. Every process is killed (by PID) on exit.
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pd_cluster as pc  # noqa: E402

BUILD = os.path.abspath(sys.argv[1])
GENERATE = os.path.join(BUILD, "tools", "pdserve-generate")
check, step = pc.check, pc.step

# 1..70 tokens: one token, under a page, several pages, more than one 32-token chunk
PROMPTS = [[7], [1, 2, 3, 4, 5], [(i * 37 + 11) % 1000 for i in range(17)],
           [(i * 101 + 3) % 1000 for i in range(40)], [(i * 53 + 29) % 1000 for i in range(70)]]
MAX_NEW = 24


def generate(model, tp, prompts=PROMPTS, max_new=MAX_NEW):
    """pdserve-generate's greedy ids for every prompt, at --tp-size tp."""
    return pc.generate_ids(BUILD, model, prompts, max_new, ["--tp-size", str(tp)],
                           "generate tp %d" % tp)


def generate_checks(tmp):
    for family in ("llama", "qwen2"):
        model = pc.make_model(BUILD, tmp, ["--family", family], family)
        ref = generate(model, 1)
        if ref is None:
            continue
        # the reference is not degenerate: answers differ and use many tokens
        check(len(set(map(tuple, ref))) == len(ref), "%s: tp 1 answers not distinct" % family)
        check(len({t for a in ref for t in a}) >= 20, "%s: tp 1 answers use few ids" % family)
        check(all(len(a) == MAX_NEW for a in ref), "%s: answer lengths %r" %
              (family, [len(a) for a in ref]))
        for tp in (2, 4):
            step("pdserve-generate %s --tp-size %d" % (family, tp))
            got = generate(model, tp)
            if got is None:
                continue
            for i, (g, w) in enumerate(zip(got, ref)):
                check(g == w, "%s tp %d prompt %d (%d tokens): %r != tp 1's %r" %
                      (family, tp, i, len(PROMPTS[i]), g, w))
    model = os.path.join(tmp, "llama")
    r = subprocess.run([GENERATE, "--model-path", model, "--tp-size", "3", "--no-tokenizer",
                        "--prompt-ids", "1 2"], capture_output=True, text=True, timeout=60)
    check(r.returncode != 0 and "--tp-size 3" in r.stderr and "2 kv heads" in r.stderr,
          "generate --tp-size 3 on 2 kv heads: rc %d %r" % (r.returncode, r.stderr))
    return model


def coloc_checks(tmp, model):
    step("pdserve-decode --disaggregation-mode null --tp-size 2")
    ref_ids = generate(model, 1, max_new=16)
    lens = [16 - (i % 3) * 4 for i in range(8)]  # 16, 12, 8, ...: requests end at other steps
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(8)]
    d = pc.Daemon(BUILD, "decode", model, tmp, ["--disaggregation-mode", "null", "--tp-size", "2",
                                                "--threads", "2"])
    try:
        info = d.server_info()
        check(info.get("tp_size") == 2, "/server_info tp_size %r" % info.get("tp_size"))
        got = pc.concurrent_generate(d.port, prompts, lens, "coloc tp 2")
        for i, ids in enumerate(got):
            want = ref_ids[i % len(PROMPTS)][:lens[i]] if ref_ids else None
            check(ids is None or ids == want, "coloc tp 2 request %d: ids %r != tp 1's %r" %
                  (i, ids, want))
        # the same text as tp 1's colocated daemon for one text prompt
        body = {"text": "the quick brown fox", "sampling_params": {"max_new_tokens": 12,
                                                                   "temperature": 0}}
        st, raw = d.post("/generate", body, 60)
        check(st == 200, "coloc tp 2 text prompt: %d %r" % (st, raw[:300]))
        text2 = json.loads(raw)["text"] if st == 200 else None
        check(d.pool_full(), "coloc tp 2: pool full after the requests")
        st, raw = d.get("/health_generate", 30)
        check(st == 200, "coloc tp 2 /health_generate: %d %r" % (st, raw[:200]))
        check(d.terminate() == 0, "coloc tp 2: SIGTERM exit code")
    except Exception:
        print(d.log_tail(), flush=True)
        raise
    finally:
        d.kill()
    d1 = pc.Daemon(BUILD, "decode", model, tmp, ["--disaggregation-mode", "null"])
    try:
        st, raw = d1.post("/generate", body, 60)
        check(st == 200 and json.loads(raw)["text"] == text2,
              "coloc text: tp 2 %r, tp 1 %r" % (text2, raw[:300]))
        check(d1.server_info().get("tp_size") == 1, "tp 1 /server_info tp_size")
    finally:
        d1.kill()


def disagg_checks(tmp, model):
    ref_ids = generate(model, 1, max_new=16)
    lens = [16 - (i % 3) * 4 for i in range(8)]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(8)]
    tp2 = ["--tp-size", "2", "--threads", "2"]

    def serves(what, decode_extra, decode_tp):
        """8 concurrent requests through the router: tp 1's ids, both pools full after."""
        with pc.cluster(BUILD, tmp, model, tp2, decode_extra, pc.PD_PATH_ONLY) as (pf, dc, rt):
            for d, tp in ((pf, 2), (dc, decode_tp)):
                check(d.server_info().get("tp_size") == tp, "%s /server_info tp_size" % d.role)
            got = pc.concurrent_generate(rt.port, prompts, lens, what)
            for i, ids in enumerate(got):
                want = ref_ids[i % len(PROMPTS)][:lens[i]] if ref_ids else None
                check(ids is None or ids == want,
                      "%s request %d: ids %r != tp 1's %r" % (what, i, ids, want))
            check(pf.pool_full() and dc.pool_full(), "%s: pools full after the requests" % what)

    step("pdserve-prefill --tp-size 2 + pdserve-decode --tp-size 2 through the router")
    serves("pd tp 2", tp2, 2)
    step("prefill --tp-size 2 with a decode --tp-size 1: pages regrouped into its one rank")
    serves("pd tp 2 -> 1", [], 1)
    pc.help_documents(BUILD, "--tp-size", ["ranks"])


def main():
    tmp = pc.tmpdir()

    def cases():
        model = generate_checks(tmp)
        disagg_checks(tmp, model)
        coloc_checks(tmp, model)

    pc.run_test("tp", cases, tmp)


if __name__ == "__main__":
    main()
