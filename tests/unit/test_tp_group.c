/*
 * test_tp_group.c — common/tp_group.h on the cpu backend: a group of 2 and 4 ranks (worker
 * threads in lockstep with this one) runs every entry point the engine uses — extend (last and
 * all positions), decode, decode_greedy, decode_sample — with tp 1's results: greedy and sampled
 * ids equal, logits equal up to the float reassociation of the split sums. The pools: the same
 * page count on every rank, one page of each per logical page. A step the model refuses is
 * refused by the group (every rank, no deadlock) and the next step runs; a rank that gives a
 * step up wakes the ranks waiting for it; allocation failures injected anywhere in the group's
 * start fail it cleanly (no hang, no leak under ASan).
 */
#include "pd_test.h"

#include "common/alloc.h"
#include "common/mkmodel.h"
#include "common/sampling.h"
#include "common/tp.h"
#include "common/tp_group.h"

#include <math.h>
#include <pthread.h>
#include <unistd.h>

#define NREQ 3
#define PAGES 24
#define STEPS 4

static char model_dir[512];

static void write_model(enum pd_mkmodel_family fam) {
    struct pd_mkmodel_opts o;
    pd_mkmodel_opts_defaults(&o);
    o.family = (int)fam;
    o.dtype = PD_DTYPE_F32;
    o.seed = 3;
    snprintf(model_dir, sizeof(model_dir), "%s/tp_group/%s", pd_test_tmpdir(),
             pd_mkmodel_family_names[fam]);
    CHECK_OK(pd_mkmodel_write(&o, model_dir));
}

static struct pd_tp_group_opts opts(int size) {
    return (struct pd_tp_group_opts){
        .size = size,
        .backend = {.kind = PD_BACKEND_CPU, .threads = 4},
        .model_path = model_dir,
        .model = {.max_tokens = 64, .max_reqs = 4, .max_logit_rows = 64, .page_size = 16},
        .kv_dtype = PD_DTYPE_F32,
        .n_pages = PAGES,
    };
}

/* What one group computed over the steps. */
struct run {
    int vocab;
    float *ext; /* [NREQ][vocab] last-position logits of the prompts */
    float *all; /* [40][vocab] every position of one chunk */
    float *dec; /* [STEPS][NREQ][vocab] decode logits */
    int32_t greedy[STEPS][NREQ], sampled[STEPS][NREQ];
};

static const int plen[NREQ] = {37, 16, 5};
static const int32_t pages[NREQ][4] = {{3, 9, 1, 14}, {2, 20, 5, 6}, {11, 0, 7, 8}};

static void run_group(int size, struct run *out) {
    struct pd_tp_group_opts o = opts(size);
    struct pd_tp_group *g = NULL;
    CHECK_OK(pd_tp_group_new(&o, &g));
    if (!g)
        return;
    CHECK_INT(pd_tp_group_size(g), size);
    size_t shard = pd_tp_group_kv(g, 0)->layout.page_bytes;
    CHECK_INT(pd_tp_group_page_bytes(g), (size_t)size * shard);
    for (int r = 0; r < size; r++) {
        CHECK_INT(pd_tp_group_kv(g, r)->layout.n_pages, PAGES);
        CHECK_INT(pd_tp_group_kv(g, r)->layout.page_bytes, shard);
        for (int q = 0; q < r; q++)
            CHECK(pd_tp_group_kv(g, r)->layout.base != pd_tp_group_kv(g, q)->layout.base);
    }
    int V = pd_model_config_of(pd_tp_group_model(g, 0))->vocab_size;
    out->vocab = V;
    out->ext = pd_calloc((size_t)NREQ * V, sizeof(float));
    out->all = pd_calloc((size_t)40 * V, sizeof(float));
    out->dec = pd_calloc((size_t)STEPS * NREQ * V, sizeof(float));
    int32_t toks[NREQ][64];
    for (int q = 0; q < NREQ; q++)
        for (int i = 0; i < 64; i++)
            toks[q][i] = (int32_t)((i * (q + 5) + 11 * q + 1) % V);
    struct pd_model_seq s[NREQ];
    for (int q = 0; q < NREQ; q++)
        s[q] = (struct pd_model_seq){toks[q], plen[q], 0, pages[q], 4};
    CHECK_OK(pd_tp_group_extend(g, s, NREQ, false, out->ext));
    /* all positions of a chunk over request 0's prefix: its rows are the prompt logprobs' */
    struct pd_model_seq a = {toks[0], 37, 0, pages[0], 4};
    CHECK_OK(pd_tp_group_extend(g, &a, 1, true, out->all));
    struct pd_sample_row rows[NREQ];
    float lp[NREQ];
    for (int st = 0; st < STEPS; st++) {
        int32_t next[NREQ];
        for (int q = 0; q < NREQ; q++) {
            next[q] = (int32_t)((st * 7 + q * 13) % V);
            s[q] = (struct pd_model_seq){&next[q], 1, plen[q] + st, pages[q], 4};
            rows[q] = (struct pd_sample_row){
                .temperature = 0.7f, .top_k = 0, .top_p = 0.9f, .u = 0.1 + 0.27 * q};
        }
        /* the same position three times: each call rewrites the same K/V */
        CHECK_OK(pd_tp_group_decode(g, s, NREQ, out->dec + (size_t)st * NREQ * V));
        CHECK_OK(pd_tp_group_decode_greedy(g, s, NREQ, out->greedy[st], lp));
        CHECK_OK(pd_tp_group_decode_sample(g, s, NREQ, rows, out->sampled[st], lp));
        for (int q = 0; q < NREQ; q++)
            CHECK(lp[q] <= 0.0f && isfinite(lp[q]));
    }
    pd_tp_group_free(g);
}

