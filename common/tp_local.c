/*
 * tp_local.c — the in-process tensor-parallel group: ranks are threads of one process sharing
 * memory, so an all-reduce is two barriers around a reduce-scatter done in place. Each rank owns
 * the slice [rank * count / size, (rank + 1) * count / size) of the vector: it sums that slice
 * over every rank's buffer in rank order 0..size-1 (so the result does not depend on timing)
 * and writes the sum back into all buffers. Slices are disjoint, so no two ranks touch the same
 * element between the barriers. Only for backends whose device memory is host memory (cpu).
 */
#include "common/tp.h"
#include "common/alloc.h"
#include "common/backend.h"
#include "common/status.h"

#include <pthread.h>
#include <stdbool.h>

struct pd_tp_local {
    int size;
    pthread_barrier_t bar;
    float **bufs;             /* [size] each rank's buffer of the call in progress */
    size_t *counts;           /* [size] each rank's count, checked equal */
    struct pd_tp_comm *comms; /* [size] */
};

static int local_all_reduce(const struct pd_tp_comm *c, struct pd_backend *be, float *buf,
                            size_t count) {
    struct pd_tp_local *g = c->ctx;
    int n = g->size, r = c->rank;
    if (pd_backend_kind_of(be) != PD_BACKEND_CPU)
        return pd_errorf(PD_EUNSUPPORTED, "in-process all-reduce needs host memory (cpu backend)");
    int rc = pd_backend_sync(be); /* the partial sums must be complete before others read them */
    if (rc)
        return rc;
    g->bufs[r] = buf;
    g->counts[r] = count;
    pthread_barrier_wait(&g->bar);
    bool bad = false;
    for (int k = 0; k < n; k++)
        bad |= g->counts[k] != count;
    if (!bad) {
        size_t lo = count * (size_t)r / (size_t)n, hi = count * (size_t)(r + 1) / (size_t)n;
        for (size_t i = lo; i < hi; i++) {
            float s = 0.0f;
            for (int k = 0; k < n; k++)
                s += g->bufs[k][i];
            for (int k = 0; k < n; k++)
                g->bufs[k][i] = s;
        }
    }
    pthread_barrier_wait(&g->bar);
    if (bad)
        return pd_errorf(PD_EINVAL, "tp all-reduce: rank %d has %zu values, another rank differs",
                         r, count);
    return PD_OK;
}

int pd_tp_local_new(int size, struct pd_tp_local **out) {
    *out = NULL;
    if (size < 1 || size > 64)
        return pd_errorf(PD_EINVAL, "tp size %d (1..64)", size);
    struct pd_tp_local *g = pd_calloc(1, sizeof(*g));
    if (!g)
        return PD_ENOMEM;
    g->size = size;
    g->bufs = pd_calloc((size_t)size, sizeof(*g->bufs));
    g->counts = pd_calloc((size_t)size, sizeof(*g->counts));
    g->comms = pd_calloc((size_t)size, sizeof(*g->comms));
    if (!g->bufs || !g->counts || !g->comms) {
        pd_free(g->bufs);
        pd_free(g->counts);
        pd_free(g->comms);
        pd_free(g);
        return PD_ENOMEM;
    }
    pthread_barrier_init(&g->bar, NULL, (unsigned)size);
    for (int r = 0; r < size; r++)
        g->comms[r] = (struct pd_tp_comm){
            .rank = r, .size = size, .all_reduce_sum = local_all_reduce, .ctx = g};
    *out = g;
    return PD_OK;
}

void pd_tp_local_free(struct pd_tp_local *g) {
    if (!g)
        return;
    pthread_barrier_destroy(&g->bar);
    pd_free(g->bufs);
    pd_free(g->counts);
    pd_free(g->comms);
    pd_free(g);
}

const struct pd_tp_comm *pd_tp_local_comm(struct pd_tp_local *g, int rank) {
    return rank >= 0 && rank < g->size ? &g->comms[rank] : NULL;
}
