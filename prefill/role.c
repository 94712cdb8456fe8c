/*
 * role.c — the prefill role of the daemon (common/daemon_internal.h's struct pd_role): the
 * bootstrap server on --disaggregation-bootstrap-port (decode's Transfer for a room, before or
 * after the request's HTTP body, moves the request from the bootstrap queue to waiting: the
 * compute thread's prefill/engine_prefill.c holds the queues), the sender of each finished
 * chunk's KV pages into the pages the decode reserved, and the small answer the router drains.
 */
#include "prefill/role.h"

#include "common/daemon_internal.h"
#include "prefill/bootstrap_server.h"
#include "common/sched_common.h"
#include "prefill/engine_prefill.h"

#include "common/base/alloc.h"
#include "common/base/log.h"
#include "common/base/status.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>

#define MAX_EARLY_ROOMS 4096 /* Transfers that came before their HTTP body */

struct early_room {
    uint64_t room;
    double t;
    int32_t held_pages;
    uint32_t prompt_len;
};

/* The role's own state (the loop thread's, as everything of the daemon's). */
static struct {
    pd_bootstrap_server_t *server;
    struct early_room early[MAX_EARLY_ROOMS];
    int n_early;
} P;

/* SEND: the chunk's finished pages go to the decode's reserved ones; the last chunk's event
 * also finishes the room with the done notice (first token, its top logprobs, cache hit). */
static void prefill_send(struct pd_daemon_state *d, struct pd_daemon_req *r,
                         const struct pd_engine_event *ev) {
    if (!pd_xfer_room_live(d->x, ev->room))
        return; /* the room already ended (aborted/failed): the engine hears it */
    int rc = PD_OK;
    /* the decode's destinations start after the pages it holds itself (its prefix cache) */
    int32_t held = ev->req->held_pages, begin = ev->begin > held ? ev->begin : held;
    if (ev->end > begin)
        rc = pd_xfer_room_send(d->x, ev->room, (uint32_t)(begin - held), ev->req->pages + begin,
                               (uint32_t)(ev->end - begin));
    if (rc == PD_OK && r && ev->end > begin) { /* counted once the room completed */
        if (r->t_xfer == 0)
            r->t_xfer = now_s();
        r->xfer_bytes += (double)(ev->end - begin) * (double)d->info.page_bytes;
    }
    if (r && ev->last)
        r->in_lp_ready = true; /* the engine scored the prompt before its last chunk's event */
    if (rc == PD_OK && ev->last) {
        struct pd_xfer_notice n = {.first_token = ev->token,
                                   .first_logprob = ev->logprob,
                                   .cached_tokens = (uint32_t)ev->cached_tokens};
        /* the first token's top logprobs: only prefill saw its logits */
        const struct pd_sample *f = &ev->req->first;
        for (int k = 0; r && r->api.return_logprob && k < f->n_top && k < PD_XFER_NOTICE_TOP_MAX;
             k++) {
            n.top_ids[k] = f->top_ids[k];
            n.top_logprobs[k] = f->top_logprobs[k];
            n.n_top = (uint32_t)k + 1;
        }
        if (r)
            pd__timeline_prefill(d, r, ev->req->t_scheduled, now_s(), n.sender_us);
        rc = pd_xfer_room_finish(d->x, ev->room, &n);
        if (r) {
            /* prefill's TTFT: the first token is sampled and handed to the transfer engine */
            pd_metric_observe(d->sm->ttft, now_s() - r->t_start);
            r->cached_tokens = ev->cached_tokens;
            r->out_ids = pd_malloc(sizeof(int32_t));
            if (r->out_ids) {
                r->out_ids[0] = ev->token;
                r->n_out = 1;
                r->cap_out = 1;
            }
        }
    }
    if (rc) {
        pd_warn("room=%" PRIu64 " sending KV failed: %s", ev->room, pd_error_msg());
        pd_xfer_room_abort(d->x, ev->room, rc, "prefill could not send the KV cache");
    }
}

/* The decode tokenized the request too and states its prompt's length in the Transfer (0: a
 * decode that does not). Another count means the two daemons do not tokenize alike (another
 * tokenizer, BOS rule or chat template): the pages would not line up with the decode's tokens,
 * so the room fails, naming both counts, and both daemons go on serving. */
