/*
 * bench_gpu.c — the perf mode of the kernel tests (`test_backend_cuda --perf [--json FILE]
 * [--quick]`, STYLE.md rule 10): each op's achieved GB/s or TFLOP/s against the device's peak,
 * the peaks read from the device (memory clock × bus width; SMs × 4096 bf16 FLOP/clock for
 * Hopper's dense tensor cores) next to two rates measured in the same run — a device-to-device
 * copy (the practical HBM limit) and a large cuBLAS bf16 GEMM (the practical matrix limit).
 * Then a whole-model decode step and prefill for a qwen2.5-1.5b-shaped random model through
 * model/model.c on the cuda backend (graphs on). Times are CUDA events over repeated launches
 * after a warm-up; model steps are wall-clock including the logits download.
 */
#include "common/base/alloc.h"
#include "model/backend.h"
#include "model/model.h"
#include "kernels/backend_cuda.h"
#include "common/base/status.h"
#include "kernels/kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int pd_bench_gpu_main(int argc, char **argv);

static FILE *json;
static int json_n;
static double peak_bw, peak_tf, meas_bw, meas_tf; /* bytes/s, FLOP/s */
static cudaStream_t st;

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static void report(const char *op, const char *shape, double sec, double bytes, double flops) {
    double gbs = bytes / sec / 1e9, tfs = flops / sec / 1e12;
    printf("%-22s %-34s %10.1f us", op, shape, sec * 1e6);
    if (bytes > 0)
        printf("  %8.1f GB/s (%4.0f%% of peak, %4.0f%% of copy)", gbs, 100 * bytes / sec / peak_bw,
               meas_bw > 0 ? 100 * bytes / sec / meas_bw : 0);
    if (flops > 0)
        printf("  %7.1f TFLOP/s (%4.0f%% of peak, %4.0f%% of gemm)", tfs,
               100 * flops / sec / peak_tf, meas_tf > 0 ? 100 * flops / sec / meas_tf : 0);
    printf("\n");
    if (json)
        fprintf(json,
                "%s{\"op\":\"%s\",\"shape\":\"%s\",\"us\":%.3f,\"gbps\":%.2f,\"tflops\":%.3f,"
                "\"pct_peak_bw\":%.1f,\"pct_peak_flops\":%.1f}",
                json_n++ ? ",\n" : "", op, shape, sec * 1e6, gbs, tfs,
                bytes > 0 ? 100 * bytes / sec / peak_bw : 0,
                flops > 0 ? 100 * flops / sec / peak_tf : 0);
}

static void *dmalloc(size_t bytes) {
    void *p = NULL;
    CK(cudaMalloc(&p, bytes));
    CK(cudaMemset(p, 0, bytes));
    return p;
}

/* fills n values of dtype with small random numbers (on the host, then copied) */
static void dfill(void *d, enum pd_dtype t, size_t n, float amp) {
    size_t chunk = 1 << 22, esz = pd_dtype_size(t);
    float *f = pd_malloc(chunk * 4);
    void *h = pd_malloc(chunk * esz);
    uint64_t r = 99;
    for (size_t i = 0; i < n; i += chunk) {
        size_t m = n - i < chunk ? n - i : chunk;
        for (size_t j = 0; j < m; j++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            f[j] = amp * ((float)((r >> 40) & 0xffffff) / 8388608.0f - 1.0f);
        }
        pd_dtype_from_f32(t, f, h, m);
        CK(cudaMemcpy((char *)d + i * esz, h, m * esz, cudaMemcpyHostToDevice));
    }
    pd_free(f);
    pd_free(h);
}

typedef int (*launch_fn)(void *ctx);

/* seconds per launch: warm-up, then reps launches between two events */
static double time_it(launch_fn fn, void *ctx, int reps) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < 3; i++)
        if (fn(ctx)) {
            fprintf(stderr, "launch failed: %s\n", pd_error_msg());
            exit(1);
        }
    CK(cudaEventRecord(a, st));
    for (int i = 0; i < reps; i++)
        fn(ctx);
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return ms / 1e3 / reps;
}

/* ---- the two measured limits ---- */

struct copy_ctx {
    void *a, *b;
    size_t bytes;
};
static int copy_launch(void *ctx) {
    struct copy_ctx *c = ctx;
    return pd__cuda_status(cudaMemcpyAsync(c->b, c->a, c->bytes, cudaMemcpyDeviceToDevice, st),
                           "copy");
}

struct gemm_ctx {
    struct pd_kernel_gemm *g;
    struct pd_kernel_gemm_params p;
};
static int gemm_launch(void *ctx) {
    struct gemm_ctx *c = ctx;
    return pd_kernel_gemm_run(c->g, &c->p);
}

struct gemv_ctx {
    struct pd_kernel_gemv_params p;
};
static int gemv_launch(void *ctx) {
    return pd_kernel_gemv(&((struct gemv_ctx *)ctx)->p, st);
}

