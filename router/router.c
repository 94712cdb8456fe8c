/*
 * router.c — the router's request flow (see router.h); its registry, polls and DNS discovery
 * are router_workers.c, its own endpoints router_endpoints.c, the aborts it sends worker_posts.c.
 *
 * A generation request (struct rreq) holds at most one prefill call and one decode call; each
 * worker's `inflight` counts the calls the router has on it. Nothing reaches the client before
 * decode's first body byte, so until then any failure can still become a clean error status, and
 * a request whose pair failed (unreachable, 408/429/5xx, a failed KV transfer) is retried on
 * another pair (new room) after a backoff, up to --retry-max-retries attempts; waiting requests
 * hold no calls and no workers, one retry timer starts them. Each worker's circuit breaker
 * (breaker.h) hears each call's outcome once: a decode saying the KV transfer failed is charged
 * to the prefill. Decode's SSE is held until its first event shows it is not an error, then goes
 * through byte for byte as it arrives; any other answer is buffered and sent whole with
 * decode's status. A request is freed once the client's answer is finished (or the client left)
 * and both upstream calls are over. Aborts (POST /abort_request {"rid"}) are fire-and-forget.
 * Prefill 4xx answers (the request's fault) reach the client as they are; prefill 5xx and
 * transport failures become 502; timeouts 504.
 * Backpressure: while a client's backlog in the HTTP server is above --stream-buffer-bytes the
 * decode call is paused (curl stops reading, TCP pushes back on decode) and it resumes from the
 * server's drain callback, so a slow client costs at most that much memory (plus one read).
 * The API key is checked here, not by the server, so that 401 keeps the router's error shape.
 * Shutdown: the server drains (pd_http_server_shutdown); at the deadline the router aborts what
 * is left itself, so each client gets an error rather than a cut; the loop handles close once
 * the server has closed and the aborts went out.
 * Registry: workers come from the command line and from DNS names re-resolved every
 * --dns-refresh-secs (discovery.h plans, resolve.h looks up off the loop thread). A worker that
 * leaves DNS drains: out of rotation and unpolled, it leaves the registry when its last router
 * call ends, and is freed when the last request pointing at it is.
 */
#include "router/router_internal.h"

#include <math.h>

int pd__router_sb_put(struct sbuf *b, const char *s, size_t n) {
    if (pd_array_grow((void **)&b->p, &b->cap, b->len + n + 1, 1))
        return PD_ENOMEM;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return PD_OK;
}

/* ---------------------------------------------------------------- JSON answers */

static const char *error_type(int status) {
    switch (status) {
    case 400:
    case 404:
    case 405:
    case 413: return "invalid_request_error";
    case 401: return "authentication_error";
    case 429: return "rate_limit_error";
    default: return "server_error";
    }
}

/* {"error":{"message","type","param","code"}} (OpenAI shape); NULL on allocation failure. */
static char *error_json(int status, const char *msg) {
    cJSON *root = cJSON_CreateObject();
    cJSON *e = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", error_type(status));
    cJSON_AddNullToObject(e, "param");
    cJSON_AddNumberToObject(e, "code", status);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

void pd__router_respond_json(struct pd_http_req *hr, int status, const char *json) {
    pd_http_respond(hr, status, "application/json", json, strlen(json));
}

void pd__router_respond_error(struct pd_http_req *hr, int status, const char *msg) {
    char *j = error_json(status, msg);
    const char *fallback = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                           "\"param\":null,\"code\":500}}";
    pd__router_respond_json(hr, j ? status : 500, j ? j : fallback);
    cJSON_free(j);
}

void pd__router_respond_cjson(struct pd_http_req *hr, int status, cJSON *root) {
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!s) {
        pd__router_respond_error(hr, 500, "out of memory");
        return;
    }
    pd__router_respond_json(hr, status, s);
    cJSON_free(s);
}

/* ---------------------------------------------------------------- aborts */

static void abort_all_rids(struct rreq *rq, const struct worker *w) {
    for (int i = 0; w && i < rq->info.n; i++)
        pd__router_send_abort(rq->rt, rq, w, rq->info.rids[i], rq->auth_line);
}

/* ---------------------------------------------------------------- requests */

static void rreq_maybe_free(struct rreq *rq) {
    if (!rq->finished || rq->pcall || rq->dcall)
        return;
    struct pd_router *rt = rq->rt;
    if (rq->prev)
        rq->prev->next = rq->next;
    else
        rt->reqs = rq->next;
    if (rq->next)
        rq->next->prev = rq->prev;
    if (rq->counted)
        rt->active--;
    pd__router_worker_posts_forget(rt, rq);
    pd__router_worker_unref(rq->pw);
    pd__router_worker_unref(rq->dw);
    pd__router_worker_unref(rq->prev_pw);
    pd__router_worker_unref(rq->prev_dw);
    pd__router_worker_unref(rq->charged[0]);
    pd__router_worker_unref(rq->charged[1]);
    pd_router_body_info_free(&rq->info);
    pd_free(rq->sent);
    pd_free(rq->rtext);
    pd_free(rq->path);
    pd_free(rq->auth_line);
    pd_free(rq->dbuf.p);
    pd_free(rq->perr.p);
    pd_free(rq->sse.p);
    pd_free(rq->last_ev.p);
    pd_router_lpmerge_free(&rq->lpm);
    pd_free(rq);
}

double pd__router_now_s(void) {
    return (double)uv_hrtime() / 1e9;
}

/* ---- metrics: one call_start per upstream call, one call_end when it is over (the request
 * holds a reference on its workers, so their URLs outlive a removal from the registry) ---- */

static void call_start(struct rreq *rq, bool prefill) {
    struct worker *w = prefill ? rq->pw : rq->dw;
    pd_router_metrics_call_start(rq->rt->metrics, w->spec.url, prefill);
}

static void call_end(struct rreq *rq, bool prefill, int outcome) {
    struct worker *w = prefill ? rq->pw : rq->dw;
    pd_router_metrics_call_end(rq->rt->metrics, w->spec.url, prefill, outcome);
}

static int call_outcome(const struct pd_upstream_result *r) {
    if (r->status == PD_ETIMEDOUT)
        return PD_ROUTER_OUTCOME_TIMEOUT;
    return r->status == PD_OK && r->http_status / 100 == 2 ? PD_ROUTER_OUTCOME_OK
                                                           : PD_ROUTER_OUTCOME_ERROR;
}

/* The client's answer is over (sent, or the client left). */
static void mark_finished(struct rreq *rq) {
    rq->finished = true;
    pd_router_metrics_done(rq->rt->metrics, rq->path, pd__router_now_s() - rq->t_start);
}

static void drop_pcall(struct rreq *rq) {
    if (!rq->pcall)
        return;
    pd_upstream_call_cancel(rq->pcall);
    rq->pcall = NULL;
    call_end(rq, true, rq->client_gone ? PD_ROUTER_OUTCOME_CLIENT_GONE : PD_ROUTER_OUTCOME_ABORTED);
    pd__router_worker_call_ended(rq->pw);
}

static void drop_dcall(struct rreq *rq) {
    if (!rq->dcall)
        return;
    pd_upstream_call_cancel(rq->dcall);
    rq->dcall = NULL;
    call_end(rq, false,
             rq->client_gone ? PD_ROUTER_OUTCOME_CLIENT_GONE : PD_ROUTER_OUTCOME_ABORTED);
    pd__router_worker_call_ended(rq->dw);
}

/* Ends the client's answer with an error: a status + JSON before anything was sent, else one
 * SSE error event and [DONE] (API.md: never a silent stop). The log line says log_msg: a
 * worker's answer quoted in msg may echo the request, which stays out of the logs. */
