/*
 * tp_group.c — the ranks of a tensor-parallel model and the lockstep that drives them
 * (tp_group.h). One mutex and two condition variables carry every command to the workers: the
 * caller posts (seq++), each worker runs it and reports (n_done++), the caller waits for all
 * before it returns, so a command's arguments (the caller's step tables) are only read while the
 * caller is inside the call. Workers live from pd_tp_group_new to pd_tp_group_free; each loads,
 * allocates and frees its own rank, so a cuda rank's resources are made and released on the
 * thread whose current device is its GPU.
 *
 * Failure: a rank whose forward pass fails records itself as the step's first failure, then
 * calls its communicator's fail, which makes every rank waiting in (or entering) an all-reduce
 * give up; the step fails everywhere and the error reported is the first failing rank's. Before
 * the next step the carrier is reset (the local one recovers; NCCL's refuses).
 */
#include "model/tp_group.h"

#include "model/backend_reg.h"
#include "common/base/alloc.h"
#include "common/base/status.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define ERR_LEN 512

enum cmd {
    CMD_POOL = 1, /* allocate the rank's pool of n_pages */
    CMD_CALL,     /* run call */
};

enum call_kind {
    CALL_EXTEND = 1,
    CALL_DECODE,
    CALL_DECODE_GREEDY,
    CALL_DECODE_SAMPLE,
};

struct call {
    int kind; /* enum call_kind */
    const struct pd_model_seq *seqs;
    int n_seqs;
    bool all_logits;
    /* rank 0 only */
    float *logits;
    int32_t *ids;
    float *logprobs;
    const struct pd_sample_row *rows;
};

struct rank {
    struct pd_tp_group *g;
    int r;
    struct pd_backend *be;
    struct pd_model *model;
    struct pd_kv_pool kv;
    bool kv_ok;
    int64_t pages_fit; /* cuda, sizing by memory: the pages this rank's GPU takes */
    pthread_t th;
    bool started;
    int rc; /* of the last command (under g->mu) */
    char err[ERR_LEN];
};

struct pd_tp_group {
    struct pd_tp_group_opts o;
    int size;
    struct pd_tp_local *local;
    struct pd_tp_nccl *nccl;
    const struct pd_backend_reg *nccl_reg;     /* whose tp_nccl_free frees nccl */
    const struct pd_tp_comm *comms[PD_TP_MAX]; /* NULL with size 1 */
    struct rank ranks[PD_TP_MAX];
    size_t page_bytes;
    /* the command channel (under mu) */
    pthread_mutex_t mu;
    pthread_cond_t cv_go, cv_done;
    uint64_t seq;  /* commands posted */
    int n_done;    /* workers done with the current one (or with loading, before the first) */
    bool quit;     /* workers: free your rank and exit */
    int cmd;       /* enum cmd */
    int64_t pages; /* CMD_POOL */
    struct call call;
    int first_fail; /* the rank that failed the current command first; -1: none */
};

/* ---- one rank ---- */

static int online_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static struct pd_kv_pool_opts kv_opts(const struct pd_tp_group *g, const struct rank *k) {
    struct pd_kv_pool_opts ko = pd_model_kv_opts(k->model, g->o.kv_dtype);
    if (g->o.mem_fraction_static > 0)
        ko.mem_fraction_static = g->o.mem_fraction_static;
    return ko;
}

/* Backend and model share of rank k; on a GPU also the pages its memory would take. */
static int rank_load(struct pd_tp_group *g, struct rank *k) {
    struct pd_backend_opts bo = g->o.backend;
    if (bo.kind == PD_BACKEND_CPU) {
        int all = bo.threads > 0 ? bo.threads : online_cores();
        bo.threads = all / g->size > 0 ? all / g->size : 1;
    } else {
        bo.device_index += k->r;
    }
    int rc = pd_backend_new(&bo, &k->be);
    if (rc) {
        if (bo.kind == PD_BACKEND_CUDA)
            return pd_error_wrap(rc, "--device cuda (GPU %d)", bo.device_index);
        return rc;
    }
    struct pd_model_opts mo = g->o.model;
    mo.tp = g->comms[k->r];
    if ((rc = pd_model_load(k->be, g->o.model_path, &mo, &k->model)) != PD_OK)
        return rc; /* the message names the directory */
    if (g->o.n_pages == 0 && bo.kind != PD_BACKEND_CPU) {
        struct pd_kv_pool_opts ko = kv_opts(g, k);
        size_t total, avail;
        if ((rc = pd_backend_mem_info(k->be, &total, &avail)) != PD_OK ||
            (rc = pd_kv_pool_pages_for(&ko, total, avail, &k->pages_fit)) != PD_OK)
            return pd_error_wrap(rc, "sizing the kv pool of GPU %d", bo.device_index);
    }
    return PD_OK;
}

