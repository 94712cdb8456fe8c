/*
 * backend_cuda.c — the cuda backend behind model/backend.h: weights in their checkpoint dtype
 * (bf16 in practice) on the GPU, the page-major KV pool in device memory, one stream, kernels/
 * for every op and cuBLAS for the products.
 *
 * Ops are not launched when the model calls them: each is appended to the step's op log (sized
 * at reserve, nothing allocated per step) and the log is flushed at the step's one sync point
 * (download, sync, upload, or the next set_batch). Flushing first plans the attention work items
 * (the plan needs the head counts, which only the attention op carries) and copies all per-step
 * metadata to the device in one transfer, then either
 *  - replays the log eagerly, fusing ops with their neighbours (backend_cuda_fuse.c: an add
 *    with the RMSNorm after it, product groups, rope with the KV store), or
 *  - for a decode step (one new token per request, one logit row each) launches the CUDA graph
 *    captured for its batch-size bucket: the batch is padded to the bucket (padding tokens have
 *    slot -1, padding attention items req -1), every row count in the log is scaled from n to
 *    the bucket, and the log's fingerprint (ops, pointers, counts) must equal the captured one,
 *    else the bucket is captured again. Device pointers of metadata never move (fixed offsets
 *    sized at reserve), so a graph stays valid across steps.
 * Every row-count argument of a decode step is a multiple of its n tokens (the model passes n,
 * n*heads, n*hidden, ...): that is the contract the scaling relies on, checked per step (a step
 * breaking it runs eagerly).
 * Errors of enqueued ops are sticky and returned by the next download/sync.
 */
#include "kernels/backend_cuda_internal.h"

#include "common/base/alloc.h"
#include "model/backend_impl.h"
#include "common/base/log.h"
#include "common/base/status.h"
#include "model/sampling.h"
#include "kernels/kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PD_CUDA_GEMM_WORKSPACE (32u << 20) /* bytes */
#define PD_CUDA_MAX_GRAPH_REQS 256
/* rows of one sampling launch (its scratch: a probability row each) */
#define PD_CUDA_SAMPLE_ROWS 256

static const int graph_buckets[] = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256};
_Static_assert(PD_ARRAY_LEN(graph_buckets) == PD_CUDA_N_BUCKETS,
               "PD_CUDA_N_BUCKETS (backend_cuda_internal.h) counts graph_buckets");

static struct cuda_backend *cb(struct pd_backend *be) {
    return (struct cuda_backend *)be;
}

static void note(struct cuda_backend *c, int rc) {
    if (rc && !c->status)
        c->status = rc;
}

static int take_status(struct cuda_backend *c) {
    int rc = c->status;
    c->status = PD_OK;
    return rc;
}

static int flush(struct cuda_backend *c);

/* The backend's GPU as the calling thread's current device. Entry points that allocate or
 * enqueue call it first: the current device is per thread, the daemons call the backend from
 * several (loader, compute, tp rank threads), and with --base-gpu-id or tp the GPU is not 0,
 * so a thread that never selected it would allocate on GPU 0 or launch on a stream of another
 * device (cudaErrorInvalidResourceHandle). Cheap when it is current already. */
static int use_dev(struct cuda_backend *c) {
    return pd__cuda_status(cudaSetDevice(c->dev), "selecting the GPU");
}

/* ---- memory ---- */

static int cuda_mem_info(struct pd_backend *be, size_t *total, size_t *avail) {
    int rc = use_dev(cb(be)); /* cudaMemGetInfo reads the current device's memory */
    return rc ? rc : pd__cuda_status(cudaMemGetInfo(avail, total), "reading GPU memory");
}

static int cuda_alloc(struct pd_backend *be, size_t bytes, void **out) {
    struct cuda_backend *c = cb(be);
    *out = NULL;
    if (!bytes)
        bytes = 16;
    int rc = use_dev(c);
    if (!rc)
        rc = pd__cuda_status(cudaMalloc(out, bytes), "cudaMalloc");
    if (rc)
        return pd_error_wrap(rc, "cuda backend buffer of %zu bytes", bytes);
    rc = pd__cuda_status(cudaMemsetAsync(*out, 0, bytes, c->stream), "zeroing a GPU buffer");
    if (!rc)
        rc = pd__cuda_status(cudaStreamSynchronize(c->stream), "zeroing a GPU buffer");
    if (rc) {
        cudaFree(*out);
        *out = NULL;
    }
    return rc;
}

static void cuda_release(struct pd_backend *be, void *p) {
    struct cuda_backend *c = cb(be);
    note(c, use_dev(c));
    note(c, flush(c));
    cudaFree(p);
}

static void free_step_buffers(struct cuda_backend *c) {
    cudaFreeHost(c->meta_h);
    cudaFree(c->meta_d);
    cudaFree(c->xconv);
    cudaFree(c->prod_out);
    c->prod_out = NULL;
    c->prod_floats = 0;
    cudaFree(c->part_o);
    cudaFree(c->part_ml);
    cudaFree(c->fi_ws.float_ws);
    cudaFree(c->fi_ws.int_ws);
    cudaFreeHost(c->fi_ws.int_ws_host);
    cudaFree(c->fi_q);
    cudaFree(c->fi_o);
    c->fi_ws = (struct pdfi_workspace){0};
    c->fi_q = c->fi_o = NULL;
    cudaFree(c->amax_d);
    cudaFreeHost(c->amax_h);
    c->amax_d = c->amax_h = NULL;
    pd_free(c->log);
    c->meta_h = c->meta_d = NULL;
    c->xconv = NULL;
    c->part_o = c->part_ml = NULL;
    c->log = NULL;
    for (int i = 0; i < PD_CUDA_N_BUCKETS; i++) {
        if (c->graphs[i].exec)
            cudaGraphExecDestroy(c->graphs[i].exec);
        c->graphs[i] = (struct graph_slot){0};
    }
    c->reserved = false;
}

static size_t align_up(size_t v, size_t a) {
    return (v + a - 1) / a * a;
}

