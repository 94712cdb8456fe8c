/* The schedulers' decisions, recorded: seeded random traffic through the prefill, decode and
 * colocated schedulers, each configuration's every decision folded into one 64-bit digest and
 * compared with the golden file tests/fixtures/sched_trace.txt. A refactoring of the schedulers
 * must leave every digest as it is; a mismatch names the configuration whose decisions changed.
 *
 * Folded, in call order: every call's status and out-parameters; each prefill batch (rooms,
 * chunk starts and lengths, last, sends, cached tokens, the page list), batch_done's dropped and
 * quiesce; each decode step's admissions (room, pages), quiesced rooms, batch (room, position,
 * pages), retractions and new_token_ratio (its bits); each colocated step's chunks, decode tokens,
 * retractions and ratio; every popped end (room, reason, cached tokens, outputs) and the queue
 * counts after every step. Rooms, positions and page numbers only: nothing depends on pointers,
 * clocks or hash-table order, so the digest is the same on every machine and build.
 *
 * The invariants themselves are test_sched_sim.c's and test_sched_coloc.c's job; here check()
 * runs every CHECK_EVERY steps only to stop early on a broken scheduler. The step counts are
 * fixed (the golden holds one line per configuration) and the same under ASan.
 *
 * PD_SCHED_TRACE_WRITE=path writes the digests of this build to path instead of comparing them.
 * Regenerate the golden that way ONLY for a change that is meant to alter scheduler decisions,
 * and say so in its commit. */
#include "pd_test.h"
#include "pd_test_rng.h"

#include "common/page_alloc.h"
#include "common/radix_cache.h"
#include "decode/sched_coloc.h"
#include "decode/sched_decode.h"
#include "prefill/sched_prefill.h"

#include <time.h>

#ifndef PD_FIXTURES_DIR
#error "PD_FIXTURES_DIR must point at tests/fixtures"
#endif

#define TRACE_STEPS 200000L /* traffic steps per configuration, then a drain */
#define CHECK_EVERY 4096

/* ---------------------------------------------------------------- digest */

/* FNV-1a over 64-bit words: each value is widened to 64 bits, so the digest does not depend on
 * byte order or on how the scheduler's structs are laid out. */
static uint64_t digest;

static void fold(uint64_t v) {
    digest = (digest ^ v) * 0x100000001B3ull;
}
static void fold_i(int64_t v) {
    fold((uint64_t)v);
}
static void fold_ratio(double r) {
    uint64_t bits;
    memcpy(&bits, &r, sizeof(bits));
    fold(bits);
}
static void fold_pages(const int32_t *pages, int32_t n) {
    fold_i(n);
    for (int32_t i = 0; i < n; i++)
        fold_i(pages[i]);
}
/* What a run exercised, printed with its digest: a trace that never retracts or times out
 * would guard nothing there. */
static long n_ends[PD_END_RETRACTED + 1], n_rows, n_retracted, n_steps;

static void fold_end(const struct pd_sched_end *e) {
    n_ends[e->reason]++;
    fold('E');
    fold(e->room);
    fold_i(e->reason);
    fold_i(e->cached_tokens);
    fold_i(e->n_output);
}

/* ---------------------------------------------------------------- traffic */

enum { LIVE = 64, MAXTOK = 720 };
enum { R_NONE, R_BOOT, R_WAIT, R_XFER, R_RUN, R_INFL, R_DRAIN, R_GONE };

/* What the driver knows of a request: enough to pick the next event for it. */
struct req {
    uint64_t room;
    int state;
    int32_t n_tokens, max_new, n_out;
    bool lost; /* its notice never comes: a timeout ends it */
    int32_t tokens[MAXTOK];
};

static struct req reqs[LIVE];
static int32_t system_prompts[4][400];

static void traffic_init(uint64_t seed) {
    rng_state = seed;
    memset(reqs, 0, sizeof(reqs));
    for (int k = 0; k < 4; k++)
        for (int t = 0; t < 400; t++)
            system_prompts[k][t] = (int32_t)(rnd() & 0xffff);
}

static int32_t find(uint64_t room) {
    for (int32_t i = 0; i < LIVE; i++)
        if (reqs[i].state != R_NONE && reqs[i].room == room)
            return i;
    return -1;
}