static bool prompt_len_agrees(struct pd_daemon_state *d, struct pd_daemon_req *r,
                              uint32_t prompt_len) {
    if (prompt_len == 0 || (uint32_t)r->n_prompt == prompt_len)
        return true;
    char msg[300];
    snprintf(msg, sizeof(msg),
             "prefill: the decode tokenized the prompt to %u tokens, this prefill to %d; both "
             "must load the same tokenizer and chat template",
             prompt_len, r->n_prompt);
    pd_warn("room=%" PRIu64 " %s", r->room, msg);
    snprintf(r->fail_msg, sizeof(r->fail_msg), "%s", msg); /* this daemon's own answer */
    pd_xfer_room_abort(d->x, r->room, PD_EMISMATCH, msg);
    pd_engine_submit(d->eng, &(struct pd_engine_cmd){.kind = PD_ENGINE_CMD_ABORT, .room = r->room});
    return false;
}

/* prefill: decode's Transfer for room arrived (the room is in the transfer engine) */
static void on_bootstrap_room(void *ctx, uint64_t room, const char *decode_id, uint32_t n_pages,
                              uint32_t held_pages, uint32_t prompt_len) {
    struct pd_daemon_state *d = ctx;
    struct pd_daemon_req *r = pd__daemon_find_room(room);
    pd_debug("room=%" PRIu64 " transfer from %s (%u pages, %u held there)", room, decode_id,
             n_pages, held_pages);
    if (r && !r->bootstrapped) {
        r->bootstrapped = true;
        if (!prompt_len_agrees(d, r, prompt_len))
            return;
        r->t_waiting = now_s();
        pd_engine_submit(d->eng, &(struct pd_engine_cmd){.kind = PD_ENGINE_CMD_BOOTSTRAPPED,
                                                         .room = room,
                                                         .held_pages = (int32_t)held_pages});
        return;
    }
    if (P.n_early == MAX_EARLY_ROOMS) {
        pd_xfer_room_abort(d->x, room, PD_EFULL, "prefill: too many rooms without a request");
        return;
    }
    P.early[P.n_early++] = (struct early_room){room, now_s(), (int32_t)held_pages, prompt_len};
}

static void on_bootstrap_abort(void *ctx, uint64_t room, bool found, const char *reason) {
    struct pd_daemon_state *d = ctx;
    (void)found;
    struct pd_daemon_req *r = pd__daemon_find_room(room);
    pd_info("room=%" PRIu64 " decode aborted it: %s", room, reason ? reason : "");
    if (r)
        pd_engine_submit(d->eng,
                         &(struct pd_engine_cmd){.kind = PD_ENGINE_CMD_ABORT, .room = room});
}

/* A request the engine took: its Transfer may have come first. */
static void prefill_submitted(struct pd_daemon_state *d, struct pd_daemon_req *r) {
    for (int i = 0; i < P.n_early; i++)
        if (P.early[i].room == r->room) {
            int32_t held = P.early[i].held_pages;
            uint32_t prompt_len = P.early[i].prompt_len;
            P.early[i] = P.early[--P.n_early];
            r->bootstrapped = true;
            r->t_waiting = now_s();
            if (!prompt_len_agrees(d, r, prompt_len))
                break;
            pd_engine_submit(d->eng, &(struct pd_engine_cmd){.kind = PD_ENGINE_CMD_BOOTSTRAPPED,
                                                             .room = r->room,
                                                             .held_pages = held});
            break;
        }
}

/* Transfers whose body never came, past --bootstrap-timeout. */
static void prefill_tick(struct pd_daemon_state *d, double now) {
    for (int i = 0; i < P.n_early;) { /* Transfers whose body never came */
        if (now - P.early[i].t >= d->bootstrap_timeout) {
            uint64_t room = P.early[i].room;
            P.early[i] = P.early[--P.n_early];
            pd_info("room=%" PRIu64 " transfer without a request timed out", room);
            if (pd_xfer_room_live(d->x, room))
                pd_xfer_room_abort(d->x, room, PD_ETIMEDOUT,
                                   "prefill: no request arrived for this room (bootstrap timeout)");
            continue;
        }
        i++;
    }
}

/* The status a room's abort sends decode in its notice: PD_ECANCELED only when the request's
 * user aborted it (decode then counts its half as aborted, not failed); a prefill that gives a
 * request up for its own reasons sends a failure. */
static int abort_status(const struct pd_daemon_req *r) {
    return r && r->aborted ? PD_ECANCELED : PD_EPEER;
}

static void prefill_aborting(struct pd_daemon_state *d, struct pd_daemon_req *r) {
    if (pd_xfer_room_live(d->x, r->room))
        pd_xfer_room_abort(d->x, r->room, abort_status(r),
                           r->aborted ? "the prefill request was aborted"
                                      : "the prefill request was given up");
}