static int cuda_reserve(struct pd_backend *be, const struct pd_backend_limits *lim) {
    struct cuda_backend *c = cb(be);
    int rc = use_dev(c);
    if (!rc)
        rc = flush(c);
    if (rc)
        return rc;
    free_step_buffers(c);
    size_t nt = (size_t)lim->max_tokens, nr = (size_t)lim->max_reqs;
    /* group is unknown until the first attention op: plan for the widest (heads / 1) */
    c->max_items = pd_kernel_attn_max_items(lim->max_tokens, lim->max_reqs, lim->max_heads);
    c->max_split_tokens = lim->max_reqs < lim->max_tokens ? lim->max_reqs : lim->max_tokens;
    if (c->max_split_tokens > PD_CUDA_MAX_GRAPH_REQS)
        c->max_split_tokens = PD_CUDA_MAX_GRAPH_REQS;
    c->max_graph_reqs = c->max_split_tokens;
    struct meta_layout *m = &c->ml;
    size_t o = 0, i32 = sizeof(int32_t);
#define PLACE(field, bytes)                                                                        \
    m->field = o;                                                                                  \
    o = align_up(o + (bytes), 16)
    PLACE(token_ids, nt * i32);
    PLACE(positions, nt * i32);
    PLACE(slots, nt * i32);
    PLACE(out_rows, nt * i32);
    PLACE(tok_splits, nt * i32);
    PLACE(req_tok_start, (nr + 1) * i32);
    PLACE(req_page_start, (nr + 1) * i32);
    PLACE(req_kv_len, nr * i32);
    PLACE(last_page_len, nr * i32);
    PLACE(page_table, ((size_t)lim->max_pages + (size_t)c->max_graph_reqs) * i32);
    PLACE(items, (size_t)c->max_items * sizeof(struct pd_kernel_attn_item));
#undef PLACE
    m->total = o;
    size_t split_rows =
        (size_t)c->max_split_tokens * (size_t)lim->max_heads * PD_KERNEL_ATTN_MAX_SPLITS;
    /* FlashInfer's work items: at most one per 16 packed (row, head) pairs plus one per request
     * and the graph padding to 2 CTAs per SM, three ints each, plus per-request and per-row
     * index arrays, plus 8 MiB for the Hopper plan's per-(tile, kv head) arrays */
    size_t fi_items = nt * (size_t)lim->max_heads / 16 + nr + 4 * (size_t)c->sms + 16;
    c->fi_ws.int_bytes = fi_items * 3 * 4 + (nr + nt + 8) * 8 + (8u << 20);
    c->fi_ws.float_bytes = pdfi_float_workspace_bytes(c->sms, lim->max_head_dim);
    size_t qo_bytes = nt * (size_t)lim->max_heads * (size_t)lim->max_head_dim * 2;
    /* product groups of decode-sized steps: q, k and v (or gate and up) of up to
     * PD_CUDA_MAX_GRAPH_REQS rows; larger steps run their products one by one */
    size_t prod_floats =
        (nt < PD_CUDA_MAX_GRAPH_REQS ? nt : PD_CUDA_MAX_GRAPH_REQS) * 3 * (size_t)lim->max_dim;
    if ((rc = pd__cuda_status(cudaMallocHost((void **)&c->meta_h, m->total), "pinned metadata")) ||
        (rc = pd__cuda_status(cudaMalloc((void **)&c->meta_d, m->total), "device metadata")) ||
        (rc = pd__cuda_status(cudaMalloc(&c->xconv, nt * (size_t)lim->max_dim * 2),
                              "GEMM input buffer")) ||
        (rc = pd__cuda_status(cudaMalloc((void **)&c->prod_out, prod_floats * 4),
                              "product group output")) ||
        (rc = pd__cuda_status(
             cudaMalloc((void **)&c->part_o, split_rows * (size_t)lim->max_head_dim * 4),
             "attention split partials")) ||
        (rc = pd__cuda_status(cudaMalloc((void **)&c->part_ml, split_rows * 2 * 4),
                              "attention split partials")) ||
        (rc = pd__cuda_status(cudaMalloc(&c->fi_ws.float_ws, c->fi_ws.float_bytes),
                              "attention workspace")) ||
        (rc = pd__cuda_status(cudaMalloc(&c->fi_ws.int_ws, c->fi_ws.int_bytes),
                              "attention plan buffer")) ||
        (rc = pd__cuda_status(cudaMallocHost(&c->fi_ws.int_ws_host, c->fi_ws.int_bytes),
                              "pinned attention plan buffer")) ||
        (rc = pd__cuda_status(cudaMalloc(&c->fi_q, qo_bytes), "attention query buffer")) ||
        (rc = pd__cuda_status(cudaMalloc(&c->fi_o, qo_bytes), "attention output buffer")) ||
        (rc = pd__cuda_status(cudaMalloc((void **)&c->amax_d, nt * AMAX_ROW_BYTES),
                              "argmax results")) ||
        (rc = pd__cuda_status(cudaMallocHost((void **)&c->amax_h, nt * AMAX_ROW_BYTES),
                              "argmax results"))) {
        free_step_buffers(c);
        return pd_error_wrap(rc, "reserving cuda backend step buffers");
    }
    memset(c->meta_h, 0, m->total);
    c->prod_floats = (int64_t)prod_floats;
    if (!(c->log = pd_calloc(PD_CUDA_LOG_OPS, sizeof(struct op)))) {
        free_step_buffers(c);
        return pd_error_wrap(PD_ENOMEM, "reserving the cuda backend op log");
    }
    c->stats.n_buckets = 0;
    for (int i = 0; i < PD_CUDA_N_BUCKETS; i++)
        if (graph_buckets[i] <= c->max_graph_reqs)
            c->stats.buckets[c->stats.n_buckets++] = graph_buckets[i];
    c->lim = *lim;
    c->reserved = true;
    return PD_OK;
}

static int cuda_weight(struct pd_backend *be, enum pd_dtype dtype, int64_t rows, int64_t cols,
                       const void *host, struct pd_tensor *out) {
    struct cuda_backend *c = cb(be);
    size_t bytes = (size_t)(rows * cols) * pd_dtype_size(dtype);
    void *d = NULL;
    int rc = use_dev(c);
    if (!rc)
        rc = pd__cuda_status(cudaMalloc(&d, bytes), "cudaMalloc");
    /* on our stream, then waited for: a plain cudaMemcpy from pageable memory runs on the legacy
     * default stream, which does not order our non-blocking stream, and may return before the
     * DMA to the device is done, so the first step's GEMM could read a half-copied weight */
    if (!rc)
        rc = pd__cuda_status(cudaMemcpyAsync(d, host, bytes, cudaMemcpyHostToDevice, c->stream),
                             "copying a weight to the GPU");
    if (!rc)
        rc = pd__cuda_status(cudaStreamSynchronize(c->stream), "copying a weight to the GPU");
    if (rc) {
        cudaFree(d);
        return pd_error_wrap(rc, "weight of %zu bytes", bytes);
    }
    *out = (struct pd_tensor){dtype, rows, cols, d, 0};
    return PD_OK;
}

/* The tensors moved into one allocation, back to back in their order (a product group's
 * weights: backend_cuda_fuse.c multiplies them as one matrix). The old allocations are freed. */
