/* Colocated scheduler (pdserve-decode --disaggregation-mode null): mixed steps (chunk + one
 * decode token per running request, the chunk budget shrunk by the decode tokens), steps without
 * mixing (prefill first, else decode), prefix-cache hits, retraction back to the head of waiting
 * and the re-prefill over prompt + outputs, aborts in every state, bad input; then seeded random
 * traffic with the invariants checked after every step against a shadow of each request:
 * pages conserved (pd_sched_coloc_check recounts every page's holders), chunks contiguous and
 * page-aligned except the last, the budget never exceeded, every running request exactly once in
 * a decoding step at its own position inside its pages, first admissions in arrival order, rows
 * <= max_running, and a final drain ends everything and gives the whole pool back.
 * PD_SIM_STEPS sets the steps per configuration (default 100k, 20k under ASan). */
#include "pd_test.h"
#include "pd_test_rng.h"

#include "common/page_alloc.h"
#include "common/radix_cache.h"
#include "decode/sched_coloc.h"

#if defined(__SANITIZE_ADDRESS__)
#define SIM_DEFAULT_STEPS 20000
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SIM_DEFAULT_STEPS 20000
#endif
#endif
#ifndef SIM_DEFAULT_STEPS
#define SIM_DEFAULT_STEPS 100000
#endif

struct fx {
    struct pd_page_alloc *pa;
    struct pd_radix_cache *rc;
    struct pd_sched_coloc *s;
};

static void mk(struct fx *f, int32_t ps, int32_t pool, int32_t budget, int32_t max_running,
               bool mixed, bool cache, double ratio) {
    struct pd_sched_coloc_config cfg = {.page_size = ps,
                                        .chunked_prefill_size = budget,
                                        .max_prefill_tokens = 16384,
                                        .max_running_requests = max_running,
                                        .max_queued_requests = 16};
    pd_sched_coloc_config_defaults(&cfg);
    cfg.mixed_chunk = mixed;
    cfg.init_new_token_ratio = cfg.min_new_token_ratio = ratio;
    f->rc = NULL;
    CHECK_OK(pd_page_alloc_new(pool, &f->pa));
    if (cache)
        CHECK_OK(pd_radix_cache_new(f->pa, ps, false, &f->rc));
    CHECK_OK(pd_sched_coloc_new(&cfg, f->pa, f->rc, &f->s));
}

static void done(struct fx *f) {
    CHECK_OK(pd_sched_coloc_check(f->s));
    pd_sched_coloc_free(f->s);
    if (f->rc) {
        pd_radix_cache_flush(f->rc);
        pd_radix_cache_free(f->rc);
    }
    CHECK_INT(pd_page_alloc_n_free(f->pa), pd_page_alloc_n_total(f->pa));
    pd_page_alloc_free(f->pa);
}

static int pop(struct pd_sched_coloc *s, uint64_t room, int32_t *n_out) {
    struct pd_sched_end e = {0};
    CHECK_OK(pd_sched_coloc_pop_ended(s, &e));
    CHECK_INT(e.room, room);
    if (n_out)
        *n_out = e.n_output;
    return e.reason;
}

static void run(struct fx *f, struct pd_coloc_step *st, double now) {
    CHECK_OK(pd_sched_coloc_step(f->s, now, st));
    CHECK_OK(pd_sched_coloc_check(f->s));
}

static void finish(struct fx *f, struct pd_coloc_step *st, double now) {
    CHECK_OK(pd_sched_coloc_step_done(f->s, st, NULL, now));
    CHECK_OK(pd_sched_coloc_check(f->s));
}

static int32_t toks[8][512];

/* Page size 4, budget 16, mixed. A (6 tokens, 4 new) is prefilled alone; then B (30 tokens)
 * arrives and is cut into page-aligned chunks of 12 (16 - A's decode token, rounded down to
 * pages) while A decodes in the same steps at positions 6, 7, 8 — crossing into a third page at 8
 * — and ends after its 4th token; B's last chunk (6 tokens) runs alone. */
