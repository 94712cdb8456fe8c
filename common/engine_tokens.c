/*
 * engine_tokens.c — what the compute thread's roles share for tokens: device penalty slots,
 * choosing a step's output tokens on the device or the host and recording them (decode and
 * colocated), and scoring prompt tokens for input logprobs (prefill and colocated). See
 * common/engine_internal.h.
 */
#include "common/engine_internal.h"

#include "model/backend.h"
#include "common/base/alloc.h"
#include "common/base/log.h"
#include "common/base/status.h"
#include "model/tp_group.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

/* ---- device penalty slots ---- */

int pd__engine_pen_slots_new(struct pd_engine *e, int max_running) {
    int64_t cap = ((int64_t)1 << 30) / ((int64_t)e->vocab * 4);
    int slots = max_running < cap ? max_running : (int)cap;
    if (slots < 1)
        return PD_OK;
    int rc = pd_backend_penalty_reserve(e->be, slots, e->vocab, e->ctx_len);
    if (rc) {
        pd_warn("penalties will be applied on the host: %s", pd_error_msg());
        return PD_OK;
    }
    if (!(e->pen_free = pd_calloc((size_t)slots, sizeof(int32_t))))
        return pd_error_wrap(PD_ENOMEM, "penalty slot list");
    for (int32_t i = 0; i < slots; i++)
        e->pen_free[i] = slots - 1 - i;
    e->n_pen = e->n_pen_free = slots;
    return PD_OK;
}

/* Gives r's slot back: it ended, or a token was recorded without the device (so the slot's
 * state is stale; the next device step sets it again from r's tokens). */
void pd__engine_pen_release(struct pd_engine *e, struct pd_engine_req *r) {
    if (r->pen_slot < 0)
        return;
    e->pen_free[e->n_pen_free++] = r->pen_slot;
    r->pen_slot = -1;
}

/* r's slot, taken and set from its prompt and outputs when it has none. false: no slot free or
 * the state cannot be set; r samples on the host this step. */
static bool pen_slot_ready(struct pd_engine *e, struct pd_engine_req *r) {
    if (r->pen_slot >= 0)
        return true;
    if (e->n_pen_free == 0)
        return false;
    int32_t slot = e->pen_free[e->n_pen_free - 1];
    int rc = pd_backend_penalty_set(e->be, slot, r->tokens, r->n_prompt, r->tokens + r->n_prompt,
                                    r->n_out);
    if (rc) {
        pd_warn("room=%" PRIu64 " penalties stay on the host: %s", r->room, pd_error_msg());
        return false;
    }
    e->n_pen_free--;
    r->pen_slot = slot;
    return true;
}

/* ---- output tokens ---- */

/* smp: the sampler's record of tok (top-n logprobs), NULL for the prefill's first token. */
bool pd__engine_prompt_ok(struct pd_engine *e, struct pd_engine_req *r) {
    for (int32_t i = 0; i < r->n_prompt; i++)
        if (r->tokens[i] < 0 || r->tokens[i] >= e->vocab) {
            pd_errorf(PD_EINVAL,
                      "room %" PRIu64 ": prompt token %d at %d is outside the vocabulary (%d)",
                      r->room, (int)r->tokens[i], (int)i, e->vocab);
            pd_warn("room=%" PRIu64 " refused: %s", r->room, pd_error_msg());
            pd__engine_emit_end(e, r, PD_END_FAILED, PD_EINVAL, 0);
            return false;
        }
    return true;
}