/* A random request in state (R_NONE: a free entry), -1 when none. */
static int32_t pick(int state) {
    int32_t start = rint_(LIVE);
    for (int32_t k = 0; k < LIVE; k++) {
        int32_t i = (start + k) % LIVE;
        if (reqs[i].state == state)
            return i;
    }
    return -1;
}

static int32_t pick_live(void) {
    int32_t start = rint_(LIVE);
    for (int32_t k = 0; k < LIVE; k++) {
        int32_t i = (start + k) % LIVE;
        if (reqs[i].state != R_NONE && reqs[i].state != R_GONE)
            return i;
    }
    return -1;
}

static int32_t n_live(void) {
    int32_t n = 0;
    for (int32_t i = 0; i < LIVE; i++)
        n += reqs[i].state != R_NONE;
    return n;
}

/* A prompt of n tokens: often a shared system prefix (prefix-cache hits), then random ones. */
static void make_prompt(struct req *r, int32_t n) {
    int32_t sys = chance(0.6) ? rint_(400) : 0, k = rint_(4);
    r->n_tokens = n;
    for (int32_t t = 0; t < n; t++)
        r->tokens[t] = t < sys ? system_prompts[k][t] : (int32_t)(rnd() & 0xffff);
}

/* ---------------------------------------------------------------- prefill */

static void prefill_pops(struct pd_sched_prefill *s) {
    struct pd_sched_end e;
    while (pd_sched_prefill_pop_ended(s, &e) == PD_OK) {
        fold_end(&e);
        int32_t i = find(e.room);
        if (i >= 0)
            reqs[i].state = R_NONE;
    }
}

/* what a Transfer releases: nothing here (the traced configurations are not eager) */
static struct pd_prefill_send unsent;