static void test_mixed_steps(void) {
    struct fx f;
    mk(&f, 4, 64, 16, 8, true, false, 0.5);
    CHECK_OK(pd_sched_coloc_add(f.s, 1, toks[0], 6, 4, 0));
    struct pd_coloc_step st;
    run(&f, &st, 0);
    CHECK_INT(st.n_chunks, 1);
    CHECK_INT(st.n_decodes, 0);
    CHECK_INT(st.chunks[0].start, 0);
    CHECK_INT(st.chunks[0].len, 6);
    CHECK(st.chunks[0].last);
    CHECK_INT(st.chunks[0].n_pages, 2);
    finish(&f, &st, 0);
    CHECK_OK(pd_sched_coloc_add(f.s, 2, toks[1], 30, 3, 1));
    int32_t want_start[3] = {0, 12, 24}, want_len[3] = {12, 12, 6};
    int32_t want_pos[3] = {6, 7, 8}, want_pages[3] = {2, 2, 3};
    for (int k = 0; k < 3; k++) {
        run(&f, &st, 1 + k);
        CHECK_INT(st.n_chunks, 1);
        CHECK_INT(st.chunks[0].room, 2);
        CHECK_INT(st.chunks[0].start, want_start[k]);
        CHECK_INT(st.chunks[0].len, want_len[k]);
        CHECK(st.chunks[0].last == (k == 2));
        CHECK_INT(st.chunks[0].n_pages, 8);
        CHECK(st.n_prefill_tokens + st.n_decodes <= 16);
        CHECK_INT(st.n_decodes, 1);
        CHECK_INT(st.decodes[0].room, 1);
        CHECK_INT(st.decodes[0].pos, want_pos[k]);
        CHECK_INT(st.decodes[0].n_pages, want_pages[k]);
        struct pd_coloc_counts c;
        pd_sched_coloc_counts(f.s, &c);
        CHECK_INT(c.running, 1);
        finish(&f, &st, 1 + k);
    }
    int32_t n_out;
    CHECK_INT(pop(f.s, 1, &n_out), PD_END_DONE);
    CHECK_INT(n_out, 4);
    /* B decodes alone at position 30, 31 (its first token came from the last chunk) */
    run(&f, &st, 5);
    CHECK_INT(st.n_chunks, 0);
    CHECK_INT(st.n_decodes, 1);
    CHECK_INT(st.decodes[0].pos, 30);
    finish(&f, &st, 5);
    run(&f, &st, 6);
    CHECK_INT(st.decodes[0].pos, 31);
    finish(&f, &st, 6);
    CHECK_INT(pop(f.s, 2, &n_out), PD_END_DONE);
    CHECK_INT(n_out, 3);
    done(&f);
}

/* Without mixing a step is a prefill batch when one can be built (the whole budget), else a
 * decode batch; the running request waits while B's chunks run. A stop flag ends a request at
 * its first token. */
static void test_unmixed_steps(void) {
    struct fx f;
    mk(&f, 4, 64, 16, 8, false, false, 0.5);
    CHECK_OK(pd_sched_coloc_add(f.s, 1, toks[0], 6, 10, 0));
    struct pd_coloc_step st;
    run(&f, &st, 0);
    finish(&f, &st, 0);
    CHECK_OK(pd_sched_coloc_add(f.s, 2, toks[1], 20, 3, 0));
    run(&f, &st, 1);
    CHECK_INT(st.n_chunks, 1);
    CHECK_INT(st.chunks[0].len, 16);
    CHECK_INT(st.n_decodes, 0);
    finish(&f, &st, 1);
    run(&f, &st, 2);
    CHECK_INT(st.n_chunks, 1);
    CHECK_INT(st.chunks[0].start, 16);
    CHECK_INT(st.chunks[0].len, 4);
    CHECK_INT(st.n_decodes, 0);
    finish(&f, &st, 2);
    run(&f, &st, 3);
    CHECK_INT(st.n_chunks, 0);
    CHECK_INT(st.n_decodes, 2);
    CHECK_INT(st.decodes[0].pos, 6);
    CHECK_INT(st.decodes[1].pos, 20);
    finish(&f, &st, 3);
    /* C stops at its first token (EOS): it never runs a decode step */
    CHECK_OK(pd_sched_coloc_add(f.s, 3, toks[2], 5, 10, 4));
    run(&f, &st, 4);
    CHECK_INT(st.n_chunks, 1);
    bool stop[1] = {true};
    CHECK_OK(pd_sched_coloc_step_done(f.s, &st, stop, 4));
    int32_t n_out;
    CHECK_INT(pop(f.s, 3, &n_out), PD_END_DONE);
    CHECK_INT(n_out, 1);
    done(&f);
}

