/*
 * role.c — the decode daemon's roles (common/daemon_internal.h's struct pd_role).
 *
 * decode (--disaggregation-mode decode): a request's prompt pages are reserved by the compute
 * thread (decode/engine_decode.c: prealloc → transfer → running), the bootstrap client of its
 * prefill (bootstrap_host:bootstrap_port) sends the Transfer naming them, the receiver's done
 * notice streams the first token, and the rest is generated here in continuous batches. A body
 * without bootstrap fields (--local-prefill, on by default: the router's short prompts) gets a
 * room drawn here and is prefilled by the compute thread itself, no prefill involved.
 * colocated (--disaggregation-mode null): no transfer engine and no bootstrap; rooms are drawn
 * here and the compute thread (decode/engine_coloc.c) prefills and decodes in mixed steps.
 * Both detokenize and stream the output.
 */
#include "decode/role.h"

#include "common/daemon_internal.h"
#include "decode/bootstrap_client.h"
#include "decode/engine_decode.h"

#include "common/base/alloc.h"
#include "common/base/log.h"
#include "common/base/rng.h"
#include "common/base/status.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#define MAX_CLIENTS 64 /* distinct prefills one decode talks to */

struct client_slot {
    char target[300];
    pd_bootstrap_client_t *c;
};

/* The decode role's own state (the loop thread's): one bootstrap client per prefill, whether
 * they speak TLS (--ssl-ca-certs or a certificate of our own) with the CAs' PEM text, and the
 * mixed-chunk flags as given (colocated only). */
static struct {
    struct client_slot clients[MAX_CLIENTS];
    int n;
    bool tls;
    char *ca_pem; /* NULL: gRPC's default roots */
    struct pd_flag *f_mixed, *f_unmixed, *f_local;
} C;

/* The prefill refused the Transfer (bad layout, unknown room, its queue full). */
static void on_room_rejected(void *ctx, uint64_t room, void *user, int status, const char *msg) {
    struct pd_daemon_state *d = ctx;
    (void)user;
    struct pd_daemon_req *r = pd__daemon_find_room(room);
    if (!r)
        return;
    r->xfer_live = false;
    r->bootstrap_failed = true;
    if (!r->xfer_failed) {
        r->xfer_failed = true;
        pd_metric_add(d->sm->kv_fail[PD_KV_FAIL_REJECTED], 1);
    }
    snprintf(r->fail_msg, sizeof(r->fail_msg), "%s", msg ? msg : pd_status_str(status));
    pd_warn("room=%" PRIu64 " the prefill refused the transfer: %s", room, r->fail_msg);
    pd_engine_submit(d->eng, &(struct pd_engine_cmd){
                                 .kind = PD_ENGINE_CMD_XFER_END, .room = room, .status = status});
}

/* The bootstrap client of the prefill at host:port (made on first use). */
static pd_bootstrap_client_t *client_for(struct pd_daemon_state *d, const char *host, int port) {
    char target[300];
    pd__daemon_host_port(target, sizeof(target), host && *host ? host : "127.0.0.1", port);
    for (int i = 0; i < C.n; i++)
        if (strcmp(C.clients[i].target, target) == 0)
            return C.clients[i].c;
    if (C.n == MAX_CLIENTS) {
        pd_errorf(PD_EFULL, "decode talks to %d prefills already", MAX_CLIENTS);
        return NULL;
    }
    struct pd_bootstrap_client_config cc = {.target = target,
                                            .key = d->key,
                                            .key_len = d->key_len,
                                            .layout = d->layout,
                                            .decode_id = d->node_id};
    struct pd_grpc_tls tls = {.root_certs = C.ca_pem};
    if (C.tls)
        cc.tls = &tls;
    struct pd_bootstrap_client_callbacks cb = {.ctx = d, .on_room_rejected = on_room_rejected};
    pd_bootstrap_client_t *c;
    if (pd_bootstrap_client_new(d->bridge, d->x, &cc, &cb, &c) != PD_OK)
        return NULL;
    struct client_slot *s = &C.clients[C.n++];
    snprintf(s->target, sizeof(s->target), "%s", target);
    s->c = c;
    return c;
}

