/*
 * backend_cpu.c — the cpu backend: "device" memory is host memory, the stream is the calling
 * thread (every op has finished when it returns), and work is split over a fixed thread pool.
 *
 * Matrix products take two routes: up to PD_CPU_GEMV_ROWS activation rows (decode) use our own
 * GEMV that reads bf16/f16 weights in place — decode is bound by weight bytes, so compact weights
 * are the speed-up; more rows (prefill) use our packed-panel GEMM on AVX-512 machines: each
 * thread widens 64 weight rows × 512 k values at a time into an L2-resident f32 panel that every
 * activation row then passes over, so weights are read and widened once per call and no f32 copy
 * of them exists. Without AVX-512 that route is OpenBLAS sgemm on blocks of weight rows widened
 * per block, one single-threaded sgemm per pool thread (OpenBLAS's own threads are switched off
 * so the two pools never fight over cores). On AMX machines bf16 weights take a third route:
 * bf16 tile products on activations cut into three exact bf16 parts (backend_cpu_kernels.c),
 * the threads first packing each chunk of up to PD_CPU_AMX_TOKENS activation rows together,
 * then each multiplying its own weight rows by all of them.
 * Where AVX2 runs (AVX-512 included) weight matrices are copied once, tiled (backend_cpu.h), so
 * that each thread's share of a product is one front-to-back stream; elsewhere, and for vectors,
 * weights alias the caller's host bytes (the checkpoint mapping).
 * Per-step metadata and all scratch are sized once by reserve; ops never allocate.
 */
#include "common/base/alloc.h"
#include "model/cpu/backend_cpu.h"
#include "model/backend_impl.h"
#include "model/sampling.h"
#include "common/base/status.h"

#include <cblas.h>
#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define PD_CPU_GEMV_ROWS 32      /* activation rows up to which the GEMV route is taken */
#define PD_CPU_GEMM_BLOCK 128    /* weight rows per sgemm block */
#define PD_CPU_INLINE_WORK 32768 /* elementwise ops smaller than this run on the caller alone */
#define PD_CPU_ATTN_RUN 16       /* keys per attention kernel call, at most one page's run */
#define PD_CPU_ATTN_TOKENS 4     /* prefill tokens per attention work item */
#define PD_CPU_SEG_Q 16          /* query rows per segment-attention work item (vision) */
#define PD_CPU_SEG_K 256         /* keys per online-softmax block of segment attention */

void openblas_set_num_threads(int num_threads); /* OpenBLAS extension, not in cblas.h */

struct cpu_backend {
    struct pd_backend base;
    struct pd__cpu_pool *pool;
    int nth;
    bool reserved;
    struct pd_backend_limits lim;
    /* current batch (copies of the plan's arrays) */
    int n_reqs, n_tokens, n_out_rows;
    int32_t *token_ids, *positions, *slots;  /* [max_tokens] */
    int32_t *tok_req;                        /* [max_tokens] request of each token row */
    int32_t *out_rows;                       /* [max_tokens] */
    int32_t *req_tok_start, *req_page_start; /* [max_reqs + 1] */
    int32_t *req_kv_len;                     /* [max_reqs] */
    int32_t *page_table;                     /* [max_pages] */
    float *scratch;                          /* [nth][scratch_floats] */
    float *amx_x; /* AMX: one chunk's packed activations (pd__cpu_amx_x_bytes(max_dim) + 64) */
    size_t scratch_floats; /* per thread */
    /* penalty slots (pd_backend_penalty_reserve): bit 31 prompt has the token, bits 0..30 its
     * output count; and the host sampler's working memory for sample, sized with them */
    int32_t *pen_state; /* [pen_slots][pen_vocab] */
    struct pd_sampling_scratch samp;
    bool samp_ok;
    void **tiled; /* the tiled weights' allocations */
    size_t n_tiled, cap_tiled;
};

#define CPU_LAYOUT_TILED 1 /* struct pd_tensor's layout of a tiled matrix */

static struct cpu_backend *cpu(struct pd_backend *be) {
    return (struct cpu_backend *)be;
}

static float *thread_scratch(struct cpu_backend *c, int tid) {
    return c->scratch + (size_t)tid * c->scratch_floats;
}

/* p rounded up to a 64-byte boundary (scratch sizes include 16 floats of slack for it) */
static float *align64(float *p) {
    return p + (64 - ((uintptr_t)p & 63)) / sizeof(float) % 16;
}

/* ---- memory ---- */

static int cpu_mem_info(struct pd_backend *be, size_t *total, size_t *avail) {
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    *total = pages > 0 && psz > 0 ? (size_t)pages * (size_t)psz : 0;
    *avail = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[128];
        unsigned long long kb;
        while (fgets(line, sizeof(line), f)) {
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
                *avail = (size_t)kb * 1024;
                break;
            }
        }
        fclose(f);
    }
    if (!*avail) {
        long av = sysconf(_SC_AVPHYS_PAGES);
        *avail = av > 0 && psz > 0 ? (size_t)av * (size_t)psz : 0;
    }
    if (!*total)
        return pd_errorf(PD_EIO, "reading the size of host memory");
    return PD_OK;
}

static int cpu_alloc(struct pd_backend *be, size_t bytes, void **out) {
    *out = pd_calloc(1, bytes);
    if (!*out)
        return pd_error_wrap(PD_ENOMEM, "cpu backend buffer of %zu bytes", bytes);
    return PD_OK;
}

static void cpu_release(struct pd_backend *be, void *p) {
    pd_free(p);
}

/* Huge pages asked for where the buffer spans aligned 2 MiB ranges (the kernel's usual THP mode
 * "madvise" gives them only to memory that asks: 512 times fewer faults and TLB entries), then
 * one write per page faults each in now. The pages are calloc's zero pages: writing 0 keeps the
 * contents. */
static void cpu_make_resident(struct pd_backend *be, void *p, size_t bytes) {
    const uintptr_t huge = (uintptr_t)2 << 20;
    uintptr_t lo = ((uintptr_t)p + huge - 1) & ~(huge - 1),
              hi = ((uintptr_t)p + bytes) & ~(huge - 1);
    if (hi > lo)
        (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE); /* a hint: fine without THP */
    volatile unsigned char *b = p;
    for (size_t off = 0; off < bytes; off += 4096)
        b[off] = 0;
    if (bytes)
        b[bytes - 1] = 0;
}

