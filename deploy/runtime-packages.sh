#!/usr/bin/env bash
# Prints the distribution packages that own the shared libraries the given binaries and UCX's
# transport modules load (ldd, then dpkg -S), one per line. deploy/Dockerfile runs it in the
# build stage and installs exactly these in the runtime stage, so the image holds the runtime
# libraries matching scripts/setup.sh's -dev packages (libucx0, libgrpc29, libh2o0.13, ... on
# Debian 12) and nothing of the build toolchain. UCX's modules (libuct_ib, librdmacm users) are
# loaded with dlopen, which ldd of the binaries alone would miss: they are listed too.
# Usage: deploy/runtime-packages.sh BINARY... > runtime-packages.txt
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 BINARY..." >&2; exit 2; }
ucx_modules=$(ls /usr/lib/*/ucx/*.so /usr/lib/ucx/*.so 2>/dev/null || true)
# shellcheck disable=SC2086 # the module list splits on whitespace by design
for f in "$@" $ucx_modules; do
    ldd "$f" 2>/dev/null || { echo "runtime-packages: ldd $f failed" >&2; exit 1; }
done | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
    while read -r lib; do
        real=$(readlink -f "$lib")
        found=""
        # usrmerge: a library may be registered under /lib while ldd says /usr/lib
        for p in "$lib" "$real" "${lib#/usr}" "${real#/usr}"; do
            pkg=$(dpkg -S "$p" 2>/dev/null | head -n1 | cut -d: -f1) || true
            if [ -n "$pkg" ]; then
                found=$pkg
                break
            fi
        done
        if [ -z "$found" ]; then
            # a library no package owns (e.g. one built here) would be missing at run time
            echo "runtime-packages: no package owns $lib" >&2
            exit 1
        fi
        echo "$found"
    done | sort -u
