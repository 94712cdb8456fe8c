/*
 * tp_nccl.c — the NCCL carrier of tensor parallelism (model/tp.h), the thin GPU path: one
 * process, one thread per rank, one communicator per GPU made together by ncclCommInitAll. The
 * all-reduce first launches what the rank's cuda backend has queued (its op log), then enqueues
 * ncclAllReduce in place (f32 sum) on the backend's stream, so it runs after the partial sums
 * and before the ops that follow; nothing waits on the host.
 *
 * Failure: a rank that gives a step up cannot leave its peers' NCCL kernels waiting for it on
 * their GPUs, and the only way to release them is ncclCommAbort. So fail aborts every
 * communicator (under the write lock, while no rank is enqueueing: they enqueue under the read
 * lock) and the group is broken for good: every later all-reduce and reset refuses, naming the
 * rank that failed. Untested on a GPU: pdserve's CI machines have none (tests/kernels/
 * test_tp_cuda.c runs it against tp 1 where two GPUs exist).
 *
 * NCCL is opened with dlopen when the first group is made, not linked: libnccl is 200+ MB, not
 * every CUDA image has it on the loader path (PyTorch keeps its own copy inside site-packages),
 * and a daemon with one GPU must start without it. PDSERVE_NCCL_LIBRARY names the file to open
 * (default libnccl.so.2); only nccl.h's types are needed at build time.
 */
#include "common/base/alloc.h"
#include "model/backend.h"
#include "common/base/status.h"
#include "model/tp.h"
#include "kernels/backend_cuda.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

/* The five NCCL entry points used, from the library opened once by nccl_open. */
static struct {
    pthread_once_t once;
    int status; /* PD_OK once loaded */
    char error[512];
    const char *(*get_error_string)(ncclResult_t);
    ncclResult_t (*comm_init_all)(ncclComm_t *, int, const int *);
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
                               ncclComm_t, cudaStream_t);
    ncclResult_t (*comm_abort)(ncclComm_t);
    ncclResult_t (*comm_destroy)(ncclComm_t);
} nccl = {.once = PTHREAD_ONCE_INIT};

static void nccl_load(void) {
    const char *path = getenv("PDSERVE_NCCL_LIBRARY");
    if (!path || !*path)
        path = "libnccl.so.2";
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        nccl.status = PD_EUNSUPPORTED;
        snprintf(nccl.error, sizeof(nccl.error),
                 "cannot open NCCL (%s): %s; set PDSERVE_NCCL_LIBRARY to libnccl.so.2's path", path,
                 dlerror());
        return;
    }
    /* POSIX: a function pointer may travel through void * from dlsym */
    *(void **)&nccl.get_error_string = dlsym(h, "ncclGetErrorString");
    *(void **)&nccl.comm_init_all = dlsym(h, "ncclCommInitAll");
    *(void **)&nccl.all_reduce = dlsym(h, "ncclAllReduce");
    *(void **)&nccl.comm_abort = dlsym(h, "ncclCommAbort");
    *(void **)&nccl.comm_destroy = dlsym(h, "ncclCommDestroy");
    if (!nccl.get_error_string || !nccl.comm_init_all || !nccl.all_reduce || !nccl.comm_abort ||
        !nccl.comm_destroy) {
        nccl.status = PD_EUNSUPPORTED;
        snprintf(nccl.error, sizeof(nccl.error),
                 "%s lacks an NCCL 2 entry point (ncclCommInitAll, "
                 "ncclAllReduce, ncclCommAbort, ncclCommDestroy, ncclGetErrorString)",
                 path);
        dlclose(h);
        return;
    }
    nccl.status = PD_OK; /* kept open for the process's life */
}

static int nccl_open(void) {
    pthread_once(&nccl.once, nccl_load);
    return nccl.status ? pd_errorf(nccl.status, "%s", nccl.error) : PD_OK;
}

struct pd_tp_nccl {
    int size;
    int devices[PD_TP_MAX];
    ncclComm_t comms[PD_TP_MAX]; /* NULL once aborted */
    struct pd_tp_comm pc[PD_TP_MAX];
    pthread_rwlock_t lock; /* read: enqueueing on comms; write: aborting them */
    bool broken;           /* under lock */
    int failed_rank;
};

/* ncclResult_t → PD_E*, the one place NCCL's codes are read. */
static int nccl_status(ncclResult_t r, const char *what) {
    if (r == ncclSuccess)
        return PD_OK;
    int code = r == ncclInvalidArgument || r == ncclInvalidUsage ? PD_EINVAL
               : r == ncclSystemError || r == ncclRemoteError    ? PD_EIO
               : r == ncclUnhandledCudaError                     ? PD_EUNSUPPORTED
                                                                 : PD_EINTERNAL;
    return pd_errorf(code, "%s: %s (NCCL %d)", what, nccl.get_error_string(r), (int)r);
}

