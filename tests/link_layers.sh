#!/bin/sh
# Each binary links the layers it runs and no more (DESIGN.md §5):
#  - pdserve-router: common/base alone of pdserve — no UCX, gRPC, protobuf-c, OpenBLAS, PCRE2,
#    utf8proc, ibverbs, CUDA, FlashInfer or NCCL library on its ldd list, and no model, backend,
#    tokenizer, chat-template (Jinja), sampling, KV or transfer code among its symbols;
#  - pdserve-tokenize: base + model/tokenizer + model/jinja — none of the transfer, RPC, BLAS or
#    GPU libraries and no model, backend, sampling, KV or transfer code.
# The same checks must find all of it in pdserve-prefill, or they check nothing.
# The libraries depend one way (model/CMakeLists.txt):
#  - libpdmodel.a references no pd_ symbol that it or libpdbase.a does not define: nothing of
#    the daemons (xfer, engine, sched, bootstrap, api: checked by name too), of a backend or of
#    the registry; the same checks must find the backends' constructors in libpdbackends.a and
#    the daemon core's own references in libpdcommon.a;
#  - libpdvision.a (model/vision/: images) references no pd_ symbol but its own and
#    libpdbase.a's: no model, backend or daemon code, so whatever layer turns images into
#    pixel values can link it alone;
#  - no binary or library of the build holds a weak pd_ symbol (a weak reference never pulls an
#    object out of a static library: backends join through the registry's strong ones); the same
#    nm must show pdserve-prefill's weak symbols of the C runtime (__gmon_start__ and the like).
# Usage: link_layers.sh PREFILL ROUTER TOKENIZE LIBPDMODEL LIBPDBASE LIBPDBACKENDS LIBPDCOMMON
#        BUILD_DIR LIBPDVISION
set -eu
export LC_ALL=C # one collation for sort and comm
prefill=$1
router=$2
tokenize=$3
libmodel=$4
libbase=$5
libbackends=$6
libcommon=$7
build=$8
libvision=$9
runtime_libs='lib(ucp|ucs|uct|grpc|gpr|protobuf-c|openblas|blas|ibverbs|cuda|cudart|cublas|cublasLt|nccl|pdflashinfer)[.-]'
text_libs='lib(pcre2-8|utf8proc)[.-]'
daemon_code=' [TtDdRrBb] pd_(model|backend|kv_pool|xfer|bootstrap|sampling)_'
text_code=' [TtDdRrBb] pd_(chat_template|tokenizer)_'
core_refs='^pd_+(xfer|engine|sched|bootstrap|api|daemon)_'
libs() { ldd "$1" | grep -E -o "$2" | sort -u | tr '\n' ' '; }
code() { nm "$1" | grep -E "$2" | sed 's/.* //' | sort | head -5 | tr '\n' ' '; }
# pd_ symbols the archive $1 leaves undefined, of those matching $2
undef() { nm -g --undefined-only "$1" 2>/dev/null | awk '{print $NF}' | grep -E "$2" | sort -u; }
defs() { nm -g --defined-only "$@" 2>/dev/null | awk 'NF == 3 {print $3}' | sort -u; }
# what archive $1 references of pd_ that neither it nor the archives after it define
outside() {
    a=$1
    shift
    undef "$a" '^pd_' >"$tmp/u"
    defs "$a" "$@" >"$tmp/d"
    comm -23 "$tmp/u" "$tmp/d" | head -5 | tr '\n' ' '
}
weak() { nm "$1" 2>/dev/null | grep -E " [wWvV] $2" | sed 's/.* //' | sort -u | head -3 | tr '\n' ' '; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
none() { # what binary list: list must be empty
    if [ -n "$3" ]; then
        printf 'FAIL: %s %s: %s\n' "$(basename "$2")" "$1" "$3" >&2
        fail=1
    fi
}
some() { # what list: the control must find something
    if [ -z "$2" ]; then
        printf 'FAIL: the control shows no %s: the check finds nothing\n' "$1" >&2
        fail=1
    fi
}
some "runtime libraries in pdserve-prefill" "$(libs "$prefill" "$runtime_libs")"
some "text libraries in pdserve-prefill" "$(libs "$prefill" "$text_libs")"
some "daemon code in pdserve-prefill" "$(code "$prefill" "$daemon_code")"
some "tokenizer or template code in pdserve-prefill" "$(code "$prefill" "$text_code")"
none "links" "$router" "$(libs "$router" "$runtime_libs")"
none "links" "$router" "$(libs "$router" "$text_libs")"
none "holds daemon code" "$router" "$(code "$router" "$daemon_code")"
none "holds tokenizer or template code" "$router" "$(code "$router" "$text_code")"
none "links" "$tokenize" "$(libs "$tokenize" "$runtime_libs")"
none "holds daemon code" "$tokenize" "$(code "$tokenize" "$daemon_code")"

# model/ below common/ and the backends: the controls are the registry's references to the
# backends and the daemon core's objects' to one another (daemon.o calling pd_xfer_*, ...)
some "backend references in libpdbackends.a" "$(outside "$libbackends" "$libmodel" "$libbase")"
some "daemon-core references in libpdcommon.a" "$(undef "$libcommon" "$core_refs" | head -1)"
none "references what pdmodel and pdbase do not define" "$libmodel" \
    "$(outside "$libmodel" "$libbase")"
none "references the daemon core" "$libmodel" "$(undef "$libmodel" "$core_refs" | head -5 |
    tr '\n' ' ')"
none "references what pdvision and pdbase do not define" "$libvision" \
    "$(outside "$libvision" "$libbase")"

# no weak pd_ symbol anywhere: every ELF file of the build but CMake's own probes
find "$build" -path '*/CMakeFiles' -prune -o -type f \( -name '*.a' -o -name '*.so*' -o -perm -u+x \) \
    -print >"$tmp/files"
n_elf=0
while read -r f; do
    case $(head -c 4 "$f" | od -An -c | tr -d ' \n') in
    177ELF | '!<ar') ;;
    *) continue ;;
    esac
    n_elf=$((n_elf + 1))
    none "holds weak pd_ symbols" "$f" "$(weak "$f" 'pd_')"
done <"$tmp/files"
some "ELF files under $build" "$(if [ $n_elf -gt 0 ]; then echo $n_elf; fi)"
some "weak symbols of the C runtime in pdserve-prefill" "$(weak "$prefill" '')"

[ $fail = 0 ] && printf 'ok: router %s shared libraries, tokenize %s: only their layers; pdmodel '\
'and pdvision reference only pdbase; no weak pd_ symbol in %s files\n' \
    "$(ldd "$router" | wc -l)" "$(ldd "$tokenize" | wc -l)" "$n_elf"
exit $fail
