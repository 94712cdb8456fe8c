/*
 * engine_decode.c — the decode role of the compute thread (common/engine_internal.h's ops):
 * requests enter prealloc; when their prompt pages are reserved EV_ADMIT asks the loop to send
 * the Transfer; the done notice (XFER_END) carries the prefill's first token; then one token per
 * running request per step (EV_TOKEN) until it finishes. A request retracted for pages comes back
 * in as a local one whose KV one extend rebuilds here. A request without a prefill
 * (--local-prefill: no bootstrap fields) is prefilled here the same way when its pages are
 * reserved, its first token sampled from the prompt's last row; then it runs like any other.
 */
#include "decode/engine_decode.h"

#include "common/engine_internal.h"
#include "common/radix_cache.h"
#include "decode/sched_decode.h"
#include "model/tp_group.h"

#include "common/base/alloc.h"
#include "common/base/log.h"
#include "common/base/status.h"

#include <inttypes.h>
#include <string.h>

static void decode_add(struct pd_engine *e, struct pd_engine_req *r, double now) {
    /* a prompt computed here goes through the model: a token it would refuse must not fail
     * the step (a remote one's prompt never enters this model) */
    if (r->local_prefill && !pd__engine_prompt_ok(e, r))
        return;
    int rc = pd__engine_sampler_init(e, r, &r->sp);
    r->has_sampler = rc == PD_OK;
    if (!rc)
        rc = pd__engine_register(e, r);
    if (!rc) {
        rc = pd_sched_decode_add(e->sched, r->room, r->tokens, r->n_prompt, r->sp.max_new_tokens,
                                 now);
        if (!rc && r->mm) /* its image tokens cannot be recomputed here: retracted last */
            rc = pd_sched_decode_pin(e->sched, r->room);
        if (!rc && r->local_prefill && r->in_lp) {
            pd__engine_in_lp_begin(r);
            /* the positions it scores must be computed here, not served from the cache */
            rc = pd_sched_decode_limit_cache(e->sched, r->room, pd__engine_in_lp_cache_max(r));
            if (rc) {
                bool q;
                (void)pd_sched_decode_abort(e->sched, r->room, &q);
            }
        }
        if (rc)
            pd__engine_unregister(e, r);
    }
    if (rc) {
        pd_warn("room=%" PRIu64 " refused by the decode scheduler: %s", r->room, pd_error_msg());
        pd__engine_emit_end(e, r, PD_END_FAILED, rc, 0);
    }
}

static void decode_xfer_end(struct pd_engine *e, const struct pd_engine_cmd *c, double now) {
    struct pd_engine_req *r = pd__engine_find(e, c->room);
    if (!r)
        return;
    if (pd_sched_decode_given_up(e->sched, c->room)) {
        /* Timed out or aborted while its KV was on the way, and the transfer ended since (even
         * with the whole KV and the first token: a link that came back just after the timeout):
         * no write can land any more, so it ends now, as what it was given up for. */
        (void)pd_sched_decode_release(e->sched, c->room);
        return;
    }
    if (c->status == PD_OK && !r->aborted && r->n_out == 0) {
        if (c->first_token < 0 || c->first_token >= e->vocab) {
            pd_warn("room=%" PRIu64 " done notice carries token %d outside the vocabulary", r->room,
                    (int)c->first_token);
            (void)pd_sched_decode_transfer_done(e->sched, c->room, PD_EINVAL, now);
            (void)pd_sched_decode_release(e->sched, c->room);
            return;
        }
        enum pd_finish fin;
        pd_sampler_accept(&r->sampler, c->first_token, &fin);
        pd__engine_pen_release(e, r); /* recorded on the host: a slot's state would be stale */
        pd__engine_note_token(e, r, c->first_token, c->first_logprob, fin, NULL);
        if (pd_sched_decode_transfer_done(e->sched, c->room, PD_OK, now) != PD_OK) {
            (void)pd_sched_decode_release(e->sched, c->room); /* timed out meanwhile */
            return;
        }
        bool q;
        if (r->finished) /* EOS or a stop id first: end it now (no-op if already ended) */
            (void)pd_sched_decode_abort(e->sched, c->room, &q);
        return;
    }
    (void)pd_sched_decode_transfer_done(e->sched, c->room, c->status ? c->status : PD_ECANCELED,
                                        now);
    (void)pd_sched_decode_release(e->sched, c->room);
}

