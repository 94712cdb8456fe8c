/*
 * The request table the schedulers share (common/sched_table.c) and the shared checks of
 * sched_common.c: FIFO order per queued state, untracked states, the add path's refusals with
 * nothing held, find, ended → recycled slots, the recount, the config and size checks, page
 * growth and the retraction order. The schedulers' own tests (test_sched_*.c) drive all of it
 * through them.
 */
#include "pd_test.h"

#include <math.h>

#include "common/base/alloc.h"
#include "common/page_alloc.h"
#include "common/sched_common.h"
#include "common/sched_table.h"

enum { FREE, QA, QB, LOOSE, ENDED, N_STATES };

/* The FIFO of state st, front to back, into out; its length. */
static int fifo(const struct pd__sched_table *t, int st, int32_t *out) {
    int n = 0;
    for (int32_t i = t->q[st].head; i >= 0; i = t->slots.next[i])
        out[n++] = i;
    return n;
}

static int state(const struct pd__sched_table *t, int32_t slot) {
    return pd__sched_table_req(t, slot)->state;
}

static void test_table(void) {
    struct pd__sched_table t = {0};
    uint32_t queued = 1u << QA | 1u << QB | 1u << ENDED; /* LOOSE is tracked by the caller */
    CHECK_OK(pd__sched_table_init(&t, 3, queued, ENDED, sizeof(struct pd__sched_req), NULL, NULL));
    int32_t slot[3], got[3];
    int32_t per_state[PD__SCHED_N_STATES] = {[FREE] = 3};
    CHECK(pd__sched_table_agrees(&t, per_state));

    for (int k = 0; k < 3; k++) {
        CHECK_OK(pd__sched_table_vacant(&t, 100 + (uint64_t)k));
        CHECK_OK(pd__sched_table_add(&t, 100 + (uint64_t)k, 4, &slot[k]));
        CHECK_INT(slot[k], k); /* slot 0 first */
        struct pd__sched_req *r = pd__sched_table_req(&t, slot[k]);
        CHECK(r->room == 100 + (uint64_t)k && r->cap_pages == 4 && r->pending_end == -1 &&
              r->cache_max == -1 && !r->admitted && r->state == FREE);
        r->pages[3] = k; /* the page list is the request's, whole */
        pd__sched_table_move(&t, slot[k], QA, 10 + k);
        CHECK_DBL(r->t_queue, 10 + k, 0);
    }
    CHECK_ERR(pd__sched_table_vacant(&t, 101), PD_EINVAL, "room 101 already has a live request");
    int32_t s = -1;
    CHECK_ERR(pd__sched_table_add(&t, 7, 1, &s), PD_EFULL, "room 7: 3 requests queued");
    CHECK(s == -1);
    CHECK_INT(fifo(&t, QA, got), 3);
    CHECK(got[0] == 0 && got[1] == 1 && got[2] == 2);

    /* out of the middle, to the tail of another FIFO; through an untracked state, which may be
     * the aside slot until it moves */
    pd__sched_table_move(&t, 1, QB, 20);
    pd__sched_table_move(&t, 0, LOOSE, 20);
    t.aside = 0;
    CHECK_INT(state(&t, 0), LOOSE);
    CHECK_INT(fifo(&t, QA, got), 1);
    CHECK_INT(got[0], 2);
    pd__sched_table_move(&t, 0, QB, 21);
    CHECK_INT(t.aside, -1);
    CHECK_INT(fifo(&t, QB, got), 2);
    CHECK(got[0] == 1 && got[1] == 0);
    per_state[FREE] = 0, per_state[QA] = 1, per_state[QB] = 2;
    CHECK(pd__sched_table_agrees(&t, per_state));
    per_state[QB] = 1, per_state[LOOSE] = 1; /* a count that is not the FIFO's */
    CHECK(!pd__sched_table_agrees(&t, per_state));

    int32_t f;
    CHECK_OK(pd__sched_table_find(&t, 102, &f));
    CHECK_INT(f, 2);
    CHECK_ERR(pd__sched_table_find(&t, 99, &f), PD_ENOENT, "room 99: no live request");
    CHECK_OK(pd__sched_table_limit_cache(&t, 102, -5));
    CHECK_INT(pd__sched_table_req(&t, 2)->cache_max, 0);
    CHECK_INT(pd__sched_table_limit_cache(&t, 99, 5), PD_ENOENT);

    /* ending: off the map (the room can come again), oldest ended first, slot reused */
    struct pd_sched_end e;
    CHECK_INT(pd__sched_table_pop_ended(&t, &e), PD_EAGAIN);
    pd__sched_table_req(&t, 0)->n_out = 7;
    pd__sched_table_end(&t, 2, PD_END_TIMEOUT);
    pd__sched_table_end(&t, 0, PD_END_ABORTED);
    CHECK_DBL(pd__sched_table_req(&t, 2)->t_queue, 12, 0); /* entered ended when it was queued */
    CHECK_OK(pd__sched_table_vacant(&t, 102));
    per_state[QA] = 0, per_state[QB] = 1, per_state[LOOSE] = 0, per_state[ENDED] = 2;
    CHECK(pd__sched_table_agrees(&t, per_state));
    CHECK_INT(pd__sched_table_oldest_ended(&t), 2);
    CHECK_OK(pd__sched_table_pop_ended(&t, &e));
    CHECK(e.room == 102 && e.reason == PD_END_TIMEOUT && e.n_output == 0);
    CHECK_INT(state(&t, 2), FREE);
    CHECK(pd__sched_table_req(&t, 2)->pages == NULL);
    CHECK_INT(pd__sched_table_oldest_ended(&t), 0);
    per_state[ENDED] = 1, per_state[FREE] = 1;
    CHECK(pd__sched_table_agrees(&t, per_state));
    CHECK_OK(pd__sched_table_add(&t, 102, 2, &s));
    CHECK_INT(s, 2);

    /* the page list cannot be had: nothing taken */
    CHECK_OK(pd__sched_table_pop_ended(&t, &e));
    CHECK(e.room == 100 && e.reason == PD_END_ABORTED && e.n_output == 7);
    pd_alloc_fail_after(0);
    CHECK_ERR(pd__sched_table_add(&t, 55, 8, &s), PD_ENOMEM, "room 55: page list");
    pd_alloc_fail_after(-1);
    CHECK(t.rooms.n_free == 1);
    CHECK_OK(pd__sched_table_vacant(&t, 55));

    pd__sched_table_free(&t); /* the live ones end, every page list freed (ASan) */
    pd__sched_table_free(&t); /* safe twice */
}

