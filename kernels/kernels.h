/*
 * kernels.h — the C interface of kernels/ (DESIGN.md §4, STYLE.md rule 9): one params struct and
 * one entry per op. Each entry enqueues on the given stream, allocates nothing, and returns PD_OK
 * or the launch error translated by pd__cuda_status. Every pointer is device memory unless its
 * comment says host; shapes and units are in the trailing comments.
 *
 * Per-batch metadata (token ids, positions, KV slots, page tables, attention work items) lives in
 * device arrays the caller planned once per step (pd_kernel_attn_plan on the host); the entries
 * only read it, so a step's launches can be captured in a CUDA graph and replayed with new
 * metadata. Row counts of 0 are valid and launch nothing.
 */
#ifndef PD_KERNELS_H
#define PD_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "model/dtype.h"
#include "kernels/flashinfer/pdfi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cudaError_t → PD_E*, the one place CUDA runtime codes are read (STYLE.md rule 3); records
 * "what: <cuda message>" as the thread's error. cudaSuccess → PD_OK. */
int pd__cuda_status(cudaError_t err, const char *what);
/* A libpdflashinfer return (kernels/flashinfer/pdfi.h: 0, a cudaError_t, or PDFI_EFLASHINFER with
 * what = its message) → PD_E*, as pd__cuda_status. */
int pd__pdfi_status(int rc, const char *what);

/* The pool type as FlashInfer's kernels name it; 0 when they have none for it (f32). */
static inline enum pdfi_dtype pd_kernel_fi_dtype(enum pd_dtype dt) {
    switch (dt) {
    case PD_DTYPE_F16: return PDFI_F16;
    case PD_DTYPE_BF16: return PDFI_BF16;
    case PD_DTYPE_F8E4M3: return PDFI_E4M3;
    case PD_DTYPE_F8E5M2: return PDFI_E5M2;
    case PD_DTYPE_F32: break;
    }
    return (enum pdfi_dtype)0;
}

/* ---- row ops ---- */

/* If add: x += add (x written back); then out = x / rms(x) * w. x and out may alias. */
struct pd_kernel_rmsnorm_params {
    float *x;         /* [rows][dim] f32 */
    const float *add; /* [rows][dim] f32 residual, or NULL */
    const void *w;    /* [dim] of w_dtype */
    enum pd_dtype w_dtype;
    float *out; /* [rows][dim] f32 */
    int64_t rows;
    int dim;
    float eps;
    void *out2; /* [rows][dim] of out2_dtype (bf16/f16): out again, as the next GEMM's input; or
                   NULL */
    enum pd_dtype out2_dtype;
};
int pd_kernel_rmsnorm(const struct pd_kernel_rmsnorm_params *p, cudaStream_t s);

/* Half-split rotary embedding in place at positions[i] (the HF rotate_half convention). */
struct pd_kernel_rope_params {
    float *x;                 /* [n][heads][head_dim] f32 */
    const int32_t *positions; /* [n] */
    const float *inv_freq;    /* [head_dim/2] f32, llama3-scaled by the model when configured */
    int64_t n;
    int heads, head_dim;
};
int pd_kernel_rope(const struct pd_kernel_rope_params *p, cudaStream_t s);

/* out = silu(gate) * up (SwiGLU), or with add_only: out = gate + up. Elementwise. */
struct pd_kernel_swiglu_params {
    const float *gate, *up; /* [count] f32 */
    float *out;             /* [count] f32, may alias gate or up */
    int64_t count;
    bool add_only;
};
int pd_kernel_swiglu(const struct pd_kernel_swiglu_params *p, cudaStream_t s);

/* y[r][j] += bias[j]. */
struct pd_kernel_bias_params {
    float *y;         /* [rows][m] f32 */
    const void *bias; /* [m] of bias_dtype */
    enum pd_dtype bias_dtype;
    int64_t rows, m;
};
int pd_kernel_bias(const struct pd_kernel_bias_params *p, cudaStream_t s);