static int cuda_weight_pack(struct pd_backend *be, struct pd_tensor *const *ts, int n) {
    struct cuda_backend *c = cb(be);
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += tensor_bytes(ts[i]);
    char *d = NULL;
    int rc = use_dev(c);
    if (!rc)
        rc = pd__cuda_status(cudaMalloc((void **)&d, total), "cudaMalloc");
    size_t off = 0;
    for (int i = 0; i < n && !rc; i++) {
        rc = pd__cuda_status(cudaMemcpyAsync(d + off, ts[i]->data, tensor_bytes(ts[i]),
                                             cudaMemcpyDeviceToDevice, c->stream),
                             "packing weights");
        off += tensor_bytes(ts[i]);
    }
    if (!rc)
        rc = pd__cuda_status(cudaStreamSynchronize(c->stream), "packing weights");
    if (rc) {
        cudaFree(d);
        return pd_error_wrap(rc, "packing %d weights of %zu bytes", n, total);
    }
    off = 0;
    for (int i = 0; i < n; i++) {
        cudaFree((void *)ts[i]->data);
        ts[i]->data = d + off;
        off += tensor_bytes(ts[i]);
    }
    return PD_OK;
}

static int cuda_upload(struct pd_backend *be, void *dst, const void *src, size_t bytes) {
    struct cuda_backend *c = cb(be);
    int rc = use_dev(c);
    if (!rc)
        rc = flush(c);
    if (rc || !bytes)
        return rc;
    rc = pd__cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream),
                         "copying to the GPU");
    if (!rc) /* src may be freed once we return */
        rc = pd__cuda_status(cudaStreamSynchronize(c->stream), "copying to the GPU");
    return rc;
}

static int cuda_download(struct pd_backend *be, void *dst, const void *src, size_t bytes) {
    struct cuda_backend *c = cb(be);
    int rc = use_dev(c);
    if (!rc)
        rc = flush(c);
    if (!rc && bytes)
        rc = pd__cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream),
                             "copying from the GPU");
    if (!rc)
        rc = pd__cuda_status(cudaStreamSynchronize(c->stream), "running the step on the GPU");
    int st = take_status(c);
    return st ? st : rc;
}

/* The choice's scratch (kernels/sampling.cu: argmax partials, the draw's probabilities), grown
 * to what a launch needs; kept for the backend's life. Called at a sync point: nothing in
 * flight uses the old one. */
static int sample_scratch(struct cuda_backend *c, size_t need) {
    if (need <= c->samp_bytes)
        return PD_OK;
    int rc = pd__cuda_status(cudaStreamSynchronize(c->stream), "running the step on the GPU");
    if (rc)
        return rc;
    cudaFree(c->samp);
    c->samp = NULL;
    c->samp_bytes = 0;
    if ((rc = pd__cuda_status(cudaMalloc(&c->samp, need), "sampling scratch")))
        return pd_error_wrap(rc, "%zu bytes of sampling scratch", need);
    c->samp_bytes = need;
    return PD_OK;
}

/* Sampling fast path: the rows' parameters go up with the launch, the kernel chooses on the
 * device (kernels/sampling.cu mirrors model/sampling.c, penalties from the slots' state
 * included), and 8 bytes a row come back, plus the top-n when a row asks for it. */
static int cuda_sample(struct pd_backend *be, const float *x, int rows, int cols,
                       const struct pd_sample_row *row, int32_t *ids, float *logprobs) {
    struct cuda_backend *c = cb(be);
    if (!c->reserved || rows > c->lim.max_tokens)
        return pd_errorf(PD_ERANGE, "sampling %d rows: at most the reserved %d", rows,
                         c->reserved ? c->lim.max_tokens : 0);
    int rc = use_dev(c);
    if (!rc)
        rc = flush(c);
    size_t nt = (size_t)c->lim.max_tokens, o_top = nt * 8, o_rows = nt * (8 + TOP_ROW_BYTES);
    struct pd_kernel_sample_row *rows_h = (struct pd_kernel_sample_row *)(c->amax_h + o_rows);
    bool any_top = false;
    for (int r = 0; r < rows; r++) {
        const struct pd_sample_row *q = &row[r];
        rows_h[r] = (struct pd_kernel_sample_row){.temperature = q->temperature,
                                                  .top_k = q->top_k,
                                                  .top_p = q->top_p,
                                                  .min_p = q->min_p,
                                                  .u = q->u,
                                                  .slot = q->penalized ? q->slot : -1,
                                                  .rep = q->repetition_penalty,
                                                  .freq = q->frequency_penalty,
                                                  .pres = q->presence_penalty,
                                                  .n_top = q->n_logprobs};
        any_top = any_top || q->n_logprobs > 0;
    }
    if (!rc)
        rc = pd__cuda_status(cudaMemcpyAsync(c->amax_d + o_rows, rows_h,
                                             (size_t)rows * sizeof(*rows_h), cudaMemcpyHostToDevice,
                                             c->stream),
                             "copying sampling parameters to the GPU");
    /* launches of at most PD_CUDA_SAMPLE_ROWS rows: the draw's scratch holds a probability row
     * per row (a prefill step's first tokens can be many) */
    size_t o_lp_top = nt * PD_KERNEL_MAX_TOP * 4;
    for (int r0 = 0; !rc && r0 < rows; r0 += PD_CUDA_SAMPLE_ROWS) {
        int n = rows - r0 < PD_CUDA_SAMPLE_ROWS ? rows - r0 : PD_CUDA_SAMPLE_ROWS;
        struct pd_kernel_sample_params sp = {
            .logits = x + (size_t)r0 * (size_t)cols,
            .rows = n,
            .vocab = cols,
            .row = (const struct pd_kernel_sample_row *)(c->amax_d + o_rows) + r0,
            .ids = (int32_t *)c->amax_d + r0,
            .logprob = (float *)(c->amax_d + (size_t)rows * 4) + r0,
            .state = c->pen_state,
            .n_slots = be->pen_slots,
            .top_ids =
                any_top ? (int32_t *)(c->amax_d + o_top) + (size_t)r0 * PD_KERNEL_MAX_TOP : NULL,
            .top_lp = any_top
                          ? (float *)(c->amax_d + o_top + o_lp_top) + (size_t)r0 * PD_KERNEL_MAX_TOP
                          : NULL};
        for (int r = r0; r < r0 + n; r++) {
            const struct pd_sample_row *q = &row[r];
            bool drawn = !pd_sampling_row_greedy(q);
            sp.any_drawn |= drawn;
            sp.any_penalized |= q->penalized;
            sp.any_min_p |= drawn && q->min_p > 0;
            sp.any_top_k |= drawn && q->top_k > 0 && q->top_k < cols;
            sp.any_top_p |= drawn && q->top_p < 1;
        }
        if (sp.any_drawn)
            rc = sample_scratch(c, pd_kernel_sample_scratch_bytes(PD_CUDA_SAMPLE_ROWS, cols));
        sp.scratch = c->samp;
        sp.scratch_bytes = c->samp_bytes;
        if (!rc)
            rc = pd_kernel_sample(&sp, c->stream);
    }
    if (!rc)
        rc = pd__cuda_status(cudaMemcpyAsync(c->amax_h, c->amax_d, (size_t)rows * 8,
                                             cudaMemcpyDeviceToHost, c->stream),
                             "copying sampling results from the GPU");
    /* the top-n of the rows that asked: rows × 80 bytes of ids, the same of logprobs */
    size_t top_bytes = (size_t)rows * PD_KERNEL_MAX_TOP * 4, o_lp = nt * PD_KERNEL_MAX_TOP * 4;
    if (!rc && any_top)
        rc = pd__cuda_status(cudaMemcpyAsync(c->amax_h + o_top, c->amax_d + o_top, top_bytes,
                                             cudaMemcpyDeviceToHost, c->stream),
                             "copying top logprobs from the GPU");
    if (!rc && any_top)
        rc = pd__cuda_status(cudaMemcpyAsync(c->amax_h + o_top + o_lp, c->amax_d + o_top + o_lp,
                                             top_bytes, cudaMemcpyDeviceToHost, c->stream),
                             "copying top logprobs from the GPU");
    if (!rc)
        rc = pd__cuda_status(cudaStreamSynchronize(c->stream), "running the step on the GPU");
    int st = take_status(c);
    if (st || rc)
        return st ? st : rc;
    memcpy(ids, c->amax_h, (size_t)rows * 4);
    memcpy(logprobs, c->amax_h + (size_t)rows * 4, (size_t)rows * 4);
    const int32_t *top_ids = (const int32_t *)(c->amax_h + o_top);
    const float *top_lp = (const float *)(c->amax_h + o_top + o_lp);
    for (int r = 0; r < rows; r++) {
        int n = row[r].n_logprobs < cols ? row[r].n_logprobs : cols;
        if (n <= 0)
            continue;
        struct pd_sample *t = row[r].top;
        t->n_top = n;
        memcpy(t->top_ids, top_ids + (size_t)r * PD_KERNEL_MAX_TOP, (size_t)n * 4);
        memcpy(t->top_logprobs, top_lp + (size_t)r * PD_KERNEL_MAX_TOP, (size_t)n * 4);
    }
    return PD_OK;
}

