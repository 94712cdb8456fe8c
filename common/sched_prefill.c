/*
 * sched_prefill.c — request slots, the three queues, and the chunked-prefill batch builder.
 *
 * A request's states: bootstrap → waiting → prefilling (admitted: holds all its prompt pages;
 * in the running step or the half-done one) → inflight → ended, with draining as the detour of an
 * abort after sends. Pages are taken once, at admission, for the whole prompt: the budget check
 * and the memory check then happen in one place, and a chunk never stalls for memory halfway.
 * The admitted request holds one reference on every page of its prompt (cached prefix pages
 * included) and a lock on its prefix-cache node; its end puts both, whatever the ending.
 */
#include "common/sched_prefill.h"

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

struct preq {
    uint64_t room;
    const int32_t *tokens; /* [n_tokens] borrowed */
    int32_t n_tokens;
    int32_t n_pages;
    int32_t *pages; /* [n_pages] all held once admitted */
    bool admitted;
    bool in_batch;
    uint8_t state;
    int8_t pending_end; /* end reason to apply at batch_done, -1 none */
    int8_t end_reason;
    int32_t cache_max; /* prefix-cache hit limit in tokens; -1 none (input logprobs) */
    int32_t cached_tokens;
    int32_t done_tokens; /* computed or cached, always page-aligned until the last chunk */
    int32_t chunk_end;   /* done_tokens after the running step */
    int32_t sent_pages;  /* pages made sendable so far */
    struct pd_radix_node *node;
    double t_queue; /* when it entered its current queue */
};

struct pd_sched_prefill {
    struct pd_sched_prefill_config cfg;
    int32_t budget;
    bool unchunked;
    struct pd_page_alloc *pa;
    struct pd_radix_cache *rc;
    struct preq *reqs;               /* [t.cap] */
    struct pd__sched_table t;        /* queues: bootstrap, waiting, inflight, draining, ended */
    int32_t chunked;                 /* slot of the half-done request, -1 */
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
    s->chunked = -1;
    int32_t cap = cfg->max_queued_requests;
    s->reqs = pd_calloc((size_t)cap, sizeof(*s->reqs));
    s->chunks = pd_calloc((size_t)cap, sizeof(*s->chunks));
    /* prefilling has no FIFO: the running step or the half-done slot */
    uint32_t queued = 1u << ST_BOOTSTRAP | 1u << ST_WAITING | 1u << ST_INFLIGHT |
                      1u << ST_DRAINING | 1u << ST_ENDED;
    if (!s->reqs || !s->chunks || pd__sched_table_init(&s->t, cap, queued, ST_ENDED) != PD_OK)
        goto fail_arrays;
    *out = s;
    return PD_OK;

fail_arrays:
    pd_free(s->reqs);
    pd__sched_table_free(&s->t);
    pd_free(s->chunks);
    pd_free(s);
fail:
    return pd_error_wrap(PD_ENOMEM, "creating the prefill scheduler (%d requests)",
                         (int)cfg->max_queued_requests);
}

static void move_to(struct pd_sched_prefill *s, int32_t slot, int state, double now_s) {
    struct preq *r = &s->reqs[slot];
    if (s->chunked == slot)
        s->chunked = -1;
    r->t_queue = now_s;
    pd__sched_table_move(&s->t, slot, &r->state, state);
}

/* The one way a request ends: pages and cache lock go back, the room is free for reuse. */
static void end_req(struct pd_sched_prefill *s, int32_t slot, int reason) {
    struct preq *r = &s->reqs[slot];
    PD_ASSERT(!r->in_batch && r->state != ST_ENDED && r->state != ST_FREE);
    if (r->admitted)
        pd_page_alloc_put(s->pa, r->pages, r->n_pages);
    r->admitted = false;
    if (s->rc)
        pd_radix_cache_unlock(s->rc, r->node);
    r->node = NULL;
    pd_room_map_del(&s->t.rooms, r->room);
    r->end_reason = (int8_t)reason;
    move_to(s, slot, ST_ENDED, r->t_queue);
}

