/*
 * router_internal.h — what router.c (request flow, retries, streaming, pass-through, lifecycle),
 * router_workers.c (registry, health and load polls, DNS discovery, worker choice),
 * router_endpoints.c (the router's own endpoints and the request dispatch), worker_posts.c (the
 * aborts and flushes sent to workers) and answers.c share: the router's state, its workers and
 * requests. Internal to router/.
 */
#ifndef PD_ROUTER_INTERNAL_H
#define PD_ROUTER_INTERNAL_H

#include "router/router.h"

#include "router/body.h"
#include "router/breaker.h"
#include "router/discovery.h"
#include "router/lpmerge.h"
#include "router/metrics.h"
#include "router/policy.h"
#include "router/prompt_size.h"
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
    double health_sent_s;  /* when the last /health call went out (pd__router_now_s) */
    double silent_since_s; /* the first unanswered /health of the current silence; 0: answers */
    int health_timeouts;   /* consecutive /health polls that timed out */
    bool given_up;         /* its requests were given up in this silence */
    /* decode: its /get_load says "local_prefill": true (it prefills bodies without bootstrap
     * fields itself), so --local-prefill-max-tokens may send it a prompt alone. Learned anew
     * each time it enters rotation (a restart may change its flags): with the local path on, a
     * decode joins only once a /get_load answered (join_on_load), so no request meets it
     * unknown. */
    bool local_prefill, join_on_load;
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
    int64_t lookups; /* lookups that ended (answered, empty or failed): /workers shows them */
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

#define N_ENDPOINTS 19 /* routes of endpoint_table (router_endpoints.c) */

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
    struct worker *pw, *dw;           /* chosen workers (referenced), NULL before; pw NULL for
                                         a local prefill */
    bool local;                       /* this attempt went to a decode alone (local prefill) */
    struct worker *prev_pw, *prev_dw; /* the first attempt's pair, avoided by the retry */
    struct pd_router_body_info info;
    char *sent;  /* body with the bootstrap fields */
    char *rtext; /* cache_aware: the routing text (route_text.h), NULL before it is needed */
    size_t rtext_len;
    size_t d_matched; /* decode cache_aware: the picked decode's matched bytes of rtext */
    /* --local-prefill-max-tokens: the prompt as measured for the estimate (psize_known), until
     * the decode's answer says its real count (learned once, into rt->token_rate) */
    struct pd_router_prompt_size psize;
    bool psize_known;
    struct sbuf last_ev; /* cache_aware decode: a /generate stream's last JSON event (answers.c) */
    size_t sent_len;
    struct pd_upstream_call *pcall, *dcall;
    bool streaming;       /* client answer started as a stream */
    bool client_gone;     /* calls dropped now end as client_gone (metrics) */
    bool first_byte_sent; /* a streamed answer's first byte went out (TTFT) */
    double t_start;       /* the client's request arrived (uv_hrtime, s) */
    /* this attempt's decode call started; its first answer byte came (0: not yet); curl's
     * pretransfer time of that call (the request about to go out), taken then */
    double t_dcall, t_ddata, d_pretransfer;
    bool paused; /* the decode call waits for the client to drain */
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
    struct pd_router_token_rate token_rate; /* --local-prefill-max-tokens' bytes a token */
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

/* router.c */
char *pd__router_auth_line_new(struct pd_http_req *hr, bool *oom);
void pd__router_handle_generate(struct pd_router *rt, struct pd_http_req *fr, int route);
void pd__router_handle_proxy(struct pd_router *rt, struct pd_http_req *fr, bool post);
double pd__router_now_s(void);
void pd__router_respond_cjson(struct pd_http_req *hr, int status, cJSON *root);
void pd__router_respond_error(struct pd_http_req *hr, int status, const char *msg);
void pd__router_respond_json(struct pd_http_req *hr, int status, const char *json);
int pd__router_sb_put(struct sbuf *b, const char *s, size_t n);
void pd__router_arm_retry_timer(struct pd_router *rt);
void pd__router_give_up_worker(struct pd_router *rt, struct worker *w, const char *why);

/* worker_posts.c */
void pd__router_send_abort(struct pd_router *rt, struct rreq *rq, const struct worker *w,
                           const char *rid, const char *auth_line);
void pd__router_send_worker_post(struct pd_router *rt, struct rreq *rq, const struct worker *w,
                                 const char *path, const char *body, const char *what,
                                 const char *auth_line);
void pd__router_worker_posts_forget(struct pd_router *rt, struct rreq *rq);
void pd__router_worker_posts_cancel(struct pd_router *rt);

/* router_workers.c */
bool pd__router_cb_allows(struct worker *w);
void pd__router_cb_note(struct worker *w, const struct pd_router_cb_change *ch, const char *why);
int pd__router_cb_state(struct worker *w);
int pd__router_count_healthy(const struct registry *g);
void pd__router_no_worker_msg(struct pd_router *rt, bool is_prefill, char *buf, size_t size);
void pd__router_on_dns_tick(uv_timer_t *t);
void pd__router_on_health_tick(uv_timer_t *t);
struct worker *pd__router_pick_worker(struct pd_router *rt, bool is_prefill,
                                      const struct worker *exclude, struct rreq *rq);
struct worker *pd__router_registry_add(struct pd_router *rt, bool is_prefill,
                                       struct pd_router_worker_spec *spec, int dns,
                                       const char *addr);
struct worker *pd__router_registry_find(struct pd_router *rt, bool is_prefill, const char *key);
void pd__router_registry_remove(struct worker *w);
const char *pd__router_role(const struct worker *w);
void pd__router_set_healthy(struct worker *w, bool ok, const char *why);
void pd__router_stop_dns(struct pd_router *rt);
void pd__router_stop_polls(struct worker *w);
void pd__router_worker_call_ended(struct worker *w);
struct worker *pd__router_worker_ref(struct worker *w);
void pd__router_worker_unref(struct worker *w);

/* router_endpoints.c */
void pd__router_on_request(struct pd_http_req *hr, void *ud);

/* answers.c: what decode's answer teaches the router. answer_first: the first bytes (a stream's
 * first event, or the whole answer); keep_last_event: each piece of whole events relayed;
 * answer_last: the whole answer, or the last event kept, once decode's answer ended with 2xx. */
void pd__router_answer_first(struct rreq *rq, const char *answer, size_t len);
void pd__router_keep_last_event(struct rreq *rq, const char *buf, size_t len);
void pd__router_answer_last(struct rreq *rq, const char *answer, size_t len);

#endif