static void decode_abort(struct pd_engine *e, uint64_t room) {
    struct pd_engine_req *r = pd__engine_find(e, room);
    if (!r)
        return;
    r->aborted = true;
    bool quiesce = false;
    if (pd_sched_decode_abort(e->sched, room, &quiesce) == PD_OK && quiesce)
        pd__engine_emit(
            e, &(struct pd_engine_event){.kind = PD_ENGINE_EV_QUIESCE, .room = room, .req = r});
}

/* KV of r->tokens[0, n) computed here into its reserved pages (r->pages), in chunks (the
 * prompt's logprobs scored on the way when asked), but the pages the prefix cache already
 * held; e->logits' row 0 holds the last position's logits after. */
static int compute_here(struct pd_engine *e, struct pd_engine_req *r, int32_t n) {
    /* the scheduler's page numbers, as the engine keeps them (< 2^31) */
    const int32_t *pages = (const int32_t *)r->pages;
    int32_t held = r->held_pages * e->cfg.page_size;
    PD_ASSERT(held < n); /* the scheduler never serves the last token's page */
    for (int32_t done = held; done < n;) {
        int32_t len = n - done < e->chunk ? n - done : e->chunk;
        struct pd_model_seq s = {.tokens = r->tokens + done,
                                 .n_new = len,
                                 .n_cached = done,
                                 .pages = pages,
                                 .n_pages = r->n_pages};
        int rc = pd__engine_mm_seq(e, r, 0, &s); /* no encoder here: image tokens refused */
        if (!rc)
            rc = pd__engine_in_lp_prepass(e, r, &s);
        if (!rc)
            rc = pd_tp_group_extend(e->tp, &s, 1, false, e->logits);
        if (rc)
            return rc;
        pd__engine_in_lp_score(e, r, s.n_cached + s.n_new - 1, 1, e->logits);
        done += len;
        e->tokens += len;
    }
    return PD_OK;
}

/* A local request (--local-prefill) prefilled here: its first token from the prompt's last row,
 * as a prefill would have sampled it. PD_OK, or the model's failure. */
static int prefill_here(struct pd_engine *e, struct pd_engine_req *r) {
    int rc = compute_here(e, r, r->n_prompt);
    if (rc)
        return rc;
    pd__engine_take_token(e, 0, r, false);
    e->local_prefills++;
    return PD_OK;
}

/* r's KV computed here (fresh: its prompt, then its first token; else a retracted request's
 * tokens but the last), and its transfer done as if the KV had come. */
static void computed_here(struct pd_engine *e, struct pd_engine_req *r, bool fresh, double now) {
    int rc = fresh ? prefill_here(e, r) : compute_here(e, r, r->n_prompt + r->n_out - 1);
    if (rc)
        pd_error("room=%" PRIu64 " %s failed: %s", r->room, fresh ? "local prefill" : "recompute",
                 pd_error_msg());
    else
        pd_debug("room=%" PRIu64 " %s (%d tokens)", r->room,
                 fresh ? "prefilled here" : "recomputed locally",
                 (int)(fresh ? r->n_prompt : r->n_prompt + r->n_out - 1));
    r->fail_status = rc;
    (void)pd_sched_decode_transfer_done(e->sched, r->room, rc, now);
    if (rc) {
        (void)pd_sched_decode_release(e->sched, r->room);
    } else if (r->finished) { /* EOS or a stop id first: end it now */
        bool q;
        (void)pd_sched_decode_abort(e->sched, r->room, &q);
    }
}

/* The admitted local prefills' turn: in admission order, at most a chunk's worth of prompt
 * tokens (--chunked-prefill-size; one prompt at least) per step, so the running requests' next
 * token never waits for more prefill than a colocated mixed step would do. A request given up
 * meanwhile (aborted, timed out) leaves the queue: its XFER_END ends it. true when any ran or
 * some wait. */
static bool local_turn(struct pd_engine *e, double now) {
    int32_t spent = 0, k = 0, ran = 0;
    for (; k < e->n_local; k++) {
        uint64_t room = e->local_rooms[k];
        struct pd_engine_req *r = pd__engine_find(e, room);
        if (!r || pd_sched_decode_given_up(e->sched, room))
            continue;
        if (spent > 0 && spent + r->n_prompt > e->chunk)
            break;
        spent += r->n_prompt;
        computed_here(e, r, true, now);
        ran++;
    }
    memmove(e->local_rooms, e->local_rooms + k, (size_t)(e->n_local - k) * sizeof(uint64_t));
    e->n_local -= k;
    return ran > 0 || e->n_local > 0;
}