static void free_batch_arrays(struct cpu_backend *c) {
    pd_free(c->token_ids);
    pd_free(c->positions);
    pd_free(c->slots);
    pd_free(c->tok_req);
    pd_free(c->out_rows);
    pd_free(c->req_tok_start);
    pd_free(c->req_page_start);
    pd_free(c->req_kv_len);
    pd_free(c->page_table);
    pd_free(c->scratch);
    pd_free(c->amx_x);
    c->amx_x = NULL;
    c->token_ids = c->positions = c->slots = c->tok_req = c->out_rows = NULL;
    c->req_tok_start = c->req_page_start = c->req_kv_len = c->page_table = NULL;
    c->scratch = NULL;
    c->reserved = false;
}

/* Scratch floats one segment-attention work item takes (see seg_attn_fn). */
static size_t seg_attn_scratch(int hd) {
    return (size_t)PD_CPU_SEG_Q * (2 * (size_t)hd + PD_CPU_SEG_K + 2) +
           (size_t)hd * PD_CPU_ATTN_RUN + 32;
}

static int cpu_reserve(struct pd_backend *be, const struct pd_backend_limits *lim) {
    struct cpu_backend *c = cpu(be);
    free_batch_arrays(c);
    size_t nt = (size_t)lim->max_tokens, nr = (size_t)lim->max_reqs;
    /* attention: scores, queries and outputs of the query rows of one work item + a key run and
     * its transpose; matmul: one packed panel (or, for sgemm, one block of weight rows widened to
     * f32); rmsnorm: the widened weight; rope: cos and sin of one position */
    size_t att_rows = (size_t)PD_CPU_ATTN_TOKENS * (size_t)lim->max_heads;
    size_t att = att_rows * (size_t)lim->max_context + 2 * att_rows * (size_t)lim->max_head_dim +
                 2 * (size_t)PD_CPU_ATTN_RUN * (size_t)lim->max_head_dim + 16;
    size_t panel = (size_t)PD_CPU_GEMM_KC * PD_CPU_GEMM_NR + 16 /* + alignment */;
    size_t gemm = (size_t)PD_CPU_GEMM_BLOCK * (size_t)lim->max_dim;
    gemm = panel > gemm ? panel : gemm;
    if (pd__cpu_has_amx() && gemm < (size_t)PD_CPU_AMX_SCRATCH + 16)
        gemm = (size_t)PD_CPU_AMX_SCRATCH + 16;
    c->scratch_floats = att > gemm ? att : gemm;
    if (c->scratch_floats < seg_attn_scratch(lim->max_head_dim))
        c->scratch_floats = seg_attn_scratch(lim->max_head_dim);
    c->token_ids = pd_calloc(nt, sizeof(int32_t));
    c->positions = pd_calloc(nt, sizeof(int32_t));
    c->slots = pd_calloc(nt, sizeof(int32_t));
    c->tok_req = pd_calloc(nt, sizeof(int32_t));
    c->out_rows = pd_calloc(nt, sizeof(int32_t));
    c->req_tok_start = pd_calloc(nr + 1, sizeof(int32_t));
    c->req_page_start = pd_calloc(nr + 1, sizeof(int32_t));
    c->req_kv_len = pd_calloc(nr, sizeof(int32_t));
    c->page_table = pd_calloc((size_t)lim->max_pages, sizeof(int32_t));
    c->scratch = pd_calloc((size_t)c->nth, c->scratch_floats * sizeof(float));
    if (pd__cpu_has_amx())
        c->amx_x = pd_malloc(pd__cpu_amx_x_bytes(lim->max_dim) + 64);
    if (!c->token_ids || !c->positions || !c->slots || !c->tok_req || !c->out_rows ||
        !c->req_tok_start || !c->req_page_start || !c->req_kv_len || !c->page_table ||
        !c->scratch || (pd__cpu_has_amx() && !c->amx_x)) {
        free_batch_arrays(c);
        return pd_error_wrap(PD_ENOMEM, "reserving cpu backend step buffers");
    }
    c->lim = *lim;
    c->reserved = true;
    return PD_OK;
}

struct tile_task {
    enum pd_dtype dtype;
    int64_t rows, cols;
    const void *src;
    void *dst;
};

/* Each thread tiles whole tiles of the matrix (the copy at load runs on every core). */
static void tile_task_fn(void *ctx, int tid, int nth) {
    struct tile_task *t = ctx;
    int64_t i0, i1;
    pd__cpu_split((t->rows + PD_CPU_TILE_ROWS - 1) / PD_CPU_TILE_ROWS, tid, nth, &i0, &i1);
    pd__cpu_tile(t->dtype, t->rows, t->cols, t->src, t->dst, i0 * PD_CPU_TILE_ROWS,
                 i1 * PD_CPU_TILE_ROWS);
}

static int cpu_weight(struct pd_backend *be, enum pd_dtype dtype, int64_t rows, int64_t cols,
                      const void *host, struct pd_tensor *out) {
    struct cpu_backend *c = cpu(be);
    *out = (struct pd_tensor){dtype, rows, cols, host, 0};
    if (rows < 2 || !pd__cpu_tiles_weights())
        return PD_OK; /* a vector, or kernels that read row-major weights */
    if (pd_array_grow((void **)&c->tiled, &c->cap_tiled, c->n_tiled + 1, sizeof(void *)))
        return pd_error_wrap(PD_ENOMEM, "cpu backend: list of tiled weights");
    size_t bytes = pd__cpu_tiled_bytes(dtype, rows, cols);
    void *raw = pd_malloc(bytes + 63);
    if (!raw)
        return pd_error_wrap(PD_ENOMEM, "cpu backend: tiled weight [%lld, %lld] of %zu bytes",
                             (long long)rows, (long long)cols, bytes);
    c->tiled[c->n_tiled++] = raw;
    struct tile_task t = {dtype, rows, cols, host,
                          (void *)(((uintptr_t)raw + 63) & ~(uintptr_t)63)};
    pd__cpu_pool_run(c->pool, tile_task_fn, &t);
    out->data = t.dst;
    out->layout = CPU_LAYOUT_TILED;
    return PD_OK;
}

static int cpu_copy(struct pd_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes)
        memcpy(dst, src, bytes);
    return PD_OK;
}

static int cpu_sync(struct pd_backend *be) {
    return PD_OK;
}

/* ---- batch ---- */

