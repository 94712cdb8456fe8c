/*
 * engine_prefill.c — the prefill role of the compute thread (common/engine_internal.h's ops):
 * requests enter the bootstrap queue, move to waiting when decode's Transfer arrives
 * (BOOTSTRAPPED), run in page-aligned chunks through the model (prefill/sched_prefill.h decides
 * them), and each chunk's finished pages go out as EV_SEND; the last chunk samples the first
 * output token, which rides on that event. With --eager-prefill a request computes before its
 * Transfer comes; what it computed by then goes out as one EV_SEND when it does. A request ends
 * when its transfer ended (XFER_END).
 */
#include "prefill/engine_prefill.h"

#include "common/engine_internal.h"
#include "common/radix_cache.h"
#include "prefill/sched_prefill.h"
#include "common/server_args.h"
#include "model/tp_group.h"

#include "common/base/log.h"
#include "common/base/status.h"

#include <inttypes.h>

static void prefill_add(struct pd_engine *e, struct pd_engine_req *r, double now) {
    struct pd_sampling_params sp = r->sp;
    sp.max_new_tokens = 1; /* prefill samples the first token only */
    int rc = pd__engine_sampler_init(e, r, &sp);
    r->has_sampler = rc == PD_OK;
    if (!rc)
        rc = pd__engine_register(e, r);
    if (!rc) {
        rc = pd_sched_prefill_add(e->sched, r->room, r->tokens, r->n_prompt, now);
        if (!rc && r->in_lp) {
            pd__engine_in_lp_begin(r);
            rc = pd_sched_prefill_limit_cache(e->sched, r->room, pd__engine_in_lp_cache_max(r));
        }
        if (rc)
            pd__engine_unregister(e, r);
    }
    if (rc) {
        pd_warn("room=%" PRIu64 " refused by the prefill scheduler: %s", r->room, pd_error_msg());
        pd__engine_emit_end(e, r, PD_END_FAILED, rc, 0);
    }
}

static void prefill_xfer_end(struct pd_engine *e, const struct pd_engine_cmd *c, double now) {
    uint64_t room = c->room;
    int status = c->status;
    struct pd_engine_req *r = pd__engine_find(e, room);
    if (!r)
        return;
    if (status == PD_OK) {
        if (pd_sched_prefill_transfer_done(e->sched, room, PD_OK, now) != PD_OK)
            (void)pd_sched_prefill_release(e->sched, room); /* aborted meanwhile: draining */
    } else {
        (void)pd_sched_prefill_transfer_done(e->sched, room, status, now);
    }
}

static void prefill_abort(struct pd_engine *e, uint64_t room) {
    struct pd_engine_req *r = pd__engine_find(e, room);
    if (!r)
        return;
    r->aborted = true;
    bool quiesce = false;
    if (pd_sched_prefill_abort(e->sched, room, &quiesce) == PD_OK && quiesce)
        pd__engine_emit(
            e, &(struct pd_engine_event){.kind = PD_ENGINE_EV_QUIESCE, .room = room, .req = r});
}

/* pages [begin, end) of r go to its decode; last: with the first token sampled. */
static void emit_send(struct pd_engine *e, struct pd_engine_req *r, int32_t begin, int32_t end,
                      bool last, int32_t cached_tokens) {
    struct pd_engine_event ev = {.kind = PD_ENGINE_EV_SEND,
                                 .room = r->room,
                                 .req = r,
                                 .begin = begin,
                                 .end = end,
                                 .last = last,
                                 .token = -1,
                                 .cached_tokens = cached_tokens};
    if (last) {
        ev.token = r->tokens[r->n_prompt];
        ev.logprob = r->first_logprob;
    }
    pd__engine_emit(e, &ev);
}

