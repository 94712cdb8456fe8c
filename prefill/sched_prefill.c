/*
 * sched_prefill.c — request slots, the three queues, and the chunked-prefill batch builder.
 *
 * A request's states: bootstrap → waiting → prefilling (admitted: holds all its prompt pages;
 * in the running step or the half-done one) → inflight → ended, with draining as the detour of an
 * abort after sends. Eager (cfg.eager), a request is admitted in arrival order whether its
 * decode's Transfer came (waiting) or not (bootstrap): computing overlaps the decode's own
 * admission and the Transfer's way here, which are otherwise on the first token's path. An
 * unpaired request's computed pages are held, not sent (chunk.held); the Transfer's arrival
 * makes them sendable at once (pd_sched_prefill_bootstrapped's out), and a request never paired
 * within the bootstrap timeout ends wherever it is, its pages back. Pages are taken once, at
 * admission, for the whole prompt: the budget check and the memory check then happen in one place,
 * and a chunk never stalls for memory halfway. The admitted request holds one reference on every
 * page of its prompt (cached prefix pages included) and a lock on its prefix-cache node; its end
 * puts both, whatever the ending.
 */
#include "prefill/sched_prefill.h"

#include "common/base/alloc.h"
#include "common/page_alloc.h"
#include "common/radix_cache.h"
#include "common/sched_table.h"
#include "common/base/status.h"

#include <string.h>

enum {
    ST_FREE,
    ST_BOOTSTRAP,
    ST_WAITING,
    ST_PREFILLING,
    ST_INFLIGHT,
    ST_DRAINING,
    ST_ENDED,
};

static const char *const state_names[] = {"free",     "bootstrap", "waiting", "prefilling",
                                          "inflight", "draining",  "ended"};

/* h.pages: the whole prompt's, taken at admission; h.done_tokens is page-aligned until the last
 * chunk. */
struct preq {
    struct pd__sched_req h;
    int32_t sent_pages; /* pages made sendable so far */
    bool paired;        /* its decode's Transfer arrived */
    double t_arrival;   /* add: the bootstrap timeout and the eager admission order */
};

struct pd_sched_prefill {
    struct pd_sched_prefill_config cfg;
    int32_t budget;
    bool unchunked;
    struct pd_page_alloc *pa;
    struct pd_radix_cache *rc;
    struct preq *reqs;               /* [t.cap] t's */
    struct pd__sched_table t;        /* queues: bootstrap, waiting, inflight, draining, ended;
                                        t.aside: the half-done request, -1 */
    struct pd_prefill_chunk *chunks; /* [t.cap] */
    bool outstanding;
};

int pd_sched_prefill_new(const struct pd_sched_prefill_config *cfg, struct pd_page_alloc *pa,
                         struct pd_radix_cache *rc, struct pd_sched_prefill **out) {
    *out = NULL;
    if (cfg->page_size <= 0 || cfg->max_queued_requests <= 0)
        return pd_errorf(PD_EINVAL, "prefill scheduler: page size %d, max queued requests %d",
                         (int)cfg->page_size, (int)cfg->max_queued_requests);
    int32_t budget;
    int err = pd__prefill_budget(cfg->page_size, cfg->chunked_prefill_size, cfg->max_prefill_tokens,
                                 &budget);
    if (err)
        return err;
    struct pd_sched_prefill *s = pd_calloc(1, sizeof(*s));
    if (!s)
        goto fail;
    s->cfg = *cfg;
    s->budget = budget;
    s->unchunked = cfg->chunked_prefill_size <= 0;
    s->pa = pa;
    s->rc = rc;
    int32_t cap = cfg->max_queued_requests;
    s->chunks = pd_calloc((size_t)cap, sizeof(*s->chunks));
    /* prefilling has no FIFO: the running step or the half-done slot */
    uint32_t queued = 1u << ST_BOOTSTRAP | 1u << ST_WAITING | 1u << ST_INFLIGHT |
                      1u << ST_DRAINING | 1u << ST_ENDED;
    if (!s->chunks ||
        pd__sched_table_init(&s->t, cap, queued, ST_ENDED, sizeof(struct preq), pa, rc) != PD_OK)
        goto fail_arrays;
    s->reqs = s->t.reqs;
    *out = s;
    return PD_OK;

fail_arrays:
    pd__sched_table_free(&s->t);
    pd_free(s->chunks);
    pd_free(s);
fail:
    return pd_error_wrap(PD_ENOMEM, "creating the prefill scheduler (%d requests)",
                         (int)cfg->max_queued_requests);
}