static int prefill_trace(int32_t ps, int32_t budget, int32_t max_prefill, bool cache, uint64_t seed,
                         long steps) {
    struct pd_page_alloc *pa;
    struct pd_radix_cache *rc = NULL;
    struct pd_sched_prefill *s;
    struct pd_sched_prefill_config cfg = {.page_size = ps,
                                          .chunked_prefill_size = budget,
                                          .max_prefill_tokens = max_prefill,
                                          .max_queued_requests = LIVE - 8,
                                          .bootstrap_timeout_s = 40};
    CHECK_OK(pd_page_alloc_new(256, &pa));
    if (cache)
        CHECK_OK(pd_radix_cache_new(pa, ps, false, &rc));
    CHECK_OK(pd_sched_prefill_new(&cfg, pa, rc, &s));
    traffic_init(seed);
    uint64_t room_ctr = 0;
    int bad = 0;
    double now = 0;
    for (long step = 0; step < steps + 5000; step++) {
        bool drain = step >= steps;
        now += 1;
        if (!drain && chance(0.35)) {
            int32_t i = pick(R_NONE);
            if (i >= 0) {
                struct req *r = &reqs[i];
                make_prompt(r, 1 + rint_(chance(0.1) ? MAXTOK - 20 : 200));
                /* sometimes the room of a request that just ended (or is still live) */
                r->room = chance(0.05) && room_ctr ? room_ctr * 7919 : ++room_ctr * 7919;
                int rc2 = pd_sched_prefill_add(s, r->room, r->tokens, r->n_tokens, now);
                fold('a');
                fold_i(rc2);
                if (rc2 == PD_OK) {
                    r->state = R_BOOT;
                    if (chance(0.1))
                        fold_i(pd_sched_prefill_limit_cache(s, r->room, rint_(r->n_tokens)));
                }
            }
        }
        /* decode's Transfer arrives for most rooms; the others time out */
        if (chance(drain ? 1.0 : 0.4)) {
            int32_t i = pick(R_BOOT);
            if (i >= 0 && (drain || reqs[i].room % 13 != 0)) {
                fold('b');
                fold_i(pd_sched_prefill_bootstrapped(s, reqs[i].room, now, &unsent));
                reqs[i].state = R_WAIT;
            }
        }
        if (chance(0.5)) {
            int32_t i = pick(R_INFL);
            if (i >= 0) {
                fold('t');
                fold_i(pd_sched_prefill_transfer_done(
                    s, reqs[i].room, drain || chance(0.93) ? PD_OK : PD_EPEER, now));
            }
        }
        if (!drain && chance(0.01)) { /* the peer dies while the request waits or prefills */
            int32_t i = pick(R_WAIT);
            if (i >= 0) {
                fold('f');
                fold_i(pd_sched_prefill_transfer_done(s, reqs[i].room, PD_EPEER, now));
            }
        }
        if (!drain && chance(0.03)) {
            int32_t i = pick_live();
            if (i >= 0 && reqs[i].state != R_DRAIN) {
                bool q;
                fold('x');
                fold_i(pd_sched_prefill_abort(s, reqs[i].room, &q));
                fold(q);
                if (q)
                    reqs[i].state = R_DRAIN;
            }
        }
        if (chance(0.3)) {
            int32_t i = pick(R_DRAIN);
            if (i >= 0) {
                fold('r');
                fold_i(pd_sched_prefill_release(s, reqs[i].room));
            }
        }
        prefill_pops(s);

        struct pd_prefill_batch b;
        fold('S');
        fold_i(pd_sched_prefill_step(s, now, &b));
        prefill_pops(s); /* bootstrap timeouts */
        fold_i(b.n);
        fold_i(b.n_tokens);
        n_rows += b.n;
        n_steps++;
        for (int32_t c = 0; c < b.n; c++) {
            const struct pd_prefill_chunk *ch = &b.chunks[c];
            fold(ch->room);
            fold_i(ch->start);
            fold_i(ch->len);
            fold(ch->last);
            fold_i(ch->send_begin);
            fold_i(ch->send_end);
            fold_i(ch->cached_tokens);
            fold_pages(ch->pages, ch->n_pages);
        }
        if (b.n && !drain && chance(0.03)) {
            bool q;
            fold('X');
            fold_i(pd_sched_prefill_abort(s, b.chunks[rint_(b.n)].room, &q));
            fold(q);
        }
        fold('D');
        fold_i(pd_sched_prefill_batch_done(s, &b, now));
        for (int32_t c = 0; c < b.n; c++) {
            const struct pd_prefill_chunk *ch = &b.chunks[c];
            fold(ch->dropped);
            fold(ch->quiesce);
            fold_i(ch->send_end);
            int32_t i = find(ch->room);
            if (i >= 0 && ch->dropped && ch->quiesce)
                reqs[i].state = R_DRAIN;
            else if (i >= 0 && !ch->dropped && ch->last)
                reqs[i].state = R_INFL;
        }
        prefill_pops(s);
        struct pd_prefill_counts n;
        pd_sched_prefill_counts(s, &n);
        fold_i(n.bootstrap);
        fold_i(n.waiting);
        fold_i(n.inflight);
        fold_i(n.draining);
        fold_i(n.ended_unpopped);
        if (step % CHECK_EVERY == 0 && pd_sched_prefill_check(s) != PD_OK) {
            fprintf(stderr, "prefill step %ld: %s\n", step, pd_error_msg());
            bad++;
            break;
        }
        if (drain && n_live() == 0)
            break;
    }
    bad += n_live() != 0; /* the drain ends everything */
    CHECK_OK(pd_sched_prefill_check(s));
    pd_sched_prefill_free(s);
    if (rc)
        pd_radix_cache_flush(rc);
    bad += pd_page_alloc_n_free(pa) != 256;
    pd_radix_cache_free(rc);
    pd_page_alloc_free(pa);
    return bad;
}

/* ---------------------------------------------------------------- decode */

static void decode_pops(struct pd_sched_decode *s) {
    struct pd_sched_end e;
    while (pd_sched_decode_pop_ended(s, &e) == PD_OK) {
        fold_end(&e);
        int32_t i = find(e.room);
        if (i >= 0)
            reqs[i].state = R_NONE;
    }
}