/* The slots' state lives on the device for the process; ids go up through pinned staging. */
static int cuda_penalty_reserve(struct pd_backend *be, int slots, int vocab, int max_ids) {
    struct cuda_backend *c = cb(be);
    size_t bytes = (size_t)slots * (size_t)vocab * sizeof(int32_t);
    int rc = use_dev(c);
    if (!rc)
        rc = pd__cuda_status(cudaMalloc((void **)&c->pen_state, bytes), "penalty state");
    if (!rc)
        rc = pd__cuda_status(cudaMemsetAsync(c->pen_state, 0, bytes, c->stream),
                             "clearing the penalty state");
    if (!rc)
        rc = pd__cuda_status(cudaStreamSynchronize(c->stream), "clearing the penalty state");
    if (!rc)
        rc = pd__cuda_status(cudaMallocHost((void **)&c->pen_ids_h, (size_t)max_ids * 4),
                             "pinned penalty ids");
    if (!rc)
        rc =
            pd__cuda_status(cudaMalloc((void **)&c->pen_ids_d, (size_t)max_ids * 4), "penalty ids");
    if (rc) {
        cudaFree(c->pen_state);
        cudaFreeHost(c->pen_ids_h);
        cudaFree(c->pen_ids_d);
        c->pen_state = c->pen_ids_h = c->pen_ids_d = NULL;
        return pd_error_wrap(rc, "%zu bytes of penalty state", bytes);
    }
    return PD_OK;
}

static int cuda_penalty_set(struct pd_backend *be, int slot, const int32_t *prompt, int n_prompt,
                            const int32_t *out, int n_out) {
    struct cuda_backend *c = cb(be);
    int rc = use_dev(c);
    if (!rc)
        rc = flush(c); /* ops enqueued before (a step) see the old state */
    if (rc)
        return rc;
    if (n_prompt) /* either may be NULL when empty */
        memcpy(c->pen_ids_h, prompt, (size_t)n_prompt * 4);
    if (n_out)
        memcpy(c->pen_ids_h + n_prompt, out, (size_t)n_out * 4);
    struct pd_kernel_penalty_set_params pp = {.state_row = c->pen_state +
                                                           (size_t)slot * (size_t)be->pen_vocab,
                                              .vocab = be->pen_vocab,
                                              .ids = c->pen_ids_d,
                                              .n_prompt = n_prompt,
                                              .n_out = n_out};
    if (n_prompt + n_out)
        rc = pd__cuda_status(cudaMemcpyAsync(c->pen_ids_d, c->pen_ids_h,
                                             (size_t)(n_prompt + n_out) * 4, cudaMemcpyHostToDevice,
                                             c->stream),
                             "copying penalty ids to the GPU");
    if (!rc)
        rc = pd_kernel_penalty_set(&pp, c->stream);
    if (!rc) /* the staging is reused by the next call */
        rc = pd__cuda_status(cudaStreamSynchronize(c->stream), "setting a penalty slot");
    int st = take_status(c);
    return st ? st : rc;
}

static int cuda_argmax(struct pd_backend *be, const float *x, int rows, int cols, int32_t *ids,
                       float *logprobs) {
    struct cuda_backend *c = cb(be);
    if (!c->reserved || rows > c->lim.max_tokens)
        return pd_errorf(PD_ERANGE, "argmax of %d rows: at most the reserved %d", rows,
                         c->reserved ? c->lim.max_tokens : 0);
    int rc = use_dev(c);
    if (!rc)
        rc = flush(c);
    int32_t *ids_d = (int32_t *)c->amax_d;
    float *lp_d = (float *)(c->amax_d + (size_t)rows * 4);
    if (!rc)
        rc = sample_scratch(c, pd_kernel_argmax_scratch_bytes(rows, cols));
    struct pd_kernel_argmax_params ap = {.logits = x,
                                         .rows = rows,
                                         .vocab = cols,
                                         .ids = ids_d,
                                         .logprob = lp_d,
                                         .scratch = c->samp,
                                         .scratch_bytes = c->samp_bytes};
    if (!rc)
        rc = pd_kernel_argmax(&ap, c->stream);
    if (!rc)
        rc = pd__cuda_status(cudaMemcpyAsync(c->amax_h, c->amax_d, (size_t)rows * 8,
                                             cudaMemcpyDeviceToHost, c->stream),
                             "copying argmax results from the GPU");
    if (!rc)
        rc = pd__cuda_status(cudaStreamSynchronize(c->stream), "running the step on the GPU");
    int st = take_status(c);
    if (st || rc)
        return st ? st : rc;
    memcpy(ids, c->amax_h, (size_t)rows * 4);
    memcpy(logprobs, c->amax_h + (size_t)rows * 4, (size_t)rows * 4);
    return PD_OK;
}

static int cuda_sync(struct pd_backend *be) {
    struct cuda_backend *c = cb(be);
    int rc = use_dev(c);
    if (!rc)
        rc = flush(c);
    if (!rc)
        rc = pd__cuda_status(cudaStreamSynchronize(c->stream), "running the step on the GPU");
    int st = take_status(c);
    return st ? st : rc;
}

