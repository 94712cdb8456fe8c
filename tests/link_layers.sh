#!/bin/sh
# Each binary links the layers it runs and no more (DESIGN.md §5):
#  - pdserve-router: common/base alone of pdserve — no UCX, gRPC, protobuf-c, OpenBLAS, PCRE2,
#    utf8proc, ibverbs, CUDA or NCCL library on its ldd list, and no model, backend, tokenizer,
#    chat-template (Jinja), sampling, KV or transfer code among its symbols;
#  - pdserve-tokenize: base + model/tokenizer + model/jinja — none of the transfer, RPC, BLAS or
#    GPU libraries and no model, backend, sampling, KV or transfer code.
# The same checks must find all of it in pdserve-prefill, or they check nothing.
# Usage: link_layers.sh PREFILL ROUTER TOKENIZE
set -eu
prefill=$1
router=$2
tokenize=$3
runtime_libs='lib(ucp|ucs|uct|grpc|gpr|protobuf-c|openblas|blas|ibverbs|cuda|cudart|cublas|cublasLt|nccl)[.-]'
text_libs='lib(pcre2-8|utf8proc)[.-]'
daemon_code=' [TtDdRrBb] pd_(model|backend|kv_pool|xfer|bootstrap|sampling)_'
text_code=' [TtDdRrBb] pd_(chat_template|tokenizer)_'
libs() { ldd "$1" | grep -E -o "$2" | sort -u | tr '\n' ' '; }
code() { nm "$1" | grep -E "$2" | sed 's/.* //' | sort | head -5 | tr '\n' ' '; }
fail=0
none() { # what binary list: list must be empty
    if [ -n "$3" ]; then
        printf 'FAIL: %s %s: %s\n' "$(basename "$2")" "$1" "$3" >&2
        fail=1
    fi
}
some() { # what list: the control must find something
    if [ -z "$2" ]; then
        printf 'FAIL: pdserve-prefill shows no %s: the check finds nothing\n' "$1" >&2
        fail=1
    fi
}
some "runtime libraries" "$(libs "$prefill" "$runtime_libs")"
some "text libraries" "$(libs "$prefill" "$text_libs")"
some "daemon code" "$(code "$prefill" "$daemon_code")"
some "tokenizer or template code" "$(code "$prefill" "$text_code")"
none "links" "$router" "$(libs "$router" "$runtime_libs")"
none "links" "$router" "$(libs "$router" "$text_libs")"
none "holds daemon code" "$router" "$(code "$router" "$daemon_code")"
none "holds tokenizer or template code" "$router" "$(code "$router" "$text_code")"
none "links" "$tokenize" "$(libs "$tokenize" "$runtime_libs")"
none "holds daemon code" "$tokenize" "$(code "$tokenize" "$daemon_code")"
[ $fail = 0 ] && printf 'ok: router %s shared libraries, tokenize %s: only their layers\n' \
    "$(ldd "$router" | wc -l)" "$(ldd "$tokenize" | wc -l)"
exit $fail
