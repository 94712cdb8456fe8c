/*
 * engine.c — the compute thread: command intake, one scheduler step at a time, the model call,
 * sampling, and events back to the loop. Everything the thread touches (model, pool, allocator,
 * cache, scheduler, the request registry) is touched by it alone while it runs; the loop sees
 * only the two queues, the published counters and the pages an event names.
 *
 * Step memory (sequence table, logits, stop flags, sampling scratch) is taken at creation for
 * the largest step; requests' memory is taken by the loop when they arrive (pd_engine_req_new)
 * and by the schedulers at add. A step itself allocates nothing.
 */
#include "common/engine.h"
#include "common/server_args.h"

#include "common/base/alloc.h"
#include "model/backend.h"
#include "model/kv_pool.h"
#include "common/base/log.h"
#include "model/model.h"
#include "common/page_alloc.h"
#include "common/radix_cache.h"
#include "common/base/room_map.h"
#include "common/sched_coloc.h"
#include "common/sched_decode.h"
#include "common/sched_prefill.h"
#include "common/base/spsc.h"
#include "common/base/status.h"
#include "model/tp_group.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define IDLE_WAIT_MS 20 /* an idle compute thread still steps this often: timeouts expire */

struct pd_engine {
    struct pd_engine_config cfg;
    /* the model over cfg.tp_size ranks (common/tp_group.h); every model call goes through it */
    struct pd_tp_group *tp;
    struct pd_backend *be;  /* rank 0's */
    struct pd_model *model; /* rank 0's: config and context length */
    struct pd_kv_pool *kv;  /* rank 0's: the logical pool's page count and geometry */
    struct pd_page_alloc *pa;
    struct pd_radix_cache *rc;
    struct pd_sched_prefill *sp;
    struct pd_sched_decode *sd;
    struct pd_sched_coloc *sc; /* colocated role */
    int vocab, ctx_len, max_reqs, chunk;

    /* request registry (compute thread): room → slot → req */
    struct pd_room_map rooms;
    struct pd_engine_req **reqs; /* [cap] */
    int32_t *free_slots;         /* [cap] */
    int32_t n_free, cap;

    /* step memory */
    struct pd_model_seq *seqs;         /* [max_reqs] */
    float *logits;                     /* [max_reqs][vocab] */
    int32_t *greedy_ids;               /* [max_reqs] greedy fast path */
    float *greedy_lp;                  /* [max_reqs] */
    struct pd_sample_row *sample_rows; /* [max_reqs] device sampling fast path */
    struct pd_sample *step_top;        /* [max_reqs] its top-n logprobs */
    struct pd_engine_req **step_reqs;  /* [max_reqs] the step's requests, in row order */
    /* device penalty slots (pd_backend_penalty_reserve) free for running requests */
    int32_t *pen_free; /* [n_pen] */
    int32_t n_pen_free, n_pen;
    bool *stopped; /* [max_running] */
    struct pd_sampling_scratch scratch;

    /* threads */
    struct pd_spsc cmdq, evq;
    pthread_t thread;
    bool started, joined;
    pthread_mutex_t mu;
    pthread_cond_t cv_cmd, cv_space;
    bool cmd_pending;
    atomic_bool stop;
    atomic_bool exited;
    uv_async_t *async;
    uv_loop_t *loop;
    pd_engine_event_fn fn;
    void *fn_ctx;

