/*
 * daemon.c — the body of pdserve-prefill and pdserve-decode: the loop thread of DESIGN.md §2a.
 * It owns the HTTP server, the transfer engine and the request table; the compute thread
 * (common/engine.c) owns the model and the scheduler. A daemon request (struct pd_daemon_req)
 * lives from its HTTP body until the engine's END (or its refusal before ADD); the HTTP side may
 * go earlier (client gone). Nothing here blocks or computes beyond tokenizing a prompt and
 * detokenizing tokens. What differs by role (the bootstrap server or clients, what an engine
 * event means, the role's flags and queues) is the role's, reached through struct pd_role
 * (daemon_internal.h): prefill/role.c, decode/role.c. The generation endpoints are here with the
 * request life they start; the other endpoints are daemon_http.c's.
 */
#include "common/daemon.h"
#include "common/daemon_internal.h"

#include "common/base/alloc.h"
#include "common/api.h"
#include "model/backend.h"
#include "common/bootstrap.h"
#include "model/jinja/chat_template.h"
#include "model/devmem.h"
#include "common/server_args.h"
#include "common/grpc_bridge.h"
#include "common/base/http_server.h"
#include "common/base/log.h"
#include "common/base/rng.h"
#include "common/base/room_table.h"
#include "common/sched_common.h"
#include "common/serve_metrics.h"
#include "common/base/status.h"
#include "common/base/tls.h"
#include "model/tokenizer/tokenizer.h"
#include "common/xfer.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static struct pd_daemon_state D;

static const char *role_name(void) {
    return D.role->name;
}

/* ---- request table ---- */

struct pd_daemon_req *pd__daemon_find_room(uint64_t room) {
    int32_t s = pd_room_table_get(&D.slots, room);
    return s >= 0 ? D.reqs[s] : NULL;
}

struct pd_daemon_req *pd__daemon_find_rid(const char *rid) {
    for (int32_t i = 0; i < D.cap; i++)
        if (D.reqs[i] && strcmp(D.reqs[i]->rid, rid) == 0)
            return D.reqs[i];
    return NULL;
}

static void group_free(struct pd_daemon_group *g);

static void req_free(struct pd_daemon_req *r) {
    if (!r)
        return;
    if (r->grp) {
        r->grp->subs[r->sub] = NULL;
        if (--r->grp->refs == 0)
            group_free(r->grp);
    }
    if (r->slot >= 0) {
        pd_room_table_release(&D.slots, r->room, r->slot);
        D.reqs[r->slot] = NULL;
        D.n_live--;
    }
    pd_api_request_free(&r->api);
    pd_engine_req_free(r->ereq);
    pd_detok_free(r->detok);
    pd_free(r->out_ids);
    pd_free(r->lps);
    pd_free(r->text);
    pd_free(r);
}

static void fill_error(struct pd_api_error *e, int status, const char *msg) {
    pd_api_error_set(e, status, status >= 500 ? "server_error" : "invalid_request_error", NULL,
                     NULL, "%s", msg);
}

/* ---- decode output ---- */

int pd__daemon_append_text(struct pd_daemon_req *r, const char *s, size_t n) {
    if (pd_array_grow((void **)&r->text, &r->text_cap, r->text_len + n + 1, 1))
        return PD_ENOMEM;
    memcpy(r->text + r->text_len, s, n);
    r->text_len += n;
    r->text[r->text_len] = '\0';
    return PD_OK;
}

static size_t token_text(void *ud, int32_t id, char *buf, size_t cap) {
    (void)ud;
    char *t = NULL;
    size_t n = 0;
    if (pd_tokenizer_decode(D.tok, &id, 1, false, &t, &n) != PD_OK)
        return 0;
    if (cap)
        snprintf(buf, cap, "%s", t);
    pd_free(t);
    return n;
}

static void fill_result(struct pd_daemon_req *r, struct pd_api_result *res, const char *text,
                        size_t len) {
    memset(res, 0, sizeof(*res));
    res->id = r->id;
    res->model = D.args.served_model_name;
    res->created = r->created;
    res->text = text;
    res->text_len = len;
    res->output_ids = r->out_ids;
    res->n_output_ids = r->n_out;
    res->prompt_tokens = r->n_prompt;
    res->completion_tokens = r->n_out;
    res->cached_tokens = r->cached_tokens;
    res->finish = (enum pd_api_finish)r->finish;
    res->matched_token = r->matched_token;
    if (r->matched_stop >= 0) {
        res->matched_stop = r->api.stop[r->matched_stop];
        res->matched_stop_len = r->api.stop_len[r->matched_stop];
    }
    res->index = r->grp ? r->sub : 0;
    res->has_index = r->grp && r->grp->batch && r->streaming;
    res->e2e_latency = now_s() - r->t_start;
    res->token_text = token_text;
    if (r->lps) {
        res->logprobs = r->lps;
        res->n_logprobs = r->n_out;
        res->logprob_offset = (int)r->echo_len; /* completions: the output's text follows */
    }
    if (r->in_lp && r->in_lp_ready) {
        res->input_logprobs = r->in_lp;
        res->n_input_logprobs = r->n_in_lp;
    }
}

/* Renders one body of r's kind: final (stream false) or one stream chunk. */
static char *render(struct pd_daemon_req *r, const struct pd_api_result *res, bool chunk) {
    char *out = NULL;
    int rc;
    if (r->api.kind == PD_API_GENERATE)
        rc = pd_api_render_generate(&r->api, res, &out);
    else if (r->api.kind == PD_API_COMPLETIONS)
        rc = chunk ? pd_api_render_completion_chunk(&r->api, res, &out)
                   : pd_api_render_completion(&r->api, res, &out);
    else
        rc = chunk ? pd_api_render_chat_chunk(&r->api, res, !r->first_chunk_sent, &out)
                   : pd_api_render_chat(&r->api, res, &out);
    return rc == PD_OK ? out : NULL;
}

/* Streams what became final (held back: a tail that may still grow into a stop string). */
static void stream_progress(struct pd_daemon_req *r, bool final) {
    if (!r->http || !r->streaming)
        return;
    size_t hold = 0;
    if (!final)
        for (int i = 0; i < r->api.n_stop; i++) {
            size_t l = r->api.stop_len[i];
            if (l > hold + 1)
                hold = l - 1;
        }
    size_t upto = r->text_len > hold ? r->text_len - hold : 0;
    if (upto < r->sent_len)
        upto = r->sent_len;
    if (!final && upto == r->sent_len && r->api.kind != PD_API_GENERATE)
        return;
    struct pd_api_result res;
    if (r->api.kind == PD_API_GENERATE) {
        fill_result(r, &res, r->text ? r->text : "", upto);
    } else {
        fill_result(r, &res, r->text ? r->text + r->sent_len : "", upto - r->sent_len);
        if (r->lps) { /* the tokens since the last chunk */
            res.logprobs = r->lps + r->lp_sent;
            res.n_logprobs = r->n_out - r->lp_sent;
            res.logprob_offset = (int)(r->sent_len > r->echo_len ? r->sent_len : r->echo_len);
        }
        if (r->in_lp_sent) { /* the prompt's: once, with the echoed prompt */
            res.input_logprobs = NULL;
            res.n_input_logprobs = 0;
        }
        r->in_lp_sent = r->in_lp_sent || res.input_logprobs;
    }
    if (!final)
        res.finish = PD_API_FINISH_NONE;
    r->lp_sent = r->n_out;
    char *body = render(r, &res, true);
    if (body) {
        pd_http_sse_send(r->http, body, strlen(body));
        pd_free(body);
    }
    r->first_chunk_sent = true;
    r->sent_len = upto;
}

static void group_finish(struct pd_daemon_group *g);
static void group_fail(struct pd_daemon_group *g, int status, const char *msg);