/* Runs batch chunks [i0, i0+n) through extend; samples the first token of finished prompts. */
static int prefill_run(struct pd_engine *e, struct pd_prefill_batch *b, int32_t i0, int32_t n) {
    for (int32_t k = 0; k < n; k++) {
        struct pd_prefill_chunk *c = &b->chunks[i0 + k];
        struct pd_engine_req *r = pd__engine_find(e, c->room);
        PD_ASSERT(r);
        e->seqs[k] = (struct pd_model_seq){.tokens = r->tokens + c->start,
                                           .n_new = c->len,
                                           .n_cached = c->start,
                                           .pages = c->pages,
                                           .n_pages = c->n_pages};
        int rc = pd__engine_mm_seq(e, r, k, &e->seqs[k]); /* images: positions, embeddings */
        if (!rc)
            rc = pd__engine_in_lp_prepass(e, r, &e->seqs[k]);
        if (rc)
            return rc;
    }
    int rc = pd_tp_group_extend(e->tp, e->seqs, (int)n, false, e->logits);
    if (rc)
        return rc;
    for (int32_t k = 0; k < n; k++) {
        struct pd_prefill_chunk *c = &b->chunks[i0 + k];
        struct pd_engine_req *r = pd__engine_find(e, c->room);
        pd__engine_in_lp_score(e, r, e->seqs[k].n_cached + e->seqs[k].n_new - 1, 1,
                               e->logits + (size_t)k * (size_t)e->vocab);
        if (!c->last)
            continue;
        pd__engine_mm_release(e, r); /* the prompt is computed: its images' embeddings go */
        struct pd_sample smp;
        pd_sampler_next(&r->sampler, &e->scratch, e->logits + (size_t)k * (size_t)e->vocab, &smp);
        r->tokens[r->n_prompt] = smp.token;
        r->n_out = 1;
        r->first_logprob = smp.logprob; /* rides on the last chunk's event */
        r->first = smp;
    }
    return PD_OK;
}

static bool prefill_iter(struct pd_engine *e, double now) {
    struct pd_prefill_batch b;
    int rc = pd_sched_prefill_step(e->sched, now, &b);
    PD_ASSERT(rc == PD_OK);
    if (b.n == 0)
        return false;
    int fail = PD_OK;
    for (int32_t i0 = 0; i0 < b.n && !fail; i0 += e->max_reqs) {
        int32_t n = b.n - i0 < e->max_reqs ? b.n - i0 : e->max_reqs;
        fail = prefill_run(e, &b, i0, n);
    }
    if (fail)
        pd_error("prefill step of %d chunks failed: %s", (int)b.n, pd_error_msg());
    rc = pd_sched_prefill_batch_done(e->sched, &b, now);
    PD_ASSERT(rc == PD_OK);
    e->steps++;
    e->tokens += b.n_tokens;
    for (int32_t i = 0; i < b.n; i++) {
        struct pd_prefill_chunk *c = &b.chunks[i];
        struct pd_engine_req *r = pd__engine_find(e, c->room);
        if (c->dropped || !r) {
            if (r && c->quiesce) /* sent pages may still be read: the loop aborts the room */
                pd__engine_emit(e, &(struct pd_engine_event){
                                       .kind = PD_ENGINE_EV_QUIESCE, .room = c->room, .req = r});
            continue;
        }
        if (fail) { /* the model refused the step: give the request up */
            prefill_abort(e, c->room);
            continue;
        }
        if (r->t_scheduled == 0)
            r->t_scheduled = now;
        if (r->n_pages == 0) {
            PD_ASSERT(c->n_pages <= r->cap_pages);
            for (int32_t p = 0; p < c->n_pages; p++)
                r->pages[p] = (uint32_t)c->pages[p];
            r->n_pages = c->n_pages;
        }
        if (c->held || (c->send_end == c->send_begin && !c->last))
            continue;
        emit_send(e, r, c->send_begin, c->send_end, c->last, c->cached_tokens);
    }
    return true;
}

