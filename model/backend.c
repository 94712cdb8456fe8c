/*
 * backend.c — forwards every call of backend.h through the backend's op table. Argument checks
 * that apply to every backend live here so each backend need not repeat them; the only state
 * of its own is the penalty slots' geometry and the stamps that refuse two rows of one sample
 * call sharing a slot (struct pd_backend). Which backend a kind makes is the registry's
 * (model/backend_reg.c: pd_backend_new), so nothing here names one.
 */
#include "model/backend.h"
#include "model/sampling.h"
#include "model/backend_impl.h"
#include "common/base/status.h"
#include "common/base/alloc.h"

void pd_backend_free(struct pd_backend *be) {
    if (!be)
        return;
    pd_free(be->pen_stamp);
    be->ops->free(be);
}

enum pd_backend_kind pd_backend_kind_of(const struct pd_backend *be) {
    return be->kind;
}

const char *pd_backend_name(const struct pd_backend *be) {
    return be->name;
}

int pd_backend_mem_info(struct pd_backend *be, size_t *total, size_t *avail) {
    return be->ops->mem_info(be, total, avail);
}

int pd_backend_alloc(struct pd_backend *be, size_t bytes, void **out) {
    return be->ops->alloc(be, bytes, out);
}

void pd_backend_release(struct pd_backend *be, void *p) {
    if (p)
        be->ops->release(be, p);
}

void pd_backend_make_resident(struct pd_backend *be, void *p, size_t bytes) {
    if (be->ops->make_resident)
        be->ops->make_resident(be, p, bytes);
}

int pd_backend_reserve(struct pd_backend *be, const struct pd_backend_limits *lim) {
    if (lim->max_tokens < 1 || lim->max_reqs < 1 || lim->max_pages < 1 || lim->max_context < 1 ||
        lim->max_heads < 1 || lim->max_head_dim < 1 || lim->max_dim < 1)
        return pd_errorf(PD_EINVAL, "backend limits must all be positive");
    struct pd_backend_limits u = *lim, *r = &be->reserved;
#define KEEP_MAX(f) u.f = r->f > u.f ? r->f : u.f
    KEEP_MAX(max_tokens);
    KEEP_MAX(max_reqs);
    KEEP_MAX(max_pages);
    KEEP_MAX(max_context);
    KEEP_MAX(max_heads);
    KEEP_MAX(max_head_dim);
    KEEP_MAX(max_dim);
#undef KEEP_MAX
    int rc = be->ops->reserve(be, &u);
    if (rc == PD_OK)
        *r = u;
    return rc;
}

int pd_backend_weight(struct pd_backend *be, enum pd_dtype dtype, int64_t rows, int64_t cols,
                      const void *host, struct pd_tensor *out) {
    if (rows < 1 || cols < 1)
        return pd_errorf(PD_EINVAL, "weight of shape [%lld, %lld]", (long long)rows,
                         (long long)cols);
    return be->ops->weight(be, dtype, rows, cols, host, out);
}

int pd_backend_weight_pack(struct pd_backend *be, struct pd_tensor *const *ts, int n) {
    if (n < 1 || n > 8)
        return pd_errorf(PD_EINVAL, "packing %d weights (1..8)", n);
    for (int i = 0; i < n; i++)
        if (!ts[i]->data || ts[i]->dtype != ts[0]->dtype)
            return pd_errorf(PD_EINVAL, "packing weights: #%d is %s", i,
                             ts[i]->data ? "of another dtype" : "missing");
    return be->ops->weight_pack ? be->ops->weight_pack(be, ts, n) : PD_OK;
}

int pd_backend_upload(struct pd_backend *be, void *dst, const void *src, size_t bytes) {
    return be->ops->upload(be, dst, src, bytes);
}

int pd_backend_download(struct pd_backend *be, void *dst, const void *src, size_t bytes) {
    return be->ops->download(be, dst, src, bytes);
}

int pd_backend_sync(struct pd_backend *be) {
    return be->ops->sync(be);
}

int pd_backend_argmax(struct pd_backend *be, const float *x, int rows, int cols, int32_t *ids,
                      float *logprobs) {
    if (rows < 0 || cols < 1)
        return pd_errorf(PD_EINVAL, "argmax of %d rows of %d", rows, cols);
    return rows ? be->ops->argmax(be, x, rows, cols, ids, logprobs) : PD_OK;
}