static void test_init_fails_clean(void) {
    for (long k = 0; k < 5; k++) {
        struct pd__sched_table t = {0};
        pd_alloc_fail_after(k);
        int rc = pd__sched_table_init(&t, 4, 1u << ENDED, ENDED, sizeof(struct pd__sched_req), NULL,
                                      NULL);
        pd_alloc_fail_after(-1);
        CHECK(rc == PD_OK || rc == PD_ENOMEM);
        pd__sched_table_free(&t); /* ASan: nothing leaks either way */
    }
}

static void test_config_checks(void) {
    int32_t b = 0;
    CHECK_OK(pd__prefill_budget(16, 64, 8192, &b));
    CHECK_INT(b, 64);
    CHECK_OK(pd__prefill_budget(16, 0, 100, &b)); /* chunking off: the prefill cap */
    CHECK_INT(b, 100);
    CHECK_OK(pd__prefill_budget(16, 64, 0, &b)); /* no cap: the chunk */
    CHECK_INT(b, 64);
    CHECK_ERR(pd__prefill_budget(16, 8, 8192, &b), PD_EINVAL, "budget 8 (chunked prefill size 8");
    CHECK_OK(pd__check_decode_config("decode", 16, 4, 8, 0.7, 0.1, 0.001, 20));
    CHECK_ERR(pd__check_decode_config("colocated", 16, 4, 8, 0.1, 0.7, 0.001, 20), PD_EINVAL,
              "colocated scheduler: page size 16");
    CHECK_ERR(pd__check_decode_config("decode", 16, 0, 8, 0.7, 0.1, 0.001, 20), PD_EINVAL,
              "max running 0");
    CHECK_INT(pd__check_decode_config("decode", 16, 4, 8, 0.7, 0.1, NAN, 20), PD_EINVAL);
    CHECK_INT(pd__check_decode_config("decode", 16, 4, 8, 0.7, 0.1, 0.001, -1), PD_EINVAL);

    double init, min, decay;
    int32_t steps;
    pd__ratio_defaults(&init, &min, &decay, &steps);
    CHECK_OK(pd__check_decode_config("decode", 16, 4, 8, init, min, decay, steps));
    /* the ratio goes from init down to min in 600 steps, as SGLang's defaults */
    CHECK_DBL((init - min) / decay, 600.0, 1e-9);

    struct pd_page_alloc *pa;
    CHECK_OK(pd_page_alloc_new(4, &pa));
    int32_t cap = 0;
    /* 16 prompt + 49 new - 1 never written = 64 tokens: 4 pages, the whole pool */
    CHECK_OK(pd__generation_pages(pa, 16, 1, 16, 49, &cap));
    CHECK_INT(cap, 4);
    CHECK_ERR(pd__generation_pages(pa, 16, 2, 16, 50, &cap), PD_ERANGE,
              "room 2: 16 prompt + 50 new tokens need 5 pages, the pool has 4");
    CHECK_ERR(pd__generation_pages(pa, 16, 3, 0, 5, &cap), PD_EINVAL, "prompt of 0 tokens");
    CHECK_ERR(pd__generation_pages(pa, 16, 3, 5, 0, &cap), PD_EINVAL, "max_new_tokens 0");
    pd_page_alloc_free(pa);
}

