/*
 * backend_cuda_fuse.c — the cuda backend's op log as kernel launches (backend_cuda_internal.h):
 * each logged op goes to its kernel, fused with the ops after it where their pointers and shapes
 * allow — a residual add with the RMSNorm that follows it, back-to-back products of one input
 * (q/k/v, gate/up) as one launch with the SwiGLU after them, an RMSNorm that writes the next
 * GEMM's 2-byte input, rope of q and k with the KV store (and FlashInfer's query). The same
 * launches run eagerly and under graph capture (backend_cuda.c decides which): nothing here
 * allocates, synchronises or reads back, and every row count goes through scale_count.
 */
#include "kernels/backend_cuda_internal.h"

#include "common/base/status.h"

#include <string.h>

/* A product group goes through cuBLAS as one GEMM only when no product is wider than this: on
 * an H200, cuBLAS ran qwen2.5-1.5b's gate+up (2 x 8960 x 1536) at 64 rows as one GEMM in 59.6
 * us against 2 x 15 us apart, while q+k+v (1536+256+256) gained from it (22 us, 43 before) */
#define PD_CUDA_GROUP_GEMM_MAX_M 4096

/* How many products from log[i] form one group: consecutive products of the same input and row
 * count by 2-byte weights lying back to back (pd_backend_weight_pack: q, k, v; gate, up), biases
 * of the weights' type on all or none, no output being the input or the previous output; and
 * whether the SwiGLU of the first two follows (gate, up), which the group then computes too. */
static int product_group(const struct cuda_backend *c, int i, bool *silu) {
    const struct op *a = &c->log[i];
    *silu = false;
    if (a->w.dtype == PD_DTYPE_F32 || a->out == a->x ||
        (a->bias.data && a->bias.dtype != a->w.dtype))
        return 1;
    int n = 1;
    for (; n < PD_KERNEL_PRODUCT_SEGS && i + n < c->n_log; n++) {
        const struct op *b = &c->log[i + n], *p = &c->log[i + n - 1];
        if (b->kind != OP_MATMUL || b->x != a->x || b->count != a->count ||
            b->w.dtype != a->w.dtype || b->w.cols != a->w.cols ||
            (const char *)b->w.data != (const char *)p->w.data + tensor_bytes(&p->w) ||
            !b->bias.data != !a->bias.data || (b->bias.data && b->bias.dtype != a->w.dtype) ||
            b->out == a->x || b->out == p->out)
            break;
    }
    if (n == 2 && i + 2 < c->n_log) {
        const struct op *g = a, *u = &c->log[i + 1], *sm = &c->log[i + 2];
        *silu = sm->kind == OP_SILU_MUL && sm->x == g->out && sm->y == u->out &&
                sm->out == g->out && g->w.rows == u->w.rows && sm->count == g->count * g->w.rows;
    }
    return n;
}

/* log[i]'s input in its weight's 2-byte type in xconv: converted now unless the op before left
 * it there (an RMSNorm's second output, the previous product of the same input). */
static int gemm_input(struct cuda_backend *c, const struct op *o, int64_t rows, struct held in) {
    int64_t count = rows * o->w.cols;
    if (in.src == o->x && in.count == count && in.dtype == o->w.dtype) {
        c->stats.reused_inputs++;
    } else {
        struct pd_kernel_convert_params cv = {o->x, c->xconv, o->w.dtype, count};
        int rc = pd_kernel_convert(&cv, c->stream);
        if (rc)
            return rc;
    }
    c->xconv_held = (struct held){o->x, count, o->w.dtype};
    return PD_OK;
}

/* Whether an output overlaps the input (a few-row product reads it while others write). */
static bool writes_input(const struct pd_kernel_product_seg *seg, int n, const float *x,
                         int64_t x_count, int64_t rows) {
    for (int j = 0; j < n; j++)
        if (seg[j].y < x + x_count && x < seg[j].y + rows * seg[j].m)
            return true;
    return false;
}

/* The products of log[i] and, when they form a group, of the ops after it (*consumed of them):
 * a few rows on CUDA cores (pd_kernel_gemv, the whole group in one launch), more through
 * cuBLAS (a group as one GEMM into prod_out, then split to its outputs with the biases added). */
