#!/usr/bin/env bash
# bench/compare-pd.sh — colocated vs prefill/decode disaggregation, the same load on one machine.
# (a) colocated: one pdserve-decode --disaggregation-mode null serving alone;
# (b) disaggregated: 1 pdserve-prefill + 1 pdserve-decode + pdserve-router (KV over UCX shm).
# Each gets the same pdserve-bench run: random prompts of INPUT_LEN tokens, OUTPUT_LEN output
# tokens (exact: ignore_eos), a request-rate sweep, the same seed. Prints both tables, then TTFT
# and ITL percentiles, throughput and goodput side by side, and draws OUT_DIR/compare.png. The PD
# run also reads the router's and the decode's hand-over stages (pdserve-bench --timeline-url)
# and prints, per rate, where PD's time to first token went and how the stages add up to it.
# Both setups get the same CPU threads in all (colocated: 2 x THREADS in its one daemon; PD:
# THREADS in each of its two), so the comparison is per machine, not per process.
# Nothing is left running, on success, error or Ctrl-C.
#
# Usage: bench/compare-pd.sh [BUILD_DIR [MODEL_DIR]]     (default build, a tiny model made here)
# Environment (defaults in brackets):
#   RATES [8,16,32,64,inf]  request rates (req/s) of the sweep (around where the tiny CPU model
#                     saturates); inf = all at once
#   NUM_PROMPTS [128] requests per rate    INPUT_LEN [1024]   OUTPUT_LEN [128]
#   SLO_TTFT_MS [200] SLO_TPOT_MS [10]      goodput counts requests meeting both
#   DEVICE [cpu]      --device of the daemons (cuda on a GPU machine)
#   THREADS [1]       CPU threads per PD daemon; COLOCATED_THREADS [2 x THREADS]
#   MAX_TOTAL_TOKENS [65536]  KV pool of each daemon   CHUNK [512] --chunked-prefill-size
#   ONLY [both]       colocated | pd: run one half only
#   PREFILL_FLAGS []  more flags for pdserve-prefill (e.g. --eager-prefill=false)
#   ROUTER_FLAGS []   more flags for pdserve-router (e.g. --local-prefill-max-tokens 256)
#   OUT_DIR [BUILD_DIR/compare-pd]  tables, JSON Lines, CSV, logs and compare.png
set -euo pipefail
build=${1:-build}
model=${2:-}
rates=${RATES:-8,16,32,64,inf}
num_prompts=${NUM_PROMPTS:-128}
input_len=${INPUT_LEN:-1024}
output_len=${OUTPUT_LEN:-128}
slo_ttft=${SLO_TTFT_MS:-200}
slo_tpot=${SLO_TPOT_MS:-10}
device=${DEVICE:-cpu}
threads=${THREADS:-1}
colo_threads=${COLOCATED_THREADS:-$((2 * threads))}
max_total=${MAX_TOTAL_TOKENS:-65536}
chunk=${CHUNK:-512}
only=${ONLY:-both}
read -r -a prefill_flags <<<"${PREFILL_FLAGS:-}"
read -r -a router_flags <<<"${ROUTER_FLAGS:-}"
out=${OUT_DIR:-$build/compare-pd}
logs=$out/logs
mkdir -p "$logs"
case $only in both | colocated | pd) ;; *)
    echo "compare-pd: ONLY must be both, colocated or pd (got '$only')" >&2
    exit 2
    ;;
esac
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

if [ -z "$model" ]; then
    model=$build/models/tiny-llama
    echo "compare-pd: writing a tiny random llama model to $model"
    "$build/tools/pdserve-mkmodel" --family llama --shape tiny --dtype bf16 --seed 1 \
        --out "$model" >"$logs/mkmodel.log" 2>&1
fi

common=(--model-path "$model" --host 127.0.0.1 --device "$device" --page-size 16
    --chunked-prefill-size "$chunk" --max-total-tokens "$max_total" --log-level warning)

run_bench() { # label, port, then extra pdserve-bench flags
    local label=$1 port=$2
    shift 2
    echo "compare-pd: [$label] pdserve-bench: random $input_len in / $output_len out," \
        "$num_prompts prompts per rate, rates $rates"
    "$build/bench/pdserve-bench" --backend sglang --base-url "http://127.0.0.1:$port" \
        --dataset-name random --random-input-len "$input_len" --random-output-len "$output_len" \
        --random-range-ratio 1 --num-prompts "$num_prompts" --request-rate-sweep "$rates" \
        --seed 1 --warmup-requests 2 --slo-ttft-ms "$slo_ttft" --slo-tpot-ms "$slo_tpot" \
        --output-file "$out/$label.jsonl" --output-csv "$out/$label.csv" \
        --plot-label "$label" "$@" | tee "$out/$label.txt"
}

if [ "$only" != pd ]; then
    port=$(free_port)
    echo "compare-pd: [colocated] pdserve-decode --disaggregation-mode null on :$port" \
        "($colo_threads threads)"
    start colocated "$build/decode/pdserve-decode" "${common[@]}" --port "$port" \
        --threads "$colo_threads" --disaggregation-mode null
    if ! wait_healthy colocated "$port" "${pids[0]}"; then
        echo "compare-pd: colocated mode (pdserve-decode --disaggregation-mode null) is not" \
            "available in this build; run ONLY=pd for the disaggregated half alone" >&2
        exit 1
    fi
    run_bench colocated "$port"
    stop_all
