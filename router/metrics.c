/*
 * metrics.c — the router's series (see metrics.h). Families are registered once; a worker's or a
 * route's series is created the first time it is named (the registry finds it again after). A
 * series that cannot be created (out of memory) drops that one update: metrics never fail a
 * request. Duration buckets are sglang-router's; TTFT buckets are SGLang's server TTFT set.
 */
#include "router/metrics.h"
#include "router/breaker.h"
#include "router/policy.h"

#include "common/base/alloc.h"
#include "common/base/metrics.h"
#include "common/base/status.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

static const double DURATION_BOUNDS[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,   2.5,
                                         5,     10,    15,   30,    45,   60,  90,   120, 180, 240};
static const double TTFT_BOUNDS[] = {0.1, 0.2, 0.4, 0.6, 0.8, 1,  2,   4,   6,
                                     8,   10,  20,  40,  60,  80, 100, 200, 400};
/* the daemons' pdserve_handover_seconds buckets */
static const double HANDOVER_BOUNDS[] = {0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02,
                                         0.05,   0.1,     0.25,   0.5,   1,     2.5,   5,    10};
static const char *const HO_STAGES[PD_ROUTER_HO_N] = {"dispatch", "decode", "relay", "local"};
static const char *const OUTCOMES[PD_ROUTER_OUTCOME_N] = {"ok", "error", "timeout", "aborted",
                                                          "client_gone"};

struct pd_router_metrics {
    struct pd_metrics *reg;
    struct pd_metric_family *requests, *duration; /* {route} */
    struct pd_metric_family *calls;               /* {worker, role, outcome} */
    struct pd_metric_family *processed, *prefill_requests, *decode_requests, *prefill_errors,
        *decode_errors, *running, *health, *cb_state; /* {worker} */
    struct pd_metric_family *cb_outcomes;             /* {worker, outcome} */
    struct pd_metric_family *cb_transitions;          /* {worker, from, to} */
    struct pd_metric *active_workers, *ttft, *retries, *retries_exhausted;
    struct pd_metric *handover[PD_ROUTER_HO_N]; /* pdserve_router_handover_seconds{stage} */
    struct pd_metric *path[2]; /* pdserve_router_path_requests_total{path="pd"|"local"} */
    struct pd_metric_family *ca_decisions; /* {worker, decision} */
    struct pd_metric_family *tree_size;    /* {worker} */
    struct pd_metric *cache_hits, *cache_misses, *lb_events;
};

static const char *const L_ROUTE[] = {"route"};
static const char *const L_STAGE[] = {"stage"};
static const char *const L_PATH[] = {"path"};
static const char *const PATHS[2] = {"pd", "local"};
static const char *const L_WORKER[] = {"worker"};
static const char *const L_CALL[] = {"worker", "role", "outcome"};
static const char *const L_CB_OUTCOME[] = {"worker", "outcome"};
static const char *const L_CB_TRANSITION[] = {"worker", "from", "to"};
static const char *const L_DECISION[] = {"worker", "decision"};

static int fam(struct pd_router_metrics *rm, int kind, const char *name, const char *help, int nl,
               const char *const *labels, const double *bounds, int nb,
               struct pd_metric_family **out) {
    return pd_metrics_family(rm->reg,
                             &(struct pd_metric_desc){.kind = kind,
                                                      .name = name,
                                                      .help = help,
                                                      .n_labels = nl,
                                                      .labels = labels,
                                                      .n_bounds = nb,
                                                      .bounds = bounds},
                             out);
}

