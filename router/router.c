/*
 * router.c — the router's registry, health/load polling and request flow (see router.h).
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
#include "router/router.h"

#include "router/body.h"
#include "router/breaker.h"
#include "router/discovery.h"
#include "router/lpmerge.h"
#include "router/metrics.h"
#include "router/policy.h"
#include "router/cache_tree.h"
#include "router/route_text.h"
#include "router/resolve.h"
#include "router/upstream.h"

#include "common/base/alloc.h"
#include "common/base/http_server.h"
#include "common/base/metrics.h"
#include "common/base/log.h"
#include "common/base/status.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* The workers behind the router take PD_HTTP_DEFAULT_MAX_BODY; the router refuses bigger bodies
 * itself (413), keeping room for the bootstrap fields it adds, so an oversized body never reaches
 * a worker, whose early 413-and-close curl would see as a send failure of a healthy worker. */
#define BODY_GROWTH_BYTES 4096 /* bootstrap_host/port/room and rid, with margin */
#define MAX_BODY_BYTES (PD_HTTP_DEFAULT_MAX_BODY - BODY_GROWTH_BYTES)
#define PREFILL_ERR_KEEP 1024 /* bytes of a failed prefill's body quoted in the error */
/* a prefill answer carrying prompt logprobs is kept whole (they go into decode's) up to this */
#define PREFILL_LP_KEEP ((size_t)256 << 20)
#define ABORT_TIMEOUT_MS 5000
#define CUT_GRACE_MS 1000   /* after the drain deadline, for clients to take their error */
#define ABORT_FLUSH_MS 2000 /* at most this long for the last aborts to reach the workers */
#define FINAL_POLL_MS 10

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

/* A worker record lives while anything points at it: the registry (while listed) and every
 * request that chose it (rreq pw/dw/prev_*). Health and load polls are cancelled when it leaves
 * the registry, so they never outlive it. A draining worker stays listed (out of rotation, not
 * polled) until its last router call ends. */
struct worker {
    struct pd_router *rt;
    struct pd_router_worker_spec spec; /* owned copy */
    struct pd_router_load load;
    bool is_prefill;
    bool listed;   /* in rt->prefill / rt->decode */
    bool draining; /* no new requests; leaves the registry when load.inflight reaches 0 */
    int refs;
    int dns;                     /* index into rt->dns of the name that found it; -1: static */
    char addr[INET6_ADDRSTRLEN]; /* dns: the resolved address */
    uint64_t n_requests;         /* requests the router sent it */
    int tenant;             /* its role runs cache_aware: its id in rt->tree[role]; -1 otherwise */
    struct pd_router_cb cb; /* circuit breaker (breaker.h) */
    char key[320];          /* normalized URL (pd_router_url_normalize): one entry per key */
    bool dns_shadowed;      /* a DNS name also answers this (static) worker: logged once */
    struct pd_upstream_call *health_call, *load_call;
    struct sbuf load_body;
    char last_error[160];
};

/* The workers of one role, in the order they joined. */
struct registry {
    struct worker **w; /* [n] */
    int n;
    size_t cap;
};

/* One --prefill-dns / --decode-dns name and what its last lookup said. */
enum dns_state { DNS_UNKNOWN, DNS_ANSWERED, DNS_EMPTY, DNS_FAILED };

struct dns_entry {
    struct pd_router *rt;
    const struct pd_router_dns_spec *spec;
    bool is_prefill;
    int index;
    struct pd_router_resolve *pending;
    enum dns_state state;
    char last_error[200];
};

enum rreq_kind { RREQ_GENERATE, RREQ_PROXY };

enum endpoint_kind {
    EP_HEALTH,
    EP_GENERATE,
    EP_PROXY_GET,
    EP_PROXY_POST,
    EP_FLUSH_CACHE,
    EP_SERVER_INFO,
    EP_GET_LOAD,
    EP_ABORT,
    EP_WORKERS,
    EP_LIST_WORKERS,
    EP_METRICS,
};

/* One route of the HTTP server: the handler's user data. */
struct endpoint {
    struct pd_router *rt;
    enum endpoint_kind kind;
    int route; /* EP_GENERATE: PD_ROUTER_ROUTE_* */
};

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
#define N_ENDPOINTS PD_ARRAY_LEN(endpoint_table)

struct rreq {
    struct pd_router *rt;
    struct rreq *prev, *next;
    enum rreq_kind kind;
    struct pd_http_req *hr; /* NULL once the client's answer is finished or the client left */
    bool finished;          /* the client's answer is done (or the client left) */
    bool counted;           /* holds a --max-concurrent-requests slot */
    int route;
    char *path;
    char *auth_line; /* "Authorization: ..." forwarded to the workers, or NULL */
    int attempt;
    struct worker *pw, *dw;           /* chosen workers (referenced), NULL before */
    struct worker *prev_pw, *prev_dw; /* the first attempt's pair, avoided by the retry */
    struct pd_router_body_info info;
    char *sent;  /* body with the bootstrap fields */
    char *rtext; /* cache_aware: the routing text (route_text.h), NULL before it is needed */
    size_t rtext_len;
    size_t sent_len;
    struct pd_upstream_call *pcall, *dcall;
    bool streaming;       /* client answer started as a stream */
    bool client_gone;     /* calls dropped now end as client_gone (metrics) */
    bool first_byte_sent; /* a streamed answer's first byte went out (TTFT) */
    double t_start;       /* the client's request arrived (uv_hrtime, s) */
    bool paused;          /* the decode call waits for the client to drain */
    struct sbuf dbuf, perr;
    /* this attempt's outcome was given to the worker's circuit breaker (once per call) */
    bool p_judged, d_judged;
    /* the workers this request charged a failure (referenced): its retries landing on the same
     * worker again do not count again, so one client request alone never opens a circuit */
    struct worker *charged[2];
    /* a 2xx SSE answer from decode is held until its first event is in: an error event there
     * (the KV transfer failed before any token) is a failure that can still be retried */
    bool sse_hold, held_error;
    /* waiting out a retry backoff: no calls, no workers; the retry timer starts the attempt */
    bool waiting;
    uint64_t retry_due_ms; /* uv_now */
    /* aborts of this request's earlier attempts still on their way (abort_call.rq): a retry
     * carrying the client's own rid waits for them, else a late abort by that rid could end the
     * retry on the same worker */
    int aborts_pending;
    bool client_rid;
    /* prompt logprobs (info.input_logprobs): perr keeps the prefill's whole answer; lpm is it
     * parsed once it is in (lpm_ready); until then decode's stream events wait in sse, and a
     * decode that finished first is held (dheld, its status in d_status) */
    struct pd_router_lpmerge lpm;
    bool lpm_ready, dheld;
    long d_status;
    struct sbuf sse;
};

