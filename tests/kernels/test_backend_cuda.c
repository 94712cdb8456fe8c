/*
 * test_backend_cuda.c — the cuda backend against the cpu backend (STYLE.md rule 10), op by op
 * through model/backend.h with the same inputs on both: RMSNorm (alone and fused with the
 * residual add), matmul (bf16/f16/f32 weights, with and without bias), product groups (q/k/v
 * with biases and gate/up + SwiGLU over packed weights, the few-row and the cuBLAS path), RoPE
 * at large positions, SwiGLU, add, embedding, row gather, KV store + paged attention (extend chunks
 * over cached pages, decode long enough to split, GQA groups 1..16, head dims 12..128, f32/bf16/f16
 * and fp8 e4m3/e5m2 pools (byte-identical pools on both), page sizes 16 and 5, pages out of order).
 * Sweeps include 0 and 1 rows and sizes that are not multiples of any tile. Then whole models:
 * extend + decode logits equal the cpu backend's, decode through CUDA graphs equals eager
 * launches, graphs are captured once per bucket and replayed after, up to the 256 bucket
 * (batches 256/100/17). Attention also at page sizes 1..128, head_dim 256, GQA 8 decode batches
 * of 256, and in a pool over 4 GiB (64-bit offsets). The device sampler with penalty slots and
 * top-n against the cpu backend, and its perf line. Skips (77) without a GPU. `--perf` is the
 * perf mode (bench_gpu.c). PD_GPU_TEST_HARNESS=cpu: "gpu" is a second cpu backend (CTest
 * gpu_backend_cuda_harness), for the harness itself.
 */
#include "pd_model_fixture.h"
#include "pd_test.h"

#include "common/base/alloc.h"
#include "model/backend.h"
#include "model/sampling.h"
#include "model/model.h"
#include "kernels/backend_cuda.h"
#include "kernels/kernels.h"

#include <math.h>
#include <time.h>

