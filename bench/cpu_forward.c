/*
 * cpu_forward.c — pdserve-bench-cpu-forward: speed of the cpu backend's forward pass on a
 * qwen2.5-0.5b-shaped model with random bf16 (or f32) weights built in memory, each figure next
 * to a limit measured in the same run on the same machine:
 *   - decode tok/s at batch 1 against a read of the step's weight bytes the way the GEMV reads
 *     them (and by memcpy), the two alternating round by round; batch 8 and 32 against batch 1;
 *     the share of a decode step that attention takes at context 4,096;
 *   - prefill tok/s of 512- and 2,048-token prompts against the f32 FMA and bf16 dot peaks of
 *     the cores (and OpenBLAS's f32 GEMM), counting 2 FLOPs per non-embedding parameter per
 *     token (the vocabulary product runs for the last token only).
 * Every figure is a median (shared machines are noisy). Targets (issue 15): decode b1 >= 85% of
 * its bound, b8 >= 5x b1.
 * Usage: pdserve-bench-cpu-forward [THREADS [bf16|f32 (weights) [KV_DTYPE]]], KV_DTYPE one of
 * --kv-cache-dtype's spellings (default auto = float32 on cpu).
 */
#include "common/base/alloc.h"
#include "common/base/status.h"
#include "model/cpu/backend_cpu.h" /* the kernels' thread pool and tiled layout: read as they do */
#include "model/model.h"

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

/* The decode bound (decode_vs_bound) is a read of a step's weights as the tiled GEMV reads them,
 * less its arithmetic; next to it, glibc memcpy of the same bytes by the same threads. */
struct read_arg {
    const char *p;
    size_t bytes;
    uint64_t sum;
};

#ifdef __x86_64__
__attribute__((target("avx512f"))) static uint64_t read512(const char *p, size_t n) {
    __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
    for (size_t i = 0; i + 256 <= n; i += 256) {
        const __m512i *q = (const __m512i *)(p + i);
        a = _mm512_xor_si512(a, _mm512_load_si512(q));
        b = _mm512_xor_si512(b, _mm512_load_si512(q + 1));
        c = _mm512_xor_si512(c, _mm512_load_si512(q + 2));
        d = _mm512_xor_si512(d, _mm512_load_si512(q + 3));
    }
    a = _mm512_xor_si512(_mm512_xor_si512(a, b), _mm512_xor_si512(c, d));
    return (uint64_t)_mm512_reduce_add_epi64(a);
}

__attribute__((target("avx2"))) static uint64_t read256(const char *p, size_t n) {
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        const __m256i *q = (const __m256i *)(p + i);
        a = _mm256_xor_si256(a, _mm256_load_si256(q));
        b = _mm256_xor_si256(b, _mm256_load_si256(q + 1));
        c = _mm256_xor_si256(c, _mm256_load_si256(q + 2));
        d = _mm256_xor_si256(d, _mm256_load_si256(q + 3));
    }
    a = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
    return (uint64_t)_mm256_extract_epi64(a, 0);
}
#endif

static uint64_t read_words(const char *p, size_t n) {
#ifdef __x86_64__
    if (__builtin_cpu_supports("avx512f"))
        return read512(p, n);
    if (__builtin_cpu_supports("avx2"))
        return read256(p, n);
#endif
    uint64_t x = 0;
    for (size_t i = 0; i + 8 <= n; i += 8) {
        uint64_t v;
        memcpy(&v, p + i, 8);
        x ^= v;
    }
    return x;
}

/* memcpy of a share in 64 KB pieces into a per-thread buffer that stays in L2 */
static void *memcpy_share(void *arg) {
    struct read_arg *a = arg;
    static _Thread_local char piece[64 * 1024];
    for (size_t i = 0; i < a->bytes; i += sizeof(piece)) {
        size_t n = a->bytes - i < sizeof(piece) ? a->bytes - i : sizeof(piece);
        memcpy(piece, a->p + i, n);
        a->sum += (uint8_t)piece[n - 1];
    }
    return NULL;
}

