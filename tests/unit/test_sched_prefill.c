/* Prefill scheduler: the seeds' worked example (page size 1 and 16), sendable page ranges, the
 * prefix cache on a shared system prompt, memory admission in FIFO order, timeouts, aborts in
 * every queue, transfer failures, bounds and allocation failures; eager prefill (computing
 * before the Transfer): what is held, what the Transfer releases, and its timeout. */
#include "pd_test.h"

#include "common/base/alloc.h"
#include "common/page_alloc.h"
#include "common/radix_cache.h"
#include "prefill/sched_prefill.h"

/* what a Transfer releases: nothing, unless the scheduler is eager */
static struct pd_prefill_send unsent;

struct env {
    struct pd_page_alloc *pa;
    struct pd_radix_cache *rc;
    struct pd_sched_prefill *s;
};

static void env_init_eager(struct env *e, int32_t page_size, int32_t pool_pages, int32_t chunk,
                           int32_t max_prefill, bool cache, bool eager) {
    struct pd_sched_prefill_config cfg = {.page_size = page_size,
                                          .chunked_prefill_size = chunk,
                                          .max_prefill_tokens = max_prefill,
                                          .max_queued_requests = 16,
                                          .bootstrap_timeout_s = 300,
                                          .eager = eager};
    CHECK_OK(pd_page_alloc_new(pool_pages, &e->pa));
    e->rc = NULL;
    if (cache)
        CHECK_OK(pd_radix_cache_new(e->pa, page_size, false, &e->rc));
    CHECK_OK(pd_sched_prefill_new(&cfg, e->pa, e->rc, &e->s));
}

static void env_init(struct env *e, int32_t page_size, int32_t pool_pages, int32_t chunk,
                     int32_t max_prefill, bool cache) {
    env_init_eager(e, page_size, pool_pages, chunk, max_prefill, cache, false);
}

/* Everything back: after the cache is flushed the pool is whole again. */
static void env_free(struct env *e) {
    CHECK_OK(pd_sched_prefill_check(e->s));
    pd_sched_prefill_free(e->s);
    if (e->rc)
        pd_radix_cache_flush(e->rc);
    CHECK_INT(pd_page_alloc_n_free(e->pa), pd_page_alloc_n_total(e->pa));
    pd_radix_cache_free(e->rc);
    pd_page_alloc_free(e->pa);
}

static int32_t *distinct_tokens(int32_t n, int32_t base) {
    int32_t *t = pd_malloc((size_t)n * sizeof(int32_t));
    for (int32_t i = 0; i < n; i++)
        t[i] = base + i;
    return t;
}

/* One step + batch done; the chunks as batch_done left them are copied to out (room, start,
 * len, last, send range, held). */
static int32_t run_step(struct env *e, double now, struct pd_prefill_chunk *out, int32_t max) {
    struct pd_prefill_batch b;
    CHECK_OK(pd_sched_prefill_step(e->s, now, &b));
    CHECK(b.n <= max);
    CHECK_OK(pd_sched_prefill_batch_done(e->s, &b, now));
    for (int32_t i = 0; i < b.n && i < max; i++)
        out[i] = b.chunks[i];
    CHECK_OK(pd_sched_prefill_check(e->s));
    return b.n;
}

struct want {
    uint64_t room;
    int32_t start, len;
    bool last;
    int32_t send_begin, send_end;
};

static void check_round(struct env *e, int round, const struct want *w, int32_t n) {
    struct pd_prefill_chunk got[8];
    int32_t k = run_step(e, round, got, 8);
    CHECK_INT(k, n);
    for (int32_t i = 0; i < n && i < k; i++) {
        if (got[i].room != w[i].room || got[i].start != w[i].start || got[i].len != w[i].len ||
            got[i].last != w[i].last || got[i].send_begin != w[i].send_begin ||
            got[i].send_end != w[i].send_end) {
            fprintf(stderr,
                    "round %d chunk %d: got room %llu [%d+%d] last %d send [%d,%d), want room "
                    "%llu [%d+%d] last %d send [%d,%d)\n",
                    round, (int)i, (unsigned long long)got[i].room, (int)got[i].start,
                    (int)got[i].len, (int)got[i].last, (int)got[i].send_begin, (int)got[i].send_end,
                    (unsigned long long)w[i].room, (int)w[i].start, (int)w[i].len, (int)w[i].last,
                    (int)w[i].send_begin, (int)w[i].send_end);
            CHECK(0);
        }
    }
}

