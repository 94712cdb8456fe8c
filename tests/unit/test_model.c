/*
 * test_model.c — properties of the forward pass that need no reference implementation:
 * chunking does not change results (one extend vs chunks of 1, 7, 16, 64 tokens over scattered
 * pages, partial pages included), a batch of mixed lengths equals each request alone, decode
 * equals extend of one token, and bad requests are refused before anything is written
 * (too long for the context, page list too short, page outside the pool, token outside the
 * vocabulary). Models are small random ones built in memory, one per family feature: plain
 * Llama with GQA, Qwen2 (q/k/v bias, tied embeddings), Qwen3 (q/k norm) with bf16 weights.
 * Agreement with transformers itself is test_golden's job.
 */
#include "pd_compare.h"
#include "pd_model_fixture.h"
#include "pd_test.h"

#include "common/base/alloc.h"
#include "model/model.h"

#include <math.h>

#define MAX_T 64

static uint64_t rng = 7;
static float frand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

static struct pd_model_config tiny_config(enum pd_arch arch) {
    struct pd_model_config c = {0};
    c.vocab_size = 97;
    c.hidden_size = 48;
    c.intermediate_size = 80;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 12;
    c.max_position_embeddings = 160;
    fixture_family_traits(&c, arch);
    return c;
}

struct rig {
    struct pd_backend *be;
    struct pd_model *m;
    struct pd_kv_pool kv;
    struct fake_ckpt ck;
    int vocab;
};

/* window / max_window_layers: the config's sliding window (0: none). */
static int rig_init_window(struct rig *r, enum pd_arch arch, enum pd_dtype dt, int max_tokens,
                           int window, int max_window_layers) {
    memset(r, 0, sizeof(*r));
    struct pd_backend_opts bo = {.kind = PD_BACKEND_CPU, .threads = 2};
    struct pd_model_config c = tiny_config(arch);
    c.sliding_window = window;
    c.max_window_layers = max_window_layers;
    fake_ckpt_weights(&c, dt, 0.3f, frand, &r->ck);
    r->vocab = c.vocab_size;
    struct pd_model_opts mo = {.max_tokens = max_tokens, .max_reqs = 4, .page_size = 16};
    int rc = pd_backend_new(&bo, &r->be);
    if (!rc)
        rc = pd_model_new(r->be, &c, fake_ckpt_find, &r->ck, &mo, &r->m);
    if (!rc) {
        struct pd_kv_pool_opts ko = pd_model_kv_opts(r->m, PD_DTYPE_F32);
        ko.n_pages = 40;
        rc = pd_kv_pool_init(&r->kv, r->be, &ko);
    }
    return rc;
}

static int rig_init(struct rig *r, enum pd_arch arch, enum pd_dtype dt, int max_tokens) {
    return rig_init_window(r, arch, dt, max_tokens, 0, 0);
}

static void rig_free(struct rig *r) {
    pd_kv_pool_free(&r->kv);
    pd_model_free(r->m);
    pd_backend_free(r->be);
    fake_ckpt_free(&r->ck);
}

#define PROMPT 100
#define GEN 6

/* Runs the prompt in chunks of `chunk` (all logits), then GEN greedy decode steps. */
static void run_chunked(struct rig *r, const int32_t *prompt, const int32_t *pages, int chunk,
                        float *all_logits /* [PROMPT][vocab] */, int32_t *gen /* [GEN] */) {
    for (int done = 0; done < PROMPT; done += chunk) {
        int n = PROMPT - done < chunk ? PROMPT - done : chunk;
        struct pd_model_seq s = {
            .tokens = prompt + done, .n_new = n, .n_cached = done, .pages = pages, .n_pages = 8};
        CHECK_OK(pd_model_extend(r->m, &r->kv, &s, 1, true, all_logits + (size_t)done * r->vocab));
    }
    int32_t tok = pd_argmax(all_logits + (size_t)(PROMPT - 1) * r->vocab, r->vocab);
    float *lg = pd_malloc(sizeof(float) * r->vocab);
    for (int i = 0; i < GEN; i++) {
        gen[i] = tok;
        struct pd_model_seq s = {
            .tokens = &tok, .n_new = 1, .n_cached = PROMPT + i, .pages = pages, .n_pages = 8};
        CHECK_OK(pd_model_decode(r->m, &r->kv, &s, 1, lg));
        tok = pd_argmax(lg, r->vocab);
    }
    pd_free(lg);
}

