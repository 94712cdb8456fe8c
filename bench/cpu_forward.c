/*
 * cpu_forward.c — pdserve-bench-cpu-forward: speed of the cpu backend's forward pass on a
 * qwen2.5-0.5b-shaped model with random bf16 (or f32) weights built in memory, each figure next
 * to a limit measured in the same run on the same machine:
 *   - decode tok/s at batch 1, 8, 32 vs weight bytes / memory-streaming read rate;
 *   - prefill tok/s of a 512-token prompt vs the OpenBLAS f32 GEMM rate, counting 2 FLOPs per
 *     non-embedding parameter per token (the vocabulary product runs for the last token only).
 * Every figure is the median of several runs (shared machines are noisy). Targets (issue 10):
 * decode b1 >= 85% of its bound, b8 >= 5x b1, prefill >= 70% of the GEMM rate.
 * Usage: pdserve-bench-cpu-forward [THREADS [bf16|f32 (weights) [KV_DTYPE]]], KV_DTYPE one of
 * --kv-cache-dtype's spellings (default auto = float32 on cpu).
 */
#include "common/base/alloc.h"
#include "model/model.h"
#include "common/base/status.h"

#include <cblas.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef __x86_64__
#include <immintrin.h>
#endif

void openblas_set_num_threads(int num_threads);

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- random in-memory checkpoint ---- */

struct bench_ckpt {
    struct pd_tensor_view t[400];
    char names[400][96];
    int n;
};

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_rand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static int add_tensor(struct bench_ckpt *ck, const char *name, int64_t rows, int64_t cols,
                      enum pd_dtype dt, bool is_norm) {
    struct pd_tensor_view *t = &ck->t[ck->n];
    snprintf(ck->names[ck->n], sizeof(ck->names[0]), "%s", name);
    t->name = ck->names[ck->n];
    t->dtype = dt;
    t->ndim = rows == 1 ? 1 : 2;
    t->shape[0] = rows == 1 ? cols : rows;
    t->shape[1] = rows == 1 ? 0 : cols;
    size_t n = (size_t)(rows * cols);
    t->nbytes = n * pd_dtype_size(dt);
    void *d = pd_malloc(t->nbytes);
    if (!d)
        return PD_ENOMEM;
    /* values of magnitude ~0.02 (norm weights ~1): finite, and activations stay tame */
    for (size_t i = 0; i < n; i += 4) {
        uint64_t r = next_rand();
        for (size_t j = 0; j < 4 && i + j < n; j++) {
            uint16_t bits = (uint16_t)(r >> (16 * j));
            float v = is_norm ? 1.0f : ((float)(bits & 0x7fff) / 32768.0f - 0.5f) * 0.06f;
            if (dt == PD_DTYPE_F32)
                ((float *)d)[i + j] = v;
            else
                ((uint16_t *)d)[i + j] = pd_f32_to_bf16(v);
        }
    }
    t->data = d;
    ck->n++;
    return PD_OK;
}

static const struct pd_tensor_view *find(void *ctx, const char *name) {
    struct bench_ckpt *ck = ctx;
    for (int i = 0; i < ck->n; i++)
        if (strcmp(ck->t[i].name, name) == 0)
            return &ck->t[i];
    return NULL;
}

static struct pd_model_config qwen25_05b(void) {
    struct pd_model_config c = {0};
    c.arch = PD_ARCH_QWEN2;
    c.vocab_size = 151936;
    c.hidden_size = 896;
    c.intermediate_size = 4864;
    c.num_hidden_layers = 24;
    c.num_attention_heads = 14;
    c.num_key_value_heads = 2;
    c.head_dim = 64;
    c.max_position_embeddings = 32768;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 1000000.0;
    c.tie_word_embeddings = true;
    c.attention_bias = true;
    return c;
}

