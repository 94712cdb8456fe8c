#!/usr/bin/env bash
# bench/compare-pd.sh — colocated vs prefill/decode disaggregation, the same load on one machine.
# (a) colocated: one pdserve-decode --disaggregation-mode null serving alone;
# (b) disaggregated: 1 pdserve-prefill + 1 pdserve-decode + pdserve-router (KV over UCX shm).
# Each gets the same pdserve-bench run: the WORKLOAD's prompts, OUTPUT_LEN output tokens (exact:
# ignore_eos), a request-rate sweep, the same seed. Prints the tables, then TTFT and ITL
# percentiles, throughput and goodput side by side, and draws OUT_DIR/compare.png. The PD runs
# also read the router's and the decode's hand-over stages (pdserve-bench --timeline-url) and
# print, per rate, where PD's time to first token went and how the stages add up to it, and the
# KV bytes the prefill moved during each rate's load (pdserve-bench --kv-bytes-url: the
# prefill's pdserve_kv_transfer_bytes_total before and after the load, warm-up excluded).
# The disaggregated half can run as several PD variants (PD_VARIANTS), each on its own daemons:
# today's PD, plain PD without the decode's prefix reuse, and PD with local prefill and reuse;
# with `reuse` among them the goodput ratios reuse / each other setup are printed per rate (and,
# per workload, the short prompts' TTFT and the KV bytes per request). Each PD setup's median
# TTFT minus colocated's is printed per rate as well (issue 17: at most 1 ms at the lightest),
# from REPEATS=6 on with the interval that holds its median at 95 % confidence.
# The setups take turns: every setup's daemons start first and stay up (one that waits sleeps),
# then each rate's load runs on one setup after the other, REPEATS times, the order rotated from
# one turn to the next. On a shared VM the same load's CPU time varies by 40 % within minutes,
# and setups measured one after the other (each its whole sweep) compared those spells more
# than the setups: 2 cores, small model, mixed load at 6 req/s, colocated's goodput was 5.06
# req/s in one run and 2.24-4.30 in the hour after. With REPEATS > 1 the tables give medians
# and each ratio (or TTFT difference) the median of those within a turn, with their range.
# Both setups get the whole machine: by default every daemon (the colocated one, and each of the
# PD prefill and decode) runs one thread per core, so a PD daemon may use every core while its
# peer idles, as the colocated daemon does; the two PD daemons share the cores through the OS
# scheduler when both are busy. The comparison is per machine, not per process (THREADS=1 gives
# each PD daemon one core's share instead: it leaves a core idle whenever one role waits).
# Nothing is left running, on success, error or Ctrl-C.
#
# Usage: bench/compare-pd.sh [BUILD_DIR [MODEL_DIR]]     (default build, a model made here)
# Environment (defaults in brackets):
#   MODEL_SHAPE [tiny]  the random llama made here when no MODEL_DIR is given:
#                     tiny   pdserve-mkmodel --shape tiny (0.2 M parameters): a 1,024-token
#                            prompt prefills in about 5 ms on 2 cores, so on the CPU no setup
#                            misses a 200 ms TTFT SLO below saturation (mixed: none at 32 req/s)
#                            and the load measures the hand-over's own cost;
#                     small  the tiny llama widened (hidden 384, MLP 1,024, 4 layers, 6 heads of
#                            64, 2 kv heads; 7 M parameters): a 2,048-token prompt prefills in
#                            about 240 ms and a decode step takes about 0.6 ms on 2 cores, so a
#                            long prompt holds the prefill as on a real deployment and short
#                            prompts queue behind it (the load where issue 16's goodput shows)
#   RATES [tiny: random 8,16,32,64,inf; mixed 2,4,8,12,16; multiturn 2,4,8,16,32;
#                     small: 1,2,4,6,8]  request rates (req/s) of the sweep; inf = all at once
#                     (small: the mixed load saturates 2 cores at about 6-8 req/s)
#   WORKLOAD [random] random: prompts of INPUT_LEN tokens (today's load);
#                     mixed: prompt lengths from MIX (pdserve-bench --random-mix);
#                     multiturn: CONVERSATIONS chats of TURNS turns, each turn INPUT_LEN new
#                     tokens after the previous prompt and answer (--dataset-name multiturn;
#                     NUM_PROMPTS is then CONVERSATIONS x TURNS)
#   MIX [0.7:32-128,0.3:1024-2048]  mixed: SHARE:MIN-MAX length classes (tokens)
#   CONVERSATIONS [8] TURNS [6]        multiturn: the chat set
#   NUM_PROMPTS [128] requests per rate    OUTPUT_LEN [128]
#   INPUT_LEN [1024; multiturn 128]   random: prompt tokens; multiturn: new tokens per turn
#   FLUSH_CACHE [1]   1: every rate's load starts with empty prefix caches
#                     (pdserve-bench --flush-cache), so a rate does not reuse the prompts and
#                     answers the rate before it left (every rate sends the same prompts); 0
#                     keeps them: a load of fewer prompts than the caches hold then measures
#                     prefix hits from the second rate on (64 random 1,024-token prompts at 8 req/s,
#                     tiny model: PD's median TTFT 7.9-8.1 ms on the first rate, 4.7-5.0 on the next)
#   SLO_TTFT_MS [200] SLO_TPOT_MS [10]      goodput counts requests meeting both
#   DEVICE [cpu]      --device of the daemons (cuda on a GPU machine)
#   THREADS [nproc]   CPU threads per PD daemon; COLOCATED_THREADS [THREADS]
#   MAX_TOTAL_TOKENS [65536]  KV pool of each daemon   CHUNK [512] --chunked-prefill-size
#   CONTEXT_LENGTH [4096 with a model made here, else 0]  the daemons' --context-length
#                     (0: the model's max_position_embeddings; a made model's 2,048 is less
#                     than the mixed workload's longest prompt + OUTPUT_LEN)
#   ONLY [both]       colocated | pd: run one half only (pd: every PD variant)
#   REPEATS [1]       loads per setup and rate, taken in turns (medians reported; runs/ keeps
#                     each load's table, JSON Lines and CSV; plot/ the median-goodput repeat's)
#   PD_VARIANTS [pd]  the PD runs, in order (space or comma separated; labels of the results):
#                     pd     today's PD: the router as ROUTER_FLAGS says (its local path on
#                            by default), the decode's prefix reuse on (its default; with one
#                            decode every follow-up reaches it);
#                     plain  plain PD: the decode with PLAIN_DECODE_FLAGS and the router with
#                            PLAIN_ROUTER_FLAGS (every request takes the PD path and every
#                            prompt page moves, as before issue 16);
#                     reuse  PD with local prefill and reuse: the router also gets
#                            REUSE_ROUTER_FLAGS.
#                     The issue's comparison: PD_VARIANTS="plain reuse"
#   PLAIN_DECODE_FLAGS [--disable-prefix-cache]  the plain variant's extra decode flags
#   PLAIN_ROUTER_FLAGS [--local-prefill-max-tokens 0]  the plain variant's extra router flags
#   REUSE_ROUTER_FLAGS [--local-prefill-max-tokens 256 --decode-policy cache_aware]
#                     the reuse variant's extra router flags
#   PREFILL_FLAGS []  more flags for pdserve-prefill (e.g. --eager-prefill=false)
#   ROUTER_FLAGS []   more flags for pdserve-router, every PD variant (e.g.
#                     --local-prefill-max-tokens 256)
#   OUT_DIR [BUILD_DIR/compare-pd]  tables, JSON Lines, CSV, logs and compare.png
set -euo pipefail
build=${1:-build}
model=${2:-}
workload=${WORKLOAD:-random}
shape=${MODEL_SHAPE:-tiny}
case $shape in tiny | small) ;; *)
    echo "compare-pd: MODEL_SHAPE must be tiny or small (got '$shape')" >&2
    exit 2
    ;;