/* A second request sharing 20 tokens of prompt gets the 5 whole cached pages (20 tokens) and
 * computes only the rest; the pages are the first request's. */
static void test_prefix_cache(void) {
    struct fx f;
    mk(&f, 4, 64, 64, 8, true, true, 0.5);
    for (int i = 0; i < 30; i++)
        toks[0][i] = toks[1][i] = 100 + i;
    toks[1][20] = 7;
    CHECK_OK(pd_sched_coloc_add(f.s, 1, toks[0], 30, 2, 0));
    struct pd_coloc_step st;
    run(&f, &st, 0);
    int32_t first_pages[5];
    for (int i = 0; i < 5; i++)
        first_pages[i] = st.chunks[0].pages[i];
    finish(&f, &st, 0);
    CHECK_OK(pd_sched_coloc_add(f.s, 2, toks[1], 25, 2, 1));
    run(&f, &st, 1);
    CHECK_INT(st.n_chunks, 1);
    CHECK_INT(st.chunks[0].room, 2);
    CHECK_INT(st.chunks[0].start, 20);
    CHECK_INT(st.chunks[0].len, 5);
    CHECK_INT(st.chunks[0].cached_tokens, 20);
    for (int i = 0; i < 5; i++)
        CHECK_INT(st.chunks[0].pages[i], first_pages[i]);
    CHECK_INT(st.n_decodes, 1);
    finish(&f, &st, 1);
    run(&f, &st, 2);
    finish(&f, &st, 2);
    CHECK_INT(pop(f.s, 1, NULL), PD_END_DONE);
    struct pd_sched_end e;
    CHECK_OK(pd_sched_coloc_pop_ended(f.s, &e));
    CHECK_INT(e.room, 2);
    CHECK_INT(e.cached_tokens, 20);
    done(&f);
}

/* Pool of 6 pages of 4: A and B (prompts 8, 20 new each) run; growth runs the pool dry, the one
 * that loses least is retracted to the head of waiting and later prefilled again over prompt +
 * its outputs, then finishes; every page comes back. */
static void test_retraction(void) {
    struct fx f;
    mk(&f, 4, 6, 64, 8, true, false, 0.05);
    CHECK_OK(pd_sched_coloc_add(f.s, 1, toks[0], 8, 12, 0));
    CHECK_OK(pd_sched_coloc_add(f.s, 2, toks[1], 7, 12, 0));
    struct pd_coloc_step st;
    run(&f, &st, 0);
    CHECK_INT(st.n_chunks, 2);
    finish(&f, &st, 0);
    int retracted_room = 0, t = 1;
    int32_t retracted_out = 0;
    for (; t < 200 && !retracted_room; t++) {
        run(&f, &st, t);
        if (st.n_retracted) {
            CHECK_INT(st.n_retracted, 1);
            CHECK_INT(st.n_decodes, 1);
            CHECK(st.new_token_ratio > 0.05);
            retracted_room = st.decodes[0].room == 1 ? 2 : 1;
            struct pd_coloc_counts c;
            pd_sched_coloc_counts(f.s, &c);
            CHECK_INT(c.waiting, 1);
            CHECK_INT(c.retracted, 1);
            /* A needs its 4th page first (position 12 after 5 tokens); with equal outputs the
             * longer prompt loses least: A itself */
            CHECK_INT(retracted_room, 1);
            retracted_out = t;
        }
        finish(&f, &st, t);
    }
    CHECK(retracted_room != 0);
    /* the retracted one resumes by prefilling prompt + the outputs it had */
    bool reprefilled = false;
    for (; t < 400; t++) {
        run(&f, &st, t);
        for (int i = 0; i < st.n_chunks; i++) {
            CHECK_INT(st.chunks[i].room, retracted_room);
            if (st.chunks[i].last) {
                int32_t prompt = retracted_room == 1 ? 8 : 7;
                CHECK_INT(st.chunks[i].start + st.chunks[i].len, prompt + retracted_out);
                reprefilled = true;
            }
        }
        finish(&f, &st, t);
        struct pd_coloc_counts c;
        pd_sched_coloc_counts(f.s, &c);
        if (c.running + c.waiting == 0)
            break;
    }
    CHECK(reprefilled);
    int32_t n1, n2;
    struct pd_sched_end e;
    CHECK_OK(pd_sched_coloc_pop_ended(f.s, &e));
    n1 = e.n_output;
    CHECK_INT(e.reason, PD_END_DONE);
    CHECK_OK(pd_sched_coloc_pop_ended(f.s, &e));
    n2 = e.n_output;
    CHECK_INT(e.reason, PD_END_DONE);
    CHECK_INT(n1, 12);
    CHECK_INT(n2, 12);
    done(&f);
}

