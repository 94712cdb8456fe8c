#!/bin/sh
# gpu-bundle.sh — builds pdserve here with the CUDA backend for the H200 (sm_90a) and packs the
# binaries a GPU run needs with every shared library they load that is not CUDA's own, so the
# GPU machine (which has CUDA 13 but none of our Debian packages, and cannot install any) runs
# them as they are:
#
#   scripts/gpu-bundle.sh [BUILD_DIR]      (default build-bundle)
#
# Writes gpu-bundle/pdserve-gpu.tar.xz (ignored by git; carry it with the device tool:
# carry ["gpu-bundle"]) and gpu-bundle/MANIFEST. scripts/gpu-run.sh unpacks it when present.
# Layout inside (mirrors a build folder, so the test and bench scripts take it as BUILD_DIR):
#   .bin/<name>            the stripped binaries
#   lib/                   their libraries, glibc and its loader included; lib/ucx/ UCX modules
#   prefill/pdserve-prefill, decode/pdserve-decode, router/pdserve-router, tools/pdserve-*,
#   tests/gpu_backend_cuda, tests/gpu_tp_nccl, bench/pdserve-bench-xfer-dev, bench/pdserve-bench
#   (bench/compare-pd.sh's load generator)
#                          wrappers that start the binary through the bundled loader with lib/
#                          first, then the machine's CUDA libraries
# The bundled glibc makes the binaries independent of the GPU image's (possibly older) one;
# libcuda, libcudart, libcublas and libcublasLt come from the machine (same CUDA 13 major).
# NCCL is neither linked nor carried (218 MB): tp_nccl.c opens it with dlopen, and lib/env.sh
# points PDSERVE_NCCL_LIBRARY at the machine's copy (PyTorch's nvidia/nccl/lib) when there is one.
# Fails when the archive exceeds 60 MiB (the device tool carries 64 MiB in all).
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build-bundle}
OUTD="$ROOT/gpu-bundle"
STAGE="$OUTD/stage"
JOBS=${PD_BUNDLE_JOBS:-2}
TARGETS="pdserve-prefill pdserve-decode pdserve-router pdserve-generate pdserve-mkmodel
pdserve-tokenize gpu_backend_cuda gpu_tp_nccl pdserve-bench-xfer-dev pdserve-bench"

cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DPD_WERROR=ON -DPD_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a >/dev/null
# shellcheck disable=SC2086
cmake --build "$BUILD" -j"$JOBS" --target $TARGETS

rm -rf "$STAGE"
mkdir -p "$STAGE/.bin" "$STAGE/lib/ucx" "$STAGE/prefill" "$STAGE/decode" "$STAGE/router" \
    "$STAGE/tools" "$STAGE/tests" "$STAGE/bench"
# name:folder of the wrapper
for e in prefill/pdserve-prefill decode/pdserve-decode router/pdserve-router \
    tools/pdserve-generate tools/pdserve-mkmodel tools/pdserve-tokenize tests/gpu_backend_cuda \
    tests/gpu_tp_nccl bench/pdserve-bench-xfer-dev bench/pdserve-bench; do
    name=$(basename "$e")
    cp "$BUILD/$e" "$STAGE/.bin/$name"
    strip --strip-unneeded "$STAGE/.bin/$name"
    cat >"$STAGE/$e" <<EOF
#!/bin/sh
# wrapper of scripts/gpu-bundle.sh: the bundled loader and libraries, then the machine's CUDA
B=\$(cd "\$(dirname "\$0")/.." && pwd)
. "\$B/lib/env.sh"
exec "\$B/lib/ld-linux-x86-64.so.2" --library-path "\$PD_BUNDLE_LIBPATH" "\$B/.bin/$name" "\$@"
EOF
    chmod +x "$STAGE/$e"
done