void pd_sched_prefill_free(struct pd_sched_prefill *s) {
    if (!s)
        return;
    pd__sched_table_free(&s->t);
    pd_free(s->chunks);
    pd_free(s);
}

int pd_sched_prefill_add(struct pd_sched_prefill *s, uint64_t room, const int32_t *tokens,
                         int32_t n_tokens, double now_s) {
    int rc = pd__sched_table_vacant(&s->t, room);
    if (rc)
        return rc;
    if (n_tokens <= 0 || !tokens)
        return pd_errorf(PD_EINVAL, "room %llu: empty prompt", (unsigned long long)room);
    int32_t n_pages = pd__pages_for(n_tokens, s->cfg.page_size);
    if (n_pages > pd_page_alloc_n_total(s->pa))
        return pd_errorf(PD_ERANGE,
                         "room %llu: prompt of %d tokens needs %d pages, the pool has %d",
                         (unsigned long long)room, (int)n_tokens, (int)n_pages,
                         (int)pd_page_alloc_n_total(s->pa));
    int32_t slot;
    if ((rc = pd__sched_table_add(&s->t, room, n_pages, &slot)) != PD_OK)
        return rc;
    struct preq *r = &s->reqs[slot];
    r->h.tokens = tokens;
    r->h.prompt_len = n_tokens;
    r->h.n_pages = n_pages;
    r->t_arrival = now_s;
    pd__sched_table_move(&s->t, slot, ST_BOOTSTRAP, now_s);
    return PD_OK;
}

int pd_sched_prefill_limit_cache(struct pd_sched_prefill *s, uint64_t room, int32_t max_tokens) {
    return pd__sched_table_limit_cache(&s->t, room, max_tokens);
}

/* pages[0, end) hold computed KV (the last chunk's partial page with it) */
static int32_t computed_pages(const struct pd_sched_prefill *s, const struct preq *r) {
    return r->h.state == ST_INFLIGHT ? r->h.n_pages : r->h.done_tokens / s->cfg.page_size;
}

int pd_sched_prefill_bootstrapped(struct pd_sched_prefill *s, uint64_t room, double now_s,
                                  struct pd_prefill_send *out) {
    *out = (struct pd_prefill_send){0};
    int32_t slot;
    int rc = pd__sched_table_find(&s->t, room, &slot);
    if (rc)
        return rc;
    struct preq *r = &s->reqs[slot];
    bool computing = r->h.state == ST_PREFILLING || r->h.state == ST_INFLIGHT;
    if (r->paired || !(r->h.state == ST_BOOTSTRAP || computing))
        return pd_errorf(PD_EINVAL, "room %llu: bootstrapped while %s%s", (unsigned long long)room,
                         state_names[r->h.state], r->paired ? " (paired already)" : "");
    r->paired = true;
    if (r->h.state == ST_BOOTSTRAP) {
        pd__sched_table_move(&s->t, slot, ST_WAITING, now_s);
        return PD_OK;
    }
    if (r->h.in_batch)
        return PD_OK; /* batch_done sends what the running step leaves computed */
    *out = (struct pd_prefill_send){.begin = r->sent_pages,
                                    .end = computed_pages(s, r),
                                    .last = r->h.state == ST_INFLIGHT,
                                    .pages = r->h.pages,
                                    .cached_tokens = r->h.cached_tokens};
    r->sent_pages = out->end;
    return PD_OK;
}