int pd_router_metrics_new(struct pd_router_metrics **out) {
    *out = NULL;
    struct pd_router_metrics *rm = pd_calloc(1, sizeof(*rm));
    if (!rm)
        return pd_errorf(PD_ENOMEM, "router metrics");
    int rc = pd_metrics_new(0, NULL, NULL, &rm->reg);
    const int C = PD_METRIC_COUNTER, G = PD_METRIC_GAUGE, H = PD_METRIC_HISTOGRAM;
    if (!rc)
        rc = fam(rm, C, "sgl_router_requests_total", "Total number of requests by route.", 1,
                 L_ROUTE, NULL, 0, &rm->requests);
    if (!rc)
        rc = fam(rm, H, "sgl_router_request_duration_seconds",
                 "Request duration in seconds by route (arrival to the answer's end).", 1, L_ROUTE,
                 DURATION_BOUNDS, (int)PD_ARRAY_LEN(DURATION_BOUNDS), &rm->duration);
    if (!rc)
        rc = fam(rm, C, "pdserve_router_requests_total",
                 "Calls to workers by worker, role (prefill|decode) and outcome.", 3, L_CALL, NULL,
                 0, &rm->calls);
    if (!rc)
        rc = fam(rm, C, "sgl_router_processed_requests_total",
                 "Total requests processed by each worker.", 1, L_WORKER, NULL, 0, &rm->processed);
    if (!rc)
        rc = fam(rm, C, "sgl_router_pd_prefill_requests_total",
                 "Total prefill requests per worker.", 1, L_WORKER, NULL, 0, &rm->prefill_requests);
    if (!rc)
        rc = fam(rm, C, "sgl_router_pd_decode_requests_total", "Total decode requests per worker.",
                 1, L_WORKER, NULL, 0, &rm->decode_requests);
    if (!rc)
        rc = fam(rm, C, "sgl_router_pd_prefill_errors_total",
                 "Total prefill server errors (non-2xx, transport failure or timeout).", 1,
                 L_WORKER, NULL, 0, &rm->prefill_errors);
    if (!rc)
        rc = fam(rm, C, "sgl_router_pd_decode_errors_total",
                 "Total decode server errors (non-2xx, transport failure or timeout).", 1, L_WORKER,
                 NULL, 0, &rm->decode_errors);
    if (!rc)
        rc = fam(rm, G, "sgl_router_running_requests",
                 "Number of requests the router has in flight on each worker.", 1, L_WORKER, NULL,
                 0, &rm->running);
    if (!rc)
        rc =
            fam(rm, G, "sgl_router_worker_health", "Worker health status (1=healthy, 0=unhealthy).",
                1, L_WORKER, NULL, 0, &rm->health);
    if (!rc)
        rc = fam(rm, G, "sgl_router_cb_state",
                 "Circuit breaker state per worker (0=closed, 1=open, 2=half_open).", 1, L_WORKER,
                 NULL, 0, &rm->cb_state);
    if (!rc)
        rc = fam(rm, C, "sgl_router_cb_outcomes_total",
                 "Outcomes the circuit breakers counted, by worker and outcome (success|failure).",
                 2, L_CB_OUTCOME, NULL, 0, &rm->cb_outcomes);
    if (!rc)
        rc = fam(rm, C, "sgl_router_cb_state_transitions_total",
                 "Circuit breaker state transitions by worker.", 3, L_CB_TRANSITION, NULL, 0,
                 &rm->cb_transitions);
    if (!rc)
        rc = pd_metrics_single(
            rm->reg,
            &(struct pd_metric_desc){.kind = C,
                                     .name = "sgl_router_retries_exhausted_total",
                                     .help = "Total number of requests that failed on their last "
                                             "allowed attempt (--retry-max-retries)."},
            &rm->retries_exhausted);
    if (!rc)
        rc = pd_metrics_single(rm->reg,
                               &(struct pd_metric_desc){.kind = G,
                                                        .name = "sgl_router_active_workers",
                                                        .help = "Number of healthy workers."},
                               &rm->active_workers);
    if (!rc)
        rc = pd_metrics_single(
            rm->reg,
            &(struct pd_metric_desc){.kind = C,
                                     .name = "sgl_router_retries_total",
                                     .help = "Total number of requests retried on another pair."},
            &rm->retries);
    if (!rc)
        rc = pd_metrics_single(
            rm->reg,
            &(struct pd_metric_desc){.kind = H,
                                     .name = "pdserve_router_time_to_first_token_seconds",
                                     .help = "Time to first token of streamed answers as the "
                                             "router sees it, in seconds.",
                                     .n_bounds = (int)PD_ARRAY_LEN(TTFT_BOUNDS),
                                     .bounds = TTFT_BOUNDS},
            &rm->ttft);
    struct pd_metric_family *ho = NULL;
    if (!rc)
        rc = fam(rm, H, "pdserve_router_handover_seconds",
                 "The router's part of a streamed answer's first byte by stage: dispatch, decode "
                 "(PD path) or local (a decode's local prefill), relay; a request's stages add up "
                 "to its pdserve_router_time_to_first_token_seconds.",
                 1, L_STAGE, HANDOVER_BOUNDS, (int)PD_ARRAY_LEN(HANDOVER_BOUNDS), &ho);
    for (int k = 0; !rc && k < PD_ROUTER_HO_N; k++) {
        const char *v = HO_STAGES[k];
        rc = pd_metrics_series(ho, &v, &rm->handover[k]);
    }
    struct pd_metric_family *paths = NULL;
    if (!rc)
        rc = fam(rm, C, "pdserve_router_path_requests_total",
                 "Generation request attempts by path: pd (a prefill and a decode) or local (a "
                 "decode alone, --local-prefill-max-tokens).",
                 1, L_PATH, NULL, 0, &paths);
    for (int k = 0; !rc && k < 2; k++) {
        const char *v = PATHS[k];
        rc = pd_metrics_series(paths, &v, &rm->path[k]);
    }
    if (!rc)
        rc = fam(rm, C, "pdserve_router_cache_aware_decisions_total",
                 "cache_aware prefill choices by worker and deciding rule (match: best prefix "
                 "match; balance: least loaded under imbalance; smallest: smallest tree).",
                 2, L_DECISION, NULL, 0, &rm->ca_decisions);
    if (!rc)
        rc = fam(rm, G, "sgl_router_tree_size",
                 "Bytes of request text the cache_aware prefix tree holds for each prefill.", 1,
                 L_WORKER, NULL, 0, &rm->tree_size);
    if (!rc)
        rc = pd_metrics_single(
            rm->reg,
            &(struct pd_metric_desc){.kind = C,
                                     .name = "sgl_router_cache_hits_total",
                                     .help = "cache_aware choices by prefix match (above "
                                             "--cache-threshold)."},
            &rm->cache_hits);
    if (!rc)
        rc = pd_metrics_single(
            rm->reg,
            &(struct pd_metric_desc){.kind = C,
                                     .name = "sgl_router_cache_misses_total",
                                     .help = "cache_aware choices of the smallest tree (match at "
                                             "or below --cache-threshold)."},
            &rm->cache_misses);
    if (!rc)
        rc = pd_metrics_single(
            rm->reg,
            &(struct pd_metric_desc){.kind = C,
                                     .name = "sgl_router_load_balancing_events_total",
                                     .help = "cache_aware choices of the least loaded prefill "
                                             "under load imbalance."},
            &rm->lb_events);
    if (rc) {
        pd_router_metrics_free(rm);
        return pd_error_wrap(rc, "registering the router's metrics");
    }
    *out = rm;
    return PD_OK;
}