enum { A = 1, B = 2, C = 3 };

static void add_abc(struct env *e, int32_t **ta, int32_t **tb, int32_t **tc) {
    *ta = distinct_tokens(5000, 0);
    *tb = distinct_tokens(500, 100000);
    *tc = distinct_tokens(1200, 200000);
    CHECK_OK(pd_sched_prefill_add(e->s, A, *ta, 5000, 0));
    CHECK_OK(pd_sched_prefill_add(e->s, B, *tb, 500, 0));
    CHECK_OK(pd_sched_prefill_add(e->s, C, *tc, 1200, 0));
    for (uint64_t r = A; r <= C; r++)
        CHECK_OK(pd_sched_prefill_bootstrapped(e->s, r, 0, &unsent));
}

static void finish_abc(struct env *e, int32_t *ta, int32_t *tb, int32_t *tc) {
    struct pd_prefill_counts c;
    pd_sched_prefill_counts(e->s, &c);
    CHECK_INT(c.inflight, 3);
    for (uint64_t r = A; r <= C; r++)
        CHECK_OK(pd_sched_prefill_transfer_done(e->s, r, PD_OK, 5));
    struct pd_sched_end end;
    for (uint64_t r = A; r <= C; r++) {
        CHECK_OK(pd_sched_prefill_pop_ended(e->s, &end));
        CHECK_INT(end.room, r);
        CHECK_INT(end.reason, PD_END_DONE);
    }
    CHECK_INT(pd_sched_prefill_pop_ended(e->s, &end), PD_EAGAIN);
    pd_free(ta);
    pd_free(tb);
    pd_free(tc);
}

/* Seed 001: budget 2000, A 5000, B 500, C 1200, page size 1. The rounds are the seed's own. */
static void test_worked_example_page1(void) {
    for (int cache = 0; cache <= 1; cache++) {
        struct env e;
        int32_t *ta, *tb, *tc;
        env_init(&e, 1, 10000, 2000, 16384, cache);
        add_abc(&e, &ta, &tb, &tc);
        check_round(&e, 1, (struct want[]){{A, 0, 2000, false, 0, 2000}}, 1);
        check_round(&e, 2, (struct want[]){{A, 2000, 2000, false, 2000, 4000}}, 1);
        check_round(&e, 3,
                    (struct want[]){{A, 4000, 1000, true, 4000, 5000},
                                    {B, 0, 500, true, 0, 500},
                                    {C, 0, 500, false, 0, 500}},
                    3);
        check_round(&e, 4, (struct want[]){{C, 500, 700, true, 500, 1200}}, 1);
        check_round(&e, 5, NULL, 0);
        finish_abc(&e, ta, tb, tc);
        env_free(&e);
    }
}

/* The same with 16-token pages. Derivation by the rule: 2000 = 125 pages, so A's first two cuts
 * are unchanged and send pages [0,125), [125,250). Round 3: A's last 1000 tokens are the final
 * chunk (send up to ceil(5000/16) = 313, the partial last page included), B's 500 (32 pages,
 * the last one partial), leaving 500 tokens, cut down to whole pages: 31 pages = 496 tokens of C
 * (send [0,31)). Round 4: C's other 704 tokens, pages [31, 75) (1200 = 75 pages exactly). */
static void test_worked_example_page16(void) {
    struct env e;
    int32_t *ta, *tb, *tc;
    env_init(&e, 16, 1000, 2000, 16384, true);
    add_abc(&e, &ta, &tb, &tc);
    check_round(&e, 1, (struct want[]){{A, 0, 2000, false, 0, 125}}, 1);
    check_round(&e, 2, (struct want[]){{A, 2000, 2000, false, 125, 250}}, 1);
    check_round(&e, 3,
                (struct want[]){{A, 4000, 1000, true, 250, 313},
                                {B, 0, 500, true, 0, 32},
                                {C, 0, 496, false, 0, 31}},
                3);
    check_round(&e, 4, (struct want[]){{C, 496, 704, true, 31, 75}}, 1);
    finish_abc(&e, ta, tb, tc);
    env_free(&e);
}

/* max_prefill_tokens below the chunk size is the budget; without chunking it caps a batch but
 * a longer prompt still runs, alone. */
