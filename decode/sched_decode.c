/*
 * sched_decode.c — request slots, the prealloc/transfer/running queues, admission with the
 * new_token_ratio reservation, page growth and retraction.
 *
 * `remaining` = Σ (max_new_tokens - n_output) over requests in transfer + running is kept
 * incrementally, so the admission check is O(1) per candidate and a step is O(running).
 * Requests hold exactly their page list; every ending puts it back (check() recounts).
 *
 * Prefix reuse (a cache given to pd_sched_decode_new): admission takes the longest cached prefix
 * of the prompt (whole pages, never the last prompt token's page: the prefill samples the first
 * token from it) as the request's first pages, referenced and locked, and reserves the rest; the
 * daemon asks the prefill only for those. A request that finishes done leaves the KV of prompt +
 * output in the cache (SGLang's cache_finished_req), so the next turn of a conversation finds
 * it. Unlocked entries are evicted when an admission or a running request's next page needs
 * room, before anything is retracted.
 */
#include "decode/sched_decode.h"

#include "common/base/alloc.h"
#include "common/page_alloc.h"
#include "common/radix_cache.h"
#include "common/sched_table.h"
#include "common/base/status.h"

#include <math.h>

enum { ST_FREE, ST_PREALLOC, ST_TRANSFER, ST_RUNNING, ST_DRAINING, ST_ENDED };

static const char *const state_names[] = {"free",    "prealloc", "transfer",
                                          "running", "draining", "ended"};

struct pd_sched_decode {
    struct pd_sched_decode_config cfg;
    struct pd_page_alloc *pa;
    struct pd_radix_cache *rc;  /* NULL: no prefix reuse */
    struct pd__sched_req *reqs; /* [t.cap] t's; n_out counts the prefill's token; done_tokens
                                   is the prefix the cache served, cache_max -1 or its limit */
    struct pd__sched_table t;   /* every state but free has its FIFO */
    int64_t remaining;          /* Σ max_new - n_out over transfer + running */
    struct pd__token_ratio ratio;
    bool outstanding;
    struct pd_decode_admit *admitted; /* [max_running] */
    uint64_t *quiesce;                /* [cap] */
    struct pd_decode_entry *batch;    /* [max_running] */
};

void pd_sched_decode_config_defaults(struct pd_sched_decode_config *cfg) {
    pd__ratio_defaults(&cfg->init_new_token_ratio, &cfg->min_new_token_ratio,
                       &cfg->new_token_ratio_decay, &cfg->retract_decode_steps);
}

int pd_sched_decode_new(const struct pd_sched_decode_config *cfg, struct pd_page_alloc *pa,
                        struct pd_radix_cache *rc, struct pd_sched_decode **out) {
    *out = NULL;
    int err = pd__check_decode_config("decode", cfg->page_size, cfg->max_running_requests,
                                      cfg->max_queued_requests, cfg->init_new_token_ratio,
                                      cfg->min_new_token_ratio, cfg->new_token_ratio_decay,
                                      cfg->retract_decode_steps);
    if (err)
        return err;
    struct pd_sched_decode *s = pd_calloc(1, sizeof(*s));
    if (!s)
        goto fail;
    s->cfg = *cfg;
    s->pa = pa;
    s->rc = rc && !pd_radix_cache_disabled(rc) ? rc : NULL;
    s->ratio = pd__token_ratio_make(cfg->init_new_token_ratio, cfg->min_new_token_ratio,
                                    cfg->new_token_ratio_decay, cfg->retract_decode_steps);
    int32_t cap = cfg->max_queued_requests, mr = cfg->max_running_requests;
    s->admitted = pd_calloc((size_t)mr, sizeof(*s->admitted));
    s->quiesce = pd_calloc((size_t)cap, sizeof(uint64_t));
    s->batch = pd_calloc((size_t)mr, sizeof(*s->batch));
    uint32_t queued = 1u << ST_PREALLOC | 1u << ST_TRANSFER | 1u << ST_RUNNING | 1u << ST_DRAINING |
                      1u << ST_ENDED;
    if (!s->admitted || !s->quiesce || !s->batch ||
        pd__sched_table_init(&s->t, cap, queued, ST_ENDED, sizeof(struct pd__sched_req), pa,
                             s->rc) != PD_OK)
        goto fail_arrays;
    s->reqs = s->t.reqs;
    *out = s;
    return PD_OK;

fail_arrays:
    pd__sched_table_free(&s->t);
    pd_free(s->admitted);
    pd_free(s->quiesce);
    pd_free(s->batch);
    pd_free(s);
fail:
    return pd_error_wrap(PD_ENOMEM, "creating the decode scheduler (%d requests)",
                         (int)cfg->max_queued_requests);
}

