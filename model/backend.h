/*
 * backend.h — the compute interface the model runs on (DESIGN.md §4): a device with its own
 * memory, a stream that executes ops in the order they were enqueued, and the handful of ops a
 * Llama-family forward needs. Two backends implement it: cpu (model/cpu/backend_cpu*.c) and cuda
 * (kernels/, linked in when built); model/model* only ever calls what is declared here.
 *
 * Invariants:
 *  - Every pointer an op takes is a device pointer (from pd_backend_alloc or a weight tensor),
 *    except where a parameter says "host". Ops enqueue and may return before the work is done;
 *    pd_backend_sync waits for the stream. Results reach the host only through pd_backend_download.
 *  - Device memory is taken at init (weights, KV pool, activation buffers): nothing here
 *    allocates on the per-step path. Per-step metadata (positions, page tables, KV slots) is
 *    planned once per step by pd_backend_set_batch into buffers sized by pd_backend_reserve,
 *    then every layer's ops read it (STYLE.md rule 9: plan once, run per layer).
 *  - Activations are f32; weights may be f32, bf16 or f16 and stay in that type on the device.
 * This interface owns no model knowledge beyond the op shapes and schedules nothing; it samples
 * only through pd_backend_argmax / pd_backend_sample, the host sampler's rules on the device.
 */
#ifndef PD_BACKEND_H
#define PD_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/dtype.h"

enum pd_backend_kind {
    PD_BACKEND_CPU = 0,
    PD_BACKEND_CUDA = 1,
};

struct pd_backend_opts {
    enum pd_backend_kind kind;
    int threads;      /* cpu: worker threads incl. the caller; 0 = one per online core */
    int device_index; /* cuda: which GPU */
};

/* A 2-D row-major tensor that lives on a backend's device (1-D: rows == 1). */
struct pd_tensor {
    enum pd_dtype dtype;
    int64_t rows, cols;
    const void *data; /* device */
    int layout;       /* 0: row-major [rows][cols]; else the backend's own arrangement */
};

/* KV pool geometry (DESIGN.md §3, page-major): page p starts at base + p * page_bytes and holds,
 * for layer 0..n_layers-1, K then V, each [page_size][kv_heads][head_dim] of dtype. */
struct pd_kv_layout {
    void *base; /* device */
    int64_t n_pages;
    int n_layers, page_size, kv_heads, head_dim;
    enum pd_dtype dtype;
    size_t page_bytes; /* n_layers * 2 * page_size * kv_heads * head_dim * dtype size */
};

/* One step's batch, described on the host by the model; the backend copies it to the device.
 * Tokens of request r are rows req_tok_start[r] .. req_tok_start[r+1]-1 of every activation;
 * their K/V go to slots[i] (= page * page_size + offset) and they attend causally to the
 * req_kv_len[r] tokens the request has in its pages once this step's are written. */
struct pd_batch_plan {
    int n_reqs, n_tokens;
    const int32_t *token_ids;      /* host [n_tokens] */
    const int32_t *positions;      /* host [n_tokens] */
    const int32_t *slots;          /* host [n_tokens] */
    const int32_t *req_tok_start;  /* host [n_reqs + 1] */
    const int32_t *req_kv_len;     /* host [n_reqs] */
    const int32_t *req_page_start; /* host [n_reqs + 1] offsets into page_table */
    const int32_t *page_table;     /* host [req_page_start[n_reqs]] page indices */
    int n_out_rows;                /* rows whose logits are wanted */
    const int32_t *out_rows;       /* host [n_out_rows] token rows, ascending */
};

/* Capacities pd_backend_reserve sizes the per-step metadata and scratch for. */
struct pd_backend_limits {
    int max_tokens;  /* tokens in one step */
    int max_reqs;    /* requests in one step */
    int max_pages;   /* page-table entries in one step */
    int max_context; /* longest kv_len of one request */
    int max_heads;   /* query heads */
    int max_head_dim;
    int max_dim; /* widest matmul input (k) */
};

struct pd_backend;

/* Creates a backend. kind cuda without the CUDA backend linked in is PD_EUNSUPPORTED. Defined by
 * the registry (model/backend_reg.c, library pdbackends), which names the backends of the build;
 * the rest of this interface is backend.c's (library pdmodel). */
int pd_backend_new(const struct pd_backend_opts *opts, struct pd_backend **out);
void pd_backend_free(struct pd_backend *be);
enum pd_backend_kind pd_backend_kind_of(const struct pd_backend *be);
const char *pd_backend_name(const struct pd_backend *be); /* "cpu (8 threads)" */
/* Device memory: total and currently available to us, bytes. */
int pd_backend_mem_info(struct pd_backend *be, size_t *total, size_t *avail);

