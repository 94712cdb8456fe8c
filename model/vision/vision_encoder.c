/*
 * vision_encoder.c — the Qwen2-VL / Qwen2.5-VL vision transformer over the backend interface,
 * op for op as transformers computes it (vision_encoder.h).
 *
 * Per image, the host plans: each patch's row and column in the image (the processor lays the
 * rows out merge window by merge window), their rotary angles (f32 position × f32 inverse
 * frequency, as torch), and for Qwen2.5-VL the window order: merge windows regrouped window by
 * window (transformers' get_vision_window_index), the pixel rows and the angles permuted into it
 * before the patch embedding, the merger's rows put back after. Segment bounds go up as int32
 * (one per frame for the full-attention blocks, one per window for the others); then the blocks
 * run on the device and one download brings the embeddings back.
 *
 * Buffers are taken at creation for opts.max_patches patches; the MLP's hidden rows are
 * processed MLP_ROWS at a time, so that widest buffer does not grow with the image.
 */
#include "model/vision/vision_encoder.h"

#include "common/base/alloc.h"
#include "common/base/status.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define MLP_ROWS 1024 /* patch rows per MLP pass */

struct block_weights {
    struct pd_tensor norm1_w, norm1_b, norm2_w, norm2_b; /* b: LayerNorm's (Qwen2-VL) */
    struct pd_tensor wq, wk, wv, bq, bk, bv, proj, proj_b;
    struct pd_tensor fc1, fc1_b, fc2, fc2_b;               /* Qwen2-VL */
    struct pd_tensor gate, gate_b, up, up_b, down, down_b; /* Qwen2.5-VL */
    bool full;                                             /* attends over the whole image */
};

struct pd_vision_encoder {
    struct pd_vision_config cfg;
    struct pd_backend *be;
    int max_patches, head_dim, row_len, merge_unit;
    struct pd_tensor patch_w;
    struct block_weights *blocks;
    struct pd_tensor ln_q_w, ln_q_b, mlp0, mlp0_b, mlp2, mlp2_b;
    /* device */
    float *pix;                     /* [max_patches][row_len] */
    float *ang;                     /* [max_patches][head_dim / 2] */
    int32_t *seg_full, *seg_win;    /* [max_patches + 1] */
    float *x, *h, *q, *k, *v, *att; /* [max_patches][embed_dim] */
    float *g, *u;                   /* [MLP_ROWS][mlp_dim] */
    float *m0;                      /* [max_patches / merge_unit][merge_unit · embed_dim] */
    float *out;                     /* [max_patches / merge_unit][out_dim] */
    /* host plan */
    float *h_pix, *h_ang, *h_out;
    int32_t *h_seg_full, *h_seg_win, *h_win_index; /* window index: [max_patches / merge_unit] */
    float *inv_freq;                               /* [head_dim / 4] */
};

/* ---- weights ---- */

/* The checkpoint's tensor prefix.name (Hub checkpoints write "visual.", a model transformers 5
 * holds in memory "model.visual."). */
static const struct pd_tensor_view *find(const struct pd_checkpoint *ck, const char *name) {
    char full[160];
    snprintf(full, sizeof(full), "visual.%s", name);
    const struct pd_tensor_view *t = pd_checkpoint_find(ck, full);
    if (t)
        return t;
    snprintf(full, sizeof(full), "model.visual.%s", name);
    return pd_checkpoint_find(ck, full);
}

/* name as a [rows][cols] backend weight (rows 1: a vector of cols); a tensor of more dimensions
 * must hold rows × cols values with rows its first dimension (the Conv3d kernel). */
