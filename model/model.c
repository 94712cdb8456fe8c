/*
 * model.c — weights, step buffers and the forward pass of the Llama family over a backend.
 *
 * Layout of one step: the requests' tokens are concatenated request-major into rows
 * 0..n_tokens-1 of every activation buffer; the host plan (positions, KV slots, page tables,
 * rows whose logits are wanted) is validated here, then handed to the backend once. Layers only
 * enqueue backend ops; the logits are the one download of a step.
 * Matches transformers' modeling_llama / qwen2 / qwen3 op for op: pre-norm residual blocks,
 * RMSNorm in f32, q/k norm before RoPE, half-split RoPE, softmax(q·kᵀ / sqrt(head_dim)), SwiGLU.
 * Nothing here knows which backend runs it.
 *
 * Tensor parallelism (model/tp.h): with opts.tp of size S, this model holds rank r's share —
 * heads/S query heads, kv_heads/S kv heads (one, replicated, when S > kv_heads), intermediate/S
 * MLP columns — and sums the output
 * and down projections with the other ranks before each residual add. Column-parallel weights
 * are row ranges of the checkpoint tensors (aliased where the backend can); row-parallel ones
 * (o_proj, down_proj) are column ranges, gathered into host copies the model owns.
 */
#include "model/model.h"
#include "common/base/alloc.h"
#include "common/base/status.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

struct layer_weights {
    struct pd_tensor attn_norm, wq, wk, wv, wo, bq, bk, bv, bo, q_norm, k_norm;
    struct pd_tensor mlp_norm, gate, up, down;
    bool has_qkv_bias, has_o_bias;
};

struct pd_model {
    struct pd_model_config cfg;
    struct pd_model_opts opts;
    struct pd_backend *be;
    void (*owner_free)(void *); /* releases what the weights point into (pd__model_own) */
    void *owner;
    int context_length;
    const struct pd_tp_comm *tp; /* NULL: tp 1 */
    int tp_rank, tp_size;
    int heads, kv_heads, inter; /* this rank's share of the config's */
    void **host_copies;         /* [n_host_copies] gathered row-parallel weights */
    int n_host_copies;
    struct pd_tensor embed, final_norm, lm_head;
    struct layer_weights *layers; /* [num_hidden_layers] */
    float *inv_freq;              /* device [head_dim/2] */
    /* M-RoPE (cfg.mrope_section): each token's angles, planned on the host per step */
    bool mrope;
    float *angles;           /* device [max_tokens][head_dim/2] */
    float *angles_h;         /* host, the same */
    float inv_h[512];        /* host copy of inv_freq */
    uint8_t mrope_axis[512]; /* M-RoPE: the position axis (0 t, 1 h, 2 w) of frequency j */
    /* step activations, device */
    float *x;       /* [max_tokens][hidden] residual stream */
    float *h;       /* [max_tokens][max(hidden, q_dim)] normed input / projection outputs */
    float *q, *att; /* [max_tokens][heads*head_dim] */
    float *k, *v;   /* [max_tokens][kv_heads*head_dim] */
    float *g, *u;   /* [max_tokens][intermediate] */
    float *out;     /* [max_logit_rows][hidden] rows whose logits are wanted */
    float *logits;  /* [max_logit_rows][vocab] */
    /* step plan, host */
    int32_t *ids, *pos, *slots, *out_rows; /* [max_tokens] */
    int32_t *tok_start, *page_start;       /* [max_reqs + 1] */
    int32_t *kv_len;                       /* [max_reqs] */
    int32_t *page_table;                   /* [max_pages] */
    int max_pages;
};

/* ---- weights ---- */

/* How a checkpoint tensor is split over tp ranks. */
enum shard {
    WHOLE, /* replicated */
    ROWS,  /* column-parallel: rank r takes rows [r*rows/S, (r+1)*rows/S); a vector, its values */
    KV,    /* k/v projections: as ROWS over min(S, kv_heads) parts; beyond the kv head count each
              kv head is replicated on S/kv_heads ranks, rank r holding head r / (S/kv_heads) */
    COLS,  /* row-parallel: rank r takes columns [r*cols/S, (r+1)*cols/S) */
};

