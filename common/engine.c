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
#include "common/engine_internal.h"
#include "model/vision/image_processor.h"
#include "common/server_args.h"

#include "common/base/alloc.h"
#include "common/base/log.h"
#include "common/base/status.h"
#include "common/page_alloc.h"
#include "common/radix_cache.h"
#include "model/backend.h"
#include "model/kv_pool.h"
#include "model/tp_group.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define IDLE_WAIT_MS 20 /* an idle compute thread still steps this often: timeouts expire */

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

void pd_engine_mm_free(struct pd_engine_mm *mm) {
    if (!mm)
        return;
    for (int32_t i = 0; i < mm->n_images; i++) {
        pd_image_patches_free(mm->images[i].patches);
        pd_free(mm->images[i].patches);
    }
    pd_free(mm->images);
    pd_free(mm->mpos);
    pd_free(mm);
}

void pd_engine_req_free(struct pd_engine_req *r) {
    if (!r)
        return;
    if (r->has_sampler)
        pd_sampler_free(&r->sampler);
    pd_engine_mm_free(r->mm);
    pd_free(r->tokens);
    pd_free(r->pages);
    pd_free(r->samples);
    pd_free(r->in_lp);
    pd_free(r);
}

struct pd_engine_req *pd__engine_find(struct pd_engine *e, uint64_t room) {
    int32_t slot = pd_room_table_get(&e->slots, room);
    return slot >= 0 ? e->reqs[slot] : NULL;
}

int pd__engine_register(struct pd_engine *e, struct pd_engine_req *r) {
    int32_t slot;
    if (pd_room_table_full(&e->slots))
        return pd_errorf(PD_EFULL, "room %" PRIu64 ": %d requests live already", r->room,
                         (int)e->cap);
    if (pd_room_table_take(&e->slots, r->room, &slot) != PD_OK)
        return pd_errorf(PD_EINVAL, "room %" PRIu64 " already has a live request", r->room);
    e->reqs[slot] = r;
    r->slot = slot;
    return PD_OK;
}

void pd__engine_unregister(struct pd_engine *e, struct pd_engine_req *r) {
    PD_ASSERT(r->slot >= 0 && e->reqs[r->slot] == r);
    pd_room_table_release(&e->slots, r->room, r->slot);
    e->reqs[r->slot] = NULL;
    r->slot = -1;
}

/* ---- creation ---- */

int32_t pd__engine_max_prefill(const struct pd_engine_config *cfg) {
    return cfg->max_prefill_tokens > 0 ? cfg->max_prefill_tokens : PD_DEFAULT_MAX_PREFILL_TOKENS;
}

void pd__engine_ratio(const struct pd_engine_config *cfg, double *init, double *min) {
    if (cfg->new_token_ratio <= 0)
        return;
    *init = cfg->new_token_ratio < 1 ? cfg->new_token_ratio : 1;
    if (*min > *init)
        *min = *init;
}

int pd__engine_sampler_init(struct pd_engine *e, struct pd_engine_req *r,
                            const struct pd_sampling_params *sp) {
    const struct pd_model_config *mc = pd_model_config_of(e->model);
    int rc = pd_sampler_init(&r->sampler, sp, e->vocab, r->tokens, r->n_prompt, mc->eos_token_ids,
                             mc->n_eos_token_ids);
    r->has_sampler = rc == PD_OK;
    return rc;
}