esac
mix=${MIX:-0.7:32-128,0.3:1024-2048}
conversations=${CONVERSATIONS:-8}
turns=${TURNS:-6}
num_prompts=${NUM_PROMPTS:-128}
case $workload in
random) input_len=${INPUT_LEN:-1024} flush=${FLUSH_CACHE:-1} rates=8,16,32,64,inf ;;
mixed) input_len=${INPUT_LEN:-1024} flush=${FLUSH_CACHE:-1} rates=2,4,8,12,16 ;;
multiturn) input_len=${INPUT_LEN:-128} flush=${FLUSH_CACHE:-1} rates=2,4,8,16,32 ;;
*)
    echo "compare-pd: WORKLOAD must be random, mixed or multiturn (got '$workload')" >&2
    exit 2
    ;;
esac
[ "$shape" = small ] && rates=1,2,4,6,8
rates=${RATES:-$rates}
output_len=${OUTPUT_LEN:-128}
slo_ttft=${SLO_TTFT_MS:-200}
slo_tpot=${SLO_TPOT_MS:-10}
device=${DEVICE:-cpu}
threads=${THREADS:-$(nproc)}
colo_threads=${COLOCATED_THREADS:-$threads}
max_total=${MAX_TOTAL_TOKENS:-65536}
chunk=${CHUNK:-512}
only=${ONLY:-both}
repeats=${REPEATS:-1}
read -r -a prefill_flags <<<"${PREFILL_FLAGS:-}"
read -r -a router_flags <<<"${ROUTER_FLAGS:-}"
# ${X-default}: the default when X is unset; X="" means no flags
plain_default="--disable-prefix-cache"
plain_router_default="--local-prefill-max-tokens 0"
reuse_default="--local-prefill-max-tokens 256 --decode-policy cache_aware"
read -r -a plain_decode_flags <<<"${PLAIN_DECODE_FLAGS-$plain_default}"
read -r -a plain_router_flags <<<"${PLAIN_ROUTER_FLAGS-$plain_router_default}"
read -r -a reuse_router_flags <<<"${REUSE_ROUTER_FLAGS-$reuse_default}"
pd_variants=${PD_VARIANTS:-pd}
read -r -a variants <<<"${pd_variants//,/ }" # space or comma separated
out=${OUT_DIR:-$build/compare-pd}
logs=$out/logs
mkdir -p "$logs"
case $only in both | colocated | pd) ;; *)
    echo "compare-pd: ONLY must be both, colocated or pd (got '$only')" >&2
    exit 2
    ;;
