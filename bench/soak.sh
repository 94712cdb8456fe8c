#!/usr/bin/env bash
# soak.sh MINUTES [OUTDIR] — a long run of prefill + decode + router on the CPU under steady load,
# to catch what short tests do not: memory that creeps, KV pages that leak, latency that drifts,
# errors that come once an hour (issue 20).
#
# It writes a small random model (pdserve-mkmodel), starts the three processes on 127.0.0.1 (KV
# over UCX shared memory), measures the saturation rate (a closed-loop ramp of pdserve-bench
# --max-concurrency 2, 4, 8, ... until two steps add under 5 % to it), then runs MINUTES of
# open-loop Poisson load at LOAD_FRACTION of it with ShareGPT-like lengths (pdserve-bench
# --dataset-name sharegpt-synthetic), ABORT_FRACTION of the clients closing the stream after a few
# tokens and DISCONNECT_FRACTION dropping the connection (reset) before or while the answer
# streams. Meanwhile soak.py samples every SAMPLE_S seconds the RSS of the three processes and
# prefill's and decode's /metrics (KV tokens in use, queues, counters). When the load ends it
# waits for both pools to empty, stops the processes with SIGTERM, and soak.py writes the report
# (criteria: soak.py's header; docs/benchmarks.md) and exits non-zero when one fails.
#
# OUTDIR (default soak-YYYYmmdd-HHMMSS) gets: report.txt, summary.json, minutes.csv (per-minute
# TTFT/ITL p50/p99 and outcomes), samples.csv (the time series), requests.jsonl (one line per
# request), rss.png, events.txt, config.txt, the ramp's and the load's pdserve-bench output and
# every process log. Knobs (environment, defaults in brackets): BUILD_DIR [build], PYTHON
# [python3], LOAD_FRACTION [0.8], RATE [measured: LOAD_FRACTION x saturation], INPUT_LEN [128]
# and OUTPUT_LEN [96] (mean tokens), ABORT_FRACTION [0.05], DISCONNECT_FRACTION [0.05],
# DISCONNECT_WINDOW_MS [the ramp's median E2E at concurrency 2], SAMPLE_S [5], RAMP_STEP_S [8],
# RAMP_MAX [16] (the ramp's last concurrency), PAGE_RETURN_S [10], JUDGE_LATENCY_MIN [10],
# REQUEST_TIMEOUT_S [120], MODEL_DIR [a new random model in OUTDIR], MAX_TOTAL_TOKENS [8192],
# LOG_LEVEL [info], SEED [1].
set -euo pipefail

