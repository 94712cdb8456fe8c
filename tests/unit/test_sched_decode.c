/* Decode scheduler: page growth on boundary crossings, admission with the output reservation,
 * retraction of the request that loses least and the ratio jump, timeouts, aborts, failures,
 * bounds and allocation failures; decode-side prefix reuse (held pages, caching at the end,
 * eviction under pressure). */
#include "pd_test.h"

#include "common/base/alloc.h"
#include "common/page_alloc.h"
#include "common/radix_cache.h"
#include "decode/sched_decode.h"

static struct pd_sched_decode *mk(struct pd_page_alloc **pa, int32_t ps, int32_t pool,
                                  int32_t max_running, double ratio) {
    struct pd_sched_decode_config cfg = {.page_size = ps,
                                         .max_running_requests = max_running,
                                         .max_queued_requests = 8,
                                         .waiting_timeout_s = 300};
    pd_sched_decode_config_defaults(&cfg);
    cfg.init_new_token_ratio = cfg.min_new_token_ratio = ratio;
    struct pd_sched_decode *s = NULL;
    CHECK_OK(pd_page_alloc_new(pool, pa));
    CHECK_OK(pd_sched_decode_new(&cfg, *pa, NULL, &s));
    return s;
}

static void done(struct pd_sched_decode *s, struct pd_page_alloc *pa) {
    CHECK_OK(pd_sched_decode_check(s));
    pd_sched_decode_free(s);
    CHECK_INT(pd_page_alloc_n_free(pa), pd_page_alloc_n_total(pa));
    pd_page_alloc_free(pa);
}

static int pop(struct pd_sched_decode *s, uint64_t room, int32_t *n_out) {
    struct pd_sched_end e = {0};
    CHECK_OK(pd_sched_decode_pop_ended(s, &e));
    CHECK_INT(e.room, room);
    if (n_out)
        *n_out = e.n_output;
    return e.reason;
}

/* Page size 4, prompt 6 (2 pages), max_new 4: steps write positions 6, 7, 8; only 8 crosses
 * into a third page, which continues the request's run. The 4th token ends it. */
static void test_growth_and_finish(void) {
    struct pd_page_alloc *pa;
    struct pd_sched_decode *s = mk(&pa, 4, 16, 4, 0.5);
    CHECK_OK(pd_sched_decode_add(s, 9, NULL, 6, 4, 0));
    struct pd_decode_step st;
    CHECK_OK(pd_sched_decode_step(s, 0, &st));
    CHECK_INT(st.n_admitted, 1);
    CHECK_INT(st.admitted[0].n_pages, 2);
    CHECK_INT(st.n_batch, 0);
    CHECK_OK(pd_sched_decode_transfer_done(s, 9, PD_OK, 1));
    int32_t want_pos[3] = {6, 7, 8}, want_pages[3] = {2, 2, 3};
    for (int k = 0; k < 3; k++) {
        CHECK_OK(pd_sched_decode_step(s, 1 + k, &st));
        CHECK_INT(st.n_batch, 1);
        CHECK_INT(st.batch[0].pos, want_pos[k]);
        CHECK_INT(st.batch[0].n_pages, want_pages[k]);
        if (k == 2)
            CHECK_INT(st.batch[0].pages[2], st.batch[0].pages[1] + 1);
        CHECK_OK(pd_sched_decode_check(s));
        CHECK_OK(pd_sched_decode_batch_done(s, &st, NULL, 1 + k));
    }
    int32_t n_out;
    CHECK_INT(pop(s, 9, &n_out), PD_END_DONE);
    CHECK_INT(n_out, 4);
    /* a stop (EOS) ends it early; max_new_tokens 1 ends at the done notice */
    CHECK_OK(pd_sched_decode_add(s, 10, NULL, 3, 20, 5));
    CHECK_OK(pd_sched_decode_add(s, 11, NULL, 3, 1, 5));
    CHECK_OK(pd_sched_decode_step(s, 5, &st));
    CHECK_INT(st.n_admitted, 2);
    CHECK_OK(pd_sched_decode_transfer_done(s, 10, PD_OK, 5));
    CHECK_OK(pd_sched_decode_transfer_done(s, 11, PD_OK, 5));
    CHECK_INT(pop(s, 11, &n_out), PD_END_DONE);
    CHECK_INT(n_out, 1);
    CHECK_OK(pd_sched_decode_step(s, 6, &st));
    bool stop = true;
    CHECK_OK(pd_sched_decode_batch_done(s, &st, &stop, 6));
    CHECK_INT(pop(s, 10, &n_out), PD_END_DONE);
    CHECK_INT(n_out, 2);
    done(s, pa);
}

