/*
 * serve_metrics.c — registers a daemon's series (see serve_metrics.h) and turns the engine's
 * published counters into gauges at scrape time. Bucket sets are SGLang's (TokenizerMetrics-
 * Collector / SchedulerMetricsCollector defaults) so that dashboards built for SGLang read ours;
 * the KV-transfer latency histogram is pdserve's own (SGLang only has last-value gauges, which
 * we export too).
 */
#include "common/serve_metrics.h"

#include "common/base/alloc.h"
#include "common/base/status.h"

#include <stdio.h>

static const double TTFT_BOUNDS[] = {0.1, 0.2, 0.4, 0.6, 0.8, 1,  2,   4,   6,
                                     8,   10,  20,  40,  60,  80, 100, 200, 400};
static const double ITL_BOUNDS[] = {0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025,
                                    0.03,  0.035, 0.04,  0.06,  0.08, 0.1,   0.2,  0.4,
                                    0.6,   0.8,   1,     2,     4,    6,     8};
static const double E2E_BOUNDS[] = {0.1, 0.2, 0.4, 0.6, 0.8, 1,   2,   4,   6,    8,    10,
                                    20,  40,  60,  80,  100, 200, 400, 600, 1200, 1800, 2400};
static const double QUEUE_BOUNDS[] = {0,   0.1,  0.2,  0.5,  1,    2,    3,    4,    5,
                                      10,  15,   20,   30,   40,   50,   60,   70,   80,
                                      90,  100,  200,  300,  400,  500,  600,  700,  800,
                                      900, 1000, 1200, 1400, 1600, 1800, 2000, 2500, 3000};
static const double HANDOVER_BOUNDS[] = {0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02,
                                         0.05,   0.1,     0.25,   0.5,   1,     2.5,   5,    10};
static const double KV_LATENCY_BOUNDS[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                           0.05,   0.1,   0.25,   0.5,   1,    2.5,
                                           5,      10,    30,     60,    120,  300};

static const char *const KV_FAIL_NAMES[PD_KV_FAIL_N] = {"timeout", "peer", "aborted", "rejected",
                                                        "error"};

#define ADD(field, kind_, name_, help_)                                                            \
    do {                                                                                           \
        if (!rc)                                                                                   \
            rc = pd_metrics_single(                                                                \
                sm->reg,                                                                           \
                &(struct pd_metric_desc){.kind = (kind_), .name = (name_), .help = (help_)},       \
                &sm->field);                                                                       \
    } while (0)

#define ADD_HIST(field, name_, help_, bounds_)                                                     \
    do {                                                                                           \
        if (!rc)                                                                                   \
            rc = pd_metrics_single(sm->reg,                                                        \
                                   &(struct pd_metric_desc){.kind = PD_METRIC_HISTOGRAM,           \
                                                            .name = (name_),                       \
                                                            .help = (help_),                       \
                                                            .n_bounds = PD_ARRAY_LEN(bounds_),     \
                                                            .bounds = (bounds_)},                  \
                                   &sm->field);                                                    \
    } while (0)

const char *const pd_handover_stage_names[PD_HO_N] = {
    "reserve",      "bootstrap_wait", "prefill_queue", "prefill_first_chunk",
    "prefill_rest", "kv_other",       "first_token"};

/* A family with one label, and its series for each value (a histogram: with bounds). */
static int add_labelled(struct pd_serve_metrics *sm, int kind, const char *name, const char *help,
                        const char *label, const char *const *values, int n, struct pd_metric **out,
                        int n_bounds, const double *bounds) {
    struct pd_metric_family *f;
    const char *labels[1] = {label};
    int rc = pd_metrics_family(sm->reg,
                               &(struct pd_metric_desc){.kind = kind,
                                                        .name = name,
                                                        .help = help,
                                                        .n_labels = 1,
                                                        .labels = labels,
                                                        .n_bounds = n_bounds,
                                                        .bounds = bounds},
                               &f);
    for (int i = 0; !rc && i < n; i++)
        rc = pd_metrics_series(f, &values[i], &out[i]);
    return rc;
}