/* Aborts while waiting, while half-done, inside the outstanding step (ends at step_done) and
 * while running: each ends aborted and its pages are back. */
static void test_aborts(void) {
    struct fx f;
    mk(&f, 4, 64, 16, 8, true, true, 0.5);
    CHECK_OK(pd_sched_coloc_add(f.s, 1, toks[0], 40, 5, 0));
    CHECK_OK(pd_sched_coloc_add(f.s, 2, toks[1], 5, 5, 0));
    CHECK_OK(pd_sched_coloc_abort(f.s, 2)); /* waiting */
    CHECK_INT(pop(f.s, 2, NULL), PD_END_ABORTED);
    struct pd_coloc_step st;
    run(&f, &st, 0);
    CHECK_INT(st.chunks[0].len, 16);
    finish(&f, &st, 0);
    CHECK_OK(pd_sched_coloc_abort(f.s, 1)); /* half-done */
    CHECK_INT(pop(f.s, 1, NULL), PD_END_ABORTED);
    CHECK_INT(pd_page_alloc_n_free(f.pa) + 4, 64); /* the 4 whole pages stay in the cache */
    CHECK_OK(pd_sched_coloc_add(f.s, 3, toks[2], 5, 5, 1));
    CHECK_OK(pd_sched_coloc_add(f.s, 4, toks[3], 9, 5, 1));
    run(&f, &st, 1);
    CHECK_INT(st.n_chunks, 2);
    CHECK_OK(pd_sched_coloc_abort(f.s, 3)); /* in the step */
    CHECK_INT(pd_sched_coloc_pop_ended(f.s, &(struct pd_sched_end){0}), PD_EAGAIN);
    finish(&f, &st, 1);
    CHECK_INT(pop(f.s, 3, NULL), PD_END_ABORTED);
    CHECK_OK(pd_sched_coloc_abort(f.s, 4)); /* running */
    CHECK_INT(pop(f.s, 4, NULL), PD_END_ABORTED);
    CHECK_INT(pd_sched_coloc_abort(f.s, 4), PD_ENOENT);
    done(&f);
}

/* A finished request's prompt + output stay cached: the next turn of the conversation (its
 * prompt and answer, then more) gets them from the cache, output pages included. */
static void test_next_turn(void) {
    struct fx f;
    mk(&f, 4, 64, 64, 8, true, true, 0.5);
    for (int i = 0; i < 10; i++)
        toks[6][i] = 500 + i;
    CHECK_OK(pd_sched_coloc_add(f.s, 1, toks[6], 10, 12, 0));
    struct pd_coloc_step st;
    for (int t = 0; t < 12; t++) {
        run(&f, &st, t);
        toks[6][10 + t] = 900 + t; /* the "model" writes each output token */
        finish(&f, &st, t);
    }
    CHECK_INT(pop(f.s, 1, NULL), PD_END_DONE);
    /* 10 + 11 tokens have KV (the 12th output was never fed): 5 whole pages cached */
    CHECK_INT(pd_radix_cache_n_pages(f.rc), 5);
    for (int i = 0; i < 22; i++)
        toks[7][i] = toks[6][i];
    for (int i = 22; i < 27; i++)
        toks[7][i] = 1;
    CHECK_OK(pd_sched_coloc_add(f.s, 2, toks[7], 27, 2, 20));
    run(&f, &st, 20);
    CHECK_INT(st.n_chunks, 1);
    CHECK_INT(st.chunks[0].cached_tokens, 20);
    CHECK_INT(st.chunks[0].start, 20);
    finish(&f, &st, 20);
    done(&f);
}

