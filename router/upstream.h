/*
 * upstream.h — the router's HTTP client: libcurl's multi interface driven by the router's libuv
 * loop (CURLMOPT_SOCKETFUNCTION → uv_poll_t per socket, CURLMOPT_TIMERFUNCTION → one uv_timer_t),
 * so hundreds of upstream requests run on the loop thread without blocking it. URLs are http://
 * or https:// (curl's OpenSSL; the worker's certificate is always verified).
 *
 * A call delivers its response body as it arrives (on_data: an SSE stream passes through chunk
 * by chunk) and ends with exactly one on_done, unless it is cancelled first: after
 * pd_upstream_call_cancel no callback of that call runs again. Callbacks may start and cancel
 * calls (curl forbids touching the multi handle from inside its callbacks, so such changes are
 * queued and applied when curl returns). Owner: the caller owns the pd_upstream; each call is
 * owned by the upstream and freed after on_done or cancel.
 * Backpressure: pd_upstream_call_pause stops reading a call's response (curl_easy_pause), so a
 * slow client makes TCP push back on the worker instead of the router buffering its answer.
 */
#ifndef PD_ROUTER_UPSTREAM_H
#define PD_ROUTER_UPSTREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <uv.h>

struct pd_upstream;
struct pd_upstream_call;

struct pd_upstream_result {
    int status;        /* PD_OK: a whole HTTP response arrived (any HTTP status) */
    long http_status;  /* 0 when no response line arrived */
    bool unreachable;  /* the connection was never made (refused, unresolvable, connect timeout) */
    const char *error; /* what went wrong, "" on PD_OK; valid during on_done */
};

struct pd_upstream_cbs {
    /* A piece of the response body; status and content type are known by then. May be NULL. */
    void (*on_data)(void *ud, struct pd_upstream_call *call, const char *buf, size_t len);
    /* The call ended; `call` is freed after this returns. */
    void (*on_done)(void *ud, struct pd_upstream_call *call, const struct pd_upstream_result *r);
};

struct pd_upstream_req {
    const char *method;      /* "GET", "POST" */
    const char *url;         /* full URL */
    const char *body;        /* POST body (copied), may be NULL */
    size_t body_len;         /* bytes */
    const char *auth;        /* "Authorization: Bearer ..." header line, or NULL */
    long timeout_ms;         /* whole call; 0 = none */
    long connect_timeout_ms; /* 0 = curl's default */
};

/* ca_certs: the PEM CA bundle https:// workers' certificates must chain to (their host names
 * checked too); NULL = the system's roots. The string must outlive the upstream. */
int pd_upstream_new(uv_loop_t *loop, const char *ca_certs, struct pd_upstream **out);
/* Cancels every call (no callbacks) and frees the upstream once its libuv handles have closed
 * (run the loop afterwards). NULL is accepted. */
void pd_upstream_free(struct pd_upstream *up);

int pd_upstream_call_start(struct pd_upstream *up, const struct pd_upstream_req *req,
                           const struct pd_upstream_cbs *cbs, void *ud,
                           struct pd_upstream_call **out);
/* No callback of the call runs after this; the transfer is torn down. NULL is accepted. */
void pd_upstream_call_cancel(struct pd_upstream_call *call);

/* While paused the call reads nothing more from its worker and on_data does not run (its
 * timeout still counts). Unpausing may deliver data curl held back before this returns; on_done
 * may follow. Either may be called from any callback. NULL is accepted. */
void pd_upstream_call_pause(struct pd_upstream_call *call, bool paused);

/* The response status (0 before the status line) and Content-Type ("" when none). */
long pd_upstream_call_http_status(const struct pd_upstream_call *call);
const char *pd_upstream_call_content_type(const struct pd_upstream_call *call);
/* Seconds from the call's start to its request being about to go out (connection found or made;
 * curl's pretransfer time), 0 when curl cannot tell. */
double pd_upstream_call_pretransfer_s(const struct pd_upstream_call *call);

/* Calls currently started and not yet ended or cancelled (tests, shutdown). */
int pd_upstream_active(const struct pd_upstream *up);

#endif