static int decode_trace(int32_t ps, int32_t pool, int32_t max_running, uint64_t seed, long steps) {
    struct pd_page_alloc *pa;
    struct pd_sched_decode *s;
    struct pd_sched_decode_config cfg = {.page_size = ps,
                                         .max_running_requests = max_running,
                                         .max_queued_requests = LIVE - 8,
                                         .waiting_timeout_s = 30};
    pd_sched_decode_config_defaults(&cfg);
    cfg.new_token_ratio_decay = 0.01; /* fast decay: more retractions */
    CHECK_OK(pd_page_alloc_new(pool, &pa));
    CHECK_OK(pd_sched_decode_new(&cfg, pa, NULL, &s));
    traffic_init(seed);
    uint64_t room_ctr = 0;
    int bad = 0;
    double now = 0;
    static bool stopped[LIVE];
    for (long step = 0; step < steps + 5000; step++) {
        bool drain = step >= steps;
        now += 1;
        if (!drain && chance(0.3)) {
            int32_t i = pick(R_NONE);
            if (i >= 0) {
                struct req *r = &reqs[i];
                r->room = ++room_ctr * 104729;
                int32_t prompt = 1 + rint_(chance(0.1) ? 600 : 100);
                r->max_new = 1 + rint_(chance(0.2) ? 300 : 40);
                int rc2 = pd_sched_decode_add(s, r->room, NULL, prompt, r->max_new, now);
                fold('a');
                fold_i(rc2);
                if (rc2 == PD_OK) {
                    r->state = R_WAIT;
                    r->lost = chance(0.02);
                }
            }
        }
        for (int k = 0; k < 3; k++) {
            int32_t i = pick(R_XFER);
            if (i >= 0 && (!reqs[i].lost || drain) && chance(0.5)) {
                bool ok = drain || chance(0.95);
                fold('t');
                fold_i(pd_sched_decode_transfer_done(s, reqs[i].room, ok ? PD_OK : PD_EPEER, now));
                reqs[i].state = ok ? R_RUN : R_DRAIN;
            }
        }
        if (!drain && chance(0.03)) {
            int32_t i = pick_live();
            if (i >= 0) {
                bool q;
                fold('x');
                fold_i(pd_sched_decode_abort(s, reqs[i].room, &q));
                fold(q);
                if (q)
                    reqs[i].state = R_DRAIN;
            }
        }
        if (chance(0.3)) {
            int32_t i = pick(R_DRAIN);
            if (i >= 0) {
                fold('r');
                fold_i(pd_sched_decode_release(s, reqs[i].room));
            }
        }
        decode_pops(s);

        struct pd_decode_step st;
        fold('S');
        fold_i(pd_sched_decode_step(s, now, &st));
        fold_ratio(st.new_token_ratio);
        fold_i(st.n_retracted);
        fold_i(st.n_quiesce);
        n_rows += st.n_batch;
        n_steps++;
        for (int32_t k = 0; k < st.n_quiesce; k++) {
            fold(st.quiesce[k]);
            int32_t i = find(st.quiesce[k]);
            if (i >= 0)
                reqs[i].state = R_DRAIN;
        }
        decode_pops(s); /* retractions: their victims */
        fold_i(st.n_admitted);
        for (int32_t k = 0; k < st.n_admitted; k++) {
            fold(st.admitted[k].room);
            fold_pages(st.admitted[k].pages, st.admitted[k].n_pages);
            int32_t i = find(st.admitted[k].room);
            if (i >= 0)
                reqs[i].state = R_XFER;
        }
        fold_i(st.n_batch);
        for (int32_t k = 0; k < st.n_batch; k++) {
            fold(st.batch[k].room);
            fold_i(st.batch[k].pos);
            fold_pages(st.batch[k].pages, st.batch[k].n_pages);
            stopped[k] = chance(0.02);
        }
        if (st.n_batch && !drain && chance(0.02)) {
            bool q;
            fold('X');
            fold_i(pd_sched_decode_abort(s, st.batch[rint_(st.n_batch)].room, &q));
            fold(q);
        }
        fold('D');
        fold_i(pd_sched_decode_batch_done(s, &st, stopped, now));
        decode_pops(s);
        struct pd_decode_counts n;
        pd_sched_decode_counts(s, &n);
        fold_i(n.prealloc);
        fold_i(n.transfer);
        fold_i(n.running);
        fold_i(n.draining);
        fold_i(n.ended_unpopped);
        if (step % CHECK_EVERY == 0 && pd_sched_decode_check(s) != PD_OK) {
            fprintf(stderr, "decode step %ld: %s\n", step, pd_error_msg());
            bad++;
            break;
        }
        if (drain && n_live() == 0)
            break;
    }
    bad += n_live() != 0;
    CHECK_OK(pd_sched_decode_check(s));
    pd_sched_decode_free(s);
    bad += pd_page_alloc_n_free(pa) != pool;
    pd_page_alloc_free(pa);
    return bad;
}