void pd_router_metrics_free(struct pd_router_metrics *rm) {
    if (!rm)
        return;
    pd_metrics_free(rm->reg);
    pd_free(rm);
}

static struct pd_metric *series(struct pd_metric_family *f, const char *const *values) {
    struct pd_metric *s;
    return pd_metrics_series(f, values, &s) == PD_OK ? s : NULL;
}

static void count(struct pd_metric_family *f, const char *value) {
    struct pd_metric *s = series(f, &value);
    if (s)
        pd_metric_add(s, 1);
}

/* route without its query string, at most 128 bytes */
static void route_key(const char *route, char *buf, size_t cap) {
    size_t n = strcspn(route ? route : "", "?");
    snprintf(buf, cap, "%.*s", (int)(n < 128 ? n : 128), route ? route : "");
}

void pd_router_metrics_request(struct pd_router_metrics *rm, const char *route) {
    char r[160];
    route_key(route, r, sizeof(r));
    count(rm->requests, r);
}

void pd_router_metrics_done(struct pd_router_metrics *rm, const char *route, double seconds) {
    char r[160];
    route_key(route, r, sizeof(r));
    const char *v = r;
    struct pd_metric *s = series(rm->duration, &v);
    if (s)
        pd_metric_observe(s, seconds);
}

void pd_router_metrics_ttft(struct pd_router_metrics *rm, double seconds) {
    pd_metric_observe(rm->ttft, seconds);
}

void pd_router_metrics_handover(struct pd_router_metrics *rm, const double s[PD_ROUTER_HO_N]) {
    for (int k = 0; k < PD_ROUTER_HO_N; k++)
        if (s[k] >= 0)
            pd_metric_observe(rm->handover[k], s[k]);
}

void pd_router_metrics_handover_info(const struct pd_router_metrics *rm, struct cJSON *o) {
    cJSON *h = cJSON_AddObjectToObject(o, "handover");
    for (int k = 0; h && k < PD_ROUTER_HO_N; k++) {
        uint64_t c = pd_metric_count(rm->handover[k]);
        if (c == 0)
            continue;
        cJSON *s = cJSON_AddObjectToObject(h, HO_STAGES[k]);
        cJSON_AddNumberToObject(s, "count", (double)c);
        cJSON_AddNumberToObject(s, "mean_ms", pd_metric_value(rm->handover[k]) / (double)c * 1e3);
    }
}

