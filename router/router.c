/*
 * router.c — the router's registry, health/load polling and request flow (see router.h).
 *
 * A generation request (struct rreq) holds at most one prefill call and one decode call; each
 * worker's `inflight` counts the calls the router has on it. Nothing reaches the client before
 * decode's first body byte, so until then any failure can still become a clean error status, and
 * a worker that could not be reached can be retried once on another pair (new room). Decode's
 * SSE goes through byte for byte as it arrives; any other answer is buffered and sent whole with
 * decode's status. A request is freed once the client's answer is finished (or the client left)
 * and both upstream calls are over. Aborts (POST /abort_request {"rid"}) are fire-and-forget.
 * Prefill 4xx answers (the request's fault) reach the client as they are; prefill 5xx and
 * transport failures become 502; timeouts 504.
 */
#include "router/router.h"

#include "router/body.h"
#include "router/front.h"
#include "router/policy.h"
#include "router/upstream.h"

#include "common/alloc.h"
#include "common/log.h"
#include "common/status.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#define MAX_BODY_BYTES (64u << 20)
#define PREFILL_ERR_KEEP 1024 /* bytes of a failed prefill's body quoted in the error */
#define ABORT_TIMEOUT_MS 5000

struct sbuf {
    char *p;
    size_t len, cap;
};

static int sb_put(struct sbuf *b, const char *s, size_t n) {
    if (pd_array_grow((void **)&b->p, &b->cap, b->len + n + 1, 1))
        return PD_ENOMEM;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return PD_OK;
}

struct worker {
    struct pd_router *rt;
    const struct pd_router_worker_spec *spec;
    struct pd_router_load *load;
    bool is_prefill;
    struct pd_upstream_call *health_call, *load_call;
    struct sbuf load_body;
    char last_error[160];
};

enum rreq_kind { RREQ_GENERATE, RREQ_PROXY };

struct rreq {
    struct pd_router *rt;
    struct rreq *prev, *next;
    enum rreq_kind kind;
    struct pd_front_req *fr;
    bool finished; /* the client's answer is done (or the client left) */
    bool counted;  /* holds a --max-concurrent-requests slot */
    int route;
    char *path;
    char *auth_line; /* "Authorization: ..." forwarded to the workers, or NULL */
    int attempt;
    int p, d;           /* chosen workers, -1 before */
    int prev_p, prev_d; /* the first attempt's pair, avoided by the retry */
    struct pd_router_body_info info;
    char *sent; /* body with the bootstrap fields */
    size_t sent_len;
    struct pd_upstream_call *pcall, *dcall;
    bool streaming; /* client answer started as a stream */
    struct sbuf dbuf, perr;
};

struct pd_router {
    uv_loop_t *loop;
    const struct pd_router_config *cfg;
    struct pd_front *front;
    struct pd_upstream *up;
    struct pd_router_rng rng;
    struct worker *prefill, *decode;
    struct pd_router_load *prefill_load, *decode_load;
    uint64_t rr_prefill, rr_decode;
    uv_timer_t health_timer;
    int active;
    uint64_t n_total, n_failed, n_retried;
    struct rreq *reqs;
    bool shutting_down;
};

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

static void respond_json(struct pd_front_req *fr, int status, const char *json) {
    pd_front_respond(fr, status, "application/json", json, strlen(json));
}

static void respond_error(struct pd_front_req *fr, int status, const char *msg) {
    char *j = error_json(status, msg);
    const char *fallback = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                           "\"param\":null,\"code\":500}}";
    respond_json(fr, j ? status : 500, j ? j : fallback);
    cJSON_free(j);
}

static void respond_cjson(struct pd_front_req *fr, int status, cJSON *root) {
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!s) {
        respond_error(fr, 500, "out of memory");
        return;
    }
    respond_json(fr, status, s);
    cJSON_free(s);
}

/* ---------------------------------------------------------------- workers */

static void set_healthy(struct worker *w, bool ok, const char *why) {
    if (ok && !w->load->healthy)
        pd_info("worker %s (%s) in rotation: /health answered 200", w->spec->url,
                w->is_prefill ? "prefill" : "decode");
    else if (!ok && w->load->healthy)
        pd_warn("worker %s (%s) out of rotation: %s", w->spec->url,
                w->is_prefill ? "prefill" : "decode", why);
    if (!ok)
        snprintf(w->last_error, sizeof(w->last_error), "%s", why);
    else
        w->last_error[0] = '\0';
    w->load->healthy = ok;
}

static void on_health_done(void *ud, struct pd_upstream_call *call,
                           const struct pd_upstream_result *r) {
    struct worker *w = ud;
    w->health_call = NULL;
    if (r->status == PD_OK && r->http_status == 200) {
        set_healthy(w, true, "");
        return;
    }
    char why[160];
    if (r->status != PD_OK)
        snprintf(why, sizeof(why), "/health failed: %s", r->error);
    else
        snprintf(why, sizeof(why), "/health answered %ld", r->http_status);
    set_healthy(w, false, why);
}