/* ---------------------------------------------------------------- colocated */

static void coloc_pops(struct pd_sched_coloc *s) {
    struct pd_sched_end e;
    while (pd_sched_coloc_pop_ended(s, &e) == PD_OK) {
        fold_end(&e);
        int32_t i = find(e.room);
        if (i >= 0)
            reqs[i].state = R_NONE;
    }
}

/* The "model" ran a row of the request: its next output token is written where a re-prefill
 * after a retraction reads it. */
static void coloc_output(uint64_t room) {
    int32_t i = find(room);
    if (i < 0)
        return;
    struct req *r = &reqs[i];
    if (r->n_tokens + r->n_out < MAXTOK)
        r->tokens[r->n_tokens + r->n_out] = (int32_t)(rnd() & 0xffff);
    r->n_out++;
}

static int coloc_trace(int32_t ps, int32_t budget, int32_t max_running, bool mixed, bool cache,
                       int32_t pool, uint64_t seed, long steps) {
    struct pd_page_alloc *pa;
    struct pd_radix_cache *rc = NULL;
    struct pd_sched_coloc *s;
    struct pd_sched_coloc_config cfg = {.page_size = ps,
                                        .chunked_prefill_size = budget,
                                        .max_prefill_tokens = 16384,
                                        .max_running_requests = max_running,
                                        .max_queued_requests = LIVE - 24};
    pd_sched_coloc_config_defaults(&cfg);
    cfg.mixed_chunk = mixed;
    cfg.init_new_token_ratio = 0.5;
    cfg.new_token_ratio_decay = 0.005;
    CHECK_OK(pd_page_alloc_new(pool, &pa));
    if (cache)
        CHECK_OK(pd_radix_cache_new(pa, ps, false, &rc));
    CHECK_OK(pd_sched_coloc_new(&cfg, pa, rc, &s));
    traffic_init(seed);
    uint64_t room_ctr = 0;
    int bad = 0;
    double now = 0;
    static bool stopped[2 * LIVE];
    for (long step = 0; step < steps + 20000; step++) {
        bool drain = step >= steps;
        now += 1;
        if (!drain && chance(0.3)) {
            int32_t i = pick(R_NONE);
            if (i >= 0) {
                struct req *r = &reqs[i];
                make_prompt(r, 1 + (chance(0.2) ? rint_(300) : rint_(40)));
                r->max_new = 1 + rint_(30);
                r->n_out = 0;
                r->room = ++room_ctr * 31;
                int rc2 = pd_sched_coloc_add(s, r->room, r->tokens, r->n_tokens, r->max_new, now);
                fold('a');
                fold_i(rc2);
                if (rc2 == PD_OK) {
                    r->state = R_WAIT;
                    if (chance(0.1))
                        fold_i(pd_sched_coloc_limit_cache(s, r->room, rint_(r->n_tokens)));
                }
            }
        }
        if (chance(drain ? 0.01 : 0.02)) {
            int32_t i = pick_live();
            if (i >= 0) {
                fold('x');
                fold_i(pd_sched_coloc_abort(s, reqs[i].room));
            }
        }
        coloc_pops(s);

        struct pd_coloc_step st;
        fold('S');
        fold_i(pd_sched_coloc_step(s, now, &st));
        fold_ratio(st.new_token_ratio);
        fold_i(st.n_retracted);
        fold_i(st.n_prefill_tokens);
        n_rows += st.n_chunks + st.n_decodes;
        n_retracted += st.n_retracted;
        n_steps++;
        fold_i(st.n_chunks);
        for (int32_t k = 0; k < st.n_chunks; k++) {
            const struct pd_coloc_chunk *c = &st.chunks[k];
            fold(c->room);
            fold_i(c->start);
            fold_i(c->len);
            fold(c->last);
            fold_i(c->cached_tokens);
            fold_pages(c->pages, c->n_pages);
        }
        fold_i(st.n_decodes);
        for (int32_t k = 0; k < st.n_decodes; k++) {
            fold(st.decodes[k].room);
            fold_i(st.decodes[k].pos);
            fold_pages(st.decodes[k].pages, st.decodes[k].n_pages);
        }
        int32_t rows = st.n_chunks + st.n_decodes;
        for (int32_t k = 0; k < rows; k++)
            stopped[k] = chance(0.03);
        if (rows && !drain && chance(0.02)) {
            int32_t k = rint_(rows);
            fold('X');
            fold_i(pd_sched_coloc_abort(s, k < st.n_chunks ? st.chunks[k].room
                                                           : st.decodes[k - st.n_chunks].room));
        }
        for (int32_t k = 0; k < st.n_chunks; k++)
            if (st.chunks[k].last)
                coloc_output(st.chunks[k].room);
        for (int32_t k = 0; k < st.n_decodes; k++)
            coloc_output(st.decodes[k].room);
        fold('D');
        fold_i(pd_sched_coloc_step_done(s, &st, stopped, now));
        coloc_pops(s);
        struct pd_coloc_counts n;
        pd_sched_coloc_counts(s, &n);
        fold_i(n.waiting);
        fold_i(n.prefilling);
        fold_i(n.running);
        fold_i(n.ended_unpopped);
        fold_i(n.retracted);
        if (step % CHECK_EVERY == 0 && pd_sched_coloc_check(s) != PD_OK) {
            fprintf(stderr, "colocated step %ld: %s\n", step, pd_error_msg());
            bad++;
            break;
        }
        if (drain && n_live() == 0)
            break;
    }
    bad += n_live() != 0;
    CHECK_OK(pd_sched_coloc_check(s));
    pd_sched_coloc_free(s);
    if (rc)
        pd_radix_cache_flush(rc);
    bad += pd_page_alloc_n_free(pa) != pool;
    pd_radix_cache_free(rc);
    pd_page_alloc_free(pa);
    return bad;
}