static int build_ckpt(const struct pd_model_config *c, enum pd_dtype dt, struct bench_ckpt *ck) {
    int64_t h = c->hidden_size, qd = (int64_t)c->num_attention_heads * c->head_dim;
    int64_t kvd = (int64_t)c->num_key_value_heads * c->head_dim, in = c->intermediate_size;
    char n[96];
    int rc = add_tensor(ck, "model.embed_tokens.weight", c->vocab_size, h, dt, false);
    rc = rc ? rc : add_tensor(ck, "model.norm.weight", 1, h, dt, true);
    for (int l = 0; l < c->num_hidden_layers && !rc; l++) {
        struct {
            const char *s;
            int64_t r, co;
            bool norm;
        } ts[] = {
            {"input_layernorm.weight", 1, h, true},
            {"post_attention_layernorm.weight", 1, h, true},
            {"self_attn.q_proj.weight", qd, h, false},
            {"self_attn.k_proj.weight", kvd, h, false},
            {"self_attn.v_proj.weight", kvd, h, false},
            {"self_attn.q_proj.bias", 1, qd, false},
            {"self_attn.k_proj.bias", 1, kvd, false},
            {"self_attn.v_proj.bias", 1, kvd, false},
            {"self_attn.o_proj.weight", h, qd, false},
            {"mlp.gate_proj.weight", in, h, false},
            {"mlp.up_proj.weight", in, h, false},
            {"mlp.down_proj.weight", h, in, false},
        };
        for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]) && !rc; i++) {
            snprintf(n, sizeof(n), "model.layers.%d.%s", l, ts[i].s);
            rc = add_tensor(ck, n, ts[i].r, ts[i].co, dt, ts[i].norm);
        }
    }
    return rc;
}

/* ---- limits ---- */

struct stream_arg {
    const char *p;
    size_t bytes;
    double sum;
};

#ifdef __x86_64__
__attribute__((target("avx2"))) static void *stream_read(void *arg) {
    struct stream_arg *a = arg;
    __m256i acc0 = _mm256_setzero_si256(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    for (size_t i = 0; i + 128 <= a->bytes; i += 128) {
        const __m256i *q = (const __m256i *)(a->p + i);
        acc0 = _mm256_xor_si256(acc0, _mm256_loadu_si256(q));
        acc1 = _mm256_xor_si256(acc1, _mm256_loadu_si256(q + 1));
        acc2 = _mm256_xor_si256(acc2, _mm256_loadu_si256(q + 2));
        acc3 = _mm256_xor_si256(acc3, _mm256_loadu_si256(q + 3));
    }
    acc0 = _mm256_xor_si256(_mm256_xor_si256(acc0, acc1), _mm256_xor_si256(acc2, acc3));
    a->sum = (double)_mm256_extract_epi64(acc0, 0);
    return NULL;
}
#else
static void *stream_read(void *arg) {
    struct stream_arg *a = arg;
    uint64_t x = 0;
    for (size_t i = 0; i + 8 <= a->bytes; i += 8) {
        uint64_t v;
        memcpy(&v, a->p + i, 8);
        x ^= v;
    }
    a->sum = (double)x;
    return NULL;
}
#endif

/* Bytes/s reading `bytes` at p with nth threads, median of reps. */
static double read_rate(const char *p, size_t bytes, int nth, int reps) {
    double r[16];
    pthread_t th[64];
    struct stream_arg args[64];
    for (int k = 0; k < reps; k++) {
        double t0 = now();
        for (int i = 0; i < nth; i++) {
            args[i] = (struct stream_arg){p + bytes / nth * i, bytes / nth, 0};
            pthread_create(&th[i], NULL, stream_read, &args[i]);
        }
        for (int i = 0; i < nth; i++)
            pthread_join(th[i], NULL);
        r[k] = (double)bytes / (now() - t0);
    }
    return median(r, reps);
}

static double gemm_rate(int nth, int m, int n, int k, int reps) {
    float *a = pd_calloc((size_t)m * k, 4), *b = pd_calloc((size_t)n * k, 4);
    float *c = pd_calloc((size_t)m * n, 4);
    double r[16];
    for (size_t i = 0; i < (size_t)m * k; i++)
        a[i] = (float)(i % 7) * 0.1f;
    for (size_t i = 0; i < (size_t)n * k; i++)
        b[i] = (float)(i % 5) * 0.1f;
    openblas_set_num_threads(nth);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1, a, k, b, k, 0, c, n);
    for (int i = 0; i < reps; i++) {
        double t0 = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1, a, k, b, k, 0, c, n);
        r[i] = 2.0 * m * n * k / (now() - t0);
    }
    openblas_set_num_threads(1);
    pd_free(a);
    pd_free(b);
    pd_free(c);
    return median(r, reps);
}

