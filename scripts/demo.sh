#!/usr/bin/env bash
# The README's first command (make demo): prefill/decode disaggregation end to end on one machine.
# Writes a tiny random-weight Llama-3-style model in Hugging Face format, starts pdserve-prefill,
# pdserve-decode and pdserve-router on 127.0.0.1 (CPU backend, KV pages over UCX shared memory),
# streams one chat answer through the router to the terminal with its TTFT and tokens/s, then
# stops all three with SIGTERM and checks they exit 0. Random weights give random text: the
# point is the path (OpenAI request -> router -> prefill computes the prompt's KV -> UCX -> decode
# generates -> tokens stream back). Nothing is left running, on success, error or Ctrl-C.
# Usage: scripts/demo.sh BUILD_DIR [MODEL_DIR]
set -euo pipefail
build=${1:-build}
model=${2:-$build/models/tiny-llama}
logs=$build/demo-logs
mkdir -p "$logs"

# UCX over shared memory, with peer-failure detection that keeps shared memory (DESIGN.md §6)
export UCX_TLS=posix,cma UCX_MM_ERROR_HANDLING=y UCX_POSIX_ERROR_HANDLING=y

pids=()
names=()
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    for i in "${!pids[@]}"; do
        kill -TERM "${pids[$i]}" 2>/dev/null || true
    done
    for i in "${!pids[@]}"; do
        for _ in $(seq 50); do kill -0 "${pids[$i]}" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "${pids[$i]}" 2>/dev/null; then
            echo "demo: ${names[$i]} did not stop on SIGTERM; killing it" >&2
            kill -KILL "${pids[$i]}" 2>/dev/null || true
        fi
        wait "${pids[$i]}" 2>/dev/null || true
    done
    if [ "$rc" -eq 130 ]; then
        echo "demo: interrupted; everything it started is stopped" >&2
    elif [ "$rc" -ne 0 ]; then
        echo "demo: failed (exit $rc); daemon logs:" >&2
        for f in "$logs"/*.log; do echo "--- $f" >&2; tail -n 15 "$f" >&2; done
    fi
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

wait_healthy() { # name, port: /health 200 within 60 s
    python3 - "$1" "$2" <<'EOF'
import sys, time, urllib.request
name, port = sys.argv[1], int(sys.argv[2])
deadline = time.time() + 60
while time.time() < deadline:
    try:
        if urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=2).status == 200:
            sys.exit(0)
    except OSError:
        pass
    time.sleep(0.1)
sys.exit("demo: %s not healthy within 60 s" % name)
EOF
}

echo "demo: writing a tiny random llama model to $model"
"$build/tools/pdserve-mkmodel" --family llama --shape tiny --dtype bf16 --seed 1 --out "$model" \
    >"$logs/mkmodel.log" 2>&1

pport=$(free_port) bport=$(free_port) dport=$(free_port) rport=$(free_port)
common=(--model-path "$model" --host 127.0.0.1 --page-size 16 --chunked-prefill-size 64
    --threads 1 --max-total-tokens 16384 --log-level warning)
echo "demo: starting pdserve-prefill on :$pport (bootstrap :$bport), pdserve-decode on :$dport"
start prefill "$build/prefill/pdserve-prefill" "${common[@]}" --port "$pport" \
    --disaggregation-mode prefill --disaggregation-bootstrap-port "$bport"
start decode "$build/decode/pdserve-decode" "${common[@]}" --port "$dport" \
    --disaggregation-mode decode
wait_healthy prefill "$pport"
wait_healthy decode "$dport"
echo "demo: starting pdserve-router on :$rport"
start router "$build/router/pdserve-router" --pd-disaggregation --host 127.0.0.1 --port "$rport" \
    --prefill "http://127.0.0.1:$pport" "$bport" --decode "http://127.0.0.1:$dport" \
    --policy round_robin --health-check-interval-secs 0.5 --log-level warning
wait_healthy router "$rport"

echo "demo: POST http://127.0.0.1:$rport/v1/chat/completions (stream) — the answer:"
python3 - "$rport" <<'EOF'
import http.client, json, sys, time
port = int(sys.argv[1])
body = {"model": "default", "stream": True, "stream_options": {"include_usage": True},
        "max_tokens": 64, "temperature": 0,
        "messages": [{"role": "user", "content": "Tell me about prefill and decode."}]}
c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
c.request("GET", "/v1/models")
body["model"] = json.loads(c.getresponse().read())["data"][0]["id"]
t0 = time.time()
c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
r = c.getresponse()
if r.status != 200:
    sys.exit("demo: the router answered %d: %s" % (r.status, r.read()[:500].decode()))
ttft = None
usage = None
sys.stdout.write("\n    ")
for line in r:
    line = line.strip()
    if not line.startswith(b"data: "):
        continue
    data = line[6:]
    if data == b"[DONE]":
        break
    ev = json.loads(data)
    if "error" in ev:
        sys.exit("\ndemo: the stream failed: %s" % ev["error"].get("message"))
    usage = ev.get("usage") or usage
    for ch in ev.get("choices", []):
        piece = ch.get("delta", {}).get("content")
        if piece:
            ttft = ttft if ttft is not None else time.time() - t0
            sys.stdout.write(piece.replace("\n", "\n    "))
            sys.stdout.flush()
total = time.time() - t0
n = usage["completion_tokens"] if usage else 0
if not n or ttft is None:
    sys.exit("\ndemo: no tokens came back")
rate = (n - 1) / (total - ttft) if n > 1 and total > ttft else float("nan")
print("\n\ndemo: %d prompt tokens, %d completion tokens; TTFT %.1f ms, %.0f tokens/s after the "
      "first, %.1f ms in all" % (usage["prompt_tokens"], n, ttft * 1e3, rate, total * 1e3))
EOF

echo "demo: stopping router, decode, prefill (SIGTERM)"
for i in 2 1 0; do
    kill -TERM "${pids[$i]}"
    rc=0
    wait "${pids[$i]}" || rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "demo: ${names[$i]} exited $rc after SIGTERM" >&2
        exit 1
    fi
    echo "demo: ${names[$i]} stopped (exit 0)"
    unset "pids[$i]"
done
echo "demo: done (logs in $logs)"
