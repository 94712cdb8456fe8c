/*
 * sched_coloc.c — request slots, the waiting/running queues, the chunked-prefill admission shared
 * with the prefill scheduler (sched_common.c), the mixed step, page growth and retraction.
 *
 * A request's states: waiting → prefilling (admitted: holds the pages of every token it
 * prefills, cached prefix included, and a lock on its prefix-cache node; in the outstanding step
 * or the half-done one) → running (its pages grow a page at a time) → ended, with a retraction
 * taking a running request back to waiting with nothing held. An admission prefills fill_len =
 * prompt + outputs so far tokens (the prompt alone the first time). The end, whatever its reason,
 * puts the pages and the lock (end_req); check() recounts every page's holders. A finished
 * request's whole pages of prompt + output enter the prefix cache first (SGLang's
 * cache_finished_req), so the next turn of a conversation finds them.
 */
#include "common/sched_coloc.h"

#include "common/base/alloc.h"
#include "common/page_alloc.h"
#include "common/radix_cache.h"
#include "common/sched_table.h"
#include "common/base/status.h"

#include <math.h>

enum { ST_FREE, ST_WAITING, ST_PREFILLING, ST_RUNNING, ST_ENDED };

static const char *const state_names[] = {"free", "waiting", "prefilling", "running", "ended"};

struct creq {
    uint64_t room;
    const int32_t *tokens; /* borrowed: prompt, then the outputs the caller writes */
    int32_t prompt_len;
    int32_t max_new;
    int32_t n_out;       /* output tokens so far */
    int32_t fill_len;    /* tokens this admission prefills */
    int32_t done_tokens; /* of fill_len, in the pages (cached or computed) */
    int32_t chunk_end;   /* done_tokens after the outstanding step */
    int32_t *pages;      /* [cap_pages] */
    int32_t n_pages, cap_pages;
    int32_t cached_tokens; /* the first admission's cache hit (what usage reports) */
    int32_t adm_cached;    /* this admission's */
    struct pd_radix_node *node;
    bool admitted, in_batch;
    uint8_t state;
    int8_t pending_end; /* end reason to apply at step_done, -1 none */
    int8_t end_reason;
    int32_t cache_max; /* prefix-cache hit limit in tokens; -1 none (input logprobs) */
    double t_queue;
};

struct pd_sched_coloc {
    struct pd_sched_coloc_config cfg;
    int32_t budget;
    bool unchunked;
    struct pd_page_alloc *pa;
    struct pd_radix_cache *rc;
    struct creq *reqs;        /* [t.cap] */
    struct pd__sched_table t; /* queues: waiting, running, ended */
    int32_t chunked;          /* slot of the half-done request, -1 */
    double ratio;
    int64_t retracted;
    bool outstanding;
    struct pd_coloc_chunk *chunks;   /* [max_running] */
    struct pd_coloc_decode *decodes; /* [max_running] */
};

void pd_sched_coloc_config_defaults(struct pd_sched_coloc_config *cfg) {
    cfg->mixed_chunk = true;
    pd__ratio_defaults(&cfg->init_new_token_ratio, &cfg->min_new_token_ratio,
                       &cfg->new_token_ratio_decay, &cfg->retract_decode_steps);
}