/* ADMIT: the prompt's pages are reserved; the Transfer asks the request's prefill to fill them. */
static void decode_admit(struct pd_daemon_state *d, struct pd_daemon_req *r,
                         const struct pd_engine_event *ev) {
    pd_bootstrap_client_t *c = client_for(d, r->api.bootstrap_host, r->api.bootstrap_port);
    /* before the call: the prefill may have it (and start its part of the hand-over) before
     * this thread runs again, and its spans must fall inside Transfer sent → KV complete */
    r->t_xfer = now_s();
    int32_t held = ev->req->held_pages; /* decode's own prefix cache has them */
    int rc = c ? pd_bootstrap_client_transfer(c, r->room, ev->req->pages + held,
                                              (uint32_t)(ev->req->n_pages - held), (uint32_t)held,
                                              (uint32_t)r->n_prompt, NULL)
               : PD_EINVAL;
    if (rc) {
        r->bootstrap_failed = true;
        snprintf(r->fail_msg, sizeof(r->fail_msg), "%s", pd_error_msg());
        pd_engine_submit(
            d->eng,
            &(struct pd_engine_cmd){.kind = PD_ENGINE_CMD_XFER_END, .room = r->room, .status = rc});
        return;
    }
    r->client = c;
    r->xfer_live = true;
    /* what the transfer moves: every prompt page decode does not hold, whole (DESIGN §2) */
    r->xfer_bytes = (double)((r->n_prompt + d->info.page_size - 1) / d->info.page_size - held) *
                    (double)d->info.page_bytes;
}

/* The room ended: the done notice streams the first token now, or the failure is kept for the
 * answer; the engine hears it as XFER_END (and ends a room it gave up meanwhile as given up). */
static void decode_room_end(struct pd_daemon_state *d, struct pd_daemon_req *r, uint64_t room,
                            int status, const struct pd_xfer_notice *n) {
    if (!r)
        return;
    struct pd_engine_cmd c = {.kind = PD_ENGINE_CMD_XFER_END, .room = room, .status = status};
    r->xfer_live = false;
    if (n) {
        c.status = n->status;
        c.first_token = n->first_token;
        c.first_logprob = n->first_logprob;
        if (n->status == PD_OK && !r->given_up) {
            r->cached_tokens = (int)n->cached_tokens;
            pd__timeline_decode_kv(r, n, now_s());
            /* stream the first token now; the engine's TOKEN 0 is then ignored */
            struct pd_sample s = {.token = n->first_token, .logprob = n->first_logprob};
            for (uint32_t k = 0; k < n->n_top && k < PD_SAMPLING_MAX_LOGPROBS; k++) {
                s.top_ids[k] = n->top_ids[k];
                s.top_logprobs[k] = n->top_logprobs[k];
                s.n_top = (int)k + 1;
            }
            pd__daemon_take_token(r, n->first_token, 0, PD_FINISH_NONE, n->first_logprob, &s);
        } else if (n->status != PD_OK) {
            snprintf(r->fail_msg, sizeof(r->fail_msg), "%s", n->error);
            /* the prefill sends ECANCELED only for its user's abort (prefill/role.c) */
            r->peer_aborted = n->status == PD_ECANCELED;
        } /* else the whole KV came after the room was given up: it ends as what it was given
             up for (the engine's END says which), and its first token is not streamed */
    } else if (status != PD_OK && !r->fail_msg[0]) {
        snprintf(r->fail_msg, sizeof(r->fail_msg), "%s", pd_status_str(status));
    }
    pd_engine_submit(d->eng, &c);
}

/* QUIESCE (timed out waiting for its KV, or aborted in transfer): the room is given up with the
 * prefill; without a live transfer, the engine hears the end at once. */
