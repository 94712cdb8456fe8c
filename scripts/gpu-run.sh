#!/bin/sh
# gpu-run.sh — everything a GPU machine should run for the cuda backend: build (Release,
# sm_90a) or take the prebuilt bundle, the `gpu`-label tests, --device cuda on the daemons, the
# disaggregated path on the GPU (prefill + decode processes + router vs pdserve-generate), the
# KV page transfer rate, the kernel/model perf mode (bench/gpu), the PyTorch baseline (its
# kernels on the perf mode's shapes, and transformers), colocated vs disaggregated serving under
# load (bench/compare-pd.sh), a memcheck pass and the kernels' register/spill report. Results go
# to OUTDIR.
#
#   scripts/gpu-run.sh [OUTDIR] [--no-perf] [--quick] [--no-sanitizer] [--only STAGES]
#
# STAGES: comma list of tests,memcheck,generate,device,disagg,xfer,perf,torch,compare (default:
# all). Device calls of 10 minutes (the bundle saves the build):
#   1) scripts/gpu-run.sh --only tests,device,generate,disagg,xfer        (about 5 min)
#   2) scripts/gpu-run.sh --only perf,torch,memcheck                      (about 7 min)
#   issue 21 (pdserve vs PyTorch, one run):
#      scripts/gpu-run.sh --only tests,perf,torch,disagg,compare --quick  (under 10 min)
# (each stage has its own timeout; estimates, not yet measured on the H200; compare's is
# PD_COMPARE_TIMEOUT, 210 s for both halves, cut to what is left of PD_GPU_RUN_BUDGET, 570 s
# from the start of this script, so that a run fits one 10-minute device call)
# With the device tool: scripts/gpu-bundle.sh here first, then run(carry ["gpu-bundle"]).
# OUTDIR defaults to $OUT (the device tool's result folder), else ./gpu-results.
# gpu-bundle/pdserve-gpu.tar.gz (or .tar.xz; scripts/gpu-bundle.sh) present: it is unpacked and
# used, no build (PD_GPU_RUN_BUNDLE=0 ignores it). PD_GPU_RUN_MINIMAL=1 skips the CMake attempt.
# The full CMake build needs the project's Debian packages (UCX, gRPC, h2o, OpenBLAS, ...); GPU
# images often lack them and cannot install anything, so when configuring fails the script
# builds just what the kernel tests need (kernels/, the backends, the model) straight with nvcc
# and gcc, with a naive sgemm in place of OpenBLAS for the cpu reference; it needs FlashInfer's
# headers in .deps/ (scripts/setup.sh), which a GPU machine without network lacks: use the bundle.
# Files: summary.txt (one line per stage, then the tables of scripts/gpu_results.py),
# results.json (everything merged, with issue 21's "ratios"), perf.txt, test.log and
# logs.tar.gz: the device tool brings back 8 files at most, so at the end (also on an early
# exit) every other file is packed into logs.tar.gz and removed (model weights left out):
# build.log, perf.json, memcheck.log, resource-usage.txt, generate.txt and gen-*.txt (greedy text
# cuda vs cpu, fp32 and fp8 KV), device.log, disagg.json + disagg.log + disagg-*/, xfer.json +
# xfer-ucx.json + xfer.txt, torch.json + torch.log, compare.txt + compare/ (compare-pd.sh's
# tables, JSON Lines, CSV and daemon logs), env.txt. That packing happens where OUTDIR is the
# device tool's $OUT (or with PD_GPU_RUN_PACK=1, never in the repository); elsewhere, or with
# PD_GPU_RUN_PACK=0, the files stay loose.
set -u
START=$(date +%s)

OUTDIR=""
PERF=1
QUICK=""
SAN=1
ONLY="tests,memcheck,generate,device,disagg,xfer,perf,torch,compare"
want_only=0
for a in "$@"; do
    if [ $want_only = 1 ]; then
        ONLY="$a"
        want_only=0
        continue
    fi
    case "$a" in
    --no-perf) PERF=0 ;;
    --quick) QUICK="--quick" ;;
    --no-sanitizer) SAN=0 ;;
    --only) want_only=1 ;;
    -*) echo "unknown option $a" >&2; exit 2 ;;
    *) OUTDIR="$a" ;;
    esac
