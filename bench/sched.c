/*
 * bench/sched.c — host time of one scheduling step (issue 4: target <= 20 us, small next to a
 * GPU decode step). Decode: 256 running requests growing pages + 256 waiting in prealloc (held
 * back by --max-running-requests 256, checked every step). Prefill: 256 waiting
 * 1k-token prompts with the prefix cache on, budget 8192, refilled as they finish.
 * Each measured step is step() + batch_done(); prints mean, p50 and p99 in microseconds.
 */
#include "common/page_alloc.h"
#include "common/radix_cache.h"
#include "decode/sched_decode.h"
#include "prefill/sched_prefill.h"
#include "common/base/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { N_RUNNING = 256, N_WAITING = 256, ITERS = 4000, PROMPT = 1024 };

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void report(const char *what, double *t, int n) {
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += t[i];
    qsort(t, (size_t)n, sizeof(double), cmp_dbl);
    printf("%-44s mean %6.2f us  p50 %6.2f us  p99 %6.2f us  (%d steps, target <= 20 us)\n", what,
           sum / n, t[n / 2], t[n * 99 / 100], n);
}

#define DIE_IF(rc)                                                                                 \
    do {                                                                                           \
        if ((rc) != PD_OK) {                                                                       \
            fprintf(stderr, "bench/sched: %s: %s\n", #rc, pd_error_msg());                         \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static void bench_decode(void) {
    static double t[ITERS];
    struct pd_page_alloc *pa;
    struct pd_sched_decode *s;
    struct pd_sched_decode_config cfg = {.page_size = 16,
                                         .max_running_requests = N_RUNNING,
                                         .max_queued_requests = N_RUNNING + N_WAITING,
                                         .waiting_timeout_s = 1e9};
    pd_sched_decode_config_defaults(&cfg);
    /* room for the running ones to grow ITERS tokens each */
    int32_t pool = N_RUNNING * ((PROMPT + ITERS + 16) / 16 + 1) + 64;
    DIE_IF(pd_page_alloc_new(pool, &pa));
    DIE_IF(pd_sched_decode_new(&cfg, pa, NULL, &s));
    for (uint64_t r = 0; r < N_RUNNING; r++)
        DIE_IF(pd_sched_decode_add(s, r, NULL, PROMPT, ITERS + 16, 0));
    struct pd_decode_step st;
    DIE_IF(pd_sched_decode_step(s, 0, &st));
    for (uint64_t r = 0; r < N_RUNNING; r++)
        DIE_IF(pd_sched_decode_transfer_done(s, r, PD_OK, 0));
    for (uint64_t r = 0; r < N_WAITING; r++)
        DIE_IF(pd_sched_decode_add(s, 1000 + r, NULL, PROMPT, ITERS + 16, 0));
    for (int i = 0; i < ITERS; i++) {
        double t0 = now_us();
        DIE_IF(pd_sched_decode_step(s, 1 + i, &st));
        DIE_IF(pd_sched_decode_batch_done(s, &st, NULL, 1 + i));
        t[i] = now_us() - t0;
        if (st.n_batch != N_RUNNING || st.n_admitted != 0) {
            fprintf(stderr, "bench/sched: decode batch %d admitted %d\n", (int)st.n_batch,
                    (int)st.n_admitted);
            exit(1);
        }
    }
    report("decode step, 256 running + 256 waiting:", t, ITERS);
    pd_sched_decode_free(s);
    pd_page_alloc_free(pa);
}

static void bench_prefill(void) {
    static double t[ITERS];
    /* a ring of prompts: at most 256 live, so a buffer is rewritten only after its request ended */
    static int32_t tokens[N_WAITING * 2][PROMPT];
    struct pd_page_alloc *pa;
    struct pd_radix_cache *rc;
    struct pd_sched_prefill *s;
    struct pd_sched_prefill_config cfg = {.page_size = 16,
                                          .chunked_prefill_size = 8192,
                                          .max_prefill_tokens = 16384,
                                          .max_queued_requests = N_WAITING * 2,
                                          .bootstrap_timeout_s = 1e9};
    DIE_IF(pd_page_alloc_new(N_WAITING * 2 * PROMPT / 16, &pa));
    DIE_IF(pd_radix_cache_new(pa, 16, false, &rc));
    DIE_IF(pd_sched_prefill_new(&cfg, pa, rc, &s));
    uint64_t next = 0;
    int live = 0;
    for (int i = 0; i < ITERS; i++) {
        while (live < N_WAITING) {
            int32_t *tk = tokens[next % (N_WAITING * 2)];
            for (int k = 0; k < PROMPT; k++) /* a 256-token shared system prompt, then unique */
                tk[k] = k < 256 ? k : (int32_t)(next * PROMPT + (uint64_t)k);
            DIE_IF(pd_sched_prefill_add(s, next, tk, PROMPT, i));
            struct pd_prefill_send none; /* not eager: nothing computed before the Transfer */
            DIE_IF(pd_sched_prefill_bootstrapped(s, next, i, &none));
            next++, live++;
        }
        struct pd_prefill_batch b;
        double t0 = now_us();
        DIE_IF(pd_sched_prefill_step(s, i, &b));
        DIE_IF(pd_sched_prefill_batch_done(s, &b, i));
        t[i] = now_us() - t0;
        for (int32_t c = 0; c < b.n; c++)
            if (b.chunks[c].last && !b.chunks[c].dropped) {
                DIE_IF(pd_sched_prefill_transfer_done(s, b.chunks[c].room, PD_OK, i));
                live--;
            }
        struct pd_sched_end e;
        while (pd_sched_prefill_pop_ended(s, &e) == PD_OK)
            ;
    }
    report("prefill step, 256 waiting, budget 8192:", t, ITERS);
    pd_sched_prefill_free(s);
    pd_radix_cache_free(rc);
    pd_page_alloc_free(pa);
}

int main(void) {
    bench_decode();
    bench_prefill();
    return 0;
}