struct pd_router {
    uv_loop_t *loop;
    const struct pd_router_config *cfg;
    struct pd_http_server *http;
    struct endpoint endpoints[N_ENDPOINTS];
    struct pd_upstream *up;
    struct pd_router_rng rng;
    struct pd_router_metrics *metrics;
    struct registry prefill, decode;
    struct pd_router_load *scratch; /* [scratch_cap] what a policy sees of one registry */
    size_t scratch_cap;
    uint64_t rr_prefill, rr_decode;
    /* cache_aware: per role (prefill, decode) running it, the prefix tree of what went to each
     * of its workers; and the scratch arrays of one decision — matched bytes by tenant, then
     * matched bytes and tree sizes by registry index */
    struct pd_cache_tree *tree[2];
    size_t *ca_by_tenant, *ca_matched, *ca_size;
    size_t ca_by_tenant_cap, ca_matched_cap, ca_size_cap;
    uv_timer_t evict_timer;
    struct dns_entry *dns; /* [n_dns] prefill names first */
    int n_dns;
    uv_timer_t health_timer;
    uv_timer_t dns_timer;
    uv_timer_t drain_timer; /* shutdown: the drain deadline, then the wait for the aborts */
    uv_timer_t retry_timer; /* the earliest retry backoff that ends */
    int active;
    uint64_t n_total, n_failed, n_retried, n_pauses;
    struct rreq *reqs;
    struct abort_call *aborts;
    bool shutting_down;
    bool draining_done; /* the drain deadline passed (or a second shutdown call) */
    bool http_closed;
    uint64_t final_since_ms;
    int open_handles; /* ours, while closing */
    pd_router_done_fn done;
    void *done_ud;
    /* "Authorization: Bearer <--api-key>" on the router's own calls to the workers (/health,
     * /get_load, /abort_request), or NULL without a key: workers started with the same
     * --api-key answer those with 401 otherwise (sglang-router's --api-key is likewise the
     * key it presents to workers) */
    char *worker_auth;
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

static void respond_json(struct pd_http_req *hr, int status, const char *json) {
    pd_http_respond(hr, status, "application/json", json, strlen(json));
}

static void respond_error(struct pd_http_req *hr, int status, const char *msg) {
    char *j = error_json(status, msg);
    const char *fallback = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                           "\"param\":null,\"code\":500}}";
    respond_json(hr, j ? status : 500, j ? j : fallback);
    cJSON_free(j);
}

static void respond_cjson(struct pd_http_req *hr, int status, cJSON *root) {
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!s) {
        respond_error(hr, 500, "out of memory");
        return;
    }
    respond_json(hr, status, s);
    cJSON_free(s);
}

/* ---------------------------------------------------------------- workers */

static const char *role(const struct worker *w) {
    return w->is_prefill ? "prefill" : "decode";
}

static double now_s(void);

/* A circuit breaker state change: one log line and the transition counter. */
static void cb_note(struct worker *w, const struct pd_router_cb_change *ch, const char *why) {
    if (ch->from == ch->to)
        return;
    const char *from = pd_router_cb_state_names[ch->from], *to = pd_router_cb_state_names[ch->to];
    if (ch->to == PD_ROUTER_CB_OPEN)
        pd_warn("worker %s (%s) circuit %s -> open after %d consecutive failures: no new "
                "requests for %g s",
                w->spec.url, role(w), from, w->cb.consecutive_failures, w->rt->cfg->cb.timeout_s);
    else
        pd_info("worker %s (%s) circuit %s -> %s%s", w->spec.url, role(w), from, to, why);
    pd_router_metrics_cb_transition(w->rt->metrics, w->spec.url, ch->from, ch->to);
}

/* May a new request go to w now, as far as its circuit breaker goes? */
static bool cb_allows(struct worker *w) {
    struct pd_router_cb_change ch;
    bool ok = pd_router_cb_allows(&w->cb, &w->rt->cfg->cb, now_s(), &ch);
    cb_note(w, &ch, ": timeout over, trial requests go to it");
    return ok;
}

static int cb_state(struct worker *w) {
    struct pd_router_cb_change ch;
    int st = pd_router_cb_state_at(&w->cb, &w->rt->cfg->cb, now_s(), &ch);
    cb_note(w, &ch, ": timeout over, trial requests go to it");
    return st;
}

static void set_healthy(struct worker *w, bool ok, const char *why) {
    if (ok && !w->load.healthy) {
        pd_info("worker %s (%s) in rotation: /health answered 200", w->spec.url, role(w));
        /* a worker that comes back (a restart) starts with a clean slate */
        struct pd_router_cb_change ch;
        pd_router_cb_recovered(&w->cb, &w->rt->cfg->cb, now_s(), &ch);
        cb_note(w, &ch, ": /health answers again");
    } else if (!ok && w->load.healthy)
        pd_warn("worker %s (%s) out of rotation: %s", w->spec.url, role(w), why);
    if (!ok)
        snprintf(w->last_error, sizeof(w->last_error), "%s", why);
    else
        w->last_error[0] = '\0';
    w->load.healthy = ok;
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
        w->load.polled = load;
    w->load_body.len = 0;
}

static long health_timeout_ms(const struct pd_router *rt) {
    long ms = (long)(rt->cfg->health_check_interval_secs * 2000);
    return ms < 1000 ? 1000 : ms > 10000 ? 10000 : ms;
}

static void poll_worker(struct pd_router *rt, struct worker *w) {
    char url[600];
    struct pd_upstream_req req = {
        .method = "GET", .url = url, .auth = rt->worker_auth, .timeout_ms = health_timeout_ms(rt)};
    if (w->draining)
        return; /* it gets no new requests; its health no longer matters */
    if (!w->health_call) {
        snprintf(url, sizeof(url), "%s/health", w->spec.url);
        struct pd_upstream_cbs cbs = {.on_done = on_health_done};
        if (pd_upstream_call_start(rt->up, &req, &cbs, w, &w->health_call))
            w->health_call = NULL;
    }
    if (!w->load_call && w->load.healthy) {
        snprintf(url, sizeof(url), "%s/get_load", w->spec.url);
        struct pd_upstream_cbs cbs = {.on_data = on_load_data, .on_done = on_load_done};
        w->load_body.len = 0;
        if (pd_upstream_call_start(rt->up, &req, &cbs, w, &w->load_call))
            w->load_call = NULL;
    }
}

static void on_health_tick(uv_timer_t *t) {
    struct pd_router *rt = t->data;
    for (int i = 0; i < rt->prefill.n; i++)
        poll_worker(rt, rt->prefill.w[i]);
    for (int i = 0; i < rt->decode.n; i++)
        poll_worker(rt, rt->decode.w[i]);
}

static void stop_polls(struct worker *w) {
    pd_upstream_call_cancel(w->health_call);
    pd_upstream_call_cancel(w->load_call);
    w->health_call = w->load_call = NULL;
}

static struct worker *worker_ref(struct worker *w) {
    if (w)
        w->refs++;
    return w;
}

static void worker_unref(struct worker *w) {
    if (!w || --w->refs > 0)
        return;
    PD_ASSERT(!w->listed && !w->health_call && !w->load_call);
    pd_free(w->spec.url);
    pd_free(w->spec.host);
    pd_free(w->load_body.p);
    pd_free(w);
}

static struct registry *registry_of(struct pd_router *rt, bool is_prefill) {
    return is_prefill ? &rt->prefill : &rt->decode;
}

/* Lists a new worker (spec's strings move into it); it enters rotation once /health answers.
 * NULL on allocation failure (spec freed). */
static struct worker *registry_add(struct pd_router *rt, bool is_prefill,
                                   struct pd_router_worker_spec *spec, int dns, const char *addr) {
    struct registry *g = registry_of(rt, is_prefill);
    struct worker *w = pd_calloc(1, sizeof(*w));
    if (!w || pd_array_grow((void **)&g->w, &g->cap, (size_t)g->n + 1, sizeof(*g->w)) ||
        pd_array_grow((void **)&rt->scratch, &rt->scratch_cap, (size_t)g->n + 1,
                      sizeof(*rt->scratch))) {
        pd_free(w);
        pd_free(spec->url);
        pd_free(spec->host);
        pd_errorf(PD_ENOMEM, "adding a worker");
        return NULL;
    }
    int tenant = -1;
    struct pd_cache_tree *tree = rt->tree[!is_prefill];
    if (tree &&
        (pd_array_grow((void **)&rt->ca_matched, &rt->ca_matched_cap, (size_t)g->n + 1,
                       sizeof(*rt->ca_matched)) ||
         pd_array_grow((void **)&rt->ca_size, &rt->ca_size_cap, (size_t)g->n + 1,
                       sizeof(*rt->ca_size)) ||
         pd_cache_tree_tenant_add(tree, &tenant) ||
         pd_array_grow((void **)&rt->ca_by_tenant, &rt->ca_by_tenant_cap,
                       (size_t)pd_cache_tree_tenant_cap(tree), sizeof(*rt->ca_by_tenant)))) {
        if (tenant >= 0)
            pd_cache_tree_tenant_remove(tree, tenant);
        pd_free(w);
        pd_free(spec->url);
        pd_free(spec->host);
        pd_errorf(PD_ENOMEM, "adding a worker");
        return NULL;
    }
    *w = (struct worker){.rt = rt,
                         .spec = *spec,
                         .is_prefill = is_prefill,
                         .listed = true,
                         .refs = 1,
                         .dns = dns,
                         .tenant = tenant};
    pd_router_cb_init(&w->cb, now_s());
    if (pd_router_url_normalize(w->spec.url, w->key, sizeof(w->key)) != PD_OK)
        snprintf(w->key, sizeof(w->key), "%s", w->spec.url);
    if (addr)
        snprintf(w->addr, sizeof(w->addr), "%s", addr);
    snprintf(w->last_error, sizeof(w->last_error), "not checked yet");
    g->w[g->n++] = w;
    return w;
}