static int get(struct pd_vision_encoder *e, const struct pd_checkpoint *ck, const char *name,
               int64_t rows, int64_t cols, struct pd_tensor *out) {
    const struct pd_tensor_view *t = find(ck, name);
    if (!t)
        return pd_errorf(PD_ENOENT, "tensor 'visual.%s' missing from the checkpoint", name);
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= t->shape[d];
    bool ok = rows == 1 ? t->ndim == 1 && t->shape[0] == cols
                        : t->ndim >= 2 && t->shape[0] == rows && n == rows * cols;
    if (!ok)
        return pd_errorf(PD_EFORMAT,
                         "tensor 'visual.%s' has %d dims (first %lld, %lld values), config "
                         "implies %lld x %lld",
                         name, t->ndim, (long long)t->shape[0], (long long)n, (long long)rows,
                         (long long)cols);
    if (t->dtype != PD_DTYPE_F32 && t->dtype != PD_DTYPE_BF16 && t->dtype != PD_DTYPE_F16)
        return pd_errorf(PD_EUNSUPPORTED, "tensor 'visual.%s' has dtype %d", name, (int)t->dtype);
    int rc = pd_backend_weight(e->be, t->dtype, rows, cols, t->data, out);
    return rc ? pd_error_wrap(rc, "tensor 'visual.%s'", name) : PD_OK;
}

/* Rows [r0, r0 + rows) of a [.][cols] tensor (or values of a vector) as a weight of its own:
 * q, k and v out of qkv. */
static int get_part(struct pd_vision_encoder *e, const struct pd_checkpoint *ck, const char *name,
                    int64_t all_rows, int64_t cols, int part, int parts, struct pd_tensor *out) {
    struct pd_tensor whole;
    int rc = get(e, ck, name, all_rows, cols, &whole);
    if (rc)
        return rc;
    const struct pd_tensor_view *t = find(ck, name);
    size_t es = pd_dtype_size(t->dtype);
    if (all_rows == 1) { /* a bias [parts · n] */
        int64_t n = cols / parts;
        return pd_backend_weight(e->be, t->dtype, 1, n,
                                 (const char *)t->data + (size_t)(part * n) * es, out);
    }
    int64_t n = all_rows / parts;
    return pd_backend_weight(e->be, t->dtype, n, cols,
                             (const char *)t->data + (size_t)(part * n * cols) * es, out);
}

static int load_weights(struct pd_vision_encoder *e, const struct pd_checkpoint *ck) {
    const struct pd_vision_config *c = &e->cfg;
    int64_t E = c->embed_dim, M = c->mlp_dim, H = (int64_t)E * e->merge_unit;
    bool v2 = c->family == PD_VISION_QWEN2_VL;
    char n[128];
    int rc;
#define GET(name_, rows_, cols_, dst_)                                                             \
    if ((rc = get(e, ck, name_, rows_, cols_, dst_)) != PD_OK)                                     \
    return rc
    GET("patch_embed.proj.weight", E, e->row_len, &e->patch_w);
    for (int l = 0; l < c->depth; l++) {
        struct block_weights *b = &e->blocks[l];
#define BGET(suffix_, rows_, cols_, dst_)                                                          \
    snprintf(n, sizeof(n), "blocks.%d.%s", l, suffix_);                                            \
    GET(n, rows_, cols_, dst_)
        BGET("norm1.weight", 1, E, &b->norm1_w);
        BGET("norm2.weight", 1, E, &b->norm2_w);
        if (v2) {
            BGET("norm1.bias", 1, E, &b->norm1_b);
            BGET("norm2.bias", 1, E, &b->norm2_b);
        }
        struct pd_tensor *qkv[] = {&b->wq, &b->wk, &b->wv}, *qkv_b[] = {&b->bq, &b->bk, &b->bv};
        for (int p = 0; p < 3; p++) {
            snprintf(n, sizeof(n), "blocks.%d.attn.qkv.weight", l);
            if ((rc = get_part(e, ck, n, 3 * E, E, p, 3, qkv[p])) != PD_OK)
                return rc;
            snprintf(n, sizeof(n), "blocks.%d.attn.qkv.bias", l);
            if ((rc = get_part(e, ck, n, 1, 3 * E, p, 3, qkv_b[p])) != PD_OK)
                return rc;
        }
        BGET("attn.proj.weight", E, E, &b->proj);
        BGET("attn.proj.bias", 1, E, &b->proj_b);
        if (v2) {
            BGET("mlp.fc1.weight", M, E, &b->fc1);
            BGET("mlp.fc1.bias", 1, M, &b->fc1_b);
            BGET("mlp.fc2.weight", E, M, &b->fc2);
            BGET("mlp.fc2.bias", 1, E, &b->fc2_b);
        } else {
            BGET("mlp.gate_proj.weight", M, E, &b->gate);
            BGET("mlp.gate_proj.bias", 1, M, &b->gate_b);
            BGET("mlp.up_proj.weight", M, E, &b->up);
            BGET("mlp.up_proj.bias", 1, M, &b->up_b);
            BGET("mlp.down_proj.weight", E, M, &b->down);
            BGET("mlp.down_proj.bias", 1, E, &b->down_b);
        }
#undef BGET
        b->full = v2;
        for (int i = 0; !v2 && i < c->n_fullatt; i++)
            b->full |= c->fullatt_block_indexes[i] == l;
    }
    GET("merger.ln_q.weight", 1, E, &e->ln_q_w);
    if (v2) {
        GET("merger.ln_q.bias", 1, E, &e->ln_q_b);
    }
    GET("merger.mlp.0.weight", H, H, &e->mlp0);
    GET("merger.mlp.0.bias", 1, H, &e->mlp0_b);
    GET("merger.mlp.2.weight", c->out_dim, H, &e->mlp2);
    GET("merger.mlp.2.bias", 1, c->out_dim, &e->mlp2_b);
#undef GET
    return PD_OK;
}