# every library the binaries load, except CUDA's (the machine's driver and toolkit)
is_cuda() {
    case "$(basename "$1")" in
    libcuda.so* | libcudart.so* | libcublas.so* | libcublasLt.so* | libnvidia* | libnccl*) return 0 ;;
    esac
    return 1
}
for b in "$STAGE"/.bin/*; do
    ldd "$b" | awk '/=>/ && $3 ~ /^\// {print $3} /^\t\/.*ld-linux/ {print $1}'
done | sort -u | while read -r lib; do
    is_cuda "$lib" && continue
    cp -L "$lib" "$STAGE/lib/"
done
# UCX loads its transports (cma, ib, rdmacm) as modules at run time; ib's libraries are not on
# every machine, and UCX skips a module it cannot load
UCXMOD=$(dirname "$(ldd "$STAGE/.bin/pdserve-prefill" | awk '/libucs.so/ {print $3}')")/ucx
[ -e "$UCXMOD/libuct_cma.so.0" ] && cp -L "$UCXMOD/libuct_cma.so.0" "$STAGE/lib/ucx/"
strip --strip-unneeded "$STAGE"/lib/*.so* "$STAGE"/lib/ucx/*.so* 2>/dev/null || true
[ -e "$STAGE/lib/ld-linux-x86-64.so.2" ] || cp -L /lib64/ld-linux-x86-64.so.2 "$STAGE/lib/"
# NCCL must stay a run-time dlopen (kernels/tp_nccl.c): a binary linking it would not start
# where it is absent, and carrying it would not fit the device tool's 64 MiB
for b in "$STAGE"/.bin/*; do
    if ldd "$b" | grep -q libnccl; then
        echo "gpu-bundle: $(basename "$b") links libnccl; it must be opened with dlopen" >&2
        exit 1
    fi
done

cat >"$STAGE/lib/env.sh" <<'EOF'
# sourced by the wrappers: the library path (bundle first, then the machine's CUDA libraries)
if [ -z "${PD_BUNDLE_LIBPATH:-}" ]; then
    _cl=""
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib \
        /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu \
        /usr/lib64 $(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib \
        /usr/local/lib/python3*/dist-packages/nvidia/*/lib 2>/dev/null); do
        [ -d "$d" ] && _cl="$_cl:$d"
    done
    PD_BUNDLE_LIBPATH="$B/lib$_cl"
    export PD_BUNDLE_LIBPATH
fi
export UCX_MODULE_DIR="${UCX_MODULE_DIR:-$B/lib/ucx}"
# NCCL for --tp-size on --device cuda (opened with dlopen by kernels/tp_nccl.c): the machine's
# copy, PyTorch's first (the GPU image has no libnccl on the loader path)
if [ -z "${PDSERVE_NCCL_LIBRARY:-}" ]; then
    for f in /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2 \
        /usr/local/lib/python3*/dist-packages/nvidia/nccl/lib/libnccl.so.2 \
        /usr/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2 \
        /usr/local/cuda/lib64/libnccl.so.2 /usr/lib/x86_64-linux-gnu/libnccl.so.2; do
        if [ -f "$f" ]; then
            PDSERVE_NCCL_LIBRARY="$f"
            export PDSERVE_NCCL_LIBRARY
            break
        fi
    done
fi
EOF

# xz, not gzip: the binaries share most of their bytes (each links the cuda backend) and xz's
# window sees the repeats; about half gzip's size
rm -f "$OUTD/pdserve-gpu.tar.gz" "$OUTD/pdserve-gpu.tar.xz"
tar -C "$STAGE" -cf - . | xz -T"$JOBS" -6 >"$OUTD/pdserve-gpu.tar.xz"
{
    echo "pdserve GPU bundle, $(git -C "$ROOT" log --oneline -1), built $(date -u)"
    echo "nvcc: $(nvcc --version | tail -1)"
    (cd "$STAGE" && find . -type f | sort | while read -r f; do
        echo "$(wc -c <"$f") $f"
    done)
} >"$OUTD/MANIFEST"
rm -rf "$STAGE"
size=$(wc -c <"$OUTD/pdserve-gpu.tar.xz")
echo "gpu-bundle: $OUTD/pdserve-gpu.tar.xz, $((size / 1048576)) MiB"
if [ "$size" -gt $((60 * 1048576)) ]; then
    echo "gpu-bundle: over 60 MiB; the device tool carries 64 MiB in all" >&2
    exit 1
fi
