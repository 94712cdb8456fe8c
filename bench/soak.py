#!/usr/bin/env python3
"""soak.py — bench/soak.sh's helpers (Python stdlib only): the sampler, the waits, and the report
with the soak's pass/fail criteria. soak.sh runs the processes and the load; this file measures.

  soak.py ports N                       N free TCP ports on 127.0.0.1, one a line
  soak.py wait-health TIMEOUT URL...    every URL's /health answers 200 within TIMEOUT s
  soak.py field FILE KEY                KEY of the last JSON line of FILE (pdserve-bench's
                                        --output-file), printed
  soak.py closed-rps FILE CONCURRENCY MEAN_OUT
                                        requests/s of a closed-loop run from its --output-requests
                                        FILE: output tokens/s while all CONCURRENCY slots were
                                        busy (until the last request started) / MEAN_OUT tokens
  soak.py sample OUT.csv INTERVAL NAME=PID... -- NAME=URL...
                                        every INTERVAL s until SIGTERM: VmRSS of each PID and, from
                                        each URL's /metrics, the KV tokens in use and the queues
                                        (router: its requests by outcome); one CSV row per sample
  soak.py wait-pages TIMEOUT URL...     seconds until every daemon URL reports no KV token in use
                                        and no request running or queued (printed); exit 1 after
                                        TIMEOUT s
  soak.py report OUTDIR                 reads OUTDIR's samples.csv, requests.jsonl, events.txt and
                                        config.txt; writes report.txt, minutes.csv, summary.json
                                        and rss.png (gnuplot); prints the report; exit 1 when a
                                        criterion fails

The criteria (issue 20), one line each: "name value limit PASS|FAIL", or INFO for a number that
is printed and not judged:
  rss_<proc>         RSS at the end of the load / RSS at minute 5 of the load (at the half-way
                     point when the load is shorter than 10 minutes); within 1 +- 0.05
  pages_return_s     seconds from the end of the load until prefill's and decode's KV pools hold
                     no token and no request, at most PAGE_RETURN_S (config)
  unexpected_errors  requests that failed, other than those the client cut on purpose: 0
  server_failed      requests the daemons counted as failed over the load
                     (pdserve_num_failed_requests_total): 0 (a client's abort counts as aborted)
  itl_p99_ratio      p99 ITL of the last 5 minutes / of the first 5 (thirds when shorter than 15
                     minutes), at most 1.2; judged only when the load runs JUDGE_LATENCY_MIN
                     minutes or more (config), INFO otherwise: on a shared 2-core machine a window
                     under a minute or two is decided by what else runs then, not by the server.
"""
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

# ------------------------------------------------------------------ small helpers


def free_ports(n):
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode("utf-8", "replace")


def parse_metrics(text):
    """{(name, ((label, value), ...)): float} of a Prometheus text page."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s+(\S+)', line)
        if not m:
            continue
        labels = tuple(sorted(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"',
                                         m.group(3) or "")))
        try:
            out[(m.group(1), labels)] = float(m.group(4))
        except ValueError:
            pass
    return out


def metric_sum(metrics, name, **want):
    """The sum of name's series whose labels include want."""
    total = 0.0
    for (n, labels), v in metrics.items():
        if n == name and all((k, str(x)) in labels for k, x in want.items()):
            total += v
    return total


