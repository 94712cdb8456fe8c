/*
 * test_backend_cpu.c — every cpu backend op against a plain double-precision reference, over
 * shapes that hit the edges: 1 row, row counts on both sides of the GEMV/GEMM switch, widths that
 * are not multiples of the vector width, bf16/f16/f32 weights, KV pages given out of order,
 * partial last pages, GQA groups of 1, 2 and 4, and 1 vs 3 threads.
 */
#include "pd_compare.h"
#include "pd_test.h"

#include "common/base/alloc.h"
#include "model/backend.h"
#include "model/cpu/backend_cpu.h" /* pd__cpu_softmax: the kernel itself, every length */
#include "model/sampling.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

static uint64_t rng_state = 42;
static float frand(void) { /* uniform in [-1, 1) */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* exact for the values we use: |x| < 1 rounded to 10 mantissa bits, normal range */
static uint16_t to_f16(float f, float *back) {
    if (f == 0.0f) {
        *back = 0.0f;
        return 0;
    }
    int e;
    float m = frexpf(fabsf(f), &e); /* f = m * 2^e, m in [0.5, 1) */
    if (e < -13)                    /* keep it normal */
        e = -13, m = 0.5f;
    int man = (int)lrintf((m * 2.0f - 1.0f) * 1024.0f);
    int ex = e - 1 + 15;
    if (man == 1024)
        man = 0, ex++;
    *back = (f < 0 ? -1.0f : 1.0f) * ldexpf(1.0f + (float)man / 1024.0f, ex - 15);
    return (uint16_t)((f < 0 ? 0x8000 : 0) | (ex << 10) | man);
}

static struct pd_backend *make(int threads) {
    struct pd_backend *be = NULL;
    struct pd_backend_opts o = {.kind = PD_BACKEND_CPU, .threads = threads};
    CHECK_OK(pd_backend_new(&o, &be));
    struct pd_backend_limits lim = {.max_tokens = 64,
                                    .max_reqs = 4,
                                    .max_pages = 64,
                                    .max_context = 128,
                                    .max_heads = 8,
                                    .max_head_dim = 32,
                                    .max_dim = 1100};
    CHECK_OK(pd_backend_reserve(be, &lim));
    return be;
}

/* A one-request batch of n tokens at positions 0..n-1, pages identity, for row ops. */
static void simple_batch(struct pd_backend *be, int n, const int32_t *ids) {
    int32_t pos[64], slots[64], start[2] = {0, n}, kvlen[1] = {n}, pstart[2] = {0, 8}, pt[8];
    for (int i = 0; i < n; i++)
        pos[i] = slots[i] = i;
    for (int i = 0; i < 8; i++)
        pt[i] = i;
    struct pd_batch_plan p = {1, n, ids, pos, slots, start, kvlen, pstart, pt, 0, NULL};
    CHECK_OK(pd_backend_set_batch(be, &p));
}

static void test_matmul(void) {
    static const int rows_list[] = {1, 3, 5, 16, 17, 40, 64, 300};
    static const enum pd_dtype types[] = {PD_DTYPE_F32, PD_DTYPE_BF16, PD_DTYPE_F16};
    for (int th = 1; th <= 3; th += 2) {
        struct pd_backend *be = make(th);
        for (size_t ti = 0; ti < 3; ti++) {
            for (size_t ri = 0; ri < PD_ARRAY_LEN(rows_list); ri++) {
                /* the last two span several packed k blocks of the prefill product; the last
                 * also several chunks of activation rows (AMX: 256), the second one of 3 tiles */
                int rows = rows_list[ri],
                    m = ri == 6   ? 100
                        : ri == 7 ? 209
                                  : 291,
                    k = ri == 6   ? 300
                        : ri == 7 ? 1100
                                  : 37 + 8 * (int)ri;
                float *x = pd_malloc(sizeof(float) * rows * k),
                      *wf = pd_malloc(sizeof(float) * m * k);
                float *y = pd_malloc(sizeof(float) * rows * m), bias[291];
                uint16_t *wh = pd_malloc(2 * (size_t)m * k);
                for (int i = 0; i < rows * k; i++)
                    x[i] = frand();
                for (int i = 0; i < m * k; i++) {
                    float v = frand();
                    if (types[ti] == PD_DTYPE_BF16) {
                        wh[i] = to_bf16(v);
                        wf[i] = from_bf16(wh[i]);
                    } else if (types[ti] == PD_DTYPE_F16) {
                        wh[i] = to_f16(v, &wf[i]);
                    } else {
                        wf[i] = v;
                    }
                }
                for (int j = 0; j < m; j++)
                    bias[j] = frand();
                struct pd_tensor w, b;
                CHECK_OK(pd_backend_weight(
                    be, types[ti], m, k, types[ti] == PD_DTYPE_F32 ? (void *)wf : (void *)wh, &w));
                CHECK_OK(pd_backend_weight(be, PD_DTYPE_F32, 1, m, bias, &b));
                pd_backend_matmul(be, x, rows, &w, &b, y);
                /* f32 sums of exact products: the error is a few f32 roundings of the sum of
                 * the terms' sizes (products rounded to bf16's 8 bits would be ~1000x that) */
                double maxerr = 0, maxrel = 0;
                for (int i = 0; i < rows; i++)
                    for (int j = 0; j < m; j++) {
                        double s = bias[j], mag = fabs(bias[j]);
                        for (int c = 0; c < k; c++) {
                            s += (double)x[i * k + c] * wf[j * k + c];
                            mag += fabs((double)x[i * k + c] * wf[j * k + c]);
                        }
                        maxerr = pd_err_max(maxerr, fabs(s - y[i * m + j]));
                        maxrel = pd_err_max(maxrel, fabs(s - y[i * m + j]) / mag);
                    }
                CHECK(maxerr < 1e-4 && maxrel < 1e-6);
                if (maxerr >= 1e-4 || maxrel >= 1e-6 || getenv("PD_TEST_VERBOSE"))
                    fprintf(stderr, "  dtype %d rows %d threads %d: err %g, %g of the terms\n",
                            (int)types[ti], rows, th, maxerr, maxrel);
                /* the GEMV route (a decode batch): every row to the bit as it would be alone, so
                 * a request's tokens do not depend on who else is in the batch */
                if (rows <= 32) {
                    float *y1 = pd_malloc(sizeof(float) * m);
                    int differ = 0;
                    for (int i = 0; i < rows; i++) {
                        pd_backend_matmul(be, x + (size_t)i * k, 1, &w, &b, y1);
                        differ += memcmp(y1, y + (size_t)i * m, sizeof(float) * m) != 0;
                    }
                    CHECK_INT(differ, 0);
                    pd_free(y1);
                }
                pd_free(x);
                pd_free(wf);
                pd_free(wh);
                pd_free(y);
            }
        }
        pd_backend_free(be);
    }
}

static void test_rows_ops(void) {
    struct pd_backend *be = make(2);
    int n = 5, dim = 19, vocab = 7;
    int32_t ids[5] = {3, 0, 6, 3, 1};
    simple_batch(be, n, ids);
    uint16_t table[7 * 19];
    float tablef[7 * 19], out[5 * 19], w[19];
    for (int i = 0; i < vocab * dim; i++)
        tablef[i] = from_bf16(table[i] = to_bf16(frand()));
    for (int i = 0; i < dim; i++)
        w[i] = frand();
    struct pd_tensor t, wt;
    CHECK_OK(pd_backend_weight(be, PD_DTYPE_BF16, vocab, dim, table, &t));
    CHECK_OK(pd_backend_weight(be, PD_DTYPE_F32, 1, dim, w, &wt));
    pd_backend_embed(be, &t, out);
    int same = 1;
    for (int i = 0; i < n; i++)
        for (int d = 0; d < dim; d++)
            same &= out[i * dim + d] == tablef[ids[i] * dim + d];
    CHECK(same);

    float normed[5 * 19];
    pd_backend_rmsnorm(be, out, &wt, n, dim, 1e-6f, normed);
    double err = 0;
    for (int i = 0; i < n; i++) {
        double ss = 0;
        for (int d = 0; d < dim; d++)
            ss += (double)out[i * dim + d] * out[i * dim + d];
        double r = 1.0 / sqrt(ss / dim + 1e-6);
        for (int d = 0; d < dim; d++)
            err = pd_err_max(err, fabs(out[i * dim + d] * r * w[d] - normed[i * dim + d]));
    }
    CHECK(err < 1e-5);

    /* rope: 5 tokens x 2 heads x head_dim 8 at positions 0..4 */
    float q[5 * 2 * 8], q0[5 * 2 * 8], inv[4];
    for (int d = 0; d < 4; d++)
        inv[d] = (float)(1.0 / pow(10000.0, 2.0 * d / 8));
    for (size_t i = 0; i < PD_ARRAY_LEN(q); i++)
        q0[i] = q[i] = frand();
    pd_backend_rope(be, q, 2, 8, inv);
    err = 0;
    for (int i = 0; i < n; i++)
        for (int h = 0; h < 2; h++)
            for (int d = 0; d < 4; d++) {
                const float *x = q0 + (i * 2 + h) * 8;
                double a = (double)i * inv[d];
                err = pd_err_max(err,
                                 fabs(x[d] * cos(a) - x[d + 4] * sin(a) - q[(i * 2 + h) * 8 + d]));
                err = pd_err_max(
                    err, fabs(x[d + 4] * cos(a) + x[d] * sin(a) - q[(i * 2 + h) * 8 + d + 4]));
            }
    CHECK(err < 1e-5);

    float g[40], u[40], o[40];
    for (int i = 0; i < 40; i++)
        g[i] = 4 * frand(), u[i] = frand();
    pd_backend_silu_mul(be, g, u, o, 40);
    err = 0;
    for (int i = 0; i < 40; i++)
        err = pd_err_max(err, fabs(g[i] / (1 + exp(-g[i])) * u[i] - o[i]));
    CHECK(err < 1e-6);
    memcpy(o, g, sizeof(o));
    pd_backend_add(be, o, u, 40);
    CHECK(o[7] == g[7] + u[7]);
    pd_backend_free(be);
}

/* The vision encoder's ops against double precision: LayerNorm with bf16 weight and bias, GELU and
 * QuickGELU, rotary by explicit angles, and attention inside segments — lengths of 1, one under
 * and over the 16-row work item, and past one 256-key block, so the online softmax rescales. The
 * backend reserved small limits first: the vision limits then grow the scratch (reserve keeps the
 * largest of each). */
static void test_vision_ops(void) {
    struct pd_backend *be = make(3);
    CHECK(pd_backend_has_vision(be));
    struct pd_backend_limits lim = {.max_tokens = 1,
                                    .max_reqs = 1,
                                    .max_pages = 1,
                                    .max_context = 1,
                                    .max_heads = 3,
                                    .max_head_dim = 64,
                                    .max_dim = 96};
    CHECK_OK(pd_backend_reserve(be, &lim));
    int rows = 6, dim = 37;
    float x[6 * 37], out[6 * 37];
    uint16_t wb[37], bb[37];
    for (int i = 0; i < rows * dim; i++)
        x[i] = 3 * frand() + 0.5f;
    for (int d = 0; d < dim; d++)
        wb[d] = to_bf16(1 + frand()), bb[d] = to_bf16(frand());
    struct pd_tensor w, b;
    CHECK_OK(pd_backend_weight(be, PD_DTYPE_BF16, 1, dim, wb, &w));
    CHECK_OK(pd_backend_weight(be, PD_DTYPE_BF16, 1, dim, bb, &b));
    pd_backend_layernorm(be, x, &w, &b, rows, dim, 1e-6f, out);
    double err = 0;
    for (int i = 0; i < rows; i++) {
        double mean = 0, var = 0;
        for (int d = 0; d < dim; d++)
            mean += x[i * dim + d];
        mean /= dim;
        for (int d = 0; d < dim; d++)
            var += (x[i * dim + d] - mean) * (x[i * dim + d] - mean);
        double r = 1 / sqrt(var / dim + 1e-6);
        for (int d = 0; d < dim; d++) {
            double want = (x[i * dim + d] - mean) * r * from_bf16(wb[d]) + from_bf16(bb[d]);
            err = pd_err_max(err, fabs(want - out[i * dim + d]));
        }
    }
    CHECK(err < 1e-5);

    pd_backend_act(be, PD_ACT_GELU, x, out, rows * dim);
    double err_q = 0;
    err = 0;
    for (int i = 0; i < rows * dim; i++)
        err = pd_err_max(err, fabs(0.5 * x[i] * (1 + erf(x[i] / sqrt(2.0))) - out[i]));
    pd_backend_act(be, PD_ACT_QUICK_GELU, x, out, rows * dim);
    for (int i = 0; i < rows * dim; i++)
        err_q = pd_err_max(err_q, fabs(x[i] / (1 + exp(-1.702 * x[i])) - out[i]));
    CHECK(err < 1e-5 && err_q < 1e-5);

    /* rotary: 5 rows x 3 heads x head_dim 12, an angle per row and pair */
    enum { RR = 5, RH = 3, RD = 12 };
    float q[RR * RH * RD], q0[RR * RH * RD], ang[RR * RD / 2];
    for (size_t i = 0; i < PD_ARRAY_LEN(q); i++)
        q0[i] = q[i] = frand();
    for (size_t i = 0; i < PD_ARRAY_LEN(ang); i++)
        ang[i] = 20 * frand();
    pd_backend_rope_angles(be, q, RR, RH, RD, ang);
    err = 0;
    for (int i = 0; i < RR; i++)
        for (int h = 0; h < RH; h++)
            for (int d = 0; d < RD / 2; d++) {
                const float *v = q0 + (i * RH + h) * RD;
                double a = ang[i * RD / 2 + d];
                const float *got = q + (i * RH + h) * RD;
                err = pd_err_max(err, fabs(v[d] * cos(a) - v[d + RD / 2] * sin(a) - got[d]));
                err =
                    pd_err_max(err, fabs(v[d + RD / 2] * cos(a) + v[d] * sin(a) - got[d + RD / 2]));
            }
    CHECK(err < 1e-5);

    /* segments of 1, 15, 17 and 300 rows; 3 heads of 40 values */
    enum { H = 3, HD = 40 };
    int32_t seg[] = {0, 1, 16, 33, 333};
    int n = seg[4];
    size_t nv = (size_t)n * H * HD;
    float *qa = malloc(nv * sizeof(float)), *ka = malloc(nv * sizeof(float));
    float *va = malloc(nv * sizeof(float)), *oa = malloc(nv * sizeof(float));
    double *s = malloc((size_t)n * sizeof(double));
    CHECK(qa && ka && va && oa && s);
    for (size_t i = 0; i < nv; i++)
        qa[i] = 2 * frand(), ka[i] = 2 * frand(), va[i] = frand();
    float scale = 1.0f / sqrtf((float)HD);
    pd_backend_attention_segments(be, qa, ka, va, H, HD, seg, 4, scale, oa);
    err = 0;
    for (int sg = 0; sg < 4; sg++)
        for (int i = seg[sg]; i < seg[sg + 1]; i++)
            for (int h = 0; h < H; h++) {
                double mx = -INFINITY, sum = 0;
                for (int j = seg[sg]; j < seg[sg + 1]; j++) {
                    double dot = 0;
                    for (int d = 0; d < HD; d++)
                        dot += (double)qa[(i * H + h) * HD + d] * ka[(j * H + h) * HD + d];
                    s[j] = dot * scale;
                    mx = fmax(mx, s[j]);
                }
                for (int j = seg[sg]; j < seg[sg + 1]; j++)
                    sum += (s[j] = exp(s[j] - mx));
                for (int d = 0; d < HD; d++) {
                    double o = 0;
                    for (int j = seg[sg]; j < seg[sg + 1]; j++)
                        o += s[j] / sum * va[(j * H + h) * HD + d];
                    err = pd_err_max(err, fabs(o - oa[(i * H + h) * HD + d]));
                }
            }
    CHECK(err < 1e-5);
    free(qa);
    free(ka);
    free(va);
    free(oa);
    free(s);
    pd_backend_free(be);
}

/* softmax and silu, whose vector paths compute e^x themselves: every length 1..37 (full
 * vectors and every tail), against double precision, with values whose e^x underflows (a
 * softmax entry 150 below its max is 0 in f32) or overflows (silu of -100 is -0, of 100 is
 * 100). */
static void test_exp_kernels(void) {
    srand(11);
    double err = 0;
    for (int n = 1; n <= 37; n++) {
        float s[37];
        double ref[37], mx = -INFINITY, sum = 0;
        for (int i = 0; i < n; i++) {
            s[i] = i % 5 == 3 ? -150.0f + frand() : 8 * frand();
            mx = s[i] > mx ? s[i] : mx;
        }
        for (int i = 0; i < n; i++)
            sum += ref[i] = exp((double)s[i] - mx);
        pd__cpu_softmax(s, n);
        for (int i = 0; i < n; i++)
            err = pd_err_max(err, fabs(ref[i] / sum - s[i]));
    }
    CHECK(err < 1e-6);
    if (err >= 1e-6)
        fprintf(stderr, "  softmax: err %g\n", err);
    struct pd_backend *be = NULL;
    CHECK_OK(pd_backend_new(&(struct pd_backend_opts){.kind = PD_BACKEND_CPU, .threads = 1}, &be));
    float g[37], u[37], o[37];
    for (int n = 1; n <= 37; n++) {
        for (int i = 0; i < n; i++) {
            g[i] = i == 0 ? -100.0f : i == 1 ? 100.0f : 12 * frand();
            u[i] = 1 + frand();
        }
        pd_backend_silu_mul(be, g, u, o, n);
        for (int i = 0; i < n; i++) {
            double want = (double)g[i] / (1 + exp(-(double)g[i])) * u[i];
            err = pd_err_max(err, fabs(want - o[i]) / (1 + fabs(want)));
        }
    }
    CHECK(err < 1e-6);
    if (err >= 1e-6)
        fprintf(stderr, "  silu_mul: err %g\n", err);
    pd_backend_free(be);
}

/* Two requests, pages scattered, prefix already cached for one: attention over the pages must
 * equal attention over the plain token sequence. */
/* window > 0: the naive reference masks keys older than the window (transformers' sliding
 * window: position p sees keys p - window + 1 .. p). */
static void check_attention(enum pd_dtype kv_dtype, int heads, int kv_heads, int threads,
                            int window) {
    struct pd_backend *be = make(threads);
    enum { PS = 4, HD = 20, NPAGES = 16, L = 2 }; /* HD: a full and a partial vector */
    int esz = (int)pd_dtype_size(kv_dtype);
    struct pd_kv_layout kv = {.n_pages = NPAGES,
                              .n_layers = L,
                              .page_size = PS,
                              .kv_heads = kv_heads,
                              .head_dim = HD,
                              .dtype = kv_dtype};
    kv.page_bytes = (size_t)L * 2 * PS * kv_heads * HD * esz;
    CHECK_OK(pd_backend_alloc(be, kv.page_bytes * NPAGES, &kv.base));
    /* request 0: 6 tokens cached, 5 new (total 11, 3 pages); request 1: 0 cached, 3 new */
    int n_prefix[2] = {6, 0}, n_new[2] = {5, 3};
    int32_t pages0[3] = {9, 2, 14}, pages1[1] = {5};
    const int32_t *pagesr[2] = {pages0, pages1};
    int total[2] = {11, 3};
    /* full K/V/Q sequences per request, [pos][kv_heads][HD] and [pos][heads][HD] */
    float kseq[2][11][4 * HD], vseq[2][11][4 * HD], qseq[2][11][8 * HD];
    for (int r = 0; r < 2; r++)
        for (int p = 0; p < total[r]; p++) {
            for (int i = 0; i < kv_heads * HD; i++) {
                kseq[r][p][i] = frand();
                vseq[r][p][i] = frand();
                /* the reference sees K and V as the pool holds them */
                uint8_t b[4];
                pd_dtype_from_f32(kv_dtype, &kseq[r][p][i], b, 1);
                pd_dtype_to_f32(kv_dtype, b, &kseq[r][p][i], 1);
                pd_dtype_from_f32(kv_dtype, &vseq[r][p][i], b, 1);
                pd_dtype_to_f32(kv_dtype, b, &vseq[r][p][i], 1);
            }
            for (int i = 0; i < heads * HD; i++)
                qseq[r][p][i] = frand();
        }
    int layer = 1;
    /* step 1: the prefix of request 0 (6 tokens) */
    int32_t ids[16] = {0}, pos[16], slots[16], start[3], kvlen[2], pstart[3], pt[4];
    float kin[16 * 4 * HD], vin[16 * 4 * HD], qin[16 * 8 * HD], out[16 * 8 * HD];
    for (int i = 0; i < 6; i++) {
        pos[i] = i;
        slots[i] = pages0[i / PS] * PS + i % PS;
        memcpy(kin + i * kv_heads * HD, kseq[0][i], sizeof(float) * kv_heads * HD);
        memcpy(vin + i * kv_heads * HD, vseq[0][i], sizeof(float) * kv_heads * HD);
    }
    start[0] = 0, start[1] = 6, kvlen[0] = 6, pstart[0] = 0, pstart[1] = 2;
    memcpy(pt, pages0, sizeof(int32_t) * 2);
    struct pd_batch_plan p1 = {1, 6, ids, pos, slots, start, kvlen, pstart, pt, 0, NULL};
    CHECK_OK(pd_backend_set_batch(be, &p1));
    pd_backend_kv_store(be, &kv, layer, kin, vin);
    /* step 2: both requests' new tokens */
    int n = 0;
    start[0] = 0;
    pstart[0] = 0;
    for (int r = 0; r < 2; r++) {
        for (int i = 0; i < n_new[r]; i++, n++) {
            int p = n_prefix[r] + i;
            pos[n] = p;
            slots[n] = pagesr[r][p / PS] * PS + p % PS;
            memcpy(kin + n * kv_heads * HD, kseq[r][p], sizeof(float) * kv_heads * HD);
            memcpy(vin + n * kv_heads * HD, vseq[r][p], sizeof(float) * kv_heads * HD);
            memcpy(qin + n * heads * HD, qseq[r][p], sizeof(float) * heads * HD);
        }
        start[r + 1] = n;
        kvlen[r] = total[r];
    }
    memcpy(pt, pages0, sizeof(pages0));
    pt[3] = pages1[0];
    pstart[1] = 3, pstart[2] = 4;
    struct pd_batch_plan p2 = {2, n, ids, pos, slots, start, kvlen, pstart, pt, 0, NULL};
    CHECK_OK(pd_backend_set_batch(be, &p2));
    pd_backend_kv_store(be, &kv, layer, kin, vin);
    float scale = 1.0f / sqrtf(HD);
    pd_backend_attention(be, &kv, layer, qin, heads, scale, window, out);
    double err = 0;
    n = 0;
    int group = heads / kv_heads;
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < n_new[r]; i++, n++) {
            int p = n_prefix[r] + i;
            for (int h = 0; h < heads; h++) {
                double s[11], mx = -1e30, sum = 0;
                const float *qq = qseq[r][p] + h * HD;
                int j0 = window > 0 && p + 1 > window ? p + 1 - window : 0;
                for (int j = j0; j <= p; j++) {
                    s[j] = 0;
                    for (int d = 0; d < HD; d++)
                        s[j] += (double)qq[d] * kseq[r][j][(h / group) * HD + d];
                    s[j] *= scale;
                    mx = fmax(mx, s[j]);
                }
                for (int j = j0; j <= p; j++)
                    sum += s[j] = exp(s[j] - mx);
                for (int d = 0; d < HD; d++) {
                    double o = 0;
                    for (int j = j0; j <= p; j++)
                        o += s[j] / sum * vseq[r][j][(h / group) * HD + d];
                    err = pd_err_max(err, fabs(o - out[(n * heads + h) * HD + d]));
                }
            }
        }
    CHECK(err < 1e-5);
    if (err >= 1e-5)
        fprintf(stderr, "  attention heads %d kv %d window %d: err %g\n", heads, kv_heads, window,
                err);
    pd_backend_release(be, kv.base);
    pd_backend_free(be);
}