done
stage() { case ",$ONLY," in *",$1,"*) return 0 ;; esac; return 1; }
[ -n "$OUTDIR" ] || OUTDIR="${OUT:-gpu-results}"
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
JOBS=$(nproc 2>/dev/null || echo 8)
SUMMARY="$OUTDIR/summary.txt"
: >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }

# At the end, also on an early exit: every file but these five goes into logs.tar.gz (the device
# tool brings back 8 files, 16 MiB each), without model weights; a tarball over 15 MiB is made
# again with the last 256 KiB (FILE.tail) of each file over 1 MiB in place of the file (named
# in logs-left-out.txt inside it). Only in a folder of results: the device tool's $OUT, or any
# with PD_GPU_RUN_PACK=1 except the repository, a git checkout, / and $HOME.
KEEP="summary.txt results.json perf.txt test.log logs.tar.gz"
PACK=${PD_GPU_RUN_PACK:-auto}
if [ "$PACK" = auto ]; then
    PACK=0
    [ -n "${OUT:-}" ] && [ "$OUTDIR" = "$(cd "$OUT" 2>/dev/null && pwd)" ] && PACK=1
fi
case "$OUTDIR" in "$ROOT" | "$ROOT"/ | / | "${HOME:-/}") PACK=0 ;; esac
[ -e "$OUTDIR/.git" ] && PACK=0
pack_logs() {
    [ "$PACK" = 1 ] || return 0
    lst="$OUTDIR/.pack-list"
    tgz="$OUTDIR/.logs.tar.gz"
    (
        cd "$OUTDIR" || exit 1
        for f in * .[!.]*; do
            [ -e "$f" ] || continue
            case " $KEEP .pack-list .logs.tar.gz " in *" $f "*) continue ;; esac
            echo "$f"
        done >"$lst"
        [ -s "$lst" ] || exit 0
        tarz() { tar -czf "$tgz" --exclude='*.safetensors' --exclude='disagg-*/model' "$@"; }
        tarz -T "$lst" || exit 1
        if [ "$(wc -c <"$tgz")" -gt $((15 * 1048576)) ]; then
            find . -type f -size +1024k ! -name '*.safetensors' ! -path './disagg-*/model/*' |
                sed 's|^\./||' |
                grep -v -x -e summary.txt -e results.json -e perf.txt -e test.log \
                    -e .logs.tar.gz >logs-left-out.txt
            echo logs-left-out.txt >>"$lst"
            while read -r f; do
                tail -c 262144 "$f" >"$f.tail"
                case $f in */*) ;; *) echo "$f.tail" >>"$lst" ;; esac
            done <logs-left-out.txt
            tarz -X logs-left-out.txt -T "$lst" || exit 1
        fi
        # shellcheck disable=SC2046
        rm -rf $(cat "$lst")
        mv "$tgz" logs.tar.gz
    ) || echo "pack: could not pack the logs; they stay loose" >&2
    rm -f "$lst" "$tgz"
}
trap pack_logs EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

export PATH="/usr/local/cuda/bin:$PATH"
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
CUDA_HOME=$(dirname "$(dirname "$NVCC")")

{
    date -u
    nvidia-smi || true
    "$NVCC" --version || true
    git -C "$ROOT" log --oneline -1 || true
} >"$OUTDIR/env.txt" 2>&1

# ---- build (or the prebuilt bundle) ----
MODE=""
TESTBIN=""
BUILD="$ROOT/build-gpu"
BUNDLE="$ROOT/gpu-bundle/pdserve-gpu.tar.gz"
# an xz-compressed bundle (about half the size) is taken as well: tar finds the compression
[ -f "$BUNDLE" ] || BUNDLE="$ROOT/gpu-bundle/pdserve-gpu.tar.xz"
if [ "${PD_GPU_RUN_BUNDLE:-1}" = 1 ] && [ -f "$BUNDLE" ]; then
    MODE=bundle
    BUILD=/tmp/pdserve-bundle
    rm -rf "$BUILD" && mkdir -p "$BUILD" && { tar -C "$BUILD" -xf "$BUNDLE" ||
        "$(command -v python3 || echo python3)" -c 'import sys, tarfile
tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$BUNDLE" "$BUILD"; } >"$OUTDIR/build.log" 2>&1
    cat "$ROOT/gpu-bundle/MANIFEST" >>"$OUTDIR/build.log" 2>/dev/null
    TESTBIN="$BUILD/tests/gpu_backend_cuda"
elif [ "${PD_GPU_RUN_MINIMAL:-0}" != 1 ] &&
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
    # FlashInfer's instantiations (kernels/flashinfer/, linked in here, not as a shared library)
    # need the headers scripts/setup.sh unpacks into .deps/; a GPU machine has no network to fetch
    # them, and they are too large to carry: without them the minimal build cannot link
    FI="$ROOT/.deps/flashinfer-0.7.2.post1/flashinfer/data"
    if [ -d "$FI/include" ]; then
        for f in kernels/flashinfer/*.cu; do
            o="$BUILD/obj/fi_$(basename "$f").o"
            ("$NVCC" -O3 -std=c++17 $GENCODE --expt-relaxed-constexpr --expt-extended-lambda \
                -I"$ROOT" -I"$FI/cccl/libcudacxx/include" -I"$FI/cccl/cub" \
                -I"$FI/cccl/thrust" -I"$FI/include" -I"$FI/cutlass/include" \
                -I"$FI/cutlass/tools/util/include" -c "$f" -o "$o" >"$o.log" 2>&1 ||
                echo "FAILED $f" >"$o.failed") &
            pids="$pids $!"
        done
    else
        echo "FAILED kernels/flashinfer: no FlashInfer headers in $FI (scripts/setup.sh puts" \
            "them there; on a GPU machine use scripts/gpu-bundle.sh's bundle instead)" \
            >"$BUILD/obj/flashinfer.failed"
    fi
    # one test binary (test_tp_cuda.c has its own main and needs the daemons' tp group, and
    # tp_nccl.c NCCL's header: both are the full build's); the backend registry with its cuda
    # entry (PD_HAVE_CUDA, as model/CMakeLists.txt sets it; no PD_HAVE_NCCL without tp_nccl.c)
    CFLAGS="$CFLAGS -DPD_HAVE_CUDA=1"
    for f in $(ls kernels/*.c | grep -v tp_nccl.c) model/backend.c model/backend_reg.c \
        model/devmem.c model/cpu/backend_cpu.c model/cpu/backend_cpu_kernels.c \
        model/cpu/backend_cpu_pool.c common/base/status.c common/base/alloc.c common/base/log.c \
        model/dtype.c model/model.c model/kv_pool.c model/sampling.c \
        tests/kernels/test_backend_cuda.c tests/kernels/bench_gpu.c \
        tests/kernels/compat/cblas_naive.c; do
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
FULL=0 # the daemons, router and tools are there
[ "$MODE" = minimal ] || FULL=1
TPBIN="$BUILD/tests/gpu_tp_nccl"
[ "$MODE" = minimal ] && TPBIN=""

# Is there a GPU the backend can use? The test binary with no test selected starts both
# backends and exits 0, or says why it cannot (77): every later stage then still runs (each
# must fail fast, naming the missing device) and the summary says "no GPU" up front.
NOGPU=""
probe=$(timeout 60 "$TESTBIN" __probe__ 2>&1)
case $? in
0) say "gpu: $(echo "$probe" | grep -m1 '^gpu backend:' || echo 'present')" ;;
*)
    NOGPU=$(echo "$probe" | grep -m1 . || echo "the probe printed nothing")
    say "gpu: NONE — no GPU ($NOGPU); the stages below only check that they fail fast"
    ;;
esac
nogpu_note() { [ -n "$NOGPU" ] && echo " [no GPU]"; }

# NCCL (--tp-size on --device cuda) is opened with dlopen: the machine's copy, PyTorch's first
if [ -z "${PDSERVE_NCCL_LIBRARY:-}" ]; then
    for f in /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2 \
        /usr/local/lib/python3*/dist-packages/nvidia/nccl/lib/libnccl.so.2 \
        /usr/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2 \
        /usr/local/cuda/lib64/libnccl.so.2 /usr/lib/x86_64-linux-gnu/libnccl.so.2; do
        if [ -f "$f" ]; then
            export PDSERVE_NCCL_LIBRARY="$f"
            break
        fi
    done
fi
say "nccl: ${PDSERVE_NCCL_LIBRARY:-none found (tp over NCCL will skip)}"
# UCX between the daemons of this node: shared memory, with the error handling our endpoints need
export UCX_TLS="${UCX_TLS:-posix,cma,tcp}" UCX_MM_ERROR_HANDLING=y UCX_POSIX_ERROR_HANDLING=y
PY=$(command -v python3 || echo python3)

# ---- register / spill report of every kernel ----
if command -v cuobjdump >/dev/null 2>&1; then
    if [ "$MODE" = bundle ]; then
        cuobjdump --dump-resource-usage "$BUILD/.bin/gpu_backend_cuda" \
            >"$OUTDIR/resource-usage.txt" 2>&1 || true
    elif [ "$MODE" = cmake ]; then
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
rc=0
if ! stage tests; then
    rc=-1
elif [ "$MODE" = cmake ]; then
    (cd "$BUILD" && timeout 300 ctest -L gpu --output-on-failure -V) >"$OUTDIR/test.log" 2>&1
    rc=$?
else
    timeout 420 "$TESTBIN" >"$OUTDIR/test.log" 2>&1
    rc=$?
    if [ -n "$TPBIN" ] && [ -x "$TPBIN" ]; then
        echo "---- gpu_tp_nccl ----" >>"$OUTDIR/test.log"
        timeout 120 "$TPBIN" >>"$OUTDIR/test.log" 2>&1
        trc=$?
        case $trc in
        0) say "gpu_tp_nccl: PASS" ;;
        77) say "gpu_tp_nccl: SKIPPED ($(grep -m1 '^SKIP' "$OUTDIR/test.log" | cut -c7-))" ;;
        *) say "gpu_tp_nccl: FAIL (rc $trc) — see test.log" ;;
        esac
    fi
