#!/usr/bin/env python3
"""test_tp_hetero.py — a prefill and a decode of different tensor parallelism (--tp-size) behind
the router, on the cpu backend, with the tiny random models of pdserve-mkmodel. The prefill
regroups the kv heads of every KV page into the decode's ranks (common/xfer.h). What a user would
notice:

  * a model of 4 kv heads (tp 1, 2 and 4 all divide them): every one of the nine pairs prefill
    tp 1/2/4 x decode tp 1/2/4 serves 16 concurrent greedy /generate requests with the output ids
    (so the text) of pdserve-generate --tp-size 1 on the same prompts, and afterwards both KV
    pools are full again;
  * a model of 2 kv heads, replicated over 2 ranks each at tp 4: prefill 1 -> decode 4,
    prefill 4 -> decode 1 and prefill 4 -> decode 2 do the same;
  * a decode of a model with another head_dim is refused at pairing with an error naming
    head_dim (with both values), gives its pages back and keeps serving (/health).

Daemons are started once per model and tp, and a router per pair: each decode pairs with several
prefills of other tp in turn. Stdlib only. Usage: test_tp_hetero.py BUILD_DIR.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pd_cluster as pc  # noqa: E402

BUILD = os.path.abspath(sys.argv[1])
check, step = pc.check, pc.step

# 1..70 tokens: one token, under a page, several pages, more than one 64-token chunk
BASE = [[7], [1, 2, 3, 4, 5], [(i * 37 + 11) % 1000 for i in range(17)],
        [(i * 101 + 3) % 1000 for i in range(40)], [(i * 53 + 29) % 1000 for i in range(70)],
        [(i * 7 + 5) % 1000 for i in range(33)], [(i * 11 + 1) % 1000 for i in range(9)],
        [(i * 13 + 2) % 1000 for i in range(24)]]
PROMPTS = [BASE[i % len(BASE)] if i < len(BASE) else BASE[i % len(BASE)][1:] + [i]
           for i in range(16)]
MAX_NEW = 12
LENS = [MAX_NEW - (i % 3) * 3 for i in range(16)]  # requests end at different steps


def daemons(role, model, tps, tmp):
    """One daemon of role per tp in tps, all up at once: {tp: Daemon}."""
    out = {}
    for tp in tps:
        out[tp] = pc.Daemon(BUILD, role, model, tmp, ["--tp-size", str(tp)])
        check(out[tp].server_info().get("tp_size") == tp, "%s tp %d /server_info" % (role, tp))
    return out


def serve_pairs(what, model, pairs, tmp):
    """Every (prefill tp, decode tp) in pairs through its own router: tp 1's ids, pools full."""
    ref = pc.generate_ids(BUILD, model, PROMPTS, MAX_NEW, ["--tp-size", "1"],
                          "%s: generate tp 1" % what)
    pfs = daemons("prefill", model, sorted({p for p, _ in pairs}), tmp)
    dcs = daemons("decode", model, sorted({d for _, d in pairs}), tmp)
    try:
        for ptp, dtp in pairs:
            step("%s: prefill --tp-size %d -> decode --tp-size %d" % (what, ptp, dtp))
            pf, dc = pfs[ptp], dcs[dtp]
            rt = pc.Router(BUILD, [(pf.port, pf.bport)], [dc.port], tmp, pc.PD_PATH_ONLY)
            try:
                got = pc.concurrent_generate(rt.port, PROMPTS, LENS,
                                             "%s pd %d->%d" % (what, ptp, dtp))
                for i, ids in enumerate(got):
                    want = ref[i][:LENS[i]] if ref else None
                    check(ids is None or ids == want, "%s pd %d->%d request %d: ids %r != tp 1's "
                          "%r" % (what, ptp, dtp, i, ids, want))
                check(pf.pool_full() and dc.pool_full(),
                      "%s pd %d->%d: pools full after the requests" % (what, ptp, dtp))
            finally:
                rt.kill()
    finally:
        for d in list(pfs.values()) + list(dcs.values()):
            d.kill()


def refusal(model, tmp):
    step("decode of another head_dim: refused at pairing naming head_dim, keeps serving")
    other = pc.make_model(BUILD, tmp, ["--family", "llama2", "--heads", "8", "--kv-heads", "4"],
                          "head_dim8")
    pf = pc.Daemon(BUILD, "prefill", model, tmp, ["--tp-size", "2"])
    dc = pc.Daemon(BUILD, "decode", other, tmp)
    rt = pc.Router(BUILD, [(pf.port, pf.bport)], [dc.port], tmp, pc.PD_PATH_ONLY)
    try:
        body = {"input_ids": [1, 2, 3, 4, 5], "sampling_params": {"max_new_tokens": 4}}
        st, raw = pc.http_call(rt.port, "POST", "/generate", body, 60)
        raw = raw.decode(errors="replace")
        check(st >= 400 and "layout mismatch: head_dim: prefill 16, decode 8" in raw,
              "other head_dim: %d %r (want an error naming head_dim)" % (st, raw[:400]))
        check(dc.pool_full(), "other head_dim: decode pool full after the refusal")
        st, _ = dc.get("/health", 10)
        check(st == 200, "other head_dim: decode still serving after the refusal")
    finally:
        for p in (rt, dc, pf):
            p.kill()


def main():
    tmp = pc.tmpdir()

    def cases():
        # 4 query heads, 4 kv heads: tp 1, 2 and 4 split the kv heads
        mha = pc.make_model(BUILD, tmp, ["--family", "llama2"], "kv4")
        serve_pairs("kv 4", mha, [(p, d) for p in (1, 2, 4) for d in (1, 2, 4)], tmp)
        # 2 kv heads: tp 4 replicates each on 2 ranks
        gqa = pc.make_model(BUILD, tmp, ["--family", "llama"], "kv2")
        serve_pairs("kv 2", gqa, [(1, 4), (4, 1), (4, 2)], tmp)
        refusal(mha, tmp)

    pc.run_test("tp_hetero", cases, tmp)


if __name__ == "__main__":
    main()
