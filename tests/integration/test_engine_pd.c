/*
 * test_engine_pd.c — a prefill engine and a decode engine in one process, their KV crossing
 * through two real transfer engines (UCX, whatever UCX_TLS CTest sets), driven from one libuv
 * loop the way the daemons drive them but without HTTP or gRPC: ADMIT → room_add/expect (the
 * Transfer), SEND → room_send, last chunk → room_finish with the first token, room ends → XFER_END.
 *
 * Checks: greedy tokens equal a single-process run of the same model API (pdserve-generate's
 * path: each prompt extended in chunks of 64, then decoded) for prompts of mixed lengths with
 * --chunked-prefill-size 64 --page-size 16, including shared prefixes (prefix cache hits); a
 * decode pool too small for the batch (retraction → local recompute) gives the same tokens;
 * aborts, a bootstrap timeout and a transfer failure end their requests; afterwards both pools
 * are back to full and the schedulers' own checks held after every step. All of it twice: the
 * prefill waiting for each Transfer, and eager (computing before it, --eager-prefill).
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "common/base/alloc.h"
#include "common/engine.h"
#include "decode/engine_decode.h"
#include "prefill/engine_prefill.h"
#include "common/base/log.h"
#include "tools/mkmodel/mkmodel.h"
#include "model/model.h"
#include "common/sched_common.h"
#include "common/xfer.h"
#include "pd_test.h"

#define MAX_PROMPTS 64
#define PAGE 16
#define CHUNK 64

static uv_loop_t loop;
static char model_dir[512];
static int vocab;

struct job {
    uint64_t room;
    int32_t prompt[400];
    int n_prompt, max_new;
    int32_t out[256];
    int n_out;
    int32_t ref[256];
    int n_ref;
    bool p_end, d_end;
    int p_reason, d_reason, d_finish, p_cached;
    bool abort_decode_after; /* abort on decode after 3 tokens */
    bool never_bootstrap;    /* the Transfer never comes */
    bool late_kv;            /* never_bootstrap, and the whole KV arrives just after the timeout */
    bool aborted_sent;
    bool ignore_eos;
};

static struct job jobs[MAX_PROMPTS];
static int n_jobs, n_ended, n_want;
static long n_held_pages; /* pages decode's prefix cache held at admissions */

struct side {
    pd_xfer_t *x;
    pd_xfer_peer_t *peer;
    struct pd_engine *eng;
    struct pd_engine_info info;
};
static struct side P, D;

static struct job *job_of(uint64_t room) {
    for (int i = 0; i < n_jobs; i++)
        if (jobs[i].room == room)
            return &jobs[i];
    return NULL;
}

static void submit(struct side *s, struct pd_engine_cmd c) {
    CHECK_OK(pd_engine_submit(s->eng, &c));
}

/* ---- prefill events ---- */

static void on_prefill_event(void *ctx, const struct pd_engine_event *ev) {
    (void)ctx;
    struct job *j = job_of(ev->room);
    switch (ev->kind) {
    case PD_ENGINE_EV_SEND: {
        /* as prefill/role.c: the pages the decode holds itself are not sent */
        int32_t held = ev->req->held_pages, begin = ev->begin > held ? ev->begin : held;
        int rc = ev->end > begin
                     ? pd_xfer_room_send(P.x, ev->room, (uint32_t)(begin - held),
                                         ev->req->pages + begin, (uint32_t)(ev->end - begin))
                     : PD_OK;
        if (rc == PD_OK && ev->last) {
            struct pd_xfer_notice n = {.first_token = ev->token,
                                       .first_logprob = ev->logprob,
                                       .cached_tokens = (uint32_t)ev->cached_tokens};
            rc = pd_xfer_room_finish(P.x, ev->room, &n);
        }
        if (rc && rc != PD_ENOENT)
            fprintf(stderr, "room %" PRIu64 ": send: %s\n", ev->room, pd_error_msg());
        break;
    }
    case PD_ENGINE_EV_QUIESCE:
        if (pd_xfer_room_live(P.x, ev->room))
            pd_xfer_room_abort(P.x, ev->room, PD_ECANCELED, "prefill aborted the request");
        break;
    case PD_ENGINE_EV_END:
        CHECK(j != NULL);
        if (j) {
            CHECK(!j->p_end);
            j->p_end = true;
            j->p_reason = ev->reason;
            j->p_cached = ev->cached_tokens;
            n_ended++;
        }
        /* a request that ends before the transfer (timeout) fails the decode side too */
        if (pd_xfer_room_live(P.x, ev->room))
            pd_xfer_room_abort(P.x, ev->room, PD_ECANCELED, "prefill gave the request up");
        pd_engine_req_free(ev->req);
        break;
    default: break;
    }
}