static void test_prefill_cap_and_unchunked(void) {
    struct env e;
    int32_t *ta, *tb, *tc;
    env_init(&e, 16, 1000, 2000, 1000, false); /* budget min(2000, 1000) = 1000 = 62.5 pages */
    add_abc(&e, &ta, &tb, &tc);
    check_round(&e, 1, (struct want[]){{A, 0, 992, false, 0, 62}}, 1);
    pd_sched_prefill_free(e.s);
    pd_free(ta), pd_free(tb), pd_free(tc);
    CHECK_INT(pd_page_alloc_n_free(e.pa), 1000);
    pd_page_alloc_free(e.pa);

    env_init(&e, 16, 1000, -1, 1000, false); /* no chunking, cap 1000 */
    add_abc(&e, &ta, &tb, &tc);
    check_round(&e, 1, (struct want[]){{A, 0, 5000, true, 0, 313}}, 1); /* alone */
    check_round(&e, 2, (struct want[]){{B, 0, 500, true, 0, 32}}, 1);   /* C would pass 1000 */
    check_round(&e, 3, (struct want[]){{C, 0, 1200, true, 0, 75}}, 1);
    finish_abc(&e, ta, tb, tc);
    env_free(&e);
}

/* A 1024-token system prompt shared by 8 requests of 1024 + 100 tokens: the first computes all
 * 1124; each later one finds the 64 shared pages cached (its own tail pages differ) and computes
 * 100. Without the cache every request computes 1124. */
static void test_prefix_cache_shared_system_prompt(void) {
    enum { N = 8, SYS = 1024, TAIL = 100, LEN = SYS + TAIL };
    for (int cache = 0; cache <= 1; cache++) {
        struct env e;
        env_init(&e, 16, 2000, 512, 16384, cache);
        static int32_t toks[N][LEN];
        for (int i = 0; i < N; i++)
            for (int t = 0; t < LEN; t++)
                toks[i][t] = t < SYS ? 7 * t : 100000 * (i + 1) + t;
        int64_t computed = 0, sent_pages = 0;
        struct pd_prefill_chunk got[8];
        double now = 0;
        for (int i = 0; i < N; i++) {
            CHECK_OK(pd_sched_prefill_add(e.s, 100 + i, toks[i], LEN, now));
            CHECK_OK(pd_sched_prefill_bootstrapped(e.s, 100 + i, now, &unsent));
            struct pd_prefill_counts c;
            do {
                int32_t k = run_step(&e, now += 1, got, 8);
                for (int32_t j = 0; j < k; j++) {
                    computed += got[j].len;
                    sent_pages += got[j].send_end - got[j].send_begin;
                }
                pd_sched_prefill_counts(e.s, &c);
            } while (c.waiting > 0);
            CHECK_OK(pd_sched_prefill_transfer_done(e.s, 100 + i, PD_OK, now));
            struct pd_sched_end end;
            CHECK_OK(pd_sched_prefill_pop_ended(e.s, &end));
            CHECK_INT(end.cached_tokens, cache && i > 0 ? SYS : 0);
        }
        CHECK_INT(computed, cache ? LEN + (N - 1) * TAIL : N * LEN);
        CHECK_INT(sent_pages, N * ((LEN + 15) / 16)); /* decode gets every page either way */
        if (cache) {
            struct pd_page_stats st;
            pd_page_alloc_stats(e.pa, &st);
            CHECK_INT(st.used, 0);
            CHECK(st.cached >= SYS / 16);
        }
        env_free(&e);
    }
}

/* Pool of 100 pages (page 1): a 60-token head that does not fit waits and nobody behind it
 * (even a 10-token one that would fit) goes first. */
static void test_memory_admission_fifo(void) {
    struct env e;
    env_init(&e, 1, 100, 2000, 16384, false);
    int32_t *t1 = distinct_tokens(50, 0), *t2 = distinct_tokens(60, 1000),
            *t3 = distinct_tokens(10, 2000);
    CHECK_OK(pd_sched_prefill_add(e.s, 1, t1, 50, 0));
    CHECK_OK(pd_sched_prefill_bootstrapped(e.s, 1, 0, &unsent));
    check_round(&e, 1, (struct want[]){{1, 0, 50, true, 0, 50}}, 1);
    CHECK_OK(pd_sched_prefill_add(e.s, 2, t2, 60, 1));
    CHECK_OK(pd_sched_prefill_add(e.s, 3, t3, 10, 1));
    CHECK_OK(pd_sched_prefill_bootstrapped(e.s, 2, 1, &unsent));
    CHECK_OK(pd_sched_prefill_bootstrapped(e.s, 3, 1, &unsent));
    check_round(&e, 2, NULL, 0); /* 50 free < 60 */
    CHECK_OK(pd_sched_prefill_transfer_done(e.s, 1, PD_OK, 2));
    check_round(&e, 3, (struct want[]){{2, 0, 60, true, 0, 60}, {3, 0, 10, true, 0, 10}}, 2);
    CHECK_OK(pd_sched_prefill_transfer_done(e.s, 2, PD_OK, 4));
    CHECK_OK(pd_sched_prefill_transfer_done(e.s, 3, PD_OK, 4));
    pd_free(t1), pd_free(t2), pd_free(t3);
    env_free(&e);
}