static void decode_quiesce(struct pd_daemon_state *d, struct pd_daemon_req *r,
                           const struct pd_engine_event *ev) {
    if (r)
        r->given_up = true;
    if (r && r->xfer_live && r->client) {
        pd_bootstrap_client_abort(r->client, ev->room, r->aborted ? "aborted" : "timed out");
        return;
    }
    pd_engine_submit(d->eng, &(struct pd_engine_cmd){.kind = PD_ENGINE_CMD_XFER_END,
                                                     .room = ev->room,
                                                     .status = PD_ECANCELED});
}

static void decode_peer_closed(struct pd_daemon_state *d, pd_xfer_peer_t *p) {
    for (int i = 0; i < C.n; i++)
        pd_bootstrap_client_peer_closed(C.clients[i].c, p);
}

static int decode_start(struct pd_daemon_state *d) {
    C.tls = d->tls.ca_certs || pd_tls_flags_serving(&d->tls);
    if (d->tls.ca_certs) {
        int rc = pd_tls_pem_read("--ssl-ca-certs", d->tls.ca_certs, &C.ca_pem);
        if (rc)
            return rc;
    }
    if (C.tls)
        pd_info("bootstrap: calling prefills over TLS (their certificates checked against %s)",
                d->tls.ca_certs ? d->tls.ca_certs : "the system's roots");
    return pd__daemon_start_transfer(d);
}

static void decode_stop(struct pd_daemon_state *d) {
    for (int i = 0; i < C.n; i++)
        pd_bootstrap_client_free(C.clients[i].c);
    C.n = 0;
    pd_free(C.ca_pem);
    C.ca_pem = NULL;
}

static void decode_ready(struct pd_daemon_state *d) {
    printf("pdserve-decode: READY http=%s:%d pages=%d transport=%s\n", d->args.host,
           pd_http_server_port(d->http), d->info.n_pages, d->transport);
}

/* What generating needs: the detokenizer, the echoed prompt, output logprobs. */
static int decode_prepare(struct pd_daemon_state *d, struct pd_daemon_req *r,
                          struct pd_api_error *e) {
    if (pd_detok_new(d->tok, r->api.skip_special_tokens, &r->detok) != PD_OK) {
        pd_api_error_set(e, 500, "server_error", NULL, NULL, "%s", pd_error_msg());
        return PD_ENOMEM;
    }
    if (r->api.echo) { /* the prompt as sent, or its ids' text */
        char *t = NULL;
        size_t tl = 0;
        int rc = r->api.text
                     ? pd__daemon_append_text(r, r->api.text, r->api.text_len)
                     : pd_tokenizer_decode(d->tok, r->api.input_ids, (size_t)r->api.n_input_ids,
                                           r->api.skip_special_tokens, &t, &tl);
        if (rc == PD_OK && t)
            rc = pd__daemon_append_text(r, t, tl);
        pd_free(t);
        if (rc) {
            pd_api_error_set(e, 500, "server_error", NULL, NULL, "echo: %s", pd_error_msg());
            return rc;
        }
        r->echo_len = r->text_len;
    }
    if (r->api.return_logprob) {
        size_t n = (size_t)r->api.sampling.max_new_tokens;
        r->lps = pd_calloc(n, sizeof(*r->lps));
        r->ereq->samples = pd_calloc(n, sizeof(*r->ereq->samples));
        if (!r->lps || !r->ereq->samples) {
            pd_api_error_set(e, 500, "server_error", NULL, NULL, "out of memory for %zu logprobs",
                             n);
            return PD_ENOMEM;
        }
    }
    return PD_OK;
}

static uint64_t coloc_room(struct pd_daemon_state *d, struct pd_daemon_req *r);

/* The body's bootstrap_room; a local request (none given, --local-prefill) a fresh one. */
static uint64_t decode_room(struct pd_daemon_state *d, struct pd_daemon_req *r) {
    return r->api.has_bootstrap_room ? r->api.bootstrap_room : coloc_room(d, r);
}