/* out[i] = table[ids[i]] widened to f32; ids outside [0, vocab) give a zero row. */
struct pd_kernel_embed_params {
    const void *table; /* [vocab][dim] of dtype */
    enum pd_dtype dtype;
    int64_t vocab;
    int dim;
    const int32_t *ids; /* [n] */
    float *out;         /* [n][dim] f32 */
    int64_t n;
};
int pd_kernel_embed(const struct pd_kernel_embed_params *p, cudaStream_t s);

/* dst[j] = src[rows[j]] over width floats; src and dst must not overlap. */
struct pd_kernel_gather_params {
    const float *src;    /* [?][width] f32 */
    const int32_t *rows; /* [n] */
    float *dst;          /* [n][width] f32 */
    int64_t n;
    int width;
};
int pd_kernel_gather_rows(const struct pd_kernel_gather_params *p, cudaStream_t s);

/* f32 → dtype (bf16/f16/f32) conversion, e.g. activations before a tensor-core GEMM. */
struct pd_kernel_convert_params {
    const float *src;
    void *dst;
    enum pd_dtype dtype;
    int64_t count;
};
int pd_kernel_convert(const struct pd_kernel_convert_params *p, cudaStream_t s);

/* dtype (bf16/f16/f32) → f32, e.g. FlashInfer's attention output back into the f32 activations. */
struct pd_kernel_widen_params {
    const void *src;
    enum pd_dtype dtype;
    float *dst;
    int64_t count;
};
int pd_kernel_widen(const struct pd_kernel_widen_params *p, cudaStream_t s);

/* ---- KV cache (page-major: page p = for every layer K then V, each [page_size][kv_heads][hd]) */

struct pd_kernel_kv_geom {
    void *base; /* pool */
    int64_t n_pages;
    int n_layers, page_size, kv_heads, head_dim;
    enum pd_dtype dtype;
    size_t page_bytes;
};

/* K/V rows of n tokens → their slots (page * page_size + offset) of layer; slot < 0 is skipped
 * (padding rows of a graph bucket). */
struct pd_kernel_kv_store_params {
    struct pd_kernel_kv_geom kv;
    int layer;
    const float *k, *v;   /* [n][kv_heads][head_dim] f32 */
    const int32_t *slots; /* [n] */
    int64_t n;
};
int pd_kernel_kv_store(const struct pd_kernel_kv_store_params *p, cudaStream_t s);

/* Rotary embedding of q and k at positions[i] (as pd_kernel_rope on each), k and v stored at
 * slots[i] of layer (as pd_kernel_kv_store), and the rotated q also written in q_out_dtype
 * (bf16/f16) to q_out when that is not NULL (FlashInfer's query): one launch for the four. */
struct pd_kernel_rope_store_params {
    float *q;                         /* [n][heads][head_dim] f32, rotated in place */
    float *k;                         /* [n][kv.kv_heads][kv.head_dim] f32, rotated in place */
    const float *v;                   /* [n][kv.kv_heads][kv.head_dim] f32 */
    const int32_t *positions, *slots; /* [n] */
    const float *inv_freq;            /* [head_dim/2] */
    int64_t n;
    int heads;
    struct pd_kernel_kv_geom kv;
    int layer;
    void *q_out; /* [n][heads][head_dim] of q_out_dtype, or NULL */
    enum pd_dtype q_out_dtype;
};
int pd_kernel_rope_store(const struct pd_kernel_rope_store_params *p, cudaStream_t s);

/* Whole pages: dst page dst_pages[i] = src page src_pages[i] (page_bytes each, 16-byte aligned
 * pools). With src_pages NULL, the source is a contiguous run staged at src (gather's inverse);
 * with dst_pages NULL, pages are gathered contiguously to dst (for a transfer's staging). */
struct pd_kernel_page_copy_params {
    void *dst;
    const void *src;
    const int32_t *dst_pages; /* [n] or NULL */
    const int32_t *src_pages; /* [n] or NULL */
    int64_t n;
    size_t page_bytes;
};
int pd_kernel_page_copy(const struct pd_kernel_page_copy_params *p, cudaStream_t s);