/* ---------------------------------------------------------------- configurations, golden */

enum { K_PREFILL, K_DECODE, K_COLOC };

struct trace_config {
    const char *name;
    int kind;
    int32_t ps, budget, max_prefill, max_running, pool;
    bool cache, mixed;
    uint64_t seed;
};

/* The sims' configurations: chunked and unchunked, with and without the prefix cache, page sizes
 * 1 to 16, pools small enough for timeouts, retractions and evictions to be frequent. */
static const struct trace_config configs[] = {
    {"prefill/ps16-b256-cache", K_PREFILL, 16, 256, 16384, 0, 0, true, false, 1},
    {"prefill/ps1-b300-max200", K_PREFILL, 1, 300, 200, 0, 0, false, false, 2},
    {"prefill/ps16-unchunked-max512-cache", K_PREFILL, 16, -1, 512, 0, 0, true, false, 3},
    {"decode/ps16-pool96-run32", K_DECODE, 16, 0, 0, 32, 96, false, false, 4},
    {"decode/ps1-pool700-run64", K_DECODE, 1, 0, 0, 64, 700, false, false, 5},
    {"coloc/ps4-b32-run8-mixed-cache-pool48", K_COLOC, 4, 32, 0, 8, 48, true, true, 6},
    {"coloc/ps16-b64-run16-mixed-cache-pool64", K_COLOC, 16, 64, 0, 16, 64, true, true, 7},
    {"coloc/ps4-b32-run8-unmixed-cache-pool48", K_COLOC, 4, 32, 0, 8, 48, true, false, 8},
    {"coloc/ps1-b16-run4-mixed-pool200", K_COLOC, 1, 16, 0, 4, 200, false, true, 9},
    {"coloc/ps8-unchunked-run6-mixed-pool128", K_COLOC, 8, -1, 0, 6, 128, false, true, 10},
    {"coloc/ps4-b64-run32-mixed-cache-pool30", K_COLOC, 4, 64, 0, 32, 30, true, true, 11},
};
enum { N_CONFIGS = sizeof(configs) / sizeof(configs[0]) };