/* rank's share of a checkpoint tensor [rows][cols] (rows 1: a vector) as backend weight. */
static int shard_weight(struct pd_model *m, const struct pd_tensor_view *t, int64_t rows,
                        int64_t cols, enum shard how, struct pd_tensor *out) {
    size_t es = pd_dtype_size(t->dtype);
    const char *base = t->data;
    int S = m->tp_size, r = m->tp_rank;
    if (how == WHOLE || S == 1)
        return pd_backend_weight(m->be, t->dtype, rows, cols, base, out);
    if (how == KV) { /* parts of whole kv heads: the q heads of rank r use exactly that head */
        int kvh = m->cfg.num_key_value_heads;
        if (S > kvh) {
            r /= S / kvh;
            S = kvh;
        }
        how = ROWS;
    }
    if (how == ROWS && rows == 1) /* a bias of a column-parallel projection */
        return pd_backend_weight(m->be, t->dtype, 1, cols / S, base + (size_t)(r * cols / S) * es,
                                 out);
    if (how == ROWS)
        return pd_backend_weight(m->be, t->dtype, rows / S, cols,
                                 base + (size_t)(r * (rows / S) * cols) * es, out);
    int64_t lc = cols / S;
    char *copy = pd_malloc((size_t)(rows * lc) * es);
    if (!copy)
        return PD_ENOMEM;
    void **grown = pd_realloc(m->host_copies, sizeof(void *) * ((size_t)m->n_host_copies + 1));
    if (!grown) {
        pd_free(copy);
        return PD_ENOMEM;
    }
    m->host_copies = grown;
    m->host_copies[m->n_host_copies++] = copy;
    for (int64_t i = 0; i < rows; i++)
        memcpy(copy + (size_t)(i * lc) * es, base + (size_t)(i * cols + r * lc) * es,
               (size_t)lc * es);
    return pd_backend_weight(m->be, t->dtype, rows, lc, copy, out);
}

static int get_tensor(struct pd_model *m, pd_model_find_fn find, void *ctx, const char *name,
                      int64_t rows, int64_t cols, bool required, enum shard how,
                      struct pd_tensor *out) {
    const struct pd_tensor_view *t = find(ctx, name);
    if (!t) {
        if (required)
            return pd_errorf(PD_ENOENT, "tensor '%s' missing from the checkpoint", name);
        memset(out, 0, sizeof(*out));
        return PD_OK;
    }
    bool vec = rows == 1;
    bool shape_ok = vec ? (t->ndim == 1 && t->shape[0] == cols)
                        : (t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols);
    if (!shape_ok) {
        if (vec)
            return pd_errorf(PD_EFORMAT,
                             "tensor '%s' has %d dims (first %lld), config implies [%lld]", name,
                             t->ndim, (long long)t->shape[0], (long long)cols);
        return pd_errorf(PD_EFORMAT,
                         "tensor '%s' has shape [%lld, %lld], config implies [%lld, %lld]", name,
                         (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : 0),
                         (long long)rows, (long long)cols);
    }
    if (t->dtype != PD_DTYPE_F32 && t->dtype != PD_DTYPE_BF16 && t->dtype != PD_DTYPE_F16)
        return pd_errorf(PD_EUNSUPPORTED, "tensor '%s' has dtype %d", name, (int)t->dtype);
    int rc = shard_weight(m, t, rows, cols, how, out);
    return rc ? pd_error_wrap(rc, "tensor '%s'", name) : PD_OK;
}

/* Weights of one input stored back to back for the backend (pd_backend_weight_pack), when a
 * checkpoint gives them one dtype (else they stay apart: products one by one). */
static int pack_weights(struct pd_model *m, struct pd_tensor **ts, int n) {
    for (int i = 1; i < n; i++)
        if (ts[i]->dtype != ts[0]->dtype)
            return PD_OK;
    return pd_backend_weight_pack(m->be, ts, n);
}