void pd_sched_prefill_free(struct pd_sched_prefill *s) {
    if (!s)
        return;
    for (int32_t i = 0; i < s->t.cap; i++) {
        struct preq *r = &s->reqs[i];
        r->in_batch = false;
        if (r->state != ST_FREE && r->state != ST_ENDED)
            end_req(s, i, PD_END_ABORTED);
        if (r->state == ST_ENDED)
            pd_free(r->pages);
    }
    pd__sched_table_free(&s->t);
    pd_free(s->reqs);
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
    int32_t *pages, slot;
    if ((rc = pd__sched_table_add(&s->t, room, n_pages, &pages, &slot)) != PD_OK)
        return rc;
    struct preq *r = &s->reqs[slot];
    *r = (struct preq){.room = room,
                       .cache_max = -1,
                       .tokens = tokens,
                       .n_tokens = n_tokens,
                       .n_pages = n_pages,
                       .pages = pages,
                       .state = ST_FREE,
                       .pending_end = -1};
    move_to(s, slot, ST_BOOTSTRAP, now_s);
    return PD_OK;
}

static int find(struct pd_sched_prefill *s, uint64_t room, int32_t *slot) {
    return pd__sched_table_find(&s->t, room, slot);
}

int pd_sched_prefill_limit_cache(struct pd_sched_prefill *s, uint64_t room, int32_t max_tokens) {
    int32_t slot;
    int rc = find(s, room, &slot);
    if (rc)
        return rc;
    s->reqs[slot].cache_max = max_tokens < 0 ? 0 : max_tokens;
    return PD_OK;
}

int pd_sched_prefill_bootstrapped(struct pd_sched_prefill *s, uint64_t room, double now_s) {
    int32_t slot;
    int rc = find(s, room, &slot);
    if (rc)
        return rc;
    if (s->reqs[slot].state != ST_BOOTSTRAP)
        return pd_errorf(PD_EINVAL, "room %llu: bootstrapped while %s", (unsigned long long)room,
                         state_names[s->reqs[slot].state]);
    move_to(s, slot, ST_WAITING, now_s);
    return PD_OK;
}

static void add_chunk(struct pd_sched_prefill *s, struct pd_prefill_batch *b, int32_t slot,
                      int32_t len) {
    struct preq *r = &s->reqs[slot];
    struct pd_prefill_chunk *c = &b->chunks[b->n++];
    int32_t end = r->done_tokens + len;
    *c = (struct pd_prefill_chunk){.room = r->room,
                                   .start = r->done_tokens,
                                   .len = len,
                                   .last = end == r->n_tokens,
                                   .send_begin = r->sent_pages,
                                   .send_end =
                                       end == r->n_tokens ? r->n_pages : end / s->cfg.page_size,
                                   .pages = r->pages,
                                   .n_pages = r->n_pages,
                                   .cached_tokens = r->cached_tokens,
                                   .slot_ = slot};
    r->chunk_end = end;
    r->in_batch = true;
    b->n_tokens += len;
}

/* Admits the waiting head if its uncached pages can be taken; false leaves it waiting. */
static bool admit(struct pd_sched_prefill *s, int32_t slot, int32_t rem, bool batch_empty,
                  int32_t *len, bool *stop) {
    struct preq *r = &s->reqs[slot];
    struct pd__prefix_admit a = {.tokens = r->tokens,
                                 .n_tokens = r->n_tokens,
                                 .n_pages = r->n_pages,
                                 .pages = r->pages,
                                 .rem = rem,
                                 .batch_empty = batch_empty,
                                 .cache_limited = r->cache_max >= 0,
                                 .cache_max = r->cache_max};
    bool ok = pd__prefix_admit(s->pa, s->rc, s->cfg.page_size, s->unchunked, &a);
    *len = a.len;
    *stop = a.stop;
    if (!ok)
        return false;
    r->admitted = true;
    r->node = a.node;
    r->cached_tokens = r->done_tokens = a.cached_pages * s->cfg.page_size;
    move_to(s, slot, ST_PREFILLING, r->t_queue);
    return true;
}