/* A sub-request of a group answered: its body is kept (streams: its last chunk went out). */
static void group_sub_ok(struct pd_daemon_req *r) {
    struct pd_daemon_group *g = r->grp;
    if (r->streaming) {
        stream_progress(r, true);
        g->completion_tokens += r->n_out;
        if (r->sub % g->n == 0) {
            g->prompt_tokens += r->n_prompt;
            g->cached_tokens += r->cached_tokens;
        }
    } else {
        struct pd_api_result res;
        fill_result(r, &res, r->text ? r->text : "", r->text_len);
        if (!(g->bodies[r->sub] = render(r, &res, false))) {
            r->http = NULL;
            group_fail(g, 500, "out of memory rendering the response");
            return;
        }
    }
    r->http = NULL;
    if (++g->answered == g->count)
        group_finish(g);
}

static void finish_http_ok(struct pd_daemon_req *r) {
    struct pd_http_req *h = r->http;
    if (!h)
        return;
    if (r->grp) {
        group_sub_ok(r);
        return;
    }
    r->http = NULL;
    if (r->streaming) {
        r->http = h;
        stream_progress(r, true);
        r->http = NULL;
        if (r->api.include_usage && r->api.kind != PD_API_GENERATE) {
            struct pd_api_result res;
            fill_result(r, &res, "", 0);
            char *u = NULL;
            if (pd_api_render_usage_chunk(&r->api, &res, &u) == PD_OK) {
                pd_http_sse_send(h, u, strlen(u));
                pd_free(u);
            }
        }
        pd_http_sse_end(h);
        return;
    }
    struct pd_api_result res;
    fill_result(r, &res, r->text ? r->text : "", r->text_len);
    pd__daemon_respond_json(h, 200, render(r, &res, false));
}

static void finish_http_error(struct pd_daemon_req *r, int status, const char *msg) {
    struct pd_http_req *h = r->http;
    if (!h)
        return;
    r->http = NULL;
    if (r->grp) {
        char m[480];
        snprintf(m, sizeof(m), "sub-request %d (rid %s): %s", r->sub, r->rid, msg);
        group_fail(r->grp, status, m);
        return;
    }
    struct pd_api_error e;
    fill_error(&e, status, msg);
    if (r->streaming)
        pd_http_sse_fail(h, &e);
    else
        pd_http_respond_error(h, &e);
}

/* Decode: one more output token (index = its position in the output); smp: the engine's
 * record with top logprobs (for the first token: rebuilt from the done notice), or NULL. */
void pd__daemon_take_token(struct pd_daemon_req *r, int32_t token, int index, int finish,
                           float logprob, const struct pd_sample *smp) {
    if (r->stopped_here || index != r->n_out)
        return;            /* after a stop string, or the first token seen twice */
    r->in_lp_ready = true; /* colocated: the engine scored the prompt before this token */
    if (r->prompt_only) {  /* max_tokens 0: the token the engine must draw is not the output */
        r->finish = PD_API_FINISH_LENGTH;
        return;
    }
    if (r->lps && index < r->api.sampling.max_new_tokens)
        r->lps[index] = smp ? *smp : (struct pd_sample){.token = token, .logprob = logprob};
    if (pd_array_grow((void **)&r->out_ids, &r->cap_out, (size_t)r->n_out + 1, sizeof(int32_t)) ==
        PD_OK) {
        /* this token goes to the client's connection in this call (stream_progress below, or
         * held in the answer): TTFT / ITL end here */
        double now = now_s();
        if (r->n_out == 0) {
            pd_metric_observe(D.sm->ttft, now - r->t_start);
            pd__timeline_decode_first(&D, r, now);
        } else
            pd_metric_observe(D.sm->itl, now - r->t_last_token);
        r->t_last_token = now;
        r->out_ids[r->n_out++] = token;
    }
    const char *piece = NULL;
    size_t plen = 0;
    size_t before = r->text_len;
    if (r->detok && pd_detok_step(r->detok, token, &piece, &plen) == PD_OK && plen)
        pd__daemon_append_text(r, piece, plen);
    if (finish && r->detok && pd_detok_flush(r->detok, &piece, &plen) == PD_OK && plen)
        pd__daemon_append_text(r, piece, plen);
    if (finish == PD_FINISH_STOP)
        r->matched_token = token;
    if (finish)
        r->finish = finish == PD_FINISH_STOP ? PD_API_FINISH_STOP : PD_API_FINISH_LENGTH;
    /* stop strings: searched in the text that could contain a new match, once min_tokens are
     * out (as vLLM's and SGLang's stop checks start only then) */
    size_t at;
    int i = r->text && r->n_out >= r->api.min_tokens
                ? pd_api_find_stop(&r->api, r->text + r->echo_len, r->text_len - r->echo_len,
                                   before - r->echo_len, &at)
                : -1;
    if (i >= 0) {
        r->text_len = r->echo_len + at + (r->api.no_stop_trim ? r->api.stop_len[i] : 0);
        r->text[r->text_len] = '\0';
        if (r->sent_len > r->text_len)
            r->sent_len = r->text_len;
        r->finish = PD_API_FINISH_STOP;
        r->matched_stop = i;
        r->matched_token = -1;
        r->stopped_here = true;
        pd_engine_submit(D.eng,
                         &(struct pd_engine_cmd){.kind = PD_ENGINE_CMD_ABORT, .room = r->room});
    }
    if (!r->stopped_here && !finish)
        stream_progress(r, false);
}

/* ---- engine events ---- */

/* The request's end in the counters and the e2e / queue-time histograms. Prompt and output
 * tokens count for requests answered with a usage (done, or aborted by the user). */
static void count_end(struct pd_daemon_req *r, int reason, const struct pd_engine_event *ev) {
    struct pd_serve_metrics *sm = D.sm;
    double now = now_s();
    pd_metric_add(sm->num_requests, 1);
    pd_metric_observe(sm->e2e, now - r->t_start);
    double t_sched = ev->req ? ev->req->t_scheduled : 0;
    if (t_sched > 0)
        pd_metric_observe(sm->queue_time, t_sched > r->t_waiting ? t_sched - r->t_waiting : 0);
    bool answered = reason == PD_END_DONE || (reason == PD_END_ABORTED && r->aborted);
    if (answered) {
        pd_metric_add(sm->prompt_tokens, r->n_prompt);
        pd_metric_add(sm->generation_tokens, r->n_out);
        pd_metric_add(sm->cached_tokens, r->cached_tokens > 0 ? r->cached_tokens : 0);
    }
    if (reason == PD_END_DONE)
        return;
    if (reason == PD_END_ABORTED) {
        pd_metric_add(sm->num_aborted, 1);
        return;
    }
    pd_metric_add(sm->num_failed, 1);
    if (r->bootstrap_failed) /* no Transfer (prefill) / refused (decode) */
        pd_metric_add(sm->bootstrap_failed, 1);
    else if (reason == PD_END_TIMEOUT || r->xfer_failed)
        pd_metric_add(sm->transfer_failed, 1);
}

