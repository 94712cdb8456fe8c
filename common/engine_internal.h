/*
 * engine_internal.h — what the compute thread's role parts share with common/engine.c: the
 * engine itself, the op table a role fills (prefill/engine_prefill.c; decode/engine_decode.c and
 * decode/engine_coloc.c), the request registry, events out, and (common/engine_tokens.c) device
 * penalty slots, choosing and recording output tokens, and input logprobs.
 *
 * common/engine.c owns creation, the command queue, the thread and its stop; it never names a
 * role: every role-specific step goes through e->ops. The loop thread uses engine.h only.
 * Names here are pd__engine_* (internal to the engine and its role parts).
 */
#ifndef PD_ENGINE_INTERNAL_H
#define PD_ENGINE_INTERNAL_H

#include "common/engine.h"

#include "common/base/room_table.h"
#include "common/base/spsc.h"
#include "model/model.h"
#include "model/sampling.h"
#include "common/sched_common.h"

#include <pthread.h>
#include <stdatomic.h>

struct pd_backend;
struct pd_kv_pool;
struct pd_page_alloc;
struct pd_radix_cache;
struct pd_tp_group;

/* A role's part of the compute thread. Called on the compute thread, except step_rows and
 * sched_new/sched_free (creation and free, on the caller's). */
struct pd_engine_ops {
    const char *name; /* "prefill", "decode", "colocated": logs */
    /* A step's rows (requests) for a prompt-token budget; *max_tokens starts at the budget and
     * may be raised (a decode step's tokens are one per row). */
    int32_t (*step_rows)(const struct pd_engine_config *cfg, int32_t budget, int32_t *max_tokens);
    /* Builds e->sched (and e->rc when the role keeps a prefix cache) once the pool and
     * e->pa exist; frees them (NULL-safe). */
    int (*sched_new)(struct pd_engine *e);
    void (*sched_free)(struct pd_engine *e);
    /* The commands: a new request (ends it with EV_END when refused), the room's Transfer
     * arrived (NULL: the role has no bootstrap queue), the room's transfer ended (NULL: nothing
     * is transferred), an abort wherever the request is. */
    void (*add)(struct pd_engine *e, struct pd_engine_req *r, double now);
    void (*bootstrapped)(struct pd_engine *e, const struct pd_engine_cmd *c, double now);
    void (*xfer_end)(struct pd_engine *e, const struct pd_engine_cmd *c, double now);
    void (*abort)(struct pd_engine *e, uint64_t room);
    /* One scheduler step and its model call; false when there was nothing to do. */
    bool (*iter)(struct pd_engine *e, double now);
    /* The scheduler's ended requests, each as an EV_END (or back in, for a retraction). */
    void (*drain_ends)(struct pd_engine *e, double now);
    /* The scheduler's queue lengths into s, and its consistency check (PD_OK or the first
     * failure). */
    void (*counts)(const struct pd_engine *e, struct pd_engine_stats *s);
    int (*check)(const struct pd_engine *e);
    /* The thread is gone: the request of room is taken out of the scheduler at once (its pages
     * back), then every end still queued is dropped. */
    void (*end_now)(struct pd_engine *e, uint64_t room);
    void (*discard_ended)(struct pd_engine *e);
};

#include <time.h>

#define IDLE_WAIT_MS 20 /* an idle compute thread still steps this often: timeouts expire */

struct pd_engine {
    struct pd_engine_config cfg;
    /* the model over cfg.tp_size ranks (model/tp_group.h); every model call goes through it */
    struct pd_tp_group *tp;
    struct pd_backend *be;  /* rank 0's */
    struct pd_model *model; /* rank 0's: config and context length */
    struct pd_kv_pool *kv;  /* rank 0's: the logical pool's page count and geometry */
    struct pd_page_alloc *pa;
    struct pd_radix_cache *rc;
    const struct pd_engine_ops *ops; /* cfg.ops */
    void *sched;                     /* the role's scheduler (ops->sched_new) */
    int vocab, ctx_len, max_reqs, chunk;

    /* request registry (compute thread): room → slot → req */
    struct pd_room_table slots;
    struct pd_engine_req **reqs; /* [cap] */
    int32_t cap;

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
    /* decode: rooms of admitted local prefills (--local-prefill) waiting for their turn, in
     * admission order; [max_running] */
    uint64_t *local_rooms;
    int32_t n_local;
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
    int64_t steps, tokens, retractions, mixed_steps, local_prefills;
    int64_t held_tokens; /* decode: prompt tokens whose KV its prefix cache served */
    int64_t sampled_on_device, sampled_on_host;
    int64_t unsignalled; /* events pushed since the loop was last woken */
    atomic_int last_check;
    bool check_steps;

    /* vision (common/engine_mm.c): the encoder on rank 0's backend, its checkpoint, the
     * embedding cache, and a step's embedding spans ([max_reqs][PD_ENGINE_MAX_IMAGES]) */
    struct pd_vision_encoder *venc;
    struct pd_checkpoint *vck;
    struct pd_embed_cache *embc;
    struct pd_model_embeds *mm_spans;
    int32_t *mm_mpos; /* [mm_mpos_cap][3]: positions of recomputes that cross a prompt's end */
    int32_t mm_mpos_cap, mm_mpos_used;
    int32_t hidden;
    int64_t mm_encoder_runs;
};