/* Page size 1, pool 100, ratio 0.5, requests of prompt 30 / max_new 40 (39 tokens to come):
 * 1st: 100-30 = 70 >= ceil(0.5*39) = 20; 2nd: 70-30 = 40 >= ceil(0.5*78) = 39;
 * 3rd: 40-30 = 10 < ceil(0.5*117) = 59, so it waits, and so does the 4th behind it (FIFO). */
static void test_admission_reserve(void) {
    struct pd_page_alloc *pa;
    struct pd_sched_decode *s = mk(&pa, 1, 100, 8, 0.5);
    for (uint64_t r = 1; r <= 3; r++)
        CHECK_OK(pd_sched_decode_add(s, r, NULL, 30, 40, 0));
    CHECK_OK(pd_sched_decode_add(s, 4, NULL, 1, 2, 0));
    struct pd_decode_step st;
    CHECK_OK(pd_sched_decode_step(s, 0, &st));
    CHECK_INT(st.n_admitted, 2);
    CHECK_INT(st.admitted[0].room, 1);
    CHECK_INT(st.admitted[1].room, 2);
    struct pd_decode_counts c;
    pd_sched_decode_counts(s, &c);
    CHECK_INT(c.prealloc, 2);
    CHECK_INT(c.transfer, 2);
    /* max_running_requests bounds transfer + running */
    struct pd_page_alloc *pa2;
    struct pd_sched_decode *s2 = mk(&pa2, 1, 100, 1, 0.0);
    CHECK_OK(pd_sched_decode_add(s2, 1, NULL, 5, 5, 0));
    CHECK_OK(pd_sched_decode_add(s2, 2, NULL, 5, 5, 0));
    CHECK_OK(pd_sched_decode_step(s2, 0, &st));
    CHECK_INT(st.n_admitted, 1);
    done(s2, pa2);
    done(s, pa);
}

/* Page size 1, pool 10, ratio 0: A (prompt 4) and B (prompt 5), max_new 6 each, fill 9 pages.
 * Step 1: A takes the last page for position 4; B needs a 6th page, none is free: both have 1
 * token, B has the longer prompt, so B is retracted. The ratio becomes
 * min(1, (1 decoded + 20 * 1 running) / 6 max) = 1. */
static void test_retraction(void) {
    struct pd_page_alloc *pa;
    struct pd_sched_decode *s = mk(&pa, 1, 10, 4, 0.0);
    CHECK_OK(pd_sched_decode_add(s, 0xA, NULL, 4, 6, 0));
    CHECK_OK(pd_sched_decode_add(s, 0xB, NULL, 5, 6, 0));
    struct pd_decode_step st;
    CHECK_OK(pd_sched_decode_step(s, 0, &st));
    CHECK_INT(st.n_admitted, 2);
    CHECK_OK(pd_sched_decode_transfer_done(s, 0xA, PD_OK, 0));
    CHECK_OK(pd_sched_decode_transfer_done(s, 0xB, PD_OK, 0));
    CHECK_OK(pd_sched_decode_step(s, 1, &st));
    CHECK_INT(st.n_retracted, 1);
    CHECK_INT(st.n_batch, 1);
    CHECK_INT(st.batch[0].room, 0xA);
    CHECK_DBL(st.new_token_ratio, 1.0, 1e-12);
    int32_t n_out;
    CHECK_INT(pop(s, 0xB, &n_out), PD_END_RETRACTED);
    CHECK_INT(n_out, 1);
    CHECK_OK(pd_sched_decode_batch_done(s, &st, NULL, 1));
    done(s, pa);
}