static void add_chunk(struct pd_sched_prefill *s, struct pd_prefill_batch *b, int32_t slot,
                      int32_t len) {
    struct preq *r = &s->reqs[slot];
    struct pd_prefill_chunk *c = &b->chunks[b->n++];
    int32_t end = r->h.done_tokens + len;
    *c = (struct pd_prefill_chunk){.room = r->h.room,
                                   .start = r->h.done_tokens,
                                   .len = len,
                                   .last = end == r->h.prompt_len,
                                   .send_begin = r->sent_pages,
                                   .send_end = !r->paired               ? r->sent_pages
                                               : end == r->h.prompt_len ? r->h.n_pages
                                                                        : end / s->cfg.page_size,
                                   .pages = r->h.pages,
                                   .n_pages = r->h.n_pages,
                                   .cached_tokens = r->h.cached_tokens,
                                   .slot_ = slot};
    r->h.chunk_end = end;
    r->h.in_batch = true;
    b->n_tokens += len;
}

/* Admits the waiting head if its uncached pages can be taken; false leaves it waiting. */
static bool admit(struct pd_sched_prefill *s, int32_t slot, int32_t rem, bool batch_empty,
                  int32_t *len, bool *stop) {
    struct preq *r = &s->reqs[slot];
    struct pd__prefix_admit a = {.tokens = r->h.tokens,
                                 .n_tokens = r->h.prompt_len,
                                 .n_pages = r->h.n_pages,
                                 .pages = r->h.pages,
                                 .rem = rem,
                                 .batch_empty = batch_empty,
                                 .cache_limited = r->h.cache_max >= 0,
                                 .cache_max = r->h.cache_max};
    bool ok = pd__prefix_admit(s->pa, s->rc, s->cfg.page_size, s->unchunked, &a);
    *len = a.len;
    *stop = a.stop;
    if (!ok)
        return false;
    r->h.admitted = true;
    r->h.node = a.node;
    r->h.cached_tokens = r->h.done_tokens = a.cached_pages * s->cfg.page_size;
    pd__sched_table_move(&s->t, slot, ST_PREFILLING, r->h.t_queue);
    return true;
}

static bool unpaired_expired(const struct pd_sched_prefill *s, int32_t slot, double now_s) {
    const struct preq *r = &s->reqs[slot];
    return !r->paired && now_s - r->t_arrival >= s->cfg.bootstrap_timeout_s;
}

/* Requests whose Transfer never came within the bootstrap timeout end, wherever they are (never
 * in a running step: steps are given back before the next one). */
static void expire_unpaired(struct pd_sched_prefill *s, double now_s) {
    static const uint8_t queues[] = {ST_BOOTSTRAP, ST_INFLIGHT};
    for (size_t k = 0; k < sizeof(queues); k++)
        for (int32_t i = s->t.q[queues[k]].head, nx; i >= 0; i = nx) {
            nx = s->t.slots.next[i];
            if (unpaired_expired(s, i, now_s))
                pd__sched_table_end(&s->t, i, PD_END_TIMEOUT);
        }
    if (s->t.aside >= 0 && unpaired_expired(s, s->t.aside, now_s)) {
        pd__sched_table_end(&s->t, s->t.aside, PD_END_TIMEOUT);
        s->t.aside = -1;
    }
}

/* The next request to admit: waiting's head; eager, bootstrap's head when it came first. */
static int32_t next_to_admit(const struct pd_sched_prefill *s) {
    int32_t w = s->t.q[ST_WAITING].head;
    if (!s->cfg.eager)
        return w;
    int32_t b = s->t.q[ST_BOOTSTRAP].head;
    if (w < 0 || (b >= 0 && s->reqs[b].t_arrival < s->reqs[w].t_arrival))
        return b;
    return w;
}