int pd_sched_coloc_new(const struct pd_sched_coloc_config *cfg, struct pd_page_alloc *pa,
                       struct pd_radix_cache *rc, struct pd_sched_coloc **out) {
    *out = NULL;
    int32_t budget;
    int err = pd__check_decode_config("colocated", cfg->page_size, cfg->max_running_requests,
                                      cfg->max_queued_requests, cfg->init_new_token_ratio,
                                      cfg->min_new_token_ratio, cfg->new_token_ratio_decay,
                                      cfg->retract_decode_steps);
    if (err == PD_OK)
        err = pd__prefill_budget(cfg->page_size, cfg->chunked_prefill_size, cfg->max_prefill_tokens,
                                 &budget);
    if (err)
        return err;
    struct pd_sched_coloc *s = pd_calloc(1, sizeof(*s));
    if (!s)
        goto fail;
    s->cfg = *cfg;
    s->budget = budget;
    s->unchunked = cfg->chunked_prefill_size <= 0;
    s->pa = pa;
    s->rc = rc;
    s->chunked = -1;
    s->ratio = cfg->init_new_token_ratio;
    int32_t cap = cfg->max_queued_requests, mr = cfg->max_running_requests;
    s->reqs = pd_calloc((size_t)cap, sizeof(*s->reqs));
    s->chunks = pd_calloc((size_t)mr, sizeof(*s->chunks));
    s->decodes = pd_calloc((size_t)mr, sizeof(*s->decodes));
    /* prefilling has no FIFO: the outstanding step or the half-done slot */
    uint32_t queued = 1u << ST_WAITING | 1u << ST_RUNNING | 1u << ST_ENDED;
    if (!s->reqs || !s->chunks || !s->decodes ||
        pd__sched_table_init(&s->t, cap, queued, ST_ENDED) != PD_OK)
        goto fail_arrays;
    *out = s;
    return PD_OK;

fail_arrays:
    pd_free(s->reqs);
    pd__sched_table_free(&s->t);
    pd_free(s->chunks);
    pd_free(s->decodes);
    pd_free(s);
fail:
    return pd_error_wrap(PD_ENOMEM, "creating the colocated scheduler (%d requests)",
                         (int)cfg->max_queued_requests);
}

static void move_to(struct pd_sched_coloc *s, int32_t slot, int state, double now_s) {
    struct creq *r = &s->reqs[slot];
    if (s->chunked == slot)
        s->chunked = -1;
    r->t_queue = now_s;
    pd__sched_table_move(&s->t, slot, &r->state, state);
}

/* Pages and cache lock back: what every ending and every retraction does. */
static void drop_pages(struct pd_sched_coloc *s, struct creq *r) {
    if (r->admitted)
        pd_page_alloc_put(s->pa, r->pages, r->n_pages);
    if (s->rc)
        pd_radix_cache_unlock(s->rc, r->node);
    r->node = NULL;
    r->admitted = false;
    r->n_pages = 0;
    r->done_tokens = 0;
}

/* The one way a request ends. */
static void end_req(struct pd_sched_coloc *s, int32_t slot, int reason) {
    struct creq *r = &s->reqs[slot];
    PD_ASSERT(!r->in_batch && r->state != ST_ENDED && r->state != ST_FREE);
    drop_pages(s, r);
    pd_room_map_del(&s->t.rooms, r->room);
    r->end_reason = (int8_t)reason;
    move_to(s, slot, ST_ENDED, r->t_queue);
}

void pd_sched_coloc_free(struct pd_sched_coloc *s) {
    if (!s)
        return;
    for (int32_t i = 0; i < s->t.cap; i++) {
        struct creq *r = &s->reqs[i];
        r->in_batch = false;
        if (r->state != ST_FREE && r->state != ST_ENDED)
            end_req(s, i, PD_END_ABORTED);
        if (r->state == ST_ENDED)
            pd_free(r->pages);
    }
    pd__sched_table_free(&s->t);
    pd_free(s->reqs);
    pd_free(s->chunks);
    pd_free(s->decodes);
    pd_free(s);
}

int pd_sched_coloc_add(struct pd_sched_coloc *s, uint64_t room, const int32_t *tokens,
                       int32_t prompt_len, int32_t max_new_tokens, double now_s) {
    int rc = pd__sched_table_vacant(&s->t, room);
    if (rc)
        return rc;
    if (!tokens)
        return pd_errorf(PD_EINVAL, "room %llu: no tokens", (unsigned long long)room);
    int32_t cap_pages, *pages, slot;
    if ((rc = pd__generation_pages(s->pa, s->cfg.page_size, room, prompt_len, max_new_tokens,
                                   &cap_pages)) != PD_OK ||
        (rc = pd__sched_table_add(&s->t, room, cap_pages, &pages, &slot)) != PD_OK)
        return rc;
    s->reqs[slot] = (struct creq){.room = room,
                                  .cache_max = -1,
                                  .tokens = tokens,
                                  .prompt_len = prompt_len,
                                  .max_new = max_new_tokens,
                                  .fill_len = prompt_len,
                                  .pages = pages,
                                  .cap_pages = cap_pages,
                                  .state = ST_FREE,
                                  .pending_end = -1};
    move_to(s, slot, ST_WAITING, now_s);
    return PD_OK;
}

