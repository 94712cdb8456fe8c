/*
 * sched_coloc.c — request slots, the waiting/running queues, the chunked-prefill admission shared
 * with the prefill scheduler (sched_common.c), the mixed step, page growth and retraction.
 *
 * A request's states: waiting → prefilling (admitted: holds the pages of every token it
 * prefills, cached prefix included, and a lock on its prefix-cache node; in the outstanding step
 * or the half-done one) → running (its pages grow a page at a time) → ended, with a retraction
 * taking a running request back to waiting with nothing held. An admission prefills fill_len =
 * prompt + outputs so far tokens (the prompt alone the first time). The end, whatever its reason,
 * puts the pages and the lock (pd__sched_table_end); check() recounts every page's holders. A
 * finished request's whole pages of prompt + output enter the prefix cache first (SGLang's
 * cache_finished_req), so the next turn of a conversation finds them.
 */
#include "decode/sched_coloc.h"

#include "common/base/alloc.h"
#include "common/page_alloc.h"
#include "common/radix_cache.h"
#include "common/sched_table.h"
#include "common/base/status.h"

#include <math.h>

enum { ST_FREE, ST_WAITING, ST_PREFILLING, ST_RUNNING, ST_ENDED };

static const char *const state_names[] = {"free", "waiting", "prefilling", "running", "ended"};

/* h.done_tokens counts of fill_len; h.cached_tokens is the first admission's cache hit (what
 * usage reports). */
struct creq {
    struct pd__sched_req h;
    int32_t fill_len;   /* tokens this admission prefills */
    int32_t adm_cached; /* this admission's cache hit */
};

struct pd_sched_coloc {
    struct pd_sched_coloc_config cfg;
    int32_t budget;
    bool unchunked;
    struct pd_page_alloc *pa;
    struct pd_radix_cache *rc;
    struct creq *reqs;        /* [t.cap] t's */
    struct pd__sched_table t; /* queues: waiting, running, ended; t.aside: the half-done one */
    struct pd__token_ratio ratio;
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
    s->ratio = pd__token_ratio_make(cfg->init_new_token_ratio, cfg->min_new_token_ratio,
                                    cfg->new_token_ratio_decay, cfg->retract_decode_steps);
    int32_t cap = cfg->max_queued_requests, mr = cfg->max_running_requests;
    s->chunks = pd_calloc((size_t)mr, sizeof(*s->chunks));
    s->decodes = pd_calloc((size_t)mr, sizeof(*s->decodes));
    /* prefilling has no FIFO: the outstanding step or the half-done slot */
    uint32_t queued = 1u << ST_WAITING | 1u << ST_RUNNING | 1u << ST_ENDED;
    if (!s->chunks || !s->decodes ||
        pd__sched_table_init(&s->t, cap, queued, ST_ENDED, sizeof(struct creq), pa, rc) != PD_OK)
        goto fail_arrays;
    s->reqs = s->t.reqs;
    *out = s;
    return PD_OK;

fail_arrays:
    pd__sched_table_free(&s->t);
    pd_free(s->chunks);
    pd_free(s->decodes);
    pd_free(s);
fail:
    return pd_error_wrap(PD_ENOMEM, "creating the colocated scheduler (%d requests)",
                         (int)cfg->max_queued_requests);
}

void pd_sched_coloc_free(struct pd_sched_coloc *s) {
    if (!s)
        return;
    pd__sched_table_free(&s->t);
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
    int32_t cap_pages, slot;
    if ((rc = pd__generation_pages(s->pa, s->cfg.page_size, room, prompt_len, max_new_tokens,
                                   &cap_pages)) != PD_OK ||
        (rc = pd__sched_table_add(&s->t, room, cap_pages, &slot)) != PD_OK)
        return rc;
    struct creq *r = &s->reqs[slot];
    r->h.tokens = tokens;
    r->h.prompt_len = prompt_len;
    r->h.max_new = max_new_tokens;
    r->fill_len = prompt_len;
    pd__sched_table_move(&s->t, slot, ST_WAITING, now_s);
    return PD_OK;
}

/* Back to the head of waiting with nothing held; it is prefilled again over prompt + outputs
 * (the older request goes first, so a retraction does not lose its place). */
