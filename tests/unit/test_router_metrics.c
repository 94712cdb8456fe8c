/* The router's metric set: per-worker series keyed by URL survive workers leaving (counters
 * stay, registry gauges read 0 at the next scrape), outcomes count once each with errors also in
 * sgl_router_pd_*_errors_total, routes lose their query strings, and the text reads back. */
#include "pd_test.h"

#include "common/base/alloc.h"
#include "pd_prom_check.h"
#include "router/breaker.h"
#include "router/metrics.h"

static char *render(struct pd_router_metrics *rm) {
    char *txt = NULL;
    size_t len;
    CHECK_OK(pd_router_metrics_render(rm, &txt, &len));
    CHECK(txt && check_exposition(txt) > 0);
    CHECK(txt && naming_ok(txt));
    return txt;
}

static bool has(const char *txt, const char *line) {
    return strstr(txt, line) != NULL;
}

static void test_calls_and_workers(void) {
    struct pd_router_metrics *rm;
    CHECK_OK(pd_router_metrics_new(&rm));
    const char *p = "http://10.0.0.1:30001", *d = "http://10.0.0.2:30002";
    for (int i = 0; i < 3; i++) {
        pd_router_metrics_request(rm, "/generate?x=1");
        pd_router_metrics_call_start(rm, p, true);
        pd_router_metrics_call_start(rm, d, false);
        pd_router_metrics_call_end(rm, p, true, PD_ROUTER_OUTCOME_OK);
        pd_router_metrics_call_end(rm, d, false,
                                   i == 2 ? PD_ROUTER_OUTCOME_TIMEOUT : PD_ROUTER_OUTCOME_OK);
        pd_router_metrics_done(rm, "/generate", 0.3);
    }
    pd_router_metrics_ttft(rm, 0.05);
    pd_router_metrics_retry(rm);
    pd_router_metrics_retries_exhausted(rm);
    pd_router_metrics_cb_outcome(rm, p, false);
    pd_router_metrics_cb_outcome(rm, p, false);
    pd_router_metrics_cb_outcome(rm, d, true);
    pd_router_metrics_cb_transition(rm, p, PD_ROUTER_CB_CLOSED, PD_ROUTER_CB_OPEN);
    pd_router_metrics_workers_begin(rm);
    pd_router_metrics_worker(rm, p, true, true, 2, PD_ROUTER_CB_OPEN);
    pd_router_metrics_worker(rm, d, false, false, 0, PD_ROUTER_CB_CLOSED);
    char *txt = render(rm);
    CHECK(has(txt, "\nsgl_router_requests_total{route=\"/generate\"} 3\n"));
    CHECK(has(txt, "\nsgl_router_request_duration_seconds_bucket{route=\"/generate\",le=\"0.25\"} "
                   "0\n"));
    CHECK(has(txt, "\nsgl_router_request_duration_seconds_bucket{route=\"/generate\",le=\"0.5\"} "
                   "3\n"));
    CHECK(has(txt, "\npdserve_router_requests_total{worker=\"http://10.0.0.1:30001\",role=\"prefill"
                   "\",outcome=\"ok\"} 3\n"));
    CHECK(has(txt,
              "\npdserve_router_requests_total{worker=\"http://10.0.0.2:30002\",role=\"decode\","
              "outcome=\"ok\"} 2\n"));
    CHECK(has(txt,
              "\npdserve_router_requests_total{worker=\"http://10.0.0.2:30002\",role=\"decode\","
              "outcome=\"timeout\"} 1\n"));
    CHECK(has(txt, "\nsgl_router_pd_decode_errors_total{worker=\"http://10.0.0.2:30002\"} 1\n"));
    CHECK(!has(txt, "sgl_router_pd_prefill_errors_total{"));
    CHECK(has(txt, "\nsgl_router_processed_requests_total{worker=\"http://10.0.0.1:30001\"} 3\n"));
    CHECK(has(txt, "\nsgl_router_pd_prefill_requests_total{worker=\"http://10.0.0.1:30001\"} 3\n"));
    CHECK(has(txt, "\nsgl_router_running_requests{worker=\"http://10.0.0.1:30001\"} 2\n"));
    CHECK(has(txt, "\nsgl_router_worker_health{worker=\"http://10.0.0.2:30002\"} 0\n"));
    CHECK(has(txt, "\nsgl_router_active_workers 1\n"));
    CHECK(has(txt, "\nsgl_router_retries_total 1\n"));
    CHECK(has(txt, "\npdserve_router_time_to_first_token_seconds_count 1\n"));
    CHECK(has(txt, "\nsgl_router_retries_exhausted_total 1\n"));
    CHECK(has(txt, "\nsgl_router_cb_state{worker=\"http://10.0.0.1:30001\"} 1\n"));
    CHECK(has(txt, "\nsgl_router_cb_state{worker=\"http://10.0.0.2:30002\"} 0\n"));
    CHECK(has(txt, "\nsgl_router_cb_outcomes_total{worker=\"http://10.0.0.1:30001\",outcome="
                   "\"failure\"} 2\n"));
    CHECK(has(txt, "\nsgl_router_cb_outcomes_total{worker=\"http://10.0.0.2:30002\",outcome="
                   "\"success\"} 1\n"));
    CHECK(has(txt, "\nsgl_router_cb_state_transitions_total{worker=\"http://10.0.0.1:30001\","
                   "from=\"closed\",to=\"open\"} 1\n"));
    pd_free(txt);
    /* the prefill leaves (DNS discovery dropped it); a new one comes */
    const char *p2 = "http://10.0.0.3:30001";
    pd_router_metrics_call_start(rm, p2, true);
    pd_router_metrics_call_end(rm, p2, true, PD_ROUTER_OUTCOME_CLIENT_GONE);
    pd_router_metrics_workers_begin(rm);
    pd_router_metrics_worker(rm, p2, true, true, 0, PD_ROUTER_CB_HALF_OPEN);
    pd_router_metrics_worker(rm, d, false, true, 1, PD_ROUTER_CB_CLOSED);
    txt = render(rm);
    CHECK(has(txt, "\nsgl_router_worker_health{worker=\"http://10.0.0.1:30001\"} 0\n"));
    CHECK(has(txt, "\nsgl_router_running_requests{worker=\"http://10.0.0.1:30001\"} 0\n"));
    CHECK(has(txt, "\nsgl_router_worker_health{worker=\"http://10.0.0.3:30001\"} 1\n"));
    CHECK(has(txt, "\nsgl_router_cb_state{worker=\"http://10.0.0.1:30001\"} 0\n"));
    CHECK(has(txt, "\nsgl_router_cb_state{worker=\"http://10.0.0.3:30001\"} 2\n"));
    CHECK(has(txt, "\nsgl_router_active_workers 2\n"));
    CHECK(has(txt, "\npdserve_router_requests_total{worker=\"http://10.0.0.1:30001\",role=\"prefill"
                   "\",outcome=\"ok\"} 3\n")); /* counters of a worker that left stay */
    CHECK(has(txt, "\npdserve_router_requests_total{worker=\"http://10.0.0.3:30001\",role=\"prefill"
                   "\",outcome=\"client_gone\"} 1\n"));
    pd_free(txt);
    pd_router_metrics_free(rm);
}