static void bench_limits(struct pd_kernel_gemm *g, bool quick) {
    struct copy_ctx cc = {NULL, NULL, (size_t)(quick ? 1 : 4) << 30};
    cc.a = dmalloc(cc.bytes);
    cc.b = dmalloc(cc.bytes);
    double s = time_it(copy_launch, &cc, 10);
    meas_bw = 2.0 * (double)cc.bytes / s;
    report("hbm_copy", quick ? "1 GiB d2d" : "4 GiB d2d", s, 2.0 * (double)cc.bytes, 0);
    cudaFree(cc.a);
    cudaFree(cc.b);

    static const int64_t shapes[][3] = {
        {8192, 8192, 8192}, {4096, 14336, 4096}, {4096, 4096, 14336}};
    for (size_t i = 0; i < PD_ARRAY_LEN(shapes); i++) {
        int64_t n = shapes[i][0], m = shapes[i][1], k = shapes[i][2];
        struct gemm_ctx gc = {g, {NULL, NULL, PD_DTYPE_BF16, NULL, n, m, k}};
        void *x = dmalloc((size_t)(n * k) * 2), *w = dmalloc((size_t)(m * k) * 2);
        float *y = dmalloc((size_t)(n * m) * 4);
        dfill(x, PD_DTYPE_BF16, (size_t)(n * k), 1.0f);
        dfill(w, PD_DTYPE_BF16, (size_t)(m * k), 1.0f);
        gc.p.x = x;
        gc.p.w = w;
        gc.p.y = y;
        double t = time_it(gemm_launch, &gc, 20);
        double fl = 2.0 * (double)n * (double)m * (double)k;
        if (fl / t > meas_tf)
            meas_tf = fl / t;
        char sh[64];
        snprintf(sh, sizeof(sh), "%lldx%lldx%lld bf16", (long long)n, (long long)m, (long long)k);
        report("gemm_bf16", sh, t, 0, fl);
        cudaFree(x);
        cudaFree(w);
        cudaFree(y);
        if (quick)
            break;
    }
    /* decode-shaped products: bound by the weight bytes */
    static const int64_t dec[][3] = {
        {1, 14336, 4096}, {1, 4096, 14336}, {64, 14336, 4096}, {1, 8960, 1536}};
    for (size_t i = 0; i < PD_ARRAY_LEN(dec); i++) {
        int64_t n = dec[i][0], m = dec[i][1], k = dec[i][2];
        struct gemm_ctx gc = {g, {NULL, NULL, PD_DTYPE_BF16, NULL, n, m, k}};
        void *x = dmalloc((size_t)(n * k) * 2), *w = dmalloc((size_t)(m * k) * 2);
        float *y = dmalloc((size_t)(n * m) * 4);
        gc.p.x = x;
        gc.p.w = w;
        gc.p.y = y;
        double t = time_it(gemm_launch, &gc, 50);
        char sh[64];
        snprintf(sh, sizeof(sh), "%lldx%lldx%lld bf16", (long long)n, (long long)m, (long long)k);
        report("gemv_bf16", sh, t, (double)(m * k) * 2 + (double)(n * (k * 2 + m * 4)),
               2.0 * (double)(n * m * k));
        cudaFree(x);
        cudaFree(w);
        cudaFree(y);
    }
    /* the few-row product (kernels/gemv.cu) on a decode step's shapes, f32 input: qwen2.5-1.5b's
     * q+k+v as one group, o, gate+up with SwiGLU, down; llama-3.1-8b's down */
    static const int64_t few[][4] = {{2048, 1536, 1, 0},
                                     {1536, 1536, 1, 0},
                                     {8960, 1536, 2, 1},
                                     {1536, 8960, 1, 0},
                                     {4096, 14336, 1, 0}};
    static const int few_rows[] = {1, 4};
    for (size_t i = 0; i < PD_ARRAY_LEN(few); i++)
        for (size_t r = 0; r < PD_ARRAY_LEN(few_rows); r++) {
            int64_t m = few[i][0], k = few[i][1], n = few_rows[r];
            int segs = (int)few[i][2];
            struct gemv_ctx gc = {{.rows = n,
                                   .k = k,
                                   .dtype = PD_DTYPE_BF16,
                                   .n_seg = segs,
                                   .silu_pair = few[i][3] != 0}};
            cudaDeviceGetAttribute(&gc.p.sms, cudaDevAttrMultiProcessorCount, 0);
            char *w = dmalloc((size_t)(segs * m * k) * 2);
            float *x = dmalloc((size_t)(n * k) * 4), *y = dmalloc((size_t)(segs * n * m) * 4);
            for (int j = 0; j < segs; j++)
                gc.p.seg[j] = (struct pd_kernel_product_seg){w + (size_t)(j * m * k) * 2, NULL,
                                                             y + j * n * m, m};
            gc.p.x = x;
            double t = time_it(gemv_launch, &gc, 50);
            char sh[64];
            snprintf(sh, sizeof(sh), "%lldx%lldx%lld%s bf16", (long long)n, (long long)(segs * m),
                     (long long)k, segs > 1 ? " swiglu" : "");
            report("gemv_pd", sh, t, (double)(segs * m * k) * 2 + (double)(n * (k * 4 + m * 4)),
                   2.0 * (double)(segs * n * m * k));
            cudaFree(x);
            cudaFree(w);
            cudaFree(y);
        }
}

/* ---- row ops ---- */

struct norm_ctx {
    struct pd_kernel_rmsnorm_params p;
};
static int norm_launch(void *ctx) {
    return pd_kernel_rmsnorm(&((struct norm_ctx *)ctx)->p, st);
}
struct glu_ctx {
    struct pd_kernel_swiglu_params p;
};
static int glu_launch(void *ctx) {
    return pd_kernel_swiglu(&((struct glu_ctx *)ctx)->p, st);
}
struct rope_ctx {
    struct pd_kernel_rope_params p;
};
static int rope_launch(void *ctx) {
    return pd_kernel_rope(&((struct rope_ctx *)ctx)->p, st);
}

static void bench_rows(void) {
    int64_t rows = 16384;
    int dim = 4096;
    size_t n = (size_t)rows * dim;
    float *x = dmalloc(n * 4), *y = dmalloc(n * 4), *o = dmalloc(n * 4);
    void *w = dmalloc((size_t)dim * 2);
    dfill(x, PD_DTYPE_F32, n, 1.0f);
    dfill(y, PD_DTYPE_F32, n, 1.0f);
    dfill(w, PD_DTYPE_BF16, (size_t)dim, 1.0f);
    struct norm_ctx nc = {{x, NULL, w, PD_DTYPE_BF16, o, rows, dim, 1e-5f, NULL, 0}};
    report("rmsnorm", "16384x4096 f32", time_it(norm_launch, &nc, 20), 2.0 * n * 4, 0);
    nc.p.add = y;
    report("add_rmsnorm (fused)", "16384x4096 f32", time_it(norm_launch, &nc, 20), 4.0 * n * 4, 0);
    nc.p = (struct pd_kernel_rmsnorm_params){x,         NULL, w,     PD_DTYPE_BF16, x,
                                             rows * 32, 128,  1e-6f, NULL,          0};
    report("rmsnorm (qk, warp)", "524288x128 f32", time_it(norm_launch, &nc, 20), 2.0 * n * 4, 0);
    struct glu_ctx gc = {{x, y, o, (int64_t)n, false}};
    report("swiglu", "64M f32", time_it(glu_launch, &gc, 20), 3.0 * n * 4, 0);
    gc.p.add_only = true;
    report("add", "64M f32", time_it(glu_launch, &gc, 20), 3.0 * n * 4, 0);
    int32_t *pos = dmalloc(16384 * 4);
    float *inv = dmalloc(64 * 4);
    dfill(inv, PD_DTYPE_F32, 64, 0.5f);
    struct rope_ctx rc = {{x, pos, inv, 16384, 32, 128}};
    report("rope", "16384 tok x 32 x 128", time_it(rope_launch, &rc, 20), 2.0 * n * 4, 0);
    cudaFree(x);
    cudaFree(y);
    cudaFree(o);
    cudaFree(w);
    cudaFree(pos);
    cudaFree(inv);
}