static int cpu_set_batch(struct pd_backend *be, const struct pd_batch_plan *p) {
    struct cpu_backend *c = cpu(be);
    if (!c->reserved)
        return pd_errorf(PD_EINVAL, "cpu backend: set_batch before reserve");
    int rc = pd__batch_plan_check(p, &c->lim);
    if (rc)
        return rc;
    for (int r = 0; r < p->n_reqs; r++)
        for (int i = p->req_tok_start[r]; i < p->req_tok_start[r + 1]; i++)
            c->tok_req[i] = r;
    int n_pages = p->req_page_start[p->n_reqs];
    size_t nt = (size_t)p->n_tokens * sizeof(int32_t);
    memcpy(c->token_ids, p->token_ids, nt);
    memcpy(c->positions, p->positions, nt);
    memcpy(c->slots, p->slots, nt);
    if (p->n_out_rows)
        memcpy(c->out_rows, p->out_rows, (size_t)p->n_out_rows * sizeof(int32_t));
    memcpy(c->req_tok_start, p->req_tok_start, ((size_t)p->n_reqs + 1) * sizeof(int32_t));
    memcpy(c->req_page_start, p->req_page_start, ((size_t)p->n_reqs + 1) * sizeof(int32_t));
    memcpy(c->req_kv_len, p->req_kv_len, (size_t)p->n_reqs * sizeof(int32_t));
    memcpy(c->page_table, p->page_table, (size_t)n_pages * sizeof(int32_t));
    c->n_reqs = p->n_reqs;
    c->n_tokens = p->n_tokens;
    c->n_out_rows = p->n_out_rows;
    return PD_OK;
}

/* ---- elementwise and row ops ---- */

struct rows_task {
    struct cpu_backend *c;
    const float *x, *y;
    float *out;
    const struct pd_tensor *w, *b;
    const float *inv_freq;
    int64_t rows, count;
    int dim, heads;
    float eps;
    enum pd_act act;
};

/* Row tasks below split rows (or values) over threads; small ones stay on the caller. */
static void run_rows(struct cpu_backend *c, pd__cpu_task fn, struct rows_task *t, int64_t work) {
    if (work < PD_CPU_INLINE_WORK || c->nth == 1)
        fn(t, 0, 1);
    else
        pd__cpu_pool_run(c->pool, fn, t);
}

static void embed_task(void *ctx, int tid, int nth) {
    struct rows_task *t = ctx;
    int64_t i0, i1;
    pd__cpu_split(t->rows, tid, nth, &i0, &i1);
    int64_t d = t->w->cols;
    for (int64_t i = i0; i < i1; i++) {
        int64_t id = t->c->token_ids[i];
        PD_ASSERT(id >= 0 && id < t->w->rows);
        if (t->w->layout == CPU_LAYOUT_TILED) {
            pd__cpu_tiled_row_to_f32(t->w->dtype, t->w->data, d, id, t->out + i * d);
            continue;
        }
        pd__cpu_to_f32(t->w->dtype,
                       (const char *)t->w->data + (size_t)(id * d) * pd_dtype_size(t->w->dtype),
                       t->out + i * d, d);
    }
}

static void cpu_embed(struct pd_backend *be, const struct pd_tensor *table, float *out) {
    struct cpu_backend *c = cpu(be);
    struct rows_task t = {.c = c, .w = table, .out = out, .rows = c->n_tokens};
    run_rows(c, embed_task, &t, c->n_tokens * table->cols);
}

/* As transformers' LlamaRMSNorm: mean of squares in f32, x * rsqrt(var + eps), then * weight. */
static void rmsnorm_task(void *ctx, int tid, int nth) {
    struct rows_task *t = ctx;
    int64_t i0, i1;
    pd__cpu_split(t->rows, tid, nth, &i0, &i1);
    float *wf = thread_scratch(t->c, tid); /* [dim] widened weight */
    pd__cpu_to_f32(t->w->dtype, t->w->data, wf, t->dim);
    for (int64_t i = i0; i < i1; i++) {
        const float *x = t->x + i * t->dim;
        float *o = t->out + i * t->dim;
        float ss = pd__cpu_dot(x, x, t->dim);
        float r = 1.0f / sqrtf(ss / (float)t->dim + t->eps);
        for (int d = 0; d < t->dim; d++)
            o[d] = wf[d] * (x[d] * r);
    }
}

static void cpu_rmsnorm(struct pd_backend *be, const float *x, const struct pd_tensor *w,
                        int64_t rows, int dim, float eps, float *out) {
    struct cpu_backend *c = cpu(be);
    PD_ASSERT((size_t)dim <= c->scratch_floats);
    struct rows_task t = {.c = c, .x = x, .w = w, .out = out, .rows = rows, .dim = dim, .eps = eps};
    run_rows(c, rmsnorm_task, &t, rows * dim);
}

/* The heads of one row turned by the angles whose cos and sin are cs, sn [dim / 2]. */
static void rotate_heads(float *row, int heads, int dim, const float *cs, const float *sn) {
    int half = dim / 2;
    for (int h = 0; h < heads; h++) {
        float *x = row + h * dim;
        for (int d = 0; d < half; d++) {
            float x0 = x[d], x1 = x[d + half];
            x[d] = x0 * cs[d] - x1 * sn[d];
            x[d + half] = x1 * cs[d] + x0 * sn[d];
        }
    }
}

/* Half-split rotary embedding as transformers' apply_rotary_pos_emb: angle = pos * inv_freq in
 * f32, x[d] * cos - x[d + h] * sin and x[d + h] * cos + x[d] * sin. */
static void rope_task(void *ctx, int tid, int nth) {
    struct rows_task *t = ctx;
    int64_t i0, i1;
    pd__cpu_split(t->rows, tid, nth, &i0, &i1);
    int half = t->dim / 2;
    float *cs = thread_scratch(t->c, tid), *sn = cs + half;
    for (int64_t i = i0; i < i1; i++) {
        float pos = (float)t->c->positions[i];
        for (int d = 0; d < half; d++) {
            float a = pos * t->inv_freq[d];
            cs[d] = cosf(a);
            sn[d] = sinf(a);
        }
        rotate_heads(t->out + i * t->heads * t->dim, t->heads, t->dim, cs, sn);
    }
}

static void cpu_rope(struct pd_backend *be, float *x, int heads, int head_dim,
                     const float *inv_freq) {
    struct cpu_backend *c = cpu(be);
    struct rows_task t = {.c = c,
                          .out = x,
                          .inv_freq = inv_freq,
                          .rows = c->n_tokens,
                          .dim = head_dim,
                          .heads = heads};
    run_rows(c, rope_task, &t, (int64_t)c->n_tokens * heads * head_dim);
}

static void silu_mul_task(void *ctx, int tid, int nth) {
    struct rows_task *t = ctx;
    int64_t i0, i1;
    pd__cpu_split(t->count, tid, nth, &i0, &i1);
    pd__cpu_silu_mul(t->x + i0, t->y + i0, t->out + i0, i1 - i0);
}

static void cpu_silu_mul(struct pd_backend *be, const float *gate, const float *up, float *out,
                         int64_t count) {
    struct cpu_backend *c = cpu(be);
    struct rows_task t = {.c = c, .x = gate, .y = up, .out = out, .count = count};
    run_rows(c, silu_mul_task, &t, count);
}