static int run_config(const struct trace_config *c, long steps) {
    digest = 0xcbf29ce484222325ull; /* FNV-1a offset basis */
    memset(n_ends, 0, sizeof(n_ends));
    n_rows = n_retracted = n_steps = 0;
    switch (c->kind) {
    case K_PREFILL:
        return prefill_trace(c->ps, c->budget, c->max_prefill, c->cache, c->seed, steps);
    case K_DECODE: return decode_trace(c->ps, c->pool, c->max_running, c->seed, steps);
    default:
        return coloc_trace(c->ps, c->budget, c->max_running, c->mixed, c->cache, c->pool, c->seed,
                           steps);
    }
}

static const char golden_header[] =
    "# Scheduler decision trace (tests/unit/test_sched_trace.c): seed, traffic steps, scheduler\n"
    "# configuration, and the FNV-1a digest of every decision the scheduler made in that run.\n"
    "# A refactoring must leave every line as it is. Regenerate this file (PD_SCHED_TRACE_WRITE=\n"
    "# path ./unit_sched_trace) ONLY for a change that is MEANT to alter scheduler decisions, and\n"
    "# say so in that commit.\n";

/* The golden digest of (seed, steps, name); false when the file has no such line. */
static bool golden_lookup(FILE *f, const struct trace_config *c, long steps, uint64_t *out) {
    char line[256], name[128];
    unsigned long long seed, hex;
    long n;
    rewind(f);
    while (fgets(line, sizeof(line), f)) {
        if (line[0] == '#')
            continue;
        if (sscanf(line, "%llu %ld %127s %llx", &seed, &n, name, &hex) == 4 && seed == c->seed &&
            n == steps && strcmp(name, c->name) == 0) {
            *out = hex;
            return true;
        }
    }
    return false;
}

static void test_trace(void) {
    const char *write_path = getenv("PD_SCHED_TRACE_WRITE");
    bool writing = write_path && *write_path;
    FILE *f = fopen(writing ? write_path : PD_FIXTURES_DIR "/sched_trace.txt", writing ? "w" : "r");
    if (!f) {
        fprintf(stderr, "%s: cannot open\n",
                writing ? write_path : PD_FIXTURES_DIR "/sched_trace.txt");
        CHECK(f != NULL);
        return;
    }
    if (writing)
        fputs(golden_header, f);
    clock_t t0 = clock();
    for (int i = 0; i < N_CONFIGS; i++) {
        const struct trace_config *c = &configs[i];
        CHECK_INT(run_config(c, TRACE_STEPS), 0);
        fprintf(stderr,
                "%s: %ld steps (drain included), %ld rows, ends %ld done %ld aborted %ld timeout "
                "%ld failed %ld retracted, %ld sent back to waiting: %016llx\n",
                c->name, n_steps, n_rows, n_ends[PD_END_DONE], n_ends[PD_END_ABORTED],
                n_ends[PD_END_TIMEOUT], n_ends[PD_END_FAILED], n_ends[PD_END_RETRACTED],
                n_retracted, (unsigned long long)digest);
        /* every configuration finishes requests; the decode ones also retract */
        CHECK(n_ends[PD_END_DONE] > 0 && n_ends[PD_END_ABORTED] > 0);
        CHECK(c->kind != K_DECODE || n_ends[PD_END_RETRACTED] > 0);
        if (writing) {
            fprintf(f, "%llu %ld %s %016llx\n", (unsigned long long)c->seed, TRACE_STEPS, c->name,
                    (unsigned long long)digest);
            continue;
        }
        uint64_t want;
        if (!golden_lookup(f, c, TRACE_STEPS, &want)) {
            fprintf(stderr, "%s (seed %llu, %ld steps): no line in the golden\n", c->name,
                    (unsigned long long)c->seed, TRACE_STEPS);
            CHECK(false);
        } else if (want != digest) {
            fprintf(stderr,
                    "%s (seed %llu, %ld steps): decisions changed: digest %016llx, golden "
                    "%016llx\n",
                    c->name, (unsigned long long)c->seed, TRACE_STEPS, (unsigned long long)digest,
                    (unsigned long long)want);
            CHECK(false);
        }
    }
    fclose(f);
    if (writing)
        fprintf(stderr, "wrote %d digests to %s\n", N_CONFIGS, write_path);
    fprintf(stderr, "traced %d configurations of %ld steps in %.2f s\n", N_CONFIGS, TRACE_STEPS,
            (double)(clock() - t0) / CLOCKS_PER_SEC);
}

PD_TEST_MAIN(PD_TEST(test_trace))