static int run_matmul(struct cuda_backend *c, int i, int64_t rows, struct held in, int *consumed) {
    const struct op *o = &c->log[i];
    bool silu;
    int n = product_group(c, i, &silu);
    struct pd_kernel_product_seg seg[PD_KERNEL_PRODUCT_SEGS] = {{0}};
    int64_t width = 0, widest = 0;
    bool aligned = true;
    for (int j = 0; j < n; j++) {
        const struct op *p = &c->log[i + j];
        seg[j] = (struct pd_kernel_product_seg){p->w.data, p->bias.data, p->out, p->w.rows};
        width += p->w.rows;
        widest = p->w.rows > widest ? p->w.rows : widest;
        aligned = aligned && (uintptr_t)p->w.data % 16 == 0;
    }
    int rc;
    if (aligned && !writes_input(seg, n, o->x, rows * o->w.cols, rows) &&
        pd_kernel_gemv_takes(rows, o->w.cols, o->w.dtype) &&
        (!o->bias.data || o->bias.dtype == o->w.dtype)) {
        struct pd_kernel_gemv_params g = {.x = o->x,
                                          .rows = rows,
                                          .k = o->w.cols,
                                          .dtype = o->w.dtype,
                                          .n_seg = n,
                                          .silu_pair = silu,
                                          .sms = c->sms};
        memcpy(g.seg, seg, sizeof(seg));
        *consumed = n + silu;
        c->stats.fused_products += n + silu - 1;
        return pd_kernel_gemv(&g, c->stream);
    }
    if (n > 1 && (rows * width > c->prod_floats || widest > PD_CUDA_GROUP_GEMM_MAX_M)) {
        n = 1;
        silu = false;
        width = o->w.rows;
    }
    *consumed = n + silu;
    if (o->w.dtype != PD_DTYPE_F32 && (rc = gemm_input(c, o, rows, in)))
        return rc;
    if (writes_input(seg, n, o->x, rows * o->w.cols, rows))
        c->xconv_held.src = NULL; /* the input changes under xconv */
    const void *x = o->w.dtype == PD_DTYPE_F32 ? (const void *)o->x : c->xconv;
    float *y = n > 1 ? c->prod_out : o->out;
    struct pd_kernel_gemm_params g = {x, o->w.data, o->w.dtype, y, rows, width, o->w.cols};
    if ((rc = pd_kernel_gemm_run(c->gemm, &g)))
        return rc;
    if (n > 1) {
        struct pd_kernel_split_params sp = {c->prod_out, rows, o->w.dtype, n, {{0}}, silu};
        memcpy(sp.seg, seg, sizeof(seg));
        c->stats.fused_products += n + silu - 1;
        return pd_kernel_split(&sp, c->stream);
    }
    if (o->bias.data) {
        struct pd_kernel_bias_params b = {o->out, o->bias.data, o->bias.dtype, rows, o->w.rows};
        rc = pd_kernel_bias(&b, c->stream);
    }
    return rc;
}

/* FlashInfer attention of one layer: q f32 → the kernels' 2-byte type, the paged kernel over
 * the layer's K and V blocks (page stride = the whole page), the output back to f32. */
static enum pd_dtype fi_q_dtype(const struct pd_kv_layout *kv) {
    return kv->dtype == PD_DTYPE_F16 ? PD_DTYPE_F16 : PD_DTYPE_BF16;
}

static int run_fi_attention(struct cuda_backend *c, const struct op *o, int64_t rows,
                            struct held q_in) {
    const struct meta_layout *m = &c->ml;
    enum pd_dtype qt = fi_q_dtype(&o->kv);
    int64_t count = rows * o->heads * o->kv.head_dim;
    int rc = PD_OK;
    if (q_in.src != o->x || q_in.count != count || q_in.dtype != qt) {
        struct pd_kernel_convert_params cq = {o->x, c->fi_q, qt, count};
        if ((rc = pd_kernel_convert(&cq, c->stream)))
            return rc;
    }
    size_t esz = pd_dtype_size(o->kv.dtype);
    size_t block = (size_t)o->kv.page_size * (size_t)o->kv.kv_heads * (size_t)o->kv.head_dim;
    char *k = (char *)o->kv.base + (size_t)o->layer * 2 * block * esz;
    struct pdfi_attention_args fa = {
        .kv_dtype = pd_kernel_fi_dtype(o->kv.dtype),
        .q = c->fi_q,
        .o = c->fi_o,
        .k = k,
        .v = k + block * esz,
        .stride_page = (int64_t)(o->kv.page_bytes / esz),
        .stride_n = (int64_t)o->kv.kv_heads * o->kv.head_dim,
        .stride_h = o->kv.head_dim,
        .qo_indptr = (int32_t *)(c->meta_d + m->req_tok_start),
        .page_indptr = (int32_t *)(c->meta_d + m->req_page_start),
        .page_indices = (int32_t *)(c->meta_d + m->page_table),
        .last_page_len = (int32_t *)(c->meta_d + m->last_page_len),
        .n_reqs = c->fi_reqs,
        .page_size = o->kv.page_size,
        .scale = o->scale,
    };
    char err[256];
    rc = pdfi_attention(&c->fi_plan, &c->fi_ws, &fa, c->stream, err, sizeof(err));
    if (rc)
        return pd__pdfi_status(rc, err);
    struct pd_kernel_widen_params wo = {c->fi_o, qt, o->out, count};
    return pd_kernel_widen(&wo, c->stream);
}