static void test_alloc_failures(void) {
    int failed = 0;
    for (long k = 0; k < 120; k++) {
        struct pd_router_metrics *rm = NULL;
        pd_alloc_fail_after(k);
        int rc = pd_router_metrics_new(&rm);
        if (rc == PD_OK) { /* series that cannot be made drop their update, never crash */
            pd_router_metrics_call_start(rm, "http://a", true);
            pd_router_metrics_call_end(rm, "http://a", true, PD_ROUTER_OUTCOME_ERROR);
            pd_router_metrics_workers_begin(rm);
            pd_router_metrics_worker(rm, "http://a", true, true, 1, PD_ROUTER_CB_CLOSED);
            pd_router_metrics_cb_outcome(rm, "http://a", false);
            pd_router_metrics_cb_transition(rm, "http://a", PD_ROUTER_CB_CLOSED, PD_ROUTER_CB_OPEN);
        }
        pd_alloc_fail_after(-1);
        CHECK(rc == PD_OK || rc == PD_ENOMEM);
        failed += rc != PD_OK;
        if (rm) {
            char *txt = render(rm);
            pd_free(txt);
        }
        pd_router_metrics_free(rm);
    }
    CHECK(failed > 10);
}

PD_TEST_MAIN(PD_TEST(test_calls_and_workers), PD_TEST(test_alloc_failures))