fi
case $rc in
-1) ;;
0) say "gpu tests: PASS" ;;
77) say "gpu tests: SKIPPED$(nogpu_note) ($(grep -m1 '^SKIP' "$OUTDIR/test.log" | cut -c7-))" ;;
124) say "gpu tests: TIMEOUT — see test.log" ;;
*) say "gpu tests: FAIL (rc $rc) — see test.log" ;;
esac
[ -f "$OUTDIR/test.log" ] && grep -E "^(PASS|FAIL|model|SKIP)|checks" "$OUTDIR/test.log" | tee -a "$SUMMARY"

# ---- memcheck of the op and attention tests ----
if stage memcheck && [ $SAN = 1 ] && command -v compute-sanitizer >/dev/null 2>&1; then
    # the bundle's TESTBIN is a wrapper script that execs the bundled loader: follow children
    for t in attention page_copy argmax rmsnorm; do
        timeout 120 compute-sanitizer --tool memcheck --target-processes all --error-exitcode 9 \
            "$TESTBIN" "$t" >>"$OUTDIR/memcheck.log" 2>&1
        mrc=$?
        case $mrc in
        0) say "memcheck $t: clean" ;;
        9) say "memcheck $t: ERRORS — memcheck.log" ;;
        124) say "memcheck $t: timed out (120 s)" ;;
        *) say "memcheck $t: rc $mrc$(nogpu_note)" ;;
        esac
    done