/* The running request that loses least (pd__retract_first). */
static int32_t pick_victim(const struct pd_sched_coloc *s) {
    int32_t best = -1;
    for (int32_t i = s->t.q[ST_RUNNING].head; i >= 0; i = s->t.slots.next[i]) {
        const struct creq *r = &s->reqs[i], *b = &s->reqs[best >= 0 ? best : i];
        if (best < 0 || pd__retract_first(r->n_out, r->prompt_len, b->n_out, b->prompt_len))
            best = i;
    }
    return best;
}

/* Back to the head of waiting with nothing held; it is prefilled again over prompt + outputs
 * (the older request goes first, so a retraction does not lose its place). */
static void retract(struct pd_sched_coloc *s, int32_t slot) {
    struct creq *r = &s->reqs[slot];
    PD_ASSERT(r->state == ST_RUNNING && !r->in_batch);
    drop_pages(s, r);
    r->fill_len = r->prompt_len + r->n_out;
    pd__slot_list_remove(&s->t.q[ST_RUNNING], &s->t.slots, slot);
    r->state = ST_WAITING;
    pd__slot_list_push_front(&s->t.q[ST_WAITING], &s->t.slots, slot);
    s->retracted++;
}

/* SGLang's new_token_ratio: decays every step, jumps back up after a retraction. */
static void update_ratio(struct pd_sched_coloc *s, bool retracted) {
    if (!retracted) {
        s->ratio =
            pd__ratio_decay(s->ratio, s->cfg.min_new_token_ratio, s->cfg.new_token_ratio_decay);
        return;
    }
    int64_t decoded = 0, max_new = 0;
    for (int32_t i = s->t.q[ST_RUNNING].head; i >= 0; i = s->t.slots.next[i]) {
        decoded += s->reqs[i].n_out;
        max_new += s->reqs[i].max_new;
    }
    s->ratio =
        pd__ratio_after_retract(decoded, max_new, s->t.q[ST_RUNNING].n, s->cfg.retract_decode_steps,
                                s->cfg.init_new_token_ratio, s->cfg.min_new_token_ratio);
}

/* Every running request gets the page its next position needs: from the free pool, else from
 * the prefix cache, else from retracting the request that loses least. */
static int32_t grow_running(struct pd_sched_coloc *s) {
    int32_t ps = s->cfg.page_size, n_retracted = 0;
    for (int32_t i = s->t.q[ST_RUNNING].head, nx; i >= 0; i = nx) {
        nx = s->t.slots.next[i];
        struct creq *r = &s->reqs[i];
        while (pd__cover_position(s->pa, ps, r->prompt_len + r->n_out - 1, r->pages, &r->n_pages,
                                  r->cap_pages) != PD_OK) {
            if (s->rc && pd_radix_cache_evict(s->rc, 1) > 0)
                continue;
            int32_t v = pick_victim(s);
            PD_ASSERT(v >= 0); /* r itself is running */
            if (v == nx)
                nx = s->t.slots.next[v];
            retract(s, v);
            n_retracted++;
            if (v == i)
                break;
        }
    }
    return n_retracted;
}