static int pop_reason(struct env *e, uint64_t room) {
    struct pd_sched_end end;
    int rc = pd_sched_prefill_pop_ended(e->s, &end);
    CHECK_OK(rc);
    CHECK_INT(end.room, room);
    return rc == PD_OK ? end.reason : -1;
}

static void test_timeouts_aborts_failures(void) {
    struct env e;
    env_init(&e, 16, 100, 64, 16384, true); /* budget 4 pages */
    int32_t *t = distinct_tokens(200, 0);
    bool q;
    /* bootstrap timeout at exactly 300 s */
    CHECK_OK(pd_sched_prefill_add(e.s, 1, t, 200, 0));
    check_round(&e, 299, NULL, 0);
    check_round(&e, 300, NULL, 0);
    CHECK_INT(pop_reason(&e, 1), PD_END_TIMEOUT);
    CHECK_ERR(pd_sched_prefill_bootstrapped(e.s, 1, 300, &unsent), PD_ENOENT,
              "room 1: no live request");
    /* abort in bootstrap and in waiting: ends at once */
    CHECK_OK(pd_sched_prefill_add(e.s, 2, t, 200, 300));
    CHECK_OK(pd_sched_prefill_abort(e.s, 2, &q));
    CHECK(!q);
    CHECK_INT(pop_reason(&e, 2), PD_END_ABORTED);
    CHECK_OK(pd_sched_prefill_add(e.s, 3, t, 200, 300));
    CHECK_OK(pd_sched_prefill_bootstrapped(e.s, 3, 300, &unsent));
    CHECK_OK(pd_sched_prefill_abort(e.s, 3, &q));
    CHECK(!q);
    CHECK_INT(pop_reason(&e, 3), PD_END_ABORTED);
    /* abort while half done, pages sent: drains until released */
    CHECK_OK(pd_sched_prefill_add(e.s, 4, t, 200, 300));
    CHECK_OK(pd_sched_prefill_bootstrapped(e.s, 4, 300, &unsent));
    check_round(&e, 301, (struct want[]){{4, 0, 64, false, 0, 4}}, 1);
    CHECK_OK(pd_sched_prefill_abort(e.s, 4, &q));
    CHECK(q);
    struct pd_prefill_counts c;
    pd_sched_prefill_counts(e.s, &c);
    CHECK_INT(c.draining, 1);
    CHECK_INT(c.waiting, 0);
    CHECK(pd_page_alloc_n_free(e.pa) < 100); /* still held: the engine may be reading them */
    check_round(&e, 302, NULL, 0);           /* a draining request is not scheduled */
    CHECK_ERR(pd_sched_prefill_release(e.s, 5), PD_ENOENT, "room 5");
    CHECK_OK(pd_sched_prefill_release(e.s, 4));
    CHECK_INT(pop_reason(&e, 4), PD_END_ABORTED);
    /* abort inside the running step: applied at batch_done, the chunk is dropped */
    CHECK_OK(pd_sched_prefill_add(e.s, 5, t, 200, 302));
    CHECK_OK(pd_sched_prefill_bootstrapped(e.s, 5, 302, &unsent));
    struct pd_prefill_batch b;
    CHECK_OK(pd_sched_prefill_step(e.s, 303, &b));
    CHECK_INT(b.n, 1);
    CHECK_ERR(pd_sched_prefill_step(e.s, 303, &b), PD_EINVAL, "not done");
    CHECK_OK(pd_sched_prefill_abort(e.s, 5, &q));
    CHECK(!q);
    CHECK_OK(pd_sched_prefill_batch_done(e.s, &b, 304));
    CHECK(b.chunks[0].dropped && !b.chunks[0].quiesce);
    CHECK_INT(b.chunks[0].send_end, b.chunks[0].send_begin);
    CHECK_INT(pop_reason(&e, 5), PD_END_ABORTED);
    /* Room 4's first 4 pages are cached (room 5's chunk was dropped, never cached): room 6,
     * the same prompt, starts computing at token 64 and its first send includes the 4 cached
     * pages. Its second chunk is aborted in the step after that send: dropped, quiesce. */
    CHECK_OK(pd_sched_prefill_add(e.s, 6, t, 200, 304));
    CHECK_OK(pd_sched_prefill_bootstrapped(e.s, 6, 304, &unsent));
    check_round(&e, 305, (struct want[]){{6, 64, 64, false, 0, 8}}, 1);
    CHECK_OK(pd_sched_prefill_step(e.s, 306, &b));
    CHECK_OK(pd_sched_prefill_abort(e.s, 6, &q));
    CHECK_OK(pd_sched_prefill_batch_done(e.s, &b, 306));
    CHECK(b.chunks[0].dropped && b.chunks[0].quiesce);
    CHECK_OK(pd_sched_prefill_release(e.s, 6));
    CHECK_INT(pop_reason(&e, 6), PD_END_ABORTED);
    /* inflight: abort drains; transfer failure ends failed; done only from inflight */
    CHECK_OK(pd_sched_prefill_add(e.s, 7, t, 50, 306));
    CHECK_OK(pd_sched_prefill_add(e.s, 8, t + 50, 50, 306));
    CHECK_ERR(pd_sched_prefill_transfer_done(e.s, 7, PD_OK, 306), PD_EINVAL,
              "transfer done while bootstrap");
    CHECK_OK(pd_sched_prefill_bootstrapped(e.s, 7, 306, &unsent));
    CHECK_OK(pd_sched_prefill_bootstrapped(e.s, 8, 306, &unsent));
    struct pd_prefill_chunk g[8];
    for (int i = 0; i < 4 && (pd_sched_prefill_counts(e.s, &c), c.inflight < 2); i++)
        run_step(&e, 307, g, 8);
    CHECK_INT(c.inflight, 2);
    CHECK_OK(pd_sched_prefill_abort(e.s, 7, &q));
    CHECK(q);
    CHECK_OK(pd_sched_prefill_transfer_done(e.s, 7, PD_EPEER, 308)); /* engine quiesced */
    CHECK_INT(pop_reason(&e, 7), PD_END_ABORTED);
    CHECK_OK(pd_sched_prefill_transfer_done(e.s, 8, PD_EPEER, 308));
    CHECK_INT(pop_reason(&e, 8), PD_END_FAILED);
    pd_free(t);
    env_free(&e);
}