/* ---- creation ---- */

static int alloc_dev(struct pd_vision_encoder *e, size_t bytes, void *out) {
    return pd_backend_alloc(e->be, bytes, (void **)out);
}

int pd_vision_encoder_new(struct pd_backend *be, const struct pd_vision_config *cfg,
                          const struct pd_checkpoint *ck, const struct pd_vision_encoder_opts *opts,
                          struct pd_vision_encoder **out) {
    *out = NULL;
    if (!pd_backend_has_vision(be))
        return pd_errorf(PD_EUNSUPPORTED, "the %s backend has no vision encoder ops yet",
                         pd_backend_name(be));
    int unit = cfg->spatial_merge_size * cfg->spatial_merge_size;
    if (!opts || opts->max_patches < unit)
        return pd_errorf(PD_EINVAL, "vision encoder: max_patches %d (at least %d)",
                         opts ? opts->max_patches : 0, unit);
    struct pd_vision_encoder *e = pd_calloc(1, sizeof(*e));
    if (!e)
        return PD_ENOMEM;
    int rc;
    e->cfg = *cfg;
    e->be = be;
    e->max_patches = opts->max_patches / unit * unit;
    e->head_dim = cfg->embed_dim / cfg->num_heads;
    e->row_len = cfg->in_channels * cfg->temporal_patch_size * cfg->patch_size * cfg->patch_size;
    e->merge_unit = unit;
    if (!(e->blocks = pd_calloc((size_t)cfg->depth, sizeof(*e->blocks)))) {
        rc = PD_ENOMEM;
        goto fail;
    }
    if ((rc = load_weights(e, ck)) != PD_OK)
        goto fail;
    size_t P = (size_t)e->max_patches, E = (size_t)cfg->embed_dim, N = P / (size_t)unit;
    size_t half = (size_t)e->head_dim / 2, F = sizeof(float);
    size_t mlp_rows = P < MLP_ROWS ? P : MLP_ROWS;
    if ((rc = alloc_dev(e, P * (size_t)e->row_len * F, &e->pix)) ||
        (rc = alloc_dev(e, P * half * F, &e->ang)) ||
        (rc = alloc_dev(e, (P + 1) * sizeof(int32_t), &e->seg_full)) ||
        (rc = alloc_dev(e, (P + 1) * sizeof(int32_t), &e->seg_win)) ||
        (rc = alloc_dev(e, P * E * F, &e->x)) || (rc = alloc_dev(e, P * E * F, &e->h)) ||
        (rc = alloc_dev(e, P * E * F, &e->q)) || (rc = alloc_dev(e, P * E * F, &e->k)) ||
        (rc = alloc_dev(e, P * E * F, &e->v)) || (rc = alloc_dev(e, P * E * F, &e->att)) ||
        (rc = alloc_dev(e, mlp_rows * (size_t)cfg->mlp_dim * F, &e->g)) ||
        (rc = alloc_dev(e, mlp_rows * (size_t)cfg->mlp_dim * F, &e->u)) ||
        (rc = alloc_dev(e, P * E * F, &e->m0)) ||
        (rc = alloc_dev(e, N * (size_t)cfg->out_dim * F, &e->out)))
        goto fail;
    e->h_pix = pd_malloc(P * (size_t)e->row_len * F);
    e->h_ang = pd_malloc(P * half * F);
    e->h_out = pd_malloc(N * (size_t)cfg->out_dim * F);
    e->h_seg_full = pd_malloc((P + 1) * sizeof(int32_t));
    e->h_seg_win = pd_malloc((P + 1) * sizeof(int32_t));
    e->h_win_index = pd_malloc(N * sizeof(int32_t));
    e->inv_freq = pd_malloc(half / 2 * F);
    if (!e->h_pix || !e->h_ang || !e->h_out || !e->h_seg_full || !e->h_seg_win || !e->h_win_index ||
        !e->inv_freq) {
        rc = PD_ENOMEM;
        goto fail;
    }
    /* as torch: 1 / theta ** (arange(0, dim, 2) / dim) in f32, dim = head_dim / 2 */
    for (size_t i = 0; i < half / 2; i++)
        e->inv_freq[i] = 1.0f / powf((float)cfg->rope_theta, (float)(2 * i) / (float)half);
    int max_dim = e->row_len;
    int widths[] = {cfg->embed_dim, cfg->mlp_dim, cfg->embed_dim * unit};
    for (size_t i = 0; i < PD_ARRAY_LEN(widths); i++)
        max_dim = widths[i] > max_dim ? widths[i] : max_dim;
    struct pd_backend_limits lim = {
        .max_tokens = 1,
        .max_reqs = 1,
        .max_pages = 1,
        .max_context = 1,
        .max_heads = cfg->num_heads,
        .max_head_dim = e->head_dim,
        .max_dim = max_dim,
    };
    if ((rc = pd_backend_reserve(be, &lim)) != PD_OK)
        goto fail;
    *out = e;
    return PD_OK;
fail:
    pd_vision_encoder_free(e);
    return pd_error_wrap(rc, "building the vision encoder");
}