esac
if ! [[ $repeats =~ ^[1-9][0-9]*$ ]]; then
    echo "compare-pd: REPEATS must be a positive whole number (got '$repeats')" >&2
    exit 2
fi
if [ ${#variants[@]} -eq 0 ]; then
    echo "compare-pd: PD_VARIANTS is empty (give pd, plain and/or reuse)" >&2
    exit 2
fi
for v in "${variants[@]}"; do
    case $v in pd | plain | reuse) ;; *)
        echo "compare-pd: PD_VARIANTS: '$v' is not pd, plain or reuse" >&2
        exit 2
        ;;
    esac
done
for b in prefill/pdserve-prefill decode/pdserve-decode router/pdserve-router \
    bench/pdserve-bench tools/pdserve-mkmodel; do
    if [ ! -x "$build/$b" ]; then
        echo "compare-pd: $build/$b is not built (cmake --build $build)" >&2
        exit 1
    fi
done

# UCX over shared memory, with peer-failure detection that keeps shared memory (DESIGN.md §6)
export UCX_TLS=${UCX_TLS:-posix,cma} UCX_MM_ERROR_HANDLING=y UCX_POSIX_ERROR_HANDLING=y

pids=()
names=()
stop_all() {
    for i in "${!pids[@]}"; do kill -TERM "${pids[$i]}" 2>/dev/null || true; done
    for i in "${!pids[@]}"; do
        for _ in $(seq 50); do kill -0 "${pids[$i]}" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "${pids[$i]}" 2>/dev/null || true
        wait "${pids[$i]}" 2>/dev/null || true
    done
    pids=()
    names=()
}
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    stop_all
    [ "$rc" -eq 130 ] && echo "compare-pd: interrupted; everything it started is stopped" >&2
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start() { # name, then the command line
    local name=$1
    shift
    "$@" >"$logs/$name.log" 2>&1 &
    pids+=($!)
    names+=("$name")
}