/* ---- runs ---- */

static int decode_rate(struct pd_model *m, struct pd_kv_pool *kv, int batch, int steps,
                       double *tok_s) {
    enum { PROMPT = 32 };
    int ps = pd_model_opts_of(m)->page_size, pages = (PROMPT + steps + ps) / ps + 1;
    int32_t *pt = pd_calloc((size_t)batch * pages, sizeof(int32_t));
    int32_t toks[PROMPT], *cur = pd_calloc((size_t)batch, sizeof(int32_t));
    float *lg = pd_calloc((size_t)batch * pd_model_config_of(m)->vocab_size, sizeof(float));
    struct pd_model_seq *s = pd_calloc((size_t)batch, sizeof(*s));
    double t[64];
    int rc = (!pt || !cur || !lg || !s) ? PD_ENOMEM : PD_OK;
    for (int i = 0; i < PROMPT; i++)
        toks[i] = (i * 7919) % 151936;
    for (int b = 0; b < batch && !rc; b++) {
        for (int j = 0; j < pages; j++)
            pt[b * pages + j] = b * pages + j;
        struct pd_model_seq p = {toks, PROMPT, 0, pt + b * pages, pages};
        rc = pd_model_extend(m, kv, &p, 1, false, lg);
    }
    for (int step = 0; step < steps && !rc; step++) {
        for (int b = 0; b < batch; b++) {
            cur[b] = (step * 31 + b) % 151936;
            s[b] = (struct pd_model_seq){&cur[b], 1, PROMPT + step, pt + b * pages, pages};
        }
        double t0 = now();
        rc = pd_model_decode(m, kv, s, batch, lg);
        t[step] = now() - t0;
    }
    if (!rc)
        *tok_s = batch / median(t, steps);
    pd_free(pt);
    pd_free(cur);
    pd_free(lg);
    pd_free(s);
    return rc;
}