static void finish_error_logged(struct rreq *rq, int status, const char *msg, const char *log_msg) {
    if (rq->finished)
        return;
    mark_finished(rq);
    rq->rt->n_failed++;
    if (rq->info.n)
        pd_warn("room=%" PRIu64 " rid=%s: %d %s", rq->info.rooms[0], rq->info.rids[0], status,
                log_msg);
    else
        pd_warn("%s: %d %s", rq->path, status, log_msg);
    struct pd_http_req *hr = rq->hr;
    rq->hr = NULL;
    PD_ASSERT(hr != NULL);
    if (!rq->streaming) {
        pd__router_respond_error(hr, status, msg);
        return;
    }
    char *j = error_json(status, msg);
    struct sbuf ev = {0};
    pd__router_sb_put(&ev, "data: ", 6);
    if (j)
        pd__router_sb_put(&ev, j, strlen(j));
    pd__router_sb_put(&ev, "\n\ndata: [DONE]\n\n", 16);
    /* a send that fails means the client is gone (its on_gone ran): hr is not ours any more */
    if (pd_http_stream_send(hr, ev.p ? ev.p : "", ev.len) != PD_ECANCELED)
        pd_http_stream_end(hr);
    pd_free(ev.p);
    cJSON_free(j);
}

static void finish_error(struct rreq *rq, int status, const char *msg) {
    finish_error_logged(rq, status, msg, msg);
}

static void on_client_gone(struct pd_http_req *hr, void *ud) {
    struct rreq *rq = ud;
    (void)hr;
    rq->hr = NULL; /* the server's now */
    if (rq->finished)
        return;
    mark_finished(rq);
    rq->client_gone = true;
    if (rq->kind == RREQ_GENERATE && rq->pw) {
        pd_info("room=%" PRIu64 " rid=%s: client gone; aborting on both workers", rq->info.rooms[0],
                rq->info.rids[0]);
        abort_all_rids(rq, rq->pw);
        abort_all_rids(rq, rq->dw);
    }
    drop_pcall(rq);
    drop_dcall(rq);
    rreq_maybe_free(rq);
}

static int start_attempt(struct rreq *rq);

/* ---- circuit breaker outcomes: at most one per worker per attempt ---- */

/* The call to rq's prefill (or decode) tells its breaker success or failure. */
static void judge(struct rreq *rq, bool prefill, bool success) {
    bool *done = prefill ? &rq->p_judged : &rq->d_judged;
    struct worker *w = prefill ? rq->pw : rq->dw;
    if (*done || !w)
        return;
    *done = true;
    struct worker **charged = &rq->charged[prefill ? 0 : 1];
    if (!success) {
        if (*charged == w)
            return;
        pd__router_worker_unref(*charged);
        *charged = pd__router_worker_ref(w);
    }
    struct pd_router_cb_change ch;
    if (pd_router_cb_record(&w->cb, &rq->rt->cfg->cb, success, pd__router_now_s(), &ch))
        pd_router_metrics_cb_outcome(rq->rt->metrics, w->spec.url, success);
    pd__router_cb_note(w, &ch, success ? ": enough trial requests succeeded" : "");
}

/* Statuses worth another pair (sglang-router's retryable set): 408, 429, 5xx. */
static bool retryable_status(long st) {
    return st == 408 || st == 429 || st / 100 == 5;
}

/* May a request that failed before the client saw a byte go to another pair? */
static bool can_retry(const struct rreq *rq) {
    return rq->attempt + 1 < rq->rt->cfg->retry_max_retries && !rq->streaming && !rq->finished &&
           !rq->rt->shutting_down;
}

/* A retryable failure with no attempt left (counted when retries are on at all). */
static void retries_exhausted(struct rreq *rq) {
    if (rq->rt->cfg->retry_max_retries > 1 && !rq->streaming && !rq->finished)
        pd_router_metrics_retries_exhausted(rq->rt->metrics);
}

static void on_retry_timer(uv_timer_t *t);

/* A waiting request whose retry may start once its backoff is over. */
static bool retry_ready(const struct rreq *rq) {
    return rq->waiting && !(rq->client_rid && rq->aborts_pending > 0);
}

void pd__router_arm_retry_timer(struct pd_router *rt) {
    uint64_t now = uv_now(rt->loop), due = UINT64_MAX;
    for (struct rreq *rq = rt->reqs; rq; rq = rq->next)
        if (retry_ready(rq) && rq->retry_due_ms < due)
            due = rq->retry_due_ms;
    if (due == UINT64_MAX)
        uv_timer_stop(&rt->retry_timer);
    else
        uv_timer_start(&rt->retry_timer, on_retry_timer, due > now ? due - now : 0, 0);
}

/* The failed attempt's workers become the ones the next attempt avoids; after the backoff the
 * retry timer starts it (a new room). The caller has dropped both calls. */
static void schedule_retry(struct rreq *rq, const char *why) {
    struct pd_router *rt = rq->rt;
    PD_ASSERT(!rq->pcall && !rq->dcall);
    rq->attempt++;
    rt->n_retried++;
    pd_router_metrics_retry(rt->metrics);
    double ms = pd_router_backoff_ms(&rt->cfg->backoff, rq->attempt, &rt->rng);
    pd_warn("room=%" PRIu64 " rid=%s: %s; retrying on another pair in %.0f ms (attempt %d of %d)",
            rq->info.rooms[0], rq->info.rids[0], why, ms, rq->attempt + 1,
            rt->cfg->retry_max_retries);
    /* the references move: the retry avoids this pair */
    pd__router_worker_unref(rq->prev_pw);
    pd__router_worker_unref(rq->prev_dw);
    rq->prev_pw = rq->pw;
    rq->prev_dw = rq->dw;
    rq->pw = rq->dw = NULL;
    rq->client_rid = !rq->info.rid_added;
    pd_router_body_info_free(&rq->info);
    pd_free(rq->sent);
    rq->sent = NULL;
    rq->dbuf.len = rq->perr.len = rq->sse.len = rq->last_ev.len = 0;
    pd_router_lpmerge_free(&rq->lpm);
    rq->lpm_ready = rq->dheld = false;
    rq->sse_hold = rq->held_error = false;
    rq->waiting = true;
    rq->retry_due_ms = uv_now(rt->loop) + (uint64_t)ms;
    pd__router_arm_retry_timer(rt);
}

/* Backoffs that ended: their attempts start (each answers its client itself when it cannot). */
static void on_retry_timer(uv_timer_t *t) {
    struct pd_router *rt = t->data;
    uint64_t now = uv_now(rt->loop);
    for (struct rreq *rq = rt->reqs, *next; rq; rq = next) {
        next = rq->next;
        if (!retry_ready(rq) || rq->retry_due_ms > now)
            continue;
        rq->waiting = false;
        if (!rq->finished)
            start_attempt(rq);
        rreq_maybe_free(rq);
    }
    pd__router_arm_retry_timer(rt);
}

static void on_prefill_data(void *ud, struct pd_upstream_call *call, const char *buf, size_t len) {
    struct rreq *rq = ud;
    size_t keep = rq->info.input_logprobs ? PREFILL_LP_KEEP : PREFILL_ERR_KEEP;
    if (rq->perr.len < keep)
        pd__router_sb_put(&rq->perr, buf, len < keep - rq->perr.len ? len : keep - rq->perr.len);
}

static int stream_out(struct rreq *rq, const char *buf, size_t len);
static void finish_held(struct rreq *rq);