static int load_weights(struct pd_model *m, pd_model_find_fn find, void *ctx) {
    const struct pd_model_config *c = &m->cfg;
    int64_t hid = c->hidden_size, qd = (int64_t)c->num_attention_heads * c->head_dim;
    int64_t kvd = (int64_t)c->num_key_value_heads * c->head_dim, inter = c->intermediate_size;
    int rc;
    char n[128];
#define GET(name_, rows_, cols_, req_, how_, dst_)                                                 \
    if ((rc = get_tensor(m, find, ctx, name_, rows_, cols_, req_, how_, dst_)) != PD_OK)           \
    return rc
    GET("model.embed_tokens.weight", c->vocab_size, hid, true, WHOLE, &m->embed);
    GET("model.norm.weight", 1, hid, true, WHOLE, &m->final_norm);
    if (c->tie_word_embeddings) {
        m->lm_head = m->embed;
    } else {
        GET("lm_head.weight", c->vocab_size, hid, true, WHOLE, &m->lm_head);
    }
    for (int l = 0; l < c->num_hidden_layers; l++) {
        struct layer_weights *w = &m->layers[l];
#define LGET(suffix_, rows_, cols_, req_, how_, dst_)                                              \
    snprintf(n, sizeof(n), "model.layers.%d.%s", l, suffix_);                                      \
    GET(n, rows_, cols_, req_, how_, dst_)
        LGET("input_layernorm.weight", 1, hid, true, WHOLE, &w->attn_norm);
        LGET("self_attn.q_proj.weight", qd, hid, true, ROWS, &w->wq);
        LGET("self_attn.k_proj.weight", kvd, hid, true, KV, &w->wk);
        LGET("self_attn.v_proj.weight", kvd, hid, true, KV, &w->wv);
        LGET("self_attn.o_proj.weight", hid, qd, true, COLS, &w->wo);
        LGET("self_attn.q_proj.bias", 1, qd, c->attention_bias, ROWS, &w->bq);
        LGET("self_attn.k_proj.bias", 1, kvd, c->attention_bias, KV, &w->bk);
        LGET("self_attn.v_proj.bias", 1, kvd, c->attention_bias, KV, &w->bv);
        /* Llama's attention_bias also biases o_proj; Qwen2's does not: use it when present.
         * It is added once, after the sum: by rank 0 only. */
        LGET("self_attn.o_proj.bias", 1, hid, false, WHOLE, &w->bo);
        w->has_qkv_bias = w->bq.data && w->bk.data && w->bv.data;
        /* q, k, v (and their biases), gate and up: each multiplied by one input */
        struct pd_tensor *qkv[] = {&w->wq, &w->wk, &w->wv}, *qkv_b[] = {&w->bq, &w->bk, &w->bv};
        if ((rc = pack_weights(m, qkv, 3)) || (w->has_qkv_bias && (rc = pack_weights(m, qkv_b, 3))))
            return pd_error_wrap(rc, "layer %d's q, k and v", l);
        w->has_o_bias = w->bo.data != NULL && m->tp_rank == 0;
        if (c->qk_norm) {
            LGET("self_attn.q_norm.weight", 1, c->head_dim, true, WHOLE, &w->q_norm);
            LGET("self_attn.k_norm.weight", 1, c->head_dim, true, WHOLE, &w->k_norm);
        }
        LGET("post_attention_layernorm.weight", 1, hid, true, WHOLE, &w->mlp_norm);
        LGET("mlp.gate_proj.weight", inter, hid, true, ROWS, &w->gate);
        LGET("mlp.up_proj.weight", inter, hid, true, ROWS, &w->up);
        LGET("mlp.down_proj.weight", hid, inter, true, COLS, &w->down);
        struct pd_tensor *gate_up[] = {&w->gate, &w->up};
        if ((rc = pack_weights(m, gate_up, 2)))
            return pd_error_wrap(rc, "layer %d's gate and up", l);
#undef LGET
    }
#undef GET
    return PD_OK;
}

/* As transformers' rope init: inv_freq in f32 = 1 / theta^(2i/d); llama3 scaling divides the low
 * frequencies by factor and blends the band between low_freq and high_freq wavelengths. */
static void rope_inv_freq(const struct pd_model_config *c, float *inv) {
    int half = c->head_dim / 2;
    for (int i = 0; i < half; i++) {
        float f = 1.0f / powf((float)c->rope_theta, (float)(2 * i) / (float)c->head_dim);
        if (c->rope_scaling.type == PD_ROPE_LLAMA3) {
            const struct pd_rope_scaling *s = &c->rope_scaling;
            float factor = (float)s->factor, lo = (float)s->low_freq_factor;
            float hi = (float)s->high_freq_factor, old = (float)s->original_max_position_embeddings;
            float lo_wl = old / lo, hi_wl = old / hi;
            float wl = 2.0f * (float)M_PI / f;
            float scaled = wl > lo_wl ? f / factor : f;
            if (!(wl < hi_wl) && !(wl > lo_wl)) {
                float smooth = (old / wl - lo) / (hi - lo);
                scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
            }
            f = scaled;
        }
        inv[i] = f;
    }
}

/* ---- creation ---- */