/* ---- sampling: greedy argmax and the device sampler over Qwen-sized logits ---- */

struct samp_ctx {
    struct pd_kernel_sample_params p;
    struct pd_kernel_argmax_params a;
};
static int samp_launch(void *ctx) {
    return pd_kernel_sample(&((struct samp_ctx *)ctx)->p, st);
}
static int amax_launch(void *ctx) {
    return pd_kernel_argmax(&((struct samp_ctx *)ctx)->a, st);
}

/* Where a draw's time goes: each phase's median over 10 launches (events between launches). */
static void sample_phases(struct samp_ctx *c) {
    static const char *const names[PD_KERNEL_SAMPLE_PHASES] = {"stats", "softmax",
                                                               "draw (FlashInfer)", "finish"};
    cudaEvent_t ev[PD_KERNEL_SAMPLE_PHASES + 1];
    for (int i = 0; i <= PD_KERNEL_SAMPLE_PHASES; i++)
        CK(cudaEventCreate(&ev[i]));
    double us[PD_KERNEL_SAMPLE_PHASES][10];
    pd_kernel_sample_trace(ev, PD_KERNEL_SAMPLE_PHASES + 1);
    for (int rep = 0; rep < 10; rep++) {
        if (samp_launch(c))
            fprintf(stderr, "sample: %s\n", pd_error_msg());
        CK(cudaEventSynchronize(ev[PD_KERNEL_SAMPLE_PHASES]));
        for (int i = 0; i < PD_KERNEL_SAMPLE_PHASES; i++) {
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, ev[i], ev[i + 1]));
            us[i][rep] = ms * 1e3;
        }
    }
    pd_kernel_sample_trace(NULL, 0);
    printf("%-22s", "  phases (median us)");
    for (int i = 0; i < PD_KERNEL_SAMPLE_PHASES; i++) {
        for (int a = 1; a < 10; a++) /* insertion sort of 10 */
            for (int b = a; b > 0 && us[i][b] < us[i][b - 1]; b--) {
                double t = us[i][b];
                us[i][b] = us[i][b - 1];
                us[i][b - 1] = t;
            }
        printf(" %s %.1f%s", names[i], us[i][5], i + 1 < PD_KERNEL_SAMPLE_PHASES ? "," : "\n");
    }
    for (int i = 0; i <= PD_KERNEL_SAMPLE_PHASES; i++)
        cudaEventDestroy(ev[i]);
}

static void bench_sample(void) {
    const int V = 151936;
    static const int rows_list[] = {1, 64, 256};
    static const struct {
        const char *name;
        struct pd_kernel_sample_row r;
    } cfg[] = {
        {"T0.7 top_p0.9", {0.7f, 0, 0.9f, 0.0f, 0.5, -1, 1.0f, 0.0f, 0.0f, 0}},
        {"T1 (all tokens)", {1.0f, 0, 1.0f, 0.0f, 0.5, -1, 1.0f, 0.0f, 0.0f, 0}},
        {"T0.6 k20 p0.95 min_p0.05", {0.6f, 20, 0.95f, 0.05f, 0.5, -1, 1.0f, 0.0f, 0.0f, 0}},
        /* slot set per row below: the penalties read its state, top-20 is gathered */
        {"T0.7 p0.9 penalties top20", {0.7f, 0, 0.9f, 0.0f, 0.5, 0, 1.1f, 0.2f, 0.1f, 20}},
        {"greedy penalties top20", {0.0f, 0, 1.0f, 0.0f, 0.0, 0, 1.1f, 0.2f, 0.1f, 20}},
    };
    float *x = dmalloc((size_t)V * 256 * 4), *lp = dmalloc(256 * 4);
    int32_t *ids = dmalloc(256 * 4);
    struct pd_kernel_sample_row *rows_d = dmalloc(256 * sizeof(struct pd_kernel_sample_row));
    struct pd_kernel_sample_row rows_h[256];
    dfill(x, PD_DTYPE_F32, (size_t)V * 256, 8.0f);
    /* penalty state: 256 slots, each with a 500-token prompt and 200 output tokens */
    int32_t *state = dmalloc((size_t)V * 256 * 4), *top_ids = dmalloc(256 * 20 * 4);
    float *top_lp = dmalloc(256 * 20 * 4);
    int32_t *pids = dmalloc(700 * 4), pids_h[700];
    for (int s = 0; s < 256; s++) {
        for (int i = 0; i < 700; i++)
            pids_h[i] = (int32_t)(((uint64_t)(s + 1) * 2654435761u * (uint64_t)(i + 7)) % V);
        CK(cudaMemcpy(pids, pids_h, sizeof(pids_h), cudaMemcpyHostToDevice));
        struct pd_kernel_penalty_set_params pp = {state + (size_t)s * V, V, pids, 500, 200};
        if (pd_kernel_penalty_set(&pp, st))
            fprintf(stderr, "penalty set: %s\n", pd_error_msg());
    }
    CK(cudaStreamSynchronize(st));
    size_t scratch_bytes = pd_kernel_sample_scratch_bytes(256, V);
    void *scratch = dmalloc(scratch_bytes);
    for (size_t ri = 0; ri < PD_ARRAY_LEN(rows_list); ri++) {
        int R = rows_list[ri];
        char sh[96];
        struct samp_ctx c = {.a = {x, R, V, ids, lp, scratch, scratch_bytes}};
        snprintf(sh, sizeof(sh), "%d x %d f32 greedy", R, V);
        double s = time_it(amax_launch, &c, 20);
        report("argmax", sh, s, (double)R * V * 4, 0);
        for (size_t ci = 0; ci < PD_ARRAY_LEN(cfg); ci++) {
            for (int r = 0; r < R; r++) {
                rows_h[r] = cfg[ci].r;
                if (rows_h[r].slot >= 0)
                    rows_h[r].slot = r;
            }
            CK(cudaMemcpy(rows_d, rows_h, (size_t)R * sizeof(rows_h[0]), cudaMemcpyHostToDevice));
            const struct pd_kernel_sample_row *q = &cfg[ci].r;
            c.p = (struct pd_kernel_sample_params){.logits = x,
                                                   .rows = R,
                                                   .vocab = V,
                                                   .row = rows_d,
                                                   .ids = ids,
                                                   .logprob = lp,
                                                   .state = state,
                                                   .n_slots = 256,
                                                   .top_ids = top_ids,
                                                   .top_lp = top_lp,
                                                   .any_drawn =
                                                       !(q->temperature < 1e-5f || q->top_k == 1),
                                                   .any_penalized = q->slot >= 0,
                                                   .any_min_p = q->min_p > 0,
                                                   .any_top_k = q->top_k > 0 && q->top_k < V,
                                                   .any_top_p = q->top_p < 1,
                                                   .scratch = scratch,
                                                   .scratch_bytes = scratch_bytes};
            snprintf(sh, sizeof(sh), "%d x %d %s", R, V, cfg[ci].name);
            s = time_it(samp_launch, &c, 10);
            report("sample", sh, s, (double)R * V * 4, 0);
            printf("%-22s %-34s %10.0f rows/s\n", "", "", R / s);
            if (c.p.any_drawn)
                sample_phases(&c);
        }
    }
    cudaFree(x);
    cudaFree(lp);
    cudaFree(ids);
    cudaFree(rows_d);
    cudaFree(state);
    cudaFree(top_ids);
    cudaFree(top_lp);
    cudaFree(pids);
    cudaFree(scratch);
}

