/*
 * serve_metrics.h — the series a prefill or decode daemon exports on /metrics (API.md "Metrics"),
 * under SGLang's names where SGLang has the series and pdserve_… where it has not. Every series
 * carries model_name (--served-model-name). The daemon's loop thread updates the event series
 * where the event happens (common/daemon.c); the gauges that mirror the engine's published
 * counters are set at scrape time (pd_serve_metrics_scrape).
 *
 * What each timing measures (all from the monotonic clock, in seconds):
 *  time_to_first_token  decode: the body's arrival at this daemon → the first output token (the
 *                       prefill's, from the done notice) handed to the client's connection (a
 *                       stream sends it at once; a plain answer holds it until the end, as
 *                       SGLang's TTFT does);
 *                       prefill: arrival → the first token sampled and handed to the transfer
 *                       engine with the last pages.
 *  inter_token_latency  decode: between consecutive output tokens of a request reaching the
 *                       client's connection (one observation per token after the first).
 *  e2e_request_latency  arrival → the request's end here (every request the engine took).
 *  queue_time           time waiting for this daemon's own resources: prefill: entering the
 *                       waiting queue (its decode's Transfer arrived) → its first chunk's step;
 *                       decode: arrival → its KV pages reserved (the prealloc queue).
 *  kv_transfer_latency  prefill: first pages posted → the done notice left (after the flush);
 *                       decode: Transfer sent → the done notice and all pages arrived.
 */
#ifndef PD_SERVE_METRICS_H
#define PD_SERVE_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "common/engine.h"
#include "common/base/metrics.h"

/* Why a KV transfer failed: the label of pdserve_kv_transfer_failures_total. */
enum pd_kv_fail_reason {
    PD_KV_FAIL_TIMEOUT,  /* no notice in time */
    PD_KV_FAIL_PEER,     /* the peer died or the network broke */
    PD_KV_FAIL_ABORTED,  /* one side gave the room up */
    PD_KV_FAIL_REJECTED, /* decode: the prefill refused the Transfer */
    PD_KV_FAIL_ERROR,    /* anything else */
    PD_KV_FAIL_N,
};

/* The hand-over of a PD request, stage by stage (pdserve_handover_seconds{stage}; daemon.c's
 * timeline). Decode's stages partition its time to first token: reserve + prefill_queue +
 * prefill_first_chunk + prefill_rest + kv_other + first_token = its TTFT (the prefill_* ones are
 * the prefill's own clock, carried in the done notice). Prefill observes bootstrap_wait and its
 * three prefill_* stages. */
enum pd_handover_stage {
    PD_HO_RESERVE,     /* decode: arrival → pages reserved and Transfer sent */
    PD_HO_BOOTSTRAP,   /* prefill: arrival → its decode's Transfer here (both needed) */
    PD_HO_QUEUE,       /* prefill: Transfer here → its first chunk's step began (0: eager,
                          it began before) */
    PD_HO_FIRST_CHUNK, /* prefill: that step, or the Transfer if later → its pages posted */
    PD_HO_REST,        /* prefill: → the last pages and the done notice posted */
    PD_HO_KV_OTHER,    /* decode: Transfer sent → KV complete, less the three prefill stages
                          (the Transfer call, the last pages' and the notice's way) */
    PD_HO_FIRST_TOKEN, /* decode: KV complete → first token to the client's connection */
    PD_HO_N,
};
extern const char *const pd_handover_stage_names[PD_HO_N];

#define PD_SERVE_METRICS_ROLE_MAX 8

/* One series a role adds (its queues): set from the engine's counters at every scrape. */
struct pd_serve_metrics_series {
    int kind; /* PD_METRIC_GAUGE, or PD_METRIC_COUNTER for a running total */
    const char *name, *help;
    double (*value)(const struct pd_engine_stats *s);
};

/* What a role's daemon exports beyond the shared series (struct pd_role.metrics). */
struct pd_serve_metrics_role {
    /* the help of sglang:num_running_reqs and sglang:num_queue_reqs, which load fills */
    const char *running_help, *queue_help;
    void (*load)(const struct pd_engine_stats *s, int32_t *running, int32_t *waiting);
    const char *kv_bytes_help, *kv_latency_help; /* the transfer's direction */
    bool itl;                                    /* it streams output: inter-token latency */
    int n_series;                                /* <= PD_SERVE_METRICS_ROLE_MAX */
    const struct pd_serve_metrics_series *series;
};

struct pd_serve_metrics {
    struct pd_metrics *reg;
    const struct pd_serve_metrics_role *role;
    int page_size;
    /* gauges set at scrape time */
    struct pd_metric *num_running, *num_queue, *token_usage, *num_used_tokens, *max_total_tokens,
        *cache_hit_rate, *cache_config, *prefix_cache_tokens, *num_draining;
    struct pd_metric *q_waiting;
    /* images (vision-language models): encoder runs, embedding cache lookups and size */
    struct pd_metric *mm_encoder_runs, *mm_cache_hits, *mm_cache_misses, *mm_cache_bytes,
        *mm_cache_entries;
    struct pd_metric *role_series[PD_SERVE_METRICS_ROLE_MAX]; /* role->series */
    struct pd_metric *health[3];                              /* ok/busy/failed */
    /* counters set where the event happens */
    struct pd_metric *prompt_tokens, *generation_tokens, *cached_tokens, *num_requests,
        *num_aborted, *num_failed, *bootstrap_failed, *transfer_failed;
    /* histograms */
    struct pd_metric *ttft, *itl, *e2e, *queue_time; /* itl: NULL unless role->itl */
    /* KV transfer */
    struct pd_metric *kv_bytes, *kv_latency, *kv_fail[PD_KV_FAIL_N];
    struct pd_metric *handover[PD_HO_N]; /* pdserve_handover_seconds{stage} */
    struct pd_metric *kv_last_speed_gb_s, *kv_last_latency_ms, *kv_last_total_mb;
};

/* All series of role's daemon, created now (nothing is allocated on the request path). role
 * must outlive sm. */
int pd_serve_metrics_new(const struct pd_serve_metrics_role *role, const char *model_name,
                         int page_size, int32_t n_pages, struct pd_serve_metrics **out);
void pd_serve_metrics_free(struct pd_serve_metrics *sm);

/* One KV transfer that completed: bytes moved in seconds. */
void pd_serve_metrics_kv_done(struct pd_serve_metrics *sm, double bytes, double seconds);
/* The failure label for a transfer engine status (PD_ETIMEDOUT, PD_EPEER, PD_ECANCELED, …). */
int pd_serve_metrics_kv_reason(int status);

/* Sets the gauges from the engine's published counters and the daemon's health-probe counts,
 * then renders the registry (pd_metrics_render: *out is the caller's, pd_free). */
int pd_serve_metrics_scrape(struct pd_serve_metrics *sm, const struct pd_engine_stats *s,
                            const int64_t health[3], char **out, size_t *len);

#endif