static bool counts_remaining(int state) {
    return state == ST_TRANSFER || state == ST_RUNNING;
}

/* `remaining` follows the request from its state to state `to`. */
static void count_remaining(struct pd_sched_decode *s, const struct pd__sched_req *r, int to) {
    if (counts_remaining(r->state) && !counts_remaining(to))
        s->remaining -= r->max_new - r->n_out;
    else if (!counts_remaining(r->state) && counts_remaining(to))
        s->remaining += r->max_new - r->n_out;
}

static void move_to(struct pd_sched_decode *s, int32_t slot, int state, double now_s) {
    count_remaining(s, &s->reqs[slot], state);
    pd__sched_table_move(&s->t, slot, state, now_s);
}

/* SGLang's cache_finished_req: a request that finished done leaves the KV of its prompt and
 * output (but the last token, whose KV was never written) in the cache, before its end puts
 * its own references. */
static void cache_finished(struct pd_sched_decode *s, struct pd__sched_req *r) {
    if (!s->rc || !r->tokens || r->no_cache)
        return;
    int32_t n = r->prompt_len + r->n_out - 1;
    PD_ASSERT(r->admitted && n / s->cfg.page_size <= r->n_pages);
    pd__prefix_commit(s->rc, r->tokens, n, s->cfg.page_size, r->pages, &r->node);
}

static void end_req(struct pd_sched_decode *s, int32_t slot, int reason) {
    count_remaining(s, &s->reqs[slot], ST_ENDED);
    if (reason == PD_END_DONE)
        cache_finished(s, &s->reqs[slot]);
    pd__sched_table_end(&s->t, slot, reason);
}

void pd_sched_decode_free(struct pd_sched_decode *s) {
    if (!s)
        return;
    pd__sched_table_free(&s->t);
    pd_free(s->admitted);
    pd_free(s->quiesce);
    pd_free(s->batch);
    pd_free(s);
}

int pd_sched_decode_add(struct pd_sched_decode *s, uint64_t room, const int32_t *tokens,
                        int32_t prompt_len, int32_t max_new_tokens, double now_s) {
    int rc = pd__sched_table_vacant(&s->t, room);
    if (rc)
        return rc;
    int32_t cap_pages, slot;
    if ((rc = pd__generation_pages(s->pa, s->cfg.page_size, room, prompt_len, max_new_tokens,
                                   &cap_pages)) != PD_OK ||
        (rc = pd__sched_table_add(&s->t, room, cap_pages, &slot)) != PD_OK)
        return rc;
    struct pd__sched_req *r = &s->reqs[slot];
    r->tokens = tokens;
    r->prompt_len = prompt_len;
    r->max_new = max_new_tokens;
    r->n_out = 1;
    move_to(s, slot, ST_PREALLOC, now_s);
    return PD_OK;
}

int pd_sched_decode_transfer_done(struct pd_sched_decode *s, uint64_t room, int status,
                                  double now_s) {
    int32_t slot;
    int rc = pd__sched_table_find(&s->t, room, &slot);
    if (rc)
        return rc;
    struct pd__sched_req *r = &s->reqs[slot];
    if (r->state == ST_DRAINING)
        return PD_OK; /* a late notice for a room already given up: release still decides */
    if (r->state != ST_TRANSFER)
        return pd_errorf(PD_EINVAL, "room %llu: transfer done while %s", (unsigned long long)room,
                         state_names[r->state]);
    if (status != PD_OK) {
        r->end_reason = PD_END_FAILED; /* applied at release */
        move_to(s, slot, ST_DRAINING, now_s);
    } else if (r->n_out >= r->max_new) {
        end_req(s, slot, PD_END_DONE); /* the prefill's token was all that was asked */
    } else {
        move_to(s, slot, ST_RUNNING, now_s);
    }
    return PD_OK;
}