fi

# ---- greedy text: --device cuda vs cpu on a tiny random model (full build only) ----
# Both with the same KV pool type (auto differs: the model's dtype on cuda, float32 on cpu), so
# only the kernels differ: float32, then fp8_e4m3 (both backends round K/V with model/fp8.h).
if stage generate && [ $FULL = 1 ]; then
    M="$BUILD/models/tiny-gpu-run"
    "$BUILD/tools/pdserve-mkmodel" --out "$M" >"$OUTDIR/generate.txt" 2>&1
    for kv in fp32 fp8_e4m3; do
        {
            "$BUILD/tools/pdserve-generate" --model-path "$M" --device cpu --ids \
                --kv-cache-dtype $kv --max-new-tokens 24 "The quick brown fox" "Hello" \
                >"$OUTDIR/gen-cpu-$kv.txt" &&
                "$BUILD/tools/pdserve-generate" --model-path "$M" --device cuda --ids \
                    --kv-cache-dtype $kv --max-new-tokens 24 "The quick brown fox" "Hello" \
                    >"$OUTDIR/gen-cuda-$kv.txt"
        } >>"$OUTDIR/generate.txt" 2>&1
        if [ ! -s "$OUTDIR/gen-cuda-$kv.txt" ]; then
            say "generate (kv $kv): FAILED$(nogpu_note) — generate.txt: $(grep -m1 -i 'cuda\|error' "$OUTDIR/generate.txt")"
        elif cmp -s "$OUTDIR/gen-cpu-$kv.txt" "$OUTDIR/gen-cuda-$kv.txt"; then
            say "generate (kv $kv): cuda greedy text equals cpu"
        else
            say "generate (kv $kv): cuda and cpu differ (see gen-*-$kv.txt; bf16 GEMM inputs" \
                "can flip near-ties)"
        fi
    done