static void on_load_data(void *ud, struct pd_upstream_call *call, const char *buf, size_t len) {
    struct worker *w = ud;
    if (w->load_body.len < 65536)
        sb_put(&w->load_body, buf, len);
}

/* {"load": N} (API.md), or SGLang's per-rank list [{"num_reqs", "num_waiting_reqs"}, ...]. */
static bool parse_load(const char *s, int64_t *out) {
    cJSON *j = cJSON_Parse(s);
    if (!j)
        return false;
    bool ok = false;
    double total = 0;
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(j, "load");
    if (cJSON_IsNumber(l)) {
        total = l->valuedouble;
        ok = true;
    } else if (cJSON_IsArray(j)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, j) {
            const cJSON *a = cJSON_GetObjectItemCaseSensitive(e, "load");
            const cJSON *b = cJSON_GetObjectItemCaseSensitive(e, "num_reqs");
            const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "num_waiting_reqs");
            total += cJSON_IsNumber(a) ? a->valuedouble
                                       : (cJSON_IsNumber(b) ? b->valuedouble : 0) +
                                             (cJSON_IsNumber(c) ? c->valuedouble : 0);
        }
        ok = true;
    }
    cJSON_Delete(j);
    *out = total < 0 ? 0 : (int64_t)total;
    return ok;
}

static void on_load_done(void *ud, struct pd_upstream_call *call,
                         const struct pd_upstream_result *r) {
    struct worker *w = ud;
    w->load_call = NULL;
    int64_t load;
    if (r->status == PD_OK && r->http_status == 200 && w->load_body.p &&
        parse_load(w->load_body.p, &load))
        w->load->polled = load;
    w->load_body.len = 0;
}

static long health_timeout_ms(const struct pd_router *rt) {
    long ms = (long)(rt->cfg->health_check_interval_secs * 2000);
    return ms < 1000 ? 1000 : ms > 10000 ? 10000 : ms;
}

static void poll_worker(struct pd_router *rt, struct worker *w) {
    char url[600];
    struct pd_upstream_req req = {.method = "GET", .url = url, .timeout_ms = health_timeout_ms(rt)};
    if (!w->health_call) {
        snprintf(url, sizeof(url), "%s/health", w->spec->url);
        struct pd_upstream_cbs cbs = {.on_done = on_health_done};
        if (pd_upstream_call_start(rt->up, &req, &cbs, w, &w->health_call))
            w->health_call = NULL;
    }
    if (!w->load_call && w->load->healthy) {
        snprintf(url, sizeof(url), "%s/get_load", w->spec->url);
        struct pd_upstream_cbs cbs = {.on_data = on_load_data, .on_done = on_load_done};
        w->load_body.len = 0;
        if (pd_upstream_call_start(rt->up, &req, &cbs, w, &w->load_call))
            w->load_call = NULL;
    }
}

static void on_health_tick(uv_timer_t *t) {
    struct pd_router *rt = t->data;
    for (int i = 0; i < rt->cfg->n_prefill; i++)
        poll_worker(rt, &rt->prefill[i]);
    for (int i = 0; i < rt->cfg->n_decode; i++)
        poll_worker(rt, &rt->decode[i]);
}

/* ---------------------------------------------------------------- aborts */

static void on_abort_done(void *ud, struct pd_upstream_call *call,
                          const struct pd_upstream_result *r) {
    char *what = ud;
    if (r->status != PD_OK || r->http_status / 100 != 2)
        pd_debug("abort %s: %s (HTTP %ld)", what, r->status ? r->error : "answered",
                 r->http_status);
    pd_free(what);
}

static void send_abort(struct pd_router *rt, const struct worker *w, const char *rid,
                       const char *auth_line) {
    char url[600];
    snprintf(url, sizeof(url), "%s/abort_request", w->spec->url);
    char *body = pd_router_abort_body(rid);
    size_t wl = strlen(url) + strlen(rid) + 8;
    char *what = pd_malloc(wl);
    if (!body || !what) {
        pd_free(body);
        pd_free(what);
        pd_error("rid=%s: out of memory aborting on %s", rid, w->spec->url);
        return;
    }
    snprintf(what, wl, "%s rid=%s", url, rid);
    struct pd_upstream_req req = {.method = "POST",
                                  .url = url,
                                  .body = body,
                                  .body_len = strlen(body),
                                  .auth = auth_line,
                                  .timeout_ms = ABORT_TIMEOUT_MS};
    struct pd_upstream_cbs cbs = {.on_done = on_abort_done};
    pd_info("rid=%s: abort on %s (%s)", rid, w->spec->url, w->is_prefill ? "prefill" : "decode");
    if (pd_upstream_call_start(rt->up, &req, &cbs, what, NULL))
        pd_free(what);
    pd_free(body);
}

