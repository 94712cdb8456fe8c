#!/bin/sh
# pdserve-tokenize on the fixture tokenizers: ids as HF tokenizers gives them, decode, JSONL,
# chat rendering, and a clear failure on invalid UTF-8. Usage: tool_tokenize.sh BIN FIXTURES
set -eu
bin=$1
d=$2
check() { # name got want
    if [ "$2" != "$3" ]; then
        printf 'FAIL %s\n  got:  %s\n  want: %s\n' "$1" "$2" "$3" >&2
        exit 1
    fi
}
check encode "$(printf 'Hello world\n' | "$bin" --model-path "$d/llama2")" '1 400 294 313 516 323 896 320 312'
check llama3 "$(printf '<|im_start|>user 123456\n' | "$bin" --model-path "$d/llama3")" \
    '1101 27 91 72 76 62 266 362 83 91 29 595 220 878 19 496'
check decode "$(printf 'Hello world\n' | "$bin" --model-path "$d/llama2" --no-special |
    "$bin" --model-path "$d/llama2" --decode)" 'Hello world'
check jsonl "$(printf '"a\\nb"\n' | "$bin" --model-path "$d/qwen2" --jsonl |
    "$bin" --model-path "$d/qwen2" --decode --jsonl)" '"a\nb"'
# this run's own file: another build's tool_tokenize may run at the same time
chat=$(mktemp "${PD_TEST_TMPDIR:-${TMPDIR:-/tmp}}/pd_tool_chat.XXXXXX")
trap 'rm -f "$chat"' EXIT
printf '[{"role": "user", "content": "Hi"}]' >"$chat"
check chat "$("$bin" --model-path "$d/llama3" --chat "$chat" --jsonl)" \
    '"<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"'
if printf 'bad \303(\n' | "$bin" --model-path "$d/qwen2" 2>/dev/null; then
    echo "FAIL invalid UTF-8 accepted" >&2
    exit 1
fi
echo "tool_tokenize: ok"
