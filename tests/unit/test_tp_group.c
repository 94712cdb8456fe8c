/*
 * test_tp_group.c — model/tp_group.h on the cpu backend: a group of 2 and 4 ranks (worker
 * threads in lockstep with this one) runs every entry point the engine uses — extend (last and
 * all positions), decode, decode_greedy, decode_sample — with tp 1's results: greedy and sampled
 * ids equal, logits equal up to the float reassociation of the split sums. The pools: the same
 * page count on every rank, one page of each per logical page. A step the model refuses is
 * refused by the group (every rank, no deadlock) and the next step runs; a rank that gives a
 * step up wakes the ranks waiting for it; allocation failures injected anywhere in the group's
 * start fail it cleanly (no hang, no leak under ASan).
 */
#include "pd_compare.h"
#include "pd_test.h"
#include "pd_tp_fixture.h"

#include "common/base/alloc.h"
#include "model/sampling.h"
#include "model/tp.h"
#include "model/tp_group.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define NREQ TP_BATCH_NREQ
#define PAGES 24
#define STEPS 4

static char model_dir[512];

static void write_model(enum pd_mkmodel_family fam) {
    CHECK_OK(tp_write_model(model_dir, sizeof(model_dir), "tp_group", fam, PD_DTYPE_F32, 3));
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
    float *all; /* [all_rows][vocab] every position of request 0's prompt, one chunk */
    int all_rows;
    float *dec; /* [STEPS][NREQ][vocab] decode logits */
    int32_t greedy[STEPS][NREQ], sampled[STEPS][NREQ];
};

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
    out->dec = pd_calloc((size_t)STEPS * NREQ * V, sizeof(float));
    struct tp_batch b;
    tp_batch_init(&b, V);
    out->all_rows = b.plen[0];
    out->all = pd_calloc((size_t)out->all_rows * V, sizeof(float));
    CHECK_OK(pd_tp_group_extend(g, b.s, NREQ, false, out->ext));
    /* all positions of a chunk over request 0's prefix: its rows are the prompt logprobs' */
    CHECK_OK(pd_tp_group_extend(g, &b.s[0], 1, true, out->all));
    struct pd_model_seq s[NREQ];
    struct pd_sample_row rows[NREQ];
    float lp[NREQ];
    for (int st = 0; st < STEPS; st++) {
        int32_t next[NREQ];
        for (int q = 0; q < NREQ; q++) {
            next[q] = (int32_t)((st * 7 + q * 13) % V);
            s[q] = tp_batch_step(&b, q, st, &next[q]);
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
        double e1 = pd_rel_err(tp.ext, one.ext, (size_t)NREQ * V);
        double e2 = pd_rel_err(tp.all, one.all, (size_t)one.all_rows * V);
        double e3 = pd_rel_err(tp.dec, one.dec, (size_t)STEPS * NREQ * V);
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
    struct pd_model_seq s = {
        .tokens = bad_tok, .n_new = 2, .n_cached = 0, .pages = ok_pages, .n_pages = 1};
    CHECK_INT(pd_tp_group_extend(g, &s, 1, false, logits), PD_ERANGE);
    CHECK(strstr(pd_error_msg(), "outside the vocabulary") != NULL);
    s = (struct pd_model_seq){
        .tokens = good, .n_new = 2, .n_cached = 0, .pages = bad_pages, .n_pages = 1};
    CHECK_INT(pd_tp_group_extend(g, &s, 1, false, logits), PD_ERANGE);
    CHECK(strstr(pd_error_msg(), "outside the kv pool") != NULL);
    s = (struct pd_model_seq){
        .tokens = good, .n_new = 2, .n_cached = 0, .pages = ok_pages, .n_pages = 1};
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
static void test_fail_wakes_peers(void) {
    struct pd_tp_local *g = NULL;
    CHECK_OK(pd_tp_local_new(3, &g));
    struct tp_reduce w[3];
    pthread_t th[3];
    for (int r = 0; r < 2; r++) {
        w[r] = (struct tp_reduce){
            .c = pd_tp_local_comm(g, r), .buf = {1, 2, 3, 4}, .count = 4, .rc = 1};
        pthread_create(&th[r], NULL, tp_reduce_main, &w[r]);
    }
    /* ranks 0 and 1 are inside the all-reduce, waiting for rank 2, before rank 2 gives up */
    for (int i = 0; i < 10000 && pd_tp_local_waiting(g) < 2; i++)
        usleep(1000);
    CHECK_INT(pd_tp_local_waiting(g), 2);
    const struct pd_tp_comm *c2 = pd_tp_local_comm(g, 2);
    c2->fail(c2);
    struct timespec deadline; /* a failure bound: a rank nobody wakes waits forever */
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 30;
    for (int r = 0; r < 2; r++) {
        if (pthread_timedjoin_np(th[r], NULL, &deadline) != 0) {
            fprintf(stderr, "rank %d still waits in the all-reduce 30 s after rank 2 failed\n", r);
            CHECK(!"the failed rank woke its peers");
            exit(1); /* its thread cannot be joined or freed */
        }
        CHECK_INT(w[r].rc, PD_EPEER);
    }
    CHECK_OK(c2->reset(c2));
    for (int r = 0; r < 3; r++) {
        w[r] = (struct tp_reduce){
            .c = pd_tp_local_comm(g, r), .buf = {1, 2, 3, (float)r}, .count = 4, .rc = 1};
        pthread_create(&th[r], NULL, tp_reduce_main, &w[r]);
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