/* A local request (--local-prefill) is prefilled here: the engine is told so, and the prompt's
 * logprobs, which a prefill would have scored, are scored here too. */
static int decode_pd_prepare(struct pd_daemon_state *d, struct pd_daemon_req *r,
                             struct pd_api_error *e) {
    int rc = decode_prepare(d, r, e);
    if (rc || r->api.has_bootstrap_room)
        return rc;
    if (r->api.n_images > 0) { /* the vision encoder runs on the prefill, not here */
        pd_api_error_set(e, 400, "invalid_request_error", "bootstrap_room", NULL,
                         "a prompt with images is prefilled by a prefill daemon (its vision "
                         "encoder): send it with bootstrap fields (through pdserve-router)");
        return PD_EINVAL;
    }
    r->ereq->local_prefill = true;
    return pd__daemon_prepare_input_logprobs(r, e);
}

static void decode_server_info(struct pd_daemon_state *d, const struct pd_engine_stats *s,
                               struct cJSON *extra, struct cJSON *q) {
    cJSON_AddNumberToObject(q, "prealloc", s->q_prealloc);
    cJSON_AddNumberToObject(q, "transfer", s->q_transfer);
    cJSON_AddNumberToObject(q, "running", s->q_running);
    cJSON_AddNumberToObject(q, "retractions", (double)s->retractions);
    cJSON_AddBoolToObject(extra, "local_prefill", d->local_prefill);
    cJSON_AddNumberToObject(extra, "local_prefills", (double)s->local_prefills);
    cJSON_AddNumberToObject(extra, "prefix_held_tokens", (double)s->held_tokens);
    /* where output tokens were chosen (greedy_on_device) */
    cJSON_AddNumberToObject(extra, "sampled_on_device", (double)s->sampled_on_device);
    cJSON_AddNumberToObject(extra, "sampled_on_host", (double)s->sampled_on_host);
}

/* Running: the running batch; waiting: prealloc + transfer (colocated: waiting). */
static void decode_load(const struct pd_engine_stats *s, int32_t *running, int32_t *waiting) {
    *running = s->q_running;
    *waiting = s->q_prealloc + s->q_transfer + s->q_waiting;
}

static double q_prealloc(const struct pd_engine_stats *s) {
    return s->q_prealloc;
}
static double q_transfer(const struct pd_engine_stats *s) {
    return s->q_transfer;
}
static double retractions(const struct pd_engine_stats *s) {
    return (double)s->retractions;
}
static double local_prefills(const struct pd_engine_stats *s) {
    return (double)s->local_prefills;
}
static double held_tokens(const struct pd_engine_stats *s) {
    return (double)s->held_tokens;
}

static const struct pd_serve_metrics_series decode_series[] = {
    {PD_METRIC_GAUGE, "sglang:num_decode_prealloc_queue_reqs",
     "The number of requests in the decode prealloc queue (waiting for KV pages).", q_prealloc},
    {PD_METRIC_GAUGE, "sglang:num_decode_transfer_queue_reqs",
     "The number of requests in the decode transfer queue (waiting for the KV cache).", q_transfer},
    {PD_METRIC_COUNTER, "sglang:num_retracted_requests_total",
     "Total number of retracted requests (recomputed locally).", retractions},
    {PD_METRIC_COUNTER, "pdserve_local_prefill_requests_total",
     "Requests this decode prefilled itself (no bootstrap fields, --local-prefill).",
     local_prefills},
    {PD_METRIC_COUNTER, "pdserve_decode_prefix_cache_hit_tokens_total",
     "Prompt tokens whose KV this decode's own prefix cache already held (not transferred, not "
     "computed here).",
     held_tokens},
};

/* The decode's series, which the colocated mode exports too (its prealloc and transfer queues
 * stay 0). */