/* ---- attention ---- */

struct attn_ctx {
    struct pd_kernel_attn_params p;
};
static int attn_launch(void *ctx) {
    return pd_kernel_attention(&((struct attn_ctx *)ctx)->p, st);
}

/* FlashInfer's attention as the backend runs a layer (kernels/backend_cuda.c run_fi_attention):
 * the kernel on 2-byte q / o, and with conv also q f32 → bf16/f16 before and o back after. */
struct fi_ctx {
    struct pdfi_plan plan;
    struct pdfi_workspace ws;
    struct pdfi_attention_args a;
    const float *q32;
    float *o32;
    enum pd_dtype qt;
    int64_t count;
    bool conv;
};

static int fi_launch(void *ctx) {
    struct fi_ctx *f = ctx;
    char err[256];
    int rc;
    if (f->conv) {
        struct pd_kernel_convert_params cq = {f->q32, (void *)f->a.q, f->qt, f->count};
        if ((rc = pd_kernel_convert(&cq, st)))
            return rc;
    }
    if ((rc = pdfi_attention(&f->plan, &f->ws, &f->a, st, err, sizeof(err))))
        return pd__pdfi_status(rc, err);
    if (f->conv) {
        struct pd_kernel_widen_params wo = {f->a.o, f->qt, f->o32, f->count};
        rc = pd_kernel_widen(&wo, st);
    }
    return rc;
}