static void add_task(void *ctx, int tid, int nth) {
    struct rows_task *t = ctx;
    int64_t i0, i1;
    pd__cpu_split(t->count, tid, nth, &i0, &i1);
    for (int64_t i = i0; i < i1; i++)
        t->out[i] += t->y[i];
}

static void cpu_add(struct pd_backend *be, float *x, const float *y, int64_t count) {
    struct cpu_backend *c = cpu(be);
    struct rows_task t = {.c = c, .y = y, .out = x, .count = count};
    run_rows(c, add_task, &t, count);
}

static void cpu_gather_out_rows(struct pd_backend *be, const float *src, int width, float *dst) {
    struct cpu_backend *c = cpu(be);
    for (int j = 0; j < c->n_out_rows; j++)
        memmove(dst + (size_t)j * (size_t)width, src + (size_t)c->out_rows[j] * (size_t)width,
                (size_t)width * sizeof(float));
}

/* The host sampler's greedy choice and logprob, computed the same way (model/sampling.c), so
 * the fast path gives the same tokens and logprobs on this backend. */
static int cpu_argmax(struct pd_backend *be, const float *x, int rows, int cols, int32_t *ids,
                      float *logprobs) {
    (void)be;
    for (int r = 0; r < rows; r++) {
        const float *l = x + (size_t)r * (size_t)cols;
        int32_t b = 0;
        float mx = -INFINITY;
        for (int t = 0; t < cols; t++) {
            mx = l[t] > mx ? l[t] : mx;
            if (l[t] > l[b])
                b = t;
        }
        double sum = 0;
        for (int t = 0; t < cols; t++)
            sum += exp((double)(l[t] - mx));
        ids[r] = b;
        logprobs[r] = l[b] - (mx + (float)log(sum));
    }
    return PD_OK;
}

/* The host sampler's own steps on each row, in pd_sampler_next's order: the raw row's
 * log-softmax normaliser and top-n (pd_sampling_logprobs), the penalties from the row's slot
 * (pd_sampling_penalize) on a copy, the choice (pd_sampling_choose), and the chosen token
 * counted in the slot. This backend is the reference the device sampler is tested against.
 * Working memory comes from pd_backend_penalty_reserve when it covers cols, else per call. */
static int cpu_sample(struct pd_backend *be, const float *x, int rows, int cols,
                      const struct pd_sample_row *row, int32_t *ids, float *logprobs) {
    struct cpu_backend *c = cpu(be);
    struct pd_sampling_scratch own, *sc = &c->samp;
    if (!c->samp_ok || c->samp.vocab < cols) {
        int rc = pd_sampling_scratch_init(&own, cols);
        if (rc)
            return rc;
        sc = &own;
    }
    for (int r = 0; r < rows; r++) {
        const struct pd_sample_row *p = &row[r];
        const float *l = x + (size_t)r * (size_t)cols;
        int n_top = p->n_logprobs < cols ? p->n_logprobs : cols;
        struct pd_sample *top = n_top ? p->top : NULL;
        float lse = pd_sampling_logprobs(sc, l, cols, n_top, top ? top->top_ids : NULL,
                                         top ? top->top_logprobs : NULL);
        if (top)
            top->n_top = n_top;
        memcpy(sc->raw, l, sizeof(float) * (size_t)cols);
        int32_t *st = p->penalized ? c->pen_state + (size_t)p->slot * (size_t)cols : NULL;
        if (st)
            for (int t = 0; t < cols; t++)
                sc->raw[t] = pd_sampling_penalize(sc->raw[t], st[t] & 0x7fffffff, st[t] < 0,
                                                  p->repetition_penalty, p->frequency_penalty,
                                                  p->presence_penalty);
        int32_t tok = pd_sampling_choose(p, sc, sc->raw, cols);
        if (st)
            st[tok]++;
        ids[r] = tok;
        logprobs[r] = l[tok] - lse;
    }
    if (sc == &own)
        pd_sampling_scratch_free(&own);
    return PD_OK;
}

static int cpu_penalty_reserve(struct pd_backend *be, int slots, int vocab, int max_ids) {
    struct cpu_backend *c = cpu(be);
    (void)max_ids; /* ids are read in place */
    c->pen_state = pd_calloc((size_t)slots * (size_t)vocab, sizeof(int32_t));
    if (!c->pen_state)
        return PD_ENOMEM;
    int rc = pd_sampling_scratch_init(&c->samp, vocab);
    if (rc) {
        pd_free(c->pen_state);
        c->pen_state = NULL;
        return rc;
    }
    c->samp_ok = true;
    return PD_OK;
}

static int cpu_penalty_set(struct pd_backend *be, int slot, const int32_t *prompt, int n_prompt,
                           const int32_t *out, int n_out) {
    struct cpu_backend *c = cpu(be);
    int V = be->pen_vocab;
    int32_t *st = c->pen_state + (size_t)slot * (size_t)V;
    memset(st, 0, sizeof(int32_t) * (size_t)V);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] >= 0 && prompt[i] < V)
            st[prompt[i]] |= INT32_MIN;
    for (int i = 0; i < n_out; i++)
        if (out[i] >= 0 && out[i] < V)
            st[out[i]]++;
    return PD_OK;
}

/* ---- matmul ---- */

struct matmul_task {
    struct cpu_backend *c;
    const float *x;
    int64_t rows, m, k;
    const struct pd_tensor *w, *bias;
    float *y;
    int64_t block; /* sgemm: weight rows per block; panels: runs the x rows are split in */
};

static void add_bias(const struct matmul_task *t, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    if (!t->bias)
        return;
    float b[256]; /* the bias widened once per run of columns, then added row by row */
    size_t esz = pd_dtype_size(t->bias->dtype);
    for (int64_t jb = j0; jb < j1; jb += (int64_t)PD_ARRAY_LEN(b)) {
        int64_t n = j1 - jb < (int64_t)PD_ARRAY_LEN(b) ? j1 - jb : (int64_t)PD_ARRAY_LEN(b);
        pd__cpu_to_f32(t->bias->dtype, (const char *)t->bias->data + (size_t)jb * esz, b, n);
        for (int64_t i = i0; i < i1; i++) {
            float *y = t->y + i * t->m + jb;
            for (int64_t j = 0; j < n; j++)
                y[j] += b[j];
        }
    }
}