static void check_send(const struct pd_prefill_send *s, int32_t begin, int32_t end, bool last) {
    if (s->begin != begin || s->end != end || s->last != last) {
        fprintf(stderr, "released [%d,%d) last %d, want [%d,%d) last %d\n", (int)s->begin,
                (int)s->end, (int)s->last, (int)begin, (int)end, (int)last);
        CHECK(0);
    }
}

/* Eager: requests compute in arrival order whether paired or not; an unpaired one's chunks are
 * held (empty sends) and its Transfer releases what was computed: between steps at once, during
 * a step through batch_done's chunk. One never paired times out with its pages back. */
static void test_eager(void) {
    struct env e;
    env_init_eager(&e, 16, 64, 32, 4096, false, true);
    int32_t *t1 = distinct_tokens(100, 0), *t2 = distinct_tokens(40, 1000),
            *t3 = distinct_tokens(20, 2000);
    CHECK_OK(pd_sched_prefill_add(e.s, 1, t1, 100, 0));          /* 7 pages, chunks of 32 tokens */
    CHECK_OK(pd_sched_prefill_add(e.s, 2, t2, 40, 1));           /* 3 pages */
    CHECK_OK(pd_sched_prefill_bootstrapped(e.s, 2, 1, &unsent)); /* waits, paired */
    check_send(&unsent, 0, 0, false);
    /* room 1 came first: it computes, unpaired, before the paired room 2 */
    check_round(&e, 2, (struct want[]){{1, 0, 32, false, 0, 0}}, 1);
    check_round(&e, 3, (struct want[]){{1, 32, 32, false, 0, 0}}, 1);
    struct pd_prefill_counts c;
    pd_sched_prefill_counts(e.s, &c);
    CHECK_INT(c.bootstrap, 1); /* room 1: half done, but its Transfer has not come */
    CHECK_INT(c.waiting, 1);   /* room 2 */
    /* the Transfer between steps: the 4 computed pages go at once */
    struct pd_prefill_send s;
    CHECK_OK(pd_sched_prefill_bootstrapped(e.s, 1, 4, &s));
    check_send(&s, 0, 4, false);
    pd_sched_prefill_counts(e.s, &c);
    CHECK(c.bootstrap == 0 && c.waiting == 2);
    CHECK_ERR(pd_sched_prefill_bootstrapped(e.s, 1, 4, &s), PD_EINVAL, "paired already");
    check_round(&e, 5, (struct want[]){{1, 64, 32, false, 4, 6}}, 1);
    /* room 2 (paired) gets the page-aligned rest of the budget */
    check_round(&e, 6, (struct want[]){{1, 96, 4, true, 6, 7}, {2, 0, 16, false, 0, 1}}, 2);
    check_round(&e, 7, (struct want[]){{2, 16, 24, true, 1, 3}}, 1);
    CHECK_OK(pd_sched_prefill_transfer_done(e.s, 1, PD_OK, 8));
    CHECK_OK(pd_sched_prefill_transfer_done(e.s, 2, PD_OK, 8));
    struct pd_sched_end end;
    CHECK_OK(pd_sched_prefill_pop_ended(e.s, &end));
    CHECK_OK(pd_sched_prefill_pop_ended(e.s, &end));

    /* room 3 computes completely before its Transfer: held, then released whole, first token
     * with it */
    CHECK_OK(pd_sched_prefill_add(e.s, 3, t3, 20, 10));
    struct pd_prefill_chunk got[2];
    CHECK_INT(run_step(&e, 10, got, 2), 1);
    CHECK(got[0].last && got[0].held && got[0].send_begin == 0 && got[0].send_end == 0);
    pd_sched_prefill_counts(e.s, &c);
    CHECK(c.bootstrap == 1 && c.inflight == 0); /* computed, still waiting for its decode */
    CHECK_OK(pd_sched_prefill_bootstrapped(e.s, 3, 11, &s));
    pd_sched_prefill_counts(e.s, &c);
    CHECK(c.bootstrap == 0 && c.inflight == 1);
    check_send(&s, 0, 2, true);
    CHECK_OK(pd_sched_prefill_transfer_done(e.s, 3, PD_OK, 12));
    CHECK_OK(pd_sched_prefill_pop_ended(e.s, &end));
    CHECK_INT(end.reason, PD_END_DONE);

    /* the Transfer during the step: batch_done's chunk carries all computed pages */
    CHECK_OK(pd_sched_prefill_add(e.s, 4, t1, 100, 20));
    CHECK_INT(run_step(&e, 20, got, 2), 1); /* [0, 32) held */
    CHECK(got[0].held);
    struct pd_prefill_batch b;
    CHECK_OK(pd_sched_prefill_step(e.s, 21, &b));
    CHECK_INT(b.n, 1);
    CHECK_OK(pd_sched_prefill_bootstrapped(e.s, 4, 21, &s));
    check_send(&s, 0, 0, false); /* in the step: nothing now */
    CHECK_OK(pd_sched_prefill_batch_done(e.s, &b, 21));
    CHECK(!b.chunks[0].held && b.chunks[0].send_begin == 0 && b.chunks[0].send_end == 4);
    bool q;
    CHECK_OK(pd_sched_prefill_abort(e.s, 4, &q));
    CHECK(q); /* pages went out: drains until the endpoint is closed */
    CHECK_OK(pd_sched_prefill_release(e.s, 4));
    CHECK_OK(pd_sched_prefill_pop_ended(e.s, &end));
    CHECK_INT(end.reason, PD_END_ABORTED);

    /* never paired: computed, held, and timed out in inflight; aborted unpaired: ends at once */
    CHECK_OK(pd_sched_prefill_add(e.s, 5, t3, 20, 30));
    CHECK_INT(run_step(&e, 30, got, 2), 1);
    CHECK_INT(run_step(&e, 329, got, 2), 0);
    CHECK_OK(pd_sched_prefill_check(e.s));
    CHECK_INT(run_step(&e, 330, got, 2), 0);
    CHECK_OK(pd_sched_prefill_pop_ended(e.s, &end));
    CHECK_INT(end.room, 5);
    CHECK_INT(end.reason, PD_END_TIMEOUT);
    CHECK_OK(pd_sched_prefill_add(e.s, 6, t1, 100, 400));
    CHECK_INT(run_step(&e, 400, got, 2), 1);
    CHECK_OK(pd_sched_prefill_abort(e.s, 6, &q));
    CHECK(!q);
    CHECK_OK(pd_sched_prefill_pop_ended(e.s, &end));
    CHECK_INT(end.reason, PD_END_ABORTED);
    /* half done and never paired: the timeout ends the half-done one too */
    CHECK_OK(pd_sched_prefill_add(e.s, 7, t1, 100, 500));
    CHECK_INT(run_step(&e, 500, got, 2), 1);
    CHECK_INT(run_step(&e, 800, got, 2), 0);
    CHECK_OK(pd_sched_prefill_pop_ended(e.s, &end));
    CHECK_INT(end.room, 7);
    CHECK_INT(end.reason, PD_END_TIMEOUT);
    env_free(&e);
    pd_free(t1);
    pd_free(t2);
    pd_free(t3);
}