/* ---- decode events ---- */

static void on_decode_event(void *ctx, const struct pd_engine_event *ev) {
    (void)ctx;
    struct job *j = job_of(ev->room);
    switch (ev->kind) {
    case PD_ENGINE_EV_ADMIT:
        if (j->never_bootstrap)
            break;
        /* what Transfer does: the receiver expects the room, the sender learns its pages: those
         * after the ones the decode's prefix cache holds */
        CHECK(ev->req->held_pages < ev->req->n_pages);
        n_held_pages += ev->req->held_pages;
        CHECK_OK(pd_xfer_room_expect(D.x, D.peer, ev->room, ev->req->pages + ev->req->held_pages,
                                     (uint32_t)(ev->req->n_pages - ev->req->held_pages), NULL));
        CHECK_OK(pd_xfer_room_add(P.x, P.peer, ev->room, ev->req->pages + ev->req->held_pages,
                                  (uint32_t)(ev->req->n_pages - ev->req->held_pages), NULL));
        submit(&P, (struct pd_engine_cmd){.kind = PD_ENGINE_CMD_BOOTSTRAPPED,
                                          .room = ev->room,
                                          .held_pages = ev->req->held_pages});
        break;
    case PD_ENGINE_EV_TOKEN:
        CHECK_INT(ev->index, j->n_out);
        if (j->n_out < 256)
            j->out[j->n_out++] = ev->token;
        if (j->abort_decode_after && j->n_out == 3 && !j->aborted_sent) {
            j->aborted_sent = true;
            submit(&D, (struct pd_engine_cmd){.kind = PD_ENGINE_CMD_ABORT, .room = ev->room});
        }
        break;
    case PD_ENGINE_EV_QUIESCE:
        if (j->late_kv) {
            /* a link back just after the timeout: the done notice (first token and all) ends
             * the transfer of a room the engine already gave up */
            submit(&D, (struct pd_engine_cmd){.kind = PD_ENGINE_CMD_XFER_END,
                                              .room = ev->room,
                                              .status = PD_OK,
                                              .first_token = 1,
                                              .first_logprob = -0.5f});
            break;
        }
        /* give the room up with the prefill: a receiver abort ends once no write can land */
        if (pd_xfer_room_live(D.x, ev->room))
            pd_xfer_room_abort(D.x, ev->room, PD_ECANCELED, "decode gave the room up");
        else
            submit(&D, (struct pd_engine_cmd){.kind = PD_ENGINE_CMD_XFER_END,
                                              .room = ev->room,
                                              .status = PD_ECANCELED});
        if (pd_xfer_room_live(P.x, ev->room))
            pd_xfer_room_abort(P.x, ev->room, PD_ECANCELED, "decode aborted");
        submit(&P, (struct pd_engine_cmd){.kind = PD_ENGINE_CMD_ABORT, .room = ev->room});
        break;
    case PD_ENGINE_EV_END:
        CHECK(j && !j->d_end);
        if (j) {
            j->d_end = true;
            j->d_reason = ev->reason;
            j->d_finish = ev->finish;
            n_ended++;
            if (ev->reason != PD_END_DONE)
                submit(&P, (struct pd_engine_cmd){.kind = PD_ENGINE_CMD_ABORT, .room = ev->room});
        }
        pd_engine_req_free(ev->req);
        break;
    default: break;
    }
}

/* ---- transfer engines ---- */