static void gemv_task(void *ctx, int tid, int nth) {
    struct matmul_task *t = ctx;
    bool tiled = t->w->layout == CPU_LAYOUT_TILED;
    int64_t j0, j1, unit = tiled ? PD_CPU_TILE_ROWS : 1; /* a thread's rows: whole tiles */
    pd__cpu_split((t->m + unit - 1) / unit, tid, nth, &j0, &j1);
    j0 *= unit;
    j1 = j1 * unit < t->m ? j1 * unit : t->m;
    if (j0 >= j1)
        return;
    pd__cpu_gemv(t->w->dtype, t->w->data, tiled, t->k, t->x, (int)t->rows, t->y, t->m, j0, j1);
    add_bias(t, 0, t->rows, j0, j1);
}

static void gemm_task(void *ctx, int tid, int nth) {
    struct matmul_task *t = ctx;
    int64_t nblk = (t->m + t->block - 1) / t->block, b0, b1;
    pd__cpu_split(nblk, tid, nth, &b0, &b1);
    size_t esz = pd_dtype_size(t->w->dtype);
    float *wf = thread_scratch(t->c, tid); /* [block][k] widened weight rows */
    for (int64_t b = b0; b < b1; b++) {
        int64_t j0 = b * t->block, j1 = j0 + t->block < t->m ? j0 + t->block : t->m;
        const float *wb = wf;
        if (t->w->layout == CPU_LAYOUT_TILED) {
            for (int64_t j = j0; j < j1; j++)
                pd__cpu_tiled_row_to_f32(t->w->dtype, t->w->data, t->k, j, wf + (j - j0) * t->k);
        } else {
            /* row-major: rows j0..j1-1 are contiguous */
            const void *wsrc = (const char *)t->w->data + (size_t)(j0 * t->k) * esz;
            if (t->w->dtype == PD_DTYPE_F32)
                wb = wsrc;
            else
                pd__cpu_to_f32(t->w->dtype, wsrc, wf, (j1 - j0) * t->k);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)t->rows, (int)(j1 - j0),
                    (int)t->k, 1.0f, t->x, (int)t->k, wb, (int)t->k, 0.0f, t->y + j0, (int)t->m);
        add_bias(t, 0, t->rows, j0, j1);
    }
}

/* Work items are (panel of PD_CPU_GEMM_NR weight rows, run of x rows); a thread's items are
 * consecutive, so it reuses each packed panel for its whole run of rows. */
static void panel_task(void *ctx, int tid, int nth) {
    struct matmul_task *t = ctx;
    int64_t npan = (t->m + PD_CPU_GEMM_NR - 1) / PD_CPU_GEMM_NR, nrun = t->block, it0, it1;
    pd__cpu_split(npan * nrun, tid, nth, &it0, &it1);
    float *panel = thread_scratch(t->c, tid);
    panel = align64(panel);
    for (int64_t it = it0; it < it1; it++) {
        int64_t p = it / nrun, i0, i1;
        pd__cpu_split(t->rows, (int)(it % nrun), (int)nrun, &i0, &i1);
        int64_t j0 = p * PD_CPU_GEMM_NR,
                j1 = j0 + PD_CPU_GEMM_NR < t->m ? j0 + PD_CPU_GEMM_NR : t->m;
        pd__cpu_gemm_panel(t->w->dtype, t->w->data, t->k, t->x + i0 * t->k, i1 - i0,
                           t->y + i0 * t->m, t->m, j0, j1, panel);
        add_bias(t, i0, i1, j0, j1);
    }
}

/* AMX: the threads pack the chunk's activation tiles, then each multiplies its weight rows (in
 * units of 32) by all of them. t->x, t->y and t->rows are the chunk's. */
static void amx_pack_task(void *ctx, int tid, int nth) {
    struct matmul_task *t = ctx;
    int64_t tt0, tt1;
    pd__cpu_split((t->rows + 15) / 16, tid, nth, &tt0, &tt1);
    if (tt0 < tt1)
        pd__cpu_amx_pack_x(t->x, t->rows, t->k, tt0, tt1, align64(t->c->amx_x));
}

static void amx_task(void *ctx, int tid, int nth) {
    struct matmul_task *t = ctx;
    int64_t j0, j1;
    pd__cpu_split((t->m + 31) / 32, tid, nth, &j0, &j1);
    j0 *= 32;
    j1 = j1 * 32 < t->m ? j1 * 32 : t->m;
    if (j0 >= j1)
        return;
    pd__cpu_amx_gemm(t->w->data, t->m, t->k, align64(t->c->amx_x), t->rows, t->y, t->m, j0, j1,
                     align64(thread_scratch(t->c, tid)));
    add_bias(t, 0, t->rows, j0, j1);
}

static void cpu_matmul(struct pd_backend *be, const float *x, int64_t rows,
                       const struct pd_tensor *w, const struct pd_tensor *bias, float *y) {
    struct cpu_backend *c = cpu(be);
    PD_ASSERT(w->cols <= c->lim.max_dim);
    struct matmul_task t = {c, x, rows, w->rows, w->cols, w, bias, y, PD_CPU_GEMM_BLOCK};
    if (rows <= PD_CPU_GEMV_ROWS) {
        pd__cpu_pool_run(c->pool, gemv_task, &t);
        return;
    }
    if (w->layout == CPU_LAYOUT_TILED && w->dtype == PD_DTYPE_BF16 && pd__cpu_has_amx()) {
        for (int64_t i0 = 0; i0 < rows; i0 += PD_CPU_AMX_TOKENS) {
            t.x = x + i0 * t.k;
            t.y = y + i0 * t.m;
            t.rows = rows - i0 < PD_CPU_AMX_TOKENS ? rows - i0 : PD_CPU_AMX_TOKENS;
            pd__cpu_pool_run(c->pool, amx_pack_task, &t);
            pd__cpu_pool_run(c->pool, amx_task, &t);
        }
        return;
    }
    if (w->layout == CPU_LAYOUT_TILED && pd__cpu_has_gemm_panel()) {
        /* split the rows too only when there are fewer panels than threads */
        int64_t npan = (t.m + PD_CPU_GEMM_NR - 1) / PD_CPU_GEMM_NR;
        t.block = npan >= c->nth ? 1 : (c->nth + npan - 1) / npan;
        pd__cpu_pool_run(c->pool, panel_task, &t);
        return;
    }
    /* blocks small enough that every thread gets work, large enough for sgemm to be efficient */
    int64_t per = (t.m + c->nth - 1) / c->nth;
    if (per < t.block)
        t.block = per < 16 ? 16 : (per + 15) / 16 * 16;
    pd__cpu_pool_run(c->pool, gemm_task, &t);
}

/* ---- KV cache ---- */