/* QUIESCE: sent pages may still be read: the room is aborted, whose end releases them. */
static void prefill_quiesce(struct pd_daemon_state *d, struct pd_daemon_req *r,
                            const struct pd_engine_event *ev) {
    if (pd_xfer_room_live(d->x, ev->room))
        pd_xfer_room_abort(d->x, ev->room, abort_status(r), "prefill aborted the request");
}

static void prefill_ending(struct pd_daemon_state *d, struct pd_daemon_req *r,
                           const struct pd_engine_event *ev, int reason) {
    if (pd_xfer_room_live(d->x, r->room))
        pd_xfer_room_abort(d->x, r->room, reason == PD_END_TIMEOUT ? PD_ETIMEDOUT : abort_status(r),
                           "prefill request ended");
    r->cached_tokens = ev->cached_tokens;
    if (reason == PD_END_DONE)
        r->finish = PD_API_FINISH_LENGTH; /* the prefill's answer: its one token */
    if (reason == PD_END_TIMEOUT)
        r->bootstrap_failed = true; /* no decode sent the Transfer */
}

static void prefill_room_end(struct pd_daemon_state *d, struct pd_daemon_req *r, uint64_t room,
                             int status, const struct pd_xfer_notice *n) {
    if (!r) {
        for (int i = 0; i < P.n_early; i++) /* a Transfer whose body never came */
            if (P.early[i].room == room)
                P.early[i] = P.early[--P.n_early];
        return;
    }
    pd_engine_submit(d->eng, &(struct pd_engine_cmd){
                                 .kind = PD_ENGINE_CMD_XFER_END, .room = room, .status = status});
}

static void prefill_peer_closed(struct pd_daemon_state *d, pd_xfer_peer_t *p) {
    if (P.server)
        pd_bootstrap_server_peer_closed(P.server, p);
}

static void prefill_xfer_call(struct pd_daemon_state *d, pd_xfer_peer_t *p,
                              const struct pd_xfer_ctl *call) {
    (void)d;
    if (P.server) {
        pd_bootstrap_server_call(P.server, p, call);
    } else if (pd_xfer_answer(p, call->call_id, PD_EUNSUPPORTED, "the bootstrap server is down",
                              NULL, 0)) {
        pd_warn("xfer: %s", pd_error_msg());
    }
}

/* The transfer engine, then the bootstrap server decode daemons pair with. */
static int prefill_start(struct pd_daemon_state *d) {
    int rc = pd__daemon_start_transfer(d);
    if (rc)
        return rc;
    char addr[300];
    pd__daemon_host_port(addr, sizeof(addr), d->args.host, d->args.disaggregation_bootstrap_port);
    struct pd_bootstrap_server_config sc = {.addr = addr,
                                            .key = d->key,
                                            .key_len = d->key_len,
                                            .layout = d->layout,
                                            .prefill_id = d->node_id};
    struct pd_bootstrap_server_callbacks scb = {
        .ctx = d, .on_room = on_bootstrap_room, .on_abort = on_bootstrap_abort};
    /* with a certificate the bootstrap port is TLS too (the files were checked at start) */
    struct pd_grpc_tls tls = {0};
    char *cert = NULL, *key = NULL;
    if (pd_tls_flags_serving(&d->tls)) {
        if ((rc = pd_tls_pem_read("--ssl-certfile", d->tls.certfile, &cert)) ||
            (rc = pd_tls_pem_read("--ssl-keyfile", d->tls.keyfile, &key)))
            goto out;
        tls = (struct pd_grpc_tls){.cert_chain = cert, .private_key = key};
        sc.tls = &tls;
    }
    if ((rc = pd_bootstrap_server_new(d->bridge, d->x, &sc, &scb, &P.server)) != PD_OK)
        pd_error_wrap(rc, "bootstrap server on %s", addr);
out:
    pd_free(key); /* gRPC keeps copies of its own */
    pd_free(cert);
    return rc;
}

static void prefill_stop(struct pd_daemon_state *d) {
    pd_bootstrap_server_free(P.server);
    P.server = NULL;
    P.n_early = 0;
}

static void prefill_ready(struct pd_daemon_state *d) {
    struct pd_server_args *a = &d->args;
    printf("pdserve-prefill: READY http=%s:%d bootstrap_port=%d pages=%d transport=%s\n", a->host,
           pd_http_server_port(d->http), a->disaggregation_bootstrap_port, d->info.n_pages,
           d->transport);
}

static int prefill_prepare(struct pd_daemon_state *d, struct pd_daemon_req *r,
                           struct pd_api_error *e) {
    return pd__daemon_prepare_input_logprobs(r, e);
}