static void test_attention(void) {
    check_attention(PD_DTYPE_F32, 4, 4, 1, 0);
    check_attention(PD_DTYPE_F32, 4, 2, 3, 0);
    check_attention(PD_DTYPE_F32, 8, 2, 2, 0);
    check_attention(PD_DTYPE_BF16, 8, 1, 2, 0);
    check_attention(PD_DTYPE_F16, 4, 2, 2, 0);
    check_attention(PD_DTYPE_F8E4M3, 8, 2, 2, 0); /* --kv-cache-dtype fp8: widened by table */
    check_attention(PD_DTYPE_F8E5M2, 4, 4, 1, 0);
}

/* Sliding windows: 1 (only itself), 3 (starts mid-page, crosses pages), 5 and 7 (the window
 * start moves through the 5-token block), 11 (= the longest request: masks nothing). */
static void test_attention_sliding_window(void) {
    const int windows[] = {1, 3, 5, 7, 11};
    for (size_t i = 0; i < PD_ARRAY_LEN(windows); i++) {
        check_attention(PD_DTYPE_F32, 4, 2, 1, windows[i]);
        check_attention(PD_DTYPE_F32, 8, 2, 3, windows[i]);
        check_attention(PD_DTYPE_BF16, 4, 4, 2, windows[i]);
        check_attention(PD_DTYPE_F8E4M3, 4, 2, 2, windows[i]);
    }
}