/* A waiting head that cannot fit even with the whole cache evicted leaves the cache alone (it
 * would otherwise be flushed step after step for nothing). */
static void test_no_pointless_eviction(void) {
    struct fx f;
    mk(&f, 4, 16, 64, 8, true, true, 0.01);
    for (int i = 0; i < 64; i++) {
        toks[4][i] = 1000 + i;
        toks[5][i] = 2000 + i;
        toks[6][i] = 3000 + i;
    }
    CHECK_OK(pd_sched_coloc_add(f.s, 1, toks[4], 20, 1, 0));
    struct pd_coloc_step st;
    run(&f, &st, 0);
    finish(&f, &st, 0);
    CHECK_INT(pop(f.s, 1, NULL), PD_END_DONE);
    CHECK_INT(pd_radix_cache_n_pages(f.rc), 5);
    CHECK_OK(pd_sched_coloc_add(f.s, 2, toks[5], 30, 30, 1));
    run(&f, &st, 1);
    CHECK_INT(st.n_chunks, 1); /* alone: no reservation; 8 of the 11 free pages */
    finish(&f, &st, 1);
    CHECK_INT(pd_radix_cache_n_pages(f.rc), 5 + 7);          /* B's whole pages joined */
    CHECK_OK(pd_sched_coloc_add(f.s, 3, toks[6], 40, 2, 2)); /* 10 pages: never with B running */
    for (int t = 2; t < 5; t++) {
        run(&f, &st, t);
        CHECK_INT(st.n_chunks, 0);
        CHECK_INT(st.n_decodes, 1);
        finish(&f, &st, t);
        CHECK_INT(pd_radix_cache_n_pages(f.rc), 12);
    }
    done(&f);
}

static void test_bad_input(void) {
    struct fx f;
    mk(&f, 4, 8, 16, 2, true, false, 0.5);
    CHECK_INT(pd_sched_coloc_add(f.s, 1, toks[0], 0, 5, 0), PD_EINVAL);
    CHECK_INT(pd_sched_coloc_add(f.s, 1, toks[0], 5, 0, 0), PD_EINVAL);
    CHECK_INT(pd_sched_coloc_add(f.s, 1, NULL, 5, 5, 0), PD_EINVAL);
    CHECK_INT(pd_sched_coloc_add(f.s, 1, toks[0], 30, 4, 0), PD_ERANGE); /* 33 tokens > 32 */
    CHECK_OK(pd_sched_coloc_add(f.s, 1, toks[0], 30, 3, 0));             /* 32 fit */
    CHECK_INT(pd_sched_coloc_add(f.s, 1, toks[0], 3, 3, 0), PD_EINVAL);  /* room live */
    for (uint64_t r = 2; r <= 16; r++)
        CHECK_OK(pd_sched_coloc_add(f.s, r, toks[1], 1, 1, 0));
    CHECK_INT(pd_sched_coloc_add(f.s, 17, toks[1], 1, 1, 0), PD_EFULL);
    struct pd_coloc_step st;
    run(&f, &st, 0);
    CHECK_INT(pd_sched_coloc_step(f.s, 0, &st), PD_EINVAL); /* the last one not given back */
    finish(&f, &st, 0);
    CHECK_INT(pd_sched_coloc_step_done(f.s, &st, NULL, 0), PD_EINVAL);
    struct pd_sched_coloc *bad;
    struct pd_sched_coloc_config cfg = {.page_size = 16,
                                        .chunked_prefill_size = 8,
                                        .max_prefill_tokens = 8,
                                        .max_running_requests = 4,
                                        .max_queued_requests = 4};
    pd_sched_coloc_config_defaults(&cfg);
    CHECK_INT(pd_sched_coloc_new(&cfg, f.pa, NULL, &bad), PD_EINVAL); /* budget < a page */
    cfg.page_size = 4;
    cfg.max_running_requests = 0;
    CHECK_INT(pd_sched_coloc_new(&cfg, f.pa, NULL, &bad), PD_EINVAL);
    done(&f);
}