void pd__engine_note_token(struct pd_engine *e, struct pd_engine_req *r, int32_t tok, float logprob,
                           int finish, const struct pd_sample *smp) {
    if (r->samples && r->n_out < r->sp.max_new_tokens) {
        struct pd_sample *s = &r->samples[r->n_out];
        if (smp)
            *s = *smp;
        else
            *s = (struct pd_sample){.token = tok, .logprob = logprob};
    }
    r->tokens[r->n_prompt + r->n_out] = tok;
    r->n_out++;
    if (!finish && r->n_prompt + r->n_out >= e->ctx_len)
        finish = PD_FINISH_LENGTH; /* the context is full */
    r->finish = finish;
    if (finish)
        r->finished = true;
    pd__engine_emit(e, &(struct pd_engine_event){.kind = PD_ENGINE_EV_TOKEN,
                                                 .room = r->room,
                                                 .req = r,
                                                 .token = tok,
                                                 .logprob = logprob,
                                                 .index = r->n_out - 1,
                                                 .finish = finish});
}

/* The rows that choose e->step_reqs[0..n)'s tokens on the device (e->sample_rows; top-n into
 * e->step_top): every request's parameters, its penalty slot, and the next u of its own random
 * stream (greedy rows take none). false when a penalized request gets no slot or a request needs
 * the host sampler (pd_sampler_host_only): nothing is drawn, the step's slots are given back (the
 * host records this step's tokens) and the step downloads the logits. *plain: all greedy without
 * penalties or top-n (the argmax serves). */
bool pd__engine_device_rows(struct pd_engine *e, int32_t n, bool *plain) {
    *plain = true;
    for (int32_t i = 0; i < n; i++) {
        struct pd_engine_req *r = e->step_reqs[i];
        struct pd_sample_row *row = &e->sample_rows[i];
        if (pd_sampler_host_only(&r->sampler)) { /* logit_bias, min_new_tokens: host only */
            for (int32_t j = 0; j < n; j++)
                pd__engine_pen_release(e, e->step_reqs[j]);
            return false;
        }
        pd_sampler_row(&r->sampler, row);
        row->top = row->n_logprobs > 0 ? &e->step_top[i] : NULL;
        if (row->penalized) {
            if (!pen_slot_ready(e, r)) {
                for (int32_t j = 0; j < n; j++)
                    pd__engine_pen_release(e, e->step_reqs[j]);
                return false;
            }
            row->slot = r->pen_slot;
        }
        *plain = *plain && pd_sampling_row_greedy(row) && !row->penalized && !row->n_logprobs;
    }
    for (int32_t i = 0; i < n; i++)
        e->sample_rows[i].u = pd_sampler_next_u(&e->step_reqs[i]->sampler);
    return true;
}

/* Row i's token as the device chose it (device_rows, then pd_model_decode_greedy / _sample),
 * recorded by the request's sampler: its u was taken in device_rows, record takes none. */
static void device_sample(struct pd_engine *e, int32_t i, struct pd_sample *smp) {
    memset(smp, 0, sizeof(*smp));
    smp->token = e->greedy_ids[i];
    smp->logprob = e->greedy_lp[i];
    const struct pd_sample_row *row = &e->sample_rows[i];
    if (row->top) {
        smp->n_top = row->top->n_top;
        memcpy(smp->top_ids, row->top->top_ids, sizeof(int32_t) * (size_t)smp->n_top);
        memcpy(smp->top_logprobs, row->top->top_logprobs, sizeof(float) * (size_t)smp->n_top);
    }
    pd_sampler_record(&e->step_reqs[i]->sampler, smp->token, &smp->finish);
    e->sampled_on_device++;
}

/* The host sampler on a downloaded row; r's device penalty state (if any) is stale after. */
static void host_sample(struct pd_engine *e, struct pd_engine_req *r, float *logits,
                        struct pd_sample *smp) {
    pd_sampler_next(&r->sampler, &e->scratch, logits, smp);
    pd__engine_pen_release(e, r);
    e->sampled_on_host++;
}

/* One decode forward pass over e->seqs[0..n): logits to the host (!dev), or the device's choice
 * per row (device_rows set e->sample_rows: argmax when plain, else the device sampler). */