void pd_vision_encoder_free(struct pd_vision_encoder *e) {
    if (!e)
        return;
    void *dev[] = {e->pix, e->ang, e->seg_full, e->seg_win, e->x, e->h,  e->q,
                   e->k,   e->v,   e->att,      e->g,       e->u, e->m0, e->out};
    for (size_t i = 0; i < PD_ARRAY_LEN(dev); i++)
        pd_backend_release(e->be, dev[i]);
    pd_free(e->h_pix);
    pd_free(e->h_ang);
    pd_free(e->h_out);
    pd_free(e->h_seg_full);
    pd_free(e->h_seg_win);
    pd_free(e->h_win_index);
    pd_free(e->inv_freq);
    pd_free(e->blocks);
    pd_free(e);
}

const struct pd_vision_config *pd_vision_encoder_config(const struct pd_vision_encoder *e) {
    return &e->cfg;
}

int64_t pd_vision_tokens(const struct pd_vision_config *cfg, int grid_t, int grid_h, int grid_w) {
    int64_t unit = (int64_t)cfg->spatial_merge_size * cfg->spatial_merge_size;
    return (int64_t)grid_t * grid_h * grid_w / unit;
}

/* ---- the per-image plan (host) ---- */

/* Qwen2.5-VL's window order (transformers' get_vision_window_index for one image): the merge
 * windows of each frame in windows of vws × vws of them, window by window, each window's row by
 * row; win_index[i] is the merge window that goes i-th, seg the windows' bounds in patch rows.
 * Returns the number of windows. */
static int window_plan(const struct pd_vision_encoder *e, int gt, int gh, int gw,
                       int32_t *win_index, int32_t *seg) {
    const struct pd_vision_config *c = &e->cfg;
    int m = c->spatial_merge_size, vws = c->window_size / m / c->patch_size;
    int lh = gh / m, lw = gw / m, nwh = (lh + vws - 1) / vws, nww = (lw + vws - 1) / vws;
    int n = 0, nseg = 0;
    seg[0] = 0;
    for (int t = 0; t < gt; t++)
        for (int wh = 0; wh < nwh; wh++)
            for (int ww = 0; ww < nww; ww++) {
                int start = n;
                for (int r = wh * vws; r < (wh + 1) * vws && r < lh; r++)
                    for (int col = ww * vws; col < (ww + 1) * vws && col < lw; col++)
                        win_index[n++] = (t * lh + r) * lw + col;
                if (n > start) /* transformers drops empty windows (unique_consecutive) */
                    seg[++nseg] = n * e->merge_unit;
            }
    return nseg;
}

