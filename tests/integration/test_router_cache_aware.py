#!/usr/bin/env python3
"""test_router_cache_aware.py — pdserve-router --policy cache_aware against real daemons on
127.0.0.1 (tiny model, two prefills, one decode, UCX shared memory).

  affinity   8 chats with distinct long system prompts, 4 turns each, interleaved (turn t of
             all 8 in a shuffled order, then turn t+1): every turn of a chat lands on the prefill that served its
             first turn — turn n >= 2 hits that prefill's prefix cache for at least the previous
             turn's prompt rounded down to whole pages (meta cached_tokens), each prefill's
             request count is a multiple of 4 with neither below 2 chats — and every answer is
             pdserve-generate's greedy text for the rendered chat. The same workload (fresh
             prompts) through a second router with --policy round_robin caches strictly fewer
             tokens in total (both totals printed). The router's cache_aware counters and
             /server_info settings are checked too; a third router evicting every 0.1 s keeps
             each prefill's part of the tree within --max-tree-size.
  imbalance  --policy power_of_two --prefill-policy cache_aware --decode-policy round_robin
             --balance-abs-threshold 2: a chat's first turn lands on prefill P, which is then
             SIGSTOPped; three follow-ups of that chat (matching P's tree) pile up on P; with
             the router's in-flight counts at 3 vs 0 (more than 2 apart, more than x1.5), three
             more follow-ups of the same chat, one at a time, go to the other prefill (decision
             "balance") and complete while P is stopped; after SIGCONT every request completes
             with 200.

Hard checks only. Stdlib only. Usage: test_router_cache_aware.py BUILD_DIR CASE.
"""
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pd_cluster as pc  # noqa: E402

BUILD = os.path.abspath(sys.argv[1])
CASE = sys.argv[2] if len(sys.argv) > 2 else "affinity"
MAX_NEW = 4
PAGE = 16
WORDS = ("river stone cloud lantern meadow copper violin harbor orchard falcon glacier "
         "thunder pepper saddle marble candle willow garnet canyon ember").split()
check, step = pc.check, pc.step


def router(prefills, dc, tmp, policy, extra=()):
    port = pc.free_port()
    args = [os.path.join(BUILD, "router", "pdserve-router"), "--pd-disaggregation",
            "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
            "--log-level", pc.log_level()]
    for pf in prefills:
        args += ["--prefill", "http://127.0.0.1:%d" % pf.port, str(pf.bport)]
    # the prefill policy's choices are the subject: every request takes the PD path
    args += ["--decode", "http://127.0.0.1:%d" % dc.port] + pc.PD_PATH_ONLY + list(extra)
    rt = pc.Proc("router-" + policy, args, port, tmp)
    ok = pc.wait_until(lambda: all(w["available"] for w in
                                   json.loads(rt.get("/workers")[1])["workers"]), 30)
    check(ok, "%s router: all three workers healthy" % policy)
    return rt


