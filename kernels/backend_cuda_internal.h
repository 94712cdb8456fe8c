/*
 * backend_cuda_internal.h — what the cuda backend's two files share: the op log's entries, the
 * backend's state, the few helpers both read, and the one call between them. backend_cuda.c
 * records ops, plans and uploads a step's metadata and runs the log eagerly or as a captured
 * graph; backend_cuda_fuse.c turns the logged ops into kernel launches, fusing each with the ops
 * after it where they allow. Internal to kernels/: nothing outside includes it.
 */
#ifndef PD_BACKEND_CUDA_INTERNAL_H
#define PD_BACKEND_CUDA_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/backend_cuda.h"
#include "kernels/kernels.h"
#include "model/backend_impl.h"

#define PD_CUDA_LOG_OPS 8192 /* ops one step may enqueue before an early flush */
#define PD_CUDA_N_BUCKETS 14 /* decode batch-size buckets: graph_buckets of backend_cuda.c */

enum op_kind {
    OP_EMBED = 1,
    OP_RMSNORM,
    OP_MATMUL,
    OP_ROPE,
    OP_SILU_MUL,
    OP_ADD,
    OP_KV_STORE,
    OP_ATTENTION,
    OP_GATHER,
};

/* One logged op; memset before filling so fingerprints never hash padding garbage. */
struct op {
    enum op_kind kind;
    int dim, heads, layer;
    int64_t count; /* rows or values; scaled to the bucket in a graph step */
    struct pd_tensor w, bias;
    const float *x, *y, *inv_freq;
    float *out;
    float eps, scale;
    struct pd_kv_layout kv;
};

struct graph_slot {
    cudaGraphExec_t exec;
    uint64_t fingerprint;
    bool broken; /* capture failed once: run this bucket eagerly */
};

/* Byte offsets of the per-step arrays inside the metadata buffers (host pinned and device),
 * fixed at reserve. A step copies two used prefixes: everything up to the end of its page table,
 * and its attention items. */
struct meta_layout {
    size_t token_ids, positions, slots, out_rows, tok_splits; /* [max_tokens] int32 */
    size_t req_tok_start, req_page_start;                     /* [max_reqs + 1] int32 */
    size_t req_kv_len, last_page_len;                         /* [max_reqs] int32 */
    size_t page_table; /* [max_pages + max_graph_reqs] int32 (graph padding: page 0 each) */
    size_t items;      /* [max_items] */
    size_t total;
};

/* per reserved token row: 8 bytes of results (all rows' ids, then their logprobs), the top-n
 * (all rows' [PD_KERNEL_MAX_TOP] ids, then their logprobs), then one pd_kernel_sample_row */
#define TOP_ROW_BYTES (PD_KERNEL_MAX_TOP * 8)
#define AMAX_ROW_BYTES (8 + TOP_ROW_BYTES + sizeof(struct pd_kernel_sample_row))

/* A 2-byte copy of count values of the f32 activations at src (src NULL: nothing held). */
struct held {
    const float *src;
    int64_t count;
    enum pd_dtype dtype;
};