int pd_sched_prefill_step(struct pd_sched_prefill *s, double now_s, struct pd_prefill_batch *b) {
    if (s->outstanding)
        return pd_errorf(PD_EINVAL, "prefill step while the previous batch is not done");
    b->chunks = s->chunks;
    b->n = 0;
    b->n_tokens = 0;

    expire_unpaired(s, now_s);

    int32_t rem = s->budget;
    bool stop = false;
    if (s->t.aside >= 0) {
        int32_t slot = s->t.aside;
        struct preq *r = &s->reqs[slot];
        int32_t len = pd__chunk_len(s->cfg.page_size, s->unchunked,
                                    r->h.prompt_len - r->h.done_tokens, rem, true, &stop);
        PD_ASSERT(len > 0); /* a whole budget holds at least one page */
        add_chunk(s, b, slot, len);
        rem -= len;
        if (b->chunks[b->n - 1].last)
            s->t.aside = -1;
    }
    int32_t slot;
    while (!stop && rem > 0 && (slot = next_to_admit(s)) >= 0) {
        int32_t len;
        if (!admit(s, slot, rem, b->n == 0, &len, &stop))
            break; /* FIFO: nobody overtakes the head */
        add_chunk(s, b, slot, len);
        rem -= len;
        if (!b->chunks[b->n - 1].last)
            s->t.aside = slot; /* the half-done one: first in the next step */
    }
    s->outstanding = b->n > 0;
    return PD_OK;
}

static void to_draining(struct pd_sched_prefill *s, int32_t slot) {
    pd__sched_table_move(&s->t, slot, ST_DRAINING, s->reqs[slot].h.t_queue);
}

int pd_sched_prefill_batch_done(struct pd_sched_prefill *s, struct pd_prefill_batch *b,
                                double now_s) {
    if (!s->outstanding)
        return b->n == 0 ? PD_OK : pd_errorf(PD_EINVAL, "prefill batch done without a step");
    int32_t ps = s->cfg.page_size;
    for (int32_t i = 0; i < b->n; i++) {
        struct pd_prefill_chunk *c = &b->chunks[i];
        int32_t slot = c->slot_;
        struct preq *r = &s->reqs[slot];
        PD_ASSERT(r->h.in_batch && r->h.state == ST_PREFILLING);
        r->h.in_batch = false;
        if (r->h.pending_end >= 0) {
            int reason = r->h.pending_end;
            r->h.pending_end = -1;
            c->dropped = true;
            c->send_end = c->send_begin;
            /* a failure comes from the engine, which has quiesced already */
            c->quiesce = reason == PD_END_ABORTED && r->sent_pages > 0;
            if (c->quiesce)
                to_draining(s, slot);
            else
                pd__sched_table_end(&s->t, slot, reason);
            continue;
        }
        r->h.done_tokens = r->h.chunk_end;
        if (r->paired) /* as add_chunk had it; or paired during the step: all computed goes */
            c->send_end = c->last ? r->h.n_pages : r->h.done_tokens / ps;
        c->held = !r->paired;
        r->sent_pages = c->send_end;
        pd__prefix_commit(s->rc, r->h.tokens, r->h.done_tokens, ps, r->h.pages, &r->h.node);
        if (c->last)
            pd__sched_table_move(&s->t, slot, ST_INFLIGHT, now_s);
    }
    s->outstanding = false;
    return PD_OK;
}

int pd_sched_prefill_transfer_done(struct pd_sched_prefill *s, uint64_t room, int status,
                                   double now_s) {
    int32_t slot;
    int rc = pd__sched_table_find(&s->t, room, &slot);
    if (rc)
        return rc;
    struct preq *r = &s->reqs[slot];
    if (status == PD_OK) {
        if (r->h.state != ST_INFLIGHT)
            return pd_errorf(PD_EINVAL, "room %llu: transfer done while %s",
                             (unsigned long long)room, state_names[r->h.state]);
        pd__sched_table_end(&s->t, slot, PD_END_DONE);
    } else if (r->h.in_batch) {
        r->h.pending_end = PD_END_FAILED;
    } else {
        pd__sched_table_end(&s->t, slot,
                            r->h.state == ST_DRAINING ? PD_END_ABORTED : PD_END_FAILED);
    }
    (void)now_s;
    return PD_OK;
}

