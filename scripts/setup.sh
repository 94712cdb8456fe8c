#!/usr/bin/env bash
# Installs the Debian packages pdserve builds against (DESIGN.md §6) when they are missing.
# Idempotent and quiet when everything is there; prints every action it takes. Called by the
# Makefile before any build, so a fresh Debian 12 machine needs nothing but this repository.
# It installs nothing from outside Debian's archive but pinned test tools from PyPI into the
# ignored .venv-tools/ (kubernetes-validate for the chart tests, sglang-router for the
# compatibility test with SGLang's own router, the Hugging Face libraries and the openai client
# for the interop tests; CMake runs the Python tests with that venv) and, where nvcc is present,
# FlashInfer's CUDA
# headers from its pinned PyPI wheel into the ignored .deps/ (kernels/flashinfer/ builds on them,
# DESIGN.md §6); the CUDA toolkit is optional (PD_CUDA).
set -euo pipefail

packages=(
    build-essential cmake pkg-config python3 clang-format
    libcjson-dev          # config.json, safetensors headers, HTTP bodies
    libpcre2-dev          # tokenizer pre-tokenizer regex (Unicode properties)
    libutf8proc-dev       # NFC normalization for tokenizers that ask for it
    libopenblas-dev       # CPU backend matrix products
    libuv1-dev            # daemon event loops
    libh2o-dev            # HTTP front (libuv build)
    libssl-dev            # TLS of the HTTP listeners (--ssl-certfile; libh2o-dev pulls it too)
    libcurl4-openssl-dev  # router upstream client
    libpng-dev            # PNG images of vision requests (model/vision/image_decode.c)
    libjpeg62-turbo-dev   # JPEG images of vision requests (libjpeg-turbo, as Pillow's wheel)
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
    openssl               # tests/integration/test_tls.py makes its CA and certificates with it
    clang libclang-rt-14-dev # tests/fuzz: libFuzzer (-fsanitize=fuzzer) targets, build-fuzz
    iproute2 util-linux   # tests/integration/netlink.py: ip (TUN devices, links), unshare, nsenter
    prometheus            # promtool check metrics: test_metrics.py promtool (the server is unused)
)
build_only=${PD_SETUP_BUILD_ONLY:-0}
if [ "$build_only" != 1 ]; then
    packages+=("${tool_packages[@]}")
fi

# Test tooling from PyPI, pinned, into the ignored .venv-tools/ of the repository (a venv over
# Debian's python3, which brings python3-numpy); nothing pdserve builds or runs uses them, and
# without network the tests that need them skip (77), which `make test` counts as a failure
# (tests/check_skips.py):
#  - kubernetes-validate: the Kubernetes OpenAPI schemas, for tests/helm;
#  - sglang-router: SGLang's own router (a Rust binary in the wheel), which
#    tests/integration/test_sglang_router.py puts in front of pdserve's daemons;
#  - safetensors, tokenizers, transformers (+ jinja2 for its chat templates): what pdserve-mkmodel
#    writes read by the Hugging Face libraries (tests/python/test_mkmodel_hf.py). transformers
#    runs there without torch (AutoConfig, AutoTokenizer);
#  - torch: transformers' Qwen2-VL / Qwen2.5-VL vision transformers, the reference that
#    tests/python/test_vision_hf.py holds model/vision/'s encoder to. PyPI's wheel is the CUDA
#    build and brings the CUDA runtime libraries (about 5.4 GB, 70 s here); it runs on the CPU;
#  - pillow: transformers' PIL image processor (Qwen2VLImageProcessorPil), the reference that
#    tests/python/test_image_processor_hf.py holds model/vision/'s decoding and resizing to, bit
#    for bit: pinned, since resize results change between Pillow versions (13 changed the order
#    of its two passes, model/vision/image_resample.c);
#  - openai: the official client against the router (tests/integration/test_openai_client.py).
# Their own dependencies are left to pip (about 210 MB and 15 s for these four with theirs).
KUBERNETES_VALIDATE=kubernetes-validate==1.34.1
SGLANG_ROUTER=sglang-router==0.3.2
HF_PINS=(safetensors==0.8.0 tokenizers==0.23.3 transformers==5.24.0 jinja2==3.1.6 pillow==13.0.0)
OPENAI=openai==3.57.0
TORCH=torch==2.15.0
venv_tools() {
    [ "$build_only" != 1 ] || return 0
    local root venv py want=()
    root=$(cd "$(dirname "$0")/.." && pwd)
    venv=$root/.venv-tools
    py=/usr/bin/python3
    [ -x "$py" ] || py=$(command -v python3)
    if [ ! -x "$venv/bin/python" ]; then
        echo "setup: creating $venv (test tooling)"
        "$py" -m venv --system-site-packages "$venv" || {
            echo "setup: warning: could not create $venv; the tests that need it skip" >&2
            return 0
        }
    fi
    "$venv/bin/python" -c 'import kubernetes_validate' 2>/dev/null || want+=("$KUBERNETES_VALIDATE")
    "$venv/bin/python" -c 'import sglang_router.launch_router' 2>/dev/null || want+=("$SGLANG_ROUTER")
    # the Hugging Face set at exactly its pins (installed together: tokenizers must suit
    # transformers), the system's numpy or pip's
    "$venv/bin/python" - "${HF_PINS[@]}" 2>/dev/null <<'PY' || want+=("${HF_PINS[*]}")
import sys
from importlib.metadata import version
import numpy, safetensors.numpy, tokenizers, transformers, jinja2, PIL.Image  # noqa: F401
sys.exit(any(version(p.split("==")[0]) != p.split("==")[1] for p in sys.argv[1:]))
PY
    "$venv/bin/python" -c 'import openai, sys; sys.exit(openai.__version__ != sys.argv[1])' \
        "${OPENAI#*==}" 2>/dev/null || want+=("$OPENAI")
    "$venv/bin/python" -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != sys.argv[1])' \
        "${TORCH#*==}" 2>/dev/null || want+=("$TORCH")
    local pkg
    for pkg in "${want[@]}"; do
        echo "setup: installing $pkg into $venv (test tooling)"
        # shellcheck disable=SC2086 # HF_PINS travels as one word, split here on purpose
        "$venv/bin/pip" install -q --disable-pip-version-check $pkg ||
            echo "setup: warning: could not install $pkg into $venv; the tests that need it" \
                "skip, and make test fails on that skip" >&2
    done
}

