/*
 * test_engine_coloc.c — the colocated engine (pd_engine_coloc_ops: what pdserve-decode
 * --disaggregation-mode null runs) in one process on a libuv loop, without HTTP, with the
 * scheduler's own check after every step (PD_ENGINE_CHECK).
 *
 * Checks: 24 prompts of 1..300 tokens submitted at once (chunks of 64 mixed with running
 * decodes) give the tokens each gives when it runs alone; a pool too small for them retracts
 * and recomputes with the same tokens; without mixing the same; aborts before the first token
 * and while decoding end aborted; a prompt token outside the vocabulary is refused before it
 * can join a step; penalized requests choosing on the device (greedy_on_device) get the tokens
 * the host sampler gives them alone. After each part every page is free or cached and the queues
 * are empty.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "common/engine.h"
#include "decode/engine_decode.h"
#include "common/base/log.h"
#include "tools/mkmodel/mkmodel.h"
#include "common/sched_common.h"
#include "pd_test.h"

#define N_JOBS 24
#define MAX_OUT 2048

static uv_loop_t loop;
static char model_dir[512];
static int vocab;
static struct pd_engine *eng;

struct job {
    uint64_t room;
    int32_t prompt[300];
    int n_prompt, max_new;
    int32_t out[MAX_OUT];
    int n_out;
    int32_t ref[MAX_OUT];
    int n_ref;
    bool ended;
    int reason, status;
    int abort_after; /* > 0: abort once this many tokens came */
    bool ignore_eos;
    float rep, freq, pres; /* penalties (rep 0: none) */
};

static struct job jobs[N_JOBS + 2];
static int n_ended, n_want;

static struct job *job_of(uint64_t room) {
    for (int i = 0; i < N_JOBS + 2; i++)
        if (jobs[i].room == room)
            return &jobs[i];
    return NULL;
}

static void on_event(void *ctx, const struct pd_engine_event *ev) {
    (void)ctx;
    struct job *j = job_of(ev->room);
    switch (ev->kind) {
    case PD_ENGINE_EV_TOKEN:
        CHECK(j != NULL && ev->index == j->n_out && j->n_out < MAX_OUT);
        if (j && j->n_out < MAX_OUT)
            j->out[j->n_out++] = ev->token;
        if (j && j->abort_after && j->n_out == j->abort_after)
            pd_engine_submit(eng,
                             &(struct pd_engine_cmd){.kind = PD_ENGINE_CMD_ABORT, .room = j->room});
        break;
    case PD_ENGINE_EV_END:
        CHECK(j != NULL && !j->ended);
        if (j) {
            j->ended = true;
            j->reason = ev->reason;
            j->status = ev->status;
        }
        pd_engine_req_free(ev->req);
        n_ended++;
        break;
    default: CHECK(!"a colocated engine sends only TOKEN and END for requests");
    }
}

static void on_deadline(uv_timer_t *t) {
    *(bool *)t->data = true;
    uv_stop(t->loop);
}

static void on_prepare(uv_prepare_t *p) {
    if (n_ended >= n_want)
        uv_stop(p->loop);
}

static bool run_until_ended(int want, int ms) {
    n_want = want;
    bool expired = false;
    uv_timer_t t;
    uv_prepare_t p;
    uv_timer_init(&loop, &t);
    uv_prepare_init(&loop, &p);
    t.data = &expired;
    uv_timer_start(&t, on_deadline, (uint64_t)ms, 0);
    uv_prepare_start(&p, on_prepare);
    while (n_ended < want && !expired)
        uv_run(&loop, UV_RUN_DEFAULT);
    uv_close((uv_handle_t *)&t, NULL);
    uv_close((uv_handle_t *)&p, NULL);
    uv_run(&loop, UV_RUN_NOWAIT);
    return n_ended >= want;
}

static bool pool_full(int ms) {
    struct pd_engine_stats s;
    for (int waited = 0; waited <= ms; waited += 10) {
        pd_engine_stats(eng, &s);
        if (s.pages_used == 0 && s.pages_free + s.pages_cached == s.pages_total &&
            s.q_waiting + s.q_running == 0)
            return true;
        uv_run(&loop, UV_RUN_NOWAIT);
        uv_sleep(10);
    }
    fprintf(stderr, "pages free %d used %d cached %d of %d; waiting %d running %d\n", s.pages_free,
            s.pages_used, s.pages_cached, s.pages_total, s.q_waiting, s.q_running);
    return false;
}

static bool on_device; /* greedy_on_device for the engines start() makes */

/* The engine, not started yet (commands submitted now are taken together by its first step). */
static void create(int64_t n_pages, bool mixed, double ratio) {
    struct pd_engine_config cfg = {.ops = &pd_engine_coloc_ops,
                                   .greedy_on_device = on_device,
                                   .model_path = model_dir,
                                   .threads = 1,
                                   .page_size = 16,
                                   .chunked_prefill_size = 64,
                                   .max_prefill_tokens = 16384,
                                   .max_running_requests = 32,
                                   .max_queued_requests = 64,
                                   .n_pages = n_pages,
                                   .new_token_ratio = ratio,
                                   .mixed_chunk = mixed};
    CHECK_OK(pd_engine_new(&cfg, &eng));
}