static int fill_opts(const struct pd_model_config *c, const struct pd_model_opts *in,
                     struct pd_model_opts *o) {
    *o = in ? *in : (struct pd_model_opts){0};
    if (o->max_tokens <= 0)
        o->max_tokens = 2048;
    if (o->max_reqs <= 0)
        o->max_reqs = 64;
    if (o->max_logit_rows <= 0)
        o->max_logit_rows = o->max_reqs > 256 ? o->max_reqs : 256;
    if (o->max_logit_rows < o->max_reqs)
        o->max_logit_rows = o->max_reqs;
    if (o->page_size <= 0)
        o->page_size = 16;
    if (o->context_length < 0)
        return pd_errorf(PD_EINVAL, "context length %d", o->context_length);
    if (c->head_dim % 2 || c->num_attention_heads % c->num_key_value_heads)
        return pd_errorf(PD_EINVAL,
                         "head_dim %d must be even and %d heads a multiple of %d kv heads",
                         c->head_dim, c->num_attention_heads, c->num_key_value_heads);
    int S = o->tp ? o->tp->size : 1;
    if (o->tp && (S < 1 || o->tp->rank < 0 || o->tp->rank >= S || !o->tp->all_reduce_sum))
        return pd_errorf(PD_EINVAL, "tp rank %d of %d", o->tp->rank, S);
    /* kv heads are split over the ranks, or, with more ranks than kv heads, each replicated on
     * S / kv_heads of them (as SGLang does); the query heads and the MLP always split evenly */
    int kvh = c->num_key_value_heads;
    if (S <= kvh ? kvh % S != 0 : S % kvh != 0)
        return pd_errorf(PD_EUNSUPPORTED,
                         "--tp-size %d cannot split the %d kv heads: it must divide them, or be a "
                         "multiple of them (each kv head then replicated on tp / kv ranks)",
                         S, kvh);
    if (c->num_attention_heads % S || c->intermediate_size % S)
        return pd_errorf(PD_EUNSUPPORTED,
                         "--tp-size %d must divide the %d attention heads and the intermediate "
                         "size %d",
                         S, c->num_attention_heads, c->intermediate_size);
    return PD_OK;
}

static int alloc_buf(struct pd_model *m, size_t floats, float **out) {
    void *p;
    int rc = pd_backend_alloc(m->be, floats * sizeof(float), &p);
    *out = p;
    return rc;
}

/* Layer l's attention window (pd_backend_attention): the config's sliding window on the layers
 * it covers, 0 elsewhere and when the window is no shorter than the context (it masks nothing). */
static int layer_window(const struct pd_model *m, int l) {
    const struct pd_model_config *c = &m->cfg;
    if (c->sliding_window <= 0 || c->sliding_window >= m->context_length ||
        l < c->max_window_layers)
        return 0;
    return c->sliding_window;
}

