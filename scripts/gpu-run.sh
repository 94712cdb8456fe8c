#!/bin/sh
# gpu-run.sh — everything a GPU machine should run for the cuda backend, in one command that
# fits one 10-minute device call: build (Release, sm_90a), the `gpu`-label tests, the kernel
# perf mode, a memcheck pass and the kernels' register/spill report. Results go to OUTDIR.
#
#   scripts/gpu-run.sh [OUTDIR] [--no-perf] [--quick] [--no-sanitizer]
#
# OUTDIR defaults to $OUT (the device tool's result folder), else ./gpu-results.
# PD_GPU_RUN_MINIMAL=1 skips the CMake attempt.
# The full CMake build needs the project's Debian packages (UCX, gRPC, h2o, OpenBLAS, ...); GPU
# images often lack them and cannot install anything, so when configuring fails the script
# builds just what the kernel tests need (kernels/, the backends, the model) straight with nvcc
# and gcc, with a naive sgemm in place of OpenBLAS for the cpu reference.
# Files: summary.txt (one line per stage), build.log, test.log, perf.txt + perf.json,
# memcheck.log, resource-usage.txt, generate.txt (full build only: greedy text cuda vs cpu).
set -u

OUTDIR=""
PERF=1
QUICK=""
SAN=1
for a in "$@"; do
    case "$a" in
    --no-perf) PERF=0 ;;
    --quick) QUICK="--quick" ;;
    --no-sanitizer) SAN=0 ;;
    -*) echo "unknown option $a" >&2; exit 2 ;;
    *) OUTDIR="$a" ;;
    esac
done
[ -n "$OUTDIR" ] || OUTDIR="${OUT:-gpu-results}"
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
JOBS=$(nproc 2>/dev/null || echo 8)
SUMMARY="$OUTDIR/summary.txt"
: >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }

export PATH="/usr/local/cuda/bin:$PATH"
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
CUDA_HOME=$(dirname "$(dirname "$NVCC")")

{
    date -u
    nvidia-smi || true
    "$NVCC" --version || true
    git -C "$ROOT" log --oneline -1 || true
} >"$OUTDIR/env.txt" 2>&1

# ---- build ----
MODE=""
TESTBIN=""
BUILD="$ROOT/build-gpu"
if [ "${PD_GPU_RUN_MINIMAL:-0}" != 1 ] &&
    cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DPD_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a >"$OUTDIR/build.log" 2>&1 &&
    cmake --build "$BUILD" -j"$JOBS" >>"$OUTDIR/build.log" 2>&1; then
    MODE=cmake
    TESTBIN="$BUILD/tests/gpu_backend_cuda"