const struct pd_serve_metrics_role pd_decode_metrics = {
    .running_help = "The number of running requests (decode: in the running batch).",
    .queue_help = "The number of requests in the waiting queue (prealloc + transfer).",
    .load = decode_load,
    .kv_bytes_help = "KV cache bytes received from prefill daemons (completed transfers).",
    .kv_latency_help = "KV transfer latency: Transfer sent to done notice received.",
    .itl = true,
    .n_series = PD_ARRAY_LEN(decode_series),
    .series = decode_series,
};

/* ---- colocated ---- */

/* Colocated: a fresh room in [0, 2^63) no live request has (bootstrap_room in a body is not
 * ours to trust: two clients could send the same one). */
static uint64_t coloc_room(struct pd_daemon_state *d, struct pd_daemon_req *r) {
    uint64_t room;
    do
        room = pd_splitmix64(&d->room_seq) >> 1;
    while (pd__daemon_find_room(room));
    return room;
}

static int coloc_prepare(struct pd_daemon_state *d, struct pd_daemon_req *r,
                         struct pd_api_error *e) {
    int rc = decode_prepare(d, r, e);
    return rc ? rc : pd__daemon_prepare_input_logprobs(r, e);
}

static void coloc_ending(struct pd_daemon_state *d, struct pd_daemon_req *r,
                         const struct pd_engine_event *ev, int reason) {
    r->cached_tokens = ev->cached_tokens; /* prefilled here: the engine knows the hit */
}

/* A prompt prefilled here: usage's cached_tokens is what decode's own prefix cache held (a
 * remote one's came with its done notice). */
static void decode_ending(struct pd_daemon_state *d, struct pd_daemon_req *r,
                          const struct pd_engine_event *ev, int reason) {
    (void)d;
    (void)reason;
    if (!r->api.has_bootstrap_room)
        r->cached_tokens = ev->cached_tokens;
}

static void coloc_ready(struct pd_daemon_state *d) {
    printf("pdserve-decode: READY http=%s:%d pages=%d disaggregation_mode=null mixed_chunk=%d\n",
           d->args.host, pd_http_server_port(d->http), d->info.n_pages, (int)d->mixed_chunk);
}

static void coloc_server_info(struct pd_daemon_state *d, const struct pd_engine_stats *s,
                              struct cJSON *extra, struct cJSON *q) {
    cJSON_AddNumberToObject(q, "waiting", s->q_waiting);
    cJSON_AddNumberToObject(q, "running", s->q_running);
    cJSON_AddNumberToObject(q, "retractions", (double)s->retractions);
    cJSON_AddBoolToObject(extra, "enable_mixed_chunk", d->mixed_chunk);
    cJSON_AddNumberToObject(extra, "steps", (double)s->steps);
    cJSON_AddNumberToObject(extra, "mixed_steps", (double)s->mixed_steps);
    cJSON_AddNumberToObject(extra, "sampled_on_device", (double)s->sampled_on_device);
    cJSON_AddNumberToObject(extra, "sampled_on_host", (double)s->sampled_on_host);
}

static const struct pd_role coloc_role = {
    .name = "colocated",
    .prog = "pdserve-decode",
    .ops = &pd_engine_coloc_ops,
    .disaggregated = false,
    .encodes_images = true,
    .timeout_msg = "request timed out",
    .ready = coloc_ready,
    .room = coloc_room,
    .prepare = coloc_prepare,
    .on_quiesce = decode_quiesce,
    .ending = coloc_ending,
    .server_info = coloc_server_info,
    .metrics = &pd_decode_metrics,
};

/* ---- flags ---- */