/* n_reqs requests of n_new new tokens after ctx - n_new cached; one layer of a pool. */
static void bench_attn(const char *name, enum pd_dtype kvt, int n_reqs, int n_new, int ctx,
                       int heads, int kvh, int hd, int sms) {
    int ps = 16, pages_per = (ctx + ps - 1) / ps;
    int64_t n_pages = (int64_t)n_reqs * pages_per;
    size_t esz = pd_dtype_size(kvt);
    struct pd_kernel_kv_geom g = {NULL, n_pages, 1, ps, kvh, hd, kvt, 0};
    g.page_bytes = (size_t)2 * ps * kvh * hd * esz;
    g.base = dmalloc(g.page_bytes * (size_t)n_pages);
    dfill(g.base, kvt, g.page_bytes * (size_t)n_pages / esz, 1.0f);
    int n_tok = n_reqs * n_new;
    int32_t *ts = pd_calloc((size_t)n_reqs + 1, 4), *kl = pd_calloc((size_t)n_reqs, 4);
    int32_t *ps_ = pd_calloc((size_t)n_reqs + 1, 4), *pt = pd_calloc((size_t)n_pages, 4);
    int32_t *tsp = pd_calloc((size_t)n_tok, 4);
    for (int r = 0; r <= n_reqs; r++) {
        ts[r] = r * n_new;
        ps_[r] = r * pages_per;
    }
    for (int r = 0; r < n_reqs; r++)
        kl[r] = ctx;
    for (int64_t i = 0; i < n_pages; i++)
        pt[i] = (int32_t)((i * 7919) % n_pages);
    int cap = pd_kernel_attn_max_items(n_tok, n_reqs, heads / kvh);
    struct pd_kernel_attn_item *items = pd_calloc((size_t)cap, sizeof(*items));
    struct pd_kernel_attn_plan_in in = {n_reqs, ts, kl, heads / kvh, kvh, 0, 0, 2 * sms, 256};
    struct pd_kernel_attn_batch b = {0};
    if (pd_kernel_attn_plan(&in, items, cap, tsp, &b) < 0) {
        fprintf(stderr, "attention plan overflow\n");
        exit(1);
    }
    void *d_ts = dmalloc(((size_t)n_reqs + 1) * 4), *d_kl = dmalloc((size_t)n_reqs * 4);
    void *d_ps = dmalloc(((size_t)n_reqs + 1) * 4), *d_pt = dmalloc((size_t)n_pages * 4);
    void *d_tsp = dmalloc((size_t)n_tok * 4), *d_it = dmalloc((size_t)b.n_items * sizeof(*items));
    CK(cudaMemcpy(d_ts, ts, ((size_t)n_reqs + 1) * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_kl, kl, (size_t)n_reqs * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_ps, ps_, ((size_t)n_reqs + 1) * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_pt, pt, (size_t)n_pages * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_tsp, tsp, (size_t)n_tok * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_it, items, (size_t)b.n_items * sizeof(*items), cudaMemcpyHostToDevice));
    b.req_tok_start = d_ts;
    b.req_kv_len = d_kl;
    b.req_page_start = d_ps;
    b.page_table = d_pt;
    b.tok_splits = d_tsp;
    b.items = d_it;
    size_t qn = (size_t)n_tok * heads * hd;
    float *q = dmalloc(qn * 4), *o = dmalloc(qn * 4);
    dfill(q, PD_DTYPE_F32, qn, 1.0f);
    size_t split_rows = (size_t)(n_tok < 256 ? n_tok : 256) * heads * PD_KERNEL_ATTN_MAX_SPLITS;
    float *po = dmalloc(split_rows * hd * 4), *pml = dmalloc(split_rows * 2 * 4);
    /* bytes: K and V of every request once; flops: causal QK and PV */
    double kv_bytes = (double)n_reqs * ctx * 2.0 * kvh * hd * (double)esz;
    double flops = 0;
    for (int i = 0; i < n_new; i++)
        flops += 4.0 * hd * heads * (double)(ctx - n_new + i + 1);
    flops *= n_reqs;
    char sh[128];
    enum pdfi_dtype fk = pd_kernel_fi_dtype(kvt);
    if (fk && pdfi_attention_supported(fk, hd)) {
        /* what the backend runs for this pool: FlashInfer, planned as an eager step */
        struct fi_ctx f = {.qt = kvt == PD_DTYPE_F16 ? PD_DTYPE_F16 : PD_DTYPE_BF16,
                           .count = (int64_t)qn,
                           .q32 = q,
                           .o32 = o};
        f.ws.int_bytes = 8u << 20;
        f.ws.float_bytes = pdfi_float_workspace_bytes(sms, hd);
        f.ws.float_ws = dmalloc(f.ws.float_bytes);
        f.ws.int_ws = dmalloc(f.ws.int_bytes);
        CK(cudaMallocHost(&f.ws.int_ws_host, f.ws.int_bytes));
        void *qh = dmalloc(qn * 2), *oh = dmalloc(qn * 2);
        struct pd_kernel_convert_params cq = {q, qh, f.qt, (int64_t)qn};
        CK(pd_kernel_convert(&cq, st) ? cudaErrorUnknown : cudaSuccess);
        int32_t *last = pd_calloc((size_t)n_reqs, 4);
        for (int r = 0; r < n_reqs; r++)
            last[r] = ctx - (pages_per - 1) * ps;
        void *d_last = dmalloc((size_t)n_reqs * 4);
        CK(cudaMemcpy(d_last, last, (size_t)n_reqs * 4, cudaMemcpyHostToDevice));
        char err[256];
        if (pdfi_plan_step(&f.plan, &f.ws, ts, ps_, kl, n_tok, n_reqs, heads, kvh, hd, ps, fk,
                           false, true, st, err, sizeof(err))) {
            fprintf(stderr, "flashinfer plan: %s\n", err);
            exit(1);
        }
        f.a = (struct pdfi_attention_args){.kv_dtype = fk,
                                           .q = qh,
                                           .o = oh,
                                           .k = g.base,
                                           .v = (char *)g.base + g.page_bytes / 2,
                                           .stride_page = (int64_t)(g.page_bytes / esz),
                                           .stride_n = (int64_t)kvh * hd,
                                           .stride_h = hd,
                                           .qo_indptr = d_ts,
                                           .page_indptr = d_ps,
                                           .page_indices = d_pt,
                                           .last_page_len = d_last,
                                           .n_reqs = n_reqs,
                                           .page_size = ps,
                                           .scale = 1.0f / sqrtf((float)hd)};
        double t = time_it(fi_launch, &f, 20);
        if (f.plan.kernel == PDFI_SM90)
            snprintf(sh, sizeof(sh), "b%d new%d ctx%d h%d/%d d%d kv %s (flashinfer sm90)", n_reqs,
                     n_new, ctx, heads, kvh, hd, pd_dtype_kv_name(kvt));
        else
            snprintf(sh, sizeof(sh),
                     "b%d new%d ctx%d h%d/%d d%d kv %s (flashinfer fa2, cta %lld, split %d)",
                     n_reqs, n_new, ctx, heads, kvh, hd, pd_dtype_kv_name(kvt),
                     (long long)f.plan.info[3], (int)f.plan.info[14]);
        report(name, sh, t, n_new == 1 ? kv_bytes : 0, n_new > 1 ? flops : 0);
        f.conv = true;
        t = time_it(fi_launch, &f, 20);
        snprintf(sh, sizeof(sh), "b%d new%d ctx%d h%d/%d d%d kv %s (+ f32 q/o conversions)", n_reqs,
                 n_new, ctx, heads, kvh, hd, pd_dtype_kv_name(kvt));
        report(name, sh, t, n_new == 1 ? kv_bytes : 0, n_new > 1 ? flops : 0);
        cudaFree(f.ws.float_ws);
        cudaFree(f.ws.int_ws);
        cudaFreeHost(f.ws.int_ws_host);
        cudaFree(qh);
        cudaFree(oh);
        cudaFree(d_last);
        pd_free(last);
    } else {
        struct attn_ctx ac = {{g, 0, b, q, o, heads, 1.0f / sqrtf((float)hd), po, pml}};
        double t = time_it(attn_launch, &ac, 20);
        snprintf(sh, sizeof(sh), "b%d new%d ctx%d h%d/%d d%d kv %s (%d items, %d splits)", n_reqs,
                 n_new, ctx, heads, kvh, hd, pd_dtype_kv_name(kvt), b.n_items, b.max_splits);
        report(name, sh, t, n_new == 1 ? kv_bytes : 0, n_new > 1 ? flops : 0);
    }
    cudaFree(g.base);
    void *fr[] = {d_ts, d_kl, d_ps, d_pt, d_tsp, d_it, q, o, po, pml};
    for (size_t i = 0; i < PD_ARRAY_LEN(fr); i++)
        cudaFree(fr[i]);
    pd_free(ts);
    pd_free(kl);
    pd_free(ps_);
    pd_free(pt);
    pd_free(tsp);
    pd_free(items);
}

/* ---- a whole model ---- */

/* Every tensor is a view into one shared random bf16 block: host memory stays small, and the
 * backend still copies each weight to its own device buffer. */
struct shared_ckpt {
    struct pd_model_config cfg;
    void *block;
    struct pd_tensor_view v;
    char name[128];
};