static void on_prefill_done(void *ud, struct pd_upstream_call *call,
                            const struct pd_upstream_result *r) {
    struct rreq *rq = ud;
    struct pd_router *rt = rq->rt;
    struct worker *pw = rq->pw;
    rq->pcall = NULL;
    call_end(rq, true, call_outcome(r));
    pd__router_worker_call_ended(pw);
    bool ok = r->status == PD_OK && r->http_status / 100 == 2;
    bool transport = r->status != PD_OK && r->status != PD_ETIMEDOUT;
    /* a worker that cannot be reached leaves rotation, also when decode happened to answer
     * first (the order of the two is a race) */
    if (transport) {
        char why[200];
        snprintf(why, sizeof(why), "request failed: %s", r->error);
        pd__router_set_healthy(pw, false, why);
    }
    /* its breaker: unreachable or 5xx is a failure, unless the 5xx says the transfer to the
     * decode failed (the decode's side tells whose fault); any other answer is a success; a
     * timeout says nothing about this worker alone */
    bool server_error = r->status == PD_OK && r->http_status / 100 == 5;
    if (transport ||
        (server_error && !pd_router_transfer_failed(rq->perr.p, rq->perr.len, NULL, 0)))
        judge(rq, true, false);
    else if (r->status == PD_OK && !server_error)
        judge(rq, true, true);
    if (ok && rq->info.input_logprobs && !rq->finished) {
        /* the prompt's logprobs are in: decode's answer (held, or its waiting events) gets them */
        if (pd_router_lpmerge_init(&rq->lpm, rq->route, rq->perr.p ? rq->perr.p : "",
                                   rq->perr.len) == PD_OK)
            rq->lpm_ready = true;
        else
            pd_warn("room=%" PRIu64 ": prefill's answer with prompt logprobs: %s",
                    rq->info.rooms[0], pd_error_msg());
        if (rq->dheld) {
            finish_held(rq);
            rreq_maybe_free(rq);
            return;
        }
        if (rq->streaming && stream_out(rq, NULL, 0) != PD_OK)
            return; /* the client is gone: rq may be freed */
    }
    if (!ok && rq->dheld && !rq->finished) {
        /* decode answered, but the prompt's logprobs it needs will not come */
        char m[PREFILL_ERR_KEEP + 256];
        snprintf(m, sizeof(m), "prefill worker %s failed; the prompt logprobs are missing: %s",
                 pw->spec.url, r->status ? r->error : "non-2xx answer");
        finish_error(rq, 502, m);
        rreq_maybe_free(rq);
        return;
    }
    if (ok || !rq->dcall) {
        /* drained; or decode already answered the client */
        if (!ok)
            pd_warn("room=%" PRIu64 ": prefill %s failed after decode finished: %s",
                    rq->info.rooms[0], pw->spec.url, r->status ? r->error : "non-2xx answer");
        rreq_maybe_free(rq);
        return;
    }
    char msg[PREFILL_ERR_KEEP + 256];
    /* decode is waiting for a transfer that will not come: abort it there */
    abort_all_rids(rq, rq->dw);
    drop_dcall(rq);
    bool retryable = transport || (r->status == PD_OK && retryable_status(r->http_status));
    if (retryable && can_retry(rq)) {
        char why[400];
        if (transport)
            snprintf(why, sizeof(why), "prefill %s unreachable (%s)", pw->spec.url, r->error);
        else
            snprintf(why, sizeof(why), "prefill %s answered %ld", pw->spec.url, r->http_status);
        schedule_retry(rq, why);
        rreq_maybe_free(rq);
        return;
    }
    if (retryable)
        retries_exhausted(rq);
    if (r->status == PD_OK && r->http_status / 100 == 4 && !rq->streaming && !rq->finished) {
        /* the request's own fault: the client sees prefill's answer */
        mark_finished(rq);
        const char *b = rq->perr.p ? rq->perr.p : "";
        const char *ct = pd_upstream_call_content_type(call);
        pd_http_respond(rq->hr, (int)r->http_status, *ct ? ct : "application/json", b,
                        rq->perr.len);
        rq->hr = NULL;
        rreq_maybe_free(rq);
        return;
    }
    if (r->status == PD_ETIMEDOUT)
        snprintf(msg, sizeof(msg), "prefill worker %s timed out after %d s", pw->spec.url,
                 rt->cfg->request_timeout_secs);
    else if (r->status != PD_OK)
        snprintf(msg, sizeof(msg), "prefill worker %s failed: %s", pw->spec.url, r->error);
    else
        snprintf(msg, sizeof(msg), "prefill worker %s answered %ld: %.*s", pw->spec.url,
                 r->http_status, (int)rq->perr.len, rq->perr.p ? rq->perr.p : "");
    char log_msg[400];
    snprintf(log_msg, sizeof(log_msg), "prefill worker %s answered %ld (its body is in the answer)",
             pw->spec.url, r->http_status);
    finish_error_logged(rq, r->status == PD_ETIMEDOUT ? 504 : 502, msg,
                        r->status == PD_OK ? log_msg : msg);
    rreq_maybe_free(rq);
}

/* The client took enough of its backlog: read from decode again. */
static void on_client_drained(struct pd_http_req *hr, void *ud) {
    struct rreq *rq = ud;
    (void)hr;
    rq->paused = false;
    pd_upstream_call_pause(rq->dcall, false); /* may deliver (and finish) at once: rq last */
}

/* After a piece went to a streaming client: pause decode while the client lags. */
static void apply_backpressure(struct rreq *rq, struct pd_upstream_call *call) {
    size_t high = (size_t)rq->rt->cfg->stream_buffer_bytes;
    if (rq->paused || pd_http_stream_backlog(rq->hr) <= high)
        return;
    if (pd_http_stream_on_drain(rq->hr, high / 2, on_client_drained, rq) != PD_EAGAIN)
        return;
    rq->paused = true;
    rq->rt->n_pauses++;
    pd_debug("room=%" PRIu64 ": client lags (%zu bytes queued); pausing decode", rq->info.rooms[0],
             pd_http_stream_backlog(rq->hr));
    pd_upstream_call_pause(call, true);
}

/* Out of memory while streaming: the request ends (rq may be freed). PD_ENOMEM. */
static int stream_oom(struct rreq *rq) {
    abort_all_rids(rq, rq->pw);
    abort_all_rids(rq, rq->dw);
    drop_pcall(rq);
    drop_dcall(rq);
    finish_error(rq, 500, "out of memory streaming decode's answer");
    rreq_maybe_free(rq);
    return PD_ENOMEM;
}

/* The end of the first whole SSE event in p[0..len) (its blank line), or NULL. */
static char *event_end(char *p, size_t len) {
    for (size_t i = 0; i + 1 < len; i++)
        if (p[i] == '\n' && p[i + 1] == '\n')
            return p + i;
    return NULL;
}

/* The first byte went to the client at now: the router's TTFT and its stages (metrics.h). */
static void first_byte_timeline(struct rreq *rq, double now) {
    pd_router_metrics_ttft(rq->rt->metrics, now - rq->t_start);
    if (rq->t_ddata <= 0)
        return;
    double sent = rq->t_dcall + rq->d_pretransfer;
    if (sent > rq->t_ddata)
        sent = rq->t_ddata;
    int on_decode = rq->local ? PD_ROUTER_HO_LOCAL : PD_ROUTER_HO_DECODE;
    double st[PD_ROUTER_HO_N] = {[PD_ROUTER_HO_DECODE] = -1, [PD_ROUTER_HO_LOCAL] = -1};
    st[PD_ROUTER_HO_DISPATCH] = fmax(sent - rq->t_start, 0);
    st[on_decode] = fmax(rq->t_ddata - sent, 0);
    st[PD_ROUTER_HO_RELAY] = fmax(now - rq->t_ddata, 0);
    pd_router_metrics_handover(rq->rt->metrics, st);
    pd_debug("room=%" PRIu64 " rid=%s first byte (ms): dispatch %.3f | %s %.3f | relay %.3f "
             "= ttft %.3f",
             rq->info.rooms[0], rq->info.rids[0], st[0] * 1e3, rq->local ? "local" : "decode",
             st[on_decode] * 1e3, st[PD_ROUTER_HO_RELAY] * 1e3, (now - rq->t_start) * 1e3);
}

/* Sends buf to the streaming client. PD_OK, or the request ended (client gone, out of memory:
 * rq may be freed, touch nothing). */
static int send_piece(struct rreq *rq, const char *buf, size_t len) {
    pd__router_keep_last_event(rq, buf, len);
    int rc = pd_http_stream_send(rq->hr, buf, len);
    if (rc == PD_ECANCELED)
        return rc; /* the client is gone: on_client_gone ran and rq may be freed */
    if (rc == PD_OK && !rq->first_byte_sent) {
        rq->first_byte_sent = true;
        first_byte_timeline(rq, pd__router_now_s());
    }
    return rc ? stream_oom(rq) : PD_OK;
}