void pd_router_metrics_path(struct pd_router_metrics *rm, bool local) {
    pd_metric_add(rm->path[local], 1);
}

void pd_router_metrics_retry(struct pd_router_metrics *rm) {
    pd_metric_add(rm->retries, 1);
}

void pd_router_metrics_retries_exhausted(struct pd_router_metrics *rm) {
    pd_metric_add(rm->retries_exhausted, 1);
}

void pd_router_metrics_cb_outcome(struct pd_router_metrics *rm, const char *url, bool success) {
    const char *v[] = {url, success ? "success" : "failure"};
    struct pd_metric *s = series(rm->cb_outcomes, v);
    if (s)
        pd_metric_add(s, 1);
}

void pd_router_metrics_cb_transition(struct pd_router_metrics *rm, const char *url, int from,
                                     int to) {
    PD_ASSERT(from >= 0 && from <= PD_ROUTER_CB_HALF_OPEN && to >= 0 &&
              to <= PD_ROUTER_CB_HALF_OPEN);
    const char *v[] = {url, pd_router_cb_state_names[from], pd_router_cb_state_names[to]};
    struct pd_metric *s = series(rm->cb_transitions, v);
    if (s)
        pd_metric_add(s, 1);
}

void pd_router_metrics_call_start(struct pd_router_metrics *rm, const char *url, bool prefill) {
    count(rm->processed, url);
    count(prefill ? rm->prefill_requests : rm->decode_requests, url);
}

void pd_router_metrics_call_end(struct pd_router_metrics *rm, const char *url, bool prefill,
                                int outcome) {
    PD_ASSERT(outcome >= 0 && outcome < PD_ROUTER_OUTCOME_N);
    const char *v[] = {url, prefill ? "prefill" : "decode", OUTCOMES[outcome]};
    struct pd_metric *s = series(rm->calls, v);
    if (s)
        pd_metric_add(s, 1);
    if (outcome == PD_ROUTER_OUTCOME_ERROR || outcome == PD_ROUTER_OUTCOME_TIMEOUT)
        count(prefill ? rm->prefill_errors : rm->decode_errors, url);
}

void pd_router_metrics_cache_aware(struct pd_router_metrics *rm, const char *url, int decision) {
    PD_ASSERT(decision >= PD_ROUTER_CA_MATCH && decision <= PD_ROUTER_CA_SMALLEST);
    const char *v[] = {url, pd_router_ca_decision_names[decision]};
    struct pd_metric *s = series(rm->ca_decisions, v);
    if (s)
        pd_metric_add(s, 1);
    pd_metric_add(decision == PD_ROUTER_CA_MATCH     ? rm->cache_hits
                  : decision == PD_ROUTER_CA_BALANCE ? rm->lb_events
                                                     : rm->cache_misses,
                  1);
}

void pd_router_metrics_tree_size(struct pd_router_metrics *rm, const char *url, size_t bytes) {
    struct pd_metric *s = series(rm->tree_size, &url);
    if (s)
        pd_metric_set(s, (double)bytes);
}

void pd_router_metrics_workers_begin(struct pd_router_metrics *rm) {
    pd_metrics_family_set(rm->tree_size, 0);
    pd_metrics_family_set(rm->running, 0);
    pd_metrics_family_set(rm->health, 0);
    pd_metrics_family_set(rm->cb_state, 0);
    pd_metric_set(rm->active_workers, 0);
}

void pd_router_metrics_worker(struct pd_router_metrics *rm, const char *url, bool prefill,
                              bool healthy, int64_t inflight, int cb_state) {
    (void)prefill;
    struct pd_metric *r = series(rm->running, &url), *h = series(rm->health, &url);
    struct pd_metric *cb = series(rm->cb_state, &url);
    if (cb)
        pd_metric_set(cb, cb_state);
    if (r)
        pd_metric_set(r, (double)inflight);
    if (h)
        pd_metric_set(h, healthy ? 1 : 0);
    if (healthy)
        pd_metric_add(rm->active_workers, 1);
}

int pd_router_metrics_render(struct pd_router_metrics *rm, char **out, size_t *len) {
    return pd_metrics_render(rm->reg, out, len);
}