static const struct pd_tensor_view *shared_find(void *ctx, const char *name) {
    struct shared_ckpt *s = ctx;
    const struct pd_model_config *c = &s->cfg;
    int64_t hid = c->hidden_size, qd = (int64_t)c->num_attention_heads * c->head_dim;
    int64_t kvd = (int64_t)c->num_key_value_heads * c->head_dim, in = c->intermediate_size;
    int64_t r = 1, co = hid;
    if (strstr(name, "embed_tokens") || strstr(name, "lm_head"))
        r = c->vocab_size;
    else if (strstr(name, "q_proj.weight"))
        r = qd;
    else if (strstr(name, "k_proj.weight") || strstr(name, "v_proj.weight"))
        r = kvd;
    else if (strstr(name, "o_proj.weight"))
        r = hid, co = qd;
    else if (strstr(name, "gate_proj") || strstr(name, "up_proj"))
        r = in;
    else if (strstr(name, "down_proj"))
        r = hid, co = in;
    else if (strstr(name, "q_proj.bias"))
        co = qd;
    else if (strstr(name, "k_proj.bias") || strstr(name, "v_proj.bias"))
        co = kvd;
    else if (strstr(name, "o_proj.bias") || strstr(name, "q_norm") || strstr(name, "k_norm"))
        return NULL;
    snprintf(s->name, sizeof(s->name), "%s", name);
    s->v = (struct pd_tensor_view){s->name,
                                   PD_DTYPE_BF16,
                                   r == 1 ? 1 : 2,
                                   {r == 1 ? co : r, co},
                                   s->block,
                                   (size_t)(r * co) * 2,
                                   0};
    if (r == 1)
        s->v.shape[1] = 0;
    return &s->v;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_op_us(const void *a, const void *b) {
    double x = ((const double *)a)[0], y = ((const double *)b)[0];
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The per-op table of one profiled step (pd_backend_cuda_profile): op, calls, µs, share. */
static void print_breakdown(const char *what, const struct pd_backend_cuda_profile *p,
                            double step_us) {
    double order[PD_CUDA_PROFILE_OPS][2];
    for (int i = 0; i < p->n; i++) {
        order[i][0] = p->op[i].us;
        order[i][1] = i;
    }
    qsort(order, (size_t)p->n, sizeof(order[0]), cmp_op_us);
    printf("breakdown: %s: %.1f us in ops (%.1f us the whole step, eager, events between ops)\n",
           what, p->total_us, step_us);
    for (int k = 0; k < p->n; k++) {
        int i = (int)order[k][1];
        printf("  %-28s %6lld calls %10.1f us %6.1f%%\n", p->op[i].name, (long long)p->op[i].calls,
               p->op[i].us, 100.0 * p->op[i].us / p->total_us);
        if (json)
            fprintf(json,
                    "%s{\"op\":\"breakdown\",\"shape\":\"%s | %s\",\"us\":%.2f,\"calls\":%lld,"
                    "\"share\":%.4f}",
                    json_n++ ? ",\n" : "", what, p->op[i].name, p->op[i].us,
                    (long long)p->op[i].calls, p->op[i].us / p->total_us);
    }
}

/* Decode steps at batch 1, 64, 256 and (full) the 4096-token prefill with a KV pool of kvt;
 * !full: the large batches only, where the KV read is a large share of the step. A decode step
 * is what the decode daemon runs for greedy requests: the model and the device argmax, ids and
 * logprobs back. breakdown: one step of batch 1 and 64 and one prefill again with per-op
 * events (print_breakdown). */
static void bench_model(bool quick, enum pd_dtype kvt, bool full, bool breakdown) {
    struct shared_ckpt *s = pd_calloc(1, sizeof(*s));
    struct pd_model_config *c = &s->cfg;
    /* Qwen2.5-1.5B's shape: tied embeddings, q/k/v bias, 12 heads over 2 kv heads of 128 */
    c->arch = PD_ARCH_QWEN2;
    c->vocab_size = 151936;
    c->hidden_size = 1536;
    c->intermediate_size = 8960;
    c->num_hidden_layers = 28;
    c->num_attention_heads = 12;
    c->num_key_value_heads = 2;
    c->head_dim = 128;
    c->max_position_embeddings = 32768;
    c->rms_norm_eps = 1e-6;
    c->rope_theta = 1000000;
    c->attention_bias = true;
    c->tie_word_embeddings = true;
    size_t max_elems = (size_t)c->vocab_size * c->hidden_size;
    uint16_t *blk = pd_malloc(max_elems * 2);
    uint64_t r = 5;
    for (size_t i = 0; i < max_elems; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        float f = 0.02f * ((float)((r >> 40) & 0xffffff) / 8388608.0f - 1.0f);
        blk[i] = pd_f32_to_bf16(f);
    }
    s->block = blk;
    struct pd_backend *be = NULL;
    struct pd_backend_opts o = {.kind = PD_BACKEND_CUDA};
    struct pd_model *m = NULL;
    struct pd_kv_pool kv = {0};
    int max_b = quick ? 64 : 256, ctx = 1024, prefill = 4096;
    struct pd_model_opts mo = {
        .max_tokens = prefill, .max_reqs = max_b, .page_size = 16, .context_length = 8192};
    if (pd_backend_new(&o, &be) || pd_model_new(be, c, shared_find, s, &mo, &m)) {
        fprintf(stderr, "model: %s\n", pd_error_msg());
        exit(1);
    }
    int pages_per = 8192 / 16;
    struct pd_kv_pool_opts ko = pd_model_kv_opts(m, kvt);
    ko.n_pages = (int64_t)max_b * (ctx / 16 + 1) + pages_per;
    if (pd_kv_pool_init(&kv, be, &ko)) {
        fprintf(stderr, "kv pool: %s\n", pd_error_msg());
        exit(1);
    }
    double wbytes = (double)pd_model_weight_bytes(m);
    float *logits = pd_malloc(sizeof(float) * (size_t)max_b * c->vocab_size);
    int32_t *ids = pd_calloc((size_t)max_b, 4);
    float *lps = pd_calloc((size_t)max_b, 4);
    struct pd_backend_cuda_profile *prof = pd_calloc(1, sizeof(*prof));
    int32_t *pages = pd_calloc((size_t)max_b * (ctx / 16 + 1), 4), *toks = pd_calloc(8192, 4);
    for (int64_t i = 0; i < (int64_t)max_b * (ctx / 16 + 1); i++)
        pages[i] = (int32_t)i;
    static const int batches[] = {1, 64, 256};
    for (size_t bi = 0; bi < PD_ARRAY_LEN(batches); bi++) {
        int B = batches[bi];
        if (B > max_b)
            break;
        if (!full && B == 1)
            continue;
        struct pd_model_seq *seqs = pd_calloc((size_t)B, sizeof(*seqs));
        for (int q = 0; q < B; q++)
            seqs[q] = (struct pd_model_seq){.tokens = toks + q,
                                            .n_new = 1,
                                            .n_cached = ctx - 1,
                                            .pages = pages + (size_t)q * (ctx / 16 + 1),
                                            .n_pages = ctx / 16 + 1};
        for (int w = 0; w < 3; w++)
            if (pd_model_decode_greedy(m, &kv, seqs, B, ids, lps)) {
                fprintf(stderr, "decode: %s\n", pd_error_msg());
                exit(1);
            }
        int steps = 30;
        double t0 = now_s();
        for (int i = 0; i < steps; i++)
            pd_model_decode_greedy(m, &kv, seqs, B, ids, lps);
        double t = (now_s() - t0) / steps;
        if (breakdown && B <= 64) {
            char what[64];
            memset(prof, 0, sizeof(*prof));
            pd_backend_cuda_profile(be, prof);
            double tb = now_s();
            pd_model_decode_greedy(m, &kv, seqs, B, ids, lps);
            tb = now_s() - tb;
            pd_backend_cuda_profile(be, NULL);
            snprintf(what, sizeof(what), "decode step batch %d ctx %d", B, ctx);
            print_breakdown(what, prof, tb * 1e6);
        }
        char sh[96];
        snprintf(sh, sizeof(sh), "qwen2.5-1.5b batch %d ctx %d kv %s", B, ctx,
                 pd_dtype_kv_name(kvt));
        report("decode_step", sh, t, wbytes, 0);
        printf("%-22s %-34s %10.3f ms/step  %9.0f tokens/s  (weights %.2f GB; target <= %.2f ms "
               "at 60%% of copy rate)\n",
               "", "", t * 1e3, B / t, wbytes / 1e9, wbytes / (0.6 * meas_bw) * 1e3);
        pd_free(seqs);
    }
    if (!full)
        goto done;
    /* prefill: one 4096-token prompt */
    struct pd_model_seq p = {
        .tokens = toks, .n_new = prefill, .n_cached = 0, .pages = pages, .n_pages = pages_per};
    pd_model_extend(m, &kv, &p, 1, false, logits);
    double t0 = now_s();
    int reps = 3;
    for (int i = 0; i < reps; i++)
        pd_model_extend(m, &kv, &p, 1, false, logits);
    double t = (now_s() - t0) / reps;
    double params = wbytes / 2 - (double)c->vocab_size * c->hidden_size; /* lm_head: 1 row */
    double fl = 2.0 * params * prefill + 2.0 * c->vocab_size * c->hidden_size +
                4.0 * c->head_dim * c->num_attention_heads * c->num_hidden_layers *
                    ((double)prefill * (prefill + 1) / 2);
    report("prefill", "qwen2.5-1.5b 4096 tokens", t, 0, fl);
    if (breakdown) {
        memset(prof, 0, sizeof(*prof));
        pd_backend_cuda_profile(be, prof);
        double tb = now_s();
        pd_model_extend(m, &kv, &p, 1, false, logits);
        tb = now_s() - tb;
        pd_backend_cuda_profile(be, NULL);
        print_breakdown("prefill 4096 tokens", prof, tb * 1e6);
    }
    struct pd_backend_cuda_stats cs;
    pd_backend_cuda_stats(be, &cs);
    printf("graphs: %lld captured, %lld launches over %lld steps\n", (long long)cs.graph_captures,
           (long long)cs.graph_launches, (long long)cs.steps);
done:
    pd_free(prof);
    pd_free(ids);
    pd_free(lps);
    pd_free(logits);
    pd_free(pages);
    pd_free(toks);
    pd_kv_pool_free(&kv);
    pd_model_free(m);
    pd_backend_free(be);
    pd_free(blk);
    pd_free(s);
}

/* Prefill of one 4096-token prompt on Llama-3.1-8B's shape (32 layers, 4096 wide, 14336 MLP, GQA
 * 32/8, vocab 128256; 16 GB of bf16 weights): model FLOPs against the measured GEMM rate. */
static void bench_prefill_8b(void) {
    struct shared_ckpt *s = pd_calloc(1, sizeof(*s));
    struct pd_model_config *c = &s->cfg;
    c->arch = PD_ARCH_LLAMA;
    c->vocab_size = 128256;
    c->hidden_size = 4096;
    c->intermediate_size = 14336;
    c->num_hidden_layers = 32;
    c->num_attention_heads = 32;
    c->num_key_value_heads = 8;
    c->head_dim = 128;
    c->max_position_embeddings = 131072;
    c->rms_norm_eps = 1e-5;
    c->rope_theta = 500000;
    size_t max_elems = (size_t)c->vocab_size * c->hidden_size;
    uint16_t *blk = pd_malloc(max_elems * 2);
    if (!s || !blk) {
        fprintf(stderr, "prefill 8b: no host memory for the weights block\n");
        exit(1);
    }
    uint64_t r = 7;
    for (size_t i = 0; i < max_elems; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        blk[i] = pd_f32_to_bf16(0.02f * ((float)((r >> 40) & 0xffffff) / 8388608.0f - 1.0f));
    }
    s->block = blk;
    const int prefill = 4096, pages_per = prefill / 16 + 1;
    struct pd_backend *be = NULL;
    struct pd_backend_opts o = {.kind = PD_BACKEND_CUDA};
    struct pd_model *m = NULL;
    struct pd_kv_pool kv = {0};
    struct pd_model_opts mo = {
        .max_tokens = prefill, .max_reqs = 1, .page_size = 16, .context_length = 8192};
    if (pd_backend_new(&o, &be) || pd_model_new(be, c, shared_find, s, &mo, &m)) {
        fprintf(stderr, "model 8b: %s\n", pd_error_msg());
        exit(1);
    }
    struct pd_kv_pool_opts ko = pd_model_kv_opts(m, PD_DTYPE_BF16);
    ko.n_pages = pages_per;
    if (pd_kv_pool_init(&kv, be, &ko)) {
        fprintf(stderr, "kv pool 8b: %s\n", pd_error_msg());
        exit(1);
    }
    double wbytes = (double)pd_model_weight_bytes(m);
    float *logits = pd_malloc(sizeof(float) * (size_t)c->vocab_size);
    int32_t *pages = pd_calloc((size_t)pages_per, 4), *toks = pd_calloc((size_t)prefill, 4);
    for (int i = 0; i < pages_per; i++)
        pages[i] = i;
    for (int i = 0; i < prefill; i++)
        toks[i] = (int32_t)((i * 7919) % c->vocab_size);
    struct pd_model_seq p = {
        .tokens = toks, .n_new = prefill, .n_cached = 0, .pages = pages, .n_pages = pages_per};
    if (pd_model_extend(m, &kv, &p, 1, false, logits)) {
        fprintf(stderr, "prefill 8b: %s\n", pd_error_msg());
        exit(1);
    }
    double t0 = now_s();
    int reps = 3;
    for (int i = 0; i < reps; i++)
        pd_model_extend(m, &kv, &p, 1, false, logits);
    double t = (now_s() - t0) / reps;
    /* 2 FLOPs per weight per token (the lm_head only for the last row) + causal attention */
    double params = wbytes / 2 - 2.0 * c->vocab_size * c->hidden_size;
    double fl = 2.0 * params * prefill + 2.0 * c->vocab_size * c->hidden_size +
                4.0 * c->head_dim * c->num_attention_heads * c->num_hidden_layers *
                    ((double)prefill * (prefill + 1) / 2);
    report("prefill", "llama-3.1-8b 4096 tokens", t, 0, fl);
    printf("%-22s %-34s %10.1f ms  %6.0f tokens/s  (target: >= 50%% of the gemm rate)\n", "", "",
           t * 1e3, prefill / t);
    pd_free(logits);
    pd_free(pages);
    pd_free(toks);
    pd_kv_pool_free(&kv);
    pd_model_free(m);
    pd_backend_free(be);
    pd_free(blk);
    pd_free(s);
}

int pd_bench_gpu_main(int argc, char **argv) {
    bool quick = false, breakdown = false;
    const char *json_path = NULL;
    /* the model's KV pool: bf16 is --kv-cache-dtype auto for this bf16 model, what SGLang
     * runs and the targets assume; an fp8 e4m3 decode line follows it either way */
    enum pd_dtype kvt = PD_DTYPE_BF16;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = true;
        } else if (strcmp(argv[i], "--breakdown") == 0) {
            breakdown = true;
        } else if (strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
            json_path = argv[++i];
        } else if (strcmp(argv[i], "--kv-cache-dtype") == 0 && i + 1 < argc) {
            const char *v = argv[++i];
            int c = -1;
            for (int j = 0; pd_kv_cache_dtype_names[j]; j++)
                if (strcmp(v, pd_kv_cache_dtype_names[j]) == 0)
                    c = j;
            if (c < 0) {
                fprintf(stderr,
                        "--kv-cache-dtype %s: not one of auto, bf16, fp16, fp32, "
                        "fp8_e4m3, fp8_e5m2\n",
                        v);
                return 2;
            }
            if (!pd_kv_cache_dtype_of(c, &kvt))
                kvt = PD_DTYPE_BF16; /* auto: the model's dtype */
        } else {
            fprintf(stderr,
                    "perf mode: unknown argument %s (--quick, --breakdown, --json FILE, "
                    "--kv-cache-dtype T)\n",
                    argv[i]);
            return 2;
        }
    }
    struct cudaDeviceProp prop;
    int dev = 0, memclk = 0, bus = 0, clk = 0;
    CK(cudaGetDeviceProperties(&prop, dev));
    if (pd_kernel_gemv_init()) {
        fprintf(stderr, "few-row product: %s\n", pd_error_msg());
        return 1;
    }
    CK(cudaDeviceGetAttribute(&memclk, cudaDevAttrMemoryClockRate, dev));   /* kHz */
    CK(cudaDeviceGetAttribute(&bus, cudaDevAttrGlobalMemoryBusWidth, dev)); /* bits */
    CK(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, dev));            /* kHz */
    peak_bw = 2.0 * memclk * 1e3 * bus / 8;                                 /* double data rate */
    peak_tf = (double)prop.multiProcessorCount * 4096.0 * clk * 1e3;        /* Hopper dense bf16 */
    printf("device: %s, %d SMs, sm_%d%d, %.0f MHz, memory %.0f MHz x %d bit\n", prop.name,
           prop.multiProcessorCount, prop.major, prop.minor, clk / 1e3, memclk / 1e3, bus);
    printf("peaks from the device: %.0f GB/s HBM, %.0f TFLOP/s dense bf16 (H200 datasheet: 4800 "
           "GB/s, 989 TFLOP/s)\n",
           peak_bw / 1e9, peak_tf / 1e12);
    if (json_path) {
        json = fopen(json_path, "w");
        if (!json) {
            fprintf(stderr, "cannot write %s\n", json_path);
            return 1;
        }
        fprintf(json,
                "{\"device\":\"%s\",\"sms\":%d,\"peak_gbps\":%.1f,\"peak_tflops\":%.1f,"
                "\"results\":[\n",
                prop.name, prop.multiProcessorCount, peak_bw / 1e9, peak_tf / 1e12);
    }
    /* a blocking stream: setup here is cudaMemset / pageable cudaMemcpy on the legacy stream,
     * which a non-blocking stream does not wait for (and a pageable copy may return before its
     * DMA lands): the penalty setup's one id buffer was rewritten under the kernel reading it,
     * and state zeroing raced the kernels filling it. The timed launches use st alone. */
    CK(cudaStreamCreate(&st));
    struct pd_kernel_gemm *g = NULL;
    if (pd_kernel_gemm_new(st, 32u << 20, &g)) {
        fprintf(stderr, "gemm: %s\n", pd_error_msg());
        return 1;
    }
    bench_limits(g, quick);
    bench_rows();
    bench_sample();
    int sms = prop.multiProcessorCount;
    bench_attn("attn_decode", kvt, 64, 1, 4096, 32, 8, 128, sms);
    bench_attn("attn_decode", kvt, 256, 1, 1024, 12, 2, 128, sms);
    bench_attn("attn_decode (split)", kvt, 1, 1, 32768, 32, 8, 128, sms);
    bench_attn("attn_decode (split)", kvt, 8, 1, 8192, 64, 8, 128, sms);
    bench_attn("attn_extend", kvt, 1, 4096, 4096, 32, 8, 128, sms);
    bench_attn("attn_extend (chunk)", kvt, 1, 512, 8192, 32, 8, 128, sms);
    bench_attn("attn_extend d64", kvt, 1, 2048, 2048, 16, 16, 64, sms);
    if (kvt != PD_DTYPE_F8E4M3)
        bench_attn("attn_decode", PD_DTYPE_F8E4M3, 64, 1, 4096, 32, 8, 128, sms);
    pd_kernel_gemm_free(g);
    bench_model(quick, kvt, true, breakdown);
    if (kvt != PD_DTYPE_F8E4M3)
        bench_model(quick, PD_DTYPE_F8E4M3, false, false);
    bench_prefill_8b();
    if (json) {
        fprintf(json, "\n],\"measured_copy_gbps\":%.1f,\"measured_gemm_tflops\":%.1f}\n",
                meas_bw / 1e9, meas_tf / 1e12);
        fclose(json);
    }
    cudaStreamDestroy(st);
    return 0;
}