static void test_bad_plans(void) {
    struct pd_backend *be = make(1);
    int32_t ids[2] = {0}, pos[2] = {0, 1}, slots[2] = {0, 1}, start[2] = {0, 2}, kvlen[1] = {1};
    int32_t pstart[2] = {0, 1}, pt[1] = {0};
    struct pd_batch_plan p = {1, 2, ids, pos, slots, start, kvlen, pstart, pt, 0, NULL};
    CHECK_ERR(pd_backend_set_batch(be, &p), PD_ERANGE, "in cache"); /* kv_len < new tokens */
    kvlen[0] = 1000;
    CHECK_ERR(pd_backend_set_batch(be, &p), PD_ERANGE, "in cache"); /* beyond max_context */
    kvlen[0] = 2;
    p.n_tokens = 65;
    CHECK_ERR(pd_backend_set_batch(be, &p), PD_ERANGE, "tokens");
    pd_backend_free(be);

    struct pd_backend_opts cuda = {.kind = PD_BACKEND_CUDA};
    struct pd_backend *none = NULL;
    /* without CUDA in the build: "not in this build"; with it but no GPU: "no CUDA device";
     * on a GPU machine the backend starts (tests/kernels covers it) */
    pd_error_clear();
    int rc = pd_backend_new(&cuda, &none);
    if (rc == PD_OK) {
        pd_backend_free(none);
    } else {
        CHECK_INT(rc, PD_EUNSUPPORTED);
        CHECK(strstr(pd_error_msg(), "cuda") != NULL);
        CHECK(none == NULL);
    }
}