static char *kv_row(const struct pd_kv_layout *kv, int layer, int which, int32_t page, int off) {
    size_t esz = pd_dtype_size(kv->dtype);
    size_t plane = (size_t)kv->page_size * (size_t)kv->kv_heads * (size_t)kv->head_dim * esz;
    return (char *)kv->base + (size_t)page * kv->page_bytes + ((size_t)layer * 2 + which) * plane +
           (size_t)off * (size_t)kv->kv_heads * (size_t)kv->head_dim * esz;
}

static void cpu_kv_store(struct pd_backend *be, const struct pd_kv_layout *kv, int layer,
                         const float *k, const float *v) {
    struct cpu_backend *c = cpu(be);
    int width = kv->kv_heads * kv->head_dim;
    for (int i = 0; i < c->n_tokens; i++) {
        int32_t slot = c->slots[i], page = slot / kv->page_size, off = slot % kv->page_size;
        PD_ASSERT(slot >= 0 && page < kv->n_pages);
        pd_dtype_from_f32(kv->dtype, k + (size_t)i * width, kv_row(kv, layer, 0, page, off), width);
        pd_dtype_from_f32(kv->dtype, v + (size_t)i * width, kv_row(kv, layer, 1, page, off), width);
    }
}

struct attn_task {
    struct cpu_backend *c;
    const struct pd_kv_layout *kv;
    int layer, heads, tq; /* tq: tokens per work item */
    int window;           /* keys a query sees, itself included; 0 = all (causal only) */
    float scale;
    const float *q;
    float *out;
};

/* K or V rows j0..j0+nk-1 of kv head h (all within one page) as f32: in place when the cache is
 * f32, else widened into buf [nk][hd]. *ld is the row stride of the result. */
static const float *kv_run(const struct attn_task *t, int which, const int32_t *pages, int h,
                           int j0, int nk, float *buf, int64_t *ld) {
    const struct pd_kv_layout *kv = t->kv;
    int hd = kv->head_dim;
    size_t esz = pd_dtype_size(kv->dtype), stride = (size_t)kv->kv_heads * (size_t)hd;
    const char *r = kv_row(kv, t->layer, which, pages[j0 / kv->page_size], j0 % kv->page_size) +
                    (size_t)h * (size_t)hd * esz;
    if (kv->dtype == PD_DTYPE_F32) {
        *ld = (int64_t)stride;
        return (const float *)r;
    }
    for (int j = 0; j < nk; j++)
        pd__cpu_to_f32(kv->dtype, r + (size_t)j * stride * esz, buf + (size_t)j * hd, hd);
    *ld = hd;
    return buf;
}

/* One work item = one block of up to tq tokens × one kv head: the kv head's `group` query heads,
 * for every token of the block, share each K and V run read (and its transposed copy), which is
 * what makes GQA and prefill cheap on memory. A block spanning two requests is done as two
 * pieces. Keys go by runs of contiguous rows within a page. Scores are kept whole per row
 * (two-pass softmax, as the reference computes it), in per-thread scratch; rows of earlier
 * tokens zero the scores of keys only later tokens see. With a sliding window the block reads
 * keys from its first token's window start on, and each row also zeroes the keys that fell out
 * of its own window (scores are indexed by absolute key position). */
static void attn_task_fn(void *ctx, int tid, int nth) {
    struct attn_task *t = ctx;
    struct cpu_backend *c = t->c;
    const struct pd_kv_layout *kv = t->kv;
    int hd = kv->head_dim, kvh = kv->kv_heads, group = t->heads / kvh, ps = kv->page_size;
    int tq = t->tq, rows = tq * group;
    int64_t items = (c->n_tokens + tq - 1) / tq * kvh, lds = c->lim.max_context;
    float *sc = thread_scratch(c, tid);                  /* [rows][max_context] */
    float *qb = sc + (size_t)rows * (size_t)lds;         /* [rows][hd] the block's queries */
    float *ob = qb + (size_t)rows * (size_t)hd;          /* [rows][hd] its outputs */
    float *kt = align64(ob + (size_t)rows * (size_t)hd); /* [hd][PD_CPU_ATTN_RUN] */
    float *buf = kt + (size_t)hd * PD_CPU_ATTN_RUN;      /* [PD_CPU_ATTN_RUN][hd] */
    /* items dealt round-robin: a causal prefill's later tokens have more keys, so contiguous
     * runs would leave the first threads idle */
    for (int64_t w = tid; w < items; w += nth) {
        int h = (int)(w % kvh), i_end = (int)(w / kvh + 1) * tq;
        i_end = i_end < c->n_tokens ? i_end : c->n_tokens;
        for (int i0 = (int)(w / kvh) * tq, i1; i0 < i_end; i0 = i1) {
            int r = c->tok_req[i0];
            i1 = c->req_tok_start[r + 1] < i_end ? c->req_tok_start[r + 1] : i_end;
            int n = i1 - i0, nq = n * group;
            int n_new = c->req_tok_start[r + 1] - c->req_tok_start[r];
            int pos0 = c->req_kv_len[r] - n_new + (i0 - c->req_tok_start[r]);
            int len = pos0 + n; /* causal: the block's last token sees keys 0..pos0+n-1 */
            int lo = t->window > 0 && pos0 + 1 > t->window ? pos0 + 1 - t->window : 0;
            const int32_t *pages = c->page_table + c->req_page_start[r];
            for (int ti = 0; ti < n; ti++)
                memcpy(qb + (size_t)ti * group * hd,
                       t->q + ((size_t)(i0 + ti) * t->heads + (size_t)h * group) * hd,
                       (size_t)group * (size_t)hd * sizeof(float));
            for (int j = lo, nk; j < len; j += nk) {
                nk = ps - j % ps < len - j ? ps - j % ps : len - j;
                nk = nk < PD_CPU_ATTN_RUN ? nk : PD_CPU_ATTN_RUN;
                int64_t ld;
                const float *kr = kv_run(t, 0, pages, h, j, nk, buf, &ld);
                pd__cpu_attn_scores(qb, nq, hd, kr, ld, nk, t->scale, sc + j, lds, kt);
            }
            for (int q = 0; q < nq; q++) {
                int own = pos0 + q / group + 1; /* keys this row's token sees: first..own-1 */
                int first = t->window > 0 && own > t->window ? own - t->window : 0;
                float *s = sc + (size_t)q * lds;
                pd__cpu_softmax(s + first, own - first);
                memset(s + lo, 0, (size_t)(first - lo) * sizeof(float));
                memset(s + own, 0, (size_t)(len - own) * sizeof(float));
            }
            memset(ob, 0, (size_t)nq * (size_t)hd * sizeof(float));
            for (int j = lo, nk; j < len; j += nk) {
                nk = ps - j % ps < len - j ? ps - j % ps : len - j;
                nk = nk < PD_CPU_ATTN_RUN ? nk : PD_CPU_ATTN_RUN;
                int64_t ld;
                const float *vr = kv_run(t, 1, pages, h, j, nk, buf, &ld);
                pd__cpu_attn_pv(sc + j, lds, nq, vr, ld, nk, hd, ob);
            }
            for (int ti = 0; ti < n; ti++)
                memcpy(t->out + ((size_t)(i0 + ti) * t->heads + (size_t)h * group) * hd,
                       ob + (size_t)ti * group * hd, (size_t)group * (size_t)hd * sizeof(float));
        }
    }
}