/* When log[next] is a cuBLAS product of the norm's output (more rows than the few-row product
 * takes), the norm writes that product's 2-byte input too (xconv), saving its conversion. */
static void norm_feeds_gemm(struct cuda_backend *c, int next, struct pd_kernel_rmsnorm_params *p) {
    if (next >= c->n_log)
        return;
    const struct op *g = &c->log[next];
    int64_t rows = 0;
    if (g->kind != OP_MATMUL || g->x != p->out || g->w.dtype == PD_DTYPE_F32 ||
        g->w.cols != p->dim || !scale_count(c, g->count, &rows) || rows != p->rows ||
        pd_kernel_gemv_takes(rows, g->w.cols, g->w.dtype))
        return;
    p->out2 = c->xconv;
    p->out2_dtype = g->w.dtype;
    c->xconv_held = (struct held){p->out, rows * p->dim, g->w.dtype};
}

/* log[i..i+2] = rope of q, rope of k with the same frequencies, the store of that k and a v:
 * one kernel (pd_kernel_rope_store). */
static bool rope_store_follows(const struct cuda_backend *c, int i) {
    if (i + 2 >= c->n_log)
        return false;
    const struct op *q = &c->log[i], *k = &c->log[i + 1], *st = &c->log[i + 2];
    return k->kind == OP_ROPE && st->kind == OP_KV_STORE && k->inv_freq == q->inv_freq &&
           k->dim == q->dim && st->x == k->out && st->kv.head_dim == q->dim &&
           st->kv.kv_heads == k->heads && q->out != k->out && st->y != q->out && st->y != k->out;
}

/* The fused rope + store of log[i..i+2]; when FlashInfer's attention of that q comes next, the
 * rotated q goes into its 2-byte query buffer as well. */
static int run_rope_store(struct cuda_backend *c, int i, int64_t rows) {
    const struct op *q = &c->log[i], *k = &c->log[i + 1], *st = &c->log[i + 2];
    const struct op *at = i + 3 < c->n_log ? &c->log[i + 3] : NULL;
    const struct meta_layout *m = &c->ml;
    struct pd_kernel_rope_store_params p = {
        .q = q->out,
        .k = k->out,
        .v = st->y,
        .positions = (const int32_t *)(c->meta_d + m->positions),
        .slots = (const int32_t *)(c->meta_d + m->slots),
        .inv_freq = q->inv_freq,
        .n = rows,
        .heads = q->heads,
        .kv = geom(&st->kv),
        .layer = st->layer,
    };
    if (at && at->kind == OP_ATTENTION && at->x == q->out && at->heads == q->heads &&
        c->attn_planned && c->fi_step && fi_takes(at) && at->kv.head_dim == q->dim &&
        q->heads <= c->lim.max_heads && q->dim <= c->lim.max_head_dim) {
        p.q_out = c->fi_q;
        p.q_out_dtype = fi_q_dtype(&at->kv);
        c->fiq_held = (struct held){q->out, rows * q->heads * q->dim, p.q_out_dtype};
    }
    c->stats.fused_ropes++;
    return pd_kernel_rope_store(&p, c->stream);
}