/* ---- batch ---- */

static int32_t *meta_i32(struct cuda_backend *c, size_t off) {
    return (int32_t *)(c->meta_h + off);
}

static int pick_bucket(const struct cuda_backend *c, int n, int *idx) {
    for (int i = 0; i < PD_CUDA_N_BUCKETS; i++) {
        if (graph_buckets[i] > c->max_graph_reqs)
            break;
        if (graph_buckets[i] >= n) {
            *idx = i;
            return graph_buckets[i];
        }
    }
    return 0;
}

static int cuda_set_batch(struct pd_backend *be, const struct pd_batch_plan *p) {
    struct cuda_backend *c = cb(be);
    if (!c->reserved)
        return pd_errorf(PD_EINVAL, "cuda backend: set_batch before reserve");
    /* the step may run on another thread than the one that created the backend (the daemons'
     * compute thread): the current device is per thread, and --base-gpu-id may not be 0 */
    int rc = use_dev(c);
    if (!rc)
        rc = flush(c);
    if (rc)
        return rc;
    if ((rc = pd__batch_plan_check(p, &c->lim)))
        return rc;
    bool decode = p->n_tokens == p->n_reqs && p->n_out_rows == p->n_reqs;
    int n_pages = p->req_page_start[p->n_reqs];

    /* the previous step's metadata copy must be done before the pinned staging is rewritten */
    if ((rc = pd__cuda_status(cudaEventSynchronize(c->meta_done), "waiting for the last step")))
        return rc;
    /* a decode step runs padded to its bucket whether its graph is launched or not (graphs off,
     * or a capture that failed): eager and replayed steps then plan and compute alike, bit for
     * bit */
    int bidx = 0;
    int B = decode ? pick_bucket(c, p->n_reqs, &bidx) : 0;
    int rows = B ? B : p->n_tokens, reqs = B ? B : p->n_reqs;
    const struct meta_layout *m = &c->ml;
    size_t nt = (size_t)p->n_tokens * sizeof(int32_t);
    memcpy(meta_i32(c, m->token_ids), p->token_ids, nt);
    memcpy(meta_i32(c, m->positions), p->positions, nt);
    memcpy(meta_i32(c, m->slots), p->slots, nt);
    if (p->n_out_rows)
        memcpy(meta_i32(c, m->out_rows), p->out_rows, (size_t)p->n_out_rows * sizeof(int32_t));
    memcpy(meta_i32(c, m->req_tok_start), p->req_tok_start, (size_t)(p->n_reqs + 1) * 4);
    memcpy(meta_i32(c, m->req_page_start), p->req_page_start, (size_t)(p->n_reqs + 1) * 4);
    memcpy(meta_i32(c, m->req_kv_len), p->req_kv_len, (size_t)p->n_reqs * 4);
    memcpy(meta_i32(c, m->page_table), p->page_table, (size_t)n_pages * 4);
    for (int i = p->n_tokens; i < rows; i++) { /* padding of a graph bucket */
        meta_i32(c, m->token_ids)[i] = 0;
        meta_i32(c, m->positions)[i] = 0;
        meta_i32(c, m->slots)[i] = -1;
        meta_i32(c, m->out_rows)[i] = i;
        meta_i32(c, m->tok_splits)[i] = 0;
    }
    /* padding requests: no keys for our kernel (kv_len 0), one key for FlashInfer (page 0's
     * first slot, any finite value: the padding rows are never read) */
    for (int r = p->n_reqs; r < reqs; r++) {
        meta_i32(c, m->req_tok_start)[r + 1] = r + 1;
        meta_i32(c, m->req_page_start)[r + 1] = n_pages + (r - p->n_reqs + 1);
        meta_i32(c, m->page_table)[n_pages + (r - p->n_reqs)] = 0;
        meta_i32(c, m->req_kv_len)[r] = 0;
        meta_i32(c, m->last_page_len)[r] = 1;
    }
    c->n_pad_pages = reqs - p->n_reqs;
    c->attn_planned = false;
    c->fi_step = false;
    c->n_tokens = p->n_tokens;
    c->n_reqs = p->n_reqs;
    c->n_out = p->n_out_rows;
    c->n_pages = n_pages;
    c->bucket = B;
    c->bucket_idx = bidx;
    c->meta_pending = true;
    return PD_OK;
}

/* ---- the op log ---- */

static struct op *log_op(struct cuda_backend *c, enum op_kind kind) {
    if (c->n_log == PD_CUDA_LOG_OPS) { /* a step longer than the log: run what we have */
        c->bucket = 0;
        note(c, flush(c));
    }
    struct op *o = &c->log[c->n_log++];
    memset(o, 0, sizeof(*o));
    o->kind = kind;
    return o;
}

static void cuda_embed(struct pd_backend *be, const struct pd_tensor *table, float *out) {
    struct op *o = log_op(cb(be), OP_EMBED);
    o->w = *table;
    o->out = out;
}

static void cuda_rmsnorm(struct pd_backend *be, const float *x, const struct pd_tensor *w,
                         int64_t rows, int dim, float eps, float *out) {
    struct op *o = log_op(cb(be), OP_RMSNORM);
    o->x = x;
    o->w = *w;
    o->count = rows;
    o->dim = dim;
    o->eps = eps;
    o->out = out;
}

static void cuda_matmul(struct pd_backend *be, const float *x, int64_t rows,
                        const struct pd_tensor *w, const struct pd_tensor *bias, float *y) {
    struct op *o = log_op(cb(be), OP_MATMUL);
    o->x = x;
    o->count = rows;
    o->w = *w;
    if (bias)
        o->bias = *bias;
    o->out = y;
}

static void cuda_rope(struct pd_backend *be, float *x, int heads, int head_dim,
                      const float *inv_freq) {
    struct op *o = log_op(cb(be), OP_ROPE);
    o->out = x;
    o->heads = heads;
    o->dim = head_dim;
    o->inv_freq = inv_freq;
}

static void cuda_silu_mul(struct pd_backend *be, const float *gate, const float *up, float *out,
                          int64_t count) {
    struct op *o = log_op(cb(be), OP_SILU_MUL);
    o->x = gate;
    o->y = up;
    o->out = out;
    o->count = count;
}

static void cuda_add(struct pd_backend *be, float *x, const float *y, int64_t count) {
    struct op *o = log_op(cb(be), OP_ADD);
    o->out = x;
    o->y = y;
    o->count = count;
}

static void cuda_kv_store(struct pd_backend *be, const struct pd_kv_layout *kv, int layer,
                          const float *k, const float *v) {
    struct op *o = log_op(cb(be), OP_KV_STORE);
    o->kv = *kv;
    o->layer = layer;
    o->x = k;
    o->y = v;
}