static double rel_err(const float *a, const float *b, size_t n) {
    double d = 0, mx = 1e-30;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        mx = fmax(mx, fabs((double)b[i]));
    }
    return d / mx;
}

static void free_run(struct run *r) {
    pd_free(r->ext);
    pd_free(r->all);
    pd_free(r->dec);
}

static void check_family(enum pd_mkmodel_family fam) {
    write_model(fam);
    struct run one = {0};
    run_group(1, &one);
    if (!one.ext)
        return;
    int V = one.vocab;
    /* the reference is not degenerate: the steps chose different tokens */
    int distinct = 0;
    for (int st = 0; st < STEPS; st++)
        for (int q = 0; q < NREQ; q++)
            distinct += one.greedy[st][q] != one.greedy[0][0];
    CHECK(distinct > 0);
    for (int S = 2; S <= 4; S += 2) {
        struct run tp = {0};
        run_group(S, &tp);
        if (!tp.ext)
            continue;
        double e1 = rel_err(tp.ext, one.ext, (size_t)NREQ * V);
        double e2 = rel_err(tp.all, one.all, (size_t)37 * V);
        double e3 = rel_err(tp.dec, one.dec, (size_t)STEPS * NREQ * V);
        if (!(e1 < 1e-5 && e2 < 1e-5 && e3 < 1e-5))
            fprintf(stderr, "%s tp %d: relative errors %.3g %.3g %.3g\n",
                    pd_mkmodel_family_names[fam], S, e1, e2, e3);
        CHECK(e1 < 1e-5 && e2 < 1e-5 && e3 < 1e-5);
        CHECK(memcmp(tp.greedy, one.greedy, sizeof(one.greedy)) == 0);
        CHECK(memcmp(tp.sampled, one.sampled, sizeof(one.sampled)) == 0);
        free_run(&tp);
    }
    free_run(&one);
}

static void test_llama(void) {
    check_family(PD_MKMODEL_LLAMA);
}

static void test_qwen2(void) {
    check_family(PD_MKMODEL_QWEN2);
}

/* Refused input: every rank refuses before any all-reduce, the group says why, the next step
 * runs. A token outside the vocabulary, a page outside the pool, a decode of two tokens. */
static void test_refused_steps(void) {
    write_model(PD_MKMODEL_LLAMA);
    struct pd_tp_group_opts o = opts(2);
    struct pd_tp_group *g = NULL;
    CHECK_OK(pd_tp_group_new(&o, &g));
    if (!g)
        return;
    int V = pd_model_config_of(pd_tp_group_model(g, 0))->vocab_size;
    float *logits = pd_calloc((size_t)4 * V, sizeof(float));
    int32_t bad_tok[2] = {1, (int32_t)V}, good[2] = {1, 2}, bad_pages[1] = {PAGES},
            ok_pages[1] = {4};
    struct pd_model_seq s = {bad_tok, 2, 0, ok_pages, 1};
    CHECK_INT(pd_tp_group_extend(g, &s, 1, false, logits), PD_ERANGE);
    CHECK(strstr(pd_error_msg(), "outside the vocabulary") != NULL);
    s = (struct pd_model_seq){good, 2, 0, bad_pages, 1};
    CHECK_INT(pd_tp_group_extend(g, &s, 1, false, logits), PD_ERANGE);
    CHECK(strstr(pd_error_msg(), "outside the kv pool") != NULL);
    s = (struct pd_model_seq){good, 2, 0, ok_pages, 1};
    CHECK_INT(pd_tp_group_decode(g, &s, 1, logits), PD_EINVAL);
    int32_t id;
    float lp;
    CHECK_INT(pd_tp_group_decode_greedy(g, &s, 1, &id, &lp), PD_EINVAL);
    CHECK_OK(pd_tp_group_extend(g, &s, 1, false, logits));
    CHECK(isfinite(logits[0]) && logits[0] != logits[1]);
    pd_free(logits);
    pd_tp_group_free(g);
}