static void cpu_attention(struct pd_backend *be, const struct pd_kv_layout *kv, int layer,
                          const float *q, int heads, float scale, int window, float *out) {
    struct cpu_backend *c = cpu(be);
    PD_ASSERT(heads <= c->lim.max_heads && kv->head_dim <= c->lim.max_head_dim);
    /* blocks of tokens share K/V reads in a prefill; a decode step keeps one item per token */
    int tq = c->n_tokens > c->n_reqs ? PD_CPU_ATTN_TOKENS : 1;
    struct attn_task t = {c, kv, layer, heads, tq, window, scale, q, out};
    pd__cpu_pool_run(c->pool, attn_task_fn, &t);
}

/* ---- the vision encoder's ops ---- */

/* As torch's LayerNorm in f32: mean, then the mean of squared deviations (biased), then
 * (x - mean) / sqrt(var + eps) * w + b. */
static void layernorm_task(void *ctx, int tid, int nth) {
    struct rows_task *t = ctx;
    int64_t i0, i1;
    pd__cpu_split(t->rows, tid, nth, &i0, &i1);
    float *wf = thread_scratch(t->c, tid), *bf = wf + t->dim; /* widened weight and bias */
    pd__cpu_to_f32(t->w->dtype, t->w->data, wf, t->dim);
    pd__cpu_to_f32(t->b->dtype, t->b->data, bf, t->dim);
    for (int64_t i = i0; i < i1; i++) {
        const float *x = t->x + i * t->dim;
        float *o = t->out + i * t->dim, mean = 0, var = 0;
        for (int d = 0; d < t->dim; d++)
            mean += x[d];
        mean /= (float)t->dim;
        for (int d = 0; d < t->dim; d++)
            var += (x[d] - mean) * (x[d] - mean);
        float r = 1.0f / sqrtf(var / (float)t->dim + t->eps);
        for (int d = 0; d < t->dim; d++)
            o[d] = (x[d] - mean) * r * wf[d] + bf[d];
    }
}

static void cpu_layernorm(struct pd_backend *be, const float *x, const struct pd_tensor *w,
                          const struct pd_tensor *b, int64_t rows, int dim, float eps, float *out) {
    struct cpu_backend *c = cpu(be);
    PD_ASSERT(2 * (size_t)dim <= c->scratch_floats);
    struct rows_task t = {
        .c = c, .x = x, .w = w, .b = b, .out = out, .rows = rows, .dim = dim, .eps = eps};
    run_rows(c, layernorm_task, &t, rows * dim);
}

static void act_task(void *ctx, int tid, int nth) {
    struct rows_task *t = ctx;
    int64_t i0, i1;
    pd__cpu_split(t->count, tid, nth, &i0, &i1);
    if (t->act == PD_ACT_GELU) {
        for (int64_t i = i0; i < i1; i++)
            t->out[i] = 0.5f * t->x[i] * (1.0f + erff(t->x[i] * (float)M_SQRT1_2));
        return;
    }
    for (int64_t i = i0; i < i1; i++)
        t->out[i] = t->x[i] / (1.0f + expf(-1.702f * t->x[i]));
}

static void cpu_act(struct pd_backend *be, enum pd_act act, const float *x, float *out,
                    int64_t count) {
    struct cpu_backend *c = cpu(be);
    struct rows_task t = {.c = c, .x = x, .out = out, .count = count, .act = act};
    run_rows(c, act_task, &t, count);
}

static void rope_angles_task(void *ctx, int tid, int nth) {
    struct rows_task *t = ctx;
    int64_t i0, i1;
    pd__cpu_split(t->rows, tid, nth, &i0, &i1);
    int half = t->dim / 2;
    float *cs = thread_scratch(t->c, tid), *sn = cs + half;
    for (int64_t i = i0; i < i1; i++) {
        for (int d = 0; d < half; d++) {
            cs[d] = cosf(t->y[i * half + d]);
            sn[d] = sinf(t->y[i * half + d]);
        }
        rotate_heads(t->out + i * t->heads * t->dim, t->heads, t->dim, cs, sn);
    }
}

static void cpu_rope_angles(struct pd_backend *be, float *x, int64_t rows, int heads, int head_dim,
                            const float *angles) {
    struct cpu_backend *c = cpu(be);
    PD_ASSERT((size_t)head_dim <= c->scratch_floats);
    struct rows_task t = {
        .c = c, .out = x, .y = angles, .rows = rows, .dim = head_dim, .heads = heads};
    run_rows(c, rope_angles_task, &t, rows * heads * head_dim);
}

struct seg_attn_task {
    struct cpu_backend *c;
    const float *q, *k, *v;
    float *out;
    const int32_t *seg_start;
    int n_segs, heads, hd;
    float scale;
    int64_t items; /* Σ over segments of its query blocks, times heads */
};

/* One work item = up to PD_CPU_SEG_Q query rows of one segment × one head. Keys go in blocks of
 * PD_CPU_SEG_K with an online softmax (running max and sum per row, the outputs rescaled when
 * the max grows), so the scratch stays small whatever the segment's length: a still image's
 * full-attention layers see all its patches, tens of thousands at the processor's largest. */