def rss_kb(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def percentile(xs, q):
    """numpy's linear percentile of a list (None when empty)."""
    if not xs:
        return None
    xs = sorted(xs)
    pos = q / 100.0 * (len(xs) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


# ------------------------------------------------------------------ sampler

DAEMON_COLS = ["used_tokens", "max_tokens", "running", "queued", "failed_total", "aborted_total"]
ROUTER_OUTCOMES = ["ok", "error", "timeout", "aborted", "client_gone"]


def daemon_row(metrics):
    return [metric_sum(metrics, "sglang:num_used_tokens"),
            metric_sum(metrics, "sglang:max_total_num_tokens"),
            metric_sum(metrics, "sglang:num_running_reqs"),
            metric_sum(metrics, "sglang:num_queue_reqs"),
            metric_sum(metrics, "pdserve_num_failed_requests_total"),
            metric_sum(metrics, "sglang:num_aborted_requests_total")]


def router_row(metrics):
    return [metric_sum(metrics, "pdserve_router_requests_total", role="decode", outcome=o)
            for o in ROUTER_OUTCOMES]


def cmd_sample(args):
    out, interval = args[0], float(args[1])
    rest = args[2:]
    split = rest.index("--") if "--" in rest else len(rest)
    pids = [(a.split("=", 1)[0], int(a.split("=", 1)[1])) for a in rest[:split]]
    urls = [(a.split("=", 1)[0], a.split("=", 1)[1]) for a in rest[split + 1:]]
    header = ["t_unix"] + ["rss_kb_%s" % n for n, _ in pids]
    for n, _ in urls:
        cols = ROUTER_OUTCOMES if n == "router" else DAEMON_COLS
        header += ["%s_%s" % (n, c) for c in cols]
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
    with open(out, "w") as f:
        f.write(",".join(header) + "\n")
        f.flush()
        nxt = time.time()
        while not stop["now"]:
            row = [time.time()] + [rss_kb(p) for _, p in pids]
            for n, url in urls:
                width = len(ROUTER_OUTCOMES if n == "router" else DAEMON_COLS)
                try:
                    st, text = http_get(url + "/metrics", timeout=max(1.0, interval))
                    m = parse_metrics(text) if st == 200 else None
                except OSError:
                    m = None
                row += ([None] * width if m is None else
                        router_row(m) if n == "router" else daemon_row(m))
            f.write(",".join("" if v is None else ("%.3f" % v if isinstance(v, float) else str(v))
                             for v in row) + "\n")
            f.flush()
            nxt += interval
            while not stop["now"] and time.time() < nxt:
                time.sleep(min(0.2, max(0.0, nxt - time.time())))
    return 0


# ------------------------------------------------------------------ waits


def daemon_idle(url):
    st, text = http_get(url + "/metrics")
    if st != 200:
        return False
    m = parse_metrics(text)
    return (metric_sum(m, "sglang:num_used_tokens") == 0 and
            metric_sum(m, "sglang:num_running_reqs") == 0 and
            metric_sum(m, "sglang:num_queue_reqs") == 0)


def cmd_wait_pages(args):
    timeout, urls = float(args[0]), args[1:]
    t0 = time.time()
    while True:
        try:
            if all(daemon_idle(u) for u in urls):
                print("%.2f" % (time.time() - t0))
                return 0
        except OSError:
            pass
        if time.time() - t0 > timeout:
            print("%.2f" % (time.time() - t0))
            return 1
        time.sleep(0.1)


def cmd_wait_health(args):
    timeout, urls = float(args[0]), args[1:]
    deadline = time.time() + timeout
    for u in urls:
        while True:
            try:
                if http_get(u + "/health", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                print("soak: %s/health did not answer 200 within %g s" % (u, timeout),
                      file=sys.stderr)
                return 1
            time.sleep(0.1)
    return 0


def cmd_closed_rps(args):
    """A closed loop's steady throughput in requests/s: the output tokens that arrived while every
    slot was busy (until the last request started), over that time, over the mean output length
    of the load (MEAN_OUT). Counting the requests that ended in that time instead favours the
    short ones of a long-tailed dataset (a long one started early is still running at the end
    of the window: 12.7 req/s counted at concurrency 32 where 10 req/s open loop overloaded);
    the whole run's requests/s counts its drain too, when fewer and fewer requests run."""
    path, conc, mean_out = args[0], int(args[1]), float(args[2])
    with open(path) as f:
        reqs = [json.loads(x) for x in f if x.strip()]
    t0 = min(r["start"] for r in reqs)
    last = max(r["start"] for r in reqs)
    if len(reqs) < 2 * conc or last - t0 <= 0:  # too short to have a steady part
        last = max(r["end"] for r in reqs)
    tokens = 0
    for r in reqs:
        if r["ttft"] is None:
            continue
        t = r["start"] + r["ttft"]
        tokens += t <= last
        for g in r.get("itl") or []:
            t += g
            tokens += t <= last
    print("%.3f" % (tokens / (last - t0) / mean_out))
    return 0


def cmd_field(args):
    path, key = args
    with open(path) as f:
        lines = [x for x in f if x.strip()]
    print(json.loads(lines[-1])[key])
    return 0


# ------------------------------------------------------------------ report


def read_kv(path):
    out = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if "=" in line:
                    k, v = line.rstrip("\n").split("=", 1)
                    out[k.strip()] = v.strip()
    return out


def read_events(path):
    """events.txt: 'NAME UNIX_TIME [VALUE]' lines; {NAME: (time, value or None)}, the last of
    each name."""
    out = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2:
                    out[parts[0]] = (float(parts[1]), " ".join(parts[2:]) or None)
    return out


def read_samples(path):
    with open(path) as f:
        header = f.readline().strip().split(",")
        rows = []
        for line in f:
            vals = line.rstrip("\n").split(",")
            if len(vals) != len(header):
                continue  # a row cut by the sampler's end
            rows.append({k: (float(v) if v != "" else None) for k, v in zip(header, vals)})
    return header, rows


def error_kind(err):
    """A failed request's error text as a short kind, for counting."""
    e = err or ""
    if e.startswith("HTTP "):
        return "http_" + e.split()[1].rstrip(":")
    if e.startswith("transport:"):
        low = e.lower()
        if "timed out" in low or "timeout" in low:
            return "timeout"
        if "refused" in low:
            return "connection_refused"
        if "reset" in low or "recv failure" in low or "send failure" in low:
            return "connection_reset"
        return "transport"
    if e.startswith("error in stream"):
        return "stream_error"
    if "truncated" in e:
        return "truncated"
    if "without a token" in e:
        return "no_token"
    return "other"


def sample_at(rows, col, t, before=False):
    """col's value at the sample closest to time t (or the last sample at or before t)."""
    cands = [r for r in rows if r.get(col) is not None and (not before or r["t_unix"] <= t)]
    if not cands:
        return None, None
    r = (max(cands, key=lambda r: r["t_unix"]) if before else
         min(cands, key=lambda r: abs(r["t_unix"] - t)))
    return r[col], r["t_unix"]


def fmt(v, spec="%.3f"):
    return "-" if v is None else spec % v


def cmd_report(args):
    outdir = args[0]
    cfg = read_kv(os.path.join(outdir, "config.txt"))
    ev = read_events(os.path.join(outdir, "events.txt"))
    header, rows = read_samples(os.path.join(outdir, "samples.csv"))
    reqs = []
    rpath = os.path.join(outdir, "requests.jsonl")
    if os.path.exists(rpath):
        with open(rpath) as f:
            reqs = [json.loads(x) for x in f if x.strip()]
    lines = []
    say = lines.append
    crit = []  # (name, value text, limit text, verdict)

    if "load_start" not in ev or "load_end" not in ev:
        say("soak: the load did not run to its end (events: %s)" % sorted(ev))
        crit.append(("load_ran", "no", "yes", "FAIL"))
        load_start = load_end = None
    else:
        load_start, load_end = ev["load_start"][0], ev["load_end"][0]
    minutes = float(cfg.get("minutes", "0") or 0)
    load_s = (load_end - load_start) if load_start else 0.0

    say("pdserve soak: %s" % cfg.get("started", ""))
    say("  model %s; %s" % (cfg.get("model_desc", "?"), cfg.get("dataset_desc", "?")))
    say("  saturation (closed loop, highest of the ramp): %s req/s; load: %s x that = %s req/s "
        "open loop (Poisson) for %.1f min" % (cfg.get("saturation_rps", "?"),
                                              cfg.get("load_fraction", "?"),
                                              cfg.get("rate", "?"), load_s / 60))
    say("  client misbehaviour: %s aborted after a few tokens, %s disconnected (reset) within "
        "%s ms of sending" % (cfg.get("abort_fraction", "?"), cfg.get("disconnect_fraction", "?"),
                              cfg.get("disconnect_window_ms", "?")))
    if cfg.get("saturation_ramp"):
        say("  saturation ramp (concurrency:req/s): %s" % cfg["saturation_ramp"])

    # ---- per-minute latencies and outcomes
    minute_rows = []
    if load_start is not None:
        n_min = max(1, int(math.ceil(load_s / 60.0 - 1e-9)))
        buckets = [{"ttft": [], "itl": [], "completed": 0, "aborted": 0, "disconnected": 0,
                    "failed": {}} for _ in range(n_min)]

        def bucket(t):
            return min(n_min - 1, max(0, int((t - load_start) // 60)))

        for r in reqs:
            b = buckets[bucket(r["start_unix"])]
            if r["outcome"] == "completed":
                b["completed"] += 1
                if r["ttft"] is not None:
                    b["ttft"].append(r["ttft"])
            elif r["outcome"] == "cut":
                b["aborted" if r["fate"] == "abort" else "disconnected"] += 1
            else:
                k = error_kind(r.get("error"))
                b["failed"][k] = b["failed"].get(k, 0) + 1
            if r["outcome"] == "completed" and r["ttft"] is not None:
                t = r["start_unix"] + r["ttft"]
                for g in r.get("itl") or []:
                    t += g
                    buckets[bucket(t)]["itl"].append(g)
        say("")
        say("per minute of the load (TTFT by the request's start, ITL by each token's arrival; "
            "ms):")
        say("  min  completed aborted disconn failed  ttft_p50 ttft_p99  itl_p50  itl_p99  "
            "errors")
        for i, b in enumerate(buckets):
            row = {"minute": i + 1, "completed": b["completed"], "aborted": b["aborted"],
                   "disconnected": b["disconnected"], "failed": sum(b["failed"].values()),
                   "ttft_p50_ms": percentile(b["ttft"], 50), "ttft_p99_ms": percentile(b["ttft"],
                                                                                        99),
                   "itl_p50_ms": percentile(b["itl"], 50), "itl_p99_ms": percentile(b["itl"], 99),
                   "errors": ";".join("%s:%d" % kv for kv in sorted(b["failed"].items()))}
            for k in ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms"):
                row[k] = None if row[k] is None else row[k] * 1e3
            minute_rows.append(row)
            say("  %3d  %9d %7d %7d %6d  %8s %8s %8s %8s  %s" % (
                i + 1, row["completed"], row["aborted"], row["disconnected"], row["failed"],
                fmt(row["ttft_p50_ms"], "%.1f"), fmt(row["ttft_p99_ms"], "%.1f"),
                fmt(row["itl_p50_ms"], "%.2f"), fmt(row["itl_p99_ms"], "%.2f"),
                row["errors"] or "-"))
        with open(os.path.join(outdir, "minutes.csv"), "w") as f:
            keys = list(minute_rows[0].keys())
            f.write(",".join(keys) + "\n")
            for row in minute_rows:
                f.write(",".join("" if row[k] is None else str(row[k]) for k in keys) + "\n")

    # ---- totals
    completed = [r for r in reqs if r["outcome"] == "completed"]
    cut_abort = sum(1 for r in reqs if r["outcome"] == "cut" and r["fate"] == "abort")
    cut_disc = sum(1 for r in reqs if r["outcome"] == "cut" and r["fate"] == "disconnect")
    failed = [r for r in reqs if r["outcome"] == "failed"]
    kinds = {}
    for r in failed:
        k = error_kind(r.get("error"))
        kinds[k] = kinds.get(k, 0) + 1
    all_ttft = [r["ttft"] for r in completed if r["ttft"] is not None]
    all_itl = [g for r in completed for g in r.get("itl") or []]
    say("")
    say("requests: %d sent, %d completed, %d aborted by the client on purpose, %d disconnected "
        "by the client on purpose, %d failed%s" % (
            len(reqs), len(completed), cut_abort, cut_disc, len(failed),
            (" (" + ", ".join("%s %d" % kv for kv in sorted(kinds.items())) + ")") if kinds
            else ""))
    for r in failed[:5]:
        say("  failed request %d at %.1f s: %s" % (r["index"], r["start"], r.get("error")))
    say("latency over the load (ms): TTFT p50 %s p99 %s; ITL p50 %s p99 %s" % (
        fmt(percentile(all_ttft, 50) and percentile(all_ttft, 50) * 1e3, "%.1f"),
        fmt(percentile(all_ttft, 99) and percentile(all_ttft, 99) * 1e3, "%.1f"),
        fmt(percentile(all_itl, 50) and percentile(all_itl, 50) * 1e3, "%.2f"),
        fmt(percentile(all_itl, 99) and percentile(all_itl, 99) * 1e3, "%.2f")))

    # ---- router's and daemons' own counts over the load
    def delta(col):
        a, _ = sample_at(rows, col, load_start, before=True) if load_start else (None, None)
        b, _ = sample_at(rows, col, ev.get("pages_full", ev.get("load_end", (0,)))[0] + 1,
                         before=True) if load_start else (None, None)
        return None if a is None or b is None else b - a

    rc_counts = {o: delta("router_%s" % o) for o in ROUTER_OUTCOMES}
    say("router's decode requests over the load by outcome: %s" %
        ", ".join("%s %s" % (o, fmt(v, "%.0f")) for o, v in rc_counts.items()))
    server_failed = 0
    for d in ("prefill", "decode"):
        f_, a_ = delta("%s_failed_total" % d), delta("%s_aborted_total" % d)
        say("%s's counters over the load: failed %s, aborted %s" % (d, fmt(f_, "%.0f"),
                                                                   fmt(a_, "%.0f")))
        server_failed += f_ or 0

    # ---- RSS
    procs = [c[len("rss_kb_"):] for c in header if c.startswith("rss_kb_")]
    say("")
    if load_start is not None:
        if minutes >= 10:  # a Poisson load of MINUTES may end a few seconds short of it
            t_ref, ref_name = load_start + 300, "minute 5"
        else:
            t_ref, ref_name = load_start + load_s / 2, "the half-way point (%.1f min; the load " \
                "is shorter than 10 minutes)" % (load_s / 120)
        say("RSS (MiB) at the start of the load, at %s, and at its end:" % ref_name)
        for p in procs:
            col = "rss_kb_" + p
            s0, _ = sample_at(rows, col, load_start)
            ref, _ = sample_at(rows, col, t_ref)
            end, _ = sample_at(rows, col, load_end, before=True)
            peak = max((r[col] for r in rows if r.get(col) is not None and
                        load_start <= r["t_unix"] <= load_end), default=None)
            say("  %-8s start %8s  ref %8s  end %8s  peak %8s" % (
                p, fmt(s0 and s0 / 1024, "%.1f"), fmt(ref and ref / 1024, "%.1f"),
                fmt(end and end / 1024, "%.1f"), fmt(peak and peak / 1024, "%.1f")))
            if ref and end:
                ratio = end / ref
                crit.append(("rss_%s" % p, "%.4f" % ratio, "1+-0.05",
                             "PASS" if abs(ratio - 1) <= 0.05 else "FAIL"))
            else:
                crit.append(("rss_%s" % p, "-", "1+-0.05", "FAIL"))

    # ---- pages back
    bound = float(cfg.get("page_return_s", "10"))
    if "pages_full" in ev:
        pr = float(ev["pages_full"][1])
        crit.append(("pages_return_s", "%.2f" % pr, "<=%g" % bound,
                     "PASS" if pr <= bound else "FAIL"))
    else:
        waited = ev.get("pages_not_full", (0, "?"))[1]
        crit.append(("pages_return_s", ">%s" % waited, "<=%g" % bound, "FAIL"))

    crit.append(("unexpected_errors", str(len(failed)), "0", "PASS" if not failed else "FAIL"))
    crit.append(("server_failed", "%d" % server_failed, "0",
                 "PASS" if server_failed == 0 else "FAIL"))

    # ---- ITL ratio
    judge_min = float(cfg.get("judge_latency_min", "10"))
    if load_start is not None and reqs:
        if load_s >= 15 * 60:
            w, wname = 300.0, "last 5 min / first 5 min"
        else:
            w, wname = load_s / 3, "last third / first third"

        def itl_window(a, b):
            out = []
            for r in completed:
                if r["ttft"] is None:
                    continue
                t = r["start_unix"] + r["ttft"]
                for g in r.get("itl") or []:
                    t += g
                    if a <= t < b:
                        out.append(g)
            return out

        first = percentile(itl_window(load_start, load_start + w), 99)
        last = percentile(itl_window(load_end - w, load_end + 60), 99)
        if first and last:
            ratio = last / first
            judged = minutes >= judge_min
            crit.append(("itl_p99_ratio", "%.3f" % ratio, "<=1.2",
                         ("PASS" if ratio <= 1.2 else "FAIL") if judged else "INFO"))
            say("p99 ITL, %s: %.2f / %.2f ms%s" % (
                wname, last * 1e3, first * 1e3, "" if judged else
                " (not judged: the load is shorter than %g minutes)" % judge_min))
        else:
            crit.append(("itl_p99_ratio", "-", "<=1.2", "FAIL"))

    # ---- shutdown
    for p in procs:
        e = ev.get("exit_%s" % p)
        if e is not None:
            say("%s exit status after SIGTERM: %s" % (p, e[1]))
            if e[1] != "0":
                crit.append(("exit_%s" % p, e[1], "0", "FAIL"))

    say("")
    say("criteria (name value limit verdict):")
    for c in crit:
        say("%s %s %s %s" % c)
    verdict = "FAIL" if any(c[3] == "FAIL" for c in crit) else "PASS"
    say("soak: %s" % verdict)

    with open(os.path.join(outdir, "summary.json"), "w") as f:
        json.dump({"config": cfg, "events": {k: v[0] for k, v in ev.items()},
                   "requests": {"sent": len(reqs), "completed": len(completed),
                                "aborted": cut_abort, "disconnected": cut_disc,
                                "failed": len(failed), "failed_by_kind": kinds},
                   "router_decode_outcomes": rc_counts, "minutes": minute_rows,
                   "criteria": [dict(zip(("name", "value", "limit", "verdict"), c))
                                for c in crit], "verdict": verdict}, f, indent=1)
    plot(outdir, rows, procs, load_start, load_end, lines)
    text = "\n".join(lines) + "\n"
    with open(os.path.join(outdir, "report.txt"), "w") as f:
        f.write(text)
    sys.stdout.write(text)
    return 0 if verdict == "PASS" else 1


def plot(outdir, rows, procs, load_start, load_end, lines):
    """rss.png: RSS of each process (top) and KV tokens in use on prefill and decode (bottom)
    against minutes since the load began."""
    if not rows:
        return
    t0 = load_start or rows[0]["t_unix"]
    data = os.path.join(outdir, "rss.dat")
    with open(data, "w") as f:
        for r in rows:
            vals = [(r["t_unix"] - t0) / 60.0]
            vals += [(r.get("rss_kb_" + p) or float("nan")) / 1024.0 for p in procs]
            for d in ("prefill", "decode"):
                u = r.get("%s_used_tokens" % d)
                vals.append(float("nan") if u is None else u)
            f.write(" ".join("%.4f" % v for v in vals) + "\n")
    png = os.path.join(outdir, "rss.png")
    n = len(procs)
    script = ["set terminal pngcairo size 1200,900 noenhanced font 'sans,10'",
              "set output '%s'" % png, "set multiplot layout 2,1", "set grid",
              "set key outside right", "set datafile missing 'nan'",
              "set xlabel 'minutes since the load began'"]
    marks = []
    for t, name in ((load_start, "load"), (load_end, "end")):
        if t:
            marks.append("set arrow from %.4f, graph 0 to %.4f, graph 1 nohead dt 2" %
                         ((t - t0) / 60.0, (t - t0) / 60.0))
    script += marks
    script += ["set title 'RSS of each process'", "set ylabel 'MiB'",
               "plot " + ", ".join("'%s' using 1:%d with lines lw 2 title '%s'" %
                                   (data, i + 2, p) for i, p in enumerate(procs)),
               "set title 'KV tokens in use'", "set ylabel 'tokens'",
               "plot '%s' using 1:%d with lines lw 2 title 'prefill', '%s' using 1:%d with "
               "lines lw 2 title 'decode'" % (data, n + 2, data, n + 3),
               "unset multiplot"]
    try:
        r = subprocess.run(["gnuplot"], input="\n".join(script) + "\n", text=True,
                           capture_output=True, timeout=60)
        lines.append("plot: %s" % (png if r.returncode == 0 else
                                   "gnuplot failed: %s" % r.stderr.strip()[-300:]))
    except (OSError, subprocess.TimeoutExpired) as e:
        lines.append("plot: not drawn (%s; Debian: apt-get install gnuplot-nox)" % e)


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "ports":
        print("\n".join(map(str, free_ports(int(args[0])))))
        return 0
    fn = {"sample": cmd_sample, "wait-pages": cmd_wait_pages, "wait-health": cmd_wait_health,
          "field": cmd_field, "closed-rps": cmd_closed_rps, "report": cmd_report}.get(cmd)
    if not fn:
        print("soak.py: unknown command %r\n%s" % (cmd, __doc__), file=sys.stderr)
        return 2
    return fn(args)


if __name__ == "__main__":
    sys.exit(main())