static void retract(struct pd_sched_coloc *s, int32_t slot) {
    struct creq *r = &s->reqs[slot];
    PD_ASSERT(r->h.state == ST_RUNNING && !r->h.in_batch);
    pd__sched_table_drop(&s->t, &r->h);
    r->fill_len = r->h.prompt_len + r->h.n_out;
    pd__slot_list_remove(&s->t.q[ST_RUNNING], &s->t.slots, slot);
    r->h.state = ST_WAITING;
    pd__slot_list_push_front(&s->t.q[ST_WAITING], &s->t.slots, slot);
    s->retracted++;
}

/* Every running request gets the page its next position needs: from the free pool, else from
 * the prefix cache, else from retracting the request that loses least. */
static int32_t grow_running(struct pd_sched_coloc *s) {
    int32_t ps = s->cfg.page_size, n_retracted = 0;
    for (int32_t i = s->t.q[ST_RUNNING].head, nx; i >= 0; i = nx) {
        nx = s->t.slots.next[i];
        struct creq *r = &s->reqs[i];
        while (pd__cover_position(s->pa, ps, r->h.prompt_len + r->h.n_out - 1, r->h.pages,
                                  &r->h.n_pages, r->h.cap_pages) != PD_OK) {
            if (s->rc && pd_radix_cache_evict(s->rc, 1) > 0)
                continue;
            int32_t v = pd__sched_table_pick_victim(&s->t, ST_RUNNING);
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
    int32_t end = r->h.done_tokens + len;
    PD_ASSERT(len > 0 && end <= r->fill_len &&
              pd__pages_for(end, s->cfg.page_size) <= r->h.n_pages);
    s->chunks[st->n_chunks++] = (struct pd_coloc_chunk){.room = r->h.room,
                                                        .start = r->h.done_tokens,
                                                        .len = len,
                                                        .last = end == r->fill_len,
                                                        .pages = r->h.pages,
                                                        .n_pages = r->h.n_pages,
                                                        .cached_tokens = r->adm_cached,
                                                        .slot_ = slot};
    r->h.chunk_end = end;
    r->h.in_batch = true;
    st->n_prefill_tokens += len;
}

/* PrefillAdder over the half-done request and (admit_new) the waiting queue, rem tokens of
 * budget. */
static void build_prefill(struct pd_sched_coloc *s, struct pd_coloc_step *st, int32_t rem,
                          bool admit_new) {
    int32_t ps = s->cfg.page_size;
    int64_t remaining = 0; /* tokens the admitted requests may still generate */
    for (int32_t i = s->t.q[ST_RUNNING].head; i >= 0; i = s->t.slots.next[i])
        remaining += s->reqs[i].h.max_new - s->reqs[i].h.n_out;
    int32_t n_admitted = s->t.q[ST_RUNNING].n;
    bool stop = false;
    if (s->t.aside >= 0) {
        int32_t slot = s->t.aside;
        struct creq *r = &s->reqs[slot];
        remaining += r->h.max_new - r->h.n_out;
        n_admitted++;
        int32_t len =
            pd__chunk_len(ps, s->unchunked, r->fill_len - r->h.done_tokens, rem, true, &stop);
        if (len == 0)
            return; /* not even a page of budget (mixed: the decode tokens took it); it stays
                       first for the next step */
        add_chunk(s, st, slot, len);
        rem -= len;
        if (s->chunks[st->n_chunks - 1].last)
            s->t.aside = -1;
    }
    while (admit_new && !stop && rem > 0 && s->t.q[ST_WAITING].head >= 0 &&
           n_admitted < s->cfg.max_running_requests) {
        int32_t slot = s->t.q[ST_WAITING].head;
        struct creq *r = &s->reqs[slot];
        int64_t left = remaining + r->h.max_new - r->h.n_out;
        /* alone it always fits (add checked the pool): no reservation keeps it out forever */
        int32_t reserve = n_admitted == 0 ? 0 : (int32_t)ceil(s->ratio.value * (double)left / ps);
        struct pd__prefix_admit a = {.tokens = r->h.tokens,
                                     .n_tokens = r->fill_len,
                                     .n_pages = pd__pages_for(r->fill_len, s->cfg.page_size),
                                     .pages = r->h.pages,
                                     .rem = rem,
                                     .batch_empty = st->n_chunks == 0,
                                     .reserve = reserve,
                                     .cache_limited = r->h.cache_max >= 0,
                                     .cache_max = r->h.cache_max};
        if (!pd__prefix_admit(s->pa, s->rc, ps, s->unchunked, &a))
            break; /* FIFO: nobody overtakes the head */
        r->h.admitted = true;
        r->h.node = a.node;
        r->h.n_pages = a.n_pages;
        r->adm_cached = r->h.done_tokens = a.cached_pages * ps;
        if (r->h.n_out == 0)
            r->h.cached_tokens = r->adm_cached;
        pd__sched_table_move(&s->t, slot, ST_PREFILLING, r->h.t_queue);
        add_chunk(s, st, slot, a.len);
        rem -= a.len;
        remaining = left;
        n_admitted++;
        stop = a.stop;
        if (!s->chunks[st->n_chunks - 1].last)
            s->t.aside = slot; /* the half-done one: first in the next step */
    }
}

int pd_sched_coloc_step(struct pd_sched_coloc *s, double now_s, struct pd_coloc_step *st) {
    if (s->outstanding)
        return pd_errorf(PD_EINVAL, "colocated step while the previous one is not done");
    *st = (struct pd_coloc_step){.chunks = s->chunks, .decodes = s->decodes};
    (void)now_s;

    /* running requests first: their pages before any admission */
    st->n_retracted = grow_running(s);
    pd__sched_table_ratio_step(&s->t, ST_RUNNING, st->n_retracted > 0, &s->ratio);
    st->new_token_ratio = s->ratio.value;

    int32_t rem = s->budget;
    if (s->cfg.mixed_chunk)
        rem -= s->t.q[ST_RUNNING].n; /* SGLang: the decode tokens share the chunk budget */
    /* no admission right after a retraction: memory is short */
    build_prefill(s, st, rem, st->n_retracted == 0);
    if (s->cfg.mixed_chunk || st->n_chunks == 0) {
        for (int32_t i = s->t.q[ST_RUNNING].head; i >= 0; i = s->t.slots.next[i]) {
            struct creq *r = &s->reqs[i];
            r->h.in_batch = true;
            s->decodes[st->n_decodes++] =
                (struct pd_coloc_decode){.room = r->h.room,
                                         .pos = r->h.prompt_len + r->h.n_out - 1,
                                         .pages = r->h.pages,
                                         .n_pages = r->h.n_pages,
                                         .slot_ = i};
        }
    }
    s->outstanding = st->n_chunks + st->n_decodes > 0;
    return PD_OK;
}

/* SGLang's cache_finished_req: the KV of prompt + output (the last token's was never written)
 * stays in the prefix cache, so a follow-up turn that repeats the conversation reuses it. */
static void cache_finished(struct pd_sched_coloc *s, struct creq *r) {
    int32_t n = r->h.prompt_len + r->h.n_out - 1;
    PD_ASSERT(r->h.admitted && n / s->cfg.page_size <= r->h.n_pages);
    pd__prefix_commit(s->rc, r->h.tokens, n, s->cfg.page_size, r->h.pages, &r->h.node);
}

/* One more output token; the request ends done at a stop or max_new_tokens. */
static void produced(struct pd_sched_coloc *s, int32_t slot, bool stop, double now_s) {
    struct creq *r = &s->reqs[slot];
    r->h.n_out++;
    if (stop || r->h.n_out >= r->h.max_new) {
        cache_finished(s, r);
        pd__sched_table_end(&s->t, slot, PD_END_DONE);
    } else if (r->h.state != ST_RUNNING)
        pd__sched_table_move(&s->t, slot, ST_RUNNING, now_s);
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
        PD_ASSERT(r->h.in_batch && r->h.state == ST_PREFILLING);
        r->h.in_batch = false;
        if (r->h.pending_end >= 0) {
            int reason = r->h.pending_end;
            r->h.pending_end = -1;
            pd__sched_table_end(&s->t, c->slot_, reason);
            continue;
        }
        r->h.done_tokens = r->h.chunk_end;
        pd__prefix_commit(s->rc, r->h.tokens, r->h.done_tokens, s->cfg.page_size, r->h.pages,
                          &r->h.node);
        if (c->last)
            produced(s, c->slot_, stopped && stopped[i], now_s);
    }
    for (int32_t i = 0; i < st->n_decodes; i++) {
        int32_t slot = st->decodes[i].slot_;
        struct creq *r = &s->reqs[slot];
        PD_ASSERT(r->h.in_batch && r->h.state == ST_RUNNING);
        r->h.in_batch = false;
        if (r->h.pending_end >= 0) {
            int reason = r->h.pending_end;
            r->h.pending_end = -1;
            pd__sched_table_end(&s->t, slot, reason);
            continue;
        }
        produced(s, slot, stopped && stopped[st->n_chunks + i], now_s);
    }
    s->outstanding = false;
    return PD_OK;
}

int pd_sched_coloc_limit_cache(struct pd_sched_coloc *s, uint64_t room, int32_t max_tokens) {
    return pd__sched_table_limit_cache(&s->t, room, max_tokens);
}

int pd_sched_coloc_abort(struct pd_sched_coloc *s, uint64_t room) {
    int32_t slot;
    int rc = pd__sched_table_find(&s->t, room, &slot);
    if (rc)
        return rc;
    struct creq *r = &s->reqs[slot];
    if (r->h.in_batch) {
        if (r->h.pending_end < 0)
            r->h.pending_end = PD_END_ABORTED;
        return PD_OK;
    }
    pd__sched_table_end(&s->t, slot, PD_END_ABORTED);
    return PD_OK;
}

int pd_sched_coloc_pop_ended(struct pd_sched_coloc *s, struct pd_sched_end *e) {
    return pd__sched_table_pop_ended(&s->t, e);
}

void pd_sched_coloc_counts(const struct pd_sched_coloc *s, struct pd_coloc_counts *c) {
    c->prefilling = s->t.aside >= 0;
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
    if ((rc = pd__sched_table_recount(&s->t, holders, per_state)) != PD_OK)
        goto out;
    for (int32_t i = 0; i < s->t.cap; i++) {
        const struct creq *r = &s->reqs[i];
        if (r->h.state == ST_FREE || r->h.state == ST_ENDED)
            continue;
        const char *why = NULL;
        if (r->h.admitted != (r->h.state == ST_PREFILLING || r->h.state == ST_RUNNING))
            why = "admitted flag disagrees with its state";
        else if (r->h.n_pages > r->h.cap_pages || (!r->h.admitted && r->h.n_pages != 0))
            why = "page list out of bounds";
        else if (r->h.admitted && r->h.n_pages * ps < r->fill_len)
            why = "admitted without the pages of what it prefills";
        else if (r->h.done_tokens > r->fill_len ||
                 (r->h.state == ST_RUNNING && r->h.done_tokens != r->fill_len))
            why = "prefill progress out of bounds";
        else if (r->h.n_out >= r->h.max_new ||
                 (r->h.state == ST_RUNNING ? r->fill_len > r->h.prompt_len + r->h.n_out - 1
                                           : r->fill_len != r->h.prompt_len + r->h.n_out))
            why = "output count disagrees with what it prefills";
        else if (r->h.state == ST_PREFILLING && !r->h.in_batch && s->t.aside != i)
            why = "prefilling outside the step and not the half-done one";
        if (why) {
            rc = pd_errorf(PD_EINTERNAL, "room %llu (%s): %s", (unsigned long long)r->h.room,
                           state_names[r->h.state], why);
            goto out;
        }
    }
    if ((rc = pd__holders_check(s->pa, s->rc, holders)) == PD_OK &&
        (!pd__sched_table_agrees(&s->t, per_state) ||
         per_state[ST_PREFILLING] + per_state[ST_RUNNING] > s->cfg.max_running_requests ||
         (!s->outstanding && per_state[ST_PREFILLING] != (s->t.aside >= 0))))
        rc = pd_errorf(PD_EINTERNAL, "colocated queues disagree with request states");
out:
    pd_free(holders);
    return rc;
}