static void end_request(struct pd_daemon_req *r, const struct pd_engine_event *ev) {
    r->ereq = ev->req; /* ours again */
    r->ending = true;
    int reason = ev->reason;
    if (r->stopped_here)
        reason = PD_END_DONE;
    else if (reason == PD_END_FAILED && (r->aborted || r->peer_aborted))
        /* A user's abort (or a client gone) ended it, whichever reached this daemon first: the
         * router aborts on both workers at once, and prefill's abort often lands here as a
         * failed transfer before decode's own. Counted as aborted, not as a failure; a client
         * that did not ask for it still gets the error below. */
        reason = PD_END_ABORTED;
    pd_info("room=%" PRIu64 " rid=%s end=%s tokens=%d", r->room, r->rid,
            pd_sched_end_reason_str(reason), r->n_out);
    if (D.role->ending)
        D.role->ending(&D, r, ev, reason);
    count_end(r, reason, ev);
    if (reason == PD_END_DONE) {
        if (!r->finish)
            r->finish = ev->finish == PD_FINISH_STOP ? PD_API_FINISH_STOP : PD_API_FINISH_LENGTH;
        finish_http_ok(r);
    } else if (reason == PD_END_ABORTED && r->aborted) {
        r->finish = PD_API_FINISH_ABORT;
        finish_http_ok(r);
    } else {
        char msg[400];
        int status = 500;
        if (ev->status == PD_EFULL) {
            status = 503;
            snprintf(msg, sizeof(msg), "the %s daemon's queue is full", role_name());
        } else if (ev->status == PD_ERANGE) {
            status = 400;
            snprintf(msg, sizeof(msg), "the request needs more KV pages than the pool has");
        } else if (reason == PD_END_TIMEOUT) {
            snprintf(msg, sizeof(msg), "%s", D.role->timeout_msg);
        } else if (r->fail_msg[0]) {
            snprintf(msg, sizeof(msg), "KV transfer failed: %s", r->fail_msg);
        } else {
            snprintf(msg, sizeof(msg), "request %s (%s)", pd_sched_end_reason_str(reason),
                     ev->status ? pd_status_str(ev->status) : "no detail");
        }
        finish_http_error(r, status, msg);
    }
    req_free(r);
}

static void on_engine_event(void *ctx, const struct pd_engine_event *ev) {
    (void)ctx;
    struct pd_daemon_req *r = pd__daemon_find_room(ev->room);
    if (r && ev->req && ev->req->user != r)
        r = NULL; /* a stale event of an earlier request on this room */
    switch (ev->kind) {
    case PD_ENGINE_EV_SEND:
        if (D.role->on_send)
            D.role->on_send(&D, r, ev);
        break;
    case PD_ENGINE_EV_ADMIT:
        if (r && D.role->on_admit)
            D.role->on_admit(&D, r, ev);
        break;
    case PD_ENGINE_EV_TOKEN:
        if (r)
            pd__daemon_take_token(r, ev->token, ev->index, ev->finish, ev->logprob,
                                  ev->req && ev->req->samples ? &ev->req->samples[ev->index]
                                                              : NULL);
        break;
    case PD_ENGINE_EV_QUIESCE:
        if (D.role->on_quiesce)
            D.role->on_quiesce(&D, r, ev);
        break;
    case PD_ENGINE_EV_END:
        if (r)
            end_request(r, ev);
        else
            pd_engine_req_free(ev->req);
        break;
    case PD_ENGINE_EV_FLUSHED: pd_info("flush_cache: %d pages freed", (int)ev->n_output); break;
    case PD_ENGINE_EV_PROBE: pd__daemon_probe_done(&D, ev->room, ev->status, ev->token); break;
    default: break;
    }
}

/* ---- transfer engine + bootstrap ---- */

/* A room of a live request ended: its transfer's latency and size, or its failure. */
static void room_metrics(struct pd_daemon_req *r, int status, const struct pd_xfer_notice *n) {
    if (!r || r->ending)
        return; /* an early room (no request), or one end_request closes itself */
    int st = n ? n->status : status;
    if (st == PD_OK && r->t_xfer > 0) {
        pd_serve_metrics_kv_done(D.sm, r->xfer_bytes, now_s() - r->t_xfer);
    } else if (st != PD_OK && !r->xfer_failed) {
        r->xfer_failed = true;
        pd_metric_add(D.sm->kv_fail[pd_serve_metrics_kv_reason(st)], 1);
    }
}

static void on_room_end(void *ctx, uint64_t room, void *user, int status,
                        const struct pd_xfer_notice *n) {
    (void)ctx;
    (void)user;
    struct pd_daemon_req *r = pd__daemon_find_room(room);
    room_metrics(r, status, n);
    if (D.role->room_end)
        D.role->room_end(&D, r, room, status, n);
}

static void on_peer_closed(void *ctx, pd_xfer_peer_t *p, void *user) {
    (void)ctx;
    (void)user;
    if (D.role->peer_closed)
        D.role->peer_closed(&D, p);
}

static void on_xfer_call(void *ctx, pd_xfer_peer_t *p, void *user, const struct pd_xfer_ctl *call) {
    (void)ctx;
    (void)user;
    D.role->xfer_call(&D, p, call);
}

static void on_peer_failed(void *ctx, pd_xfer_peer_t *p, void *user, int status) {
    (void)ctx;
    (void)p;
    (void)user;
    pd_warn("xfer: a peer failed (%s); its rooms fail once its endpoint is closed",
            pd_status_str(status));
}

/* "host:port" for gRPC; an IPv6 address goes in brackets ("[fd00::1]:8998"), as the router
 * sends a DNS-found prefill's address bare, the way it sends any host. */
void pd__daemon_host_port(char *out, size_t size, const char *host, int port) {
    bool v6 = strchr(host, ':') != NULL && host[0] != '[';
    snprintf(out, size, v6 ? "[%s]:%d" : "%s:%d", host, port);
}

/* ---- generation requests ---- */

void pd__daemon_abort(struct pd_daemon_req *r, bool user) {
    if (user)
        r->aborted = true;
    if (D.role->aborting)
        D.role->aborting(&D, r);
    pd_engine_submit(D.eng, &(struct pd_engine_cmd){.kind = PD_ENGINE_CMD_ABORT, .room = r->room});
}

static void on_client_gone(struct pd_http_req *h, void *user) {
    (void)h;
    struct pd_daemon_req *r = user;
    r->http = NULL;
    pd_info("room=%" PRIu64 " rid=%s client went away: aborting", r->room, r->rid);
    pd__daemon_abort(r, true);
}