/* ---- vision (common/engine_mm.c) ---- */

/* The encoder and the embedding cache, when cfg.vision and the model is a vision-language one;
 * nothing otherwise. */
int pd__engine_mm_new(struct pd_engine *e);
void pd__engine_mm_free(struct pd_engine *e);
/* Row k of a step running s (tokens s->n_cached .. +n_new of r; rows in order from k = 0): its
 * M-RoPE positions (a recompute past the prompt's end: index + delta there), its output
 * position delta, and the embeddings of the images it covers (encoded now when neither r nor
 * the cache has them). PD_EUNSUPPORTED when it covers image tokens and this engine has no
 * encoder (the decode side of PD cannot recompute an image's tokens: it retracts them last). */
int pd__engine_mm_seq(struct pd_engine *e, struct pd_engine_req *r, int32_t k,
                      struct pd_model_seq *s);
/* r's prompt is computed (or r ends): its cache references go back. */
void pd__engine_mm_release(struct pd_engine *e, struct pd_engine_req *r);
/* Publishes the encoder and cache counters into s. */
void pd__engine_mm_stats(const struct pd_engine *e, struct pd_engine_stats *s);

/* ---- the request registry (common/engine.c): room → slot → request ---- */

struct pd_engine_req *pd__engine_find(struct pd_engine *e, uint64_t room);
/* PD_EFULL when every slot is live, PD_EINVAL when room has a live request already. */
int pd__engine_register(struct pd_engine *e, struct pd_engine_req *r);
void pd__engine_unregister(struct pd_engine *e, struct pd_engine_req *r);

/* ---- events out (common/engine.c) ---- */

/* Queues ev for the loop (waits for room when the queue is full). */
void pd__engine_emit(struct pd_engine *e, const struct pd_engine_event *ev);
/* r's EV_END (reason unless it failed or finished; status unless the model failed it); its
 * penalty slot and registry slot are given back first. */
/* A prompt the model computes here: false (and r ended failed, PD_EINVAL naming the token) when
 * a token is outside the vocabulary, so it cannot fail a step batched with other requests. */
bool pd__engine_prompt_ok(struct pd_engine *e, struct pd_engine_req *r);
void pd__engine_emit_end(struct pd_engine *e, struct pd_engine_req *r, int reason, int status,
                         int32_t cached_tokens);
/* A role's sampler for r (its prompt, the model's EOS ids) with sp; PD_OK or why not. */
int pd__engine_sampler_init(struct pd_engine *e, struct pd_engine_req *r,
                            const struct pd_sampling_params *sp);
/* The decode and colocated schedulers' new_token_ratio from cfg.new_token_ratio (0: keep
 * *init, *min as the defaults set them). */
void pd__engine_ratio(const struct pd_engine_config *cfg, double *init, double *min);
/* cfg.max_prefill_tokens, or the default. */
int32_t pd__engine_max_prefill(const struct pd_engine_config *cfg);

/* ---- device penalty slots (common/engine_tokens.c) ---- */

/* Penalty state on rank 0's backend for up to max_running requests (at most 1 GiB); none
 * (host penalties) when the backend cannot hold it. */
int pd__engine_pen_slots_new(struct pd_engine *e, int max_running);
/* Gives r's slot back: it ended, or a token was recorded without the device. */
void pd__engine_pen_release(struct pd_engine *e, struct pd_engine_req *r);

/* ---- output tokens (common/engine_tokens.c) ---- */

/* Records tok as r's next output and emits its EV_TOKEN; smp: the sampler's record (top-n
 * logprobs), NULL for the prefill's first token. */
void pd__engine_note_token(struct pd_engine *e, struct pd_engine_req *r, int32_t tok, float logprob,
                           int finish, const struct pd_sample *smp);
/* Whether e->step_reqs[0..n) choose their tokens on the device (sets e->sample_rows); *plain:
 * all greedy without penalties or top-n. */
bool pd__engine_device_rows(struct pd_engine *e, int32_t n, bool *plain);
/* One decode forward pass over e->seqs[0..n): logits to the host (!dev) or the device's choice. */
int pd__engine_decode_rows(struct pd_engine *e, int32_t n, bool dev, bool plain);
/* Row i's output token for r recorded; says whether r finished. */
bool pd__engine_take_token(struct pd_engine *e, int32_t i, struct pd_engine_req *r, bool dev);

/* ---- input (prompt) logprobs (common/engine_tokens.c) ---- */

/* Before its scheduler add: the positions to score. */
void pd__engine_in_lp_begin(struct pd_engine_req *r);
/* The prefix-cache limit that keeps the scored positions computed. */
int32_t pd__engine_in_lp_cache_max(const struct pd_engine_req *r);
/* Logits rows of positions p0 .. p0+n-1: each scores the prompt token after it, once. */
void pd__engine_in_lp_score(struct pd_engine *e, struct pd_engine_req *r, int32_t p0, int32_t n,
                            const float *logits);
/* Runs all but the last token of a scoring chunk alone (every position's logits kept) and
 * narrows *seq to that last token. */
int pd__engine_in_lp_prepass(struct pd_engine *e, struct pd_engine_req *r,
                             struct pd_model_seq *seq);

#endif