/* A decode step's weight reads without its arithmetic: the matrices of a step in the model's
 * order (shapes [m][k] of type dt, as the backend lays them out: tiled or row-major), one after
 * the other from buf, each split over the backend's kind of thread pool by the GEMV's own split
 * (whole tiles, or rows) and streamed with 64-byte loads. */
struct step_read {
    const char *buf;
    enum pd_dtype dt;
    bool tiled;
    int64_t m, k;
    size_t off;
    uint64_t sum[1024]; /* per thread (--threads <= 1024) */
};

static size_t mat_unit_bytes(const struct step_read *r) { /* a tile or a row */
    return r->tiled ? pd__cpu_tiled_bytes(r->dt, PD_CPU_TILE_ROWS, r->k)
                    : (size_t)r->k * pd_dtype_size(r->dt);
}

static void step_read_task(void *ctx, int tid, int nth) {
    struct step_read *r = ctx;
    int64_t units = r->tiled ? (r->m + PD_CPU_TILE_ROWS - 1) / PD_CPU_TILE_ROWS : r->m, u0, u1;
    pd__cpu_split(units, tid, nth, &u0, &u1);
    size_t ub = mat_unit_bytes(r);
    r->sum[tid] += read_words(r->buf + r->off + (size_t)u0 * ub, (size_t)(u1 - u0) * ub);
}

/* The matrices a decode step reads, in order: per layer q, k, v, o, gate, up, down; lm_head. */
static int step_shapes(const struct pd_model_config *c, int64_t (*sh)[2]) {
    int64_t h = c->hidden_size, qd = (int64_t)c->num_attention_heads * c->head_dim;
    int64_t kvd = (int64_t)c->num_key_value_heads * c->head_dim, in = c->intermediate_size;
    int n = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const int64_t layer[7][2] = {{qd, h}, {kvd, h}, {kvd, h}, {h, qd},
                                     {in, h}, {in, h},  {h, in}};
        memcpy(sh + n, layer, sizeof(layer));
        n += 7;
    }
    sh[n][0] = c->vocab_size;
    sh[n][1] = h;
    return n + 1;
}

static size_t step_bytes(const struct pd_model_config *c, enum pd_dtype dt, bool tiled) {
    static int64_t sh[1024][2];
    int n = step_shapes(c, sh);
    size_t b = 0;
    for (int i = 0; i < n; i++)
        b += tiled ? pd__cpu_tiled_bytes(dt, sh[i][0], sh[i][1])
                   : (size_t)(sh[i][0] * sh[i][1]) * pd_dtype_size(dt);
    return b;
}

static double step_read_pass(struct pd__cpu_pool *pool, const struct pd_model_config *c,
                             const char *buf, enum pd_dtype dt, bool tiled) {
    static int64_t sh[1024][2];
    int n = step_shapes(c, sh);
    struct step_read r = {.buf = buf, .dt = dt, .tiled = tiled};
    double t0 = now();
    for (int i = 0; i < n; i++) {
        r.m = sh[i][0];
        r.k = sh[i][1];
        pd__cpu_pool_run(pool, step_read_task, &r);
        r.off +=
            tiled ? pd__cpu_tiled_bytes(dt, r.m, r.k) : (size_t)(r.m * r.k) * pd_dtype_size(dt);
    }
    return now() - t0;
}

/* Seconds for nth threads to memcpy-read `bytes` at p in contiguous shares. */
static double memcpy_pass(const char *p, size_t bytes, int nth) {
    pthread_t th[1024];
    struct read_arg args[1024];
    size_t share = bytes / (size_t)nth / 256 * 256;
    double t0 = now();
    for (int i = 0; i < nth; i++) {
        args[i] = (struct read_arg){p + share * (size_t)i, share, 0};
        pthread_create(&th[i], NULL, memcpy_share, &args[i]);
    }
    for (int i = 0; i < nth; i++)
        pthread_join(th[i], NULL);
    return (now() - t0) * (double)bytes / (double)(share * (size_t)nth);
}