static void on_room_end(void *ctx, uint64_t room, void *user, int status,
                        const struct pd_xfer_notice *n) {
    (void)user;
    struct side *s = ctx;
    struct pd_engine_cmd c = {.kind = PD_ENGINE_CMD_XFER_END, .room = room, .status = status};
    if (s == &D && n) {
        c.status = n->status;
        c.first_token = n->first_token;
        c.first_logprob = n->first_logprob;
    }
    submit(s, c);
}

static void on_peer_closed(void *ctx, pd_xfer_peer_t *p, void *user) {
    (void)user;
    struct side *s = ctx;
    if (s->peer == p)
        s->peer = NULL;
}

/* ---- helpers ---- */

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

/* Waits (running the loop) until both pools report every page free or cached. */
static bool pools_full(int ms) {
    for (int waited = 0; waited <= ms; waited += 10) {
        struct pd_engine_stats a, b;
        pd_engine_stats(P.eng, &a);
        pd_engine_stats(D.eng, &b);
        if (a.pages_used == 0 && b.pages_used == 0 &&
            b.pages_free + b.pages_cached == b.pages_total &&
            a.pages_free + a.pages_cached == a.pages_total &&
            a.q_bootstrap + a.q_waiting + a.q_inflight + a.q_draining == 0 &&
            b.q_prealloc + b.q_transfer + b.q_running + b.q_draining == 0)
            return true;
        uv_run(&loop, UV_RUN_NOWAIT);
        uv_sleep(10);
    }
    struct pd_engine_stats a, b;
    pd_engine_stats(P.eng, &a);
    pd_engine_stats(D.eng, &b);
    fprintf(stderr, "prefill pages free %d used %d cached %d; decode free %d used %d of %d\n",
            a.pages_free, a.pages_used, a.pages_cached, b.pages_free, b.pages_used, b.pages_total);
    return false;
}

static double ratio; /* decode's new_token_ratio; 0 = SGLang's */
static bool eager;   /* the prefill computes before the Transfer */

static void start_side(struct side *s, const struct pd_engine_ops *ops, int64_t n_pages,
                       double timeout_s) {
    struct pd_engine_config cfg = {.ops = ops,
                                   .model_path = model_dir,
                                   .threads = 1,
                                   .page_size = PAGE,
                                   .chunked_prefill_size = CHUNK,
                                   .max_prefill_tokens = 16384,
                                   .max_running_requests = 32,
                                   .max_queued_requests = 64,
                                   .n_pages = n_pages,
                                   .bootstrap_timeout_s = timeout_s,
                                   .waiting_timeout_s = timeout_s,
                                   .eager_prefill = eager,
                                   .new_token_ratio = ratio};
    CHECK_OK(pd_engine_new(&cfg, &s->eng));
    pd_engine_get_info(s->eng, &s->info);
    struct pd_xfer_config xc = {.abort_timeout_ms = 2000};
    struct pd_xfer_callbacks cb = {
        .ctx = s, .on_room_end = on_room_end, .on_peer_closed = on_peer_closed};
    CHECK_OK(pd_xfer_new(&loop, &xc, &cb, &s->x));
    CHECK_OK(pd_xfer_register_pool(s->x, s->info.pool_base, s->info.page_bytes,
                                   (uint32_t)s->info.n_pages));
    CHECK_OK(pd_engine_start(
        s->eng, &loop, ops == &pd_engine_prefill_ops ? on_prefill_event : on_decode_event, NULL));
}

static void pair_sides(void) {
    struct pd_xfer_peer_info ri = {.remote_id = pd_xfer_id(D.x),
                                   .page_bytes = D.info.page_bytes,
                                   .n_pages = (uint32_t)D.info.n_pages};
    pd_xfer_local_address(D.x, &ri.worker_addr, &ri.worker_addr_len);
    pd_xfer_local_rkey(D.x, &ri.rkey, &ri.rkey_len, &ri.base);
    CHECK_OK(pd_xfer_peer_connect(P.x, &ri, NULL, &P.peer));
    struct pd_xfer_peer_info si = {.remote_id = pd_xfer_id(P.x)};
    pd_xfer_local_address(P.x, &si.worker_addr, &si.worker_addr_len);
    CHECK_OK(pd_xfer_peer_connect(D.x, &si, NULL, &D.peer));
}

