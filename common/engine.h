/*
 * engine.h — a daemon's compute thread (DESIGN.md §2a): it owns the model with its backend and
 * KV pool (over tp_size ranks: model/tp_group.h, whose workers it drives in lockstep), the page
 * allocator, the prefix cache (prefill) and one scheduler (prefill or decode flavour), and runs
 * one step at a time. What differs by role lives with the role (prefill/engine_prefill.c,
 * decode/engine_decode.c, decode/engine_coloc.c) behind the op table the config names. The loop
 * thread talks to it only through two bounded SPSC queues: commands in (pd_engine_submit; the
 * compute thread is woken by a condition variable), events out (drained on the loop by a uv_async_t
 * into the event callback).
 *
 * Prefill: ADD puts a request in bootstrap; BOOTSTRAPPED (decode's Transfer arrived) moves it to
 * waiting; each step runs one chunked-prefill batch through pd_model_extend and reports the pages
 * that became sendable (EV_SEND); the last chunk's event carries the sampled first token. The
 * loop posts the pages, finishes the room, and reports the engine's room ending (XFER_END);
 * only then does the request end (EV_END) and its pages go back.
 * Decode: ADD puts a request in prealloc; when its prompt pages are reserved EV_ADMIT says so
 * (send Transfer); XFER_END carries the done notice (first token) or the failure; then one token
 * per step (EV_TOKEN) until EOS / stop token / max_new_tokens. A retracted request is recomputed
 * here: it re-enters with prompt + generated tokens, whose KV one local extend rebuilds.
 * A request timed out in transfer, or aborted there, yields EV_QUIESCE: the loop aborts the room
 * with the prefill; the room's ending (XFER_END) releases its pages.
 * Colocated (pdserve-decode --disaggregation-mode null): ADD puts a request in waiting; each step
 * runs the prefill chunks and one decode token per running request in one forward pass
 * (decode/sched_coloc.h); every output token, the first included, is an EV_TOKEN. No transfer:
 * no ADMIT, SEND, QUIESCE or XFER_END.
 *
 * PROBE (/health_generate) runs one token through the model on a page taken from the free pool
 * and given back within the command: no scheduler, no transfer, no request.
 *
 * Ownership: a struct pd_engine_req is built by the loop (pd_engine_req_new), belongs to the
 * compute thread from ADD until its EV_END, and is freed by the loop after that. The loop may
 * read req->pages entries an event names (they are written before the event and never again).
 * Nothing is allocated per decode step. Nothing here does I/O beyond loading the model.
 */
#ifndef PD_ENGINE_H
#define PD_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "model/sampling.h"
#include "model/tp.h"

struct pd_image_patches;
struct pd_embed_entry;

struct pd_engine_ops; /* a role's part of the compute thread (common/engine_internal.h) */

struct pd_engine_config {
    /* the role: &pd_engine_prefill_ops (prefill/engine_prefill.h), &pd_engine_decode_ops or
     * &pd_engine_coloc_ops (decode/engine_decode.h) */
    const struct pd_engine_ops *ops;
    const char *model_path;
    int device;               /* enum pd_backend_kind: PD_BACKEND_CPU or PD_BACKEND_CUDA */
    int device_index;         /* cuda: which GPU (rank r of tensor parallelism: this + r) */
    int tp_size;              /* tensor-parallel ranks (model/tp_group.h); 0 or 1: none */
    int threads;              /* cpu backend threads; 0 = one per core */
    int page_size;            /* tokens per KV page */
    int chunked_prefill_size; /* prefill step budget; decode: recompute chunk; <= 0: unchunked */
    int max_prefill_tokens;
    int max_running_requests; /* decode batch cap */
    int max_queued_requests;  /* live requests the scheduler holds */
    int context_length;       /* 0 = the model's */
    int64_t n_pages;          /* KV pool pages; 0 = from mem_fraction_static */
    int kv_dtype;             /* enum pd_dtype of the KV pool (0: f32) unless kv_dtype_auto */
    bool kv_dtype_auto;       /* --kv-cache-dtype auto (model/tp_group.h resolves it) */
    double mem_fraction_static;
    bool disable_prefix_cache;
    double bootstrap_timeout_s; /* prefill */
    bool eager_prefill;         /* prefill: compute before decode's Transfer (--eager-prefill) */
    double waiting_timeout_s;   /* decode */
    double new_token_ratio;     /* decode: share of the output reserved at admission (SGLang
                                   0.7, decaying to 0.1); 0 = SGLang's; smaller admits more
                                   and retracts sooner */
    bool mixed_chunk;           /* colocated: prefill chunks and decode tokens in one step */
    /* vision-language models: run their vision encoder here (prefill, colocated; the decode
     * side of PD never sees pixels) with an embedding cache of this many bytes */
    bool vision;
    size_t mm_cache_bytes;
    bool greedy_on_device; /* decode steps choose their tokens on the device instead of
                              downloading the logits: the argmax when every request is
                              greedy without penalties or top-n logprobs, else
                              pd_backend_sample with each request's u, its penalties
                              (state kept in a device penalty slot per running request,
                              set once from its tokens) and its top-n; 8 bytes a request
                              (+ 8 per top-n entry) come back (cuda). The host sampler
                              still records every token (stop conditions, counts), so a
                              step that cannot go to the device (no slot free) samples on
                              the host with the same result */
};

