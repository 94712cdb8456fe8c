#!/bin/sh
# pdserve-router links pdbase alone of pdserve's libraries (DESIGN.md §5): no UCX, gRPC,
# protobuf-c, OpenBLAS, PCRE2, utf8proc, ibverbs, CUDA or NCCL library on its ldd list, and none
# of the model, backend, tokenizer, chat-template (Jinja), sampling, KV or transfer code in its
# symbols. The same checks must find those in pdserve-prefill, or they check nothing.
# Usage: link_router.sh ROUTER PREFILL
set -eu
router=$1
prefill=$2
heavy_libs='lib(ucp|ucs|uct|grpc|gpr|protobuf-c|openblas|blas|pcre2-8|utf8proc|ibverbs|cuda|cudart|cublas|cublasLt|nccl)[.-]'
daemon_code=' [TtDdRrBb] pd_(chat_template|tokenizer|model|backend|kv_pool|xfer|bootstrap|sampling)_'
libs() { ldd "$1" | grep -E -o "$heavy_libs" | sort -u | tr '\n' ' '; }
code() { nm "$1" | grep -E "$daemon_code" | sed 's/.* //' | sort | head -5 | tr '\n' ' '; }
fail=0
if [ -n "$(libs "$router")" ]; then
    printf 'FAIL: pdserve-router links %s\n' "$(libs "$router")" >&2
    fail=1
fi
if [ -n "$(code "$router")" ]; then
    printf 'FAIL: pdserve-router holds daemon code: %s...\n' "$(code "$router")" >&2
    fail=1
fi
# the control: the prefill daemon has both
case "$(libs "$prefill")" in *libucp*) ;; *)
    printf 'FAIL: the check finds no UCX in pdserve-prefill (%s): it checks nothing\n' \
        "$(libs "$prefill")" >&2
    fail=1
    ;;
esac
case "$(code "$prefill")" in *pd_*) ;; *)
    printf 'FAIL: the check finds no daemon code in pdserve-prefill: it checks nothing\n' >&2
    fail=1
    ;;
esac
[ $fail = 0 ] && printf 'ok: pdserve-router: %s, no daemon code (base only)\n' \
    "$(ldd "$router" | wc -l) shared libraries, none of the heavy ones"
exit $fail