static void cuda_attention(struct pd_backend *be, const struct pd_kv_layout *kv, int layer,
                           const float *q, int heads, float scale, int window, float *out) {
    /* no sliding window in the kernel: pd_model_new refuses a model whose window would mask
     * anything on this backend, so a window here is our bug */
    PD_ASSERT(window == 0);
    struct op *o = log_op(cb(be), OP_ATTENTION);
    o->kv = *kv;
    o->layer = layer;
    o->x = q;
    o->heads = heads;
    o->scale = scale;
    o->out = out;
}

static void cuda_gather_out_rows(struct pd_backend *be, const float *src, int width, float *dst) {
    struct op *o = log_op(cb(be), OP_GATHER);
    o->x = src;
    o->dim = width;
    o->out = dst;
}

/* ---- flush: plan, copy metadata, run the log (graph or eager) ---- */

/* FlashInfer's plan: the request/page index arrays are the step's metadata as set_batch wrote
 * it (req_tok_start is qo_indptr, req_page_start the page indptr), plus each request's tokens
 * in its last page. A graph bucket plans with FlashInfer's graph mode: the launch's shape then
 * depends on the bucket alone. */
static int plan_fi(struct cuda_backend *c, const struct op *a) {
    const struct meta_layout *m = &c->ml;
    int32_t *tok = meta_i32(c, m->req_tok_start), *pst = meta_i32(c, m->req_page_start);
    int32_t *kvl = meta_i32(c, m->req_kv_len);
    for (int r = 0; r < c->n_reqs; r++) {
        int np = pst[r + 1] - pst[r];
        meta_i32(c, m->last_page_len)[r] = np ? kvl[r] - (np - 1) * a->kv.page_size : 0;
    }
    int reqs = c->bucket ? c->bucket : c->n_reqs, rows = c->bucket ? c->bucket : c->n_tokens;
    c->fi_reqs = reqs;
    char err[256];
    int rc =
        pdfi_plan_step(&c->fi_plan, &c->fi_ws, tok, pst, kvl, rows, reqs, a->heads, a->kv.kv_heads,
                       a->kv.head_dim, a->kv.page_size, pd_kernel_fi_dtype(a->kv.dtype),
                       c->bucket > 0, c->sm90, c->stream, err, sizeof(err));
    return rc ? pd__pdfi_status(rc, err) : PD_OK;
}

static int plan_attention(struct cuda_backend *c) {
    const struct op *a = NULL;
    for (int i = 0; i < c->n_log && !a; i++)
        if (c->log[i].kind == OP_ATTENTION)
            a = &c->log[i];
    struct pd_kernel_attn_batch *b = &c->attn;
    const struct meta_layout *m = &c->ml;
    memset(b, 0, sizeof(*b));
    b->req_tok_start = (const int32_t *)(c->meta_d + m->req_tok_start);
    b->req_kv_len = (const int32_t *)(c->meta_d + m->req_kv_len);
    b->req_page_start = (const int32_t *)(c->meta_d + m->req_page_start);
    b->page_table = (const int32_t *)(c->meta_d + m->page_table);
    b->tok_splits = (const int32_t *)(c->meta_d + m->tok_splits);
    b->items = (const struct pd_kernel_attn_item *)(c->meta_d + m->items);
    if (!a)
        return PD_OK;
    int kvh = a->kv.kv_heads, group = a->heads / kvh;
    c->attn_heads = a->heads;
    c->attn_kv_heads = kvh;
    c->attn_planned = true;
    c->fi_step = fi_takes(a);
    if (c->fi_step)
        return plan_fi(c, a);
    struct pd_kernel_attn_plan_in in = {
        .n_reqs = c->n_reqs,
        .req_tok_start = meta_i32(c, m->req_tok_start),
        .req_kv_len = meta_i32(c, m->req_kv_len),
        .group = group,
        .kv_heads = kvh,
        .target_blocks = 2 * c->sms,
        .max_split_tokens = c->max_split_tokens,
    };
    if (c->bucket) {
        /* splits depend on the bucket alone so the graph's grid is fixed */
        int tiles = (group + PD_KERNEL_ATTN_ROWS - 1) / PD_KERNEL_ATTN_ROWS;
        if (group <= 4)
            tiles = 1;
        int blocks = c->bucket * tiles * kvh, s = (2 * c->sms + blocks - 1) / blocks;
        in.fixed_splits = s < 1 ? 1 : s > PD_KERNEL_ATTN_MAX_SPLITS ? PD_KERNEL_ATTN_MAX_SPLITS : s;
        in.pad_reqs = c->bucket;
    }
    int n = pd_kernel_attn_plan(&in, (struct pd_kernel_attn_item *)(c->meta_h + m->items),
                                c->max_items, meta_i32(c, m->tok_splits), b);
    if (n < 0)
        return pd_errorf(PD_EINTERNAL, "attention plan needs more than %d work items",
                         c->max_items);
    if (c->bucket)
        b->n_tokens = c->bucket;
    return PD_OK;
}

static int upload_meta(struct cuda_backend *c) {
    int rc = plan_attention(c);
    if (rc)
        return rc;
    size_t used = c->ml.page_table + (size_t)(c->n_pages + c->n_pad_pages) * sizeof(int32_t);
    size_t items = (size_t)c->attn.n_items * sizeof(struct pd_kernel_attn_item);
    rc = pd__cuda_status(
        cudaMemcpyAsync(c->meta_d, c->meta_h, used, cudaMemcpyHostToDevice, c->stream),
        "copying step metadata");
    if (!rc && items)
        rc = pd__cuda_status(cudaMemcpyAsync(c->meta_d + c->ml.items, c->meta_h + c->ml.items,
                                             items, cudaMemcpyHostToDevice, c->stream),
                             "copying attention work items");
    if (!rc)
        rc = pd__cuda_status(cudaEventRecord(c->meta_done, c->stream), "recording an event");
    return rc;
}

/* What a logged op is, for the per-op profile: its kind and, for products, the weight's shape
 * (which tells q/k/v, o, gate/up, down and the lm_head apart). */