wait_healthy() { # name, port, pid: /health 200 within 120 s, or the daemon's exit and log
    local name=$1 port=$2 pid=$3
    for _ in $(seq 1200); do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "compare-pd: $name exited at start; its log ($logs/$name.log) ends:" >&2
            tail -n 5 "$logs/$name.log" >&2
            return 1
        fi
        if python3 -c "import sys,urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2).status == 200 else 1)" 2>/dev/null; then
            return 0
        fi
        sleep 0.1
    done
    echo "compare-pd: $name not healthy within 120 s (log $logs/$name.log)" >&2
    return 1
}

context_length=${CONTEXT_LENGTH:-0}
if [ -z "$model" ]; then
    context_length=${CONTEXT_LENGTH:-4096}
    model=$build/models/$shape-llama
    widen=()
    [ "$shape" = small ] && widen=(--hidden-size 384 --intermediate-size 1024 --layers 4
        --heads 6 --kv-heads 2 --head-dim 64)
    echo "compare-pd: writing a $shape random llama model to $model"
    "$build/tools/pdserve-mkmodel" --family llama --shape tiny ${widen[@]+"${widen[@]}"} \
        --dtype bf16 --seed 1 --out "$model" >"$logs/mkmodel.log" 2>&1
fi

common=(--model-path "$model" --host 127.0.0.1 --device "$device" --page-size 16
    --chunked-prefill-size "$chunk" --max-total-tokens "$max_total" --log-level warning
    --context-length "$context_length")

case $workload in
random)
    dataset=(--dataset-name random --random-input-len "$input_len" --num-prompts "$num_prompts")
    what="random $input_len in / $output_len out, $num_prompts prompts per rate"
    ;;
mixed)
    dataset=(--dataset-name random --random-mix "$mix" --num-prompts "$num_prompts")
    what="mixed prompts ($mix tokens) / $output_len out, $num_prompts prompts per rate"
    ;;
multiturn)
    dataset=(--dataset-name multiturn --multiturn-conversations "$conversations"
        --multiturn-turns "$turns" --random-input-len "$input_len")
    what="multiturn: $conversations chats x $turns turns, $input_len new tokens a turn"
    what+=" / $output_len out"
    ;;
esac
[ "$flush" = 1 ] && dataset+=(--flush-cache)

run_bench() { # label, rate, repeat, port, then extra pdserve-bench flags: one load, its
    # results appended to the label's JSON Lines, CSV and table (runs/ keeps each load's own)
    local label=$1 rate=$2 rep=$3 port=$4 run
    shift 4
    run=$out/runs/$label-$rate-$rep
    echo "compare-pd: [$label] rate $rate, repeat $rep of $repeats: $what"
    "$build/bench/pdserve-bench" --backend sglang --base-url "http://127.0.0.1:$port" \
        "${dataset[@]}" --random-output-len "$output_len" --random-range-ratio 1 \
        --request-rate-sweep "$rate" \
        --seed 1 --warmup-requests 2 --slo-ttft-ms "$slo_ttft" --slo-tpot-ms "$slo_tpot" \
        --output-file "$run.jsonl" --output-csv "$run.csv" \
        --plot-label "$label" "$@" | tee "$run.txt"
    cat "$run.txt" >>"$out/$label.txt"
    cat "$run.jsonl" >>"$out/$label.jsonl"
    if [ -s "$out/$label.csv" ]; then
        tail -n +2 "$run.csv" >>"$out/$label.csv" # one header
    else
        cp "$run.csv" "$out/$label.csv"
    fi
}