int pd_sched_decode_step(struct pd_sched_decode *s, double now_s, struct pd_decode_step *st) {
    if (s->outstanding)
        return pd_errorf(PD_EINVAL, "decode step while the previous batch is not done");
    *st =
        (struct pd_decode_step){.admitted = s->admitted, .quiesce = s->quiesce, .batch = s->batch};
    int32_t ps = s->cfg.page_size;

    for (int32_t i = s->t.q[ST_TRANSFER].head, nx; i >= 0; i = nx) {
        nx = s->t.slots.next[i];
        if (now_s - s->reqs[i].t_queue >= s->cfg.waiting_timeout_s) {
            s->reqs[i].end_reason = PD_END_TIMEOUT;
            s->quiesce[st->n_quiesce++] = s->reqs[i].room;
            move_to(s, i, ST_DRAINING, now_s);
        }
    }

    /* Page growth first: running requests have priority over admissions. */
    bool retracted = false;
    for (int32_t i = s->t.q[ST_RUNNING].head, nx; i >= 0; i = nx) {
        nx = s->t.slots.next[i];
        struct pd__sched_req *r = &s->reqs[i];
        while (pd__cover_position(s->pa, ps, r->prompt_len + r->n_out - 1, r->pages, &r->n_pages,
                                  r->cap_pages) != PD_OK) {
            if (s->rc && pd_radix_cache_evict(s->rc, 1) > 0)
                continue; /* an unlocked cache entry before a retraction */
            int32_t v = pd__sched_table_pick_victim(&s->t, ST_RUNNING);
            PD_ASSERT(v >= 0); /* r itself is running */
            if (v == nx)
                nx = s->t.slots.next[v];
            end_req(s, v, PD_END_RETRACTED);
            st->n_retracted++;
            retracted = true;
            if (v == i)
                break;
        }
    }
    pd__sched_table_ratio_step(&s->t, ST_RUNNING, retracted, &s->ratio);
    st->new_token_ratio = s->ratio.value;

    /* Admission: FIFO, with room for the output the admitted ones may still produce. */
    while (s->t.q[ST_PREALLOC].head >= 0 && !retracted &&
           s->t.q[ST_TRANSFER].n + s->t.q[ST_RUNNING].n < s->cfg.max_running_requests) {
        int32_t slot = s->t.q[ST_PREALLOC].head;
        struct pd__sched_req *r = &s->reqs[slot];
        int32_t reserve =
            (int32_t)ceil(s->ratio.value * (double)(s->remaining + r->max_new - r->n_out) / ps);
        /* the whole prompt at once (no budget, no chunk): only the cache hit and the pages */
        struct pd__prefix_admit a = {.tokens = r->tokens,
                                     .n_tokens = r->prompt_len,
                                     .n_pages = pd__pages_for(r->prompt_len, ps),
                                     .pages = r->pages,
                                     .rem = r->prompt_len,
                                     .batch_empty = true,
                                     .reserve = reserve,
                                     .cache_limited = !r->tokens || r->cache_max >= 0,
                                     .cache_max = r->tokens ? r->cache_max : 0};
        if (!pd__prefix_admit(s->pa, s->rc, ps, true, &a))
            break;
        r->n_pages = a.n_pages;
        r->node = a.node;
        r->done_tokens = r->cached_tokens = a.cached_pages * ps;
        r->admitted = true;
        move_to(s, slot, ST_TRANSFER, now_s);
        s->admitted[st->n_admitted++] = (struct pd_decode_admit){
            .room = r->room, .pages = r->pages, .n_pages = a.n_pages, .held_pages = a.cached_pages};
    }

    for (int32_t i = s->t.q[ST_RUNNING].head; i >= 0; i = s->t.slots.next[i]) {
        struct pd__sched_req *r = &s->reqs[i];
        r->in_batch = true;
        s->batch[st->n_batch++] = (struct pd_decode_entry){.room = r->room,
                                                           .pos = r->prompt_len + r->n_out - 1,
                                                           .pages = r->pages,
                                                           .n_pages = r->n_pages,
                                                           .slot_ = i};
    }
    s->outstanding = st->n_batch > 0;
    return PD_OK;
}

int pd_sched_decode_batch_done(struct pd_sched_decode *s, const struct pd_decode_step *st,
                               const bool *stopped, double now_s) {
    if (!s->outstanding)
        return st->n_batch == 0 ? PD_OK : pd_errorf(PD_EINVAL, "decode batch done without a step");
    for (int32_t i = 0; i < st->n_batch; i++) {
        int32_t slot = st->batch[i].slot_;
        struct pd__sched_req *r = &s->reqs[slot];
        PD_ASSERT(r->in_batch && r->state == ST_RUNNING);
        r->in_batch = false;
        if (r->pending_end >= 0) {
            end_req(s, slot, r->pending_end);
            continue;
        }
        r->n_out++;
        s->remaining--;
        if ((stopped && stopped[i]) || r->n_out >= r->max_new)
            end_req(s, slot, PD_END_DONE);
    }
    (void)now_s;
    s->outstanding = false;
    return PD_OK;
}