/* Drained ends: the transfer is over (done, failed, timed out or aborted) and the pages back. */
static void prefill_drain_ends(struct pd_engine *e, double now) {
    struct pd_sched_end end;
    while (pd_sched_prefill_pop_ended(e->sched, &end) == PD_OK) {
        struct pd_engine_req *r = pd__engine_find(e, end.room);
        PD_ASSERT(r);
        pd_debug("room=%" PRIu64 " prefill end=%s", end.room, pd_sched_end_reason_str(end.reason));
        r->finished = end.reason == PD_END_DONE;
        pd__engine_emit_end(e, r, end.reason, PD_OK, end.cached_tokens);
    }
}

/* A step's rows: its chunks, one per request, within the token budget (at most 256). */
static int32_t prefill_step_rows(const struct pd_engine_config *cfg, int32_t budget,
                                 int32_t *max_tokens) {
    int32_t rows = budget < 256 ? budget : 256;
    return rows < cfg->max_queued_requests ? rows : cfg->max_queued_requests;
}

static int prefill_sched_new(struct pd_engine *e) {
    const struct pd_engine_config *cfg = &e->cfg;
    int rc = pd_radix_cache_new(e->pa, cfg->page_size, cfg->disable_prefix_cache, &e->rc);
    if (rc)
        return rc;
    struct pd_sched_prefill_config sc = {
        .page_size = cfg->page_size,
        .chunked_prefill_size = cfg->chunked_prefill_size,
        .max_prefill_tokens = pd__engine_max_prefill(cfg),
        .max_queued_requests = cfg->max_queued_requests,
        .bootstrap_timeout_s = cfg->bootstrap_timeout_s > 0 ? cfg->bootstrap_timeout_s : 300,
        .eager = cfg->eager_prefill,
    };
    struct pd_sched_prefill *sp;
    if ((rc = pd_sched_prefill_new(&sc, e->pa, e->rc, &sp)) != PD_OK)
        return rc;
    e->sched = sp;
    return PD_OK;
}

static void prefill_sched_free(struct pd_engine *e) {
    pd_sched_prefill_free(e->sched);
    e->sched = NULL;
}

static void prefill_bootstrapped(struct pd_engine *e, const struct pd_engine_cmd *c, double now) {
    struct pd_engine_req *r = pd__engine_find(e, c->room);
    struct pd_prefill_send s;
    if (!r || pd_sched_prefill_bootstrapped(e->sched, c->room, now, &s) != PD_OK)
        return;
    r->held_pages = c->held_pages; /* before any SEND: the loop skips them */
    /* eager: computed before the Transfer came (r->pages was filled at its first chunk) */
    if (s.end > s.begin || s.last)
        emit_send(e, r, s.begin, s.end, s.last, s.cached_tokens);
}

static void prefill_counts(const struct pd_engine *e, struct pd_engine_stats *s) {
    struct pd_prefill_counts c;
    pd_sched_prefill_counts(e->sched, &c);
    s->q_bootstrap = c.bootstrap;
    s->q_waiting = c.waiting;
    s->q_inflight = c.inflight;
    s->q_draining = c.draining;
}

static int prefill_check(const struct pd_engine *e) {
    return pd_sched_prefill_check(e->sched);
}

static void prefill_end_now(struct pd_engine *e, uint64_t room) {
    bool q;
    if (pd_sched_prefill_abort(e->sched, room, &q) == PD_OK && q)
        (void)pd_sched_prefill_release(e->sched, room);
}

static void prefill_discard_ended(struct pd_engine *e) {
    struct pd_sched_end end;
    while (pd_sched_prefill_pop_ended(e->sched, &end) == PD_OK) {
    }
}

const struct pd_engine_ops pd_engine_prefill_ops = {
    .name = "prefill",
    .step_rows = prefill_step_rows,
    .sched_new = prefill_sched_new,
    .sched_free = prefill_sched_free,
    .add = prefill_add,
    .bootstrapped = prefill_bootstrapped,
    .xfer_end = prefill_xfer_end,
    .abort = prefill_abort,
    .iter = prefill_iter,
    .drain_ends = prefill_drain_ends,
    .counts = prefill_counts,
    .check = prefill_check,
    .end_now = prefill_end_now,
    .discard_ended = prefill_discard_ended,
};
