#!/usr/bin/env bash
# Installs the Debian packages pdserve builds against (DESIGN.md §6) when they are missing.
# Idempotent and quiet when everything is there; prints every action it takes. Called by the
# Makefile before any build, so a fresh Debian 12 machine needs nothing but this repository.
# It installs nothing from outside Debian's archive but one pinned test tool (kubernetes-validate,
# PyPI, into the ignored .venv-tools/, for the chart tests); the CUDA toolkit is optional (PD_CUDA).
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
# Test tooling only, left out where PD_SETUP_BUILD_ONLY=1 (deploy/Dockerfile's build stage).
tool_packages=(
    # chart tests (tests/helm): the Go renderer of deploy/helm/render (text/template + Sprig,
    # built in GOPATH mode from these packaged sources), schema checks and YAML lint
    golang-go golang-github-masterminds-sprig-dev golang-gopkg-yaml.v3-dev
    python3-yaml python3-jsonschema yamllint python3-venv
    python3-numpy         # tests/python/test_sliding_window_ref.py: the numpy reference forward
)
build_only=${PD_SETUP_BUILD_ONLY:-0}
if [ "$build_only" != 1 ]; then
    packages+=("${tool_packages[@]}")
fi

# kubernetes-validate (the Kubernetes OpenAPI schemas, for tests/helm) is the one thing taken
# from PyPI, pinned, into the ignored .venv-tools/ of the repository; it is test tooling only,
# nothing pdserve builds or runs uses it. Without network the chart test skips that check (77).
KUBERNETES_VALIDATE=kubernetes-validate==1.34.1
venv_tools() {
    [ "$build_only" != 1 ] || return 0
    local root venv
    root=$(cd "$(dirname "$0")/.." && pwd)
    venv=$root/.venv-tools
    if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import kubernetes_validate' 2>/dev/null; then
        return 0
    fi
    local py=/usr/bin/python3
    [ -x "$py" ] || py=$(command -v python3)
    echo "setup: creating $venv with $KUBERNETES_VALIDATE (chart test tooling)"
    if ! { "$py" -m venv --system-site-packages "$venv" &&
        "$venv/bin/pip" install -q --disable-pip-version-check "$KUBERNETES_VALIDATE"; }; then
        echo "setup: warning: could not install $KUBERNETES_VALIDATE into $venv; the chart" \
            "test skips its Kubernetes schema check" >&2
    fi
}

missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "setup: all ${#packages[@]} Debian packages present"
    venv_tools
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
venv_tools
echo "setup: done"