static void add_chunk(struct pd_sched_coloc *s, struct pd_coloc_step *st, int32_t slot,
                      int32_t len) {
    struct creq *r = &s->reqs[slot];
    int32_t end = r->done_tokens + len;
    PD_ASSERT(len > 0 && end <= r->fill_len && pd__pages_for(end, s->cfg.page_size) <= r->n_pages);
    s->chunks[st->n_chunks++] = (struct pd_coloc_chunk){.room = r->room,
                                                        .start = r->done_tokens,
                                                        .len = len,
                                                        .last = end == r->fill_len,
                                                        .pages = r->pages,
                                                        .n_pages = r->n_pages,
                                                        .cached_tokens = r->adm_cached,
                                                        .slot_ = slot};
    r->chunk_end = end;
    r->in_batch = true;
    st->n_prefill_tokens += len;
}

/* PrefillAdder over the half-done request and (admit_new) the waiting queue, rem tokens of
 * budget. */
static void build_prefill(struct pd_sched_coloc *s, struct pd_coloc_step *st, int32_t rem,
                          bool admit_new) {
    int32_t ps = s->cfg.page_size;
    int64_t remaining = 0; /* tokens the admitted requests may still generate */
    for (int32_t i = s->t.q[ST_RUNNING].head; i >= 0; i = s->t.slots.next[i])
        remaining += s->reqs[i].max_new - s->reqs[i].n_out;
    int32_t n_admitted = s->t.q[ST_RUNNING].n;
    bool stop = false;
    if (s->chunked >= 0) {
        int32_t slot = s->chunked;
        struct creq *r = &s->reqs[slot];
        remaining += r->max_new - r->n_out;
        n_admitted++;
        int32_t len =
            pd__chunk_len(ps, s->unchunked, r->fill_len - r->done_tokens, rem, true, &stop);
        if (len == 0)
            return; /* not even a page of budget (mixed: the decode tokens took it); it stays
                       first for the next step */
        add_chunk(s, st, slot, len);
        rem -= len;
        if (s->chunks[st->n_chunks - 1].last)
            s->chunked = -1;
    }
    while (admit_new && !stop && rem > 0 && s->t.q[ST_WAITING].head >= 0 &&
           n_admitted < s->cfg.max_running_requests) {
        int32_t slot = s->t.q[ST_WAITING].head;
        struct creq *r = &s->reqs[slot];
        int64_t left = remaining + r->max_new - r->n_out;
        /* alone it always fits (add checked the pool): no reservation keeps it out forever */
        int32_t reserve = n_admitted == 0 ? 0 : (int32_t)ceil(s->ratio * (double)left / ps);
        struct pd__prefix_admit a = {.tokens = r->tokens,
                                     .n_tokens = r->fill_len,
                                     .n_pages = pd__pages_for(r->fill_len, s->cfg.page_size),
                                     .pages = r->pages,
                                     .rem = rem,
                                     .batch_empty = st->n_chunks == 0,
                                     .reserve = reserve,
                                     .cache_limited = r->cache_max >= 0,
                                     .cache_max = r->cache_max};
        if (!pd__prefix_admit(s->pa, s->rc, ps, s->unchunked, &a))
            break; /* FIFO: nobody overtakes the head */
        r->admitted = true;
        r->node = a.node;
        r->n_pages = a.n_pages;
        r->adm_cached = r->done_tokens = a.cached_pages * ps;
        if (r->n_out == 0)
            r->cached_tokens = r->adm_cached;
        move_to(s, slot, ST_PREFILLING, r->t_queue);
        add_chunk(s, st, slot, a.len);
        rem -= a.len;
        remaining = left;
        n_admitted++;
        stop = a.stop;
        if (!s->chunks[st->n_chunks - 1].last)
            s->chunked = slot; /* the half-done one: first in the next step */
    }
}