/* The greedy fast path gives exactly what the host sampler's greedy draw gives: token (lowest
 * index on ties) and logprob, so a decode daemon may take either path. */
static void test_argmax_matches_sampler(void) {
    struct pd_backend_opts o = {.kind = PD_BACKEND_CPU, .threads = 1};
    struct pd_backend *be = NULL;
    CHECK_OK(pd_backend_new(&o, &be));
    enum { ROWS = 5, V = 1000 };
    static float x[ROWS][V], row[V];
    uint64_t r = 99;
    for (int i = 0; i < ROWS; i++)
        for (int t = 0; t < V; t++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            x[i][t] = (float)((r >> 33) % 20000) / 1000.0f - 10.0f;
        }
    x[2][17] = x[2][400] = 50.0f; /* a tie: the lower index wins */
    int32_t ids[ROWS];
    float lp[ROWS];
    CHECK_OK(pd_backend_argmax(be, &x[0][0], ROWS, V, ids, lp));
    CHECK_INT(ids[2], 17);
    struct pd_sampling_params sp;
    pd_sampling_params_default(&sp);
    sp.temperature = 0;
    struct pd_sampling_scratch sc;
    CHECK_OK(pd_sampling_scratch_init(&sc, V));
    for (int i = 0; i < ROWS; i++) {
        struct pd_sampler smp;
        CHECK_OK(pd_sampler_init(&smp, &sp, V, NULL, 0, NULL, 0));
        struct pd_sample out;
        memcpy(row, x[i], sizeof(row));
        pd_sampler_next(&smp, &sc, row, &out);
        CHECK_INT(ids[i], out.token);
        CHECK(lp[i] == out.logprob);
        pd_sampler_free(&smp);
    }
    CHECK(pd_backend_argmax(be, &x[0][0], ROWS, 0, ids, lp) == PD_EINVAL);
    pd_sampling_scratch_free(&sc);
    pd_backend_free(be);
}