static void test_bounds_and_errors(void) {
    struct pd_page_alloc *pa;
    struct pd_sched_prefill *s;
    CHECK_OK(pd_page_alloc_new(10, &pa));
    struct pd_sched_prefill_config cfg = {.page_size = 16,
                                          .chunked_prefill_size = 8,
                                          .max_prefill_tokens = 100,
                                          .max_queued_requests = 2,
                                          .bootstrap_timeout_s = 1};
    CHECK_ERR(pd_sched_prefill_new(&cfg, pa, NULL, &s), PD_EINVAL, "smaller than a page");
    cfg.chunked_prefill_size = 32;
    for (long k = 0; k < 8; k++) {
        pd_alloc_fail_after(k);
        CHECK_ERR(pd_sched_prefill_new(&cfg, pa, NULL, &s), PD_ENOMEM, "prefill scheduler");
    }
    pd_alloc_fail_after(-1);
    CHECK_OK(pd_sched_prefill_new(&cfg, pa, NULL, &s));
    int32_t t[200] = {0};
    CHECK_ERR(pd_sched_prefill_add(s, 1, t, 161, 0), PD_ERANGE, "needs 11 pages, the pool has 10");
    CHECK_ERR(pd_sched_prefill_add(s, 1, t, 0, 0), PD_EINVAL, "empty prompt");
    pd_alloc_fail_after(0);
    CHECK_ERR(pd_sched_prefill_add(s, 1, t, 10, 0), PD_ENOMEM, "room 1: page list");
    pd_alloc_fail_after(-1);
    CHECK_OK(pd_sched_prefill_add(s, 1, t, 10, 0));
    CHECK_ERR(pd_sched_prefill_add(s, 1, t, 10, 0), PD_EINVAL, "already has a live request");
    CHECK_OK(pd_sched_prefill_add(s, 2, t, 10, 0));
    CHECK_ERR(pd_sched_prefill_add(s, 3, t, 10, 0), PD_EFULL, "2 requests queued");
    bool q;
    CHECK_ERR(pd_sched_prefill_abort(s, 3, &q), PD_ENOENT, "room 3");
    CHECK_OK(pd_sched_prefill_abort(s, 1, &q));
    /* the room is free again at once, the slot only once its end was popped */
    CHECK_ERR(pd_sched_prefill_add(s, 1, t, 10, 0), PD_EFULL, "queued");
    struct pd_sched_end end;
    CHECK_OK(pd_sched_prefill_pop_ended(s, &end));
    CHECK_OK(pd_sched_prefill_add(s, 1, t, 10, 0));
    CHECK_OK(pd_sched_prefill_check(s));
    pd_sched_prefill_free(s); /* live requests at free: their pages go back too */
    CHECK_INT(pd_page_alloc_n_free(pa), 10);
    pd_page_alloc_free(pa);
}

PD_TEST_MAIN(PD_TEST(test_worked_example_page1), PD_TEST(test_worked_example_page16),
             PD_TEST(test_prefill_cap_and_unchunked),
             PD_TEST(test_prefix_cache_shared_system_prompt), PD_TEST(test_memory_admission_fifo),
             PD_TEST(test_timeouts_aborts_failures), PD_TEST(test_eager),
             PD_TEST(test_bounds_and_errors))
