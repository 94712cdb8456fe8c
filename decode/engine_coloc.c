/*
 * engine_coloc.c — the colocated role of the compute thread (pdserve-decode
 * --disaggregation-mode null; common/engine_internal.h's ops): requests enter waiting; each step
 * runs prefill chunks and one decode token per running request in one forward pass
 * (decode/sched_coloc.h); every output token, the first included, is an EV_TOKEN. Nothing is
 * transferred: no ADMIT, SEND, QUIESCE or XFER_END.
 */
#include "decode/engine_decode.h"

#include "common/engine_internal.h"
#include "common/radix_cache.h"
#include "decode/sched_coloc.h"
#include "model/tp_group.h"

#include "common/base/log.h"
#include "common/base/status.h"

#include <inttypes.h>

static int coloc_sched_new(struct pd_engine *e) {
    const struct pd_engine_config *cfg = &e->cfg;
    int rc;
    if (cfg->greedy_on_device && (rc = pd__engine_pen_slots_new(e, e->max_reqs)) != PD_OK)
        return rc;
    if ((rc = pd_radix_cache_new(e->pa, cfg->page_size, cfg->disable_prefix_cache, &e->rc)) !=
        PD_OK)
        return rc;
    struct pd_sched_coloc_config cc = {
        .page_size = cfg->page_size,
        .chunked_prefill_size = cfg->chunked_prefill_size,
        .max_prefill_tokens = pd__engine_max_prefill(cfg),
        .max_running_requests = cfg->max_running_requests,
        .max_queued_requests = cfg->max_queued_requests,
    };
    pd_sched_coloc_config_defaults(&cc);
    cc.mixed_chunk = cfg->mixed_chunk;
    pd__engine_ratio(cfg, &cc.init_new_token_ratio, &cc.min_new_token_ratio);
    struct pd_sched_coloc *sc;
    if ((rc = pd_sched_coloc_new(&cc, e->pa, e->rc, &sc)) != PD_OK)
        return rc;
    e->sched = sc;
    return PD_OK;
}

static void coloc_sched_free(struct pd_engine *e) {
    pd_sched_coloc_free(e->sched);
    e->sched = NULL;
}

static void coloc_add(struct pd_engine *e, struct pd_engine_req *r, double now) {
    /* one forward pass carries many requests: a token the model would refuse must not get into
     * a step and fail the requests batched with it */
    if (!pd__engine_prompt_ok(e, r))
        return;
    int rc = pd__engine_sampler_init(e, r, &r->sp);
    r->has_sampler = rc == PD_OK;
    if (!rc)
        rc = pd__engine_register(e, r);
    if (!rc) {
        /* r->tokens holds the prompt, then the outputs note_token writes: the scheduler
         * prefills a retracted request again over both */
        rc = pd_sched_coloc_add(e->sched, r->room, r->tokens, r->n_prompt, r->sp.max_new_tokens,
                                now);
        if (!rc && r->in_lp) {
            pd__engine_in_lp_begin(r);
            rc = pd_sched_coloc_limit_cache(e->sched, r->room, pd__engine_in_lp_cache_max(r));
        }
        if (rc)
            pd__engine_unregister(e, r);
    }
    if (rc) {
        pd_warn("room=%" PRIu64 " refused by the colocated scheduler: %s", r->room, pd_error_msg());
        pd__engine_emit_end(e, r, PD_END_FAILED, rc, 0);
    }
}

static void coloc_abort(struct pd_engine *e, uint64_t room) {
    struct pd_engine_req *r = pd__engine_find(e, room);
    if (!r)
        return;
    r->aborted = true;
    (void)pd_sched_coloc_abort(e->sched, room);
}

/* One step: prefill chunks, then one token per running request (mixed: both in one forward
 * pass, which the model computes as one extend); a last chunk and every decode row sample the
 * request's next token. */