int pd_engine_new(const struct pd_engine_config *cfg, struct pd_engine **out) {
    *out = NULL;
    int rc;
    if (!cfg->ops)
        return pd_errorf(PD_EINVAL, "engine: no role (pd_engine_config.ops)");
    if (cfg->page_size <= 0 || cfg->max_queued_requests <= 0 || cfg->max_running_requests <= 0)
        return pd_errorf(PD_EINVAL, "engine: page size %d, max queued %d, max running %d",
                         cfg->page_size, cfg->max_queued_requests, cfg->max_running_requests);
    struct pd_engine *e = pd_calloc(1, sizeof(*e));
    if (!e)
        return PD_ENOMEM;
    e->cfg = *cfg;
    e->ops = cfg->ops;
    e->cap = cfg->max_queued_requests;
    atomic_init(&e->stop, false);
    atomic_init(&e->exited, false);
    atomic_init(&e->last_check, -1);
    pthread_mutex_init(&e->mu, NULL);
    pthread_mutex_init(&e->stats_mu, NULL);
    pthread_cond_init(&e->cv_cmd, NULL);
    pthread_cond_init(&e->cv_space, NULL);

    /* step sizes: the role's rows within the prompt-token budget; decode also recomputes
     * retracted requests in chunks of it */
    int32_t budget = pd__engine_max_prefill(cfg);
    if (cfg->chunked_prefill_size > 0 && cfg->chunked_prefill_size < budget)
        budget = cfg->chunked_prefill_size;
    e->chunk = budget;
    int32_t max_tokens = budget;
    int32_t max_reqs = e->ops->step_rows(cfg, budget, &max_tokens);
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
    if (e->kv->layout.n_pages > INT32_MAX / 2) {
        rc = pd_errorf(PD_ERANGE, "KV pool of %" PRId64 " pages is too large",
                       (int64_t)e->kv->layout.n_pages);
        goto fail;
    }
    if ((rc = pd_page_alloc_new((int32_t)e->kv->layout.n_pages, &e->pa)) != PD_OK)
        goto fail;
    /* the role's scheduler (and prefix cache); decode and colocated also take their device
     * penalty slots here, after the pools were sized, out of what mem_fraction_static leaves */
    if ((rc = e->ops->sched_new(e)) != PD_OK)
        goto fail;
    if ((rc = pd_room_table_init(&e->slots, e->cap)) != PD_OK)
        goto fail;
    e->reqs = pd_calloc((size_t)e->cap, sizeof(*e->reqs));
    e->seqs = pd_calloc((size_t)max_reqs, sizeof(*e->seqs));
    e->logits = pd_calloc((size_t)max_reqs * (size_t)e->vocab, sizeof(float));
    e->greedy_ids = pd_calloc((size_t)max_reqs, sizeof(int32_t));
    e->greedy_lp = pd_calloc((size_t)max_reqs, sizeof(float));
    e->sample_rows = pd_calloc((size_t)max_reqs, sizeof(*e->sample_rows));
    e->step_top = pd_calloc((size_t)max_reqs, sizeof(*e->step_top));
    e->step_reqs = pd_calloc((size_t)max_reqs, sizeof(*e->step_reqs));
    e->stopped = pd_calloc((size_t)cfg->max_running_requests, sizeof(bool));
    if (!e->reqs || !e->seqs || !e->logits || !e->stopped || !e->greedy_ids || !e->greedy_lp ||
        !e->sample_rows || !e->step_top || !e->step_reqs) {
        rc = pd_error_wrap(PD_ENOMEM, "engine step buffers");
        goto fail;
    }
    if ((rc = pd_sampling_scratch_init(&e->scratch, e->vocab)) != PD_OK ||
        (rc = pd__engine_mm_new(e)) != PD_OK)
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
    o->kv_heads_total = mc->num_key_value_heads;
    for (int r = 0; r < o->tp_size; r++) {
        o->pool_bases[r] = pd_tp_group_kv(e->tp, r)->layout.base;
        int count;
        pd_model_kv_heads_of(pd_tp_group_model(e->tp, r), &o->kv_head_start[r], &count);
        PD_ASSERT(count == o->kv_heads);
    }
}

/* ---- events out ---- */