int pd_model_new(struct pd_backend *be, const struct pd_model_config *cfg, pd_model_find_fn find,
                 void *find_ctx, const struct pd_model_opts *opts, struct pd_model **out) {
    *out = NULL;
    struct pd_model *m = pd_calloc(1, sizeof(*m));
    if (!m)
        return PD_ENOMEM;
    int rc;
    m->be = be;
    m->cfg = *cfg;
    if ((rc = fill_opts(cfg, opts, &m->opts)) != PD_OK)
        goto fail;
    const struct pd_model_opts *o = &m->opts;
    m->context_length = o->context_length ? o->context_length : cfg->max_position_embeddings;
    if (pd_backend_kind_of(be) != PD_BACKEND_CPU && layer_window(m, cfg->num_hidden_layers - 1)) {
        rc = pd_errorf(PD_EUNSUPPORTED,
                       "the model's sliding_window (%d tokens) is shorter than the context (%d "
                       "tokens) and the %s backend has no sliding-window attention: results "
                       "would differ from the model's; use the cpu backend, or --context-length "
                       "%d (the window then masks nothing)",
                       cfg->sliding_window, m->context_length, pd_backend_name(be),
                       cfg->sliding_window);
        goto fail;
    }
    m->tp = o->tp;
    m->tp_rank = o->tp ? o->tp->rank : 0;
    m->tp_size = o->tp ? o->tp->size : 1;
    m->heads = cfg->num_attention_heads / m->tp_size;
    m->kv_heads = cfg->num_key_value_heads > m->tp_size ? cfg->num_key_value_heads / m->tp_size
                                                        : 1; /* replicated: one kv head per rank */
    m->inter = cfg->intermediate_size / m->tp_size;
    if (!(m->layers = pd_calloc((size_t)cfg->num_hidden_layers, sizeof(*m->layers)))) {
        rc = PD_ENOMEM;
        goto fail;
    }
    if ((rc = load_weights(m, find, find_ctx)) != PD_OK)
        goto fail;

    size_t T = (size_t)o->max_tokens, hid = (size_t)cfg->hidden_size;
    size_t qd = (size_t)m->heads * (size_t)cfg->head_dim;
    size_t kvd = (size_t)m->kv_heads * (size_t)cfg->head_dim;
    size_t R = (size_t)o->max_logit_rows;
    int pages_per_req = (m->context_length + o->page_size - 1) / o->page_size;
    m->max_pages = o->max_reqs * pages_per_req;
    if ((rc = alloc_buf(m, (size_t)cfg->head_dim / 2, &m->inv_freq)) ||
        (rc = alloc_buf(m, T * hid, &m->x)) ||
        (rc = alloc_buf(m, T * (hid > qd ? hid : qd), &m->h)) ||
        (rc = alloc_buf(m, T * qd, &m->q)) || (rc = alloc_buf(m, T * qd, &m->att)) ||
        (rc = alloc_buf(m, T * kvd, &m->k)) || (rc = alloc_buf(m, T * kvd, &m->v)) ||
        (rc = alloc_buf(m, T * (size_t)m->inter, &m->g)) ||
        (rc = alloc_buf(m, T * (size_t)m->inter, &m->u)) || (rc = alloc_buf(m, R * hid, &m->out)) ||
        (rc = alloc_buf(m, R * (size_t)cfg->vocab_size, &m->logits)))
        goto fail;
    m->ids = pd_calloc(T, sizeof(int32_t));
    m->pos = pd_calloc(T, sizeof(int32_t));
    m->slots = pd_calloc(T, sizeof(int32_t));
    m->out_rows = pd_calloc(T, sizeof(int32_t));
    m->tok_start = pd_calloc((size_t)o->max_reqs + 1, sizeof(int32_t));
    m->page_start = pd_calloc((size_t)o->max_reqs + 1, sizeof(int32_t));
    m->kv_len = pd_calloc((size_t)o->max_reqs, sizeof(int32_t));
    m->page_table = pd_calloc((size_t)m->max_pages, sizeof(int32_t));
    if (!m->ids || !m->pos || !m->slots || !m->out_rows || !m->tok_start || !m->page_start ||
        !m->kv_len || !m->page_table) {
        rc = PD_ENOMEM;
        goto fail;
    }
    float inv[512];
    if (cfg->head_dim / 2 > (int)PD_ARRAY_LEN(inv)) {
        rc = pd_errorf(PD_EUNSUPPORTED, "head_dim %d (at most 1024)", cfg->head_dim);
        goto fail;
    }
    rope_inv_freq(cfg, inv);
    if ((rc = pd_backend_upload(be, m->inv_freq, inv, sizeof(float) * (size_t)(cfg->head_dim / 2))))
        goto fail;
    memcpy(m->inv_h, inv, sizeof(inv));
    m->mrope = cfg->mrope_section[0] + cfg->mrope_section[1] + cfg->mrope_section[2] > 0;
    for (int j = 0, a = 0, end = cfg->mrope_section[0]; m->mrope && j < cfg->head_dim / 2; j++) {
        while (j >= end && a < 2)
            end += cfg->mrope_section[++a];
        m->mrope_axis[j] = (uint8_t)a;
    }
    if (m->mrope && !pd_backend_has_vision(be)) {
        rc = pd_errorf(PD_EUNSUPPORTED,
                       "the %s backend has no M-RoPE (rotary by explicit angles) "
                       "yet, which %s models need",
                       pd_backend_name(be), cfg->vl == PD_VL_QWEN2_5 ? "qwen2_5_vl" : "qwen2_vl");
        goto fail;
    }
    if (m->mrope && ((rc = alloc_buf(m, T * (size_t)(cfg->head_dim / 2), &m->angles)) ||
                     !(m->angles_h = pd_malloc(T * (size_t)(cfg->head_dim / 2) * sizeof(float))))) {
        rc = rc ? rc : PD_ENOMEM;
        goto fail;
    }
    int max_dim = cfg->hidden_size > (int)qd ? cfg->hidden_size : (int)qd;
    if (m->inter > max_dim)
        max_dim = m->inter;
    struct pd_backend_limits lim = {
        .max_tokens = o->max_tokens,
        .max_reqs = o->max_reqs,
        .max_pages = m->max_pages,
        .max_context = m->context_length,
        .max_heads = m->heads,
        .max_head_dim = cfg->head_dim,
        .max_dim = max_dim,
    };
    if ((rc = pd_backend_reserve(be, &lim)) != PD_OK)
        goto fail;
    *out = m;
    return PD_OK;
fail:
    pd_model_free(m);
    return pd_error_wrap(rc, "building the model");
}

void pd_model_free(struct pd_model *m) {
    if (!m)
        return;
    float *bufs[] = {m->inv_freq, m->x, m->h, m->q,   m->att,    m->k,
                     m->v,        m->g, m->u, m->out, m->logits, m->angles};
    for (size_t i = 0; i < PD_ARRAY_LEN(bufs); i++)
        pd_backend_release(m->be, bufs[i]);
    pd_free(m->ids);
    pd_free(m->pos);
    pd_free(m->slots);
    pd_free(m->out_rows);
    pd_free(m->tok_start);
    pd_free(m->page_start);
    pd_free(m->kv_len);
    pd_free(m->page_table);
    pd_free(m->angles_h);
    pd_free(m->layers);
    for (int i = 0; i < m->n_host_copies; i++)
        pd_free(m->host_copies[i]);
    pd_free(m->host_copies);
    if (m->owner_free)
        m->owner_free(m->owner);
    pd_free(m);
}

void pd__model_own(struct pd_model *m, void (*owner_free)(void *), void *owner) {
    m->owner_free = owner_free;
    m->owner = owner;
}