static uint64_t rng = 12345;
static float frand(void) { /* [-1, 1) */
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

static struct pd_backend *cpu, *gpu;

/* max_reqs 256: a decode step of 256 requests (the largest graph bucket's batch);
 * max_head_dim 256: the widest head the attention kernel takes (split partials are sized by it) */
static const struct pd_backend_limits lim = {.max_tokens = 256,
                                             .max_reqs = 256,
                                             .max_pages = 8192,
                                             .max_context = 1200,
                                             .max_heads = 32,
                                             .max_head_dim = 256,
                                             .max_dim = 5000};

/* PD_GPU_TEST_HARNESS=cpu: "gpu" is a second cpu backend and the tests that need a device
 * (kernels called directly, the cuda backend's counters, graphs, >4 GiB pools) are left out.
 * It checks this file's own harness (batch plans within the limits, buffer sizes) on a machine
 * without a GPU, so a GPU session is not spent finding a bug of the test. */
static bool harness;

static void gpu_stats(struct pd_backend *be, struct pd_backend_cuda_stats *s) {
    memset(s, 0, sizeof(*s));
    if (!harness)
        pd_backend_cuda_stats(be, s);
}

/* ---- helpers: one buffer on both backends ---- */

struct dual {
    void *c, *g; /* cpu, gpu */
    size_t bytes;
};

static struct dual dual_new(size_t bytes) {
    struct dual d = {NULL, NULL, bytes};
    CHECK_OK(pd_backend_alloc(cpu, bytes, &d.c));
    CHECK_OK(pd_backend_alloc(gpu, bytes, &d.g));
    return d;
}

static void dual_free(struct dual *d) {
    pd_backend_release(cpu, d->c);
    pd_backend_release(gpu, d->g);
}

static void dual_fill(struct dual *d, float amp) {
    size_t n = d->bytes / 4;
    float *f = d->c;
    for (size_t i = 0; i < n; i++)
        f[i] = amp * frand();
    CHECK_OK(pd_backend_upload(gpu, d->g, d->c, d->bytes));
}

/* smallest denominator of dual_err: a product's typical magnitude, so a sum that cancels to
 * near zero does not turn rounding noise into a large relative error */
static double err_floor = 1e-6;

/* max |gpu - cpu| / max(|cpu|, err_floor) over n floats; NaN counts as failure */
static double dual_err(struct dual *d, size_t n) {
    float *h = pd_malloc(n * sizeof(float));
    CHECK_OK(pd_backend_download(gpu, h, d->g, n * sizeof(float)));
    const float *ref = d->c;
    double e = 0, mx = err_floor;
    for (size_t i = 0; i < n; i++) {
        double diff = fabs((double)h[i] - ref[i]);
        if (diff != diff)
            diff = INFINITY;
        e = diff > e ? diff : e;
        mx = fabs(ref[i]) > mx ? fabs(ref[i]) : mx;
    }
    pd_free(h);
    return e / mx;
}

static void weight_pair(enum pd_dtype dt, int64_t rows, int64_t cols, float amp, float off,
                        void **host, struct pd_tensor *wc, struct pd_tensor *wg) {
    size_t n = (size_t)(rows * cols);
    float *f = pd_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        f[i] = off + amp * frand();
    *host = pd_malloc(n * pd_dtype_size(dt));
    pd_dtype_from_f32(dt, f, *host, n);
    pd_free(f);
    CHECK_OK(pd_backend_weight(cpu, dt, rows, cols, *host, wc));
    CHECK_OK(pd_backend_weight(gpu, dt, rows, cols, *host, wg));
}

/* One request of n tokens at positions pos0.., pages 0..; enough for row ops. */
static void row_batch(int n, const int32_t *ids, int32_t pos0) {
    static int32_t pos[256], slots[256], pt[512];
    int32_t start[2] = {0, n}, kvlen[1] = {n}, pstart[2] = {0, 1};
    for (int i = 0; i < n; i++) {
        pos[i] = pos0 + i * 977;
        slots[i] = i;
    }
    pt[0] = 0;
    struct pd_batch_plan p = {1, n, ids, pos, slots, start, kvlen, pstart, pt, 0, NULL};
    CHECK_OK(pd_backend_set_batch(cpu, &p));
    CHECK_OK(pd_backend_set_batch(gpu, &p));
}

static const enum pd_dtype dtypes[] = {PD_DTYPE_F32, PD_DTYPE_BF16, PD_DTYPE_F16};

/* ---- row ops ---- */

static void test_rmsnorm(void) {
    static const int rows_list[] = {0, 1, 3, 37};
    static const int dims[] = {12, 64, 128, 300, 1000, 4096, 5000};
    int32_t ids[1] = {0};
    row_batch(1, ids, 0);
    for (size_t t = 0; t < PD_ARRAY_LEN(dtypes); t++)
        for (size_t di = 0; di < PD_ARRAY_LEN(dims); di++)
            for (size_t ri = 0; ri < PD_ARRAY_LEN(rows_list); ri++) {
                int dim = dims[di], rows = rows_list[ri];
                size_t n = (size_t)rows * dim;
                struct dual x = dual_new(n * 4 + 4), y = dual_new(n * 4 + 4);
                struct dual o = dual_new(n * 4 + 4);
                dual_fill(&x, 2.0f);
                dual_fill(&y, 1.0f);
                void *host;
                struct pd_tensor wc, wg;
                weight_pair(dtypes[t], 1, dim, 0.3f, 1.0f, &host, &wc, &wg);
                /* plain, then add + norm (which the cuda backend fuses) */
                pd_backend_rmsnorm(cpu, x.c, &wc, rows, dim, 1e-5f, o.c);
                pd_backend_rmsnorm(gpu, x.g, &wg, rows, dim, 1e-5f, o.g);
                double e1 = dual_err(&o, n);
                struct pd_backend_cuda_stats s0, s1;
                gpu_stats(gpu, &s0);
                for (int k = 0; k < 2; k++) {
                    struct pd_backend *be = k ? gpu : cpu;
                    struct dual *X = &x, *Y = &y;
                    pd_backend_add(be, k ? X->g : X->c, k ? Y->g : Y->c, (int64_t)n);
                    pd_backend_rmsnorm(be, k ? X->g : X->c, k ? &wg : &wc, rows, dim, 1e-5f,
                                       k ? Y->g : Y->c);
                }
                double e2 = dual_err(&y, n), e3 = dual_err(&x, n);
                gpu_stats(gpu, &s1);
                if (!(e1 < 1e-5 && e2 < 1e-5 && e3 < 1e-6))
                    fprintf(stderr, "rmsnorm %s dim %d rows %d: err %g fused %g x %g\n",
                            pd_dtype_name(dtypes[t]), dim, rows, e1, e2, e3);
                CHECK(e1 < 1e-5 && e2 < 1e-5 && e3 < 1e-6);
                CHECK_INT(s1.fused_norms - s0.fused_norms, harness ? 0 : 1);
                dual_free(&x);
                dual_free(&y);
                dual_free(&o);
                pd_free(host);
            }
}

static void test_matmul(void) {
    static const int rows_list[] = {0, 1, 3, 17, 64, 129};
    static const int ms[] = {1, 13, 256, 1000};
    static const int ks[] = {8, 48, 300, 1024};
    int32_t ids[1] = {0};
    row_batch(1, ids, 0);
    for (size_t t = 0; t < PD_ARRAY_LEN(dtypes); t++)
        for (size_t mi = 0; mi < PD_ARRAY_LEN(ms); mi++)
            for (size_t ki = 0; ki < PD_ARRAY_LEN(ks); ki++)
                for (size_t ri = 0; ri < PD_ARRAY_LEN(rows_list); ri++) {
                    int m = ms[mi], k = ks[ki], rows = rows_list[ri];
                    bool with_bias = (mi + ri) % 2;
                    struct dual x = dual_new((size_t)rows * k * 4 + 4);
                    struct dual y = dual_new((size_t)rows * m * 4 + 4);
                    dual_fill(&x, 1.0f);
                    void *hw, *hb = NULL;
                    struct pd_tensor wc, wg, bc, bg;
                    weight_pair(dtypes[t], m, k, 0.5f, 0, &hw, &wc, &wg);
                    if (with_bias)
                        weight_pair(dtypes[t], 1, m, 0.5f, 0, &hb, &bc, &bg);
                    pd_backend_matmul(cpu, x.c, rows, &wc, with_bias ? &bc : NULL, y.c);
                    pd_backend_matmul(gpu, x.g, rows, &wg, with_bias ? &bg : NULL, y.g);
                    err_floor = 0.15 * sqrt((double)k); /* std of a sum of k products */
                    double e = dual_err(&y, (size_t)rows * m);
                    err_floor = 1e-6;
                    /* bf16/f16 GEMMs round the f32 activations to the weight's type */
                    double tol = dtypes[t] == PD_DTYPE_F32   ? 1e-5
                                 : dtypes[t] == PD_DTYPE_F16 ? 4e-3
                                                             : 2e-2;
                    if (!(e < tol))
                        fprintf(stderr, "matmul %s %dx%dx%d bias %d: err %g\n",
                                pd_dtype_name(dtypes[t]), rows, m, k, with_bias, e);
                    CHECK(e < tol);
                    dual_free(&x);
                    dual_free(&y);
                    pd_free(hw);
                    pd_free(hb);
                }
}

/* Products of one input by weights packed back to back, as the model issues them: an RMSNorm,
 * q/k/v with biases, gate/up and their SwiGLU. The cuda backend runs each group as one launch
 * (up to PD_KERNEL_GEMV_MAX_ROWS rows) or as one GEMM split afterwards (the norm then writing
 * the GEMM's input); every output must equal the cpu backend's, and the groups must have formed. */
static void test_product_groups(void) {
    static const int rows_list[] = {1, 2, 3, 4, 5, 17, 64, 256};
    static const int ks[] = {64, 1000, 1536};
    static const enum pd_dtype dts[] = {PD_DTYPE_BF16, PD_DTYPE_F16};
    const int mq = 96, mkv = 32, mi = 200;
    static int32_t ids[256];
    for (size_t t = 0; t < PD_ARRAY_LEN(dts); t++)
        for (size_t ki = 0; ki < PD_ARRAY_LEN(ks); ki++)
            for (size_t ri = 0; ri < PD_ARRAY_LEN(rows_list); ri++) {
                int k = ks[ki], rows = rows_list[ri];
                enum pd_dtype dt = dts[t];
                row_batch(rows, ids, 0);
                struct dual x = dual_new((size_t)rows * k * 4), h = dual_new((size_t)rows * k * 4);
                struct dual y[5] = {
                    dual_new((size_t)rows * mq * 4), dual_new((size_t)rows * mkv * 4),
                    dual_new((size_t)rows * mkv * 4), dual_new((size_t)rows * mi * 4),
                    dual_new((size_t)rows * mi * 4)};
                const int ms[8] = {mq, mkv, mkv, mi, mi, 1, 1, 1};
                dual_fill(&x, 1.0f);
                /* weights q, k, v, gate, up; biases q, k, v; the norm's */
                void *host[9];
                struct pd_tensor wc[9], wg[9];
                for (int i = 0; i < 5; i++)
                    weight_pair(dt, ms[i], k, 0.5f, 0, &host[i], &wc[i], &wg[i]);
                for (int i = 0; i < 3; i++)
                    weight_pair(dt, 1, ms[i], 0.5f, 0, &host[5 + i], &wc[5 + i], &wg[5 + i]);
                weight_pair(dt, 1, k, 0.2f, 1.0f, &host[8], &wc[8], &wg[8]);
                struct pd_tensor *packs[2][4][3] = {
                    {{&wc[0], &wc[1], &wc[2]}, {&wc[5], &wc[6], &wc[7]}, {&wc[3], &wc[4]}},
                    {{&wg[0], &wg[1], &wg[2]}, {&wg[5], &wg[6], &wg[7]}, {&wg[3], &wg[4]}}};
                struct pd_backend *bes[2] = {cpu, gpu};
                for (int b = 0; b < 2; b++) {
                    CHECK_OK(pd_backend_weight_pack(bes[b], packs[b][0], 3));
                    CHECK_OK(pd_backend_weight_pack(bes[b], packs[b][1], 3));
                    CHECK_OK(pd_backend_weight_pack(bes[b], packs[b][2], 2));
                }
                struct pd_backend_cuda_stats before, after;
                gpu_stats(gpu, &before);
                for (int b = 0; b < 2; b++) {
                    struct pd_backend *be = bes[b];
                    struct pd_tensor *w = b ? wg : wc;
                    float *hx = b ? h.g : h.c;
                    pd_backend_rmsnorm(be, b ? x.g : x.c, &w[8], rows, k, 1e-5f, hx);
                    for (int i = 0; i < 3; i++)
                        pd_backend_matmul(be, hx, rows, &w[i], &w[5 + i], b ? y[i].g : y[i].c);
                    pd_backend_matmul(be, hx, rows, &w[3], NULL, b ? y[3].g : y[3].c);
                    pd_backend_matmul(be, hx, rows, &w[4], NULL, b ? y[4].g : y[4].c);
                    pd_backend_silu_mul(be, b ? y[3].g : y[3].c, b ? y[4].g : y[4].c,
                                        b ? y[3].g : y[3].c, (int64_t)rows * mi);
                }
                double tol = dt == PD_DTYPE_F16 ? 4e-3 : 2e-2;
                err_floor = 0.15 * sqrt((double)k);
                for (int i = 0; i < 5; i++) {
                    double e = dual_err(&y[i], (size_t)rows * ms[i]);
                    if (!(e < tol))
                        fprintf(stderr, "product group %s rows %d k %d output %d: err %g\n",
                                pd_dtype_name(dt), rows, k, i, e);
                    CHECK(e < tol);
                }
                err_floor = 1e-6;
                gpu_stats(gpu, &after);
                if (!harness) {
                    /* q+k+v: two products inside the first's launch; gate+up+silu: two more */
                    CHECK(after.fused_products - before.fused_products == 4);
                    /* more rows than the few-row product: the norm converts for the first
                     * GEMM, which leaves its input for the second group */
                    int64_t reused = rows > PD_KERNEL_GEMV_MAX_ROWS ? 2 : 0;
                    CHECK(after.reused_inputs - before.reused_inputs == reused);
                }
                for (int i = 0; i < 9; i++)
                    pd_free(host[i]);
                for (int i = 0; i < 5; i++)
                    dual_free(&y[i]);
                dual_free(&x);
                dual_free(&h);
            }
}

static void test_elementwise(void) {
    static const int counts[] = {0, 1, 7, 1024, 4099};
    int32_t ids[1] = {0};
    row_batch(1, ids, 0);
    for (size_t i = 0; i < PD_ARRAY_LEN(counts); i++) {
        int n = counts[i];
        struct dual g = dual_new((size_t)n * 4 + 4), u = dual_new((size_t)n * 4 + 4);
        dual_fill(&g, 4.0f);
        dual_fill(&u, 1.0f);
        pd_backend_silu_mul(cpu, g.c, u.c, g.c, n);
        pd_backend_silu_mul(gpu, g.g, u.g, g.g, n);
        CHECK(dual_err(&g, (size_t)n) < 1e-5);
        pd_backend_add(cpu, u.c, g.c, n);
        pd_backend_add(gpu, u.g, g.g, n);
        CHECK(dual_err(&u, (size_t)n) < 1e-6);
        dual_free(&g);
        dual_free(&u);
    }
}

static void test_rope_embed_gather(void) {
    static const int ns[] = {1, 5, 33};
    static const int hds[] = {2, 12, 64, 128};
    for (size_t ni = 0; ni < PD_ARRAY_LEN(ns); ni++)
        for (size_t hi = 0; hi < PD_ARRAY_LEN(hds); hi++)
            for (int heads = 1; heads <= 3; heads += 2) {
                int n = ns[ni], hd = hds[hi];
                int32_t ids[64];
                for (int i = 0; i < n; i++)
                    ids[i] = (int32_t)((i * 37) % 97);
                row_batch(n, ids, 100000); /* large angles: precise sincos needed */
                struct dual x = dual_new((size_t)n * heads * hd * 4);
                struct dual f = dual_new((size_t)hd / 2 * 4);
                dual_fill(&x, 1.0f);
                float *inv = f.c;
                for (int d = 0; d < hd / 2; d++) /* a llama3-like table: scaled low bands */
                    inv[d] = powf(500000.0f, -2.0f * d / hd) / (d > hd / 4 ? 8.0f : 1.0f);
                CHECK_OK(pd_backend_upload(gpu, f.g, f.c, f.bytes));
                pd_backend_rope(cpu, x.c, heads, hd, f.c);
                pd_backend_rope(gpu, x.g, heads, hd, f.g);
                double e = dual_err(&x, (size_t)n * heads * hd);
                if (!(e < 2e-4))
                    fprintf(stderr, "rope n %d heads %d hd %d: err %g\n", n, heads, hd, e);
                CHECK(e < 2e-4);
                dual_free(&x);
                dual_free(&f);

                for (size_t t = 0; t < PD_ARRAY_LEN(dtypes); t++) {
                    void *host;
                    struct pd_tensor tc, tg;
                    weight_pair(dtypes[t], 97, hd * heads + 1, 1.0f, 0, &host, &tc, &tg);
                    int w = hd * heads + 1;
                    struct dual e1 = dual_new((size_t)n * w * 4), o = dual_new((size_t)n * w * 4);
                    pd_backend_embed(cpu, &tc, e1.c);
                    pd_backend_embed(gpu, &tg, e1.g);
                    CHECK(dual_err(&e1, (size_t)n * w) == 0);
                    /* gather rows n-1, n-2.. (descending plans are the model's business:
                     * the backend gathers whatever out rows the plan names) */
                    int32_t pos[64], slots[64], out_rows[64], start[2] = {0, n}, kvlen[1] = {n};
                    int32_t pstart[2] = {0, 1}, pt[1] = {0};
                    int n_out = (n + 1) / 2;
                    for (int i = 0; i < n; i++)
                        pos[i] = slots[i] = i;
                    for (int j = 0; j < n_out; j++)
                        out_rows[j] = 2 * j;
                    struct pd_batch_plan p = {1,     n,      ids, pos,   slots,   start,
                                              kvlen, pstart, pt,  n_out, out_rows};
                    CHECK_OK(pd_backend_set_batch(cpu, &p));
                    CHECK_OK(pd_backend_set_batch(gpu, &p));
                    pd_backend_gather_out_rows(cpu, e1.c, w, o.c);
                    pd_backend_gather_out_rows(gpu, e1.g, w, o.g);
                    CHECK(dual_err(&o, (size_t)n_out * w) == 0);
                    dual_free(&e1);
                    dual_free(&o);
                    pd_free(host);
                }
            }
}

/* ---- KV store + paged attention ---- */

#define ATTN_MAX_REQS 256

struct attn_case {
    int kv_heads, group, hd, page_size;
    int n_reqs;
    int n_new[ATTN_MAX_REQS], n_cached[ATTN_MAX_REQS];
};

/* One step on both backends over pool layouts Lc / Lg: requests [0, nr) with tokens [b[r],
 * e[r]) (b == e: not in the step), their pages pg[r]; K/V stored, then (attend) the attention
 * output compared. Returns the relative error (0 when not attending). */
static double attn_step(const struct attn_case *ac, const struct pd_kv_layout *Lc,
                        const struct pd_kv_layout *Lg, int layer, const int *b, const int *e,
                        int32_t *const *pg, bool attend) {
    static int32_t ids[256], pos[256], slots[256], start[ATTN_MAX_REQS + 1], kvlen[ATTN_MAX_REQS],
        pstart[ATTN_MAX_REQS + 1], pt[8192];
    int ps = ac->page_size, H = ac->kv_heads * ac->group, hd = ac->hd;
    int kvd = ac->kv_heads * hd, n = 0, np = 0, nr = 0;
    for (int r = 0; r < ac->n_reqs; r++) {
        if (e[r] == b[r])
            continue;
        start[nr] = n;
        pstart[nr] = np;
        for (int t = b[r]; t < e[r]; t++, n++) {
            PD_ASSERT(n < lim.max_tokens); /* the case's own bug: keep steps within the limits */
            ids[n] = 0;
            pos[n] = t;
            slots[n] = pg[r][t / ps] * ps + t % ps;
        }
        int need = (e[r] + ps - 1) / ps;
        PD_ASSERT(np + need <= lim.max_pages);
        memcpy(pt + np, pg[r], (size_t)need * 4);
        np += need;
        kvlen[nr++] = e[r];
    }
    if (!nr)
        return 0;
    start[nr] = n;
    pstart[nr] = np;
    struct pd_batch_plan p = {nr, n, ids, pos, slots, start, kvlen, pstart, pt, 0, NULL};
    CHECK_OK(pd_backend_set_batch(cpu, &p));
    CHECK_OK(pd_backend_set_batch(gpu, &p));
    struct dual k = dual_new((size_t)n * kvd * 4), v = dual_new((size_t)n * kvd * 4);
    dual_fill(&k, 1.0f);
    dual_fill(&v, 1.0f);
    pd_backend_kv_store(cpu, Lc, layer, k.c, v.c);
    pd_backend_kv_store(gpu, Lg, layer, k.g, v.g);
    double err = 0;
    if (attend) {
        struct dual q = dual_new((size_t)n * H * hd * 4), o = dual_new((size_t)n * H * hd * 4);
        dual_fill(&q, 1.0f);
        float scale = 1.0f / sqrtf((float)hd);
        pd_backend_attention(cpu, Lc, layer, q.c, H, scale, 0, o.c);
        pd_backend_attention(gpu, Lg, layer, q.g, H, scale, 0, o.g);
        err = dual_err(&o, (size_t)n * H * hd);
        dual_free(&q);
        dual_free(&o);
    }
    dual_free(&k);
    dual_free(&v);
    return err;
}

static void run_attn_case(const struct attn_case *ac, enum pd_dtype kvt) {
    int hd = ac->hd, ps = ac->page_size, kvd = ac->kv_heads * hd, nr = ac->n_reqs;
    int layers = 2, layer = 1;
    size_t esz = pd_dtype_size(kvt);
    PD_ASSERT(nr <= ATTN_MAX_REQS);
    /* pages handed out in a scrambled order (7919 is prime, so i * 7919 mod n_pages is a
     * permutation while n_pages is no multiple of it), half the pool left unused */
    int total = 0, need[ATTN_MAX_REQS];
    for (int r = 0; r < nr; r++) {
        need[r] = (ac->n_cached[r] + ac->n_new[r] + ps - 1) / ps;
        total += need[r];
    }
    int64_t n_pages = 2 * (int64_t)total + 7;
    PD_ASSERT(n_pages % 7919);
    struct pd_kv_layout L = {NULL, n_pages, layers, ps, ac->kv_heads, hd, kvt, 0};
    L.page_bytes = (size_t)layers * 2 * ps * kvd * esz;
    struct dual pool = dual_new(L.page_bytes * (size_t)L.n_pages);
    struct pd_kv_layout Lc = L, Lg = L;
    Lc.base = pool.c;
    Lg.base = pool.g;
    int32_t *pages = pd_malloc((size_t)(total > 0 ? total : 1) * 4), *pg[ATTN_MAX_REQS];
    for (int r = 0, next = 0; r < nr; r++) {
        pg[r] = pages + next;
        for (int i = 0; i < need[r]; i++, next++)
            pages[next] = (int32_t)((next * 7919LL) % n_pages);
    }
    /* the cached prefixes: request by request, in chunks within max_tokens */
    int b[ATTN_MAX_REQS] = {0}, e[ATTN_MAX_REQS] = {0};
    for (int r = 0; r < nr; r++) {
        for (int t = 0; t < ac->n_cached[r]; t += 200) {
            b[r] = t;
            e[r] = t + 200 < ac->n_cached[r] ? t + 200 : ac->n_cached[r];
            attn_step(ac, &Lc, &Lg, layer, b, e, pg, false);
        }
        b[r] = e[r] = 0;
    }
    /* the step under test: every request's new tokens after its prefix */
    for (int r = 0; r < nr; r++) {
        b[r] = ac->n_cached[r];
        e[r] = ac->n_cached[r] + ac->n_new[r];
    }
    /* Tolerance: both sides read the same pool bytes (compared below: K/V rounded to the pool's
     * dtype identically) and accumulate in f32, so with our kernel (f32 pools, other head dims)
     * only the order of the sums and expf differ: a few f32 ulps per term over up to ~1200
     * keys, ~1e-6 relative, and 1e-4 leaves room. FlashInfer's kernels (2-byte and fp8 pools at
     * head dims 64/128/256) take q and give o in bf16/f16 and multiply P·V in bf16/f16: ~2^-8
     * relative each, so 2e-2. Both are far below a wrong key, mask or scale (errors of order 1). */
    bool fi = kvt != PD_DTYPE_F32 && (hd == 64 || hd == 128 || hd == 256);
    double tol = fi ? 2e-2 : 1e-4;
    double err = attn_step(ac, &Lc, &Lg, layer, b, e, pg, true);
    if (!(err < tol))
        fprintf(stderr,
                "attention %s kvh %d group %d hd %d page %d reqs %d (new %d cached %d ...): err "
                "%g\n",
                pd_dtype_name(kvt), ac->kv_heads, ac->group, hd, ps, nr, ac->n_new[0],
                ac->n_cached[0], err);
    CHECK(err < tol);
    /* the pool itself: same bytes on both sides */
    char *hp = pd_malloc(pool.bytes);
    CHECK_OK(pd_backend_download(gpu, hp, pool.g, pool.bytes));
    CHECK(memcmp(hp, pool.c, pool.bytes) == 0);
    pd_free(hp);
    pd_free(pages);
    dual_free(&pool);
}

static void test_attention(void) {
    static const struct attn_case cases[] = {
        /* decode: one token per request, short and long (split-K) contexts; kv_len 1 */
        {2, 2, 12, 16, 3, {1, 1, 1}, {0, 15, 200}},
        {1, 4, 64, 16, 2, {1, 1}, {1000, 3}},
        {2, 4, 128, 16, 4, {1, 1, 1, 1}, {1100, 17, 64, 0}},
        {4, 1, 64, 5, 2, {1, 1}, {333, 1}},
        {1, 16, 128, 16, 1, {1}, {700}},
        {2, 6, 80, 16, 2, {1, 1}, {520, 33}},
        /* GQA 8 (Llama-3 8B's), a batch of 8 of mixed lengths, keys on tile edges */
        {1, 8, 128, 16, 8, {1, 1, 1, 1, 1, 1, 1, 1}, {0, 126, 127, 128, 255, 256, 511, 1199}},
        /* page sizes 1 and 128; head_dim 256 (the generic path's widest) on odd pages */
        {1, 8, 64, 1, 3, {1, 1, 1}, {100, 0, 37}},
        {2, 2, 128, 1, 2, {20, 1}, {5, 60}},
        {2, 4, 128, 128, 2, {1, 50}, {1000, 200}},
        {1, 2, 256, 7, 2, {1, 9}, {400, 30}},
        {2, 1, 64, 128, 1, {1}, {127}},
        /* extend: prompt chunks, with and without a cached prefix, mixed with decode */
        {2, 2, 12, 16, 2, {7, 1}, {0, 40}},
        {1, 8, 128, 16, 2, {37, 20}, {100, 0}},
        {2, 4, 64, 5, 3, {64, 1, 3}, {33, 300, 0}},
        {4, 1, 128, 16, 1, {100}, {900}},
        {1, 32, 64, 16, 1, {9}, {5}},
        /* chunks that are no multiple of the 16-row items or the 128-key tiles */
        {2, 4, 64, 16, 1, {129}, {0}},
        {1, 8, 128, 16, 2, {2, 61}, {127, 67}},
    };
    /* every KV pool type: both backends convert with model/fp8.h, so even an fp8 pool holds
     * the same bytes on both (checked in run_attn_case) */
    static const enum pd_dtype kv_dtypes[] = {PD_DTYPE_F32, PD_DTYPE_BF16, PD_DTYPE_F16,
                                              PD_DTYPE_F8E4M3, PD_DTYPE_F8E5M2};
    for (size_t i = 0; i < PD_ARRAY_LEN(cases); i++)
        for (size_t t = 0; t < PD_ARRAY_LEN(kv_dtypes); t++)
            run_attn_case(&cases[i], kv_dtypes[t]);
    /* decode of 256 requests (the largest graph bucket's batch), GQA 8, lengths 0..299 */
    static struct attn_case big = {1, 8, 64, 16, 256, {0}, {0}};
    for (int r = 0; r < 256; r++) {
        big.n_new[r] = 1;
        big.n_cached[r] = (r * 37) % 300;
    }
    for (size_t t = 0; t < PD_ARRAY_LEN(kv_dtypes); t++)
        run_attn_case(&big, kv_dtypes[t]);
}

/* A pool over 4 GiB (H200 pools are ~100 GiB): K/V stored at pages whose byte offsets pass
 * 2^32 and attended there give exactly the output of the same data at low pages of a small
 * pool (same arithmetic, only the addresses differ), and page_copy gathers those high pages
 * byte for byte. A 32-bit offset anywhere (slot * row bytes, page * page_bytes) would read or
 * write the wrong memory. GPU only (the cpu reference would need the same 4.5 GiB). */
static void test_attention_high_pool(void) {
    if (harness)
        return;
    const int kvh = 2, group = 4, hd = 128, ps = 16, layers = 2, layer = 1, H = kvh * group;
    const enum pd_dtype kvt = PD_DTYPE_BF16;
    size_t page_bytes = (size_t)layers * 2 * ps * kvh * hd * pd_dtype_size(kvt);
    int64_t hi_pages = (int64_t)((9ull << 29) / page_bytes); /* 4.5 GiB */
    void *hi_base = NULL, *lo_base = NULL;
    int rc = pd_backend_alloc(gpu, page_bytes * (size_t)hi_pages, &hi_base);
    if (rc) {
        printf("  high pool: cannot allocate 4.5 GiB (%s): not checked\n", pd_error_msg());
        pd_error_clear();
        return;
    }
    /* a 600-token prompt in 3 chunks, then one decode token split over its 601 keys: 38 pages */
    enum { NP = 40, NT = 600, CH = 200 };
    CHECK_OK(pd_backend_alloc(gpu, page_bytes * NP, &lo_base));
    struct pd_kv_layout Lh = {hi_base, hi_pages, layers, ps, kvh, hd, kvt, page_bytes};
    struct pd_kv_layout Ll = {lo_base, NP, layers, ps, kvh, hd, kvt, page_bytes};
    int32_t hi_pg[NP], lo_pg[NP];
    for (int i = 0; i < NP; i++) {
        hi_pg[i] = (int32_t)(hi_pages - 1 - 2 * i); /* the top of the pool, every other page */
        lo_pg[i] = i;
    }
    CHECK((size_t)hi_pg[NP - 1] * page_bytes > (4ull << 30));
    size_t kv_bytes = (size_t)(NT + 1) * kvh * hd * 4, q_bytes = (size_t)(NT + 1) * H * hd * 4;
    float *k = pd_malloc(kv_bytes), *v = pd_malloc(kv_bytes), *q = pd_malloc(q_bytes);
    for (size_t i = 0; i < kv_bytes / 4; i++) {
        k[i] = frand();
        v[i] = frand();
    }
    for (size_t i = 0; i < q_bytes / 4; i++)
        q[i] = frand();
    float *kd, *vd, *qd, *od, *out[2];
    CHECK_OK(pd_backend_alloc(gpu, kv_bytes, (void **)&kd));
    CHECK_OK(pd_backend_alloc(gpu, kv_bytes, (void **)&vd));
    CHECK_OK(pd_backend_alloc(gpu, q_bytes, (void **)&qd));
    CHECK_OK(pd_backend_alloc(gpu, q_bytes, (void **)&od));
    CHECK_OK(pd_backend_upload(gpu, kd, k, kv_bytes));
    CHECK_OK(pd_backend_upload(gpu, vd, v, kv_bytes));
    CHECK_OK(pd_backend_upload(gpu, qd, q, q_bytes));
    for (int side = 0; side < 2; side++) {
        const struct pd_kv_layout *L = side ? &Ll : &Lh;
        const int32_t *pg = side ? lo_pg : hi_pg;
        out[side] = pd_calloc(q_bytes / 4, 4);
        for (int step = 0; step <= NT / CH; step++) {
            int b = step * CH, e = step < NT / CH ? b + CH : NT + 1, n = e - b;
            int32_t ids[CH], pos[CH], slots[CH], start[2] = {0, n}, kvlen[1] = {e};
            int32_t pstart[2] = {0, (e + ps - 1) / ps};
            for (int t = b; t < e; t++) {
                ids[t - b] = 0;
                pos[t - b] = t;
                slots[t - b] = pg[t / ps] * ps + t % ps;
            }
            struct pd_batch_plan p = {1, n, ids, pos, slots, start, kvlen, pstart, pg, 0, NULL};
            CHECK_OK(pd_backend_set_batch(gpu, &p));
            size_t off = (size_t)b * kvh * hd, qoff = (size_t)b * H * hd;
            pd_backend_kv_store(gpu, L, layer, kd + off, vd + off);
            pd_backend_attention(gpu, L, layer, qd + qoff, H, 1.0f / sqrtf((float)hd), 0,
                                 od + qoff);
            CHECK_OK(pd_backend_download(gpu, out[side] + qoff, od + qoff, (size_t)n * H * hd * 4));
        }
    }
    CHECK(memcmp(out[0], out[1], q_bytes) == 0);
    /* page_copy: the high pages gathered to a staging run equal the low pool's pages */
    void *stage = NULL;
    int32_t *idx = NULL;
    CHECK_OK(pd_backend_alloc(gpu, page_bytes * NP, &stage));
    CHECK_OK(pd_backend_alloc(gpu, sizeof(hi_pg), (void **)&idx));
    CHECK_OK(pd_backend_upload(gpu, idx, hi_pg, sizeof(hi_pg)));
    struct pd_kernel_page_copy_params g = {stage, hi_base, NULL, idx, NP, page_bytes};
    CHECK_OK(pd_kernel_page_copy(&g, 0));
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    char *a = pd_malloc(page_bytes * NP), *bb = pd_malloc(page_bytes * NP);
    CHECK_OK(pd_backend_download(gpu, a, stage, page_bytes * NP));
    CHECK_OK(pd_backend_download(gpu, bb, lo_base, page_bytes * NP));
    CHECK(memcmp(a, bb, page_bytes * NP) == 0);
    printf("  high pool: %.2f GiB, pages from byte %.2f GiB: attention and page copy equal the "
           "low pool's\n",
           (double)page_bytes * (double)hi_pages / (1 << 30),
           (double)hi_pg[NP - 1] * (double)page_bytes / (1 << 30));
    pd_free(a);
    pd_free(bb);
    pd_free(k);
    pd_free(v);
    pd_free(q);
    pd_free(out[0]);
    pd_free(out[1]);
    pd_backend_release(gpu, stage);
    pd_backend_release(gpu, idx);
    pd_backend_release(gpu, kd);
    pd_backend_release(gpu, vd);
    pd_backend_release(gpu, qd);
    pd_backend_release(gpu, od);
    pd_backend_release(gpu, lo_base);
    pd_backend_release(gpu, hi_base);
}

/* ---- whole models ---- */

static struct pd_model_config model_config(enum pd_arch arch) {
    struct pd_model_config c = {0};
    c.vocab_size = 301;
    c.hidden_size = 128;
    c.intermediate_size = 200;
    c.num_hidden_layers = 3;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 2;
    c.head_dim = 32;
    c.max_position_embeddings = 1024;
    fixture_family_traits(&c, arch);
    return c;
}

#define M_REQS 5
#define M_PROMPT 70
#define M_STEPS 12

/* Runs M_REQS prompts (extend in chunks), then M_STEPS decode steps with a batch that shrinks
 * and grows (5, 3, 1, 5 ... requests: buckets 8, 4, 1). logits [M_STEPS][M_REQS][vocab]. */
static void model_run(struct pd_backend *be, const struct pd_model_config *cfg,
                      struct fake_ckpt *ck, enum pd_dtype kvt, float *logits) {
    struct pd_model *m = NULL;
    struct pd_kv_pool kv = {0};
    struct pd_model_opts mo = {.max_tokens = 64, .max_reqs = 8, .page_size = 16};
    CHECK_OK(pd_model_new(be, cfg, fake_ckpt_find, ck, &mo, &m));
    if (!m)
        return;
    struct pd_kv_pool_opts ko = pd_model_kv_opts(m, kvt);
    ko.n_pages = 64;
    CHECK_OK(pd_kv_pool_init(&kv, be, &ko));
    int V = cfg->vocab_size;
    int32_t pages[M_REQS][8], prompt[M_REQS][M_PROMPT], tok[M_REQS];
    for (int r = 0; r < M_REQS; r++) {
        for (int i = 0; i < 8; i++)
            pages[r][i] = (int32_t)(63 - (r * 8 + i)); /* descending: not the identity */
        for (int i = 0; i < M_PROMPT; i++)
            prompt[r][i] = (int32_t)((r * 31 + i * 17) % V);
    }
    float *lg = pd_malloc(sizeof(float) * 64 * (size_t)V);
    /* extend: request r's prompt in chunks of 13 + r */
    for (int r = 0; r < M_REQS; r++) {
        int done = 0, len = M_PROMPT - r * 5;
        while (done < len) {
            int c = 13 + r < len - done ? 13 + r : len - done;
            struct pd_model_seq s = {.tokens = prompt[r] + done,
                                     .n_new = c,
                                     .n_cached = done,
                                     .pages = pages[r],
                                     .n_pages = 8};
            CHECK_OK(pd_model_extend(m, &kv, &s, 1, false, lg));
            done += c;
        }
        tok[r] = (int32_t)((r * 7) % V);
    }
    int len[M_REQS];
    for (int r = 0; r < M_REQS; r++)
        len[r] = M_PROMPT - r * 5;
    static const int batch_of_step[M_STEPS] = {5, 5, 3, 1, 1, 5, 3, 2, 5, 5, 1, 4};
    for (int st = 0; st < M_STEPS; st++) {
        struct pd_model_seq seqs[M_REQS];
        int nb = batch_of_step[st];
        for (int r = 0; r < nb; r++)
            seqs[r] = (struct pd_model_seq){
                .tokens = &tok[r], .n_new = 1, .n_cached = len[r], .pages = pages[r], .n_pages = 8};
        CHECK_OK(pd_model_decode(m, &kv, seqs, nb, lg));
        for (int r = 0; r < nb; r++) {
            memcpy(logits + ((size_t)st * M_REQS + r) * V, lg + (size_t)r * V,
                   sizeof(float) * (size_t)V);
            /* next token: a fixed function of the step, so both backends feed the same ids */
            tok[r] = (int32_t)((st * 13 + r * 3 + 1) % V);
            len[r]++;
        }
    }
    pd_free(lg);
    pd_kv_pool_free(&kv);
    pd_model_free(m);
}

static double rel(const float *a, const float *b, size_t n) {
    double d = 0, mx = 1e-30;
    for (size_t i = 0; i < n; i++) {
        double x = fabs((double)a[i] - b[i]);
        d = x != x ? INFINITY : (x > d ? x : d);
        mx = fabs(b[i]) > mx ? fabs(b[i]) : mx;
    }
    return d / mx;
}

static void test_models(void) {
    static const enum pd_arch archs[] = {PD_ARCH_LLAMA, PD_ARCH_QWEN2, PD_ARCH_QWEN3};
    for (size_t ai = 0; ai < PD_ARRAY_LEN(archs); ai++) {
        for (int wt = 0; wt < 3; wt++) {
            /* f32; bf16 weights and KV (auto on a bf16 model); f32 weights with an fp8 KV */
            enum pd_dtype dt = wt == 1 ? PD_DTYPE_BF16 : PD_DTYPE_F32;
            enum pd_dtype kvt = wt == 0 ? PD_DTYPE_F32 : wt == 1 ? PD_DTYPE_BF16 : PD_DTYPE_F8E4M3;
            struct pd_model_config cfg = model_config(archs[ai]);
            struct fake_ckpt *ck = pd_calloc(1, sizeof(*ck));
            fake_ckpt_weights(&cfg, dt, 0.15f, frand, ck);
            size_t n = (size_t)M_STEPS * M_REQS * (size_t)cfg.vocab_size;
            float *lc = pd_calloc(n, 4), *lg = pd_calloc(n, 4), *le = pd_calloc(n, 4);
            struct pd_backend *bc = NULL, *bg = NULL, *bge = NULL;
            struct pd_backend_opts oc = {.kind = PD_BACKEND_CPU, .threads = 2};
            struct pd_backend_opts og = {.kind = harness ? PD_BACKEND_CPU : PD_BACKEND_CUDA,
                                         .threads = 2};
            CHECK_OK(pd_backend_new(&oc, &bc));
            CHECK_OK(pd_backend_new(&og, &bg));
            CHECK_OK(pd_backend_new(&og, &bge));
            if (!harness)
                pd_backend_cuda_set_graphs(bge, false);
            model_run(bc, &cfg, ck, kvt, lc);
            model_run(bg, &cfg, ck, kvt, lg);
            model_run(bge, &cfg, ck, kvt, le);
            struct pd_backend_cuda_stats sg, se;
            gpu_stats(bg, &sg);
            gpu_stats(bge, &se);
            double e_cpu = rel(lg, lc, n), e_graph = rel(lg, le, n);
            /* bf16: GEMM inputs rounded to bf16 on the GPU; fp8 KV: a K or V element whose f32
             * value differs in the last bits between the backends may round to the neighbouring
             * fp8 value (2^-4 apart relative for e4m3) */
            double tol = wt ? 5e-2 : 1e-4;
            printf("model arch %d %s kv %s: gpu vs cpu %.3g, graph vs eager %.3g, graphs "
                   "captured %lld launched %lld of %lld steps\n",
                   (int)archs[ai], pd_dtype_name(dt), pd_dtype_name(kvt), e_cpu, e_graph,
                   (long long)sg.graph_captures, (long long)sg.graph_launches, (long long)sg.steps);
            CHECK(e_cpu < tol);
            CHECK(e_graph < 1e-4);
            /* buckets 8, 4, 1, 2 (batch 5, 3, 1, 2 and 4) are each captured once */
            if (!harness) {
                CHECK_INT(sg.graph_captures, 4);
                CHECK_INT(sg.graph_launches, M_STEPS);
                CHECK_INT(se.graph_launches, 0);
            }
            pd_backend_free(bc);
            pd_backend_free(bg);
            pd_backend_free(bge);
            pd_free(lc);
            pd_free(lg);
            pd_free(le);
            fake_ckpt_free(ck);
            pd_free(ck);
        }
    }
}

/* Decode through the large graph buckets: 256 requests of a tiny model, decode batches of 256,
 * 100, 17 and 256 again (buckets 256, 128, 24, 256): the padded steps' logits equal eager
 * launches' (1e-4: the same kernels on the same data, only the padding rows differ) and the cpu
 * backend's (f32 weights and pool: 1e-4, as test_models), each bucket captured once. Fills
 * the 256-request metadata, 256 x 2 pages of page table and the widest fixed-split plans. */
#define BB_REQS 256
#define BB_STEPS 4

static void big_batch_run(struct pd_backend *be, const struct pd_model_config *cfg,
                          struct fake_ckpt *ck, float *logits) {
    static const int batch_of_step[BB_STEPS] = {256, 100, 17, 256};
    struct pd_model *m = NULL;
    struct pd_kv_pool kv = {0};
    struct pd_model_opts mo = {.max_tokens = 256, .max_reqs = BB_REQS, .page_size = 16};
    CHECK_OK(pd_model_new(be, cfg, fake_ckpt_find, ck, &mo, &m));
    if (!m)
        return;
    struct pd_kv_pool_opts ko = pd_model_kv_opts(m, PD_DTYPE_F32);
    ko.n_pages = 2 * BB_REQS + 8;
    CHECK_OK(pd_kv_pool_init(&kv, be, &ko));
    int V = cfg->vocab_size;
    static int32_t pages[BB_REQS][2], prompt[BB_REQS][16], tok[BB_REQS];
    static int len[BB_REQS];
    static struct pd_model_seq seqs[BB_REQS];
    for (int r = 0; r < BB_REQS; r++) {
        pages[r][0] = (int32_t)(2 * BB_REQS + 7 - 2 * r); /* descending, interleaved */
        pages[r][1] = (int32_t)(2 * BB_REQS + 6 - 2 * r);
        len[r] = 5 + r % 11;
        for (int i = 0; i < len[r]; i++)
            prompt[r][i] = (int32_t)((r * 31 + i * 17) % V);
        tok[r] = (int32_t)((r * 7) % V);
    }
    float *lg = pd_malloc(sizeof(float) * BB_REQS * (size_t)V);
    for (int r0 = 0; r0 < BB_REQS; r0 += 16) { /* 16 prompts a step: at most 240 tokens */
        for (int r = r0; r < r0 + 16; r++)
            seqs[r - r0] = (struct pd_model_seq){.tokens = prompt[r],
                                                 .n_new = len[r],
                                                 .n_cached = 0,
                                                 .pages = pages[r],
                                                 .n_pages = 2};
        CHECK_OK(pd_model_extend(m, &kv, seqs, 16, false, lg));
    }
    for (int st = 0; st < BB_STEPS; st++) {
        int nb = batch_of_step[st];
        for (int r = 0; r < nb; r++)
            seqs[r] = (struct pd_model_seq){
                .tokens = &tok[r], .n_new = 1, .n_cached = len[r], .pages = pages[r], .n_pages = 2};
        CHECK_OK(pd_model_decode(m, &kv, seqs, nb, lg));
        for (int r = 0; r < nb; r++) {
            memcpy(logits + ((size_t)st * BB_REQS + r) * V, lg + (size_t)r * V,
                   sizeof(float) * (size_t)V);
            tok[r] = (int32_t)((st * 13 + r * 3 + 1) % V);
            len[r]++;
        }
    }
    pd_free(lg);
    pd_kv_pool_free(&kv);
    pd_model_free(m);
}

static void test_models_big_batch(void) {
    struct pd_model_config cfg = model_config(PD_ARCH_LLAMA);
    struct fake_ckpt *ck = pd_calloc(1, sizeof(*ck));
    fake_ckpt_weights(&cfg, PD_DTYPE_F32, 0.15f, frand, ck);
    size_t n = (size_t)BB_STEPS * BB_REQS * (size_t)cfg.vocab_size;
    float *lc = pd_calloc(n, 4), *lg = pd_calloc(n, 4), *le = pd_calloc(n, 4);
    struct pd_backend *bc = NULL, *bg = NULL, *bge = NULL;
    struct pd_backend_opts oc = {.kind = PD_BACKEND_CPU, .threads = 2};
    struct pd_backend_opts og = {.kind = harness ? PD_BACKEND_CPU : PD_BACKEND_CUDA, .threads = 2};
    CHECK_OK(pd_backend_new(&oc, &bc));
    CHECK_OK(pd_backend_new(&og, &bg));
    CHECK_OK(pd_backend_new(&og, &bge));
    if (!harness)
        pd_backend_cuda_set_graphs(bge, false);
    big_batch_run(bc, &cfg, ck, lc);
    big_batch_run(bg, &cfg, ck, lg);
    big_batch_run(bge, &cfg, ck, le);
    struct pd_backend_cuda_stats sg;
    gpu_stats(bg, &sg);
    double e_cpu = rel(lg, lc, n), e_graph = rel(lg, le, n);
    printf("  batch 256/100/17/256: gpu vs cpu %.3g, graph vs eager %.3g, graphs captured %lld "
           "launched %lld\n",
           e_cpu, e_graph, (long long)sg.graph_captures, (long long)sg.graph_launches);
    CHECK(e_cpu < 1e-4);
    CHECK(e_graph < 1e-4);
    if (!harness) {
        CHECK_INT(sg.graph_captures, 3); /* buckets 256, 128, 24 */
        CHECK_INT(sg.graph_launches, BB_STEPS);
    }
    pd_backend_free(bc);
    pd_backend_free(bg);
    pd_backend_free(bge);
    pd_free(lc);
    pd_free(lg);
    pd_free(le);
    fake_ckpt_free(ck);
    pd_free(ck);
}

/* ---- kernels outside the op table: page copy/gather and the greedy argmax ---- */

static void test_page_copy(void) {
    static const int counts[] = {0, 1, 3, 50};
    static const size_t page_bytes[] = {16, 4096 + 16, 65536};
    for (size_t bi = 0; bi < PD_ARRAY_LEN(page_bytes); bi++)
        for (size_t ci = 0; ci < PD_ARRAY_LEN(counts); ci++) {
            int n = counts[ci], n_pages = 64;
            size_t pb = page_bytes[bi], bytes = pb * (size_t)n_pages;
            unsigned char *h = pd_malloc(bytes), *back = pd_malloc(bytes);
            for (size_t i = 0; i < bytes; i++)
                h[i] = (unsigned char)(frand() * 127);
            void *src, *dst, *stage;
            int32_t *ids;
            CHECK(cudaMalloc(&src, bytes) == cudaSuccess &&
                  cudaMalloc(&dst, bytes) == cudaSuccess &&
                  cudaMalloc(&stage, bytes) == cudaSuccess &&
                  cudaMalloc((void **)&ids, 2 * 64 * 4) == cudaSuccess);
            int32_t hid[128];
            for (int i = 0; i < n; i++) {
                hid[i] = (int32_t)((i * 37 + 5) % n_pages);       /* source pages */
                hid[64 + i] = (int32_t)((i * 11 + 60) % n_pages); /* destination pages */
            }
            cudaMemcpy(src, h, bytes, cudaMemcpyHostToDevice);
            cudaMemset(dst, 0, bytes);
            cudaMemcpy(ids, hid, sizeof(hid), cudaMemcpyHostToDevice);
            /* gather to a staging run, then scatter from it: pages end up at their new ids */
            struct pd_kernel_page_copy_params g = {stage, src, NULL, ids, n, pb};
            struct pd_kernel_page_copy_params sc = {dst, stage, ids + 64, NULL, n, pb};
            CHECK_OK(pd_kernel_page_copy(&g, 0));
            CHECK_OK(pd_kernel_page_copy(&sc, 0));
            CHECK(cudaMemcpy(back, dst, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
            bool ok = true;
            for (int i = 0; i < n; i++)
                ok &= memcmp(back + (size_t)hid[64 + i] * pb, h + (size_t)hid[i] * pb, pb) == 0;
            CHECK(ok);
            /* pool to pool in one call */
            cudaMemset(dst, 0, bytes);
            struct pd_kernel_page_copy_params pp = {dst, src, ids + 64, ids, n, pb};
            CHECK_OK(pd_kernel_page_copy(&pp, 0));
            CHECK(cudaMemcpy(back, dst, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
            ok = true;
            for (int i = 0; i < n; i++)
                ok &= memcmp(back + (size_t)hid[64 + i] * pb, h + (size_t)hid[i] * pb, pb) == 0;
            CHECK(ok);
            cudaFree(src);
            cudaFree(dst);
            cudaFree(stage);
            cudaFree(ids);
            pd_free(h);
            pd_free(back);
        }
}

static void test_argmax(void) {
    static const int vocabs[] = {1, 7, 1000, 1025, 151936};
    static const int rows_list[] = {0, 1, 5};
    for (size_t vi = 0; vi < PD_ARRAY_LEN(vocabs); vi++)
        for (size_t ri = 0; ri < PD_ARRAY_LEN(rows_list); ri++) {
            int V = vocabs[vi], R = rows_list[ri];
            size_t n = (size_t)V * R;
            float *h = pd_malloc(n * 4 + 4), *d, *lp;
            int32_t *ids, hid[8] = {0};
            float hlp[8] = {0};
            for (size_t i = 0; i < n; i++)
                h[i] = 8.0f * frand();
            for (int r = 0; r < R; r++) /* a tie: the lower id must win */
                if (V > 3)
                    h[(size_t)r * V + 3] = h[(size_t)r * V + V - 1] = 9.0f;
            CHECK(cudaMalloc((void **)&d, n * 4 + 4) == cudaSuccess &&
                  cudaMalloc((void **)&ids, 32) == cudaSuccess &&
                  cudaMalloc((void **)&lp, 32) == cudaSuccess);
            cudaMemcpy(d, h, n * 4, cudaMemcpyHostToDevice);
            size_t sb = pd_kernel_argmax_scratch_bytes(R, V);
            void *scratch = NULL;
            CHECK(cudaMalloc(&scratch, sb + 16) == cudaSuccess);
            struct pd_kernel_argmax_params p = {d, R, V, ids, lp, scratch, sb};
            CHECK_OK(pd_kernel_argmax(&p, 0));
            cudaMemcpy(hid, ids, 32, cudaMemcpyDeviceToHost);
            cudaMemcpy(hlp, lp, 32, cudaMemcpyDeviceToHost);
            for (int r = 0; r < R; r++) {
                const float *l = h + (size_t)r * V;
                int b = 0;
                for (int i = 1; i < V; i++)
                    if (l[i] > l[b])
                        b = i;
                double z = 0;
                for (int i = 0; i < V; i++)
                    z += exp((double)l[i] - l[b]);
                CHECK_INT(hid[r], b);
                CHECK_DBL(hlp[r], -log(z), 1e-4);
            }
            cudaFree(scratch);
            cudaFree(d);
            cudaFree(ids);
            cudaFree(lp);
            pd_free(h);
        }
}

/* pd_backend_argmax, the greedy fast path the decode engine takes: the cuda backend's ids
 * equal the cpu backend's (the host sampler's rule) and logprobs agree, over rows up to the
 * reserved max_tokens. */
static void test_backend_argmax(void) {
    const int V = 1000, R = lim.max_tokens < 64 ? lim.max_tokens : 64;
    struct dual x = dual_new((size_t)V * R * 4);
    dual_fill(&x, 8.0f);
    float *xc = x.c;
    xc[5] = xc[700] = 50.0f; /* row 0: a tie */
    CHECK_OK(pd_backend_upload(gpu, x.g, x.c, x.bytes));
    int32_t ic[64], ig[64];
    float lc[64], lg[64];
    CHECK_OK(pd_backend_argmax(cpu, x.c, R, V, ic, lc));
    CHECK_OK(pd_backend_argmax(gpu, x.g, R, V, ig, lg));
    CHECK_INT(ig[0], 5);
    for (int r = 0; r < R; r++) {
        CHECK_INT(ig[r], ic[r]);
        CHECK_DBL(lg[r], lc[r], 1e-4);
    }
    if (!harness) /* the cuda backend's own limit (its result buffers are sized at reserve) */
        CHECK(pd_backend_argmax(gpu, x.g, lim.max_tokens + 1, V, ig, lg) == PD_ERANGE);
    dual_free(&x);
}

/* pd_backend_sample: greedy rows pick exactly the argmax; drawn rows follow the exact
 * distribution pd_sampling_choose draws from (softmax at the temperature, cut to top-k, the
 * top-p prefix and min-p, renormalized): thousands of draws of one row per configuration, over
 * vocabularies up to Qwen's, every drawn token inside that distribution's support, and the
 * counts within a χ² bound of it. The GPU's draws (FlashInfer's sampler) need not be the host's
 * tokens; the harness run (cpu backend as "gpu") checks this test against the host sampler
 * itself. Logprobs are the raw row's log-softmax of the chosen token. A call repeated with the
 * same u gives the same tokens (a seeded request repeats). */
static uint64_t urng = 777;
static double urand(void) { /* [0, 1), 53 bits, as the host sampler's stream */
    urng = urng * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t a = urng >> 11;
    urng = urng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)((a ^ (urng >> 32)) & ((1ull << 53) - 1)) * 0x1.0p-53;
}

static const float *sort_keys;
static int by_key_desc(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    float kx = sort_keys[x], ky = sort_keys[y];
    if (kx != ky)
        return kx > ky ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* p[t] = the probability pd_sampling_choose draws token t with from logits l (penalties
 * already applied) under q: model/sampling.c's draw() as a distribution instead of a draw.
 * *min_kept (if not NULL): the smallest scaled logit (l / T) kept. */
static void ref_dist(const struct pd_sample_row *q, const float *l, int V, double *p,
                     float *min_kept) {
    float *sl = pd_malloc((size_t)V * 4);
    int32_t *idx = pd_malloc((size_t)V * 4);
    float inv_t = 1.0f / q->temperature;
    for (int t = 0; t < V; t++) {
        sl[t] = l[t] * inv_t;
        idx[t] = t;
        p[t] = 0;
    }
    sort_keys = sl;
    qsort(idx, (size_t)V, 4, by_key_desc);
    float mx = sl[idx[0]];
    double z = 0;
    for (int t = 0; t < V; t++)
        z += exp((double)(sl[t] - mx));
    int k = q->top_k > 0 && q->top_k < V ? q->top_k : V, keep = 0;
    double before = 0;
    float *prob = pd_malloc((size_t)V * 4);
    for (int i = 0; i < k && !(before > q->top_p * z); i++) {
        prob[i] = (float)(exp((double)(sl[idx[i]] - mx)) / z);
        before += prob[i] * z;
        keep = i + 1;
    }
    double total = 0;
    int n = 0;
    for (int i = 0; i < keep && !(prob[i] < q->min_p * prob[0]); i++) {
        total += prob[i];
        n = i + 1;
    }
    for (int i = 0; i < n; i++)
        p[idx[i]] = prob[i] / total;
    if (min_kept)
        *min_kept = sl[idx[n - 1]];
    pd_free(prob);
    pd_free(idx);
    pd_free(sl);
}

/* χ² of counts (n draws) against p over the tokens expected at least 5 times, the rest pooled
 * into one bin; *outside = draws of a token p gives 0. Returns χ² / the bound for its degrees of
 * freedom (mean + 8 standard deviations + 10): < 1 passes, a miss by chance is out of reach. */
static double chi2_ratio(const double *p, const int *counts, int V, int n, int *outside,
                         int *bins_out) {
    double chi2 = 0, rest_exp = 0, rest_obs = 0;
    int bins = 0;
    *outside = 0;
    for (int t = 0; t < V; t++) {
        if (p[t] == 0) {
            *outside += counts[t];
            continue;
        }
        double e = p[t] * n;
        if (e >= 5) {
            chi2 += (counts[t] - e) * (counts[t] - e) / e;
            bins++;
        } else {
            rest_exp += e;
            rest_obs += counts[t];
        }
    }
    if (rest_exp >= 5) {
        chi2 += (rest_obs - rest_exp) * (rest_obs - rest_exp) / rest_exp;
        bins++;
    }
    int df = bins > 1 ? bins - 1 : 1;
    *bins_out = bins;
    return chi2 / (df + 8.0 * sqrt(2.0 * df) + 10.0);
}

static double host_lse(const float *l, int V) {
    float mx = l[0];
    for (int t = 1; t < V; t++)
        mx = l[t] > mx ? l[t] : mx;
    double s = 0;
    for (int t = 0; t < V; t++)
        s += exp((double)(l[t] - mx));
    return mx + log(s);
}

static void test_backend_sample(void) {
    static const struct {
        int V, kind; /* kind: 0 realistic spread, 1 peaked, 2 coarse (ties) */
        float t;
        int k;
        float p, mp;
        int calls;
    } cfg[] = {
        {1000, 0, 0.7f, 0, 0.9f, 0.0f, 16},  {1000, 0, 1.0f, 50, 1.0f, 0.0f, 16},
        {1000, 1, 1.3f, 0, 1.0f, 0.1f, 16},  {1000, 0, 0.7f, 40, 0.9f, 0.05f, 16},
        {1000, 2, 0.2f, 0, 1.0f, 0.0f, 16},  {1000, 0, 1.0f, 5, 0.5f, 0.0f, 16},
        {7, 0, 1.0f, 0, 1.0f, 0.0f, 8},      {32000, 1, 0.8f, 0, 0.95f, 0.0f, 8},
        {151936, 1, 0.7f, 0, 0.9f, 0.0f, 8}, {151936, 0, 1.0f, 50, 0.95f, 0.02f, 8},
        {1000, 0, 0.0f, 0, 1.0f, 0.0f, 2},   {151936, 1, 1.0f, 1, 1.0f, 0.0f, 2},
    };
    const int R = lim.max_tokens;
    static struct pd_sample_row row[257];
    int32_t ig[256], ig2[256], a[256];
    float lg[256], lg2[256], al[256];
    int failed = 0, draws_total = 0;
    for (size_t ci = 0; ci < PD_ARRAY_LEN(cfg); ci++) {
        int V = cfg[ci].V;
        struct dual x = dual_new((size_t)V * R * 4);
        float *xc = x.c;
        for (int t = 0; t < V; t++) {
            float f = frand();
            xc[t] = cfg[ci].kind == 0   ? 10.0f * f * fabsf(f)
                    : cfg[ci].kind == 1 ? 4.0f * f + (t % 97 == 3 ? 12.0f : 0.0f)
                                        : floorf(8.0f * f) * 0.75f;
        }
        for (int r = 1; r < R; r++) /* the same row R times: R draws a call */
            memcpy(xc + (size_t)r * V, xc, (size_t)V * 4);
        CHECK_OK(pd_backend_upload(gpu, x.g, x.c, x.bytes));
        double lse = host_lse(xc, V);
        struct pd_sample_row q = {
            .temperature = cfg[ci].t, .top_k = cfg[ci].k, .top_p = cfg[ci].p, .min_p = cfg[ci].mp};
        bool greedy = pd_sampling_row_greedy(&q);
        double *p = pd_malloc((size_t)V * sizeof(double));
        int *counts = pd_calloc((size_t)V, sizeof(int));
        if (!greedy)
            ref_dist(&q, xc, V, p, NULL);
        CHECK_OK(pd_backend_argmax(cpu, x.c, 1, V, a, al));
        /* the harness checks this test, not a sampler: a quarter of the draws keeps the cpu
         * backend's sampling of 151,936-token rows inside the ASan build's time limit */
        int calls = harness ? (cfg[ci].calls + 3) / 4 : cfg[ci].calls;
        for (int call = 0; call < calls; call++) {
            for (int r = 0; r < R; r++) {
                row[r] = q;
                row[r].u = greedy ? 0 : urand();
            }
            CHECK_OK(pd_backend_sample(gpu, x.g, R, V, row, ig, lg));
            for (int r = 0; r < R; r++) {
                CHECK(ig[r] >= 0 && ig[r] < V);
                if (ig[r] < 0 || ig[r] >= V)
                    break;
                counts[ig[r]]++;
                if (greedy)
                    CHECK_INT(ig[r], a[0]);
                CHECK_DBL(lg[r], xc[ig[r]] - lse, 1e-4);
            }
            if (call == 0) { /* the same u again: the same tokens */
                CHECK_OK(pd_backend_sample(gpu, x.g, R, V, row, ig2, lg2));
                for (int r = 0; r < R; r++)
                    CHECK_INT(ig2[r], ig[r]);
            }
        }
        int n = calls * R;
        draws_total += n;
        if (!greedy) {
            int outside = 0, bins = 0;
            double ratio = chi2_ratio(p, counts, V, n, &outside, &bins);
            printf("  sample V %d T %g k %d p %g min_p %g: %d draws, %d bins, chi2/bound %.3f, "
                   "%d outside\n",
                   V, q.temperature, q.top_k, q.top_p, q.min_p, n, bins, ratio, outside);
            CHECK_INT(outside, 0);
            CHECK(ratio < 1.0);
            failed += outside > 0 || !(ratio < 1.0);
        }
        pd_free(p);
        pd_free(counts);
        dual_free(&x);
    }
    printf("  %d draws, %d configurations off their distribution\n", draws_total, failed);
    /* limits and bad rows */
    struct dual x = dual_new(1000 * 4);
    dual_fill(&x, 1.0f);
    row[0] = (struct pd_sample_row){.temperature = 1, .top_p = 1, .u = 0.5};
    for (int i = 1; i <= 256; i++)
        row[i] = row[0];
    if (!harness) /* the cuda backend's own limit, as for argmax */
        CHECK(pd_backend_sample(gpu, x.g, lim.max_tokens + 1, 1000, row, ig, lg) == PD_ERANGE);
    row[0].u = 1.5;
    CHECK(pd_backend_sample(gpu, x.g, 1, 1000, row, ig, lg) == PD_EINVAL);
    dual_free(&x);
}

/* pd_backend_sample with penalty slots and top-n logprobs: the cuda backend (penalties applied
 * on the fly from the slot's state on the device, the chosen token counted there, the raw
 * row's top-n gathered by a radix search) picks exactly the cpu backend's tokens on greedy rows
 * and, on drawn rows, tokens inside the penalized row's filtered distribution, step after step
 * (the cpu backend's slot then follows the gpu's tokens), top-n ids equal and logprobs agree to
 * rounding, over vocabularies up to Qwen's, penalties on and off, top-n 0/1/5/20, greedy and
 * sampled rows mixed in one call, coarse rows full of ties, prompts with ids outside the
 * vocabulary. Then the perf line: µs per decode step (parameters up, choice, results down) for
 * batches of 64 and 256 over 151936 logits, plain and with penalties + top-20. */
static const struct {
    float t;
    int k;
    float p, mp, rep, freq, pres;
    int nlp;
} pcfg[] = {
    {0.0f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0},    {0.0f, 0, 1.0f, 0.0f, 1.3f, 0.0f, 0.0f, 5},
    {0.8f, 0, 1.0f, 0.0f, 1.0f, 0.5f, 0.3f, 1},    {1.0f, 40, 0.9f, 0.0f, 1.2f, 0.4f, -0.5f, 20},
    {0.7f, 0, 0.95f, 0.05f, 0.8f, -0.3f, 0.2f, 0}, {1.3f, 5, 1.0f, 0.1f, 1.0f, 0.0f, 1.0f, 5},
    {0.0f, 1, 1.0f, 0.0f, 1.0f, 1.5f, 0.0f, 20},   {0.5f, 0, 0.5f, 0.0f, 2.0f, 2.0f, 2.0f, 1},
    {1.0f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 20},   {0.0f, 0, 1.0f, 0.0f, 1.0f, -2.0f, -2.0f, 0},
};

enum { PEN_SLOTS = 256, PEN_MAX_IDS = 128 };

static void pen_pair_new(int V, struct pd_backend **c2, struct pd_backend **g2) {
    struct pd_backend_opts oc = {.kind = PD_BACKEND_CPU, .threads = 2};
    struct pd_backend_opts og = {.kind = harness ? PD_BACKEND_CPU : PD_BACKEND_CUDA, .threads = 2};
    CHECK_OK(pd_backend_new(&oc, c2));
    CHECK_OK(pd_backend_new(&og, g2));
    CHECK_OK(pd_backend_reserve(*c2, &lim));
    CHECK_OK(pd_backend_reserve(*g2, &lim));
    CHECK_OK(pd_backend_penalty_reserve(*c2, PEN_SLOTS, V, PEN_MAX_IDS));
    CHECK_OK(pd_backend_penalty_reserve(*g2, PEN_SLOTS, V, PEN_MAX_IDS));
}

static void pen_row(int r, struct pd_sample_row *row) {
    const int nc = (int)PD_ARRAY_LEN(pcfg);
    int c = r % nc;
    bool pen = pcfg[c].rep != 1 || pcfg[c].freq != 0 || pcfg[c].pres != 0;
    *row = (struct pd_sample_row){.temperature = pcfg[c].t,
                                  .top_k = pcfg[c].k,
                                  .top_p = pcfg[c].p,
                                  .min_p = pcfg[c].mp,
                                  .u = 0,
                                  .penalized = pen,
                                  .slot = (r * 5 + 1) % PEN_SLOTS,
                                  .repetition_penalty = pcfg[c].rep,
                                  .frequency_penalty = pcfg[c].freq,
                                  .presence_penalty = pcfg[c].pres,
                                  .n_logprobs = pcfg[c].nlp};
}

static double now_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void test_backend_sample_penalties(void) {
    static const int vocabs[] = {1, 7, 1000, 32003, 151936};
    static int32_t hist[256][PEN_MAX_IDS];
    static int n_hist[256], n_prompt[256];
    static struct pd_sample_row rowc[256], rowg[256];
    static struct pd_sample tc[256], tg[256];
    int32_t ic[256], ig[256];
    float lc[256], lg[256];
    int mismatch = 0, top_mismatch = 0, rows_total = 0, pen_changed = 0, outside = 0;
    for (size_t vi = 0; vi < PD_ARRAY_LEN(vocabs); vi++) {
        int V = vocabs[vi], R = V >= 100000 ? 64 : 96, steps = V >= 100000 ? 3 : 10;
        if (harness) { /* as in test_backend_sample: the test's own checks, in less time */
            R /= 2;
            steps = V >= 100000 ? 2 : 4;
        }
        struct pd_backend *c2, *g2;
        pen_pair_new(V, &c2, &g2);
        float *xc, *xg, *base = pd_malloc((size_t)V * R * 4), *buf = pd_malloc((size_t)V * 4);
        CHECK_OK(pd_backend_alloc(c2, (size_t)V * R * 4, (void **)&xc));
        CHECK_OK(pd_backend_alloc(g2, (size_t)V * R * 4, (void **)&xg));
        struct pd_sampling_scratch sc;
        CHECK_OK(pd_sampling_scratch_init(&sc, V));
        float *pl = pd_malloc((size_t)V * 4);
        double *pd = pd_malloc((size_t)V * sizeof(double));
        int32_t *cnt = pd_malloc((size_t)V * 4);
        bool *inp = pd_malloc((size_t)V);
        for (int r = 0; r < R; r++) {
            for (int t = 0; t < V; t++)
                base[(size_t)r * V + t] = 3.0f * frand() * fabsf(frand());
            pen_row(r, &rowc[r]);
            n_prompt[r] = 1 + r % 40;
            for (int i = 0; i < n_prompt[r]; i++)
                hist[r][i] = i % 9 == 8 ? (i % 2 ? -1 : V + 3) : (int32_t)(urand() * V);
            hist[r][n_prompt[r]] = (int32_t)(urand() * V); /* the prefill's token */
            n_hist[r] = n_prompt[r] + 1;
            if (rowc[r].penalized) {
                CHECK_OK(pd_backend_penalty_set(c2, rowc[r].slot, hist[r], n_prompt[r],
                                                hist[r] + n_prompt[r], 1));
                CHECK_OK(pd_backend_penalty_set(g2, rowc[r].slot, hist[r], n_prompt[r],
                                                hist[r] + n_prompt[r], 1));
            }
        }
        for (int step = 0; step < steps; step++) {
            for (int r = 0; r < R; r++) {
                for (int t = 0; t < V; t++) {
                    float v = base[(size_t)r * V + t] + 0.3f * frand();
                    xc[(size_t)r * V + t] = r % 3 == 0 ? floorf(v * 4.0f) * 0.25f : v;
                }
                rowc[r].u = pd_sampling_row_greedy(&rowc[r]) ? 0 : urand();
                rowc[r].top = &tc[r];
                rowg[r] = rowc[r];
                rowg[r].top = &tg[r];
            }
            CHECK_OK(pd_backend_upload(g2, xg, xc, (size_t)V * R * 4));
            CHECK_OK(pd_backend_sample(c2, xc, R, V, rowc, ic, lc));
            CHECK_OK(pd_backend_sample(g2, xg, R, V, rowg, ig, lg));
            for (int r = 0; r < R; r++) {
                const struct pd_sample_row *q = &rowc[r];
                bool greedy = pd_sampling_row_greedy(q);
                const float *raw = xc + (size_t)r * V;
                CHECK(ig[r] >= 0 && ig[r] < V);
                if (ig[r] < 0 || ig[r] >= V)
                    continue;
                CHECK_DBL(lg[r], raw[ig[r]] - host_lse(raw, V), 1e-4);
                if (!greedy) { /* inside the penalized row's filtered distribution */
                    memset(cnt, 0, (size_t)V * 4);
                    memset(inp, 0, (size_t)V);
                    for (int i = 0; q->penalized && i < n_hist[r]; i++) {
                        int32_t id = hist[r][i];
                        if (id >= 0 && id < V) {
                            if (i < n_prompt[r])
                                inp[id] = true;
                            else
                                cnt[id]++;
                        }
                    }
                    for (int t = 0; t < V; t++)
                        pl[t] = q->penalized ? pd_sampling_penalize(
                                                   raw[t], cnt[t], inp[t], q->repetition_penalty,
                                                   q->frequency_penalty, q->presence_penalty)
                                             : raw[t];
                    /* a draw outside is one below the last kept value: at an exact tie across
                     * the top-k / top-p cut (coarse rows) the host keeps the lower ids of the
                     * tie group, FlashInfer every token of it (as torch's top-k masking) */
                    float min_kept = 0;
                    ref_dist(q, pl, V, pd, &min_kept);
                    bool out = pd[ig[r]] == 0 && pl[ig[r]] * (1.0f / q->temperature) < min_kept;
                    if (out && outside < 5)
                        printf("  outside: V %d row %d (T %g k %d p %g min_p %g pen %d): token %d "
                               "scaled %g, last kept %g\n",
                               V, r, q->temperature, q->top_k, q->top_p, q->min_p, q->penalized,
                               ig[r], pl[ig[r]] * (1.0f / q->temperature), min_kept);
                    outside += out;
                }
                if (greedy && ig[r] != ic[r] && mismatch++ < 5)
                    printf("  penalized sample mismatch: V %d row %d (T %g k %d p %g min_p %g "
                           "rep %g freq %g pres %g u %.17g): gpu %d cpu %d\n",
                           V, r, q->temperature, q->top_k, q->top_p, q->min_p,
                           q->repetition_penalty, q->frequency_penalty, q->presence_penalty, q->u,
                           ig[r], ic[r]);
                if (greedy)
                    CHECK_DBL(lg[r], lc[r], 1e-4);
                int n = q->n_logprobs < V ? q->n_logprobs : V;
                if (n) {
                    CHECK_INT(tg[r].n_top, n);
                    CHECK_INT(tc[r].n_top, n);
                    for (int i = 0; i < n; i++) {
                        top_mismatch += tg[r].top_ids[i] != tc[r].top_ids[i];
                        CHECK_DBL(tg[r].top_logprobs[i], tc[r].top_logprobs[i], 1e-4);
                    }
                }
                if (q->penalized) {
                    memcpy(buf, xc + (size_t)r * V, (size_t)V * 4);
                    pen_changed += pd_sampling_choose(q, &sc, buf, V) != ic[r];
                }
                /* the history follows the gpu's tokens; a cpu slot that counted another token
                 * (a draw: other random numbers) is set to it. A history full (never within
                 * these steps) would leave both slots counting on alike. */
                if (n_hist[r] < PEN_MAX_IDS)
                    hist[r][n_hist[r]++] = ig[r];
                if (ig[r] != ic[r] && q->penalized)
                    CHECK_OK(pd_backend_penalty_set(c2, q->slot, hist[r], n_prompt[r],
                                                    hist[r] + n_prompt[r],
                                                    n_hist[r] - n_prompt[r]));
            }
            rows_total += R;
        }
        pd_sampling_scratch_free(&sc);
        pd_free(pl);
        pd_free(pd);
        pd_free(cnt);
        pd_free(inp);
        pd_backend_release(c2, xc);
        pd_backend_release(g2, xg);
        pd_free(base);
        pd_free(buf);
        pd_backend_free(c2);
        pd_backend_free(g2);
    }
    printf("  %d rows, penalties changed %d choices, %d draws outside their distribution\n",
           rows_total, pen_changed, outside);
    CHECK_INT(mismatch, 0);
    CHECK_INT(outside, 0);
    CHECK_INT(top_mismatch, 0);
    CHECK(pen_changed > 10);
}

/* The perf line of the device sampler through the backend op, as a decode step calls it. */
static void test_sample_perf(void) {
    const int V = 151936;
    struct pd_backend *c2, *g2;
    pen_pair_new(V, &c2, &g2);
    float *xg;
    CHECK_OK(pd_backend_alloc(g2, (size_t)V * 256 * 4, (void **)&xg));
    float *h = pd_malloc((size_t)V * 256 * 4);
    for (size_t i = 0; i < (size_t)V * 256; i++)
        h[i] = 8.0f * frand();
    CHECK_OK(pd_backend_upload(g2, xg, h, (size_t)V * 256 * 4));
    static struct pd_sample_row rows[256];
    static struct pd_sample top[256];
    int32_t ids[256];
    float lps[256];
    int32_t toks[64];
    for (int i = 0; i < 64; i++)
        toks[i] = (int32_t)(urand() * V);
    for (int s = 0; s < 256; s++)
        CHECK_OK(pd_backend_penalty_set(g2, s, toks, 32, toks + 32, 32));
    static const int batches[] = {64, 256};
    for (size_t bi = 0; bi < PD_ARRAY_LEN(batches); bi++)
        for (int full = 0; full < 2; full++) {
            int R = batches[bi];
            for (int r = 0; r < R; r++) {
                rows[r] = (struct pd_sample_row){.temperature = 0.7f, .top_p = 0.9f, .u = 0.5};
                if (full) {
                    rows[r].penalized = true;
                    rows[r].slot = r;
                    rows[r].repetition_penalty = 1.1f;
                    rows[r].frequency_penalty = 0.2f;
                    rows[r].presence_penalty = 0.1f;
                    rows[r].n_logprobs = 20;
                    rows[r].top = &top[r];
                }
            }
            CHECK_OK(pd_backend_sample(g2, xg, R, V, rows, ids, lps)); /* warm-up */
            const int reps = 10;
            double t0 = now_sec();
            for (int i = 0; i < reps; i++)
                CHECK_OK(pd_backend_sample(g2, xg, R, V, rows, ids, lps));
            double dt = (now_sec() - t0) / reps;
            printf("  perf: sample %3d x %d %-28s %9.1f us/step %10.0f rows/s\n", R, V,
                   full ? "T0.7 p0.9 + penalties + top20" : "T0.7 p0.9", dt * 1e6, R / dt);
        }
    pd_free(h);
    pd_backend_release(g2, xg);
    pd_backend_free(c2);
    pd_backend_free(g2);
}

int pd_bench_gpu_main(int argc, char **argv); /* bench_gpu.c: the perf mode */

int main(int argc, char **argv) {
    const char *hv = getenv("PD_GPU_TEST_HARNESS");
    harness = hv && strcmp(hv, "cpu") == 0;
    int n = 0;
    cudaError_t e = harness ? cudaSuccess : cudaGetDeviceCount(&n);
    if (!harness && (e != cudaSuccess || n == 0)) {
        /* the backend must say why, not "not built with CUDA" */
        struct pd_backend_opts o = {.kind = PD_BACKEND_CUDA};
        struct pd_backend *be = NULL;
        pd_error_clear();
        int rc = pd_backend_new(&o, &be);
        printf("SKIP: no CUDA device (%s); pd_backend_new says: %s\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "none listed", pd_error_msg());
        if (rc != PD_EUNSUPPORTED || !strstr(pd_error_msg(), "no CUDA device")) {
            fprintf(stderr, "FAIL: expected PD_EUNSUPPORTED 'no CUDA device', got %d\n", rc);
            return 1;
        }
        return 77;
    }
    if (argc > 1 && strcmp(argv[1], "--perf") == 0)
        return pd_bench_gpu_main(argc - 1, argv + 1);
    struct pd_backend_opts oc = {.kind = PD_BACKEND_CPU, .threads = 2};
    struct pd_backend_opts og = {.kind = harness ? PD_BACKEND_CPU : PD_BACKEND_CUDA, .threads = 2};
    if (pd_backend_new(&oc, &cpu) || pd_backend_new(&og, &gpu)) {
        fprintf(stderr, "FAIL: starting the backends: %s\n", pd_error_msg());
        return 1;
    }
    printf("gpu backend: %s\n", pd_backend_name(gpu));
    if (pd_backend_reserve(cpu, &lim) || pd_backend_reserve(gpu, &lim)) {
        fprintf(stderr, "FAIL: reserve: %s\n", pd_error_msg());
        return 1;
    }
    struct {
        const char *name;
        void (*fn)(void);
        bool device; /* needs the device itself: left out by the harness mode */
    } tests[] = {
        {"rmsnorm", test_rmsnorm, false},
        {"matmul", test_matmul, false},
        {"product_groups", test_product_groups, false},
        {"elementwise", test_elementwise, false},
        {"rope_embed_gather", test_rope_embed_gather, false},
        {"attention", test_attention, false},
        {"attention_high_pool", test_attention_high_pool, false},
        {"page_copy", test_page_copy, true},
        {"argmax", test_argmax, true},
        {"backend_argmax", test_backend_argmax, false},
        {"backend_sample", test_backend_sample, false},
        {"backend_sample_penalties", test_backend_sample_penalties, false},
        {"sample_perf", test_sample_perf, true},
        {"models", test_models, false},
        {"models_big_batch", test_models_big_batch, false},
    };
    const char *only = argc > 1 ? argv[1] : NULL;
    for (size_t i = 0; i < PD_ARRAY_LEN(tests); i++) {
        if (only && strcmp(only, tests[i].name) != 0)
            continue;
        if (harness && tests[i].device) {
            printf("SKIP %s (harness mode: needs the device)\n", tests[i].name);
            continue;
        }
        int before = pd_test_failures;
        tests[i].fn();
        printf("%s %s\n", pd_test_failures == before ? "PASS" : "FAIL", tests[i].name);
    }
    pd_backend_free(cpu);
    pd_backend_free(gpu);
    printf("%d checks, %d failed\n", pd_test_checks, pd_test_failures);
    return pd_test_failures ? 1 : 0;
}