void pd__engine_emit(struct pd_engine *e, const struct pd_engine_event *ev) {
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

void pd__engine_emit_end(struct pd_engine *e, struct pd_engine_req *r, int reason, int status,
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
    pd__engine_pen_release(e, r);
    pd__engine_mm_release(e, r);
    if (r->slot >= 0)
        pd__engine_unregister(e, r);
    pd__engine_emit(e, &ev);
}

/* ---- the thread ---- */

/* /health_generate: the model runs one token (BOS) on one free page, greedy-sampled; the page is
 * back in the pool before the next scheduler step, so no scheduler ever sees it. With no free
 * page the daemon is busy serving, which is healthy: PD_EFULL, nothing run. */
static void probe(struct pd_engine *e, uint64_t id) {
    struct pd_engine_event ev = {.kind = PD_ENGINE_EV_PROBE, .room = id, .token = -1};
    int32_t page;
    if (pd_page_alloc_get(e->pa, 1, -1, &page) != PD_OK) {
        ev.status = PD_EFULL;
        pd__engine_emit(e, &ev);
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
    pd__engine_emit(e, &ev);
}

static bool drain_commands(struct pd_engine *e, double now) {
    struct pd_engine_cmd c;
    bool any = false;
    while (pd_spsc_pop(&e->cmdq, &c) == PD_OK) {
        any = true;
        switch (c.kind) {
        case PD_ENGINE_CMD_ADD: e->ops->add(e, c.req, now); break;
        case PD_ENGINE_CMD_BOOTSTRAPPED:
            if (e->ops->bootstrapped) /* a role without a bootstrap queue ignores it */
                e->ops->bootstrapped(e, &c, now);
            break;
        case PD_ENGINE_CMD_XFER_END:
            if (e->ops->xfer_end) /* a role that transfers nothing ignores it */
                e->ops->xfer_end(e, &c, now);
            break;
        case PD_ENGINE_CMD_ABORT: e->ops->abort(e, c.room); break;
        case PD_ENGINE_CMD_FLUSH_CACHE: {
            int32_t freed = e->rc ? pd_radix_cache_flush(e->rc) : 0;
            pd__engine_emit(
                e, &(struct pd_engine_event){.kind = PD_ENGINE_EV_FLUSHED, .n_output = freed});
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
    e->ops->counts(e, &s);
    s.steps = e->steps;
    s.tokens_computed = e->tokens;
    s.retractions = e->retractions;
    s.local_prefills = e->local_prefills;
    s.held_tokens = e->held_tokens;
    s.mixed_steps = e->mixed_steps;
    s.sampled_on_device = e->sampled_on_device;
    s.sampled_on_host = e->sampled_on_host;
    pd__engine_mm_stats(e, &s);
    pthread_mutex_lock(&e->stats_mu);
    e->stats = s;
    pthread_mutex_unlock(&e->stats_mu);
    if (e->check_steps) {
        int rc = e->ops->check(e);
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
        e->ops->drain_ends(e, now); /* ends caused by commands (aborts, transfer ends) */
        if (e->unsignalled) {
            /* what the commands produced goes to the loop before the step, which may run for
             * milliseconds: above all a prefill's pages computed before its Transfer came, made
             * sendable by it (they went out only with the next chunk's, after its step, and the
             * decode then copied both chunks' pages after the last step instead of one) */
            e->unsignalled = 0;
            uv_async_send(e->async);
        }
        bool worked = e->ops->iter(e, now);
        e->ops->drain_ends(e, now);
        publish(e);
        if (e->unsignalled) { /* one wakeup per iteration, however many events */
            e->unsignalled = 0;
            uv_async_send(e->async);
            /* The loop thread may wait on this core: it woke us with a command, and a woken
             * thread preempts its waker. Let it take the events now, not when we next block:
             * a first token would otherwise reach its client only after the whole answer
             * (seen on 2 cores: TTFT 2-3 ms for a 16-token prompt whose answer took 1 ms). */
            sched_yield();
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
        e->ops->end_now(e, r->room);
        struct pd_engine_event ev = {.kind = PD_ENGINE_EV_END,
                                     .room = r->room,
                                     .req = r,
                                     .reason = PD_END_ABORTED,
                                     .status = PD_ECANCELED,
                                     .n_output = r->n_out};
        pd__engine_unregister(e, r);
        e->fn(e->fn_ctx, &ev);
    }
    e->ops->discard_ended(e);
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
    if (e->ops)
        e->ops->sched_free(e);
    pd__engine_mm_free(e);
    pd_radix_cache_free(e->rc);
    pd_page_alloc_free(e->pa);
    pd_tp_group_free(e->tp);
    pd_room_table_free(&e->slots);
    pd_free(e->reqs);
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