const struct pd_model_config *pd_model_config_of(const struct pd_model *m) {
    return &m->cfg;
}

int pd_model_context_length(const struct pd_model *m) {
    return m->context_length;
}

const struct pd_model_opts *pd_model_opts_of(const struct pd_model *m) {
    return &m->opts;
}

static size_t tensor_bytes(const struct pd_tensor *t) {
    return t->data ? (size_t)(t->rows * t->cols) * pd_dtype_size(t->dtype) : 0;
}

size_t pd_model_weight_bytes(const struct pd_model *m) {
    size_t b = tensor_bytes(&m->lm_head) + tensor_bytes(&m->final_norm);
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
        const struct layer_weights *w = &m->layers[l];
        const struct pd_tensor *ts[] = {&w->attn_norm, &w->wq,       &w->wk,   &w->wv, &w->wo,
                                        &w->bq,        &w->bk,       &w->bv,   &w->bo, &w->q_norm,
                                        &w->k_norm,    &w->mlp_norm, &w->gate, &w->up, &w->down};
        for (size_t i = 0; i < PD_ARRAY_LEN(ts); i++)
            b += tensor_bytes(ts[i]);
    }
    return b;
}

struct pd_kv_pool_opts pd_model_kv_opts(const struct pd_model *m, enum pd_dtype kv_dtype) {
    return (struct pd_kv_pool_opts){
        .n_layers = m->cfg.num_hidden_layers,
        .kv_heads = m->kv_heads,
        .head_dim = m->cfg.head_dim,
        .page_size = m->opts.page_size,
        .dtype = kv_dtype,
        .mem_fraction_static = 0.88,
    };
}

void pd_model_kv_heads_of(const struct pd_model *m, int *start, int *count) {
    int kvh = m->cfg.num_key_value_heads, S = m->tp_size, r = m->tp_rank;
    *count = m->kv_heads;
    *start = S > kvh ? r / (S / kvh) : r * m->kv_heads; /* as shard_weight's KV split */
}

/* ---- a step ---- */

/* M-RoPE angles of request s's new tokens, from row `row` of the step on: frequency j turns by
 * the position of its section's axis (temporal, height, width: mrope_section[0], [1], [2]
 * frequencies each), in f32 as transformers' position × inv_freq. */
static void plan_mrope(struct pd_model *m, const struct pd_model_seq *s, int row) {
    int half = m->cfg.head_dim / 2;
    const uint8_t *axis_of = m->mrope_axis;
    for (int i = 0; i < s->n_new; i++) {
        float *ang = m->angles_h + (size_t)(row + i) * (size_t)half;
        for (int j = 0; j < half; j++) {
            int32_t p = s->mpos ? s->mpos[i * 3 + axis_of[j]] : s->n_cached + i + s->pos_delta;
            ang[j] = (float)p * m->inv_h[j];
        }
    }
}