/* The length of p[0..len)'s whole events ("...\n\n"), 0 when the first is not whole yet. */
static size_t whole_events(const char *p, size_t len) {
    for (size_t i = len; i >= 2; i--)
        if (p[i - 1] == '\n' && p[i - 2] == '\n')
            return i;
    return 0;
}

/* Decode's stream bytes to the client, whole events only: a read may end mid-event, and an
 * error event of the router's own (the decode stopped answering, its connection broke) must
 * not land inside a half-relayed one. The tail waits in rq->sse. */
static int relay_whole_events(struct rreq *rq, const char *buf, size_t len) {
    if (!rq->sse.len) { /* the usual case: nothing waits, most reads end on a boundary */
        size_t cut = whole_events(buf, len);
        int rc = cut ? send_piece(rq, buf, cut) : PD_OK;
        if (rc) /* the client is gone or memory ran out: rq may be freed */
            return rc;
        if (cut < len && pd__router_sb_put(&rq->sse, buf + cut, len - cut))
            return stream_oom(rq);
        return PD_OK;
    }
    if (len && pd__router_sb_put(&rq->sse, buf, len))
        return stream_oom(rq);
    size_t cut = whole_events(rq->sse.p, rq->sse.len);
    if (!cut)
        return PD_OK;
    int rc = send_piece(rq, rq->sse.p, cut);
    if (rc)
        return rc;
    memmove(rq->sse.p, rq->sse.p + cut, rq->sse.len - cut);
    rq->sse.len -= cut;
    return PD_OK;
}

/* Decode's stream bytes to the client. With prompt logprobs, whole events only too, each merged
 * with the prefill's answer; they wait in rq->sse until it is in. */
static int stream_out(struct rreq *rq, const char *buf, size_t len) {
    if (!rq->info.input_logprobs)
        return relay_whole_events(rq, buf, len);
    if (len && pd__router_sb_put(&rq->sse, buf, len))
        return stream_oom(rq);
    while (rq->lpm_ready && rq->sse.len) {
        char *p = rq->sse.p;
        char *end = event_end(p, rq->sse.len);
        if (!end)
            break;
        size_t elen = (size_t)(end - p);
        struct sbuf ev = {0};
        int rc = PD_OK;
        if (elen >= 5 && strncmp(p, "data:", 5) == 0) {
            char *m = NULL;
            size_t ml = 0;
            size_t skip = elen > 5 && p[5] == ' ' ? 6 : 5;
            if (pd_router_lpmerge_event(&rq->lpm, p + skip, elen - skip, &m, &ml) == PD_OK) {
                rc = pd__router_sb_put(&ev, "data: ", 6);
                rc = rc ? rc : pd__router_sb_put(&ev, m, ml);
            } else {
                rc = pd__router_sb_put(&ev, p, elen);
            }
            pd_free(m);
        } else {
            rc = pd__router_sb_put(&ev, p, elen);
        }
        rc = rc ? rc : pd__router_sb_put(&ev, "\n\n", 2);
        /* consumed before sending: a send may end (and free) the request */
        memmove(p, end + 2, rq->sse.len - elen - 2);
        rq->sse.len -= elen + 2;
        if (rc) {
            pd_free(ev.p);
            return stream_oom(rq);
        }
        rc = send_piece(rq, ev.p, ev.len);
        pd_free(ev.p);
        if (rc)
            return rc;
    }
    return PD_OK;
}

/* Decode finished before the prefill's prompt logprobs came; now they did (or cannot): the
 * client gets decode's answer merged. */
static void finish_held(struct rreq *rq) {
    rq->dheld = false;
    if (rq->streaming) {
        if (stream_out(rq, NULL, 0) != PD_OK)
            return;
        mark_finished(rq);
        pd_http_stream_end(rq->hr);
        rq->hr = NULL;
        return;
    }
    char *m = NULL;
    size_t ml = 0;
    if (!rq->lpm_ready || pd_router_lpmerge_body(&rq->lpm, rq->dbuf.p ? rq->dbuf.p : "",
                                                 rq->dbuf.len, &m, &ml) != PD_OK) {
        finish_error(rq, 502,
                     "the prefill's prompt logprobs could not be merged into the "
                     "decode's answer");
        return;
    }
    mark_finished(rq);
    pd_http_respond(rq->hr, (int)rq->d_status, "application/json", m, ml);
    pd_free(m);
    rq->hr = NULL;
}

/* The client's stream starts with decode's status and type, and what was held goes out. PD_OK,
 * or the request ended (rq may be freed). */
static int release_held(struct rreq *rq, struct pd_upstream_call *call, long st, const char *ct) {
    pd__router_answer_first(rq, rq->dbuf.p, rq->dbuf.len);
    rq->sse_hold = false;
    rq->streaming = true;
    if (pd_http_stream_start(rq->hr, (int)st, ct) != PD_OK)
        return PD_ECANCELED; /* cannot happen: a gone client's on_gone finished rq already */
    struct sbuf held = rq->dbuf;
    rq->dbuf = (struct sbuf){0};
    int rc = held.len ? stream_out(rq, held.p, held.len) : PD_OK;
    pd_free(held.p);
    if (rc == PD_OK && call)
        apply_backpressure(rq, call);
    return rc;
}

#define SSE_HOLD_MAX (64 << 10) /* bytes: a first event longer than this is not an error event */

/* "data: {"error": ...}" (API.md: a stream's failure is one such event, then [DONE]). */
static bool first_event_is_error(const char *ev, size_t len) {
    if (len < 5 || strncmp(ev, "data:", 5) != 0)
        return false;
    cJSON *j = cJSON_ParseWithLength(ev + 5, len - 5);
    bool err = cJSON_IsObject(j) && cJSON_GetObjectItemCaseSensitive(j, "error") != NULL;
    cJSON_Delete(j);
    return err;
}

static void on_decode_data(void *ud, struct pd_upstream_call *call, const char *buf, size_t len) {
    struct rreq *rq = ud;
    if (rq->finished)
        return;
    if (rq->t_ddata <= 0) {
        rq->t_ddata = pd__router_now_s();
        rq->d_pretransfer = pd_upstream_call_pretransfer_s(call);
    }
    long st = pd_upstream_call_http_status(call);
    const char *ct = pd_upstream_call_content_type(call);
    if (!rq->streaming && !rq->sse_hold && !rq->held_error && st / 100 == 2 &&
        strncmp(ct, "text/event-stream", 17) == 0)
        rq->sse_hold = true;
    if (rq->sse_hold) {
        /* nothing goes to the client before decode's first event shows it is not an error:
         * a KV transfer that failed before any token is still a retryable failure */
        if (pd__router_sb_put(&rq->dbuf, buf, len)) {
            stream_oom(rq);
            return;
        }
        char *end = event_end(rq->dbuf.p, rq->dbuf.len);
        if (!end && rq->dbuf.len < SSE_HOLD_MAX)
            return;
        if (end && first_event_is_error(rq->dbuf.p, (size_t)(end - rq->dbuf.p))) {
            rq->sse_hold = false;
            rq->held_error = true; /* on_decode_done decides: retry, or pass it on */
            return;
        }
        release_held(rq, call, st, ct);
        return;
    }
    if (rq->held_error) {
        pd__router_sb_put(&rq->dbuf, buf, len); /* the rest of the failed stream ([DONE]) */
        return;
    }
    if (!rq->streaming) {
        if (pd__router_sb_put(&rq->dbuf, buf, len))
            pd_error("room=%" PRIu64 ": out of memory buffering decode's answer",
                     rq->info.rooms[0]);
        return;
    }
    if (stream_out(rq, buf, len) == PD_OK)
        apply_backpressure(rq, call);
}