static void check_chunking(enum pd_arch arch, enum pd_dtype dt) {
    struct rig r;
    CHECK_OK(rig_init(&r, arch, dt, 2 * MAX_T));
    if (!r.m) {
        rig_free(&r);
        return;
    }
    int32_t prompt[PROMPT], pages[8] = {31, 4, 17, 0, 22, 9, 38, 12}; /* scattered on purpose */
    for (int i = 0; i < PROMPT; i++)
        prompt[i] = (int32_t)((i * 37 + 11) % r.vocab);
    size_t nl = (size_t)PROMPT * r.vocab;
    float *ref = pd_malloc(sizeof(float) * nl), *got = pd_malloc(sizeof(float) * nl);
    int32_t gref[GEN], ggot[GEN];
    run_chunked(&r, prompt, pages, PROMPT, ref, gref); /* the whole prompt in one extend */
    static const int chunks[] = {1, 7, 16, 64};
    for (size_t c = 0; c < PD_ARRAY_LEN(chunks); c++) {
        memset(got, 0, sizeof(float) * nl);
        run_chunked(&r, prompt, pages, chunks[c], got, ggot);
        double e = pd_rel_err(got, ref, nl);
        CHECK(e < 1e-5);
        if (e >= 1e-5)
            fprintf(stderr, "  arch %d chunk %d: rel err %g\n", (int)arch, chunks[c], e);
        CHECK(memcmp(ggot, gref, sizeof(gref)) == 0);
    }
    /* the logits are not degenerate: greedy tokens vary with the prompt */
    CHECK(pd_rel_err(ref, ref + r.vocab, r.vocab) > 1e-3);
    pd_free(ref);
    pd_free(got);
    rig_free(&r);
}

static void test_chunking_llama(void) {
    check_chunking(PD_ARCH_LLAMA, PD_DTYPE_F32);
}
static void test_chunking_qwen2(void) {
    check_chunking(PD_ARCH_QWEN2, PD_DTYPE_F32);
}
static void test_chunking_qwen3_bf16(void) {
    check_chunking(PD_ARCH_QWEN3, PD_DTYPE_BF16);
}

/* A sliding window of W = 20 tokens (Mistral's, Qwen's with use_sliding_window): the same
 * weights with and without it give the same logits at positions < W (nothing is masked yet) and
 * different ones after; chunked prefill and decode steps agree with one whole extend under the
 * window; with max_window_layers 1 only the second layer slides (a third, distinct result). */
static void test_sliding_window(void) {
    enum { W = 20 };
    struct rig full, win, last;
    rng = 7;
    CHECK_OK(rig_init_window(&full, PD_ARCH_QWEN2, PD_DTYPE_F32, 2 * MAX_T, 0, 0));
    rng = 7; /* the same weights */
    CHECK_OK(rig_init_window(&win, PD_ARCH_QWEN2, PD_DTYPE_F32, 2 * MAX_T, W, 0));
    rng = 7;
    CHECK_OK(rig_init_window(&last, PD_ARCH_QWEN2, PD_DTYPE_F32, 2 * MAX_T, W, 1));
    if (full.m && win.m && last.m) {
        int32_t prompt[PROMPT], pages[8] = {31, 4, 17, 0, 22, 9, 38, 12};
        for (int i = 0; i < PROMPT; i++)
            prompt[i] = (int32_t)((i * 37 + 11) % full.vocab);
        size_t nl = (size_t)PROMPT * full.vocab, nw = (size_t)W * full.vocab;
        float *a = pd_malloc(sizeof(float) * nl), *b = pd_malloc(sizeof(float) * nl);
        float *c = pd_malloc(sizeof(float) * nl), *d = pd_malloc(sizeof(float) * nl);
        int32_t ga[GEN], gb[GEN], gc[GEN], gd[GEN];
        run_chunked(&full, prompt, pages, PROMPT, a, ga);
        run_chunked(&win, prompt, pages, PROMPT, b, gb);
        run_chunked(&last, prompt, pages, PROMPT, c, gc);
        CHECK(pd_rel_err(b, a, nw) < 1e-6); /* inside the window: unchanged */
        CHECK(pd_rel_err(c, a, nw) < 1e-6);
        const float *la = a + nl - full.vocab, *lb = b + nl - full.vocab, *lc = c + nl - full.vocab;
        CHECK(pd_rel_err(lb, la, full.vocab) > 1e-3); /* beyond it: the window masks */
        CHECK(pd_rel_err(lc, la, full.vocab) > 1e-3);
        CHECK(pd_rel_err(lc, lb, full.vocab) > 1e-3);
        static const int chunks[] = {1, 7, 16};
        for (size_t k = 0; k < PD_ARRAY_LEN(chunks); k++) {
            run_chunked(&win, prompt, pages, chunks[k], d, gd);
            double e = pd_rel_err(d, b, nl);
            CHECK(e < 1e-5);
            if (e >= 1e-5)
                fprintf(stderr, "  window %d chunk %d: rel err %g\n", W, chunks[k], e);
            CHECK(memcmp(gd, gb, sizeof(gb)) == 0);
        }
        pd_free(a);
        pd_free(b);
        pd_free(c);
        pd_free(d);
    }
    rig_free(&full);
    rig_free(&win);
    rig_free(&last);
}