/* Arithmetic peaks of all threads, registers only: f32 FMA (the prefill GEMM's instruction
 * without AMX; 16 lanes with AVX-512, else 8 with AVX2), where the CPU has AVX-512 BF16 the bf16
 * dot product (vdpbf16ps, 2 FLOPs per bf16 pair), and where the backend runs AMX the bf16 tile
 * product (TDPBF16PS, 16x16x32 pairs' 2 FLOPs), which the prefill product runs three times per
 * product of f32 activations (backend_cpu_kernels.c): its bound is a third of that peak. */
enum peak_kind { PEAK_FMA, PEAK_DOT, PEAK_AMX };
struct peak_arg {
    enum peak_kind kind;
    long iters;
    float out;
};

static int fma_lanes(void) {
#ifdef __x86_64__
    if (__builtin_cpu_supports("avx512f"))
        return 16;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return 8;
#endif
    return 0;
}

#ifdef __x86_64__
__attribute__((target("avx512f"))) static float fma_loop(long iters) {
    __m512 a[12], m = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-3f);
    for (int i = 0; i < 12; i++)
        a[i] = _mm512_set1_ps((float)i);
    for (long n = 0; n < iters; n++)
        for (int i = 0; i < 12; i++)
            a[i] = _mm512_fmadd_ps(a[i], m, c);
    for (int i = 1; i < 12; i++)
        a[0] = _mm512_add_ps(a[0], a[i]);
    return _mm512_reduce_add_ps(a[0]);
}

__attribute__((target("avx2,fma"))) static float fma_loop256(long iters) {
    __m256 a[12], m = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-3f);
    for (int i = 0; i < 12; i++)
        a[i] = _mm256_set1_ps((float)i);
    for (long n = 0; n < iters; n++)
        for (int i = 0; i < 12; i++)
            a[i] = _mm256_fmadd_ps(a[i], m, c);
    for (int i = 1; i < 12; i++)
        a[0] = _mm256_add_ps(a[0], a[i]);
    float v[8];
    _mm256_storeu_ps(v, a[0]);
    return v[0] + v[7];
}

__attribute__((target("avx512f,avx512bf16"))) static float dpbf16_loop(long iters) {
    __m512 a[12];
    __m512bh x = (__m512bh)_mm512_set1_epi16(0x3c00), y = (__m512bh)_mm512_set1_epi16(0x0001);
    for (int i = 0; i < 12; i++)
        a[i] = _mm512_set1_ps((float)i);
    for (long n = 0; n < iters; n++)
        for (int i = 0; i < 12; i++)
            a[i] = _mm512_dpbf16_ps(a[i], x, y);
    for (int i = 1; i < 12; i++)
        a[0] = _mm512_add_ps(a[0], a[i]);
    return _mm512_reduce_add_ps(a[0]);
}

/* Four TDPBF16PS an iteration into four sum tiles, each pair of operand tiles used twice (the
 * prefill kernel's 2x2 blocking). The process's AMX permission is the backend's (it asked). */
__attribute__((target("amx-tile,amx-bf16"))) static float amx_loop(long iters) {
    static const uint16_t ops[512] __attribute__((aligned(64))) = {0x3c00};
    float out[256] __attribute__((aligned(64)));
    _tile_loadconfig(&pd__cpu_amx_cfg);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, ops, 64);
    _tile_loadd(5, ops, 64);
    _tile_loadd(6, ops, 64);
    _tile_loadd(7, ops, 64);
    for (long n = 0; n < iters; n++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, out, 64);
    _tile_release();
    return out[0];
}
#endif

static void *peak_thread(void *arg) {
    struct peak_arg *a = arg;
#ifdef __x86_64__
    a->out = a->kind == PEAK_AMX   ? amx_loop(a->iters)
             : a->kind == PEAK_DOT ? dpbf16_loop(a->iters)
             : fma_lanes() == 16   ? fma_loop(a->iters)
                                   : fma_loop256(a->iters);
#endif
    return NULL;
}