/* ---------------------------------------------------------------- random traffic */

/* Counts a broken invariant; the first one of each sim says where. */
#define BAD(cond)                                                                                  \
    do {                                                                                           \
        if (cond) {                                                                                \
            if (!bad)                                                                              \
                fprintf(stderr, "sim %s:%d: %s\n", __func__, __LINE__, #cond);                     \
            bad++;                                                                                 \
        }                                                                                          \
    } while (0)

enum { LIVE = 40, MAXTOK = 400 };
enum { S_NONE, S_WAIT, S_PREF, S_RUN };

struct shadow {
    uint64_t room;
    int state;
    int32_t prompt, max_new, n_out, fill, done;
    int32_t tokens[MAXTOK];
    uint64_t seq; /* arrival order */
    bool admitted_once, in_step;
};

static struct shadow sh[LIVE];

static int32_t sfind(uint64_t room) {
    for (int32_t i = 0; i < LIVE; i++)
        if (sh[i].state != S_NONE && sh[i].room == room)
            return i;
    return -1;
}

/* Pops every end into the shadow; the broken invariants seen. */
static int pops(struct pd_sched_coloc *s, long *n_done, long *n_abort) {
    int bad = 0;
    struct pd_sched_end e;
    while (pd_sched_coloc_pop_ended(s, &e) == PD_OK) {
        int32_t i = sfind(e.room);
        BAD(i < 0);
        if (i < 0)
            continue;
        if (e.reason == PD_END_DONE) {
            BAD(e.n_output != sh[i].n_out);
            (*n_done)++;
        } else {
            BAD(e.reason != PD_END_ABORTED);
            (*n_abort)++;
        }
        sh[i].state = S_NONE;
    }
    return bad;
}

static int sim(int32_t ps, int32_t budget, int32_t max_running, bool mixed, bool cache,
               int32_t pool, long steps, uint64_t seed) {
    rng_state = seed;
    struct fx f;
    mk(&f, ps, pool, budget, max_running, mixed, cache, 0.3);
    bool unchunked = budget <= 0;
    if (unchunked)
        budget = 16384; /* --max-prefill-tokens; a longer prompt runs alone */
    memset(sh, 0, sizeof(sh));
    int bad = 0;
    uint64_t next_room = 1, arrivals = 0, last_first_admit = 0;
    long n_steps = 0, n_mixed = 0, n_retracted = 0, n_done = 0, n_abort = 0, n_cut = 0;
    bool *stop = calloc((size_t)max_running, sizeof(bool));
    bool draining = false;
    int32_t pending_retract = 0;
    for (long t = 0; t < steps + 100000; t++) {
        if (t >= steps)
            draining = true;
        double now = (double)t;
        /* arrivals: prompts share prefixes (the cache sees hits), some cross chunk budgets */
        if (!draining && chance(0.3)) {
            int32_t i = -1;
            for (int32_t k = 0; k < LIVE - 4 && i < 0; k++)
                if (sh[k].state == S_NONE)
                    i = k;
            if (i >= 0) {
                struct shadow *r = &sh[i];
                int32_t prompt = 1 + (chance(0.2) ? rint_(200) : rint_(40));
                int32_t max_new = 1 + rint_(30);
                bool too_long = (prompt + max_new - 1 + ps - 1) / ps > pool;
                *r = (struct shadow){.room = next_room,
                                     .state = S_WAIT,
                                     .prompt = prompt,
                                     .max_new = max_new,
                                     .fill = prompt,
                                     .seq = arrivals + 1};
                int32_t family = rint_(3);
                for (int32_t k = 0; k < prompt; k++)
                    r->tokens[k] = k < 24 ? family * 1000 + k : rint_(50000);
                int rc = pd_sched_coloc_add(f.s, next_room, r->tokens, prompt, max_new, now);
                BAD(rc != PD_OK && rc != PD_EFULL && !(rc == PD_ERANGE && too_long));
                BAD(rc == PD_OK && too_long);
                if (rc == PD_OK)
                    arrivals++;
                else
                    r->state = S_NONE;
                next_room++;
            }
        }
        /* aborts in any state */
        if (chance(draining ? 0.01 : 0.02)) {
            int32_t i = rint_(LIVE);
            if (sh[i].state != S_NONE && !sh[i].in_step)
                BAD(pd_sched_coloc_abort(f.s, sh[i].room) != PD_OK);
            bad += pops(f.s, &n_done, &n_abort); /* it ended now */
        }
        struct pd_coloc_step st;
        BAD(pd_sched_coloc_step(f.s, now, &st) != PD_OK);
        n_steps++;
        n_retracted += st.n_retracted;
        /* retracted requests: running in the shadow, not decoding in a decoding step (without
         * mixing a prefill step hides them until the next decode step or their re-admission) */
        pending_retract += st.n_retracted;
        if (mixed || st.n_chunks == 0) {
            for (int32_t i = 0; i < LIVE; i++) {
                if (sh[i].state != S_RUN)
                    continue;
                bool decoding = false;
                for (int32_t k = 0; k < st.n_decodes; k++)
                    decoding |= st.decodes[k].room == sh[i].room;
                bool readmitted = false;
                for (int32_t k = 0; k < st.n_chunks; k++)
                    readmitted |= st.chunks[k].room == sh[i].room;
                if (!decoding) {
                    sh[i].state = S_WAIT;
                    sh[i].fill = sh[i].prompt + sh[i].n_out;
                    pending_retract--;
                }
                BAD(decoding && readmitted);
            }
            BAD(pending_retract != 0);
        } else {
            for (int32_t k = 0; k < st.n_chunks; k++) {
                int32_t i = sfind(st.chunks[k].room);
                if (i >= 0 && sh[i].state == S_RUN) { /* retracted and readmitted at once */
                    sh[i].state = S_WAIT;
                    sh[i].fill = sh[i].prompt + sh[i].n_out;
                    pending_retract--;
                }
            }
        }
        BAD(pd_sched_coloc_check(f.s) != PD_OK);
        BAD(st.n_chunks + st.n_decodes > max_running);
        BAD(!mixed && st.n_chunks > 0 && st.n_decodes > 0);
        if (mixed)
            BAD(st.n_prefill_tokens > 0 && st.n_prefill_tokens + st.n_decodes > budget);
        else
            BAD(st.n_prefill_tokens > budget);
        n_mixed += st.n_chunks > 0 && st.n_decodes > 0;
        int32_t run_count = 0;
        for (int32_t i = 0; i < LIVE; i++)
            run_count += sh[i].state == S_RUN;
        if (mixed || st.n_chunks == 0)
            BAD(st.n_decodes != run_count); /* every running request, once */
        for (int32_t k = 0; k < st.n_chunks; k++) {
            const struct pd_coloc_chunk *c = &st.chunks[k];
            int32_t i = sfind(c->room);
            BAD(i < 0);
            if (i < 0)
                continue;
            struct shadow *r = &sh[i];
            if (r->state == S_WAIT) { /* admitted now */
                if (!r->admitted_once) {
                    BAD(r->seq < last_first_admit); /* FIFO among first admissions */
                    last_first_admit = r->seq;
                    r->admitted_once = true;
                }
                BAD(c->start % ps != 0 || c->start != c->cached_tokens);
                BAD(c->start >= r->fill); /* the last token is always computed */
                r->state = S_PREF;
                r->done = c->start;
            }
            BAD(r->state != S_PREF || c->start != r->done || c->len <= 0);
            BAD(c->start + c->len > r->fill || c->last != (c->start + c->len == r->fill));
            BAD(!c->last && (c->start + c->len) % ps != 0); /* cut at a page boundary */
            BAD(c->n_pages * ps < c->start + c->len);
            n_cut += !c->last;
            r->in_step = true;
        }
        for (int32_t k = 0; k < st.n_decodes; k++) {
            const struct pd_coloc_decode *d = &st.decodes[k];
            int32_t i = sfind(d->room);
            BAD(i < 0);
            if (i < 0)
                continue;
            struct shadow *r = &sh[i];
            BAD(r->state != S_RUN || d->pos != r->prompt + r->n_out - 1);
            BAD(d->n_pages * ps <= d->pos);
            r->in_step = true;
        }
        /* the "model": outputs written into the borrowed tokens; sometimes EOS; aborts mid-step */
        int32_t rows = st.n_chunks + st.n_decodes;
        for (int32_t k = 0; k < rows; k++)
            stop[k] = chance(0.03);
        if (rows && chance(0.02)) {
            int32_t k = rint_(rows);
            uint64_t room = k < st.n_chunks ? st.chunks[k].room : st.decodes[k - st.n_chunks].room;
            BAD(pd_sched_coloc_abort(f.s, room) != PD_OK);
        }
        for (int32_t k = 0; k < rows; k++) {
            bool is_chunk = k < st.n_chunks;
            uint64_t room = is_chunk ? st.chunks[k].room : st.decodes[k - st.n_chunks].room;
            struct shadow *r = &sh[sfind(room)];
            r->in_step = false;
            if (is_chunk) {
                r->done = st.chunks[k].start + st.chunks[k].len;
                if (!st.chunks[k].last)
                    continue;
            }
            r->tokens[r->prompt + r->n_out] = rint_(50000);
            r->n_out++;
            r->state = S_RUN;
        }
        BAD(pd_sched_coloc_step_done(f.s, &st, stop, now) != PD_OK);
        BAD(pd_sched_coloc_check(f.s) != PD_OK);
        bad += pops(f.s, &n_done, &n_abort);
        for (int32_t i = 0; i < LIVE; i++)
            if (sh[i].state == S_RUN && sh[i].n_out >= sh[i].max_new)
                BAD(1); /* should have ended */
        if (draining) {
            struct pd_coloc_counts c;
            pd_sched_coloc_counts(f.s, &c);
            if (c.waiting + c.running == 0)
                break;
        }
        if (bad)
            break;
    }
    struct pd_coloc_counts c;
    pd_sched_coloc_counts(f.s, &c);
    BAD(c.waiting + c.running + c.ended_unpopped != 0); /* everything ended */
    fprintf(stderr,
            "sim ps=%d budget=%d running<=%d mixed=%d cache=%d pool=%d: %ld steps, %ld mixed, "
            "%ld cut chunks, %ld retractions, %ld done, %ld aborted\n",
            (int)ps, (int)budget, (int)max_running, (int)mixed, (int)cache, (int)pool, n_steps,
            n_mixed, n_cut, n_retracted, n_done, n_abort);
    BAD(n_done == 0);
    if (mixed)
        BAD(n_mixed == 0);
    free(stop);
    done(&f);
    return bad;
}

static long sim_steps(void) {
    const char *e = getenv("PD_SIM_STEPS");
    long n = e && *e ? atol(e) : SIM_DEFAULT_STEPS;
    return n > 0 ? n : SIM_DEFAULT_STEPS;
}

static void test_sim(void) {
    long n = sim_steps();
    CHECK_INT(sim(4, 32, 8, true, true, 48, n, 1), 0);
    CHECK_INT(sim(16, 64, 16, true, true, 64, n, 2), 0);
    CHECK_INT(sim(4, 32, 8, false, true, 48, n, 3), 0);
    CHECK_INT(sim(1, 16, 4, true, false, 200, n, 4), 0);
    CHECK_INT(sim(8, -1, 6, true, false, 128, n / 2, 5), 0); /* unchunked */
    CHECK_INT(sim(4, 64, 32, true, true, 30, n, 6), 0);      /* small pool: retractions */
}

PD_TEST_MAIN(PD_TEST(test_mixed_steps), PD_TEST(test_unmixed_steps), PD_TEST(test_prefix_cache),
             PD_TEST(test_retraction), PD_TEST(test_aborts), PD_TEST(test_next_turn),
             PD_TEST(test_no_pointless_eviction), PD_TEST(test_bad_input), PD_TEST(test_sim))