int pd_sched_decode_abort(struct pd_sched_decode *s, uint64_t room, bool *quiesce) {
    *quiesce = false;
    int32_t slot;
    int rc = pd__sched_table_find(&s->t, room, &slot);
    if (rc)
        return rc;
    struct pd__sched_req *r = &s->reqs[slot];
    if (r->state == ST_DRAINING)
        return PD_OK;
    if (r->in_batch) {
        r->pending_end = PD_END_ABORTED;
        return PD_OK;
    }
    if (r->state == ST_TRANSFER) {
        r->end_reason = PD_END_ABORTED;
        move_to(s, slot, ST_DRAINING, r->t_queue);
        *quiesce = true;
        return PD_OK;
    }
    end_req(s, slot, PD_END_ABORTED);
    return PD_OK;
}

int pd_sched_decode_limit_cache(struct pd_sched_decode *s, uint64_t room, int32_t max_tokens) {
    return pd__sched_table_limit_cache(&s->t, room, max_tokens);
}

int pd_sched_decode_pin(struct pd_sched_decode *s, uint64_t room) {
    int32_t slot;
    int rc = pd__sched_table_find(&s->t, room, &slot);
    if (rc == PD_OK)
        s->reqs[slot].pinned = true;
    return rc;
}

int pd_sched_decode_forget(struct pd_sched_decode *s, uint64_t room) {
    int32_t slot;
    int rc = pd__sched_table_find(&s->t, room, &slot);
    if (rc == PD_OK)
        s->reqs[slot].no_cache = true;
    return rc;
}

bool pd_sched_decode_given_up(const struct pd_sched_decode *s, uint64_t room) {
    int32_t slot;
    return pd__sched_table_find(&s->t, room, &slot) == PD_OK && s->reqs[slot].state == ST_DRAINING;
}

int pd_sched_decode_release(struct pd_sched_decode *s, uint64_t room) {
    int32_t slot;
    int rc = pd__sched_table_find(&s->t, room, &slot);
    if (rc)
        return rc;
    if (s->reqs[slot].state != ST_DRAINING)
        return pd_errorf(PD_EINVAL, "room %llu: released while %s", (unsigned long long)room,
                         state_names[s->reqs[slot].state]);
    end_req(s, slot, s->reqs[slot].end_reason);
    return PD_OK;
}

int pd_sched_decode_pop_ended(struct pd_sched_decode *s, struct pd_sched_end *e) {
    return pd__sched_table_pop_ended(&s->t, e);
}

void pd_sched_decode_counts(const struct pd_sched_decode *s, struct pd_decode_counts *c) {
    c->prealloc = s->t.q[ST_PREALLOC].n;
    c->transfer = s->t.q[ST_TRANSFER].n;
    c->running = s->t.q[ST_RUNNING].n;
    c->draining = s->t.q[ST_DRAINING].n;
    c->ended_unpopped = s->t.q[ST_ENDED].n;
}

int pd_sched_decode_check(const struct pd_sched_decode *s) {
    int32_t *holders;
    int rc = pd__holders_new(s->pa, s->rc, &holders);
    if (rc)
        return rc;
    int32_t per_state[PD__SCHED_N_STATES] = {0};
    int64_t remaining = 0;
    if ((rc = pd__sched_table_recount(&s->t, holders, per_state)) != PD_OK)
        goto out;
    for (int32_t i = 0; i < s->t.cap; i++) {
        const struct pd__sched_req *r = &s->reqs[i];
        if (counts_remaining(r->state))
            remaining += r->max_new - r->n_out;
        if (r->admitted != (counts_remaining(r->state) || r->state == ST_DRAINING) ||
            (r->state == ST_RUNNING && r->n_pages * s->cfg.page_size < r->prompt_len)) {
            rc = pd_errorf(PD_EINTERNAL, "room %llu (%s): pages disagree with its state",
                           (unsigned long long)r->room, state_names[r->state]);
            goto out;
        }
    }
    if ((rc = pd__holders_check(s->pa, s->rc, holders)) == PD_OK &&
        (!pd__sched_table_agrees(&s->t, per_state) || remaining != s->remaining ||
         s->t.q[ST_TRANSFER].n + s->t.q[ST_RUNNING].n > s->cfg.max_running_requests))
        rc = pd_errorf(PD_EINTERNAL, "decode queues disagree with request states");
out:
    pd_free(holders);
    return rc;
}