/* The sampling fast path gives exactly what a seeded host sampler draws: the cpu backend's
 * pd_backend_sample with each row's u taken from a twin of the request's random stream equals
 * pd_sampler_next over temperatures and top-k / top-p / min-p combinations, ties included; bad
 * rows are refused naming the field. */
static void test_sample_matches_sampler(void) {
    struct pd_backend_opts o = {.kind = PD_BACKEND_CPU, .threads = 1};
    struct pd_backend *be = NULL;
    CHECK_OK(pd_backend_new(&o, &be));
    enum { ROWS = 48, V = 3000 };
    static float x[ROWS][V], buf[V];
    uint64_t r = 7;
    for (int i = 0; i < ROWS; i++)
        for (int t = 0; t < V; t++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            /* coarse values in some rows: many exact ties, as bf16 logits have */
            int q = i % 3 == 0 ? 64 : 100000;
            x[i][t] = (float)((r >> 33) % (uint64_t)q) * (12.0f / (float)q) - 6.0f;
        }
    static const float temps[] = {0.0f, 0.3f, 0.7f, 1.0f, 1.5f};
    static const int ks[] = {0, 1, 5, 40, 2999, 5000};
    static const float ps[] = {1.0f, 0.95f, 0.5f, 0.05f};
    static const float mps[] = {0.0f, 0.05f, 0.5f};
    struct pd_sampling_scratch sc;
    CHECK_OK(pd_sampling_scratch_init(&sc, V));
    struct pd_sampler smp[ROWS], twin[ROWS];
    struct pd_sample_row rows[ROWS];
    int combos = 0, differ = 0;
    for (int ti = 0; ti < 5; ti++)
        for (int ki = 0; ki < 6; ki++)
            for (int pi = 0; pi < 4; pi++)
                for (int mi = 0; mi < 3; mi++, combos++) {
                    struct pd_sampling_params sp;
                    pd_sampling_params_default(&sp);
                    sp.temperature = temps[ti];
                    sp.top_k = ks[ki];
                    sp.top_p = ps[pi];
                    sp.min_p = mps[mi];
                    sp.has_seed = true;
                    for (int i = 0; i < ROWS; i++) {
                        sp.seed = (uint64_t)(combos * ROWS + i);
                        CHECK_OK(pd_sampler_init(&smp[i], &sp, V, NULL, 0, NULL, 0));
                        CHECK_OK(pd_sampler_init(&twin[i], &sp, V, NULL, 0, NULL, 0));
                        pd_sampler_row(&twin[i], &rows[i]);
                        rows[i].u = pd_sampler_next_u(&twin[i]);
                    }
                    int32_t ids[ROWS];
                    float lp[ROWS];
                    CHECK_OK(pd_backend_sample(be, &x[0][0], ROWS, V, rows, ids, lp));
                    for (int i = 0; i < ROWS; i++) {
                        struct pd_sample out;
                        memcpy(buf, x[i], sizeof(buf));
                        pd_sampler_next(&smp[i], &sc, buf, &out);
                        CHECK_INT(ids[i], out.token);
                        CHECK(lp[i] == out.logprob);
                        differ += ids[i] != ids[(i + 1) % ROWS];
                        pd_sampler_free(&smp[i]);
                        pd_sampler_free(&twin[i]);
                    }
                }
    CHECK(differ > 0); /* the rows do not all give one token */
    struct pd_sample_row bad = {.temperature = 1, .top_p = 0, .u = 0.5};
    int32_t id;
    float lp;
    CHECK_ERR(pd_backend_sample(be, &x[0][0], 1, V, &bad, &id, &lp), PD_EINVAL, "top_p");
    bad.top_p = 1;
    bad.u = 1.0;
    CHECK_ERR(pd_backend_sample(be, &x[0][0], 1, V, &bad, &id, &lp), PD_EINVAL, "u 1");
    bad.u = 0.5;
    bad.min_p = -1;
    CHECK_ERR(pd_backend_sample(be, &x[0][0], 1, V, &bad, &id, &lp), PD_EINVAL, "min_p");
    CHECK(pd_backend_sample(be, &x[0][0], 1, 0, &bad, &id, &lp) == PD_EINVAL);
    pd_sampling_scratch_free(&sc);
    pd_backend_free(be);
}