static int rank_pool(struct pd_tp_group *g, struct rank *k, int64_t pages) {
    struct pd_kv_pool_opts ko = kv_opts(g, k);
    ko.n_pages = pages;
    int rc = pd_kv_pool_init(&k->kv, k->be, &ko);
    k->kv_ok = rc == PD_OK;
    return rc;
}

static void rank_free(struct rank *k) {
    if (k->kv_ok)
        pd_kv_pool_free(&k->kv);
    k->kv_ok = false;
    pd_model_free(k->model);
    k->model = NULL;
    pd_backend_free(k->be);
    k->be = NULL;
}

/* The forward pass; rank 0 also takes the results. */
static int rank_call(struct rank *k, const struct call *c) {
    if (k->r != 0) /* lm_head is replicated: the workers' logits are rank 0's, nobody reads them */
        return c->kind == CALL_EXTEND
                   ? pd_model_extend(k->model, &k->kv, c->seqs, c->n_seqs, c->all_logits, NULL)
                   : pd_model_decode(k->model, &k->kv, c->seqs, c->n_seqs, NULL);
    switch (c->kind) {
    case CALL_EXTEND:
        return pd_model_extend(k->model, &k->kv, c->seqs, c->n_seqs, c->all_logits, c->logits);
    case CALL_DECODE: return pd_model_decode(k->model, &k->kv, c->seqs, c->n_seqs, c->logits);
    case CALL_DECODE_GREEDY:
        return pd_model_decode_greedy(k->model, &k->kv, c->seqs, c->n_seqs, c->ids, c->logprobs);
    case CALL_DECODE_SAMPLE:
        return pd_model_decode_sample(k->model, &k->kv, c->seqs, c->n_seqs, c->rows, c->ids,
                                      c->logprobs);
    }
    return pd_errorf(PD_EINTERNAL, "tp group: call kind %d", c->kind);
}

/* ---- the command channel ---- */

/* Rank r failed the current command: the first such is the one reported. */
static void note_fail(struct pd_tp_group *g, int r) {
    pthread_mutex_lock(&g->mu);
    if (g->first_fail < 0)
        g->first_fail = r;
    pthread_mutex_unlock(&g->mu);
}

static void report(struct pd_tp_group *g, struct rank *k, int rc) {
    pthread_mutex_lock(&g->mu);
    k->rc = rc;
    if (rc) {
        snprintf(k->err, sizeof(k->err), "%s", pd_error_msg());
        if (g->first_fail < 0)
            g->first_fail = k->r;
    }
    if (++g->n_done == g->size - 1)
        pthread_cond_broadcast(&g->cv_done);
    pthread_mutex_unlock(&g->mu);
}

static void post(struct pd_tp_group *g, int cmd) {
    pthread_mutex_lock(&g->mu);
    g->cmd = cmd;
    g->n_done = 0;
    g->first_fail = -1;
    g->seq++;
    pthread_cond_broadcast(&g->cv_go);
    pthread_mutex_unlock(&g->mu);
}

static void wait_workers(struct pd_tp_group *g) {
    pthread_mutex_lock(&g->mu);
    while (g->n_done < g->size - 1)
        pthread_cond_wait(&g->cv_done, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static void *worker_main(void *arg) {
    struct rank *k = arg;
    struct pd_tp_group *g = k->g;
    report(g, k, rank_load(g, k));
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&g->mu);
        while (g->seq == seen && !g->quit)
            pthread_cond_wait(&g->cv_go, &g->mu);
        if (g->quit) {
            pthread_mutex_unlock(&g->mu);
            break;
        }
        seen = g->seq;
        int cmd = g->cmd;
        int64_t pages = g->pages;
        struct call c = g->call;
        pthread_mutex_unlock(&g->mu);
        int rc;
        if (cmd == CMD_POOL) {
            rc = rank_pool(g, k, pages);
        } else {
            rc = rank_call(k, &c);
            if (rc) {
                note_fail(g, k->r);
                g->comms[k->r]->fail(g->comms[k->r]);
            }
        }
        report(g, k, rc);
    }
    rank_free(k);
    return NULL;
}

/* The error of the command just finished: rank 0's own (in this thread's message) unless it
 * only saw another rank give up (PD_EPEER), then the first failing worker's. A step every rank
 * refuses so reads the same whichever rank was quickest. */
static int group_status(struct pd_tp_group *g, int rc0) {
    pthread_mutex_lock(&g->mu);
    int f = g->first_fail;
    pthread_mutex_unlock(&g->mu);
    if (f < 0)
        return PD_OK;
    if (rc0 && (rc0 != PD_EPEER || f == 0))
        return g->size > 1 ? pd_error_wrap(rc0, "tp rank 0") : rc0;
    return pd_errorf(g->ranks[f].rc, "tp rank %d: %s", f, g->ranks[f].err);
}