/* The checks of one sample row; slots is the reserved penalty geometry. */
static int sample_row_check(const struct pd_backend *be, const struct pd_sample_row *r, int cols) {
    struct pd_sampling_params p;
    pd_sampling_params_default(&p);
    p.temperature = r->temperature;
    p.top_k = r->top_k;
    p.top_p = r->top_p;
    p.min_p = r->min_p;
    p.n_logprobs = r->n_logprobs;
    if (r->penalized) {
        p.repetition_penalty = r->repetition_penalty;
        p.frequency_penalty = r->frequency_penalty;
        p.presence_penalty = r->presence_penalty;
    }
    int rc = pd_sampling_params_check(&p);
    if (rc)
        return rc;
    if (!(r->u >= 0 && r->u < 1))
        return pd_errorf(PD_EINVAL, "u %g outside [0, 1)", r->u);
    if (r->n_logprobs > 0 && !r->top)
        return pd_errorf(PD_EINVAL, "%d top logprobs asked with nowhere to put them",
                         r->n_logprobs);
    if (r->penalized) {
        if (!be->pen_slots)
            return pd_errorf(PD_EINVAL, "penalties without pd_backend_penalty_reserve");
        if (r->slot < 0 || r->slot >= be->pen_slots)
            return pd_errorf(PD_ERANGE, "penalty slot %d outside 0..%d", r->slot,
                             be->pen_slots - 1);
        if (cols != be->pen_vocab)
            return pd_errorf(PD_EINVAL, "penalties over %d columns, the slots hold %d", cols,
                             be->pen_vocab);
    }
    return PD_OK;
}

int pd_backend_sample(struct pd_backend *be, const float *x, int rows, int cols,
                      const struct pd_sample_row *row, int32_t *ids, float *logprobs) {
    if (rows < 0 || cols < 1)
        return pd_errorf(PD_EINVAL, "sampling %d rows of %d", rows, cols);
    if (++be->pen_call == 0) { /* wrapped: old stamps could match the new counter */
        for (int i = 0; i < be->pen_slots; i++)
            be->pen_stamp[i] = 0;
        be->pen_call = 1;
    }
    for (int r = 0; r < rows; r++) {
        int rc = sample_row_check(be, &row[r], cols);
        if (rc)
            return pd_error_wrap(rc, "sampling row %d", r);
        if (row[r].penalized) {
            if (be->pen_stamp[row[r].slot] == be->pen_call)
                return pd_errorf(PD_EINVAL, "sampling row %d: penalty slot %d is another row's", r,
                                 row[r].slot);
            be->pen_stamp[row[r].slot] = be->pen_call;
        }
    }
    return rows ? be->ops->sample(be, x, rows, cols, row, ids, logprobs) : PD_OK;
}

int pd_backend_penalty_reserve(struct pd_backend *be, int slots, int vocab, int max_ids) {
    if (be->pen_slots)
        return pd_errorf(PD_EINVAL, "penalty slots are reserved already");
    if (slots < 1 || vocab < 1 || max_ids < 1)
        return pd_errorf(PD_EINVAL, "penalty slots: %d slots, vocabulary %d, %d ids", slots, vocab,
                         max_ids);
    if (!(be->pen_stamp = pd_calloc((size_t)slots, sizeof(uint32_t))))
        return pd_error_wrap(PD_ENOMEM, "penalty slot stamps");
    int rc = be->ops->penalty_reserve(be, slots, vocab, max_ids);
    if (rc) {
        pd_free(be->pen_stamp);
        be->pen_stamp = NULL;
        return pd_error_wrap(rc, "penalty state for %d requests of a vocabulary of %d", slots,
                             vocab);
    }
    be->pen_slots = slots;
    be->pen_vocab = vocab;
    be->pen_max_ids = max_ids;
    return PD_OK;
}

int pd_backend_penalty_set(struct pd_backend *be, int slot, const int32_t *prompt, int n_prompt,
                           const int32_t *out, int n_out) {
    if (slot < 0 || slot >= be->pen_slots)
        return pd_errorf(PD_ERANGE, "penalty slot %d outside the %d reserved", slot, be->pen_slots);
    if (n_prompt < 0 || n_out < 0 || n_prompt > be->pen_max_ids - n_out)
        return pd_errorf(PD_ERANGE, "penalty state of %d prompt + %d output tokens, at most %d",
                         n_prompt, n_out, be->pen_max_ids);
    return be->ops->penalty_set(be, slot, prompt, n_prompt, out, n_out);
}

int pd_backend_set_batch(struct pd_backend *be, const struct pd_batch_plan *plan) {
    return be->ops->set_batch(be, plan);
}

