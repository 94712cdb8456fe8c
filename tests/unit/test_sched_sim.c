/* Seeded random traffic through both schedulers (arrivals, bootstraps, chunk completions,
 * transfer done/failed, lost notices, aborts in any state, releases, stops), with invariants
 * checked after every step against a shadow model of each request:
 *   pages conserved and each page's count equals its holders (pd_sched_*_check), refcounts
 *   never negative (the allocator asserts), a room maps to one live request, prefill chunks
 *   contiguous from the cache hit and page-aligned except the last, sends contiguous, whole
 *   pages, covering every prompt page exactly once by the time a request is done, the budget
 *   never exceeded, new requests admitted in FIFO order, decode batches <= max_running, every
 *   running request's KV position inside its pages, and every request ends (timeouts bound the
 *   lost ones; a final drain must end all and give the whole pool back). Eager prefill
 *   (computing before the Transfer): admission in arrival order across bootstrap and waiting,
 *   nothing sent before the Transfer, and all that was computed sendable the moment it comes
 *   (between steps, or widened at batch_done when it comes during one).
 * PD_SIM_STEPS sets the steps per scheduler configuration (default 250k, 50k under ASan). */
#include "pd_test.h"
#include "pd_test_rng.h"

#include "common/page_alloc.h"
#include "common/radix_cache.h"
#include "decode/sched_decode.h"
#include "prefill/sched_prefill.h"

#include <time.h>

#if defined(__SANITIZE_ADDRESS__)
#define SIM_DEFAULT_STEPS 50000
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SIM_DEFAULT_STEPS 50000
#endif
#endif
#ifndef SIM_DEFAULT_STEPS
#define SIM_DEFAULT_STEPS 250000
#endif

static long sim_steps(void) {
    const char *e = getenv("PD_SIM_STEPS");
    long n = e && *e ? atol(e) : SIM_DEFAULT_STEPS;
    return n > 0 ? n : SIM_DEFAULT_STEPS;
}

static long total_steps;