static void abort_all_rids(struct rreq *rq, const struct worker *w) {
    for (int i = 0; i < rq->info.n; i++)
        send_abort(rq->rt, w, rq->info.rids[i], rq->auth_line);
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
    pd_router_body_info_free(&rq->info);
    pd_free(rq->sent);
    pd_free(rq->path);
    pd_free(rq->auth_line);
    pd_free(rq->dbuf.p);
    pd_free(rq->perr.p);
    pd_free(rq);
}

static void drop_pcall(struct rreq *rq) {
    if (!rq->pcall)
        return;
    pd_upstream_call_cancel(rq->pcall);
    rq->pcall = NULL;
    rq->rt->prefill_load[rq->p].inflight--;
}

static void drop_dcall(struct rreq *rq) {
    if (!rq->dcall)
        return;
    pd_upstream_call_cancel(rq->dcall);
    rq->dcall = NULL;
    rq->rt->decode_load[rq->d].inflight--;
}

/* Ends the client's answer with an error: a status + JSON before anything was sent, else one
 * SSE error event and [DONE] (API.md: never a silent stop). */
static void finish_error(struct rreq *rq, int status, const char *msg) {
    if (rq->finished)
        return;
    rq->finished = true;
    rq->rt->n_failed++;
    if (rq->info.n)
        pd_warn("room=%" PRIu64 " rid=%s: %d %s", rq->info.rooms[0], rq->info.rids[0], status, msg);
    else
        pd_warn("%s: %d %s", rq->path, status, msg);
    if (!rq->streaming) {
        respond_error(rq->fr, status, msg);
        return;
    }
    char *j = error_json(status, msg);
    struct sbuf ev = {0};
    sb_put(&ev, "data: ", 6);
    if (j)
        sb_put(&ev, j, strlen(j));
    sb_put(&ev, "\n\ndata: [DONE]\n\n", 16);
    if (ev.p)
        pd_front_stream_send(rq->fr, ev.p, ev.len);
    pd_front_stream_end(rq->fr);
    pd_free(ev.p);
    cJSON_free(j);
}

static void on_client_gone(void *ud) {
    struct rreq *rq = ud;
    if (rq->finished)
        return;
    rq->finished = true; /* the front's finish comes below */
    if (rq->kind == RREQ_GENERATE && rq->p >= 0) {
        pd_info("room=%" PRIu64 " rid=%s: client gone; aborting on both workers", rq->info.rooms[0],
                rq->info.rids[0]);
        abort_all_rids(rq, &rq->rt->prefill[rq->p]);
        abort_all_rids(rq, &rq->rt->decode[rq->d]);
    }
    drop_pcall(rq);
    drop_dcall(rq);
    if (rq->streaming)
        pd_front_stream_end(rq->fr);
    else
        pd_front_respond(rq->fr, 499, NULL, "", 0); /* nobody reads it */
    rreq_maybe_free(rq);
}

static int start_attempt(struct rreq *rq);

/* A transport failure before the client saw anything: retry once on another pair. False when
 * no retry is allowed; otherwise the retry started or the client got an error from it. */
static bool try_again(struct rreq *rq) {
    if (rq->attempt > 0 || rq->streaming || rq->finished || rq->rt->shutting_down)
        return false;
    rq->attempt++;
    rq->rt->n_retried++;
    rq->prev_p = rq->p;
    rq->prev_d = rq->d;
    pd_router_body_info_free(&rq->info);
    pd_free(rq->sent);
    rq->sent = NULL;
    rq->dbuf.len = rq->perr.len = 0;
    start_attempt(rq); /* answers the client itself when it cannot start */
    rreq_maybe_free(rq);
    return true;
}

static void on_prefill_data(void *ud, struct pd_upstream_call *call, const char *buf, size_t len) {
    struct rreq *rq = ud;
    if (rq->perr.len < PREFILL_ERR_KEEP)
        sb_put(&rq->perr, buf, len < PREFILL_ERR_KEEP ? len : PREFILL_ERR_KEEP);
}