int pd_sched_prefill_step(struct pd_sched_prefill *s, double now_s, struct pd_prefill_batch *b) {
    if (s->outstanding)
        return pd_errorf(PD_EINVAL, "prefill step while the previous batch is not done");
    b->chunks = s->chunks;
    b->n = 0;
    b->n_tokens = 0;

    for (int32_t i = s->t.q[ST_BOOTSTRAP].head, nx; i >= 0; i = nx) {
        nx = s->t.slots.next[i];
        if (now_s - s->reqs[i].t_queue >= s->cfg.bootstrap_timeout_s)
            end_req(s, i, PD_END_TIMEOUT);
    }

    int32_t rem = s->budget;
    bool stop = false;
    if (s->chunked >= 0) {
        int32_t slot = s->chunked;
        struct preq *r = &s->reqs[slot];
        int32_t len = pd__chunk_len(s->cfg.page_size, s->unchunked, r->n_tokens - r->done_tokens,
                                    rem, true, &stop);
        PD_ASSERT(len > 0); /* a whole budget holds at least one page */
        add_chunk(s, b, slot, len);
        rem -= len;
        if (b->chunks[b->n - 1].last)
            s->chunked = -1;
    }
    while (!stop && rem > 0 && s->t.q[ST_WAITING].head >= 0) {
        int32_t slot = s->t.q[ST_WAITING].head, len;
        if (!admit(s, slot, rem, b->n == 0, &len, &stop))
            break; /* FIFO: nobody overtakes the head */
        add_chunk(s, b, slot, len);
        rem -= len;
        if (!b->chunks[b->n - 1].last)
            s->chunked = slot; /* the half-done one: first in the next step */
    }
    s->outstanding = b->n > 0;
    return PD_OK;
}

static void to_draining(struct pd_sched_prefill *s, int32_t slot) {
    move_to(s, slot, ST_DRAINING, s->reqs[slot].t_queue);
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
        PD_ASSERT(r->in_batch && r->state == ST_PREFILLING);
        r->in_batch = false;
        if (r->pending_end >= 0) {
            int reason = r->pending_end;
            r->pending_end = -1;
            c->dropped = true;
            c->send_end = c->send_begin;
            /* a failure comes from the engine, which has quiesced already */
            c->quiesce = reason == PD_END_ABORTED && r->sent_pages > 0;
            if (c->quiesce)
                to_draining(s, slot);
            else
                end_req(s, slot, reason);
            continue;
        }
        r->done_tokens = r->chunk_end;
        r->sent_pages = c->send_end;
        pd__prefix_commit(s->rc, r->tokens, r->done_tokens, ps, r->pages, &r->node);
        if (c->last)
            move_to(s, slot, ST_INFLIGHT, now_s);
    }
    s->outstanding = false;
    return PD_OK;
}

int pd_sched_prefill_transfer_done(struct pd_sched_prefill *s, uint64_t room, int status,
                                   double now_s) {
    int32_t slot;
    int rc = find(s, room, &slot);
    if (rc)
        return rc;
    struct preq *r = &s->reqs[slot];
    if (status == PD_OK) {
        if (r->state != ST_INFLIGHT)
            return pd_errorf(PD_EINVAL, "room %llu: transfer done while %s",
                             (unsigned long long)room, state_names[r->state]);
        end_req(s, slot, PD_END_DONE);
    } else if (r->in_batch) {
        r->pending_end = PD_END_FAILED;
    } else {
        end_req(s, slot, r->state == ST_DRAINING ? PD_END_ABORTED : PD_END_FAILED);
    }
    (void)now_s;
    return PD_OK;
}