/* Device buffers (process lifetime: call at init). Contents are zeroed. */
int pd_backend_alloc(struct pd_backend *be, size_t bytes, void **out);
void pd_backend_release(struct pd_backend *be, void *p);
/* Backs every page of the buffer [p, p + bytes) with memory now (the CPU's zeroed pages are
 * mapped at first touch otherwise: a fault each, on whatever path touches them first). */
void pd_backend_make_resident(struct pd_backend *be, void *p, size_t bytes);
/* Sizes per-step metadata and op scratch; call after weights are known, before any op. Each
 * model on the backend (the language model, a vision encoder) reserves what it needs: a later
 * call keeps the largest of every limit reserved so far, so the order does not matter. */
int pd_backend_reserve(struct pd_backend *be, const struct pd_backend_limits *lim);

/* A weight for the device from host bytes (e.g. a checkpoint mapping) that stay valid and
 * unchanged until pd_backend_free: a backend sharing memory with the host may alias them,
 * others copy. rows*cols*dtype size bytes at host. */
int pd_backend_weight(struct pd_backend *be, enum pd_dtype dtype, int64_t rows, int64_t cols,
                      const void *host, struct pd_tensor *out);

/* Weights the model multiplies by one input together (q, k and v; their biases; gate and up),
 * made to lie back to back in this order, so a backend may run their products as one: n of
 * them (at most 8), all of one dtype. Their data pointers may change; a backend without such
 * products leaves them as they are. */
int pd_backend_weight_pack(struct pd_backend *be, struct pd_tensor *const *ts, int n);

int pd_backend_upload(struct pd_backend *be, void *dst /* device */, const void *src /* host */,
                      size_t bytes);
/* Waits for the stream, then copies. */
int pd_backend_download(struct pd_backend *be, void *dst /* host */, const void *src /* device */,
                        size_t bytes);
int pd_backend_sync(struct pd_backend *be);

/* ---- per step ---- */

/* Copies the plan to the device. PD_ERANGE when it exceeds the reserved limits. */
int pd_backend_set_batch(struct pd_backend *be, const struct pd_batch_plan *plan);

/* ---- ops on the current batch (all enqueue; n = the batch's n_tokens unless stated) ---- */

/* out[i] = table[token_ids[i]] as f32.  table [vocab][hidden]; out [n][hidden] f32 */
void pd_backend_embed(struct pd_backend *be, const struct pd_tensor *table, float *out);
/* out[r] = x[r] / rms(x[r]) * w for rows rows of width dim (out may equal x). w [dim] */
void pd_backend_rmsnorm(struct pd_backend *be, const float *x, const struct pd_tensor *w,
                        int64_t rows, int dim, float eps, float *out);
/* y = x · wᵀ (+ bias).  x [rows][k] f32; w [m][k]; bias [m] or NULL; y [rows][m] f32 */
void pd_backend_matmul(struct pd_backend *be, const float *x, int64_t rows,
                       const struct pd_tensor *w, const struct pd_tensor *bias, float *y);
/* Rotary embedding in place, half-split (rotate_half) convention, at the batch's positions.
 * x [n][heads][head_dim] f32; inv_freq [head_dim/2] f32 (device) */
void pd_backend_rope(struct pd_backend *be, float *x, int heads, int head_dim,
                     const float *inv_freq);
/* out = silu(gate) * up, elementwise over count values. */
void pd_backend_silu_mul(struct pd_backend *be, const float *gate, const float *up, float *out,
                         int64_t count);
/* x += y over count values. */
void pd_backend_add(struct pd_backend *be, float *x, const float *y, int64_t count);
/* Writes the batch's K and V rows of layer into their slots.  k, v [n][kv_heads][head_dim] f32 */
void pd_backend_kv_store(struct pd_backend *be, const struct pd_kv_layout *kv, int layer,
                         const float *k, const float *v);
/* Causal attention of the batch's queries over each request's pages (after kv_store), GQA by
 * heads / kv_heads, scaled by scale. window > 0: a query at position p sees only keys
 * p - window + 1 .. p (the sliding window of Mistral / Qwen, as transformers masks it); 0: all
 * keys 0 .. p. The cuda backend takes window 0 only (the model refuses such a model there).
 * q [n][heads][head_dim]; out [n][heads][head_dim] f32 */
void pd_backend_attention(struct pd_backend *be, const struct pd_kv_layout *kv, int layer,
                          const float *q, int heads, float scale, int window, float *out);
/* dst[j] = src[out_rows[j]] for the plan's out rows.  src [n][width]; dst [n_out_rows][width] */
void pd_backend_gather_out_rows(struct pd_backend *be, const float *src, int width, float *dst);

/* ---- vision encoder ops (model/vision/vision_encoder.h): no batch plan, explicit rows ---- */

/* Whether this backend has the four ops below; the vision encoder refuses one that does not. */
bool pd_backend_has_vision(const struct pd_backend *be);
/* torch's LayerNorm: out[r] = (x[r] - mean) / sqrt(var + eps) * w + b, the variance biased, for
 * rows rows of width dim (out may equal x). w, b [dim] */