/* As test_retraction, with B pinned (a prompt with images): A, which SGLang's order would keep,
 * is retracted instead; then, A gone and B alone, B still grows (nothing else to retract). */
static void test_retraction_spares_pinned(void) {
    struct pd_page_alloc *pa;
    struct pd_sched_decode *s = mk(&pa, 1, 10, 4, 0.0);
    CHECK_OK(pd_sched_decode_add(s, 0xA, NULL, 4, 6, 0));
    CHECK_OK(pd_sched_decode_add(s, 0xB, NULL, 5, 6, 0));
    CHECK_OK(pd_sched_decode_pin(s, 0xB));
    CHECK_INT(pd_sched_decode_pin(s, 0xF), PD_ENOENT);
    struct pd_decode_step st;
    CHECK_OK(pd_sched_decode_step(s, 0, &st));
    CHECK_OK(pd_sched_decode_transfer_done(s, 0xA, PD_OK, 0));
    CHECK_OK(pd_sched_decode_transfer_done(s, 0xB, PD_OK, 0));
    CHECK_OK(pd_sched_decode_step(s, 1, &st));
    CHECK_INT(st.n_retracted, 1);
    CHECK_INT(st.n_batch, 1);
    CHECK_INT(st.batch[0].room, 0xB);
    CHECK_INT(pop(s, 0xA, NULL), PD_END_RETRACTED);
    CHECK_OK(pd_sched_decode_batch_done(s, &st, NULL, 1));
    done(s, pa);
}

/* Pool 12: A (4, 6) decodes alone to 3 tokens and 6 pages; C (6, 6) then takes the other 6.
 * Step 3: A needs a 7th page; C has 1 token against A's 3, so C loses least and is retracted
 * although A is the one asking. */
static void test_retraction_victim_not_asker(void) {
    struct pd_page_alloc *pa;
    struct pd_sched_decode *s = mk(&pa, 1, 12, 4, 0.0);
    struct pd_decode_step st;
    CHECK_OK(pd_sched_decode_add(s, 0xA, NULL, 4, 6, 0));
    CHECK_OK(pd_sched_decode_step(s, 0, &st));
    CHECK_OK(pd_sched_decode_transfer_done(s, 0xA, PD_OK, 0));
    CHECK_OK(pd_sched_decode_step(s, 1, &st));
    CHECK_OK(pd_sched_decode_batch_done(s, &st, NULL, 1));
    CHECK_OK(pd_sched_decode_add(s, 0xC, NULL, 6, 6, 1));
    CHECK_OK(pd_sched_decode_step(s, 2, &st));
    CHECK_INT(st.n_admitted, 1);
    CHECK_INT(pd_page_alloc_n_free(pa), 0);
    CHECK_OK(pd_sched_decode_batch_done(s, &st, NULL, 2));
    CHECK_OK(pd_sched_decode_transfer_done(s, 0xC, PD_OK, 2));
    CHECK_OK(pd_sched_decode_step(s, 3, &st));
    CHECK_INT(st.n_retracted, 1);
    CHECK_INT(st.n_batch, 1);
    CHECK_INT(st.batch[0].room, 0xA);
    CHECK_INT(st.batch[0].n_pages, 7);
    int32_t n_out;
    CHECK_INT(pop(s, 0xC, &n_out), PD_END_RETRACTED);
    CHECK_OK(pd_sched_decode_batch_done(s, &st, NULL, 3));
    done(s, pa);
}

