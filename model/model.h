/*
 * model.h — the one forward pass for Llama, Mistral, Qwen2 and Qwen3 (DESIGN.md §4): GQA, RoPE
 * (rope_theta, llama3 scaling), RMSNorm, SwiGLU, q/k/v bias, per-head q/k norm, tied embeddings.
 * It computes what Hugging Face transformers computes in f32, over the page-major KV pool.
 *
 * Two entry points, both for a batch of requests:
 *  - extend: a chunk of new tokens per request whose first n_cached tokens already sit in its
 *    pages (chunked prefill; any prefix length, any chunk length, partial pages included);
 *  - decode: one new token per request.
 * Both write the new tokens' K/V into the requests' pages and return logits on the host.
 *
 * The model owns its weights (device tensors; on the cpu backend they alias the checkpoint
 * mapping, which it keeps open) and its step buffers, all taken at creation: a step allocates
 * nothing. It owns no pages and picks none: page lists come from the caller (the scheduler's
 * page allocator). Every request is checked before anything is written: a chunk past the
 * context length, a page list too short for the tokens, a page outside the pool, a token id
 * outside the vocabulary — each is an error, never an out-of-bounds write.
 */
#ifndef PD_MODEL_H
#define PD_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "model/backend.h"
#include "model/kv_pool.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "model/tp.h"

struct pd_model_opts {
    int max_tokens;     /* tokens in one step (the chunked-prefill budget); default 2048 */
    int max_reqs;       /* requests in one step; default 64 */
    int max_logit_rows; /* rows of logits one step may return; default max(max_reqs, 256) */
    int context_length; /* longest request; 0 = max_position_embeddings */
    int page_size;      /* KV page size the pool will use; default 16 */
    /* Tensor parallelism (model/tp.h): this rank's share of the heads and the MLP, summed
     * with the other ranks through tp. NULL = the whole model on this backend. */
    const struct pd_tp_comm *tp;
};

/* Rows that replace the token embedding of new tokens start .. start + n - 1 of a request's
 * step (an image's embeddings over its placeholder tokens, or the part of them a chunk holds). */
struct pd_model_embeds {
    int start, n;
    const float *rows; /* host [n][hidden_size] */
};

/* One request's share of a step. */
struct pd_model_seq {
    const int32_t *tokens; /* [n_new] token ids to run */
    int n_new;
    int n_cached;         /* tokens already in the pages: positions 0 .. n_cached-1 */
    const int32_t *pages; /* [n_pages] the request's pages, in token order */
    int n_pages;
    /* M-RoPE models (pd_model_config.mrope_section; ignored by others): the new tokens'
     * temporal, height and width positions, host [n_new][3]; NULL: all three are the token's
     * index + pos_delta (text after the prompt's images: pos_delta = mrope_position_delta). */
    const int32_t *mpos;
    int pos_delta;
    const struct pd_model_embeds *embeds; /* [n_embeds], inside the new tokens, apart */
    int n_embeds;
};

struct pd_model;

/* Finds a checkpoint tensor by its Hugging Face name; NULL when absent. */
typedef const struct pd_tensor_view *(*pd_model_find_fn)(void *ctx, const char *name);

/* Builds a model for cfg from the tensors find returns (they must stay valid while the model
 * lives). Shapes and dtypes are checked against cfg. */
int pd_model_new(struct pd_backend *be, const struct pd_model_config *cfg, pd_model_find_fn find,
                 void *find_ctx, const struct pd_model_opts *opts, struct pd_model **out);
/* Reads config.json (+ generation_config.json) and the safetensors in dir and builds the model;
 * the checkpoint stays mapped until pd_model_free. */
int pd_model_load(struct pd_backend *be, const char *dir, const struct pd_model_opts *opts,
                  struct pd_model **out);
void pd_model_free(struct pd_model *m);
/* Internal (model_load.c): the model frees owner with owner_free when it is freed. */
void pd__model_own(struct pd_model *m, void (*owner_free)(void *), void *owner);

const struct pd_model_config *pd_model_config_of(const struct pd_model *m);
/* Context length in force (opts or config). */
int pd_model_context_length(const struct pd_model *m);
/* Options with defaults filled in. */
const struct pd_model_opts *pd_model_opts_of(const struct pd_model *m);
/* Bytes of weights the model reads per token (all matrices once, the embedding row aside). */
size_t pd_model_weight_bytes(const struct pd_model *m);
/* KV pool options matching this model (n_pages and mem fraction left to the caller); with tp,
 * this rank's kv heads. */
struct pd_kv_pool_opts pd_model_kv_opts(const struct pd_model *m, enum pd_dtype kv_dtype);
/* This rank's kv heads in the config's numbering: [*start, *start + *count) (without tp, all of
 * them; with more ranks than kv heads, the one head the rank replicates). The KV transfer maps
 * pages between pools of different tp with it (common/xfer.h). */
void pd_model_kv_heads_of(const struct pd_model *m, int *start, int *count);

/* Runs seqs[0..n_seqs-1]. logits: host [n_out][vocab] f32 where n_out = n_seqs (last position
 * of each request) or, with all_logits, the total of n_new (every position, request-major). */
int pd_model_extend(struct pd_model *m, struct pd_kv_pool *kv, const struct pd_model_seq *seqs,
                    int n_seqs, bool all_logits, float *logits);
/* One token per request (every n_new must be 1). logits: host [n_seqs][vocab] f32 */
int pd_model_decode(struct pd_model *m, struct pd_kv_pool *kv, const struct pd_model_seq *seqs,
                    int n_seqs, float *logits);
/* pd_model_decode for greedy requests without penalties or top-n logprobs: the argmax runs on
 * the device and only ids[n_seqs] and logprobs[n_seqs] (host) come back, not the logits. */
int pd_model_decode_greedy(struct pd_model *m, struct pd_kv_pool *kv,
                           const struct pd_model_seq *seqs, int n_seqs, int32_t *ids,
                           float *logprobs);
struct pd_sample_row;
/* pd_model_decode choosing on the device: request r's token is chosen with rows[r]
 * (model/sampling.h: temperature, top-k/p, min-p, its u, and penalties from its penalty slot
 * and top-n, as pd_backend_sample says), as pd_sampler_next would on the host; ids and
 * logprobs (host [n_seqs]) come back, and the rows' top-n where asked. */
int pd_model_decode_sample(struct pd_model *m, struct pd_kv_pool *kv,
                           const struct pd_model_seq *seqs, int n_seqs,
                           const struct pd_sample_row *rows, int32_t *ids, float *logprobs);

#endif