/* ---- paged attention ---- */

/* Rows of a work item: PD_KERNEL_ATTN_ROWS (query token, head-in-group) pairs of one request and
 * one kv head, over keys [kv_begin, kv_end) of the request (each row also stops at its causal
 * limit). Items of one request that split its keys write partials the reduce kernel combines. */
#define PD_KERNEL_ATTN_ROWS 16
#define PD_KERNEL_ATTN_MAX_SPLITS 16

struct pd_kernel_attn_item {
    int32_t req;      /* request of the batch; -1 = padding (nothing to do) */
    int32_t row0;     /* first flattened row (token_in_request * group + g) */
    int32_t kv_begin; /* key range of this item */
    int32_t kv_end;
    int32_t split;    /* index of this key range among the request's splits */
    int32_t n_splits; /* 1: write out directly */
};

/* Per-step plan, built on the host (pd_kernel_attn_plan) and copied to the device. */
struct pd_kernel_attn_batch {
    const int32_t *req_tok_start;  /* [n_reqs + 1] */
    const int32_t *req_kv_len;     /* [n_reqs] */
    const int32_t *req_page_start; /* [n_reqs + 1] */
    const int32_t *page_table;     /* [..] */
    const int32_t *tok_req;        /* [n_tokens] */
    const int32_t *tok_splits;     /* [n_tokens] splits of the token's request (1 = none) */
    const struct pd_kernel_attn_item *items; /* [n_items] */
    int n_items;
    int n_tokens;
    int max_splits;    /* largest n_splits of any item: 1 = no reduce launch */
    int rows_per_item; /* 4 or PD_KERNEL_ATTN_ROWS, as planned */
};

struct pd_kernel_attn_params {
    struct pd_kernel_kv_geom kv;
    int layer;
    struct pd_kernel_attn_batch b;
    const float *q; /* [n_tokens][heads][head_dim] f32 */
    float *out;     /* [n_tokens][heads][head_dim] f32 */
    int heads;
    float scale;
    /* split partials, needed when b.max_splits > 1 */
    float *part_o;  /* [n_tokens][heads][PD_KERNEL_ATTN_MAX_SPLITS][head_dim] f32 */
    float *part_ml; /* [n_tokens][heads][PD_KERNEL_ATTN_MAX_SPLITS][2] f32 (max, sum) */
};
/* head_dim 64, 128 (fast paths) or any even value up to 256 (generic). */
int pd_kernel_attention(const struct pd_kernel_attn_params *p, cudaStream_t s);

/* Host side of the plan/run split: the work items of one step. */
struct pd_kernel_attn_plan_in {
    int n_reqs;
    const int32_t *req_tok_start; /* host [n_reqs + 1] */
    const int32_t *req_kv_len;    /* host [n_reqs] */
    int group, kv_heads;          /* query heads per kv head; kv heads */
    /* > 0: every request gets exactly this many key splits and pad_reqs - n_reqs padding
     * requests get padding items, so the item count depends on pad_reqs alone (a CUDA graph
     * bucket's fixed grid). 0: splits are chosen per request to fill about target_blocks. */
    int fixed_splits, pad_reqs;
    int target_blocks;    /* e.g. 2 × multiprocessors */
    int max_split_tokens; /* tokens the split partial buffers hold; larger steps never split */
};
/* Fills items (cap_items of room), tok_splits (host [n_tokens]) and the counts of out (its
 * pointers are left to the caller). PD_ERANGE-like -1 when cap_items is too small. */
int pd_kernel_attn_plan(const struct pd_kernel_attn_plan_in *in, struct pd_kernel_attn_item *items,
                        int cap_items, int32_t *tok_splits, struct pd_kernel_attn_batch *out);
/* Items a plan can need at most: for a bucket of n_reqs decode requests, or for n_tokens. */
int pd_kernel_attn_max_items(int n_tokens, int n_reqs, int group);

/* ---- sampling ---- */