fi

if [ "$only" != colocated ]; then
    pport=$(free_port) bport=$(free_port) dport=$(free_port) rport=$(free_port)
    echo "compare-pd: [pd] pdserve-prefill :$pport (bootstrap :$bport), pdserve-decode :$dport," \
        "pdserve-router :$rport ($threads threads per daemon)"
    start prefill "$build/prefill/pdserve-prefill" "${common[@]}" --port "$pport" \
        --threads "$threads" --disaggregation-mode prefill --disaggregation-bootstrap-port "$bport" \
        ${prefill_flags[@]+"${prefill_flags[@]}"}
    start decode "$build/decode/pdserve-decode" "${common[@]}" --port "$dport" \
        --threads "$threads" --disaggregation-mode decode
    wait_healthy prefill "$pport" "${pids[0]}"
    wait_healthy decode "$dport" "${pids[1]}"
    # no router admission limit (its default, 256 in flight, answered 128 of 384 requests sent
    # at once with 429 on the GPU): the colocated daemon has none, so both halves take the load
    start router "$build/router/pdserve-router" --pd-disaggregation --host 127.0.0.1 \
        --port "$rport" --prefill "http://127.0.0.1:$pport" "$bport" \
        --decode "http://127.0.0.1:$dport" --policy round_robin --max-concurrent-requests 0 \
        --log-level warning ${router_flags[@]+"${router_flags[@]}"}
    wait_healthy router "$rport" "${pids[2]}"
    run_bench pd "$rport" --timeline-url "http://127.0.0.1:$rport,http://127.0.0.1:$dport"
    stop_all
fi

# Side by side, from the JSON Lines both runs wrote.
files=()
[ "$only" != pd ] && files+=("colocated=$out/colocated.jsonl")
[ "$only" != colocated ] && files+=("pd=$out/pd.jsonl")
python3 - "${files[@]}" <<'EOF'
import json, sys
runs = []
for arg in sys.argv[1:]:
    label, path = arg.split("=", 1)
    with open(path) as f:
        runs.append((label, [json.loads(x) for x in f if x.strip()]))
slo = runs[0][1][0]
print("\ncompare-pd: side by side (ms; goodput = req/s meeting TTFT <= %g ms and TPOT <= %g ms)"
      % (slo["slo_ttft_ms"], slo["slo_tpot_ms"]))
cols = [("TTFT p50", "median_ttft_ms"), ("TTFT p99", "p99_ttft_ms"),
        ("ITL p50", "median_itl_ms"), ("ITL p99", "p99_itl_ms"), ("TPOT p50", "median_tpot_ms"),
        ("E2E p50", "median_e2e_latency_ms"), ("req/s", "request_throughput"),
        ("out tok/s", "output_throughput"), ("goodput", "request_goodput"), ("failed", "failed")]
head = "%-6s %-10s" % ("rate", "setup") + "".join("%11s" % c for c, _ in cols)
print(head)
print("-" * len(head))
rates = []
for _, rs in runs:
    for r in rs:
        if r["request_rate"] not in rates:
            rates.append(r["request_rate"])
for rate in rates:
    for label, rs in runs:
        for r in rs:
            if r["request_rate"] == rate:
                print("%-6s %-10s" % (rate, label) +
                      "".join("%11.2f" % r[k] if isinstance(r[k], float) else "%11s" % r[k]
                              for _, k in cols))
# Where PD's first token went: the servers' stage means over each rate's load (pdserve-bench
# --timeline-url), the stages on the first token's path summed against the client's mean TTFT.
for label, rs in runs:
    for r in rs:
        h = r.get("handover")
        if not h:
            continue
        print("\ncompare-pd: [%s] rate %s hand-over timeline (servers' means, ms; * = summed)"
              % (label, r["request_rate"]))
        for name, ms in h["stages_ms"].items():
            print("  %-28s %9.3f%s" % (name, ms, " *" if name in h["summed"] else ""))
        print("  %-28s %9.3f\n  %-28s %9.3f\n  %-28s %9.3f (%s 10%%)"
              % ("summed", h["sum_ms"], "client mean TTFT", h["mean_ttft_ms"], "summed / TTFT",
                 h["ratio"], "within" if abs(h["ratio"] - 1) <= 0.1 else "NOT within"))
EOF
plot_args=()
for f in "${files[@]}"; do plot_args+=("$f"); done
if command -v gnuplot >/dev/null 2>&1; then
    (IFS=,; "$build/bench/pdserve-bench" --plot-from "${plot_args[*]}" --plot "$out/compare.png")
else
    echo "compare-pd: no gnuplot (Debian gnuplot-nox; scripts/setup.sh installs it): no plot" >&2
fi
echo "compare-pd: results in $out (tables *.txt, JSON Lines *.jsonl, per-request *.csv, logs/)"
