/*
 * backend_impl.h — what a backend implements: the op table behind model/backend.h. Internal to
 * backends (cpu here, cuda in kernels/); the model never includes it.
 *
 * A backend's state struct starts with struct pd_backend, whose ops point at its table. A backend
 * joins the build by one line in the registry (model/backend_reg.c), which names its constructor
 * (pd__backend_<name>_new, declared in the backend's own header); nothing here names a backend.
 */
#ifndef PD_BACKEND_IMPL_H
#define PD_BACKEND_IMPL_H

#include "model/backend.h"

struct pd__backend_ops {
    void (*free)(struct pd_backend *be);
    int (*mem_info)(struct pd_backend *be, size_t *total, size_t *avail);
    int (*alloc)(struct pd_backend *be, size_t bytes, void **out);
    void (*release)(struct pd_backend *be, void *p);
    /* NULL: its buffers are resident from the start (device memory) */
    void (*make_resident)(struct pd_backend *be, void *p, size_t bytes);
    int (*reserve)(struct pd_backend *be, const struct pd_backend_limits *lim);
    int (*weight)(struct pd_backend *be, enum pd_dtype dtype, int64_t rows, int64_t cols,
                  const void *host, struct pd_tensor *out);
    /* NULL: the backend keeps weights where pd_backend_weight put them */
    int (*weight_pack)(struct pd_backend *be, struct pd_tensor *const *ts, int n);
    int (*upload)(struct pd_backend *be, void *dst, const void *src, size_t bytes);
    int (*download)(struct pd_backend *be, void *dst, const void *src, size_t bytes);
    int (*sync)(struct pd_backend *be);
    int (*set_batch)(struct pd_backend *be, const struct pd_batch_plan *plan);
    void (*embed)(struct pd_backend *be, const struct pd_tensor *table, float *out);
    void (*rmsnorm)(struct pd_backend *be, const float *x, const struct pd_tensor *w, int64_t rows,
                    int dim, float eps, float *out);
    void (*matmul)(struct pd_backend *be, const float *x, int64_t rows, const struct pd_tensor *w,
                   const struct pd_tensor *bias, float *y);
    void (*rope)(struct pd_backend *be, float *x, int heads, int head_dim, const float *inv_freq);
    void (*silu_mul)(struct pd_backend *be, const float *gate, const float *up, float *out,
                     int64_t count);
    void (*add)(struct pd_backend *be, float *x, const float *y, int64_t count);
    void (*kv_store)(struct pd_backend *be, const struct pd_kv_layout *kv, int layer,
                     const float *k, const float *v);
    void (*attention)(struct pd_backend *be, const struct pd_kv_layout *kv, int layer,
                      const float *q, int heads, float scale, int window, float *out);
    void (*gather_out_rows)(struct pd_backend *be, const float *src, int width, float *dst);
    int (*argmax)(struct pd_backend *be, const float *x, int rows, int cols, int32_t *ids,
                  float *logprobs);
    int (*sample)(struct pd_backend *be, const float *x, int rows, int cols,
                  const struct pd_sample_row *row, int32_t *ids, float *logprobs);
    /* the vision encoder's ops: NULL all four where the backend has none (pd_backend_has_vision) */
    void (*layernorm)(struct pd_backend *be, const float *x, const struct pd_tensor *w,
                      const struct pd_tensor *b, int64_t rows, int dim, float eps, float *out);
    void (*act)(struct pd_backend *be, enum pd_act act, const float *x, float *out, int64_t count);
    void (*rope_angles)(struct pd_backend *be, float *x, int64_t rows, int heads, int head_dim,
                        const float *angles);
    void (*attention_segments)(struct pd_backend *be, const float *q, const float *k,
                               const float *v, int heads, int head_dim, const int32_t *seg_start,
                               int n_segs, float scale, float *out);
    /* arguments checked by backend.c (model/backend.h) before these are called */
    int (*penalty_reserve)(struct pd_backend *be, int slots, int vocab, int max_ids);
    int (*penalty_set)(struct pd_backend *be, int slot, const int32_t *prompt, int n_prompt,
                       const int32_t *out, int n_out);
};

struct pd_backend {
    const struct pd__backend_ops *ops;
    enum pd_backend_kind kind;
    char name[64];
    /* penalty state geometry (pd_backend_penalty_reserve; 0 before), and per slot the last
     * pd_backend_sample call that penalized it, so a call sharing a slot between rows is refused
     * in backend.c rather than racing on the device */
    int pen_slots, pen_vocab, pen_max_ids;
    /* the largest limits reserved so far (pd_backend_reserve; max_tokens 0 before) */
    struct pd_backend_limits reserved;
    uint32_t *pen_stamp; /* [pen_slots] host */
    uint32_t pen_call;
};

/* What every backend's set_batch checks before using a plan: sizes within the reserved limits,
 * offsets that cover the batch, per-request token and cache counts, output rows inside it.
 * PD_OK, or PD_ERANGE / PD_EINVAL with the error set. */
int pd__batch_plan_check(const struct pd_batch_plan *p, const struct pd_backend_limits *lim);

#endif