/* Three requests of lengths 5, 23 and 40 (one with a cached prefix) in one step give the same
 * last-position logits as each run alone; so does a mixed decode step. */
static void test_batch_equals_alone(void) {
    struct rig r;
    CHECK_OK(rig_init(&r, PD_ARCH_QWEN2, PD_DTYPE_F32, MAX_T * 2));
    if (!r.m) {
        rig_free(&r);
        return;
    }
    int lens[3] = {5, 23, 40}, cached[3] = {0, 0, 17};
    int32_t toks[3][48], pages[3][4] = {{1, 2, 3, 4}, {10, 5, 6, 7}, {20, 30, 25, 8}};
    for (int q = 0; q < 3; q++)
        for (int i = 0; i < 48; i++)
            toks[q][i] = (int32_t)((i * (q + 3) + 5 * q) % r.vocab);
    float alone[3][97], batch[3][97];
    struct pd_model_seq s[3];
    for (int q = 0; q < 3; q++) {
        if (cached[q]) { /* put the prefix into the pages first */
            struct pd_model_seq p = {.tokens = toks[q],
                                     .n_new = cached[q],
                                     .n_cached = 0,
                                     .pages = pages[q],
                                     .n_pages = 4};
            CHECK_OK(pd_model_extend(r.m, &r.kv, &p, 1, false, alone[q]));
        }
        s[q] = (struct pd_model_seq){.tokens = toks[q] + cached[q],
                                     .n_new = lens[q] - cached[q],
                                     .n_cached = cached[q],
                                     .pages = pages[q],
                                     .n_pages = 4};
        CHECK_OK(pd_model_extend(r.m, &r.kv, &s[q], 1, false, alone[q]));
    }
    CHECK_OK(pd_model_extend(r.m, &r.kv, s, 3, false, &batch[0][0]));
    for (int q = 0; q < 3; q++)
        CHECK(pd_rel_err(batch[q], alone[q], 97) < 1e-5);

    int32_t next[3] = {1, 2, 3};
    float dal[3][97], dba[3][97];
    for (int q = 0; q < 3; q++) {
        s[q] = (struct pd_model_seq){
            .tokens = &next[q], .n_new = 1, .n_cached = lens[q], .pages = pages[q], .n_pages = 4};
        CHECK_OK(pd_model_decode(r.m, &r.kv, &s[q], 1, dal[q]));
    }
    CHECK_OK(pd_model_decode(r.m, &r.kv, s, 3, &dba[0][0]));
    for (int q = 0; q < 3; q++)
        CHECK(pd_rel_err(dba[q], dal[q], 97) < 1e-5);
    rig_free(&r);
}