static void on_prefill_done(void *ud, struct pd_upstream_call *call,
                            const struct pd_upstream_result *r) {
    struct rreq *rq = ud;
    struct pd_router *rt = rq->rt;
    struct worker *pw = &rt->prefill[rq->p];
    rq->pcall = NULL;
    rt->prefill_load[rq->p].inflight--;
    bool ok = r->status == PD_OK && r->http_status / 100 == 2;
    if (ok || !rq->dcall) {
        /* drained; or decode already answered the client */
        if (!ok)
            pd_warn("room=%" PRIu64 ": prefill %s failed after decode finished: %s",
                    rq->info.rooms[0], pw->spec->url, r->status ? r->error : "non-2xx answer");
        rreq_maybe_free(rq);
        return;
    }
    char msg[PREFILL_ERR_KEEP + 256];
    if (r->status != PD_OK && r->status != PD_ETIMEDOUT) {
        char why[200];
        snprintf(why, sizeof(why), "request failed: %s", r->error);
        set_healthy(pw, false, why);
    }
    /* decode is waiting for a transfer that will not come: abort it there */
    abort_all_rids(rq, &rt->decode[rq->d]);
    drop_dcall(rq);
    if (r->status != PD_OK && r->status != PD_ETIMEDOUT && !rq->streaming && rq->attempt == 0 &&
        !rq->finished) {
        pd_warn("room=%" PRIu64 ": prefill %s unreachable (%s); retrying on another pair",
                rq->info.rooms[0], pw->spec->url, r->error);
        if (try_again(rq))
            return;
    }
    if (r->status == PD_OK && r->http_status / 100 == 4 && !rq->streaming && !rq->finished) {
        /* the request's own fault: the client sees prefill's answer */
        rq->finished = true;
        const char *b = rq->perr.p ? rq->perr.p : "";
        pd_front_respond(rq->fr, (int)r->http_status, pd_upstream_call_content_type(call), b,
                         rq->perr.len);
        rreq_maybe_free(rq);
        return;
    }
    if (r->status == PD_ETIMEDOUT)
        snprintf(msg, sizeof(msg), "prefill worker %s timed out after %d s", pw->spec->url,
                 rt->cfg->request_timeout_secs);
    else if (r->status != PD_OK)
        snprintf(msg, sizeof(msg), "prefill worker %s failed: %s", pw->spec->url, r->error);
    else
        snprintf(msg, sizeof(msg), "prefill worker %s answered %ld: %.*s", pw->spec->url,
                 r->http_status, (int)rq->perr.len, rq->perr.p ? rq->perr.p : "");
    finish_error(rq, r->status == PD_ETIMEDOUT ? 504 : 502, msg);
    rreq_maybe_free(rq);
}

static void on_decode_data(void *ud, struct pd_upstream_call *call, const char *buf, size_t len) {
    struct rreq *rq = ud;
    if (rq->finished)
        return;
    if (!rq->streaming) {
        long st = pd_upstream_call_http_status(call);
        const char *ct = pd_upstream_call_content_type(call);
        if (st / 100 == 2 && strncmp(ct, "text/event-stream", 17) == 0) {
            rq->streaming = true;
            pd_front_stream_start(rq->fr, (int)st, ct);
        }
    }
    if (rq->streaming)
        pd_front_stream_send(rq->fr, buf, len);
    else if (sb_put(&rq->dbuf, buf, len))
        pd_error("room=%" PRIu64 ": out of memory buffering decode's answer", rq->info.rooms[0]);
}

static void on_decode_done(void *ud, struct pd_upstream_call *call,
                           const struct pd_upstream_result *r) {
    struct rreq *rq = ud;
    struct pd_router *rt = rq->rt;
    struct worker *dw = &rt->decode[rq->d];
    rq->dcall = NULL;
    rt->decode_load[rq->d].inflight--;
    if (rq->finished) {
        rreq_maybe_free(rq);
        return;
    }
    if (r->status == PD_OK) {
        if (r->http_status / 100 != 2 && rq->pcall) {
            abort_all_rids(rq, &rt->prefill[rq->p]);
            drop_pcall(rq);
        }
        rq->finished = true;
        if (rq->streaming) {
            pd_front_stream_end(rq->fr);
        } else {
            const char *ct = pd_upstream_call_content_type(call);
            pd_front_respond(rq->fr, (int)r->http_status, *ct ? ct : "application/json",
                             rq->dbuf.p ? rq->dbuf.p : "", rq->dbuf.len);
        }
        rreq_maybe_free(rq);
        return;
    }
    /* transport failure or timeout */
    if (r->status != PD_ETIMEDOUT) {
        char why[200];
        snprintf(why, sizeof(why), "request failed: %s", r->error);
        set_healthy(dw, false, why);
    }
    if (rq->pcall) {
        abort_all_rids(rq, &rt->prefill[rq->p]);
        drop_pcall(rq);
    }
    if (r->status != PD_ETIMEDOUT && !rq->streaming && rq->attempt == 0) {
        pd_warn("room=%" PRIu64 ": decode %s unreachable (%s); retrying on another pair",
                rq->info.rooms[0], dw->spec->url, r->error);
        if (try_again(rq))
            return;
    }
    if (r->status == PD_ETIMEDOUT)
        abort_all_rids(rq, dw);
    char msg[400];
    if (r->status == PD_ETIMEDOUT)
        snprintf(msg, sizeof(msg), "decode worker %s timed out after %d s", dw->spec->url,
                 rt->cfg->request_timeout_secs);
    else
        snprintf(msg, sizeof(msg), "decode worker %s failed: %s", dw->spec->url, r->error);
    finish_error(rq, r->status == PD_ETIMEDOUT ? 504 : 502, msg);
    rreq_maybe_free(rq);
}