# FlashInfer's header-only CUDA templates (attention, sampling) for kernels/flashinfer/: the
# pinned pure-Python wheel, checked against its sha256, unpacked (headers, CUTLASS, the CCCL it
# needs ahead of the toolkit's) into .deps/flashinfer-<version>/, which CMake takes as
# PD_FLASHINFER_DIR. Only where nvcc is found (PD_CUDA's AUTO): a CPU-only machine needs none.
FLASHINFER_VERSION=0.7.2.post1
FLASHINFER_SHA256=bfdc18b9e1e4d8d0730fe4343dc0e284cd0c160086de80f99888bc4867922d49
flashinfer_headers() {
    local root dest tmp whl
    root=$(cd "$(dirname "$0")/.." && pwd)
    dest=$root/.deps/flashinfer-$FLASHINFER_VERSION
    [ -f "$dest/.complete" ] && return 0
    command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || return 0
    echo "setup: fetching flashinfer-python==$FLASHINFER_VERSION (CUDA headers) into $dest"
    tmp=$(mktemp -d)
    if ! python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
        -d "$tmp" "flashinfer-python==$FLASHINFER_VERSION"; then
        rm -rf "$tmp"
        echo "setup: could not download flashinfer-python==$FLASHINFER_VERSION;" \
            "a CUDA build needs it (or configure with -DPD_CUDA=OFF)" >&2
        return 1
    fi
    whl=$(ls "$tmp"/flashinfer_python-*.whl)
    if [ "$(sha256sum "$whl" | cut -d' ' -f1)" != "$FLASHINFER_SHA256" ]; then
        rm -rf "$tmp"
        echo "setup: flashinfer-python wheel does not match its pinned sha256" >&2
        return 1
    fi
    rm -rf "$dest" && mkdir -p "$dest"
    python3 - "$whl" "$dest" <<'PY'
import sys, zipfile
keep = ("flashinfer/data/include/", "flashinfer/data/cutlass/include/",
        "flashinfer/data/cutlass/tools/util/include/", "flashinfer/data/cccl/libcudacxx/include/",
        "flashinfer/data/cccl/cub/", "flashinfer/data/cccl/thrust/", "flashinfer/data/LICENSE",
        "flashinfer_python-")
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith(keep)])
PY
    rm -rf "$tmp"
    touch "$dest/.complete"
}

missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "setup: all ${#packages[@]} Debian packages present"
    flashinfer_headers
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
flashinfer_headers
venv_tools
echo "setup: done"