/* FLOP/s of nth threads, the best of reps (a peak: the machine's neighbours only ever lower
 * it); 0 where the CPU lacks the instructions. */
static double peak_rate(int nth, enum peak_kind kind, int reps) {
#ifdef __x86_64__
    int lanes = fma_lanes();
    if (!lanes || (kind == PEAK_DOT && !__builtin_cpu_supports("avx512bf16")) ||
        (kind == PEAK_AMX && !pd__cpu_has_amx()))
        return 0;
    double best = 0;
    /* ~50-100 ms; an AMX iteration is 64 of the cycles 12 FMAs take 6 */
    long iters = kind == PEAK_AMX ? 2000000 : 16000000;
    for (int k = 0; k < reps; k++) {
        pthread_t th[1024];
        struct peak_arg args[1024];
        double t0 = now();
        for (int i = 0; i < nth; i++) {
            args[i] = (struct peak_arg){kind, iters, 0};
            pthread_create(&th[i], NULL, peak_thread, &args[i]);
        }
        for (int i = 0; i < nth; i++)
            pthread_join(th[i], NULL);
        /* 12 chains x lanes x 2 FLOPs (FMA) or x 2 pairs x 2 FLOPs (bf16 dot); 4 tile
         * products of 16x16 sums over 32 values x 2 FLOPs (AMX) */
        double per = kind == PEAK_AMX ? 4.0 * 16 * 16 * 32 * 2
                                      : 12.0 * lanes * 2 * (kind == PEAK_DOT ? 2 : 1);
        double r = (double)nth * (double)iters * per / (now() - t0);
        best = r > best ? r : best;
    }
    return best;
#else
    (void)nth;
    (void)bf16;
    (void)reps;
    return 0;
#endif
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

/* batch sequences with their own pages, each `prompt` tokens in (prefilled) or, when prompt is
 * 0, starting at position `pos` over pages of whatever the pool holds (attention's cost does not
 * depend on the values); each step decodes one token per sequence. */
struct decode_rig {
    int batch, pages, pos;
    int32_t *pt, *cur;
    float *lg;
    struct pd_model_seq *s;
};

static void rig_free(struct decode_rig *r) {
    pd_free(r->pt);
    pd_free(r->cur);
    pd_free(r->lg);
    pd_free(r->s);
}

static int rig_init(struct pd_model *m, struct pd_kv_pool *kv, int batch, int prompt, int pos,
                    int max_steps, struct decode_rig *r) {
    int ps = pd_model_opts_of(m)->page_size;
    *r = (struct decode_rig){.batch = batch,
                             .pages = (prompt + pos + max_steps + ps) / ps + 1,
                             .pos = prompt ? prompt : pos};
    r->pt = pd_calloc((size_t)batch * (size_t)r->pages, sizeof(int32_t));
    r->cur = pd_calloc((size_t)batch, sizeof(int32_t));
    r->lg = pd_calloc((size_t)batch * pd_model_config_of(m)->vocab_size, sizeof(float));
    r->s = pd_calloc((size_t)batch, sizeof(*r->s));
    int32_t toks[64];
    int rc = (!r->pt || !r->cur || !r->lg || !r->s || prompt > 64) ? PD_ENOMEM : PD_OK;
    for (int i = 0; i < prompt && !rc; i++)
        toks[i] = (i * 7919) % 151936;
    for (int b = 0; b < batch && !rc; b++) {
        for (int j = 0; j < r->pages; j++)
            r->pt[b * r->pages + j] = b * r->pages + j;
        struct pd_model_seq p = {.tokens = toks,
                                 .n_new = prompt,
                                 .n_cached = 0,
                                 .pages = r->pt + b * r->pages,
                                 .n_pages = r->pages};
        if (prompt)
            rc = pd_model_extend(m, kv, &p, 1, false, r->lg);
    }
    return rc;
}

static int rig_step(struct decode_rig *r, struct pd_model *m, struct pd_kv_pool *kv, double *secs) {
    for (int b = 0; b < r->batch; b++) {
        r->cur[b] = (r->pos * 31 + b) % 151936;
        r->s[b] = (struct pd_model_seq){.tokens = &r->cur[b],
                                        .n_new = 1,
                                        .n_cached = r->pos,
                                        .pages = r->pt + b * r->pages,
                                        .n_pages = r->pages};
    }
    double t0 = now();
    int rc = pd_model_decode(m, kv, r->s, r->batch, r->lg);
    *secs = now() - t0;
    r->pos++;
    return rc;
}

/* tokens/s of a batch, median of `steps` steps */
static int decode_rate(struct pd_model *m, struct pd_kv_pool *kv, int batch, int steps,
                       double *tok_s) {
    struct decode_rig r;
    double t[64];
    int rc = rig_init(m, kv, batch, 32, 0, steps, &r);
    for (int i = 0; i < steps && !rc; i++)
        rc = rig_step(&r, m, kv, &t[i]);
    if (!rc)
        *tok_s = batch / median(t, steps);
    rig_free(&r);
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
        struct pd_model_seq s = {
            .tokens = toks, .n_new = len, .n_cached = 0, .pages = pt, .n_pages = pages};
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

/* The bound's read runs on a pool of its own beside the backend's: each pool's workers spin a
 * little after a task before they sleep (backend_cpu_pool.c), so between phases both are given
 * time to sleep, lest one phase's threads share the cores with the other pool's spinning. */
static void settle(void) {
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
}

/* Decode at batch 1 against the read bound, in rounds: a read, an untimed decode step (the
 * read has just flushed the caches of everything but the weights), a timed one, a read and a
 * memcpy pass. A round's bound is its fastest pass, so a moment when the machine's memory rate
 * rose during the step is not counted against the step. */
static int decode_vs_bound(struct pd_model *m, struct pd_kv_pool *kv, int nth, enum pd_dtype dt,
                           double *b1_tok_s) {
    enum { ROUNDS = 15 };
    const struct pd_model_config *c = pd_model_config_of(m);
    bool tiled = pd__cpu_tiles_weights();
    size_t bytes = step_bytes(c, dt, tiled);
    char *raw = pd_malloc(bytes + 64);
    struct pd__cpu_pool *pool = NULL;
    struct decode_rig r = {0};
    int rc = raw ? pd__cpu_pool_new(nth, &pool) : PD_ENOMEM;
    if (!rc)
        rc = rig_init(m, kv, 1, 32, 0, 2 * ROUNDS, &r);
    char *buf = raw ? (char *)(((uintptr_t)raw + 63) & ~(uintptr_t)63) : NULL;
    for (size_t i = 0; !rc && i < bytes; i += 4096) /* written: no page is the zero page */
        buf[i] = (char)i;
    double td[ROUNDS], tv[ROUNDS], tm[ROUNDS], ratio[ROUNDS], warm;
    int above = 0;
    for (int i = 0; i < ROUNDS && !rc; i++) {
        settle();
        double before = step_read_pass(pool, c, buf, dt, tiled);
        settle();
        if ((rc = rig_step(&r, m, kv, &warm)) || (rc = rig_step(&r, m, kv, &td[i])))
            break;
        settle();
        double after = step_read_pass(pool, c, buf, dt, tiled);
        settle();
        tv[i] = before < after ? before : after;
        tm[i] = memcpy_pass(buf, bytes, nth);
        ratio[i] = (tv[i] < tm[i] ? tv[i] : tm[i]) / td[i];
        above += ratio[i] > 1.0;
    }
    if (!rc) {
        double v = median(tv, ROUNDS), mc = median(tm, ROUNDS), d = median(td, ROUNDS);
        double best = v < mc ? v : mc, q = median(ratio, ROUNDS);
        printf("limit: reading a step's %.1f MB of %s weights with %d threads: %.2f GB/s as the "
               "GEMV streams them (its layout, split and loads), %.2f GB/s by memcpy; bound at "
               "batch 1 = the faster, %.2f tok/s (medians of %d rounds alternating with decode "
               "steps)\n",
               bytes / 1e6, tiled ? "tiled" : "row-major", nth, bytes / v / 1e9, bytes / mc / 1e9,
               1.0 / best, ROUNDS);
        *b1_tok_s = 1.0 / d;
        /* a step is a read plus arithmetic: above 100% is the machine's noise, not speed */
        printf(
            "decode batch  1: %7.2f tok/s = %.0f%% of the bound (median of the rounds' ratios%s; "
            "target >= 85%%)\n",
            *b1_tok_s, 100.0 * (q < 1.0 ? q : 1.0), q > 1.0 ? ", at the bound" : "");
        if (above)
            printf("  the step matched or beat its round's fastest read in %d of %d rounds: it "
                   "reads at the memory's rate\n",
                   above, ROUNDS);
    }
    rig_free(&r);
    if (pool)
        pd__cpu_pool_free(pool);
    pd_free(raw);
    return rc;
}

/* A decode step at context 4,096 against one at context 33, alternating: the difference is what
 * attention over the longer context (its KV reads above all) adds. */
static int attention_share(struct pd_model *m, struct pd_kv_pool *kv) {
    enum { ROUNDS = 7, CTX = 4096 };
    struct decode_rig lo, hi;
    double tl[ROUNDS], th[ROUNDS];
    int rc = rig_init(m, kv, 1, 32, 0, ROUNDS, &lo);
    if (!rc)
        rc = rig_init(m, kv, 1, 0, CTX - 1 - ROUNDS, ROUNDS, &hi);
    for (int i = 0; i < ROUNDS && !rc; i++) {
        if (!(rc = rig_step(&lo, m, kv, &tl[i])))
            rc = rig_step(&hi, m, kv, &th[i]);
    }
    if (!rc) {
        double a = median(tl, ROUNDS), b = median(th, ROUNDS);
        printf("decode step at context %d: %.2f ms, at context 33: %.2f ms: attention over the "
               "longer context is %.0f%% of the step\n",
               CTX, b * 1e3, a * 1e3, 100.0 * (b - a) / b);
    }
    rig_free(&lo);
    rig_free(&hi);
    return rc;
}

static const char usage[] =
    "Usage: pdserve-bench-cpu-forward [THREADS [bf16|f32 [KV_DTYPE]]]\n"
    "Speed of the cpu backend's forward pass on a qwen2.5-0.5b-shaped model with random weights\n"
    "made in memory, each figure next to a limit measured in the same run (docs/benchmarks.md).\n"
    "  THREADS   the backend's threads (0 = one per core) [default: 0]\n"
    "  bf16|f32  the weights' dtype [default: bf16]\n"
    "  KV_DTYPE  the KV pool's, as --kv-cache-dtype spells it: auto, bf16, fp16, fp32,\n"
    "            fp8_e4m3, fp8_e5m2 [default: auto = float32 on cpu]\n"
    "PDSERVE_CPU_ISA=avx512|avx2|generic runs the fallback kernels.\n";

/* "n% of the <what> peak", or that the CPU has no such instruction to measure it with. */
static void print_share(double flops, double peak, const char *what) {
    if (peak > 0)
        printf("%.0f%% of the %s peak", 100.0 * flops / peak, what);
    else
        printf("%s peak not measured (no such instructions here)", what);
}

int main(int argc, char **argv) {
    if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        fputs(usage, stdout);
        return 0;
    }
    char *end = NULL;
    long tl = argc > 1 ? strtol(argv[1], &end, 10) : 0;
    if (argc > 4 || (argc > 1 && (end == argv[1] || *end || tl < 0 || tl > 1024)) ||
        (argc > 2 && strcmp(argv[2], "f32") != 0 && strcmp(argv[2], "bf16") != 0)) {
        fprintf(stderr,
                "pdserve-bench-cpu-forward: bad arguments (THREADS is 0..1024, the "
                "dtype bf16 or f32)\n%s",
                usage);
        return 2;
    }
    int threads = (int)tl;
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
        .max_tokens = 2048, .max_reqs = 32, .page_size = 16, .context_length = 4096};
    int rc;
    if ((rc = pd_backend_new(&bo, &be)) || (rc = build_ckpt(&cfg, dt, &ck)))
        goto out;
    double load0 = now();
    if ((rc = pd_model_new(be, &cfg, find, &ck, &mo, &m)))
        goto out;
    double load = now() - load0;
    struct pd_kv_pool_opts ko = pd_model_kv_opts(m, kvt);
    ko.n_pages = 4096 / 16 + 8; /* one sequence at context 4,096; 32 short ones */
    if ((rc = pd_kv_pool_init(&kv, be, &ko)))
        goto out;
    int nth = 0;
    sscanf(pd_backend_name(be), "cpu (%d", &nth);
    int64_t params = 0, emb = (int64_t)cfg.vocab_size * cfg.hidden_size;
    for (int i = 0; i < ck.n; i++)
        params += (int64_t)(ck.t[i].nbytes / pd_dtype_size(ck.t[i].dtype));
    printf("model: qwen2.5-0.5b shape, %s weights, %.1fM params (%.1fM non-embedding), %s KV, "
           "%s; made from memory in %.2f s (%s)\n",
           pd_dtype_name(dt), params / 1e6, (params - emb) / 1e6, pd_dtype_kv_name(kvt),
           pd_backend_name(be), load,
           pd__cpu_tiles_weights() ? "weights tiled" : "weights aliased");

    double d[3];
    if ((rc = decode_vs_bound(m, &kv, nth, dt, &d[0])))
        goto out;
    static const int batches[3] = {1, 8, 32};
    for (int i = 1; i < 3; i++) {
        if ((rc = decode_rate(m, &kv, batches[i], 9, &d[i])))
            goto out;
        printf("decode batch %2d: %7.2f tok/s (%.2fx batch 1)\n", batches[i], d[i], d[i] / d[0]);
    }
    printf("decode batch 8 / batch 1: %.2fx (target >= 5x)\n", d[1] / d[0]);
    if ((rc = attention_share(m, &kv)))
        goto out;

    /* the peaks are taken before and after the prefills, the higher of each counting */
    double fma = peak_rate(nth, PEAK_FMA, 5), dot = peak_rate(nth, PEAK_DOT, 5),
           amx = peak_rate(nth, PEAK_AMX, 5), pf[2];
    static const int lens[2] = {512, 2048};
    for (int i = 0; i < 2; i++)
        if ((rc = prefill_rate(m, &kv, lens[i], i ? 3 : 5, &pf[i])))
            goto out;
    double fma2 = peak_rate(nth, PEAK_FMA, 5), dot2 = peak_rate(nth, PEAK_DOT, 5),
           amx2 = peak_rate(nth, PEAK_AMX, 5);
    fma = fma2 > fma ? fma2 : fma;
    dot = dot2 > dot ? dot2 : dot;
    amx = amx2 > amx ? amx2 : amx;
    double gemm = gemm_rate(nth, 512, 4864, 896, 7);
    printf("limit: f32 FMA %.1f GFLOP/s (%d lanes), bf16 dot %.1f GFLOP/s, AMX bf16 %.1f GFLOP/s "
           "(a third: %.1f) (%d threads, registers only, best of 10), OpenBLAS f32 GEMM %.1f "
           "GFLOP/s (512x4864x896)\n",
           fma / 1e9, fma_lanes(), dot / 1e9, amx / 1e9, amx / 3e9, nth, gemm / 1e9);
    for (int i = 0; i < 2; i++) {
        double flops = 2.0 * (double)(params - emb) * pf[i];
        printf("prefill %4d tokens: %.1f tok/s = %.1f GFLOP/s model FLOPs (2 x non-embedding "
               "params): ",
               lens[i], pf[i], flops / 1e9);
        print_share(flops, fma, "f32 FMA");
        printf(", ");
        print_share(flops, dot, "bf16 dot");
        printf(", ");
        print_share(flops, amx / 3, "AMX bf16 / 3");
        printf("\n");
    }
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