else
    echo "---- full CMake build failed (missing packages?); minimal build follows ----" \
        >>"$OUTDIR/build.log"
    MODE=minimal
    BUILD="$ROOT/build-gpu-min"
    rm -rf "$BUILD" && mkdir -p "$BUILD/obj"
    GENCODE="-gencode=arch=compute_90a,code=sm_90a"
    CFLAGS="-std=c11 -D_GNU_SOURCE -O2 -g -Wall -Wno-format-truncation -I$ROOT -I$CUDA_HOME/include"
    ok=1
    pids=""
    for f in kernels/*.cu; do
        o="$BUILD/obj/$(basename "$f").o"
        ("$NVCC" -O3 -std=c++17 $GENCODE -lineinfo --expt-relaxed-constexpr -Xptxas -v \
            -I"$ROOT" -c "$f" -o "$o" >"$o.log" 2>&1 || echo "FAILED $f" >"$o.failed") &
        pids="$pids $!"
    done
    for f in kernels/*.c common/backend.c common/backend_cpu.c common/backend_cpu_kernels.c \
        common/backend_cpu_pool.c common/status.c common/alloc.c common/log.c common/dtype.c \
        common/model.c common/kv_pool.c tests/kernels/*.c tests/kernels/compat/cblas_naive.c; do
        o="$BUILD/obj/$(echo "$f" | tr / _).o"
        (gcc $CFLAGS -I"$ROOT/tests/unit" -I"$ROOT/tests/kernels/compat" -c "$f" -o "$o" \
            >"$o.log" 2>&1 || echo "FAILED $f" >"$o.failed") &
        pids="$pids $!"
    done
    for p in $pids; do wait "$p"; done
    cat "$BUILD"/obj/*.log >>"$OUTDIR/build.log" 2>/dev/null
    if ls "$BUILD"/obj/*.failed >/dev/null 2>&1; then
        cat "$BUILD"/obj/*.failed >>"$OUTDIR/build.log"
        ok=0
    fi
    if [ $ok = 1 ] && g++ -o "$BUILD/gpu_backend_cuda" "$BUILD"/obj/*.o -L"$CUDA_HOME/lib64" \
        -L"$CUDA_HOME/lib" -Wl,-rpath,"$CUDA_HOME/lib64" -lcublas -lcublasLt -lcudart -lpthread \
        -lm >>"$OUTDIR/build.log" 2>&1; then
        TESTBIN="$BUILD/gpu_backend_cuda"
    fi
fi
if [ -z "$TESTBIN" ] || [ ! -x "$TESTBIN" ]; then
    say "build: FAILED ($MODE) — see build.log"
    tail -40 "$OUTDIR/build.log"
    exit 1
fi
say "build: ok ($MODE, sm_90a) in $BUILD"

# ---- register / spill report of every kernel ----
if command -v cuobjdump >/dev/null 2>&1; then
    if [ "$MODE" = cmake ]; then
        cuobjdump --dump-resource-usage "$BUILD/kernels/libpdkernels.a" \
            >"$OUTDIR/resource-usage.txt" 2>&1 || true
    else
        for o in "$BUILD"/obj/*.cu.o; do cuobjdump --dump-resource-usage "$o"; done \
            >"$OUTDIR/resource-usage.txt" 2>&1 || true
    fi
    say "resource usage: $(grep -c 'Function' "$OUTDIR/resource-usage.txt" 2>/dev/null) kernels," \
        "$(grep -o 'STACK:[1-9][0-9]*' "$OUTDIR/resource-usage.txt" | wc -l) with stack frames"
fi

# ---- gpu tests ----
if [ "$MODE" = cmake ]; then
    (cd "$BUILD" && ctest -L gpu --output-on-failure -V) >"$OUTDIR/test.log" 2>&1
    rc=$?
else
    "$TESTBIN" >"$OUTDIR/test.log" 2>&1
    rc=$?
fi
case $rc in
0) say "gpu tests: PASS" ;;
77) say "gpu tests: SKIPPED (no device?)" ;;
*) say "gpu tests: FAIL (rc $rc) — see test.log" ;;
esac
grep -E "^(PASS|FAIL|model|SKIP)|checks" "$OUTDIR/test.log" | tee -a "$SUMMARY"

# ---- memcheck of the op and attention tests ----
if [ $SAN = 1 ] && command -v compute-sanitizer >/dev/null 2>&1; then
    for t in attention page_copy argmax rmsnorm; do
        timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 "$TESTBIN" "$t" \
            >>"$OUTDIR/memcheck.log" 2>&1
        say "memcheck $t: rc $?"
    done
fi

# ---- greedy text: --device cuda vs cpu on a tiny random model (full build only) ----
if [ "$MODE" = cmake ] && [ -x "$BUILD/tools/pdserve-mkmodel" ]; then
    M="$BUILD/models/tiny-gpu-run"
    {
        "$BUILD/tools/pdserve-mkmodel" --out "$M" &&
            "$BUILD/tools/pdserve-generate" --model-path "$M" --device cpu --ids \
                --max-new-tokens 24 "The quick brown fox" "Hello" >"$OUTDIR/gen-cpu.txt" &&
            "$BUILD/tools/pdserve-generate" --model-path "$M" --device cuda --ids \
                --max-new-tokens 24 "The quick brown fox" "Hello" >"$OUTDIR/gen-cuda.txt"
    } >"$OUTDIR/generate.txt" 2>&1
    if cmp -s "$OUTDIR/gen-cpu.txt" "$OUTDIR/gen-cuda.txt"; then
        say "generate: cuda greedy text equals cpu"
    else
        say "generate: cuda and cpu differ (see gen-*.txt; bf16 GEMM inputs can flip near-ties)"
    fi
fi

# ---- perf mode ----
if [ $PERF = 1 ]; then
    timeout 420 "$TESTBIN" --perf $QUICK --json "$OUTDIR/perf.json" >"$OUTDIR/perf.txt" 2>&1
    say "perf: rc $? — perf.txt, perf.json"
    cat "$OUTDIR/perf.txt"
fi
say "results in $OUTDIR"