/* The listed worker of that role whose normalized URL is key, or NULL. */
static struct worker *registry_find(struct pd_router *rt, bool is_prefill, const char *key) {
    struct registry *g = registry_of(rt, is_prefill);
    for (int i = 0; i < g->n; i++)
        if (strcmp(g->w[i]->key, key) == 0)
            return g->w[i];
    return NULL;
}

/* Out of the registry: no polls, no new requests; freed once no request holds it. */
static void registry_remove(struct worker *w) {
    struct registry *g = registry_of(w->rt, w->is_prefill);
    PD_ASSERT(w->listed);
    int i = 0;
    while (i < g->n && g->w[i] != w)
        i++;
    PD_ASSERT(i < g->n);
    memmove(&g->w[i], &g->w[i + 1], sizeof(*g->w) * (size_t)(g->n - i - 1));
    g->n--;
    stop_polls(w);
    w->listed = false;
    /* gone from the router (not merely unhealthy or open-circuited): its part of the prefix
     * tree goes too, as sglang-router's remove_worker does */
    if (w->tenant >= 0)
        pd_cache_tree_tenant_remove(w->rt->tree[!w->is_prefill], w->tenant);
    w->tenant = -1;
    worker_unref(w);
}

/* A router call on w ended. The last one of a draining worker takes it out of the registry. */
static void worker_call_ended(struct worker *w) {
    PD_ASSERT(w->load.inflight > 0);
    w->load.inflight--;
    if (w->draining && w->listed && w->load.inflight == 0) {
        pd_info("worker %s (%s) drained: removed", w->spec.url, role(w));
        registry_remove(w);
    }
}

/* cache_aware's choice among g's workers (scratch filled): the role's prefix tree's match of
 * rq's routing text, then policy.h's rules; the text is recorded for the chosen one. */
static int pick_cache_aware(struct pd_router *rt, struct pd_cache_tree *tree, struct registry *g,
                            int ex, uint64_t *rr, struct rreq *rq) {
    if (!rq->rtext) {
        size_t len;
        const char *body = pd_http_req_body(rq->hr, &len);
        if (pd_router_route_text(rq->route, body, len, &rq->rtext, &rq->rtext_len)) {
            /* no memory for the text: route it as an empty one (smallest tree) */
            pd_warn("cache_aware: %s", pd_error_msg());
            rq->rtext_len = 0;
        }
    }
    const char *text = rq->rtext ? rq->rtext : "";
    int n_ids = pd_cache_tree_tenant_cap(tree);
    pd_cache_tree_match(tree, text, rq->rtext_len, rt->ca_by_tenant, n_ids);
    for (int i = 0; i < g->n; i++) {
        int id = g->w[i]->tenant;
        rt->ca_matched[i] = id >= 0 ? rt->ca_by_tenant[id] : 0;
        rt->ca_size[i] = pd_cache_tree_tenant_size(tree, id);
    }
    int decision = PD_ROUTER_CA_SMALLEST;
    int i = pd_router_pick_cache_aware(&rt->cfg->ca, rt->scratch, rt->ca_matched, rt->ca_size, g->n,
                                       ex, rq->rtext_len, rr, &decision);
    if (i < 0)
        return i;
    struct worker *w = g->w[i];
    pd_debug("cache_aware: %s → %s (matched %zu of %zu bytes, tree %zu bytes, %" PRId64
             " in flight)",
             pd_router_ca_decision_names[decision], w->spec.url, rt->ca_matched[i], rq->rtext_len,
             rt->ca_size[i], w->load.inflight);
    pd_router_metrics_cache_aware(rt->metrics, w->spec.url, decision);
    /* sglang-router records the text for the chosen worker whatever the rule that chose it */
    if (rq->rtext_len && pd_cache_tree_insert(tree, w->tenant, text, rq->rtext_len))
        pd_warn("cache_aware: %s", pd_error_msg());
    return i;
}

/* A worker whose policy may pick it, or NULL: healthy, not draining, not `exclude`. rq: the
 * request it is for (cache_aware reads its text). */
static struct worker *pick_worker(struct pd_router *rt, bool is_prefill,
                                  const struct worker *exclude, struct rreq *rq) {
    struct registry *g = registry_of(rt, is_prefill);
    int ex = -1;
    for (int i = 0; i < g->n; i++) {
        rt->scratch[i] = g->w[i]->load;
        /* an open circuit takes the worker out of the policy's view until its timeout */
        rt->scratch[i].healthy = g->w[i]->load.healthy && !g->w[i]->draining && cb_allows(g->w[i]);
        if (g->w[i] == exclude)
            ex = i;
    }
    int policy = is_prefill ? rt->cfg->prefill_policy : rt->cfg->decode_policy;
    uint64_t *rr = is_prefill ? &rt->rr_prefill : &rt->rr_decode;
    struct pd_cache_tree *tree = rt->tree[!is_prefill];
    int i;
    if (policy == PD_ROUTER_POLICY_LEAST_LOAD)
        i = pd_router_pick_least_load(rt->scratch, g->n, ex, rr);
    else if (tree && rq)
        i = pick_cache_aware(rt, tree, g, ex, rr, rq);
    else /* cache_aware without a request (a pass-through GET): power_of_two */
        i = pd_router_pick(policy, rt->scratch, g->n, ex, rr, &rt->rng);
    return i < 0 ? NULL : g->w[i];
}

static int count_healthy(const struct registry *g) {
    int k = 0;
    for (int i = 0; i < g->n; i++)
        k += g->w[i]->load.healthy && !g->w[i]->draining;
    return k;
}

/* Why no worker of a role could be picked, for the 503: none healthy, or every healthy one has
 * its circuit open (then when the first turns half-open). */
static void no_worker_msg(struct pd_router *rt, bool is_prefill, char *buf, size_t size) {
    const struct registry *g = registry_of(rt, is_prefill);
    const char *r = is_prefill ? "prefill" : "decode";
    int healthy = 0, open = 0;
    double next = -1, now = now_s();
    for (int i = 0; i < g->n; i++) {
        struct worker *w = g->w[i];
        if (!w->load.healthy || w->draining)
            continue;
        healthy++;
        if (cb_allows(w))
            continue;
        open++;
        double left = pd_router_cb_open_remaining(&w->cb, &rt->cfg->cb, now);
        if (next < 0 || left < next)
            next = left;
    }
    if (healthy > 0 && open == healthy)
        snprintf(buf, size,
                 "no %s worker available: the circuit breaker of %s %d healthy %s worker%s is "
                 "open after repeated failures (next trial in %.1f s)",
                 r, healthy == 1 ? "the" : "all", healthy, r, healthy == 1 ? "" : "s",
                 next < 0 ? 0 : next);
    else
        snprintf(buf, size, "no healthy %s worker", r);
}

/* ---------------------------------------------------------------- DNS discovery */

static const char *dns_flag(const struct dns_entry *e) {
    return e->is_prefill ? "--prefill-dns" : "--decode-dns";
}