int pd__cuda_run_op(struct cuda_backend *c, int i, int *consumed) {
    const struct op *o = &c->log[i];
    const struct meta_layout *m = &c->ml;
    int64_t rows_tok = c->bucket ? c->bucket : c->n_tokens, cnt = 0;
    struct held xconv_in = c->xconv_held, fiq_in = c->fiq_held;
    c->xconv_held = c->fiq_held = (struct held){0};
    *consumed = 1;
    if (!scale_count(c, o->count, &cnt))
        return pd_errorf(PD_EINTERNAL, "op count %lld in a step of %d tokens", (long long)o->count,
                         c->n_tokens);
    switch (o->kind) {
    case OP_EMBED: {
        struct pd_kernel_embed_params p = {o->w.data,
                                           o->w.dtype,
                                           o->w.rows,
                                           (int)o->w.cols,
                                           (const int32_t *)(c->meta_d + m->token_ids),
                                           o->out,
                                           rows_tok};
        return pd_kernel_embed(&p, c->stream);
    }
    case OP_ADD: {
        const struct op *nx = i + 1 < c->n_log ? &c->log[i + 1] : NULL;
        int64_t ncnt = 0;
        if (nx && nx->kind == OP_RMSNORM && nx->x == o->out && scale_count(c, nx->count, &ncnt) &&
            ncnt * nx->dim == cnt) {
            struct pd_kernel_rmsnorm_params p = {o->out, o->y,    nx->w.data, nx->w.dtype, nx->out,
                                                 ncnt,   nx->dim, nx->eps,    NULL,        0};
            *consumed = 2;
            c->stats.fused_norms++;
            norm_feeds_gemm(c, i + 2, &p);
            return pd_kernel_rmsnorm(&p, c->stream);
        }
        struct pd_kernel_swiglu_params p = {o->out, o->y, o->out, cnt, true};
        return pd_kernel_swiglu(&p, c->stream);
    }
    case OP_RMSNORM: {
        struct pd_kernel_rmsnorm_params p = {(float *)o->x, NULL,   o->w.data, o->w.dtype, o->out,
                                             cnt,           o->dim, o->eps,    NULL,       0};
        norm_feeds_gemm(c, i + 1, &p);
        return pd_kernel_rmsnorm(&p, c->stream);
    }
    case OP_MATMUL: return run_matmul(c, i, cnt, xconv_in, consumed);
    case OP_ROPE: {
        if (rope_store_follows(c, i)) {
            *consumed = 3;
            return run_rope_store(c, i, rows_tok);
        }
        struct pd_kernel_rope_params p = {o->out,      (const int32_t *)(c->meta_d + m->positions),
                                          o->inv_freq, rows_tok,
                                          o->heads,    o->dim};
        return pd_kernel_rope(&p, c->stream);
    }
    case OP_SILU_MUL: {
        struct pd_kernel_swiglu_params p = {o->x, o->y, o->out, cnt, false};
        return pd_kernel_swiglu(&p, c->stream);
    }
    case OP_KV_STORE: {
        struct pd_kernel_kv_store_params p = {
            geom(&o->kv), o->layer, o->x, o->y, (const int32_t *)(c->meta_d + m->slots), rows_tok};
        return pd_kernel_kv_store(&p, c->stream);
    }
    case OP_ATTENTION: {
        if (o->heads != c->attn_heads || o->kv.kv_heads != c->attn_kv_heads ||
            fi_takes(o) != c->fi_step)
            return pd_errorf(PD_EINTERNAL, "attention of %d/%d heads in a step planned for %d/%d",
                             o->heads, o->kv.kv_heads, c->attn_heads, c->attn_kv_heads);
        /* the split partials (part_o, part_ml) and FlashInfer's q / o buffers hold max_heads x
         * max_head_dim per token */
        if (o->heads > c->lim.max_heads || o->kv.head_dim > c->lim.max_head_dim)
            return pd_errorf(PD_ERANGE, "attention of %d heads of %d, reserved %d of at most %d",
                             o->heads, o->kv.head_dim, c->lim.max_heads, c->lim.max_head_dim);
        if (c->fi_step)
            return run_fi_attention(c, o, rows_tok, fiq_in);
        struct pd_kernel_attn_params p = {geom(&o->kv), o->layer, c->attn,   o->x,      o->out,
                                          o->heads,     o->scale, c->part_o, c->part_ml};
        return pd_kernel_attention(&p, c->stream);
    }
    case OP_GATHER: {
        int64_t n_out = c->bucket ? c->bucket : c->n_out;
        struct pd_kernel_gather_params p = {o->x, (const int32_t *)(c->meta_d + m->out_rows),
                                            o->out, n_out, o->dim};
        return pd_kernel_gather_rows(&p, c->stream);
    }
    }
    return pd_errorf(PD_EINTERNAL, "unknown logged op %d", (int)o->kind);
}