/* Picks a pair, rewrites the body, sends it to both. On failure the client has been answered
 * (rq->finished) and the status is returned. */
static int start_attempt(struct rreq *rq) {
    struct pd_router *rt = rq->rt;
    const struct pd_router_config *cfg = rt->cfg;
    /* a retry avoids both workers of the failed pair where another one is healthy (the one
     * that failed is out of rotation anyway) */
    rq->p = pd_router_pick(cfg->policy, rt->prefill_load, cfg->n_prefill, rq->prev_p,
                           &rt->rr_prefill, &rt->rng);
    if (rq->p < 0 && rq->prev_p >= 0)
        rq->p = pd_router_pick(cfg->policy, rt->prefill_load, cfg->n_prefill, -1, &rt->rr_prefill,
                               &rt->rng);
    rq->d = pd_router_pick_least_load(rt->decode_load, cfg->n_decode, rq->prev_d, &rt->rr_decode);
    if (rq->d < 0 && rq->prev_d >= 0)
        rq->d = pd_router_pick_least_load(rt->decode_load, cfg->n_decode, -1, &rt->rr_decode);
    if (rq->p < 0 || rq->d < 0) {
        int p = rq->p;
        rq->p = rq->d = -1;
        finish_error(rq, 503, p < 0 ? "no healthy prefill worker" : "no healthy decode worker");
        return PD_EAGAIN;
    }
    const struct worker *pw = &rt->prefill[rq->p], *dw = &rt->decode[rq->d];
    size_t len;
    const char *body = pd_front_req_body(rq->fr, &len);
    int rc = pd_router_body_rewrite(rq->route, body, len, pw->spec->host, pw->spec->bootstrap_port,
                                    &rt->rng, &rq->sent, &rq->sent_len, &rq->info);
    if (rc) {
        rq->p = rq->d = -1;
        finish_error(rq, rc == PD_ENOMEM ? 500 : 400, pd_error_msg());
        return rc;
    }
    char url[600];
    struct pd_upstream_req req = {.method = "POST",
                                  .url = url,
                                  .body = rq->sent,
                                  .body_len = rq->sent_len,
                                  .auth = rq->auth_line,
                                  .timeout_ms = (long)cfg->request_timeout_secs * 1000,
                                  .connect_timeout_ms = 10000};
    pd_info("room=%" PRIu64 " rid=%s: %s%s → prefill %s, decode %s%s", rq->info.rooms[0],
            rq->info.rids[0], rq->path, rq->info.stream ? " (stream)" : "", pw->spec->url,
            dw->spec->url, rq->attempt ? " (retry)" : "");
    struct pd_upstream_cbs pcbs = {.on_data = on_prefill_data, .on_done = on_prefill_done};
    struct pd_upstream_cbs dcbs = {.on_data = on_decode_data, .on_done = on_decode_done};
    snprintf(url, sizeof(url), "%s%s", dw->spec->url, rq->path);
    rc = pd_upstream_call_start(rt->up, &req, &dcbs, rq, &rq->dcall);
    if (rc == PD_OK) {
        rt->decode_load[rq->d].inflight++;
        snprintf(url, sizeof(url), "%s%s", pw->spec->url, rq->path);
        rc = pd_upstream_call_start(rt->up, &req, &pcbs, rq, &rq->pcall);
        if (rc == PD_OK)
            rt->prefill_load[rq->p].inflight++;
        else
            drop_dcall(rq);
    }
    if (rc) {
        rq->dcall = rq->pcall = NULL;
        finish_error(rq, 500, pd_error_msg());
        return rc;
    }
    return PD_OK;
}

static struct rreq *rreq_new(struct pd_router *rt, struct pd_front_req *fr, enum rreq_kind kind) {
    struct rreq *rq = pd_calloc(1, sizeof(*rq));
    if (!rq)
        return NULL;
    rq->rt = rt;
    rq->fr = fr;
    rq->kind = kind;
    rq->p = rq->d = rq->prev_p = rq->prev_d = -1;
    rq->path = pd_strdup(pd_front_req_path(fr));
    const char *auth = pd_front_req_authorization(fr);
    if (auth) {
        size_t n = strlen(auth) + sizeof("Authorization: ");
        if ((rq->auth_line = pd_malloc(n)))
            snprintf(rq->auth_line, n, "Authorization: %s", auth);
    }
    if (!rq->path || (auth && !rq->auth_line)) {
        pd_free(rq->path);
        pd_free(rq->auth_line);
        pd_free(rq);
        return NULL;
    }
    rq->next = rt->reqs;
    if (rt->reqs)
        rt->reqs->prev = rq;
    rt->reqs = rq;
    pd_front_req_on_gone(fr, on_client_gone, rq);
    return rq;
}