static void test_timeouts_aborts_failures(void) {
    struct pd_page_alloc *pa;
    struct pd_sched_decode *s = mk(&pa, 4, 64, 8, 0.1);
    struct pd_decode_step st;
    bool q;
    for (uint64_t r = 1; r <= 6; r++)
        CHECK_OK(pd_sched_decode_add(s, r, NULL, 8, 8, 0));
    CHECK_OK(pd_sched_decode_abort(s, 6, &q)); /* prealloc: at once */
    CHECK(!q);
    CHECK_INT(pop(s, 6, NULL), PD_END_ABORTED);
    CHECK_OK(pd_sched_decode_step(s, 0, &st));
    CHECK_INT(st.n_admitted, 5);
    CHECK_OK(pd_sched_decode_abort(s, 1, &q)); /* transfer: prefill may write: drain */
    CHECK(q);
    CHECK_OK(pd_sched_decode_transfer_done(s, 1, PD_OK, 1));    /* late notice: ignored */
    CHECK_OK(pd_sched_decode_transfer_done(s, 2, PD_EPEER, 1)); /* failed: drain too */
    struct pd_decode_counts c;
    pd_sched_decode_counts(s, &c);
    CHECK_INT(c.draining, 2);
    CHECK_OK(pd_sched_decode_release(s, 1));
    CHECK_OK(pd_sched_decode_release(s, 2));
    CHECK_INT(pop(s, 1, NULL), PD_END_ABORTED);
    CHECK_INT(pop(s, 2, NULL), PD_END_FAILED);
    CHECK_ERR(pd_sched_decode_release(s, 3), PD_EINVAL, "released while transfer");
    CHECK_OK(pd_sched_decode_transfer_done(s, 3, PD_OK, 1));
    CHECK_OK(pd_sched_decode_step(s, 1, &st));
    CHECK_INT(st.n_batch, 1);
    CHECK_ERR(pd_sched_decode_step(s, 1, &st), PD_EINVAL, "not done");
    CHECK_OK(pd_sched_decode_abort(s, 3, &q)); /* in the running step: at batch_done */
    CHECK(!q);
    CHECK_OK(pd_sched_decode_batch_done(s, &st, NULL, 1));
    CHECK_INT(pop(s, 3, NULL), PD_END_ABORTED);
    /* 4 and 5 wait for their notice past --waiting-timeout */
    CHECK_OK(pd_sched_decode_step(s, 299, &st));
    CHECK_INT(st.n_quiesce, 0);
    CHECK_OK(pd_sched_decode_step(s, 300, &st));
    CHECK_INT(st.n_quiesce, 2);
    CHECK_ERR(pd_sched_decode_transfer_done(s, 99, PD_OK, 300), PD_ENOENT, "room 99");
    CHECK_OK(pd_sched_decode_release(s, 4));
    CHECK_OK(pd_sched_decode_release(s, 5));
    CHECK_INT(pop(s, 4, NULL), PD_END_TIMEOUT);
    CHECK_INT(pop(s, 5, NULL), PD_END_TIMEOUT);
    struct pd_sched_end e;
    CHECK_INT(pd_sched_decode_pop_ended(s, &e), PD_EAGAIN);
    done(s, pa);
}

static void test_bounds_and_errors(void) {
    struct pd_page_alloc *pa;
    CHECK_OK(pd_page_alloc_new(10, &pa));
    struct pd_sched_decode_config cfg = {.page_size = 4,
                                         .max_running_requests = 2,
                                         .max_queued_requests = 2,
                                         .waiting_timeout_s = 1};
    pd_sched_decode_config_defaults(&cfg);
    struct pd_sched_decode *s;
    cfg.min_new_token_ratio = 0.9;
    CHECK_ERR(pd_sched_decode_new(&cfg, pa, NULL, &s), PD_EINVAL, "min <= init");
    pd_sched_decode_config_defaults(&cfg);
    for (long k = 0; k < 10; k++) {
        pd_alloc_fail_after(k);
        CHECK_ERR(pd_sched_decode_new(&cfg, pa, NULL, &s), PD_ENOMEM, "decode scheduler");
    }
    pd_alloc_fail_after(-1);
    CHECK_OK(pd_sched_decode_new(&cfg, pa, NULL, &s));
    CHECK_ERR(pd_sched_decode_add(s, 1, NULL, 30, 12, 0), PD_ERANGE,
              "need 11 pages, the pool has 10");
    CHECK_ERR(pd_sched_decode_add(s, 1, NULL, 30, 0, 0), PD_EINVAL, "max_new_tokens 0");
    pd_alloc_fail_after(0);
    CHECK_ERR(pd_sched_decode_add(s, 1, NULL, 4, 4, 0), PD_ENOMEM, "room 1: page list");
    pd_alloc_fail_after(-1);
    CHECK_OK(pd_sched_decode_add(s, 1, NULL, 4, 4, 0));
    CHECK_ERR(pd_sched_decode_add(s, 1, NULL, 4, 4, 0), PD_EINVAL, "already has a live request");
    CHECK_OK(pd_sched_decode_add(s, 2, NULL, 4, 4, 0));
    CHECK_ERR(pd_sched_decode_add(s, 3, NULL, 4, 4, 0), PD_EFULL, "queued already");
    CHECK_OK(pd_sched_decode_check(s));
    pd_sched_decode_free(s);
    pd_page_alloc_free(pa);
}