static void on_decode_done(void *ud, struct pd_upstream_call *call,
                           const struct pd_upstream_result *r) {
    struct rreq *rq = ud;
    struct pd_router *rt = rq->rt;
    struct worker *dw = rq->dw;
    rq->dcall = NULL;
    call_end(rq, false, call_outcome(r));
    pd__router_worker_call_ended(dw);
    if (rq->finished) {
        rreq_maybe_free(rq);
        return;
    }
    bool failed_answer = r->status == PD_OK && (rq->held_error || retryable_status(r->http_status));
    if (failed_answer) {
        /* whose failure: a decode saying the KV transfer with its prefill failed blames the
         * prefill (a refused bootstrap port, a Pair that fails, a prefill gone mid-transfer) */
        char m[300];
        bool blame_prefill =
            pd_router_transfer_failed(rq->dbuf.p, rq->dbuf.len, m, sizeof(m)) && rq->pw;
        judge(rq, blame_prefill, false);
        if (rq->pcall) {
            abort_all_rids(rq, rq->pw);
            drop_pcall(rq);
        }
        if (can_retry(rq)) {
            char why[500];
            if (blame_prefill)
                snprintf(why, sizeof(why), "decode %s: the KV transfer from prefill %s failed: %s",
                         dw->spec.url, rq->pw->spec.url, m);
            else
                snprintf(why, sizeof(why), "decode %s answered %ld%s%s", dw->spec.url,
                         r->http_status, *m ? ": " : "", m);
            schedule_retry(rq, why);
            rreq_maybe_free(rq);
            return;
        }
        retries_exhausted(rq);
        if (rq->held_error) {
            /* the client gets decode's stream as it was: its error event has no logprobs to
             * merge, and the prefill that would bring them was dropped */
            rq->info.input_logprobs = false;
            if (release_held(rq, NULL, r->http_status, pd_upstream_call_content_type(call)) !=
                PD_OK)
                return;
        }
    } else if (r->status == PD_OK) {
        judge(rq, false, true);
        /* a short stream that ended before its first event was whole */
        if (rq->sse_hold &&
            release_held(rq, NULL, r->http_status, pd_upstream_call_content_type(call)) != PD_OK)
            return;
    }
    if (r->status == PD_OK && r->http_status / 100 == 2 && rq->info.input_logprobs) {
        /* the answer needs the prefill's prompt logprobs: merged now, or when they come */
        rq->dheld = true;
        rq->d_status = r->http_status;
        if (rq->lpm_ready || !rq->pcall)
            finish_held(rq);
        rreq_maybe_free(rq);
        return;
    }
    if (r->status == PD_OK) {
        if (r->http_status / 100 != 2 && rq->pcall) {
            abort_all_rids(rq, rq->pw);
            drop_pcall(rq);
        }
        mark_finished(rq);
        if (rq->streaming) {
            if (r->http_status / 100 == 2)
                pd__router_answer_last(rq, rq->last_ev.p, rq->last_ev.len);
            /* a stream that ended inside an event: what came of it goes too, as before */
            if (!rq->info.input_logprobs && rq->sse.len)
                (void)pd_http_stream_send(rq->hr, rq->sse.p, rq->sse.len);
            if (rq->hr) /* NULL: the client went meanwhile (the server has it) */
                pd_http_stream_end(rq->hr);
        } else {
            const char *ct = pd_upstream_call_content_type(call);
            if (r->http_status / 100 == 2) {
                pd__router_answer_first(rq, rq->dbuf.p, rq->dbuf.len);
                pd__router_answer_last(rq, rq->dbuf.p, rq->dbuf.len);
            }
            pd_http_respond(rq->hr, (int)r->http_status, *ct ? ct : "application/json",
                            rq->dbuf.p ? rq->dbuf.p : "", rq->dbuf.len);
        }
        rq->hr = NULL;
        rreq_maybe_free(rq);
        return;
    }
    /* transport failure or timeout */
    if (r->status != PD_ETIMEDOUT) {
        char why[200];
        snprintf(why, sizeof(why), "request failed: %s", r->error);
        pd__router_set_healthy(dw, false, why);
        judge(rq, false, false);
    }
    if (rq->pcall) {
        abort_all_rids(rq, rq->pw);
        drop_pcall(rq);
    }
    if (r->status != PD_ETIMEDOUT && can_retry(rq)) {
        char why[400];
        snprintf(why, sizeof(why), "decode %s unreachable (%s)", dw->spec.url, r->error);
        schedule_retry(rq, why);
        rreq_maybe_free(rq);
        return;
    }
    if (r->status != PD_ETIMEDOUT)
        retries_exhausted(rq);
    if (r->status == PD_ETIMEDOUT)
        abort_all_rids(rq, dw);
    char msg[400];
    if (r->status == PD_ETIMEDOUT)
        snprintf(msg, sizeof(msg), "decode worker %s timed out after %d s", dw->spec.url,
                 rt->cfg->request_timeout_secs);
    else
        snprintf(msg, sizeof(msg), "decode worker %s failed: %s", dw->spec.url, r->error);
    finish_error(rq, r->status == PD_ETIMEDOUT ? 504 : 502, msg);
    rreq_maybe_free(rq);
}

/* Picks a pair, rewrites the body, sends it to both. On failure the client has been answered
 * (rq->finished) and the status is returned. */
static int start_attempt(struct rreq *rq) {
    struct pd_router *rt = rq->rt;
    const struct pd_router_config *cfg = rt->cfg;
    size_t len;
    const char *body = pd_http_req_body(rq->hr, &len);
    /* the body is parsed once: for the routing text, the prompt's size and the rewrite */
    cJSON *root = cJSON_ParseWithLength(body, len);
    if ((rt->tree[0] || rt->tree[1]) && !rq->rtext &&
        pd_router_route_text(rq->route, root, &rq->rtext, &rq->rtext_len)) {
        /* no memory for the text: cache_aware routes it as an empty one (smallest tree) */
        pd_warn("cache_aware: %s", pd_error_msg());
        rq->rtext_len = 0;
    }
    /* a retry avoids both workers of the failed pair where another one is healthy (the one
     * that failed is out of rotation anyway) */
    rq->d_matched = 0;
    struct worker *dw = pd__router_pick_worker(rt, false, rq->prev_dw, rq);
    if (!dw && rq->prev_dw)
        dw = pd__router_pick_worker(rt, false, NULL, rq);
    /* --local-prefill-max-tokens: a prompt with at most that many tokens the decode does not
     * hold goes to the decode alone, which prefills it (and skips what its own prefix cache
     * holds), if its /get_load says it takes prompts alone. Held: the share of the routing text
     * the cache_aware decode policy matched for the picked decode. Without that policy, a body
     * this long holds no prompt that short: not sized. */
    int lmax = dw && dw->local_prefill ? cfg->local_prefill_max_tokens : 0;
    bool matched = dw && rq->d_matched > 0 && rq->rtext_len > 0;
    rq->psize_known = lmax > 0 &&
                      (matched || len <= (size_t)lmax * PD_ROUTER_BYTES_PER_TOKEN_MAX + 4096) &&
                      pd_router_body_prompt_size(rq->route, root, &rq->psize) == PD_OK;
    long est = rq->psize_known ? pd_router_prompt_tokens(&rq->psize, &rt->token_rate) : -1;
    if (est > 0 && matched)
        est -= (long)((double)est * (double)rq->d_matched / (double)rq->rtext_len);
    bool local = est >= 0 && est <= lmax;
    struct worker *pw = NULL;
    if (!local) {
        pw = pd__router_pick_worker(rt, true, rq->prev_pw, rq);
        if (!pw && rq->prev_pw)
            pw = pd__router_pick_worker(rt, true, NULL, rq);
    }
    if ((!local && !pw) || !dw) {
        char msg[300];
        pd__router_no_worker_msg(rt, !local && !pw, msg, sizeof(msg));
        cJSON_Delete(root);
        finish_error(rq, 503, msg);
        return PD_EAGAIN;
    }
    rq->p_judged = rq->d_judged = false;
    /* the bootstrap host is the prefill's own address: a DNS-found one's resolved address */
    int rc = pd_router_body_rewrite_parsed(
        rq->route, rt->cfg->max_n, body, len, root, local ? NULL : pw->spec.host,
        local ? 0 : pw->spec.bootstrap_port, &rt->rng, &rq->sent, &rq->sent_len, &rq->info);
    cJSON_Delete(root);
    if (rc) {
        finish_error(rq, rc == PD_ENOMEM ? 500 : 400, pd_error_msg());
        return rc;
    }
    if (local)
        rq->info.input_logprobs = false; /* the decode scores the prompt itself */
    rq->local = local;
    pd_router_metrics_path(rt->metrics, local);
    rq->pw = pd__router_worker_ref(pw);
    rq->dw = pd__router_worker_ref(dw);
    char url[600];
    struct pd_upstream_req req = {.method = "POST",
                                  .url = url,
                                  .body = rq->sent,
                                  .body_len = rq->sent_len,
                                  .auth = rq->auth_line,
                                  .timeout_ms = (long)cfg->request_timeout_secs * 1000,
                                  .connect_timeout_ms = 10000};
    pd_info("room=%" PRIu64 " rid=%s: %s%s → prefill %s, decode %s%s", rq->info.rooms[0],
            rq->info.rids[0], rq->path, rq->info.stream ? " (stream)" : "",
            local ? "none (local prefill)" : pw->spec.url, dw->spec.url,
            rq->attempt ? " (retry)" : "");
    struct pd_upstream_cbs pcbs = {.on_data = on_prefill_data, .on_done = on_prefill_done};
    struct pd_upstream_cbs dcbs = {.on_data = on_decode_data, .on_done = on_decode_done};
    snprintf(url, sizeof(url), "%s%s", dw->spec.url, rq->path);
    rq->t_dcall = pd__router_now_s();
    rq->t_ddata = 0;
    rc = pd_upstream_call_start(rt->up, &req, &dcbs, rq, &rq->dcall);
    if (rc == PD_OK) {
        dw->load.inflight++;
        dw->n_requests++;
        call_start(rq, false);
    }
    if (rc == PD_OK && !local) {
        snprintf(url, sizeof(url), "%s%s", pw->spec.url, rq->path);
        rc = pd_upstream_call_start(rt->up, &req, &pcbs, rq, &rq->pcall);
        if (rc == PD_OK) {
            pw->load.inflight++;
            pw->n_requests++;
            call_start(rq, true);
        } else {
            drop_dcall(rq);
        }
    }
    if (rc) {
        rq->dcall = rq->pcall = NULL;
        finish_error(rq, 500, pd_error_msg());
        return rc;
    }
    return PD_OK;
}