/* An image of a request (vision-language models, model/vision/): prepared by the loop (the
 * processor's patches and their content hash), placed at prompt tokens [start, start +
 * n_tokens). The compute thread turns it into embeddings — from the engine's embedding cache, or
 * by its vision encoder, once — when a prefill chunk first covers it, and frees the patches
 * then; it holds the cache entry until the prompt is computed or the request ends. */
struct pd_engine_image {
    uint8_t hash[16];
    struct pd_image_patches *patches; /* NULL on the decode side of PD (no encoder there) */
    int32_t start, n_tokens;
    struct pd_embed_entry *emb; /* compute thread */
};

/* Images one request may carry (--limit-mm-per-prompt is at most this). */
#define PD_ENGINE_MAX_IMAGES 64

/* A prompt with images: its images in prompt order, every prompt token's M-RoPE position
 * (temporal, height, width) and the delta the output's positions take (vision_prompt.h). */
struct pd_engine_mm {
    int32_t n_images;
    struct pd_engine_image *images;
    int32_t *mpos; /* [n_prompt][3] */
    int32_t pos_delta;
};

/* A request as the compute thread sees it. Fields above `private` are set by the loop before
 * ADD and read-only afterwards, except the output tail of tokens (decode, compute writes). */
struct pd_engine_req {
    uint64_t room;
    int32_t n_prompt;
    int32_t *tokens; /* [n_prompt + sp.max_new_tokens] prompt, then (decode) output ids */
    struct pd_sampling_params sp; /* max_new_tokens counts the prefill's first token */
    void *user;                   /* the loop's; never touched here */
    struct pd_engine_mm *mm;      /* images of the prompt (freed with the request); NULL: none */
    /* decode, when logprobs are asked for: [sp.max_new_tokens], set by the loop before ADD
     * (freed with the request); the compute thread fills entry i (top-n per sp.n_logprobs)
     * before the TOKEN event of index i and never writes it again. NULL: none kept. */
    struct pd_sample *samples;
    /* input (prompt) logprobs, when asked for: in_lp_start = logprob_start_len (-1: none) and
     * in_lp[n_prompt - in_lp_start], entry i for prompt token in_lp_start + i, scored from the
     * logits of the position before it (entry of token 0: logprob NAN, no logits before it).
     * Set by the loop before ADD (freed with the request); the compute thread fills every entry
     * before the first output token's event (prefill: the last SEND; colocated: TOKEN 0) and
     * never writes them again. The prefix cache serves at most the tokens before in_lp_start-1. */
    int32_t in_lp_start;
    struct pd_sample *in_lp;
    /* published by the compute thread before the event that names them */
    uint32_t *pages; /* [cap_pages] prefill: source pages; decode: destination pages */
    int32_t n_pages;
    int32_t cap_pages;
    /* pages[0..held_pages) already hold their tokens' KV on the decode side (its prefix cache):
     * decode: published with ADMIT, the Transfer asks only for the pages after them; prefill:
     * the Transfer's count, published with the first SEND (the loop sends only the pages after
     * them) */
    int32_t held_pages;
    int32_t held_first; /* decode: tokens its prefix cache held at the first admission (usage's
                           cached_tokens of a prompt prefilled here) */
    /* CLOCK_MONOTONIC seconds (uv_hrtime's clock) of the step that first took the request:
     * prefill: its first chunk's step; decode: its pages' reservation. 0 before. Metrics. */
    double t_scheduled;
    /* private to the compute thread */
    struct pd_sampler sampler;
    bool has_sampler;
    bool aborted, local, finished;
    /* decode: a request without a prefill (no bootstrap fields, --local-prefill): its prompt is
     * computed here when its pages are reserved; set by the loop before ADD */
    bool local_prefill;
    int finish;      /* enum pd_finish of the last token */
    int fail_status; /* the model refused a step with this */
    float first_logprob;
    int32_t n_out;
    int32_t in_lp_next; /* the next position whose logits score a prompt token */
    /* prefill: the first token's record (its top logprobs), written before the last SEND event
     * and never again; the loop reads it to put the top logprobs into the done notice */
    struct pd_sample first;
    int32_t slot;
    int32_t pen_slot; /* device penalty slot holding the state of every token recorded, or -1 */
};