    /* published counters */
    pthread_mutex_t stats_mu;
    struct pd_engine_stats stats;
    int64_t steps, tokens, retractions, mixed_steps;
    int64_t sampled_on_device, sampled_on_host;
    int64_t unsignalled; /* events pushed since the loop was last woken */
    atomic_int last_check;
    bool check_steps;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- requests ---- */

int pd_engine_req_new(uint64_t room, const int32_t *tokens, int32_t n, int page_size,
                      const struct pd_sampling_params *sp, struct pd_engine_req **out) {
    *out = NULL;
    if (n <= 0 || page_size <= 0 || sp->max_new_tokens < 1)
        return pd_errorf(PD_EINVAL, "room %" PRIu64 ": %d prompt tokens, max_new_tokens %d", room,
                         (int)n, sp->max_new_tokens);
    struct pd_engine_req *r = pd_calloc(1, sizeof(*r));
    if (!r)
        return PD_ENOMEM;
    int64_t total = (int64_t)n + sp->max_new_tokens;
    r->room = room;
    r->n_prompt = n;
    r->sp = *sp;
    r->cap_pages = (int32_t)((total + page_size - 1) / page_size);
    r->tokens = pd_malloc((size_t)total * sizeof(int32_t));
    r->pages = pd_malloc((size_t)r->cap_pages * sizeof(uint32_t));
    if (!r->tokens || !r->pages) {
        pd_engine_req_free(r);
        return pd_error_wrap(PD_ENOMEM, "room %" PRIu64 ": request of %d tokens", room, (int)n);
    }
    memcpy(r->tokens, tokens, (size_t)n * sizeof(int32_t));
    r->slot = -1;
    r->pen_slot = -1;
    r->in_lp_start = -1;
    *out = r;
    return PD_OK;
}

void pd_engine_req_free(struct pd_engine_req *r) {
    if (!r)
        return;
    if (r->has_sampler)
        pd_sampler_free(&r->sampler);
    pd_free(r->tokens);
    pd_free(r->pages);
    pd_free(r->samples);
    pd_free(r->in_lp);
    pd_free(r);
}

static struct pd_engine_req *find_req(struct pd_engine *e, uint64_t room) {
    int32_t slot = pd_room_map_get(&e->rooms, room);
    return slot >= 0 ? e->reqs[slot] : NULL;
}

static int register_req(struct pd_engine *e, struct pd_engine_req *r) {
    if (e->n_free == 0)
        return pd_errorf(PD_EFULL, "room %" PRIu64 ": %d requests live already", r->room,
                         (int)e->cap);
    if (pd_room_map_get(&e->rooms, r->room) >= 0)
        return pd_errorf(PD_EINVAL, "room %" PRIu64 " already has a live request", r->room);
    int32_t slot = e->free_slots[--e->n_free];
    int rc = pd_room_map_put(&e->rooms, r->room, slot);
    PD_ASSERT(rc == PD_OK);
    e->reqs[slot] = r;
    r->slot = slot;
    return PD_OK;
}

static void unregister_req(struct pd_engine *e, struct pd_engine_req *r) {
    PD_ASSERT(r->slot >= 0 && e->reqs[r->slot] == r);
    pd_room_map_del(&e->rooms, r->room);
    e->reqs[r->slot] = NULL;
    e->free_slots[e->n_free++] = r->slot;
    r->slot = -1;
}

/* ---- creation ---- */

static int coloc_new(struct pd_engine *e, const struct pd_engine_config *cfg);

/* Device penalty state for up to the decode batch (capped at 1 GiB of slots) on rank 0's
 * backend, taken after the KV pools were sized (out of what mem_fraction_static leaves).
 * Without it, penalized steps sample on the host. */
static int pen_slots_new(struct pd_engine *e, int max_running) {
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

int pd_engine_new(const struct pd_engine_config *cfg, struct pd_engine **out) {
    *out = NULL;
    int rc;
    if (cfg->role != PD_ENGINE_PREFILL && cfg->role != PD_ENGINE_DECODE &&
        cfg->role != PD_ENGINE_COLOC)
        return pd_errorf(PD_EINVAL, "engine: role %d is not prefill, decode or colocated",
                         cfg->role);
    if (cfg->page_size <= 0 || cfg->max_queued_requests <= 0 || cfg->max_running_requests <= 0)
        return pd_errorf(PD_EINVAL, "engine: page size %d, max queued %d, max running %d",
                         cfg->page_size, cfg->max_queued_requests, cfg->max_running_requests);
    struct pd_engine *e = pd_calloc(1, sizeof(*e));
    if (!e)
        return PD_ENOMEM;
    e->cfg = *cfg;
    e->cap = cfg->max_queued_requests;
    atomic_init(&e->stop, false);
    atomic_init(&e->exited, false);
    atomic_init(&e->last_check, -1);
    pthread_mutex_init(&e->mu, NULL);
    pthread_mutex_init(&e->stats_mu, NULL);
    pthread_cond_init(&e->cv_cmd, NULL);
    pthread_cond_init(&e->cv_space, NULL);

    /* step sizes: prefill runs a token budget of chunks; decode a batch of single tokens, and
     * recomputes retracted requests in chunks */
    int budget =
        cfg->max_prefill_tokens > 0 ? cfg->max_prefill_tokens : PD_DEFAULT_MAX_PREFILL_TOKENS;
    if (cfg->chunked_prefill_size > 0 && cfg->chunked_prefill_size < budget)
        budget = cfg->chunked_prefill_size;
    e->chunk = budget;
    int max_tokens = budget, max_reqs;
    if (cfg->role == PD_ENGINE_PREFILL) {
        max_reqs = budget < 256 ? budget : 256;
        if (max_reqs > cfg->max_queued_requests)
            max_reqs = cfg->max_queued_requests;
    } else {
        /* colocated: a step's rows are its admitted requests (prefilling + running), its tokens
         * the chunk budget or one per running request, whichever is more */
        max_reqs = cfg->max_running_requests;
        if (max_tokens < max_reqs)
            max_tokens = max_reqs;
    }
    e->max_reqs = max_reqs;

    struct pd_tp_group_opts go = {
        .size = cfg->tp_size > 0 ? cfg->tp_size : 1,
        .backend = {.kind = cfg->device == PD_BACKEND_CUDA ? PD_BACKEND_CUDA : PD_BACKEND_CPU,
                    .threads = cfg->threads,
                    .device_index = cfg->device_index},
        .model_path = cfg->model_path,
        .model = {.max_tokens = max_tokens,
                  .max_reqs = max_reqs,
                  .max_logit_rows = max_reqs,
                  .context_length = cfg->context_length,
                  .page_size = cfg->page_size},
        /* as pdserve-generate with the same --kv-cache-dtype: the disaggregated path must equal
         * it bit for bit (the transfer moves the pool's bytes as they are) */
        .kv_dtype = (enum pd_dtype)cfg->kv_dtype,
        .kv_dtype_auto = cfg->kv_dtype_auto,
        .n_pages = cfg->n_pages,
        .mem_fraction_static = cfg->mem_fraction_static,
    };
    if ((rc = pd_tp_group_new(&go, &e->tp)) != PD_OK)
        goto fail;
    e->be = pd_tp_group_backend(e->tp, 0);
    e->model = pd_tp_group_model(e->tp, 0);
    e->kv = pd_tp_group_kv(e->tp, 0);
    const struct pd_model_config *mc = pd_model_config_of(e->model);
    e->vocab = mc->vocab_size;
    e->ctx_len = pd_model_context_length(e->model);
    /* penalty slots on rank 0's backend (the rank that samples); taken after the pools were
     * sized, out of the memory mem_fraction_static leaves (at most 1 GiB, see pen_slots_new) */
    if (cfg->greedy_on_device && cfg->role != PD_ENGINE_PREFILL &&
        (rc = pen_slots_new(e, max_reqs)) != PD_OK)
        goto fail;
    if (e->kv->layout.n_pages > INT32_MAX / 2) {
        rc = pd_errorf(PD_ERANGE, "KV pool of %" PRId64 " pages is too large",
                       (int64_t)e->kv->layout.n_pages);
        goto fail;
    }
    if ((rc = pd_page_alloc_new((int32_t)e->kv->layout.n_pages, &e->pa)) != PD_OK)
        goto fail;
    if (cfg->role == PD_ENGINE_COLOC) {
        if ((rc = coloc_new(e, cfg)) != PD_OK)
            goto fail;
    } else if (cfg->role == PD_ENGINE_PREFILL) {
        if ((rc = pd_radix_cache_new(e->pa, cfg->page_size, cfg->disable_prefix_cache, &e->rc)) !=
            PD_OK)
            goto fail;
        struct pd_sched_prefill_config sc = {
            .page_size = cfg->page_size,
            .chunked_prefill_size = cfg->chunked_prefill_size,
            .max_prefill_tokens = cfg->max_prefill_tokens > 0 ? cfg->max_prefill_tokens
                                                              : PD_DEFAULT_MAX_PREFILL_TOKENS,
            .max_queued_requests = cfg->max_queued_requests,
            .bootstrap_timeout_s = cfg->bootstrap_timeout_s > 0 ? cfg->bootstrap_timeout_s : 300,
        };
        if ((rc = pd_sched_prefill_new(&sc, e->pa, e->rc, &e->sp)) != PD_OK)
            goto fail;
    } else {
        struct pd_sched_decode_config dc = {
            .page_size = cfg->page_size,
            .max_running_requests = cfg->max_running_requests,
            .max_queued_requests = cfg->max_queued_requests,
            .waiting_timeout_s = cfg->waiting_timeout_s > 0 ? cfg->waiting_timeout_s : 300,
        };
        pd_sched_decode_config_defaults(&dc);
        if (cfg->new_token_ratio > 0) {
            dc.init_new_token_ratio = cfg->new_token_ratio < 1 ? cfg->new_token_ratio : 1;
            if (dc.min_new_token_ratio > dc.init_new_token_ratio)
                dc.min_new_token_ratio = dc.init_new_token_ratio;
        }
        if ((rc = pd_sched_decode_new(&dc, e->pa, &e->sd)) != PD_OK)
            goto fail;
    }
    if ((rc = pd_room_map_init(&e->rooms, e->cap)) != PD_OK)
        goto fail;
    e->reqs = pd_calloc((size_t)e->cap, sizeof(*e->reqs));
    e->free_slots = pd_calloc((size_t)e->cap, sizeof(int32_t));
    e->seqs = pd_calloc((size_t)max_reqs, sizeof(*e->seqs));
    e->logits = pd_calloc((size_t)max_reqs * (size_t)e->vocab, sizeof(float));
    e->greedy_ids = pd_calloc((size_t)max_reqs, sizeof(int32_t));
    e->greedy_lp = pd_calloc((size_t)max_reqs, sizeof(float));
    e->sample_rows = pd_calloc((size_t)max_reqs, sizeof(*e->sample_rows));
    e->step_top = pd_calloc((size_t)max_reqs, sizeof(*e->step_top));
    e->step_reqs = pd_calloc((size_t)max_reqs, sizeof(*e->step_reqs));
    e->stopped = pd_calloc((size_t)cfg->max_running_requests, sizeof(bool));
    if (!e->reqs || !e->free_slots || !e->seqs || !e->logits || !e->stopped || !e->greedy_ids ||
        !e->greedy_lp || !e->sample_rows || !e->step_top || !e->step_reqs) {
        rc = pd_error_wrap(PD_ENOMEM, "engine step buffers");
        goto fail;
    }
    for (int32_t i = 0; i < e->cap; i++)
        e->free_slots[i] = e->cap - 1 - i;
    e->n_free = e->cap;
    if ((rc = pd_sampling_scratch_init(&e->scratch, e->vocab)) != PD_OK)
        goto fail;
    /* every request has at most ~4 commands in flight; the loop sheds beyond the queue */
    uint32_t qcap = (uint32_t)e->cap * 4 + 256;
    if ((rc = pd_spsc_init(&e->cmdq, qcap, sizeof(struct pd_engine_cmd))) != PD_OK ||
        (rc = pd_spsc_init(&e->evq, qcap, sizeof(struct pd_engine_event))) != PD_OK)
        goto fail;
    e->stats.pages_total = (int32_t)e->kv->layout.n_pages;
    e->stats.pages_free = e->stats.pages_total;
    *out = e;
    return PD_OK;
fail:
    pd_engine_free(e);
    return rc;
}

void pd_engine_get_info(const struct pd_engine *e, struct pd_engine_info *o) {
    const struct pd_model_config *mc = pd_model_config_of(e->model);
    *o = (struct pd_engine_info){
        .role = e->cfg.role,
        .vocab_size = e->vocab,
        .context_length = e->ctx_len,
        .n_layers = e->kv->layout.n_layers,
        .kv_heads = e->kv->layout.kv_heads,
        .head_dim = e->kv->layout.head_dim,
        .page_size = e->kv->layout.page_size,
        .page_bytes = pd_tp_group_page_bytes(e->tp),
        .n_pages = (int32_t)e->kv->layout.n_pages,
        .pool_base = e->kv->layout.base,
        .tp_size = pd_tp_group_size(e->tp),
        .shard_page_bytes = e->kv->layout.page_bytes,
        .pool_on_device = pd_backend_kind_of(e->be) == PD_BACKEND_CUDA,
        .device_index = e->cfg.device_index,
        .dtype = pd_dtype_name(e->kv->layout.dtype),
        .kv_cache_dtype = pd_dtype_kv_name(e->kv->layout.dtype),
        .backend = pd_backend_name(e->be),
        .model_type = pd_arch_model_type(mc->arch),
        .architecture = pd_arch_hf_name(mc->arch),
        .eos_ids = mc->eos_token_ids,
        .n_eos_ids = mc->n_eos_token_ids,
    };
    for (int r = 0; r < o->tp_size; r++)
        o->pool_bases[r] = pd_tp_group_kv(e->tp, r)->layout.base;
}

/* ---- events out ---- */

static void emit(struct pd_engine *e, const struct pd_engine_event *ev) {
    e->unsignalled++;
    while (pd_spsc_push(&e->evq, ev) != PD_OK) {
        /* the loop is behind: wake it and wait for room (the compute thread may block) */
        uv_async_send(e->async);
        pthread_mutex_lock(&e->mu);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 5 * 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&e->cv_space, &e->mu, &ts);
        pthread_mutex_unlock(&e->mu);
    }
}

/* ---- device penalty slots ---- */

/* Gives r's slot back: it ended, or a token was recorded without the device (so the slot's
 * state is stale; the next device step sets it again from r's tokens). */
static void pen_slot_release(struct pd_engine *e, struct pd_engine_req *r) {
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

static void emit_end(struct pd_engine *e, struct pd_engine_req *r, int reason, int status,
                     int32_t cached_tokens) {
    struct pd_engine_event ev = {.kind = PD_ENGINE_EV_END,
                                 .room = r->room,
                                 .req = r,
                                 .reason = r->fail_status ? PD_END_FAILED
                                           : r->finished  ? PD_END_DONE
                                                          : reason,
                                 .finish = r->finish,
                                 .status = status ? status : r->fail_status,
                                 .cached_tokens = cached_tokens,
                                 .n_output = r->n_out};
    pen_slot_release(e, r);
    if (r->slot >= 0)
        unregister_req(e, r);
    emit(e, &ev);
}

/* ---- input logprobs ---- */

/* Before its scheduler add: the positions to score and the prefix-cache limit that keeps them
 * computed (SGLang too takes no cache hit past logprob_start_len for such a request). */
static void in_lp_begin(struct pd_engine_req *r) {
    if (!r->in_lp)
        return;
    r->in_lp_next = r->in_lp_start > 0 ? r->in_lp_start - 1 : 0;
    if (r->in_lp_start == 0)
        r->in_lp[0] = (struct pd_sample){.token = r->tokens[0], .logprob = NAN};
}

static int32_t in_lp_cache_max(const struct pd_engine_req *r) {
    return r->in_lp_start > 0 ? r->in_lp_start - 1 : 0;
}

/* Logits rows of positions p0 .. p0+n-1: each scores the prompt token after it, once. */
static void in_lp_score(struct pd_engine *e, struct pd_engine_req *r, int32_t p0, int32_t n,
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
static int in_lp_prepass(struct pd_engine *e, struct pd_engine_req *r, struct pd_model_seq *seq) {
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
        in_lp_score(e, r, p, n, e->logits);
    }
    seq->tokens = r->tokens + end;
    seq->n_new = 1;
    seq->n_cached = end;
    return PD_OK;
}

/* ---- prefill ---- */

static void prefill_add(struct pd_engine *e, struct pd_engine_req *r, double now) {
    struct pd_sampling_params sp = r->sp;
    sp.max_new_tokens = 1; /* prefill samples the first token only */
    int rc = pd_sampler_init(&r->sampler, &sp, e->vocab, r->tokens, r->n_prompt,
                             pd_model_config_of(e->model)->eos_token_ids,
                             pd_model_config_of(e->model)->n_eos_token_ids);
    r->has_sampler = rc == PD_OK;
    if (!rc)
        rc = register_req(e, r);
    if (!rc) {
        rc = pd_sched_prefill_add(e->sp, r->room, r->tokens, r->n_prompt, now);
        if (!rc && r->in_lp) {
            in_lp_begin(r);
            rc = pd_sched_prefill_limit_cache(e->sp, r->room, in_lp_cache_max(r));
        }
        if (rc)
            unregister_req(e, r);
    }
    if (rc) {
        pd_warn("room=%" PRIu64 " refused by the prefill scheduler: %s", r->room, pd_error_msg());
        emit_end(e, r, PD_END_FAILED, rc, 0);
    }
}

static void prefill_xfer_end(struct pd_engine *e, uint64_t room, int status, double now) {
    struct pd_engine_req *r = find_req(e, room);
    if (!r)
        return;
    if (status == PD_OK) {
        if (pd_sched_prefill_transfer_done(e->sp, room, PD_OK, now) != PD_OK)
            (void)pd_sched_prefill_release(e->sp, room); /* aborted meanwhile: draining */
    } else {
        (void)pd_sched_prefill_transfer_done(e->sp, room, status, now);
    }
}

static void prefill_abort(struct pd_engine *e, uint64_t room) {
    struct pd_engine_req *r = find_req(e, room);
    if (!r)
        return;
    r->aborted = true;
    bool quiesce = false;
    if (pd_sched_prefill_abort(e->sp, room, &quiesce) == PD_OK && quiesce)
        emit(e, &(struct pd_engine_event){.kind = PD_ENGINE_EV_QUIESCE, .room = room, .req = r});
}

/* Runs batch chunks [i0, i0+n) through extend; samples the first token of finished prompts. */
static int prefill_run(struct pd_engine *e, struct pd_prefill_batch *b, int32_t i0, int32_t n) {
    for (int32_t k = 0; k < n; k++) {
        struct pd_prefill_chunk *c = &b->chunks[i0 + k];
        struct pd_engine_req *r = find_req(e, c->room);
        PD_ASSERT(r);
        e->seqs[k] = (struct pd_model_seq){.tokens = r->tokens + c->start,
                                           .n_new = c->len,
                                           .n_cached = c->start,
                                           .pages = c->pages,
                                           .n_pages = c->n_pages};
        int rc = in_lp_prepass(e, r, &e->seqs[k]);
        if (rc)
            return rc;
    }
    int rc = pd_tp_group_extend(e->tp, e->seqs, (int)n, false, e->logits);
    if (rc)
        return rc;
    for (int32_t k = 0; k < n; k++) {
        struct pd_prefill_chunk *c = &b->chunks[i0 + k];
        struct pd_engine_req *r = find_req(e, c->room);
        in_lp_score(e, r, e->seqs[k].n_cached + e->seqs[k].n_new - 1, 1,
                    e->logits + (size_t)k * (size_t)e->vocab);
        if (!c->last)
            continue;
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
    int rc = pd_sched_prefill_step(e->sp, now, &b);
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
    rc = pd_sched_prefill_batch_done(e->sp, &b, now);
    PD_ASSERT(rc == PD_OK);
    e->steps++;
    e->tokens += b.n_tokens;
    for (int32_t i = 0; i < b.n; i++) {
        struct pd_prefill_chunk *c = &b.chunks[i];
        struct pd_engine_req *r = find_req(e, c->room);
        if (c->dropped || !r) {
            if (r && c->quiesce) /* sent pages may still be read: the loop aborts the room */
                emit(e, &(struct pd_engine_event){
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
        if (c->send_end == c->send_begin && !c->last)
            continue;
        struct pd_engine_event ev = {.kind = PD_ENGINE_EV_SEND,
                                     .room = c->room,
                                     .req = r,
                                     .begin = c->send_begin,
                                     .end = c->send_end,
                                     .last = c->last,
                                     .token = -1,
                                     .cached_tokens = c->cached_tokens};
        if (c->last) {
            ev.token = r->tokens[r->n_prompt];
            ev.logprob = r->first_logprob;
        }
        emit(e, &ev);
    }
    return true;
}

/* ---- decode ---- */

static void decode_add(struct pd_engine *e, struct pd_engine_req *r, double now) {
    int rc = pd_sampler_init(&r->sampler, &r->sp, e->vocab, r->tokens, r->n_prompt,
                             pd_model_config_of(e->model)->eos_token_ids,
                             pd_model_config_of(e->model)->n_eos_token_ids);
    r->has_sampler = rc == PD_OK;
    if (!rc)
        rc = register_req(e, r);
    if (!rc) {
        rc = pd_sched_decode_add(e->sd, r->room, r->n_prompt, r->sp.max_new_tokens, now);
        if (rc)
            unregister_req(e, r);
    }
    if (rc) {
        pd_warn("room=%" PRIu64 " refused by the decode scheduler: %s", r->room, pd_error_msg());
        emit_end(e, r, PD_END_FAILED, rc, 0);
    }
}

/* smp: the sampler's record of tok (top-n logprobs), NULL for the prefill's first token. */
static void note_token(struct pd_engine *e, struct pd_engine_req *r, int32_t tok, float logprob,
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
    emit(e, &(struct pd_engine_event){.kind = PD_ENGINE_EV_TOKEN,
                                      .room = r->room,
                                      .req = r,
                                      .token = tok,
                                      .logprob = logprob,
                                      .index = r->n_out - 1,
                                      .finish = finish});
}

static void decode_xfer_end(struct pd_engine *e, const struct pd_engine_cmd *c, double now) {
    struct pd_engine_req *r = find_req(e, c->room);
    if (!r)
        return;
    if (c->status == PD_OK && !r->aborted && r->n_out == 0) {
        if (c->first_token < 0 || c->first_token >= e->vocab) {
            pd_warn("room=%" PRIu64 " done notice carries token %d outside the vocabulary", r->room,
                    (int)c->first_token);
            (void)pd_sched_decode_transfer_done(e->sd, c->room, PD_EINVAL, now);
            (void)pd_sched_decode_release(e->sd, c->room);
            return;
        }
        enum pd_finish fin;
        pd_sampler_accept(&r->sampler, c->first_token, &fin);
        pen_slot_release(e, r); /* recorded on the host: a slot's state would be stale */
        note_token(e, r, c->first_token, c->first_logprob, fin, NULL);
        if (pd_sched_decode_transfer_done(e->sd, c->room, PD_OK, now) != PD_OK) {
            (void)pd_sched_decode_release(e->sd, c->room); /* timed out meanwhile */
            return;
        }
        bool q;
        if (r->finished) /* EOS or a stop id first: end it now (no-op if already ended) */
            (void)pd_sched_decode_abort(e->sd, c->room, &q);
        return;
    }
    (void)pd_sched_decode_transfer_done(e->sd, c->room, c->status ? c->status : PD_ECANCELED, now);
    (void)pd_sched_decode_release(e->sd, c->room);
}

static void decode_abort(struct pd_engine *e, uint64_t room) {
    struct pd_engine_req *r = find_req(e, room);
    if (!r)
        return;
    r->aborted = true;
    bool quiesce = false;
    if (pd_sched_decode_abort(e->sd, room, &quiesce) == PD_OK && quiesce)
        emit(e, &(struct pd_engine_event){.kind = PD_ENGINE_EV_QUIESCE, .room = room, .req = r});
}

/* A retracted request's KV rebuilt here: prompt + generated tokens but the last, in chunks. */
static int recompute(struct pd_engine *e, struct pd_engine_req *r,
                     const struct pd_decode_admit *a) {
    int32_t n = r->n_prompt + r->n_out - 1;
    for (int32_t done = 0; done < n;) {
        int32_t len = n - done < e->chunk ? n - done : e->chunk;
        struct pd_model_seq s = {r->tokens + done, len, done, a->pages, a->n_pages};
        int rc = pd_tp_group_extend(e->tp, &s, 1, false, e->logits);
        if (rc)
            return rc;
        done += len;
        e->tokens += len;
    }
    return PD_OK;
}

/* ---- choosing a step's tokens ---- */

/* The rows that choose e->step_reqs[0..n)'s tokens on the device (e->sample_rows; top-n into
 * e->step_top): every request's parameters, its penalty slot, and the next u of its own random
 * stream (greedy rows take none). false when a penalized request gets no slot or a request needs
 * the host sampler (pd_sampler_host_only): nothing is drawn, the step's slots are given back (the
 * host records this step's tokens) and the step downloads the logits. *plain: all greedy without
 * penalties or top-n (the argmax serves). */
static bool device_rows(struct pd_engine *e, int32_t n, bool *plain) {
    *plain = true;
    for (int32_t i = 0; i < n; i++) {
        struct pd_engine_req *r = e->step_reqs[i];
        struct pd_sample_row *row = &e->sample_rows[i];
        if (pd_sampler_host_only(&r->sampler)) { /* logit_bias, min_new_tokens: host only */
            for (int32_t j = 0; j < n; j++)
                pen_slot_release(e, e->step_reqs[j]);
            return false;
        }
        pd_sampler_row(&r->sampler, row);
        row->top = row->n_logprobs > 0 ? &e->step_top[i] : NULL;
        if (row->penalized) {
            if (!pen_slot_ready(e, r)) {
                for (int32_t j = 0; j < n; j++)
                    pen_slot_release(e, e->step_reqs[j]);
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
    pen_slot_release(e, r);
    e->sampled_on_host++;
}

/* One decode forward pass over e->seqs[0..n): logits to the host (!dev), or the device's choice
 * per row (device_rows set e->sample_rows: argmax when plain, else the device sampler). */
static int decode_rows(struct pd_engine *e, int32_t n, bool dev, bool plain) {
    if (!dev)
        return pd_tp_group_decode(e->tp, e->seqs, (int)n, e->logits);
    if (plain)
        return pd_tp_group_decode_greedy(e->tp, e->seqs, (int)n, e->greedy_ids, e->greedy_lp);
    return pd_tp_group_decode_sample(e->tp, e->seqs, (int)n, e->sample_rows, e->greedy_ids,
                                     e->greedy_lp);
}

/* Row i's output token for r — the device's choice or the host sampler on its logits row —
 * recorded; says whether r finished. */
static bool take_token(struct pd_engine *e, int32_t i, struct pd_engine_req *r, bool dev) {
    struct pd_sample smp;
    if (dev)
        device_sample(e, i, &smp);
    else
        host_sample(e, r, e->logits + (size_t)i * (size_t)e->vocab, &smp);
    note_token(e, r, smp.token, smp.logprob, smp.finish, &smp);
    return r->finished;
}

static bool decode_iter(struct pd_engine *e, double now) {
    struct pd_decode_step st;
    int rc = pd_sched_decode_step(e->sd, now, &st);
    PD_ASSERT(rc == PD_OK);
    e->retractions += st.n_retracted;
    for (int32_t i = 0; i < st.n_quiesce; i++) {
        struct pd_engine_req *r = find_req(e, st.quiesce[i]);
        pd_info("room=%" PRIu64 " timed out waiting for its KV (--waiting-timeout)", st.quiesce[i]);
        emit(e, &(struct pd_engine_event){
                    .kind = PD_ENGINE_EV_QUIESCE, .room = st.quiesce[i], .req = r});
    }
    for (int32_t i = 0; i < st.n_admitted; i++) {
        const struct pd_decode_admit *a = &st.admitted[i];
        struct pd_engine_req *r = find_req(e, a->room);
        PD_ASSERT(r && a->n_pages <= r->cap_pages);
        if (r->t_scheduled == 0)
            r->t_scheduled = now;
        for (int32_t p = 0; p < a->n_pages; p++)
            r->pages[p] = (uint32_t)a->pages[p];
        r->n_pages = a->n_pages;
        if (!r->local) {
            emit(e,
                 &(struct pd_engine_event){.kind = PD_ENGINE_EV_ADMIT, .room = a->room, .req = r});
            continue;
        }
        int st_rc = recompute(e, r, a);
        if (st_rc)
            pd_error("room=%" PRIu64 " recompute failed: %s", r->room, pd_error_msg());
        else
            pd_debug("room=%" PRIu64 " recomputed locally (%d tokens)", r->room,
                     (int)(r->n_prompt + r->n_out - 1));
        (void)pd_sched_decode_transfer_done(e->sd, a->room, st_rc, now);
        if (st_rc)
            (void)pd_sched_decode_release(e->sd, a->room);
    }
    if (st.n_batch == 0)
        return st.n_admitted > 0 || st.n_quiesce > 0;
    int32_t nb = st.n_batch;
    PD_ASSERT(nb <= e->max_reqs);
    for (int32_t i = 0; i < nb; i++) {
        const struct pd_decode_entry *d = &st.batch[i];
        struct pd_engine_req *r = find_req(e, d->room);
        PD_ASSERT(r);
        e->seqs[i] = (struct pd_model_seq){.tokens = r->tokens + d->pos,
                                           .n_new = 1,
                                           .n_cached = d->pos,
                                           .pages = d->pages,
                                           .n_pages = d->n_pages};
    }
    for (int32_t i = 0; i < nb; i++)
        e->step_reqs[i] = find_req(e, st.batch[i].room);
    bool plain = false, dev = e->cfg.greedy_on_device && device_rows(e, nb, &plain);
    rc = decode_rows(e, nb, dev, plain);
    if (rc)
        pd_error("decode step of %d requests failed: %s", (int)nb, pd_error_msg());
    for (int32_t i = 0; i < nb; i++) {
        struct pd_engine_req *r = e->step_reqs[i];
        if (rc) { /* the model refused the step: these requests end failed */
            e->stopped[i] = true;
            r->fail_status = rc;
            continue;
        }
        e->stopped[i] = take_token(e, i, r, dev);
    }
    rc = pd_sched_decode_batch_done(e->sd, &st, e->stopped, now);
    PD_ASSERT(rc == PD_OK);
    e->steps++;
    e->tokens += nb;
    return true;
}

/* ---- colocated ---- */

static int coloc_new(struct pd_engine *e, const struct pd_engine_config *cfg) {
    int rc = pd_radix_cache_new(e->pa, cfg->page_size, cfg->disable_prefix_cache, &e->rc);
    if (rc)
        return rc;
    struct pd_sched_coloc_config cc = {
        .page_size = cfg->page_size,
        .chunked_prefill_size = cfg->chunked_prefill_size,
        .max_prefill_tokens =
            cfg->max_prefill_tokens > 0 ? cfg->max_prefill_tokens : PD_DEFAULT_MAX_PREFILL_TOKENS,
        .max_running_requests = cfg->max_running_requests,
        .max_queued_requests = cfg->max_queued_requests,
    };
    pd_sched_coloc_config_defaults(&cc);
    cc.mixed_chunk = cfg->mixed_chunk;
    if (cfg->new_token_ratio > 0) {
        cc.init_new_token_ratio = cfg->new_token_ratio < 1 ? cfg->new_token_ratio : 1;
        if (cc.min_new_token_ratio > cc.init_new_token_ratio)
            cc.min_new_token_ratio = cc.init_new_token_ratio;
    }
    return pd_sched_coloc_new(&cc, e->pa, e->rc, &e->sc);
}

static void coloc_add(struct pd_engine *e, struct pd_engine_req *r, double now) {
    /* one forward pass carries many requests: a token the model would refuse must not get into
     * a step and fail the requests batched with it */
    for (int32_t i = 0; i < r->n_prompt; i++)
        if (r->tokens[i] < 0 || r->tokens[i] >= e->vocab) {
            pd_errorf(PD_EINVAL,
                      "room %" PRIu64 ": prompt token %d at %d is outside the vocabulary "
                      "(%d)",
                      r->room, (int)r->tokens[i], (int)i, e->vocab);
            pd_warn("room=%" PRIu64 " refused: %s", r->room, pd_error_msg());
            emit_end(e, r, PD_END_FAILED, PD_EINVAL, 0);
            return;
        }
    int rc = pd_sampler_init(&r->sampler, &r->sp, e->vocab, r->tokens, r->n_prompt,
                             pd_model_config_of(e->model)->eos_token_ids,
                             pd_model_config_of(e->model)->n_eos_token_ids);
    r->has_sampler = rc == PD_OK;
    if (!rc)
        rc = register_req(e, r);
    if (!rc) {
        /* r->tokens holds the prompt, then the outputs note_token writes: the scheduler
         * prefills a retracted request again over both */
        rc = pd_sched_coloc_add(e->sc, r->room, r->tokens, r->n_prompt, r->sp.max_new_tokens, now);
        if (!rc && r->in_lp) {
            in_lp_begin(r);
            rc = pd_sched_coloc_limit_cache(e->sc, r->room, in_lp_cache_max(r));
        }
        if (rc)
            unregister_req(e, r);
    }
    if (rc) {
        pd_warn("room=%" PRIu64 " refused by the colocated scheduler: %s", r->room, pd_error_msg());
        emit_end(e, r, PD_END_FAILED, rc, 0);
    }
}

static void coloc_abort(struct pd_engine *e, uint64_t room) {
    struct pd_engine_req *r = find_req(e, room);
    if (!r)
        return;
    r->aborted = true;
    (void)pd_sched_coloc_abort(e->sc, room);
}

/* One step: prefill chunks, then one token per running request (mixed: both in one forward
 * pass, which the model computes as one extend); a last chunk and every decode row sample the
 * request's next token. */
static bool coloc_iter(struct pd_engine *e, double now) {
    struct pd_coloc_step st;
    int rc = pd_sched_coloc_step(e->sc, now, &st);
    PD_ASSERT(rc == PD_OK);
    e->retractions += st.n_retracted;
    int32_t n = st.n_chunks + st.n_decodes;
    if (n == 0)
        return false;
    PD_ASSERT(n <= e->max_reqs && n <= e->cfg.max_running_requests);
    for (int32_t i = 0; i < st.n_chunks; i++) {
        const struct pd_coloc_chunk *c = &st.chunks[i];
        struct pd_engine_req *r = find_req(e, c->room);
        PD_ASSERT(r);
        e->seqs[i] = (struct pd_model_seq){.tokens = r->tokens + c->start,
                                           .n_new = c->len,
                                           .n_cached = c->start,
                                           .pages = c->pages,
                                           .n_pages = c->n_pages};
        if (!rc)
            rc = in_lp_prepass(e, r, &e->seqs[i]);
    }
    for (int32_t i = 0; i < st.n_decodes; i++) {
        const struct pd_coloc_decode *d = &st.decodes[i];
        struct pd_engine_req *r = find_req(e, d->room);
        PD_ASSERT(r);
        e->seqs[st.n_chunks + i] = (struct pd_model_seq){.tokens = r->tokens + d->pos,
                                                         .n_new = 1,
                                                         .n_cached = d->pos,
                                                         .pages = d->pages,
                                                         .n_pages = d->n_pages};
    }
    /* a step of decode tokens alone chooses them on the device as decode_iter does */
    bool plain = false, dev = false;
    if (!rc && !st.n_chunks && e->cfg.greedy_on_device) {
        for (int32_t i = 0; i < n; i++)
            e->step_reqs[i] = find_req(e, st.decodes[i].room);
        dev = device_rows(e, n, &plain);
    }
    if (!rc && st.n_chunks)
        rc = pd_tp_group_extend(e->tp, e->seqs, (int)n, false, e->logits);
    else if (!rc)
        rc = decode_rows(e, n, dev, plain);
    if (rc)
        pd_error("colocated step of %d chunks (%d tokens) + %d decodes failed: %s",
                 (int)st.n_chunks, (int)st.n_prefill_tokens, (int)st.n_decodes, pd_error_msg());
    for (int32_t i = 0; i < n; i++) {
        bool is_chunk = i < st.n_chunks;
        uint64_t room = is_chunk ? st.chunks[i].room : st.decodes[i - st.n_chunks].room;
        struct pd_engine_req *r = find_req(e, room);
        e->stopped[i] = false;
        if (rc) { /* the model refused the step: these requests end failed */
            e->stopped[i] = true;
            r->fail_status = rc;
            if (!r->aborted)
                coloc_abort(e, room); /* ends at step_done; the END says failed */
            continue;
        }
        if (is_chunk)
            in_lp_score(e, r, e->seqs[i].n_cached + e->seqs[i].n_new - 1, 1,
                        e->logits + (size_t)i * (size_t)e->vocab);
        if ((is_chunk && !st.chunks[i].last) || r->aborted)
            continue; /* mid-prompt, or ending at step_done anyway */
        e->stopped[i] = take_token(e, i, r, dev);
    }
    rc = pd_sched_coloc_step_done(e->sc, &st, e->stopped, now);
    PD_ASSERT(rc == PD_OK);
    e->steps++;
    e->mixed_steps += st.n_chunks > 0 && st.n_decodes > 0;
    e->tokens += st.n_prefill_tokens + st.n_decodes;
    return true;
}

static void coloc_drain_ends(struct pd_engine *e) {
    struct pd_sched_end end;
    while (pd_sched_coloc_pop_ended(e->sc, &end) == PD_OK) {
        struct pd_engine_req *r = find_req(e, end.room);
        PD_ASSERT(r);
        pd_debug("room=%" PRIu64 " colocated end=%s tokens=%d cached=%d", end.room,
                 pd_sched_end_reason_str(end.reason), (int)r->n_out, (int)end.cached_tokens);
        emit_end(e, r, end.reason, PD_OK, end.cached_tokens);
    }
}

/* ---- the thread ---- */

static void drain_ends(struct pd_engine *e, double now) {
    struct pd_sched_end end;
    if (e->sc) {
        coloc_drain_ends(e);
        return;
    }
    if (e->sp) {
        while (pd_sched_prefill_pop_ended(e->sp, &end) == PD_OK) {
            struct pd_engine_req *r = find_req(e, end.room);
            PD_ASSERT(r);
            pd_debug("room=%" PRIu64 " prefill end=%s", end.room,
                     pd_sched_end_reason_str(end.reason));
            r->finished = end.reason == PD_END_DONE;
            emit_end(e, r, end.reason, PD_OK, end.cached_tokens);
        }
        return;
    }
    while (pd_sched_decode_pop_ended(e->sd, &end) == PD_OK) {
        struct pd_engine_req *r = find_req(e, end.room);
        PD_ASSERT(r);
        if (end.reason == PD_END_RETRACTED && !r->aborted && !r->finished) {
            /* back in as a local request: its "prompt" is everything but the last token */
            int rc = pd_sched_decode_add(e->sd, r->room, r->n_prompt + r->n_out - 1,
                                         r->sp.max_new_tokens - r->n_out + 1, now);
            if (rc == PD_OK) {
                r->local = true;
                pen_slot_release(e, r); /* not running: the slot serves another meanwhile */
                pd_info("room=%" PRIu64 " retracted after %d tokens; recomputing locally", r->room,
                        (int)r->n_out);
                continue;
            }
            pd_warn("room=%" PRIu64 " retracted and cannot re-enter: %s", r->room, pd_error_msg());
            emit_end(e, r, PD_END_FAILED, rc, 0);
            continue;
        }
        pd_debug("room=%" PRIu64 " decode end=%s tokens=%d", end.room,
                 pd_sched_end_reason_str(end.reason), (int)r->n_out);
        emit_end(e, r, end.reason, PD_OK, 0);
    }
}

/* /health_generate: the model runs one token (BOS) on one free page, greedy-sampled; the page is
 * back in the pool before the next scheduler step, so no scheduler ever sees it. With no free
 * page the daemon is busy serving, which is healthy: PD_EFULL, nothing run. */
static void probe(struct pd_engine *e, uint64_t id) {
    struct pd_engine_event ev = {.kind = PD_ENGINE_EV_PROBE, .room = id, .token = -1};
    int32_t page;
    if (pd_page_alloc_get(e->pa, 1, -1, &page) != PD_OK) {
        ev.status = PD_EFULL;
        emit(e, &ev);
        return;
    }
    int bos = pd_model_config_of(e->model)->bos_token_id;
    int32_t tok = bos >= 0 && bos < e->vocab ? bos : 0;
    struct pd_model_seq s = {
        .tokens = &tok, .n_new = 1, .n_cached = 0, .pages = &page, .n_pages = 1};
    int rc = pd_tp_group_extend(e->tp, &s, 1, false, e->logits);
    if (rc == PD_OK) {
        int32_t best = -1;
        for (int32_t v = 0; v < e->vocab; v++) {
            float x = e->logits[v];
            if (!isfinite(x)) {
                rc = pd_errorf(PD_EINTERNAL, "the model's logits are not finite (id %d)", (int)v);
                break;
            }
            if (best < 0 || x > e->logits[best])
                best = v;
        }
        ev.token = best;
    }
    pd_page_alloc_put(e->pa, &page, 1);
    ev.status = rc;
    if (rc)
        pd_warn("health probe: the 1-token forward pass failed: %s", pd_error_msg());
    emit(e, &ev);
}

static bool drain_commands(struct pd_engine *e, double now) {
    struct pd_engine_cmd c;
    bool any = false;
    while (pd_spsc_pop(&e->cmdq, &c) == PD_OK) {
        any = true;
        switch (c.kind) {
        case PD_ENGINE_CMD_ADD:
            if (e->sc)
                coloc_add(e, c.req, now);
            else if (e->sp)
                prefill_add(e, c.req, now);
            else
                decode_add(e, c.req, now);
            break;
        case PD_ENGINE_CMD_BOOTSTRAPPED:
            if (e->sp && find_req(e, c.room))
                (void)pd_sched_prefill_bootstrapped(e->sp, c.room, now);
            break;
        case PD_ENGINE_CMD_XFER_END:
            if (e->sc)
                break; /* nothing is transferred */
            if (e->sp)
                prefill_xfer_end(e, c.room, c.status, now);
            else
                decode_xfer_end(e, &c, now);
            break;
        case PD_ENGINE_CMD_ABORT:
            if (e->sc)
                coloc_abort(e, c.room);
            else if (e->sp)
                prefill_abort(e, c.room);
            else
                decode_abort(e, c.room);
            break;
        case PD_ENGINE_CMD_FLUSH_CACHE: {
            int32_t freed = e->rc ? pd_radix_cache_flush(e->rc) : 0;
            emit(e, &(struct pd_engine_event){.kind = PD_ENGINE_EV_FLUSHED, .n_output = freed});
            break;
        }
        case PD_ENGINE_CMD_PROBE: probe(e, c.room); break;
        default: PD_ASSERT(!"unknown engine command");
        }
    }
    return any;
}

static void publish(struct pd_engine *e) {
    struct pd_engine_stats s = {0};
    struct pd_page_stats ps;
    pd_page_alloc_stats(e->pa, &ps);
    s.pages_total = ps.total;
    s.pages_free = ps.free;
    s.pages_used = ps.used;
    s.pages_cached = ps.cached;
    if (e->sc) {
        struct pd_coloc_counts c;
        pd_sched_coloc_counts(e->sc, &c);
        s.q_waiting = c.waiting;
        s.q_running = c.running;
    } else if (e->sp) {
        struct pd_prefill_counts c;
        pd_sched_prefill_counts(e->sp, &c);
        s.q_bootstrap = c.bootstrap;
        s.q_waiting = c.waiting;
        s.q_inflight = c.inflight;
        s.q_draining = c.draining;
    } else {
        struct pd_decode_counts c;
        pd_sched_decode_counts(e->sd, &c);
        s.q_prealloc = c.prealloc;
        s.q_transfer = c.transfer;
        s.q_running = c.running;
        s.q_draining = c.draining;
    }
    s.steps = e->steps;
    s.tokens_computed = e->tokens;
    s.retractions = e->retractions;
    s.mixed_steps = e->mixed_steps;
    s.sampled_on_device = e->sampled_on_device;
    s.sampled_on_host = e->sampled_on_host;
    pthread_mutex_lock(&e->stats_mu);
    e->stats = s;
    pthread_mutex_unlock(&e->stats_mu);
    if (e->check_steps) {
        int rc = e->sc   ? pd_sched_coloc_check(e->sc)
                 : e->sp ? pd_sched_prefill_check(e->sp)
                         : pd_sched_decode_check(e->sd);
        if (rc)
            pd_error("engine check failed: %s", pd_error_msg());
        if (atomic_load(&e->last_check) <= 0) /* keep the first failure */
            atomic_store(&e->last_check, rc);
    }
}

static void wait_for_work(struct pd_engine *e) {
    pthread_mutex_lock(&e->mu);
    if (!e->cmd_pending && !atomic_load(&e->stop)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += IDLE_WAIT_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&e->cv_cmd, &e->mu, &ts);
    }
    e->cmd_pending = false;
    pthread_mutex_unlock(&e->mu);
}

static void *compute_main(void *arg) {
    struct pd_engine *e = arg;
    while (!atomic_load(&e->stop)) {
        double now = now_s();
        bool did = drain_commands(e, now);
        drain_ends(e, now); /* ends caused by commands (aborts, transfer ends) */
        bool worked = e->sc   ? coloc_iter(e, now)
                      : e->sp ? prefill_iter(e, now)
                              : decode_iter(e, now);
        drain_ends(e, now);
        publish(e);
        if (e->unsignalled) { /* one wakeup per iteration, however many events */
            e->unsignalled = 0;
            uv_async_send(e->async);
        }
        if (!did && !worked)
            wait_for_work(e);
    }
    atomic_store(&e->exited, true);
    uv_async_send(e->async);
    return NULL;
}

static void on_async(uv_async_t *a) {
    pd_engine_poll(a->data);
}

void pd_engine_poll(struct pd_engine *e) {
    struct pd_engine_event ev;
    bool any = false;
    /* At most what is queued on entry: the compute thread refills the queue while this drains
     * it, and a loop that stayed here would not get back to its sockets until a generation
     * ended (on a loaded machine a client's /abort_request was read only after the stream it
     * meant to stop had finished). The rest comes on the next loop iteration, after I/O. */
    uint32_t budget = pd_spsc_count(&e->evq);
    while (budget > 0 && pd_spsc_pop(&e->evq, &ev) == PD_OK) {
        budget--;
        any = true;
        e->fn(e->fn_ctx, &ev);
    }
    if (pd_spsc_count(&e->evq) > 0)
        uv_async_send(e->async);
    if (any) {
        pthread_mutex_lock(&e->mu);
        pthread_cond_broadcast(&e->cv_space);
        pthread_mutex_unlock(&e->mu);
    }
}

int pd_engine_start(struct pd_engine *e, uv_loop_t *loop, pd_engine_event_fn fn, void *ctx) {
    PD_ASSERT(!e->started);
    const char *chk = getenv("PD_ENGINE_CHECK");
    e->check_steps = chk && *chk && strcmp(chk, "0") != 0;
    e->loop = loop;
    e->fn = fn;
    e->fn_ctx = ctx;
    e->async = pd_calloc(1, sizeof(*e->async));
    if (!e->async)
        return PD_ENOMEM;
    int rc = uv_async_init(loop, e->async, on_async);
    if (rc) {
        pd_free(e->async);
        e->async = NULL;
        return pd_errorf(PD_EINTERNAL, "uv_async_init: %s", uv_strerror(rc));
    }
    e->async->data = e;
    rc = pthread_create(&e->thread, NULL, compute_main, e);
    if (rc) {
        uv_close((uv_handle_t *)e->async, (uv_close_cb)pd_free);
        e->async = NULL;
        return pd_errorf(pd_status_from_errno(rc), "starting the compute thread: %s", strerror(rc));
    }
    e->started = true;
    return PD_OK;
}

int pd_engine_submit(struct pd_engine *e, const struct pd_engine_cmd *c) {
    if (atomic_load(&e->stop))
        return pd_errorf(PD_ECANCELED, "the engine is stopping");
    if (pd_spsc_push(&e->cmdq, c) != PD_OK)
        return pd_errorf(PD_EFULL, "the compute thread's command queue is full (%u)",
                         pd_spsc_capacity(&e->cmdq));
    pthread_mutex_lock(&e->mu);
    e->cmd_pending = true;
    pthread_cond_signal(&e->cv_cmd);
    pthread_mutex_unlock(&e->mu);
    return PD_OK;
}

void pd_engine_stats(const struct pd_engine *e, struct pd_engine_stats *out) {
    pthread_mutex_lock((pthread_mutex_t *)&e->stats_mu);
    *out = e->stats;
    pthread_mutex_unlock((pthread_mutex_t *)&e->stats_mu);
}

int pd_engine_last_check(const struct pd_engine *e) {
    return atomic_load((atomic_int *)&e->last_check);
}

/* After the thread is gone: every request still registered ends here, aborted. */
static void end_all(struct pd_engine *e) {
    for (int32_t i = 0; i < e->cap; i++) {
        struct pd_engine_req *r = e->reqs[i];
        if (!r)
            continue;
        bool q;
        if (e->sc) {
            (void)pd_sched_coloc_abort(e->sc, r->room);
        } else if (e->sp) {
            if (pd_sched_prefill_abort(e->sp, r->room, &q) == PD_OK && q)
                (void)pd_sched_prefill_release(e->sp, r->room);
        } else if (pd_sched_decode_abort(e->sd, r->room, &q) == PD_OK && q) {
            (void)pd_sched_decode_release(e->sd, r->room);
        }
        struct pd_engine_event ev = {.kind = PD_ENGINE_EV_END,
                                     .room = r->room,
                                     .req = r,
                                     .reason = PD_END_ABORTED,
                                     .status = PD_ECANCELED,
                                     .n_output = r->n_out};
        unregister_req(e, r);
        e->fn(e->fn_ctx, &ev);
    }
    struct pd_sched_end end;
    if (e->sc)
        while (pd_sched_coloc_pop_ended(e->sc, &end) == PD_OK) {
        }
    else if (e->sp)
        while (pd_sched_prefill_pop_ended(e->sp, &end) == PD_OK) {
        }
    else
        while (pd_sched_decode_pop_ended(e->sd, &end) == PD_OK) {
        }
}

void pd_engine_stop(struct pd_engine *e) {
    if (!e || !e->started || e->joined)
        return;
    atomic_store(&e->stop, true);
    pthread_mutex_lock(&e->mu);
    pthread_cond_signal(&e->cv_cmd);
    pthread_mutex_unlock(&e->mu);
    /* keep draining so a thread blocked on a full event queue can finish its step */
    while (!atomic_load(&e->exited)) {
        pd_engine_poll(e);
        uv_sleep(1);
    }
    pthread_join(e->thread, NULL);
    e->joined = true;
    pd_engine_poll(e);
    /* commands nobody will run: their requests come back as aborted */
    struct pd_engine_cmd c;
    while (pd_spsc_pop(&e->cmdq, &c) == PD_OK)
        if (c.kind == PD_ENGINE_CMD_ADD)
            e->fn(e->fn_ctx, &(struct pd_engine_event){.kind = PD_ENGINE_EV_END,
                                                       .room = c.req->room,
                                                       .req = c.req,
                                                       .reason = PD_END_ABORTED,
                                                       .status = PD_ECANCELED});
    end_all(e);
    publish(e);
    uv_close((uv_handle_t *)e->async, (uv_close_cb)pd_free);
    e->async = NULL;
}

void pd_engine_free(struct pd_engine *e) {
    if (!e)
        return;
    PD_ASSERT(!e->started || e->joined);
    pd_sched_prefill_free(e->sp);
    pd_sched_decode_free(e->sd);
    pd_sched_coloc_free(e->sc);
    pd_radix_cache_free(e->rc);
    pd_page_alloc_free(e->pa);
    pd_tp_group_free(e->tp);
    pd_room_map_free(&e->rooms);
    pd_free(e->reqs);
    pd_free(e->free_slots);
    pd_free(e->seqs);
    pd_free(e->logits);
    pd_free(e->greedy_ids);
    pd_free(e->greedy_lp);
    pd_free(e->sample_rows);
    pd_free(e->step_top);
    pd_free(e->step_reqs);
    pd_free(e->pen_free);
    pd_free(e->stopped);
    pd_sampling_scratch_free(&e->scratch);
    pd_spsc_free(&e->cmdq);
    pd_spsc_free(&e->evq);
    pthread_mutex_destroy(&e->mu);
    pthread_mutex_destroy(&e->stats_mu);
    pthread_cond_destroy(&e->cv_cmd);
    pthread_cond_destroy(&e->cv_space);
    pd_free(e);
}