/* The error reductions the tests use: a NaN anywhere in an output is an infinite error. */
static void test_nan_is_an_error(void) {
    const float ref[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    float out[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    CHECK(pd_rel_err(out, ref, 4) == 0.0);
    out[2] = NAN;
    CHECK(isinf(pd_rel_err(out, ref, 4)));
    CHECK(isinf(pd_rel_err(ref, out, 4))); /* a NaN in the reference too */
    CHECK(isinf(pd_err_max(0.5, NAN)) && pd_err_max(0.5, 0.25) == 0.5);
}

/* Whether this CPU has the instructions of level i of isa_names (AMX: the CPU's; whether Linux
 * grants the tiles is the backend's to find). */
static const char *const isa_names[] = {"generic", "avx2", "avx512", "amx"};
static bool cpu_has_isa(int i) {
#if defined(__x86_64__)
    unsigned a, b, c, d;
    switch (i) {
    case 1: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case 2:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl");
    case 3:
        return cpu_has_isa(2) && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 22)) &&
               (d & (1u << 24));
    default: return true;
    }
#else
    return i == 0;
#endif
}

/* The backend names the instruction set its kernels run: the one PDSERVE_CPU_ISA asks for where
 * the CPU has it, else a lower one the CPU has (the variants of this test that force the
 * fallbacks rely on it), and a bad name is refused. */