/* Greedy fast path: ids[r] = argmax of logits[r] (lowest index on ties), logprob[r] its
 * log-softmax (NULL to skip). */
struct pd_kernel_argmax_params {
    const float *logits; /* [rows][vocab] f32 */
    int64_t rows;
    int vocab;
    int32_t *ids;   /* [rows] */
    float *logprob; /* [rows] or NULL */
    void *scratch;  /* device, pd_kernel_argmax_scratch_bytes: the slices' partials */
    size_t scratch_bytes;
};
int pd_kernel_argmax(const struct pd_kernel_argmax_params *p, cudaStream_t s);
size_t pd_kernel_argmax_scratch_bytes(int64_t rows, int vocab);

#define PD_KERNEL_MAX_TOP 20 /* = PD_SAMPLING_MAX_LOGPROBS */

/* One row's sampling parameters, as model/sampling.h's pd_sample_row. */
struct pd_kernel_sample_row {
    float temperature;     /* < 1e-5 (or top_k 1): greedy */
    int32_t top_k;         /* <= 0: all */
    float top_p;           /* (0, 1] */
    float min_p;           /* [0, 1] */
    double u;              /* the request's uniform [0, 1) draw */
    int32_t slot;          /* penalty state row (pd_kernel_sample_params.state), -1: no penalties */
    float rep, freq, pres; /* repetition, frequency, presence penalties */
    int32_t n_top;         /* top-n of the raw row to report, 0..PD_KERNEL_MAX_TOP */
};
/* ids[r] = the token chosen from logits[r] with row[r], as model/sampling.c's
 * pd_sampling_choose chooses it: greedy rows (temperature < 1e-5 or top_k 1) the argmax (lowest
 * id on ties), the others a draw from the softmax at the row's temperature restricted by top-k,
 * top-p and min-p (FlashInfer's sampler: the same distribution as the host's, other random
 * numbers, keyed by the row's u); logprob[r] its log-softmax under the raw row (NULL to skip).
 * Rows with a slot see their logits through pd_sampling_penalize with state[slot] (bit 31: in
 * the prompt; bits 0..30: output count), and the chosen token is counted in state[slot] at the
 * end: no two rows of a launch may share a slot. Rows with n_top > 0 get the raw row's n_top
 * most likely tokens (logit desc, id asc) and their logprobs in top_ids / top_lp [r][0..n_top).
 * The draw needs scratch (pd_kernel_sample_scratch_bytes) when any_drawn. */
struct pd_kernel_sample_params {
    const float *logits; /* [rows][vocab] f32 */
    int64_t rows;
    int vocab;
    const struct pd_kernel_sample_row *row; /* [rows] */
    int32_t *ids;                           /* [rows] */
    float *logprob;                         /* [rows] or NULL */
    int32_t *state;                         /* [n_slots][vocab] or NULL (no row has a slot) */
    int n_slots;
    int32_t *top_ids; /* [rows][PD_KERNEL_MAX_TOP]; NULL when no row has n_top */
    float *top_lp;    /* [rows][PD_KERNEL_MAX_TOP] */
    /* what the host knows of row[]: some row is not greedy / has a slot / has min_p > 0 /
     * keeps fewer than all tokens by top_k / has top_p < 1 (the draw then takes the sampler
     * that does only what the rows need) */
    bool any_drawn, any_penalized, any_min_p, any_top_k, any_top_p;
    void *scratch; /* device, scratch_bytes */
    size_t scratch_bytes;
};
/* Scratch a launch of rows rows of vocab logits needs for the draw. */
size_t pd_kernel_sample_scratch_bytes(int64_t rows, int vocab);
int pd_kernel_sample(const struct pd_kernel_sample_params *p, cudaStream_t s);
/* The perf mode's phase timing: while set, a drawing pd_kernel_sample records ev[0] before its
 * first launch and ev[1..4] after the statistics (and the draw's arguments), the softmax (and
 * min-p), the draw and the finish (the logprobs, top-n, penalty counts). NULL turns it off. */