static void seg_attn_fn(void *ctx, int tid, int nth) {
    struct seg_attn_task *t = ctx;
    int hd = t->hd, H = t->heads;
    int64_t ld = (int64_t)H * hd;
    float *qb = thread_scratch(t->c, tid);                /* [SEG_Q][hd] */
    float *ob = qb + (size_t)PD_CPU_SEG_Q * hd;           /* [SEG_Q][hd] */
    float *sc = ob + (size_t)PD_CPU_SEG_Q * hd;           /* [SEG_Q][SEG_K] */
    float *mx = sc + (size_t)PD_CPU_SEG_Q * PD_CPU_SEG_K; /* [SEG_Q] running max */
    float *sum = mx + PD_CPU_SEG_Q;                       /* [SEG_Q] running sum */
    float *kt = align64(sum + PD_CPU_SEG_Q);              /* [hd][PD_CPU_ATTN_RUN] */
    for (int64_t w = tid; w < t->items; w += nth) {
        int h = (int)(w % H);
        int64_t blk = w / H;
        int s = 0, s0, s1;
        for (;; s++) { /* the segment holding query block blk */
            s0 = t->seg_start[s];
            s1 = t->seg_start[s + 1];
            int64_t nb = (s1 - s0 + PD_CPU_SEG_Q - 1) / PD_CPU_SEG_Q;
            if (blk < nb)
                break;
            blk -= nb;
        }
        int i0 = s0 + (int)blk * PD_CPU_SEG_Q;
        int nq = s1 - i0 < PD_CPU_SEG_Q ? s1 - i0 : PD_CPU_SEG_Q;
        for (int r = 0; r < nq; r++) {
            memcpy(qb + (size_t)r * hd, t->q + (i0 + r) * ld + (int64_t)h * hd,
                   (size_t)hd * sizeof(float));
            mx[r] = -INFINITY;
            sum[r] = 0;
        }
        memset(ob, 0, (size_t)nq * (size_t)hd * sizeof(float));
        for (int j0 = s0; j0 < s1; j0 += PD_CPU_SEG_K) {
            int nk = s1 - j0 < PD_CPU_SEG_K ? s1 - j0 : PD_CPU_SEG_K;
            for (int j = 0; j < nk; j += PD_CPU_ATTN_RUN) {
                int run = nk - j < PD_CPU_ATTN_RUN ? nk - j : PD_CPU_ATTN_RUN;
                pd__cpu_attn_scores(qb, nq, hd, t->k + (j0 + j) * ld + (int64_t)h * hd, ld, run,
                                    t->scale, sc + j, PD_CPU_SEG_K, kt);
            }
            for (int r = 0; r < nq; r++) {
                float *row = sc + (size_t)r * PD_CPU_SEG_K, m = mx[r];
                for (int j = 0; j < nk; j++)
                    m = row[j] > m ? row[j] : m;
                float keep = expf(mx[r] - m), add = 0; /* exp(-inf) = 0 on the first block */
                for (int j = 0; j < nk; j++) {
                    row[j] = expf(row[j] - m);
                    add += row[j];
                }
                if (keep != 1.0f)
                    for (int d = 0; d < hd; d++)
                        ob[(size_t)r * hd + d] *= keep;
                sum[r] = sum[r] * keep + add;
                mx[r] = m;
            }
            pd__cpu_attn_pv(sc, PD_CPU_SEG_K, nq, t->v + j0 * ld + (int64_t)h * hd, ld, nk, hd, ob);
        }
        for (int r = 0; r < nq; r++) {
            float *o = t->out + (i0 + r) * ld + (int64_t)h * hd, inv = 1.0f / sum[r];
            for (int d = 0; d < hd; d++)
                o[d] = ob[(size_t)r * hd + d] * inv;
        }
    }
}

static void cpu_attention_segments(struct pd_backend *be, const float *q, const float *k,
                                   const float *v, int heads, int head_dim,
                                   const int32_t *seg_start, int n_segs, float scale, float *out) {
    struct cpu_backend *c = cpu(be);
    PD_ASSERT(seg_attn_scratch(head_dim) <= c->scratch_floats && seg_start[0] == 0);
    int64_t blocks = 0;
    for (int s = 0; s < n_segs; s++) {
        PD_ASSERT(seg_start[s + 1] >= seg_start[s]);
        blocks += (seg_start[s + 1] - seg_start[s] + PD_CPU_SEG_Q - 1) / PD_CPU_SEG_Q;
    }
    struct seg_attn_task t = {c,      q,     k,        v,     out,           seg_start,
                              n_segs, heads, head_dim, scale, blocks * heads};
    pd__cpu_pool_run(c->pool, seg_attn_fn, &t);
}

/* ---- lifetime ---- */

static void cpu_free(struct pd_backend *be) {
    struct cpu_backend *c = cpu(be);
    free_batch_arrays(c);
    pd_free(c->pen_state);
    if (c->samp_ok)
        pd_sampling_scratch_free(&c->samp);
    pd__cpu_pool_free(c->pool);
    for (size_t i = 0; i < c->n_tiled; i++)
        pd_free(c->tiled[i]);
    pd_free(c->tiled);
    pd_free(c);
}

static const struct pd__backend_ops cpu_ops = {
    .free = cpu_free,
    .mem_info = cpu_mem_info,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .make_resident = cpu_make_resident,
    .reserve = cpu_reserve,
    .weight = cpu_weight,
    .upload = cpu_copy,
    .download = cpu_copy,
    .sync = cpu_sync,
    .set_batch = cpu_set_batch,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .rope = cpu_rope,
    .silu_mul = cpu_silu_mul,
    .add = cpu_add,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .gather_out_rows = cpu_gather_out_rows,
    .layernorm = cpu_layernorm,
    .act = cpu_act,
    .rope_angles = cpu_rope_angles,
    .attention_segments = cpu_attention_segments,
    .argmax = cpu_argmax,
    .sample = cpu_sample,
    .penalty_reserve = cpu_penalty_reserve,
    .penalty_set = cpu_penalty_set,
};

static int online_cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int pd__backend_cpu_new(const struct pd_backend_opts *opts, struct pd_backend **out) {
    if (opts->threads < 0)
        return pd_errorf(PD_EINVAL, "--threads %d: must be >= 0 (0 = one per core)", opts->threads);
    const char *isa = getenv("PDSERVE_CPU_ISA");
    if (isa && *isa && strcmp(isa, "amx") != 0 && strcmp(isa, "avx512") != 0 &&
        strcmp(isa, "avx2") != 0 && strcmp(isa, "generic") != 0)
        return pd_errorf(PD_EINVAL, "PDSERVE_CPU_ISA=%s: not one of amx, avx512, avx2, generic",
                         isa);
    struct cpu_backend *c = pd_calloc(1, sizeof(*c));
    if (!c)
        return PD_ENOMEM;
    c->base.ops = &cpu_ops;
    c->base.kind = PD_BACKEND_CPU;
    c->nth = opts->threads ? opts->threads : online_cores();
    int rc = pd__cpu_pool_new(c->nth, &c->pool);
    if (rc) {
        pd_free(c);
        return pd_error_wrap(rc, "starting the cpu backend");
    }
    /* our pool splits the work; each thread's sgemm must stay on that thread */
    openblas_set_num_threads(1);
    snprintf(c->base.name, sizeof(c->base.name), "cpu (%d threads, %s)", c->nth,
             pd__cpu_isa_name());
    *out = &c->base;
    return PD_OK;
}