fi

# ---- --device cuda on the daemons: they start on GPU 0, /server_info names the backend ----
if stage device && [ $FULL = 1 ]; then
    PD_TEST_GPU=1 timeout 300 "$PY" "$ROOT/tests/integration/test_device_cuda.py" "$BUILD" \
        >"$OUTDIR/device.log" 2>&1
    say "daemons --device cuda: rc $?$(nogpu_note) — device.log"
    grep -E "^FAIL" "$OUTDIR/device.log" | tee -a "$SUMMARY"
fi

# ---- disaggregated on the GPU: prefill + decode processes + router vs pdserve-generate ----
if stage disagg && [ $FULL = 1 ]; then
    shapes="tiny,qwen2.5-1.5b"
    timeout 420 "$PY" "$ROOT/scripts/gpu_disagg.py" "$BUILD" "$OUTDIR" --shapes "$shapes" \
        >"$OUTDIR/disagg.log" 2>&1
    say "disaggregated path: rc $?$(nogpu_note) — disagg.log, disagg.json"
    grep -E "^disagg" "$OUTDIR/disagg.log" | tee -a "$SUMMARY"
fi

# ---- KV page transfer between two device pools vs a device copy of the same bytes ----
if stage xfer && [ $FULL = 1 ]; then
    # the same-node path the daemons take (CUDA IPC device copies), then the UCX path
    timeout 120 "$BUILD/bench/pdserve-bench-xfer-dev" --device cuda --rooms 20 \
        --room-pages 256 --json "$OUTDIR/xfer.json" >"$OUTDIR/xfer.txt" 2>&1
    say "kv transfer bench (ipc): rc $?$(nogpu_note)"
    timeout 120 "$BUILD/bench/pdserve-bench-xfer-dev" --device cuda --rooms 20 --no-ipc \
        --room-pages 256 --json "$OUTDIR/xfer-ucx.json" >>"$OUTDIR/xfer.txt" 2>&1
    say "kv transfer bench (ucx): rc $?$(nogpu_note)"
    grep -E "^kv transfer" "$OUTDIR/xfer.txt" | tee -a "$SUMMARY"
fi

# ---- perf mode ----
if stage perf && [ $PERF = 1 ]; then
    # decode with the KV pool SGLang would use for this bf16 model (--kv-cache-dtype auto =
    # bf16), which the issue's targets assume; the perf mode adds fp8_e4m3 attention and decode
    # lines after it
    timeout 420 "$TESTBIN" --perf $QUICK --breakdown --kv-cache-dtype auto --json "$OUTDIR/perf.json" \
        >"$OUTDIR/perf.txt" 2>&1
    say "perf: rc $?$(nogpu_note) — perf.txt, perf.json"
    cat "$OUTDIR/perf.txt"
fi
# the qwen2.5-1.5b-shaped random model (pdserve-mkmodel) of the torch and compare stages
TORCH_MODEL=/tmp/pd-torch-model
torch_model() {
    [ -f "$TORCH_MODEL/config.json" ] || "$BUILD/tools/pdserve-mkmodel" --out "$TORCH_MODEL" \
        --log-level warning --shape qwen2.5-0.5b --hidden-size 1536 --intermediate-size 8960 \
        --layers 28 --heads 12 --kv-heads 2 --head-dim 128
}