# Every setup's daemons start first and stay up; then each rate's load runs on one setup after
# the other, REPEATS times, the order rotated from one turn to the next, so every setup meets
# the machine's slow and fast spells alike (the header says why). A setup that waits is idle:
# its daemons sleep in epoll (PD daemons waiting through a 24 s load: 0.05 CPU-seconds).
setups=()
declare -A port_of bench_extra
mkdir -p "$out/runs"

if [ "$only" != pd ]; then
    port=$(free_port)
    echo "compare-pd: [colocated] pdserve-decode --disaggregation-mode null on :$port" \
        "($colo_threads threads)"
    start colocated "$build/decode/pdserve-decode" "${common[@]}" --port "$port" \
        --threads "$colo_threads" --disaggregation-mode null
    if ! wait_healthy colocated "$port" "$!"; then
        echo "compare-pd: colocated mode (pdserve-decode --disaggregation-mode null) is not" \
            "available in this build; run ONLY=pd for the disaggregated half alone" >&2
        exit 1
    fi
    setups+=(colocated)
    port_of[colocated]=$port
    bench_extra[colocated]=""
fi

start_pd() { # variant: 1 prefill + 1 decode + router on fresh ports
    local label=$1 decode_extra=() router_extra=() pid_p pid_d
    if [ "$label" = plain ]; then
        decode_extra=(${plain_decode_flags[@]+"${plain_decode_flags[@]}"})
        router_extra=(${plain_router_flags[@]+"${plain_router_flags[@]}"})
    fi
    [ "$label" = reuse ] && router_extra=(${reuse_router_flags[@]+"${reuse_router_flags[@]}"})
    pport=$(free_port) bport=$(free_port) dport=$(free_port) rport=$(free_port)
    echo "compare-pd: [$label] pdserve-prefill :$pport (bootstrap :$bport), pdserve-decode" \
        ":$dport${decode_extra[*]+ ${decode_extra[*]}}, pdserve-router" \
        ":$rport${router_extra[*]+ ${router_extra[*]}} ($threads threads per daemon)"
    start "$label-prefill" "$build/prefill/pdserve-prefill" "${common[@]}" --port "$pport" \
        --threads "$threads" --disaggregation-mode prefill --disaggregation-bootstrap-port "$bport" \
        ${prefill_flags[@]+"${prefill_flags[@]}"}
    pid_p=$!
    start "$label-decode" "$build/decode/pdserve-decode" "${common[@]}" --port "$dport" \
        --threads "$threads" --disaggregation-mode decode \
        ${decode_extra[@]+"${decode_extra[@]}"}
    pid_d=$!
    wait_healthy "$label-prefill" "$pport" "$pid_p"
    wait_healthy "$label-decode" "$dport" "$pid_d"
    # no router admission limit (its default, 256 in flight, answered 128 of 384 requests sent
    # at once with 429 on the GPU): the colocated daemon has none, so both halves take the load
    start "$label-router" "$build/router/pdserve-router" --pd-disaggregation --host 127.0.0.1 \
        --port "$rport" --prefill "http://127.0.0.1:$pport" "$bport" \
        --decode "http://127.0.0.1:$dport" --policy round_robin --max-concurrent-requests 0 \
        --log-level warning ${router_flags[@]+"${router_flags[@]}"} \
        ${router_extra[@]+"${router_extra[@]}"}
    wait_healthy "$label-router" "$rport" "$!"
    setups+=("$label")
    port_of[$label]=$rport
    bench_extra[$label]="--timeline-url http://127.0.0.1:$rport,http://127.0.0.1:$dport"
    bench_extra[$label]+=" --kv-bytes-url http://127.0.0.1:$pport"
}

