/*
 * worker_posts.c — the router's fire-and-forget POSTs to workers: /abort_request for a request
 * that ended or is retried elsewhere, /flush_cache fanned out. Each is listed in rt->aborts so
 * that shutdown waits for it (ABORT_FLUSH_MS) and then cancels what never answered; a retry
 * whose earlier attempt's aborts are still on their way waits for them (rreq.aborts_pending).
 */
#include "router/router_internal.h"

#include "common/base/alloc.h"
#include "common/base/log.h"
#include "router/body.h"

/* A fire-and-forget POST /abort_request; listed so that shutdown can release the ones whose
 * worker never answered. */
struct abort_call {
    struct pd_router *rt;
    struct rreq *rq; /* the request it ends, while that one lives; NULL for a client's abort */
    struct abort_call *prev, *next;
    struct pd_upstream_call *call;
    char what[]; /* "URL rid=..." for the log */
};

static void abort_call_free(struct abort_call *a) {
    struct pd_router *rt = a->rt;
    if (a->rq && --a->rq->aborts_pending == 0 && a->rq->waiting && !rt->http_closed)
        pd__router_arm_retry_timer(rt); /* its retry may go now */
    if (a->prev)
        a->prev->next = a->next;
    else
        rt->aborts = a->next;
    if (a->next)
        a->next->prev = a->prev;
    pd_free(a);
}

static void on_abort_done(void *ud, struct pd_upstream_call *call,
                          const struct pd_upstream_result *r) {
    struct abort_call *a = ud;
    (void)call;
    if (r->status != PD_OK || r->http_status / 100 != 2)
        pd_debug("abort %s: %s (HTTP %ld)", a->what, r->status ? r->error : "answered",
                 r->http_status);
    abort_call_free(a);
}

/* POSTs body to w's path on the side, tracked in rt->aborts (so shutdown waits for it, then
 * cancels it) and logged as what when it fails; rq, when given, waits for it (a retry's abort). */
void pd__router_send_worker_post(struct pd_router *rt, struct rreq *rq, const struct worker *w,
                                 const char *path, const char *body, const char *what,
                                 const char *auth_line) {
    char url[600];
    snprintf(url, sizeof(url), "%s%s", w->spec.url, path);
    size_t wl = strlen(url) + strlen(what) + 8;
    struct abort_call *a = pd_calloc(1, sizeof(*a) + wl);
    if (!a) {
        pd_error("%s: out of memory calling %s", what, url);
        return;
    }
    snprintf(a->what, wl, "%s %s", url, what);
    struct pd_upstream_req req = {.method = "POST",
                                  .url = url,
                                  .body = body,
                                  .body_len = strlen(body),
                                  .auth = rt->worker_auth ? rt->worker_auth : auth_line,
                                  .timeout_ms = ABORT_TIMEOUT_MS};
    struct pd_upstream_cbs cbs = {.on_done = on_abort_done};
    a->rt = rt;
    a->rq = rq;
    if (rq)
        rq->aborts_pending++;
    a->next = rt->aborts;
    if (rt->aborts)
        rt->aborts->prev = a;
    rt->aborts = a;
    if (pd_upstream_call_start(rt->up, &req, &cbs, a, &a->call))
        abort_call_free(a);
}

void pd__router_send_abort(struct pd_router *rt, struct rreq *rq, const struct worker *w,
                           const char *rid, const char *auth_line) {
    char *body = pd_router_abort_body(rid);
    if (!body) {
        pd_error("rid=%s: out of memory aborting on %s", rid, w->spec.url);
        return;
    }
    char what[160];
    snprintf(what, sizeof(what), "rid=%s", rid);
    pd_info("rid=%s: abort on %s (%s)", rid, w->spec.url, pd__router_role(w));
    pd__router_send_worker_post(rt, rq, w, "/abort_request", body, what, auth_line);
    pd_free(body);
}

/* rq is freed: its aborts still on their way no longer hold a retry back. */
void pd__router_worker_posts_forget(struct pd_router *rt, struct rreq *rq) {
    for (struct abort_call *a = rt->aborts; a && rq->aborts_pending; a = a->next)
        if (a->rq == rq) {
            a->rq = NULL;
            rq->aborts_pending--;
        }
}

/* Shutdown: the posts that never answered are cancelled. */
void pd__router_worker_posts_cancel(struct pd_router *rt) {
    while (rt->aborts) {
        pd_upstream_call_cancel(rt->aborts->call);
        abort_call_free(rt->aborts);
    }
}