int pd_sched_prefill_abort(struct pd_sched_prefill *s, uint64_t room, bool *quiesce) {
    *quiesce = false;
    int32_t slot;
    int rc = find(s, room, &slot);
    if (rc)
        return rc;
    struct preq *r = &s->reqs[slot];
    if (r->state == ST_DRAINING)
        return PD_OK;
    if (r->in_batch) {
        if (r->pending_end < 0)
            r->pending_end = PD_END_ABORTED;
        return PD_OK;
    }
    if (r->sent_pages > 0) {
        to_draining(s, slot);
        *quiesce = true;
        return PD_OK;
    }
    end_req(s, slot, PD_END_ABORTED);
    return PD_OK;
}

int pd_sched_prefill_release(struct pd_sched_prefill *s, uint64_t room) {
    int32_t slot;
    int rc = find(s, room, &slot);
    if (rc)
        return rc;
    if (s->reqs[slot].state != ST_DRAINING)
        return pd_errorf(PD_EINVAL, "room %llu: released while %s", (unsigned long long)room,
                         state_names[s->reqs[slot].state]);
    end_req(s, slot, PD_END_ABORTED);
    return PD_OK;
}

int pd_sched_prefill_pop_ended(struct pd_sched_prefill *s, struct pd_sched_end *e) {
    int32_t slot = pd__sched_table_oldest_ended(&s->t);
    if (slot < 0)
        return PD_EAGAIN;
    struct preq *r = &s->reqs[slot];
    *e = (struct pd_sched_end){
        .room = r->room, .reason = r->end_reason, .cached_tokens = r->cached_tokens};
    pd_free(r->pages);
    *r = (struct preq){.state = ST_FREE};
    pd__sched_table_recycle(&s->t, slot);
    return PD_OK;
}

void pd_sched_prefill_counts(const struct pd_sched_prefill *s, struct pd_prefill_counts *c) {
    c->bootstrap = s->t.q[ST_BOOTSTRAP].n;
    /* the half-done one waits for its next chunk */
    c->waiting = s->t.q[ST_WAITING].n + (s->chunked >= 0);
    c->inflight = s->t.q[ST_INFLIGHT].n;
    c->draining = s->t.q[ST_DRAINING].n;
    c->ended_unpopped = s->t.q[ST_ENDED].n;
}

int pd_sched_prefill_check(const struct pd_sched_prefill *s) {
    int32_t *holders;
    int rc = pd__holders_new(s->pa, s->rc, &holders);
    if (rc)
        return rc;
    int32_t per_state[PD__SCHED_N_STATES] = {0};
    for (int32_t i = 0; i < s->t.cap; i++) {
        const struct preq *r = &s->reqs[i];
        per_state[r->state]++;
        if (r->state != ST_FREE && r->state != ST_ENDED &&
            pd_room_map_get(&s->t.rooms, r->room) != i) {
            rc = pd_errorf(PD_EINTERNAL, "room %llu: not mapped to its slot",
                           (unsigned long long)r->room);
            goto out;
        }
        if (r->admitted !=
            (r->state == ST_PREFILLING || r->state == ST_INFLIGHT || r->state == ST_DRAINING)) {
            rc = pd_errorf(PD_EINTERNAL, "room %llu: %s but admitted=%d",
                           (unsigned long long)r->room, state_names[r->state], (int)r->admitted);
            goto out;
        }
        if (r->admitted)
            pd__holders_add(holders, r->pages, r->n_pages);
    }
    if ((rc = pd__holders_check(s->pa, s->rc, holders)) == PD_OK &&
        !pd__sched_table_agrees(&s->t, per_state))
        rc = pd_errorf(PD_EINTERNAL, "prefill queues disagree with request states");
out:
    pd_free(holders);
    return rc;
}