/* A decode with a prefix cache (page size 4, pool of pool pages). */
static struct pd_sched_decode *mk_cached(struct pd_page_alloc **pa, struct pd_radix_cache **rc,
                                         int32_t pool, int32_t max_running) {
    struct pd_sched_decode_config cfg = {.page_size = 4,
                                         .max_running_requests = max_running,
                                         .max_queued_requests = 8,
                                         .waiting_timeout_s = 300};
    pd_sched_decode_config_defaults(&cfg);
    cfg.init_new_token_ratio = cfg.min_new_token_ratio = 0;
    struct pd_sched_decode *s = NULL;
    CHECK_OK(pd_page_alloc_new(pool, pa));
    CHECK_OK(pd_radix_cache_new(*pa, 4, false, rc));
    CHECK_OK(pd_sched_decode_new(&cfg, *pa, *rc, &s));
    return s;
}

static void done_cached(struct pd_sched_decode *s, struct pd_page_alloc *pa,
                        struct pd_radix_cache *rc) {
    CHECK_OK(pd_sched_decode_check(s));
    pd_sched_decode_free(s);
    CHECK_INT(pd_radix_cache_root_lock(rc), 0); /* every request's lock released */
    pd_radix_cache_free(rc);
    CHECK_INT(pd_page_alloc_n_free(pa), pd_page_alloc_n_total(pa));
    pd_page_alloc_free(pa);
}

/* Admits room alone (it must be the only one in prealloc) and returns its admission. */
static struct pd_decode_admit admit(struct pd_sched_decode *s, uint64_t room, double now) {
    struct pd_decode_step st;
    CHECK_OK(pd_sched_decode_step(s, now, &st));
    CHECK_INT(st.n_admitted, 1);
    CHECK_INT(st.admitted[0].room, room);
    CHECK_INT(st.n_batch, 0);
    return st.admitted[0];
}

/* room runs to its end: the done notice, then batch steps until n_out reaches max_new. */
static void run_to_end(struct pd_sched_decode *s, uint64_t room, int32_t steps, double now) {
    struct pd_decode_step st;
    CHECK_OK(pd_sched_decode_transfer_done(s, room, PD_OK, now));
    for (int32_t k = 0; k < steps; k++) {
        CHECK_OK(pd_sched_decode_step(s, now, &st));
        CHECK_INT(st.n_batch, 1);
        CHECK_OK(pd_sched_decode_batch_done(s, &st, NULL, now));
        CHECK_OK(pd_sched_decode_check(s));
    }
    CHECK_INT(pop(s, room, NULL), PD_END_DONE);
}

/* Turn 1 (10 prompt tokens, 3 outputs) leaves prompt + output but the last token (12 tokens, 3
 * pages) in the cache; turn 2 repeats them and adds 5: its first 3 pages are turn 1's, held and
 * shared with the cache, only the other 2 are destinations. A prompt that ends inside a cached
 * page keeps its last token's page a destination; another conversation holds nothing. */
