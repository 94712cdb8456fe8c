/*
 * pdfi.h — the C interface of libpdflashinfer (kernels/flashinfer/): FlashInfer's attention and
 * sampling templates (DESIGN.md §4, §6) instantiated for what pdserve uses and wrapped in plain C.
 * The library depends on the CUDA runtime alone: it knows nothing of pdserve's error state, so
 * every entry returns 0, a cudaError_t code (err[errlen] then names the entry), or
 * PDFI_EFLASHINFER when FlashInfer itself refused (a C++ exception, caught here; err holds its
 * message). kernels/cuda_status.c's pd__pdfi_status turns both into pdserve errors. Pointers are
 * device memory unless marked host; streams are cudaStream_t passed as void *.
 *
 * A shared library, not part of the static libpdkernels: its kernels (hundreds of SASS variants)
 * are then stored once, not once per binary that links the cuda backend.
 */
#ifndef PD_KERNELS_PDFI_H
#define PD_KERNELS_PDFI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PDFI_EFLASHINFER (-1)

/* the library is built with hidden visibility: only these entries are exported */
#if defined(__GNUC__)
#define PDFI_API __attribute__((visibility("default")))
#else
#define PDFI_API
#endif

/* Element types of q/o and of the KV pool. q/o are f16 for an f16 pool, bf16 otherwise. */
enum pdfi_dtype { PDFI_F16 = 1, PDFI_BF16, PDFI_E4M3, PDFI_E5M2 };

/* Whether the attention templates are instantiated for this pool type and head dim. */
PDFI_API bool pdfi_attention_supported(enum pdfi_dtype kv, int head_dim);

/* A step's attention plan, made on the host once per step and read by every layer's launch:
 * which kernel (PDFI_FA2: the FA2 template, decode and short extends, every pool type;
 * PDFI_SM90: the Hopper template, extend steps over 2-byte pools) and its FlashInfer plan info
 * (PrefillPlanInfo / PrefillPlanSM90Info as integers). */
enum pdfi_kernel { PDFI_FA2 = 1, PDFI_SM90 };
#define PDFI_SM90_MIN_ROWS 64 /* a request of this many rows makes a 2-byte pool's step SM90's */
struct pdfi_plan {
    int64_t info[16];
    enum pdfi_kernel kernel;
    int heads, kv_heads, head_dim, rows;
};

/* Workspace the plan and the kernels share: float_ws (device, split-KV partials), int_ws
 * (device) and int_ws_host (pinned host, same size): the plan writes the work items into the
 * pinned buffer and enqueues their copy to int_ws on the stream. */
struct pdfi_workspace {
    void *float_ws;
    size_t float_bytes;
    void *int_ws, *int_ws_host;
    size_t int_bytes;
};

/* Bytes of float workspace a GPU of sms multiprocessors needs for head dims up to head_dim. */
PDFI_API size_t pdfi_float_workspace_bytes(int sms, int head_dim);

/* Plans the causal attention of n_reqs requests: request r has rows qo_indptr[r]..[r+1] (host)
 * over kv pages page_indptr[r]..[r+1] (host) holding kv_len[r] keys (host), the last ones being
 * its new rows. graph: the plan of a CUDA-graph bucket (every request exactly one row; the
 * launch's shape then depends on n_reqs and the head counts alone, so a captured launch
 * replays with any later graph plan of the same bucket). sm90: the Hopper kernel may be chosen
 * (an sm_90 GPU). */
PDFI_API int pdfi_plan_step(struct pdfi_plan *plan, const struct pdfi_workspace *ws,
                            int32_t *qo_indptr, int32_t *page_indptr, int32_t *kv_len, int n_rows,
                            int n_reqs, int heads, int kv_heads, int head_dim, int page_size,
                            enum pdfi_dtype kv_dtype, bool graph, bool sm90, void *stream,
                            char *err, size_t errlen);

/* One layer's attention over the plan: o = softmax(q·kᵀ·scale, causal) · v. */
struct pdfi_attention_args {
    enum pdfi_dtype kv_dtype;
    const void *q; /* [rows][heads][head_dim] f16 (f16 pool) or bf16 */
    void *o;       /* [rows][heads][head_dim] of q's type */
    /* the layer's K and V blocks inside page 0; page p's are stride_page elements further */
    void *k, *v;
    int64_t stride_page, stride_n, stride_h;                         /* elements of the pool type */
    int32_t *qo_indptr, *page_indptr, *page_indices, *last_page_len; /* device */
    int n_reqs, page_size;
    float scale;
};
PDFI_API int pdfi_attention(const struct pdfi_plan *plan, const struct pdfi_workspace *ws,
                            const struct pdfi_attention_args *a, void *stream, char *err,
                            size_t errlen);

/* ---- sampling ---- */

/* out[r] drawn from probs[r] (each row summing to 1) restricted to its top_k[r] (>= vocab: all)
 * most likely tokens and to the shortest prefix of them whose mass before the token stays within
 * top_p[r], both on the row as given (FlashInfer's joint top-k/top-p rejection sampler).
 * Random numbers: Philox keyed by seed[r], counter (row, offset[r]). valid[r] false: the row
 * could not be sampled (NaN probabilities). */
struct pdfi_sample_args {
    float *probs; /* [rows][vocab] f32 */
    int rows, vocab;
    int32_t *top_k;          /* [rows] */
    float *top_p;            /* [rows] */
    uint64_t *seed, *offset; /* [rows] */
    int32_t *out;            /* [rows] */
    bool *valid;             /* [rows] */
    /* some row cuts by top-k / by top-p: without the one, the other's own sampler runs (fewer
     * passes a round); without both, plain sampling */
    bool any_top_k, any_top_p;
};
PDFI_API int pdfi_sample(const struct pdfi_sample_args *a, void *stream, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