/* ---- creation ---- */

/* Pages of every rank's pool. */
static int size_pools(struct pd_tp_group *g, int64_t *pages) {
    if (g->o.n_pages > 0) {
        *pages = g->o.n_pages;
        return PD_OK;
    }
    if (g->o.backend.kind != PD_BACKEND_CPU) {
        *pages = g->ranks[0].pages_fit;
        for (int r = 1; r < g->size; r++)
            if (g->ranks[r].pages_fit < *pages)
                *pages = g->ranks[r].pages_fit;
        return PD_OK;
    }
    /* cpu ranks share host memory: sizing one rank's pool in 1/size of it sizes the logical
     * pool (all ranks' pages) in all of it */
    struct pd_kv_pool_opts ko = kv_opts(g, &g->ranks[0]);
    size_t total, avail;
    int rc = pd_backend_mem_info(g->ranks[0].be, &total, &avail);
    if (!rc)
        rc = pd_kv_pool_pages_for(&ko, total / (size_t)g->size, avail / (size_t)g->size, pages);
    return rc ? pd_error_wrap(rc, "sizing the kv pool") : PD_OK;
}

static int make_carrier(struct pd_tp_group *g) {
    int S = g->size;
    if (S == 1)
        return PD_OK;
    int rc;
    if (g->o.backend.kind == PD_BACKEND_CPU) {
        if ((rc = pd_tp_local_new(S, &g->local)) != PD_OK)
            return rc;
        for (int r = 0; r < S; r++)
            g->comms[r] = pd_tp_local_comm(g->local, r);
        return PD_OK;
    }
    const struct pd_backend_reg *reg = pd_backend_reg_find(g->o.backend.kind);
    if (!reg || !reg->tp_nccl_new)
        return pd_errorf(PD_EUNSUPPORTED,
                         "--tp-size %d with --device cuda needs NCCL, not in this build (it "
                         "looks for nccl.h and libnccl.so in the CUDA toolkit); use --tp-size 1 "
                         "or rebuild with NCCL",
                         S);
    int devs[PD_TP_MAX];
    for (int r = 0; r < S; r++)
        devs[r] = g->o.backend.device_index + r;
    if ((rc = reg->tp_nccl_new(S, devs, &g->nccl)) != PD_OK)
        return rc;
    g->nccl_reg = reg;
    for (int r = 0; r < S; r++)
        g->comms[r] = reg->tp_nccl_comm(g->nccl, r);
    return PD_OK;
}

int pd_tp_group_new(const struct pd_tp_group_opts *o, struct pd_tp_group **out) {
    *out = NULL;
    if (o->size < 1 || o->size > PD_TP_MAX)
        return pd_errorf(PD_ERANGE, "--tp-size %d: 1..%d ranks", o->size, PD_TP_MAX);
    /* auto: SGLang keeps the KV cache in the model's dtype; the CPU backend computes in f32 */
    enum pd_dtype kv_dtype = o->kv_dtype;
    if (o->kv_dtype_auto) {
        kv_dtype = PD_DTYPE_F32;
        struct pd_model_config mc;
        if (o->backend.kind != PD_BACKEND_CPU) {
            int rc = pd_model_config_load(o->model_path, &mc);
            if (rc)
                return rc; /* the message names the directory */
            kv_dtype = mc.torch_dtype;
        }
    }
    struct pd_tp_group *g = pd_calloc(1, sizeof(*g));
    if (!g)
        return PD_ENOMEM;
    g->o = *o;
    g->o.kv_dtype = kv_dtype;
    g->o.kv_dtype_auto = false;
    g->size = o->size;
    g->first_fail = -1;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv_go, NULL);
    pthread_cond_init(&g->cv_done, NULL);
    for (int r = 0; r < g->size; r++)
        g->ranks[r] = (struct rank){.g = g, .r = r};
    int rc = make_carrier(g);
    if (rc)
        goto fail;
    /* workers load their ranks while this thread loads rank 0 */
    int started = 0;
    for (int r = 1; r < g->size; r++) {
        int e = pthread_create(&g->ranks[r].th, NULL, worker_main, &g->ranks[r]);
        if (e) {
            rc = pd_errorf(pd_status_from_errno(e), "starting tp rank %d's thread: %s", r,
                           strerror(e));
            break;
        }
        g->ranks[r].started = true;
        started++;
    }
    if (started < g->size - 1) {
        /* the ranks started report their load; the missing ones count as done */
        pthread_mutex_lock(&g->mu);
        g->n_done += g->size - 1 - started;
        pthread_mutex_unlock(&g->mu);
        wait_workers(g);
        goto fail;
    }
    int rc0 = rank_load(g, &g->ranks[0]);
    if (rc0)
        note_fail(g, 0);
    wait_workers(g);
    if ((rc = group_status(g, rc0)) != PD_OK)
        goto fail;
    int64_t pages = 0;
    if ((rc = size_pools(g, &pages)) != PD_OK)
        goto fail;
    pthread_mutex_lock(&g->mu);
    g->pages = pages;
    pthread_mutex_unlock(&g->mu);
    post(g, CMD_POOL);
    rc0 = rank_pool(g, &g->ranks[0], pages);
    if (rc0)
        note_fail(g, 0);
    wait_workers(g);
    if ((rc = group_status(g, rc0)) != PD_OK)
        goto fail;
    g->page_bytes = (size_t)g->size * g->ranks[0].kv.layout.page_bytes;
    *out = g;
    return PD_OK;