/* "Authorization: <the client's value>" for the workers, or NULL when it sent none. */
char *pd__router_auth_line_new(struct pd_http_req *hr, bool *oom) {
    size_t alen;
    const char *auth = pd_http_req_header(hr, "authorization", &alen);
    *oom = false;
    if (!auth)
        return NULL;
    size_t n = alen + sizeof("Authorization: ");
    char *line = pd_malloc(n);
    if (line)
        snprintf(line, n, "Authorization: %.*s", (int)alen, auth);
    *oom = line == NULL;
    return line;
}

static struct rreq *rreq_new(struct pd_router *rt, struct pd_http_req *hr, enum rreq_kind kind) {
    struct rreq *rq = pd_calloc(1, sizeof(*rq));
    if (!rq)
        return NULL;
    rq->rt = rt;
    rq->hr = hr;
    rq->kind = kind;
    rq->t_start = pd__router_now_s();
    rq->path = pd_strdup(pd_http_req_path(hr));
    bool oom;
    rq->auth_line = pd__router_auth_line_new(hr, &oom);
    if (!rq->path || oom) {
        pd_free(rq->path);
        pd_free(rq->auth_line);
        pd_free(rq);
        return NULL;
    }
    rq->next = rt->reqs;
    if (rt->reqs)
        rt->reqs->prev = rq;
    rt->reqs = rq;
    pd_router_metrics_request(rt->metrics, rq->path);
    pd_http_req_on_gone(hr, on_client_gone, rq);
    return rq;
}

void pd__router_handle_generate(struct pd_router *rt, struct pd_http_req *fr, int route) {
    const struct pd_router_config *cfg = rt->cfg;
    if (cfg->max_concurrent_requests > 0 && rt->active >= cfg->max_concurrent_requests) {
        char msg[160];
        snprintf(msg, sizeof(msg), "too many concurrent requests (--max-concurrent-requests %d)",
                 cfg->max_concurrent_requests);
        pd_warn("%s: 429 %s", pd_http_req_path(fr), msg);
        pd_http_req_add_header(fr, "retry-after", "1");
        pd__router_respond_error(fr, 429, msg);
        return;
    }
    struct rreq *rq = rreq_new(rt, fr, RREQ_GENERATE);
    if (!rq) {
        pd__router_respond_error(fr, 500, "out of memory");
        return;
    }
    rq->route = route;
    rq->counted = true;
    rt->active++;
    rt->n_total++;
    start_attempt(rq);
    rreq_maybe_free(rq);
}

/* ---------------------------------------------------------------- pass-through GETs */

static void on_proxy_data(void *ud, struct pd_upstream_call *call, const char *buf, size_t len) {
    struct rreq *rq = ud;
    pd__router_sb_put(&rq->dbuf, buf, len);
}

static void on_proxy_done(void *ud, struct pd_upstream_call *call,
                          const struct pd_upstream_result *r) {
    struct rreq *rq = ud;
    rq->dcall = NULL;
    call_end(rq, false, call_outcome(r));
    pd__router_worker_call_ended(rq->dw);
    if (!rq->finished) {
        if (r->status == PD_OK) {
            mark_finished(rq);
            const char *ct = pd_upstream_call_content_type(call);
            pd_http_respond(rq->hr, (int)r->http_status, *ct ? ct : "application/json",
                            rq->dbuf.p ? rq->dbuf.p : "", rq->dbuf.len);
            rq->hr = NULL;
        } else {
            char msg[400];
            snprintf(msg, sizeof(msg), "decode worker %s failed: %s", rq->dw->spec.url, r->error);
            finish_error(rq, r->status == PD_ETIMEDOUT ? 504 : 502, msg);
        }
    }
    rreq_maybe_free(rq);
}

/* The client's request, method and body as they came, to one healthy decode worker; its answer
 * back unchanged. */
void pd__router_handle_proxy(struct pd_router *rt, struct pd_http_req *fr, bool post) {
    struct rreq *rq = rreq_new(rt, fr, RREQ_PROXY);
    if (!rq) {
        pd__router_respond_error(fr, 500, "out of memory");
        return;
    }
    rq->dw = pd__router_worker_ref(pd__router_pick_worker(rt, false, NULL, NULL));
    if (!rq->dw) {
        finish_error(rq, 503, "no healthy decode worker");
        rreq_maybe_free(rq);
        return;
    }
    char url[600];
    snprintf(url, sizeof(url), "%s%s", rq->dw->spec.url, rq->path);
    struct pd_upstream_req req = {
        .method = post ? "POST" : "GET", .url = url, .auth = rq->auth_line, .timeout_ms = 30000};
    if (post)
        req.body = pd_http_req_body(fr, &req.body_len);
    struct pd_upstream_cbs cbs = {.on_data = on_proxy_data, .on_done = on_proxy_done};
    if (pd_upstream_call_start(rt->up, &req, &cbs, rq, &rq->dcall)) {
        rq->dcall = NULL;
        finish_error(rq, 500, pd_error_msg());
    } else {
        rq->dw->load.inflight++;
        call_start(rq, false);
    }
    rreq_maybe_free(rq);
}

