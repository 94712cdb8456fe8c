/*
 * backend.c — picks a backend and forwards every call through its op table. Holds no state of
 * its own; argument checks that apply to every backend live here so each backend need not
 * repeat them.
 */
#include "common/backend.h"
#include "common/sampling.h"
#include "common/backend_impl.h"
#include "common/status.h"

int pd_backend_new(const struct pd_backend_opts *opts, struct pd_backend **out) {
    *out = NULL;
    switch (opts->kind) {
    case PD_BACKEND_CPU: return pd__backend_cpu_new(opts, out);
    case PD_BACKEND_CUDA:
        if (!pd__backend_cuda_new)
            return pd_errorf(PD_EUNSUPPORTED,
                             "the cuda backend is not in this build (configure with PD_CUDA=ON)");
        return pd__backend_cuda_new(opts, out);
    }
    return pd_errorf(PD_EINVAL, "unknown backend kind %d", (int)opts->kind);
}

void pd_backend_free(struct pd_backend *be) {
    if (be)
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

int pd_backend_reserve(struct pd_backend *be, const struct pd_backend_limits *lim) {
    if (lim->max_tokens < 1 || lim->max_reqs < 1 || lim->max_pages < 1 || lim->max_context < 1 ||
        lim->max_heads < 1 || lim->max_head_dim < 1 || lim->max_dim < 1)
        return pd_errorf(PD_EINVAL, "backend limits must all be positive");
    return be->ops->reserve(be, lim);
}

int pd_backend_weight(struct pd_backend *be, enum pd_dtype dtype, int64_t rows, int64_t cols,
                      const void *host, struct pd_tensor *out) {
    if (rows < 1 || cols < 1)
        return pd_errorf(PD_EINVAL, "weight of shape [%lld, %lld]", (long long)rows,
                         (long long)cols);
    return be->ops->weight(be, dtype, rows, cols, host, out);
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

int pd_backend_sample(struct pd_backend *be, const float *x, int rows, int cols,
                      const struct pd_sample_row *row, int32_t *ids, float *logprobs) {
    if (rows < 0 || cols < 1)
        return pd_errorf(PD_EINVAL, "sampling %d rows of %d", rows, cols);
    for (int r = 0; r < rows; r++) {
        struct pd_sampling_params p;
        pd_sampling_params_default(&p);
        p.temperature = row[r].temperature;
        p.top_k = row[r].top_k;
        p.top_p = row[r].top_p;
        p.min_p = row[r].min_p;
        int rc = pd_sampling_params_check(&p);
        if (rc)
            return pd_error_wrap(rc, "sampling row %d", r);
        if (!(row[r].u >= 0 && row[r].u < 1))
            return pd_errorf(PD_EINVAL, "sampling row %d: u %g outside [0, 1)", r, row[r].u);
    }
    return rows ? be->ops->sample(be, x, rows, cols, row, ids, logprobs) : PD_OK;
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

void pd_backend_gather_out_rows(struct pd_backend *be, const float *src, int width, float *dst) {
    be->ops->gather_out_rows(be, src, width, dst);
}
