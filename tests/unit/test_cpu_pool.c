/*
 * test_cpu_pool.c — the cpu backend's thread pool: every part of every task runs exactly once
 * and is finished when run() returns, also with more threads than cores (workers the OS has not
 * scheduled: the caller claims their parts) and over many short tasks back to back (the
 * generation word must keep a late worker from running a part of a task that has moved on).
 */
#include "pd_test.h"

#include "model/cpu/backend_cpu.h"

#include <stdatomic.h>

#define MAX_PARTS 16

struct count_task {
    atomic_int hits[MAX_PARTS];
    atomic_int bad_nth;
    int expect_nth;
    int task; /* which task of the sequence this is */
    atomic_int wrong_task;
    const int *current; /* the task the caller is in */
};

static void count_fn(void *ctx, int part, int nth) {
    struct count_task *t = ctx;
    if (nth != t->expect_nth || part < 0 || part >= nth) {
        atomic_fetch_add(&t->bad_nth, 1);
        return;
    }
    if (*t->current != t->task) /* a part of an old task run during a newer one */
        atomic_fetch_add(&t->wrong_task, 1);
    atomic_fetch_add(&t->hits[part], 1);
}

static void run_many(int threads, int tasks) {
    struct pd__cpu_pool *p = NULL;
    CHECK_OK(pd__cpu_pool_new(threads, &p));
    if (!p)
        return;
    CHECK_INT(pd__cpu_pool_size(p), threads);
    static struct count_task t;
    int current = 0, missed = 0, doubled = 0;
    for (int k = 0; k < tasks; k++) {
        memset(&t, 0, sizeof(t));
        t.expect_nth = threads;
        t.task = k;
        t.current = &current;
        current = k;
        pd__cpu_pool_run(p, count_fn, &t);
        for (int i = 0; i < threads; i++) {
            int h = atomic_load(&t.hits[i]);
            missed += h == 0;
            doubled += h > 1;
        }
        CHECK_INT(atomic_load(&t.bad_nth), 0);
        CHECK_INT(atomic_load(&t.wrong_task), 0);
    }
    CHECK_INT(missed, 0);
    CHECK_INT(doubled, 0);
    pd__cpu_pool_free(p);
}

static void test_single(void) {
    run_many(1, 1000);
}

static void test_two(void) {
    run_many(2, 200000);
}

/* 8 and 16 threads on a 2-core machine: most workers are not running when a task is posted */
static void test_oversubscribed(void) {
    run_many(8, 50000);
    run_many(16, 20000);
}

static void test_bad_size(void) {
    struct pd__cpu_pool *p = NULL;
    CHECK_INT(pd__cpu_pool_new(0, &p), PD_EINVAL);
    CHECK(p == NULL);
}

PD_TEST_MAIN(PD_TEST(test_single), PD_TEST(test_two), PD_TEST(test_oversubscribed),
             PD_TEST(test_bad_size))