/* A rank that gives a step up wakes the rank waiting for it in an all-reduce (PD_EPEER naming
 * it); after reset the group sums again. */
struct waiter {
    const struct pd_tp_comm *c;
    float buf[4];
    int rc;
};

static void *wait_reduce(void *arg) {
    struct waiter *w = arg;
    struct pd_backend *be = NULL;
    struct pd_backend_opts bo = {.kind = PD_BACKEND_CPU, .threads = 1};
    w->rc = pd_backend_new(&bo, &be);
    if (!w->rc)
        w->rc = w->c->all_reduce_sum(w->c, be, w->buf, 4);
    pd_backend_free(be);
    return NULL;
}

static void test_fail_wakes_peers(void) {
    struct pd_tp_local *g = NULL;
    CHECK_OK(pd_tp_local_new(3, &g));
    struct waiter w[3];
    pthread_t th[3];
    for (int r = 0; r < 2; r++) {
        w[r] = (struct waiter){.c = pd_tp_local_comm(g, r), .buf = {1, 2, 3, 4}, .rc = 1};
        pthread_create(&th[r], NULL, wait_reduce, &w[r]);
    }
    usleep(20000); /* ranks 0 and 1 are (most likely) waiting for rank 2 now */
    const struct pd_tp_comm *c2 = pd_tp_local_comm(g, 2);
    c2->fail(c2);
    for (int r = 0; r < 2; r++) {
        pthread_join(th[r], NULL);
        CHECK_INT(w[r].rc, PD_EPEER);
    }
    CHECK_OK(c2->reset(c2));
    for (int r = 0; r < 3; r++) {
        w[r] = (struct waiter){.c = pd_tp_local_comm(g, r), .buf = {1, 2, 3, (float)r}, .rc = 1};
        pthread_create(&th[r], NULL, wait_reduce, &w[r]);
    }
    for (int r = 0; r < 3; r++) {
        pthread_join(th[r], NULL);
        CHECK_OK(w[r].rc);
        CHECK(w[r].buf[0] == 3 && w[r].buf[2] == 9 && w[r].buf[3] == 3);
    }
    pd_tp_local_free(g);
}

/* Allocation failures at every point of a group's start (models loading on the workers while
 * rank 0 loads on this thread): the start fails with an error, joins every thread, frees all. */
static void test_start_failures(void) {
    write_model(PD_MKMODEL_LLAMA);
    struct pd_tp_group_opts o = opts(2);
    int failed = 0;
    bool started = false;
    for (long n = 0; n < 20000 && !started; n += 1 + n / 16) {
        struct pd_tp_group *g = NULL;
        pd_alloc_fail_after(n);
        int rc = pd_tp_group_new(&o, &g);
        long injected = pd_alloc_injected_failures();
        pd_alloc_fail_after(-1);
        if (rc == PD_OK) {
            started = true;
            pd_tp_group_free(g);
            break;
        }
        CHECK(g == NULL);
        CHECK(injected > 0);
        failed++;
    }
    CHECK(started);
    CHECK(failed > 10);
    /* a group that cannot start for a reason of the world: no such model */
    o.model_path = "/nonexistent/model";
    struct pd_tp_group *g = NULL;
    CHECK(pd_tp_group_new(&o, &g) != PD_OK);
    CHECK(strstr(pd_error_msg(), "/nonexistent/model") != NULL);
    CHECK(strstr(pd_error_msg(), "tp rank") != NULL);
    o.size = PD_TP_MAX + 1;
    CHECK_INT(pd_tp_group_new(&o, &g), PD_ERANGE);
}

PD_TEST_MAIN(PD_TEST(test_llama), PD_TEST(test_qwen2), PD_TEST(test_refused_steps),
             PD_TEST(test_fail_wakes_peers), PD_TEST(test_start_failures))