if [ $# -lt 1 ] || ! [[ $1 =~ ^[0-9]+([.][0-9]+)?$ ]]; then
    echo "usage: $0 MINUTES [OUTDIR]   (environment knobs: see the header of $0)" >&2
    exit 2
fi
minutes=$1
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
out=${2:-soak-$(date +%Y%m%d-%H%M%S)}
build=$(cd "${BUILD_DIR:-$root/build}" && pwd)
py=${PYTHON:-python3}
load_fraction=${LOAD_FRACTION:-0.8}
input_len=${INPUT_LEN:-128}
output_len=${OUTPUT_LEN:-96}
abort_fraction=${ABORT_FRACTION:-0.05}
disconnect_fraction=${DISCONNECT_FRACTION:-0.05}
sample_s=${SAMPLE_S:-5}
ramp_step_s=${RAMP_STEP_S:-8}
ramp_max=${RAMP_MAX:-16}
page_return_s=${PAGE_RETURN_S:-10}
judge_latency_min=${JUDGE_LATENCY_MIN:-10}
request_timeout_s=${REQUEST_TIMEOUT_S:-120}
max_total_tokens=${MAX_TOTAL_TOKENS:-8192}
log_level=${LOG_LEVEL:-info}
seed=${SEED:-1}
bench=$build/bench/pdserve-bench
for b in "$bench" "$build/prefill/pdserve-prefill" "$build/decode/pdserve-decode" \
    "$build/router/pdserve-router" "$build/tools/pdserve-mkmodel"; do
    [ -x "$b" ] || { echo "soak: $b is missing; build first (make build)" >&2; exit 2; }
done

mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -f "$out"/{events.txt,samples.csv,requests.jsonl,report.txt,summary.json,minutes.csv,rss.png}
rm -f "$out"/ramp-*.jsonl "$out"/{fill,burst,load}.jsonl "$out"/*.log
tool=("$py" "$here/soak.py")

# UCX over shared memory with peer-failure detection (DESIGN.md §6), as the integration tests
export UCX_TLS=${UCX_TLS:-posix,cma} UCX_MM_ERROR_HANDLING=${UCX_MM_ERROR_HANDLING:-y}
export UCX_POSIX_ERROR_HANDLING=${UCX_POSIX_ERROR_HANDLING:-y}

pids=()
names=()
sampler=
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [ -n "$sampler" ]; then kill -TERM "$sampler" 2>/dev/null || true; fi
    for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    if [ -n "$sampler" ]; then wait "$sampler" 2>/dev/null || true; fi
    if [ "$rc" -ne 0 ]; then echo "soak: exit $rc; logs and data in $out" >&2; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

event() { echo "$1 $(date +%s.%N) ${2:-}" >>"$out/events.txt"; }
conf() { echo "$1=$2" >>"$out/config.txt"; }
start() { # name, then the command line
    local name=$1
    shift
    "$@" >"$out/$name.log" 2>&1 &
    pids+=($!)
    names+=("$name")
}

: >"$out/config.txt"
conf started "$(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), $(nproc) CPUs, build $build"
conf minutes "$minutes"

model=${MODEL_DIR:-$out/model}
model_desc="llama, hidden 512, MLP 1536, 6 layers, 4 heads (2 KV), vocab 1024, bf16 (~20M)"
if [ -z "${MODEL_DIR:-}" ]; then
    echo "soak: writing the random model to $model"
    "$build/tools/pdserve-mkmodel" --out "$model" --family llama --shape tiny --hidden-size 512 \
        --intermediate-size 1536 --layers 6 --heads 4 --kv-heads 2 --seed "$seed" \
        >"$out/mkmodel.log" 2>&1
else
    model_desc="$MODEL_DIR"
fi
conf model_desc "$model_desc"

read -r pport bport dport rport <<<"$("${tool[@]}" ports 4 | tr '\n' ' ')"
common=(--model-path "$model" --host 127.0.0.1 --page-size 16 --chunked-prefill-size 256
    --threads 1 --max-total-tokens "$max_total_tokens" --log-level "$log_level")
start prefill "$build/prefill/pdserve-prefill" "${common[@]}" --port "$pport" \
    --disaggregation-mode prefill --disaggregation-bootstrap-port "$bport"
start decode "$build/decode/pdserve-decode" "${common[@]}" --port "$dport" \
    --disaggregation-mode decode
"${tool[@]}" wait-health 120 "http://127.0.0.1:$pport" "http://127.0.0.1:$dport"
start router "$build/router/pdserve-router" --pd-disaggregation --host 127.0.0.1 \
    --port "$rport" --prefill "http://127.0.0.1:$pport" "$bport" \
    --decode "http://127.0.0.1:$dport" --policy round_robin --health-check-interval-secs 1 \
    --log-level "$log_level"
"${tool[@]}" wait-health 60 "http://127.0.0.1:$rport"
url=http://127.0.0.1:$rport
echo "soak: prefill pid ${pids[0]} :$pport, decode pid ${pids[1]} :$dport," \
    "router pid ${pids[2]} :$rport; output in $out"

"${tool[@]}" sample "$out/samples.csv" "$sample_s" prefill="${pids[0]}" decode="${pids[1]}" \
    router="${pids[2]}" -- prefill="http://127.0.0.1:$pport" decode="http://127.0.0.1:$dport" \
    router="$url" &
sampler=$!

dataset=(--backend openai --base-url "$url" --dataset-name sharegpt-synthetic
    --random-input-len "$input_len" --random-output-len "$output_len" --disable-progress)
conf dataset_desc "sharegpt-synthetic lengths (log-normal, sigma 1), means $input_len prompt / \
$output_len output tokens, /v1/completions streamed, ignore_eos"

# ---- saturation: closed loop, doubling the concurrency until two steps in a row add less than
# 5 % to the best requests/s (one noisy step does not end the ramp; each step runs at least 12
# requests and RAMP_STEP_S seconds' worth at the last step's rate), up to RAMP_MAX: on a small
# machine the router and the load generator take the cores the model needs when hundreds of
# streams run, so a rate measured at concurrency 32 (12.7 req/s here) overloaded at 80 % open
# loop (queues grew for the whole run, the router answered 429); at 16 it measured 9.6.
median_e2e_ms=1000
if [ -n "${RATE:-}" ]; then
    rate=$RATE
    conf saturation_rps "(not measured: RATE given)"
else
    best=0 ramp="" prev_rps=0 warm=1 flat=0
    for conc in 2 4 8 16 32 64 128; do
        if [ "$conc" -gt "$ramp_max" ]; then break; fi
        n=$("$py" -c "import math
print(max(12, 3 * $conc, $conc + math.ceil($prev_rps * $ramp_step_s)))")
        "$bench" "${dataset[@]}" --request-rate inf --max-concurrency "$conc" --num-prompts "$n" \
            --seed "$((seed + conc))" --warmup-requests "$warm" \
            --request-timeout "$request_timeout_s" --output-file "$out/ramp-$conc.jsonl" \
            --output-requests "$out/ramp-$conc-requests.jsonl" >>"$out/ramp.log" 2>&1 || {
            echo "soak: the saturation ramp failed at concurrency $conc (ramp.log):" >&2
            tail -n 20 "$out/ramp.log" >&2
            exit 1
        }
        warm=0
        rps=$("${tool[@]}" closed-rps "$out/ramp-$conc-requests.jsonl" "$conc" "$output_len")
        failed=$("${tool[@]}" field "$out/ramp-$conc.jsonl" failed)
        ramp="$ramp $conc:$(printf %.2f "$rps")"
        echo "soak: ramp concurrency $conc: $(printf %.2f "$rps") req/s ($failed failed)"
        if [ "$failed" != "0" ]; then
            echo "soak: $failed requests failed during the ramp (ramp.log)" >&2
            exit 1
        fi
        if [ "$conc" = 2 ]; then # the answer's time at light load: the disconnects' window
            median_e2e_ms=$("${tool[@]}" field "$out/ramp-$conc.jsonl" median_e2e_latency_ms)
        fi
        if "$py" -c "import sys; sys.exit(0 if $rps >= 1.05 * $best else 1)"; then
            flat=0
        else
            flat=$((flat + 1))
        fi
        if "$py" -c "import sys; sys.exit(0 if $rps > $best else 1)"; then best=$rps; fi
        if [ "$flat" -ge 2 ]; then break; fi
        prev_rps=$rps
    done
    rate=$("$py" -c "print('%.3f' % ($best * $load_fraction))")
    conf saturation_rps "$(printf %.2f "$best")"
    conf saturation_ramp "${ramp# }"
fi
window_ms=${DISCONNECT_WINDOW_MS:-$(printf %.0f "$median_e2e_ms")}

# ---- fill the KV pools once: the CPU pools are calloc'd, so a page joins the RSS the first time
# it is written, and lower pages are handed out first; without this, a burst late in the load
# that needs more pages than any before grows decode's RSS for good (a peak, not a leak).
# Prompts of 512 tokens, 1.25 pools' worth at once: decode admits what fits and retracts.
n_fill=$("$py" -c "import math; print(math.ceil(1.25 * $max_total_tokens / 528))")
t_fill=$(date +%s.%N)
# warm WHAT INPUT_LEN OUTPUT_LEN N OUTPUT: N prompts at once; any failure stops the soak
warm() {
    "$bench" --backend sglang --base-url "$url" --dataset-name random --random-input-len "$2" \
        --random-output-len "$3" --random-range-ratio 1 --num-prompts "$4" --request-rate inf \
        --warmup-requests 0 --seed "$seed" --request-timeout "$request_timeout_s" \
        --output-file "$out/$5" --disable-progress >>"$out/fill.log" 2>&1 || {
        echo "soak: $1 failed (fill.log):" >&2
        tail -n 20 "$out/fill.log" >&2
        exit 1
    }
    if [ "$("${tool[@]}" field "$out/$5" failed)" != "0" ]; then
        echo "soak: requests failed in $1 (fill.log)" >&2
        exit 1
    fi
}
: >"$out/fill.log"
warm "filling the pools" 512 16 "$n_fill" fill.jsonl
# and 64 short streams at once: the processes' heaps reach the high-water mark of a burst now,
# so a burst during the load does not read as growth
warm "the burst of 64 streams" 16 64 64 burst.jsonl
echo "soak: filled the KV pools with $n_fill prompts of 512 tokens, then 64 streams at once, in" \
    "$("$py" -c "import time; print('%.1f' % (time.time() - $t_fill))") s"
conf fill "$n_fill prompts of 512 tokens at once (every KV page written once), then 64 short \
streams at once, before the load"
n_load=$("$py" -c "import math; print(max(1, math.ceil($rate * $minutes * 60)))")
conf load_fraction "$load_fraction"
conf rate "$rate"
conf abort_fraction "$abort_fraction"
conf disconnect_fraction "$disconnect_fraction"
conf disconnect_window_ms "$window_ms"
conf page_return_s "$page_return_s"
conf judge_latency_min "$judge_latency_min"
echo "soak: load $rate req/s for $minutes min ($n_load requests), aborts $abort_fraction," \
    "disconnects $disconnect_fraction within $window_ms ms"

# ---- the load
event load_start
"$bench" "${dataset[@]}" --request-rate "$rate" --num-prompts "$n_load" --seed "$seed" \
    --warmup-requests 0 --request-timeout "$request_timeout_s" \
    --abort-fraction "$abort_fraction" --disconnect-fraction "$disconnect_fraction" \
    --disconnect-window-ms "$window_ms" --output-file "$out/load.jsonl" \
    --output-requests "$out/requests.jsonl" >"$out/load.log" 2>&1 || {
    echo "soak: pdserve-bench exited non-zero (load.log); reporting what it measured" >&2
}
event load_end

# ---- the pools must empty once the load stops
if waited=$("${tool[@]}" wait-pages "$page_return_s" "http://127.0.0.1:$pport" \
    "http://127.0.0.1:$dport"); then
    event pages_full "$waited"
else
    event pages_not_full "$waited"
fi
sleep "$sample_s" # one more sample of the idle processes
kill -TERM "$sampler"
wait "$sampler" || true
sampler=

# ---- SIGTERM: router first, then decode, then prefill; each must exit 0
for i in 2 1 0; do
    kill -TERM "${pids[$i]}" 2>/dev/null || true
    for _ in $(seq 600); do kill -0 "${pids[$i]}" 2>/dev/null || break; sleep 0.1; done
    rc=0
    if kill -0 "${pids[$i]}" 2>/dev/null; then
        kill -KILL "${pids[$i]}" 2>/dev/null || true
        rc=hung
    fi
    wait "${pids[$i]}" || { [ "$rc" = hung ] || rc=$?; }
    event "exit_${names[$i]}" "$rc"
done
pids=()

"${tool[@]}" report "$out"