static void test_bad_input(void) {
    struct rig r;
    CHECK_OK(rig_init(&r, PD_ARCH_LLAMA, PD_DTYPE_F32, MAX_T));
    if (!r.m) {
        rig_free(&r);
        return;
    }
    float lg[4 * 97];
    int32_t toks[64] = {0}, pages[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    /* context is 160: 150 cached + 20 new is too long */
    struct pd_model_seq s = {
        .tokens = toks, .n_new = 20, .n_cached = 150, .pages = pages, .n_pages = 12};
    CHECK_ERR(pd_model_extend(r.m, &r.kv, &s, 1, false, lg), PD_ERANGE, "context length 160");
    /* 40 tokens need 3 pages of 16 */
    s = (struct pd_model_seq){
        .tokens = toks, .n_new = 40, .n_cached = 0, .pages = pages, .n_pages = 2};
    CHECK_ERR(pd_model_extend(r.m, &r.kv, &s, 1, false, lg), PD_ERANGE, "need 3 pages");
    /* the pool has 40 pages */
    int32_t bad[3] = {0, 40, 1};
    s = (struct pd_model_seq){
        .tokens = toks, .n_new = 40, .n_cached = 0, .pages = bad, .n_pages = 3};
    CHECK_ERR(pd_model_extend(r.m, &r.kv, &s, 1, false, lg), PD_ERANGE, "page index 40");
    bad[1] = -3;
    CHECK_ERR(pd_model_extend(r.m, &r.kv, &s, 1, false, lg), PD_ERANGE, "page index -3");
    toks[5] = 97;
    s = (struct pd_model_seq){
        .tokens = toks, .n_new = 10, .n_cached = 0, .pages = pages, .n_pages = 1};
    CHECK_ERR(pd_model_extend(r.m, &r.kv, &s, 1, false, lg), PD_ERANGE, "vocabulary");
    toks[5] = 0;
    s = (struct pd_model_seq){.tokens = toks,
                              .n_new = 65,
                              .n_cached = 0,
                              .pages = pages,
                              .n_pages = 12}; /* step limit 64 */
    CHECK_ERR(pd_model_extend(r.m, &r.kv, &s, 1, false, lg), PD_ERANGE, "step limit");
    s = (struct pd_model_seq){
        .tokens = toks, .n_new = 2, .n_cached = 0, .pages = pages, .n_pages = 1};
    CHECK_ERR(pd_model_decode(r.m, &r.kv, &s, 1, lg), PD_EINVAL, "must have 1");
    /* a pool of another geometry is refused */
    struct pd_kv_pool other;
    struct pd_kv_pool_opts ko = pd_model_kv_opts(r.m, PD_DTYPE_F32);
    ko.n_pages = 2;
    ko.page_size = 8;
    CHECK_OK(pd_kv_pool_init(&other, r.be, &ko));
    s = (struct pd_model_seq){
        .tokens = toks, .n_new = 2, .n_cached = 0, .pages = pages, .n_pages = 1};
    CHECK_ERR(pd_model_extend(r.m, &other, &s, 1, false, lg), PD_EMISMATCH, "does not fit");
    pd_kv_pool_free(&other);
    /* after all that, a good request still works */
    CHECK_OK(pd_model_extend(r.m, &r.kv, &s, 1, false, lg));
    rig_free(&r);
}

static void test_missing_tensor(void) {
    struct pd_backend *be;
    struct pd_backend_opts bo = {.kind = PD_BACKEND_CPU, .threads = 1};
    CHECK_OK(pd_backend_new(&bo, &be));
    struct pd_model_config c = tiny_config(PD_ARCH_QWEN3);
    struct fake_ckpt ck;
    fake_ckpt_weights(&c, PD_DTYPE_F32, 0.3f, frand, &ck);
    for (int i = 0; i < ck.n; i++)
        if (strcmp(ck.t[i].name, "model.layers.1.self_attn.k_norm.weight") == 0)
            ck.names[i][0] = 'X';
    struct pd_model *m = NULL;
    CHECK_ERR(pd_model_new(be, &c, fake_ckpt_find, &ck, NULL, &m), PD_ENOENT,
              "'model.layers.1.self_attn.k_norm.weight' missing");
    CHECK(m == NULL);
    /* allocation failures anywhere during creation are reported, never leaked */
    for (long k = 0; k < 40; k += 3) {
        fake_ckpt_free(&ck);
        fake_ckpt_weights(&c, PD_DTYPE_F32, 0.3f, frand, &ck);
        pd_alloc_fail_after(k);
        int rc = pd_model_new(be, &c, fake_ckpt_find, &ck, NULL, &m);
        pd_alloc_fail_after(-1);
        CHECK(rc == PD_OK || rc == PD_ENOMEM);
        pd_model_free(m);
        m = NULL;
    }
    fake_ckpt_free(&ck);
    pd_backend_free(be);
}

/* One extend of PROMPT tokens (all positions' logits) with the KV pool in each --kv-cache-dtype
 * against the f32 pool on the same model. The step stores K/V into the pool and attention reads
 * them back, so every layer sees K and V rounded to the pool's type: each element off by at most
 * u relative (u = 2^-(mantissa bits + 1): bf16 2^-8, f16 2^-11, e4m3 2^-4, e5m2 2^-3; the
 * model's K/V are O(1), far above the formats' subnormal ranges). An attention output is a
 * convex combination of V rows, so V's rounding moves it by at most u of its scale; K's moves
 * each score by at most u x |q||k| / sqrt(d), which changes the softmax weights by a factor
 * within e^(±2u |s|max), again O(u) relative for these O(1) scores. Each of the L layers adds
 * such an error to the residual stream and later layers carry it on, so the logits move by
 * about 2 L u of their scale; the bound asserted is twice that, 4 L u (L = 2 here). The error
 * must also be nonzero (the pool really holds the narrower type) and grow as the format
 * narrows: f16 < bf16 < e4m3 <= e5m2. */
static void test_kv_dtype_logits(void) {
    static const struct {
        enum pd_dtype t;
        int mbits;
    } kinds[] = {
        {PD_DTYPE_F16, 10}, {PD_DTYPE_BF16, 7}, {PD_DTYPE_F8E4M3, 3}, {PD_DTYPE_F8E5M2, 2}};
    struct rig r;
    CHECK_OK(rig_init(&r, PD_ARCH_LLAMA, PD_DTYPE_F32, MAX_T * 2));
    int32_t prompt[PROMPT], pages[8];
    for (int i = 0; i < PROMPT; i++)
        prompt[i] = (int32_t)((i * 31 + 5) % r.vocab);
    for (int i = 0; i < 8; i++)
        pages[i] = (int32_t)(5 * i + 2); /* scattered, inside the 40 pages */
    size_t n = (size_t)PROMPT * (size_t)r.vocab;
    float *ref = pd_calloc(n, sizeof(float)), *got = pd_calloc(n, sizeof(float));
    struct pd_model_seq s = {
        .tokens = prompt, .n_new = PROMPT, .n_cached = 0, .pages = pages, .n_pages = 8};
    CHECK_OK(pd_model_extend(r.m, &r.kv, &s, 1, true, ref));
    double prev = 0;
    int layers = 2;
    for (size_t k = 0; k < PD_ARRAY_LEN(kinds); k++) {
        struct pd_kv_pool kv;
        struct pd_kv_pool_opts ko = pd_model_kv_opts(r.m, kinds[k].t);
        ko.n_pages = 40;
        CHECK_OK(pd_kv_pool_init(&kv, r.be, &ko));
        /* a page is the f32 one scaled by the element size */
        CHECK_INT(kv.layout.page_bytes * 4, r.kv.layout.page_bytes * pd_dtype_size(kinds[k].t));
        CHECK_OK(pd_model_extend(r.m, &kv, &s, 1, true, got));
        double u = ldexp(1.0, -(kinds[k].mbits + 1)), bound = 4.0 * layers * u;
        double e = pd_rel_err(got, ref, n);
        int same = 0;
        for (int i = 0; i < PROMPT; i++)
            same += pd_argmax(got + (size_t)i * r.vocab, r.vocab) ==
                    pd_argmax(ref + (size_t)i * r.vocab, r.vocab);
        printf("kv %s: logits off by %.3g of their scale (bound %.3g), argmax equal at %d of %d "
               "positions\n",
               pd_dtype_kv_name(kinds[k].t), e, bound, same, PROMPT);
        CHECK(e > 0 && e <= bound);
        CHECK(e >= prev);
        prev = e;
        pd_kv_pool_free(&kv);
    }
    pd_free(ref);
    pd_free(got);
    rig_free(&r);
}

/* M-RoPE (qwen2_vl): a text-only prompt runs exactly as plain RoPE (all three positions equal,
 * whether given or not); embedding rows handed over a span of placeholder tokens act as those
 * tokens' embeddings; decode's pos_delta equals an extend at the shifted position; and 3-D
 * positions that differ between axes do change the result. Bit-equal where the arithmetic is. */
static void test_mrope(void) {
    enum { N = 40, V = 97 };
    struct pd_backend *be = NULL;
    struct pd_backend_opts bo = {.kind = PD_BACKEND_CPU, .threads = 2};
    CHECK_OK(pd_backend_new(&bo, &be));
    struct pd_model_config c = tiny_config(PD_ARCH_QWEN2), cv = c;
    cv.vl = PD_VL_QWEN2;
    cv.mrope_section[0] = cv.mrope_section[1] = cv.mrope_section[2] = 2; /* head_dim 12 */
    struct fake_ckpt ck;
    fake_ckpt_weights(&c, PD_DTYPE_F32, 0.3f, frand, &ck);
    struct pd_model_opts mo = {.max_tokens = 64, .max_reqs = 2, .page_size = 16};
    struct pd_model *plain = NULL, *vl = NULL;
    struct pd_kv_pool kp = {0}, kv = {0};
    CHECK_OK(pd_model_new(be, &c, fake_ckpt_find, &ck, &mo, &plain));
    CHECK_OK(pd_model_new(be, &cv, fake_ckpt_find, &ck, &mo, &vl));
    if (!plain || !vl)
        goto out;
    struct pd_kv_pool_opts ko = pd_model_kv_opts(plain, PD_DTYPE_F32);
    ko.n_pages = 8;
    CHECK_OK(pd_kv_pool_init(&kp, be, &ko));
    CHECK_OK(pd_kv_pool_init(&kv, be, &ko));
    int32_t prompt[N], pages[4] = {5, 1, 7, 2}, mpos[N * 3], one;
    for (int i = 0; i < N; i++) {
        prompt[i] = (int32_t)((i * 29 + 3) % V);
        mpos[i * 3] = mpos[i * 3 + 1] = mpos[i * 3 + 2] = i;
    }
    static float ref[N * V], got[N * V], lg_a[V], lg_b[V];
    struct pd_model_seq s = {
        .tokens = prompt, .n_new = N, .n_cached = 0, .pages = pages, .n_pages = 4};
    CHECK_OK(pd_model_extend(plain, &kp, &s, 1, true, ref));
    CHECK_OK(pd_model_extend(vl, &kv, &s, 1, true, got));
    CHECK(memcmp(ref, got, sizeof(ref)) == 0);
    s.mpos = mpos;
    CHECK_OK(pd_model_extend(vl, &kv, &s, 1, true, got));
    CHECK(memcmp(ref, got, sizeof(ref)) == 0);
    /* tokens 10..19 as placeholders (id 0), their embeddings handed over as rows */
    int32_t holes[N];
    memcpy(holes, prompt, sizeof(holes));
    for (int i = 10; i < 20; i++)
        holes[i] = 0;
    const float *table = fake_ckpt_find(&ck, "model.embed_tokens.weight")->data;
    float rows[10 * 48];
    for (int i = 0; i < 10; i++)
        memcpy(rows + i * 48, table + (size_t)prompt[10 + i] * 48, sizeof(float) * 48);
    struct pd_model_embeds em = {.start = 10, .n = 10, .rows = rows};
    s.tokens = holes;
    s.embeds = &em;
    s.n_embeds = 1;
    CHECK_OK(pd_model_extend(vl, &kv, &s, 1, true, got));
    CHECK(memcmp(ref, got, sizeof(ref)) == 0);
    s.tokens = prompt;
    s.embeds = NULL;
    s.n_embeds = 0;
    /* decode at index N with pos_delta -5 = an extend of the same token at position N - 5 */
    one = prompt[3];
    int32_t at[3] = {N - 5, N - 5, N - 5};
    struct pd_model_seq d = {
        .tokens = &one, .n_new = 1, .n_cached = N, .pages = pages, .n_pages = 4, .pos_delta = -5};
    CHECK_OK(pd_model_decode(vl, &kv, &d, 1, lg_a));
    d.pos_delta = 0;
    d.mpos = at;
    CHECK_OK(pd_model_extend(vl, &kv, &d, 1, false, lg_b));
    CHECK(memcmp(lg_a, lg_b, sizeof(lg_a)) == 0);
    /* an image-like grid: height and width positions apart from the temporal one */
    for (int i = 10; i < 20; i++)
        mpos[i * 3 + 1] = 10 + (i - 10) / 5, mpos[i * 3 + 2] = 10 + (i - 10) % 5;
    s.mpos = mpos;
    CHECK_OK(pd_model_extend(vl, &kv, &s, 1, true, got));
    CHECK(pd_rel_err(got + 25 * V, ref + 25 * V, V) > 1e-4);
    /* a span outside the new tokens is refused */
    em.start = 35;
    s.embeds = &em;
    s.n_embeds = 1;
    CHECK_ERR(pd_model_extend(vl, &kv, &s, 1, true, got), PD_EINVAL,
              "embedding rows 35 .. 44 outside its 40 new tokens");
out:
    pd_kv_pool_free(&kp);
    pd_kv_pool_free(&kv);
    pd_model_free(plain);
    pd_model_free(vl);
    pd_backend_free(be);
    fake_ckpt_free(&ck);
}

PD_TEST_MAIN(PD_TEST(test_chunking_llama), PD_TEST(test_chunking_qwen2),
             PD_TEST(test_chunking_qwen3_bf16), PD_TEST(test_batch_equals_alone),
             PD_TEST(test_bad_input), PD_TEST(test_missing_tensor), PD_TEST(test_sliding_window),
             PD_TEST(test_kv_dtype_logits), PD_TEST(test_mrope))
