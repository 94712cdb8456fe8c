/*
 * backend_cpu_pool.c — the cpu backend's fixed set of worker threads.
 *
 * One task at a time: run() publishes (fn, ctx) under a new generation number, works as thread 0,
 * and waits for the others. Workers spin briefly on the generation before sleeping on a condition
 * variable, because a decode step issues hundreds of short tasks back to back and a futex wake per
 * task would cost more than the task; the spin is bounded so idle workers do not burn a core.
 * Threads are created at init and joined at free; nothing is allocated per task.
 */
#include "common/backend_cpu.h"
#include "common/alloc.h"
#include "common/status.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#define PD_POOL_SPIN 20000

struct worker_arg {
    struct pd__cpu_pool *pool;
    int tid;
};

struct pd__cpu_pool {
    int n;
    pthread_t *threads;      /* [n-1] */
    struct worker_arg *args; /* [n-1] */
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    atomic_uint gen;    /* bumped once per task */
    atomic_int pending; /* workers still running the current task */
    int sleepers;       /* workers waiting on cv_work (under mu) */
    bool stop;
    pd__cpu_task fn;
    void *ctx;
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void *worker_main(void *arg) {
    struct worker_arg *wa = arg;
    struct pd__cpu_pool *p = wa->pool;
    unsigned seen = 0;
    for (;;) {
        unsigned g = atomic_load_explicit(&p->gen, memory_order_acquire);
        for (int i = 0; g == seen && i < PD_POOL_SPIN; i++) {
            cpu_relax();
            g = atomic_load_explicit(&p->gen, memory_order_acquire);
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            p->sleepers++;
            while ((g = atomic_load(&p->gen)) == seen && !p->stop)
                pthread_cond_wait(&p->cv_work, &p->mu);
            p->sleepers--;
            bool stop = p->stop;
            pthread_mutex_unlock(&p->mu);
            if (stop)
                return NULL;
        }
        seen = g;
        p->fn(p->ctx, wa->tid, p->n);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

int pd__cpu_pool_new(int n_threads, struct pd__cpu_pool **out) {
    *out = NULL;
    if (n_threads < 1)
        return pd_errorf(PD_EINVAL, "thread pool of %d threads", n_threads);
    struct pd__cpu_pool *p = pd_calloc(1, sizeof(*p));
    if (!p)
        return PD_ENOMEM;
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_work, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    int started = 0;
    if (n_threads > 1) {
        p->threads = pd_calloc((size_t)n_threads - 1, sizeof(*p->threads));
        p->args = pd_calloc((size_t)n_threads - 1, sizeof(*p->args));
        if (!p->threads || !p->args)
            goto fail;
        for (; started < n_threads - 1; started++) {
            p->args[started] = (struct worker_arg){p, started + 1};
            if (pthread_create(&p->threads[started], NULL, worker_main, &p->args[started]) != 0) {
                pd_errorf(PD_ENOMEM, "starting cpu worker thread %d of %d", started + 1, n_threads);
                goto fail;
            }
        }
    }
    *out = p;
    return PD_OK;
fail:
    p->n = started + 1;
    pd__cpu_pool_free(p);
    return PD_ENOMEM;
}

void pd__cpu_pool_free(struct pd__cpu_pool *p) {
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n - 1 && p->threads; i++)
        pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_work);
    pthread_cond_destroy(&p->cv_done);
    pd_free(p->threads);
    pd_free(p->args);
    pd_free(p);
}

int pd__cpu_pool_size(const struct pd__cpu_pool *p) {
    return p->n;
}

void pd__cpu_pool_run(struct pd__cpu_pool *p, pd__cpu_task fn, void *ctx) {
    if (p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->pending, p->n - 1);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    if (p->sleepers)
        pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    fn(ctx, 0, p->n);
    for (int i = 0; atomic_load_explicit(&p->pending, memory_order_acquire) && i < PD_POOL_SPIN;
         i++)
        cpu_relax();
    if (atomic_load(&p->pending)) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->pending))
            pthread_cond_wait(&p->cv_done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}