static void stop_sides(void) {
    pd_engine_stop(P.eng);
    pd_engine_stop(D.eng);
    CHECK_INT(pd_engine_last_check(P.eng) <= 0, 1);
    CHECK_INT(pd_engine_last_check(D.eng) <= 0, 1);
    pd_xfer_free(P.x);
    pd_xfer_free(D.x);
    uv_run(&loop, UV_RUN_DEFAULT);
    pd_engine_free(P.eng);
    pd_engine_free(D.eng);
    memset(&P, 0, sizeof(P));
    memset(&D, 0, sizeof(D));
}

/* The reference: pdserve-generate's path over the model API, one prompt at a time. */
static void reference(struct job *j) {
    struct pd_backend *be;
    struct pd_model *m;
    struct pd_kv_pool kv;
    struct pd_backend_opts bo = {.kind = PD_BACKEND_CPU, .threads = 1};
    CHECK_OK(pd_backend_new(&bo, &be));
    struct pd_model_opts mo = {
        .max_tokens = CHUNK, .max_reqs = 1, .max_logit_rows = 1, .page_size = PAGE};
    CHECK_OK(pd_model_load(be, model_dir, &mo, &m));
    int total = j->n_prompt + j->max_new;
    int n_pages = (total + PAGE - 1) / PAGE;
    struct pd_kv_pool_opts ko = pd_model_kv_opts(m, PD_DTYPE_F32);
    ko.n_pages = n_pages;
    CHECK_OK(pd_kv_pool_init(&kv, be, &ko));
    int32_t pages[64], ids[700];
    for (int i = 0; i < n_pages; i++)
        pages[i] = i;
    memcpy(ids, j->prompt, sizeof(int32_t) * (size_t)j->n_prompt);
    const struct pd_model_config *cfg = pd_model_config_of(m);
    float *logits = pd_malloc(sizeof(float) * (size_t)cfg->vocab_size);
    struct pd_sampling_scratch sc;
    CHECK_OK(pd_sampling_scratch_init(&sc, cfg->vocab_size));
    struct pd_sampling_params sp;
    pd_sampling_params_default(&sp);
    sp.temperature = 0;
    sp.max_new_tokens = j->max_new;
    struct pd_sampler smp;
    CHECK_OK(pd_sampler_init(&smp, &sp, cfg->vocab_size, ids, j->n_prompt, cfg->eos_token_ids,
                             cfg->n_eos_token_ids));
    for (int done = 0; done < j->n_prompt;) {
        int len = j->n_prompt - done < CHUNK ? j->n_prompt - done : CHUNK;
        struct pd_model_seq s = {.tokens = ids + done,
                                 .n_new = len,
                                 .n_cached = done,
                                 .pages = pages,
                                 .n_pages = n_pages};
        CHECK_OK(pd_model_extend(m, &kv, &s, 1, false, logits));
        done += len;
    }
    j->n_ref = 0;
    for (;;) {
        struct pd_sample o;
        pd_sampler_next(&smp, &sc, logits, &o);
        ids[j->n_prompt + j->n_ref] = o.token;
        j->ref[j->n_ref++] = o.token;
        int t = j->n_prompt + j->n_ref;
        if (o.finish || t >= pd_model_context_length(m))
            break;
        struct pd_model_seq s = {.tokens = &ids[t - 1],
                                 .n_new = 1,
                                 .n_cached = t - 1,
                                 .pages = pages,
                                 .n_pages = n_pages};
        CHECK_OK(pd_model_decode(m, &kv, &s, 1, logits));
    }
    pd_sampler_free(&smp);
    pd_sampling_scratch_free(&sc);
    pd_free(logits);
    pd_kv_pool_free(&kv);
    pd_model_free(m);
    pd_backend_free(be);
}

static uint64_t rng_state = 0x1234567;
static int32_t rnd(int32_t n) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (int32_t)((rng_state >> 33) % (uint64_t)n);
}