fail:
    pd_tp_group_free(g);
    return rc;
}

void pd_tp_group_free(struct pd_tp_group *g) {
    if (!g)
        return;
    pthread_mutex_lock(&g->mu);
    g->quit = true;
    pthread_cond_broadcast(&g->cv_go);
    pthread_mutex_unlock(&g->mu);
    for (int r = 1; r < g->size; r++)
        if (g->ranks[r].started)
            pthread_join(g->ranks[r].th, NULL);
    rank_free(&g->ranks[0]);
    pd_tp_local_free(g->local);
    if (g->nccl)
        g->nccl_reg->tp_nccl_free(g->nccl);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv_go);
    pthread_cond_destroy(&g->cv_done);
    pd_free(g);
}

/* ---- accessors ---- */

int pd_tp_group_size(const struct pd_tp_group *g) {
    return g->size;
}

struct pd_model *pd_tp_group_model(struct pd_tp_group *g, int rank) {
    PD_ASSERT(rank >= 0 && rank < g->size);
    return g->ranks[rank].model;
}

struct pd_kv_pool *pd_tp_group_kv(struct pd_tp_group *g, int rank) {
    PD_ASSERT(rank >= 0 && rank < g->size);
    return &g->ranks[rank].kv;
}

struct pd_backend *pd_tp_group_backend(struct pd_tp_group *g, int rank) {
    PD_ASSERT(rank >= 0 && rank < g->size);
    return g->ranks[rank].be;
}

size_t pd_tp_group_page_bytes(const struct pd_tp_group *g) {
    return g->page_bytes;
}

/* ---- steps ---- */

static int group_call(struct pd_tp_group *g, const struct call *c) {
    struct rank *k0 = &g->ranks[0];
    if (g->size == 1)
        return rank_call(k0, c);
    const struct pd_tp_comm *c0 = g->comms[0];
    int rc = c0->reset(c0); /* every rank is outside a step here */
    if (rc)
        return rc;
    pthread_mutex_lock(&g->mu);
    g->call = *c;
    pthread_mutex_unlock(&g->mu);
    post(g, CMD_CALL);
    rc = rank_call(k0, c);
    if (rc) {
        note_fail(g, 0);
        c0->fail(c0);
    }
    wait_workers(g);
    return group_status(g, rc);
}

int pd_tp_group_extend(struct pd_tp_group *g, const struct pd_model_seq *seqs, int n_seqs,
                       bool all_logits, float *logits) {
    struct call c = {.kind = CALL_EXTEND,
                     .seqs = seqs,
                     .n_seqs = n_seqs,
                     .all_logits = all_logits,
                     .logits = logits};
    return group_call(g, &c);
}

int pd_tp_group_decode(struct pd_tp_group *g, const struct pd_model_seq *seqs, int n_seqs,
                       float *logits) {
    struct call c = {.kind = CALL_DECODE, .seqs = seqs, .n_seqs = n_seqs, .logits = logits};
    return group_call(g, &c);
}

int pd_tp_group_decode_greedy(struct pd_tp_group *g, const struct pd_model_seq *seqs, int n_seqs,
                              int32_t *ids, float *logprobs) {
    struct call c = {.kind = CALL_DECODE_GREEDY,
                     .seqs = seqs,
                     .n_seqs = n_seqs,
                     .ids = ids,
                     .logprobs = logprobs};
    return group_call(g, &c);
}

int pd_tp_group_decode_sample(struct pd_tp_group *g, const struct pd_model_seq *seqs, int n_seqs,
                              const struct pd_sample_row *rows, int32_t *ids, float *logprobs) {
    struct call c = {.kind = CALL_DECODE_SAMPLE,
                     .seqs = seqs,
                     .n_seqs = n_seqs,
                     .rows = rows,
                     .ids = ids,
                     .logprobs = logprobs};
    return group_call(g, &c);
}