/* Validates every request and builds the host plan; nothing is written before all pass. */
static int plan_step(struct pd_model *m, const struct pd_kv_pool *kv,
                     const struct pd_model_seq *seqs, int n_seqs, bool all_logits,
                     struct pd_batch_plan *p) {
    const struct pd_kv_layout *L = &kv->layout;
    const struct pd_model_config *c = &m->cfg;
    if (L->n_layers != c->num_hidden_layers || L->kv_heads != m->kv_heads ||
        L->head_dim != c->head_dim || L->page_size != m->opts.page_size)
        return pd_errorf(PD_EMISMATCH,
                         "kv pool (%d layers, %d kv heads, head dim %d, page %d) does not fit the "
                         "model (%d, %d, %d, %d)",
                         L->n_layers, L->kv_heads, L->head_dim, L->page_size, c->num_hidden_layers,
                         m->kv_heads, c->head_dim, m->opts.page_size);
    if (n_seqs < 1 || n_seqs > m->opts.max_reqs)
        return pd_errorf(PD_ERANGE, "a step of %d requests (at most %d)", n_seqs, m->opts.max_reqs);
    int ps = L->page_size, n = 0, np = 0;
    for (int r = 0; r < n_seqs; r++) {
        const struct pd_model_seq *s = &seqs[r];
        if (s->n_new < 1 || s->n_cached < 0 || s->n_pages < 0)
            return pd_errorf(PD_EINVAL, "request %d: %d new tokens after %d cached, %d pages", r,
                             s->n_new, s->n_cached, s->n_pages);
        int64_t total = (int64_t)s->n_cached + s->n_new;
        if (total > m->context_length)
            return pd_errorf(PD_ERANGE,
                             "request %d: %lld tokens is longer than the context length %d", r,
                             (long long)total, m->context_length);
        int need = (int)((total + ps - 1) / ps);
        if (need > s->n_pages)
            return pd_errorf(PD_ERANGE, "request %d: %lld tokens need %d pages of %d, got %d", r,
                             (long long)total, need, ps, s->n_pages);
        int rc = pd_kv_pool_check_pages(kv, s->pages, need);
        if (rc)
            return pd_error_wrap(rc, "request %d", r);
        if (n + s->n_new > m->opts.max_tokens)
            return pd_errorf(PD_ERANGE, "a step of more than %d tokens (the step limit)",
                             m->opts.max_tokens);
        m->tok_start[r] = n;
        m->page_start[r] = np;
        for (int i = 0; i < s->n_new; i++, n++) {
            int32_t id = s->tokens[i], pos = s->n_cached + i;
            if (id < 0 || id >= c->vocab_size)
                return pd_errorf(PD_ERANGE, "request %d: token id %d outside the vocabulary of %d",
                                 r, (int)id, c->vocab_size);
            m->ids[n] = id;
            m->pos[n] = pos;
            m->slots[n] = s->pages[pos / ps] * ps + pos % ps;
        }
        for (int e = 0; e < s->n_embeds; e++) {
            const struct pd_model_embeds *em = &s->embeds[e];
            if (em->start < 0 || em->n < 1 || em->start > s->n_new - em->n || !em->rows)
                return pd_errorf(PD_EINVAL,
                                 "request %d: embedding rows %d .. %d outside its %d new tokens", r,
                                 em->start, em->start + em->n - 1, s->n_new);
        }
        if (m->mrope)
            plan_mrope(m, s, n - s->n_new);
        memcpy(m->page_table + np, s->pages, sizeof(int32_t) * (size_t)need);
        np += need;
        m->kv_len[r] = (int32_t)total;
    }
    m->tok_start[n_seqs] = n;
    m->page_start[n_seqs] = np;
    int n_out = all_logits ? n : n_seqs;
    if (n_out > m->opts.max_logit_rows)
        return pd_errorf(PD_ERANGE, "%d rows of logits asked, at most %d per step", n_out,
                         m->opts.max_logit_rows);
    for (int j = 0; j < n_out; j++)
        m->out_rows[j] = all_logits ? j : m->tok_start[j + 1] - 1;
    *p = (struct pd_batch_plan){
        .n_reqs = n_seqs,
        .n_tokens = n,
        .token_ids = m->ids,
        .positions = m->pos,
        .slots = m->slots,
        .req_tok_start = m->tok_start,
        .req_kv_len = m->kv_len,
        .req_page_start = m->page_start,
        .page_table = m->page_table,
        .n_out_rows = n_out,
        .out_rows = m->out_rows,
    };
    return PD_OK;
}