static void handle_generate(struct pd_router *rt, struct pd_front_req *fr, int route) {
    const struct pd_router_config *cfg = rt->cfg;
    if (cfg->max_concurrent_requests > 0 && rt->active >= cfg->max_concurrent_requests) {
        char msg[160];
        snprintf(msg, sizeof(msg), "too many concurrent requests (--max-concurrent-requests %d)",
                 cfg->max_concurrent_requests);
        pd_warn("%s: 429 %s", pd_front_req_path(fr), msg);
        respond_error(fr, 429, msg);
        return;
    }
    struct rreq *rq = rreq_new(rt, fr, RREQ_GENERATE);
    if (!rq) {
        respond_error(fr, 500, "out of memory");
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
    sb_put(&rq->dbuf, buf, len);
}

static void on_proxy_done(void *ud, struct pd_upstream_call *call,
                          const struct pd_upstream_result *r) {
    struct rreq *rq = ud;
    struct pd_router *rt = rq->rt;
    rq->dcall = NULL;
    rt->decode_load[rq->d].inflight--;
    if (!rq->finished) {
        if (r->status == PD_OK) {
            rq->finished = true;
            const char *ct = pd_upstream_call_content_type(call);
            pd_front_respond(rq->fr, (int)r->http_status, *ct ? ct : "application/json",
                             rq->dbuf.p ? rq->dbuf.p : "", rq->dbuf.len);
        } else {
            char msg[400];
            snprintf(msg, sizeof(msg), "decode worker %s failed: %s", rt->decode[rq->d].spec->url,
                     r->error);
            finish_error(rq, r->status == PD_ETIMEDOUT ? 504 : 502, msg);
        }
    }
    rreq_maybe_free(rq);
}

static void handle_proxy_get(struct pd_router *rt, struct pd_front_req *fr) {
    struct rreq *rq = rreq_new(rt, fr, RREQ_PROXY);
    if (!rq) {
        respond_error(fr, 500, "out of memory");
        return;
    }
    rq->d = pd_router_pick_least_load(rt->decode_load, rt->cfg->n_decode, -1, &rt->rr_decode);
    if (rq->d < 0) {
        finish_error(rq, 503, "no healthy decode worker");
        rreq_maybe_free(rq);
        return;
    }
    char url[600];
    snprintf(url, sizeof(url), "%s%s", rt->decode[rq->d].spec->url, rq->path);
    struct pd_upstream_req req = {
        .method = "GET", .url = url, .auth = rq->auth_line, .timeout_ms = 30000};
    struct pd_upstream_cbs cbs = {.on_data = on_proxy_data, .on_done = on_proxy_done};
    if (pd_upstream_call_start(rt->up, &req, &cbs, rq, &rq->dcall)) {
        rq->dcall = NULL;
        finish_error(rq, 500, pd_error_msg());
    } else {
        rt->decode_load[rq->d].inflight++;
    }
    rreq_maybe_free(rq);
}

/* ---------------------------------------------------------------- router's own endpoints */

static int count_healthy(const struct pd_router_load *l, int n) {
    int k = 0;
    for (int i = 0; i < n; i++)
        k += l[i].healthy;
    return k;
}

static cJSON *workers_json(const struct pd_router *rt) {
    cJSON *arr = cJSON_CreateArray();
    for (int side = 0; side < 2; side++) {
        int n = side ? rt->cfg->n_decode : rt->cfg->n_prefill;
        for (int i = 0; i < n; i++) {
            const struct worker *w = side ? &rt->decode[i] : &rt->prefill[i];
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "url", w->spec->url);
            cJSON_AddStringToObject(o, "worker_type", side ? "decode" : "prefill");
            if (!side) {
                if (w->spec->bootstrap_port == PD_ROUTER_BOOTSTRAP_PORT_NULL)
                    cJSON_AddNullToObject(o, "bootstrap_port");
                else
                    cJSON_AddNumberToObject(o, "bootstrap_port", w->spec->bootstrap_port);
            }
            cJSON_AddBoolToObject(o, "healthy", w->load->healthy);
            cJSON_AddNumberToObject(o, "load", (double)w->load->polled);
            cJSON_AddNumberToObject(o, "router_inflight", (double)w->load->inflight);
            if (w->last_error[0])
                cJSON_AddStringToObject(o, "last_error", w->last_error);
            cJSON_AddItemToArray(arr, o);
        }
    }
    return arr;
}

