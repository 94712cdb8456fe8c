/*
 * test_tp.c — tensor parallelism on the cpu backend: a model split over 2 and 4 ranks (threads of
 * this process, summing through the in-process group of model/tp.h) computes what the whole
 * model computes. Each family feature is covered (Llama with an o_proj bias, which only rank 0
 * may add; Qwen2's q/k/v bias, sliced with its rows; Qwen3's per-head q/k norm), f32 and bf16
 * weights, a batch of requests with prefixes, chunks and decode steps. All ranks must end with
 * the same logits bit for bit (the all-reduce sums in rank order); against tp 1 they may differ
 * by float reassociation of the split sums only.
 */
#include "pd_compare.h"
#include "pd_model_fixture.h"
#include "pd_test.h"
#include "pd_tp_fixture.h"

#include "common/base/alloc.h"
#include "model/model.h"
#include "model/tp.h"

#include <math.h>
#include <pthread.h>

#define VOCAB 101
#define NREQ 3
#define STEPS 5 /* extend of the prompts, then decode steps */
#define NPAGES 24

static uint64_t rng_state;
static float frand(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

static struct pd_model_config config(enum pd_arch arch) {
    struct pd_model_config c = {0};
    c.vocab_size = VOCAB;
    c.hidden_size = 48;
    c.intermediate_size = 88;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 4;
    c.head_dim = 12;
    c.max_position_embeddings = 128;
    fixture_family_traits(&c, arch);
    return c;
}

/* One rank's run: its own backend, model and pool, the same steps as every other rank. */
struct rank_run {
    const struct pd_model_config *cfg;
    struct fake_ckpt *ck;
    const struct pd_tp_comm *tp; /* NULL: tp 1 */
    float logits[STEPS][NREQ][VOCAB];
    int rc;
};

static const int prompt_len[NREQ] = {37, 16, 5};
static const int32_t pages[NREQ][4] = {{3, 9, 1, 14}, {2, 20, 5, 6}, {11, 0, 7, 8}};

static int run_steps(struct rank_run *rr) {
    struct pd_backend *be = NULL;
    struct pd_model *m = NULL;
    struct pd_kv_pool kv = {0};
    struct pd_backend_opts bo = {.kind = PD_BACKEND_CPU, .threads = 1};
    struct pd_model_opts mo = {.max_tokens = 64, .max_reqs = 4, .page_size = 16, .tp = rr->tp};
    int rc = pd_backend_new(&bo, &be);
    if (!rc)
        rc = pd_model_new(be, rr->cfg, fake_ckpt_find, rr->ck, &mo, &m);
    if (!rc) {
        struct pd_kv_pool_opts ko = pd_model_kv_opts(m, PD_DTYPE_F32);
        ko.n_pages = NPAGES;
        rc = pd_kv_pool_init(&kv, be, &ko);
    }
    int32_t toks[NREQ][64];
    for (int q = 0; q < NREQ; q++)
        for (int i = 0; i < 64; i++)
            toks[q][i] = (int32_t)((i * (q + 5) + 11 * q + 1) % VOCAB);
    struct pd_model_seq s[NREQ];
    /* step 0: request 0 has a 9-token prefix already in its pages; all extend together */
    if (!rc) {
        struct pd_model_seq p = {
            .tokens = toks[0], .n_new = 9, .n_cached = 0, .pages = pages[0], .n_pages = 4};
        rc = pd_model_extend(m, &kv, &p, 1, false, rr->logits[0][0]);
    }
    for (int q = 0; q < NREQ && !rc; q++) {
        int cached = q == 0 ? 9 : 0;
        s[q] = (struct pd_model_seq){.tokens = toks[q] + cached,
                                     .n_new = prompt_len[q] - cached,
                                     .n_cached = cached,
                                     .pages = pages[q],
                                     .n_pages = 4};
    }
    if (!rc)
        rc = pd_model_extend(m, &kv, s, NREQ, false, &rr->logits[0][0][0]);
    /* decode steps, each feeding a token derived from the step (not from the logits, so a
     * divergence shows in the numbers rather than as different token streams) */
    for (int st = 1; st < STEPS && !rc; st++) {
        int32_t next[NREQ];
        for (int q = 0; q < NREQ; q++) {
            next[q] = (int32_t)((st * 7 + q * 13) % VOCAB);
            s[q] = (struct pd_model_seq){.tokens = &next[q],
                                         .n_new = 1,
                                         .n_cached = prompt_len[q] + st - 1,
                                         .pages = pages[q],
                                         .n_pages = 4};
        }
        rc = pd_model_decode(m, &kv, s, NREQ, &rr->logits[st][0][0]);
    }
    pd_kv_pool_free(&kv);
    pd_model_free(m);
    pd_backend_free(be);
    return rc;
}

static void *rank_main(void *arg) {
    struct rank_run *rr = arg;
    rr->rc = run_steps(rr);
    return NULL;
}

/* kv_heads: the config's (0: 4); fewer than tp_size replicates each on tp_size/kv_heads ranks */
static void check_tp(enum pd_arch arch, enum pd_dtype dt, bool o_bias, int tp_size, int kv_heads) {
    rng_state = 99 + (uint64_t)arch * 7 + (uint64_t)tp_size + (uint64_t)kv_heads * 31;
    struct pd_model_config c = config(arch);
    if (kv_heads)
        c.num_key_value_heads = kv_heads;
    struct fake_ckpt *ck = pd_calloc(1, sizeof(*ck));
    fake_ckpt_weights(&c, dt, 0.3f, frand, ck);
    if (o_bias)
        for (int l = 0; l < c.num_hidden_layers; l++) {
            char n[96];
            snprintf(n, sizeof(n), "model.layers.%d.self_attn.o_proj.bias", l);
            fake_ckpt_add(ck, n, 1, c.hidden_size, 0.5f, 0, dt, frand);
        }
    struct rank_run *whole = pd_calloc(1, sizeof(*whole));
    *whole = (struct rank_run){.cfg = &c, .ck = ck};
    CHECK_OK(run_steps(whole));

    struct pd_tp_local *g = NULL;
    CHECK_OK(pd_tp_local_new(tp_size, &g));
    struct rank_run *ranks = pd_calloc((size_t)tp_size, sizeof(*ranks));
    pthread_t th[8];
    for (int r = 0; r < tp_size; r++) {
        ranks[r] = (struct rank_run){.cfg = &c, .ck = ck, .tp = pd_tp_local_comm(g, r)};
        CHECK_INT(pthread_create(&th[r], NULL, rank_main, &ranks[r]), 0);
    }
    for (int r = 0; r < tp_size; r++)
        pthread_join(th[r], NULL);
    size_t n = (size_t)STEPS * NREQ * VOCAB;
    for (int r = 0; r < tp_size; r++) {
        CHECK_OK(ranks[r].rc);
        CHECK(memcmp(ranks[r].logits, ranks[0].logits, sizeof(ranks[0].logits)) == 0);
    }
    double e = pd_rel_err(&ranks[0].logits[0][0][0], &whole->logits[0][0][0], n);
    if (!(e < 2e-5))
        fprintf(stderr, "arch %d dtype %d o_bias %d tp %d kv heads %d: relative error %.3g\n",
                (int)arch, (int)dt, o_bias, tp_size, c.num_key_value_heads, e);
    CHECK(e < 2e-5);
    /* the numbers are not trivially equal: the steps produced distinct, non-zero logits */
    CHECK(pd_rel_err(&whole->logits[1][0][0], &whole->logits[2][0][0], VOCAB) > 1e-3);
    pd_free(ranks);
    pd_tp_local_free(g);
    pd_free(whole);
    fake_ckpt_free(ck);
    pd_free(ck);
}

static void test_llama_o_bias(void) {
    check_tp(PD_ARCH_LLAMA, PD_DTYPE_F32, true, 2, 0);
    check_tp(PD_ARCH_LLAMA, PD_DTYPE_F32, true, 4, 0);
}

static void test_qwen2_bias_tied(void) {
    check_tp(PD_ARCH_QWEN2, PD_DTYPE_F32, false, 2, 0);
    check_tp(PD_ARCH_QWEN2, PD_DTYPE_F32, false, 4, 0);
}

static void test_qwen3_qk_norm_bf16(void) {
    check_tp(PD_ARCH_QWEN3, PD_DTYPE_BF16, false, 2, 0);
    check_tp(PD_ARCH_QWEN3, PD_DTYPE_BF16, false, 4, 0);
}

/* More ranks than kv heads: each kv head is replicated on tp / kv_heads ranks (rank r holds head
 * r / (tp / kv_heads)), the query heads still split; 2 kv heads at tp 4 (Llama, o_proj bias),
 * 1 kv head (MQA) at tp 2 and 4 (Qwen2: the k/v biases follow their replicated head). */
static void test_kv_replicated(void) {
    check_tp(PD_ARCH_LLAMA, PD_DTYPE_F32, true, 4, 2);
    check_tp(PD_ARCH_QWEN2, PD_DTYPE_F32, false, 2, 1);
    check_tp(PD_ARCH_QWEN2, PD_DTYPE_F32, false, 4, 1);
    check_tp(PD_ARCH_QWEN3, PD_DTYPE_BF16, false, 8, 2);
}

/* Shapes tp cannot split are refused with a message naming the numbers, and nothing leaks:
 * tp 3 neither divides 4 kv heads nor is a multiple of them; tp 4 is a multiple of 2 kv heads
 * but does not divide 6 query heads; tp 8 divides the heads but not 44 MLP columns. */
static void test_indivisible(void) {
    static const struct {
        int heads, kv_heads, inter, tp;
        const char *want1, *want2;
    } cases[] = {
        {8, 4, 88, 3, "--tp-size 3", "4 kv heads"},
        {6, 2, 88, 4, "--tp-size 4", "6 attention heads"},
        {8, 4, 44, 8, "--tp-size 8", "intermediate size 44"},
    };
    for (size_t i = 0; i < PD_ARRAY_LEN(cases); i++) {
        rng_state = 5;
        struct pd_model_config c = config(PD_ARCH_LLAMA);
        c.num_attention_heads = cases[i].heads;
        c.num_key_value_heads = cases[i].kv_heads;
        c.intermediate_size = cases[i].inter;
        struct fake_ckpt *ck = pd_calloc(1, sizeof(*ck));
        fake_ckpt_weights(&c, PD_DTYPE_F32, 0.3f, frand, ck);
        struct pd_tp_local *g = NULL;
        CHECK_OK(pd_tp_local_new(cases[i].tp, &g));
        struct pd_backend *be = NULL;
        struct pd_backend_opts bo = {.kind = PD_BACKEND_CPU, .threads = 1};
        CHECK_OK(pd_backend_new(&bo, &be));
        struct pd_model_opts mo = {.max_tokens = 16, .max_reqs = 2, .tp = pd_tp_local_comm(g, 1)};
        struct pd_model *m = NULL;
        CHECK_INT(pd_model_new(be, &c, fake_ckpt_find, ck, &mo, &m), PD_EUNSUPPORTED);
        CHECK(m == NULL);
        if (!strstr(pd_error_msg(), cases[i].want1) || !strstr(pd_error_msg(), cases[i].want2))
            fprintf(stderr, "case %zu: %s\n", i, pd_error_msg());
        CHECK(strstr(pd_error_msg(), cases[i].want1) != NULL);
        CHECK(strstr(pd_error_msg(), cases[i].want2) != NULL);
        pd_backend_free(be);
        pd_tp_local_free(g);
        fake_ckpt_free(ck);
        pd_free(ck);
    }
}

/* Ranks that disagree on the vector length all fail the call instead of reading past a buffer. */

static void test_all_reduce(void) {
    struct pd_tp_local *g = NULL;
    CHECK_OK(pd_tp_local_new(2, &g));
    struct tp_reduce a = {pd_tp_local_comm(g, 0), {1, 2, 3, 4, 5, 6, 7, 8}, 8, -1},
                     b = {pd_tp_local_comm(g, 1), {1, 2, 3, 4, 5, 6, 7, 8}, 5, -1};
    pthread_t ta, tb;
    pthread_create(&ta, NULL, tp_reduce_main, &a);
    pthread_create(&tb, NULL, tp_reduce_main, &b);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    CHECK_INT(a.rc, PD_EINVAL);
    CHECK_INT(b.rc, PD_EINVAL);
    CHECK(pd_tp_local_comm(g, 2) == NULL);
    pd_tp_local_free(g);
    struct pd_tp_local *bad = NULL;
    CHECK_INT(pd_tp_local_new(0, &bad), PD_EINVAL);
}

PD_TEST_MAIN(PD_TEST(test_llama_o_bias), PD_TEST(test_qwen2_bias_tied),
             PD_TEST(test_qwen3_qk_norm_bf16), PD_TEST(test_kv_replicated),
             PD_TEST(test_indivisible), PD_TEST(test_all_reduce))