def metric(srv, name, **labels):
    """Sum of the series of name whose labels include the given ones."""
    st, raw = srv.get("/metrics")
    total = 0.0
    for line in raw.decode().splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        m = re.match(r'^([^{ ]+)(\{[^}]*\})? (\S+)$', line)
        if not m or m.group(1) != name:
            continue
        lab = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(lab.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
    return total


def system_prompt(rng, i, tag):
    # distinct from the first byte on: no two chats share a stem the tree could confuse
    words = " ".join(rng.choice(WORDS) for _ in range(40))
    return "%s%d-%s. You are helper %d. Remember: %s." % (chr(ord("A") + i), i, tag, i, words)


def chat_turn(rt, model_id, msgs):
    body = {"model": model_id, "messages": msgs, "max_tokens": MAX_NEW, "temperature": 0}
    st, raw = rt.post("/v1/chat/completions", body, timeout=120)
    if st != 200:
        raise RuntimeError("HTTP %d %r" % (st, raw[:300]))
    j = json.loads(raw)
    u = j["usage"]
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0
    return j["choices"][0]["message"]["content"], u["prompt_tokens"], cached


def reference(model, pf, msgs, tmp):
    ids = pc.chat_prompt_ids(BUILD, model, pf, msgs, tmp)
    return pc.generate(BUILD, model, ids, MAX_NEW), len(ids)


def run_chats(rt, model_id, n_chats, turns, tag, seed):
    """Turn t of every chat, one request at a time in a shuffled order (seeded), then turn t+1:
    interleaved, and deterministic — round_robin's cursor then lands a chat on either prefill
    from turn to turn, as arrivals out of step do in practice. Returns per chat
    [(msgs, text, prompt_tokens, cached_tokens)]."""
    rng = random.Random(seed)
    chats = [[{"role": "system", "content": system_prompt(rng, i, tag)}] for i in range(n_chats)]
    log = [[] for _ in range(n_chats)]
    for t in range(turns):
        order = list(range(n_chats))
        rng.shuffle(order)
        for i in order:
            chats[i].append({"role": "user", "content": "question %d of chat %d: %s?" %
                             (t + 1, i, " ".join(rng.choice(WORDS) for _ in range(6)))})
            text, prompt, cached = chat_turn(rt, model_id, list(chats[i]))
            log[i].append((list(chats[i]), text, prompt, cached))
            chats[i].append({"role": "assistant", "content": text})
    return log


def misplaced(log):
    """Turns >= 2 whose cached_tokens fall short of the previous prompt in whole pages."""
    return sum(1 for chat in log for t in range(1, len(chat))
               if chat[t][3] < chat[t - 1][2] // PAGE * PAGE)


def case_affinity(model, tmp):
    pfs = [pc.Daemon(BUILD, "prefill", model, tmp) for _ in range(2)]
    dc = pc.Daemon(BUILD, "decode", model, tmp)
    rt = router(pfs, dc, tmp, "cache_aware", ["--health-check-interval-secs", "0.25"])
    info = json.loads(rt.get("/server_info")[1])
    check(info["policy"] == "cache_aware" and info["cache_threshold"] == 0.3 and
          info["balance_abs_threshold"] == 64 and info["balance_rel_threshold"] == 1.5 and
          info["eviction_interval_secs"] == 60 and info["max_tree_size"] == 1 << 26,
          "/server_info shows cache_aware's settings (sglang-router's defaults): %s" %
          {k: info.get(k) for k in ("policy", "cache_threshold", "balance_abs_threshold",
                                    "balance_rel_threshold", "eviction_interval_secs",
                                    "max_tree_size")})
    model_id = json.loads(rt.get("/v1/models")[1])["data"][0]["id"]
    step("cache_aware: 8 chats x 4 turns")
    log = run_chats(rt, model_id, 8, 4, "ca", 7)
    total_ca = sum(c for chat in log for (_, _, _, c) in chat)
    for i, chat in enumerate(log):
        for t in range(1, len(chat)):
            prev = chat[t - 1][2]
            want = prev // PAGE * PAGE
            check(chat[t][3] >= want, "chat %d turn %d: cached_tokens %d < previous prompt %d "
                  "rounded down to pages (%d): not on the same prefill" %
                  (i, t + 1, chat[t][3], prev, want))
    # a prefill's request counter may move after the client already has its answer from the
    # decode (under load it lagged: [16, 15] once): wait for the counters to settle instead of
    # racing them
    pc.wait_until(lambda: sum(metric(pf, "sglang:num_requests_total") for pf in pfs) >= 32, 10,
                  0.05)
    counts = [metric(pf, "sglang:num_requests_total") for pf in pfs]
    step("cache_aware: prefill request counts %s, cached tokens in total %d" % (counts, total_ca))
    check(sum(counts) == 32, "32 prefill requests in all: %s" % counts)
    check(all(c % 4 == 0 and c >= 8 for c in counts),
          "each prefill served whole chats, at least 2 of 8: %s" % counts)
    hits = metric(rt, "sgl_router_cache_hits_total")
    misses = metric(rt, "sgl_router_cache_misses_total")
    dec = {d: metric(rt, "pdserve_router_cache_aware_decisions_total", decision=d)
           for d in ("match", "smallest", "balance")}
    check(dec["match"] == hits == 24 and dec["smallest"] == misses == 8 and dec["balance"] == 0,
          "decisions: turns 2-4 by match (24), first turns by smallest tree (8): %s hits %s "
          "misses %s" % (dec, hits, misses))
    sizes = [metric(rt, "sgl_router_tree_size", worker="http://127.0.0.1:%d" % pf.port)
             for pf in pfs]
    check(all(s > 0 for s in sizes), "both prefills hold a part of the tree: %s" % sizes)
    # greedy answers equal pdserve-generate's on the rendered chat
    bad = 0
    for i, chat in enumerate(log):
        for t, (msgs, text, prompt, _) in enumerate(chat):
            ref, n = reference(model, pfs[0], msgs, tmp)
            bad += not check(text == ref and prompt == n, "chat %d turn %d: %r (%d prompt tokens)"
                             " != reference %r (%d)" % (i, t + 1, text, prompt, ref, n))
    step("%d/32 answers equal pdserve-generate's" % (32 - bad))

    rr = router(pfs, dc, tmp, "round_robin", ["--health-check-interval-secs", "0.25"])
    step("round_robin: the same workload, fresh prompts")
    log_rr = run_chats(rr, model_id, 8, 4, "rr", 7)
    total_rr = sum(c for chat in log_rr for (_, _, _, c) in chat)
    step("cached tokens in total: cache_aware %d, round_robin %d; turns off their chat's "
         "prefill: cache_aware %d, round_robin %d of 24" % (total_ca, total_rr, misplaced(log),
                                                            misplaced(log_rr)))
    check(total_ca > total_rr, "cache_aware caches more than round_robin: %d vs %d" %
          (total_ca, total_rr))

    # eviction: every 0.1 s each prefill's part of the tree back to 200 bytes
    ev = router(pfs, dc, tmp, "cache_aware", ["--eviction-interval-secs", "0.1",
                                              "--max-tree-size", "200"])
    run_chats(ev, model_id, 4, 1, "ev", 9)
    urls = ["http://127.0.0.1:%d" % pf.port for pf in pfs]
    check(pc.wait_until(lambda: all(metric(ev, "sgl_router_tree_size", worker=u) <= 200
                                    for u in urls), 10),
          "eviction cut every prefill's tree to --max-tree-size 200: %s" %
          [metric(ev, "sgl_router_tree_size", worker=u) for u in urls])
    check("cache_aware eviction (prefill)" in ev.log_tail(20000),
          "the router logged its eviction")


def case_imbalance(model, tmp):
    pfs = [pc.Daemon(BUILD, "prefill", model, tmp) for _ in range(2)]
    dc = pc.Daemon(BUILD, "decode", model, tmp)
    # health polls rare: a stopped prefill must stay in rotation for the load rule to matter;
    # cache_aware by --prefill-policy over another --policy
    rt = router(pfs, dc, tmp, "power_of_two",
                ["--prefill-policy", "cache_aware", "--decode-policy", "round_robin",
                 "--health-check-interval-secs", "30", "--balance-abs-threshold", "2",
                 "--balance-rel-threshold", "1.5"])
    info = json.loads(rt.get("/server_info")[1])
    check((info["policy"], info["prefill_policy"], info["decode_policy"]) ==
          ("power_of_two", "cache_aware", "round_robin"),
          "/server_info: policies %s" % [info.get(k) for k in ("policy", "prefill_policy",
                                                               "decode_policy")])
    model_id = json.loads(rt.get("/v1/models")[1])["data"][0]["id"]
    rng = random.Random(3)
    base = [{"role": "system", "content": system_prompt(rng, 0, "imb")},
            {"role": "user", "content": "first question"}]
    text, _, _ = chat_turn(rt, model_id, base)
    # a prefill counts its request when the room ends, which can come after decode has
    # answered the client: wait for the count instead of reading it once
    counts = [0.0, 0.0]

    def counted():
        counts[:] = [metric(pf, "sglang:num_requests_total") for pf in pfs]
        return sum(counts) >= 1

    pc.wait_until(counted, 10)
    p = 0 if counts[0] == 1 else 1
    q = 1 - p
    check(counts[p] == 1 and counts[q] == 0, "the first turn went to one prefill: %s" % counts)
    follow = base + [{"role": "assistant", "content": text}]
    results = {}

    def send(k):
        msgs = follow + [{"role": "user", "content": "follow-up number %d" % k}]
        try:
            results[k] = chat_turn(rt, model_id, msgs)
        except Exception as e:  # noqa: BLE001 - reported below
            results[k] = e

    os.kill(pfs[p].p.pid, signal.SIGSTOP)
    threads = []
    try:
        step("prefill %d stopped; three follow-ups pile up on it" % p)
        for k in range(3):
            th = threading.Thread(target=send, args=(k,))
            th.start()
            threads.append(th)
            pc.wait_until(lambda: metric(rt, "sgl_router_running_requests",
                                         worker="http://127.0.0.1:%d" % pfs[p].port) >= k + 1, 10)
        check(metric(rt, "pdserve_router_cache_aware_decisions_total", decision="match") == 3,
              "the three went to the stopped prefill by match")
        # one at a time, so the counts stay 3 vs 0 for each: every one is a balance decision
        # (sent together, the second would see 3 vs 1 — not imbalanced — and go by match)
        step("three more follow-ups: imbalanced (3 vs 0), they go to prefill %d" % q)
        q_url = "http://127.0.0.1:%d" % pfs[q].port
        for k in range(3, 6):
            # the client has its answer before the router has seen the prefill's end: wait
            # for that, or the next request sees 3 vs 1 (not imbalanced)
            check(pc.wait_until(lambda: metric(rt, "sgl_router_running_requests",
                                               worker=q_url) == 0, 10),
                  "prefill %d idle before follow-up %d" % (q, k))
            send(k)
        for k in range(3, 6):
            check(isinstance(results.get(k), tuple),
                  "follow-up %d completed while prefill %d is stopped: %r" % (k, p,
                                                                             results.get(k)))
        bal = metric(rt, "pdserve_router_cache_aware_decisions_total", decision="balance",
                     worker="http://127.0.0.1:%d" % pfs[q].port)
        check(bal == 3, "three balance decisions for prefill %d (got %s)" % (q, bal))
        check(metric(rt, "sgl_router_load_balancing_events_total") == 3,
              "sgl_router_load_balancing_events_total == 3")
        # as for the first turn, the prefill counts each request when its room ends
        served = [0.0]

        def other_served():
            served[0] = metric(pfs[q], "sglang:num_requests_total")
            return served[0] >= 3

        pc.wait_until(other_served, 10)
        check(served[0] == 3, "the other prefill served the three (counted %s)" % served[0])
    finally:
        os.kill(pfs[p].p.pid, signal.SIGCONT)
    for th in threads:
        th.join(90)
    check(all(isinstance(results.get(k), tuple) for k in range(6)),
          "every follow-up completed after SIGCONT: %s" % results)


def main():
    tmp = pc.tmpdir()

    def body():
        model = pc.make_model(BUILD, tmp)
        {"affinity": case_affinity, "imbalance": case_imbalance}[CASE](model, tmp)
    pc.run_test("test_router_cache_aware %s" % CASE, body, tmp)


if __name__ == "__main__":
    main()