static void op_label(const struct op *o, int used, char *buf, size_t n) {
    static const char *const names[] = {
        [OP_EMBED] = "embed",       [OP_RMSNORM] = "rmsnorm",     [OP_MATMUL] = "matmul",
        [OP_ROPE] = "rope",         [OP_SILU_MUL] = "silu_mul",   [OP_ADD] = "add",
        [OP_KV_STORE] = "kv_store", [OP_ATTENTION] = "attention", [OP_GATHER] = "gather_rows",
    };
    if (o->kind == OP_MATMUL && used > 1) { /* a group: its widths, e.g. "matmul 1536+256+256" */
        int len = snprintf(buf, n, "matmul %lld", (long long)o->w.rows);
        for (int j = 1; j < used && o[j].kind == OP_MATMUL && len > 0 && (size_t)len < n; j++)
            len += snprintf(buf + len, n - (size_t)len, "+%lld", (long long)o[j].w.rows);
        if (len > 0 && (size_t)len < n)
            snprintf(buf + len, n - (size_t)len, "x%lld%s%s", (long long)o->w.cols,
                     o->bias.data ? "+bias" : "", o[used - 1].kind == OP_SILU_MUL ? "+silu" : "");
    } else if (o->kind == OP_MATMUL)
        snprintf(buf, n, "matmul %lldx%lld%s", (long long)o->w.rows, (long long)o->w.cols,
                 o->bias.data ? "+bias" : "");
    else if (o->kind == OP_ROPE && used == 3)
        snprintf(buf, n, "rope+kv_store");
    else if (o->kind == OP_ADD && used == 2)
        snprintf(buf, n, "add+rmsnorm");
    else
        snprintf(buf, n, "%s", names[o->kind]);
}

static void profile_add(struct pd_backend_cuda_profile *p, const char *name, double us) {
    int i = 0;
    while (i < p->n && strcmp(p->op[i].name, name) != 0)
        i++;
    if (i == p->n) {
        if (p->n == PD_CUDA_PROFILE_OPS)
            i = PD_CUDA_PROFILE_OPS - 1; /* full: the last row takes the rest */
        else
            snprintf(p->op[p->n++].name, sizeof(p->op[0].name), "%s", name);
    }
    p->op[i].us += us;
    p->op[i].calls++;
    p->total_us += us;
}

/* run_log with an event before every op and after the last; waits for the step and adds each
 * op's time to the profile. */
static int run_log_profiled(struct cuda_backend *c) {
    int starts[PD_CUDA_LOG_OPS], used_n[PD_CUDA_LOG_OPS], n = 0, rc = PD_OK;
    for (int i = 0; i < c->n_log && !rc; n++) {
        starts[n] = i;
        rc = pd__cuda_status(cudaEventRecord(c->prof_ev[n], c->stream), "recording an event");
        int used = 1;
        if (!rc)
            rc = pd__cuda_run_op(c, i, &used);
        used_n[n] = used;
        i += used;
    }
    if (!rc)
        rc = pd__cuda_status(cudaEventRecord(c->prof_ev[n], c->stream), "recording an event");
    if (!rc)
        rc = pd__cuda_status(cudaEventSynchronize(c->prof_ev[n]), "running a profiled step");
    for (int k = 0; !rc && k < n; k++) {
        float ms = 0;
        char name[48];
        cudaEventElapsedTime(&ms, c->prof_ev[k], c->prof_ev[k + 1]);
        op_label(&c->log[starts[k]], used_n[k], name, sizeof(name));
        profile_add(c->prof, name, ms * 1e3);
    }
    return rc;
}

static int run_log(struct cuda_backend *c) {
    c->xconv_held = c->fiq_held = (struct held){0};
    if (c->prof)
        return run_log_profiled(c);
    for (int i = 0; i < c->n_log;) {
        int used = 1, rc = pd__cuda_run_op(c, i, &used);
        if (rc)
            return rc;
        i += used;
    }
    return PD_OK;
}

/* Of the log as the graph launches it: counts scaled to the bucket (log_scales held), not as
 * logged. Hashing the logged counts (multiples of the real n) recaptured the bucket's graph
 * whenever the batch size changed inside the bucket (3 then 4 requests in bucket 4), which in
 * continuous batching is nearly every step: a capture and instantiation (milliseconds) per
 * step instead of a replay. */
static uint64_t fingerprint(const struct cuda_backend *c) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < c->n_log; i++) {
        struct op o;
        memcpy(&o, &c->log[i], sizeof(o)); /* with its padding, zeroed at log_op */
        int64_t cnt = 0;
        if (scale_count(c, o.count, &cnt))
            o.count = cnt;
        const unsigned char *p = (const unsigned char *)&o;
        for (size_t b = 0; b < sizeof(o); b++)
            h = (h ^ p[b]) * 1099511628211ull;
    }
    h ^= (uint64_t)c->attn.n_items << 32 | (uint64_t)c->attn.max_splits;
    h ^= (uint64_t)c->attn.rows_per_item << 56;
    if (c->fi_step) /* FlashInfer's graph plan: the same for every step of a bucket */
        for (size_t i = 0; i < PD_ARRAY_LEN(c->fi_plan.info); i++)
            h = (h ^ (uint64_t)c->fi_plan.info[i]) * 1099511628211ull;
    return h;
}

static bool log_scales(const struct cuda_backend *c) {
    int64_t dummy;
    for (int i = 0; i < c->n_log; i++)
        if (!scale_count(c, c->log[i].count, &dummy))
            return false;
    return true;
}

/* Captures the log into a graph for the bucket; false (bucket marked broken) when capture is
 * refused, after which the caller runs the log eagerly. */
static int capture(struct cuda_backend *c, struct graph_slot *g, uint64_t fp) {
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    int rc = pd__cuda_status(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal),
                             "starting a graph capture");
    if (rc)
        return rc;
    int run_rc = run_log(c);
    rc = pd__cuda_status(cudaStreamEndCapture(c->stream, &graph), "ending a graph capture");
    if (!rc && !run_rc)
        rc = pd__cuda_status(cudaGraphInstantiate(&exec, graph, 0), "instantiating a graph");
    if (graph)
        cudaGraphDestroy(graph);
    if (run_rc || rc) {
        pd_log(PD_LOG_WARNING, "cuda: decode graph for batch %d not captured (%s); running eagerly",
               c->bucket, pd_error_msg());
        (void)cudaGetLastError();
        g->broken = true;
        return run_rc ? run_rc : rc;
    }
    if (g->exec)
        cudaGraphExecDestroy(g->exec);
    g->exec = exec;
    g->fingerprint = fp;
    c->stats.graph_captures++;
    return PD_OK;
}

static int flush(struct cuda_backend *c) {
    if (!c->n_log && !c->meta_pending)
        return PD_OK;
    int rc = PD_OK;
    bool attn_unplanned = false;
    for (int i = 0; i < c->n_log && !c->attn_planned && !attn_unplanned; i++)
        attn_unplanned = c->log[i].kind == OP_ATTENTION;
    if (c->meta_pending || attn_unplanned) {
        /* the metadata may have gone up already (a download between set_batch and the step's
         * first attention op): then only the attention plan is new, and the copy is repeated
         * with it, behind the ops already enqueued */
        if (c->bucket && !log_scales(c))
            c->bucket = 0; /* fall back before planning: eager plans need no padding items */
        rc = upload_meta(c);
        c->meta_pending = false;
    }
    if (!rc && c->n_log) {
        c->stats.steps++;
        struct graph_slot *g = c->bucket ? &c->graphs[c->bucket_idx] : NULL;
        if (g && c->graphs_on && !g->broken && !c->prof) {
            uint64_t fp = fingerprint(c);
            if (!g->exec || g->fingerprint != fp)
                rc = capture(c, g, fp);
            if (!rc && !g->broken) {
                rc = pd__cuda_status(cudaGraphLaunch(g->exec, c->stream), "launching a graph");
                c->stats.graph_launches++;
            } else if (g->broken) {
                /* the capture failed: the bucket's padded plan still runs correctly eagerly */
                pd_error_clear();
                rc = run_log(c);
            }
        } else {
            /* no bucket, graphs off or a bucket whose capture failed: eagerly (a bucket's step
             * padded as its graph would run it) */
            rc = run_log(c);
        }
    }
    c->n_log = 0;
    if (rc)
        rc = pd_error_wrap(rc, "cuda backend step");
    return rc;
}