static bool coloc_iter(struct pd_engine *e, double now) {
    struct pd_coloc_step st;
    int rc = pd_sched_coloc_step(e->sched, now, &st);
    PD_ASSERT(rc == PD_OK);
    e->retractions += st.n_retracted;
    int32_t n = st.n_chunks + st.n_decodes;
    if (n == 0)
        return false;
    PD_ASSERT(n <= e->max_reqs && n <= e->cfg.max_running_requests);
    for (int32_t i = 0; i < st.n_chunks; i++) {
        const struct pd_coloc_chunk *c = &st.chunks[i];
        struct pd_engine_req *r = pd__engine_find(e, c->room);
        PD_ASSERT(r);
        e->seqs[i] = (struct pd_model_seq){.tokens = r->tokens + c->start,
                                           .n_new = c->len,
                                           .n_cached = c->start,
                                           .pages = c->pages,
                                           .n_pages = c->n_pages};
        if (!rc)
            rc = pd__engine_mm_seq(e, r, i, &e->seqs[i]); /* images: positions, embeddings */
        if (!rc)
            rc = pd__engine_in_lp_prepass(e, r, &e->seqs[i]);
    }
    for (int32_t i = 0; i < st.n_decodes; i++) {
        const struct pd_coloc_decode *d = &st.decodes[i];
        struct pd_engine_req *r = pd__engine_find(e, d->room);
        PD_ASSERT(r);
        e->seqs[st.n_chunks + i] = (struct pd_model_seq){.tokens = r->tokens + d->pos,
                                                         .n_new = 1,
                                                         .n_cached = d->pos,
                                                         .pages = d->pages,
                                                         .n_pages = d->n_pages};
        if (!rc) /* past the prompt: the M-RoPE delta of its images */
            rc = pd__engine_mm_seq(e, r, st.n_chunks + i, &e->seqs[st.n_chunks + i]);
    }
    /* a step of decode tokens alone chooses them on the device as decode_iter does */
    bool plain = false, dev = false;
    if (!rc && !st.n_chunks && e->cfg.greedy_on_device) {
        for (int32_t i = 0; i < n; i++)
            e->step_reqs[i] = pd__engine_find(e, st.decodes[i].room);
        dev = pd__engine_device_rows(e, n, &plain);
    }
    if (!rc && st.n_chunks)
        rc = pd_tp_group_extend(e->tp, e->seqs, (int)n, false, e->logits);
    else if (!rc)
        rc = pd__engine_decode_rows(e, n, dev, plain);
    if (rc)
        pd_error("colocated step of %d chunks (%d tokens) + %d decodes failed: %s",
                 (int)st.n_chunks, (int)st.n_prefill_tokens, (int)st.n_decodes, pd_error_msg());
    for (int32_t i = 0; i < n; i++) {
        bool is_chunk = i < st.n_chunks;
        uint64_t room = is_chunk ? st.chunks[i].room : st.decodes[i - st.n_chunks].room;
        struct pd_engine_req *r = pd__engine_find(e, room);
        e->stopped[i] = false;
        if (rc) { /* the model refused the step: these requests end failed */
            e->stopped[i] = true;
            r->fail_status = rc;
            if (!r->aborted)
                coloc_abort(e, room); /* ends at step_done; the END says failed */
            continue;
        }
        if (is_chunk)
            pd__engine_in_lp_score(e, r, e->seqs[i].n_cached + e->seqs[i].n_new - 1, 1,
                                   e->logits + (size_t)i * (size_t)e->vocab);
        if ((is_chunk && !st.chunks[i].last) || r->aborted)
            continue; /* mid-prompt, or ending at step_done anyway */
        if (is_chunk) /* the prompt is computed: its images' embeddings go */
            pd__engine_mm_release(e, r);
        e->stopped[i] = pd__engine_take_token(e, i, r, dev);
    }
    rc = pd_sched_coloc_step_done(e->sched, &st, e->stopped, now);
    PD_ASSERT(rc == PD_OK);
    e->steps++;
    e->mixed_steps += st.n_chunks > 0 && st.n_decodes > 0;
    e->tokens += st.n_prefill_tokens + st.n_decodes;
    return true;
}

static void coloc_drain_ends(struct pd_engine *e, double now) {
    struct pd_sched_end end;
    while (pd_sched_coloc_pop_ended(e->sched, &end) == PD_OK) {
        struct pd_engine_req *r = pd__engine_find(e, end.room);
        PD_ASSERT(r);
        pd_debug("room=%" PRIu64 " colocated end=%s tokens=%d cached=%d", end.room,
                 pd_sched_end_reason_str(end.reason), (int)r->n_out, (int)end.cached_tokens);
        pd__engine_emit_end(e, r, end.reason, PD_OK, end.cached_tokens);
    }
}

static void coloc_counts(const struct pd_engine *e, struct pd_engine_stats *s) {
    struct pd_coloc_counts c;
    pd_sched_coloc_counts(e->sched, &c);
    s->q_waiting = c.waiting;
    s->q_running = c.running;
}

static int coloc_check(const struct pd_engine *e) {
    return pd_sched_coloc_check(e->sched);
}

static void coloc_end_now(struct pd_engine *e, uint64_t room) {
    (void)pd_sched_coloc_abort(e->sched, room);
}

static void coloc_discard_ended(struct pd_engine *e) {
    struct pd_sched_end end;
    while (pd_sched_coloc_pop_ended(e->sched, &end) == PD_OK) {
    }
}

const struct pd_engine_ops pd_engine_coloc_ops = {
    .name = "colocated",
    .step_rows = pd__engine_running_rows, /* admitted: prefilling + running */
    .sched_new = coloc_sched_new,
    .sched_free = coloc_sched_free,
    .add = coloc_add,
    .abort = coloc_abort,
    .iter = coloc_iter,
    .drain_ends = coloc_drain_ends,
    .counts = coloc_counts,
    .check = coloc_check,
    .end_now = coloc_end_now,
    .discard_ended = coloc_discard_ended,
};
