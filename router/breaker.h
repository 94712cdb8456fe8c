/*
 * breaker.h — the router's per-worker circuit breaker (sglang-router's --cb-* flags and
 * semantics), pure: callers pass the time, so tests drive it with an injected clock.
 *
 * closed → open after --cb-failure-threshold consecutive failures (a failure older than
 * --cb-window-duration-secs before the next one no longer counts: the run starts again);
 * open → half-open once --cb-timeout-duration-secs passed (checked lazily, whenever someone asks);
 * half-open → closed after --cb-success-threshold consecutive successes, → open again on one
 * failure. Open workers take no new requests; half-open ones do (as in sglang-router), and the
 * first answers decide. Outcomes that arrive while open (calls started before it opened) are
 * ignored. A disabled breaker stays closed.
 *
 * Also here, because it decides whose failure a failed pair was: the reading of a worker's
 * error message that says the KV transfer (bootstrap) between the pair failed.
 */
#ifndef PD_ROUTER_BREAKER_H
#define PD_ROUTER_BREAKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum pd_router_cb_state {
    PD_ROUTER_CB_CLOSED = 0, /* the gauge values of sgl_router_cb_state */
    PD_ROUTER_CB_OPEN = 1,
    PD_ROUTER_CB_HALF_OPEN = 2,
};
extern const char *const pd_router_cb_state_names[]; /* "closed", "open", "half_open" */

struct pd_router_cb_config {
    bool disabled;
    int failure_threshold; /* >= 1 */
    int success_threshold; /* >= 1 */
    double timeout_s;      /* open → half-open */
    double window_s;       /* a failure older than this no longer counts toward the threshold */
};

struct pd_router_cb {
    int state; /* enum pd_router_cb_state */
    int consecutive_failures, consecutive_successes;
    uint64_t total_failures, total_successes; /* outcomes counted (not the ignored ones) */
    double last_failure;                      /* s; valid once total_failures > 0 */
    double since;                             /* s; when the current state began */
};

/* A state change, for logs and metrics (from != to). */
struct pd_router_cb_change {
    int from, to;
};

/* Closed, counters zero, entered at now. */
void pd_router_cb_init(struct pd_router_cb *cb, double now);

/* The state at now: an open breaker whose timeout passed becomes half-open here (*change says
 * so, from != to; from == to when nothing changed). */
int pd_router_cb_state_at(struct pd_router_cb *cb, const struct pd_router_cb_config *cfg,
                          double now, struct pd_router_cb_change *change);

/* May a new request go to this worker at now? (closed or half-open) */
bool pd_router_cb_allows(struct pd_router_cb *cb, const struct pd_router_cb_config *cfg, double now,
                         struct pd_router_cb_change *change);

/* One call's outcome. Returns true when it was counted (false: the breaker is disabled or open,
 * and the outcome says nothing about now); *change tells a state change. */
bool pd_router_cb_record(struct pd_router_cb *cb, const struct pd_router_cb_config *cfg,
                         bool success, double now, struct pd_router_cb_change *change);

/* The worker came back (its /health answered 200 after failing, e.g. it was restarted): a new
 * process starts with a clean slate, closed with no failures counted. (Half-open would turn a
 * restart into a 30 s outage: the first request after a restart can fail while its peer still
 * reconnects, and one half-open failure opens the circuit again.) */
void pd_router_cb_recovered(struct pd_router_cb *cb, const struct pd_router_cb_config *cfg,
                            double now, struct pd_router_cb_change *change);

/* Seconds until an open breaker turns half-open (0 when not open). */
double pd_router_cb_open_remaining(const struct pd_router_cb *cb,
                                   const struct pd_router_cb_config *cfg, double now);

/* A worker's error answer (JSON {"error": {"message"}} or an SSE body whose first event is one;
 * len bytes, need not be NUL-terminated): true when its message says the KV cache transfer
 * between the pair failed or never started — pdserve's "KV transfer failed: …" (a refused or
 * unreachable bootstrap, a Pair that failed, a peer gone mid-transfer) and "timed out waiting
 * for the prefill's KV cache", SGLang's "KVTransferError" / "bootstrap" failures. From a decode
 * this blames the prefill; from a prefill, the decode. *msg (may be NULL) gets the message
 * (truncated to cap bytes, "" when there is none). */
bool pd_router_transfer_failed(const char *body, size_t len, char *msg, size_t cap);

#endif