static void test_prefix_reuse(void) {
    struct pd_page_alloc *pa;
    struct pd_radix_cache *rc;
    struct pd_sched_decode *s = mk_cached(&pa, &rc, 16, 4);
    int32_t conv[17], other[9];
    for (int32_t i = 0; i < 17; i++)
        conv[i] = 100 + i;
    for (int32_t i = 0; i < 9; i++)
        other[i] = 500 + i;
    CHECK_OK(pd_sched_decode_add(s, 1, conv, 10, 3, 0));
    struct pd_decode_admit a = admit(s, 1, 0);
    CHECK_INT(a.n_pages, 3);
    CHECK_INT(a.held_pages, 0);
    int32_t first[3];
    for (int k = 0; k < 3; k++)
        first[k] = a.pages[k];
    run_to_end(s, 1, 2, 1);
    CHECK_INT(pd_radix_cache_n_pages(rc), 3);
    CHECK_INT(pd_page_alloc_n_free(pa), 13);

    CHECK_OK(pd_sched_decode_add(s, 2, conv, 17, 2, 2));
    a = admit(s, 2, 2);
    CHECK_INT(a.n_pages, 5);
    CHECK_INT(a.held_pages, 3);
    for (int k = 0; k < 3; k++)
        CHECK_INT(a.pages[k], first[k]);
    CHECK_INT(pd_page_alloc_n_free(pa), 11); /* only the two destinations were taken */
    CHECK_OK(pd_sched_decode_check(s));      /* held pages: the cache's and the request's */
    CHECK_INT(pd_radix_cache_flush(rc), 0);  /* locked by room 2: nothing to flush */
    run_to_end(s, 2, 1, 3);
    CHECK_INT(pd_radix_cache_n_pages(rc), 4); /* 17 + 2 - 1 = 18 tokens: 4 whole pages */

    /* 8 tokens: both pages cached, but the one with the last token comes from the prefill */
    CHECK_OK(pd_sched_decode_add(s, 3, conv, 8, 1, 4));
    a = admit(s, 3, 4);
    CHECK_INT(a.held_pages, 1);
    CHECK_INT(a.n_pages, 2);
    CHECK_OK(pd_sched_decode_transfer_done(s, 3, PD_OK, 4));
    CHECK_INT(pop(s, 3, NULL), PD_END_DONE);
    /* another conversation, and the same one without tokens (no reuse) */
    CHECK_OK(pd_sched_decode_add(s, 4, other, 9, 1, 5));
    CHECK_INT(admit(s, 4, 5).held_pages, 0);
    CHECK_OK(pd_sched_decode_add(s, 5, NULL, 17, 1, 5));
    CHECK_INT(admit(s, 5, 5).held_pages, 0);
    /* the limit of a prompt whose input logprobs are computed here */
    CHECK_OK(pd_sched_decode_add(s, 6, conv, 17, 1, 5));
    CHECK_OK(pd_sched_decode_limit_cache(s, 6, 5));
    CHECK_INT(admit(s, 6, 5).held_pages, 1);
    CHECK_ERR(pd_sched_decode_limit_cache(s, 77, 5), PD_ENOENT, "room 77");
    CHECK_OK(pd_sched_decode_check(s));
    done_cached(s, pa, rc);
}

/* Ends that are not done leave nothing in the cache: an abort while running, a failed
 * transfer, and a request whose step failed (forget) even though it ends done. */
static void test_prefix_reuse_only_done(void) {
    struct pd_page_alloc *pa;
    struct pd_radix_cache *rc;
    struct pd_sched_decode *s = mk_cached(&pa, &rc, 16, 4);
    int32_t t[12];
    for (int32_t i = 0; i < 12; i++)
        t[i] = 7 * i + 1;
    bool q;
    CHECK_OK(pd_sched_decode_add(s, 1, t, 9, 3, 0));
    admit(s, 1, 0);
    CHECK_OK(pd_sched_decode_transfer_done(s, 1, PD_OK, 0));
    CHECK_OK(pd_sched_decode_abort(s, 1, &q));
    CHECK_INT(pop(s, 1, NULL), PD_END_ABORTED);
    CHECK_OK(pd_sched_decode_add(s, 2, t, 9, 3, 1));
    admit(s, 2, 1);
    CHECK_OK(pd_sched_decode_transfer_done(s, 2, PD_EPEER, 1));
    CHECK_OK(pd_sched_decode_release(s, 2));
    CHECK_INT(pop(s, 2, NULL), PD_END_FAILED);
    CHECK_OK(pd_sched_decode_add(s, 3, t, 9, 2, 2));
    admit(s, 3, 2);
    CHECK_OK(pd_sched_decode_forget(s, 3));
    CHECK_ERR(pd_sched_decode_forget(s, 99), PD_ENOENT, "room 99");
    run_to_end(s, 3, 1, 3);
    CHECK_INT(pd_radix_cache_n_pages(rc), 0);
    done_cached(s, pa, rc);
}