struct cuda_backend {
    struct pd_backend base;
    int dev, sms;
    bool sm90; /* a Hopper GPU: FlashInfer's sm90 attention for extend steps */
    cudaStream_t stream;
    cudaEvent_t meta_done;
    struct pd_kernel_gemm *gemm;
    int status; /* first error of an enqueued op, reported at the next sync point */
    bool graphs_on;
    /* reserve */
    bool reserved;
    struct pd_backend_limits lim;
    struct meta_layout ml;
    char *meta_h; /* pinned host */
    char *meta_d; /* device */
    int max_items, max_split_tokens, max_graph_reqs;
    void *xconv; /* device [max_tokens][max_dim] 2-byte GEMM inputs */
    /* a product group's single GEMM output ([rows][Σ m] f32, prod_floats of room) */
    float *prod_out;
    int64_t prod_floats;
    /* what xconv and fi_q hold while a log runs: set by the op that wrote them (a conversion, an
     * RMSNorm's second output, the fused rope), read by the op right after, cleared by any other */
    struct held xconv_held, fiq_held;
    /* FlashInfer attention (kernels/flashinfer/): its workspace, this step's plan, and q / o in
     * the 2-byte type its kernels take ([max_tokens][max_heads][max_head_dim]) */
    struct pdfi_workspace fi_ws;
    struct pdfi_plan fi_plan;
    void *fi_q, *fi_o;
    float *part_o, *part_ml; /* device attention split partials */
    /* argmax / sample results (ids + logprobs, [max_tokens] x 8 bytes) then the sample rows'
     * parameters ([max_tokens] x pd_kernel_sample_row): device, and a pinned copy */
    char *amax_d, *amax_h;
    /* penalty slots (pd_backend_penalty_reserve): [slots][vocab] state, and staging for the
     * token ids pd_backend_penalty_set uploads (pinned host, device) */
    int32_t *pen_state;
    int32_t *pen_ids_h, *pen_ids_d;
    void *samp; /* argmax's and the draw's scratch (sample_scratch), samp_bytes */
    size_t samp_bytes;
    struct op *log; /* [PD_CUDA_LOG_OPS] */
    int n_log;
    /* current step */
    bool meta_pending; /* set_batch ran; metadata not yet planned and copied */
    int n_tokens, n_reqs, n_out, n_pages;
    int bucket; /* graph bucket (padded n) of a decode step, 0 = eager */
    int bucket_idx;
    int n_pad_pages; /* page-table entries after n_pages: one per padding request of a bucket */
    struct pd_kernel_attn_batch attn;
    /* the step's attention plan: made at the first flush whose log holds an attention op (its
     * head counts and pool come with that op), for FlashInfer (fi_step) or our own kernel */
    bool attn_planned, fi_step;
    int fi_reqs;                   /* requests of the FlashInfer plan (the bucket's when padded) */
    int attn_heads, attn_kv_heads; /* the head counts attn was planned for */
    struct graph_slot graphs[PD_CUDA_N_BUCKETS];
    struct pd_backend_cuda_stats stats;
    /* per-op timing (pd_backend_cuda_profile): events [PD_CUDA_LOG_OPS + 1] */
    struct pd_backend_cuda_profile *prof;
    cudaEvent_t *prof_ev;
};

static inline size_t tensor_bytes(const struct pd_tensor *t) {
    return (size_t)(t->rows * t->cols) * pd_dtype_size(t->dtype);
}

static inline struct pd_kernel_kv_geom geom(const struct pd_kv_layout *kv) {
    return (struct pd_kernel_kv_geom){kv->base,     kv->n_pages,  kv->n_layers, kv->page_size,
                                      kv->kv_heads, kv->head_dim, kv->dtype,    kv->page_bytes};
}

/* Row counts of the log as launched: n → bucket in a graph step. false when a count is not a
 * multiple of the step's tokens (then the step must run eagerly). */
static inline bool scale_count(const struct cuda_backend *c, int64_t count, int64_t *out) {
    if (!c->bucket) {
        *out = count;
        return true;
    }
    if (count % c->n_tokens)
        return false;
    *out = count / c->n_tokens * c->bucket;
    return true;
}

/* FlashInfer runs the attention of a 2-byte or fp8 pool at head dims 64/128/256 (its page
 * stride, in elements, must fit its uint32); an f32 pool (exact comparisons with the cpu
 * backend) or another head dim takes our kernel (attention.cu). */
static inline bool fi_takes(const struct op *a) {
    enum pdfi_dtype dt = pd_kernel_fi_dtype(a->kv.dtype);
    size_t esz = pd_dtype_size(a->kv.dtype);
    return dt && pdfi_attention_supported(dt, a->kv.head_dim) && a->heads % a->kv.kv_heads == 0 &&
           a->kv.page_bytes % esz == 0 && a->kv.page_bytes / esz <= 0xffffffffu;
}

/* Launches log[i] and, when the ops after it fuse with it, those too (*consumed: how many ops the
 * launch covered, >= 1); PD_OK or the launch's error. */
int pd__cuda_run_op(struct cuda_backend *c, int i, int *consumed);

#endif