int pd_sched_coloc_step(struct pd_sched_coloc *s, double now_s, struct pd_coloc_step *st) {
    if (s->outstanding)
        return pd_errorf(PD_EINVAL, "colocated step while the previous one is not done");
    *st = (struct pd_coloc_step){.chunks = s->chunks, .decodes = s->decodes};
    (void)now_s;

    /* running requests first: their pages before any admission */
    st->n_retracted = grow_running(s);
    update_ratio(s, st->n_retracted > 0);
    st->new_token_ratio = s->ratio;

    int32_t rem = s->budget;
    if (s->cfg.mixed_chunk)
        rem -= s->t.q[ST_RUNNING].n; /* SGLang: the decode tokens share the chunk budget */
    /* no admission right after a retraction: memory is short */
    build_prefill(s, st, rem, st->n_retracted == 0);
    if (s->cfg.mixed_chunk || st->n_chunks == 0) {
        for (int32_t i = s->t.q[ST_RUNNING].head; i >= 0; i = s->t.slots.next[i]) {
            struct creq *r = &s->reqs[i];
            r->in_batch = true;
            s->decodes[st->n_decodes++] =
                (struct pd_coloc_decode){.room = r->room,
                                         .pos = r->prompt_len + r->n_out - 1,
                                         .pages = r->pages,
                                         .n_pages = r->n_pages,
                                         .slot_ = i};
        }
    }
    s->outstanding = st->n_chunks + st->n_decodes > 0;
    return PD_OK;
}

/* SGLang's cache_finished_req: the KV of prompt + output (the last token's was never written)
 * stays in the prefix cache, so a follow-up turn that repeats the conversation reuses it. */
static void cache_finished(struct pd_sched_coloc *s, struct creq *r) {
    int32_t n = r->prompt_len + r->n_out - 1;
    PD_ASSERT(r->admitted && n / s->cfg.page_size <= r->n_pages);
    pd__prefix_commit(s->rc, r->tokens, n, s->cfg.page_size, r->pages, &r->node);
}

/* One more output token; the request ends done at a stop or max_new_tokens. */
static void produced(struct pd_sched_coloc *s, int32_t slot, bool stop, double now_s) {
    struct creq *r = &s->reqs[slot];
    r->n_out++;
    if (stop || r->n_out >= r->max_new) {
        cache_finished(s, r);
        end_req(s, slot, PD_END_DONE);
    } else if (r->state != ST_RUNNING)
        move_to(s, slot, ST_RUNNING, now_s);
}

int pd_sched_coloc_step_done(struct pd_sched_coloc *s, const struct pd_coloc_step *st,
                             const bool *stopped, double now_s) {
    if (!s->outstanding)
        return st->n_chunks + st->n_decodes == 0
                   ? PD_OK
                   : pd_errorf(PD_EINVAL, "colocated step done without a step");
    for (int32_t i = 0; i < st->n_chunks; i++) {
        const struct pd_coloc_chunk *c = &st->chunks[i];
        struct creq *r = &s->reqs[c->slot_];
        PD_ASSERT(r->in_batch && r->state == ST_PREFILLING);
        r->in_batch = false;
        if (r->pending_end >= 0) {
            int reason = r->pending_end;
            r->pending_end = -1;
            end_req(s, c->slot_, reason);
            continue;
        }
        r->done_tokens = r->chunk_end;
        pd__prefix_commit(s->rc, r->tokens, r->done_tokens, s->cfg.page_size, r->pages, &r->node);
        if (c->last)
            produced(s, c->slot_, stopped && stopped[i], now_s);
    }
    for (int32_t i = 0; i < st->n_decodes; i++) {
        int32_t slot = st->decodes[i].slot_;
        struct creq *r = &s->reqs[slot];
        PD_ASSERT(r->in_batch && r->state == ST_RUNNING);
        r->in_batch = false;
        if (r->pending_end >= 0) {
            int reason = r->pending_end;
            r->pending_end = -1;
            end_req(s, slot, reason);
            continue;
        }
        produced(s, slot, stopped && stopped[st->n_chunks + i], now_s);
    }
    s->outstanding = false;
    return PD_OK;
}

int pd_sched_coloc_limit_cache(struct pd_sched_coloc *s, uint64_t room, int32_t max_tokens) {
    int32_t slot;
    int rc = pd__sched_table_find(&s->t, room, &slot);
    if (rc)
        return rc;
    s->reqs[slot].cache_max = max_tokens < 0 ? 0 : max_tokens;
    return PD_OK;
}