static void prefill_server_info(struct pd_daemon_state *d, const struct pd_engine_stats *s,
                                struct cJSON *extra, struct cJSON *q) {
    cJSON_AddBoolToObject(extra, "eager_prefill", d->eager_prefill);
    cJSON_AddNumberToObject(q, "bootstrap", s->q_bootstrap);
    cJSON_AddNumberToObject(q, "waiting", s->q_waiting);
    cJSON_AddNumberToObject(q, "inflight", s->q_inflight);
}

/* Running: KV transfers in flight; waiting: bootstrap + waiting queues. */
static void prefill_load(const struct pd_engine_stats *s, int32_t *running, int32_t *waiting) {
    *running = s->q_inflight;
    *waiting = s->q_bootstrap + s->q_waiting;
}

static double q_bootstrap(const struct pd_engine_stats *s) {
    return s->q_bootstrap;
}
static double q_inflight(const struct pd_engine_stats *s) {
    return s->q_inflight;
}

static const struct pd_serve_metrics_series prefill_series[] = {
    {PD_METRIC_GAUGE, "sglang:num_prefill_prealloc_queue_reqs",
     "The number of requests in the prefill prealloc queue (in pdserve, the bootstrap queue).",
     q_bootstrap},
    {PD_METRIC_GAUGE, "pdserve_num_bootstrap_queue_reqs",
     "Prefill requests waiting for their decode's Transfer (destination pages).", q_bootstrap},
    {PD_METRIC_GAUGE, "sglang:num_prefill_inflight_queue_reqs",
     "The number of requests in the prefill inflight queue (KV transfers posted).", q_inflight},
};

const struct pd_serve_metrics_role pd_prefill_metrics = {
    .running_help = "The number of running requests (prefill: KV transfers in flight).",
    .queue_help = "The number of requests in the waiting queue (bootstrap + waiting).",
    .load = prefill_load,
    .kv_bytes_help = "KV cache bytes sent to decode daemons (completed transfers).",
    .kv_latency_help = "KV transfer latency: first pages posted to done notice sent.",
    .itl = false,
    .n_series = PD_ARRAY_LEN(prefill_series),
    .series = prefill_series,
};

static void prefill_flags(struct pd_flagset *fs, struct pd_daemon_state *d) {
    d->eager_prefill = true;
    pd_flag_bool(fs, "--eager-prefill", &d->eager_prefill,
                 "compute a prompt as soon as its request is here, in arrival order, before its "
                 "decode's Transfer (the destination pages) comes; its pages go out when it does. "
                 "Takes the decode's admission and the Transfer's way off the first token's path. "
                 "=false: wait for the Transfer first (SGLang's order); where prefill and decode "
                 "share a few cores, the decode's admission then no longer takes them from the "
                 "prefill's pass, which measured faster on 2 cores [default: true]");
}

static const struct pd_role *prefill_configure(struct pd_daemon_state *d) {
    if (d->args.disaggregation_mode != PD_DISAGG_PREFILL) {
        fprintf(stderr, "%s: --disaggregation-mode must be prefill for this daemon\n",
                pd_prefill_role.prog);
        return NULL;
    }
    return &pd_prefill_role;
}

const struct pd_role pd_prefill_role = {
    .name = "prefill",
    .prog = "pdserve-prefill",
    .about = "The prefill daemon of prefill/decode disaggregation: computes prompts in "
             "page-aligned chunks and writes their KV cache into pages a decode daemon reserved "
             "(UCX), pairing through its gRPC bootstrap port. Serves the SGLang/OpenAI HTTP "
             "API; generation bodies must carry bootstrap_host/bootstrap_port/bootstrap_room.",
    .disaggregation_mode = PD_DISAGG_PREFILL,
    .ops = &pd_engine_prefill_ops,
    .disaggregated = true,
    .encodes_images = true,
    .timeout_msg = "bootstrap timed out: no decode asked for this room's KV cache within "
                   "--bootstrap-timeout",
    .flags = prefill_flags,
    .configure = prefill_configure,
    .start = prefill_start,
    .ready = prefill_ready,
    .stop = prefill_stop,
    .tick = prefill_tick,
    .prepare = prefill_prepare,
    .submitted = prefill_submitted,
    .aborting = prefill_aborting,
    .on_send = prefill_send,
    .on_quiesce = prefill_quiesce,
    .ending = prefill_ending,
    .room_end = prefill_room_end,
    .peer_closed = prefill_peer_closed,
    .xfer_call = prefill_xfer_call,
    .server_info = prefill_server_info,
    .metrics = &pd_prefill_metrics,
};