# ---- PyTorch baseline: its kernels on the perf mode's shapes, then transformers on a
# qwen2.5-1.5b-shaped random model (the minimal build has no pdserve-mkmodel: kernels only) ----
if stage torch; then
    if [ $FULL = 1 ] && torch_model >"$OUTDIR/torch.log" 2>&1; then
        set -- "$TORCH_MODEL" "$OUTDIR/torch.json" --new 64 --batch 64 --prefill 4096
    else
        set -- --kernels-only "$OUTDIR/torch.json"
    fi
    timeout -k 10 300 "$PY" "$ROOT/bench/gpu_torch_baseline.py" "$@" >>"$OUTDIR/torch.log" 2>&1
    rc=$?
    case $rc in
    0) say "torch baseline: $(tail -1 "$OUTDIR/torch.log")" ;;
    77) say "torch baseline: skipped ($(tail -1 "$OUTDIR/torch.log"))" ;;
    124 | 137) say "torch baseline: TIMEOUT (300 s; what it measured is in torch.json)" ;;
    *) say "torch baseline: FAIL rc $rc: $(tail -1 "$OUTDIR/torch.log") — torch.log" ;;
    esac
fi

# ---- colocated vs disaggregated under load: bench/compare-pd.sh on the GPU ----
# qwen2.5-1.5b shape, random 1024 in / 128 out, a short rate sweep (saturation first, so a cut
# run still has it; 4 req/s last, issue 17's light load: PD's median TTFT within 3 ms of
# colocated's, which gpu_results.py checks at the lightest rate run). Each half has its own time
# limit, out of PD_COMPARE_TIMEOUT seconds in all: colocated at most half of it, PD the rest;
# timeout stops a half with everything it started.
if stage compare && [ $FULL = 1 ]; then
    budget=${PD_COMPARE_TIMEOUT:-210}
    if ! torch_model >"$OUTDIR/compare.txt" 2>&1; then
        say "compare-pd: no model (pdserve-mkmodel failed) — compare.txt"
    else
        # what is left of the run's budget, less 20 s for the results and the packing
        rest=$((${PD_GPU_RUN_BUDGET:-570} - ($(date +%s) - START) - 20))
        if [ "$rest" -lt "$budget" ]; then
            say "compare-pd: $rest s left of PD_GPU_RUN_BUDGET (${PD_GPU_RUN_BUDGET:-570} s)," \
                "not $budget"
            budget=$rest
        fi
        t0=$(date +%s)
        for half in colocated pd; do
            used=$(($(date +%s) - t0))
            left=$((budget - used))
            [ $half = colocated ] && [ $left -gt $((budget / 2)) ] && left=$((budget / 2))
            if [ $left -lt 30 ]; then
                say "compare-pd ($half): not run, ${used} s of ${budget} s used"
                continue
            fi
            ONLY=$half DEVICE=cuda OUT_DIR="$OUTDIR/compare" INPUT_LEN=1024 OUTPUT_LEN=128 \
                RATES="${PD_COMPARE_RATES:-inf,64,16,4}" NUM_PROMPTS="${PD_COMPARE_PROMPTS:-128}" \
                MAX_TOTAL_TOKENS="${PD_COMPARE_MAX_TOTAL_TOKENS:-163840}" CHUNK=8192 \
                timeout -k 15 "$left" bash "$ROOT/bench/compare-pd.sh" "$BUILD" "$TORCH_MODEL" \
                >>"$OUTDIR/compare.txt" 2>&1
            rc=$?
            case $rc in
            0) say "compare-pd ($half): ok in $(($(date +%s) - t0 - used)) s$(nogpu_note)" ;;
            124 | 137) say "compare-pd ($half): TIMEOUT after $left s (the rates done are kept)" ;;
            *)
                why=$(grep -E -m1 'compare-pd:.*(not |exited|FAIL|rror)' "$OUTDIR/compare.txt")
                say "compare-pd ($half): rc $rc$(nogpu_note) — ${why:-see compare.txt}"
                ;;
            esac
        done
    fi
    "$PY" "$ROOT/scripts/gpu_results.py" --compare "$OUTDIR" 2>&1 | tee -a "$SUMMARY"
fi

# ---- everything measured, in one JSON and one table ----
"$PY" "$ROOT/scripts/gpu_results.py" "$OUTDIR" 2>&1 | tee -a "$SUMMARY"
say "results in $OUTDIR"
