#!/usr/bin/env bash
# Installs the Debian packages pdserve builds against (DESIGN.md §6) when they are missing.
# Idempotent and quiet when everything is there; prints every action it takes. Called by the
# Makefile before any build, so a fresh Debian 12 machine needs nothing but this repository.
# It installs nothing from outside Debian's archive; the CUDA toolkit is optional (PD_CUDA).
set -euo pipefail

packages=(
    build-essential cmake pkg-config python3 clang-format
    libcjson-dev          # config.json, safetensors headers, HTTP bodies
    libpcre2-dev          # tokenizer pre-tokenizer regex (Unicode properties)
    libutf8proc-dev       # NFC normalization for tokenizers that ask for it
    libopenblas-dev       # CPU backend matrix products
    libuv1-dev            # daemon event loops
    libh2o-dev            # HTTP front (libuv build)
    libcurl4-openssl-dev  # router upstream client
    libucx-dev            # KV page transfer (ucp)
    libibverbs-dev librdmacm-dev
    libgrpc-dev           # bootstrap service (gRPC core C API)
    libprotobuf-c-dev protobuf-c-compiler
    ucx-utils             # ucx_perftest: bench/xfer's reference in the same run
    gnuplot-nox           # pdserve-bench --plot draws latency/throughput vs request rate
)

missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "setup: all ${#packages[@]} Debian packages present"
    exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        sudo="sudo"
    else
        echo "setup: missing packages: ${missing[*]}" >&2
        echo "setup: not root and no sudo; install them with apt-get and run again" >&2
        exit 1
    fi
fi
echo "setup: missing: ${missing[*]}"
echo "setup: apt-get update"
$sudo apt-get update -q
echo "setup: apt-get install -y ${missing[*]}"
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "setup: done"