int pd_sched_prefill_abort(struct pd_sched_prefill *s, uint64_t room, bool *quiesce) {
    *quiesce = false;
    int32_t slot;
    int rc = pd__sched_table_find(&s->t, room, &slot);
    if (rc)
        return rc;
    struct preq *r = &s->reqs[slot];
    if (r->h.state == ST_DRAINING)
        return PD_OK;
    if (r->h.in_batch) {
        if (r->h.pending_end < 0)
            r->h.pending_end = PD_END_ABORTED;
        return PD_OK;
    }
    if (r->sent_pages > 0) {
        to_draining(s, slot);
        *quiesce = true;
        return PD_OK;
    }
    pd__sched_table_end(&s->t, slot, PD_END_ABORTED);
    return PD_OK;
}

int pd_sched_prefill_release(struct pd_sched_prefill *s, uint64_t room) {
    int32_t slot;
    int rc = pd__sched_table_find(&s->t, room, &slot);
    if (rc)
        return rc;
    if (s->reqs[slot].h.state != ST_DRAINING)
        return pd_errorf(PD_EINVAL, "room %llu: released while %s", (unsigned long long)room,
                         state_names[s->reqs[slot].h.state]);
    pd__sched_table_end(&s->t, slot, PD_END_ABORTED);
    return PD_OK;
}

int pd_sched_prefill_pop_ended(struct pd_sched_prefill *s, struct pd_sched_end *e) {
    return pd__sched_table_pop_ended(&s->t, e);
}

void pd_sched_prefill_counts(const struct pd_sched_prefill *s, struct pd_prefill_counts *c) {
    /* eager: a request computing or computed without its Transfer counts as bootstrap (it waits
     * for the decode's pages), not as waiting or inflight */
    int32_t unpaired_inflight = 0;
    for (int32_t i = s->t.q[ST_INFLIGHT].head; s->cfg.eager && i >= 0; i = s->t.slots.next[i])
        unpaired_inflight += !s->reqs[i].paired;
    bool aside = s->t.aside >= 0, aside_paired = aside && s->reqs[s->t.aside].paired;
    c->bootstrap = s->t.q[ST_BOOTSTRAP].n + unpaired_inflight + (aside && !aside_paired);
    /* the half-done one waits for its next chunk */
    c->waiting = s->t.q[ST_WAITING].n + aside_paired;
    c->inflight = s->t.q[ST_INFLIGHT].n - unpaired_inflight;
    c->draining = s->t.q[ST_DRAINING].n;
    c->ended_unpopped = s->t.q[ST_ENDED].n;
}

int pd_sched_prefill_check(const struct pd_sched_prefill *s) {
    int32_t *holders;
    int rc = pd__holders_new(s->pa, s->rc, &holders);
    if (rc)
        return rc;
    int32_t per_state[PD__SCHED_N_STATES] = {0};
    if ((rc = pd__sched_table_recount(&s->t, holders, per_state)) != PD_OK)
        goto out;
    for (int32_t i = 0; i < s->t.cap; i++) {
        const struct pd__sched_req *r = &s->reqs[i].h;
        if (r->admitted !=
            (r->state == ST_PREFILLING || r->state == ST_INFLIGHT || r->state == ST_DRAINING)) {
            rc = pd_errorf(PD_EINTERNAL, "room %llu: %s but admitted=%d",
                           (unsigned long long)r->room, state_names[r->state], (int)r->admitted);
            goto out;
        }
    }
    if ((rc = pd__holders_check(s->pa, s->rc, holders)) == PD_OK &&
        !pd__sched_table_agrees(&s->t, per_state))
        rc = pd_errorf(PD_EINTERNAL, "prefill queues disagree with request states");
out:
    pd_free(holders);
    return rc;
}