static void nccl_fail(const struct pd_tp_comm *c) {
    struct pd_tp_nccl *g = c->ctx;
    pthread_rwlock_wrlock(&g->lock);
    if (!g->broken) {
        g->broken = true;
        g->failed_rank = c->rank;
        for (int r = 0; r < g->size; r++)
            if (g->comms[r]) {
                (void)nccl.comm_abort(g->comms[r]);
                g->comms[r] = NULL;
            }
    }
    pthread_rwlock_unlock(&g->lock);
}

static int broken_error(struct pd_tp_nccl *g) {
    return pd_errorf(PD_EPEER,
                     "the NCCL tensor-parallel group was aborted when rank %d (GPU %d) failed a "
                     "step; restart the process",
                     g->failed_rank, g->devices[g->failed_rank]);
}

static int nccl_reset(const struct pd_tp_comm *c) {
    struct pd_tp_nccl *g = c->ctx;
    pthread_rwlock_rdlock(&g->lock);
    int rc = g->broken ? broken_error(g) : PD_OK;
    pthread_rwlock_unlock(&g->lock);
    return rc;
}

static int nccl_all_reduce(const struct pd_tp_comm *c, struct pd_backend *be, float *buf,
                           size_t count) {
    struct pd_tp_nccl *g = c->ctx;
    void *stream = NULL;
    int rc = pd_backend_kind_of(be) != PD_BACKEND_CUDA
                 ? pd_errorf(PD_EUNSUPPORTED, "the NCCL all-reduce needs the cuda backend")
                 : pd_backend_cuda_flush(be, &stream);
    if (rc) {
        nccl_fail(c);
        return pd_error_wrap(rc, "tp rank %d before its all-reduce", c->rank);
    }
    pthread_rwlock_rdlock(&g->lock);
    if (g->broken) {
        rc = broken_error(g);
        pthread_rwlock_unlock(&g->lock);
        return rc;
    }
    ncclResult_t r = nccl.all_reduce(buf, buf, count, ncclFloat, ncclSum, g->comms[c->rank],
                                     (cudaStream_t)stream);
    pthread_rwlock_unlock(&g->lock);
    if (r != ncclSuccess) {
        rc = nccl_status(r, "ncclAllReduce");
        nccl_fail(c);
        return pd_error_wrap(rc, "tp rank %d (GPU %d)", c->rank, g->devices[c->rank]);
    }
    return PD_OK;
}

int pd_tp_nccl_new(int size, const int *devices, struct pd_tp_nccl **out) {
    *out = NULL;
    if (size < 1 || size > PD_TP_MAX)
        return pd_errorf(PD_ERANGE, "NCCL group of %d ranks (1..%d)", size, PD_TP_MAX);
    int rc = nccl_open();
    if (rc)
        return pd_error_wrap(rc, "--tp-size %d on --device cuda", size);
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        return pd_errorf(PD_EUNSUPPORTED, "--tp-size %d on --device cuda: no CUDA device", size);
    }
    for (int r = 0; r < size; r++)
        if (devices[r] < 0 || devices[r] >= n)
            return pd_errorf(PD_ERANGE,
                             "--tp-size %d: rank %d would run on GPU %d, and there are %d GPUs "
                             "(--base-gpu-id + rank must name one)",
                             size, r, devices[r], n);
    struct pd_tp_nccl *g = pd_calloc(1, sizeof(*g));
    if (!g)
        return PD_ENOMEM;
    g->size = size;
    for (int r = 0; r < size; r++)
        g->devices[r] = devices[r];
    rc = nccl_status(nccl.comm_init_all(g->comms, size, g->devices), "ncclCommInitAll");
    if (rc) {
        pd_free(g);
        return pd_error_wrap(rc, "--tp-size %d over GPUs %d..%d", size, devices[0],
                             devices[size - 1]);
    }
    pthread_rwlock_init(&g->lock, NULL);
    for (int r = 0; r < size; r++)
        g->pc[r] = (struct pd_tp_comm){.rank = r,
                                       .size = size,
                                       .all_reduce_sum = nccl_all_reduce,
                                       .fail = nccl_fail,
                                       .reset = nccl_reset,
                                       .ctx = g};
    *out = g;
    return PD_OK;
}

void pd_tp_nccl_free(struct pd_tp_nccl *g) {
    if (!g)
        return;
    for (int r = 0; r < g->size; r++)
        if (g->comms[r])
            (void)nccl.comm_destroy(g->comms[r]);
    pthread_rwlock_destroy(&g->lock);
    pd_free(g);
}

const struct pd_tp_comm *pd_tp_nccl_comm(struct pd_tp_nccl *g, int rank) {
    return rank >= 0 && rank < g->size ? &g->pc[rank] : NULL;
}