static void dns_add(struct dns_entry *e, const char *addr) {
    struct pd_router *rt = e->rt;
    char url[80];
    struct pd_router_worker_spec spec = {
        .port = e->spec->port,
        .bootstrap_port = e->is_prefill ? e->spec->bootstrap_port : PD_ROUTER_BOOTSTRAP_PORT_NULL};
    char key[320];
    if (pd_router_dns_worker_url(addr, e->spec->port, url, sizeof(url)) == PD_OK &&
        pd_router_url_normalize(url, key, sizeof(key)) == PD_OK) {
        /* already listed (given statically, or by another name): one worker, one share of the
         * traffic; the first entry wins, and this name's answers never drain or remove it */
        struct worker *same = registry_find(rt, e->is_prefill, key);
        if (same) {
            if (!same->dns_shadowed)
                pd_info("dns %s: %s is worker %s (%s, %s) already; not added twice", e->spec->name,
                        url, same->spec.url, role(same),
                        same->dns < 0 ? "static" : rt->dns[same->dns].spec->name);
            same->dns_shadowed = true;
            return;
        }
        spec.url = pd_strdup(url);
        spec.host = pd_strdup(addr); /* the bootstrap host decode connects to */
    }
    struct worker *w = spec.url && spec.host
                           ? registry_add(rt, e->is_prefill, &spec, e->index, addr)
                           : (pd_free(spec.url), pd_free(spec.host), NULL);
    if (!w) {
        pd_error("dns %s: cannot add a worker for %s: out of memory", e->spec->name, addr);
        return;
    }
    pd_info("worker %s (%s, dns %s) added: in rotation once /health answers", w->spec.url, role(w),
            e->spec->name);
    poll_worker(rt, w);
}

/* One answer applied: new addresses get workers, vanished ones drain (or go at once when
 * nothing is in flight), returning ones are re-checked before they take traffic again. */
static void dns_apply(struct dns_entry *e, const char *const *addrs, int n) {
    struct pd_router *rt = e->rt;
    struct registry *g = registry_of(rt, e->is_prefill);
    int n_known = 0;
    for (int i = 0; i < g->n; i++)
        n_known += g->w[i]->dns == e->index;
    struct worker **mine = pd_calloc((size_t)n_known + 1, sizeof(*mine));
    struct pd_router_dns_known *known = pd_calloc((size_t)n_known + 1, sizeof(*known));
    enum pd_router_dns_step *steps = pd_calloc((size_t)n_known + 1, sizeof(*steps));
    bool *add = pd_calloc((size_t)n + 1, sizeof(*add));
    if (!mine || !known || !steps || !add) {
        pd_error("dns %s: out of memory applying an answer; keeping the current workers",
                 e->spec->name);
        goto out;
    }
    for (int i = 0, k = 0; i < g->n; i++) {
        if (g->w[i]->dns != e->index)
            continue;
        mine[k] = g->w[i];
        known[k++] = (struct pd_router_dns_known){.addr = g->w[i]->addr,
                                                  .draining = g->w[i]->draining,
                                                  .inflight = g->w[i]->load.inflight};
    }
    pd_router_dns_plan(known, n_known, addrs, n, steps, add);
    for (int k = 0; k < n_known; k++) {
        struct worker *w = mine[k];
        switch (steps[k]) {
        case PD_ROUTER_DNS_KEEP: break;
        case PD_ROUTER_DNS_DRAIN:
            pd_info("worker %s (%s) left dns %s: draining %" PRId64 " requests in flight",
                    w->spec.url, role(w), e->spec->name, w->load.inflight);
            w->draining = true;
            stop_polls(w);
            break;
        case PD_ROUTER_DNS_REVIVE:
            pd_info("worker %s (%s) back in dns %s: in rotation again once /health answers",
                    w->spec.url, role(w), e->spec->name);
            w->draining = false;
            w->load.healthy = false;
            snprintf(w->last_error, sizeof(w->last_error), "re-added; not checked yet");
            poll_worker(rt, w);
            break;
        case PD_ROUTER_DNS_REMOVE:
            pd_info("worker %s (%s) left dns %s: removed (nothing in flight)", w->spec.url, role(w),
                    e->spec->name);
            registry_remove(w);
            break;
        }
    }
    for (int a = 0; a < n; a++)
        if (add[a])
            dns_add(e, addrs[a]);
out:
    pd_free(mine);
    pd_free(known);
    pd_free(steps);
    pd_free(add);
}

static void on_dns_resolved(void *ud, const struct pd_router_resolve_result *r) {
    struct dns_entry *e = ud;
    struct pd_router *rt = e->rt;
    e->pending = NULL;
    if (rt->shutting_down)
        return;
    int held = 0;
    const struct registry *g = registry_of(rt, e->is_prefill);
    for (int i = 0; i < g->n; i++)
        held += g->w[i]->dns == e->index && !g->w[i]->draining;
    if (r->status != PD_OK) {
        /* logged once per change, not on every refresh */
        if (e->state != DNS_FAILED || strcmp(e->last_error, r->error) != 0)
            pd_warn("dns %s (%s): lookup failed: %s; keeping its %d workers", e->spec->name,
                    dns_flag(e), r->error, held);
        e->state = DNS_FAILED;
        snprintf(e->last_error, sizeof(e->last_error), "%s", r->error);
        return;
    }
    if (r->n == 0 && e->state != DNS_EMPTY)
        pd_warn("dns %s (%s): no addresses (no such name or no records)%s", e->spec->name,
                dns_flag(e), held ? "; draining its workers" : "");
    else if (r->n > 0 && e->state != DNS_ANSWERED)
        pd_info("dns %s (%s): %d addresses", e->spec->name, dns_flag(e), r->n);
    e->state = r->n ? DNS_ANSWERED : DNS_EMPTY;
    e->last_error[0] = '\0';
    dns_apply(e, r->addrs, r->n);
}

static void on_dns_tick(uv_timer_t *t) {
    struct pd_router *rt = t->data;
    const struct pd_router_config *cfg = rt->cfg;
    struct pd_router_resolve_opts o = {.family = cfg->dns_family,
                                       .server = cfg->dns_server ? cfg->dns_server_addr : NULL,
                                       .server_port = cfg->dns_server_port};
    for (int i = 0; i < rt->n_dns; i++) {
        struct dns_entry *e = &rt->dns[i];
        if (e->pending)
            continue; /* a slow lookup: the next tick tries again */
        if (pd_router_resolve_start(rt->loop, e->spec->name, &o, on_dns_resolved, e, &e->pending) !=
            PD_OK) {
            e->pending = NULL;
            struct pd_router_resolve_result r = {.status = PD_EIO, .error = pd_error_msg()};
            on_dns_resolved(e, &r);
        }
    }
}

static void stop_dns(struct pd_router *rt) {
    for (int i = 0; i < rt->n_dns; i++) {
        pd_router_resolve_cancel(rt->dns[i].pending);
        rt->dns[i].pending = NULL;
    }
}

/* ---------------------------------------------------------------- aborts */

/* A fire-and-forget POST /abort_request; listed so that shutdown can release the ones whose
 * worker never answered. */
struct abort_call {
    struct pd_router *rt;
    struct rreq *rq; /* the request it ends, while that one lives; NULL for a client's abort */
    struct abort_call *prev, *next;
    struct pd_upstream_call *call;
    char what[]; /* "URL rid=..." for the log */
};

static void arm_retry_timer(struct pd_router *rt);