/* Allocates a request for prompt tokens[0..n) (copied) with room for sp->max_new_tokens output
 * tokens and the pages it can need. PD_EINVAL, PD_ENOMEM. */
int pd_engine_req_new(uint64_t room, const int32_t *tokens, int32_t n, int page_size,
                      const struct pd_sampling_params *sp, struct pd_engine_req **out);
void pd_engine_req_free(struct pd_engine_req *r);
/* Frees a request's images (also before it has a request); accepts NULL. */
void pd_engine_mm_free(struct pd_engine_mm *mm);

enum pd_engine_cmd_kind {
    PD_ENGINE_CMD_ADD = 1,      /* req: a new request */
    PD_ENGINE_CMD_BOOTSTRAPPED, /* prefill: room's Transfer arrived */
    PD_ENGINE_CMD_XFER_END,     /* room's transfer ended: status (+ decode: first token) */
    PD_ENGINE_CMD_ABORT,        /* room: abort wherever it is */
    PD_ENGINE_CMD_FLUSH_CACHE,  /* drop unused prefix-cache entries */
    PD_ENGINE_CMD_PROBE,        /* room = probe id: one token through the model (health) */
};

struct pd_engine_cmd {
    int kind;
    uint64_t room;
    struct pd_engine_req *req;
    int status;
    int32_t first_token;
    float first_logprob;
    int32_t held_pages; /* BOOTSTRAPPED: the prompt's first pages the decode holds already */
};

enum pd_engine_event_kind {
    PD_ENGINE_EV_ADMIT = 1, /* decode: req->pages[0..n_pages) reserved; send Transfer */
    PD_ENGINE_EV_SEND,      /* prefill: req->pages[begin..end) may be sent; last: token too */
    PD_ENGINE_EV_TOKEN,     /* decode: one output token */
    PD_ENGINE_EV_QUIESCE,   /* decode: give the room up with the prefill (abort/timeout) */
    PD_ENGINE_EV_END,       /* the request is over here; req is the loop's again */
    PD_ENGINE_EV_FLUSHED,   /* flush_cache done; n_output = pages freed */
    PD_ENGINE_EV_PROBE,     /* room = probe id; status PD_OK (token sampled), PD_EFULL (no free
                               page: busy, not run) or why the forward pass failed */
};

struct pd_engine_event {
    int kind;
    uint64_t room;
    struct pd_engine_req *req;
    int32_t begin, end; /* SEND: page index range */
    bool last;          /* SEND: the prompt is complete: token/logprob are the first output */
    int32_t token;      /* SEND (last), TOKEN */
    float logprob;
    int32_t index;         /* TOKEN: output position (0 = the prefill's token) */
    int finish;            /* TOKEN, END: enum pd_finish */
    int reason;            /* END: enum pd_sched_end_reason */
    int status;            /* END: PD_OK, or why the request could not even start */
    int32_t cached_tokens; /* END (prefill) */
    int32_t n_output;      /* END (decode), FLUSHED */
};