static int forward(struct pd_model *m, struct pd_kv_pool *kv, const struct pd_model_seq *seqs,
                   int n_seqs, bool all_logits, float *logits) {
    struct pd_batch_plan plan;
    int rc = plan_step(m, kv, seqs, n_seqs, all_logits, &plan);
    if (rc)
        return rc;
    struct pd_backend *be = m->be;
    if ((rc = pd_backend_set_batch(be, &plan)) != PD_OK)
        return rc;
    const struct pd_model_config *c = &m->cfg;
    int64_t n = plan.n_tokens, hid = c->hidden_size, hd = c->head_dim;
    int H = m->heads, KVH = m->kv_heads;
    float eps = (float)c->rms_norm_eps, scale = 1.0f / sqrtf((float)hd);
    const struct pd_kv_layout *L = &kv->layout;

    pd_backend_embed(be, &m->embed, m->x);
    for (int r = 0; r < n_seqs; r++) /* embeddings over placeholder tokens (images) */
        for (int e = 0; e < seqs[r].n_embeds; e++) {
            const struct pd_model_embeds *em = &seqs[r].embeds[e];
            if ((rc = pd_backend_upload(be, m->x + (m->tok_start[r] + em->start) * hid, em->rows,
                                        sizeof(float) * (size_t)(em->n * hid))) != PD_OK)
                return rc;
        }
    if (m->mrope && (rc = pd_backend_upload(be, m->angles, m->angles_h,
                                            sizeof(float) * (size_t)(n * (hd / 2)))) != PD_OK)
        return rc;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const struct layer_weights *w = &m->layers[l];
        pd_backend_rmsnorm(be, m->x, &w->attn_norm, n, (int)hid, eps, m->h);
        pd_backend_matmul(be, m->h, n, &w->wq, w->has_qkv_bias ? &w->bq : NULL, m->q);
        pd_backend_matmul(be, m->h, n, &w->wk, w->has_qkv_bias ? &w->bk : NULL, m->k);
        pd_backend_matmul(be, m->h, n, &w->wv, w->has_qkv_bias ? &w->bv : NULL, m->v);
        if (c->qk_norm) {
            pd_backend_rmsnorm(be, m->q, &w->q_norm, n * H, (int)hd, eps, m->q);
            pd_backend_rmsnorm(be, m->k, &w->k_norm, n * KVH, (int)hd, eps, m->k);
        }
        if (m->mrope) {
            pd_backend_rope_angles(be, m->q, n, H, (int)hd, m->angles);
            pd_backend_rope_angles(be, m->k, n, KVH, (int)hd, m->angles);
        } else {
            pd_backend_rope(be, m->q, H, (int)hd, m->inv_freq);
            pd_backend_rope(be, m->k, KVH, (int)hd, m->inv_freq);
        }
        pd_backend_kv_store(be, L, l, m->k, m->v);
        pd_backend_attention(be, L, l, m->q, H, scale, layer_window(m, l), m->att);
        pd_backend_matmul(be, m->att, n, &w->wo, w->has_o_bias ? &w->bo : NULL, m->h);
        if (m->tp && (rc = m->tp->all_reduce_sum(m->tp, be, m->h, (size_t)(n * hid))) != PD_OK)
            return pd_error_wrap(rc, "layer %d attention output", l);
        pd_backend_add(be, m->x, m->h, n * hid);
        pd_backend_rmsnorm(be, m->x, &w->mlp_norm, n, (int)hid, eps, m->h);
        pd_backend_matmul(be, m->h, n, &w->gate, NULL, m->g);
        pd_backend_matmul(be, m->h, n, &w->up, NULL, m->u);
        pd_backend_silu_mul(be, m->g, m->u, m->g, n * m->inter);
        pd_backend_matmul(be, m->g, n, &w->down, NULL, m->h);
        if (m->tp && (rc = m->tp->all_reduce_sum(m->tp, be, m->h, (size_t)(n * hid))) != PD_OK)
            return pd_error_wrap(rc, "layer %d mlp output", l);
        pd_backend_add(be, m->x, m->h, n * hid);
    }
    /* only the rows whose logits are wanted go through the final norm and the vocabulary */
    pd_backend_gather_out_rows(be, m->x, (int)hid, m->out);
    pd_backend_rmsnorm(be, m->out, &m->final_norm, plan.n_out_rows, (int)hid, eps, m->out);
    pd_backend_matmul(be, m->out, plan.n_out_rows, &m->lm_head, NULL, m->logits);
    if (!logits) /* the caller reads them on the device (pd_model_decode_greedy / _sample) */
        return PD_OK;
    return pd_backend_download(be, logits, m->logits,
                               sizeof(float) * (size_t)plan.n_out_rows * (size_t)c->vocab_size);
}

int pd_model_extend(struct pd_model *m, struct pd_kv_pool *kv, const struct pd_model_seq *seqs,
                    int n_seqs, bool all_logits, float *logits) {
    return forward(m, kv, seqs, n_seqs, all_logits, logits);
}

int pd_model_decode(struct pd_model *m, struct pd_kv_pool *kv, const struct pd_model_seq *seqs,
                    int n_seqs, float *logits) {
    for (int r = 0; r < n_seqs; r++)
        if (seqs[r].n_new != 1)
            return pd_errorf(PD_EINVAL, "decode: request %d has %d new tokens, must have 1", r,
                             seqs[r].n_new);
    return forward(m, kv, seqs, n_seqs, false, logits);
}

int pd_model_decode_greedy(struct pd_model *m, struct pd_kv_pool *kv,
                           const struct pd_model_seq *seqs, int n_seqs, int32_t *ids,
                           float *logprobs) {
    for (int r = 0; r < n_seqs; r++)
        if (seqs[r].n_new != 1)
            return pd_errorf(PD_EINVAL, "decode: request %d has %d new tokens, must have 1", r,
                             seqs[r].n_new);
    int rc = forward(m, kv, seqs, n_seqs, false, NULL);
    if (rc)
        return rc;
    return pd_backend_argmax(m->be, m->logits, n_seqs, m->cfg.vocab_size, ids, logprobs);
}

int pd_model_decode_sample(struct pd_model *m, struct pd_kv_pool *kv,
                           const struct pd_model_seq *seqs, int n_seqs,
                           const struct pd_sample_row *rows, int32_t *ids, float *logprobs) {
    for (int r = 0; r < n_seqs; r++)
        if (seqs[r].n_new != 1)
            return pd_errorf(PD_EINVAL, "decode: request %d has %d new tokens, must have 1", r,
                             seqs[r].n_new);
    int rc = forward(m, kv, seqs, n_seqs, false, NULL);
    if (rc)
        return rc;
    return pd_backend_sample(m->be, m->logits, n_seqs, m->cfg.vocab_size, rows, ids, logprobs);
}