void pd_backend_layernorm(struct pd_backend *be, const float *x, const struct pd_tensor *w,
                          const struct pd_tensor *b, int64_t rows, int dim, float eps, float *out);
enum pd_act {
    PD_ACT_GELU = 0,       /* torch's nn.GELU(): 0.5 x (1 + erf(x / sqrt 2)) */
    PD_ACT_QUICK_GELU = 1, /* transformers' QuickGELU: x · sigmoid(1.702 x) */
};
/* out = act(x), elementwise over count values (out may equal x). */
void pd_backend_act(struct pd_backend *be, enum pd_act act, const float *x, float *out,
                    int64_t count);
/* Half-split rotary embedding in place by explicit angles: row i, pair d of every head turns by
 * angles[i][d] (x[d] cos - x[d + h] sin, x[d + h] cos + x[d] sin, h = head_dim / 2).
 * x [rows][heads][head_dim] f32; angles [rows][head_dim / 2] f32 (device) */
void pd_backend_rope_angles(struct pd_backend *be, float *x, int64_t rows, int heads, int head_dim,
                            const float *angles);
/* Attention without a mask inside segments: row i of segment s (seg_start[s] <= i <
 * seg_start[s + 1]) attends to every row of its segment, softmax(q · kᵀ · scale) · v, per
 * head. q, k, v, out [seg_start[n_segs]][heads][head_dim] f32; seg_start (device) [n_segs + 1]
 * int32, ascending from 0. */
void pd_backend_attention_segments(struct pd_backend *be, const float *q, const float *k,
                                   const float *v, int heads, int head_dim,
                                   const int32_t *seg_start, int n_segs, float scale, float *out);

/* Greedy fast path (a sync point, like download): ids[r] = argmax of x[r] (lowest index on
 * ties) and logprobs[r] = its log-softmax, for rows (<= the reserved max_tokens) of width cols.
 * x is device f32 (e.g. the model's logits); ids and logprobs are host [rows]. Only 8 bytes a
 * row leave the device. */
int pd_backend_argmax(struct pd_backend *be, const float *x, int rows, int cols, int32_t *ids,
                      float *logprobs);

/* Penalty state on the device (process lifetime: call once at init, before any sample row is
 * penalized): slots rows of a vocabulary of vocab, each one request's output-token counts and
 * prompt-token set ([slots][vocab] int32: bit 31 the prompt has the token, bits 0..30 how often
 * the output has it; slots × vocab × 4 bytes, e.g. 156 MB for 256 slots of Qwen's 151936), and
 * staging for max_ids token ids per pd_backend_penalty_set. Calling it again is PD_EINVAL. */
int pd_backend_penalty_reserve(struct pd_backend *be, int slots, int vocab, int max_ids);
/* Sets slot's state from a request's tokens: the prompt (host [n_prompt]; the repetition
 * penalty's set) and the outputs so far (host [n_out], counted). Ids outside the vocabulary
 * are ignored, as the host sampler ignores them. Then every pd_backend_sample row penalized
 * with this slot applies its penalties and counts the token it chooses, so the state follows
 * the request on the device and nothing but the row's parameters goes up per step. A sync
 * point; O(n_prompt + n_out) bytes go up. PD_ERANGE: slot or n_prompt + n_out out of range. */
int pd_backend_penalty_set(struct pd_backend *be, int slot, const int32_t *prompt, int n_prompt,
                           const int32_t *out, int n_out);

struct pd_sample_row;
/* Sampling fast path (a sync point): for each row r of x (device f32 [rows][cols], rows <= the
 * reserved max_tokens) and its parameters row[r] (host [rows]):
 *  - penalized rows: the logits go through pd_sampling_penalize with row[r].slot's state (as
 *    pd_sampler_next applies them; cols must be the reserved penalty vocab, and no two rows of
 *    a call may share a slot), and afterwards the chosen token is counted in that state;
 *  - ids[r] = the token model/sampling.c's pd_sampling_choose picks from them with the row's
 *    temperature, top-k, top-p, min-p and u (greedy: the argmax);
 *  - logprobs[r] = its log-softmax under the raw x[r] (the model's distribution);
 *  - rows with n_logprobs > 0: row[r].top gets the raw row's top-n (pd_sampling_logprobs).
 * x itself is not modified. The cuda backend does all of it on the device: 8 bytes a row, plus
 * 8 per top-n entry, come back; the cpu backend calls model/sampling.c's own functions.
 * PD_EINVAL names the row whose parameters are out of range. */
int pd_backend_sample(struct pd_backend *be, const float *x, int rows, int cols,
                      const struct pd_sample_row *row, int32_t *ids, float *logprobs);

#endif