static int add_all(struct pd_serve_metrics *sm, int32_t n_pages) {
    int rc = PD_OK;
    const struct pd_serve_metrics_role *role = sm->role;
    ADD(num_running, PD_METRIC_GAUGE, "sglang:num_running_reqs", role->running_help);
    ADD(num_queue, PD_METRIC_GAUGE, "sglang:num_queue_reqs", role->queue_help);
    ADD(token_usage, PD_METRIC_GAUGE, "sglang:token_usage",
        "The token usage: share of the KV pool held by requests (prefix-cache-only pages count "
        "as free: they are evictable).");
    ADD(num_used_tokens, PD_METRIC_GAUGE, "sglang:num_used_tokens",
        "The number of used tokens (KV pool pages held by requests, in tokens).");
    ADD(max_total_tokens, PD_METRIC_GAUGE, "sglang:max_total_num_tokens",
        "Maximum total number of tokens in the KV cache pool.");
    ADD(cache_hit_rate, PD_METRIC_GAUGE, "sglang:cache_hit_rate",
        "The prefix cache hit rate: cached prompt tokens / prompt tokens of finished requests.");
    ADD(prefix_cache_tokens, PD_METRIC_GAUGE, "pdserve_prefix_cache_tokens",
        "Tokens of KV pool pages held by the prefix cache alone (evictable).");
    ADD(num_draining, PD_METRIC_GAUGE, "pdserve_num_draining_reqs",
        "Requests ended whose pages wait until no KV write can still land in them.");
    if (!rc) {
        char ps[24], np[24];
        snprintf(ps, sizeof(ps), "%d", sm->page_size);
        snprintf(np, sizeof(np), "%d", (int)n_pages);
        const char *labels[] = {"page_size", "num_pages"}, *values[] = {ps, np};
        struct pd_metric_family *f;
        rc = pd_metrics_family(sm->reg,
                               &(struct pd_metric_desc){.kind = PD_METRIC_GAUGE,
                                                        .name = "sglang:cache_config_info",
                                                        .help = "Information of the KV cache "
                                                                "configuration (always 1).",
                                                        .n_labels = 2,
                                                        .labels = labels},
                               &f);
        if (!rc)
            rc = pd_metrics_series(f, values, &sm->cache_config);
        if (!rc)
            pd_metric_set(sm->cache_config, 1);
    }
    /* prefill's chunked-prefill queue; on decode, the colocated mode's (0 in PD decode) */
    ADD(q_waiting, PD_METRIC_GAUGE, "pdserve_num_waiting_queue_reqs",
        "Requests in the chunked-prefill scheduler's waiting queue (prefill, or colocated).");
    /* images: where the vision encoder runs (prefill, colocated); 0 elsewhere */
    ADD(mm_encoder_runs, PD_METRIC_COUNTER, "pdserve_mm_encoder_runs_total",
        "Images run through the vision encoder (a cached image is not run again).");
    ADD(mm_cache_hits, PD_METRIC_COUNTER, "pdserve_mm_embedding_cache_hits_total",
        "Images whose embeddings the embedding cache held when a prefill chunk first needed "
        "them.");
    ADD(mm_cache_misses, PD_METRIC_COUNTER, "pdserve_mm_embedding_cache_misses_total",
        "Images the embedding cache did not hold (then encoded).");
    ADD(mm_cache_bytes, PD_METRIC_GAUGE, "pdserve_mm_embedding_cache_bytes",
        "Bytes the embedding cache holds (--mm-embedding-cache-mb bounds it).");
    ADD(mm_cache_entries, PD_METRIC_GAUGE, "pdserve_mm_embedding_cache_entries",
        "Images the embedding cache holds.");
    for (int i = 0; !rc && i < role->n_series; i++) {
        const struct pd_serve_metrics_series *x = &role->series[i];
        rc = pd_metrics_single(
            sm->reg, &(struct pd_metric_desc){.kind = x->kind, .name = x->name, .help = x->help},
            &sm->role_series[i]);
    }
    ADD(prompt_tokens, PD_METRIC_COUNTER, "sglang:prompt_tokens_total",
        "Number of prefill tokens processed (prompts of finished or aborted requests).");
    ADD(generation_tokens, PD_METRIC_COUNTER, "sglang:generation_tokens_total",
        "Number of generation tokens processed (outputs of finished or aborted requests).");
    ADD(cached_tokens, PD_METRIC_COUNTER, "sglang:cached_tokens_total",
        "Number of cached prompt tokens.");
    ADD(num_requests, PD_METRIC_COUNTER, "sglang:num_requests_total",
        "Number of requests processed (ended here, however they ended).");
    ADD(num_aborted, PD_METRIC_COUNTER, "sglang:num_aborted_requests_total",
        "Number of requests aborted.");
    ADD(num_failed, PD_METRIC_COUNTER, "pdserve_num_failed_requests_total",
        "Number of requests that ended with an error.");
    ADD(bootstrap_failed, PD_METRIC_COUNTER, "sglang:num_bootstrap_failed_reqs_total",
        "The number of bootstrap failed requests.");
    ADD(transfer_failed, PD_METRIC_COUNTER, "sglang:num_transfer_failed_reqs_total",
        "The number of transfer failed requests.");
    ADD_HIST(ttft, "sglang:time_to_first_token_seconds",
             "Histogram of time to first token in seconds.", TTFT_BOUNDS);
    if (role->itl)
        ADD_HIST(itl, "sglang:inter_token_latency_seconds",
                 "Histogram of inter-token latency in seconds.", ITL_BOUNDS);
    ADD_HIST(e2e, "sglang:e2e_request_latency_seconds",
             "Histogram of End-to-end request latency in seconds", E2E_BOUNDS);
    ADD_HIST(queue_time, "sglang:queue_time_seconds", "Histogram of queueing time in seconds.",
             QUEUE_BOUNDS);
    ADD(kv_bytes, PD_METRIC_COUNTER, "pdserve_kv_transfer_bytes_total", role->kv_bytes_help);
    ADD_HIST(kv_latency, "pdserve_kv_transfer_latency_seconds", role->kv_latency_help,
             KV_LATENCY_BOUNDS);
    if (!rc)
        rc = add_labelled(sm, PD_METRIC_COUNTER, "pdserve_kv_transfer_failures_total",
                          "KV transfers that failed, by reason.", "reason", KV_FAIL_NAMES,
                          PD_KV_FAIL_N, sm->kv_fail, 0, NULL);
    if (!rc)
        rc = add_labelled(sm, PD_METRIC_HISTOGRAM, "pdserve_handover_seconds",
                          "A PD request's hand-over by stage (decode: its stages add up to its "
                          "time to first token; prefill: its own part).",
                          "stage", pd_handover_stage_names, PD_HO_N, sm->handover,
                          (int)(sizeof(HANDOVER_BOUNDS) / sizeof(HANDOVER_BOUNDS[0])),
                          HANDOVER_BOUNDS);
    ADD(kv_last_speed_gb_s, PD_METRIC_GAUGE, "sglang:kv_transfer_speed_gb_s",
        "The transfer speed of the KV cache in GB/s (last transfer).");
    ADD(kv_last_latency_ms, PD_METRIC_GAUGE, "sglang:kv_transfer_latency_ms",
        "The transfer latency of the KV cache in ms (last transfer).");
    ADD(kv_last_total_mb, PD_METRIC_GAUGE, "sglang:kv_transfer_total_mb",
        "The size of the last KV transfer in MB.");
    if (!rc) {
        const char *results[] = {"ok", "busy", "failed"};
        rc = add_labelled(sm, PD_METRIC_COUNTER, "pdserve_health_generate_total",
                          "/health_generate probes by result.", "result", results, 3, sm->health, 0,
                          NULL);
    }
    return rc;
}