/* ---- lifetime ---- */

static void cuda_free(struct pd_backend *be) {
    struct cuda_backend *c = cb(be);
    c->n_log = 0;
    c->meta_pending = false;
    cudaStreamSynchronize(c->stream);
    free_step_buffers(c);
    cudaFree(c->pen_state);
    cudaFreeHost(c->pen_ids_h);
    cudaFree(c->pen_ids_d);
    cudaFree(c->samp);
    if (c->prof_ev) {
        for (int i = 0; i <= PD_CUDA_LOG_OPS; i++)
            if (c->prof_ev[i])
                cudaEventDestroy(c->prof_ev[i]);
        pd_free(c->prof_ev);
    }
    pd_kernel_gemm_free(c->gemm);
    cudaEventDestroy(c->meta_done);
    cudaStreamDestroy(c->stream);
    pd_free(c);
}

static const struct pd__backend_ops cuda_ops = {
    .free = cuda_free,
    .mem_info = cuda_mem_info,
    .alloc = cuda_alloc,
    .release = cuda_release,
    .reserve = cuda_reserve,
    .weight = cuda_weight,
    .weight_pack = cuda_weight_pack,
    .upload = cuda_upload,
    .download = cuda_download,
    .sync = cuda_sync,
    .set_batch = cuda_set_batch,
    .embed = cuda_embed,
    .rmsnorm = cuda_rmsnorm,
    .matmul = cuda_matmul,
    .rope = cuda_rope,
    .silu_mul = cuda_silu_mul,
    .add = cuda_add,
    .kv_store = cuda_kv_store,
    .attention = cuda_attention,
    .gather_out_rows = cuda_gather_out_rows,
    .argmax = cuda_argmax,
    .sample = cuda_sample,
    .penalty_reserve = cuda_penalty_reserve,
    .penalty_set = cuda_penalty_set,
};

void pd_backend_cuda_stats(struct pd_backend *be, struct pd_backend_cuda_stats *out) {
    PD_ASSERT(be->kind == PD_BACKEND_CUDA);
    *out = cb(be)->stats;
}

int pd_backend_cuda_profile(struct pd_backend *be, struct pd_backend_cuda_profile *prof) {
    PD_ASSERT(be->kind == PD_BACKEND_CUDA);
    struct cuda_backend *c = cb(be);
    int rc = use_dev(c);
    if (!rc)
        rc = flush(c); /* what is queued ran under the old setting */
    if (rc)
        return rc;
    if (prof && !c->prof_ev) {
        if (!(c->prof_ev = pd_calloc(PD_CUDA_LOG_OPS + 1, sizeof(cudaEvent_t))))
            return PD_ENOMEM;
        for (int i = 0; i <= PD_CUDA_LOG_OPS && !rc; i++)
            rc = pd__cuda_status(cudaEventCreate(&c->prof_ev[i]), "creating profile events");
        if (rc)
            return rc;
    }
    c->prof = prof;
    return PD_OK;
}

void pd_backend_cuda_set_graphs(struct pd_backend *be, bool on) {
    PD_ASSERT(be->kind == PD_BACKEND_CUDA);
    cb(be)->graphs_on = on;
}

int pd_backend_cuda_flush(struct pd_backend *be, void **stream) {
    PD_ASSERT(be->kind == PD_BACKEND_CUDA);
    struct cuda_backend *c = cb(be);
    *stream = c->stream;
    int rc = pd__cuda_status(cudaSetDevice(c->dev), "selecting the GPU");
    if (rc)
        return rc;
    c->bucket = 0; /* as log_op's early flush: the padded metadata is read by n_tokens only */
    rc = flush(c);
    int st = take_status(c);
    return st ? st : rc;
}

/* Named by the registry's cuda entry (model/backend_reg.c), so `--device cuda` reaches here in
 * any binary built with CUDA. */
int pd__backend_cuda_new(const struct pd_backend_opts *opts, struct pd_backend **out) {
    *out = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        return pd_errorf(PD_EUNSUPPORTED, "cuda backend: no CUDA device (%s)",
                         e != cudaSuccess ? cudaGetErrorString(e) : "the driver lists none");
    (void)cudaGetLastError();
    if (opts->device_index < 0 || opts->device_index >= n)
        return pd_errorf(PD_ERANGE, "cuda backend: device %d of %d", opts->device_index, n);
    struct cuda_backend *c = pd_calloc(1, sizeof(*c));
    if (!c)
        return PD_ENOMEM;
    c->base.ops = &cuda_ops;
    c->base.kind = PD_BACKEND_CUDA;
    c->dev = opts->device_index;
    const char *env = getenv("PD_CUDA_GRAPHS");
    c->graphs_on = !(env && strcmp(env, "0") == 0);
    struct cudaDeviceProp prop;
    int rc;
    if ((rc = pd__cuda_status(cudaSetDevice(c->dev), "selecting the GPU")) ||
        (rc = pd__cuda_status(cudaGetDeviceProperties(&prop, c->dev), "reading GPU properties")))
        goto fail_dev;
    c->sms = prop.multiProcessorCount;
    c->sm90 = prop.major == 9;
    if ((rc = pd__cuda_status(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking),
                              "creating a stream")))
        goto fail_dev;
    if ((rc = pd__cuda_status(cudaEventCreateWithFlags(&c->meta_done, cudaEventDisableTiming),
                              "creating an event")))
        goto fail_event;
    if ((rc = pd_kernel_gemm_new(c->stream, PD_CUDA_GEMM_WORKSPACE, &c->gemm)))
        goto fail_gemm;
    if ((rc = pd_kernel_gemv_init())) {
        pd_kernel_gemm_free(c->gemm);
        goto fail_gemm;
    }
    snprintf(c->base.name, sizeof(c->base.name), "cuda (%.40s, %d SMs)", prop.name, c->sms);
    *out = &c->base;
    return PD_OK;
fail_gemm:
    cudaEventDestroy(c->meta_done);
fail_event:
    cudaStreamDestroy(c->stream);
fail_dev:
    pd_free(c);
    return pd_error_wrap(rc, "starting the cuda backend on device %d", opts->device_index);
}