static void test_isa(void) {
    struct pd_backend *be = make(1);
    const char *name = pd_backend_name(be), *want = getenv("PDSERVE_CPU_ISA");
    if (want && !*want)
        want = NULL; /* empty: as if unset */
    int got = -1, asked = (int)PD_ARRAY_LEN(isa_names) - 1;
    for (int i = 0; i < (int)PD_ARRAY_LEN(isa_names); i++) {
        char tail[32];
        snprintf(tail, sizeof(tail), ", %s)", isa_names[i]);
        if (strstr(name, tail))
            got = i;
        if (want && strcmp(want, isa_names[i]) == 0)
            asked = i;
    }
    CHECK(got >= 0 && got <= asked && cpu_has_isa(got));
    /* skipped only what the CPU lacks, or AMX where Linux refuses the tiles */
    for (int i = got + 1; i <= asked && got >= 0; i++)
        CHECK(!cpu_has_isa(i) || i == 3);
    if (got < 0 || got > asked)
        fprintf(stderr, "  PDSERVE_CPU_ISA=%s but the backend is %s\n", want ? want : "", name);
    pd_backend_free(be);
    char *saved = want ? pd_strdup(want) : NULL;
    setenv("PDSERVE_CPU_ISA", "avx9", 1);
    struct pd_backend_opts o = {.kind = PD_BACKEND_CPU, .threads = 1};
    be = NULL;
    CHECK(pd_backend_new(&o, &be) == PD_EINVAL && !be);
    CHECK(strstr(pd_error_msg(), "PDSERVE_CPU_ISA=avx9") != NULL);
    if (saved)
        setenv("PDSERVE_CPU_ISA", saved, 1);
    else
        unsetenv("PDSERVE_CPU_ISA");
    pd_free(saved);
}

PD_TEST_MAIN(PD_TEST(test_isa), PD_TEST(test_nan_is_an_error), PD_TEST(test_matmul),
             PD_TEST(test_rows_ops), PD_TEST(test_vision_ops), PD_TEST(test_exp_kernels),
             PD_TEST(test_attention), PD_TEST(test_attention_sliding_window),
             PD_TEST(test_bad_plans), PD_TEST(test_argmax_matches_sampler),
             PD_TEST(test_sample_matches_sampler))