int pd_serve_metrics_new(const struct pd_serve_metrics_role *role, const char *model_name,
                         int page_size, int32_t n_pages, struct pd_serve_metrics **out) {
    *out = NULL;
    struct pd_serve_metrics *sm = pd_calloc(1, sizeof(*sm));
    if (!sm)
        return pd_errorf(PD_ENOMEM, "daemon metrics");
    PD_ASSERT(role->n_series <= PD_SERVE_METRICS_ROLE_MAX);
    sm->role = role;
    sm->page_size = page_size;
    const char *names[] = {"model_name"}, *values[] = {model_name ? model_name : ""};
    int rc = pd_metrics_new(1, names, values, &sm->reg);
    if (!rc)
        rc = add_all(sm, n_pages);
    if (rc) {
        pd_serve_metrics_free(sm);
        return pd_error_wrap(rc, "registering the daemon's metrics");
    }
    *out = sm;
    return PD_OK;
}

void pd_serve_metrics_free(struct pd_serve_metrics *sm) {
    if (!sm)
        return;
    pd_metrics_free(sm->reg);
    pd_free(sm);
}

void pd_serve_metrics_kv_done(struct pd_serve_metrics *sm, double bytes, double seconds) {
    pd_metric_add(sm->kv_bytes, bytes);
    pd_metric_observe(sm->kv_latency, seconds);
    pd_metric_set(sm->kv_last_latency_ms, seconds * 1e3);
    pd_metric_set(sm->kv_last_total_mb, bytes / 1e6);
    pd_metric_set(sm->kv_last_speed_gb_s, seconds > 0 ? bytes / seconds / 1e9 : 0);
}