static void start(int64_t n_pages, bool mixed, double ratio) {
    create(n_pages, mixed, ratio);
    CHECK_OK(pd_engine_start(eng, &loop, on_event, NULL));
}

static struct pd_engine_stats stop(void) {
    struct pd_engine_stats s;
    pd_engine_stats(eng, &s);
    pd_engine_stop(eng);
    CHECK(pd_engine_last_check(eng) <= 0); /* the scheduler's check held after every step */
    uv_run(&loop, UV_RUN_DEFAULT);
    pd_engine_free(eng);
    eng = NULL;
    return s;
}

static uint64_t next_room = 1;

static void submit(struct job *j) {
    j->room = next_room++;
    j->n_out = 0;
    j->ended = false;
    struct pd_sampling_params sp;
    pd_sampling_params_default(&sp);
    sp.temperature = 0;
    sp.max_new_tokens = j->max_new;
    sp.ignore_eos = j->ignore_eos;
    if (j->rep > 0) {
        sp.repetition_penalty = j->rep;
        sp.frequency_penalty = j->freq;
        sp.presence_penalty = j->pres;
    }
    struct pd_engine_req *r;
    CHECK_OK(pd_engine_req_new(j->room, j->prompt, j->n_prompt, 16, &sp, &r));
    CHECK_OK(pd_engine_submit(eng, &(struct pd_engine_cmd){.kind = PD_ENGINE_CMD_ADD, .req = r}));
}

static void make_jobs(void) {
    static const int lens[N_JOBS] = {1,  2,   3,   15,  16,  17,  31,  33,  63,  64,  65,  80,
                                     96, 127, 128, 129, 150, 180, 200, 230, 257, 270, 290, 300};
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < N_JOBS; i++) {
        struct job *j = &jobs[i];
        j->n_prompt = lens[i];
        j->max_new = 8 + (i * 11) % 50;
        for (int k = 0; k < j->n_prompt; k++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            /* every third prompt shares its first 40 tokens with the first one: cache hits */
            j->prompt[k] = i % 3 == 0 && k < 40 && i ? jobs[0].prompt[k % jobs[0].n_prompt]
                                                     : (int32_t)((x >> 33) % (uint64_t)vocab);
        }
    }
}

/* Every job run alone: the tokens a request gets without any batching around it. */
static void test_alone(void) {
    start(1024, true, 0);
    for (int i = 0; i < N_JOBS; i++) {
        n_ended = 0;
        submit(&jobs[i]);
        CHECK(run_until_ended(1, 30000));
        CHECK_INT(jobs[i].reason, PD_END_DONE);
        jobs[i].n_ref = jobs[i].n_out;
        memcpy(jobs[i].ref, jobs[i].out, sizeof(jobs[i].out));
        CHECK(jobs[i].n_ref >= 1);
    }
    CHECK(pool_full(2000));
    stop();
}

static int check_all(const char *what) {
    int bad = 0;
    for (int i = 0; i < N_JOBS; i++) {
        struct job *j = &jobs[i];
        if (!j->ended || j->reason != PD_END_DONE || j->n_out != j->n_ref ||
            memcmp(j->out, j->ref, sizeof(int32_t) * (size_t)j->n_ref) != 0) {
            fprintf(stderr, "%s: job %d (%d tokens): ended %d reason %d, %d tokens vs %d alone\n",
                    what, i, j->n_prompt, (int)j->ended, j->reason, j->n_out, j->n_ref);
            bad++;
        }
    }
    return bad;
}

static void run_all_at_once(int64_t n_pages, bool mixed, double ratio, const char *what,
                            struct pd_engine_stats *out) {
    start(n_pages, mixed, ratio);
    n_ended = 0;
    for (int i = 0; i < N_JOBS; i++)
        submit(&jobs[i]);
    CHECK(run_until_ended(N_JOBS, 60000));
    CHECK_INT(check_all(what), 0);
    CHECK(pool_full(2000));
    *out = stop();
    fprintf(stderr, "%s: %" PRId64 " steps, %" PRId64 " mixed, %" PRId64 " retractions\n", what,
            out->steps, out->mixed_steps, out->retractions);
}

static void test_together(void) {
    struct pd_engine_stats s;
    run_all_at_once(1024, true, 0, "mixed", &s);
    CHECK(s.mixed_steps > 0);
    run_all_at_once(1024, false, 0, "unmixed", &s);
    CHECK_INT(s.mixed_steps, 0);
    /* 48 pages of 16 tokens for 24 requests of up to 22 pages: retraction and recompute */
    run_all_at_once(48, true, 0.01, "small pool", &s);
    CHECK(s.retractions > 0);
}