static void handle_server_info(struct pd_router *rt, struct pd_front_req *fr) {
    const struct pd_router_config *cfg = rt->cfg;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "version", PD_VERSION);
    cJSON_AddStringToObject(o, "disaggregation_mode", "router");
    cJSON_AddBoolToObject(o, "pd_disaggregation", true);
    cJSON_AddStringToObject(o, "policy", pd_router_policy_names[cfg->policy]);
    cJSON_AddStringToObject(o, "host", cfg->host);
    cJSON_AddNumberToObject(o, "port", pd_front_port(rt->front));
    cJSON_AddBoolToObject(o, "api_key_required", cfg->api_key != NULL);
    cJSON_AddNumberToObject(o, "request_timeout_secs", cfg->request_timeout_secs);
    cJSON_AddNumberToObject(o, "max_concurrent_requests", cfg->max_concurrent_requests);
    cJSON_AddNumberToObject(o, "health_check_interval_secs", cfg->health_check_interval_secs);
    cJSON_AddNumberToObject(o, "num_running_reqs", rt->active);
    cJSON_AddNumberToObject(o, "num_requests_total", (double)rt->n_total);
    cJSON_AddNumberToObject(o, "num_failed_requests_total", (double)rt->n_failed);
    cJSON_AddNumberToObject(o, "num_retried_requests_total", (double)rt->n_retried);
    cJSON_AddItemToObject(o, "workers", workers_json(rt));
    /* benchmark clients index internal_states[0] */
    cJSON *states = cJSON_AddArrayToObject(o, "internal_states");
    cJSON_AddItemToArray(states, cJSON_CreateObject());
    respond_cjson(fr, 200, o);
}

static void handle_get_load(struct pd_router *rt, struct pd_front_req *fr) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "load", rt->active);
    cJSON_AddItemToObject(o, "workers", workers_json(rt));
    respond_cjson(fr, 200, o);
}

static void handle_health(struct pd_router *rt, struct pd_front_req *fr) {
    int hp = count_healthy(rt->prefill_load, rt->cfg->n_prefill);
    int hd = count_healthy(rt->decode_load, rt->cfg->n_decode);
    if (hp > 0 && hd > 0 && !rt->shutting_down) {
        pd_front_respond(fr, 200, "text/plain", "", 0);
        return;
    }
    char msg[160];
    snprintf(msg, sizeof(msg), "not ready: %d/%d prefill and %d/%d decode workers healthy", hp,
             rt->cfg->n_prefill, hd, rt->cfg->n_decode);
    respond_error(fr, 503, msg);
}

/* POST /abort_request from a client: the rid may live on any worker; tell them all. */
static void handle_abort(struct pd_router *rt, struct pd_front_req *fr) {
    size_t len;
    const char *body = pd_front_req_body(fr, &len);
    cJSON *j = cJSON_ParseWithLength(body, len);
    const cJSON *rid = cJSON_GetObjectItemCaseSensitive(j, "rid");
    if (!cJSON_IsString(rid)) {
        cJSON_Delete(j);
        respond_error(fr, 400, "abort_request needs {\"rid\": \"...\"}");
        return;
    }
    const char *auth = pd_front_req_authorization(fr);
    char line[512];
    if (auth)
        snprintf(line, sizeof(line), "Authorization: %s", auth);
    for (int i = 0; i < rt->cfg->n_prefill; i++)
        send_abort(rt, &rt->prefill[i], rid->valuestring, auth ? line : NULL);
    for (int i = 0; i < rt->cfg->n_decode; i++)
        send_abort(rt, &rt->decode[i], rid->valuestring, auth ? line : NULL);
    cJSON_Delete(j);
    respond_json(fr, 200, "{}");
}

static bool authorized(const struct pd_router *rt, struct pd_front_req *fr) {
    const char *key = rt->cfg->api_key;
    if (!key)
        return true;
    const char *a = pd_front_req_authorization(fr);
    return a && strncmp(a, "Bearer ", 7) == 0 && strcmp(a + 7, key) == 0;
}

static void on_request(void *ud, struct pd_front_req *fr) {
    struct pd_router *rt = ud;
    const char *m = pd_front_req_method(fr), *path = pd_front_req_path(fr);
    bool get = strcmp(m, "GET") == 0 || strcmp(m, "HEAD") == 0, post = strcmp(m, "POST") == 0;
    if (rt->shutting_down) {
        respond_error(fr, 503, "the router is shutting down");
        return;
    }
    if (strcmp(path, "/health") == 0 && get) {
        handle_health(rt, fr);
        return;
    }
    if (!authorized(rt, fr)) {
        respond_error(fr, 401, "invalid or missing API key (Authorization: Bearer ...)");
        return;
    }
    static const struct {
        const char *path;
        int route;
    } gen[] = {{"/generate", PD_ROUTER_ROUTE_GENERATE},
               {"/v1/completions", PD_ROUTER_ROUTE_COMPLETIONS},
               {"/v1/chat/completions", PD_ROUTER_ROUTE_CHAT}};
    for (size_t i = 0; i < PD_ARRAY_LEN(gen); i++) {
        if (strcmp(path, gen[i].path) == 0) {
            if (post)
                handle_generate(rt, fr, gen[i].route);
            else
                respond_error(fr, 405, "use POST");
            return;
        }
    }
    if (get && (strcmp(path, "/v1/models") == 0 || strcmp(path, "/health_generate") == 0 ||
                strcmp(path, "/model_info") == 0 || strcmp(path, "/get_model_info") == 0)) {
        handle_proxy_get(rt, fr);
    } else if (get &&
               (strcmp(path, "/server_info") == 0 || strcmp(path, "/get_server_info") == 0)) {
        handle_server_info(rt, fr);
    } else if (get && strcmp(path, "/get_load") == 0) {
        handle_get_load(rt, fr);
    } else if (post && strcmp(path, "/abort_request") == 0) {
        handle_abort(rt, fr);
    } else {
        char msg[300];
        snprintf(msg, sizeof(msg), "no route for %s %.200s", m, path);
        respond_error(fr, 404, msg);
    }
}