static void add_job(int n_prompt, int max_new, const struct job *prefix_of) {
    struct job *j = &jobs[n_jobs++];
    memset(j, 0, sizeof(*j));
    j->room = 0x100000u + (uint64_t)n_jobs * 7919u;
    j->n_prompt = n_prompt;
    j->max_new = max_new;
    int shared = prefix_of ? (prefix_of->n_prompt < n_prompt ? prefix_of->n_prompt : n_prompt) : 0;
    for (int i = 0; i < n_prompt; i++)
        j->prompt[i] = i < shared ? prefix_of->prompt[i] : 3 + rnd(vocab - 3);
}

static void submit_job(struct job *j) {
    struct pd_sampling_params sp;
    pd_sampling_params_default(&sp);
    sp.temperature = 0;
    sp.max_new_tokens = j->max_new;
    sp.ignore_eos = j->ignore_eos;
    struct pd_engine_req *pr, *dr;
    CHECK_OK(pd_engine_req_new(j->room, j->prompt, j->n_prompt, PAGE, &sp, &pr));
    CHECK_OK(pd_engine_req_new(j->room, j->prompt, j->n_prompt, PAGE, &sp, &dr));
    submit(&D, (struct pd_engine_cmd){.kind = PD_ENGINE_CMD_ADD, .req = dr});
    submit(&P, (struct pd_engine_cmd){.kind = PD_ENGINE_CMD_ADD, .req = pr});
}

static int check_tokens(int from, int to) {
    int bad = 0;
    for (int i = from; i < to; i++) {
        struct job *j = &jobs[i];
        bool same =
            j->n_out == j->n_ref && memcmp(j->out, j->ref, sizeof(int32_t) * (size_t)j->n_ref) == 0;
        if (!same) {
            bad++;
            fprintf(stderr, "prompt %d (%d tokens): got %d tokens, reference %d; first ids %d/%d\n",
                    i, j->n_prompt, j->n_out, j->n_ref, j->n_out ? j->out[0] : -1, j->ref[0]);
        }
        CHECK_INT(j->d_reason, PD_END_DONE);
        CHECK_INT(j->p_reason, PD_END_DONE);
    }
    CHECK_INT(bad, 0);
    return bad;
}

/* Mixed lengths, shared prefixes, one pool big enough: tokens equal the reference. */
static void test_tokens_equal(void) {
    n_jobs = n_ended = 0;
    n_held_pages = 0;
    static const int lens[] = {1, 5, 15, 16, 17, 31, 40, 63, 64, 65, 100, 128, 129, 200, 257, 33};
    for (size_t i = 0; i < PD_ARRAY_LEN(lens); i++)
        add_job(lens[i], 4 + (int)(i % 5) * 5, NULL);
    add_job(150, 12, &jobs[13]); /* shares 150 tokens with the 200-token prompt */
    add_job(90, 12, &jobs[10]);  /* shares 90 of the 100-token prompt */
    add_job(300, 12, &jobs[14]); /* extends the 257-token prompt */
    for (int i = 0; i < n_jobs; i++)
        reference(&jobs[i]);
    start_side(&P, &pd_engine_prefill_ops, 256, 30);
    start_side(&D, &pd_engine_decode_ops, 256, 30);
    pair_sides();
    /* the first wave primes the prefix cache; the prefix sharers come after */
    int first = n_jobs - 3;
    for (int i = 0; i < first; i++)
        submit_job(&jobs[i]);
    CHECK(run_until_ended(2 * first, 60000));
    for (int i = first; i < n_jobs; i++)
        submit_job(&jobs[i]);
    CHECK(run_until_ended(2 * n_jobs, 60000));
    check_tokens(0, n_jobs);
    for (int i = first; i < n_jobs; i++) /* whole pages of the shared prefix came from cache */
        CHECK(jobs[i].p_cached >= 80);
    /* and the decode held them itself: the 150-token sharer alone finds 9 pages (its 200-token
     * parent's prompt and output stayed in decode's cache) */
    CHECK(n_held_pages >= 9);
    CHECK(pools_full(2000));
    stop_sides();
}