static void abort_call_free(struct abort_call *a) {
    struct pd_router *rt = a->rt;
    if (a->rq && --a->rq->aborts_pending == 0 && a->rq->waiting && !rt->http_closed)
        arm_retry_timer(rt); /* its retry may go now */
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
static void send_worker_post(struct pd_router *rt, struct rreq *rq, const struct worker *w,
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

static void send_abort(struct pd_router *rt, struct rreq *rq, const struct worker *w,
                       const char *rid, const char *auth_line) {
    char *body = pd_router_abort_body(rid);
    if (!body) {
        pd_error("rid=%s: out of memory aborting on %s", rid, w->spec.url);
        return;
    }
    char what[160];
    snprintf(what, sizeof(what), "rid=%s", rid);
    pd_info("rid=%s: abort on %s (%s)", rid, w->spec.url, role(w));
    send_worker_post(rt, rq, w, "/abort_request", body, what, auth_line);
    pd_free(body);
}

static void abort_all_rids(struct rreq *rq, const struct worker *w) {
    for (int i = 0; i < rq->info.n; i++)
        send_abort(rq->rt, rq, w, rq->info.rids[i], rq->auth_line);
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
    for (struct abort_call *a = rt->aborts; a && rq->aborts_pending; a = a->next)
        if (a->rq == rq) {
            a->rq = NULL;
            rq->aborts_pending--;
        }
    worker_unref(rq->pw);
    worker_unref(rq->dw);
    worker_unref(rq->prev_pw);
    worker_unref(rq->prev_dw);
    worker_unref(rq->charged[0]);
    worker_unref(rq->charged[1]);
    pd_router_body_info_free(&rq->info);
    pd_free(rq->sent);
    pd_free(rq->rtext);
    pd_free(rq->path);
    pd_free(rq->auth_line);
    pd_free(rq->dbuf.p);
    pd_free(rq->perr.p);
    pd_free(rq->sse.p);
    pd_router_lpmerge_free(&rq->lpm);
    pd_free(rq);
}

static double now_s(void) {
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
    pd_router_metrics_done(rq->rt->metrics, rq->path, now_s() - rq->t_start);
}

static void drop_pcall(struct rreq *rq) {
    if (!rq->pcall)
        return;
    pd_upstream_call_cancel(rq->pcall);
    rq->pcall = NULL;
    call_end(rq, true, rq->client_gone ? PD_ROUTER_OUTCOME_CLIENT_GONE : PD_ROUTER_OUTCOME_ABORTED);
    worker_call_ended(rq->pw);
}

static void drop_dcall(struct rreq *rq) {
    if (!rq->dcall)
        return;
    pd_upstream_call_cancel(rq->dcall);
    rq->dcall = NULL;
    call_end(rq, false,
             rq->client_gone ? PD_ROUTER_OUTCOME_CLIENT_GONE : PD_ROUTER_OUTCOME_ABORTED);
    worker_call_ended(rq->dw);
}

/* Ends the client's answer with an error: a status + JSON before anything was sent, else one
 * SSE error event and [DONE] (API.md: never a silent stop). */
static void finish_error(struct rreq *rq, int status, const char *msg) {
    if (rq->finished)
        return;
    mark_finished(rq);
    rq->rt->n_failed++;
    if (rq->info.n)
        pd_warn("room=%" PRIu64 " rid=%s: %d %s", rq->info.rooms[0], rq->info.rids[0], status, msg);
    else
        pd_warn("%s: %d %s", rq->path, status, msg);
    struct pd_http_req *hr = rq->hr;
    rq->hr = NULL;
    PD_ASSERT(hr != NULL);
    if (!rq->streaming) {
        respond_error(hr, status, msg);
        return;
    }
    char *j = error_json(status, msg);
    struct sbuf ev = {0};
    sb_put(&ev, "data: ", 6);
    if (j)
        sb_put(&ev, j, strlen(j));
    sb_put(&ev, "\n\ndata: [DONE]\n\n", 16);
    /* a send that fails means the client is gone (its on_gone ran): hr is not ours any more */
    if (pd_http_stream_send(hr, ev.p ? ev.p : "", ev.len) != PD_ECANCELED)
        pd_http_stream_end(hr);
    pd_free(ev.p);
    cJSON_free(j);
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
        worker_unref(*charged);
        *charged = worker_ref(w);
    }
    struct pd_router_cb_change ch;
    if (pd_router_cb_record(&w->cb, &rq->rt->cfg->cb, success, now_s(), &ch))
        pd_router_metrics_cb_outcome(rq->rt->metrics, w->spec.url, success);
    cb_note(w, &ch, success ? ": enough trial requests succeeded" : "");
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

static void arm_retry_timer(struct pd_router *rt) {
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
    worker_unref(rq->prev_pw);
    worker_unref(rq->prev_dw);
    rq->prev_pw = rq->pw;
    rq->prev_dw = rq->dw;
    rq->pw = rq->dw = NULL;
    rq->client_rid = !rq->info.rid_added;
    pd_router_body_info_free(&rq->info);
    pd_free(rq->sent);
    rq->sent = NULL;
    rq->dbuf.len = rq->perr.len = rq->sse.len = 0;
    pd_router_lpmerge_free(&rq->lpm);
    rq->lpm_ready = rq->dheld = false;
    rq->sse_hold = rq->held_error = false;
    rq->waiting = true;
    rq->retry_due_ms = uv_now(rt->loop) + (uint64_t)ms;
    arm_retry_timer(rt);
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
    arm_retry_timer(rt);
}

static void on_prefill_data(void *ud, struct pd_upstream_call *call, const char *buf, size_t len) {
    struct rreq *rq = ud;
    size_t keep = rq->info.input_logprobs ? PREFILL_LP_KEEP : PREFILL_ERR_KEEP;
    if (rq->perr.len < keep)
        sb_put(&rq->perr, buf, len < keep - rq->perr.len ? len : keep - rq->perr.len);
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
    worker_call_ended(pw);
    bool ok = r->status == PD_OK && r->http_status / 100 == 2;
    bool transport = r->status != PD_OK && r->status != PD_ETIMEDOUT;
    /* a worker that cannot be reached leaves rotation, also when decode happened to answer
     * first (the order of the two is a race) */
    if (transport) {
        char why[200];
        snprintf(why, sizeof(why), "request failed: %s", r->error);
        set_healthy(pw, false, why);
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
    finish_error(rq, r->status == PD_ETIMEDOUT ? 504 : 502, msg);
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

/* Sends buf to the streaming client. PD_OK, or the request ended (client gone, out of memory:
 * rq may be freed, touch nothing). */
static int send_piece(struct rreq *rq, const char *buf, size_t len) {
    int rc = pd_http_stream_send(rq->hr, buf, len);
    if (rc == PD_ECANCELED)
        return rc; /* the client is gone: on_client_gone ran and rq may be freed */
    if (rc == PD_OK && !rq->first_byte_sent) {
        rq->first_byte_sent = true;
        pd_router_metrics_ttft(rq->rt->metrics, now_s() - rq->t_start);
    }
    return rc ? stream_oom(rq) : PD_OK;
}

/* Decode's stream bytes to the client. With prompt logprobs, whole events only (a read may end
 * mid-event), each merged with the prefill's answer; they wait in rq->sse until it is in. */
static int stream_out(struct rreq *rq, const char *buf, size_t len) {
    if (!rq->info.input_logprobs)
        return send_piece(rq, buf, len);
    if (len && sb_put(&rq->sse, buf, len))
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
                rc = sb_put(&ev, "data: ", 6);
                rc = rc ? rc : sb_put(&ev, m, ml);
            } else {
                rc = sb_put(&ev, p, elen);
            }
            pd_free(m);
        } else {
            rc = sb_put(&ev, p, elen);
        }
        rc = rc ? rc : sb_put(&ev, "\n\n", 2);
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
    long st = pd_upstream_call_http_status(call);
    const char *ct = pd_upstream_call_content_type(call);
    if (!rq->streaming && !rq->sse_hold && !rq->held_error && st / 100 == 2 &&
        strncmp(ct, "text/event-stream", 17) == 0)
        rq->sse_hold = true;
    if (rq->sse_hold) {
        /* nothing goes to the client before decode's first event shows it is not an error:
         * a KV transfer that failed before any token is still a retryable failure */
        if (sb_put(&rq->dbuf, buf, len)) {
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
        sb_put(&rq->dbuf, buf, len); /* the rest of the failed stream ([DONE]) */
        return;
    }
    if (!rq->streaming) {
        if (sb_put(&rq->dbuf, buf, len))
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
    worker_call_ended(dw);
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
            pd_http_stream_end(rq->hr);
        } else {
            const char *ct = pd_upstream_call_content_type(call);
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
        set_healthy(dw, false, why);
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
    /* a retry avoids both workers of the failed pair where another one is healthy (the one
     * that failed is out of rotation anyway) */
    struct worker *pw = pick_worker(rt, true, rq->prev_pw, rq);
    if (!pw && rq->prev_pw)
        pw = pick_worker(rt, true, NULL, rq);
    struct worker *dw = pick_worker(rt, false, rq->prev_dw, rq);
    if (!dw && rq->prev_dw)
        dw = pick_worker(rt, false, NULL, rq);
    if (!pw || !dw) {
        char msg[300];
        no_worker_msg(rt, !pw, msg, sizeof(msg));
        finish_error(rq, 503, msg);
        return PD_EAGAIN;
    }
    rq->p_judged = rq->d_judged = false;
    size_t len;
    const char *body = pd_http_req_body(rq->hr, &len);
    /* the bootstrap host is the prefill's own address: a DNS-found one's resolved address */
    int rc = pd_router_body_rewrite(rq->route, body, len, pw->spec.host, pw->spec.bootstrap_port,
                                    &rt->rng, &rq->sent, &rq->sent_len, &rq->info);
    if (rc) {
        finish_error(rq, rc == PD_ENOMEM ? 500 : 400, pd_error_msg());
        return rc;
    }
    rq->pw = worker_ref(pw);
    rq->dw = worker_ref(dw);
    char url[600];
    struct pd_upstream_req req = {.method = "POST",
                                  .url = url,
                                  .body = rq->sent,
                                  .body_len = rq->sent_len,
                                  .auth = rq->auth_line,
                                  .timeout_ms = (long)cfg->request_timeout_secs * 1000,
                                  .connect_timeout_ms = 10000};
    pd_info("room=%" PRIu64 " rid=%s: %s%s → prefill %s, decode %s%s", rq->info.rooms[0],
            rq->info.rids[0], rq->path, rq->info.stream ? " (stream)" : "", pw->spec.url,
            dw->spec.url, rq->attempt ? " (retry)" : "");
    struct pd_upstream_cbs pcbs = {.on_data = on_prefill_data, .on_done = on_prefill_done};
    struct pd_upstream_cbs dcbs = {.on_data = on_decode_data, .on_done = on_decode_done};
    snprintf(url, sizeof(url), "%s%s", dw->spec.url, rq->path);
    rc = pd_upstream_call_start(rt->up, &req, &dcbs, rq, &rq->dcall);
    if (rc == PD_OK) {
        dw->load.inflight++;
        dw->n_requests++;
        call_start(rq, false);
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
static char *auth_line_new(struct pd_http_req *hr, bool *oom) {
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
    rq->t_start = now_s();
    rq->path = pd_strdup(pd_http_req_path(hr));
    bool oom;
    rq->auth_line = auth_line_new(hr, &oom);
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

static void handle_generate(struct pd_router *rt, struct pd_http_req *fr, int route) {
    const struct pd_router_config *cfg = rt->cfg;
    if (cfg->max_concurrent_requests > 0 && rt->active >= cfg->max_concurrent_requests) {
        char msg[160];
        snprintf(msg, sizeof(msg), "too many concurrent requests (--max-concurrent-requests %d)",
                 cfg->max_concurrent_requests);
        pd_warn("%s: 429 %s", pd_http_req_path(fr), msg);
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
    rq->dcall = NULL;
    call_end(rq, false, call_outcome(r));
    worker_call_ended(rq->dw);
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
static void handle_proxy(struct pd_router *rt, struct pd_http_req *fr, bool post) {
    struct rreq *rq = rreq_new(rt, fr, RREQ_PROXY);
    if (!rq) {
        respond_error(fr, 500, "out of memory");
        return;
    }
    rq->dw = worker_ref(pick_worker(rt, false, NULL, NULL));
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

/* ---------------------------------------------------------------- router's own endpoints */

static const char *worker_state(const struct worker *w) {
    return w->draining ? "draining" : w->load.healthy ? "healthy" : "unhealthy";
}

/* A worker's circuit breaker as /workers shows it. */
static cJSON *cb_json(struct worker *w) {
    const struct pd_router_cb_config *c = &w->rt->cfg->cb;
    cJSON *o = cJSON_CreateObject();
    int st = cb_state(w);
    cJSON_AddStringToObject(o, "state", c->disabled ? "disabled" : pd_router_cb_state_names[st]);
    cJSON_AddNumberToObject(o, "consecutive_failures", w->cb.consecutive_failures);
    cJSON_AddNumberToObject(o, "consecutive_successes", w->cb.consecutive_successes);
    cJSON_AddNumberToObject(o, "total_failures", (double)w->cb.total_failures);
    cJSON_AddNumberToObject(o, "total_successes", (double)w->cb.total_successes);
    if (st == PD_ROUTER_CB_OPEN)
        cJSON_AddNumberToObject(o, "open_remaining_secs",
                                pd_router_cb_open_remaining(&w->cb, c, now_s()));
    return o;
}

/* Every listed worker; draining ones too, since requests still run on them. */
static cJSON *workers_json(struct pd_router *rt) {
    cJSON *arr = cJSON_CreateArray();
    for (int side = 0; side < 2; side++) {
        const struct registry *g = side ? &rt->decode : &rt->prefill;
        for (int i = 0; i < g->n; i++) {
            struct worker *w = g->w[i];
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "url", w->spec.url);
            cJSON_AddStringToObject(o, "worker_type", side ? "decode" : "prefill");
            if (!side) {
                if (w->spec.bootstrap_port == PD_ROUTER_BOOTSTRAP_PORT_NULL)
                    cJSON_AddNullToObject(o, "bootstrap_port");
                else
                    cJSON_AddNumberToObject(o, "bootstrap_port", w->spec.bootstrap_port);
            }
            /* "healthy" = in rotation; sglang-router's /workers calls it is_healthy */
            bool in_rotation = w->load.healthy && !w->draining;
            cJSON_AddBoolToObject(o, "healthy", in_rotation);
            cJSON_AddBoolToObject(o, "is_healthy", in_rotation);
            cJSON_AddStringToObject(o, "state", worker_state(w));
            /* available = a new request may go to it now: in rotation, circuit not open */
            cJSON_AddBoolToObject(o, "available", in_rotation && cb_allows(w));
            cJSON_AddItemToObject(o, "circuit_breaker", cb_json(w));
            cJSON_AddStringToObject(o, "source", w->dns >= 0 ? "dns" : "static");
            if (w->dns >= 0)
                cJSON_AddStringToObject(o, "dns_name", rt->dns[w->dns].spec->name);
            cJSON_AddNumberToObject(o, "load", (double)w->load.polled);
            cJSON_AddNumberToObject(o, "router_inflight", (double)w->load.inflight);
            cJSON_AddNumberToObject(o, "requests_total", (double)w->n_requests);
            if (w->tenant >= 0)
                cJSON_AddNumberToObject(
                    o, "cache_tree_bytes",
                    (double)pd_cache_tree_tenant_size(rt->tree[side], w->tenant));
            if (w->last_error[0] && !in_rotation)
                cJSON_AddStringToObject(o, "last_error", w->last_error);
            cJSON_AddItemToArray(arr, o);
        }
    }
    return arr;
}

/* GET /workers in sglang-router's shape: {"workers": [...], "total", "stats"}, plus what each
 * DNS name last answered. */
static void handle_workers(struct pd_router *rt, struct pd_http_req *hr) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "workers", workers_json(rt));
    cJSON_AddNumberToObject(o, "total", rt->prefill.n + rt->decode.n);
    cJSON *st = cJSON_AddObjectToObject(o, "stats");
    cJSON_AddNumberToObject(st, "prefill_count", rt->prefill.n);
    cJSON_AddNumberToObject(st, "decode_count", rt->decode.n);
    cJSON_AddNumberToObject(st, "regular_count", 0);
    cJSON *names = cJSON_AddArrayToObject(o, "dns");
    static const char *const states[] = {"pending", "answered", "empty", "failed"};
    for (int i = 0; i < rt->n_dns; i++) {
        const struct dns_entry *e = &rt->dns[i];
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "name", e->spec->name);
        cJSON_AddStringToObject(d, "worker_type", e->is_prefill ? "prefill" : "decode");
        cJSON_AddNumberToObject(d, "port", e->spec->port);
        cJSON_AddStringToObject(d, "state", states[e->state]);
        if (e->last_error[0])
            cJSON_AddStringToObject(d, "last_error", e->last_error);
        cJSON_AddItemToArray(names, d);
    }
    respond_cjson(hr, 200, o);
}

/* GET /list_workers, sglang-router's older listing: {"urls": [...]}. */
static void handle_list_workers(struct pd_router *rt, struct pd_http_req *hr) {
    cJSON *o = cJSON_CreateObject();
    cJSON *urls = cJSON_AddArrayToObject(o, "urls");
    for (int side = 0; side < 2; side++) {
        const struct registry *g = side ? &rt->decode : &rt->prefill;
        for (int i = 0; i < g->n; i++)
            cJSON_AddItemToArray(urls, cJSON_CreateString(g->w[i]->spec.url));
    }
    respond_cjson(hr, 200, o);
}

static void handle_server_info(struct pd_router *rt, struct pd_http_req *hr) {
    const struct pd_router_config *cfg = rt->cfg;
    struct pd_http_server_stats hs;
    pd_http_server_stats(rt->http, &hs);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "version", PD_VERSION);
    cJSON_AddStringToObject(o, "disaggregation_mode", "router");
    cJSON_AddBoolToObject(o, "pd_disaggregation", true);
    cJSON_AddStringToObject(o, "policy", pd_router_policy_names[cfg->policy]);
    cJSON_AddStringToObject(o, "prefill_policy", pd_router_policy_name(cfg->prefill_policy));
    cJSON_AddStringToObject(o, "decode_policy", pd_router_policy_name(cfg->decode_policy));
    cJSON_AddNumberToObject(o, "cache_threshold", cfg->ca.cache_threshold);
    cJSON_AddNumberToObject(o, "balance_abs_threshold", (double)cfg->ca.balance_abs);
    cJSON_AddNumberToObject(o, "balance_rel_threshold", cfg->ca.balance_rel);
    cJSON_AddNumberToObject(o, "eviction_interval_secs", cfg->ca.eviction_secs);
    cJSON_AddNumberToObject(o, "max_tree_size", (double)cfg->ca.max_tree_size);
    for (int side = 0; side < 2; side++) {
        if (!rt->tree[side])
            continue;
        char key[40];
        snprintf(key, sizeof(key), "%s_cache_tree_nodes", side ? "decode" : "prefill");
        cJSON_AddNumberToObject(o, key, (double)pd_cache_tree_nodes(rt->tree[side]));
        snprintf(key, sizeof(key), "%s_cache_tree_bytes", side ? "decode" : "prefill");
        cJSON_AddNumberToObject(o, key, (double)pd_cache_tree_bytes(rt->tree[side]));
    }
    cJSON_AddStringToObject(o, "host", cfg->host);
    cJSON_AddNumberToObject(o, "port", pd_http_server_port(rt->http));
    cJSON_AddBoolToObject(o, "api_key_required", cfg->api_key != NULL);
    cJSON_AddNumberToObject(o, "request_timeout_secs", cfg->request_timeout_secs);
    cJSON_AddNumberToObject(o, "max_concurrent_requests", cfg->max_concurrent_requests);
    cJSON_AddNumberToObject(o, "health_check_interval_secs", cfg->health_check_interval_secs);
    cJSON_AddNumberToObject(o, "shutdown_timeout_secs", cfg->shutdown_timeout_secs);
    cJSON_AddNumberToObject(o, "dns_refresh_secs", cfg->dns_refresh_secs);
    cJSON_AddStringToObject(o, "dns_family", pd_router_dns_family_names[cfg->dns_family]);
    if (cfg->dns_server)
        cJSON_AddStringToObject(o, "dns_server", cfg->dns_server);
    cJSON_AddBoolToObject(o, "disable_circuit_breaker", cfg->cb.disabled);
    cJSON_AddNumberToObject(o, "cb_failure_threshold", cfg->cb.failure_threshold);
    cJSON_AddNumberToObject(o, "cb_success_threshold", cfg->cb.success_threshold);
    cJSON_AddNumberToObject(o, "cb_timeout_duration_secs", cfg->cb.timeout_s);
    cJSON_AddNumberToObject(o, "cb_window_duration_secs", cfg->cb.window_s);
    cJSON_AddNumberToObject(o, "retry_max_retries", cfg->retry_max_retries);
    cJSON_AddNumberToObject(o, "retry_initial_backoff_ms", cfg->backoff.initial_ms);
    cJSON_AddNumberToObject(o, "retry_max_backoff_ms", cfg->backoff.max_ms);
    cJSON_AddNumberToObject(o, "retry_backoff_multiplier", cfg->backoff.multiplier);
    cJSON_AddNumberToObject(o, "retry_jitter_factor", cfg->backoff.jitter);
    cJSON_AddNumberToObject(o, "num_running_reqs", rt->active);
    cJSON_AddNumberToObject(o, "num_requests_total", (double)rt->n_total);
    cJSON_AddNumberToObject(o, "num_failed_requests_total", (double)rt->n_failed);
    cJSON_AddNumberToObject(o, "num_retried_requests_total", (double)rt->n_retried);
    /* backpressure: what the router holds for slow clients, and how often decode waited */
    cJSON_AddNumberToObject(o, "stream_buffer_bytes_limit", cfg->stream_buffer_bytes);
    cJSON_AddNumberToObject(o, "stream_buffer_bytes", (double)hs.stream_backlog);
    cJSON_AddNumberToObject(o, "stream_buffer_peak_bytes", (double)hs.stream_backlog_peak);
    cJSON_AddNumberToObject(o, "num_stream_pauses_total", (double)rt->n_pauses);
    cJSON_AddNumberToObject(o, "num_slow_clients_cut_total", (double)hs.slow_clients_cut);
    cJSON_AddItemToObject(o, "workers", workers_json(rt));
    /* benchmark clients index internal_states[0] */
    cJSON *states = cJSON_AddArrayToObject(o, "internal_states");
    cJSON_AddItemToArray(states, cJSON_CreateObject());
    respond_cjson(hr, 200, o);
}

/* GET /metrics: the registry gauges from the workers there are now, then the text. */
static void handle_metrics(struct pd_router *rt, struct pd_http_req *hr) {
    pd_router_metrics_workers_begin(rt->metrics);
    for (int side = 0; side < 2; side++) {
        const struct registry *reg = side ? &rt->decode : &rt->prefill;
        for (int i = 0; i < reg->n; i++) {
            struct worker *w = reg->w[i];
            pd_router_metrics_worker(rt->metrics, w->spec.url, !side,
                                     w->load.healthy && !w->draining, w->load.inflight,
                                     cb_state(w));
            if (w->tenant >= 0)
                pd_router_metrics_tree_size(rt->metrics, w->spec.url,
                                            pd_cache_tree_tenant_size(rt->tree[side], w->tenant));
        }
    }
    char *text = NULL;
    size_t len = 0;
    if (pd_router_metrics_render(rt->metrics, &text, &len) != PD_OK) {
        respond_error(hr, 500, pd_error_msg());
        return;
    }
    pd_http_respond(hr, 200, PD_METRICS_CONTENT_TYPE, text, len);
    pd_free(text);
}

static void handle_get_load(struct pd_router *rt, struct pd_http_req *hr) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "load", rt->active);
    cJSON_AddItemToObject(o, "workers", workers_json(rt));
    respond_cjson(hr, 200, o);
}

static void handle_health(struct pd_router *rt, struct pd_http_req *hr) {
    int hp = count_healthy(&rt->prefill);
    int hd = count_healthy(&rt->decode);
    if (hp > 0 && hd > 0 && !rt->shutting_down) {
        pd_http_respond(hr, 200, "text/plain", "", 0);
        return;
    }
    char msg[160];
    if (rt->shutting_down)
        snprintf(msg, sizeof(msg), "the router is shutting down");
    else
        snprintf(msg, sizeof(msg), "not ready: %d/%d prefill and %d/%d decode workers healthy", hp,
                 rt->prefill.n, hd, rt->decode.n);
    respond_error(hr, 503, msg);
}

/* POST /abort_request from a client: the rid may live on any worker; tell them all. */
static void handle_abort(struct pd_router *rt, struct pd_http_req *hr) {
    size_t len;
    const char *body = pd_http_req_body(hr, &len);
    cJSON *j = cJSON_ParseWithLength(body, len);
    const cJSON *rid = cJSON_GetObjectItemCaseSensitive(j, "rid");
    if (!cJSON_IsString(rid)) {
        cJSON_Delete(j);
        respond_error(hr, 400, "abort_request needs {\"rid\": \"...\"}");
        return;
    }
    bool oom;
    char *line = auth_line_new(hr, &oom);
    for (int i = 0; i < rt->prefill.n; i++)
        send_abort(rt, NULL, rt->prefill.w[i], rid->valuestring, line);
    for (int i = 0; i < rt->decode.n; i++)
        send_abort(rt, NULL, rt->decode.w[i], rid->valuestring, line);
    pd_free(line);
    cJSON_Delete(j);
    respond_json(hr, 200, "{}");
}

/* POST /flush_cache: every worker holds its own prefix cache, so every worker is told (as
 * sglang-router fans it out); like /abort_request the answer does not wait for theirs, and a
 * worker that fails logs at debug level (a flush only drops unused entries, so one missed is
 * harmless). */
static void handle_flush_cache(struct pd_router *rt, struct pd_http_req *hr) {
    bool oom;
    char *line = auth_line_new(hr, &oom);
    int n = 0;
    for (int side = 0; side < 2; side++) {
        const struct registry *g = side ? &rt->decode : &rt->prefill;
        for (int i = 0; i < g->n; i++, n++)
            send_worker_post(rt, NULL, g->w[i], "/flush_cache", "{}", "flush_cache", line);
    }
    pd_free(line);
    char msg[80];
    snprintf(msg, sizeof(msg), "Cache flush sent to %d workers.\n", n);
    pd_http_respond(hr, 200, "text/plain", msg, strlen(msg));
}

/* "Authorization: Bearer <key>", compared in time independent of where it differs. */
static bool authorized(const struct pd_router *rt, struct pd_http_req *hr) {
    const char *key = rt->cfg->api_key;
    if (!key)
        return true;
    size_t alen, klen = strlen(key);
    const char *a = pd_http_req_header(hr, "authorization", &alen);
    if (!a || alen != 7 + klen || strncmp(a, "Bearer ", 7) != 0)
        return false;
    unsigned char diff = 0;
    for (size_t i = 0; i < klen; i++)
        diff |= (unsigned char)(a[7 + i] ^ key[i]);
    return diff == 0;
}

static void on_request(struct pd_http_req *hr, void *ud) {
    const struct endpoint *ep = ud;
    struct pd_router *rt = ep->rt;
    if (ep->kind == EP_HEALTH) {
        handle_health(rt, hr);
        return;
    }
    if (ep->kind == EP_METRICS) { /* public, like the daemons' (and served while draining) */
        handle_metrics(rt, hr);
        return;
    }
    if (rt->shutting_down) {
        respond_error(hr, 503, "the router is shutting down");
        return;
    }
    if (!authorized(rt, hr)) {
        respond_error(hr, 401, "invalid or missing API key (Authorization: Bearer ...)");
        return;
    }
    switch (ep->kind) {
    case EP_GENERATE: handle_generate(rt, hr, ep->route); break;
    case EP_PROXY_GET: handle_proxy(rt, hr, false); break;
    case EP_PROXY_POST: handle_proxy(rt, hr, true); break;
    case EP_FLUSH_CACHE: handle_flush_cache(rt, hr); break;
    case EP_SERVER_INFO: handle_server_info(rt, hr); break;
    case EP_GET_LOAD: handle_get_load(rt, hr); break;
    case EP_ABORT: handle_abort(rt, hr); break;
    case EP_WORKERS: handle_workers(rt, hr); break;
    case EP_LIST_WORKERS: handle_list_workers(rt, hr); break;
    case EP_HEALTH:
    case EP_METRICS: break;
    }
}

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
                                      ? registry_find(rt, !side, key)
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
            if (!registry_add(rt, !side, &spec, -1, NULL))
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
    /* no api_key here: the router checks it (on_request) to keep its 401 body */
    struct pd_http_server_config hc = {
        .host = cfg->host, .port = cfg->port, .max_body_bytes = MAX_BODY_BYTES};
    int rc = pd_http_server_new(rt->loop, &hc, &rt->http);
    if (rc)
        return rc;
    for (size_t i = 0; i < N_ENDPOINTS; i++) {
        rt->endpoints[i] = (struct endpoint){
            .rt = rt, .kind = endpoint_table[i].kind, .route = endpoint_table[i].route};
        rc = pd_http_server_route(rt->http, endpoint_table[i].method, endpoint_table[i].path,
                                  PD_HTTP_PUBLIC, on_request, &rt->endpoints[i]);
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
    if ((rc = pd_upstream_new(loop, &rt->up)))
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
    uv_timer_start(&rt->health_timer, on_health_tick, 0, every ? every : 1);
    if (rt->n_dns) {
        uint64_t dns_every = (uint64_t)(cfg->dns_refresh_secs * 1000);
        uv_timer_start(&rt->dns_timer, on_dns_tick, 0, dns_every ? dns_every : 1);
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
        stop_polls(rt->prefill.w[i]);
    for (int i = 0; i < rt->decode.n; i++)
        stop_polls(rt->decode.w[i]);
    while (rt->aborts) {
        pd_upstream_call_cancel(rt->aborts->call);
        abort_call_free(rt->aborts);
    }
    pd_upstream_free(rt->up); /* its own handles close on their own */
    rt->up = NULL;
    stop_dns(rt);
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
        stop_polls(rt->prefill.w[i]);
    for (int i = 0; i < rt->decode.n; i++)
        stop_polls(rt->decode.w[i]);
    rt->final_since_ms = uv_now(rt->loop);
    uv_timer_start(&rt->drain_timer, on_final_poll, 0, FINAL_POLL_MS);
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
    stop_dns(rt);
    uv_timer_start(&rt->drain_timer, on_drain_deadline, timeout_ms, 0);
    pd_http_server_shutdown(rt->http, timeout_ms + CUT_GRACE_MS, on_http_closed, rt);
}

void pd_router_free(struct pd_router *rt) {
    if (!rt)
        return;
    PD_ASSERT(rt->reqs == NULL);
    pd_http_server_free(rt->http);
    stop_dns(rt);
    while (rt->prefill.n)
        registry_remove(rt->prefill.w[rt->prefill.n - 1]);
    while (rt->decode.n)
        registry_remove(rt->decode.w[rt->decode.n - 1]);
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
