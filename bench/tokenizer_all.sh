#!/bin/sh
# Runs pdserve-bench-tokenizer on every fixture tokenizer and prints each one's encode line.
# Usage, from anywhere: bench/tokenizer_all.sh [BUILD_DIR, default build-rel] [extra flags...]
# Build BUILD_DIR as Release first; a Debug or sanitizer build measures the wrong thing.
# Exits non-zero when any tokenizer misses the target or the bench fails.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build-rel}
[ $# -gt 0 ] && shift
case $build in /*) ;; *) build=$root/$build ;; esac
bin=$build/bench/pdserve-bench-tokenizer
[ -x "$bin" ] || { echo "no $bin: cmake --build $build first" >&2; exit 2; }
status=0
for d in "$root"/tests/fixtures/tokenizers/*/; do
    name=$(basename "$d")
    line=$("$bin" --model-path "$d" --corpus "$root/tests/fixtures/tokenizer_corpus.jsonl" "$@" |
        grep '^encode') || { echo "$name: bench failed" >&2; status=1; continue; }
    printf '%-8s %s\n' "$name" "$line"
    case $line in *PASS) ;; *) status=1 ;; esac
done
exit $status