int pd__batch_plan_check(const struct pd_batch_plan *p, const struct pd_backend_limits *lim) {
    if (p->n_reqs < 1 || p->n_reqs > lim->max_reqs)
        return pd_errorf(PD_ERANGE, "batch of %d requests, limit %d", p->n_reqs, lim->max_reqs);
    if (p->n_tokens < 1 || p->n_tokens > lim->max_tokens)
        return pd_errorf(PD_ERANGE, "batch of %d tokens, limit %d", p->n_tokens, lim->max_tokens);
    int n_pages = p->req_page_start[p->n_reqs];
    if (n_pages > lim->max_pages)
        return pd_errorf(PD_ERANGE, "batch page table of %d entries, limit %d", n_pages,
                         lim->max_pages);
    if (p->n_out_rows < 0 || p->n_out_rows > p->n_tokens)
        return pd_errorf(PD_ERANGE, "%d output rows for %d tokens", p->n_out_rows, p->n_tokens);
    if (p->req_tok_start[0] != 0 || p->req_tok_start[p->n_reqs] != p->n_tokens ||
        p->req_page_start[0] != 0)
        return pd_errorf(PD_EINVAL, "batch plan offsets do not cover the batch");
    for (int r = 0; r < p->n_reqs; r++) {
        int n_new = p->req_tok_start[r + 1] - p->req_tok_start[r];
        int pages = p->req_page_start[r + 1] - p->req_page_start[r];
        if (n_new < 1 || pages < 0 || p->req_kv_len[r] < n_new ||
            p->req_kv_len[r] > lim->max_context)
            return pd_errorf(PD_ERANGE, "request %d of the batch: %d new tokens, %d in cache", r,
                             n_new, p->req_kv_len[r]);
    }
    for (int j = 0; j < p->n_out_rows; j++)
        if (p->out_rows[j] < 0 || p->out_rows[j] >= p->n_tokens)
            return pd_errorf(PD_ERANGE, "output row %d outside the batch", p->out_rows[j]);
    return PD_OK;
}

void pd_backend_embed(struct pd_backend *be, const struct pd_tensor *table, float *out) {
    be->ops->embed(be, table, out);
}

void pd_backend_rmsnorm(struct pd_backend *be, const float *x, const struct pd_tensor *w,
                        int64_t rows, int dim, float eps, float *out) {
    PD_ASSERT(w->rows * w->cols == dim);
    be->ops->rmsnorm(be, x, w, rows, dim, eps, out);
}

void pd_backend_matmul(struct pd_backend *be, const float *x, int64_t rows,
                       const struct pd_tensor *w, const struct pd_tensor *bias, float *y) {
    PD_ASSERT(!bias || bias->rows * bias->cols == w->rows);
    be->ops->matmul(be, x, rows, w, bias, y);
}

void pd_backend_rope(struct pd_backend *be, float *x, int heads, int head_dim,
                     const float *inv_freq) {
    PD_ASSERT(head_dim % 2 == 0);
    be->ops->rope(be, x, heads, head_dim, inv_freq);
}

void pd_backend_silu_mul(struct pd_backend *be, const float *gate, const float *up, float *out,
                         int64_t count) {
    be->ops->silu_mul(be, gate, up, out, count);
}

void pd_backend_add(struct pd_backend *be, float *x, const float *y, int64_t count) {
    be->ops->add(be, x, y, count);
}

void pd_backend_kv_store(struct pd_backend *be, const struct pd_kv_layout *kv, int layer,
                         const float *k, const float *v) {
    PD_ASSERT(layer >= 0 && layer < kv->n_layers);
    be->ops->kv_store(be, kv, layer, k, v);
}

void pd_backend_attention(struct pd_backend *be, const struct pd_kv_layout *kv, int layer,
                          const float *q, int heads, float scale, int window, float *out) {
    PD_ASSERT(layer >= 0 && layer < kv->n_layers && heads % kv->kv_heads == 0 && window >= 0);
    be->ops->attention(be, kv, layer, q, heads, scale, window, out);
}

bool pd_backend_has_vision(const struct pd_backend *be) {
    const struct pd__backend_ops *o = be->ops;
    return o->layernorm && o->act && o->rope_angles && o->attention_segments;
}

void pd_backend_layernorm(struct pd_backend *be, const float *x, const struct pd_tensor *w,
                          const struct pd_tensor *b, int64_t rows, int dim, float eps, float *out) {
    PD_ASSERT(be->ops->layernorm && w->rows * w->cols == dim && b->rows * b->cols == dim);
    be->ops->layernorm(be, x, w, b, rows, dim, eps, out);
}

void pd_backend_act(struct pd_backend *be, enum pd_act act, const float *x, float *out,
                    int64_t count) {
    PD_ASSERT(be->ops->act && (act == PD_ACT_GELU || act == PD_ACT_QUICK_GELU));
    be->ops->act(be, act, x, out, count);
}

void pd_backend_rope_angles(struct pd_backend *be, float *x, int64_t rows, int heads, int head_dim,
                            const float *angles) {
    PD_ASSERT(be->ops->rope_angles && head_dim % 2 == 0);
    be->ops->rope_angles(be, x, rows, heads, head_dim, angles);
}

void pd_backend_attention_segments(struct pd_backend *be, const float *q, const float *k,
                                   const float *v, int heads, int head_dim,
                                   const int32_t *seg_start, int n_segs, float scale, float *out) {
    PD_ASSERT(be->ops->attention_segments && n_segs >= 1 && heads >= 1 && head_dim >= 1);
    be->ops->attention_segments(be, q, k, v, heads, head_dim, seg_start, n_segs, scale, out);
}

void pd_backend_gather_out_rows(struct pd_backend *be, const float *src, int width, float *dst) {
    be->ops->gather_out_rows(be, src, width, dst);
}