static const struct {
    const char *method, *path;
    enum endpoint_kind kind;
    int route;
} endpoint_table[] = {
    {"GET", "/health", EP_HEALTH, 0},
    {"HEAD", "/health", EP_HEALTH, 0},
    {"POST", "/generate", EP_GENERATE, PD_ROUTER_ROUTE_GENERATE},
    {"POST", "/v1/completions", EP_GENERATE, PD_ROUTER_ROUTE_COMPLETIONS},
    {"POST", "/v1/chat/completions", EP_GENERATE, PD_ROUTER_ROUTE_CHAT},
    {"GET", "/v1/models", EP_PROXY_GET, 0},
    {"GET", "/health_generate", EP_PROXY_GET, 0},
    {"GET", "/model_info", EP_PROXY_GET, 0},
    {"GET", "/get_model_info", EP_PROXY_GET, 0},
    /* every worker holds the same tokenizer, so any decode answers these */
    {"POST", "/tokenize", EP_PROXY_POST, 0},
    {"POST", "/detokenize", EP_PROXY_POST, 0},
    {"POST", "/flush_cache", EP_FLUSH_CACHE, 0},
    {"GET", "/server_info", EP_SERVER_INFO, 0},
    {"GET", "/get_server_info", EP_SERVER_INFO, 0},
    {"GET", "/get_load", EP_GET_LOAD, 0},
    {"POST", "/abort_request", EP_ABORT, 0},
    {"GET", "/workers", EP_WORKERS, 0},
    {"GET", "/list_workers", EP_LIST_WORKERS, 0},
    {"GET", "/metrics", EP_METRICS, 0},
};
_Static_assert(PD_ARRAY_LEN(endpoint_table) == N_ENDPOINTS, "N_ENDPOINTS");

/* ---------------------------------------------------------------- lifecycle */

/* The static workers, then one entry per DNS name (resolved by the first dns tick). */
static int init_workers(struct pd_router *rt) {
    const struct pd_router_config *cfg = rt->cfg;
    for (int side = 0; side < 2; side++) {
        int n = side ? cfg->n_decode : cfg->n_prefill;
        for (int i = 0; i < n; i++) {
            const struct pd_router_worker_spec *c = side ? &cfg->decode[i] : &cfg->prefill[i];
            char key[320];
            struct worker *same = pd_router_url_normalize(c->url, key, sizeof(key)) == PD_OK
                                      ? pd__router_registry_find(rt, !side, key)
                                      : NULL;
            if (same) {
                pd_warn("%s %s given twice (as %s): counted once", side ? "--decode" : "--prefill",
                        c->url, same->spec.url);
                continue;
            }
            struct pd_router_worker_spec spec = *c;
            spec.url = pd_strdup(c->url);
            spec.host = pd_strdup(c->host);
            if (!spec.url || !spec.host) {
                pd_free(spec.url);
                pd_free(spec.host);
                return pd_errorf(PD_ENOMEM, "worker registry");
            }
            if (!pd__router_registry_add(rt, !side, &spec, -1, NULL))
                return pd_error_wrap(PD_ENOMEM, "worker registry");
        }
    }
    rt->n_dns = cfg->n_prefill_dns + cfg->n_decode_dns;
    rt->dns = pd_calloc((size_t)rt->n_dns + 1, sizeof(*rt->dns));
    if (!rt->dns)
        return pd_errorf(PD_ENOMEM, "dns names");
    for (int i = 0; i < rt->n_dns; i++) {
        bool pf = i < cfg->n_prefill_dns;
        rt->dns[i] = (struct dns_entry){.rt = rt,
                                        .spec = pf ? &cfg->prefill_dns[i]
                                                   : &cfg->decode_dns[i - cfg->n_prefill_dns],
                                        .is_prefill = pf,
                                        .index = i};
    }
    return PD_OK;
}

static int start_http(struct pd_router *rt) {
    const struct pd_router_config *cfg = rt->cfg;
    /* no api_key here: the router checks it (pd__router_on_request, router_endpoints.c) to keep its
     * 401 body */
    struct pd_http_server_config hc = {.host = cfg->host,
                                       .port = cfg->port,
                                       .max_body_bytes = MAX_BODY_BYTES,
                                       .max_requests_per_client =
                                           cfg->max_concurrent_requests_per_client};
    int rc = pd_tls_flags_serving(&cfg->tls)
                 ? pd_tls_server_ctx_new(cfg->tls.certfile, cfg->tls.keyfile, &hc.ssl_ctx)
                 : PD_OK;
    if (rc == PD_OK)
        rc = pd_http_server_new(rt->loop, &hc, &rt->http);
    pd_tls_ctx_free(hc.ssl_ctx); /* the server keeps its own reference */
    if (rc)
        return rc;
    for (size_t i = 0; i < N_ENDPOINTS; i++) {
        rt->endpoints[i] = (struct endpoint){
            .rt = rt, .kind = endpoint_table[i].kind, .route = endpoint_table[i].route};
        unsigned flags = PD_HTTP_PUBLIC; /* the key is checked in pd__router_on_request */
        if (endpoint_table[i].kind == EP_GENERATE)
            flags |= PD_HTTP_PER_CLIENT;
        rc = pd_http_server_route(rt->http, endpoint_table[i].method, endpoint_table[i].path, flags,
                                  pd__router_on_request, &rt->endpoints[i]);
        if (rc)
            return rc;
    }
    return pd_http_server_listen(rt->http);
}

/* --eviction-interval-secs: every worker's part of its role's prefix tree back to
 * --max-tree-size. */
static void on_evict_tick(uv_timer_t *t) {
    struct pd_router *rt = t->data;
    for (int side = 0; side < 2; side++) {
        struct pd_cache_tree *tree = rt->tree[side];
        if (!tree)
            continue;
        int oom = 0;
        size_t before = pd_cache_tree_bytes(tree);
        size_t evicted = pd_cache_tree_evict(tree, (size_t)rt->cfg->ca.max_tree_size, &oom);
        if (oom)
            pd_warn("cache_aware eviction (%s): out of memory for its work list; retried next "
                    "tick",
                    side ? "decode" : "prefill");
        if (evicted)
            pd_info("cache_aware eviction (%s): %zu bytes of marks dropped; tree %zu → %zu bytes",
                    side ? "decode" : "prefill", evicted, before, pd_cache_tree_bytes(tree));
    }
}

int pd_router_new(uv_loop_t *loop, const struct pd_router_config *cfg, struct pd_router **out) {
    int rc;
    struct pd_router *rt = pd_calloc(1, sizeof(*rt));
    if (!rt)
        return pd_errorf(PD_ENOMEM, "router");
    rt->loop = loop;
    rt->cfg = cfg;
    *out = rt; /* on failure too: see router.h */
    if ((rc = pd_router_rng_seed(&rt->rng)))
        return rc;
    if (cfg->tls.ca_certs && (rc = pd_tls_ca_check(cfg->tls.ca_certs)))
        return rc;
    if (cfg->api_key) {
        size_t n = strlen(cfg->api_key) + sizeof("Authorization: Bearer ");
        if (!(rt->worker_auth = pd_malloc(n)))
            return pd_errorf(PD_ENOMEM, "router");
        snprintf(rt->worker_auth, n, "Authorization: Bearer %s", cfg->api_key);
    }
    if (cfg->prefill_policy == PD_ROUTER_POLICY_CACHE_AWARE &&
        (rc = pd_cache_tree_new(&rt->tree[0])))
        return rc;
    if (cfg->decode_policy == PD_ROUTER_POLICY_CACHE_AWARE &&
        (rc = pd_cache_tree_new(&rt->tree[1])))
        return rc;
    if ((rc = pd_router_metrics_new(&rt->metrics)))
        return rc;
    if ((rc = init_workers(rt)))
        return rc;
    if ((rc = pd_upstream_new(loop, cfg->tls.ca_certs, &rt->up)))
        return rc;
    if ((rc = start_http(rt)))
        return rc;
    if (rt->tree[0] || rt->tree[1])
        pd_info("policy cache_aware (%s%s%s): cache threshold %g, balance thresholds %" PRId64
                " abs / %g rel, eviction every %g s to %" PRId64 " bytes per prefill",
                rt->tree[0] ? "prefill" : "", rt->tree[0] && rt->tree[1] ? ", " : "",
                rt->tree[1] ? "decode" : "", cfg->ca.cache_threshold, cfg->ca.balance_abs,
                cfg->ca.balance_rel, cfg->ca.eviction_secs, cfg->ca.max_tree_size);
    uv_timer_init(loop, &rt->health_timer);
    rt->health_timer.data = rt;
    uv_timer_init(loop, &rt->drain_timer);
    rt->drain_timer.data = rt;
    uv_timer_init(loop, &rt->dns_timer);
    rt->dns_timer.data = rt;
    uv_timer_init(loop, &rt->retry_timer);
    rt->retry_timer.data = rt;
    uv_timer_init(loop, &rt->evict_timer);
    rt->evict_timer.data = rt;
    if ((rt->tree[0] || rt->tree[1]) && cfg->ca.eviction_secs > 0) {
        uint64_t evict_every = (uint64_t)(cfg->ca.eviction_secs * 1000);
        evict_every = evict_every ? evict_every : 1;
        uv_timer_start(&rt->evict_timer, on_evict_tick, evict_every, evict_every);
    }
    uint64_t every = (uint64_t)(cfg->health_check_interval_secs * 1000);
    uv_timer_start(&rt->health_timer, pd__router_on_health_tick, 0, every ? every : 1);
    if (rt->n_dns) {
        uint64_t dns_every = (uint64_t)(cfg->dns_refresh_secs * 1000);
        uv_timer_start(&rt->dns_timer, pd__router_on_dns_tick, 0, dns_every ? dns_every : 1);
    }
    return PD_OK;
}