/* A decode pool too small for the batch: retraction, local recompute, same tokens. */
static void test_retraction(void) {
    n_jobs = n_ended = 0;
    for (int i = 0; i < 8; i++)
        add_job(40 + i, 60, NULL);
    for (int i = 0; i < n_jobs; i++) {
        reference(&jobs[i]);
        jobs[i].max_new = jobs[i].n_ref; /* no early EOS: every request runs its length */
    }
    start_side(&P, &pd_engine_prefill_ops, 256, 30);
    /* a low reservation admits 7 requests of 3 prompt pages into 24 pages; growing to 7 pages
     * each, they cannot all fit */
    ratio = 0.02;
    start_side(&D, &pd_engine_decode_ops, 24, 30);
    ratio = 0;
    pair_sides();
    for (int i = 0; i < n_jobs; i++)
        submit_job(&jobs[i]);
    CHECK(run_until_ended(2 * n_jobs, 120000));
    check_tokens(0, n_jobs);
    CHECK(pools_full(2000));
    struct pd_engine_stats ds;
    pd_engine_stats(D.eng, &ds);
    fprintf(stderr, "retraction test: %" PRId64 " retractions\n", ds.retractions);
    CHECK(ds.retractions > 0);
    stop_sides();
}

/* Aborts on either side, a bootstrap that never comes, an abort mid-decode, a transfer that
 * ends well after the decode gave its room up. */
static void test_failures(void) {
    n_jobs = n_ended = 0;
    add_job(50, 250, NULL);
    jobs[0].abort_decode_after = true; /* long enough that the abort lands mid-decode */
    jobs[0].ignore_eos = true;
    add_job(70, 10, NULL);
    jobs[1].never_bootstrap = true; /* prefill times out in bootstrap; decode in transfer */
    add_job(20, 10, NULL);
    add_job(40, 10, NULL);
    jobs[3].never_bootstrap = jobs[3].late_kv = true;
    for (int i = 1; i < n_jobs; i++)
        reference(&jobs[i]);
    start_side(&P, &pd_engine_prefill_ops, 128, 1.0);
    start_side(&D, &pd_engine_decode_ops, 128, 1.5);
    pair_sides();
    double t0 = (double)uv_hrtime() / 1e9;
    for (int i = 0; i < n_jobs; i++)
        submit_job(&jobs[i]);
    CHECK(run_until_ended(2 * n_jobs, 30000));
    double secs = (double)uv_hrtime() / 1e9 - t0;
    CHECK(secs < 10);
    CHECK_INT(jobs[0].d_reason, PD_END_ABORTED);
    CHECK(jobs[0].n_out >= 3 && jobs[0].n_out < 250);
    CHECK_INT(jobs[1].p_reason, PD_END_TIMEOUT);
    CHECK_INT(jobs[1].d_reason, PD_END_TIMEOUT);
    /* its KV came after the timeout: it still ends timed out, and no token of it goes out */
    CHECK_INT(jobs[3].p_reason, PD_END_TIMEOUT);
    CHECK_INT(jobs[3].d_reason, PD_END_TIMEOUT);
    CHECK_INT(jobs[3].n_out, 0);
    check_tokens(2, 3);
    CHECK(pools_full(3000));
    stop_sides();
}

int main(void) {
    pd_log_set_level(PD_LOG_WARNING);
    setenv("PD_ENGINE_CHECK", "1", 1);
    /* this process's own directory: the tcp and shm entries of one binary run at once */
    if (pd_test_scratch_dir(model_dir, sizeof(model_dir), "engine_pd_model") != PD_OK)
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
    for (int e = 0; e < 2; e++) {
        eager = e;
        fprintf(stderr, "prefill %s\n", eager ? "eager" : "waiting for each Transfer");
        test_tokens_equal();
        test_retraction();
        test_failures();
    }
    uv_loop_close(&loop);
    pd_test_scratch_remove(model_dir);
    printf("%d checks, %d failures\n", pd_test_checks, pd_test_failures);
    return pd_test_failures ? 1 : 0;
}