#define PD_KERNEL_SAMPLE_PHASES 4
void pd_kernel_sample_trace(cudaEvent_t *ev, int n);

/* A penalty slot's state from a request's tokens: the row zeroed, then bit 31 set for each of
 * ids[0..n_prompt) and the count bumped for each of ids[n_prompt..n_prompt+n_out); ids outside
 * [0, vocab) are skipped. ids is device memory. */
struct pd_kernel_penalty_set_params {
    int32_t *state_row; /* [vocab] the slot's row */
    int vocab;
    const int32_t *ids; /* [n_prompt + n_out] */
    int n_prompt, n_out;
};
int pd_kernel_penalty_set(const struct pd_kernel_penalty_set_params *p, cudaStream_t s);

/* ---- products of one input by weights stored back to back ---- */

/* One product of a group: its weight [m][k] (back to back with the previous segment's in a
 * cuBLAS group), bias [m] (same dtype) or NULL, output [rows][m] f32. */
#define PD_KERNEL_PRODUCT_SEGS 3
struct pd_kernel_product_seg {
    const void *w;
    const void *bias;
    float *y;
    int64_t m;
};

/* Few-row products (kernels/gemv.cu): y_s = x · w_sᵀ + bias_s for each segment, x rounded to
 * dtype. silu_pair (two segments of equal m: gate, up): y_0 = silu(gate) * up, y_1 = up, as
 * the products followed by pd_kernel_swiglu leave them. */
#define PD_KERNEL_GEMV_MAX_ROWS 4
struct pd_kernel_gemv_params {
    const float *x; /* [rows][k] f32 */
    int64_t rows, k;
    enum pd_dtype dtype; /* of the weights and biases: bf16 or f16 */
    int n_seg;
    struct pd_kernel_product_seg seg[PD_KERNEL_PRODUCT_SEGS];
    bool silu_pair;
    int sms; /* multiprocessors of the device, for the grid */
};
/* Once per device before the first launch (shared-memory opt-in). */
int pd_kernel_gemv_init(void);
/* Whether pd_kernel_gemv takes rows x k of dtype (weights 16-byte aligned are the caller's). */
bool pd_kernel_gemv_takes(int64_t rows, int64_t k, enum pd_dtype dtype);
int pd_kernel_gemv(const struct pd_kernel_gemv_params *p, cudaStream_t s);

/* A group's single GEMM output [rows][Σ m] split into the segments' outputs with their biases
 * added (y_s[r][j] = src[r][off_s + j] + bias_s[j]); silu_pair as pd_kernel_gemv's. */
struct pd_kernel_split_params {
    const float *src;
    int64_t rows;
    enum pd_dtype bias_dtype;
    int n_seg;
    struct pd_kernel_product_seg seg[PD_KERNEL_PRODUCT_SEGS]; /* w unused */
    bool silu_pair;
};
int pd_kernel_split(const struct pd_kernel_split_params *p, cudaStream_t s);

/* ---- GEMM (cuBLAS, bf16/f16 tensor cores with f32 accumulation) ---- */

struct pd_kernel_gemm;
/* A cuBLAS handle on stream s with workspace_bytes of workspace allocated now (graph capture
 * needs a fixed workspace). */
int pd_kernel_gemm_new(cudaStream_t s, size_t workspace_bytes, struct pd_kernel_gemm **out);
void pd_kernel_gemm_free(struct pd_kernel_gemm *g);

/* y[rows][m] = x[rows][k] · w[m][k]ᵀ with x already in w's dtype (bf16/f16: tensor cores, f32
 * accumulate and output; f32: sgemm). */
struct pd_kernel_gemm_params {
    const void *x; /* [rows][k] of dtype */
    const void *w; /* [m][k] of dtype */
    enum pd_dtype dtype;
    float *y; /* [rows][m] f32 */
    int64_t rows, m, k;
};
int pd_kernel_gemm_run(struct pd_kernel_gemm *g, const struct pd_kernel_gemm_params *p);

#ifdef __cplusplus
}
#endif

#endif