/* Aborted before its first token, aborted while decoding, refused for a token outside the
 * vocabulary (before it could join a step and fail the others in it): each ends once, with
 * nothing held. The commands go in before the engine starts, so its first step takes the abort
 * with the request (sent to a running engine, the request could reach its first token before
 * the abort came: CI82 saw it on a loaded machine). */
static void test_endings(void) {
    create(1024, true, 0);
    n_ended = 0;
    struct job *pre = &jobs[N_JOBS], *dec = &jobs[N_JOBS + 1], bad;
    *pre = jobs[N_JOBS - 1]; /* 300 tokens: 5 chunks of 64 */
    *dec = (struct job){.n_prompt = 30, .max_new = 1800, .abort_after = 3, .ignore_eos = true};
    memcpy(dec->prompt, jobs[0].prompt, sizeof(dec->prompt));
    submit(pre);
    pd_engine_submit(eng, &(struct pd_engine_cmd){.kind = PD_ENGINE_CMD_ABORT, .room = pre->room});
    submit(dec); /* on_event aborts it after its third token */
    bad = (struct job){.n_prompt = 20, .max_new = 5};
    for (int k = 0; k < 20; k++)
        bad.prompt[k] = k == 7 ? vocab + 5 : k;
    struct job *b = &jobs[N_JOBS - 1];
    struct job keep = *b;
    *b = bad; /* job_of() finds it there */
    submit(b);
    CHECK_OK(pd_engine_start(eng, &loop, on_event, NULL));
    CHECK(run_until_ended(3, 30000));
    CHECK_INT(pre->reason, PD_END_ABORTED);
    CHECK_INT(pre->n_out, 0);
    CHECK_INT(dec->reason, PD_END_ABORTED);
    CHECK(dec->n_out >= 3 && dec->n_out < dec->max_new);
    CHECK_INT(b->reason, PD_END_FAILED);
    CHECK_INT(b->status, PD_EINVAL);
    CHECK_INT(b->n_out, 0);
    *b = keep;
    CHECK(pool_full(2000));
    /* and it still serves */
    n_ended = 0;
    submit(&jobs[5]);
    CHECK(run_until_ended(1, 30000));
    CHECK(jobs[5].reason == PD_END_DONE && jobs[5].n_out == jobs[5].n_ref &&
          memcmp(jobs[5].out, jobs[5].ref, sizeof(int32_t) * (size_t)jobs[5].n_ref) == 0);
    stop();
}

/* Decode steps choosing on the device (greedy_on_device: the cpu backend's pd_backend_sample
 * with penalty slots, as a GPU would) give every penalized request the tokens it gets alone on
 * the host sampler, batched with chunks and each other, and through retraction (slots given
 * back and set again from the tokens). */
static void test_device_penalties(void) {
    for (int i = 0; i < N_JOBS; i++) {
        jobs[i].rep = i % 4 == 3 ? 0 : 1.0f + 0.2f * (float)(i % 3);
        jobs[i].freq = 0.3f * (float)(i % 5);
        jobs[i].pres = i % 2 ? 0.5f : -0.5f;
    }
    on_device = false;
    test_alone(); /* the references, host sampler */
    on_device = true;
    struct pd_engine_stats s;
    run_all_at_once(1024, true, 0, "device, mixed", &s);
    CHECK(s.sampled_on_device > 0);
    run_all_at_once(48, true, 0.01, "device, small pool", &s);
    CHECK(s.retractions > 0 && s.sampled_on_device > 0);
    on_device = false;
}

int main(void) {
    pd_log_set_level(PD_LOG_WARNING);
    setenv("PD_ENGINE_CHECK", "1", 1);
    /* this process's own directory: the tcp and shm entries of one binary run at once */
    if (pd_test_scratch_dir(model_dir, sizeof(model_dir), "engine_coloc_model") != PD_OK)
        return 1;
    struct pd_mkmodel_opts mo;
    pd_mkmodel_opts_defaults(&mo);
    mo.dtype = PD_DTYPE_F32;
    mo.threads = 1;
    if (pd_mkmodel_write(&mo, model_dir) != PD_OK) {
        fprintf(stderr, "mkmodel: %s\n", pd_error_msg());
        pd_test_scratch_remove(model_dir);
        return 1;
    }
    struct pd_model_config cfg;
    CHECK_OK(pd_mkmodel_config(&mo, &cfg));
    vocab = cfg.vocab_size;
    uv_loop_init(&loop);
    make_jobs();
    test_alone();
    test_together();
    test_endings();
    test_device_penalties();
    uv_loop_close(&loop);
    pd_test_scratch_remove(model_dir);
    printf("%d checks, %d failures\n", pd_test_checks, pd_test_failures);
    return pd_test_failures ? 1 : 0;
}