static bool decode_iter(struct pd_engine *e, double now) {
    struct pd_decode_step st;
    int rc = pd_sched_decode_step(e->sched, now, &st);
    PD_ASSERT(rc == PD_OK);
    e->retractions += st.n_retracted;
    for (int32_t i = 0; i < st.n_quiesce; i++) {
        struct pd_engine_req *r = pd__engine_find(e, st.quiesce[i]);
        pd_info("room=%" PRIu64 " timed out waiting for its KV (--waiting-timeout)", st.quiesce[i]);
        pd__engine_emit(e, &(struct pd_engine_event){
                               .kind = PD_ENGINE_EV_QUIESCE, .room = st.quiesce[i], .req = r});
    }
    for (int32_t i = 0; i < st.n_admitted; i++) {
        const struct pd_decode_admit *a = &st.admitted[i];
        struct pd_engine_req *r = pd__engine_find(e, a->room);
        PD_ASSERT(r && a->n_pages <= r->cap_pages);
        if (r->t_scheduled == 0) {
            r->t_scheduled = now;
            r->held_first = a->held_pages * e->cfg.page_size;
        }
        for (int32_t p = 0; p < a->n_pages; p++)
            r->pages[p] = (uint32_t)a->pages[p];
        r->n_pages = a->n_pages;
        r->held_pages = a->held_pages;
        e->held_tokens += (int64_t)a->held_pages * e->cfg.page_size;
        if (!r->local && !r->local_prefill) {
            pd__engine_emit(e, &(struct pd_engine_event){
                                   .kind = PD_ENGINE_EV_ADMIT, .room = a->room, .req = r});
            continue;
        }
        if (!r->local) { /* a local prefill: computed in its turn (local_turn) */
            e->local_rooms[e->n_local++] = a->room;
            continue;
        }
        computed_here(e, r, false, now); /* retracted: prompt + generated tokens but the last */
    }
    bool local = local_turn(e, now);
    if (st.n_batch == 0)
        return st.n_admitted > 0 || st.n_quiesce > 0 || local;
    int32_t nb = st.n_batch;
    PD_ASSERT(nb <= e->max_reqs);
    for (int32_t i = 0; i < nb; i++) {
        const struct pd_decode_entry *d = &st.batch[i];
        struct pd_engine_req *r = pd__engine_find(e, d->room);
        PD_ASSERT(r);
        e->seqs[i] = (struct pd_model_seq){.tokens = r->tokens + d->pos,
                                           .n_new = 1,
                                           .n_cached = d->pos,
                                           .pages = d->pages,
                                           .n_pages = d->n_pages,
                                           .pos_delta = r->mm ? r->mm->pos_delta : 0};
    }
    for (int32_t i = 0; i < nb; i++)
        e->step_reqs[i] = pd__engine_find(e, st.batch[i].room);
    bool plain = false, dev = e->cfg.greedy_on_device && pd__engine_device_rows(e, nb, &plain);
    rc = pd__engine_decode_rows(e, nb, dev, plain);
    if (rc)
        pd_error("decode step of %d requests failed: %s", (int)nb, pd_error_msg());
    for (int32_t i = 0; i < nb; i++) {
        struct pd_engine_req *r = e->step_reqs[i];
        if (rc) { /* the model refused the step: these requests end failed, their KV unkept */
            e->stopped[i] = true;
            r->fail_status = rc;
            (void)pd_sched_decode_forget(e->sched, r->room);
            continue;
        }
        e->stopped[i] = pd__engine_take_token(e, i, r, dev);
    }
    rc = pd_sched_decode_batch_done(e->sched, &st, e->stopped, now);
    PD_ASSERT(rc == PD_OK);
    e->steps++;
    e->tokens += nb;
    return true;
}