static void test_cover_position(void) {
    struct pd_page_alloc *pa;
    CHECK_OK(pd_page_alloc_new(3, &pa));
    int32_t pages[4], n = 0, other;
    CHECK_OK(pd__cover_position(pa, 4, 0, pages, &n, 4));
    CHECK_INT(n, 1);
    CHECK_OK(pd__cover_position(pa, 4, 3, pages, &n, 4)); /* still inside the first page */
    CHECK_INT(n, 1);
    CHECK_OK(pd__cover_position(pa, 4, 9, pages, &n, 4)); /* two more, one call */
    CHECK_INT(n, 3);
    CHECK_INT(pd_page_alloc_n_free(pa), 0);
    /* the pool is dry: nothing taken, the caller frees one and asks again */
    CHECK_INT(pd__cover_position(pa, 4, 12, pages, &n, 4), PD_EAGAIN);
    CHECK_INT(n, 3);
    pd_page_alloc_put(pa, pages, 1);
    other = pages[0];
    pages[0] = pages[1], pages[1] = pages[2], n = 2;
    CHECK_OK(pd__cover_position(pa, 4, 8, pages, &n, 4));
    CHECK_INT(n, 3);
    CHECK_INT(pages[2], other); /* the only free page */
    pd_page_alloc_put(pa, pages, n);
    CHECK_INT(pd_page_alloc_n_free(pa), 3);
    pd_page_alloc_free(pa);
}

static void test_retract_order(void) {
    CHECK(pd__retract_first(3, 10, 5, 10));  /* fewer tokens generated */
    CHECK(!pd__retract_first(5, 99, 3, 10)); /* more generated: a longer prompt does not matter */
    CHECK(pd__retract_first(4, 20, 4, 10));  /* as many: the longer prompt frees more */
    CHECK(!pd__retract_first(4, 10, 4, 10)); /* a tie keeps the first found */
}

PD_TEST_MAIN(PD_TEST(test_table), PD_TEST(test_init_fails_clean), PD_TEST(test_config_checks),
             PD_TEST(test_cover_position), PD_TEST(test_retract_order))