static void set_error(struct pd_api_error *e, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Fills e for a request that is not answered yet (prepare_req's caller renders it). */
static void set_error(struct pd_api_error *e, int status, const char *param, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    pd_api_error_set(e, status, status >= 500 ? "server_error" : "invalid_request_error", param,
                     NULL, "%s", msg);
}

/* t_arrival: the body was here (its parsing counts in TTFT, as SGLang's clock does) */
static struct pd_daemon_req *req_new(double t_arrival) {
    struct pd_daemon_req *r = pd_calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->slot = -1;
    r->matched_stop = -1;
    r->matched_token = -1;
    r->t_start = t_arrival;
    r->t_waiting = r->t_start; /* prefill: again when its Transfer arrives */
    r->created = (int64_t)time(NULL);
    return r;
}

/* Parses body (one prompt, one sample) into r, tokenizes it and builds its engine request; on
 * failure e says why and r is the caller's to free. Nothing is registered yet. */
static struct pd_api_config api_config(void) {
    return (struct pd_api_config){.served_model_name = D.args.served_model_name,
                                  .model_path = D.args.model_path,
                                  .disaggregated = D.role->disaggregated,
                                  .bootstrap_optional = D.local_prefill,
                                  .context_length = D.info.context_length,
                                  .max_n = D.max_n,
                                  .max_images = D.vision ? D.args.limit_mm_per_prompt : 0,
                                  .allow_image_urls = D.args.allow_image_urls};
}

/* Builds r's engine request from its parsed body (r->api): tokenizes the prompt, places the
 * loaded images li (NULL: none) in it, checks its length. On failure e says why and r is the
 * caller's to free. Nothing is registered yet. */
static int prepare_req(struct pd_daemon_req *r, enum pd_api_kind kind, struct pd_daemon_images *li,
                       struct pd_api_error *e) {
    /* the prompt's ids */
    struct pd_token_ids ids = {0};
    int rc = PD_OK;
    if (r->api.input_ids) {
        rc =
            pd_array_grow((void **)&ids.ids, &ids.cap, (size_t)r->api.n_input_ids, sizeof(int32_t));
        if (!rc && r->api.n_input_ids > 0) {
            memcpy(ids.ids, r->api.input_ids, sizeof(int32_t) * (size_t)r->api.n_input_ids);
            ids.n = (size_t)r->api.n_input_ids;
        }
    } else if (kind == PD_API_CHAT) {
        char *prompt = NULL;
        size_t plen = 0;
        if (!D.chat) {
            set_error(e, 400, "messages", "the model has no chat template");
            return PD_EINVAL;
        }
        if (pd_api_render_chat_prompt(&r->api, D.chat, pd_tokenizer_bos_token(D.tok),
                                      pd_tokenizer_eos_token(D.tok), &prompt, &plen, e) != PD_OK)
            return PD_EINVAL;
        rc = pd_tokenizer_encode(D.tok, prompt, plen, PD_TOK_PARSE_SPECIAL, &ids);
        pd_free(prompt);
    } else {
        rc = pd_tokenizer_encode(D.tok, r->api.text, r->api.text_len, PD_TOK_DEFAULT, &ids);
    }
    if (rc || ids.n == 0) {
        set_error(e, 400, "prompt", "%s", rc ? pd_error_msg() : "the prompt is empty");
        pd_token_ids_free(&ids);
        return PD_EINVAL;
    }
    struct pd_engine_mm *mm = NULL; /* images: placeholders expanded, positions planned */
    if ((li && li->n > 0 &&
         (rc = pd__daemon_place_images(&D, &r->api, &ids, li, &mm, e)) != PD_OK) ||
        pd_api_check_length(&r->api, (int)ids.n, D.info.context_length, e) != PD_OK ||
        pd_api_check_token_ids(&r->api, D.info.vocab_size, e) != PD_OK) {
        pd_engine_mm_free(mm);
        pd_token_ids_free(&ids);
        return rc ? rc : PD_EINVAL;
    }
    if (r->api.sampling.max_new_tokens < 1) {
        r->api.sampling.max_new_tokens = 1; /* the prefill's token is always produced */
        r->prompt_only = true;              /* but not answered (SGLang/vLLM max tokens 0) */
    }
    r->room = D.role->room ? D.role->room(&D, r) : r->api.bootstrap_room;
    r->n_prompt = (int32_t)ids.n;
    if (pd__daemon_find_room(r->room)) {
        set_error(e, 400, "bootstrap_room",
                  "bootstrap_room %" PRIu64 " already has a live request on this %s daemon",
                  r->room, role_name());
        pd_engine_mm_free(mm);
        pd_token_ids_free(&ids);
        return PD_EINVAL;
    }
    struct pd_sampling_params sp = r->api.sampling;
    if (!sp.has_seed && sp.temperature > 0) {
        /* both daemons draw from the same stream: a seed from the room, unless given */
        sp.has_seed = true;
        sp.seed = r->room ^ (uint64_t)D.args.random_seed;
    } else if (sp.has_seed && r->sub > 0) {
        /* n > 1 with a seed: each sample its own stream (vLLM's seeded n samples differ);
         * prefill and decode derive the same one from the sub-request's index */
        sp.seed += (uint64_t)r->sub * 0x9E3779B97F4A7C15ull;
    }
    rc = pd_engine_req_new(r->room, ids.ids, r->n_prompt, D.info.page_size, &sp, &r->ereq);
    pd_token_ids_free(&ids);
    if (rc) {
        pd_engine_mm_free(mm);
        set_error(e, 500, NULL, "%s", pd_error_msg());
        return rc;
    }
    r->ereq->mm = mm; /* freed with the engine request */
    if (r->api.rid)
        snprintf(r->rid, sizeof(r->rid), "%s", r->api.rid);
    else
        snprintf(r->rid, sizeof(r->rid), "%016" PRIx64, r->room);
    if (r->grp && kind != PD_API_GENERATE) {
        snprintf(r->id, sizeof(r->id), "%s", r->grp->id); /* one id for all choices */
    } else {
        uint64_t seq = ++D.id_seq;
        if (kind == PD_API_GENERATE)
            snprintf(r->id, sizeof(r->id), "%s", r->rid);
        else
            pd_api_format_id(r->id, sizeof(r->id), kind == PD_API_CHAT ? "chatcmpl-" : "cmpl-",
                             r->room, seq);
    }
    return D.role->prepare ? D.role->prepare(&D, r, e) : PD_OK;
}

int pd__daemon_prepare_input_logprobs(struct pd_daemon_req *r, struct pd_api_error *e) {
    if (!pd_api_wants_input_logprobs(&r->api, r->n_prompt))
        return PD_OK;
    /* scored where the prompt is prefilled; in PD mode the router merges the prefill's
     * input_token_logprobs into the decode's answer */
    r->n_in_lp = r->n_prompt - r->api.logprob_start_len;
    r->ereq->in_lp = pd_calloc((size_t)r->n_in_lp, sizeof(*r->ereq->in_lp));
    if (!r->ereq->in_lp) {
        set_error(e, 500, NULL, "out of memory for %d prompt logprobs", r->n_in_lp);
        return PD_ENOMEM;
    }
    r->ereq->in_lp_start = r->api.logprob_start_len;
    r->in_lp = r->ereq->in_lp;
    return PD_OK;
}

/* Registers a prepared r and hands it to the engine; h is the connection its answer goes to.
 * On failure r is freed and e says why (503). */
static int submit_req(struct pd_daemon_req *r, struct pd_http_req *h, struct pd_api_error *e) {
    int rc = pd_room_table_take(&D.slots, r->room, &r->slot);
    PD_ASSERT(rc == PD_OK); /* the caller saw a free slot; prepare_req a vacant room */
    D.reqs[r->slot] = r;
    D.n_live++;
    r->ereq->user = r;
    struct pd_engine_req *er = r->ereq;
    if (pd_engine_submit(D.eng, &(struct pd_engine_cmd){.kind = PD_ENGINE_CMD_ADD, .req = er})) {
        set_error(e, 503, NULL, "%s", pd_error_msg());
        req_free(r);
        return PD_EFULL;
    }
    r->ereq = NULL; /* the engine's now */
    r->http = h;
    r->streaming = r->api.stream;
    pd_info("room=%" PRIu64 " rid=%s %s prompt=%d max_new=%d", r->room, r->rid, role_name(),
            (int)r->n_prompt, r->api.sampling.max_new_tokens);
    if (D.role->submitted)
        D.role->submitted(&D, r);
    return PD_OK;
}

static void handle_group(struct pd_http_req *h, enum pd_api_kind kind, struct pd_api_split *sp,
                         double t_arrival);

/* A prepared request (or why not, e) to its client h: queued and submitted, or the error. */
static void start_req(struct pd_daemon_req *r, struct pd_http_req *h, int rc,
                      struct pd_api_error *e) {
    if (rc != PD_OK) {
        pd_http_respond_error(h, e);
        req_free(r);
        return;
    }
    if (D.slots.n_free == 0) {
        pd__daemon_respond_error(h, 503, "server_error", NULL,
                                 "too many requests queued (--max-queued-requests %d)",
                                 D.args.max_queued_requests);
        req_free(r);
        return;
    }
    if (submit_req(r, h, e) != PD_OK) {
        pd_http_respond_error(h, e);
        return;
    }
    pd_http_req_on_gone(h, on_client_gone, r);
    if (r->streaming)
        pd_http_sse_start(h);
}

/* Why a request's images did not load, as its answer (400: the image; 500: ours). */
static int images_error(const struct pd_daemon_images *li, struct pd_api_error *e) {
    bool bad = li->status == 400;
    pd_api_error_set(e, li->status, bad ? "invalid_request_error" : "server_error",
                     bad ? "image" : NULL, NULL, "%s", li->err);
    return PD_EINVAL;
}

/* A request with images: they load (fetch, decode, process, hash) on a libuv worker, then the
 * request is prepared and started back on the loop; h is NULL once the client left. */
struct image_job {
    uv_work_t work;
    struct pd_daemon_req *r;
    struct pd_http_req *h;
    enum pd_api_kind kind;
    struct pd_daemon_images li;
};

static void image_job_gone(struct pd_http_req *h, void *user) {
    (void)h;
    ((struct image_job *)user)->h = NULL;
}

static void image_job_work(uv_work_t *w) {
    struct image_job *j = w->data;
    pd__daemon_load_images(&D, &j->r->api, &j->li);
}

static void image_job_done(uv_work_t *w, int status) {
    struct image_job *j = w->data;
    struct pd_api_error e;
    memset(&e, 0, sizeof(e));
    int rc = PD_OK;
    if (status != 0 && !j->li.status) { /* the work never ran */
        j->li.status = 500;
        snprintf(j->li.err, sizeof(j->li.err), "loading the request's images failed");
    }
    if (j->li.status)
        rc = images_error(&j->li, &e);
    if (!j->h || D.stopping) { /* the client left (or the daemon stops): nothing to answer */
        if (j->h)
            pd__daemon_respond_error(j->h, 503, "server_error", NULL, "shutting down");
        req_free(j->r);
    } else {
        pd_http_req_on_gone(j->h, NULL, NULL);
        if (!rc)
            rc = prepare_req(j->r, j->kind, &j->li, &e);
        start_req(j->r, j->h, rc, &e);
    }
    pd__daemon_images_free(&j->li);
    pd_free(j);
}

static void handle_generate(struct pd_http_req *h, enum pd_api_kind kind) {
    double t_arrival = now_s();
    struct pd_api_error e;
    if (D.stopping || !D.ready) {
        pd__daemon_respond_error(h, 503, "server_error", NULL, "the %s daemon is %s", role_name(),
                                 D.stopping ? "shutting down" : "not ready");
        return;
    }
    size_t blen;
    const char *body = pd_http_req_body(h, &blen);
    struct pd_api_config ac = api_config();
    struct pd_api_split split;
    if (pd_api_split(kind, body, blen, &ac, &split, &e) != PD_OK) {
        pd_http_respond_error(h, &e);
        return;
    }
    if (split.bodies) {
        handle_group(h, kind, &split, t_arrival);
        pd_api_split_free(&split);
        return;
    }
    struct pd_daemon_req *r = req_new(t_arrival);
    if (!r) {
        pd_api_split_free(&split);
        pd__daemon_respond_error(h, 500, "server_error", NULL, "out of memory");
        return;
    }
    /* one request: the tree the split parsed (a body it could not take is parsed again, for
     * pd_api_parse's error) */
    int prc = split.root ? pd_api_parse_tree(kind, body, blen, split.root, &ac, &r->api, &e)
                         : pd_api_parse(kind, body, blen, &ac, &r->api, &e);
    split.root = NULL;
    pd_api_split_free(&split);
    if (prc != PD_OK) {
        start_req(r, h, PD_EINVAL, &e);
        return;
    }
    if (r->api.n_images > 0) { /* the images load off the loop thread first */
        struct image_job *j = pd_calloc(1, sizeof(*j));
        if (!j) {
            pd__daemon_respond_error(h, 500, "server_error", NULL, "out of memory");
            req_free(r);
            return;
        }
        *j = (struct image_job){.r = r, .h = h, .kind = kind};
        j->work.data = j;
        pd_http_req_on_gone(h, image_job_gone, j);
        if (uv_queue_work(&D.loop, &j->work, image_job_work, image_job_done) != 0) {
            pd_http_req_on_gone(h, NULL, NULL);
            pd__daemon_respond_error(h, 500, "server_error", NULL, "could not queue the images");
            req_free(r);
            pd_free(j);
        }
        return;
    }
    start_req(r, h, prepare_req(r, kind, NULL, &e), &e);
}

/* ---- fan-out groups (batch /generate, prompt lists, n > 1) ---- */

static void group_free(struct pd_daemon_group *g) {
    for (int k = 0; g->bodies && k < g->count; k++)
        pd_free(g->bodies[k]);
    pd_free(g->bodies);
    pd_free(g->subs);
    pd_free(g);
}

/* Detaches every sub-request from the client (they answer nobody from now on); abort: also
 * abort the ones still running. */
static void group_detach(struct pd_daemon_group *g, bool abort, bool user) {
    g->http = NULL;
    for (int k = 0; k < g->count; k++) {
        struct pd_daemon_req *s = g->subs[k];
        if (!s || !s->http)
            continue;
        s->http = NULL;
        if (abort && s->slot >= 0 && !s->ending)
            pd__daemon_abort(s, user);
    }
}

static void on_group_gone(struct pd_http_req *h, void *user) {
    (void)h;
    struct pd_daemon_group *g = user;
    pd_info("id=%s rid=%s client of a %d-way request went away: aborting", g->id, g->rid, g->count);
    group_detach(g, true, true);
}

/* A sub-request failed: the whole request fails (as SGLang's batch does), the others stop. */
static void group_fail(struct pd_daemon_group *g, int status, const char *msg) {
    struct pd_http_req *h = g->http;
    if (!h)
        return;
    group_detach(g, true, false);
    struct pd_api_error e;
    fill_error(&e, status, msg);
    if (g->streaming)
        pd_http_sse_fail(h, &e);
    else
        pd_http_respond_error(h, &e);
}

/* Every sub-request answered: the merged body, or the stream's usage chunk and [DONE]. */
static void group_finish(struct pd_daemon_group *g) {
    struct pd_http_req *h = g->http;
    group_detach(g, false, false);
    if (g->streaming) {
        if (g->include_usage && g->kind != PD_API_GENERATE) {
            struct pd_api_request api = {.kind = g->kind};
            struct pd_api_result res = {.id = g->id,
                                        .model = D.args.served_model_name,
                                        .created = g->created,
                                        .prompt_tokens = g->prompt_tokens,
                                        .completion_tokens = g->completion_tokens,
                                        .cached_tokens = g->cached_tokens};
            char *u = NULL;
            if (pd_api_render_usage_chunk(&api, &res, &u) == PD_OK) {
                pd_http_sse_send(h, u, strlen(u));
                pd_free(u);
            }
        }
        pd_http_sse_end(h);
        return;
    }
    char *out = NULL;
    if (pd_api_merge(g->kind, g->n, g->bodies, g->count, &out) != PD_OK) {
        pd__daemon_respond_error(h, 500, "server_error", NULL, "%s", pd_error_msg());
        return;
    }
    pd__daemon_respond_json(h, 200, out);
}

static void handle_group(struct pd_http_req *h, enum pd_api_kind kind, struct pd_api_split *sp,
                         double t_arrival) {
    struct pd_api_error e;
    if (sp->count > D.slots.n_free) {
        pd__daemon_respond_error(
            h, 503, "server_error", NULL,
            "the request fans out into %d sub-requests; %d fit in the queue now "
            "(--max-queued-requests %d)",
            sp->count, D.slots.n_free, D.args.max_queued_requests);
        return;
    }
    struct pd_daemon_group *g = pd_calloc(1, sizeof(*g));
    if (g) {
        g->subs = pd_calloc((size_t)sp->count, sizeof(*g->subs));
        g->bodies = pd_calloc((size_t)sp->count, sizeof(*g->bodies));
    }
    if (!g || !g->subs || !g->bodies) {
        if (g)
            group_free(g);
        pd__daemon_respond_error(h, 500, "server_error", NULL, "out of memory");
        return;
    }
    g->kind = kind;
    g->count = sp->count;
    g->n = sp->n;
    g->batch = sp->batch;
    g->created = (int64_t)time(NULL);
    pd_api_format_id(g->id, sizeof(g->id), kind == PD_API_CHAT ? "chatcmpl-" : "cmpl-",
                     pd_splitmix64(&D.room_seq), ++D.id_seq);
    /* every sub-request parsed and tokenized before any runs: a bad one fails the request */
    for (int k = 0; k < g->count; k++) {
        struct pd_daemon_req *r = req_new(t_arrival);
        if (!r) {
            pd__daemon_respond_error(h, 500, "server_error", NULL, "out of memory");
            goto fail;
        }
        g->subs[k] = r;
        g->refs++;
        r->grp = g;
        r->sub = k;
        struct pd_api_config ac = api_config();
        struct pd_daemon_images li = {0};
        int rc = pd_api_parse(kind, sp->bodies[k], strlen(sp->bodies[k]), &ac, &r->api, &e);
        if (!rc && r->api.n_images > 0 && pd__daemon_load_images(&D, &r->api, &li) != PD_OK) {
            /* sub-requests load on the loop: a batch or n > 1 with images is rare */
            rc = images_error(&li, &e);
        }
        if (!rc)
            rc = prepare_req(r, kind, &li, &e);
        pd__daemon_images_free(&li);
        if (rc != PD_OK) {
            pd_http_respond_error(h, &e);
            goto fail;
        }
        for (int j = 0; j < k; j++)
            if (g->subs[j]->room == r->room) {
                pd__daemon_respond_error(h, 400, "invalid_request_error", "bootstrap_room",
                                         "bootstrap_room %" PRIu64 " is given to two sub-requests",
                                         r->room);
                goto fail;
            }
    }
    struct pd_api_request *a0 = &g->subs[0]->api;
    g->streaming = a0->stream;
    g->include_usage = a0->include_usage;
    snprintf(g->rid, sizeof(g->rid), "%s", sp->rid ? sp->rid : "");
    g->http = h;
    pd_http_req_on_gone(h, on_group_gone, g);
    if (g->streaming)
        pd_http_sse_start(h);
    g->refs++; /* the loop's: a failed submit may free every sub-request */
    for (int k = 0; k < g->count; k++) {
        struct pd_daemon_req *r = g->subs[k];
        if (!g->http) { /* an earlier one could not be queued: the rest never run */
            req_free(r);
            continue;
        }
        if (submit_req(r, h, &e) != PD_OK) /* freed it */
            group_fail(g, e.status, e.message);
    }
    if (--g->refs == 0)
        group_free(g);
    return;
fail:
    for (int k = 0; k < g->count; k++)
        if (g->subs[k]) {
            g->subs[k]->grp = NULL;
            req_free(g->subs[k]);
        }
    group_free(g);
}

static void h_generate(struct pd_http_req *h, void *ud) {
    (void)ud;
    handle_generate(h, PD_API_GENERATE);
}
static void h_completions(struct pd_http_req *h, void *ud) {
    (void)ud;
    handle_generate(h, PD_API_COMPLETIONS);
}
static void h_chat(struct pd_http_req *h, void *ud) {
    (void)ud;
    handle_generate(h, PD_API_CHAT);
}

/* ---- timers, shutdown ---- */

static void on_closed_http(struct pd_http_server *s, void *ud);

static void finish_shutdown(void) {
    uv_timer_stop(&D.tick);
    uv_close((uv_handle_t *)&D.tick, NULL);
    pd_engine_stop(D.eng); /* what is left ends aborted (HTTP already gone) */
    if (D.role->stop)
        D.role->stop(&D);
    pd_xfer_free(D.x);
    D.x = NULL;
    pd_grpc_bridge_free(D.bridge);
    D.bridge = NULL;
}

static void on_tick(uv_timer_t *t) {
    (void)t;
    double now = now_s();
    if (D.role->tick)
        D.role->tick(&D, now);
    pd__daemon_probes_expire(&D, now, false);
    pd__daemon_xfer_watch(&D, now);
    if (D.stopping && now >= D.stop_deadline && D.n_live > 0) {
        /* out of time: fail what is left */
        for (int32_t i = 0; i < D.cap; i++)
            if (D.reqs[i] && !D.reqs[i]->aborted)
                pd__daemon_abort(D.reqs[i], true);
    }
}

static void on_closed_http(struct pd_http_server *s, void *ud) {
    (void)s;
    (void)ud;
    finish_shutdown();
}

static void begin_shutdown(const char *why) {
    if (D.stopping)
        return;
    D.stopping = true;
    D.ready = false;
    pd_info("%s: %s; draining for up to %.0f s", role_name(), why, D.shutdown_timeout);
    D.stop_deadline = now_s() + D.shutdown_timeout * 0.8;
    pd__daemon_probes_expire(&D, 0, true);
    uv_signal_stop(&D.sigterm);
    uv_signal_stop(&D.sigint);
    uv_close((uv_handle_t *)&D.sigterm, NULL);
    uv_close((uv_handle_t *)&D.sigint, NULL);
    if (D.http && D.http_listening) {
        pd_http_server_shutdown(D.http, (uint64_t)(D.shutdown_timeout * 1000), on_closed_http,
                                NULL);
    } else {
        pd_http_server_free(D.http);
        D.http = NULL;
        finish_shutdown();
    }
}

static void on_signal(uv_signal_t *s, int signum) {
    (void)s;
    begin_shutdown(signum == SIGTERM ? "SIGTERM" : "SIGINT");
}

/* ---- start ---- */

/* The generation endpoints here; the others are daemon_http.c's. */
static int route_all(void) {
    static const struct {
        const char *p;
        pd_http_handler_fn fn;
    } routes[] = {
        {"/generate", h_generate},
        {"/v1/completions", h_completions},
        {"/v1/chat/completions", h_chat},
    };
    for (size_t i = 0; i < PD_ARRAY_LEN(routes); i++) {
        int rc = pd_http_server_route(D.http, "POST", routes[i].p, PD_HTTP_PER_CLIENT, routes[i].fn,
                                      NULL);
        if (rc)
            return rc;
    }
    return pd__daemon_route(&D);
}

static int start(void) {
    int rc;
    struct pd_server_args *a = &D.args;
    struct pd_engine_config ec = {
        .ops = D.role->ops,
        .mixed_chunk = D.mixed_chunk,
        .new_token_ratio = D.conservativeness != 1.0 ? 0.7 * D.conservativeness : 0,
        .model_path = a->model_path,
        .device = a->device == PD_DEVICE_CUDA ? PD_BACKEND_CUDA : PD_BACKEND_CPU,
        .device_index = a->base_gpu_id,
        .tp_size = a->tp_size,
        /* on a GPU the token choice (argmax, or the sampler without penalties) stays there;
         * PD_GREEDY_FAST_PATH=1 takes the same path on the cpu backend (tests) */
        .greedy_on_device = a->device == PD_DEVICE_CUDA || getenv("PD_GREEDY_FAST_PATH") != NULL,
        .threads = a->threads,
        .page_size = a->page_size,
        .chunked_prefill_size = a->chunked_prefill_size,
        .max_prefill_tokens = a->max_prefill_tokens,
        .max_running_requests = a->max_running_requests,
        .max_queued_requests = a->max_queued_requests,
        .context_length = a->context_length,
        .n_pages =
            a->max_total_tokens > 0 ? (a->max_total_tokens + a->page_size - 1) / a->page_size : 0,
        .mem_fraction_static = a->mem_fraction_static,
        .kv_dtype_auto = a->kv_cache_dtype == PD_KV_CACHE_DTYPE_AUTO,
        .disable_prefix_cache = a->disable_prefix_cache,
        .bootstrap_timeout_s = D.bootstrap_timeout,
        .eager_prefill = D.eager_prefill,
        .waiting_timeout_s = D.waiting_timeout,
        /* the decode side of PD gets embeddings' KV, never pixels */
        .vision = D.role->encodes_images,
        .mm_cache_bytes = (size_t)a->mm_embedding_cache_mb * 1000000,
    };
    enum pd_dtype kvt;
    pd_kv_cache_dtype_of(a->kv_cache_dtype, &kvt);
    ec.kv_dtype = kvt;
    if ((rc = pd_engine_new(&ec, &D.eng)) != PD_OK || (rc = pd__daemon_vision_new(&D)) != PD_OK)
        return rc;
    pd_engine_get_info(D.eng, &D.info);
    if ((rc = pd_serve_metrics_new(D.role->metrics, a->served_model_name, D.info.page_size,
                                   D.info.n_pages, &D.sm)) != PD_OK)
        return rc;
    if ((rc = pd_tokenizer_new(a->tokenizer_path, &D.tok)) != PD_OK)
        return pd_error_wrap(rc, "loading the tokenizer from %s", a->tokenizer_path);
    const char *tmpl = pd_tokenizer_chat_template(D.tok);
    if (tmpl && pd_chat_template_new(tmpl, &D.chat) != PD_OK) {
        pd_warn("the model's chat template does not compile (%s); chat is refused", pd_error_msg());
        D.chat = NULL;
    }
    if ((rc = pd_room_table_init(&D.slots, a->max_queued_requests)) != PD_OK)
        return rc;
    D.cap = a->max_queued_requests;
    if (!(D.reqs = pd_calloc((size_t)D.cap, sizeof(*D.reqs))))
        return PD_ENOMEM;

    snprintf(D.transport, sizeof(D.transport), "none"); /* until a role starts one */
    if (D.role->start && (rc = D.role->start(&D)) != PD_OK)
        return rc;
    if ((rc = pd_engine_start(D.eng, &D.loop, on_engine_event, NULL)) != PD_OK)
        return rc;
    struct pd_http_server_config hc = {.host = a->host,
                                       .port = a->port,
                                       .api_key = D.api_key,
                                       .ssl_ctx = D.ssl_ctx,
                                       .max_requests_per_client = D.max_per_client};
    if ((rc = pd_http_server_new(&D.loop, &hc, &D.http)) != PD_OK || (rc = route_all()) != PD_OK)
        return rc;
    D.http_listening = true;
    if ((rc = pd_http_server_listen(D.http)) != PD_OK)
        return rc;
    uv_timer_start(&D.tick, on_tick, 100, 100);
    D.ready = true;
    D.role->ready(&D);
    fflush(stdout);
    pd_info("%s ready: model %s (%s), %d pages of %d tokens, context %d, %s", role_name(),
            a->model_path, D.info.architecture, D.info.n_pages, D.info.page_size,
            D.info.context_length, D.info.backend);
    return PD_OK;
}

/* The transfer engine on the pool and the layout both sides must agree on. Under tensor
 * parallelism the pool is one shard per rank, registered as such (xfer.h). */
_Static_assert(PD_TP_MAX <= PD_XFER_SHARDS_MAX, "every rank's pool is a transfer shard");

/* The transfer engine's self-check (xfer.h pd_xfer_doctor_run), in the log and /server_info:
 * what an operator needs when the first transfers are slow or never arrive. */
static void log_doctor(const struct pd_xfer_info *xi) {
    struct pd_xfer_doctor *dr = &D.doctor;
    pd_xfer_doctor_run(D.x, 0, dr);
    pd_info("transfer self-test: UCX %s, UCX_TLS=%s, UCX_NET_DEVICES=%s, RDMA %s; lanes %s "
            "(pages as %s); one page (%zu bytes) %.2f GB/s, one room (%zu bytes) %.2f GB/s; "
            "%s%s%.0f ms",
            dr->ucx_version, xi->transports, xi->net_devices, xi->rdma ? "in use" : "none",
            dr->lanes[0] ? dr->lanes : "unknown", dr->path, dr->page_bytes, dr->page_gbps,
            dr->room_bytes, dr->room_gbps,
            D.info.pool_on_device ? (xi->staged ? "GPU pool staged through pinned host memory, "
                                                : "GPU pool put directly (CUDA-aware UCX), ")
                                  : "",
            xi->cuda_memory ? "UCX takes CUDA memory, " : "", dr->ms);
    if (dr->error[0])
        pd_warn("transfer self-test did not finish: %s", dr->error);
    if (dr->warning[0])
        pd_warn("transfer self-test: %s", dr->warning);
}

int pd__daemon_start_transfer(struct pd_daemon_state *d) {
    PD_ASSERT(d == &D);
    int rc;
    struct pd_server_args *a = &D.args;
    struct pd_xfer_config xc = {.ib_devices = a->disaggregation_ib_device,
                                .abort_timeout_ms = 3000};
    struct pd_xfer_callbacks xcb = {.on_room_end = on_room_end,
                                    .on_peer_failed = on_peer_failed,
                                    .on_peer_closed = on_peer_closed,
                                    .on_call = D.role->xfer_call ? on_xfer_call : NULL};
    if ((rc = pd_grpc_bridge_new(&D.loop, &D.bridge)) != PD_OK ||
        (rc = pd_xfer_new(&D.loop, &xc, &xcb, &D.x)) != PD_OK)
        return rc;
    struct pd_xfer_info xi;
    pd_xfer_get_info(D.x, &xi);
    if (D.info.pool_on_device) {
        /* GPU pool: UCX puts it directly when it can take CUDA memory, else the transfer stages
         * pages through a pinned host ring on a stream of its own */
        struct pd_devmem_opts dmo = {.kind = PD_DEVMEM_CUDA, .device_index = D.info.device_index};
        if ((rc = pd_devmem_new(&dmo, &D.dm)) != PD_OK)
            return pd_error_wrap(rc, "the GPU KV pool's transfer");
        rc = pd_xfer_register_device_pool_shards(D.x, D.info.pool_bases, D.info.tp_size,
                                                 D.info.shard_page_bytes, (uint32_t)D.info.n_pages,
                                                 D.dm, xi.cuda_memory);
        if (rc && xi.cuda_memory) {
            pd_warn("UCX reports CUDA memory but could not register the GPU pool (%s); staging "
                    "pages through pinned host memory instead",
                    pd_error_msg());
            rc = pd_xfer_register_device_pool_shards(D.x, D.info.pool_bases, D.info.tp_size,
                                                     D.info.shard_page_bytes,
                                                     (uint32_t)D.info.n_pages, D.dm, false);
        }
        if (rc)
            return pd_error_wrap(rc, "the GPU KV pool's transfer");
    } else if (getenv("PD_XFER_STAGE_HOST")) {
        /* tests: the host pool through the staged GPU path, copies completing late (devmem.h's
         * deferred host mode), so CPU machines run what a GPU without CUDA-aware UCX runs */
        struct pd_devmem_opts dmo = {.kind = PD_DEVMEM_HOST, .host_deferred = true};
        if ((rc = pd_devmem_new(&dmo, &D.dm)) != PD_OK ||
            (rc = pd_xfer_register_device_pool_shards(
                 D.x, D.info.pool_bases, D.info.tp_size, D.info.shard_page_bytes,
                 (uint32_t)D.info.n_pages, D.dm, false)) != PD_OK)
            return rc;
    } else if ((rc = pd_xfer_register_pool_shards(D.x, D.info.pool_bases, D.info.tp_size,
                                                  D.info.shard_page_bytes,
                                                  (uint32_t)D.info.n_pages)) != PD_OK) {
        return rc;
    }
    pd_xfer_get_info(D.x, &xi);
    log_doctor(&xi);
    snprintf(D.transport, sizeof(D.transport), "ucx:%s%s%s", xi.transports ? xi.transports : "all",
             xi.rdma ? "+rdma" : "",
             xi.staged               ? "+staged"
             : D.info.pool_on_device ? "+gpu-direct"
                                     : "");
    /* how the ranks split the kv heads: a decode of another tp gets its pages regrouped */
    struct pd_xfer_heads hd = {
        .rows_per_page = (uint32_t)(D.info.n_layers * 2 * D.info.page_size),
        .total = (uint32_t)D.info.kv_heads_total,
        .count = (uint32_t)D.info.kv_heads,
    };
    hd.head_bytes = (uint32_t)(D.info.shard_page_bytes / hd.rows_per_page / hd.count);
    for (int r = 0; r < D.info.tp_size; r++)
        hd.start[r] = (uint32_t)D.info.kv_head_start[r];
    if ((rc = pd_xfer_register_heads(D.x, &hd)) != PD_OK)
        return rc;
    memset(&D.layout, 0, sizeof(D.layout));
    /* the model, not this daemon's split of it: tp-independent (total kv heads) */
    snprintf(D.layout.model, sizeof(D.layout.model), "%s/v%d/l%d/kv%dx%d", D.info.architecture,
             D.info.vocab_size, D.info.n_layers, D.info.kv_heads_total, D.info.head_dim);
    D.layout.layers = (uint32_t)D.info.n_layers;
    D.layout.kv_heads = (uint32_t)D.info.kv_heads;
    D.layout.kv_heads_total = (uint32_t)D.info.kv_heads_total;
    D.layout.head_dim = (uint32_t)D.info.head_dim;
    D.layout.page_size = (uint32_t)D.info.page_size;
    snprintf(D.layout.dtype, sizeof(D.layout.dtype), "%s", D.info.dtype);
    D.layout.tp_size = (uint32_t)D.info.tp_size; /* one pool shard per rank */
    D.layout.page_bytes = D.info.page_bytes;
    snprintf(D.node_id, sizeof(D.node_id), "%s-%d-%016" PRIx64, role_name(), (int)getpid(),
             pd_xfer_id(D.x));
    if ((rc = pd_cluster_key_load(D.cluster_key_path, D.key, &D.key_len)) != PD_OK)
        return rc;
    return PD_OK;
}

int pd_daemon_main(const struct pd_role *role, int argc, char **argv) {
    memset(&D, 0, sizeof(D));
    D.role = role;
    D.bootstrap_timeout = 300;
    D.waiting_timeout = 300;
    D.shutdown_timeout = 30;
    D.xfer_stall_timeout = 30;
    D.conservativeness = 1.0;
    D.max_n = PD_API_MAX_N;
    pd_server_args_defaults(&D.args);
    D.args.disaggregation_mode = role->disaggregation_mode;
    const char *prog = role->prog;
    struct pd_flagset fs;
    pd_flagset_init(&fs, prog, role->about);
    pd_server_args_register(&fs, &D.args);
    pd_flag_double(&fs, "--bootstrap-timeout", &D.bootstrap_timeout, "SECONDS", 0.01, 86400,
                   "prefill: a request whose decode never sends its Transfer fails after this");
    pd_flag_double(&fs, "--waiting-timeout", &D.waiting_timeout, "SECONDS", 0.01, 86400,
                   "decode: a request whose KV cache never arrives fails after this");
    pd_flag_double(&fs, "--shutdown-timeout", &D.shutdown_timeout, "SECONDS", 0, 86400,
                   "SIGTERM: requests still running after this are failed, then exit");
    pd_flag_double(&fs, "--transfer-stall-timeout", &D.xfer_stall_timeout, "SECONDS", 0, 86400,
                   "/health answers 503 while the KV transfer engine holds operations and none "
                   "has completed for this long (a wedged engine; 200 again once it moves); 0: "
                   "never");
    pd_flag_string(&fs, "--api-key", &D.api_key, "KEY",
                   "require Authorization: Bearer KEY on the API (not on /health, /metrics)");
    pd_flag_cluster_key(&fs, &D.cluster_key_path);
    pd_tls_flags_register(
        &fs, &D.tls,
        "PEM certificate chain, this server's certificate first: with --ssl-keyfile the API is "
        "served over HTTPS only (TLS 1.2 or newer), and a prefill's bootstrap port over TLS too",
        "PEM CA certificates that decode checks the prefill's bootstrap certificate against "
        "(default: the system's roots); with these or a certificate of its own, decode calls "
        "bootstrap ports over TLS. The prefill and the colocated server call no peer");
    pd_flag_int(&fs, "--max-n", &D.max_n, "N", 1, PD_API_MAX_FANOUT,
                "most samples per prompt a request may ask for (n, sampling_params.n); more is "
                "refused with 400");
    pd_flag_int(&fs, PD_HTTP_PER_CLIENT_FLAG, &D.max_per_client, "N", 0, 10000000,
                "generation requests in flight from one client IP address before that address "
                "gets 429 (with Retry-After: 1); 0 = unlimited. Behind pdserve-router every "
                "request comes from the router's address: leave it 0 there and set it on the "
                "router");
    if (role->flags)
        role->flags(&fs, &D);
    if (pd_flags_parse(&fs, argc, argv) != PD_OK) {
        fprintf(stderr, "%s: %s\n", prog, pd_error_msg());
        return 2;
    }
    if (fs.help) {
        pd_flags_usage(&fs, stdout);
        return 0;
    }
    if (pd_server_args_finish(&D.args) != PD_OK || pd_tls_flags_check(&D.tls) != PD_OK) {
        fprintf(stderr, "%s: %s\n", prog, pd_error_msg());
        return 2;
    }
    if (!(D.role = role->configure(&D)))
        return 2;
    /* the TLS files now, before the model loads: a wrong path fails in a moment */
    if ((D.tls.ca_certs && pd_tls_ca_check(D.tls.ca_certs) != PD_OK) ||
        (pd_tls_flags_serving(&D.tls) &&
         pd_tls_server_ctx_new(D.tls.certfile, D.tls.keyfile, &D.ssl_ctx) != PD_OK)) {
        fprintf(stderr, "%s: %s\n", prog, pd_error_msg());
        return 2;
    }
    pd_log_set_name(role_name());
    D.room_seq = (uint64_t)D.args.random_seed ^ ((uint64_t)getpid() << 32) ^ uv_hrtime();
    signal(SIGPIPE, SIG_IGN);
    uv_loop_init(&D.loop);
    uv_signal_init(&D.loop, &D.sigterm);
    uv_signal_init(&D.loop, &D.sigint);
    uv_signal_start(&D.sigterm, on_signal, SIGTERM);
    uv_signal_start(&D.sigint, on_signal, SIGINT);
    uv_timer_init(&D.loop, &D.tick);
    int rc = start();
    if (rc) {
        fprintf(stderr, "%s: %s\n", prog, pd_error_msg());
        D.exit_code = 1;
        begin_shutdown("start failed"); /* unwinds what started */
    }
    uv_run(&D.loop, UV_RUN_DEFAULT);
    uv_loop_close(&D.loop);
    for (int32_t i = 0; D.reqs && i < D.cap; i++)
        req_free(D.reqs[i]);
    pd_http_server_free(D.http);
    pd_tls_ctx_free(D.ssl_ctx);
    pd_engine_free(D.eng);
    pd_serve_metrics_free(D.sm);
    pd_chat_template_free(D.chat);
    pd__daemon_vision_free(&D);
    pd_tokenizer_free(D.tok);
    pd_room_table_free(&D.slots);
    pd_free(D.reqs);
    pd_devmem_free(D.dm); /* after the loop ran the transfer engine's last close */
    pd_info("%s: stopped", role_name());
    return D.exit_code;
}