int pd__engine_decode_rows(struct pd_engine *e, int32_t n, bool dev, bool plain) {
    if (!dev)
        return pd_tp_group_decode(e->tp, e->seqs, (int)n, e->logits);
    if (plain)
        return pd_tp_group_decode_greedy(e->tp, e->seqs, (int)n, e->greedy_ids, e->greedy_lp);
    return pd_tp_group_decode_sample(e->tp, e->seqs, (int)n, e->sample_rows, e->greedy_ids,
                                     e->greedy_lp);
}

/* Row i's output token for r — the device's choice or the host sampler on its logits row —
 * recorded; says whether r finished. */
bool pd__engine_take_token(struct pd_engine *e, int32_t i, struct pd_engine_req *r, bool dev) {
    struct pd_sample smp;
    if (dev)
        device_sample(e, i, &smp);
    else
        host_sample(e, r, e->logits + (size_t)i * (size_t)e->vocab, &smp);
    pd__engine_note_token(e, r, smp.token, smp.logprob, smp.finish, &smp);
    return r->finished;
}

/* ---- input logprobs ---- */

/* Before its scheduler add: the positions to score and the prefix-cache limit that keeps them
 * computed (SGLang too takes no cache hit past logprob_start_len for such a request). */
void pd__engine_in_lp_begin(struct pd_engine_req *r) {
    if (!r->in_lp)
        return;
    r->in_lp_next = r->in_lp_start > 0 ? r->in_lp_start - 1 : 0;
    if (r->in_lp_start == 0)
        r->in_lp[0] = (struct pd_sample){.token = r->tokens[0], .logprob = NAN};
}

int32_t pd__engine_in_lp_cache_max(const struct pd_engine_req *r) {
    return r->in_lp_start > 0 ? r->in_lp_start - 1 : 0;
}

/* Logits rows of positions p0 .. p0+n-1: each scores the prompt token after it, once. */
void pd__engine_in_lp_score(struct pd_engine *e, struct pd_engine_req *r, int32_t p0, int32_t n,
                            const float *logits) {
    if (!r->in_lp)
        return;
    for (int32_t k = 0; k < n; k++) {
        int32_t p = p0 + k;
        if (p != r->in_lp_next || p + 1 >= r->n_prompt)
            continue;
        pd_sampler_score(&r->sampler, &e->scratch, logits + (size_t)k * (size_t)e->vocab,
                         r->tokens[p + 1], &r->in_lp[p + 1 - r->in_lp_start]);
        r->in_lp_next++;
    }
}

/* A chunk of a request that scores positions in it: all but its last token run alone first,
 * every position's logits kept, in pieces of at most max_reqs rows (the model's
 * max_logit_rows, so memory stays that of a step); the last token stays in the step's batch,
 * whose row for it is scored there. *seq is narrowed to that last token. */
int pd__engine_in_lp_prepass(struct pd_engine *e, struct pd_engine_req *r,
                             struct pd_model_seq *seq) {
    int32_t start = seq->n_cached, end = start + seq->n_new - 1; /* run [start, end) here */
    if (!r->in_lp || end <= start || r->in_lp_next >= r->n_prompt - 1 || end <= r->in_lp_next)
        return PD_OK;
    for (int32_t p = start; p < end; p += e->max_reqs) {
        int32_t n = end - p < e->max_reqs ? end - p : e->max_reqs;
        struct pd_model_seq s = {.tokens = r->tokens + p,
                                 .n_new = n,
                                 .n_cached = p,
                                 .pages = seq->pages,
                                 .n_pages = seq->n_pages};
        int rc = pd_tp_group_extend(e->tp, &s, 1, true, e->logits);
        if (rc)
            return pd_error_wrap(rc, "room %" PRIu64 ": prompt logprobs at %d..%d", r->room, (int)p,
                                 (int)(p + n));
        pd__engine_in_lp_score(e, r, p, n, e->logits);
    }
    seq->tokens = r->tokens + end;
    seq->n_new = 1;
    seq->n_cached = end;
    return PD_OK;
}