static void decode_flags(struct pd_flagset *fs, struct pd_daemon_state *d) {
    d->mixed_chunk = true; /* null mode is the mixed-chunk baseline (SGLang's default: off) */
    C.f_mixed = pd_flag_bool(fs, "--enable-mixed-chunk", &d->mixed_chunk,
                             "--disaggregation-mode null: run prefill chunks and the running "
                             "requests' decode tokens in one forward step (SGLang's flag; on by "
                             "default here, =false turns it off)");
    C.f_unmixed = pd_flag_bool(fs, "--disable-mixed-chunk", &d->disable_mixed_flag,
                               "--disaggregation-mode null: a step is a prefill batch when one "
                               "can be built, else a decode batch (SGLang without "
                               "--enable-mixed-chunk)");
    d->local_prefill = true;
    C.f_local = pd_flag_bool(
        fs, "--local-prefill", &d->local_prefill,
        "--disaggregation-mode decode: also take generation bodies without bootstrap fields and "
        "prefill them here (pdserve-router's --local-prefill-max-tokens sends short prompts "
        "this way: no prefill, no KV transfer) [default: true]; =false: refuse them with 400, "
        "as SGLang's decode does");
    pd_flag_double(fs, "--schedule-conservativeness", &d->conservativeness, "F", 0.001, 100,
                   "scales the output reservation at admission: new_token_ratio starts at "
                   "0.7 x F (at most 1); lower admits more requests and retracts sooner");
}

/* decode, or colocated with --disaggregation-mode null. */
static const struct pd_role *decode_configure(struct pd_daemon_state *d) {
    const char *prog = pd_decode_role.prog;
    bool coloc = d->args.disaggregation_mode == PD_DISAGG_NULL;
    if (!coloc && d->args.disaggregation_mode != PD_DISAGG_DECODE) {
        fprintf(stderr,
                "%s: --disaggregation-mode must be decode (or null: colocated) for this "
                "daemon\n",
                prog);
        return NULL;
    }
    bool mixed_given = C.f_mixed->seen, unmixed_given = C.f_unmixed->seen;
    if (mixed_given && d->mixed_chunk && d->disable_mixed_flag) {
        fprintf(stderr,
                "%s: --enable-mixed-chunk and --disable-mixed-chunk contradict each other\n", prog);
        return NULL;
    }
    if (!coloc && (mixed_given || unmixed_given)) {
        fprintf(stderr,
                "%s: --enable-mixed-chunk / --disable-mixed-chunk apply to --disaggregation-mode "
                "null only (a disaggregated decode daemon runs no prefill to mix)\n",
                prog);
        return NULL;
    }
    if (d->disable_mixed_flag)
        d->mixed_chunk = false;
    if (coloc && C.f_local->seen) {
        fprintf(stderr,
                "%s: --local-prefill applies to --disaggregation-mode decode (a colocated daemon "
                "prefills every request itself)\n",
                prog);
        return NULL;
    }
    if (coloc)
        d->local_prefill = false; /* bodies without bootstrap fields are its normal ones */
    return coloc ? &coloc_role : &pd_decode_role;
}

const struct pd_role pd_decode_role = {
    .name = "decode",
    .prog = "pdserve-decode",
    .about = "The decode daemon of prefill/decode disaggregation: reserves KV pages for each "
             "request, asks the prefill at bootstrap_host:bootstrap_port to fill them, then "
             "generates the answer in continuous batches and streams it. Serves the "
             "SGLang/OpenAI HTTP API; a generation body without the bootstrap fields is "
             "prefilled here (--local-prefill). "
             "With --disaggregation-mode null it serves alone (colocated): it prefills prompts "
             "itself in chunks of --chunked-prefill-size, mixed with the running requests' "
             "decode tokens in one forward step, and takes plain requests (no bootstrap fields; "
             "any given are ignored).",
    .disaggregation_mode = PD_DISAGG_DECODE,
    .ops = &pd_engine_decode_ops,
    .disaggregated = true,
    .timeout_msg = "timed out waiting for the prefill's KV cache (--waiting-timeout)",
    .flags = decode_flags,
    .configure = decode_configure,
    .start = decode_start,
    .ready = decode_ready,
    .stop = decode_stop,
    .room = decode_room,
    .prepare = decode_pd_prepare,
    .ending = decode_ending,
    .on_admit = decode_admit,
    .on_quiesce = decode_quiesce,
    .room_end = decode_room_end,
    .peer_closed = decode_peer_closed,
    .server_info = decode_server_info,
    .metrics = &pd_decode_metrics,
};
