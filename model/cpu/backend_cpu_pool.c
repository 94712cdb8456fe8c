/*
 * backend_cpu_pool.c — the cpu backend's fixed set of worker threads.
 *
 * One task at a time, split into n parts (n = the pool's threads; part i uses thread-scratch
 * slot i). run() publishes (fn, ctx) under a new generation number and then every thread,
 * the caller included, claims parts until none is left, so a worker the OS has not scheduled
 * (a loaded machine) costs nothing: the caller runs its part instead of waiting a time slice
 * for it. The generation and the next unclaimed part share one atomic word, so a claim made
 * with a stale generation fails, and a part's (fn, ctx) cannot change before it is done (the
 * next task starts only when every part of this one is). Workers spin briefly on the word
 * before sleeping on a condition variable, because a decode step issues hundreds of short tasks
 * back to back and a futex wake per task would cost more than the task; the spin is bounded so
 * idle workers do not burn a core. While spinning a thread yields its core every
 * PD_POOL_YIELD_EVERY pauses: on an idle machine that is a syscall that returns at once, on a
 * busy one (the prefill and decode daemons of one host share its cores) the runnable threads of
 * the other process get the core instead of watching it spin — a decoding daemon's workers spun
 * through every gap between its steps and took a core from the other daemon's forward pass.
 * Threads are created at init and joined at free; nothing is allocated per task.
 */
#include "model/cpu/backend_cpu.h"
#include "common/base/alloc.h"
#include "common/base/status.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define PD_POOL_SPIN 20000      /* pauses before sleeping (~0.2-0.3 ms on recent x86) */
#define PD_POOL_YIELD_EVERY 256 /* pauses between two sched_yield calls while spinning */

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
    _Atomic uint64_t state; /* generation << 32 | next unclaimed part of its task */
    atomic_int done;        /* parts of the current task finished */
    int sleepers;           /* workers waiting on cv_work (under mu) */
    bool stop;
    pd__cpu_task fn;
    void *ctx;
};

static inline uint32_t gen_of(uint64_t st) {
    return (uint32_t)(st >> 32);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Spin round i: a pause, and every PD_POOL_YIELD_EVERY rounds the core to whoever waits for it. */
static inline void spin_round(int i) {
    cpu_relax();
    if (i % PD_POOL_YIELD_EVERY == PD_POOL_YIELD_EVERY - 1)
        sched_yield();
}

/* Claims and runs parts of generation g until none is left; the claim is a CAS on the shared
 * word, so it fails once the task has moved on. Returns the parts this thread ran. */
static int run_parts(struct pd__cpu_pool *p, uint32_t g) {
    int ran = 0;
    uint64_t st = atomic_load_explicit(&p->state, memory_order_acquire);
    for (;;) {
        if (gen_of(st) != g || (int)(uint32_t)st >= p->n)
            return ran;
        if (!atomic_compare_exchange_weak_explicit(&p->state, &st, st + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        int part = (int)(uint32_t)st;
        p->fn(p->ctx, part, p->n); /* stable: the task cannot end before this part does */
        ran++;
        if (atomic_fetch_add_explicit(&p->done, 1, memory_order_acq_rel) + 1 == p->n) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
        st = atomic_load_explicit(&p->state, memory_order_acquire);
    }
}

static void *worker_main(void *arg) {
    struct worker_arg *wa = arg;
    struct pd__cpu_pool *p = wa->pool;
    uint32_t seen = 0;
    for (;;) {
        uint32_t g = gen_of(atomic_load_explicit(&p->state, memory_order_acquire));
        for (int i = 0; g == seen && i < PD_POOL_SPIN; i++) {
            spin_round(i);
            g = gen_of(atomic_load_explicit(&p->state, memory_order_acquire));
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            p->sleepers++;
            while ((g = gen_of(atomic_load(&p->state))) == seen && !p->stop)
                pthread_cond_wait(&p->cv_work, &p->mu);
            p->sleepers--;
            bool stop = p->stop;
            pthread_mutex_unlock(&p->mu);
            if (stop)
                return NULL;
        }
        seen = g;
        run_parts(p, g);
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
    /* the previous task is complete (every part done), so no worker reads fn/ctx now */
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    uint32_t g = gen_of(atomic_load_explicit(&p->state, memory_order_relaxed)) + 1;
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&p->state, (uint64_t)g << 32, memory_order_release);
    if (p->sleepers)
        pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    run_parts(p, g);
    for (int i = 0; atomic_load_explicit(&p->done, memory_order_acquire) < p->n && i < PD_POOL_SPIN;
         i++)
        spin_round(i);
    if (atomic_load(&p->done) < p->n) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->done) < p->n)
            pthread_cond_wait(&p->cv_done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}
