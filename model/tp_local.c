/*
 * tp_local.c — the in-process tensor-parallel group: ranks are threads of one process sharing
 * memory, so an all-reduce is two barriers around a reduce-scatter done in place. Each rank owns
 * the slice [rank * count / size, (rank + 1) * count / size) of the vector: it sums that slice
 * over every rank's buffer in rank order 0..size-1 (so the result does not depend on timing)
 * and writes the sum back into all buffers. Slices are disjoint, so no two ranks touch the same
 * element between the barriers. Only for backends whose device memory is host memory (cpu).
 *
 * The barrier is ours (mutex + condition variable), not pthread_barrier_t, because it can be
 * broken: a rank that fails a step (fail) wakes every rank waiting in it and makes every later
 * wait return at once, until reset, so no rank waits forever for one that left the step.
 */
#include "model/tp.h"
#include "common/base/alloc.h"
#include "model/backend.h"
#include "common/base/status.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

struct pd_tp_local {
    int size;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;              /* ranks inside the current barrier */
    uint64_t gen;             /* barriers completed */
    bool failed;              /* a rank gave the step up: barriers return false until reset */
    int failed_rank;          /* the first that did */
    float **bufs;             /* [size] each rank's buffer of the call in progress */
    size_t *counts;           /* [size] each rank's count, checked equal */
    struct pd_tp_comm *comms; /* [size] */
};

/* true when every rank arrived; false when the step was given up before they all did. */
static bool barrier_wait(struct pd_tp_local *g) {
    pthread_mutex_lock(&g->mu);
    bool ok;
    if (g->failed) {
        ok = false;
    } else if (++g->arrived == g->size) {
        g->arrived = 0;
        g->gen++;
        pthread_cond_broadcast(&g->cv);
        ok = true;
    } else {
        uint64_t gen = g->gen;
        while (gen == g->gen && !g->failed)
            pthread_cond_wait(&g->cv, &g->mu);
        ok = gen != g->gen;
    }
    pthread_mutex_unlock(&g->mu);
    return ok;
}

static void local_fail(const struct pd_tp_comm *c) {
    struct pd_tp_local *g = c->ctx;
    pthread_mutex_lock(&g->mu);
    if (!g->failed)
        g->failed_rank = c->rank;
    g->failed = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static int local_reset(const struct pd_tp_comm *c) {
    struct pd_tp_local *g = c->ctx;
    pthread_mutex_lock(&g->mu);
    g->failed = false;
    g->arrived = 0;
    pthread_mutex_unlock(&g->mu);
    return PD_OK;
}

static int peer_failed(struct pd_tp_local *g, int r) {
    pthread_mutex_lock(&g->mu);
    int who = g->failed_rank;
    pthread_mutex_unlock(&g->mu);
    return pd_errorf(PD_EPEER, "tp all-reduce on rank %d: rank %d gave the step up", r, who);
}

static int local_all_reduce(const struct pd_tp_comm *c, struct pd_backend *be, float *buf,
                            size_t count) {
    struct pd_tp_local *g = c->ctx;
    int n = g->size, r = c->rank;
    int rc =
        pd_backend_kind_of(be) != PD_BACKEND_CPU
            ? pd_errorf(PD_EUNSUPPORTED, "in-process all-reduce needs host memory (cpu backend)")
            : pd_backend_sync(be); /* the partial sums must be complete before others read */
    if (rc) {
        local_fail(c);
        return rc;
    }
    g->bufs[r] = buf;
    g->counts[r] = count;
    if (!barrier_wait(g))
        return peer_failed(g, r);
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
    if (!barrier_wait(g))
        return peer_failed(g, r);
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
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    for (int r = 0; r < size; r++)
        g->comms[r] = (struct pd_tp_comm){.rank = r,
                                          .size = size,
                                          .all_reduce_sum = local_all_reduce,
                                          .fail = local_fail,
                                          .reset = local_reset,
                                          .ctx = g};
    *out = g;
    return PD_OK;
}

void pd_tp_local_free(struct pd_tp_local *g) {
    if (!g)
        return;
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    pd_free(g->bufs);
    pd_free(g->counts);
    pd_free(g->comms);
    pd_free(g);
}

const struct pd_tp_comm *pd_tp_local_comm(struct pd_tp_local *g, int rank) {
    return rank >= 0 && rank < g->size ? &g->comms[rank] : NULL;
}

int pd_tp_local_waiting(struct pd_tp_local *g) {
    pthread_mutex_lock(&g->mu);
    int n = g->arrived; /* under mu: each of them is inside pthread_cond_wait */
    pthread_mutex_unlock(&g->mu);
    return n;
}