/* Counters the compute thread publishes after every iteration (loop reads them any time). */
struct pd_engine_stats {
    int32_t pages_total, pages_free, pages_used, pages_cached;
    int32_t q_bootstrap, q_waiting, q_inflight; /* prefill; colocated: waiting */
    int32_t q_prealloc, q_transfer, q_running;  /* decode; colocated: running */
    int32_t q_draining;
    int64_t steps, tokens_computed;
    int64_t retractions;    /* decode: requests retracted (and recomputed) so far */
    int64_t local_prefills; /* decode: requests prefilled here (--local-prefill) so far */
    int64_t held_tokens;    /* decode: prompt tokens its own prefix cache served so far (their
                               pages neither moved nor computed here) */
    int64_t mixed_steps;    /* colocated: steps that carried prefill chunks and decode tokens */
    /* decode and colocated: output tokens chosen on the device (greedy_on_device) and from
     * logits downloaded to the host sampler (the prefill's first token is neither) */
    int64_t sampled_on_device, sampled_on_host;
    /* vision: images encoded, embedding cache lookups found / not found, the cache's size */
    int64_t mm_encoder_runs, mm_cache_hits, mm_cache_misses;
    int64_t mm_cache_bytes;
    int32_t mm_cache_entries;
};

/* Facts for /server_info, the bootstrap layout and the transfer engine. */
struct pd_engine_info {
    int vocab_size;
    int context_length;
    int n_layers, kv_heads, head_dim, page_size; /* kv_heads: per rank */
    int kv_heads_total;                          /* the model's */
    int kv_head_start[PD_TP_MAX];                /* rank r holds kv heads [this, this + kv_heads) */
    size_t page_bytes;                           /* one logical page: all ranks' */
    int32_t n_pages;
    void *pool_base;             /* the KV pool: host memory (cpu) or device memory (cuda) */
    int tp_size;                 /* ranks; 1 without tensor parallelism */
    void *pool_bases[PD_TP_MAX]; /* rank r's KV pool (pool_base == pool_bases[0]) */
    size_t shard_page_bytes;     /* one page of one rank's pool; page_bytes = tp_size * this */
    bool pool_on_device;         /* pool_base is device memory (cuda backend) */
    int device_index;            /* cuda: the GPU the pool lives on */
    const char *dtype;           /* the KV pool's, safetensors spelling ("BF16", "F8_E4M3") */
    const char *kv_cache_dtype;  /* the same as --kv-cache-dtype names it ("bfloat16") */
    const char *backend;
    const char *model_type;   /* "llama" */
    const char *architecture; /* "LlamaForCausalLM" */
    const int *eos_ids;
    int n_eos_ids;
};

typedef void (*pd_engine_event_fn)(void *ctx, const struct pd_engine_event *ev);

struct pd_engine;

/* Loads the model, sizes the pool, builds the scheduler. No thread yet. */
int pd_engine_new(const struct pd_engine_config *cfg, struct pd_engine **out);
void pd_engine_get_info(const struct pd_engine *e, struct pd_engine_info *out);

/* Starts the compute thread; events are delivered on loop through fn. */
int pd_engine_start(struct pd_engine *e, uv_loop_t *loop, pd_engine_event_fn fn, void *ctx);
/* Loop thread. PD_EFULL when the command queue is full (shed the request). Also before
 * pd_engine_start: the compute thread's first iteration takes every command queued by then. */
int pd_engine_submit(struct pd_engine *e, const struct pd_engine_cmd *c);
/* Any thread: the last published counters. */
void pd_engine_stats(const struct pd_engine *e, struct pd_engine_stats *out);
/* Loop thread: delivers the events queued now (the async callback does this too). */
void pd_engine_poll(struct pd_engine *e);
/* Loop thread: stops the compute thread after its current step and joins it; requests still
 * inside are ended there (their pages go back) and their EV_END events delivered now. Then the
 * uv handle is closed: run the loop before pd_engine_free. Idempotent. */
void pd_engine_stop(struct pd_engine *e);
/* After stop (and the loop ran), or when never started. Accepts NULL. */
void pd_engine_free(struct pd_engine *e);

/* Tests: the scheduler's own consistency check, run on the compute thread between steps and
 * published as a status (PD_OK or the first failure's code); -1 before the first check. */
int pd_engine_last_check(const struct pd_engine *e);

#endif