/* Angles of patch row r of a frame of gh × gw patches, laid out merge window by merge window:
 * head_dim / 4 frequencies of its row, then of its column. */
static void patch_angles(const struct pd_vision_encoder *e, int gw, int r, float *ang) {
    int m = e->cfg.spatial_merge_size, lw = gw / m, nf = e->head_dim / 4;
    int win = r / e->merge_unit, in = r % e->merge_unit;
    float row = (float)((win / lw) * m + in / m), col = (float)((win % lw) * m + in % m);
    for (int j = 0; j < nf; j++) {
        ang[j] = row * e->inv_freq[j];
        ang[nf + j] = col * e->inv_freq[j];
    }
}

/* ---- the forward pass ---- */

static void mlp(struct pd_vision_encoder *e, const struct block_weights *b, int n) {
    const struct pd_vision_config *c = &e->cfg;
    int64_t E = c->embed_dim, M = c->mlp_dim;
    for (int r0 = 0; r0 < n; r0 += MLP_ROWS) {
        int rows = n - r0 < MLP_ROWS ? n - r0 : MLP_ROWS;
        const float *in = e->h + r0 * E;
        float *o = e->att + r0 * E;
        if (c->family == PD_VISION_QWEN2_VL) {
            pd_backend_matmul(e->be, in, rows, &b->fc1, &b->fc1_b, e->g);
            pd_backend_act(e->be, c->act, e->g, e->g, rows * M);
            pd_backend_matmul(e->be, e->g, rows, &b->fc2, &b->fc2_b, o);
        } else {
            pd_backend_matmul(e->be, in, rows, &b->gate, &b->gate_b, e->g);
            pd_backend_matmul(e->be, in, rows, &b->up, &b->up_b, e->u);
            pd_backend_silu_mul(e->be, e->g, e->u, e->g, rows * M);
            pd_backend_matmul(e->be, e->g, rows, &b->down, &b->down_b, o);
        }
    }
}

static void norm(struct pd_vision_encoder *e, const struct pd_tensor *w, const struct pd_tensor *b,
                 int n, const float *x, float *out) {
    if (e->cfg.family == PD_VISION_QWEN2_VL)
        pd_backend_layernorm(e->be, x, w, b, n, e->cfg.embed_dim, 1e-6f, out);
    else
        pd_backend_rmsnorm(e->be, x, w, n, e->cfg.embed_dim, 1e-6f, out);
}

static void block(struct pd_vision_encoder *e, const struct block_weights *b, int n, int n_full,
                  int n_win) {
    struct pd_backend *be = e->be;
    int64_t E = e->cfg.embed_dim;
    int H = e->cfg.num_heads, hd = e->head_dim;
    norm(e, &b->norm1_w, &b->norm1_b, n, e->x, e->h);
    pd_backend_matmul(be, e->h, n, &b->wq, &b->bq, e->q);
    pd_backend_matmul(be, e->h, n, &b->wk, &b->bk, e->k);
    pd_backend_matmul(be, e->h, n, &b->wv, &b->bv, e->v);
    pd_backend_rope_angles(be, e->q, n, H, hd, e->ang);
    pd_backend_rope_angles(be, e->k, n, H, hd, e->ang);
    pd_backend_attention_segments(be, e->q, e->k, e->v, H, hd, b->full ? e->seg_full : e->seg_win,
                                  b->full ? n_full : n_win, 1.0f / sqrtf((float)hd), e->att);
    pd_backend_matmul(be, e->att, n, &b->proj, &b->proj_b, e->h);
    pd_backend_add(be, e->x, e->h, n * E);
    norm(e, &b->norm2_w, &b->norm2_b, n, e->x, e->h);
    mlp(e, b, n);
    pd_backend_add(be, e->x, e->att, n * E);
}