/* ---------------------------------------------------------------- lifecycle */

static int init_workers(struct pd_router *rt) {
    const struct pd_router_config *cfg = rt->cfg;
    rt->prefill = pd_calloc((size_t)cfg->n_prefill, sizeof(*rt->prefill));
    rt->decode = pd_calloc((size_t)cfg->n_decode, sizeof(*rt->decode));
    rt->prefill_load = pd_calloc((size_t)cfg->n_prefill, sizeof(*rt->prefill_load));
    rt->decode_load = pd_calloc((size_t)cfg->n_decode, sizeof(*rt->decode_load));
    if (!rt->prefill || !rt->decode || !rt->prefill_load || !rt->decode_load)
        return pd_errorf(PD_ENOMEM, "worker registry");
    for (int i = 0; i < cfg->n_prefill; i++)
        rt->prefill[i] = (struct worker){
            .rt = rt, .spec = &cfg->prefill[i], .load = &rt->prefill_load[i], .is_prefill = true};
    for (int i = 0; i < cfg->n_decode; i++)
        rt->decode[i] =
            (struct worker){.rt = rt, .spec = &cfg->decode[i], .load = &rt->decode_load[i]};
    for (int i = 0; i < cfg->n_prefill; i++)
        snprintf(rt->prefill[i].last_error, sizeof(rt->prefill[i].last_error), "not checked yet");
    for (int i = 0; i < cfg->n_decode; i++)
        snprintf(rt->decode[i].last_error, sizeof(rt->decode[i].last_error), "not checked yet");
    return PD_OK;
}

int pd_router_new(uv_loop_t *loop, const struct pd_router_config *cfg, struct pd_router **out) {
    int rc;
    struct pd_router *rt = pd_calloc(1, sizeof(*rt));
    if (!rt)
        return pd_errorf(PD_ENOMEM, "router");
    rt->loop = loop;
    rt->cfg = cfg;
    *out = rt; /* lives for the process, also on failure (main exits) */
    if ((rc = pd_router_rng_seed(&rt->rng)))
        return rc;
    if ((rc = init_workers(rt)))
        return rc;
    if ((rc = pd_upstream_new(loop, &rt->up)))
        return rc;
    if ((rc = pd_front_new(loop, cfg->host, cfg->port, MAX_BODY_BYTES, on_request, rt, &rt->front)))
        return rc;
    if (cfg->policy == PD_ROUTER_POLICY_CACHE_AWARE)
        pd_info("policy cache_aware: no prefix-aware routing yet; using power_of_two");
    uv_timer_init(loop, &rt->health_timer);
    rt->health_timer.data = rt;
    uint64_t every = (uint64_t)(cfg->health_check_interval_secs * 1000);
    uv_timer_start(&rt->health_timer, on_health_tick, 0, every ? every : 1);
    return PD_OK;
}

int pd_router_port(const struct pd_router *rt) {
    return pd_front_port(rt->front);
}

void pd_router_shutdown(struct pd_router *rt) {
    if (rt->shutting_down)
        return;
    rt->shutting_down = true;
    pd_front_stop_listening(rt->front);
    uv_timer_stop(&rt->health_timer);
    uv_close((uv_handle_t *)&rt->health_timer, NULL); /* embedded in rt, which outlives the loop */
    /* in-flight requests: abort them on the workers, tell their clients */
    for (struct rreq *rq = rt->reqs, *next; rq; rq = next) {
        next = rq->next;
        if (!rq->finished && rq->kind == RREQ_GENERATE && rq->p >= 0) {
            abort_all_rids(rq, &rt->prefill[rq->p]);
            abort_all_rids(rq, &rt->decode[rq->d]);
        }
        drop_pcall(rq);
        drop_dcall(rq);
        finish_error(rq, 503, "the router is shutting down");
        rreq_maybe_free(rq);
    }
    for (int i = 0; i < rt->cfg->n_prefill; i++) {
        pd_upstream_call_cancel(rt->prefill[i].health_call);
        pd_upstream_call_cancel(rt->prefill[i].load_call);
        pd_free(rt->prefill[i].load_body.p);
    }
    for (int i = 0; i < rt->cfg->n_decode; i++) {
        pd_upstream_call_cancel(rt->decode[i].health_call);
        pd_upstream_call_cancel(rt->decode[i].load_call);
        pd_free(rt->decode[i].load_body.p);
    }
}