static int prefill_rate(struct pd_model *m, struct pd_kv_pool *kv, int len, int reps,
                        double *tok_s) {
    int ps = pd_model_opts_of(m)->page_size, pages = (len + ps - 1) / ps;
    int32_t *pt = pd_calloc((size_t)pages, sizeof(int32_t)), *toks = pd_calloc((size_t)len, 4);
    float *lg = pd_calloc((size_t)pd_model_config_of(m)->vocab_size, sizeof(float));
    double t[16];
    int rc = (!pt || !toks || !lg) ? PD_ENOMEM : PD_OK;
    for (int i = 0; i < pages; i++)
        pt[i] = i;
    for (int i = 0; i < len; i++)
        toks[i] = (i * 104729) % 151936;
    for (int r = 0; r < reps && !rc; r++) {
        struct pd_model_seq s = {toks, len, 0, pt, pages};
        double t0 = now();
        rc = pd_model_extend(m, kv, &s, 1, false, lg);
        t[r] = now() - t0;
    }
    if (!rc)
        *tok_s = len / median(t, reps);
    pd_free(pt);
    pd_free(toks);
    pd_free(lg);
    return rc;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 0;
    bool f32 = argc > 2 && strcmp(argv[2], "f32") == 0;
    enum pd_dtype dt = f32 ? PD_DTYPE_F32 : PD_DTYPE_BF16, kvt = PD_DTYPE_F32;
    if (argc > 3) {
        int c = -1;
        for (int j = 0; pd_kv_cache_dtype_names[j]; j++)
            if (strcmp(argv[3], pd_kv_cache_dtype_names[j]) == 0)
                c = j;
        if (c < 0) {
            fprintf(stderr,
                    "pdserve-bench-cpu-forward: KV dtype '%s' is not one of auto, bf16, "
                    "fp16, fp32, fp8_e4m3, fp8_e5m2\n",
                    argv[3]);
            return 2;
        }
        pd_kv_cache_dtype_of(c, &kvt); /* auto: float32, as on the cpu backend */
    }
    struct pd_model_config cfg = qwen25_05b();
    static struct bench_ckpt ck;
    struct pd_backend *be = NULL;
    struct pd_model *m = NULL;
    struct pd_kv_pool kv = {0};
    struct pd_backend_opts bo = {.kind = PD_BACKEND_CPU, .threads = threads};
    struct pd_model_opts mo = {
        .max_tokens = 512, .max_reqs = 32, .page_size = 16, .context_length = 4096};
    int rc;
    if ((rc = pd_backend_new(&bo, &be)) || (rc = build_ckpt(&cfg, dt, &ck)) ||
        (rc = pd_model_new(be, &cfg, find, &ck, &mo, &m)))
        goto out;
    struct pd_kv_pool_opts ko = pd_model_kv_opts(m, kvt);
    ko.n_pages = 32 * 8 + 40;
    if ((rc = pd_kv_pool_init(&kv, be, &ko)))
        goto out;
    int nth = 0;
    sscanf(pd_backend_name(be), "cpu (%d", &nth);
    size_t wbytes = pd_model_weight_bytes(m);
    int64_t params = 0, emb = (int64_t)cfg.vocab_size * cfg.hidden_size;
    for (int i = 0; i < ck.n; i++)
        params += (int64_t)(ck.t[i].nbytes / pd_dtype_size(ck.t[i].dtype));
    printf("model: qwen2.5-0.5b shape, %s weights, %.1fM params (%.1fM non-embedding), %s KV, "
           "%s\n",
           pd_dtype_name(dt), params / 1e6, (params - emb) / 1e6, pd_dtype_kv_name(kvt),
           pd_backend_name(be));
    printf("weight bytes read per decode step: %.1f MB\n", wbytes / 1e6);

    /* limits, measured now: read the embedding + first layers (far larger than any cache) */
    const struct pd_tensor_view *big = find(&ck, "model.embed_tokens.weight");
    double rd = read_rate(big->data, big->nbytes, nth, 7);
    double gemm = gemm_rate(nth, 512, 4864, 896, 7);
    printf("limit: memory read %.2f GB/s (%d threads, %.0f MB), f32 GEMM %.1f GFLOP/s (OpenBLAS, "
           "512x4864x896, %d threads)\n",
           rd / 1e9, nth, big->nbytes / 1e6, gemm / 1e9, nth);

    double bound1 = rd / (double)wbytes, d[3];
    static const int batches[3] = {1, 8, 32};
    for (int i = 0; i < 3; i++) {
        if ((rc = decode_rate(m, &kv, batches[i], i == 0 ? 15 : 9, &d[i])))
            goto out;
        printf("decode batch %2d: %7.2f tok/s   (bound at batch 1: %.2f tok/s = read rate / "
               "weight bytes; %.0f%% of it per step)\n",
               batches[i], d[i], bound1, 100.0 * (d[i] / batches[i]) / bound1);
    }
    printf("decode batch 8 / batch 1: %.2fx (target >= 5x); batch 1 at %.0f%% of bound (target >= "
           "85%%)\n",
           d[1] / d[0], 100.0 * d[0] / bound1);
    double pf;
    if ((rc = prefill_rate(m, &kv, 512, 5, &pf)))
        goto out;
    double flops = 2.0 * (double)(params - emb) * pf;
    printf("prefill 512 tokens: %.1f tok/s = %.1f GFLOP/s model FLOPs (2 x non-embedding params), "
           "%.0f%% of the f32 GEMM rate (target >= 70%%)\n",
           pf, flops / 1e9, 100.0 * flops / gemm);
out:
    if (rc)
        fprintf(stderr, "pdserve-bench-cpu-forward: %s\n", pd_error_msg());
    pd_kv_pool_free(&kv);
    pd_model_free(m);
    pd_backend_free(be);
    for (int i = 0; i < ck.n; i++)
        pd_free((void *)ck.t[i].data);
    return rc ? 1 : 0;
}