/* Drained ends; a retracted request goes back in as a local one, recomputed here. */
static void decode_drain_ends(struct pd_engine *e, double now) {
    struct pd_sched_end end;
    while (pd_sched_decode_pop_ended(e->sched, &end) == PD_OK) {
        struct pd_engine_req *r = pd__engine_find(e, end.room);
        PD_ASSERT(r);
        if (end.reason == PD_END_RETRACTED && !r->aborted && !r->finished) {
            /* back in as a local request: its "prompt" is everything but the last token */
            int rc = pd_sched_decode_add(e->sched, r->room, r->tokens, r->n_prompt + r->n_out - 1,
                                         r->sp.max_new_tokens - r->n_out + 1, now);
            if (rc == PD_OK) {
                r->local = true;
                pd__engine_pen_release(e, r); /* not running: the slot serves another meanwhile */
                pd_info("room=%" PRIu64 " retracted after %d tokens; recomputing locally", r->room,
                        (int)r->n_out);
                continue;
            }
            pd_warn("room=%" PRIu64 " retracted and cannot re-enter: %s", r->room, pd_error_msg());
            pd__engine_emit_end(e, r, PD_END_FAILED, rc, 0);
            continue;
        }
        pd_debug("room=%" PRIu64 " decode end=%s tokens=%d", end.room,
                 pd_sched_end_reason_str(end.reason), (int)r->n_out);
        /* a prompt computed here reports its own cache hit; a remote one the prefill's */
        pd__engine_emit_end(e, r, end.reason, PD_OK, r->local_prefill ? r->held_first : 0);
    }
}

int32_t pd__engine_running_rows(const struct pd_engine_config *cfg, int32_t budget,
                                int32_t *max_tokens) {
    if (*max_tokens < cfg->max_running_requests)
        *max_tokens = cfg->max_running_requests;
    return cfg->max_running_requests;
}

static int decode_sched_new(struct pd_engine *e) {
    const struct pd_engine_config *cfg = &e->cfg;
    int rc;
    if (cfg->greedy_on_device && (rc = pd__engine_pen_slots_new(e, e->max_reqs)) != PD_OK)
        return rc;
    struct pd_sched_decode_config dc = {
        .page_size = cfg->page_size,
        .max_running_requests = cfg->max_running_requests,
        .max_queued_requests = cfg->max_queued_requests,
        .waiting_timeout_s = cfg->waiting_timeout_s > 0 ? cfg->waiting_timeout_s : 300,
    };
    pd_sched_decode_config_defaults(&dc);
    pd__engine_ratio(cfg, &dc.init_new_token_ratio, &dc.min_new_token_ratio);
    e->local_rooms = pd_calloc((size_t)cfg->max_running_requests, sizeof(uint64_t));
    if (!e->local_rooms)
        return pd_errorf(PD_ENOMEM, "decode: local prefill queue");
    e->n_local = 0;
    /* decode-side prefix reuse: finished requests' KV stays for the next turn */
    struct pd_sched_decode *sd;
    if ((rc = pd_radix_cache_new(e->pa, cfg->page_size, cfg->disable_prefix_cache, &e->rc)) !=
            PD_OK ||
        (rc = pd_sched_decode_new(&dc, e->pa, e->rc, &sd)) != PD_OK) {
        pd_free(e->local_rooms);
        e->local_rooms = NULL;
        return rc;
    }
    e->sched = sd;
    return PD_OK;
}

static void decode_sched_free(struct pd_engine *e) {
    pd_sched_decode_free(e->sched);
    e->sched = NULL;
    pd_free(e->local_rooms);
    e->local_rooms = NULL;
    e->n_local = 0;
}

static void decode_counts(const struct pd_engine *e, struct pd_engine_stats *s) {
    struct pd_decode_counts c;
    pd_sched_decode_counts(e->sched, &c);
    s->q_prealloc = c.prealloc;
    s->q_transfer = c.transfer;
    s->q_running = c.running;
    s->q_draining = c.draining;
}

static int decode_check(const struct pd_engine *e) {
    return pd_sched_decode_check(e->sched);
}

static void decode_end_now(struct pd_engine *e, uint64_t room) {
    bool q;
    if (pd_sched_decode_abort(e->sched, room, &q) == PD_OK && q)
        (void)pd_sched_decode_release(e->sched, room);
}

static void decode_discard_ended(struct pd_engine *e) {
    struct pd_sched_end end;
    while (pd_sched_decode_pop_ended(e->sched, &end) == PD_OK) {
    }
}

const struct pd_engine_ops pd_engine_decode_ops = {
    .name = "decode",
    .step_rows = pd__engine_running_rows,
    .sched_new = decode_sched_new,
    .sched_free = decode_sched_free,
    .add = decode_add,
    .xfer_end = decode_xfer_end,
    .abort = decode_abort,
    .iter = decode_iter,
    .drain_ends = decode_drain_ends,
    .counts = decode_counts,
    .check = decode_check,
    .end_now = decode_end_now,
    .discard_ended = decode_discard_ended,
};