int pd_router_port(const struct pd_router *rt) {
    return pd_http_server_port(rt->http);
}

static void on_handle_closed(uv_handle_t *h) {
    struct pd_router *rt = h->data;
    if (--rt->open_handles > 0)
        return;
    pd_info("every handle closed");
    if (rt->done)
        rt->done(rt, rt->done_ud);
}

/* The server is closed and the aborts went out (or ABORT_FLUSH_MS passed): release the rest. */
static void close_all(struct pd_router *rt) {
    int left = pd_upstream_active(rt->up);
    if (left)
        pd_warn("%d upstream calls still open at exit; cancelling them", left);
    for (struct rreq *rq = rt->reqs, *next; rq; rq = next) {
        next = rq->next;
        PD_ASSERT(rq->finished);
        drop_pcall(rq);
        drop_dcall(rq);
        rreq_maybe_free(rq);
    }
    for (int i = 0; i < rt->prefill.n; i++)
        pd__router_stop_polls(rt->prefill.w[i]);
    for (int i = 0; i < rt->decode.n; i++)
        pd__router_stop_polls(rt->decode.w[i]);
    pd__router_worker_posts_cancel(rt);
    pd_upstream_free(rt->up); /* its own handles close on their own */
    rt->up = NULL;
    pd__router_stop_dns(rt);
    rt->open_handles = 5;
    uv_close((uv_handle_t *)&rt->evict_timer, on_handle_closed);
    uv_close((uv_handle_t *)&rt->retry_timer, on_handle_closed);
    uv_close((uv_handle_t *)&rt->dns_timer, on_handle_closed);
    uv_close((uv_handle_t *)&rt->health_timer, on_handle_closed);
    uv_close((uv_handle_t *)&rt->drain_timer, on_handle_closed);
}

static void on_final_poll(uv_timer_t *t) {
    struct pd_router *rt = t->data;
    if (pd_upstream_active(rt->up) > 0 && uv_now(rt->loop) - rt->final_since_ms < ABORT_FLUSH_MS)
        return;
    uv_timer_stop(t);
    close_all(rt);
}

static void on_http_closed(struct pd_http_server *s, void *ud) {
    struct pd_router *rt = ud;
    (void)s;
    rt->http_closed = true;
    /* health polls are over; what is left are prefill drains and aborts */
    for (int i = 0; i < rt->prefill.n; i++)
        pd__router_stop_polls(rt->prefill.w[i]);
    for (int i = 0; i < rt->decode.n; i++)
        pd__router_stop_polls(rt->decode.w[i]);
    rt->final_since_ms = uv_now(rt->loop);
    uv_timer_start(&rt->drain_timer, on_final_poll, 0, FINAL_POLL_MS);
}

/* A worker stopped answering (router_workers.c: check_silence): each request with a call on it
 * ends that attempt as a failed call would: aborted on both workers, retried on another pair
 * when its client has no byte yet, else ended with an error (502, or an SSE error event). */
void pd__router_give_up_worker(struct pd_router *rt, struct worker *w, const char *why) {
    int n = 0;
    char msg[400];
    snprintf(msg, sizeof(msg), "%s worker %s stopped answering: %s", pd__router_role(w),
             w->spec.url, why);
    for (struct rreq *rq = rt->reqs, *next; rq; rq = next) {
        next = rq->next;
        if (rq->finished || rq->kind != RREQ_GENERATE)
            continue;
        bool on_p = rq->pcall && rq->pw == w, on_d = rq->dcall && rq->dw == w;
        if (!on_p && !on_d)
            continue;
        n++;
        judge(rq, on_p, false);
        abort_all_rids(rq, rq->pw);
        abort_all_rids(rq, rq->dw);
        drop_pcall(rq);
        drop_dcall(rq);
        if (can_retry(rq)) {
            schedule_retry(rq, msg);
        } else {
            retries_exhausted(rq);
            finish_error(rq, 502, msg);
        }
        rreq_maybe_free(rq);
    }
    pd_warn("%s; %d request%s given up", msg, n, n == 1 ? "" : "s");
}

/* The drain deadline: abort what is still in flight; each client gets an error. */
static void abort_inflight(struct pd_router *rt) {
    rt->draining_done = true;
    int n = 0;
    for (struct rreq *rq = rt->reqs; rq; rq = rq->next)
        n += !rq->finished;
    if (n)
        pd_warn("shutdown deadline: aborting %d requests still in flight", n);
    for (struct rreq *rq = rt->reqs, *next; rq; rq = next) {
        next = rq->next;
        if (rq->finished)
            continue;
        if (rq->kind == RREQ_GENERATE && rq->pw) {
            abort_all_rids(rq, rq->pw);
            abort_all_rids(rq, rq->dw);
        }
        drop_pcall(rq);
        drop_dcall(rq);
        finish_error(rq, 503, "the router is shutting down");
        rreq_maybe_free(rq);
    }
}

static void on_drain_deadline(uv_timer_t *t) {
    abort_inflight(t->data);
}

void pd_router_shutdown(struct pd_router *rt, uint64_t timeout_ms, pd_router_done_fn done,
                        void *ud) {
    if (rt->shutting_down) {
        if (!rt->draining_done && !rt->http_closed) {
            pd_info("second stop request: aborting what is in flight now");
            uv_timer_stop(&rt->drain_timer);
            abort_inflight(rt);
        }
        return;
    }
    rt->shutting_down = true;
    rt->done = done;
    rt->done_ud = ud;
    pd_info("shutting down: %d requests in flight, waiting up to %llu ms", rt->active,
            (unsigned long long)timeout_ms);
    uv_timer_stop(&rt->health_timer);
    uv_timer_stop(&rt->dns_timer);
    pd__router_stop_dns(rt);
    uv_timer_start(&rt->drain_timer, on_drain_deadline, timeout_ms, 0);
    pd_http_server_shutdown(rt->http, timeout_ms + CUT_GRACE_MS, on_http_closed, rt);
}

void pd_router_free(struct pd_router *rt) {
    if (!rt)
        return;
    PD_ASSERT(rt->reqs == NULL);
    pd_http_server_free(rt->http);
    pd__router_stop_dns(rt);
    while (rt->prefill.n)
        pd__router_registry_remove(rt->prefill.w[rt->prefill.n - 1]);
    while (rt->decode.n)
        pd__router_registry_remove(rt->decode.w[rt->decode.n - 1]);
    pd_free(rt->prefill.w);
    pd_free(rt->decode.w);
    pd_free(rt->scratch);
    pd_free(rt->ca_by_tenant);
    pd_free(rt->ca_matched);
    pd_free(rt->ca_size);
    pd_cache_tree_free(rt->tree[0]);
    pd_cache_tree_free(rt->tree[1]);
    pd_free(rt->dns);
    pd_router_metrics_free(rt->metrics);
    pd_free(rt->worker_auth);
    pd_free(rt);
}