int pd_vision_encode(struct pd_vision_encoder *e, const struct pd_image_patches *img, float *out) {
    const struct pd_vision_config *c = &e->cfg;
    int m = c->spatial_merge_size, unit = e->merge_unit;
    if (img->row_len != e->row_len)
        return pd_errorf(PD_EINVAL, "image patches of %d values, the encoder takes %d",
                         img->row_len, e->row_len);
    if (img->grid_t < 1 || img->grid_h < m || img->grid_w < m || img->grid_h % m || img->grid_w % m)
        return pd_errorf(PD_EINVAL,
                         "image grid %d x %d x %d: height and width must be positive "
                         "multiples of the merge size %d",
                         img->grid_t, img->grid_h, img->grid_w, m);
    int64_t n64 = (int64_t)img->grid_t * img->grid_h * img->grid_w;
    if (n64 != img->n_rows || n64 > e->max_patches)
        return pd_errorf(PD_ERANGE, "image of %lld patches (grid %d x %d x %d), at most %d",
                         (long long)img->n_rows, img->grid_t, img->grid_h, img->grid_w,
                         e->max_patches);
    int n = (int)n64, frame = img->grid_h * img->grid_w, nm = n / unit;
    int half = e->head_dim / 2, row_bytes = e->row_len * (int)sizeof(float);
    int n_full = img->grid_t, n_win = 0;
    for (int t = 0; t <= img->grid_t; t++)
        e->h_seg_full[t] = t * frame;
    bool windows = c->family == PD_VISION_QWEN2_5_VL;
    if (windows)
        n_win = window_plan(e, img->grid_t, img->grid_h, img->grid_w, e->h_win_index, e->h_seg_win);
    /* pixel rows and their angles, in window order where there are windows */
    for (int i = 0; i < nm; i++) {
        int src = windows ? e->h_win_index[i] : i;
        memcpy(e->h_pix + (size_t)i * unit * e->row_len,
               img->pixel_values + (size_t)src * unit * e->row_len, (size_t)unit * row_bytes);
        for (int j = 0; j < unit; j++) {
            int r = src * unit + j;
            patch_angles(e, img->grid_w, r % frame, e->h_ang + ((size_t)i * unit + j) * half);
        }
    }
    struct pd_backend *be = e->be;
    int rc;
    if ((rc = pd_backend_upload(be, e->pix, e->h_pix, (size_t)n * row_bytes)) ||
        (rc = pd_backend_upload(be, e->ang, e->h_ang, (size_t)n * half * sizeof(float))) ||
        (rc = pd_backend_upload(be, e->seg_full, e->h_seg_full,
                                (size_t)(n_full + 1) * sizeof(int32_t))) ||
        (windows && (rc = pd_backend_upload(be, e->seg_win, e->h_seg_win,
                                            (size_t)(n_win + 1) * sizeof(int32_t)))))
        return pd_error_wrap(rc, "vision encoder: uploading an image");
    pd_backend_matmul(be, e->pix, n, &e->patch_w, NULL, e->x);
    for (int l = 0; l < c->depth; l++)
        block(e, &e->blocks[l], n, n_full, n_win);
    /* merger: the norm per patch, then each merge window's patches side by side as one row */
    if (c->family == PD_VISION_QWEN2_VL)
        pd_backend_layernorm(be, e->x, &e->ln_q_w, &e->ln_q_b, n, c->embed_dim, 1e-6f, e->h);
    else
        pd_backend_rmsnorm(be, e->x, &e->ln_q_w, n, c->embed_dim, 1e-6f, e->h);
    pd_backend_matmul(be, e->h, nm, &e->mlp0, &e->mlp0_b, e->m0);
    pd_backend_act(be, PD_ACT_GELU, e->m0, e->m0, (int64_t)nm * c->embed_dim * unit);
    pd_backend_matmul(be, e->m0, nm, &e->mlp2, &e->mlp2_b, e->out);
    size_t row = (size_t)c->out_dim * sizeof(float);
    if (!windows)
        return pd_backend_download(be, out, e->out, (size_t)nm * row);
    if ((rc = pd_backend_download(be, e->h_out, e->out, (size_t)nm * row)) != PD_OK)
        return rc;
    for (int i = 0; i < nm; i++) /* back to the image's order */
        memcpy(out + (size_t)e->h_win_index[i] * c->out_dim, e->h_out + (size_t)i * c->out_dim,
               row);
    return PD_OK;
}