int pd_serve_metrics_kv_reason(int status) {
    switch (status) {
    case PD_ETIMEDOUT: return PD_KV_FAIL_TIMEOUT;
    case PD_EPEER: return PD_KV_FAIL_PEER;
    case PD_ECANCELED: return PD_KV_FAIL_ABORTED;
    default: return PD_KV_FAIL_ERROR;
    }
}

int pd_serve_metrics_scrape(struct pd_serve_metrics *sm, const struct pd_engine_stats *s,
                            const int64_t health[3], char **out, size_t *len) {
    double ps = sm->page_size;
    int32_t running, waiting;
    sm->role->load(s, &running, &waiting);
    pd_metric_set(sm->num_running, running);
    pd_metric_set(sm->num_queue, waiting);
    pd_metric_set(sm->token_usage, s->pages_total ? (double)s->pages_used / s->pages_total : 0);
    pd_metric_set(sm->num_used_tokens, s->pages_used * ps);
    pd_metric_set(sm->max_total_tokens, s->pages_total * ps);
    pd_metric_set(sm->prefix_cache_tokens, s->pages_cached * ps);
    pd_metric_set(sm->num_draining, s->q_draining);
    pd_metric_set(sm->q_waiting, s->q_waiting);
    pd_metric_set(sm->mm_encoder_runs, (double)s->mm_encoder_runs);
    pd_metric_set(sm->mm_cache_hits, (double)s->mm_cache_hits);
    pd_metric_set(sm->mm_cache_misses, (double)s->mm_cache_misses);
    pd_metric_set(sm->mm_cache_bytes, (double)s->mm_cache_bytes);
    pd_metric_set(sm->mm_cache_entries, s->mm_cache_entries);
    double prompt = pd_metric_value(sm->prompt_tokens);
    pd_metric_set(sm->cache_hit_rate, prompt > 0 ? pd_metric_value(sm->cached_tokens) / prompt : 0);
    for (int i = 0; i < sm->role->n_series; i++)
        pd_metric_set(sm->role_series[i], sm->role->series[i].value(s));
    for (int i = 0; i < 3; i++)
        pd_metric_set(sm->health[i], (double)health[i]);
    return pd_metrics_render(sm->reg, out, len);
}
