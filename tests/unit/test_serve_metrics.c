/* The daemons' metric set: both roles register every series once; a scrape turns the engine's
 * counters into gauges (token_usage = held / total pages, queues per role, cache hit rate from
 * the counters) and renders text a strict reader accepts, every sample with model_name; KV
 * transfer helpers; names follow Prometheus naming (pd_prom_check.h's check_naming); allocation
 * failures while registering are clean errors. */
#include "pd_test.h"

#include "common/base/alloc.h"
#include "common/serve_metrics.h"
#include "decode/role.h"
#include "prefill/role.h"
#include "pd_prom_check.h"

static const char *line_of(const char *txt, const char *prefix) {
    const char *p = strstr(txt, prefix);
    return p ? p + strlen(prefix) : NULL;
}

static double value_of(const char *txt, const char *prefix) {
    const char *v = line_of(txt, prefix);
    return v ? strtod(v, NULL) : NAN;
}

static void test_prefill_scrape(void) {
    struct pd_serve_metrics *sm;
    CHECK_OK(pd_serve_metrics_new(&pd_prefill_metrics, "m\"1", 16, 100, &sm));
    struct pd_engine_stats s = {.pages_total = 100,
                                .pages_free = 60,
                                .pages_used = 25,
                                .pages_cached = 15,
                                .q_bootstrap = 3,
                                .q_waiting = 4,
                                .q_inflight = 2};
    pd_metric_add(sm->prompt_tokens, 200);
    pd_metric_add(sm->cached_tokens, 50);
    pd_serve_metrics_kv_done(sm, 2e6, 0.5);
    pd_metric_add(sm->kv_fail[pd_serve_metrics_kv_reason(PD_EPEER)], 1);
    const int64_t health[3] = {7, 1, 2};
    char *txt;
    size_t len;
    CHECK_OK(pd_serve_metrics_scrape(sm, &s, health, &txt, &len));
    CHECK(check_exposition(txt) > 50);
    CHECK(naming_ok(txt));
    const char *ml = "{model_name=\"m\\\"1\"} ";
    char k[160];
#define V(name) (snprintf(k, sizeof(k), "\n%s%s", name, ml), value_of(txt, k))
    CHECK_DBL(V("sglang:token_usage"), 0.25, 1e-12);
    CHECK_DBL(V("sglang:num_used_tokens"), 400, 0);
    CHECK_DBL(V("sglang:max_total_num_tokens"), 1600, 0);
    CHECK_DBL(V("pdserve_prefix_cache_tokens"), 240, 0);
    CHECK_DBL(V("sglang:num_queue_reqs"), 7, 0);
    CHECK_DBL(V("sglang:num_running_reqs"), 2, 0);
    CHECK_DBL(V("pdserve_num_bootstrap_queue_reqs"), 3, 0);
    CHECK_DBL(V("sglang:num_prefill_prealloc_queue_reqs"), 3, 0);
    CHECK_DBL(V("pdserve_num_waiting_queue_reqs"), 4, 0);
    CHECK_DBL(V("sglang:num_prefill_inflight_queue_reqs"), 2, 0);
    CHECK_DBL(V("sglang:cache_hit_rate"), 0.25, 1e-12);
    CHECK_DBL(V("pdserve_kv_transfer_bytes_total"), 2e6, 0);
    CHECK_DBL(V("sglang:kv_transfer_speed_gb_s"), 0.004, 1e-12);
    CHECK_DBL(V("sglang:kv_transfer_latency_ms"), 500, 1e-9);
    CHECK_DBL(V("sglang:kv_transfer_total_mb"), 2, 1e-12);
    CHECK_DBL(V("pdserve_kv_transfer_latency_seconds_count"), 1, 0);
#undef V
    CHECK(strstr(txt, "sglang:cache_config_info{model_name=\"m\\\"1\",page_size=\"16\","
                      "num_pages=\"100\"} 1\n") != NULL);
    CHECK(strstr(txt, "pdserve_kv_transfer_failures_total{model_name=\"m\\\"1\",reason=\"peer\"} "
                      "1\n") != NULL);
    CHECK(strstr(txt, "pdserve_health_generate_total{model_name=\"m\\\"1\",result=\"busy\"} 1\n") !=
          NULL);
    /* decode-only series are absent on prefill */
    CHECK(strstr(txt, "inter_token_latency") == NULL);
    CHECK(strstr(txt, "num_decode_prealloc") == NULL);
    /* every sample carries model_name */
    int samples = 0, labelled = 0;
    for (const char *p = txt; *p; p = strchr(p, '\n') + 1) {
        if (*p != '#') {
            samples++;
            const char *brace = strchr(p, '{');
            labelled += brace && brace < strchr(p, '\n') && !strncmp(brace, "{model_name=", 12);
        }
    }
    CHECK_INT(labelled, samples);
    pd_free(txt);
    pd_serve_metrics_free(sm);
}

