/*
 * metrics.h — pdserve-router's /metrics (common/base/metrics.h underneath), under sglang-router's
 * sgl_router_* names where it has the series and pdserve_router_… where it has not.
 *
 * Per-worker series are keyed by the worker's URL (and role), not by its place in the router's
 * worker arrays, so they survive workers coming and going: counters of a worker that left stay
 * (counters never go back), its gauges read 0 from the next scrape on. The gauges that mirror the
 * registry (health, requests in flight) are set at scrape time from whatever workers exist then
 * (pd_router_metrics_workers_begin, then pd_router_metrics_worker for each).
 *
 * Timings (monotonic clock, seconds): request duration = the client's request arrived → its
 * answer finished (or the client left); TTFT = arrival → the first byte of a streamed answer
 * handed to the client's connection (streams only). Loop thread only (like the router).
 */
#ifndef PD_ROUTER_METRICS_H
#define PD_ROUTER_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* How one call to a worker ended: the outcome label of pdserve_router_requests_total. */
enum pd_router_outcome {
    PD_ROUTER_OUTCOME_OK,          /* answered 2xx */
    PD_ROUTER_OUTCOME_ERROR,       /* answered non-2xx, or the transport failed */
    PD_ROUTER_OUTCOME_TIMEOUT,     /* --request-timeout-secs passed */
    PD_ROUTER_OUTCOME_ABORTED,     /* the router gave the call up (its pair failed, shutdown) */
    PD_ROUTER_OUTCOME_CLIENT_GONE, /* the client went away first */
    PD_ROUTER_OUTCOME_N,
};

struct pd_router_metrics;
struct cJSON;

int pd_router_metrics_new(struct pd_router_metrics **out);
void pd_router_metrics_free(struct pd_router_metrics *rm);

/* A client request on route (its path; a query string is cut off). */
void pd_router_metrics_request(struct pd_router_metrics *rm, const char *route);
/* Its answer finished after seconds. */
void pd_router_metrics_done(struct pd_router_metrics *rm, const char *route, double seconds);
/* A streamed answer's first byte went to the client after seconds. */
void pd_router_metrics_ttft(struct pd_router_metrics *rm, double seconds);
/* The router's part of a streamed answer's first byte (pdserve_router_handover_seconds{stage}):
 * dispatch (arrival → the request about to go out to decode), decode (→ decode's first answer
 * byte here: decode's time to first token and the way there and back) on the PD path, or local
 * (the same for a decode's local prefill, --local-prefill-max-tokens), and relay (→ that byte,
 * or the first whole event, handed to the client's connection). dispatch, decode or local, and
 * relay add up to the TTFT above. */
enum pd_router_ho_stage {
    PD_ROUTER_HO_DISPATCH,
    PD_ROUTER_HO_DECODE,
    PD_ROUTER_HO_RELAY,
    PD_ROUTER_HO_LOCAL,
    PD_ROUTER_HO_N
};
/* s[stage] < 0: not on this request's path (not observed). */
void pd_router_metrics_handover(struct pd_router_metrics *rm, const double s[PD_ROUTER_HO_N]);
/* /server_info's "handover": {stage: {count, mean_ms}} of the stages observed so far. */
void pd_router_metrics_handover_info(const struct pd_router_metrics *rm, struct cJSON *o);
/* A generation request's attempt took the PD path or a decode alone (local prefill). */
void pd_router_metrics_path(struct pd_router_metrics *rm, bool local);
/* A retry on another pair; a request that failed after its last allowed attempt. */
void pd_router_metrics_retry(struct pd_router_metrics *rm);
void pd_router_metrics_retries_exhausted(struct pd_router_metrics *rm);
/* Circuit breaker (breaker.h) of worker url: an outcome it counted, a state change. */
void pd_router_metrics_cb_outcome(struct pd_router_metrics *rm, const char *url, bool success);
void pd_router_metrics_cb_transition(struct pd_router_metrics *rm, const char *url, int from,
                                     int to);
/* A call to worker url (prefill or decode) started / ended. */
void pd_router_metrics_call_start(struct pd_router_metrics *rm, const char *url, bool prefill);
void pd_router_metrics_call_end(struct pd_router_metrics *rm, const char *url, bool prefill,
                                int outcome);

/* cache_aware chose worker url by decision (enum pd_router_ca_decision, policy.h): counts
 * pdserve_router_cache_aware_decisions_total{worker,decision} and sglang-router's
 * sgl_router_cache_hits_total (match), sgl_router_cache_misses_total (smallest tree) and
 * sgl_router_load_balancing_events_total (balance). */
void pd_router_metrics_cache_aware(struct pd_router_metrics *rm, const char *url, int decision);
/* At scrape time, after pd_router_metrics_workers_begin: bytes of prefix tree held for url. */
void pd_router_metrics_tree_size(struct pd_router_metrics *rm, const char *url, size_t bytes);

/* Scrape: zero the registry gauges, set them per current worker, then render (*out: pd_free). */
void pd_router_metrics_workers_begin(struct pd_router_metrics *rm);
void pd_router_metrics_worker(struct pd_router_metrics *rm, const char *url, bool prefill,
                              bool healthy, int64_t inflight, int cb_state);
int pd_router_metrics_render(struct pd_router_metrics *rm, char **out, size_t *len);

#endif