if [ "$only" != colocated ]; then
    for v in "${variants[@]}"; do start_pd "$v"; done
fi

# this run's setups start empty; another's results stay (ONLY=colocated, then ONLY=pd)
for s in "${setups[@]}"; do rm -f "$out/$s".{jsonl,csv,txt} "$out/runs/$s"-*; done
IFS=, read -r -a rate_list <<<"$rates"
turn=0
for rate in "${rate_list[@]}"; do
    for rep in $(seq "$repeats"); do
        n=${#setups[@]}
        for k in $(seq 0 $((n - 1))); do
            s=${setups[$(((k + turn) % n))]}
            # shellcheck disable=SC2086 # bench_extra holds URL flags, no spaces inside
            run_bench "$s" "$rate" "$rep" "${port_of[$s]}" ${bench_extra[$s]}
        done
        turn=$((turn + 1))
    done
done
stop_all

# Side by side, from the JSON Lines the runs wrote (a label's file: its loads in run order, so
# the k-th record of a rate is its k-th repeat). With REPEATS > 1 every cell is the median over
# the repeats, and each ratio the median of the ratios within a repeat (the setups' loads of one
# repeat ran minutes apart at most) with their range; plot/ gets, per setup and rate, the repeat
# of median goodput.
files=()
[ "$only" != pd ] && files+=("colocated=$out/colocated.jsonl")
if [ "$only" != colocated ]; then
    for v in "${variants[@]}"; do files+=("$v=$out/$v.jsonl"); done
fi
mkdir -p "$out/plot"
python3 - "$out/plot" "${files[@]}" <<'EOF'
import json, math, statistics, sys
plot_dir = sys.argv[1]
runs = []   # (label, {rate: [record of each repeat]})
rates = []
for arg in sys.argv[2:]:
    label, path = arg.split("=", 1)
    by_rate = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                by_rate.setdefault(r["request_rate"], []).append(r)
                if r["request_rate"] not in rates:
                    rates.append(r["request_rate"])
    runs.append((label, by_rate))
repeats = max(len(v) for _, by in runs for v in by.values())
slo = next(iter(runs[0][1].values()))[0]
print("\ncompare-pd: side by side (ms; goodput = req/s meeting TTFT <= %g ms and TPOT <= %g ms%s)"
      % (slo["slo_ttft_ms"], slo["slo_tpot_ms"],
         "; medians of %d repeats" % repeats if repeats > 1 else ""))


def median(vals):
    vals = [v for v in vals if v is not None]
    if not vals:
        return None
    m = statistics.median(vals)
    return int(m) if all(isinstance(v, int) for v in vals) and m == int(m) else m


def short_ttft(r):
    # the median TTFT of the class with the shortest prompts (--random-mix)
    cls = r.get("classes")
    return min(cls, key=lambda c: c["max_len"])["median_ttft_ms"] if cls else None


def kv_kb(r):
    v = r.get("kv_transfer_bytes_per_request")
    return v / 1e3 if v is not None else None


cols = [("TTFT p50", lambda r: r["median_ttft_ms"]), ("TTFT p99", lambda r: r["p99_ttft_ms"]),
        ("ITL p50", lambda r: r["median_itl_ms"]), ("ITL p99", lambda r: r["p99_itl_ms"]),
        ("TPOT p50", lambda r: r["median_tpot_ms"]),
        ("E2E p50", lambda r: r["median_e2e_latency_ms"]),
        ("req/s", lambda r: r["request_throughput"]),
        ("out tok/s", lambda r: r["output_throughput"]),
        ("goodput", lambda r: r["request_goodput"]), ("failed", lambda r: r["failed"])]
every = [r for _, by in runs for rs in by.values() for r in rs]
if any(r.get("classes") for r in every):
    cols.insert(2, ("short p50", short_ttft))
if any(r.get("kv_transfer_bytes") is not None for r in every):
    cols.append(("KV KB/req", kv_kb))


def cell(v):
    return "%11s" % "-" if v is None else "%11.2f" % v if isinstance(v, float) else "%11s" % v


head = "%-6s %-10s" % ("rate", "setup") + "".join("%11s" % c for c, _ in cols)
print(head)
print("-" * len(head))
for rate in rates:
    for label, by in runs:
        rs = by.get(rate)
        if rs:
            print("%-6s %-10s" % (rate, label) + "".join(cell(median([f(r) for r in rs]))
                                                         for _, f in cols))
if any(r.get("classes") for r in every):
    print("\n(short p50: median TTFT of the prompts of the shortest --random-mix class, ms)")
if any(r.get("kv_transfer_bytes") is not None for r in every):
    multi = any(r.get("turns") for r in every)
    print("(KV KB/req: KV bytes the prefill moved during the rate's load / its requests%s)" %
          ("; all turns together: turns of different conversations overlap, so the bytes of "
           "turns after the first cannot be told apart" if multi else ""))
# Per turn of a multi-turn load: mean prompt tokens and median TTFT, per setup and rate (with
# repeats, each figure's median over them).
for label, by in runs:
    for rate, rs in by.items():
        turns = {}
        for r in rs:
            for t in r.get("turns") or []:
                turns.setdefault(t["turn"], []).append(t)
        if turns:
            print("compare-pd: [%s] rate %s turns (mean prompt tokens / median TTFT ms): %s"
                  % (label, rate, "  ".join(
                      "%d: %.0f / %.1f" % (k, median([t["mean_prompt_len"] for t in ts]),
                                           median([t["median_ttft_ms"] for t in ts]))
                      for k, ts in sorted(turns.items()))))


def ratio(mine, other, f):
    # the median over the repeats of mine / other, each repeat with its own; and their range
    vals = []
    for a, b in zip(mine, other):
        x, y = f(a), f(b)
        if x is not None and y:
            vals.append(x / y)
    if not vals:
        return "-"
    m = "%.2f" % statistics.median(vals)
    return m if len(vals) == 1 else "%s (%.2f-%.2f)" % (m, min(vals), max(vals))


# The interval between two order statistics that holds the median of the differences' own
# distribution with at least 95 % confidence (the sign test's: the k-th smallest and k-th largest
# of n, k as large as P(Binomial(n, 1/2) < k) <= 2.5 % allows); None below 6 values.
def median_ci(vals):
    n, below, k = len(vals), 0.0, 0
    while k < n:
        p = math.comb(n, k) / 2 ** n
        if below + p > 0.025:
            break
        below, k = below + p, k + 1
    if k == 0:
        return None
    x = sorted(vals)
    return x[k - 1], x[n - k], 1 - 2 * below


# Each PD setup's median TTFT against colocated's, per rate (issue 17 asks for at most 1 ms more
# at the lightest rate on the CPU): the difference within each turn, their median and range,
# and from 6 turns on the median's confidence interval (this VM's turns spread by +-1.5 ms).
def gap(mine, other, f):
    vals = [f(a) - f(b) for a, b in zip(mine, other) if f(a) is not None and f(b) is not None]
    if not vals:
        return "-"
    m = "%+.2f" % statistics.median(vals)
    if len(vals) == 1:
        return m
    ci = median_ci(vals)
    return "%s (%+.2f to %+.2f%s)" % (m, min(vals), max(vals), "" if ci is None else
                                      "; median within %+.2f to %+.2f at %.1f %% confidence"
                                      % (ci[0], ci[1], 100 * ci[2]))


pd_labels = [label for label, _ in runs if label != "colocated"]
if pd_labels and any(label == "colocated" for label, _ in runs):
    colo = dict(runs)["colocated"]
    print("\ncompare-pd: median TTFT minus colocated's, per rate (ms%s)"
          % ("; medians of the turns' differences (range; from 6 turns the median's interval)"
             if repeats > 1 else ""))
    for rate in rates:
        if not colo.get(rate):
            continue
        parts = ["%s %s" % (label, gap(by[rate], colo[rate], lambda r: r["median_ttft_ms"]))
                 for label, by in runs if label != "colocated" and by.get(rate)]
        if parts:
            print("  rate %-6s %s" % (rate, "; ".join(parts)))

# The reuse variant against each other setup, per rate: goodput (higher is better), the short
# prompts' median TTFT and the KV bytes per request (lower is better).
if any(label == "reuse" for label, _ in runs):
    others = [label for label, _ in runs if label != "reuse"]
    reuse = dict(runs)["reuse"]
    print("\ncompare-pd: reuse (PD with local prefill and decode reuse) against %s, per rate%s"
          % (", ".join(others), "; medians of the repeats' ratios (range)" if repeats > 1 else ""))
    for rate in rates:
        mine = reuse.get(rate)
        if not mine:
            continue
        parts = []
        for o in others:
            rs = dict(runs)[o].get(rate)
            if not rs:
                continue
            p = "goodput reuse/%s %s" % (o, ratio(mine, rs, lambda r: r["request_goodput"]))
            if short_ttft(mine[0]) is not None:
                p += ", short TTFT p50 reuse/%s %s" % (o, ratio(mine, rs, short_ttft))
            if kv_kb(mine[0]) is not None and kv_kb(rs[0]) is not None:
                p += ", KV/req reuse/%s %s" % (o, ratio(mine, rs, kv_kb))
            parts.append(p)
        print("  rate %-6s %s" % (rate, "; ".join(parts)))
# Where PD's first token went: the servers' stage means over each rate's load (pdserve-bench
# --timeline-url), the stages on the first token's path summed against the client's mean TTFT;
# with repeats, each figure's median over them.
for label, by in runs:
    for rate, rs in by.items():
        hs = [r["handover"] for r in rs if r.get("handover")]
        if not hs:
            continue
        print("\ncompare-pd: [%s] rate %s hand-over timeline (servers' means, ms; * = summed%s)"
              % (label, rate, "; medians of %d repeats" % len(hs) if len(hs) > 1 else ""))
        for name in hs[0]["stages_ms"]:
            print("  %-28s %9.3f%s" % (name, median([h["stages_ms"].get(name) for h in hs]),
                                       " *" if name in hs[0]["summed"] else ""))
        ratio_ = median([h["ratio"] for h in hs])
        print("  %-28s %9.3f\n  %-28s %9.3f\n  %-28s %9.3f (%s 10%%)"
              % ("summed", median([h["sum_ms"] for h in hs]), "client mean TTFT",
                 median([h["mean_ttft_ms"] for h in hs]), "summed / TTFT", ratio_,
                 "within" if abs(ratio_ - 1) <= 0.1 else "NOT within"))
# One record per rate for the plot: the repeat of median goodput.
for label, by in runs:
    with open("%s/%s.jsonl" % (plot_dir, label), "w") as f:
        for rate in rates:
            rs = by.get(rate)
            if rs:
                pick = sorted(rs, key=lambda r: r["request_goodput"])[(len(rs) - 1) // 2]
                f.write(json.dumps(pick) + "\n")
EOF
plot_args=()
for f in "${files[@]}"; do plot_args+=("${f%%=*}=$out/plot/${f%%=*}.jsonl"); done
if command -v gnuplot >/dev/null 2>&1; then
    (IFS=,; "$build/bench/pdserve-bench" --plot-from "${plot_args[*]}" --plot "$out/compare.png")
else
    echo "compare-pd: no gnuplot (Debian gnuplot-nox; scripts/setup.sh installs it): no plot" >&2
fi
echo "compare-pd: results in $out (tables *.txt, JSON Lines *.jsonl, per-request *.csv, logs/)"