/* Pressure: an admission that does not fit evicts unlocked entries, never a live request's
 * pages; a running request's next page comes from the cache before anyone is retracted. */
static void test_prefix_reuse_eviction(void) {
    struct pd_page_alloc *pa;
    struct pd_radix_cache *rc;
    struct pd_sched_decode *s = mk_cached(&pa, &rc, 8, 4);
    int32_t a[16], b[24], c[32];
    for (int32_t i = 0; i < 24; i++)
        b[i] = 2000 + i;
    for (int32_t i = 0; i < 16; i++) {
        a[i] = 1000 + i;
    }
    for (int32_t i = 0; i < 32; i++)
        c[i] = 3000 + i;
    /* a and b each leave 3 pages in the cache: 6 of 8 */
    CHECK_OK(pd_sched_decode_add(s, 1, a, 12, 2, 0));
    admit(s, 1, 0);
    run_to_end(s, 1, 1, 0);
    CHECK_OK(pd_sched_decode_add(s, 2, b, 12, 2, 1));
    admit(s, 2, 1);
    run_to_end(s, 2, 1, 1);
    CHECK_INT(pd_radix_cache_n_pages(rc), 6);
    /* b's next turn holds its 3 pages (locked); c needs 4 pages and only 1 is free besides
     * a's 3 unlocked ones: a is evicted, b's pages stay */
    CHECK_OK(pd_sched_decode_add(s, 3, b, 14, 8, 2));
    struct pd_decode_admit ad = admit(s, 3, 2);
    CHECK_INT(ad.held_pages, 3);
    CHECK_INT(pd_page_alloc_n_free(pa), 1);
    CHECK_OK(pd_sched_decode_add(s, 4, c, 13, 1, 3));
    ad = admit(s, 4, 3);
    CHECK_INT(ad.held_pages, 0);
    CHECK_INT(pd_radix_cache_n_pages(rc), 3); /* b's, under room 3's lock */
    CHECK_INT(pd_page_alloc_n_free(pa), 0);
    CHECK_OK(pd_sched_decode_check(s));
    CHECK_OK(pd_sched_decode_transfer_done(s, 4, PD_OK, 3));
    CHECK_INT(pop(s, 4, NULL), PD_END_DONE); /* c's 3 whole pages cached, unlocked */
    CHECK_INT(pd_radix_cache_n_pages(rc), 6);
    CHECK_INT(pd_page_alloc_n_free(pa), 1);
    /* room 3 runs (positions 14..20): 16 takes the free page, 20 a sixth page, which only
     * evicting c's unlocked entry can give: no retraction */
    CHECK_OK(pd_sched_decode_transfer_done(s, 3, PD_OK, 4));
    struct pd_decode_step st;
    for (int32_t k = 0; k < 7; k++) {
        CHECK_OK(pd_sched_decode_step(s, 4 + k, &st));
        CHECK_INT(st.n_batch, 1);
        CHECK_INT(st.n_retracted, 0);
        CHECK_INT(st.batch[0].n_pages, k < 2 ? 4 : k < 6 ? 5 : 6);
        if (k == 6)
            CHECK_INT(pd_radix_cache_n_pages(rc), 3); /* c's gone, b's (locked) kept */
        CHECK_OK(pd_sched_decode_check(s));
        CHECK_OK(pd_sched_decode_batch_done(s, &st, NULL, 4 + k));
    }
    CHECK_INT(pop(s, 3, NULL), PD_END_DONE);
    CHECK_OK(pd_sched_decode_check(s));
    done_cached(s, pa, rc);
}

PD_TEST_MAIN(PD_TEST(test_growth_and_finish), PD_TEST(test_admission_reserve),
             PD_TEST(test_retraction_spares_pinned), PD_TEST(test_retraction),
             PD_TEST(test_retraction_victim_not_asker), PD_TEST(test_timeouts_aborts_failures),
             PD_TEST(test_bounds_and_errors), PD_TEST(test_prefix_reuse),
             PD_TEST(test_prefix_reuse_only_done), PD_TEST(test_prefix_reuse_eviction))