/* Counts a broken invariant; the first one of each function call says where. */
#define BAD(cond)                                                                                  \
    do {                                                                                           \
        if (cond) {                                                                                \
            if (!bad)                                                                              \
                fprintf(stderr, "sim %s:%d: %s\n", __func__, __LINE__, #cond);                     \
            bad++;                                                                                 \
        }                                                                                          \
    } while (0)

/* ---------------------------------------------------------------- prefill */

enum { P_LIVE = 48, P_MAXTOK = 700 };
enum { S_NONE, S_BOOT, S_WAIT, S_PREF, S_INFL, S_DRAIN };

struct pshadow {
    uint64_t room;
    int state;
    int32_t n_tokens;
    int32_t tokens[P_MAXTOK];
    int32_t next_tok;  /* next token to compute; -1 before the first chunk */
    int32_t sent;      /* pages sent */
    uint64_t wait_seq; /* order of entry into waiting */
    double t_add, t_boot;
    bool fail_pending; /* failure reported while in the running step */
    bool paired;       /* its Transfer came */
};

struct pstats {
    long added, full, ended[5], chunks, tokens, cached, retried_rooms;
};

static int32_t pfind(struct pshadow *sh, uint64_t room) {
    for (int32_t i = 0; i < P_LIVE; i++)
        if (sh[i].state != S_NONE && sh[i].room == room)
            return i;
    return -1;
}

enum { S_LIVE = -1 }; /* any state but S_NONE */

/* A random slot in state (S_LIVE: any live request) whose pairing is paired (-1: either). */
static int32_t ppick_paired(struct pshadow *sh, int state, int paired) {
    int32_t start = rint_(P_LIVE);
    for (int32_t k = 0; k < P_LIVE; k++) {
        int32_t i = (start + k) % P_LIVE;
        bool in = state == S_LIVE ? sh[i].state != S_NONE : sh[i].state == state;
        if (in && (paired < 0 || sh[i].paired == (paired != 0)))
            return i;
    }
    return -1;
}

static int32_t ppick(struct pshadow *sh, int state) {
    return ppick_paired(sh, state, -1);
}

/* The request the scheduler must admit next: waiting's first (by entry), or eager, the first
 * arrival in bootstrap when it came before that one. */
static int32_t expected_admit(const struct pshadow *sh, bool eager) {
    int32_t w = -1, b = -1;
    for (int32_t j = 0; j < P_LIVE; j++) {
        if (sh[j].next_tok >= 0)
            continue;
        if (sh[j].state == S_WAIT && (w < 0 || sh[j].wait_seq < sh[w].wait_seq))
            w = j;
        if (eager && sh[j].state == S_BOOT && (b < 0 || sh[j].t_add < sh[b].t_add))
            b = j;
    }
    return b >= 0 && (w < 0 || sh[b].t_add < sh[w].t_add) ? b : w;
}

static int pops_prefill(struct pd_sched_prefill *s, struct pshadow *sh, struct pstats *st,
                        int32_t ps, double now, double timeout) {
    struct pd_sched_end e;
    int bad = 0;
    while (pd_sched_prefill_pop_ended(s, &e) == PD_OK) {
        int32_t i = pfind(sh, e.room);
        if (i < 0) {
            bad++;
            continue;
        }
        struct pshadow *r = &sh[i];
        if (e.reason == PD_END_DONE)
            BAD(r->state != S_INFL || r->sent != (r->n_tokens + ps - 1) / ps); /* all sent */
        if (e.reason == PD_END_TIMEOUT)
            BAD(r->paired || r->state == S_WAIT || r->state == S_DRAIN ||
                now - r->t_add < timeout || now - r->t_add > timeout + 1);
        st->ended[e.reason]++;
        st->cached += e.cached_tokens;
        r->state = S_NONE;
    }
    return bad;
}

static int sim_prefill(int32_t ps, int32_t budget, int32_t max_prefill, bool cache, bool eager,
                       long steps, uint64_t seed) {
    rng_state = seed;
    const double timeout = 40;
    const int32_t pool = 256;
    struct pd_page_alloc *pa;
    struct pd_radix_cache *rc = NULL;
    struct pd_sched_prefill *s;
    struct pd_sched_prefill_config cfg = {.page_size = ps,
                                          .chunked_prefill_size = budget,
                                          .max_prefill_tokens = max_prefill,
                                          .max_queued_requests = P_LIVE - 8,
                                          .bootstrap_timeout_s = timeout,
                                          .eager = eager};
    int32_t eff_budget = budget > 0 && budget < max_prefill ? budget : max_prefill;
    CHECK_OK(pd_page_alloc_new(pool, &pa));
    if (cache)
        CHECK_OK(pd_radix_cache_new(pa, ps, false, &rc));
    CHECK_OK(pd_sched_prefill_new(&cfg, pa, rc, &s));
    static struct pshadow sh[P_LIVE];
    memset(sh, 0, sizeof(sh));
    static int32_t system_prompts[4][400];
    for (int k = 0; k < 4; k++)
        for (int t = 0; t < 400; t++)
            system_prompts[k][t] = (int32_t)(rnd() & 0xffff);
    struct pstats st = {0};
    uint64_t wait_seq = 0, room_ctr = 0;
    int bad = 0;
    double now = 0;
    long drain_from = steps, step;
    for (step = 0; step < steps + 2000; step++) {
        now += 1;
        bool draining_phase = step >= drain_from;
        /* arrivals: a prompt of a shared system prefix and a random tail */
        if (!draining_phase && chance(0.35)) {
            int32_t i = ppick(sh, S_NONE);
            if (i >= 0) {
                struct pshadow *r = &sh[i];
                int32_t sys = chance(0.6) ? rint_(400) : 0, k = rint_(4);
                r->n_tokens = 1 + rint_(chance(0.1) ? P_MAXTOK : 200);
                for (int32_t t = 0; t < r->n_tokens; t++)
                    r->tokens[t] = t < sys ? system_prompts[k][t] : (int32_t)(rnd() & 0xffff);
                /* sometimes reuse the room of a request that just ended: allowed */
                r->room = chance(0.05) && room_ctr ? room_ctr * 7919 : ++room_ctr * 7919;
                int rc2 = pd_sched_prefill_add(s, r->room, r->tokens, r->n_tokens, now);
                if (rc2 == PD_OK) {
                    r->state = S_BOOT;
                    r->next_tok = -1;
                    r->sent = 0;
                    r->t_add = now;
                    r->fail_pending = false;
                    r->paired = false;
                    st.added++;
                } else {
                    BAD(rc2 != PD_EFULL && rc2 != PD_EINVAL && rc2 != PD_ERANGE);
                    BAD(rc2 == PD_ERANGE && (r->n_tokens + ps - 1) / ps <= pool);
                    st.full += rc2 == PD_EFULL;
                    st.retried_rooms += rc2 == PD_EINVAL;
                    BAD(rc2 == PD_EINVAL && pfind(sh, r->room) < 0); /* dup only if live */
                }
            }
        }
        /* decode's Transfer arrives for most rooms; some never do (timeout) */
        if (chance(draining_phase ? 1.0 : 0.4)) {
            int32_t i = ppick_paired(sh, S_LIVE, 0);
            if (i >= 0 && sh[i].state != S_DRAIN && (draining_phase || (sh[i].room % 13) != 0)) {
                struct pshadow *r = &sh[i];
                struct pd_prefill_send out;
                CHECK_OK(pd_sched_prefill_bootstrapped(s, r->room, now, &out));
                r->paired = true;
                if (r->state == S_BOOT) {
                    BAD(out.end != out.begin || out.last);
                    r->state = S_WAIT;
                    r->wait_seq = ++wait_seq;
                    r->t_boot = now;
                } else { /* eager: all it computed goes now */
                    bool done = r->state == S_INFL;
                    BAD(!eager || out.begin != r->sent || out.last != done);
                    BAD(out.end != (done ? (r->n_tokens + ps - 1) / ps : r->next_tok / ps));
                    r->sent = out.end;
                }
            }
        }
        if (chance(0.5)) {
            int32_t i = ppick_paired(sh, S_INFL, 1);
            if (i >= 0) {
                bool ok = draining_phase || chance(0.93);
                CHECK_OK(pd_sched_prefill_transfer_done(s, sh[i].room, ok ? PD_OK : PD_EPEER, now));
                BAD(pops_prefill(s, sh, &st, ps, now, timeout) != 0); /* ended at once */
            }
        }
        if (!draining_phase && chance(0.01)) { /* peer died mid-prefill */
            int32_t i = ppick(sh, S_PREF);
            if (i >= 0) {
                CHECK_OK(pd_sched_prefill_transfer_done(s, sh[i].room, PD_EPEER, now));
                BAD(pops_prefill(s, sh, &st, ps, now, timeout) != 0);
            }
        }
        if (!draining_phase && chance(0.03)) {
            int32_t i = pfind(sh, room_ctr * 7919 - 7919 * (uint64_t)rint_(8));
            if (i >= 0 && sh[i].state != S_DRAIN) {
                bool q;
                CHECK_OK(pd_sched_prefill_abort(s, sh[i].room, &q));
                BAD(q != (sh[i].sent > 0));
                if (q)
                    sh[i].state = S_DRAIN;
            }
        }
        if (chance(0.3)) {
            int32_t i = ppick(sh, S_DRAIN);
            if (i >= 0)
                CHECK_OK(pd_sched_prefill_release(s, sh[i].room));
        }
        BAD(pops_prefill(s, sh, &st, ps, now, timeout));

        struct pd_prefill_batch b;
        CHECK_OK(pd_sched_prefill_step(s, now, &b));
        BAD(pops_prefill(s, sh, &st, ps, now, timeout)); /* timeouts */
        BAD(b.n_tokens > eff_budget && !(budget <= 0 && b.n == 1));
        int32_t sum = 0;
        for (int32_t c = 0; c < b.n; c++) {
            struct pd_prefill_chunk *ch = &b.chunks[c];
            int32_t i = pfind(sh, ch->room);
            if (i < 0) {
                bad++;
                continue;
            }
            struct pshadow *r = &sh[i];
            sum += ch->len;
            if (r->next_tok < 0) { /* first chunk: FIFO (by arrival, eager), starts at the hit */
                BAD(i != expected_admit(sh, eager));
                BAD(ch->start != ch->cached_tokens || ch->start % ps != 0 ||
                    ch->start >= r->n_tokens);
                r->state = S_PREF;
                r->next_tok = ch->start;
            }
            BAD(ch->start != r->next_tok || ch->len <= 0 || ch->start + ch->len > r->n_tokens);
            BAD(ch->last != (ch->start + ch->len == r->n_tokens));
            BAD(!ch->last && (ch->start + ch->len) % ps != 0);
            BAD(ch->send_begin != r->sent);
            BAD(ch->send_end != (!r->paired ? r->sent
                                 : ch->last ? (r->n_tokens + ps - 1) / ps
                                            : (ch->start + ch->len) / ps));
            BAD(ch->n_pages != (r->n_tokens + ps - 1) / ps);
            for (int32_t p = 0; p < ch->n_pages; p++)
                BAD(ch->pages[p] < 0 || ch->pages[p] >= pool);
            st.chunks++;
            st.tokens += ch->len;
        }
        BAD(sum != b.n_tokens);
        bool aborted_in_step[64] = {0};
        if (b.n && !draining_phase && chance(0.03)) {
            int32_t c = rint_(b.n);
            bool q;
            CHECK_OK(pd_sched_prefill_abort(s, b.chunks[c].room, &q));
            BAD(q); /* decided at batch_done */
            aborted_in_step[c] = true;
        }
        if (b.n && eager && chance(0.2)) { /* a Transfer comes during the step */
            int32_t c = rint_(b.n), i = pfind(sh, b.chunks[c].room);
            if (i >= 0 && !sh[i].paired) {
                struct pd_prefill_send out;
                CHECK_OK(pd_sched_prefill_bootstrapped(s, sh[i].room, now, &out));
                BAD(out.end != out.begin || out.last); /* batch_done widens the chunk */
                sh[i].paired = true;
            }
        }
        CHECK_OK(pd_sched_prefill_batch_done(s, &b, now));
        for (int32_t c = 0; c < b.n; c++) {
            struct pd_prefill_chunk *ch = &b.chunks[c];
            int32_t i = pfind(sh, ch->room);
            if (i < 0)
                continue;
            struct pshadow *r = &sh[i];
            BAD(ch->dropped != aborted_in_step[c]);
            if (ch->dropped) {
                BAD(ch->quiesce != (r->sent > 0));
                if (ch->quiesce)
                    r->state = S_DRAIN;
                continue;
            }
            r->next_tok = ch->start + ch->len;
            BAD(ch->held == r->paired || ch->send_begin != r->sent);
            BAD(ch->send_end != (!r->paired ? r->sent
                                 : ch->last ? (r->n_tokens + ps - 1) / ps
                                            : r->next_tok / ps));
            r->sent = ch->send_end;
            if (ch->last)
                r->state = S_INFL;
        }
        BAD(pops_prefill(s, sh, &st, ps, now, timeout));

        /* every step: pages, holders, queues */
        int rc3 = pd_sched_prefill_check(s);
        if (rc3 != PD_OK) {
            fprintf(stderr, "step %ld: %s\n", step, pd_error_msg());
            bad++;
            break;
        }
        struct pd_page_stats ps_;
        pd_page_alloc_stats(pa, &ps_);
        BAD(ps_.free + ps_.used + ps_.cached != pool);
        /* nobody waits forever: a bootstrapped request is admitted within a bounded time */
        for (int32_t j = 0; j < P_LIVE; j++)
            BAD(sh[j].state == S_WAIT && now - sh[j].t_boot > 2000);
        if (bad)
            break;
        if (draining_phase) {
            int live = 0;
            for (int32_t j = 0; j < P_LIVE; j++)
                live += sh[j].state != S_NONE;
            if (!live)
                break;
        }
    }
    total_steps += step;
    for (int32_t j = 0; j < P_LIVE; j++)
        BAD(sh[j].state != S_NONE); /* every request ended */
    long ended = 0;
    for (int k = 0; k < 5; k++)
        ended += st.ended[k];
    BAD(ended != st.added);
    fprintf(stderr,
            "prefill ps=%d budget=%d cache=%d: %ld steps, %ld requests (%ld done, %ld aborted, "
            "%ld timeout, %ld failed), %ld full, %ld chunks, %ld tokens computed, %ld cached\n",
            (int)ps, (int)eff_budget, (int)cache, step, st.added, st.ended[PD_END_DONE],
            st.ended[PD_END_ABORTED], st.ended[PD_END_TIMEOUT], st.ended[PD_END_FAILED], st.full,
            st.chunks, st.tokens, st.cached);
    CHECK(st.ended[PD_END_DONE] > 0 && st.ended[PD_END_ABORTED] > 0 &&
          st.ended[PD_END_TIMEOUT] > 0 && st.ended[PD_END_FAILED] > 0);
    CHECK(!cache || st.cached > 0);
    pd_sched_prefill_free(s);
    if (rc)
        pd_radix_cache_flush(rc);
    BAD(pd_page_alloc_n_free(pa) != pool);
    pd_radix_cache_free(rc);
    pd_page_alloc_free(pa);
    return bad;
}

/* ---------------------------------------------------------------- decode */

enum { D_LIVE = 80 };
enum { D_NONE, D_PRE, D_XFER, D_RUN, D_DRAIN, D_GONE /* ended, end not popped yet */ };

struct dshadow {
    uint64_t room;
    int state;
    int32_t prompt, max_new, n_out;
    bool lost; /* its done notice never comes: waiting timeout */
    double t_add;
};

static int32_t dfind(struct dshadow *sh, uint64_t room) {
    for (int32_t i = 0; i < D_LIVE; i++)
        if (sh[i].state != D_NONE && sh[i].room == room)
            return i;
    return -1;
}

static int32_t dpick(struct dshadow *sh, int state) {
    int32_t start = rint_(D_LIVE);
    for (int32_t k = 0; k < D_LIVE; k++) {
        int32_t i = (start + k) % D_LIVE;
        if (sh[i].state == state)
            return i;
    }
    return -1;
}

static int pops_decode(struct pd_sched_decode *s, struct dshadow *sh, long *ended) {
    struct pd_sched_end e;
    int bad = 0;
    while (pd_sched_decode_pop_ended(s, &e) == PD_OK) {
        int32_t i = dfind(sh, e.room);
        if (i < 0) {
            bad++;
            continue;
        }
        struct dshadow *r = &sh[i];
        BAD(e.n_output != r->n_out);
        if (e.reason == PD_END_DONE)
            BAD(r->n_out > r->max_new);
        if (e.reason == PD_END_RETRACTED)
            BAD(r->state != D_RUN);
        ended[e.reason]++;
        r->state = D_NONE;
    }
    return bad;
}

/* cached: a prefix cache, and every request's tokens continue one of 12 conversations, so
 * admissions hold cached pages and pressure evicts (check() recounts each page's holders, the
 * cache's included, every step). */
static int sim_decode(int32_t ps, int32_t pool, int32_t max_running, long steps, uint64_t seed,
                      bool cached) {
    rng_state = seed;
    struct pd_page_alloc *pa;
    struct pd_radix_cache *rc = NULL;
    struct pd_sched_decode *s;
    static int32_t toks[D_LIVE][1024]; /* prompt <= 601, max_new <= 301 */
    long held_pages = 0;
    struct pd_sched_decode_config cfg = {.page_size = ps,
                                         .max_running_requests = max_running,
                                         .max_queued_requests = D_LIVE - 8,
                                         .waiting_timeout_s = 30};
    pd_sched_decode_config_defaults(&cfg);
    cfg.new_token_ratio_decay = 0.01; /* fast decay: more retractions to exercise */
    CHECK_OK(pd_page_alloc_new(pool, &pa));
    if (cached)
        CHECK_OK(pd_radix_cache_new(pa, ps, false, &rc));
    CHECK_OK(pd_sched_decode_new(&cfg, pa, rc, &s));
    static struct dshadow sh[D_LIVE];
    memset(sh, 0, sizeof(sh));
    long added = 0, ended[5] = {0}, tokens = 0, full = 0;
    uint64_t room_ctr = 0;
    int bad = 0;
    double now = 0;
    long step;
    for (step = 0; step < steps + 5000; step++) {
        now += 1;
        bool draining_phase = step >= steps;
        if (!draining_phase && chance(0.3)) {
            int32_t i = dpick(sh, D_NONE);
            if (i >= 0) {
                struct dshadow *r = &sh[i];
                r->room = ++room_ctr * 104729;
                r->prompt = 1 + rint_(chance(0.1) ? 600 : 100);
                r->max_new = 1 + rint_(chance(0.2) ? 300 : 40);
                int32_t conv = rint_(12);
                for (int32_t t = 0; t < r->prompt + r->max_new; t++)
                    toks[i][t] = conv * 100000 + t;
                int rc2 = pd_sched_decode_add(s, r->room, cached ? toks[i] : NULL, r->prompt,
                                              r->max_new, now);
                if (rc2 == PD_OK) {
                    r->state = D_PRE;
                    r->n_out = 1;
                    r->lost = chance(0.02);
                    r->t_add = now;
                    added++;
                } else {
                    BAD(rc2 != PD_EFULL && rc2 != PD_ERANGE);
                    full += rc2 == PD_EFULL;
                }
            }
        }
        for (int k = 0; k < 3; k++) {
            int32_t i = dpick(sh, D_XFER);
            if (i >= 0 && (!sh[i].lost || draining_phase) && chance(0.5)) {
                bool ok = draining_phase || chance(0.95);
                CHECK_OK(pd_sched_decode_transfer_done(s, sh[i].room, ok ? PD_OK : PD_EPEER, now));
                sh[i].state = !ok ? D_DRAIN : sh[i].max_new <= 1 ? D_GONE : D_RUN;
            }
        }
        if (!draining_phase && chance(0.03)) {
            int32_t i = dpick(sh, chance(0.5) ? D_RUN : (chance(0.5) ? D_PRE : D_XFER));
            if (i >= 0) {
                bool q;
                int was = sh[i].state;
                CHECK_OK(pd_sched_decode_abort(s, sh[i].room, &q));
                BAD(q != (was == D_XFER));
                if (q)
                    sh[i].state = D_DRAIN;
            }
        }
        if (chance(0.3)) {
            int32_t i = dpick(sh, D_DRAIN);
            if (i >= 0)
                CHECK_OK(pd_sched_decode_release(s, sh[i].room));
        }
        BAD(pops_decode(s, sh, ended));

        struct pd_decode_step st;
        CHECK_OK(pd_sched_decode_step(s, now, &st));
        BAD(st.n_batch > max_running);
        BAD(st.new_token_ratio < cfg.min_new_token_ratio || st.new_token_ratio > 1);
        for (int32_t k = 0; k < st.n_quiesce; k++) {
            int32_t i = dfind(sh, st.quiesce[k]);
            BAD(i < 0 || sh[i].state != D_XFER);
            if (i >= 0)
                sh[i].state = D_DRAIN;
        }
        BAD(pops_decode(s, sh, ended)); /* retractions */
        for (int32_t k = 0; k < st.n_admitted; k++) {
            int32_t i = dfind(sh, st.admitted[k].room);
            BAD(i < 0 || sh[i].state != D_PRE);
            if (i < 0)
                continue;
            /* FIFO: nobody added earlier is still in prealloc */
            for (int32_t j = 0; j < D_LIVE; j++)
                BAD(sh[j].state == D_PRE && sh[j].room < sh[i].room);
            BAD(st.admitted[k].n_pages != (sh[i].prompt + ps - 1) / ps);
            /* never the last prompt token's page; nothing without a cache */
            BAD(st.admitted[k].held_pages * ps > sh[i].prompt - 1 ||
                (!cached && st.admitted[k].held_pages));
            held_pages += st.admitted[k].held_pages;
            sh[i].state = D_XFER;
        }
        bool stopped[256] = {0};
        int32_t abort_k = -1;
        for (int32_t k = 0; k < st.n_batch; k++) {
            int32_t i = dfind(sh, st.batch[k].room);
            if (i < 0 || sh[i].state != D_RUN) {
                bad++;
                continue;
            }
            BAD(st.batch[k].pos != sh[i].prompt + sh[i].n_out - 1);
            BAD(st.batch[k].n_pages * ps <= st.batch[k].pos);
            stopped[k] = chance(0.02);
        }
        if (st.n_batch && !draining_phase && chance(0.02)) {
            bool q;
            abort_k = rint_(st.n_batch);
            CHECK_OK(pd_sched_decode_abort(s, st.batch[abort_k].room, &q));
        }
        CHECK_OK(pd_sched_decode_batch_done(s, &st, stopped, now));
        for (int32_t k = 0; k < st.n_batch; k++) {
            int32_t i = dfind(sh, st.batch[k].room);
            if (i >= 0 && k != abort_k)
                sh[i].n_out++;
            tokens++;
        }
        BAD(pops_decode(s, sh, ended));
        int rc3 = pd_sched_decode_check(s);
        if (rc3 != PD_OK) {
            fprintf(stderr, "step %ld: %s\n", step, pd_error_msg());
            bad++;
        }
        for (int32_t j = 0; j < D_LIVE; j++) /* lost notices time out: nothing waits forever */
            BAD(sh[j].state == D_XFER && now - sh[j].t_add > 30 + 5000);
        if (bad)
            break;
        if (draining_phase) {
            int live = 0;
            for (int32_t j = 0; j < D_LIVE; j++)
                live += sh[j].state != D_NONE;
            if (!live)
                break;
        }
    }
    total_steps += step;
    for (int32_t j = 0; j < D_LIVE; j++)
        BAD(sh[j].state != D_NONE);
    long n_ended = 0;
    for (int k = 0; k < 5; k++)
        n_ended += ended[k];
    BAD(n_ended != added);
    fprintf(stderr,
            "decode ps=%d pool=%d running<=%d%s: %ld steps, %ld requests (%ld done, %ld aborted, "
            "%ld timeout, %ld failed, %ld retracted), %ld full, %ld tokens, %ld pages held\n",
            (int)ps, (int)pool, (int)max_running, cached ? " cached" : "", step, added,
            ended[PD_END_DONE], ended[PD_END_ABORTED], ended[PD_END_TIMEOUT], ended[PD_END_FAILED],
            ended[PD_END_RETRACTED], full, tokens, held_pages);
    CHECK(cached == (held_pages > 0));
    CHECK(ended[PD_END_DONE] > 0 && ended[PD_END_RETRACTED] > 0 && ended[PD_END_TIMEOUT] > 0 &&
          ended[PD_END_FAILED] > 0 && ended[PD_END_ABORTED] > 0);
    pd_sched_decode_free(s);
    if (rc) {
        BAD(pd_radix_cache_root_lock(rc) != 0);
        pd_radix_cache_free(rc);
    }
    BAD(pd_page_alloc_n_free(pa) != pool);
    pd_page_alloc_free(pa);
    return bad;
}

static void test_sim(void) {
    long n = sim_steps();
    clock_t t0 = clock();
    CHECK_INT(sim_prefill(16, 256, 16384, true, false, n, 1), 0);
    CHECK_INT(sim_prefill(1, 300, 200, false, false, n, 2), 0);
    CHECK_INT(sim_prefill(16, -1, 512, true, false, n / 2, 3), 0);
    CHECK_INT(sim_prefill(16, 256, 16384, true, true, n, 4), 0);
    CHECK_INT(sim_prefill(1, 300, 200, false, true, n, 5), 0);
    CHECK_INT(sim_prefill(16, -1, 512, true, true, n / 2, 6), 0);
    CHECK_INT(sim_decode(16, 96, 32, n, 4, false), 0);
    CHECK_INT(sim_decode(1, 700, 64, n / 2, 5, false), 0);
    CHECK_INT(sim_decode(16, 96, 32, n, 7, true), 0);
    CHECK_INT(sim_decode(1, 700, 64, n / 2, 8, true), 0);
    fprintf(stderr, "simulated %ld steps in %.2f s\n", total_steps,
            (double)(clock() - t0) / CLOCKS_PER_SEC);
}

PD_TEST_MAIN(PD_TEST(test_sim))