int pd_sched_coloc_abort(struct pd_sched_coloc *s, uint64_t room) {
    int32_t slot;
    int rc = pd__sched_table_find(&s->t, room, &slot);
    if (rc)
        return rc;
    struct creq *r = &s->reqs[slot];
    if (r->in_batch) {
        if (r->pending_end < 0)
            r->pending_end = PD_END_ABORTED;
        return PD_OK;
    }
    end_req(s, slot, PD_END_ABORTED);
    return PD_OK;
}

int pd_sched_coloc_pop_ended(struct pd_sched_coloc *s, struct pd_sched_end *e) {
    int32_t slot = pd__sched_table_oldest_ended(&s->t);
    if (slot < 0)
        return PD_EAGAIN;
    struct creq *r = &s->reqs[slot];
    *e = (struct pd_sched_end){.room = r->room,
                               .reason = r->end_reason,
                               .cached_tokens = r->cached_tokens,
                               .n_output = r->n_out};
    pd_free(r->pages);
    *r = (struct creq){.state = ST_FREE};
    pd__sched_table_recycle(&s->t, slot);
    return PD_OK;
}

void pd_sched_coloc_counts(const struct pd_sched_coloc *s, struct pd_coloc_counts *c) {
    c->prefilling = s->chunked >= 0;
    c->waiting = s->t.q[ST_WAITING].n + c->prefilling;
    c->running = s->t.q[ST_RUNNING].n;
    c->ended_unpopped = s->t.q[ST_ENDED].n;
    c->retracted = s->retracted;
}

int pd_sched_coloc_check(const struct pd_sched_coloc *s) {
    int32_t *holders;
    int rc = pd__holders_new(s->pa, s->rc, &holders);
    if (rc)
        return rc;
    int32_t ps = s->cfg.page_size;
    int32_t per_state[PD__SCHED_N_STATES] = {0};
    for (int32_t i = 0; i < s->t.cap; i++) {
        const struct creq *r = &s->reqs[i];
        per_state[r->state]++;
        if (r->state == ST_FREE || r->state == ST_ENDED)
            continue;
        const char *why = NULL;
        if (pd_room_map_get(&s->t.rooms, r->room) != i)
            why = "not mapped to its slot";
        else if (r->admitted != (r->state == ST_PREFILLING || r->state == ST_RUNNING))
            why = "admitted flag disagrees with its state";
        else if (r->n_pages > r->cap_pages || (!r->admitted && r->n_pages != 0))
            why = "page list out of bounds";
        else if (r->admitted && r->n_pages * ps < r->fill_len)
            why = "admitted without the pages of what it prefills";
        else if (r->done_tokens > r->fill_len ||
                 (r->state == ST_RUNNING && r->done_tokens != r->fill_len))
            why = "prefill progress out of bounds";
        else if (r->n_out >= r->max_new ||
                 (r->state == ST_RUNNING ? r->fill_len > r->prompt_len + r->n_out - 1
                                         : r->fill_len != r->prompt_len + r->n_out))
            why = "output count disagrees with what it prefills";
        else if (r->state == ST_PREFILLING && !r->in_batch && s->chunked != i)
            why = "prefilling outside the step and not the half-done one";
        if (why) {
            rc = pd_errorf(PD_EINTERNAL, "room %llu (%s): %s", (unsigned long long)r->room,
                           state_names[r->state], why);
            goto out;
        }
        if (r->admitted)
            pd__holders_add(holders, r->pages, r->n_pages);
    }
    if ((rc = pd__holders_check(s->pa, s->rc, holders)) == PD_OK &&
        (!pd__sched_table_agrees(&s->t, per_state) ||
         per_state[ST_PREFILLING] + per_state[ST_RUNNING] > s->cfg.max_running_requests ||
         (!s->outstanding && per_state[ST_PREFILLING] != (s->chunked >= 0))))
        rc = pd_errorf(PD_EINTERNAL, "colocated queues disagree with request states");
out:
    pd_free(holders);
    return rc;
}