static void test_decode_scrape(void) {
    struct pd_serve_metrics *sm;
    CHECK_OK(pd_serve_metrics_new(&pd_decode_metrics, "d", 32, 10, &sm));
    struct pd_engine_stats s = {
        .pages_total = 10, .q_prealloc = 1, .q_transfer = 5, .q_running = 9, .retractions = 4};
    const int64_t health[3] = {0, 0, 0};
    char *txt;
    size_t len;
    CHECK_OK(pd_serve_metrics_scrape(sm, &s, health, &txt, &len));
    CHECK(check_exposition(txt) > 50);
    CHECK(naming_ok(txt));
    CHECK_DBL(value_of(txt, "\nsglang:num_queue_reqs{model_name=\"d\"} "), 6, 0);
    CHECK_DBL(value_of(txt, "\nsglang:num_running_reqs{model_name=\"d\"} "), 9, 0);
    CHECK_DBL(value_of(txt, "\nsglang:num_decode_prealloc_queue_reqs{model_name=\"d\"} "), 1, 0);
    CHECK_DBL(value_of(txt, "\nsglang:num_decode_transfer_queue_reqs{model_name=\"d\"} "), 5, 0);
    CHECK_DBL(value_of(txt, "\nsglang:num_retracted_requests_total{model_name=\"d\"} "), 4, 0);
    CHECK_DBL(value_of(txt, "\nsglang:token_usage{model_name=\"d\"} "), 0, 0);
    CHECK_DBL(value_of(txt, "\nsglang:cache_hit_rate{model_name=\"d\"} "), 0, 0); /* 0/0 */
    CHECK(
        strstr(txt, "sglang:inter_token_latency_seconds_bucket{model_name=\"d\",le=\"0.002\"} 0") !=
        NULL);
    CHECK(strstr(txt, "bootstrap_queue") == NULL);
    pd_free(txt);
    pd_serve_metrics_free(sm);
}

static void test_kv_reasons(void) {
    CHECK_INT(pd_serve_metrics_kv_reason(PD_ETIMEDOUT), PD_KV_FAIL_TIMEOUT);
    CHECK_INT(pd_serve_metrics_kv_reason(PD_EPEER), PD_KV_FAIL_PEER);
    CHECK_INT(pd_serve_metrics_kv_reason(PD_ECANCELED), PD_KV_FAIL_ABORTED);
    CHECK_INT(pd_serve_metrics_kv_reason(PD_EINVAL), PD_KV_FAIL_ERROR);
}

/* check_naming (which the scrapes above pass) refuses what promtool check metrics would flag. */
static void test_naming_rules(void) {
    CHECK_INT(check_naming("# HELP sglang:a_total x\n# TYPE sglang:a_total counter\n"
                           "# HELP pdserve_b y\n# TYPE pdserve_b gauge\n"),
              0);
    CHECK_INT(check_naming("# HELP pdserve:b y\n# TYPE pdserve:b gauge\n"), -1);
    CHECK_INT(check_naming("# HELP pdserve_c y\n# TYPE pdserve_c counter\n"), -1);
    CHECK_INT(check_naming("# HELP pdserve_d_total y\n# TYPE pdserve_d_total gauge\n"), -1);
    CHECK_INT(check_naming("# TYPE pdserve_e gauge\n"), -1);
    CHECK_INT(check_naming("# HELP pdserve_f \n# TYPE pdserve_f gauge\n"), -1);
}

static void test_alloc_failures(void) {
    int failed = 0;
    for (long k = 0; k < 400; k++) {
        struct pd_serve_metrics *sm = NULL;
        pd_alloc_fail_after(k);
        int rc =
            pd_serve_metrics_new(k % 2 ? &pd_decode_metrics : &pd_prefill_metrics, "x", 16, 8, &sm);
        pd_alloc_fail_after(-1);
        CHECK(rc == PD_OK || rc == PD_ENOMEM);
        CHECK((rc == PD_OK) == (sm != NULL));
        failed += rc != PD_OK;
        pd_serve_metrics_free(sm);
    }
    CHECK(failed > 100); /* registration allocates a lot: most budgets fail somewhere */
}

PD_TEST_MAIN(PD_TEST(test_prefill_scrape), PD_TEST(test_decode_scrape), PD_TEST(test_kv_reasons),
             PD_TEST(test_naming_rules), PD_TEST(test_alloc_failures))
